"""After a recording stops, the program runs at its untraced speed, and a tool sharing the process pays
once for the restart of its switched-off locations.

    make bench-after-stop        (or: PYTHON bench/after_stop.py [--repeats N])

Table 1: a hot loop (calls of a tiny function; a plain arithmetic loop) timed in a fresh process after a
default-mode recording of those loops stopped (C), next to the same loops in a fresh process that never
recorded (A; it ran them as often, untraced, so both are equally warm) and in one that recorded other
code (B: what a recording leaves in the process apart from the loops' instrumentation, such as its heap).
The kinds of process alternate; each cell is the median over repeats of the best of 5 timings inside one
process. C/B near 1.00x: nothing of the recording is left on the loops.

Table 2 (when coverage.py can be imported): Ocular's stop calls sys.monitoring.restart_events(), which
switches back on the locations every tool of the process switched off by returning DISABLE. coverage.py's
sysmon core (COVERAGE_CORE=sysmon) does that for every line it has seen, so it gets one more callback per
line it sees again. The table counts coverage.py's callbacks per pass over a generated module, and says
whether its report equals the report of a process that never recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

LOOP_CHILD = r"""
import json, sys, time
N = 1_000_000

def tiny():
    return 1

def calls(n):
    s = 0
    for _ in range(n):
        s += tiny()
    return s

def arith(n):
    s = 0
    for i in range(n):
        s += i * 3 % 7
    return s

def warm():
    calls(100_000)
    arith(100_000)

def other(n):
    return sum(i for i in range(n))

import ocular  # in every kind of process
if sys.argv[1] == "recorded":
    with ocular.record(sys.argv[2]):  # the default mode: adaptive, threshold 500
        warm()
elif sys.argv[1] == "other":
    with ocular.record(sys.argv[2]):  # the same process state, but the loops were never instrumented
        other(100_000)
    warm()
else:
    warm()

def best(f):
    ts = []
    for _ in range(5):
        t = time.perf_counter_ns()
        f(N)
        ts.append(time.perf_counter_ns() - t)
    return min(ts) / N

print(json.dumps({"calls": best(calls), "arith": best(arith)}))
"""

COV_CHILD = r"""
import json, sys, time
out, module_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, module_dir)
import coverage, ocular
mon = sys.monitoring
count = [0]
real_register = mon.register_callback

def counting(tool, event, func):
    # Wraps coverage.py's callbacks (tool COVERAGE_ID) to count them; the wrapper returns what they return.
    if tool == mon.COVERAGE_ID and func is not None:
        inner = func
        def func(*args):
            count[0] += 1
            return inner(*args)
    return real_register(tool, event, func)

mon.register_callback = counting
cov = coverage.Coverage(data_file=None, include=[module_dir + "/*"])
cov.start()
mon.register_callback = real_register
assert mon.get_tool(mon.COVERAGE_ID) is not None, "coverage.py is not on sys.monitoring"
import gen

rows = []
def run(name):
    count[0] = 0
    t = time.perf_counter_ns()
    gen.run_all()
    rows.append((name, count[0], (time.perf_counter_ns() - t) / 1e6))

run("first pass (coverage sees every line)")
run("second pass (switched off: the steady state)")
if mode == "recorded":
    with ocular.record(out):
        run("while recording (Ocular's start restarted events)")
    run("after stop (Ocular's stop restarted events)")
    run("after stop, again")
else:
    run("third pass")
    run("fourth pass")
cov.stop()
_, statements, _, missing, _ = cov.analysis2(gen.__file__)
print(json.dumps({"rows": rows, "statements": len(statements), "missing": missing}))
"""


def gen_module(path: str, functions: int = 200, lines: int = 10) -> None:
    """A module of `functions` straight-line functions of `lines` statements each, and run_all()."""
    with open(path, "w") as f:
        for i in range(functions):
            f.write(f"def f{i}(x):\n")
            for j in range(lines):
                f.write(f"    x = x + {j}\n")
            f.write("    return x\n\n")
        f.write("def run_all():\n")
        f.write(f"    for f in ({', '.join(f'f{i}' for i in range(functions))},):\n")
        f.write("        f(1)\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9, help="fresh processes of each kind (default 9)")
    args = ap.parse_args()
    py = sys.executable
    print(f"Python {platform.python_version()} ({platform.python_implementation()}), "
          f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs; {args.repeats} repeats")
    print()
    with tempfile.TemporaryDirectory() as tmp:
        ocl = os.path.join(tmp, "run.ocl")
        kinds = ("never", "other", "recorded")
        times: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
        for i in range(args.repeats):
            # Alternated, in both orders: a slow moment of the machine, or being first, hits every kind.
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                r = subprocess.run([py, "-c", LOOP_CHILD, kind, ocl], capture_output=True, text=True, check=True)
                for loop, ns in json.loads(r.stdout).items():
                    times[kind].setdefault(loop, []).append(ns)
        names = {"calls": "calls of a tiny function", "arith": "arithmetic loop"}
        print("ns per iteration; A: a process that never recorded; B: after stop() of a recording of other code;")
        print("C: after stop() of a default-mode recording of this loop")
        print(f"{'':<26} {'A':>7} {'B':>7} {'C':>7} {'C/A':>7} {'C/B':>7}")
        for loop, name in names.items():
            a, b, c = (statistics.median(times[k][loop]) for k in kinds)
            print(f"{name:<26} {a:>7.1f} {b:>7.1f} {c:>7.1f} {c / a:>6.2f}x {c / b:>6.2f}x")
        if subprocess.run([py, "-c", "import coverage"], capture_output=True).returncode != 0:
            print("\n(coverage.py not installed: no second table)")
            return 0
        gen_module(os.path.join(tmp, "gen.py"))
        env = {**os.environ, "COVERAGE_CORE": "sysmon"}
        out = {}
        for mode in ("never", "recorded"):
            r = subprocess.run([py, "-c", COV_CHILD, ocl, tmp, mode], capture_output=True, text=True, env=env,
                               check=True)
            out[mode] = json.loads(r.stdout)
        rec = out["recorded"]
        print()
        print(f"coverage.py {coverage_version(py)} (sysmon core) across a default-mode recording, passes over "
              f"a module of {rec['statements']} statements (200 functions):")
        print(f"{'pass':<52} {'callbacks':>10} {'ms':>8}")
        for name, n, ms in rec["rows"]:
            print(f"{name:<52} {n:>10,} {ms:>8.2f}")
        same = rec["statements"] == out["never"]["statements"] and rec["missing"] == out["never"]["missing"]
        print(f"report equal to a process that never recorded: {'yes' if same else 'NO'} "
              f"({rec['statements']} statements, {len(rec['missing'])} missing)")
    return 0


def coverage_version(py: str) -> str:
    r = subprocess.run([py, "-c", "import coverage; print(coverage.__version__)"], capture_output=True, text=True)
    return r.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
