"""The default mode, and the sampled one, against programs that measure themselves:
`testdata/workloads/known_truth.py` counts and times its own functions (`time.perf_counter` around every
call). Each variant runs untraced (the truth for times) and then under `python -m ocular run` (the default:
every call; `--sampled`: calls in windows); the table puts each figure, with its 95% interval, beside the
program's own measurements.

    make bench-truth     (or: PY bench/known_truth.py [--rounds 8] [--variants json,sleep] [--modes default,sampled])

Per variant: `py_heavy` (120,000 calls of a one-line `leaf` per round) and the variant's second function,
whose time is spent where no safe point comes (a long C call, a sleep, a collection, ...): each one's
estimated inclusive time and interval, the truth untraced and traced, and whether the truth (either) lies
inside the interval; then each one's count (`leaf`'s on `py_heavy`'s row) against the true one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "release", "ocular-analyze"))
WORKLOAD = os.path.join(ROOT, "testdata", "workloads", "known_truth.py")
SECOND = {"json": "c_json", "sleep": "waiter", "gc": "churn", "hashlib": "c_hash", "regex": "c_regex",
          "recurse": "recurse", "generator": "consume", "threads": "c_json", "requests": "request"}


def run(tmp: str, variant: str, rounds: int, traced: bool, sampled: bool = False) -> dict:
    out = os.path.join(tmp, f"{variant}-{traced}.json")
    cmd = [sys.executable]
    if traced:
        cmd += ["-m", "ocular", "run", "-q", "-o", os.path.join(tmp, f"{variant}.ocl"), *(["--sampled"] * sampled)]
    subprocess.run(cmd + [WORKLOAD, variant, str(rounds)], env=dict(os.environ, KNOWN_TRUTH_OUT=out),
                   check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)


def calls_text(r: dict | None, truth: int) -> str:
    """A function's count beside the program's own: `~N ±ci, truth` for an estimate."""
    if not r:
        return "-"
    if r["calls_estimated"]:
        return f"~{r['calls']:,} ±{r['calls_ci95']:,.0f}, {truth:,}"
    return f"{r['calls']:,} (exact), {truth:,}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--variants", default=",".join(SECOND))
    ap.add_argument("--modes", default="default,sampled", help="default (every call), sampled (--sampled)")
    args = ap.parse_args()
    print(f"# Ocular against programs that measure themselves: Python {sys.version.split()[0]}, {args.rounds} rounds")
    print("| mode | variant | function | figure ms | truth ms (untraced, traced) | inside (or within 2%) | off by | "
          "calls: Ocular, truth (`leaf`'s on `py_heavy`'s row) |")
    print("|---|---|---|---:|---:|---|---:|---|")
    inside = close = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for mode, variant in [(m, v) for m in args.modes.split(",") for v in args.variants.split(",")]:
            truth = run(tmp, variant, args.rounds, traced=False)
            traced = run(tmp, variant, args.rounds, traced=True, sampled=mode == "sampled")
            out = subprocess.run([ANALYZE, "stats", "--json", "--top", "100000", os.path.join(tmp, f"{variant}.ocl")],
                                 capture_output=True, text=True, check=True)
            rows = {r["function"]: r for r in json.loads(out.stdout)}
            for name in ("py_heavy", SECOND[variant]):
                r = rows[name]
                counted = ("leaf", traced["leaf_calls"]) if name == "py_heavy" else (name, traced["counts"][name])
                calls = calls_text(rows.get(counted[0]), counted[1])
                want = (truth["times_s"][name] * 1e3, traced["times_s"][name] * 1e3)
                est, ci = r["inclusive_ms"], r["inclusive_ci95_ms"]
                if r["times_lower_bound"]:
                    # No window saw it: a lower bound, which holds if the truth is above it.
                    ok = any(w >= est for w in want)
                    inside += ok
                    total += 1
                    print(f"| {mode} | {variant} | `{name}` | >={est:,.0f} (no window saw it) | {want[0]:,.0f}, "
                          f"{want[1]:,.0f} | {'yes' if ok else 'no'} | | {calls} |")
                    continue
                # The nearer of the two truths: the untraced run, or the traced run's own measurement.
                lo, hi = min(want), max(want)
                off = (est - lo) / lo if est < lo else (est - hi) / hi if est > hi else 0.0
                # A time with nothing to take out (no event inside: a C call, a sleep) has no interval; the
                # program's timer sits a few microseconds from the recorder's events around it.
                ok = any(abs(est - w) <= ci for w in want) or abs(off) <= 0.02
                inside += ok
                close += abs(off) <= 0.25
                total += 1
                print(f"| {mode} | {variant} | `{name}` | {est:,.0f} ±{ci:,.0f} | {want[0]:,.0f}, {want[1]:,.0f} | "
                      f"{'yes' if ok else 'no'} | {off:+.0%} | {calls} |")
    print(f"\n{inside} of {total} times hold the program's own measurement inside their 95% interval, within 2%, or "
          f"above their lower bound; {close} of {total} are within 25% of it")


if __name__ == "__main__":
    main()
