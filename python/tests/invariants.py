"""What no trace's figures may ever say, whatever the program and however the run went: checked on every
trace the test suite records (the `ocl` fixture), and on the known-truth programs' traces.

- No function's exclusive time above its inclusive time.
- No function's inclusive time above its thread's wall time (merged over threads: above the threads' wall
  time added up): a function cannot run longer than the run.
- No loop's total time above its function's inclusive time (recursion counted once in both).

A small tolerance (2% and 1 ms) allows for the estimates' own rounding; an impossible figure is well past
it (the ones found so far were 105-125% of the wall time).
"""

from __future__ import annotations

import json
import os
import subprocess

TOLERANCE = 1.02
SLACK_MS = 1.0
# The test suite's analyzer is a debug build: traces above this (a few stress tests' tens of millions of
# events) would each take it tens of seconds, and are checked by the tests that make them.
MAX_BYTES = 4 << 20


def _json(analyze: str, *args: str):
    out = subprocess.run([analyze, *args, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def violations(path: str, analyze: str | None = None) -> list[str]:
    """The invariants `path`'s figures break (empty: none). A file the analyzer cannot read is no trace to
    check (tests of damaged files make those on purpose)."""
    analyze = analyze or os.environ.get("OCULAR_ANALYZE")
    if not analyze or not os.path.exists(path) or os.path.getsize(path) > MAX_BYTES:
        return []
    rows = _json(analyze, "stats", path, "--top", "1000000")
    if rows is None:
        return []
    bad = []
    inclusive = {}
    for r in rows:
        name = f"{r['function']} ({r['file']}:{r['line']})"
        incl, excl = r["inclusive_ms"], r["exclusive_ms"]
        key = (r["function"], r["file"], r["line"])
        inclusive[key] = max(incl, inclusive.get(key, 0))
        if excl > incl * TOLERANCE + SLACK_MS:
            bad.append(f"{name}: exclusive {excl:.3f} ms above inclusive {incl:.3f} ms")
        limit = r["wall_ms"] * max(r.get("threads", 1), 1)
        if incl > limit * TOLERANCE + SLACK_MS:
            bad.append(f"{name}: inclusive {incl:.3f} ms above the wall time of its threads, {limit:.3f} ms")
    hot = _json(analyze, "hot", path, "--top", "1000000")
    for loop in (hot or {}).get("loops", []):
        key = (loop["function"], loop["file"], loop["first_line"])
        total = loop.get("total_ns", 0) / 1e6
        # A loop's first line is its function's only when the loop opens it: look the function up by name
        # and file, the way `hot` names it.
        incl = max((v for (f, fi, _), v in inclusive.items() if f == key[0] and fi == key[1]), default=None)
        if incl is not None and total > incl * TOLERANCE + SLACK_MS:
            bad.append(f"loop of {key[0]} at line {key[2]}: {total:.3f} ms, above its function's {incl:.3f} ms")
    return bad
