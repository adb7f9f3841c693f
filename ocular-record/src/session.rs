//! A recording session without Python in it: the buffer pool, the per-thread buffer the hot path appends
//! to, and the named writer thread that turns full buffers into chunks.
//!
//! ```text
//!   recording thread(s)                         ocular-writer thread
//!   ThreadBuffer::push ── full ──> channel ───> Writer::events (encode, zstd, write, flush)
//!        ^                                           │
//!        └──────────── Pool (free buffers) <─────────┘
//! ```
//!
//! The channel is unbounded, but every event buffer in it comes from the pool. Each recording thread may
//! always hold one buffer (the one it fills); besides those, at most `max_buffers` exist (full ones queued
//! for the writer, and spares), and small overflow buffers holding at most a quarter as many events
//! ([`Config::overflow`]), so memory is bounded by `(1.25 * max_buffers + threads) * buffer_events * 24`
//! bytes and grows with the threads that record, never with the disk's delay. When the writer falls so far
//! behind that the pool has nothing to give, a thread either drops its events (counted, and written as a
//! LOST record once buffers come back: the program never waits for the disk) or, with [`OnFull::Wait`],
//! waits for the writer to hand one back.

use crate::clock::ClockPoint;
use ocular_format::ring::{Layout as RingLayout, RingWriter};
use ocular_format::{
    Calibration, CodeObject, CodeSnapshot, EventKind, Header, Lost, RawEvent, RingInfo, ThreadInfo, Trailer, Writer,
    WriterOptions,
};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Bytes ahead of the next record that a store prefetches for writing ([`ThreadBuffer::push`]): four
/// lines. Measured on sqlglot's fixture in calls mode, side by side (program time, 10 pairs): 128 bytes
/// 0.985x, 256 0.967-0.981x, 512 0.974-0.982x, 1024 0.992x of no prefetch.
const PREFETCH_AHEAD: usize = 256;

/// Free buffers kept ready for the recording threads, allocated off their path.
const SPARES: usize = 3;

/// Bytes of a new ring slot that are made at first: a sixteenth of the slot (at least 64 KiB, whole pages),
/// its first 4,096 events at the default size. The rest is made when the buffer comes back full
/// ([`Pool::recycle`]): a thread per request records a few hundred events a thread, and while the writer
/// lagged the pool grew to its limit a slot at a time, each made whole (384 pages of a memory file system,
/// ~1 ms of the thread that found no spare, or of the writer making spares: a quarter of the writer's time
/// in a 3,000-thread program). A thread that fills the part gets the whole slot once it comes back.
fn first_part(layout: RingLayout) -> usize {
    let slot = layout.slot_bytes() as usize;
    (slot / 16).max(64 << 10).next_multiple_of(4096).min(slot)
}
/// Spares when a reader follows the recording (RING.md 6): slots are taken oldest first, so a freed slot
/// stays readable until this many others were filled after it (16 x 1.5 MiB).
const LIVE_SPARES: usize = 16;

/// A buffer of events, owned by one thread while it fills it: on the heap, or a slot of the recording's
/// ring file (RING.md), where what the thread writes survives the death of the process.
#[derive(Debug)]
pub struct Buffer {
    ptr: std::ptr::NonNull<RawEvent>,
    len: usize,
    /// The ring file's slot, or [`HEAP`].
    slot: u32,
    /// A small buffer given out beyond the pool's limit ([`Config::overflow`]): a slot's first part, or on
    /// the heap once the ring has no slot left.
    overflow: bool,
}

/// [`Buffer::slot`] of a buffer on the heap.
const HEAP: u32 = u32::MAX;

// SAFETY: a Buffer owns its memory (a heap allocation, or a ring slot no other Buffer points to); moving
// it to another thread moves that ownership.
unsafe impl Send for Buffer {}

impl Buffer {
    /// A heap buffer of `len` events, its pages written (so the allocating thread takes the page faults).
    pub fn heap(len: usize) -> Buffer {
        let b: Box<[RawEvent]> = vec![RawEvent::ZERO; len.max(1)].into_boxed_slice();
        let len = b.len();
        let ptr = std::ptr::NonNull::new(Box::into_raw(b) as *mut RawEvent).expect("a box is never null");
        Buffer { ptr, len, slot: HEAP, overflow: false }
    }

    /// The ring slot it is, if it is one.
    pub fn slot(&self) -> Option<u32> {
        (self.slot != HEAP).then_some(self.slot)
    }

    /// Whether it is a small buffer given out beyond the pool's limit ([`Config::overflow`]).
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }
}

impl std::ops::Deref for Buffer {
    type Target = [RawEvent];
    fn deref(&self) -> &[RawEvent] {
        // SAFETY: ptr points to len initialized events owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [RawEvent] {
        // SAFETY: as in deref; &mut self makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.slot == HEAP {
            // SAFETY: a heap buffer's ptr and len came from Box::into_raw of a boxed slice of len events.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
        }
        // A ring slot belongs to the mapping, which outlives it.
    }
}

/// What a recording thread does when the writer has fallen so far behind that no buffer is free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFull {
    /// Drop its events, count them, and record when (a LOST record): the program never waits.
    #[default]
    Drop,
    /// Wait for the writer to hand a buffer back: nothing is lost, the program runs at the disk's pace.
    Wait,
}

/// Sizes of the buffers.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Events per buffer (one full buffer is one EVENTS chunk).
    pub buffer_events: usize,
    /// Buffers that may exist besides the one each recording thread fills: full ones waiting for the
    /// writer, and spares. Beyond this, [`Config::on_full`] decides.
    pub max_buffers: usize,
    /// Drop or wait when no buffer is free.
    pub on_full: OnFull,
    /// Buffers in a ring file beside the trace (RING.md), so that a killed process loses nothing.
    pub ring: bool,
    /// A flight recorder: bytes of compressed chunks kept, the newest (RING.md 3.5); 0: record everything
    /// into the file.
    pub flight: u64,
    /// Followed live (RING.md 6): more spare buffers, so that a freed slot stays readable longer.
    pub live: bool,
    /// When no buffer is free, a thread that needs one gets a small one from the heap, a sixteenth of
    /// `buffer_events`, while such buffers hold less than a quarter of what `max_buffers` buffers do;
    /// only then does [`Config::on_full`] decide. Why: a thread per request submits its one buffer, mostly
    /// empty, when it ends, so a limit counted in buffers lets the writer fall only `max_buffers` short
    /// threads behind (64 x ~3,000 events, 17 ms of such a program) where one long thread gets 64 x
    /// 65,536 events; the small ones add 256 such threads. None when a small buffer would hold fewer than
    /// [`OVERFLOW_MIN_EVENTS`]. They are ring slots (a slot's first part, kept for the next overflow
    /// when given back) while the ring has slots left; beyond that they are on the heap, and a crash
    /// while the writer is that far behind loses what they hold, where without them the events were not
    /// recorded at all.
    pub overflow: bool,
}

/// The fewest events an overflow buffer ([`Config::overflow`]) holds; with smaller buffers there is none.
pub const OVERFLOW_MIN_EVENTS: usize = 256;

impl Config {
    /// Events of one overflow buffer ([`Config::overflow`]), and how many events such buffers may hold in
    /// all; `(0, 0)` when there are none.
    pub fn overflow_sizes(&self) -> (usize, usize) {
        let small = self.buffer_events / 16;
        if !self.overflow || small < OVERFLOW_MIN_EVENTS {
            return (0, 0);
        }
        (small, self.max_buffers.saturating_mul(self.buffer_events) / 4)
    }
}

/// Slots of a ring file beyond `max_buffers`, for the buffers threads hold; more threads than this record
/// into heap buffers, which a crash loses.
pub const RING_THREAD_SLOTS: u32 = 256;
/// Bytes of a ring file's metadata region (sparse: only what is written takes space).
pub const RING_META: u64 = 64 << 20;
/// How long the ring file of a killed recording is kept (RING.md 2).
pub const RING_KEEP: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// How many ring files of killed recordings are kept (the newest).
pub const RING_KEEP_FILES: usize = 8;

/// Whether this process has swept the runtime directory's rings of dead recordings (at its first recording).
static SWEPT: AtomicBool = AtomicBool::new(false);

impl Default for Config {
    fn default() -> Self {
        // 64 Ki events = 1.5 MiB per buffer, larger than a core's L2, so a buffer the writer reads does not
        // bounce between the two cores' caches (measured: BENCHMARKS.md); 64 buffers = 96 MiB besides the
        // threads' own, and 24 MiB of overflow buffers, reached only if the writer cannot keep up.
        Config {
            buffer_events: 64 * 1024,
            max_buffers: 64,
            on_full: OnFull::Drop,
            ring: true,
            flight: 0,
            live: false,
            overflow: true,
        }
    }
}

/// Free buffers, and how many exist.
#[derive(Debug)]
pub struct Pool {
    /// Oldest first: a freed ring slot keeps its events until it is taken again, and a reader following
    /// the recording (RING.md 6) gets as long as possible to read them.
    free: Mutex<std::collections::VecDeque<Buffer>>,
    /// The ring file whose slots buffers are, while it has slots left.
    ring: Option<Arc<RingWriter>>,
    /// Slots of the ring handed out so far.
    slots: AtomicUsize,
    /// Signalled when a buffer is given back (for threads that wait, [`OnFull::Wait`]).
    returned: Condvar,
    allocated: AtomicUsize,
    /// Buffers a recording thread is filling: each thread may hold one beyond `max_buffers`.
    held: AtomicUsize,
    /// Events the overflow buffers given out can hold ([`Config::overflow`]).
    overflow: AtomicUsize,
    /// Overflow buffers in ring slots, given back: kept for the next, oldest first (a freed slot stays
    /// readable to a live reader for as long as possible).
    overflow_free: Mutex<std::collections::VecDeque<Buffer>>,
    /// The recording is stopping: buffers given back are not replaced by new spares.
    closing: std::sync::atomic::AtomicBool,
    cfg: Config,
}

impl Pool {
    /// An empty pool that will allocate buffers on demand: one for each thread that fills one, and up to
    /// `cfg.max_buffers` more.
    pub fn new(cfg: Config) -> Self {
        Pool {
            free: Mutex::new(std::collections::VecDeque::new()),
            ring: None,
            slots: AtomicUsize::new(0),
            returned: Condvar::new(),
            allocated: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            overflow: AtomicUsize::new(0),
            overflow_free: Mutex::new(std::collections::VecDeque::new()),
            closing: std::sync::atomic::AtomicBool::new(false),
            cfg,
        }
    }

    /// The recording is stopping: from now on a buffer given back is not replaced by new spares. The last
    /// buffers of a short recording otherwise had the writer make three ring slots (~0.5 ms each, the
    /// pages of a memory file system) that nothing would fill, while `stop()` waited for it.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// A free buffer, allocating one if the limit allows; `None` when all are in flight.
    pub fn take(&self) -> Option<Buffer> {
        if let Some(b) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop_front() {
            return Some(b);
        }
        self.allocate(false)
    }

    /// A buffer for a recording thread that holds none, to fill until it gives it back with
    /// [`Pool::release`]. The thread's own buffer does not count against `max_buffers`, so any number of
    /// threads can record; with [`OnFull::Wait`] it waits (with the GIL: the writer needs none) until the
    /// writer gives one back, instead of returning `None`.
    pub fn take_held(&self) -> Option<Buffer> {
        self.held.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = self.take().or_else(|| self.take_overflow()) {
            return Some(b);
        }
        if self.cfg.on_full == OnFull::Wait {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(b) = free.pop_front() {
                    return Some(b);
                }
                // The timeout only guards against a writer that died without giving buffers back.
                let (f, timeout) = self
                    .returned
                    .wait_timeout(free, std::time::Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner());
                free = f;
                if timeout.timed_out() && free.is_empty() {
                    break;
                }
            }
        }
        self.held.fetch_sub(1, Ordering::Relaxed);
        None
    }

    /// A small buffer beyond the limit, if the overflow budget has room ([`Config::overflow`]): one given
    /// back before, else the first part of a new ring slot, else on the heap. In the ring, a kill loses none
    /// of its events: `Pool.terminate()` kills a process pool's workers just after their last task, when a
    /// busy worker's writer can still be tens of buffers behind.
    fn take_overflow(&self) -> Option<Buffer> {
        let (small, budget) = self.cfg.overflow_sizes();
        if small == 0 {
            return None;
        }
        if self.overflow.fetch_add(small, Ordering::Relaxed) + small > budget {
            self.overflow.fetch_sub(small, Ordering::Relaxed);
            return None;
        }
        if let Some(b) = self.overflow_free.lock().unwrap_or_else(|e| e.into_inner()).pop_front() {
            return Some(b);
        }
        if let Some(ring) = &self.ring {
            let slot = self.slots.fetch_add(1, Ordering::Relaxed);
            if slot < ring.layout().max_slots as usize {
                let bytes = (small * std::mem::size_of::<RawEvent>()).next_multiple_of(4096);
                if let Ok(Some(ptr)) = ring.prepare_slot_part(slot as u32, 0, bytes, &|| false) {
                    let ptr = std::ptr::NonNull::new(ptr).expect("a mapping is never at null");
                    let len = small.min(ring.layout().slot_events as usize);
                    return Some(Buffer { ptr, len, slot: slot as u32, overflow: true });
                }
            }
        }
        let mut b = Buffer::heap(small);
        b.overflow = true;
        Some(b)
    }

    /// Events the overflow buffers given out now can hold ([`Config::overflow`]).
    pub fn overflow_events(&self) -> usize {
        self.overflow.load(Ordering::Relaxed)
    }

    /// A recording thread gave back (submitted) the buffer it held.
    pub fn release(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }

    /// Buffers become slots of `ring` (while it has slots left).
    pub fn with_ring(mut self, ring: Arc<RingWriter>) -> Self {
        self.ring = Some(ring);
        self
    }

    /// A new buffer if the limit allows, its pages written so the allocating thread takes the page
    /// faults (calloc'd memory would fault later, on the recording thread, one fault per 170 events): a
    /// slot of the ring file if there is one left (and disk space for it), else on the heap.
    ///
    /// A spare (`spare`: made ahead of need by the writer) is given up when the recording starts stopping
    /// while its pages are being made: `None` then.
    fn allocate(&self, spare: bool) -> Option<Buffer> {
        let n = self.allocated.fetch_add(1, Ordering::Relaxed);
        if n >= self.cfg.max_buffers.saturating_add(self.held.load(Ordering::Relaxed)) {
            self.allocated.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if let Some(ring) = &self.ring {
            let slot = self.slots.fetch_add(1, Ordering::Relaxed);
            if slot < ring.layout().max_slots as usize {
                // Its pages allocated and mapped by the allocating thread, as a heap buffer's are below: its
                // first part only (`first_part`); the writer makes the rest if it comes back full.
                let closing = || spare && self.closing.load(Ordering::Relaxed);
                let bytes = first_part(ring.layout());
                match ring.prepare_slot_part(slot as u32, 0, bytes, &closing) {
                    Ok(Some(ptr)) => {
                        let len = (ring.layout().slot_events as usize).min(bytes / std::mem::size_of::<RawEvent>());
                        let ptr = std::ptr::NonNull::new(ptr).expect("a mapping is never at null");
                        return Some(Buffer { ptr, len, slot: slot as u32, overflow: false });
                    }
                    // Given up: the slot stays unused (a ring's reader skips a slot no thread took).
                    Ok(None) => {
                        self.allocated.fetch_sub(1, Ordering::Relaxed);
                        return None;
                    }
                    Err(_) => {}
                }
            }
        }
        Some(Buffer::heap(self.cfg.buffer_events))
    }

    /// Takes back a buffer the writer has written, and tops the spares up. Followed live, the spares come
    /// first: a freed slot goes behind them, readable until they have all been filled (RING.md 6); given
    /// back first, it was the next one taken when the spares had run out: two threads fill their first
    /// slots at about the same time, and the second took the first's freed slot at once (a test's reader
    /// missed 1,440 and 3,441 events in 2 runs of about 20, before it read that slot's last events).
    ///
    /// `full`: it came back full; a ring slot of which only the first part was made is then made whole
    /// (its thread records more than the part holds), unless the recording is stopping.
    pub fn recycle(&self, mut b: Buffer, full: bool) {
        if full {
            self.complete(&mut b);
        }
        if self.closing.load(Ordering::Relaxed) {
            self.give(b);
        } else if self.cfg.live {
            self.keep_spares(self.spares());
            self.give(b);
        } else {
            self.give(b);
            self.keep_spares(self.spares());
        }
    }

    /// Makes the rest of a ring slot of which only the first part was made (`allocate`), unless the
    /// recording is stopping; a buffer given up on stays at its first part, which is all it holds then.
    fn complete(&self, b: &mut Buffer) {
        let (Some(slot), Some(ring)) = (b.slot(), &self.ring) else { return };
        if b.is_overflow() {
            // It stays small: its room is counted in the overflow budget.
            return;
        }
        let full = ring.layout().slot_events as usize;
        if b.len >= full {
            return;
        }
        let closing = || self.closing.load(Ordering::Relaxed);
        let from = (b.len * std::mem::size_of::<RawEvent>()).next_multiple_of(4096);
        if let Ok(Some(_)) = ring.prepare_slot_part(slot, from, usize::MAX, &closing) {
            b.len = full;
        }
    }

    /// The first buffer, made before the recording starts by the thread that starts it: a ring slot's first
    /// part (`first_part`), so that the start does not wait for a whole slot's pages (a millisecond of every
    /// `ocular run`); the writer makes the rest once it comes back full.
    pub fn make_first(&self) {
        if let Some(b) = self.allocate(false) {
            self.give(b);
        }
    }

    /// One more free buffer, if the limit allows and the recording is not stopping.
    pub fn add_spare(&self) {
        if !self.closing.load(Ordering::Relaxed) {
            if let Some(b) = self.allocate(true) {
                self.give(b);
            }
        }
    }

    /// How many free buffers the writer keeps ready.
    pub fn spares(&self) -> usize {
        if self.cfg.live {
            LIVE_SPARES
        } else {
            SPARES
        }
    }

    /// The ring file, if buffers are its slots.
    pub fn ring(&self) -> Option<&RingWriter> {
        self.ring.as_deref()
    }

    /// Tops the free list up to `spares` buffers (within the limit), so the recording thread finds one
    /// ready instead of allocating; nothing once the recording is stopping. Called at start and by the
    /// writer thread.
    pub fn keep_spares(&self, spares: usize) {
        loop {
            if self.closing.load(Ordering::Relaxed) {
                return;
            }
            let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).len();
            if free >= spares {
                return;
            }
            match self.allocate(true) {
                Some(b) => self.give(b),
                None => return,
            }
        }
    }

    /// Returns a buffer for reuse; an overflow buffer's room goes back in the budget, and the buffer is
    /// kept for the next overflow if it is a ring slot, else freed.
    pub fn give(&self, b: Buffer) {
        if b.is_overflow() {
            self.overflow.fetch_sub(b.len, Ordering::Relaxed);
            if b.slot().is_some() {
                self.overflow_free.lock().unwrap_or_else(|e| e.into_inner()).push_back(b);
            }
            return;
        }
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push_back(b);
        if self.cfg.on_full == OnFull::Wait {
            self.returned.notify_one();
        }
    }

    /// Buffers allocated so far.
    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }
}

/// Where a [`ThreadBuffer`] sends full buffers and gets empty ones.
pub trait Sink {
    /// An empty buffer for thread `thread_id`, whose first event will be at `ticks`; `None` if none can
    /// be had now.
    fn take(&self, thread_id: u64, ticks: u64, events_before: u64) -> Option<Buffer>;
    /// The first `len` events of `buf`, from `thread_id`, are complete.
    fn submit(&self, thread_id: u64, buf: Buffer, len: usize);
    /// As [`Sink::submit`], for the last buffer of a thread that ends: the sink may hold it back for a
    /// while, to hand several over at once.
    fn submit_last(&self, thread_id: u64, buf: Buffer, len: usize) {
        self.submit(thread_id, buf, len)
    }
    /// Events were dropped.
    fn lost(&self, lost: Lost);
}

/// Dropped events not yet reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LostRun {
    /// How many.
    pub count: u64,
    /// Ticks of the first.
    pub first: u64,
    /// Ticks of the last.
    pub last: u64,
}

/// The buffer one thread appends to. Its `push` is the whole of the recording hot path after the
/// callback has read its arguments: a compare, a 24-byte store and a pointer increment.
#[derive(Debug)]
pub struct ThreadBuffer {
    cur: *mut RawEvent,
    end: *mut RawEvent,
    buf: Option<Buffer>,
    /// Native thread id of the owner.
    pub thread_id: u64,
    lost: LostRun,
    /// Events pushed into buffers (not counting lost ones).
    pub pushed: u64,
    /// Getting a buffer that takes this many ticks or more is written as a `PAUSE` (FORMAT.md 5.6).
    pause_min: u64,
}

// SAFETY: the raw pointers point into `buf`, which the struct owns; moving the struct to another thread
// moves the buffer with it. (Recording threads only touch their own ThreadBuffer, under the GIL.)
unsafe impl Send for ThreadBuffer {}

impl ThreadBuffer {
    /// A thread buffer with no buffer yet: the first push takes one from the sink.
    pub fn new(thread_id: u64) -> Self {
        ThreadBuffer {
            cur: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            buf: None,
            thread_id,
            lost: LostRun::default(),
            pushed: 0,
            pause_min: u64::MAX,
        }
    }

    /// Getting a buffer that takes `ticks` or more is written into the new buffer as a `PAUSE` event, just
    /// before the event that found the old one full (FORMAT.md 5.6), so analyses take the recorder's time
    /// out of the program's. Off (`u64::MAX`) until set.
    pub fn with_pause_threshold(mut self, ticks: u64) -> Self {
        self.pause_min = ticks.max(1);
        self
    }

    /// Appends an event.
    #[inline(always)]
    pub fn push(&mut self, ev: RawEvent, sink: &dyn Sink) {
        if self.cur == self.end {
            self.refill(sink, ev.ticks.get());
            if self.cur == self.end {
                return;
            }
        }
        // SAFETY: cur < end, both within `buf`'s allocation (set by `install`).
        unsafe { self.store(&ev) }
    }

    /// Writes `ev` at `cur` and moves past it.
    ///
    /// # Safety
    /// `cur < end`, both within the installed buffer, so `cur` is valid for a write.
    #[inline(always)]
    unsafe fn store(&mut self, ev: &RawEvent) {
        // SAFETY: see the function's contract.
        unsafe {
            // The ticks last: in a ring slot, a record whose ticks are stored is whole (RING.md 3.3) if the
            // process dies in between. x86 stores become visible in program order; the fence keeps the
            // compiler from reordering them.
            let p = self.cur as *mut u8;
            // The line a few records on is asked for, to write: a buffer comes back from the writer, which
            // read it on the other core, and each line's first store otherwise waited for the line to be
            // fetched from there (a record in every 2.7 is a new line). A prefetch never faults, so past
            // the buffer's end it is harmless.
            #[cfg(target_arch = "x86_64")]
            std::arch::asm!(
                "prefetchw [{}]",
                in(reg) p.wrapping_add(PREFETCH_AHEAD),
                options(nostack, readonly, preserves_flags)
            );
            std::ptr::copy_nonoverlapping((ev as *const RawEvent as *const u8).add(8), p.add(8), 16);
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::Release);
            std::ptr::copy_nonoverlapping(ev as *const RawEvent as *const u8, p, 8);
            self.cur = self.cur.add(1);
        }
    }

    /// Events in the current buffer.
    pub fn len(&self) -> usize {
        match &self.buf {
            // SAFETY: cur was derived from the buffer's base pointer and never passes its end.
            Some(b) => unsafe { self.cur.offset_from(b.as_ptr()) as usize },
            None => 0,
        }
    }

    /// Whether the current buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one of the recorder's own markers (FORMAT.md 5.3). The recorder writes them into other
    /// threads' buffers too (a window opens for every thread), and with ticks from before now (a thread's
    /// first marker has the window's opening time), so a buffer taken for one is not written down as a
    /// pause: the waiting was not this stream's, or not right after this event.
    pub fn push_marker(&mut self, ev: RawEvent, sink: &dyn Sink) {
        if self.cur == self.end {
            self.refill_with(sink, ev.ticks.get(), false);
            if self.cur == self.end {
                return;
            }
        }
        // SAFETY: cur < end, both within `buf`'s allocation (set by `install`).
        unsafe { self.store(&ev) }
    }

    /// Submits the full buffer and installs the next; `ticks` are those of the event that found it full,
    /// which `push` stores next. If getting the buffer held the thread up, a `PAUSE` goes first (FORMAT.md
    /// 5.6): written here, the hot path stays a compare, a store and an increment (writing it after the
    /// event, from a separate full-buffer path, cost every event ~3 ns: measured).
    #[cold]
    #[inline(never)]
    fn refill(&mut self, sink: &dyn Sink, ticks: u64) {
        self.refill_with(sink, ticks, true);
    }

    /// `refill`, writing a `PAUSE` only if `measure`.
    fn refill_with(&mut self, sink: &dyn Sink, ticks: u64, measure: bool) {
        let begin = crate::clock::ticks();
        self.submit(sink);
        match sink.take(self.thread_id, ticks, self.pushed) {
            Some(b) => {
                self.install(b);
                if self.lost.count > 0 {
                    self.report_lost(sink);
                }
                let len = crate::clock::ticks().saturating_sub(begin);
                // Room for the pause and the event (a buffer of one event has none).
                // SAFETY: both pointers are within the buffer just installed.
                if measure && len >= self.pause_min && unsafe { self.end.offset_from(self.cur) } >= 2 {
                    let pause = RawEvent::new(ticks, 0, (len >> 32) as u32, len as u32, EventKind::PAUSE as u8);
                    // SAFETY: cur < end (just checked), within the installed buffer.
                    unsafe { self.store(&pause) }
                }
            }
            None => {
                let l = &mut self.lost;
                if l.count == 0 {
                    l.first = ticks;
                }
                l.count += 1;
                l.last = ticks;
            }
        }
    }

    fn install(&mut self, mut b: Buffer) {
        let range = b.as_mut_ptr_range();
        self.cur = range.start;
        self.end = range.end;
        self.buf = Some(b);
    }

    fn submit(&mut self, sink: &dyn Sink) {
        self.submit_as(sink, false);
    }

    /// Hands the buffer over, with [`Sink::submit_last`] if `last`.
    fn submit_as(&mut self, sink: &dyn Sink, last: bool) {
        let len = self.len();
        if let Some(b) = self.buf.take() {
            // An empty buffer goes back for reuse too; the writer makes no chunk of it.
            self.pushed += len as u64;
            if last {
                sink.submit_last(self.thread_id, b, len);
            } else {
                sink.submit(self.thread_id, b, len);
            }
        }
        self.cur = std::ptr::null_mut();
        self.end = std::ptr::null_mut();
    }

    fn report_lost(&mut self, sink: &dyn Sink) {
        let l = std::mem::take(&mut self.lost);
        sink.lost(Lost { thread_id: self.thread_id, count: l.count, first_ticks: l.first, last_ticks: l.last });
    }

    /// Submits the current buffer, however full, and reports any lost events. The next push takes a new
    /// buffer.
    pub fn flush(&mut self, sink: &dyn Sink) {
        self.submit(sink);
        if self.lost.count > 0 {
            self.report_lost(sink);
        }
    }

    /// [`flush`](Self::flush) for a thread that ends: its buffer goes with [`Sink::submit_last`].
    pub fn flush_last(&mut self, sink: &dyn Sink) {
        // With losses to report, the buffer goes at once, ahead of the report.
        if self.lost.count > 0 {
            self.flush(sink);
        } else {
            self.submit_as(sink, true);
        }
    }

    /// Forgets the events in the current buffer (used after calibration, whose events are not recorded).
    pub fn rewind(&mut self) {
        if let Some(b) = &mut self.buf {
            self.cur = b.as_mut_ptr();
        }
    }

    /// Drops the buffer without submitting it (a forked child must not write the parent's file).
    pub fn abandon(&mut self) {
        self.buf = None;
        self.cur = std::ptr::null_mut();
        self.end = std::ptr::null_mut();
        self.lost = LostRun::default();
    }

    /// Dropped events not yet reported.
    pub fn lost_pending(&self) -> LostRun {
        self.lost
    }
}

enum Msg {
    Events {
        thread_id: u64,
        buf: Buffer,
        len: usize,
    },
    Code(Vec<CodeObject>),
    /// C callables, first called (FORMAT.md 6.11).
    CFunctions(Vec<ocular_format::CFunction>),
    Thread(ThreadInfo),
    Lost(Lost),
    Snapshots(Vec<CodeSnapshot>),
    Calibration(Calibration),
    /// Performance counter samples (FORMAT.md 6.9).
    Counters(ocular_format::CounterSamples),

    /// Write the flight recorder's content into `file`: everything up to `at`.
    Dump {
        file: File,
        name: String,
        at: ClockPoint,
        reply: Sender<DumpOutcome>,
    },
    Finish(Trailer),
}

impl Msg {
    /// Whether the writer must settle before handling it: a dump reads the ring and the end closes the
    /// file, both after the buffers written so far. Every other message only adds to the file's buffer.
    fn needs_settled(&self) -> bool {
        // No wildcard: a new kind of message must say which it is.
        match self {
            Msg::Dump { .. } | Msg::Finish(_) => true,
            Msg::Events { .. }
            | Msg::Code(_)
            | Msg::CFunctions(_)
            | Msg::Thread(_)
            | Msg::Lost(_)
            | Msg::Snapshots(_)
            | Msg::Calibration(_)
            | Msg::Counters(_) => false,
        }
    }
}

/// What a dump wrote (or why it could not).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DumpOutcome {
    /// The file.
    pub path: String,
    /// Events written.
    pub events: u64,
    /// Events the ring had overwritten before, over all threads.
    pub dropped: u64,
    /// File size.
    pub bytes: u64,
    /// Milliseconds the writer thread spent on it (the program's threads do not wait for it).
    pub writer_ms: f64,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// What the writer did, reported when the session finishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Events written.
    pub events: u64,
    /// Events counted as lost (LOST records), including any that could not be written.
    pub lost: u64,
    /// File size.
    pub bytes: u64,
    /// The first write error, if any; events after it are counted in `lost`.
    pub error: Option<String>,
    /// A flight recorder's dumps that failed while recording, as `path: why`.
    pub dump_errors: Vec<String>,
    /// A flight recorder's: events its ring overwrote (not in the file; FORMAT.md 6.8).
    pub dropped: u64,
    /// What else the user should know of the file (it was deleted while written, and written again).
    pub notes: Vec<String>,
}

/// The writer thread's state. After a write error the writer is dropped: later events are counted as
/// lost, and buffers still go back to the pool so recording never stalls.
struct WriterJob {
    writer: Option<Writer<BufWriter<File>>>,
    out: Outcome,
    pool: Arc<Pool>,
    /// A flight recorder's: events go into the ring's chunk region, and the file is written by dumps.
    flight: Option<Flight>,
    /// The trace, whether it is a regular file, and the header's start ticks and tick rate (to say when
    /// a write failed).
    path: PathBuf,
    regular: bool,
    clock: (u64, f64),
    /// After a write error: per thread, the events that could not be written (LOST chunks at the stop,
    /// once the file is sealed: [`ocular_format::complete::seal`]).
    unwritten: std::collections::HashMap<u64, Lost>,
    /// A test hook: `OCULAR_TEST_WRITER_DELAY_US` when the recording started makes the writer that much
    /// slower per buffer, so that tests of what a slow writer does (recorder pauses, waiting, losing)
    /// get one on any machine instead of hoping for it.
    delay: Option<std::time::Duration>,
    /// Ring-slot buffers whose events are in the file's buffer, not yet flushed ([`WriterJob::settle`]).
    unflushed: Vec<Unflushed>,
    /// When the first of them (or of `held_chunks`) was written.
    unflushed_since: Option<std::time::Instant>,
    /// Other chunks are in the file's buffer, not yet flushed (threads' names, also in the ring).
    held_chunks: bool,
}

/// A buffer written into the file's buffer whose ring slot waits for the flush.
struct Unflushed {
    buf: Buffer,
    full: bool,
    thread_id: u64,
    len: usize,
    first: u64,
    last: u64,
}

/// What a flight recorder's writer needs to write dumps.
struct Flight {
    header: Header,
    path: PathBuf,
    /// Whether `path` is a regular file (the final dump replaces it), else it is written in place.
    regular: bool,
    /// The run of several processes the recording belongs to: every dump says so too.
    process: Option<ocular_format::ProcessInfo>,
}

impl WriterJob {
    fn fail(&mut self, e: impl ToString) {
        self.out.error.get_or_insert_with(|| e.to_string());
        if let Some(w) = self.writer.take() {
            // What reached the disk, for the report: the size once the writer is closed (its buffer's
            // last flush attempted), not 0 as if nothing had been written.
            let file = w.get_ref().get_ref().try_clone();
            drop(w);
            if let Ok(m) = file.and_then(|f| f.metadata()) {
                self.out.bytes = m.len();
            }
        }
    }

    fn write(&mut self, f: impl FnOnce(&mut Writer<BufWriter<File>>) -> ocular_format::Result<()>) -> bool {
        match self.writer.as_mut().map(f) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                self.fail(e);
                false
            }
            None => false,
        }
    }

    /// Hands the events written since the last flush to the kernel, then frees their ring slots and gives
    /// their buffers back: at a full buffer, once [`LAST_BATCH`] are waiting or the first has waited
    /// [`LAST_LATENCY`], when nothing came for that long, and before a message that needs the file or the
    /// ring settled. A thread per request ends a buffer or two per request, and a flush each made a
    /// `write` each, most of the writer's system time in a server.
    fn settle(&mut self) {
        self.unflushed_since = None;
        if !std::mem::take(&mut self.held_chunks) && self.unflushed.is_empty() {
            return;
        }
        let flushed = self.write(|w| w.flush());
        for u in std::mem::take(&mut self.unflushed) {
            if !flushed {
                // Counted as written when they went into the buffer: they never reached the file.
                self.out.events -= u.len as u64;
                self.out.lost += u.len as u64;
                self.unwritten_add(u.thread_id, u.len as u64, u.first, u.last);
            }
            if let (Some(slot), Some(ring)) = (u.buf.slot(), self.pool.ring()) {
                ring.free(slot);
            }
            self.pool.recycle(u.buf, u.full);
        }
    }

    /// Handles one message; true when the session is finished.
    fn handle(&mut self, msg: Msg) -> bool {
        if msg.needs_settled() {
            self.settle();
        }
        match msg {
            // Compressed as they come, off the program's critical path; the writer puts the CODE chunk
            // before the next chunk that could refer to them.
            Msg::Code(c) => {
                self.write(|w| w.add_code_objects(&c));
            }
            Msg::CFunctions(f) => {
                self.write(|w| w.c_functions(&f));
            }
            // A thread's name is in the ring too (`Sink::thread`): flushed with the next events.
            Msg::Thread(t) if self.pool.ring().is_some() && self.flight.is_none() => {
                if self.write(|w| w.unflushed(|w| w.thread(&t))) {
                    self.unflushed_since.get_or_insert_with(std::time::Instant::now);
                    self.held_chunks = true;
                }
            }
            Msg::Thread(t) => {
                self.write(|w| w.thread(&t));
            }
            Msg::Lost(l) if self.flight.is_some() => {
                self.out.lost += l.count;
                let chunk = self.writer.as_mut().map(|w| w.lost_chunk(&l));
                if let (Some(Ok(c)), Some(ring)) = (chunk, self.pool.ring()) {
                    let _ = ring.push_chunk(&c);
                }
            }
            // A flight recorder's samples go into the ring with its events, overwritten with them: in the
            // metadata they grew without bound over a long run.
            Msg::Counters(c) if self.flight.is_some() => {
                let chunk = self.writer.as_mut().map(|w| w.counters_chunk(&c));
                if let (Some(Ok(c)), Some(ring)) = (chunk, self.pool.ring()) {
                    let _ = ring.push_chunk(&c);
                }
            }
            Msg::Dump { file, name, at, reply } => {
                let out = self.dump(file, &name, at, None);
                if let Some(e) = &out.error {
                    // A dump cut off (a full disk) would read as a trace that ends early: it goes, and the
                    // ring, which still holds everything, can be dumped again.
                    let partial = std::fs::metadata(&name).is_ok_and(|m| m.is_file());
                    let gone = partial && std::fs::remove_file(&name).is_ok();
                    let then = if gone {
                        "; the partial file was removed: the ring still holds its events, dump again where there is room"
                    } else {
                        ""
                    };
                    self.out.dump_errors.push(format!("{name}: {e}{then}"));
                }
                let _ = reply.send(out);
            }
            Msg::Finish(t) if self.flight.is_some() => {
                self.finish_flight(t);
                return true;
            }
            Msg::Events { thread_id, buf, len } => {
                // Spares first: the thread that sent this fills its next buffer in as little as 2 ms,
                // less than writing this one takes, and with none ready it made a ring slot itself, a
                // millisecond of the program's time (the second switch of every recording, before).
                self.pool.keep_spares(self.pool.spares());
                if let Some(d) = self.delay {
                    std::thread::sleep(d);
                }
                let full = len >= buf.len();
                if len > 0 {
                    // A flight recorder's events go into the ring's chunk region.
                    let written = if self.flight.is_some() {
                        self.ring_events(thread_id, &buf[..len])
                    } else if buf.slot().is_some() {
                        // Flushed at `settle`, before its slot is freed.
                        self.write(|w| w.unflushed(|w| w.events(thread_id, &buf[..len])))
                    } else {
                        self.write(|w| w.events(thread_id, &buf[..len]))
                    };
                    if written {
                        self.out.events += len as u64;
                    } else {
                        self.out.lost += len as u64;
                        let (first, last) = (buf[0].ticks.get(), buf[len - 1].ticks.get());
                        self.unwritten_add(thread_id, len as u64, first, last);
                    }
                    if written && self.flight.is_none() && buf.slot().is_some() {
                        // A ring slot is freed only once its events are in the kernel's hands, so that a
                        // process killed at any moment has each event in the file or in the ring. A full
                        // buffer is flushed now (with any before it); a thread's last, partial one waits
                        // for a few more, as the sink holds them back (`submit_last`), to share a flush.
                        let (first, last) = (buf[0].ticks.get(), buf[len - 1].ticks.get());
                        self.unflushed_since.get_or_insert_with(std::time::Instant::now);
                        self.unflushed.push(Unflushed { buf, full, thread_id, len, first, last });
                        if full || self.pool.cfg.max_buffers < 4 * LAST_BATCH {
                            self.settle();
                        }
                        return false;
                    }
                }
                if let (Some(slot), Some(ring)) = (buf.slot(), self.pool.ring()) {
                    ring.free(slot);
                }
                self.pool.recycle(buf, full);
            }
            Msg::Lost(l) => {
                self.out.lost += l.count;
                if !self.write(|w| w.lost(&l)) {
                    self.unwritten_add(l.thread_id, l.count, l.first_ticks, l.last_ticks);
                }
            }
            Msg::Snapshots(s) => {
                self.write(|w| w.snapshots(&s));
            }
            Msg::Calibration(c) => {
                self.write(|w| w.calibration(&c));
            }
            Msg::Counters(c) => {
                self.write(|w| w.counters(&c));
            }

            Msg::Finish(t) => {
                if let Some(w) = self.writer.take() {
                    self.out.bytes = w.bytes_written();
                    // Handed to the kernel, not fsynced: the file then outlives the process, as any file
                    // the program writes does. An fsync made the program wait for the disk at its exit,
                    // 0.5-2 ms on an idle disk and 11-15 ms while other writes were in flight.
                    let closed = w.finish(t.clone()).map_err(|e| e.to_string()).and_then(|bw| {
                        let f = bw.into_inner().map_err(|e| e.into_error().to_string())?;
                        self.keep_if_deleted(&f);
                        f.metadata().map(|m| m.len()).map_err(|e| e.to_string())
                    });
                    match closed {
                        Ok(len) => self.out.bytes = len,
                        Err(e) => self.fail(e),
                    }
                }
                if self.out.error.is_some() {
                    self.seal(&t);
                }
                return true;
            }
        }
        false
    }
}

impl WriterJob {
    fn unwritten_add(&mut self, thread_id: u64, count: u64, first: u64, last: u64) {
        let l = self.unwritten.entry(thread_id).or_insert(Lost {
            thread_id,
            count: 0,
            first_ticks: first,
            last_ticks: last,
        });
        l.count += count;
        l.first_ticks = l.first_ticks.min(first);
        l.last_ticks = l.last_ticks.max(last);
    }

    /// After a write error: the trace cut at its last whole chunk and closed with the events that could
    /// not be written counted as lost (a full disk has room for that once the cut chunk's bytes are
    /// freed), and the error says from when.
    fn seal(&mut self, t: &Trailer) {
        if !self.regular || self.flight.is_some() {
            return;
        }
        let mut lost: Vec<Lost> = self.unwritten.values().cloned().collect();
        lost.sort_by_key(|l| l.first_ticks);
        let sealed = ocular_format::complete::seal(&self.path, &lost, t.end_ticks, t.end_monotonic_ns);
        // What is lost: the events that came after the failure, and any chunk given up to close the trace.
        let written = match &sealed {
            Ok(Some(written)) => written.as_slice(),
            _ => lost.as_slice(),
        };
        let from = written.iter().map(|l| l.first_ticks).min();
        let n: u64 = written.iter().map(|l| l.count).sum();
        let when = from.map_or(String::new(), |f| {
            format!(
                " from {:.3} s into the recording on",
                f.saturating_sub(self.clock.0) as f64 / self.clock.1.max(1.0)
            )
        });
        let said = match sealed {
            Ok(_) => {
                self.out.bytes = std::fs::metadata(&self.path).map_or(self.out.bytes, |m| m.len());
                format!(
                    "; the program went on unharmed, and the trace holds what came before: the {n} events{when} \
                     are counted in it as lost"
                )
            }
            Err(e) => format!(
                "; the {n} events{when} are lost, and the trace could not be closed either ({e}): it reads up to \
                 its last whole chunk"
            ),
        };
        if let Some(err) = self.out.error.as_mut() {
            err.push_str(&said);
        }
    }

    /// A trace deleted (or replaced) while it was written is written again at its path from the open file,
    /// which still holds it: nothing of the recording is lost because a cleanup ran during it.
    fn keep_if_deleted(&mut self, f: &File) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if !self.regular {
                return;
            }
            let Ok(ours) = f.metadata() else { return };
            let same = std::fs::metadata(&self.path).is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino());
            if same {
                return;
            }
            use std::os::fd::AsRawFd;
            let src = format!("/proc/self/fd/{}", f.as_raw_fd());
            let (dst, how) = if self.path.exists() {
                let mut p = self.path.as_os_str().to_owned();
                p.push(".recovered.ocl");
                (PathBuf::from(p), "was replaced by another file while it was written: the recording is in")
            } else {
                (self.path.clone(), "was deleted while it was written: written again at")
            };
            let copied = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&dst)
                .and_then(|mut out| std::io::copy(&mut File::open(&src)?, &mut out));
            self.out.notes.push(match copied {
                Ok(_) => format!("{} {how} {}", self.path.display(), dst.display()),
                Err(e) => format!(
                    "{} was deleted while it was written, and could not be written again: {e}",
                    self.path.display()
                ),
            });
        }
    }

    /// A flight recorder's events into the ring's chunk region; false if they could not be (a write error
    /// of the file, where code objects go, or a chunk larger than the ring).
    fn ring_events(&mut self, thread_id: u64, events: &[RawEvent]) -> bool {
        let Some(w) = self.writer.as_mut() else { return false };
        match w.events_chunks(thread_id, events) {
            Ok(chunks) => {
                let ring = self.pool.ring().expect("a flight recorder has a ring");
                chunks.iter().all(|c| ring.push_chunk(c).is_ok())
            }
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// Writes the flight recorder's content into `file` (FORMAT.md: a whole trace, with a trailer): the
    /// metadata written so far, each thread's overwritten events as `DROPPED`, the ring's chunks, the
    /// events of the buffers not yet in the ring up to `at`, and `snapshots` at the end when `final_`.
    fn dump(&mut self, file: File, name: &str, at: ClockPoint, trailer: Option<Trailer>) -> DumpOutcome {
        let t0 = std::time::Instant::now();
        let mut out = DumpOutcome { path: name.to_string(), ..DumpOutcome::default() };
        let result = self.dump_into(file, name, at, trailer, &mut out);
        if let Err(e) = result {
            out.error = Some(e.to_string());
        }
        out.writer_ms = t0.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn dump_into(
        &mut self,
        file: File,
        name: &str,
        at: ClockPoint,
        trailer: Option<Trailer>,
        out: &mut DumpOutcome,
    ) -> ocular_format::Result<()> {
        let (Some(flight), Some(ring)) = (self.flight.as_ref(), self.pool.ring()) else {
            return Err(ocular_format::Error::Io {
                path: name.into(),
                error: std::io::Error::other("not a flight recorder"),
            });
        };
        let Some(w) = self.writer.as_mut() else {
            let why = self.out.error.clone().unwrap_or_else(|| "the recording's writer stopped".into());
            return Err(ocular_format::Error::Io { path: name.into(), error: std::io::Error::other(why) });
        };
        // Code objects still being compressed go into the copy first.
        w.flush_code()?;
        let meta = w.copy();
        let mut d =
            Writer::new(BufWriter::with_capacity(1 << 20, file), name, &flight.header, WriterOptions::default())?;
        if let Some(p) = &flight.process {
            d.process(p)?;
        }
        let mut snapshots = Vec::new();
        for (header, chunk) in ocular_format::chunk::chunks(meta) {
            match header.kind.get() {
                // The dump is a whole trace: no ring to complete it from.
                ocular_format::chunk::kind::RING => {}
                // After every EVENTS chunk (FORMAT.md 3.2).
                ocular_format::chunk::kind::SNAPSHOT => snapshots.push(chunk),
                _ => d.copy_chunk(chunk)?,
            }
        }
        for dr in ring.dropped() {
            out.dropped += dr.events;
            d.dropped(&dr)?;
        }
        // The program fills buffers meanwhile, which wait for the writer until the dump is written: spares
        // are kept ready all along, so that no recording thread makes its own (a slot's page faults cost
        // ~0.5 ms: measured, a 64 MiB dump left the program's thread without a buffer for 4.5 ms).
        let pool = Arc::clone(&self.pool);
        let mut copied = Ok(());
        ring.for_each_chunk(|c| {
            if copied.is_ok() {
                copied = d.copy_chunk(c);
                pool.keep_spares(pool.spares());
            }
        });
        copied?;
        for slot in ring.pending(at.ticks) {
            d.events(slot.thread_id, &slot.events)?;
            pool.keep_spares(pool.spares());
        }
        for s in snapshots {
            d.copy_chunk(s)?;
        }
        out.events = d.events_written();
        let t = trailer.unwrap_or(Trailer {
            end_unix_ns: at.unix_ns,
            end_monotonic_ns: at.monotonic_ns,
            end_ticks: at.ticks,
            events: 0,
            lost: 0,
            chunks: 0,
        });
        let bw = d.finish(t)?;
        let f = bw.into_inner().map_err(|e| ocular_format::Error::Io { path: name.into(), error: e.into_error() })?;
        out.bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(())
    }

    /// The stop of a flight recorder: its content becomes the trace at its path (written beside it, then
    /// renamed over it, so that a crash in between leaves the recording's own file and ring to recover).
    fn finish_flight(&mut self, t: Trailer) {
        let flight = self.flight.as_ref().expect("a flight recorder");
        let (path, regular) = (flight.path.clone(), flight.regular);
        let name = path.display().to_string();
        let at = ClockPoint { ticks: t.end_ticks, monotonic_ns: t.end_monotonic_ns, unix_ns: t.end_unix_ns };
        let tmp = {
            let mut p = path.clone().into_os_string();
            p.push(format!(".{}.tmp", std::process::id()));
            PathBuf::from(p)
        };
        let target = if regular { &tmp } else { &path };
        let opened = if regular { File::create(target) } else { std::fs::OpenOptions::new().write(true).open(target) };
        let out = match opened {
            Ok(f) => self.dump(f, &name, at, Some(t)),
            Err(e) => DumpOutcome { error: Some(e.to_string()), ..DumpOutcome::default() },
        };
        let renamed = if regular && out.error.is_none() { std::fs::rename(&tmp, &path) } else { Ok(()) };
        if regular && (out.error.is_some() || renamed.is_err()) {
            let _ = std::fs::remove_file(&tmp);
        }
        match (out.error, renamed) {
            (Some(e), _) => self.fail(e),
            (None, Err(e)) => self.fail(format!("cannot rename {} to {name}: {e}", tmp.display())),
            (None, Ok(())) => {
                self.out.events = out.events;
                self.out.bytes = out.bytes;
                self.out.dropped = out.dropped;
            }
        }
        self.writer = None;
    }
}

/// Last buffers of ended threads held back before the writer is woken for them ([`Session::submit_last`]).
pub const LAST_BATCH: usize = 8;
/// The longest the writer leaves held-back buffers unwritten when nothing else wakes it.
const LAST_LATENCY: std::time::Duration = std::time::Duration::from_millis(100);

/// Code objects sent to the writer in one message at the most: the writer compresses them while the
/// program runs (on richards, 1,200 code objects left for the stop kept it waiting 10-20 ms).
pub const CODE_BATCH: usize = 64;

/// Code objects described since the last message to the writer, and the buffers that frame each for the
/// ring, kept: a code object's first sight is on the program's time (3,247 of them in sqlglot's run), and
/// fresh buffers grown a few bytes at a time, with the queue's own growth, were half its cost.
#[derive(Debug, Default)]
struct CodeQueue {
    objects: Vec<CodeObject>,
    one: Vec<u8>,
    framed: Vec<u8>,
}

impl CodeQueue {
    /// The queued code objects, leaving room for the next batch (none allocated when none are queued: each
    /// buffer's hand-over asks).
    fn take(&mut self) -> Vec<CodeObject> {
        if self.objects.is_empty() {
            return Vec::new();
        }
        std::mem::replace(&mut self.objects, Vec::with_capacity(CODE_BATCH))
    }
}

/// A recording in progress: the file, the writer thread, the pool.
#[derive(Debug)]
pub struct Session {
    tx: Sender<Msg>,
    /// Code objects described since the last message: sent with the next one, or on their own once
    /// [`CODE_BATCH`] have gathered. Each message wakes the writer thread (a futex wake, ~10 us, was a third
    /// of the cost of a new code object when each went alone), and code objects left for the stop are
    /// compressed while the program waits for its recording to end.
    code: Mutex<CodeQueue>,
    /// C callables named since the last message, sent as code objects are (FORMAT.md 6.11).
    cfuncs: Mutex<Vec<ocular_format::CFunction>>,
    /// Threads named since the last message, sent with the next one: a message of its own would wake the
    /// writer (~10 us) at every thread's start, on the program's time (`Thread._bootstrap`'s, in a thread
    /// per request). The ring's metadata has them at once.
    threads: Mutex<Vec<ThreadInfo>>,
    /// Last buffers of threads that ended, in ring slots, not yet sent ([`Session::submit_last`]): shared
    /// with the writer, which takes them when nothing woke it for [`LAST_LATENCY`].
    last: Arc<Mutex<Vec<(u64, Buffer, usize)>>>,
    pool: Arc<Pool>,
    /// The ring file beside the trace (RING.md), if one could be made.
    ring: Option<Arc<RingWriter>>,
    /// Why it could not, if it was asked for.
    ring_error: Option<String>,
    writer: Option<JoinHandle<Outcome>>,
    path: PathBuf,
    /// The file's descriptor, owned by the writer thread: a forked child closes its copy (see `forget`).
    #[cfg(unix)]
    fd: std::os::unix::io::RawFd,
}

/// Takes the session's lock on `file`, or says that another recording holds it.
#[cfg(unix)]
fn lock(file: &File) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a valid descriptor, owned by `file` for the duration of the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "another recording is writing it; record to another path, or wait until that recording ends",
        ));
    }
    // File systems without flock (some network ones) record without the lock, as before it existed.
    Ok(())
}

#[cfg(not(unix))]
fn lock(_: &File) -> std::io::Result<()> {
    Ok(())
}

impl Session {
    /// Creates the file, writes its header, and starts the `ocular-writer` thread. Errors (a directory
    /// that does not exist, no permission) surface here, before anything is recorded.
    ///
    /// The file is locked (`flock`, advisory) for as long as the session writes it: a second recording to
    /// the same path, in this process or another, fails here with "another recording is writing it" and
    /// leaves the file alone (it is truncated only once the lock is held). Two recordings into one file
    /// made it unreadable. The lock goes with the file's last descriptor: at the end of the session, or
    /// when the process dies, so a crash leaves no stale lock behind.
    pub fn start(path: &Path, header: &Header, cfg: Config) -> ocular_format::Result<Session> {
        Self::start_in_run(path, header, cfg, None)
    }

    /// [`Session::start`] for a process of a run of several (FORMAT.md 6.10): its `PROCESS` chunk is in
    /// the file before this returns, so a child killed at once still belongs to its run.
    pub fn start_in_run(
        path: &Path,
        header: &Header,
        cfg: Config,
        process: Option<&ocular_format::ProcessInfo>,
    ) -> ocular_format::Result<Session> {
        let name = path.display().to_string();
        let io = |error| ocular_format::Error::Io { path: name.clone(), error };
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(path).map_err(io)?;
        lock(&file).map_err(io)?;
        // Not a device (/dev/full, /dev/null): those cannot be truncated, nor need it. To one byte, which the
        // header overwrites at once, not to none: ext4 (auto_da_alloc) flushes a file truncated to zero when
        // it is closed, and the stop waited for that writeback to be submitted (~2 ms for a 6 MB trace).
        let meta = file.metadata().map_err(io)?;
        if meta.is_file() && meta.len() > 1 {
            file.set_len(1).map_err(io)?;
        }
        #[cfg(unix)]
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&file);
        let is_file = file.metadata().map_err(io)?.is_file();
        let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, file), &name, header, WriterOptions::default())?;
        // A ring file beside a regular file: the buffers' events and the metadata the writer has not
        // written yet survive a killed process there (RING.md). Without one (no space, no permission, a
        // pipe), the recording goes on as before, and a crash loses each thread's last buffer.
        if cfg.flight > 0 {
            let least = RingLayout::min_chunks_capacity(u32::try_from(cfg.buffer_events).unwrap_or(u32::MAX));
            if cfg.flight < least {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a ring of {} is smaller than one chunk of {} events (up to {}): give at least that, or \
                         fewer buffer_events",
                        human_bytes(cfg.flight),
                        cfg.buffer_events,
                        human_bytes(least)
                    ),
                )));
            }
        }
        // A ring file beside a regular file: the buffers' events and the metadata the writer has not
        // written yet survive a killed process there (RING.md). Without one (no space, no permission, a
        // pipe), the recording goes on as before, and a crash loses each thread's last buffer; a flight
        // recorder then keeps its ring in anonymous memory.
        let (mut ring, ring_error) =
            match (cfg.ring && (is_file || cfg.flight > 0)).then(|| Self::ring(path, header, cfg)) {
                Some(Ok(r)) => (Some(r), None),
                Some(Err(e)) => (None, Some(e)),
                None => (None, None),
            };
        if let Some(r) = &ring {
            let abs = std::path::absolute(r.path()).unwrap_or_else(|_| r.path().to_owned());
            writer.ring(&RingInfo { path: abs.display().to_string() })?;
        }
        if let Some(p) = process {
            writer.process(p)?;
        }
        if ring.is_none() && cfg.flight > 0 {
            let layout = Self::layout(cfg).map_err(io)?;
            let anon =
                RingWriter::anonymous(header.pid, header.start_ticks, header.ticks_per_second, layout).map_err(io)?;
            ring = Some(Arc::new(anon));
        }
        if let (Some(r), Ok(bytes)) = (&ring, postcard::to_allocvec(header)) {
            // A ring file read alone is a trace (RING.md 5).
            r.append_meta(ocular_format::chunk::kind::HEADER, &bytes);
        }
        writer.flush()?;
        let flight = (cfg.flight > 0).then(|| {
            writer.keep_copy();
            Flight { header: header.clone(), path: path.to_owned(), regular: is_file, process: process.cloned() }
        });
        let pool = Pool::new(cfg);
        let pool = Arc::new(match &ring {
            Some(r) => pool.with_ring(Arc::clone(r)),
            None => pool,
        });
        if pool.ring().is_some() {
            // A ring slot takes 0.5-1.4 ms to set up (384 page faults on a memory file system, where a
            // heap buffer gets one huge page). The first one is made here, before the recording starts:
            // made by the writer beside the program, it was seldom ready for the first event, whose thread
            // then made it itself, and the program's first line read a millisecond too long. Its first
            // part is made here (a sixteenth), and the writer makes two spares meanwhile, beside the program.
            pool.make_first();
        }
        let (tx, rx) = channel::<Msg>();
        let last: Arc<Mutex<Vec<(u64, Buffer, usize)>>> = Arc::default();
        let held = Arc::clone(&last);
        let delay = std::env::var("OCULAR_TEST_WRITER_DELAY_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(std::time::Duration::from_micros);
        let mut job = WriterJob {
            writer: Some(writer),
            out: Outcome::default(),
            pool: Arc::clone(&pool),
            flight,
            path: path.to_owned(),
            regular: is_file,
            clock: (header.start_ticks, header.ticks_per_second),
            unwritten: std::collections::HashMap::new(),
            delay,
            unflushed: Vec::new(),
            unflushed_since: None,
            held_chunks: false,
        };
        let handle = crate::threads::spawn("ocular-writer", move || {
            // Two more, beside the program, for its first two switches of buffers (or more threads): the
            // first comes before the writer has a buffer to write, and a slot the thread makes itself holds
            // up the program (written as a pause). No more yet: a short recording never needs them (a stop
            // waits for one being made, see `add_spare`); the first full buffer makes the writer keep 3.
            if job.pool.ring().is_some() {
                job.pool.add_spare();
                job.pool.add_spare();
            }
            // Rings of killed recordings stay for their traces to be read: the newest 8, for a week at
            // most (RING.md 2). Once per process: a later recording of it (the next test of a pytest
            // session) would find the same rings. On a thread of its own: settling a dead ring writes its
            // trace, and while the writer did it no buffer came back, so a program that filled the pool
            // meanwhile dropped its events (a live reader saw none for seconds after a test suite's kills
            // had left rings). A stop does not wait for the sweep: it is given up between two rings, for the
            // next process to do.
            let sweep = if SWEPT.swap(true, Ordering::Relaxed) {
                None
            } else {
                ocular_format::ring::runtime_dir().and_then(|dir| {
                    let pool = Arc::clone(&job.pool);
                    crate::threads::spawn("ocular-sweep", move || {
                        let stopping = || pool.is_closing();
                        ocular_format::ring::sweep_unless(&dir, RING_KEEP, RING_KEEP_FILES, &stopping);
                    })
                    .ok()
                })
            };
            loop {
                match rx.recv_timeout(LAST_LATENCY) {
                    Ok(msg) => {
                        if job.handle(msg) {
                            break;
                        }
                        if job.unflushed.len() >= LAST_BATCH
                            || job.unflushed_since.is_some_and(|t| t.elapsed() >= LAST_LATENCY)
                        {
                            job.settle();
                        }
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        // Only event buffers are held back: none of them ends the session.
                        let batch = std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner()));
                        for (thread_id, buf, len) in batch {
                            job.handle(Msg::Events { thread_id, buf, len });
                        }
                        job.settle();
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            job.settle();
            if let Some(h) = sweep {
                let _ = h.join();
            }
            job.out
        })
        .map_err(io)?;
        Ok(Session {
            tx,
            code: Mutex::new(CodeQueue::default()),
            cfuncs: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            last,
            pool,
            ring,
            ring_error,
            writer: Some(handle),
            path: path.to_owned(),
            #[cfg(unix)]
            fd,
        })
    }

    /// The ring's sizes for `cfg`.
    fn layout(cfg: Config) -> std::io::Result<RingLayout> {
        let too_big = |_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "buffers too large for a ring file");
        Ok(RingLayout {
            slot_events: u32::try_from(cfg.buffer_events).map_err(too_big)?,
            max_slots: u32::try_from(cfg.max_buffers).map_err(too_big)?.saturating_add(RING_THREAD_SLOTS),
            meta_capacity: RING_META,
            chunks_capacity: cfg.flight.div_ceil(8) * 8,
            slot_ext: true,
        })
    }

    /// Creates the ring file of `path`, or says why it cannot be made.
    fn ring(path: &Path, header: &Header, cfg: Config) -> Result<Arc<RingWriter>, String> {
        let layout = Self::layout(cfg).map_err(|e| e.to_string())?;
        static RECORDINGS: AtomicUsize = AtomicUsize::new(0);
        let n = RECORDINGS.fetch_add(1, Ordering::Relaxed) as u64;
        let ring_path = ocular_format::ring::path_for_recording(path, header.pid, n);
        RingWriter::create(&ring_path, header.pid, header.start_ticks, header.ticks_per_second, layout)
            .map(|w| {
                // Named absolutely: whoever settles the ring after a kill (RING.md 2) runs elsewhere.
                w.set_trace(&std::path::absolute(path).unwrap_or_else(|_| path.to_owned()));
                Arc::new(w)
            })
            .map_err(|e| format!("cannot make the ring file {}: {e}", ring_path.display()))
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ring file beside it, if there is one.
    pub fn ring_path(&self) -> Option<&Path> {
        self.ring.as_deref().filter(|r| r.is_file()).map(RingWriter::path)
    }

    /// Why there is no ring file although one was asked for (no space, a file size limit, ...).
    pub fn ring_error(&self) -> Option<&str> {
        self.ring_error.as_deref()
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Queues a code object: it reaches the writer with the next message (so before any events that use
    /// it), or with others once [`CODE_BATCH`] have gathered.
    pub fn code(&self, c: CodeObject) {
        let mut q = self.code.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ring) = &self.ring {
            // In the ring at once: the events that use it may be recovered from it (RING.md 3.4).
            let CodeQueue { one, framed, .. } = &mut *q;
            framed.clear();
            if ocular_format::frame_code(&c, one, framed).is_ok() {
                ring.append_meta(ocular_format::chunk::kind::CODE, framed);
            }
        }
        q.objects.push(c);
        if q.objects.len() >= CODE_BATCH {
            let batch = q.take();
            drop(q);
            let _ = self.tx.send(Msg::Code(batch));
        }
    }

    /// Queues a C callable called for the first time, as [`Session::code`] queues code objects: it reaches
    /// the writer before any events that call it.
    pub fn c_function(&self, f: ocular_format::CFunction) {
        if let Some(ring) = &self.ring {
            let mut framed = Vec::new();
            if ocular_format::frame_c_function(&f, &mut framed).is_ok() {
                ring.append_meta(ocular_format::chunk::kind::CFUNC, &framed);
            }
        }
        let mut queued = self.cfuncs.lock().unwrap_or_else(|e| e.into_inner());
        queued.push(f);
        if queued.len() >= CODE_BATCH {
            let batch = std::mem::take(&mut *queued);
            drop(queued);
            let _ = self.tx.send(Msg::CFunctions(batch));
        }
    }

    /// Sends `msg` after the queued code objects and C callables.
    fn send(&self, msg: Msg) -> Result<(), std::sync::mpsc::SendError<Msg>> {
        let code = self.code.lock().unwrap_or_else(|e| e.into_inner()).take();
        if !code.is_empty() {
            let _ = self.tx.send(Msg::Code(code));
        }
        let cfuncs = std::mem::take(&mut *self.cfuncs.lock().unwrap_or_else(|e| e.into_inner()));
        if !cfuncs.is_empty() {
            let _ = self.tx.send(Msg::CFunctions(cfuncs));
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = self.tx.send(Msg::Thread(t));
        }
        self.send_last();
        self.tx.send(msg)
    }

    /// Sends the held-back last buffers of ended threads, oldest first.
    fn send_last(&self) {
        let last = std::mem::take(&mut *self.last.lock().unwrap_or_else(|e| e.into_inner()));
        for (thread_id, buf, len) in last {
            self.unsent(self.tx.send(Msg::Events { thread_id, buf, len }));
        }
    }

    /// A thread gave `buf` up with `len` events: it holds no buffer now, and the ring slot is full.
    fn filled(&self, buf: &Buffer, len: usize) {
        self.pool.release();
        if let (Some(slot), Some(ring)) = (buf.slot(), &self.ring) {
            ring.full(slot, len as u32);
        }
    }

    /// A send of events that failed, which only happens after the writer stopped: the buffer comes back
    /// for reuse.
    fn unsent(&self, sent: Result<(), std::sync::mpsc::SendError<Msg>>) {
        if let Err(std::sync::mpsc::SendError(Msg::Events { buf, .. })) = sent {
            self.pool.give(buf);
        }
    }

    /// Names a thread.
    pub fn thread(&self, info: ThreadInfo) {
        if let (Some(ring), Ok(bytes)) = (&self.ring, postcard::to_allocvec(&info)) {
            ring.append_meta(ocular_format::chunk::kind::THREAD, &bytes);
        }
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).push(info);
    }

    /// A flight recorder's content, written into `path` by the writer thread while recording goes on:
    /// the file is created here (an error here is the caller's to see, nothing else waits), the rest is
    /// reported on the returned channel. Everything recorded up to now is in it.
    pub fn dump(&self, path: &Path) -> std::io::Result<Receiver<DumpOutcome>> {
        if !self.pool.ring().is_some_and(|r| r.layout().chunks_capacity > 0) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "only a flight recorder dumps: record with a ring budget (ring=\"64MB\", or --ring 64MB)",
            ));
        }
        let file = File::create(path)?;
        let at = ClockPoint::now();
        let (reply, rx) = channel();
        self.send(Msg::Dump { file, name: path.display().to_string(), at, reply })
            .map_err(|_| std::io::Error::other("the recording's writer thread has stopped"))?;
        Ok(rx)
    }

    /// Where another thread sends performance counter samples (the counters' drain).
    pub fn counter_sink(&self) -> CounterSink {
        CounterSink(self.tx.clone())
    }

    /// Sends the recorder's cost per event kind (before any events).
    pub fn calibration(&self, c: Calibration) {
        if let (Some(ring), Ok(bytes)) = (&self.ring, postcard::to_allocvec(&c)) {
            ring.append_meta(ocular_format::chunk::kind::CALIBRATION, &bytes);
        }
        let _ = self.send(Msg::Calibration(c));
    }

    /// Sends specialized-bytecode snapshots.
    pub fn snapshots(&self, s: Vec<CodeSnapshot>) {
        let _ = self.send(Msg::Snapshots(s));
    }

    /// Writes the trailer, waits for the writer, and reports what it did.
    pub fn finish(mut self, end: ClockPoint) -> Outcome {
        let trailer = Trailer {
            end_unix_ns: end.unix_ns,
            end_monotonic_ns: end.monotonic_ns,
            end_ticks: end.ticks,
            events: 0,
            lost: 0,
            chunks: 0,
        };
        let _ = self.send(Msg::Finish(trailer));
        let out = match self.writer.take().map(JoinHandle::join) {
            Some(Ok(out)) => out,
            Some(Err(_)) => Outcome { error: Some("the ocular-writer thread panicked".into()), ..Outcome::default() },
            None => Outcome::default(),
        };
        let mut out = out;
        if let Some(ring) = self.ring.take() {
            if out.error.is_some() && ring.is_file() && ring.layout().chunks_capacity > 0 {
                // A flight recorder whose trace could not be written (a full disk): its ring file holds
                // everything and stays, as a killed recording's does; the trace is read from it, and a
                // later recording completes the trace from it (RING.md 2).
                if let Some(e) = out.error.as_mut() {
                    e.push_str(&format!(
                        "; its ring file {} keeps what the recording held: every command reading the trace takes \
                         it from there, and the next recording writes it into the trace",
                        ring.path().display()
                    ));
                }
            } else {
                // The trace is complete: its ring file has nothing the trace lacks.
                let _ = ring.finish();
            }
        }
        out
    }

    /// Leaves the session without touching the file or joining the writer: for a forked child, where the
    /// writer thread does not exist and the file belongs to the parent. The child's copy of the file's
    /// descriptor is closed: it shares the parent's lock, which would otherwise outlive the parent's
    /// recording for as long as the child runs.
    pub fn forget(mut self) {
        if let Some(h) = self.writer.take() {
            std::mem::forget(h);
        }
        // SAFETY: the descriptor belongs to the writer thread's `File`, which never runs nor drops in the
        // child (the thread does not exist there), so nothing else closes or uses it. Closing one copy
        // leaves the lock to the parent's, which `flock` shares across descriptors of one open file.
        #[cfg(unix)]
        unsafe {
            libc::close(self.fd);
        }
        std::mem::forget(self);
    }
}

impl Sink for Session {
    fn take(&self, thread_id: u64, ticks: u64, events_before: u64) -> Option<Buffer> {
        let b = self.pool.take_held()?;
        if let (Some(slot), Some(ring)) = (b.slot(), &self.ring) {
            ring.filling(slot, thread_id, ticks, events_before);
        }
        Some(b)
    }
    fn submit(&self, thread_id: u64, buf: Buffer, len: usize) {
        self.filled(&buf, len);
        self.unsent(self.send(Msg::Events { thread_id, buf, len }));
    }
    /// A thread that ends hands its last buffer over, mostly a few hundred events: a message for each woke
    /// the writer (a futex wake, ~10 us of the program's time, with the GIL held) at every thread's end,
    /// as much again as recording a short thread's events. A buffer in a ring slot is safe there from a
    /// kill (RING.md 3), so it waits for the next message, for [`LAST_BATCH`] such buffers, or for the
    /// writer's timeout (100 ms); a heap buffer goes at once.
    fn submit_last(&self, thread_id: u64, buf: Buffer, len: usize) {
        // A small pool (a test's) gives no buffer to spare: held back, they would leave it empty.
        if buf.slot().is_none() || self.ring.is_none() || self.pool.cfg.max_buffers < 4 * LAST_BATCH {
            return self.submit(thread_id, buf, len);
        }
        self.filled(&buf, len);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.push((thread_id, buf, len));
        if last.len() >= LAST_BATCH {
            drop(last);
            self.send_last();
        }
    }
    fn lost(&self, lost: Lost) {
        let _ = self.send(Msg::Lost(lost));
    }
}

/// Sends performance counter samples to a session's writer, from any thread.
#[derive(Debug, Clone)]
pub struct CounterSink(Sender<Msg>);

impl CounterSink {
    /// Queues `c` for the writer (nothing if the session has finished).
    pub fn send(&self, c: ocular_format::CounterSamples) {
        if !c.samples.is_empty() || !c.lost.is_empty() {
            let _ = self.0.send(Msg::Counters(c));
        }
    }
}

/// `n` bytes for a person: `64 MiB`, `1.5 KiB`, `100 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    let s = format!("{v:.1}");
    format!("{} {}", s.strip_suffix(".0").unwrap_or(&s), UNITS[u])
}

/// A sink that records nothing: calibration runs push into one buffer that is reused when full.
#[derive(Debug)]
pub struct Discard {
    pool: Pool,
}

impl Discard {
    /// A discarding sink with buffers of `buffer_events`.
    pub fn new(buffer_events: usize) -> Self {
        Discard {
            pool: Pool::new(Config {
                buffer_events,
                max_buffers: 2,
                on_full: OnFull::Drop,
                ring: false,
                flight: 0,
                live: false,
                overflow: false,
            }),
        }
    }
}

impl Sink for Discard {
    fn take(&self, _: u64, _: u64, _: u64) -> Option<Buffer> {
        self.pool.take()
    }
    fn submit(&self, _: u64, buf: Buffer, _: usize) {
        self.pool.give(buf);
    }
    fn lost(&self, _: Lost) {}
}
