//! Recordings with windows (FORMAT.md 5.3): a trace whose truth is known by construction, and the
//! figures every view derives from it.
//!
//! One thread, 1 tick = 1 µs. The first window (complete) lasts 1000 ticks: `main` runs `f` for 300 and
//! `g` for 100. Then 10 windows of 100 ticks, one every 1000: in the odd ones the stack is `main, f` and `f`
//! runs throughout; in the even ones the stack is `main` and `main` calls `g` for 50 ticks. The run ends
//! 11000 ticks after it started, so each later window stands for 10 times its length.

use crate::export::{texts, Collect};
use ocular_analyze::analysis::analyze;
use ocular_analyze::stats;
use ocular_format::{testing, CodeObject, EventKind, Position, RawEvent, ThreadInfo, Trailer, Writer};

const T0: u64 = 1_000_000;
const MAIN: u32 = 1;
const F: u32 = 2;
const G: u32 = 3;
const GEN: u32 = 5;

fn ev(t: u64, code: u32, offset: u32, arg: u32, kind: EventKind) -> RawEvent {
    RawEvent::new(T0 + t, code, offset, arg, kind as u8)
}

fn windowed() -> (tempfile::TempDir, std::path::PathBuf) {
    windowed_with(&[])
}

/// [`windowed`] with counter samples (ticks, period) of one counter, `page-faults`, on its thread.
fn windowed_with(samples: &[(u64, u64)]) -> (tempfile::TempDir, std::path::PathBuf) {
    write_trace(&windowed_events(), samples, 11_000)
}

/// [`windowed`]'s events.
fn windowed_events() -> Vec<RawEvent> {
    use EventKind::*;
    let mut e = vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(100, F, 0, 0, PY_START),
        ev(400, F, 2, 0, PY_RETURN),
        ev(400, G, 0, 0, PY_START),
        ev(500, G, 2, 0, PY_RETURN),
        ev(1000, 0, 0, 0, WINDOW_END),
    ];
    for k in 1..=10u64 {
        let at = 1000 * k;
        e.push(ev(at, 0, k as u32, 100, WINDOW));
        e.push(ev(at, MAIN, 0, 0, STACK));
        if k % 2 == 1 {
            e.push(ev(at, F, 0, 1, STACK));
        } else {
            e.push(ev(at + 30, G, 0, 0, PY_START));
            e.push(ev(at + 80, G, 2, 0, PY_RETURN));
        }
    }
    // Between windows nothing of the kind is recorded; the run's last event, at 11000.
    e.push(ev(11_000, MAIN, 2, 0, JUMP));
    e
}

/// Writes `e` (thread 7) and counter `samples` (ticks, period) of one counter, `page-faults`, with the code
/// objects `main`, `f` and `g` (RESUME, RETURN_VALUE), into a file that ends at tick `end`.
fn write_trace(e: &[RawEvent], samples: &[(u64, u64)], end: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    write_trace_costing(e, samples, end, 0.0)
}

/// [`write_trace`] with the recorder's cost per event (markers cost nothing).
fn write_trace_costing(
    e: &[RawEvent],
    samples: &[(u64, u64)],
    end: u64,
    event_cost: f64,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut header = testing::header();
    header.ticks_per_second = 1e6;
    header.event_cost_ticks = event_cost;
    header.start_ticks = T0;
    let code = |id: u32, name: &str| CodeObject {
        id,
        name: name.into(),
        qualname: name.into(),
        filename: "windows.py".into(),
        first_line: id * 10,
        flags: 0,
        bytecode: vec![151, 0, 83, 0],
        linetable: Vec::new(),
        positions: vec![Position { line: id as i32 * 10, end_line: id as i32 * 10, column: 0, end_column: 1 }; 2],
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("windows.ocl");
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &name, &header, Default::default()).unwrap();
    // A generator: its start's RESUME, and the RESUME after its yield at offset 2.
    let gen = CodeObject {
        bytecode: vec![151, 0, 151, 1, 83, 0],
        positions: vec![code(GEN, "").positions[0]; 3],
        ..code(GEN, "gen")
    };
    w.code_objects(&[code(MAIN, "main"), code(F, "f"), code(G, "g"), code(4, "h"), gen]).unwrap();
    if !samples.is_empty() {
        // The samples' clock is the header's monotonic one: tick t is start_monotonic_ns + 1000 (t - T0).
        let ns = |t: u64| header.start_monotonic_ns + 1000 * t;
        w.counters(&ocular_format::CounterSamples {
            counters: vec![ocular_format::CounterInfo {
                name: "page-faults".into(),
                unit: "faults".into(),
                period: 1,
                error: String::new(),
            }],
            samples: samples
                .iter()
                .map(|&(t, period)| ocular_format::CounterSample {
                    thread_id: 7,
                    counter: 0,
                    monotonic_ns: ns(t),
                    period,
                })
                .collect(),
            lost: vec![],
        })
        .unwrap();
    }
    w.thread(&ThreadInfo { thread_id: 7, name: "MainThread".into(), is_main: true }).unwrap();
    w.events(7, e).unwrap();
    let n = e.len() as u64;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: T0 + end, events: n, lost: 0, chunks: 0 })
        .unwrap();
    (dir, path)
}

#[test]
fn stats_add_the_complete_part_to_the_windows_scaled_by_the_time_they_stand_for() {
    let (_dir, path) = windowed();
    let a = analyze(&path, Default::default()).unwrap();
    let w = a.windows.as_ref().expect("windows");
    assert_eq!((w.complete_ticks, w.sampled_ticks, w.windows, w.window_ticks), (1000, 10_000, 10, 1000));
    assert_eq!(w.scale, 10.0);
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let got: Vec<(&str, u64, u64, f64, f64, bool, bool)> = rows
        .iter()
        .map(|r| {
            let us = |ms: f64| (ms * 1e3 * 1e6).round() / 1e6;
            (
                r.function.as_str(),
                r.calls,
                r.observed_calls,
                us(r.inclusive_ms),
                us(r.exclusive_ms),
                r.estimated,
                r.calls_estimated,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            // f: 300 complete + 10 x (5 windows x 100)
            ("f", 1, 1, 5300.0, 5300.0, true, true),
            // main: 1000 - 300 - 100 complete + 10 x (5 windows x 50): inclusive is the whole run
            ("main", 1, 1, 11_000.0, 3100.0, true, true),
            // g: 100 + 10 x (5 x 50), calls 1 + 10 x 5
            ("g", 51, 6, 2600.0, 2600.0, true, true),
        ]
    );
    // Each time's interval is the spread of its windows' parts (zeros included) over the 10 windows, with
    // two more windows spent wholly in it (100 ticks each), times the scale: f and g are each in 5 of them
    // (100 and 50 ticks); main's inclusive is in all alike (100), its exclusive in the 5 others (50).
    let half_width = |x: f64, seen: f64| {
        let (n, mean) = (10.0, x * seen / 10.0);
        let var = (seen * x * x - n * mean * mean) / (n - 1.0);
        1.96 * 10.0 * (n * var + 2.0 * 100.0 * 100.0).sqrt() / 1e3
    };
    let ci: Vec<(&str, f64, f64)> = rows
        .iter()
        .map(|r| (r.function.as_str(), (r.inclusive_ci95_ms * 1e6).round(), (r.exclusive_ci95_ms * 1e6).round()))
        .collect();
    let round = |x: f64| (x * 1e6).round();
    assert_eq!(
        ci,
        [
            ("f", round(half_width(100.0, 5.0)), round(half_width(100.0, 5.0))),
            ("main", round(half_width(100.0, 10.0)), round(half_width(50.0, 5.0))),
            ("g", round(half_width(50.0, 5.0)), round(half_width(50.0, 5.0))),
        ]
    );
    let text = stats::report(&a, Default::default(), false, stats::SortBy::Exclusive, 10).to_string();
    // Each estimate to the digits its interval leaves meaningful.
    assert!(text.contains("        ~5.3      ±4.3 ") && text.contains("        ~2.6      ±3.3 "), "{text}");
    // Every figure is an estimate once part of the run was seen through windows only: f's one call too,
    // and since no window saw a call of f (and this file, of a format before counting, cannot say whether
    // it was called again), its count is a lower bound without an interval.
    assert!(text.contains("~51") && text.contains("       >=1   unknown "), "{text}");
    assert!(
        text.contains(
            "calls recorded completely for the first 1.0 ms (9% of the run), then in 10 windows (1.0 ms, 10.0% of \
             the remaining 10.0 ms) scaled by 10.0: figures marked ~ are estimates, each with its 95% interval (--mode calls counts every call)"
        ),
        "{text}"
    );
}

/// A function whose calls were counted between the windows and that no window saw: its time reads 0, an
/// estimate, and its interval is that of two windows spent wholly in it, as for one a window saw (chance
/// puts no window on a function holding a few percent of a run about one run in eight).
#[test]
fn a_function_that_ran_only_between_windows_has_the_interval_of_two_windows_spent_in_it() {
    use EventKind::*;
    let mut e = windowed_events();
    let end = e.pop().expect("the last event");
    for at in [1500, 2500, 3500] {
        e.push(ev(at, 4, 0, 0, COUNT));
    }
    e.sort_by_key(|x| x.ticks.get());
    e.push(end);
    let (_dir, path) = write_trace(&e, &[], 11_000);
    let a = analyze(&path, Default::default()).unwrap();
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let h = rows.iter().find(|r| r.function == "h").expect("h");
    assert_eq!((h.calls, h.calls_estimated, h.inclusive_ms, h.estimated), (3, false, 0.0, true), "{h:?}");
    // 1.96 x the scale (10) x two windows of 100 ticks, in ms.
    let two_windows = 1.96 * 10.0 * (2.0f64 * 100.0 * 100.0).sqrt() / 1e3;
    assert!((h.inclusive_ci95_ms - two_windows).abs() < 1e-9, "{} {two_windows}", h.inclusive_ci95_ms);
    assert!((h.exclusive_ci95_ms - two_windows).abs() < 1e-9, "{} {two_windows}", h.exclusive_ci95_ms);
}

/// A function few windows saw gets, in its count's interval, two more windows as dense in its calls as the
/// densest stretch of it seen, the complete part included: the one later window that saw `h` caught 2 of its
/// calls at its edge (a sliver, or a thread preempted in it), where the complete part recorded it calling
/// 100 times in 500 ticks, 20 in a window's length. With the later windows alone the interval read +-68
/// for an estimate of 120 (on a real run, 72,126 calls, its interval narrower than that, for 960,000).
#[test]
fn a_count_s_interval_allows_windows_as_dense_as_the_complete_part_was() {
    use EventKind::*;
    const H: u32 = 4;
    let mut e = vec![ev(0, 0, 0, u32::MAX, WINDOW), ev(0, MAIN, 0, 0, PY_START)];
    for k in 0..100u64 {
        e.push(ev(5 * k, H, 0, 0, PY_START));
        e.push(ev(5 * k + 4, H, 2, 0, PY_RETURN));
    }
    e.push(ev(1_000, 0, 0, 0, WINDOW_END));
    for k in 1..=10u64 {
        let at = 1000 * k;
        e.push(ev(at, 0, k as u32, 100, WINDOW));
        e.push(ev(at, MAIN, 2, 0, STACK));
        if k == 1 {
            for s in [1_090, 1_095] {
                e.push(ev(s, H, 0, 0, PY_START));
                e.push(ev(s + 4, H, 2, 0, PY_RETURN));
            }
        }
        // Counted between windows (FORMAT.md 5.8), up to the recorder's limit, the last one saying so.
        if k <= 3 {
            e.push(ev(at + 500, H, 0, u32::from(k == 3), COUNT));
        }
    }
    e.push(ev(11_000, MAIN, 2, 0, JUMP));
    let (_dir, path) = write_trace(&e, &[], 11_000);
    let a = analyze(&path, Default::default()).unwrap();
    assert_eq!(a.windows.as_ref().map(|w| (w.windows, w.scale)), Some((10, 10.0)));
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let h = rows.iter().find(|r| r.function == "h").expect("h");
    // 100 complete + 2 x the scale.
    assert_eq!((h.calls, h.observed_calls, h.calls_estimated), (120, 102, true), "{h:?}");
    // The windows' spread (2 in one of 10: n x var = 4) and two windows of 20 calls, times the scale.
    let want = 1.96 * 10.0 * (4.0f64 + 2.0 * 20.0 * 20.0).sqrt();
    assert!((h.calls_ci95 - want).abs() < 1e-6, "{} {want}", h.calls_ci95);
}

#[test]
fn the_flame_graph_holds_the_same_estimates() {
    let (_dir, path) = windowed();
    let a = analyze(&path, Default::default()).unwrap();
    let mut stacks = a.tree.stacks();
    stacks.sort_by(|x, y| x.0.cmp(&y.0));
    let got: Vec<(Vec<u32>, f64)> = stacks.into_iter().map(|(s, t)| (s, t.round())).collect();
    assert_eq!(got, [(vec![MAIN], 3100.0), (vec![MAIN, F], 5300.0), (vec![MAIN, G], 2600.0)]);
}

#[test]
fn calls_carry_their_window_and_whether_a_window_edge_cut_them() {
    use ocular_analyze::table::{build, Column, Table};
    let (_dir, path) = windowed();
    let mut sink = Collect::default();
    build(&path, Default::default(), &[Table::Calls], 1 << 20, &mut sink).unwrap();
    let b = &sink.0[0].1;
    let col = |name: &str| b.columns.iter().find(|c| c.0 == name).unwrap().1.clone();
    let (Column::OptI32(window), Column::Bool(clipped)) = (col("window"), col("clipped")) else { panic!("types") };
    let rows: Vec<(String, Option<i32>, bool)> =
        texts(b, "function").into_iter().zip(window).zip(clipped).map(|((f, w), c)| (f.unwrap(), w, c)).collect();
    // The first window's calls are whole except main (still running when it closed); every later window
    // has main (and f in odd ones) from its stack, cut at both ends, and whole calls of g in even ones.
    assert_eq!(rows.iter().filter(|r| r.0 == "g" && !r.2).count(), 6);
    assert!(rows.contains(&("f".into(), Some(0), false)));
    assert!(rows.contains(&("main".into(), Some(0), true)));
    assert_eq!(rows.iter().filter(|r| r.0 == "main").count(), 11);
    assert_eq!(rows.iter().filter(|r| r.0 == "f" && r.2).count(), 5);
    assert!(rows.iter().all(|r| r.1.is_some()));
}

#[test]
fn counter_samples_in_later_windows_are_scaled_and_those_between_windows_go_to_no_function() {
    let (_dir, path) = windowed_with(&[
        (200, 1),    // complete part, in f: exact
        (450, 2),    // complete part, in g: exact
        (1_050, 3),  // window 1 (main, f): f
        (2_050, 5),  // window 2, in g (2030..2080)
        (1_500, 70), // between windows 1 and 2: which function ran is not recorded
        (2_500, 90), // between windows 2 and 3
    ]);
    let a = analyze(&path, Default::default()).unwrap();
    let faults = |id: u32| a.counters_of(0, id)[0];
    // Each later window stands for 10 times its length (the trace's scale).
    let scale = a.windows.as_ref().unwrap().scale;
    assert!((scale - 10.0).abs() < 1e-9, "{scale}");
    assert_eq!((faults(F), faults(G), faults(MAIN)), (1 + 30, 2 + 50, 0));
    assert_eq!(a.counter_between_windows, vec![160]);
    let text = stats::report(&a, Default::default(), false, stats::SortBy::Exclusive, 10).to_string();
    assert!(text.contains("~31  f  windows.py:20"), "{text}");
    assert!(text.contains("counters: the samples taken between windows (page-faults 160)"), "{text}");
}

/// Between windows a caller's events (a frame the window's stack leaves out, as the frame that started
/// the recording) push it above the stale top. The next window's stack confirms `main, f`: the window's
/// time is `f`'s, whether the first event after the stack comes after the window or the window opened at
/// a frame's start (its lead then runs in the confirmed callers).
#[test]
fn a_window_s_time_goes_to_its_stack_not_to_frames_left_from_before_it() {
    use EventKind::*;
    for at_resume in [false, true] {
        let (f_off, lead) = if at_resume { (0, 30) } else { (2, 0) };
        let mut open = ev(2_000, 0, 1, 100, WINDOW);
        open.code.set(lead);
        let e = vec![
            ev(0, 0, 0, u32::MAX, WINDOW),
            ev(0, MAIN, 0, 0, PY_START),
            ev(100, F, 0, 0, PY_START),
            ev(1_000, 0, 0, 0, WINDOW_END),
            ev(1_500, G, 2, 0, JUMP), // between windows: pushed above f
            open,
            ev(2_000, MAIN, 2, 0, STACK),
            ev(2_000, F, f_off, 1, STACK),
            ev(2_500, F, 2, 0, JUMP), // after the window
            ev(3_000, MAIN, 2, 0, JUMP),
        ];
        let (_dir, path) = write_trace(&e, &[(2_050, 4)], 3_000);
        let a = analyze(&path, Default::default()).unwrap();
        let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
        let excl = |name: &str| rows.iter().find(|r| r.function == name).map_or(0.0, |r| r.exclusive_ms);
        assert_eq!(excl("g"), 0.0, "at_resume {at_resume}: {rows:?}");
        // f: the complete part (900 us) and the window, scaled by the 2000 us it stands for. A window counts
        // 100 us from when it was due: with a lead of 30 us, those went to main and f has 70.
        let window = if at_resume { 0.07 } else { 0.1 };
        let scale = a.windows.as_ref().unwrap().scale;
        assert!((excl("f") - (0.9 + window * scale)).abs() < 1e-9, "at_resume {at_resume}: {rows:?} scale {scale}");
        // The sample in the window is f's too.
        assert_eq!(a.counters_of(0, F)[0], (4.0 * scale).round() as u64, "at_resume {at_resume}");
    }
}

/// A window stands for its length of the program wherever it fell. Two later windows of 100 ticks: in
/// the first `f` runs and records nothing; in the second `g` calls `h` twice, 4 events at 10 ticks of
/// recorder cost each, so the program ran 60 of its 100 ticks. Each window holds 100 ticks of the program
/// as it runs unrecorded, so `f` and `g` + `h` get the same time, and `h`'s 2 calls stand for 2 x 100/60
/// per window length. (One factor for all windows gave `f` 100/60 times what `g` and `h` got.)
#[test]
fn each_window_is_weighed_by_the_part_of_it_the_program_ran() {
    use EventKind::*;
    const H: u32 = 4;
    let e = vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(1_000, 0, 0, 0, WINDOW_END),
        ev(2_000, 0, 1, 100, WINDOW),
        ev(2_000, MAIN, 2, 0, STACK),
        ev(2_000, F, 2, 1, STACK),
        ev(3_000, 0, 2, 100, WINDOW),
        ev(3_000, MAIN, 2, 0, STACK),
        ev(3_000, G, 2, 1, STACK),
        ev(3_010, H, 0, 0, PY_START),
        ev(3_020, H, 2, 0, PY_RETURN),
        ev(3_030, H, 0, 0, PY_START),
        ev(3_040, H, 2, 0, PY_RETURN),
        ev(3_500, MAIN, 2, 0, JUMP),
        ev(4_000, MAIN, 2, 0, JUMP),
    ];
    let (_dir, path) = write_trace_costing(&e, &[], 4_000, 10.0);
    let a = analyze(&path, Default::default()).unwrap();
    let w = a.windows.as_ref().unwrap();
    // 3000 ticks after the first window, seen through 200.
    assert_eq!((w.sampled_ticks, w.window_ticks, w.scale), (3_000, 200, 15.0));
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let row = |name: &str| rows.iter().find(|r| r.function == name).unwrap_or_else(|| panic!("{name}: {rows:?}"));
    let f = row("f").exclusive_ms;
    let gh = row("g").exclusive_ms + row("h").exclusive_ms;
    assert!((f - 100.0 * 15.0 / 1e3).abs() < 1e-9, "{rows:?}");
    assert!((gh - f).abs() < 1e-9, "{rows:?}");
    assert_eq!(row("h").calls, (2.0 * 100.0 / 60.0 * 15.0_f64).round() as u64);
    assert_eq!(row("h").observed_calls, 2);
}

/// A missed window (FORMAT.md 5.7) stands for its whole length in the stack read at its due moment, even
/// when its markers come after later events of the thread: a thread that ends writes the windows still
/// waiting to open just before its last return, after the jumps and counted calls it made since they fell
/// due. Counting them from the thread's last event gave them nothing (a worker thread whose last stretch
/// was a `json.dumps` waiting for the GIL lost 15-75% of its time).
#[test]
fn a_missed_window_written_after_later_events_still_stands_for_its_length() {
    use ocular_format::event::due::MISSED;
    use EventKind::*;
    let missed = |t: u64, lead: u32, seq: u32| {
        vec![
            ev(t, lead, seq, 100, WINDOW),
            ev(t, 0, MISSED, 2, DUE),
            ev(t, MAIN, 0, 0, DUE_STACK),
            ev(t, F, 0, 1, DUE_STACK),
            ev(t, 0, seq, 0, WINDOW_END),
        ]
    };
    let mut e = vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(1000, 0, 0, 0, WINDOW_END),
        // Outside windows: main jumps on, well after both windows below fell due (2000 and 3000).
        ev(4900, MAIN, 2, 0, JUMP),
    ];
    e.extend(missed(5000, 3000, 1));
    e.extend(missed(5000, 2000, 2));
    let (_dir, path) = write_trace(&e, &[], 5000);
    let a = analyze(&path, Default::default()).unwrap();
    let w = a.windows.as_ref().expect("windows");
    assert_eq!((w.windows, w.window_ticks, w.sampled_ticks), (2, 200, 4000));
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let f = rows.iter().find(|r| r.function == "f").expect("f, in both windows' stacks");
    // Two windows of 100 ticks (1 us each), each standing for 20 times its length.
    assert!((f.inclusive_ms - 4.0).abs() < 1e-6, "{f:?}");
}

/// The first window (main starts, 1000 ticks), then `g`'s start counted outside windows (FORMAT.md 5.8:
/// the recorder counts starts, so a function's calls can be exact).
fn first_window_and_a_count() -> Vec<RawEvent> {
    use EventKind::*;
    vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(1000, 0, 0, 0, WINDOW_END),
        ev(1500, G, 0, 0, COUNT),
    ]
}

/// A later window `seq` of 100 us opening at `at`, `lead` us after it fell due, calls counted from then:
/// main's stack at the due moment, and at the opening main with `top` (code, offset) above it.
fn opening(at: u64, lead: u32, seq: u32, (code, offset): (u32, u32)) -> Vec<RawEvent> {
    use ocular_format::event::due::CALLS_FROM_DUE;
    use EventKind::*;
    vec![
        ev(at, lead, seq, 100, WINDOW),
        ev(at, 0, CALLS_FROM_DUE, 1, DUE),
        ev(at, MAIN, 0, 0, DUE_STACK),
        ev(at, MAIN, 2, 0, STACK),
        ev(at, code, offset, 1, STACK),
    ]
}

/// CPython's INSTRUMENTED_RESUME runs signal handlers (a window's opening) before it fires PY_START: a window
/// whose stack ends in a frame at its first instruction can be followed by that frame's PY_START, which is
/// the same call, not a second one (a function called 24 times read 25). Without the PY_START (a plain
/// RESUME, the function's PY_START switched off outside windows), the opening's stack alone counts it.
#[test]
fn a_call_a_window_found_at_its_first_instruction_is_counted_once_whether_its_py_start_follows_or_not() {
    use EventKind::*;
    for py_start in [false, true] {
        let mut e = vec![ev(0, 0, 0, u32::MAX, WINDOW), ev(0, MAIN, 0, 0, PY_START), ev(1000, 0, 0, 0, WINDOW_END)];
        e.extend(opening(2000, 0, 1, (F, 0)));
        if py_start {
            e.push(ev(2010, F, 0, 0, PY_START));
        }
        e.push(ev(2050, F, 2, 0, PY_RETURN));
        e.push(ev(3000, MAIN, 2, 0, JUMP));
        let (_dir, path) = write_trace(&e, &[], 3000);
        let a = analyze(&path, Default::default()).unwrap();
        let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
        let f = rows.iter().find(|r| r.function == "f").expect("f");
        assert_eq!(f.observed_calls, 1, "PY_START after the stack: {py_start}; {f:?}");
    }
}

/// CPython 3.12's INSTRUMENTED_RESUME fires PY_START before it runs signal handlers: a window's opening then
/// finds at its first instruction a frame whose start (here counted outside windows) was the thread's
/// last event. That call is counted once (c_hash, called 48 times, read 49), also when the thread was
/// preempted between the start and the opening, the start before the window fell due (waiter, 24 calls,
/// read 25 beside two busy loops): while a function's calls are still counted, every other start of it
/// would have been recorded.
#[test]
fn a_call_started_just_before_the_window_found_it_at_its_first_instruction_is_counted_once() {
    use EventKind::*;
    // f's COUNT at `count_at`, with its `arg` (1: f's last counted call; None: no COUNT); the window fell
    // due at 1950 (50 us before its opening at 2000).
    let calls = |count_at: Option<(u64, u32)>| {
        let mut e = first_window_and_a_count();
        if let Some((at, last)) = count_at {
            e.push(ev(at, F, 0, last, COUNT));
        }
        e.extend(opening(2000, 50, 1, (F, 0)));
        e.extend([ev(2050, F, 2, 0, PY_RETURN), ev(3000, MAIN, 2, 0, JUMP)]);
        let (_dir, path) = write_trace(&e, &[], 3000);
        let a = analyze(&path, Default::default()).unwrap();
        let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
        let f = rows.iter().find(|r| r.function == "f").expect("f");
        (f.calls, f.observed_calls)
    };
    // Counted after the window fell due, or by the opening's stack: one call either way.
    let (before, at_opening) = (calls(Some((1990, 0))), calls(None));
    assert_eq!(before.0, at_opening.0, "counted first: {before:?}; by the stack: {at_opening:?}");
    // Counted before it fell due, f's calls still counted: any later start of f would have a COUNT, so the
    // frame at its first instruction is that call (the thread was preempted before its RESUME's check).
    let preempted = calls(Some((1200, 0)));
    assert_eq!(preempted.0, at_opening.0, "preempted: {preempted:?}; by the stack: {at_opening:?}");
    // Its last counted call before it fell due: later starts go unrecorded, so the frame may be another
    // call, and the stack's is counted too.
    // The window counts it as a call of its own (observed), as it does not when that last counted start
    // came after the window fell due.
    let (earlier, last_after_due) = (calls(Some((1200, 1))), calls(Some((1990, 1))));
    assert_eq!((earlier.1, last_after_due.1), (1, 0), "an earlier call: {earlier:?}; after: {last_after_due:?}");
}

/// A thread that gave up the GIL at a function's RESUME, before its PY_START fired, waits there while
/// another thread runs (a `json.dumps` that holds the GIL for tens of milliseconds). A window that thread
/// opens finds the waiting frame at its first instruction and counts the call; the window can end, and
/// more can open and find it there again, before the thread runs and its start is recorded: outside a
/// window as a COUNT, inside one as a PY_START. One call each way (a function called 12 times read 13).
#[test]
fn a_call_found_waiting_at_its_first_instruction_is_counted_once_however_late_its_start_comes() {
    use EventKind::*;
    // Later openings (tick, sequence) that find f waiting again, then the events that follow.
    let again = |openings: &[(u64, u32)], then: &[RawEvent]| {
        let mut e: Vec<RawEvent> = openings.iter().flat_map(|&(at, seq)| opening(at, 0, seq, (F, 0))).collect();
        e.extend_from_slice(then);
        e
    };
    // (what follows the window at 2000, f's calls).
    let cases = [
        ("its start after the window", again(&[], &[ev(3000, F, 0, 0, COUNT)]), 1),
        (
            "found again, started in that window",
            again(&[(3000, 2)], &[ev(3010, F, 0, 0, PY_START), ev(3050, F, 2, 0, PY_RETURN)]),
            1,
        ),
        ("found again, started after it", again(&[(3000, 2)], &[ev(3500, F, 0, 0, COUNT)]), 1),
        ("found again twice, started after", again(&[(3000, 2), (4000, 3)], &[ev(4500, F, 0, 0, COUNT)]), 1),
        // The thread ran on (main's jump: f returned unrecorded), then called f again.
        ("ran on, then another call", again(&[], &[ev(2500, MAIN, 2, 0, JUMP), ev(3000, F, 0, 0, COUNT)]), 2),
    ];
    for (what, after, want) in cases {
        let mut e = first_window_and_a_count();
        e.extend(opening(2000, 0, 1, (F, 0)));
        e.extend(after);
        e.push(ev(5000, MAIN, 2, 0, JUMP));
        let (_dir, path) = write_trace(&e, &[], 5000);
        let a = analyze(&path, Default::default()).unwrap();
        let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
        let f = rows.iter().find(|r| r.function == "f").expect("f");
        assert_eq!((f.calls, f.calls_estimated), (want, false), "{what}: {f:?}");
    }
}

/// A generator suspended at its yield goes on at the RESUME after it, which (3.13 on) runs signal handlers
/// before it fires PY_RESUME: a window opened there finds the generator at a RESUME that is no call's start.
/// Its calls are its starts (a generator called 16 times read 19, exact), and the PY_RESUME that follows in
/// the window is the activation the stack found, not another above it.
#[test]
fn a_generator_a_window_found_where_it_resumes_is_not_a_call() {
    use EventKind::*;
    let mut e = first_window_and_a_count();
    e.splice(2..2, [ev(100, GEN, 0, 0, PY_START), ev(110, GEN, 2, 0, PY_YIELD)]);
    // main resumes the generator: the opening finds it at the RESUME after its yield.
    e.extend(opening(2000, 0, 1, (GEN, 2)));
    e.extend([
        ev(2010, GEN, 2, 0, PY_RESUME),
        ev(2040, GEN, 2, 0, PY_YIELD),
        ev(2090, MAIN, 2, 0, JUMP),
        ev(3000, MAIN, 2, 0, JUMP),
    ]);
    let (_dir, path) = write_trace(&e, &[], 3000);
    let a = analyze(&path, Default::default()).unwrap();
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let row = |name: &str| rows.iter().find(|r| r.function == name).unwrap_or_else(|| panic!("{name}: {rows:?}"));
    let gen = row("gen");
    assert_eq!((gen.calls, gen.calls_estimated), (1, false), "{gen:?}");
    // In the window: the generator ran from the opening to its yield (40 us), main the other 60; the
    // window stands for 20 times its length (2000 after the first window, through 100).
    assert!((gen.inclusive_ms - 0.01 - 0.040 * 20.0).abs() < 1e-9, "{gen:?}");
    assert!((row("main").exclusive_ms - 0.99 - 0.060 * 20.0).abs() < 1e-9, "{:?}", row("main"));
}

/// Inside a window every call and return is recorded, so a location of a frame below the top says the
/// frames above it returned, their returns lost (a generator exhausted inside a C call read its caller's
/// loop as its own: a loop run 300 times read 292): every view ends them there, stats as the timeline does.
#[test]
fn a_location_of_a_frame_below_the_top_ends_the_frames_above_it() {
    use EventKind::*;
    let e = vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(100, F, 0, 0, PY_START),
        // F's return is not recorded; main runs on.
        ev(200, MAIN, 2, 0, JUMP),
        ev(1000, MAIN, 2, 0, PY_RETURN),
        ev(1000, 0, 0, 0, WINDOW_END),
    ];
    let (_dir, path) = write_trace(&e, &[], 1000);
    let a = analyze(&path, Default::default()).unwrap();
    let rows = stats::rows(&a, false, stats::SortBy::Exclusive);
    let row = |name: &str| rows.iter().find(|r| r.function == name).unwrap_or_else(|| panic!("{name}: {rows:?}"));
    assert!((row("f").inclusive_ms - 0.1).abs() < 1e-9, "{:?}", row("f"));
    assert!((row("main").exclusive_ms - 0.9).abs() < 1e-9, "{:?}", row("main"));
    assert!((row("main").inclusive_ms - 1.0).abs() < 1e-9, "{:?}", row("main"));
}
