"""The flight recorder (record(ring=...)): what a dump costs the program, and memory over a long run.

    .venv/3.13/bin/python bench/flight.py pause [--rings 8MB,64MB] [--dumps 20]
    .venv/3.13/bin/python bench/flight.py soak [--minutes 10] [--ring 16MB]

pause: a worker thread makes calls without end and notes the time every 1,000 calls, while the main thread
asks for a dump every 100 ms. Reported: how long rec.dump() holds the calling thread (it only creates the
file and queues the request), how long the writer thread takes to write the dump (wait=True, from another
thread), and the worker's longest gap between two notes while dumps are asked for and written, next to the
same moves of the GIL without dumps (the main thread takes it, then waits 50 ms without it): if the program
waited for a dump to be compressed or written, the first would be longer.

soak: records a loop of calls in calls mode with a small ring for the given minutes and prints, every 30
seconds, the process's resident memory (anonymous and shared: the ring file's pages are shared memory) and
the ring file's allocated bytes. Flat is the claim.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import threading
import time

import ocular
from ocular._recorder import parse_size


def leaf(i):
    return i + 1


def worker(stop, notes):
    i = 0
    while not stop.is_set():
        for _ in range(1000):
            leaf(i)
        notes.append(time.perf_counter_ns())
        i += 1


def gaps_us(notes, windows=None):
    """Gaps between consecutive notes, in us; only those that overlap a (start, end) window if given."""
    out = []
    for a, b in zip(notes, notes[1:]):
        if windows is None or any(a <= e and b >= s for s, e in windows):
            out.append((b - a) / 1e3)
    return out


def pause(args):
    tmp = tempfile.mkdtemp(prefix="ocular-flight-")
    print(f"# Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; a dump every 100 ms while a worker thread "
          f"calls without end (calls mode); {args.dumps} dumps per ring size")
    print()
    print("| ring | events in a dump | dump file MB | rec.dump() holds the caller, us: median / max "
          "| writer writes a dump, ms: median / max | worker's longest gap, us: during dumps / the same GIL hand-overs "
          "without dumps |")
    print("|---|---:|---:|---:|---:|---:|")
    for ring in args.rings.split(","):
        path = os.path.join(tmp, "run.ocl")
        rec = ocular.record(path, mode="calls", ring=ring)
        stop, notes = threading.Event(), []
        calls, writes, windows, sizes, events = [], [], [], [], []
        with rec:
            t = threading.Thread(target=worker, args=(stop, notes))
            t.start()
            time.sleep(1.0)  # the ring fills (64 MiB hold ~100 M events of this loop: it may not wrap)
            # The same dance without dumps: the main thread takes the GIL, then waits without it as long as
            # a dump takes. Python's GIL hand-over between two busy threads has its own gaps.
            control = []
            for k in range(args.dumps):
                time.sleep(0.1)
                t0 = time.perf_counter_ns()
                os.close(os.open(os.path.join(tmp, "c.ocl"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))
                time.sleep(0.05)
                control.append((t0, time.perf_counter_ns()))
            for k in range(args.dumps):
                time.sleep(0.1)
                d = os.path.join(tmp, f"d{k}.ocl")
                t0 = time.perf_counter_ns()
                rec.dump(d)
                t1 = time.perf_counter_ns()
                calls.append((t1 - t0) / 1e3)
                # The writer's own time, from a dump that is waited for (the GIL is released meanwhile).
                t2 = time.perf_counter_ns()
                rec.dump(d + ".w", wait=True)
                t3 = time.perf_counter_ns()
                writes.append((t3 - t2) / 1e6)
                windows.append((t0, t3))
                sizes.append(os.path.getsize(d + ".w"))
            stop.set()
            t.join()
        for k in range(args.dumps):
            f = os.path.join(tmp, f"d{k}.ocl.w")
            if k == args.dumps - 1:
                events.append(ocular.load(f).info()["events"])
            os.remove(f)
            os.remove(os.path.join(tmp, f"d{k}.ocl"))
        if rec.lost:
            print(f"({ring}: {rec.lost:,} events lost: the writer fell max_buffers behind during dumps)")
        quiet = gaps_us(notes, control)
        during = gaps_us(notes, windows)
        print(f"| {ring} | {events[-1]:,} | {statistics.median(sizes) / 1e6:.1f} | "
              f"{statistics.median(calls):.0f} / {max(calls):.0f} | "
              f"{statistics.median(writes):.1f} / {max(writes):.1f} | "
              f"{max(during):.0f} / {max(quiet):.0f} |", flush=True)
        os.remove(path)


def memory():
    """(anonymous RSS, shared RSS) in MiB from /proc/self/status."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                k, v = line.split(":")
                vals[k] = int(v.split()[0]) / 1024
    return vals.get("RssAnon", 0.0), vals.get("RssShmem", 0.0)


def soak(args):
    tmp = tempfile.mkdtemp(prefix="ocular-soak-")
    path = os.path.join(tmp, "soak.ocl")
    ring_bytes = parse_size(args.ring)
    print(f"# Python {sys.version.split()[0]}; calls mode, ring {args.ring}, {args.minutes} minutes of a loop of "
          f"calls; memory every 30 s")
    print()
    print("| minutes | calls made (M) | RSS anonymous MiB | RSS shared MiB (ring pages) | ring file allocated MiB |")
    print("|---:|---:|---:|---:|---:|")
    rec = ocular.record(path, mode="calls", ring=ring_bytes)
    end = time.monotonic() + args.minutes * 60
    calls = 0
    with rec:
        ring = [p for p in glob.glob(f"/dev/shm/ocular-{os.geteuid()}/soak.ocl.{os.getpid()}-*.ring")
                + glob.glob(os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "ocular",
                                         f"soak.ocl.{os.getpid()}-*.ring"))]
        next_report = time.monotonic()
        start = next_report
        while time.monotonic() < end:
            for i in range(100_000):
                leaf(i)
            calls += 100_000
            if time.monotonic() >= next_report:
                anon, shared = memory()
                alloc = os.stat(ring[0]).st_blocks * 512 / 2**20 if ring else float("nan")
                print(f"| {(time.monotonic() - start) / 60:.1f} | {calls / 1e6:.0f} | {anon:.1f} | {shared:.1f} | "
                      f"{alloc:.1f} |", flush=True)
                next_report += 30
    print()
    print(f"recorded {calls:,} calls; the file: {rec.summary()}")
    os.remove(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pause")
    p.add_argument("--rings", default="8MB,64MB")
    p.add_argument("--dumps", type=int, default=20)
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=10)
    s.add_argument("--ring", default="16MB")
    args = ap.parse_args()
    pause(args) if args.what == "pause" else soak(args)


if __name__ == "__main__":
    main()
