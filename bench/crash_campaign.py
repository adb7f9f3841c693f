"""A crash campaign: a program doing real work (json, regular expressions, hashing) on its main thread and
four more, recorded in each way Ocular records, killed with SIGKILL at a random moment, hundreds of times
with a fixed seed. The program counts its own calls of `f` per thread in a shared file as it goes (the
truth at the moment of the kill); after each kill every command reads the trace.

    make stress            (or: PYTHON bench/crash_campaign.py [--runs N] [--seed S])

Per run, for each thread, the calls of `f` in the trace against the calls the program had made:

- calls mode and the live reader's run: every call made is in the trace (the ring file holds what the
  writer had not written), give or take the one being made at the kill;
- a flight recorder: the trace holds the newest calls, and those it overwrote are counted as dropped;
- the default mode: calls outside windows are sampled, so only "nothing invented" is checked (no more
  calls in the trace than were made), and that every command reads it;
- with a child process: the parent's figures as above; the child's trace is read by every command too.

A run "lost events" when a thread's trace misses calls that were made and that the trace does not count
as lost or dropped. A reader crash is a command that panicked, died of a signal or exited with anything but
0 or a clear error (2). Prints the table; exits 1 if any run lost events silently or any reader crashed.
"""

from __future__ import annotations

import argparse
import collections
import mmap
import os
import platform
import random
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

from ocular import _ocular

THREADS = 5  # the main thread and 4 workers
PROGRAM = textwrap.dedent("""
    import hashlib, json, mmap, os, re, subprocess, sys, threading
    fd = os.open(sys.argv[1], os.O_RDWR)
    counts = memoryview(mmap.mmap(fd, 64)).cast("Q")
    WORDS = re.compile(r"[a-z]+")
    def f(x):
        return x * 2 + 1
    def work(k):
        i = 0
        while True:
            f(i)
            i += 1
            counts[k] = i
            if i % 64 == 0:
                json.loads(json.dumps({"i": i, "xs": list(range(40))}))
                WORDS.findall("the quick brown fox jumps over the lazy dog")
                hashlib.sha256(b"x" * 4096).digest()
    for k in range(1, 5):
        threading.Thread(target=work, args=(k,), name=f"w{k}", daemon=True).start()
    if sys.argv[2] == "1":
        # A Python child, recorded too (Ocular follows children by default).
        subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: sum(range(1000)); time.sleep(0.001)"])
    work(0)
""")

# name -> extra arguments of `ocular run`, whether a live reader follows, whether a child is started
CONFIGS = {
    "calls": (["--mode", "calls"], False, False),
    "default": ([], False, False),
    "flight recorder": (["--mode", "calls", "--ring", "3MB"], False, False),
    "calls, live reader": (["--mode", "calls", "--live"], True, False),
    "default, child": ([], False, True),
}
COMMANDS = [["info"], ["stats"], ["hot"], ["report", "-o", "{out}.html"], ["export", "--perfetto", "-o", "{out}.json"]]

READER = textwrap.dedent("""
    import sys, time, ocular
    pid = int(sys.argv[1])
    for _ in range(200):
        try:
            c = ocular.attach(pid)
            break
        except Exception:
            time.sleep(0.01)
    else:
        sys.exit(3)
    n = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        p = c.poll()
        n += p.count
        if p.ended:
            break
        time.sleep(0.005)
    print(n)
""")


def calls_in(path: str) -> tuple[dict[str, int], dict[str, int], dict[str, int], str]:
    """Per thread name: calls of `f` in the trace (PY_START, plus COUNT in the default mode), events the
    trace counts as lost, events it counts as dropped (a flight recorder's); and the reader's verdict."""
    d = _ocular.read(path, False)
    ids = {i for i, (name, *_rest) in d["code"].items() if name == "f"}
    names = d["threads"]
    calls: dict[str, int] = collections.Counter()
    for tid, _t, kind, cid, _off, _arg in d["events"]:
        if cid in ids and kind in ("PY_START", "COUNT"):
            calls[names.get(tid, str(tid))] += 1
    lost: dict[str, int] = collections.Counter()
    for tid, n, *_ in d["lost"] or []:
        lost[names.get(tid, str(tid))] += n
    dropped: dict[str, int] = collections.Counter()
    for tid, n, *_ in d["dropped"] or []:
        dropped[names.get(tid, str(tid))] += n
    verdict = "clean" if d["clean"] else "recovered" if any("recovered" in w for w in d["warnings"]) else "partial"
    return calls, lost, dropped, verdict


def read_all(path: str, tmp: str) -> list[str]:
    """Every command on the trace: the ones that crashed (panic, signal, unexpected exit code)."""
    crashed = []
    for cmd in COMMANDS:
        args = [a.format(out=os.path.join(tmp, "out")) for a in cmd]
        r = subprocess.run([sys.executable, "-m", "ocular", args[0], path, *args[1:]], capture_output=True,
                           text=True, timeout=300)
        if r.returncode not in (0, 2) or "panicked" in r.stderr or (r.returncode == 2 and "error" not in r.stderr):
            crashed.append(f"{args[0]}: exit {r.returncode}: {r.stderr.strip()[-200:]}")
    return crashed


def one_run(tmp: str, config: str, at: float) -> dict:
    extra, live, child = CONFIGS[config]
    side = os.path.join(tmp, "counts")
    with open(side, "wb") as fh:
        fh.write(b"\0" * 64)
    script = os.path.join(tmp, "work.py")
    out = os.path.join(tmp, "t.ocl")
    for p in (out,):
        if os.path.exists(p):
            os.remove(p)
    subprocess.run(["rm", "-rf", out + ".children"], check=False)
    prog = subprocess.Popen([sys.executable, "-m", "ocular", "run", "-q", "-o", out, *extra, script, side,
                             "1" if child else "0"], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    reader = None
    if live:
        reader = subprocess.Popen([sys.executable, "-c", READER, str(prog.pid)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    time.sleep(at)
    with open(side, "rb") as fh:
        before = struct.unpack("8Q", fh.read(64))
    os.killpg(prog.pid, signal.SIGKILL)
    prog.wait()
    with open(side, "rb") as fh:
        made = struct.unpack("8Q", fh.read(64))
    row = {"config": config, "at": at, "crashed": [], "silent": 0, "invented": 0, "verdict": "", "made": 0,
           "in trace": 0, "counted": 0, "reader": ""}
    if reader is not None:
        try:
            o, e = reader.communicate(timeout=60)
            row["reader"] = "ok" if reader.returncode == 0 else f"exit {reader.returncode}: {e.strip()[-200:]}"
            if reader.returncode not in (0, 3):
                row["crashed"].append(f"live reader: {row['reader']}")
        except subprocess.TimeoutExpired:
            reader.kill()
            row["crashed"].append("live reader hung after the kill")
    if not os.path.exists(out):
        row["verdict"] = "no trace"
        if sum(made) > 0 and sum(before) > 0:
            row["silent"] = sum(made)
        return row
    try:
        calls, lost, dropped, verdict = calls_in(out)
    except Exception as e:  # noqa: BLE001 - a reader error is what the campaign is for
        row["crashed"].append(f"read: {e}")
        return row
    row["verdict"] = verdict
    names = ["MainThread", "w1", "w2", "w3", "w4"]
    sampled = not extra or "--mode" not in extra
    for k, name in enumerate(names):
        n = made[k]
        got = calls.get(name, 0)
        row["made"] += n
        row["in trace"] += got
        row["counted"] += lost.get(name, 0) + dropped.get(name, 0)
        # The call being made at the kill may or may not be in the trace.
        if got > n + 1:
            row["invented"] += got - n - 1
        if not sampled:
            missing = n - got - lost.get(name, 0) - dropped.get(name, 0)
            if missing > 1:
                row["silent"] += missing
    row["crashed"] += read_all(out, tmp)
    for c in sorted(os.listdir(out + ".children")) if os.path.isdir(out + ".children") else []:
        row["crashed"] += [f"child {c}: {x}" for x in read_all(os.path.join(out + ".children", c), tmp)]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="kills in all, spread over the configurations")
    ap.add_argument("--seed", type=int, default=20261127)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"# crash campaign: Python {platform.python_version()}, {args.runs} SIGKILLs at random moments "
          f"(0.05-1.5 s after the start), seed {args.seed}\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "work.py")
        with open(script, "w") as fh:
            fh.write(PROGRAM)
        configs = list(CONFIGS)
        for i in range(args.runs):
            config = configs[i % len(configs)]
            at = rng.uniform(0.05, 1.5)
            rows.append(one_run(tmp, config, at))
            if (i + 1) % 25 == 0:
                print(f"  ... {i + 1} of {args.runs}", file=sys.stderr)
    print("| recording | runs | traces read | calls made | calls in the trace | counted lost or dropped | "
          "lost silently | invented | reader crashes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    bad = False
    for config in CONFIGS:
        rs = [r for r in rows if r["config"] == config]
        if not rs:
            continue
        read = sum(1 for r in rs if r["verdict"] in ("clean", "recovered", "partial"))
        crashes = sum(len(r["crashed"]) for r in rs)
        silent = sum(r["silent"] for r in rs)
        invented = sum(r["invented"] for r in rs)
        bad |= bool(crashes or silent or invented)
        made = sum(r["made"] for r in rs)
        got = sum(r["in trace"] for r in rs)
        counted = sum(r["counted"] for r in rs)
        print(f"| {config} | {len(rs)} | {read} | {made:,} | {got:,} | {counted:,} | {silent:,} | {invented:,} | "
              f"{crashes} |")
    for r in rows:
        for c in r["crashed"]:
            print(f"crash ({r['config']}, killed at {r['at']:.2f} s): {c}")
        if r["silent"]:
            print(f"silent loss ({r['config']}, killed at {r['at']:.2f} s): {r['silent']} calls, trace {r['verdict']}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
