"""The file is complete however the program ends, errors say what is wrong, nothing is lost silently."""

import collections
import cProfile
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import Reference, counts, read_ocl

import ocular
import workloads
from ocular._recorder import event_names

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(ocular.__file__)))


def run_ocular(*args, cwd=None, **kw):
    return subprocess.run([sys.executable, "-m", "ocular", *args], capture_output=True, text=True, cwd=cwd, **kw)


def test_an_exception_inside_the_block_propagates_and_the_file_is_complete(ocl):
    with pytest.raises(KeyError):
        with ocular.record(ocl):
            workloads.loop(10)
            raise KeyError("boom")
    f = read_ocl(ocl)
    assert f["clean"]
    assert any(k == "PY_START" and q == "loop" for k, q, _, _ in sum(f["workload"].values(), []))


def test_decorator_records_each_call(ocl):
    @ocular.record(ocl, mode="calls")
    def job():
        return workloads.fib(5)

    assert job() == 5
    c = counts(read_ocl(ocl)["workload"])
    assert c[("fib", "PY_START")] == 15


def test_start_and_stop_tracing_like_the_prototype(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = ocular.start_tracing(mode="calls", deinstrument_threshold=0, exclude=["threading"])
    workloads.fib(6)
    assert ocular.stop_tracing() is rec
    assert rec.path == "ocular.ocl" and rec.events > 0
    f = read_ocl(str(tmp_path / "ocular.ocl"))
    assert counts(f["workload"])[("fib", "PY_START")] == 25
    assert ocular.stop_tracing() is None


def test_a_second_recording_at_once_is_refused(ocl, tmp_path):
    with ocular.record(ocl):
        with pytest.raises(ocular.AlreadyRecording, match="already recording to .*run.ocl; stop it"):
            ocular.record(str(tmp_path / "other.ocl")).start()


def test_cprofile_running_does_not_stand_in_the_way(ocl):
    # Ocular takes tool id 3, not cProfile's PROFILER_ID: no warning, and both see the calls.
    prof = cProfile.Profile()
    prof.enable()
    try:
        with ocular.record(ocl, mode="calls") as rec:
            workloads.fib(4)
    finally:
        prof.disable()
    assert (rec.tool_id, rec.notes) == (3, [])
    assert counts(read_ocl(ocl)["workload"])[("fib", "PY_START")] == 9


def test_every_usable_tool_id_taken_is_a_clear_error(ocl):
    mon = sys.monitoring
    for t, name in [(2, "other-profiler"), (3, "tool-three"), (4, "tool-four")]:
        mon.use_tool_id(t, name)
    try:
        with pytest.raises(ocular.ToolIdInUse) as e:
            ocular.record(ocl).start()
        assert str(e.value) == (
            "cannot record: tool id 3 is in use by 'tool-three', tool id 4 by 'tool-four' and "
            "sys.monitoring.PROFILER_ID (2) by 'other-profiler'; stop one of them first"
        )
    finally:
        for t in (2, 3, 4):
            mon.free_tool_id(t)
    assert not os.path.exists(ocl)


def test_bad_arguments_are_refused_with_their_value(ocl):
    with pytest.raises(ValueError, match="unknown mode 'fast': use one of 'calls', 'adaptive', 'precise'"):
        ocular.record(ocl, mode="fast")
    with pytest.raises(ValueError, match=r"deinstrument_threshold must be an int >= 0 \(0 = gapless\), not -1"):
        ocular.record(ocl, deinstrument_threshold=-1)
    with pytest.raises(TypeError, match="filters are substrings"):
        ocular.record(ocl, exclude=[3])
    # Windows belong to a sampled recording, which needs locations to thin out.
    with pytest.raises(ValueError, match=r"sampled=True \(--sampled\) samples function boundaries in windows .* "
                                         "needs mode 'adaptive' or 'precise' and deinstrument_threshold above 0"):
        ocular.record(ocl, mode="calls", sampled=True)
    with pytest.raises(ValueError, match="deinstrument_threshold above 0"):
        ocular.record(ocl, deinstrument_threshold=0, sampled=True)
    with pytest.raises(ValueError, match=r"window_period and window_length set the windows of a sampled "
                                         r"recording: pass sampled=True too \(python -m ocular run --sampled\)"):
        ocular.record(ocl, window_period=0.02)
    with pytest.raises(ValueError, match="must be above 0 and at most half of window_period"):
        ocular.record(ocl, sampled=True, window_period=0.01, window_length=0.006)
    script = os.path.join(os.path.dirname(ocl), "x.py")
    with open(script, "w") as f:
        f.write("pass\n")
    r = run_ocular("run", "--window-length", "2", "-o", ocl, script)
    assert r.returncode == 2 and "pass sampled=True too (python -m ocular run --sampled)" in r.stderr, r.stderr


def test_an_unwritable_path_fails_at_start_and_leaves_the_tool_id_free(tmp_path):
    bad = str(tmp_path / "no" / "such" / "dir" / "run.ocl")
    with pytest.raises(OSError, match=f"{bad}: No such file or directory"):
        ocular.record(bad).start()
    assert [sys.monitoring.get_tool(t) for t in (2, 3, 4)] == [None, None, None]


def test_nothing_is_lost_silently_when_buffers_run_out(ocl):
    # Tiny buffers and only two of them: the writer cannot keep up, events are dropped and counted.
    with pytest.warns(RuntimeWarning, match="Ocular dropped") as w:
        with ocular.record(ocl, deinstrument_threshold=0, buffer_events=16, max_buffers=2) as rec:
            with Reference(event_names("adaptive")) as ref:
                for _ in range(30):
                    workloads.loop(300)
    f = read_ocl(ocl)
    total_ref = sum(len(v) for v in ref.events.values())
    recorded = sum(len(v) for v in f["workload"].values())
    lost = sum(n for _, n, _, _ in f["lost"])
    assert rec.lost == lost > 0
    # Every event is either in the file or counted as lost (lost ones may include non-workload events).
    assert recorded <= total_ref <= recorded + lost
    assert f["clean"]
    assert [x.filename for x in w if "Ocular dropped" in str(x.message)] == [__file__]


def test_run_keeps_argv_main_and_exit_code(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys
        def work():
            return sum(range(10))
        if __name__ == "__main__":
            work()
            print("argv", sys.argv[1:], __name__)
            sys.exit(int(sys.argv[1]))
    """))
    out = tmp_path / "prog.ocl"
    r = run_ocular("run", "-o", str(out), "--mode", "calls", str(script), "7", "--flag")
    assert r.returncode == 7, r.stderr
    assert "argv ['7', '--flag'] __main__" in r.stdout
    assert f"ocular: wrote {out}:" in r.stderr
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert f["clean"]
    assert "work" in {q for (q, _, _, _) in f["code"].values()}


@pytest.mark.parametrize("sampled", [False, True], ids=["default", "sampled"])
def test_run_records_the_program_and_not_the_machinery_that_starts_it(tmp_path, sampled):
    # runpy.run_path imports pkgutil, which imports typing: ~200 code objects that are not the user's.
    script = tmp_path / "tiny.py"
    script.write_text("def f():\n    return 1\nf()\n")
    out = tmp_path / "tiny.ocl"
    r = run_ocular("run", "-q", "-o", str(out), *(["--sampled"] if sampled else []), str(script))
    assert r.returncode == 0, r.stderr
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert sorted((q, os.path.basename(fn)) for (q, fn, _, _) in f["code"].values()) == [
        ("<module>", "tiny.py"),
        ("f", "tiny.py"),
    ]
    kinds = [k for (_, _, k, _, _, _) in f["events"] if k not in ("STACK", "PAUSE")]
    if not sampled:
        assert kinds == ["PY_START", "PY_START", "PY_RETURN", "PY_RETURN"]
        return
    # Sampled, the first window (FORMAT.md 5.3) opens with the recording: every call of this short program
    # is in it. Its stack holds only Ocular's own frames (code 0, not recorded): runpy's below them are left
    # out.
    stack = [c for (_, _, k, c, _, _) in f["events"] if k == "STACK"]
    assert stack and set(stack) == {0}
    assert kinds == ["WINDOW", "PY_START", "PY_START", "PY_RETURN", "PY_RETURN"]


def test_run_reports_a_syntax_error_as_python_does_and_records_nothing(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n    pass\n")
    out = tmp_path / "broken.ocl"
    r = run_ocular("run", "-o", str(out), str(script))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert (r.returncode, plain.returncode) == (1, 1)
    assert r.stderr == plain.stderr
    assert "SyntaxError: invalid syntax" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("case", ["cookie", "no-future", "optimize"])
def test_run_compiles_a_script_as_python_does(tmp_path, case):
    # The script is compiled by the extension, not by compile(): its coding cookie, no __future__ flag of
    # Ocular's own modules, and python's -O level must all be python's.
    script = tmp_path / "prog.py"
    flags = []
    if case == "cookie":
        script.write_bytes("# -*- coding: latin-1 -*-\nprint(ascii('é'))\n".encode("latin-1"))
    elif case == "no-future":
        script.write_text("def f(x: int) -> None: pass\nprint(f.__annotations__)\n")
    else:
        flags = ["-O"]
        script.write_text("assert False, 'asserts on'\nprint('asserts off', __debug__)\n")
    out = tmp_path / "prog.ocl"
    r = subprocess.run([sys.executable, *flags, "-m", "ocular", "run", "-q", "-o", str(out), str(script)],
                       capture_output=True, text=True)
    plain = subprocess.run([sys.executable, *flags, str(script)], capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert r.stdout == {"cookie": "'\\xe9'\n", "no-future": "{'x': <class 'int'>, 'return': None}\n",
                        "optimize": "asserts off False\n"}[case]


def test_the_native_compile_raises_what_compile_raises():
    from ocular import _ocular

    for source in (b"x = 1\x00\n", b"def f(:\n    pass\n"):
        with pytest.raises(SyntaxError) as native:
            _ocular.compile_script(source, "prog.py")
        with pytest.raises(SyntaxError) as builtin:
            compile(source, "prog.py", "exec", dont_inherit=True)
        assert (str(native.value), native.value.lineno) == (str(builtin.value), builtin.value.lineno)
    code = _ocular.compile_script(b"y = 2\n", "prog.py")
    assert code.co_filename == "prog.py" and code.co_code == compile(b"y = 2\n", "prog.py", "exec").co_code


def test_run_module_mode(tmp_path):
    # Everything after -m MODULE is the module's, options included, as with `python -m MODULE`.
    (tmp_path / "mymod.py").write_text("import sys\nprint('mod', sys.argv, __name__)\n")
    out = tmp_path / "m.ocl"
    args = ["a", "--sort-keys", "-q", "-o", "x"]
    r = run_ocular("run", "-q", "-o", str(out), "-m", "mymod", *args, cwd=tmp_path)
    plain = subprocess.run([sys.executable, "-m", "mymod", *args], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    assert r.stdout.startswith("mod [") and r.stdout.endswith(", 'a', '--sort-keys', '-q', '-o', 'x'] __main__\n")
    assert r.stderr == ""
    assert out.exists()


def test_run_module_attached_and_arguments_that_are_not_utf8(tmp_path):
    (tmp_path / "mymod.py").write_text("import sys\nprint(ascii(sys.argv[1:]))\n")
    # -mMODULE as python takes it; an argument with bytes that do not decode passes through as python's.
    args = [b"\xff", "--x"]
    cmd = [sys.executable, "-m", "ocular", "run", "-q", "-o", str(tmp_path / "m.ocl"), "-mmymod", *args]
    r = subprocess.run(cmd, capture_output=True, cwd=tmp_path)
    plain = subprocess.run([sys.executable, "-mmymod", *args], capture_output=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout == b"['\\udcff', '--x']\n"


def test_run_command_line_help_and_usage_errors():
    r = run_ocular()  # no command: the help, as a usage error
    assert r.returncode == 2 and "Usage: python -m ocular <COMMAND>" in r.stderr
    assert all(f"\n  {c} " in r.stderr for c in ("run", "info", "hot", "stats", "export", "flamegraph", "dump"))
    r = run_ocular("run", "--help")
    assert r.returncode == 0
    assert "Usage: python -m ocular run [OPTIONS] [SCRIPT [ARGS]]..." in r.stdout
    assert "python -m ocular run -o run.ocl --mode calls -m http.server 8000" in r.stdout
    r = run_ocular("run", "--mode", "fast", "x.py")
    assert r.returncode == 2
    assert "invalid value 'fast' for '--mode <MODE>'" in r.stderr and "calls, adaptive, precise" in r.stderr
    r = run_ocular("run", "--threshold", "-3", "x.py")
    assert r.returncode == 2 and "invalid value '-3' for '--threshold <N>'" in r.stderr
    r = run_ocular("run", "--treshold", "0", "x.py")  # a mistyped option is not taken for the script
    assert r.returncode == 2 and "unexpected argument '--treshold'" in r.stderr and "--threshold" in r.stderr
    r = run_ocular("record", "x.py")
    assert r.returncode == 2 and "unrecognized subcommand 'record'" in r.stderr
    r = run_ocular("run")
    assert r.returncode == 2 and r.stderr == "python -m ocular run: give a script to run, or -m MODULE\n"


def test_run_reports_a_missing_script():
    r = run_ocular("run", "/nonexistent/script.py")
    assert r.returncode == 2
    assert r.stderr == "python -m ocular run: /nonexistent/script.py: no such file\n"


def test_run_with_an_exception_exits_1_and_keeps_the_file(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("def f():\n    raise RuntimeError('nope')\nf()\n")
    out = tmp_path / "bad.ocl"
    r = run_ocular("run", "-o", str(out), str(script))
    assert r.returncode == 1
    assert "RuntimeError: nope" in r.stderr
    from ocular import _ocular

    assert _ocular.read(str(out))["clean"]


def _child(tmp_path, body, out):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen(
        [sys.executable, "-m", "ocular", "run", "-q", "-o", str(out), "--threshold", "0", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


LONG_RUNNING = """
    import sys, time
    def spin():
        s = 0
        for i in range(20000):
            s += i
        return s
    print("ready", flush=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        spin()
"""


def test_sigterm_stops_the_child_with_a_complete_file(tmp_path):
    out = tmp_path / "term.ocl"
    p = _child(tmp_path, LONG_RUNNING, out)
    assert p.stdout.readline() == "ready\n"
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    # As without Ocular: the process dies of the signal (after the trace is completed).
    assert p.returncode == -signal.SIGTERM, p.stderr.read()
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert f["clean"], f["warnings"]
    assert any(q == "spin" for (q, _, _, _) in f["code"].values())


def test_sigint_stops_the_child_with_a_complete_file(tmp_path):
    out = tmp_path / "int.ocl"
    p = _child(tmp_path, LONG_RUNNING, out)
    assert p.stdout.readline() == "ready\n"
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=20)
    err = p.stderr.read()
    # An uncaught KeyboardInterrupt: Python re-raises SIGINT on itself after unwinding (the recording's
    # __exit__ runs during the unwinding).
    assert p.returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert f["clean"], f["warnings"]


def test_sigkill_leaves_every_written_chunk_readable(tmp_path):
    out = tmp_path / "kill.ocl"
    p = _child(tmp_path, LONG_RUNNING, out)
    assert p.stdout.readline() == "ready\n"
    time.sleep(1.0)
    p.kill()
    p.wait(timeout=20)
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert not f["clean"]
    assert any("no trailer" in w for w in f["warnings"])
    spins = [e for e in f["events"] if e[3] in f["code"] and f["code"][e[3]][0] == "spin"]
    assert len(spins) > 10_000, "whole chunks written before the kill are all there"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_does_not_touch_the_parents_file(ocl):
    with ocular.record(ocl, deinstrument_threshold=0) as rec:
        workloads.loop(10)
        pid = os.fork()
        if pid == 0:
            workloads.fib(15)  # the child's work must not reach the parent's file
            os._exit(0)
        os.waitpid(pid, 0)
        workloads.loop(10)
    f = read_ocl(ocl)
    assert f["clean"]
    c = counts(f["workload"])
    assert c[("loop", "PY_START")] == 2
    assert c[("fib", "PY_START")] == 0
    assert rec.lost == 0


FORK_HOOK_FIRST = """
import os, sys, time
import ocular

def child_marker():
    return 1

def in_child():
    time.sleep(0.2)  # after the parent has written its events after the fork
    for _ in range(2000):
        child_marker()

def parent_work():
    return 2

os.register_at_fork(after_in_child=in_child)  # before Ocular's own hook: it runs first in the child
with ocular.record(sys.argv[1], mode="calls"):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    for _ in range(10_000):
        parent_work()
    os.waitpid(pid, 0)
"""


def test_a_forked_child_s_first_events_do_not_reach_the_parent_s_buffer(tmp_path):
    # The buffers are slots of the ring file, mapped shared: a child's at-fork hooks that ran before Ocular's
    # wrote their events into the slot the parent was filling, over the parent's own (a forkserver's trace
    # went back 5.8 ms in time there, and the analyzer's debug build stopped on it).
    script = tmp_path / "fork.py"
    script.write_text(FORK_HOOK_FIRST)
    out = tmp_path / "fork.ocl"
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from ocular import _ocular

    f = _ocular.read(str(out))
    assert f["clean"]
    names = {i: c[0] for i, c in f["code"].items()}
    starts = collections.Counter(names.get(cid) for _, _, kind, cid, _, _ in f["events"] if kind == "PY_START")
    assert starts["parent_work"] == 10_000 and starts["child_marker"] == 0, starts
    ticks = [e[1] for e in f["events"]]
    assert ticks == sorted(ticks), "one thread's events are in the order of its clock"


def test_unsupported_python_is_refused_by_name(tmp_path):
    old = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
    if old is None:
        pytest.skip("no system python3")
    v = subprocess.run([old, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True, text=True)
    if v.stdout.strip() != "False":
        pytest.skip("the system python3 is 3.12+")
    code = "import ocular\ntry:\n    ocular.record('x.ocl').start()\nexcept ocular.UnsupportedPython as e:\n    print(e)\n"
    r = subprocess.run([old, "-c", code], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": PYTHON_DIR})
    assert r.stdout.startswith("Ocular needs Python 3.12 or newer (sys.monitoring, PEP 669); this is 3."), r.stderr
