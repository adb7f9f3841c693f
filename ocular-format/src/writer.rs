//! The streaming writer: turns per-thread event buffers and metadata records into chunks.

use crate::chunk::{
    codec, kind, ChunkHeader, Preamble, MAGIC, MAJOR, MAX_CHUNK_EVENTS, MAX_EVENTS_PER_STORED_BYTE, MINOR, SYNC,
};

/// Events per raw-records chunk when a columnar chunk would be too compressible (FORMAT.md 3.1): 48 MiB,
/// under the stored-length limit.
const RAW_FALLBACK_EVENTS: usize = 1 << 21;
use crate::error::{Error, Result};
use crate::event::RawEvent;
use crate::meta::{
    CFunction, Calibration, CodeObject, CodeRecord, CodeSnapshot, CounterSamples, Dropped, Header, Lost, ProcessInfo,
    RingInfo, ThreadInfo, Trailer,
};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;
use zstd::stream::raw::{Encoder as StreamEncoder, InBuffer, Operation, OutBuffer};

/// How the writer stores payloads.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// Compress payloads with zstd (codec bit 0). Off only for tests and golden files.
    pub compress: bool,
    /// zstd level for event chunks.
    pub level: i32,
    /// zstd level for CODE chunks: written once per code object, they are much of the file in a
    /// thresholded recording, and most of the writer's work in a short one (a test's trace under `pytest
    /// --ocular`, which the stop waits for). They are compressed while the program runs.
    pub meta_level: i32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        // Level 1: the same size within 0.5% as level 3 on recorder data, and a third less writer CPU (BENCHMARKS.md).
        // SNAPSHOT (and CFUNC) chunks go through the events' context, at their level: sqlglot's 1,502
        // snapshots (601 KB of mostly zero XORed bytecode) came to 50,088 bytes against 50,016 at level 3,
        // compressed in 2.1-2.5 ms against 3.2-3.9 while the stop waits, and a context of their own cost its
        // tables' set-up besides.
        Self { compress: true, level: 1, meta_level: META_LEVEL }
    }
}

/// See [`WriterOptions::meta_level`]. Level 3 (zstd's double-fast matcher) against 6 (lazy, row-based) on
/// the traces of 124 one-line tests (43 code objects each, a few hundred events): files 1.3% larger, and
/// the stop 0.76-0.85 ms against 0.80-1.10 in one hour, as level 6's match search was most of the writer's
/// samples there. Level 1 saved 0.05 ms more for files 2.5% larger than 6's.
const META_LEVEL: i32 = 3;

/// Writes an `.ocl` file chunk by chunk. Every chunk is handed to the underlying writer whole with a
/// single `write_all` and then flushed, so a process killed at any time leaves only whole chunks plus at
/// most one partial chunk at the end, which readers skip.
///
/// ```
/// # use ocular_format::*;
/// # let header = ocular_format::testing::header();
/// let mut w = Writer::new(Vec::new(), "<memory>", &header, WriterOptions::default())?;
/// w.events(42, &[RawEvent::new(100, 1, 0, 0, EventKind::PY_START as u8)])?;
/// let bytes = w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 200, events: 0, lost: 0, chunks: 0 })?;
/// assert_eq!(&bytes[..8], &MAGIC);
/// # Ok::<(), ocular_format::Error>(())
/// ```
pub struct Writer<W: Write> {
    out: W,
    path: String,
    opts: WriterOptions,
    seq: u64,
    events: u64,
    lost: u64,
    zstd: Kept<zstd::bulk::Compressor<'static>>,
    /// The context of event chunks under [`SMALL_RAW`] bytes, at [`SMALL_LEVEL`] (made at the first).
    zstd_small: Option<Kept<zstd::bulk::Compressor<'static>>>,
    raw: Vec<u8>,
    stored: Vec<u8>,
    encoder: crate::codec::Encoder,
    frame: Vec<u8>,
    bytes: u64,
    /// Base bytecode by code id: snapshots are stored XORed with it (FORMAT.md 6.4).
    bases: HashMap<u32, Vec<u8>>,
    /// Inline cache units after each base opcode (the header's table): snapshots store them as zeros.
    cache_entries: Vec<u8>,
    /// The CODE chunk being built: see [`Writer::add_code_objects`].
    code: PendingCode,
    /// A copy of every chunk written (a flight recorder's metadata, for its dumps): see [`Writer::keep_copy`].
    tee: Option<Vec<u8>>,
    /// Chunks made but not written (seq 0): see [`Writer::events_chunks`].
    divert: Option<Vec<Vec<u8>>>,
    /// Chunks go into `out`'s buffer without a flush each: see [`Writer::unflushed`].
    hold_flush: bool,
}

/// Code objects added but not yet written. Their framed records build up in the writer's own `raw`, and
/// those records compressed as they came (one zstd frame, finished when the chunk is written) in
/// `stored`: every other chunk is written only after [`Writer::flush_code`], so nothing else uses the
/// two buffers while code objects are pending.
#[derive(Default)]
struct PendingCode {
    count: u32,
    zstd: Option<Kept<StreamEncoder<'static>>>,
}

impl<W: Write> std::fmt::Debug for Writer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("path", &self.path).field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl<W: Write> Writer<W> {
    /// Writes the preamble and the header chunk. `path` names the destination in error messages.
    pub fn new(out: W, path: &str, header: &Header, opts: WriterOptions) -> Result<Self> {
        let mut w = Self::blank(out, path, header, opts)?;
        let pre = Preamble { magic: MAGIC, major: U16::new(MAJOR), minor: U16::new(MINOR), flags: U32::new(0) };
        w.out.write_all(pre.as_bytes()).map_err(|e| io_err(path, e))?;
        w.bytes += 16;
        w.record(Place::meta(kind::HEADER, 0, 1), header, "header")?;
        Ok(w)
    }

    /// A writer that has written nothing.
    fn blank(out: W, path: &str, header: &Header, opts: WriterOptions) -> Result<Self> {
        let zstd =
            Kept::take(&BULK, opts.level, || zstd::bulk::Compressor::new(opts.level)).map_err(|e| io_err(path, e))?;
        Ok(Writer {
            out,
            path: path.to_owned(),
            opts,
            seq: 0,
            events: 0,
            lost: 0,
            zstd,
            zstd_small: None,
            raw: Vec::new(),
            stored: Vec::new(),
            encoder: Default::default(),
            frame: Vec::new(),
            bytes: 0,
            bases: HashMap::new(),
            cache_entries: header.opcodes.cache_entries.clone(),
            code: PendingCode::default(),
            tee: None,
            divert: None,
            hold_flush: false,
        })
    }

    /// A writer that goes on after the whole chunks of an existing file: `out` is positioned after them,
    /// which hold `chunks` chunks (the header's included), `events` events and `lost` lost ones. Writes
    /// nothing itself.
    pub fn resume(out: W, path: &str, header: &Header, chunks: u64, events: u64, lost: u64) -> Result<Self> {
        let mut w = Self::blank(out, path, header, WriterOptions::default())?;
        (w.seq, w.events, w.lost) = (chunks, events, lost);
        Ok(w)
    }

    /// Events written so far.
    pub fn events_written(&self) -> u64 {
        self.events
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// Writes one thread's events, in order, as one or more EVENTS chunks.
    pub fn events(&mut self, thread_id: u64, events: &[RawEvent]) -> Result<()> {
        self.flush_code()?;
        for part in events.chunks(MAX_CHUNK_EVENTS as usize) {
            let version = self.encoder.encode(part, &mut self.raw);
            let place = |part: &[RawEvent], transform| Place {
                kind: kind::EVENTS,
                transform,
                thread_id,
                ts: (part[0].ticks.get(), part[part.len() - 1].ticks.get()),
                count: part.len() as u32,
            };
            let compress = self.compress(Zstd::Events)?;
            let stored = if compress { self.stored.len() } else { self.raw.len() } as u64;
            if part.len() as u64 <= MAX_EVENTS_PER_STORED_BYTE * stored {
                let transform = if version == 2 { codec::COLUMNAR_V2 } else { codec::COLUMNAR };
                self.write_chunk(place(part, transform), compress)?;
            } else {
                // Events that repeat exactly (equal timestamps) compress past what a reader decodes per stored
                // byte (FORMAT.md 3.1): stored as raw records, which always fit, in pieces under the
                // stored-length limit.
                for piece in part.chunks(RAW_FALLBACK_EVENTS) {
                    self.raw.clear();
                    self.raw.extend_from_slice(piece.as_bytes());
                    self.write_chunk(place(piece, codec::NONE), false)?;
                }
            }
            self.events += part.len() as u64;
        }
        Ok(())
    }

    /// What `f` writes, its chunks left in the output's buffer (whole, as every chunk is) until the next
    /// [`Writer::flush`] or the next chunk written otherwise: a recorder writes several threads' last,
    /// short buffers and their names with one `write` instead of one each.
    pub fn unflushed<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.hold_flush = true;
        let r = f(self);
        self.hold_flush = false;
        r
    }

    /// One thread's events as whole chunks (header and payload, `seq` 0), not written: a flight recorder
    /// keeps them in its ring (RING.md 3.5) and copies them into a file later ([`Writer::copy_chunk`]). A
    /// pending CODE chunk is written first, as for [`Writer::events`].
    pub fn events_chunks(&mut self, thread_id: u64, events: &[RawEvent]) -> Result<Vec<Vec<u8>>> {
        self.flush_code()?;
        self.divert = Some(Vec::new());
        let written = self.events;
        let r = self.events(thread_id, events);
        self.events = written;
        let out = self.divert.take().unwrap_or_default();
        r.map(|()| out)
    }

    /// A `LOST` record as a whole chunk (`seq` 0), not written (see [`Writer::events_chunks`]).
    pub fn lost_chunk(&mut self, lost: &Lost) -> Result<Vec<u8>> {
        self.flush_code()?;
        self.divert = Some(Vec::new());
        let written = self.lost;
        let r = self.lost(lost);
        self.lost = written;
        let out = self.divert.take().unwrap_or_default();
        r.map(|()| out.into_iter().next().unwrap_or_default())
    }

    /// A `COUNTERS` chunk (`seq` 0), not written (see [`Writer::events_chunks`]).
    pub fn counters_chunk(&mut self, c: &CounterSamples) -> Result<Vec<u8>> {
        self.flush_code()?;
        self.divert = Some(Vec::new());
        let r = self.counters(c);
        let out = self.divert.take().unwrap_or_default();
        r.map(|()| out.into_iter().next().unwrap_or_default())
    }

    /// Keeps a copy of every chunk written from now on ([`Writer::copy`]).
    pub fn keep_copy(&mut self) {
        self.tee = Some(Vec::new());
    }

    /// The chunks written since [`Writer::keep_copy`], back to back.
    pub fn copy(&self) -> &[u8] {
        self.tee.as_deref().unwrap_or_default()
    }

    /// Writes a whole chunk made elsewhere (by [`Writer::events_chunks`], or read from a file) with this
    /// file's next sequence number, its CRC computed again; counts its events and lost events.
    pub fn copy_chunk(&mut self, chunk: &[u8]) -> Result<()> {
        self.flush_code()?;
        let bad = |what: &str| Error::Corrupt { path: self.path.clone(), offset: 0, what: what.to_string() };
        let head = chunk.get(..crate::chunk::CHUNK_HEADER_LEN).ok_or_else(|| bad("a copied chunk without a header"))?;
        let mut h = <ChunkHeader as zerocopy::FromBytes>::read_from_bytes(head).map_err(|_| bad("chunk header"))?;
        let payload = &chunk[crate::chunk::CHUNK_HEADER_LEN..];
        if payload.len() != h.stored_len.get() as usize {
            return Err(bad("a copied chunk whose length disagrees with its header"));
        }
        h.seq = U64::new(self.seq);
        h.crc32 = U32::new(h.compute_crc(payload));
        self.frame.clear();
        self.frame.extend_from_slice(h.as_bytes());
        self.frame.extend_from_slice(payload);
        self.emit_frame()?;
        match h.kind.get() {
            kind::EVENTS => self.events += h.count.get() as u64,
            kind::LOST => {
                if let Ok((l, _)) = postcard::take_from_bytes::<Lost>(payload) {
                    self.lost += l.count;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Says that a flight recorder overwrote a thread's oldest events (FORMAT.md 6.8, since 2.4).
    pub fn dropped(&mut self, d: &Dropped) -> Result<()> {
        let ts = (d.first_ticks, d.last_ticks);
        self.record(Place { ts, ..Place::meta(kind::DROPPED, d.thread_id, 1) }, d, "dropped")
    }

    /// Writes performance counter samples as a COUNTERS chunk (FORMAT.md 6.9, since 2.5), compressed.
    pub fn counters(&mut self, c: &CounterSamples) -> Result<()> {
        self.flush_code()?;
        self.raw.clear();
        postcard::to_io(c, &mut self.raw).map_err(|source| Error::Encode { what: "counters", source })?;
        self.emit(Place::meta(kind::COUNTERS, 0, c.samples.len().max(1) as u32), Zstd::Events)
    }

    /// Writes code objects as one CODE chunk, with their `linetable` (encoded from `positions` when empty).
    pub fn code_objects(&mut self, objects: &[CodeObject]) -> Result<()> {
        self.add_code_objects(objects)?;
        self.flush_code()
    }

    /// Adds code objects to the CODE chunk being built, compressing them as they come: a recorder that
    /// hands over code objects while the program runs pays little for them when it stops. Each call ends
    /// with a flush of the zstd stream, so no input waits in zstd's block buffer (up to 128 KB, which the
    /// stop then compressed); a flush per batch of 64 code objects costs 0.3% of the compressed size of
    /// pyperf's start-up code objects (195,232 -> 195,880 bytes at level 6). The chunk is
    /// written before the next chunk of any other kind (so it precedes the events that use its ids), by
    /// [`Writer::flush_code`], or when it holds the most records a chunk may.
    pub fn add_code_objects(&mut self, objects: &[CodeObject]) -> Result<()> {
        let mut one = Vec::new();
        for c in objects {
            if self.code.count == 0 {
                self.raw.clear();
                self.stored.clear();
            }
            let start = self.raw.len();
            frame_code(c, &mut one, &mut self.raw)?;
            if self.opts.compress {
                let level = self.opts.meta_level;
                let code = &mut self.code;
                let z = match &mut code.zstd {
                    Some(z) => z,
                    None => code
                        .zstd
                        .insert(Kept::take(&CODE, level, || code_encoder(level)).map_err(|e| io_err(&self.path, e))?),
                };
                let mut input = InBuffer::around(&self.raw[start..]);
                stream_into(&mut self.stored, |out| {
                    z.run(&mut input, out)?;
                    Ok(input.pos() == input.src.len())
                })
                .map_err(|e| io_err(&self.path, e))?;
            }
            self.code.count += 1;
            self.bases.insert(c.id, c.bytecode.clone());
            if self.code.count >= crate::chunk::MAX_CHUNK_RECORDS {
                self.flush_code()?;
            }
        }
        if let Some(z) = self.code.zstd.as_mut().filter(|_| self.code.count > 0) {
            stream_into(&mut self.stored, |out| Ok(z.flush(out)? == 0)).map_err(|e| io_err(&self.path, e))?;
        }
        Ok(())
    }

    /// Writes the CODE chunk being built, if it has any code object.
    pub fn flush_code(&mut self) -> Result<()> {
        if self.code.count == 0 {
            return Ok(());
        }
        let mut compressed = false;
        if let Some(z) = self.code.zstd.as_mut() {
            stream_into(&mut self.stored, |out| Ok(z.finish(out, true)? == 0)).map_err(|e| io_err(&self.path, e))?;
            z.reinit().map_err(|e| io_err(&self.path, e))?;
            // A small payload can grow by zstd's frame header: then it is stored as it is.
            compressed = self.stored.len() < self.raw.len();
        }
        let count = std::mem::take(&mut self.code.count);
        self.write_chunk(Place::meta(kind::CODE, 0, count), compressed)
    }

    /// Writes specialized-bytecode snapshots as SNAPSHOT chunks (FORMAT.md 6.4): the inline cache
    /// units cleared, then XORed with the code object's base bytecode, so only specialized opcodes (and
    /// changed arguments) are left, and they compress to little.
    pub fn snapshots(&mut self, snapshots: &[CodeSnapshot]) -> Result<()> {
        self.flush_code()?;
        for part in snapshots.chunks(crate::chunk::MAX_CHUNK_RECORDS as usize) {
            self.raw.clear();
            for s in part {
                // Framed as `push_framed` frames a `CodeSnapshot` (postcard: the id and the bytes' length as
                // varints, then the bytes), written in place: the XOR is as long as the snapshot, so the
                // frame's length is known before it, and no buffer per snapshot is needed. The stop waits
                // for this (3,247 snapshots in sqlglot's run).
                let len = s.bytecode.len();
                push_varint(&mut self.raw, (varint_len(u64::from(s.id)) + varint_len(len as u64) + len) as u64);
                push_varint(&mut self.raw, u64::from(s.id));
                push_varint(&mut self.raw, len as u64);
                match self.bases.get(&s.id) {
                    Some(base) => xor_clearing_caches(&s.bytecode, base, &self.cache_entries, &mut self.raw),
                    None => self.raw.extend_from_slice(&s.bytecode),
                }
            }
            self.emit(Place::meta(kind::SNAPSHOT, 0, part.len() as u32), Zstd::Events)?;
        }
        Ok(())
    }

    /// Writes the recorder's cost per event kind (before the first events).
    pub fn calibration(&mut self, c: &Calibration) -> Result<()> {
        self.record(Place::meta(kind::CALIBRATION, 0, 1), c, "calibration")
    }

    /// Names the recording's ring file (since 2.3).
    pub fn ring(&mut self, info: &RingInfo) -> Result<()> {
        self.record(Place::meta(kind::RING, 0, 1), info, "ring")
    }

    /// Writes C callables as one CFUNC chunk (FORMAT.md 6.11, since 2.7), compressed.
    pub fn c_functions(&mut self, functions: &[CFunction]) -> Result<()> {
        self.flush_code()?;
        let mut one = Vec::new();
        for part in functions.chunks(crate::chunk::MAX_CHUNK_RECORDS as usize) {
            self.raw.clear();
            for f in part {
                push_framed(f, &mut one, &mut self.raw, "C function")?;
            }
            self.emit(Place::meta(kind::CFUNC, 0, part.len() as u32), Zstd::Events)?;
        }
        Ok(())
    }

    /// Says which run of several processes the file belongs to (FORMAT.md 6.10, since 2.6).
    pub fn process(&mut self, info: &ProcessInfo) -> Result<()> {
        self.record(Place::meta(kind::PROCESS, 0, 1), info, "process")
    }

    /// Names a thread.
    pub fn thread(&mut self, info: &ThreadInfo) -> Result<()> {
        self.record(Place::meta(kind::THREAD, info.thread_id, 1), info, "thread")
    }

    /// Counts dropped events.
    pub fn lost(&mut self, lost: &Lost) -> Result<()> {
        let ts = (lost.first_ticks, lost.last_ticks);
        self.record(Place { ts, ..Place::meta(kind::LOST, lost.thread_id, 1) }, lost, "lost")?;
        self.lost += lost.count;
        Ok(())
    }

    /// Writes the trailer (its `events`, `lost` and `chunks` are filled in from what was written),
    /// flushes, and returns the underlying writer.
    pub fn finish(mut self, mut trailer: Trailer) -> Result<W> {
        trailer.events = self.events;
        trailer.lost = self.lost;
        trailer.chunks = self.seq;
        self.record(Place::meta(kind::TRAILER, 0, 1), &trailer, "trailer")?;
        Ok(self.out)
    }

    /// The underlying writer as it is, without a trailer: the start of a file whose other chunks come
    /// from elsewhere.
    pub fn finish_open(self) -> W {
        self.out
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| io_err(&self.path, e))
    }

    /// Access to the underlying writer (e.g. to fsync a file).
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Writes one postcard record as an uncompressed chunk.
    fn record<T: Serialize>(&mut self, place: Place, value: &T, what: &'static str) -> Result<()> {
        self.flush_code()?;
        self.raw.clear();
        postcard::to_io(value, &mut self.raw).map_err(|source| Error::Encode { what, source })?;
        self.emit(place, Zstd::No)
    }

    /// Compresses `self.raw` if asked and allowed, and writes header + payload as one chunk.
    fn emit(&mut self, place: Place, how: Zstd) -> Result<()> {
        let compress = self.compress(how)?;
        self.write_chunk(place, compress)
    }

    /// Compresses `self.raw` into `self.stored` if asked and allowed; whether the chunk is to be compressed.
    fn compress(&mut self, how: Zstd) -> Result<bool> {
        let mut compress = self.opts.compress && how != Zstd::No;
        if compress {
            self.stored.clear();
            self.stored.reserve(zstd::zstd_safe::compress_bound(self.raw.len()));
            let z = if how == Zstd::Events && self.raw.len() < SMALL_RAW && self.opts.level > SMALL_LEVEL {
                match &mut self.zstd_small {
                    Some(z) => z,
                    small => small.insert(
                        Kept::take(&BULK, SMALL_LEVEL, || zstd::bulk::Compressor::new(SMALL_LEVEL))
                            .map_err(|e| io_err(&self.path, e))?,
                    ),
                }
            } else {
                &mut self.zstd
            };
            z.compress_to_buffer(&self.raw, &mut self.stored).map_err(|e| io_err(&self.path, e))?;
            // A small payload can grow by zstd's frame header: then it is stored as it is.
            compress = self.stored.len() < self.raw.len();
        }
        Ok(compress)
    }

    /// Writes header + payload as one chunk: `self.stored` (zstd) if `compressed`, else `self.raw`.
    fn write_chunk(&mut self, place: Place, compress: bool) -> Result<()> {
        let Place { kind, transform, thread_id, ts: (first_ts, last_ts), count } = place;
        let payload: &[u8] = if compress { &self.stored } else { &self.raw };
        let codec = transform | if compress { codec::ZSTD } else { codec::NONE };
        let mut h = ChunkHeader {
            sync: SYNC,
            kind: U16::new(kind),
            codec,
            flags: 0,
            stored_len: U32::new(payload.len() as u32),
            raw_len: U32::new(self.raw.len() as u32),
            thread_id: U64::new(thread_id),
            seq: U64::new(if self.divert.is_some() { 0 } else { self.seq }),
            first_ts: U64::new(first_ts),
            last_ts: U64::new(last_ts),
            count: U32::new(count),
            crc32: U32::new(0),
        };
        h.crc32 = U32::new(h.compute_crc(payload));
        // One buffer, one write: a reader never sees a header without the payload the writer meant.
        let total = crate::chunk::CHUNK_HEADER_LEN + payload.len();
        self.frame.clear();
        self.frame.reserve(total);
        self.frame.extend_from_slice(h.as_bytes());
        self.frame.extend_from_slice(payload);
        if let Some(d) = self.divert.as_mut() {
            d.push(self.frame.clone());
            return Ok(());
        }
        self.emit_frame()
    }

    /// Writes `self.frame` (a whole chunk with this file's sequence number) and counts it.
    fn emit_frame(&mut self) -> Result<()> {
        self.out.write_all(&self.frame).map_err(|e| io_err(&self.path, e))?;
        if !self.hold_flush {
            self.out.flush().map_err(|e| io_err(&self.path, e))?;
        }
        if let Some(t) = self.tee.as_mut() {
            t.extend_from_slice(&self.frame);
        }
        self.seq += 1;
        self.bytes += self.frame.len() as u64;
        Ok(())
    }
}

/// What a chunk's header says besides its payload (FORMAT.md 3.1).
#[derive(Clone, Copy)]
struct Place {
    kind: u16,
    transform: u8,
    thread_id: u64,
    ts: (u64, u64),
    count: u32,
}

impl Place {
    /// A metadata chunk: no transform, no time range.
    fn meta(kind: u16, thread_id: u64, count: u32) -> Self {
        Place { kind, transform: codec::NONE, thread_id, ts: (0, 0), count }
    }
}

/// Whether a chunk is compressed (with the events' context), or stored as it is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zstd {
    No,
    Events,
}

/// Appends `item` as a framed record: postcard's encoding of a byte string (varint length, then the
/// record's postcard bytes, built in `one`).
/// Appends code object `c` to `out` as a framed `CodeObject` record (FORMAT.md 6.1), with its location
/// table (encoded from `positions` when it has none); `one` is scratch space.
pub fn frame_code(c: &CodeObject, one: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<()> {
    let lines: Cow<'_, [u8]> = if c.linetable.is_empty() && !c.positions.is_empty() {
        Cow::Owned(crate::linetable::encode(&c.positions, c.first_line))
    } else {
        Cow::Borrowed(c.linetable.as_slice())
    };
    let record = CodeRecord {
        id: c.id,
        name: Cow::Borrowed(&c.name),
        qualname: Cow::Borrowed(&c.qualname),
        filename: Cow::Borrowed(&c.filename),
        first_line: c.first_line,
        flags: c.flags,
        bytecode: Cow::Borrowed(c.bytecode.as_slice()),
        lines: serde_bytes::Bytes::new(&lines),
    };
    push_framed(&record, one, out, "code object")
}

/// Appends C callable `f` to `out` as a framed `CFunction` record (FORMAT.md 6.11), as a ring file's
/// metadata holds it.
pub fn frame_c_function(f: &CFunction, out: &mut Vec<u8>) -> Result<()> {
    push_framed(f, &mut Vec::new(), out, "C function")
}

fn push_framed<T: Serialize>(item: &T, one: &mut Vec<u8>, out: &mut Vec<u8>, what: &'static str) -> Result<()> {
    one.clear();
    postcard::to_io(item, &mut *one).map_err(|source| Error::Encode { what, source })?;
    postcard::to_io(serde_bytes::Bytes::new(one), out).map_err(|source| Error::Encode { what, source })?;
    Ok(())
}

/// zstd contexts of writers that are done, for the process's next writers: a context's first frame
/// allocates and clears its tables (~0.3 MiB for events, ~0.5 MiB for code objects, page faults
/// included), which a recording that writes little (a test's, under `pytest --ocular DIR`, or a flight
/// recorder's dump) paid at every start and stop. A few of each, by level.
static BULK: std::sync::Mutex<Vec<(i32, zstd::bulk::Compressor<'static>)>> = std::sync::Mutex::new(Vec::new());
static CODE: std::sync::Mutex<Vec<(i32, StreamEncoder<'static>)>> = std::sync::Mutex::new(Vec::new());
/// Chunks through the events' context under this many bytes before compression (the last buffers of
/// short threads, ~10 bytes an event) are compressed at [`SMALL_LEVEL`]. zstd builds its literals' Huffman
/// table for each chunk, most of its time on a small one: on a thread per request's last buffers (226 bytes
/// each), level 1 took 4.2 us a chunk to store 0.78 of them, level -1 (literals as they are) 1.2 us to store
/// 0.84; on an HTTP server's request threads (2-8 KiB), 9.7-13 us against 4.8-7.7, storing 0.35 against
/// 0.37-0.39. That is the writer's CPU, which a busy server's own threads compete with; a full buffer (128
/// KiB and up) stays at the writer's level.
const SMALL_RAW: usize = 8 << 10;
const SMALL_LEVEL: i32 = -1;

/// Contexts of each kind kept at the most (a writer alive at once, mostly one, takes one of each level).
const KEPT: usize = 3;

/// What a context is reset with before another writer gets it.
trait Reset {
    /// False if it cannot be reused.
    fn reset(&mut self) -> bool;
}

impl Reset for zstd::bulk::Compressor<'static> {
    fn reset(&mut self) -> bool {
        true // each compression is a frame of its own
    }
}

impl Reset for StreamEncoder<'static> {
    fn reset(&mut self) -> bool {
        // A writer dropped in the middle of a CODE chunk leaves its frame open: the next starts anew.
        self.reinit().is_ok()
    }
}

/// A zstd context taken from a pool ([`BULK`], [`CODE`]), given back when dropped.
struct Kept<T: Reset + 'static> {
    item: Option<T>,
    level: i32,
    pool: &'static std::sync::Mutex<Vec<(i32, T)>>,
}

impl<T: Reset + 'static> Kept<T> {
    /// A context of `level` from `pool`, or a new one made by `make`.
    fn take(
        pool: &'static std::sync::Mutex<Vec<(i32, T)>>,
        level: i32,
        make: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<Self> {
        let found = {
            let mut kept = pool.lock().unwrap_or_else(|e| e.into_inner());
            kept.iter().position(|(l, _)| *l == level).map(|i| kept.swap_remove(i).1)
        };
        let item = match found {
            Some(item) => item,
            None => make()?,
        };
        Ok(Kept { item: Some(item), level, pool })
    }
}

impl<T: Reset + 'static> std::ops::Deref for Kept<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("present until dropped")
    }
}

impl<T: Reset + 'static> std::ops::DerefMut for Kept<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().expect("present until dropped")
    }
}

impl<T: Reset + 'static> Drop for Kept<T> {
    fn drop(&mut self) {
        let Some(mut item) = self.item.take() else { return };
        if !item.reset() {
            return;
        }
        let mut kept = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT {
            kept.push((self.level, item));
        }
    }
}

/// The stream encoder of CODE chunks: `level`'s strategy with a 256 KiB window and 64 Ki-entry tables
/// instead of the level's own (2 MiB and up to 512 Ki at level 6: ~5.5 MB of context, which a recording's
/// first code objects waited for, set up and zeroed; the stop of an empty script took 4.5 ms, 1.9 with
/// these). Each CODE chunk is a frame of its own, most far below the window; at level 6, sqlglot's 1,502
/// code objects came to 377,551 bytes against 375,322.
fn code_encoder(level: i32) -> std::io::Result<StreamEncoder<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut z = StreamEncoder::new(level)?;
    for p in [CParameter::WindowLog(18), CParameter::HashLog(16), CParameter::ChainLog(16)] {
        z.set_parameter(p)?;
    }
    Ok(z)
}

/// Runs a zstd streaming step into the end of `out`, with room for one output block each time, until
/// `step` says it is done.
fn stream_into(
    out: &mut Vec<u8>,
    mut step: impl FnMut(&mut OutBuffer<'_, Vec<u8>>) -> std::io::Result<bool>,
) -> std::io::Result<()> {
    loop {
        out.reserve(zstd::zstd_safe::CCtx::out_size());
        let at = out.len();
        if step(&mut OutBuffer::around_pos(out, at))? {
            return Ok(());
        }
    }
}

/// Zeroes, in a snapshot XORed with `base`, the inline cache units that follow each instruction of `base`
/// (so the reader restores them as the base's zeros). The walk follows the base bytecode, which is never
/// instrumented, so an INSTRUMENTED_* opcode left in the snapshot cannot shift it. The two steps apart, as
/// the reference [`xor_clearing_caches`] is tested against.
#[cfg(test)]
fn clear_caches(xored: &mut [u8], base: &[u8], cache_entries: &[u8]) {
    let mut i = 0;
    while i + 1 < base.len() {
        let caches = cache_entries.get(base[i] as usize).copied().unwrap_or(0) as usize;
        let end = (i + 2 + 2 * caches).min(base.len()).min(xored.len());
        if let Some(units) = xored.get_mut((i + 2).min(end)..end) {
            units.fill(0);
        }
        i += 2 + 2 * caches;
    }
}

/// `bytes` XOR `base` with the inline cache units that follow each instruction of `base` zeroed (so the
/// reader restores them as the base's zeros), into `out`, in one pass over the base's instructions: the walk
/// follows the base bytecode, which is never instrumented, so an INSTRUMENTED_* opcode left in the snapshot
/// cannot shift it. What [`xor`] then `clear_caches` make, without a buffer per snapshot nor a second pass.
fn xor_clearing_caches(bytes: &[u8], base: &[u8], cache_entries: &[u8], out: &mut Vec<u8>) {
    let n = bytes.len().min(base.len());
    let start = out.len();
    out.reserve(bytes.len());
    // Two zipped slices, vectorized, then a walk over the base's instructions zeroes their caches.
    out.extend(bytes[..n].iter().zip(&base[..n]).map(|(a, b)| a ^ b));
    let xored = &mut out[start..];
    let mut i = 0;
    while i + 2 < n {
        let next = i + 2 + 2 * cache_entries.get(base[i] as usize).copied().unwrap_or(0) as usize;
        xored[i + 2..next.min(n)].fill(0);
        i = next;
    }
    out.extend_from_slice(&bytes[n..]);
}

/// Appends `v` as postcard writes an unsigned integer: LEB128, seven bits a byte, low bits first.
fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// How many bytes [`push_varint`] writes for `v`.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// `bytes` XOR `base`, byte by byte; bytes beyond the base's length (or all, without a base) as they are.
/// Its own inverse.
pub(crate) fn xor(bytes: &[u8], base: Option<&Vec<u8>>) -> Vec<u8> {
    let base = base.map_or(&[][..], |b| b.as_slice());
    let n = bytes.len().min(base.len());
    let mut out = Vec::with_capacity(bytes.len());
    // Two zipped slices, no bounds check per byte: the compiler vectorizes this.
    out.extend(bytes[..n].iter().zip(&base[..n]).map(|(a, b)| a ^ b));
    out.extend_from_slice(&bytes[n..]);
    out
}

fn io_err(path: &str, source: std::io::Error) -> Error {
    Error::Io { path: path.to_owned(), error: source }
}

#[cfg(test)]
mod tests {
    use super::{clear_caches, xor, xor_clearing_caches, Writer, WriterOptions};
    use crate::meta::CodeObject;

    #[test]
    fn each_batch_of_code_objects_is_compressed_when_it_is_added() {
        let mut w = Writer::new(Vec::new(), "<memory>", &crate::testing::header(), WriterOptions::default()).unwrap();
        let batch: Vec<CodeObject> = (1..=64)
            .map(|id| CodeObject {
                id,
                name: format!("f{id}"),
                qualname: format!("Module.f{id}"),
                filename: "/src/module.py".into(),
                first_line: id * 3,
                flags: 3,
                bytecode: vec![151, 0, 100, 1, 83, 0],
                linetable: vec![0x80, 0x00, 0xd8, 0x04, 0x05],
                positions: Vec::new(),
            })
            .collect();
        w.add_code_objects(&batch).unwrap();
        // Far below zstd's 128 KB block: without the flush, all of it would still wait in zstd's buffer.
        let (raw, stored) = (w.raw.len(), w.stored.len());
        assert!(raw > 2_000 && raw < 128 << 10, "{raw}");
        assert!(stored > 100, "only {stored} compressed bytes out of {raw} after the batch");
    }

    #[test]
    fn small_event_chunks_are_compressed_at_the_small_level_and_read_back() {
        use crate::{Body, RawEvent, ReadOptions, Reader, Trailer};
        let events = |n: u64, seed: u64| -> Vec<RawEvent> {
            (0..n)
                .map(|i| {
                    // A few calls and returns again and again, each after a little while of its own.
                    let r = (i + seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                    let t = 1_000 + 400 * i + (r % 97) * (r % 13);
                    RawEvent::new(t, (i % 3) as u32, (i % 4) as u32 * 2, 0, (i % 2) as u8)
                })
                .collect()
        };
        let mut w = Writer::new(Vec::new(), "<memory>", &crate::testing::header(), WriterOptions::default()).unwrap();
        let (small, large) = (events(200, 1), events(5_000, 2));
        w.events(1, &small).unwrap();
        assert!(w.raw.len() < super::SMALL_RAW, "{}", w.raw.len());
        assert_eq!(w.stored, zstd::bulk::compress(&w.raw, super::SMALL_LEVEL).unwrap());
        assert_ne!(w.stored, zstd::bulk::compress(&w.raw, 1).unwrap());
        w.events(2, &large).unwrap();
        assert!(w.raw.len() > super::SMALL_RAW);
        assert_eq!(w.stored, zstd::bulk::compress(&w.raw, 1).unwrap());
        let end = Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 0, events: 0, lost: 0, chunks: 0 };
        let bytes = w.finish(end).unwrap();
        let mut r = Reader::new(std::io::Cursor::new(bytes), "<memory>", ReadOptions::default()).unwrap();
        let mut read = Vec::new();
        while let Some(c) = r.next_chunk().unwrap() {
            if let Body::Events(ev) = c.body {
                read.push((c.info.thread_id, ev.to_vec()));
            }
        }
        assert_eq!(read, vec![(1, small), (2, large)]);
        assert!(r.report().clean());
    }

    #[test]
    fn xor_keeps_the_bytes_past_the_base_and_undoes_itself() {
        let base = vec![151, 0, 93, 2, 140, 4];
        let snap = [151, 0, 194, 2, 140, 4, 83, 0];
        let x = xor(&snap, Some(&base));
        assert_eq!(x, [0, 0, 194 ^ 93, 0, 0, 0, 83, 0]);
        assert_eq!(xor(&x, Some(&base)), snap);
        // A base longer than the snapshot, and no base at all.
        assert_eq!(xor(&snap[..2], Some(&base)), [0, 0]);
        assert_eq!(xor(&snap, None), snap);
    }

    #[test]
    fn clear_caches_zeroes_only_the_cache_units_after_each_instruction() {
        let mut cache_entries = vec![0u8; 256];
        cache_entries[93] = 1; // FOR_ITER: one cache unit
        let base = [151, 0, 93, 2, 0, 0, 140, 4];
        let mut x = vec![1, 1, 1, 1, 7, 7, 1, 1];
        clear_caches(&mut x, &base, &cache_entries);
        assert_eq!(x, [1, 1, 1, 1, 0, 0, 1, 1]);
    }

    #[test]
    fn one_pass_equals_xor_then_clearing_the_caches() {
        let mut cache_entries = vec![0u8; 256];
        cache_entries[93] = 1;
        cache_entries[94] = 3;
        cache_entries[250] = 9;
        // Pseudo-random bytecode of every shape: snapshots longer, shorter and as long as their base, odd
        // lengths, cache units running past the end, and opcodes that index past a short table.
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let opcodes = [93u8, 94, 250, 1, 151, 255];
        for case in 0..2000 {
            let len = (next() % 40) as usize;
            let base: Vec<u8> =
                (0..len).map(|i| if i % 2 == 0 { opcodes[(next() % 6) as usize] } else { next() as u8 }).collect();
            let snap_len = match case % 3 {
                0 => len,
                1 => (next() % 50) as usize,
                _ => len.saturating_sub((next() % 5) as usize),
            };
            let snap: Vec<u8> = (0..snap_len).map(|_| next() as u8).collect();
            let table: &[u8] = if case % 7 == 0 { &cache_entries[..100] } else { &cache_entries };
            let mut expected = xor(&snap, Some(&base));
            clear_caches(&mut expected, &base, table);
            // Appended after what the chunk already holds.
            let mut got = vec![42; case % 3];
            let before = got.clone();
            xor_clearing_caches(&snap, &base, table, &mut got);
            assert_eq!(got[..before.len()], before[..], "case {case}");
            assert_eq!(got[before.len()..], expected[..], "case {case}: base {base:?} snapshot {snap:?}");
        }
    }

    #[test]
    fn snapshots_are_framed_as_postcard_frames_them() {
        use super::{push_framed, push_varint, varint_len};
        use crate::meta::CodeSnapshot;
        for v in [0u64, 1, 0x7f, 0x80, 0x3fff, 0x4000, u64::from(u32::MAX), u64::MAX] {
            let mut ours = Vec::new();
            push_varint(&mut ours, v);
            assert_eq!(ours, postcard::to_allocvec(&v).unwrap(), "{v}");
            assert_eq!(varint_len(v), ours.len(), "{v}");
        }
        // Without a base (no code object of that id), a snapshot's frame is its postcard frame.
        let mut w = Writer::new(Vec::new(), "<memory>", &crate::testing::header(), WriterOptions::default()).unwrap();
        let snaps: Vec<CodeSnapshot> = [(1u32, 0usize), (127, 1), (128, 127), (300, 128), (0x8000_0001, 20_000)]
            .iter()
            .map(|&(id, len)| CodeSnapshot { id, bytecode: (0..len).map(|i| (i * 7) as u8).collect() })
            .collect();
        w.snapshots(&snaps).unwrap();
        let (mut one, mut expected) = (Vec::new(), Vec::new());
        for s in &snaps {
            push_framed(s, &mut one, &mut expected, "code snapshot").unwrap();
        }
        assert_eq!(w.raw, expected);
    }
}
