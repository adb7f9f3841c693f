"""What Ocular needs to know about the running interpreter, gathered once, in Python."""

from __future__ import annotations

import dis
import opcode
import sys

from .errors import UnsupportedPython


def check_supported() -> None:
    """Raise UnsupportedPython unless this is CPython 3.12+ with the GIL."""
    if sys.implementation.name != "cpython":
        raise UnsupportedPython(f"Ocular records CPython only, not {sys.implementation.name}")
    if sys.version_info < (3, 12):
        raise UnsupportedPython(
            f"Ocular needs Python 3.12 or newer (sys.monitoring, PEP 669); this is {sys.version.split()[0]}"
        )
    gil = getattr(sys, "_is_gil_enabled", None)
    # A free-threaded build has "t" in its ABI flags (sysconfig would say so too, at 6 ms of import).
    if "t" in getattr(sys, "abiflags", "") and (gil is None or not gil()):
        raise UnsupportedPython("Ocular does not support free-threaded builds (the GIL is disabled)")


def opcode_tables() -> dict:
    """The interpreter's opcode names (base and specialized), base opcode and inline caches, 256 each.

    INSTRUMENTED_X maps to X and keeps X's cache entries: the bytecode still holds X's caches after it.
    """
    names = list(dis._all_opname[:256])  # type: ignore[attr-defined]
    names = [n if not n.startswith("<") else "" for n in names]
    base = list(range(256))
    for spec, b in dis.deoptmap.items():  # type: ignore[attr-defined]
        base[dis._all_opmap[spec]] = dis._all_opmap[b]  # type: ignore[attr-defined]
    for op, n in enumerate(names):
        if n.startswith("INSTRUMENTED_") and n[13:] in opcode.opmap:
            base[op] = opcode.opmap[n[13:]]
    ice = opcode._inline_cache_entries  # type: ignore[attr-defined]  # 3.12: list; 3.13: dict by name
    if isinstance(ice, dict):
        cache = [ice.get(names[base[op]], 0) for op in range(256)]
    else:
        cache = [ice[base[op]] if base[op] < len(ice) else 0 for op in range(256)]
    return {
        "opnames": names,
        "opbase": base,
        "opcache": cache,
        "have_argument": opcode.HAVE_ARGUMENT,
        "extended_arg": opcode.EXTENDED_ARG,
    }


def boot_thread_name() -> str:
    """Called from the PY_START callback of threading.Thread._bootstrap: the frame below is that
    function's, and its `self` is the Thread. (threading.current_thread() would create a dummy thread:
    the new thread is not registered yet.)"""
    return sys._getframe(1).f_locals["self"].name
