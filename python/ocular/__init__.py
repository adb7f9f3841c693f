"""Ocular: a tracer and profiler for CPython 3.12+ built on sys.monitoring (PEP 669).

Record::

    import ocular
    with ocular.record("run.ocl", mode="adaptive"):
        work()

or from the shell: ``python -m ocular run -o run.ocl script.py args...``. Then analyze the file with
``ocular-analyze info run.ocl``.
"""

from __future__ import annotations

import os
from typing import Iterable

from ._recorder import MODES, VERSION, Recording, active, record
from .errors import AlreadyRecording, OcularError, ToolIdInUse, UnsupportedPython

__version__ = VERSION
__all__ = [
    "record",
    "Recording",
    "start_tracing",
    "stop_tracing",
    "MODES",
    "OcularError",
    "UnsupportedPython",
    "ToolIdInUse",
    "AlreadyRecording",
]

_legacy: Recording | None = None


def start_tracing(
    mode: str = "adaptive",
    perfetto: bool = False,
    deinstrument_threshold: int = 500,
    exclude: str | Iterable[str] | None = None,
    include_only: str | Iterable[str] | None = None,
    output: str | os.PathLike[str] = "ocular.ocl",
) -> Recording:
    """Start recording, as the earlier prototype did; stop with ``stop_tracing()``.

    ``perfetto=True`` is accepted for compatibility and currently has no effect: export the trace with
    ``ocular-analyze export`` once it is available.
    """
    global _legacy
    rec = Recording(output, mode, deinstrument_threshold, include_only, exclude)
    rec.start()
    _legacy = rec
    return rec


def stop_tracing() -> Recording | None:
    """Stop the recording started by ``start_tracing()`` and return it (None if none was running)."""
    global _legacy
    rec, _legacy = _legacy, None
    if rec is None:
        rec = active()
    if rec is None:
        return None
    return rec.stop()
