"""Analysis from Python: ocular.load() reports and DataFrames (checked against the CLI's Parquet export),
the prototype's stop_tracing() report and ocular_trace.json, `python -m ocular hot|info|export`, the
notebook example, and the errors promised for missing packages and bad files."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import ocular
import workloads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))
LOOPS = os.path.join(ROOT, "testdata", "v1.0", "loops-adaptive.ocl")


def _pyocular(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ocular", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("pq") / "loops.parquet"
    r = subprocess.run([ANALYZE, "export", "--parquet", "-o", str(out), LOOPS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_load_reports_match_the_known_loops():
    t = ocular.load(LOOPS)
    assert t.info()["events"] == 4241
    assert "4,241 events" in repr(t)
    loops = {(l["function"], l["iterations"]) for l in t.hot(top=10)["loops"]}
    assert {("count", 1000), ("calls", 300)} <= loops
    assert [l for l in t.hot_text(top=1).splitlines() if l.startswith("#")] == [
        l for l in subprocess.run([ANALYZE, "hot", "--top", "1", LOOPS], capture_output=True, text=True).stdout.splitlines()
        if l.startswith("#")]
    calls = {r["function"]: r["calls"] for r in t.stats()}
    assert calls == {"main": 1, "count": 1, "nested": 1, "calls": 1, "g": 300}


@pytest.mark.parametrize("table", ["events", "calls", "code"])
def test_dataframes_equal_the_parquet_export(exported, table):
    import polars as pl

    df = getattr(ocular.load(LOOPS), table)()
    pq = pl.read_parquet(exported / f"{table}.parquet")
    assert df.columns == pq.columns
    assert df.height == pq.height
    # Text arrives dictionary-encoded (categorical) through Arrow; as strings the frames are equal.
    as_str = df.with_columns(pl.col(pl.Categorical).cast(pl.String))
    assert as_str.equals(pq)


def test_pandas_variants_have_the_same_rows_and_columns(exported):
    import pandas as pd

    t = ocular.load(LOOPS)
    for table in ("events", "calls", "code"):
        df = getattr(t, f"{table}_pandas")()
        pq = pd.read_parquet(exported / f"{table}.parquet")
        assert list(df.columns) == list(pq.columns)
        assert len(df) == len(pq)
    ev = t.events_pandas()
    assert (ev["event"] == "PY_START").sum() == 304


@pytest.mark.parametrize("missing,call,message", [
    ("polars", "events", "Trace.events() needs the optional package 'polars', which is not installed: pip install polars"),
    ("pyarrow", "calls_pandas", "Trace.calls_pandas() needs the optional package 'pyarrow', which is not installed: "
                                "pip install pyarrow"),
    ("pandas", "code_pandas", "Trace.code_pandas() needs the optional package 'pandas', which is not installed: "
                              "pip install pandas"),
])
def test_a_missing_optional_package_is_named(monkeypatch, missing, call, message):
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import missing` fail
    t = ocular.load(LOOPS)
    with pytest.raises(ocular.MissingDependency) as e:
        getattr(t, call)()
    assert str(e.value) == message
    assert isinstance(e.value, ImportError)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace: .*nope.ocl"):
        ocular.load(tmp_path / "nope.ocl")
    foreign = tmp_path / "foreign.ocl"
    foreign.write_bytes(b"PK\x03\x04 not a trace at all")
    with pytest.raises(ocular.OcularError, match="foreign.ocl.* not an Ocular trace"):
        ocular.load(foreign)


def test_unreadable_traces_raise_errors_of_their_kind(tmp_path):
    good = open(LOOPS, "rb").read()
    cases = []
    foreign = tmp_path / "foreign.ocl"
    foreign.write_bytes(b"PK\x03\x04 not a trace at all")
    cases.append((foreign, ocular.NotATrace, 0, "not an Ocular trace"))
    short = tmp_path / "short.ocl"
    short.write_bytes(good[:20])
    cases.append((short, ocular.TruncatedTrace, 20, "truncated at offset 20"))
    newer = tmp_path / "newer.ocl"
    newer.write_bytes(good[:8] + (99).to_bytes(2, "little") + good[10:])  # the major version (FORMAT.md 2)
    cases.append((newer, ocular.UnsupportedVersion, None, "upgrade Ocular"))
    # Chunks after the 16-byte preamble: a 56-byte header each, its payload's length at byte 8 (FORMAT.md 3.1).
    starts, at = [], 16
    while at < len(good):
        starts.append(at)
        at += 56 + int.from_bytes(good[at + 8:at + 12], "little")
    damaged = starts[-2]  # the chunk before the trailer
    corrupt = tmp_path / "corrupt.ocl"
    data = bytearray(good)
    data[damaged + 56] ^= 0xFF  # its payload: the CRC no longer matches
    corrupt.write_bytes(bytes(data))
    cases.append((corrupt, ocular.CorruptTrace, damaged, f"corrupt chunk at offset {damaged}"))
    for path, kind, offset, said in cases:
        with pytest.raises(kind, match=said) as e:
            ocular.load(path).stats()
        assert isinstance(e.value, ocular.TraceError) and isinstance(e.value, ocular.OcularError)
        assert e.value.path == str(path), (e.value, e.value.path)
        assert e.value.offset == offset
    # Salvage reads around the damaged chunk instead.
    assert ocular.load(corrupt, salvage=True).stats()


def test_many_traces_read_at_once_give_each_its_own_rows_or_error(tmp_path):
    # The pytest plugin's summary reads one trace per test, on every core at once: each path gets what
    # load(path).stats() gives, or the error it raises, in the order given.
    from ocular._analysis import stats_rows_many

    good = open(LOOPS, "rb").read()
    foreign = tmp_path / "foreign.ocl"
    foreign.write_bytes(b"PK\x03\x04 not a trace at all")
    cut = tmp_path / "cut.ocl"
    cut.write_bytes(good[:len(good) - 40])  # the trailer cut: read up to its last whole chunk, with a warning
    paths = [str(LOOPS), str(foreign), str(tmp_path / "missing.ocl"), str(cut), str(LOOPS)] * 3
    got = stats_rows_many(paths)
    assert len(got) == len(paths)
    with pytest.warns(UserWarning) as said:
        cut_rows = ocular.load(cut).stats()
    for path, r in zip(paths, got):
        if path.endswith("foreign.ocl"):
            assert isinstance(r, ocular.NotATrace) and r.path == path, r
        elif path.endswith("missing.ocl"):
            assert isinstance(r, FileNotFoundError) and str(r) == f"no such trace: {path}", r
        elif path == str(cut):
            assert r == (cut_rows, [str(w.message) for w in said], longest(cut_rows)) and r[1], r
        else:
            assert r == (ocular.load(path).stats(), [], longest(ocular.load(path).stats())), path
    # Rows of files under a prefix left out, natively: the rest as they were, the longest time of them all.
    rows = ocular.load(LOOPS).stats()
    some = sorted({x["file"] for x in rows})[0]
    kept, warnings, most = stats_rows_many([str(LOOPS)], leave_out=(some[:len(some) - 1], "/nowhere/"))[0]
    assert kept == [x for x in rows if x["file"] != some] and len(kept) < len(rows) and warnings == []
    assert most == longest(rows) > 0


def test_traces_read_ahead_give_what_reading_them_at_the_end_gives(tmp_path):
    # The pytest plugin pushes each test's trace as the test ends, to a native thread that reads it while
    # the next tests run; the summary takes them all, those never pushed and those given twice included.
    import shutil

    from ocular._analysis import StatsReadAhead, stats_rows_many

    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"t{i}.ocl"))
        shutil.copy(LOOPS, paths[-1])
    foreign = tmp_path / "foreign.ocl"
    foreign.write_bytes(b"PK\x03\x04 not a trace at all")
    leave_out = ("/nowhere/",)
    ahead = StatsReadAhead(leave_out)
    for p in paths[:4] + [str(foreign)]:
        ahead.push(p)
    wanted = [paths[0], str(foreign), *paths[2:], str(tmp_path / "missing.ocl"), paths[0]]
    got = ahead.take(wanted)
    expected = stats_rows_many(wanted, leave_out)
    assert len(got) == len(wanted) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, Exception):
            assert type(g) is type(e) and str(g) == str(e)
        else:
            assert g == e and g[0] and e[2] > 0
    # A trace written again after it was read (a test run again) and pushed again is read as it is now.
    again = StatsReadAhead(leave_out)
    again.push(paths[3])
    shutil.copy(str(foreign), paths[3])
    again.push(paths[3])
    assert type(again.take([paths[3]])[0]) is ocular.NotATrace
    # Taken: later pushes are not read, and the queue gives nothing twice that it read once.
    ahead.push(paths[5])
    assert ahead.take([paths[5]]) == stats_rows_many([paths[5]], leave_out)
    # In a forked child, which has the queue but not its thread, it reads at take.
    child = StatsReadAhead(leave_out)
    child.push(paths[1])
    r, w = os.pipe()
    with warnings.catch_warnings():  # forking with the queue's thread alive is what is tested
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        child.push(paths[2])
        same = child.take([paths[1], paths[2]]) == stats_rows_many([paths[1], paths[2]], leave_out)
        os.write(w, b"1" if same else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert child.take([paths[1]]) == stats_rows_many([paths[1]], leave_out)


def longest(rows):
    return max(x["inclusive_ms"] for x in rows)


def test_a_table_reads_the_same_each_time():
    import polars as pl
    import pyarrow as pa

    from ocular._recorder import _native

    table, warnings = _native().table(LOOPS, "code")
    assert warnings == [] and len(table) == 5
    first = pl.DataFrame(table)
    assert first.height == 5 and first.equals(pl.DataFrame(table))
    assert pa.table(table).num_rows == 5


def test_a_trace_analyses_its_file_once_per_state_of_it(tmp_path):
    import shutil

    path = tmp_path / "loops.ocl"
    shutil.copy(LOOPS, path)
    trace = ocular.load(path)
    calls = ocular._analysis._ext().stats
    made = []

    def counting(*args, **kwargs):
        made.append(args)
        return calls(*args, **kwargs)

    ocular._analysis._ext().stats = counting
    try:
        rows = trace.stats()
        rows[0]["calls"] = -1  # the caller's copy: the next call is not changed by it
        assert trace.stats()[0]["calls"] != -1 and len(made) == 1
        trace.counters()
        assert len(made) == 1, "counters() reads the stats already made"
        frame = trace.code_pandas()
        frame.loc[0, "first_line"] = 777777
        assert trace.code_pandas().loc[0, "first_line"] != -7
        assert trace.code().equals(trace.code())
        # The file changed (a recording still being written, or written again): analysed again.
        os.utime(path, ns=(1, 1))
        trace.stats()
        assert len(made) == 2
    finally:
        ocular._analysis._ext().stats = calls


STOP_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {workloads!r})
    import ocular
    from loops import count, nested, calls
    ocular.start_tracing(perfetto=True, deinstrument_threshold=0, output="run.ocl")
    count(1000)
    nested(10, 50)
    calls(300)
    ocular.stop_tracing()
""")


def test_stop_tracing_prints_the_hot_report_and_writes_ocular_trace_json(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(STOP_SCRIPT.format(workloads=os.path.join(ROOT, "testdata", "workloads")))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[Ocular] Trace Disassembly with Hardware CPU Cycles (Base -> Specialized):"
    assert lines[1] == "Hot loops (adaptive mode), hottest first"
    heads = [l for l in lines if l.startswith("#")]
    assert len(heads) == 4  # count, nested's inner and outer loops, calls
    assert any(l.startswith("#") and " count " in l for l in heads)
    assert "   1000 iterations," in r.stdout and "   300 iterations," in r.stdout
    assert "BINARY_OP" in r.stdout and "| ~" in r.stdout
    # ocular_trace.json: Chrome Trace Event format, balanced, one loop instant per backward jump.
    assert f"wrote {tmp_path / 'ocular_trace.json'}" in r.stderr
    trace = json.loads((tmp_path / "ocular_trace.json").read_text())
    evs = trace["traceEvents"]
    begins = [e for e in evs if e["ph"] == "B"]
    assert len(begins) == len([e for e in evs if e["ph"] == "E"])
    assert {e["name"] for e in begins} >= {"count", "nested", "calls", "g"}
    assert sum(1 for e in begins if e["name"] == "g") == 300
    assert sum(1 for e in evs if e["ph"] == "i" and e["name"] == "loop") == 1000 + 10 * 50 + 10 + 300


def test_python_m_ocular_mirrors_ocular_analyze(tmp_path):
    for args in (["hot", "--top", "2"], ["info", "--json"], ["stats", "--top", "3"]):
        mine = _pyocular(*args, LOOPS)
        theirs = subprocess.run([ANALYZE, *args, LOOPS], capture_output=True, text=True)
        assert mine.returncode == 0, mine.stderr
        assert mine.stdout == theirs.stdout, args
    out = tmp_path / "pq"
    r = _pyocular("export", "--parquet", "-o", str(out), LOOPS)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"wrote {out}: events.parquet (4241 rows), calls.parquet (304 rows)"), r.stderr
    # The same nine tables as the Rust binary writes.
    rust = tmp_path / "pq-rust"
    r = subprocess.run([ANALYZE, "export", "--parquet", "-o", str(rust), LOOPS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == sorted(os.listdir(rust)) == [
        "calls.parquet", "code.parquet", "coroutines.parquet", "counter_samples.parquet", "events.parquet",
        "functions.parquet", "lines.parquet", "lost.parquet", "spans.parquet", "tasks.parquet"]
    r = _pyocular("export", "--perfetto", "-o", str(tmp_path / "t.json"), LOOPS)
    assert r.returncode == 0 and (tmp_path / "t.json").exists(), r.stderr


def test_python_m_ocular_analyze_errors_and_help(tmp_path):
    r = _pyocular("hot", str(tmp_path / "missing.ocl"))
    assert r.returncode == 2
    assert "missing.ocl" in r.stderr and "No such file" in r.stderr
    r = _pyocular("hot", "--help")
    assert r.returncode == 0 and "Example: ocular-analyze hot run.ocl --top 3" in r.stdout
    r = _pyocular("--help")
    assert r.returncode == 0 and "hot" in r.stdout and "export" in r.stdout


def test_notebook_example_finds_the_hottest_loop_and_its_specializations(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "python", "examples", "hottest_loop.py"),
                        str(tmp_path / "ex.ocl")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hot = [l for l in r.stdout.splitlines() if l.startswith("hottest loop: ")]
    assert len(hot) == 1 and hot[0].startswith("hottest loop: kernel at hottest_loop.py:"), r.stdout
    spec = [l for l in r.stdout.splitlines() if l.startswith("specialized: ")]
    assert len(spec) == 1 and "BINARY_OP -> BINARY_OP_" in spec[0], r.stdout


def test_hot_says_which_way_each_branch_went(ocl):
    # workloads.loop(300): `if i % 3:` is true for 200 of the 300 iterations; the `for` goes on 300 times
    # and leaves once. From 3.14 the events say the direction (BRANCH_LEFT/RIGHT); before, the destination.
    with ocular.record(ocl, mode="adaptive", deinstrument_threshold=0):
        workloads.loop(300)
    (lp,) = [l for l in ocular.load(ocl).hot()["loops"] if l["function"] == "loop"]
    branches = {i["base"]: i["branch"] for i in lp["instructions"] if i["branch"]}
    assert branches["FOR_ITER"] == {"taken": 1, "not_taken": 300}
    (cond,) = [k for k in branches if k.startswith("POP_JUMP_IF_")]
    # POP_JUMP_IF_FALSE jumps (over the body) when i % 3 == 0; POP_JUMP_IF_TRUE when it is not.
    taken = 100 if cond == "POP_JUMP_IF_FALSE" else 200
    assert branches[cond] == {"taken": taken, "not_taken": 300 - taken}
    text = ocular.load(ocl).hot_text()
    assert f"{cond}" in text and f"| taken {taken} of 300 ({taken / 3:.0f}%)" in text


def test_the_typed_stub_declares_every_native_function_with_its_parameters():
    """`_ocular.pyi` is what type checkers and editors see of the extension: a function missing from it, or
    a parameter it does not name, is a signature users' tools get wrong."""
    import ast
    import inspect

    from ocular._recorder import _native

    nat = _native()
    stub_path = os.path.join(os.path.dirname(ocular.__file__), "_ocular.pyi")
    tree = ast.parse(open(stub_path).read())
    stub = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    # Private classes of the stub are types only (`_StartOptions`, the dict `start` takes), not the extension's.
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}
    native = {k: v for k, v in vars(nat).items() if callable(v) and not k.startswith("_") and not isinstance(v, type)}
    assert sorted(native) == sorted(stub), "functions of the extension and of its stub differ"
    for name, f in native.items():
        a = stub[name].args
        declared = [(x.arg, None) for x in a.posonlyargs + a.args + a.kwonlyargs]
        defaults = [None] * (len(a.posonlyargs + a.args) - len(a.defaults)) + list(a.defaults)
        declared = [(n, d is not None) for (n, _), d in zip(declared, defaults + [None] * len(a.kwonlyargs))]
        actual = [(p.name, p.default is not inspect.Parameter.empty) for p in inspect.signature(f).parameters.values()]
        assert declared == actual, (name, declared, actual)
    native_classes = {k for k, v in vars(nat).items() if isinstance(v, type)}
    assert native_classes == set(classes), (native_classes, set(classes))
    # Methods by name, dunders left out (the stub also declares protocol methods such as __enter__, which
    # vars() of a native class does not list alike) but for those this test cares about.
    def named(k):
        return not k.startswith("__") or k in ("__len__", "__arrow_c_stream__")

    for cname in native_classes:
        methods = {k for k in vars(getattr(nat, cname)) if named(k)}
        declared = {n.name for n in classes[cname].body if isinstance(n, ast.FunctionDef) and named(n.name)}
        assert methods == declared, (cname, methods, declared)


@pytest.mark.parametrize("mode", ["calls", "adaptive"])
def test_the_extension_s_reports_are_the_cli_s_json_with_sorted_keys(tmp_path, mode):
    # The extension makes its reports into Python objects without a JSON value in between: each must read
    # as the CLI's --json does (the fields both have), with each dict's keys in sorted order as before.
    from ocular import _ocular

    path = str(tmp_path / "t.ocl")
    with ocular.record(path, mode=mode):
        workloads.threads(2, 2000)
        workloads.loop(3000)

    def cli(*args):
        r = subprocess.run([ANALYZE, *args, "--json", path], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def keys_sorted(x):
        if isinstance(x, dict):
            return list(x) == sorted(x) and all(keys_sorted(v) for v in x.values())
        if isinstance(x, list):
            return all(keys_sorted(v) for v in x)
        return True

    def shared(mine, theirs):
        if isinstance(mine, dict):
            return all(shared(v, theirs[k]) for k, v in mine.items() if k in theirs)
        if isinstance(mine, list):
            return len(mine) == len(theirs) and all(shared(a, b) for a, b in zip(mine, theirs))
        return mine == theirs and type(mine) is type(theirs)

    info = _ocular.info(path)
    assert keys_sorted(info) and info == cli("info")
    rows, _ = _ocular.stats(path)
    theirs = cli("stats", "--top", "1000000")
    assert rows and keys_sorted(rows) and shared(rows, theirs)
    assert {"function", "calls", "inclusive_ms", "exclusive_ms"} <= set(rows[0])
    hot = _ocular.hot(path, 10)[0]
    assert keys_sorted(hot) and hot["mode"] == cli("hot")["mode"]
