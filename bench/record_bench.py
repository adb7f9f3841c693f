"""Recorder overhead, side by side in one run: ns per event over the untraced run for each mode, next to
the physical floor (a native METH_FASTCALL callback that reads the TSC and stores a 24-byte record), a
native no-op callback, a no-op Python callback, and cProfile. Interleaved repeats, medians.

    make bench-record            (or: .venv/3.12/bin/python bench/record_bench.py [--repeats N])
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
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


def mask(mode):
    m = 0
    for n in event_names(mode):
        m |= getattr(sys.monitoring.events, n)
    return m


def timed(fn):
    """(wall ns, CPU ns of this thread): the second excludes time the thread was not running."""
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


def with_callback(fn, mode, cb):
    mon = sys.monitoring
    mon.use_tool_id(TOOL, "bench")
    for n in event_names(mode):
        mon.register_callback(TOOL, getattr(mon.events, n), cb)
    mon.set_events(TOOL, mask(mode))
    try:
        return timed(fn)
    finally:
        mon.set_events(TOOL, 0)
        for n in event_names(mode):
            mon.register_callback(TOOL, getattr(mon.events, n), None)
        mon.free_tool_id(TOOL)


def with_ocular(fn, mode, threshold, path):
    rec = ocular.record(path, mode=mode, deinstrument_threshold=threshold)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--modes", default="calls,adaptive,precise")
    args = ap.parse_args()
    floor, noop = _ocular.bench_callbacks["floor"], _ocular.bench_callbacks["noop"]
    path = os.path.join(tempfile.mkdtemp(), "bench.ocl")
    modes = args.modes.split(",")
    print(f"# Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"best of {args.repeats} interleaved repeats per configuration; ns/ev = (time - untraced) / events; "
          f"wall clock, and CPU time of the recording thread (time.thread_time_ns)")
    print()
    print("| workload | mode | events/run | untraced ms | floor ns/ev | native no-op ns/ev | Python no-op ns/ev "
          "| **Ocular ns/ev** | **Ocular / floor** | floor CPU ns/ev | Ocular CPU ns/ev | CPU Ocular / floor "
          "| Ocular slowdown | cProfile slowdown |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for wname, fn in WORKLOADS.items():
        fn()  # warm up and specialize
        for mode in modes:
            runs = {k: [] for k in ("untraced", "floor", "noop", "python", "ocular", "cprofile")}
            events = lost = 0
            for _ in range(args.repeats):
                runs["untraced"].append(timed(fn))
                runs["floor"].append(with_callback(fn, mode, floor))
                runs["noop"].append(with_callback(fn, mode, noop))
                runs["python"].append(with_callback(fn, mode, python_noop))
                t, events, lost = with_ocular(fn, mode, 0, path)
                runs["ocular"].append(t)
                runs["cprofile"].append(with_cprofile(fn))
                if events < 5_000:
                    break
            if events < 5_000:
                continue  # e.g. a loop without calls in calls mode: nothing to measure per event
            # Best of the interleaved repeats, per configuration: interference only ever adds time.
            wall = {k: min(w for w, _ in v) for k, v in runs.items()}
            cpu = {k: min(c for _, c in v) for k, v in runs.items()}
            ns = {k: (wall[k] - wall["untraced"]) / events for k in ("floor", "noop", "python", "ocular")}
            cns = {k: (cpu[k] - cpu["untraced"]) / events for k in ("floor", "ocular")}
            rows.append(
                f"| {wname} | {mode} | {events:,} | {wall['untraced'] / 1e6:.1f} | {ns['floor']:.1f} | "
                f"{ns['noop']:.1f} | {ns['python']:.1f} | **{ns['ocular']:.1f}** | **{ns['ocular'] / ns['floor']:.2f}x** | "
                f"{cns['floor']:.1f} | {cns['ocular']:.1f} | {cns['ocular'] / cns['floor']:.2f}x | "
                f"{wall['ocular'] / wall['untraced']:.2f}x | {wall['cprofile'] / wall['untraced']:.2f}x |"
                + (f" (lost {lost})" if lost else "")
            )
            print(rows[-1], flush=True)
    # The adaptive default: a loop that runs about a second, untraced vs recorded with threshold 500.
    print()
    print("| adaptive, default threshold (500), loop of ~1 s, best of repeats | untraced ms | Ocular ms | slowdown |")
    print("|---|---:|---:|---:|")
    big = lambda: tight_loop(12_000_000)  # noqa: E731
    un, oc = [], []
    for _ in range(max(3, args.repeats // 2)):
        un.append(timed(big)[0])
        oc.append(with_ocular(big, "adaptive", 500, path)[0][0])
    u, o = min(un), min(oc)
    print(f"| tight loop, 12M iterations | {u / 1e6:.0f} | {o / 1e6:.0f} | {o / u:.3f}x |")


if __name__ == "__main__":
    main()
