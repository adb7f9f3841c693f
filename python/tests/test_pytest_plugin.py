"""The pytest plugin (ocular._pytest): `pytest --ocular DIR` and `--ocular-session PATH`, run on a small suite
with pytest's own pytester, in this process."""

from __future__ import annotations

import collections
import hashlib
import os
import re
import sys
import tomllib

import pytest

import ocular
from ocular._pytest import _FRAMEWORK, trace_name

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Three tests: one passes, one fails, one is parametrized (two items). Each calls work() a known number of
# times; work() spins long enough (~7 ms a call) to be the hottest function of every test, well above a
# garbage collection or a preemption in a function of pytest's.
SUITE = """import pytest

def work(n):
    t = 0
    for i in range(100000):
        t += i
    return t + n

@pytest.fixture
def fx():
    work(-1)
    yield
    work(-2)

def test_pass(fx):
    for i in range(7):
        work(i)

def test_fail():
    for i in range(3):
        work(i)
    assert False, "fails on purpose"

@pytest.mark.parametrize("n", [2, 5])
def test_param(n):
    for i in range(n):
        work(i)
"""
IDS = {"test_suite.py::test_pass": 7, "test_suite.py::test_fail": 3, "test_suite.py::test_param[2]": 2,
       "test_suite.py::test_param[5]": 5}


def plugin_args() -> list[str]:
    """-p ocular._pytest unless the installed package's entry point already brings the plugin (loading it
    both ways would register it twice)."""
    from importlib.metadata import entry_points

    if any(ep.value == "ocular._pytest" for ep in entry_points(group="pytest11")):
        return []
    return ["-p", "ocular._pytest"]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest(*plugin_args(), *args)


def by_function(path: str) -> dict[str, int]:
    return {r["function"]: r["calls"] for r in ocular.load(path).stats()}


def sha8(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode()).hexdigest()[:8]


def test_trace_name_is_readable_and_unique():
    nodeid = "tests/test_x.py::test_y[1-a]"
    assert trace_name(nodeid) == f"tests_test_x.py_test_y_1-a-{sha8(nodeid)}.ocl"
    # Two ids that sanitize alike still get their own files.
    assert trace_name("a/b.py::t") != trace_name("a_b.py::t")
    long_id = "t.py::test_" + "x" * 300
    assert len(trace_name(long_id)) == 100 + len("-12345678.ocl")
    assert trace_name(long_id) != trace_name(long_id + "y")


def test_pyproject_declares_the_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["pytest11"] == {"ocular": "ocular._pytest"}


def test_each_test_gets_its_own_trace(pytester: pytest.Pytester):
    # GIVEN a suite of a passing, a failing and a parametrized test
    # WHEN it runs with --ocular DIR in calls mode
    out = pytester.path / "traces"
    result = run(pytester, "--ocular", str(out), "--ocular-mode", "calls")
    # THEN the outcomes are the tests' own, and every test, the failing one too, has its file named after its id
    result.assert_outcomes(passed=3, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert sorted(os.listdir(out)) == sorted(
        [f"test_suite.py_test_pass-{sha8('test_suite.py::test_pass')}.ocl",
         f"test_suite.py_test_fail-{sha8('test_suite.py::test_fail')}.ocl",
         f"test_suite.py_test_param_2-{sha8('test_suite.py::test_param[2]')}.ocl",
         f"test_suite.py_test_param_5-{sha8('test_suite.py::test_param[5]')}.ocl"])
    for nodeid, calls in IDS.items():
        functions = by_function(str(out / trace_name(nodeid)))
        # The call phase only: the fixture's work(-1) and work(-2) are not in it.
        assert functions["work"] == calls, nodeid
        assert functions[nodeid.split("::")[1].split("[")[0]] == 1, nodeid
        assert "fx" not in functions
    # The summary: the hottest function over all tests first, and where the files are. Which function is
    # hottest is the traces' to say, not the suite's: work() is, on a quiet machine, but a preemption is
    # wall time in whatever function it lands in (once 105 ms in warnings._add_filter, beside busy loops).
    text = result.stdout.str()
    assert "4 tests recorded into " + str(out) in text
    rows = {nodeid: [r for r in ocular.load(out / trace_name(nodeid)).stats()
                     if not r["file"].startswith(_FRAMEWORK)] for nodeid in IDS}
    totals = collections.Counter()
    for r in (r for test in rows.values() for r in test):
        totals[r["function"]] += r["exclusive_ms"]
    lines = text.splitlines()
    head = lines.index("hottest functions over all tests (exclusive time; ~ estimated):")
    hottest = max(totals, key=totals.get)
    assert re.fullmatch(rf"\s+\d+\s+[\d.]+  {re.escape(hottest)}  \S+", lines[head + 2]), (lines[head + 2], totals)
    assert hottest != "work" or re.fullmatch(r"\s+17\s+[\d.]+  work  test_suite.py:3", lines[head + 2])
    slowest = lines.index("slowest tests (recorded ms), their hottest function (exclusive ms) and trace:")
    # Every test (4, fewer than the 5 listed), slowest first, each with its trace's hottest function, and its file
    listed = {}
    for line in lines[slowest + 1:slowest + 5]:
        m = re.fullmatch(r"\s+([\d.]+)  (\S+)  (\S+) \(([\d.]+)\)  (\S+)", line)
        assert m, line
        top = max(rows[m[2]], key=lambda r: r["exclusive_ms"])
        assert (m[3], m[4]) == (top["function"], f"{top['exclusive_ms']:.3f}"), (line, top)
        listed[m[2]] = (float(m[1]), m[5])
    assert {k: f for k, (_, f) in listed.items()} == {nodeid: trace_name(nodeid) for nodeid in IDS}
    times = [t for t, _ in listed.values()]
    assert times == sorted(times, reverse=True)
    assert "recording errors" not in text


def test_phases_all_records_setup_and_teardown(pytester: pytest.Pytester):
    out = pytester.path / "traces"
    result = run(pytester, "--ocular", str(out), "--ocular-mode", "calls", "--ocular-phases", "all",
                 "-k", "test_pass")
    result.assert_outcomes(passed=1)
    functions = by_function(str(out / trace_name("test_suite.py::test_pass")))
    assert functions["work"] == 7 + 2  # the fixture's set-up and tear-down call it once each
    assert functions["fx"] == 1


def test_session_trace_holds_every_test(pytester: pytest.Pytester):
    path = pytester.path / "session.ocl"
    result = run(pytester, "--ocular-session", str(path), "--ocular-mode", "calls")
    result.assert_outcomes(passed=3, failed=1)
    assert [p.name for p in pytester.path.rglob("*.ocl")] == ["session.ocl"]
    functions = by_function(str(path))
    assert functions["work"] == 7 + 3 + 2 + 5 + 2  # with the fixture's two calls
    assert functions["test_pass"] == functions["test_fail"] == 1 and functions["test_param"] == 2
    assert f"session recorded into {path}: " in result.stdout.str()
    result.stdout.re_match_lines([r"\s+\d+\s+[\d.]+  work  test_suite.py:3"])


def test_inactive_without_the_option(pytester: pytest.Pytester):
    # Nothing records: no file, Ocular's tool ids free while the test runs, no summary section.
    pytester.makepyfile(test_quiet="""
        import sys
        import ocular

        def test_nothing_records(request):
            assert ocular.active() is None
            assert sys.monitoring.get_tool(3) is None and sys.monitoring.get_tool(4) is None
            assert request.config.pluginmanager.get_plugin("ocular-recorder") is None
            plugins = request.config.pluginmanager
            assert plugins.hasplugin("ocular") or plugins.hasplugin("ocular._pytest")  # loaded, inactive
    """)
    result = pytester.runpytest(*plugin_args())
    result.assert_outcomes(passed=1)
    assert list(pytester.path.rglob("*.ocl")) == []
    assert "= ocular =" not in result.stdout.str()


def test_recording_error_is_reported_and_changes_no_outcome(pytester: pytest.Pytester):
    # GIVEN a directory where test_pass's trace would go: its recording cannot start
    out = pytester.path / "traces"
    out.mkdir()
    (out / trace_name("test_suite.py::test_pass")).mkdir()
    result = run(pytester, "--ocular", str(out), "--ocular-mode", "calls", "-k", "not fail")
    # THEN the test still passes, the exit status is unchanged, and the summary names the test and the error
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "recording errors (1; the tests' outcomes are their own):",
        f"  test_suite.py::test_pass: *{out / trace_name('test_suite.py::test_pass')}*",
    ])
    assert "2 tests recorded into" in result.stdout.str()
    assert sys.monitoring.get_tool(3) is None  # and nothing is left recording


def test_unwritable_dir_is_a_usage_error(pytester: pytest.Pytester):
    not_a_dir = pytester.path / "file"
    not_a_dir.write_text("")
    result = run(pytester, "--ocular", str(not_a_dir))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --ocular {not_a_dir}: cannot write traces there: *"])


def test_session_path_unwritable_is_a_usage_error(pytester: pytest.Pytester):
    path = pytester.path / "missing" / "s.ocl"
    result = run(pytester, "--ocular-session", str(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --ocular-session {path}: cannot record: OSError: {path}: No such file*"])
    assert "passed" not in result.stdout.str()  # no test ran


def test_both_options_is_a_usage_error(pytester: pytest.Pytester):
    result = run(pytester, "--ocular", "d", "--ocular-session", "s.ocl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --ocular and --ocular-session record one at a time: give one of them"])


def test_trace_deleted_during_the_test_is_written_again_and_said(pytester: pytest.Pytester):
    # A test that removes its own trace while it records (as a test cleaning a directory might): the stop
    # writes it again from the open file, and says so (it said "wrote no file" before, the test's trace
    # lost).
    pytester.makepyfile(test_removes="""
        import os
        import ocular

        def test_removes_its_trace():
            os.remove(ocular.active().path)
    """)
    out = pytester.path / "traces"
    result = pytester.runpytest(*plugin_args(), "--ocular", str(out))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "  note: test_removes.py::test_removes_its_trace: Ocular: */test_removes.py_test_removes_its_trace-*.ocl "
        "was deleted while it was written: written again at */test_removes.py_test_removes_its_trace-*.ocl",
    ])
    assert "1 test recorded into" in result.stdout.str()
    (trace,) = out.glob("test_removes.py_test_removes_its_trace-*.ocl")
    assert any(r["function"] == "test_removes_its_trace" for r in ocular.load(trace).stats())


def test_ocular_run_of_pytest_warns_of_nothing(tmp_path):
    # `ocular run -m pytest` imports ocular (a pytest plugin) before pytest starts: pytest used to warn on
    # every run that it could not rewrite its assertions.
    import subprocess

    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "-o", "t.ocl", "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", "test_one.py"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "warning" not in r.stdout.lower(), r.stdout
