//! Stacks read when a window is due (FORMAT.md 5.7), by the windows' own thread, without the GIL.
//!
//! A window opens at the next safe point of a thread running Python code, which a long C call, an explicit collection or a
//! sleep can put off by as long as they last. What the program was doing at the due moment is read here,
//! the way out-of-process samplers read it: the thread state's current frame, then each interpreter frame's
//! code object and the frame before it. The threads run on meanwhile, so every read goes through
//! `process_vm_readv` on this very process, which returns an error instead of faulting on memory that a
//! returning frame or an exiting thread gave back; a stack whose current frame changed during the read is
//! thrown away (its thread was running Python code, and its window opens within microseconds anyway); and
//! the code pointers read are only ever compared with the recording's own table of code objects, never
//! dereferenced, so a stale pointer names no frame.
//!
//! The layout read is `_PyInterpreterFrame`'s first two words, the code object (a tagged reference since
//! 3.14: its low bits are masked) and the previous frame, the same in CPython 3.12 to 3.15; [`check`]
//! compares what it reads with the interpreter's own frame objects before any recording uses it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The deepest stack read (frames beyond are left out, outermost ones).
const MAX_DEPTH: usize = 1024;

/// Set when [`check`] found the layout as expected.
static USABLE: AtomicBool = AtomicBool::new(false);

/// The recording threads' `PyThreadState` addresses, for the windows' thread: registered when a thread first
/// records (with the GIL), read at each due moment (without it).
static THREADS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A window that fell due: when, and the stacks read then (per thread state: the code objects' addresses,
/// outermost first, and whether the thread was running Python code; `None`: not read).
pub(super) struct Due {
    pub generation: u64,
    pub ticks: u64,
    pub stacks: Vec<(usize, Option<Read>)>,
}

/// A thread's stack as read at a due moment: its code objects' addresses, outermost first, and whether the
/// thread was running Python code meanwhile.
pub(super) type Read = (Vec<usize>, bool);

/// Windows that fell due and have not opened yet, oldest first.
static QUEUE: Mutex<Vec<Due>> = Mutex::new(Vec::new());

/// At most this many windows wait for one opening (a stretch of ~40 s without a safe point at the default
/// period); older ones are dropped, and the stretch is seen through the newest.
const MAX_QUEUED: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers a recording thread's thread state (idempotent).
pub(super) fn register(pyts: usize) {
    if pyts != 0 {
        let mut t = lock(&THREADS);
        if !t.contains(&pyts) {
            t.push(pyts);
        }
    }
}

/// Forgets a thread whose thread state is about to go.
pub(super) fn unregister(pyts: usize) {
    lock(&THREADS).retain(|&p| p != pyts);
}

/// Forgets every thread and every queued window (a recording starts or stops).
pub(super) fn reset() {
    lock(&THREADS).clear();
    lock(&QUEUE).clear();
}

/// Queues a window due now: reads every registered thread's stack, then the clock. The window is due when
/// the reading ended, not when it began: the interpreter is asked to open it right after, so no call a thread
/// makes while the stacks are read can fall inside the window unrecorded (FORMAT.md 5.7, calls from due).
pub(super) fn queue(generation: u64) {
    let threads = lock(&THREADS).clone();
    let stacks =
        threads.into_iter().map(|p| (p, if USABLE.load(Ordering::Relaxed) { read(p) } else { None })).collect();
    let ticks = ocular_record::clock::ticks();
    let mut q = lock(&QUEUE);
    q.retain(|d| d.generation == generation);
    if q.len() >= MAX_QUEUED {
        q.remove(0);
    }
    q.push(Due { generation, ticks, stacks });
}

/// The queued windows of `generation` whose due moment read thread `pyts`: (position in the queue, oldest
/// first; due tick; what was read), without taking them.
pub(super) fn pending_for(generation: u64, pyts: usize) -> Vec<(usize, u64, Option<Read>)> {
    let q = lock(&QUEUE);
    q.iter()
        .filter(|d| d.generation == generation)
        .enumerate()
        .filter_map(|(i, d)| d.stacks.iter().find(|(p, _)| *p == pyts).map(|(_, r)| (i, d.ticks, r.clone())))
        .collect()
}

/// Takes the queued windows of `generation`, oldest first.
pub(super) fn take(generation: u64) -> Vec<Due> {
    let mut q = lock(&QUEUE);
    let all = std::mem::take(&mut *q);
    all.into_iter().filter(|d| d.generation == generation).collect()
}

/// Reads `len` bytes at `addr` of this process into `out`; false if any of it is not mapped.
fn peek(addr: usize, out: &mut [u8]) -> bool {
    if addr == 0 {
        return false;
    }
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: the local buffer is ours and as long as said; the remote range is only read by the kernel,
    // which fails (EFAULT) instead of faulting where it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

fn word(addr: usize) -> Option<usize> {
    let mut b = [0u8; 8];
    peek(addr, &mut b).then(|| usize::from_ne_bytes(b))
}

/// Whether the frame layout read here was checked (on any thread) and found as expected.
pub(super) fn layout_checked() -> bool {
    USABLE.load(Ordering::Relaxed)
}

/// The thread's current interpreter frame (0: none).
fn current_frame(pyts: usize) -> Option<usize> {
    let at = super::callbacks::frame_field()?;
    let p = word(pyts + at)?;
    if super::callbacks::frame_indirect() {
        if p == 0 {
            return Some(0);
        }
        return word(p);
    }
    Some(p)
}

/// A thread's frames as (frame address, code object address), outermost first; `None` if unreadable.
fn walk(top: usize) -> Option<Vec<(usize, usize)>> {
    let mut frames = Vec::new();
    let mut f = top;
    while f != 0 && frames.len() < MAX_DEPTH {
        if f % 8 != 0 {
            return None;
        }
        let mut b = [0u8; 16];
        if !peek(f, &mut b) {
            return None;
        }
        let code = usize::from_ne_bytes(b[..8].try_into().expect("8 bytes")) & !7;
        let prev = usize::from_ne_bytes(b[8..].try_into().expect("8 bytes"));
        frames.push((f, code));
        f = prev;
    }
    frames.reverse();
    Some(frames)
}

/// A thread's frames' code object addresses, outermost first, and whether the thread was running Python
/// code meanwhile (its current frame moved during the read). A running thread's stack is read twice, and
/// only the outer frames both reads agree on (same frame, same code) are kept: the frames that came and
/// went meanwhile are below the sampler's resolution anyway. `None`: nothing could be read.
pub(super) fn read(pyts: usize) -> Option<Read> {
    let top = current_frame(pyts)?;
    let first = walk(top)?;
    let again = current_frame(pyts)?;
    if again == top {
        return Some((first.into_iter().map(|(_, c)| c).collect(), false));
    }
    let second = walk(again)?;
    let common = first.iter().zip(&second).take_while(|(a, b)| a == b).map(|(a, _)| a.1).collect();
    Some((common, true))
}

/// Checks the layout on the calling thread: the frames read here, less those the interpreter does not
/// show as frames (its own entry frames), must be the code objects of `frames`, outermost first.
pub(super) fn check(pyts: usize, frames: &[usize]) -> bool {
    let ok = read(pyts).is_some_and(|(raw, _)| {
        let mut want = frames.iter().peekable();
        for c in raw {
            if want.peek() == Some(&&c) {
                want.next();
            }
        }
        want.next().is_none() && !frames.is_empty()
    });
    USABLE.store(ok, Ordering::Relaxed);
    ok
}

/// Whether stacks are read at due moments: the layout checked out when the last recording with windows
/// started its windows.
#[pyo3::pyfunction]
pub(super) fn due_stacks_usable() -> bool {
    USABLE.load(Ordering::Relaxed)
}
