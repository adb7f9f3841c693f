//! A trace as three tables for dataframe tools: `events` (one row per recorded event), `calls` (one row per
//! function activation) and `code` (one row per code object).
//!
//! One streaming pass (the exporters' [`Timeline`]) fills column batches of at most `batch_rows` rows and
//! hands each to a [`Sink`]: Parquet files written with polars (feature `parquet`), or Arrow record batches
//! for the Python extension. Memory holds one batch, one stack per thread and the code objects, never the
//! whole trace. Before that pass a first pass collects the code objects and the specialized bytecode, which
//! the recorder writes at stop, after the events.
//!
//! Columns (types are Arrow's; `?` marks a nullable column; text columns are dictionary-encoded). Every
//! table starts with `pid` u32, the process: a run of several processes (FORMAT.md 10) is one set of
//! tables, its times (`ts_ns`, `start_ns`, `end_ns`) from the first process's start, through
//! `CLOCK_MONOTONIC`, which the processes share.
//! - events: `thread_id` u64, `ts_ns` i64 (ns since the recording started), `tsc` u64 (raw ticks),
//!   `event` text (as `sys.monitoring.events` names it; its dictionary holds every kind the format defines,
//!   in kind-number order, the same in every export; null for a kind this analyzer does not know),
//!   `code_id` u32, `function` text (qualname), `file`
//!   text, `line` i32?, `offset` u32 (bytecode offset), `arg` u32 (jump destination; 0 for other events),
//!   `opcode` text (base opcode at `offset`), `specialized` text? (the opcode there when the recording
//!   stopped, e.g. `BINARY_OP_ADD_INT`; null when unknown or still instrumented at stop).
//! - calls, in the order activations end: `thread_id` u64, `call_id` u64 (numbered in the order
//!   activations begin), `parent` u64? (the caller's `call_id`), `depth` u32, `code_id` u32, `function`
//!   text, `file` text, `line` u32 (first line), `start_ns` i64, `end_ns` i64, `duration_ns` i64,
//!   `exclusive_ns` i64 (its duration less its callees' durations), `window` i32? (the window it was
//!   recorded in, FORMAT.md 5.3), `clipped` bool (a window edge cut it). Times are raw: the recorder's own
//!   cost is not subtracted (`stats` does that).
//! - counter_samples, one row per performance counter sample (FORMAT.md 6.9), per thread in time order:
//!   `thread_id` u64, `ts_ns` i64, `counter` text (`task-clock`, `page-faults`, ...), `value` u64 (the
//!   counter's events in the sample: its period; ns for task-clock), `call_id` u64? and `function` text? (the
//!   innermost activation running on the thread then, as in the calls table; null when none was).
//! - code: `code_id` u32, `function`, `name`, `file` text, `first_line` u32, `last_line` i32?,
//!   `instructions` u32, `bytecode` binary (base), `specialized_bytecode` binary? (at stop).
//! - lines, one row per source line that ran in a recorded run ([`crate::lines`]; empty in calls mode):
//!   `file` text, `line` u32, `function` text, `hits` u64, `own_ns` i64 (recorder cost and recorded callees
//!   removed), `estimated` bool (the line's function was seen in part: its figures are lower bounds).

use crate::export::timeline::{Item, Timeline};
use ocular_format::{Body, CodeObject, EventKind, Header, RawEvent, ReadOptions, Reader};
use rustc_hash::FxHashMap as HashMap;
use std::path::Path;
use std::sync::Arc;

/// Rows per batch unless told otherwise: polars' own row group size (512²), about 24 MB of event columns.
/// Four times as many made the export 14% slower (measured, paired): each batch's columns were fresh
/// memory faulted in page by page, where batches this size reuse what the last one freed.
pub const DEFAULT_BATCH_ROWS: usize = 1 << 18;

/// The code of a null in a [`Column::Dict`] (a dictionary never has this many values).
pub const NULL_CODE: u32 = u32::MAX;

/// Which table a batch belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// One row per event.
    Events,
    /// One row per function activation.
    Calls,
    /// One row per code object.
    Code,
    /// One row per stretch of events a thread lost (the recorder had no free buffer): empty when nothing
    /// was lost.
    Lost,
    /// One row per performance counter sample: empty when the recording had no counters.
    CounterSamples,
    /// One row per source line (and function) that ran: hits and own time ([`crate::lines`]).
    Lines,
    /// One row per function: calls, inclusive and exclusive time, and the intervals of estimates, as
    /// `stats` gives them (threads merged).
    Functions,
    /// One row per coroutine function: running, awaiting and ready time ([`crate::awaits`]).
    Coroutines,
    /// One row per asyncio task ([`crate::awaits`]).
    Tasks,
    /// One row per span ([`crate::spans`], FORMAT.md 5.9).
    Spans,
}

impl Table {
    /// The table's name, also its file's stem.
    pub fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::Calls => "calls",
            Table::Code => "code",
            Table::Lost => "lost",
            Table::CounterSamples => "counter_samples",
            Table::Lines => "lines",
            Table::Functions => "functions",
            Table::Coroutines => "coroutines",
            Table::Tasks => "tasks",
            Table::Spans => "spans",
        }
    }
}

/// A column of a batch.
#[derive(Clone, Debug)]
pub enum Column {
    /// Unsigned 64-bit.
    U64(Vec<u64>),
    /// Unsigned 64-bit, nullable.
    OptU64(Vec<Option<u64>>),
    /// Signed 64-bit.
    I64(Vec<i64>),
    /// Signed 64-bit, nullable.
    OptI64(Vec<Option<i64>>),
    /// Unsigned 32-bit.
    U32(Vec<u32>),
    /// Signed 32-bit, nullable.
    OptI32(Vec<Option<i32>>),
    /// Text as codes into a dictionary of distinct values, [`NULL_CODE`] where null. Every batch of a
    /// column has the same dictionary.
    Dict(Vec<u32>, Arc<Vec<String>>),
    /// Bytes, nullable.
    Binary(Vec<Option<Vec<u8>>>),
    /// Booleans.
    Bool(Vec<bool>),
}

impl Column {
    /// Rows.
    pub fn len(&self) -> usize {
        match self {
            Column::U64(v) => v.len(),
            Column::OptU64(v) => v.len(),
            Column::I64(v) => v.len(),
            Column::OptI64(v) => v.len(),
            Column::U32(v) => v.len(),
            Column::OptI32(v) => v.len(),
            Column::Dict(v, _) => v.len(),
            Column::Binary(v) => v.len(),
            Column::Bool(v) => v.len(),
        }
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Some rows of a table, as named columns of equal length.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Rows.
    pub rows: usize,
    /// Columns, in the table's order.
    pub columns: Vec<(&'static str, Column)>,
}

/// Where batches go. Each requested table gets at least one batch, possibly empty, so a sink always
/// learns its schema.
pub trait Sink {
    /// Takes the next batch of `table`.
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()>;
}

/// Which rows and columns of a table [`build_selected`] builds: `ocular.load(...).events(columns=...,
/// threads=..., start_ns=..., end_ns=...)`. The default is everything.
#[derive(Clone, Debug, Default)]
pub struct Select {
    /// Columns to keep, in the table's order; `None`: all.
    pub columns: Option<Vec<String>>,
    /// Threads (native ids) whose rows to keep; `None`: all.
    pub threads: Option<Vec<u64>>,
    /// Rows from this time on (ns since the recording started): events at or after it, calls that end
    /// at or after it.
    pub start_ns: Option<i64>,
    /// Rows up to this time: events at or before it, calls that start at or before it.
    pub end_ns: Option<i64>,
    /// Bytes the events table may take as a DataFrame (rows x the selected columns' widths, estimated from
    /// the chunk headers of the first pass); more is refused with [`TooBig`] before anything is built.
    pub budget: Option<u64>,
}

impl Select {
    fn thread(&self, tid: u64) -> bool {
        self.threads.as_ref().map_or(true, |t| t.contains(&tid))
    }

    fn range(&self) -> (i64, i64) {
        (self.start_ns.unwrap_or(i64::MIN), self.end_ns.unwrap_or(i64::MAX))
    }

    fn is_all(&self) -> bool {
        self.columns.is_none() && self.threads.is_none() && self.start_ns.is_none() && self.end_ns.is_none()
    }

    /// Bytes per row of `table` as a DataFrame with the selected columns.
    fn row_bytes(&self, table: Table) -> u64 {
        match &self.columns {
            Some(cols) => cols.iter().map(|c| column_bytes(table, c)).sum(),
            None => columns(table).iter().map(|c| column_bytes(table, c)).sum(),
        }
    }

    /// An error naming the columns `table` has, if one asked for is not among them.
    pub fn check(&self, table: Table) -> anyhow::Result<()> {
        for c in self.columns.iter().flatten() {
            if !columns(table).contains(&c.as_str()) {
                anyhow::bail!(
                    "the {} table has no column {c:?}; its columns: {}",
                    table.name(),
                    columns(table).join(", ")
                );
            }
        }
        Ok(())
    }

    fn keep(&self, mut b: Batch) -> Batch {
        if let Some(cols) = &self.columns {
            b.columns.retain(|(name, _)| cols.iter().any(|c| c == name));
        }
        b
    }
}

/// The columns of each table, in order.
pub fn columns(table: Table) -> &'static [&'static str] {
    match table {
        Table::Events => &[
            "pid",
            "thread_id",
            "ts_ns",
            "tsc",
            "event",
            "code_id",
            "function",
            "file",
            "line",
            "offset",
            "arg",
            "opcode",
            "specialized",
        ],
        Table::Calls => &[
            "pid",
            "thread_id",
            "call_id",
            "parent",
            "depth",
            "code_id",
            "function",
            "file",
            "line",
            "start_ns",
            "end_ns",
            "duration_ns",
            "exclusive_ns",
            "window",
            "clipped",
            "span",
        ],
        Table::Code => &[
            "pid",
            "code_id",
            "function",
            "name",
            "file",
            "first_line",
            "last_line",
            "instructions",
            "bytecode",
            "specialized_bytecode",
        ],
        Table::Lost => &["pid", "thread_id", "thread_lost", "thread_recorded", "start_ns", "end_ns"],
        Table::CounterSamples => &["pid", "thread_id", "ts_ns", "counter", "value", "call_id", "function"],
        Table::Lines => &["pid", "file", "line", "function", "hits", "own_ns", "estimated"],
        Table::Functions => &[
            "pid",
            "function",
            "file",
            "line",
            "calls",
            "calls_ci95",
            "calls_estimated",
            "calls_lower_bound",
            "inclusive_ns",
            "inclusive_ci95_ns",
            "exclusive_ns",
            "exclusive_ci95_ns",
            "estimated",
            "times_lower_bound",
        ],
        Table::Coroutines => {
            &["pid", "function", "file", "line", "calls", "steps", "tasks", "running_ns", "awaiting_ns", "ready_ns"]
        }
        Table::Tasks => &[
            "pid",
            "thread_id",
            "function",
            "ordinal",
            "created_ns",
            "started_ns",
            "ended_ns",
            "steps",
            "running_ns",
            "awaiting_ns",
            "ready_ns",
        ],
        Table::Spans => &[
            "pid",
            "key",
            "name",
            "thread_id",
            "start_ns",
            "end_ns",
            "duration_ns",
            "trace_id",
            "span_id",
            "parent_span_id",
            "parent",
            "status",
            "message",
            "attributes",
        ],
    }
}

/// Bytes a row of `column` of `table` takes in a polars DataFrame (text columns are categorical: a 4-byte
/// code per row; binary columns are counted at their offsets only).
fn column_bytes(table: Table, column: &str) -> u64 {
    match (table, column) {
        (
            _,
            "thread_id" | "ts_ns" | "tsc" | "call_id" | "parent" | "start_ns" | "end_ns" | "duration_ns"
            | "exclusive_ns" | "span" | "key",
        ) => 8,
        (_, "thread_lost" | "thread_recorded" | "bytecode" | "specialized_bytecode" | "value") => 8,
        (_, "clipped") => 1,
        _ => 4,
    }
}

/// The events table [`build_selected`] was asked for would not fit its [`Select::budget`]: refused before
/// anything was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooBig {
    /// Rows it would have (events in the chunks the selection covers: whole chunks, an upper bound).
    pub rows: u64,
    /// Bytes of its DataFrame: rows times the selected columns' widths.
    pub bytes: u64,
}

impl std::fmt::Display for TooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the events table of {} events would take {} bytes", self.rows, self.bytes)
    }
}

impl std::error::Error for TooBig {}

/// What [`build`] wrote.
#[derive(Debug, Default)]
pub struct Summary {
    /// Rows per table.
    pub rows: HashMap<&'static str, u64>,
    /// Events read from the file.
    pub events_read: u64,
    /// The reader's warnings (truncated or damaged input).
    pub warnings: Vec<String>,
}

/// Distinct strings and their codes, growing only.
#[derive(Default)]
struct Dictionary {
    values: Vec<String>,
    index: HashMap<String, u32>,
    /// `values` as last handed out; replaced when values were added since.
    shared: Option<Arc<Vec<String>>>,
}

impl Dictionary {
    fn code(&mut self, s: &str) -> u32 {
        if let Some(&c) = self.index.get(s) {
            return c;
        }
        let c = self.values.len() as u32;
        self.values.push(s.to_owned());
        self.index.insert(s.to_owned(), c);
        self.shared = None;
        c
    }

    fn snapshot(&mut self) -> Arc<Vec<String>> {
        self.shared.get_or_insert_with(|| Arc::new(self.values.clone())).clone()
    }
}

/// A code unit's line and opcodes, as dictionary codes: what an event at its offset shows.
#[derive(Clone, Copy)]
struct Unit {
    line: Option<i32>,
    opcode: u32,
    /// [`NULL_CODE`] when unknown.
    specialized: u32,
}

impl Unit {
    /// An offset past the code object's bytecode (damaged input).
    const UNKNOWN: Unit = Unit { line: None, opcode: NULL_CODE, specialized: NULL_CODE };
}

/// A code object's strings and per-code-unit facts, as dictionary codes.
struct Resolved {
    function: u32,
    file: u32,
    first_line: u32,
    /// Per code unit (offset / 2).
    units: Vec<Unit>,
}

/// Resolved code objects by id: a vector indexed by id when ids are dense (as the recorder assigns
/// them, from 1), so that an event's look-up is one index; a hash map for a file whose ids are not.
enum ById {
    Dense(Vec<Option<Resolved>>),
    Sparse(HashMap<u32, Resolved>),
}

impl ById {
    fn new(all: Vec<(u32, Resolved)>) -> Self {
        let max = all.iter().map(|(id, _)| *id as usize).max().unwrap_or(0);
        if max > 4 * all.len() + 1024 {
            return ById::Sparse(all.into_iter().collect());
        }
        let mut v: Vec<Option<Resolved>> = (0..=max).map(|_| None).collect();
        for (id, r) in all {
            v[id as usize] = Some(r);
        }
        ById::Dense(v)
    }

    #[inline]
    fn get(&self, id: u32) -> Option<&Resolved> {
        match self {
            ById::Dense(v) => v.get(id as usize).and_then(Option::as_ref),
            ById::Sparse(m) => m.get(&id),
        }
    }
}

#[derive(Default)]
struct Dictionaries {
    event: Dictionary,
    function: Dictionary,
    file: Dictionary,
    opcode: Dictionary,
    /// Event kind number to its code in `event` ([`NULL_CODE`] for a kind this analyzer does not know).
    kinds: Vec<u32>,
}

impl Dictionaries {
    /// The `event` dictionary: every kind the format defines, in kind-number order, whether or not the file
    /// has it. So the first pass need not decode the events to find the kinds present, and every export
    /// has the same `event` type.
    fn event_kinds(&mut self) {
        self.kinds = vec![NULL_CODE; 256];
        let mut all = EventKind::ALL.to_vec();
        all.sort_by_key(|k| *k as u8);
        for k in all {
            self.kinds[k as usize] = self.event.code(k.name());
        }
    }

    fn resolve(&mut self, co: &CodeObject, header: &Header, snapshot: Option<&Vec<u8>>) -> Resolved {
        let names = &header.opcodes;
        let units = co.bytecode.len() / 2;
        let mut r = Resolved {
            function: self.function.code(&co.qualname),
            file: self.file.code(&co.filename),
            first_line: co.first_line,
            units: Vec::with_capacity(units),
        };
        for u in 0..units {
            let op = co.bytecode[2 * u];
            let base = names.base.get(op as usize).copied().unwrap_or(op);
            let at_stop = snapshot.and_then(|b| b.get(2 * u).copied());
            let spec = at_stop.and_then(|sop| crate::analysis::specialization(header, base, sop).ok());
            r.units.push(Unit {
                line: co.positions.get(u).map(|p| p.line).filter(|&l| l >= 0),
                opcode: self.opcode.code(&names.name(base)),
                specialized: spec.map_or(NULL_CODE, |sop| self.opcode.code(&names.name(sop))),
            });
        }
        r
    }
}

/// Code objects and snapshots: the first pass, which skips the events.
struct Metadata {
    header: Header,
    code: HashMap<u32, CodeObject>,
    snapshots: HashMap<u32, Vec<u8>>,
    losses: Vec<crate::analysis::Loss>,
    /// The first pass's warnings, for a build that reads no events.
    warnings: Vec<String>,
    /// Events in the chunks the selection covers (whole chunks: an upper bound for a time range).
    selected_events: u64,
}

fn metadata(path: &Path, opts: ReadOptions, select: &Select) -> ocular_format::Result<Metadata> {
    let mut r = Reader::open_with(path, ReadOptions { skip_events: true, ..opts })?;
    let header = r.header().clone();
    let ns_per_tick = 1e9 / header.ticks_per_second;
    let start = header.start_ticks;
    let ns = |ticks: u64| (ticks.wrapping_sub(start) as i64 as f64 * ns_per_tick) as i64;
    let (lo, hi) = select.range();
    let mut m = Metadata {
        header,
        code: HashMap::default(),
        snapshots: HashMap::default(),
        losses: Vec::new(),
        warnings: Vec::new(),
        selected_events: 0,
    };
    while let Some(c) = r.next_chunk()? {
        let i = &c.info;
        if i.kind == ocular_format::chunk::kind::EVENTS
            && select.thread(i.thread_id)
            && ns(i.last_ts) >= lo
            && ns(i.first_ts) <= hi
        {
            m.selected_events += i.count as u64;
        }
        match c.body {
            Body::Code(objs) => m.code.extend(objs.into_iter().map(|o| (o.id, o))),
            Body::Snapshot(s) => m.snapshots.extend(s.into_iter().map(|x| (x.id, x.bytecode))),
            _ => {}
        }
    }
    m.losses = crate::analysis::losses(r.report());
    m.warnings = r.report().warnings(&path.display().to_string());
    Ok(m)
}

/// Every dictionary filled from the first pass, so that it never grows during the second: all batches
/// of a column share one dictionary (and one Arrow/polars type).
fn freeze(m: &Metadata, d: &mut Dictionaries) -> ById {
    if d.kinds.is_empty() {
        d.event_kinds();
    }
    let mut ids: Vec<u32> = m.code.keys().copied().collect();
    ids.sort_unstable();
    ById::new(ids.into_iter().map(|id| (id, d.resolve(&m.code[&id], &m.header, m.snapshots.get(&id)))).collect())
}

/// Column builders of the events table.
#[derive(Default)]
struct Events {
    pid: Vec<u32>,
    thread_id: Vec<u64>,
    ts_ns: Vec<i64>,
    tsc: Vec<u64>,
    event: Vec<u32>,
    code_id: Vec<u32>,
    function: Vec<u32>,
    file: Vec<u32>,
    line: Vec<Option<i32>>,
    offset: Vec<u32>,
    arg: Vec<u32>,
    opcode: Vec<u32>,
    specialized: Vec<u32>,
}

impl Events {
    /// Columns with room for `rows`: a batch fills them without regrowing (and copying) each one.
    fn with_capacity(rows: usize) -> Self {
        Events {
            pid: Vec::with_capacity(rows),
            thread_id: Vec::with_capacity(rows),
            ts_ns: Vec::with_capacity(rows),
            tsc: Vec::with_capacity(rows),
            event: Vec::with_capacity(rows),
            code_id: Vec::with_capacity(rows),
            function: Vec::with_capacity(rows),
            file: Vec::with_capacity(rows),
            line: Vec::with_capacity(rows),
            offset: Vec::with_capacity(rows),
            arg: Vec::with_capacity(rows),
            opcode: Vec::with_capacity(rows),
            specialized: Vec::with_capacity(rows),
        }
    }

    /// Appends `evs`, a column at a time (loops the compiler can vectorize), then what each event's code
    /// object says at its offset (one look-up per run of events of the same code object).
    #[allow(clippy::too_many_arguments)]
    fn extend(
        &mut self,
        pid: u32,
        tid: u64,
        evs: &[RawEvent],
        kinds: &[u32],
        resolved: &ById,
        unknown: &Resolved,
        ns: &impl Fn(u64) -> i64,
    ) {
        self.pid.resize(self.pid.len() + evs.len(), pid);
        self.thread_id.resize(self.thread_id.len() + evs.len(), tid);
        self.tsc.extend(evs.iter().map(|e| e.ticks.get()));
        self.ts_ns.extend(evs.iter().map(|e| ns(e.ticks.get())));
        self.event.extend(evs.iter().map(|e| kinds[e.kind as usize]));
        self.code_id.extend(evs.iter().map(|e| e.code.get()));
        self.offset.extend(evs.iter().map(|e| e.offset.get()));
        self.arg.extend(evs.iter().map(|e| e.arg.get()));
        let mut last: Option<(u32, &Resolved)> = None;
        for e in evs {
            let id = e.code.get();
            let co = match last {
                Some((l, co)) if l == id => co,
                _ => {
                    let co = resolved.get(id).unwrap_or(unknown);
                    last = Some((id, co));
                    co
                }
            };
            let u = co.units.get(e.offset.get() as usize / 2).copied().unwrap_or(Unit::UNKNOWN);
            self.function.push(co.function);
            self.file.push(co.file);
            self.line.push(u.line);
            self.opcode.push(u.opcode);
            self.specialized.push(u.specialized);
        }
    }

    /// The batch so far, leaving columns with room for `next` rows.
    fn take(&mut self, d: &mut Dictionaries, next: usize) -> Batch {
        let e = std::mem::replace(self, Events::with_capacity(next));
        Batch {
            rows: e.tsc.len(),
            columns: vec![
                ("pid", Column::U32(e.pid)),
                ("thread_id", Column::U64(e.thread_id)),
                ("ts_ns", Column::I64(e.ts_ns)),
                ("tsc", Column::U64(e.tsc)),
                ("event", Column::Dict(e.event, d.event.snapshot())),
                ("code_id", Column::U32(e.code_id)),
                ("function", Column::Dict(e.function, d.function.snapshot())),
                ("file", Column::Dict(e.file, d.file.snapshot())),
                ("line", Column::OptI32(e.line)),
                ("offset", Column::U32(e.offset)),
                ("arg", Column::U32(e.arg)),
                ("opcode", Column::Dict(e.opcode, d.opcode.snapshot())),
                ("specialized", Column::Dict(e.specialized, d.opcode.snapshot())),
            ],
        }
    }
}

/// Column builders of the calls table.
#[derive(Default)]
struct Calls {
    pid: Vec<u32>,
    thread_id: Vec<u64>,
    call_id: Vec<u64>,
    parent: Vec<Option<u64>>,
    depth: Vec<u32>,
    code_id: Vec<u32>,
    function: Vec<u32>,
    file: Vec<u32>,
    line: Vec<u32>,
    start_ns: Vec<i64>,
    end_ns: Vec<i64>,
    exclusive_ns: Vec<i64>,
    window: Vec<Option<i32>>,
    clipped: Vec<bool>,
    span: Vec<Option<u64>>,
}

impl Calls {
    fn take(&mut self, d: &mut Dictionaries) -> Batch {
        let c = std::mem::take(self);
        let duration = c.end_ns.iter().zip(&c.start_ns).map(|(e, s)| e - s).collect();
        Batch {
            rows: c.call_id.len(),
            columns: vec![
                ("pid", Column::U32(c.pid)),
                ("thread_id", Column::U64(c.thread_id)),
                ("call_id", Column::U64(c.call_id)),
                ("parent", Column::OptU64(c.parent)),
                ("depth", Column::U32(c.depth)),
                ("code_id", Column::U32(c.code_id)),
                ("function", Column::Dict(c.function, d.function.snapshot())),
                ("file", Column::Dict(c.file, d.file.snapshot())),
                ("line", Column::U32(c.line)),
                ("start_ns", Column::I64(c.start_ns)),
                ("end_ns", Column::I64(c.end_ns)),
                ("duration_ns", Column::I64(duration)),
                ("exclusive_ns", Column::I64(c.exclusive_ns)),
                ("window", Column::OptI32(c.window)),
                ("clipped", Column::Bool(c.clipped)),
                ("span", Column::OptU64(c.span)),
            ],
        }
    }
}

/// Column builders of the counter samples table, with the samples still to place and each thread's
/// open activations (code id, call id).
#[derive(Default)]
struct CounterSamples {
    pending: HashMap<u64, crate::analysis::SampleQueue>,
    stacks: HashMap<u64, Vec<(u32, u64)>>,
    names: Arc<Vec<String>>,
    pid: Vec<u32>,
    thread_id: Vec<u64>,
    ts_ns: Vec<i64>,
    /// This file's counter indexes as codes into `names` (the run's counters, by name).
    counter_codes: Vec<u32>,
    counter: Vec<u32>,
    value: Vec<u64>,
    call_id: Vec<Option<u64>>,
    function: Vec<u32>,
}

impl CounterSamples {
    /// Places thread `tid`'s samples up to tick `t` in the activation running then (before the item at
    /// `t` changes it), keeping those `keep` selects.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        pid: u32,
        tid: u64,
        t: u64,
        resolved: &ById,
        unknown: &Resolved,
        keep: &impl Fn(u64, i64) -> bool,
        ns: &impl Fn(u64) -> i64,
    ) {
        let Some(q) = self.pending.get_mut(&tid) else { return };
        let top = self.stacks.get(&tid).and_then(|s| s.last()).copied();
        while q.front().is_some_and(|s| s.0 <= t) {
            let (ticks, k, period) = q.pop_front().expect("checked");
            if !keep(tid, ns(ticks)) {
                continue;
            }
            self.pid.push(pid);
            self.thread_id.push(tid);
            self.ts_ns.push(ns(ticks));
            self.counter.push(self.counter_codes.get(k as usize).copied().unwrap_or(NULL_CODE));
            self.value.push(period);
            self.call_id.push(top.map(|f| f.1));
            self.function.push(top.map_or(NULL_CODE, |f| resolved.get(f.0).unwrap_or(unknown).function));
        }
    }

    fn take(&mut self, d: &mut Dictionaries) -> Batch {
        let names = self.names.clone();
        let rows = self.ts_ns.len();
        Batch {
            rows,
            columns: vec![
                ("pid", Column::U32(std::mem::take(&mut self.pid))),
                ("thread_id", Column::U64(std::mem::take(&mut self.thread_id))),
                ("ts_ns", Column::I64(std::mem::take(&mut self.ts_ns))),
                ("counter", Column::Dict(std::mem::take(&mut self.counter), names)),
                ("value", Column::U64(std::mem::take(&mut self.value))),
                ("call_id", Column::OptU64(std::mem::take(&mut self.call_id))),
                ("function", Column::Dict(std::mem::take(&mut self.function), d.function.snapshot())),
            ],
        }
    }
}

fn code_table(m: &Metadata, d: &mut Dictionaries, names: &mut Dictionary) -> Batch {
    let mut ids: Vec<u32> = m.code.keys().copied().collect();
    ids.sort_unstable();
    let (mut function, mut name, mut file) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first, mut last, mut count, mut base, mut spec) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for id in &ids {
        let co = &m.code[id];
        function.push(d.function.code(&co.qualname));
        name.push(names.code(&co.name));
        file.push(d.file.code(&co.filename));
        first.push(co.first_line);
        last.push(co.positions.iter().map(|p| p.end_line.max(p.line)).max().filter(|&l| l >= 0));
        count.push(crate::analysis::instructions(co, &m.header, 0, u32::MAX).len() as u32);
        base.push(Some(co.bytecode.clone()));
        spec.push(m.snapshots.get(id).cloned());
    }
    Batch {
        rows: ids.len(),
        columns: vec![
            ("pid", Column::U32(vec![m.header.pid; ids.len()])),
            ("code_id", Column::U32(ids)),
            ("function", Column::Dict(function, d.function.snapshot())),
            ("name", Column::Dict(name, names.snapshot())),
            ("file", Column::Dict(file, d.file.snapshot())),
            ("first_line", Column::U32(first)),
            ("last_line", Column::OptI32(last)),
            ("instructions", Column::U32(count)),
            ("bytecode", Column::Binary(base)),
            ("specialized_bytecode", Column::Binary(spec)),
        ],
    }
}

/// One row per stretch of lost events: the thread, how many its stretches lost in all, and when.
fn lost_table(pid: u32, losses: &[crate::analysis::Loss]) -> Batch {
    let (mut thread, mut lost, mut recorded, mut start, mut end) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in losses {
        for &(a, b) in &l.ranges_ms {
            thread.push(l.thread_id);
            lost.push(l.lost);
            recorded.push(l.recorded);
            start.push((a * 1e6) as i64);
            end.push((b * 1e6) as i64);
        }
    }
    Batch {
        rows: thread.len(),
        columns: vec![
            ("pid", Column::U32(vec![pid; thread.len()])),
            ("thread_id", Column::U64(thread)),
            ("thread_lost", Column::U64(lost)),
            ("thread_recorded", Column::U64(recorded)),
            ("start_ns", Column::I64(start)),
            ("end_ns", Column::I64(end)),
        ],
    }
}

/// The lines of one process ([`crate::lines`]), hottest first.
fn lines_table(mut l: crate::lines::Lines, d: &mut Dictionaries) -> Batch {
    l.lines.sort_by(|a, b| b.own_ns.total_cmp(&a.own_ns).then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line))));
    let n = l.lines.len();
    let (mut file, mut function) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for x in &l.lines {
        file.push(d.file.code(&x.file));
        function.push(d.function.code(&x.function));
    }
    Batch {
        rows: n,
        columns: vec![
            ("pid", Column::U32(vec![l.pid; n])),
            ("file", Column::Dict(file, d.file.snapshot())),
            ("line", Column::U32(l.lines.iter().map(|x| x.line).collect())),
            ("function", Column::Dict(function, d.function.snapshot())),
            ("hits", Column::U64(l.lines.iter().map(|x| x.hits).collect())),
            ("own_ns", Column::I64(l.lines.iter().map(|x| x.own_ns.round() as i64).collect())),
            ("estimated", Column::Bool(l.lines.iter().map(|x| x.estimated).collect())),
        ],
    }
}

/// The functions of one process, threads merged, by exclusive time ([`crate::stats::rows`]).
fn functions_table(a: &crate::analysis::Analysis, d: &mut Dictionaries) -> Batch {
    let rows = crate::stats::rows(a, false, crate::stats::SortBy::Exclusive);
    let n = rows.len();
    let (mut file, mut function) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for r in &rows {
        file.push(d.file.code(&r.file));
        function.push(d.function.code(&r.function));
    }
    let ns = |ms: f64| (ms * 1e6).round() as i64;
    let pid = a.header.as_ref().map_or(0, |h| h.pid);
    Batch {
        rows: n,
        columns: vec![
            ("pid", Column::U32(vec![pid; n])),
            ("function", Column::Dict(function, d.function.snapshot())),
            ("file", Column::Dict(file, d.file.snapshot())),
            ("line", Column::U32(rows.iter().map(|r| r.line).collect())),
            ("calls", Column::U64(rows.iter().map(|r| r.calls).collect())),
            ("calls_ci95", Column::U64(rows.iter().map(|r| r.calls_ci95.ceil() as u64).collect())),
            ("calls_estimated", Column::Bool(rows.iter().map(|r| r.calls_estimated).collect())),
            ("calls_lower_bound", Column::Bool(rows.iter().map(|r| r.calls_lower_bound).collect())),
            ("inclusive_ns", Column::I64(rows.iter().map(|r| ns(r.inclusive_ms)).collect())),
            ("inclusive_ci95_ns", Column::I64(rows.iter().map(|r| ns(r.inclusive_ci95_ms)).collect())),
            ("exclusive_ns", Column::I64(rows.iter().map(|r| ns(r.exclusive_ms)).collect())),
            ("exclusive_ci95_ns", Column::I64(rows.iter().map(|r| ns(r.exclusive_ci95_ms)).collect())),
            ("estimated", Column::Bool(rows.iter().map(|r| r.estimated).collect())),
            ("times_lower_bound", Column::Bool(rows.iter().map(|r| r.times_lower_bound).collect())),
        ],
    }
}

/// The coroutine functions and the tasks of one process ([`crate::awaits`]), by wall time, most first;
/// times of tasks from the first process's start (`offset_ns` is this process's start from it).
fn async_tables(a: crate::awaits::Awaits, offset_ns: i64, d: &mut Dictionaries) -> (Batch, Batch) {
    let r = crate::awaits::report(std::slice::from_ref(&a), usize::MAX);
    let n = r.functions.len();
    let (mut file, mut function) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for x in &r.functions {
        file.push(d.file.code(&x.file));
        function.push(d.function.code(&x.function));
    }
    let ns = |v: f64| v.round() as i64;
    let f = &r.functions;
    let coroutines = Batch {
        rows: n,
        columns: vec![
            ("pid", Column::U32(vec![a.pid; n])),
            ("function", Column::Dict(function, d.function.snapshot())),
            ("file", Column::Dict(file, d.file.snapshot())),
            ("line", Column::U32(f.iter().map(|x| x.line).collect())),
            ("calls", Column::U64(f.iter().map(|x| x.calls).collect())),
            ("steps", Column::U64(f.iter().map(|x| x.steps).collect())),
            ("tasks", Column::U64(f.iter().map(|x| x.tasks).collect())),
            ("running_ns", Column::I64(f.iter().map(|x| ns(x.running_ns)).collect())),
            ("awaiting_ns", Column::I64(f.iter().map(|x| ns(x.awaiting_ns)).collect())),
            ("ready_ns", Column::I64(f.iter().map(|x| ns(x.ready_ns)).collect())),
        ],
    };
    let t = &r.tasks;
    let m = t.len();
    let mut function = Vec::with_capacity(m);
    let mut ordinal = Vec::with_capacity(m);
    for x in t {
        let (name, n) = x.name.rsplit_once('#').unwrap_or((&x.name, "0"));
        function.push(d.function.code(name));
        ordinal.push(n.parse().unwrap_or(0));
    }
    let at = |v: f64| offset_ns + ns(v);
    let tasks = Batch {
        rows: m,
        columns: vec![
            ("pid", Column::U32(vec![a.pid; m])),
            ("thread_id", Column::U64(t.iter().map(|x| x.thread_id).collect())),
            ("function", Column::Dict(function, d.function.snapshot())),
            ("ordinal", Column::U64(ordinal)),
            ("created_ns", Column::I64(t.iter().map(|x| at(x.created_ns)).collect())),
            ("started_ns", Column::I64(t.iter().map(|x| at(x.started_ns)).collect())),
            ("ended_ns", Column::OptI64(t.iter().map(|x| x.ended_ns.map(at)).collect())),
            ("steps", Column::U64(t.iter().map(|x| x.steps).collect())),
            ("running_ns", Column::I64(t.iter().map(|x| ns(x.running_ns)).collect())),
            ("awaiting_ns", Column::I64(t.iter().map(|x| ns(x.awaiting_ns)).collect())),
            ("ready_ns", Column::I64(t.iter().map(|x| ns(x.ready_ns)).collect())),
        ],
    };
    (coroutines, tasks)
}

/// The spans of a run's processes, each (pid, its spans, its start from the first process's, ns): times from
/// the first process's start; ids as lowercase hex, null where the span has none; the attributes as a JSON
/// object.
fn spans_table(processes: Vec<(u32, Vec<crate::spans::Span>, i64)>) -> Batch {
    let n: usize = processes.iter().map(|p| p.1.len()).sum();
    let mut text: [Dictionary; 7] = Default::default();
    let mut codes: [Vec<u32>; 7] = Default::default();
    let mut pid = Vec::with_capacity(n);
    let mut key = Vec::with_capacity(n);
    let mut thread = Vec::with_capacity(n);
    let mut start = Vec::with_capacity(n);
    let mut end = Vec::with_capacity(n);
    let mut duration = Vec::with_capacity(n);
    let mut parent = Vec::with_capacity(n);
    for (p, spans, offset_ns) in processes {
        let at = |ns: f64| offset_ns + ns.round() as i64;
        for x in spans {
            let attributes: serde_json::Map<String, serde_json::Value> =
                x.attributes.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
            let attributes = serde_json::Value::Object(attributes).to_string();
            let values = [&x.name, &x.trace_id, &x.span_id, &x.parent_span_id, x.status, &x.message, &attributes];
            for (i, v) in values.into_iter().enumerate() {
                // The ids and the message are null where the span has none; name, status and attributes never.
                let null = v.is_empty() && matches!(i, 1 | 2 | 3 | 5);
                codes[i].push(if null { NULL_CODE } else { text[i].code(v) });
            }
            pid.push(p);
            key.push(x.key);
            thread.push(x.thread_id);
            start.push(at(x.begin_ns));
            end.push(x.end_ns.map(at));
            duration.push(x.duration_ms.map(|ms| (ms * 1e6).round() as i64));
            parent.push(x.parent);
        }
    }
    let [name, trace_id, span_id, parent_span_id, status, message, attributes] = codes;
    let [dn, dt, ds, dp, dst, dm, da] = text.each_mut().map(|d| d.snapshot());
    Batch {
        rows: n,
        columns: vec![
            ("pid", Column::U32(pid)),
            ("key", Column::U64(key)),
            ("name", Column::Dict(name, dn)),
            ("thread_id", Column::U64(thread)),
            ("start_ns", Column::I64(start)),
            ("end_ns", Column::OptI64(end)),
            ("duration_ns", Column::OptI64(duration)),
            ("trace_id", Column::Dict(trace_id, dt)),
            ("span_id", Column::Dict(span_id, ds)),
            ("parent_span_id", Column::Dict(parent_span_id, dp)),
            ("parent", Column::U64(parent)),
            ("status", Column::Dict(status, dst)),
            ("message", Column::Dict(message, dm)),
            ("attributes", Column::Dict(attributes, da)),
        ],
    }
}

/// Builds the requested tables of `path` into `sink`, `batch_rows` rows at a time.
pub fn build(
    path: &Path,
    opts: ReadOptions,
    tables: &[Table],
    batch_rows: usize,
    sink: &mut dyn Sink,
) -> anyhow::Result<Summary> {
    build_selected(path, opts, tables, batch_rows, &Select::default(), sink)
}

/// Passes batches on with the selected columns only.
struct Selected<'a> {
    select: &'a Select,
    sink: &'a mut dyn Sink,
}

impl Sink for Selected<'_> {
    fn batch(&mut self, table: Table, batch: Batch) -> anyhow::Result<()> {
        self.sink.batch(table, self.select.keep(batch))
    }
}

/// [`build`], keeping the rows and columns `select` asks for: rows of other threads or outside the time
/// range are never put in a batch, so a selection takes memory in proportion to what it keeps.
pub fn build_selected(
    path: &Path,
    opts: ReadOptions,
    tables: &[Table],
    batch_rows: usize,
    select: &Select,
    sink: &mut dyn Sink,
) -> anyhow::Result<Summary> {
    for &t in tables {
        select.check(t)?;
    }
    // A run of several processes (FORMAT.md 10) is one set of tables.
    let (run, run_warnings) = crate::procs::open(path, opts)?;
    let mut selected = Selected { select, sink };
    let sink: &mut dyn Sink = if select.columns.is_some() { &mut selected } else { selected.sink };
    let (lo, hi) = select.range();
    let everything = select.is_all();
    let batch_rows = batch_rows.max(1);
    let metas =
        run.processes.iter().map(|p| metadata(&p.path, opts, select)).collect::<ocular_format::Result<Vec<_>>>()?;
    if let Some(budget) = select.budget.filter(|_| tables.contains(&Table::Events)) {
        let rows: u64 = metas.iter().map(|m| m.selected_events).sum();
        let too_big = TooBig { rows, bytes: rows * select.row_bytes(Table::Events) };
        if too_big.bytes > budget {
            return Err(too_big.into());
        }
    }
    // Times from the first process's start, through CLOCK_MONOTONIC: for one file, from its own start.
    let origin = metas[0].header.start_monotonic_ns as i64;
    // Every dictionary filled from every file first: all batches of a column share one.
    let mut d = Dictionaries::default();
    let resolved: Vec<ById> = metas.iter().map(|m| freeze(m, &mut d)).collect();
    // Events of a code object the file does not describe (damaged input).
    let unknown = Resolved { function: d.function.code("?"), file: d.file.code("?"), first_line: 0, units: vec![] };
    let mut code_names = Dictionary::default();
    for m in &metas {
        let mut ids: Vec<&u32> = m.code.keys().collect();
        ids.sort_unstable();
        for id in ids {
            code_names.code(&m.code[id].name);
        }
    }
    let mut summary = Summary::default();
    let count =
        |summary: &mut Summary, t: Table, b: &Batch| *summary.rows.entry(t.name()).or_default() += b.rows as u64;
    for (t, make) in [(Table::Code, true), (Table::Lost, false)] {
        if !tables.contains(&t) {
            continue;
        }
        for m in &metas {
            let b = if make { code_table(m, &mut d, &mut code_names) } else { lost_table(m.header.pid, &m.losses) };
            count(&mut summary, t, &b);
            sink.batch(t, b)?;
        }
    }
    if tables.contains(&Table::Lines) {
        // A pass of its own per process: lines are figures over the whole run, not rows of events.
        for p in &run.processes {
            let l = crate::lines::analyze(&p.path, opts)?;
            let b = lines_table(l, &mut d);
            count(&mut summary, Table::Lines, &b);
            sink.batch(Table::Lines, b)?;
        }
    }
    if tables.contains(&Table::Functions) {
        // A pass of its own per process, as lines.
        for p in &run.processes {
            let a = crate::analysis::analyze(&p.path, opts)?;
            let b = functions_table(&a, &mut d);
            count(&mut summary, Table::Functions, &b);
            sink.batch(Table::Functions, b)?;
        }
    }
    if tables.contains(&Table::Spans) {
        // A pass of its own per process, as lines; one batch for the run (its text columns share their
        // dictionaries).
        let mut all = Vec::new();
        for (p, m) in run.processes.iter().zip(&metas) {
            let (list, _) = crate::spans::list(&p.path, opts)?;
            all.push((m.header.pid, list, m.header.start_monotonic_ns as i64 - origin));
        }
        let b = spans_table(all);
        count(&mut summary, Table::Spans, &b);
        sink.batch(Table::Spans, b)?;
    }
    if tables.contains(&Table::Coroutines) || tables.contains(&Table::Tasks) {
        // A pass of its own per process, as lines.
        for (p, m) in run.processes.iter().zip(&metas) {
            let a = crate::awaits::analyze(&p.path, opts)?;
            let (co, tk) = async_tables(a, m.header.start_monotonic_ns as i64 - origin, &mut d);
            for (t, b) in [(Table::Coroutines, co), (Table::Tasks, tk)] {
                if tables.contains(&t) {
                    count(&mut summary, t, &b);
                    sink.batch(t, b)?;
                }
            }
        }
    }
    let want_events = tables.contains(&Table::Events);
    let want_calls = tables.contains(&Table::Calls);
    let want_samples = tables.contains(&Table::CounterSamples);
    let mut file_samples = Vec::new();
    let mut counter_names = Dictionary::default();
    if want_samples {
        for (p, m) in run.processes.iter().zip(&metas) {
            let s = crate::analysis::read_samples(&p.path, opts, &m.header)?;
            let codes: Vec<u32> = s.counters.iter().map(|c| counter_names.code(&c.name)).collect();
            file_samples.push((codes, s.by_thread));
        }
    }
    let mut samples = CounterSamples { names: counter_names.snapshot(), ..CounterSamples::default() };
    let keep_sample = |tid: u64, t: i64| everything || (select.thread(tid) && t >= lo && t <= hi);
    if !want_events && !want_calls && !want_samples {
        summary.warnings = run_warnings;
        for m in &metas {
            summary.warnings.extend(m.warnings.iter().cloned());
        }
        return Ok(summary);
    }
    // Reserved a batch ahead (up to the default size: a caller may ask for one batch of everything).
    let reserve = batch_rows.min(DEFAULT_BATCH_ROWS);
    let mut events = Events::with_capacity(if want_events { reserve } else { 0 });
    let mut calls = Calls::default();
    summary.warnings = run_warnings;
    let mut file_samples = file_samples.into_iter();
    for (i, (p, m)) in run.processes.iter().zip(&metas).enumerate() {
        let (h, pid, resolved) = (&m.header, m.header.pid, &resolved[i]);
        let ns_per_tick = 1e9 / h.ticks_per_second;
        let offset = h.start_monotonic_ns as i64 - origin;
        let ns = |ticks: u64| offset + (ticks.wrapping_sub(h.start_ticks) as i64 as f64 * ns_per_tick) as i64;
        if let Some((codes, pending)) = file_samples.next() {
            samples.counter_codes = codes;
            samples.pending = pending;
            samples.stacks.clear();
        }
        let mut failed: Option<anyhow::Error> = None;
        // Per open activation (thread, call id) with callees that ended: their time, for its exclusive time.
        let mut callees_ns: HashMap<(u64, u64), i64> = HashMap::default();
        let mut timeline = Timeline::open(&p.path, opts)?.without_loops();
        if want_calls && timeline.version() >= (2, 13) {
            // Each call's span: where spans end (on any thread) is known only after a pass over the file;
            // files before 2.13 have none.
            timeline = timeline.with_spans(&crate::spans::list(&p.path, opts)?.0);
        }
        let result = timeline.run(|_, item| {
            let r = (|| -> anyhow::Result<()> {
                match item {
                    Item::Events { tid, events: mut evs } if want_events => {
                        if !everything {
                            if !select.thread(tid) {
                                return Ok(());
                            }
                            // A thread's events are in time order: the range is one slice of them.
                            let a = evs.partition_point(|e| ns(e.ticks.get()) < lo);
                            let b = evs.partition_point(|e| ns(e.ticks.get()) <= hi);
                            evs = &evs[a..b.max(a)];
                        }
                        while !evs.is_empty() {
                            let (now, later) = evs.split_at(evs.len().min(batch_rows - events.tsc.len()));
                            events.extend(pid, tid, now, &d.kinds, resolved, &unknown, &ns);
                            evs = later;
                            if events.tsc.len() >= batch_rows {
                                let b = events.take(&mut d, reserve);
                                count(&mut summary, Table::Events, &b);
                                sink.batch(Table::Events, b)?;
                            }
                        }
                    }
                    Item::Begin { tid, ticks, code: id, call } if want_samples => {
                        samples.place(pid, tid, ticks, resolved, &unknown, &keep_sample, &ns);
                        samples.stacks.entry(tid).or_default().push((id, call));
                    }
                    Item::End { tid, ticks, code: id, call } if want_calls || want_samples => {
                        if want_samples {
                            samples.place(pid, tid, ticks, resolved, &unknown, &keep_sample, &ns);
                            samples.stacks.entry(tid).or_default().pop();
                            if samples.ts_ns.len() >= batch_rows {
                                let b = samples.take(&mut d);
                                count(&mut summary, Table::CounterSamples, &b);
                                sink.batch(Table::CounterSamples, b)?;
                            }
                            if !want_calls {
                                return Ok(());
                            }
                        }
                        // Every activation's time is its caller's callee time, selected or not.
                        let duration = ns(ticks) - ns(call.start);
                        let inner = callees_ns.remove(&(tid, call.id)).unwrap_or(0);
                        if let Some(parent) = call.parent {
                            *callees_ns.entry((tid, parent)).or_default() += duration;
                        }
                        if !everything && (!select.thread(tid) || ns(ticks) < lo || ns(call.start) > hi) {
                            return Ok(());
                        }
                        let co = resolved.get(id).unwrap_or(&unknown);
                        calls.exclusive_ns.push(duration - inner);
                        calls.pid.push(pid);
                        calls.thread_id.push(tid);
                        calls.call_id.push(call.id);
                        calls.parent.push(call.parent);
                        calls.depth.push(call.depth);
                        calls.code_id.push(id);
                        calls.function.push(co.function);
                        calls.file.push(co.file);
                        calls.line.push(co.first_line);
                        calls.start_ns.push(ns(call.start));
                        calls.end_ns.push(ns(ticks));
                        calls.window.push(call.window.map(|w| w as i32));
                        calls.clipped.push(call.clipped);
                        calls.span.push((call.span != 0).then_some(call.span));
                        if calls.call_id.len() >= batch_rows {
                            let b = calls.take(&mut d);
                            count(&mut summary, Table::Calls, &b);
                            sink.batch(Table::Calls, b)?;
                        }
                    }
                    _ => {}
                }
                Ok(())
            })();
            // The walker speaks io::Error; keep the real error and stop it with a placeholder.
            r.map_err(|e| {
                failed = Some(e);
                std::io::Error::other("table sink failed")
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let (read, warnings) = result?;
        // Samples after their thread's last recorded activation ended: no function.
        let mut tids: Vec<u64> = samples.pending.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            samples.stacks.remove(&tid);
            samples.place(pid, tid, u64::MAX, resolved, &unknown, &keep_sample, &ns);
        }
        summary.events_read += read;
        summary.warnings.extend(warnings);
    }
    for (t, want) in [(Table::Events, want_events), (Table::Calls, want_calls), (Table::CounterSamples, want_samples)] {
        if !want {
            continue;
        }
        let b = match t {
            Table::Events => events.take(&mut d, 0),
            Table::Calls => calls.take(&mut d),
            _ => samples.take(&mut d),
        };
        // A last, possibly empty, batch: every table gets at least one.
        if b.rows > 0 || !summary.rows.contains_key(t.name()) {
            count(&mut summary, t, &b);
            sink.batch(t, b)?;
        }
    }
    Ok(summary)
}
