//! `diff` on two synthetic recordings of one program whose changes are known by construction: `main` calls
//! `f` (1000 ticks a call, unchanged), `g` (a loop of 4 iterations: 1000 ticks a call before, 2000 after,
//! and moved 5 lines down), `h` before only and `k` after only. `g`'s FOR_ITER ran as FOR_ITER_RANGE
//! before and stayed generic after.

use ocular_analyze::analysis::analyze;
use ocular_analyze::{diff, procs};
use ocular_format::{testing, CodeObject, CodeSnapshot, EventKind, Header, Mode, Position, RawEvent, Trailer, Writer};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MAIN: u32 = 1;
const F: u32 = 2;
const G: u32 = 3;
/// `h` before, `k` after.
const OTHER: u32 = 4;

/// RESUME, RETURN_VALUE.
const PLAIN: [u8; 4] = [151, 0, 83, 0];
/// RESUME, FOR_ITER (+1 cache), POP_TOP, JUMP_BACKWARD (to 2), POP_TOP, RETURN_VALUE.
const LOOP: [u8; 14] = [151, 0, 93, 4, 0, 0, 1, 0, 140, 3, 1, 0, 83, 0];

fn code(id: u32, name: &str, line: u32, bytecode: &[u8]) -> CodeObject {
    let p = Position { line: line as i32, end_line: line as i32, column: 0, end_column: 1 };
    CodeObject {
        id,
        name: name.into(),
        qualname: name.into(),
        filename: "prog.py".into(),
        first_line: line,
        flags: 0,
        bytecode: bytecode.to_vec(),
        linetable: Vec::new(),
        positions: vec![p; bytecode.len() / 2],
    }
}

/// One version of the program: `g` takes `iteration` ticks per loop iteration, sits at `g_line`, and its
/// FOR_ITER is `for_iter` at stop; `other` names the function called last.
struct Version {
    iteration: u64,
    g_line: u32,
    for_iter: u8,
    other: &'static str,
    /// The program's file.
    file: &'static str,
}

/// Writes `v` recorded with `header` into `dir/name`.
fn write(dir: &Path, name: &str, header: &Header, v: &Version) -> PathBuf {
    use EventKind::*;
    let ev = |t: u64, code: u32, off: u32, arg: u32, k: EventKind| RawEvent::new(10_000 + t, code, off, arg, k as u8);
    let mut e = vec![ev(0, MAIN, 0, 0, PY_START)];
    let mut t = 0;
    for _ in 0..10 {
        t += 100;
        e.push(ev(t, F, 0, 0, PY_START));
        t += 1000;
        e.push(ev(t, F, 2, 0, PY_RETURN));
        t += 100;
        e.push(ev(t, G, 0, 0, PY_START));
        for _ in 0..4 {
            t += v.iteration;
            e.push(ev(t, G, 8, 2, JUMP));
        }
        e.push(ev(t, G, 12, 0, PY_RETURN));
    }
    for _ in 0..5 {
        t += 100;
        e.push(ev(t, OTHER, 0, 0, PY_START));
        t += 500;
        e.push(ev(t, OTHER, 2, 0, PY_RETURN));
    }
    t += 100;
    e.push(ev(t, MAIN, 2, 0, PY_RETURN));

    let path = dir.join(name);
    let label = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &label, header, Default::default()).unwrap();
    let mut codes = [
        code(MAIN, "main", 1, &PLAIN),
        code(F, "f", 10, &PLAIN),
        code(G, "g", v.g_line, &LOOP),
        code(OTHER, v.other, 40, &PLAIN),
    ];
    for c in &mut codes {
        c.filename = v.file.into();
    }
    w.code_objects(&codes).unwrap();
    w.events(7, &e).unwrap();
    let mut adaptive = LOOP.to_vec();
    adaptive[2] = v.for_iter;
    w.snapshots(&[CodeSnapshot { id: G, bytecode: adaptive }]).unwrap();
    let n = e.len() as u64;
    w.finish(Trailer {
        end_unix_ns: 0,
        end_monotonic_ns: 0,
        end_ticks: 10_000 + t + 50,
        events: n,
        lost: 0,
        chunks: 0,
    })
    .unwrap();
    path
}

fn header() -> Header {
    let mut h = testing::header();
    h.event_cost_ticks = 0.0;
    h
}

const BEFORE: Version = Version { iteration: 250, g_line: 20, for_iter: 194, other: "h", file: "prog.py" };
const AFTER: Version = Version { iteration: 500, g_line: 25, for_iter: 93, other: "k", file: "prog.py" };

/// The two recordings, with headers changed by `before` and `after`.
fn pair(before: impl FnOnce(&mut Header), after: impl FnOnce(&mut Header)) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (mut hb, mut ha) = (header(), header());
    before(&mut hb);
    after(&mut ha);
    let b = write(dir.path(), "before.ocl", &hb, &BEFORE);
    let a = write(dir.path(), "after.ocl", &ha, &AFTER);
    (dir, b, a)
}

fn side(path: &Path) -> diff::Side {
    let (run, _) = procs::open(path, Default::default()).unwrap();
    let a = analyze(path, Default::default()).unwrap();
    diff::Side::new(path, &run, &[a]).unwrap()
}

fn run(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ocular-analyze")).arg("diff").args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn diff_names_the_function_that_doubled_and_the_ones_that_came_and_went() {
    let (_dir, b, a) = pair(|_| {}, |_| {});
    let d = diff::diff(side(&b), side(&a), 20, false).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let names: Vec<&str> = d.functions.iter().map(|r| r.function.as_str()).collect();
    // g gained 10 x 1000 ticks, main lost h's 5 x 100 ticks of gaps to k's and nothing else, f none.
    assert_eq!(names[0], "g");
    let g = &d.functions[0];
    assert_eq!((g.calls_before, g.calls_after), (10, 10));
    assert_eq!((g.line_before, g.line_after), (20, 25));
    assert!((g.factor.unwrap() - 2.0).abs() < 1e-9, "{g:?}");
    assert!((g.exclusive_change_pct.unwrap() - 100.0).abs() < 1e-6, "{g:?}");
    assert!((g.exclusive_us_before.unwrap() - 1000.0 / 3e3).abs() < 1e-9, "{g:?}");
    assert!((g.exclusive_ms_change - 10.0 * 1000.0 / 3e6).abs() < 1e-12, "{g:?}");
    let f = d.functions.iter().find(|r| r.function == "f").unwrap();
    assert_eq!(f.factor, Some(1.0));
    assert_eq!(f.exclusive_change_pct, Some(0.0));
    assert_eq!(f.exclusive_ms_change, 0.0);
    let main = d.functions.iter().find(|r| r.function == "main").unwrap();
    assert_eq!(main.factor, Some(1.0), "main's own time is unchanged: {main:?}");
    assert!(main.inclusive_change_pct.unwrap() > 0.0, "main includes g: {main:?}");

    let new: Vec<(&str, u64)> = d.new_functions.iter().map(|r| (r.function.as_str(), r.calls)).collect();
    let vanished: Vec<(&str, u64)> = d.vanished_functions.iter().map(|r| (r.function.as_str(), r.calls)).collect();
    assert_eq!((new, vanished), (vec![("k", 5)], vec![("h", 5)]));

    // g's loop moved with g (its first line 20 -> 25): matched, and each iteration takes twice as long.
    assert_eq!(d.loops.len(), 1, "{:?}", d.loops);
    let l = &d.loops[0];
    assert_eq!((l.function.as_str(), l.line_before, l.line_after), ("g", 20, 25));
    assert_eq!((l.iterations_before, l.iterations_after), (40, 40));
    assert!((l.ns_per_iteration_before.unwrap() - 250.0 / 3.0).abs() < 1e-6, "{l:?}");
    assert!((l.change_pct.unwrap() - 100.0).abs() < 1e-6, "{l:?}");
    assert!(d.new_loops.is_empty() && d.vanished_loops.is_empty());

    let s: Vec<(&str, i32, &str, &str, &str)> = d
        .specializations
        .iter()
        .map(|s| (s.function.as_str(), s.line, s.base.as_str(), s.before.as_str(), s.after.as_str()))
        .collect();
    assert_eq!(s, [("g", 25, "FOR_ITER", "FOR_ITER_RANGE", "FOR_ITER")]);
}

#[test]
fn diff_text_and_json_from_the_command_line() {
    let (_dir, b, a) = pair(|_| {}, |_| {});
    let out = run(&[&b, &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    let s = text(&out.stdout);
    assert!(s.starts_with(&format!("before  {}: adaptive mode, Python 3.12.1, ", b.display())), "{s}");
    let g = s.lines().find(|l| l.contains("  g  prog.py:20->25")).unwrap_or_else(|| panic!("no g row: {s}"));
    assert!(g.contains("+100.0%") && g.contains("2.00x"), "{g}");
    let f = s.lines().find(|l| l.contains("  f  prog.py:10")).unwrap_or_else(|| panic!("no f row: {s}"));
    assert!(f.contains("+0.0%") && f.contains("1.00x"), "{f}");
    let new = s.split("new functions (only in after)\n").nth(1).unwrap_or_else(|| panic!("{s}"));
    assert!(new.lines().nth(1).unwrap().ends_with("  k  prog.py:40"), "{s}");
    let gone = s.split("vanished functions (only in before)\n").nth(1).unwrap_or_else(|| panic!("{s}"));
    assert!(gone.lines().nth(1).unwrap().ends_with("  h  prog.py:40"), "{s}");
    assert!(s.contains("FOR_ITER                 FOR_ITER_RANGE"), "{s}");

    let out = Command::new(env!("CARGO_BIN_EXE_ocular-analyze"))
        .args(["diff", "--json", "--top", "1"])
        .args([&b, &a])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["before"]["mode"], "adaptive");
    assert_eq!(v["after"]["python"], "3.12.1");
    assert_eq!(v["functions"].as_array().unwrap().len(), 1);
    assert_eq!(v["functions"][0]["function"], "g");
    assert_eq!(v["functions"][0]["factor"], 2.0);
    assert_eq!(v["left_out"]["functions"], 2);
    assert_eq!(v["new_functions"][0]["function"], "k");
    assert_eq!(v["vanished_functions"][0]["function"], "h");
    assert_eq!(v["loops"][0]["iterations_after"], 40);
    assert_eq!(v["specializations"][0]["before"], "FOR_ITER_RANGE");
    assert_eq!(v["warnings"], serde_json::json!([]));
}

#[test]
fn different_python_versions_are_refused_unless_forced() {
    let (_dir, b, a) = pair(|_| {}, |h| h.python_version = "3.13.0".into());
    let out = run(&[&b, &a]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        format!(
            "ocular-analyze: error: {} was recorded with Python 3.12.1 and {} with Python 3.13.0: bytecode, \
             specialization and costs differ between versions, so the figures do not compare (--force compares them \
             anyway)\n",
            b.display(),
            a.display()
        )
    );
    let out =
        Command::new(env!("CARGO_BIN_EXE_ocular-analyze")).args(["diff", "--force"]).args([&b, &a]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("with Python 3.13.0: compared anyway (--force)"), "{}", text(&out.stderr));
}

#[test]
fn different_modes_thresholds_and_machines_are_compared_with_a_warning_each() {
    let (_dir, b, a) = pair(
        |_| {},
        |h| {
            h.options.mode = Mode::Precise;
            h.options.deinstrument_threshold = 0;
            h.ticks_per_second = 2.0e9;
        },
    );
    let out = run(&[&b, &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].starts_with("warning: ")
            && lines[0].contains("in adaptive mode and")
            && lines[0].contains("in precise mode"),
        "{err}"
    );
    assert!(lines[1].contains("with threshold 500 and") && lines[1].contains("with threshold 0"), "{err}");
    assert!(
        lines[2].contains("linux-x86_64, Tsc clock at 3.000 GHz")
            && lines[2].contains("linux-x86_64, Tsc clock at 2.000 GHz")
            && lines[2].contains("different machines"),
        "{err}"
    );
    assert!(text(&out.stdout).contains("precise mode"), "{}", text(&out.stdout));
}

#[test]
fn bad_input_gets_the_errors_of_every_command() {
    let (_dir, b, _) = pair(|_| {}, |_| {});
    let out = run(&[&b, Path::new("/nonexistent/run.ocl")]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "ocular-analyze: error: /nonexistent/run.ocl: No such file or directory (os error 2)\n"
    );
    let out = run(&[Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")), &b]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Cargo.toml is not an Ocular trace"), "{}", text(&out.stderr));
}

/// A recording with windows (FORMAT.md 5.3): `f` runs 300 ticks in the first window, then 100 in one
/// later window of 100 every 1000: its figures are estimates.
fn windowed(dir: &Path, name: &str) -> PathBuf {
    use EventKind::*;
    let ev = |t: u64, code: u32, off: u32, arg: u32, k: EventKind| RawEvent::new(10_000 + t, code, off, arg, k as u8);
    let e = vec![
        ev(0, 0, 0, u32::MAX, WINDOW),
        ev(0, MAIN, 0, 0, PY_START),
        ev(100, F, 0, 0, PY_START),
        ev(400, F, 2, 0, PY_RETURN),
        ev(1000, 0, 0, 0, WINDOW_END),
        ev(2000, 0, 1, 100, WINDOW),
        ev(2000, MAIN, 0, 0, STACK),
        ev(2010, F, 0, 0, PY_START),
        ev(2060, F, 2, 0, PY_RETURN),
        ev(3000, MAIN, 2, 0, JUMP),
    ];
    let mut h = header();
    h.ticks_per_second = 1e6;
    h.start_ticks = 10_000;
    let path = dir.join(name);
    let label = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), &label, &h, Default::default()).unwrap();
    w.code_objects(&[code(MAIN, "main", 1, &PLAIN), code(F, "f", 10, &PLAIN)]).unwrap();
    w.events(7, &e).unwrap();
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 13_000, events: 10, lost: 0, chunks: 0 })
        .unwrap();
    path
}

#[test]
fn estimates_are_marked_as_stats_marks_them() {
    let dir = tempfile::tempdir().unwrap();
    let (b, a) = (windowed(dir.path(), "before.ocl"), windowed(dir.path(), "after.ocl"));
    let out = run(&[&b, &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    let f = s.lines().find(|l| l.contains("  f  prog.py:10")).unwrap_or_else(|| panic!("no f row: {s}"));
    assert!(f.trim_start().starts_with("~"), "{f}");
    assert!(f.contains("~1.00x"), "{f}");
    assert!(s.contains("note: before (before.ocl): calls recorded completely for the first"), "{s}");
    assert!(s.contains("compare recordings made with --mode calls (exact calls and times) to measure a change"), "{s}");
    let d = diff::diff(side(&b), side(&a), 20, false).unwrap();
    assert!(d.before.estimated && d.functions.iter().all(|r| r.estimated_before && r.estimated_after));
}

#[test]
fn a_program_run_from_another_directory_is_matched_by_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let b = write(dir.path(), "before.ocl", &header(), &Version { file: "/src/v1/prog.py", ..BEFORE });
    let a = write(dir.path(), "after.ocl", &header(), &Version { file: "/src/v2/prog.py", ..AFTER });
    let d = diff::diff(side(&b), side(&a), 20, false).unwrap();
    let g = &d.functions[0];
    assert_eq!(
        (g.function.as_str(), g.file.as_str(), g.file_before.as_str()),
        ("g", "/src/v2/prog.py", "/src/v1/prog.py")
    );
    assert!((g.factor.unwrap() - 2.0).abs() < 1e-9, "{g:?}");
    assert_eq!(d.functions.len(), 3);
    // h and k are still one each side: their names differ.
    assert_eq!((d.new_functions.len(), d.vanished_functions.len()), (1, 1));
    assert_eq!((d.loops.len(), d.specializations.len()), (1, 1));
    assert_eq!(
        d.notes,
        ["3 functions matched by file name and qualified name, their files' directories differing \
          (/src/v1/prog.py -> /src/v2/prog.py, ...)"]
    );
}
