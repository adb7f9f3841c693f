"""The recording's options, as the extension defines them once (``RecordOptions`` in ocular-record's
``ocular-python/src/cli.rs``): each one's name (``record()``'s keyword argument), default, ``ocular run`` flag and help.
``ocular run``, ``%%ocular``, the pytest plugin and the children a run follows take theirs from here;
``Recording``'s keyword arguments are the same names and defaults, written out for editors and type
checkers (``python/tests/test_options.py`` holds them to this definition).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The heading of the options that one cell of a notebook and one test take too (the others are about a
# whole program's process: its memory, what outlives it, what follows it).
RECORDING = "Recording"

_specs: list[dict[str, Any]] | None = None
_defaults: dict[str, Any] | None = None


def specs() -> list[dict[str, Any]]:
    """Each option as ``ocular run`` takes it: ``name``, ``flag``, ``help``, ``heading``, ``value_name``
    (None for a switch), ``repeat``, ``choices`` and ``negates`` (a switch that turns it off)."""
    global _specs
    if _specs is None:
        from . import _ocular

        _specs = _ocular.record_option_specs()
    return _specs


def defaults() -> dict[str, Any]:
    """Every option's default, as ``record()`` takes it: the command line's, except that ``record()``
    follows no child process unless asked (``ocular run`` follows them)."""
    global _defaults
    if _defaults is None:
        from . import _ocular

        _defaults = {**_ocular.record_options(), "follow": False}
    return dict(_defaults)


def recording() -> list[dict[str, Any]]:
    """The options a cell and a test take: what is recorded, not the process's."""
    return [s for s in specs() if s["heading"] == RECORDING]


def names() -> list[str]:
    return [s["name"] for s in specs()]


def _count(s: str) -> int:
    n = int(s)
    if n < 0:
        raise ValueError(s)
    return n


_count.__name__ = "int >= 0"


def _ms(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise ValueError(s)
    return v / 1e3


_ms.__name__ = "number of milliseconds"


def argparse_kwargs(spec: dict[str, Any], dest: str) -> dict[str, Any]:
    """The keyword arguments of argparse's ``add_argument`` (and pytest's ``addoption``) for `spec`, read
    into `dest` as ``record()`` takes it: values converted as the command line converts them (milliseconds
    to seconds, counts checked)."""
    default = defaults()[spec["name"]]
    kw: dict[str, Any] = {"dest": dest, "help": spec["help"].replace("%", "%%")}
    if spec["value_name"] is None:
        kw["action"] = "store_false" if spec["negates"] else "store_true"
        return kw
    kw["metavar"] = spec["value_name"]
    if spec["value_name"] == "MS":
        kw["type"] = _ms
    elif isinstance(default, int) and not isinstance(default, bool):
        kw["type"] = _count
    if spec["choices"]:
        kw["choices"] = spec["choices"]
    if spec["repeat"]:
        kw.update(action="append", default=[])
    else:
        kw["default"] = default
    return kw
