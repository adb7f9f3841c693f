//! A [`Reader`] on a thread of its own: the next chunks are read, checked, decompressed and decoded while
//! the caller works on the current one. Passes over a whole trace spend a fifth of their time decoding;
//! on a machine with a second core that time overlaps theirs.

use crate::reader::{Body, Chunk, ChunkInfo, Reader, Source};
use crate::{Header, RawEvent, Result};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Chunks decoded ahead of the caller: each is at most one buffer of events (1.5 MiB at 65,536 events).
const AHEAD: usize = 4;
/// Files smaller than this are read on the caller's thread: starting a thread and its channels (~0.05-0.1
/// ms) is most of what reading a test's trace for pytest's summary costs (a few hundred events, 10-30 KB,
/// most of it code objects). A file this size of events alone holds ~100,000 at most, whose decoding
/// ahead would save ~1 ms.
const INLINE_BELOW: u64 = 32 << 10;

/// A chunk that owns its events, made on the reading thread.
struct Owned {
    info: ChunkInfo,
    /// The events of an `EVENTS` chunk (`body` is then `None`).
    events: Vec<RawEvent>,
    body: Option<Body<'static>>,
}

/// A reader whose chunks are decoded ahead, on a thread of its own. [`Prefetch::next_chunk`] gives what
/// [`Reader::next_chunk`] would, in the same order; [`Prefetch::finish`] gives the reader back, with its
/// report, once the chunks ran out (or stops it early).
#[derive(Debug)]
pub struct Prefetch {
    header: Header,
    rx: Option<Receiver<Result<Owned>>>,
    /// The reading thread; it returns the reader.
    thread: Option<JoinHandle<Reader<Source>>>,
    /// Vectors of events the caller is done with, sent back to be filled again.
    spare: Option<SyncSender<Vec<RawEvent>>>,
    current: Option<Owned>,
    /// A small file's reader, read on the caller's thread.
    inline: Option<Reader<Source>>,
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owned").field("info", &self.info).finish_non_exhaustive()
    }
}

impl Prefetch {
    /// Starts reading `reader`'s chunks on a thread of its own (a small file's on the caller's, as
    /// [`Reader::next_chunk`] reads them).
    pub fn new(reader: Reader<Source>) -> Result<Self> {
        if std::fs::metadata(reader.path()).is_ok_and(|m| m.len() < INLINE_BELOW) {
            let header = reader.header().clone();
            return Ok(Prefetch { header, rx: None, thread: None, spare: None, current: None, inline: Some(reader) });
        }
        Self::threaded(reader)
    }

    /// Starts reading `reader`'s chunks on a thread of its own, whatever the file's size.
    pub fn threaded(mut reader: Reader<Source>) -> Result<Self> {
        let header = reader.header().clone();
        let path = reader.path().to_string();
        let (tx, rx) = sync_channel::<Result<Owned>>(AHEAD);
        let (spare, spares) = sync_channel::<Vec<RawEvent>>(AHEAD + 2);
        let thread = std::thread::Builder::new()
            .name("ocular-read".into())
            .spawn(move || {
                loop {
                    let mut events = spares.try_recv().unwrap_or_default();
                    let owned = match reader.next_chunk() {
                        Ok(None) => break,
                        Ok(Some(Chunk { info, body })) => match body {
                            Body::Events(evs) => {
                                events.clear();
                                events.extend_from_slice(evs);
                                Ok(Owned { info, events, body: None })
                            }
                            other => Ok(Owned { info, events, body: Some(owned_body(other)) }),
                        },
                        Err(e) => Err(e),
                    };
                    let failed = owned.is_err();
                    if tx.send(owned).is_err() || failed {
                        break; // the caller stopped, or the reader failed: it says so once
                    }
                }
                reader
            })
            .map_err(|error| crate::Error::Io { path, error })?;
        Ok(Prefetch { header, rx: Some(rx), thread: Some(thread), spare: Some(spare), current: None, inline: None })
    }

    /// The file header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The next chunk, as [`Reader::next_chunk`] gives it, or `None` at the end of the data.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk<'_>>> {
        if let Some(r) = &mut self.inline {
            return r.next_chunk();
        }
        if let (Some(done), Some(spare)) = (self.current.take(), &self.spare) {
            let _ = spare.try_send(done.events);
        }
        let Some(rx) = &self.rx else { return Ok(None) };
        match rx.recv() {
            Ok(Ok(owned)) => {
                let cur = self.current.insert(owned);
                let body = match cur.body.take() {
                    Some(b) => b,
                    None => Body::Events(&cur.events),
                };
                Ok(Some(Chunk { info: cur.info, body }))
            }
            Ok(Err(e)) => {
                self.rx = None;
                Err(e)
            }
            Err(_) => {
                self.rx = None;
                Ok(None)
            }
        }
    }

    /// Stops reading (if chunks are left) and gives the reader back: its report says what was read,
    /// skipped and found missing.
    pub fn finish(mut self) -> Reader<Source> {
        if let Some(r) = self.inline.take() {
            return r;
        }
        self.rx = None; // a reading thread blocked on a full queue sees it gone and ends
        self.thread.take().expect("joined once").join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

/// A body other than events, which owns everything it holds: the same value with the reader's lifetime
/// dropped.
fn owned_body(b: Body<'_>) -> Body<'static> {
    match b {
        Body::Events(_) => Body::Events(&[]),
        Body::Code(x) => Body::Code(x),
        Body::Thread(x) => Body::Thread(x),
        Body::Lost(x) => Body::Lost(x),
        Body::Snapshot(x) => Body::Snapshot(x),
        Body::Trailer(x) => Body::Trailer(x),
        Body::Calibration(x) => Body::Calibration(x),
        Body::Ring(x) => Body::Ring(x),
        Body::Dropped(x) => Body::Dropped(x),
        Body::Counters(x) => Body::Counters(x),
        Body::Process(x) => Body::Process(x),
        Body::CFunctions(x) => Body::CFunctions(x),
        Body::Skipped(x) => Body::Skipped(x),
    }
}
