"""The pytest plugin: ``pytest --ocular DIR`` records each test into its own trace, ``pytest --ocular-session
PATH`` the whole session into one. Inactive unless one of them is given. Registered through the ``pytest11``
entry point, so an installed Ocular brings it; ``-p no:ocular`` leaves it out.

What it records: with ``--ocular DIR``, each test's call phase by default (``--ocular-phases all``: its
setup and teardown too, fixtures included), into ``DIR/<test id, sanitized>-<hash>.ocl`` (see
:func:`trace_name`); with ``--ocular-session PATH``, everything from the session's start (collection, every
test, fixtures) to its end. A recording error never changes a test's outcome nor the exit status: it is
listed in the terminal summary with the test and the error. A DIR or PATH that cannot be written at all is a
usage error before any test runs (exit code 4). What Ocular says when a recording stops (lost events, a
write error) goes into the summary, not through ``warnings``, so a project's ``filterwarnings = error``
cannot turn it into a test failure.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import pytest

from ._recorder import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Generator

    from ._recorder import Recording

# Frames of pytest and pluggy themselves (the hook calls around a test): left out of the summary's tables.
_FRAMEWORK = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (sys.modules.get("_pytest"), sys.modules.get("pluggy"))
    if m is not None and getattr(m, "__file__", None)
)
_RESULT = pytest.StashKey["dict[str, Any]"]()
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")


def trace_name(nodeid: str) -> str:
    """The trace file name of a test: every run of characters other than letters, digits and ``_.=+-``
    becomes one ``_``, cut at 100 characters, then ``-`` and the first 8 hex digits of the SHA-1 of the
    whole node id, so that names are unique (``a/b`` and ``a_b``, two ids cut to the same prefix) and the
    same in every run and every xdist worker: ``tests/test_x.py::test_y[1-a]`` ->
    ``tests_test_x.py_test_y_1-a-4b6b7505.ocl``."""
    import hashlib  # here: the plugin is imported by every pytest run where Ocular is installed

    readable = _UNSAFE.sub("_", nodeid).strip("_")[:100] or "test"
    return f"{readable}-{hashlib.sha1(nodeid.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}.ocl"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("ocular", "Ocular: record tests with sys.monitoring (python -m ocular run's options)")
    g.addoption("--ocular", metavar="DIR", default=None,
                help="record each test into its own trace in DIR (made if missing), named after its id")
    g.addoption("--ocular-session", metavar="PATH", default=None,
                help="record the whole session (collection, every test) into one trace")
    # The recording's options (python -m ocular run's, defined once in the extension), prefixed. An
    # interpreter the extension does not load in still gets --ocular, which then says why it cannot record.
    try:
        from . import _options

        specs = _options.recording()
    except ImportError:
        specs = []
    for spec in specs:
        g.addoption("--ocular-" + spec["flag"][2:], **_options.argparse_kwargs(spec, "ocular_" + spec["name"]))
    g.addoption("--ocular-phases", choices=("call", "all"), default="call",
                help="with --ocular: record the test's call only (default), or all: its setup and teardown too")


def pytest_configure(config: pytest.Config) -> None:
    opt = config.option
    if opt.ocular is None and opt.ocular_session is None:
        return
    if opt.ocular is not None and opt.ocular_session is not None:
        raise pytest.UsageError("--ocular and --ocular-session record one at a time: give one of them")
    config.pluginmanager.register(OcularPlugin(config), "ocular-recorder")


def _xdist_worker(config: pytest.Config) -> str | None:
    return getattr(config, "workerinput", {}).get("workerid")


def _quietly(f: "Any", *args: "Any") -> tuple[Any, list[str]]:
    """f() with Ocular's own warnings caught, as messages for the summary. Only around what runs
    unrecorded (a stop, an analysis): a start's rare warnings (a tool id note) go to pytest's warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(*args)
    return out, [str(w.message) for w in caught]


# A test's recording: buffers of 8,192 events (192 KiB) instead of 65,536, as many more of them in flight
# (the same 96 MiB at most): each recording makes its first buffers' pages at its start and frees them at
# its stop, ~1 ms a 1.5 MiB buffer, which a test that records a few hundred events paid in full.
TEST_BUFFERS = {"buffer_events": 8192, "max_buffers": 512}


class OcularPlugin:
    def __init__(self, config: pytest.Config) -> None:
        opt = config.option
        self.config = config
        from . import _options

        self.kwargs = {s["name"]: getattr(opt, "ocular_" + s["name"]) for s in _options.recording()}
        self.phases = opt.ocular_phases
        self.worker = _xdist_worker(config)
        self.dir: str | None = None
        self.session_path: str | None = None
        if opt.ocular is not None:
            self.dir = os.path.abspath(opt.ocular)
            try:
                os.makedirs(self.dir, exist_ok=True)
                probe = os.path.join(self.dir, f".ocular-probe-{os.getpid()}")
                with open(probe, "wb"):
                    pass
                os.remove(probe)
            except OSError as e:
                raise pytest.UsageError(f"--ocular {opt.ocular}: cannot write traces there: {e}") from None
        else:
            path = os.path.abspath(opt.ocular_session)
            if self.worker is not None:
                root, ext = os.path.splitext(path)
                path = f"{root}.{self.worker}{ext or '.ocl'}"
            self.session_path = path
        self.session_rec: Recording | None = None
        self.session_notes: list[str] = []
        self.session_error: str | None = None
        self.results: list[dict[str, Any]] = []  # per test: nodeid, path, error, notes
        self.read_ahead: Any = None  # each test's trace read for the summary while the next tests run

    @property
    def records_here(self) -> bool:
        # In xdist's controller (its "dsession" plugin, registered at configure) no test runs: the workers
        # record, and their reports bring the results here.
        return not self.config.pluginmanager.has_plugin("dsession")

    # -- the whole session -----------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.session_path is None or not self.records_here:
            return
        rec = record(self.session_path, **self.kwargs)
        try:
            rec.start()
        except Exception as e:  # noqa: BLE001 - nothing would be recorded: say so before any test runs
            raise pytest.UsageError(f"--ocular-session {self.config.option.ocular_session}: cannot record: "
                                    f"{type(e).__name__}: {e}") from None
        self.session_rec = rec

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        rec, self.session_rec = self.session_rec, None
        if rec is not None:
            self.session_error, notes = self._stop(rec)
            self.session_notes += notes

    # -- one test --------------------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> "Generator[None, None, None]":
        if self.phases == "all":
            self._start(item)
        return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> "Generator[None, None, None]":
        # trylast: the innermost wrapper, so the trace holds the test and as little of pytest as can be.
        if self.phases == "call":
            self._start(item)
        try:
            return (yield)
        finally:
            if self.phases == "call":
                self._finish(item)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> "Generator[None, None, None]":
        try:
            return (yield)
        finally:
            if self.phases == "all":
                self._finish(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> "Generator":
        report = yield
        result = item.stash.get(_RESULT, None)
        if result is not None and result.get("done"):
            del item.stash[_RESULT]
            # An attribute of the report: xdist sends it from the worker to the controller with the rest.
            report.ocular = {k: v for k, v in result.items() if k != "rec"}
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        result = getattr(report, "ocular", None)
        if result is not None:
            self.results.append(result)

    def _start(self, item: pytest.Item) -> None:
        if self.dir is None or not self.records_here:
            return
        path = os.path.join(self.dir, trace_name(item.nodeid))
        result: dict[str, Any] = {"nodeid": item.nodeid, "path": path, "error": None, "notes": [],
                                  "done": False}
        item.stash[_RESULT] = result
        try:
            # Not inside catch_warnings, as the stop is: its __exit__ would run recorded, in every trace.
            rec = record(path, **self.kwargs, **TEST_BUFFERS).start()
        except Exception as e:  # noqa: BLE001 - the test runs unrecorded; the summary says why
            result["error"] = f"{type(e).__name__}: {e}"
            result["done"] = True
            return
        result["rec"] = rec

    def _finish(self, item: pytest.Item) -> None:
        result = item.stash.get(_RESULT, None)
        if result is None or result["done"]:
            return
        result["done"] = True
        result["error"], notes = self._stop(result.pop("rec"))
        result["notes"] += notes
        if result["error"] is None and not os.path.exists(result["path"]):
            result["error"] = "the recording stopped but wrote no file"
        if result["error"] is None and self.worker is None:
            # Read for the summary now, on a core the tests leave idle (an xdist worker's traces are read
            # by the controller, which gets only their paths).
            if self.read_ahead is None:
                from ._analysis import StatsReadAhead

                self.read_ahead = StatsReadAhead(leave_out=_FRAMEWORK)
            self.read_ahead.push(result["path"])

    def _stop(self, rec: Recording) -> tuple[str | None, list[str]]:
        """(the error that spoilt the trace, or None; what the stop warned about)."""
        try:
            _, notes = _quietly(rec.stop)
        except Exception as e:  # noqa: BLE001 - reported in the summary
            return f"stopping the recording failed: {type(e).__name__}: {e}", []
        if rec.error:
            return f"could not write {rec.path}: {rec.error}", [n for n in notes if rec.error not in n]
        return None, notes

    # -- the summary -----------------------------------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: "Any") -> None:
        tr = terminalreporter
        tr.write_sep("=", "ocular")
        try:
            if self.dir is not None:
                self._summary_tests(tr)
            else:
                self._summary_session(tr)
        except Exception as e:  # noqa: BLE001 - the summary must not turn into an internal error
            tr.write_line(f"ocular: could not summarize the traces: {type(e).__name__}: {e}")

    def _summary_tests(self, tr: Any) -> None:
        from ._analysis import stats_rows_many

        recorded = [r for r in self.results if not r["error"]]
        where = " (by the xdist workers)" if not self.records_here else ""
        tr.write_line(f"{len(recorded)} test{'s' if len(recorded) != 1 else ''} recorded into {self.dir}"
                      f"{where}, one .ocl file per test ({self._phase_text()}, {self.kwargs['mode']} mode): "
                      f"python -m ocular stats FILE, or ocular.load(FILE).stats()")
        totals: dict[tuple, list] = {}
        per_test = []
        # The test's time: its outermost recorded call (pytest's, around the test), the recorder's cost
        # subtracted. Not the trace's duration, which holds the recording's own start and stop.
        paths = [r["path"] for r in recorded]
        read = self.read_ahead.take(paths) if self.read_ahead is not None else stats_rows_many(
            paths, leave_out=_FRAMEWORK)
        for r, got in zip(recorded, read):
            if isinstance(got, Exception):  # one unreadable file does not hide the others
                r["error"] = f"reading {r['path']}: {type(got).__name__}: {got}"
                continue
            rows, notes, duration = got
            r["notes"] += notes
            for x in rows:
                t = totals.setdefault((x["function"], x["file"], x["line"]), [0, 0.0, False])
                t[0] += x["calls"]
                t[1] += x["exclusive_ms"]
                t[2] = t[2] or x["estimated"]
            top = max(rows, key=lambda x: x["exclusive_ms"], default=None)
            per_test.append((duration, r, top))
        if totals:
            tr.write_line("hottest functions over all tests (exclusive time; ~ estimated):")
            tr.write_line(f"  {'calls':>9} {'excl ms':>10}  function  file:line")
            for (func, file, line), (calls, excl, est) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:5]:
                mark = "~" if est else " "
                tr.write_line(f"  {calls:>9} {mark}{excl:>9.3f}  {func}  {self._where(file)}:{line}")
        if per_test:
            per_test.sort(key=lambda t: -t[0])
            tr.write_line("slowest tests (recorded ms), their hottest function (exclusive ms) and trace:")
            for duration, r, top in per_test[:5]:
                hot = (f"{top['function']} ({top['exclusive_ms']:.3f})" if top else "no function recorded")
                tr.write_line(f"  {duration:>9.3f}  {r['nodeid']}  {hot}  {os.path.basename(r['path'])}")
        self._problems(tr, [(r["nodeid"], r["error"], r["notes"]) for r in self.results])

    def _summary_session(self, tr: Any) -> None:
        from ._analysis import load

        paths = [self.session_path]
        if not self.records_here:
            import glob

            root, ext = os.path.splitext(self.session_path or "")
            paths = sorted(glob.glob(f"{glob.escape(root)}.gw*{ext or '.ocl'}"))
            if not paths:
                tr.write_line("xdist: each worker records its own session trace, PATH.gwN.ocl; none was found")
                return
        problems = [("session", self.session_error, self.session_notes)]
        for path in paths:
            try:
                trace = load(path)
                rows, notes = _quietly(trace.stats)
            except Exception as e:  # noqa: BLE001 - said below, with the recording's own error if any
                problems.append(("session", f"reading {path}: {type(e).__name__}: {e}", []))
                continue
            self.session_notes += notes
            info = trace.info()
            tr.write_line(f"session recorded into {path}: {info['events']:,} events ({info['mode']} mode), "
                          f"{info['duration_s']:.3f} s: python -m ocular stats {path}")
            rows = [x for x in rows if not x["file"].startswith(_FRAMEWORK)]
            rows.sort(key=lambda x: -x["exclusive_ms"])
            tr.write_line(f"  {'calls':>9} {'excl ms':>10}  function  file:line")
            for x in rows[:5]:
                mark = "~" if x["estimated"] else " "
                tr.write_line(f"  {x['calls']:>9} {mark}{x['exclusive_ms']:>9.3f}  {x['function']}  "
                              f"{self._where(x['file'])}:{x['line']}")
        self._problems(tr, problems)

    def _problems(self, tr: Any, entries: list[tuple[str, str | None, list[str]]]) -> None:
        errors = [(who, e) for who, e, _ in entries if e]
        notes = [(who, n) for who, _, ns in entries for n in ns]
        if errors:
            tr.write_line(f"recording errors ({len(errors)}; the tests' outcomes are their own):", yellow=True,
                          bold=True)
            for who, e in errors:
                tr.write_line(f"  {who}: {e}", yellow=True)
        for who, n in notes[:10]:
            tr.write_line(f"  note: {who}: {n}")
        if len(notes) > 10:
            tr.write_line(f"  ... and {len(notes) - 10} more notes")

    def _phase_text(self) -> str:
        return "call phase" if self.phases == "call" else "setup, call and teardown"

    def _where(self, file: str) -> str:
        root = str(self.config.rootpath) + os.sep
        return file[len(root):] if file.startswith(root) else file
