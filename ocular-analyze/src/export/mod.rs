//! Exports to formats other tools read.

pub mod chrome;
pub mod flame;
pub mod pftrace;
pub mod timeline;
