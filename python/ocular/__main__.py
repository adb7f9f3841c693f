"""``python -m ocular`` (or the ``ocular`` command): record a script or module, and analyze the trace.

    python -m ocular run [-o run.ocl] [--mode M] [--threshold N] [--include P]... [--exclude P]... script.py [args]
    python -m ocular run [options] -m module [args]
    python -m ocular info|hot|stats|spans|export|flamegraph|report|specialize|diff|dump|top ... (the commands of
    ocular-analyze)

``pip install`` makes two commands of it (pyproject.toml's ``[project.scripts]``): ``ocular`` (all of the
above: :func:`console_main`) and ``ocular-analyze`` (the analyzer's commands alone, as its Rust binary has
them: :func:`analyze_main`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

from . import _recorder
from ._recorder import Recording
from .errors import OcularError

# The analyzer's commands, run by the analyzer compiled into the extension (the same clap parser).
ANALYZE_COMMANDS = ("info", "hot", "stats", "export", "flamegraph", "dump", "top", "report", "specialize", "diff",
                    "spans")


def _run(opts: dict, prog: str) -> int:
    """Runs the program `opts` describes (from the extension's parser, see ``_native().parse_run``).
    Whatever keeps the program from starting is found before recording starts: it gets one line on
    stderr (after `prog`, the name the command was run by), a non-zero exit code, and no trace is written."""
    module = opts["module"]
    if module is None and not opts["argv"]:
        print(f"{prog} run: give a script to run, or -m MODULE", file=sys.stderr)
        return 2
    if module is None:
        script = opts["argv"][0]
        if not os.path.exists(script):
            # A console script on PATH (`ocular run pylint`), as `python -m pylint` would run it.
            found, why = _console_script(script)
            if found is None:
                print(f"{prog} run: {script}: {why}", file=sys.stderr)
                return 2
            script = opts["argv"][0] = found
        program = script
    else:
        sys.path[0] = os.getcwd()
        error, program = _find_module(module)
        if error:
            print(f"{prog} run: {error}", file=sys.stderr)
            return 1
    if program is not None and _same_file(opts["output"], program):
        print(f"{prog} run: the trace {os.fsdecode(opts['output'])} would overwrite the program "
              f"{program}: choose another output with -o", file=sys.stderr)
        return 2
    if module is None:
        missing = _missing_main(script)
        if missing:
            print(f"{prog} run: {missing}", file=sys.stderr)
            return 1
        if os.path.isfile(script) and _binary(script) and not _is_zip(script):
            print(f"{prog} run: {_program_not_script(script, script)}", file=sys.stderr)
            return 2
        sys.path[0] = os.path.dirname(os.path.abspath(script))
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
        import runpy  # only here: a script runs without it, as under `python script.py`

        def target() -> None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    try:
        rec = Recording(opts["output"], **opts["options"])
    except ValueError as e:
        print(f"{prog} run: {e}", file=sys.stderr)
        return 2
    try:
        with _said_as(prog):
            rec.start()
    except ValueError as e:
        print(f"{prog} run: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # The message names the file: a missing directory, no permission, another recording writing it.
        print(f"{prog} run: cannot write the trace: {e}", file=sys.stderr)
        return 2
    # A child the program forks (os.fork) and that returns here must not report its parent's file.
    parent = os.getpid()
    code = 0
    failed: BaseException | None = None
    try:
        try:
            target()
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException as e:  # noqa: BLE001 - reported below as python reports it, after the stop
            failed = e
    finally:
        if os.getpid() == parent:
            with _said_as(prog):
                rec.stop()
            if not opts["quiet"]:
                print(f"ocular: wrote {rec.summary()}", file=sys.stderr)
    if failed is not None:
        if os.getpid() != parent:
            raise failed
        # As `python script.py` reports it: through sys.excepthook, without the frames of Ocular and runpy
        # that lead to the program.
        tb = _program_frames(failed.__traceback__)
        sys.excepthook(type(failed), failed.with_traceback(tb), tb)
        if isinstance(failed, KeyboardInterrupt):
            # Raised on, so that python ends as it does on one (atexit handlers, then SIGINT on itself, which
            # a shell or a parent sees); it was printed above.
            sys.excepthook = lambda *args: None
            raise failed
        return 1
    return code


def _program_frames(tb):  # type: ignore[no-untyped-def]
    """The traceback `tb` from the program's first frame on: the leading frames of this package and of
    runpy are how the program was started, not part of it."""
    here = os.path.dirname(os.path.abspath(__file__))
    runpy = sys.modules.get("runpy")
    runpy_file = runpy.run_module.__code__.co_filename if runpy is not None else None
    first = tb
    while first is not None:
        name = first.tb_frame.f_code.co_filename
        if not (os.path.dirname(os.path.abspath(name)) == here or name == runpy_file):
            return first
        first = first.tb_next
    return tb


class _said_as:
    """Warnings of the recorder's start and stop shown as `ocular: warning: ...`: they are about the run, and
    Python's own form placed them at a line of runpy (`<frozen runpy>:88: RuntimeWarning: ...`), the first
    frame outside Ocular. The warning filters still apply (``-W ignore`` silences them). Nothing is imported
    for it: the recorder shows its warnings so while this is set (``_recorder._warn_user``)."""

    def __init__(self, prog: str) -> None:
        self.prog = prog

    def __enter__(self) -> None:
        self.saved = _recorder._warnings_as
        _recorder._warnings_as = self.prog

    def __exit__(self, *exc: object) -> None:
        # Run recorded, after the start: no import here, whose machinery (importlib's _handle_fromlist) is Python.
        _recorder._warnings_as = self.saved


def _console_script(name: str) -> tuple[str | None, str]:
    """The Python script `name` runs as a command on PATH (pip's console scripts: `pylint`, `black`), or
    (None, why not)."""
    import shutil

    if os.sep in name or (os.altsep and os.altsep in name) or name.endswith((".py", ".pyw")):
        return None, "no such file"
    found = shutil.which(name)
    if found is None:
        return None, "no such file, nor a command on PATH"
    try:
        with open(found, "rb") as f:
            first = f.readline(256)
    except OSError as e:
        return None, f"the command {found} cannot be read: {e.strerror}"
    if not (first.startswith(b"#!") and b"python" in first):
        return None, _program_not_script(found, f"the command {found}")
    return found, ""


def _program_not_script(path: str, what: str) -> str:
    """Why `path`, a program and not a Python script, cannot be run: most often the interpreter itself
    (`ocular run python app.py`), which ocular replaces."""
    if _same_file(path, sys.executable) or os.path.basename(path).startswith("python"):
        return (f"{what} is a Python interpreter, not a script: ocular run takes the script itself "
                f"(ocular run app.py ARGS, or ocular run -m module ARGS)")
    return (f"{what} is not a Python script: ocular records Python programs (run the Python program it starts "
            f"instead)")


def _binary(path: str) -> bool:
    """Whether `path` is a file of machine code or other binary data rather than source (a NUL in its
    first bytes; zip files, which python runs, are told apart after, as importing zipfile costs every run
    ~15 ms)."""
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(512)
    except OSError:
        return False



def _same_file(a: str | bytes, b: str | bytes) -> bool:
    """Whether `a` and `b` are one file (by device and inode, following symlinks); False if either is
    missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _find_module(name: str) -> tuple[str | None, str | None]:
    """Finds module `name` as ``python -m`` would, without running any of it when it can: (the error
    ``python -m`` would print, or None; the module's file, or None)."""
    import importlib.util

    try:
        # Parents are looked up without being imported, so that their code runs (and is recorded) with
        # the program; only when that finds nothing does importlib's own lookup, which imports them, decide.
        spec = _spec_without_import(name) or importlib.util.find_spec(name)
    except Exception as e:  # noqa: BLE001 - as python -m reports any error of the lookup
        return f"Error while finding module specification for {name!r} ({type(e).__name__}: {e})", None
    if spec is None:
        return f"No module named {name}", None
    if spec.submodule_search_locations is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return "Cannot use package as __main__ module", None
        error, origin = _find_module(name + ".__main__")
        if error:
            return f"{error}; {name!r} is a package and cannot be directly executed", None
        return None, origin
    return None, spec.origin if spec.has_location else None


def _spec_without_import(name: str):
    import importlib.machinery
    import importlib.util

    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)  # a top-level name: nothing is imported
    pspec = _spec_without_import(parent)
    if pspec is None or pspec.submodule_search_locations is None:
        return None
    loaded = sys.modules.get(parent)
    path = getattr(loaded, "__path__", None) or pspec.submodule_search_locations
    return importlib.machinery.PathFinder.find_spec(name, list(path))


def _missing_main(path: str) -> str | None:
    """For a directory or zip file: python's error if it has no ``__main__`` module."""
    if not (os.path.isdir(path) or not path.endswith((".py", ".pyw")) and _is_zip(path)):
        return None
    import pkgutil

    importer = pkgutil.get_importer(path)
    if importer is not None and importer.find_spec("__main__") is None:
        return f"can't find '__main__' module in {path!r}"
    return None


def _script(path: str) -> "Callable[[], None]":
    """A script file, read and compiled now, to run later as ``runpy.run_path(path, run_name="__main__")``
    would: a fresh ``__main__`` module with the same globals. Directories and zip files with a
    ``__main__.py`` go through runpy itself."""
    if os.path.isdir(path) or not path.endswith((".py", ".pyw")) and _is_zip(path):
        import pkgutil  # noqa: F401 - see _run
        import runpy

        return lambda: runpy.run_path(path, run_name="__main__") and None
    import io

    with io.open_code(path) as f:
        source = f.read()
    from ._recorder import _native

    # As compile(source, path, "exec", dont_inherit=True), less the ~4 ms its first call spends building the
    # _ast module's classes, which `python script.py` does not.
    compiled = _native().compile_script(source, path)
    module = type(sys)("__main__")  # types.ModuleType, without importing types
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


def _analyze(argv: list[str], prog: str) -> int:
    """Runs an analyzer command; `prog` names it in help and messages. The extension has no polars inside,
    so ``export --parquet`` is done here from the Arrow tables with polars' own Parquet writer."""
    try:
        if argv[:1] == ["export"] and "--parquet" in argv and not any(a in ("-h", "--help") for a in argv):
            return _export_parquet(argv[1:], prog)
        from ._recorder import _native

        sys.stdout.flush()
        sys.stderr.flush()
        return _native().cli(argv, prog)
    except (OcularError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def _export_parquet(args: list[str], prog: str) -> int:
    import argparse

    from ._analysis import load

    p = argparse.ArgumentParser(prog=f"{prog} export --parquet")
    p.add_argument("--parquet", action="store_true", required=True)
    p.add_argument("-o", "--output")
    p.add_argument("--salvage", action="store_true")
    p.add_argument("file")
    ns = p.parse_args(args)
    out = ns.output or os.path.splitext(ns.file)[0] + ".parquet"
    # The tables the Rust binary's export writes, from the same engine.
    names = ("events", "calls", "code", "lost", "counter_samples", "lines", "functions", "coroutines", "tasks",
             "spans")
    paths = {name: os.path.join(out, f"{name}.parquet") for name in names}
    for o in (out, *paths.values()):
        if _same_file(ns.file, o):
            raise OcularError(f"{o} is the input trace {ns.file}: writing it would destroy the trace; "
                              f"choose another output with -o")
    if os.path.exists(out) and not os.path.isdir(out):
        raise OcularError(f"{out} exists and is not a directory: --parquet writes a directory of tables; "
                          f"choose another output with -o")
    trace = load(ns.file, salvage=ns.salvage)
    new_dir = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    rows = {}
    # Each table is written beside its final name and renamed into place once all are whole: a failed
    # export leaves the tables that were there before, and removes only what it created.
    written = []
    done = False
    try:
        for name in names:
            df = getattr(trace, name)()
            tmp = os.path.join(out, f".{name}.parquet.{os.getpid()}.tmp")
            written.append(tmp)
            df.write_parquet(tmp)
            rows[name] = df.height
        for name, tmp in zip(names, written):
            os.replace(tmp, paths[name])
        written.clear()
        done = True
    finally:
        for tmp in written:
            try:
                os.remove(tmp)
            except OSError:
                pass
        if not done and new_dir:
            try:
                os.rmdir(out)
            except OSError:
                pass
    print(f"wrote {out}: " + ", ".join(f"{name}.parquet ({rows[name]} rows)" for name in names), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m ocular") -> int:
    """Runs ``python -m ocular`` with `argv` (default: the process's arguments) and returns its exit code;
    `prog` is the name help and messages give the command."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ANALYZE_COMMANDS:
        return _analyze(argv, prog)
    if argv in (["--version"], ["-V"]):
        from ._recorder import VERSION

        print(f"ocular {VERSION} (Python {sys.version.split()[0]})")
        return 0
    from ._interp import check_supported
    from ._recorder import _native

    try:
        check_supported()  # before the extension is imported: a clear error on an unsupported Python
        sys.stdout.flush()  # clap writes to the file descriptors directly
        sys.stderr.flush()
        opts = _native().parse_run(argv, prog)
        if isinstance(opts, int):  # help was printed, or a usage error
            return opts
        return _run(opts, prog)
    except OcularError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def console_main() -> None:
    """The ``ocular`` command: ``python -m ocular`` under its own name (every command, the recorder's
    ``run`` and the analyzer's)."""
    sys.exit(main(prog="ocular"))


def analyze_main() -> None:
    """The ``ocular-analyze`` command: the analyzer compiled into the extension, with the commands,
    options, output and exit codes of the Rust binary of that name (``export --parquet`` through polars,
    as ``python -m ocular export --parquet``). Without arguments it prints its help."""
    sys.exit(_analyze(sys.argv[1:], "ocular-analyze"))


if __name__ == "__main__":
    sys.exit(main())
