//! The prefetching reader gives what the reader gives: the same chunks in the same order, the same report,
//! on whole files, cut ones and ones a reader must complete.

use ocular_format::{Prefetch, ReadOptions, Reader};
use std::path::Path;

/// Every chunk as text (its place, header and decoded body), then the report's warnings.
fn plain(path: &Path, opts: ReadOptions) -> (Vec<String>, Vec<String>) {
    let mut r = Reader::open_with(path, opts).unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        chunks.push(format!("{:?} {:?}", c.info, c.body));
    }
    (chunks, r.report().warnings("f"))
}

/// `threaded`: on a thread of its own (the fixtures are small enough that `Prefetch::new` reads them inline).
fn prefetched(path: &Path, opts: ReadOptions, threaded: bool) -> (Vec<String>, Vec<String>) {
    let reader = Reader::open_with(path, opts).unwrap();
    let mut r = if threaded { Prefetch::threaded(reader) } else { Prefetch::new(reader) }.unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        chunks.push(format!("{:?} {:?}", c.info, c.body));
    }
    let r = r.finish();
    (chunks, r.report().warnings("f"))
}

#[test]
fn prefetched_chunks_are_the_reader_s() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata");
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for v in std::fs::read_dir(root).unwrap() {
        let f = v.unwrap().path().join("synthetic.ocl");
        if !f.exists() {
            continue;
        }
        let bytes = std::fs::read(&f).unwrap();
        // Whole, and cut in the middle of its data (a killed recording's file: read up to the cut, warned).
        let cut = dir.path().join("cut.ocl");
        std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
        for (p, opts) in [(f.as_path(), ReadOptions::default()), (cut.as_path(), ReadOptions::default())] {
            let a = plain(p, opts);
            assert!(!a.0.is_empty());
            assert_eq!(prefetched(p, opts, true), a, "{}", f.display());
            assert_eq!(prefetched(p, opts, false), a, "{}", f.display());
        }
        n += 1;
    }
    assert!(n >= 10, "fixtures found: {n}");
}

#[test]
fn stopping_early_gives_the_reader_back() {
    let f = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/v2.12/synthetic.ocl");
    for threaded in [true, false] {
        let reader = Reader::open(f).unwrap();
        let mut r = if threaded { Prefetch::threaded(reader) } else { Prefetch::new(reader) }.unwrap();
        assert!(r.next_chunk().unwrap().is_some());
        let r = r.finish();
        assert_eq!(r.header().pid, 4242);
    }
}
