//! Spans (FORMAT.md 5.9): a stretch of the program its code marks as one unit of work (a request, a job),
//! written into the event stream of the thread where it runs. [`Span`] is `ocular.span` (a context manager,
//! async context manager and decorator whose entry and exit cost a few hundred nanoseconds: a service
//! writes one around every request); the OpenTelemetry span processor (`ocular.otel`) calls [`span_begin`]
//! and [`span_end`]. Neither is on the hot path of the callbacks.

use super::callbacks::{code_boundary, current_thread};
use super::state;
use super::ThreadState;
use ocular_format::span::{self, Attribute, SpanBeginRef, SpanEnd};
use ocular_format::EventKind;
use ocular_record::clock;
use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The next span's key, and the recording generation it counts for: keys start at 1 in every recording.
static NEXT: AtomicU64 = AtomicU64::new(1);
static NEXT_FOR: AtomicU64 = AtomicU64::new(0);

/// The `contextvars.ContextVar` holding the key of the span that encloses the code running now (per thread
/// and per asyncio task), the function a span's end calls while dump rules are set (`_spans.ended`), and
/// the one that makes a decorated function (`_spans.decorate`): given by the package once ([`span_setup`]),
/// kept for the process's life.
static CURRENT: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
static ENDED: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
static DECORATE: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
/// Whether the running recording has dump rules (a span's end then reports its duration).
static RULES: AtomicBool = AtomicBool::new(false);

/// `span_setup(current, ended, decorate)`: the package's context variable, its span-end hook and its
/// decorator (once, at import).
#[pyfunction]
pub(super) fn span_setup(current: Bound<'_, PyAny>, ended: Bound<'_, PyAny>, decorate: Bound<'_, PyAny>) {
    CURRENT.store(current.unbind().into_ptr(), Ordering::Release);
    ENDED.store(ended.unbind().into_ptr(), Ordering::Release);
    DECORATE.store(decorate.unbind().into_ptr(), Ordering::Release);
}

/// `span_rules(on)`: whether the running recording has dump rules.
#[pyfunction]
pub(super) fn span_rules(on: bool) {
    RULES.store(on, Ordering::Relaxed);
}

/// A span's attributes as FORMAT.md 5.9 writes them: (key, kind, value as text).
fn attributes_of(d: &Bound<'_, PyDict>) -> PyResult<Vec<Attribute>> {
    let mut out = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        out.push(attribute(k.str()?.to_string(), &v)?);
    }
    Ok(out)
}

fn attribute(key: String, v: &Bound<'_, PyAny>) -> PyResult<Attribute> {
    let kind = if v.is_instance_of::<PyString>() {
        0
    } else if v.is_instance_of::<PyBool>() {
        1
    } else if v.is_instance_of::<PyInt>() {
        2
    } else if v.is_instance_of::<PyFloat>() {
        3
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        4
    } else {
        5
    };
    let text = if kind == 4 { v.repr()? } else { v.str()? };
    Ok(Attribute { key, kind, value: text.to_string() })
}

/// Marks a span, named ``name``, with attributes: a context manager (``with``, ``async with``) or a
/// decorator of a function or coroutine function (a span per call). ``set_attribute(key, value)`` adds an
/// attribute known only once it runs.
///
/// A span belongs to the thread where it begins, or, begun in a coroutine, to that coroutine and what it
/// awaits: the asyncio tasks that run in between on the same thread are not in it. An exception that ends
/// it is its status (an error, with the exception's message). One ``span`` object marks one span at a
/// time; a decorator makes a new one per call. While nothing records, a span writes nothing.
#[pyclass(module = "ocular", name = "span", freelist = 64)]
pub(super) struct Span {
    /// The span's name.
    #[pyo3(get)]
    name: Py<PyString>,
    /// Its attributes as given (a decorator makes a span per call with them).
    #[pyo3(get)]
    attributes: Option<Py<PyDict>>,
    /// Attributes set while it runs, written at its end.
    later: Vec<Attribute>,
    /// Its key while open and recorded (0: not recorded), and whether it is open.
    key: u64,
    open: bool,
    /// The context variable's token, to put back the enclosing span at the end.
    token: Option<Py<PyAny>>,
    /// Ticks at its beginning, while dump rules are set (0: not kept).
    began: u64,
}

#[pymethods]
impl Span {
    #[new]
    #[pyo3(signature = (name, /, **attributes))]
    fn new(name: Bound<'_, PyAny>, attributes: Option<Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(Span {
            name: name.str()?.unbind(),
            attributes: attributes.map(Bound::unbind),
            later: Vec::new(),
            key: 0,
            open: false,
            token: None,
            began: 0,
        })
    }

    /// An attribute known only once the span runs (a result's size): written at its end.
    fn set_attribute(&mut self, key: Bound<'_, PyAny>, value: Bound<'_, PyAny>) -> PyResult<()> {
        let a = attribute(key.str()?.to_string(), &value)?;
        self.later.retain(|x| x.key != a.key);
        self.later.push(a);
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        Self::begin(&slf, None)?;
        Ok(slf)
    }

    /// `async with`: the span begins in the caller's coroutine, which is what it belongs to (a coroutine of
    /// Ocular's own is not recorded, and would be the innermost one on the stack), so this is not one: it
    /// returns an awaitable that is done at once.
    fn __aenter__(slf: Bound<'_, Self>) -> PyResult<Done> {
        Self::begin(&slf, None)?;
        Ok(Done { value: Some(slf.into_any().unbind()) })
    }

    #[pyo3(signature = (exc_type = None, exc = None, tb = None))]
    fn __aexit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        exc: Option<Bound<'_, PyAny>>,
        tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Done> {
        self.__exit__(py, exc_type, exc, tb)?;
        Ok(Done { value: None })
    }

    /// As a decorator: a span per call of `fn` (per run of a coroutine function's coroutine).
    fn __call__<'py>(slf: Bound<'py, Self>, r#fn: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let hook = DECORATE.load(Ordering::Acquire);
        if hook.is_null() {
            return Err(PyRuntimeError::new_err("ocular.span as a decorator needs the ocular package"));
        }
        // SAFETY: `hook` is kept alive by span_setup's reference.
        unsafe { Bound::from_borrowed_ptr(py, hook) }.call1((slf, r#fn))
    }

    /// Begins the span as the turns of `coro` (a coroutine not yet started: the decorator's), or, without
    /// it, of the code that called.
    #[pyo3(name = "_begin")]
    fn begin_with<'py>(slf: Bound<'py, Self>, coro: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, Self>> {
        Self::begin(&slf, coro)?;
        Ok(slf)
    }

    #[pyo3(signature = (exc_type = None, exc = None, _tb = None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let key = std::mem::take(&mut self.key);
        self.open = false;
        if let Some(token) = self.token.take() {
            let var = CURRENT.load(Ordering::Acquire);
            // SAFETY: GIL held; `var` is the context variable span_setup keeps alive, `token` one it made.
            if !var.is_null() && unsafe { ffi::PyContextVar_Reset(var, token.as_ptr()) } != 0 {
                // Ended in another context than it began in (a token of another context): nothing
                // encloses from here.
                PyErr::take(py);
                let zero = 0u64.into_pyobject(py)?;
                // SAFETY: as above; the new token is released at once.
                unsafe { ffi::Py_XDECREF(ffi::PyContextVar_Set(var, zero.as_ptr())) };
            }
        }
        if key == 0 {
            return Ok(false);
        }
        let exc_type = exc_type.filter(|t| !t.is_none());
        let (status, message) = match &exc_type {
            Some(t) => {
                let name = t.getattr(pyo3::intern!(py, "__name__"))?.str()?.to_string();
                let text = exc.filter(|e| !e.is_none()).map(|e| e.str().map(|s| s.to_string())).transpose()?;
                (
                    2,
                    match text {
                        Some(text) if !text.is_empty() => format!("{name}: {text}"),
                        _ => name,
                    },
                )
            }
            None => (0, String::new()),
        };
        let later = std::mem::take(&mut self.later);
        let end = write_end(key, status, message, later);
        let began = std::mem::take(&mut self.began);
        if began != 0 && RULES.load(Ordering::Relaxed) {
            if let Some(end) = end {
                report_end(py, self.name.bind(py), end.saturating_sub(began))?;
            }
        }
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("ocular.span({:?})", self.name.bind(py).to_string_lossy())
    }
}

impl Span {
    fn begin(slf: &Bound<'_, Self>, coro: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let mut s = slf.borrow_mut();
        if s.open {
            return Err(PyRuntimeError::new_err(format!(
                "span {:?} is already open: one span object marks one span at a time",
                s.name.bind(py).to_string_lossy()
            )));
        }
        s.open = true;
        // SAFETY: GIL held; the state is only read.
        if unsafe { state() }.recorder.is_none() {
            return Ok(()); // nothing records: the span costs this much
        }
        let var = CURRENT.load(Ordering::Acquire);
        let parent = current_key(py, var);
        let attributes = match &s.attributes {
            Some(d) => attributes_of(d.bind(py))?,
            None => Vec::new(),
        };
        let frame = coro.map_or(0, |c| frame_of(&c));
        let name = s.name.bind(py).to_str()?;
        let (key, t) = write_begin(name, &attributes, &[], &[], &[], parent, frame);
        s.key = key;
        if key != 0 && !var.is_null() {
            let k = key.into_pyobject(py)?;
            // SAFETY: GIL held; `var` is the context variable span_setup keeps alive.
            let token = unsafe { ffi::PyContextVar_Set(var, k.as_ptr()) };
            if token.is_null() {
                return Err(PyErr::fetch(py));
            }
            // SAFETY: a new reference, owned from here.
            s.token = Some(unsafe { Bound::from_owned_ptr(py, token) }.unbind());
            if RULES.load(Ordering::Relaxed) {
                s.began = t;
            }
        }
        Ok(())
    }
}

/// The key of the span enclosing the code running now (0: none).
fn current_key(py: Python<'_>, var: *mut ffi::PyObject) -> u64 {
    if var.is_null() {
        return 0;
    }
    let mut out: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: GIL held; `var` is a live context variable; `out` receives a new reference (or null).
    unsafe {
        if ffi::PyContextVar_Get(var, std::ptr::null_mut(), &mut out) != 0 || out.is_null() {
            PyErr::take(py);
            return 0;
        }
        Bound::from_owned_ptr(py, out).extract::<u64>().unwrap_or(0)
    }
}

/// A span's end took `ticks`: the package's hook decides whether a dump rule fires.
fn report_end(py: Python<'_>, name: &Bound<'_, PyString>, ticks: u64) -> PyResult<()> {
    let hook = ENDED.load(Ordering::Acquire);
    if hook.is_null() {
        return Ok(());
    }
    // SAFETY: GIL held; the recorder is only read.
    let tps = match unsafe { state() }.recorder.as_deref() {
        Some(rec) => rec.ticks_per_second,
        None => return Ok(()),
    };
    // SAFETY: `hook` is kept alive by span_setup's reference.
    let hook = unsafe { Bound::from_borrowed_ptr(py, hook) };
    hook.call1((name, ticks as f64 / tps))?;
    Ok(())
}

/// Writes a span's beginning on the calling thread: its key (0 when nothing records) and tick.
fn write_begin(
    name: &str,
    attributes: &[Attribute],
    trace_id: &[u8],
    span_id: &[u8],
    parent_span_id: &[u8],
    parent: u64,
    frame: u64,
) -> (u64, u64) {
    let t = clock::ticks();
    // SAFETY: GIL held (callers are Python-facing); the thread state of the current recording, if any.
    unsafe {
        let ts = current_thread::<{ EventKind::SPAN as u8 }>();
        if ts.is_null() {
            return (0, t);
        }
        let generation = state().generation;
        if NEXT_FOR.swap(generation, Ordering::Relaxed) != generation {
            NEXT.store(1, Ordering::Relaxed);
        }
        let key = NEXT.fetch_add(1, Ordering::Relaxed);
        let record = SpanBeginRef {
            name,
            trace_id,
            span_id,
            parent_span_id,
            parent,
            frame: if frame != 0 { frame } else { coroutine_frame(ts) },
            attributes,
            cut: false,
        };
        span::write_begin_ref(t, key, &record, |e| (*ts).buf.push(e, &*(*ts).sink));
        (key, t)
    }
}

/// Writes a span's end on the calling thread; its tick, or `None` if nothing records (or an earlier
/// recording's span).
fn write_end(key: u64, status: u8, message: String, attributes: Vec<Attribute>) -> Option<u64> {
    let t = clock::ticks();
    // SAFETY: GIL held (callers are Python-facing); the thread state of the current recording, if any.
    unsafe {
        let ts = current_thread::<{ EventKind::SPAN_END as u8 }>();
        if ts.is_null() || NEXT_FOR.load(Ordering::Relaxed) != state().generation {
            return None;
        }
        let record = SpanEnd { status, message, attributes, cut: false };
        span::write_end(t, key, Some(&record), |e| (*ts).buf.push(e, &*(*ts).sink));
        Some(t)
    }
}

/// Begins a span on the calling thread (the OpenTelemetry processor's): returns its key, or 0 when
/// nothing is recording (then [`span_end`] of 0 does nothing). `attributes` are (key, kind, value) as
/// FORMAT.md 5.9 gives them; the ids are OpenTelemetry's, as its integers (the parent's `None` for a root
/// span), written big-endian as OpenTelemetry's hex is; `parent` is the key of the span of this recording
/// that encloses it (0: none). The span is the turns of the innermost coroutine frame on the stack, or else
/// the thread's.
#[pyfunction]
#[pyo3(signature = (name, attributes, trace_id, span_id, parent_span_id, parent))]
pub(super) fn span_begin(
    name: &str,
    attributes: Vec<(String, u8, String)>,
    trace_id: u128,
    span_id: u64,
    parent_span_id: Option<u64>,
    parent: u64,
) -> u64 {
    let attributes: Vec<Attribute> = attributes.into_iter().map(attribute_of).collect();
    let parent_span_id = parent_span_id.map(u64::to_be_bytes);
    let parent_span_id = parent_span_id.as_ref().map_or(&[][..], |b| &b[..]);
    write_begin(name, &attributes, &trace_id.to_be_bytes(), &span_id.to_be_bytes(), parent_span_id, parent, 0).0
}

/// Ends the span of `key` on the calling thread: `status` 0 unset, 1 ok, 2 error, with `message` and the
/// attributes set since it began. A key of 0, or a call while nothing records, does nothing.
#[pyfunction]
#[pyo3(signature = (key, status = 0, message = String::new(), attributes = Vec::new()))]
pub(super) fn span_end(key: u64, status: u8, message: String, attributes: Vec<(String, u8, String)>) {
    if key != 0 {
        write_end(key, status, message, attributes.into_iter().map(attribute_of).collect());
    }
}

fn attribute_of((key, kind, value): (String, u8, String)) -> Attribute {
    Attribute { key, kind, value }
}

/// What `async with` awaits at a span's entry and exit: an awaitable that is done at once, with `value`.
#[pyclass(module = "ocular._ocular", name = "SpanDone", freelist = 16)]
pub(super) struct Done {
    value: Option<Py<PyAny>>,
}

#[pymethods]
impl Done {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<()> {
        let value = self.value.take().unwrap_or_else(|| py.None());
        Err(PyStopIteration::new_err((value,)))
    }
}

/// `span_current() -> int`: the key of the span enclosing the code running now (0: none).
#[pyfunction]
pub(super) fn span_current(py: Python<'_>) -> u64 {
    current_key(py, CURRENT.load(Ordering::Acquire))
}

/// The frame id (FORMAT.md 5.5) of a coroutine's or async generator's frame (0: neither). Its interpreter
/// frame lives inside the object, from its creation on, where it runs.
fn frame_of(coro: &Bound<'_, PyAny>) -> u64 {
    let py = coro.py();
    let frame = [pyo3::intern!(py, "cr_frame"), pyo3::intern!(py, "ag_frame")]
        .into_iter()
        .find_map(|a| coro.getattr(a).ok().filter(|f| !f.is_none()));
    let Some(frame) = frame else { return 0 };
    // SAFETY: `frame` is a frame object (checked); its `f_frame` follows the object header and f_back in
    // 3.12 to 3.15, as the callbacks' frame ids read it.
    unsafe {
        if ffi::PyFrame_Check(frame.as_ptr()) == 0 {
            return 0;
        }
        let iframe = ((frame.as_ptr() as *const u8).add(24) as *const usize).read();
        (iframe >> 3) as u64
    }
}

/// How many frames out from the current one a span's coroutine is looked for: a span begun in sync code
/// called from a coroutine (OpenTelemetry's processor, under its tracer's context manager) is a few frames
/// in.
const COROUTINE_DEPTH: usize = 48;

/// Whether the frame layout was checked for spans (once a process).
static LAYOUT_TRIED: AtomicBool = AtomicBool::new(false);

/// The frame id (FORMAT.md 5.5) of the innermost frame on the calling thread's stack whose code is a
/// coroutine's or an async generator's (the recorder marks it so, FORMAT.md 5.5), or 0: the coroutine
/// whose turns a span begun here is made of.
///
/// # Safety
/// GIL held; `ts` the calling thread's state for the current recording.
unsafe fn coroutine_frame(ts: *mut ThreadState) -> u64 {
    use ocular_format::event::flags::FRAME;
    // SAFETY: GIL held (caller): the frames of this thread are live and do not move while it runs this;
    // their first two words (code, previous frame) have the layout `due::check` verified.
    unsafe {
        let pyts = (*ts).pyts;
        if !super::due::layout_checked() {
            if LAYOUT_TRIED.swap(true, Ordering::Relaxed) {
                return coroutine_frame_slow();
            }
            // Checked once, as the windows' opener checks it: the frames read directly against the
            // interpreter's frame objects.
            let py = Python::assume_attached();
            let me = pyts as *mut ffi::PyThreadState;
            let frames: Vec<usize> =
                super::windows::frames_of(py, me).iter().map(|(c, _)| c.as_ptr() as usize).collect();
            if !super::due::check(pyts, &frames) {
                return coroutine_frame_slow();
            }
        }
        // The running frame, read directly (this thread's own, with the GIL).
        let mut f = (super::callbacks::frame_id(pyts) << 3) as usize;
        for _ in 0..COROUTINE_DEPTH {
            if f == 0 || f % 8 != 0 {
                return 0;
            }
            let code = (f as *const usize).read() & !7;
            if code_boundary(ts, code).is_some_and(|b| b & FRAME != 0) {
                return (f >> 3) as u64;
            }
            f = (f as *const usize).add(1).read();
        }
        0
    }
}

/// [`coroutine_frame`] through the interpreter's frame objects, where the layout was not checked.
///
/// # Safety
/// GIL held.
unsafe fn coroutine_frame_slow() -> u64 {
    // SAFETY: GIL held (caller); every reference taken here is released before returning.
    unsafe {
        let mut f = ffi::PyEval_GetFrame(); // borrowed
        if f.is_null() {
            return 0;
        }
        ffi::Py_IncRef(f.cast());
        for _ in 0..COROUTINE_DEPTH {
            if f.is_null() {
                return 0;
            }
            let owner = ffi::PyFrame_GetGenerator(f); // new reference, or null
            let coroutine =
                !owner.is_null() && (ffi::PyCoro_CheckExact(owner) != 0 || ffi::PyAsyncGen_CheckExact(owner) != 0);
            ffi::Py_XDECREF(owner);
            if coroutine {
                let iframe = ((f as *const u8).add(24) as *const usize).read();
                ffi::Py_DecRef(f.cast());
                return (iframe >> 3) as u64;
            }
            let back = ffi::PyFrame_GetBack(f); // new reference
            ffi::Py_DecRef(f.cast());
            f = back;
        }
        ffi::Py_XDECREF(f.cast());
        0
    }
}
