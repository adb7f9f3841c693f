"""Start-up cost: what Ocular adds to every run, to every Python child a run follows, and to every test of
`pytest --ocular DIR`, each measured beside the same thing without Ocular, interleaved (this machine's load
moves both alike):

- an empty script, run plainly and under `ocular run` (calls and adaptive mode), and trace0 where it is
  installed: each tool's fixed cost per run (imports, calibration, start, stop, writing the file);
- a followed child: a parent that starts `python -c pass` 10 times, timing each `subprocess.run`, run
  plainly and under `ocular run` (which records each child into the run's directory);
- pytest: 60 one-line tests, plainly and with `--ocular DIR` (a trace per test): the difference per test.

    make bench-startup        (or: PYTHON bench/startup_bench.py [--runs N] [--against DIR])

`--against DIR` adds each Ocular row again with `PYTHONPATH=DIR`: DIR is another build's `python/`
directory (its `ocular` package with its extension built for this Python), for a side-by-side table of
two builds in one run. When pyperf can be imported (the venv of `make bench-peers`), a last table times
the phases of recording what every pyperformance program does first, `import pyperf; pyperf.Runner()`.
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

PARENT = """
import subprocess, sys, time
times = []
for _ in range(10):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2])
"""

TESTS = 60


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="interleaved runs of each (default 20)")
    ap.add_argument("--against", metavar="DIR", help="another build's python/ directory, measured beside this one")
    args = ap.parse_args()
    py = sys.executable
    # The children cache their bytecode as a user's Python would (this sandbox may say otherwise).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    builds = {"": env}
    if args.against:
        old = dict(env)
        old["PYTHONPATH"] = os.path.abspath(args.against) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        builds[" (against)"] = old
        where = subprocess.run([py, "-c", "import ocular; print(ocular.__file__)"], env=old, capture_output=True,
                               text=True, check=True).stdout.strip()
        print(f"# against: the ocular package at {where}")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "empty.py")
        open(script, "w").close()
        parent = os.path.join(tmp, "parent.py")
        with open(parent, "w") as f:
            f.write(PARENT)
        suite = os.path.join(tmp, "suite")
        os.mkdir(suite)
        with open(os.path.join(suite, "test_tiny.py"), "w") as f:
            f.write("import pytest\n\n\n@pytest.mark.parametrize('n', range(%d))\ndef test_tiny(n):\n    assert n >= 0\n"
                    % TESTS)
        out = os.path.join(tmp, "out")
        # Each row its own output: a run removes its output's children directory left by an earlier run
        # (the followed parent's ten children), which is not an empty script's cost.
        def ocular(name: str) -> list[str]:
            return [py, "-m", "ocular", "run", "-q", "-o", os.path.join(tmp, name + ".ocl")]

        pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(py, env), suite]
        # name -> (command, environment)
        empty = {"python (no tool)": ([py, script], env)}
        follow = {"child of an unrecorded parent": ([py, parent], env)}
        tests = {"pytest": (pytest, env)}
        for tag, benv in builds.items():
            empty[f"Ocular calls{tag}"] = ([*ocular(f"calls{tag}"), "--mode", "calls", script], benv)
            empty[f"Ocular adaptive{tag}"] = ([*ocular(f"adaptive{tag}"), script], benv)
            follow[f"child of `ocular run`{tag}"] = ([*ocular(f"follow{tag}"), parent], benv)
            tests[f"pytest --ocular DIR{tag}"] = ([*pytest, "--ocular", os.path.join(tmp, "traces")], benv)
        if subprocess.run([py, "-c", "import trace0"], capture_output=True).returncode == 0:
            empty["trace0"] = ([py, "-m", "trace0", "run", "-o", out + ".pb", "--no-trace-subprocesses", script], env)
        groups = [empty, follow, tests]
        every = {name: cmd for g in groups for name, cmd in g.items()}
        times: dict[str, list[float]] = {k: [] for k in every}
        for cmd, e in every.values():  # once each first: bytecode caches written, files in the page cache
            subprocess.run(cmd, env=e, capture_output=True, check=True)
        for i in range(args.runs):
            print(f"\r# run {i + 1} of {args.runs}", end="", file=sys.stderr, flush=True)
            for name, (cmd, e) in every.items():
                t = time.perf_counter()
                r = subprocess.run(cmd, env=e, capture_output=True, text=True, check=True)
                took = time.perf_counter() - t
                # A parent's figure is the median time of its children, as it timed them.
                times[name].append(float(r.stdout.split()[-1]) if name.startswith("child of") else took)
        print(file=sys.stderr)
    report(f"# Python {platform.python_version()}, {args.runs} interleaved runs of an empty script; 'over "
           "python' is the median of each run's difference to the plain run beside it (target: within 10 ms)",
           "tool", times, empty, "python (no tool)", 1)
    report("# A Python child (`python -c pass`) started by a parent 10 times, each timed by the parent: the "
           "median child, recorded or not (target: within 15 ms)", "child", times, follow,
           "child of an unrecorded parent", 1)
    report(f"# pytest on {TESTS} one-line tests, the whole command; 'over plain' is per test (target: within "
           "2 ms)", "run", times, tests, "pytest", TESTS)
    if subprocess.run([py, "-c", "import pyperf"], capture_output=True).returncode == 0:
        phases(py, env, args.runs)
    return 0


def plugin_args(py: str, env: dict) -> list[str]:
    """-p ocular._pytest unless the installed package's pytest11 entry point brings the plugin."""
    out = subprocess.run([py, "-c", "from importlib.metadata import entry_points; "
                          "print(any(ep.value == 'ocular._pytest' for ep in entry_points(group='pytest11')))"],
                         env=env, capture_output=True, text=True).stdout.strip()
    return [] if out == "True" else ["-p", "ocular._pytest"]


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


def report(title: str, what: str, times: dict[str, list[float]], group: dict, base_name: str, per: int) -> None:
    print()
    print(title)
    print()
    print(f"| {what} | min ms | median ms | over {'python' if per == 1 and what == 'tool' else 'plain'}, ms |")
    print("|---|---:|---:|---:|")
    base = times[base_name]
    for name in group:
        v = times[name]
        over = statistics.median(a - b for a, b in zip(v, base)) / per
        print(f"| {name} | {min(v) * 1e3:.1f} | {statistics.median(v) * 1e3:.1f} | "
              f"{'—' if name == base_name else f'{over * 1e3:.1f}'} |")


if __name__ == "__main__":
    sys.exit(main())
