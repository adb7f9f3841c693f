//! The recorder's plain-Rust core: buffers, loss accounting, the writer thread, the file it leaves.

mod counters;
mod session;
