"""Where each nanosecond goes: Ocular's `calls` mode beside trace0 on one real program, per event.

    make bench-breakdown     (or: PY bench/peer_breakdown.py [--repeats N] [SCRIPT [ARGS]])

Both tools record every call boundary through `sys.monitoring` (PY_START, PY_RETURN, PY_YIELD, PY_RESUME,
PY_THROW, PY_UNWIND), the same events. Each row is a fresh process running the same program (default:
bench/programs/sqlglot_identity.py, trace0's headline workload), interleaved in a shuffled order every
repeat; figures are medians over repeats of each row's difference from the untraced run of the same repeat.

Rows, each adding one thing to the row above (the second dispatch row instead calls the same no-op another way):
- untraced: the program alone.
- dispatch: a native `METH_FASTCALL` callback that returns at once, on the same events: what CPython's
  instrumented bytecode and callback call cost, paid by any tool on `sys.monitoring` whose callbacks are
  built-in functions (trace0's, and the floor's).
- dispatch as Ocular's callbacks are called: the same no-op as an object CPython calls through its vectorcall
  pointer, without the built-in function's layer (thread state lookup, keyword and recursion checks).
- clock + store (the floor): the callback also reads the TSC and stores a 24-byte record.
- Ocular in process: `ocular.record(mode="calls")` around the program (its callbacks, buffers, code
  objects at first sight, the writer thread compressing beside the program, the stop).
- Ocular CLI: `ocular run --mode calls`, as a user runs it (plus importing Ocular, the clock's calibration,
  compiling the script, the summary).
- trace0: `trace0 run` (its own CLI).

Per event = (row's time - untraced) / events (the file's count). The program's own time runs from its first
line to its last (the recording running, its start and stop outside it); process CPU is user + system time
of all threads (a tool's writer thread included) from spawn to exit; wall is spawn to exit. The fixed costs:
spawn to the program's first line (importing the tool, starting it), and its last line to the process's exit
(the stop: flushing, the code objects' snapshot, writing the file).
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "bench", "programs", "sqlglot_identity.py")
TOOL = 4


def child(kind: str, out: str, argv: list[str]) -> None:
    """Runs argv[0] as __main__ under `kind`, printing to stderr the timestamps of: this function's start,
    the program's first line (the recording started), its end, and the recording's stop."""
    import runpy

    first = time.time()
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    rec = None
    if kind in ("noop", "noop_vectorcall", "floor"):
        from ocular import _ocular
        from ocular._recorder import event_names

        cb = _ocular.bench_callbacks[kind]
        mon = sys.monitoring
        mon.use_tool_id(TOOL, "bench")
        mask = 0
        for n in event_names("calls"):  # the events Ocular's calls mode asks for
            e = getattr(mon.events, n)
            mon.register_callback(TOOL, e, cb)
            mask |= e
        mon.set_events(TOOL, mask)
    elif kind == "inprocess":
        import ocular

        rec = ocular.record(out, mode="calls")
        rec.start()
    started = time.time()
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        ran = time.time()
        if kind in ("noop", "noop_vectorcall", "floor"):
            sys.monitoring.set_events(TOOL, 0)
        if rec is not None:
            rec.stop()
        print(f"ocular-breakdown-stamps {first} {started} {ran} {time.time()}", file=sys.stderr)


def trace0_available() -> bool:
    import importlib.util

    return sys.version_info >= (3, 13) and importlib.util.find_spec("trace0") is not None


def main() -> None:
    import argparse
    import random
    import resource
    import shutil
    import statistics
    import subprocess
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("program", nargs=argparse.REMAINDER, help="script and its arguments (default: sqlglot's fixture)")
    opts = ap.parse_args()
    prog = opts.program or [DEFAULT]
    me = os.path.abspath(__file__)
    tmp = tempfile.mkdtemp(prefix="ocular-breakdown-")
    py = sys.executable
    rows = {
        "untraced": [py, me, "--child", "plain", "-", *prog],
        "dispatch (no-op callback)": [py, me, "--child", "noop", "-", *prog],
        "dispatch as Ocular's callbacks are called": [py, me, "--child", "noop_vectorcall", "-", *prog],
        "clock + store (floor)": [py, me, "--child", "floor", "-", *prog],
        "Ocular in process": [py, me, "--child", "inprocess", os.path.join(tmp, "in.ocl"), *prog],
        "Ocular CLI (ocular run)": [py, "-m", "ocular", "run", "-q", "--mode", "calls", "-o",
                                    os.path.join(tmp, "cli.ocl"), me, "--child", "plain", "-", *prog],
    }
    if trace0_available():
        rows["trace0 (trace0 run)"] = [py, "-m", "trace0", "run", "-o", os.path.join(tmp, "t.pb"),
                                       "--no-trace-subprocesses", me, "--child", "plain", "-", *prog]
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the tools' own modules from their cached bytecode, as users run
    # (wall, CPU, spawn to the program's first line, the program, its last line to exit)
    runs: dict[str, list[tuple[float, float, float, float, float]]] = {k: [] for k in rows}
    for r in range(opts.repeats + 1):  # the first repeat warms the page cache and compiles bytecode
        order = list(rows)
        random.shuffle(order)
        for k in order:
            u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            p = subprocess.run(rows[k], env=env, capture_output=True, text=True)
            t1 = time.time()
            u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode != 0:
                sys.exit(f"{k} failed ({p.returncode}):\n{p.stderr[-2000:]}")
            line = [x for x in p.stderr.splitlines() if x.startswith("ocular-breakdown-stamps")][-1]
            _, started, ran, _ = (float(x) for x in line.split()[1:])
            cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
            if r:
                runs[k].append((t1 - t0, cpu, started - t0, ran - started, t1 - ran))
        print(f"repeat {r} of {opts.repeats} done", file=sys.stderr, flush=True)
    events = events_of(os.path.join(tmp, "in.ocl"))
    sizes = {k: os.path.getsize(os.path.join(tmp, f)) for k, f in (("Ocular", "cli.ocl"), ("trace0", "t.pb"))
             if os.path.exists(os.path.join(tmp, f))}
    shutil.rmtree(tmp, ignore_errors=True)
    base = runs["untraced"]
    med = statistics.median
    print(f"Program: {' '.join(os.path.relpath(x, ROOT) if x.startswith(ROOT) else x for x in prog)}; "
          f"CPython {sys.version.split()[0]}; {opts.repeats} interleaved repeats, fresh processes; "
          f"{events:,} events (Ocular's count; trace0 records the same calls)")
    print()
    print("| row | wall s | slowdown | the program's own time: ns/event over untraced | process CPU: ns/event "
          "over untraced | spawn to first line, ms | last line to exit, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, xs in runs.items():
        wall = med(x[0] for x in xs)
        slow = med(x[0] / b[0] for x, b in zip(xs, base))
        own = med((x[3] - b[3]) for x, b in zip(xs, base)) / events * 1e9
        cpu = med((x[1] - b[1]) for x, b in zip(xs, base)) / events * 1e9
        first, last = med(x[2] for x in xs) * 1e3, med(x[4] for x in xs) * 1e3
        cells = ("-", "-") if k == "untraced" else (f"{own:.1f}", f"{cpu:.1f}")
        print(f"| {k} | {wall:.3f} | {slow:.3f}x | {cells[0]} | {cells[1]} | {first:.0f} | {last:.0f} |")
    print()
    print("Output: " + ", ".join(f"{k} {n / 1e6:.1f} MB ({n / events:.2f} bytes/event)" for k, n in sizes.items()))


def events_of(path: str) -> int:
    import ocular

    return int(ocular.load(path).info()["events"])


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
