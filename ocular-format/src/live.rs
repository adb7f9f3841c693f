//! Following a running recording from another process (RING.md 6): a [`Cursor`] over its ring file's
//! slots and metadata, that takes no lock, never makes the recording wait, and counts exactly the events it
//! missed because the recording reused a slot before the cursor read it.

use crate::event::RawEvent;
use crate::meta::{CodeObject, ThreadInfo};
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
    /// Events delivered since the cursor opened.
    pub delivered: u64,
    /// Events missed since the cursor opened.
    pub missed: u64,
    ended: Option<End>,
    scratch: Vec<(u64, u64, Vec<RawEvent>)>,
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
            delivered: 0,
            missed: 0,
            ended: None,
            scratch: Vec::new(),
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
            let next = self.next.entry(tid).or_insert(0);
            let end = first + evs.len() as u64;
            if end <= *next {
                continue;
            }
            if first > *next {
                out.missed += first - *next;
                gap(tid, first - *next);
                *next = first;
            }
            let skip = (*next - first) as usize;
            for e in &evs[skip..] {
                f(tid, e);
            }
            out.events += (evs.len() - skip) as u64;
            *next = end;
        }
        self.scratch = batches;
        self.delivered += out.events;
        self.missed += out.missed;
        self.ended = ended;
        out
    }

    /// New metadata records: code objects and thread names.
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
        let layout = self.ring.layout;
        let ext = HEADER_SIZE + layout.max_slots as u64 * ENTRY_SIZE;
        for i in 0..layout.max_slots as usize {
            let Some((e, st, generation)) = self.entry(i) else { continue };
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
                continue;
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
                continue;
            }
            self.slots[i] = SlotSeen { generation, thread_id, events_before, taken, last_ticks: last, known: true };
            if !evs.is_empty() {
                out.push((thread_id, events_before + first_index as u64, evs));
            }
        }
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
