//! C callables (FORMAT.md 6.11): the first call of each in a recording gives it an id and a name, written
//! to the trace as a `CFunction` record. Names are Python's own (`__qualname__`, `__module__`), read
//! here, off the hot path; a callable that will not tell gets its type's name.

use super::callbacks::{KEY_OBJECT, KEY_TYPE};
use super::{state, Output};
use ocular_format::CFunction;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The id of the C callable with `key` (`callbacks::c_key`) in the current recording, registering it on
/// its first call; 0 when not recording. May run Python (attribute lookups), so the caller checks the
/// recording's generation again.
///
/// # Safety
/// GIL held; `callable` is the live object the interpreter passed to the CALL event, of key `key`.
#[cold]
#[inline(never)]
pub(super) unsafe fn register(key: (usize, usize), callable: *mut ffi::PyObject) -> u32 {
    // SAFETY: GIL held by the caller; each reference into the state ends before the Python calls.
    let generation = unsafe { state() }.generation;
    {
        // SAFETY: as above.
        let Some(rec) = unsafe { state() }.recorder.as_deref() else { return 0 };
        if let Some(&id) = rec.cfuncs.get(&key) {
            return id;
        }
    }
    // SAFETY: the interpreter holds the GIL while calling a monitoring callback.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: a borrowed reference the interpreter holds for the duration of the call.
    let obj = unsafe { Bound::from_borrowed_ptr(py, callable) };
    let (mut f, keep) = describe(&obj, key);
    // SAFETY: GIL held again; no Python call while `st` is alive.
    let st = unsafe { state() };
    if st.generation != generation {
        return 0;
    }
    let Some(rec) = st.recorder.as_deref_mut() else { return 0 };
    if let Some(&id) = rec.cfuncs.get(&key) {
        return id; // registered meanwhile, by another thread
    }
    let id = rec.cfuncs.len() as u32 + 1;
    rec.cfuncs.insert(key, id);
    // The objects the key's addresses belong to stay alive while recording, so no address is reused for
    // another callable.
    rec.keep.extend(keep);
    f.id = id;
    if let Output::File(s) = &rec.out {
        s.c_function(f);
    }
    id
}

/// Keeps `callable` alive for the rest of the recording if it is one object for every call of it (a
/// module's function, a method descriptor, a type), so that threads may know it by its address; false for
/// any other callable (a method bound to an object is a new one at each access).
///
/// # Safety
/// GIL held; `callable` is a live object.
pub(super) unsafe fn keep_alive(callable: *mut ffi::PyObject) -> bool {
    // SAFETY: GIL held; type checks before each layout's fields are read; no Python call below.
    unsafe {
        let tp = ffi::Py_TYPE(callable);
        let stable = if tp == &raw mut ffi::PyCFunction_Type || tp == &raw mut ffi::PyCMethod_Type {
            let s = (*(callable as *mut ffi::PyCFunctionObject)).m_self;
            s.is_null() || ffi::PyModule_Check(s) != 0
        } else {
            tp == &raw mut ffi::PyMethodDescr_Type || ffi::PyType_Check(callable) != 0
        };
        if !stable {
            return false;
        }
        let Some(rec) = state().recorder.as_deref_mut() else { return false };
        if rec.kept.insert(callable as usize) {
            rec.keep.push(Bound::from_borrowed_ptr(Python::assume_attached(), callable).unbind());
        }
        true
    }
}

/// A C callable's name, module and kind, and the objects its key points into.
fn describe<'py>(obj: &Bound<'py, PyAny>, key: (usize, usize)) -> (CFunction, Vec<Py<PyAny>>) {
    let py = obj.py();
    let text = |o: &Bound<'py, PyAny>, name: &Bound<'py, PyString>| -> String {
        o.getattr(name).ok().and_then(|v| v.extract::<String>().ok()).unwrap_or_default()
    };
    let qualname = intern!(py, "__qualname__");
    let module = intern!(py, "__module__");
    let tp = obj.get_type().into_any();
    let (kind, name, module, keep) = match key.1 {
        KEY_TYPE => (CFunction::TYPE, text(obj, qualname), text(obj, module), vec![obj.clone().unbind()]),
        KEY_OBJECT => {
            let n = text(&tp, qualname);
            (CFunction::OBJECT, format!("{n}.__call__"), text(&tp, module), vec![tp.clone().unbind()])
        }
        owner => {
            // A built-in function (`m_self` NULL or a module), method (bound to an object or a class) or
            // method descriptor: `__module__` is the module's name for the first, often None or missing for
            // the others, which the class they belong to then tells.
            let mut m = text(obj, module);
            if m.is_empty() {
                m = class_of(obj).map(|c| text(&c, module)).unwrap_or_default();
            }
            let kind = if tp_is_descriptor(obj) { CFunction::DESCRIPTOR } else { CFunction::BUILTIN };
            // SAFETY: `owner` is 0 or the address of a type the callable holds (through m_self or d_type).
            let owner = (owner != 0).then(|| unsafe { Bound::from_borrowed_ptr(py, owner as *mut ffi::PyObject) });
            (kind, text(obj, qualname), m, owner.map(|o| o.unbind()).into_iter().collect())
        }
    };
    let name = if name.is_empty() { text(&tp, intern!(py, "__name__")) } else { name };
    (CFunction { id: 0, qualname: name, module, kind }, keep)
}

/// Whether `obj` is a method descriptor (`list.append` as the class holds it).
fn tp_is_descriptor(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: comparing a type's address with a static type's.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) == &raw mut ffi::PyMethodDescr_Type }
}

/// The class a built-in method or method descriptor belongs to: `__objclass__` of a descriptor, the class a
/// class method is bound to, the type of the object a method is bound to; `None` for a module's function.
fn class_of<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let py = obj.py();
    if let Ok(c) = obj.getattr(intern!(py, "__objclass__")) {
        return Some(c);
    }
    let s = obj.getattr(intern!(py, "__self__")).ok()?;
    if s.is_instance_of::<pyo3::types::PyModule>() || s.is_none() {
        None
    } else if s.is_instance_of::<pyo3::types::PyType>() {
        Some(s)
    } else {
        Some(s.get_type().into_any())
    }
}
