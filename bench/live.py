"""Live reading: does a reader in another process slow the recording down, and what does it miss?

    .venv/3.13/bin/python bench/live.py [--repeats 5]

A program records itself with --live (calls mode) doing fixed work (2 threads, 4 M calls each); its
recorded work is timed. Side by side, alternated: no reader; a slow reader (polls every 0.5 s, the
Python API, so it falls far behind); `ocular-analyze top --once` for the whole run (polls every 2 ms,
aggregating). Reported per configuration: the work's median time and its ratio to no reader, and what
the reader got and missed (got + missed = what the file holds after the reader attached).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "release", "ocular-analyze"))

PROGRAM = textwrap.dedent("""
    import os, sys, threading, time
    def leaf(i):
        return i + 1
    def work(n):
        for i in range(n):
            leaf(i)
    go = sys.argv[1]
    print(os.getpid(), flush=True)
    while not os.path.exists(go):
        time.sleep(0.002)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(4_000_000,)) for _ in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
    print(f"{time.perf_counter() - t0:.6f}", flush=True)
""")

SLOW_READER = textwrap.dedent("""
    import sys, time
    import ocular
    cur = ocular.attach(int(sys.argv[1]))
    open(sys.argv[2], "w").close()
    got = missed = 0
    while True:
        time.sleep(0.5)
        raw, m, ended = cur._c.poll()
        got += len(raw); missed += m
        if ended:
            break
    print(got, missed)
""")


def one(tmp, reader):
    prog = os.path.join(tmp, "p.py")
    go = os.path.join(tmp, "go")
    if os.path.exists(go):
        os.remove(go)
    p = subprocess.Popen([sys.executable, "-m", "ocular", "run", "-q", "--live", "--mode", "calls", "-o",
                          os.path.join(tmp, "p.ocl"), prog, go], stdout=subprocess.PIPE, text=True, cwd=tmp)
    pid = int(p.stdout.readline())
    got = missed = None
    r = None
    if reader == "none":
        open(go, "w").close()
    elif reader == "slow":
        r = subprocess.Popen([sys.executable, "-c", SLOW_READER, str(pid), go], stdout=subprocess.PIPE, text=True)
    elif reader == "top":
        r = subprocess.Popen([ANALYZE, "top", str(pid), "--json", "--seconds", "30"], stdout=subprocess.PIPE,
                             text=True)
        time.sleep(0.3)
        open(go, "w").close()
    secs = float(p.stdout.readline())
    p.wait()
    if r is not None:
        out, _ = r.communicate(timeout=120)
        if reader == "slow":
            got, missed = map(int, out.split())
        else:
            import json

            snap = json.loads(out)
            got, missed = round(snap["events_per_s"] * snap["seconds"]), snap["missed"]
    return secs, got, missed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ocular-live-bench-")
    with open(os.path.join(tmp, "p.py"), "w") as f:
        f.write(PROGRAM)
    runs = {k: [] for k in ("none", "slow", "top")}
    seen = {}
    for _ in range(args.repeats):
        for k in runs:
            secs, got, missed = one(tmp, k)
            runs[k].append(secs)
            if got is not None:
                seen[k] = (got, missed)
    base = statistics.median(runs["none"])
    print(f"# Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeats} repeats alternated; "
          f"the program: 2 threads x 4 M calls recorded with --live (16 M events)")
    print()
    print("| reader | work, median s | / no reader | events the reader got | missed (counted) |")
    print("|---|---:|---:|---:|---:|")
    names = {"none": "none", "slow": "Python cursor, polls every 0.5 s", "top": "`ocular-analyze top`, polls every 2 ms"}
    for k, v in runs.items():
        got, missed = seen.get(k, ("-", "-"))
        fmt = (lambda x: f"{x:,}" if isinstance(x, int) else x)
        print(f"| {names[k]} | {statistics.median(v):.3f} | {statistics.median(v) / base:.3f}x | {fmt(got)} | "
              f"{fmt(missed)} |")


if __name__ == "__main__":
    main()
