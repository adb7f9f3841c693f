//! The Ocular trace file format (`.ocl`), version 2.0 (and the 1.x files before it).
//!
//! [`FORMAT.md`](https://example.invalid/ocular/ocular-format/FORMAT.md) beside this crate is the
//! specification; this crate is its reference reader and writer. It has no Python in it: the recorder
//! (`ocular-record`) and the analyzer (`ocular-analyze`) both build on it.
//!
//! ```
//! use ocular_format::*;
//!
//! // Write: a header, a code object, one thread's events, the trailer.
//! let header = ocular_format::testing::header();
//! let mut w = Writer::new(Vec::new(), "<memory>", &header, WriterOptions::default())?;
//! let events: Vec<RawEvent> = (0..1000u64)
//!     .map(|i| RawEvent::new(1_000 + 90 * i, 1, (i % 10) as u32 * 2, 0, EventKind::INSTRUCTION as u8))
//!     .collect();
//! w.events(7, &events)?;
//! let bytes = w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks: 0, events: 0, lost: 0, chunks: 0 })?;
//!
//! // Read it back, chunk by chunk.
//! let mut r = Reader::new(std::io::Cursor::new(bytes), "<memory>", ReadOptions::default())?;
//! let mut n = 0;
//! while let Some(chunk) = r.next_chunk()? {
//!     if let Body::Events(ev) = chunk.body { n += ev.len(); }
//! }
//! assert_eq!(n, 1000);
//! assert!(r.report().clean());
//! # Ok::<(), ocular_format::Error>(())
//! ```

pub mod chunk;
pub mod codec;
pub mod complete;
mod error;
pub mod event;
pub mod exited;
pub mod linetable;
pub mod live;
mod meta;
pub mod prefetch;
mod reader;
pub mod ring;
pub mod span;
mod writer;

pub use chunk::{MAGIC, MAJOR, MINOR};
pub use error::{Error, Result};
pub use event::{asyncio_loop_function, kind_name, Awaited, EventKind, LoopFunction, Pauses, RawEvent};
pub use meta::{
    cost_table, cost_table_at_speed, CFunction, Calibration, Clock, CodeObject, CodeSnapshot, CounterInfo,
    CounterSample, CounterSamples, Dropped, Header, Lost, Mode, OpcodeTable, Options, Position, ProcessInfo, RingInfo,
    ThreadInfo, Trailer,
};
pub use prefetch::Prefetch;
pub use reader::{
    now_ticks, process_alive, recording_alive, Body, Chunk, ChunkInfo, Damage, Mismatch, ReadOptions, Reader, Report,
    Source, ThreadLoss, MAX_LOSS_RANGES,
};
pub use writer::{frame_c_function, frame_code, Writer, WriterOptions};

/// Reads a whole in-memory file, in salvage mode and then strictly, discarding results. The fuzz target
/// and the damage tests call this: it must return (not panic, not allocate without bound) on any input.
pub fn read_all_for_fuzzing(data: &[u8]) {
    for salvage in [true, false] {
        let opts = ReadOptions::with_salvage(salvage);
        if let Ok(mut r) = Reader::new(std::io::Cursor::new(data), "<fuzz>", opts) {
            while let Ok(Some(_)) = r.next_chunk() {}
            let _ = r.report().warnings("<fuzz>");
        }
    }
}

/// Sample records for tests, examples and benchmarks.
#[doc(hidden)]
pub mod testing {
    use crate::*;

    /// A pseudo-random sequence (xorshift64) from `seed` (not 0): the same in every run, for tests that
    /// want inputs of every shape without a dependency.
    pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// A header as a CPython 3.12 recording in adaptive mode would have it, with a tiny opcode table.
    pub fn header() -> Header {
        let mut names = vec![String::new(); 256];
        let mut base: Vec<u8> = (0..=255).collect();
        let mut cache_entries = vec![0u8; 256];
        for (op, name) in
            [(1u8, "POP_TOP"), (83, "RETURN_VALUE"), (93, "FOR_ITER"), (140, "JUMP_BACKWARD"), (151, "RESUME")]
        {
            names[op as usize] = name.into();
        }
        names[194] = "FOR_ITER_RANGE".into();
        base[194] = 93;
        cache_entries[93] = 1;
        Header {
            recorder: "ocular 0.1.0".into(),
            python_version: "3.12.1".into(),
            python_hexversion: 0x030c01f0,
            implementation: "cpython".into(),
            platform: "linux-x86_64".into(),
            pid: 4242,
            start_unix_ns: 1_795_000_000_000_000_000,
            start_monotonic_ns: 123_456_789,
            start_ticks: 1_000,
            clock: Clock::Tsc,
            ticks_per_second: 3.0e9,
            options: Options {
                mode: Mode::Adaptive,
                deinstrument_threshold: 500,
                include_only: vec![],
                exclude: vec!["threading".into()],
                buffer_events: 65_536,
                max_buffers: 64,
            },
            event_cost_ticks: 120.0,
            opcodes: OpcodeTable { names, base, cache_entries, have_argument: 44, extended_arg: 69 },
        }
    }
}
