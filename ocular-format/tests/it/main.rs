//! Integration tests of the format crate: one binary, so it compiles once.

mod alloc_meter;
mod damage;
mod frozen;
mod golden;
mod prefetch;
mod ring;
mod roundtrip;
mod seal;
mod util;

#[global_allocator]
static METER: alloc_meter::Meter = alloc_meter::Meter;
