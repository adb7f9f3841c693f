//! Flame graphs: call stacks folded with their exclusive time (recorder cost subtracted, as in `stats`),
//! rendered to SVG by `inferno`. Memory holds one stack per thread and one counter per distinct stack.

use ocular_format::{Body, EventKind, ReadOptions, Reader};
use rustc_hash::FxHashMap as HashMap;
use std::io::Write;
use std::path::Path;

struct Frame {
    code: u32,
    entered: u64,
    entered_cost: f64,
    child_ticks: u64,
    child_cost: f64,
}

#[derive(Default)]
struct Thread {
    stack: Vec<Frame>,
    cost: f64,
    last: u64,
}

/// Folded stacks, `("outer;inner;leaf", exclusive nanoseconds)`, sorted.
pub type Folded = Vec<(String, u64)>;

/// Folded stacks, one entry per distinct stack (threads merged), and the reader's warnings.
pub fn folded(path: &Path, opts: ReadOptions) -> anyhow::Result<(Folded, Vec<String>)> {
    let mut r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let mut cost = [header.event_cost_ticks.max(0.0); 256];
    let mut names: HashMap<u32, String> = HashMap::default();
    let mut threads: HashMap<u64, Thread> = HashMap::default();
    let mut stacks: HashMap<Vec<u32>, f64> = HashMap::default();
    crate::progress::begin("folding stacks", std::fs::metadata(path).map(|m| m.len()).unwrap_or(0));
    let close = |th: &mut Thread, t: u64, stacks: &mut HashMap<Vec<u32>, f64>| {
        let path: Vec<u32> = th.stack.iter().map(|f| f.code).collect();
        let Some(f) = th.stack.pop() else { return };
        let span = t.saturating_sub(f.entered);
        let span_cost = th.cost - f.entered_cost;
        let exclusive = span.saturating_sub(f.child_ticks) as f64 - (span_cost - f.child_cost);
        *stacks.entry(path).or_default() += exclusive;
        if let Some(p) = th.stack.last_mut() {
            p.child_ticks += span;
            p.child_cost += span_cost;
        }
    };
    while let Some(c) = r.next_chunk()? {
        crate::progress::at(c.info.offset);
        match c.body {
            Body::Code(objs) => {
                for o in objs {
                    // ';' separates frames in the folded format.
                    names.insert(o.id, o.qualname.replace(';', ":"));
                }
            }
            Body::Calibration(c) => cost = c.table(header.event_cost_ticks.max(0.0)),
            Body::Events(evs) => {
                let th = threads.entry(c.info.thread_id).or_default();
                for e in evs {
                    let t = e.ticks.get();
                    th.cost += cost[e.kind as usize];
                    th.last = t;
                    let id = e.code.get();
                    match e.event_kind() {
                        Some(EventKind::PY_START | EventKind::PY_RESUME | EventKind::PY_THROW) => {
                            th.stack.push(Frame {
                                code: id,
                                entered: t,
                                entered_cost: th.cost,
                                child_ticks: 0,
                                child_cost: 0.0,
                            })
                        }
                        Some(EventKind::PY_RETURN | EventKind::PY_YIELD | EventKind::PY_UNWIND) => {
                            if let Some(pos) = th.stack.iter().rposition(|f| f.code == id) {
                                while th.stack.len() > pos {
                                    close(th, t, &mut stacks);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    crate::progress::end();
    for th in threads.values_mut() {
        while !th.stack.is_empty() {
            let t = th.last;
            close(th, t, &mut stacks);
        }
    }
    let ns = 1e9 / header.ticks_per_second;
    let mut lines: Folded = stacks
        .into_iter()
        .filter_map(|(path, ticks)| {
            let v = (ticks.max(0.0) * ns).round() as u64;
            (v > 0).then(|| {
                let s: Vec<&str> = path.iter().map(|id| names.get(id).map_or("?", |n| n.as_str())).collect();
                (s.join(";"), v)
            })
        })
        .collect();
    lines.sort();
    let name = path.display().to_string();
    Ok((lines, r.report().warnings(&name)))
}

/// Writes an SVG flame graph of `path` to `out`.
pub fn svg(path: &Path, opts: ReadOptions, title: &str, out: &mut dyn Write) -> anyhow::Result<Vec<String>> {
    let (lines, warnings) = folded(path, opts)?;
    if lines.is_empty() {
        anyhow::bail!("{}: no function calls recorded, nothing to draw", path.display());
    }
    let text: Vec<String> = lines.iter().map(|(s, v)| format!("{s} {v}")).collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "ns".to_string();
    inferno::flamegraph::from_lines(&mut options, text.iter().map(String::as_str), out)?;
    Ok(warnings)
}
