"""A program that measures itself: it counts every call of its named functions and times each with
`time.perf_counter`, then writes what it measured as JSON to the path in $KNOWN_TRUTH_OUT (if set). Run
untraced, in the same conditions, it is the truth that Ocular's estimates are checked against.

    python known_truth.py VARIANT [ROUNDS]

Each round runs `py_heavy()` (a loop of one-line `leaf` calls, call-dense Python) and then the variant's
second function, which spends its time where a window-based profiler cannot see it:

    json      one json.dumps of a large list: a long C call holding the GIL
    hashlib   sha256 of 30 MB: a long C call that releases the GIL
    sleep     time.sleep: blocking, no CPU
    gc        builds cyclic garbage, then gc.collect(): the collector
    regex     a regular expression over a long text: a long C call
    recurse   a recursive Python function (many frames of one function)
    generator a generator resumed many times
    threads   py_heavy and json on 3 threads at once, the main thread joining them
    requests  a thread per request, as a threading server runs: each round 125 requests one after
              another, each `request()` a short py_heavy (15,000 leaf calls, ~2 ms) in a new thread that
              the main thread joins (blocked meanwhile, as in `accept()`)
    waiting   3 threads, each round comparing two long lists (C holding the GIL, no check for a thread
              switch after it) and then calling `resumed()`: a thread asked to give up the GIL during
              the comparison waits at `resumed`'s first instruction, before its start is reported
"""

import gc
import hashlib
import json
import os
import re
import sys
import threading
import time

COUNTS: dict[str, int] = {}
TIMES: dict[str, float] = {}
_lock = threading.Lock()

LEAF_CALLS = 0


def measured(fn):
    """Counts and times every call of `fn` (inclusive, wall), under its own name."""
    name = fn.__name__

    def wrapper(*args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            dt = time.perf_counter() - t0
            with _lock:
                COUNTS[name] = COUNTS.get(name, 0) + 1
                TIMES[name] = TIMES.get(name, 0.0) + dt

    wrapper.__wrapped__ = fn
    return wrapper


def leaf(x):
    return x + 1


@measured
def py_heavy(n=120_000):
    global LEAF_CALLS
    t = 0
    for i in range(n):
        t = leaf(t)
    LEAF_CALLS += n  # one += per call of py_heavy, not per leaf: leaf stays one line
    return t


DATA = [{"key": i, "value": str(i) * 4, "f": i * 0.5, "l": [i, i + 1, "x"]} for i in range(120_000)]
BLOB = os.urandom(30 * 1024 * 1024)
TEXT = ("lorem ipsum dolor sit amet " * 40_000) + "needle"


@measured
def c_json():
    return len(json.dumps(DATA))


@measured
def c_hash():
    return hashlib.sha256(BLOB).hexdigest()


@measured
def waiter():
    time.sleep(0.04)


class Node:
    def __init__(self):
        self.other = self


@measured
def churn():
    junk = [Node() for _ in range(150_000)]
    del junk
    gc.collect()


@measured
def c_regex():
    return len(re.findall(r"(\w+) (\w+) d\w+", TEXT))


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


@measured
def recurse():
    return fib(22)


def gen(n):
    for i in range(n):
        yield i * 2


@measured
def consume():
    return sum(gen(200_000))


SECOND = {"json": c_json, "hashlib": c_hash, "sleep": waiter, "gc": churn, "regex": c_regex,
          "recurse": recurse, "generator": consume}


@measured
def request():
    return py_heavy(15_000)


def resumed():
    with _lock:
        COUNTS["resumed"] = COUNTS.get("resumed", 0) + 1


def on_three_threads(target) -> None:
    """Runs `target` on 3 threads at once, the main thread joining them."""
    ts = [threading.Thread(target=target) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def run(variant: str, rounds: int) -> None:
    if variant == "waiting":
        py_heavy()  # call-dense: past a sampled recording's first window
        a = [float(i) for i in range(1_000_000)]
        b = [float(i) for i in range(1_000_000)]

        def comparer():
            for _ in range(rounds):
                a == b  # noqa: B015 (the comparison is the work)
                resumed()
        on_three_threads(comparer)
        return
    if variant == "requests":
        for _ in range(rounds * 125):
            t = threading.Thread(target=request)
            t.start()
            t.join()
        return
    if variant == "threads":
        def worker():
            for _ in range(rounds):
                py_heavy()
                c_json()
        on_three_threads(worker)
        return
    second = SECOND[variant]
    for _ in range(rounds):
        py_heavy()
        second()


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "json"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    gc.collect()
    t0 = time.perf_counter()
    run(variant, rounds)
    wall = time.perf_counter() - t0
    truth = {"variant": variant, "rounds": rounds, "wall_s": wall, "counts": dict(COUNTS),
             "times_s": dict(TIMES), "leaf_calls": LEAF_CALLS}
    if variant == "recurse":
        # fib(22) makes 57,313 calls (fib(n) makes 2 fib(n+1) - 1 calls).
        truth["fib_calls"] = COUNTS["recurse"] * 57_313
    if variant == "generator":
        truth["gen_calls"] = COUNTS["consume"]
    out = os.environ.get("KNOWN_TRUTH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(truth, f)
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
