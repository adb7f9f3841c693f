//! `stats --lines` over traces whose truth is known by construction: 1 tick = 1 ns, every event costs the
//! recorder 10 ticks, and the code object `f` is a loop whose lines hold known instructions:
//!
//! ```text
//! offset  0 RESUME          line 1
//!         2 FOR_ITER (+cache) line 2
//!         6 POP_TOP         line 3
//!         8 POP_TOP         line 3
//!        10 POP_TOP         line 4
//!        12 JUMP_BACKWARD   line 4
//!        14 RETURN_VALUE    line 5
//! ```
//! `g` (line 10) is a function `f` calls in its first iteration.

use ocular_analyze::lines::{analyze, report, LineStat, Lines};
use ocular_format::{testing, CodeObject, EventKind, Position, RawEvent, ThreadInfo, Trailer, Writer};

const T0: u64 = 1_000_000;
const F: u32 = 1;
const G: u32 = 2;

fn ev(t: u64, code: u32, offset: u32, arg: u32, kind: EventKind) -> RawEvent {
    RawEvent::new(T0 + t, code, offset, arg, kind as u8)
}

fn write(events: &[RawEvent], threshold: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut header = testing::header();
    header.ticks_per_second = 1e9;
    header.event_cost_ticks = 10.0;
    header.start_ticks = T0;
    header.options.deinstrument_threshold = threshold;
    let at = |line: i32| Position { line, end_line: line, column: 0, end_column: 1 };
    let f = CodeObject {
        id: F,
        name: "f".into(),
        qualname: "f".into(),
        filename: "lines.py".into(),
        first_line: 1,
        flags: 0,
        bytecode: vec![151, 0, 93, 6, 0, 0, 1, 0, 1, 0, 1, 0, 140, 6, 83, 0],
        linetable: Vec::new(),
        positions: [1, 2, 2, 3, 3, 4, 4, 5].into_iter().map(at).collect(),
    };
    let g = CodeObject {
        id: G,
        name: "g".into(),
        qualname: "g".into(),
        filename: "lines.py".into(),
        first_line: 10,
        flags: 0,
        bytecode: vec![83, 0],
        linetable: Vec::new(),
        positions: vec![at(10)],
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lines.ocl");
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &name, &header, Default::default()).unwrap();
    w.code_objects(&[f, g]).unwrap();
    w.thread(&ThreadInfo { thread_id: 7, name: "MainThread".into(), is_main: true }).unwrap();
    w.events(7, events).unwrap();
    let end = events.last().unwrap().ticks.get() + 50;
    let n = events.len() as u64;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: end, events: n, lost: 0, chunks: 0 }).unwrap();
    (dir, path)
}

/// (line, function, hits, own ns, with callees ns, estimated), by function and line.
fn table(l: &Lines) -> Vec<(u32, String, u64, f64, f64, bool)> {
    let mut v: Vec<_> = l
        .lines
        .iter()
        .map(|s: &LineStat| {
            let r = |x: f64| (x * 1e6).round() / 1e6;
            (s.line, s.function.clone(), s.hits, r(s.own_ns), r(s.with_callees_ns), s.estimated)
        })
        .collect();
    v.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
    v
}

/// Two iterations of `f`'s loop, the first calling `g` (the figures of the test below).
fn two_iterations() -> [RawEvent; 9] {
    use EventKind::*;
    [
        ev(0, F, 0, 0, PY_START),
        // [0, 2]: RESUME and FOR_ITER, 100 - 10 ticks.
        ev(100, F, 2, 6, BRANCH),
        // The body [6, 12] calls g for 60 ticks (two events of 10): 300 - 10 - 10 - 10 own, 50 in g.
        ev(200, G, 0, 0, PY_START),
        ev(260, G, 0, 0, PY_RETURN),
        ev(400, F, 12, 2, JUMP),
        // Back at the loop's head: [2, 2], a new hit of line 2 (a backward jump).
        ev(450, F, 2, 6, BRANCH),
        // The body again, 290 ticks, no call.
        ev(750, F, 12, 2, JUMP),
        // The loop ends: [2, 2], then [14, 14] returns.
        ev(800, F, 2, 14, BRANCH),
        ev(900, F, 14, 0, PY_RETURN),
    ]
}

#[test]
fn runs_between_jumps_are_split_over_their_lines_without_the_recorder_or_the_callees() {
    let (_dir, path) = write(&two_iterations(), 0);
    let l = analyze(&path, Default::default()).unwrap();
    let f = || "f".to_string();
    assert_eq!(
        table(&l),
        [
            (1, f(), 1, 45.0, 45.0, false),
            (2, f(), 3, 125.0, 125.0, false),
            // (220 + 290) / 2 own, (270 + 290) / 2 with g.
            (3, f(), 2, 255.0, 280.0, false),
            (4, f(), 2, 255.0, 280.0, false),
            (5, f(), 1, 90.0, 90.0, false),
            (10, "g".to_string(), 1, 50.0, 50.0, false),
        ]
    );
    assert_eq!((l.unplaced_ns, l.spread_ns), (0.0, 0.0));
    let r = report(&[l], 2);
    assert_eq!(r.rows.iter().map(|r| r.stat.line).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(r.more, 4);
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    let text = r.to_string();
    assert!(text.contains("lines.py:3"), "{text}");
    assert!(text.contains("(source not readable)"), "{text}");
}

#[test]
fn a_recorder_pause_is_taken_out_of_the_line_and_the_function_it_fell_in() {
    // The trace above, with the recorder holding the thread up 200 ticks inside the second run of the
    // body (FORMAT.md 5.6): every later event is 200 ticks later, and every figure is as above.
    let plain = two_iterations();
    // The branch at 450 found its buffer full and waited: its pause comes first.
    let mut paused = plain[..5].to_vec();
    paused.extend([ev(450, 0, 0, 200, EventKind::PAUSE), plain[5]]);
    paused.extend(
        plain[6..]
            .iter()
            .map(|e| RawEvent::new(e.ticks.get() + 200, e.code.get(), e.offset.get(), e.arg.get(), e.kind)),
    );
    let (_d1, p1) = write(&plain, 0);
    let (_d2, p2) = write(&paused, 0);
    let (a, b) = (analyze(&p1, Default::default()).unwrap(), analyze(&p2, Default::default()).unwrap());
    assert_eq!(table(&b), table(&a));
    assert_eq!(b.placed_ns, a.placed_ns);
    // And the functions' times (`stats`), from the same pass as the call tree.
    let rows = |p: &std::path::Path| {
        let a = ocular_analyze::analysis::analyze(p, Default::default()).unwrap();
        let mut v: Vec<_> = ocular_analyze::stats::rows(&a, false, ocular_analyze::stats::SortBy::Exclusive)
            .into_iter()
            .map(|r| (r.function, r.calls, (r.inclusive_ms * 1e6).round(), (r.exclusive_ms * 1e6).round()))
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let want = rows(&p1);
    assert_eq!(want[0].0, "f");
    assert_eq!(rows(&p2), want);
}

#[test]
fn a_run_across_a_silenced_branch_is_spread_as_an_estimate() {
    use EventKind::*;
    // Threshold 2: FOR_ITER's branch at offset 2 is recorded twice, then silent; the backward jump goes on
    // (it is kept for twice the threshold).
    let e = [
        ev(0, F, 0, 0, PY_START),
        ev(100, F, 2, 6, BRANCH),
        ev(400, F, 12, 2, JUMP),
        ev(450, F, 2, 6, BRANCH),
        ev(750, F, 12, 2, JUMP),
        // [2, 12] with FOR_ITER silent: 290 ticks over its 5 instructions, one more run of lines 2, 3, 4: 29%
        // of the 1000 ticks placed.
        ev(1050, F, 12, 2, JUMP),
    ];
    let (_dir, path) = write(&e, 2);
    let l = analyze(&path, Default::default()).unwrap();
    let f = || "f".to_string();
    assert_eq!(
        table(&l),
        [
            (1, f(), 1, 45.0, 45.0, true),
            (2, f(), 3, 45.0 + 40.0 + 58.0, 45.0 + 40.0 + 58.0, true),
            (3, f(), 3, 290.0 + 116.0, 290.0 + 116.0, true),
            (4, f(), 3, 290.0 + 116.0, 290.0 + 116.0, true),
        ]
    );
    assert_eq!((l.silenced, l.spread_ns), (1, 290.0));
    let notes = report(&[l], 10).notes;
    assert!(notes[0].contains("the threshold stopped recording 1 jump, branch or instruction location)"), "{notes:?}");
    assert!(
        notes[0].contains(
            "0.000 ms (29% of the time in recorded frames) ran across a jump or branch that was not recorded"
        ),
        "{notes:?}"
    );
}

#[test]
fn calls_mode_has_no_lines_and_the_cli_says_which_modes_do() {
    let mut header = testing::header();
    header.options.mode = ocular_format::Mode::Calls;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calls.ocl");
    crate::synthetic_trace(&path, &header, vec![151, 0, 83, 0], 3, &[RawEvent::new(2000, 1, 0, 0, 0)]);
    assert!(!analyze(&path, Default::default()).unwrap().has_lines());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocular-analyze"))
        .args(["stats", "--lines"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was recorded in calls mode, which records function boundaries only"), "{err}");
    assert!(
        err.contains("Per-line figures need adaptive mode (the default: jumps and branches) or precise mode"),
        "{err}"
    );
}
