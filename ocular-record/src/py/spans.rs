//! Spans (FORMAT.md 5.9): a stretch of the program its code marks as one unit of work (a request, a job),
//! written into the event stream of the thread where it runs. `ocular.span` and the OpenTelemetry span
//! processor (`ocular.otel`) call these; neither is on the hot path of the callbacks.

use super::callbacks::current_thread;
use super::state;
use crate::clock;
use ocular_format::span::{self, Attribute, SpanBegin, SpanEnd};
use ocular_format::EventKind;
use pyo3::ffi;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next span's key, and the recording generation it counts for: keys start at 1 in every recording.
static NEXT: AtomicU64 = AtomicU64::new(1);
static NEXT_FOR: AtomicU64 = AtomicU64::new(0);

/// Begins a span on the calling thread: returns its key, or 0 when nothing is recording (then
/// [`span_end`] of 0 does nothing). `attributes` are (key, kind, value) as FORMAT.md 5.9 gives them; the
/// three ids are OpenTelemetry's, or empty; `parent` is the key of the span of this recording that
/// encloses it (0: none). The span is the turns of `coro` (a coroutine or async generator, not yet
/// started) where given, else of the innermost coroutine frame on the stack, else the thread's.
#[pyfunction]
#[pyo3(signature = (name, attributes, trace_id, span_id, parent_span_id, parent, coro = None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn span_begin(
    name: String,
    attributes: Vec<(String, u8, String)>,
    trace_id: &[u8],
    span_id: &[u8],
    parent_span_id: &[u8],
    parent: u64,
    coro: Option<Bound<'_, PyAny>>,
) -> u64 {
    let t = clock::ticks();
    let frame = match coro {
        Some(c) => frame_of(&c),
        None => 0,
    };
    // SAFETY: GIL held (called from Python); the thread state of the current recording, if any.
    unsafe {
        let ts = current_thread::<{ EventKind::SPAN as u8 }>();
        if ts.is_null() {
            return 0;
        }
        let generation = state().generation;
        if NEXT_FOR.swap(generation, Ordering::Relaxed) != generation {
            NEXT.store(1, Ordering::Relaxed);
        }
        let key = NEXT.fetch_add(1, Ordering::Relaxed);
        let record = SpanBegin {
            name,
            trace_id: trace_id.to_vec(),
            span_id: span_id.to_vec(),
            parent_span_id: parent_span_id.to_vec(),
            parent,
            frame: if frame != 0 { frame } else { coroutine_frame() },
            attributes: attributes.into_iter().map(|(key, kind, value)| Attribute { key, kind, value }).collect(),
            cut: false,
        };
        for e in span::begin_events(t, key, &record) {
            (*ts).buf.push(e, &*(*ts).sink);
        }
        key
    }
}

/// Ends the span of `key` on the calling thread: `status` 0 unset, 1 ok, 2 error, with `message` and the
/// attributes set since it began. A key of 0, or a call while nothing records, does nothing.
#[pyfunction]
#[pyo3(signature = (key, status = 0, message = String::new(), attributes = Vec::new()))]
pub(super) fn span_end(key: u64, status: u8, message: String, attributes: Vec<(String, u8, String)>) {
    if key == 0 {
        return;
    }
    let t = clock::ticks();
    // SAFETY: GIL held (called from Python); the thread state of the current recording, if any.
    unsafe {
        let ts = current_thread::<{ EventKind::SPAN_END as u8 }>();
        if ts.is_null() || NEXT_FOR.load(Ordering::Relaxed) != state().generation {
            return; // a span of an earlier recording
        }
        let record = SpanEnd {
            status,
            message,
            attributes: attributes.into_iter().map(|(key, kind, value)| Attribute { key, kind, value }).collect(),
            cut: false,
        };
        for e in span::end_events(t, key, Some(&record)) {
            (*ts).buf.push(e, &*(*ts).sink);
        }
    }
}

/// The frame id (FORMAT.md 5.5) of a coroutine's or async generator's frame (0: neither). Its interpreter
/// frame lives inside the object, from its creation on, where it runs.
fn frame_of(coro: &Bound<'_, PyAny>) -> u64 {
    let py = coro.py();
    let frame = [pyo3::intern!(py, "cr_frame"), pyo3::intern!(py, "ag_frame")]
        .into_iter()
        .find_map(|a| coro.getattr(a).ok().filter(|f| !f.is_none()));
    let Some(frame) = frame else { return 0 };
    // SAFETY: `frame` is a frame object (the attribute of a coroutine or async generator); its `f_frame`
    // follows the object header and f_back in 3.12 to 3.15, as the callbacks' frame ids read it.
    unsafe {
        if ffi::PyFrame_Check(frame.as_ptr()) == 0 {
            return 0;
        }
        let iframe = ((frame.as_ptr() as *const u8).add(24) as *const usize).read();
        (iframe >> 3) as u64
    }
}

/// The frame id (FORMAT.md 5.5) of the innermost coroutine frame on the calling thread's stack, or 0: the
/// coroutine whose turns a span begun here is made of.
///
/// # Safety
/// GIL held.
unsafe fn coroutine_frame() -> u64 {
    // SAFETY: GIL held (caller); frames and code objects are borrowed only while the references taken
    // here are held, and released before returning.
    unsafe {
        let mut f = ffi::PyEval_GetFrame(); // borrowed
        if f.is_null() {
            return 0;
        }
        ffi::Py_IncRef(f.cast());
        while !f.is_null() {
            // A coroutine's or an async generator's frame: what asyncio resumes (FORMAT.md 5.5).
            let owner = ffi::PyFrame_GetGenerator(f); // new reference, or null
            let coroutine =
                !owner.is_null() && (ffi::PyCoro_CheckExact(owner) != 0 || ffi::PyAsyncGen_CheckExact(owner) != 0);
            ffi::Py_XDECREF(owner);
            if coroutine {
                // `PyFrameObject.f_frame`: after the object header and f_back, in 3.12 to 3.15 (as the
                // callbacks' frame ids read it).
                let iframe = ((f as *const u8).add(24) as *const usize).read();
                ffi::Py_DecRef(f.cast());
                return (iframe >> 3) as u64;
            }
            let back = ffi::PyFrame_GetBack(f); // new reference
            ffi::Py_DecRef(f.cast());
            f = back;
        }
        0
    }
}
