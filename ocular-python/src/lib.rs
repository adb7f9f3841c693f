//! `ocular._ocular`: the CPython extension. Everything Python-facing lives in `python/ocular/`; this module
//! only holds state and the callbacks `sys.monitoring` calls.
//!
//! Every function here runs with the GIL held (CPython 3.12-3.15 with the GIL; the Python package refuses
//! free-threaded builds), which is what makes the unsynchronized global state below sound. ARCHITECTURE.md
//! ("The GIL") lists every such assumption and what a free-threaded port replaces it with. A
//! Python call made from here can let another thread run, which may even stop the recording: so no
//! reference into the state is held across one, and the state is looked up again after it.

mod analyze;
mod callbacks;
mod cfunc;
mod cli;
mod due;
mod live;
mod read;
mod spans;
mod topy;
mod windows;

use ocular_format::{CodeObject, CodeSnapshot, EventKind, Header, Mode, OpcodeTable, Options, ThreadInfo};
use ocular_record::clock::{self, ClockPoint};
use ocular_record::filter::Filter;
use ocular_record::session::{Config, Discard, OnFull, Session, Sink, ThreadBuffer};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use rustc_hash::FxHashMap;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// A value shared between threads that only ever touch it with the GIL held.
struct GilCell<T>(UnsafeCell<T>);

// SAFETY: every access goes through `state()`, which is only called with the GIL held (from
// `sys.monitoring` callbacks or from functions of this module), so accesses never overlap.
unsafe impl<T> Sync for GilCell<T> {}

struct State {
    recorder: Option<Box<Recorder>>,
    /// Every thread state ever made. Never freed: a thread's thread-local pointer may outlive a
    /// recording, and `generation` tells it its state is stale. A thread that exits gives its state to the
    /// next new thread ([`retire_ended`]), so a program that starts a thread per request keeps as many
    /// states as it had threads at once.
    threads: Vec<*mut ThreadState>,
    /// States of exited threads, retired, for new threads to take.
    free: Vec<*mut ThreadState>,
    /// The threads of this recording retired while it ran, and the events they pushed: `stop` counts
    /// them with the live ones.
    retired_threads: u64,
    retired_pushed: u64,
    /// Bumped at every start and stop.
    generation: u64,
    /// The current (or last) window of a thresholded recording (FORMAT.md 5.3).
    window: Window,
}

static STATE: GilCell<State> = GilCell(UnsafeCell::new(State {
    recorder: None,
    threads: Vec::new(),
    free: Vec::new(),
    retired_threads: 0,
    retired_pushed: 0,
    generation: 0,
    window: Window { seq: 0, opened: 0, len_us: u32::MAX },
}));

/// A span of time in which every function boundary is recorded (FORMAT.md 5.3).
#[derive(Clone, Copy)]
struct Window {
    /// Sequence number in the recording, from 0.
    seq: u32,
    /// Ticks when it opened.
    opened: u64,
    /// Length in microseconds; `u32::MAX` for the first window, which ends after the recording's first
    /// 100 x threshold calls.
    len_us: u32,
}

/// The tick at which the current window ends: function boundaries with a later tick are not recorded.
/// `u64::MAX` while the first window is open. Written with the GIL held, read by the callbacks.
pub(crate) static WINDOW_END: AtomicU64 = AtomicU64::new(u64::MAX);

/// Calls recorded since the recording started (compared only while the first window is open), and the
/// number at which the first window ends: `FIRST_WINDOW_CALLS_PER_HIT` times the threshold (FORMAT.md
/// 5.3). Written with the GIL held.
pub(crate) static FIRST_CALLS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FIRST_LIMIT: AtomicU64 = AtomicU64::new(0);

/// 50,000 calls at the default threshold of 500: a few milliseconds of recording every call, whatever
/// the program.
pub(crate) const FIRST_WINDOW_CALLS_PER_HIT: u64 = 100;

/// The global state.
///
/// # Safety
/// The GIL must be held, and the returned reference must not be kept across a call into Python.
#[allow(clippy::mut_from_ref)]
unsafe fn state() -> &'static mut State {
    // SAFETY: see `GilCell`; the caller upholds the GIL and no-Python-call requirements.
    unsafe { &mut *STATE.0.get() }
}

enum Output {
    File(Session),
    Discard(Discard),
}

impl Output {
    fn sink(&self) -> &dyn Sink {
        match self {
            Output::File(s) => s,
            Output::Discard(d) => d,
        }
    }
}

/// Per code object: decided once, at its first event.
struct CodeState {
    /// Id in the file; 0 when not recorded.
    id: u32,
    /// Bit 0: record its events. Bit 1: `threading.Thread._bootstrap` (names and flushes threads).
    flags: u8,
    /// Its function boundaries' extra flags (FORMAT.md 5.5): `event::FRAME` for coroutine code (the frame's
    /// id is recorded), `event::ALWAYS` for code whose boundaries are recorded outside windows too; 0 for
    /// most code, whose boundary events then cost one more compare of this byte.
    boundary: u8,
    /// Hits per code unit (offset / 2), for the de-instrumentation threshold.
    hits: Box<[u32]>,
    /// Backward jumps per loop head (destination / 2), allocated at the code object's first one.
    heads: Box<[u32]>,
    /// Calls started outside windows, counted with a `COUNT` event each up to the threshold (FORMAT.md 5.8).
    counted: u32,
}

const RECORD: u8 = 1;
const BOOT: u8 = 2;

struct Recorder {
    out: Output,
    codes: FxHashMap<usize, Box<CodeState>>,
    /// Strong references to every code object seen, so no address is reused while recording.
    keep: Vec<Py<PyAny>>,
    /// The recorded code objects, by id - 1, for the snapshot at stop.
    recorded: Vec<Py<PyAny>>,
    filter: Filter,
    threshold: u32,
    /// The callbacks count hits per location against the threshold (a threshold above 0, adaptive or
    /// precise mode): a code object's first sight then sizes its counters.
    counts_hits: bool,
    thread_name: Py<PyAny>,
    /// `threading.Thread._bootstrap`'s code object; 0 when `threading` was not imported at the start (Ocular
    /// does not import it: ~1.5 ms of every run), and the code is known by its name at its first sight.
    boot_code: usize,
    main_native_id: u64,
    main_name: String,
    disable: *mut ffi::PyObject,
    /// Python exceptions swallowed in callbacks (they must never reach user code); reported at stop.
    errors: Vec<String>,
    /// `sys.monitoring.restart_events`, which re-arms every switched-off location when a window opens.
    restart: Py<PyAny>,
    ticks_per_second: f64,
    /// Function boundaries are recorded in windows (a threshold above 0, adaptive or precise mode).
    windowed: bool,
    /// The thread that opens windows, once `start_windows` started it.
    windows: Option<windows::Opener>,
    /// Later windows' length, in microseconds and in ticks.
    window_len: (u32, u64),
    /// The thread that started the recording (`PyThreadState_GetID`) and the code of the frames it was in,
    /// outermost first, up to the innermost one that is not Ocular's: what called `record` (or `python -m
    /// ocular`'s machinery). Stacks taken in windows leave them out, as calls recorded from the start do.
    base: (i64, Vec<Py<PyAny>>),
    /// Performance counters, if asked for (FORMAT.md 6.9).
    counters: Option<CounterState>,
    /// C callables called (FORMAT.md 6.11), by key (`callbacks::c_key`): their ids, from 1.
    cfuncs: FxHashMap<(usize, usize), u32>,
    /// The C callable objects `cfuncs` keeps alive for the threads' `pcache`.
    kept: rustc_hash::FxHashSet<usize>,
}

/// A recording's counters and the thread that drains their samples into the file.
struct CounterState {
    c: std::sync::Arc<ocular_record::counters::Counters>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    drain: Option<std::thread::JoinHandle<()>>,
    sink: ocular_record::session::CounterSink,
}

impl CounterState {
    /// Starts the `ocular-counters` thread: every 10 ms, the samples the kernel wrote go to the writer.
    fn start(c: ocular_record::counters::Counters, sink: ocular_record::session::CounterSink) -> CounterState {
        let c = std::sync::Arc::new(c);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = c.any().then(|| {
            let (c, stop, sink) = (std::sync::Arc::clone(&c), std::sync::Arc::clone(&stop), sink.clone());
            ocular_record::threads::spawn("ocular-counters", move || {
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    sink.send(c.drain());
                }
            })
            .ok()
        });
        CounterState { c, stop, drain: drain.flatten(), sink }
    }

    /// Stops the drain and sends what is left.
    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.drain.take() {
            let _ = h.join();
        }
        self.sink.send(self.c.drain());
        self.c.thread_failures()
    }
}

/// Direct-mapped cache of code object -> state, per thread: consecutive events alternate between a
/// handful of code objects (caller and callees), which a single "last code" entry would miss. 12 KiB: only
/// the entries of the functions running are read, and those stay in the CPU's L1 cache. With 64 entries
/// sqlglot transpiling its test fixture missed at 20% of its events (each miss ~18 ns, ~4 ns an event in
/// all), with 512 at 3.4%, and its recording cost ~5 ns an event less.
pub(crate) const CODE_CACHE: usize = 512;
/// An entry of a thread's code cache: what the hot path needs of a recorded code object's state, copied,
/// so that an event of a code object whose entry is cached reads no `CodeState` (a program running
/// hundreds of functions finds theirs out of the CPU's caches).
#[derive(Clone, Copy)]
pub(crate) struct Cached {
    pub(crate) code: usize,
    pub(crate) cs: *mut CodeState,
    /// `CodeState::id`.
    pub(crate) id: u32,
    /// `CodeState::boundary`.
    pub(crate) boundary: u8,
}

impl Cached {
    pub(crate) const EMPTY: Cached = Cached { code: 0, cs: std::ptr::null_mut(), id: 0, boundary: 0 };

    /// # Safety
    /// `cs` is a live code state.
    pub(crate) unsafe fn of(code: usize, cs: *mut CodeState) -> Cached {
        // SAFETY: the caller's contract.
        unsafe { Cached { code, cs, id: (*cs).id, boundary: (*cs).boundary } }
    }
}

/// The second level, read when the first misses, before the recorder's map (48 KiB): a program whose hot
/// part runs hundreds of functions still misses the first level now and then (sqlglot transpiling its test
/// fixture, at 3.4% of its events), and the map behind it costs several times a slot's compare. Allocated once a
/// thread has missed the first level `CODE_CACHE2_AFTER` times, and kept when the thread ends only by the
/// first `WARM_STATES` free states: thread states are never freed, and a program that once ran thousands of
/// threads at a time keeps no 48 KiB of each.
pub(crate) const CODE_CACHE2: usize = 2048;
pub(crate) const CODE_CACHE2_AFTER: u32 = 256;
/// Free thread states that keep their second-level cache for the next thread to take them.
const WARM_STATES: usize = 8;
/// Entries of a thread's cache of C callables: a program calls a few dozen distinct ones in its hot parts.
pub(crate) const C_CACHE: usize = 128;

struct ThreadState {
    buf: ThreadBuffer,
    generation: u64,
    cache: [Cached; CODE_CACHE],
    /// The second level (`CODE_CACHE2` entries, or none yet), cleared where `cache` is.
    cache2: Box<[Cached]>,
    /// First-level misses while the second level is not allocated.
    misses: u32,
    named: bool,
    /// The recorder's sink and threshold, cached here so the hot path reads one struct. Valid while
    /// `generation` matches (the recorder is boxed and lives until stop bumps the generation).
    sink: *const dyn Sink,
    threshold: u32,
    /// `PyThreadState_GetID` of the thread's interpreter state, to find its stack when a window opens.
    py_id: i64,
    /// Attached inside a window: its stack follows the window's marker before its first event.
    needs_stack: bool,
    /// The thread's `PyThreadState`, where coroutine events read the running frame (FORMAT.md 5.5).
    pyts: usize,
    /// The next state in [`ENDED`], once the thread has exited.
    ended_next: *mut ThreadState,
    /// The recording (`State::generation`) whose entries `cache`, `ccache` and `pcache` hold: kept when a
    /// new thread of the same recording takes the state ([`attach`]).
    cache_generation: u64,
    /// Last: the fields above are read by every event, this by `CALL` only.
    /// Direct-mapped cache of C callable key -> id (`callbacks::c_key`), for `CALL` events (FORMAT.md 5.4).
    /// Only holds ids of the current recording: cleared where `cache` is.
    ccache: [(usize, usize, u32); C_CACHE],
    /// Direct-mapped cache of C callable object -> id, for callables the recording keeps alive (module
    /// functions, method descriptors, types: `cfunc::stable`), so that the address names one object: a
    /// call of one of those skips `c_key`. Cleared where `cache` is.
    pcache: [(usize, u32); C_CACHE],
}

impl ThreadState {
    /// A new state, on the heap. Apart from the rest of `attach`: the caches (~17 KiB) are built in this
    /// function's frame, and every new thread touched (and its exit gave back) each page of the stack
    /// frame of the function that built them, ~10 us a thread, though a new state is seldom needed.
    #[cold]
    #[inline(never)]
    fn new_boxed(tid: u64) -> *mut ThreadState {
        Box::into_raw(Box::new(ThreadState {
            buf: ThreadBuffer::new(tid),
            generation: 0,
            cache: [Cached::EMPTY; CODE_CACHE],
            cache2: Box::new([]),
            misses: 0,
            ccache: [(0, 0, 0); C_CACHE],
            pcache: [(0, 0); C_CACHE],
            named: false,
            sink: std::ptr::null::<Discard>() as *const dyn Sink,
            threshold: 0,
            py_id: 0,
            needs_stack: false,
            pyts: 0,
            ended_next: std::ptr::null_mut(),
            cache_generation: 0,
        }))
    }

    /// Empties the caches in place (an array assigned anew would be built on the stack first).
    fn clear_caches(&mut self) {
        self.cache.fill(Cached::EMPTY);
        self.cache2.fill(Cached::EMPTY);
        self.ccache.fill((0, 0, 0));
        self.pcache.fill((0, 0));
    }
}

#[pyfunction]
fn ticks() -> u64 {
    clock::ticks()
}

/// Measures ticks per second over `window_ms` milliseconds.
#[pyfunction]
fn ticks_per_second(py: Python<'_>, window_ms: u64) -> f64 {
    py.detach(|| clock::ticks_per_second(std::time::Duration::from_millis(window_ms)))
}

/// `(ticks, monotonic_ns, unix_ns)` read together.
#[pyfunction]
fn clock_point() -> (u64, u64, i64) {
    let p = ClockPoint::now();
    (p.ticks, p.monotonic_ns, p.unix_ns)
}

fn mode_from(name: &str) -> PyResult<Mode> {
    match name {
        "calls" => Ok(Mode::Calls),
        "adaptive" => Ok(Mode::Adaptive),
        "precise" => Ok(Mode::Precise),
        other => Err(PyValueError::new_err(format!("unknown mode {other:?}: use 'calls', 'adaptive' or 'precise'"))),
    }
}

fn get<'py, T: for<'a> FromPyObject<'a, 'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T>
where
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    let v = d.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("header field {key:?} is missing")))?;
    v.extract::<T>().map_err(Into::into)
}

fn header_from(d: &Bound<'_, PyDict>, options: Options, cost: f64) -> PyResult<Header> {
    let start: (u64, u64, i64) = get(d, "start")?;
    Ok(Header {
        recorder: get(d, "recorder")?,
        python_version: get(d, "python_version")?,
        python_hexversion: get(d, "python_hexversion")?,
        implementation: get(d, "implementation")?,
        platform: get(d, "platform")?,
        pid: get(d, "pid")?,
        start_unix_ns: start.2,
        start_monotonic_ns: start.1,
        start_ticks: start.0,
        clock: clock::CLOCK,
        ticks_per_second: get(d, "ticks_per_second")?,
        options,
        event_cost_ticks: cost,
        opcodes: OpcodeTable {
            names: get(d, "opnames")?,
            base: get(d, "opbase")?,
            cache_entries: get(d, "opcache")?,
            have_argument: get(d, "have_argument")?,
            extended_arg: get(d, "extended_arg")?,
        },
    })
}

/// What `start` is given besides the file and its header: one typed object at the boundary, read from a
/// dict whose keys are these fields' names (`_StartOptions` in `_ocular.pyi`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct StartOptions<'py> {
    mode: String,
    threshold: u32,
    include_only: Vec<String>,
    exclude: Vec<String>,
    buffer_events: usize,
    max_buffers: usize,
    event_cost_ticks: f64,
    /// The function that names a thread from its bootstrap frame, and that frame's code (`None` if
    /// `threading` is not imported yet).
    thread_name: Py<PyAny>,
    boot_code: Option<Bound<'py, PyAny>>,
    main_native_id: u64,
    main_name: String,
    /// Paths of Ocular's own Python code: never recorded.
    internal: Vec<String>,
    #[pyo3(default)]
    calibration: Vec<(u8, f64)>,
    #[pyo3(default = "drop".to_string())]
    on_full: String,
    #[pyo3(default = true)]
    ring: bool,
    #[pyo3(default)]
    flight: u64,
    #[pyo3(default)]
    live: bool,
    #[pyo3(default)]
    counters: Vec<String>,
    #[pyo3(default = true)]
    sampled: bool,
}

/// The keys `StartOptions` reads: any other is a caller's mistake, said rather than ignored.
const START_OPTIONS: [&str; 19] = [
    "mode",
    "threshold",
    "include_only",
    "exclude",
    "buffer_events",
    "max_buffers",
    "event_cost_ticks",
    "thread_name",
    "boot_code",
    "main_native_id",
    "main_name",
    "internal",
    "calibration",
    "on_full",
    "ring",
    "flight",
    "live",
    "counters",
    "sampled",
];

/// Starts recording into `path`, or, with `path=None`, into nothing (calibration). Callbacks must be
/// registered and events enabled by the caller afterwards. Returns why there is no ring file, if one was
/// asked for and could not be made (the recording goes on without: RING.md).
#[pyfunction]
fn start(
    py: Python<'_>,
    path: Option<std::path::PathBuf>,
    header: &Bound<'_, PyDict>,
    options: &Bound<'_, PyDict>,
) -> PyResult<Option<String>> {
    register_fork_handlers();
    FORKED_CHILD.store(false, Ordering::Relaxed);
    for k in options.keys() {
        let k: String = k.extract()?;
        if !START_OPTIONS.contains(&k.as_str()) {
            return Err(PyValueError::new_err(format!("start: unknown option {k:?}")));
        }
    }
    let StartOptions {
        mode,
        threshold,
        include_only,
        exclude,
        buffer_events,
        max_buffers,
        event_cost_ticks,
        thread_name,
        boot_code,
        main_native_id,
        main_name,
        internal,
        calibration,
        on_full,
        ring,
        flight,
        live,
        counters,
        sampled,
    } = options.extract()?;
    let (mode, on_full) = (mode.as_str(), on_full.as_str());
    // SAFETY: GIL held (we have `py`); no Python call while the reference is alive.
    if unsafe { state() }.recorder.is_some() {
        return Err(PyRuntimeError::new_err("Ocular is already recording in this process: stop it first"));
    }
    if buffer_events == 0 || max_buffers == 0 {
        return Err(PyValueError::new_err("buffer_events and max_buffers must be at least 1"));
    }
    let on_full = match on_full {
        "drop" => OnFull::Drop,
        "wait" => OnFull::Wait,
        other => return Err(PyValueError::new_err(format!("on_full must be 'drop' or 'wait', not {other:?}"))),
    };
    let specs = counters
        .iter()
        .map(|c| ocular_record::counters::spec(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(PyValueError::new_err)?;
    let options_mode = mode_from(mode)?;
    let options = Options {
        mode: options_mode,
        deinstrument_threshold: threshold,
        include_only: include_only.clone(),
        exclude: exclude.clone(),
        buffer_events: buffer_events as u32,
        max_buffers: max_buffers as u32,
    };
    let mut ring_error = None;
    let out = match path {
        Some(p) => {
            let h = header_from(header, options, event_cost_ticks)?;
            let cfg = Config { buffer_events, max_buffers, on_full, ring, flight, live, overflow: true };
            let process = match header.get_item("process")? {
                Some(p) => {
                    let p = p.cast_into::<PyDict>()?;
                    Some(ocular_format::ProcessInfo {
                        run_id: get(&p, "run_id")?,
                        parent_pid: get(&p, "parent_pid")?,
                        started: get(&p, "started")?,
                        executable: get(&p, "executable")?,
                        argv: get(&p, "argv")?,
                    })
                }
                None => None,
            };
            let session = py.detach(|| Session::start_in_run(&p, &h, cfg, process.as_ref())).map_err(|e| match &e {
                // A ring smaller than one chunk: the caller's value, not the file system.
                ocular_format::Error::Io { error, .. } if error.kind() == std::io::ErrorKind::InvalidInput => {
                    PyValueError::new_err(error.to_string())
                }
                _ => PyOSError::new_err(e.to_string()),
            })?;
            if !calibration.is_empty() {
                session.calibration(ocular_format::Calibration { costs: calibration });
            }
            ring_error = session.ring_error().map(str::to_string);
            Output::File(session)
        }
        None => Output::Discard(Discard::new(buffer_events)),
    };
    // Counters: opened for this thread now (which says which can be had), for others when first seen.
    let counters = match (&out, specs.is_empty()) {
        (Output::File(session), false) => {
            // SAFETY: PyThread_get_thread_native_id has no preconditions.
            let tid = unsafe { PyThread_get_thread_native_id() } as u64;
            Some(CounterState::start(ocular_record::counters::Counters::new(specs, tid), session.counter_sink()))
        }
        _ => None,
    };
    let monitoring = py.import("sys")?.getattr("monitoring")?;
    let disable = monitoring.getattr("DISABLE")?.into_ptr();
    let restart = monitoring.getattr("restart_events")?.unbind();
    let ticks_per_second: f64 = get(header, "ticks_per_second").unwrap_or(1e9);
    let rec = Recorder {
        out,
        codes: FxHashMap::default(),
        keep: Vec::new(),
        recorded: Vec::new(),
        // Ocular's own Python code is never recorded; the header keeps the user's filters as given.
        filter: Filter { include_only, exclude: exclude.into_iter().chain(internal.iter().cloned()).collect() },
        threshold,
        counts_hits: threshold > 0 && options_mode != Mode::Calls,
        thread_name,
        boot_code: boot_code.map_or(0, |c| c.as_ptr() as usize),
        main_native_id,
        main_name,
        disable,
        errors: Vec::new(),
        restart,
        ticks_per_second,
        // Unsampled, a threshold thins out locations only: every function boundary is recorded.
        windowed: sampled && threshold > 0 && options_mode != Mode::Calls,
        windows: None,
        window_len: (0, 0),
        base: base_stack(py, &internal),
        counters,
        cfuncs: FxHashMap::default(),
        kept: Default::default(),
    };
    // SAFETY: GIL held; no Python call while the reference is alive.
    let st = unsafe { state() };
    st.generation += 1;
    st.retired_threads = 0;
    st.retired_pushed = 0;
    due::reset();
    st.recorder = Some(Box::new(rec));
    // The first window opens with the recording.
    st.window = Window { seq: 0, opened: clock::ticks(), len_us: u32::MAX };
    WINDOW_END.store(u64::MAX, Ordering::Relaxed);
    FIRST_CALLS.store(0, Ordering::Relaxed);
    FIRST_LIMIT.store(u64::from(threshold) * FIRST_WINDOW_CALLS_PER_HIT, Ordering::Relaxed);
    Ok(ring_error)
}

/// The calling thread's frames up to the innermost that is not Ocular's own (see `Recorder::base`).
fn base_stack(py: Python<'_>, internal: &[String]) -> (i64, Vec<Py<PyAny>>) {
    // SAFETY: GIL held (we have `py`), so the calling thread has a live thread state.
    let (me, frames) = unsafe {
        let me = ffi::PyThreadState_Get();
        (ffi::PyThreadState_GetID(me), windows::frames_of(py, me))
    };
    let own = |c: &Py<PyAny>| {
        c.bind(py)
            .getattr(intern!(py, "co_filename"))
            .and_then(|n| n.extract::<String>())
            .is_ok_and(|n| internal.iter().any(|p| n.contains(p.as_str())))
    };
    // Outermost first: Ocular's innermost frames (start, __enter__, ...) are not part of the base.
    let mut codes: Vec<Py<PyAny>> = frames.into_iter().map(|(code, _)| code).collect();
    while codes.last().is_some_and(own) {
        codes.pop();
    }
    (me, codes)
}

/// Specialized-bytecode snapshots sent to the writer in one message at the stop.
const SNAPSHOT_BATCH: usize = 512;

/// Stops recording: flushes every thread, snapshots specialized bytecode, writes the trailer. `names`
/// maps native thread ids to names for threads that were not named while recording. Returns what was
/// written. Events must already be disabled by the caller. `speed`: the stop's calibration, the machine's
/// speed now (FORMAT.md 6.6), written after every event.
#[pyfunction]
#[pyo3(signature = (names, speed=Vec::new()))]
fn stop<'py>(py: Python<'py>, names: &Bound<'py, PyDict>, speed: Vec<(u8, f64)>) -> PyResult<Bound<'py, PyDict>> {
    // SAFETY: GIL held. The recorder is moved out first, so callbacks from now on see no recording.
    let st = unsafe { state() };
    let Some(mut rec) = st.recorder.take() else {
        return Err(PyRuntimeError::new_err("Ocular is not recording"));
    };
    let generation = st.generation;
    st.generation += 1;
    callbacks::forget_last_thread();
    if let Some(w) = rec.windows.take() {
        // It may be waiting for the GIL: let it have it, see the recording gone, and end.
        py.detach(|| w.stop());
    }
    due::reset();
    if let Some(c) = rec.counters.take() {
        for f in py.detach(|| c.finish()) {
            rec.errors.push(format!("counter {f}"));
        }
    }
    // SAFETY: GIL held again; no Python call while the reference is alive.
    let st = unsafe { state() };
    let sink = rec.out.sink();
    if let Output::File(s) = &rec.out {
        s.pool().close();
    }
    // Threads that exited meanwhile (retired: counted there; not yet: their states still hold this
    // recording's generation, and are flushed and counted below).
    let mut pushed = std::mem::take(&mut st.retired_pushed);
    let mut threads = std::mem::take(&mut st.retired_threads);
    for &ts in &st.threads {
        // SAFETY: thread states are never freed; with the GIL held their owners are not running.
        let ts = unsafe { &mut *ts };
        if ts.generation != generation {
            continue;
        }
        threads += 1;
        ts.buf.flush(sink);
        // The callbacks' fast path trusts the cache: nothing of this recording may stay in it.
        ts.clear_caches();
        pushed += ts.buf.pushed;
        if !ts.named {
            if let Output::File(s) = &rec.out {
                let name = names
                    .get_item(ts.buf.thread_id)
                    .ok()
                    .flatten()
                    .and_then(|n| n.extract::<String>().ok())
                    .unwrap_or_else(|| format!("Thread-{}", ts.buf.thread_id));
                s.thread(ThreadInfo {
                    thread_id: ts.buf.thread_id,
                    name,
                    is_main: ts.buf.thread_id == rec.main_native_id,
                });
            }
        }
    }
    let result = PyDict::new(py);
    result.set_item("threads", threads)?;
    result.set_item("code_objects", rec.recorded.len())?;
    result.set_item("errors", rec.errors.clone())?;
    let mut rec = *rec;
    match rec.out {
        Output::File(session) => {
            // The writer takes each batch while the next is read: the stop waits for the last one only.
            let mut snaps = Vec::with_capacity(SNAPSHOT_BATCH.min(rec.recorded.len()));
            for (i, code) in rec.recorded.iter().enumerate() {
                let adaptive = code.bind(py).getattr(intern!(py, "_co_code_adaptive"));
                if let Ok(b) = adaptive.as_ref().map_err(|_| ()).and_then(|b| b.cast::<PyBytes>().map_err(|_| ())) {
                    snaps.push(CodeSnapshot { id: i as u32 + 1, bytecode: b.as_bytes().to_vec() });
                }
                if snaps.len() == SNAPSHOT_BATCH {
                    session.snapshots(std::mem::replace(&mut snaps, Vec::with_capacity(SNAPSHOT_BATCH)));
                }
            }
            session.snapshots(snaps);
            if !speed.is_empty() {
                // After every thread's last buffer (flushed above, in the writer's queue before it).
                session.calibration(ocular_format::Calibration { costs: speed });
            }
            let end = ClockPoint::now();
            // Released while the writer compresses the snapshots rather than after: code objects only this
            // recording kept alive (modules' and classes' bodies) are freed here, ~1.7 ms in sqlglot's run.
            drop(std::mem::take(&mut rec.keep));
            drop(std::mem::take(&mut rec.recorded));
            let out = py.detach(|| session.finish(end));
            result.set_item("events", out.events)?;
            result.set_item("lost", out.lost)?;
            result.set_item("bytes", out.bytes)?;
            result.set_item("error", out.error)?;
            result.set_item("dropped", out.dropped)?;
            result.set_item("dump_errors", out.dump_errors)?;
            result.set_item("notes", out.notes)?;
        }
        Output::Discard(_) => {
            result.set_item("events", pushed)?;
            result.set_item("lost", 0)?;
            result.set_item("bytes", 0)?;
            result.set_item("error", py.None())?;
        }
    }
    // SAFETY: `disable` holds the strong reference taken at start.
    unsafe { ffi::Py_DECREF(rec.disable) };
    drop(rec.keep);
    Ok(result)
}

/// A flight recorder's dump into `path` (see `Session::dump`). The file is created here, so a path that
/// cannot be written is an `OSError` at once; the writer thread writes it while the program goes on. With
/// `wait`, returns what it wrote once it is written (the GIL released meanwhile), else `None`.
#[pyfunction]
#[pyo3(signature = (path, wait=false))]
fn dump<'py>(py: Python<'py>, path: std::path::PathBuf, wait: bool) -> PyResult<Option<Bound<'py, PyDict>>> {
    // SAFETY: GIL held; no Python call while the reference is alive.
    let st = unsafe { state() };
    let Some(Output::File(session)) = st.recorder.as_ref().map(|r| &r.out) else {
        return Err(PyRuntimeError::new_err("Ocular is not recording"));
    };
    let rx = session.dump(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::Unsupported => PyRuntimeError::new_err(e.to_string()),
        _ => PyOSError::new_err(format!("cannot write the dump {}: {e}", path.display())),
    })?;
    if !wait {
        return Ok(None);
    }
    let out =
        py.detach(move || rx.recv()).map_err(|_| PyRuntimeError::new_err("the recording's writer thread stopped"))?;
    if let Some(e) = out.error {
        return Err(PyOSError::new_err(format!("cannot write the dump {}: {e}", path.display())));
    }
    let d = PyDict::new(py);
    d.set_item("path", out.path)?;
    d.set_item("events", out.events)?;
    d.set_item("dropped", out.dropped)?;
    d.set_item("bytes", out.bytes)?;
    d.set_item("writer_ms", out.writer_ms)?;
    Ok(Some(d))
}

/// `(counter, why)` of each counter the running recording asked for and could not open.
#[pyfunction]
fn counter_errors() -> Vec<(String, String)> {
    // SAFETY: GIL held (a pyfunction); no Python call while the reference is alive.
    let st = unsafe { state() };
    st.recorder.as_ref().and_then(|r| r.counters.as_ref()).map(|c| c.c.errors()).unwrap_or_default()
}

/// The running recording's ring file, if it has one (a cursor follows it: RING.md 6).
#[pyfunction]
fn ring_path() -> Option<String> {
    // SAFETY: GIL held (a pyfunction); no Python call while the reference is alive.
    let st = unsafe { state() };
    match st.recorder.as_ref().map(|r| &r.out) {
        Some(Output::File(s)) => s.ring_path().map(|p| p.display().to_string()),
        _ => None,
    }
}

/// The user's runtime directory (RING.md 2: rings, and what a process's start can reuse from an earlier one's),
/// if there is one.
#[pyfunction]
fn runtime_dir() -> Option<String> {
    ocular_format::ring::runtime_dir().map(|p| p.display().to_string())
}

/// A script's source compiled as `compile(source, filename, "exec", dont_inherit=True)` compiles it, without
/// the builtin's first-call cost: `compile()` checks whether its source is an AST, and that check builds
/// the `_ast` module's hundred-odd classes (~4 ms, which `python script.py` never pays). Source holding a
/// NUL byte goes through the builtin, for its error.
#[pyfunction]
fn compile_script<'py>(py: Python<'py>, source: &[u8], filename: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    let Ok(text) = std::ffi::CString::new(source) else {
        let compile = py.import(intern!(py, "builtins"))?.getattr(intern!(py, "compile"))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("dont_inherit", true)?;
        return compile.call((PyBytes::new(py, source), filename, "exec"), Some(&kwargs));
    };
    // As the builtin sets them: PyCF_SOURCE_IS_UTF8 (0x0100; bytes still follow their coding cookie) and
    // no others (dont_inherit), the running Python's grammar, the interpreter's -O level (-1).
    const PYCF_SOURCE_IS_UTF8: std::os::raw::c_int = 0x0100;
    let mut flags = ffi::PyCompilerFlags {
        cf_flags: PYCF_SOURCE_IS_UTF8,
        cf_feature_version: std::os::raw::c_int::from(py.version_info().minor),
    };
    // SAFETY: GIL held; `text` and `filename` outlive the call, which returns a new reference or NULL with
    // the error set.
    unsafe {
        let code = ffi::Py_CompileStringObject(text.as_ptr(), filename.as_ptr(), ffi::Py_file_input, &mut flags, -1);
        Bound::from_owned_ptr_or_err(py, code)
    }
}

/// Before a fork: waits for the threads giving stopped recordings' rings back, so that none is running
/// when the process forks (see `ocular_format::ring::finish_unmapping`).
#[pyfunction]
fn finish_unmapping(py: Python<'_>) {
    py.detach(ocular_format::ring::finish_unmapping);
}

/// In a forked child: forget the parent's recording without writing to its file.
#[pyfunction]
fn abandon_after_fork() {
    // SAFETY: called from os.register_at_fork(after_in_child=...), with the GIL held.
    let st = unsafe { state() };
    let generation = st.generation;
    st.generation += 1;
    callbacks::forget_last_thread();
    for &ts in &st.threads {
        // SAFETY: thread states are never freed; only this thread exists in the child.
        let ts = unsafe { &mut *ts };
        if ts.generation == generation {
            ts.buf.abandon();
            ts.clear_caches();
        }
    }
    if let Some(rec) = st.recorder.take() {
        let mut rec = *rec;
        // The opener thread does not exist in the child.
        if let Some(w) = rec.windows.take() {
            w.forget();
        }
        if let Output::File(s) = rec.out {
            s.forget();
        }
        // The child may keep running Python: the code references are released normally.
        drop(rec.keep);
    }
    // Nothing of the parent's is left to write into: the child records again once it starts its own.
    FORKED_CHILD.store(false, Ordering::Relaxed);
}

/// Whether a recording is in progress.
#[pyfunction]
fn is_recording() -> bool {
    // SAFETY: GIL held (called from Python).
    unsafe { state() }.recorder.is_some()
}

/// Looks up (or registers) the state of a code object. May call Python, so it returns a raw pointer and
/// the caller must check the generation again before using the state.
///
/// # Safety
/// GIL held; `code` is a live code object.
#[cold]
#[inline(never)]
unsafe fn lookup(code: *mut ffi::PyObject) -> *mut CodeState {
    // SAFETY: GIL held by the caller; the reference ends before the Python call below.
    let generation = unsafe { state() }.generation;
    {
        // SAFETY: as above.
        let Some(rec) = unsafe { state() }.recorder.as_deref_mut() else { return std::ptr::null_mut() };
        if let Some(cs) = rec.codes.get_mut(&(code as usize)) {
            return &mut **cs;
        }
    }
    // SAFETY: the interpreter holds the GIL while calling a monitoring callback.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: `code` is the borrowed code object the interpreter passed as args[0].
    let obj = unsafe { Bound::from_borrowed_ptr(py, code) };
    let described = describe_code(&obj);
    // The call may have let other threads run, or stopped the recording.
    // SAFETY: GIL held again; no Python call below while `st` is alive.
    let st = unsafe { state() };
    if st.generation != generation {
        return std::ptr::null_mut();
    }
    let Some(rec) = st.recorder.as_deref_mut() else { return std::ptr::null_mut() };
    if let Some(cs) = rec.codes.get_mut(&(code as usize)) {
        return &mut **cs; // another thread registered it meanwhile
    }
    let boot = match &described {
        _ if rec.boot_code != 0 => code as usize == rec.boot_code,
        Ok(c) => is_thread_bootstrap(c),
        Err(_) => false,
    };
    let boot = if boot { BOOT } else { 0 };
    let cs = match described {
        Ok(mut c) => {
            let record = rec.filter.records(&c.filename, &c.qualname);
            let mut flags = boot;
            let mut id = 0;
            let units = c.bytecode.len() / 2;
            let boundary = boundary_flags(&c);
            if record {
                flags |= RECORD;
                id = rec.recorded.len() as u32 + 1;
                c.id = id;
                rec.recorded.push(obj.clone().unbind());
                if let Output::File(s) = &rec.out {
                    s.code(c);
                }
            }
            let hits = if rec.counts_hits { vec![0; units].into_boxed_slice() } else { Box::new([]) as Box<[u32]> };
            CodeState { id, flags, boundary, hits, heads: Box::new([]), counted: 0 }
        }
        Err(e) => {
            // Never let an exception escape into the user's program: note it, skip this code object.
            if rec.errors.len() < 10 {
                rec.errors.push(format!("cannot describe a code object: {e}"));
            }
            CodeState { id: 0, flags: boot, boundary: 0, hits: Box::new([]), heads: Box::new([]), counted: 0 }
        }
    };
    rec.keep.push(obj.unbind());
    let mut b = Box::new(cs);
    let p: *mut CodeState = &mut *b;
    rec.codes.insert(code as usize, b);
    p
}

/// Whether `c` is `threading.Thread._bootstrap`, where a thread started by `threading` begins (for a
/// recording that started before the program imported `threading`).
fn is_thread_bootstrap(c: &CodeObject) -> bool {
    c.qualname == "Thread._bootstrap"
        && std::path::Path::new(&c.filename).file_name().is_some_and(|n| n == "threading.py")
}

/// FORMAT.md 5.5: coroutine code (`async def`, `@types.coroutine` generators, async generators) has its
/// frame recorded and its boundaries recorded always; so have the three functions of asyncio's event loop
/// that say when a callback was scheduled and when it ran, from which the async view tells "awaiting" from
/// "ready, waiting for the loop". Plain generators are not included: a generator made per call of a hot
/// function (`sum(x for x in ...)`) would pay for a frame object.
fn boundary_flags(c: &CodeObject) -> u8 {
    use ocular_format::event::flags::{ALWAYS, FRAME};
    const CO_COROUTINE: u32 = 0x80;
    const CO_ITERABLE_COROUTINE: u32 = 0x100;
    const CO_ASYNC_GENERATOR: u32 = 0x200;
    if c.flags & (CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR) != 0 {
        return FRAME | ALWAYS;
    }
    if ocular_format::event::asyncio_loop_function(&c.filename, &c.qualname).is_some() {
        return ALWAYS;
    }
    0
}

/// A code object as FORMAT.md 6.1 stores it (id set by the caller): its attributes read directly, the
/// location table copied as it is (decoding it is the reader's work, not the recording's).
fn describe_code(code: &Bound<'_, PyAny>) -> PyResult<CodeObject> {
    let py = code.py();
    let bytes = |name: &Bound<'_, pyo3::types::PyString>| -> PyResult<Vec<u8>> {
        Ok(code.getattr(name)?.cast::<PyBytes>()?.as_bytes().to_vec())
    };
    Ok(CodeObject {
        id: 0,
        name: code.getattr(intern!(py, "co_name"))?.extract()?,
        qualname: code.getattr(intern!(py, "co_qualname"))?.extract()?,
        filename: code.getattr(intern!(py, "co_filename"))?.extract()?,
        first_line: code.getattr(intern!(py, "co_firstlineno"))?.extract()?,
        flags: code.getattr(intern!(py, "co_flags"))?.extract()?,
        bytecode: bytes(intern!(py, "co_code"))?,
        linetable: bytes(intern!(py, "co_linetable"))?,
        positions: Vec::new(),
    })
}

/// The calling thread's state for the current recording, attaching it if needed; null when not
/// recording.
///
/// # Safety
/// GIL held.
#[cold]
#[inline(never)]
unsafe fn attach(ts: *mut ThreadState) -> *mut ThreadState {
    // SAFETY: GIL held by the caller; no Python call while `st` is alive.
    let st = unsafe { state() };
    if st.recorder.is_none() {
        return std::ptr::null_mut();
    }
    // SAFETY: GIL held.
    unsafe { retire_ended(st) };
    let Some(rec) = st.recorder.as_deref() else { return std::ptr::null_mut() };
    // SAFETY: PyThread_get_thread_native_id has no preconditions.
    let tid = unsafe { PyThread_get_thread_native_id() } as u64;
    let ts = if ts.is_null() {
        let new = st.free.pop().unwrap_or_else(|| {
            let new = ThreadState::new_boxed(tid);
            st.threads.push(new);
            new
        });
        callbacks::set_thread_state(new);
        new
    } else {
        ts
    };
    // SAFETY: `ts` is a live, never-freed thread state of this thread.
    let t = unsafe { &mut *ts };
    // Getting a buffer for 10 us or more is a recorder pause, written down (FORMAT.md 5.6).
    t.buf = ThreadBuffer::new(tid).with_pause_threshold((rec.ticks_per_second * 10e-6) as u64);
    t.generation = st.generation;
    // A state an exited thread of this recording left keeps its caches, both levels: the code objects and
    // C callables their entries name stay alive while the recording runs, so the entries still hold.
    // Emptied, a thread per request's every thread missed each function it ran at its first call (the map
    // lookups were 2.3% of a recorded HTTP server's samples, beside 0.8% for its events' callbacks).
    if t.cache_generation != st.generation {
        t.clear_caches();
        t.cache_generation = st.generation;
    }
    t.named = false;
    t.sink = rec.out.sink() as *const dyn Sink;
    t.threshold = rec.threshold;
    // SAFETY: GIL held: the calling thread has a thread state, fixed while it runs Python code here.
    t.pyts = unsafe { ffi::PyThreadState_Get() } as usize;
    if rec.windowed {
        due::register(t.pyts);
    }
    if let Some(c) = &rec.counters {
        c.c.open_thread(tid);
    }
    // SAFETY: GIL held, so the calling thread has a thread state.
    t.py_id = unsafe { ffi::PyThreadState_GetID(ffi::PyThreadState_Get()) };
    if rec.windowed {
        // Every thread learns where it starts (FORMAT.md 5.3): inside a window (its stack is empty), or
        // between windows.
        let w = st.window;
        let now = clock::ticks();
        let m = if now < WINDOW_END.load(Ordering::Relaxed) {
            t.needs_stack = true;
            windows::marker(w.opened, EventKind::WINDOW, w.seq, w.len_us)
        } else {
            windows::marker(now, EventKind::WINDOW_END, w.seq, 0)
        };
        t.buf.push_marker(m, rec.out.sink());
    }
    if tid == rec.main_native_id {
        t.named = true;
        if let Output::File(s) = &rec.out {
            s.thread(ThreadInfo { thread_id: tid, name: rec.main_name.clone(), is_main: true });
        }
    }
    ts
}

/// Names the calling thread from the `threading.Thread._bootstrap` frame that is starting.
///
/// # Safety
/// GIL held; `ts` is the calling thread's state.
#[cold]
#[inline(never)]
unsafe fn name_thread(ts: *mut ThreadState) {
    // SAFETY: GIL held; the reference ends before the Python call.
    let generation = unsafe { state() }.generation;
    // SAFETY: as above.
    let Some(rec) = (unsafe { state() }).recorder.as_deref() else { return };
    // SAFETY: the interpreter holds the GIL while calling a monitoring callback.
    let py = unsafe { Python::assume_attached() };
    let f = rec.thread_name.clone_ref(py);
    let name = windows::in_own_python(|| {
        // SAFETY: GIL held, in the callback of the frame read.
        match unsafe { boot_name(py) } {
            Some(name) => Ok(name),
            None => f.call0(py).and_then(|n| n.extract::<String>(py)),
        }
    });
    // SAFETY: GIL held; no Python call while `st` is alive.
    let st = unsafe { state() };
    if st.generation != generation {
        return;
    }
    let Some(rec) = st.recorder.as_deref_mut() else { return };
    // SAFETY: the calling thread's state, never freed.
    let t = unsafe { &mut *ts };
    match name {
        Ok(name) => {
            t.named = true;
            if let Output::File(s) = &rec.out {
                s.thread(ThreadInfo { thread_id: t.buf.thread_id, name, is_main: false });
            }
        }
        Err(e) => {
            if rec.errors.len() < 10 {
                rec.errors.push(format!("cannot name a thread: {e}"));
            }
        }
    }
}

/// The starting thread's name, `self._name` of the `Thread._bootstrap` frame whose PY_START callback is
/// running (the frame on top), read without running Python; `None` if any of it is not there (then the
/// recording's `thread_name` function, which reads `self.name`, is asked). A new thread's naming was a
/// twentieth of a thread-per-request program's time, most of it that function's frame and `f_locals`.
///
/// # Safety
/// GIL held, in a monitoring callback.
unsafe fn boot_name(py: Python<'_>) -> Option<String> {
    // SAFETY: GIL held; the frame is borrowed, `self` and the name are new references owned below.
    unsafe {
        let frame = ffi::PyEval_GetFrame();
        if frame.is_null() {
            return None;
        }
        let this = ffi::PyFrame_GetVarString(frame, c"self".as_ptr().cast_mut());
        if this.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let this = Bound::from_owned_ptr(py, this);
        let name = this.getattr(pyo3::intern!(py, "_name")).ok()?;
        name.extract::<String>().ok()
    }
}

/// Submits the calling thread's buffer: the thread is ending (its `Thread._bootstrap` returns), and a
/// dead thread must not pin a buffer until the recording stops.
///
/// # Safety
/// GIL held; `ts` is the calling thread's state.
unsafe fn thread_ending(ts: *mut ThreadState) {
    // SAFETY: GIL held, no Python call below.
    let Some(rec) = (unsafe { state() }).recorder.as_deref() else { return };
    // SAFETY: the calling thread's state, never freed.
    give_back(unsafe { &mut *ts }, rec);
}

/// What a thread that runs no more Python code holds for nothing: its buffer is submitted and its stack no
/// longer read at due moments (the state stays, its caches decided at [`retire_ended`]).
fn give_back(t: &mut ThreadState, rec: &Recorder) {
    t.buf.flush_last(rec.out.sink());
    due::unregister(t.pyts);
}

/// States of threads that exited, not yet retired: pushed by the thread's own thread-local destructor,
/// which runs without the GIL once nothing of the thread runs Python any more, and taken, with the GIL, by
/// [`retire_ended`]. A stack linked through `ThreadState::ended_next`, lock-free, so that a fork never
/// finds it locked.
static ENDED: AtomicPtr<ThreadState> = AtomicPtr::new(std::ptr::null_mut());

/// The calling thread is exiting, and `ts` is its state: from its thread-local destructor.
pub(crate) fn thread_exited(ts: *mut ThreadState) {
    let mut head = ENDED.load(Ordering::Acquire);
    loop {
        // SAFETY: `ts` is the exiting thread's state, never freed; only this thread and the retirer (after
        // taking it from the stack) write `ended_next`.
        unsafe { (*ts).ended_next = head };
        match ENDED.compare_exchange_weak(head, ts, Ordering::Release, Ordering::Acquire) {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

/// Retires the states of the threads that exited: a thread of this recording has its last buffer
/// submitted (when its `Thread._bootstrap`'s return was not seen, as between windows), its stack no
/// longer read at due moments, its counters closed after their last samples, and is counted at the stop;
/// then its state is free for a new thread. Without this, every thread a program ever started pinned a
/// state, a buffer and, between windows, a window marker per window until the recording stopped.
///
/// # Safety
/// GIL held; no reference into `st`'s thread states alive.
pub(crate) unsafe fn retire_ended(st: &mut State) {
    let mut p = ENDED.swap(std::ptr::null_mut(), Ordering::AcqRel);
    while !p.is_null() {
        // SAFETY: a state on the stack belongs to a thread that exited: nothing else uses it.
        let t = unsafe { &mut *p };
        let next = std::mem::replace(&mut t.ended_next, std::ptr::null_mut());
        if t.generation == st.generation {
            if let Some(rec) = st.recorder.as_deref() {
                // A second time for a thread whose bootstrap's return was seen (`thread_ending`): a no-op.
                give_back(t, rec);
                if let Some(c) = &rec.counters {
                    c.c.close_thread(t.buf.thread_id);
                }
                if !t.named {
                    if let Output::File(s) = &rec.out {
                        let tid = t.buf.thread_id;
                        s.thread(ThreadInfo { thread_id: tid, name: format!("Thread-{tid}"), is_main: false });
                    }
                }
                st.retired_threads += 1;
                st.retired_pushed += t.buf.pushed;
            }
        }
        t.generation = 0;
        // The next thread to take the state runs mostly the same functions (a thread per request runs a
        // request's ~150, which the first level alone missed at half its calls): the first few free states
        // keep their second level, the others give it up.
        if st.free.len() >= WARM_STATES {
            t.cache2 = Box::new([]);
            t.misses = 0;
        }
        st.free.push(p);
        p = next;
    }
}

extern "C" {
    fn PyThread_get_thread_native_id() -> std::os::raw::c_ulong;
}

#[pymodule(gil_used = true)]
fn _ocular(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ticks, m)?)?;
    m.add_function(wrap_pyfunction!(ticks_per_second, m)?)?;
    m.add_function(wrap_pyfunction!(clock_point, m)?)?;
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(dump, m)?)?;
    m.add_function(wrap_pyfunction!(ring_path, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_dir, m)?)?;
    m.add_function(wrap_pyfunction!(compile_script, m)?)?;
    m.add_function(wrap_pyfunction!(counter_errors, m)?)?;
    m.add_function(wrap_pyfunction!(abandon_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(finish_unmapping, m)?)?;
    m.add_function(wrap_pyfunction!(is_recording, m)?)?;
    m.add_function(wrap_pyfunction!(windows::start_windows, m)?)?;
    m.add_function(wrap_pyfunction!(spans::span_begin, m)?)?;
    m.add_function(wrap_pyfunction!(spans::span_end, m)?)?;
    m.add_function(wrap_pyfunction!(spans::span_setup, m)?)?;
    m.add_function(wrap_pyfunction!(spans::span_rules, m)?)?;
    m.add_function(wrap_pyfunction!(spans::span_current, m)?)?;
    m.add_class::<spans::Span>()?;
    m.add_class::<spans::Done>()?;
    m.add_function(wrap_pyfunction!(due::due_stacks_usable, m)?)?;
    m.add_function(wrap_pyfunction!(read::read, m)?)?;
    m.add_function(wrap_pyfunction!(read::file_events, m)?)?;
    m.add_function(wrap_pyfunction!(own_sigterm, m)?)?;
    m.add_function(wrap_pyfunction!(read::complete_trace, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::info, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::hot, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::stats, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::stats_many, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::stats_within, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::export_chrome, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::cli, m)?)?;
    m.add_function(wrap_pyfunction!(cli::parse_run, m)?)?;
    m.add_function(wrap_pyfunction!(cli::record_options, m)?)?;
    m.add_function(wrap_pyfunction!(cli::record_option_specs, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::table, m)?)?;
    m.add_class::<analyze::ArrowTable>()?;
    m.add_class::<analyze::StatsQueue>()?;
    m.add_function(wrap_pyfunction!(live::attach, m)?)?;
    m.add_class::<live::LiveCursor>()?;
    m.add("callbacks", callbacks::callbacks(m.py())?)?;
    m.add("callbacks_gapless", callbacks::callbacks_gapless(m.py())?)?;
    m.add("bench_callbacks", callbacks::bench_callbacks(m.py())?)?;
    m.add("TSC", clock::CLOCK == ocular_format::Clock::Tsc)?;
    callbacks::check_compact_ints(m.py())?;
    m.add("FAST_INTS", callbacks::fast_ints())?;
    callbacks::locate_frame_field(m.py());
    m.add("FRAME_FIELD", callbacks::frame_field())?;
    Ok(())
}

/// Set in a forked child, from the moment `fork()` returns there, until the child drops its parent's
/// recording (`abandon_after_fork`) or starts one of its own: no event of it is recorded meanwhile. The
/// buffers are slots of the ring file, mapped shared: the child's first events (of at-fork hooks that run
/// before Ocular's, such as threading's or multiprocessing's) went into the slot the parent was filling,
/// over the parent's own events (2,012 of 10,000 calls in a test).
pub(crate) static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Registers the fork handlers, once per process.
fn register_fork_handlers() {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    #[cfg(unix)]
    REGISTER.call_once(|| {
        // SAFETY: the three handlers only call async-signal-safe functions (sigemptyset, sigaddset,
        // pthread_sigmask, sigaction) and touch atomics.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

/// Whether the process's SIGTERM handler is Ocular's (`_recorder._sigterm`, installed while recording).
static OWN_SIGTERM: AtomicBool = AtomicBool::new(false);
/// Set by the fork's prepare handler when it blocked SIGTERM in the forking thread.
static SIGTERM_BLOCKED: AtomicBool = AtomicBool::new(false);

/// `own_sigterm(on)`: says whether Ocular's SIGTERM handler is installed. While it is, a fork closes the
/// window in which CPython loses a signal: in a child, a signal that comes after `fork()` returns and
/// before CPython's after-fork code runs is caught by its handler, then cleared by that code
/// (`_PySignal_AfterFork`), so a `multiprocessing.Pool` worker terminated at once lived on and the
/// program hung in `join()` (without Ocular the signal's default action kills it). Around the fork
/// SIGTERM is blocked; the child gets the default action back, as without Ocular, then the signal: one
/// sent in between kills it. (Ocular's handler is installed again when the child's recording starts.)
#[pyfunction]
fn own_sigterm(on: bool) {
    register_fork_handlers();
    OWN_SIGTERM.store(on, Ordering::Relaxed);
}

#[cfg(unix)]
fn sigterm_set() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is a valid argument for sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

#[cfg(unix)]
extern "C" fn fork_prepare() {
    if OWN_SIGTERM.load(Ordering::Relaxed) {
        let set = sigterm_set();
        // SAFETY: blocks SIGTERM in the forking thread only.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        SIGTERM_BLOCKED.store(true, Ordering::Relaxed);
    }
}

#[cfg(unix)]
extern "C" fn fork_parent() {
    if SIGTERM_BLOCKED.swap(false, Ordering::Relaxed) {
        let set = sigterm_set();
        // SAFETY: undoes fork_prepare's block in this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    }
}

#[cfg(unix)]
extern "C" fn fork_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
    callbacks::forget_last_thread();
    if SIGTERM_BLOCKED.swap(false, Ordering::Relaxed) {
        OWN_SIGTERM.store(false, Ordering::Relaxed);
        let set = sigterm_set();
        // SAFETY: a zeroed sigaction with SIG_DFL is the default action; then the block is undone, and a
        // SIGTERM sent since the fork takes that action.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}
