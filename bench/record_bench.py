"""Recorder overhead, side by side in one run: ns per event over the untraced run for each mode, next to
the physical floor (a native METH_FASTCALL callback that reads the TSC and stores a 24-byte record), a
native no-op callback (as a built-in function, and as the vectorcall object Ocular's callbacks are), a no-op
Python callback, and cProfile; Ocular with its buffers on the heap instead
of in the ring file (RING.md), for the ring's own cost; and Ocular as a flight recorder (ring="64MB": chunks
into the ring file's chunk region instead of the .ocl file), and with --live (16 spare slots, for a reader in
another process). Interleaved repeats, medians.

    make bench-record            (or: .venv/3.12/bin/python bench/record_bench.py [--repeats N])
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import random
import sys
import tempfile
import time

import ocular
from ocular import _ocular
from ocular._recorder import event_names

TOOL = 4


def tight_loop(n=300_000):
    s = 0
    for i in range(n):
        s += i
    return s


def fib(n=22):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Body:
    __slots__ = ("x", "v")

    def __init__(self, x, v):
        self.x = x
        self.v = v

    def step(self, dt):
        self.x += self.v * dt
        return self


def object_mix(n=30_000):
    bodies = [Body(float(i), 1.0) for i in range(50)]
    index = {}
    for i in range(n):
        b = bodies[i % 50].step(0.01)
        index[i % 97] = b.x
    return len(index)


WORKLOADS = {"tight loop": tight_loop, "recursive calls": fib, "object mix": object_mix}


def mask(mode, c_calls=False):
    m = 0
    for n in event_names(mode, c_calls):
        m |= getattr(sys.monitoring.events, n)
    return m


def timed(fn):
    """(wall ns, CPU ns of this thread), with the garbage collector off as timeit does: a collection of
    another configuration's garbage would land at a random point of a random run."""
    gc.collect()
    gc.disable()
    try:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    finally:
        gc.enable()


def with_callback(fn, mode, cb, c_calls=False):
    mon = sys.monitoring
    mon.use_tool_id(TOOL, "bench")
    for n in event_names(mode, c_calls):
        mon.register_callback(TOOL, getattr(mon.events, n), cb)
    mon.set_events(TOOL, mask(mode, c_calls))
    try:
        return timed(fn)
    finally:
        mon.set_events(TOOL, 0)
        for n in event_names(mode, c_calls):
            mon.register_callback(TOOL, getattr(mon.events, n), None)
        mon.free_tool_id(TOOL)


def with_ocular(fn, mode, threshold, path, ring_file=True, ring=None, live=False, c_calls=False):
    rec = ocular.record(path, mode=mode, deinstrument_threshold=threshold, ring_file=ring_file, ring=ring,
                        live=live, c_calls=c_calls)
    rec.start()
    try:
        t = timed(fn)
    finally:
        rec.stop()
    return t, rec.events, rec.lost


def with_cprofile(fn):
    p = cProfile.Profile()
    p.enable()
    try:
        return timed(fn)
    finally:
        p.disable()


def python_noop(*args):
    return None


def builtin_calls(n=40_000):
    xs = []
    k = 0
    for i in range(n):
        if isinstance(i, int):
            k += len(xs)
        xs.append(i)
    return k


C_WORKLOADS = {"built-in calls (isinstance, len, list.append)": builtin_calls, "recursive calls": fib,
               "object mix": object_mix}


def c_calls_table(repeats, path, floor):
    """`c_calls`: the same callbacks fired as the floor's (CALL of every callable, C_RETURN, C_RAISE and the
    mode's), gapless. ns per recorded event (Python callables' CALL events are not recorded: their cost is
    in the figure of the events that are), and the program's slowdown next to the same mode without
    c_calls."""
    print()
    print("C calls (`c_calls=True`, gapless): the floor and Ocular fire on the same events (CALL of every call, "
          "C_RETURN, C_RAISE, and the mode's); Ocular records CALL for C callables only")
    print()
    print("| workload | mode | events/run, c_calls (without) | untraced ms | floor ns/ev | Ocular ns/ev "
          "| **Ocular / floor**, median of paired repeats (quartiles) | best-of CPU Ocular / floor "
          "| slowdown with c_calls | without | with / without, median of paired repeats |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wname, fn in C_WORKLOADS.items():
        fn()
        for mode in ("calls", "adaptive", "precise"):
            configs = {
                "floor": lambda: with_callback(fn, mode, floor, c_calls=True),
                "ocular": lambda: with_ocular(fn, mode, 0, path, c_calls=True),
                "plain": lambda: with_ocular(fn, mode, 0, path),
            }
            runs = {k: [] for k in ("untraced", *configs)}
            ratios, vs = [], []
            events = plain_events = 0
            for _ in range(repeats):
                order = list(configs)
                random.shuffle(order)
                got = {"untraced": timed(fn)}
                for k in order:
                    r = configs[k]()
                    if k == "ocular":
                        r, events, _ = r
                    elif k == "plain":
                        r, plain_events, _ = r
                    got[k] = r
                got["untraced"] = min(got["untraced"], timed(fn))
                for k, v in got.items():
                    runs[k].append(v)
                base = got["untraced"][0]
                ratios.append((got["ocular"][0] - base) / max(1, got["floor"][0] - base))
                vs.append(got["ocular"][0] / got["plain"][0])
            wall = {k: min(w for w, _ in v) for k, v in runs.items()}
            cpu = {k: min(c for _, c in v) for k, v in runs.items()}
            ratios.sort()
            vs.sort()
            q = lambda xs, k: xs[(k * len(xs)) // 4]  # noqa: E731
            print(f"| {wname} | {mode} | {events:,} ({plain_events:,}) | {wall['untraced'] / 1e6:.1f} | "
                  f"{(wall['floor'] - wall['untraced']) / events:.1f} | {(wall['ocular'] - wall['untraced']) / events:.1f} | "
                  f"**{q(ratios, 2):.2f}x** ({q(ratios, 1):.2f}-{q(ratios, 3):.2f}) | "
                  f"{(cpu['ocular'] - cpu['untraced']) / max(1, cpu['floor'] - cpu['untraced']):.2f}x | "
                  f"{wall['ocular'] / wall['untraced']:.2f}x | {wall['plain'] / wall['untraced']:.2f}x | "
                  f"{q(vs, 2):.2f}x |", flush=True)


# The same shape twice: a chain of three frames per iteration, the inner two started, suspended once,
# resumed and returned. Coroutines get their frame id and what they yielded recorded (FORMAT.md 5.5);
# plain generators, the same events, do not: the difference per event is what the async view costs.
@__import__("types").coroutine
def _tick():
    yield


async def _co_leaf(i):
    await _tick()
    return i


async def _co_mid(i):
    return await _co_leaf(i) + 1


async def _co_top(n):
    s = 0
    for i in range(n):
        s += await _co_mid(i)
    return s


def _gen_tick():
    yield


def _gen_leaf(i):
    yield from _gen_tick()
    return i


def _gen_mid(i):
    return (yield from _gen_leaf(i)) + 1


def _gen_top(n):
    s = 0
    for i in range(n):
        s += yield from _gen_mid(i)
    return s


def drive(make, n=20_000):
    """Runs a coroutine or generator to its end as an event loop would: send(None) until it returns."""
    g = make(n)
    try:
        while True:
            g.send(None)
    except StopIteration as e:
        return e.value


def coroutines(n=20_000):
    return drive(_co_top, n)


def generators(n=20_000):
    return drive(_gen_top, n)


def async_table(repeats, path, floor):
    """The async view's cost: coroutines (frame ids and what they yielded recorded) next to plain generators
    of the same shape (the same events, recorded as before), each against the floor on the same events."""
    print()
    print("Coroutine frames (FORMAT.md 5.5): the same chain of frames as coroutines and as plain generators; "
          "the floor fires on the same events for both")
    print()
    print("| workload | mode | events/run | untraced ms | floor ns/ev | Ocular ns/ev "
          "| **Ocular / floor**, median of paired repeats (quartiles) | Ocular slowdown |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    per_event = {}
    for wname, fn in (("coroutines (await)", coroutines), ("plain generators (yield from)", generators)):
        fn()
        for mode in ("calls", "adaptive"):
            configs = {"floor": lambda: with_callback(fn, mode, floor),
                       "ocular": lambda: with_ocular(fn, mode, 500, path)}
            runs = {k: [] for k in ("untraced", *configs)}
            ratios = []
            events = 0
            for _ in range(repeats):
                order = list(configs)
                random.shuffle(order)
                got = {"untraced": timed(fn)}
                for k in order:
                    r = configs[k]()
                    if k == "ocular":
                        r, events, _ = r
                    got[k] = r
                got["untraced"] = min(got["untraced"], timed(fn))
                for k, v in got.items():
                    runs[k].append(v)
                base = got["untraced"][0]
                ratios.append((got["ocular"][0] - base) / max(1, got["floor"][0] - base))
            wall = {k: min(w for w, _ in v) for k, v in runs.items()}
            ratios.sort()
            q = lambda xs, k: xs[(k * len(xs)) // 4]  # noqa: E731
            ns = (wall["ocular"] - wall["untraced"]) / events
            per_event[(wname, mode)] = ns
            print(f"| {wname} | {mode} | {events:,} | {wall['untraced'] / 1e6:.1f} | "
                  f"{(wall['floor'] - wall['untraced']) / events:.1f} | {ns:.1f} | "
                  f"**{q(ratios, 2):.2f}x** ({q(ratios, 1):.2f}-{q(ratios, 3):.2f}) | "
                  f"{wall['ocular'] / wall['untraced']:.2f}x |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--modes", default="calls,adaptive,precise")
    ap.add_argument("--c-calls-only", action="store_true", help="only the table of c_calls")
    ap.add_argument("--async-only", action="store_true", help="only the table of coroutine frames")
    args = ap.parse_args()
    floor, noop = _ocular.bench_callbacks["floor"], _ocular.bench_callbacks["noop"]
    noop_vc = _ocular.bench_callbacks["noop_vectorcall"]
    tmp = tempfile.TemporaryDirectory(prefix="ocular-record-bench-")  # removed at exit
    path = os.path.join(tmp.name, "bench.ocl")
    if args.async_only:
        print(f"# Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, {args.repeats} repeats")
        async_table(args.repeats, path, floor)
        return
    if args.c_calls_only:
        print(f"# Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, {args.repeats} repeats")
        c_calls_table(args.repeats, path, floor)
        return
    modes = args.modes.split(",")
    print(f"# Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.repeats} repeats, configurations shuffled within each; ns/ev = best-of (time - untraced) / events; "
          f"ratio = median over repeats of (Ocular - untraced) / (floor - untraced) in the same repeat")
    print()
    print("| workload | mode | events/run | untraced ms | floor ns/ev | native no-op ns/ev "
          "| vectorcall no-op ns/ev | Python no-op ns/ev "
          "| Ocular ns/ev | **Ocular / floor**, median of paired repeats (quartiles) | best-of CPU Ocular / floor "
          "| Ocular slowdown | cProfile slowdown | buffers in memory / floor | ring file / in memory "
          "| **flight recorder / file**, median (quartiles) | **live / file**, median (quartiles) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for wname, fn in WORKLOADS.items():
        fn()  # warm up and specialize
        for mode in modes:
            runs = {k: [] for k in ("untraced", "floor", "noop", "noop_vc", "python", "ocular", "memory", "flight",
                                    "live", "cprofile")}
            ratios, mem_ratios, ring_ratios, flight_ratios, live_ratios = [], [], [], [], []
            events = lost = 0
            configs = {
                "floor": lambda: with_callback(fn, mode, floor),
                "noop": lambda: with_callback(fn, mode, noop),
                "noop_vc": lambda: with_callback(fn, mode, noop_vc),
                "python": lambda: with_callback(fn, mode, python_noop),
                "ocular": lambda: with_ocular(fn, mode, 0, path),
                # The buffers on the heap instead of in the ring file (RING.md): the ring's own cost.
                "memory": lambda: with_ocular(fn, mode, 0, path, ring_file=False),
                # A flight recorder: the newest 64 MiB of compressed chunks, in the ring file.
                "flight": lambda: with_ocular(fn, mode, 0, path, ring="64MB"),
                # Followed live: 16 spare slots, taken oldest first.
                "live": lambda: with_ocular(fn, mode, 0, path, live=True),
                "cprofile": lambda: with_cprofile(fn),
            }
            for _ in range(args.repeats):
                # One repeat: every configuration back to back in a shuffled order, between two untraced
                # runs. Slow periods of the VM last longer than one run, so a ratio taken inside one repeat
                # cancels them; the median of those ratios is the headline figure.
                order = list(configs)
                random.shuffle(order)
                got = {"untraced": timed(fn)}
                for k in order:
                    r = configs[k]()
                    if k in ("ocular", "memory", "flight", "live"):
                        r, events, lost = r
                    got[k] = r
                got["untraced"] = min(got["untraced"], timed(fn))
                for k, v in got.items():
                    runs[k].append(v)
                if events < 5_000:
                    break
                base = got["untraced"][0]
                ratios.append((got["ocular"][0] - base) / max(1, got["floor"][0] - base))
                mem_ratios.append((got["memory"][0] - base) / max(1, got["floor"][0] - base))
                ring_ratios.append((got["ocular"][0] - base) / max(1, got["memory"][0] - base))
                flight_ratios.append((got["flight"][0] - base) / max(1, got["ocular"][0] - base))
                live_ratios.append((got["live"][0] - base) / max(1, got["ocular"][0] - base))
            if events < 5_000:
                continue  # e.g. a loop without calls in calls mode: nothing to measure per event
            # Absolute figures: best of the repeats per configuration (interference only adds time).
            wall = {k: min(w for w, _ in v) for k, v in runs.items()}
            cpu = {k: min(c for _, c in v) for k, v in runs.items()}
            ns = {k: (wall[k] - wall["untraced"]) / events for k in ("floor", "noop", "noop_vc", "python", "ocular")}
            cns = {k: (cpu[k] - cpu["untraced"]) / events for k in ("floor", "ocular")}
            ratios.sort()
            mem_ratios.sort()
            ring_ratios.sort()
            flight_ratios.sort()
            live_ratios.sort()
            n = len(flight_ratios)
            fq1, fmed, fq3 = flight_ratios[n // 4], flight_ratios[n // 2], flight_ratios[(3 * n) // 4]
            lq1, lmed, lq3 = live_ratios[n // 4], live_ratios[n // 2], live_ratios[(3 * n) // 4]
            q1, med, q3 = ratios[len(ratios) // 4], ratios[len(ratios) // 2], ratios[(3 * len(ratios)) // 4]
            mem_med, ring_med = mem_ratios[len(mem_ratios) // 2], ring_ratios[len(ring_ratios) // 2]
            rows.append(
                f"| {wname} | {mode} | {events:,} | {wall['untraced'] / 1e6:.1f} | {ns['floor']:.1f} | "
                f"{ns['noop']:.1f} | {ns['noop_vc']:.1f} | {ns['python']:.1f} | {ns['ocular']:.1f} | **{med:.2f}x** ({q1:.2f}-{q3:.2f}) | "
                f"{cns['ocular'] / cns['floor']:.2f}x | "
                f"{wall['ocular'] / wall['untraced']:.2f}x | {wall['cprofile'] / wall['untraced']:.2f}x | "
                f"{mem_med:.2f}x | {ring_med:.3f}x | **{fmed:.3f}x** ({fq1:.2f}-{fq3:.2f}) | "
                f"**{lmed:.3f}x** ({lq1:.2f}-{lq3:.2f}) |"
                + (f" (lost {lost})" if lost else "")
            )
            print(rows[-1], flush=True)
    # A fresh code object for every run: on 3.12, instrumenting a function strips its superinstructions
    # for good, so reusing one function would compare a never-traced first run with later ones.
    src = "def big(n):\n    s = 0\n    for i in range(n):\n        s += i\n    return s\n"

    def fresh():
        ns = {}
        exec(compile(src, "<big-loop>", "exec"), ns)
        return lambda: ns["big"](12_000_000)

    un, oc = [], []
    for _ in range(max(3, args.repeats // 2)):
        un.append(timed(fresh())[0])
        oc.append(with_ocular(fresh(), "adaptive", 500, path)[0][0])
    u, o = min(un), min(oc)
    print(f"| tight loop, 12M iterations | {u / 1e6:.0f} | {o / 1e6:.0f} | {o / u:.3f}x |")
    # Calls: with the threshold, the run's first 50,000 calls are recorded (the first window), then only
    # those inside windows (0.5 ms every 10 ms): fib(25)'s 243k calls take ~15 ms, so its first window
    # is a fifth of its calls and most of this row's cost (bench-peers' longer call-heavy programs,
    # adaptive mode: 1.05-1.11x).
    fib_src = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"

    def fresh_fib():
        ns = {}
        exec(compile(fib_src, "<fib>", "exec"), ns)
        return lambda: ns["fib"](25)

    ratios = []
    for _ in range(max(3, args.repeats // 2)):
        u = timed(fresh_fib())[0]
        o = with_ocular(fresh_fib(), "adaptive", 500, path)[0][0]
        ratios.append(o / u)
    ratios.sort()
    print(f"| recursive calls, fib(25), 243k calls | - | - | {ratios[len(ratios) // 2]:.3f}x (median of paired runs) |")
    c_calls_table(args.repeats, path, floor)


if __name__ == "__main__":
    main()
