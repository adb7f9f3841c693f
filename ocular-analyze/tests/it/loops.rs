//! Loop times on one thread: a loop running in two frames at once (recursion, or a frame whose return was
//! lost) is counted once, never for longer than the thread ran.

use ocular_analyze::analysis::analyze;
use ocular_format::{testing, EventKind, RawEvent};

const T0: u64 = 1_000_000;

fn ev(t: u64, offset: u32, arg: u32, kind: EventKind) -> RawEvent {
    RawEvent::new(T0 + t, 1, offset, arg, kind as u8)
}

/// A header whose ticks are nanoseconds from `T0`, with no recorder cost to take out.
fn header() -> ocular_format::Header {
    let mut header = testing::header();
    header.ticks_per_second = 1e9;
    header.event_cost_ticks = 0.0;
    header.start_ticks = T0;
    header
}

/// (total loop ticks, f's inclusive ticks, the thread's span) of `events` of the code object f (id 1),
/// whose loop jumps back from offset 20 to 10.
fn figures(events: &[RawEvent]) -> (f64, f64, f64) {
    let header = header();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loops.ocl");
    crate::synthetic_trace(&path, &header, vec![151, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 83, 0], 1, events);
    let a = analyze(&path, Default::default()).unwrap();
    let total: f64 = a.loops.values().map(|l| l.ticks + l.tail_ticks).sum();
    let span = (events.last().unwrap().ticks.get() - events[0].ticks.get()) as f64;
    (total, a.functions[&1].inclusive, span)
}

#[test]
fn a_loop_running_in_a_recursive_call_of_its_own_function_is_counted_once() {
    let jump = |t| ev(t, 20, 10, EventKind::JUMP);
    let (total, inclusive, span) = figures(&[
        ev(0, 0, 0, EventKind::PY_START),
        jump(20),
        // Called from inside the loop: the inner call's loop runs from 40 to its return at 140.
        ev(30, 0, 0, EventKind::PY_START),
        jump(40),
        jump(130),
        ev(140, 14, 0, EventKind::PY_RETURN),
        jump(150),
        ev(160, 14, 0, EventKind::PY_RETURN),
    ]);
    // The loop ran from 20 to 160 in one frame or the other. Counted per frame, the outer iteration
    // (20 to 150) held the inner run (40 to 140) too: 240 ticks, more than the 160 the thread ran.
    assert_eq!((total, inclusive, span), (140.0, 160.0, 160.0));
}

#[test]
fn a_frame_whose_return_was_lost_does_not_time_its_loop_again_over_the_next_call() {
    // The first call's return and the third call's start were lost: the second call is pushed above the
    // first, and the third call's jumps land in the first call's frame, whose last jump was at 20.
    let jump = |t| ev(t, 20, 10, EventKind::JUMP);
    let (total, _, span) = figures(&[
        ev(0, 0, 0, EventKind::PY_START),
        jump(10),
        jump(20),
        ev(100, 0, 0, EventKind::PY_START),
        jump(110),
        jump(190),
        ev(200, 14, 0, EventKind::PY_RETURN),
        jump(300),
        jump(310),
        ev(320, 14, 0, EventKind::PY_RETURN),
    ]);
    assert!(total <= span, "the loop's {total} ticks in a thread that ran {span}");
    // 10 to 20 and 110 to 200 as recorded; 20 to 300 less the 90 counted in the second call meanwhile;
    // 300 to 320.
    assert_eq!(total, 10.0 + 90.0 + (280.0 - 90.0) + 20.0);
}

#[test]
fn a_frame_the_walk_ends_for_a_lost_return_ends_its_loop_at_its_last_event() {
    use ocular_format::{CodeObject, Position, Trailer, Writer};
    // main (id 2) calls f (id 1), whose loop's last jump is at 30 and whose return was lost; main's next
    // event, at 1,000, shows f had returned by then. Ended there, f's loop read 970 ticks of main's time.
    let header = header();
    let code = |id: u32, name: &str| CodeObject {
        id,
        name: name.into(),
        qualname: name.into(),
        filename: "loops.py".into(),
        first_line: 1,
        flags: 0,
        bytecode: vec![151, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 83, 0],
        linetable: Vec::new(),
        positions: vec![Position { line: 1, end_line: 1, column: 0, end_column: 1 }; 8],
    };
    let at = |t: u64, code: u32, offset: u32, arg: u32, kind: EventKind| {
        RawEvent::new(T0 + t, code, offset, arg, kind as u8)
    };
    let events = [
        at(0, 2, 0, 0, EventKind::PY_START),
        at(5, 1, 0, 0, EventKind::PY_START),
        at(10, 1, 20, 10, EventKind::JUMP),
        at(20, 1, 20, 10, EventKind::JUMP),
        at(30, 1, 20, 10, EventKind::JUMP),
        at(1000, 2, 12, 2, EventKind::JUMP),
        at(1010, 2, 14, 0, EventKind::PY_RETURN),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost.ocl");
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), "lost.ocl", &header, Default::default()).unwrap();
    w.code_objects(&[code(1, "f"), code(2, "main")]).unwrap();
    w.events(7, &events).unwrap();
    let t = Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: T0 + 1020, events: 7, lost: 0, chunks: 2 };
    w.finish(t).unwrap();
    let a = analyze(&path, Default::default()).unwrap();
    let f_loop: f64 = a.loops.iter().filter(|(k, _)| k.0 == 1).map(|(_, l)| l.ticks + l.tail_ticks).sum();
    assert_eq!(f_loop, 20.0, "two iterations of 10, and no tail past f's last jump");
}

#[test]
fn a_thread_whose_clock_goes_back_inside_a_loop_reads_no_negative_or_wrapped_time() {
    // A thread's events in the order of its clock is what the recorder writes; a damaged or foreign file
    // (or a CPU whose counter is behind another's, after the thread moved) can break it. The analyzer
    // neither stops (the debug build's overflow check did) nor counts a wrapped difference, nor the 40
    // ticks it went back twice: an event stamped before the thread's previous one is taken as at its tick.
    let jump = |t| ev(t, 20, 10, EventKind::JUMP);
    let (total, inclusive, _) = figures(&[
        ev(0, 0, 0, EventKind::PY_START),
        jump(20),
        jump(100),
        jump(60), // 40 ticks back
        jump(120),
        ev(130, 14, 0, EventKind::PY_RETURN),
    ]);
    assert!((0.0..=130.0).contains(&total), "{total}");
    assert!((0.0..=130.0).contains(&inclusive), "{inclusive}");
}
