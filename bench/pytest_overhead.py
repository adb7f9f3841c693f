"""The pytest plugin's cost: a generated suite of 200 tests run plainly and with `--ocular DIR` (adaptive and
calls mode) and `--ocular-session PATH`, interleaved, wall time of the whole `python -m pytest` command
(start-up, collection, the tests, writing the traces and the summary that reads them).

    PYTHON bench/pytest_overhead.py [--runs N] [--tests N] [--against DIR]

The suite mixes what real suites hold: many tests that do almost nothing (a recording's fixed cost per test
shows there), some that sort, format, parse JSON or run a regex over a few thousand items, and a few that
spin in pure Python for ~20 ms. Prints a markdown table (median of the runs, min-max, and the ratio to the
plain run). `--against DIR` adds each Ocular row again with `PYTHONPATH=DIR`: DIR is another build's `python/`
directory (its `ocular` package with its extension built for this Python), interleaved with this build's.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MODULE = '''
import json
import re

import pytest

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa " * 50).split()


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def tokens(text):
    return [m.group(0) for m in re.finditer(r"[a-z]+", text)]


class Account:
    def __init__(self):
        self.balance = 0

    def deposit(self, amount):
        self.balance += amount
        return self.balance


@pytest.mark.parametrize("n", range({tiny}))
def test_tiny(n):
    assert n + 1 > n


@pytest.mark.parametrize("n", range({medium}))
def test_medium(n):
    data = sorted(WORDS[n % 10:] * 4, key=len)
    assert json.loads(json.dumps(data)) == data
    assert len(tokens(" ".join(data))) == len(data)
    acc = Account()
    for i in range(500):
        acc.deposit(i)
    assert acc.balance == 124750


@pytest.mark.parametrize("n", range({heavy}))
def test_heavy(n):
    assert fib(20 + n % 2) > 0
'''


def plugin_args(py: str) -> list[str]:
    """-p ocular._pytest unless the installed package's pytest11 entry point brings the plugin."""
    probe = ("from importlib.metadata import entry_points; "
             "print(any(ep.value == 'ocular._pytest' for ep in entry_points(group='pytest11')))")
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    return [] if out == "True" else ["-p", "ocular._pytest"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs of each (default 3)")
    ap.add_argument("--tests", type=int, default=200, help="tests in the suite (default 200)")
    ap.add_argument("--against", metavar="DIR", help="another build's python/ directory, measured beside this one")
    args = ap.parse_args()
    py = sys.executable
    # Per module: 60% tiny, 35% medium, 5% heavy; 4 modules.
    per = args.tests // 4
    heavy = max(1, per * 5 // 100)
    medium = per * 35 // 100
    tiny = per - heavy - medium
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTEST_ADDOPTS"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(4):
            with open(os.path.join(tmp, f"test_gen{i}.py"), "w") as f:
                f.write(MODULE.format(tiny=tiny, medium=medium, heavy=heavy))
        base = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(py), tmp]
        runs = {
            "pytest (no recording)": base,
            "--ocular DIR (adaptive)": [*base, "--ocular", os.path.join(tmp, "traces")],
            "--ocular DIR --ocular-mode calls": [*base, "--ocular", os.path.join(tmp, "traces-calls"),
                                                 "--ocular-mode", "calls"],
            "--ocular-session PATH (adaptive)": [*base, "--ocular-session", os.path.join(tmp, "session.ocl")],
        }
        envs = {name: env for name in runs}
        if args.against:
            old = {**env, "PYTHONPATH": os.path.abspath(args.against)}
            for name, cmd in list(runs.items())[1:]:
                runs[name + " (against)"] = [c.replace("traces", "traces-against") for c in cmd]
                envs[name + " (against)"] = old
        times: dict[str, list[float]] = {k: [] for k in runs}
        count = None
        for name, cmd in runs.items():  # once each first: bytecode cached, files in the page cache
            out = subprocess.run(cmd, env=envs[name], capture_output=True, text=True, cwd=tmp)
            if out.returncode != 0:
                print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
                return 1
            last = [ln for ln in out.stdout.splitlines() if " passed" in ln]
            count = last[-1].strip("= ") if last else count
        for _ in range(args.runs):
            for name, cmd in runs.items():
                t = time.perf_counter()
                subprocess.run(cmd, env=envs[name], capture_output=True, check=True, cwd=tmp)
                times[name].append(time.perf_counter() - t)
        traces = len(os.listdir(os.path.join(tmp, "traces")))
    plain = statistics.median(times["pytest (no recording)"])
    print(f"pytest plugin overhead: {args.tests} generated tests ({tiny * 4} tiny, {medium * 4} medium, "
          f"{heavy * 4} heavy; {count}), {args.runs} interleaved runs each, Python {platform.python_version()}, "
          f"{traces} trace files per --ocular run")
    if args.against:
        print(f"against: the ocular package at {os.path.abspath(args.against)}")
    print()
    print("| run | wall s, median (min-max) | per test, over plain | x plain |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        extra = (med - plain) / args.tests * 1e3
        print(f"| {name} | {med:.2f} ({min(ts):.2f}-{max(ts):.2f}) | "
              f"{'-' if name.startswith('pytest') else f'{extra:+.1f} ms'} | {med / plain:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
