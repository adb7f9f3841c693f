//! `stats`: per function calls, inclusive and exclusive time.

use crate::analysis::{Analysis, FunctionStats};
use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

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
}

/// Rows for every function, merged over threads or per thread.
pub fn rows(a: &Analysis, per_thread: bool, sort: SortBy) -> Vec<Row> {
    let mut out = Vec::new();
    let mut push = |tid: u64, m: &HashMap<u32, FunctionStats>| {
        for (id, s) in m {
            let Some(co) = a.code.get(id) else { continue };
            if s.calls == 0 && s.exclusive == 0.0 {
                continue;
            }
            let inclusive_ms = a.ns(s.inclusive.max(0.0)) / 1e6;
            out.push(Row {
                thread_id: tid,
                function: co.qualname.clone(),
                file: co.filename.clone(),
                line: co.first_line,
                calls: s.calls,
                inclusive_ms,
                exclusive_ms: a.ns(s.exclusive.max(0.0)) / 1e6,
                mean_us: if s.calls > 0 { inclusive_ms * 1e3 / s.calls as f64 } else { 0.0 },
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
    let key = |r: &Row| match sort {
        SortBy::Exclusive => r.exclusive_ms,
        SortBy::Inclusive => r.inclusive_ms,
        SortBy::Calls => r.calls as f64,
        SortBy::Mean => r.mean_us,
    };
    out.sort_by(|x, y| key(y).total_cmp(&key(x)).then_with(|| x.function.cmp(&y.function)));
    out
}

/// Text table.
pub fn render(a: &Analysis, rows: &[Row], top: usize, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let per_thread = rows.iter().any(|r| r.thread_id != 0);
    writeln!(
        out,
        "{:>10} {:>12} {:>12} {:>11}  {}function  file:line",
        "calls",
        "incl ms",
        "excl ms",
        "mean us",
        if per_thread { "thread  " } else { "" }
    )?;
    for r in rows.iter().take(top) {
        let thread = if per_thread {
            format!("{:<8}", a.threads.get(&r.thread_id).cloned().unwrap_or_else(|| r.thread_id.to_string()))
        } else {
            String::new()
        };
        writeln!(
            out,
            "{:>10} {:>12.3} {:>12.3} {:>11.3}  {thread}{}  {}:{}",
            r.calls, r.inclusive_ms, r.exclusive_ms, r.mean_us, r.function, r.file, r.line
        )?;
    }
    if rows.len() > top {
        writeln!(out, "... {} more (use --top)", rows.len() - top)?;
    }
    if let Some(h) = &a.header {
        let n = h.options.deinstrument_threshold;
        if n > 0 && h.options.mode != ocular_format::Mode::Calls && rows.iter().any(|r| r.calls >= n as u64) {
            writeln!(
                out,
                "note: recorded with threshold {n}: a function's calls after its first {n} were not recorded, so \
                 calls and times of functions at {n} calls cover those only (record in calls mode, or with \
                 --threshold 0, for every call)"
            )?;
        }
    }
    Ok(())
}
