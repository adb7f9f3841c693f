"""What following child processes costs (python -m ocular run, FORMAT.md 10).

    make bench-follow     (or: PY bench/follow.py [--repeats N])

1. A process pool program: multiprocessing.Pool(4), fork and spawn start methods, 40 tasks of 30,000 calls
   each. Wall time of the whole program untraced, recorded by Ocular without following (--no-follow: the
   parent only), following (the default), and by trace0, which follows subprocesses by default (when it is
   installed), the runs alternated and the median taken.
2. What a child costs its parent: the latency of os.fork() (fork, the child exits at once, waitpid) and of
   starting a Python (subprocess.run of `python -c pass`), untraced, recorded without following, and
   following. The parent's own time in os.fork() is measured apart from the wait.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

POOL = """
import multiprocessing as mp, sys
def leaf(x):
    return x + 1
def task(n):
    s = 0
    for _ in range(n):
        s = leaf(s)
    return s
if __name__ == "__main__":
    with mp.get_context(sys.argv[1]).Pool(4) as pool:
        print(sum(pool.map(task, [30_000] * 40, chunksize=1)))
"""

LATENCY = """
import os, statistics, subprocess, sys, time
n = int(sys.argv[1])
fork_call, fork_total, spawn = [], [], []
for _ in range(n):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    t1 = time.perf_counter()
    os.waitpid(pid, 0)
    t2 = time.perf_counter()
    fork_call.append(t1 - t0)
    fork_total.append(t2 - t0)
for _ in range(max(3, n // 10)):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    spawn.append(time.perf_counter() - t0)
print(statistics.median(fork_call) * 1e6, statistics.median(fork_total) * 1e3, statistics.median(spawn) * 1e3)
"""


# A run that has not ended by then is reported as such (trace0 with the spawn start method, here).
TIMEOUT = 30


def tools(out: str) -> dict[str, list[str] | None]:
    py = sys.executable
    trace0 = subprocess.run([py, "-c", "import trace0"], capture_output=True).returncode == 0
    return {
        "untraced": [py],
        "ocular --no-follow": [py, "-m", "ocular", "run", "-q", "--no-follow", "-o", out],
        "ocular (follows)": [py, "-m", "ocular", "run", "-q", "-o", out],
        "trace0 (follows)": [py, "-m", "trace0", "run", "-o", out + ".pb"] if trace0 else None,
    }


def clean(out: str) -> None:
    for p in (out, out + ".pb", out + ".children", out + ".pb.d"):
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.exists(p):
            os.remove(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pool = os.path.join(tmp, "pool.py")
        latency = os.path.join(tmp, "latency.py")
        with open(pool, "w") as f:
            f.write(textwrap.dedent(POOL))
        with open(latency, "w") as f:
            f.write(textwrap.dedent(LATENCY))
        out = os.path.join(tmp, "run.ocl")
        ts = {k: v for k, v in tools(out).items() if v is not None}
        print(f"Following child processes, Python {sys.version.split()[0]}, {opts.repeats} repeats, medians "
              f"(runs alternated)\n")
        print("| program | " + " | ".join(ts) + " |")
        print("|---|" + "---:|" * len(ts))
        for method in ("fork", "spawn"):
            times: dict[str, list[float]] = {k: [] for k in ts}
            hung: set[str] = set()
            for _ in range(opts.repeats):
                for name, cmd in ts.items():
                    if name in hung:
                        continue
                    clean(out)
                    t = time.perf_counter()
                    # In a session of its own: a run that hangs is killed with every process it started
                    # (trace0's spawn workers spun on, and disturbed every later measurement).
                    p = subprocess.Popen([*cmd, pool, method], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, cwd=tmp, start_new_session=True)
                    try:
                        stdout, stderr = p.communicate(timeout=TIMEOUT)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.communicate()
                        hung.add(name)
                        continue
                    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
                    times[name].append(time.perf_counter() - t)
                    if r.returncode != 0 or r.stdout.strip() != str(40 * 30_000):
                        raise SystemExit(f"{name} {method}: {r.returncode} {r.stdout!r} {r.stderr[-500:]}")
            base = statistics.median(times["untraced"])
            cells = [f"did not end within {TIMEOUT} s" if k in hung else
                     f"{statistics.median(v):.2f} s ({statistics.median(v) / base:.2f}x)" for k, v in times.items()]
            print(f"| Pool(4), {method}, 1.2M calls | " + " | ".join(cells) + " |")
        lat = {k: [] for k in ts if k != "trace0 (follows)"}
        for _ in range(opts.repeats):
            for name in lat:
                clean(out)
                r = subprocess.run([*ts[name], latency, "50"], capture_output=True, text=True, cwd=tmp)
                if r.returncode != 0:
                    raise SystemExit(f"{name}: {r.stderr[-500:]}")
                lat[name].append([float(x) for x in r.stdout.split()])
        print("\nWhat a child costs: os.fork() in the parent (the call), fork to the child's exit (waitpid), and "
              "subprocess.run of `python -c pass`, medians\n")
        print("| | " + " | ".join(lat) + " |")
        print("|---|" + "---:|" * len(lat))
        rows = [("os.fork() call, us", 0, "{:.0f}"), ("fork + child exit + waitpid, ms", 1, "{:.2f}"),
                ("a Python subprocess, ms", 2, "{:.1f}")]
        for label, i, fmt in rows:
            cells = [fmt.format(statistics.median(v[i] for v in runs)) for runs in lat.values()]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
