//! Offline analysis of Ocular traces. The `ocular-analyze` binary is a thin clap layer over this library.
//!
//! ```no_run
//! let info = ocular_analyze::info::summarize("run.ocl", Default::default())?;
//! println!("{} events in {} threads", info.events, info.threads.len());
//! # Ok::<(), ocular_format::Error>(())
//! ```

pub mod analysis;
pub mod awaits;
pub mod cli;
pub mod codemap;
pub mod diff;
pub mod dump;
pub mod export;
pub mod hot;
pub mod info;
pub mod lines;
pub mod output;
pub mod procs;
pub mod progress;
pub mod report;
pub mod spans;
pub mod specialize;
pub mod stats;
pub mod table;
pub mod top;
pub mod walk;
