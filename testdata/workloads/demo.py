"""The demo workload: a little of everything a profiler should show. Hot loops that the interpreter
specializes, recursion, an object-heavy phase, a generator, exceptions, and a worker thread.

    python -m ocular run -o demo.ocl testdata/workloads/demo.py
"""

import threading


def sum_of_squares(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Particle:
    def __init__(self, x, v):
        self.x = x
        self.v = v

    def step(self, dt):
        self.x += self.v * dt


def simulate(steps):
    ps = [Particle(float(i), 0.5) for i in range(100)]
    for _ in range(steps):
        for p in ps:
            p.step(0.01)
    return sum(p.x for p in ps)


def primes(limit):
    for n in range(2, limit):
        if all(n % d for d in range(2, int(n**0.5) + 1)):
            yield n


def parse_all(words):
    ok = 0
    for w in words:
        try:
            int(w)
            ok += 1
        except ValueError:
            pass
    return ok


def main():
    worker = threading.Thread(target=sum_of_squares, args=(200_000,), name="squares-worker")
    worker.start()
    print("sum of squares:", sum_of_squares(300_000))
    print("fib(20):", fib(20))
    print("simulate:", round(simulate(200), 3))
    print("primes below 5000:", sum(1 for _ in primes(5000)))
    print("parsed:", parse_all(["1", "x", "22", "y"] * 2000))
    worker.join()


if __name__ == "__main__":
    main()
