"""``python -m ocular`` when something is wrong: one clean line, a non-zero exit code, no trace destroyed and
none written for a program that could not start."""

import os
import resource
import subprocess
import sys
import time

import pytest

import ocular

HELLO = 'print("hello")\n'


def run_ocular(*args, cwd=None, **kw):
    return subprocess.run([sys.executable, "-m", "ocular", *args], capture_output=True, text=True, cwd=cwd, **kw)


@pytest.fixture
def trace(tmp_path):
    """A small trace, t.ocl, in tmp_path (the working directory of the commands)."""
    (tmp_path / "w.py").write_text("def f(i):\n    return i\nfor i in range(100):\n    f(i)\n")
    r = run_ocular("run", "-q", "-o", "t.ocl", "w.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "t.ocl"


def names(d):
    return sorted(os.listdir(d))


# -- outputs that are inputs ------------------------------------------------------------------------------


def test_run_refuses_an_output_that_is_the_script_before_it_runs(tmp_path):
    (tmp_path / "w.py").write_text(HELLO)
    os.symlink("w.py", tmp_path / "link.py")
    for out in ("w.py", "./w.py", "link.py"):
        r = run_ocular("run", "-o", out, "w.py", cwd=tmp_path)
        assert r.returncode == 2
        assert r.stdout == ""
        assert r.stderr == (f"python -m ocular run: the trace {out} would overwrite the program w.py: "
                            f"choose another output with -o\n")
        assert (tmp_path / "w.py").read_text() == HELLO


@pytest.mark.parametrize("args", [
    ("export", "--perfetto", "t.ocl", "-o", "t.ocl"),
    ("export", "--perfetto", "t.ocl", "-o", "./t.ocl"),
    ("flamegraph", "t.ocl", "-o", "t.ocl"),
    ("export", "--parquet", "t.ocl", "-o", "t.ocl"),
])
def test_an_export_refuses_an_output_that_is_the_input_and_keeps_the_trace(trace, args):
    before = trace.read_bytes()
    r = run_ocular(*args, cwd=trace.parent)
    assert r.returncode == 2
    out = args[-1]
    # Every command names itself as it was run (the analyzer's too).
    assert r.stderr == (f"python -m ocular: error: {out} is the input trace t.ocl: writing it would destroy the trace; "
                        f"choose another output with -o\n")
    assert trace.read_bytes() == before
    assert names(trace.parent) == ["t.ocl", "w.py"]


def test_export_parquet_refuses_an_output_that_is_a_file_and_keeps_it(trace):
    (trace.parent / "t.parquet").write_text("mine")
    r = run_ocular("export", "--parquet", "t.ocl", cwd=trace.parent)
    assert r.returncode == 2
    assert r.stderr == ("python -m ocular: error: t.parquet exists and is not a directory: --parquet writes a "
                        "directory of tables; choose another output with -o\n")
    assert (trace.parent / "t.parquet").read_text() == "mine"


def test_export_parquet_writes_the_tables_and_no_temporary(trace):
    pytest.importorskip("polars")
    r = run_ocular("export", "--parquet", "t.ocl", cwd=trace.parent)
    assert r.returncode == 0, r.stderr
    assert names(trace.parent / "t.parquet") == ["calls.parquet", "code.parquet", "coroutines.parquet",
                                                 "counter_samples.parquet", "events.parquet", "functions.parquet",
                                                 "lines.parquet", "lost.parquet", "spans.parquet",
                                                 "tasks.parquet"]


def test_export_parquet_of_a_missing_trace_is_one_line(tmp_path):
    r = run_ocular("export", "--parquet", "missing.ocl", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "python -m ocular: error: no such trace: missing.ocl\n")
    assert names(tmp_path) == []


# -- two recordings, one path ---------------------------------------------------------------------------


def test_a_second_recording_to_the_same_path_fails_and_the_first_file_is_whole(tmp_path):
    # GIVEN a recording in progress (the program runs, so the recording has started) ...
    (tmp_path / "slow.py").write_text(
        "import time, pathlib\npathlib.Path('started').touch()\nwhile not pathlib.Path('stop').exists():\n"
        "    time.sleep(0.01)\n")
    (tmp_path / "w.py").write_text(HELLO)
    first = subprocess.Popen([sys.executable, "-m", "ocular", "run", "-o", "same.ocl", "slow.py"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # WHEN a second one records to the same path, from the command line or the API
        r = run_ocular("run", "-o", "same.ocl", "w.py", cwd=tmp_path)
        with pytest.raises(OSError) as e:
            ocular.Recording(tmp_path / "same.ocl").start()
    finally:
        (tmp_path / "stop").touch()
        _, err = first.communicate(timeout=60)
    # THEN it fails before its program runs, naming the path, and the first recording's file is whole
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == ("python -m ocular run: cannot write the trace: same.ocl: another recording is writing it; "
                        "record to another path, or wait until that recording ends\n")
    assert str(e.value) == (f"{tmp_path / 'same.ocl'}: another recording is writing it; record to another path, "
                            f"or wait until that recording ends")
    assert ocular.active() is None
    assert first.returncode == 0, err
    info = ocular.load(tmp_path / "same.ocl").info()
    assert info["closed_cleanly"]
    assert info["events"] > 0
    # AND once it ended, the path is free
    r = run_ocular("run", "-q", "-o", "same.ocl", "w.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# -- programs that cannot start --------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (("-m", "missing_module_xyz"), "No module named missing_module_xyz"),
    (("-m", "json.missing_xyz"), "No module named json.missing_xyz"),
    (("-m", "email"), "No module named email.__main__; 'email' is a package and cannot be directly executed"),
    (("nomain",), "can't find '__main__' module in 'nomain'"),
])
def test_a_program_that_cannot_start_is_one_line_and_writes_no_trace(tmp_path, args, message):
    (tmp_path / "nomain").mkdir()
    r = run_ocular("run", "-o", "x.ocl", *args, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"python -m ocular run: {message}\n")
    assert names(tmp_path) == ["nomain"]


def test_a_trace_that_cannot_be_created_is_one_line_and_the_program_does_not_run(tmp_path):
    (tmp_path / "w.py").write_text(HELLO)
    r = run_ocular("run", "-o", "no/such/dir/x.ocl", "w.py", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("python -m ocular run: cannot write the trace: no/such/dir/x.ocl: "
                        "No such file or directory (os error 2)\n")


def test_a_path_that_is_not_utf8_is_recorded_and_analyzed(tmp_path):
    (tmp_path / "w.py").write_text(HELLO)
    name = b"\xff.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "-o", name, "w.py"], capture_output=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "ocular", "info", name], capture_output=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"closed        cleanly" in r.stdout


# -- the summary line -----------------------------------------------------------------------------------


def test_a_forked_child_does_not_report_its_parents_file(tmp_path):
    (tmp_path / "forker.py").write_text(
        "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\n")
    # (3.12 warns at every fork of a process with threads, the recorder's writer among them.)
    r = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "ocular", "run", "-o", "f.ocl", "forker.py"],
        capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stderr.splitlines()] == ["ocular"], r.stderr
    assert r.stderr.startswith("ocular: wrote f.ocl: ")


def test_the_summary_counts_the_bytes_on_disk_after_a_write_error(tmp_path):
    # The file may not grow past 20 KB (the trace compresses to about 75): writes then fail with EFBIG (Python
    # ignores SIGXFSZ).
    (tmp_path / "big.py").write_text("def f(i):\n    return i\nfor i in range(300_000):\n    f(i)\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    r = subprocess.run([sys.executable, "-m", "ocular", "run", "--threshold", "0", "-o", "big.ocl", "big.py"],
                       capture_output=True, text=True, cwd=tmp_path, preexec_fn=limit)
    assert "File too large" in r.stderr
    summary = [line for line in r.stderr.splitlines() if line.startswith("ocular: wrote")]
    size = os.path.getsize(tmp_path / "big.ocl")
    assert size > 0
    assert f" {size:,} bytes" in summary[0], (size, summary)


def test_a_forked_child_that_outlives_its_parent_does_not_hold_the_lock(tmp_path):
    # GIVEN a program whose forked child runs on after the parent's recording ended
    (tmp_path / "forker.py").write_text(
        "import os, time, pathlib\nif os.fork() == 0:\n"
        "    while not pathlib.Path('stop').exists():\n        time.sleep(0.01)\n    os._exit(0)\n")
    (tmp_path / "w.py").write_text(HELLO)
    # (Output to a file: the child keeps the pipes open.)
    with open(tmp_path / "err.txt", "w") as err:
        r = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-m", "ocular", "run", "-q", "-o",
                            "f.ocl", "forker.py"], stdout=err, stderr=err, cwd=tmp_path, timeout=60)
    try:
        assert r.returncode == 0, (tmp_path / "err.txt").read_text()
        # WHEN the path is recorded to again while the child lives, THEN it is free
        again = run_ocular("run", "-q", "-o", "f.ocl", "w.py", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
    finally:
        (tmp_path / "stop").touch()
