//! Performance counters (FORMAT.md 6.9): what the kernel samples, and what cannot be had.

use ocular_record::counters::{spec, Counters};

fn tid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

#[test]
fn page_faults_of_fresh_memory_are_sampled_on_the_thread_that_touches_it() {
    let c = Counters::new(vec![spec("page-faults").unwrap()], tid());
    assert!(c.any(), "{:?}", c.errors());
    let before = c.drain();
    assert_eq!(before.counters[0].name, "page-faults");
    // 64 MiB, written a byte per page: 16,384 faults (fewer with transparent huge pages).
    let layout = std::alloc::Layout::from_size_align(64 << 20, 4096).unwrap();
    // SAFETY: a non-zero size; the memory is written only within it and freed with the same layout.
    unsafe {
        let p = std::alloc::alloc(layout);
        assert!(!p.is_null());
        for i in (0..layout.size()).step_by(4096) {
            p.add(i).write_volatile(1);
        }
        std::alloc::dealloc(p, layout);
    }
    let s = c.drain();
    let faults: u64 = s.samples.iter().filter(|x| x.thread_id == tid()).map(|x| x.period).sum();
    assert!(faults >= 32, "{faults} faults sampled");
    assert!(s.samples.iter().all(|x| x.monotonic_ns > 0 && x.counter == 0));
    // Each sample is within the test's time (CLOCK_MONOTONIC).
    let now = {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    assert!(s.samples.iter().all(|x| x.monotonic_ns <= now && x.monotonic_ns > now - 60_000_000_000));
}

#[test]
fn a_counter_that_cannot_be_had_says_why_and_the_others_work() {
    let c = Counters::new(vec![spec("task-clock").unwrap(), spec("instructions").unwrap()], tid());
    let errors = c.errors();
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu").exists();
    if pmu {
        eprintln!("this machine has a PMU: instructions can be counted, so no error is expected");
        assert!(errors.is_empty(), "{errors:?}");
    } else {
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, "instructions");
        assert!(errors[0].1.contains("no hardware performance counters"), "{}", errors[0].1);
    }
    assert!(c.any());
    let info = c.info();
    assert_eq!((info[0].name.as_str(), info[0].unit.as_str(), info[0].period), ("task-clock", "ns", 1_000_000));
}

#[test]
fn counter_names_and_periods_are_checked() {
    assert_eq!(spec("page-faults:10").unwrap().period, 10);
    assert!(spec("nope").unwrap_err().starts_with("unknown counter \"nope\": Ocular knows task-clock, page-faults"));
    assert!(spec("task-clock:0").unwrap_err().contains("whole number above 0"));
    assert!(spec("task-clock:x").is_err());
}
