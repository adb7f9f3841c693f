//! The `sys.monitoring` callbacks: raw C functions behind a vectorcall object ([`Callback`]), so a call
//! costs less than a built-in function's (no PyO3 argument parsing, no panic trampoline, no reference
//! pool, no `cfunction_vectorcall_FASTCALL` layer). The path for an event of a
//! code object this thread has seen: read the TSC, one thread-local load, one cache compare, two inline
//! int reads, (with a threshold) one counter, and `ThreadBuffer::push`.

use super::windows::close_first_window;
use super::{
    attach, lookup, name_thread, state, thread_ending, Cached, CodeState, ThreadState, BOOT, CODE_CACHE, FIRST_CALLS,
    FIRST_LIMIT, RECORD, WINDOW_END,
};
use ocular_format::{EventKind, RawEvent};
use ocular_record::clock;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::IntoPyObject;
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

thread_local! {
    // const-initialized and not Drop: no lazy-init check and no destructor registration on access.
    static TS: Cell<*mut ThreadState> = const { Cell::new(ptr::null_mut()) };
    // Registered on a thread's first event; its destructor runs when the thread exits.
    static EXIT: ExitGuard = const { ExitGuard(Cell::new(0), Cell::new(ptr::null_mut())) };
}

/// The thread that produced the last event, and its state. A thread-local lookup in a shared library is
/// a call to `__tls_get_addr`; comparing the thread pointer with the last one is one load and a compare,
/// and consecutive events mostly come from the same thread (the GIL makes them take turns). Written only
/// with the GIL held; cleared by `stop` and by a thread's exit.
static LAST_TP: AtomicUsize = AtomicUsize::new(0);
static LAST_TS: AtomicPtr<ThreadState> = AtomicPtr::new(ptr::null_mut());

/// Clears `LAST_TP` when its thread exits: the C library may give the exiting thread's thread pointer to
/// the next thread it creates, which must not inherit this thread's state. Thread-local destructors run
/// before the thread's memory is reused, and after the thread's last Python code: its state is then
/// handed over to be retired (`super::retire_ended`).
struct ExitGuard(Cell<usize>, Cell<*mut ThreadState>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let tp = self.0.get();
        if tp != 0 {
            let _ = LAST_TP.compare_exchange(tp, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        let ts = self.1.get();
        if !ts.is_null() {
            super::thread_exited(ts);
        }
    }
}

/// The thread pointer: on x86-64 Linux, `fs:0` holds the address of the thread's own control block
/// (the TLS ABI requires it), unique among live threads.
#[inline(always)]
fn thread_pointer() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: reads the first word of the thread control block, which the x86-64 TLS ABI defines to
        // hold the thread pointer; no memory is written.
        unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        0 // never equals a stored LAST_TP, which is only set when this is non-zero
    }
}

pub(super) fn set_thread_state(p: *mut ThreadState) {
    TS.with(|c| c.set(p));
}

/// Forgets the last thread (at stop, and in a forked child).
pub(super) fn forget_last_thread() {
    LAST_TP.store(0, Ordering::Relaxed);
    LAST_TS.store(ptr::null_mut(), Ordering::Relaxed);
}

#[inline(always)]
fn none() -> *mut ffi::PyObject {
    // SAFETY: Py_None is immortal on 3.12+, where Py_RETURN_NONE itself returns it without a new reference
    // (its reference count is never changed, so the caller's decref is a no-op).
    unsafe { ffi::Py_None() }
}

/// # Safety
/// GIL held and a recording in progress.
#[inline(always)]
unsafe fn disable() -> *mut ffi::PyObject {
    // SAFETY: the recorder exists (caller) and holds a strong reference to sys.monitoring.DISABLE.
    unsafe {
        let d = state().recorder.as_deref().map_or(ptr::null_mut(), |r| r.disable);
        if d.is_null() {
            none()
        } else {
            ffi::Py_NewRef(d)
        }
    }
}

/// One event. `DEST`: args[2] is a destination offset. `LOCATION`: a jump, branch or instruction.
/// `CAN_DISABLE`: the event may return `DISABLE` (CPython raises ValueError into the user's code for
/// PY_UNWIND and PY_THROW, so those never do). `THRESH`: count hits per location and return `DISABLE` at
/// the threshold, and record function boundaries inside windows only (FORMAT.md 5.3); the gapless callbacks
/// have no such code at all.
///
/// The fast path is a thread-local load and a cache compare; everything else (attaching a thread, a new
/// code object, excluded code, a recording that stopped) is in `cold`. That works because a thread's
/// cache only ever holds code objects of the current recording that are simply recorded: `stop` and
/// `attach` clear it.
///
/// # Safety
/// Called by the interpreter with the GIL held and the arguments of a `sys.monitoring` callback.
#[inline(always)]
unsafe fn event<const KIND: u8, const DEST: bool, const LOCATION: bool, const CAN_DISABLE: bool, const THRESH: bool>(
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let t = clock::ticks();
    // SAFETY: GIL held (caller); LAST_TS belongs to the thread whose pointer is LAST_TP and is never
    // freed; args holds at least (code, offset[, dest]) for these events.
    unsafe {
        if thread_pointer() != LAST_TP.load(Ordering::Relaxed) {
            return cold::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(t, args);
        }
        let ts = LAST_TS.load(Ordering::Relaxed);
        let code = *args as usize;
        let entry = (&(*ts).cache)[slot(code)];
        if entry.code != code {
            return resolve::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, t, args);
        }
        record::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, entry, t, args)
    }
}

/// The address hashed (Fibonacci hashing: one multiply), not its low bits: code objects of a module lie
/// near each other and those of different modules far apart, and bits 4.. of their addresses put
/// sqlglot's hot functions in 512 slots so unevenly that 7% of its events missed, against 3.4% hashed.
#[inline(always)]
fn slot(code: usize) -> usize {
    ((code as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CODE_CACHE.trailing_zeros())) as usize
}

/// The boundary flags (FORMAT.md 5.5) of the code object at `code`, from the thread's first-level cache
/// (the functions on its stack mostly are there) or else the recording's table; `None` for code the
/// recording has not seen.
///
/// # Safety
/// GIL held; `ts` the calling thread's state for the current recording.
pub(super) unsafe fn code_boundary(ts: *mut ThreadState, code: usize) -> Option<u8> {
    // SAFETY: GIL held and `ts` current (caller).
    unsafe {
        let entry = (&(*ts).cache)[slot(code)];
        if entry.code == code {
            return Some(entry.boundary);
        }
        state().recorder.as_deref()?.codes.get(&code).map(|cs| cs.boundary)
    }
}

/// An event of a thread that was not the last to record: its state is looked up (and attached), then the
/// code object as in [`resolve`].
///
/// # Safety
/// As [`event`].
#[cold]
#[inline(never)]
unsafe fn cold<const KIND: u8, const DEST: bool, const LOCATION: bool, const CAN_DISABLE: bool, const THRESH: bool>(
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: see `event`.
    unsafe {
        let ts = current_thread::<KIND>();
        if ts.is_null() {
            return none(); // not recording
        }
        resolve::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, t, args)
    }
}

/// A code object missing from the first level of the cache of a thread known to be the current
/// recording's (`ts`): the second level, then the recorder's map; the thread is not looked up again.
///
/// # Safety
/// As [`event`], with `ts` the calling thread's state, attached to the current recording.
#[cold]
#[inline(never)]
unsafe fn resolve<
    const KIND: u8,
    const DEST: bool,
    const LOCATION: bool,
    const CAN_DISABLE: bool,
    const THRESH: bool,
>(
    ts: *mut ThreadState,
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: see the function's contract.
    unsafe {
        let code = *args;
        let second = slot2(code as usize);
        let cache2: &[Cached] = &(*ts).cache2;
        if let Some(&entry) = cache2.get(second) {
            if entry.code == code as usize {
                (&mut (*ts).cache)[slot(code as usize)] = entry;
                return record::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, entry, t, args);
            }
        }
        let cs = lookup(code);
        // lookup may have run Python, and so other threads: check the recording is still ours.
        if cs.is_null() || (*ts).generation != state().generation {
            return none();
        }
        if (*cs).flags == RECORD {
            let entry = Cached::of(code as usize, cs);
            (&mut (*ts).cache)[slot(code as usize)] = entry;
            let ts = &mut *ts;
            if ts.cache2.is_empty() {
                ts.misses += 1;
                if ts.misses >= super::CODE_CACHE2_AFTER {
                    ts.cache2 = vec![Cached::EMPTY; super::CODE_CACHE2].into_boxed_slice();
                }
            }
            if let Some(e) = ts.cache2.get_mut(second) {
                *e = entry;
            }
            return record::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, entry, t, args);
        }
        special::<KIND, DEST, LOCATION, CAN_DISABLE, THRESH>(ts, cs, t, args)
    }
}

/// The second level's slot: the address's bits 4.., not [`slot`]'s hash, so that code objects that share a
/// first-level slot mostly do not share this one.
#[inline(always)]
fn slot2(code: usize) -> usize {
    (code >> 4) % super::CODE_CACHE2
}

/// The calling thread's state for the current recording (attached, its stack written if a window needs
/// it, and remembered as the last thread), or null when not recording.
///
/// # Safety
/// As [`event`].
#[inline(always)]
pub(super) unsafe fn current_thread<const KIND: u8>() -> *mut ThreadState {
    if super::FORKED_CHILD.load(Ordering::Relaxed) {
        return ptr::null_mut(); // a forked child, still holding its parent's buffers
    }
    // SAFETY: GIL held (caller); thread states are never freed.
    unsafe {
        let ts = TS.with(|c| c.get());
        let ts = if ts.is_null() || (*ts).generation != state().generation { attach(ts) } else { ts };
        if ts.is_null() {
            return ts;
        }
        if (*ts).needs_stack {
            (*ts).needs_stack = false;
            const START: u8 = EventKind::PY_START as u8;
            const RESUME: u8 = EventKind::PY_RESUME as u8;
            const THROW: u8 = EventKind::PY_THROW as u8;
            super::windows::attach_stack(ts, matches!(KIND, START | RESUME | THROW));
            if (*ts).generation != state().generation {
                return ptr::null_mut();
            }
        }
        let tp = thread_pointer();
        if tp != 0 {
            EXIT.with(|g| {
                g.0.set(tp);
                g.1.set(ts);
            });
            LAST_TS.store(ts, Ordering::Relaxed);
            LAST_TP.store(tp, Ordering::Relaxed);
        }
        ts
    }
}

/// # Safety
/// As [`event`], with `ts` and `entry`'s code state valid for the current recording.
#[inline(always)]
unsafe fn record<
    const KIND: u8,
    const DEST: bool,
    const LOCATION: bool,
    const CAN_DISABLE: bool,
    const THRESH: bool,
>(
    ts: *mut ThreadState,
    entry: Cached,
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: see the function's contract; offsets are Python ints.
    unsafe {
        let cs = entry.cs;
        if is_boundary(KIND) && entry.boundary != 0 {
            // Coroutine code and asyncio's loop functions (FORMAT.md 5.5); for other code this byte, read
            // with the id, is the whole cost.
            return boundary::<KIND>(ts, cs, t, args);
        }
        let fast = fast_ints();
        let off = small_int(fast, *args.add(1));
        let arg = if DEST { small_int(fast, *args.add(2)) } else { 0 };
        let mut stop_here = false;
        let mut first_full = false;
        if THRESH && !LOCATION {
            // Function boundaries are recorded inside windows only (FORMAT.md 5.3): outside one, each
            // location is switched off at its first hit, until the next window re-arms them all.
            if t >= WINDOW_END.load(Ordering::Relaxed) {
                if KIND == EventKind::PY_START as u8 && (*cs).counted < (*ts).threshold {
                    // A function's first calls outside windows are counted (FORMAT.md 5.8): one that is
                    // called rarely has its exact count, which no window could estimate.
                    (*cs).counted += 1;
                    let last = ((*cs).counted == (*ts).threshold) as u32;
                    (*ts).buf.push(RawEvent::new(t, (*cs).id, 0, last, EventKind::COUNT as u8), &*(*ts).sink);
                    return if CAN_DISABLE && last != 0 { disable() } else { none() };
                }
                return if CAN_DISABLE { disable() } else { none() };
            }
            if KIND == EventKind::PY_START as u8 {
                // The first window lasts for a number of calls: what recording every call costs stays
                // bounded (~100 ns a call), and a program of fewer calls is recorded whole.
                let n = FIRST_CALLS.load(Ordering::Relaxed) + 1;
                FIRST_CALLS.store(n, Ordering::Relaxed);
                first_full = n == FIRST_LIMIT.load(Ordering::Relaxed);
            }
        }
        if THRESH && LOCATION {
            if DEST && KIND == EventKind::JUMP as u8 && arg < off {
                // A loop's backward jumps stay on for as many hits again after the loop's other locations
                // went quiet: those iterations carry one event each, so `hot` times them almost as they
                // run unrecorded (specialized, without the other callbacks). They are counted per loop
                // head, not per jump: a loop with two back edges (an `if` at the end of its body) then
                // stops recording both at once, and no recorded interval spans unrecorded iterations.
                let h = head_hits(&mut *cs, arg);
                let limit = (*ts).threshold.saturating_mul(2);
                if *h >= limit {
                    return if CAN_DISABLE { disable() } else { none() };
                }
                *h += 1;
                stop_here = *h >= limit;
            } else {
                let hits: &mut [u32] = &mut (*cs).hits;
                if let Some(h) = hits.get_mut((off / 2) as usize) {
                    if *h >= (*ts).threshold {
                        // Re-armed by a window (restart_events): off again, unrecorded, like a loop head.
                        return if CAN_DISABLE { disable() } else { none() };
                    }
                    *h += 1;
                    stop_here = *h >= (*ts).threshold;
                }
            }
        }
        (*ts).buf.push(RawEvent::new(t, entry.id, off, arg, KIND), &*(*ts).sink);
        if THRESH && !LOCATION && first_full {
            // The recording reached the first window's number of calls: the first window ends here.
            close_first_window(t + 1);
        }
        if CAN_DISABLE && stop_here {
            disable()
        } else {
            none()
        }
    }
}

/// A function boundary kind (FORMAT.md 5.5): known when the callback is compiled.
const fn is_boundary(kind: u8) -> bool {
    use EventKind as K;
    kind == K::PY_START as u8
        || kind == K::PY_RESUME as u8
        || kind == K::PY_RETURN as u8
        || kind == K::PY_YIELD as u8
        || kind == K::PY_UNWIND as u8
        || kind == K::PY_THROW as u8
}

/// A boundary of code with `CodeState::boundary` bits (FORMAT.md 5.5): recorded whatever the windows say,
/// never switched off, with the frame's id for coroutine code and, on a yield, what it yielded.
///
/// # Safety
/// As [`record`].
#[inline(always)]
unsafe fn boundary<const KIND: u8>(
    ts: *mut ThreadState,
    cs: *mut CodeState,
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    use ocular_format::event::flags::FRAME;
    // SAFETY: see the function's contract; PY_YIELD's third argument is the yielded object.
    unsafe {
        let off = small_int(fast_ints(), *args.add(1));
        let mut e = RawEvent::new(t, (*cs).id, off, 0, KIND);
        e.flags = (*cs).boundary & !FRAME;
        if (*cs).boundary & FRAME != 0 {
            let id = frame_id((*ts).pyts);
            if id != 0 {
                e.set_frame_id(id);
                if KIND == EventKind::PY_YIELD as u8 {
                    e.flags |= awaited(*args.add(2)).bits();
                }
            }
        }
        (*ts).buf.push(e, &*(*ts).sink);
        none()
    }
}

/// Where the thread state holds the current interpreter frame: its byte offset + 1 (0: not found, so
/// [`frame_id`] asks `PyEval_GetFrame`), and whether that field points to a struct whose first field is
/// the frame (3.12's `cframe`) instead of being it (3.13+'s `current_frame`).
static FRAME_FIELD: AtomicUsize = AtomicUsize::new(0);
static FRAME_INDIRECT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The id of the running frame (FORMAT.md 5.5): the address of its interpreter frame / 8, never 0 for a
/// frame. A monitoring callback runs in no frame of its own, so the running frame is the monitored one. A
/// coroutine's interpreter frame lives inside the coroutine object: the address is the instance's for its
/// whole life, and reading it makes nothing (`PyEval_GetFrame` would make a frame object per coroutine, 10
/// ns an event on a chain of short-lived coroutines: measured). 0 if no frame is running.
///
/// `pyts` is the thread's `PyThreadState` (cached at attach: a call to get it is ~2 ns an event).
///
/// # Safety
/// GIL held, inside a monitoring callback, `pyts` the calling thread's thread state.
#[inline(always)]
pub(super) unsafe fn frame_id(pyts: usize) -> u64 {
    // SAFETY: FRAME_FIELD was found in this interpreter's thread state layout by `locate_frame_field`,
    // which checked that it holds the running frame; the thread state of a thread running Python code is
    // live.
    unsafe {
        let at = FRAME_FIELD.load(Ordering::Relaxed);
        if at != 0 && pyts != 0 {
            let ts = pyts as *const u8;
            let mut p = (ts.add(at - 1) as *const usize).read_unaligned();
            if FRAME_INDIRECT.load(Ordering::Relaxed) && p != 0 {
                p = (p as *const usize).read();
            }
            return (p >> 3) as u64;
        }
        let f = ffi::PyEval_GetFrame();
        if f.is_null() {
            ffi::PyErr_Clear();
            return 0;
        }
        // `PyFrameObject.f_frame`: after the object header and f_back, in 3.12 to 3.15.
        let iframe = ((f as *const u8).add(24) as *const usize).read();
        (iframe >> 3) as u64
    }
}

/// Finds where the thread state holds the running interpreter frame, by comparing its fields with the
/// frame the running frame object names (`f_frame`). Called at import, in the importing frame. Leaves
/// [`frame_id`] on its slower public path if the layout is not the one expected.
pub(super) fn locate_frame_field(py: Python<'_>) {
    // SAFETY: GIL held; a frame object's header, f_back and f_frame are its first fields in 3.12 to 3.15;
    // the thread state is read within its first 48 words, all inside the struct in these versions; the
    // 3.12 `cframe` field (offset 56: prev, next, interp, _status, five ints, what_event, padding) is
    // dereferenced only if it is a non-null aligned pointer, as it is.
    unsafe {
        let f = ffi::PyEval_GetFrame();
        if f.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        let want = ((f as *const u8).add(24) as *const usize).read();
        if want == 0 || want % 8 != 0 {
            return;
        }
        let ts = ffi::PyThreadState_Get() as *const usize;
        let v = py.version_info();
        if (v.major, v.minor) == (3, 12) {
            let p = ts.add(7).read();
            if p != 0 && p % 8 == 0 && (p as *const usize).read() == want {
                FRAME_INDIRECT.store(true, Ordering::Relaxed);
                FRAME_FIELD.store(56 + 1, Ordering::Relaxed);
            }
            return;
        }
        let hits: Vec<usize> = (0..48).filter(|&i| ts.add(i).read() == want).collect();
        if let [i] = hits[..] {
            FRAME_FIELD.store(i * 8 + 1, Ordering::Relaxed);
        }
    }
}

/// The thread state's byte offset of the running frame's field, if found (for tests).
pub(super) fn frame_field() -> Option<usize> {
    FRAME_FIELD.load(Ordering::Relaxed).checked_sub(1)
}

/// Whether [`frame_field`] points to a struct whose first field is the frame (3.12's `cframe`).
pub(super) fn frame_indirect() -> bool {
    FRAME_INDIRECT.load(Ordering::Relaxed)
}

/// What a coroutine yielded (FORMAT.md 5.5), by its type's name or a base type's.
///
/// # Safety
/// GIL held; `o` a live object.
unsafe fn awaited(o: *mut ffi::PyObject) -> ocular_format::Awaited {
    use ocular_format::Awaited;
    // SAFETY: types and their base chains live while their instances do; tp_name is a C string.
    unsafe {
        if o == ffi::Py_None() {
            return Awaited::Nothing;
        }
        let mut t = ffi::Py_TYPE(o);
        while !t.is_null() {
            match std::ffi::CStr::from_ptr((*t).tp_name).to_bytes() {
                b"_asyncio.Future" | b"Future" => return Awaited::Future,
                b"_asyncio.Task" | b"Task" => return Awaited::Task,
                _ => t = (*t).tp_base,
            }
        }
        Awaited::Other
    }
}

/// The hit counter of the loop whose head is at offset `head` (a backward jump's destination).
#[inline]
fn head_hits(cs: &mut CodeState, head: u32) -> &mut u32 {
    let i = (head / 2) as usize;
    if i >= cs.heads.len() {
        grow_heads(cs, i);
    }
    &mut cs.heads[i]
}

#[cold]
#[inline(never)]
fn grow_heads(cs: &mut CodeState, i: usize) {
    let n = cs.hits.len().max(i + 1);
    let mut v = std::mem::take(&mut cs.heads).into_vec();
    v.resize(n, 0);
    cs.heads = v.into_boxed_slice();
}

/// Code that is not simply recorded: excluded by a filter, or `threading.Thread._bootstrap`.
///
/// # Safety
/// As [`record`].
#[cold]
#[inline(never)]
unsafe fn special<
    const KIND: u8,
    const DEST: bool,
    const LOCATION: bool,
    const CAN_DISABLE: bool,
    const THRESH: bool,
>(
    ts: *mut ThreadState,
    cs: *mut CodeState,
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: see the function's contract.
    unsafe {
        let flags = (*cs).flags;
        if flags & BOOT == 0 {
            // Excluded: switch this location off for good (where CPython allows it).
            return if CAN_DISABLE { disable() } else { none() };
        }
        if KIND == EventKind::PY_START as u8 && !(*ts).named {
            name_thread(ts);
            if (*ts).generation != state().generation {
                return none();
            }
        }
        let ending = KIND == EventKind::PY_RETURN as u8 || KIND == EventKind::PY_UNWIND as u8;
        if ending {
            super::windows::missed_for_ending(&mut *ts, t);
        }
        if flags & RECORD != 0 {
            let r = record::<KIND, DEST, false, false, false>(ts, Cached::of(*args as usize, cs), t, args);
            ffi::Py_DECREF(r);
        }
        if ending {
            thread_ending(ts);
        }
        none()
    }
}

/// The layout of a compact `int` in CPython 3.12+ (`Include/cpython/longintrepr.h`): the object header,
/// then `lv_tag` (bits 0-1: sign, 0 positive / 1 zero / 2 negative; bits 3+: digit count) and the first
/// 30-bit digit. Offsets are always compact.
#[repr(C)]
struct CompactLong {
    ob_refcnt: isize,
    ob_type: *mut ffi::PyTypeObject,
    lv_tag: usize,
    digit0: u32,
}

static FAST_INTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(super) fn fast_ints() -> bool {
    FAST_INTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// An offset argument as u32: read inline from a compact int (what `PyUnstable_Long_CompactValue` does,
/// which is a header-only inline function, so not callable from Rust), or through `PyLong_AsLong`.
///
/// # Safety
/// `o` is a Python int; GIL held.
#[inline(always)]
unsafe fn small_int(fast: bool, o: *mut ffi::PyObject) -> u32 {
    // SAFETY: `fast` only if checked at import (`check_compact_ints`) that this build lays ints out as
    // `CompactLong`.
    unsafe {
        if fast {
            let l = o as *const CompactLong;
            let tag = (*l).lv_tag;
            if tag < (2 << 3) {
                let v = (*l).digit0 as i64;
                return (if tag & 3 == 2 { -v } else { v }) as u32;
            }
        }
        ffi::PyLong_AsLong(o) as u32
    }
}

/// Enables the inline int read only if it gives the right answer on this interpreter for small, zero,
/// negative and large values (a debug or unusual build falls back to `PyLong_AsLong`).
pub(super) fn check_compact_ints(py: Python<'_>) -> PyResult<()> {
    FAST_INTS.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut ok = true;
    for v in [0i64, 1, 2, 254, 1546, 65_534, (1 << 30) - 1, -7, 1 << 40] {
        let o = v.into_pyobject(py)?;
        // SAFETY: `o` is an int and we hold the GIL.
        let got = unsafe { small_int(true, o.as_ptr()) };
        ok &= got == v as u32;
    }
    FAST_INTS.store(ok, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

macro_rules! callbacks {
    ($set:ident, $thresh:literal; $($f:ident $event:literal: $kind:ident, dest=$dest:literal, location=$loc:literal, disable=$dis:literal;)*) => {
        /// `{event name: callback}` for every event Ocular records.
        pub(super) fn $set(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
            $(
                unsafe extern "C" fn $f(
                    _callable: *mut ffi::PyObject,
                    args: *const *mut ffi::PyObject,
                    _nargsf: usize,
                    _kwnames: *mut ffi::PyObject,
                ) -> *mut ffi::PyObject {
                    // SAFETY: registered with sys.monitoring for exactly this event, whose arguments match.
                    unsafe { event::<{ EventKind::$kind as u8 }, $dest, $loc, $dis, $thresh>(args.cast_mut()) }
                }
            )*
            let d = PyDict::new(py);
            $(d.set_item($event, callback(py, $f)?)?;)*
            Ok(d)
        }
    };
}

/// A `sys.monitoring` callback: an object CPython calls through its vectorcall pointer, straight into
/// the recorder. A built-in function (`METH_FASTCALL`) is called through `cfunction_vectorcall_FASTCALL`,
/// which looks the thread state up (a `__tls_get_addr` call in a shared libpython), checks for keyword
/// arguments and counts the C recursion depth before and after: on every event, for a callback that
/// neither takes keywords nor calls back into Python on its fast path.
#[repr(C)]
struct Callback {
    ob_base: ffi::PyObject,
    vectorcall: ffi::vectorcallfunc,
}

/// The type of [`Callback`], made once (with the GIL held) and kept for the process.
static CALLBACK_TYPE: std::sync::atomic::AtomicPtr<ffi::PyTypeObject> =
    std::sync::atomic::AtomicPtr::new(ptr::null_mut());

fn callback_type(py: Python<'_>) -> PyResult<*mut ffi::PyTypeObject> {
    let tp = CALLBACK_TYPE.load(Ordering::Acquire);
    if !tp.is_null() {
        return Ok(tp);
    }
    // CPython keeps pointers into these (the member's name, the slots' values) for the type's life.
    static mut MEMBERS: [ffi::PyMemberDef; 2] = [
        ffi::PyMemberDef {
            name: c"__vectorcalloffset__".as_ptr(),
            type_code: ffi::Py_T_PYSSIZET,
            offset: std::mem::offset_of!(Callback, vectorcall) as ffi::Py_ssize_t,
            flags: ffi::Py_READONLY,
            doc: ptr::null(),
        },
        // SAFETY: an all-zero PyMemberDef is the sentinel CPython expects.
        unsafe { std::mem::zeroed() },
    ];
    // SAFETY: GIL held; the spec and the statics it points to live for the process, and CPython copies
    // what it needs from the spec. `tp_call` is `PyVectorcall_Call`, as vectorcall types require.
    unsafe {
        let mut slots = [
            ffi::PyType_Slot { slot: ffi::Py_tp_members, pfunc: (&raw mut MEMBERS).cast() },
            ffi::PyType_Slot { slot: ffi::Py_tp_call, pfunc: ffi::PyVectorcall_Call as *mut std::ffi::c_void },
            ffi::PyType_Slot { slot: 0, pfunc: ptr::null_mut() },
        ];
        let mut spec = ffi::PyType_Spec {
            name: c"ocular._ocular.Callback".as_ptr(),
            basicsize: std::mem::size_of::<Callback>() as std::ffi::c_int,
            itemsize: 0,
            flags: (ffi::Py_TPFLAGS_DEFAULT
                | ffi::Py_TPFLAGS_HAVE_VECTORCALL
                | ffi::Py_TPFLAGS_IMMUTABLETYPE
                | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION) as std::ffi::c_uint,
            slots: slots.as_mut_ptr(),
        };
        let tp = ffi::PyType_FromSpec(&mut spec);
        if tp.is_null() {
            return Err(PyErr::fetch(py));
        }
        CALLBACK_TYPE.store(tp.cast(), Ordering::Release);
        Ok(tp.cast())
    }
}

/// A new [`Callback`] calling `f`.
fn callback(py: Python<'_>, f: ffi::vectorcallfunc) -> PyResult<Bound<'_, PyAny>> {
    let tp = callback_type(py)?;
    // SAFETY: GIL held; `tp` is the ready Callback type, whose instances are `Callback`s; the allocation
    // is zeroed and has its reference count and type set.
    unsafe {
        let obj = ffi::PyType_GenericAlloc(tp, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        (*obj.cast::<Callback>()).vectorcall = f;
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// A method definition CPython only reads.
struct Def(ffi::PyMethodDef);
// SAFETY: the definitions are immutable statics; CPython reads them and never writes.
unsafe impl Sync for Def {}

fn function<'py>(py: Python<'py>, def: &'static Def) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `def` is a 'static, valid PyMethodDef; a NULL self and module are allowed.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyCFunction_NewEx(&def.0 as *const ffi::PyMethodDef as *mut _, ptr::null_mut(), ptr::null_mut()),
        )
    }
}

macro_rules! event_table {
    ($set:ident, $thresh:literal) => {
        callbacks! { $set, $thresh;
            on_py_start "PY_START": PY_START, dest=false, location=false, disable=true;
            on_py_resume "PY_RESUME": PY_RESUME, dest=false, location=false, disable=true;
            on_py_return "PY_RETURN": PY_RETURN, dest=false, location=false, disable=true;
            on_py_yield "PY_YIELD": PY_YIELD, dest=false, location=false, disable=true;
            on_py_unwind "PY_UNWIND": PY_UNWIND, dest=false, location=false, disable=false;
            on_py_throw "PY_THROW": PY_THROW, dest=false, location=false, disable=false;
            on_jump "JUMP": JUMP, dest=true, location=true, disable=true;
            on_branch "BRANCH": BRANCH, dest=true, location=true, disable=true;
            on_branch_left "BRANCH_LEFT": BRANCH_LEFT, dest=true, location=true, disable=true;
            on_branch_right "BRANCH_RIGHT": BRANCH_RIGHT, dest=true, location=true, disable=true;
            on_instruction "INSTRUCTION": INSTRUCTION, dest=false, location=true, disable=true;
            // FORMAT.md 5.4: CPython refuses DISABLE from these two (the call's CALL event decides).
            on_c_return "C_RETURN": C_RETURN, dest=false, location=false, disable=false;
            on_c_raise "C_RAISE": C_RAISE, dest=false, location=false, disable=false;
        }
    };
}

event_table!(event_callbacks, true);
event_table!(event_callbacks_gapless, false);

/// `{event name: callback}` for every event Ocular records, with a threshold (windows).
pub(super) fn callbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = event_callbacks(py)?;
    d.set_item("CALL", callback(py, on_call)?)?;
    Ok(d)
}

/// `{event name: callback}` for every event Ocular records, gapless.
pub(super) fn callbacks_gapless(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = event_callbacks_gapless(py)?;
    d.set_item("CALL", callback(py, on_call_gapless)?)?;
    Ok(d)
}

// Calls of C functions (FORMAT.md 5.4): CALL fires before every call a Python frame makes, of Python
// functions too. Those return at once (their PY_START says the call); a C callable is recorded with its
// id, from a per-thread cache keyed by `c_key`, the name resolved once per recording (`cfunc::register`).

/// `PyMethodObject` (`Include/cpython/classobject.h`): a bound method.
#[repr(C)]
struct MethodObject {
    ob_base: ffi::PyObject,
    im_func: *mut ffi::PyObject,
}

extern "C" {
    static mut PyMethod_Type: ffi::PyTypeObject;
}

/// `PyMethodDescrObject` (`Include/descrobject.h`): `PyDescr_COMMON`, then the method's definition.
#[repr(C)]
struct MethodDescr {
    ob_base: ffi::PyObject,
    d_type: *mut ffi::PyTypeObject,
    d_name: *mut ffi::PyObject,
    d_qualname: *mut ffi::PyObject,
    d_method: *mut ffi::PyMethodDef,
}

/// `c_key`'s second word for the callables that are not built-in functions or method descriptors (whose
/// second word is 0 or a type's address, never one of these).
pub(super) const KEY_TYPE: usize = 2;
pub(super) const KEY_OBJECT: usize = 3;

/// A C callable's identity for the recording (FORMAT.md 6.11): for a built-in function or method, its
/// `PyMethodDef` and the type of what it is bound to (`obj.append` is a new object at each access, its method
/// definition is not); for a method descriptor, the same of the method it describes (so `xs.append(1)`,
/// a descriptor call, and `f = xs.append; f(1)`, a bound method's, are one callable); for a type, the
/// type; for anything else, its type.
///
/// # Safety
/// `callable` is a live object whose type is `tp`; GIL held.
#[inline(always)]
pub(super) unsafe fn c_key(callable: *mut ffi::PyObject, tp: *mut ffi::PyTypeObject) -> (usize, usize) {
    // SAFETY: the type checks say which layout `callable` has.
    unsafe {
        if tp == &raw mut ffi::PyCFunction_Type || tp == &raw mut ffi::PyCMethod_Type {
            builtin_key(callable)
        } else if tp == &raw mut ffi::PyMethodDescr_Type {
            let d = callable as *mut MethodDescr;
            ((*d).d_method as usize, (*d).d_type as usize)
        } else if ffi::PyType_Check(callable) != 0 {
            (callable as usize, KEY_TYPE)
        } else if ffi::PyObject_TypeCheck(callable, &raw mut ffi::PyCFunction_Type) != 0 {
            builtin_key(callable)
        } else {
            (tp as usize, KEY_OBJECT)
        }
    }
}

/// # Safety
/// `callable` is a `builtin_function_or_method` (or a subtype); GIL held.
#[inline(always)]
unsafe fn builtin_key(callable: *mut ffi::PyObject) -> (usize, usize) {
    // SAFETY: the layout of PyCFunctionObject, which subtypes extend.
    unsafe {
        let f = callable as *mut ffi::PyCFunctionObject;
        let s = (*f).m_self;
        // The type of what it is bound to: a module's for a module's function, the metaclass for a class
        // method (whose method definition tells its class apart). Not its class itself: one load less.
        let owner = if s.is_null() { 0 } else { ffi::Py_TYPE(s) as usize };
        ((*f).m_ml as usize, owner)
    }
}

#[inline(always)]
fn p_slot(callable: *mut ffi::PyObject) -> usize {
    ((callable as usize) >> 4) % super::C_CACHE
}

#[inline(always)]
fn c_slot(key: (usize, usize)) -> usize {
    ((key.0 ^ key.1.rotate_left(17)) >> 4) % super::C_CACHE
}

/// Whether CPython runs the call as a Python frame (PY_START follows; no C_RETURN): a function, or a method
/// bound to one (`ceval`'s CALL unpacks it).
///
/// # Safety
/// `callable` is a live object whose type is `tp`.
#[inline(always)]
unsafe fn is_python(callable: *mut ffi::PyObject, tp: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: a PyMethod_Type object has MethodObject's layout.
    unsafe {
        tp == &raw mut ffi::PyFunction_Type
            || (tp == &raw mut PyMethod_Type
                && ffi::Py_TYPE((*(callable as *mut MethodObject)).im_func) == &raw mut ffi::PyFunction_Type)
    }
}

/// The CALL event: `args` are (code, offset, callable, arg0).
///
/// # Safety
/// Called by the interpreter with the GIL held and a CALL event's arguments.
#[inline(always)]
unsafe fn call<const THRESH: bool>(args: *mut *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: GIL held; as `event`.
    unsafe {
        let callable = *args.add(2);
        let tp = ffi::Py_TYPE(callable);
        if is_python(callable, tp) {
            // Never switched off while calls are recorded: the same call site may call C functions later,
            // and C_RETURN and C_RAISE only fire where CALL is on. Between windows it is, as every
            // function boundary (the next window re-arms it).
            if THRESH && clock::ticks() >= WINDOW_END.load(Ordering::Relaxed) && state().recorder.is_some() {
                return disable();
            }
            return none();
        }
        let t = clock::ticks();
        if thread_pointer() != LAST_TP.load(Ordering::Relaxed) {
            return call_cold::<THRESH>(t, args);
        }
        let ts = LAST_TS.load(Ordering::Relaxed);
        let code = *args as usize;
        let entry = (&(*ts).cache)[slot(code)];
        if entry.code != code {
            return call_cold::<THRESH>(t, args);
        }
        if THRESH && t >= WINDOW_END.load(Ordering::Relaxed) {
            return disable();
        }
        // The same object as before (a module's function, a method descriptor, a type), kept alive by the
        // recording: its id at once. Else its key (a bound method is a new object at every access).
        let p = (&(*ts).pcache)[p_slot(callable)];
        let id = if p.0 == callable as usize {
            p.1
        } else {
            let key = c_key(callable, tp);
            let c = (&(*ts).ccache)[c_slot(key)];
            if c.0 != key.0 || c.1 != key.1 {
                return call_cold::<THRESH>(t, args);
            }
            c.2
        };
        let off = small_int(fast_ints(), *args.add(1));
        (*ts).buf.push(RawEvent::new(t, entry.id, off, id, EventKind::CALL as u8), &*(*ts).sink);
        none()
    }
}

/// A CALL of a C callable that missed a cache: a new thread, code object or callable.
///
/// # Safety
/// As [`call`].
#[cold]
#[inline(never)]
unsafe fn call_cold<const THRESH: bool>(t: u64, args: *mut *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: as `cold`; `cfunc::register` may run Python, so the generation is checked after it.
    unsafe {
        let ts = current_thread::<{ EventKind::CALL as u8 }>();
        if ts.is_null() {
            return none();
        }
        let code = *args;
        let cs = lookup(code);
        if cs.is_null() || (*ts).generation != state().generation {
            return none();
        }
        if (*cs).flags & RECORD == 0 {
            return disable(); // excluded code: off for good
        }
        if (*cs).flags == RECORD {
            (&mut (*ts).cache)[slot(code as usize)] = Cached::of(code as usize, cs);
        }
        if THRESH && t >= WINDOW_END.load(Ordering::Relaxed) {
            return disable();
        }
        let callable = *args.add(2);
        let key = c_key(callable, ffi::Py_TYPE(callable));
        let id = super::cfunc::register(key, callable);
        if id == 0 || (*ts).generation != state().generation {
            return none();
        }
        (&mut (*ts).ccache)[c_slot(key)] = (key.0, key.1, id);
        if super::cfunc::keep_alive(callable) && (*ts).generation == state().generation {
            (&mut (*ts).pcache)[p_slot(callable)] = (callable as usize, id);
        }
        let off = small_int(fast_ints(), *args.add(1));
        (*ts).buf.push(RawEvent::new(t, (*cs).id, off, id, EventKind::CALL as u8), &*(*ts).sink);
        none()
    }
}

unsafe extern "C" fn on_call(
    _callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    _nargsf: usize,
    _kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: registered with sys.monitoring for CALL, whose arguments match.
    unsafe { call::<true>(args.cast_mut()) }
}

unsafe extern "C" fn on_call_gapless(
    _callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    _nargsf: usize,
    _kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: registered with sys.monitoring for CALL, whose arguments match.
    unsafe { call::<false>(args.cast_mut()) }
}

// Benchmark reference callbacks, registered in the same run as Ocular's so ratios are side by side.

const FLOOR_SLOTS: usize = 1 << 16;
struct FloorRing(std::cell::UnsafeCell<([RawEvent; FLOOR_SLOTS], usize)>);
// SAFETY: only touched by the floor callback, which runs with the GIL held.
unsafe impl Sync for FloorRing {}
static FLOOR: FloorRing = FloorRing(std::cell::UnsafeCell::new(([RawEvent::ZERO; FLOOR_SLOTS], 0)));

/// The physical floor: read the TSC and store a 24-byte record, nothing else.
unsafe extern "C" fn floor(
    _slf: *mut ffi::PyObject,
    args: *mut *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    let t = clock::ticks();
    // SAFETY: GIL held by the interpreter while calling; the ring index stays in bounds by masking.
    unsafe {
        let ring = &mut *FLOOR.0.get();
        let i = ring.1;
        ring.0[i] = RawEvent::new(t, *args as usize as u32, 0, 0, nargs as u8);
        ring.1 = (i + 1) & (FLOOR_SLOTS - 1);
    }
    none()
}

/// The same, called as Ocular's callbacks are (a [`Callback`]): what CPython's dispatch to it costs.
unsafe extern "C" fn noop_vectorcall(
    _callable: *mut ffi::PyObject,
    _args: *const *mut ffi::PyObject,
    _nargsf: usize,
    _kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    none()
}

/// A native callback that does nothing: what CPython's dispatch to a C function costs.
unsafe extern "C" fn noop(
    _slf: *mut ffi::PyObject,
    _args: *mut *mut ffi::PyObject,
    _nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    none()
}

static DEF_FLOOR: Def = Def(ffi::PyMethodDef {
    ml_name: c"ocular_floor".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer { PyCFunctionFast: floor },
    ml_flags: ffi::METH_FASTCALL,
    ml_doc: ptr::null(),
});
static DEF_NOOP: Def = Def(ffi::PyMethodDef {
    ml_name: c"ocular_noop".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer { PyCFunctionFast: noop },
    ml_flags: ffi::METH_FASTCALL,
    ml_doc: ptr::null(),
});

/// `{"floor": ..., "noop": ..., "noop_vectorcall": ...}`: reference callbacks for benchmarks, valid for
/// any event.
pub(super) fn bench_callbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("floor", function(py, &DEF_FLOOR)?)?;
    d.set_item("noop", function(py, &DEF_NOOP)?)?;
    d.set_item("noop_vectorcall", callback(py, noop_vectorcall)?)?;
    Ok(d)
}
