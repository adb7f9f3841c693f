"""The commands ``pip install`` makes (pyproject.toml's ``[project.scripts]``): ``ocular``, every command of
``python -m ocular`` under its own name, and ``ocular-analyze``, the analyzer compiled into the extension
with the Rust binary's commands. ``maturin develop`` installs them into the venv as pip does; the wheel
itself is tested in a venv without Rust by ``make test-wheel`` (scripts/test-wheel.sh)."""

import json
import os
import re
import subprocess
import sys
import sysconfig

import pytest

COMMANDS = ("run", "info", "hot", "stats", "export", "flamegraph", "report", "diff", "specialize", "dump", "top")
ANALYZER_COMMANDS = COMMANDS[1:]

PROGRAM = """\
def work(i):
    return i * i


def main():
    total = 0
    for i in range(37):
        total += work(i)
    print("total", total)


main()
"""


def command(name, *args, cwd=None):
    """Runs the console script `name` of this venv (bin/, where pip and maturin develop put it)."""
    path = os.path.join(sysconfig.get_path("scripts"), name)
    assert os.path.exists(path), f"{path}: the package was installed without its console scripts"
    return subprocess.run([path, *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def trace(tmp_path):
    """prog.py recorded in calls mode by the ``ocular`` command: t.ocl in tmp_path."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = command("ocular", "run", "-q", "--mode", "calls", "-o", "t.ocl", "prog.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "total 16206\n"
    return tmp_path / "t.ocl"


def text_rows(out):
    """(calls, function, file:line) of each row of ``stats``'s table."""
    rows = []
    for line in out.splitlines():
        # A time less the recorder's cost may carry its interval (`~0.21 ±0.17`), or say `exact`.
        t = r"~?[\d.]+(?:\s+(?:±[\d.]+|exact))?"
        m = re.match(rf"^\s*(\d+)\s+{t}\s+[\d.]+%\s+{t}\s+[\d.]+\s+(\S+)\s+(\S+:\d+)$", line)
        if m:
            rows.append((int(m[1]), m[2], m[3]))
    return rows


def test_ocular_help_names_itself_and_every_command():
    r = command("ocular", "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage: ocular <COMMAND>" in r.stdout
    for c in COMMANDS:
        assert re.search(rf"^  {c} ", r.stdout, re.M), f"{c} missing from:\n{r.stdout}"
    # The examples are the command as it was run, ready to copy.
    assert "  ocular run -o run.ocl --mode calls -m http.server 8000" in r.stdout
    assert "python -m ocular" not in r.stdout


def test_ocular_version_names_ocular_and_the_python():
    for flag in ("--version", "-V"):
        r = command("ocular", flag)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"ocular 0.1.0 (Python {sys.version.split()[0]})\n", r.stdout


def test_ocular_without_arguments_prints_its_help():
    r = command("ocular")
    assert r.returncode == 2
    assert "Usage: ocular <COMMAND>" in r.stderr


def test_ocular_run_help_and_an_analyzer_commands_help_name_ocular():
    r = command("ocular", "run", "--help")
    assert r.returncode == 0
    assert "Usage: ocular run [OPTIONS] [SCRIPT [ARGS]]..." in r.stdout
    assert "(ocular top PID, ocular.attach(PID))" in r.stdout
    r = command("ocular", "stats", "--help")
    assert r.returncode == 0
    assert "Usage: ocular stats [OPTIONS] <FILE>" in r.stdout


def test_ocular_analyze_without_arguments_prints_the_analyzers_help():
    # As the Rust binary: the help on stderr, exit code 2.
    r = command("ocular-analyze")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Usage: ocular-analyze <COMMAND>" in r.stderr
    for c in ANALYZER_COMMANDS:
        assert re.search(rf"^  {c} ", r.stderr, re.M), f"{c} missing from:\n{r.stderr}"
    r = command("ocular-analyze", "--help")
    assert r.returncode == 0
    assert "Usage: ocular-analyze <COMMAND>" in r.stdout


def test_stats_of_both_commands_give_the_same_rows(trace):
    """GIVEN a trace recorded with ``ocular run`` WHEN ``ocular stats`` and ``ocular-analyze stats --json``
    read it THEN they give the same functions in the same order, with prog.py's exact call counts."""
    text = command("ocular", "stats", "t.ocl", cwd=trace.parent)
    assert text.returncode == 0, text.stderr
    js = command("ocular-analyze", "stats", "t.ocl", "--json", cwd=trace.parent)
    assert js.returncode == 0, js.stderr
    rows = json.loads(js.stdout)
    assert text_rows(text.stdout) == [(r["calls"], r["function"], f"{r['file']}:{r['line']}") for r in rows]
    calls = {r["function"]: r["calls"] for r in rows}
    assert calls["work"] == 37 and calls["main"] == 1, calls


def test_ocular_analyze_exports_parquet_through_polars(trace):
    pl = pytest.importorskip("polars")
    r = command("ocular-analyze", "export", "--parquet", "t.ocl", "-o", "t.parquet", cwd=trace.parent)
    assert r.returncode == 0, r.stderr
    calls = pl.read_parquet(trace.parent / "t.parquet" / "calls.parquet")
    assert calls.filter(pl.col("function") == "work").height == 37


def test_errors_name_the_command_that_was_run(tmp_path):
    r = command("ocular", "run", "missing.py", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "ocular run: missing.py: no such file\n")
    r = command("ocular-analyze", "stats", "missing.ocl", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("ocular-analyze: error: ") and "missing.ocl" in r.stderr
    r = command("ocular-analyze", "export", "--parquet", "missing.ocl", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "ocular-analyze: error: no such trace: missing.ocl\n")


def test_python_m_ocular_keeps_its_name(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "missing.py"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "python -m ocular run: missing.py: no such file\n")


def test_a_console_script_on_path_is_run_by_its_name(tmp_path):
    # As pip writes one: a Python script with a shebang, in a directory on PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "tool_impl.py").write_text(PROGRAM.replace("main()\n", "") + "\n")
    tool = bin_dir / "mytool"
    tool.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                    "from tool_impl import main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    tool.chmod(0o755)
    (bin_dir / "notpython").write_text("#!/bin/sh\necho hi\n")
    (bin_dir / "notpython").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "--mode", "calls", "-o", "t.ocl", "mytool"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert (r.returncode, r.stdout) == (0, "total 16206\n"), r.stderr
    out = json.loads(command("ocular-analyze", "stats", "--json", "--top", "1000", "t.ocl", cwd=tmp_path).stdout)
    assert [row["calls"] for row in out if row["function"] == "work"] == [37], out
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-o", "u.ocl", "notpython"], capture_output=True,
                       text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2 and not (tmp_path / "u.ocl").exists()
    assert r.stderr == (f"python -m ocular run: notpython: the command {bin_dir / 'notpython'} is not a Python "
                        f"script: ocular records Python programs (run the Python program it starts instead)\n")
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "nowhere"], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert (r.returncode, r.stderr) == (2, "python -m ocular run: nowhere: no such file, nor a command on PATH\n")


def test_the_interpreter_or_a_binary_given_as_the_script_is_refused_by_name(tmp_path):
    # `ocular run python app.py` (or the interpreter's path) ran the interpreter's machine code as Python
    # source, and python's compiler said "source code string cannot contain null bytes".
    run = [sys.executable, "-m", "ocular", "run", "-o", "t.ocl"]
    r = subprocess.run([*run, sys.executable, "app.py"], capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"python -m ocular run: {sys.executable} is a Python interpreter, "
                                           f"not a script: ocular run takes the script itself (ocular run app.py "
                                           f"ARGS, or ocular run -m module ARGS)\n")
    assert not (tmp_path / "t.ocl").exists()
    blob = tmp_path / "data.bin"
    blob.write_bytes(b"\x7fELF\x02\x01\x01\0" + bytes(64))
    r = subprocess.run([*run, str(blob)], capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"python -m ocular run: {blob} is not a Python script: ocular records "
                                           f"Python programs (run the Python program it starts instead)\n")
    # A zip file holding __main__.py is a program python runs: still run.
    import zipfile

    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as z:
        z.writestr("__main__.py", "print('zipped')\n")
    r = subprocess.run([*run, "-q", "app.pyz"], capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "zipped\n"), r.stderr


@pytest.mark.parametrize("how", ["script", "module"])
def test_an_uncaught_exception_is_reported_as_python_reports_it(tmp_path, how):
    (tmp_path / "boom.py").write_text("def f():\n    raise ValueError('boom')\n\n\nf()\n")
    target = ["boom.py"] if how == "script" else ["-m", "boom"]
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "-o", "t.ocl", *target], capture_output=True,
                       text=True, cwd=tmp_path)
    plain = subprocess.run([sys.executable, *target], capture_output=True, text=True, cwd=tmp_path)
    # The same traceback and exit code as without Ocular: no frame of Ocular's (python -m has runpy's
    # frames of its own; these are how the program was started either way).
    assert r.returncode == plain.returncode == 1

    def frames(text):
        return [line for line in text.replace(str(tmp_path) + os.sep, "").splitlines() if "<frozen runpy>" not in line]

    assert frames(r.stderr) == frames(plain.stderr), r.stderr
    assert "ocular" not in r.stderr, r.stderr
    assert (tmp_path / "t.ocl").exists()
