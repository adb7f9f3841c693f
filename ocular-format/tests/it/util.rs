//! Shared helpers: a small but complete file, and a reader that collects everything.

use ocular_format::testing::header;
use ocular_format::*;
use std::io::Cursor;

pub fn trailer() -> Trailer {
    Trailer {
        end_unix_ns: 1_795_000_001_000_000_000,
        end_monotonic_ns: 1_123_456_789,
        end_ticks: 99_000,
        events: 0,
        lost: 0,
        chunks: 0,
    }
}

pub fn code(id: u32, qualname: &str) -> CodeObject {
    CodeObject {
        id,
        name: qualname.rsplit('.').next().unwrap().into(),
        qualname: qualname.into(),
        filename: "/tmp/work.py".into(),
        first_line: 10 * id,
        flags: 3,
        bytecode: vec![151, 0, 93, 2, 140, 4, 83, 0],
        linetable: Vec::new(),
        positions: (0..4)
            .map(|i| Position { line: 10 * id as i32 + i, end_line: 10 * id as i32 + i, column: 4, end_column: -1 })
            .collect(),
    }
}

/// Events shaped like a loop: PY_START, then JUMP/BRANCH around offsets, PY_RETURN.
pub fn loop_events(code: u32, start: u64, n: usize) -> Vec<RawEvent> {
    let mut v = vec![RawEvent::new(start, code, 0, 0, EventKind::PY_START as u8)];
    let mut t = start;
    for i in 0..n {
        t += 80 + (i as u64 * 7919) % 23;
        let (kind, off, dest) = if i % 2 == 0 { (EventKind::BRANCH, 12, 16) } else { (EventKind::JUMP, 40, 8) };
        v.push(RawEvent::new(t, code, off, dest, kind as u8));
    }
    v.push(RawEvent::new(t + 50, code, 44, 0, EventKind::PY_RETURN as u8));
    v
}

/// A small file with every kind of chunk, several EVENTS chunks from two threads.
pub fn sample_file(compress: bool) -> (Vec<u8>, Vec<(u64, Vec<RawEvent>)>) {
    let mut w =
        Writer::new(Vec::new(), "<memory>", &header(), WriterOptions { compress, level: 3, ..Default::default() })
            .unwrap();
    w.code_objects(&[code(1, "work"), code(2, "Worker.run")]).unwrap();
    w.thread(&ThreadInfo { thread_id: 100, name: "MainThread".into(), is_main: true }).unwrap();
    let mut sent = Vec::new();
    for (i, (tid, code)) in [(100u64, 1u32), (200, 2), (100, 1)].into_iter().enumerate() {
        let ev = loop_events(code, 10_000 * (i as u64 + 1), 40 + 10 * i);
        w.events(tid, &ev).unwrap();
        sent.push((tid, ev));
    }
    w.thread(&ThreadInfo { thread_id: 200, name: "worker-1".into(), is_main: false }).unwrap();
    w.lost(&Lost { thread_id: 200, count: 17, first_ticks: 50_000, last_ticks: 51_000 }).unwrap();
    // FOR_ITER specialized to FOR_ITER_RANGE, with something in its inline cache unit (offset 4).
    w.snapshots(&[CodeSnapshot { id: 1, bytecode: vec![151, 0, 194, 2, 0x37, 0x12, 83, 0] }]).unwrap();
    (w.finish(trailer()).unwrap(), sent)
}

#[derive(Debug, Default)]
pub struct Everything {
    pub events: Vec<(u64, Vec<RawEvent>)>,
    pub code: Vec<CodeObject>,
    pub cfuncs: Vec<CFunction>,
    pub threads: Vec<ThreadInfo>,
    pub lost: Vec<Lost>,
    pub snapshots: Vec<CodeSnapshot>,
    pub trailer: Option<Trailer>,
    pub calibration: Option<Calibration>,
    pub skipped: Vec<String>,
    pub report: Report,
}

impl Everything {
    pub fn event_count(&self) -> usize {
        self.events.iter().map(|(_, e)| e.len()).sum()
    }
}

pub fn read_all(bytes: &[u8], salvage: bool) -> Result<Everything> {
    let mut r = Reader::new(Cursor::new(bytes), "mem.ocl", ReadOptions::with_salvage(salvage))?;
    let mut all = Everything::default();
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Events(e) => all.events.push((c.info.thread_id, e.to_vec())),
            Body::Code(c) => all.code.extend(c),
            Body::Thread(t) => all.threads.push(t),
            Body::Lost(l) => all.lost.push(l),
            Body::Snapshot(s) => all.snapshots.extend(s),
            Body::Trailer(t) => all.trailer = Some(t),
            Body::Calibration(c) => all.calibration = Some(c),
            Body::Skipped(why) => all.skipped.push(why),
            Body::CFunctions(f) => all.cfuncs.extend(f),
            Body::Ring(_) | Body::Dropped(_) | Body::Counters(_) | Body::Process(_) => {}
        }
    }
    all.report = r.report().clone();
    Ok(all)
}

/// Byte ranges `(start, end)` of each chunk, parsed independently of the reader from FORMAT.md 3.1.
pub fn chunk_bounds(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 16;
    while at + 56 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push((at, at + 56 + len));
        at += 56 + len;
    }
    assert_eq!(at, bytes.len(), "sample file must end on a chunk boundary");
    out
}

/// Sets a chunk's seq and recomputes its CRC (FORMAT.md 3.1), for building unusual files by hand.
pub fn reseal(chunk: &mut [u8], seq: u64) {
    chunk[24..32].copy_from_slice(&seq.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&chunk[..52]);
    h.update(&chunk[56..]);
    let crc = h.finalize();
    chunk[52..56].copy_from_slice(&crc.to_le_bytes());
}
