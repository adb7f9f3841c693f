//! The writer's bytes, compared with a file built by hand from FORMAT.md's tables (not with the writer).
//! If this test fails, either the writer or FORMAT.md is wrong: fix one so they agree again.

use crate::util::{code, trailer};
use ocular_format::*;

/// Postcard's primitives, as FORMAT.md 4.2 describes them.
#[derive(Default)]
struct Pc(Vec<u8>);
impl Pc {
    fn varint(&mut self, mut v: u64) -> &mut Self {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return self;
            }
            self.0.push(b | 0x80);
        }
    }
    fn zigzag(&mut self, v: i64) -> &mut Self {
        self.varint(((v << 1) ^ (v >> 63)) as u64)
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.varint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn f64(&mut self, v: f64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
}

fn small_header() -> Header {
    let mut h = ocular_format::testing::header();
    h.opcodes = OpcodeTable {
        names: vec!["CACHE".into(), "POP_TOP".into()],
        base: vec![0, 1],
        cache_entries: vec![0, 0],
        have_argument: 44,
        extended_arg: 69,
    };
    h
}

fn header_payload(h: &Header) -> Vec<u8> {
    let mut p = Pc::default();
    p.string(&h.recorder).string(&h.python_version).varint(h.python_hexversion as u64);
    p.string(&h.implementation).string(&h.platform).varint(h.pid as u64);
    p.zigzag(h.start_unix_ns).varint(h.start_monotonic_ns).varint(h.start_ticks);
    p.varint(0); // Clock::Tsc
    p.f64(h.ticks_per_second);
    // Options
    p.varint(1); // Mode::Adaptive
    p.varint(h.options.deinstrument_threshold as u64);
    p.varint(0); // include_only: empty
    p.varint(1).string("threading"); // exclude
    p.varint(h.options.buffer_events as u64).varint(h.options.max_buffers as u64);
    p.f64(h.event_cost_ticks);
    // OpcodeTable
    p.varint(2).string("CACHE").string("POP_TOP");
    p.bytes(&[0, 1]).bytes(&[0, 0]).u8(44).u8(69);
    p.0
}

/// `util::code(1, ..)` as FORMAT.md 6.1 stores it: its four positions (lines 10 to 13, column 4, no end
/// column) as a location table of long-form entries (6.1.1): first byte `1 1110 000` (entry, code 14,
/// one unit), line delta as svarint (0 from `first_line`, then +1 = `02`), end line delta 0, column + 1
/// = 5, end column + 1 = 0.
fn code_record(c: &CodeObject) -> Vec<u8> {
    let mut p = Pc::default();
    p.varint(c.id as u64).string(&c.name).string(&c.qualname).string(&c.filename);
    p.varint(c.first_line as u64).varint(c.flags as u64).bytes(&c.bytecode);
    #[rustfmt::skip]
    let linetable = [
        0xf0, 0x00, 0x00, 0x05, 0x00,
        0xf0, 0x02, 0x00, 0x05, 0x00,
        0xf0, 0x02, 0x00, 0x05, 0x00,
        0xf0, 0x02, 0x00, 0x05, 0x00,
    ];
    p.bytes(&linetable);
    p.0
}

/// A chunk header and payload, from the table in FORMAT.md 3.1.
#[allow(clippy::too_many_arguments)]
fn chunk(kind: u16, codec: u8, thread: u64, seq: u64, ts: (u64, u64), count: u32, payload: &[u8]) -> Vec<u8> {
    let mut c = Vec::new();
    c.extend_from_slice(b"OCCH");
    c.extend_from_slice(&kind.to_le_bytes());
    c.push(codec);
    c.push(0);
    c.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    c.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    c.extend_from_slice(&thread.to_le_bytes());
    c.extend_from_slice(&seq.to_le_bytes());
    c.extend_from_slice(&ts.0.to_le_bytes());
    c.extend_from_slice(&ts.1.to_le_bytes());
    c.extend_from_slice(&count.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&c);
    crc.update(payload);
    c.extend_from_slice(&crc.finalize().to_le_bytes());
    assert_eq!(c.len(), 56);
    c.extend_from_slice(payload);
    c
}

/// The four events of FORMAT.md section 8.
fn example_events() -> Vec<RawEvent> {
    vec![
        RawEvent::new(1000, 1, 0, 0, 0),
        RawEvent::new(1100, 1, 20, 4, 7),
        RawEvent::new(1210, 1, 20, 4, 7),
        RawEvent::new(1460, 1, 30, 0, 2),
    ]
}

const EXAMPLE_PAYLOAD: [u8; 34] = [
    0x03, 0x00, 0x00, 0x00, // m
    0x01, 0x00, 0x07, 0x02, // dictionary kind
    0x01, 0x02, 0x00, 0x00, // dictionary code
    0x01, 0x00, 0x28, 0x14, // dictionary offset
    0x01, 0x00, 0x08, 0x07, // dictionary arg
    0x01, 0x00, 0x01, 0x01, 0x02, // location
    0x02, 0x00, 0xc8, 0x14, 0xf4, 0x00, 0x00, 0x00, 0x01, // ticks
];

#[test]
fn golden_bytes() {
    let h = small_header();
    let c = code(1, "work");
    let thread = ThreadInfo { thread_id: 77, name: "MainThread".into(), is_main: true };
    let mut w =
        Writer::new(Vec::new(), "<memory>", &h, WriterOptions { compress: false, level: 0, ..Default::default() })
            .unwrap();
    w.ring(&RingInfo { path: "/r.ocl.ring".into() }).unwrap();
    w.process(&ProcessInfo {
        run_id: 0x0123_4567_89ab_cdef,
        parent_pid: 4242,
        started: "fork".into(),
        executable: "/usr/bin/python3".into(),
        argv: vec!["python3".into(), "job.py".into()],
    })
    .unwrap();
    w.code_objects(std::slice::from_ref(&c)).unwrap();
    w.c_functions(&[CFunction { id: 1, qualname: "len".into(), module: "builtins".into(), kind: CFunction::BUILTIN }])
        .unwrap();
    w.thread(&thread).unwrap();
    w.dropped(&Dropped { thread_id: 77, events: 500, first_ticks: 10, last_ticks: 990 }).unwrap();
    w.counters(&CounterSamples {
        counters: vec![CounterInfo {
            name: "page-faults".into(),
            unit: "faults".into(),
            period: 1,
            error: String::new(),
        }],
        samples: vec![CounterSample { thread_id: 77, counter: 0, monotonic_ns: 123_456, period: 1 }],
        lost: vec![],
    })
    .unwrap();
    w.events(77, &example_events()).unwrap();
    // FOR_ITER (93) specialized to FOR_ITER_RANGE (194). (This header's table gives no opcode inline caches;
    // the round-trip tests check that cache units are stored as zeros.)
    w.snapshots(&[CodeSnapshot { id: 1, bytecode: vec![151, 0, 194, 2, 140, 4, 83, 0] }]).unwrap();
    let got = w.finish(trailer()).unwrap();

    let mut want = vec![0x89, b'O', b'C', b'L', 0x0d, 0x0a, 0x1a, 0x0a, 2, 0, 13, 0, 0, 0, 0, 0];
    want.extend(chunk(0x0001, 0x00, 0, 0, (0, 0), 1, &header_payload(&h)));
    // FORMAT.md 6.7: the ring file's path, a postcard string.
    let mut ring = Pc::default();
    ring.string("/r.ocl.ring");
    want.extend(chunk(0x0008, 0x00, 0, 1, (0, 0), 1, &ring.0));
    // FORMAT.md 6.10: run id and parent pid as varints, how it started, the executable, argv (a length and
    // strings).
    let mut pr = Pc::default();
    pr.varint(0x0123_4567_89ab_cdef).varint(4242).string("fork").string("/usr/bin/python3");
    pr.varint(2).string("python3").string("job.py");
    want.extend(chunk(0x000b, 0x00, 0, 2, (0, 0), 1, &pr.0));
    let mut framed = Pc::default();
    framed.bytes(&code_record(&c));
    want.extend(chunk(0x0003, 0x00, 0, 3, (0, 0), 1, &framed.0));
    // FORMAT.md 6.11 and 8: one framed CFunction (id, qualname, module, kind), as the spec spells it out.
    let mut cf = Pc::default();
    cf.varint(1).string("len").string("builtins").u8(0);
    let mut framed = Pc::default();
    framed.bytes(&cf.0);
    assert_eq!(
        framed.0,
        [0x0f, 0x01, 0x03, 0x6c, 0x65, 0x6e, 0x08, 0x62, 0x75, 0x69, 0x6c, 0x74, 0x69, 0x6e, 0x73, 0x00]
    );
    want.extend(chunk(0x000c, 0x00, 0, 4, (0, 0), 1, &framed.0));
    let mut tp = Pc::default();
    tp.varint(77).string("MainThread").u8(1);
    want.extend(chunk(0x0004, 0x00, 77, 5, (0, 0), 1, &tp.0));
    // FORMAT.md 6.8: thread, events, first and last ticks as varints; the range in the chunk header too.
    let mut dr = Pc::default();
    dr.varint(77).varint(500).varint(10).varint(990);
    want.extend(chunk(0x0009, 0x00, 77, 6, (10, 990), 1, &dr.0));
    // FORMAT.md 6.9: the counters (name, unit, period, error), the samples (thread, counter as one byte,
    // monotonic ns, period), no lost samples; `count` is the number of samples.
    let mut cs = Pc::default();
    cs.varint(1).string("page-faults").string("faults").varint(1).string("");
    cs.varint(1).varint(77).u8(0).varint(123_456).varint(1);
    cs.varint(0);
    want.extend(chunk(0x000a, 0x00, 0, 7, (0, 0), 1, &cs.0));
    want.extend(chunk(0x0002, 0x10, 77, 8, (1000, 1460), 4, &EXAMPLE_PAYLOAD));
    // FORMAT.md 6.4: the snapshot XOR the base bytecode [151, 0, 93, 2, 140, 4, 83, 0]: 194 ^ 93 = 0x9f.
    let mut snap = Pc::default();
    snap.bytes(Pc::default().varint(1).bytes(&[0, 0, 0x9f, 0, 0, 0, 0, 0]).0.as_slice());
    want.extend(chunk(0x0006, 0x00, 0, 9, (0, 0), 1, &snap.0));
    let t = trailer();
    let mut tr = Pc::default();
    tr.zigzag(t.end_unix_ns).varint(t.end_monotonic_ns).varint(t.end_ticks);
    tr.varint(4).varint(0).varint(10); // events, lost, chunks before the trailer
    want.extend(chunk(0x00ff, 0x00, 0, 10, (0, 0), 1, &tr.0));

    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "writer output differs from FORMAT.md at byte {at} (writer {} bytes, spec {} bytes): {:02x?} vs {:02x?}",
            got.len(),
            want.len(),
            &got[at.saturating_sub(8)..(at + 24).min(got.len())],
            &want[at.saturating_sub(8)..(at + 24).min(want.len())]
        );
    }
}

#[test]
fn compressed_events_chunk_decompresses_to_the_spec_payload() {
    // The example four times over: the payload repeats, so zstd shrinks it and the chunk is 0x11.
    let mut events = example_events();
    for k in 1..4u64 {
        events.extend(
            example_events()
                .into_iter()
                .map(|e| RawEvent::new(e.ticks.get() + 500 * k, e.code.get(), e.offset.get(), e.arg.get(), e.kind)),
        );
    }
    let mut encoded = Vec::new();
    ocular_format::codec::Encoder::default().encode(&events, &mut encoded);
    let mut w = Writer::new(Vec::new(), "<memory>", &small_header(), WriterOptions::default()).unwrap();
    w.events(77, &events).unwrap();
    // The example alone: 34 bytes that zstd would only make longer, so they are stored as they are (0x10).
    w.events(77, &example_events()).unwrap();
    let bytes = w.finish(trailer()).unwrap();
    let bounds = crate::util::chunk_bounds(&bytes);
    let c = &bytes[bounds[1].0..bounds[1].1];
    assert_eq!(&c[4..6], &0x0002u16.to_le_bytes());
    assert_eq!(c[6], 0x11, "columnar + zstd");
    let raw_len = u32::from_le_bytes(c[12..16].try_into().unwrap()) as usize;
    assert_eq!(raw_len, encoded.len());
    assert!(c.len() - 56 < raw_len, "stored {} >= raw {raw_len}", c.len() - 56);
    assert_eq!(zstd::bulk::decompress(&c[56..], raw_len).unwrap(), encoded);
    let c = &bytes[bounds[2].0..bounds[2].1];
    assert_eq!(c[6], 0x10, "columnar, not compressed");
    assert_eq!(&c[56..], &EXAMPLE_PAYLOAD);
}
