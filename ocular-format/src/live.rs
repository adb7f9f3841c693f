//! Following a running recording from another process (RING.md 6): a [`Cursor`] over its ring file's
//! slots and metadata, that takes no lock, never makes the recording wait, and counts exactly the events it
//! missed because the recording reused a slot before the cursor read it.

use crate::event::RawEvent;
use crate::meta::{Calibration, CodeObject, ThreadInfo};
use crate::ring::{state, RingFile, ENTRY_SIZE, EXT_SIZE, HEADER_SIZE};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const EVENT_SIZE: usize = std::mem::size_of::<RawEvent>();

/// What the cursor knows of one slot.
#[derive(Clone, Copy, Debug, Default)]
struct SlotSeen {
    generation: u64,
    thread_id: u64,
    events_before: u64,
    /// Events of this generation read so far.
    taken: u32,
    last_ticks: u64,
    known: bool,
}

/// How a poll ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The recording stopped cleanly.
    Stopped,
    /// Its process is gone without stopping it (killed, crashed): what the slots held was read.
    Gone,
}

/// What one poll did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Poll {
    /// Events delivered.
    pub events: u64,
    /// Events the recording made that the cursor can no longer read (it reused their slots first).
    pub missed: u64,
    /// Set once the recording has ended; later polls deliver nothing.
    pub ended: Option<End>,
}

/// A reader of a running recording. See RING.md 6.
#[derive(Debug)]
pub struct Cursor {
    ring: RingFile,
    slots: Vec<SlotSeen>,
    /// Per thread, the index in its stream of the next event to deliver (events before it were delivered,
    /// or counted as missed, or were there before the cursor opened).
    next: HashMap<u64, u64>,
    meta_at: u64,
    /// Code objects described so far, by id.
    pub code: HashMap<u32, CodeObject>,
    /// Thread names so far, by native id.
    pub threads: HashMap<u64, String>,
    /// What the recorder's events cost, measured at the recording's start (FORMAT.md 6.6), once it is
    /// written (the one written at the stop, its speed only, is not kept).
    pub calibration: Option<Calibration>,
    /// Events delivered since the cursor opened.
    pub delivered: u64,
    /// Events missed since the cursor opened.
    pub missed: u64,
    ended: Option<End>,
    scratch: Vec<(u64, u64, Vec<RawEvent>)>,
    /// Called after each slot a poll reads: the tests' recording acts there, between two slots' reads.
    #[cfg(test)]
    after_slot: Option<tests::AfterSlot>,
}

/// A batch read from one slot: (thread, index in the thread's stream of its first event, events).
type Batch = (u64, u64, Vec<RawEvent>);

impl Cursor {
    /// Opens the ring file at `path`, starting at this moment: events already in its slots are not
    /// delivered. A ring file without a slot extension table (before RING.md 1.2) cannot be followed.
    pub fn open(path: &Path) -> crate::Result<Cursor> {
        let ring = RingFile::open(path)?;
        if !ring.layout.slot_ext {
            return Err(crate::Error::Corrupt {
                path: path.display().to_string(),
                offset: 0,
                what: "a ring file of an older Ocular (RING.md 1.0 or 1.1), which cannot be followed live".into(),
            });
        }
        let n = ring.layout.max_slots as usize;
        let mut c = Cursor {
            ring,
            slots: vec![SlotSeen::default(); n],
            next: HashMap::new(),
            meta_at: 0,
            code: HashMap::new(),
            threads: HashMap::new(),
            calibration: None,
            delivered: 0,
            missed: 0,
            ended: None,
            scratch: Vec::new(),
            #[cfg(test)]
            after_slot: None,
        };
        c.read_meta();
        c.skip_to_now();
        Ok(c)
    }

    /// The recording of process `pid` (the newest, if it made several): its ring file in the user's
    /// runtime directory.
    pub fn open_pid(pid: u32) -> crate::Result<Cursor> {
        let path = find_ring(pid)?;
        Cursor::open(&path)
    }

    /// The ring file.
    pub fn path(&self) -> &Path {
        self.ring.path()
    }

    /// The recording process.
    pub fn pid(&self) -> u32 {
        self.ring.pid
    }

    /// Ticks per second of the recording's clock, and its start ticks.
    pub fn clock(&self) -> (f64, u64) {
        (self.ring.ticks_per_second(), self.ring.start_ticks)
    }

    /// The events recorded since the last poll, each handed to `f` with its thread, in order per thread.
    pub fn poll(&mut self, f: impl FnMut(u64, &RawEvent)) -> Poll {
        self.poll_gaps(f, |_, _| {})
    }

    /// [`Cursor::poll`], also calling `gap(thread, n)` where `n` of a thread's events were missed, before
    /// the events that follow them (a reader that keeps a thread's stack resets it there).
    pub fn poll_gaps(&mut self, mut f: impl FnMut(u64, &RawEvent), mut gap: impl FnMut(u64, u64)) -> Poll {
        if let Some(e) = self.ended {
            return Poll { ended: Some(e), ..Poll::default() };
        }
        // Whether it ended is decided before reading: what was written before the end is read below.
        let st = self.ring.live_u32(20);
        let ended = if st == crate::ring::file_state::ENDED {
            Some(End::Stopped)
        } else if !self.ring.owner_alive() {
            Some(End::Gone)
        } else {
            None
        };
        let mut batches = std::mem::take(&mut self.scratch);
        batches.clear();
        self.read_slots(&mut batches);
        // After the slots: the recording appends a code object's record before the first event that uses
        // it, so every event read above has its code known here. Read before them, an event of a code
        // object first seen between the two reads had none (its function read "?"; under load, once in a
        // busy-machine test run).
        self.read_meta();
        batches.sort_by_key(|b| (b.0, b.1));
        let mut out = Poll { ended, ..Poll::default() };
        for (tid, first, evs) in batches.drain(..) {
            let mut next = self.next.get(&tid).copied().unwrap_or(0);
            // At most one slot a time between the two; the bound only guards against a slot table that
            // changes under the reader faster than it reads.
            for _ in 0..self.ring.layout.max_slots {
                if first <= next {
                    break;
                }
                let Some((_, from, held)) = self.read_gap(tid, next, first) else { break };
                let skip = (next - from) as usize;
                let upto = held.len().min((first - from) as usize);
                for e in &held[skip..upto] {
                    f(tid, e);
                }
                out.events += (upto - skip) as u64;
                next = from + upto as u64;
            }
            let end = first + evs.len() as u64;
            if end > next {
                if first > next {
                    out.missed += first - next;
                    gap(tid, first - next);
                    next = first;
                }
                let skip = (next - first) as usize;
                for e in &evs[skip..] {
                    f(tid, e);
                }
                out.events += (evs.len() - skip) as u64;
                next = end;
            }
            self.next.insert(tid, next);
        }
        self.scratch = batches;
        self.delivered += out.events;
        self.missed += out.missed;
        self.ended = ended;
        out
    }

    /// The events the ring held when the cursor opened that lead up to it: per thread, the stretch of its
    /// stream in its slots that ends where the cursor starts (a slot taken again since is left out, with
    /// the thread's older ones), its last `limit` events at most, handed to `f` in order, thread by
    /// thread. A reader builds each thread's stack at the opening from them: a call that began before the
    /// opening and runs still has its start there. Call it before the first poll; it moves no cursor.
    pub fn history(&mut self, limit: u64, mut f: impl FnMut(u64, &RawEvent)) {
        let mut by_thread: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, s) in self.slots.iter().enumerate() {
            if s.known && s.taken > 0 {
                by_thread.entry(s.thread_id).or_default().push(i);
            }
        }
        let mut threads: Vec<_> = by_thread.into_iter().collect();
        threads.sort_unstable_by_key(|t| t.0);
        for (tid, mut slots) in threads {
            slots.sort_unstable_by_key(|&i| std::cmp::Reverse(self.slots[i].events_before));
            // Newest first, while each slot ends where the one after it begins.
            let (mut parts, mut begin, mut held) = (Vec::new(), None, 0u64);
            for i in slots {
                let s = self.slots[i];
                let end = s.events_before + u64::from(s.taken);
                if begin.is_some_and(|b| b != end) || held >= limit {
                    break;
                }
                let from = u64::from(s.taken).saturating_sub(limit - held);
                let evs = self.ring.live_events(i as u64, from, u64::from(s.taken));
                let e = HEADER_SIZE + i as u64 * ENTRY_SIZE;
                if self.ring.live_u64(e + 24) != s.generation {
                    break; // taken again while read: it, and what came before it, are gone
                }
                held += evs.len() as u64;
                begin = Some(s.events_before);
                parts.push(evs);
            }
            for evs in parts.iter().rev() {
                for e in evs {
                    f(tid, e);
                }
            }
        }
    }

    /// New metadata records: code objects, thread names and the calibration.
    fn read_meta(&mut self) {
        for (kind, payload) in self.ring.meta_from(&mut self.meta_at) {
            match kind {
                crate::chunk::kind::CODE => {
                    if let Ok(c) = crate::reader::decode_code_record(&payload) {
                        self.code.insert(c.id, c);
                    }
                }
                crate::chunk::kind::THREAD => {
                    if let Ok((t, _)) = postcard::take_from_bytes::<ThreadInfo>(&payload) {
                        self.threads.insert(t.thread_id, t.name);
                    }
                }
                crate::chunk::kind::CALIBRATION if self.calibration.is_none() => {
                    if let Ok((c, _)) = postcard::take_from_bytes::<Calibration>(&payload) {
                        if !c.is_stop() {
                            self.calibration = Some(c);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Slot `i`'s entry offset, state and generation, if it was ever taken (`None` for one never used).
    fn entry(&self, i: usize) -> Option<(u64, u32, u64)> {
        let e = HEADER_SIZE + i as u64 * ENTRY_SIZE;
        let st = self.ring.live_u32(e + 16);
        let generation = self.ring.live_u64(e + 24);
        (generation != 0 && matches!(st, state::FILLING | state::FULL | state::FREE)).then_some((e, st, generation))
    }

    /// Marks everything in the slots as seen, without copying it: a cursor starts when it is opened.
    fn skip_to_now(&mut self) {
        let layout = self.ring.layout;
        let ext = HEADER_SIZE + layout.max_slots as u64 * ENTRY_SIZE;
        for i in 0..layout.max_slots as usize {
            let Some((e, st, generation)) = self.entry(i) else { continue };
            let (tid, before) = (self.ring.live_u64(e), self.ring.live_u64(ext + i as u64 * EXT_SIZE));
            let (mut taken, mut last) = (0u32, self.ring.live_u64(e + 8));
            if st == state::FILLING {
                // Only the ticks, to find where the filling slot ends now.
                while taken < layout.slot_events {
                    let t = self.ring.live_ticks(i as u64, taken as u64);
                    if t < last {
                        break;
                    }
                    last = t;
                    taken += 1;
                }
            } else {
                taken = self.ring.live_u32(e + 20).min(layout.slot_events);
            }
            if self.ring.live_u64(e + 24) != generation {
                continue;
            }
            self.slots[i] =
                SlotSeen { generation, thread_id: tid, events_before: before, taken, last_ticks: last, known: true };
            let end = before + taken as u64;
            let n = self.next.entry(tid).or_insert(end);
            *n = (*n).max(end);
        }
    }

    /// Reads every slot's events past those already taken (RING.md 6, step 1).
    fn read_slots(&mut self, out: &mut Vec<Batch>) {
        for i in 0..self.ring.layout.max_slots as usize {
            out.extend(self.read_slot(i));
            #[cfg(test)]
            if let Some(f) = &mut self.after_slot {
                (f.0)(i);
            }
        }
    }

    /// Slot `i`'s events past those already taken, if it has any now.
    fn read_slot(&mut self, i: usize) -> Option<Batch> {
        let layout = self.ring.layout;
        let ext = HEADER_SIZE + layout.max_slots as u64 * ENTRY_SIZE;
        let (e, st, generation) = self.entry(i)?;
        let seen = self.slots[i];
        let same = seen.known && seen.generation == generation;
        // A free slot keeps its events (and, since RING.md 1.2, its thread) until it is taken again.
        let (thread_id, events_before, mut taken, mut last) = if same {
            (seen.thread_id, seen.events_before, seen.taken, seen.last_ticks)
        } else {
            let start = self.ring.live_u64(e + 8);
            (self.ring.live_u64(e), self.ring.live_u64(ext + i as u64 * EXT_SIZE), 0, start)
        };
        let len = match st {
            state::FULL | state::FREE => self.ring.live_u32(e + 20).min(layout.slot_events),
            _ => layout.slot_events,
        };
        let first_index = taken;
        let end = if st == state::FILLING {
            // Where the filling slot ends now: the ticks only (each record's last store, RING.md 3.3).
            let mut end = taken;
            while end < len {
                let t = self.ring.live_ticks(i as u64, end as u64);
                if t < last {
                    break;
                }
                last = t;
                end += 1;
            }
            end
        } else {
            len
        };
        if end <= taken {
            self.slots[i] = SlotSeen { generation, thread_id, events_before, taken, last_ticks: last, known: true };
            return None;
        }
        // The whole stretch at once: records before `end` are complete and no longer written.
        let evs = self.ring.live_events(i as u64, taken as u64, end as u64);
        if st != state::FILLING {
            last = evs.last().map_or(last, |e| e.ticks.get());
        }
        taken = end;
        // Taken again while we read: what we read may be the next use's.
        if self.ring.live_u64(e + 24) != generation {
            self.slots[i].known = false;
            return None;
        }
        self.slots[i] = SlotSeen { generation, thread_id, events_before, taken, last_ticks: last, known: true };
        (!evs.is_empty()).then(|| (thread_id, events_before + first_index as u64, evs))
    }

    /// Before events `next..first` of thread `tid` are counted as missed (RING.md 6, step 2): the slot that
    /// holds event `next`, read again now. The pass over the slots reads them one after another while the
    /// recording goes on: it may read the end of a slot the thread is filling, then the thread's next slot,
    /// taken meanwhile; the first slot's last events are still there, and are read here.
    fn read_gap(&mut self, tid: u64, next: u64, first: u64) -> Option<Batch> {
        let layout = self.ring.layout;
        let ext = HEADER_SIZE + layout.max_slots as u64 * ENTRY_SIZE;
        for i in 0..layout.max_slots as usize {
            let Some((e, st, _)) = self.entry(i) else { continue };
            let before = self.ring.live_u64(ext + i as u64 * EXT_SIZE);
            let len = match st {
                state::FULL | state::FREE => self.ring.live_u32(e + 20).min(layout.slot_events),
                _ => layout.slot_events,
            };
            if self.ring.live_u64(e) != tid || before > next || next >= first.min(before + len as u64) {
                continue;
            }
            let batch = self.read_slot(i).filter(|b| b.0 == tid && b.1 <= next && next < b.1 + b.2.len() as u64);
            if batch.is_some() {
                return batch;
            }
        }
        None
    }
}

/// The ring file of the newest recording of process `pid` in the user's runtime directory.
pub fn find_ring(pid: u32) -> crate::Result<PathBuf> {
    let not_found = |why: String| crate::Error::Io {
        path: format!("process {pid}"),
        error: std::io::Error::new(std::io::ErrorKind::NotFound, why),
    };
    let dir = crate::ring::runtime_dir().ok_or_else(|| not_found("no runtime directory for ring files".into()))?;
    let suffix = format!(".{pid}-");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|e| crate::Error::Io { path: dir.display().to_string(), error: e })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.ends_with(".ring") && name.contains(&suffix)
        })
        .filter_map(|p| {
            let r = RingFile::open(&p).ok()?;
            // A recording of the process that has this pid now, or, if none runs with it, the last one that
            // did (killed: what its ring holds is read, and the reader says it ended). A ring of an earlier
            // process that had the pid is never taken for a running one's.
            let ours = r.owner_alive() || !crate::reader::process_alive(pid);
            (r.pid == pid && r.state == crate::ring::file_state::RECORDING && ours).then_some((r.start_ticks, p))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => Ok(p),
        // The error names the process already ("process 12: ..."): the reasons do not repeat it.
        None if crate::reader::process_alive(pid) => Err(not_found(format!(
            "it is not recording with Ocular (no ring file of it in {}; recordings made with \
             ring_file=False cannot be followed)",
            dir.display()
        ))),
        None => Err(not_found("no such process is running".into())),
    }
}

impl RingFile {
    /// A header or slot table field as it is now (the recording may be changing it).
    pub(crate) fn live_u32(&self, off: u64) -> u32 {
        let p = self.map_ptr(off, 4);
        // SAFETY: in bounds (map_ptr checks) and 4-aligned (every such field is, in a page-aligned map).
        unsafe { (*(p as *const AtomicU32)).load(Ordering::Acquire) }
    }

    pub(crate) fn live_u64(&self, off: u64) -> u64 {
        let p = self.map_ptr(off, 8);
        // SAFETY: as above, 8-aligned.
        unsafe { (*(p as *const AtomicU64)).load(Ordering::Acquire) }
    }

    /// The ticks of event `k` of slot `slot` (its first 8 bytes), read once.
    pub(crate) fn live_ticks(&self, slot: u64, k: u64) -> u64 {
        let off =
            self.slots_offset() + slot * self.layout.slot_events as u64 * EVENT_SIZE as u64 + k * EVENT_SIZE as u64;
        let p = self.map_ptr(off, 8);
        // SAFETY: in bounds, 8-aligned (records are 24 bytes from a page-aligned start). Acquire: the record's
        // other bytes, stored before its ticks, are read after.
        unsafe { (*(p as *const AtomicU64)).load(Ordering::Acquire) }
    }

    /// Events `from..to` of slot `slot`, copied in one go.
    pub(crate) fn live_events(&self, slot: u64, from: u64, to: u64) -> Vec<RawEvent> {
        let n = (to - from) as usize;
        let off =
            self.slots_offset() + slot * self.layout.slot_events as u64 * EVENT_SIZE as u64 + from * EVENT_SIZE as u64;
        let p = self.map_ptr(off, n * EVENT_SIZE);
        let mut out: Vec<RawEvent> = Vec::with_capacity(n);
        // SAFETY: `p` covers n records (map_ptr checked); the destination has room for n; RawEvent is plain
        // bytes (any bit pattern is valid). The records before the slot's end are no longer stored to; a
        // slot taken again meanwhile is detected by its generation and the copy discarded.
        unsafe {
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr() as *mut u8, n * EVENT_SIZE);
            out.set_len(n);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use crate::ring::{Layout, RingWriter};
    use std::sync::Arc;

    pub(super) struct AfterSlot(pub(super) Box<dyn FnMut(usize)>);

    impl std::fmt::Debug for AfterSlot {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("AfterSlot")
        }
    }

    fn append(w: &RingWriter, slot: u32, from: usize, ticks: std::ops::Range<u64>) {
        let p = w.prepare_slot_ptr(slot);
        for (i, t) in ticks.enumerate() {
            // SAFETY: the test stays within the layout's slot_events.
            unsafe { p.add(from + i).write(RawEvent::new(t, 1, 2, 0, EventKind::PY_START as u8)) };
        }
    }

    #[test]
    fn a_thread_that_moves_to_its_next_slot_while_a_poll_reads_loses_nothing() {
        // GIVEN a thread filling slot 0, of which the cursor has read 3 events
        let layout = Layout { slot_events: 8, max_slots: 4, meta_capacity: 4096, chunks_capacity: 0, slot_ext: true };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.ring");
        let w = Arc::new(RingWriter::create(&path, std::process::id(), crate::now_ticks(), 1e9, layout).unwrap());
        w.prepare_slot(0).unwrap();
        w.prepare_slot(1).unwrap();
        w.filling(0, 5, 100, 0);
        let mut c = Cursor::open(&path).unwrap();
        append(&w, 0, 0, 100..103);
        let mut got = Vec::new();
        assert_eq!(c.poll(|_, e| got.push(e.ticks.get())).missed, 0);
        assert_eq!(got, vec![100, 101, 102]);
        // WHEN the thread, between the next poll's reads of slot 0 and slot 1, fills slot 0 and goes on in 1
        append(&w, 0, 3, 103..105);
        let rec = Arc::clone(&w);
        c.after_slot = Some(AfterSlot(Box::new(move |i| {
            if i == 0 {
                append(&rec, 0, 5, 105..108);
                rec.full(0, 8);
                rec.filling(1, 5, 108, 8);
                append(&rec, 1, 0, 108..110);
            }
        })));
        got.clear();
        let p = c.poll(|_, e| got.push(e.ticks.get()));
        // THEN slot 0's last events, still in it, come before slot 1's: nothing is missed
        assert_eq!((p.missed, &got), (0, &(103..110).collect::<Vec<_>>()));
        // AND a slot taken again before the cursor read it is still missed, exactly
        c.after_slot = None;
        append(&w, 1, 2, 110..116);
        w.full(1, 8);
        w.free(1);
        w.filling(1, 5, 116, 16);
        append(&w, 1, 0, 116..118);
        got.clear();
        let p = c.poll(|_, e| got.push(e.ticks.get()));
        assert_eq!((p.missed, got), (6, vec![116, 117]));
    }

    #[test]
    fn history_gives_each_thread_its_events_up_to_the_opening_in_order_and_polls_go_on_from_there() {
        // GIVEN thread 5's stream in slots 2 (events 0-7, full) and 0 (events 8-10, filling), thread 6's in
        // slot 1 (events 0-1), and an older slot 3 of thread 5 whose events 8 later (a gap before slot 2)
        let layout = Layout { slot_events: 8, max_slots: 4, meta_capacity: 4096, chunks_capacity: 0, slot_ext: true };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.ring");
        let w = RingWriter::create(&path, std::process::id(), crate::now_ticks(), 1e9, layout).unwrap();
        for slot in 0..4 {
            w.prepare_slot(slot).unwrap();
        }
        w.filling(3, 5, 1, 0);
        append(&w, 3, 0, 1..9);
        w.full(3, 8);
        w.free(3);
        w.filling(2, 5, 200, 16);
        append(&w, 2, 0, 200..208);
        w.full(2, 8);
        w.filling(0, 5, 208, 24);
        append(&w, 0, 0, 208..211);
        w.filling(1, 6, 300, 0);
        append(&w, 1, 0, 300..302);
        // WHEN a cursor opens and reads the history, the last 10 events of each thread at most
        let mut c = Cursor::open(&path).unwrap();
        let mut got = Vec::new();
        c.history(10, |tid, e| got.push((tid, e.ticks.get())));
        // THEN each thread's events come in order, from the newest slot back while its stream is contiguous
        let want: Vec<(u64, u64)> = (201..211).map(|t| (5, t)).chain((300..302).map(|t| (6, t))).collect();
        assert_eq!(got, want);
        // AND without a limit that cuts it, thread 5's gap stops it at slot 2
        got.clear();
        c.history(100, |tid, e| got.push((tid, e.ticks.get())));
        assert_eq!(got.iter().filter(|g| g.0 == 5).count(), 11);
        // AND a poll delivers only what came after the opening
        append(&w, 0, 3, 211..213);
        got.clear();
        assert_eq!(c.poll(|tid, e| got.push((tid, e.ticks.get()))).missed, 0);
        assert_eq!(got, vec![(5, 211), (5, 212)]);
        // AND a slot taken again since the opening is left out, with the thread's older ones
        let mut c = Cursor::open(&path).unwrap();
        w.full(0, 5);
        w.free(0);
        w.filling(0, 5, 213, 29);
        got.clear();
        c.history(100, |tid, e| got.push((tid, e.ticks.get())));
        assert_eq!(got, vec![(6, 300), (6, 301)]);
    }
}
