//! Ocular's own threads, joined, may still count as the process's threads for a moment: Linux wakes the
//! joiner as the thread exits, and removes the thread from its process a little later. CPython's `os.fork`
//! warns that the process is multi-threaded from that count (`/proc/self/stat`), so a fork right after a
//! recording stopped could warn of threads that were Ocular's and already gone. Each of Ocular's threads
//! notes its id as it ends ([`note_exit`]); before a fork, [`wait_gone`] waits, a bounded time, until the
//! kernel no longer lists them.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Ids of ended threads not yet waited for; 0: a free place. Atomics, not a lock: a fork may come while a
/// thread notes itself, and the child must not inherit a held lock.
static ENDED: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];

/// The calling thread, one of Ocular's, is ending: its last action.
pub fn note_exit() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for slot in &ENDED {
            if slot.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
        // Every place taken (64 threads ended since the last fork, as with a recording per test): the
        // place of one the kernel no longer lists is taken.
        for slot in &ENDED {
            let old = slot.load(Ordering::Acquire);
            if !listed(old) && slot.compare_exchange(old, tid, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

/// Waits until the kernel no longer lists the threads noted by [`note_exit`], for at most `limit` in all.
pub fn wait_gone(limit: Duration) {
    let until = Instant::now() + limit;
    for slot in &ENDED {
        let tid = slot.swap(0, Ordering::AcqRel);
        if tid == 0 {
            continue;
        }
        while listed(tid) && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Whether the kernel lists thread `tid` in this process.
fn listed(tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn ended_thread() -> i32 {
        std::thread::spawn(|| {
            note_exit();
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() }
        })
        .join()
        .expect("the thread ends")
    }

    // One test, as nothing else here waits: the places are the process's (other tests' rings note the
    // threads that give them back meanwhile, so only this test's threads are looked for).
    #[test]
    fn ended_threads_are_waited_for_until_gone_and_a_full_table_reuses_places_of_gone_ones() {
        let noted = |tid: i32| ENDED.iter().filter(|s| s.load(Ordering::Relaxed) == tid).count();
        let tid = ended_thread();
        assert_eq!(noted(tid), 1);
        wait_gone(Duration::from_secs(5));
        assert!(!listed(tid));
        assert_eq!(noted(tid), 0, "its place is free again");

        for slot in &ENDED {
            slot.store(i32::MAX, Ordering::Relaxed); // no such thread
        }
        let tid = ended_thread();
        assert_eq!(noted(tid), 1);
        wait_gone(Duration::from_secs(5));
        assert_eq!(noted(tid) + noted(i32::MAX), 0);
    }
}
