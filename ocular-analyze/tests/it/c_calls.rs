//! Calls of C functions (FORMAT.md 5.4): frames of their own under their Python caller, whatever order
//! their events come in. Traces built by hand, so every figure is known; the recorder's cost is 0 per
//! event unless a test says otherwise.

use ocular_analyze::analysis::{analyze, c_code_id, Analysis};
use ocular_format::{testing, CFunction, Calibration, CodeObject, EventKind, Position, RawEvent, Trailer, Writer};

const MAIN: u32 = 1;
const KEY: u32 = 2;
const SORTED: u32 = 1;
const LEN: u32 = 2;
const INT: u32 = 3;

fn ev(t: u64, code: u32, offset: u32, arg: u32, kind: EventKind) -> RawEvent {
    RawEvent::new(1_000_000 + t, code, offset, arg, kind as u8)
}

fn code(id: u32, name: &str) -> CodeObject {
    CodeObject {
        id,
        name: name.into(),
        qualname: name.into(),
        filename: "prog.py".into(),
        first_line: id * 10,
        flags: 0,
        bytecode: vec![151, 0, 1, 0, 1, 0, 1, 0, 1, 0, 83, 0],
        linetable: Vec::new(),
        positions: vec![Position { line: 1, end_line: 1, column: 0, end_column: 1 }; 6],
    }
}

/// A trace of `events` on one thread, with `main`, `key` and the C callables `sorted`, `len` and `int`.
fn trace(events: &[RawEvent], calibration: Option<Calibration>) -> (tempfile::TempDir, Analysis) {
    trace_with_stop(events, calibration, None)
}

/// [`trace`] with a calibration written at the stop, after the events (FORMAT.md 6.6).
fn trace_with_stop(
    events: &[RawEvent],
    calibration: Option<Calibration>,
    stop: Option<Calibration>,
) -> (tempfile::TempDir, Analysis) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.ocl");
    let mut h = testing::header();
    h.event_cost_ticks = 0.0;
    h.options.mode = ocular_format::Mode::Calls;
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), "c.ocl", &h, Default::default()).unwrap();
    if let Some(c) = calibration {
        w.calibration(&c).unwrap();
    }
    w.code_objects(&[code(MAIN, "main"), code(KEY, "key")]).unwrap();
    let f = |id, q: &str, kind| CFunction { id, qualname: q.into(), module: "builtins".into(), kind };
    w.c_functions(&[
        f(SORTED, "sorted", CFunction::BUILTIN),
        f(LEN, "len", CFunction::BUILTIN),
        f(INT, "int", CFunction::TYPE),
    ])
    .unwrap();
    w.events(7, events).unwrap();
    if let Some(c) = stop {
        w.calibration(&c).unwrap();
    }
    let end_ticks = events.last().unwrap().ticks.get() + 10;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks, events: 0, lost: 0, chunks: 0 }).unwrap();
    let a = analyze(&path, Default::default()).unwrap();
    (dir, a)
}

/// (calls, inclusive ticks, exclusive ticks) of a code id.
fn fig(a: &Analysis, id: u32) -> (u64, f64, f64) {
    let s = &a.functions[&id];
    (s.calls, s.inclusive, s.exclusive)
}

fn c(id: u32) -> u32 {
    c_code_id(id).unwrap()
}

fn names(a: &Analysis, stack: &[u32]) -> Vec<String> {
    stack.iter().map(|id| a.code[id].qualname.clone()).collect()
}

#[test]
fn a_c_call_is_a_frame_under_its_caller_and_its_callbacks_under_it() {
    use EventKind::*;
    let (_d, a) = trace(
        &[
            ev(0, MAIN, 0, 0, PY_START),
            ev(100, MAIN, 4, SORTED, CALL),
            ev(200, KEY, 0, 0, PY_START),
            ev(300, KEY, 10, 0, PY_RETURN),
            ev(400, KEY, 0, 0, PY_START),
            // key raises through sorted: its frame unwinds, then sorted raises.
            ev(500, KEY, 10, 0, PY_UNWIND),
            ev(600, MAIN, 4, 0, C_RAISE),
            ev(700, MAIN, 6, LEN, CALL),
            ev(750, MAIN, 6, 0, C_RETURN),
            ev(1000, MAIN, 10, 0, PY_RETURN),
        ],
        None,
    );
    assert_eq!(fig(&a, MAIN), (1, 1000.0, 450.0));
    assert_eq!(fig(&a, c(SORTED)), (1, 500.0, 300.0));
    assert_eq!(fig(&a, KEY), (2, 200.0, 200.0));
    assert_eq!(fig(&a, c(LEN)), (1, 50.0, 50.0));
    assert_eq!(a.code[&c(LEN)].qualname, "builtins.len");
    assert_eq!((a.code[&c(LEN)].filename.as_str(), a.code[&c(LEN)].first_line), ("~", 0));
    // The flame graph's stacks: key under sorted under main; len a leaf under main.
    let mut stacks: Vec<(Vec<String>, f64)> = a.tree.stacks().into_iter().map(|(s, t)| (names(&a, &s), t)).collect();
    stacks.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        stacks,
        [
            (vec!["main".to_string()], 450.0),
            (vec!["main".into(), "builtins.len".into()], 50.0),
            (vec!["main".into(), "builtins.sorted".into()], 300.0),
            (vec!["main".into(), "builtins.sorted".into(), "key".into()], 200.0),
        ]
    );
}

#[test]
fn unbalanced_c_events_do_not_corrupt_the_stack() {
    use EventKind::*;
    let (_d, a) = trace(
        &[
            // The recording started inside a call of int from main: its return has no call, and is ignored
            // (it does not close main, which is not on the stack either).
            ev(0, MAIN, 8, 0, C_RETURN),
            ev(10, MAIN, 0, 0, PY_START),
            ev(100, MAIN, 4, SORTED, CALL),
            ev(200, KEY, 0, 0, PY_START),
            // key calls len, whose return is not recorded: key's return closes it.
            ev(250, KEY, 2, LEN, CALL),
            ev(280, KEY, 10, 0, PY_RETURN),
            // A return from a call site main has no open call at: ignored, sorted stays open.
            ev(300, MAIN, 8, 0, C_RETURN),
            ev(400, MAIN, 4, 0, C_RETURN),
            // int raises, its C_RAISE lost; main's next jump says it returned.
            ev(500, MAIN, 6, INT, CALL),
            ev(600, MAIN, 8, 2, JUMP),
            // A call still open when main returns, and one when the recording ends.
            ev(700, MAIN, 6, INT, CALL),
            ev(800, MAIN, 10, 0, PY_RETURN),
            ev(900, MAIN, 6, LEN, CALL),
        ],
        None,
    );
    assert_eq!(fig(&a, MAIN), (1, 790.0, 790.0 - 300.0 - 100.0 - 100.0));
    assert_eq!(fig(&a, c(SORTED)), (1, 300.0, 220.0));
    assert_eq!(fig(&a, KEY), (1, 80.0, 50.0));
    assert_eq!(fig(&a, c(LEN)), (2, 30.0, 30.0)); // key's; the last one has no time (the thread's last event)
    assert_eq!(fig(&a, c(INT)), (2, 200.0, 200.0));
    for s in a.functions.values() {
        assert!(s.inclusive >= s.exclusive && s.exclusive >= 0.0, "{s:?}");
    }
    let deepest = a.tree.stacks().into_iter().map(|(s, _)| names(&a, &s)).max_by_key(|s| s.len()).unwrap();
    assert_eq!(deepest, ["main", "builtins.sorted", "key", "builtins.len"]);
}

#[test]
fn recursion_through_a_c_function_counts_its_time_once() {
    use EventKind::*;
    // main -> sorted -> key -> sorted (from key's call site) -> key
    let (_d, a) = trace(
        &[
            ev(0, MAIN, 0, 0, PY_START),
            ev(100, MAIN, 4, SORTED, CALL),
            ev(200, KEY, 0, 0, PY_START),
            ev(300, KEY, 4, SORTED, CALL),
            ev(400, KEY, 0, 0, PY_START),
            ev(500, KEY, 10, 0, PY_RETURN),
            ev(600, KEY, 4, 0, C_RETURN),
            ev(700, KEY, 10, 0, PY_RETURN),
            ev(800, MAIN, 4, 0, C_RETURN),
            ev(900, MAIN, 10, 0, PY_RETURN),
        ],
        None,
    );
    // sorted: 2 calls, inclusive of its outermost activation only (100..800), exclusive 200 + 200.
    assert_eq!(fig(&a, c(SORTED)), (2, 700.0, 400.0));
    assert_eq!(fig(&a, KEY), (2, 500.0, 300.0));
    assert_eq!(fig(&a, MAIN), (1, 900.0, 200.0));
}

/// `main` calls `len` once: its CALL at 100, C_RETURN at 200, main from 0 to 1000.
fn len_called_once() -> [RawEvent; 4] {
    use EventKind::*;
    [
        ev(0, MAIN, 0, 0, PY_START),
        ev(100, MAIN, 4, LEN, CALL),
        ev(200, MAIN, 4, 0, C_RETURN),
        ev(1000, MAIN, 10, 0, PY_RETURN),
    ]
}

#[test]
fn c_events_cost_what_the_calibration_says_or_a_py_start() {
    let events = len_called_once();
    // Without C kinds in the calibration, a C event costs a PY_START: 10 ticks.
    let cal = Calibration { costs: vec![(EventKind::PY_START as u8, 10.0), (EventKind::PY_RETURN as u8, 10.0)] };
    let (_d, a) = trace(&events, Some(cal));
    assert_eq!(fig(&a, c(LEN)), (1, 90.0, 90.0));
    assert_eq!(fig(&a, MAIN), (1, 970.0, 880.0));
    // With them, their own: 30 ticks each.
    let cal = Calibration {
        costs: vec![
            (EventKind::PY_START as u8, 10.0),
            (EventKind::PY_RETURN as u8, 10.0),
            (EventKind::CALL as u8, 30.0),
            (EventKind::C_RETURN as u8, 30.0),
            (EventKind::C_RAISE as u8, 30.0),
        ],
    };
    let (_d, a) = trace(&events, Some(cal));
    assert_eq!(fig(&a, c(LEN)), (1, 70.0, 70.0));
    assert_eq!(fig(&a, MAIN), (1, 930.0, 860.0));
}

#[test]
fn costs_follow_the_machine_s_speed_at_the_stop() {
    let events = len_called_once();
    let costs = vec![
        (EventKind::PY_START as u8, 10.0),
        (EventKind::PY_RETURN as u8, 10.0),
        (EventKind::CALL as u8, 30.0),
        (EventKind::C_RETURN as u8, 30.0),
        (Calibration::SPEED_START, 80.0),
    ];
    // The calibration's loop took 80 ticks an iteration at the start and 40 at the stop: the machine ran
    // twice as fast, and so did the recorder, so every cost is halved.
    let stop = Calibration { costs: vec![(Calibration::SPEED_STOP, 40.0)] };
    let (_d, a) = trace_with_stop(&events, Some(Calibration { costs: costs.clone() }), Some(stop));
    assert_eq!(fig(&a, c(LEN)), (1, 85.0, 85.0));
    assert_eq!(fig(&a, MAIN), (1, 965.0, 880.0));
    assert_eq!(a.cost_speed_ratio, Some(0.5));
    // Killed before its stop: the start's costs as they were.
    let (_d, a) = trace_with_stop(&events, Some(Calibration { costs: costs.clone() }), None);
    assert_eq!(fig(&a, c(LEN)), (1, 70.0, 70.0));
    // A stop's speed beyond belief (100 times slower) moves the costs by three times at most.
    let stop = Calibration { costs: vec![(Calibration::SPEED_STOP, 8000.0)] };
    let (_d, a) = trace_with_stop(&events, Some(Calibration { costs }), Some(stop));
    assert_eq!(a.cost_speed_ratio, Some(3.0));
    assert_eq!(fig(&a, c(LEN)), (1, 10.0, 10.0));
}
