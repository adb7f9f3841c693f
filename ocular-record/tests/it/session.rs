use ocular_format::{Body, EventKind, Lost, RawEvent, ReadOptions, Reader, ThreadInfo};
use ocular_record::clock::ClockPoint;
use ocular_record::session::{Buffer, Config, Discard, Pool, Session, Sink, ThreadBuffer};
use std::cell::RefCell;

fn ev(t: u64, off: u32) -> RawEvent {
    RawEvent::new(t, 1, off, off + 2, EventKind::JUMP as u8)
}

/// A fresh directory (removed when dropped) and the recording's path in it.
fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.ocl");
    (dir, path)
}

/// A sink that keeps what it is given, and hands out buffers only while `available` allows.
struct Scripted {
    pool: Pool,
    available: RefCell<usize>,
    submitted: RefCell<Vec<(u64, Vec<RawEvent>)>>,
    lost: RefCell<Vec<Lost>>,
    /// How long each `take` waits, in order (none once the list is used up).
    delays: RefCell<std::collections::VecDeque<std::time::Duration>>,
}

impl Scripted {
    fn new(buffer_events: usize, available: usize) -> Self {
        Scripted {
            pool: Pool::new(Config { buffer_events, max_buffers: usize::MAX, ..Config::default() }),
            available: RefCell::new(available),
            submitted: RefCell::default(),
            lost: RefCell::default(),
            delays: RefCell::default(),
        }
    }
}

impl Sink for Scripted {
    fn take(&self, _: u64, _: u64, _: u64) -> Option<Buffer> {
        if let Some(d) = self.delays.borrow_mut().pop_front() {
            std::thread::sleep(d);
        }
        let mut a = self.available.borrow_mut();
        (*a > 0).then(|| {
            *a -= 1;
            self.pool.take().unwrap()
        })
    }
    fn submit(&self, thread_id: u64, buf: Buffer, len: usize) {
        if len > 0 {
            self.submitted.borrow_mut().push((thread_id, buf[..len].to_vec()));
        }
    }
    fn lost(&self, lost: Lost) {
        self.lost.borrow_mut().push(lost);
    }
}

#[test]
fn full_buffers_are_submitted_in_order() {
    let sink = Scripted::new(4, 10);
    let mut tb = ThreadBuffer::new(7);
    for i in 0..10 {
        tb.push(ev(100 + i, i as u32), &sink);
    }
    assert_eq!(tb.len(), 2);
    tb.flush(&sink);
    let got = sink.submitted.borrow();
    let sizes: Vec<usize> = got.iter().map(|(_, e)| e.len()).collect();
    assert_eq!(sizes, [4, 4, 2]);
    let all: Vec<u64> = got.iter().flat_map(|(_, e)| e.iter().map(|e| e.ticks.get())).collect();
    assert_eq!(all, (100..110).collect::<Vec<_>>());
    assert_eq!(tb.pushed, 10);
    assert!(sink.lost.borrow().is_empty());
}

#[test]
fn a_buffer_that_took_long_to_get_is_written_down_as_a_pause_before_the_event_that_waited() {
    // FORMAT.md 5.6: buffers of 4; the first and third takes are quick, the second sleeps 5 ms.
    let sink = Scripted::new(4, 10);
    sink.delays.borrow_mut().extend([0, 5, 0].map(std::time::Duration::from_millis));
    let tps = ocular_record::clock::ticks_per_second(std::time::Duration::from_millis(20));
    let mut tb = ThreadBuffer::new(7).with_pause_threshold((tps * 1e-3) as u64);
    let before = ocular_record::clock::ticks();
    for i in 0..10 {
        tb.push(ev(before + i, i as u32), &sink);
    }
    tb.flush(&sink);
    let got = sink.submitted.borrow();
    let kinds: Vec<Vec<u8>> = got.iter().map(|(_, e)| e.iter().map(|e| e.kind).collect()).collect();
    let (j, p) = (EventKind::JUMP as u8, EventKind::PAUSE as u8);
    // The pause first in the new buffer, then the event that found the old one full; the quick takes none.
    assert_eq!(kinds, [vec![j, j, j, j], vec![p, j, j, j], vec![j, j, j]]);
    let (pause, waited) = (got[1].1[0], got[1].1[1]);
    let len = pause.pause_ticks() as f64 / tps;
    assert!((0.005..0.5).contains(&len), "{len} s");
    assert_eq!((pause.ticks.get(), waited.ticks.get()), (before + 4, before + 4), "the ticks of the event after it");
    assert_eq!((pause.code.get(), pause.offset.get(), pause.arg.get() as u64), (0, 0, pause.pause_ticks()));
    assert_eq!(tb.pushed, 11, "the pause is an event of the thread's");
}

#[test]
fn a_buffer_taken_for_a_marker_is_not_a_pause_of_the_stream() {
    // FORMAT.md 5.6: markers go into other threads' streams too, and with earlier ticks.
    let sink = Scripted::new(2, 10);
    sink.delays.borrow_mut().extend([0, 5].map(std::time::Duration::from_millis));
    let tps = ocular_record::clock::ticks_per_second(std::time::Duration::from_millis(20));
    let mut tb = ThreadBuffer::new(7).with_pause_threshold((tps * 1e-3) as u64);
    tb.push(ev(1, 0), &sink);
    tb.push(ev(2, 0), &sink);
    tb.push_marker(RawEvent::new(3, 0, 1, 0, EventKind::WINDOW_END as u8), &sink);
    tb.push(ev(4, 0), &sink);
    tb.flush(&sink);
    let kinds: Vec<Vec<u8>> = sink.submitted.borrow().iter().map(|(_, e)| e.iter().map(|e| e.kind).collect()).collect();
    let (j, w) = (EventKind::JUMP as u8, EventKind::WINDOW_END as u8);
    assert_eq!(kinds, [vec![j, j], vec![w, j]]);
}

#[test]
fn events_without_a_buffer_are_counted_with_their_time_range_and_reported_on_recovery() {
    // One buffer of 3, then none for a while: events 3..=7 are lost; then buffers return.
    let sink = Scripted::new(3, 1);
    let mut tb = ThreadBuffer::new(9);
    for i in 0..8 {
        tb.push(ev(1000 + i, 0), &sink);
    }
    assert_eq!(tb.lost_pending().count, 5);
    *sink.available.borrow_mut() = 5;
    tb.push(ev(2000, 0), &sink);
    assert_eq!(*sink.lost.borrow(), [Lost { thread_id: 9, count: 5, first_ticks: 1003, last_ticks: 1007 }]);
    tb.flush(&sink);
    let kept: Vec<u64> = sink.submitted.borrow().iter().flat_map(|(_, e)| e.iter().map(|e| e.ticks.get())).collect();
    assert_eq!(kept, [1000, 1001, 1002, 2000]);
}

#[test]
fn lost_events_pending_at_flush_are_reported() {
    let sink = Scripted::new(2, 1);
    let mut tb = ThreadBuffer::new(3);
    for i in 0..5 {
        tb.push(ev(i, 0), &sink);
    }
    tb.flush(&sink);
    assert_eq!(*sink.lost.borrow(), [Lost { thread_id: 3, count: 3, first_ticks: 2, last_ticks: 4 }]);
}

#[test]
fn rewind_and_discard_keep_nothing() {
    let sink = Discard::new(4);
    let mut tb = ThreadBuffer::new(1);
    for i in 0..10 {
        tb.push(ev(i, 0), &sink);
    }
    tb.rewind();
    assert_eq!(tb.len(), 0);
    assert_eq!(tb.lost_pending().count, 0, "a discarding sink always has a buffer");
}

/// A session at `path` with the test header and buffers of 100 events.
fn small_session(path: &std::path::Path) -> Session {
    let cfg = Config { buffer_events: 100, max_buffers: 64, ..Config::default() };
    Session::start(path, &ocular_format::testing::header(), cfg).unwrap()
}

#[test]
fn a_session_writes_every_thread_in_order_and_closes_cleanly() {
    let (_dir, path) = tmp();
    let session = small_session(&path);
    session.thread(ThreadInfo { thread_id: 1, name: "MainThread".into(), is_main: true });
    let mut a = ThreadBuffer::new(1);
    let mut b = ThreadBuffer::new(2);
    for i in 0..1000u64 {
        a.push(ev(10 * i, (i % 7) as u32 * 2), &session);
        if i % 3 == 0 {
            b.push(ev(10 * i + 5, 40), &session);
        }
    }
    a.flush(&session);
    b.flush(&session);
    let out = session.finish(ClockPoint::now());
    assert_eq!((out.events, out.lost, out.error.as_deref()), (1000 + 334, 0, None));
    assert_eq!(out.bytes, std::fs::metadata(&path).unwrap().len());

    let mut r = Reader::open_with(&path, ReadOptions::default()).unwrap();
    let (mut ta, mut tb_) = (Vec::new(), Vec::new());
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            let ticks = e.iter().map(|e| e.ticks.get());
            match c.info.thread_id {
                1 => ta.extend(ticks),
                2 => tb_.extend(ticks),
                t => panic!("unexpected thread {t}"),
            }
        }
    }
    assert_eq!(ta, (0..1000).map(|i| 10 * i).collect::<Vec<_>>());
    assert_eq!(tb_, (0..1000).step_by(3).map(|i| 10 * i + 5).collect::<Vec<_>>());
    assert!(r.report().clean());
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_bad_path_fails_at_start_with_the_path_in_the_message() {
    let err = Session::start("/nonexistent-dir/run.ocl".as_ref(), &ocular_format::testing::header(), Config::default())
        .unwrap_err();
    assert_eq!(err.to_string(), "/nonexistent-dir/run.ocl: No such file or directory (os error 2)");
}

#[test]
fn a_full_disk_fails_at_start() {
    if !std::path::Path::new("/dev/full").exists() {
        return;
    }
    let err = Session::start("/dev/full".as_ref(), &ocular_format::testing::header(), Config::default()).unwrap_err();
    assert_eq!(err.to_string(), "/dev/full: No space left on device (os error 28)");
}

#[test]
fn the_writer_thread_is_named() {
    let (_dir, path) = tmp();
    let session = Session::start(&path, &ocular_format::testing::header(), Config::default()).unwrap();
    // The new thread names itself when it starts running: poll for up to a second.
    let mut names = Vec::new();
    for _ in 0..100 {
        names = std::fs::read_dir("/proc/self/task")
            .map(|d| d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).collect())
            .unwrap_or_default();
        if names.iter().any(|n: &String| n.trim() == "ocular-writer") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = session.finish(ClockPoint::now());
    assert!(out.error.is_none());
    if !names.is_empty() {
        assert!(names.iter().any(|n| n.trim() == "ocular-writer"), "{names:?}");
    }
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_second_session_on_the_same_path_fails_and_the_first_file_stays_whole() {
    let (_dir, path) = tmp();
    let header = ocular_format::testing::header();
    let first = small_session(&path);
    let mut tb = ThreadBuffer::new(1);
    for i in 0..250u64 {
        tb.push(ev(10 * i, 2), &first);
    }
    // flock locks belong to the open file description: a second open in this process conflicts as
    // another process's would.
    let err = Session::start(&path, &header, Config::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: another recording is writing it; record to another path, or wait until that recording ends",
            path.display()
        )
    );
    for i in 250..300u64 {
        tb.push(ev(10 * i, 2), &first);
    }
    tb.flush(&first);
    let out = first.finish(ClockPoint::now());
    assert_eq!((out.events, out.error), (300, None));
    let mut r = Reader::open_with(&path, ReadOptions::default()).unwrap();
    let mut n = 0;
    while let Some(c) = r.next_chunk().unwrap() {
        if let Body::Events(e) = c.body {
            n += e.len();
        }
    }
    assert_eq!(n, 300);
    assert!(r.report().clean());
    // Once the first recording ended, the path is free again.
    let again = Session::start(&path, &header, Config::default()).unwrap();
    assert!(again.finish(ClockPoint::now()).error.is_none());
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn each_thread_holds_a_buffer_beyond_max_buffers() {
    // Two buffers may wait for the writer; a hundred threads each fill their own all the same (counting the
    // threads' own buffers against the limit left 37 of 100 threads with none).
    let pool = Pool::new(Config { buffer_events: 4, max_buffers: 2, overflow: false, ..Config::default() });
    let held: Vec<Buffer> = (0..100).map(|i| pool.take_held().unwrap_or_else(|| panic!("thread {i}"))).collect();
    assert_eq!(pool.allocated(), 100);
    // Buffers submitted to the writer are what max_buffers bounds: while two wait, a thread that
    // submitted its own gets a new one...
    let mut queued = Vec::new();
    let mut held = held.into_iter();
    for _ in 0..2 {
        queued.push(held.next().unwrap());
        pool.release();
    }
    assert!(pool.take_held().is_some(), "2 waiting for the writer: within max_buffers");
    // ... and with a third waiting, it finds none until the writer gives one back.
    queued.push(held.next().unwrap());
    pool.release();
    assert!(pool.take_held().is_none(), "3 waiting for the writer: beyond max_buffers");
    pool.give(queued.pop().unwrap());
    assert!(pool.take_held().is_some(), "a buffer the writer gave back");
}

#[test]
fn a_thread_that_finds_no_buffer_gets_a_small_one_while_the_overflow_budget_lasts() {
    // A thread per request submits its one buffer, mostly empty, as it ends: counted in buffers, the limit
    // let the writer fall only max_buffers such threads behind before events were dropped.
    let cfg = Config { buffer_events: 16 * 1024, max_buffers: 2, ..Config::default() };
    let (small, budget) = cfg.overflow_sizes();
    assert_eq!((small, budget), (1024, 8 * 1024), "a sixteenth of a buffer; a quarter of the pool's events");
    let pool = Pool::new(cfg);
    // Two buffers wait for the writer, beside the one the thread filling the next holds.
    let mut queued = Vec::new();
    for _ in 0..3 {
        queued.push(pool.take_held().expect("within max_buffers"));
        pool.release();
    }
    assert!(queued.iter().all(|b| b.len() == 16 * 1024 && !b.is_overflow()));
    // Beyond the limit: small heap buffers, until they hold the budget's events.
    for i in 0..budget / small {
        let b = pool.take_held().unwrap_or_else(|| panic!("overflow buffer {i}"));
        assert!(b.is_overflow() && b.len() == small && b.slot().is_none());
        pool.release();
        queued.push(b);
    }
    assert_eq!(pool.overflow_events(), budget);
    assert!(pool.take_held().is_none(), "the budget spent: nothing (on_full decides)");
    // The writer gives an overflow buffer back: freed, its room back in the budget, not kept as a spare.
    pool.recycle(queued.pop().unwrap(), false);
    assert_eq!(pool.overflow_events(), budget - small);
    let b = pool.take_held().expect("room for one more");
    assert!(b.is_overflow());
    // Without overflow, or with buffers too small for a useful one, the limit is the limit.
    let off = Config { overflow: false, ..cfg };
    assert_eq!(off.overflow_sizes(), (0, 0));
    let tiny = Config { buffer_events: 64, ..cfg };
    assert_eq!(tiny.overflow_sizes(), (0, 0));
}

#[test]
fn with_on_full_wait_a_thread_waits_for_the_writer_instead_of_dropping() {
    use ocular_record::session::OnFull;
    let pool = std::sync::Arc::new(Pool::new(Config {
        buffer_events: 4,
        max_buffers: 1,
        on_full: OnFull::Wait,
        ..Config::default()
    }));
    let mine = pool.take_held().unwrap();
    let spare = pool.take().unwrap();
    pool.release();
    let waiting = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.take_held().is_some())
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!waiting.is_finished(), "no buffer: the thread must wait");
    pool.give(mine);
    assert!(waiting.join().unwrap(), "it got the buffer the writer gave back");
    drop(spare);
}

#[test]
fn a_closing_pool_makes_no_new_spares() {
    // The writer tops the spares up as it recycles each written buffer, but not once the recording is
    // stopping: the last buffers' spares (ring slots, ~0.5 ms each) would never be filled, and stop() waited.
    let run = |close: bool| {
        let pool = Pool::new(Config { buffer_events: 4, max_buffers: 16, ..Config::default() });
        let b = pool.take().expect("a buffer");
        pool.recycle(b, true);
        assert_eq!(pool.allocated(), pool.spares(), "recycling tops the spares up");
        let (b, _kept) = (pool.take().expect("a spare"), pool.take().expect("a spare"));
        if close {
            pool.close();
        }
        pool.recycle(b, true);
        pool.allocated() - pool.spares()
    };
    assert_eq!(run(false), 1, "recording: one spare made to replace the one still taken");
    assert_eq!(run(true), 0, "closing: the buffer goes back, nothing new is made");
}

#[test]
fn a_new_ring_slot_is_its_first_part_until_it_comes_back_full() {
    // Making a whole slot (1.5 MiB of a memory file system's pages) took ~1 ms of the thread that found no
    // spare, or of the writer making spares: the start of every recording, and, while the pool grew, a
    // quarter of the writer's time in a thread per request, whose threads record a few hundred events each.
    // A slot is made a sixteenth at first, and whole once a thread has filled that.
    use ocular_format::ring::{Layout, RingWriter};
    let (dir, _) = tmp();
    let layout =
        Layout { slot_events: 65_536, max_slots: 8, meta_capacity: 1 << 16, chunks_capacity: 0, slot_ext: true };
    let ring = RingWriter::create(&dir.path().join("run.ring"), 1, 0, 1e9, layout).unwrap();
    let cfg = Config { buffer_events: 65_536, max_buffers: 8, ..Config::default() };
    let pool = Pool::new(cfg).with_ring(std::sync::Arc::new(ring));
    pool.make_first();
    let mut first = pool.take().expect("made at start");
    assert_eq!((first.slot(), first.len()), (Some(0), 4096), "start makes the first slot's first part");
    let mut second = pool.take().expect("made by the taking thread");
    assert_eq!((second.slot(), second.len()), (Some(1), 4096), "a thread that finds no spare: a first part");
    pool.add_spare();
    let mut spare = pool.take().expect("a spare");
    assert_eq!((spare.slot(), spare.len()), (Some(2), 4096), "the writer's spares too");
    // Every event of a part is writable, as the recording thread writes it. Back full: the writer makes
    // the rest, and the events already in it stay.
    first.fill(ev(7, 1));
    pool.recycle(first, true);
    let take = |slot| std::iter::from_fn(|| pool.take()).find(|b| b.slot() == Some(slot)).expect("free again");
    let mut whole = take(0);
    assert_eq!(whole.len(), 65_536, "completed when it came back full");
    assert_eq!((whole[0], whole[4095]), (ev(7, 1), ev(7, 1)), "its first part kept");
    whole.fill(ev(8, 2));
    // Back with a few events (its thread ended): it stays a part, for the next short thread.
    spare[..300].fill(ev(9, 3));
    pool.recycle(spare, false);
    assert_eq!(take(2).len(), 4096, "not full: left at its first part");
    // While the recording stops, nothing more is made.
    second.fill(ev(9, 3));
    pool.close();
    pool.recycle(second, true);
    assert_eq!(take(1).len(), 4096, "closing: left at its first part");
}

#[test]
fn a_session_with_a_ring_file_has_its_first_slot_ready_when_start_returns() {
    // A ring slot takes 0.5-1.4 ms to make; made by the program's thread at its first event, that time
    // read as the program's first line. start() makes it before the recording begins.
    let (_dir, path) = tmp();
    let cfg = Config { buffer_events: 1024, max_buffers: 64, ..Config::default() };
    let session = Session::start(&path, &ocular_format::testing::header(), cfg).unwrap();
    assert!(session.pool().ring().is_some(), "a regular file gets a ring file beside it");
    assert!(session.pool().allocated() >= 1, "a slot made before start returned");
    let b = session.pool().take().expect("a free slot, ready");
    assert!(b.slot().is_some(), "a slot of the ring file, not a heap buffer");
    session.pool().give(b);
    let out = session.finish(ClockPoint::now());
    assert!(out.error.is_none(), "{:?}", out.error);
}

/// Events per thread in the file at `path`, as far as it is written (a recording still running has no
/// trailer yet), in the file's order.
fn events_by_thread(path: &std::path::Path) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut r = Reader::open_with(path, ReadOptions::with_salvage(true)).unwrap();
    let mut by = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    while let Ok(Some(c)) = r.next_chunk() {
        if let Body::Events(e) = c.body {
            by.entry(c.info.thread_id).or_default().extend(e.iter().map(|e| e.ticks.get()));
        }
    }
    by
}

#[test]
fn an_ended_thread_s_last_buffer_reaches_the_file_while_the_recording_goes_on() {
    // Held back so that a thread's end does not wake the writer, it is written once nothing else has woken
    // the writer for a while: a reader of the file, or of its ring, is not left without it.
    let (_dir, path) = tmp();
    let session = small_session(&path);
    let mut t = ThreadBuffer::new(7);
    for i in 0..30u64 {
        t.push(ev(10 * i, 4), &session);
    }
    t.flush_last(&session);
    // Its ring slot is freed once the writer has written it (RING.md 3.2).
    let ring = session.pool().ring().expect("a ring file");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ring.pending(u64::MAX).iter().any(|s| s.thread_id == 7) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!ring.pending(u64::MAX).iter().any(|s| s.thread_id == 7), "written before the recording ended");
    let seen = events_by_thread(&path).remove(&7).unwrap_or_default();
    assert_eq!(seen, (0..30).map(|i| 10 * i).collect::<Vec<_>>());
    let out = session.finish(ClockPoint::now());
    assert_eq!((out.events, out.lost, out.error.as_deref()), (30, 0, None));
}

#[test]
fn last_buffers_held_back_keep_each_thread_s_order_and_all_reach_the_file() {
    // Twenty threads end (more than are held back at once), and one of them records again after its end was
    // seen (a thread's bootstrap returns before its last Python code runs): that later buffer is sent at
    // once, and must not reach the file before the held-back one.
    let (_dir, path) = tmp();
    let session = small_session(&path);
    let mut expected = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for tid in 1..=20u64 {
        let mut t = ThreadBuffer::new(tid);
        for i in 0..(tid * 3) {
            t.push(ev(1000 * tid + i, 2), &session);
            expected.entry(tid).or_default().push(1000 * tid + i);
        }
        t.flush_last(&session);
        if tid == 3 {
            for i in 100..350u64 {
                t.push(ev(1000 * tid + i, 2), &session);
                expected.entry(tid).or_default().push(1000 * tid + i);
            }
            t.flush(&session);
        }
    }
    let out = session.finish(ClockPoint::now());
    let total: usize = expected.values().map(Vec::len).sum();
    assert_eq!((out.events, out.lost, out.error.as_deref()), (total as u64, 0, None));
    assert_eq!(events_by_thread(&path), expected);
}
