//! `report`: one self-contained HTML page of a trace (or a run of several processes): the run's facts, an
//! interactive flame graph / icicle per thread and merged, the function table, the hot loops with their
//! specialized opcodes, and the source of the hottest functions.
//!
//! Everything is aggregated here, in Rust: the page embeds `info --json`, `stats --json`, `hot --json` and
//! (where the trace has spans) `spans --json` as they are printed (so a script can check the page against
//! them), plus each thread's call tree pruned to the frames that can be seen, never the events. Its size depends on the number of distinct stacks and
//! functions, not on the trace's length. The flame graph is d3-flame-graph 5.0.0 on d3 7.9.0 (vendored in
//! `vendor/` with their licences, inlined into the page: it opens without a network).

use crate::analysis::{Analysis, Node};
use crate::procs::Run;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;

const TEMPLATE: &str = include_str!("template.html");
const D3: &str = include_str!("vendor/d3.v7.9.0.min.js");
const FLAMEGRAPH: &str = include_str!("vendor/d3-flamegraph.5.0.0.umd.min.js");
const FLAMEGRAPH_CSS: &str = include_str!("vendor/d3-flamegraph.5.0.0.css");
const LICENSE_D3: &str = include_str!("vendor/LICENSE.d3");
const LICENSE_FLAMEGRAPH: &str = include_str!("vendor/LICENSE.d3-flame-graph");

/// A frame narrower than this share of its thread's time is folded into its parent's "(smaller frames)":
/// at 1,600 px it would be under a fifth of a pixel wide.
pub const MIN_SHARE: f64 = 1e-4;
/// At most this many frames per thread's tree (the narrowest are folded first).
pub const MAX_NODES: usize = 20_000;
/// The source of this many functions (by inclusive time) is embedded, where its file is readable.
pub const SOURCES: usize = 40;

/// What the page is made of: the reports as their commands print them with `--json`, and the trees.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The trace's name, for the title.
    pub title: String,
    /// The run (a single trace is a run of one process).
    pub run: &'a Run,
    /// Its processes' analyses, in the run's order.
    pub analyses: &'a [Analysis],
    /// `info --json`.
    pub info: Value,
    /// `stats --json` (threads merged).
    pub stats: Value,
    /// `hot --json`.
    pub hot: Value,
    /// `stats --lines` of the run, every line (`None` when no process was recorded in a mode that records
    /// lines).
    pub lines: Option<crate::lines::Report>,
    /// `stats --async --top ASYNC_ROWS` of the run (`None` when no coroutine ran with its frame recorded).
    pub awaits: Option<crate::awaits::Report>,
    /// `specialize --json`.
    pub specialize: Value,
    /// `spans --json` of each process that has spans: (pid, its view).
    pub spans: Vec<(u32, crate::spans::Spans)>,
}

/// The rows of each async table the page lists.
pub const ASYNC_ROWS: usize = 50;

/// The hottest lines the page's table lists.
pub const LINES: usize = 100;

/// One function as the page names it.
#[derive(Serialize, PartialEq, Eq, Hash, Clone)]
struct Frame {
    name: String,
    file: String,
    line: u32,
}

/// One thread's call tree, flat: node i is `[parent (-1: the thread), frame, exclusive ns]`, a parent
/// always before its children.
#[derive(Serialize)]
struct Tree {
    pid: u32,
    thread_id: u64,
    label: String,
    total_ns: f64,
    /// Frames folded into "(smaller frames)".
    folded: usize,
    nodes: Vec<(i64, u32, f64)>,
}

/// A function's source lines, where its file could be read here.
#[derive(Serialize)]
struct Source {
    frame: u32,
    first_line: u32,
    lines: Vec<String>,
    /// Per line of the function that ran: `[line, hits, own ns, with callees ns, estimated]`.
    figures: Vec<(u32, u64, f64, f64, bool)>,
}

/// `stats --lines`' hottest rows and its notes.
#[derive(Serialize)]
struct LinesData<'a> {
    rows: &'a [crate::lines::Row],
    more: usize,
    notes: &'a [String],
}

#[derive(Serialize)]
struct Data<'a> {
    title: &'a str,
    generator: String,
    info: &'a Value,
    stats: &'a Value,
    hot: &'a Value,
    frames: Vec<Frame>,
    trees: Vec<Tree>,
    sources: Vec<Source>,
    lines: Option<LinesData<'a>>,
    awaits: Option<&'a crate::awaits::Report>,
    specialize: &'a Value,
    spans: &'a [(u32, crate::spans::Spans)],
}

/// Writes the page to `out`.
pub fn write(inputs: &Inputs<'_>, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut frame_of: HashMap<Frame, u32> = HashMap::new();
    let mut intern = |f: Frame| -> u32 {
        *frame_of.entry(f.clone()).or_insert_with(|| {
            frames.push(f);
            frames.len() as u32 - 1
        })
    };
    let smaller = intern(Frame { name: "(smaller frames)".into(), file: String::new(), line: 0 });
    let mut trees = Vec::new();
    let mut spans: HashMap<u32, (String, u32, u32)> = HashMap::new();
    for (p, a) in inputs.run.processes.iter().zip(inputs.analyses) {
        for mut t in trees_of(a, p.pid, &mut |code| {
            let co = a.code.get(&code);
            let f = Frame {
                name: co.map_or_else(|| format!("code {code}"), |c| c.qualname.clone()),
                file: co.map_or_else(String::new, |c| c.filename.clone()),
                line: co.map_or(0, |c| c.first_line),
            };
            let id = intern(f);
            if let Some(c) = co {
                let last = c.positions.iter().map(|p| p.end_line.max(p.line)).max().unwrap_or(0).max(0) as u32;
                spans.entry(id).or_insert_with(|| (c.filename.clone(), c.first_line, last.max(c.first_line)));
            }
            id
        }) {
            for n in &mut t.nodes {
                if n.1 == u32::MAX {
                    n.1 = smaller;
                }
            }
            trees.push(t);
        }
    }
    if !inputs.run.single() {
        for t in &mut trees {
            let p = inputs.run.processes.iter().find(|p| p.pid == t.pid);
            t.label = format!("{}: {}", p.map_or_else(|| t.pid.to_string(), |p| p.title()), t.label);
        }
    }
    let mut sources = sources(&inputs.stats, &frames, &spans);
    if let Some(l) = &inputs.lines {
        for s in &mut sources {
            let f = &frames[s.frame as usize];
            s.figures = l
                .rows
                .iter()
                .filter(|r| r.stat.file == f.file && r.stat.function == f.name)
                .map(|r| (r.stat.line, r.stat.hits, r.stat.own_ns, r.stat.with_callees_ns, r.stat.estimated))
                .collect();
        }
    }
    let lines = inputs.lines.as_ref().map(|l| LinesData {
        rows: &l.rows[..l.rows.len().min(LINES)],
        more: l.more + l.rows.len().saturating_sub(LINES),
        notes: &l.notes,
    });
    let data = Data {
        title: &inputs.title,
        generator: format!("ocular-analyze {}", env!("CARGO_PKG_VERSION")),
        info: &inputs.info,
        stats: &inputs.stats,
        hot: &inputs.hot,
        frames,
        trees,
        sources,
        lines,
        awaits: inputs.awaits.as_ref(),
        specialize: &inputs.specialize,
        spans: &inputs.spans,
    };
    // In a <script> element only "</" can end it early; JSON allows "<\/" for it.
    let json = serde_json::to_string(&data)?.replace("</", "<\\/");
    let page = TEMPLATE
        .replace("/*@TITLE@*/", &html_escape(&inputs.title))
        .replace("/*@FLAMEGRAPH_CSS@*/", FLAMEGRAPH_CSS)
        .replace(
            "/*@LICENSES@*/",
            &format!("{LICENSE_D3}\n\nd3-flame-graph 5.0.0:\n{LICENSE_FLAMEGRAPH}").replace("--", "- -"),
        )
        .replace("/*@D3@*/", &D3.replace("</script", "<\\/script"))
        .replace("/*@FLAMEGRAPH@*/", &FLAMEGRAPH.replace("</script", "<\\/script"))
        .replace("/*@DATA@*/", &json);
    out.write_all(page.as_bytes())?;
    Ok(())
}

/// The call trees of one process's threads, pruned ([`MIN_SHARE`], [`MAX_NODES`]): the frames folded into
/// a parent's "(smaller frames)" child get frame `u32::MAX`, which the caller names.
fn trees_of(a: &Analysis, pid: u32, frame: &mut dyn FnMut(u32) -> u32) -> Vec<Tree> {
    let ns_per_tick = a.ns(1.0);
    let nodes: Vec<(u32, u32, Node, f64)> = a.tree.nodes().collect();
    // Node ids are dense and parents come first: inclusive time by a pass from the end.
    let len = nodes.last().map_or(1, |n| n.0 as usize + 1);
    let mut inclusive = vec![0.0f64; len];
    for &(id, parent, _, x) in nodes.iter().rev() {
        inclusive[id as usize] += x;
        let add = inclusive[id as usize];
        inclusive[parent as usize] += add;
    }
    let mut trees: Vec<Tree> = Vec::new();
    let mut tree_of: HashMap<u32, usize> = HashMap::new(); // thread root node -> tree
    let mut kept: HashMap<u32, i64> = HashMap::new(); // node -> index in its tree
    let mut folded_into: HashMap<u32, i64> = HashMap::new(); // parent node -> its "(smaller frames)" index
                                                             // Each frame's thread root, and per thread the width under which frames are folded: MIN_SHARE of its
                                                             // time, raised where needed so that at most MAX_NODES frames are kept.
    let mut root_of = vec![0u32; len];
    let mut threshold: HashMap<u32, f64> = HashMap::new();
    let mut widths: HashMap<u32, Vec<f64>> = HashMap::new();
    for &(id, parent, node, _) in &nodes {
        if let Node::Thread(_) = node {
            threshold.insert(id, inclusive[id as usize] * MIN_SHARE);
            continue;
        }
        let root = if root_of[parent as usize] == 0 { parent } else { root_of[parent as usize] };
        root_of[id as usize] = root;
        widths.entry(root).or_default().push(inclusive[id as usize]);
    }
    for (root, mut w) in widths {
        if w.len() > MAX_NODES {
            w.sort_by(|x, y| y.total_cmp(x));
            let t = threshold.entry(root).or_default();
            *t = t.max(w[MAX_NODES]);
        }
    }
    for &(id, parent, node, x) in &nodes {
        match node {
            Node::Thread(tid) => {
                tree_of.insert(id, trees.len());
                trees.push(Tree {
                    pid,
                    thread_id: tid,
                    label: a.threads.get(&tid).map_or_else(|| format!("thread {tid}"), |n| format!("{n} ({tid})")),
                    total_ns: inclusive[id as usize] * ns_per_tick,
                    folded: 0,
                    nodes: Vec::new(),
                });
            }
            Node::Code(code) => {
                let root = root_of[id as usize];
                let t = &mut trees[tree_of[&root]];
                let parent_index = if parent == root { Some(-1) } else { kept.get(&parent).copied() };
                let Some(parent_index) = parent_index else { continue }; // under a folded frame
                if inclusive[id as usize] > threshold[&root] {
                    kept.insert(id, t.nodes.len() as i64);
                    t.nodes.push((parent_index, frame(code), x * ns_per_tick));
                } else {
                    t.folded += 1;
                    let at = *folded_into.entry(parent).or_insert_with(|| {
                        t.nodes.push((parent_index, u32::MAX, 0.0));
                        t.nodes.len() as i64 - 1
                    });
                    t.nodes[at as usize].2 += inclusive[id as usize] * ns_per_tick;
                }
            }
        }
    }
    trees.retain(|t| t.total_ns > 0.0);
    trees
}

/// The source of the hottest functions of `stats` (by inclusive time) whose files are readable here.
fn sources(stats: &Value, frames: &[Frame], spans: &HashMap<u32, (String, u32, u32)>) -> Vec<Source> {
    let mut rows: Vec<&Value> = stats.as_array().map(|r| r.iter().collect()).unwrap_or_default();
    rows.sort_by(|a, b| {
        let f = |r: &Value| r["inclusive_ms"].as_f64().unwrap_or(0.0);
        f(b).total_cmp(&f(a))
    });
    let mut files: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut out = Vec::new();
    for r in rows {
        if out.len() == SOURCES {
            break;
        }
        let (Some(name), Some(file), Some(line)) = (r["function"].as_str(), r["file"].as_str(), r["line"].as_u64())
        else {
            continue;
        };
        let Some(id) = frames.iter().position(|f| f.name == name && f.file == file && f.line as u64 == line) else {
            continue;
        };
        let Some((path, first, last)) = spans.get(&(id as u32)) else { continue };
        if out.iter().any(|s: &Source| s.frame == id as u32) {
            continue;
        }
        let text = files
            .entry(path.clone())
            .or_insert_with(|| std::fs::read_to_string(path).ok().map(|t| t.lines().map(str::to_string).collect()));
        let Some(text) = text else { continue };
        let (first, last) = (*first.max(&1) as usize, (*last as usize).min(text.len()));
        if first > last {
            continue;
        }
        out.push(Source {
            frame: id as u32,
            first_line: first as u32,
            lines: text[first - 1..last].to_vec(),
            figures: Vec::new(),
        });
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
