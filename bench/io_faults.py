"""I/O faults during a recording: the program calls `f` N times (its truth), and the trace's writes fail in
each way a user's machine makes them fail. Files are limited with RLIMIT_FSIZE (the kernel fails the write
that crosses the limit, part of it written, as a full disk does); a real full tmpfs is tried too when this
user may mount one.

    make stress            (or: PYTHON bench/io_faults.py [--calls N])

Per case: whether the program ran to its end, the warnings it got, whether the trace reads as closed, the
events in it, the events it counts as lost, and the events missing that nothing counts (must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap

PROGRAM = textwrap.dedent("""
    import os, resource, signal, sys, warnings, ocular
    out, limit, n, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    def f(x):
        return x + 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opts = {"mode": "calls"} if how != "default" else {}
        if how.startswith("flight"):
            opts["ring"] = "8MB"
        with ocular.record(out, **opts) as rec:
            # After the start: the ring file lives in memory (a full disk does not touch it), and is made
            # at the start at its full (sparse) size.
            if limit and how != "flight dump":
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            for i in range(n):
                f(i)
                if how == "deleted" and i == n // 2:
                    os.remove(out)
                if how == "unwritable directory" and i == n // 2:
                    os.chmod(os.path.dirname(out), 0o500)
            if how == "flight dump":
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
                try:
                    rec.dump(wait=True)
                except OSError as e:
                    print("DUMP", e)
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("RAN TO ITS END")
    for x in w:
        print("WARNING", str(x.message)[:160])
""")

# name -> (file size limit in bytes (0: none), how)
CASES = {
    "disk fills (calls mode)": (300_000, "calls"),
    "disk fills (default mode)": (12_000, "default"),
    "flight recorder: the trace at the stop": (60_000, "flight"),
    "flight recorder: a dump": (60_000, "flight dump"),
    "trace deleted while written": (0, "deleted"),
    "output directory made read-only": (0, "unwritable directory"),
}


def info(path: str) -> dict | None:
    r = subprocess.run([sys.executable, "-m", "ocular", "info", "--json", path], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


def row(name: str, r: subprocess.CompletedProcess, out: str, calls: int, how: str) -> str:
    ran = "yes" if "RAN TO ITS END" in r.stdout else f"no (exit {r.returncode})"
    warns = [line[8:] for line in r.stdout.splitlines() if line.startswith(("WARNING", "DUMP"))]
    d = info(out) if os.path.exists(out) else None
    if d is None:
        return f"| {name} | {ran} | {len(warns)} | no trace | | | |"
    events, lost = d["events"], d["lost_events"]
    # Default mode records calls in windows only: there the events are not the calls' count.
    silent = "n/a (sampled)" if how == "default" else f"{max(0, 2 * calls - events - lost):,}"
    closed = "closed" if d["closed_cleanly"] else "read from its ring" if "ring file" in r.stdout else "not closed"
    said = "; ".join(w[:90] for w in warns)
    return f"| {name} | {ran} | {len(warns)}: {said} | {closed} | {events:,} | {lost:,} | {silent} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    args = ap.parse_args()
    print(f"# I/O faults: Python {platform.python_version()}, {args.calls:,} calls of f per case\n")
    print("| fault | program ran to its end | warnings | trace | events in it | counted lost | missing, not "
          "counted |")
    print("|---|---|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "prog.py")
        with open(script, "w") as fh:
            fh.write(PROGRAM)
        run_dir = os.path.join(tmp, "run")
        os.mkdir(run_dir, 0o700)
        env = {**os.environ, "XDG_RUNTIME_DIR": run_dir}
        for name, (limit, how) in CASES.items():
            d = tempfile.mkdtemp(dir=tmp)
            out = os.path.join(d, "t.ocl")
            r = subprocess.run([sys.executable, script, out, str(limit), str(args.calls), how], capture_output=True,
                               text=True, env=env, timeout=300)
            os.chmod(d, 0o700)
            print(row(name, r, out, args.calls, how))
        # A real full file system, where this user may mount one.
        mnt = os.path.join(tmp, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True).returncode == 0:
            try:
                with open(os.path.join(mnt, "filler"), "wb") as fh:
                    fh.write(os.urandom(800_000))
                out = os.path.join(mnt, "t.ocl")
                r = subprocess.run([sys.executable, script, out, "0", str(args.calls * 3), "calls"], capture_output=True,
                                   text=True, env=env, timeout=300)
                print(row("tmpfs of 1 MiB fills (calls mode)", r, out, args.calls * 3, "calls"))
            finally:
                subprocess.run(["umount", mnt], check=False)
        else:
            print("| tmpfs fills | (cannot mount a tmpfs here) | | | | | |")
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
