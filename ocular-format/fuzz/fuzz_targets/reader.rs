//! Any bytes, read strictly and in salvage mode: the reader must return, never panic, never allocate
//! without bound. Seeds: testdata/v1.0/*.ocl (see `make fuzz`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ocular_format::read_all_for_fuzzing(data);
});
