"""Where the recorder's cost goes: the recording thread's own path vs the writer thread's interference.

Paired repeats on a tight loop (adaptive, gapless): the native floor callback, Ocular recording into
nothing (the same callbacks, buffers recycled, no writer work), and Ocular writing a file. Prints the
median and quartiles of (config - untraced) / (floor - untraced) taken within each repeat.

    .venv/3.12/bin/python bench/writer_interference.py [--repeats N]
"""

import argparse
import gc
import os
import random
import sys
import tempfile
import threading
import time

import ocular
from ocular import _interp, _ocular
from ocular._recorder import _callbacks

mon = sys.monitoring
NAMES = ("JUMP", "BRANCH")
MASK = mon.events.JUMP | mon.events.BRANCH


def loop(n=300_000):
    s = 0
    for i in range(n):
        s += i
    return s


def timed(f):
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter_ns()
        f()
        return time.perf_counter_ns() - t
    finally:
        gc.enable()


def with_callbacks(tool, cbs):
    for n in NAMES:
        mon.register_callback(tool, getattr(mon.events, n), cbs[n])
    mon.set_events(tool, MASK)
    try:
        return timed(loop)
    finally:
        mon.set_events(tool, 0)
        for n in NAMES:
            mon.register_callback(tool, getattr(mon.events, n), None)


def floor():
    mon.use_tool_id(4, "floor")
    try:
        cb = _ocular.bench_callbacks["floor"]
        return with_callbacks(4, {n: cb for n in NAMES})
    finally:
        mon.free_tool_id(4)


def into_nothing():
    mon.use_tool_id(2, "ocular")
    _ocular.start(None, {}, {
        "mode": "adaptive", "threshold": 0, "include_only": [], "exclude": [], "buffer_events": 65536,
        "max_buffers": 64, "event_cost_ticks": 0.0, "thread_name": _interp.boot_thread_name,
        "boot_code": _interp.boot_thread_name.__code__, "main_native_id": threading.get_native_id(),
        "main_name": "", "internal": []})
    try:
        return with_callbacks(2, _callbacks(0, "adaptive"))
    finally:
        _ocular.stop({})
        mon.free_tool_id(2)


def into_file(path):
    rec = ocular.record(path, deinstrument_threshold=0).start()
    try:
        return timed(loop)
    finally:
        rec.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="ocular-writer-bench-")  # removed at exit
    path = os.path.join(tmp.name, "w.ocl")
    loop(1000)
    configs = {"floor": floor, "Ocular into nothing": into_nothing, "Ocular into a file": lambda: into_file(path)}
    ratios = {k: [] for k in configs if k != "floor"}
    for _ in range(args.repeats):
        base = timed(loop)
        order = list(configs)
        random.shuffle(order)
        got = {k: configs[k]() for k in order}
        base = min(base, timed(loop))
        for k in ratios:
            ratios[k].append((got[k] - base) / max(1, got["floor"] - base))
    print(f"| tight loop, adaptive, gapless, {args.repeats} paired repeats | / floor, median | quartiles |")
    print("|---|---:|---:|")
    for k, v in ratios.items():
        v.sort()
        n = len(v)
        print(f"| {k} | {v[n // 2]:.3f}x | {v[n // 4]:.3f}-{v[3 * n // 4]:.3f} |")


if __name__ == "__main__":
    main()
