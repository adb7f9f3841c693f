//! `ocular.attach()`: a cursor over a running recording's ring file (RING.md 6), from Python.

use ocular_format::live::{Cursor, End};
use ocular_format::{kind_name, RawEvent};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A cursor; see `ocular.attach`.
#[pyclass(unsendable, module = "ocular._ocular")]
pub(super) struct LiveCursor {
    c: Cursor,
}

fn err(e: ocular_format::Error) -> PyErr {
    match &e {
        ocular_format::Error::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            PyValueError::new_err(e.to_string())
        }
        _ => PyOSError::new_err(e.to_string()),
    }
}

/// A cursor on the recording of process `pid`, or on the ring file at `path`.
#[pyfunction]
#[pyo3(signature = (pid=None, path=None))]
pub(super) fn attach(py: Python<'_>, pid: Option<u32>, path: Option<std::path::PathBuf>) -> PyResult<LiveCursor> {
    let c = py.detach(|| match (pid, path) {
        (_, Some(p)) => Cursor::open(&p),
        (Some(pid), None) => Cursor::open_pid(pid),
        (None, None) => Err(ocular_format::Error::Io {
            path: "attach".into(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "give a pid or a path"),
        }),
    });
    Ok(LiveCursor { c: c.map_err(err)? })
}

#[pymethods]
impl LiveCursor {
    /// The events since the last poll, as `(events, missed, ended)`: `events` a list of
    /// `(thread_id, ns since the recording started, kind, code id, offset, arg)`; `missed` the events the recording reused the slots of before they were read; `ended`
    /// `None`, `"stopped"` or `"gone"` (killed).
    fn poll<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, u64, Option<&'static str>)> {
        let (tps, start) = self.c.clock();
        let scale = if tps > 0.0 { 1e9 / tps } else { 1.0 };
        let mut raw: Vec<(u64, RawEvent)> = Vec::new();
        let p = py.detach(|| self.c.poll(|t, e| raw.push((t, *e))));
        let out = PyList::empty(py);
        for (t, e) in &raw {
            let ns = (e.ticks.get().saturating_sub(start) as f64 * scale) as u64;
            let row = PyTuple::new(
                py,
                [
                    t.into_pyobject(py)?.into_any(),
                    ns.into_pyobject(py)?.into_any(),
                    kind_name(e.kind).into_pyobject(py)?.into_any(),
                    e.code.get().into_pyobject(py)?.into_any(),
                    e.offset.get().into_pyobject(py)?.into_any(),
                    e.arg.get().into_pyobject(py)?.into_any(),
                ],
            )?;
            out.append(row)?;
        }
        let ended = p.ended.map(|e| match e {
            End::Stopped => "stopped",
            End::Gone => "gone",
        });
        Ok((out, p.missed, ended))
    }

    /// `{code id: (qualname, filename, first line, [line of each code unit])}` of the code objects
    /// described so far.
    fn code<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (id, c) in &self.c.code {
            let lines: Vec<i32> = c.positions.iter().map(|p| p.line).collect();
            d.set_item(id, (c.qualname.as_str(), c.filename.as_str(), c.first_line, lines))?;
        }
        Ok(d)
    }

    /// `{thread id: name}` so far.
    fn threads<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (id, n) in &self.c.threads {
            d.set_item(id, n)?;
        }
        Ok(d)
    }

    /// `(delivered, missed)` since the cursor opened.
    fn totals(&self) -> (u64, u64) {
        (self.c.delivered, self.c.missed)
    }

    /// The ring file.
    #[getter]
    fn path(&self) -> String {
        self.c.path().display().to_string()
    }

    /// The recording process.
    #[getter]
    fn pid(&self) -> u32 {
        self.c.pid()
    }
}
