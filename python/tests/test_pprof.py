"""`export --pprof`: the gzipped profile decoded with pprof's own profile.proto (vendored beside the exporter)
and compared with `stats --json`."""

import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))
PROTO = os.path.join(ROOT, "ocular-analyze", "src", "export", "vendor", "profile.proto")


def profile_class():
    """The `perftools.profiles.Profile` message class, built from the vendored profile.proto itself.

    No protoc here: the file is plain proto3 (messages of scalar, string and message fields, some repeated),
    so it is read into a FileDescriptorProto by the few rules below, which refuse any line they do not
    understand. Field numbers and types thus come from pprof's file, not from the Rust declarations."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    scalars = {"int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64, "string": F.TYPE_STRING, "bool": F.TYPE_BOOL}
    text = re.sub(r"//[^\n]*", "", open(PROTO).read())
    fdp = descriptor_pb2.FileDescriptorProto(name="profile.proto", package="perftools.profiles", syntax="proto3")
    msg = None
    for line in (x.strip() for x in text.splitlines()):
        if not line or line.startswith(("syntax ", "package ", "option ")):
            continue
        if m := re.fullmatch(r"message (\w+) \{", line):
            msg = fdp.message_type.add(name=m[1])
        elif line == "}":
            msg = None
        elif m := re.fullmatch(r"(repeated )?(\w+) (\w+) = (\d+);", line):
            assert msg is not None, line
            f = msg.field.add(name=m[3], number=int(m[4]))
            f.label = F.LABEL_REPEATED if m[1] else F.LABEL_OPTIONAL
            if m[2] in scalars:
                f.type = scalars[m[2]]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".perftools.profiles.{m[2]}"
        else:
            raise AssertionError(f"profile.proto: line not understood: {line!r}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))


def export(trace, out):
    r = subprocess.run([ANALYZE, "export", "--pprof", str(trace), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}: " in r.stderr, r.stderr
    data = out.read_bytes()
    assert data[:2] == b"\x1f\x8b", "pprof files are gzipped"
    return profile_class().FromString(gzip.decompress(data))


def stats(trace, *args):
    r = subprocess.run([ANALYZE, "stats", "--json", "--top", "100000", *args, str(trace)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class View:
    """A decoded profile, read as pprof's tools read it."""

    def __init__(self, p):
        self.p = p
        s = p.string_table
        self.types = [(s[t.type], s[t.unit]) for t in p.sample_type]
        self.functions = {f.id: f for f in p.function}
        self.locations = {loc.id: loc for loc in p.location}

    def s(self, i):
        return self.p.string_table[i]

    def function_of(self, location_id):
        loc = self.locations[location_id]
        assert len(loc.line) == 1
        return self.functions[loc.line[0].function_id]

    def leaf_sums(self, type_name, key=lambda sample: (), where=False):
        """(key(sample), leaf function's name) -> sum of the `type_name` values of the samples; with
        `where=True`, (key(sample), name, file, first line)."""
        k = [t for t, _ in self.types].index(type_name)
        out = collections.Counter()
        for sample in self.p.sample:
            f = self.function_of(sample.location_id[0])
            at = (self.s(f.filename), f.start_line) if where else ()
            out[(key(sample), self.s(f.name), *at)] += sample.value[k]
        return out

    def labels(self, sample):
        return {self.s(label.key): (self.s(label.str) if label.str else label.num) for label in sample.label}


PROGRAM = textwrap.dedent("""\
    import sys, threading
    import ocular

    def leaf(x):
        return x * 2

    def work(n):
        s = 0
        for i in range(n):
            s += leaf(i)
        return s

    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def main():
        work(20000)
        fib(15)
        t = threading.Thread(target=work, args=(5000,), name="helper")
        t.start(); t.join()

    with ocular.record(sys.argv[1], mode=sys.argv[2]):
        main()
""")


def record(tmp_path, mode):
    (tmp_path / "prog.py").write_text(PROGRAM)
    out = tmp_path / f"{mode}.ocl"
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py"), str(out), mode], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def calls_run(tmp_path_factory):
    assert os.path.exists(ANALYZE), f"{ANALYZE} missing: cargo build -p ocular-analyze"
    d = tmp_path_factory.mktemp("pprof")
    trace = record(d, "calls")
    return d, trace, View(export(trace, d / "run.pb.gz")), stats(trace)


def test_the_profile_is_well_formed_and_says_what_it_holds(calls_run):
    _, _, v, _ = calls_run
    p = v.p
    assert p.string_table[0] == ""
    assert v.types[:2] == [("calls", "count"), ("wall", "nanoseconds")]
    assert (v.s(p.period_type.type), v.s(p.period_type.unit), p.period) == ("wall", "nanoseconds", 1)
    assert v.s(p.default_sample_type) == "wall"
    assert all(len(s.value) == len(p.sample_type) for s in p.sample)
    assert all(loc.id and loc.mapping_id == p.mapping[0].id for loc in p.location)
    assert all(f.id for f in p.function) and p.mapping[0].has_functions
    comments = [v.s(c) for c in p.comment]
    assert comments[0].startswith("Ocular ")
    assert any("calls mode" in c for c in comments), comments
    assert any("every call recorded: calls exact" in c for c in comments), comments
    assert p.time_nanos > 1.6e18 and 0 < p.duration_nanos < 60e9


def test_per_function_calls_and_self_time_equal_stats(calls_run):
    _, _, v, rows = calls_run
    calls, wall = v.leaf_sums("calls", where=True), v.leaf_sums("wall", where=True)
    # A stack whose corrected self time came out below zero (a tiny frame, such as leaf's 3 ns) is written
    # with its calls and a wall time of 0, as the flame graph draws it; `stats` adds the negative in.
    k = [t for t, _ in v.types].index("wall")
    clamped = {(v.s(f.name), v.s(f.filename), f.start_line) for s in v.p.sample if s.value[0] and not s.value[k]
               for f in [v.function_of(s.location_id[0])]}
    for r in rows:
        key = ((), r["function"], r["file"], r["line"])
        assert calls[key] == r["calls"], r["function"]
        if key[1:] in clamped:
            assert wall[key] / 1e6 >= r["exclusive_ms"] - 2e-3, r["function"]
        else:  # Per stack rounded to the nanosecond.
            assert wall[key] / 1e6 == pytest.approx(r["exclusive_ms"], rel=1e-3, abs=2e-3), r["function"]
    # Nothing in the profile that stats lacks, and the unclamped functions' times add up to stats' (the
    # clamped ones hold stats' time plus their negative stacks', which depend on the run's preemptions).
    rows_at = {((), r["function"], r["file"], r["line"]): r for r in rows}
    assert set(calls) <= set(rows_at)
    exact = [k for k in rows_at if k[1:] not in clamped]
    assert sum(wall[k] for k in exact) / 1e6 == pytest.approx(sum(rows_at[k]["exclusive_ms"] for k in exact),
                                                             rel=1e-3, abs=2e-3)
    assert sum(n for k, n in calls.items() if k[1] == "leaf") == 25000
    assert sum(n for k, n in calls.items() if k[1] == "fib") == 1973


def test_stacks_are_leaf_first_and_labelled_by_thread(calls_run):
    _, _, v, _ = calls_run
    names = lambda s: [v.s(v.function_of(i).name) for i in s.location_id]  # noqa: E731
    leaf = [s for s in v.p.sample if names(s)[:3] == ["leaf", "work", "main"]]
    assert len(leaf) == 1 and leaf[0].value[0] == 20000
    helper = [s for s in v.p.sample if names(s)[:2] == ["leaf", "work"] and v.labels(s)["thread"] == "helper"]
    assert len(helper) == 1 and helper[0].value[0] == 5000
    assert v.labels(helper[0])["thread_id"] != v.labels(leaf[0])["thread_id"]
    # Recursion: each depth of fib is a stack of its own.
    assert max(names(s).count("fib") for s in v.p.sample) == 15


def test_locations_carry_file_and_first_line(calls_run):
    d, _, v, rows = calls_run
    source = (d / "prog.py").read_text().splitlines()
    by_name = {v.s(f.name): f for f in v.p.function}
    for name in ["leaf", "work", "fib", "main"]:
        f = by_name[name]
        assert v.s(f.filename) == str(d / "prog.py")
        assert source[f.start_line - 1].startswith(f"def {name}(")
    for loc in v.p.location:
        f = v.functions[loc.line[0].function_id]
        assert loc.line[0].line == f.start_line
    assert {(v.s(f.name), v.s(f.filename), f.start_line) for f in v.p.function} >= {
        (r["function"], r["file"], r["line"]) for r in rows}


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "default"])
def test_the_profile_says_when_figures_are_estimated(tmp_path, sampled):
    trace = tmp_path / "big.ocl"
    (tmp_path / "prog.py").write_text(textwrap.dedent(f"""\
        import sys, ocular
        def leaf(x):
            return x + 1
        with ocular.record(sys.argv[1], sampled={sampled}):
            s = 0
            for i in range(400_000):
                s = leaf(s)
    """))
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py"), str(trace)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    v = View(export(trace, tmp_path / "big.pprof"))
    rows = stats(trace)
    estimated = any(r["estimated"] for r in rows)
    comments = " ".join(v.s(c) for c in v.p.comment)
    assert "adaptive mode, threshold 500" in comments
    assert ("ESTIMATED (~)" in comments) == estimated == sampled, comments
    assert ("every call recorded: calls exact" in comments) == (not sampled), comments
    calls = v.leaf_sums("calls")
    leaf_row = next(r for r in rows if r["function"] == "leaf")
    assert (leaf_row["calls"] == 400_000) == (not sampled), leaf_row
    # Per stack the windows' calls are scaled unrounded and rounded once per stack.
    assert calls[((), "leaf")] == pytest.approx(leaf_row["calls"], abs=2)


def test_counters_are_sample_types(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""\
        import sys, ocular
        def toucher():
            return bytearray(8 << 20)
        def idle():
            return sum(range(1000))
        with ocular.record(sys.argv[1], mode="calls", counters=["page-faults"]):
            idle(); toucher(); idle()
    """))
    trace = tmp_path / "c.ocl"
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py"), str(trace)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rows = stats(trace)
    if not any("counters" in r for r in rows):
        pytest.skip("page-faults could not be opened here: " + r.stderr)
    v = View(export(trace, tmp_path / "c.pb.gz"))
    assert ("page-faults", "faults") in v.types
    faults = v.leaf_sums("page-faults")
    for row in rows:
        assert faults[((), row["function"])] == dict(row.get("counters", [])).get("page-faults", 0), row["function"]
    assert faults[((), "toucher")] > 1000


RUN = """
    import multiprocessing as mp
    def leaf(x):
        return x + 1
    def task(n):
        s = 0
        for _ in range(n):
            s = leaf(s)
        return s
    if __name__ == "__main__":
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(task, [3000, 4000, 5000, 6000], chunksize=1)
"""


def test_a_run_of_several_processes_has_a_pid_label_per_sample(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent(RUN))
    trace = tmp_path / "run.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-o", str(trace), "--mode", "calls",
                        str(tmp_path / "prog.py")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(subprocess.run([ANALYZE, "info", "--json", str(trace)], capture_output=True, text=True).stdout)
    pids = {p["pid"] for p in info["processes"]}
    # The parent and at least one worker. The other worker may have done nothing, and the pool's terminate()
    # can kill it before its recorder wrote a trace at all (once in CI on 3.14): then it is not listed.
    assert len(pids) >= 2
    v = View(export(trace, tmp_path / "run.pb.gz"))
    # Every sample names a recorded process; a pool worker that got no task may have no stack with time.
    labelled = {v.labels(s)["pid"] for s in v.p.sample}
    assert labelled <= pids and len(labelled) >= 2, (labelled, pids)
    per_process = stats(trace, "--per-process")
    calls = v.leaf_sums("calls", key=lambda s: v.labels(s)["pid"])
    leaf = {r["pid"]: r["calls"] for r in per_process if r["function"] == "leaf"}
    assert sum(leaf.values()) == 18000
    assert {pid: calls[(pid, "leaf")] for pid in leaf} == leaf
    # One function per (name, file, line), shared by the processes.
    assert sum(1 for f in v.p.function if v.s(f.name) == "leaf") == 1


def test_bad_outputs_are_refused(calls_run, tmp_path):
    _, trace, _, _ = calls_run
    r = subprocess.run([ANALYZE, "export", "--pprof", str(trace), "-o", str(tmp_path / "x.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "ends in .pb.gz or .pprof" in r.stderr
    same = tmp_path / "t.pb.gz"
    shutil.copy(trace, same)
    r = subprocess.run([ANALYZE, "export", "--pprof", str(same), "-o", str(same)], capture_output=True, text=True)
    assert r.returncode == 2 and "is the input trace" in r.stderr
    assert not list(tmp_path.glob("*.tmp*")) and sorted(p.name for p in tmp_path.iterdir()) == ["t.pb.gz"]
