"""``ocular.load()``: a recorded trace analyzed by the Rust analyzer inside the extension.

The reports are Python dicts and lists; the tables are Arrow streams built in Rust and handed to polars
(or pyarrow, for pandas) through the Arrow PyCapsule interface, without copying through text.
"""

from __future__ import annotations

import os
import warnings
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from .errors import MissingDependency, from_native


def _ext():
    from ._recorder import _native

    return _native()


def _need(package: str, what: str):
    try:
        return __import__(package)
    except ImportError:
        raise MissingDependency(
            f"{what} needs the optional package {package!r}, which is not installed: pip install {package}"
        ) from None


class Trace:
    """An ``.ocl`` file, ready to be analyzed. Made by :func:`ocular.load`.

    - ``info()``, ``hot(top=10)``, ``stats()``: the reports of ``ocular-analyze info|hot|stats --json``.
    - ``events()``, ``calls()``, ``code()``, ``lost()``, ``lines()``, ``coroutines()``, ``tasks()``: polars DataFrames (the columns of ``ocular-analyze export
      --parquet``; text columns are categorical); ``events_pandas()`` and friends: the same as pandas.
    """

    def __init__(self, path: str | os.PathLike[str], salvage: bool = False):
        self.path = os.fspath(path)
        self.salvage = salvage
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"no such trace: {self.path}")
        self._info = _call(_ext().info, self.path, salvage=salvage)
        # Each analysis is made once per state of the file: repeated calls (and counters(), which reads
        # stats()) reuse it, and a file still growing (a live or unfinished recording) is read again.
        self._cache: dict[tuple, Any] = {}
        self._cached_for: tuple[int, int] | None = None

    def _cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        st = os.stat(self.path)
        state = (st.st_mtime_ns, st.st_size)
        if state != self._cached_for:
            self._cache.clear()
            self._cached_for = state
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def __repr__(self) -> str:
        i = self._info
        return (f"<ocular.Trace {self.path!r}: Python {i['python_version']}, {i['mode']} mode, "
                f"{i['events']:,} events, {len(i['threads'])} thread{'' if len(i['threads']) == 1 else 's'}>")

    def _repr_html_(self) -> str:
        """The essentials, inline in Jupyter: the run's facts, which figures are estimates, the top
        functions by exclusive time, the hottest loops."""
        from ._ipython import trace_html

        return trace_html(self)

    def info(self) -> dict[str, Any]:
        """Format version, Python version, mode, duration, threads, events by kind, size, lost events."""
        return self._info

    def hot(self, top: int = 10) -> dict[str, Any]:
        """The ``top`` hottest loops: function, file, lines, iterations, ns per iteration, and the body
        disassembled (base -> specialized opcode, cost per instruction). ``str()`` of it is the text report;
        see :meth:`hot_text`."""
        import copy

        return copy.deepcopy(self._hot_pass(top)[0])  # the caller may edit it; the cache stays as computed

    def hot_text(self, top: int = 10) -> str:
        """The hot-loop report as ``ocular-analyze hot`` prints it."""
        return self._hot_pass(top)[1]

    def _hot_pass(self, top: int) -> tuple:
        def make() -> tuple:
            report, text, warns = _call(_ext().hot, self.path, top, salvage=self.salvage)
            _warn(warns)
            return report, text

        return self._cached(("hot", top), make)  # one analysis serves hot() and hot_text()

    def stats(self, per_thread: bool = False, span: str | None = None) -> list[dict[str, Any]]:
        """Per function: calls, inclusive and exclusive ms (recorder cost subtracted), mean us, file:line.

        With ``span``, only the time inside the spans of that name (``stats --span``): per function its
        calls begun inside them, its exclusive and inclusive ms inside them with their 95% intervals
        (``exclusive_ci_ms``, ``inclusive_ci_ms``) and ``share`` of the program's time inside them."""
        if span is not None:
            if per_thread:
                raise ValueError("stats(span=...) merges threads: per_thread=True cannot go with it")

            def within() -> list[dict[str, Any]]:
                report, warns = _call(_ext().stats_within, self.path, span, salvage=self.salvage)
                _warn(warns)
                return report["rows"]

            return _copy_rows(self._cached(("stats", "span", span), within))

        def make() -> list[dict[str, Any]]:
            rows, warns = _call(_ext().stats, self.path, per_thread=per_thread, salvage=self.salvage)
            _warn(warns)
            return rows

        return _copy_rows(self._cached(("stats", per_thread), make))  # the caller may edit its rows

    def _arrow(self, name: str, select: dict):
        def make():
            try:
                table, warns = _call(_ext().table, self.path, name, salvage=self.salvage, **select)
            except MemoryError as e:
                raise MemoryError(str(e)) from None  # the message says what to do; no Rust frames to show
            _warn(warns)
            return table

        if name in _PER_EVENT:
            return make()  # one row per event or call: kept, it would hold the memory of a second copy
        # Arrow tables are immutable: polars and pandas each build their own frame from the one kept.
        return self._cached(("table", name), make)

    def _polars(self, name: str, **select):
        pl = _need("polars", f"Trace.{name}()")
        return pl.DataFrame(self._arrow(name, select))

    def _pandas(self, name: str, **select):
        _need("pandas", f"Trace.{name}_pandas()")
        pa = _need("pyarrow", f"Trace.{name}_pandas()")
        return pa.table(self._arrow(name, select)).to_pandas()

    def events(self, columns: list[str] | None = None, threads: list[int] | None = None,
               start_ns: int | None = None, end_ns: int | None = None):
        """One row per event: thread_id, ts_ns, tsc, event, code_id, function, file, line, offset, arg,
        opcode, specialized (polars DataFrame).

        A DataFrame takes ~60 bytes per event with every column. ``columns`` keeps those named,
        ``threads`` (native ids) and ``start_ns``/``end_ns`` (``ts_ns``, since the recording started)
        keep those rows: the others are never built. One that would not fit in memory raises
        ``MemoryError`` (saying how much it needs) instead of ending the process."""
        return self._polars("events", columns=columns, threads=threads, start_ns=start_ns, end_ns=end_ns)

    def calls(self, columns: list[str] | None = None, threads: list[int] | None = None,
              start_ns: int | None = None, end_ns: int | None = None):
        """One row per function call: thread_id, call_id, parent, depth, code_id, function, file, line,
        start_ns, end_ns, duration_ns, exclusive_ns, window, clipped, span (the key of the innermost span it
        began inside, as in :meth:`spans`; null: none) (polars DataFrame). ``columns``,
        ``threads`` and the time range select as in :meth:`events` (a call is kept if it overlaps the
        range)."""
        return self._polars("calls", columns=columns, threads=threads, start_ns=start_ns, end_ns=end_ns)

    def code(self):
        """One row per code object: code_id, function, name, file, first_line, last_line, instructions,
        bytecode, specialized_bytecode (polars DataFrame)."""
        return self._polars("code")

    def lost(self):
        """One row per stretch of events the recorder dropped (it had no free buffer): thread_id,
        thread_lost and thread_recorded (the thread's totals), start_ns, end_ns. Empty when nothing was lost,
        which ``info()["lost_events"]`` also says (polars DataFrame)."""
        return self._polars("lost")

    def counters(self, per_thread: bool = False):
        """Performance counters (recorded with ``counters=``) per function: one row per function and
        counter with thread_id (0: merged), function, file, line, calls, counter, value (the counter's
        events in the function itself: its samples' periods; ns for task-clock) and per_call (polars
        DataFrame). Empty when the recording had no counters; ``info()["counters"]`` says what was sampled,
        lost, or could not be opened."""
        pl = _need("polars", "Trace.counters()")
        rows = []
        for r in self.stats(per_thread=per_thread):
            for name, value in r.get("counters", []):
                rows.append({"thread_id": r["thread_id"], "function": r["function"], "file": r["file"],
                             "line": r["line"], "calls": r["calls"], "counter": name, "value": value,
                             "per_call": value / r["calls"] if r["calls"] else None})
        schema = {"thread_id": pl.UInt64, "function": pl.String, "file": pl.String, "line": pl.UInt32,
                  "calls": pl.UInt64, "counter": pl.String, "value": pl.UInt64, "per_call": pl.Float64}
        return pl.DataFrame(rows, schema=schema).sort(["counter", "value"], descending=[False, True])

    def counter_samples(self, columns: list[str] | None = None, threads: list[int] | None = None,
                        start_ns: int | None = None, end_ns: int | None = None):
        """One row per performance counter sample (recorded with ``counters=``): thread_id, ts_ns, counter,
        value (the counter's events in the sample: its period; ns for task-clock), call_id and function (the
        innermost call running on the thread then, as :meth:`calls` numbers it; null when none was).
        Join it to :meth:`calls` on thread_id and call_id for any grouping :meth:`counters` does not give.
        ``columns``, ``threads`` and the time range select as in :meth:`events` (polars DataFrame)."""
        return self._polars("counter_samples", columns=columns, threads=threads, start_ns=start_ns, end_ns=end_ns)

    def lines(self):
        """One row per source line that ran, hottest first: pid, file, line, function, hits, own_ns (the
        line's own time: recorder cost and recorded Python callees removed) and estimated (the function was
        seen in part, past the de-instrumentation threshold or between windows: its figures are lower
        bounds). What ``ocular-analyze stats --lines`` shows; empty for a calls-mode trace, which records no
        lines (polars DataFrame)."""
        return self._polars("lines")

    def functions(self):
        """One row per function, most exclusive time first, threads merged: pid, function, file, line,
        calls, inclusive_ns, exclusive_ns, and for estimates (the default mode's figures past its first
        window: ``estimated``, ``calls_estimated``) the half widths of their 95% intervals calls_ci95,
        inclusive_ci95_ns and exclusive_ci95_ns (times carry the uncertainty of the recorder's cost taken out
        of them in every mode); calls_lower_bound and times_lower_bound mark figures that
        are only lower bounds (no window saw the function). What ``ocular-analyze stats`` shows (polars
        DataFrame)."""
        return self._polars("functions")

    def functions_pandas(self):
        """:meth:`functions` as a pandas DataFrame (needs pandas and pyarrow)."""
        return self._pandas("functions")

    def coroutines(self):
        """One row per coroutine function (``async def``), longest first: pid, function, file, line, calls,
        steps (starts and resumptions), tasks (instances the event loop ran as a task's coroutine), and its
        instances' time running_ns (inclusive of what they called and awaited while running), awaiting_ns
        (suspended, what it awaited not done) and ready_ns (suspended, ready, waiting for the event loop).
        What ``ocular-analyze stats --async`` shows (polars DataFrame)."""
        return self._polars("coroutines")

    def tasks(self):
        """One row per asyncio task, longest first: pid, thread_id, function (its coroutine), ordinal (1 for
        that function's first task), created_ns (ready for its first turn), started_ns, ended_ns (null if
        it outlived the recording; times from the recording's start, as in :meth:`events`), steps,
        running_ns, awaiting_ns and ready_ns (polars DataFrame)."""
        return self._polars("tasks")

    def spans(self):
        """One row per span (``ocular.span``, OpenTelemetry's through ``ocular.otel``): pid, key, name,
        thread_id, start_ns, end_ns and duration_ns (null if it was still open at the end; times from the
        recording's start, as in :meth:`events`), trace_id, span_id, parent_span_id (hex text, null where
        none), parent (the key of the span enclosing it, 0: none), status (unset, ok, error), message and
        attributes (a JSON object) (polars DataFrame)."""
        return self._polars("spans")

    def events_pandas(self, **select):
        """:meth:`events` as a pandas DataFrame (needs pandas and pyarrow); the same selection."""
        return self._pandas("events", **select)

    def calls_pandas(self, **select):
        """:meth:`calls` as a pandas DataFrame (needs pandas and pyarrow); the same selection."""
        return self._pandas("calls", **select)

    def code_pandas(self):
        """:meth:`code` as a pandas DataFrame (needs pandas and pyarrow)."""
        return self._pandas("code")


# Tables with a row per event, call or sample: analysed again on each call rather than kept.
_PER_EVENT = frozenset({"events", "calls", "counter_samples"})


def _call(f, *args, **kwargs):
    try:
        return f(*args, **kwargs)
    except OSError as e:
        raise from_native(e) from None


def _warn(warns):
    for w in warns:
        warnings.warn(w, stacklevel=3)


def _copy_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the caller's own (the cache keeps the analysis as made): a dict per row, and any list or
    dict in one copied too. copy.deepcopy took 0.85 ms for a test's 44 rows, more than analysing its trace."""
    import copy

    return [{k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v for k, v in r.items()} for r in rows]


def stats_rows_many(paths: list[str], leave_out: tuple[str, ...] = ()
                    ) -> list[tuple[list[dict[str, Any]], list[str], float] | Exception]:
    """``load(path).stats()`` of each trace without the Trace (its info read, its cache, the copy), read on
    every core at once: per path, (rows, the reader's warnings as messages, the largest inclusive ms of any
    row) or the error reading it raised. Rows whose file begins with one of ``leave_out`` are left out (but
    count for the largest inclusive time). For the pytest plugin's summary, which reads one per test."""
    return _many(paths, lambda there: _ext().stats_many(there, list(leave_out)))


class StatsReadAhead:
    """``stats_rows_many(paths, leave_out)``, each trace read as soon as it is ``push``ed, by a native
    thread at the lowest priority (it takes only time a core would leave idle); ``take(paths)`` reads what
    is left on every core. The pytest plugin pushes each test's trace as the test ends."""

    def __init__(self, leave_out: tuple[str, ...] = ()) -> None:
        self._leave_out = leave_out
        self._queue = _ext().StatsQueue(list(leave_out))
        # A forked child (pytest-forked runs each test in one) has a copy of the queue but not its thread.
        self._pid = os.getpid()

    def push(self, path: str) -> None:
        if os.getpid() == self._pid:
            self._queue.push(os.fspath(path))

    def take(self, paths: list[str]) -> list[tuple[list[dict[str, Any]], list[str], float] | Exception]:
        if os.getpid() != self._pid:
            return stats_rows_many(paths, self._leave_out)
        return _many(paths, self._queue.take)


def _many(paths: list[str], read: "Callable[[list[str]], list[Any]]") -> list[Any]:
    out: list[Any] = [FileNotFoundError(f"no such trace: {p}") for p in paths]
    there = [i for i, p in enumerate(paths) if os.path.exists(p)]
    for i, r in zip(there, read([os.fspath(paths[i]) for i in there])):
        out[i] = from_native(r) if isinstance(r, OSError) else r
    return out


def load(path: str | os.PathLike[str], salvage: bool = False) -> Trace:
    """Open a recorded ``.ocl`` file for analysis: ``ocular.load("run.ocl").hot()``.

    A truncated file is analyzed up to its last whole chunk (with a warning); ``salvage=True`` also skips
    damaged chunks in the middle. A missing, foreign or corrupt file raises an error naming it.
    """
    return Trace(path, salvage)
