//! The analyzer inside the extension: `ocular.load()`'s reports and tables, the `stop_tracing()` report,
//! and `python -m ocular hot|stats|info|export`. Everything runs in the `ocular_analyze` library with the
//! GIL released; tables reach Python as Arrow C streams (`__arrow_c_stream__`), never as text.

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::types::UInt32Type;
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, DictionaryArray, Int32Array, Int64Array, RecordBatch, RecordBatchIterator,
    StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema};
use ocular_analyze::table::{
    build_selected, Batch, Column, Select, Sink, Table, TooBig, DEFAULT_BATCH_ROWS, NULL_CODE,
};
use ocular_format::ReadOptions;
use pyo3::exceptions::{PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

fn os_err(e: impl std::fmt::Display) -> PyErr {
    PyOSError::new_err(e.to_string())
}

/// A trace that cannot be read, as an `OSError` that says what kind of failure it is (attributes
/// `ocular_kind`, `trace_path`, `offset`): the Python side raises the matching `ocular.errors` class, so
/// callers tell "not a trace", "newer format", "truncated" and "corrupt" apart by type, not by message.
pub(super) fn trace_err(e: ocular_format::Error) -> PyErr {
    use ocular_format::Error as E;
    let (kind, path, offset) = match &e {
        E::NotOcular { path, .. } => ("not_a_trace", Some(path.clone()), Some(0)),
        E::Truncated { path, offset, .. } => ("truncated", Some(path.clone()), Some(*offset)),
        E::UnsupportedVersion { path, .. } => ("unsupported_version", Some(path.clone()), None),
        E::Corrupt { path, offset, .. } => ("corrupt", Some(path.clone()), Some(*offset)),
        E::Io { path, .. } => ("io", Some(path.clone()), None),
        E::Encode { .. } => ("encode", None, None),
    };
    let err = PyOSError::new_err(e.to_string());
    Python::attach(|py| {
        let v = err.value(py);
        let _ = v.setattr("ocular_kind", kind);
        let _ = v.setattr("trace_path", path);
        let _ = v.setattr("offset", offset);
    });
    err
}

/// `v` as Python objects, as its JSON form reads in Python (see [`crate::topy`]).
fn json<T: serde::Serialize>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    Ok(crate::topy::to_py(py, v)?.unbind())
}

/// `info(path, salvage=False) -> dict`: what `ocular-analyze info --json` prints.
#[pyfunction]
#[pyo3(signature = (path, salvage=false))]
pub(super) fn info(py: Python<'_>, path: PathBuf, salvage: bool) -> PyResult<Py<PyAny>> {
    let opts = ReadOptions::with_salvage(salvage);
    // A run of several processes (FORMAT.md 10): the first file's info, with every process's.
    let (run, _) = py.detach(|| ocular_analyze::procs::open(&path, opts)).map_err(trace_err)?;
    if !run.single() {
        let i = py.detach(|| ocular_analyze::info::summarize_run(&run, opts)).map_err(trace_err)?;
        return json(py, &i);
    }
    let i = py.detach(|| ocular_analyze::info::summarize(&path, opts)).map_err(trace_err)?;
    json(py, &i)
}

/// `hot(path, top=10, salvage=False) -> (dict, str, warnings)`: the hot-loop report as `--json` gives it,
/// and as text.
#[pyfunction]
#[pyo3(signature = (path, top=10, salvage=false))]
pub(super) fn hot(
    py: Python<'_>,
    path: PathBuf,
    top: usize,
    salvage: bool,
) -> PyResult<(Py<PyAny>, String, Vec<String>)> {
    let (report, warnings) = py
        .detach(|| {
            let opts = ReadOptions::with_salvage(salvage);
            let (run, mut warnings) = ocular_analyze::procs::open(&path, opts)?;
            let mut analyses = Vec::new();
            for p in &run.processes {
                let a = ocular_analyze::analysis::analyze(&p.path, opts)?;
                warnings.extend(a.warnings.iter().cloned());
                analyses.push(a);
            }
            let report = if run.single() {
                ocular_analyze::hot::report(&analyses[0], top)
            } else {
                ocular_analyze::hot::report_run(&analyses.iter().collect::<Vec<_>>(), top)
            };
            Ok::<_, ocular_format::Error>((report, warnings))
        })
        .map_err(trace_err)?;
    Ok((json(py, &report)?, report.to_string(), warnings))
}

/// `stats_within(path, name, salvage=False) -> (dict, warnings)`: `stats --span NAME --json` with every
/// function, and the reader's warnings. A trace recorded with windows is a `ValueError` (no time by
/// function inside spans there).
#[pyfunction]
#[pyo3(signature = (path, name, salvage=false))]
pub(super) fn stats_within(
    py: Python<'_>,
    path: PathBuf,
    name: String,
    salvage: bool,
) -> PyResult<(Py<PyAny>, Vec<String>)> {
    let opts = ReadOptions::with_salvage(salvage);
    let w = py
        .detach(|| {
            ocular_analyze::spans::within(&path, opts, &name, ocular_analyze::stats::SortBy::Exclusive, usize::MAX)
        })
        .map_err(|e| match e.downcast::<ocular_format::Error>() {
            Ok(e) => trace_err(e),
            Err(e) => PyValueError::new_err(e.to_string()),
        })?;
    Ok((json(py, &w)?, w.warnings.clone()))
}

/// What `stats --json` prints of one trace: a run of several processes as one report, one process as its
/// rows.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Stats {
    Run(ocular_analyze::stats::Report),
    Rows(Vec<ocular_analyze::stats::Row>),
}

/// A trace's statistics and the reader's warnings, or why it could not be read.
type StatsRead = ocular_format::Result<(Stats, Vec<String>)>;

/// The per-function statistics of the trace at `path`, and the reader's warnings.
fn stats_of(path: &Path, per_thread: bool, opts: ReadOptions) -> StatsRead {
    // Children and notes of unrecorded ones live in the children's directory: without it the trace is a
    // run of one process, and its process record (a third read of the file) is not needed.
    let one = || -> StatsRead {
        let a = ocular_analyze::analysis::analyze(path, opts)?;
        let rows = ocular_analyze::stats::rows(&a, per_thread, ocular_analyze::stats::SortBy::Exclusive);
        Ok((Stats::Rows(rows), a.warnings))
    };
    if !ocular_analyze::procs::children_dir(path).is_dir() {
        return one();
    }
    let (run, mut warnings) = ocular_analyze::procs::open(path, opts)?;
    if run.single() {
        return one();
    }
    // A run of several processes: functions merged over the processes (pid 0), or per process and thread
    // with per_thread.
    let mut report = Vec::new();
    for p in &run.processes {
        let a = ocular_analyze::analysis::analyze(&p.path, opts)?;
        let span = a.span.to_the_stop(&a);
        warnings.extend(a.warnings.iter().cloned());
        report.push((a, span));
    }
    let parts: Vec<ocular_analyze::stats::Part<'_>> = run
        .processes
        .iter()
        .zip(&report)
        .map(|(process, (analysis, span))| ocular_analyze::stats::Part { process, analysis, span: *span })
        .collect();
    let r = ocular_analyze::stats::report_run(
        &parts,
        run.unrecorded.len(),
        false,
        per_thread,
        ocular_analyze::stats::SortBy::Exclusive,
        usize::MAX,
    );
    Ok((Stats::Run(r), warnings))
}

/// `stats(path, per_thread=False, salvage=False) -> (list[dict], warnings)`: per-function rows, as
/// `stats --json`, and the reader's warnings (damage, lost events).
#[pyfunction]
#[pyo3(signature = (path, per_thread=false, salvage=false))]
pub(super) fn stats(
    py: Python<'_>,
    path: PathBuf,
    per_thread: bool,
    salvage: bool,
) -> PyResult<(Py<PyAny>, Vec<String>)> {
    let opts = ReadOptions::with_salvage(salvage);
    let (out, warnings) = py.detach(|| stats_of(&path, per_thread, opts)).map_err(trace_err)?;
    Ok((json(py, &out)?, warnings))
}

/// A trace's rows for a summary over many: `stats(path)`'s, those of files under a `leave_out` prefix left
/// out, with the largest inclusive time of all the rows (theirs included).
type ManyRead = ocular_format::Result<(Stats, Vec<String>, f64)>;

fn read_for_many(path: &Path, leave_out: &[String]) -> ManyRead {
    stats_of(path, false, ReadOptions::default()).map(|(mut stats, warnings)| {
        let mut longest = 0.0f64;
        if let Stats::Rows(rows) = &mut stats {
            longest = rows.iter().map(|r| r.inclusive_ms).fold(0.0, f64::max);
            rows.retain(|r| !leave_out.iter().any(|p| r.file.starts_with(p.as_str())));
        }
        (stats, warnings, longest)
    })
}

/// [`read_for_many`] of each path, on every core at once, in the order given.
fn read_many(paths: &[&Path], leave_out: &[String]) -> Vec<ManyRead> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(paths.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<ManyRead>> = (0..paths.len()).map(|_| None).collect();
    let done = Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = paths.get(i) else { break };
                let r = read_for_many(path, leave_out);
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    out.into_iter().map(|r| r.expect("every path was read")).collect()
}

fn many_to_py(py: Python<'_>, r: ManyRead) -> PyResult<Py<PyAny>> {
    match r {
        Ok((out, warnings, longest)) => Ok((json(py, &out)?, warnings, longest).into_pyobject(py)?.into_any().unbind()),
        Err(e) => Ok(trace_err(e).into_value(py).into_any()),
    }
}

/// `stats_many(paths, leave_out=()) -> list[tuple]`: `stats(path)` of each trace, as `(rows, warnings,
/// longest_ms)` or, for one that could not be read, the error it raises; the traces read on every core at
/// once (the pytest plugin's summary reads one per test). Rows whose file begins with one of `leave_out`
/// are left out (the test framework's own functions: most of a short test's rows, and most of the time
/// turning rows into Python); `longest_ms` is the largest inclusive time of all the rows, those included.
#[pyfunction]
#[pyo3(signature = (paths, leave_out=Vec::new()))]
pub(super) fn stats_many(py: Python<'_>, paths: Vec<PathBuf>, leave_out: Vec<String>) -> PyResult<Vec<Py<PyAny>>> {
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let results = py.detach(|| read_many(&refs, &leave_out));
    results.into_iter().map(|r| many_to_py(py, r)).collect()
}

/// `StatsQueue(leave_out)`: [`stats_many`] read ahead. Each trace `push`ed is read on a thread of its own at
/// the lowest priority (`SCHED_IDLE`: it runs only on a core nothing else wants, so it takes no time from
/// the program, whose next test runs meanwhile); `take(paths)` stops it and gives `stats_many(paths,
/// leave_out)`, reading on every core whatever it had not read yet. The pytest plugin pushes each test's
/// trace as the test ends, and its summary at the end of the session has little left to read.
#[pyclass(module = "ocular._ocular", name = "StatsQueue")]
pub(super) struct StatsQueue {
    leave_out: Arc<Vec<String>>,
    shared: Arc<QueueShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct QueueShared {
    /// Paths pushed and not read yet; `None` once taken (the thread ends).
    todo: Mutex<Option<std::collections::VecDeque<PathBuf>>>,
    more: Condvar,
    read: Mutex<std::collections::HashMap<PathBuf, ManyRead>>,
}

#[pymethods]
impl StatsQueue {
    #[new]
    fn new(leave_out: Vec<String>) -> Self {
        let shared = Arc::new(QueueShared { todo: Mutex::new(Some(Default::default())), ..Default::default() });
        StatsQueue { leave_out: Arc::new(leave_out), shared, thread: Mutex::new(None) }
    }

    /// Reads `path` in the background (it must be complete: its recording stopped).
    fn push(&self, path: PathBuf) {
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(todo) = self.shared.todo.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            todo.push_back(path);
            self.shared.more.notify_one();
        } else {
            return;
        }
        if thread.is_none() {
            let (shared, leave_out) = (self.shared.clone(), self.leave_out.clone());
            *thread = std::thread::Builder::new()
                .name("ocular-summary".into())
                .spawn(move || {
                    idle_priority();
                    loop {
                        let next = {
                            let mut todo = shared.todo.lock().unwrap_or_else(|e| e.into_inner());
                            loop {
                                match todo.as_mut() {
                                    None => return,
                                    Some(q) => match q.pop_front() {
                                        Some(p) => break p,
                                        None => todo = shared.more.wait(todo).unwrap_or_else(|e| e.into_inner()),
                                    },
                                }
                            }
                        };
                        let r = read_for_many(&next, &leave_out);
                        shared.read.lock().unwrap_or_else(|e| e.into_inner()).insert(next, r);
                    }
                })
                .ok();
        }
    }

    /// `stats_many(paths, leave_out)`, from what was read ahead; the queue takes no more paths after.
    fn take(&self, py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Vec<Py<PyAny>>> {
        let leave_out = self.leave_out.clone();
        let shared = self.shared.clone();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        let results = py.detach(move || {
            // The path being read is finished; the rest are read below, on every core.
            let pending = shared.todo.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
            shared.more.notify_all();
            if let Some(t) = thread {
                let _ = t.join();
            }
            let mut read = std::mem::take(&mut *shared.read.lock().unwrap_or_else(|e| e.into_inner()));
            // A path pushed again after it was read (a test run again writes the same trace) is read anew.
            for p in &pending {
                read.remove(p);
            }
            let missing: Vec<&Path> =
                paths.iter().filter(|p| !read.contains_key(p.as_path())).map(PathBuf::as_path).collect();
            let rest = read_many(&missing, &leave_out);
            for (p, r) in missing.iter().zip(rest) {
                read.insert(p.to_path_buf(), r);
            }
            // A path given twice is read again for its second place (a result moves out once).
            paths.iter().map(|p| read.remove(p).unwrap_or_else(|| read_for_many(p, &leave_out))).collect::<Vec<_>>()
        });
        results.into_iter().map(|r| many_to_py(py, r)).collect()
    }
}

/// The calling thread runs only when a core would otherwise be idle (Linux's `SCHED_IDLE`); elsewhere, or
/// if refused, at its normal priority.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; param is a valid sched_param for SCHED_IDLE (priority 0).
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}

/// `export_chrome(path, out) -> int`: the Chrome Trace Event JSON (what `perfetto=True` writes); returns
/// the number of trace events.
#[pyfunction]
pub(super) fn export_chrome(py: Python<'_>, path: PathBuf, out: PathBuf) -> PyResult<u64> {
    py.detach(|| {
        // Never over the trace, and renamed into place once whole (see ocular_analyze::output).
        let (counts, _) = ocular_analyze::output::write(&path, &out, |w| {
            ocular_analyze::export::chrome::export(&path, ReadOptions::default(), w)
        })
        .map_err(|e| os_err(format!("{e:#}")))?;
        Ok(counts.events)
    })
}

/// `cli(argv, prog="ocular-analyze") -> int`: runs `ocular-analyze` with `argv` (without the program
/// name; `prog` is the name its usage lines give it); returns its exit code.
#[pyfunction]
#[pyo3(signature = (argv, prog="ocular-analyze"))]
/// Arguments are OS strings, as Python holds them: a path that is not UTF-8 reaches the analyzer whole.
pub(super) fn cli(py: Python<'_>, argv: Vec<std::ffi::OsString>, prog: &str) -> i32 {
    py.detach(|| {
        ocular_analyze::progress::enable();
        ocular_analyze::cli::run_from(std::iter::once(prog.into()).chain(argv))
    })
}

/// Collects one table's batches as Arrow record batches.
#[derive(Default)]
struct ArrowSink {
    schema: Option<Arc<Schema>>,
    batches: Vec<RecordBatch>,
}

fn arrow_column(col: Column) -> (DataType, bool, ArrayRef) {
    match col {
        Column::U64(v) => (DataType::UInt64, false, Arc::new(UInt64Array::from(v))),
        Column::OptU64(v) => (DataType::UInt64, true, Arc::new(UInt64Array::from(v))),
        Column::I64(v) => (DataType::Int64, false, Arc::new(Int64Array::from(v))),
        Column::OptI64(v) => (DataType::Int64, true, Arc::new(Int64Array::from(v))),
        Column::U32(v) => (DataType::UInt32, false, Arc::new(UInt32Array::from(v))),
        Column::OptI32(v) => (DataType::Int32, true, Arc::new(Int32Array::from(v))),
        Column::Dict(codes, dict) => {
            let values = Arc::new(StringArray::from_iter_values(dict.iter()));
            let keys: UInt32Array = codes.into_iter().map(|c| (c != NULL_CODE).then_some(c)).collect();
            let a = DictionaryArray::<UInt32Type>::try_new(keys, values).expect("codes index the dictionary");
            (DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)), true, Arc::new(a))
        }
        Column::Binary(v) => (DataType::Binary, true, Arc::new(BinaryArray::from_iter(v))),
        Column::Bool(v) => (DataType::Boolean, false, Arc::new(BooleanArray::from(v))),
    }
}

impl Sink for ArrowSink {
    fn batch(&mut self, _: Table, batch: Batch) -> anyhow::Result<()> {
        let mut fields = Vec::with_capacity(batch.columns.len());
        let mut arrays = Vec::with_capacity(batch.columns.len());
        for (name, col) in batch.columns {
            let (dt, nullable, a) = arrow_column(col);
            fields.push(Field::new(name, dt, nullable));
            arrays.push(a);
        }
        let schema = self.schema.get_or_insert_with(|| Arc::new(Schema::new(fields))).clone();
        self.batches.push(RecordBatch::try_new(schema, arrays)?);
        Ok(())
    }
}

/// An Arrow table built by the analyzer, exported once through the Arrow PyCapsule interface.
#[pyclass(module = "ocular._ocular", name = "ArrowTable")]
pub(super) struct ArrowTable {
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
    rows: usize,
}

#[pymethods]
impl ArrowTable {
    /// Rows in the table.
    fn __len__(&self) -> usize {
        self.rows
    }

    /// The Arrow C stream interface: polars.DataFrame(t), pyarrow.table(t). Each read streams the same
    /// batches (their columns are shared, not copied), so `ocular.load()` keeps a table and builds every
    /// frame asked for from it.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema; // the schema is ours; consumers cast if they want to
        let batches = self.batches.clone();
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok::<_, ArrowError>), self.schema.clone());
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }
}

/// `table(path, name, salvage=False, columns=None, threads=None, start_ns=None, end_ns=None) ->
/// (ArrowTable, warnings)`: one of the tables of `ocular_analyze::table` (`events`, `calls`, `code`,
/// `lost`, `counter_samples`, `lines`, `coroutines`, `tasks`), with the rows and columns selected.
///
/// A table too big for the memory the process can get raises `MemoryError` before anything is built:
/// Rust aborts the process when an allocation fails (a notebook kernel dies), so the size is estimated
/// from the chunk headers first and compared with what the machine and the process's limits allow.
#[pyfunction]
#[pyo3(signature = (path, name, salvage=false, columns=None, threads=None, start_ns=None, end_ns=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn table(
    py: Python<'_>,
    path: PathBuf,
    name: &str,
    salvage: bool,
    columns: Option<Vec<String>>,
    threads: Option<Vec<u64>>,
    start_ns: Option<i64>,
    end_ns: Option<i64>,
) -> PyResult<(ArrowTable, Vec<String>)> {
    let which = match name {
        "events" => Table::Events,
        "calls" => Table::Calls,
        "code" => Table::Code,
        "lost" => Table::Lost,
        "counter_samples" => Table::CounterSamples,
        "lines" => Table::Lines,
        "functions" => Table::Functions,
        "coroutines" => Table::Coroutines,
        "tasks" => Table::Tasks,
        "spans" => Table::Spans,
        other => {
            return Err(PyValueError::new_err(format!(
                "no table {other:?}: events, calls, code, lost, counter_samples, lines, functions, coroutines, tasks \
                 or spans"
            )))
        }
    };
    // Rust aborts the process when an allocation fails: an events table that cannot fit the memory the
    // process can get is refused before anything is built, from its size in the chunk headers. The
    // batches and polars' conversion of them are alive together: see PEAK.
    let free = memory_available();
    let budget = free.map(|f| f / PEAK);
    let select = Select { columns, threads, start_ns, end_ns, budget };
    let opts = ReadOptions::with_salvage(salvage);
    select.check(which).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let (sink, summary) = py
        .detach(|| {
            let mut sink = ArrowSink::default();
            let s = build_selected(&path, opts, &[which], DEFAULT_BATCH_ROWS, &select, &mut sink)?;
            Ok::<_, anyhow::Error>((sink, s))
        })
        .map_err(|e| match e.downcast_ref::<TooBig>() {
            Some(t) => {
                let gb = |b: u64| b as f64 / (1u64 << 30) as f64;
                PyMemoryError::new_err(format!(
                    "{}: the events table of {} events needs about {:.1} GiB at its peak and {:.1} GiB is \
                     available: pass columns=[...] (the ones you need), threads=[...] or start_ns/end_ns, or \
                     export it (ocular-analyze export --parquet) and scan it lazily with polars.scan_parquet",
                    path.display(),
                    t.rows,
                    gb(t.bytes.saturating_mul(PEAK)),
                    gb(free.unwrap_or(0))
                ))
            }
            None => match e.downcast::<ocular_format::Error>() {
                Ok(e) => trace_err(e),
                Err(e) => os_err(format!("{e:#}")),
            },
        })?;
    let rows = sink.batches.iter().map(RecordBatch::num_rows).sum();
    let schema = sink.schema.unwrap_or_else(|| Arc::new(Schema::empty()));
    Ok((ArrowTable { schema, batches: sink.batches, rows }, summary.warnings))
}

/// The peak of `events()` over the DataFrame's size, rounded up from the 1.37-1.77x measured.
const PEAK: u64 = 2;

/// Bytes this process can still allocate: the machine's available memory (`MemAvailable`), or less if
/// an address-space limit (`ulimit -v`) leaves less room. `None` where neither can be read.
fn memory_available() -> Option<u64> {
    let field = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024)
    };
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| field(&t, "MemAvailable:"));
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    let has_limit =
        unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0 && limit.rlim_cur != libc::RLIM_INFINITY;
    let process = if has_limit {
        let used = std::fs::read_to_string("/proc/self/status").ok().and_then(|t| field(&t, "VmSize:")).unwrap_or(0);
        Some(limit.rlim_cur.saturating_sub(used))
    } else {
        None
    };
    match (machine, process) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
