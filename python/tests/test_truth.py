"""The default mode's and the sampled mode's figures against programs whose truth is known by construction.

GIVEN functions of known relative cost, called far more often than the threshold, and a loop followed by a
call; WHEN recorded in the default mode (adaptive, threshold 500: every call, loops thinned out) or sampled
(calls recorded in windows after the first 50,000); THEN the function view and the loop's time agree with
what the program did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ANALYZE = os.environ.get("OCULAR_ANALYZE")
pytestmark = pytest.mark.skipif(not ANALYZE, reason="OCULAR_ANALYZE (the analyzer binary) is not set")

# heavy() runs 4x the iterations of light(), which main() calls twice as often: heavy has 2/3 of their
# exclusive time, light 1/3 (less what a call costs, which the long loops keep small), and main almost none.
# Every iteration costs the same: a float addition, over itertools.repeat (range() would hand the longer
# loop ints above 255, which CPython allocates, and the shorter one cached small ints).
FUNCTIONS = """
import time
from itertools import repeat

def light():
    s = 0.0
    for _ in repeat(None, 100):
        s += 1.5
    return s

def heavy():
    s = 0.0
    for _ in repeat(None, 400):
        s += 1.5
    return s

def main():
    for _ in range(40000):
        heavy()
        light()
        light()

# The share of the run the program had a CPU for: below 1 where other processes took it.
wall, cpu = time.perf_counter(), time.process_time()
main()
print(round((time.process_time() - cpu) / (time.perf_counter() - wall), 3))
"""

# The loop runs in the program's own measurement; the call after it is what the recorder sees next of its
# frame. With `warm` first, a sampled recording's first window has closed when the loop runs (it runs between
# windows); without, it runs inside the first window.
LOOP = """
import sys, time

def g():
    return 1

def warm():
    return 2

def main(warm_first):
    if warm_first:
        for _ in range(60000):  # past the first window's 50,000 calls
            warm()
    t = time.perf_counter()
    s = 0
    for i in range(N):
        s += i * 2
    took = time.perf_counter() - t
    g()
    print(took * 1e3)

main(sys.argv[1] == "warm")
"""


def record(tmp_path, name, source, *args, mode="adaptive", sampled=False):
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    out = tmp_path / f"{name}-{mode}{'-sampled' if sampled else ''}.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "--mode", mode, *(["--sampled"] * sampled),
                        "-o", str(out), str(script), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return str(out), r.stdout


def analyze(*args):
    r = subprocess.run([ANALYZE, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def stats(path):
    return {row["function"]: row for row in json.loads(analyze("stats", path, "--json", "--top", "1000"))}


def test_the_default_counts_functions_called_past_the_threshold_exactly(tmp_path):
    path, _ = record(tmp_path, "functions", FUNCTIONS)
    rows = stats(path)
    heavy, light = rows["heavy"], rows["light"]
    assert (heavy["calls"], light["calls"]) == (40000, 80000), (heavy, light)
    assert not heavy["calls_estimated"] and not light["calls_estimated"]
    share = heavy["exclusive_ms"] / (heavy["exclusive_ms"] + light["exclusive_ms"])
    assert 0.56 <= share <= 0.76, (heavy, light)
    assert "figures marked ~ are estimates" not in analyze("stats", path)


def test_sampled_functions_called_past_the_threshold_keep_their_share_and_say_they_are_estimated(tmp_path):
    # A window in which the program lost its CPU to another process sees fewer calls than its length stands
    # for: counts read low, past their interval (31,499 for 40,000 ±5,760 beside two busy loops on two
    # cores; docs/costs-and-figures.md says so). The interval is checked on a run that had its CPU; after
    # three shared ones, the bound is the one a shared CPU keeps.
    for attempt in range(3):
        path, out = record(tmp_path, "functions", FUNCTIONS, sampled=True)
        cpu_share = float(out.split()[-1])
        if cpu_share >= 0.9:
            break
    rows = stats(path)
    heavy, light, main = rows["heavy"], rows["light"], rows["main"]
    # Calls: 40,000 and 80,000: the first 50,000 calls of the run recorded whole (the first window), the
    # rest estimated from windows.
    assert heavy["calls_estimated"] and light["calls_estimated"]
    # Each within 10% or inside its 95% interval (12% low, inside it, in one run on a busy machine).
    for row, truth in ((heavy, 40000), (light, 80000)):
        bound = max(0.1 * truth, row["calls_ci95"]) if cpu_share >= 0.9 else 0.35 * truth
        assert abs(row["calls"] - truth) <= bound, (row, cpu_share)
    assert heavy["observed_calls"] < heavy["calls"]
    # Time: heavy 2/3 of the two, by construction; nothing of it lands in main, the caller.
    share = heavy["exclusive_ms"] / (heavy["exclusive_ms"] + light["exclusive_ms"])
    assert 0.56 <= share <= 0.76, (heavy, light)
    assert main["exclusive_ms"] < 0.1 * heavy["exclusive_ms"], main
    assert heavy["estimated"] and main["estimated"]
    # main holds the whole run, as its inclusive time.
    assert main["inclusive_ms"] >= 0.9 * (heavy["exclusive_ms"] + light["exclusive_ms"])
    # The text marks every estimate and says what part of the run they come from.
    text = analyze("stats", path)
    assert any(line.lstrip().startswith("~") and "heavy" in line for line in text.splitlines()), text
    assert "figures marked ~ are estimates" in text


def test_calls_mode_counts_exactly_and_its_times_carry_the_recorder_s_cost_as_their_interval(tmp_path):
    path, _ = record(tmp_path, "functions", FUNCTIONS, mode="calls")
    rows = stats(path)
    assert (rows["heavy"]["calls"], rows["light"]["calls"]) == (40000, 80000)
    share = rows["heavy"]["exclusive_ms"] / (rows["heavy"]["exclusive_ms"] + rows["light"]["exclusive_ms"])
    # Heavy runs 2/3 of the loops' iterations; each call's own fixed cost (the same for both) lowers
    # heavy's share of the exclusive time below that. Two clean-clone CI runs on 3.14 read 0.588 (not
    # reproduced on the same clone run alone, nor in make test here): the bound leaves room for it.
    assert 0.55 <= share <= 0.72, "the construction itself: heavy has 2/3 of the iterations"
    assert not any(r["estimated"] or r["calls_estimated"] or r["calls_ci95"] for r in rows.values())
    # Times are the clock's less the recorder's cost of the events inside them, which is known only as well
    # as its measurement at the start: 80,000 calls of light cost its time that many events' worth.
    light = rows["light"]
    assert light["inclusive_ci95_ms"] > 0 and light["exclusive_ci95_ms"] > 0, light
    text = analyze("stats", path)
    table = [line.split() for line in text.splitlines() if line.endswith(("heavy", "light")) or ":" in line[-8:]]
    assert table and not any(cells[0].startswith("~") for cells in table), text
    assert "note: times marked ~ are the clock's less the recorder's cost" in text, text


@pytest.mark.parametrize("warm,sampled", [("warm", True), ("cold", True), ("warm", False)])
def test_hot_keeps_a_loops_whole_time_when_a_call_follows_it(tmp_path, warm, sampled):
    path, out = record(tmp_path, "loop", LOOP.replace("N", "1_000_000"), warm, sampled=sampled)
    took_ms = float(out.split()[-1])
    report = json.loads(analyze("hot", path, "--json", "--top", "5"))
    loop = next(lp for lp in report["loops"] if lp["function"] == "main" and lp["iterations"] == 1000)
    total_ms = loop["total_ns"] / 1e6
    # The program's own measurement of the loop, recorder and all: within 10%.
    assert abs(total_ms - took_ms) <= 0.1 * took_ms, (total_ms, took_ms, warm)
    assert loop["sampled"], "only the first iterations were recorded, and the report says so"
