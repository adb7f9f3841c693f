"""Analyzer throughput: records a large gapless trace, then times each ocular-analyze command on it.

    make bench-analyze     (or: .venv/3.12/bin/python bench/analyze_bench.py [--events N])

--default records the default mode instead (every call: a call-dense program, ~13.6 M events), and
--against BINARY times another ocular-analyze beside this one, run for run (a build of an earlier commit).
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


def leaf(s):
    return len(s)


def mixed(n):
    t = 0
    for i in range(n):
        t += helper(i)
        if i % 7 == 0:
            t += leaf(str(i))
    return t


class Node:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


def objects(n):
    return sum(Node(i).get() for i in range(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000_000)
    ap.add_argument("--default", action="store_true", help="record the default mode (every call)")
    ap.add_argument("--against", metavar="BINARY", help="another ocular-analyze, timed beside this one")
    args = ap.parse_args()
    # The trace and its exports take over a gigabyte: removed on the way out, even on an error or ^C.
    with tempfile.TemporaryDirectory(prefix="ocular-analyze-bench-") as d:
        run(args, d)


def run(args, d):
    path = os.path.join(d, "big.ocl")
    if args.default:
        with ocular.record(path) as rec:
            for _ in range(3):
                mixed(1_200_000)
                work(300_000)
                objects(300_000)
    else:
        # About 3 events per iteration of work() and 5 per iteration of calls().
        with ocular.record(path, mode="adaptive", deinstrument_threshold=0) as rec:
            work(args.events * 2 // 9)
            calls(args.events // 15)
    size = os.path.getsize(path)
    runs = 5 if args.against else 3
    print(f"# {rec.events:,} events, {size / 1e6:.1f} MB ({size / rec.events:.2f} bytes/event), best of {runs} runs")
    print()
    if args.against:
        print("| command | seconds, against | M events/s, against | seconds | M events/s | speed-up |")
        print("|---|---:|---:|---:|---:|---:|")
    else:
        print("| command | seconds | M events/s |")
        print("|---|---:|---:|")
    for cmd in (["info"], ["stats"], ["hot"], ["export", "--perfetto", "-o", os.path.join(d, "big.json")],
                ["export", "--perfetto", "-o", os.path.join(d, "big.pftrace")],
                ["export", "--parquet", "-o", os.path.join(d, "big.parquet")],
                ["stats", "--lines"], ["flamegraph", "-o", os.path.join(d, "big.svg")],
                ["report", "-o", os.path.join(d, "big.html")]):
        binaries = [args.against, ANALYZE] if args.against else [ANALYZE]
        best = {b: float("inf") for b in binaries}
        for i in range(runs):
            for b in binaries if i % 2 == 0 else binaries[::-1]:
                # The other build writes files of its own, of the same kinds (the suffix says the format).
                out = [("%s.against%s" % os.path.splitext(c)) if b != ANALYZE and c.startswith(d) else c for c in cmd]
                for o in out:
                    if o.startswith(d) and os.path.exists(o):
                        os.unlink(o)  # not on the next run's time: freeing a large file's pages is slow
                t = time.perf_counter()
                r = subprocess.run([b, *out, path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if r.returncode != 0:
                    best[b] = float("nan")  # a build without this command (Parquet is a cargo feature)
                best[b] = min(best[b], time.perf_counter() - t)
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
        now = best[ANALYZE]
        if args.against:
            then = best[args.against]
            print(f"| `{label}` | {then:.3f} | {rec.events / then / 1e6:.1f} | {now:.3f} | {rec.events / now / 1e6:.1f} "
                  f"| {then / now:.2f}x |")
        else:
            print(f"| `{label}`{size} | {now:.3f} | {rec.events / now / 1e6:.1f} |")


if __name__ == "__main__":
    main()
