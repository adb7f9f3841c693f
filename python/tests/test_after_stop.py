"""A recording leaves the interpreter as it found it: the locations Ocular switched off (DISABLE) during a
sampled recording (function boundaries too, between windows) are switched back on however the recording ends, so a tool started afterwards on
the same tool id (a plain sys.monitoring tool, a second recording) or cProfile sees every event, and a tool running across the
recording (coverage.py) still reports every line."""

import collections
import cProfile
import json
import os
import pstats
import subprocess
import sys
import textwrap

import pytest

import ocular

CALLS = 80_000  # past the first window (50,000 calls at the default threshold), so locations are switched off


def tiny_leaf():
    return 1


def drive(n=CALLS):
    s = 0
    for _ in range(n):
        s += tiny_leaf()
    return s


def cprofile_calls(func=drive):
    """How many calls of tiny_leaf cProfile (which takes sys.monitoring.PROFILER_ID) counts in func()."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        func()
    finally:
        prof.disable()
    return sum(v[1] for k, v in pstats.Stats(prof).stats.items() if k[2] == "tiny_leaf")


def recorded_calls(path):
    """PY_START events of tiny_leaf in an .ocl file."""
    from ocular import _ocular

    f = _ocular.read(path, False)
    code = f["code"]
    c = collections.Counter()
    for _, _, kind, cid, _, _ in f["events"]:
        if cid in code and code[cid][1] == __file__:  # markers (no code object) are skipped
            c[(code[cid][0], kind)] += 1
    return c[("tiny_leaf", "PY_START")]


def _with(path):
    with ocular.record(path, sampled=True):
        drive()


def _exception_in_with(path):
    with pytest.raises(KeyError):
        with ocular.record(path, sampled=True):
            drive()
            raise KeyError("boom")


def _decorator(path):
    ocular.record(path, sampled=True)(drive)()


def _start_stop(path):
    rec = ocular.record(path, sampled=True).start()
    drive()
    rec.stop()


def _stop_tracing(path):
    ocular.start_tracing(output=path, sampled=True)
    drive()
    ocular.stop_tracing(report=False)


ENDINGS = {"with": _with, "exception in with": _exception_in_with, "decorator": _decorator,
           "start/stop": _start_stop, "stop_tracing": _stop_tracing}


@pytest.mark.parametrize("ending", ENDINGS)
def test_cprofile_after_a_sampled_recording_counts_every_call(ocl, ending):
    # GIVEN a sampled recording of drive(): tiny_leaf's calls are switched off past the threshold
    ENDINGS[ending](ocl)
    assert 0 < recorded_calls(ocl) < CALLS
    # WHEN a tool then takes Ocular's tool id (3), or cProfile its own, THEN it sees every call
    assert sys.monitoring.get_tool(3) is None
    assert tool_calls(3) == CALLS
    assert cprofile_calls() == CALLS


@pytest.mark.parametrize("ending", ["with", "exception in with"])
def test_a_calls_mode_recording_after_a_default_mode_one_counts_every_call(ocl, tmp_path, ending):
    ENDINGS[ending](ocl)
    second = str(tmp_path / "second.ocl")
    with ocular.record(second, mode="calls"):
        drive()
    assert recorded_calls(second) == CALLS


def test_cprofile_after_a_recording_that_ended_with_an_exception_then_a_calls_mode_one(ocl, tmp_path):
    _exception_in_with(ocl)
    assert cprofile_calls() == CALLS
    second = str(tmp_path / "second.ocl")
    with ocular.record(second, mode="calls"):
        drive()
    assert recorded_calls(second) == CALLS
    assert cprofile_calls() == CALLS


def tool_calls(tool, func=drive):
    """How many calls of tiny_leaf a plain sys.monitoring tool on id `tool` sees in func()."""
    mon = sys.monitoring
    seen = [0]

    def start(code, offset):
        if code is tiny_leaf.__code__:
            seen[0] += 1

    mon.use_tool_id(tool, "counter")
    mon.register_callback(tool, mon.events.PY_START, start)
    mon.set_events(tool, mon.events.PY_START)
    try:
        func()
    finally:
        mon.set_events(tool, 0)
        mon.register_callback(tool, mon.events.PY_START, None)
        mon.free_tool_id(tool)
    return seen[0]


def test_a_start_that_fails_hands_the_tool_id_back_clean(tmp_path):
    # GIVEN locations of tool id 3 (Ocular's first choice) switched off and left so by a tool that freed the
    # id without restarting
    mon = sys.monitoring
    tool = 3
    mon.use_tool_id(tool, "leaves-locations-off")
    mon.register_callback(tool, mon.events.PY_START, lambda code, offset: mon.DISABLE)
    mon.set_events(tool, mon.events.PY_START)
    drive(10)
    mon.set_events(tool, 0)
    mon.register_callback(tool, mon.events.PY_START, None)
    mon.free_tool_id(tool)
    # WHEN a recording takes that id and fails to start (its directory does not exist)
    with pytest.raises(OSError):
        ocular.record(str(tmp_path / "missing" / "run.ocl")).start()
    # THEN the id is handed back with its locations switched on
    assert mon.get_tool(tool) is None
    assert tool_calls(tool) == CALLS
    assert cprofile_calls() == CALLS


def _run(script, env=None):
    env = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_cprofile_after_a_recording_stopped_at_exit_counts_every_call(ocl):
    # atexit runs its handlers last-registered first: the one registered before the recording runs after
    # Ocular's own stop at exit.
    out = _run(f"""
        import atexit, ocular, test_after_stop as t
        atexit.register(lambda: print("calls", t.cprofile_calls()))
        ocular.record({ocl!r}, sampled=True).start()
        t.drive()
    """)
    assert out.split() == ["calls", str(CALLS)]
    assert 0 < recorded_calls(ocl) < CALLS


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_cprofile_in_a_forked_child_counts_every_call(ocl):
    # The child drops the parent's recording (after_in_child): the id is free and clean in the child.
    out = _run(f"""
        import os, sys, ocular, test_after_stop as t
        with ocular.record({ocl!r}):
            t.drive()
            pid = os.fork()
            if pid == 0:
                ok = sys.monitoring.get_tool(3) is None
                print("child", ok, t.cprofile_calls(), flush=True)
                os._exit(0)
            os.waitpid(pid, 0)
    """)
    assert out.split() == ["child", "True", str(CALLS)]


def test_coverage_across_a_recording_still_reports_every_line(tmp_path):
    # GIVEN coverage.py on sys.monitoring (its sysmon core), which also returns DISABLE for lines it has
    # seen, started before a recording and stopped after it
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""\
        def before(n):
            s = 0
            for i in range(n):
                s += i
            return s


        def after(x):
            if x > 0:
                y = x * 2
            else:
                y = -x
            return y


        def never():
            return 0
    """))
    out = _run(f"""
        import json, sys, coverage, ocular
        sys.path.insert(0, {str(tmp_path)!r})
        cov = coverage.Coverage(data_file=None, include=[{str(prog)!r}])
        cov.start()
        assert sys.monitoring.get_tool(sys.monitoring.COVERAGE_ID) is not None, "coverage is not on sysmon"
        import prog
        prog.before(10)
        with ocular.record({str(tmp_path / "run.ocl")!r}):
            prog.before(5000)
        # WHEN lines run for the first time after the recording, and lines it saw before run again
        prog.before(10)
        prog.after(1)
        prog.after(-1)
        cov.stop()
        _, statements, _, missing, _ = cov.analysis2({str(prog)!r})
        print(json.dumps([statements, missing]))
    """, env={"COVERAGE_CORE": "sysmon"})
    # THEN every line is reported executed but never()'s body
    statements, missing = json.loads(out)
    assert statements == [1, 2, 3, 4, 5, 8, 9, 10, 12, 13, 16, 17]
    assert missing == [17]
