//! Counter samples (FORMAT.md 6.9) placed by construction: one frame of `f` runs a loop of 10 iterations
//! of 100 ticks (1 tick = 1 ns, the samples' clock) between ticks 1,000 and 2,100; samples fall before
//! it, in the loop, after the loop in the frame, and after the frame.

use crate::export::{texts, Collect};
use ocular_analyze::analysis::analyze;
use ocular_analyze::hot;
use ocular_analyze::table::{build, Column, Table};
use ocular_format::{
    testing, CodeObject, CounterInfo, CounterSample, CounterSamples, EventKind, Position, RawEvent, Trailer, Writer,
};

fn trace() -> (tempfile::TempDir, std::path::PathBuf) {
    let mut header = testing::header();
    header.ticks_per_second = 1e9;
    header.start_ticks = 0;
    header.start_monotonic_ns = 0;
    header.event_cost_ticks = 0.0;
    let mut evs = vec![RawEvent::new(1_000, 1, 0, 0, EventKind::PY_START as u8)];
    let mut t = 1_000;
    for _ in 0..10 {
        t += 100;
        evs.push(RawEvent::new(t, 1, 8, 2, EventKind::JUMP as u8));
    }
    // The loop ends (a jump out of it, to the POP_TOP after it), then the frame returns.
    evs.push(RawEvent::new(2_050, 1, 2, 10, EventKind::BRANCH as u8));
    evs.push(RawEvent::new(2_100, 1, 12, 0, EventKind::PY_RETURN as u8));
    // RESUME, FOR_ITER (+1 cache), POP_TOP, JUMP_BACKWARD, POP_TOP, RETURN_VALUE
    let bytecode = vec![151, 0, 93, 4, 0, 0, 1, 0, 140, 3, 1, 0, 83, 0];
    let code = CodeObject {
        id: 1,
        name: "f".into(),
        qualname: "f".into(),
        filename: "counters.py".into(),
        first_line: 1,
        flags: 0,
        linetable: Vec::new(),
        positions: vec![Position { line: 3, end_line: 3, column: 0, end_column: 1 }; bytecode.len() / 2],
        bytecode,
    };
    let sample = |ns: u64, counter: u8, period: u64| CounterSample { thread_id: 7, counter, monotonic_ns: ns, period };
    let info =
        |name: &str, unit: &str| CounterInfo { name: name.into(), unit: unit.into(), period: 1, error: "".into() };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counters.ocl");
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &name, &header, Default::default()).unwrap();
    w.code_objects(&[code]).unwrap();
    // Before the events, as the recorder's drain thread writes them.
    w.counters(&CounterSamples {
        counters: vec![info("page-faults", "faults"), info("task-clock", "ns")],
        samples: vec![
            sample(500, 0, 1),       // before f: no function
            sample(1_150, 0, 3),     // in the loop
            sample(1_550, 1, 1_000), // in the loop
            sample(2_080, 0, 5),     // in f, after its loop ended
            sample(3_000, 0, 7),     // after f returned
        ],
        lost: vec![],
    })
    .unwrap();
    w.events(7, &evs).unwrap();
    let n = evs.len() as u64;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 2_100, events: n, lost: 0, chunks: 3 }).unwrap();
    (dir, path)
}

#[test]
fn a_loop_has_the_samples_taken_while_it_ran() {
    let (_dir, path) = trace();
    let a = analyze(&path, Default::default()).unwrap();
    assert_eq!(a.counters_of(0, 1), vec![3 + 5, 1_000], "f itself: every sample while it ran");
    let r = hot::report(&a, 5);
    let l = &r.loops[0];
    assert_eq!(l.iterations, 10);
    let c: Vec<(&str, u64, f64)> = l.counters.iter().map(|c| (c.name.as_str(), c.total, c.per_iteration)).collect();
    assert_eq!(c, vec![("page-faults", 3, 0.3), ("task-clock", 1_000, 100.0)]);
    assert!(format!("{r}").contains("counters (sampled): page-faults 3 (0.300/iteration, 3 samples), task-clock 0.001 ms (100.0 ns/iteration, 1000 samples)"), "{r}");
}

#[test]
fn the_counter_samples_table_names_the_call_running_at_each_sample() {
    let (_dir, path) = trace();
    let mut sink = Collect::default();
    let s = build(&path, Default::default(), &[Table::CounterSamples, Table::Calls], 2, &mut sink).unwrap();
    assert_eq!((s.rows["counter_samples"], s.rows["calls"]), (5, 1));
    let (mut function, mut counter) = (vec![], vec![]);
    let (mut value, mut call): (Vec<u64>, Vec<Option<u64>>) = (vec![], vec![]);
    for (t, b) in &sink.0 {
        if *t != Table::CounterSamples {
            continue;
        }
        function.extend(texts(b, "function"));
        counter.extend(texts(b, "counter"));
        for (name, col) in &b.columns {
            match (*name, col) {
                ("value", Column::U64(v)) => value.extend(v),
                ("call_id", Column::OptU64(v)) => call.extend(v),
                _ => {}
            }
        }
    }
    let f = Some("f".to_string());
    assert_eq!(function, vec![None, f.clone(), f.clone(), f, None]);
    assert_eq!(call, vec![None, Some(0), Some(0), Some(0), None]);
    assert_eq!(value, vec![1, 3, 1_000, 5, 7]);
    let pf = Some("page-faults".to_string());
    assert_eq!(counter, vec![pf.clone(), pf.clone(), Some("task-clock".into()), pf.clone(), pf]);
}
