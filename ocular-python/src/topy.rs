//! Serializable values made into Python objects directly, as `serde_json::to_value` followed by a walk of
//! the JSON value made them, without the JSON value in between: a trace's rows went through a map per row
//! (its keys allocated, sorted and hashed), then through Python, and that detour was half of what a small
//! trace's `stats()` cost. The result is the same: dicts with their keys in sorted order (serde_json's map
//! is a BTreeMap), integers, floats (a non-finite one is None, as JSON has no form for it), strings, lists,
//! None; a map's integer keys become strings, as in JSON.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde::ser::{self, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;

/// A Python error carried through serde.
#[derive(Debug)]
pub(crate) struct Error(pub(crate) PyErr);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(PyValueError::new_err(msg.to_string()))
    }
}

impl From<std::convert::Infallible> for Error {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error(e)
    }
}

/// `v` as Python objects.
pub(crate) fn to_py<'py, T: Serialize + ?Sized>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let mut s = ToPy { py, fields: HashMap::new() };
    v.serialize(&mut s).map_err(|e| e.0)
}

/// The serializer. A struct's field names are `&'static str`: each is made a Python string once per call.
struct ToPy<'py> {
    py: Python<'py>,
    fields: HashMap<(usize, usize), Bound<'py, PyString>>,
}

impl<'py> ToPy<'py> {
    fn field(&mut self, name: &'static str) -> Bound<'py, PyString> {
        let py = self.py;
        self.fields.entry((name.as_ptr() as usize, name.len())).or_insert_with(|| PyString::new(py, name)).clone()
    }

    fn float(&self, v: f64) -> PyResult<Bound<'py, PyAny>> {
        if v.is_finite() {
            Ok(v.into_pyobject(self.py)?.into_any())
        } else {
            Ok(self.py.None().into_bound(self.py))
        }
    }

    /// `{variant: value}`, serde_json's form of a variant that holds something.
    fn variant(&self, variant: &'static str, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let d = PyDict::new(self.py);
        d.set_item(variant, value)?;
        Ok(d.into_any())
    }
}

/// Entries gathered, then put into a dict in their keys' order, as serde_json's BTreeMap holds them (byte
/// order; of equal keys the last wins, as it does there: the sort is stable).
fn sorted_dict<'py>(py: Python<'py>, mut entries: Vec<Entry<'py>>) -> PyResult<Bound<'py, PyDict>> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let d = PyDict::new(py);
    for (_, k, v) in entries {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// A dict entry: its key as Rust has it (to sort by), as Python has it, and its value.
type Entry<'py> = (Cow<'static, str>, Bound<'py, PyString>, Bound<'py, PyAny>);

/// A map key as JSON has it: a string, or an integer written as one.
fn key_string(k: Bound<'_, PyAny>) -> Result<Bound<'_, PyString>, Error> {
    if let Ok(s) = k.cast::<PyString>() {
        return Ok(s.clone());
    }
    if k.is_instance_of::<pyo3::types::PyInt>() && !k.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(k.str()?);
    }
    Err(ser::Error::custom("a map key that is neither a string nor an integer"))
}

type Out<'py> = Result<Bound<'py, PyAny>, Error>;

impl<'a, 'py> ser::Serializer for &'a mut ToPy<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    type SerializeSeq = Seq<'a, 'py>;
    type SerializeTuple = Seq<'a, 'py>;
    type SerializeTupleStruct = Seq<'a, 'py>;
    type SerializeTupleVariant = Seq<'a, 'py>;
    type SerializeMap = Map<'a, 'py>;
    type SerializeStruct = Map<'a, 'py>;
    type SerializeStructVariant = Map<'a, 'py>;

    fn serialize_bool(self, v: bool) -> Out<'py> {
        Ok(pyo3::types::PyBool::new(self.py, v).to_owned().into_any())
    }
    fn serialize_i8(self, v: i8) -> Out<'py> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Out<'py> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Out<'py> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Out<'py> {
        Ok(v.into_pyobject(self.py)?.into_any())
    }
    fn serialize_i128(self, v: i128) -> Out<'py> {
        Ok(v.into_pyobject(self.py)?.into_any())
    }
    fn serialize_u8(self, v: u8) -> Out<'py> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Out<'py> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Out<'py> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Out<'py> {
        Ok(v.into_pyobject(self.py)?.into_any())
    }
    fn serialize_u128(self, v: u128) -> Out<'py> {
        Ok(v.into_pyobject(self.py)?.into_any())
    }
    fn serialize_f32(self, v: f32) -> Out<'py> {
        Ok(self.float(f64::from(v))?)
    }
    fn serialize_f64(self, v: f64) -> Out<'py> {
        Ok(self.float(v)?)
    }
    fn serialize_char(self, v: char) -> Out<'py> {
        let mut b = [0u8; 4];
        Ok(PyString::new(self.py, v.encode_utf8(&mut b)).into_any())
    }
    fn serialize_str(self, v: &str) -> Out<'py> {
        Ok(PyString::new(self.py, v).into_any())
    }
    fn serialize_bytes(self, v: &[u8]) -> Out<'py> {
        // serde_json writes bytes as an array of numbers.
        Ok(PyList::new(self.py, v)?.into_any())
    }
    fn serialize_none(self) -> Out<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Out<'py> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Out<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Out<'py> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Out<'py> {
        Ok(self.field(variant).into_any())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Out<'py> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Out<'py> {
        let inner = value.serialize(&mut *self)?;
        Ok(self.variant(variant, inner)?)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq<'a, 'py>, Error> {
        Ok(Seq { s: self, items: Vec::with_capacity(len.unwrap_or(0)), variant: None })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a, 'py>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Seq<'a, 'py>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Seq<'a, 'py>, Error> {
        Ok(Seq { s: self, items: Vec::with_capacity(len), variant: Some(variant) })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Map<'a, 'py>, Error> {
        Ok(Map { s: self, entries: Vec::with_capacity(len.unwrap_or(0)), key: None, variant: None })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Map<'a, 'py>, Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Map<'a, 'py>, Error> {
        Ok(Map { s: self, entries: Vec::with_capacity(len), key: None, variant: Some(variant) })
    }
}

struct Seq<'a, 'py> {
    s: &'a mut ToPy<'py>,
    items: Vec<Bound<'py, PyAny>>,
    variant: Option<&'static str>,
}

impl<'py> Seq<'_, 'py> {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let v = value.serialize(&mut *self.s)?;
        self.items.push(v);
        Ok(())
    }
    fn finish(self) -> Out<'py> {
        let list = PyList::new(self.s.py, self.items)?.into_any();
        match self.variant {
            Some(v) => Ok(self.s.variant(v, list)?),
            None => Ok(list),
        }
    }
}

/// The sequence traits, alike but for the name of their method.
macro_rules! seq_impl {
    ($($trait:ident::$method:ident),*) => {$(
        impl<'py> ser::$trait for Seq<'_, 'py> {
            type Ok = Bound<'py, PyAny>;
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.push(value)
            }
            fn end(self) -> Out<'py> {
                self.finish()
            }
        }
    )*};
}

seq_impl!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

struct Map<'a, 'py> {
    s: &'a mut ToPy<'py>,
    entries: Vec<Entry<'py>>,
    key: Option<(String, Bound<'py, PyString>)>,
    variant: Option<&'static str>,
}

impl<'py> Map<'_, 'py> {
    fn finish(self) -> Out<'py> {
        let d = sorted_dict(self.s.py, self.entries)?.into_any();
        match self.variant {
            Some(v) => Ok(self.s.variant(v, d)?),
            None => Ok(d),
        }
    }
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        let v = value.serialize(&mut *self.s)?;
        let k = self.s.field(key);
        self.entries.push((Cow::Borrowed(key), k, v));
        Ok(())
    }
}

impl<'py> ser::SerializeMap for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        let k = key_string(key.serialize(&mut *self.s)?)?;
        self.key = Some((k.to_str()?.to_owned(), k));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let v = value.serialize(&mut *self.s)?;
        let (name, k) = self.key.take().ok_or_else(|| <Error as ser::Error>::custom("a map value without its key"))?;
        self.entries.push((Cow::Owned(name), k, v));
        Ok(())
    }
    fn end(self) -> Out<'py> {
        self.finish()
    }
}

/// A struct and a struct variant: fields by their static names.
macro_rules! struct_impl {
    ($($trait:ident),*) => {$(
        impl<'py> ser::$trait for Map<'_, 'py> {
            type Ok = Bound<'py, PyAny>;
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
                self.field(key, value)
            }
            fn end(self) -> Out<'py> {
                self.finish()
            }
        }
    )*};
}

struct_impl!(SerializeStruct, SerializeStructVariant);
