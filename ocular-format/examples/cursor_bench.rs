//! How fast a live cursor (RING.md 6) reads: a ring file of 64 full slots of 65,536 events (4 Mi events,
//! as a recording leaves them for a reader), read by a cursor opened before they were written; best of 5.
//!
//!     cargo run --release -p ocular-format --example cursor_bench

use ocular_format::live::Cursor;
use ocular_format::ring::{Layout, RingWriter};
use ocular_format::{EventKind, RawEvent};

fn main() {
    let dir = std::env::temp_dir().join(format!("ocular-cursor-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (slots, per) = (64u32, 65_536u32);
    let layout = Layout { slot_events: per, max_slots: slots, meta_capacity: 4096, chunks_capacity: 0, slot_ext: true };
    let mut best = f64::MAX;
    let mut total = 0;
    for round in 0..5 {
        let path = dir.join(format!("b{round}.ring"));
        let w = RingWriter::create(&path, std::process::id(), 0, 1e9, layout).expect("ring");
        for s in 0..slots {
            w.prepare_slot(s).expect("slot");
        }
        let mut c = Cursor::open(&path).expect("cursor");
        let mut ticks = 1u64;
        for s in 0..slots {
            // Four threads, each with 16 slots one after the other.
            let thread = 100 + (s % 4) as u64;
            w.filling(s, thread, ticks, (s / 4) as u64 * per as u64);
            let p = w.prepare_slot_ptr(s);
            for k in 0..per as usize {
                let kind = if k % 2 == 0 { EventKind::PY_START } else { EventKind::PY_RETURN };
                // SAFETY: k < per, the slot's size.
                unsafe { p.add(k).write(RawEvent::new(ticks, 1 + (k % 7) as u32, 2 * k as u32, 0, kind as u8)) };
                ticks += 3;
            }
            w.full(s, per);
        }
        let (mut n, mut sum) = (0u64, 0u64);
        let t0 = std::time::Instant::now();
        let p = c.poll(|_, e| {
            n += 1;
            sum = sum.wrapping_add(e.code.get() as u64);
        });
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!((p.events, p.missed, n), (slots as u64 * per as u64, 0, slots as u64 * per as u64));
        best = best.min(secs);
        total = n + sum % 2;
        drop(w);
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir(&dir);
    println!(
        "cursor: {} events in {:.1} ms (best of 5): {:.0} M events/s",
        total,
        best * 1e3,
        total as f64 / best / 1e6
    );
}
