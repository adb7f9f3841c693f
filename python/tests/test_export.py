"""Exports read back by the tools that consume them: the native Perfetto trace decoded with the `perfetto`
package's own Python protos."""

import collections
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))
LOOPS = os.path.join(ROOT, "testdata", "v1.0", "loops-adaptive.ocl")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    assert os.path.exists(ANALYZE), f"{ANALYZE} missing: make test builds it (cargo build -p ocular-analyze)"
    out = tmp_path_factory.mktemp("pf") / "loops.pftrace"
    r = subprocess.run([ANALYZE, "export", "--perfetto", "-o", str(out), LOOPS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"wrote {out}: "), r.stderr
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

    return P, P.Trace.FromString(out.read_bytes())


def track_events(P, t):
    """[(track uuid, absolute ns, TrackEvent)] as trace processor reads them: each thread's sequence opens with
    a packet that clears its state, anchors clock 64 (incremental) to BOOTTIME and makes it the default
    clock, with the thread's track as the default track; every later packet's timestamp is a delta."""
    seqs = {}
    out = []
    for p in t.packet:
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert clocks[64].is_incremental and clocks[6].timestamp == clocks[64].timestamp
            assert p.trace_packet_defaults.timestamp_clock_id == 64
            seqs[seq] = [clocks[64].timestamp, p.trace_packet_defaults.track_event_defaults.track_uuid]
        if not p.HasField("track_event"):
            continue
        assert seq in seqs, "a track event before its sequence was set up"
        assert p.sequence_flags == P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        assert not p.track_event.HasField("track_uuid"), "the track comes from the sequence's defaults"
        seqs[seq][0] += p.timestamp
        out.append((seqs[seq][1], seqs[seq][0], p.track_event))
    return out


def test_pftrace_decodes_with_perfettos_protos_and_slices_balance(trace):
    P, t = trace
    E = P.TrackEvent
    per_track = collections.defaultdict(int)
    counts = collections.Counter()
    last_ts = {}
    for track, ts, te in track_events(P, t):
        counts[te.type] += 1
        assert ts >= last_ts.get(track, 0)
        last_ts[track] = ts
        if te.type == E.TYPE_SLICE_BEGIN:
            per_track[track] += 1
        elif te.type == E.TYPE_SLICE_END:
            per_track[track] -= 1
            assert per_track[track] >= 0, "an end without a begin"
    assert all(v == 0 for v in per_track.values())
    # main, count, nested, calls and 300 calls of g; one instant per recorded loop iteration.
    assert counts[E.TYPE_SLICE_BEGIN] == counts[E.TYPE_SLICE_END] == 304
    assert counts[E.TYPE_INSTANT] == 1000 + 500 + 10 + 300
    # Descriptors on sequence 1, the thread's events on a sequence of their own.
    assert t.packet[0].trusted_packet_sequence_id == 1 and t.packet[0].HasField("track_descriptor")
    assert {p.trusted_packet_sequence_id for p in t.packet if p.HasField("track_event")} == {2}


def test_pftrace_times_are_the_calls_tables(trace, parquet_dir):
    """The delta-encoded times add up to the same call times as calls.parquet (both from one timeline)."""
    import polars as pl

    P, t = trace
    E = P.TrackEvent
    names = {n.iid: n.name for p in t.packet if p.HasField("interned_data") for n in p.interned_data.event_names}
    stack, spans = [], []
    for _, ts, te in track_events(P, t):
        if te.type == E.TYPE_SLICE_BEGIN:
            stack.append((names[te.name_iid], ts))
        elif te.type == E.TYPE_SLICE_END:
            name, start = stack.pop()
            spans.append((name, start, ts))
    calls = pl.read_parquet(os.path.join(parquet_dir, "calls.parquet")).sort("start_ns")
    want = [(str(f), s, e) for f, s, e in calls.select("function", "start_ns", "end_ns").iter_rows()]
    got = sorted(spans, key=lambda x: x[1])
    assert [n for n, _, _ in got] == [n for n, _, _ in want]
    base = got[0][1] - want[0][1]  # pftrace: monotonic ns; parquet: ns since the recording started
    assert all(abs((s - base) - ws) <= 1 and abs((e - base) - we) <= 1 for (_, s, e), (_, ws, we) in zip(got, want))


def test_pftrace_names_functions_threads_and_loops(trace):
    P, t = trace
    names = {n.iid: n.name for p in t.packet if p.HasField("interned_data") for n in p.interned_data.event_names}
    assert sorted(names.values()) == ["calls", "count", "events lost", "g", "loop", "main", "nested"]
    threads = {p.track_descriptor.thread.thread_name for p in t.packet if p.track_descriptor.HasField("thread")}
    assert threads == {"MainThread"}
    process = [p.track_descriptor.process.process_name for p in t.packet if p.track_descriptor.HasField("process")]
    assert process == ["python 3.12.1 (adaptive mode)"]
    loop_iid = next(i for i, n in names.items() if n == "loop")
    instants = [p.track_event for p in t.packet if p.HasField("track_event") and p.track_event.name_iid == loop_iid]
    # Annotation names are interned once per sequence, in its first packet.
    ann_names = {n.iid: n.name for p in t.packet if p.HasField("interned_data")
                 for n in p.interned_data.debug_annotation_names}
    assert sorted(ann_names.values()) == ["cycles", "lost", "uops"]
    ann = {ann_names[a.name_iid]: a.uint_value for a in instants[1].debug_annotations}
    assert ann["uops"] == 7 and ann["cycles"] > 0


# -- Parquet ---------------------------------------------------------------------------------------------

EVENT_COLUMNS = ["pid", "thread_id", "ts_ns", "tsc", "event", "code_id", "function", "file", "line", "offset", "arg",
                 "opcode", "specialized"]
CALL_COLUMNS = ["pid", "thread_id", "call_id", "parent", "depth", "code_id", "function", "file", "line", "start_ns",
                "end_ns", "duration_ns", "exclusive_ns", "window", "clipped", "span"]


def _info(path):
    import json

    r = subprocess.run([ANALYZE, "info", "--json", path], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pq") / "loops.parquet"
    r = subprocess.run([ANALYZE, "export", "--parquet", "-o", str(out), LOOPS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"wrote {out}: events.parquet (4241 rows), calls.parquet (304 rows)"), r.stderr
    return out


def test_parquet_read_by_polars_has_one_row_per_event(parquet_dir):
    import polars as pl

    info = _info(LOOPS)
    ev = pl.read_parquet(parquet_dir / "events.parquet")
    assert ev.columns == EVENT_COLUMNS
    assert ev.height == info["events"]
    # Spelled as sys.monitoring.events spells them, with the same counts as `info`.
    by_kind = dict(ev.group_by("event").len().iter_rows())
    assert by_kind == info["events_by_kind"]
    # The loop of `count` ran 1000 times: 1000 backward jumps (gapless recording).
    back = ev.filter((pl.col("function") == "count") & (pl.col("event") == "JUMP") & (pl.col("arg") < pl.col("offset")))
    assert back.height == 1000
    assert back["opcode"].unique().to_list() == ["JUMP_BACKWARD"]
    assert back["line"].unique().to_list() == [13]
    # Timestamps never go backwards within a thread.
    assert ev.group_by("thread_id").agg((pl.col("tsc").diff().drop_nulls() >= 0).all())["tsc"].all()


def test_parquet_calls_form_a_tree_that_matches_the_events(parquet_dir):
    import polars as pl

    calls = pl.read_parquet(parquet_dir / "calls.parquet")
    ev = pl.read_parquet(parquet_dir / "events.parquet")
    assert calls.columns == CALL_COLUMNS
    assert calls.filter(pl.col("function") == "g").height == 300
    starts = ev.filter(pl.col("event") == "PY_START").group_by("function").len().sort("function")
    assert calls.group_by("function").len().sort("function").equals(starts)
    # Each call lies inside its parent, one level deeper.
    j = calls.join(calls, left_on="parent", right_on="call_id", suffix="_p")
    assert j.height == calls.height - 1  # every call but main has its parent
    assert (j["depth"] == j["depth_p"] + 1).all()
    assert ((j["start_ns"] >= j["start_ns_p"]) & (j["end_ns"] <= j["end_ns_p"])).all()
    assert (calls["duration_ns"] == calls["end_ns"] - calls["start_ns"]).all()
    # Exclusive time: the call's duration less its callees' (a DuckDB or polars user need not rebuild it).
    callees = calls.group_by("thread_id", "parent").agg(pl.col("duration_ns").sum().alias("callees"))
    own = calls.join(callees, left_on=["thread_id", "call_id"], right_on=["thread_id", "parent"], how="left")
    own = own.with_columns(pl.col("callees").fill_null(0))
    assert (own["exclusive_ns"] == own["duration_ns"] - own["callees"]).all()
    assert (calls["exclusive_ns"] >= 0).all() and (calls.filter(pl.col("function") == "g")["exclusive_ns"] > 0).all()


def test_parquet_read_by_pandas_and_strings_are_dictionary_encoded(parquet_dir):
    import pandas as pd
    import pyarrow.parquet as pq

    ev = pd.read_parquet(parquet_dir / "events.parquet")
    assert list(ev.columns) == EVENT_COLUMNS
    assert len(ev) == _info(LOOPS)["events"]
    assert (ev["event"] == "PY_START").sum() == 304
    code = pd.read_parquet(parquet_dir / "code.parquet")
    assert sorted(code["function"]) == ["calls", "count", "g", "main", "nested"]
    meta = pq.ParquetFile(parquet_dir / "events.parquet").metadata
    for i in range(meta.num_columns):
        name = meta.schema.column(i).name
        if name in ("event", "function", "file", "opcode", "specialized"):
            assert "RLE_DICTIONARY" in meta.row_group(0).column(i).encodings, name
        if name in ("thread_id", "ts_ns", "tsc", "code_id", "line", "offset", "arg"):
            assert "DELTA_BINARY_PACKED" in meta.row_group(0).column(i).encodings, name
    calls_meta = pq.ParquetFile(parquet_dir / "calls.parquet").metadata
    encodings = {calls_meta.schema.column(i).name: calls_meta.row_group(0).column(i).encodings
                 for i in range(calls_meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["start_ns"] and "DELTA_BINARY_PACKED" in encodings["end_ns"]
    # Two decoders of the delta-encoded timestamps (pyarrow's and polars') read the same values.
    import polars as pl

    pl_ev = pl.read_parquet(parquet_dir / "events.parquet")
    assert (ev["tsc"].to_numpy() == pl_ev["tsc"].to_numpy()).all()
    assert (ev["ts_ns"].to_numpy() == pl_ev["ts_ns"].to_numpy()).all()
    assert ev["ts_ns"].is_monotonic_increasing


def test_parquet_of_a_recording_without_calls_is_read_back_empty(tmp_path):
    # A table with no rows is a Parquet file with its schema and no row group.
    import polars as pl
    import pyarrow.parquet as pq

    import ocular

    ocl = str(tmp_path / "empty.ocl")
    with ocular.record(ocl, mode="calls"):
        pass
    out = tmp_path / "empty.parquet"
    r = subprocess.run([ANALYZE, "export", "--parquet", "-o", str(out), ocl], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = _info(ocl)
    calls = pl.read_parquet(out / "calls.parquet")
    assert calls.height == 0 and calls.columns == CALL_COLUMNS
    assert pq.ParquetFile(out / "calls.parquet").metadata.num_row_groups == 0
    events = pl.read_parquet(out / "events.parquet")
    assert events.height == info["events"] and events.columns == EVENT_COLUMNS
    assert pq.read_table(out / "events.parquet").num_rows == info["events"]


WINDOWED = """
def light():
    return sum(range(60))

def heavy():
    return sum(range(300))

for _ in range(60000):
    heavy()
    light()
    light()
"""


def test_parquet_functions_table_is_stats_with_the_intervals_of_its_estimates(tmp_path):
    """functions.parquet, read by polars, holds what `stats --json` says of each
    function, the 95% intervals of the sampled mode's estimates included; `ocular.load().functions()` is the
    same table."""
    import json
    import math
    import sys

    pl = pytest.importorskip("polars")
    import ocular

    script = tmp_path / "windowed.py"
    script.write_text(WINDOWED)
    ocl = tmp_path / "windowed.ocl"
    subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "--sampled", "-o", str(ocl), str(script)],
                   check=True, timeout=600)
    out = tmp_path / "windowed.parquet"
    r = subprocess.run([ANALYZE, "export", "--parquet", "-o", str(out), str(ocl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fn = pl.read_parquet(out / "functions.parquet")
    assert f"functions.parquet ({fn.height} rows)" in r.stderr, r.stderr
    stats = subprocess.run([ANALYZE, "stats", "--json", "--top", "100000", str(ocl)], capture_output=True,
                           text=True, check=True)
    want = {(x["function"], x["file"], x["line"]): x for x in json.loads(stats.stdout)}
    assert fn.height == len(want)
    for got in fn.iter_rows(named=True):
        w = want[(got["function"], got["file"], got["line"])]
        assert (got["calls"], got["calls_ci95"]) == (w["calls"], math.ceil(w["calls_ci95"])), (got, w)
        for col in ("inclusive", "exclusive"):
            assert got[f"{col}_ns"] == pytest.approx(w[f"{col}_ms"] * 1e6, abs=1), (got, w)
            assert got[f"{col}_ci95_ns"] == pytest.approx(w[f"{col}_ci95_ms"] * 1e6, abs=1), (got, w)
        for col in ("estimated", "calls_estimated", "calls_lower_bound", "times_lower_bound"):
            assert got[col] == w[col], (col, got, w)
    # heavy was called 60,000 times, past the first window: its count and times are estimates, each with
    # an interval that holds it.
    (heavy,) = fn.filter(pl.col("function") == "heavy").to_dicts()
    assert heavy["calls_estimated"] and heavy["estimated"]
    assert 0 < heavy["calls_ci95"] and abs(heavy["calls"] - 60000) <= max(6000, 2 * heavy["calls_ci95"]), heavy
    assert 0 < heavy["inclusive_ci95_ns"] < heavy["inclusive_ns"], heavy
    assert ocular.load(ocl).functions().to_dicts() == fn.to_dicts()
