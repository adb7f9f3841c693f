//! The ring file (RING.md): its layout byte by byte, what a reader takes from it, and the recovery of a
//! trace whose recording was killed.

use ocular_format::ring::{path_for, state, Layout, RingFile, RingWriter};
use ocular_format::*;

const LAYOUT: Layout = Layout { slot_events: 8, max_slots: 4, meta_capacity: 4096, chunks_capacity: 0, slot_ext: true };

fn ev(t: u64, code: u32) -> RawEvent {
    RawEvent::new(t, code, 2, 0, EventKind::PY_START as u8)
}

/// Writes `events` into slot `slot` as a thread would (ticks last does not matter here: no crash).
fn fill(w: &RingWriter, slot: u32, events: &[RawEvent]) {
    let p = w.prepare_slot(slot).unwrap();
    for (i, e) in events.iter().enumerate() {
        // SAFETY: the slot holds LAYOUT.slot_events events; the tests write at most that many.
        unsafe { p.add(i).write(*e) };
    }
}

/// A two-instruction code object of `w.py` named `q`.
fn code(id: u32, q: &str) -> CodeObject {
    CodeObject {
        id,
        name: q.into(),
        qualname: q.into(),
        filename: "w.py".into(),
        first_line: 1,
        flags: 3,
        bytecode: vec![151, 0, 83, 0],
        linetable: Vec::new(),
        positions: vec![Position { line: 1, end_line: 1, column: 0, end_column: 4 }; 2],
    }
}

/// A pid that is not running: a child that already exited.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn the_header_and_slot_table_are_where_ring_md_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.ocl.ring");
    let w = RingWriter::create(&path, 4242, 1000, 3.0e9, LAYOUT).unwrap();
    w.filling(2, 77, 5000, 123_456);
    w.full(2, 6);
    assert!(w.append_meta(0x0004, b"abc"));
    w.set_trace(std::path::Path::new("/t/run.ocl"));
    let bytes = std::fs::read(&path).unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(&bytes[0..8], b"OCLRING\0");
    assert_eq!((u16::from_le_bytes([bytes[8], bytes[9]]), u16::from_le_bytes([bytes[10], bytes[11]])), (1, 4));
    // Since 1.4: the trace's path, its length at 144 and its bytes from 148.
    assert_eq!((u32_at(144), &bytes[148..158]), (10, &b"/t/run.ocl"[..]));
    assert_eq!(bytes[158], 0);
    assert_eq!((u32_at(12), u32_at(16), u32_at(20)), (4096, 4242, 1));
    assert_eq!((u64_at(24), f64::from_le_bytes(bytes[32..40].try_into().unwrap())), (1000, 3.0e9));
    assert_eq!((u32_at(40), u32_at(44), u64_at(48)), (8, 4, 4096));
    // 4 entries of 32 bytes after the header, then (1.2) 4 of 16 bytes, round up to the next page; 4 slots
    // of 8 x 24 bytes then.
    assert_eq!((u64_at(56), u64_at(64), u64_at(72)), (8192, 8192 + 4096, 4096));
    assert_eq!(u64_at(136), 4096 + 4 * 32, "the slot extension table follows the slot table");
    assert_eq!(u64_at(4096 + 4 * 32 + 2 * 16), 123_456, "slot 2's events_before");
    assert_eq!((u64_at(80), u64_at(88)), (9, 0), "one record: 4-byte length, 2-byte kind, 3 bytes");
    let e = 4096 + 2 * 32;
    assert_eq!((u64_at(e), u64_at(e + 8), u32_at(e + 16), u32_at(e + 20), u64_at(e + 24)), (77, 5000, 2, 6, 1));
    let m = 8192 + 4096;
    assert_eq!((u32_at(m), u16::from_le_bytes([bytes[m + 4], bytes[m + 5]])), (5, 4));
    assert_eq!(&bytes[m + 6..m + 9], b"abc");
    assert_eq!(bytes.len(), 8192 + 4096 + 4096);
    w.finish().unwrap();
    assert!(!path.exists(), "a clean end removes the ring file");
}

#[test]
fn a_filling_slot_ends_where_its_ticks_stop_rising_and_a_full_one_at_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.ocl.ring");
    let w = RingWriter::create(&path, 1, 0, 1e9, LAYOUT).unwrap();
    // Slot 0 was used before (older ticks), then taken again at 500: three new events, then the old ones.
    fill(&w, 0, &[ev(100, 1), ev(110, 1), ev(120, 1), ev(130, 1), ev(140, 1)]);
    fill(&w, 0, &[ev(500, 2), ev(510, 2), ev(505, 2)]);
    w.filling(0, 9, 500, 0);
    // Slot 1: full with 2 events of 8 (flushed early, at the thread's end).
    fill(&w, 1, &[ev(200, 3), ev(210, 3), ev(220, 3)]);
    w.filling(1, 9, 200, 0);
    w.full(1, 2);
    // Slot 2: handed to the writer and written: free, not pending.
    fill(&w, 2, &[ev(300, 4)]);
    w.filling(2, 8, 300, 0);
    w.full(2, 1);
    w.free(2);
    let r = RingFile::open(&path).unwrap();
    let pending = r.pending();
    assert_eq!(pending.len(), 2);
    assert_eq!((pending[0].thread_id, pending[0].start_ticks, pending[0].full), (9, 200, true));
    assert_eq!(pending[0].events, [ev(200, 3), ev(210, 3)]);
    assert_eq!((pending[1].start_ticks, pending[1].full), (500, false));
    assert_eq!(pending[1].events, [ev(500, 2), ev(510, 2)], "505 went back in time: stale from here on");
    assert_eq!(state::FULL, 2);
}

#[test]
fn metadata_that_does_not_fit_is_counted_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let w = RingWriter::create(&dir.path().join("r"), 1, 0, 1e9, LAYOUT).unwrap();
    assert!(w.append_meta(3, &[7; 4000]));
    assert!(!w.append_meta(3, &[7; 100]), "4006 + 106 bytes exceed 4096");
    assert!(w.append_meta(3, &[7; 80]));
    let r = RingFile::open(&dir.path().join("r")).unwrap();
    assert_eq!(r.meta().iter().map(|(k, p)| (*k, p.len())).collect::<Vec<_>>(), [(3, 4000), (3, 80)]);
    assert_eq!(r.meta_dropped, 1);
}

#[test]
fn a_foreign_truncated_or_oversized_ring_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    std::fs::write(&p, b"not a ring file at all").unwrap();
    let e = RingFile::open(&p).unwrap_err().to_string();
    assert!(e.contains("not an Ocular ring file"), "{e}");
    std::fs::remove_file(&p).unwrap();
    drop(RingWriter::create(&p, 1, 0, 1e9, LAYOUT).unwrap());
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[44..48].copy_from_slice(&1_000_000u32.to_le_bytes()); // a million slots in a 16 KiB file
    std::fs::write(&p, &bytes).unwrap();
    let e = RingFile::open(&p).unwrap_err().to_string();
    assert!(e.contains("layout does not fit its 16384 bytes"), "{e}");
    bytes[8] = 2;
    std::fs::write(&p, &bytes).unwrap();
    let e = RingFile::open(&p).unwrap_err().to_string();
    assert!(e.contains("ring file version 2.4, this Ocular reads 1.x"), "{e}");
    std::fs::write(&p, &bytes[..100]).unwrap();
    assert!(RingFile::open(&p).is_err());
}

/// A trace whose process died: its file has the header, the ring chunk, code object 1 and one EVENTS
/// chunk; its ring has that chunk's slot (written, not yet freed), a full slot and a filling one, code
/// objects 1 and 2 and a thread name.
fn killed_trace(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    killed_trace_with(dir, pid, false)
}

/// As [`killed_trace`]; with `header_record`, the ring starts with the trace's header (RING.md 5: it can be
/// read alone).
fn killed_trace_with(dir: &std::path::Path, pid: u32, header_record: bool) -> std::path::PathBuf {
    let ocl = dir.join("run.ocl");
    let ring_path = path_for(&ocl);
    let mut header = testing::header();
    header.pid = pid;
    if pid == std::process::id() {
        // A recording of this process, which started after it did (else its pid is all it shares with it).
        header.start_ticks = ocular_format::now_ticks();
    }
    let ring = RingWriter::create(&ring_path, pid, header.start_ticks, header.ticks_per_second, LAYOUT).unwrap();
    ring.set_trace(&ocl);
    if header_record {
        assert!(ring.append_meta(0x0001, &postcard::to_allocvec(&header).unwrap()));
    }
    let mut w =
        Writer::new(std::fs::File::create(&ocl).unwrap(), "run.ocl", &header, WriterOptions::default()).unwrap();
    w.ring(&RingInfo { path: ring_path.display().to_string() }).unwrap();
    w.code_objects(&[code(1, "f")]).unwrap();
    let written = [ev(2000, 1), ev(2010, 1)];
    w.events(5, &written).unwrap();
    drop(w); // no trailer: the process was killed
    let (mut one, mut framed) = (Vec::new(), Vec::new());
    for c in [code(1, "f"), code(2, "g")] {
        framed.clear();
        frame_code(&c, &mut one, &mut framed).unwrap();
        assert!(ring.append_meta(0x0003, &framed));
    }
    let t = ThreadInfo { thread_id: 6, name: "worker".into(), is_main: false };
    assert!(ring.append_meta(0x0004, &postcard::to_allocvec(&t).unwrap()));
    slot(&ring, 0, 5, 0, &written, true);
    slot(&ring, 1, 5, 0, &[ev(3000, 2), ev(3005, 2), ev(3009, 2)], true);
    slot(&ring, 2, 6, 0, &[ev(4000, 2), ev(4001, 1)], false);
    ocl
}

/// Slot `i` taken by thread `thread` as its `events_before`-th event on, holding `events`, and handed to
/// the writer if `full` (else the thread was still filling it).
fn slot(ring: &RingWriter, i: u32, thread: u64, events_before: u64, events: &[RawEvent], full: bool) {
    fill(ring, i, events);
    ring.filling(i, thread, events[0].ticks.get(), events_before);
    if full {
        ring.full(i, events.len() as u32);
    }
}

#[test]
fn a_killed_recording_is_completed_from_its_ring_file() {
    let dir = tempfile::tempdir().unwrap();
    let ocl = killed_trace(dir.path(), dead_pid());
    let mut r = Reader::open(&ocl).unwrap();
    let (mut events, mut code, mut threads) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(c) = r.next_chunk().unwrap() {
        match c.body {
            Body::Events(e) => events.push((c.info.thread_id, e.iter().map(|e| e.ticks.get()).collect::<Vec<_>>())),
            Body::Code(objs) => code.extend(objs.into_iter().map(|o| o.qualname)),
            Body::Thread(t) => threads.push(t.name),
            _ => {}
        }
    }
    assert_eq!(code, ["f", "g"], "code object 2 comes from the ring, and once");
    assert_eq!(threads, ["worker"]);
    assert_eq!(
        events,
        [(5, vec![2000, 2010]), (5, vec![3000, 3005, 3009]), (6, vec![4000, 4001])],
        "the written slot is not repeated; the full and the filling ones follow, per thread"
    );
    let rec = r.report().recovered.clone().unwrap();
    assert_eq!((rec.events, rec.threads, rec.records, rec.dropped), (5, 2, 2, 0));
    assert_eq!(r.report().events, 7);
    let w = r.report().warnings("run.ocl");
    assert!(
        w.iter().any(|w| w.starts_with(
            "run.ocl: no trailer: the recording did not end (killed or crashed); read up \
             to its last whole chunk, then recovered 5 events of 2 threads and 2 code objects and names from"
        )),
        "{w:?}"
    );
}

/// The start of a killed recording in `dir`: `run.ocl` of a process that is gone, its ring file, and the
/// trace's writer with the `RING` chunk and code object 1 (`f`) written, for a test to write the rest.
fn dead_recording(dir: &std::path::Path) -> (std::path::PathBuf, RingWriter, Writer<std::fs::File>) {
    let ocl = dir.join("run.ocl");
    let ring_path = path_for(&ocl);
    let mut header = testing::header();
    header.pid = dead_pid();
    let ring = RingWriter::create(&ring_path, header.pid, header.start_ticks, header.ticks_per_second, LAYOUT).unwrap();
    ring.set_trace(&ocl);
    let mut w =
        Writer::new(std::fs::File::create(&ocl).unwrap(), "run.ocl", &header, WriterOptions::default()).unwrap();
    w.ring(&RingInfo { path: ring_path.display().to_string() }).unwrap();
    w.code_objects(&[code(1, "f")]).unwrap();
    (ocl, ring, w)
}

#[test]
fn events_in_neither_the_trace_nor_its_ring_are_said_lost_where_they_were() {
    // A thread's buffer that was not a ring slot (a heap buffer, when the ring has no slot left) and that
    // the writer had not written when the process died is in neither file. The next slot's place in the
    // thread's stream (RING.md 3.2.1) says how many events came before it: the gap is a LOST record, where
    // the trace read as whole before.
    let dir = tempfile::tempdir().unwrap();
    let (ocl, ring, mut w) = dead_recording(dir.path());
    let written = [ev(2000, 1), ev(2010, 1)];
    w.events(5, &written).unwrap();
    // No trailer: the process was killed. Its first slot written, and still in the ring; then 700 events
    // in a buffer that is nowhere; then a full slot and the one the thread was filling.
    drop(w);
    slot(&ring, 0, 5, 0, &written, true);
    slot(&ring, 1, 5, 702, &[ev(3000, 1), ev(3005, 1), ev(3009, 1)], true);
    slot(&ring, 2, 5, 705, &[ev(4000, 1), ev(4001, 1)], false);
    let mut r = Reader::open(&ocl).unwrap();
    let (mut events, mut lost) = (Vec::new(), Vec::new());
    while let Some(c) = r.next_chunk().unwrap() {
        match c.body {
            Body::Events(e) => events.extend(e.iter().map(|e| e.ticks.get())),
            Body::Lost(l) => lost.push((l.thread_id, l.count, l.first_ticks, l.last_ticks)),
            _ => {}
        }
    }
    assert_eq!(events, [2000, 2010, 3000, 3005, 3009, 4000, 4001]);
    assert_eq!(lost, [(5, 700, 2010, 3000)]);
    assert_eq!(r.report().lost, 700);
    // Completed, the trace keeps the record.
    let done = ocular_format::complete::complete(&ocl).unwrap().unwrap();
    assert_eq!((done.recovered, done.events), (5, 7));
    let mut r = Reader::open(&ocl).unwrap();
    while r.next_chunk().unwrap().is_some() {}
    assert!(r.report().trailer.is_some());
    assert_eq!(r.report().lost, 700);
}

#[test]
fn a_ring_file_is_not_used_while_its_process_runs_nor_for_another_trace() {
    let dir = tempfile::tempdir().unwrap();
    // This process: the recording could still be writing; its trace is followed, not completed.
    let ocl = killed_trace(dir.path(), std::process::id());
    let mut r = Reader::open(&ocl).unwrap();
    let mut n = 0;
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            n += e.len();
        }
    }
    assert_eq!((n, r.report().recovered.is_none()), (2, true));
    // A ring file of another recording (other start ticks) beside a trace of a dead process.
    let dir2 = tempfile::tempdir().unwrap();
    let ocl2 = killed_trace(dir2.path(), dead_pid());
    RingWriter::create(&path_for(&ocl2), 1, 999, 1e9, LAYOUT).unwrap();
    let mut r = Reader::open(&ocl2).unwrap();
    while r.next_chunk().unwrap().is_some() {}
    assert!(r.report().recovered.is_none());
}

#[test]
fn a_ring_file_in_use_is_never_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r");
    let _first = RingWriter::create(&p, std::process::id(), ocular_format::now_ticks(), 1e9, LAYOUT).unwrap();
    // Two recordings sharing slots wrote over each other's events: the second is refused instead.
    let e = RingWriter::create(&p, std::process::id(), ocular_format::now_ticks(), 1e9, LAYOUT).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    assert_ne!(ocular_format::ring::path_for_recording(&p, 7, 0), ocular_format::ring::path_for_recording(&p, 7, 1));
}

/// Rings `d0.ring` .. `d{n-1}.ring` in `dir`, of a process that is gone, made `apart` from each other.
fn dead_rings(dir: &std::path::Path, n: usize, apart: std::time::Duration) {
    let gone = dead_pid();
    for i in 0..n {
        RingWriter::create(&dir.join(format!("d{i}.ring")), gone, 0, 1e9, LAYOUT).unwrap();
        std::thread::sleep(apart);
    }
}

/// The names of the files in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn a_sweep_keeps_the_newest_rings_of_gone_processes_and_every_live_one() {
    let dir = tempfile::tempdir().unwrap();
    dead_rings(dir.path(), 5, std::time::Duration::from_millis(20)); // distinct modification times
    let _live =
        RingWriter::create(&dir.path().join("live.ring"), std::process::id(), ocular_format::now_ticks(), 1e9, LAYOUT)
            .unwrap();
    std::fs::write(dir.path().join("other.ring"), b"not a ring").unwrap();
    assert_eq!(ocular_format::ring::sweep(dir.path(), std::time::Duration::from_secs(3600), 2), 3);
    assert_eq!(names_in(dir.path()), ["d3.ring", "d4.ring", "live.ring", "other.ring"]);
    assert_eq!(ocular_format::ring::sweep(dir.path(), std::time::Duration::ZERO, 8), 2, "old ones go whatever");
}

#[test]
fn a_sweep_given_up_stops_before_the_next_ring_and_leaves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    dead_rings(dir.path(), 4, std::time::Duration::ZERO);
    let count = |n: usize| names_in(dir.path()).len() == n;
    // Given up at once: nothing looked at, nothing removed.
    let never = std::time::Duration::from_secs(3600);
    assert_eq!(ocular_format::ring::sweep_unless(dir.path(), never, 0, &|| true), None);
    assert!(count(4));
    // Given up after the four rings were looked at and two settled: those two are gone, the others stay.
    let asked = std::cell::Cell::new(0);
    let after_six = || {
        asked.set(asked.get() + 1);
        asked.get() > 6
    };
    assert_eq!(ocular_format::ring::sweep_unless(dir.path(), never, 0, &after_six), None);
    assert!(count(2));
    assert_eq!(ocular_format::ring::sweep_unless(dir.path(), never, 0, &|| false), Some(2));
    assert!(count(0));
}

#[test]
fn a_ring_s_name_saves_opening_it_but_never_settles_a_live_recording() {
    let dir = tempfile::tempdir().unwrap();
    let (gone, me) = (dead_pid(), std::process::id());
    let now = ocular_format::now_ticks();
    // Named after a live process, made by a dead one: opened, found dead, settled.
    RingWriter::create(&dir.path().join(format!("a.ocl.{me}-0.ring")), gone, 0, 1e9, LAYOUT).unwrap();
    // Named after a dead process, its recording alive (this one): settling checks the owner again.
    let _live = RingWriter::create(&dir.path().join(format!("b.ocl.{gone}-0.ring")), me, now, 1e9, LAYOUT).unwrap();
    assert_eq!(ocular_format::ring::sweep(dir.path(), std::time::Duration::ZERO, 0), 1);
    assert_eq!(names_in(dir.path()), [format!("b.ocl.{gone}-0.ring")]);
}

fn read_all(path: &std::path::Path) -> (Vec<u64>, Reader<ocular_format::Source>) {
    let mut r = Reader::open(path).unwrap();
    let mut ticks = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            ticks.extend(e.iter().map(|e| e.ticks.get()));
        }
    }
    (ticks, r)
}

const ALL_TICKS: [u64; 7] = [2000, 2010, 3000, 3005, 3009, 4000, 4001];

#[test]
fn a_sweep_completes_a_dead_recordings_trace_before_it_removes_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let ocl = killed_trace(dir.path(), dead_pid());
    let ring = path_for(&ocl);
    assert_eq!(RingFile::open(&ring).unwrap().trace.as_deref(), Some(ocl.as_path()));
    // Beyond the newest 0: settled.
    assert_eq!(ocular_format::ring::sweep(dir.path(), std::time::Duration::from_secs(3600), 0), 1);
    assert!(!ring.exists());
    let (mut ticks, r) = read_all(&ocl);
    ticks.sort();
    assert_eq!(ticks, ALL_TICKS, "every event the ring held is in the trace");
    assert!(r.report().trailer.is_some() && r.report().warnings("run.ocl").is_empty(), "{:?}", r.report());
}

#[test]
fn a_ring_whose_trace_is_gone_becomes_a_trace_of_its_own_or_stays() {
    let dir = tempfile::tempdir().unwrap();
    let ocl = killed_trace(dir.path(), dead_pid());
    let ring = path_for(&ocl);
    std::fs::remove_file(&ocl).unwrap();
    // This ring has no HEADER record (RING.md 5), so it cannot be read alone: it is the only copy of the
    // recording's events, and stays.
    assert_eq!(ocular_format::ring::sweep(dir.path(), std::time::Duration::ZERO, 0), 0);
    assert!(ring.exists());
    let e = ocular_format::ring::settle(&ring).unwrap_err().to_string();
    assert!(e.contains("run.ocl.ring"), "{e}");
    // With its header, it is written as a trace beside where its own was, and then removed.
    let dir2 = tempfile::tempdir().unwrap();
    let ocl2 = killed_trace_with(dir2.path(), dead_pid(), true);
    let ring2 = path_for(&ocl2);
    std::fs::remove_file(&ocl2).unwrap();
    let settled = ocular_format::ring::settle(&ring2).unwrap();
    let own = dir2.path().join("run.ocl.recovered.ocl");
    assert_eq!(settled, ocular_format::ring::Settled::Written(own.clone()));
    assert!(!ring2.exists());
    let (mut ticks, r) = read_all(&own);
    ticks.sort();
    assert_eq!(ticks, ALL_TICKS);
    assert!(r.report().trailer.is_some());
}

#[test]
fn a_trace_whose_ring_is_gone_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ocl = killed_trace(dir.path(), dead_pid());
    let ring = path_for(&ocl);
    std::fs::remove_file(&ring).unwrap();
    let (ticks, r) = read_all(&ocl);
    assert_eq!(ticks, [2000, 2010]);
    let w = r.report().warnings("run.ocl");
    let want = format!("run.ocl: no trailer: the recording did not end, and its ring file {} is gone", ring.display());
    assert!(w.iter().any(|w| w.starts_with(&want)), "{w:?}");
}

#[test]
fn a_zombie_is_not_a_running_recording() {
    // A killed child its parent has not reaped yet: its trace is to be completed, not followed.
    let mut c = std::process::Command::new("sh").args(["-c", "kill -9 $$"]).spawn().unwrap();
    let pid = c.id();
    std::thread::sleep(std::time::Duration::from_millis(200)); // dead, not yet waited for: a zombie
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(stat.contains(") Z "), "{stat}");
    let dir = tempfile::tempdir().unwrap();
    let ocl = killed_trace(dir.path(), pid);
    let mut r = Reader::open(&ocl).unwrap();
    while r.next_chunk().unwrap().is_some() {}
    assert!(r.report().recovered.is_some(), "the zombie's ring was not used");
    c.wait().unwrap();
}

/// One thread's EVENTS chunk of `n` events from `t0`, as a flight recorder's writer makes it (seq 0).
fn events_chunk(thread: u64, t0: u64, n: u64) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), "mem", &testing::header(), WriterOptions::default()).unwrap();
    let evs: Vec<RawEvent> = (0..n).map(|i| ev(t0 + i * 7, 1)).collect();
    let mut chunks = w.events_chunks(thread, &evs).unwrap();
    assert_eq!(chunks.len(), 1);
    chunks.remove(0)
}

const FLIGHT: Layout =
    Layout { slot_events: 8, max_slots: 4, meta_capacity: 4096, chunks_capacity: 1024, slot_ext: true };

#[test]
fn chunk_records_are_where_ring_md_says_and_wrap_with_a_pad() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.ring");
    let w = RingWriter::create(&path, 4242, 1000, 3.0e9, FLIGHT).unwrap();
    let c = events_chunk(9, 5000, 20);
    let size = 24 + c.len() as u64;
    let padded = size.div_ceil(8) * 8;
    let fit = 1024 / padded;
    assert!(fit >= 2, "the test needs at least two records in the region ({padded} bytes each)");
    for _ in 0..fit {
        w.push_chunk(&c).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    // Header (RING.md 3.1): the chunk region after the metadata region, head, tail, evicted.
    let region = u64_at(64) as usize + 4096;
    assert_eq!((u64_at(96), u64_at(104)), (region as u64, 1024));
    assert_eq!((u64_at(112), u64_at(120), u64_at(128)), (fit * padded, 0, 0));
    assert_eq!(bytes.len(), region + 4096);
    // The first record (RING.md 3.5): size, magic, events before it, the thread's first ticks, the chunk.
    assert_eq!(u32::from_le_bytes(bytes[region..region + 4].try_into().unwrap()) as u64, size);
    assert_eq!(&bytes[region + 4..region + 8], b"OCRR");
    assert_eq!((u64_at(region + 8), u64_at(region + 16)), (0, 5000));
    assert_eq!(&bytes[region + 24..region + 24 + c.len()], &c[..]);
    let second = region + padded as usize;
    assert_eq!((u64_at(second + 8), u64_at(second + 16)), (20, 5000), "20 events of the thread before it");
    // The next record does not fit before the end: a pad (size 0) there, the record at the region's start,
    // and the records it overwrites are gone from the tail.
    w.push_chunk(&c).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let at_end = region + (fit * padded) as usize;
    if fit * padded < 1024 {
        assert_eq!(u32::from_le_bytes(bytes[at_end..at_end + 4].try_into().unwrap()), 0, "a pad");
    }
    assert_eq!((u64_at(112), u64_at(120), u64_at(128)), (1024 + padded, padded, 1));
    assert_eq!((u64_at(region + 8), u64_at(region + 16)), (fit * 20, 5000));
    assert_eq!(w.dropped(), vec![Dropped { thread_id: 9, events: 20, first_ticks: 5000, last_ticks: 5000 + 19 * 7 }]);
    let (records, bytes_held, evicted) = w.chunk_stats();
    assert_eq!((records as u64, bytes_held, evicted), (fit, fit * padded, 1));
    let r = RingFile::open(&path).unwrap();
    let (recs, damaged) = r.chunks();
    assert!(!damaged);
    assert_eq!(recs.len() as u64, fit);
    assert_eq!(recs.iter().map(|r| r.events_before).collect::<Vec<_>>(), (1..=fit).map(|i| i * 20).collect::<Vec<_>>());
    assert!(recs.iter().all(|r| r.chunk == &c[..]));
}

#[test]
fn a_chunk_larger_than_the_region_is_refused_and_the_smallest_region_holds_any_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Layout { chunks_capacity: 64, ..FLIGHT };
    let w = RingWriter::create(&dir.path().join("t.ring"), 1, 0, 1e9, tiny).unwrap();
    let c = events_chunk(1, 100, 20);
    let e = w.push_chunk(&c).unwrap_err();
    assert_eq!(e.to_string(), format!("a chunk of {} bytes does not fit a ring of 64 bytes", 24 + c.len()));
    // The worst a buffer of 65,536 events compresses to, as FORMAT.md 3.1 bounds it: 2.7 MB.
    let least = Layout::min_chunks_capacity(65536);
    assert!((2_600_000..2_800_000).contains(&least), "{least}");
    assert_eq!(least % 8, 0);
}

/// A flight recorder killed after its ring wrapped: its `.ocl` file holds metadata only, its ring holds the
/// newest chunks of two threads and a filling slot.
fn killed_flight(dir: &std::path::Path, pid: u32) -> (std::path::PathBuf, std::path::PathBuf) {
    let ocl = dir.join("fr.ocl");
    let ring_path = dir.join("fr.ring");
    let mut header = testing::header();
    header.pid = pid;
    if pid == std::process::id() {
        // A recording of this process, which started after it did (else its pid is all it shares with it).
        header.start_ticks = ocular_format::now_ticks();
    }
    let ring = RingWriter::create(&ring_path, pid, header.start_ticks, header.ticks_per_second, FLIGHT).unwrap();
    assert!(ring.append_meta(0x0001, &postcard::to_allocvec(&header).unwrap()));
    let mut w = Writer::new(std::fs::File::create(&ocl).unwrap(), "fr.ocl", &header, WriterOptions::default()).unwrap();
    w.ring(&RingInfo { path: ring_path.display().to_string() }).unwrap();
    let code = code(1, "f");
    w.code_objects(std::slice::from_ref(&code)).unwrap();
    drop(w);
    let (mut one, mut framed) = (Vec::new(), Vec::new());
    frame_code(&code, &mut one, &mut framed).unwrap();
    assert!(ring.append_meta(0x0003, &framed));
    // Thread 7's chunks at 10,000, 20,000, ... and thread 8's: alternating, so the oldest go first.
    for k in 0..12u64 {
        ring.push_chunk(&events_chunk(7 + k % 2, 10_000 * (k + 1), 20)).unwrap();
    }
    fill(&ring, 0, &[ev(500_000, 1), ev(500_001, 1), ev(500_002, 1)]);
    ring.filling(0, 7, 500_000, 0);
    (ocl, ring_path)
}

fn ticks_by_thread(r: &mut Reader<Source>) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut out = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            out.entry(c.info.thread_id).or_default().extend(e.iter().map(|e| e.ticks.get()));
        }
    }
    out
}

#[test]
fn a_killed_flight_recorder_is_read_from_its_ring_with_what_it_overwrote() {
    let dir = tempfile::tempdir().unwrap();
    let (ocl, ring_path) = killed_flight(dir.path(), dead_pid());
    let kept = RingFile::open(&ring_path).unwrap().chunks().0.len() as u64;
    assert!((2..12).contains(&kept), "the ring wrapped: {kept} of 12 chunks kept");
    for path in [&ocl, &ring_path] {
        let mut r = Reader::open(path).unwrap();
        let got = ticks_by_thread(&mut r);
        // The newest `kept` chunks, each thread's in time order, then the filling slot's 3 events.
        let mut want = std::collections::BTreeMap::<u64, Vec<u64>>::new();
        for k in 12 - kept..12 {
            want.entry(7 + k % 2).or_default().extend((0..20).map(|i| 10_000 * (k + 1) + i * 7));
        }
        want.entry(7).or_default().extend([500_000, 500_001, 500_002]);
        assert_eq!(got, want, "{}", path.display());
        let report = r.report();
        let rec = report.recovered.clone().unwrap();
        assert_eq!((rec.ring_chunks, rec.chunk_events, rec.events), (kept, kept * 20, kept * 20 + 3));
        assert_eq!(rec.alone, path == &ring_path);
        // What was overwritten, per thread: 12 - kept chunks of 20 events, from the thread's first.
        let gone = 12 - kept;
        let d7 = report.dropped.get(&7).unwrap();
        assert_eq!((d7.events, d7.first_ticks), (gone.div_ceil(2) * 20, 10_000));
        if gone >= 2 {
            assert_eq!(report.dropped.get(&8).unwrap().first_ticks, 20_000);
        }
        assert_eq!(report.dropped.values().map(|d| d.events).sum::<u64>(), gone * 20);
    }
}

#[test]
fn a_ring_file_alone_is_refused_while_its_process_runs_or_without_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ring_path) = killed_flight(dir.path(), std::process::id());
    let e = Reader::open(&ring_path).unwrap_err().to_string();
    assert!(e.contains("is still running: its ring is being rewritten; ask it for a dump"), "{e}");
    let old = dir.path().join("old.ring");
    RingWriter::create(&old, dead_pid(), 0, 1e9, LAYOUT).unwrap();
    let e = Reader::open(&old).unwrap_err().to_string();
    assert!(e.contains("a ring file without a HEADER record"), "{e}");
}

/// Writes `events` into slot `slot` from index `from`, ticks last, as the recording does.
fn append(w: &RingWriter, slot: u32, from: usize, events: &[RawEvent]) {
    let p = w.prepare_slot_ptr(slot);
    for (i, e) in events.iter().enumerate() {
        // SAFETY: the tests stay within LAYOUT.slot_events.
        unsafe { p.add(from + i).write(*e) };
    }
}

#[test]
fn a_cursor_follows_slots_from_when_it_opens_and_counts_exactly_what_it_missed() {
    use ocular_format::live::{Cursor, End};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.ring");
    let w = RingWriter::create(&path, std::process::id(), ocular_format::now_ticks(), 1e9, LAYOUT).unwrap();
    // Thread 5 has recorded 3 events before the cursor opens: they are not delivered.
    w.prepare_slot(0).unwrap();
    w.filling(0, 5, 100, 0);
    append(&w, 0, 0, &[ev(100, 1), ev(101, 1), ev(102, 1)]);
    let mut c = Cursor::open(&path).unwrap();
    let take = |c: &mut Cursor| {
        let mut v = Vec::new();
        let p = c.poll(|t, e| v.push((t, e.ticks.get())));
        (v, p)
    };
    assert_eq!(take(&mut c).0, vec![]);
    // Two more, then the slot fills (8 events) and is handed over; the thread goes on in slot 1.
    append(&w, 0, 3, &[ev(103, 1), ev(104, 1)]);
    let (v, p) = take(&mut c);
    assert_eq!((v, p.missed), (vec![(5, 103), (5, 104)], 0));
    append(&w, 0, 5, &[ev(105, 1), ev(106, 1), ev(107, 1)]);
    w.full(0, 8);
    w.prepare_slot(1).unwrap();
    w.filling(1, 5, 108, 8);
    append(&w, 1, 0, &[ev(108, 1)]);
    let (v, p) = take(&mut c);
    assert_eq!((v.len(), p.missed), (4, 0), "105-107 from the full slot, then 108: {v:?}");
    // The writer frees slot 0; it is read no more. Slot 1 fills and is freed, and slot 0 is taken again
    // for slot 1's successor, all before the next poll: slot 1's 7 unread events are still in it (freed,
    // same generation), slot 0's old ones are gone, replaced by the thread's events 16..
    w.free(0);
    append(&w, 1, 1, &(109..116).map(|t| ev(t, 1)).collect::<Vec<_>>());
    w.full(1, 8);
    w.free(1);
    w.filling(0, 5, 116, 16);
    append(&w, 0, 0, &[ev(116, 1), ev(117, 1)]);
    let (v, p) = take(&mut c);
    assert_eq!(p.missed, 0);
    assert_eq!(v.iter().map(|x| x.1).collect::<Vec<_>>(), (109..118).collect::<Vec<_>>());
    // Now the cursor falls behind: slot 0 fills, slot 1 is taken for 24.., filled, freed, and slot 0 is
    // taken again for 32.., all unread.
    append(&w, 0, 2, &(118..124).map(|t| ev(t, 1)).collect::<Vec<_>>());
    w.full(0, 8);
    w.free(0);
    w.filling(1, 5, 124, 24);
    append(&w, 1, 0, &(124..132).map(|t| ev(t, 1)).collect::<Vec<_>>());
    w.full(1, 8);
    w.free(1);
    w.filling(0, 5, 132, 32);
    append(&w, 0, 0, &[ev(132, 1)]);
    // Slot 1 (the thread's events 24..32, 124..131) was freed but not taken again: still readable. Slot 0's
    // events 16..24 (118..123 unread) were overwritten by 32..: those 6 are missed, exactly.
    let (v, p) = take(&mut c);
    assert_eq!(v.iter().map(|x| x.1).collect::<Vec<_>>(), (124..133).collect::<Vec<_>>());
    assert_eq!(p.missed, 6);
    assert_eq!((c.delivered, c.missed), (2 + 4 + 9 + 9, 6));
    // A second thread appears in slot 2 from its first event.
    w.prepare_slot(2).unwrap();
    w.filling(2, 6, 200, 0);
    append(&w, 2, 0, &[ev(200, 2)]);
    w.finish().unwrap();
    let (v, p) = take(&mut c);
    assert_eq!((v, p.ended), (vec![(6, 200)], Some(End::Stopped)));
    assert_eq!(take(&mut c).1.ended, Some(End::Stopped));
}

#[test]
fn a_cursor_refuses_a_ring_file_that_cannot_be_followed() {
    use ocular_format::live::{find_ring, Cursor};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("old.ring");
    drop(RingWriter::create(&p, 1, 0, 1e9, Layout { slot_ext: false, ..LAYOUT }).unwrap());
    let e = Cursor::open(&p).unwrap_err().to_string();
    assert!(e.contains("an older Ocular (RING.md 1.0 or 1.1), which cannot be followed live"), "{e}");
    std::fs::write(&p, b"hello").unwrap();
    assert!(Cursor::open(&p).unwrap_err().to_string().contains("not an Ocular ring file"));
    let dead = dead_pid();
    let e = find_ring(dead).unwrap_err().to_string();
    assert_eq!(e, format!("process {dead}: no such process is running"));
    let e = find_ring(std::process::id()).unwrap_err().to_string();
    let said = format!("process {}: it is not recording with Ocular (no ring file of it in ", std::process::id());
    assert!(e.starts_with(&said), "{e}");
}

#[test]
fn a_ring_of_a_pid_that_a_later_process_reuses_is_a_dead_recordings() {
    use ocular_format::live::{find_ring, Cursor, End};
    // GIVEN a ring in the runtime directory naming this process's pid, from a recording that began before
    // this process did: a killed recording's, whose pid the system has given to this process since
    let dir = ocular_format::ring::runtime_dir().expect("a runtime directory");
    let pid = std::process::id();
    let uptime: f64 =
        std::fs::read_to_string("/proc/uptime").unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let tps = 1e6;
    let before_boot_plus_10s = ocular_format::now_ticks() - ((uptime + 10.0) * tps) as u64;
    let stale = dir.join(format!("reused.ocl.{pid}-0.ring"));
    let _w = RingWriter::create(&stale, pid, before_boot_plus_10s, tps, LAYOUT).unwrap();
    // THEN it is no recording of this process: not followed, read as ended, and settled by a sweep
    assert!(!RingFile::open(&stale).unwrap().owner_alive());
    let e = find_ring(pid).unwrap_err().to_string();
    assert!(e.contains("it is not recording with Ocular"), "{e}");
    assert_eq!(Cursor::open(&stale).unwrap().poll(|_, _| {}).ended, Some(End::Gone));
    let settled = ocular_format::ring::settle(&stale);
    assert!(settled.is_ok() && !stale.exists(), "{settled:?}");
    // WHILE a ring this process makes now is its own
    let tmp = tempfile::tempdir().unwrap();
    let own = RingWriter::create(&tmp.path().join("own.ring"), pid, ocular_format::now_ticks(), 1e9, LAYOUT).unwrap();
    assert!(RingFile::open(own.path()).unwrap().owner_alive());
}

#[test]
fn a_killed_recording_gets_its_c_functions_from_its_ring_file() {
    // GIVEN a trace whose CFUNC chunk names C callable 1, killed before it wrote callable 2, which its ring
    // file's metadata holds with callable 1 (RING.md 3.4, FORMAT.md 6.11)
    let dir = tempfile::tempdir().unwrap();
    let (ocl, ring, mut w) = dead_recording(dir.path());
    let f =
        |id: u32, q: &str| CFunction { id, qualname: q.into(), module: "builtins".into(), kind: CFunction::BUILTIN };
    w.c_functions(&[f(1, "len")]).unwrap();
    let call = |t: u64, id: u32| RawEvent::new(t, 1, 4, id, EventKind::CALL as u8);
    w.events(5, &[call(2000, 1)]).unwrap();
    drop(w);
    for c in [f(1, "len"), f(2, "isinstance")] {
        let mut framed = Vec::new();
        ocular_format::frame_c_function(&c, &mut framed).unwrap();
        assert!(ring.append_meta(0x000C, &framed));
    }
    fill(&ring, 0, &[call(3000, 2)]);
    ring.filling(0, 5, 3000, 0);
    drop(ring);
    // WHEN it is read, THEN callable 2 comes from the ring, once, before the events that call it
    let mut r = Reader::open(&ocl).unwrap();
    let mut seen = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        match c.body {
            Body::CFunctions(fs) => seen.extend(fs.into_iter().map(|f| format!("{} {}", f.id, f.qualname))),
            Body::Events(e) => seen.extend(e.iter().map(|e| format!("CALL {}", e.arg.get()))),
            _ => {}
        }
    }
    assert_eq!(seen, ["1 len", "CALL 1", "2 isinstance", "CALL 2"]);
    // AND completing the trace keeps both
    ocular_format::complete::complete(&ocl).unwrap().expect("completed");
    let all = crate::util::read_all(&std::fs::read(&ocl).unwrap(), false).unwrap();
    assert_eq!(all.cfuncs.iter().map(|f| f.qualname.as_str()).collect::<Vec<_>>(), ["len", "isinstance"]);
    assert!(all.report.clean());
}

#[test]
fn a_ring_whose_trace_directory_is_gone_is_written_to_the_fallback_directory_never_over_another() {
    let runtime = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let fallback = data.path().join("ocular/recovered");
    let mut written = vec![];
    for _ in 0..2 {
        let traces = tempfile::tempdir().unwrap();
        let ocl = killed_trace_with(traces.path(), dead_pid(), true);
        // The ring in the runtime directory, as a recording's is; its trace's directory then removed (a
        // test's temporary directory, after its recording was killed).
        let ring = runtime.path().join("run.ocl.4242-0.ring");
        std::fs::rename(path_for(&ocl), &ring).unwrap();
        drop(traces);
        assert!(!ocl.exists());
        // Nowhere to write: the ring stays, with the error of the place beside the trace.
        let e = ocular_format::ring::settle_to(&ring, None).unwrap_err().to_string();
        assert!(e.contains("run.ocl.4242-0.recovered.ocl"), "{e}");
        assert!(ring.exists());
        let settled = ocular_format::ring::settle_to(&ring, Some(&fallback)).unwrap();
        let ocular_format::ring::Settled::Written(own) = settled else { panic!("{settled:?}") };
        assert!(!ring.exists());
        let (mut ticks, r) = read_all(&own);
        ticks.sort();
        assert_eq!(ticks, ALL_TICKS, "every event the ring held is in {}", own.display());
        assert!(r.report().trailer.is_some());
        written.push(own);
    }
    // The same ring name a second time (a pid used again) does not replace the first recovered trace.
    assert_eq!(
        written,
        [fallback.join("run.ocl.4242-0.recovered.ocl"), fallback.join("run.ocl.4242-0.recovered-2.ocl")]
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_spare_slot_is_given_up_between_its_steps_of_pages_when_asked() {
    // The writer makes spare slots ahead of need; a stop does not wait for the rest of one (RING.md 3.2: a
    // slot no thread took stays free, and readers skip it).
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout { slot_events: 32768, ..LAYOUT }; // 768 KiB a slot: four steps of a quarter each
    let w = RingWriter::create(&dir.path().join("t.ring"), std::process::id(), now_ticks(), 1e9, layout).unwrap();
    let asked = std::cell::Cell::new(0);
    let after_one_step = || {
        asked.set(asked.get() + 1);
        asked.get() > 1
    };
    assert!(w.prepare_slot_unless(0, &after_one_step).unwrap().is_none());
    assert_eq!(asked.get(), 2, "asked before each step: one made, given up before the second");
    asked.set(0);
    let never = || {
        asked.set(asked.get() + 1);
        false
    };
    let p = w.prepare_slot_unless(1, &never).unwrap().expect("made whole");
    assert_eq!(asked.get(), 4);
    // SAFETY: slot 1 holds 32,768 events, its pages made.
    unsafe { p.add(32767).write(ev(9, 1)) };
    w.filling(1, 7, 1, 0);
    append(&w, 1, 0, &[ev(1, 1), ev(2, 1)]);
    let pending = w.pending(u64::MAX);
    assert_eq!(pending.iter().map(|s| s.thread_id).collect::<Vec<_>>(), vec![7], "slot 0, given up, is not read");
}
