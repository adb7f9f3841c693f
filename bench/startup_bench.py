"""Start-up cost: an empty script run plainly and under each recorder, interleaved, so what is left is
each tool's fixed cost per run (imports, calibration, start, stop, writing the file).

    make bench-startup        (or: PYTHON bench/startup_bench.py [--runs N])

trace0 is included when the interpreter can import it (the venv of `make bench-peers` has it). When pyperf
can be imported (that venv again), a second table times the phases of recording what every pyperformance
program does first, `import pyperf; pyperf.Runner()`, timed inside fresh processes: `start()`, the body
(against the same body untraced), and `stop()`.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30, help="interleaved runs of each (default 30)")
    args = ap.parse_args()
    py = sys.executable
    # The children cache their bytecode as a user's Python would (this sandbox may say otherwise).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "empty.py")
        open(script, "w").close()
        out = os.path.join(tmp, "out")
        tools = {
            "python (no tool)": [py, script],
            "Ocular calls": [py, "-m", "ocular", "run", "-q", "-o", out + ".ocl", "--mode", "calls", script],
            "Ocular adaptive": [py, "-m", "ocular", "run", "-q", "-o", out + ".ocl", script],
        }
        if subprocess.run([py, "-c", "import trace0"], capture_output=True).returncode == 0:
            tools["trace0"] = [py, "-m", "trace0", "run", "-o", out + ".pb", "--no-trace-subprocesses", script]
        times: dict[str, list[float]] = {k: [] for k in tools}
        for cmd in tools.values():  # once each first: bytecode caches written, files in the page cache
            subprocess.run(cmd, env=env, capture_output=True, check=True)
        for _ in range(args.runs):
            for name, cmd in tools.items():
                t = time.perf_counter()
                subprocess.run(cmd, env=env, capture_output=True, check=True)
                times[name].append(time.perf_counter() - t)
    base = times["python (no tool)"]
    report_empty(times, base, args.runs)
    if subprocess.run([py, "-c", "import pyperf"], capture_output=True).returncode == 0:
        phases(py, env, args.runs)
    return 0


# A child: times start, body and stop of a recording of pyperf's start-up (mode "none": the body alone).
PHASES = """
import sys, time, ocular
mode, path = sys.argv[1], sys.argv[2]
rec = None if mode == "none" else ocular.record(path, mode=mode)
t0 = time.perf_counter()
if rec: rec.start()
t1 = time.perf_counter()
import pyperf
pyperf.Runner()
t2 = time.perf_counter()
if rec: rec.stop()
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, rec.events if rec else 0, rec.code_objects if rec else 0)
"""


def phases(py: str, env: dict, runs: int) -> None:
    modes = ("none", "calls", "adaptive")
    got: dict[str, list[list[float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for m in modes:
                out = subprocess.run([py, "-c", PHASES, m, os.path.join(tmp, "p.ocl")], env=env,
                                     capture_output=True, text=True, check=True).stdout
                got[m].append([float(x) for x in out.split()])
    med = {m: [statistics.median(col) for col in zip(*v)] for m, v in got.items()}
    print()
    print(f"# `import pyperf; pyperf.Runner()` recorded, {runs} interleaved fresh processes per mode; medians, ms")
    print()
    print("| mode | start | body | body over untraced | stop | events | code objects |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in modes:
        start, body, stop, events, codes = med[m]
        over = "—" if m == "none" else f"{(body - med['none'][1]) * 1e3:.1f}"
        print(f"| {'untraced' if m == 'none' else m} | {start * 1e3:.1f} | {body * 1e3:.1f} | {over} | "
              f"{stop * 1e3:.1f} | {int(events):,} | {int(codes):,} |")


def report_empty(times: dict[str, list[float]], base: list[float], runs: int) -> None:
    print(f"# Python {platform.python_version()}, {runs} interleaved runs of an empty script; "
          "'over python' is the median of each run's difference to the plain run beside it")
    print()
    print("| tool | min ms | median ms | over python, ms |")
    print("|---|---:|---:|---:|")
    for name, v in times.items():
        over = statistics.median(a - b for a, b in zip(v, base))
        print(f"| {name} | {min(v) * 1e3:.1f} | {statistics.median(v) * 1e3:.1f} | "
              f"{'—' if v is base else f'{over * 1e3:.1f}'} |")


if __name__ == "__main__":
    sys.exit(main())
