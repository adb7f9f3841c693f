"""Start-up cost: an empty script run plainly and under each recorder, interleaved, so what is left is
each tool's fixed cost per run (imports, calibration, start, stop, writing the file).

    make bench-startup        (or: PYTHON bench/startup_bench.py [--runs N])

trace0 is included when the interpreter can import it (the venv of `make bench-peers` has it).
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
    print(f"# Python {platform.python_version()}, {args.runs} interleaved runs of an empty script; "
          "'over python' is the median of each run's difference to the plain run beside it")
    print()
    print("| tool | min ms | median ms | over python, ms |")
    print("|---|---:|---:|---:|")
    for name, v in times.items():
        over = statistics.median(a - b for a, b in zip(v, base))
        print(f"| {name} | {min(v) * 1e3:.1f} | {statistics.median(v) * 1e3:.1f} | "
              f"{'—' if v is base else f'{over * 1e3:.1f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
