//! The binary as a user runs it: output, exit codes and error messages.

use crate::testdata;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ocular-analyze")).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn info_json_counts_the_fixture() {
    let f = testdata("v1.0/synthetic.ocl");
    let out = run(&["info", "--json", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 83);
    assert_eq!(v["events_by_kind"]["BRANCH"], 40);
    assert_eq!(v["events_by_kind"]["JUMP"], 37);
    assert_eq!(v["threads"][1]["name"], "worker-1");
    assert_eq!(v["threads"][1]["events"], 27);
    assert_eq!(v["lost_events"], 3);
    assert_eq!(v["closed_cleanly"], true);
    assert_eq!(v["mode"], "adaptive");
}

#[test]
fn counts_of_a_trace_with_dropped_events_read_as_the_least_there_were() {
    // The fixture's worker thread lost 3 events: a count that would read exact may miss calls.
    let f = testdata("v1.0/synthetic.ocl");
    let out = run(&["stats", "--json", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r["calls_estimated"], false, "{r}");
        assert_eq!(r["calls_lower_bound"], true, "{r}");
        assert!(r["lost_share"].as_f64().unwrap() > 0.0, "{r}");
    }
    let out = run(&["stats", f.to_str().unwrap()]);
    let s = text(&out.stdout);
    assert!(s.contains(" >=2 "), "{s}");
    assert!(
        s.contains("note: the recorder dropped 3 events in 1 thread (its writer fell behind): counts marked >="),
        "{s}"
    );
    // Per thread, only the thread that lost events is marked.
    let out = run(&["stats", "--json", "--per-thread", f.to_str().unwrap()]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let marked: Vec<bool> = rows.iter().map(|r| r["calls_lower_bound"].as_bool().unwrap()).collect();
    assert!(marked.contains(&true) && marked.contains(&false), "{rows:?}");
}

#[test]
fn info_text_says_how_the_file_was_closed() {
    let f = testdata("v1.0/synthetic.ocl");
    let out = run(&["info", f.to_str().unwrap()]);
    let s = text(&out.stdout);
    assert!(s.contains("events        83 in 10 chunks"), "{s}");
    assert!(s.ends_with("closed        cleanly\n"), "{s}");
}

#[test]
fn a_missing_file_is_named_with_exit_code_2() {
    let out = run(&["info", "/nonexistent/run.ocl"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "ocular-analyze: error: /nonexistent/run.ocl: No such file or directory (os error 2)\n"
    );
}

#[test]
fn a_foreign_file_is_refused_by_name() {
    let out = run(&["dump", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("Cargo.toml is not an Ocular trace: bytes at offset 0 are 5b 70 61 63 6b 61 67 65"), "{err}");
}

#[test]
fn a_truncated_file_is_read_up_to_its_last_whole_chunk_with_a_warning() {
    let bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.ocl");
    std::fs::write(&cut, &bytes[..1300]).unwrap();
    let out = run(&["info", "--json", cut.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 0);
    assert_eq!(v["closed_cleanly"], false);
    let err = text(&out.stderr);
    assert!(err.contains("cut.ocl: incomplete chunk at offset 1237 (63 bytes) ignored"), "{err}");
    assert!(err.contains("no trailer: the recording did not close cleanly"), "{err}");
}

#[test]
fn a_corrupt_file_names_the_offset_and_salvage_skips_it() {
    let mut bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    bytes[1237 + 70] ^= 0xff; // inside the first EVENTS chunk's payload
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ocl");
    std::fs::write(&bad, &bytes).unwrap();
    let out = run(&["info", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad.ocl: corrupt chunk at offset 1237: CRC mismatch"), "{}", text(&out.stderr));
    let out = run(&["info", "--json", "--salvage", bad.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 83 - 43);
    assert!(text(&out.stderr).contains("skipped"), "{}", text(&out.stderr));
}

/// A copy of the synthetic fixture in a fresh directory (removed when dropped), whose first EVENTS chunk has
/// a damaged payload under a recomputed CRC: only decoding finds it, so exports fail after they have started
/// writing. Returns the directory and the file.
fn undecodable_events() -> (tempfile::TempDir, std::path::PathBuf) {
    let mut bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    let at = 1237; // the first EVENTS chunk
    assert_eq!(&bytes[at..at + 6], b"OCCH\x02\x00");
    let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    bytes[at + 56..at + 56 + len].fill(0x41);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[at..at + 52]);
    crc.update(&bytes[at + 56..at + 56 + len]);
    bytes[at + 52..at + 56].copy_from_slice(&crc.finalize().to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ocl");
    std::fs::write(&bad, &bytes).unwrap();
    (dir, bad)
}

const UNDECODABLE: &str = "bad.ocl: corrupt chunk at offset 1237: zstd payload does not decompress";

#[test]
fn a_failed_export_leaves_no_file() {
    let (dir, bad) = undecodable_events();
    for (cmd, name) in [
        (&["export", "--perfetto"][..], "out.json"),
        (&["export", "--perfetto"], "out.pftrace"),
        (&["flamegraph"], "out.svg"),
    ] {
        let out_path = dir.path().join(name);
        let out = run(&[cmd, &["-o", out_path.to_str().unwrap(), bad.to_str().unwrap()]].concat());
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(text(&out.stderr).contains(UNDECODABLE), "{name}: {}", text(&out.stderr));
        assert!(!out_path.exists(), "a failed {cmd:?} left {name}");
    }
}

#[test]
fn a_failed_export_keeps_the_file_that_was_there_and_leaves_no_temporary() {
    let (dir, bad) = undecodable_events();
    let out_path = dir.path().join("out.json");
    std::fs::write(&out_path, b"an earlier export").unwrap();
    let out = run(&["export", "--perfetto", "-o", out_path.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read(&out_path).unwrap(), b"an earlier export");
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["bad.ocl", "out.json"]);
}

#[test]
fn an_output_that_is_the_input_is_refused_and_the_trace_kept() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.ocl");
    std::fs::copy(testdata("v1.0/synthetic.ocl"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    std::os::unix::fs::symlink(&input, dir.path().join("link.ocl")).unwrap();
    for args in [
        &["export", "--perfetto", "t.ocl", "-o", "t.ocl"][..],
        &["export", "--perfetto", "t.ocl", "-o", "./t.ocl"],
        &["export", "--perfetto", "--format", "pftrace", "t.ocl", "-o", "link.ocl"],
        &["flamegraph", "t.ocl", "-o", "t.ocl"],
        &["flamegraph", "link.ocl", "-o", "./t.ocl"],
    ] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_ocular-analyze")).args(args).current_dir(dir.path()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let output = args[args.len() - 1];
        let given = args[args.len() - 3];
        assert_eq!(
            text(&out.stderr),
            format!(
                "ocular-analyze: error: {output} is the input trace {given}: writing it would destroy the trace; \
                 choose another output with -o\n"
            ),
            "{args:?}"
        );
        assert_eq!(std::fs::read(&input).unwrap(), before, "{args:?}");
        assert!(std::fs::symlink_metadata(dir.path().join("link.ocl")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "{args:?} left a file");
    }
}

#[cfg(feature = "parquet")]
#[test]
fn a_parquet_output_that_is_the_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("t.parquet");
    std::fs::create_dir(&tables).unwrap();
    let input = tables.join("events.parquet");
    std::fs::copy(testdata("v1.0/synthetic.ocl"), &input).unwrap();
    let out = run(&["export", "--parquet", "-o", tables.to_str().unwrap(), input.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("events.parquet is the input trace"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&input).unwrap(), std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap());
}

#[cfg(feature = "parquet")]
#[test]
fn a_failed_parquet_export_leaves_no_files() {
    let (dir, bad) = undecodable_events();
    let out_dir = dir.path().join("bad.parquet");
    let out = run(&["export", "--parquet", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(UNDECODABLE), "{}", text(&out.stderr));
    assert!(!out_dir.exists(), "a failed export left {:?}", std::fs::read_dir(&out_dir).map(|d| d.count()));
    // Into a directory that was there before: it stays, without the tables.
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = run(&["export", "--parquet", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
    // The same file exports with --salvage, without the damaged chunk.
    let out = run(&["export", "--parquet", "--salvage", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for t in ["events", "calls", "code"] {
        assert!(out_dir.join(format!("{t}.parquet")).exists(), "{t}");
    }
}

#[test]
fn help_teaches_with_examples() {
    let out = run(&["info", "--help"]);
    let s = text(&out.stdout);
    assert!(s.contains("Example: ocular-analyze info run.ocl --json"), "{s}");
}

/// A recording of two threads, in microsecond ticks without recorder cost, 10 ms from its first event to
/// its last: `MainThread` (7) runs `main`, which calls `fib` (5.9 ms) then `Thread.join` (3.9 ms);
/// `worker-1` (8) runs `run`, which calls `fib` (7.9 ms), which calls `helper` three times (1 ms each).
/// Merged, `fib` has 13.8 ms of inclusive time: more than the wall time.
fn two_threads() -> (tempfile::TempDir, std::path::PathBuf) {
    two_threads_in(ocular_format::testing::header().options.mode)
}

/// [`two_threads`] as recorded in `mode`.
fn two_threads_in(mode: ocular_format::Mode) -> (tempfile::TempDir, std::path::PathBuf) {
    use ocular_format::{testing, CodeObject, EventKind, Position, RawEvent, ThreadInfo, Trailer, Writer};
    let mut header = testing::header();
    header.options.mode = mode;
    header.ticks_per_second = 1e6;
    header.event_cost_ticks = 0.0;
    header.start_ticks = 0;
    header.pid = 0x3fff_fff0; // above any pid Linux hands out: a process that is gone
    let code = |id: u32, qualname: &str, first_line: u32| CodeObject {
        id,
        name: qualname.rsplit('.').next().unwrap().into(),
        qualname: qualname.into(),
        filename: "threads.py".into(),
        first_line,
        flags: 0,
        bytecode: vec![151, 0, 83, 0], // RESUME, RETURN_VALUE
        linetable: Vec::new(),
        positions: vec![Position { line: first_line as i32, end_line: first_line as i32, column: 0, end_column: 1 }; 2],
    };
    let (main, join, fib, run, helper) = (1, 2, 3, 4, 5);
    let t0 = 1_000_000;
    let start = |t: u64, f: u32| RawEvent::new(t0 + t, f, 0, 0, EventKind::PY_START as u8);
    let ret = |t: u64, f: u32| RawEvent::new(t0 + t, f, 2, 0, EventKind::PY_RETURN as u8);
    let t7 = [start(0, main), start(100, fib), ret(6000, fib), start(6000, join), ret(9900, join), ret(10_000, main)];
    let mut t8 = vec![start(50, run), start(100, fib)];
    for at in [1000, 3000, 5000] {
        t8.extend([start(at, helper), ret(at + 1000, helper)]);
    }
    t8.extend([ret(8000, fib), ret(9000, run)]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("threads.ocl");
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &name, &header, Default::default()).unwrap();
    w.code_objects(&[
        code(main, "main", 1),
        code(join, "Thread.join", 10),
        code(fib, "fib", 20),
        code(run, "run", 30),
        code(helper, "helper", 40),
    ])
    .unwrap();
    w.thread(&ThreadInfo { thread_id: 7, name: "MainThread".into(), is_main: true }).unwrap();
    w.thread(&ThreadInfo { thread_id: 8, name: "worker-1".into(), is_main: false }).unwrap();
    w.events(7, &t7).unwrap();
    w.events(8, &t8).unwrap();
    let trailer =
        Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: t0 + 10_050, events: 0, lost: 0, chunks: 0 };
    w.finish(trailer).unwrap();
    (dir, path)
}

#[test]
fn stats_per_thread_prints_a_heading_then_a_table_per_thread() {
    let (_dir, f) = two_threads();
    let out = run(&["stats", "--per-thread", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "\
wall 10.000 ms, 2 threads, one table per thread; incl % = incl ms / wall

thread 7 (MainThread)
     calls      incl ms  incl %      excl ms     mean us  function  file:line
         1        5.900   59.0%        5.900    5900.000  fib  threads.py:20
         1        3.900   39.0%        3.900    3900.000  Thread.join  threads.py:10
         1       10.000  100.0%        0.200   10000.000  main  threads.py:1

thread 8 (worker-1)
     calls      incl ms  incl %      excl ms     mean us  function  file:line
         1        7.900   79.0%        4.900    7900.000  fib  threads.py:20
         3        3.000   30.0%        3.000    1000.000  helper  threads.py:40
         1        8.950   89.5%        1.050    8950.000  run  threads.py:30
"
    );
    // --top counts rows per thread, and says what each table left out.
    let out = run(&["stats", "--per-thread", "--top", "1", f.to_str().unwrap()]);
    let s = text(&out.stdout);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.iter().filter(|l| l.ends_with("  fib  threads.py:20")).count(), 2, "{s}");
    assert_eq!(lines.iter().filter(|l| **l == "... 2 more (use --top)").count(), 2, "{s}");
    assert!(s.contains("... 2 more (use --top)\n\nthread 8 (worker-1)\n"), "{s}");
}

#[test]
fn stats_merged_says_times_are_summed_over_threads_and_gives_their_share() {
    let (_dir, f) = two_threads();
    let out = run(&["stats", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(
        lines[0],
        "wall 10.000 ms, 2 threads: times are summed over the threads, so they can exceed the wall time; \
         incl % = incl ms / (2 x wall)"
    );
    assert_eq!(lines[1], "     calls      incl ms  incl %      excl ms     mean us  function  file:line");
    assert_eq!(lines[2], "         2       13.800   69.0%       10.800    6900.000  fib  threads.py:20");

    let out = run(&["stats", "--json", f.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fib = &v[0];
    assert_eq!((fib["function"].as_str(), fib["thread_id"].as_u64()), (Some("fib"), Some(0)));
    assert_eq!((fib["inclusive_ms"].as_f64(), fib["wall_ms"].as_f64()), (Some(13.8), Some(10.0)));
    assert_eq!(fib["threads"], 2);
    assert!((fib["wall_share"].as_f64().unwrap() - 0.69).abs() < 1e-12, "{fib}");

    let out = run(&["stats", "--json", "--per-thread", f.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let main = v.as_array().unwrap().iter().find(|r| r["function"] == "main").unwrap();
    assert_eq!((main["thread_id"].as_u64(), main["thread_name"].as_str()), (Some(7), Some("MainThread")));
    assert_eq!(main["threads"], 1);
    assert!((main["wall_share"].as_f64().unwrap() - 1.0).abs() < 1e-12, "{main}");
}

#[test]
fn stats_json_keeps_to_top_merged_and_per_thread() {
    let (_dir, f) = two_threads();
    let functions = |args: &[&str]| -> Vec<(u64, String)> {
        let out = run(&[&["stats", "--json"], args, &[f.to_str().unwrap()]].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = v.as_array().unwrap();
        rows.iter().map(|r| (r["thread_id"].as_u64().unwrap(), r["function"].as_str().unwrap().into())).collect()
    };
    let names = |v: &[(u64, &str)]| -> Vec<(u64, String)> { v.iter().map(|(t, f)| (*t, f.to_string())).collect() };
    assert_eq!(functions(&["--top", "2"]), names(&[(0, "fib"), (0, "Thread.join")]));
    assert_eq!(
        functions(&["--top", "2", "--per-thread"]),
        names(&[(7, "fib"), (7, "Thread.join"), (8, "fib"), (8, "helper")])
    );
    assert_eq!(functions(&[]).len(), 5, "the default --top leaves all five");
}

/// Runs the binary with stdout a pipe whose read end is already closed, as `| head -1` leaves it once head
/// has its line: every write fails with EPIPE.
fn run_into_closed_pipe(args: &[&str]) -> Output {
    use std::process::Stdio;
    // The write end of a pipe whose only reader, `true`, has exited without reading.
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let write_end = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    Command::new(env!("CARGO_BIN_EXE_ocular-analyze"))
        .args(args)
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_pipe_ends_stats_and_info_quietly() {
    let (_dir, f) = two_threads();
    let f = f.to_str().unwrap();
    for args in [
        &["stats", "--json", f][..],
        &["stats", f],
        &["stats", "--per-thread", f],
        &["stats", "--per-thread", "--json", f],
        &["info", f],
        &["info", "--json", f],
    ] {
        let out = run_into_closed_pipe(args);
        assert_eq!((out.status.code(), text(&out.stderr).as_str()), (Some(0), ""), "{args:?}");
    }
}

#[test]
fn a_trace_cut_off_before_any_events_is_an_error_not_an_empty_run() {
    // The two-thread trace without its trailer, of a process that is gone, cut inside its first chunk of
    // events: `stats` used to print an empty table (`wall 0.000 ms, 0 threads`) and exit 0.
    let (dir, path) = two_threads();
    let mut r = ocular_format::Reader::open(&path).unwrap();
    let mut first_events = None;
    while let Some(c) = r.next_chunk().unwrap() {
        if matches!(c.body, ocular_format::Body::Events(_)) && first_events.is_none() {
            first_events = Some(c.info.offset);
        }
    }
    let cut_at = first_events.unwrap() as usize + 20;
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.ocl");
    std::fs::write(&cut, &bytes[..cut_at]).unwrap();
    // The fixture's pid must be a process that is gone: above any pid Linux hands out.
    let header = ocular_format::Reader::open(&cut).unwrap().header().clone();
    assert!(!ocular_format::process_alive(header.pid), "pid {}", header.pid);
    let c = cut.to_str().unwrap();
    let html = dir.path().join("cut.html");
    for args in [vec!["stats", c], vec!["hot", c], vec!["report", c, "-o", html.to_str().unwrap()]] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stdout));
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("error: {c} holds no events: it is cut off at offset {}", first_events.unwrap())),
            "{args:?}: {err}"
        );
        assert!(text(&out.stdout).is_empty(), "{args:?}");
    }
    assert!(!html.exists());
    // `info` still says what it holds.
    let out = run(&["info", c]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("events        0"), "{}", text(&out.stdout));
}

#[test]
fn good_files_read_without_a_word_on_stderr() {
    // A false alarm on a good file teaches users to ignore the real ones: every command on every frozen
    // fixture, and on a calls-mode trace, says nothing on stderr (`stats --lines` on a calls-mode file
    // printed "no trailer" before its refusal).
    let dir = tempfile::tempdir().unwrap();
    let (_d, threads) = two_threads();
    let (_c, calls) = two_threads_in(ocular_format::Mode::Calls);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(testdata(""))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("synthetic.ocl"))
        .filter(|p| p.exists())
        .collect();
    files.extend([threads, calls]);
    assert!(files.len() >= 12, "{files:?}");
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    for f in &files {
        let f = f.to_str().unwrap();
        for args in [
            vec!["info", f],
            vec!["stats", f],
            vec!["hot", f],
            vec!["specialize", f],
            vec!["flamegraph", f, "-o", o],
            vec!["report", f, "-o", o],
            vec!["export", "--perfetto", f, "-o", o],
            vec!["dump", f],
            vec!["spans", f],
        ] {
            let r = run(&args);
            // The fixtures record losses on purpose (LOST chunks): saying so is true, any other warning is
            // not. (A command may refuse a fixture it has nothing to show for, with its error.)
            let said: Vec<String> = text(&r.stderr)
                .lines()
                .filter(|l| l.starts_with("warning") && !l.contains(" events ("))
                .map(String::from)
                .collect();
            assert!(said.is_empty(), "{args:?}: {said:?}");
        }
        // Refused or not, no warning before.
        let r = run(&["stats", "--lines", f]);
        let e = text(&r.stderr);
        assert!(!e.lines().any(|l| l.starts_with("warning") && !l.contains(" events (")), "{f}: {e}");
    }
}
