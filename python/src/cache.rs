//! `weightmap._weightmap._cache_lookup` and `_CacheMiss`: weightmap's
//! transform cache (`weightmap::cache`) for Python code whose transform
//! runs in Python, such as transformers' GGUF conversion
//! (python/python/weightmap/_transformers_cache.py).
//!
//! A lookup either finds a valid entry (its path, its tensors' names, its
//! string metadata, and the entry's file, open, as a `_CacheEntry`) or
//! hands back a `_CacheMiss`, whose `write` stores numpy arrays and strings
//! as the entry, with the GIL released while the bytes are copied, and
//! hands back the file it wrote, open, as a `_CacheEntry` too.
//!
//! Python maps an entry's tensors from that open file
//! (`_CacheEntry.torch_tensors`), never from the entry's path: between the
//! lookup's checks and the map, another fill may rename a file over that
//! path, and a prune or `cache clear` remove it; the open file is the one
//! that was checked (or written) whatever the path names by then.
//!
//! GGUF limits a tensor name to 63 bytes and state dicts have longer ones,
//! so tensors are stored as `t.0`, `t.1`, ... and their names, in order,
//! as the string array [`NAMES`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use weightmap as wm;
use wm::cache::{
    Cache, CacheBypass, EntryContents, Lookup, Miss, PendingEntry, PlannedTensor, TransformId,
};
use wm::gguf::{OwnedValue, Value, ValueType};
use wm::{LoadOptions, Prefetch, TensorType, Weights};

use crate::safe_open::cow_tensors_of_file;
use crate::to_py;

/// The entry's key holding the tensors' real names, in tensor order.
const NAMES: &str = "weightmap.python.tensor_names";

/// The prefix of the library's own keys: never handed to Python, never
/// taken from it.
const OWN_PREFIX: &str = "weightmap.";

/// The cache in `dir`, else the user's (`$WEIGHTMAP_CACHE_DIR`, ...), with
/// the user's limit either way: the library parses
/// `$WEIGHTMAP_CACHE_MAX_SIZE`, and a value that is not a byte count is its
/// `invalid_max_size` (hits serve, nothing is written, the write's reason
/// says why), never a silent default.
fn cache_at(dir: Option<PathBuf>) -> Cache {
    match dir {
        Some(dir) => Cache::new().in_dir(dir),
        None => Cache::new(),
    }
}

/// The options an entry is loaded with here: Python maps the tensors
/// itself (copy-on-write), so nothing is read ahead.
fn entry_options() -> LoadOptions {
    LoadOptions::default().prefetch(Prefetch::None)
}

/// A cache entry's file, open: the very file a lookup checked (every byte)
/// and loaded, or the one a fill wrote. `torch_tensors()` maps this file,
/// never the entry's path, which another fill may rename over, or a prune
/// or `cache clear` remove, between the check and the map.
#[pyclass(frozen, module = "weightmap", name = "_CacheEntry")]
struct CacheEntry {
    file: File,
    /// Where the entry is (or was, when the handle was taken), for messages
    /// and reports only.
    path: PathBuf,
    /// The entry as the lookup loaded it from `file`, kept for its
    /// validated header (a copy of which would be the size of the entry's
    /// metadata, megabytes of vocabulary); `None` for a file a fill wrote,
    /// whose header is read from the file when its tensors are wanted.
    loaded: Option<Weights>,
}

impl CacheEntry {
    /// A handle of its own on `file` (a duplicate: the library's stays
    /// with whoever holds it), which a fill wrote.
    fn written(file: &File, path: &Path) -> PyResult<CacheEntry> {
        Ok(CacheEntry {
            file: file.try_clone()?,
            path: path.to_owned(),
            loaded: None,
        })
    }
}

#[pymethods]
impl CacheEntry {
    /// The entry's path when the handle was taken (what it names now may be
    /// another file, or none).
    #[getter]
    fn path(&self) -> &Path {
        &self.path
    }

    /// Every tensor of the entry (`t.0`, `t.1`, ...), by name in file
    /// order, as CPU torch tensors viewing one copy-on-write mapping of
    /// this open file: zero-copy, file-backed pages shared with every
    /// process mapping the entry; a write into one copies only its page
    /// into this process's memory, never into the file.
    fn torch_tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let read;
        let loaded = match &self.loaded {
            Some(w) => w,
            None => {
                let loaded = py.allow_threads(|| {
                    let len = self
                        .file
                        .metadata()
                        .map_err(|e| wm::Error::io("stat", &self.path, e))?
                        .len();
                    // SAFETY: `load_file_range` requires that nothing
                    // modifies or truncates the file while the weights
                    // live: they live until this function returns, and
                    // the file is a cache entry (or a fill's file), which
                    // weightmap only ever renames or removes whole, which
                    // leaves the open file and its mapping intact; other
                    // writers are the Python user's contract, as for
                    // `weightmap.open`.
                    unsafe { Weights::load_file_range(&self.file, 0, len, &entry_options()) }
                });
                read = loaded.map_err(|e| to_py(py, e))?;
                &read
            }
        };
        cow_tensors_of_file(py, &self.file, loaded.header(), &self.path)
    }

    fn __repr__(&self) -> String {
        format!("<weightmap._CacheEntry {}>", self.path.display())
    }
}

/// Look up the entry of transform `name` at `version` under machine facts
/// `machine` of the model at `source`, in the cache at `dir` (default: the
/// user's). Returns a dict: `hit` (the entry's path, or None), `entry_file`
/// (the entry's file as the lookup checked it, open: a `_CacheEntry`, or
/// None), `names` (its tensors' names) and `metadata` (its string
/// key/values, the library's own left out) on a hit; `miss` (a
/// `_CacheMiss`, or None); `replaced` (why an entry that was there cannot
/// be used, or None); `seconds`.
#[pyfunction]
#[pyo3(signature = (source, name, version, machine, dir = None))]
fn _cache_lookup<'py>(
    py: Python<'py>,
    source: PathBuf,
    name: &str,
    version: u32,
    machine: &str,
    dir: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let started = Instant::now();
    let cache = cache_at(dir);
    let id = TransformId::new(name, version).machine(machine);
    let options = entry_options();
    let found = py.allow_threads(|| {
        // SAFETY: `lookup` requires that nothing modifies or truncates the
        // source or the cache's entries while the weights it returns live.
        // They live until the end of this function, or a hit's as long as
        // its `_CacheEntry`; weightmap only ever renames a whole entry over
        // another or removes one, which leaves a live mapping intact, and
        // a hit's bytes are read only through the mapping of its open file;
        // the source's contract is the Python user's, as for
        // `weightmap.open` (stated in its docstring).
        unsafe { cache.lookup(&source, &id, &options) }
    });
    let found = found.map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    match found {
        Lookup::Hit(cached) => {
            let names = PyList::empty(py);
            let metadata = PyDict::new(py);
            if let Some(md) = cached.weights().gguf_metadata() {
                for (k, v) in md.iter() {
                    match v {
                        Value::Array(a) if k == NAMES => {
                            for item in a.iter() {
                                if let Value::String(s) = item {
                                    names.append(s.to_str().unwrap_or_default())?;
                                }
                            }
                        }
                        Value::String(s) if !k.starts_with(OWN_PREFIX) => {
                            metadata.set_item(k, s.to_str().unwrap_or_default())?;
                        }
                        _ => {}
                    }
                }
            }
            let report = cached.report();
            d.set_item("hit", report.entry.as_ref())?;
            d.set_item("replaced", report.replaced.as_deref())?;
            let path = report.entry.clone();
            let file = cached.entry_file().map(File::try_clone).transpose()?;
            let entry_file = match (file, path) {
                (Some(file), Some(path)) => Some(CacheEntry {
                    file,
                    path,
                    loaded: Some(cached.into_weights()),
                }),
                _ => None,
            };
            d.set_item("entry_file", entry_file)?;
            d.set_item("miss", py.None())?;
            d.set_item("names", names)?;
            d.set_item("metadata", metadata)?;
        }
        Lookup::Miss(miss) => {
            d.set_item("hit", py.None())?;
            d.set_item("entry_file", py.None())?;
            d.set_item("replaced", miss.replaced())?;
            d.set_item("miss", Py::new(py, CacheMiss { miss: Some(miss) })?)?;
            d.set_item("names", py.None())?;
            d.set_item("metadata", py.None())?;
        }
    }
    d.set_item("seconds", started.elapsed().as_secs_f64())?;
    Ok(d)
}

/// A lookup that found no usable entry: `write` stores one.
#[pyclass(module = "weightmap", name = "_CacheMiss")]
struct CacheMiss {
    /// `None` once written.
    miss: Option<Miss>,
}

/// One array to store: where its bytes are and what they are.
struct Bytes {
    ptr: *const u8,
    len: usize,
}

/// Arrays' bytes, read with the GIL released.
struct Arrays {
    planned: Vec<PlannedTensor>,
    bytes: Vec<Bytes>,
    metadata: Vec<(String, OwnedValue)>,
}

// SAFETY: the pointers are into numpy arrays that `write` holds references
// to (so they are neither freed nor moved) for as long as an `Arrays`
// lives; `write`'s contract (its docstring) is that nothing writes to or
// resizes them meanwhile, so reading them from another thread is sound.
unsafe impl Send for Arrays {}

impl EntryContents for Arrays {
    fn tensors(&self) -> Vec<PlannedTensor> {
        self.planned.clone()
    }

    fn metadata(&self) -> Vec<(String, OwnedValue)> {
        self.metadata.clone()
    }

    fn bytes(&self, index: usize) -> Option<&[u8]> {
        let b = &self.bytes[index];
        // SAFETY: `b.ptr` points to `b.len` readable bytes of a live,
        // C-contiguous array that nothing writes meanwhile (see `Send`
        // above), for as long as `self` lives.
        Some(unsafe { std::slice::from_raw_parts(b.ptr, b.len) })
    }

    fn fill(&mut self, index: usize, dst: &mut [u8]) -> Result<(), String> {
        let b = &self.bytes[index];
        if dst.len() != b.len {
            return Err(format!(
                "{} bytes planned, the array holds {}",
                dst.len(),
                b.len
            ));
        }
        // SAFETY: `b.ptr` points to `b.len` readable bytes of a live,
        // C-contiguous array (see `Send` above), and `dst` is the entry's
        // own memory: they do not overlap.
        let src = unsafe { std::slice::from_raw_parts(b.ptr, b.len) };
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// The entry type of an array of dtype `descr`, or of `type_name`
/// (`"BF16"`, `"F32"`, ...) when given, whose size must be the dtype's.
fn tensor_type(
    name: &str,
    array: &Bound<'_, PyUntypedArray>,
    type_name: Option<&str>,
) -> PyResult<TensorType> {
    let descr = array.dtype();
    let itemsize = descr.itemsize();
    let ty = match type_name {
        Some(n) => match n.to_ascii_uppercase().as_str() {
            "F32" => TensorType::F32,
            "F16" => TensorType::F16,
            "BF16" => TensorType::BF16,
            "F64" => TensorType::F64,
            "I8" => TensorType::I8,
            "I16" => TensorType::I16,
            "I32" => TensorType::I32,
            "I64" => TensorType::I64,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: no entry type {n:?}: F32, F16, BF16, F64, I8, I16, I32 or I64"
                )))
            }
        },
        None => {
            let dtype: String = descr.getattr("name")?.extract()?;
            match (descr.kind(), itemsize, dtype.as_str()) {
                (b'f', 4, _) => TensorType::F32,
                (b'f', 2, _) => TensorType::F16,
                (b'f', 8, _) => TensorType::F64,
                (b'i', 1, _) => TensorType::I8,
                (b'i', 2, _) => TensorType::I16,
                (b'i', 4, _) => TensorType::I32,
                (b'i', 8, _) => TensorType::I64,
                (_, 2, "bfloat16") => TensorType::BF16,
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "tensor {name:?}: an entry cannot hold {dtype} arrays: float32, float16, bfloat16, \
                         float64, int8, int16, int32 or int64"
                    )))
                }
            }
        }
    };
    if ty.type_size() != itemsize as u64 {
        return Err(PyValueError::new_err(format!(
            "tensor {name:?}: {} elements are {} bytes, the array's {itemsize}",
            ty.name(),
            ty.type_size()
        )));
    }
    if !descr.is_native_byteorder().unwrap_or(true) {
        return Err(PyValueError::new_err(format!(
            "tensor {name:?}: a byte-swapped array; an entry holds native values"
        )));
    }
    Ok(ty)
}

#[pymethods]
impl CacheMiss {
    /// Why the entry that was there was not used, if there was one.
    #[getter]
    fn replaced(&self) -> Option<&str> {
        self.miss.as_ref().and_then(|m| m.replaced())
    }

    /// Store `tensors` (a list of `(name, array)` or `(name, array,
    /// type_name)`: numpy arrays of 1 to 4 dimensions, float32, float16,
    /// bfloat16 (ml_dtypes), float64 or int8 to int64; `type_name`, one of
    /// "F32", "F16", "BF16", "F64", "I8" ... "I64", takes an array of that
    /// element size as that type, such as a uint16 view of bfloat16) and
    /// `metadata` (str to str; no key under "weightmap.") as the entry.
    /// Non-contiguous arrays are copied first. Nothing may write to or
    /// resize the arrays during the call: the GIL is released while their
    /// bytes are copied into the entry.
    ///
    /// Returns a dict: `outcome` ("filled", or "in_memory" when the cache
    /// cannot take the entry), `entry` (its path, or None), `entry_file`
    /// (the file written, open: a `_CacheEntry`, or None), `reason` (why
    /// not: "read_only", "no_space", "unsafe_directory",
    /// "invalid_max_size", ..., or None), `message`, `replaced`. Once only:
    /// a second call is a ValueError.
    ///
    /// With `commit=False` the bytes are copied into the entry's temporary
    /// file and the call returns: `outcome` "pending", `entry` that file's
    /// path (for messages), `entry_file` that file, open (map it now,
    /// through `entry_file.torch_tensors()`: its bytes stay the entry's
    /// whatever is later renamed over or removes its name), and `pending`,
    /// whose `commit()` waits for the disk and renames the file into place
    /// (and returns a dict as above), with the GIL released, on any thread.
    #[pyo3(signature = (tensors, metadata, commit = true))]
    fn write<'py>(
        &mut self,
        py: Python<'py>,
        tensors: &Bound<'py, PyList>,
        metadata: &Bound<'py, PyDict>,
        commit: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let Some(miss) = self.miss.as_ref() else {
            return Err(PyValueError::new_err("this cache miss was already written"));
        };
        let numpy = py.import("numpy")?;
        // Holds every array (a contiguous copy where needed) until the
        // write is done: `Arrays` points into them.
        let mut held = Vec::with_capacity(tensors.len());
        let mut contents = Arrays {
            planned: Vec::with_capacity(tensors.len()),
            bytes: Vec::with_capacity(tensors.len()),
            metadata: Vec::new(),
        };
        let mut names = Vec::with_capacity(tensors.len());
        for (i, item) in tensors.iter().enumerate() {
            let (name, array, type_name): (String, Bound<'py, PyAny>, Option<String>) =
                match item.len()? {
                    2 => {
                        let (n, a) = item.extract()?;
                        (n, a, None)
                    }
                    _ => item.extract()?,
                };
            let mut array = array
                .downcast_into::<PyUntypedArray>()
                .map_err(|_| PyTypeError::new_err(format!("tensor {name:?}: not a numpy array")))?;
            if !array.is_c_contiguous() {
                array = numpy
                    .call_method1("ascontiguousarray", (array,))?
                    .downcast_into::<PyUntypedArray>()?;
            }
            let ty = tensor_type(&name, &array, type_name.as_deref())?;
            let shape = array.shape();
            if shape.is_empty() || shape.len() > 4 {
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: {} dimensions; an entry holds 1 to 4",
                    shape.len()
                )));
            }
            let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            let len = array.len() * array.dtype().itemsize();
            // SAFETY: `as_array_ptr` is this live array's PyArrayObject;
            // its `data` field points to its elements (C-contiguous, so
            // `len` bytes from there).
            let ptr = unsafe { (*array.as_array_ptr()).data as *const u8 };
            contents.planned.push(PlannedTensor {
                name: format!("t.{i}"),
                ty,
                ne,
            });
            contents.bytes.push(Bytes { ptr, len });
            held.push(array);
            names.push(OwnedValue::String(name));
        }
        contents.metadata.push((
            NAMES.to_owned(),
            OwnedValue::Array(ValueType::String, names),
        ));
        for (k, v) in metadata.iter() {
            let k: String = k.extract()?;
            if k.starts_with(OWN_PREFIX) {
                return Err(PyValueError::new_err(format!(
                    "metadata key {k:?}: keys under {OWN_PREFIX:?} are weightmap's own"
                )));
            }
            let v: String = v.extract()?;
            contents.metadata.push((k, OwnedValue::String(v)));
        }
        let prepared = py.allow_threads(|| miss.prepare(&mut contents));
        drop(held);
        let prepared = prepared.map_err(|e| to_py(py, e))?;
        let replaced = miss.replaced().map(str::to_owned);
        self.miss = None;
        match prepared {
            Ok(pending) if !commit => {
                let d = PyDict::new(py);
                d.set_item("outcome", "pending")?;
                d.set_item("entry", pending.path())?;
                d.set_item(
                    "entry_file",
                    CacheEntry::written(pending.file(), pending.path())?,
                )?;
                d.set_item("reason", py.None())?;
                d.set_item("message", py.None())?;
                d.set_item("replaced", replaced.clone())?;
                let pending = CachePending {
                    pending: Some(pending),
                    replaced,
                };
                d.set_item("pending", Py::new(py, pending)?)?;
                Ok(d)
            }
            Ok(pending) => commit_dict(py, pending, replaced),
            Err(why) => written_dict(py, Err(why), None, replaced),
        }
    }

    fn __repr__(&self) -> String {
        match &self.miss {
            Some(_) => "<weightmap._CacheMiss>".to_owned(),
            None => "<weightmap._CacheMiss (written)>".to_owned(),
        }
    }
}

/// Commit `pending` with the GIL released: what `write` returns. The file
/// written is kept open first: once renamed into place it is the entry, and
/// a caller maps it from that handle, not from the entry's path.
fn commit_dict(
    py: Python<'_>,
    pending: PendingEntry,
    replaced: Option<String>,
) -> PyResult<Bound<'_, PyDict>> {
    let file = pending.file().try_clone()?;
    let written = py.allow_threads(|| pending.commit());
    written_dict(py, written, Some(file), replaced)
}

/// What `write` returns: `outcome`, `entry`, `entry_file` (`file`, the
/// file written, when the entry is in place), `reason`, `message`,
/// `replaced`.
fn written_dict(
    py: Python<'_>,
    written: Result<PathBuf, CacheBypass>,
    file: Option<File>,
    replaced: Option<String>,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    match written {
        Ok(path) => {
            let entry_file = file.map(|file| CacheEntry {
                file,
                path: path.clone(),
                loaded: None,
            });
            d.set_item("outcome", "filled")?;
            d.set_item("entry", path)?;
            d.set_item("entry_file", entry_file)?;
            d.set_item("reason", py.None())?;
            d.set_item("message", py.None())?;
        }
        Err(why) => {
            d.set_item("outcome", "in_memory")?;
            d.set_item("entry", py.None())?;
            d.set_item("entry_file", py.None())?;
            d.set_item("reason", why.name())?;
            d.set_item("message", why.to_string())?;
        }
    }
    d.set_item("replaced", replaced)?;
    Ok(d)
}

/// An entry written but not committed (`_CacheMiss.write(commit=False)`).
/// Dropped uncommitted, its temporary file is removed (a mapping of it
/// keeps its bytes).
#[pyclass(module = "weightmap", name = "_CachePending")]
struct CachePending {
    /// `None` once committed.
    pending: Option<PendingEntry>,
    replaced: Option<String>,
}

#[pymethods]
impl CachePending {
    /// Wait for the entry's bytes to reach the disk and rename it into
    /// place, with the GIL released: a dict as `_CacheMiss.write` returns.
    /// Once only: a second call is a ValueError.
    fn commit<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some(pending) = self.pending.take() else {
            return Err(PyValueError::new_err("this entry was already committed"));
        };
        commit_dict(py, pending, self.replaced.clone())
    }

    fn __repr__(&self) -> String {
        match &self.pending {
            Some(p) => format!("<weightmap._CachePending {}>", p.path().display()),
            None => "<weightmap._CachePending (committed)>".to_owned(),
        }
    }
}

/// Add the cache's functions and class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_cache_lookup, m)?)?;
    m.add_class::<CacheMiss>()?;
    m.add_class::<CachePending>()?;
    m.add_class::<CacheEntry>()?;
    Ok(())
}
