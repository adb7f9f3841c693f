//! Format benchmark: bytes per event on disk, write and read throughput, on a synthetic stream of events
//! shaped like a real adaptive-mode recording. Prints a table; not a test.
//!
//!     cargo run --release -p ocular-format --example format_bench [-- EVENTS]
//!
//! The stream: 8 functions, each a loop whose iterations emit BRANCH at the loop head, a data-dependent
//! BRANCH one time in three, a call to another function one time in twenty, and a JUMP back; timestamps
//! advance by a cost fixed per (previous location, location) pair, plus jitter (two uniform 0..8 draws,
//! about 3.6 bits) and, one event in 500, a stall of up to 100 000 ticks (page fault, GC, preemption).

use ocular_format::*;
use std::time::Instant;

struct Gen {
    rng: fastrand::Rng,
    ticks: u64,
    prev: u64,
    out: Vec<RawEvent>,
}

impl Gen {
    fn emit(&mut self, code: u32, offset: u32, arg: u32, kind: EventKind) {
        // A block's cost depends on where it starts (the previous event) and where it ends (this one).
        let here = (code as u64) << 32 | offset as u64;
        let base = 40 + (here.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ self.prev.wrapping_mul(31)) % 150;
        self.prev = here;
        let mut d = base + self.rng.u64(0..8) + self.rng.u64(0..8);
        if self.rng.u32(0..500) == 0 {
            d += self.rng.u64(1_000..100_000);
        }
        self.ticks += d;
        self.out.push(RawEvent::new(self.ticks, code, offset, arg, kind as u8));
    }

    fn call(&mut self, code: u32, depth: u32, budget: usize) {
        self.emit(code, 0, 0, EventKind::PY_START);
        let head = 20 + 4 * code;
        let iterations = self.rng.usize(10..1000);
        for _ in 0..iterations {
            if self.out.len() >= budget {
                return;
            }
            self.emit(code, head, head + 4, EventKind::BRANCH);
            if self.rng.u32(0..3) == 0 {
                self.emit(code, head + 16, head + 40, EventKind::BRANCH);
            }
            if depth < 3 && self.rng.u32(0..20) == 0 {
                let callee = 1 + self.rng.u32(0..8);
                self.call(callee, depth + 1, budget);
            }
            self.emit(code, head + 44, head, EventKind::JUMP);
        }
        self.emit(code, head + 60, 0, EventKind::PY_RETURN);
    }
}

fn synthetic(n: usize) -> Vec<RawEvent> {
    let mut g =
        Gen { rng: fastrand::Rng::with_seed(669), ticks: 1_000_000, prev: 0, out: Vec::with_capacity(n + 4096) };
    while g.out.len() < n {
        let code = 1 + g.rng.u32(0..8);
        g.call(code, 0, n);
    }
    g.out.truncate(n);
    g.out
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000_000);
    let buffer = 65_536;
    let events = synthetic(n);
    let header = ocular_format::testing::header();
    let path = std::env::temp_dir().join(format!("ocular-format-bench-{}.ocl", std::process::id()));
    let mib = |b: f64| b / (1 << 20) as f64;

    println!(
        "synthetic stream: {n} events, {} buffers of {buffer}, {:.0} MiB as raw 24-byte records",
        n.div_ceil(buffer),
        mib((n * 24) as f64)
    );
    println!();
    println!("| codec | bytes/event | write Mevents/s | read Mevents/s |");
    println!("|---|---:|---:|---:|");

    // Reference: plain zstd of the raw records, as a recorder without a transform would write them.
    let raw_bytes: Vec<u8> = events.iter().flat_map(|e| zerocopy::IntoBytes::as_bytes(e).to_vec()).collect();
    let t = Instant::now();
    let mut plain = 0usize;
    for part in raw_bytes.chunks(buffer * 24) {
        plain += zstd::bulk::compress(part, 3).unwrap().len() + 56;
    }
    let plain_write = n as f64 / t.elapsed().as_secs_f64() / 1e6;
    println!("| raw 24-byte records + zstd 3 (reference) | {:.2} | {plain_write:.1} | - |", plain as f64 / n as f64);

    if std::env::var_os("OCULAR_BENCH_COLUMNS").is_some() {
        // Where the bytes go: each column of each buffer compressed on its own.
        let (mut raw, mut enc) = (Vec::new(), ocular_format::codec::Encoder::default());
        let mut sizes = [0usize; 6];
        let mut raws = [0usize; 6];
        for part in events.chunks(buffer) {
            enc.encode(part, &mut raw);
            let m = u32::from_le_bytes(raw[..4].try_into().unwrap()) as usize;
            let mut at = 4;
            for c in 0..6 {
                let len = if c < 4 { m } else { part.len() };
                let w = raw[at] as usize;
                let col = &raw[at..at + 1 + w * len];
                sizes[c] += zstd::bulk::compress(col, 3).unwrap().len();
                raws[c] += col.len();
                at += col.len();
            }
        }
        for (c, name) in ["dict kind", "dict code", "dict offset", "dict arg", "location", "ticks"].iter().enumerate() {
            println!(
                "column {name}: raw {:.2} B/event, zstd {:.3} B/event",
                raws[c] as f64 / n as f64,
                sizes[c] as f64 / n as f64
            );
        }
    }

    let levels: Vec<i32> = std::env::var("OCULAR_BENCH_LEVELS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 3]);
    for level in levels {
        let file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
        let t = Instant::now();
        let mut w =
            Writer::new(file, "bench", &header, WriterOptions { compress: true, level, ..Default::default() }).unwrap();
        for part in events.chunks(buffer) {
            w.events(1, part).unwrap();
        }
        let trailer = Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 0, events: 0, lost: 0, chunks: 0 };
        w.finish(trailer).unwrap().into_inner().unwrap().sync_all().unwrap();
        let write = n as f64 / t.elapsed().as_secs_f64() / 1e6;
        let size = std::fs::metadata(&path).unwrap().len();

        // Read twice, keep the faster (the first pass warms the page cache).
        let mut best = f64::MAX;
        let mut check = 0u64;
        for _ in 0..2 {
            let t = Instant::now();
            let mut r = Reader::open(&path).unwrap();
            let (mut count, mut sum) = (0usize, 0u64);
            while let Some(c) = r.next_chunk().unwrap() {
                if let Body::Events(ev) = c.body {
                    count += ev.len();
                    sum = ev.iter().fold(sum, |s, e| s.wrapping_add(e.ticks.get() ^ e.offset.get() as u64));
                }
            }
            assert_eq!(count, n);
            check = sum;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let expect = events.iter().fold(0u64, |s, e| s.wrapping_add(e.ticks.get() ^ e.offset.get() as u64));
        assert_eq!(check, expect, "read back differs");
        println!(
            "| columnar v1 + zstd {level} | {:.3} | {write:.1} | {:.1} |",
            size as f64 / n as f64,
            n as f64 / best / 1e6
        );
    }
    std::fs::remove_file(&path).ok();

    // A thread per request writes a chunk of a few hundred events per thread, between the full buffers of
    // longer-lived threads: the encoder's fixed cost per chunk, apart from zstd.
    let mut enc = ocular_format::codec::Encoder::default();
    let mut raw = Vec::new();
    let small: Vec<&[RawEvent]> = events.chunks(300).take(2_000).collect();
    let t = Instant::now();
    for (i, part) in small.iter().enumerate() {
        if i % 100 == 0 {
            enc.encode(&events[..buffer.min(n)], &mut raw);
        }
        enc.encode(part, &mut raw);
    }
    let full = t.elapsed();
    let t = Instant::now();
    for _ in 0..small.len().div_ceil(100) {
        enc.encode(&events[..buffer.min(n)], &mut raw);
    }
    let small_us = full.saturating_sub(t.elapsed()).as_secs_f64() / small.len() as f64 * 1e6;
    println!();
    println!("encoding a chunk of 300 events, one full buffer's chunk in every 100: {small_us:.2} us per chunk");
}
