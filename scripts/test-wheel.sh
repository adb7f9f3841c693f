#!/usr/bin/env bash
# Usage: scripts/test-wheel.sh PYTHON
# Builds PYTHON's wheel (scripts/wheels.sh) and installs it as a user would: into a fresh venv, with
# nothing but /usr/bin and /bin on PATH (no Rust toolchain, none of the checkout's venvs), without the
# package index; then records a program with the `ocular` command and analyzes it with `ocular` and
# `ocular-analyze`, checking the program's functions and their exact call counts. Ends with a
# "wheel: N passed, N failed" line.
set -euo pipefail
py="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/wheels.sh" "$py"
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=$(ls -t "$root"/dist/ocular_profiler-*-"$tag-$tag"-*manylinux_2_17_x86_64*.whl | head -n 1)
work=$(mktemp -d "${TMPDIR:-/tmp}/ocular-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
cat >"$work/prog.py" <<'EOF'
import subprocess
import sys


def work(i):
    return i * i


def main():
    total = 0
    for i in range(1234):
        total += work(i)
    print("total", total)
    # A child process: recorded too (ocular/_site/sitecustomize.py, from the wheel, starts its recording).
    subprocess.run([sys.executable, "-c", "def child_work():\n    pass\nfor _ in range(5):\n    child_work()"],
                   check=True)


main()
EOF
cat >"$work/check.py" <<'EOF'
"""The checks, run by the venv's python: each prints "ok: ..." or "FAILED: ...", then a summary line."""
import json
import re
import subprocess
import sys

passed = failed = 0


def run(*args, code=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != code:
        sys.exit(f"FAILED: {' '.join(args)} exited {r.returncode}, not {code}:\n{r.stdout}{r.stderr}")
    return r


def check(what, ok, detail=""):
    global passed, failed
    print(f"{'ok' if ok else 'FAILED'}: {what}" + ("" if ok else f"\n{detail}"))
    passed, failed = passed + ok, failed + (not ok)


check("no cargo or rustc on PATH", subprocess.run(["sh", "-c", "command -v cargo || command -v rustc"],
                                                  capture_output=True).returncode != 0)
r = run("ocular", "--help")
check("ocular --help names itself and the commands",
      "Usage: ocular <COMMAND>" in r.stdout and all(f"  {c} " in r.stdout for c in ("run", "stats", "report")),
      r.stdout)
r = run("ocular-analyze", code=2)
check("ocular-analyze alone prints the analyzer's help", "Usage: ocular-analyze <COMMAND>" in r.stderr, r.stderr)

r = run("ocular", "run", "--mode", "calls", "-o", "calls.ocl", "prog.py")
check("ocular run: the program's output", r.stdout == "total 625599129\n", r.stdout)
check("ocular run: the summary line, with the child process",
      r.stderr.startswith("ocular: wrote calls.ocl: ") and "child process" in r.stderr, r.stderr)
r = run("ocular", "stats", "calls.ocl", "--top", "1000")
row = [line for line in r.stdout.splitlines() if re.search(r"\swork\s+prog\.py:5$", line)]
check("ocular stats: work called 1234 times", len(row) == 1 and row[0].split()[0] == "1234", r.stdout)
rows = json.loads(run("ocular-analyze", "stats", "calls.ocl", "--json", "--top", "1000").stdout)
calls = {x["function"]: x["calls"] for x in rows}
check("ocular-analyze stats --json: work 1234, main 1, the child's child_work 5",
      (calls.get("work"), calls.get("main"), calls.get("child_work")) == (1234, 1, 5), calls)

run("ocular", "run", "-q", "--threshold", "0", "--no-follow", "-o", "loops.ocl", "prog.py")
hot = json.loads(run("ocular-analyze", "hot", "loops.ocl", "--json", "--top", "1000").stdout)
loops = [(x["function"], x["iterations"]) for x in hot["loops"]]
check("ocular-analyze hot --json: main's loop, 1234 iterations", ("main", 1234) in loops, loops)
r = run("ocular", "export", "--parquet", "calls.ocl", code=2)
check("ocular export --parquet without polars says what to install", "pip install polars" in r.stderr, r.stderr)
print(f"wheel: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
# The user's environment: no Rust, no PIP_* settings, no index (the wheel needs nothing from it).
clean=(env -i PATH="$work/venv/bin:/usr/bin:/bin" HOME="$HOME" LANG=C.UTF-8)
cd "$work"
"${clean[@]}" python -m pip install -q --disable-pip-version-check --no-index "$wheel"
echo "== installed $(basename "$wheel") into a fresh venv; PATH=$work/venv/bin:/usr/bin:/bin"
"${clean[@]}" python check.py
