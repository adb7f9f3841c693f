"""Spans: `ocular.span` and OpenTelemetry's spans (through `ocular.otel.SpanProcessor`) in the recording, and
`ocular spans`, against programs that know their slow requests.

GIVEN a threading HTTP server on loopback instrumented with opentelemetry-sdk, under 300 sequential
requests of which one in fifty takes a slow path through `slow_lookup`; WHEN it is recorded (default mode
and calls mode); THEN the spans view counts every request, its durations match what the handler measured
itself, its slow spans are exactly the slow requests, it names `slow_lookup` as where their extra time went
and never in the fast ones, and every trace id it prints is one the exporter recorded.

GIVEN asyncio tasks taking turns on one thread, two in fifty spinning in `slow_part`; THEN each span holds
its own task's time only: the slow ones `slow_part`'s 4 ms, the others none of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ocular

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk (installed by make test) is needed")

WORKLOADS = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "workloads")


def record(tmp_path, workload, *args, mode=None):
    trace = tmp_path / f"{workload}.ocl"
    out = tmp_path / f"{workload}.json"
    cmd = [sys.executable, "-m", "ocular", "run", "-o", str(trace)]
    if mode:
        cmd += ["--mode", mode]
    # A timeout: a recording that hangs fails its test instead of the suite.
    subprocess.run(cmd + [os.path.join(WORKLOADS, f"{workload}.py"), str(out), *args], check=True,
                   capture_output=True, timeout=600)
    return trace, json.loads(out.read_text())


def spans(trace, *args):
    out = subprocess.run([sys.executable, "-m", "ocular", "spans", str(trace), "--json", *args], check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)


@pytest.mark.parametrize("mode", [None, "calls"])
def test_the_slow_requests_are_the_slow_spans_and_their_time_is_named_where_it_went(tmp_path, mode):
    trace, truth = record(tmp_path, "spans_service", "300", mode=mode)
    view = spans(trace, "--top", "1000", "--functions", "20")
    names = {n["name"]: n for n in view["names"]}
    assert names["GET /orders"]["count"] == 300 and names["render"]["count"] == 300
    assert names["GET /orders"]["open"] == 0 and names["GET /orders"]["errors"] == 0
    assert view["by_function"] and view["cut_by_ring"] == 0

    slow = {str(i) for i in truth["slow"]}
    orders = [s for s in view["slowest"] if s["span"]["name"] == "GET /orders"]
    assert len(orders) == 300
    with_lookup = set()
    for s in orders:
        sp = s["span"]
        i = dict(sp["attributes"])["i"]
        # The span lies between what the handler measured inside it and around it (which adds
        # OpenTelemetry's own work before the span's start and after its end).
        inner, outer = truth["durations_ms"][i]
        assert inner <= sp["duration_ms"] <= outer, (sp, inner, outer)
        assert sp["trace_id"] in truth["trace_ids"] and len(sp["span_id"]) == 16
        f = {x["function"]: x for x in s["functions"]}
        if "slow_lookup" in f:
            with_lookup.add(i)
            # slow_lookup spins 5 ms of wall time: the clock's less the recorder's cost, with its interval.
            lookup = f["slow_lookup"]
            assert lookup["inclusive_ms"] + lookup["inclusive_ci_ms"] >= 4.5, lookup
            assert lookup["inclusive_ms"] <= sp["duration_ms"], lookup
    # Exactly the slow requests ran slow_lookup, as their spans say.
    assert with_lookup == slow

    # The slow spans (those above the largest step in the slowest tenth: the slow requests, and any other
    # that the machine held up as long) spent their extra time in slow_lookup, which the others never ran.
    d = {x["name"]: x for x in view["differences"]}["GET /orders"]
    # At most the slowest tenth, by the view's rule: a busy machine can hold up that many.
    assert len(slow) <= d["slow"] <= 30 and d["slow"] + d["others"] == 300
    first = d["functions"][0]
    assert first["function"] == "slow_lookup", d["functions"][:3]
    assert first["others_ms"] == 0 and first["slow_ms"] >= 4.5 * len(slow) / d["slow"], first

    # The text view says the same.
    text = subprocess.run([sys.executable, "-m", "ocular", "spans", str(trace)], check=True, capture_output=True,
                          text=True, timeout=600).stdout
    part = text.split(f"GET /orders: where the slow {d['slow']} span")[1]
    assert part.splitlines()[2].split()[4] == "slow_lookup", text


def test_a_coroutine_s_span_holds_its_own_task_s_time_only(tmp_path):
    trace, truth = record(tmp_path, "spans_async")
    view = spans(trace, "--top", "1000", "--functions", "50")
    slowest = view["slowest"]
    assert len(slowest) == 200
    slow_jobs = {str(i) for i in truth["slow"] if i % 2}
    with_slow = {"job": set(), "decorated": 0}
    for s in slowest:
        sp = s["span"]
        f = {x["function"]: x for x in s["functions"]}
        part = f.get("slow_part")
        if part is None:
            continue
        # 4 ms of spinning (more if the machine took the CPU away meanwhile), never a share of it.
        assert part["inclusive_ms"] + part["inclusive_ci_ms"] >= 3.9, (sp, part)
        if sp["name"] == "job":
            with_slow["job"].add(dict(sp["attributes"])["i"])
        else:
            with_slow["decorated"] += 1
    # Each slow job's span has it, and no other span: the 19 tasks waiting meanwhile are not charged.
    assert with_slow == {"job": slow_jobs, "decorated": len(truth["slow"]) - len(slow_jobs)}


def test_spans_outside_a_recording_cost_nothing_and_change_nothing():
    assert ocular.active() is None

    @ocular.span("decorated")
    def f(x):
        return x * 2

    @ocular.span("decorated async")
    async def g(x):
        return x * 3

    import asyncio

    assert f(2) == 4 and asyncio.run(g(2)) == 6
    with ocular.span("plain", a=1) as s:
        s.set_attribute("b", [1, 2])
    with pytest.raises(KeyError):
        with ocular.span("raising"):
            raise KeyError(1)


def test_a_span_ended_by_an_exception_is_an_error_with_its_message(tmp_path):
    trace = tmp_path / "err.ocl"
    with ocular.record(trace, mode="calls"):
        for i in range(3):
            try:
                with ocular.span("step", i=i) as s:
                    s.set_attribute("late", True)
                    if i == 1:
                        raise ValueError("no such order")
            except ValueError:
                pass
    view = spans(trace)
    assert view["names"][0] == {"name": "step", "count": 3, "open": 0, "p50_ms": view["names"][0]["p50_ms"],
                                "p95_ms": view["names"][0]["p95_ms"], "p99_ms": view["names"][0]["p99_ms"],
                                "max_ms": view["names"][0]["max_ms"], "errors": 1}
    errors = [s["span"] for s in view["slowest"] if s["span"]["status"] == "error"]
    assert [(e["message"], dict(e["attributes"])) for e in errors] == [
        ("ValueError: no such order", {"i": "1", "late": "True"})]


def test_async_with_spans_nest_per_task_and_keep_their_status(tmp_path):
    import asyncio

    async def job(i):
        async with ocular.span("outer", i=i) as s:
            s.set_attribute("late", i)
            await asyncio.sleep(0.001)
            async with ocular.span("inner", i=i):
                await asyncio.sleep(0.001)
        try:
            async with ocular.span("failing", i=i):
                raise KeyError(i)
        except KeyError:
            pass

    async def main():
        await asyncio.gather(job(0), job(1))

    trace = tmp_path / "async.ocl"
    with ocular.record(trace, mode="calls"):
        asyncio.run(main())
    view = spans(trace, "--top", "6")
    assert {n["name"]: (n["count"], n["errors"]) for n in view["names"]} == {
        "outer": (2, 0), "inner": (2, 0), "failing": (2, 2)}
    got = {(s["span"]["name"], dict(s["span"]["attributes"])["i"]): s["span"] for s in view["slowest"]}
    for i in "01":
        # The two tasks interleave on one thread: each inner span is inside its own task's outer one.
        assert got["inner", i]["parent"] == got["outer", i]["key"]
        assert dict(got["outer", i]["attributes"])["late"] == i
        assert got["failing", i]["parent"] == 0
        assert (got["failing", i]["status"], got["failing", i]["message"]) == ("error", f"KeyError: {i}")


def test_one_span_object_marks_one_span_at_a_time():
    s = ocular.span("once")
    with s:
        with pytest.raises(RuntimeError, match="already open"):
            with s:
                pass


def test_a_slow_span_dumps_the_flight_recorder_with_that_span_whole(tmp_path):
    import time

    def slow_step():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.006:
            pass

    trace = tmp_path / "flight.ocl"
    rule = ocular.slower_than("op", 0.004, every=0)
    with ocular.record(trace, mode="calls", ring="16MB", dump_when=rule):
        for i in range(60):
            with ocular.span("op", i=i):
                sum(range(100))
                if i % 20 == 5:
                    slow_step()
    dumps = sorted(tmp_path.glob("flight.*.ocl"))
    # One dump per slow span, each written at its end: it holds that span whole, and slow_step in it.
    assert [p.name for p in dumps] == ["flight.1.ocl", "flight.2.ocl", "flight.3.ocl"]
    for n, dump in enumerate(dumps):
        # The dump holds the spans up to the one that made it (the ring holds the whole run), and those the
        # program ran while the writer wrote it (on a busy machine, up to the end): that one ended, with
        # slow_step in it.
        view = spans(dump, "--top", "100")
        by_i = {dict(s["span"]["attributes"])["i"]: s for s in view["slowest"]}
        assert set(map(int, by_i)) >= set(range(20 * n + 6)), sorted(map(int, by_i))
        s = by_i[str(20 * n + 5)]
        assert s["span"]["duration_ms"] >= 6.0
        assert s["functions"][0]["function"].endswith("slow_step")
    with pytest.raises(ValueError, match="dump_when needs a flight recorder"):
        ocular.record(tmp_path / "x.ocl", dump_when="op>0.1")
    with pytest.raises(ValueError, match=r"write NAME>SECONDS"):
        ocular.slower_than.parse("op<0.1")


def test_a_percentile_rule_dumps_what_stands_out_from_the_name_s_recent_spans():
    rule = ocular.slower_than("op", percentile=99, window=200, minimum=100, every=0)
    fired = [i for i in range(300) if rule("op", 0.010 if i % 150 == 120 else 0.001 + (i % 7) * 1e-5, float(i))]
    # The first 100 spans only fill the window; then the two that are ten times slower than the rest.
    assert fired == [120, 270]
    assert not rule("other", 1.0, 1000.0)
    # One dump a second at most, by default.
    every = ocular.slower_than("op", 0.5)
    assert [every("op", 1.0, t) for t in (0.0, 0.5, 1.2)] == [True, False, True]
    assert str(ocular.slower_than.parse("GET /a>b>p99.5")) == "GET /a>b>p99.5"


def test_the_exports_and_load_carry_the_spans(tmp_path):
    pl = pytest.importorskip("polars")
    trace, truth = record(tmp_path, "spans_service", "100")
    # Perfetto (Chrome trace JSON): an async slice per span, with its OpenTelemetry ids.
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, "-m", "ocular", "export", "--perfetto", str(trace), "-o", str(out)], check=True,
                   capture_output=True, timeout=600)
    events = json.loads(out.read_text())["traceEvents"]
    begins = [e for e in events if e.get("cat") == "span" and e["ph"] == "b"]
    ends = {e["id"]: e for e in events if e.get("cat") == "span" and e["ph"] == "e"}
    assert len(begins) == len(ends) == 200
    assert all(ends[b["id"]]["ts"] >= b["ts"] and ends[b["id"]]["tid"] == b["tid"] for b in begins)
    orders = [b for b in begins if b["name"] == "GET /orders"]
    assert sorted(b["args"]["trace_id"] for b in orders) == truth["trace_ids"]
    # Perfetto's protobuf, read with Perfetto's own protos: a slice per span on a "spans" track under its
    # thread, with the trace id as an argument.
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    out = tmp_path / "t.pftrace"
    subprocess.run([sys.executable, "-m", "ocular", "export", "--perfetto", str(trace), "-o", str(out)], check=True,
                   capture_output=True, timeout=600)
    t = pb.Trace()
    t.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in t.packet if p.HasField("track_descriptor")}
    slices = [p.track_event for p in t.packet if p.HasField("track_event")
              and tracks.get(p.track_event.track_uuid, pb.TrackDescriptor()).name == "spans"]
    assert sum(s.type == pb.TrackEvent.TYPE_SLICE_BEGIN for s in slices) == 200
    assert sum(s.type == pb.TrackEvent.TYPE_SLICE_END for s in slices) == 200
    ids = sorted(a.string_value for s in slices if s.name == "GET /orders" for a in s.debug_annotations
                 if a.name == "trace_id")
    assert ids == truth["trace_ids"]
    # Parquet: the spans table.
    subprocess.run([sys.executable, "-m", "ocular", "export", "--parquet", str(trace), "-o", str(tmp_path / "p")],
                   check=True, capture_output=True, timeout=600)
    df = pl.read_parquet(tmp_path / "p" / "spans.parquet")
    assert df.height == 200
    o = df.filter(pl.col("name") == "GET /orders")
    assert sorted(o["trace_id"].cast(pl.String).to_list()) == truth["trace_ids"]
    assert ((o["end_ns"] - o["start_ns"] - o["duration_ns"]).abs() <= 1).all()
    r = df.filter(pl.col("name") == "render")
    assert r["trace_id"].null_count() == 100 and r["parent"].is_in(o["key"].to_list()).all()
    # Each call names the innermost span it began in: the request's for the lookups (the slow path in the
    # 2 slow requests of 100), render's for json.dumps.
    calls = pl.read_parquet(tmp_path / "p" / "calls.parquet")
    name = dict(zip(df["key"].to_list(), df["name"].cast(pl.String).to_list()))

    def spans_of(function):
        return [name.get(k) for k in calls.filter(pl.col("function").cast(pl.String) == function)["span"].to_list()]

    assert spans_of("slow_lookup") == ["GET /orders"] * 2
    assert spans_of("fast_lookup") == ["GET /orders"] * 100
    assert spans_of("dumps").count("render") == 100
    # ocular.load: the same table; and stats inside the requests' spans only.
    assert ocular.load(trace).spans().height == 200
    rows = {r["function"]: r for r in ocular.load(trace).stats(span="GET /orders")}
    assert (rows["slow_lookup"]["calls"], rows["fast_lookup"]["calls"], rows["Handler.do_GET"]["calls"]) == (2, 100, 0)
    assert rows["Handler.do_GET"]["share"] == pytest.approx(1.0, abs=1e-6)  # it holds every span
    assert "main" not in rows  # the client's loop ran outside them
    # The report: a Spans tab embedding spans --json as the command prints it.
    from test_report import embedded

    page = tmp_path / "t.html"
    subprocess.run([sys.executable, "-m", "ocular", "report", str(trace), "-o", str(page)], check=True,
                   capture_output=True, timeout=600)
    [(pid, view)] = embedded(page.read_text())["spans"]
    assert view == spans(trace) and pid == ocular.load(trace).info()["pid"]
    assert 'data-tab="spans"' in page.read_text()
    # pprof: what ran inside a span is in samples labelled with its name, trace id and span id, moved out
    # of the unlabelled ones (each call counted once).
    pytest.importorskip("google.protobuf")
    from test_pprof import View, export

    v = View(export(trace, tmp_path / "t.pb.gz"))
    calls = v.leaf_sums("calls", key=lambda x: v.labels(x).get("span_name"))
    assert calls[("GET /orders", "fast_lookup")] == 100 and calls[(None, "fast_lookup")] == 0
    assert calls[("GET /orders", "slow_lookup")] == 2 and calls[(None, "slow_lookup")] == 0
    assert calls[("render", "dumps")] == 100
    slow = v.leaf_sums("wall", key=lambda x: v.labels(x).get("trace_id"))
    slow_traces = {t for (t, f), ns in slow.items() if f == "slow_lookup" and ns > 0}
    assert len(slow_traces) == 2 and slow_traces <= set(truth["trace_ids"])
    assert all(slow[(t, "slow_lookup")] >= 4.5e6 for t in slow_traces)  # spins 5 ms each
