"""Reliability: a recording gets out of the program's way (tool ids, recursion, SIGTERM); issue 15."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import ocular

HERE = os.path.dirname(__file__)


def _python(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, **kw)


# -- item 10: the tool id -------------------------------------------------------------------------------


def test_cprofile_can_start_while_a_recording_runs(ocl):
    import cProfile

    with ocular.record(ocl, mode="calls") as rec:
        prof = cProfile.Profile()
        prof.enable()  # raised "Another profiling tool is already active" when Ocular held PROFILER_ID
        prof.disable()
    assert rec.tool_id == 3
    assert rec.notes == []


def test_run_m_cprofile_profiles_the_script(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("def f():\n    return 1\n\nfor _ in range(100):\n    f()\n")
    r = _python(["-m", "ocular", "run", "-o", str(tmp_path / "x.ocl"), "-m", "cProfile", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Another profiling tool" not in r.stderr
    assert "100    0.000    0.000    0.000    0.000 x.py:1(f)" in r.stdout, r.stdout


def test_tool_id_4_then_profiler_id_when_3_is_taken(ocl, tmp_path):
    mon = sys.monitoring
    mon.use_tool_id(3, "tool-three")
    try:
        with ocular.record(ocl, mode="calls") as rec:
            pass
        assert (rec.tool_id, rec.notes) == (4, [])
        mon.use_tool_id(4, "tool-four")
        with pytest.warns(RuntimeWarning) as w:
            with ocular.record(str(tmp_path / "two.ocl"), mode="calls") as rec:
                pass
        assert rec.tool_id == mon.PROFILER_ID
        assert str(w[0].message) == (
            "tool id 3 is in use by 'tool-three' and tool id 4 by 'tool-four'; Ocular records with "
            "sys.monitoring.PROFILER_ID (2) instead, so cProfile cannot start until it stops"
        )
        assert w[0].filename == __file__, w[0].filename
    finally:
        for t in (3, 4):
            if mon.get_tool(t) is not None:
                mon.free_tool_id(t)
    assert mon.get_tool(mon.PROFILER_ID) is None


# -- item 11: the decorator on a recursive function -----------------------------------------------------


def _starts(path, name):
    """PY_START events of functions called `name` in an .ocl file."""
    from ocular import _ocular

    f = _ocular.read(path, False)
    code = f["code"]
    return sum(1 for _, _, kind, cid, _, _ in f["events"]
               if kind == "PY_START" and cid in code and code[cid][0].rsplit(".", 1)[-1] == name)


def test_the_decorator_on_a_recursive_function_records_the_outermost_call(ocl):
    rec = ocular.record(ocl, mode="calls")

    @rec
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    assert fact(6) == 720  # raised AlreadyRecording at the first recursive call
    assert not rec.running
    # The inner calls are in the outer call's recording: 6 starts of fact.
    assert _starts(ocl, "fact") == 6
    # A later call records again, from the start.
    assert fact(3) == 6
    assert _starts(ocl, "fact") == 3


# -- item 9: SIGTERM ---------------------------------------------------------------------------------------


def test_sigterm_ends_a_program_with_a_non_daemon_thread_as_without_ocular(tmp_path):
    # GIVEN a program whose non-daemon thread would run for a minute, recorded by python -m ocular run
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import threading, time
        def work():
            deadline = time.time() + 60
            while time.time() < deadline:
                sum(range(1000))
        t = threading.Thread(target=work)
        t.start()
        print("ready", flush=True)
        t.join()
    """))
    out = tmp_path / "worker.ocl"
    p = subprocess.Popen([sys.executable, "-m", "ocular", "run", "-q", "-o", str(out), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        # WHEN it gets SIGTERM
        p.send_signal(signal.SIGTERM)
        # THEN it dies of the signal as plain Python does (it ran on for the thread's minute before) ...
        p.wait(timeout=15)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGTERM, p.stderr.read()
    # ... with the trace completed.
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert f["clean"], f["warnings"]
    assert any(q == "work" for (q, _, _, _) in f["code"].values())
