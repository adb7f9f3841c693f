"""Ocular records exactly what a plain sys.monitoring tool sees, in every mode, on every workload: counts
per code object and kind, and the order of events per thread."""

import collections
import sys
import time

import pytest
from conftest import Reference, counts, instances, read_ocl

import ocular
from ocular import _ocular
import workloads
from ocular._recorder import event_names

# A conditional branch's events: one kind up to 3.13; from 3.14, one per direction (BRANCH is deprecated).
BRANCHES = ["BRANCH_LEFT", "BRANCH_RIGHT"] if sys.version_info >= (3, 14) else ["BRANCH"]

CASES = {
    "loop": lambda: workloads.loop(200),
    "recursion": lambda: workloads.fib(12),
    "objects": lambda: workloads.objects(60),
    "generators": lambda: workloads.use_gen(50),
    "exceptions": lambda: workloads.exceptions(5),
    "async": lambda: workloads.run_async(5),
}


@pytest.mark.parametrize("mode", ["calls", "adaptive", "precise"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gapless_recording_equals_the_reference(mode, case, ocl):
    # GIVEN Ocular and a reference tool listening to the same events, gapless
    with ocular.record(ocl, mode=mode, deinstrument_threshold=0) as rec:
        with Reference(event_names(mode)) as ref:
            CASES[case]()
    # THEN every event of workload code is in the file, in the same order per thread
    f = read_ocl(ocl)
    assert f["clean"], f["warnings"]
    assert rec.lost == 0
    assert counts(f["workload"]) == counts(ref.events)
    # the same events in the same order, coroutine boundaries tagged with the same instances
    assert instances(f["workload"]) == instances(ref.events)
    assert sum(len(v) for v in ref.events.values()) > 0


def test_modes_record_their_event_kinds(ocl):
    kinds = {}
    for mode in ["calls", "adaptive", "precise"]:
        with ocular.record(ocl, mode=mode, deinstrument_threshold=0):
            workloads.loop(10)
            workloads.use_gen(3)
        kinds[mode] = {k for k, *_ in sum(read_ocl(ocl)["workload"].values(), [])}
    assert kinds["calls"] == {"PY_START", "PY_RETURN", "PY_YIELD", "PY_RESUME"}
    assert kinds["adaptive"] == kinds["calls"] | {"JUMP", *BRANCHES}
    assert kinds["precise"] == kinds["calls"] | {"INSTRUCTION"}


def _threshold_workload():
    for _ in range(20):
        workloads.loop(30)
    workloads.fib(14)  # 1,219 calls: past 100 x the threshold, where a sampled recording's first window ends
    workloads.use_gen(30)
    workloads.exceptions(10)
    workloads.two_back_edges(100)


def _recorded_as_the_reference_saw(ocl, ref):
    f = read_ocl(ocl)
    assert counts(f["workload"]) == counts(ref.events)
    (tid,) = f["workload"]
    assert f["workload"][tid] == ref.events[tid]
    return f, tid, counts(f["workload"])


def test_the_default_threshold_stops_each_location_after_n_hits_and_records_every_call(ocl):
    # GIVEN the default: a threshold, not sampled; the reference starts first (its set-up runs Python)
    with Reference(event_names("adaptive"), threshold=7) as ref:
        with ocular.record(ocl, mode="adaptive", deinstrument_threshold=7):
            _threshold_workload()
    f, tid, c = _recorded_as_the_reference_saw(ocl, ref)
    # THEN every call is in the file, past the 700th too, and nothing was left to count or to window
    assert c[("fib", "PY_START")] == c[("fib", "PY_RETURN")] == 1219, c
    assert c[("use_gen", "PY_START")] == 1 and c[("gen", "PY_YIELD")] == 30, c
    assert not f["counted"].get(tid), f["counted"]
    assert not any(f["markers"].values()), "no window markers"
    # AND locations still stop at the threshold (a loop's backward jumps at twice it)
    per_location = collections.Counter((q, k, off, dest) for k, q, off, dest in f["workload"][tid]
                                       if k in ("JUMP", *BRANCHES))
    assert max(n for (q, k, off, dest), n in per_location.items() if not (k == "JUMP" and dest < off)) <= 7
    assert max(per_location.values()) <= 14


def test_sampled_threshold_stops_each_location_after_n_hits_and_calls_after_the_first_window(ocl):
    # window_period: no window after the first one, which closes at the recording's 700th call (100 x the
    # threshold). The reference starts first: its own set-up runs Python, whose calls would count.
    with Reference(event_names("adaptive"), threshold=7, sampled=True) as ref:
        with ocular.record(ocl, mode="adaptive", deinstrument_threshold=7, sampled=True, window_period=1e4):
            # Inline, not through _threshold_workload(): the first window counts every call the recording
            # sees, that function's own too, and the reference counts the workloads' only.
            for _ in range(20):
                workloads.loop(30)
            workloads.fib(14)  # 1,219 calls: the first window ends inside
            workloads.use_gen(30)
            workloads.exceptions(10)
            workloads.two_back_edges(100)
    f, tid, c = _recorded_as_the_reference_saw(ocl, ref)
    assert c[("loop", "PY_START")] == 20 and c[("loop", "PY_RETURN")] == 20, "every call in the first window"
    assert c[("fib", "PY_START")] == 700 - 20, "the recording's 700th call closed the first window"
    assert c[("use_gen", "PY_START")] == c[("two_back_edges", "PY_START")] == 0, "no call after it"
    # After it, each function's first 7 calls (the threshold) are counted (FORMAT.md 5.8), the 7th marked
    # as the last: fib's 539 calls after the 680th, use_gen's one call, exceptions' one and fails' 40.
    counted = collections.Counter(q for q, _ in f["counted"][tid])
    assert counted["fib"] == 7 and counted["fails"] == 7, counted
    assert counted["use_gen"] == counted["exceptions"] == counted["two_back_edges"] == 1, counted
    assert counted["gen"] == 1 and counted["loop"] == 0, counted
    last = {q for q, arg in f["counted"][tid] if arg == 1}
    assert last == {"fib", "fails"}, last
    per_location = {}
    for kind, qual, off, dest in f["workload"][next(iter(f["workload"]))]:
        if kind in ("JUMP", *BRANCHES):
            per_location[(qual, kind, off, dest)] = per_location.get((qual, kind, off, dest), 0) + 1
    assert max(n for (q, k, off, dest), n in per_location.items() if not (k == "JUMP" and dest < off)) <= 7
    # A loop's backward jumps stay on for twice the threshold, counted per loop head: both loops below
    # have two back edges (the `if` ends with its own), which share the 14 and then both stop recording,
    # so no recorded interval from one to the next spans unrecorded iterations.
    for fn in ("loop", "two_back_edges"):
        edges = {(off, dest): n for (q, k, off, dest), n in per_location.items() if q == fn and k == "JUMP"}
        assert len(edges) == 2 and len({dest for (_, dest) in edges}) == 1, (fn, edges)
        assert all(dest < off for (off, dest) in edges), (fn, edges)
        assert sum(edges.values()) == 14, (fn, edges)
    assert f["header"]["deinstrument_threshold"] == 7


def test_threads_are_recorded_with_their_names(ocl):
    with ocular.record(ocl, mode="adaptive", deinstrument_threshold=0):
        with Reference(event_names("adaptive")) as ref:
            workloads.threads(3, 100)
    f = read_ocl(ocl)
    names = f["threads"]
    recorded = sorted(names[t] for t in f["workload"])
    assert recorded == ["MainThread", "worker-0", "worker-1", "worker-2"]
    assert {names[t]: v for t, v in f["workload"].items()} == {
        names[t]: v for t, v in ref.events.items()
    }
    main = [n for n in names.values() if n == "MainThread"]
    assert main == ["MainThread"]


def test_threads_of_a_program_that_imports_threading_after_the_start_are_named(tmp_path):
    # Ocular does not import threading (the program's to import): a thread started by threading after the
    # recording began is known by its bootstrap function's name, and named from it as before. The threads
    # end before the stop, so only that names them.
    import subprocess

    ocl = tmp_path / "late.ocl"
    prog = f"""
import sys
import ocular
with ocular.record({str(ocl)!r}, mode="calls"):
    assert "threading" not in sys.modules, "ocular imported threading"
    import threading
    def work(n):
        return sum(range(n))
    ts = [threading.Thread(target=work, args=(1000,), name=f"late-{{i}}") for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
"""
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    f = _ocular.read(ocl)
    work = {tid for tid, _, _, code, *_ in f["events"] if code in f["code"] and f["code"][code][0] == "work"}
    assert sorted(f["threads"].get(tid, "?") for tid in work) == ["late-0", "late-1"], f["threads"]
    assert "MainThread" in f["threads"].values()


def test_opcode_tables_kept_for_the_next_process_are_the_ones_it_would_make(tmp_path):
    from ocular import _interp

    made = _interp._make_opcode_tables()
    first = _interp._cached_opcode_tables(str(tmp_path))
    kept = list(tmp_path.glob("opcodes-*.marshal"))
    assert first == made and len(kept) == 1
    assert _interp._cached_opcode_tables(str(tmp_path)) == made
    # Another interpreter's tables, or a damaged file, are made again (and the file written anew).
    import marshal

    other = dict(made, opnames=["X"] * 256)
    kept[0].write_bytes(marshal.dumps(((0,) + _interp._interpreter_key()[1:], other)))
    assert _interp._cached_opcode_tables(str(tmp_path)) == made
    for damaged in (b"", b"\x00garbage", marshal.dumps((_interp._interpreter_key(), {"opnames": [1] * 256}))):
        kept[0].write_bytes(damaged)
        assert _interp._cached_opcode_tables(str(tmp_path)) == made
    assert marshal.loads(kept[0].read_bytes()) == (_interp._interpreter_key(), made)
    # A directory that cannot be written to: the tables are made, nothing is left behind.
    assert _interp._cached_opcode_tables(str(tmp_path / "missing")) == made


def test_timestamps_increase_per_thread(ocl):
    with ocular.record(ocl, mode="adaptive", deinstrument_threshold=0):
        workloads.threads(2, 500)
        workloads.mixed()
    from ocular import _ocular

    f = _ocular.read(ocl)
    last = {}
    for tid, ticks, *_ in f["events"]:
        assert ticks >= last.get(tid, 0)
        last[tid] = ticks
    # The workload's threads all recorded; a thread an earlier test left in this process (a notebook
    # client's) may run Python during the recording too, and is recorded like any other.
    names = sorted(f["threads"].get(tid, "?") for tid in last)
    assert [n for n in names if n in ("MainThread", "worker-0", "worker-1")] == ["MainThread", "worker-0",
                                                                                  "worker-1"], names


def test_include_only_and_exclude_decide_per_code_object(ocl):
    with ocular.record(ocl, deinstrument_threshold=0, include_only="workloads", exclude=["fib", "Point."]):
        workloads.mixed()
    f = read_ocl(ocl)
    quals = {q for evs in f["workload"].values() for _, q, _, _ in evs}
    assert "loop" in quals and "objects" in quals
    assert not {"fib", "Point.__init__", "Point.norm2"} & quals
    recorded_files = {fn for (_, fn, _, _) in f["code"].values()}
    assert recorded_files == {workloads.__file__}, "include_only keeps everything else out"


def test_ocular_does_not_record_itself(ocl):
    with ocular.record(ocl):
        workloads.loop(5)
    files = {fn for (_, fn, _, _) in read_ocl(ocl)["code"].values()}
    assert not [fn for fn in files if "/ocular/" in fn and fn.endswith(".py") and "tests" not in fn]


def test_specialized_bytecode_is_snapshotted_at_stop(ocl):
    with ocular.record(ocl, mode="calls"):
        workloads.loop(2000)
    f = read_ocl(ocl)
    names = f["header"]["opnames"]
    (cid,) = [i for i, (q, fn, _, _) in f["code"].items() if q == "loop" and fn == workloads.__file__]
    ops = {names[b] for b in f["snapshots"][cid][::2]}
    assert "FOR_ITER_RANGE" in ops, sorted(ops)
    assert any(n.startswith("BINARY_OP_ADD_INT") for n in ops), sorted(ops)
    # Instructions as the interpreter has them now; inline cache units (counters, version tags) as zeros.
    from ocular._interp import opcode_tables

    cache = opcode_tables()["opcache"]
    base, now, snap = workloads.loop.__code__.co_code, workloads.loop.__code__._co_code_adaptive, f["snapshots"][cid]
    assert len(snap) == len(now)
    i, cache_units = 0, 0
    while i < len(base):
        assert snap[i : i + 2] == now[i : i + 2], (i, snap[i : i + 2], now[i : i + 2])
        n = cache[base[i]]
        assert snap[i + 2 : i + 2 + 2 * n] == bytes(2 * n), i
        cache_units += n
        i += 2 + 2 * n
    assert cache_units > 0


def test_every_code_object_of_many_has_its_snapshot_as_the_interpreter_has_it(ocl, tmp_path):
    # More code objects than the stop sends to the writer at once (its batches), each specialized its own
    # way: every one's snapshot is its adaptive bytecode now, inline cache units as zeros.
    n = 1300
    src = "".join(f"def f{i}(k):\n    s = {i}\n    for j in range(k):\n        s = s + j * {i % 7}\n    return s\n"
                  if i % 2 else f"def f{i}(xs):\n    return [x.real + {i} for x in xs]\n" for i in range(n))
    path = str(tmp_path / "many.py")
    ns: dict = {}
    exec(compile(src, path, "exec"), ns)
    fs = [ns[f"f{i}"] for i in range(n)]
    with ocular.record(ocl, mode="calls"):
        for i, fn in enumerate(fs):
            fn(100) if i % 2 else fn([1, 2.0, 3] * 20)
    f = read_ocl(ocl)
    from ocular._interp import opcode_tables

    cache = opcode_tables()["opcache"]
    ids = {q: i for i, (q, fn, _, _) in f["code"].items() if fn == path}
    assert len(ids) >= n, len(ids)
    specialized = 0
    for i, fn in enumerate(fs):
        code = fn.__code__
        snap, base, now = f["snapshots"][ids[fn.__qualname__]], code.co_code, code._co_code_adaptive
        assert len(snap) == len(now), i
        j = 0
        while j < len(base):
            assert snap[j : j + 2] == now[j : j + 2], (i, j)
            assert snap[j + 2 : j + 2 + 2 * cache[base[j]]] == bytes(2 * cache[base[j]]), (i, j)
            j += 2 + 2 * cache[base[j]]
        specialized += snap != base
    assert specialized > n // 2, specialized


def test_calls_mode_records_every_call_whatever_the_threshold(ocl):
    with ocular.record(ocl, mode="calls", deinstrument_threshold=7):
        with Reference(event_names("calls")) as ref:
            for _ in range(20):
                workloads.loop(30)
    f = read_ocl(ocl)
    assert counts(f["workload"]) == counts(ref.events)
    assert counts(f["workload"])[("loop", "PY_START")] == 20


def test_thousands_of_functions_keep_their_own_ids_through_the_code_cache(ocl):
    # GIVEN 3,000 functions called in turn, more than the callbacks' two cache levels hold apart
    with ocular.record(ocl, mode="calls"):
        with Reference(event_names("calls")) as ref:
            workloads.many_functions(3000, 3)
    # THEN every event is the reference's, each under its own function: a stale cache entry would give one
    # function another's id
    f = read_ocl(ocl)
    c = counts(f["workload"])
    assert c == counts(ref.events)
    assert all(c[(f"f{i}", "PY_START")] == 3 and c[(f"f{i}", "PY_RETURN")] == 3 for i in range(3000))


def test_threads_each_keep_their_functions_ids_through_their_own_code_caches(ocl):
    # GIVEN four threads each calling 1,500 functions of their own in turn (the GIL switching between them)
    import threading

    def work():
        workloads.many_functions(1500, 2)

    with ocular.record(ocl, mode="calls"):
        with Reference(event_names("calls")) as ref:
            ts = [threading.Thread(target=work) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    # THEN each thread's events are the reference's, under their own functions
    f = read_ocl(ocl)
    assert {tid: counts({tid: evs}) for tid, evs in f["workload"].items()} == {
        tid: counts({tid: evs}) for tid, evs in ref.events.items()}
    c = counts(f["workload"])
    assert all(c[(f"f{i}", "PY_START")] == 8 for i in range(1500))


def test_header_describes_the_interpreter(ocl):
    with ocular.record(ocl, mode="precise", deinstrument_threshold=3, exclude="x"):
        pass
    h = read_ocl(ocl)["header"]
    assert h["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert h["mode"] == "precise" and h["exclude"] == ["x"]
    import dis
    import opcode

    assert h["opnames"][opcode.opmap["POP_TOP"]] == "POP_TOP"
    assert h["opnames"][dis._all_opmap["FOR_ITER_RANGE"]] == "FOR_ITER_RANGE"
    assert h["event_cost_ticks"] > 0
    assert h["ticks_per_second"] > 1e8


def test_tick_rate_measured_at_start_holds_over_the_recording(ocl):
    # The rate comes from the ~2 ms calibration; over a 0.3 s recording, ticks converted with it must land
    # on the monotonic clock the trailer read at stop.
    with ocular.record(ocl, mode="calls"):
        time.sleep(0.3)
    f = read_ocl(ocl)
    h, t = f["header"], f["trailer"]
    elapsed_ns = t["end_monotonic_ns"] - h["start_monotonic_ns"]
    assert elapsed_ns > 0.3e9
    rate = (t["end_ticks"] - h["start_ticks"]) * 1e9 / elapsed_ns
    assert abs(rate / h["ticks_per_second"] - 1) < 1e-3, (rate, h["ticks_per_second"])


def test_opcode_tables_match_the_interpreter():
    import dis
    import opcode

    from ocular._interp import opcode_tables

    t = opcode_tables()
    assert len(t["opnames"]) == len(t["opbase"]) == len(t["opcache"]) == 256
    for spec, base in dis.deoptmap.items():
        assert t["opbase"][dis._all_opmap[spec]] == dis._all_opmap[base], spec
    assert t["opcache"][opcode.opmap["LOAD_ATTR"]] == 9
    assert t["opcache"][dis._all_opmap["FOR_ITER_RANGE"]] == t["opcache"][opcode.opmap["FOR_ITER"]] == 1
    assert t["have_argument"] == opcode.HAVE_ARGUMENT and t["extended_arg"] == opcode.EXTENDED_ARG


def test_code_objects_carry_their_bytecode_and_positions(ocl):
    with ocular.record(ocl, mode="calls"):
        workloads.exceptions(1)
    f = read_ocl(ocl)
    for qual, fn in [("exceptions", workloads.exceptions), ("fails", workloads.fails)]:
        (cid,) = [i for i, (q, file, _, _) in f["code"].items() if q == qual and file == workloads.__file__]
        code = fn.__code__
        assert f["bytecode"][cid] == code.co_code
        want = [tuple(-1 if v is None else v for v in p) for p in code.co_positions()]
        assert f["positions"][cid] == want
        assert f["code"][cid][2] == code.co_firstlineno


def test_recordings_carry_a_cost_per_event_kind(ocl):
    with ocular.record(ocl, mode="adaptive", sampled=True) as rec:
        workloads.loop(10)
    from ocular import _ocular

    cal = _ocular.read(ocl)["calibration"]
    # And, with windows, what instrumenting a code object again costs (FORMAT.md 6.6): per object, per byte.
    # And the machine's speed at the start and at the stop, which scales the costs (FORMAT.md 6.6).
    assert set(cal) == set(event_names("adaptive")) | {"instrument_code", "instrument_byte", "speed_start",
                                                        "speed_stop"}
    assert cal["speed_start"] > 0 and cal["speed_stop"] > 0, cal
    # Per object it is close to nothing beside the per-byte part (a regression of two sizes: often 0).
    assert cal["instrument_code"] >= 0 and cal["instrument_byte"] > 0, cal
    assert cal["PY_START"] == cal["PY_RETURN"] > 0, "call events share the calls-mode measurement"
    branches = [cal[k] for k in BRANCHES]
    assert cal["JUMP"] > 0 and branches == [cal["JUMP"]] * len(BRANCHES)
    assert rec.call_event_cost_ns > 0 and rec.event_cost_ns > 0


def test_a_new_process_takes_the_calibration_an_earlier_one_kept_for_ten_minutes(tmp_path):
    # Measuring the costs takes 1-3 ms of every run's start: the next process of the same interpreter and
    # recorder build takes the last measurement with the same settings, for ten minutes, and its stop's speed
    # probe scales it, as a followed child's does with its parent's.
    import marshal
    import os
    import subprocess

    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    prog = "import ocular, sys\nwith ocular.record(sys.argv[1], mode='calls'):\n    sum(range(10))\n"

    def header(name):
        path = tmp_path / name
        subprocess.run([sys.executable, "-c", prog, str(path)], env=env, check=True, timeout=120)
        f = _ocular.read(path)
        assert f["calibration"]["speed_stop"] > 0
        return f["header"]["ticks_per_second"], f["header"]["event_cost_ticks"]

    first = header("1.ocl")
    kept, = (tmp_path / "ocular").glob("calibration-*.marshal")
    assert header("2.ocl") == first
    # Older than ten minutes: measured again, and kept in its place.
    os.utime(kept, (kept.stat().st_atime, kept.stat().st_mtime - 601))
    third = header("3.ocl")
    assert third != first
    assert header("4.ocl") == third
    # Kept by another build of the recorder: measured again.
    cal = marshal.loads(kept.read_bytes())
    kept.write_bytes(marshal.dumps(dict(cal, build=[cal["build"][0], 1, 2])))
    assert header("5.ocl") not in (first, third)


def test_a_process_s_later_recordings_reuse_its_calibration_and_scale_it_at_their_stop(tmp_path):
    # Measuring the costs takes ~2 ms of a start: the next test of a pytest session, or a forked child, takes
    # the first measurement with the same settings, and its own stop's speed probe scales it.
    from ocular import _ocular

    paths = [tmp_path / f"{i}.ocl" for i in range(3)]
    for p in paths[:2]:
        with ocular.record(p, mode="adaptive", sampled=True):
            workloads.loop(10)
    with ocular.record(paths[2], mode="calls"):
        workloads.loop(10)
    cal = [_ocular.read(p)["calibration"] for p in paths]
    heads = [read_ocl(p)["header"] for p in paths]
    same = {k: v for k, v in cal[0].items() if k != "speed_stop"}
    assert {k: v for k, v in cal[1].items() if k != "speed_stop"} == same
    assert heads[1]["event_cost_ticks"] == heads[0]["event_cost_ticks"]
    assert heads[1]["ticks_per_second"] == heads[0]["ticks_per_second"]
    assert all(c["speed_stop"] > 0 for c in cal)
    # Other settings are measured for themselves.
    assert set(cal[2]) != set(cal[0]) and heads[2]["mode"] == "calls"


def test_stops_in_quick_succession_share_one_speed_reading(monkeypatch):
    # One recording per test: each stop spent ~0.3 ms reading the machine's speed a moment after the last.
    from ocular import _recorder

    runs = []

    def once():
        runs.append(1)
        return 6000 + len(runs)

    monkeypatch.setattr(_recorder, "_speed_reading", None)
    monkeypatch.setattr(_recorder, "_speed_probe", (once, 600, 10.0))
    first = _recorder.speed_at_stop()
    assert (first, len(runs)) == ([(253, 6004 / 600)], 7)  # the median of seven runs
    assert _recorder.speed_at_stop() == first and len(runs) == 7
    # Another probe (another calibration's loop) is read for itself, and so is one after the reading aged.
    monkeypatch.setattr(_recorder, "_speed_probe", (lambda: once() - 1000, 600, 10.0))
    assert _recorder.speed_at_stop() == [(253, 5011 / 600)] and len(runs) == 14
    monkeypatch.setattr(_recorder, "SPEED_READING_KEPT", 0.0)
    assert _recorder.speed_at_stop() == [(253, 5018 / 600)] and len(runs) == 21


@pytest.mark.parametrize("loaded_ago_s", [0.0, 5.0])
def test_the_tick_rate_is_measured_from_a_recent_loading_of_the_extension_only(monkeypatch, tmp_path, loaded_ago_s):
    # The rate spans the extension's loading to the calibration's end: a loading long ago is not trusted (a
    # machine suspended since stops one clock and not the other). Its tick count is made wrong here, so a
    # rate taken from it would be far off.
    from ocular import _ocular, _recorder

    ticks, mono, unix = _ocular.clock_point()
    monkeypatch.setattr(_recorder, "_calibrations", {})
    monkeypatch.setattr(_recorder, "_KEPT_FOR_S", 0.0)  # measured here, not taken from an earlier process
    monkeypatch.setattr(_recorder, "_loaded_at", (ticks // 2, mono - int(loaded_ago_s * 1e9), unix))
    with ocular.record(tmp_path / "t.ocl", mode="calls"):
        workloads.loop(10)
    hz = read_ocl(tmp_path / "t.ocl")["header"]["ticks_per_second"]
    truth = _ocular.ticks_per_second(20)
    if loaded_ago_s:
        assert abs(hz / truth - 1) < 2e-3, (hz, truth)
    else:
        assert abs(hz / truth - 1) > 0.1, "a recent loading's point is the far end of the measurement"


def _live_code_objects():
    """Every code object reachable from a live function, with the code objects nested in their constants."""
    import gc
    import types

    seen = {}
    todo = [o.__code__ for o in gc.get_objects() if isinstance(o, types.FunctionType)]
    while todo:
        c = todo.pop()
        if id(c) not in seen:
            seen[id(c)] = c
            todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return seen.values()


def test_positions_read_back_equal_co_positions(ocl):
    """The file stores co_linetable as CPython has it (FORMAT.md 6.1.1); the reader's decoding must give
    exactly co_positions() for every code object, whatever forms of entry CPython chose."""
    import argparse
    import dataclasses
    import json
    import textwrap

    with ocular.record(ocl, mode="calls"):
        json.loads(json.dumps({"a": [1, 2.5, None, {"b": "c"}]}, indent=2))
        argparse.ArgumentParser(prog="x").parse_args([])
        textwrap.fill("many words " * 30, width=40)
        dataclasses.make_dataclass("P", [("x", int), ("y", int, dataclasses.field(default=0))])(1)
        workloads.mixed()
    f = _ocular.read(ocl)
    live = {}
    for c in _live_code_objects():
        live.setdefault((c.co_filename, c.co_qualname, c.co_firstlineno, c.co_code), []).append(c)
    compared = 0
    for cid, (qual, filename, first_line, _name) in f["code"].items():
        same = live.get((filename, qual, first_line, f["bytecode"][cid]), [])
        if len({c.co_linetable for c in same}) != 1:
            continue  # a module body no function refers to, or generated code (dataclasses) seen twice
        c = same[0]
        want = [tuple(-1 if v is None else v for v in p) for p in c.co_positions()]
        assert [tuple(p) for p in f["positions"][cid]] == want, f"{qual} at {filename}:{first_line}"
        compared += 1
    assert compared >= 100, f"only {compared} code objects compared of {len(f['code'])}"
