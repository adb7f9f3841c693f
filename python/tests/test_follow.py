"""Whole programs: python -m ocular run follows the Python processes a program starts, and the analyzer reads
the run as one trace (FORMAT.md 10)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))


def run(tmp_path, source, *args, follow=True, mode="calls"):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(source))
    out = tmp_path / "run.ocl"
    cmd = [sys.executable, "-m", "ocular", "run", "-o", str(out), "--mode", mode]
    if not follow:
        cmd.append("--no-follow")
    r = subprocess.run([*cmd, str(script), *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    return out, r


def analyze(*args):
    r = subprocess.run([ANALYZE, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def info(out):
    return json.loads(analyze("info", "--json", out))


def calls_per_process(out, function):
    """pid -> calls of `function` in that process, from stats --per-process."""
    rows = json.loads(analyze("stats", "--json", "--per-process", "--top", "100000", out))
    return {r["pid"]: r["calls"] for r in rows if r["function"] == function}


POOL = """
    import json, multiprocessing as mp, os, sys
    def leaf(x):
        return x + 1
    def task(n):
        s = 0
        for _ in range(n):
            s = leaf(s)
        return os.getpid(), n
    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        with ctx.Pool(4) as pool:
            done = pool.map(task, [1000 + 7 * i for i in range(40)], chunksize=1)
        per = {}
        for pid, n in done:
            per[pid] = per.get(pid, 0) + n
        print(json.dumps(per))
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_pool_s_workers_are_recorded_each_call_counted(tmp_path, method):
    out, r = run(tmp_path, POOL, method)
    made = {int(pid): n for pid, n in json.loads(r.stdout).items()}
    assert sum(made.values()) == sum(1000 + 7 * i for i in range(40))
    # Every worker's calls of leaf(), exactly, as each worker counted them itself.
    assert calls_per_process(out, "leaf") == made
    procs = info(out)["processes"]
    root = procs[0]
    assert root["started"] == "run" and root["parent_pid"] == 0
    workers = [p for p in procs if p["pid"] in made]
    assert len(workers) == len(made)
    if method == "fork":
        assert all(p["started"] == "fork" and p["parent_pid"] == root["pid"] for p in workers)
    elif method == "spawn":
        assert all(p["started"] == "exec" and p["parent_pid"] == root["pid"] for p in workers)
    else:
        # Forked by the forkserver, itself a new interpreter the program started.
        server = {p["pid"] for p in procs if p["started"] == "exec" and "forkserver" in " ".join(p["argv"])}
        assert len(server) == 1 and all(p["parent_pid"] in server for p in workers)
    assert "child process" in r.stderr and str(tmp_path / "run.ocl.children") in r.stderr
    # Merged, the run's stats count every call of every process.
    rows = {x["function"]: x for x in json.loads(analyze("stats", "--json", "--top", "100000", out))}
    assert rows["leaf"]["calls"] == sum(made.values()) and rows["leaf"]["pid"] == 0
    assert rows["leaf"]["processes"] == len(made)


def test_a_process_pool_executor_is_followed(tmp_path):
    out, r = run(tmp_path, """
        import concurrent.futures as cf
        def leaf(x):
            return x + 1
        def task(n):
            s = 0
            for _ in range(n):
                s = leaf(s)
            return s
        if __name__ == "__main__":
            with cf.ProcessPoolExecutor(2) as ex:
                print(sum(ex.map(task, [500] * 6)))
    """)
    assert r.stdout.strip() == "3000"
    assert sum(calls_per_process(out, "leaf").values()) == 3000


def test_a_python_subprocess_is_recorded_as_a_child(tmp_path):
    (tmp_path / "child.py").write_text("def hello():\n    return 1\nfor _ in range(321):\n    hello()\n")
    out, r = run(tmp_path, """
        import subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
    """)
    procs = info(out)["processes"]
    assert len(procs) == 2
    child = procs[1]
    assert child["started"] == "exec" and child["parent_pid"] == procs[0]["pid"]
    assert child["argv"][-1] == "child.py"
    assert calls_per_process(out, "hello") == {child["pid"]: 321}


def test_a_run_read_as_soon_as_it_ends_waits_for_a_child_that_still_records(tmp_path):
    # CPython 3.14's multiprocessing forkserver outlives its parent and finishes its trace after `ocular
    # run` returned: a run read at once read that trace in part (and once failed on its last chunk, half
    # written). Here the child, once it records, outlives the parent by 0.5 s, then calls hello() 321 times.
    (tmp_path / "child.py").write_text("import time\ndef hello():\n    return 1\nopen('started', 'w').close()\n"
                                       "time.sleep(0.5)\nfor _ in range(321):\n    hello()\n")
    (tmp_path / "prog.py").write_text("import os, subprocess, sys, time\n"
                                      "subprocess.Popen([sys.executable, 'child.py'], stdout=subprocess.DEVNULL,\n"
                                      "                 stderr=subprocess.DEVNULL)\n"
                                      "while not os.path.exists('started'):\n    time.sleep(0.01)\n")
    out = tmp_path / "run.ocl"
    # -q: no summary, whose reading of the run would wait for the child before the command returns. (The
    # child writes to no pipe of ours: reading the pipes to their end would wait for it too.)
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "-o", str(out), "--mode", "calls", "prog.py"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    procs = info(out)["processes"]
    assert len(procs) == 2, procs
    assert calls_per_process(out, "hello") == {procs[1]["pid"]: 321}


def test_a_child_of_the_same_interpreter_takes_its_parent_s_calibration(tmp_path):
    # Measuring it again took ~1 ms of every child's start; the child's stop still times the speed probe.
    (tmp_path / "child.py").write_text("def hello():\n    return 1\nfor _ in range(321):\n    hello()\n")
    out, r = run(tmp_path, """
        import subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
    """, mode="adaptive")
    parent = info(out)
    child = info(out.parent / (out.name + ".children") / f"{parent['processes'][1]['pid']}.ocl")
    for key in ("ticks_per_second", "event_cost_ns"):
        assert child[key] == parent[key], key
    assert child["cost_speed_ratio"] > 0


def test_a_calibration_measured_by_another_interpreter_is_not_taken(monkeypatch):
    from ocular import _recorder

    monkeypatch.setattr(_recorder, "_calibrations", {})
    handed = {"python": sys.version, "executable": sys.executable, "recorder": _recorder.VERSION,
              "key": ["calls", 0, 65536, False, False], "cost": 99.0, "per_kind": [[0, 99.0]], "hz": 1e9,
              "probe": [600, 30.0]}
    for other in ({"python": "3.12.1 (other)"}, {"executable": "/other/python"}, {"recorder": "ocular 0.0.1"}):
        _recorder.take_handed_down_calibration({**handed, **other})
    assert _recorder._calibrations == {}
    _recorder.take_handed_down_calibration(handed)
    (cost, per_kind, hz, (once, n, base)), = _recorder._calibrations.values()
    assert (cost, per_kind, hz, n, base) == (99.0, [(0, 99.0)], 1e9, 600, 30.0) and once() > 0
    # What the parent hands down is JSON: a measurement that is not (a NaN) is not handed down at all.
    key = tuple(handed["key"])
    assert _recorder.handed_down_calibration(key)["cost"] == 99.0
    _recorder._calibrations[key] = (float("nan"), per_kind, hz, (once, n, base))
    assert _recorder.handed_down_calibration(key) is None


# Modules a followed child would pay for at its start if Ocular imported them (json imports re and enum).
HEAVY = ("json", "re", "enum", "typing", "functools", "collections", "shutil", "random", "zipfile", "pathlib", "fnmatch",
         "threading", "opcode", "warnings")


def test_a_followed_child_imports_nothing_heavy_that_it_would_not_import_unrecorded(tmp_path):
    # Not even threading or opcode: the recorder leaves threading to the program, and the opcode tables are
    # kept from the parent's start (the runtime directory's cache).
    show = f"import sys\nprint(' '.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    (tmp_path / "child.py").write_text(show + "def hello():\n    return 1\nhello()\n")
    plain = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True, cwd=tmp_path, check=True)
    out, r = run(tmp_path, """
        import subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
    """)
    assert set(r.stdout.split()) <= set(plain.stdout.split()), (r.stdout, plain.stdout)
    procs = info(out)["processes"]
    assert len(procs) == 2 and calls_per_process(out, "hello") == {procs[1]["pid"]: 1}


def test_ocular_run_imports_nothing_heavy_before_the_script_that_python_would_not(tmp_path):
    # What `ocular run` imports is paid by every run before the script's first line (zipfile alone, imported
    # to tell a zip from a binary, was ~15 ms; threading and opcode ~2-4). The first run of an interpreter
    # makes its opcode tables, importing opcode, and keeps them in the runtime directory for the next.
    # The plain run is started by -m too, as `python -m ocular` is: what -m itself brings (runpy, and on 3.12
    # importlib's own import of warnings) is python's, not Ocular's.
    show = f"import sys\nprint(' '.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    (tmp_path / "show_modules.py").write_text(show)
    plain = subprocess.run([sys.executable, "-m", "show_modules"], capture_output=True, text=True, check=True,
                           cwd=tmp_path)
    run(tmp_path, "pass", follow=False)
    _, r = run(tmp_path, show, follow=False)
    assert set(r.stdout.split()) <= set(plain.stdout.split()), (r.stdout, plain.stdout)


def test_the_run_s_settings_are_json_as_json_writes_and_reads_them():
    import importlib.util

    from ocular import _follow

    # The children's sitecustomize, by its path: run, it would start a recording (without OCULAR_FOLLOW it
    # does nothing but import the next sitecustomize).
    spec = importlib.util.spec_from_file_location("ocular_site_hook", os.path.join(_follow.SITE_DIR, "sitecustomize.py"))
    site_hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site_hook)

    config = {"dir": "/tmp/r\u00e9sum\u00e9 \"x\"\\\n\u2028\U0001f600.ocl.children", "run_id": 2**62 + 7, "package": "/p",
              "options": {"mode": "adaptive", "window_period": 0.0025, "include_only": ["a.*", "b"], "sampled": False,
                          "ring": None, "counters": [], "dump_when": ["slower_than('x', 0.25)"]}, "dump_on": 10}
    text = _follow.dumps(config)
    assert text == json.dumps(config)
    assert site_hook._ocular_loads(text) == config
    for bad in ('{"dir": 1} x', '{"dir": ', ""):
        with pytest.raises(json.JSONDecodeError):
            site_hook._ocular_loads(bad)
    with pytest.raises(ValueError, match="no JSON form"):
        _follow.dumps({"x": float("nan")})
    with pytest.raises(TypeError, match="keys are text"):
        _follow.dumps({1: 2})


def test_a_fork_bomb_of_depth_3_and_width_2_is_seven_processes_with_their_parents(tmp_path):
    out, r = run(tmp_path, """
        import os
        def leaf():
            return 1
        def grow(depth):
            leaf()
            if depth == 3:
                return
            kids = []
            for _ in range(2):
                pid = os.fork()
                if pid == 0:
                    grow(depth + 1)
                    os._exit(0)
                kids.append(pid)
            for k in kids:
                os.waitpid(k, 0)
        grow(1)
    """)
    procs = info(out)["processes"]
    assert len(procs) == 7
    pids = {p["pid"] for p in procs}
    children = {}
    for p in procs[1:]:
        assert p["started"] == "fork" and p["parent_pid"] in pids, p
        children.setdefault(p["parent_pid"], []).append(p["pid"])
    # The root has 2 children, each of them 2, and those none: depth 3, width 2.
    root = procs[0]["pid"]
    assert len(children[root]) == 2
    assert all(len(children[c]) == 2 for c in children[root])
    assert sum(len(v) for v in children.values()) == 6
    # Each process called leaf() once.
    assert calls_per_process(out, "leaf") == {pid: 1 for pid in pids}


def test_exec_keeps_the_trace_before_it_and_records_the_new_program(tmp_path):
    out, r = run(tmp_path, """
        import os, sys
        def before():
            return 1
        pid = os.fork()
        if pid == 0:
            before()
            os.execv(sys.executable, [sys.executable, "-c", "def after():\\n  return 2\\nafter(); after()"])
        os.waitpid(pid, 0)
    """)
    procs = info(out)["processes"]
    forked = [p for p in procs if p["started"] == "fork"]
    execd = [p for p in procs if p["started"] == "exec"]
    assert len(forked) == 1 and len(execd) == 1
    # The same process before and after its exec: two files, PID.ocl then PID.2.ocl.
    assert forked[0]["pid"] == execd[0]["pid"] and forked[0]["closed_cleanly"]
    assert execd[0]["file"].endswith(f"{forked[0]['pid']}.2.ocl")
    assert calls_per_process(out, "before") == {forked[0]["pid"]: 1}
    assert calls_per_process(out, "after") == {execd[0]["pid"]: 2}


def test_a_child_killed_outright_keeps_its_events(tmp_path):
    out, r = run(tmp_path, """
        import os, signal
        def leaf():
            return 1
        pid = os.fork()
        if pid == 0:
            for _ in range(2500):
                leaf()
            os.kill(os.getpid(), signal.SIGKILL)
        os.waitpid(pid, 0)
    """)
    procs = info(out)["processes"]
    child = procs[1]
    # Every call up to the kill: the run's end completed the child's trace from its ring file, which is
    # gone, so the trace no longer depends on it.
    assert "(1 killed, their traces completed from their ring files)" in r.stderr
    assert child["closed_cleanly"]
    assert calls_per_process(out, "leaf") == {child["pid"]: 2500}
    assert not [f for f in os.listdir(str(out) + ".children") if f.endswith(".completing")]


OLD_PYTHONS = [p for p in ("/usr/bin/python3", "/usr/bin/python3.11") if os.path.exists(p)]


def _version(python):
    r = subprocess.run([python, "-c", "import sys; print(sys.version_info[0] * 100 + sys.version_info[1])"],
                       capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})
    return int(r.stdout or 0)


OLD = next((p for p in OLD_PYTHONS if 300 <= _version(p) < 312), None)


@pytest.mark.skipif(OLD is None, reason="no CPython older than 3.12 on this machine to start as a child")
def test_a_child_on_an_unsupported_python_runs_and_is_reported(tmp_path):
    out, r = run(tmp_path, f"""
        import subprocess
        p = subprocess.run([{OLD!r}, "-c", "print('old python ran')"], capture_output=True, text=True, check=True)
        print(p.stdout.strip())
    """)
    assert r.stdout.strip() == "old python ran"
    i = info(out)
    assert len(i["processes"]) == 1
    (u,) = i["unrecorded"]
    assert u["executable"] == OLD and u["parent_pid"] == i["processes"][0]["pid"]
    assert "cannot be recorded: Ocular needs 3.12 or later" in u["reason"]
    text = analyze("info", out)
    assert f"not recorded: pid {u['pid']}" in text and "Ocular needs 3.12 or later" in text
    assert "1 not recorded" in r.stderr


def test_no_follow_records_the_parent_only(tmp_path):
    (tmp_path / "child.py").write_text("print('child ran')\n")
    out, r = run(tmp_path, """
        import os, subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("OCULAR_FOLLOW" in os.environ)
    """, follow=False)
    assert r.stdout.split() == ["child", "ran", "False"]
    assert not os.path.exists(str(out) + ".children")
    assert "processes" not in info(out)


def test_a_run_is_one_trace_for_every_export(tmp_path):
    pl = pytest.importorskip("polars")
    import ocular

    out, r = run(tmp_path, POOL, "fork")
    made = {int(pid): n for pid, n in json.loads(r.stdout).items()}
    pids = {p["pid"] for p in info(out)["processes"]}
    # Tables: a pid column, every process's rows, times on one clock from the first process's start.
    calls = ocular.load(str(out)).calls()
    # (A worker terminated while it was still starting has no call recorded.)
    assert calls.columns[0] == "pid" and set(made) <= set(calls["pid"].unique().to_list()) <= pids
    leaf = calls.filter(pl.col("function") == "leaf").group_by("pid").len()
    assert dict(leaf.iter_rows()) == made
    assert calls["start_ns"].min() >= 0
    # ocular.load() of the first file is the run: stats merged, info and hot over every process.
    trace = ocular.load(str(out))
    leaf_row = [r for r in trace.stats() if r["function"] == "leaf"]
    assert len(leaf_row) == 1 and leaf_row[0]["calls"] == sum(made.values()) and leaf_row[0]["pid"] == 0
    assert {p["pid"] for p in trace.info()["processes"]} == pids
    assert trace.hot()["processes"] == len(pids)
    pq = tmp_path / "pq"
    analyze("export", "--parquet", out, "-o", pq)
    assert pl.read_parquet(pq / "calls.parquet").height == calls.height
    assert set(made) <= set(pl.read_parquet(pq / "code.parquet")["pid"].unique().to_list()) <= pids
    # Perfetto: one process per pid, the children labelled with their parent.
    js = tmp_path / "r.json"
    analyze("export", "--perfetto", out, "-o", js)
    events = json.loads(js.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == pids
    labels = {e["pid"]: e["args"]["labels"] for e in events if e.get("name") == "process_labels"}
    root = info(out)["processes"][0]["pid"]
    assert labels == {p: f"forked by {root}" for p in pids - {root}}
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

    pf = tmp_path / "r.pftrace"
    analyze("export", "--perfetto", out, "-o", pf)
    t = P.Trace.FromString(pf.read_bytes())
    procs = {p.track_descriptor.process.pid for p in t.packet
             if p.HasField("track_descriptor") and p.track_descriptor.HasField("process")}
    assert procs == pids
    # The flame graph: each process's stacks under a frame naming it.
    folded = analyze("flamegraph", "--folded", out)
    roots = {int(line.split(" ", 1)[0]) for line in folded.splitlines()}
    assert set(made) <= roots <= pids


@pytest.mark.parametrize("follow", [True, False])
def test_a_child_terminated_right_after_its_fork_dies_of_the_signal(tmp_path, follow):
    # SIGTERM in the moments after fork, before the fork hooks have run: the parent's recording, still
    # the active one there, must not be stopped (that raised, the signal was lost, and the child lived
    # on: a pool program hung in join()).
    out, r = run(tmp_path, """
        import os, signal, sys, time
        lived = 0
        for i in range(40):
            pid = os.fork()
            if pid == 0:
                time.sleep(3)
                os._exit(7)
            time.sleep(0.0005 * (i % 4))
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            lived += os.WIFEXITED(status)
        print(lived)
    """, follow=follow)
    assert r.stdout.strip() == "0", r.stderr
    assert "Traceback" not in r.stderr and "panicked" not in r.stderr, r.stderr
