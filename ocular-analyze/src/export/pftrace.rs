//! Native Perfetto traces (`.pftrace`): `TracePacket`s with `TrackEvent`s and interned names, streamed.
//!
//! The messages below are the subset of Perfetto's `protos/perfetto/trace/` that this exporter writes,
//! declared for prost. Field numbers and types were read from the descriptors of the `perfetto` PyPI
//! package's `perfetto_trace_pb2` (0.59.1), which the tests also use to decode our output. (The
//! `perfetto_protos` crate generates all of Perfetto's protos at build time: 3 min 40 s on this machine
//! for the five messages used here.)
//!
//! Layout: a `Trace` is `repeated TracePacket packet = 1`, so writing each packet as field 1 (tag `0x0a`,
//! varint length, bytes) produces a valid trace without holding it. Sequence 1 carries the track
//! descriptors. Each thread's events go on a sequence of their own, as Perfetto's SDK writes them: its first
//! packet clears the sequence's incremental state and sets its defaults (the thread's track, and clock 64,
//! an incremental clock anchored to BOOTTIME by a clock snapshot), so every event packet carries the time
//! since the previous one (a byte or two) and no track id. Names are interned per sequence on first use.

use super::timeline::{Item, Timeline};
use crate::codemap::CodeMap;
use ocular_format::ReadOptions;
use prost::Message;
use rustc_hash::FxHashSet as HashSet;
use std::io::Write;
use std::path::Path;

#[derive(Clone, PartialEq, Message)]
struct TracePacket {
    #[prost(message, optional, tag = "6")]
    clock_snapshot: Option<ClockSnapshot>,
    #[prost(uint64, optional, tag = "8")]
    timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "12")]
    interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "59")]
    trace_packet_defaults: Option<TracePacketDefaults>,
    #[prost(message, optional, tag = "60")]
    track_descriptor: Option<TrackDescriptor>,
    #[prost(uint32, optional, tag = "58")]
    timestamp_clock_id: Option<u32>,
}

#[derive(Clone, PartialEq, Message)]
struct ClockSnapshot {
    #[prost(message, repeated, tag = "1")]
    clocks: Vec<Clock>,
}

#[derive(Clone, PartialEq, Message)]
struct Clock {
    #[prost(uint32, optional, tag = "1")]
    clock_id: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    timestamp: Option<u64>,
    #[prost(bool, optional, tag = "3")]
    is_incremental: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct TracePacketDefaults {
    #[prost(uint32, optional, tag = "58")]
    timestamp_clock_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event_defaults: Option<TrackEventDefaults>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackEventDefaults {
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
    #[prost(message, optional, tag = "3")]
    process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    thread: Option<ThreadDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    counter: Option<CounterDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct CounterDescriptor {
    #[prost(int32, optional, tag = "3")]
    unit: Option<i32>,
    #[prost(string, optional, tag = "6")]
    unit_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    process_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(int64, optional, tag = "2")]
    tid: Option<i64>,
    #[prost(string, optional, tag = "5")]
    thread_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackEvent {
    #[prost(int32, optional, tag = "9")]
    r#type: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    name_iid: Option<u64>,
    #[prost(message, repeated, tag = "4")]
    debug_annotations: Vec<DebugAnnotation>,
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
    #[prost(int64, optional, tag = "30")]
    counter_value: Option<i64>,
    #[prost(string, optional, tag = "23")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct DebugAnnotation {
    #[prost(uint64, optional, tag = "1")]
    name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    uint_value: Option<u64>,
    #[prost(string, optional, tag = "6")]
    string_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct InternedData {
    #[prost(message, repeated, tag = "2")]
    event_names: Vec<EventName>,
    #[prost(message, repeated, tag = "3")]
    debug_annotation_names: Vec<DebugAnnotationName>,
}

#[derive(Clone, PartialEq, Message)]
struct DebugAnnotationName {
    #[prost(uint64, optional, tag = "1")]
    iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct EventName {
    #[prost(uint64, optional, tag = "1")]
    iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
}

const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;
/// `CounterDescriptor.Unit`.
const UNIT_TIME_NS: i32 = 1;
const UNIT_COUNT: i32 = 2;
/// The sequence of the counter samples: absolute BOOTTIME timestamps (a file's samples are in time order
/// per drain of the kernel's buffers, not merged with the events, so they cannot share the threads'
/// delta clocks).
const COUNTERS: u32 = u32::MAX >> 1;
/// Counter tracks' uuids: above every thread id, then the thread id and the counter's index.
const COUNTER_TRACK: u64 = 1 << 62;
/// Track uuids of asyncio tasks: this bit, the file's place in its run << 48, the task's index.
const TASK_TRACK: u64 = 1 << 61;
/// The packet sequence of a file's task slices: below the counters'.
const TASKS: u32 = u32::MAX >> 2;
/// Track uuids of spans (FORMAT.md 5.9): this bit, the file's place in its run << 48, and a thread's id
/// with bit 45 set (its spans nest) or a coroutine's frame id (below 2^45: an address / 8).
const SPAN_TRACK: u64 = 1 << 60;
/// The packet sequence of a file's span slices: below the tasks'.
const SPANS: u32 = u32::MAX >> 3;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// The sequence of the track descriptors; threads' sequences follow it.
const DESCRIPTORS: u32 = 1;
/// Perfetto's first sequence-scoped clock id, made incremental on each thread's sequence.
const DELTA_CLOCK: u32 = 64;
const BOOTTIME: u32 = 6;
/// Interned name id of "loop"; a function's is its code id + 1 (small ids are short varints).
const LOOP_IID: u64 = 1;
/// Interned debug annotation names, declared in the first packet (no string per loop event).
const UOPS_IID: u64 = 1;
const CYCLES_IID: u64 = 2;
/// Interned name of the instant that marks events the recorder dropped (above every code id + 1), and of
/// its count annotation.
const LOST_IID: u64 = 1 << 40;
const LOST_COUNT_IID: u64 = 3;

struct Out<'a> {
    w: &'a mut dyn Write,
    buf: Vec<u8>,
    packets: u64,
    /// Packets not yet handed to `w`: a call through `dyn Write` per packet of ~20 bytes took more than
    /// encoding it.
    pending: Vec<u8>,
}

/// Bytes of packets [`Out`] gathers before it writes them.
const PENDING: usize = 64 << 10;

impl<'a> Out<'a> {
    fn new(w: &'a mut dyn Write) -> Self {
        Out { w, buf: Vec::new(), packets: 0, pending: Vec::with_capacity(PENDING + MAX_PACKET) }
    }

    /// Appends a packet's bytes, writing what is gathered once it reaches [`PENDING`].
    #[inline]
    fn put(w: &mut dyn Write, pending: &mut Vec<u8>, bytes: &[u8]) -> std::io::Result<()> {
        pending.extend_from_slice(bytes);
        if pending.len() >= PENDING {
            w.write_all(pending)?;
            pending.clear();
        }
        Ok(())
    }

    /// Writes every packet gathered, and flushes `w`.
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.write_all(&self.pending)?;
        self.pending.clear();
        self.w.flush()
    }

    /// Writes one packet on sequence `seq`; `flags` are its sequence flags, if any.
    fn packet(&mut self, seq: u32, flags: Option<u32>, mut p: TracePacket) -> std::io::Result<()> {
        p.trusted_packet_sequence_id = Some(seq);
        p.sequence_flags = flags;
        self.buf.clear();
        self.buf.push(0x0a); // Trace.packet: field 1, length-delimited
        p.encode_length_delimited(&mut self.buf).map_err(std::io::Error::other)?;
        self.packets += 1;
        Self::put(self.w, &mut self.pending, &self.buf)
    }

    /// Writes the packet of a slice's begin or end, or of an instant, on a thread's sequence, as
    /// [`Out::packet`] writes `TracePacket { timestamp: delta, track_event: TrackEvent { type: kind,
    /// name_iid, debug_annotations }, .. }` with the sequence's flags (the same bytes: fields in the order of
    /// their numbers, as prost writes them), built directly: nearly every packet of a trace is one of these.
    /// `annotations`: debug annotations of interned names and unsigned values.
    #[inline(always)]
    fn track_packet(
        &mut self,
        seq: u32,
        delta: u64,
        kind: i32,
        name_iid: Option<u64>,
        annotations: &[(u64, u64)],
    ) -> std::io::Result<()> {
        // The nested messages' lengths first, then every byte into one buffer: encoding each message on its
        // own and copying it into its parent was a fifth of the export's time. Every field number here is
        // below 16, so each key is one byte.
        let annotations = &annotations[..annotations.len().min(2)];
        let annotation_len = |&(name_iid, value): &(u64, u64)| 2 + varint_len(name_iid) + varint_len(value);
        let kind = kind as i64 as u64;
        let mut te_len = 1 + varint_len(kind) + name_iid.map_or(0, |iid| 1 + varint_len(iid));
        for a in annotations {
            let n = annotation_len(a);
            te_len += 1 + varint_len(n as u64) + n;
        }
        let flags = u64::from(SEQ_NEEDS_INCREMENTAL_STATE);
        let p_len = 2
            + varint_len(delta)
            + varint_len(u64::from(seq))
            + 1
            + varint_len(te_len as u64)
            + te_len
            + 1
            + varint_len(flags);
        // Encoded where it goes, in the spare room of the bytes gathered: a packet built on the stack and
        // copied there cost a `memcpy` call, and zeroing the stack buffer as much again.
        self.pending.reserve(MAX_PACKET);
        let len = self.pending.len();
        let mut out = Bytes { b: self.pending.spare_capacity_mut()[..MAX_PACKET].as_mut_ptr().cast(), n: 0 };
        out.len_key(1, p_len);
        out.varint_field(8, delta);
        out.varint_field(10, u64::from(seq));
        out.len_key(11, te_len);
        for a in annotations {
            out.len_key(4, annotation_len(a));
            out.varint_field(1, a.0);
            out.varint_field(3, a.1);
        }
        out.varint_field(9, kind);
        if let Some(iid) = name_iid {
            out.varint_field(10, iid);
        }
        out.varint_field(13, flags);
        let n = out.n;
        // SAFETY: `out` wrote the first `n` bytes of the spare room, in order.
        unsafe { self.pending.set_len(len + n) };
        self.packets += 1;
        if self.pending.len() >= PENDING {
            self.w.write_all(&self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

/// The bytes of `v` as a varint.
#[inline(always)]
fn varint_len(v: u64) -> usize {
    (70 - (v | 1).leading_zeros() as usize) / 7
}

/// The room reserved for a packet of [`Out::track_packet`]: whatever its values, it writes at most 26
/// varints (a key and a value or length for each of the packet's seven fields, and for each of the three
/// of each of its at most two annotations) of at most 10 bytes each. Its packets take 99 bytes at most.
const MAX_PACKET: usize = 26 * 10;

/// A short protobuf message being encoded into room not yet initialized (`n` bytes of it written), of
/// [`MAX_PACKET`] bytes, without a bounds check on each byte (a check per byte was a quarter of the encoder's
/// instructions): made only by [`Out::track_packet`], whose fixed sequence of fields cannot write past the
/// room (checked in debug builds).
struct Bytes {
    b: *mut u8,
    n: usize,
}

impl Bytes {
    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        debug_assert!(self.n + 10 <= MAX_PACKET, "a packet's room is sized for 26 varints");
        // SAFETY: `b` points to MAX_PACKET writable bytes, and what is written into them is bounded by the
        // number of varints a packet has (see MAX_PACKET), each at most 10 bytes (a u64 in 7-bit groups).
        unsafe {
            while v >= 0x80 {
                self.b.add(self.n).write(v as u8 | 0x80);
                self.n += 1;
                v >>= 7;
            }
            self.b.add(self.n).write(v as u8);
        }
        self.n += 1;
    }

    /// A varint field: its key (wire type 0), then the value.
    #[inline(always)]
    fn varint_field(&mut self, field: u32, v: u64) {
        self.varint(u64::from(field) << 3);
        self.varint(v);
    }

    /// A length-delimited field's key and length (wire type 2), its `len` bytes to follow.
    #[inline(always)]
    fn len_key(&mut self, field: u32, len: usize) {
        self.varint(u64::from(field) << 3 | 2);
        self.varint(len as u64);
    }
}

/// A thread's packet sequence: its id, the time of its last packet, the names interned on it.
struct Sequence {
    id: u32,
    last_ns: u64,
    interned: CodeMap<()>,
}

impl Sequence {
    /// The time from the sequence's last packet to `ns`, for the packet at `ns`. A thread's times only grow;
    /// damaged input could go back, and the delta clock cannot: clamped.
    #[inline]
    fn delta_to(&mut self, ns: u64) -> u64 {
        let delta = ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(ns);
        delta
    }
}

/// The threads' sequences, opened on a thread's first event.
#[derive(Default)]
struct Sequences {
    /// Each thread's position in `list`.
    by_tid: rustc_hash::FxHashMap<u64, usize>,
    list: Vec<Sequence>,
    /// The thread of the last packet and its position: most packets follow one of the same thread, found
    /// without hashing (a lookup per packet was a tenth of the export's instructions).
    last: Option<(u64, usize)>,
}

impl Sequences {
    /// Thread `tid`'s sequence, if it is open.
    #[inline(always)]
    fn open(&mut self, tid: u64) -> Option<&mut Sequence> {
        let i = match self.last {
            Some((t, i)) if t == tid => i,
            _ => {
                let i = *self.by_tid.get(&tid)?;
                self.last = Some((tid, i));
                i
            }
        };
        self.list.get_mut(i)
    }

    /// A slice's begin (`name`: its code id and qualified name) or end on thread `tid` at `ns`: written
    /// directly when the thread's sequence is open and the name interned on it, else as [`Sequences::event`]
    /// writes any track event.
    #[inline(always)]
    fn slice(
        &mut self,
        o: &mut Out<'_>,
        tid: u64,
        ns: u64,
        kind: i32,
        name: Option<(u32, &dyn Fn() -> String)>,
    ) -> std::io::Result<()> {
        let iid = name.map(|(id, _)| u64::from(id) + 1);
        if let Some(seq) = self.open(tid) {
            if name.map_or(true, |(id, _)| seq.interned.contains(id)) {
                let delta = seq.delta_to(ns);
                return o.track_packet(seq.id, delta, kind, iid, &[]);
            }
        }
        self.event(o, tid, ns, track_event(kind, iid), name)
    }

    /// An instant named `name_iid` (interned when the sequence opened) with unsigned annotations (at most
    /// two) on thread `tid` at `ns`: written directly once the thread's sequence is open.
    #[inline]
    fn instant(
        &mut self,
        o: &mut Out<'_>,
        tid: u64,
        ns: u64,
        name_iid: u64,
        annotations: &[(u64, u64)],
    ) -> std::io::Result<()> {
        if let Some(seq) = self.open(tid) {
            let delta = seq.delta_to(ns);
            return o.track_packet(seq.id, delta, INSTANT, Some(name_iid), annotations);
        }
        let mut te = track_event(INSTANT, Some(name_iid));
        te.debug_annotations.extend(annotations.iter().map(|&(k, v)| annotation(k, v)));
        self.event(o, tid, ns, te, None)
    }

    /// Writes a track event for thread `tid` at `ns`, opening the thread's sequence first if needed, and
    /// interning `name` (a code id, with its qualified name) on it if it is new there.
    fn event(
        &mut self,
        o: &mut Out<'_>,
        tid: u64,
        ns: u64,
        te: TrackEvent,
        name: Option<(u32, &dyn Fn() -> String)>,
    ) -> std::io::Result<()> {
        let next = DESCRIPTORS + 1 + self.list.len() as u32;
        let i = match self.by_tid.entry(tid) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                // Clear the sequence's state, anchor the delta clock at `ns`, and set the defaults.
                o.packet(
                    next,
                    Some(SEQ_INCREMENTAL_STATE_CLEARED),
                    TracePacket {
                        clock_snapshot: Some(ClockSnapshot {
                            clocks: vec![
                                Clock { clock_id: Some(DELTA_CLOCK), timestamp: Some(ns), is_incremental: Some(true) },
                                Clock { clock_id: Some(BOOTTIME), timestamp: Some(ns), is_incremental: None },
                            ],
                        }),
                        trace_packet_defaults: Some(TracePacketDefaults {
                            timestamp_clock_id: Some(DELTA_CLOCK),
                            track_event_defaults: Some(TrackEventDefaults { track_uuid: Some(tid) }),
                        }),
                        interned_data: Some(InternedData {
                            event_names: vec![
                                EventName { iid: Some(LOOP_IID), name: Some("loop".into()) },
                                EventName { iid: Some(LOST_IID), name: Some("events lost".into()) },
                            ],
                            debug_annotation_names: vec![
                                DebugAnnotationName { iid: Some(UOPS_IID), name: Some("uops".into()) },
                                DebugAnnotationName { iid: Some(CYCLES_IID), name: Some("cycles".into()) },
                                DebugAnnotationName { iid: Some(LOST_COUNT_IID), name: Some("lost".into()) },
                            ],
                        }),
                        ..Default::default()
                    },
                )?;
                self.list.push(Sequence { id: next, last_ns: ns, interned: CodeMap::default() });
                *v.insert(self.list.len() - 1)
            }
        };
        let seq = &mut self.list[i];
        let delta = seq.delta_to(ns);
        let interned_data = match name {
            Some((id, qualname)) if seq.interned.insert(id, ()) => Some(InternedData {
                event_names: vec![EventName { iid: Some(id as u64 + 1), name: Some(qualname()) }],
                debug_annotation_names: vec![],
            }),
            _ => None,
        };
        let p = TracePacket { timestamp: Some(delta), track_event: Some(te), interned_data, ..Default::default() };
        o.packet(seq.id, Some(SEQ_NEEDS_INCREMENTAL_STATE), p)
    }
}

/// Streams `path` as a Perfetto protobuf trace; returns (packets written, events read) and warnings.
pub fn export(path: &Path, opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<((u64, u64), Vec<String>)> {
    let mut o = Out::new(out);
    let mut seqs = Sequences::default();
    let (read, warnings) = export_into(path, opts, &mut o, &mut seqs, 0, None)?;
    o.flush()?;
    Ok(((o.packets, read), warnings))
}

/// Streams a run of several processes (FORMAT.md 10) as one Perfetto trace: a process track per process,
/// named with its command line and parent, its threads under it, all on `CLOCK_MONOTONIC` (shared by the
/// processes, so their times line up).
pub fn export_run(
    run: &crate::procs::Run,
    opts: ReadOptions,
    out: &mut dyn Write,
) -> anyhow::Result<((u64, u64), Vec<String>)> {
    let mut o = Out::new(out);
    let mut seqs = Sequences::default();
    let (mut read, mut warnings) = (0, Vec::new());
    for (i, p) in run.processes.iter().enumerate() {
        let (r, w) = export_into(&p.path, opts, &mut o, &mut seqs, i as u64, Some(p))?;
        read += r;
        warnings.extend(w);
    }
    o.flush()?;
    Ok(((o.packets, read), warnings))
}

/// Writes one file's packets. `index`, the file's place in its run, keeps its tracks and sequences apart
/// from the other processes' (a thread id can come back in another process, as after an exec).
fn export_into(
    path: &Path,
    opts: ReadOptions,
    o: &mut Out<'_>,
    seqs: &mut Sequences,
    index: u64,
    process: Option<&crate::procs::Process>,
) -> anyhow::Result<(u64, Vec<String>)> {
    let timeline = Timeline::open(path, opts)?;
    let h = timeline.header().clone();
    let pid = h.pid as i32;
    let ns = |ticks: u64| {
        h.start_monotonic_ns
            .saturating_add_signed((ticks.wrapping_sub(h.start_ticks) as i64 as f64 * 1e9 / h.ticks_per_second) as i64)
    };
    let track = |tid: u64| tid | index << 32;
    let process_uuid = pid as u64 | 1 << 40 | index << 48;
    let mut name = format!("python {} ({} mode)", h.python_version, h.options.mode.name());
    if let Some(p) = process {
        if let Some(info) = &p.info {
            name = format!("{name}: {}", crate::procs::command(&info.argv));
        }
        if let Some(parent) = p.parent_label() {
            name = format!("{name} ({parent})");
        }
    }
    o.packet(
        DESCRIPTORS,
        None,
        TracePacket {
            track_descriptor: Some(TrackDescriptor {
                uuid: Some(process_uuid),
                process: Some(ProcessDescriptor { pid: Some(pid), process_name: Some(name) }),
                ..Default::default()
            }),
            ..Default::default()
        },
    )?;
    let mut counter_tracks: HashSet<u64> = HashSet::default();
    let mut spans = false;
    let mut coroutines = false;
    let (read, warnings) = timeline.run(|code, item| match item {
        Item::Events { events, .. } => {
            coroutines = coroutines || crate::awaits::has_frames(events);
            spans = spans || crate::spans::has_spans(events);
            Ok(())
        }
        // A counter track per thread and counter (FORMAT.md 6.9), under the thread's track, described at
        // its first sample: the thread's running total of the counter's events.
        Item::Counter { tid, ticks, counter, name, unit, total } => {
            let uuid = COUNTER_TRACK | index << 48 | tid << 8 | counter as u64;
            if counter_tracks.insert(uuid) {
                let (unit, unit_name) =
                    if unit == "ns" { (UNIT_TIME_NS, None) } else { (UNIT_COUNT, Some(unit.into())) };
                o.packet(
                    DESCRIPTORS,
                    None,
                    TracePacket {
                        track_descriptor: Some(TrackDescriptor {
                            uuid: Some(uuid),
                            name: Some(name.into()),
                            parent_uuid: Some(track(tid)),
                            counter: Some(CounterDescriptor { unit: Some(unit), unit_name }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )?;
            }
            let te = TrackEvent {
                r#type: Some(COUNTER),
                track_uuid: Some(uuid),
                counter_value: Some(total as i64),
                ..Default::default()
            };
            o.packet(
                COUNTERS - index as u32,
                None,
                TracePacket {
                    timestamp: Some(ns(ticks)),
                    timestamp_clock_id: Some(BOOTTIME),
                    track_event: Some(te),
                    ..Default::default()
                },
            )
        }
        // Where a thread's events were dropped: an instant at the first, with how many.
        Item::Lost { tid, first, count, .. } => {
            let mut te = track_event(INSTANT, Some(LOST_IID));
            te.debug_annotations.push(annotation(LOST_COUNT_IID, count));
            seqs.event(o, track(tid), ns(first), te, None)
        }
        Item::Thread { tid, name } => {
            o.packet(DESCRIPTORS, None, thread_track(pid, tid, track(tid), process_uuid, name))
        }
        Item::Begin { tid, ticks, code: id, .. } => {
            let qualname = || code.get(&id).map_or_else(|| "?".into(), |c| c.qualname.clone());
            seqs.slice(o, track(tid), ns(ticks), SLICE_BEGIN, Some((id, &qualname)))
        }
        Item::End { tid, ticks, .. } => seqs.slice(o, track(tid), ns(ticks), SLICE_END, None),
        Item::Loop { tid, ticks, uops, cycles, .. } => {
            let uops = (UOPS_IID, uops as u64);
            match cycles {
                Some(c) => seqs.instant(o, track(tid), ns(ticks), LOOP_IID, &[uops, (CYCLES_IID, c)]),
                None => seqs.instant(o, track(tid), ns(ticks), LOOP_IID, &[uops]),
            }
        }
        // Names can arrive after a thread's first events: describe the track again with its final name.
        Item::ThreadDone { tid, name: Some(name) } => {
            o.packet(DESCRIPTORS, None, thread_track(pid, tid, track(tid), process_uuid, Some(name)))
        }
        Item::ThreadDone { name: None, .. } => Ok(()),
    })?;
    if coroutines {
        // asyncio tasks (crate::awaits): a track per task under the process, slices of what it was doing.
        let a = crate::awaits::analyze(path, opts)?;
        let uuid = |i: u32| TASK_TRACK | index << 48 | i as u64;
        for (i, t) in a.tasks.iter().enumerate() {
            let d = TrackDescriptor {
                uuid: Some(uuid(i as u32)),
                name: Some(format!("task {}", t.name)),
                parent_uuid: Some(process_uuid),
                ..Default::default()
            };
            o.packet(DESCRIPTORS, None, TracePacket { track_descriptor: Some(d), ..Default::default() })?;
        }
        for s in &a.spans {
            for (at, kind, name) in [(s.start, SLICE_BEGIN, Some(a.span_name(s))), (s.end, SLICE_END, None)] {
                let te = TrackEvent { r#type: Some(kind), track_uuid: Some(uuid(s.task)), name, ..Default::default() };
                let p = TracePacket {
                    timestamp: Some(ns(at)),
                    timestamp_clock_id: Some(BOOTTIME),
                    track_event: Some(te),
                    ..Default::default()
                };
                o.packet(TASKS - index as u32, None, p)?;
            }
        }
    }
    if spans {
        // Spans (crate::spans): a track under its thread for a thread's spans, which nest, and one under the
        // process per coroutine whose spans they are (spans of tasks taking turns on a thread overlap).
        let (list, _) = crate::spans::list(path, opts)?;
        let mut described = rustc_hash::FxHashSet::default();
        for s in list.iter().filter(|s| s.end.is_some()) {
            let (uuid, parent, track_name) = if s.frame == 0 {
                (SPAN_TRACK | index << 48 | 1 << 45 | s.thread_id, track(s.thread_id), "spans".to_string())
            } else {
                (SPAN_TRACK | index << 48 | (s.frame & ((1 << 45) - 1)), process_uuid, format!("spans: {}", s.name))
            };
            if described.insert(uuid) {
                let d = TrackDescriptor {
                    uuid: Some(uuid),
                    name: Some(track_name),
                    parent_uuid: Some(parent),
                    ..Default::default()
                };
                o.packet(DESCRIPTORS, None, TracePacket { track_descriptor: Some(d), ..Default::default() })?;
            }
            let mut args: Vec<DebugAnnotation> = [("trace_id", &s.trace_id), ("span_id", &s.span_id)]
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| text_annotation(k, v))
                .collect();
            args.push(text_annotation("status", s.status));
            args.extend(s.attributes.iter().map(|(k, v)| text_annotation(k, v)));
            let begin = TrackEvent {
                r#type: Some(SLICE_BEGIN),
                track_uuid: Some(uuid),
                name: Some(s.name.clone()),
                debug_annotations: args,
                ..Default::default()
            };
            let end = TrackEvent { r#type: Some(SLICE_END), track_uuid: Some(uuid), ..Default::default() };
            for (at, te) in [(s.begin, begin), (s.end.unwrap_or(s.begin), end)] {
                let p = TracePacket {
                    timestamp: Some(ns(at)),
                    timestamp_clock_id: Some(BOOTTIME),
                    track_event: Some(te),
                    ..Default::default()
                };
                o.packet(SPANS - index as u32, None, p)?;
            }
        }
    }
    Ok((read, warnings))
}

fn thread_track(pid: i32, tid: u64, uuid: u64, parent: u64, name: Option<&str>) -> TracePacket {
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(parent),
            thread: Some(ThreadDescriptor {
                pid: Some(pid),
                tid: Some(tid as i64),
                thread_name: Some(name.map_or_else(|| format!("Thread-{tid}"), str::to_string)),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn track_event(kind: i32, name_iid: Option<u64>) -> TrackEvent {
    TrackEvent { r#type: Some(kind), name_iid, ..Default::default() }
}

fn annotation(name_iid: u64, v: u64) -> DebugAnnotation {
    DebugAnnotation { name_iid: Some(name_iid), uint_value: Some(v), ..Default::default() }
}

fn text_annotation(name: &str, v: &str) -> DebugAnnotation {
    DebugAnnotation { name: Some(name.into()), string_value: Some(v.into()), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_track_packet_is_the_bytes_prost_writes_for_it() {
        let mut direct = Vec::new();
        let mut built = Vec::new();
        let none: &[(u64, u64)] = &[];
        for &(seq, delta, kind, iid, annotations) in &[
            (2u32, 0u64, SLICE_BEGIN, Some(1u64), none),
            (2, 1, SLICE_END, None, none),
            (130, 127, SLICE_BEGIN, Some(128), none),
            (70_000, 128, SLICE_END, None, none),
            (u32::MAX, u64::MAX, SLICE_BEGIN, Some(u64::from(u32::MAX) + 1), none),
            (9, 1 << 35, SLICE_END, None, none),
            (3, 5, INSTANT, Some(LOOP_IID), &[(UOPS_IID, 12)]),
            (3, 300, INSTANT, Some(LOOP_IID), &[(UOPS_IID, 1 << 40), (CYCLES_IID, u64::MAX)]),
        ] {
            let mut o = Out::new(&mut direct);
            o.track_packet(seq, delta, kind, iid, annotations).unwrap();
            o.flush().unwrap();
            let mut te = track_event(kind, iid);
            te.debug_annotations.extend(annotations.iter().map(|&(k, v)| annotation(k, v)));
            let p = TracePacket { timestamp: Some(delta), track_event: Some(te), ..Default::default() };
            let mut o = Out::new(&mut built);
            o.packet(seq, Some(SEQ_NEEDS_INCREMENTAL_STATE), p).unwrap();
            o.flush().unwrap();
            assert_eq!(direct, built, "seq {seq} delta {delta} kind {kind} iid {iid:?} {annotations:?}");
        }
    }
}
