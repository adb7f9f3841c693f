"""Ocular: a tracer and profiler for CPython 3.12+ built on sys.monitoring (PEP 669).

Record::

    import ocular
    with ocular.record("run.ocl", mode="adaptive"):
        work()

or from the shell: ``python -m ocular run -o run.ocl script.py args...``. Then analyze it::

    trace = ocular.load("run.ocl")
    print(trace.hot_text(top=3))
    trace.events()          # a polars DataFrame, one row per event

or from the shell: ``python -m ocular hot run.ocl`` (the same commands as ``ocular-analyze``).

(PYTEST_DONT_REWRITE: the package is a pytest plugin, and ``ocular run -m pytest`` imports it before pytest
starts; pytest's assertion rewriting has nothing to do in it and would warn that it could not.)
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

    from ._analysis import Trace, load
    from ._live import Cursor, attach
    from ._spans import slower_than, span
from ._recorder import MODES, VERSION, Recording, active, record
from .errors import (
    AlreadyRecording,
    CorruptTrace,
    MissingDependency,
    NotATrace,
    OcularError,
    ToolIdInUse,
    TraceError,
    TruncatedTrace,
    UnsupportedPython,
    UnsupportedVersion,
)

__version__ = VERSION
__all__ = [
    "record",
    "Recording",
    "span",
    "slower_than",
    "load",
    "Trace",
    "attach",
    "Cursor",
    "start_tracing",
    "stop_tracing",
    "MODES",
    "OcularError",
    "UnsupportedPython",
    "ToolIdInUse",
    "AlreadyRecording",
    "MissingDependency",
    "TraceError",
    "NotATrace",
    "UnsupportedVersion",
    "TruncatedTrace",
    "CorruptTrace",
]


def __getattr__(name: str) -> object:
    # The analysis side (Trace, load), spans and the live reader are imported when first used: `python -m
    # ocular run` and a program that only records do not pay for them. What was imported is kept in the
    # module's namespace, so the next `ocular.span` is a plain attribute: a service writes `with
    # ocular.span(...)` in every request, and this function with its import statement took microseconds.
    if name in ("Trace", "load"):
        from . import _analysis as module
    elif name in ("span", "slower_than"):
        from . import _spans as module
    elif name in ("attach", "Cursor", "Event", "Poll"):
        from . import _live as module
    else:
        raise AttributeError(f"module 'ocular' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def load_ipython_extension(ip: object) -> None:
    """``%load_ext ocular`` in IPython or Jupyter: the ``%%ocular`` cell magic and ``%ocular`` line magic,
    which record the code and return its :class:`Trace` (see ``ocular._ipython``)."""
    from ._ipython import load_ipython_extension as load

    load(ip)


_legacy: Recording | None = None
_legacy_perfetto = False

#: Where ``start_tracing(perfetto=True)`` writes the timeline, in the current directory, as the prototype did.
PERFETTO_FILE = "ocular_trace.json"


def start_tracing(
    mode: str = "adaptive",
    perfetto: bool = False,
    deinstrument_threshold: int = 500,
    exclude: str | Iterable[str] | None = None,
    include_only: str | Iterable[str] | None = None,
    output: str | os.PathLike[str] = "ocular.ocl",
    c_calls: bool = False,
    sampled: bool = False,
) -> Recording:
    """Start recording, as the earlier prototype did; stop with ``stop_tracing()``, which prints the
    hot-loop report and, with ``perfetto=True``, writes ``ocular_trace.json`` (Chrome Trace Event format,
    for ui.perfetto.dev) in the current directory. The trace itself goes to ``output``. ``c_calls=True``
    records calls of C functions too, ``sampled=True`` records function boundaries in windows only
    (``ocular.record``'s options).
    """
    global _legacy, _legacy_perfetto
    rec = Recording(output, mode, deinstrument_threshold, include_only, exclude, c_calls=c_calls, sampled=sampled)
    rec.start()
    _legacy = rec
    _legacy_perfetto = bool(perfetto)
    return rec


def stop_tracing(report: bool = True, top: int = 5) -> Recording | None:
    """Stop the recording started by ``start_tracing()`` and return it (None if none was running).

    Prints the ``top`` hottest loops to stdout (``report=False`` to skip), disassembled as base ->
    specialized opcode with their cost, as the prototype did; if tracing started with ``perfetto=True``,
    also writes ``ocular_trace.json`` in the current directory.
    """
    global _legacy, _legacy_perfetto
    rec, _legacy = _legacy, None
    perfetto, _legacy_perfetto = _legacy_perfetto, False
    if rec is None:
        rec = active()
    if rec is None:
        return None
    rec.stop()
    if report:
        from ._analysis import load

        trace = load(rec.path)
        print("[Ocular] Trace Disassembly with Hardware CPU Cycles (Base -> Specialized):")
        print(trace.hot_text(top), end="", flush=True)
    if perfetto:
        from ._recorder import _native

        n = _native().export_chrome(os.fspath(rec.path), PERFETTO_FILE)
        print(f"[Ocular] wrote {os.path.abspath(PERFETTO_FILE)} ({n:,} trace events): open it in "
              "https://ui.perfetto.dev", file=sys.stderr)
    return rec
