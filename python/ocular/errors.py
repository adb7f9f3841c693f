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
