//! `hot` and `stats` on recordings of testdata/workloads/loops.py, whose loops and calls are known:
//! `count` loops 1000 times, `nested` 10 x 50, `calls` calls `g` 300 times.

use crate::testdata;
use ocular_analyze::analysis::analyze;
use ocular_analyze::{hot, stats};

fn loops(fixture: &str) -> Vec<(String, u64, usize, bool)> {
    let a = analyze(&testdata(fixture), Default::default()).unwrap();
    let r = hot::report(&a, 10);
    let mut v: Vec<_> = r
        .loops
        .iter()
        .map(|l| {
            let measured = l.instructions.iter().filter(|i| i.ticks.is_some()).count();
            (l.function.clone(), l.iterations, measured, l.ns_per_iteration.is_some_and(|ns| ns > 0.0))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn adaptive_finds_every_loop_with_its_iteration_count() {
    let got: Vec<(String, u64)> = loops("v1.0/loops-adaptive.ocl")
        .into_iter()
        .map(|(f, n, _, t)| {
            assert!(t, "{f}: no time per iteration");
            (f, n)
        })
        .collect();
    assert_eq!(got, [("calls".into(), 300), ("count".into(), 1000), ("nested".into(), 10), ("nested".into(), 500)]);
}

#[test]
fn precise_finds_the_same_loops_and_measures_each_instruction() {
    let got = loops("v1.0/loops-precise.ocl");
    let counts: Vec<(String, u64)> = got.iter().map(|(f, n, _, _)| (f.clone(), *n)).collect();
    assert_eq!(counts, [("calls".into(), 300), ("count".into(), 1000), ("nested".into(), 10), ("nested".into(), 500)]);
    let a = analyze(&testdata("v1.0/loops-precise.ocl"), Default::default()).unwrap();
    let r = hot::report(&a, 10);
    assert_eq!(r.mode, "precise");
    assert!(r.cost_kind.starts_with("measured per instruction"));
    let count = r.loops.iter().find(|l| l.function == "count").unwrap();
    let names: Vec<&str> = count.instructions.iter().map(|i| i.base.as_str()).collect();
    assert_eq!(names, ["FOR_ITER", "STORE_FAST", "LOAD_FAST", "LOAD_FAST", "BINARY_OP", "STORE_FAST", "JUMP_BACKWARD"]);
    assert!(count.instructions.iter().all(|i| i.ticks.is_some_and(|t| t > 0.0)), "{:?}", count.instructions);
    assert_eq!((count.first_line, count.last_line), (12, 13));
}

#[test]
fn stats_count_calls_and_keep_inclusive_above_exclusive() {
    let a = analyze(&testdata("v1.0/loops-adaptive.ocl"), Default::default()).unwrap();
    let rows = stats::rows(&a, false, stats::SortBy::Calls);
    let calls: Vec<(&str, u64)> = rows.iter().map(|r| (r.function.as_str(), r.calls)).collect();
    assert_eq!(calls, [("g", 300), ("calls", 1), ("count", 1), ("main", 1), ("nested", 1)]);
    for r in &rows {
        assert!(r.inclusive_ms + 1e-9 >= r.exclusive_ms, "{r:?}");
    }
    let main = rows.iter().find(|r| r.function == "main").unwrap();
    let children: f64 = rows
        .iter()
        .filter(|r| ["count", "nested", "calls"].contains(&r.function.as_str()))
        .map(|r| r.inclusive_ms)
        .sum();
    assert!(main.inclusive_ms >= children, "main {} < children {children}", main.inclusive_ms);
}

#[test]
fn hot_json_has_the_promised_fields() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ocular-analyze"))
        .args(["hot", "--json", "--top", "1", testdata("v1.0/loops-adaptive.ocl").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &v["loops"][0];
    for key in ["function", "file", "first_line", "iterations", "ns_per_iteration", "instructions"] {
        assert!(!l[key].is_null(), "missing {key}: {l}");
    }
    assert_eq!(l["function"], "count");
    assert_eq!(l["iterations"], 1000);
    assert!(l["instructions"][0]["base"].is_string());
    assert!(v["correction"].as_str().unwrap().contains("ns per event"));
}

/// A synthetic trace of one frame running a loop (FOR_ITER at 2, body, JUMP_BACKWARD at 8 -> 2): the first
/// iterations carry a BRANCH each and take `slow` ticks, the later ones only their backward jump and take
/// `fast` ticks, as when the threshold has switched the loop's branch off and kept its backward jump.
fn quiet_trace(slow_iterations: u64, fast_iterations: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    use ocular_format::{testing, EventKind, RawEvent};
    let mut header = testing::header();
    header.event_cost_ticks = 0.0;
    let (slow, fast) = (900u64, 300u64);
    let mut t = 10_000u64;
    let mut evs = vec![RawEvent::new(t, 1, 0, 0, EventKind::PY_START as u8)];
    for _ in 0..slow_iterations {
        evs.push(RawEvent::new(t + slow / 2, 1, 2, 4, EventKind::BRANCH as u8));
        t += slow;
        evs.push(RawEvent::new(t, 1, 8, 2, EventKind::JUMP as u8));
    }
    for _ in 0..fast_iterations {
        t += fast;
        evs.push(RawEvent::new(t, 1, 8, 2, EventKind::JUMP as u8));
    }
    evs.push(RawEvent::new(t + 50, 1, 12, 0, EventKind::PY_RETURN as u8));
    // RESUME, FOR_ITER (+1 cache), POP_TOP, JUMP_BACKWARD, POP_TOP, RETURN_VALUE
    let bytecode = vec![151, 0, 93, 4, 0, 0, 1, 0, 140, 3, 1, 0, 83, 0];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quiet.ocl");
    crate::synthetic_trace(&path, &header, bytecode, 3, &evs);
    (dir, path)
}

#[test]
fn hot_times_a_loop_by_its_quiet_iterations_when_it_has_enough() {
    let (_dir, path) = quiet_trace(20, 40);
    let a = analyze(&path, Default::default()).unwrap();
    let r = hot::report(&a, 5);
    let l = &r.loops[0];
    assert_eq!((l.iterations, l.quiet_iterations, l.timing.as_str()), (60, 40, "quiet"));
    assert_eq!(l.ticks_per_iteration, 300.0);
    assert!(format!("{r}").contains("(300 ticks, from 40 quiet iterations)"), "{r}");
    // Too few quiet ones: the instrumented iterations are averaged, and the report says which.
    let (_dir, path) = quiet_trace(20, 5);
    let a = analyze(&path, Default::default()).unwrap();
    let l = &hot::report(&a, 5).loops[0];
    assert_eq!((l.quiet_iterations, l.timing.as_str()), (5, "instrumented"));
    assert_eq!(l.ticks_per_iteration, (19.0 * 900.0 + 5.0 * 300.0) / 24.0);
}
