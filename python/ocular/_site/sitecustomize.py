# Ocular follows the Python processes a recorded program starts (python -m ocular run, FORMAT.md 10): this
# directory is put first on PYTHONPATH for the run, so that every Python child imports this file at start.
# With OCULAR_FOLLOW set, the child records itself into the run's directory; a child that cannot (an
# interpreter older than 3.12, another implementation, one without Ocular) writes why instead, and runs
# as it would. Then the sitecustomize this one hides, if any, runs as usual.
#
# Any Python may import this file: it keeps to syntax every version reads.
import os
import sys


def _ocular_unrecorded(cfg, reason):
    try:
        import json

        note = {
            "pid": os.getpid(),
            "parent_pid": os.getppid(),
            "run_id": cfg.get("run_id"),
            "executable": sys.executable,
            "argv": list(getattr(sys, "orig_argv", None) or sys.argv or []),
            "python": "%d.%d.%d" % tuple(sys.version_info[:3]),
            "implementation": getattr(getattr(sys, "implementation", None), "name", "cpython"),
            "reason": reason,
        }
        try:
            os.makedirs(cfg["dir"])
        except OSError:
            pass
        path = os.path.join(cfg["dir"], "%d.unrecorded.json" % os.getpid())
        with open(path, "w") as f:
            json.dump(note, f)
    except Exception:
        pass


def _ocular_import(cfg):
    try:
        from ocular import _follow

        return _follow
    except ImportError:
        pass
    # Another interpreter than the run's: the run's Ocular, if its extension suits this Python.
    import importlib.util

    pkg = cfg["package"]
    spec = importlib.util.spec_from_file_location(
        "ocular", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["ocular"] = module
    try:
        spec.loader.exec_module(module)
        from ocular import _follow

        return _follow
    except BaseException:
        for name in [n for n in sys.modules if n == "ocular" or n.startswith("ocular.")]:
            del sys.modules[name]
        raise


def _ocular_loads(raw):
    # The run's settings through the C scanner json.loads uses: importing json (re, enum) would cost every
    # child a few ms of its start for one dictionary.
    try:
        from _json import make_scanner

        class Context(object):
            strict = True
            object_hook = None
            object_pairs_hook = None
            array_hook = None  # read by 3.15's scanner
            parse_float = float
            parse_int = int
            parse_constant = None
            memo = {}

        value, end = make_scanner(Context)(raw, 0)
        if raw[end:].strip():
            raise ValueError("extra data")
        return value
    except Exception:
        import json

        return json.loads(raw)


def _ocular_follow():
    raw = os.environ.get("OCULAR_FOLLOW")
    if not raw:
        return
    try:
        cfg = _ocular_loads(raw)
        cfg["dir"]
    except Exception:
        return
    impl = getattr(getattr(sys, "implementation", None), "name", "cpython")
    if impl != "cpython":
        _ocular_unrecorded(cfg, "%s cannot be recorded: Ocular records CPython 3.12 and later" % impl)
        return
    if sys.version_info[:2] < (3, 12):
        _ocular_unrecorded(
            cfg,
            "CPython %d.%d cannot be recorded: Ocular needs 3.12 or later (sys.monitoring)" % sys.version_info[:2],
        )
        return
    try:
        follow = _ocular_import(cfg)
    except BaseException as e:
        _ocular_unrecorded(cfg, "Ocular cannot be imported by this Python: %s: %s" % (type(e).__name__, e))
        return
    try:
        follow.start_child(cfg)
    except BaseException as e:
        _ocular_unrecorded(cfg, "starting the recording failed: %s: %s" % (type(e).__name__, e))


def _ocular_next_sitecustomize():
    # This file hides any sitecustomize later on the path: import that one, as site would have.
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    mine = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        try:
            import sitecustomize  # noqa: F401
        except ImportError:
            pass
    finally:
        sys.path[:] = saved
        other = sys.modules.get("sitecustomize")
        if mine is not None and other is None:
            sys.modules["sitecustomize"] = mine


_ocular_follow()
_ocular_next_sitecustomize()
