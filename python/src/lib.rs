//! Python bindings of weightmap: `weightmap.open(path)` maps a GGUF or
//! safetensors model read-only and hands out its tensors as read-only numpy
//! arrays that point into the mapping (zero-copy).
//!
//! Lifetime: every array's `base` is an `_Owner`, a Python object holding an
//! `Arc<weightmap::Weights>`. The mapping (or, in stream mode, the owned
//! buffers) lives while the handle or any array made from it does, so
//! arrays outlive `with` blocks, `close()` and the handle itself.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;

use numpy::npyffi::{self, npy_intp, NpyTypes, NPY_ARRAY_WRITEABLE, PY_ARRAY_API};
use numpy::{
    PyArray1, PyArrayDescr, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyFileNotFoundError, PyIndexError, PyKeyError, PyOSError, PyPermissionError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyTuple};

mod cache;
mod gguf;
mod safe_open;

use weightmap as wm;
use wm::gguf::Value;
use wm::{LoadMode, LoadOptions, TensorInfo, TensorType};

create_exception!(
    weightmap,
    Error,
    PyValueError,
    "An error from weightmap: an invalid or inconsistent file, an unsupported \
     operation, a refused copy. `kind` is the category (\"invalid_file\", \
     \"unsupported\", ...) and `name` the error's stable name."
);

/// The Python exception for a library error.
pub(crate) fn to_py(py: Python<'_>, e: wm::Error) -> PyErr {
    let msg = e.to_string();
    if let wm::Error::Io { source, .. } = &e {
        let errno = source.raw_os_error().unwrap_or(0);
        return match source.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err((errno, msg)),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err((errno, msg)),
            _ => PyOSError::new_err((errno, msg)),
        };
    }
    if let wm::Error::TensorNotFound { .. } = &e {
        return PyKeyError::new_err(msg);
    }
    let err = Error::new_err(msg);
    let value = err.value(py);
    // Best effort: an exception without these attributes is still the error.
    let _ = value.setattr("kind", e.kind().name());
    let _ = value.setattr("name", e.name());
    err
}

/// What keeps a model's memory alive: the `base` of every array handed out.
#[pyclass(frozen, module = "weightmap", name = "_Owner")]
pub(crate) struct Owner {
    pub(crate) weights: Arc<wm::Weights>,
}

/// A loaded model. Made by `weightmap.open`.
#[pyclass(module = "weightmap", name = "Weights")]
struct PyWeights {
    /// `None` once closed.
    owner: Option<Py<Owner>>,
    path: String,
    mode: &'static str,
}

impl PyWeights {
    fn owner<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, Owner>> {
        match &self.owner {
            Some(o) => Ok(o.bind(py)),
            None => Err(PyValueError::new_err(
                "I/O operation on closed weightmap.Weights",
            )),
        }
    }

    fn weights(&self, py: Python<'_>) -> PyResult<Arc<wm::Weights>> {
        Ok(Arc::clone(&self.owner(py)?.get().weights))
    }
}

/// `numpy.dtype(spec)`.
fn np_dtype<'py>(py: Python<'py>, spec: &str) -> PyResult<Bound<'py, PyArrayDescr>> {
    Ok(py
        .import("numpy")?
        .getattr("dtype")?
        .call1((spec,))?
        .downcast_into::<PyArrayDescr>()?)
}

/// `numpy.dtype(ml_dtypes.<name>)`; when ml_dtypes is not importable,
/// `numpy.dtype(fallback)` (bit patterns), or a `TypeError` if `strict`.
fn ml_dtype<'py>(
    py: Python<'py>,
    name: &str,
    fallback: &str,
    strict: bool,
) -> PyResult<Bound<'py, PyArrayDescr>> {
    match py.import("ml_dtypes") {
        Ok(m) => Ok(py
            .import("numpy")?
            .getattr("dtype")?
            .call1((m.getattr(name)?,))?
            .downcast_into::<PyArrayDescr>()?),
        Err(_) if strict => Err(PyTypeError::new_err(format!(
            "numpy has no {name} type: install ml_dtypes (pip install ml_dtypes), \
             or use framework=\"pt\""
        ))),
        Err(_) => np_dtype(py, fallback),
    }
}

/// Element shape in numpy order (outermost first).
fn np_shape(info: &TensorInfo<'_>) -> Vec<u64> {
    let mut ne = info.ne();
    ne.reverse();
    ne
}

/// How a tensor's raw bytes are exposed, whatever the framework: as
/// elements of a plain type, or (block-quantized types, and anything else
/// without an element type) as bytes with the last dimension in bytes per
/// row, as gguf-py gives them.
pub(crate) enum Layout {
    Elements(TensorType),
    Bytes,
}

/// The layout and shape (numpy order) of a tensor's bytes.
pub(crate) fn layout(info: &TensorInfo<'_>) -> PyResult<(Layout, Vec<u64>)> {
    let mut shape = np_shape(info);
    let ty = info.ty;
    // One element a block: the plain types, numpy and torch have them all.
    if !ty.is_quantized() {
        return Ok((Layout::Elements(ty), shape));
    }
    // Block-quantized: bytes, one row of blocks per last index.
    let ne0 = shape.last().copied().unwrap_or(1);
    let row = ty.row_size(ne0).ok_or_else(|| {
        Error::new_err(format!(
            "{}: {} elements per row is not a whole number of {} blocks",
            info.name,
            ne0,
            ty.name()
        ))
    })?;
    match shape.last_mut() {
        Some(last) => *last = row,
        None => shape.push(row),
    }
    Ok((Layout::Bytes, shape))
}

/// The dtype and numpy shape a tensor's raw bytes are exposed with: as
/// gguf-py (GGUF) and `safetensors.numpy` (safetensors) give them; a
/// block-quantized type is uint8 with the last dimension in bytes per row;
/// bf16 and the 8-bit floats are ml_dtypes types when it is importable,
/// else uint16 / uint8 bit patterns (or a `TypeError`, if `strict`).
fn raw_layout<'py>(
    py: Python<'py>,
    info: &TensorInfo<'_>,
    strict: bool,
) -> PyResult<(Bound<'py, PyArrayDescr>, Vec<u64>)> {
    let (layout, shape) = layout(info)?;
    let sub_byte = matches!(
        info.ty,
        TensorType::F4 | TensorType::F6_E2M3 | TensorType::F6_E3M2
    );
    if strict && sub_byte {
        // safetensors.numpy has no type for them either.
        return Err(PyTypeError::new_err(format!(
            "{}: numpy has no {} type: use framework=\"pt\" (torch.float4_e2m1fn_x2 for \
             F4), or weightmap.open for the packed bytes",
            info.name,
            info.ty.name().to_ascii_uppercase()
        )));
    }
    let ty = match layout {
        Layout::Bytes => return Ok((np_dtype(py, "|u1")?, shape)),
        Layout::Elements(ty) => ty,
    };
    let ml = |name, fallback| ml_dtype(py, name, fallback, strict);
    let descr = match ty {
        TensorType::F32 => np_dtype(py, "<f4")?,
        TensorType::F16 => np_dtype(py, "<f2")?,
        TensorType::F64 => np_dtype(py, "<f8")?,
        TensorType::I8 => np_dtype(py, "|i1")?,
        TensorType::I16 => np_dtype(py, "<i2")?,
        TensorType::I32 => np_dtype(py, "<i4")?,
        TensorType::I64 => np_dtype(py, "<i8")?,
        TensorType::U8 => np_dtype(py, "|u1")?,
        TensorType::U16 => np_dtype(py, "<u2")?,
        TensorType::U32 => np_dtype(py, "<u4")?,
        TensorType::U64 => np_dtype(py, "<u8")?,
        TensorType::Bool => np_dtype(py, "|b1")?,
        TensorType::C64 => np_dtype(py, "<c8")?,
        TensorType::BF16 => ml("bfloat16", "<u2")?,
        TensorType::F8_E4M3 => ml("float8_e4m3fn", "|u1")?,
        TensorType::F8_E5M2 => ml("float8_e5m2", "|u1")?,
        TensorType::F8_E4M3FNUZ => ml("float8_e4m3fnuz", "|u1")?,
        TensorType::F8_E5M2FNUZ => ml("float8_e5m2fnuz", "|u1")?,
        TensorType::F8_E8M0 => ml("float8_e8m0fnu", "|u1")?,
        // A plain type added to the library after these arms were written.
        other => {
            return Err(PyTypeError::new_err(format!(
                "{}: no numpy dtype for {}",
                info.name,
                other.name()
            )))
        }
    };
    Ok((descr, shape))
}

/// A read-only array of `descr` and `shape` over `len` bytes at `data`,
/// whose `base` is `base` (which must keep the bytes alive and unchanged).
///
/// # Safety
/// `data` must point to `len` readable bytes that stay valid and unchanged
/// while `base` lives.
unsafe fn borrowed_array<'py>(
    py: Python<'py>,
    descr: Bound<'py, PyArrayDescr>,
    shape: &[u64],
    data: *const u8,
    len: usize,
    base: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded to the caller; the array is read-only.
    unsafe { new_array(py, descr, shape, data.cast_mut(), len, base, false) }
}

/// A writable array of `descr` and `shape` over `len` bytes at `data`,
/// whose `base` is `base`.
///
/// # Safety
/// `data` must point to `len` bytes, readable and writable, that stay valid
/// while `base` lives and that nothing else reads or writes as Rust data
/// (numpy, and whatever views the array, may write to them).
pub(crate) unsafe fn writable_array<'py>(
    py: Python<'py>,
    descr: Bound<'py, PyArrayDescr>,
    shape: &[u64],
    data: *mut u8,
    len: usize,
    base: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded to the caller.
    unsafe { new_array(py, descr, shape, data, len, base, true) }
}

/// An array over `len` bytes at `data`, writable or not, whose `base` is `base`.
///
/// # Safety
/// As `borrowed_array` (read-only) or `writable_array` (writable).
unsafe fn new_array<'py>(
    py: Python<'py>,
    descr: Bound<'py, PyArrayDescr>,
    shape: &[u64],
    data: *mut u8,
    len: usize,
    base: Bound<'py, PyAny>,
    writeable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let itemsize = descr.itemsize() as u128;
    let mut dims = Vec::with_capacity(shape.len());
    let mut n: u128 = 1;
    for &d in shape {
        dims.push(npy_intp::try_from(d).map_err(|_| Error::new_err("dimension too large"))?);
        n = n.saturating_mul(u128::from(d));
    }
    // Never let numpy read past the tensor's bytes.
    if n.saturating_mul(itemsize) != len as u128 {
        return Err(Error::new_err(format!(
            "{len} bytes do not hold {n} elements of {itemsize} bytes"
        )));
    }
    let nd = std::os::raw::c_int::try_from(dims.len())
        .map_err(|_| Error::new_err("too many dimensions"))?;
    // SAFETY: the API table is numpy's, loaded by rust-numpy; `descr` is a
    // new reference that NewFromDescr steals; `dims` has `nd` entries; null
    // strides mean C order; `data` covers the array (checked above). Flags
    // 0 make it read-only (NPY_ARRAY_WRITEABLE unset), and the flag is
    // cleared again below in case numpy set it; a writable array is asked
    // for only over memory the caller says may be written.
    unsafe {
        let flags = if writeable { NPY_ARRAY_WRITEABLE } else { 0 };
        let arr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_ptr() as *mut npyffi::PyArray_Descr,
            nd,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data as *mut c_void,
            flags,
            std::ptr::null_mut(),
        );
        if arr.is_null() {
            return Err(PyErr::fetch(py));
        }
        // Owns the new array: dropped (decref'd) on any error below.
        let arr = Bound::from_owned_ptr(py, arr);
        let a = arr.as_ptr() as *mut npyffi::PyArrayObject;
        if !writeable {
            (*a).flags &= !NPY_ARRAY_WRITEABLE;
        }
        // SetBaseObject steals the reference to `base`, also on failure.
        if PY_ARRAY_API.PyArray_SetBaseObject(py, a, base.into_ptr()) < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}

/// The tensor `name` of the model that `owner` keeps alive, as a read-only
/// array. `strict`: a type numpy lacks without ml_dtypes is a `TypeError`,
/// not bit patterns.
pub(crate) fn tensor_array<'py>(
    py: Python<'py>,
    owner: &Bound<'py, Owner>,
    name: &str,
    strict: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let weights = &owner.get().weights;
    if weights.tensor_index(name).is_none() {
        return Err(PyKeyError::new_err(name.to_owned()));
    }
    let t = weights.tensor(name).map_err(|e| to_py(py, e))?;
    let (descr, shape) = raw_layout(py, &t.info(), strict)?;
    match t.host_bytes() {
        // SAFETY: the bytes are the mapping's (or the stream path's owned
        // buffer's), owned by the `Weights` that `owner` holds an `Arc` of;
        // they live as long as it does and nothing writes to them (the
        // mapping is read-only; the array is too). That the file itself
        // does not change is the contract `open` documents.
        Some(bytes) => unsafe {
            borrowed_array(
                py,
                descr,
                &shape,
                bytes.as_ptr(),
                bytes.len(),
                owner.clone().into_any(),
            )
        },
        None => {
            // Not host memory: a copy, held by an immutable bytes object.
            let v = t.to_vec().map_err(|e| to_py(py, e))?;
            let b = PyBytes::new(py, &v);
            let (ptr, len) = (b.as_bytes().as_ptr(), b.as_bytes().len());
            // SAFETY: a bytes object's buffer is immutable and lives as long as it.
            unsafe { borrowed_array(py, descr, &shape, ptr, len, b.into_any()) }
        }
    }
}

/// A GGUF metadata value as a Python value.
fn value_to_py<'py>(py: Python<'py>, v: &Value<'_>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match *v {
        Value::U8(x) => x.into_pyobject(py)?.into_any(),
        Value::I8(x) => x.into_pyobject(py)?.into_any(),
        Value::U16(x) => x.into_pyobject(py)?.into_any(),
        Value::I16(x) => x.into_pyobject(py)?.into_any(),
        Value::U32(x) => x.into_pyobject(py)?.into_any(),
        Value::I32(x) => x.into_pyobject(py)?.into_any(),
        Value::U64(x) => x.into_pyobject(py)?.into_any(),
        Value::I64(x) => x.into_pyobject(py)?.into_any(),
        Value::F32(x) => f64::from(x).into_pyobject(py)?.into_any(),
        Value::F64(x) => x.into_pyobject(py)?.into_any(),
        Value::Bool(x) => x.into_pyobject(py)?.to_owned().into_any(),
        Value::String(s) => match s.to_str() {
            Some(s) => s.into_pyobject(py)?.into_any(),
            // Not UTF-8: the raw bytes.
            None => PyBytes::new(py, s.as_bytes()).into_any(),
        },
        Value::Array(a) => {
            let list = PyList::empty(py);
            for item in a.iter() {
                list.append(value_to_py(py, &item)?)?;
            }
            list.into_any()
        }
    })
}

/// GGUF key/values (in file order, as Python values) or safetensors'
/// `__metadata__` map, as a dict.
pub(crate) fn metadata_dict<'py>(
    py: Python<'py>,
    gguf: Option<wm::gguf::Metadata<'_>>,
    safetensors: Option<&std::collections::BTreeMap<String, String>>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    if let Some(md) = gguf {
        for (k, v) in md.iter() {
            d.set_item(k, value_to_py(py, &v)?)?;
        }
    } else if let Some(md) = safetensors {
        for (k, v) in md {
            d.set_item(k, v)?;
        }
    }
    Ok(d)
}

#[pymethods]
impl PyWeights {
    /// Tensor names, in file order (shard order, then file order, for a split model).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let w = self.weights(py)?;
        PyList::new(py, w.tensor_infos().map(|t| t.name))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.weights(py)?.len())
    }

    fn __contains__(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        Ok(self.weights(py)?.tensor_index(name).is_some())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.keys(py)?.try_iter()?.into_any())
    }

    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.get_tensor(py, name)
    }

    /// The tensor's bytes as a read-only numpy array, zero-copy: a view of
    /// the mapping (mmap mode) or of the loader's own buffer (stream mode).
    fn get_tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let owner = self.owner(py)?.clone();
        tensor_array(py, &owner, name, false)
    }

    /// The tensor dequantized (or converted) to a new float32 array of its
    /// element shape (numpy order).
    fn get_f32<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let w = self.weights(py)?;
        if w.tensor_index(name).is_none() {
            return Err(PyKeyError::new_err(name.to_owned()));
        }
        let t = w.tensor(name).map_err(|e| to_py(py, e))?;
        let shape: Vec<usize> = np_shape(&t.info())
            .into_iter()
            .map(usize::try_from)
            .collect::<Result<_, _>>()
            .map_err(|_| Error::new_err("dimension too large"))?;
        let v = t.to_f32_vec().map_err(|e| to_py(py, e))?;
        let arr = PyArray1::from_vec(py, v);
        Ok(arr.reshape(shape)?.into_any())
    }

    /// Metadata: GGUF key/values (in file order, the first shard's for a
    /// split model) as Python values; for safetensors the `__metadata__` map.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.weights(py)?;
        metadata_dict(py, w.gguf_metadata(), w.safetensors_metadata())
    }

    /// A tensor's descriptor: name, type, ggml_type (id or None), shape
    /// (element shape, numpy order), ne (ggml order), nbytes, offset (from
    /// the data section), file_offset, block_size, type_size.
    fn info<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let w = self.weights(py)?;
        if w.tensor_index(name).is_none() {
            return Err(PyKeyError::new_err(name.to_owned()));
        }
        let t = w.tensor(name).map_err(|e| to_py(py, e))?.info();
        let d = PyDict::new(py);
        d.set_item("name", t.name)?;
        d.set_item("type", t.ty.name())?;
        d.set_item("ggml_type", t.ty.ggml_id())?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, np_shape(&t))?)?;
        d.set_item("ne", pyo3::types::PyTuple::new(py, t.ne())?)?;
        d.set_item("nbytes", t.nbytes)?;
        d.set_item("offset", t.offset)?;
        d.set_item("file_offset", t.file_offset)?;
        d.set_item("block_size", t.ty.block_size())?;
        d.set_item("type_size", t.ty.type_size())?;
        Ok(d)
    }

    /// A few fields of the load report.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.weights(py)?;
        let r = w.report();
        let d = PyDict::new(py);
        d.set_item("format", r.format.name())?;
        d.set_item("mode_requested", r.mode_requested.name())?;
        d.set_item("mode_used", r.mode_used.name())?;
        d.set_item("fallback", r.fallback.as_ref().map(|f| f.name()))?;
        d.set_item(
            "fallback_detail",
            r.fallback.as_ref().map(|f| f.to_string()),
        )?;
        d.set_item("tensors_count", r.tensors_count)?;
        d.set_item("tensors_mapped", r.tensors_mapped)?;
        d.set_item("tensors_copied", r.tensors_copied)?;
        d.set_item("bytes_mapped", r.bytes_mapped)?;
        d.set_item("bytes_copied", r.bytes_copied)?;
        d.set_item("file_len", r.file_len)?;
        d.set_item("shards", r.shards.len().max(1))?;
        d.set_item("budget_bytes", r.budget.bytes)?;
        d.set_item("budget_source", &r.budget.source)?;
        d.set_item("budget_limit", r.budget.limit)?;
        d.set_item("budget_usage", r.budget.usage)?;
        d.set_item("budget_reclaimable", r.budget.reclaimable)?;
        d.set_item("budget_own_cached", r.budget.own_cached)?;
        d.set_item("reread_small_folios", r.reread.to_string())?;
        d.set_item("residency", r.residency.to_string())?;
        Ok(d)
    }

    /// How many bytes of the tensors sit in huge pages now (see
    /// `huge_pages_dict`).
    fn huge_pages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.weights(py)?;
        huge_pages_dict(py, &w)
    }

    /// Announce what the runtime reads next: each need a tensor (its name
    /// or index), or a pair of a tensor and the experts (ints, as a router
    /// gives them) whose slices of it are read. Their reads are queued and
    /// this returns without waiting for them (over the budget, the experts'
    /// slices are queued before it returns); every need is checked
    /// first (KeyError for a name, IndexError for an index, weightmap.Error
    /// for an expert that is not there), and then nothing is read. With
    /// `likely=True`, the needs are a guess (a predictor's of the experts a
    /// router will choose), read only with the device's spare time and the
    /// budget's spare room: never before, or at the cost of, what was
    /// announced; a later announcement of the same tensor supersedes it.
    #[pyo3(signature = (needs, likely = false))]
    fn prefetch(&self, py: Python<'_>, needs: Vec<Bound<'_, PyAny>>, likely: bool) -> PyResult<()> {
        let w = self.weights(py)?;
        let mut parsed: Vec<(usize, Vec<i32>)> = Vec::with_capacity(needs.len());
        for need in &needs {
            parsed.push(match need.downcast::<PyTuple>() {
                Ok(pair) => {
                    let [t, experts] =
                        <[Bound<'_, PyAny>; 2]>::try_from(pair.iter().collect::<Vec<_>>())
                            .map_err(|_| {
                                PyTypeError::new_err(format!(
                                    "a need is a tensor or a (tensor, experts) pair, not {need}"
                                ))
                            })?;
                    let index = need_tensor(&w, &t)?;
                    (index, need_experts(&t, &experts)?)
                }
                Err(_) => (need_tensor(&w, need)?, Vec::new()),
            });
        }
        let needs: Vec<wm::Need<'_>> = parsed
            .iter()
            .map(|(t, experts)| wm::Need::experts(*t, experts))
            .collect();
        let announced = match likely {
            true => w.prefetch_likely(&needs),
            false => w.prefetch(&needs),
        };
        announced.map_err(|e| match e {
            wm::Error::TensorIndex { .. } => PyIndexError::new_err(e.to_string()),
            e => to_py(py, e),
        })
    }

    /// Drop this handle's reference to the model. Arrays already handed out
    /// stay valid (they keep the mapping alive); the handle can no longer be used.
    fn close(&mut self) {
        self.owner = None;
    }

    /// Whether `close` was called (or the `with` block ended).
    #[getter]
    fn closed(&self) -> bool {
        self.owner.is_none()
    }

    /// The path given to `open`.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The mode asked for: "mmap" or "stream" (see `report()["mode_used"]`).
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode
    }

    /// "gguf" or "safetensors".
    #[getter]
    fn format(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(self.weights(py)?.format().name())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.weights(py) {
            Ok(w) => format!(
                "<weightmap.Weights {} {:?}: {} tensors, {}>",
                w.format().name(),
                self.path,
                w.len(),
                w.report().mode_used.name()
            ),
            Err(_) => format!("<weightmap.Weights {:?} (closed)>", self.path),
        }
    }
}

/// The options `open` and `safe_open` load with: `huge_pages` for the owned
/// CPU buffers (the stream path, copied tensors), and the re-read of small
/// page-cache folios.
fn load_options(mode: LoadMode, huge_pages: bool, reread_small_folios: bool) -> LoadOptions {
    let cpu = wm::buffer::CpuBufferType::new().huge_pages(huge_pages);
    LoadOptions::default()
        .mode(mode)
        .buffer_type(Arc::new(cpu))
        .reread_small_folios(reread_small_folios)
}

/// `Weights::huge_pages` measured now, as a dict: `mapped_bytes`,
/// `mapped_resident`, `mapped_huge`, `mapped_huge_capacity`,
/// `mapped_small`, `owned_bytes`, `owned_huge` (`None` where this platform
/// cannot tell), and `reread_bytes`, what the prefetch re-read.
fn huge_pages_dict<'py>(py: Python<'py>, w: &wm::Weights) -> PyResult<Bound<'py, PyDict>> {
    let h = py.allow_threads(|| w.huge_pages());
    let d = PyDict::new(py);
    d.set_item("mapped_bytes", h.mapped_bytes)?;
    d.set_item("mapped_resident", h.mapped_resident)?;
    d.set_item("mapped_huge", h.mapped_huge)?;
    d.set_item("mapped_huge_capacity", h.mapped_huge_capacity)?;
    d.set_item("mapped_small", h.mapped_small())?;
    d.set_item("owned_bytes", h.owned_bytes)?;
    d.set_item("owned_huge", h.owned_huge)?;
    let reread = w.prefetch_progress().map_or(0, |p| p.bytes_reread);
    d.set_item("reread_bytes", reread)?;
    Ok(d)
}

/// Open a model: a GGUF or safetensors file, any shard of a split GGUF, a
/// `*.safetensors.index.json`, or a directory holding one.
///
/// mode="mmap" (default) maps the files read-only (falling back to reading
/// them, as `report()` says, when mapping cannot be used); arrays from
/// `get_tensor` are views of the mapping. The file must not be modified or
/// truncated while the handle or any array from it lives: a changed file
/// changes the arrays, and a truncated one crashes the process (SIGBUS) when
/// they are read. If that cannot be promised, use mode="stream", which reads
/// the tensors into memory the arrays then view.
///
/// huge_pages=False puts owned buffers (mode="stream", copied tensors) in
/// base pages rather than transparent huge pages. reread_small_folios=True
/// re-reads, once the prefetch has mapped the file, what the page cache
/// held in small folios (`report()["reread_small_folios"]` says whether it
/// could; `huge_pages()` measures the result).
#[pyfunction]
#[pyo3(signature = (path, mode = "mmap", *, huge_pages = true, reread_small_folios = false))]
fn open(
    py: Python<'_>,
    path: PathBuf,
    mode: &str,
    huge_pages: bool,
    reread_small_folios: bool,
) -> PyResult<PyWeights> {
    let opts = |mode| load_options(mode, huge_pages, reread_small_folios);
    let (mode, loaded) = match mode {
        "mmap" => {
            let p = path.clone();
            let r = py.allow_threads(move || {
                // SAFETY: `Weights::load` requires that the files are not
                // modified or truncated while the weights (and every view of
                // them) live. The bindings cannot promise that, so the
                // contract is passed on to the Python user: it is stated in
                // this function's docstring (and python/README.md), and
                // mode="stream" is there for callers who cannot keep it.
                unsafe { wm::Weights::load(&p, &opts(LoadMode::Mmap)) }
            });
            ("mmap", r)
        }
        "stream" => {
            let p = path.clone();
            let r =
                py.allow_threads(move || wm::Weights::load_streamed(&p, &opts(LoadMode::Stream)));
            ("stream", r)
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "mode must be \"mmap\" or \"stream\", not {other:?}"
            )))
        }
    };
    let weights = loaded.map_err(|e| to_py(py, e))?;
    let owner = Py::new(
        py,
        Owner {
            weights: Arc::new(weights),
        },
    )?;
    Ok(PyWeights {
        owner: Some(owner),
        path: path.to_string_lossy().into_owned(),
        mode,
    })
}

/// Dequantize `data`, the raw bytes of whole blocks of the ggml type with
/// id `ggml_type` (a C-contiguous uint8 array of any shape, read in place),
/// into a new float32 array of `n` elements, bit for bit as ggml (and
/// `gguf.quants.dequantize`) do. `weightmap.gguf.dequantize` shapes it.
///
/// The bytes are read without the GIL, as numpy's own functions read their
/// inputs: another thread writing the array meanwhile gets undefined
/// results.
#[pyfunction]
fn _dequantize<'py>(
    py: Python<'py>,
    data: PyReadonlyArrayDyn<'py, u8>,
    ggml_type: u32,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let ty = TensorType::from_ggml_id(ggml_type)
        .ok_or_else(|| Error::new_err(format!("unknown ggml type {ggml_type}")))?;
    if !data.is_c_contiguous() {
        return Err(PyValueError::new_err("data: not a C-contiguous array"));
    }
    let bytes = data
        .as_slice()
        .map_err(|_| PyValueError::new_err("data: not a contiguous array"))?;
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    if bytes.len() % ts != 0 {
        return Err(Error::new_err(format!(
            "{} bytes are not a whole number of {} blocks ({ts} bytes each)",
            bytes.len(),
            ty.name()
        )));
    }
    let n = bytes.len() / ts * bs;
    let mut out = vec![0f32; n];
    py.allow_threads(|| wm::quant::dequantize(ty, bytes, &mut out))
        .map_err(|e| to_py(py, e))?;
    Ok(PyArray1::from_vec(py, out))
}

/// The extension module, `weightmap._weightmap`; the package `weightmap`
/// (python/python/weightmap/) re-exports it.
#[pymodule]
#[pyo3(name = "_weightmap")]
fn weightmap_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add_class::<PyWeights>()?;
    m.add_class::<Owner>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    safe_open::register(m)?;
    cache::register(m)?;
    m.add_class::<gguf::GgufLayout>()?;
    m.add_function(wrap_pyfunction!(_dequantize, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// The tensor a need names: its name, or its index (an int; a bool, which
/// Python counts as an int, is refused rather than taken as 0 or 1).
fn need_tensor(w: &wm::Weights, t: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(name) = t.extract::<String>() {
        return w
            .tensor_index(&name)
            .ok_or_else(|| PyKeyError::new_err(name));
    }
    if t.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "a tensor is a name or an int index, not the bool {t}"
        )));
    }
    match t.extract::<i128>() {
        Ok(i) => usize::try_from(i)
            .ok()
            .filter(|&i| i < w.len())
            .ok_or_else(|| {
                PyIndexError::new_err(format!("no tensor {i}: the weights hold {}", w.len()))
            }),
        Err(_) => Err(PyTypeError::new_err(format!(
            "a tensor is a name or an int index, not {}",
            t.repr().map_or_else(|_| "that".into(), |r| r.to_string())
        ))),
    }
}

/// The experts of a need on tensor `t`: a sequence of ints (not a string,
/// not bools), each within 32 bits as a router's ids are. The error names
/// the tensor and the list.
fn need_experts(t: &Bound<'_, PyAny>, experts: &Bound<'_, PyAny>) -> PyResult<Vec<i32>> {
    let bad = |why: String| PyTypeError::new_err(format!("the experts of {t}, {experts}: {why}"));
    if experts.extract::<String>().is_ok() || experts.is_none() {
        return Err(bad("not a list of ints".into()));
    }
    let items = experts
        .try_iter()
        .map_err(|_| bad("not a list of ints".into()))?;
    let mut ids = Vec::new();
    for item in items {
        let item = item?;
        if item.is_instance_of::<PyBool>() {
            return Err(bad(format!("{item} is a bool, not an expert id")));
        }
        let id = item.extract::<i128>().map_err(|_| {
            bad(format!(
                "{} is not an int",
                item.repr()
                    .map_or_else(|_| "an item".into(), |r| r.to_string())
            ))
        })?;
        // Within 32 bits, the tensor says which ids it holds
        // (weightmap.Error, "no_such_expert").
        let id = i32::try_from(id).map_err(|_| {
            PyValueError::new_err(format!(
                "the experts of {t}, {experts}: {id} is not an expert id (a 32-bit int)"
            ))
        })?;
        ids.push(id);
    }
    Ok(ids)
}
