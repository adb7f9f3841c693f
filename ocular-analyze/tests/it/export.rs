//! The Chrome Trace Event export obeys the format's rules: B/E balanced and properly nested per thread,
//! timestamps non-decreasing per thread, one "loop" instant per recorded iteration.

use crate::testdata;
use std::collections::HashMap;

fn export(fixture: &str) -> serde_json::Value {
    let mut out = Vec::new();
    ocular_analyze::export::chrome::export(&testdata(fixture), Default::default(), &mut out).unwrap();
    serde_json::from_slice(&out).expect("valid JSON")
}

fn check_rules(v: &serde_json::Value) -> HashMap<u64, usize> {
    let mut stacks: HashMap<u64, Vec<String>> = HashMap::new();
    let mut last: HashMap<u64, f64> = HashMap::new();
    let mut slices: HashMap<u64, usize> = HashMap::new();
    for e in v["traceEvents"].as_array().unwrap() {
        let ph = e["ph"].as_str().unwrap();
        if ph == "M" {
            continue;
        }
        let tid = e["tid"].as_u64().unwrap();
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts >= *last.get(&tid).unwrap_or(&f64::MIN), "ts went backwards on {tid}: {e}");
        last.insert(tid, ts);
        let name = e["name"].as_str().unwrap().to_string();
        match ph {
            "B" => stacks.entry(tid).or_default().push(name),
            "E" => {
                let top = stacks.get_mut(&tid).and_then(|s| s.pop());
                assert_eq!(top.as_deref(), Some(name.as_str()), "E without matching B on {tid}");
                *slices.entry(tid).or_default() += 1;
            }
            "i" => assert_eq!(name, "loop"),
            "X" => assert_eq!(name, "events lost"),
            other => panic!("unexpected phase {other}"),
        }
    }
    for (tid, s) in stacks {
        assert!(s.is_empty(), "thread {tid} left {s:?} open");
    }
    slices
}

#[test]
fn loops_fixture_exports_balanced_slices_and_one_instant_per_iteration() {
    let v = export("v1.0/loops-adaptive.ocl");
    let slices = check_rules(&v);
    assert_eq!(slices.values().sum::<usize>(), 304, "main, count, nested, calls and 300 calls of g");
    let evs = v["traceEvents"].as_array().unwrap();
    let mut per_fn: HashMap<&str, usize> = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "i") {
        *per_fn.entry(e["args"]["function"].as_str().unwrap()).or_default() += 1;
        assert!(e["args"]["uops"].as_u64().unwrap() > 0);
    }
    assert_eq!(per_fn, HashMap::from([("count", 1000), ("nested", 510), ("calls", 300)]));
    let names: Vec<&str> =
        evs.iter().filter(|e| e["name"] == "thread_name").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["MainThread"]);
}

#[test]
fn two_threads_keep_their_ids_and_names() {
    let v = export("v1.0/synthetic.ocl");
    let slices = check_rules(&v);
    assert_eq!(slices, HashMap::from([(1001, 2), (1002, 1)]));
    let evs = v["traceEvents"].as_array().unwrap();
    let names: HashMap<u64, &str> = evs
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(names, HashMap::from([(1001, "MainThread"), (1002, "worker-1")]));
    assert!(evs.iter().all(|e| e["pid"] == 4242));
}

#[test]
fn the_cli_writes_beside_the_input_picks_pftrace_by_extension_and_refuses_unknown_formats() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("run.ocl");
    std::fs::copy(testdata("v1.0/synthetic.ocl"), &input).unwrap();
    let bin = env!("CARGO_BIN_EXE_ocular-analyze");
    let out = std::process::Command::new(bin).args(["export", "--perfetto", input.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("run.json").exists());
    let pf = dir.path().join("x.pftrace");
    let out = std::process::Command::new(bin)
        .args(["export", "--perfetto", "-o", pf.to_str().unwrap(), input.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A Trace is `repeated TracePacket packet = 1`: the file starts with that field's tag.
    assert_eq!(std::fs::read(&pf).unwrap()[0], 0x0a);
    let out = std::process::Command::new(bin)
        .args(["export", "--perfetto", "--format", "svg", input.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown --format \"svg\": use json or pftrace"));
}

#[test]
fn flame_graph_stacks_sum_to_the_exclusive_times_of_stats() {
    let path = testdata("v1.0/loops-adaptive.ocl");
    let (lines, _) = ocular_analyze::export::flame::folded(&path, Default::default()).unwrap();
    let stacks: Vec<&str> = lines.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(stacks, ["main", "main;calls", "main;calls;g", "main;count", "main;nested"]);
    let a = ocular_analyze::analysis::analyze(&path, Default::default()).unwrap();
    let rows = ocular_analyze::stats::rows(&a, false, ocular_analyze::stats::SortBy::Exclusive);
    for r in &rows {
        let folded_ns: u64 =
            lines.iter().filter(|(s, _)| s.rsplit(';').next() == Some(r.function.as_str())).map(|(_, v)| v).sum();
        let stats_ns = r.exclusive_ms * 1e6;
        assert!(
            (folded_ns as f64 - stats_ns).abs() <= 1.0 + stats_ns * 1e-6,
            "{}: {folded_ns} vs {stats_ns}",
            r.function
        );
    }
    let mut svg = Vec::new();
    ocular_analyze::export::flame::svg(&path, Default::default(), "loops", &mut svg).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("<svg"));
    for f in ["main", "count", "nested", "calls"] {
        assert!(svg.contains(&format!(">{f}<")) || svg.contains(&format!("{f} (")), "{f} missing from the SVG");
    }
}

/// Collects batches as (table, rows, columns).
#[derive(Default)]
pub(crate) struct Collect(pub(crate) Vec<(ocular_analyze::table::Table, ocular_analyze::table::Batch)>);

impl ocular_analyze::table::Sink for Collect {
    fn batch(&mut self, t: ocular_analyze::table::Table, b: ocular_analyze::table::Batch) -> anyhow::Result<()> {
        assert!(b.columns.iter().all(|(_, c)| c.len() == b.rows), "ragged batch");
        self.0.push((t, b));
        Ok(())
    }
}

pub(crate) fn texts(b: &ocular_analyze::table::Batch, name: &str) -> Vec<Option<String>> {
    use ocular_analyze::table::Column;
    match &b.columns.iter().find(|c| c.0 == name).expect("column").1 {
        Column::Dict(codes, dict) => {
            codes.iter().map(|&c| (c != ocular_analyze::table::NULL_CODE).then(|| dict[c as usize].clone())).collect()
        }
        other => panic!("{name} is not text: {other:?}"),
    }
}

fn u32s(b: &ocular_analyze::table::Batch, name: &str) -> Vec<u32> {
    match &b.columns.iter().find(|c| c.0 == name).expect("column").1 {
        ocular_analyze::table::Column::U32(v) => v.clone(),
        other => panic!("{name} is not u32: {other:?}"),
    }
}

#[test]
fn tables_have_a_row_per_event_and_per_call_in_batches_of_any_size() {
    use ocular_analyze::table::{build, Table};
    for batch_rows in [1 << 20, 97] {
        let mut sink = Collect::default();
        let all = [Table::Code, Table::Events, Table::Calls];
        let s = build(&testdata("v1.0/loops-adaptive.ocl"), Default::default(), &all, batch_rows, &mut sink).unwrap();
        assert_eq!((s.rows["events"], s.rows["calls"], s.rows["code"]), (4241, 304, 5));
        assert_eq!(s.events_read, 4241);
        let (mut back_in_count, mut g_calls) = (0, 0);
        for (t, b) in &sink.0 {
            assert!(b.rows <= batch_rows);
            match t {
                Table::Events => {
                    let (f, e, o, a) = (texts(b, "function"), texts(b, "event"), u32s(b, "offset"), u32s(b, "arg"));
                    for i in 0..b.rows {
                        if f[i].as_deref() == Some("count") && e[i].as_deref() == Some("JUMP") && a[i] < o[i] {
                            back_in_count += 1;
                        }
                    }
                }
                Table::Calls => g_calls += texts(b, "function").iter().filter(|f| f.as_deref() == Some("g")).count(),
                Table::Code => assert_eq!(b.rows, 5),
                Table::Lost => assert_eq!(b.rows, 0, "this recording lost nothing"),
                Table::CounterSamples => assert_eq!(b.rows, 0, "this recording has no counters"),
                Table::Lines | Table::Functions | Table::Coroutines | Table::Tasks | Table::Spans => {
                    unreachable!("not asked for")
                }
            }
        }
        assert_eq!((back_in_count, g_calls), (1000, 300), "batch_rows {batch_rows}");
    }
}

#[test]
fn tables_of_a_truncated_file_stop_at_the_last_whole_chunk_with_a_warning() {
    use ocular_analyze::table::{build, Table};
    let bytes = std::fs::read(testdata("v1.0/loops-adaptive.ocl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.ocl");
    // Inside the trailer: every event chunk is whole.
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let mut sink = Collect::default();
    let s = build(&cut, Default::default(), &[Table::Events], 1 << 20, &mut sink).unwrap();
    assert_eq!(s.rows["events"], 4241);
    assert!(s.warnings.iter().any(|w| w.contains("incomplete chunk")), "{:?}", s.warnings);
}

#[test]
fn event_column_names_every_kind_in_kind_order_and_leaves_the_unknown_null() {
    use ocular_analyze::table::{build, Column, Table};
    use ocular_format::{testing, EventKind, RawEvent};
    // RESUME, POP_TOP, RETURN_VALUE; one event of a kind no version defines, one at an offset past the end.
    let evs = [
        RawEvent::new(100, 1, 0, 0, EventKind::PY_START as u8),
        RawEvent::new(200, 1, 2, 0, 200),
        RawEvent::new(300, 1, 40, 0, EventKind::INSTRUCTION as u8),
        RawEvent::new(400, 1, 4, 0, EventKind::PY_RETURN as u8),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kinds.ocl");
    crate::synthetic_trace(&path, &testing::header(), vec![151, 0, 1, 0, 83, 0], 2, &evs);

    let mut sink = Collect::default();
    build(&path, Default::default(), &[Table::Events], 1 << 20, &mut sink).unwrap();
    let b = &sink.0[0].1;
    let Column::Dict(_, dict) = &b.columns.iter().find(|c| c.0 == "event").unwrap().1 else { panic!("event") };
    let mut kinds = EventKind::ALL.to_vec();
    kinds.sort_by_key(|k| *k as u8);
    assert_eq!(**dict, kinds.iter().map(|k| k.name().to_string()).collect::<Vec<_>>());
    let s = |v: &[&str]| v.iter().map(|x| Some(x.to_string())).collect::<Vec<_>>();
    let mut want = s(&["PY_START", "", "INSTRUCTION", "PY_RETURN"]);
    want[1] = None;
    assert_eq!(texts(b, "event"), want);
    let mut want = s(&["RESUME", "POP_TOP", "", "RETURN_VALUE"]);
    want[2] = None;
    assert_eq!(texts(b, "opcode"), want);
    assert_eq!(texts(b, "function"), s(&["f"; 4]));
}
