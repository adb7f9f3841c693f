"""Ways a trace can be lost, each tried on a program whose truth is known by construction: it calls
`f` exactly N times (in calls mode every call is a PY_START of `f` in the trace), then ends its own way.
Prints a table: calls made, calls in the trace, events the trace says were lost, and what else it says.

    make stress            (or: PYTHON bench/stress.py [--calls N])

Not part of `make test`: it measures, it does not pass or fail. A row with fewer calls recorded than made
and nothing counted as lost is a silent loss.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap

from ocular import _ocular

PRELUDE = """
import os, sys, threading, signal
def f():
    return 1
N = int(sys.argv[1])
"""

# name -> (program body after the prelude, calls of f it makes given N, what the case is)
CASES = {
    "normal exit": ("for _ in range(N): f()\n", lambda n: n),
    "100 live threads": (textwrap.dedent("""
        b = threading.Barrier(100)
        def work():
            b.wait()
            for _ in range(N // 100): f()
            b.wait()
        ts = [threading.Thread(target=work) for _ in range(100)]
        for t in ts: t.start()
        for t in ts: t.join()
        """), lambda n: n // 100 * 100),
    "SIGTERM, non-daemon thread": (textwrap.dedent("""
        threading.Thread(target=threading.Event().wait, args=(30,)).start()
        for _ in range(N): f()
        os.kill(os.getpid(), signal.SIGTERM)
        """), lambda n: n),
    "SIGKILL": ("for _ in range(N): f()\nos.kill(os.getpid(), signal.SIGKILL)\n", lambda n: n),
    "SIGKILL, 4 threads": (textwrap.dedent("""
        b = threading.Barrier(5)
        def work():
            for _ in range(N // 4): f()
            b.wait()
            threading.Event().wait()
        for _ in range(4):
            threading.Thread(target=work, daemon=True).start()
        b.wait()
        os.kill(os.getpid(), signal.SIGKILL)
        """), lambda n: n // 4 * 4),
    "segfault": ("import ctypes\nfor _ in range(N): f()\nctypes.string_at(0)\n", lambda n: n),
    "os._exit": ("for _ in range(N): f()\nos._exit(3)\n", lambda n: n),
    "os.execv": ("for _ in range(N): f()\nos.execv('/bin/true', ['true'])\n", lambda n: n),
    "fork (parent's calls)": (textwrap.dedent("""
        pid = os.fork()
        if pid == 0:
            for _ in range(1000): f()
            os._exit(0)
        os.waitpid(pid, 0)
        for _ in range(N): f()
        """), lambda n: n),
}


def count(path: str) -> tuple[int, int, str]:
    """Calls of `f` in the trace, events counted as lost, and the reader's verdict."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return 0, 0, "no file"
    try:
        d = _ocular.read(path, True)
    except Exception as e:  # noqa: BLE001 - the table reports whatever the reader says
        return 0, 0, f"unreadable: {str(e)[:60]}"
    ids = {i for i, (name, *_rest) in d["code"].items() if name == "f"}
    calls = sum(1 for e in d["events"] if e[2] == "PY_START" and e[3] in ids)
    lost = sum(l[1] for l in d["lost"]) if d["lost"] else 0
    if d["clean"]:
        verdict = "closed cleanly"
    elif d.get("trailer") is None and any("recovered" in w for w in d["warnings"]):
        verdict = "no trailer; completed from its ring file"
    elif d.get("trailer") is None:
        verdict = "no trailer (read to its last whole chunk)"
    else:
        verdict = "damaged"
    return calls, lost, verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200_000, help="calls of f per case (default 200,000)")
    args = ap.parse_args()
    print(f"# Python {platform.python_version()}, {platform.machine()}, calls mode, {args.calls:,} calls per case\n")
    print("| case | exit | calls made | calls in the trace | lost (counted) | missing, not counted | trace |")
    print("|---|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (body, made) in CASES.items():
            script = os.path.join(tmp, "prog.py")
            with open(script, "w") as fh:
                fh.write(PRELUDE + body)
            out = os.path.join(tmp, "t.ocl")
            if os.path.exists(out):
                os.remove(out)
            r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "--mode", "calls", "-o", out, script,
                                str(args.calls)], capture_output=True, text=True, timeout=120)
            code = f"signal {-r.returncode}" if r.returncode < 0 else str(r.returncode)
            n = made(args.calls)
            calls, lost, verdict = count(out)
            print(f"| {name} | {code} | {n:,} | {calls:,} | {lost:,} | {max(0, n - calls):,} | {verdict} |")
        # Two recordings to one path: the second is refused, the first stays whole.
        script = os.path.join(tmp, "slow.py")
        with open(script, "w") as fh:
            fh.write(PRELUDE + "import time\nfor _ in range(N): f()\ntime.sleep(1)\n")
        out = os.path.join(tmp, "same.ocl")
        cmd = [sys.executable, "-m", "ocular", "run", "-q", "--mode", "calls", "-o", out, script, str(args.calls)]
        first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        import time

        time.sleep(0.5)
        second = subprocess.run(cmd, capture_output=True, text=True)
        first.wait()
        calls, lost, verdict = count(out)
        refused = "refused" if "another recording" in second.stderr else f"exit {second.returncode}"
        print(f"| same path twice (second {refused}) | {first.returncode} | {args.calls:,} | {calls:,} | {lost:,} | "
              f"{max(0, args.calls - calls):,} | {verdict} |")


if __name__ == "__main__":
    main()
