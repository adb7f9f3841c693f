"""What no trace's figures may ever say, whatever the program and however the run went: checked on every
trace the test suite records (the `ocl` fixture), and on the known-truth programs' traces.

- No function's exclusive time above its inclusive time.
- No function's inclusive time above its thread's wall time (merged over threads: above the threads' wall
  time added up): a function cannot run longer than the run.
- No loop's total time above its function's inclusive time (recursion counted once in both).
- Intervals where estimates are, and only there: an exact figure has none (0), an estimated count or time
  a non-negative one, and no estimated count below the calls recorded.
- The lines view places at most the run's time: no line's time with its callees, and not all lines' own
  times together, above the threads' wall time; a line's own time within its time with callees.
- No per-iteration cost that was not measured: a loop's time per iteration is above 0 or null (nothing
  measured), in `hot` and in `diff` (here of the trace against itself, which must also find nothing changed).

A small tolerance (2% and 1 ms) allows for the estimates' own rounding; an impossible figure is well past
it (the ones found so far were 105-125% of the wall time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

TOLERANCE = 1.02
SLACK_MS = 1.0
# The test suite's analyzer is a debug build: traces above this (a few stress tests' tens of millions of
# events) would each take it tens of seconds, and are checked by the tests that make them.
MAX_BYTES = 4 << 20
# The lines view and a diff are two more passes each: on traces up to this size (most of the suite's).
MAX_BYTES_MORE = 1 << 20
RELEASE_ABOVE = 48 << 10


def _json(analyze: str, *args: str, size: int = 0):
    # The suite's analyzer is a debug build, 5-10x slower than the release one compiled into the extension
    # (the same code and parser): past a few tens of kilobytes, the extension's start (~40 ms) is the cheaper.
    command = [sys.executable, "-m", "ocular"] if size > RELEASE_ABOVE else [analyze]
    out = subprocess.run([*command, *args, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def describe(path: str, analyze: str | None = None) -> str:
    """`info` of the trace at `path` (its duration, threads, losses, pauses, calibration): what a figure
    found impossible can be traced back to."""
    analyze = analyze or os.environ.get("OCULAR_ANALYZE")
    if not analyze:
        return ""
    info = subprocess.run([analyze, "info", path], capture_output=True, text=True)
    return f"{path}:\n{info.stdout}{info.stderr}"


def violations(path: str, analyze: str | None = None) -> list[str]:
    """The invariants `path`'s figures break (empty: none). A file the analyzer cannot read is no trace to
    check (tests of damaged files make those on purpose)."""
    analyze = analyze or os.environ.get("OCULAR_ANALYZE")
    if not analyze or not os.path.exists(path) or os.path.getsize(path) > MAX_BYTES:
        return []
    size = os.path.getsize(path)
    rows = _json(analyze, "stats", path, "--top", "1000000", size=size)
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
        cis = (r["calls_ci95"], r["inclusive_ci95_ms"], r["exclusive_ci95_ms"])
        if min(cis) < 0:
            bad.append(f"{name}: a negative interval {cis}")
        if not r["estimated"] and r["inclusive_ci95_ms"] < r["exclusive_ci95_ms"] - SLACK_MS:
            # Outside windows a time's interval is the recorder's cost taken out of it, which a function's
            # callees only add to.
            bad.append(f"{name}: exclusive time's interval above the inclusive's {cis}")
        if not r["calls_estimated"] and r["calls_ci95"]:
            bad.append(f"{name}: an exact count with an interval ±{r['calls_ci95']}")
        if r["calls"] < r["observed_calls"]:
            bad.append(f"{name}: {r['calls']} calls, fewer than the {r['observed_calls']} recorded")
    wall = max((r["wall_ms"] * max(r.get("threads", 1), 1) for r in rows), default=0.0)
    more = os.path.getsize(path) <= MAX_BYTES_MORE
    lines = _json(analyze, "stats", path, "--lines", "--top", "1000000", size=size) if more else None
    if rows and isinstance(lines, list):
        own = sum(x["own_ms"] for x in lines)
        if own > wall * TOLERANCE + SLACK_MS:
            bad.append(f"lines: {own:.3f} ms placed in all, above the wall time of the threads, {wall:.3f} ms")
        for x in lines:
            where = f"line {x['line']} of {x['function']} ({x['file']})"
            if x["with_callees_ms"] > wall * TOLERANCE + SLACK_MS:
                bad.append(f"{where}: {x['with_callees_ms']:.3f} ms with callees, above {wall:.3f} ms")
            if x["own_ms"] > x["with_callees_ms"] * TOLERANCE + SLACK_MS:
                bad.append(f"{where}: own {x['own_ms']:.3f} ms above {x['with_callees_ms']:.3f} ms with callees")
    hot = _json(analyze, "hot", path, "--top", "1000000", size=size)
    for loop in (hot or {}).get("loops", []):
        key = (loop["function"], loop["file"], loop["first_line"])
        total = loop.get("total_ns", 0) / 1e6
        # A loop's first line is its function's only when the loop opens it: look the function up by name
        # and file, the way `hot` names it.
        incl = max((v for (f, fi, _), v in inclusive.items() if f == key[0] and fi == key[1]), default=None)
        if incl is not None and total > incl * TOLERANCE + SLACK_MS:
            bad.append(f"loop of {key[0]} at line {key[2]}: {total:.3f} ms, above its function's {incl:.3f} ms")
        if loop["iterations"] > 0 and loop["ns_per_iteration"] is not None and loop["ns_per_iteration"] <= 0:
            bad.append(f"loop of {key[0]} at line {key[2]}: {loop['ns_per_iteration']} ns per iteration over "
                       f"{loop['iterations']} iterations")
    # Only where there are loops to compare (its functions are stats' rows, checked above).
    diff = _json(analyze, "diff", path, path, size=size) if more and (hot or {}).get("loops") else None
    for loop in (diff or {}).get("loops", []):
        for side in ("before", "after"):
            n, ns = loop[f"iterations_{side}"], loop[f"ns_per_iteration_{side}"]
            if n and ns is not None and ns <= 0:
                bad.append(f"diff: loop of {loop['function']} at line {loop[f'line_{side}']}: {ns} ns per "
                           f"iteration {side} over {n} iterations")
    for f in (diff or {}).get("functions", []):
        if f["calls_before"] != f["calls_after"] or f["exclusive_ms_change"] != 0:
            bad.append(f"diff of the trace with itself: {f['function']} changed ({f})")
    if diff and (diff.get("new_functions") or diff.get("vanished_functions")):
        bad.append("diff of the trace with itself: functions new or vanished")
    return bad
