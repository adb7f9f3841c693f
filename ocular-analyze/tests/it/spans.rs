//! Spans (FORMAT.md 5.9): traces whose truth is known by construction, and what the spans view makes of
//! them. 1 tick = 1 µs, no recorder cost unless said.

use ocular_analyze::spans::{analyze, within};
use ocular_analyze::stats::SortBy;
use ocular_format::span::{begin_events, end_events, Attribute, SpanBegin, SpanEnd};
use ocular_format::{testing, CodeObject, EventKind, Position, RawEvent, Trailer, Writer};

const T0: u64 = 1_000_000;
const HANDLE: u32 = 1;
const FAST: u32 = 2;
const SLOW: u32 = 3;
const TASK: u32 = 4;

/// Equal to within rounding (times are ticks converted to ms).
#[track_caller]
fn close(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-9, "{got} != {want}");
}

fn ev(t: u64, code: u32, kind: EventKind) -> RawEvent {
    RawEvent::new(T0 + t, code, 0, 0, kind as u8)
}

fn begin(t: u64, key: u64, name: &str, frame: u64, i: u32) -> Vec<RawEvent> {
    let r = SpanBegin {
        name: name.into(),
        trace_id: vec![0xab; 16],
        span_id: key.to_be_bytes().to_vec(),
        frame,
        attributes: vec![Attribute { key: "i".into(), kind: 2, value: i.to_string() }],
        ..SpanBegin::default()
    };
    begin_events(T0 + t, key, &r)
}

/// Writes `threads` (thread id, events) with the code objects above, the recorder's cost per event
/// `cost`, ending 10 ticks after the last event.
fn write(threads: &[(u64, Vec<RawEvent>)], cost: f64) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut header = testing::header();
    header.ticks_per_second = 1e6;
    header.event_cost_ticks = cost;
    header.start_ticks = T0;
    header.options.mode = ocular_format::Mode::Calls;
    let code = |id: u32, name: &str| CodeObject {
        id,
        name: name.into(),
        qualname: name.into(),
        filename: "service.py".into(),
        first_line: id * 10,
        flags: 0,
        bytecode: vec![151, 0, 83, 0],
        linetable: Vec::new(),
        positions: vec![Position { line: id as i32 * 10, end_line: id as i32 * 10, column: 0, end_column: 1 }; 2],
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.ocl");
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &name, &header, Default::default()).unwrap();
    w.code_objects(&[code(HANDLE, "handle"), code(FAST, "fast"), code(SLOW, "slow"), code(TASK, "task")]).unwrap();
    let mut n = 0;
    let mut end = 0;
    for (tid, e) in threads {
        w.events(*tid, e).unwrap();
        n += e.len() as u64;
        end = end.max(e.last().map_or(0, |e| e.ticks.get()));
    }
    let chunks = threads.len() as u64 + 2;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: end + 10, events: n, lost: 0, chunks }).unwrap();
    (dir, path)
}

/// One request on a thread from `t`: `handle` begins a span, calls `fast` for 10 ticks, and the slow
/// ones `slow` for 500; the span ends 5 ticks after the last call returns, `handle` 5 after that.
fn request(t: u64, key: u64, slow: bool) -> Vec<RawEvent> {
    use EventKind::*;
    let mut e = vec![ev(t, HANDLE, PY_START)];
    e.extend(begin(t + 1, key, "GET /orders", 0, key as u32));
    e.push(ev(t + 2, FAST, PY_START));
    e.push(ev(t + 12, FAST, PY_RETURN));
    let mut at = t + 12;
    if slow {
        e.push(ev(at, SLOW, PY_START));
        e.push(ev(at + 500, SLOW, PY_RETURN));
        at += 500;
    }
    e.extend(end_events(T0 + at + 5, key, None));
    e.push(ev(at + 10, HANDLE, PY_RETURN));
    e
}

#[test]
fn the_slow_requests_extra_time_is_named_where_it_went_and_durations_are_exact() {
    // 50 requests on two threads, one after the other; the 8th and 33rd take the slow path.
    let mut threads = vec![(7u64, Vec::new()), (8u64, Vec::new())];
    for k in 0..50u64 {
        let slow = k == 7 || k == 32;
        threads[(k % 2) as usize].1.extend(request(1000 * k, k + 1, slow));
    }
    let (_d, path) = write(&threads, 0.0);
    let s = analyze(&path, Default::default(), 2, 10).unwrap();
    assert_eq!(s.names.len(), 1);
    let n = &s.names[0];
    // Durations: the span from t+1 to t+17 (16 ticks), the slow ones 516.
    assert_eq!((n.name.as_str(), n.count, n.open, n.errors), ("GET /orders", 50, 0, 0));
    close(n.p50_ms, 0.016);
    close(n.p95_ms, 0.016);
    close(n.max_ms, 0.516);
    assert_eq!(s.slowest.len(), 2);
    for x in &s.slowest {
        close(x.span.duration_ms.unwrap(), 0.516);
        assert!(x.span.attributes == [("i".into(), "8".into())] || x.span.attributes == [("i".into(), "33".into())]);
        assert_eq!(x.span.trace_id, "ab".repeat(16));
        let f = |name: &str| x.functions.iter().find(|f| f.function == name).unwrap();
        // In the span: handle's own 1 + 5 ticks, fast's 10, slow's 500 (nothing of handle before the
        // span or after it).
        close(f("slow").exclusive_ms, 0.5);
        close(f("fast").exclusive_ms, 0.01);
        close(f("handle").exclusive_ms, 0.006);
        close(f("handle").inclusive_ms, 0.516);
        assert_eq!(f("slow").exclusive_ci_ms, 0.0, "no recorder cost: exact");
    }
    let d = &s.differences[0];
    assert_eq!((d.slow, d.others), (2, 48));
    assert_eq!(d.functions[0].function, "slow");
    close(d.functions[0].slow_ms, 0.5);
    close(d.functions[0].others_ms, 0.0);
    assert!(d.functions[1..].iter().all(|f| f.extra_exclusive_ms.abs() < 1e-9), "{:?}", d.functions);
}

/// Two tasks on one thread take turns: task A (frame 0x100) begins a span and runs `slow` in its second
/// turn; task B (frame 0x200) runs `fast` in between, inside A's span's time but not in it.
fn tasks() -> Vec<RawEvent> {
    use EventKind::*;
    let frame = |mut e: RawEvent, id: u64| {
        e.set_frame_id(id);
        e
    };
    let mut e = vec![frame(ev(0, TASK, PY_START), 0x100)];
    e.extend(begin(1, 1, "job", 0x100, 1));
    e.push(frame(ev(10, TASK, PY_YIELD), 0x100));
    e.push(frame(ev(10, TASK, PY_START), 0x200));
    e.push(ev(20, FAST, PY_START));
    e.push(ev(120, FAST, PY_RETURN));
    e.push(frame(ev(130, TASK, PY_YIELD), 0x200));
    e.push(frame(ev(130, TASK, PY_RESUME), 0x100));
    e.push(ev(140, SLOW, PY_START));
    e.push(ev(440, SLOW, PY_RETURN));
    e.extend(end_events(
        T0 + 450,
        1,
        Some(&SpanEnd { status: 2, message: "KeyError: 7".into(), ..SpanEnd::default() }),
    ));
    e.push(frame(ev(460, TASK, PY_RETURN), 0x100));
    e
}

#[test]
fn a_coroutine_s_span_holds_its_turns_and_not_the_other_tasks_on_its_thread() {
    let (_d, path) = write(&[(7, tasks())], 0.0);
    let s = analyze(&path, Default::default(), 1, 10).unwrap();
    let x = &s.slowest[0];
    close(x.span.duration_ms.unwrap(), 0.449);
    assert_eq!((x.span.status, x.span.message.as_str()), ("error", "KeyError: 7"));
    // The span's turns: 1..10 and 130..450 in `task` (A) and `slow`; B's turn (10..130) is not in it.
    let names: Vec<&str> = x.functions.iter().map(|f| f.function.as_str()).collect();
    assert_eq!(names, ["slow", "task"]);
    close(x.functions[0].exclusive_ms, 0.3);
    close(x.functions[0].inclusive_ms, 0.3);
    close(x.functions[1].exclusive_ms, 0.029);
    close(x.functions[1].inclusive_ms, 0.329);
    assert_eq!(s.names[0].errors, 1);
}

#[test]
fn a_span_ended_on_another_thread_and_one_cut_by_the_ring_are_read_as_such() {
    use EventKind::*;
    let mut a = vec![ev(0, HANDLE, PY_START)];
    a.extend(begin(1, 1, "handoff", 0, 0));
    a.push(ev(101, HANDLE, PY_RETURN));
    // The span ends on thread 8 at 51; a flight recorder overwrote span 2's beginning (its end remains).
    let mut b = vec![ev(40, FAST, PY_START)];
    b.extend(end_events(T0 + 51, 1, None));
    b.extend(end_events(T0 + 52, 2, None));
    b.push(ev(60, FAST, PY_RETURN));
    let (_d, path) = write(&[(7, a), (8, b)], 0.0);
    let s = analyze(&path, Default::default(), 5, 10).unwrap();
    assert_eq!(s.cut_by_ring, 1);
    assert_eq!(s.slowest.len(), 1);
    let x = &s.slowest[0];
    assert_eq!(x.span.thread_id, 7);
    close(x.span.duration_ms.unwrap(), 0.05);
    // Thread 7's time from 1 to 51, in `handle`; thread 8's `fast` is not the span's.
    assert_eq!(x.functions.iter().map(|f| f.function.as_str()).collect::<Vec<_>>(), ["handle"]);
    close(x.functions[0].exclusive_ms, 0.05);
    assert!(
        s.notes.iter().any(|n| n.contains("1 span whose beginning the flight recorder had overwritten")),
        "{:?}",
        s.notes
    );
}

#[test]
fn the_recorder_s_cost_is_taken_out_and_said_as_an_interval() {
    // Every event costs 2 ticks: `slow`'s 500 ticks hold the cost of its return (2), `fast`'s 10 its return's.
    let (_d, path) = write(&[(7, request(0, 1, true))], 2.0);
    let s = analyze(&path, Default::default(), 1, 10).unwrap();
    let f = |name: &str| s.slowest[0].functions.iter().find(|f| f.function == name).unwrap().clone();
    close(f("slow").exclusive_ms, 0.498);
    close(f("slow").exclusive_ci_ms, 0.004);
    close(f("fast").exclusive_ms, 0.008);
    close(f("fast").exclusive_ci_ms, 0.004);
}

#[test]
fn stats_within_a_span_name_holds_only_what_ran_inside_its_spans() {
    use EventKind::*;
    // The 50 requests, two slow; after each request `task` runs 100 ticks outside any span.
    let mut threads = vec![(7u64, Vec::new()), (8u64, Vec::new())];
    for k in 0..50u64 {
        let e = &mut threads[(k % 2) as usize].1;
        e.extend(request(1000 * k, k + 1, k == 7 || k == 32));
        e.push(ev(1000 * k + 600, TASK, PY_START));
        e.push(ev(1000 * k + 700, TASK, PY_RETURN));
    }
    let (_d, path) = write(&threads, 0.0);
    let w = within(&path, Default::default(), "GET /orders", SortBy::Exclusive, 10).unwrap();
    assert_eq!((w.spans, w.open, w.more), (50, 0, 0));
    close(w.spans_ms, 48.0 * 0.016 + 2.0 * 0.516);
    let rows: Vec<(&str, u64)> = w.rows.iter().map(|r| (r.function.as_str(), r.calls)).collect();
    // `handle` began each span, so none of its calls began inside one; `task` ran outside them all.
    assert_eq!(rows, [("slow", 2), ("fast", 50), ("handle", 0)]);
    close(w.rows[0].exclusive_ms, 1.0);
    close(w.rows[1].exclusive_ms, 0.5);
    close(w.rows[2].exclusive_ms, 50.0 * 0.006);
    close(w.rows[2].inclusive_ms, w.spans_ms);
    close(w.rows[2].share, 1.0);
    let text = w.to_string();
    close(w.program_ms, w.spans_ms);
    assert!(text.starts_with("inside 50 spans named \"GET /orders\": 1.800 ms in all"), "{text}");

    let none = within(&path, Default::default(), "POST /x", SortBy::Exclusive, 10).unwrap();
    assert_eq!(none.spans, 0);
    assert_eq!(none.to_string(), "no ended span named \"POST /x\"; the recording's span names: GET /orders\n");
}

#[test]
fn time_inside_two_nested_spans_of_one_name_counts_once() {
    use EventKind::*;
    // handle begins "op" (1..111); fast, called inside it, begins another "op" (3..105) around slow.
    let mut e = vec![ev(0, HANDLE, PY_START)];
    e.extend(begin(1, 1, "op", 0, 1));
    e.push(ev(2, FAST, PY_START));
    e.extend(begin(3, 2, "op", 0, 2));
    e.push(ev(4, SLOW, PY_START));
    e.push(ev(104, SLOW, PY_RETURN));
    e.extend(end_events(T0 + 105, 2, None));
    e.push(ev(110, FAST, PY_RETURN));
    e.extend(end_events(T0 + 111, 1, None));
    e.push(ev(112, HANDLE, PY_RETURN));
    let (_d, path) = write(&[(7, e)], 0.0);
    let w = within(&path, Default::default(), "op", SortBy::Inclusive, 10).unwrap();
    assert_eq!(w.spans, 2);
    close(w.spans_ms, 0.110 + 0.102);
    close(w.program_ms, 0.110); // each moment once
    close(w.rows[0].share, 1.0);
    let f = |name: &str| w.rows.iter().find(|r| r.function == name).unwrap().clone();
    assert_eq!((f("handle").calls, f("fast").calls, f("slow").calls), (0, 1, 1));
    close(f("handle").inclusive_ms, 0.110);
    close(f("fast").inclusive_ms, 0.108);
    close(f("slow").exclusive_ms, 0.100);
    close(f("handle").exclusive_ms, 0.001 + 0.001);
    assert_eq!(w.rows[0].function, "handle");
}

#[test]
fn each_call_in_the_calls_table_names_the_innermost_span_it_began_in() {
    use crate::export::{texts, Collect};
    use ocular_analyze::table::{build, Column, Table};
    let calls = |threads: &[(u64, Vec<RawEvent>)]| {
        let (_d, path) = write(threads, 0.0);
        let mut sink = Collect::default();
        build(&path, Default::default(), &[Table::Calls], 1 << 20, &mut sink).unwrap();
        let b = &sink.0[0].1;
        let Some((_, Column::OptU64(span))) = b.columns.iter().find(|c| c.0 == "span").cloned() else {
            panic!("no span column of u64")
        };
        let mut rows: Vec<(String, Option<u64>)> =
            texts(b, "function").into_iter().map(Option::unwrap).zip(span).collect();
        rows.sort();
        rows
    };
    // Two requests on a thread, the second slow, `task` between them: `handle` began each span, so it is
    // in none; `fast` and `slow` began inside their request's span; `task` outside both.
    let mut e = request(0, 1, false);
    e.push(ev(600, TASK, EventKind::PY_START));
    e.push(ev(700, TASK, EventKind::PY_RETURN));
    e.extend(request(1000, 2, true));
    let got = calls(&[(7, e)]);
    let want =
        [("fast", Some(1)), ("fast", Some(2)), ("handle", None), ("handle", None), ("slow", Some(2)), ("task", None)];
    assert_eq!(got, want.map(|(f, s)| (f.to_string(), s)));
    // The coroutine's span holds its resumed activation and what it calls, not the other task's turn.
    let got = calls(&[(7, tasks())]);
    let want = [("fast", None), ("slow", Some(1)), ("task", None), ("task", None), ("task", Some(1))];
    assert_eq!(got, want.map(|(f, s)| (f.to_string(), s)));
}

#[test]
fn a_span_begun_in_a_frame_that_returns_holds_what_its_thread_runs_until_it_ends() {
    use EventKind::*;
    // As OpenTelemetry does: `handle` calls `task` (the SDK), which begins the span and returns; `handle`
    // then calls `slow`, and ends the span through `fast` (the SDK again).
    let mut e = vec![ev(0, HANDLE, PY_START), ev(1, TASK, PY_START)];
    e.extend(begin(2, 1, "GET /orders", 0, 1));
    e.push(ev(3, TASK, PY_RETURN));
    e.push(ev(10, SLOW, PY_START));
    e.push(ev(110, SLOW, PY_RETURN));
    e.push(ev(111, FAST, PY_START));
    e.extend(end_events(T0 + 112, 1, None));
    e.push(ev(113, FAST, PY_RETURN));
    e.push(ev(120, HANDLE, PY_RETURN));
    let (_d, path) = write(&[(7, e)], 0.0);
    let w = within(&path, Default::default(), "GET /orders", SortBy::Exclusive, 10).unwrap();
    let f = |name: &str| w.rows.iter().find(|r| r.function == name).unwrap().clone();
    assert_eq!((f("slow").calls, f("fast").calls, f("handle").calls), (1, 1, 0));
    close(f("slow").exclusive_ms, 0.1);
    close(f("handle").inclusive_ms, 0.11);
    close(f("handle").exclusive_ms, 0.008);
    close(f("task").inclusive_ms, 0.001);
}
