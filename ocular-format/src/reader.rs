//! The streaming reader: chunk by chunk, memory bounded by one chunk, never panicking on any input.

use crate::chunk::{codec, hex, kind, ChunkHeader, Preamble, CHUNK_HEADER_LEN, MAGIC, MAJOR, SYNC};
use crate::error::{Error, Result};
use crate::event::RawEvent;
use crate::meta::{
    CFunction, Calibration, CodeObject, CodeRecord, CodeSnapshot, CounterSamples, Dropped, Header, Lost, Position,
    ProcessInfo, RingInfo, ThreadInfo, Trailer,
};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::Path;
use zerocopy::FromBytes;

/// How the reader treats damage.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Skip corrupt chunks (reporting the byte ranges) instead of failing on the first one.
    pub salvage: bool,
    /// Check `EVENTS` chunks (header and CRC) but neither decompress nor decode them: they come back as
    /// empty [`Body::Events`] (their `count` is in the [`ChunkInfo`]). For a pass that only wants the
    /// metadata, such as the code objects and snapshots.
    pub skip_events: bool,
    /// Likewise `CODE` and `SNAPSHOT` chunks: they come back empty, and so do the header's opcode tables.
    /// For a pass that wants neither the code objects nor the events (a run's process record, the
    /// calibration and counter chunks); a snapshot cannot be read without its code object's base bytecode
    /// anyway.
    pub skip_code: bool,
}

impl ReadOptions {
    /// The defaults, salvaging damaged chunks if `salvage` (the `--salvage` of the analyzer's commands).
    pub fn with_salvage(salvage: bool) -> Self {
        ReadOptions { salvage, ..Default::default() }
    }
}

/// Where a chunk sits in the file and what its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    /// Byte offset of the chunk header.
    pub offset: u64,
    /// Chunk kind.
    pub kind: u16,
    /// Codec byte.
    pub codec: u8,
    /// Sequence number.
    pub seq: u64,
    /// Thread id (0 for file-wide chunks).
    pub thread_id: u64,
    /// First timestamp.
    pub first_ts: u64,
    /// Last timestamp.
    pub last_ts: u64,
    /// Events or records.
    pub count: u32,
    /// Stored payload bytes.
    pub stored_len: u32,
    /// Decompressed payload bytes.
    pub raw_len: u32,
}

/// What a chunk holds, decoded.
#[derive(Debug)]
pub enum Body<'a> {
    /// One thread's events, in order; the slice is valid until the next call.
    Events(&'a [RawEvent]),
    /// Code objects.
    Code(Vec<CodeObject>),
    /// A thread's name.
    Thread(ThreadInfo),
    /// Dropped events.
    Lost(Lost),
    /// Specialized bytecode snapshots.
    Snapshot(Vec<CodeSnapshot>),
    /// The clean-close trailer.
    Trailer(Trailer),
    /// The recorder's cost per event kind (since 1.1).
    Calibration(Calibration),
    /// The recording's ring file (since 2.3, RING.md).
    Ring(RingInfo),
    /// Events a flight recorder overwrote before the file was written (since 2.4).
    Dropped(Dropped),
    /// Performance counter samples (since 2.5).
    Counters(CounterSamples),
    /// The run of several processes the file belongs to (FORMAT.md 6.10, since 2.6).
    Process(ProcessInfo),
    /// C callables called (FORMAT.md 6.11, since 2.7).
    CFunctions(Vec<CFunction>),
    /// A chunk this reader does not understand (unknown kind or codec); skipped, and counted in the report.
    Skipped(String),
}

/// A decoded chunk.
#[derive(Debug)]
pub struct Chunk<'a> {
    /// Its place and header.
    pub info: ChunkInfo,
    /// Its content.
    pub body: Body<'a>,
}

/// A byte range the reader could not use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// First byte of the range.
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
    /// What was wrong.
    pub reason: String,
}

/// What the reader saw so far: enough to tell a user what is missing and why.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Chunks decoded (including the header).
    pub chunks: u64,
    /// Events decoded.
    pub events: u64,
    /// Bytes consumed, up to the end of the last whole chunk.
    pub bytes: u64,
    /// Chunks whose kind or codec this reader does not know, skipped.
    pub unknown_chunks: u64,
    /// Damaged ranges skipped in salvage mode, and chunks missing by sequence number.
    pub damage: Vec<Damage>,
    /// A partial chunk at the end of the file: its offset and the bytes present.
    pub truncated: Option<(u64, u64)>,
    /// The trailer, if the file was closed cleanly.
    pub trailer: Option<Trailer>,
    /// Events counted in the `LOST` records read.
    pub lost: u64,
    /// The trailer's counts next to what was read before it, when they disagree (FORMAT.md 6.5).
    pub mismatch: Option<Mismatch>,
    /// Per thread that lost events (its `LOST` records), by thread id.
    pub losses: std::collections::BTreeMap<u64, ThreadLoss>,
    /// Events read per thread (for the share a thread lost).
    pub thread_events: HashMap<u64, u64>,
    /// The header's start ticks and tick rate, to say when losses happened.
    clock: Option<(u64, f64)>,
    /// What was recovered from the recording's ring file (RING.md 4), if anything.
    pub recovered: Option<Recovered>,
    /// The ring file the trace names, when the trace did not end and that file is gone (RING.md 2): what
    /// the recording had not yet written is lost.
    pub ring_gone: Option<String>,
    /// Per thread, the events a flight recorder overwrote before the file was written (`DROPPED`, since
    /// 2.4), by thread id. Not damage: the file holds the newest part of the recording.
    pub dropped: std::collections::BTreeMap<u64, Dropped>,
}

/// What a reader took from a ring file after the last chunk of a trace that did not end (RING.md 4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The ring file.
    pub path: String,
    /// Events recovered.
    pub events: u64,
    /// Threads they belong to.
    pub threads: usize,
    /// Code objects and thread names recovered.
    pub records: u64,
    /// Code objects the ring had no room for (their events show as unknown code).
    pub dropped: u64,
    /// Chunks of a flight recorder's chunk region (RING.md 3.5) recovered.
    pub ring_chunks: u64,
    /// Events in them.
    pub chunk_events: u64,
    /// Whether the trace was read from the ring file alone (RING.md 5).
    pub alone: bool,
}

/// Where a thread lost events: the recorder had no buffer for them (FORMAT.md 6.3).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ThreadLoss {
    /// Native thread id.
    pub thread_id: u64,
    /// Events dropped.
    pub count: u64,
    /// When, as (first, last) ticks of each `LOST` record, merged where they touch; the first
    /// [`MAX_LOSS_RANGES`] only.
    pub ranges: Vec<(u64, u64)>,
    /// `LOST` records beyond [`MAX_LOSS_RANGES`], counted but not kept.
    pub more_ranges: u64,
}

/// Loss ranges kept per thread: a file of many `LOST` records costs the reader no more than this.
pub const MAX_LOSS_RANGES: usize = 256;

impl Report {
    /// The share of `thread_id`'s events that were lost, from 0 to 1.
    pub fn lost_share(&self, thread_id: u64) -> f64 {
        let lost = self.losses.get(&thread_id).map_or(0, |l| l.count);
        let read = self.thread_events.get(&thread_id).copied().unwrap_or(0);
        if lost == 0 {
            0.0
        } else {
            lost as f64 / (lost + read) as f64
        }
    }

    /// Milliseconds after the recording's start of `ticks`, if the header was read.
    pub fn ms_after_start(&self, ticks: u64) -> Option<f64> {
        let (start, tps) = self.clock?;
        (tps > 0.0).then(|| ticks.saturating_sub(start) as f64 * 1e3 / tps)
    }

    /// One line per thread that lost events (the eight that lost most, then one line for the rest): how
    /// many, what share, and when.
    pub fn loss_lines(&self) -> Vec<String> {
        let mut losses: Vec<&ThreadLoss> = self.losses.values().collect();
        losses.sort_by(|a, b| b.count.cmp(&a.count).then(a.thread_id.cmp(&b.thread_id)));
        let ms = |t: u64| match self.ms_after_start(t) {
            Some(m) if m < 10.0 => format!("{m:.3} ms"),
            Some(m) => format!("{m:.1} ms"),
            None => format!("tick {t}"),
        };
        let mut lines: Vec<String> = losses
            .iter()
            .take(8)
            .map(|l| {
                let made = l.count + self.thread_events.get(&l.thread_id).copied().unwrap_or(0);
                let stretches = l.ranges.len() as u64 + l.more_ranges;
                let (a, b) = (l.ranges.first().map_or(0, |r| r.0), l.ranges.iter().map(|r| r.1).max().unwrap_or(0));
                let when = if stretches == 1 {
                    format!("from {} to {}", ms(a), ms(b))
                } else {
                    format!("in {stretches} stretches between {} and {}", ms(a), ms(b))
                };
                format!(
                    "thread {} lost {} of its {} events ({:.1}%) {when} after the start: the recorder could not keep \
                     them (its writer fell behind, or could not write the file), so that thread's figures miss them",
                    l.thread_id,
                    l.count,
                    made,
                    self.lost_share(l.thread_id) * 100.0
                )
            })
            .collect();
        if losses.len() > 8 {
            let rest = &losses[8..];
            lines.push(format!(
                "{} more threads lost {} events in all (info --json lists every thread)",
                rest.len(),
                rest.iter().map(|l| l.count).sum::<u64>()
            ));
        }
        lines
    }

    fn add_loss(&mut self, lost: &Lost) {
        self.lost += lost.count;
        let l = self
            .losses
            .entry(lost.thread_id)
            .or_insert_with(|| ThreadLoss { thread_id: lost.thread_id, ..ThreadLoss::default() });
        l.count += lost.count;
        let (a, b) = (lost.first_ticks.min(lost.last_ticks), lost.first_ticks.max(lost.last_ticks));
        let n = l.ranges.len();
        match l.ranges.last_mut() {
            Some(last) if a <= last.1 && b >= last.0 => *last = (last.0.min(a), last.1.max(b)),
            _ if n < MAX_LOSS_RANGES => l.ranges.push((a, b)),
            _ => l.more_ranges += 1,
        }
    }
}

/// What the trailer counts and what the reader found before it, for a file whose counts disagree: chunks
/// were removed (or added) and renumbered, which sequence numbers alone do not show (FORMAT.md 6.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Events in `EVENTS` chunks, by the trailer.
    pub trailer_events: u64,
    /// Events in `EVENTS` chunks, as read.
    pub read_events: u64,
    /// Chunks before the trailer, by the trailer.
    pub trailer_chunks: u64,
    /// Chunks before the trailer, as read.
    pub read_chunks: u64,
    /// Events in `LOST` records, by the trailer.
    pub trailer_lost: u64,
    /// Events in `LOST` records, as read.
    pub read_lost: u64,
}

impl Mismatch {
    fn describe(&self) -> String {
        let parts: Vec<String> = [
            ("events", self.trailer_events, self.read_events),
            ("chunks", self.trailer_chunks, self.read_chunks),
            ("lost events", self.trailer_lost, self.read_lost),
        ]
        .into_iter()
        .filter(|(_, counted, read)| counted != read)
        .map(|(what, counted, read)| {
            let diff = if read < counted {
                format!("{} missing", counted - read)
            } else {
                format!("{} more than counted", read - counted)
            };
            format!("{counted} {what} counted, {read} read ({diff})")
        })
        .collect();
        parts.join("; ")
    }
}

impl Report {
    /// Whether the file ended with a trailer and nothing was damaged.
    pub fn clean(&self) -> bool {
        self.trailer.is_some() && self.mismatch.is_none() && self.damage.is_empty() && self.truncated.is_none()
    }

    /// Human-readable warnings, one per problem, empty for a clean file.
    pub fn warnings(&self, path: &str) -> Vec<String> {
        let mut w = Vec::new();
        if let Some((off, bytes)) = self.truncated {
            w.push(format!(
                "{path}: incomplete chunk at offset {off} ({bytes} bytes) ignored: the writer stopped mid-chunk \
                 or is still writing"
            ));
        }
        for d in &self.damage {
            w.push(format!("{path}: skipped {} bytes at offset {}: {}", d.len, d.offset, d.reason));
        }
        if let Some(m) = &self.mismatch {
            w.push(format!(
                "{path}: the trailer does not match what the file holds: {}; chunks were removed from the file \
                 (or added) after it was written",
                m.describe()
            ));
        }
        if self.unknown_chunks > 0 {
            w.push(format!(
                "{path}: {} chunks of kinds or codecs this Ocular does not know were skipped",
                self.unknown_chunks
            ));
        }
        if let Some(r) = &self.recovered {
            let dropped = if r.dropped > 0 {
                format!("; {} code objects did not fit in it and are unnamed", r.dropped)
            } else {
                String::new()
            };
            let chunks = if r.ring_chunks > 0 {
                format!(" ({} of them in {} compressed chunks of its flight recorder)", r.chunk_events, r.ring_chunks)
            } else {
                String::new()
            };
            let from = if r.alone {
                "the ring file alone: the recording did not end (killed or crashed); recovered".to_string()
            } else {
                "no trailer: the recording did not end (killed or crashed); read up to its last whole chunk, then \
                 recovered"
                    .to_string()
            };
            w.push(format!(
                "{path}: {from} {} events{chunks} of {} threads and {} code objects and names from {}{dropped}",
                r.events, r.threads, r.records, r.path
            ));
        } else if let (None, Some(ring)) = (&self.trailer, &self.ring_gone) {
            w.push(format!(
                "{path}: no trailer: the recording did not end, and its ring file {ring} is gone (removed, or \
                 the machine restarted): what it had not yet written is lost; read up to the last whole chunk \
                 (offset {})",
                self.bytes
            ));
        } else if self.trailer.is_none() {
            w.push(format!(
                "{path}: no trailer: the recording did not close cleanly; read up to the last whole chunk \
                 (offset {})",
                self.bytes
            ));
        }
        // After the damage: what the recorder itself could not write.
        for line in self.loss_lines() {
            w.push(format!("{path}: {line}"));
        }
        w
    }
}

enum Attempt {
    Ok(ChunkHeader),
    Eof,
    Partial(u64),
    Bad(String),
}

/// A zstd decompression context, taken from this thread's spares and given back when dropped: making one
/// asks the CPU what it supports (`cpuid`), which a virtual machine traps, ~9 us a context; an analysis
/// opens its file two or three times, and the pytest plugin's summary reads a small trace per test.
struct Dctx(Option<zstd::bulk::Decompressor<'static>>);

thread_local! {
    static SPARE_DCTX: std::cell::RefCell<Vec<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Dctx {
    fn take() -> std::io::Result<Self> {
        let spare = SPARE_DCTX.try_with(|s| s.borrow_mut().pop()).ok().flatten();
        Ok(Dctx(Some(match spare {
            Some(d) => d,
            None => zstd::bulk::Decompressor::new()?,
        })))
    }

    fn get(&mut self) -> &mut zstd::bulk::Decompressor<'static> {
        self.0.as_mut().expect("a context until dropped")
    }
}

impl Drop for Dctx {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = SPARE_DCTX.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < 4 {
                    s.push(d);
                }
            });
        }
    }
}

/// Reads an `.ocl` file chunk by chunk.
///
/// ```no_run
/// use ocular_format::{Reader, Body};
/// let mut r = Reader::open("run.ocl")?;
/// println!("Python {}", r.header().python_version);
/// while let Some(chunk) = r.next_chunk()? {
///     if let Body::Events(events) = chunk.body {
///         println!("thread {}: {} events", chunk.info.thread_id, events.len());
///     }
/// }
/// for warning in r.report().warnings(r.path()) { eprintln!("warning: {warning}"); }
/// # Ok::<(), ocular_format::Error>(())
/// ```
pub struct Reader<R> {
    src: R,
    path: String,
    opts: ReadOptions,
    version: (u16, u16),
    header: Option<Header>,
    pos: u64,
    next_seq: u64,
    done: bool,
    stored: Vec<u8>,
    raw: Vec<u8>,
    events: Vec<RawEvent>,
    decoder: crate::codec::Decoder,
    zstd: Dctx,
    report: Report,
    /// Base bytecode by code id (2.0 files), to undo the XOR of snapshots: state per code object.
    bases: HashMap<u32, Vec<u8>>,
    /// The file itself, when opened by path: a trace that did not end is completed from its ring file.
    file: Option<std::path::PathBuf>,
    /// The ring file a `RING` chunk named.
    ring: Option<String>,
    /// Reading a ring file alone (RING.md 5).
    alone: bool,
    /// Chunks recovered from the ring file, once looked for (RING.md 4).
    recovery: Option<std::collections::VecDeque<Pending>>,
    /// (thread, first ticks) of every `EVENTS` chunk read, code ids and named threads: what the ring
    /// file need not add.
    seen: Seen,
}

impl<R> std::fmt::Debug for Reader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("path", &self.path).field("pos", &self.pos).finish_non_exhaustive()
    }
}

/// What [`Reader::open`] reads: the file, or (for a ring file read alone, RING.md 5) the start of a trace
/// made from its header, after which the ring file's content is recovered.
#[derive(Debug)]
pub enum Source {
    /// An `.ocl` file.
    File(BufReader<File>),
    /// Bytes in memory.
    Memory(Cursor<Vec<u8>>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(f) => f.read(buf),
            Source::Memory(m) => m.read(buf),
        }
    }
}

impl Seek for Source {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        match self {
            Source::File(f) => f.seek(pos),
            Source::Memory(m) => m.seek(pos),
        }
    }
}

impl Reader<Source> {
    /// Opens a file and reads its preamble and header. A ring file (RING.md) is read as the trace it holds.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, ReadOptions::default())
    }

    /// [`Reader::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, opts: ReadOptions) -> Result<Self> {
        let name = path.as_ref().display().to_string();
        let mut file = File::open(path.as_ref()).map_err(|source| Error::Io { path: name.clone(), error: source })?;
        if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(Error::Io {
                path: name,
                error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "is a directory, not an .ocl file"),
            });
        }
        let mut magic = [0u8; 8];
        let n = file.read(&mut magic).map_err(|source| Error::Io { path: name.clone(), error: source })?;
        if n == 8 && magic == crate::ring::MAGIC {
            return Self::open_ring(path.as_ref(), opts);
        }
        file.seek(SeekFrom::Start(0)).map_err(|source| Error::Io { path: name.clone(), error: source })?;
        // A small file (a test's trace) needs no buffer larger than itself: a 256 KiB one is a fresh
        // mapping, its pages faulted in, for every file read.
        let len = file.metadata().map_or(u64::MAX, |m| m.len());
        let capacity = (256 << 10).min(len.saturating_add(1).max(8 << 10) as usize);
        let mut r = Reader::new(Source::File(BufReader::with_capacity(capacity, file)), &name, opts)?;
        r.file = Some(path.as_ref().to_owned());
        Ok(r)
    }

    /// A ring file read alone (RING.md 5): its `HEADER` (and `CALIBRATION`) records make the start of a
    /// trace, and the rest is recovered from it as for an `.ocl` file without a trailer.
    fn open_ring(path: &Path, opts: ReadOptions) -> Result<Self> {
        let name = path.display().to_string();
        let ring = crate::ring::RingFile::open(path)?;
        let refuse = |what: String| Error::Corrupt { path: name.clone(), offset: 0, what };
        if ring.state == crate::ring::file_state::ENDED {
            return Err(refuse("the ring file of a recording that ended cleanly: read its .ocl file".into()));
        }
        if ring.owner_alive() {
            return Err(refuse(format!(
                "the recording (process {}) is still running: its ring is being rewritten; ask it for a dump \
                 (rec.dump(), or the signal given to --dump-on), or read it once the process has ended",
                ring.pid
            )));
        }
        let Some(bytes) = ring.header_record() else {
            return Err(refuse(
                "a ring file without a HEADER record (written by Ocular before 1.1 of RING.md): \
                               read its .ocl file"
                    .into(),
            ));
        };
        let header: Header = postcard::take_from_bytes(bytes)
            .map(|(h, _)| h)
            .map_err(|e| refuse(format!("its HEADER record does not decode: {e}")))?;
        let plain = crate::writer::WriterOptions { compress: false, ..Default::default() };
        let mut w = crate::writer::Writer::new(Vec::new(), &name, &header, plain)?;
        for (k, payload) in ring.meta() {
            if k == kind::CALIBRATION {
                if let Ok((c, _)) = postcard::take_from_bytes::<Calibration>(payload) {
                    w.calibration(&c)?;
                }
            }
        }
        let start = w.finish_open();
        let mut r = Reader::new(Source::Memory(Cursor::new(start)), &name, opts)?;
        r.ring = Some(name);
        r.alone = true;
        Ok(r)
    }
}

/// What the file already holds, so that a recovery adds only what it lacks.
#[derive(Default)]
struct Seen {
    firsts: std::collections::HashSet<(u64, u64)>,
    code: std::collections::HashSet<u32>,
    cfuncs: std::collections::HashSet<u32>,
    threads: std::collections::HashSet<u64>,
}

/// A chunk recovered from a ring file, waiting to be handed out.
enum Pending {
    Code(Vec<CodeObject>),
    CFunctions(Vec<CFunction>),
    Thread(ThreadInfo),
    Events(u64, Vec<RawEvent>),
    /// A whole chunk of a flight recorder's chunk region.
    Chunk(Vec<u8>),
    Dropped(Dropped),
    Lost(Lost),
}

/// A code object from its 2.x record: positions decoded from the location table.
fn code_from_v2(c: CodeRecord<serde_bytes::ByteBuf>) -> CodeObject {
    let (mut code, linetable) = c.split();
    let linetable = linetable.into_vec();
    code.positions = crate::linetable::decode(&linetable, code.first_line, code.bytecode.len() / 2);
    code.linetable = linetable;
    code
}

/// One framed 2.x `CodeObject` record (FORMAT.md 6.1), as a ring file's metadata holds it.
pub(crate) fn decode_code_record(framed: &[u8]) -> std::result::Result<CodeObject, postcard::Error> {
    let (frame, _) = postcard::take_from_bytes::<&[u8]>(framed)?;
    let (c, _) = postcard::take_from_bytes::<CodeRecord<serde_bytes::ByteBuf>>(frame)?;
    Ok(code_from_v2(c))
}

/// Whether process `pid` still runs (then its trace is still being written, not to be completed).
/// A killed process stays a zombie until its parent reaps it, which a killed parent (`timeout -s KILL`)
/// or a slow supervisor can delay for a long time: it no longer writes anything, so it does not count.
pub fn process_alive(pid: u32) -> bool {
    // Linux: the state after the command name in /proc/PID/stat; Z (zombie) and X (dead) are gone.
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        if let Some(state) = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) {
            return !matches!(state, "Z" | "X");
        }
    }
    #[cfg(unix)]
    {
        // SAFETY: kill with signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        false
    }
}

/// Whether the recording that began at `start_ticks` (its header's, on this machine's tick counter) still
/// runs: its process is alive and is the one that made it. Process ids are reused, and the runtime directory
/// keeps a killed recording's ring until its trace is complete: a process that started after the recording
/// did merely holds its pid now (reading a ring through it would show a recording that never moves).
pub fn recording_alive(pid: u32, start_ticks: u64, ticks_per_second: f64) -> bool {
    if !process_alive(pid) {
        return false;
    }
    let Some(age) = process_age(pid).filter(|_| ticks_per_second > 0.0) else { return true };
    let now = now_ticks();
    // A start far after now: a recording of an earlier boot (the counter restarts at boot).
    if start_ticks > now.saturating_add(ticks_per_second as u64) {
        return false;
    }
    let since = now.saturating_sub(start_ticks) as f64 / ticks_per_second;
    // The process's start is known to 10 ms and the tick rate to about 1e-4: a second, and a thousandth of
    // the time since, cover both.
    since <= age + 1.0 + since * 1e-3
}

/// Seconds since process `pid` started (Linux: its start in clock ticks after boot, against the uptime).
fn process_age(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name start at the third (state); the start time is the 22nd.
    let start: f64 = stat[stat.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let uptime: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    (hz > 0).then(|| uptime - start / hz as f64)
}

/// The tick counter recordings on this machine use (FORMAT.md 4.1): the TSC on x86-64, `CLOCK_MONOTONIC`
/// nanoseconds elsewhere.
pub fn now_ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec to a valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

impl<R: Read + Seek> Reader<R> {
    /// After the last whole chunk of a trace without a trailer: the next chunk recovered from its ring
    /// file (RING.md 4), or `None`. The ring file is looked for once, and used only if it belongs to this
    /// trace and its process is gone (a trace still being written is followed, not completed).
    fn recover_next(&mut self) -> Result<Option<Chunk<'_>>> {
        if self.recovery.is_none() {
            self.recovery = Some(self.recover().unwrap_or_default());
        }
        let Some(next) = self.recovery.as_mut().and_then(|q| q.pop_front()) else { return Ok(None) };
        if let Pending::Chunk(bytes) = next {
            // Checked as a chunk read from the file is (sanity, CRC), then decoded as one.
            let bad = |why: String| Error::Corrupt { path: self.path.clone(), offset: self.pos, what: why };
            let h = ChunkHeader::read_from_bytes(&bytes[..CHUNK_HEADER_LEN.min(bytes.len())])
                .map_err(|_| bad("a ring chunk shorter than a chunk header".into()))?;
            h.sanity().map_err(|why| bad(format!("ring chunk: {why}")))?;
            let payload = &bytes[CHUNK_HEADER_LEN..];
            if payload.len() != h.stored_len.get() as usize || h.compute_crc(payload) != h.crc32.get() {
                return Err(bad("ring chunk: length or CRC does not match".into()));
            }
            self.stored.clear();
            self.stored.extend_from_slice(payload);
            let mut h = h;
            h.seq = zerocopy::little_endian::U64::new(self.next_seq);
            return self.decode_body(h, self.pos, true).map(Some);
        }
        let mut info = ChunkInfo {
            offset: self.pos,
            kind: kind::CODE,
            codec: 0,
            seq: self.next_seq,
            thread_id: 0,
            first_ts: 0,
            last_ts: 0,
            count: 1,
            stored_len: 0,
            raw_len: 0,
        };
        let body = match next {
            Pending::Code(objs) => {
                info.count = objs.len() as u32;
                Body::Code(objs)
            }
            Pending::CFunctions(f) => {
                info.kind = kind::CFUNC;
                info.count = f.len() as u32;
                Body::CFunctions(f)
            }
            Pending::Thread(t) => {
                info.kind = kind::THREAD;
                info.thread_id = t.thread_id;
                Body::Thread(t)
            }
            Pending::Dropped(d) => {
                info.kind = kind::DROPPED;
                info.thread_id = d.thread_id;
                info.first_ts = d.first_ticks;
                info.last_ts = d.last_ticks;
                self.report.dropped.insert(d.thread_id, d.clone());
                Body::Dropped(d)
            }
            Pending::Lost(l) => {
                info.kind = kind::LOST;
                info.thread_id = l.thread_id;
                info.first_ts = l.first_ticks;
                info.last_ts = l.last_ticks;
                self.report.add_loss(&l);
                Body::Lost(l)
            }
            Pending::Chunk(_) => unreachable!("handled above"),
            Pending::Events(tid, evs) => {
                info.kind = kind::EVENTS;
                info.thread_id = tid;
                info.count = evs.len() as u32;
                info.first_ts = evs.first().map_or(0, |e| e.ticks.get());
                info.last_ts = evs.last().map_or(0, |e| e.ticks.get());
                self.report.events += evs.len() as u64;
                *self.report.thread_events.entry(tid).or_default() += evs.len() as u64;
                self.events = evs;
                Body::Events(&self.events)
            }
        };
        Ok(Some(Chunk { info, body }))
    }

    /// The chunks a ring file adds to this trace, if it has one that applies.
    fn recover(&mut self) -> Option<std::collections::VecDeque<Pending>> {
        if self.done || self.report.trailer.is_some() {
            return None;
        }
        let header = self.header.as_ref()?;
        if self.file.is_none() && !self.alone {
            return None;
        }
        let candidates =
            [self.ring.as_ref().map(std::path::PathBuf::from), self.file.as_deref().map(crate::ring::path_for)];
        let found = candidates.into_iter().flatten().filter(|p| p.exists()).find_map(|p| {
            crate::ring::RingFile::open(&p).ok().filter(|r| r.pid == header.pid && r.start_ticks == header.start_ticks)
        });
        let Some(ring) = found else {
            if let Some(named) = self.ring.as_ref().filter(|n| !std::path::Path::new(n).exists()) {
                if !recording_alive(header.pid, header.start_ticks, header.ticks_per_second) {
                    self.report.ring_gone = Some(named.clone());
                }
            }
            return None;
        };
        if ring.state != crate::ring::file_state::RECORDING || ring.owner_alive() {
            return None;
        }
        let mut out = std::collections::VecDeque::new();
        let mut rec = Recovered {
            path: ring.path().display().to_string(),
            dropped: ring.meta_dropped,
            alone: self.alone,
            ..Default::default()
        };
        let mut code = Vec::new();
        let mut cfuncs = Vec::new();
        for (k, payload) in ring.meta() {
            match k {
                kind::CFUNC => {
                    let Ok((frame, _)) = postcard::take_from_bytes::<&[u8]>(payload) else { continue };
                    let Ok((f, _)) = postcard::take_from_bytes::<CFunction>(frame) else { continue };
                    if self.seen.cfuncs.insert(f.id) {
                        cfuncs.push(f);
                    }
                }
                kind::CODE => {
                    let Ok(c) = decode_code_record(payload) else { continue };
                    if self.seen.code.insert(c.id) {
                        code.push(c);
                    }
                }
                kind::THREAD => {
                    let Ok((t, _)) = postcard::take_from_bytes::<ThreadInfo>(payload) else { continue };
                    if self.seen.threads.insert(t.thread_id) {
                        out.push_back(Pending::Thread(t));
                        rec.records += 1;
                    }
                }
                _ => {}
            }
        }
        rec.records += (code.len() + cfuncs.len()) as u64;
        if !cfuncs.is_empty() {
            // Before the events that call them, as code objects (FORMAT.md 3.2).
            out.push_front(Pending::CFunctions(cfuncs));
        }
        if !code.is_empty() {
            // Code before the events that use it (FORMAT.md 3.2).
            out.push_front(Pending::Code(code));
        }
        let mut threads = std::collections::HashSet::new();
        // A flight recorder's chunks (RING.md 3.5), each thread's overwritten events said first.
        let (records, _damaged) = ring.chunks();
        let mut ring_firsts = std::collections::HashSet::new();
        let mut said = std::collections::HashSet::new();
        for r in &records {
            let Ok(h) = ChunkHeader::read_from_bytes(&r.chunk[..CHUNK_HEADER_LEN]) else { continue };
            if h.kind.get() == kind::EVENTS {
                let tid = h.thread_id.get();
                if said.insert(tid) && r.events_before > 0 && !self.report.dropped.contains_key(&tid) {
                    out.push_back(Pending::Dropped(Dropped {
                        thread_id: tid,
                        events: r.events_before,
                        first_ticks: r.thread_first_ticks,
                        last_ticks: h.first_ts.get(),
                    }));
                }
                ring_firsts.insert((tid, h.first_ts.get()));
                threads.insert(tid);
                rec.chunk_events += h.count.get() as u64;
            }
            rec.ring_chunks += 1;
            out.push_back(Pending::Chunk(r.chunk.to_vec()));
        }
        rec.events += rec.chunk_events;
        // Where each thread's stream stands: its events in the file, then each slot's place in it (RING.md
        // 3.2.1). A slot that starts beyond that follows events that are in neither (a buffer not in the
        // ring that the writer had not written when the process died): a LOST record says how many, where
        // the trace would otherwise read as whole. Not for a flight recorder, whose overwritten events the
        // DROPPED records say, nor for a damaged file, whose damage is said.
        let gaps = records.is_empty() && self.report.damage.is_empty();
        let mut stream: HashMap<u64, (u64, u64)> = HashMap::new();
        for slot in ring.pending() {
            let first = slot.events[0].ticks.get();
            let at = stream
                .entry(slot.thread_id)
                .or_insert_with(|| (self.report.thread_events.get(&slot.thread_id).copied().unwrap_or(0), first));
            if self.seen.firsts.contains(&(slot.thread_id, first)) || ring_firsts.contains(&(slot.thread_id, first)) {
                if let Some(before) = slot.events_before {
                    at.0 = at.0.max(before + slot.events.len() as u64);
                }
                at.1 = slot.events.last().map_or(first, |e| e.ticks.get());
                continue;
            }
            if let Some(before) = slot.events_before.filter(|&b| gaps && b > at.0) {
                out.push_back(Pending::Lost(Lost {
                    thread_id: slot.thread_id,
                    count: before - at.0,
                    first_ticks: at.1.min(first),
                    last_ticks: first,
                }));
                at.0 = before;
            }
            at.0 += slot.events.len() as u64;
            at.1 = slot.events.last().map_or(first, |e| e.ticks.get());
            rec.events += slot.events.len() as u64;
            threads.insert(slot.thread_id);
            out.push_back(Pending::Events(slot.thread_id, slot.events));
        }
        rec.threads = threads.len();
        if rec.events == 0 && rec.records == 0 && rec.ring_chunks == 0 {
            return None;
        }
        self.report.recovered = Some(rec);
        Some(out)
    }

    /// Reads the preamble and the header chunk from `src`; `path` names it in messages.
    pub fn new(src: R, path: &str, opts: ReadOptions) -> Result<Self> {
        let zstd = Dctx::take().map_err(|source| Error::Io { path: path.into(), error: source })?;
        let mut r = Reader {
            src,
            path: path.to_owned(),
            opts,
            version: (0, 0),
            header: None,
            pos: 0,
            next_seq: 0,
            done: false,
            stored: Vec::new(),
            raw: Vec::new(),
            events: Vec::new(),
            decoder: Default::default(),
            zstd,
            report: Report::default(),
            bases: HashMap::new(),
            file: None,
            ring: None,
            alone: false,
            recovery: None,
            seen: Seen::default(),
        };
        let mut pre = [0u8; 16];
        let got = r.read_full(&mut pre)?;
        if got == 0 {
            return Err(Error::Truncated { path: r.path, offset: 0, what: "the file is empty".into() });
        }
        let magic_len = got.min(8);
        if pre[..magic_len] != MAGIC[..magic_len] || got < 8 {
            if pre[..magic_len] == MAGIC[..magic_len] {
                return Err(r.truncated(got as u64, "the file ends inside the magic"));
            }
            return Err(Error::NotOcular { path: r.path, found: hex(&pre[..magic_len]), expected: hex(&MAGIC) });
        }
        if got < 16 {
            return Err(r.truncated(got as u64, "the file ends inside the 16-byte preamble"));
        }
        let pre = Preamble::read_from_bytes(&pre).expect("16 bytes");
        r.version = (pre.major.get(), pre.minor.get());
        if r.version.0 == 0 {
            return Err(r.corrupt(8, "format major version 0 does not exist".into()));
        }
        if r.version.0 > MAJOR {
            return Err(Error::UnsupportedVersion {
                path: r.path,
                major: r.version.0,
                minor: r.version.1,
                supported_major: MAJOR,
            });
        }
        r.pos = 16;
        r.report.bytes = 16;
        // The header chunk is never salvaged: without it no event can be interpreted.
        let h = match r.attempt()? {
            Attempt::Ok(h) => h,
            Attempt::Eof => return Err(r.truncated(16, "the file ends before the header chunk")),
            Attempt::Partial(n) => {
                return Err(r.truncated(16 + n, "the file ends inside the header chunk"));
            }
            Attempt::Bad(why) => return Err(r.corrupt(16, why)),
        };
        if h.kind.get() != kind::HEADER || h.seq.get() != 0 {
            return Err(r.corrupt(
                16,
                format!("first chunk is {} seq {}, expected HEADER seq 0", kind::name(h.kind.get()), h.seq.get()),
            ));
        }
        r.unpack(&h, 16)?;
        // A pass without code objects has no use for the opcode tables.
        let header: Header = if r.opts.skip_code {
            Header::without_opcodes(&r.raw)
                .map(|(h, _)| h)
                .map_err(|e| r.corrupt(16, format!("Header record does not decode: {e}")))?
        } else {
            r.decode_one(16)?
        };
        r.report.clock = Some((header.start_ticks, header.ticks_per_second));
        r.header = Some(header);
        r.accept(&h);
        Ok(r)
    }

    /// The file header.
    pub fn header(&self) -> &Header {
        self.header.as_ref().expect("set by new")
    }

    /// The format version `(major, minor)` the file declares.
    pub fn version(&self) -> (u16, u16) {
        self.version
    }

    /// The name used in messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What was read, skipped and found missing so far.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// The next chunk, or `None` at the end of the data. After `None` because of a partial chunk at the end,
    /// a later call tries again from that chunk, so a file still being written can be followed.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk<'_>>> {
        loop {
            let offset = self.pos;
            if self.done {
                let mut probe = [0u8; 1];
                if self.read_full(&mut probe)? > 0 {
                    let end = self.src.seek(SeekFrom::End(0)).map_err(|e| self.io(e))?;
                    let why = format!("{} bytes after the trailer", end - offset);
                    if !self.opts.salvage {
                        return Err(self.corrupt(offset, why));
                    }
                    self.report.damage.push(Damage { offset, len: end - offset, reason: why });
                    self.pos = end;
                }
                return Ok(None);
            }
            match self.attempt()? {
                Attempt::Eof => return self.recover_next(),
                Attempt::Partial(n) => {
                    // A length that runs to the end of the data is a truncated tail, unless a whole valid
                    // chunk follows: then the length itself is damaged, or the file is still being written
                    // and its writer added the rest of this chunk and the next since this one was read (a
                    // run's child finishing its trace while the run is read). Read again, it is whole.
                    if let Some(found) = self.resync(offset + 1)? {
                        self.seek(offset)?;
                        if let Attempt::Ok(_) = self.attempt()? {
                            self.seek(offset)?;
                            continue;
                        }
                        self.seek(found)?;
                        let why = format!("chunk length runs past a valid chunk at offset {found}");
                        if !self.opts.salvage {
                            return Err(self.corrupt(offset, why));
                        }
                        self.report.damage.push(Damage { offset, len: found - offset, reason: why });
                        continue;
                    }
                    self.report.truncated = Some((offset, n));
                    self.seek(offset)?;
                    return self.recover_next();
                }
                Attempt::Bad(why) => {
                    if !self.opts.salvage {
                        return Err(self.corrupt(offset, why));
                    }
                    let end = match self.resync(offset + 1)? {
                        Some(found) => found,
                        None => self.src.seek(SeekFrom::End(0)).map_err(|e| self.io(e))?,
                    };
                    self.report.damage.push(Damage { offset, len: end - offset, reason: why });
                    self.seek(end)?;
                    continue;
                }
                Attempt::Ok(h) => {
                    let seq = h.seq.get();
                    if seq != self.next_seq {
                        let why = format!("chunk sequence number {seq} where {} was expected", self.next_seq);
                        if !self.opts.salvage {
                            return Err(self.corrupt(offset, why));
                        }
                        if seq > self.next_seq {
                            let missing = seq - self.next_seq;
                            self.report.damage.push(Damage {
                                offset,
                                len: 0,
                                reason: format!("{missing} chunks missing before this one ({why})"),
                            });
                        }
                    }
                    return self.decode_body(h, offset, false).map(Some);
                }
            }
        }
    }

    fn decode_body(&mut self, h: ChunkHeader, offset: u64, recovered: bool) -> Result<Chunk<'_>> {
        let info = ChunkInfo {
            offset,
            kind: h.kind.get(),
            codec: h.codec,
            seq: h.seq.get(),
            thread_id: h.thread_id.get(),
            first_ts: h.first_ts.get(),
            last_ts: h.last_ts.get(),
            count: h.count.get(),
            stored_len: h.stored_len.get(),
            raw_len: h.raw_len.get(),
        };
        if recovered {
            // After the file's end: counted, but no byte of the file.
            self.next_seq = h.seq.get() + 1;
            self.report.chunks += 1;
        } else {
            self.accept(&h);
        }
        let known_kind = matches!(
            info.kind,
            kind::HEADER
                | kind::EVENTS
                | kind::CODE
                | kind::THREAD
                | kind::LOST
                | kind::SNAPSHOT
                | kind::TRAILER
                | kind::CALIBRATION
                | kind::RING
                | kind::DROPPED
                | kind::COUNTERS
                | kind::PROCESS
                | kind::CFUNC
        );
        let known_codec = matches!(info.codec & 0x0f, codec::NONE | codec::ZSTD)
            && match info.codec >> 4 {
                0 => true,
                1 | 2 => info.kind == kind::EVENTS,
                _ => false,
            };
        if !known_kind || !known_codec {
            self.report.unknown_chunks += 1;
            let why = if known_kind {
                format!("{} chunk with unknown codec 0x{:02x}", kind::name(info.kind), info.codec)
            } else {
                format!("unknown chunk kind 0x{:04x}", info.kind)
            };
            return Ok(Chunk { info, body: Body::Skipped(why) });
        }
        if info.kind == kind::EVENTS {
            *self.report.thread_events.entry(info.thread_id).or_default() += info.count as u64;
        }
        if info.kind == kind::EVENTS && self.opts.skip_events {
            self.report.events += info.count as u64;
            return Ok(Chunk { info, body: Body::Events(&[]) });
        }
        if self.opts.skip_code && info.kind == kind::CODE {
            return Ok(Chunk { info, body: Body::Code(Vec::new()) });
        }
        if self.opts.skip_code && info.kind == kind::SNAPSHOT {
            return Ok(Chunk { info, body: Body::Snapshot(Vec::new()) });
        }
        let result = self.unpack(&h, offset).and_then(|()| self.body_of(&info));
        match result {
            Ok(body) => {
                // `body_of` leaves decoded events in `self.events` and returns a placeholder for them.
                let body = match body {
                    Body::Events(_) => {
                        self.report.events += self.events.len() as u64;
                        if let Some(e) = self.events.first() {
                            self.seen.firsts.insert((info.thread_id, e.ticks.get()));
                        }
                        Body::Events(&self.events)
                    }
                    Body::Code(objs) => {
                        self.seen.code.extend(objs.iter().map(|c| c.id));
                        Body::Code(objs)
                    }
                    Body::CFunctions(f) => {
                        self.seen.cfuncs.extend(f.iter().map(|c| c.id));
                        Body::CFunctions(f)
                    }
                    Body::Thread(t) => {
                        self.seen.threads.insert(t.thread_id);
                        Body::Thread(t)
                    }
                    other => other,
                };
                Ok(Chunk { info, body })
            }
            Err(e) if self.opts.salvage => {
                let why = e.to_string();
                self.report.damage.push(Damage {
                    offset,
                    len: CHUNK_HEADER_LEN as u64 + info.stored_len as u64,
                    reason: why.clone(),
                });
                Ok(Chunk { info, body: Body::Skipped(why) })
            }
            Err(e) => Err(e),
        }
    }

    fn body_of(&mut self, info: &ChunkInfo) -> Result<Body<'static>> {
        let offset = info.offset;
        Ok(match info.kind {
            kind::EVENTS => {
                let n = info.count as usize;
                if matches!(info.codec >> 4, 1 | 2) {
                    self.decoder
                        .decode(&self.raw, info.codec >> 4, n, info.first_ts, &mut self.events)
                        .map_err(|why| self.corrupt(offset, format!("EVENTS payload: {why}")))?;
                } else {
                    let evs = <[RawEvent]>::ref_from_bytes(&self.raw).map_err(|_| {
                        self.corrupt(
                            offset,
                            format!("raw EVENTS payload of {} bytes is not {n} records", self.raw.len()),
                        )
                    })?;
                    if evs.len() != n {
                        return Err(self.corrupt(offset, format!("{} raw events where count says {n}", evs.len())));
                    }
                    self.events.clear();
                    self.events.extend_from_slice(evs);
                }
                if let (Some(first), Some(last)) = (self.events.first(), self.events.last()) {
                    if first.ticks.get() != info.first_ts || last.ticks.get() != info.last_ts {
                        return Err(self.corrupt(offset, "event timestamps disagree with the chunk header".into()));
                    }
                }
                Body::Events(&[])
            }
            kind::HEADER => {
                return Err(self.corrupt(offset, "a second HEADER chunk".into()));
            }
            kind::CODE => Body::Code(self.decode_code(info)?),
            kind::SNAPSHOT => {
                let mut snaps: Vec<CodeSnapshot> = self.decode_framed(info)?;
                if self.version.0 >= 2 {
                    // 2.0: stored XORed with the base bytecode (FORMAT.md 6.4).
                    for s in &mut snaps {
                        s.bytecode = crate::writer::xor(&s.bytecode, self.bases.get(&s.id));
                    }
                }
                Body::Snapshot(snaps)
            }
            kind::THREAD => Body::Thread(self.decode_one(offset)?),
            kind::LOST => {
                let lost: Lost = self.decode_one(offset)?;
                self.report.add_loss(&lost);
                Body::Lost(lost)
            }
            // 2026-11-21, format 1.1: CALIBRATION added. A 1.0 file has none; readers use the header's
            // single event_cost_ticks for every kind then.
            kind::CALIBRATION => Body::Calibration(self.decode_one(offset)?),
            kind::RING => {
                let r: RingInfo = self.decode_one(offset)?;
                self.ring = Some(r.path.clone());
                Body::Ring(r)
            }
            kind::DROPPED => {
                let d: Dropped = self.decode_one(offset)?;
                self.report.dropped.insert(d.thread_id, d.clone());
                Body::Dropped(d)
            }
            kind::COUNTERS => Body::Counters(self.decode_one(offset)?),
            kind::PROCESS => Body::Process(self.decode_one(offset)?),
            // 2026-11-25, format 2.7: CFUNC added, with CALL, C_RETURN and C_RAISE events (FORMAT.md 5.4).
            // Files before it have neither.
            kind::CFUNC => Body::CFunctions(self.decode_framed(info)?),
            kind::TRAILER => {
                let t: Trailer = self.decode_one(offset)?;
                self.done = true;
                // 2026-11-26: the counts are checked (FORMAT.md 6.5). A file with chunks removed and the rest
                // renumbered has no sequence gap; only the trailer tells.
                let m = Mismatch {
                    trailer_events: t.events,
                    read_events: self.report.events,
                    trailer_chunks: t.chunks,
                    // `accept` has counted the trailer itself.
                    read_chunks: self.report.chunks - 1,
                    trailer_lost: t.lost,
                    read_lost: self.report.lost,
                };
                let agree = m.trailer_events == m.read_events
                    && m.trailer_chunks == m.read_chunks
                    && m.trailer_lost == m.read_lost;
                self.report.mismatch = (!agree).then_some(m);
                self.report.trailer = Some(t.clone());
                Body::Trailer(t)
            }
            _ => unreachable!("filtered by decode_body"),
        })
    }

    /// Reads and checks the chunk at `self.pos`: header sanity, payload present, CRC.
    fn attempt(&mut self) -> Result<Attempt> {
        let mut hb = [0u8; CHUNK_HEADER_LEN];
        let got = self.read_full(&mut hb)?;
        if got == 0 {
            return Ok(Attempt::Eof);
        }
        if got < CHUNK_HEADER_LEN {
            return Ok(if hb[..got.min(4)] == SYNC[..got.min(4)] {
                Attempt::Partial(got as u64)
            } else {
                Attempt::Bad(format!("{got} stray bytes at the end"))
            });
        }
        let h = ChunkHeader::read_from_bytes(&hb).expect("56 bytes");
        if let Err(why) = h.sanity() {
            return Ok(Attempt::Bad(why));
        }
        let want = h.stored_len.get() as usize;
        self.stored.clear();
        // Grow with the data actually present, so a damaged length never allocates what is not there.
        self.stored.reserve(want.min(1 << 20));
        let got = (&mut self.src).take(want as u64).read_to_end(&mut self.stored).map_err(|e| self.io(e))?;
        if got < want {
            return Ok(Attempt::Partial((CHUNK_HEADER_LEN + got) as u64));
        }
        let crc = h.compute_crc(&self.stored);
        if crc != h.crc32.get() {
            return Ok(Attempt::Bad(format!("CRC mismatch: stored {:08x}, computed {crc:08x}", h.crc32.get())));
        }
        Ok(Attempt::Ok(h))
    }

    /// Scans from `from` for the next offset holding a whole, CRC-valid chunk; leaves the source there.
    fn resync(&mut self, from: u64) -> Result<Option<u64>> {
        let mut base = from;
        let mut window = vec![0u8; 64 << 10];
        loop {
            self.seek(base)?;
            let n = self.read_full(&mut window)?;
            if n < SYNC.len() {
                return Ok(None);
            }
            let mut i = 0;
            while let Some(p) = window[i..n].windows(4).position(|w| w == SYNC) {
                let cand = base + (i + p) as u64;
                self.seek(cand)?;
                if let Attempt::Ok(_) = self.attempt()? {
                    self.seek(cand)?;
                    return Ok(Some(cand));
                }
                i += p + 1;
                self.seek(base + n as u64)?;
            }
            // Keep the last 3 bytes: a marker may straddle the window boundary.
            base += (n - 3) as u64;
            if n < window.len() {
                return Ok(None);
            }
        }
    }

    /// Decompresses the stored payload into `self.raw`.
    fn unpack(&mut self, h: &ChunkHeader, offset: u64) -> Result<()> {
        let raw_len = h.raw_len.get() as usize;
        match h.codec & 0x0f {
            codec::NONE => {
                std::mem::swap(&mut self.raw, &mut self.stored);
            }
            _ => {
                self.raw.clear();
                self.raw.reserve(raw_len);
                let n = self
                    .zstd
                    .get()
                    .decompress_to_buffer(&self.stored, &mut self.raw)
                    .map_err(|e| self.corrupt(offset, format!("zstd payload does not decompress: {e}")))?;
                if n != raw_len {
                    return Err(
                        self.corrupt(offset, format!("payload decompresses to {n} bytes, header says {raw_len}"))
                    );
                }
            }
        }
        Ok(())
    }

    fn decode_one<T: DeserializeOwned>(&self, offset: u64) -> Result<T> {
        // Trailing bytes are fields appended by a newer minor version: ignored (FORMAT.md 2).
        postcard::take_from_bytes::<T>(&self.raw).map(|(v, _rest)| v).map_err(|e| {
            self.corrupt(
                offset,
                format!(
                    "{} record does not decode: {e}",
                    std::any::type_name::<T>().rsplit("::").next().unwrap_or("?")
                ),
            )
        })
    }

    /// CODE records: 2.0 stores `co_linetable`, decoded here into positions; 1.x stored the positions.
    fn decode_code(&mut self, info: &ChunkInfo) -> Result<Vec<CodeObject>> {
        if self.version.0 < 2 {
            let v1: Vec<CodeRecord<Vec<Position>>> = self.decode_framed(info)?;
            return Ok(v1
                .into_iter()
                .map(|c| {
                    let (mut code, positions) = c.split();
                    code.positions = positions;
                    code
                })
                .collect());
        }
        let v2: Vec<CodeRecord<serde_bytes::ByteBuf>> = self.decode_framed(info)?;
        let out: Vec<CodeObject> = v2.into_iter().map(code_from_v2).collect();
        for c in &out {
            self.bases.insert(c.id, c.bytecode.clone());
        }
        Ok(out)
    }

    fn decode_framed<T: DeserializeOwned>(&self, info: &ChunkInfo) -> Result<Vec<T>> {
        let mut rest: &[u8] = &self.raw;
        let mut out = Vec::new();
        for i in 0..info.count {
            let (frame, tail) = postcard::take_from_bytes::<&[u8]>(rest)
                .map_err(|e| self.corrupt(info.offset, format!("record {i} frame: {e}")))?;
            let (v, _appended) = postcard::take_from_bytes::<T>(frame)
                .map_err(|e| self.corrupt(info.offset, format!("record {i} does not decode: {e}")))?;
            out.push(v);
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(
                self.corrupt(info.offset, format!("{} bytes after the last of {} records", rest.len(), info.count))
            );
        }
        Ok(out)
    }

    fn accept(&mut self, h: &ChunkHeader) {
        self.pos += (CHUNK_HEADER_LEN + h.stored_len.get() as usize) as u64;
        self.next_seq = h.seq.get() + 1;
        self.report.chunks += 1;
        self.report.bytes = self.pos;
        self.report.truncated = None;
    }

    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.src.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(got)
    }

    fn seek(&mut self, to: u64) -> Result<()> {
        self.src.seek(SeekFrom::Start(to)).map_err(|e| self.io(e))?;
        self.pos = to;
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io { path: self.path.clone(), error: source }
    }

    fn corrupt(&self, offset: u64, what: String) -> Error {
        Error::Corrupt { path: self.path.clone(), offset, what }
    }

    fn truncated(&self, offset: u64, what: &str) -> Error {
        Error::Truncated { path: self.path.clone(), offset, what: what.into() }
    }
}
