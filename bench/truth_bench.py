"""Does `hot` tell the truth? For loops of known shape, the untraced time per iteration next to the
ns_per_iteration that `ocular-analyze hot` reports from an adaptive recording (default threshold 500).

    make bench-truth     (or: .venv/3.12/bin/python bench/truth_bench.py; needs target/release/ocular-analyze)

Untraced: (time of f(N) - time of f(0)) / N, best of 3, after warm-up, on a fresh code object (as the
recorded run is). Recorded: a fresh code object, recorded from its first call, as a user would. The two are
measured side by side in each repeat, and the error is the median over repeats of the paired ratio: this
VM's speed drifts by 2x between phases of a run, so two separately taken figures do not compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import tempfile
import time

import ocular

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.path.join(ROOT, "target", "release", "ocular-analyze")

SOURCES = {
    "tight (~50 ns)": """
def loop(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s
""",
    "arithmetic and a list (~200 ns)": """
def loop(n):
    acc = []
    t = 0.0
    for i in range(n):
        x = (i * 3 + 1) % 11
        acc.append(x * 0.5)
        if len(acc) > 8:
            t += acc.pop(0)
    return t
""",
    "a call and a dict (~1 us)": """
def helper(d, k):
    v = d.get(k, 0) + 1
    d[k] = v
    return v

def loop(n):
    d = {}
    total = 0
    for i in range(n):
        total += helper(d, i % 13) + len(str(i))
        if total % 5 == 0:
            total -= 1
    return total
""",
}


def fresh(src):
    ns = {}
    exec(compile(src, "<truth>", "exec"), ns)
    return ns["loop"]


def timed(f, n):
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter_ns()
        f(n)
        return time.perf_counter_ns() - t
    finally:
        gc.enable()


def untraced_ns(src, n, repeats):
    best = float("inf")
    for _ in range(repeats):
        f = fresh(src)
        f(2000)  # warm up: specialize, as 500 recorded iterations of a longer run would be
        best = min(best, (timed(f, n) - timed(f, 0)) / n)
    return best


def reported_ns(src, n, path):
    f = fresh(src)
    with ocular.record(path, mode="adaptive"):
        f(n)
    out = subprocess.run([ANALYZE, "hot", "--json", "--top", "5", path], capture_output=True, text=True, check=True)
    loops = [l for l in json.loads(out.stdout)["loops"] if l["function"] == "loop"]
    return loops[0]["ns_per_iteration"], loops[0]["iterations"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    if not os.path.exists(ANALYZE):
        raise SystemExit(f"build the analyzer first: cargo build --release -p ocular-analyze ({ANALYZE})")
    tmp = tempfile.TemporaryDirectory(prefix="ocular-truth-bench-")  # removed at exit
    path = os.path.join(tmp.name, "truth.ocl")
    print(f"# Python {platform.python_version()}; {args.repeats} repeats, each an untraced measurement (best of 3) "
          f"and a recording (adaptive mode, default threshold 500) side by side; medians over repeats")
    print()
    print("| loop | untraced ns/iteration | `hot` ns/iteration | error (median of paired ratios) | iterations recorded |")
    print("|---|---:|---:|---:|---:|")
    for name, src in SOURCES.items():
        pairs = []
        for _ in range(args.repeats):
            truth = untraced_ns(src, 50_000, 3)
            rep, iters = reported_ns(src, 20_000, path)
            pairs.append((truth, rep, iters))
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        err = med([rep / truth - 1 for truth, rep, _ in pairs])
        print(f"| {name} | {med([p[0] for p in pairs]):.1f} | {med([p[1] for p in pairs]):.1f} | {100 * err:+.1f}% "
              f"| {med([p[2] for p in pairs])} |", flush=True)


if __name__ == "__main__":
    main()
