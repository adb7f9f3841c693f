//! `stats --lines`: time and hits per source line, from the jump and branch events (adaptive mode) or the
//! instruction events (precise mode) a trace already holds. A pass of its own over the events, apart from
//! [`crate::analysis`]'s, so `stats` without `--lines` costs nothing more.
//!
//! How a line gets its figures:
//! - A **run** is what one frame executed between two of its recorded events: from where the first left
//!   it (a jump's or branch's destination, the offset a frame started or resumed at, an instruction's own
//!   offset in precise mode) to the second's location (a jump, branch, return or yield: inclusive; the next
//!   instruction in precise mode: exclusive). Its time is the time between the two events less the
//!   recorder's calibrated cost of every event in between (as `analysis` corrects functions and loops), and
//!   less the time of the Python calls recorded in between (a callee's time is not the line's own; it is
//!   kept apart as "with callees").
//! - The time is split over the run's instructions by their count, and each instruction's share goes to
//!   its line: exact per run, an estimate within it (one instruction costs more than another).
//! - A line's **hits** are the runs that passed through it, counted once per run, and not again when the
//!   next run goes on forward on the same line (a branch that did not jump): the way CPython's LINE
//!   events count a line.
//! - A run is placed on lines only when it is known to be straight: no jump, branch (or, between windows,
//!   call) among its instructions before its last. With a threshold, the recorder stops recording a
//!   location after N hits, and between windows (FORMAT.md 5.3) calls and returns are not recorded: the
//!   time of runs that cross a silent location is not placed (counted as "unplaced" per function), and
//!   the lines of a function whose locations went silent, that ran between windows, or that has unplaced
//!   time are marked estimated: their figures hold the recorded runs only, lower bounds.
//! - `calls` mode records no location inside a function: it gives no lines (the caller refuses).
//!
//! Memory: one stack per thread and one accumulator per distinct run (code object, start, end), which
//! are few; the runs are spread over lines when the pass ends.

use crate::walk::{Frames, Step, Walk};
use ocular_format::{Body, CodeObject, EventKind, Header, Mode, ReadOptions, Reader};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// No offset (a run with no previous run in its frame).
const NONE: u32 = u32::MAX;

/// A run's end is the next instruction (precise mode), not included.
const EXCLUSIVE: u8 = 1;
/// The run is its first instruction alone (precise mode with threshold 0: every instruction recorded).
const SINGLE: u8 = 2;
/// Recorded between windows, where calls are not: a call among its instructions hides its callee's time.
const GAP: u8 = 4;

/// Figures of one line of one code object in one process.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LineStat {
    /// Process id (0 in a run's lines merged over its processes).
    pub pid: u32,
    /// Source file.
    pub file: String,
    /// Line number.
    pub line: u32,
    /// The code object's qualified name.
    pub function: String,
    /// Runs through the line (see the module's docs).
    pub hits: u64,
    /// Time in the line itself, ns (recorder cost and recorded callees removed).
    pub own_ns: f64,
    /// Time in the line with the Python functions it called, ns.
    pub with_callees_ns: f64,
    /// The figures hold the recorded runs only (the threshold silenced the function's locations, it ran
    /// between windows, or some of its time could not be placed on a line): lower bounds.
    pub estimated: bool,
}

/// The lines of one trace.
#[derive(Debug, Default)]
pub struct Lines {
    /// The process id.
    pub pid: u32,
    /// The recording's mode (`calls` gives no lines).
    pub mode: Option<Mode>,
    /// Every line with a run, in no particular order.
    pub lines: Vec<LineStat>,
    /// Time of frames the pass could not place on lines, ns (see the module's docs).
    pub unplaced_ns: f64,
    /// Time placed on lines (own), ns.
    pub placed_ns: f64,
    /// Of `placed_ns`, the runs that crossed a silenced jump or branch, spread over the instructions between
    /// their events as if straight (an estimate), ns.
    pub spread_ns: f64,
    /// Functions (qualified names) with lines marked estimated, and why, for the note.
    pub estimated_functions: usize,
    /// Locations the threshold silenced (recorded `threshold` times).
    pub silenced: usize,
    /// The recording has later windows (function boundaries recorded in windows only).
    pub windowed: bool,
    /// Reader warnings.
    pub warnings: Vec<String>,
}

impl Lines {
    /// Whether the mode records locations inside functions.
    pub fn has_lines(&self) -> bool {
        matches!(self.mode, Some(Mode::Adaptive | Mode::Precise))
    }
}

/// One frame of a thread's stack, as this pass follows it.
struct Frame {
    code: u32,
    /// Where the current run started (`None`: not known, e.g. a frame found between windows).
    start: Option<u32>,
    /// The last instruction of the frame's previous run, for hits (`NONE`: none).
    prev_last: u32,
    /// The tick and the thread's running cost when the current stretch of the run began (the run's
    /// start, or the return of a callee).
    mark: (u64, f64),
    /// The run's own ticks so far, corrected.
    own: f64,
    /// The same with callees.
    total: f64,
    /// The run spans time the pass cannot account for (a callee that was not recorded, a gap).
    tainted: bool,
    /// A recorded callee runs since this tick and running cost.
    callee: Option<(u64, f64)>,
    /// The run began between windows (calls in it were not recorded).
    in_gap: bool,
    /// A frame of the same code is open below this one (recursion, direct or through other functions):
    /// the outer frame's run that made the call holds this frame's whole time with callees, on the line it
    /// called from, so this frame's runs add none (recursion counted once, as a function's inclusive time;
    /// their own time still counts, and a line's time with callees is at least its own).
    nested: bool,
}

impl Frame {
    fn new(code: u32, start: Option<u32>, t: u64, now: f64) -> Self {
        Frame {
            code,
            start,
            prev_last: NONE,
            mark: (t, now),
            own: 0.0,
            total: 0.0,
            tainted: false,
            callee: None,
            in_gap: false,
            nested: false,
        }
    }

    /// A frame of `code` pushed onto `stack`.
    fn on(stack: &[Frame], code: u32, start: Option<u32>, t: u64, now: f64) -> Self {
        Frame { nested: stack.iter().any(|f| f.code == code), ..Frame::new(code, start, t, now) }
    }

    /// Adds the time from the mark to `t` to the run.
    fn catch_up(&mut self, t: u64, now: f64) {
        let d = t.saturating_sub(self.mark.0) as f64 - (now - self.mark.1);
        self.own += d;
        self.total += d;
        self.mark = (t, now);
    }
}

struct Thread {
    stack: Vec<Frame>,
    /// Sum of the recorder's cost of the thread's events so far, ticks.
    cost: f64,
    /// Windows, their stacks and the recorder's pauses.
    walk: Walk,
}

/// A thread's frames and the pass, as the walk moves them.
struct Moves<'a> {
    stack: &'a mut Vec<Frame>,
    pass: &'a mut Pass,
}

impl Frames for Moves<'_> {
    fn depth(&self) -> usize {
        self.stack.len()
    }

    fn code(&self, i: usize) -> u32 {
        self.stack[i].code
    }

    fn lose_above(&mut self, depth: usize, _t: u64) {
        truncate(self.stack, depth, self.pass);
    }
}

/// A run's identity: code id, start, end, the previous run's last instruction, flags.
type RunKey = (u32, u32, u32, u32, u8);

/// What the pass gathers before the runs are spread over lines.
#[derive(Default)]
struct Pass {
    /// Per distinct run: own ticks, ticks with callees, times run.
    runs: HashMap<RunKey, (f64, f64, u64)>,
    /// Per code id: ticks that could not be placed.
    unplaced: HashMap<u32, f64>,
    /// Per location event (code id, offset): times recorded.
    hits: HashMap<(u32, u32), u32>,
    /// Per loop head (code id, backward jumps' destination): its backward jumps recorded.
    heads: HashMap<(u32, u32), u32>,
    /// Per code id, the backward jumps recorded: (jump's offset, destination).
    back_jumps: HashMap<u32, HashSet<(u32, u32)>>,
    /// Code ids seen between windows.
    in_gap: HashSet<u32>,
    /// Precise mode with threshold 0: every instruction recorded, a run is one instruction.
    single: bool,
}

impl Pass {
    /// Ends `f`'s current run at `end` (`flags`: how to read it) and starts the next at `next`.
    fn close(&mut self, f: &mut Frame, end: u32, flags: u8, gap: bool, next: Option<u32>) {
        match f.start {
            Some(start) if !f.tainted => {
                let key = (f.code, start, end, f.prev_last, flags | if gap || f.in_gap { GAP } else { 0 });
                let r = self.runs.entry(key).or_default();
                r.0 += f.own;
                if !f.nested {
                    r.1 += f.total;
                }
                r.2 += 1;
                f.prev_last = if flags & SINGLE != 0 {
                    start
                } else if flags & EXCLUSIVE != 0 {
                    // The code unit before the next instruction is on the last instruction's line (an
                    // instruction's inline caches share its position).
                    end.saturating_sub(2)
                } else {
                    end
                };
            }
            _ => {
                *self.unplaced.entry(f.code).or_default() += f.own;
                f.prev_last = NONE;
            }
        }
        f.start = next;
        f.own = 0.0;
        f.total = 0.0;
        f.tainted = false;
        f.in_gap = gap;
    }

    /// A frame ended without its return recorded: its run's time so far is not placed.
    fn lose(&mut self, f: &Frame) {
        *self.unplaced.entry(f.code).or_default() += f.own;
    }
}

/// Pops the frames above `depth`, whose ends were not recorded; the frame left on top spans time it
/// cannot account for.
fn truncate(stack: &mut Vec<Frame>, depth: usize, pass: &mut Pass) {
    if stack.len() <= depth {
        return;
    }
    while stack.len() > depth {
        let f = stack.pop().expect("longer than depth");
        pass.lose(&f);
    }
    if let Some(top) = stack.last_mut() {
        top.tainted = true;
        top.callee = None;
    }
}

/// Reads `path` once and gathers time and hits per line.
pub fn analyze(path: &Path, opts: ReadOptions) -> ocular_format::Result<Lines> {
    let r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let mut out = Lines { pid: header.pid, mode: Some(header.options.mode), ..Lines::default() };
    if !out.has_lines() {
        // Nothing of the file past its header was read: nothing to warn about (its report would say it has
        // no trailer, which is only that it was not read to the end).
        return Ok(out);
    }
    // Decoded ahead on a thread of its own.
    let mut r = ocular_format::Prefetch::new(r)?;
    let mut cost = ocular_format::cost_table(header.event_cost_ticks, None);
    // The stop's calibration comes after the events it applies to (FORMAT.md 6.6).
    let stop = crate::analysis::read_samples(path, opts, &header)?.stop_calibration;
    let threshold = header.options.deinstrument_threshold;
    let precise = header.options.mode == Mode::Precise;
    let mut pass = Pass { single: precise && threshold == 0, ..Pass::default() };
    let mut threads: HashMap<u64, Thread> = HashMap::default();
    let mut code: HashMap<u32, CodeObject> = HashMap::default();
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Events(evs) => {
                let th = threads.entry(c.info.thread_id).or_insert_with(|| Thread {
                    stack: Vec::new(),
                    cost: 0.0,
                    walk: Walk::new(header.ticks_per_second),
                });
                for e in evs {
                    step(th, e, &cost, &mut pass, &mut out.windowed);
                }
            }
            Body::Code(objs) => {
                for o in objs {
                    code.insert(o.id, o);
                }
            }
            Body::Calibration(c) if c.is_stop() => {}
            Body::Calibration(c) => {
                cost = ocular_format::cost_table_at_speed(header.event_cost_ticks, &c, stop.as_ref()).0;
            }
            _ => {}
        }
    }
    // Frames still open at the end: their last runs were not closed by an event.
    for th in threads.values() {
        for f in &th.stack {
            pass.lose(f);
        }
    }
    out.warnings = r.finish().report().warnings(&path.display().to_string());
    finish(&mut out, pass, &code, &header, threshold);
    Ok(out)
}

/// One event of a thread.
#[inline]
fn step(th: &mut Thread, e: &ocular_format::RawEvent, cost: &[f64; 256], pass: &mut Pass, windowed: &mut bool) {
    let t = e.ticks.get();
    let id = e.code.get();
    let off = e.offset.get();
    let step = th.walk.step(&mut Moves { stack: &mut th.stack, pass }, e);
    if step == Step::Pause {
        return; // taken out with the cost of the event after the next
    }
    // The recorder's pauses are its time, taken out of the run they fell in as the events' own cost is.
    th.cost += th.walk.paused() as f64;
    if step == Step::Unknown {
        return;
    }
    th.cost += th.walk.cost(e, cost);
    let now = th.cost;
    let gap = th.walk.gap();
    match step {
        Step::Opened { len_us, .. } => *windowed |= len_us != u32::MAX,
        Step::Found { same: false, .. } => {
            if let Some(top) = th.stack.last_mut() {
                top.tainted = true;
            }
            th.stack.push(Frame::on(&th.stack, id, None, t, now));
        }
        Step::Enter(_) => {
            if let Some(top) = th.stack.last_mut() {
                top.catch_up(t, now);
                top.callee = Some((t, now));
            }
            th.stack.push(Frame::on(&th.stack, id, Some(off), t, now));
        }
        Step::Exit(_) => {
            let mut f = th.stack.pop().expect("the walk found it on top");
            f.catch_up(t, now);
            pass.close(&mut f, off, 0, gap, None);
            if let Some(parent) = th.stack.last_mut() {
                if let Some((ct, cc)) = parent.callee.take() {
                    parent.total += t.saturating_sub(ct) as f64 - (now - cc);
                }
                parent.mark = (t, now);
            }
        }
        Step::Location { kind, enter } => {
            if kind == EventKind::JUMP && e.arg.get() < off {
                // A loop's backward jumps are recorded for twice the threshold, counted per loop head.
                *pass.heads.entry((id, e.arg.get())).or_default() += 1;
                pass.back_jumps.entry(id).or_default().insert((off, e.arg.get()));
            } else {
                *pass.hits.entry((id, off)).or_default() += 1;
            }
            if gap {
                pass.in_gap.insert(id);
            }
            if enter {
                // Called unrecorded (between windows, or lost): its time so far is not its run's.
                if let Some(top) = th.stack.last_mut() {
                    top.catch_up(t, now);
                    top.tainted = true;
                }
                th.stack.push(Frame::on(&th.stack, id, None, t, now));
            }
            let f = th.stack.last_mut().expect("on top");
            f.catch_up(t, now);
            if kind == EventKind::INSTRUCTION {
                let flags = if pass.single { EXCLUSIVE | SINGLE } else { EXCLUSIVE };
                pass.close(f, off, flags, gap, Some(off));
            } else {
                pass.close(f, off, 0, gap, Some(e.arg.get()));
            }
        }
        _ => {}
    }
}

/// How an opcode bears on runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Plain,
    /// A jump or branch: control may not go on to the next instruction.
    Transfer,
    /// A call: a callee may run.
    Call,
}

fn classify(name: &str) -> Op {
    if name.contains("JUMP") || name.starts_with("FOR_ITER") || name == "SEND" {
        Op::Transfer
    } else if name.starts_with("CALL") && !name.starts_with("CALL_INTRINSIC") {
        Op::Call
    } else {
        Op::Plain
    }
}

/// Spreads the runs over lines.
fn finish(out: &mut Lines, pass: Pass, code: &HashMap<u32, CodeObject>, header: &Header, threshold: u32) {
    let tps = header.ticks_per_second.max(1.0);
    let ns = |ticks: f64| ticks * 1e9 / tps;
    // Per code id: the instructions' offsets and kinds.
    let mut shapes: HashMap<u32, (Vec<u32>, Vec<Op>)> = HashMap::default();
    let mut shape = |id: u32| -> Option<(Vec<u32>, Vec<Op>)> {
        if let Some(s) = shapes.get(&id) {
            return Some(s.clone());
        }
        let co = code.get(&id)?;
        let offsets = crate::analysis::instructions(co, header, 0, u32::MAX);
        let ops = offsets.iter().map(|&o| classify(&header.opcodes.name(co.bytecode[o as usize]))).collect();
        shapes.insert(id, (offsets, ops));
        shapes.get(&id).cloned()
    };
    let line_of = |co: &CodeObject, o: u32| co.positions.get(o as usize / 2).map_or(-1, |p| p.line);
    let mut unplaced = pass.unplaced;
    // Per (code id, line): own ticks, ticks with callees, hits.
    let mut acc: HashMap<(u32, i32), (f64, f64, u64)> = HashMap::default();
    let mut lines: Vec<(i32, usize)> = Vec::new();
    // Runs across a silenced jump or branch, spread as if straight: their code ids and ticks.
    let mut spread: HashSet<u32> = HashSet::default();
    let mut spread_ticks = 0.0;
    let back_jumps = pass.back_jumps;
    for ((id, start, end, prev_last, flags), (own, total, runs)) in pass.runs {
        let placed = (|| {
            let co = code.get(&id)?;
            let (offsets, ops) = shape(id)?;
            let lo = offsets.binary_search(&start).ok()?;
            let hi = if flags & SINGLE != 0 {
                lo
            } else if flags & EXCLUSIVE != 0 {
                // The instructions before `end`.
                offsets.partition_point(|&o| o < end).checked_sub(1)?
            } else {
                offsets.binary_search(&end).ok()?
            };
            if hi < lo {
                return None;
            }
            // Between windows a call's callee is not recorded: its time is in the run's, which then is not
            // the lines' own.
            if flags & GAP != 0 && ops[lo..=hi].contains(&Op::Call) {
                return None;
            }
            // Straight: no jump or branch before the last instruction. One there was silenced by the
            // threshold (else it would have been recorded): where control went is not known. Such a run is
            // spread over the instructions between its events as if they ran once, no jump taken (one loop
            // iteration whose branch went quiet, typically): an estimate.
            // If the run holds a loop's backward jump (seen recorded before it went quiet), the loop ran
            // over and over in it: its time is spread over the loop's body, not the lines around it that ran
            // once.
            let mut body: Vec<u32> = Vec::new();
            if ops[lo..hi].contains(&Op::Transfer) {
                spread_ticks += own;
                spread.insert(id);
                let (first, last) = (offsets[lo], offsets[hi]);
                // The innermost such loop: an outer loop's body holds other loops that ran their own runs.
                let inner = back_jumps
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .filter(|&&(j, _)| first <= j && j <= last)
                    .min_by_key(|&&(j, t)| j.saturating_sub(t));
                if let Some(&(j, t)) = inner {
                    body.extend(offsets.iter().copied().filter(|&o| t <= o && o <= j));
                }
            }
            let run = if body.is_empty() { &offsets[lo..=hi] } else { &body[..] };
            lines.clear();
            for &o in run {
                let l = line_of(co, o);
                if l < 0 {
                    continue;
                }
                match lines.iter_mut().find(|x| x.0 == l) {
                    Some(x) => x.1 += 1,
                    None => lines.push((l, 1)),
                }
            }
            let n: usize = lines.iter().map(|x| x.1).sum();
            if n == 0 {
                return None;
            }
            // Going on forward on the line the previous run ended on is not a new hit of it.
            let first = line_of(co, start);
            let goes_on = prev_last != NONE && start > prev_last && line_of(co, prev_last) == first;
            for &(l, k) in &lines {
                let a = acc.entry((id, l)).or_default();
                a.0 += own * k as f64 / n as f64;
                a.1 += total * k as f64 / n as f64;
                if !(goes_on && l == first) {
                    a.2 += runs;
                }
            }
            Some(())
        })();
        if placed.is_none() {
            *unplaced.entry(id).or_default() += own;
        }
    }
    // Lines of functions seen only in part are estimates.
    let mut partial: HashSet<u32> = pass.in_gap;
    partial.extend(spread);
    out.spread_ns = ns(spread_ticks.max(0.0));
    partial.extend(unplaced.iter().filter(|(_, &t)| t > 0.0).map(|(&id, _)| id));
    if threshold > 0 {
        let heads = pass.heads.iter().map(|(k, &n)| (k, n / 2));
        for (&(id, _), n) in pass.hits.iter().map(|(k, &n)| (k, n)).chain(heads) {
            if n >= threshold {
                partial.insert(id);
                out.silenced += 1;
            }
        }
    }
    out.unplaced_ns = ns(unplaced.values().map(|t| t.max(0.0)).sum());
    let mut estimated_functions = HashSet::default();
    for ((id, line), (own, total, hits)) in acc {
        let Some(co) = code.get(&id) else { continue };
        let estimated = partial.contains(&id);
        if estimated {
            estimated_functions.insert(id);
        }
        out.placed_ns += ns(own.max(0.0));
        out.lines.push(LineStat {
            pid: out.pid,
            file: co.filename.clone(),
            line: line as u32,
            function: co.qualname.clone(),
            hits,
            own_ns: ns(own.max(0.0)),
            with_callees_ns: ns(total.max(own).max(0.0)),
            estimated,
        });
    }
    out.estimated_functions = estimated_functions.len();
}

/// One row of the report.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The line's figures.
    #[serde(flatten)]
    pub stat: LineStat,
    /// Own time, ms.
    pub own_ms: f64,
    /// With callees, ms.
    pub with_callees_ms: f64,
    /// Own time as a share of all the time in recorded frames (placed on lines or not), 0 to 1.
    pub share: f64,
    /// The line's text, if its file is readable here.
    pub source: Option<String>,
}

/// What `stats --lines` shows: the hottest lines by own time. JSON: the array of rows.
#[derive(Debug)]
pub struct Report {
    /// The first `top` rows.
    pub rows: Vec<Row>,
    /// Rows left out by `top`.
    pub more: usize,
    /// The modes of the processes (several in a run).
    pub modes: Vec<&'static str>,
    /// Caveats.
    pub notes: Vec<String>,
}

impl Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(&self.rows)
    }
}

/// The report of one process's lines, or of a run's merged (lines summed over the processes by file, line
/// and function; pid 0): at most `top` rows, with the source text of each where readable.
pub fn report(parts: &[Lines], top: usize) -> Report {
    let merged = parts.len() > 1;
    let mut all: Vec<LineStat> = Vec::new();
    let mut index: HashMap<(String, u32, String), usize> = HashMap::default();
    for p in parts {
        for l in &p.lines {
            if !merged {
                all.push(l.clone());
                continue;
            }
            let key = (l.file.clone(), l.line, l.function.clone());
            match index.get(&key) {
                Some(&i) => {
                    let m = &mut all[i];
                    m.hits += l.hits;
                    m.own_ns += l.own_ns;
                    m.with_callees_ns += l.with_callees_ns;
                    m.estimated |= l.estimated;
                }
                None => {
                    index.insert(key, all.len());
                    all.push(LineStat { pid: 0, ..l.clone() });
                }
            }
        }
    }
    all.sort_by(|a, b| {
        b.own_ns.total_cmp(&a.own_ns).then_with(|| a.file.cmp(&b.file)).then_with(|| a.line.cmp(&b.line))
    });
    let whole: f64 = parts.iter().map(|p| p.placed_ns + p.unplaced_ns).sum();
    let more = all.len().saturating_sub(top);
    let mut sources = Sources::default();
    let rows = all
        .into_iter()
        .take(top)
        .map(|stat| Row {
            own_ms: stat.own_ns / 1e6,
            with_callees_ms: stat.with_callees_ns / 1e6,
            share: if whole > 0.0 { stat.own_ns / whole } else { 0.0 },
            source: sources.line(&stat.file, stat.line),
            stat,
        })
        .collect();
    let mut modes: Vec<&'static str> = parts.iter().filter_map(|p| p.mode.map(Mode::name)).collect();
    modes.dedup();
    Report { rows, more, modes, notes: notes(parts) }
}

/// What the figures cover.
fn notes(parts: &[Lines]) -> Vec<String> {
    let mut notes = Vec::new();
    let calls = parts.iter().filter(|p| !p.has_lines()).count();
    if calls > 0 {
        notes.push(format!(
            "{calls} of the run's {} processes were recorded in calls mode, which records no lines: their time is \
             not here",
            parts.len()
        ));
    }
    let unplaced: f64 = parts.iter().map(|p| p.unplaced_ns).sum();
    let placed: f64 = parts.iter().map(|p| p.placed_ns).sum();
    let spread: f64 = parts.iter().map(|p| p.spread_ns).sum();
    let functions: usize = parts.iter().map(|p| p.estimated_functions).sum();
    if functions > 0 || unplaced > 0.0 {
        let silenced: usize = parts.iter().map(|p| p.silenced).sum();
        let windowed = parts.iter().any(|p| p.windowed);
        let mut why = Vec::new();
        if silenced > 0 {
            why.push(format!(
                "the threshold stopped recording {silenced} jump, branch or instruction location{}",
                if silenced == 1 { "" } else { "s" }
            ));
        }
        if windowed {
            why.push("calls and returns between windows are not recorded".to_string());
        }
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
        let whole = placed + unplaced;
        let pct = |x: f64| if whole > 0.0 { x / whole * 100.0 } else { 0.0 };
        let lost = if unplaced >= 1e3 {
            format!(
                ", and {:.3} ms ({:.0}%) could not be placed on a line at all (a run that went backwards, or a frame \
                 whose calls or returns were not recorded): those lines' figures are low",
                unplaced / 1e6,
                pct(unplaced)
            )
        } else {
            String::new()
        };
        notes.push(format!(
            "lines marked ~ ({functions} function{}) were seen in part{why}: {:.3} ms ({:.0}% of the time in \
             recorded frames) ran across a jump or branch that was not recorded (silenced by the threshold, or one \
             CPython does not report, as into an exception handler) and is spread over the instructions between \
             two events as if none jumped (an estimate){lost}",
            if functions == 1 { "" } else { "s" },
            spread / 1e6,
            pct(spread),
        ));
    }
    notes
}

/// Source files read on demand, once each.
#[derive(Default)]
struct Sources(HashMap<String, Option<Vec<String>>>);

impl Sources {
    fn line(&mut self, file: &str, line: u32) -> Option<String> {
        let text = self.0.entry(file.to_string()).or_insert_with(|| {
            let bytes = std::fs::read(file).ok()?;
            Some(String::from_utf8_lossy(&bytes).lines().map(|l| l.trim().to_string()).collect())
        });
        text.as_ref()?.get((line as usize).checked_sub(1)?).cloned()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "hottest lines ({} mode): own time = time between a frame's recorded events, recorder cost and recorded \
             callees removed, split over a run's instructions by count (exact per run, estimated within it)",
            self.modes.join(", ")
        )?;
        writeln!(
            f,
            "{:>10} {:>12} {:>7} {:>12}  {:<40}  function  source",
            "hits", "own ms", "share", "w/ callees", "file:line"
        )?;
        for r in &self.rows {
            let s = &r.stat;
            let m = if s.estimated { "~" } else { "" };
            let at = format!("{}:{}", s.file, s.line);
            writeln!(
                f,
                "{:>10} {:>12} {:>7} {:>12}  {at:<40}  {}  {}",
                format!("{m}{}", s.hits),
                format!("{m}{:.3}", r.own_ms),
                format!("{:.1}%", r.share * 100.0),
                format!("{m}{:.3}", r.with_callees_ms),
                s.function,
                match (&r.source, s.line) {
                    (Some(text), _) => text.as_str(),
                    // CPython puts a code object's first instructions (RESUME) on line 0.
                    (None, 0) => "(before the first line)",
                    (None, _) => "(source not readable)",
                }
            )?;
        }
        if self.more > 0 {
            writeln!(f, "... {} more (use --top)", self.more)?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_and_branches_are_transfers_calls_are_calls() {
        for (name, op) in [
            ("JUMP_BACKWARD", Op::Transfer),
            ("POP_JUMP_IF_FALSE", Op::Transfer),
            ("FOR_ITER_RANGE", Op::Transfer),
            ("SEND", Op::Transfer),
            ("CALL_PY_EXACT_ARGS", Op::Call),
            ("CALL_INTRINSIC_1", Op::Plain),
            ("BINARY_OP", Op::Plain),
        ] {
            assert!(classify(name) == op, "{name}");
        }
    }
}
