"""What performance counters cost a recording: the same work recorded without counters and with each
sampling rate, alternated in one process, median of the repeats; the work's time over the time without.

    .venv/3.13/bin/python bench/counters.py [--repeats 9]

The work: 300,000 calls of a small function and a loop over fresh memory (calls mode, gapless). With
counters off nothing of them runs (the recorder checks for counters once per new thread).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

import ocular

CONFIGS = {
    "none": [],
    "task-clock, every 1 ms (default)": ["task-clock"],
    "task-clock, every 100 us": ["task-clock:100000"],
    "task-clock, every 10 us": ["task-clock:10000"],
    "page-faults, every fault": ["page-faults"],
    "context-switches": ["context-switches"],
}


def leaf(i):
    return i + 1


def work():
    for i in range(300_000):
        leaf(i)
    b = bytearray(16 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1


def one(path, counters):
    rec = ocular.record(path, mode="calls", counters=counters)
    rec.start()
    t0 = time.perf_counter()
    work()
    t = time.perf_counter() - t0
    rec.stop()
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="ocular-counters-"), "c.ocl")
    work()
    times = {k: [] for k in CONFIGS}
    for _ in range(args.repeats):
        order = list(CONFIGS)
        random.shuffle(order)
        for k in order:
            times[k].append(one(path, CONFIGS[k]))
    base = statistics.median(times["none"])
    print(f"# Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeats} repeats shuffled; the work: "
          f"300,000 calls and 16 MiB of fresh memory, recorded in calls mode")
    print()
    print("| counters | work, median ms | / no counters |")
    print("|---|---:|---:|")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"| {k} | {m * 1e3:.1f} | {m / base:.3f}x |")


if __name__ == "__main__":
    main()
