//! The `sys.monitoring` callbacks: raw `METH_FASTCALL` C functions, so a call costs what a C function
//! costs (no PyO3 argument parsing, no panic trampoline, no reference pool). The path for an event whose
//! code object is the last one this thread saw: read the TSC, one thread-local load, two compares, two
//! `PyLong_AsLong`, a counter for the threshold, and `ThreadBuffer::push`.

use super::{attach, lookup, name_thread, state, thread_ending, CodeState, ThreadState, BOOT, RECORD};
use crate::clock;
use ocular_format::{EventKind, RawEvent};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::Cell;
use std::ptr;

thread_local! {
    // const-initialized and not Drop: no lazy-init check and no destructor registration on access.
    static TS: Cell<*mut ThreadState> = const { Cell::new(ptr::null_mut()) };
}

pub(super) fn set_thread_state(p: *mut ThreadState) {
    TS.with(|c| c.set(p));
}

#[inline(always)]
fn none() -> *mut ffi::PyObject {
    // SAFETY: Py_None is immortal on 3.12+; returning a new reference to it is always valid.
    unsafe { ffi::Py_NewRef(ffi::Py_None()) }
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

/// The calling thread's state for the current recording, or null when not recording.
///
/// # Safety
/// GIL held.
#[inline(always)]
unsafe fn thread_state() -> *mut ThreadState {
    let ts = TS.with(|c| c.get());
    // SAFETY: a non-null TS is a never-freed thread state of this thread; GIL held for `state()`.
    unsafe {
        if !ts.is_null() && (*ts).generation == state().generation {
            ts
        } else {
            attach(ts)
        }
    }
}

/// One event. `DEST`: args[2] is a destination offset. `LOCATION`: subject to the de-instrumentation
/// threshold. `CAN_DISABLE`: the event may return `DISABLE` (CPython raises ValueError into the user's
/// code for PY_UNWIND and PY_THROW, so those never do).
///
/// # Safety
/// Called by the interpreter with the GIL held and the arguments of a `sys.monitoring` callback.
#[inline(always)]
unsafe fn event<const KIND: u8, const DEST: bool, const LOCATION: bool, const CAN_DISABLE: bool>(
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let t = clock::ticks();
    // SAFETY: GIL held (caller); args holds at least (code, offset[, dest]) for these events.
    unsafe {
        let ts = thread_state();
        if ts.is_null() {
            return none();
        }
        let code = *args;
        let cs = if code as usize == (*ts).last_code {
            (*ts).last_state
        } else {
            let cs = lookup(code);
            // lookup may have run Python, and so other threads: check the recording is still ours.
            if cs.is_null() || (*ts).generation != state().generation {
                return none();
            }
            (*ts).last_code = code as usize;
            (*ts).last_state = cs;
            cs
        };
        if (*cs).flags != RECORD {
            return special::<KIND, DEST, LOCATION, CAN_DISABLE>(ts, cs, t, args);
        }
        record::<KIND, DEST, LOCATION, CAN_DISABLE>(ts, cs, t, args)
    }
}

/// # Safety
/// As [`event`], with `ts` and `cs` valid for the current recording.
#[inline(always)]
unsafe fn record<const KIND: u8, const DEST: bool, const LOCATION: bool, const CAN_DISABLE: bool>(
    ts: *mut ThreadState,
    cs: *mut CodeState,
    t: u64,
    args: *mut *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: see the function's contract; offsets are Python ints, for which PyLong_AsLong cannot fail.
    unsafe {
        let Some(rec) = state().recorder.as_deref() else { return none() };
        let off = ffi::PyLong_AsLong(*args.add(1)) as u32;
        let arg = if DEST { ffi::PyLong_AsLong(*args.add(2)) as u32 } else { 0 };
        let mut stop_here = false;
        if LOCATION && rec.threshold != 0 {
            if let Some(h) = (&mut (*cs).hits).get_mut((off / 2) as usize) {
                *h += 1;
                stop_here = *h >= rec.threshold;
            }
        }
        (*ts).buf.push(RawEvent::new(t, (*cs).id, off, arg, KIND), rec.out.sink());
        if CAN_DISABLE && stop_here {
            disable()
        } else {
            none()
        }
    }
}

/// Code that is not simply recorded: excluded by a filter, or `threading.Thread._bootstrap`.
///
/// # Safety
/// As [`record`].
#[cold]
#[inline(never)]
unsafe fn special<const KIND: u8, const DEST: bool, const LOCATION: bool, const CAN_DISABLE: bool>(
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
        if flags & RECORD != 0 {
            let r = record::<KIND, DEST, false, false>(ts, cs, t, args);
            ffi::Py_DECREF(r);
        }
        if KIND == EventKind::PY_RETURN as u8 || KIND == EventKind::PY_UNWIND as u8 {
            thread_ending(ts);
        }
        none()
    }
}

macro_rules! callbacks {
    ($($def:ident $f:ident $event:literal: $kind:ident, dest=$dest:literal, location=$loc:literal, disable=$dis:literal;)*) => {
        $(
            unsafe extern "C" fn $f(
                _slf: *mut ffi::PyObject,
                args: *mut *mut ffi::PyObject,
                _nargs: ffi::Py_ssize_t,
            ) -> *mut ffi::PyObject {
                // SAFETY: registered with sys.monitoring for exactly this event, whose arguments match.
                unsafe { event::<{ EventKind::$kind as u8 }, $dest, $loc, $dis>(args) }
            }
            static $def: Def = Def(ffi::PyMethodDef {
                ml_name: concat!("ocular_", $event, "\0").as_ptr().cast(),
                ml_meth: ffi::PyMethodDefPointer { PyCFunctionFast: $f },
                ml_flags: ffi::METH_FASTCALL,
                ml_doc: ptr::null(),
            });
        )*

        /// `{event name: callback}` for every event Ocular records.
        pub(super) fn callbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
            let d = PyDict::new(py);
            $( d.set_item($event, function(py, &$def)?)?; )*
            Ok(d)
        }
    };
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

callbacks! {
    DEF_PY_START on_py_start "PY_START": PY_START, dest=false, location=false, disable=true;
    DEF_PY_RESUME on_py_resume "PY_RESUME": PY_RESUME, dest=false, location=false, disable=true;
    DEF_PY_RETURN on_py_return "PY_RETURN": PY_RETURN, dest=false, location=false, disable=true;
    DEF_PY_YIELD on_py_yield "PY_YIELD": PY_YIELD, dest=false, location=false, disable=true;
    DEF_PY_UNWIND on_py_unwind "PY_UNWIND": PY_UNWIND, dest=false, location=false, disable=false;
    DEF_PY_THROW on_py_throw "PY_THROW": PY_THROW, dest=false, location=false, disable=false;
    DEF_JUMP on_jump "JUMP": JUMP, dest=true, location=true, disable=true;
    DEF_BRANCH on_branch "BRANCH": BRANCH, dest=true, location=true, disable=true;
    DEF_BRANCH_LEFT on_branch_left "BRANCH_LEFT": BRANCH_LEFT, dest=true, location=true, disable=true;
    DEF_BRANCH_RIGHT on_branch_right "BRANCH_RIGHT": BRANCH_RIGHT, dest=true, location=true, disable=true;
    DEF_INSTRUCTION on_instruction "INSTRUCTION": INSTRUCTION, dest=false, location=true, disable=true;
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

/// `{"floor": ..., "noop": ...}`: reference callbacks for benchmarks, valid for any event.
pub(super) fn bench_callbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("floor", function(py, &DEF_FLOOR)?)?;
    d.set_item("noop", function(py, &DEF_NOOP)?)?;
    Ok(d)
}
