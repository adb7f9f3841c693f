//! What goes in comes out: every record kind, several threads, big buffers, followed files.

use crate::util::{chunk_bounds, loop_events, read_all, reseal, sample_file};
use ocular_format::*;
use std::io::Write;

#[test]
fn every_record_round_trips_compressed_and_not() {
    for compress in [true, false] {
        let (bytes, sent) = sample_file(compress);
        let all = read_all(&bytes, false).unwrap();
        assert_eq!(all.events, sent, "compress={compress}");
        // The writer stores a location table encoded from the positions; the reader decodes it back.
        let want: Vec<CodeObject> = [crate::util::code(1, "work"), crate::util::code(2, "Worker.run")]
            .into_iter()
            .map(|mut c| {
                c.linetable = linetable::encode(&c.positions, c.first_line);
                c
            })
            .collect();
        assert_eq!(all.code, want);
        assert_eq!(
            all.threads.iter().map(|t| (t.thread_id, t.name.as_str())).collect::<Vec<_>>(),
            [(100, "MainThread"), (200, "worker-1")]
        );
        assert_eq!(all.lost, [Lost { thread_id: 200, count: 17, first_ticks: 50_000, last_ticks: 51_000 }]);
        // The specialized opcode is kept; the inline cache unit is not stored and reads back as the base's.
        assert_eq!(all.snapshots[0].bytecode, [151, 0, 194, 2, 140, 4, 83, 0]);
        let t = all.trailer.clone().unwrap();
        assert_eq!((t.events, t.lost, t.chunks), (all.event_count() as u64, 17, 9));
        assert_eq!(all.report.events, all.event_count() as u64);
        assert_eq!(all.report.chunks, 10);
        assert!(all.report.clean(), "{:?}", all.report);
        let warnings = all.report.warnings("x");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("x: thread 200 lost 17 of its 69 events (24.6%) from 0.016 ms to 0.017 ms after"),
            "{warnings:?}"
        );
    }
}

#[test]
fn header_round_trips() {
    let (bytes, _) = sample_file(true);
    let r = Reader::new(std::io::Cursor::new(&bytes), "m", ReadOptions::default()).unwrap();
    assert_eq!(r.header(), &ocular_format::testing::header());
    assert_eq!(r.version(), (ocular_format::MAJOR, ocular_format::MINOR));
    assert_eq!(r.version(), (ocular_format::MAJOR, ocular_format::MINOR));
}

#[test]
fn buffers_larger_than_a_chunk_are_split_in_order() {
    let n = MAX_CHUNK_EVENTS_PLUS;
    // Times with a clock's jitter: exactly periodic ones compress past what a reader decodes per byte and
    // would be stored as raw records (FORMAT.md 3.1).
    let jitter = |i: u64| {
        // splitmix64's finaliser: noise without a pattern zstd can find.
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) & 7
    };
    let events: Vec<RawEvent> =
        (0..n as u64).map(|i| RawEvent::new(i * 30 + jitter(i), 1, (i % 50) as u32 * 2, 0, 6)).collect();
    let mut w = Writer::new(
        Vec::new(),
        "m",
        &ocular_format::testing::header(),
        WriterOptions { compress: true, level: 1, ..Default::default() },
    )
    .unwrap();
    w.events(5, &events).unwrap();
    let bytes = w.finish(crate::util::trailer()).unwrap();
    let all = read_all(&bytes, false).unwrap();
    let sizes: Vec<usize> = all.events.iter().map(|(_, e)| e.len()).collect();
    assert_eq!(sizes, [1 << 22, n - (1 << 22)]);
    let back: Vec<RawEvent> = all.events.into_iter().flat_map(|(_, e)| e).collect();
    assert!(back == events);
}
const MAX_CHUNK_EVENTS_PLUS: usize = (1 << 22) + 1000;

#[test]
fn a_growing_file_is_followed_chunk_by_chunk() {
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    // Cut in the middle of the third EVENTS chunk (chunk index 5).
    let cut = bounds[5].0 + 30;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("growing.ocl");
    std::fs::write(&path, &bytes[..cut]).unwrap();

    let mut r = Reader::open(&path).unwrap();
    let mut n = 0;
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            n += e.len();
        }
    }
    assert_eq!(n, sent[0].1.len() + sent[1].1.len());
    assert_eq!(r.report().truncated, Some((bounds[5].0 as u64, 30)));
    assert!(r.report().warnings("growing.ocl")[0].contains("incomplete chunk at offset"));

    // The writer carries on: the reader picks up where it stopped.
    std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&bytes[cut..]).unwrap();
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            n += e.len();
        }
    }
    assert_eq!(n, sent.iter().map(|(_, e)| e.len()).sum::<usize>());
    assert!(r.report().clean(), "{:?}", r.report());
}

/// A file that a writer appends to while it is read: the first read that meets its end makes the rest
/// of it appear, as the writer's next `write` does.
struct Growing {
    data: Vec<u8>,
    visible: usize,
    pos: usize,
}

impl std::io::Read for Growing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.visible {
            self.visible = self.data.len();
            return Ok(0);
        }
        let n = buf.len().min(self.visible - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl std::io::Seek for Growing {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.pos = match to {
            std::io::SeekFrom::Start(p) => p as usize,
            std::io::SeekFrom::End(d) => (self.visible as i64 + d) as usize,
            std::io::SeekFrom::Current(d) => (self.pos as i64 + d) as usize,
        };
        Ok(self.pos as u64)
    }
}

#[test]
fn a_chunk_whose_rest_is_written_while_it_is_read_is_read_whole_not_called_damaged() {
    // The reader met the end inside a chunk, looked past it for a valid chunk (to tell a damaged length
    // from a cut-off tail), and found one: the writer had written the rest and the next chunk meanwhile.
    // It called the chunk's length damaged, and a command reading a run whose child was still writing
    // its trace failed ("corrupt chunk ...: chunk length runs past a valid chunk").
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let src = Growing { visible: bounds[5].0 + 100, data: bytes, pos: 0 };
    let mut r = Reader::new(src, "growing.ocl", ReadOptions::default()).unwrap();
    let mut events = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            events.push((c.info.thread_id, e.to_vec()));
        }
    }
    assert_eq!(events, sent);
    assert!(r.report().clean(), "{:?}", r.report());
}

#[test]
fn unknown_chunk_kinds_are_skipped_and_counted() {
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    // Header, then a chunk of a future kind 0x0100, then the rest renumbered.
    let mut out = bytes[..bounds[0].1].to_vec();
    let mut future = bytes[bounds[3].0..bounds[3].1].to_vec();
    future[4..6].copy_from_slice(&0x0100u16.to_le_bytes());
    reseal(&mut future, 1);
    out.extend(&future);
    for (i, &(a, b)) in bounds[1..].iter().enumerate() {
        let mut c = bytes[a..b].to_vec();
        reseal(&mut c, i as u64 + 2);
        out.extend(c);
    }
    let all = read_all(&out, false).unwrap();
    assert_eq!(all.events, sent);
    assert_eq!(all.skipped, ["unknown chunk kind 0x0100"]);
    assert_eq!(all.report.unknown_chunks, 1);
    assert!(all.report.trailer.is_some());
}

#[test]
fn trailing_fields_from_a_newer_minor_version_are_ignored() {
    // A THREAD record with one extra appended field (a varint 300), as a format 1.1 writer might emit.
    let (bytes, _) = sample_file(false);
    let bounds = chunk_bounds(&bytes);
    let (a, b) = bounds[2];
    assert_eq!(&bytes[a + 4..a + 6], &4u16.to_le_bytes(), "chunk 2 is THREAD");
    let mut c = bytes[a..b].to_vec();
    c.extend([0xac, 0x02]);
    let len = (c.len() - 56) as u32;
    c[8..12].copy_from_slice(&len.to_le_bytes());
    c[12..16].copy_from_slice(&len.to_le_bytes());
    reseal(&mut c, 2);
    let mut out = bytes[..a].to_vec();
    out.extend(c);
    out.extend(&bytes[b..]);
    let all = read_all(&out, false).unwrap();
    assert_eq!(all.threads[0].name, "MainThread");
    assert!(all.report.clean());
}

#[test]
fn calibration_round_trips_and_fills_a_table() {
    let mut w = Writer::new(Vec::new(), "m", &ocular_format::testing::header(), WriterOptions::default()).unwrap();
    let c = Calibration { costs: vec![(EventKind::PY_START as u8, 210.5), (EventKind::JUMP as u8, 95.0)] };
    w.calibration(&c).unwrap();
    let bytes = w.finish(crate::util::trailer()).unwrap();
    let all = read_all(&bytes, false).unwrap();
    assert_eq!(all.calibration.as_ref(), Some(&c));
    let t = c.table(120.0);
    assert_eq!((t[0], t[7], t[8]), (210.5, 95.0, 120.0));
    let r = Reader::new(std::io::Cursor::new(&bytes), "m", ReadOptions::default()).unwrap();
    assert_eq!(r.version(), (ocular_format::MAJOR, ocular_format::MINOR));
}

/// Code objects added a few at a time (as the recorder hands them over) make one CODE chunk, written
/// just before the next chunk of another kind, compressed or not; later ones make the next CODE chunk.
#[test]
fn code_objects_added_in_parts_are_one_chunk_before_the_events() {
    use crate::util::{code, loop_events, trailer};
    let codec_zstd = 0x01; // FORMAT.md 3.3
    for compress in [true, false] {
        let opts = WriterOptions { compress, ..Default::default() };
        let mut w = Writer::new(Vec::new(), "<memory>", &ocular_format::testing::header(), opts).unwrap();
        // Enough code objects for zstd to have compressed some before the chunk is finished.
        let first: Vec<CodeObject> = (1..=300).map(|i| code(i, &format!("f{i}"))).collect();
        for part in first.chunks(64) {
            w.add_code_objects(part).unwrap();
        }
        w.events(7, &loop_events(300, 1_000, 20)).unwrap();
        w.add_code_objects(&[code(301, "late")]).unwrap();
        let bytes = w.finish(trailer()).unwrap();

        let mut r = Reader::new(std::io::Cursor::new(&bytes), "m", ReadOptions::default()).unwrap();
        let mut kinds = Vec::new();
        let mut ids = Vec::new();
        while let Some(c) = r.next_chunk().unwrap() {
            match c.body {
                Body::Code(objs) => {
                    kinds.push(format!("CODE({}, zstd={})", objs.len(), c.info.codec & codec_zstd != 0));
                    ids.extend(objs.iter().map(|o| o.id));
                    let want = code(objs[0].id, &objs[0].qualname);
                    assert_eq!(
                        (objs[0].bytecode.as_slice(), objs[0].first_line),
                        (want.bytecode.as_slice(), want.first_line)
                    );
                }
                Body::Events(e) => kinds.push(format!("EVENTS({})", e.len())),
                Body::Trailer(_) => kinds.push("TRAILER".into()),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            kinds,
            [
                format!("CODE(300, zstd={compress})"),
                "EVENTS(22)".into(),
                "CODE(1, zstd=false)".into(),
                "TRAILER".into()
            ]
        );
        assert_eq!(ids, (1..=301).collect::<Vec<u32>>());
    }
}

/// Writers hand their zstd contexts on to the process's next writers: what a writer writes must not
/// depend on whether its contexts are new, another writer's that finished, or one's that was dropped in
/// the middle of a CODE chunk (its frame left open).
#[test]
fn a_file_is_the_same_bytes_whatever_writer_had_its_zstd_contexts_before() {
    use crate::util::{code, loop_events, trailer};
    let objects: Vec<CodeObject> = (1..=200).map(|i| code(i, &format!("f{i}"))).collect();
    let write = || {
        let mut w =
            Writer::new(Vec::new(), "<memory>", &ocular_format::testing::header(), WriterOptions::default()).unwrap();
        for part in objects.chunks(64) {
            w.add_code_objects(part).unwrap();
        }
        w.events(7, &loop_events(300, 1_000, 20)).unwrap();
        w.finish(trailer()).unwrap()
    };
    let first = write();
    for round in 0..4 {
        // A writer given up on with a CODE chunk half made.
        let mut w =
            Writer::new(Vec::new(), "<memory>", &ocular_format::testing::header(), WriterOptions::default()).unwrap();
        w.add_code_objects(&objects[..(50 + 30 * round)]).unwrap();
        drop(w);
        assert!(write() == first, "round {round}: the same bytes");
    }
    assert!(read_all(&first, false).is_ok());
}

#[test]
fn skip_events_reads_the_metadata_and_counts_but_still_checks_events_chunks() {
    use std::io::Cursor;
    let (bytes, sent) = sample_file(true);
    let full = read_all(&bytes, false).unwrap();
    let skip = ReadOptions { skip_events: true, ..Default::default() };
    let mut r = Reader::new(Cursor::new(&bytes), "mem.ocl", skip).unwrap();
    let (mut counts, mut code, mut snapshots) = (Vec::new(), 0, 0);
    while let Some(c) = r.next_chunk().unwrap() {
        match c.body {
            Body::Events(e) => {
                assert!(e.is_empty());
                counts.push((c.info.thread_id, c.info.count as usize));
            }
            Body::Code(c) => code += c.len(),
            Body::Snapshot(s) => snapshots += s.len(),
            _ => {}
        }
    }
    assert_eq!(counts, sent.iter().map(|(t, e)| (*t, e.len())).collect::<Vec<_>>());
    assert_eq!((code, snapshots), (full.code.len(), full.snapshots.len()));
    assert_eq!(r.report().events, full.report.events);
    assert!(r.report().clean());
    // A damaged EVENTS payload is still found: its CRC is checked, only decoding is skipped.
    let (start, _) = chunk_bounds(&bytes).into_iter().find(|&(s, _)| bytes[s + 4] == 2).expect("an EVENTS chunk");
    let mut bad = bytes.clone();
    bad[start + 60] ^= 0x40;
    let err = first_error(&bad, skip);
    assert!(err.contains(&format!("offset {start}")) && err.contains("CRC"), "{err}");
}

/// The first error reading `bytes` chunk by chunk with `opts` (a panic if there is none).
fn first_error(bytes: &[u8], opts: ReadOptions) -> String {
    let mut r = Reader::new(std::io::Cursor::new(bytes), "mem.ocl", opts).unwrap();
    loop {
        match r.next_chunk() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the damage went unnoticed"),
            Err(e) => return e.to_string(),
        }
    }
}

#[test]
fn skip_code_leaves_code_objects_and_snapshots_out_but_still_checks_their_chunks() {
    use std::io::Cursor;
    let (bytes, _) = sample_file(true);
    let full = read_all(&bytes, false).unwrap();
    assert!(!full.code.is_empty() && !full.snapshots.is_empty(), "the sample has both");
    let skip = ReadOptions { skip_events: true, skip_code: true, ..Default::default() };
    let mut r = Reader::new(Cursor::new(&bytes), "mem.ocl", skip).unwrap();
    // The header comes whole but for its opcode tables, which only code objects need.
    let mut whole = Reader::new(Cursor::new(&bytes), "mem.ocl", ReadOptions::default()).unwrap().header().clone();
    assert!(!whole.opcodes.names.is_empty() && !whole.opcodes.base.is_empty());
    whole.opcodes = Default::default();
    assert_eq!(r.header(), &whole);
    let (mut code_chunks, mut snapshot_chunks, mut trailer) = (0, 0, false);
    while let Some(c) = r.next_chunk().unwrap() {
        match c.body {
            Body::Code(c) => {
                assert!(c.is_empty(), "a CODE chunk was decoded");
                code_chunks += 1;
            }
            Body::Snapshot(s) => {
                assert!(s.is_empty(), "a SNAPSHOT chunk was decoded");
                snapshot_chunks += 1;
            }
            Body::Events(e) => assert!(e.is_empty()),
            Body::Trailer(_) => trailer = true,
            _ => {}
        }
    }
    assert!(code_chunks > 0 && snapshot_chunks > 0 && trailer, "{code_chunks} {snapshot_chunks} {trailer}");
    assert!(r.report().clean());
    // A damaged CODE payload is still found: its CRC is checked, only decoding is skipped.
    let (start, end) = chunk_bounds(&bytes).into_iter().find(|&(s, _)| bytes[s + 4] == 3).expect("a CODE chunk");
    let mut bad = bytes.clone();
    bad[end - 1] ^= 0x40;
    let err = first_error(&bad, skip);
    assert!(err.contains(&format!("offset {start}")) && err.contains("CRC"), "{err}");
}

#[test]
fn events_too_alike_to_compress_within_the_readers_bound_are_stored_as_raw_records() {
    // Equal timestamps at one location: the columnar layout says it in a few bytes, more events per stored
    // byte than a reader decodes (FORMAT.md 3.1). The writer stores raw records instead, and they read back.
    let same: Vec<RawEvent> = (0..300_000).map(|_| RawEvent::new(5_000, 1, 8, 0, EventKind::LINE as u8)).collect();
    let mut w =
        Writer::new(Vec::new(), "<memory>", &ocular_format::testing::header(), WriterOptions::default()).unwrap();
    w.events(100, &same).unwrap();
    w.events(100, &loop_events(1, 6_000, 50)).unwrap();
    let bytes = w.finish(crate::util::trailer()).unwrap();
    let all = read_all(&bytes, false).unwrap();
    assert_eq!(all.events, [(100, same), (100, loop_events(1, 6_000, 50))]);
    assert!(all.report.clean());
    let codecs: Vec<u8> =
        chunk_bounds(&bytes).iter().filter(|(a, _)| bytes[a + 4] == 2).map(|(a, _)| bytes[a + 6]).collect();
    assert_eq!(codecs, [0x00, 0x11]);
}

#[test]
fn losses_are_gathered_per_thread_with_their_share_and_stretches() {
    let mut w = Writer::new(Vec::new(), "<memory>", &testing::header(), WriterOptions::default()).unwrap();
    w.code_objects(&[crate::util::code(1, "work")]).unwrap();
    let ms = |m: f64| 1_000 + (m * 3e6) as u64; // the test header: start at tick 1,000, 3 GHz
    let ev: Vec<RawEvent> = (0..10).map(|i| RawEvent::new(ms(0.5) + i, 1, 0, 0, EventKind::PY_START as u8)).collect();
    w.events(7, &ev).unwrap();
    // Two records that overlap make one stretch; a later one another.
    w.lost(&Lost { thread_id: 7, count: 5, first_ticks: ms(1.0), last_ticks: ms(1.5) }).unwrap();
    w.lost(&Lost { thread_id: 7, count: 3, first_ticks: ms(1.2), last_ticks: ms(2.0) }).unwrap();
    w.lost(&Lost { thread_id: 7, count: 2, first_ticks: ms(3.0), last_ticks: ms(3.1) }).unwrap();
    for t in 1..=9u64 {
        w.lost(&Lost { thread_id: 100 + t, count: t, first_ticks: ms(4.0), last_ticks: ms(4.0) }).unwrap();
    }
    let bytes = w.finish(crate::util::trailer()).unwrap();
    let all = crate::util::read_all(&bytes, false).unwrap();
    let r = &all.report;
    assert_eq!(r.lost, 10 + 45);
    let l = &r.losses[&7];
    assert_eq!((l.count, l.ranges.clone()), (10, vec![(ms(1.0), ms(2.0)), (ms(3.0), ms(3.1))]));
    assert_eq!(r.lost_share(7), 0.5);
    assert_eq!(r.lost_share(108), 1.0);
    assert_eq!(r.lost_share(8), 0.0);
    let lines = r.loss_lines();
    assert_eq!(lines.len(), 9, "{lines:#?}");
    assert_eq!(
        lines[0],
        "thread 7 lost 10 of its 20 events (50.0%) in 2 stretches between 1.000 ms and 3.100 ms after the start: the \
         recorder could not keep them (its writer fell behind, or could not write the file), so that thread's figures miss them"
    );
    assert!(lines[1].starts_with("thread 109 lost 9 of its 9 events (100.0%) from 4.000 ms to 4.000 ms after"));
    assert_eq!(lines[8], "2 more threads lost 3 events in all (info --json lists every thread)");
    // Every command prints them with the reader's other warnings; losses do not make a file unclean.
    assert!(r.clean());
    assert_eq!(r.warnings("t.ocl")[0], format!("t.ocl: {}", lines[0]));
}

/// A trace whose writer died without its trailer (here: never written), of a process that is gone, is
/// completed in place: every event kept, a trailer, read as closed; a finished trace is left alone.
#[test]
fn complete_gives_a_dead_process_s_trace_its_trailer_and_leaves_a_finished_one_alone() {
    use ocular_format::{complete::complete, testing, EventKind, RawEvent, Writer};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.ocl");
    let mut header = testing::header();
    header.pid = 4_194_000; // near the largest pid Linux hands out: no such process here
    let events: Vec<RawEvent> =
        (0..100u64).map(|i| RawEvent::new(1_000 + i, 1, 0, 0, EventKind::PY_START as u8)).collect();
    let mut w = Writer::new(std::fs::File::create(&path).unwrap(), "killed.ocl", &header, Default::default()).unwrap();
    w.events(7, &events).unwrap();
    drop(w.finish_open());
    let done = complete(&path).unwrap().expect("completed");
    assert_eq!((done.events, done.recovered), (100, 0));
    let mut r = ocular_format::Reader::open_with(&path, Default::default()).unwrap();
    let mut n = 0;
    while let Some(c) = r.next_chunk().unwrap() {
        if let ocular_format::Body::Events(e) = c.body {
            n += e.len();
        }
    }
    assert_eq!(n, 100);
    assert!(r.report().clean(), "{:?}", r.report().warnings("killed.ocl"));
    assert_eq!(complete(&path).unwrap(), None, "a finished trace is left alone");
}
