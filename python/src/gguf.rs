//! `weightmap._weightmap._GgufLayout`: where a GGUF file's key/values and
//! tensor descriptors sit, from weightmap's validated header, for
//! `weightmap.gguf.GGUFReader` (python/python/weightmap/gguf.py), which
//! hands out numpy views of those bytes as gguf-py's reader does, building
//! each field only when it is asked for.

use std::path::PathBuf;

use numpy::PyArray1;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use weightmap as wm;
use wm::gguf::{Value, ValueType};

use crate::{to_py, Error};

/// A GGUF file's layout: its header, parsed and validated once.
#[pyclass(frozen, module = "weightmap", name = "_GgufLayout")]
pub(crate) struct GgufLayout {
    header: wm::Header,
}

impl GgufLayout {
    fn gguf(&self) -> &wm::gguf::GgufHeader {
        // `new` refuses any other format.
        self.header.gguf().expect("a GGUF header")
    }

    fn metadata(&self) -> wm::gguf::Metadata<'_> {
        self.header.gguf_metadata().expect("a GGUF header")
    }
}

#[pymethods]
impl GgufLayout {
    /// Read and validate the header of the GGUF file `path` (this file
    /// only: a split model's other shards are not read).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<GgufLayout> {
        let header = py
            .allow_threads(|| wm::Header::read(&path))
            .map_err(|e| match e {
                // gguf-py 0.19's GGUFReader raises this for the first key
                // that repeats one before it (`_push_field`).
                wm::Error::DuplicateKey { key, offset } => PyKeyError::new_err(format!(
                    "Duplicate {key} already in list at offset {offset}"
                )),
                e => to_py(py, e),
            })?;
        if header.gguf().is_none() {
            return Err(Error::new_err(format!(
                "{}: not a GGUF file (GGUF magic invalid)",
                path.display()
            )));
        }
        Ok(GgufLayout { header })
    }

    /// GGUF version.
    #[getter]
    fn version(&self) -> u32 {
        self.gguf().version()
    }

    /// Data alignment (`general.alignment`, or 32).
    #[getter]
    fn alignment(&self) -> u64 {
        self.gguf().alignment()
    }

    /// Offset of the data section.
    #[getter]
    fn data_offset(&self) -> u64 {
        self.gguf().data_offset()
    }

    /// Bytes of the header proper (magic through the last tensor descriptor).
    #[getter]
    fn header_len(&self) -> u64 {
        self.gguf().header_len()
    }

    /// The key/values in file order: `(key, offset, value_type, value_start,
    /// value_end, elem_type, count)`, offsets from the file's start, types as
    /// GGUF's ids (`elem_type` is `None` but for arrays).
    fn kvs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<_> = self
            .metadata()
            .layout()
            .map(|kv| {
                (
                    kv.key,
                    kv.offset,
                    kv.value_type.id(),
                    kv.value.start,
                    kv.value.end,
                    kv.elem_type.map(ValueType::id),
                    kv.count,
                )
            })
            .collect();
        PyList::new(py, items)
    }

    /// The offset of each string of the string array `key`: where its 8-byte
    /// length is, the string's bytes following.
    fn string_offsets<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let md = self.metadata();
        let kv = md
            .layout()
            .find(|kv| kv.key == key)
            .ok_or_else(|| Error::new_err(format!("no key {key:?}")))?;
        let Some(Value::Array(a)) = md.get(key) else {
            return Err(Error::new_err(format!("{key}: not an array")));
        };
        let raw = a.raw_bytes();
        let base = raw.as_ptr() as usize;
        let strings = a.strings().map_err(|e| to_py(py, e))?;
        // Each string's bytes lie inside `raw`, 8 bytes after its length.
        let offsets: Vec<u64> = strings
            .map(|s| kv.value.start + (s.as_bytes().as_ptr() as usize - base) as u64 - 8)
            .collect();
        Ok(PyArray1::from_vec(py, offsets))
    }

    /// The tensors in file order: `(name, ggml_type, offset, nbytes,
    /// descriptor_offset, n_dims)`, `offset` from the data section's start,
    /// `descriptor_offset` (where the tensor's descriptor, its name's 8-byte
    /// length first, sits) from the file's start.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let tensors = self.header.tensors();
        let offsets = self.gguf().descriptor_offsets();
        let items = tensors.iter().zip(offsets).map(|(t, at)| {
            (
                t.name,
                t.ty.ggml_id(),
                t.offset,
                t.nbytes,
                at,
                t.shape.len(),
            )
        });
        PyList::new(py, items)
    }
}
