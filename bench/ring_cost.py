"""What the ring file costs a recording (RING.md: the buffers in a shared file mapping, so a killed
program loses nothing), measured the way a program meets it: one recording per fresh process, the ring
file and in-memory buffers alternating, N processes each. (bench/record_bench.py's "ring file / in memory"
column compares many recordings in one process, where the heap buffers of one recording are reused,
already faulted in, by the next, and each ring file is new: it overstates the ring's cost.)

    PYTHON bench/ring_cost.py [--processes N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, ocular
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
def loop(n):
    s = 0
    for i in range(n):
        s += i
    return s
work, mode, ring, path = sys.argv[1], sys.argv[2], sys.argv[3] == "ring", sys.argv[4]
fn = (lambda: fib(22)) if work == "fib" else (lambda: loop(300_000))
fn()
rec = ocular.record(path, mode=mode, deinstrument_threshold=0, ring_file=ring).start()
t0 = time.perf_counter_ns()
fn()
t1 = time.perf_counter_ns()
rec.stop()
print(t1 - t0, rec.events)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=25, help="fresh processes per configuration")
    args = ap.parse_args()
    print(f"# Python {platform.python_version()}, {platform.machine()}, {args.processes} fresh processes per "
          f"configuration, alternating; times are of the recorded work only (start and stop excluded)\n")
    print("| workload | mode | events | in memory, median ms | ring file, median ms | ring / memory, median of "
          "pairs | ring - memory, median of pairs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/r.ocl"
        for work, mode in (("fib", "calls"), ("loop", "adaptive")):
            t = {"memory": [], "ring": []}
            events = 0
            for _ in range(args.processes):
                for cfg in t:
                    out = subprocess.run([sys.executable, "-c", CHILD, work, mode, cfg, path], capture_output=True,
                                         text=True, check=True).stdout.split()
                    t[cfg].append(int(out[0]))
                    events = int(out[1])
            pairs = [r / m for r, m in zip(t["ring"], t["memory"])]
            diffs = [(r - m) / 1e6 for r, m in zip(t["ring"], t["memory"])]
            name = "fib(22)" if work == "fib" else "loop(300,000)"
            print(f"| {name} | {mode} | {events:,} | {statistics.median(t['memory']) / 1e6:.3f} | "
                  f"{statistics.median(t['ring']) / 1e6:.3f} | {statistics.median(pairs):.3f}x | "
                  f"{statistics.median(diffs):+.3f} ms |")


if __name__ == "__main__":
    main()
