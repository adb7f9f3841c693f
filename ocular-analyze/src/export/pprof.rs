//! pprof profiles (`profile.proto`, gzipped), which `go tool pprof`, Pyroscope, Parca and Grafana read.
//!
//! The messages below are the subset of pprof's `perftools.profiles` package that this exporter writes,
//! declared for prost by hand (as `pftrace` declares Perfetto's): field numbers and types are those of
//! `vendor/profile.proto`, pprof's own file (github.com/google/pprof, `proto/profile.proto` as of commit
//! 101d87ff5bc37124090081eb492825d9439a6a53, Apache-2.0: `vendor/LICENSE.pprof`), which the Python tests
//! decode our output with. No `protoc` is needed to build.
//!
//! What goes in: one sample per distinct call stack of each thread of each process (the analysis pass's
//! call tree), its locations leaf first, one location per function at the function's first line (the
//! tree keeps functions, not call sites). Sample values are self values, pprof's convention (the tools
//! derive inclusive figures): `calls` (count, the calls made with that stack), `wall` (ns of exclusive
//! time, recorder cost subtracted as in `stats`), and one value per performance counter recorded (its
//! events in the leaf function itself). Labels: `pid` and `thread_id` (numbers) and `thread` (the
//! thread's name), so `-tagfocus` can narrow to one; every view merges them otherwise. Functions are
//! shared across processes by (qualified name, file, first line), so a run's processes merge too.
//!
//! The profile is built in memory: its size grows with the number of distinct stacks and functions, not
//! with the trace's length (the pass that builds the tree streams the trace).

use crate::analysis::{Analysis, Node};
use crate::procs::Run;
use ocular_format::ReadOptions;
use prost::Message;
use rustc_hash::FxHashMap as HashMap;
use std::io::Write;
use std::path::Path;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
    #[prost(int64, tag = "5")]
    start_line: i64,
}

/// The one mapping every location belongs to: it says that functions, files and lines are known, so pprof
/// does not try to symbolize addresses (there are none).
const MAPPING_ID: u64 = 1;

/// What an export wrote.
#[derive(Debug, Default)]
pub struct Summary {
    /// Samples (distinct stacks per thread and process).
    pub samples: usize,
    /// Functions.
    pub functions: usize,
    /// Sample types (`calls`, `wall`, then the counters).
    pub sample_types: Vec<String>,
    /// The readers' warnings.
    pub warnings: Vec<String>,
}

/// A profile being built: interned strings (index 0 is "", as pprof requires), functions with their
/// location (one each, same id), samples merged by labels and stack.
#[derive(Debug)]
struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    /// (name, file, first line) -> function id (= its location's id).
    functions: HashMap<(i64, i64, i64), u64>,
    /// (pid, thread id, location ids leaf first, span key or 0) -> position in `p.sample`.
    samples: HashMap<(u32, u64, Vec<u64>, u64), usize>,
}

impl Builder {
    fn new() -> Self {
        let mut b = Builder {
            p: Profile::default(),
            strings: HashMap::default(),
            functions: HashMap::default(),
            samples: HashMap::default(),
        };
        b.string("");
        let python = b.string("python");
        b.p.mapping.push(Mapping {
            id: MAPPING_ID,
            filename: python,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
        });
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// The sample type `name` in `unit`, added at the end if new; its position in every sample's values.
    fn sample_type(&mut self, name: &str, unit: &str) -> usize {
        let (t, u) = (self.string(name), self.string(unit));
        if let Some(i) = self.p.sample_type.iter().position(|v| v.r#type == t) {
            return i;
        }
        self.p.sample_type.push(ValueType { r#type: t, unit: u });
        self.p.sample_type.len() - 1
    }

    /// The location of function `name` in `file` starting at `line`.
    fn location(&mut self, name: &str, file: &str, line: u32) -> u64 {
        let key = (self.string(name), self.string(file), i64::from(line));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        self.p.function.push(Function { id, name: key.0, system_name: key.0, filename: key.1, start_line: key.2 });
        self.p.location.push(Location {
            id,
            mapping_id: MAPPING_ID,
            line: vec![Line { function_id: id, line: key.2 }],
        });
        self.functions.insert(key, id);
        id
    }

    /// Adds `values` (by sample type position) to the sample of `stack` (location ids, leaf first) on
    /// thread `tid` (named `thread`) of process `pid`, inside `span` if given (labelled with its name, trace
    /// id and span id, as Pyroscope's span profiles are).
    fn add(
        &mut self,
        pid: u32,
        tid: u64,
        thread: &str,
        stack: Vec<u64>,
        values: &[(usize, i64)],
        span: Option<&crate::spans::Span>,
    ) {
        let key = (pid, tid, stack, span.map_or(0, |s| s.key));
        let i = match self.samples.get(&key) {
            Some(&i) => i,
            None => {
                let mut label = vec![
                    Label { key: self.string("pid"), num: i64::from(pid), ..Label::default() },
                    Label { key: self.string("thread_id"), num: tid as i64, ..Label::default() },
                ];
                if !thread.is_empty() {
                    label.push(Label { key: self.string("thread"), str: self.string(thread), ..Label::default() });
                }
                if let Some(s) = span {
                    label.push(Label { key: self.string("span_name"), str: self.string(&s.name), ..Label::default() });
                    for (k, v) in [("trace_id", &s.trace_id), ("span_id", &s.span_id)] {
                        if !v.is_empty() {
                            label.push(Label { key: self.string(k), str: self.string(v), ..Label::default() });
                        }
                    }
                }
                self.p.sample.push(Sample { location_id: key.2.clone(), value: Vec::new(), label });
                self.samples.insert(key, self.p.sample.len() - 1);
                self.p.sample.len() - 1
            }
        };
        let v = &mut self.p.sample[i].value;
        for &(k, x) in values {
            if v.len() <= k {
                v.resize(k + 1, 0);
            }
            v[k] += x;
        }
    }

    /// The profile, every sample's values as long as the sample types.
    fn finish(mut self) -> Profile {
        let n = self.p.sample_type.len();
        for s in &mut self.p.sample {
            s.value.resize(n, 0);
        }
        self.p
    }
}

/// The location of code object `code` of analysis `a`.
fn location_of(b: &mut Builder, a: &Analysis, code: u32) -> u64 {
    match a.code.get(&code) {
        Some(co) => b.location(&co.qualname, &co.filename, co.first_line),
        None => b.location(&format!("<code {code}>"), "?", 0),
    }
}

/// Adds the call tree of one process (`pid`, its trace `path`) to the profile; returns the comments it
/// calls for.
fn add_process(b: &mut Builder, a: &Analysis, pid: u32, path: &Path, opts: ReadOptions) -> anyhow::Result<Vec<String>> {
    let (calls, wall) = (b.sample_type("calls", "count"), b.sample_type("wall", "nanoseconds"));
    // What ran inside spans (FORMAT.md 5.9) moves from the stack's sample to one labelled with the span (the
    // innermost): per (thread, code ids leaf first), the wall ns and calls moved.
    let mut moved: HashMap<(u64, Vec<u32>), (i64, i64)> = HashMap::default();
    let (spans, stacks) = crate::spans::stacks(path, opts)?;
    let mut stacks: Vec<_> = stacks.into_iter().collect();
    stacks.sort_unstable_by(|x, y| x.0.cmp(&y.0));
    for ((i, tid, codes), (ticks, n)) in stacks {
        let ns = a.ns(ticks).round().max(0.0) as i64;
        if ns == 0 && n == 0 {
            continue;
        }
        let leaf_first: Vec<u32> = codes.into_iter().rev().collect();
        let stack = leaf_first.iter().map(|&code| location_of(b, a, code)).collect();
        let thread = a.threads.get(&tid).map_or("", String::as_str);
        b.add(pid, tid, thread, stack, &[(calls, n as i64), (wall, ns)], Some(&spans[i]));
        let m = moved.entry((tid, leaf_first)).or_default();
        m.0 += ns;
        m.1 += n as i64;
    }
    // Counters that could not be opened have no figures (as in `stats`).
    let counters: Vec<Option<usize>> =
        a.counters.iter().map(|c| c.error.is_empty().then(|| b.sample_type(&c.name, &c.unit))).collect();
    // Parents come before their children: a node's parent and what it stands for, by node.
    let mut tree: Vec<(u32, Node)> = vec![(0, Node::Thread(0))];
    let mut values = Vec::new();
    for (node, parent, what, ticks) in a.tree.nodes() {
        debug_assert_eq!(node as usize, tree.len());
        tree.push((parent, what));
        if matches!(what, Node::Code(_)) {
            values.push((node, ticks));
        }
    }
    for (node, ticks) in values {
        // Negative exclusive times (a tiny frame's corrected time) count as none, as in the flame graph.
        let mut codes = Vec::new();
        let mut n = node;
        let tid = loop {
            match tree[n as usize] {
                (_, Node::Thread(tid)) => break tid,
                (parent, Node::Code(code)) => {
                    codes.push(code);
                    n = parent;
                }
            }
        };
        let (in_spans_ns, in_spans_calls) = moved.remove(&(tid, codes.clone())).unwrap_or_default();
        let mut v = vec![
            (calls, (a.tree.calls(node).round() as i64 - in_spans_calls).max(0)),
            (wall, (a.ns(ticks).round().max(0.0) as i64 - in_spans_ns).max(0)),
        ];
        if let Some(c) = a.tree.counters(node) {
            v.extend(counters.iter().zip(c).filter_map(|(k, &x)| k.map(|k| (k, x as i64))));
        }
        if v.iter().all(|&(_, x)| x == 0) {
            continue;
        }
        let stack = codes.iter().map(|&code| location_of(b, a, code)).collect();
        let thread = a.threads.get(&tid).map_or("", String::as_str);
        b.add(pid, tid, thread, stack, &v, None);
    }
    let mut notes = Vec::new();
    if !spans.is_empty() {
        notes.push(format!(
            "process {pid}: {} spans: what ran inside one is in samples labelled with the innermost's span_name, \
             trace_id and span_id (counters stay in the unlabelled samples)",
            spans.len()
        ));
    }
    if let Some(h) = &a.header {
        let threshold = match h.options.mode {
            ocular_format::Mode::Calls => String::new(),
            _ => format!(", threshold {}", h.options.deinstrument_threshold),
        };
        notes.push(format!("process {pid}: Python {}, {} mode{threshold}", h.python_version, h.options.mode.name()));
    }
    let tps = a.header.as_ref().map_or(1e9, |h| h.ticks_per_second);
    match a.windows.as_ref().filter(|w| w.estimated()) {
        Some(w) => notes.push(format!("process {pid}: ESTIMATED (~): {}", w.describe(tps))),
        None => notes.push(format!(
            "process {pid}: every call recorded: calls exact, times the clock's less the recorder's measured cost"
        )),
    }
    if !a.losses.is_empty() {
        notes.push(format!(
            "process {pid}: {:.1}% of events were lost (the recorder had no free buffer): figures miss those \
             stretches",
            a.lost_share(0) * 100.0
        ));
    }
    Ok(notes)
}

/// Writes the pprof profile (gzipped) of the run that `path` begins, every process analyzed, to `out`.
pub fn export(path: &Path, opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<Summary> {
    let (run, mut warnings) = crate::procs::open(path, opts)?;
    let mut analyses = Vec::new();
    for p in &run.processes {
        let a = crate::analysis::analyze(&p.path, opts)?;
        warnings.extend(a.warnings.iter().cloned());
        analyses.push(a);
    }
    let mut s = export_run(&run, &analyses, opts, out)?;
    s.warnings = warnings;
    Ok(s)
}

/// Writes the pprof profile (gzipped) of `run`, whose processes' analyses are `analyses`, to `out`.
pub fn export_run(run: &Run, analyses: &[Analysis], opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<Summary> {
    let mut b = Builder::new();
    let mut comments = vec![format!(
        "Ocular {} trace: exclusive (self) values per stack, recorder cost subtracted",
        env!("CARGO_PKG_VERSION")
    )];
    let (mut first_ns, mut last_ns, mut start_unix) = (f64::MAX, 0.0f64, i64::MAX);
    for (p, a) in run.processes.iter().zip(analyses) {
        comments.extend(add_process(&mut b, a, p.pid, &p.path, opts)?);
        let span = a.span;
        if span.last_ns > 0.0 {
            first_ns = first_ns.min(span.first_ns);
            last_ns = last_ns.max(span.last_ns);
        }
        if let Some(h) = &a.header {
            // The header's wall clock at its start, moved to the first event (monotonic clock, shared).
            let unix = h.start_unix_ns + (span.first_ns - h.start_monotonic_ns as f64).max(0.0) as i64;
            start_unix = start_unix.min(if span.last_ns > 0.0 { unix } else { h.start_unix_ns });
        }
    }
    if b.p.sample.is_empty() {
        anyhow::bail!("no function calls recorded, nothing to profile");
    }
    b.p.time_nanos = if start_unix == i64::MAX { 0 } else { start_unix };
    b.p.duration_nanos = if last_ns > first_ns { (last_ns - first_ns).round() as i64 } else { 0 };
    b.p.period_type = Some(ValueType { r#type: b.string("wall"), unit: b.string("nanoseconds") });
    // Traced, not sampled: every nanosecond counts once.
    b.p.period = 1;
    b.p.default_sample_type = b.string("wall");
    for c in comments {
        let i = b.string(&c);
        b.p.comment.push(i);
    }
    let p = b.finish();
    let summary = Summary {
        samples: p.sample.len(),
        functions: p.function.len(),
        sample_types: p.sample_type.iter().map(|t| p.string_table[t.r#type as usize].clone()).collect(),
        warnings: Vec::new(),
    };
    write(&p, out)?;
    Ok(summary)
}

/// `p` encoded and gzipped, as pprof files are.
fn write(p: &Profile, out: &mut dyn Write) -> std::io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny synthetic profile: main -> work on two threads, main alone on one, a counter.
    fn tiny() -> Profile {
        let mut b = Builder::new();
        let (calls, wall) = (b.sample_type("calls", "count"), b.sample_type("wall", "nanoseconds"));
        let main = b.location("main", "app.py", 1);
        let work = b.location("work", "app.py", 7);
        b.add(10, 1, "MainThread", vec![work, main], &[(calls, 3), (wall, 900)], None);
        b.add(10, 1, "MainThread", vec![main], &[(calls, 1), (wall, 100)], None);
        b.add(10, 2, "", vec![work, main], &[(wall, 50)], None);
        let faults = b.sample_type("page-faults", "faults");
        b.add(10, 1, "MainThread", vec![work, main], &[(faults, 4)], None);
        b.finish()
    }

    #[test]
    fn pprof_string_zero_ids_and_value_lengths() {
        let p = Profile::decode(tiny().encode_to_vec().as_slice()).unwrap();
        assert_eq!(p.string_table[0], "");
        let types: Vec<&str> = p.sample_type.iter().map(|t| p.string_table[t.r#type as usize].as_str()).collect();
        assert_eq!(types, ["calls", "wall", "page-faults"]);
        assert_eq!(p.sample.len(), 3, "one sample per thread and stack");
        for s in &p.sample {
            assert_eq!(s.value.len(), p.sample_type.len());
            assert!(s.location_id.iter().all(|&id| id != 0));
        }
        assert_eq!(p.sample[0].value, [3, 900, 4]);
        assert_eq!(p.sample[2].value, [0, 50, 0]);
        assert!(p.function.iter().all(|f| f.id != 0) && p.location.iter().all(|l| l.id != 0));
        assert!(p.location.iter().all(|l| l.mapping_id == MAPPING_ID && l.line[0].function_id == l.id));
        assert_eq!(p.mapping[0].id, MAPPING_ID);
        let work = &p.function[1];
        assert_eq!((p.string_table[work.name as usize].as_str(), work.start_line), ("work", 7));
        // Leaf first.
        assert_eq!(p.sample[0].location_id, [2, 1]);
        // The unnamed thread has no `thread` label.
        assert_eq!(p.sample[2].label.len(), 2);
    }

    #[test]
    fn pprof_output_is_gzipped() {
        let mut out = Vec::new();
        write(&tiny(), &mut out).unwrap();
        assert_eq!(&out[..2], [0x1f, 0x8b]);
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(out.as_slice()), &mut back).unwrap();
        assert_eq!(Profile::decode(back.as_slice()).unwrap(), tiny());
    }
}
