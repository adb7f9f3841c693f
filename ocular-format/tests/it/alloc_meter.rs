//! A global allocator that tracks the peak of live bytes of one thread (the one inside `peak_during`), so
//! tests can prove the reader's memory is bounded by what a file actually contains, not by what its length
//! fields claim. Other tests run on other threads at the same time: counting their allocations too made
//! the bound fail now and then (a peak of 100 MB seen for a 1 KB file).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Meter;

std::thread_local! {
    /// This thread is being measured: (live bytes since the start, which may go below 0 when it frees
    /// what it had before; their peak).
    static METER: Cell<Option<(isize, isize)>> = const { Cell::new(None) };
}

/// Adds `delta` bytes to the measuring thread's live bytes (nothing on other threads).
fn count(delta: isize) {
    let _ = METER.try_with(|m| {
        if let Some((live, peak)) = m.get() {
            let live = live + delta;
            m.set(Some((live, peak.max(live))));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counters are
// bookkeeping only (thread-local cells with constant initializers, which never allocate).
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Runs `f` and returns the peak of heap bytes this thread had live above what it had when it started.
pub fn peak_during(f: impl FnOnce()) -> usize {
    METER.with(|m| m.set(Some((0, 0))));
    f();
    let (_, peak) = METER.with(|m| m.replace(None)).unwrap_or((0, 0));
    peak.max(0) as usize
}
