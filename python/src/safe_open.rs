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
    PyFileNotFoundError, PyImportError, PyOSError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyEllipsis, PyList, PyModule, PySlice, PyTuple, PyType};

use weightmap as wm;
use wm::{Format, Header, LoadMode, ModelHeaders, TensorInfo, TensorType};

use crate::{layout, metadata_dict, tensor_array, to_py, writable_array, Error, Layout, Owner};

/// The frameworks `safe_open` gives tensors for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framework {
    Numpy,
    Torch,
}

impl Framework {
    /// safetensors' names for the two frameworks weightmap serves.
    fn parse(py: Python<'_>, name: &str) -> PyResult<Framework> {
        match name {
            "np" | "numpy" => Ok(Framework::Numpy),
            "pt" | "torch" | "pytorch" => Ok(Framework::Torch),
            "tf" | "tensorflow" | "jax" | "flax" | "mlx" | "paddle" => Err(st_err(
                py,
                format!(
                    "framework {name:?} is not supported by weightmap.safe_open: \
                     use \"np\" (or \"numpy\") or \"pt\" (or \"torch\", \"pytorch\")"
                ),
            )),
            _ => Err(st_err(
                py,
                format!(
                    "framework {name:?} is invalid: use \"np\" (or \"numpy\") or \"pt\" \
                     (or \"torch\", \"pytorch\")"
                ),
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Framework::Numpy => "numpy",
            Framework::Torch => "pytorch",
        }
    }
}

/// `weightmap.SafetensorError` (made by the Python package: a
/// `weightmap.Error` that also derives from `safetensors.SafetensorError`
/// where safetensors is importable) saying `msg`.
pub(crate) fn st_err(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    let cls = py
        .import(intern!(py, "weightmap"))
        .and_then(|m| m.getattr(intern!(py, "SafetensorError")))
        .and_then(|c| Ok(c.downcast_into::<PyType>()?));
    match cls {
        Ok(cls) => PyErr::from_type(cls, (msg,)),
        // The package is not importable (the extension used on its own).
        Err(_) => Error::new_err(msg),
    }
}

/// A library error from opening a model, as safetensors reports it: a
/// missing file is `FileNotFoundError("No such file or directory: <name>")`,
/// other OS errors keep their class, and anything wrong in the file is a
/// `SafetensorError` ("Error while deserializing header: ...") carrying
/// weightmap's `kind` and `name`.
fn open_err(py: Python<'_>, filename: &Path, e: wm::Error) -> PyErr {
    if let wm::Error::Io { source, .. } = &e {
        if source.kind() == std::io::ErrorKind::NotFound {
            return PyFileNotFoundError::new_err(format!(
                "No such file or directory: {}",
                filename.display()
            ));
        }
        return to_py(py, e);
    }
    let err = st_err(py, format!("Error while deserializing header: {e}"));
    let value = err.value(py);
    // Best effort: an exception without these attributes is still the error.
    let _ = value.setattr("kind", e.kind().name());
    let _ = value.setattr("name", e.name());
    err
}

/// Where tensor bytes come from (safetensors' `backend=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// Map the files (the default).
    Mmap,
    /// Read the tensors with weightmap's stream path: owned copies, no mapping.
    Pread,
}

impl Backend {
    fn parse(py: Python<'_>, name: &str) -> PyResult<Backend> {
        match name {
            "mmap" => Ok(Backend::Mmap),
            "pread" => Ok(Backend::Pread),
            _ => Err(st_err(
                py,
                format!("backend {name:?} is invalid (expected one of: \"mmap\", \"pread\")"),
            )),
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
        CowMap::from_file(&file, expect_len)
    }

    /// Map the open `file` copy-on-write; its length must be `expect_len`,
    /// the length its header was validated against. The mapping is of the
    /// file the handle names, whatever its path names by now: a cache
    /// entry is mapped from the handle its checks read.
    pub(crate) fn from_file(file: &File, expect_len: u64) -> Result<CowMap, MapError> {
        // SAFETY: memmap2's `map_copy` requires that the file is not
        // modified or truncated while the map lives (a change may show
        // through pages not yet written; a truncation raises SIGBUS on
        // access). The bindings cannot promise it, so the contract is passed
        // on to the Python user, as for `weightmap.open`: `safe_open`'s
        // docstring and python/README.md state it (and, for a cache entry,
        // weightmap itself only renames or removes whole entries, which
        // leaves a mapping intact). Writes through the map stay private to
        // this process (MAP_PRIVATE) and never reach the file.
        let mut map =
            unsafe { memmap2::MmapOptions::new().map_copy(file) }.map_err(MapError::Io)?;
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
pub(crate) enum MapError {
    Io(std::io::Error),
    /// The file's length now, and the one its header was read at.
    Changed(u64, u64),
}

impl MapError {
    pub(crate) fn into_py(self, path: &Path) -> PyErr {
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
    /// numpy with `backend="mmap"`, and both frameworks with
    /// `backend="pread"`: the model as `weightmap.open` loads it, mapped
    /// read-only (mmap) or read into owned memory by the stream path (pread).
    Loaded(Py<Owner>),
    /// torch with `backend="mmap"`: each file's header and copy-on-write
    /// mapping, in shard order.
    Cow(Vec<CowFile>),
}

impl Model {
    /// Tensor descriptors in file order (shard order, then file order).
    fn infos(&self) -> Vec<TensorInfo<'_>> {
        match self {
            Model::Loaded(o) => o.get().weights.tensor_infos().collect(),
            Model::Cow(files) => files.iter().flat_map(|f| f.header.tensors()).collect(),
        }
    }

    /// The tensor `name`, and (torch, mmap) the index of its file.
    fn find(&self, name: &str) -> Option<(usize, TensorInfo<'_>)> {
        match self {
            Model::Loaded(o) => {
                let w = &o.get().weights;
                let i = w.tensor_index(name)?;
                Some((0, w.tensor_at(i)?.info()))
            }
            Model::Cow(files) => files.iter().enumerate().find_map(|(k, f)| {
                let j = f.header.tensor_index(name)?;
                Some((k, f.header.tensors().get(j)?))
            }),
        }
    }

    /// As `find`; a missing tensor is safetensors' error.
    fn find_or_err(&self, py: Python<'_>, name: &str) -> PyResult<(usize, TensorInfo<'_>)> {
        self.find(name)
            .ok_or_else(|| st_err(py, format!("File does not contain tensor {name}")))
    }

    /// The first file's header: the model's metadata.
    fn first(&self) -> &Header {
        match self {
            Model::Loaded(o) => o.get().weights.header(),
            Model::Cow(files) => &files[0].header,
        }
    }
}

/// safetensors' dtype string for a type: "F32", "BF16", "F8_E4M3", "F4",
/// ...; for GGUF's types, the ggml type's name as gguf-py spells it ("Q4_K").
fn dtype_str(ty: TensorType) -> String {
    ty.name().to_ascii_uppercase()
}

/// torch's name of a type (`torch.<name>`), for the types torch has.
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
        // Two fp4 values a byte, the innermost dimension halved (as
        // safetensors gives F4).
        TensorType::F4 => "float4_e2m1fn_x2",
        _ => return None,
    })
}

/// What a tensor is, owned: enough to make it again after the handle closed.
#[derive(Clone, Debug)]
struct TensorDesc {
    name: String,
    ty: TensorType,
    /// Element or byte layout (see `layout`).
    bytes: bool,
    /// The shape it is given in (numpy order; bytes per row last for a
    /// block-quantized or sub-byte type).
    shape: Vec<u64>,
    file_offset: u64,
    nbytes: u64,
}

impl TensorDesc {
    fn new(info: &TensorInfo<'_>) -> PyResult<TensorDesc> {
        let (layout, shape) = layout(info)?;
        Ok(TensorDesc {
            name: info.name.to_owned(),
            ty: info.ty,
            bytes: matches!(layout, Layout::Bytes),
            shape,
            file_offset: info.file_offset,
            nbytes: info.nbytes,
        })
    }

    /// The torch dtype its uint8 bytes are viewed as, `None` to keep uint8:
    /// plain types as their torch dtype, F4 as `float4_e2m1fn_x2`,
    /// block-quantized GGUF types as bytes. A type torch lacks (the F6
    /// types, a float8 an old torch does not have) is a `TypeError` naming
    /// it: only this tensor's access fails.
    fn torch_dtype<'py>(
        &self,
        torch: &Bound<'py, PyModule>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let sub_byte = matches!(
            self.ty,
            TensorType::F4 | TensorType::F6_E2M3 | TensorType::F6_E3M2
        );
        if (self.bytes && !sub_byte) || self.ty == TensorType::U8 {
            return Ok(None);
        }
        let name = torch_dtype_name(self.ty).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{}: torch has no dtype for {} tensors",
                self.name,
                dtype_str(self.ty)
            ))
        })?;
        match torch.getattr(name) {
            Ok(d) => Ok(Some(d)),
            Err(_) => {
                let version: String = torch.getattr("__version__")?.extract()?;
                Err(PyTypeError::new_err(format!(
                    "{}: torch {version} has no torch.{name} for {} tensors",
                    self.name,
                    dtype_str(self.ty)
                )))
            }
        }
    }

    /// A uint8 tensor of its bytes as a tensor of its dtype and shape.
    fn torch_from_bytes<'py>(
        &self,
        py: Python<'py>,
        bytes: Bound<'py, PyAny>,
        dtype: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut t = bytes;
        if let Some(dtype) = dtype {
            t = t.call_method1(intern!(py, "view"), (dtype,))?;
        }
        t.call_method1(intern!(py, "reshape"), (PyTuple::new(py, &self.shape)?,))
    }
}

/// The tensor `desc` of the file `map` as a torch tensor viewing the
/// copy-on-write mapping, zero-copy.
fn cow_tensor<'py>(
    py: Python<'py>,
    torch: &Bound<'py, PyModule>,
    map: &Bound<'py, CowMap>,
    desc: &TensorDesc,
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = desc.torch_dtype(torch)?;
    let cow = map.get();
    let range = usize::try_from(desc.file_offset)
        .ok()
        .zip(usize::try_from(desc.nbytes).ok())
        .and_then(|(start, len)| Some((start, len, start.checked_add(len)?)))
        .filter(|&(_, _, end)| end <= cow.len);
    let Some((start, len, _)) = range else {
        return Err(Error::new_err(format!(
            "{}: bytes {}..+{} are outside the file's {} bytes",
            desc.name, desc.file_offset, desc.nbytes, cow.len
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
    let t = torch.getattr(intern!(py, "from_numpy"))?.call1((bytes,))?;
    desc.torch_from_bytes(py, t, dtype)
}

/// torch, or an `ImportError` saying that `what` needs it.
fn import_torch<'py>(py: Python<'py>, what: &str) -> PyResult<Bound<'py, PyModule>> {
    py.import("torch").map_err(|e| {
        let err = PyImportError::new_err(format!(
            "{what} needs torch, which could not be imported: {e}"
        ));
        err.set_cause(py, Some(e));
        err
    })
}

/// Every tensor of the open `file`, whose validated header is `header`, as
/// torch tensors viewing one copy-on-write mapping of that file, zero-copy,
/// by name in file order; `path` names the file in messages only. For a
/// file whose path may by now name another file, or none (a cache entry):
/// the mapping is of the file the handle holds.
pub(crate) fn cow_tensors_of_file<'py>(
    py: Python<'py>,
    file: &File,
    header: &Header,
    path: &Path,
) -> PyResult<Bound<'py, PyDict>> {
    let torch = import_torch(py, "a cache entry's torch tensors")?;
    let len = header.file_len();
    let map = py
        .allow_threads(|| CowMap::from_file(file, len))
        .map_err(|e| e.into_py(path))?;
    let map = Bound::new(py, map)?;
    let d = PyDict::new(py);
    for info in header.tensors() {
        let desc = TensorDesc::new(&info)?;
        d.set_item(&desc.name, cow_tensor(py, &torch, &map, &desc)?)?;
    }
    Ok(d)
}

/// The tensor `desc` of a model the stream path read (`backend="pread"`) as
/// a torch tensor owning a copy of its bytes (torch tensors are writable,
/// the stream path's buffers are not).
fn owned_tensor<'py>(
    py: Python<'py>,
    torch: &Bound<'py, PyModule>,
    owner: &Bound<'py, Owner>,
    desc: &TensorDesc,
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = desc.torch_dtype(torch)?;
    let weights = &owner.get().weights;
    let t = weights.tensor(&desc.name).map_err(|e| to_py(py, e))?;
    let u8_dtype = torch.getattr(intern!(py, "uint8"))?;
    let bytes = if desc.nbytes == 0 {
        // torch.frombuffer refuses an empty buffer.
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", &u8_dtype)?;
        torch.call_method(intern!(py, "empty"), ((0,),), Some(&kwargs))?
    } else {
        let ba = match t.host_bytes() {
            Some(b) => PyByteArray::new(py, b),
            None => PyByteArray::new(py, &t.to_vec().map_err(|e| to_py(py, e))?),
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", &u8_dtype)?;
        torch.call_method(intern!(py, "frombuffer"), (ba,), Some(&kwargs))?
    };
    desc.torch_from_bytes(py, bytes, dtype)
}

/// Where a tensor's bytes are, for a handle or a slice that outlives it.
enum Source {
    /// A model `weightmap.open` loads (mapped read-only, or streamed).
    Loaded(Py<Owner>),
    /// A file mapped copy-on-write (torch, mmap).
    Cow(Py<CowMap>),
}

/// The full tensor `desc` from `source` in `framework`, zero-copy except
/// for torch over a streamed model.
fn make_tensor<'py>(
    py: Python<'py>,
    source: &Source,
    framework: Framework,
    torch: Option<&Py<PyModule>>,
    desc: &TensorDesc,
) -> PyResult<Bound<'py, PyAny>> {
    match (source, framework, torch) {
        (Source::Loaded(owner), Framework::Numpy, _) => {
            tensor_array(py, owner.bind(py), &desc.name, true)
        }
        (Source::Loaded(owner), Framework::Torch, Some(torch)) => {
            owned_tensor(py, torch.bind(py), owner.bind(py), desc)
        }
        (Source::Cow(map), Framework::Torch, Some(torch)) => {
            cow_tensor(py, torch.bind(py), map.bind(py), desc)
        }
        _ => Err(Error::new_err(format!(
            "{}: internal error: no tensor source for this framework",
            desc.name
        ))),
    }
}

/// Open a model as safetensors' `safe_open` does.
///
/// `filename`: a safetensors or GGUF file, any shard of a split GGUF, a
/// `*.safetensors.index.json`, or a directory holding one (as
/// `weightmap.open`). `framework`: `"np"`/`"numpy"` (read-only, zero-copy
/// numpy arrays) or `"pt"`/`"torch"`/`"pytorch"` (zero-copy CPU tensors over
/// a copy-on-write mapping: writes stay in this process, never in the file).
/// `device`: `"cpu"`. `backend`: `"mmap"` (default) maps the files;
/// `"pread"` reads the tensors with weightmap's stream path instead (owned
/// copies, no mapping; torch tensors are then copies of those).
///
/// The files must not be modified or truncated while the handle or any
/// tensor from it lives (backend `"mmap"`): a rewritten file changes the
/// tensors, a truncated one kills the process (SIGBUS) when they are read.
#[pyclass(module = "weightmap", name = "safe_open")]
struct SafeOpen {
    /// `None` once closed.
    model: Option<Model>,
    framework: Framework,
    backend: Backend,
    /// The torch module, for torch handles.
    torch: Option<Py<PyModule>>,
    filename: String,
}

impl SafeOpen {
    fn model(&self, py: Python<'_>) -> PyResult<&Model> {
        self.model
            .as_ref()
            .ok_or_else(|| st_err(py, "File is closed"))
    }

    /// The tensor `name`'s description and where its bytes are.
    fn locate(&self, py: Python<'_>, name: &str) -> PyResult<(Source, TensorDesc)> {
        let model = self.model(py)?;
        let (k, info) = model.find_or_err(py, name)?;
        let desc = TensorDesc::new(&info)?;
        let source = match model {
            Model::Loaded(owner) => Source::Loaded(owner.clone_ref(py)),
            Model::Cow(files) => Source::Cow(files[k].map.clone_ref(py)),
        };
        Ok((source, desc))
    }

    /// The tensor `name` in this handle's framework.
    fn tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let (source, desc) = self.locate(py, name)?;
        make_tensor(py, &source, self.framework, self.torch.as_ref(), &desc)
    }
}

#[pymethods]
impl SafeOpen {
    #[new]
    #[pyo3(signature = (
        filename, framework, device = None, backend = "mmap", *,
        huge_pages = true, reread_small_folios = false
    ))]
    fn new(
        py: Python<'_>,
        filename: PathBuf,
        framework: &str,
        device: Option<&Bound<'_, PyAny>>,
        backend: &str,
        huge_pages: bool,
        reread_small_folios: bool,
    ) -> PyResult<SafeOpen> {
        let framework = Framework::parse(py, framework)?;
        let backend = Backend::parse(py, backend)?;
        if matches!((framework, backend), (Framework::Torch, Backend::Mmap))
            && (!huge_pages || reread_small_folios)
        {
            // Its copy-on-write mapping has no owned buffers and no prefetch.
            return Err(PyValueError::new_err(
                "huge_pages and reread_small_folios apply where weightmap loads the file \
                 (framework \"np\", or backend \"pread\"), not to framework \"pt\" with \
                 backend \"mmap\"",
            ));
        }
        let opts = |mode| crate::load_options(mode, huge_pages, reread_small_folios);
        if let Some(d) = device {
            let name = d.str()?.to_string();
            if name != "cpu" {
                return Err(st_err(
                    py,
                    format!(
                        "device {name:?} is not supported: weightmap.safe_open gives CPU \
                         tensors (device=\"cpu\"); move them with .to(device)"
                    ),
                ));
            }
        }
        let torch = match framework {
            Framework::Numpy => None,
            Framework::Torch => Some(import_torch(py, "weightmap.safe_open(framework=\"pt\")")?),
        };
        let model = match (framework, backend) {
            (Framework::Numpy, Backend::Mmap) | (_, Backend::Pread) => {
                let p = filename.clone();
                let loaded = py.allow_threads(move || match backend {
                    Backend::Pread => wm::Weights::load_streamed(&p, &opts(LoadMode::Stream)),
                    // SAFETY: `Weights::load` requires that the files are not
                    // modified or truncated while the weights (and every view
                    // of them) live. The contract is passed on to the Python
                    // user, as for `weightmap.open`: it is stated in
                    // `safe_open`'s docstring and python/README.md.
                    Backend::Mmap => unsafe { wm::Weights::load(&p, &opts(LoadMode::Mmap)) },
                });
                let weights = loaded.map_err(|e| open_err(py, &filename, e))?;
                Model::Loaded(Py::new(
                    py,
                    Owner {
                        weights: Arc::new(weights),
                    },
                )?)
            }
            (Framework::Torch, Backend::Mmap) => {
                let p = filename.clone();
                let headers = py
                    .allow_threads(move || ModelHeaders::read(&p))
                    .map_err(|e| open_err(py, &filename, e))?;
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
                Model::Cow(files)
            }
        };
        Ok(SafeOpen {
            model: Some(model),
            framework,
            backend,
            torch: torch.map(Bound::unbind),
            filename: filename.to_string_lossy().into_owned(),
        })
    }

    /// Tensor names, sorted (as safetensors' `keys()`).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut names: Vec<&str> = self.model(py)?.infos().iter().map(|t| t.name).collect();
        names.sort_unstable();
        PyList::new(py, names)
    }

    /// Tensor names in file order (shard order, then file order, for several files).
    fn offset_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.model(py)?.infos().iter().map(|t| t.name))
    }

    /// safetensors: the `__metadata__` map, or `None` when the file has none
    /// (the first file's, for several). GGUF: every key/value of the (first)
    /// file, as Python values.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let header = self.model(py)?.first();
        if header.safetensors().is_some_and(|h| !h.has_metadata()) {
            return Ok(None);
        }
        metadata_dict(py, header.gguf_metadata(), header.safetensors_metadata()).map(Some)
    }

    /// The tensor `name`: a read-only numpy array (numpy) or a CPU tensor
    /// (torch), zero-copy views of the file with backend `"mmap"`.
    /// `SafetensorError` when absent.
    fn get_tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.tensor(py, name)
    }

    /// How many bytes of the tensors sit in huge pages now, as
    /// `Weights.huge_pages()` says; `ValueError` for framework "pt" with
    /// backend "mmap", whose copy-on-write mapping it does not measure.
    fn huge_pages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.model(py)? {
            Model::Loaded(owner) => crate::huge_pages_dict(py, &owner.get().weights),
            Model::Cow(_) => Err(PyValueError::new_err(
                "huge_pages() measures what weightmap loads (framework \"np\", or backend \
                 \"pread\"), not framework \"pt\" with backend \"mmap\"",
            )),
        }
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
    /// (`slice_[a:b]`, `slice_[:, a:b]`, ...). Nothing is made until it is
    /// indexed, so a dtype the framework cannot hold fails only then.
    fn get_slice(&self, py: Python<'_>, name: &str) -> PyResult<SafeSlice> {
        let (source, desc) = self.locate(py, name)?;
        Ok(SafeSlice {
            source,
            desc,
            framework: self.framework,
            torch: self.torch.as_ref().map(|t| t.clone_ref(py)),
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
        let backend = match self.backend {
            Backend::Mmap => "mmap",
            Backend::Pread => "pread",
        };
        format!(
            "<weightmap.safe_open {:?} framework={} backend={backend} ({state})>",
            self.filename,
            self.framework.name()
        )
    }
}

/// One index of one dimension, resolved as safetensors resolves it
/// (`TensorIndexer`): a selected position, or `start:stop:step`.
enum Ix {
    Select(u64),
    Narrow(Option<u64>, Option<u64>, u64),
}

impl std::fmt::Display for Ix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |b: &Option<u64>| b.map(|v| v.to_string()).unwrap_or_default();
        match self {
            Ix::Select(n) => write!(f, "{n}"),
            Ix::Narrow(a, b, 1) => write!(f, "{}:{}", opt(a), opt(b)),
            Ix::Narrow(a, b, s) => write!(f, "{}:{}:{s}", opt(a), opt(b)),
        }
    }
}

/// A Python int as an `i64`, or `None` for anything else (bools included).
fn as_int(v: &Bound<'_, PyAny>) -> Option<i64> {
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return None;
    }
    if !v.is_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    v.extract().ok()
}

/// Refuse, with safetensors' `SafetensorError` and message, the indexes
/// safetensors refuses under numpy: a non-empty list, a second Ellipsis, a
/// step below 1, more indexes than dimensions, an int or slice bound out
/// of range. What it does not refuse is left to numpy's own indexing, and
/// so is what safetensors cannot parse at all (negative slice bounds,
/// `None`, index arrays): weightmap takes those as numpy does.
fn check_np_index(py: Python<'_>, index: &Bound<'_, PyAny>, shape: &[u64]) -> PyResult<()> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = index.downcast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = index.downcast::<PyList>() {
        if l.is_empty() {
            return Ok(());
        }
        return Err(st_err(py, "Non empty lists are not implemented"));
    } else {
        vec![index.clone()]
    };
    let ellipses = items
        .iter()
        .filter(|it| it.is_instance_of::<PyEllipsis>())
        .count();
    if ellipses > 1 {
        return Err(st_err(
            py,
            "Only one ellipsis (...) is allowed in slice index",
        ));
    }
    let expansion = shape.len().saturating_sub(items.len() - ellipses);
    let mut ixs: Vec<Ix> = Vec::with_capacity(shape.len());
    for it in &items {
        if it.is_instance_of::<PyEllipsis>() {
            ixs.extend((0..expansion).map(|_| Ix::Narrow(None, None, 1)));
        } else if let Ok(s) = it.downcast::<PySlice>() {
            let bound = |attr: &str| -> PyResult<Option<Option<i64>>> {
                let v = s.getattr(attr)?;
                if v.is_none() {
                    return Ok(Some(None));
                }
                Ok(as_int(&v).map(Some))
            };
            let (Some(start), Some(stop), Some(step)) =
                (bound("start")?, bound("stop")?, bound("step")?)
            else {
                return Ok(()); // not ints: numpy decides
            };
            let step = step.unwrap_or(1);
            if step <= 0 {
                return Err(st_err(
                    py,
                    format!("Slice step must be a positive integer, got {step}"),
                ));
            }
            if start.is_some_and(|v| v < 0) || stop.is_some_and(|v| v < 0) {
                return Ok(()); // safetensors cannot parse these; numpy's meaning
            }
            ixs.push(Ix::Narrow(
                start.map(|v| v as u64),
                stop.map(|v| v as u64),
                step as u64,
            ));
        } else if let Some(idx) = as_int(it) {
            let dim_idx = ixs.len();
            let dim = shape.get(dim_idx).copied().unwrap_or(0);
            let resolved = if idx < 0 {
                let r = i128::from(dim) + i128::from(idx);
                if r < 0 {
                    return Err(st_err(
                        py,
                        format!("Invalid index {idx} for dimension {dim_idx} of size {dim}"),
                    ));
                }
                r as u64
            } else {
                idx as u64
            };
            ixs.push(Ix::Select(resolved));
        } else {
            return Ok(()); // None, arrays, ...: numpy decides
        }
    }
    let fail = |detail: String| {
        let shown: Vec<String> = ixs.iter().map(ToString::to_string).collect();
        st_err(
            py,
            format!(
                "Error during slicing [{}] with shape {shape:?}: {detail}",
                shown.join(", ")
            ),
        )
    };
    if ixs.len() > shape.len() {
        return Err(fail(
            "more slicing indexes than dimensions in tensor".to_owned(),
        ));
    }
    // Innermost first, as safetensors walks them (its first error wins).
    // One difference: an empty range at the end of a dimension (`[:]` of a
    // 0-length one, `[n:]` of an n-long one) is an empty selection, as in
    // numpy, where safetensors refuses it.
    for (i, &dim) in shape.iter().enumerate().rev() {
        let Some(ix) = ixs.get(i) else { continue };
        let (start, stop, empty_ok) = match *ix {
            Ix::Select(s) => (s, s.saturating_add(1), false),
            Ix::Narrow(a, b, _) => (a.unwrap_or(0), b.unwrap_or(dim), true),
        };
        let start_bad = if empty_ok && start == dim && stop <= dim {
            false
        } else {
            start >= dim
        };
        if start_bad || stop > dim {
            let asked = if start_bad {
                start
            } else {
                stop.saturating_sub(1)
            };
            return Err(fail(format!(
                "index {asked} out of bounds for tensor dimension #{i} of size {dim}"
            )));
        }
    }
    Ok(())
}

/// `index` with a trailing Ellipsis, so that numpy gives a 0-d array, not a
/// scalar, when every dimension is selected (as safetensors does).
fn with_ellipsis<'py>(index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = index.py();
    let mut items: Vec<Bound<'py, PyAny>> = match index.downcast::<PyTuple>() {
        Ok(t) => t.iter().collect(),
        Err(_) => vec![index.clone()],
    };
    if !items.iter().any(|it| it.is_instance_of::<PyEllipsis>()) {
        items.push(PyEllipsis::get(py).to_owned().into_any());
    }
    Ok(PyTuple::new(py, items)?.into_any())
}

/// A tensor opened by `safe_open.get_slice`, indexed lazily. Under torch,
/// indexing is torch's own over a zero-copy view of the file (as
/// safetensors' torch path does). Under numpy, the indexes safetensors
/// refuses raise its `SafetensorError` with its message, and the rest is
/// numpy's indexing over a zero-copy view: ints, slices, steps, tuples,
/// Ellipsis give views, and selecting every dimension gives a 0-d array.
#[pyclass(module = "weightmap", name = "SafeSlice")]
struct SafeSlice {
    source: Source,
    desc: TensorDesc,
    framework: Framework,
    torch: Option<Py<PyModule>>,
}

#[pymethods]
impl SafeSlice {
    /// The full tensor's shape (for a block-quantized GGUF tensor, its byte
    /// shape, as gguf-py gives it; for F4, the element shape, as
    /// safetensors gives it).
    fn get_shape(&self) -> Vec<u64> {
        if self.desc.bytes && self.desc.ty == TensorType::F4 {
            // safetensors' get_shape is the header's (element) shape.
            let mut s = self.desc.shape.clone();
            if let Some(last) = s.last_mut() {
                *last *= 2;
            }
            return s;
        }
        if self.desc.bytes && matches!(self.desc.ty, TensorType::F6_E2M3 | TensorType::F6_E3M2) {
            let mut s = self.desc.shape.clone();
            if let Some(last) = s.last_mut() {
                *last = *last / 3 * 4;
            }
            return s;
        }
        self.desc.shape.clone()
    }

    /// The dtype: safetensors' string ("F32", "BF16", ...) or, for GGUF,
    /// the ggml type's name ("Q4_K", "F16", ...).
    fn get_dtype(&self) -> String {
        dtype_str(self.desc.ty)
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let full = make_tensor(
            py,
            &self.source,
            self.framework,
            self.torch.as_ref(),
            &self.desc,
        )?;
        match self.framework {
            Framework::Torch => full.get_item(index),
            Framework::Numpy => {
                let shape: Vec<u64> = full.getattr(intern!(py, "shape"))?.extract::<Vec<u64>>()?;
                check_np_index(py, index, &shape)?;
                full.get_item(with_ellipsis(index)?)
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<weightmap.SafeSlice {:?} {} {:?}>",
            self.desc.name,
            dtype_str(self.desc.ty),
            self.get_shape()
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
