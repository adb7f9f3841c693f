//! `diff`: what changed between two recordings of the same program, per function, per hot loop, and in
//! the interpreter's specialization of each instruction.
//!
//! ```no_run
//! use ocular_analyze::{analysis::analyze, diff, procs};
//! use std::path::Path;
//! let side = |p: &str| -> anyhow::Result<diff::Side> {
//!     let (run, _) = procs::open(Path::new(p), Default::default())?;
//!     let a = analyze(Path::new(p), Default::default())?;
//!     diff::Side::new(Path::new(p), &run, &[a])
//! };
//! let d = diff::diff(side("before.ocl")?, side("after.ocl")?, 20, false)?;
//! println!("{d}");
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! What is matched across the two files:
//! - Functions, by file and qualified name (`co_filename`, `co_qualname`): the first line may differ,
//!   code moves. Functions left over are then matched by the file's last component and qualified name
//!   where that names one function on each side (the program run from another checkout or environment;
//!   `file_before` keeps the before file). Code objects with the same file and qualified name in one
//!   recording (two lambdas of one function, or a run's processes) are one function, their figures
//!   summed, as `stats` sums a run's processes.
//! - Loops, as `hot` finds them (a code object's backward jump and its head), within matched functions:
//!   by the loop's first source line, then the loops left over in a function in the order of their offset
//!   (code that moved keeps its loops paired) when as many are left on both sides. A loop whose function
//!   changed more than that is listed as new or vanished.
//! - Instructions, for specialization, within matched functions that both have a snapshot (FORMAT.md
//!   6.4): instruction by instruction when the two functions have the same base opcodes in the same
//!   order (the code is the same, maybe moved), else by source line and base opcode (the n-th
//!   `BINARY_OP` of line 12 with the n-th). Instructions still instrumented at stop say nothing and are
//!   left out.
//!
//! The JSON form (`--json`) is one object:
//! - `before`, `after`: the recordings ([`Recording`]: file, python, mode, threshold, platform, clock,
//!   ticks_per_second, wall_ms, processes, estimated).
//! - `warnings`: why figures may not compare (modes, thresholds, machines); also printed on stderr.
//! - `notes`: what each recording's figures cover (windows, flight recorder), as `stats` says it.
//! - `functions`: [`FunctionChange`] rows, by the absolute change of exclusive time, biggest first.
//! - `new_functions` (only in after), `vanished_functions` (only in before): [`FunctionOnly`] rows, by
//!   exclusive time.
//! - `loops`: [`LoopChange`] rows, by the absolute change of the time in the loop; `new_loops`,
//!   `vanished_loops`: [`LoopOnly`] rows.
//! - `specializations`: [`SpecializationChange`] rows, hottest function first, then by line.
//! - `left_out`: per list, the rows `--top` left out.
//!
//! Times are as `stats` and `hot` give them: the recorder's own cost subtracted, estimates (a
//! default-mode recording's windows) flagged `estimated_*` and marked `~` in the text.

use crate::analysis::{instructions, specialization, Analysis};
use crate::procs::Run;
use crate::stats::{self, SortBy};
use ocular_format::{CodeObject, Header, Mode};
use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// A function's identity across recordings: (file, qualified name).
type Key = (String, String);

/// A recording compared: the facts that say whether its figures compare with the other's.
#[derive(Clone, Debug, Serialize)]
pub struct Recording {
    /// The file as given.
    pub file: String,
    /// Python version (`sys.version`'s first word).
    pub python: String,
    /// Recording mode: calls, adaptive or precise.
    pub mode: String,
    /// De-instrumentation threshold (0: gapless).
    pub threshold: u32,
    /// `sys.platform` and machine.
    pub platform: String,
    /// The clock behind the timestamps: Tsc or MonotonicNs.
    pub clock: String,
    /// Its calibrated frequency.
    pub ticks_per_second: f64,
    /// From the first event to the last, ms (of every process, for a run).
    pub wall_ms: f64,
    /// Processes recorded (1 unless the file begins a run of several).
    pub processes: usize,
    /// Some function figures are estimates (windows, FORMAT.md 5.3).
    pub estimated: bool,
}

/// One function's figures in one recording (its code objects' and processes' summed).
#[derive(Clone, Debug, Default)]
struct Func {
    line: u32,
    calls: u64,
    inclusive_ms: f64,
    exclusive_ms: f64,
    estimated: bool,
}

impl Func {
    fn per_call_us(&self, ms: f64) -> Option<f64> {
        (self.calls > 0).then(|| ms * 1e3 / self.calls as f64)
    }
}

/// One hot loop in one recording.
#[derive(Clone, Debug)]
struct Loop {
    key: Key,
    line: i32,
    head: u32,
    iterations: u64,
    sampled: bool,
    /// None where nothing was measured ([`crate::hot::HotLoop::ns_per_iteration`]).
    ns_per_iteration: Option<f64>,
    /// Iterations behind `ns_per_iteration` (those of the processes that measured it).
    measured: u64,
    total_ms: f64,
}

/// An instruction's form at stop: its source line, base opcode name, and the opcode it had become
/// (`None`: still instrumented, or unreadable, so unknown).
#[derive(Clone, Debug)]
struct Form {
    line: i32,
    base: String,
    at_stop: Option<String>,
}

/// One recording, reduced to what `diff` compares. Built from its analyses, which can then be dropped.
#[derive(Debug)]
pub struct Side {
    /// The recording.
    pub recording: Recording,
    functions: HashMap<Key, Func>,
    loops: Vec<Loop>,
    forms: HashMap<Key, Vec<Form>>,
    note: Option<String>,
}

impl Side {
    /// The side of `path`, which begins `run`, from its processes' `analyses` (in the run's order).
    pub fn new(path: &Path, run: &Run, analyses: &[Analysis]) -> anyhow::Result<Side> {
        let header = analyses
            .first()
            .and_then(|a| a.header.as_ref())
            .ok_or_else(|| anyhow::anyhow!("{}: no header: not a trace this analyzer can compare", path.display()))?;
        // The rows `stats` shows, a run's processes merged as it merges them.
        let report = if run.single() {
            let span = analyses[0].span;
            stats::report(&analyses[0], span, false, SortBy::Exclusive, usize::MAX)
        } else {
            let spans: Vec<_> = analyses.iter().map(|a| a.span).collect();
            let parts: Vec<stats::Part<'_>> = run
                .processes
                .iter()
                .zip(analyses)
                .zip(spans)
                .map(|((process, analysis), span)| stats::Part { process, analysis, span })
                .collect();
            stats::report_run(&parts, run.unrecorded.len(), false, false, SortBy::Exclusive, usize::MAX)
        };
        let mut functions: HashMap<Key, Func> = HashMap::default();
        for r in report.tables.iter().flat_map(|t| &t.rows).map(|s| &s.row) {
            let f = functions
                .entry((r.file.clone(), r.function.clone()))
                .or_insert_with(|| Func { line: r.line, ..Func::default() });
            f.line = f.line.min(r.line);
            f.calls += r.calls;
            f.inclusive_ms += r.inclusive_ms;
            f.exclusive_ms += r.exclusive_ms;
            f.estimated |= r.estimated;
        }
        let mut loops: Vec<Loop> = Vec::new();
        let mut forms: HashMap<Key, Vec<Form>> = HashMap::default();
        for a in analyses {
            for l in crate::hot::report(a, usize::MAX).loops {
                let key = (l.file, l.function);
                let total_ms = l.total_ns / 1e6;
                // The same loop (same code, head and line) in another process: time per iteration weighed by
                // iterations.
                match loops.iter_mut().find(|x| x.key == key && x.head == l.head_offset && x.line == l.first_line) {
                    Some(x) => {
                        if let Some(ns) = l.ns_per_iteration {
                            let m = x.measured + l.iterations;
                            if m > 0 {
                                let before = x.ns_per_iteration.unwrap_or(0.0) * x.measured as f64;
                                x.ns_per_iteration = Some((before + ns * l.iterations as f64) / m as f64);
                            }
                            x.measured = m;
                        }
                        x.iterations += l.iterations;
                        x.sampled |= l.sampled;
                        x.total_ms += total_ms;
                    }
                    None => loops.push(Loop {
                        key,
                        line: l.first_line,
                        head: l.head_offset,
                        iterations: l.iterations,
                        sampled: l.sampled,
                        ns_per_iteration: l.ns_per_iteration,
                        measured: if l.ns_per_iteration.is_some() { l.iterations } else { 0 },
                        total_ms,
                    }),
                }
            }
            let Some(h) = a.header.as_ref() else { continue };
            let mut ids: Vec<u32> = a.snapshots.keys().copied().collect();
            ids.sort_unstable();
            for id in ids {
                let Some(co) = a.code.get(&id) else { continue };
                let key = (co.filename.clone(), co.qualname.clone());
                if functions.contains_key(&key) && !forms.contains_key(&key) {
                    forms.insert(key, forms_of(co, h, &a.snapshots[&id]));
                }
            }
        }
        let recording = Recording {
            file: path.display().to_string(),
            python: header.python_version.clone(),
            mode: header.options.mode.name().into(),
            threshold: header.options.deinstrument_threshold,
            platform: header.platform.clone(),
            clock: format!("{:?}", header.clock),
            ticks_per_second: header.ticks_per_second,
            wall_ms: report.span.wall_ms,
            processes: run.processes.len(),
            estimated: functions.values().any(|f| f.estimated),
        };
        Ok(Side { recording, functions, loops, forms, note: report.note })
    }
}

/// Each instruction of `co` with what it had become in the snapshot `snap`.
fn forms_of(co: &CodeObject, header: &Header, snap: &[u8]) -> Vec<Form> {
    let names = &header.opcodes;
    instructions(co, header, 0, u32::MAX)
        .into_iter()
        .map(|off| {
            let op = co.bytecode[off as usize];
            let base = names.base.get(op as usize).copied().unwrap_or(op);
            let at_stop = snap
                .get(off as usize)
                .and_then(|&s| specialization(header, base, s).ok())
                .map(|s| names.name(s).into_owned());
            let line = co.positions.get(off as usize / 2).map_or(-1, |p| p.line);
            Form { line, base: names.name(base).into_owned(), at_stop }
        })
        .collect()
}

/// A function in both recordings.
#[derive(Debug, Serialize)]
pub struct FunctionChange {
    /// Qualified name.
    pub function: String,
    /// File (in the after recording).
    pub file: String,
    /// File in the before recording: `file`, unless the function was matched by its file's name (another
    /// checkout or environment).
    pub file_before: String,
    /// First line in each recording.
    pub line_before: u32,
    pub line_after: u32,
    /// Calls.
    pub calls_before: u64,
    pub calls_after: u64,
    /// Mean inclusive time per call, µs (null without calls).
    pub inclusive_us_before: Option<f64>,
    pub inclusive_us_after: Option<f64>,
    /// Change of the mean inclusive time per call, % (null if it was 0 or unknown).
    pub inclusive_change_pct: Option<f64>,
    /// Mean exclusive time per call, µs (null without calls).
    pub exclusive_us_before: Option<f64>,
    pub exclusive_us_after: Option<f64>,
    /// Change of the mean exclusive time per call, %.
    pub exclusive_change_pct: Option<f64>,
    /// Mean exclusive time per call after over before (2.0: twice as slow itself).
    pub factor: Option<f64>,
    /// Exclusive time in all, ms, and its change (after - before): the rows' order.
    pub exclusive_ms_before: f64,
    pub exclusive_ms_after: f64,
    pub exclusive_ms_change: f64,
    /// The figures of a recording are estimates (marked `~`).
    pub estimated_before: bool,
    pub estimated_after: bool,
}

/// A function in one recording only.
#[derive(Debug, Serialize)]
pub struct FunctionOnly {
    /// Qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// First line.
    pub line: u32,
    /// Calls.
    pub calls: u64,
    /// Mean inclusive and exclusive time per call, µs.
    pub inclusive_us: Option<f64>,
    pub exclusive_us: Option<f64>,
    /// Exclusive time in all, ms.
    pub exclusive_ms: f64,
    /// The figures are estimates.
    pub estimated: bool,
}

/// A loop in both recordings.
#[derive(Debug, Serialize)]
pub struct LoopChange {
    /// Its function's qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// The loop's first source line in each recording.
    pub line_before: i32,
    pub line_after: i32,
    /// Iterations recorded (executions of its backward jump).
    pub iterations_before: u64,
    pub iterations_after: u64,
    /// The de-instrumentation threshold stopped recording the loop: it ran more iterations than recorded
    /// (`>=` in the text); its time in all still counts them (`hot`'s unrecorded time).
    pub sampled_before: bool,
    pub sampled_after: bool,
    /// Time per iteration, ns, as `hot` gives it (null where nothing was measured; `-` in the text).
    pub ns_per_iteration_before: Option<f64>,
    pub ns_per_iteration_after: Option<f64>,
    /// Change of the time per iteration, %.
    pub change_pct: Option<f64>,
    /// Time in the loop, ms, and its change: the rows' order.
    pub total_ms_before: f64,
    pub total_ms_after: f64,
    pub total_ms_change: f64,
}

/// A loop in one recording only.
#[derive(Debug, Serialize)]
pub struct LoopOnly {
    /// Its function's qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// The loop's first source line.
    pub line: i32,
    /// Iterations recorded.
    pub iterations: u64,
    /// The threshold stopped recording the loop: it ran more iterations than recorded.
    pub sampled: bool,
    /// Time per iteration, ns (null where nothing was measured).
    pub ns_per_iteration: Option<f64>,
    /// Time in the loop, ms.
    pub total_ms: f64,
}

/// An instruction whose form at stop differs between the recordings.
#[derive(Debug, Serialize)]
pub struct SpecializationChange {
    /// Its function's qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// Source line (in the after recording).
    pub line: i32,
    /// Base opcode.
    pub base: String,
    /// What it ran as at stop, before and after (the base name when not specialized).
    pub before: String,
    pub after: String,
}

/// Rows `--top` left out, per list.
#[derive(Debug, Default, Serialize)]
pub struct LeftOut {
    pub functions: usize,
    pub new_functions: usize,
    pub vanished_functions: usize,
    pub loops: usize,
    pub new_loops: usize,
    pub vanished_loops: usize,
    pub specializations: usize,
}

/// What `diff` shows: the text form is [`fmt::Display`], the JSON form the module docs describe.
#[derive(Debug, Serialize)]
pub struct Diff {
    /// The recordings.
    pub before: Recording,
    pub after: Recording,
    /// Why the figures may not compare the same way.
    pub warnings: Vec<String>,
    /// What each recording's figures cover.
    pub notes: Vec<String>,
    pub functions: Vec<FunctionChange>,
    pub new_functions: Vec<FunctionOnly>,
    pub vanished_functions: Vec<FunctionOnly>,
    pub loops: Vec<LoopChange>,
    pub new_loops: Vec<LoopOnly>,
    pub vanished_loops: Vec<LoopOnly>,
    pub specializations: Vec<SpecializationChange>,
    pub left_out: LeftOut,
}

/// The file's name for messages: its last component ("run.ocl"), the whole path if it has none.
fn short(file: &str) -> String {
    Path::new(file).file_name().map_or_else(|| file.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Refuses recordings of different Python versions (unless `force`), and says what else differs.
fn compare(b: &Recording, a: &Recording, force: bool) -> anyhow::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let (bf, af) = (&b.file, &a.file);
    if b.python != a.python {
        let what = format!("{bf} was recorded with Python {} and {af} with Python {}", b.python, a.python);
        anyhow::ensure!(
            force,
            "{what}: bytecode, specialization and costs differ between versions, so the figures do not compare \
             (--force compares them anyway)"
        );
        warnings.push(format!("{what}: compared anyway (--force)"));
    }
    if b.mode != a.mode {
        warnings.push(format!(
            "{bf} was recorded in {} mode and {af} in {} mode: the recorder's cost and what it records differ, so \
             times do not compare the same way",
            b.mode, a.mode
        ));
    }
    // The threshold only changes what is recorded outside calls mode.
    let calls = Mode::Calls.name();
    if b.threshold != a.threshold && (b.mode != calls || a.mode != calls) {
        warnings.push(format!(
            "{bf} was recorded with threshold {} and {af} with threshold {}: calls, loops and estimates are \
             recorded differently, so figures do not compare the same way",
            b.threshold, a.threshold
        ));
    }
    // The same machine calibrates its clock to within a fraction of a percent.
    let tps_differ =
        (b.ticks_per_second - a.ticks_per_second).abs() > 0.02 * b.ticks_per_second.max(a.ticks_per_second);
    if b.platform != a.platform || b.clock != a.clock || tps_differ {
        let fact = |r: &Recording| format!("{}, {} clock at {:.3} GHz", r.platform, r.clock, r.ticks_per_second / 1e9);
        warnings.push(format!(
            "{bf} ({}) and {af} ({}) look recorded on different machines: times compare only as the machines do",
            fact(b),
            fact(a)
        ));
    }
    Ok(warnings)
}

/// `(after - before) / before` in %, if `before` is above 0.
/// A time per iteration, ns, or `-` where nothing was measured (never a 0.0 that looks measured).
fn per_iteration(ns: Option<f64>) -> String {
    ns.map_or_else(|| "-".to_string(), |ns| format!("{ns:.1}"))
}

fn change_pct(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => Some((a - b) / b * 100.0),
        _ => None,
    }
}

/// The comparison of `before` with `after`, at most `top` rows per list. Different Python versions are
/// refused unless `force`.
pub fn diff(mut before: Side, after: Side, top: usize, force: bool) -> anyhow::Result<Diff> {
    let warnings = compare(&before.recording, &after.recording, force)?;
    let moved = match_moved(&mut before, &after);
    let mut notes = Vec::new();
    if let Some((new, old)) = moved.iter().min() {
        notes.push(format!(
            "{} function{} matched by file name and qualified name, their files' directories differing ({} -> {}{})",
            moved.len(),
            if moved.len() == 1 { "" } else { "s" },
            old,
            new.0,
            if moved.len() > 1 { ", ..." } else { "" }
        ));
    }
    if before.recording.estimated || after.recording.estimated {
        // Two estimates differ by their windows' luck as well as by the change: two default-mode runs of one
        // program read 44,448 and 129,182 calls of one function.
        notes.push(
            "figures marked ~ are default-mode estimates, which differ between two runs of the same program \
             too: compare recordings made with --mode calls (exact calls and times) to measure a change"
                .to_string(),
        );
    }
    for (which, s) in [("before", &before), ("after", &after)] {
        if let Some(n) = &s.note {
            notes.extend(n.split("\nnote: ").map(|n| format!("{which} ({}): {n}", short(&s.recording.file))));
        }
    }
    let mut left_out = LeftOut::default();

    let mut functions = Vec::new();
    let mut vanished = Vec::new();
    for (key, b) in &before.functions {
        let Some(a) = after.functions.get(key) else {
            vanished.push(only(key, b));
            continue;
        };
        let (ib, ia) = (b.per_call_us(b.inclusive_ms), a.per_call_us(a.inclusive_ms));
        let (xb, xa) = (b.per_call_us(b.exclusive_ms), a.per_call_us(a.exclusive_ms));
        functions.push(FunctionChange {
            function: key.1.clone(),
            file: key.0.clone(),
            file_before: moved.get(key).cloned().unwrap_or_else(|| key.0.clone()),
            line_before: b.line,
            line_after: a.line,
            calls_before: b.calls,
            calls_after: a.calls,
            inclusive_us_before: ib,
            inclusive_us_after: ia,
            inclusive_change_pct: change_pct(ib, ia),
            exclusive_us_before: xb,
            exclusive_us_after: xa,
            exclusive_change_pct: change_pct(xb, xa),
            factor: match (xb, xa) {
                (Some(b), Some(a)) if b > 0.0 => Some(a / b),
                _ => None,
            },
            exclusive_ms_before: b.exclusive_ms,
            exclusive_ms_after: a.exclusive_ms,
            exclusive_ms_change: a.exclusive_ms - b.exclusive_ms,
            estimated_before: b.estimated,
            estimated_after: a.estimated,
        });
    }
    let mut new: Vec<FunctionOnly> =
        after.functions.iter().filter(|(k, _)| !before.functions.contains_key(*k)).map(|(k, f)| only(k, f)).collect();
    functions.sort_by(|x, y| {
        y.exclusive_ms_change
            .abs()
            .total_cmp(&x.exclusive_ms_change.abs())
            .then_with(|| (&x.function, &x.file).cmp(&(&y.function, &y.file)))
    });
    for list in [&mut new, &mut vanished] {
        list.sort_by(|x, y| y.exclusive_ms.total_cmp(&x.exclusive_ms).then_with(|| x.function.cmp(&y.function)));
    }
    // Specializations in the order of the functions' exclusive time after, hottest first.
    let mut hottest: Vec<(Key, f64)> =
        functions.iter().map(|f| ((f.file.clone(), f.function.clone()), f.exclusive_ms_after)).collect();
    hottest.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let mut specializations = Vec::new();
    for (key, _) in &hottest {
        if let (Some(b), Some(a)) = (before.forms.get(key), after.forms.get(key)) {
            specialization_changes(key, b, a, &mut specializations);
        }
    }

    let (loops, new_loops, vanished_loops) = match_loops(&before, &after);

    left_out.functions = cut(&mut functions, top);
    left_out.new_functions = cut(&mut new, top);
    left_out.vanished_functions = cut(&mut vanished, top);
    let (mut loops, mut new_loops, mut vanished_loops) = (loops, new_loops, vanished_loops);
    left_out.loops = cut(&mut loops, top);
    left_out.new_loops = cut(&mut new_loops, top);
    left_out.vanished_loops = cut(&mut vanished_loops, top);
    left_out.specializations = cut(&mut specializations, top);
    Ok(Diff {
        before: before.recording,
        after: after.recording,
        warnings,
        notes,
        functions,
        new_functions: new,
        vanished_functions: vanished,
        loops,
        new_loops,
        vanished_loops,
        specializations,
        left_out,
    })
}

/// Matches the functions left without a match by file and qualified name by their file's name (its last
/// component) and qualified name, where that names one function on each side: the same program run from
/// another checkout or environment. Such functions of `before` take the key of their match in `after`
/// (loops and snapshots too). Returns the before file of each, by its after key.
fn match_moved(before: &mut Side, after: &Side) -> HashMap<Key, String> {
    let lone = |s: &Side, other: &Side| {
        let mut m: HashMap<Key, Vec<Key>> = HashMap::default();
        for k in s.functions.keys().filter(|k| !other.functions.contains_key(*k)) {
            m.entry((short(&k.0), k.1.clone())).or_default().push(k.clone());
        }
        m
    };
    let (b, a) = (lone(before, after), lone(after, before));
    let mut moved = HashMap::default();
    for (name, olds) in b {
        let (Some(news), [old]) = (a.get(&name), olds.as_slice()) else { continue };
        let [new] = news.as_slice() else { continue };
        if let Some(f) = before.functions.remove(old) {
            before.functions.insert(new.clone(), f);
        }
        if let Some(f) = before.forms.remove(old) {
            before.forms.insert(new.clone(), f);
        }
        for l in before.loops.iter_mut().filter(|l| &l.key == old) {
            l.key = new.clone();
        }
        moved.insert(new.clone(), old.0.clone());
    }
    moved
}

/// Keeps the first `top` of `v`; returns how many it dropped.
fn cut<T>(v: &mut Vec<T>, top: usize) -> usize {
    let more = v.len().saturating_sub(top);
    v.truncate(top);
    more
}

fn only(key: &Key, f: &Func) -> FunctionOnly {
    FunctionOnly {
        function: key.1.clone(),
        file: key.0.clone(),
        line: f.line,
        calls: f.calls,
        inclusive_us: f.per_call_us(f.inclusive_ms),
        exclusive_us: f.per_call_us(f.exclusive_ms),
        exclusive_ms: f.exclusive_ms,
        estimated: f.estimated,
    }
}

/// The instructions of one function whose forms at stop differ (see the module docs for the pairing).
fn specialization_changes(key: &Key, before: &[Form], after: &[Form], out: &mut Vec<SpecializationChange>) {
    let mut push = |b: &Form, a: &Form| {
        if let (Some(sb), Some(sa)) = (&b.at_stop, &a.at_stop) {
            if sb != sa {
                out.push(SpecializationChange {
                    function: key.1.clone(),
                    file: key.0.clone(),
                    line: a.line,
                    base: a.base.clone(),
                    before: sb.clone(),
                    after: sa.clone(),
                });
            }
        }
    };
    let same_code = before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.base == a.base);
    if same_code {
        for (b, a) in before.iter().zip(after) {
            push(b, a);
        }
        return;
    }
    // The n-th instruction of a (line, base opcode) with the n-th.
    let mut by_line: HashMap<(i32, &str), Vec<&Form>> = HashMap::default();
    for b in before {
        by_line.entry((b.line, b.base.as_str())).or_default().push(b);
    }
    let mut seen: HashMap<(i32, &str), usize> = HashMap::default();
    for a in after {
        let k = (a.line, a.base.as_str());
        let n = seen.entry(k).or_default();
        if let Some(b) = by_line.get(&k).and_then(|v| v.get(*n)) {
            push(b, a);
        }
        *n += 1;
    }
}

/// Pairs the loops of functions in both recordings: by first line, then the rest in order of offset when
/// as many are left on both sides. Returns the pairs by the absolute change of their time, and the loops
/// only after and only before, by time.
fn match_loops(before: &Side, after: &Side) -> (Vec<LoopChange>, Vec<LoopOnly>, Vec<LoopOnly>) {
    let group = |s: &Side| {
        let mut m: HashMap<Key, Vec<Loop>> = HashMap::default();
        for l in &s.loops {
            m.entry(l.key.clone()).or_default().push(l.clone());
        }
        for v in m.values_mut() {
            v.sort_by_key(|l| (l.head, l.line));
        }
        m
    };
    let (mut gb, mut ga) = (group(before), group(after));
    let mut pairs = Vec::new();
    let mut only_after = Vec::new();
    let mut only_before = Vec::new();
    let mut keys: Vec<Key> = gb.keys().chain(ga.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let mut b = gb.remove(&key).unwrap_or_default();
        let mut a = ga.remove(&key).unwrap_or_default();
        if before.functions.contains_key(&key) && after.functions.contains_key(&key) {
            let mut i = 0;
            while i < b.len() {
                match a.iter().position(|x| x.line == b[i].line) {
                    Some(j) => pairs.push((b.remove(i), a.remove(j))),
                    None => i += 1,
                }
            }
            if a.len() == b.len() {
                pairs.extend(b.drain(..).zip(a.drain(..)));
            }
        }
        only_before.extend(b);
        only_after.extend(a);
    }
    let mut changes: Vec<LoopChange> = pairs
        .into_iter()
        .map(|(b, a)| LoopChange {
            function: a.key.1.clone(),
            file: a.key.0.clone(),
            line_before: b.line,
            line_after: a.line,
            iterations_before: b.iterations,
            iterations_after: a.iterations,
            sampled_before: b.sampled,
            sampled_after: a.sampled,
            ns_per_iteration_before: b.ns_per_iteration,
            ns_per_iteration_after: a.ns_per_iteration,
            change_pct: change_pct(b.ns_per_iteration, a.ns_per_iteration),
            total_ms_before: b.total_ms,
            total_ms_after: a.total_ms,
            total_ms_change: a.total_ms - b.total_ms,
        })
        .collect();
    changes.sort_by(|x, y| {
        y.total_ms_change
            .abs()
            .total_cmp(&x.total_ms_change.abs())
            .then_with(|| (&x.function, x.line_after).cmp(&(&y.function, y.line_after)))
    });
    let lone = |v: Vec<Loop>| {
        let mut out: Vec<LoopOnly> = v
            .into_iter()
            .map(|l| LoopOnly {
                function: l.key.1,
                file: l.key.0,
                line: l.line,
                iterations: l.iterations,
                sampled: l.sampled,
                ns_per_iteration: l.ns_per_iteration,
                total_ms: l.total_ms,
            })
            .collect();
        out.sort_by(|x, y| {
            y.total_ms.total_cmp(&x.total_ms).then_with(|| (&x.function, x.line).cmp(&(&y.function, y.line)))
        });
        out
    };
    (changes, lone(only_after), lone(only_before))
}

/// Iterations recorded, ">=N" when the threshold stopped recording the loop.
fn iterations(n: u64, sampled: bool) -> String {
    if sampled {
        format!(">={n}")
    } else {
        n.to_string()
    }
}

/// "+100.0%", "-3.2%"; "-" when unknown.
fn pct(p: Option<f64>) -> String {
    p.map_or_else(|| "-".into(), |p| format!("{p:+.1}%"))
}

/// A figure with `~` before it when it is an estimate; "-" when unknown.
fn fig(v: Option<f64>, decimals: usize, estimated: bool) -> String {
    let m = if estimated { "~" } else { "" };
    v.map_or_else(|| "-".into(), |v| format!("{m}{v:.decimals$}"))
}

impl fmt::Display for Recording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = if self.processes > 1 { format!("run of {} processes, ", self.processes) } else { String::new() };
        let estimated = if self.estimated { ", figures estimated (~)" } else { "" };
        write!(f, "{}: {run}{} mode, Python {}, {:.3} ms{estimated}", self.file, self.mode, self.python, self.wall_ms)
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "before  {}\nafter   {}", self.before, self.after)?;
        writeln!(
            f,
            "us per call: mean time per call, the recorder's cost subtracted; factor: exclusive us per call after / \
             before"
        )?;

        writeln!(f, "\nfunctions in both, by the change of their exclusive time, biggest first")?;
        if self.functions.is_empty() {
            writeln!(f, "  none")?;
        } else {
            writeln!(
                f,
                "{:>10} {:>10} {:>12} {:>12} {:>9} {:>12} {:>12} {:>9} {:>8} {:>12}  function  file:line",
                "calls", "calls", "incl us", "incl us", "incl", "excl us", "excl us", "excl", "excl", "excl ms"
            )?;
            writeln!(
                f,
                "{:>10} {:>10} {:>12} {:>12} {:>9} {:>12} {:>12} {:>9} {:>8} {:>12}",
                "before", "after", "before", "after", "change", "before", "after", "change", "factor", "change"
            )?;
            for r in &self.functions {
                let (eb, ea) = (r.estimated_before, r.estimated_after);
                let line = if r.line_before == r.line_after {
                    r.line_after.to_string()
                } else {
                    format!("{}->{}", r.line_before, r.line_after)
                };
                writeln!(
                    f,
                    "{:>10} {:>10} {:>12} {:>12} {:>9} {:>12} {:>12} {:>9} {:>8} {:>12}  {}  {}:{line}",
                    format!("{}{}", if eb { "~" } else { "" }, r.calls_before),
                    format!("{}{}", if ea { "~" } else { "" }, r.calls_after),
                    fig(r.inclusive_us_before, 3, eb),
                    fig(r.inclusive_us_after, 3, ea),
                    pct(r.inclusive_change_pct),
                    fig(r.exclusive_us_before, 3, eb),
                    fig(r.exclusive_us_after, 3, ea),
                    pct(r.exclusive_change_pct),
                    r.factor.map_or_else(|| "-".into(), |x| format!("{}{x:.2}x", if eb || ea { "~" } else { "" })),
                    format!("{}{:+.3}", if eb || ea { "~" } else { "" }, r.exclusive_ms_change),
                    r.function,
                    r.file
                )?;
            }
        }
        more(f, self.left_out.functions)?;
        for (title, rows, n) in [
            ("new functions (only in after)", &self.new_functions, self.left_out.new_functions),
            ("vanished functions (only in before)", &self.vanished_functions, self.left_out.vanished_functions),
        ] {
            if rows.is_empty() {
                continue;
            }
            writeln!(f, "\n{title}")?;
            writeln!(f, "{:>10} {:>12} {:>12} {:>12}  function  file:line", "calls", "incl us", "excl us", "excl ms")?;
            for r in rows {
                let e = r.estimated;
                writeln!(
                    f,
                    "{:>10} {:>12} {:>12} {:>12}  {}  {}:{}",
                    format!("{}{}", if e { "~" } else { "" }, r.calls),
                    fig(r.inclusive_us, 3, e),
                    fig(r.exclusive_us, 3, e),
                    fig(Some(r.exclusive_ms), 3, e),
                    r.function,
                    r.file,
                    r.line
                )?;
            }
            more(f, n)?;
        }

        let no_loops = self.loops.is_empty() && self.new_loops.is_empty() && self.vanished_loops.is_empty();
        if no_loops {
            let calls = Mode::Calls.name();
            let why = if self.before.mode == calls || self.after.mode == calls {
                " (calls mode records no jumps, so no loops are found)"
            } else {
                ""
            };
            writeln!(f, "\nloops: none{why}")?;
        } else {
            writeln!(
                f,
                "\nloops in both, by the change of the time in them, biggest first (>=: the threshold stopped \
                 recording the loop)"
            )?;
            if self.loops.is_empty() {
                writeln!(f, "  none")?;
            } else {
                writeln!(
                    f,
                    "{:>10} {:>10} {:>11} {:>11} {:>9} {:>12}  function  file:line",
                    "iterations", "iterations", "ns/iter", "ns/iter", "", "total ms"
                )?;
                writeln!(
                    f,
                    "{:>10} {:>10} {:>11} {:>11} {:>9} {:>12}",
                    "before", "after", "before", "after", "change", "change"
                )?;
                for l in &self.loops {
                    let line = if l.line_before == l.line_after {
                        l.line_after.to_string()
                    } else {
                        format!("{}->{}", l.line_before, l.line_after)
                    };
                    writeln!(
                        f,
                        "{:>10} {:>10} {:>11} {:>11} {:>9} {:>12}  {}  {}:{line}",
                        iterations(l.iterations_before, l.sampled_before),
                        iterations(l.iterations_after, l.sampled_after),
                        per_iteration(l.ns_per_iteration_before),
                        per_iteration(l.ns_per_iteration_after),
                        pct(l.change_pct),
                        format!("{:+.3}", l.total_ms_change),
                        l.function,
                        l.file
                    )?;
                }
            }
            more(f, self.left_out.loops)?;
            for (title, rows, n) in [
                ("new loops (only in after)", &self.new_loops, self.left_out.new_loops),
                ("vanished loops (only in before)", &self.vanished_loops, self.left_out.vanished_loops),
            ] {
                if rows.is_empty() {
                    continue;
                }
                writeln!(f, "\n{title}")?;
                writeln!(f, "{:>10} {:>11} {:>12}  function  file:line", "iterations", "ns/iter", "total ms")?;
                for l in rows {
                    writeln!(
                        f,
                        "{:>10} {:>11} {:>12.3}  {}  {}:{}",
                        iterations(l.iterations, l.sampled),
                        per_iteration(l.ns_per_iteration),
                        l.total_ms,
                        l.function,
                        l.file,
                        l.line
                    )?;
                }
                more(f, n)?;
            }
        }

        if self.specializations.is_empty() {
            writeln!(f, "\nspecialization at stop: no instruction changed in the functions of both")?;
        } else {
            writeln!(f, "\nspecialization at stop that changed (functions in both, hottest first)")?;
            writeln!(f, "{:>6}  {:<24} {:<32} {:<32} function  file", "line", "base", "before", "after")?;
            for s in &self.specializations {
                writeln!(
                    f,
                    "{:>6}  {:<24} {:<32} {:<32} {}  {}",
                    s.line, s.base, s.before, s.after, s.function, s.file
                )?;
            }
            more(f, self.left_out.specializations)?;
        }
        if !self.notes.is_empty() {
            writeln!(f)?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

fn more(f: &mut fmt::Formatter<'_>, n: usize) -> fmt::Result {
    if n > 0 {
        writeln!(f, "... {n} more (use --top)")?;
    }
    Ok(())
}
