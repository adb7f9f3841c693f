//! The ring file (RING.md): a recording's event buffers and metadata in a file-backed shared mapping, so
//! that what a recording had recorded survives the death of its process.
//!
//! [`RingWriter`] is the recording's side (it creates the file, hands out slots, appends metadata, and for
//! a flight recorder keeps the newest chunks in the chunk region); [`RingFile`] reads one, for recovery
//! after a crash ([`crate::Reader`] uses it for an `.ocl` file that has no trailer, or a ring file alone).

use crate::chunk::{ChunkHeader, CHUNK_HEADER_LEN};
use crate::event::RawEvent;
use crate::meta::Dropped;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use zerocopy::little_endian::{F64, U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `OCLRING\0`.
pub const MAGIC: [u8; 8] = *b"OCLRING\0";
/// Major version: a reader refuses another.
pub const MAJOR: u16 = 1;
/// Minor version.
pub const MINOR: u16 = 4;
/// The most bytes the trace's path may take in the header (RING.md 3.1, since 1.4).
const TRACE_MAX: usize = HEADER_SIZE as usize - std::mem::offset_of!(RingHeader, trace);
/// Header bytes.
pub const HEADER_SIZE: u64 = std::mem::size_of::<RingHeader>() as u64;
/// Bytes per slot table entry.
pub const ENTRY_SIZE: u64 = std::mem::size_of::<SlotEntry>() as u64;
/// Bytes per slot extension table entry (since 1.2).
pub const EXT_SIZE: u64 = std::mem::size_of::<SlotExt>() as u64;

/// The header (RING.md 3.1), field by field, little-endian. The fields a recording changes while it runs
/// (`state`, `meta_len`, `meta_dropped`, `chunks_*`) are stored atomically at their offsets (their `offset_of!`); the
/// others are written once, before the file is shared.
#[repr(C)]
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct RingHeader {
    /// `OCLRING\0`.
    pub magic: [u8; 8],
    /// 1: a reader refuses another major version.
    pub major: U16,
    /// A reader of 1.x reads any 1.y.
    pub minor: U16,
    /// 4096.
    pub header_size: U32,
    /// The recording process.
    pub pid: U32,
    /// [`file_state`]: 0 not yet initialized.
    pub state: U32,
    /// The `.ocl` header's `start_ticks`: ties the ring to its trace.
    pub start_ticks: U64,
    /// As in the `.ocl` header.
    pub ticks_per_second: F64,
    /// Events per slot.
    pub slot_events: U32,
    /// Entries in the slot table.
    pub max_slots: U32,
    /// 4096.
    pub slot_table_offset: U64,
    /// Where slot 0's events start.
    pub slots_offset: U64,
    /// Where the metadata region starts.
    pub meta_offset: U64,
    /// Its size in bytes.
    pub meta_capacity: U64,
    /// Bytes of complete records in it; only grows.
    pub meta_len: U64,
    /// Metadata records that did not fit.
    pub meta_dropped: U64,
    /// Since 1.1: where the chunk region starts; 0: none.
    pub chunks_offset: U64,
    /// Since 1.1: its size in bytes.
    pub chunks_capacity: U64,
    /// Since 1.1: the logical position just after the newest record.
    pub chunks_head: U64,
    /// Since 1.1: the logical position of the oldest whole record.
    pub chunks_tail: U64,
    /// Since 1.1: records overwritten so far.
    pub chunks_evicted: U64,
    /// Since 1.2: where the slot extension table starts; 0: none.
    pub slot_ext_offset: U64,
    /// Since 1.4: bytes of `trace`; 0: not named.
    pub trace_len: U32,
    /// Since 1.4: the trace's absolute path, then zeros.
    pub trace: [u8; 3948],
}

/// A slot table entry (RING.md 3.2).
#[repr(C)]
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct SlotEntry {
    /// Native id of the thread the slot belongs to (or belonged to).
    pub thread_id: U64,
    /// The ticks of the slot's first event.
    pub start_ticks: U64,
    /// [`state`].
    pub state: U32,
    /// Events in a full slot.
    pub len: U32,
    /// How many times the slot was taken.
    pub generation: U64,
}

/// A slot extension table entry (RING.md 3.2.1, since 1.2).
#[repr(C)]
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct SlotExt {
    /// Events the slot's thread recorded into its earlier slots.
    pub events_before: U64,
    /// Zero.
    pub reserved: U64,
}

/// A field's offset in its table, as the atomic accesses to a mapping take it.
macro_rules! at {
    ($t:ident, $f:ident) => {
        std::mem::offset_of!($t, $f) as u64
    };
}

// The layouts RING.md gives, offset by offset: a field moved by an edit fails the build.
const _: () = {
    assert!(HEADER_SIZE == 4096 && ENTRY_SIZE == 32 && EXT_SIZE == 16);
    assert!(at!(RingHeader, major) == 8 && at!(RingHeader, minor) == 10 && at!(RingHeader, header_size) == 12);
    assert!(at!(RingHeader, pid) == 16 && at!(RingHeader, state) == 20 && at!(RingHeader, start_ticks) == 24);
    assert!(at!(RingHeader, ticks_per_second) == 32 && at!(RingHeader, slot_events) == 40);
    assert!(at!(RingHeader, max_slots) == 44 && at!(RingHeader, slot_table_offset) == 48);
    assert!(at!(RingHeader, slots_offset) == 56 && at!(RingHeader, meta_offset) == 64);
    assert!(at!(RingHeader, meta_capacity) == 72 && at!(RingHeader, meta_len) == 80);
    assert!(at!(RingHeader, meta_dropped) == 88 && at!(RingHeader, chunks_offset) == 96);
    assert!(at!(RingHeader, chunks_capacity) == 104 && at!(RingHeader, chunks_head) == 112);
    assert!(at!(RingHeader, chunks_tail) == 120 && at!(RingHeader, chunks_evicted) == 128);
    assert!(at!(RingHeader, slot_ext_offset) == 136 && at!(RingHeader, trace_len) == 144);
    assert!(at!(RingHeader, trace) == 148);
    assert!(at!(SlotEntry, start_ticks) == 8 && at!(SlotEntry, state) == 16 && at!(SlotEntry, len) == 20);
    assert!(at!(SlotEntry, generation) == 24 && at!(SlotExt, reserved) == 8);
};
const EVENT_SIZE: u64 = std::mem::size_of::<RawEvent>() as u64;
/// A chunk record's head (RING.md 3.5).
pub const RECORD_HEAD: u64 = 24;
/// A chunk record's magic.
pub const RECORD_MAGIC: [u8; 4] = *b"OCRR";
const PAGE: u64 = 4096;

/// Slot states (RING.md 3.2).
pub mod state {
    /// Free.
    pub const FREE: u32 = 0;
    /// A thread appends to it.
    pub const FILLING: u32 = 1;
    /// Handed to the writer, not yet in the `.ocl` file.
    pub const FULL: u32 = 2;
}

/// Header `state` (RING.md 3.1).
pub mod file_state {
    /// The recording runs (or was killed).
    pub const RECORDING: u32 = 1;
    /// The recording ended cleanly; its `.ocl` file is complete.
    pub const ENDED: u32 = 2;
}

/// The sizes of a ring file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Events per slot.
    pub slot_events: u32,
    /// Slots.
    pub max_slots: u32,
    /// Bytes of the metadata region.
    pub meta_capacity: u64,
    /// Bytes of the chunk region (a flight recorder's ring, RING.md 3.5); 0: none.
    pub chunks_capacity: u64,
    /// Whether the slot extension table follows the slot table (since 1.2; every file this crate makes).
    pub slot_ext: bool,
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// (slots_offset, meta_offset, chunks_offset (0: none), file size).
    fn offsets(&self) -> Option<(u64, u64, u64, u64)> {
        let mut table_end = HEADER_SIZE.checked_add((self.max_slots as u64).checked_mul(ENTRY_SIZE)?)?;
        if self.slot_ext {
            table_end = table_end.checked_add((self.max_slots as u64).checked_mul(EXT_SIZE)?)?;
        }
        let slots_offset = round_up(table_end);
        let slots_len = (self.max_slots as u64).checked_mul(self.slot_events as u64)?.checked_mul(EVENT_SIZE)?;
        let meta_offset = round_up(slots_offset.checked_add(slots_len)?);
        let meta_end = meta_offset.checked_add(round_up(self.meta_capacity))?;
        if self.chunks_capacity == 0 {
            return Some((slots_offset, meta_offset, 0, meta_end));
        }
        if self.chunks_capacity % 8 != 0 {
            return None;
        }
        let size = meta_end.checked_add(round_up(self.chunks_capacity))?;
        Some((slots_offset, meta_offset, meta_end, size))
    }

    /// The smallest chunk region that holds any chunk of one slot's events: the largest a compressed
    /// columnar chunk of `slot_events` events can be (FORMAT.md 3.1), with its record head, rounded to 8.
    pub fn min_chunks_capacity(slot_events: u32) -> u64 {
        let raw = 10 + 41 * slot_events as u64;
        let stored = zstd::zstd_safe::compress_bound(raw as usize) as u64;
        (RECORD_HEAD + CHUNK_HEADER_LEN as u64 + stored.max(raw)).div_ceil(8) * 8
    }

    /// Where the slot extension table starts (0: none).
    fn ext_offset(&self) -> u64 {
        if self.slot_ext {
            HEADER_SIZE + self.max_slots as u64 * ENTRY_SIZE
        } else {
            0
        }
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_events as u64 * EVENT_SIZE
    }
}

/// The path of a ring file beside the `.ocl` file `ocl` (RING.md 2), where one goes when there is no
/// runtime directory.
pub fn path_for(ocl: &Path) -> PathBuf {
    let mut p = ocl.as_os_str().to_owned();
    p.push(".ring");
    PathBuf::from(p)
}

/// The user's directory for ring files (RING.md 2): `$XDG_RUNTIME_DIR/ocular`, else
/// `/dev/shm/ocular-UID`, created with mode 0700; `None` if neither can be had, or if the directory is not
/// the user's own (another user could read the rings in it).
#[cfg(unix)]
pub fn runtime_dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let candidates = [
        std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()).map(|d| PathBuf::from(d).join("ocular")),
        Some(PathBuf::from(format!("/dev/shm/ocular-{uid}"))),
    ];
    candidates.into_iter().flatten().find(|dir| {
        if dir.parent().map_or(true, |p| !p.is_dir()) {
            return false;
        }
        let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
        // Not a symlink, ours, and private.
        std::fs::symlink_metadata(dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0)
    })
}

/// No runtime directory off Unix.
#[cfg(not(unix))]
pub fn runtime_dir() -> Option<PathBuf> {
    None
}

/// The ring file for the `n`-th recording of process `pid` into `ocl`: in the runtime directory if there
/// is one (a memory file system: its pages cost what heap pages cost), else beside the trace. Two
/// recordings of one process never share a name (`n` differs), nor do two processes (`pid`).
pub fn path_for_recording(ocl: &Path, pid: u32, n: u64) -> PathBuf {
    match runtime_dir() {
        Some(dir) => {
            let name = ocl.file_name().map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
            dir.join(format!("{name}.{pid}-{n}.ring"))
        }
        None => path_for(ocl),
    }
}

/// Settles ring files in `dir` left by processes that are gone: those last written more than `age` ago,
/// and all but the `keep` newest (RING.md 2: a killed recording's ring stays for its trace to be read, in
/// memory, so their number is bounded). Settling one first completes its trace from it ([`settle`]); a ring
/// whose events could not be put in a trace is kept. Returns how many it removed.
pub fn sweep(dir: &Path, age: std::time::Duration, keep: usize) -> usize {
    sweep_unless(dir, age, keep, &|| false).unwrap_or(0)
}

/// The process id in a ring file's name as [`path_for_recording`] makes it (`NAME.PID-N.ring`), if it is
/// one of those.
fn pid_in_name(ring: &Path) -> Option<u32> {
    let name = ring.file_name()?.to_str()?.strip_suffix(".ring")?;
    let (pid, n) = name.rsplit_once('.')?.1.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// [`sweep`], given up (`None`) as soon as `give_up()` says so, checked before each ring is looked at or
/// settled (never in the middle of settling one): a recording that stops does not wait for the rings of
/// others, ~0.1 ms each to look at.
pub fn sweep_unless(dir: &Path, age: std::time::Duration, keep: usize, give_up: &dyn Fn() -> bool) -> Option<usize> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Some(0) };
    let mut dead: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for p in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "ring")) {
        if give_up() {
            return None;
        }
        // A ring is opened (its header mapped, its owner's start time read) only when its name does not
        // say that the process that made it is gone: ~0.1 ms against a few us.
        let gone = pid_in_name(&p).is_some_and(|pid| !crate::reader::process_alive(pid));
        if gone || RingFile::open(&p).is_ok_and(|r| !r.owner_alive()) {
            if let Some(when) = std::fs::metadata(&p).ok().and_then(|m| m.modified().ok()) {
                dead.push((when, p));
            }
        }
    }
    dead.sort_by_key(|d| std::cmp::Reverse(d.0));
    let mut removed = 0;
    for (i, (when, p)) in dead.iter().enumerate() {
        let old = when.elapsed().is_ok_and(|a| a > age);
        if i >= keep || old {
            if give_up() {
                return None;
            }
            if settle(p).is_ok() {
                removed += 1;
            }
        }
    }
    Some(removed)
}

/// What [`settle`] did with a dead recording's ring file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Its trace was completed from it (RING.md 4), and the ring removed.
    Completed(PathBuf),
    /// Its trace was gone or is another recording's now: the ring alone (RING.md 5) was written as a trace
    /// of its own at this path, and the ring removed.
    Written(PathBuf),
    /// Its trace already had everything (it ended cleanly): the ring was removed.
    Stale,
    /// A ring of a version before 1.4, which does not name its trace: removed, as those always were.
    Unnamed,
}

/// Where [`settle`] writes a dead recording's ring as a trace of its own when the directory of its trace is
/// gone or unwritable (a test's temporary directory, removed after the recording was killed):
/// `$XDG_DATA_HOME/ocular/recovered`, by default `~/.local/share/ocular/recovered`. On disk, not in memory
/// as rings are, so nothing is lost and the runtime directory does not grow without bound.
pub fn recovered_dir() -> Option<PathBuf> {
    let absolute = |d: std::ffi::OsString| Some(PathBuf::from(d)).filter(|p| p.is_absolute());
    std::env::var_os("XDG_DATA_HOME")
        .and_then(absolute)
        .or_else(|| std::env::var_os("HOME").and_then(absolute).map(|h| h.join(".local/share")))
        .map(|d| d.join("ocular").join("recovered"))
}

/// Puts what the ring file at `ring` holds of a dead recording into a trace, then removes the ring: its
/// trace (named in its header since 1.4) completed from it, or, if the trace is gone or belongs to another
/// recording now, a trace of its own beside where the trace was (`run.ocl.PID-N.recovered.ocl`), or in
/// [`recovered_dir`] if that directory is gone or unwritable. An error (nowhere to write, the disk is full)
/// leaves the ring where it was: it may hold the only copy of what the recording did.
pub fn settle(ring: &Path) -> crate::Result<Settled> {
    settle_to(ring, recovered_dir().as_deref())
}

/// As [`settle`], with `fallback` (made if missing) instead of [`recovered_dir`].
pub fn settle_to(ring: &Path, fallback: Option<&Path>) -> crate::Result<Settled> {
    let r = RingFile::open(ring)?;
    if r.owner_alive() {
        return Err(crate::Error::Corrupt {
            path: ring.display().to_string(),
            offset: 0,
            what: format!("its recording (pid {}) still runs", r.pid),
        });
    }
    let remove = |what: Settled| {
        std::fs::remove_file(ring)
            .map(|()| what)
            .map_err(|error| crate::Error::Io { path: ring.display().to_string(), error })
    };
    let Some(trace) = r.trace.clone() else { return remove(Settled::Unnamed) };
    if r.state == file_state::ENDED {
        return remove(Settled::Stale);
    }
    let (pid, start) = (r.pid, r.start_ticks);
    drop(r);
    // Its own trace: the same recording's header.
    let ours = crate::Reader::open_with(&trace, crate::ReadOptions { skip_events: true, ..Default::default() })
        .is_ok_and(|t| t.header().pid == pid && t.header().start_ticks == start);
    if ours {
        crate::complete::complete(&trace)?;
        let closed = crate::Reader::open_with(&trace, crate::ReadOptions::default()).is_ok_and(|mut t| {
            while let Ok(Some(_)) = t.next_chunk() {}
            t.report().trailer.is_some()
        });
        if !closed {
            return Err(crate::Error::Corrupt {
                path: trace.display().to_string(),
                offset: 0,
                what: format!("could not be completed from {}", ring.display()),
            });
        }
        return if ring.exists() { remove(Settled::Completed(trace)) } else { Ok(Settled::Completed(trace)) };
    }
    let name = ring.file_name().map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    let name = name.trim_end_matches(".ring");
    let beside = trace.parent().map(Path::to_path_buf);
    let mut first_error = None;
    for dir in [beside.as_deref(), fallback].into_iter().flatten() {
        if Some(dir) == fallback {
            let mut made = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut made, 0o700);
            let _ = made.recursive(true).create(dir);
        }
        // Never over an earlier recovered trace (a pid used again, a second sweep's).
        let own = (1..)
            .map(|i| match i {
                1 => dir.join(format!("{name}.recovered.ocl")),
                _ => dir.join(format!("{name}.recovered-{i}.ocl")),
            })
            .find(|p| !p.exists())
            .expect("some name is free");
        match crate::complete::complete_into(ring, &own) {
            Ok(_) if ring.exists() => return remove(Settled::Written(own)),
            Ok(_) => return Ok(Settled::Written(own)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| crate::Error::Corrupt {
        path: ring.display().to_string(),
        offset: 0,
        what: format!("its trace {} has no directory to write a recovered trace in", trace.display()),
    }))
}

/// The recording's side of a ring file.
#[derive(Debug)]
pub struct RingWriter {
    /// Given back on a thread of its own when the ring is dropped (see its `Drop`).
    map: std::mem::ManuallyDrop<memmap2::MmapRaw>,
    /// `None` for a ring in anonymous memory (a flight recorder without a ring file).
    file: Option<File>,
    path: PathBuf,
    layout: Layout,
    slots_offset: u64,
    meta_offset: u64,
    chunks_offset: u64,
    /// Serializes metadata appends (each is a reserve, a copy, then a store of `meta_len`).
    /// Held while appending a metadata record; the end of the disk space reserved for them so far.
    meta: Mutex<u64>,
    /// The chunk region's records, as the writer knows them (RING.md 3.5).
    chunks: Mutex<ChunkRing>,
}

/// What the writer knows of the chunk region: where each record is, and per thread what was overwritten.
#[derive(Debug, Default)]
struct ChunkRing {
    records: VecDeque<RecordPlace>,
    head: u64,
    evicted: u64,
    threads: HashMap<u64, ThreadChunks>,
}

#[derive(Debug)]
struct RecordPlace {
    pos: u64,
    /// Padded to 8.
    size: u64,
    thread_id: u64,
    kind: u16,
    count: u32,
    last_ts: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct ThreadChunks {
    /// Events of the thread's records so far.
    events: u64,
    first_ticks: u64,
    dropped: u64,
    dropped_last: u64,
}

/// A chunk that cannot go into the chunk region: larger than the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    /// The record's size.
    pub size: u64,
    /// The region's.
    pub capacity: u64,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a chunk of {} bytes does not fit a ring of {} bytes", self.size, self.capacity)
    }
}

// SAFETY: the mapping is shared memory. Every field other threads may touch concurrently is read and
// written through atomics (header counters, slot table entries); slot events are written by the one
// thread that holds the slot, and read by the writer only after the slot was handed over (FULL, release),
// or, for a dump, up to a time all of whose events were stored before the dump was asked for.
unsafe impl Sync for RingWriter {}
// SAFETY: as above; the mapping is not tied to a thread.
unsafe impl Send for RingWriter {}

impl RingWriter {
    /// Creates `path` (mode 0600, replacing a file there), sized for `layout` (sparse: nothing is written
    /// but the header), and maps it.
    pub fn create(
        path: &Path,
        pid: u32,
        start_ticks: u64,
        ticks_per_second: f64,
        layout: Layout,
    ) -> std::io::Result<Self> {
        let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string());
        if layout.slot_events == 0 || layout.max_slots == 0 {
            return Err(bad("a ring file needs at least one slot of one event"));
        }
        let (_, _, _, size) = layout.offsets().ok_or_else(|| bad("ring file too large"))?;
        // A new file, never one in use: two recordings must not share slots. (A file left there by a
        // recording of a process that is gone, with this pid, is replaced.)
        if path.exists() && RingFile::open(path).is_ok_and(|r| !r.owner_alive() || r.pid != pid) {
            let _ = std::fs::remove_file(path);
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let file = opts.open(path)?;
        // Nothing half made stays behind.
        let mapped = file.set_len(size).and_then(|()| memmap2::MmapOptions::new().len(size as usize).map_raw(&file));
        let map = match mapped {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Ok(Self::init(map, Some(file), path.to_owned(), pid, start_ticks, ticks_per_second, layout))
    }

    /// The same ring in anonymous memory: a flight recorder without a ring file (it does not outlive the
    /// process). Pages are taken only as they are written.
    pub fn anonymous(pid: u32, start_ticks: u64, ticks_per_second: f64, layout: Layout) -> std::io::Result<Self> {
        let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string());
        if layout.slot_events == 0 || layout.max_slots == 0 {
            return Err(bad("a ring needs at least one slot of one event"));
        }
        let (_, _, _, size) = layout.offsets().ok_or_else(|| bad("ring too large"))?;
        let map = memmap2::MmapOptions::new().len(size as usize).map_anon()?;
        Ok(Self::init(map.into(), None, PathBuf::new(), pid, start_ticks, ticks_per_second, layout))
    }

    fn init(
        map: memmap2::MmapRaw,
        file: Option<File>,
        path: PathBuf,
        pid: u32,
        start_ticks: u64,
        ticks_per_second: f64,
        layout: Layout,
    ) -> Self {
        let (slots_offset, meta_offset, chunks_offset, _) = layout.offsets().expect("checked by the caller");
        let w = RingWriter {
            map: std::mem::ManuallyDrop::new(map),
            file,
            path,
            layout,
            slots_offset,
            meta_offset,
            chunks_offset,
            meta: Mutex::new(0),
            chunks: Mutex::new(ChunkRing::default()),
        };
        let mut h = RingHeader::new_zeroed();
        h.magic = MAGIC;
        h.major = MAJOR.into();
        h.minor = MINOR.into();
        h.header_size = (HEADER_SIZE as u32).into();
        h.pid = pid.into();
        h.start_ticks = start_ticks.into();
        h.ticks_per_second = ticks_per_second.into();
        h.slot_events = layout.slot_events.into();
        h.max_slots = layout.max_slots.into();
        h.slot_table_offset = HEADER_SIZE.into();
        h.slots_offset = slots_offset.into();
        h.meta_offset = meta_offset.into();
        h.meta_capacity = layout.meta_capacity.into();
        h.chunks_offset = chunks_offset.into();
        h.chunks_capacity = layout.chunks_capacity.into();
        h.slot_ext_offset = layout.ext_offset().into();
        // SAFETY: the header lies within the mapping (size >= HEADER_SIZE), which nothing else uses yet.
        unsafe { std::ptr::copy_nonoverlapping(h.as_bytes().as_ptr(), w.map.as_mut_ptr(), HEADER_SIZE as usize) };
        w.u32_at(at!(RingHeader, state)).store(file_state::RECORDING, Ordering::Release);
        w
    }

    /// Names the trace this ring completes (RING.md 3.1, since 1.4): an absolute path, so that whoever
    /// finds the ring after the recording's death can complete the trace from it. A path longer than the
    /// header's room is not written (the ring is then settled as a 1.3 one).
    pub fn set_trace(&self, trace: &Path) {
        #[cfg(unix)]
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(trace.as_os_str()).to_vec();
        #[cfg(not(unix))]
        let bytes = trace.to_string_lossy().into_owned().into_bytes();
        if bytes.is_empty() || bytes.len() > TRACE_MAX {
            return;
        }
        // SAFETY: the header lies within the mapping; the recording writes these bytes once, before any
        // reader can have a reason to read them (they are read after the recording's death).
        let h = unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr(), HEADER_SIZE as usize) };
        let trace_at = at!(RingHeader, trace) as usize;
        h[trace_at..trace_at + bytes.len()].copy_from_slice(&bytes);
        let len_at = at!(RingHeader, trace_len) as usize;
        h[len_at..len_at + 4].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    }

    /// The file (empty for an anonymous ring).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the ring is a file (it outlives the process) rather than anonymous memory.
    pub fn is_file(&self) -> bool {
        self.file.is_some()
    }

    /// The sizes.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn u32_at(&self, off: u64) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= self.map.len() as u64);
        // SAFETY: in bounds and 4-aligned (the mapping is page-aligned); the mapping lives as long as self.
        unsafe { &*(self.map.as_mut_ptr().add(off as usize) as *const AtomicU32) }
    }

    fn u64_at(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.map.len() as u64);
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the mapping lives as long as self.
        unsafe { &*(self.map.as_mut_ptr().add(off as usize) as *const AtomicU64) }
    }

    fn entry(&self, slot: u32) -> u64 {
        assert!(slot < self.layout.max_slots, "slot {slot} out of {}", self.layout.max_slots);
        HEADER_SIZE + slot as u64 * ENTRY_SIZE
    }

    /// Slot `slot`'s events, its pages allocated and mapped writable first: a store into a sparse page of
    /// a full file system would kill the process with SIGBUS; this returns the error instead, and the
    /// thread that fills the slot takes no page fault (Linux 5.14+ `MADV_POPULATE_WRITE`, which costs
    /// what faulting heap pages in costs; elsewhere, `posix_fallocate` and writing the pages).
    pub fn prepare_slot(&self, slot: u32) -> std::io::Result<*mut RawEvent> {
        self.prepare_slot_unless(slot, &|| false).map(|p| p.expect("never given up"))
    }

    /// [`prepare_slot`](Self::prepare_slot), given up (`Ok(None)`) as soon as `give_up()` says so, checked
    /// every quarter of the slot (64-256 KiB): a spare slot made ahead of need is not worth a stop's wait (a
    /// 1.5 MiB slot takes ~0.9 ms to fault in; a test's 192 KiB one, which the pytest plugin's recordings
    /// make for every test, ~0.25 ms). A slot given up must not be used: its pages may be unallocated.
    pub fn prepare_slot_unless(&self, slot: u32, give_up: &dyn Fn() -> bool) -> std::io::Result<Option<*mut RawEvent>> {
        self.prepare_slot_part(slot, 0, self.layout.slot_bytes() as usize, give_up)
    }

    /// [`prepare_slot_unless`](Self::prepare_slot_unless) for the slot's bytes `from..to` only (a slot
    /// prepared in parts: its first events before the rest); `from` a multiple of the page size. The
    /// events returned are the slot's first; only those in the prepared bytes may be written.
    pub fn prepare_slot_part(
        &self,
        slot: u32,
        from: usize,
        to: usize,
        give_up: &dyn Fn() -> bool,
    ) -> std::io::Result<Option<*mut RawEvent>> {
        let _ = self.entry(slot);
        let slot_off = self.slots_offset + slot as u64 * self.layout.slot_bytes();
        let to = to.min(self.layout.slot_bytes() as usize);
        let from = from.min(to);
        let off = slot_off + from as u64;
        let len = to - from;
        // Steps of whole pages: the advice takes page-aligned ranges (a slot whose size is not whole pages
        // is not page-aligned either; the advice refuses it, and it is made below instead).
        let step = (self.layout.slot_bytes() as usize / 4).clamp(64 << 10, 256 << 10) & !4095;
        // SAFETY: the slot lies within the mapping (checked by `entry` and the layout), 8-aligned.
        let ptr = unsafe { self.map.as_mut_ptr().add(slot_off as usize) };
        #[cfg(target_os = "linux")]
        {
            let mut done = 0;
            while done < len {
                if give_up() {
                    return Ok(None);
                }
                let n = step.min(len - done);
                match self.map.advise_range(memmap2::Advice::PopulateWrite, off as usize + done, n) {
                    Ok(()) => done += n,
                    // Kernels before 5.14 do not know the advice; anything else is a real error (no space).
                    Err(e) if e.raw_os_error() != Some(libc::EINVAL) => return Err(e),
                    Err(_) => break,
                }
            }
            if done == len {
                return Ok(Some(ptr as *mut RawEvent));
            }
        }
        if let Some(file) = &self.file {
            reserve(file, off, len as u64)?;
        }
        // SAFETY: as above; these bytes of the slot are not in use yet (they are being prepared), so nothing
        // else writes them.
        unsafe { std::ptr::write_bytes(ptr.add(from), 0, len) };
        Ok(Some(ptr as *mut RawEvent))
    }

    /// Slot `slot`'s first event, without preparing it (it was prepared before): for tests that write
    /// slots as a recording thread does.
    #[doc(hidden)]
    pub fn prepare_slot_ptr(&self, slot: u32) -> *mut RawEvent {
        let _ = self.entry(slot);
        // SAFETY: within the mapping (checked by `entry` and the layout).
        unsafe {
            self.map.as_mut_ptr().add((self.slots_offset + slot as u64 * self.layout.slot_bytes()) as usize)
                as *mut RawEvent
        }
    }

    /// A thread took `slot`: its first event will be at or after `start_ticks`, and is the thread's
    /// `events_before`-th (from 0).
    pub fn filling(&self, slot: u32, thread_id: u64, start_ticks: u64, events_before: u64) {
        let e = self.entry(slot);
        if self.layout.slot_ext {
            self.u64_at(self.layout.ext_offset() + slot as u64 * EXT_SIZE + at!(SlotExt, events_before))
                .store(events_before, Ordering::Release);
        }
        self.u64_at(e + at!(SlotEntry, thread_id)).store(thread_id, Ordering::Release);
        self.u64_at(e + at!(SlotEntry, start_ticks)).store(start_ticks, Ordering::Release);
        self.u32_at(e + at!(SlotEntry, len)).store(0, Ordering::Release);
        self.u64_at(e + at!(SlotEntry, generation)).fetch_add(1, Ordering::AcqRel);
        self.u32_at(e + at!(SlotEntry, state)).store(state::FILLING, Ordering::Release);
    }

    /// The thread handed `slot`, with `len` events, to the writer.
    pub fn full(&self, slot: u32, len: u32) {
        let e = self.entry(slot);
        self.u32_at(e + at!(SlotEntry, len)).store(len, Ordering::Release);
        self.u32_at(e + at!(SlotEntry, state)).store(state::FULL, Ordering::Release);
    }

    /// The writer wrote `slot`'s events into the `.ocl` file (and handed them to the kernel), or into the
    /// chunk region.
    pub fn free(&self, slot: u32) {
        let e = self.entry(slot);
        // `thread_id` stays (RING.md 3.2, since 1.2): a reader following the recording reads a freed
        // slot's events until the slot is taken again.
        self.u32_at(e + at!(SlotEntry, state)).store(state::FREE, Ordering::Release);
    }

    /// The slots that are filling or full, as a dump takes them: a full slot whole, a filling one up to its
    /// last event at or before `until` (RING.md 3.3). Call only from the one thread that frees slots (the
    /// writer), so that no slot read here is reused meanwhile; events at or before `until` must have been
    /// stored before it was taken (the GIL, or the channel that asked for the dump, orders them).
    pub fn pending(&self, until: u64) -> Vec<PendingSlot> {
        // SAFETY: the mapping covers the slot table and slots (checked at creation) and lives as long as
        // self; concurrent stores by recording threads are read with volatile loads and checked.
        unsafe { scan_slots(self.map.as_mut_ptr(), self.layout, self.slots_offset, until) }
    }

    /// Appends a metadata record (RING.md 3.4); false if it did not fit (then counted as dropped).
    pub fn append_meta(&self, kind: u16, payload: &[u8]) -> bool {
        let mut reserved = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        let len = self.u64_at(at!(RingHeader, meta_len)).load(Ordering::Acquire);
        let need = 6 + payload.len() as u64;
        if payload.len() > u32::MAX as usize - 2 || len + need > self.layout.meta_capacity {
            self.u64_at(at!(RingHeader, meta_dropped)).fetch_add(1, Ordering::AcqRel);
            return false;
        }
        let off = self.meta_offset + len;
        if let Some(f) = self.file.as_ref().filter(|_| off + need > *reserved) {
            // Reserved ahead, a step at a time: every thread's name is a record, and a thread per request
            // made a system call each for it. Near the region's end (or the disk's), the record alone.
            let from = off.max(*reserved);
            let step = (off + need).max(from + META_RESERVE_STEP).min(self.meta_offset + self.layout.meta_capacity);
            if reserve(f, from, step - from).is_ok() {
                *reserved = step;
            } else if reserve(f, from, off + need - from).is_ok() {
                *reserved = off + need;
            } else {
                self.u64_at(at!(RingHeader, meta_dropped)).fetch_add(1, Ordering::AcqRel);
                return false;
            }
        }
        // SAFETY: [off, off + need) lies in the metadata region (checked against its capacity), which only
        // this function writes, under the lock; readers read only below `meta_len`.
        unsafe {
            let p = self.map.as_mut_ptr().add(off as usize);
            let n = (payload.len() as u32 + 2).to_le_bytes();
            std::ptr::copy_nonoverlapping(n.as_ptr(), p, 4);
            std::ptr::copy_nonoverlapping(kind.to_le_bytes().as_ptr(), p.add(4), 2);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), p.add(6), payload.len());
        }
        self.u64_at(at!(RingHeader, meta_len)).store(len + need, Ordering::Release);
        true
    }

    /// Appends one whole `.ocl` chunk (`EVENTS` or `LOST`, its seq 0) to the chunk region (RING.md 3.5),
    /// overwriting the oldest records it needs the room of. Only one thread (the writer) calls this.
    pub fn push_chunk(&self, chunk: &[u8]) -> Result<(), TooLarge> {
        let cap = self.layout.chunks_capacity;
        let size = RECORD_HEAD + chunk.len() as u64;
        let padded = size.div_ceil(8) * 8;
        let Some(h) =
            chunk.get(..CHUNK_HEADER_LEN).and_then(|b| <ChunkHeader as zerocopy::FromBytes>::read_from_bytes(b).ok())
        else {
            return Err(TooLarge { size, capacity: cap });
        };
        if padded > cap {
            return Err(TooLarge { size, capacity: cap });
        }
        let mut ring = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        let head = ring.head;
        let phys = head % cap;
        let pad = if phys + padded > cap { cap - phys } else { 0 };
        let start = head + pad;
        let new_head = start + padded;
        let limit = new_head.saturating_sub(cap);
        while ring.records.front().is_some_and(|r| r.pos < limit) {
            let r = ring.records.pop_front().expect("checked");
            ring.evicted += 1;
            if r.kind == crate::chunk::kind::EVENTS {
                let t = ring.threads.entry(r.thread_id).or_default();
                t.dropped += r.count as u64;
                t.dropped_last = t.dropped_last.max(r.last_ts);
            }
        }
        let tail = ring.records.front().map_or(start, |r| r.pos);
        let ch = self.chunks_offset;
        self.u64_at(at!(RingHeader, chunks_tail)).store(tail, Ordering::Release);
        self.u64_at(at!(RingHeader, chunks_evicted)).store(ring.evicted, Ordering::Release);
        let is_events = h.kind.get() == crate::chunk::kind::EVENTS;
        let thread_id = h.thread_id.get();
        let t = ring.threads.entry(thread_id).or_default();
        let (before, first) = if is_events {
            if t.events == 0 {
                t.first_ticks = h.first_ts.get();
            }
            (t.events, t.first_ticks)
        } else {
            (0, 0)
        };
        if is_events {
            t.events += h.count.get() as u64;
        }
        // SAFETY: every write below lies in the chunk region ([ch, ch + cap) is in the mapping, checked at
        // creation): the pad at `phys` (8-aligned, so 4 bytes fit before the end), the record at
        // `start % cap` with `start % cap + padded <= cap`. Only this thread writes the region, and readers
        // read only whole records between tail and head, which these bytes are not part of.
        unsafe {
            let base = self.map.as_mut_ptr().add(ch as usize);
            if pad > 0 {
                std::ptr::write_bytes(base.add(phys as usize), 0, 4);
            }
            let p = base.add((start % cap) as usize);
            let mut head_bytes = [0u8; RECORD_HEAD as usize];
            head_bytes[0..4].copy_from_slice(&(size as u32).to_le_bytes());
            head_bytes[4..8].copy_from_slice(&RECORD_MAGIC);
            head_bytes[8..16].copy_from_slice(&before.to_le_bytes());
            head_bytes[16..24].copy_from_slice(&first.to_le_bytes());
            std::ptr::copy_nonoverlapping(head_bytes.as_ptr(), p, head_bytes.len());
            std::ptr::copy_nonoverlapping(chunk.as_ptr(), p.add(RECORD_HEAD as usize), chunk.len());
        }
        ring.records.push_back(RecordPlace {
            pos: start,
            size: padded,
            thread_id,
            kind: h.kind.get(),
            count: h.count.get(),
            last_ts: h.last_ts.get(),
        });
        ring.head = new_head;
        self.u64_at(at!(RingHeader, chunks_head)).store(new_head, Ordering::Release);
        Ok(())
    }

    /// Calls `f` with each chunk in the chunk region, oldest first. Only the thread that pushes chunks
    /// calls this (nothing overwrites them meanwhile).
    pub fn for_each_chunk(&self, mut f: impl FnMut(&[u8])) {
        let ring = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.layout.chunks_capacity;
        for r in &ring.records {
            // SAFETY: the record lies within the region (placed by push_chunk), whole, and not overwritten
            // while the lock is held by this, the only writing thread.
            let bytes = unsafe {
                let p = self.map.as_mut_ptr().add((self.chunks_offset + r.pos % cap) as usize);
                let size = u32::from_le_bytes(std::slice::from_raw_parts(p, 4).try_into().expect("4 bytes")) as u64;
                std::slice::from_raw_parts(p.add(RECORD_HEAD as usize), (size - RECORD_HEAD) as usize)
            };
            f(bytes);
        }
    }

    /// What the chunk region holds: (records, bytes of them, records overwritten so far).
    pub fn chunk_stats(&self) -> (usize, u64, u64) {
        let ring = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        (ring.records.len(), ring.records.iter().map(|r| r.size).sum(), ring.evicted)
    }

    /// Per thread, the events overwritten so far (FORMAT.md 6.8), by thread id.
    pub fn dropped(&self) -> Vec<Dropped> {
        let ring = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Dropped> = ring
            .threads
            .iter()
            .filter(|(_, t)| t.dropped > 0)
            .map(|(&thread_id, t)| Dropped {
                thread_id,
                events: t.dropped,
                first_ticks: t.first_ticks,
                last_ticks: t.dropped_last,
            })
            .collect();
        out.sort_by_key(|d| d.thread_id);
        out
    }

    /// The recording ended cleanly: marks the file so and removes it (the mapping stays valid for the
    /// buffers that still point into it, until the last reference goes).
    pub fn finish(&self) -> std::io::Result<()> {
        self.u32_at(at!(RingHeader, state)).store(file_state::ENDED, Ordering::Release);
        if self.file.is_none() {
            return Ok(());
        }
        std::fs::remove_file(&self.path)
    }
}

impl Drop for RingWriter {
    /// Unmapping a ring gives back the pages its slots were written in, one at a time (~1.5 us each on a
    /// memory file system: 4-6 ms for the few slots of a recording of millions of events), and the last
    /// reference to a removed ring file frees them: that is done on a thread of its own, beside the
    /// program, instead of in the stop that dropped the ring. If the process ends first, its exit frees
    /// them, as it would have; a fork waits for it ([`finish_unmapping`]).
    fn drop(&mut self) {
        // SAFETY: `self` is being dropped: nothing uses the mapping after this, and it is taken only here.
        let map = unsafe { std::mem::ManuallyDrop::take(&mut self.map) };
        let file = self.file.take();
        let free = move || {
            drop(map);
            drop(file);
            crate::exited::note_exit();
        };
        // A thread that cannot be made drops the closure, and with it the mapping, here.
        if let Ok(h) = std::thread::Builder::new().name("ocular-unmap".into()).spawn(free) {
            let mut pending = UNMAPPING.lock().unwrap_or_else(|e| e.into_inner());
            pending.retain(|h| !h.is_finished());
            pending.push(h);
        }
    }
}

/// The threads giving rings back (see `RingWriter`'s `Drop`) that may still run.
static UNMAPPING: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits until every ring dropped so far has been given back, and until Ocular's threads that ended are
/// gone from the kernel's list too ([`crate::exited`]). Before a fork: a thread still unmapping one, or
/// one ended but still counted, would make the process multi-threaded at the fork (Python warns of that
/// from 3.12) when it was not before the recording.
pub fn finish_unmapping() {
    let pending = std::mem::take(&mut *UNMAPPING.lock().unwrap_or_else(|e| e.into_inner()));
    for h in pending {
        let _ = h.join();
    }
    crate::exited::wait_gone(std::time::Duration::from_millis(20));
}

/// The slots of a mapping at `base` that are filling or full (see [`RingWriter::pending`]): per thread, in
/// the order their threads filled them.
///
/// # Safety
/// `base` points to a mapping of at least the layout's size, alive for the call.
unsafe fn scan_slots(base: *const u8, layout: Layout, slots_offset: u64, until: u64) -> Vec<PendingSlot> {
    // SAFETY: every offset below is within the layout, which the caller guarantees is mapped; entries are
    // 4/8-aligned (the mapping is page-aligned).
    unsafe {
        let u32_at = |o: u64| (*(base.add(o as usize) as *const AtomicU32)).load(Ordering::Acquire);
        let u64_at = |o: u64| (*(base.add(o as usize) as *const AtomicU64)).load(Ordering::Acquire);
        let mut out = Vec::new();
        for i in 0..layout.max_slots as u64 {
            let e = HEADER_SIZE + i * ENTRY_SIZE;
            let st = u32_at(e + at!(SlotEntry, state));
            if st != state::FILLING && st != state::FULL {
                continue;
            }
            let (thread_id, start_ticks, len) = (
                u64_at(e + at!(SlotEntry, thread_id)),
                u64_at(e + at!(SlotEntry, start_ticks)),
                u32_at(e + at!(SlotEntry, len)),
            );
            let slot = base.add((slots_offset + i * layout.slot_bytes()) as usize);
            let mut events = Vec::new();
            let mut last = start_ticks;
            for k in 0..layout.slot_events as usize {
                let rec =
                    std::ptr::read_volatile(slot.add(k * EVENT_SIZE as usize) as *const [u8; EVENT_SIZE as usize]);
                let Ok(ev) = <RawEvent as zerocopy::FromBytes>::read_from_bytes(&rec) else { break };
                if st == state::FULL {
                    if events.len() >= len as usize {
                        break;
                    }
                } else if ev.ticks.get() < last || ev.ticks.get() > until {
                    break;
                }
                last = ev.ticks.get();
                events.push(ev);
            }
            if !events.is_empty() {
                let events_before =
                    layout.slot_ext.then(|| u64_at(layout.ext_offset() + i * EXT_SIZE + at!(SlotExt, events_before)));
                out.push(PendingSlot { thread_id, start_ticks, full: st == state::FULL, events, events_before });
            }
        }
        out.sort_by_key(|s| (s.thread_id, s.start_ticks));
        out
    }
}

/// Bytes of the metadata region reserved on disk at a time ([`RingWriter::append_meta`]).
const META_RESERVE_STEP: u64 = 64 << 10;

/// Reserves disk space for `[off, off + len)` of `file`.
fn reserve(file: &File, off: u64, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a valid descriptor; posix_fallocate only reads its arguments.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), off as libc::off_t, len as libc::off_t) };
        // Some file systems (tmpfs before 3.5, some network ones) cannot: record without the guard.
        if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
            return Err(std::io::Error::from_raw_os_error(r));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, off, len);
    Ok(())
}

/// A slot a recording had not written into its `.ocl` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingSlot {
    /// The thread.
    pub thread_id: u64,
    /// Ticks of its first event.
    pub start_ticks: u64,
    /// Whether the thread had handed it to the writer (else it was still filling it).
    pub full: bool,
    /// Its events.
    pub events: Vec<RawEvent>,
    /// Events its thread recorded before its first (3.2.1), if the file has the slot extension table.
    pub events_before: Option<u64>,
}

/// A ring file, read (RING.md 4). Every offset and size is checked against the file: a damaged or foreign
/// file is an error, never a read out of bounds.
#[derive(Debug)]
pub struct RingFile {
    map: memmap2::Mmap,
    path: PathBuf,
    /// The recording process.
    pub pid: u32,
    /// The `.ocl` header's start ticks.
    pub start_ticks: u64,
    /// Header `state`.
    pub state: u32,
    /// The sizes.
    pub layout: Layout,
    slots_offset: u64,
    meta_offset: u64,
    chunks_offset: u64,
    chunks_head: u64,
    chunks_tail: u64,
    /// Metadata records that did not fit.
    pub meta_dropped: u64,
    /// Chunk records overwritten (a flight recorder's, since 1.1).
    pub chunks_evicted: u64,
    /// The trace it completes (since 1.4; `None` before, or when its path did not fit).
    pub trace: Option<PathBuf>,
}

impl RingFile {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> crate::Result<RingFile> {
        let name = path.display().to_string();
        let io = |error| crate::Error::Io { path: name.clone(), error };
        let bad = |what: String| crate::Error::Corrupt { path: name.clone(), offset: 0, what };
        let file = File::open(path).map_err(io)?;
        // SAFETY: read-only mapping; a recording may still be writing it, which the reads below tolerate
        // (they copy out what they read and check it).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        if map.len() < HEADER_SIZE as usize || map[0..8] != MAGIC {
            return Err(bad("not an Ocular ring file (no OCLRING magic)".into()));
        }
        // A copy: a recording may still be changing the header's counters.
        let (h, _) = RingHeader::read_from_prefix(&map[..]).expect("checked: at least HEADER_SIZE bytes");
        if h.major.get() != MAJOR {
            return Err(bad(format!(
                "ring file version {}.{}, this Ocular reads {MAJOR}.x",
                h.major.get(),
                h.minor.get()
            )));
        }
        // 1.0 files have zeros where 1.1 describes the chunk region: no region.
        let (chunks_offset, chunks_capacity) = (h.chunks_offset.get(), h.chunks_capacity.get());
        // 1.0 and 1.1 files have zeros where 1.2 places the slot extension table: none.
        let ext_offset = h.slot_ext_offset.get();
        let layout = Layout {
            slot_events: h.slot_events.get(),
            max_slots: h.max_slots.get(),
            meta_capacity: h.meta_capacity.get(),
            chunks_capacity: if chunks_offset == 0 { 0 } else { chunks_capacity },
            slot_ext: ext_offset != 0,
        };
        let (slots_offset, meta_offset) = (h.slots_offset.get(), h.meta_offset.get());
        let (head, tail) = (h.chunks_head.get(), h.chunks_tail.get());
        let fits = layout.offsets().is_some_and(|(s, m, c, size)| {
            s == slots_offset
                && layout.ext_offset() == ext_offset
                && m == meta_offset
                && c == chunks_offset
                && size <= map.len() as u64
                && h.slot_table_offset.get() == HEADER_SIZE
                && tail <= head
                && head - tail <= layout.chunks_capacity
        });
        if !fits || layout.slot_events == 0 {
            return Err(bad(format!(
                "ring file layout does not fit its {} bytes ({} slots of {} events, {} bytes of metadata)",
                map.len(),
                layout.max_slots,
                layout.slot_events,
                layout.meta_capacity
            )));
        }
        let trace_len = h.trace_len.get() as usize;
        let trace = (trace_len > 0 && trace_len <= TRACE_MAX).then(|| {
            let bytes = &h.trace[..trace_len];
            #[cfg(unix)]
            let p = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes));
            #[cfg(not(unix))]
            let p = PathBuf::from(String::from_utf8_lossy(bytes).into_owned());
            p
        });
        Ok(RingFile {
            trace,
            pid: h.pid.get(),
            state: h.state.get(),
            start_ticks: h.start_ticks.get(),
            meta_dropped: h.meta_dropped.get(),
            chunks_evicted: h.chunks_evicted.get(),
            layout,
            slots_offset,
            meta_offset,
            chunks_offset,
            chunks_head: head,
            chunks_tail: tail,
            path: path.to_owned(),
            map,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn u64_at(&self, o: u64) -> u64 {
        u64::from_le_bytes(self.map[o as usize..o as usize + 8].try_into().expect("8 bytes"))
    }

    /// The metadata records (kind, payload), up to the first that does not fit the region.
    pub fn meta(&self) -> Vec<(u16, &[u8])> {
        let len = self.u64_at(at!(RingHeader, meta_len)).min(self.layout.meta_capacity);
        let region = &self.map[self.meta_offset as usize..(self.meta_offset + len) as usize];
        let mut out = Vec::new();
        let mut at = 0usize;
        while at + 6 <= region.len() {
            let n = u32::from_le_bytes(region[at..at + 4].try_into().expect("4 bytes")) as usize;
            if n < 2 || at + 4 + n > region.len() {
                break;
            }
            let kind = u16::from_le_bytes(region[at + 4..at + 6].try_into().expect("2 bytes"));
            out.push((kind, &region[at + 6..at + 4 + n]));
            at += 4 + n;
        }
        out
    }

    /// The slots that were filling or full: per thread, in the order their threads filled them.
    pub fn pending(&self) -> Vec<PendingSlot> {
        // SAFETY: `open` checked that the mapping covers the layout; the map lives as long as self.
        unsafe { scan_slots(self.map.as_ptr(), self.layout, self.slots_offset, u64::MAX) }
    }

    /// The metadata records from byte `*at` of the region up to its current length (the recording may be
    /// appending), copied; `*at` moves past them.
    pub fn meta_from(&self, at: &mut u64) -> Vec<(u16, Vec<u8>)> {
        let len = self.live_u64(80).min(self.layout.meta_capacity);
        let mut out = Vec::new();
        while *at + 6 <= len {
            let base = (self.meta_offset + *at) as usize;
            let n = u32::from_le_bytes(self.map[base..base + 4].try_into().expect("4 bytes")) as u64;
            if n < 2 || *at + 4 + n > len {
                break;
            }
            let kind = u16::from_le_bytes(self.map[base + 4..base + 6].try_into().expect("2 bytes"));
            out.push((kind, self.map[base + 6..base + 4 + n as usize].to_vec()));
            *at += 4 + n;
        }
        out
    }

    /// The recording's tick rate.
    pub fn ticks_per_second(&self) -> f64 {
        f64::from_le_bytes(self.map[32..40].try_into().expect("8 bytes"))
    }

    /// Whether the recording that made this ring still runs (not merely a process with its pid).
    pub fn owner_alive(&self) -> bool {
        crate::reader::recording_alive(self.pid, self.start_ticks, self.ticks_per_second())
    }

    pub(crate) fn slots_offset(&self) -> u64 {
        self.slots_offset
    }

    /// A pointer to `len` bytes at `off`, checked to lie in the mapping.
    pub(crate) fn map_ptr(&self, off: u64, len: usize) -> *const u8 {
        assert!(off as usize + len <= self.map.len(), "ring read at {off} past its {} bytes", self.map.len());
        // SAFETY: checked above.
        unsafe { self.map.as_ptr().add(off as usize) }
    }

    /// The `.ocl` header the recording stored in the metadata region (since 1.1), postcard.
    pub fn header_record(&self) -> Option<&[u8]> {
        self.meta().into_iter().find(|(k, _)| *k == crate::chunk::kind::HEADER).map(|(_, p)| p)
    }

    /// The chunk region's records from tail to head (RING.md 3.5), oldest first, and how many bytes of it
    /// were not whole records (damage: the walk stops there).
    pub fn chunks(&self) -> (Vec<RingRecord<'_>>, bool) {
        let mut out = Vec::new();
        let cap = self.layout.chunks_capacity;
        if self.chunks_offset == 0 || cap == 0 {
            return (out, false);
        }
        let region = &self.map[self.chunks_offset as usize..(self.chunks_offset + cap) as usize];
        let (head, mut p) = (self.chunks_head, self.chunks_tail);
        while p < head {
            let phys = (p % cap) as usize;
            let size = u32::from_le_bytes(region[phys..phys + 4].try_into().expect("4 bytes")) as u64;
            if size == 0 {
                p = (p / cap + 1) * cap;
                continue;
            }
            let whole = size >= RECORD_HEAD + CHUNK_HEADER_LEN as u64
                && phys as u64 + size <= cap
                && p + size <= head
                && region[phys + 4..phys + 8] == RECORD_MAGIC;
            if !whole {
                return (out, true);
            }
            let at = |o: usize| u64::from_le_bytes(region[phys + o..phys + o + 8].try_into().expect("8 bytes"));
            out.push(RingRecord {
                events_before: at(8),
                thread_first_ticks: at(16),
                chunk: &region[phys + RECORD_HEAD as usize..phys + size as usize],
            });
            p += size.div_ceil(8) * 8;
        }
        (out, false)
    }
}

/// One record of a ring file's chunk region (RING.md 3.5).
#[derive(Clone, Copy, Debug)]
pub struct RingRecord<'a> {
    /// Events of the chunk's thread in its records before this one.
    pub events_before: u64,
    /// Ticks of the thread's first recorded event.
    pub thread_first_ticks: u64,
    /// The whole `.ocl` chunk (header and payload, seq 0).
    pub chunk: &'a [u8],
}
