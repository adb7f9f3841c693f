//! Native Perfetto traces (`.pftrace`): `TracePacket`s with `TrackEvent`s and interned names, streamed.
//!
//! The messages below are the subset of Perfetto's `protos/perfetto/trace/` that this exporter writes,
//! declared for prost. Field numbers and types were read from the descriptors of the `perfetto` PyPI
//! package's `perfetto_trace_pb2` (0.59.1), which the tests also use to decode our output. (The
//! `perfetto_protos` crate generates all of Perfetto's protos at build time: 3 min 40 s on this machine
//! for the five messages used here.)
//!
//! Layout: a `Trace` is `repeated TracePacket packet = 1`, so writing each packet as field 1 (tag `0x0a`,
//! varint length, bytes) produces a valid trace without holding it. One packet sequence (id 1) carries
//! everything; its first packet clears incremental state, and function names are interned on first use.

use super::timeline::{Item, Timeline};
use ocular_format::ReadOptions;
use prost::Message;
use rustc_hash::FxHashSet as HashSet;
use std::io::Write;
use std::path::Path;

#[derive(Clone, PartialEq, Message)]
struct TracePacket {
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
    #[prost(message, optional, tag = "60")]
    track_descriptor: Option<TrackDescriptor>,
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
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
    #[prost(message, repeated, tag = "4")]
    debug_annotations: Vec<DebugAnnotation>,
}

#[derive(Clone, PartialEq, Message)]
struct DebugAnnotation {
    #[prost(uint64, optional, tag = "1")]
    name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    uint_value: Option<u64>,
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
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
const SEQUENCE: u32 = 1;
/// Interned name id of "loop" (code ids, used for function names, are 32-bit).
const LOOP_IID: u64 = 1 << 32;
/// Interned debug annotation names, declared in the first packet (no string per loop event).
const UOPS_IID: u64 = 1;
const CYCLES_IID: u64 = 2;

struct Out<'a> {
    w: &'a mut dyn Write,
    buf: Vec<u8>,
    first: bool,
    packets: u64,
}

impl Out<'_> {
    fn packet(&mut self, mut p: TracePacket) -> std::io::Result<()> {
        p.trusted_packet_sequence_id = Some(SEQUENCE);
        p.sequence_flags = Some(if self.first { SEQ_INCREMENTAL_STATE_CLEARED } else { SEQ_NEEDS_INCREMENTAL_STATE });
        self.first = false;
        self.buf.clear();
        self.buf.push(0x0a); // Trace.packet: field 1, length-delimited
        p.encode_length_delimited(&mut self.buf).map_err(std::io::Error::other)?;
        self.packets += 1;
        self.w.write_all(&self.buf)
    }
}

/// Streams `path` as a Perfetto protobuf trace; returns (packets written, events read) and warnings.
pub fn export(path: &Path, opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<((u64, u64), Vec<String>)> {
    let timeline = Timeline::open(path, opts)?;
    let h = timeline.header().clone();
    let pid = h.pid as i32;
    let ns = |ticks: u64| {
        h.start_monotonic_ns
            .saturating_add_signed((ticks.wrapping_sub(h.start_ticks) as i64 as f64 * 1e9 / h.ticks_per_second) as i64)
    };
    let mut o = Out { w: out, buf: Vec::new(), first: true, packets: 0 };
    let process_uuid = pid as u64 | 1 << 40;
    o.packet(TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(process_uuid),
            process: Some(ProcessDescriptor {
                pid: Some(pid),
                process_name: Some(format!("python {} ({} mode)", h.python_version, h.options.mode.name())),
            }),
            ..Default::default()
        }),
        interned_data: Some(InternedData {
            event_names: vec![EventName { iid: Some(LOOP_IID), name: Some("loop".into()) }],
            debug_annotation_names: vec![
                DebugAnnotationName { iid: Some(UOPS_IID), name: Some("uops".into()) },
                DebugAnnotationName { iid: Some(CYCLES_IID), name: Some("cycles".into()) },
            ],
        }),
        ..Default::default()
    })?;
    let mut interned: HashSet<u32> = HashSet::default();
    let (read, warnings) = timeline.run(|code, item| match item {
        Item::Event { .. } => Ok(()),
        Item::Thread { tid, name } => o.packet(thread_track(pid, tid, process_uuid, name)),
        Item::Begin { tid, ticks, code: id } => {
            // Names are interned on first use, in the packet that first refers to them.
            let interned_data = interned.insert(id).then(|| InternedData {
                debug_annotation_names: vec![],
                event_names: vec![EventName {
                    iid: Some(id as u64),
                    name: Some(code.get(&id).map_or_else(|| "?".into(), |c| c.qualname.clone())),
                }],
            });
            o.packet(slice(ns(ticks), tid, SLICE_BEGIN, Some(id as u64), interned_data))
        }
        Item::End { tid, ticks, .. } => o.packet(slice(ns(ticks), tid, SLICE_END, None, None)),
        Item::Loop { tid, ticks, uops, cycles, .. } => {
            let mut p = slice(ns(ticks), tid, INSTANT, Some(LOOP_IID), None);
            if let Some(te) = &mut p.track_event {
                te.debug_annotations.push(annotation(UOPS_IID, uops as u64));
                if let Some(c) = cycles {
                    te.debug_annotations.push(annotation(CYCLES_IID, c));
                }
            }
            o.packet(p)
        }
        // Names can arrive after a thread's first events: describe the track again with its final name.
        Item::ThreadDone { tid, name: Some(name) } => o.packet(thread_track(pid, tid, process_uuid, Some(name))),
        Item::ThreadDone { name: None, .. } => Ok(()),
    })?;
    o.w.flush()?;
    Ok(((o.packets, read), warnings))
}

fn thread_track(pid: i32, tid: u64, parent: u64, name: Option<&str>) -> TracePacket {
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(tid),
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

fn slice(ns: u64, tid: u64, kind: i32, name_iid: Option<u64>, interned: Option<InternedData>) -> TracePacket {
    TracePacket {
        timestamp: Some(ns),
        track_event: Some(TrackEvent {
            r#type: Some(kind),
            name_iid,
            track_uuid: Some(tid),
            debug_annotations: vec![],
        }),
        interned_data: interned,
        ..Default::default()
    }
}

fn annotation(name_iid: u64, v: u64) -> DebugAnnotation {
    DebugAnnotation { name_iid: Some(name_iid), uint_value: Some(v) }
}
