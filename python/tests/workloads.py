"""Workloads whose events the tests compare between Ocular and a reference tracer. Keep them
deterministic: the same calls, loops and branches on every run."""

import asyncio
import threading


def loop(n):
    s = 0
    for i in range(n):
        if i % 3:
            s += i
    return s


def two_back_edges(n):
    """A loop with two backward jumps to its head (CPython 3.12 and 3.13 end the `if` with its own)."""
    total = 0
    for i in range(n):
        total += i
        if total % 5 == 0:
            total -= 1
    return total


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def norm2(self):
        return self.x * self.x + self.y * self.y


def objects(n):
    pts = [Point(i, -i) for i in range(n)]
    d = {}
    for p in pts:
        d.setdefault(p.norm2() % 7, []).append(p)
    return sorted((k, len(v)) for k, v in d.items())


def gen(n):
    for i in range(n):
        yield i * i


def use_gen(n):
    return sum(x for x in gen(n) if x % 2)


def fails(depth):
    if depth == 0:
        raise ValueError("bottom")
    return fails(depth - 1)


def exceptions(n):
    caught = 0
    for _ in range(n):
        try:
            fails(3)
        except ValueError:
            caught += 1
    return caught


async def tick(i):
    await asyncio.sleep(0)
    return i


async def gather(n):
    return sum(await asyncio.gather(*(tick(i) for i in range(n))))


def run_async(n):
    return asyncio.run(gather(n))


def threads(k, n):
    ts = [threading.Thread(target=loop, args=(n,), name=f"worker-{i}") for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def mixed():
    loop(50)
    fib(8)
    objects(20)
    use_gen(20)
    exceptions(3)


def many_functions(n, rounds):
    """`n` distinct functions (f0 .. f{n-1}, compiled in this file), each called `rounds` times, in an order
    that cycles through all of them: far more code objects than a thread's first-level code cache holds,
    many sharing its slots and the second level's."""
    src = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(n))
    space = {}
    exec(compile(src, __file__, "exec"), space)
    fs = [space[f"f{i}"] for i in range(n)]
    t = 0
    for r in range(rounds):
        for i in range(n):
            t += fs[(i * 7 + r) % n](i)
    return t
