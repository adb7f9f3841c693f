"""``python -m ocular``: record a script or module, and analyze the trace.

    python -m ocular run [-o run.ocl] [--mode M] [--threshold N] [--include P]... [--exclude P]... script.py [args]
    python -m ocular run [options] -m module [args]
    python -m ocular info|hot|stats|export|flamegraph|dump ...     (the commands of ocular-analyze)
"""

from __future__ import annotations

import os
import runpy
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

from ._recorder import Recording
from .errors import OcularError

# The analyzer's commands, run by the analyzer compiled into the extension (the same clap parser).
ANALYZE_COMMANDS = ("info", "hot", "stats", "export", "flamegraph", "dump")


def _run(opts: dict) -> int:
    """Runs the program `opts` describes (from the extension's parser, see ``_native().parse_run``)."""
    module = opts["module"]
    if module is None and not opts["argv"]:
        print("python -m ocular run: give a script to run, or -m MODULE", file=sys.stderr)
        return 2
    if module is None:
        script = opts["argv"][0]
        if not os.path.exists(script):
            print(f"python -m ocular run: {script}: no such file", file=sys.stderr)
            return 2
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        sys.path[0] = os.getcwd()
    sys.argv = list(opts["argv"])
    # Everything but the program itself is done before recording starts, so the trace (and the cost of
    # recording) is the program's: reading and compiling the script, and runpy's imports (pkgutil brings
    # typing, some 200 code objects).
    if module is None:
        try:
            target = _script(sys.argv[0])
        except SyntaxError as e:
            # As `python script.py` reports it: the error and its source line, no frames of Ocular's.
            import traceback

            traceback.print_exception(type(e), e, None)
            return 1
    else:
        import pkgutil  # noqa: F401 - imported here so that runpy's use of it is not recorded

        def target() -> None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    try:
        rec = Recording(opts["output"], opts["mode"], opts["threshold"], opts["include"], opts["exclude"],
                        window_period=opts["window_period"], window_length=opts["window_length"])
    except ValueError as e:
        print(f"python -m ocular run: {e}", file=sys.stderr)
        return 2
    code = 0
    try:
        with rec:
            try:
                target()
            except SystemExit as e:
                code = _exit_code(e.code)
    finally:
        if not opts["quiet"] and not rec.running and rec.tool_id >= 0:
            print(f"ocular: wrote {rec.summary()}", file=sys.stderr)
    return code


def _script(path: str) -> "Callable[[], None]":
    """A script file, read and compiled now, to run later as ``runpy.run_path(path, run_name="__main__")``
    would: a fresh ``__main__`` module with the same globals. Directories and zip files with a
    ``__main__.py`` go through runpy itself."""
    if os.path.isdir(path) or not path.endswith((".py", ".pyw")) and _is_zip(path):
        import pkgutil  # noqa: F401 - see _run

        return lambda: runpy.run_path(path, run_name="__main__") and None
    import io
    import types

    with io.open_code(path) as f:
        source = f.read()
    compiled = compile(source, path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__="", __spec__=None)

    def run() -> None:
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = module
        try:
            exec(compiled, module.__dict__)
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved

    return run


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _exit_code(c: object) -> int:
    if c is None:
        return 0
    if isinstance(c, int):
        return c
    print(c, file=sys.stderr)
    return 1


def _analyze(argv: list[str]) -> int:
    """Runs an analyzer command. The extension has no polars inside, so ``export --parquet`` is done here
    from the Arrow tables with polars' own Parquet writer."""
    if argv[0] == "export" and "--parquet" in argv and not any(a in ("-h", "--help") for a in argv):
        return _export_parquet(argv[1:])
    from ._recorder import _native

    sys.stdout.flush()
    sys.stderr.flush()
    return _native().cli(argv)


def _export_parquet(args: list[str]) -> int:
    import argparse

    from ._analysis import load

    p = argparse.ArgumentParser(prog="python -m ocular export --parquet")
    p.add_argument("--parquet", action="store_true", required=True)
    p.add_argument("-o", "--output")
    p.add_argument("--salvage", action="store_true")
    p.add_argument("file")
    ns = p.parse_args(args)
    out = ns.output or os.path.splitext(ns.file)[0] + ".parquet"
    trace = load(ns.file, salvage=ns.salvage)
    os.makedirs(out, exist_ok=True)
    rows = {}
    for name in ("events", "calls", "code"):
        df = getattr(trace, name)()
        df.write_parquet(os.path.join(out, f"{name}.parquet"))
        rows[name] = df.height
    print(f"wrote {out}: events.parquet ({rows['events']} rows), calls.parquet ({rows['calls']} rows), "
          f"code.parquet ({rows['code']} rows)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ANALYZE_COMMANDS:
        try:
            return _analyze(argv)
        except OcularError as e:
            print(f"python -m ocular: error: {e}", file=sys.stderr)
            return 2
    from ._interp import check_supported
    from ._recorder import _native

    try:
        check_supported()  # before the extension is imported: a clear error on an unsupported Python
        sys.stdout.flush()  # clap writes to the file descriptors directly
        sys.stderr.flush()
        opts = _native().parse_run(argv)
        if isinstance(opts, int):  # help was printed, or a usage error
            return opts
        return _run(opts)
    except OcularError as e:
        print(f"python -m ocular: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None and str(opts["output"]) in str(e):
            print(f"python -m ocular: error: cannot write the trace: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
