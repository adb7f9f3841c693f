"""Recording: claims a sys.monitoring tool id, calibrates, starts the native recorder, stops it cleanly."""

from __future__ import annotations

import _signal  # signal's C module: signal.py would import enum (2 ms) for names Ocular does not use
import _thread  # threading's C module: threading is the program's to import (~1.5 ms of every run's start)
import atexit
import os
import sys

# typing costs ~10 ms of import, paid by every `python -m ocular run`: only for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, TypeVar

    from ._live import Cursor
    from ._ocular import _StartOptions

from . import _interp
from .errors import AlreadyRecording, ToolIdInUse

__all__ = ["Recording", "record", "MODES"]

MODES = ("calls", "adaptive", "precise")
VERSION = "0.1.0"

# Function boundaries: what every mode records, so the call tree is always complete.
_CALL_EVENTS = ("PY_START", "PY_RESUME", "PY_RETURN", "PY_YIELD", "PY_UNWIND", "PY_THROW")
# Calls of C functions (FORMAT.md 5.4), with c_calls: function boundaries too.
_C_EVENTS = ("CALL", "C_RETURN", "C_RAISE")

if TYPE_CHECKING:
    F = TypeVar("F", bound=Callable[..., Any])

# Ocular's own Python code (this package) is never recorded.
_OWN_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep

# Set by `ocular run` around its start and stop (the command's name): the recorder's warnings are then shown as
# `ocular: warning: ...`, not at the first frame outside Ocular, which is a line of runpy or of the command.
_warnings_as: str | None = None


def _warn_user(message: str) -> None:
    """A RuntimeWarning of the recorder, at the user's code that started or stopped the recording; warnings is
    imported only when there is one to give."""
    import warnings

    if _warnings_as is None:
        warnings.warn(message, RuntimeWarning, skip_file_prefixes=(_OWN_CODE,))
        return
    prog = _warnings_as

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        print(f"{prog}: warning: {message}", file=sys.stderr if file is None else file)

    saved, warnings.showwarning = warnings.showwarning, show
    try:
        warnings.warn(message, RuntimeWarning, skip_file_prefixes=(_OWN_CODE,))
    finally:
        warnings.showwarning = saved

_active: "Recording | None" = None
_fork_hook_installed = False


def _in_main_thread() -> bool:
    """Whether the calling thread is the main one, without importing `threading` for it."""
    threading = sys.modules.get("threading")
    if threading is not None:
        return threading.current_thread() is threading.main_thread()
    main = getattr(_thread, "_get_main_thread_ident", None)  # 3.13+
    if main is not None:
        return _thread.get_ident() == main()
    # 3.12: with no thread started (`threading` would have been imported to start one), this is the main one.
    return _thread._count() == 0  # type: ignore[attr-defined]


def _main_thread() -> tuple[int, str]:
    """The main thread's native id and name."""
    threading = sys.modules.get("threading")
    if threading is None and _in_main_thread():
        return _thread.get_native_id(), "MainThread"  # the name threading gives it when imported
    import threading

    main = threading.main_thread()
    return main.native_id or 0, main.name


def _thread_names() -> dict[int, str]:
    """The names of the threads `threading` knows (none if the program never imported it)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return {}
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _boot_code() -> Any:
    """`threading.Thread._bootstrap`'s code, where a thread started by threading begins: None if the program
    has not imported threading (the recorder then knows it by its name when it first runs)."""
    threading = sys.modules.get("threading")
    return None if threading is None else threading.Thread._bootstrap.__code__


# The extension once loaded, and a clock point read then: the far end of the span the tick rate is
# measured over (Recording._calibration).
_extension: Any = None
_loaded_at: tuple[int, int, int] | None = None


def _native():
    global _extension, _loaded_at
    if _extension is None:
        from . import _ocular  # imported late so that `import ocular` works for errors on unsupported Pythons

        _loaded_at = _ocular.clock_point()
        _extension = _ocular
    return _extension


def event_names(mode: str, c_calls: bool = False) -> list[str]:
    """The sys.monitoring events a mode enables (only events Ocular has a callback for), with calls of C
    functions if asked."""
    names = list(_CALL_EVENTS)
    if c_calls:
        names += _C_EVENTS
    if mode == "adaptive":
        if hasattr(sys.monitoring.events, "BRANCH_LEFT"):  # 3.14+
            names += ["JUMP", "BRANCH_LEFT", "BRANCH_RIGHT"]
        else:
            names += ["JUMP", "BRANCH"]
    elif mode == "precise":
        names.append("INSTRUCTION")
    return names


def _mask(names: Iterable[str]) -> int:
    m = 0
    for n in names:
        m |= getattr(sys.monitoring.events, n)
    return m


def claim_tool_id() -> tuple[int, str | None]:
    """Tool id 3 if free, else 4, else sys.monitoring.PROFILER_ID (2), with a note saying so; ToolIdInUse
    when all three are taken. 3 and 4 are ids no tool of the standard library claims: with PROFILER_ID,
    cProfile or profile started while Ocular records would fail ("Another profiling tool is already
    active"). Never 0 (debugger), 1 (coverage) or 5 (optimizer)."""
    mon = sys.monitoring
    for tid in (3, 4):
        if mon.get_tool(tid) is None:
            mon.use_tool_id(tid, "ocular")
            return tid, None
    if mon.get_tool(mon.PROFILER_ID) is None:
        mon.use_tool_id(mon.PROFILER_ID, "ocular")
        return mon.PROFILER_ID, (
            f"tool id 3 is in use by {mon.get_tool(3)!r} and tool id 4 by {mon.get_tool(4)!r}; Ocular records "
            f"with sys.monitoring.PROFILER_ID ({mon.PROFILER_ID}) instead, so cProfile cannot start until it stops"
        )
    raise ToolIdInUse(
        f"cannot record: tool id 3 is in use by {mon.get_tool(3)!r}, tool id 4 by {mon.get_tool(4)!r} and "
        f"sys.monitoring.PROFILER_ID ({mon.PROFILER_ID}) by {mon.get_tool(mon.PROFILER_ID)!r}; stop one of them "
        f"first"
    )


def release_tool_id(tool: int, names: Iterable[str]) -> None:
    """Undo everything done with the tool id, so that the next tool to take it sees every event. Called
    however a recording ends (stop, an error while starting, a forked child), after the native recorder
    has stopped: nothing of Ocular may switch a location off after the restart below."""
    mon = sys.monitoring
    # free_tool_id alone does not clear events or callbacks on 3.12 and 3.13.
    mon.set_events(tool, 0)
    for n in names:
        mon.register_callback(tool, getattr(mon.events, n), None)
    if hasattr(mon, "clear_tool_id"):  # 3.14+: also the tool's local events and any other callback
        mon.clear_tool_id(tool)
    # The locations our callbacks switched off (DISABLE) stay off for the tool id: CPython re-instruments a
    # code object from the difference between the events before and now, so one not run between our stop
    # and the next tool's set_events keeps them (cProfile started afterwards saw 0 of 30,000 calls of a
    # function recorded before). Neither free_tool_id nor 3.14's clear_tool_id resets them; restart_events()
    # does, for every tool of the process: one that returns DISABLE too (coverage.py) gets one more callback
    # per location it had switched off and meets again (docs/recording.md, "Tool id").
    mon.restart_events()
    mon.free_tool_id(tool)


# CPython warns at every os.fork() of a process with more than one thread ("This process is
# multi-threaded, use of fork() may lead to deadlocks in the child"), counting the OS's threads: Ocular's
# writer and windows threads made every fork of a single-threaded program warn. They are safe across a
# fork: the child never touches them nor anything they lock (it drops the recording, see below). So while
# the program itself has no other thread, that one warning is filtered out; a program with threads of its
# own gets it as it would without Ocular. CPython warns after the fork hooks have run, so the filter is
# set (or removed) before each fork, and removed when the recording stops.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks in the child"
_fork_filter: Any = None


def _quiet_fork_warning(quiet: bool) -> None:
    global _fork_filter
    if quiet == (_fork_filter is not None):
        return  # nothing to change: warnings is not even imported for it
    import warnings

    if quiet:
        warnings.filterwarnings("ignore", message=_FORK_WARNING, category=DeprecationWarning)
        _fork_filter = warnings.filters[0]
    else:
        entry, _fork_filter = _fork_filter, None
        try:
            warnings.filters.remove(entry)
        except ValueError:
            return  # the program reset the filters itself
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()


def _before_fork() -> None:
    # A stopped recording's ring is given back on a thread of its own: done before the fork, which would
    # otherwise find the process multi-threaded (and Python warn of it) only because of Ocular.
    _native().finish_unmapping()
    threading = sys.modules.get("threading")
    alone = threading.active_count() == 1 if threading is not None else _thread._count() == 0  # type: ignore[attr-defined]
    _quiet_fork_warning(_active is not None and alone)


def _after_fork_in_child() -> None:
    global _active
    _quiet_fork_warning(False)
    rec = _active
    if rec is None:
        return
    # The child must not write the parent's file: drop its recording without touching the file.
    _native().abandon_after_fork()
    try:
        release_tool_id(rec.tool_id, rec._events)
    except Exception:  # noqa: BLE001 - best effort in a forked child
        pass
    rec._running = False
    rec._run = None  # the parent's run: its environment stays, for the child's own children
    _active = None
    if _signal.getsignal(_signal.SIGTERM) is _sigterm:
        # The fork gave the child SIGTERM's default action back (own_sigterm): say so to Python too; the
        # child's own recording installs Ocular's handler again.
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    config = rec._follow_config
    if config is not None:
        # Following: the child records on into its own file of the run.
        from . import _follow

        try:
            _follow.start_child(config, started="fork", parent_pid=os.getppid())
        except Exception as e:  # noqa: BLE001 - the child runs on unrecorded, and the run says why
            _follow.unrecorded(config, f"starting the recording after fork failed: {type(e).__name__}: {e}")


# Calibration pairs (untraced run, traced run) per measurement.
PAIRS = 13


def _callbacks(threshold: int, mode: str, sampled: bool = True) -> dict:
    """The native callbacks for a threshold: the gapless set has no per-location counter at all. Calls
    mode records every call whatever the threshold (it has no locations to thin out). Unsampled, with a
    threshold, locations are thinned out and function boundaries (and C calls) recorded every time."""
    nat = _native()
    if threshold == 0 or mode == "calls":
        return nat.callbacks_gapless
    if sampled:
        return nat.callbacks
    gapless = nat.callbacks_gapless
    every_time = (*_CALL_EVENTS, *_C_EVENTS)
    return {name: (gapless[name] if name in every_time else cb) for name, cb in nat.callbacks.items()}


# Event kind numbers of the file format (FORMAT.md 5.1).
_KIND = {"PY_START": 0, "PY_RESUME": 1, "PY_RETURN": 2, "PY_YIELD": 3, "CALL": 4, "INSTRUCTION": 6, "JUMP": 7,
         "BRANCH": 8, "PY_UNWIND": 12, "PY_THROW": 13, "C_RETURN": 15, "C_RAISE": 16, "BRANCH_LEFT": 17,
         "BRANCH_RIGHT": 18}


def calibration(mode: str, tool: int, threshold: int, buffer_events: int,
                c_calls: bool = False, sampled: bool = True) -> tuple[float, list[tuple[int, float]]]:
    """The recorder's cost per event kind, in ticks: (cost of the mode's jump/branch/instruction events, or
    of call events in calls mode; [(kind, ticks)] for every kind the mode records). Call events and location
    events are measured separately: a call event disturbs the interpreter more than a jump does. With
    c_calls, a Python call also costs its CALL event, which is not recorded: the call events' cost is
    measured with it on, so it is subtracted with theirs; the C events' cost is measured on a call of a
    built-in."""
    global _speed_probe
    _speed_probe = None  # this recording's own, set by the calls calibration
    call = _calibrate("calls", tool, threshold, buffer_events, c_calls)
    location = call if mode == "calls" else _calibrate(mode, tool, threshold, buffer_events)
    # With the recording's own callbacks: the windowed set in adaptive and precise mode with a threshold.
    c_call = (_calibrate("c_calls", tool, threshold, buffer_events, rec_mode=mode, sampled=sampled)
              if c_calls else call)
    costs = [(_KIND[n], call if n in _CALL_EVENTS else c_call if n in _C_EVENTS else location)
             for n in event_names(mode, c_calls) if n in _KIND]
    if _speed_probe is not None:
        costs.append((_SPEED_START, _speed_probe[2]))
    if sampled and mode != "calls" and threshold > 0:
        # Windows re-arm every code object: the cost of instrumenting one again (FORMAT.md 6.6).
        per_code, per_byte = _calibrate_instrument(mode, tool, threshold, buffer_events)
        costs += [(_INSTRUMENT_CODE, per_code), (_INSTRUMENT_BYTE, per_byte)]
    return location, costs


# Pseudo-kinds of the calibration (FORMAT.md 6.6, since 2.11): instrumenting a code object, per object and
# per byte of bytecode.
_INSTRUMENT_CODE = 250
_INSTRUMENT_BYTE = 251
# Since 2.12: ticks per iteration of the calls calibration's loop without the recorder, at the start and at
# the stop.
_SPEED_START = 252
_SPEED_STOP = 253


def _discard_options(mode: str, threshold: int, buffer_events: int) -> _StartOptions:
    """Options of a calibration's recording: the recording's callbacks, into nothing, with small buffers."""
    return {
        "mode": mode, "threshold": threshold, "include_only": [], "exclude": [],
        "buffer_events": min(buffer_events, 8192), "max_buffers": 2, "event_cost_ticks": 0.0,
        "thread_name": _interp.boot_thread_name, "boot_code": _interp.boot_thread_name.__code__,
        "main_native_id": _thread.get_native_id(), "main_name": "", "internal": [],
    }


def _calibrate_instrument(mode: str, tool: int, threshold: int, buffer_events: int) -> tuple[float, float]:
    """What the interpreter spends, in ticks, instrumenting a code object at its first call after its events
    were re-armed (a window's sys.monitoring.restart_events() re-arms every code object, and each one the
    window calls is instrumented again then, before its first event), as per object + per byte of
    bytecode: after a restart, the first call less the second of copies of a small and a large function
    already run with the recording's events and callbacks on, less the same difference with them off."""
    nat = _native()
    mon = sys.monitoring
    ns: dict[str, Any] = {}
    exec(compile("def small(x):\n    return x\n"
                 # Ordinary code: a branch every few statements, as most functions have.
                 "def large(x):\n" + "".join(f"    a = x + {i}\n    b = (a, x)\n    c = len(b) * a\n"
                                               f"    if c > {i}:\n        x = x - 1\n" for i in range(16))
                 + "    return x\n", "<ocular calibration>", "exec"), ns)
    function = type(_calibrate_instrument)
    ticks = nat.ticks

    def fresh(f: Callable[[int], int], k: int) -> Callable[[int], int]:
        return function(f.__code__.replace(co_name=f"{f.__name__}{k}"), {})

    def differences(k0: int) -> list[list[int]]:
        out: list[list[int]] = [[], []]
        for k in range(k0, k0 + 15):
            for j, f in enumerate((ns["small"], ns["large"])):
                g = fresh(f, k)
                # Instrumented once (its monitoring data made), then re-armed as a window re-arms it.
                g(0)
                g(0)
                mon.restart_events()
                t0 = ticks()
                g(0)
                t1 = ticks()
                g(0)
                t2 = ticks()
                out[j].append((t1 - t0) - (t2 - t1))
        return out

    names = [n for n in event_names(mode) if n in _KIND]
    callbacks = _callbacks(2**32 - 1, mode)
    off = differences(0)
    nat.start(None, {}, _discard_options(mode, 2**32 - 1, buffer_events))
    try:
        for n in names:
            mon.register_callback(tool, getattr(mon.events, n), callbacks[n])
        mon.set_events(tool, _mask(names))
        on = differences(100)
    finally:
        mon.set_events(tool, 0)
        nat.stop({})
        for n in names:
            mon.register_callback(tool, getattr(mon.events, n), None)

    def median(xs: list[int]) -> float:
        xs = sorted(xs)
        return float(xs[len(xs) // 2])

    small, large = (max(0.0, median(on[j]) - median(off[j])) for j in (0, 1))
    sizes = len(ns["small"].__code__.co_code), len(ns["large"].__code__.co_code)
    per_byte = max(0.0, (large - small) / (sizes[1] - sizes[0]))
    return max(0.0, small - per_byte * sizes[0]), per_byte


def _calibrate(mode: str, tool: int, threshold: int, buffer_events: int, c_calls: bool = False,
               rec_mode: str = "calls", sampled: bool = True) -> float:
    """The recorder's own cost per event, in ticks, for the events `mode` adds (calls: PY_START and
    PY_RETURN of a called function, and its unrecorded CALL with `c_calls`; "c_calls": CALL and C_RETURN of
    a built-in called): a short loop timed without and with Ocular's real callbacks on it (recording into
    nothing), minimum of several runs each."""
    nat = _native()
    mon = sys.monitoring

    def target() -> None:
        pass

    if mode == "calls":
        target, run = _calls_loop()
        code, names = target.__code__, ["PY_START", "PY_RETURN"]
        if c_calls:
            codes_names = [(code, names), (run.__code__, ["CALL"])]
    elif mode == "c_calls":

        def run(n: int, f: Callable[[], Any] = int) -> None:
            for _ in range(n):
                f()

        code, names = run.__code__, ["CALL", "C_RETURN", "C_RAISE"]  # CPython sets the last two together
    else:

        def run(n: int, f: Callable[[], None] = target) -> None:
            for _ in range(n):
                pass

        code = run.__code__
        names = ["INSTRUCTION"] if mode == "precise" else [n for n in event_names("adaptive") if n not in _CALL_EVENTS]

    if mode != "calls" or not c_calls:
        codes_names = [(code, names)]
    n = max(100, min(600, buffer_events // 4))
    once = _timed(run, n)
    for _ in range(3):
        once()  # warm up: let the interpreter specialize the loop
    callbacks = _callbacks(threshold, rec_mode if mode == "c_calls" else mode, sampled)
    # The same callbacks as the recording, with a threshold that is never reached.
    never = 0 if threshold == 0 else 2**32 - 1
    # Small buffers: the calibration records a few thousand events into nothing.
    nat.start(None, {}, _discard_options("calls" if mode == "c_calls" else mode, never, buffer_events))
    # Untraced and traced runs alternate, and the median of the pairs' differences is the cost: a slow
    # moment of the machine then shifts one pair, not a whole phase of the measurement.
    diffs = []
    bases = []
    try:
        for _, ns in codes_names:
            for name in ns:
                mon.register_callback(tool, getattr(mon.events, name), callbacks[name])
        for _ in range(PAIRS):
            base = once()
            for c, ns in codes_names:
                mon.set_local_events(tool, c, _mask(ns))
            traced = once()
            for c, _ in codes_names:
                mon.set_local_events(tool, c, 0)
            diffs.append(traced - base)
            bases.append(base)
    finally:
        out = nat.stop({})
        for _, ns in codes_names:
            for name in ns:
                mon.register_callback(tool, getattr(mon.events, name), None)
    per_run = out["events"] / PAIRS
    if per_run <= 0:
        return 0.0
    if mode == "calls":
        global _speed_probe
        bases.sort()
        _speed_probe = (once, n, bases[len(bases) // 2] / n)
    diffs.sort()
    return max(0.0, diffs[len(diffs) // 2] / per_run)


def _calls_loop() -> tuple[Callable[[], None], Callable[..., None]]:
    """The calls calibration's loop: (an empty function, a loop calling it n times)."""

    def target() -> None:
        pass

    def run(n: int, f: Callable[[], None] = target) -> None:
        for _ in range(n):
            f()

    return target, run


def _timed(run: Callable[[int], None], n: int) -> Callable[[], int]:
    """`run(n)` timed in ticks."""
    ticks = _native().ticks

    def once() -> int:
        t0 = ticks()
        run(n)
        return ticks() - t0

    return once


_INF = float("inf")


def handed_down_calibration(key: tuple) -> dict | None:
    """This process's calibration for the settings `key`, for the Python children a followed run starts
    (``OCULAR_FOLLOW``): they run the same interpreter on the same machine, and would spend ~1 ms of their
    start measuring it again. Their stops time the speed probe against its ticks per iteration here."""
    known = _calibrations.get(key)
    if known is None or known[3] is None:
        return None
    cost, per_kind, hz, (_, n, base) = known
    if not all(-_INF < x < _INF for x in (cost, hz, base, *(c for _, c in per_kind))):
        return None  # not JSON (a NaN or an infinity): the children measure their own
    return {"python": sys.version, "executable": sys.executable, "recorder": VERSION, "key": list(key),
            "cost": cost, "per_kind": [list(k) for k in per_kind], "hz": hz, "probe": [n, base]}


def take_handed_down_calibration(cal: object) -> None:
    """Takes the calibration a followed run's parent measured (:func:`handed_down_calibration`) if it was
    measured with this interpreter and recorder; else the child measures its own."""
    if not isinstance(cal, dict) or (cal.get("python"), cal.get("executable"), cal.get("recorder")) != (
            sys.version, sys.executable, VERSION):
        return
    try:
        n, base = cal["probe"]
        per_kind = [(int(k), float(c)) for k, c in cal["per_kind"]]
        _calibrations[tuple(cal["key"])] = (float(cal["cost"]), per_kind, float(cal["hz"]),
                                            (_timed(_calls_loop()[1], int(n)), int(n), float(base)))
    except (KeyError, TypeError, ValueError):
        pass


# The calls calibration's loop without the recorder (timed run, iterations) and its ticks per iteration at
# the start: timed again at the stop, it says how much faster or slower the machine ran then (FORMAT.md 6.6).
_speed_probe: tuple[Callable[[], int], int, float] | None = None
# This process's calibrations by the settings they measured (Recording._calibration): (cost of the mode's
# events, cost per kind, ticks per second, the speed probe).
_calibrations: dict[tuple, tuple[float, list[tuple[int, float]], float, Any]] = {}


# How long a calibration kept in the runtime directory serves the next processes (each stop still scales it
# for the machine's speed then): a run that starts after that measures its own, and keeps it in turn.
_KEPT_FOR_S = 600.0


def _kept_calibration_path(key: tuple) -> str | None:
    """Where the calibration for the settings `key` is kept for the next processes of this interpreter."""
    d = _native().runtime_dir()
    if d is None:
        return None
    mode, threshold, buffer_events, c_calls, sampled = key
    return os.path.join(d, f"calibration-{sys.hexversion:x}-{mode}-{int(threshold)}-{int(buffer_events)}-"
                           f"{int(bool(c_calls))}{int(bool(sampled))}.marshal")


def _take_kept_calibration(key: tuple) -> bool:
    """Takes the calibration an earlier process of this interpreter and recorder measured with these
    settings in the last ten minutes (:func:`_keep_calibration`), as a followed child takes its parent's:
    measuring it takes 1-3 ms of every run's start."""
    import marshal
    import time

    path = _kept_calibration_path(key)
    if path is None:
        return False
    try:
        with open(path, "rb") as f:
            age = time.time() - os.fstat(f.fileno()).st_mtime
            if not 0 <= age < _KEPT_FOR_S:
                return False
            cal = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return False
    build = _build()
    if not build or not isinstance(cal, dict) or cal.get("key") != list(key) or cal.get("build") != build:
        return False
    take_handed_down_calibration(cal)
    return key in _calibrations


def _build() -> list:
    """The extension's file, size and time: another build of the recorder (the same version number) has costs
    of its own."""
    path = _native().__file__
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [path, st.st_size, st.st_mtime_ns]


def _keep_calibration(key: tuple) -> None:
    """Keeps this process's calibration for `key` in the runtime directory, for the next processes."""
    cal = handed_down_calibration(key)
    path = _kept_calibration_path(key)
    build = _build()
    if cal is None or path is None or not build:
        return
    cal["build"] = build
    _interp.keep(path, cal)


# A stop's speed reading is taken again only after this many seconds: many short recordings in a row (one
# per test under pytest) would each spend ~0.3 ms measuring what the machine's speed was a moment before.
SPEED_READING_KEPT = 0.25
# (monotonic seconds, the probe it was taken with, ticks per iteration) of the last reading.
_speed_reading: tuple[float, object, float] | None = None


def speed_at_stop() -> list[tuple[int, float]]:
    """[(253, ticks per iteration of the calibration's loop now)] for the stop's calibration chunk, or []
    without a probe. Its events must be off: the loop runs unrecorded, median of seven runs (~0.3 ms); a
    reading with the same probe less than SPEED_READING_KEPT seconds old is taken instead."""
    global _speed_reading
    if _speed_probe is None:
        return []
    import time  # built in, and imported by the interpreter's start already

    now = time.monotonic()
    once, n, _ = _speed_probe
    last = _speed_reading
    if last is not None and last[1] is once and now - last[0] < SPEED_READING_KEPT:
        return [(_SPEED_STOP, last[2])]
    runs = sorted(once() for _ in range(7))
    _speed_reading = (time.monotonic(), once, runs[len(runs) // 2] / n)
    return [(_SPEED_STOP, _speed_reading[2])]


# Default seconds between windows (FORMAT.md 5.3): adaptive mode, and precise mode.
WINDOW_PERIOD = 0.01
PRECISE_WINDOW_PERIOD = 0.05
WINDOW_LENGTH = 0.0005


class Recording:
    """A recording of this process into an .ocl file.

    Use it as a context manager (``with ocular.record("run.ocl"):``), as a decorator (each call of the
    function is recorded), or with ``start()``/``stop()``. After it stops, ``events``, ``lost``,
    ``bytes``, ``threads`` and ``code_objects`` say what was written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "ocular.ocl",
        mode: str = "adaptive",
        deinstrument_threshold: int = 500,
        include_only: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        *,
        buffer_events: int = 65536,
        max_buffers: int = 64,
        on_full: str = "drop",
        ring_file: bool = True,
        ring: int | str | None = None,
        dump_on: int | str | None = None,
        dump_when: Any = None,
        live: bool = False,
        counters: str | Iterable[str] | None = None,
        perf: bool = False,
        sampled: bool = False,
        window_period: float | None = None,
        window_length: float | None = None,
        follow: bool = False,
        c_calls: bool = False,
    ) -> None:
        _interp.check_supported()
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {', '.join(map(repr, MODES))}")
        if not isinstance(deinstrument_threshold, int) or deinstrument_threshold < 0:
            raise ValueError(
                f"deinstrument_threshold must be an int >= 0 (0 = gapless), not {deinstrument_threshold!r}"
            )
        if buffer_events < 1 or max_buffers < 1:
            raise ValueError("buffer_events and max_buffers must be at least 1")
        if on_full not in ("drop", "wait"):
            raise ValueError(f"on_full must be 'drop' or 'wait', not {on_full!r}")
        self.sampled = bool(sampled)
        if self.sampled and (mode == "calls" or deinstrument_threshold == 0):
            raise ValueError(
                "sampled=True (--sampled) samples function boundaries in windows while a threshold thins out jumps: "
                "it needs mode 'adaptive' or 'precise' and deinstrument_threshold above 0"
            )
        if not self.sampled and (window_period is not None or window_length is not None):
            raise ValueError(
                "window_period and window_length set the windows of a sampled recording: pass sampled=True "
                "too (python -m ocular run --sampled)"
            )
        # The windows' seconds, for a sampled recording (None otherwise: a child of the run takes them as given).
        self.window_period: float | None = None
        self.window_length: float | None = None
        if self.sampled:
            if window_length is None:
                window_length = WINDOW_LENGTH
            if window_period is None:
                # Each window re-arms every location switched off since the last one, and in precise mode
                # those are every instruction that ran: windows there are rarer (bench-peers' programs,
                # CPython 3.13: 1.18x at 10 ms, 1.16x at 50 ms, 1.15x with the first window only).
                window_period = PRECISE_WINDOW_PERIOD if mode == "precise" else WINDOW_PERIOD
            if not (0 < window_length <= window_period / 2):
                raise ValueError(
                    f"window_length ({window_length!r} s) must be above 0 and at most half of window_period "
                    f"({window_period!r} s)"
                )
            self.window_period = float(window_period)
            self.window_length = float(window_length)
        self.path = os.fspath(path)
        self.mode = mode
        self.deinstrument_threshold = deinstrument_threshold
        self.include_only = _patterns(include_only)
        self.exclude = _patterns(exclude)
        self.buffer_events = buffer_events
        self.max_buffers = max_buffers
        self.on_full = on_full
        self.ring_file = bool(ring_file)
        self.ring = parse_size(ring) if ring is not None else 0
        self.dump_on = _signal_number(dump_on) if dump_on is not None else None
        if self.dump_on is not None and not self.ring:
            raise ValueError("dump_on needs a flight recorder: give ring= a size too (ring='64MB')")
        if dump_when:
            from . import _spans  # only for rules: a followed child would import it at its start

            self._rules = _spans.rules(dump_when)
        else:
            self._rules = []
        # As text, as the command line gives them (and a followed child takes them).
        self.dump_when = [str(r) for r in self._rules]
        if self._rules and not self.ring:
            raise ValueError("dump_when needs a flight recorder: give ring= a size too (ring='64MB')")
        self.live = bool(live)
        if isinstance(counters, str):
            counters = [c for c in counters.replace(",", " ").split() if c]
        self.counters: list[str] = list(counters or [])
        self.perf = bool(perf)
        if self.perf and not hasattr(sys, "activate_stack_trampoline"):
            raise ValueError("perf=True needs a CPython built with the perf trampoline (Linux x86-64 or aarch64)")
        self._perf_activated = False
        if self.live and not self.ring_file:
            raise ValueError("live=True needs the ring file (ring_file=True): it is what another process reads")
        self.dumped = 0
        self.dropped = 0
        self._old_dump_handler: Any = None
        self.tool_id: int = -1
        self.events = 0
        self.lost = 0
        self.bytes = 0
        self.threads = 0
        self.code_objects = 0
        self.event_cost_ns = 0.0
        self.call_event_cost_ns = 0.0
        self.error: str | None = None
        self.notes: list[str] = []
        self.c_calls = bool(c_calls)
        self._events: list[str] = event_names(mode, self.c_calls)
        self._running = False
        self._old_sigterm: Any = None
        # Following child processes (_follow.py): the run this recording belongs to, and its own part in it.
        self.follow = bool(follow)
        self._follow_config: dict | None = None
        self._process: dict | None = None
        self._run: Any = None
        self._pid = os.getpid()
        # SIGTERM completes the trace, then kills (_sigterm); a followed child keeps the default action.
        self._handle_sigterm = True
        self.completed_children = 0
        self.children = 0
        self.children_events = 0
        self.unrecorded_children: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "Recording":
        global _active, _fork_hook_installed
        _interp.check_supported()
        if _active is not None or _native().is_recording():
            raise AlreadyRecording(
                f"Ocular is already recording to {_active.path if _active else '?'}; stop it before starting another"
            )
        nat = _native()
        mon = sys.monitoring
        tool, note = claim_tool_id()
        if note:
            self.notes.append(note)
            _warn_user(note)
        self.tool_id = tool
        self._pid = os.getpid()
        if self.follow and self._follow_config is None:
            # The run's first process: its children's directory, and the environment that new interpreters
            # follow (put back at stop).
            from . import _follow

            self._run = _follow.Run(self)
            self._follow_config = self._run.config
            self._process = _follow.process_info(self._run.run_id, 0, "run")
        try:
            cost, per_kind, hz = self._calibration(nat, tool)
            if self._run is not None:
                self._run.config["calibration"] = handed_down_calibration(self._calibration_key())
                self._run.begin()
            self.event_cost_ns = cost * 1e9 / hz
            self.call_event_cost_ns = per_kind[0][1] * 1e9 / hz
            header = {
                "recorder": f"ocular {VERSION}",
                "python_version": "%d.%d.%d" % sys.version_info[:3],
                "python_hexversion": sys.hexversion,
                "implementation": sys.implementation.name,
                "platform": f"{sys.platform}-{os.uname().machine}",
                "pid": os.getpid(),
                "start": nat.clock_point(),
                "ticks_per_second": hz,
                **_interp.opcode_tables(nat.runtime_dir()),
            }
            if self._process is not None:
                header["process"] = self._process
            main_id, main_name = _main_thread()
            no_ring = nat.start(self.path, header, {
                "mode": self.mode, "threshold": self.deinstrument_threshold, "include_only": self.include_only,
                "exclude": self.exclude, "buffer_events": self.buffer_events, "max_buffers": self.max_buffers,
                "event_cost_ticks": cost, "thread_name": _interp.boot_thread_name, "boot_code": _boot_code(),
                "main_native_id": main_id, "main_name": main_name, "internal": [_OWN_CODE],
                "calibration": per_kind, "on_full": self.on_full, "ring": self.ring_file, "flight": self.ring,
                "live": self.live, "counters": self.counters, "sampled": self.sampled,
            })
            if no_ring:
                note = (f"{no_ring}: the flight recorder's ring is in this process's memory, lost if it is killed"
                        if self.ring else
                        f"{no_ring}: if the program is killed, each thread's last buffer of events is lost")
                self.notes.append(note)
                _warn_user(f"Ocular: {note}")
            if self.counters:
                for name, why in nat.counter_errors():
                    note = f"counter {name}: {why}; the recording goes on without it"
                    self.notes.append(note)
                    _warn_user(f"Ocular: {note}")
        except BaseException:
            release_tool_id(tool, self._events)
            if self._run is not None:
                self._run.end()
            raise
        # Locations switched off (DISABLE) by an earlier recording would stay off: switch them back on.
        mon.restart_events()
        callbacks = _callbacks(self.deinstrument_threshold, self.mode, self.sampled)
        for name in self._events:
            mon.register_callback(tool, getattr(mon.events, name), callbacks[name])
        self._running = True
        _active = self
        if not _fork_hook_installed:
            os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
            _install_exit_hooks()
            _fork_hook_installed = True
        if _in_main_thread():
            # SIGTERM's default action kills the process at once: complete the file first, then take that
            # default action (_sigterm). Only when nobody else handles SIGTERM.
            if self._handle_sigterm and _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
                self._old_sigterm = _signal.signal(_signal.SIGTERM, _sigterm)
                nat.own_sigterm(True)
        if self.perf and not sys.is_stack_trampoline_active():
            # Python functions get their own native frames, named in /tmp/perf-PID.map: a `perf record` of the
            # process shows them (CPython's perf support).
            sys.activate_stack_trampoline("perf")
            self._perf_activated = True
        if self._rules:
            from . import _spans

            _spans.set_rules(self._rules, self)
        if self.dump_on is not None:
            if not _in_main_thread():
                raise ValueError("dump_on installs a signal handler: start the recording in the main thread")
            self._old_dump_handler = _signal.signal(self.dump_on, self._dump_on_signal)
        atexit.register(self._stop_at_exit)
        # Last: everything above runs Python (atexit, signal) that is not the user's program.
        mon.set_events(tool, _mask(self._events))
        if self.sampled:
            # Function boundaries are recorded in windows (the first one is open now): their opener.
            nat.start_windows(self.window_period, self.window_length)
        return self

    def _calibration(self, nat: Any, tool: int) -> tuple[float, list[tuple[int, float]], float]:
        """(cost of the mode's events, the cost per event kind, ticks per second) for this recording: measured
        at the process's first recording with these settings, and reused by its later ones (the next test
        of a pytest session, a forked child) and, for ten minutes, by later processes of this interpreter
        (kept in the runtime directory): a measurement takes 1-3 ms of every start. The costs are
        scaled for the machine's speed at each stop, against its speed when they were measured (the speed
        probe, FORMAT.md 6.6), as they are for the recording that measured them."""
        global _speed_probe
        key = self._calibration_key()
        known = _calibrations.get(key)
        if known is None and _take_kept_calibration(key):
            known = _calibrations[key]
        if known is not None:
            cost, per_kind, hz, _speed_probe = known
            return cost, list(per_kind), hz
        # The tick rate is measured from the extension's loading to the calibration's end (clock points good
        # to tens of ns, so 1 ms gives it to ~1e-4) instead of over a sleep of its own, which would add
        # milliseconds to every run; only a start faster than that waits out the rest of the millisecond.
        # A loading more than a second ago is not used: a machine suspended since (a notebook's laptop)
        # would have stopped one clock and not the other.
        before = nat.clock_point()
        if _loaded_at is not None and before[1] - _loaded_at[1] < 1_000_000_000:
            before = _loaded_at
        cost, per_kind = calibration(self.mode, tool, self.deinstrument_threshold, self.buffer_events,
                                     self.c_calls, self.sampled)
        after = nat.clock_point()
        if after[1] - before[1] < 1_000_000:
            import time

            time.sleep((1_000_000 - (after[1] - before[1])) / 1e9)
            after = nat.clock_point()
        hz = (after[0] - before[0]) * 1e9 / (after[1] - before[1])
        _calibrations[key] = (cost, list(per_kind), hz, _speed_probe)
        _keep_calibration(key)
        return cost, per_kind, hz

    def _calibration_key(self) -> tuple:
        return (self.mode, self.deinstrument_threshold, self.buffer_events, self.c_calls, self.sampled)

    def stop(self) -> "Recording":
        global _active
        if not self._running:
            return self
        self._running = False
        if self._rules:
            from . import _spans

            if _spans._recording is self:
                _spans.set_rules([], None)
        # Events off first: the native stop expects no callback while it flushes. The tool id is released
        # (and its switched-off locations restarted) only after the native stop returned, so that nothing
        # of the recorder runs after the restart.
        sys.monitoring.set_events(self.tool_id, 0)
        names = _thread_names()
        try:
            out = _native().stop(names, speed_at_stop())
        finally:
            release_tool_id(self.tool_id, self._events)
        _active = None
        if self._perf_activated:
            sys.deactivate_stack_trampoline()
            self._perf_activated = False
        _quiet_fork_warning(False)
        atexit.unregister(self._stop_at_exit)
        if self._run is not None:
            from . import _follow

            self._run.end()
            self.children, self.children_events, self.unrecorded_children, self.completed_children = (
                _follow.summary(self.path, self._run.run_id))
        if self._old_dump_handler is not None and _in_main_thread():
            if _signal.getsignal(self.dump_on) == self._dump_on_signal:
                _signal.signal(self.dump_on, self._old_dump_handler)
            self._old_dump_handler = None
        if self._old_sigterm is not None and _in_main_thread():
            if _signal.getsignal(_signal.SIGTERM) is _sigterm:
                _signal.signal(_signal.SIGTERM, self._old_sigterm)
                _native().own_sigterm(False)
            self._old_sigterm = None
        self.events = out["events"]
        self.lost = out["lost"]
        self.bytes = out["bytes"]
        self.threads = out["threads"]
        self.code_objects = out["code_objects"]
        self.error = out["error"]
        self.dropped = out.get("dropped", 0)
        errors = (out["errors"] + [f"a dump failed: {e}" for e in out.get("dump_errors", ())]
                  + list(out.get("notes", ())))
        if errors or self.error or self.lost:
            self._warn(errors)
        return self

    # -- live ------------------------------------------------------------------------------------------

    def cursor(self) -> "Cursor":
        """A cursor over this recording's events as they are recorded (``ocular.attach`` for another
        process's): ``poll()`` returns the events since the last poll."""
        if not self._running:
            raise RuntimeError("the recording is not running: read its file with ocular.load()")
        path = _native().ring_path()
        if path is None:
            raise RuntimeError("this recording has no ring file (ring_file=False, or it could not be made): "
                               "nothing to follow")
        from ._live import attach

        return attach(path)

    # -- flight recorder -------------------------------------------------------------------------------

    def dump(self, path: str | os.PathLike[str] | None = None, wait: bool = False) -> str:
        """Write what the flight recorder holds (``ring=``) into ``path`` now, while recording goes on: an
        ``.ocl`` trace of the newest events every command reads, with what the ring overwrote before said
        in it. The file is created at once (an ``OSError`` if it cannot be); the writer thread writes the
        rest, so the calling thread does not wait (``wait=True`` waits and returns when it is written).
        Without ``path``, the dump goes beside the recording's file, numbered: ``run.1.ocl``,
        ``run.2.ocl``, ... Returns the path."""
        if not self._running:
            raise RuntimeError("the recording is not running: its file already holds what its ring held")
        if path is None:
            path = self._next_dump_path()
        path = os.fspath(path)
        out = _native().dump(path, wait)
        self.dumped += 1
        return path

    def _next_dump_path(self) -> str:
        # String operations and os.stat only: os.path's functions are Python code the recording would show.
        slash = self.path.rfind(os.sep) + 1
        dot = self.path.rfind(".")
        base, ext = (self.path[:dot], self.path[dot:]) if dot > slash else (self.path, ".ocl")
        n = self.dumped + 1
        while True:
            candidate = f"{base}.{n}{ext}"
            try:
                os.stat(candidate)
            except OSError:
                return candidate
            n += 1

    def _dump_on_signal(self, signum: int, frame: object) -> None:
        try:
            path = self.dump()
            print(f"ocular: signal {signum}: writing the flight recorder's ring into {path}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - a signal handler must not raise into the program
            print(f"ocular: signal {signum}: the dump failed: {e}", file=sys.stderr)

    def _warn(self, errors: list[str]) -> None:
        """The stop's warnings, shown at the user's code that stopped the recording (whether through stop(),
        a with block or stop_tracing())."""
        for e in errors:
            _warn_user(f"Ocular: {e}")
        if self.error:
            _warn_user(f"Ocular could not write {self.path}: {self.error}")
        # After a write error, the error says how many events were lost and from when: one warning.
        if self.lost and not self.error:
            # Buffers of 4,096 events and more have small overflow buffers beyond max_buffers (the
            # recorder's Config::overflow): a quarter as many events again.
            behind = f"{self.max_buffers} buffer{'' if self.max_buffers == 1 else 's'}"
            if self.buffer_events // 16 >= 256:
                behind += " and its small overflow buffers"
            _warn_user(
                f"Ocular dropped {self.lost:,} events: "
                f"the writer thread fell {behind} behind the program (compressing and "
                f"writing); the file records how many and when. Pass on_full='wait' (the program waits "
                f"for the writer instead), raise max_buffers, or record less (a higher "
                f"deinstrument_threshold, include_only)."
            )

    def _stop_at_exit(self) -> None:
        try:
            self.stop()
        except Exception as e:  # noqa: BLE001 - at exit, report rather than raise
            print(f"ocular: stopping the recording at exit failed: {e}", file=sys.stderr)

    @property
    def running(self) -> bool:
        return self._running

    # -- protocols -------------------------------------------------------------------------------------

    def __enter__(self) -> "Recording":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __call__(self, func: F) -> F:
        import functools

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # A recursive call (or one from another thread) while this recording runs is inside it already:
            # only the outermost call starts and stops the recording.
            if self._running:
                return func(*args, **kwargs)
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def summary(self) -> str:
        per = f", {self.bytes / self.events:.2f} bytes/event" if self.events else ""
        ring = (f"; flight recorder of {_human(self.ring)}: the newest events, {self.dropped:,} older ones "
                f"overwritten" if self.ring else "")
        children = ""
        if self.children or self.unrecorded_children:
            from ._follow import children_dir

            children = (f"; and {self.children} child process{'es' if self.children != 1 else ''} "
                        f"({self.children_events:,} events) in {children_dir(self.path)}")
            if self.completed_children:
                children += (f" ({self.completed_children} killed, their traces completed from their ring "
                             f"files)")
            if self.unrecorded_children:
                children += f", {len(self.unrecorded_children)} not recorded: " + "; ".join(self.unrecorded_children)
        return (
            f"{self.path}: {self.events:,} events ({self.mode} mode), {self.lost:,} lost, "
            f"{self.threads} thread{'' if self.threads == 1 else 's'}, {self.code_objects} code object{'' if self.code_objects == 1 else 's'}, "
            f"{self.bytes:,} bytes{per}{ring}{children}"
        )

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<ocular.Recording {self.path!r} {self.mode} {state} events={self.events} lost={self.lost}>"


def _install_exit_hooks() -> None:
    """os.execv and os.execve (through which every os.exec* function goes) and os._exit end the process
    without atexit: each completes the recording first, so the trace holds everything up to the call
    (without this, up to a buffer of events per thread was lost and the file had no trailer)."""
    for name in ("execv", "execve", "_exit"):
        original = getattr(os, name)

        def ending(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            rec = _active
            if rec is not None and rec._pid == os.getpid():
                try:
                    rec.stop()
                except Exception as e:  # noqa: BLE001 - the process is ending: report rather than raise
                    print(f"ocular: stopping the recording before {__original.__name__} failed: {e}",
                          file=sys.stderr)
            return __original(*args, **kwargs)

        # functools.wraps by hand: functools (collections) would be imported at every recording's start.
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(ending, attr, getattr(original, attr))
        ending.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(os, name, ending)


def _sigterm(signum: int, frame: object) -> None:
    """SIGTERM while recording: complete the trace, then die of the signal as the program would have without
    Ocular (no unwinding, no wait for non-daemon threads, the signal's exit status). Raising SystemExit
    instead let a program with a non-daemon thread run on: shutdown waits for such threads."""
    # The recording of this process only: in a child forked a moment ago, the fork hooks may not have run
    # yet, and the parent's recording, whose threads the child does not have, is still the active one
    # (stopping it there raised, and the signal was lost: a pool worker terminated early lived on and
    # the program hung in join()). And whatever stopping does, the process dies of the signal.
    rec = _active
    try:
        if rec is not None and rec._pid == os.getpid():
            rec.stop()
    except BaseException as e:  # noqa: BLE001 - the program is ending: report rather than raise
        print(f"ocular: stopping the recording on SIGTERM failed: {e}", file=sys.stderr)
    finally:
        _signal.signal(signum, _signal.SIG_DFL)
        # raise() delivers to this thread before it returns (os.kill may pick another thread and return
        # first).
        _signal.raise_signal(signum)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(size: int | str) -> int:
    """Bytes from ``1048576``, ``"64MB"``, ``"64M"``, ``"64MiB"`` or ``"1.5 GB"``: units are powers of 1024
    (K, M, G, T, with or without B or iB), as for memory."""
    if isinstance(size, bool):
        raise TypeError("a size is a number of bytes or a string such as '64MB'")
    if isinstance(size, int):
        n = size
    elif isinstance(size, str):
        t = size.strip().lower().replace(" ", "")
        for suffix in ("ib", "b"):
            if t.endswith(suffix) and t[:-len(suffix)][-1:].isalpha():
                t = t[:-len(suffix)]
                break
        unit = t[-1:] if t[-1:].isalpha() else ""
        try:
            n = int(float(t[:len(t) - len(unit)]) * _UNITS[unit])
        except (KeyError, ValueError):
            raise ValueError(f"not a size: {size!r} (say '64MB', '512KiB', '1GB', or a number of bytes)") from None
    else:
        raise TypeError(f"a size is a number of bytes or a string such as '64MB', not {type(size).__name__}")
    if n <= 0:
        raise ValueError(f"a ring must hold something: {size!r}")
    return n


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} B"


def _signal_number(sig: int | str) -> int:
    """SIGUSR2, "SIGUSR2", "USR2" or 12."""
    if isinstance(sig, int):
        return sig
    name = sig.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    n = getattr(_signal, name, None)
    if not isinstance(n, int):
        raise ValueError(f"unknown signal {sig!r}: give a name such as SIGUSR2, or a number")
    if n in (_signal.SIGKILL, getattr(_signal, "SIGSTOP", -1)):
        raise ValueError(f"{sig} cannot be caught")
    return n


def _patterns(p: str | Iterable[str] | None) -> list[str]:
    if p is None:
        return []
    if isinstance(p, str):
        return [p]
    out = list(p)
    for x in out:
        if not isinstance(x, str):
            raise TypeError(f"filters are substrings of file or qualified names, not {type(x).__name__}")
    return out


def record(
    path: str | os.PathLike[str] = "ocular.ocl",
    mode: str = "adaptive",
    deinstrument_threshold: int = 500,
    include_only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    **kwargs: Any,
) -> Recording:
    """Record this process into ``path``: ``with ocular.record("run.ocl"): ...`` or as a decorator.

    mode: "calls" (function boundaries), "adaptive" (plus JUMP/BRANCH: basic blocks), or "precise" (plus
    every INSTRUCTION). deinstrument_threshold: stop recording a jump, branch or instruction after that
    many hits (0 = gapless). With a threshold, function boundaries are recorded completely for the run's
    first 100 x threshold calls, then inside windows of ``window_length`` seconds every ``window_period``
    seconds (on average, jittered), from which the analysis estimates each function's calls and time,
    saying so; calls mode records every call. include_only / exclude: substrings of a code object's file
    name or qualified name, decided once per code object.

    buffer_events, max_buffers, on_full: each recording thread fills a buffer of ``buffer_events`` events
    (24 bytes each); up to ``max_buffers`` more wait for the writer thread, then small ones holding a
    quarter as many events again, so memory stays under ``(1.25 * max_buffers + threads) * buffer_events *
    24`` bytes (1.5 MiB per thread and 120 MiB by default).
    If the writer falls that far behind, ``on_full="drop"`` (the default) drops events, counted and
    located in the file, and ``on_full="wait"`` makes the program wait for the writer instead.

    ring_file: the buffers live in a file beside the trace (``run.ocl.ring``, removed at the end), so that
    a program killed (SIGKILL, the OOM killer, a crash) loses none of what was recorded: every command
    reads the trace completed from it. False keeps them in memory, as before.

    ring: a flight recorder. With a size (``ring="64MB"``), the recording keeps only its newest events,
    that many bytes of compressed chunks (several times as many events as raw), however long the program
    runs; ``rec.dump(path)`` writes them into a trace at any moment while recording goes on, the stop
    writes them into ``path``, and after a kill every command reads them from the ring file.
    dump_on: a signal (``"SIGUSR2"``) on which the recording dumps beside ``path`` (``run.1.ocl``, ...).
    dump_when: when a span ends slow (``ocular.slower_than("GET /orders", 0.2)``, its text ``"GET
    /orders>0.2"``, or a percentile: ``"GET /orders>p99"``; one rule or several), the recording dumps beside
    ``path`` as ``dump_on`` does: the slow request's trace, whole if the ring holds it.

    counters: performance counters sampled by the kernel per recorded thread and attributed to the Python
    function running at each sample (``stats`` shows them per function): ``["page-faults", "task-clock",
    "context-switches", "cpu-migrations"]`` (software: work everywhere Linux allows ``perf_event_open``)
    and ``"instructions"``, ``"cycles"``, ``"cache-misses"``, ``"branch-misses"`` (hardware: need a PMU,
    which most virtual machines lack). ``"task-clock:50000"`` samples every 50,000 events (ns here)
    instead of the default. A counter that cannot be opened is a warning naming why; the rest record.

    perf: CPython's perf trampoline is active while recording (``sys.activate_stack_trampoline("perf")``), so
    that a ``perf record`` of the process shows Python function names next to the C ones.

    c_calls: record calls of C functions too (``sys.monitoring``'s CALL, C_RETURN and C_RAISE): built-in
    functions and methods (``len``, ``isinstance``, ``list.append``, ``re.Pattern.match``), types called
    (``dict()``) and any other callable that is not a Python function, each its own function in ``stats``
    and the flame graph (``builtins.len``, file ``~``), its time taken out of its caller's. Every call a
    Python frame makes then costs a callback, Python calls included (BENCHMARKS.md, "C calls").

    live: another process follows the recording (``ocular.attach(pid)``, ``python -m ocular top PID``):
    16 spare buffers instead of 3 (24 MiB), so a reader that polls every few milliseconds misses nothing.
    Any recording with a ring file can be followed; without ``live`` a reader must poll more often.
    """
    return Recording(path, mode, deinstrument_threshold, include_only, exclude, **kwargs)


def active() -> Recording | None:
    """The recording in progress, if any."""
    return _active

