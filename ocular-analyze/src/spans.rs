//! The spans view (FORMAT.md 5.9): per span name, how many and how long (exact: from the span's own
//! events); for the slowest spans, each one's time by function; and where the slow spans of a name spent
//! time the others did not.
//!
//! Two passes over the file: the first reads the spans (their marks and records); the second walks each
//! thread's stack and gives every interval between two events, less the recorder's cost, to the spans
//! open then: a span begun on a thread holds that thread's time from its beginning to its end; one begun in
//! a coroutine (its record's `frame`) only the time in which that coroutine is on the stack (its turns,
//! and what it awaits), not the other tasks that run on the thread in between.

use crate::analysis::{cost_far_end, COST_UNCERTAINTY};
use crate::walk::{Frames, Marker, Step, Walk};
use ocular_format::span::{Mark, Marks};
use ocular_format::{Body, EventKind, ReadOptions, Reader};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use serde::Serialize;
use std::path::Path;

/// One span.
#[derive(Clone, Debug, Serialize)]
pub struct Span {
    /// Its key in the recording.
    pub key: u64,
    /// Its name.
    pub name: String,
    /// The thread it began on (native id) and that thread's name.
    pub thread_id: u64,
    /// The thread's name.
    pub thread: String,
    /// When it began and ended, ns from the recording's start (`end_ns` absent: still open at the end).
    pub begin_ns: f64,
    /// When it ended.
    pub end_ns: Option<f64>,
    /// `end_ns - begin_ns`.
    pub duration_ms: Option<f64>,
    /// OpenTelemetry's ids, lowercase hex (empty: none).
    pub trace_id: String,
    /// The span id.
    pub span_id: String,
    /// The parent span's id.
    pub parent_span_id: String,
    /// The key of the span of this recording that encloses it (0: none).
    pub parent: u64,
    /// `unset`, `ok` or `error`.
    pub status: &'static str,
    /// The status's description, or the exception that ended it.
    pub message: String,
    /// Its attributes, at the beginning then those set later.
    pub attributes: Vec<(String, String)>,
    /// Attribute values were cut to fit the record.
    pub cut: bool,
    /// The frame id of the coroutine it belongs to (FORMAT.md 5.5; 0: its thread's).
    #[serde(skip)]
    pub frame: u64,
    /// When it began and ended, in the file's ticks.
    #[serde(skip)]
    pub begin: u64,
    /// When it ended.
    #[serde(skip)]
    pub end: Option<u64>,
}

/// A function's time inside spans, in ticks: exclusive, inclusive (once per interval however often it
/// recurses), and the recorder's cost taken out of each.
#[derive(Clone, Copy, Debug, Default)]
struct Times {
    exclusive: f64,
    inclusive: f64,
    cost: [f64; 2],
    /// Calls begun inside (`stats --span`).
    calls: u64,
}

/// A function's time in one span or a group of spans, in ms, with its 95% interval (the recorder's cost
/// taken out is known to within [`COST_UNCERTAINTY`] times itself, or more: [`cost_far_end`]).
#[derive(Clone, Debug, Serialize)]
pub struct FunctionTime {
    /// `qualname`.
    pub function: String,
    /// `file:line`.
    pub location: String,
    /// Exclusive ms, and its interval.
    pub exclusive_ms: f64,
    /// Interval of `exclusive_ms`.
    pub exclusive_ci_ms: f64,
    /// Inclusive ms.
    pub inclusive_ms: f64,
    /// Interval of `inclusive_ms`.
    pub inclusive_ci_ms: f64,
}

/// Latencies of one span name, ms (exact: each span's end less its beginning).
#[derive(Clone, Debug, Serialize)]
pub struct NameStats {
    /// The name.
    pub name: String,
    /// Spans ended.
    pub count: usize,
    /// Spans still open at the end of the recording.
    pub open: usize,
    /// Percentiles (nearest rank) and the largest, ms.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// The longest.
    pub max_ms: f64,
    /// Spans that ended in error.
    pub errors: usize,
}

/// A function whose time per span differs most between a name's slow spans and the others.
#[derive(Clone, Debug, Serialize)]
pub struct Difference {
    /// `qualname`.
    pub function: String,
    /// `file:line`.
    pub location: String,
    /// Mean inclusive ms per slow span.
    pub slow_ms: f64,
    /// Mean inclusive ms per other span.
    pub others_ms: f64,
    /// `slow_ms - others_ms`.
    pub extra_ms: f64,
    /// The same of exclusive ms: the rows are in its order (a caller's inclusive time holds its callees').
    pub extra_exclusive_ms: f64,
}

/// What the slow spans of a name did that the others did not.
#[derive(Clone, Debug, Serialize)]
pub struct SlowVsOthers {
    /// The span name.
    pub name: String,
    /// Spans at or above this duration are the slow ones: above the largest step between one duration and
    /// the next in the slowest 10% (at least 1.5x), or else the 95th percentile.
    pub threshold_ms: f64,
    /// How many of each.
    pub slow: usize,
    /// Others.
    pub others: usize,
    /// Functions by extra time per slow span, largest first.
    pub functions: Vec<Difference>,
}

/// One of the slowest spans, with its time by function.
#[derive(Clone, Debug, Serialize)]
pub struct Slowest {
    /// The span.
    pub span: Span,
    /// Its functions by exclusive time.
    pub functions: Vec<FunctionTime>,
}

/// The spans view of one trace.
#[derive(Clone, Debug, Serialize)]
pub struct Spans {
    /// Per span name, by count.
    pub names: Vec<NameStats>,
    /// The slowest spans (`top` of them), slowest first.
    pub slowest: Vec<Slowest>,
    /// Per name with at least two ended spans: slow against the others.
    pub differences: Vec<SlowVsOthers>,
    /// Whether times by function are given: every function boundary was recorded (not `--sampled`).
    pub by_function: bool,
    /// Spans whose beginning a flight recorder had overwritten (left out).
    pub cut_by_ring: u64,
    /// What the reader said about the file.
    pub notes: Vec<String>,
    /// The reader's warnings.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Per thread in the second pass: its stack of (code id, frame id) and the spans open on it.
struct Thread {
    stack: Vec<(u32, u64)>,
    /// The stack before the current event moved it: what ran in the interval that ends at the event.
    before: Vec<(u32, u64)>,
    walk: Walk,
    last: Option<u64>,
    /// Open spans that are measured: (span index, depth of the frame that began it, or the coroutine's
    /// frame id).
    open: Vec<(usize, Holds)>,
}

/// What a span open on a thread holds: the one rule for which of a thread's time and calls are a span's,
/// for every view of spans (`spans`, `stats --span`, the profiles' labels, the calls table's column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// A thread's span: all its thread runs while it is open, every frame on the stack (an OpenTelemetry
    /// span begins in the SDK's frames, which return before the request's work runs).
    Thread,
    /// A coroutine's span: while a frame with this id is on the stack, the frames from it up (the
    /// coroutine's turns and what they call, not the other tasks run between them).
    Frame(u64),
}

impl Holds {
    /// What a span begun with frame id `frame` (FORMAT.md 5.9; 0: a thread's) holds.
    pub fn of(frame: u64) -> Self {
        match frame {
            0 => Holds::Thread,
            f => Holds::Frame(f),
        }
    }

    /// The depth from which the span holds a stack whose frame ids are `frames`, outermost first: 0 for a
    /// thread's span, its coroutine's innermost activation for a coroutine's; `None` when the coroutine is
    /// not on the stack (the time is another task's).
    pub fn base<I>(self, frames: I) -> Option<usize>
    where
        I: IntoIterator<Item = u64>,
        I::IntoIter: DoubleEndedIterator + ExactSizeIterator,
    {
        match self {
            Holds::Thread => Some(0),
            Holds::Frame(f) => frames.into_iter().rposition(|id| id == f),
        }
    }

    /// Whether the span holds what runs on top of a stack whose frame ids are `frames` (in any order).
    pub fn holds(self, frames: impl IntoIterator<Item = u64>) -> bool {
        match self {
            Holds::Thread => true,
            Holds::Frame(f) => frames.into_iter().any(|id| id == f),
        }
    }
}

struct Moves<'a>(&'a mut Vec<(u32, u64)>);

impl Frames for Moves<'_> {
    fn depth(&self) -> usize {
        self.0.len()
    }
    fn code(&self, i: usize) -> u32 {
        self.0[i].0
    }
    fn lose_above(&mut self, depth: usize, _t: u64) {
        self.0.truncate(depth);
    }
}

/// The view of `path`: `top` slowest spans with their functions, `functions` functions per table.
pub fn analyze(path: &Path, opts: ReadOptions, top: usize, functions: usize) -> ocular_format::Result<Spans> {
    let (spans, cut_by_ring, tps, by_function, warnings) = first_pass(path, opts)?;
    let ms = |ticks: f64| ticks / tps * 1e3;
    // Per name: ended spans by duration.
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::default();
    for (i, s) in spans.iter().enumerate() {
        by_name.entry(s.name.as_str()).or_default().push(i);
    }
    let duration = |s: &Span| s.end.map(|e| e.saturating_sub(s.begin));
    let mut name_stats = Vec::new();
    // Which group each measured span adds to: (name index, slow).
    let mut group: Vec<Option<(usize, bool)>> = vec![None; spans.len()];
    let mut groups: Vec<(String, f64, usize, usize)> = Vec::new();
    for (name, idx) in &by_name {
        let mut d: Vec<(u64, usize)> = idx.iter().filter_map(|&i| duration(&spans[i]).map(|d| (d, i))).collect();
        d.sort_unstable();
        let open = idx.len() - d.len();
        let errors = idx.iter().filter(|&&i| spans[i].status == "error").count();
        if d.is_empty() {
            name_stats.push(NameStats {
                name: name.to_string(),
                count: 0,
                open,
                p50_ms: 0.0,
                p95_ms: 0.0,
                p99_ms: 0.0,
                max_ms: 0.0,
                errors,
            });
            continue;
        }
        let rank = |p: f64| d[((p * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1].0 as f64;
        name_stats.push(NameStats {
            name: name.to_string(),
            count: d.len(),
            open,
            p50_ms: ms(rank(0.50)),
            p95_ms: ms(rank(0.95)),
            p99_ms: ms(rank(0.99)),
            max_ms: ms(d[d.len() - 1].0 as f64),
            errors,
        });
        if d.len() >= 2 && by_function {
            let threshold = slow_threshold(&d.iter().map(|x| x.0).collect::<Vec<_>>()) as f64;
            let g = groups.len();
            let mut slow = 0;
            for &(dur, i) in &d {
                let is_slow = dur as f64 >= threshold;
                slow += usize::from(is_slow);
                group[i] = Some((g, is_slow));
            }
            groups.push((name.to_string(), threshold, slow, d.len() - slow));
        }
    }
    name_stats.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    // The slowest spans overall.
    let mut order: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].end.is_some()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(duration(&spans[i])));
    order.truncate(top);
    let selected: HashSet<usize> = order.iter().copied().collect();

    let mut per_span: HashMap<usize, HashMap<u32, Times>> = HashMap::default();
    let mut per_group: Vec<[HashMap<u32, Times>; 2]> = vec![Default::default(); groups.len()];
    let (code, spread) = if by_function && !spans.is_empty() {
        let mut sinks = Sinks {
            group: &group,
            selected: &selected,
            per_span: &mut per_span,
            per_group: &mut per_group,
            union: false,
            stacks: None,
        };
        second_pass(path, opts, &spans, &mut sinks)?
    } else {
        (HashMap::default(), COST_UNCERTAINTY)
    };
    let name_of = |id: u32| -> (String, String) {
        code.get(&id).cloned().unwrap_or_else(|| (format!("<code {id}>"), String::new()))
    };
    let slowest = order
        .iter()
        .map(|&i| {
            let mut f: Vec<(u32, Times)> = per_span.remove(&i).unwrap_or_default().into_iter().collect();
            f.sort_by(|a, b| b.1.exclusive.total_cmp(&a.1.exclusive).then(a.0.cmp(&b.0)));
            f.truncate(functions);
            let functions = f
                .into_iter()
                .map(|(id, t)| {
                    let (function, location) = name_of(id);
                    FunctionTime {
                        function,
                        location,
                        exclusive_ms: ms(t.exclusive),
                        exclusive_ci_ms: ms(spread * t.cost[0]),
                        inclusive_ms: ms(t.inclusive),
                        inclusive_ci_ms: ms(spread * t.cost[1]),
                    }
                })
                .collect();
            Slowest { span: spans[i].clone(), functions }
        })
        .collect();
    let mut differences = Vec::new();
    for (g, (name, threshold, slow, others)) in groups.into_iter().enumerate() {
        let [s, o] = &per_group[g];
        let ids: HashSet<u32> = s.keys().chain(o.keys()).copied().collect();
        let per = |m: &HashMap<u32, Times>, id: u32, n: usize| {
            m.get(&id).map_or((0.0, 0.0), |t| (ms(t.inclusive) / n.max(1) as f64, ms(t.exclusive) / n.max(1) as f64))
        };
        let mut fs: Vec<Difference> = ids
            .into_iter()
            .map(|id| {
                let (slow_ms, slow_excl) = per(s, id, slow);
                let (others_ms, others_excl) = per(o, id, others);
                let (function, location) = name_of(id);
                Difference {
                    function,
                    location,
                    slow_ms,
                    others_ms,
                    extra_ms: slow_ms - others_ms,
                    extra_exclusive_ms: slow_excl - others_excl,
                }
            })
            .collect();
        fs.sort_by(|a, b| {
            b.extra_exclusive_ms.total_cmp(&a.extra_exclusive_ms).then_with(|| a.function.cmp(&b.function))
        });
        fs.truncate(functions);
        differences.push(SlowVsOthers { name, threshold_ms: ms(threshold), slow, others, functions: fs });
    }
    differences.sort_by(|a, b| a.name.cmp(&b.name));
    let mut notes = Vec::new();
    if !by_function && !spans.is_empty() {
        notes.push(
            "function boundaries were recorded in windows (--sampled): spans' durations are exact, their time \
             by function is not given (record without --sampled for it)"
                .to_string(),
        );
    }
    if cut_by_ring > 0 {
        let what = if cut_by_ring == 1 { "span" } else { "spans" };
        notes.push(format!("{cut_by_ring} {what} whose beginning the flight recorder had overwritten left out"));
    }
    Ok(Spans { names: name_stats, slowest, differences, by_function, cut_by_ring, notes, warnings })
}

/// A function's figures inside the spans of one name (`stats --span`).
#[derive(Clone, Debug, Serialize)]
pub struct WithinRow {
    /// `qualname`.
    pub function: String,
    /// `file:line`.
    pub location: String,
    /// Calls begun inside the spans (exact: every start is recorded).
    pub calls: u64,
    /// Exclusive ms inside the spans, and its interval.
    pub exclusive_ms: f64,
    /// Interval of `exclusive_ms`.
    pub exclusive_ci_ms: f64,
    /// Inclusive ms inside the spans (only what ran inside them: a function that began a span holds the
    /// span's part of its time).
    pub inclusive_ms: f64,
    /// Interval of `inclusive_ms`.
    pub inclusive_ci_ms: f64,
    /// `inclusive_ms` over the program's time inside the spans (`program_ms`).
    pub share: f64,
}

/// `stats --span NAME`: per function, the calls and time inside the spans of one name.
#[derive(Clone, Debug, Serialize)]
pub struct Within {
    /// The span name.
    pub name: String,
    /// Spans of that name that ended (the ones measured).
    pub spans: usize,
    /// Spans of that name still open at the end (left out).
    pub open: usize,
    /// Their time: the ended spans' durations summed, ms (spans that overlap, on several threads or
    /// nested, are each counted).
    pub spans_ms: f64,
    /// The program's time inside them (each moment once), less the recorder's cost: every function's
    /// exclusive time summed.
    pub program_ms: f64,
    /// Its 95% interval (the recorder's cost taken out is known to within a factor).
    pub program_ci_ms: f64,
    /// Functions, in the order asked for, the first `top`.
    pub rows: Vec<WithinRow>,
    /// Functions left out of `rows`.
    pub more: usize,
    /// The other span names in the recording, when `name` has none.
    pub names: Vec<String>,
    /// What the reader said about the file.
    pub notes: Vec<String>,
    /// The reader's warnings.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Per function, the calls and time inside the ended spans named `name` (an interval inside two nested
/// spans of the name counts once), sorted by `sort`, the first `top`.
pub fn within(
    path: &Path,
    opts: ReadOptions,
    name: &str,
    sort: crate::stats::SortBy,
    top: usize,
) -> anyhow::Result<Within> {
    let (spans, cut_by_ring, tps, by_function, warnings) = first_pass(path, opts)?;
    let ms = |ticks: f64| ticks / tps * 1e3;
    let mut group: Vec<Option<(usize, bool)>> = vec![None; spans.len()];
    let (mut ended, mut open, mut total) = (0, 0, 0u64);
    for (i, s) in spans.iter().enumerate() {
        if s.name != name {
            continue;
        }
        match s.end {
            Some(e) => {
                ended += 1;
                total += e.saturating_sub(s.begin);
                group[i] = Some((0, true));
            }
            None => open += 1,
        }
    }
    let mut names: Vec<String> = Vec::new();
    if ended == 0 {
        let mut all: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        all.sort_unstable();
        all.dedup();
        names = all.into_iter().map(str::to_string).collect();
    }
    anyhow::ensure!(
        by_function || ended == 0,
        "{}: function boundaries were recorded in windows (--sampled): time by function inside spans is not \
         given (record without --sampled for it; `spans` gives the spans' durations)",
        path.display()
    );
    let mut per_group: Vec<[HashMap<u32, Times>; 2]> = vec![Default::default()];
    let (code, spread) = if ended > 0 {
        let mut sinks = Sinks {
            group: &group,
            selected: &HashSet::default(),
            per_span: &mut HashMap::default(),
            per_group: &mut per_group,
            union: true,
            stacks: None,
        };
        second_pass(path, opts, &spans, &mut sinks)?
    } else {
        (HashMap::default(), COST_UNCERTAINTY)
    };
    let [inside, _] = per_group.pop().expect("one group");
    let spans_ms = ms(total as f64);
    let program: f64 = inside.values().map(|t| t.exclusive.max(0.0)).sum();
    let program_ci_ms = ms(spread * inside.values().map(|t| t.cost[0]).sum::<f64>());
    let mut rows: Vec<WithinRow> = inside
        .into_iter()
        .map(|(id, t)| {
            let (function, location) =
                code.get(&id).cloned().unwrap_or_else(|| (format!("<code {id}>"), String::new()));
            WithinRow {
                function,
                location,
                calls: t.calls,
                exclusive_ms: ms(t.exclusive.max(0.0)),
                exclusive_ci_ms: ms(spread * t.cost[0]),
                inclusive_ms: ms(t.inclusive.max(0.0)),
                inclusive_ci_ms: ms(spread * t.cost[1]),
                share: if program > 0.0 { t.inclusive.max(0.0) / program } else { 0.0 },
            }
        })
        .collect();
    let key = |r: &WithinRow| match sort {
        crate::stats::SortBy::Exclusive => r.exclusive_ms,
        crate::stats::SortBy::Inclusive => r.inclusive_ms,
        crate::stats::SortBy::Calls => r.calls as f64,
        crate::stats::SortBy::Mean => {
            if r.calls > 0 {
                r.inclusive_ms / r.calls as f64
            } else {
                0.0
            }
        }
    };
    rows.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.function.cmp(&b.function)));
    let more = rows.len().saturating_sub(top);
    rows.truncate(top);
    let mut notes = Vec::new();
    if open > 0 {
        notes.push(format!("{open} span{} named {name:?} still open at the end left out", plural(open)));
    }
    if cut_by_ring > 0 {
        notes.push(format!(
            "{cut_by_ring} span{} whose beginning the flight recorder had overwritten left out",
            plural(cut_by_ring as usize)
        ));
    }
    let program_ms = ms(program);
    Ok(Within {
        name: name.to_string(),
        spans: ended,
        open,
        spans_ms,
        program_ms,
        program_ci_ms,
        rows,
        more,
        names,
        notes,
        warnings,
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl std::fmt::Display for Within {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.spans == 0 {
            if self.names.is_empty() {
                writeln!(f, "no spans in this recording (mark them with ocular.span, or ocular.otel.SpanProcessor)")?;
            } else {
                writeln!(
                    f,
                    "no ended span named {:?}; the recording's span names: {}",
                    self.name,
                    self.names.join(", ")
                )?;
            }
            for n in &self.notes {
                writeln!(f, "note: {n}")?;
            }
            return Ok(());
        }
        writeln!(
            f,
            "inside {} span{} named {:?}: {:.3} ms in all (their durations summed), {} ms the program's (less the \
             recorder's cost; incl % is of it); calls exact, times the clock's less the recorder's cost (~: 95% \
             interval)",
            self.spans,
            plural(self.spans),
            self.name,
            self.spans_ms,
            with_interval(self.program_ms, self.program_ci_ms)
        )?;
        writeln!(f, "{:>9}  {:>16}  {:>16}  {:>6}  function  file:line", "calls", "excl ms", "incl ms", "incl %")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>9}  {:>16}  {:>16}  {:>5.1}%  {}  {}",
                r.calls,
                with_interval(r.exclusive_ms, r.exclusive_ci_ms),
                with_interval(r.inclusive_ms, r.inclusive_ci_ms),
                r.share * 100.0,
                r.function,
                r.location
            )?;
        }
        if self.more > 0 {
            writeln!(f, "... {} more functions (--top)", self.more)?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

type FirstPass = (Vec<Span>, u64, f64, bool, Vec<String>);

/// Every span of `path` (FORMAT.md 5.9), in the order they began per thread, threads in file order; and
/// how many a flight recorder cut (their beginning overwritten).
pub fn list(path: &Path, opts: ReadOptions) -> ocular_format::Result<(Vec<Span>, u64)> {
    let (spans, cut, ..) = first_pass(path, opts)?;
    Ok((spans, cut))
}

/// Every span of `path` ([`list`]) and, per span, thread and stack, the exclusive ticks (less the
/// recorder's cost) and calls inside it (the innermost span only): what a profile's samples are labelled
/// with. Empty stacks where function boundaries were recorded in windows (`--sampled`).
pub fn stacks(path: &Path, opts: ReadOptions) -> ocular_format::Result<(Vec<Span>, StackTimes)> {
    if Reader::open_with(path, opts)?.version() < (2, 13) {
        return Ok(Default::default()); // no spans before 2.13: no pass over the file
    }
    let (spans, _, _, by_function, _) = first_pass(path, opts)?;
    let mut stacks = StackTimes::default();
    if by_function && !spans.is_empty() {
        let mut sinks = Sinks {
            group: &vec![None; spans.len()],
            selected: &HashSet::default(),
            per_span: &mut HashMap::default(),
            per_group: &mut [],
            union: false,
            stacks: Some(&mut stacks),
        };
        second_pass(path, opts, &spans, &mut sinks)?;
    }
    Ok((spans, stacks))
}

/// The spans view of `path` for the report: `None` where it has no span (and, before format 2.13, without
/// reading it).
pub fn for_report(path: &Path, opts: ReadOptions) -> ocular_format::Result<Option<Spans>> {
    if Reader::open_with(path, opts)?.version() < (2, 13) {
        return Ok(None);
    }
    let s = analyze(path, opts, 5, 10)?;
    Ok((!s.names.is_empty()).then_some(s))
}

/// Whether `events` hold a span's beginning.
pub fn has_spans(events: &[ocular_format::RawEvent]) -> bool {
    events.iter().any(|e| e.kind == EventKind::SPAN as u8)
}

/// Reads every span mark: the spans with their records, the spans cut by the ring, the clock's rate,
/// whether every function boundary was recorded, the reader's warnings.
fn first_pass(path: &Path, opts: ReadOptions) -> ocular_format::Result<FirstPass> {
    let r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let tps = header.ticks_per_second;
    let mut r = ocular_format::Prefetch::new(r)?;
    let mut marks: HashMap<u64, Marks> = HashMap::default();
    let mut spans: Vec<Span> = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::default();
    let mut ends: Vec<(u64, u64, Option<ocular_format::span::SpanEnd>)> = Vec::new();
    let mut names: HashMap<u64, String> = HashMap::default();
    let mut windowed = false;
    let mut take = |tid: u64, m: Mark, spans: &mut Vec<Span>, ends: &mut Vec<_>| match m {
        Mark::Begin { key, ticks, record } => {
            let r = record.unwrap_or_default();
            index.insert(key, spans.len());
            spans.push(Span {
                key,
                name: if r.name.is_empty() { "<unnamed>".into() } else { r.name },
                thread_id: tid,
                thread: String::new(),
                begin_ns: ticks.saturating_sub(header.start_ticks) as f64 / tps * 1e9,
                end_ns: None,
                duration_ms: None,
                trace_id: hex(&r.trace_id),
                span_id: hex(&r.span_id),
                parent_span_id: hex(&r.parent_span_id),
                parent: r.parent,
                status: "unset",
                message: String::new(),
                attributes: r.attributes.into_iter().map(|a| (a.key, a.value)).collect(),
                cut: r.cut,
                frame: r.frame,
                begin: ticks,
                end: None,
            });
        }
        Mark::End { key, ticks, record } => ends.push((key, ticks, record)),
    };
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Events(evs) => {
                let tid = c.info.thread_id;
                let m = marks.entry(tid).or_default();
                for e in evs {
                    if let Some(Marker::Opened { len_us, .. }) = Marker::of(e) {
                        windowed |= len_us != u32::MAX;
                    }
                    if let Some(mark) = m.push(e) {
                        take(tid, mark, &mut spans, &mut ends);
                    }
                }
            }
            Body::Thread(t) => {
                names.insert(t.thread_id, t.name);
            }
            _ => {}
        }
    }
    for (tid, mut m) in marks {
        if let Some(mark) = m.finish() {
            take(tid, mark, &mut spans, &mut ends);
        }
    }
    let mut cut_by_ring = 0;
    for (key, ticks, record) in ends {
        let Some(&i) = index.get(&key) else {
            cut_by_ring += 1;
            continue;
        };
        let s = &mut spans[i];
        s.end = Some(ticks.max(s.begin));
        s.end_ns = Some(ticks.max(s.begin).saturating_sub(header.start_ticks) as f64 / tps * 1e9);
        s.duration_ms = Some(ticks.saturating_sub(s.begin) as f64 / tps * 1e3);
        if let Some(e) = record {
            s.status = match e.status {
                1 => "ok",
                2 => "error",
                _ => "unset",
            };
            s.message = e.message;
            s.cut |= e.cut;
            for a in e.attributes {
                match s.attributes.iter_mut().find(|(k, _)| *k == a.key) {
                    Some(kv) => kv.1 = a.value,
                    None => s.attributes.push((a.key, a.value)),
                }
            }
        }
    }
    for s in &mut spans {
        s.thread = names.get(&s.thread_id).cloned().unwrap_or_default();
    }
    let warnings = r.finish().report().warnings(&path.display().to_string());
    Ok((spans, cut_by_ring, tps, !windowed, warnings))
}

/// Per (span index, thread id, stack of code ids from the thread's outermost frame): the exclusive ticks
/// (less the recorder's cost) the stack ran inside the span, innermost span only, and the calls begun with it.
pub type StackTimes = HashMap<(usize, u64, Vec<u32>), (f64, u64)>;

/// Where the second pass puts what it measures.
struct Sinks<'a> {
    /// Which group each span adds to: (group, slow).
    group: &'a [Option<(usize, bool)>],
    /// Spans measured one by one.
    selected: &'a HashSet<usize>,
    per_span: &'a mut HashMap<usize, HashMap<u32, Times>>,
    per_group: &'a mut [[HashMap<u32, Times>; 2]],
    /// Time inside two nested spans of one group counts once (`stats --span`).
    union: bool,
    /// Every span's stacks ([`stacks`]).
    stacks: Option<&'a mut StackTimes>,
}

/// Walks every thread and gives each interval to the measured spans open then. Returns the code objects'
/// names and places, and how many times the recorder's cost taken out the truth may be off by
/// (`cost_far_end` less 1: the times' intervals).
#[allow(clippy::type_complexity)]
fn second_pass(
    path: &Path,
    opts: ReadOptions,
    spans: &[Span],
    sinks: &mut Sinks<'_>,
) -> ocular_format::Result<(HashMap<u32, (String, String)>, f64)> {
    let r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let mut r = ocular_format::Prefetch::new(r)?;
    let mut cost = ocular_format::cost_table(header.event_cost_ticks, None);
    let mut spread = COST_UNCERTAINTY;
    let stop = crate::analysis::read_samples(path, opts, &header)?.stop_calibration;
    let index: HashMap<u64, usize> = spans.iter().enumerate().map(|(i, s)| (s.key, i)).collect();
    let mut threads: HashMap<u64, Thread> = HashMap::default();
    let mut code: HashMap<u32, (String, String)> = HashMap::default();
    // Codes already given an interval's inclusive time (recursion counts once): a stamp per code id.
    let mut seen: HashMap<u32, u64> = HashMap::default();
    let mut stamp = 0u64;
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Events(evs) => {
                let tid = c.info.thread_id;
                let th = threads.entry(tid).or_insert_with(|| Thread {
                    stack: Vec::new(),
                    before: Vec::new(),
                    walk: Walk::new(header.ticks_per_second),
                    last: None,
                    open: Vec::new(),
                });
                for e in evs {
                    let t = e.ticks.get();
                    let measuring = !th.open.is_empty();
                    if measuring {
                        th.before.clear();
                        th.before.extend_from_slice(&th.stack);
                    }
                    let step = th.walk.step(&mut Moves(&mut th.stack), e);
                    if step == Step::Pause {
                        continue;
                    }
                    // The interval that ends at this event, less the recorder's cost and pauses in it, to the
                    // spans open in it, in the stack before the event moved it (what ran until it).
                    let c_ticks = th.walk.cost(e, &cost) + th.walk.paused() as f64;
                    if let Some(last) = th.last {
                        if measuring && t >= last {
                            give(th, tid, spans, last, t, c_ticks, sinks, &mut seen, &mut stamp);
                        }
                    }
                    th.last = Some(t);
                    match step {
                        Step::Enter(kind) => {
                            th.stack.push((e.code.get(), e.frame_id().unwrap_or(0)));
                            if kind == EventKind::PY_START && measuring {
                                count_call(th, tid, spans, t, sinks);
                            }
                        }
                        Step::Location { enter: true, .. } => {
                            th.stack.push((e.code.get(), e.frame_id().unwrap_or(0)));
                        }
                        Step::Found { same: false, .. } => th.stack.push((e.code.get(), 0)),
                        Step::Exit(_) => {
                            th.stack.pop();
                        }
                        Step::Note(EventKind::SPAN) => {
                            if let Some(&i) = index.get(&ocular_format::span::key(e)) {
                                if sinks.stacks.is_some() || sinks.selected.contains(&i) || sinks.group[i].is_some() {
                                    th.open.push((i, Holds::of(spans[i].frame)));
                                }
                            }
                        }
                        _ => {}
                    }
                    // Spans that ended by this event are closed (their end may be on another thread).
                    th.open.retain(|&(i, _)| spans[i].end.map_or(true, |end| end > t));
                }
            }
            Body::Code(objs) => {
                for o in objs {
                    code.insert(o.id, (o.qualname.clone(), format!("{}:{}", o.filename, o.first_line)));
                }
            }
            Body::Calibration(c) if c.is_stop() => {}
            Body::Calibration(c) => {
                let ratio;
                (cost, ratio) = ocular_format::cost_table_at_speed(header.event_cost_ticks, &c, stop.as_ref());
                spread = cost_far_end(ratio) - 1.0;
            }
            _ => {}
        }
    }
    Ok((code, spread))
}

/// Gives the interval `(last, t]` of a thread, less `cost` (the recorder's, at `t`), to each span open in
/// it: its top frame's exclusive time, and each function from the span's root up its inclusive time.
#[allow(clippy::too_many_arguments)]
fn give(
    th: &Thread,
    tid: u64,
    spans: &[Span],
    last: u64,
    t: u64,
    cost: f64,
    sinks: &mut Sinks<'_>,
    seen: &mut HashMap<u32, u64>,
    stamp: &mut u64,
) {
    let stack = &th.before;
    let Some(&(top, _)) = stack.last() else { return };
    let mut innermost = None;
    // With `union`, an interval goes to a group once however many of its spans it is inside (nested spans
    // of one name: `stats --span` covers the time inside any of them).
    let mut given: Vec<usize> = Vec::new();
    for &(i, root) in &th.open {
        let s = &spans[i];
        // The part of the interval inside the span; the cost at `t` only if `t` is in it.
        let from = last.max(s.begin);
        let to = s.end.map_or(t, |e| t.min(e));
        if to < from || (to == from && to != t) {
            continue;
        }
        let cost = if to == t { cost } else { 0.0 };
        let d = (to - from) as f64 - cost;
        let Some(base) = root.base(stack.iter().map(|&(_, id)| id)) else {
            continue; // the coroutine is not running: another task's time
        };
        innermost = Some((i, d));
        let mut add = |m: &mut HashMap<u32, Times>, seen: &mut HashMap<u32, u64>| {
            *stamp += 1;
            let x = m.entry(top).or_default();
            x.exclusive += d;
            x.cost[0] += cost;
            for &(code, _) in &stack[base..] {
                if seen.insert(code, *stamp) == Some(*stamp) {
                    continue;
                }
                let x = m.entry(code).or_default();
                x.inclusive += d;
                x.cost[1] += cost;
            }
        };
        if sinks.selected.contains(&i) {
            add(sinks.per_span.entry(i).or_default(), seen);
        }
        if let Some((g, slow)) = sinks.group[i] {
            if sinks.union {
                if given.contains(&g) {
                    continue;
                }
                given.push(g);
            }
            add(&mut sinks.per_group[g][usize::from(!slow)], seen);
        }
    }
    // A profile's sample has one span: the innermost that holds the interval.
    if let (Some(stacks), Some((i, d))) = (sinks.stacks.as_deref_mut(), innermost) {
        stacks.entry((i, tid, stack.iter().map(|x| x.0).collect())).or_default().0 += d;
    }
}

/// Counts the call just pushed on `th`'s stack in each group whose span it is inside (once per group with
/// `union`): any call of the thread while a thread's span is open, a coroutine's activations and the calls
/// above them for its span.
fn count_call(th: &Thread, tid: u64, spans: &[Span], t: u64, sinks: &mut Sinks<'_>) {
    let Some(&(code, _)) = th.stack.last() else { return };
    let inside = |i: usize, root: Holds| {
        let open = spans[i].begin <= t && spans[i].end.map_or(true, |e| e > t);
        open && root.holds(th.stack.iter().map(|&(_, id)| id))
    };
    let mut given: Vec<usize> = Vec::new();
    for &(i, root) in &th.open {
        let Some((g, slow)) = sinks.group[i] else { continue };
        if (sinks.union && given.contains(&g)) || !inside(i, root) {
            continue;
        }
        given.push(g);
        sinks.per_group[g][usize::from(!slow)].entry(code).or_default().calls += 1;
    }
    if let Some(stacks) = sinks.stacks.as_deref_mut() {
        if let Some(&(i, _)) = th.open.iter().rev().find(|&&(i, root)| inside(i, root)) {
            stacks.entry((i, tid, th.stack.iter().map(|x| x.0).collect())).or_default().1 += 1;
        }
    }
}

/// The duration from which a name's spans are slow, of its ended spans' durations in order: where the
/// slowest tenth (at least one span) steps up most from one duration to the next, if that step is at least
/// 1.5x (a slow path stands apart: 0.11-0.3 ms, then 5 ms); else the 95th percentile (nearest rank).
fn slow_threshold(sorted: &[u64]) -> u64 {
    let n = sorted.len();
    let from = (n - (n / 10).max(1)).max(1);
    let mut best = (1.5, None);
    for i in from..n {
        let ratio = sorted[i] as f64 / sorted[i - 1].max(1) as f64;
        if ratio >= best.0 {
            best = (ratio, Some(sorted[i]));
        }
    }
    best.1.unwrap_or_else(|| sorted[((0.95 * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// Lowercase hex of `b`.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A time in ms with its interval, to the digits the interval leaves (`~12.4 ±0.31`); exact to 3 decimals.
fn with_interval(ms: f64, ci: f64) -> String {
    if ci < 0.0005 {
        return format!("{ms:.3}");
    }
    let digits = (ci.log10().floor() as i32 - 1).min(3);
    if digits > 0 {
        let unit = 10f64.powi(digits);
        return format!("~{:.0} ±{:.0}", (ms / unit).round() * unit, (ci / unit).ceil() * unit);
    }
    let decimals = (-digits).min(3) as usize;
    format!("~{ms:.decimals$} ±{ci:.decimals$}")
}

impl std::fmt::Display for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.names.is_empty() {
            writeln!(f, "no spans in this recording (mark them with ocular.span, or ocular.otel.SpanProcessor)")?;
            for n in &self.notes {
                writeln!(f, "note: {n}")?;
            }
            return Ok(());
        }
        let total: usize = self.names.iter().map(|n| n.count + n.open).sum();
        writeln!(f, "{total} spans, {} names; durations exact (each span's end less its beginning)", self.names.len())?;
        let w = self.names.iter().map(|n| n.name.chars().count()).max().unwrap_or(4).clamp(4, 48);
        writeln!(
            f,
            "{:<w$}  {:>7}  {:>6}  {:>9}  {:>9}  {:>9}  {:>9}",
            "name", "count", "errors", "p50 ms", "p95 ms", "p99 ms", "max ms"
        )?;
        for n in &self.names {
            let open = if n.open > 0 { format!(" (+{} open)", n.open) } else { String::new() };
            writeln!(
                f,
                "{:<w$}  {:>7}  {:>6}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}{open}",
                n.name, n.count, n.errors, n.p50_ms, n.p95_ms, n.p99_ms, n.max_ms
            )?;
        }
        if self.by_function {
            for s in &self.slowest {
                let sp = &s.span;
                writeln!(f)?;
                let status = match sp.status {
                    "error" if sp.message.is_empty() => "  error".to_string(),
                    "error" => format!("  error: {}", sp.message),
                    _ => String::new(),
                };
                let trace = if sp.trace_id.is_empty() {
                    String::new()
                } else {
                    format!("  trace {} span {}", sp.trace_id, sp.span_id)
                };
                writeln!(
                    f,
                    "{}: {:.3} ms at {:.3} s, thread {}{trace}{status}",
                    sp.name,
                    sp.duration_ms.unwrap_or(0.0),
                    sp.begin_ns / 1e9,
                    if sp.thread.is_empty() { sp.thread_id.to_string() } else { sp.thread.clone() },
                )?;
                writeln!(f, "  {:>16}  {:>16}  function  file:line", "excl ms", "incl ms")?;
                for x in &s.functions {
                    writeln!(
                        f,
                        "  {:>16}  {:>16}  {}  {}",
                        with_interval(x.exclusive_ms, x.exclusive_ci_ms),
                        with_interval(x.inclusive_ms, x.inclusive_ci_ms),
                        x.function,
                        x.location
                    )?;
                }
            }
            for d in &self.differences {
                writeln!(f)?;
                writeln!(
                    f,
                    "{}: where the slow {} span{} (>= {:.3} ms) spent time the other {} span{} did not, ms per span",
                    d.name,
                    d.slow,
                    plural(d.slow),
                    d.threshold_ms,
                    d.others,
                    plural(d.others)
                )?;
                writeln!(
                    f,
                    "  {:>10}  {:>10}  {:>10}  {:>10}  function  file:line",
                    "extra excl", "extra incl", "slow incl", "others incl"
                )?;
                for x in d.functions.iter().filter(|x| x.extra_exclusive_ms > 0.0) {
                    writeln!(
                        f,
                        "  {:>10.3}  {:>10.3}  {:>10.3}  {:>10.3}  {}  {}",
                        x.extra_exclusive_ms, x.extra_ms, x.slow_ms, x.others_ms, x.function, x.location
                    )?;
                }
            }
            writeln!(f)?;
            writeln!(
                f,
                "Times by function are the clock's less the recorder's cost of each event (~: the cost is known to \
                 within {}x the larger of its measurements at the start and the stop, the 95% interval); a span \
                 begun in a coroutine holds only that coroutine's turns.",
                1.0 + COST_UNCERTAINTY
            )?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Holds;

    #[test]
    fn a_thread_s_span_holds_the_whole_stack_and_a_coroutine_s_from_its_innermost_activation() {
        assert_eq!(Holds::of(0), Holds::Thread);
        assert_eq!(Holds::Thread.base([7, 8, 9]), Some(0));
        assert!(Holds::Thread.holds([]));
        // A coroutine's span (frame id 8) holds the stack from its coroutine's innermost activation up.
        let coro = Holds::of(8);
        assert_eq!(coro.base([7, 8, 9, 8, 10]), Some(3));
        assert!(coro.holds([7, 8, 9]));
        // Another task runs: its coroutine is not on the stack, so none of this is the span's.
        assert_eq!(coro.base([7, 11, 12]), None);
        assert!(!coro.holds([7, 11, 12]));
    }
}
