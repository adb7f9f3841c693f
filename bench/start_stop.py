"""A recording's own start and stop, in process: what `ocular.record()` takes to begin and to end around a
few calls, without the interpreter's start-up and imports that `bench/startup_bench.py` measures around it.

    PYTHON bench/start_stop.py [--processes N] [--against DIR]

Each process makes 40 recordings (calls mode, default buffers) of 20 short calls each and reports the
medians of the last 35; N processes (default 5) of this build, alternated with N of the build whose
`python/` directory is DIR, if given (its `ocular` package with its extension built for this Python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, tempfile, time
import ocular

def f(n):
    s = 0
    for i in range(n):
        s += i
    return s

d = tempfile.mkdtemp()
starts, stops = [], []
for i in range(40):
    p = os.path.join(d, f"r{i}.ocl")
    t0 = time.perf_counter()
    r = ocular.record(p, mode="calls")
    r.__enter__()
    t1 = time.perf_counter()
    for _ in range(20):
        f(10)
    t2 = time.perf_counter()
    r.__exit__(None, None, None)
    t3 = time.perf_counter()
    starts.append(t1 - t0)
    stops.append(t3 - t2)
    os.unlink(p)
os.rmdir(d)
print(json.dumps([sorted(starts[5:])[len(starts[5:]) // 2] * 1e3, sorted(stops[5:])[len(stops[5:]) // 2] * 1e3]))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=5, help="processes of each build (default 5)")
    ap.add_argument("--against", metavar="DIR", help="another build's python/ directory, alternated with this one")
    args = ap.parse_args()
    builds = {"this build": None}
    if args.against:
        builds[f"against {args.against}"] = os.path.abspath(args.against)
    got: dict[str, list[list[float]]] = {b: [] for b in builds}
    for _ in range(args.processes):
        for name, path in builds.items():
            env = dict(os.environ)
            if path:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# Python {sys.version.split()[0]}, {args.processes} processes of each build, alternated; each figure a "
          "process's median of 35 recordings")
    print("\n| build | start, ms (min-max of processes) | stop, ms |\n|---|---:|---:|")
    for name, runs in got.items():
        st, sp = [r[0] for r in runs], [r[1] for r in runs]
        print(f"| {name} | {statistics.median(st):.2f} ({min(st):.2f}-{max(st):.2f}) | "
              f"{statistics.median(sp):.2f} ({min(sp):.2f}-{max(sp):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
