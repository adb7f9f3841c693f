//! `stats`: per function calls, inclusive and exclusive time, threads merged or one table per thread.
//!
//! Merged, a function's times are summed over the threads that ran it: with several threads they are
//! thread-time, and can exceed the recording's wall time (eight threads in `fib` for 4 s give 32 s of
//! it). So every row also gives its inclusive time as a share of the wall time times the threads summed,
//! and the report starts with the wall time and the number of threads.

use crate::analysis::{Analysis, FunctionStats};
use rustc_hash::FxHashMap as HashMap;
use serde::{Serialize, Serializer};
use std::fmt;

/// How to order the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Exclusive time (time in the function itself).
    Exclusive,
    /// Inclusive time (with callees).
    Inclusive,
    /// Number of calls.
    Calls,
    /// Inclusive time per call.
    Mean,
}

/// One row.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Process id; 0 in a run's rows merged over its processes (`processes` says how many).
    pub pid: u32,
    /// In a run of several processes merged: how many processes ran the function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<usize>,
    /// Thread id, or 0 when merged.
    pub thread_id: u64,
    /// Qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// First line.
    pub line: u32,
    /// Calls.
    pub calls: u64,
    /// Inclusive ms.
    pub inclusive_ms: f64,
    /// Exclusive ms.
    pub exclusive_ms: f64,
    /// Inclusive µs per call.
    pub mean_us: f64,
    /// Calls, inclusive and exclusive times are estimates: scaled up from the recording's windows
    /// (FORMAT.md 5.3) for the part of the run after its first window. Marked `~` in the text.
    pub estimated: bool,
    /// `calls` is an estimate (some were recorded in windows after the first).
    pub calls_estimated: bool,
    /// Calls actually recorded (equal to `calls` unless `estimated`).
    pub observed_calls: u64,
    /// Half the width of a 95% interval around `calls` when it is an estimate (0 when exact): the truth
    /// lies in `calls ± calls_ci95` 19 times in 20, as far as the windows can tell.
    pub calls_ci95: f64,
    /// Half the widths of 95% intervals around `inclusive_ms` and `exclusive_ms` when they are estimates (0
    /// when exact), from how the windows' times of the function vary.
    pub inclusive_ci95_ms: f64,
    pub exclusive_ci95_ms: f64,
    /// `calls` is only a lower bound: more calls were made outside windows than were counted, and no
    /// window saw one (text: `>=N`, no interval); or the recorder dropped events of the thread (or of any
    /// thread, merged), which may have held more calls (text: `>=N`, "at least").
    pub calls_lower_bound: bool,
    /// The times are only lower bounds: the function was called after the part of the run recorded
    /// completely, and no window saw it run (text: `>=`, no interval).
    pub times_lower_bound: bool,
    /// The share of its thread's events (of every thread's, merged) that the recorder dropped: above 0,
    /// the figures miss those stretches (the reader's warnings say when).
    pub lost_share: f64,
    /// Performance counters (FORMAT.md 6.9): each recorded counter's events in the function itself
    /// (sampled: its samples' periods), by name. Estimates where `estimated` is: the windows' samples
    /// scaled as the times are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<(String, u64)>,
}

/// Rows for every function, merged over threads or per thread, in the order `sort` asks for (per thread,
/// the threads' rows are interleaved: [`report`] groups them).
pub fn rows(a: &Analysis, per_thread: bool, sort: SortBy) -> Vec<Row> {
    let pid = a.header.as_ref().map_or(0, |h| h.pid);
    let mut out = Vec::new();
    let mut push = |tid: u64, m: &HashMap<u32, FunctionStats>| {
        for (id, s) in m {
            let Some(co) = a.code.get(id) else { continue };
            if s.calls == 0 && s.exclusive == 0.0 {
                continue;
            }
            let inclusive_ms = a.ns(s.inclusive.max(0.0)) / 1e6;
            let lost_share = a.lost_share(tid);
            out.push(Row {
                pid,
                processes: None,
                thread_id: tid,
                function: co.qualname.clone(),
                file: co.filename.clone(),
                line: co.first_line,
                calls: s.calls,
                inclusive_ms,
                exclusive_ms: a.ns(s.exclusive.max(0.0)) / 1e6,
                mean_us: if s.calls > 0 { inclusive_ms * 1e3 / s.calls as f64 } else { 0.0 },
                estimated: s.estimated,
                calls_estimated: s.calls_estimated,
                observed_calls: s.observed_calls,
                calls_ci95: s.calls_ci,
                inclusive_ci95_ms: a.ns(s.inclusive_ci) / 1e6,
                exclusive_ci95_ms: a.ns(s.exclusive_ci) / 1e6,
                // Events the recorder dropped may hold calls of any function: a count that would be exact
                // is the least there were (a thread per request read 1,999 "exact" calls of 2,000).
                calls_lower_bound: s.calls_lower_bound || (lost_share > 0.0 && !s.calls_estimated),
                times_lower_bound: s.times_lower_bound,
                lost_share,
                counters: a
                    .counters
                    .iter()
                    .zip(a.counters_of(tid, *id))
                    .filter(|(c, _)| c.error.is_empty())
                    .map(|(c, n)| (c.name.clone(), n))
                    .collect(),
            });
        }
    };
    if per_thread {
        for (tid, m) in &a.per_thread {
            push(*tid, m);
        }
    } else {
        push(0, &a.functions);
    }
    sort_rows(&mut out, sort);
    out
}

fn sort_rows(rows: &mut [Row], sort: SortBy) {
    let key = |r: &Row| match sort {
        SortBy::Exclusive => r.exclusive_ms,
        SortBy::Inclusive => r.inclusive_ms,
        SortBy::Calls => r.calls as f64,
        SortBy::Mean => r.mean_us,
    };
    rows.sort_by(|x, y| key(y).total_cmp(&key(x)).then_with(|| x.function.cmp(&y.function)));
}

/// The recording's extent, which summed times are read against.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Span {
    /// From the first event to the last, of any thread, ms (the `duration` of `info`).
    pub wall_ms: f64,
    /// Threads with events.
    pub threads: usize,
    /// The first and the last event, `CLOCK_MONOTONIC` ns (for a run of several processes, which share it).
    pub first_ns: f64,
    pub last_ns: f64,
}

impl Span {
    /// With windows, the run lasted until its stop, which can come long after its last event (nothing is
    /// recorded between windows): frames still open then end at the stop, as the analysis ends them, so the
    /// wall time runs to the stop too (a 6 ms run read "wall 0.334 ms" beside a frame of 5.7 ms).
    pub fn to_the_stop(mut self, a: &Analysis) -> Span {
        if let (Some(w), Some(h)) = (&a.windows, &a.header) {
            let end_ns = h.start_monotonic_ns as f64 + a.ns((w.complete_ticks + w.sampled_ticks) as f64);
            if self.wall_ms > 0.0 && end_ns > self.last_ns {
                self.last_ns = end_ns;
                self.wall_ms = (self.last_ns - self.first_ns) / 1e6;
            }
        }
        self
    }
}

impl Span {
    /// The events from tick `first` to tick `last` of a recording with header `h` (`first` above `last`:
    /// none), on `threads` threads.
    pub fn of_ticks(h: &ocular_format::Header, first: u64, last: u64, threads: usize) -> Span {
        let tps = h.ticks_per_second;
        let wall_ms = if last > first && tps > 0.0 { (last - first) as f64 * 1e3 / tps } else { 0.0 };
        let ns = |t: u64| h.start_monotonic_ns as f64 + (t as f64 - h.start_ticks as f64) * 1e9 / tps.max(1.0);
        let (first_ns, last_ns) = if last >= first { (ns(first), ns(last)) } else { (0.0, 0.0) };
        Span { wall_ms, threads, first_ns, last_ns }
    }
}

/// A [`Row`] with what its inclusive time is a share of. In JSON, its fields follow the row's.
#[derive(Debug, Serialize)]
pub struct ShareRow {
    /// The row.
    #[serde(flatten)]
    pub row: Row,
    /// The thread's name, per thread ("" when merged, or when the thread had none).
    pub thread_name: String,
    /// The recording's wall time, ms ([`Span::wall_ms`]).
    pub wall_ms: f64,
    /// Threads whose times are summed in this row's table: the recording's threads when merged, 1 per
    /// thread.
    pub threads: usize,
    /// `inclusive_ms / (wall_ms * threads)`, from 0 to 1; null when the recording has no wall time.
    pub wall_share: Option<f64>,
}

/// One table: the functions of one thread, or of every thread merged (thread id 0).
#[derive(Debug)]
pub struct Table {
    /// In a run of several processes, one table per process: which ("12258 (fork of 12250): ...").
    pub process: Option<String>,
    /// Native thread id, 0 when merged.
    pub thread_id: u64,
    /// The thread's name ("" when merged, or when the thread had none).
    pub thread_name: String,
    /// The first `top` rows.
    pub rows: Vec<ShareRow>,
    /// Rows left out by `top`.
    pub more: usize,
}

/// What `stats` shows: the text form is [`fmt::Display`]; the JSON form is the array of every table's
/// rows (a [`ShareRow`] each), as before tables and shares were added.
#[derive(Debug)]
pub struct Report {
    /// Wall time and threads.
    pub span: Span,
    /// One table per thread, by thread id, instead of one merged.
    pub per_thread: bool,
    /// The tables.
    pub tables: Vec<Table>,
    /// A caveat about the figures (the de-instrumentation threshold), if one applies.
    pub note: Option<String>,
    /// A run of several processes: how many were recorded and how many ran unrecorded (0, 0 for one).
    pub processes: (usize, usize),
}

/// The report of `a` (whose recording spans `span`): at most `top` rows per table.
pub fn report(a: &Analysis, span: Span, per_thread: bool, sort: SortBy, top: usize) -> Report {
    let all = rows(a, per_thread, sort);
    let note = threshold_note(a, &all);
    let mut by_thread: HashMap<u64, Vec<Row>> = HashMap::default();
    for r in all {
        by_thread.entry(r.thread_id).or_default().push(r);
    }
    let mut ids: Vec<u64> = if per_thread { a.per_thread.keys().copied().collect() } else { vec![0] };
    ids.sort_unstable();
    let threads = if per_thread { 1 } else { span.threads };
    let tables = ids
        .into_iter()
        .map(|tid| {
            let thread_name = if per_thread { a.threads.get(&tid).cloned().unwrap_or_default() } else { String::new() };
            let rows = by_thread.remove(&tid).unwrap_or_default();
            let more = rows.len().saturating_sub(top);
            let rows = rows
                .into_iter()
                .take(top)
                .map(|row| {
                    let capacity = span.wall_ms * threads as f64;
                    let wall_share = (capacity > 0.0).then(|| row.inclusive_ms / capacity);
                    ShareRow { row, thread_name: thread_name.clone(), wall_ms: span.wall_ms, threads, wall_share }
                })
                .collect();
            Table { process: None, thread_id: tid, thread_name, rows, more }
        })
        .collect();
    Report { span, per_thread, tables, note, processes: (0, 0) }
}

/// One process of a run, for [`report_run`].
#[derive(Debug)]
pub struct Part<'a> {
    /// The process.
    pub process: &'a crate::procs::Process,
    /// Its analysis.
    pub analysis: &'a Analysis,
    /// Its extent.
    pub span: Span,
}

/// The report of a run of several processes: one table per process (`per_process`, or `per_thread`: one
/// per thread of each), or one table of every process merged, a function's figures summed over the
/// processes that ran it (by qualified name, file and line: each process numbers its code objects).
pub fn report_run(
    parts: &[Part<'_>],
    unrecorded: usize,
    per_process: bool,
    per_thread: bool,
    sort: SortBy,
    top: usize,
) -> Report {
    let processes = (parts.len(), unrecorded);
    if per_process || per_thread {
        let mut tables = Vec::new();
        let mut notes = Vec::new();
        for p in parts {
            let r = report(p.analysis, p.span, per_thread, sort, top);
            if let Some(n) = r.note {
                notes.push((p.process.pid, n));
            }
            for mut t in r.tables {
                t.process = Some(p.process.title());
                tables.push(t);
            }
        }
        let note = group_notes(notes);
        let span = parts.first().map_or_else(Span::default, |p| p.span);
        return Report { span, per_thread, tables, note, processes };
    }
    let mut merged: Vec<Row> = Vec::new();
    let mut index: HashMap<(String, String, u32), usize> = HashMap::default();
    let mut notes = Vec::new();
    for p in parts {
        let process_rows = rows(p.analysis, false, sort);
        if let Some(n) = threshold_note(p.analysis, &process_rows) {
            notes.push((p.process.pid, n));
        }
        for r in process_rows {
            let key = (r.function.clone(), r.file.clone(), r.line);
            match index.get(&key) {
                Some(&i) => {
                    let m = &mut merged[i];
                    m.calls += r.calls;
                    m.observed_calls += r.observed_calls;
                    m.calls_ci95 = m.calls_ci95.hypot(r.calls_ci95);
                    m.inclusive_ci95_ms = m.inclusive_ci95_ms.hypot(r.inclusive_ci95_ms);
                    m.exclusive_ci95_ms = m.exclusive_ci95_ms.hypot(r.exclusive_ci95_ms);
                    m.calls_lower_bound |= r.calls_lower_bound;
                    m.times_lower_bound |= r.times_lower_bound;
                    m.inclusive_ms += r.inclusive_ms;
                    m.exclusive_ms += r.exclusive_ms;
                    m.estimated |= r.estimated;
                    m.calls_estimated |= r.calls_estimated;
                    m.lost_share = m.lost_share.max(r.lost_share);
                    m.processes = m.processes.map(|n| n + 1);
                    for (name, n) in r.counters {
                        match m.counters.iter_mut().find(|c| c.0 == name) {
                            Some(c) => c.1 += n,
                            None => m.counters.push((name, n)),
                        }
                    }
                }
                None => {
                    index.insert(key, merged.len());
                    merged.push(Row { pid: 0, processes: Some(1), ..r });
                }
            }
        }
    }
    for m in &mut merged {
        m.mean_us = if m.calls > 0 { m.inclusive_ms * 1e3 / m.calls as f64 } else { 0.0 };
    }
    // Every row the same counter columns, in the first process's order.
    let names: Vec<String> =
        merged.iter().flat_map(|r| r.counters.iter().map(|c| c.0.clone())).fold(Vec::new(), |mut v, n| {
            if !v.contains(&n) {
                v.push(n);
            }
            v
        });
    for m in &mut merged {
        m.counters =
            names.iter().map(|n| (n.clone(), m.counters.iter().find(|c| &c.0 == n).map_or(0, |c| c.1))).collect();
    }
    sort_rows(&mut merged, sort);
    let first = parts.iter().map(|p| p.span.first_ns).filter(|&x| x > 0.0).fold(f64::MAX, f64::min);
    let last = parts.iter().map(|p| p.span.last_ns).fold(0.0, f64::max);
    let threads: usize = parts.iter().map(|p| p.span.threads).sum();
    let wall_ms = if last > first { (last - first) / 1e6 } else { 0.0 };
    let span = Span { wall_ms, threads, first_ns: first, last_ns: last };
    // A process's share: its threads for its own wall time, summed.
    let capacity: f64 = parts.iter().map(|p| p.span.wall_ms * p.span.threads as f64).sum();
    let more = merged.len().saturating_sub(top);
    let rows = merged
        .into_iter()
        .take(top)
        .map(|row| {
            let wall_share = (capacity > 0.0).then(|| row.inclusive_ms / capacity);
            ShareRow { row, thread_name: String::new(), wall_ms, threads, wall_share }
        })
        .collect();
    let note = group_notes(notes);
    Report {
        span,
        per_thread: false,
        tables: vec![Table { process: None, thread_id: 0, thread_name: String::new(), rows, more }],
        note,
        processes,
    }
}

/// Each process's note once per text: "processes 12, 13: the note" ("every process: ..." when all say it).
fn group_notes(notes: Vec<(u32, String)>) -> Option<String> {
    let total = notes.len();
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for (pid, n) in notes {
        match groups.iter_mut().find(|g| g.0 == n) {
            Some(g) => g.1.push(pid),
            None => groups.push((n, vec![pid])),
        }
    }
    let lines: Vec<String> = groups
        .into_iter()
        .map(|(n, pids)| match pids.len() {
            1 => format!("process {}: {n}", pids[0]),
            k if k == total && total > 1 => format!("every process: {n}"),
            _ => format!("processes {}: {n}", pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\nnote: "))
}

/// What the figures cover: with windows, which part is estimated; in a thresholded recording made before
/// windows (format 2.1 and earlier), that a function's calls after its first `n` were not recorded.
fn threshold_note(a: &Analysis, rows: &[Row]) -> Option<String> {
    let notes: Vec<String> =
        [lost_note(a), flight_note(a), windows_note(a, rows), cost_note(a, rows), counters_note(a)]
            .into_iter()
            .flatten()
            .collect();
    (!notes.is_empty()).then(|| notes.join("\nnote: "))
}

/// Events the recorder dropped: the counts are lower bounds (marked `>=`), and the threads' figures miss
/// those stretches.
fn lost_note(a: &Analysis) -> Option<String> {
    let lost: u64 = a.losses.iter().map(|l| l.lost).sum();
    let threads = a.losses.iter().filter(|l| l.lost > 0).count();
    (lost > 0).then(|| {
        format!(
            "the recorder dropped {lost} events in {threads} thread{} (its writer fell behind): counts marked >= \
             are the least there were, and times miss the stretches lost (ocular-analyze info says when and \
             where; record with --on-full wait to keep every event)",
            if threads == 1 { "" } else { "s" }
        )
    })
}

/// A flight recorder's trace covers its newest events only: say from when, and how many came before.
fn flight_note(a: &Analysis) -> Option<String> {
    if a.dropped.is_empty() {
        return None;
    }
    let events: u64 = a.dropped.iter().map(|d| d.events).sum();
    Some(format!(
        "a flight recorder's newest events: {events} earlier ones were overwritten by its ring and are not counted \
         here (ocular-analyze info shows from when, per thread); a function running when the kept part begins \
         counts from there"
    ))
}

/// With windows, counter samples taken between them belong to no recorded function: say how many.
fn counters_note(a: &Analysis) -> Option<String> {
    let between: u64 = a.counter_between_windows.iter().sum();
    (a.windows.is_some() && between > 0).then(|| {
        let list: Vec<String> = a
            .counters
            .iter()
            .zip(&a.counter_between_windows)
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| match c.unit.as_str() {
                "ns" => format!("{} {:.1} ms", c.name, *n as f64 / 1e6),
                _ => format!("{} {n}", c.name),
            })
            .collect();
        format!(
            "counters: the samples taken between windows ({}) are not given to a function (which one ran is not \
             recorded there): the windows' samples, scaled as the times are, stand for them",
            list.join(", ")
        )
    })
}

/// Without windows, times less the recorder's cost are estimates as far as that cost is unknown: say so.
fn cost_note(a: &Analysis, rows: &[Row]) -> Option<String> {
    let h = a.header.as_ref()?;
    let uncertain =
        rows.iter().any(|r| !r.estimated && (uncertain(r, r.inclusive_ci95_ms) || uncertain(r, r.exclusive_ci95_ms)));
    let sampled = a.windows.as_ref().is_some_and(|w| w.estimated());
    (!sampled && uncertain && h.ticks_per_second > 0.0).then(|| {
        let ratio = a.cost_speed_ratio.unwrap_or(1.0);
        let measured = match a.cost_speed_ratio {
            Some(r) => format!("as measured at the start and brought to the machine's speed at the stop (x{r:.2})"),
            None => "as measured at the start".into(),
        };
        // The far end is three times the larger of the start's and the stop's measurements
        // (`cost_far_end`): the start's where the machine ran faster at the stop.
        let of = if ratio < 1.0 { "the start's measurement" } else { "it" };
        format!(
            "times marked ~ are the clock's less the recorder's cost of the events in them, {:.1} ns each {measured}; \
             that measurement moves with the machine's speed, so their 95% intervals take the cost as anything from \
             none to three times {of}",
            h.event_cost_ticks * ratio * 1e9 / h.ticks_per_second,
        )
    })
}

fn windows_note(a: &Analysis, rows: &[Row]) -> Option<String> {
    let h = a.header.as_ref()?;
    if let Some(w) = &a.windows {
        return Some(w.describe(h.ticks_per_second));
    }
    let n = h.options.deinstrument_threshold;
    // Since windows (2.2), a recording without any records every call: its threshold thins out locations.
    (a.format_version <= (2, 1)
        && n > 0
        && h.options.mode != ocular_format::Mode::Calls
        && rows.iter().any(|r| r.calls >= n as u64))
    .then(|| {
        format!(
            "recorded with threshold {n}: a function's calls after its first {n} were not recorded, so calls and \
             times of functions at {n} calls cover those only (record in calls mode, or with --threshold 0, for \
             every call)"
        )
    })
}

impl Serialize for Report {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.tables.iter().flat_map(|t| &t.rows))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Span { wall_ms, threads: n, .. } = self.span;
        let threads = if n == 1 { "1 thread".to_string() } else { format!("{n} threads") };
        let (procs, unrecorded) = self.processes;
        if procs > 0 {
            let unrec = if unrecorded > 0 {
                format!(" ({unrecorded} more ran unrecorded: info lists them)")
            } else {
                String::new()
            };
            if self.tables.iter().any(|t| t.process.is_some()) {
                writeln!(f, "run of {procs} processes{unrec}, one table per process; incl % = incl ms / (the process's threads x its wall)")?;
            } else {
                writeln!(
                    f,
                    "run of {procs} processes{unrec}, wall {wall_ms:.3} ms, {threads}: times are summed over the \
                     processes and threads; incl % = incl ms / (the processes' threads x their walls)"
                )?;
            }
        } else if self.per_thread {
            writeln!(f, "wall {wall_ms:.3} ms, {threads}, one table per thread; incl % = incl ms / wall")?;
        } else if n > 1 {
            writeln!(
                f,
                "wall {wall_ms:.3} ms, {threads}: times are summed over the threads, so they can exceed the wall \
                 time; incl % = incl ms / ({n} x wall)"
            )?;
        } else {
            writeln!(f, "wall {wall_ms:.3} ms, {threads}; incl % = incl ms / wall")?;
        }
        for t in &self.tables {
            if let Some(p) = &t.process {
                writeln!(f, "\nprocess {p}")?;
            }
            if self.per_thread {
                let name = if t.thread_name.is_empty() { "unnamed" } else { &t.thread_name };
                writeln!(f, "\nthread {} ({name})", t.thread_id)?;
            }
            let names: Vec<&str> =
                t.rows.first().map(|r| r.row.counters.iter().map(|(n, _)| n.as_str()).collect()).unwrap_or_default();
            // Task clock in ms, as the time columns; the other counters as counts.
            let heads: String = names
                .iter()
                .map(|n| if *n == "task-clock" { format!(" {:>14}", "task-clock ms") } else { format!(" {n:>12}") })
                .collect();
            // Estimated counts and times carry their intervals, each in a column of its own.
            let ci = t.rows.iter().any(|r| r.row.calls_estimated);
            let time_ci = t
                .rows
                .iter()
                .any(|r| uncertain(&r.row, r.row.inclusive_ci95_ms) || uncertain(&r.row, r.row.exclusive_ci95_ms));
            let ci_head = |on: bool| if on { format!(" {:>9}", "±95%") } else { String::new() };
            writeln!(
                f,
                "{:>10}{} {:>12}{} {:>7} {:>12}{} {:>11}{heads}  function  file:line",
                "calls",
                ci_head(ci),
                "incl ms",
                ci_head(time_ci),
                "incl %",
                "excl ms",
                ci_head(time_ci),
                "mean us"
            )?;
            for ShareRow { row: r, wall_share, .. } in &t.rows {
                let share = wall_share.map_or_else(|| "-".to_string(), |s| format!("{:.1}%", s * 100.0));
                // An estimate reads as one: `~` before every figure scaled up from windows.
                let m = if r.estimated { "~" } else { "" };
                let counts: String = r
                    .counters
                    .iter()
                    .map(|(name, n)| {
                        if name == "task-clock" {
                            format!(" {:>14}", format!("{m}{:.3}", *n as f64 / 1e6))
                        } else {
                            format!(" {:>12}", format!("{m}{n}"))
                        }
                    })
                    .collect();
                // No call seen (an estimate of none, or frames entered before the recording): no mean.
                let mean = if r.calls > 0 {
                    // As uncertain as its two parts together.
                    let rel = |ci: f64, x: f64| if x > 0.0 { ci / x } else { 0.0 };
                    let spread = rel(r.inclusive_ci95_ms, r.inclusive_ms).hypot(rel(r.calls_ci95, r.calls as f64));
                    to_interval(r.mean_us, uncertain(r, spread * r.mean_us / 1e3), spread * r.mean_us)
                } else {
                    "-".into()
                };
                let interval = match (ci, r.calls_estimated, r.calls_lower_bound) {
                    (false, ..) => String::new(),
                    (true, false, false) => format!(" {:>9}", "exact"),
                    (true, false, true) => format!(" {:>9}", "at least"),
                    (true, true, true) => format!(" {:>9}", "unknown"),
                    (true, true, false) => format!(" {:>9}", format!("±{}", round2(r.calls_ci95))),
                };
                // A function no window saw, though it ran after the part recorded completely: its time is
                // what that part holds, at least, and how much more nothing says.
                let time_interval = |x: f64| match (time_ci, uncertain(r, x), r.times_lower_bound) {
                    (false, ..) => String::new(),
                    (true, false, _) => format!(" {:>9}", "exact"),
                    (true, true, true) => format!(" {:>9}", "unknown"),
                    (true, true, false) => format!(" {:>9}", format!("±{}", round_ms(x))),
                };
                // A time less a recorder's cost that is not known exactly reads as an estimate too.
                let mark = |ci: f64| match (r.times_lower_bound, uncertain(r, ci)) {
                    (true, _) => ">=",
                    (false, true) => "~",
                    (false, false) => "",
                };
                let calls_mark = match (r.calls_estimated, r.calls_lower_bound) {
                    (_, true) => ">=",
                    (true, false) => "~",
                    (false, false) => "",
                };
                writeln!(
                    f,
                    "{:>10}{interval} {:>12}{} {share:>7} {:>12}{} {mean:>11}{counts}  {}  {}:{}",
                    if r.calls_estimated && r.calls_ci95 > 0.0 {
                        format!("{calls_mark}{}", to_interval(r.calls as f64, true, r.calls_ci95))
                    } else {
                        format!("{calls_mark}{}", r.calls)
                    },
                    format!(
                        "{}{}",
                        mark(r.inclusive_ci95_ms),
                        to_interval(r.inclusive_ms, uncertain(r, r.inclusive_ci95_ms), r.inclusive_ci95_ms)
                    ),
                    time_interval(r.inclusive_ci95_ms),
                    format!(
                        "{}{}",
                        mark(r.exclusive_ci95_ms),
                        to_interval(r.exclusive_ms, uncertain(r, r.exclusive_ci95_ms), r.exclusive_ci95_ms)
                    ),
                    time_interval(r.exclusive_ci95_ms),
                    r.function,
                    r.file,
                    r.line
                )?;
            }
            if t.more > 0 {
                writeln!(f, "... {} more (use --top)", t.more)?;
            }
        }
        if let Some(note) = &self.note {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// Whether a row's time with interval `ci_ms` is uncertain in the digits printed: an estimate from windows,
/// or a time less a recorder's cost whose uncertainty reaches the half microsecond.
fn uncertain(r: &Row, ci_ms: f64) -> bool {
    r.estimated || ci_ms >= 0.0005
}

/// A figure with as many digits as its interval leaves meaningful (`~1273 ±58` ms, `~0.86 ±0.54` ms,
/// `~810000 ±850000` calls): an estimate printed to the microsecond or the last call would look exact.
/// Exact figures, and estimates with no spread, keep three decimals.
fn to_interval(ms: f64, estimated: bool, ci: f64) -> String {
    if !estimated || ci <= 0.0 {
        return format!("{ms:.3}");
    }
    let digits = ci.log10().floor() as i32 - 1;
    if digits > 0 {
        // Whole units past the interval's second digit are noise too: 141498 +-6500 reads 141500.
        let unit = 10f64.powi(digits);
        return format!("{:.0}", (ms / unit).round() * unit);
    }
    let decimals = (-digits).min(3) as usize;
    format!("{ms:.decimals$}")
}

/// An interval's half width in ms, to two significant digits, rounded up (at least 0.001).
fn round_ms(x: f64) -> String {
    if x <= 0.0 {
        return "0".into();
    }
    if x <= 0.001 {
        return "0.001".into();
    }
    let digits = x.log10().floor() as i32 - 1;
    let p = 10f64.powi(digits);
    let v = (x / p).ceil() * p;
    format!("{v:.*}", (-digits).max(0) as usize)
}

/// `x` to two significant digits, as a whole number (an interval's width is no more exact than that).
fn round2(x: f64) -> u64 {
    if x < 10.0 {
        return x.ceil() as u64;
    }
    let p = 10f64.powi(x.log10().floor() as i32 - 1);
    ((x / p).ceil() * p) as u64
}
