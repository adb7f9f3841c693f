//! `_ocular.read(path)`: a whole `.ocl` file as Python objects, for tests and small files. (Analysis of
//! large files belongs to ocular-analyze, which streams.)

use ocular_format::{kind_name, Body, ReadOptions, Reader};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Returns `{"header": {...}, "events": [(thread, ticks, kind, code, offset, arg)], "code": {id: (qualname,
/// filename, first_line, name)}, "positions": {id: [(line, end_line, col, end_col)]}, "bytecode": {id:
/// bytes}, "threads": {id: name}, "lost": [(thread, count, first, last)], "snapshots": {id: bytes},
/// "trailer": {end_ticks, end_monotonic_ns, events, lost} (if present), "clean": bool, "warnings": [...]}`. Kinds are `sys.monitoring` names.
#[pyfunction]
#[pyo3(signature = (path, salvage=false))]
pub(super) fn read<'py>(py: Python<'py>, path: std::path::PathBuf, salvage: bool) -> PyResult<Bound<'py, PyDict>> {
    let err = super::analyze::trace_err;
    let mut r = Reader::open_with(&path, ReadOptions::with_salvage(salvage)).map_err(err)?;
    let out = PyDict::new(py);
    let h = r.header();
    let header = PyDict::new(py);
    header.set_item("recorder", &h.recorder)?;
    header.set_item("python_version", &h.python_version)?;
    header.set_item("pid", h.pid)?;
    header.set_item("mode", h.options.mode.name())?;
    header.set_item("deinstrument_threshold", h.options.deinstrument_threshold)?;
    header.set_item("include_only", h.options.include_only.clone())?;
    header.set_item("exclude", h.options.exclude.clone())?;
    header.set_item("buffer_events", h.options.buffer_events)?;
    header.set_item("max_buffers", h.options.max_buffers)?;
    header.set_item("ticks_per_second", h.ticks_per_second)?;
    header.set_item("event_cost_ticks", h.event_cost_ticks)?;
    header.set_item("start_ticks", h.start_ticks)?;
    header.set_item("start_monotonic_ns", h.start_monotonic_ns)?;
    header.set_item("opnames", h.opcodes.names.clone())?;
    header.set_item("clock", format!("{:?}", h.clock))?;
    out.set_item("header", header)?;
    let events = PyList::empty(py);
    let code = PyDict::new(py);
    let threads = PyDict::new(py);
    let lost = PyList::empty(py);
    let dropped = PyList::empty(py);
    let samples = PyList::empty(py);
    let counters = PyList::empty(py);
    let snaps = PyDict::new(py);
    let positions = PyDict::new(py);
    let bytecode = PyDict::new(py);
    let cfuncs = PyDict::new(py);
    while let Some(c) = r.next_chunk().map_err(err)? {
        match c.body {
            Body::Events(ev) => {
                for e in ev {
                    events.append((
                        c.info.thread_id,
                        e.ticks.get(),
                        kind_name(e.kind),
                        e.code.get(),
                        e.offset.get(),
                        e.arg.get(),
                    ))?;
                }
            }
            Body::Code(objs) => {
                for o in objs {
                    let pos: Vec<(i32, i32, i32, i32)> =
                        o.positions.iter().map(|p| (p.line, p.end_line, p.column, p.end_column)).collect();
                    positions.set_item(o.id, pos)?;
                    bytecode.set_item(o.id, pyo3::types::PyBytes::new(py, &o.bytecode))?;
                    code.set_item(o.id, (o.qualname, o.filename, o.first_line, o.name))?;
                }
            }
            Body::Thread(t) => threads.set_item(t.thread_id, t.name)?,
            Body::Lost(l) => lost.append((l.thread_id, l.count, l.first_ticks, l.last_ticks))?,
            Body::Snapshot(s) => {
                for x in s {
                    snaps.set_item(x.id, pyo3::types::PyBytes::new(py, &x.bytecode))?;
                }
            }
            // The start's costs and, from the stop's chunk (FORMAT.md 6.6), its speed: one dict.
            Body::Calibration(c) => {
                let d = match out.get_item("calibration")? {
                    Some(d) => d.cast_into::<PyDict>()?,
                    None => PyDict::new(py),
                };
                for (k, v) in c.costs {
                    d.set_item(ocular_format::Calibration::cost_name(k), v)?;
                }
                out.set_item("calibration", d)?;
            }
            Body::Trailer(t) => {
                let d = PyDict::new(py);
                d.set_item("end_ticks", t.end_ticks)?;
                d.set_item("end_monotonic_ns", t.end_monotonic_ns)?;
                d.set_item("events", t.events)?;
                d.set_item("lost", t.lost)?;
                out.set_item("trailer", d)?;
            }
            Body::Dropped(d) => dropped.append((d.thread_id, d.events, d.first_ticks, d.last_ticks))?,
            Body::Counters(cs) => {
                if counters.is_empty() {
                    for c in &cs.counters {
                        counters.append((c.name.as_str(), c.unit.as_str(), c.period, c.error.as_str()))?;
                    }
                }
                for x in cs.samples {
                    samples.append((x.thread_id, x.counter, x.monotonic_ns, x.period))?;
                }
            }
            Body::Process(p) => {
                let d = PyDict::new(py);
                d.set_item("run_id", p.run_id)?;
                d.set_item("parent_pid", p.parent_pid)?;
                d.set_item("started", p.started)?;
                d.set_item("executable", p.executable)?;
                d.set_item("argv", p.argv)?;
                out.set_item("process", d)?;
            }
            Body::CFunctions(fs) => {
                for f in fs {
                    cfuncs.set_item(f.id, (f.qualname, f.module, f.kind))?;
                }
            }
            Body::Skipped(_) | Body::Ring(_) => {}
        }
    }
    out.set_item("cfuncs", cfuncs)?;
    out.set_item("dropped", dropped)?;
    out.set_item("counters", counters)?;
    out.set_item("samples", samples)?;
    out.set_item("events", events)?;
    out.set_item("code", code)?;
    out.set_item("threads", threads)?;
    out.set_item("lost", lost)?;
    out.set_item("snapshots", snaps)?;
    out.set_item("positions", positions)?;
    out.set_item("bytecode", bytecode)?;
    out.set_item("clean", r.report().clean())?;
    let name = path.display().to_string();
    out.set_item("warnings", r.report().warnings(&name))?;
    Ok(out)
}

/// `file_events(path) -> (events, run_id | None)`: the events a trace holds, from its chunk headers (no
/// event is decompressed), and the run of several processes it belongs to (FORMAT.md 6.10), if any.
#[pyfunction]
pub(super) fn file_events(py: Python<'_>, path: std::path::PathBuf) -> PyResult<(u64, Option<u64>)> {
    py.detach(|| -> Result<(u64, Option<u64>), String> {
        let opts = ocular_format::ReadOptions { skip_events: true, ..ocular_format::ReadOptions::with_salvage(true) };
        let mut r = ocular_format::Reader::open_with(&path, opts).map_err(|e| e.to_string())?;
        let (mut events, mut run) = (0u64, None);
        while let Some(c) = r.next_chunk().map_err(|e| e.to_string())? {
            if c.info.kind == ocular_format::chunk::kind::EVENTS {
                events += c.info.count as u64;
            }
            if let Body::Process(p) = c.body {
                run = Some(p.run_id);
            }
        }
        Ok((events, run))
    })
    .map_err(pyo3::exceptions::PyOSError::new_err)
}

/// `complete_trace(path) -> (recovered, events) | None`: a killed recording's trace made whole from its
/// ring file (`ocular_format::complete`); None when there was nothing to do.
#[pyfunction]
pub(super) fn complete_trace(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<(u64, u64)>> {
    py.detach(|| ocular_format::complete::complete(&path))
        .map(|c| c.map(|c| (c.recovered, c.events)))
        .map_err(|e| PyOSError::new_err(e.to_string()))
}
