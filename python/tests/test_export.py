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


def test_pftrace_decodes_with_perfettos_protos_and_slices_balance(trace):
    P, t = trace
    E = P.TrackEvent
    per_track = collections.defaultdict(int)
    counts = collections.Counter()
    last_ts = {}
    for p in t.packet:
        assert p.trusted_packet_sequence_id == 1
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        counts[te.type] += 1
        assert p.timestamp >= last_ts.get(te.track_uuid, 0)
        last_ts[te.track_uuid] = p.timestamp
        if te.type == E.TYPE_SLICE_BEGIN:
            per_track[te.track_uuid] += 1
        elif te.type == E.TYPE_SLICE_END:
            per_track[te.track_uuid] -= 1
            assert per_track[te.track_uuid] >= 0, "an end without a begin"
    assert all(v == 0 for v in per_track.values())
    # main, count, nested, calls and 300 calls of g; one instant per recorded loop iteration.
    assert counts[E.TYPE_SLICE_BEGIN] == counts[E.TYPE_SLICE_END] == 304
    assert counts[E.TYPE_INSTANT] == 1000 + 500 + 10 + 300
    assert t.packet[0].sequence_flags == P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED


def test_pftrace_names_functions_threads_and_loops(trace):
    P, t = trace
    names = {n.iid: n.name for p in t.packet if p.HasField("interned_data") for n in p.interned_data.event_names}
    assert sorted(names.values()) == ["calls", "count", "g", "loop", "main", "nested"]
    threads = {p.track_descriptor.thread.thread_name for p in t.packet if p.track_descriptor.HasField("thread")}
    assert threads == {"MainThread"}
    process = [p.track_descriptor.process.process_name for p in t.packet if p.track_descriptor.HasField("process")]
    assert process == ["python 3.12.1 (adaptive mode)"]
    loop_iid = next(i for i, n in names.items() if n == "loop")
    instants = [p.track_event for p in t.packet if p.HasField("track_event") and p.track_event.name_iid == loop_iid]
    ann = {a.name: a.uint_value for a in instants[1].debug_annotations}
    assert ann["uops"] == 7 and ann["cycles"] > 0
