"""Ocular's exceptions."""


class OcularError(Exception):
    """Base class of Ocular's errors."""


class UnsupportedPython(OcularError):
    """The running interpreter cannot be recorded (not CPython 3.12+, or free-threaded)."""


class ToolIdInUse(OcularError):
    """Every sys.monitoring tool id Ocular may use is taken by another tool."""


class AlreadyRecording(OcularError):
    """A recording is already in progress in this process."""


class MissingDependency(OcularError, ImportError):
    """An optional package (polars, pandas, pyarrow) is needed for this and is not installed."""


class TraceError(OcularError, OSError):
    """A trace that cannot be read. ``path`` is the file, ``offset`` the byte where the trouble is (or
    None), and the message says what is wrong. Its subclasses tell the kinds apart."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotATrace(TraceError):
    """The file is not an Ocular trace (its first bytes are not the magic)."""


class UnsupportedVersion(TraceError):
    """The trace was written by a newer major version of the format: upgrade Ocular to read it."""


class TruncatedTrace(TraceError):
    """The file ends before its header does: nothing in it can be read. (A trace cut later, a killed
    recording, reads up to its last whole chunk with a warning instead.)"""


class CorruptTrace(TraceError):
    """A chunk of the trace is damaged (``offset`` is where); ``salvage=True`` reads around it."""


_KINDS = {"not_a_trace": NotATrace, "unsupported_version": UnsupportedVersion, "truncated": TruncatedTrace,
          "corrupt": CorruptTrace}


def from_native(e: OSError) -> OcularError:
    """The ``ocular.errors`` exception for an error of the extension's reader (an OSError whose
    ``ocular_kind`` says what failed); other failures (the file system's) stay OcularError."""
    kind = getattr(e, "ocular_kind", None)
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return OcularError(str(e))
    return cls(str(e), getattr(e, "trace_path", None), getattr(e, "offset", None))
