//! Metadata records (FORMAT.md sections 4 and 6), serialized with postcard in the field order the spec
//! gives. Adding a field is a minor version change and only ever appends it at the end of a record.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The file header (FORMAT.md 4.2): everything needed to interpret the events without the recording
/// interpreter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Program and version that wrote the file, e.g. `ocular 0.1.0`.
    pub recorder: String,
    /// `sys.version`'s first word, e.g. `3.12.1`.
    pub python_version: String,
    /// `sys.hexversion`.
    pub python_hexversion: u32,
    /// `sys.implementation.name`.
    pub implementation: String,
    /// `sys.platform` and machine, e.g. `linux-x86_64`.
    pub platform: String,
    /// Process id of the recorded program.
    pub pid: u32,
    /// Wall clock at start, ns since the Unix epoch.
    pub start_unix_ns: i64,
    /// `CLOCK_MONOTONIC` at start, ns.
    pub start_monotonic_ns: u64,
    /// Tick counter at start.
    pub start_ticks: u64,
    /// What a tick is.
    pub clock: Clock,
    /// Calibrated ticks per second.
    pub ticks_per_second: f64,
    /// The recorder's options.
    pub options: Options,
    /// The recorder's own measured cost per event, in ticks; 0 if not measured.
    pub event_cost_ticks: f64,
    /// The interpreter's opcode tables.
    pub opcodes: OpcodeTable,
}

/// The header up to its opcode tables, which are its last field: what a pass that reads no code object
/// needs (the tables are 512 strings, most of a small file's header to decode).
#[derive(Deserialize)]
struct HeaderWithoutOpcodes {
    recorder: String,
    python_version: String,
    python_hexversion: u32,
    implementation: String,
    platform: String,
    pid: u32,
    start_unix_ns: i64,
    start_monotonic_ns: u64,
    start_ticks: u64,
    clock: Clock,
    ticks_per_second: f64,
    options: Options,
    event_cost_ticks: f64,
}

impl Header {
    /// The header in `bytes` (postcard, FORMAT.md 4.2) with empty opcode tables, and the bytes after the
    /// fields read.
    pub fn without_opcodes(bytes: &[u8]) -> postcard::Result<(Header, &[u8])> {
        let (h, rest) = postcard::take_from_bytes::<HeaderWithoutOpcodes>(bytes)?;
        let header = Header {
            recorder: h.recorder,
            python_version: h.python_version,
            python_hexversion: h.python_hexversion,
            implementation: h.implementation,
            platform: h.platform,
            pid: h.pid,
            start_unix_ns: h.start_unix_ns,
            start_monotonic_ns: h.start_monotonic_ns,
            start_ticks: h.start_ticks,
            clock: h.clock,
            ticks_per_second: h.ticks_per_second,
            options: h.options,
            event_cost_ticks: h.event_cost_ticks,
            opcodes: OpcodeTable::default(),
        };
        Ok((header, rest))
    }
}

/// The clock behind event timestamps (FORMAT.md 4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Clock {
    /// The x86-64 time stamp counter.
    Tsc,
    /// `CLOCK_MONOTONIC` nanoseconds.
    MonotonicNs,
}

/// What the recorder listened to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Function boundaries only.
    Calls,
    /// Function boundaries plus JUMP and BRANCH: basic blocks.
    Adaptive,
    /// Function boundaries plus every INSTRUCTION.
    Precise,
}

impl Mode {
    /// The name users type: `calls`, `adaptive`, `precise`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Calls => "calls",
            Mode::Adaptive => "adaptive",
            Mode::Precise => "precise",
        }
    }
}

/// The recorder's options (FORMAT.md 4.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Recording mode.
    pub mode: Mode,
    /// Hits of one location before it is disabled; 0 = gapless.
    pub deinstrument_threshold: u32,
    /// When non-empty, only code objects matching one of these substrings are recorded.
    pub include_only: Vec<String>,
    /// Code objects matching one of these substrings are not recorded.
    pub exclude: Vec<String>,
    /// Events per per-thread buffer.
    pub buffer_events: u32,
    /// Buffers in flight before events are dropped (and counted).
    pub max_buffers: u32,
}

/// The interpreter's opcode tables, 256 entries each, indexed by opcode number (empty in a header read
/// without them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpcodeTable {
    /// Opcode names, base and specialized; empty for unused numbers.
    pub names: Vec<String>,
    /// The base (de-specialized) opcode of each opcode.
    pub base: Vec<u8>,
    /// Inline cache code units that follow each base instruction.
    pub cache_entries: Vec<u8>,
    /// `opcode.HAVE_ARGUMENT`.
    pub have_argument: u8,
    /// `opcode.EXTENDED_ARG`.
    pub extended_arg: u8,
}

impl OpcodeTable {
    /// The name of `op`, or `<op N>` for numbers the table leaves empty or does not have.
    pub fn name(&self, op: u8) -> Cow<'_, str> {
        match self.names.get(op as usize) {
            Some(n) if !n.is_empty() => n.as_str().into(),
            _ => format!("<op {op}>").into(),
        }
    }
}

/// A code object seen while recording (FORMAT.md 6.1). Not itself serialized: the file stores it with
/// `co_linetable` (1.x files stored decoded positions), and the reader fills in both `linetable` and
/// `positions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// Id used by events; unique in the file, from 1.
    pub id: u32,
    /// `co_name`.
    pub name: String,
    /// `co_qualname`.
    pub qualname: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// `co_flags`.
    pub flags: u32,
    /// `co_code`: base bytecode, 2 bytes per code unit.
    pub bytecode: Vec<u8>,
    /// `co_linetable`, as stored by format 2.0 (empty in 1.x files). A writer given an empty table encodes
    /// one from `positions`.
    pub linetable: Vec<u8>,
    /// One position per code unit, as `co_positions()` gives them: decoded from `linetable` by the reader
    /// (stored as such in 1.x files). A recorder may leave it empty and give only `linetable`.
    pub positions: Vec<Position>,
}

/// How a [`CodeObject`] is stored (FORMAT.md 6.1): seven fields, then its source positions, which format
/// 2.0 stores as `co_linetable` (`L` = bytes) and 1.x stored decoded (`L` = `Vec<Position>`, FORMAT.md 9).
#[derive(Serialize, Deserialize)]
pub(crate) struct CodeRecord<'a, L> {
    pub id: u32,
    pub name: Cow<'a, str>,
    pub qualname: Cow<'a, str>,
    pub filename: Cow<'a, str>,
    pub first_line: u32,
    pub flags: u32,
    #[serde(with = "cow_bytes")]
    pub bytecode: Cow<'a, [u8]>,
    pub lines: L,
}

/// A `Cow<[u8]>` field as a byte string: the same bytes on the wire as serde's default sequence of `u8`
/// in postcard (a varint length, then the bytes), written and read in one piece instead of byte by byte.
mod cow_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::borrow::Cow;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, 'a, D: Deserializer<'de>>(d: D) -> Result<Cow<'a, [u8]>, D::Error> {
        serde_bytes::ByteBuf::deserialize(d).map(|b| Cow::Owned(b.into_vec()))
    }
}

impl<L> CodeRecord<'_, L> {
    /// The code object without its positions, and the positions as stored.
    pub fn split(self) -> (CodeObject, L) {
        let code = CodeObject {
            id: self.id,
            name: self.name.into_owned(),
            qualname: self.qualname.into_owned(),
            filename: self.filename.into_owned(),
            first_line: self.first_line,
            flags: self.flags,
            bytecode: self.bytecode.into_owned(),
            linetable: Vec::new(),
            positions: Vec::new(),
        };
        (code, self.lines)
    }
}

/// Source position of one code unit; -1 where `co_positions()` gives `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// First line.
    pub line: i32,
    /// Last line.
    pub end_line: i32,
    /// First column (UTF-8 byte offset).
    pub column: i32,
    /// End column.
    pub end_column: i32,
}

/// A thread's name (FORMAT.md 6.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Native thread id, as in chunk headers.
    pub thread_id: u64,
    /// `threading.Thread.name`.
    pub name: String,
    /// Whether this is the interpreter's main thread.
    pub is_main: bool,
}

/// Events the recorder had to drop (FORMAT.md 6.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Thread whose events were dropped.
    pub thread_id: u64,
    /// How many.
    pub count: u64,
    /// Ticks of the first dropped event.
    pub first_ticks: u64,
    /// Ticks of the last dropped event.
    pub last_ticks: u64,
}

/// Events a flight recorder recorded and then overwrote (FORMAT.md 6.8, since 2.4): all before the
/// thread's first events in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// The thread.
    pub thread_id: u64,
    /// Events overwritten.
    pub events: u64,
    /// Ticks of the thread's first recorded event.
    pub first_ticks: u64,
    /// Ticks of the last overwritten event.
    pub last_ticks: u64,
}

/// Which run of several processes a file belongs to, and how its process started (FORMAT.md 6.10, since
/// 2.6).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// The same in every file of one run.
    pub run_id: u64,
    /// The process that started this one; 0 for the run's first.
    pub parent_pid: u32,
    /// `run`, `fork` or `exec`.
    pub started: String,
    /// `sys.executable`.
    pub executable: String,
    /// `sys.orig_argv`.
    pub argv: Vec<String>,
}

/// Samples of performance counters (FORMAT.md 6.9, since 2.5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSamples {
    /// Every counter asked for, by index.
    pub counters: Vec<CounterInfo>,
    /// The samples.
    pub samples: Vec<CounterSample>,
    /// (thread, counter, samples) the kernel could not store.
    pub lost: Vec<(u64, u8, u64)>,
}

/// A counter (FORMAT.md 6.9).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterInfo {
    /// `page-faults`, `task-clock`, ...
    pub name: String,
    /// What one event is: `faults`, `ns`, ...
    pub unit: String,
    /// Events per sample.
    pub period: u64,
    /// Why it could not be opened; empty if it was recorded.
    pub error: String,
}

/// One sample (FORMAT.md 6.9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSample {
    /// Native thread id.
    pub thread_id: u64,
    /// Index into the counters.
    pub counter: u8,
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub monotonic_ns: u64,
    /// Events it stands for.
    pub period: u64,
}

/// A C callable a recording saw called (FORMAT.md 6.11, since 2.7): the target of `CALL` events.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CFunction {
    /// C callable id, as `CALL` events carry it in `arg`; from 1, a space apart from code ids.
    pub id: u32,
    /// As Python names it: `isinstance`, `list.append`, `Pattern.match`, `dict`, `partial.__call__`.
    pub qualname: String,
    /// The module that defines it (`builtins`, `_json`, `re`); empty if unknown.
    pub module: String,
    /// What was called: [`CFunction::BUILTIN`], [`CFunction::DESCRIPTOR`], [`CFunction::TYPE`] or
    /// [`CFunction::OBJECT`].
    pub kind: u8,
}

impl CFunction {
    /// A built-in function, or a built-in method bound to its object.
    pub const BUILTIN: u8 = 0;
    /// A method descriptor, called with its object as the first argument.
    pub const DESCRIPTOR: u8 = 1;
    /// A type, called to make an instance.
    pub const TYPE: u8 = 2;
    /// Any other callable object (named after its type's `__call__`).
    pub const OBJECT: u8 = 3;
    /// Where a reader that puts C callables and code objects in one id space puts C callable 0: code ids
    /// are below it (FORMAT.md 6.11).
    pub const CODE_ID_BASE: u32 = 0x8000_0000;
}

/// Specialized bytecode of a code object at stop (FORMAT.md 6.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeSnapshot {
    /// Code id.
    pub id: u32,
    /// `_co_code_adaptive` at stop, as it was (the reader undoes format 2.0's XOR with the base bytecode).
    #[serde(with = "serde_bytes")]
    pub bytecode: Vec<u8>,
}

/// The recording's ring file (FORMAT.md 6.7, since 2.3; RING.md): where the events it had not written
/// yet are if it does not end cleanly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingInfo {
    /// The ring file's path, as the recorder created it.
    pub path: String,
}

/// The recorder's cost per event kind, in ticks (FORMAT.md 6.6, since 1.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// (event kind, ticks) pairs.
    pub costs: Vec<(u8, f64)>,
}

impl Calibration {
    /// Pseudo-kinds (FORMAT.md 6.6, since 2.11): the interpreter's cost of instrumenting a code object at
    /// its first call after events were re-armed, per code object and per byte of its bytecode.
    pub const INSTRUMENT_CODE: u8 = 250;
    /// See [`Calibration::INSTRUMENT_CODE`].
    pub const INSTRUMENT_BYTE: u8 = 251;
    /// Pseudo-kinds (FORMAT.md 6.6, since 2.12): ticks per iteration of the calibration's loop run without
    /// the recorder, at the start (in the first `CALIBRATION` chunk) and at the stop (in one of its own
    /// after the last events): how fast the machine ran then.
    pub const SPEED_START: u8 = 252;
    /// See [`Calibration::SPEED_START`].
    pub const SPEED_STOP: u8 = 253;
    /// The most a stop's speed may move the costs measured at the start, either way: beyond it the file
    /// is not believed.
    pub const MAX_SPEED_RATIO: f64 = 3.0;

    /// The name of a cost's kind: an event kind's, or `instrument_code` / `instrument_byte`.
    pub fn cost_name(kind: u8) -> std::borrow::Cow<'static, str> {
        match kind {
            Self::INSTRUMENT_CODE => "instrument_code".into(),
            Self::INSTRUMENT_BYTE => "instrument_byte".into(),
            Self::SPEED_START => "speed_start".into(),
            Self::SPEED_STOP => "speed_stop".into(),
            _ => crate::kind_name(kind),
        }
    }

    /// (per code object, per byte) instrumenting cost in ticks; (0, 0) in files before 2.11. An environment
    /// override (`OCULAR_INSTRUMENT_TICKS=A,B`) is for experiments.
    pub fn instrument(&self) -> (f64, f64) {
        let get = |k: u8| self.costs.iter().find(|&&(kind, _)| kind == k).map_or(0.0, |&(_, t)| t.max(0.0));
        if let Some((a, b)) = std::env::var("OCULAR_INSTRUMENT_TICKS").ok().as_deref().and_then(|v| v.split_once(',')) {
            return (a.parse().unwrap_or(0.0), b.parse().unwrap_or(0.0));
        }
        (get(Self::INSTRUMENT_CODE), get(Self::INSTRUMENT_BYTE))
    }

    /// A pseudo-kind's value, if the calibration has it.
    pub fn get(&self, kind: u8) -> Option<f64> {
        self.costs.iter().find(|&&(k, _)| k == kind).map(|&(_, t)| t)
    }

    /// Whether this is the calibration written at the stop (FORMAT.md 6.6): its speed only, no cost.
    pub fn is_stop(&self) -> bool {
        !self.costs.is_empty() && self.costs.iter().all(|&(k, _)| k == Self::SPEED_STOP)
    }

    /// How much the costs measured at the start (`self`) are to be scaled for the machine's speed at the
    /// stop (`stop`): the loop's ticks per iteration at the stop over those at the start, within
    /// [`Calibration::MAX_SPEED_RATIO`] either way; `None` without both.
    pub fn speed_ratio(&self, stop: &Calibration) -> Option<f64> {
        let (a, b) = (self.get(Self::SPEED_START)?, stop.get(Self::SPEED_STOP)?);
        (a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite())
            .then(|| (b / a).clamp(1.0 / Self::MAX_SPEED_RATIO, Self::MAX_SPEED_RATIO))
    }

    /// Cost in ticks of each of the 256 event kinds, `default` where none was measured.
    pub fn table(&self, default: f64) -> [f64; 256] {
        let mut t = [default; 256];
        for &(k, c) in &self.costs {
            t[k as usize] = c;
        }
        t
    }
}

/// What a reader subtracts per event, in ticks, by kind: the calibrated cost of each kind measured (6.6),
/// `default` (the header's `event_cost_ticks`, 4.2) for the others, a `PY_START`'s for the events of a C
/// call that were not measured (5.4: the same work), and nothing for the recorder's own markers (5.3), whose
/// writing is not a callback; a `PAUSE` (5.6) costs its length, [`crate::RawEvent::pause_ticks`], besides.
pub fn cost_table(default: f64, calibration: Option<&Calibration>) -> [f64; 256] {
    use crate::EventKind as K;
    let default = default.max(0.0);
    let mut t = calibration.map_or([default; 256], |c| c.table(default));
    if let Some(c) = calibration {
        for k in [K::CALL, K::C_RETURN, K::C_RAISE] {
            if !c.costs.iter().any(|&(kind, _)| kind == k as u8) {
                t[k as usize] = t[K::PY_START as usize];
            }
        }
    }
    for k in [K::WINDOW, K::WINDOW_END, K::STACK, K::PAUSE, K::DUE, K::DUE_STACK, K::SPAN, K::SPAN_END, K::SPAN_DATA] {
        t[k as usize] = 0.0;
    }
    // A counted call (5.8) is a call's callback that stores an event, as a recorded one is.
    t[K::COUNT as usize] = t[K::PY_START as usize];
    t
}

/// [`cost_table`] for the events after the start's `calibration`, its costs brought to the machine's speed
/// at the stop (FORMAT.md 6.6, since 2.12) where the file has both: the table and the ratio applied.
pub fn cost_table_at_speed(default: f64, calibration: &Calibration, stop: Option<&Calibration>) -> ([f64; 256], f64) {
    let ratio = stop.and_then(|s| calibration.speed_ratio(s)).unwrap_or(1.0);
    let mut t = cost_table(default, Some(calibration));
    for c in t.iter_mut() {
        *c *= ratio;
    }
    (t, ratio)
}

/// The clean-close marker (FORMAT.md 6.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// Wall clock at stop, ns since the Unix epoch.
    pub end_unix_ns: i64,
    /// Monotonic clock at stop, ns.
    pub end_monotonic_ns: u64,
    /// Tick counter at stop.
    pub end_ticks: u64,
    /// Events written in EVENTS chunks.
    pub events: u64,
    /// Events counted in LOST records.
    pub lost: u64,
    /// Chunks before the trailer.
    pub chunks: u64,
}
