//! The Ocular recorder.
//!
//! The clock, the per-thread buffers and the writer thread, in plain Rust: `cargo test` covers them without
//! an interpreter. The CPython extension `ocular._ocular` over them is the `ocular-python` crate (built by
//! maturin), which is as thin as it can be: raw C callbacks, called through their vectorcall pointers, that
//! read the clock and push into a [`session::ThreadBuffer`].
//!
//! ```no_run
//! use ocular_record::session::{Config, Session, ThreadBuffer};
//! use ocular_format::{RawEvent, EventKind};
//! # let header = ocular_format::testing::header();
//! let session = Session::start("run.ocl".as_ref(), &header, Config::default())?;
//! let mut buf = ThreadBuffer::new(1234);
//! buf.push(RawEvent::new(ocular_record::clock::ticks(), 1, 0, 0, EventKind::PY_START as u8), &session);
//! buf.flush(&session);
//! let outcome = session.finish(ocular_record::clock::ClockPoint::now());
//! assert_eq!(outcome.events, 1);
//! # Ok::<(), ocular_format::Error>(())
//! ```

pub mod argv;
pub mod clock;
pub mod counters;
pub mod filter;
pub mod session;
pub mod threads;
