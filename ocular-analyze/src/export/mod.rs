//! Exports to formats other tools read.

pub mod chrome;
pub mod flame;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod pftrace;
pub mod pprof;
pub mod timeline;
