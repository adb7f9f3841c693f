"""Analyzer throughput: records a large gapless trace, then times each ocular-analyze command on it.

    make bench-analyze     (or: .venv/3.12/bin/python bench/analyze_bench.py [--events N])
"""

import argparse
import os
import subprocess
import tempfile
import time

import ocular

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "ocular-analyze")


def work(n):
    s = 0
    for i in range(n):
        if i % 3:
            s += i
        else:
            s -= 1
    return s


def helper(x):
    return x + 1


def calls(n):
    t = 0
    for i in range(n):
        t += helper(i)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000_000)
    args = ap.parse_args()
    # The trace and its exports take over a gigabyte: removed on the way out, even on an error or ^C.
    with tempfile.TemporaryDirectory(prefix="ocular-analyze-bench-") as d:
        run(args, d)


def run(args, d):
    path = os.path.join(d, "big.ocl")
    # About 3 events per iteration of work() and 5 per iteration of calls().
    with ocular.record(path, mode="adaptive", deinstrument_threshold=0) as rec:
        work(args.events * 2 // 9)
        calls(args.events // 15)
    size = os.path.getsize(path)
    print(f"# {rec.events:,} events, {size / 1e6:.1f} MB ({size / rec.events:.2f} bytes/event), best of 3 runs")
    print()
    print("| command | seconds | M events/s |")
    print("|---|---:|---:|")
    for cmd in (["info"], ["stats"], ["hot"], ["export", "--perfetto", "-o", os.path.join(d, "big.json")],
                ["export", "--perfetto", "-o", os.path.join(d, "big.pftrace")],
                ["export", "--parquet", "-o", os.path.join(d, "big.parquet")],
                ["stats", "--lines"], ["flamegraph", "-o", os.path.join(d, "big.svg")],
                ["report", "-o", os.path.join(d, "big.html")]):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run([ANALYZE, *cmd, path], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            best = min(best, time.perf_counter() - t)
        label = cmd[0]
        if cmd[1:2] == ["--perfetto"]:
            label += " --perfetto" + (" (pftrace)" if cmd[-1].endswith("pftrace") else " (json)")
        elif cmd[1:2] == ["--parquet"]:
            label += " --parquet (rows = events)"
        elif cmd[1:2] == ["--lines"]:
            label += " --lines"
        size = ""
        if cmd[0] in ("flamegraph", "report"):
            size = f" ({os.path.getsize(cmd[-1]) / 1e3:.0f} KB written)"
        print(f"| `{label}`{size} | {best:.3f} | {rec.events / best / 1e6:.1f} |")


if __name__ == "__main__":
    main()
