//! `weightmap.safe_open`: safetensors' `safe_open` surface over anything
//! `weightmap.open` loads (safetensors, GGUF, a split GGUF, sharded
//! safetensors), for numpy and torch, zero-copy.
//!
//! - numpy (`"np"`, `"numpy"`): the model is loaded as `weightmap.open`
//!   loads it (mapped `PROT_READ`), and each tensor is a read-only array
//!   whose `base` keeps the mapping alive.
//! - torch (`"pt"`, `"torch"`, `"pytorch"`): torch has no read-only tensors,
//!   and a write into a `PROT_READ` mapping kills the process. So every file
//!   is mapped again, copy-on-write (`MAP_PRIVATE`, `PROT_READ |
//!   PROT_WRITE`): a tensor is a view of that mapping, reads share the page
//!   cache, and a write copies only the page written into private anonymous
//!   memory; it never reaches the file. Offsets and sizes come from
//!   weightmap's validated headers (`ModelHeaders::read`), never from a
//!   parse of our own, and each range is checked against the mapping.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::exceptions::{
    PyFileNotFoundError, PyImportError, PyKeyError, PyOSError, PyPermissionError, PyTypeError,
    PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule, PyTuple};

use weightmap as wm;
use wm::{Format, Header, LoadOptions, ModelHeaders, TensorInfo, TensorType};

use crate::{layout, metadata_dict, tensor_array, to_py, writable_array, Error, Layout, Owner};

/// The frameworks `safe_open` gives tensors for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framework {
    Numpy,
    Torch,
}

impl Framework {
    /// safetensors' names for the two frameworks weightmap serves.
    fn parse(name: &str) -> PyResult<Framework> {
        match name {
            "np" | "numpy" => Ok(Framework::Numpy),
            "pt" | "torch" | "pytorch" => Ok(Framework::Torch),
            "tf" | "tensorflow" | "jax" | "flax" | "mlx" | "paddle" => {
                Err(PyValueError::new_err(format!(
                    "framework {name:?} is not supported by weightmap.safe_open: \
                     use \"np\" (or \"numpy\") or \"pt\" (or \"torch\", \"pytorch\")"
                )))
            }
            _ => Err(PyValueError::new_err(format!(
                "framework {name:?} is invalid: use \"np\" (or \"numpy\") or \"pt\" \
                 (or \"torch\", \"pytorch\")"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Framework::Numpy => "numpy",
            Framework::Torch => "pytorch",
        }
    }
}

/// One file mapped copy-on-write: `MAP_PRIVATE`, readable and writable.
/// Reads share the page cache; a write makes a private copy of its page,
/// which never reaches the file. The `base` of the arrays torch tensors are
/// made from, so it lives while any of them does.
#[pyclass(frozen, module = "weightmap", name = "_CopyOnWriteMap")]
struct CowMap {
    /// The mapping. Never read or written as Rust data: only numpy (and
    /// torch, through numpy) touch its bytes, through `ptr`.
    _map: memmap2::MmapMut,
    /// Its first byte, taken once when it was made.
    ptr: usize,
    /// Its length.
    len: usize,
}

impl CowMap {
    /// Map `path` copy-on-write; its length must be `expect_len`, the
    /// length its header was validated against.
    fn new(path: &Path, expect_len: u64) -> Result<CowMap, MapError> {
        let file = File::open(path).map_err(MapError::Io)?;
        // SAFETY: memmap2's `map_copy` requires that the file is not
        // modified or truncated while the map lives (a change may show
        // through pages not yet written; a truncation raises SIGBUS on
        // access). The bindings cannot promise it, so the contract is passed
        // on to the Python user, as for `weightmap.open`: `safe_open`'s
        // docstring and python/README.md state it. Writes through the map
        // stay private to this process (MAP_PRIVATE) and never reach the file.
        let mut map =
            unsafe { memmap2::MmapOptions::new().map_copy(&file) }.map_err(MapError::Io)?;
        if map.len() as u64 != expect_len {
            return Err(MapError::Changed(map.len() as u64, expect_len));
        }
        let ptr = map.as_mut_ptr() as usize;
        let len = map.len();
        Ok(CowMap {
            _map: map,
            ptr,
            len,
        })
    }
}

/// Why a file could not be mapped copy-on-write.
enum MapError {
    Io(std::io::Error),
    /// The file's length now, and the one its header was read at.
    Changed(u64, u64),
}

impl MapError {
    fn into_py(self, path: &Path) -> PyErr {
        match self {
            MapError::Io(e) => {
                let errno = e.raw_os_error().unwrap_or(0);
                let msg = format!("{}: cannot map copy-on-write: {e}", path.display());
                match e.kind() {
                    std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err((errno, msg)),
                    std::io::ErrorKind::PermissionDenied => {
                        PyPermissionError::new_err((errno, msg))
                    }
                    _ => PyOSError::new_err((errno, msg)),
                }
            }
            MapError::Changed(now, then) => Error::new_err(format!(
                "{}: the file changed while it was opened ({now} bytes now, {then} when its \
                 header was read)",
                path.display()
            )),
        }
    }
}

/// A file of a model opened for torch: its validated header and its
/// copy-on-write mapping.
struct CowFile {
    header: Header,
    map: Py<CowMap>,
}

/// The loaded model behind a handle.
enum Model {
    /// numpy: the model as `weightmap.open` loads it (read-only mapping).
    Mapped(Py<Owner>),
    /// torch: each file's header and copy-on-write mapping, in shard order.
    Cow {
        files: Vec<CowFile>,
        torch: Py<PyModule>,
    },
}

impl Model {
    /// Tensor descriptors in file order (shard order, then file order).
    fn infos(&self) -> Vec<TensorInfo<'_>> {
        match self {
            Model::Mapped(o) => o.get().weights.tensor_infos().collect(),
            Model::Cow { files, .. } => files.iter().flat_map(|f| f.header.tensors()).collect(),
        }
    }

    /// The tensor `name`, and (torch) the index of its file.
    fn find(&self, name: &str) -> Option<(usize, TensorInfo<'_>)> {
        match self {
            Model::Mapped(o) => {
                let w = &o.get().weights;
                let i = w.tensor_index(name)?;
                Some((0, w.tensor_at(i)?.info()))
            }
            Model::Cow { files, .. } => files.iter().enumerate().find_map(|(k, f)| {
                let j = f.header.tensor_index(name)?;
                Some((k, f.header.tensors().get(j)?))
            }),
        }
    }

    fn find_or_key_error(&self, name: &str) -> PyResult<(usize, TensorInfo<'_>)> {
        self.find(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_owned()))
    }

    /// The first file's header: the model's metadata.
    fn first(&self) -> &Header {
        match self {
            Model::Mapped(o) => o.get().weights.header(),
            Model::Cow { files, .. } => &files[0].header,
        }
    }
}

/// safetensors' dtype string for a type: "F32", "BF16", "F8_E4M3", ...;
/// for GGUF's types, the ggml type's name as gguf-py spells it ("Q4_K").
fn dtype_str(ty: TensorType) -> String {
    ty.name().to_ascii_uppercase()
}

/// torch's name of a plain type (`torch.<name>`).
fn torch_dtype_name(ty: TensorType) -> Option<&'static str> {
    Some(match ty {
        TensorType::F32 => "float32",
        TensorType::F16 => "float16",
        TensorType::BF16 => "bfloat16",
        TensorType::F64 => "float64",
        TensorType::I8 => "int8",
        TensorType::I16 => "int16",
        TensorType::I32 => "int32",
        TensorType::I64 => "int64",
        TensorType::U8 => "uint8",
        TensorType::U16 => "uint16",
        TensorType::U32 => "uint32",
        TensorType::U64 => "uint64",
        TensorType::Bool => "bool",
        TensorType::C64 => "complex64",
        TensorType::F8_E4M3 => "float8_e4m3fn",
        TensorType::F8_E5M2 => "float8_e5m2",
        TensorType::F8_E4M3FNUZ => "float8_e4m3fnuz",
        TensorType::F8_E5M2FNUZ => "float8_e5m2fnuz",
        TensorType::F8_E8M0 => "float8_e8m0fnu",
        _ => return None,
    })
}

/// The tensor `info` of the file `map` as a torch tensor viewing the
/// copy-on-write mapping: plain types as their torch dtype in the element
/// shape, block-quantized types as uint8 rows of bytes (gguf-py's shapes).
fn torch_tensor<'py>(
    py: Python<'py>,
    torch: &Bound<'py, PyModule>,
    map: &Bound<'py, CowMap>,
    info: &TensorInfo<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let (layout, shape) = layout(info)?;
    let dtype = match layout {
        Layout::Bytes => None,
        Layout::Elements(TensorType::U8) => None,
        Layout::Elements(ty) => {
            let name = torch_dtype_name(ty).ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "{}: no torch dtype for {}",
                    info.name,
                    dtype_str(ty)
                ))
            })?;
            match torch.getattr(name) {
                Ok(d) => Some(d),
                Err(_) => {
                    let version: String = torch.getattr("__version__")?.extract()?;
                    return Err(PyTypeError::new_err(format!(
                        "{}: torch {version} has no torch.{name} for {} tensors",
                        info.name,
                        dtype_str(ty)
                    )));
                }
            }
        }
    };
    let cow = map.get();
    let range = usize::try_from(info.file_offset)
        .ok()
        .zip(usize::try_from(info.nbytes).ok())
        .and_then(|(start, len)| Some((start, len, start.checked_add(len)?)))
        .filter(|&(_, _, end)| end <= cow.len);
    let Some((start, len, _)) = range else {
        return Err(Error::new_err(format!(
            "{}: bytes {}..+{} are outside the file's {} bytes",
            info.name, info.file_offset, info.nbytes, cow.len
        )));
    };
    // SAFETY: `[start, start + len)` lies within the mapping (checked
    // above), which is readable and writable (PROT_READ | PROT_WRITE,
    // MAP_PRIVATE) and lives while `map`, the array's base, does. Rust never
    // reads or writes these bytes as Rust data; writes through the array
    // (or torch tensors viewing it) land in this process's private copies
    // of the pages.
    let bytes = unsafe {
        writable_array(
            py,
            numpy::dtype::<u8>(py),
            &[len as u64],
            (cow.ptr + start) as *mut u8,
            len,
            map.clone().into_any(),
        )?
    };
    let mut t = torch.getattr(intern!(py, "from_numpy"))?.call1((bytes,))?;
    if let Some(dtype) = dtype {
        t = t.call_method1(intern!(py, "view"), (dtype,))?;
    }
    t.call_method1(intern!(py, "reshape"), (PyTuple::new(py, shape)?,))
}

/// Open a model as safetensors' `safe_open` does.
///
/// `filename`: a safetensors or GGUF file, any shard of a split GGUF, a
/// `*.safetensors.index.json`, or a directory holding one (as
/// `weightmap.open`). `framework`: `"np"`/`"numpy"` (read-only, zero-copy
/// numpy arrays) or `"pt"`/`"torch"`/`"pytorch"` (zero-copy CPU tensors over
/// a copy-on-write mapping: writes stay in this process, never in the file).
/// `device`: `"cpu"`.
///
/// The files must not be modified or truncated while the handle or any
/// tensor from it lives: a rewritten file changes the tensors, a truncated
/// one kills the process (SIGBUS) when they are read.
#[pyclass(module = "weightmap", name = "safe_open")]
struct SafeOpen {
    /// `None` once closed.
    model: Option<Model>,
    framework: Framework,
    filename: String,
}

impl SafeOpen {
    fn model(&self) -> PyResult<&Model> {
        self.model
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("weightmap.safe_open: the file is closed"))
    }

    /// The tensor `name` in this handle's framework, zero-copy.
    fn tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let model = self.model()?;
        match model {
            Model::Mapped(owner) => tensor_array(py, owner.bind(py), name, true),
            Model::Cow { files, torch } => {
                let (k, info) = model.find_or_key_error(name)?;
                torch_tensor(py, torch.bind(py), files[k].map.bind(py), &info)
            }
        }
    }
}

#[pymethods]
impl SafeOpen {
    #[new]
    #[pyo3(signature = (filename, framework, device = None))]
    fn new(
        py: Python<'_>,
        filename: PathBuf,
        framework: &str,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<SafeOpen> {
        let framework = Framework::parse(framework)?;
        if let Some(d) = device {
            let name = d.str()?.to_string();
            if name != "cpu" {
                return Err(PyValueError::new_err(format!(
                    "device {name:?} is not supported: weightmap.safe_open gives CPU \
                     tensors (device=\"cpu\"); move them with .to(device)"
                )));
            }
        }
        let model = match framework {
            Framework::Numpy => {
                let p = filename.clone();
                let loaded = py.allow_threads(move || {
                    // SAFETY: `Weights::load` requires that the files are not
                    // modified or truncated while the weights (and every view
                    // of them) live. The contract is passed on to the Python
                    // user, as for `weightmap.open`: it is stated in
                    // `safe_open`'s docstring and python/README.md.
                    unsafe { wm::Weights::load(&p, &LoadOptions::default()) }
                });
                let weights = loaded.map_err(|e| to_py(py, e))?;
                Model::Mapped(Py::new(
                    py,
                    Owner {
                        weights: Arc::new(weights),
                    },
                )?)
            }
            Framework::Torch => {
                let torch = py.import("torch").map_err(|e| {
                    let err = PyImportError::new_err(format!(
                        "weightmap.safe_open(framework=\"pt\") needs torch, which could not \
                         be imported: {e}"
                    ));
                    err.set_cause(py, Some(e));
                    err
                })?;
                let p = filename.clone();
                let headers = py
                    .allow_threads(move || ModelHeaders::read(&p))
                    .map_err(|e| to_py(py, e))?;
                let mut files = Vec::with_capacity(headers.files.len());
                for (path, header) in headers.files {
                    let len = header.file_len();
                    let map = py
                        .allow_threads(|| CowMap::new(&path, len))
                        .map_err(|e| e.into_py(&path))?;
                    files.push(CowFile {
                        header,
                        map: Py::new(py, map)?,
                    });
                }
                Model::Cow {
                    files,
                    torch: torch.unbind(),
                }
            }
        };
        Ok(SafeOpen {
            model: Some(model),
            framework,
            filename: filename.to_string_lossy().into_owned(),
        })
    }

    /// Tensor names, sorted (as safetensors' `keys()`).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut names: Vec<&str> = self.model()?.infos().iter().map(|t| t.name).collect();
        names.sort_unstable();
        PyList::new(py, names)
    }

    /// Tensor names in file order (shard order, then file order, for several files).
    fn offset_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.model()?.infos().iter().map(|t| t.name))
    }

    /// safetensors: the `__metadata__` map, or `None` when the file has none
    /// (the first file's, for several). GGUF: every key/value of the (first)
    /// file, as Python values.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let header = self.model()?.first();
        if header.safetensors().is_some_and(|h| !h.has_metadata()) {
            return Ok(None);
        }
        metadata_dict(py, header.gguf_metadata(), header.safetensors_metadata()).map(Some)
    }

    /// The tensor `name`: a read-only numpy array (numpy) or a CPU tensor
    /// (torch), both zero-copy views of the file. `KeyError` when absent.
    fn get_tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.tensor(py, name)
    }

    /// Every tensor, by name, in file order.
    fn get_tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for name in self.offset_keys(py)?.iter() {
            let name: String = name.extract()?;
            d.set_item(&name, self.tensor(py, &name)?)?;
        }
        Ok(d)
    }

    /// A lazily indexed tensor: `get_shape()`, `get_dtype()` and indexing
    /// (`slice_[a:b]`, `slice_[:, a:b]`, ...), which gives a view where the
    /// framework can view the selection and a copy where it cannot.
    fn get_slice(&self, py: Python<'_>, name: &str) -> PyResult<SafeSlice> {
        let model = self.model()?;
        let (_, info) = model.find_or_key_error(name)?;
        let (_, shape) = layout(&info)?;
        let dtype = dtype_str(info.ty);
        let tensor = self.tensor(py, name)?.unbind();
        Ok(SafeSlice {
            tensor,
            shape,
            dtype,
            name: name.to_owned(),
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Close the handle; tensors and slices already handed out stay valid.
    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, PyTuple>) -> bool {
        self.model = None;
        false
    }

    fn __repr__(&self) -> String {
        let state = match &self.model {
            None => "closed".to_owned(),
            Some(m) => {
                let format = match m.first().format() {
                    Format::Gguf => "gguf",
                    Format::Safetensors => "safetensors",
                };
                format!("{format}, {} tensors", m.infos().len())
            }
        };
        format!(
            "<weightmap.safe_open {:?} framework={} ({state})>",
            self.filename,
            self.framework.name()
        )
    }
}

/// A tensor opened by `safe_open.get_slice`, indexed lazily. The full
/// tensor is a zero-copy view of the file; indexing it is the framework's
/// own indexing (numpy's or torch's): ints, slices, steps, tuples,
/// Ellipsis give views; whatever the framework copies for (a list of
/// indices, say) is a copy.
#[pyclass(module = "weightmap", name = "SafeSlice")]
struct SafeSlice {
    tensor: Py<PyAny>,
    shape: Vec<u64>,
    dtype: String,
    name: String,
}

#[pymethods]
impl SafeSlice {
    /// The full tensor's shape (for a block-quantized GGUF tensor, its byte
    /// shape, as gguf-py gives it).
    fn get_shape(&self) -> Vec<u64> {
        self.shape.clone()
    }

    /// The dtype: safetensors' string ("F32", "BF16", ...) or, for GGUF,
    /// the ggml type's name ("Q4_K", "F16", ...).
    fn get_dtype(&self) -> &str {
        &self.dtype
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.tensor.bind(py).get_item(index)
    }

    fn __repr__(&self) -> String {
        format!(
            "<weightmap.SafeSlice {:?} {} {:?}>",
            self.name, self.dtype, self.shape
        )
    }
}

/// Add `safe_open` and its classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SafeOpen>()?;
    m.add_class::<SafeSlice>()?;
    m.add_class::<CowMap>()?;
    Ok(())
}
