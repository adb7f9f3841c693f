"""What Ocular needs to know about the running interpreter, gathered once, in Python."""

from __future__ import annotations

import marshal
import os
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


_opcode_tables: dict | None = None

# The layout of the cached tables: a change to what _make_opcode_tables returns changes it.
_CACHE_LAYOUT = 1


def opcode_tables(cache_dir: str | None = None) -> dict:
    """The interpreter's opcode names (base and specialized), base opcode and inline caches, 256 each.

    INSTRUMENTED_X maps to X and keeps X's cache entries: the bytecode still holds X's caches after it.
    Made once per process (every recording's header holds them), and kept in `cache_dir` (the runtime
    directory, a memory file system) for the next process of the same interpreter: making them imports
    `opcode`, ~0.5-1.7 ms of every run's start.
    """
    global _opcode_tables
    if _opcode_tables is None:
        _opcode_tables = _cached_opcode_tables(cache_dir) if cache_dir else _make_opcode_tables()
    return {k: list(v) if isinstance(v, list) else v for k, v in _opcode_tables.items()}


def _interpreter_key() -> tuple:
    """What the opcode tables depend on: the interpreter's build and its bytecode's magic number."""
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
    return (_CACHE_LAYOUT, sys.version, sys.hexversion, sys.executable, bytes(magic))


def _cached_opcode_tables(cache_dir: str) -> dict:
    key = _interpreter_key()
    path = os.path.join(cache_dir, f"opcodes-{sys.hexversion:x}-{key[4].hex()}.marshal")
    try:
        with open(path, "rb") as f:
            kept_key, tables = marshal.loads(f.read())
        if kept_key == key and _well_formed(tables):
            return tables
    except (OSError, ValueError, EOFError, TypeError):
        pass  # none yet, or not one this interpreter wrote: made again below
    tables = _make_opcode_tables()
    keep(path, (key, tables))
    return tables


def keep(path: str, value: object) -> None:
    """Writes `value` as marshal into `path` in the runtime directory, for the next processes: whole or not
    at all (a process may read it meanwhile), and nothing left behind when it cannot be written."""
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(value))
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _well_formed(t: object) -> bool:
    if not isinstance(t, dict):
        return False
    lists = [t.get(k) for k in ("opnames", "opbase", "opcache")]
    return (all(isinstance(v, list) and len(v) == 256 for v in lists)
            and all(isinstance(n, str) for n in lists[0])
            and all(isinstance(x, int) for v in lists[1:] for x in v)
            and isinstance(t.get("have_argument"), int) and isinstance(t.get("extended_arg"), int))


def _make_opcode_tables() -> dict:
    import opcode

    all_names, deopt = _specialized_tables()
    names = [n if not n.startswith("<") else "" for n in all_names[:256]]
    number = {n: op for op, n in enumerate(names) if n}
    base = list(range(256))
    for spec, b in deopt.items():
        base[number[spec]] = number[b]
    for op, n in enumerate(names):
        if n.startswith("INSTRUMENTED_") and n[13:] in opcode.opmap:
            base[op] = opcode.opmap[n[13:]]
    # 3.12: a list by number; 3.13 and 3.14: a dict by name; 3.15: a frozendict (not a dict) by name.
    ice = opcode._inline_cache_entries  # type: ignore[attr-defined]
    if _is_mapping(ice):
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


def _specialized_tables() -> tuple[list[str], dict[str, str]]:
    """Every opcode's name, specialized ones included, and each specialized name's base: what
    ``dis._all_opname`` and ``dis.deoptmap`` hold, built the way dis builds them from the opcode module,
    without importing dis (and collections with it: 4 ms of every ``python -m ocular run``). A test
    compares them with dis's on every supported version; a layout this does not know falls back to dis."""
    import opcode

    names = list(opcode.opname)
    families = getattr(opcode, "_specializations", None)
    if _is_mapping(getattr(opcode, "_specialized_opmap", None)) and _is_mapping(families):  # 3.13+
        for name, op in opcode._specialized_opmap.items():  # type: ignore[attr-defined]
            names[op] = name
    elif isinstance(getattr(opcode, "_specialized_instructions", None), list) and _is_mapping(families):
        # 3.12: the specialized instructions take the unused numbers, in order.
        free = [op for op, n in enumerate(names) if n.startswith("<")]
        for op, name in zip(free, opcode._specialized_instructions):  # type: ignore[attr-defined]
            names[op] = name
    else:
        import dis

        return list(dis._all_opname), dict(dis.deoptmap)  # type: ignore[attr-defined]
    return names, {spec: b for b, family in families.items() for spec in family}


def _is_mapping(x: object) -> bool:
    """A dict, or 3.15's frozendict (which is not a dict subclass), without importing collections.abc."""
    return hasattr(x, "items") and hasattr(x, "get")


def boot_thread_name() -> str:
    """Called from the PY_START callback of threading.Thread._bootstrap: the frame below is that
    function's, and its `self` is the Thread. (threading.current_thread() would create a dummy thread:
    the new thread is not registered yet.)"""
    return sys._getframe(1).f_locals["self"].name
