//! Windows (FORMAT.md 5.3): in a thresholded recording, function boundaries are recorded only inside
//! windows, so that what the file holds of calls is complete per window and can be weighed by the time the
//! window stands for. The first window opens with the recording and closes after its first 100 x threshold
//! calls (`close_first_window`, from the callbacks); after it, a thread of Ocular's
//! own ("ocular-windows") schedules one every `period` (jittered, so that no periodic behaviour of the
//! program lines up with it) for `length`. Opening a window writes a `WINDOW` marker and every thread's
//! stack into each thread's stream, moves `WINDOW_END`, and calls `sys.monitoring.restart_events()` so
//! that the locations switched off since are armed again. The callbacks compare their tick with
//! `WINDOW_END` and switch a function location off at its first hit after the window closed.
//!
//! Where a window opens decides what it sees, so it must not depend on what the program does. The thread
//! does not take the GIL to open it: a thread waiting for the GIL gets it when the program releases it
//! (mostly for I/O), and windows would then always start just after a file read (measured: importlib's
//! `_compile_bytecode` rose to the top 3 of programs where it is not). Instead it queues a pending call
//! for the interpreter, not for its main thread (`_PyEval_AddPendingCall` without
//! `_Py_PENDING_MAINTHREADONLY`, exported by CPython 3.12 to 3.15): whichever thread runs Python code next
//! opens the window at its next safe point (a call or a backward jump, microseconds later, wherever the
//! program is). A main-thread-only call (`Py_AddPendingCall`, or a signal on 3.12) waits while the main
//! thread is blocked, in `join()` or a server's `accept()`: windows then opened only when the GIL next
//! changed hands, at a worker thread's end, and in a thread per request a function called once per
//! request read 6x its calls and its loop's callee a quarter of them. Only when no thread gets there within
//! `FALLBACK` (all blocked, or one in a long C call) does a second thread take the GIL itself.
//!
//! A safe point can be far off: a long C call, an explicit collection or a sleep holds it back for as long
//! as it lasts. So the window stands for the span from when it was due (FORMAT.md 5.7): at that moment the
//! opener reads every thread's stack itself (`due`), the opening writes it (`DUE_STACK`) before the stack
//! at the opening, and windows that fell due while an earlier one still waited are written as missed.
//! Due moments follow one another on their own schedule, never from an opening: the code just after a
//! long C call would otherwise get a window far more often than its share.

use super::{lookup, state, RECORD, WINDOW_END};
use ocular_format::{EventKind, RawEvent};
use ocular_record::clock;
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A thread's frames, outermost first: (code object, last instruction offset in bytes).
pub(super) type Stack = Vec<(Py<PyAny>, u32)>;

/// A marker event of the window kinds (FORMAT.md 5.3).
pub(super) fn marker(ticks: u64, kind: EventKind, seq: u32, arg: u32) -> RawEvent {
    RawEvent::new(ticks, 0, seq, arg, kind as u8)
}

/// How long the opener waits for the main thread to open the window before taking the GIL itself.
const FALLBACK: Duration = Duration::from_millis(2);

/// The recording generation a scheduled window belongs to, while nobody has opened it yet (0: none). The
/// main thread (pending call or signal handler) and the fallback both try to take it; the one that does
/// opens the window.
static SCHEDULED_FOR: AtomicU64 = AtomicU64::new(0);

/// Takes the scheduled window of `generation`, if nobody has.
fn claim(generation: u64) -> bool {
    SCHEDULED_FOR.compare_exchange(generation, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
}

thread_local! {
    /// 1 while this thread runs Python code of Ocular's own inside a monitoring callback (naming a new
    /// thread); 2 when a window was due to open meanwhile.
    static OWN_PYTHON: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, Python code of Ocular's own called from a callback. A window is not opened inside it: its
/// stack would hold Ocular's frames above the program's, and the program's frame at its first
/// instruction (the start being recorded) would read as a call of its own. Its opening is asked for
/// again after `f`, at the program's next safe point.
pub(super) fn in_own_python<T>(f: impl FnOnce() -> T) -> T {
    let outer = OWN_PYTHON.with(|c| c.replace(1));
    let out = f();
    if OWN_PYTHON.with(|c| c.replace(outer)) == 2 {
        ask();
    }
    out
}

/// Queues the pending call that opens the scheduled window; false if the queue is full.
fn ask() -> bool {
    // SAFETY: like Py_AddPendingCall, it needs no thread state (it takes the queue's own lock); the main
    // interpreter lives as long as the process.
    unsafe { _PyEval_AddPendingCall(ffi::PyInterpreterState_Main(), pending_open, std::ptr::null_mut(), 0) == 0 }
}

/// Run at a safe point by whichever thread runs Python code first (a pending call), with the GIL held.
/// Never fails: an error here would be raised into the program.
extern "C" fn pending_open(_arg: *mut std::os::raw::c_void) -> std::os::raw::c_int {
    if OWN_PYTHON.with(|c| c.get()) != 0 {
        OWN_PYTHON.with(|c| c.set(2));
        return 0;
    }
    // SAFETY: pending calls run with the GIL held, by a thread attached to the interpreter.
    unsafe {
        let generation = state().generation;
        if claim(generation) {
            open(Python::assume_attached(), generation);
        }
    }
    0
}

// `Include/internal/pycore_ceval.h` (CPython 3.12 to 3.15, exported for `_testinternalcapi`): queues `func`
// for the interpreter `interp`. `flags` 0: any of its threads runs it (3.12 names the parameter
// `mainthreadonly`, whose 0 means the same). Returns 0, or -1 with the queue full.
extern "C" {
    fn _PyEval_AddPendingCall(
        interp: *mut ffi::PyInterpreterState,
        func: extern "C" fn(*mut std::os::raw::c_void) -> std::os::raw::c_int,
        arg: *mut std::os::raw::c_void,
        flags: std::os::raw::c_int,
    ) -> std::os::raw::c_int;
}

/// The opener thread: dropping `stop` wakes it and ends it.
pub(super) struct Opener {
    stop: mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl Opener {
    /// Ends the thread and waits for it. Call without the GIL: it may be waiting for it.
    pub(super) fn stop(self) {
        drop(self.stop);
        let _ = self.handle.join();
    }

    /// In a forked child, where the thread does not exist.
    pub(super) fn forget(self) {
        std::mem::forget(self.stop);
        std::mem::forget(self.handle);
    }
}

/// Whether the interpreter was asked (a pending call) to open the window now scheduled.
static ASKED: AtomicBool = AtomicBool::new(false);

/// Starts opening a window of `length` seconds every `period` seconds (on average) in the current
/// recording, each in a pending call that the first thread to run Python code makes.
/// A recording without windows (calls mode, a threshold of 0) ignores it.
///
/// Windows fall due on a schedule of their own (FORMAT.md 5.7): each due moment is drawn from the one
/// before, not from when the last window opened, so where they fall never depends on the program. At each,
/// the thread reads every recording thread's stack (`due`), queues it, and asks the interpreter to open
/// the window; a second thread (`ocular-windows-gil`) takes the GIL itself when no thread has answered
/// within `FALLBACK`, so that the schedule never waits for the GIL.
#[pyfunction]
pub(super) fn start_windows(py: Python<'_>, period: f64, length: f64) -> PyResult<()> {
    if !(period > 0.0 && length > 0.0 && length * 2.0 <= period && length < 1000.0) {
        return Err(PyRuntimeError::new_err(format!(
            "window length {length} s and period {period} s: both must be above 0, and the length at most half the period"
        )));
    }
    // Stacks at due moments are read only if this interpreter's frames read as expected here.
    // SAFETY: GIL held (called from Python); the calling thread's state is live.
    unsafe {
        let me = ffi::PyThreadState_Get();
        let frames: Vec<usize> = frames_of(py, me).iter().map(|(c, _)| c.as_ptr() as usize).collect();
        super::due::check(me as usize, &frames);
    }
    // SAFETY: GIL held (called from Python); no Python call while the reference is alive.
    let st = unsafe { state() };
    let generation = st.generation;
    let Some(rec) = st.recorder.as_deref_mut() else {
        return Err(PyRuntimeError::new_err("Ocular is not recording"));
    };
    if !rec.windowed || rec.windows.is_some() {
        return Ok(());
    }
    rec.window_len = ((length * 1e6).round() as u32, (length * rec.ticks_per_second).round() as u64);
    let (tx, rx) = mpsc::channel::<()>();
    let handle = ocular_record::threads::spawn("ocular-windows", move || {
        // A due moment is when this thread woke, which the kernel's timer slack (50 us by default) and a
        // virtual machine's idle CPU delay: measured on this project's 2-CPU VMs, wake-ups 117 us late at the
        // median, and the late ones landed where the program woke the CPUs itself (a thread starting),
        // which then got windows 1.5x as often as their share of the run. The least slack halves the delay.
        // SAFETY: prctl with PR_SET_TIMERSLACK changes only the calling thread's slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let (ftx, frx) = mpsc::channel::<Instant>();
        let fallback = ocular_record::threads::spawn("ocular-windows-gil", move || {
            while let Ok(mut deadline) = frx.recv() {
                while let Ok(d) = frx.try_recv() {
                    deadline = d;
                }
                let now = Instant::now();
                if deadline > now {
                    std::thread::sleep(deadline - now);
                }
                if SCHEDULED_FOR.load(Ordering::Acquire) != generation {
                    continue; // the main thread opened it
                }
                // SAFETY: `open` runs with the GIL (attach) and checks the recording is still this one.
                let go_on = Python::attach(|py| unsafe {
                    if claim(generation) {
                        open(py, generation)
                    } else {
                        state().generation == generation
                    }
                });
                if !go_on {
                    return;
                }
            }
        });
        // xorshift64*, seeded from the clock: the jitter needs no quality beyond not being periodic.
        let mut x = clock::ticks() | 1;
        let mut next = Instant::now();
        loop {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let u = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
            next += Duration::from_secs_f64(period * (0.5 + u));
            let now = Instant::now();
            // This thread itself ran late (the machine is busy): the schedule goes on from now.
            next = next.max(now);
            match rx.recv_timeout(next - now) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => break, // stopped
            }
            if WINDOW_END.load(Ordering::Relaxed) == u64::MAX {
                continue; // the first window is still open
            }
            if SCHEDULED_FOR.load(Ordering::Acquire) == generation {
                // The last one has not opened yet: this one waits with it (FORMAT.md 5.7, missed).
                super::due::queue(generation);
                continue;
            }
            ASKED.store(true, Ordering::Release);
            super::due::queue(generation);
            SCHEDULED_FOR.store(generation, Ordering::Release);
            // It fails only with its queue full, and the fallback then opens the window.
            if !ask() {
                ASKED.store(false, Ordering::Release);
            }
            if ftx.send(Instant::now() + FALLBACK).is_err() {
                break;
            }
        }
        drop(ftx);
        let _ = fallback.map(|h| h.join());
    })
    .map_err(|e| PyRuntimeError::new_err(format!("cannot start the ocular-windows thread: {e}")))?;
    rec.windows = Some(Opener { stop: tx, handle });
    Ok(())
}

/// Opens the windows that fell due, if the first one has closed and no other is open: each one before
/// the last is written as missed (FORMAT.md 5.7), the last opens. Returns whether the recording that
/// started the opener is still going.
///
/// # Safety
/// GIL held.
unsafe fn open(py: Python<'_>, generation: u64) -> bool {
    use ocular_format::event::due::{CALLS_FROM_DUE, MISSED, RUNNING};
    let began = clock::ticks();
    // SAFETY: GIL held (caller); the reference ends before any Python call.
    unsafe {
        {
            let st = state();
            if st.generation != generation || st.recorder.is_none() {
                return false;
            }
            let end = WINDOW_END.load(Ordering::Relaxed);
            if end == u64::MAX || clock::ticks() < end {
                return true; // the first window is still open, or this one is (the due ones wait)
            }
        }
        let dues = super::due::take(generation);
        if dues.is_empty() {
            return true;
        }
        // The interpreter was asked when the first of these fell due, and no thread has reached a safe
        // point since, if the request was queued: none started a function since any of them was due
        // (each function start is a safe point; a thread that takes the GIL is told of the pending call).
        let asked = ASKED.load(Ordering::Acquire);
        // Every thread's stack, outermost frame first: (thread state id, [(code, offset in bytes)]).
        let mut stacks: Vec<(i64, Stack)> = Vec::new();
        let mut tstate = ffi::PyInterpreterState_ThreadHead(ffi::PyInterpreterState_Get());
        while !tstate.is_null() {
            let frames = frames_of(py, tstate);
            if !frames.is_empty() {
                stacks.push((ffi::PyThreadState_GetID(tstate), frames));
            }
            tstate = ffi::PyThreadState_Next(tstate);
        }
        let mut ids: Vec<(i64, Vec<(u32, u32)>)> = Vec::with_capacity(stacks.len());
        for (tid, frames) in stacks {
            ids.push((tid, resolve(tid, frames, false)));
        }
        // The markers' tick: when the opening began (nothing of the program ran since), so that all of the
        // opening's own time lies after them.
        let now = began;
        // Arm every location switched off since the last window (before the markers, so that they can say
        // how long the opening took). A failure is noted, never raised.
        let restart = match state().recorder.as_deref() {
            Some(rec) if state().generation == generation => rec.restart.clone_ref(py),
            _ => return false,
        };
        if let Err(e) = restart.call0(py) {
            if let Some(rec) = state().recorder.as_deref_mut() {
                if rec.errors.len() < 10 {
                    rec.errors.push(format!("sys.monitoring.restart_events() failed: {e}"));
                }
            }
        }
        let st = state();
        if st.generation != generation {
            return false;
        }
        // Threads that exited get no more markers.
        super::retire_ended(st);
        let Some(rec) = st.recorder.as_deref() else { return false };
        let (len_us, len_ticks) = rec.window_len;
        let sink = rec.out.sink();
        // The opening's own time, from the safe point to the program going on (the markers are written in
        // a moment): FORMAT.md 5.7 has readers take it out of the program's time.
        let opening = (clock::ticks().saturating_sub(began)).min(u64::from(u32::MAX)) as u32;
        let me = ffi::PyThreadState_Get() as usize;
        let lead =
            |due: u64| (now.saturating_sub(due) as f64 * 1e6 / rec.ticks_per_second).min(u32::MAX as f64 / 2.0) as u32;
        let mut seq = st.window.seq;
        for (i, d) in dues.iter().enumerate() {
            seq += 1;
            let missed = i + 1 < dues.len();
            for &ts in &st.threads {
                let ts = &mut *ts;
                if ts.generation != generation || !ids.iter().any(|(id, _)| *id == ts.py_id) {
                    continue;
                }
                let mut m = marker(now, EventKind::WINDOW, seq, len_us);
                m.code.set(lead(d.ticks));
                ts.buf.push_marker(m, sink);
                let read = d.stacks.iter().find(|(p, _)| *p == ts.pyts).and_then(|(_, s)| s.as_ref());
                let frames = read.map(|(s, _)| due_frames(rec, ts.py_id, s)).unwrap_or_default();
                let mut flags = if missed { MISSED } else { 0 };
                if read.is_some_and(|(_, running)| *running) {
                    flags |= RUNNING;
                }
                if !missed && asked {
                    flags |= CALLS_FROM_DUE;
                }
                // Only the thread that opened it spent that time (the others waited for the GIL).
                let cost = if missed || ts.pyts != me { 0 } else { opening };
                ts.buf.push_marker(RawEvent::new(now, cost, flags, frames.len() as u32, EventKind::DUE as u8), sink);
                for (depth, &code) in frames.iter().enumerate() {
                    ts.buf.push_marker(RawEvent::new(now, code, 0, depth as u32, EventKind::DUE_STACK as u8), sink);
                }
                if missed {
                    ts.buf.push_marker(marker(now, EventKind::WINDOW_END, seq, 0), sink);
                } else if let Some((_, frames)) = ids.iter().find(|(id, _)| *id == ts.py_id) {
                    for (depth, &(code, off)) in frames.iter().enumerate() {
                        ts.buf.push_marker(RawEvent::new(now, code, off, depth as u32, EventKind::STACK as u8), sink);
                    }
                }
            }
        }
        st.window = super::Window { seq, opened: now, len_us };
        WINDOW_END.store(now.saturating_add(len_ticks), Ordering::Relaxed);
        true
    }
}

/// Writes into an ending thread's own stream the windows that fell due and have not opened yet, each as
/// missed (FORMAT.md 5.7), at tick `t`, before its last event. The opening that writes them comes later,
/// for the threads alive then: a thread that ended in between (its last stretch a long C call, or waiting
/// for the GIL while other threads held it) lost their time, 15% of each worker's in three threads that
/// alternate call-dense code and `json.dumps`. Their sequence numbers are the ones that opening gives them.
///
/// # Safety
/// GIL held; `ts` is the calling thread's state.
pub(super) unsafe fn missed_for_ending(ts: &mut super::ThreadState, t: u64) {
    use ocular_format::event::due::{MISSED, RUNNING};
    // SAFETY: GIL held (caller); no Python call below.
    let st = unsafe { state() };
    let Some(rec) = st.recorder.as_deref() else { return };
    if ts.generation != st.generation || WINDOW_END.load(Ordering::Relaxed) == u64::MAX {
        return; // another recording's thread, or the first window still open (nothing is queued then)
    }
    let (len_us, _) = rec.window_len;
    let sink = rec.out.sink();
    for (i, due, read) in super::due::pending_for(st.generation, ts.pyts) {
        let seq = st.window.seq.wrapping_add(1 + i as u32);
        let mut m = marker(t, EventKind::WINDOW, seq, len_us);
        m.code.set((t.saturating_sub(due) as f64 * 1e6 / rec.ticks_per_second).min(u32::MAX as f64 / 2.0) as u32);
        ts.buf.push_marker(m, sink);
        let frames = read.as_ref().map(|(s, _)| due_frames(rec, ts.py_id, s)).unwrap_or_default();
        let flags = if read.as_ref().is_some_and(|(_, running)| *running) { MISSED | RUNNING } else { MISSED };
        ts.buf.push_marker(RawEvent::new(t, 0, flags, frames.len() as u32, EventKind::DUE as u8), sink);
        for (depth, &code) in frames.iter().enumerate() {
            ts.buf.push_marker(RawEvent::new(t, code, 0, depth as u32, EventKind::DUE_STACK as u8), sink);
        }
        ts.buf.push_marker(marker(t, EventKind::WINDOW_END, seq, 0), sink);
    }
}

/// A stack read at a due moment (code object addresses, outermost first) as code ids: without the frames
/// the recording's starting thread was in when it started, and without code objects the recording has not
/// seen (the interpreter's own entry frames, or a frame that had not started its code yet). Looks the
/// addresses up only: nothing read there is dereferenced.
fn due_frames(rec: &super::Recorder, py_id: i64, codes: &[usize]) -> Vec<u32> {
    let base: &[Py<PyAny>] = if rec.base.0 == py_id { &rec.base.1 } else { &[] };
    let in_base = |c: usize| base.iter().any(|b| b.as_ptr() as usize == c);
    // The interpreter's entry frames are in neither: left out before the base is matched.
    let known: Vec<usize> = codes.iter().copied().filter(|&c| rec.codes.contains_key(&c) || in_base(c)).collect();
    let skip = known.iter().zip(base).take_while(|(c, b)| **c == b.as_ptr() as usize).count();
    known[skip..]
        .iter()
        .filter_map(|c| rec.codes.get(c))
        .map(|cs| if cs.flags & RECORD == 0 { 0 } else { cs.id })
        .collect()
}

/// A thread's frames, outermost first (at most 4096 of the innermost).
///
/// # Safety
/// GIL held; `tstate` is a live thread state of this interpreter.
pub(super) unsafe fn frames_of(py: Python<'_>, tstate: *mut ffi::PyThreadState) -> Stack {
    // SAFETY: (caller) GIL held; every reference taken here is released or owned by `frames`.
    unsafe {
        let mut frames = Vec::new();
        let mut f = ffi::PyThreadState_GetFrame(tstate);
        while !f.is_null() && frames.len() < 4096 {
            let code = ffi::PyFrame_GetCode(f);
            let lasti = ffi::PyFrame_GetLasti(f);
            frames.push((Bound::from_owned_ptr(py, code.cast()).unbind(), lasti.max(0) as u32));
            let back = ffi::PyFrame_GetBack(f);
            ffi::Py_DECREF(f.cast());
            f = back;
        }
        if !f.is_null() {
            ffi::Py_DECREF(f.cast());
        }
        frames.reverse();
        frames
    }
}

/// The frames of thread `tid` that belong to the recording, as (code id, offset), outermost first: without
/// the frames its starting thread was in when it started (`Recorder::base`: the program that called
/// `record`, or `python -m ocular`'s own machinery), and without the innermost frame if `skip_top` (the
/// frame an entry event is about to push). Code that is not recorded has id 0 (readers skip it). Code seen
/// for the first time is described, which runs Python.
///
/// # Safety
/// GIL held.
unsafe fn resolve(tid: i64, mut frames: Stack, skip_top: bool) -> Vec<(u32, u32)> {
    // SAFETY: (caller) GIL held; no reference into the state is kept across `lookup`.
    unsafe {
        if skip_top {
            frames.pop();
        }
        let skip = match state().recorder.as_deref() {
            Some(rec) if rec.base.0 == tid => {
                frames.iter().zip(&rec.base.1).take_while(|(f, b)| f.0.as_ptr() == b.as_ptr()).count()
            }
            _ => 0,
        };
        let mut out = Vec::with_capacity(frames.len() - skip);
        for (code, off) in frames.iter().skip(skip) {
            let cs = lookup(code.as_ptr());
            let id = if cs.is_null() || (*cs).flags & RECORD == 0 { 0 } else { (*cs).id };
            out.push((id, *off));
        }
        out
    }
}

/// A thread that starts recording inside a window (the first one included) gets its stack after the
/// `WINDOW` marker, before its first event: frames entered before the recording saw them. `entering`: the
/// event is a function entry, whose frame is already the innermost.
///
/// # Safety
/// GIL held; `ts` is the calling thread's state, just attached.
pub(super) unsafe fn attach_stack(ts: *mut super::ThreadState, entering: bool) {
    // SAFETY: (caller) GIL held; the thread state is never freed; the state is looked up again after the
    // Python that `resolve` may run.
    unsafe {
        let py = Python::assume_attached();
        let me = ffi::PyThreadState_Get();
        let tid = ffi::PyThreadState_GetID(me);
        let frames = resolve(tid, frames_of(py, me), entering);
        let st = state();
        let Some(rec) = st.recorder.as_deref() else { return };
        if (*ts).generation != st.generation {
            return;
        }
        let at = st.window.opened;
        for (depth, &(code, off)) in frames.iter().enumerate() {
            (*ts).buf.push_marker(RawEvent::new(at, code, off, depth as u32, EventKind::STACK as u8), rec.out.sink());
        }
    }
}

/// Ends the first window at `t` (a code object reached the threshold's number of calls): every thread
/// recording gets a `WINDOW_END`.
///
/// # Safety
/// GIL held.
pub(super) unsafe fn close_first_window(t: u64) {
    // SAFETY: GIL held (caller); no Python call below.
    unsafe {
        let st = state();
        if WINDOW_END.load(Ordering::Relaxed) != u64::MAX || st.window.seq != 0 {
            return;
        }
        let Some(rec) = st.recorder.as_deref() else { return };
        if !rec.windowed {
            return;
        }
        WINDOW_END.store(t, Ordering::Relaxed);
        let sink = rec.out.sink();
        let generation = st.generation;
        for &ts in &st.threads {
            let ts = &mut *ts;
            if ts.generation == generation {
                ts.buf.push_marker(marker(t, EventKind::WINDOW_END, 0, 0), sink);
            }
        }
    }
}
