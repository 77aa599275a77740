//! weightmap's one error type.
//!
//! Every variant says what was wrong and where: the key, the tensor name, the
//! byte offset, the file length. Display strings are lowercase, like std's.

use std::io;
use std::path::PathBuf;

use crate::types::TensorType;

/// Result with weightmap's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading, validating, placing or loading weights.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- I/O and files -------------------------------------------------------
    /// An I/O operation on a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("open", "read", "map", ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is empty: nothing to parse or map.
    #[error("{path}: file is empty")]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// The path is not a regular file (a directory, a device).
    #[error("{path}: not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The file is neither GGUF nor safetensors.
    #[error("unknown format: the first bytes are neither the GGUF magic nor a safetensors header")]
    UnknownFormat,
    /// An output path that names something other than a regular file (a
    /// directory, a device node, a FIFO, a symlink to one): writing it is refused.
    #[error("refusing to replace {path}: it is {kind}, not a regular file")]
    NotRegularDestination {
        /// The destination.
        path: PathBuf,
        /// What it is ("a directory", "a character device", ...).
        kind: &'static str,
    },
    /// Not enough free space on the destination's file system for the file.
    #[error(
        "{path}: the file needs {needed} bytes but its file system has {available} bytes free"
    )]
    NoSpace {
        /// The destination.
        path: PathBuf,
        /// Bytes the file will take.
        needed: u64,
        /// Bytes available to this user.
        available: u64,
    },
    /// Writing was stopped by SIGINT or SIGTERM; the partial file was removed.
    #[error("writing {path} was interrupted by a signal; the partial file was removed")]
    Interrupted {
        /// The destination.
        path: PathBuf,
    },
    /// An allocation whose size the file decides failed (the process is out
    /// of memory or over its address-space limit).
    #[error("out of memory: allocating {bytes} bytes for {what} failed")]
    OutOfMemory {
        /// What the memory was for ("the header", "the tensor table", ...).
        what: &'static str,
        /// Bytes asked for (an estimate where the element size is not known).
        bytes: u64,
    },
    // ---- GGUF header ---------------------------------------------------------
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}: not a GGUF file")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A GGUF version weightmap does not read (0, 1, or newer than 3).
    #[error("unsupported GGUF version {version} (versions 2 and 3 are supported)")]
    UnsupportedVersion {
        /// The version field.
        version: u32,
    },
    /// The version reads as byte-swapped: a big-endian file.
    #[error(
        "GGUF version field {version:#010x} is byte-swapped: big-endian files are not supported"
    )]
    BigEndian {
        /// The version field as read little-endian.
        version: u32,
    },
    /// The file ends inside the header.
    #[error("truncated: {what} needs {needed} bytes at offset {offset}, file is {file_len} bytes")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A count (tensors, keys, array elements) cannot fit in the bytes left.
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// The count the file claims.
        count: u64,
        /// Where the count is.
        offset: u64,
        /// Bytes left in the file after it.
        remaining: u64,
    },
    /// A metadata value type id is not one of GGUF's 13.
    #[error("key '{key}': unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type id.
        type_id: u32,
        /// Where the type id is.
        offset: u64,
    },
    /// An array of arrays: ggml's reference parser rejects them.
    #[error("key '{key}': nested arrays are not allowed (offset {offset})")]
    NestedArray {
        /// The key.
        key: String,
        /// Where the element type is.
        offset: u64,
    },
    /// A key of zero length.
    #[error("empty key at offset {offset}")]
    EmptyKey {
        /// Where the key starts.
        offset: u64,
    },
    /// The same key twice.
    #[error("duplicate key '{key}' at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where the second one starts.
        offset: u64,
    },
    /// A key, tensor name or string value that is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string is.
        what: String,
        /// Where it starts.
        offset: u64,
    },
    /// `general.alignment` stored as something other than a u32.
    #[error("general.alignment must be a u32, found {found}")]
    AlignmentType {
        /// The type found.
        found: &'static str,
    },
    /// `general.alignment` zero or not a power of two.
    #[error("general.alignment {value} is not a nonzero power of two")]
    AlignmentValue {
        /// The value.
        value: u64,
    },

    // ---- tensor descriptors --------------------------------------------------
    /// A tensor name of 64 bytes or more (ggml's `GGML_MAX_NAME`).
    #[error("tensor name of {len} bytes at offset {offset} is too long (limit 63)")]
    TensorNameTooLong {
        /// The name's length.
        len: u64,
        /// Where it starts.
        offset: u64,
    },
    /// Two tensors with one name.
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// More than 4 dimensions.
    #[error("tensor '{tensor}': {n_dims} dimensions (at most 4)")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The count.
        n_dims: u32,
    },
    /// A dimension negative as int64.
    #[error("tensor '{tensor}': dimension {index} is negative ({value})")]
    NegativeDim {
        /// The tensor.
        tensor: String,
        /// Which dimension.
        index: usize,
        /// Its value as int64.
        value: i64,
    },
    /// A type id ggml does not define (or removed).
    #[error("tensor '{tensor}': unknown ggml type {type_id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The id.
        type_id: u32,
    },
    /// The element count or byte size overflows.
    #[error("tensor '{tensor}': {what} overflows")]
    TensorSizeOverflow {
        /// The tensor.
        tensor: String,
        /// "element count", "byte size", "padded size", "offset + size".
        what: &'static str,
    },
    /// `ne[0]` not a multiple of the type's block size.
    #[error(
        "tensor '{tensor}': ne[0] = {ne0} is not a multiple of {ty}'s block size {block_size}"
    )]
    BlockMismatch {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: TensorType,
        /// `ne[0]`.
        ne0: u64,
        /// The type's block size.
        block_size: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor '{tensor}': offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's bytes run past the end of the file.
    #[error("tensor '{tensor}' data [{start}, {end}) is not within the file bounds (file is {file_len} bytes): model is corrupted or incomplete")]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute start in the file.
        start: u64,
        /// Absolute end in the file.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Two tensors share bytes.
    #[error("tensor '{tensor}' at [{start}, {end}) overlaps tensor '{other}'")]
    TensorOverlap {
        /// The later tensor.
        tensor: String,
        /// Its absolute start.
        start: u64,
        /// Its absolute end.
        end: u64,
        /// The tensor it overlaps.
        other: String,
    },

    // ---- ggml-exact validation (validate --ggml) ------------------------------
    /// A file weightmap accepts that ggml's reference parser (and so
    /// llama.cpp) refuses; see [`crate::gguf::check_ggml`].
    #[error("{} would refuse this file: {rule}: {detail}", .rule.refused_by())]
    GgmlWouldRefuse {
        /// The ggml rule broken.
        rule: GgmlRule,
        /// What broke it and where: the key or tensor, sizes, offsets.
        detail: String,
    },
    /// Metadata that does not hold every entry its header lists (read over
    /// fewer bytes than the header was parsed from), so it cannot be checked.
    #[error("metadata holds {found} of the header's {expected} entries: read it over the bytes the header was parsed from")]
    MetadataIncomplete {
        /// Entries in the header.
        expected: usize,
        /// Entries readable from the bytes given.
        found: usize,
    },

    // ---- safetensors ---------------------------------------------------------
    /// The safetensors header is invalid (as judged by the `safetensors` crate or by weightmap).
    #[error("safetensors header: {detail}")]
    SafetensorsHeader {
        /// What was wrong, naming the tensor where there is one.
        detail: String,
    },

    // ---- lookups and typed access ---------------------------------------------
    /// No metadata key of that name.
    #[error("metadata key '{key}' not found")]
    KeyNotFound {
        /// The key.
        key: String,
    },
    /// A metadata value of another type than asked for.
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongValueType {
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type stored.
        found: &'static str,
    },
    /// An integer metadata value that does not fit the integer type asked for.
    #[error("metadata key '{key}': value {value} does not fit in {target}")]
    IntOutOfRange {
        /// The key (with `[i]` for an array element).
        key: String,
        /// The value stored.
        value: i128,
        /// The type asked for ("u32", ...).
        target: &'static str,
    },
    /// A per-layer array whose length is not the layer count.
    #[error("metadata key '{key}': array of {found} per-layer values, expected {expected} (one per layer)")]
    PerLayerLength {
        /// The key.
        key: String,
        /// The layer count.
        expected: u64,
        /// The array's length.
        found: u64,
    },
    /// No tensor of that name.
    #[error("tensor '{name}' not found")]
    TensorNotFound {
        /// The name.
        name: String,
    },
    /// A tensor index past the last tensor (an announcement's, say).
    #[error("no tensor {index}: the weights hold {count}")]
    TensorIndex {
        /// The index asked for.
        index: u64,
        /// How many tensors there are.
        count: usize,
    },
    /// An expert that a tensor does not hold: past its outermost dimension,
    /// negative, or a tensor of fewer than two dimensions, which holds no
    /// experts ([`TensorInfo::experts`](crate::TensorInfo::experts)).
    #[error("tensor '{tensor}' has no expert {expert}: it holds {experts}")]
    NoSuchExpert {
        /// The tensor.
        tensor: String,
        /// The expert asked for.
        expert: i64,
        /// How many experts it holds.
        experts: u64,
    },
    /// A row index past a tensor's rows.
    #[error("tensor '{tensor}': row {row} is out of range (it has {rows} rows)")]
    RowOutOfRange {
        /// The tensor.
        tensor: String,
        /// The row asked for (the end of the range, for a range).
        row: u64,
        /// How many rows it has.
        rows: u64,
    },
    /// A tensor whose shape is not the one a runtime expects.
    #[error("tensor '{tensor}' has shape {found:?} (ggml order), expected {expected:?}")]
    ShapeMismatch {
        /// The tensor.
        tensor: String,
        /// The expected `ne`, ggml order.
        expected: Vec<u64>,
        /// Its `ne`.
        found: Vec<u64>,
    },
    /// A tensor whose type is not among those a runtime accepts.
    #[error("tensor '{tensor}' is {found}, expected one of {expected:?}")]
    TypeMismatch {
        /// The tensor.
        tensor: String,
        /// The accepted types' names.
        expected: Vec<&'static str>,
        /// Its type's name.
        found: &'static str,
    },
    /// A typed view of the wrong element type.
    #[error("tensor '{tensor}' is {found}, not {expected}")]
    ViewType {
        /// The tensor.
        tensor: String,
        /// The element type asked for.
        expected: &'static str,
        /// The tensor's type.
        found: TensorType,
    },
    /// A typed view whose bytes are not a whole number of elements, or not aligned for them.
    #[error("tensor '{tensor}': {nbytes} bytes at address {address:#x} cannot be viewed as {elem} ({reason})")]
    ViewLayout {
        /// The tensor.
        tensor: String,
        /// The element type asked for.
        elem: &'static str,
        /// The tensor's byte size.
        nbytes: usize,
        /// The tensor's address.
        address: usize,
        /// bytemuck's reason.
        reason: String,
    },

    // ---- buffers ---------------------------------------------------------------
    /// An alignment that is not a nonzero power of two.
    #[error("alignment {alignment} is not a nonzero power of two")]
    InvalidAlignment {
        /// The alignment.
        alignment: usize,
    },
    /// A buffer larger than its type allows.
    #[error("buffer of {size} bytes exceeds {buffer_type}'s maximum of {max}")]
    BufferTooLarge {
        /// The buffer type.
        buffer_type: String,
        /// Bytes asked for.
        size: usize,
        /// The maximum.
        max: usize,
    },
    /// Allocating a buffer failed.
    #[error("allocating a {size}-byte buffer failed: {source}")]
    Alloc {
        /// Bytes asked for.
        size: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A byte range or tensor placement outside the buffer.
    #[error("range [{offset}, {offset}+{len}) is outside the {buffer_size}-byte buffer")]
    OutOfBuffer {
        /// Start of the range.
        offset: usize,
        /// Its length.
        len: usize,
        /// The buffer's size.
        buffer_size: usize,
    },
    /// A tensor placed at an address the buffer type cannot use.
    #[error("tensor '{tensor}': address {address:#x} is not aligned to {alignment}")]
    MisalignedPlacement {
        /// The tensor.
        tensor: String,
        /// The address (host buffers) or offset (device buffers).
        address: usize,
        /// The buffer type's alignment.
        alignment: usize,
    },
    /// A write to a buffer over a read-only mapping.
    #[error("buffer '{buffer}' is read-only (it views a file mapping)")]
    ReadOnly {
        /// The buffer's type name.
        buffer: String,
    },
    /// A host-only operation on a buffer that is not host-visible.
    #[error("buffer '{buffer}' is not host-visible")]
    NotHost {
        /// The buffer's type name.
        buffer: String,
    },

    // ---- dequantization --------------------------------------------------------
    /// A type with no dequantization to f32 (Q8_1, C64, F4, F6_E2M3, F6_E3M2).
    #[error("{ty} has no dequantization to f32")]
    NoDequantize {
        /// The type.
        ty: TensorType,
    },
    /// Bytes to dequantize that are not a whole number of blocks.
    #[error("{nbytes} bytes of {ty} are not a whole number of {block_bytes}-byte blocks")]
    RaggedBlocks {
        /// The type.
        ty: TensorType,
        /// The bytes given.
        nbytes: usize,
        /// Bytes per block of the type.
        block_bytes: usize,
    },
    /// An output slice whose length is not the number of elements dequantized.
    #[error("dequantizing {ty}: output holds {found} floats, the input has {expected} elements")]
    OutputLength {
        /// The type.
        ty: TensorType,
        /// Elements in the input.
        expected: usize,
        /// The output's length.
        found: usize,
    },

    /// A NaN or infinity in tensor data: an element of a float tensor, or a
    /// scale field (`d`, `dmin`, ...) of a quantized block.
    #[error("tensor '{tensor}' ({ty}): {}", non_finite_at(.unit, *.index, .field, *.value))]
    NonFiniteData {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: TensorType,
        /// "element" for float tensors, "block" for quantized ones.
        unit: &'static str,
        /// The index of the first bad element or block in the tensor.
        index: u64,
        /// The block field holding the value ("d", "dmin", "e", ...); empty
        /// for an element.
        field: &'static str,
        /// The value found (NaN or ±inf), as f64.
        value: f64,
    },

    // ---- loader --------------------------------------------------------------
    /// The mapped path failed and fallback was turned off.
    #[error("mapped load failed and fallback is off: {reason}")]
    MmapFailed {
        /// Why the mapped path could not be used.
        reason: FallbackReason,
    },
    /// The mapped path could not be used, and the stream path it fell back
    /// to failed too: both causes.
    #[error("mapping failed ({reason}), then streaming failed ({source})")]
    FallbackFailed {
        /// Why the mapped path was not used.
        reason: FallbackReason,
        /// The stream path's error.
        #[source]
        source: Box<Error>,
    },
    /// A buffer type's `alloc_size` for a tensor is smaller than the tensor.
    #[error("buffer type '{buffer_type}' gives tensor '{tensor}' {alloc_size} bytes, less than its {nbytes}")]
    AllocSizeTooSmall {
        /// The buffer type.
        buffer_type: String,
        /// The tensor.
        tensor: String,
        /// What `alloc_size` returned.
        alloc_size: usize,
        /// The tensor's size.
        nbytes: u64,
    },
    /// `buffer_from_host_ptr` on a buffer type that cannot wrap host memory.
    #[error("buffer type '{buffer_type}' cannot wrap host memory (no buffer_from_host_ptr)")]
    HostPtrUnsupported {
        /// The buffer type.
        buffer_type: String,
    },
    /// A shard of a split GGUF, or a file a safetensors index names, is missing.
    #[error("{path}: shard is missing")]
    MissingShard {
        /// The shard's path.
        path: PathBuf,
    },
    /// A file reached as a shard is not one of this model's.
    #[error("{path}: not a shard of this model: {detail}")]
    NotAShard {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// `split.count` disagrees with the number of shards.
    #[error("{path}: split.count is {found}, but the model has {expected} shards")]
    SplitCountMismatch {
        /// The shard.
        path: PathBuf,
        /// Shards the model has (from the first shard's name and keys).
        expected: u64,
        /// Its `split.count`.
        found: u64,
    },
    /// `split.no` out of range, repeated, or not the shard's place.
    #[error("{path}: split.no {no} of {count} is wrong: {detail}")]
    SplitNoInvalid {
        /// The shard.
        path: PathBuf,
        /// Its `split.no` (0-based).
        no: u64,
        /// `split.count`.
        count: u64,
        /// What is wrong with it.
        detail: String,
    },
    /// `split.tensors.count` disagrees with the tensors found.
    #[error("{path}: split.tensors.count is {expected}, but the shards hold {found} tensors")]
    SplitTensorsCount {
        /// The shard whose key is wrong.
        path: PathBuf,
        /// What the key says.
        expected: u64,
        /// Tensors found (over all shards), or the other shard's key.
        found: u64,
    },
    /// A tensor in two shards.
    #[error("tensor '{tensor}' is in two shards: {first} and {second}")]
    DuplicateShardTensor {
        /// The tensor.
        tensor: String,
        /// The first shard holding it.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// A tensor the index lists is absent from its file.
    #[error("{path}: the index lists tensor '{tensor}' in this file, which does not hold it")]
    TensorNotInShard {
        /// The tensor.
        tensor: String,
        /// The shard.
        path: PathBuf,
    },
    /// A shard holds a tensor the index does not list there.
    #[error("{path}: holds tensor '{tensor}', which the index does not list in this file")]
    UnlistedShardTensor {
        /// The tensor.
        tensor: String,
        /// The shard.
        path: PathBuf,
    },
    /// A safetensors index that is malformed or has the wrong types.
    #[error("{path}: bad safetensors index: {detail}")]
    ShardIndex {
        /// The index file (or directory).
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The progress callback asked to stop: every reading thread has
    /// stopped and every buffer of the load was freed.
    #[error("the load was cancelled by its progress callback")]
    Cancelled,
    /// Memory the load would take (a copy, a lock) is more than the
    /// process may still use: MemAvailable, or a memory cgroup's limit less
    /// its usage, whichever is less. Returned before allocating, so that the
    /// kernel's OOM killer never ends the process for it.
    #[error("{what} needs {needed} bytes, over the memory budget of {budget} bytes ({budget_source}); LoadOptions::ignore_budget (--ignore-budget) goes ahead anyway")]
    OverBudget {
        /// What would take the memory ("the stream path's copy", ...).
        what: &'static str,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the process may still use.
        budget: u64,
        /// Where the budget came from ("cgroup v1 /NAME memory.limit_in_bytes", ...).
        budget_source: String,
    },
    /// A transform given to the cache (`cache::Transform`,
    /// `cache::EntryContents`) failed, or its output cannot be stored.
    #[error("transform of tensor '{tensor}': {message}")]
    Transform {
        /// The tensor being transformed.
        tensor: String,
        /// What the transform said.
        message: String,
    },
    /// `mlock` of the tensor region failed.
    #[error("mlock of {len} bytes failed (RLIMIT_MEMLOCK soft limit {limit}): {source}; raise it with `ulimit -l` or drop the lock option")]
    Mlock {
        /// Bytes to lock.
        len: usize,
        /// The soft RLIMIT_MEMLOCK, as text ("unlimited" or bytes).
        limit: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Where a [`Error::NonFiniteData`] value is: "element 17 is NaN" or
/// "block 3 has d = inf".
fn non_finite_at(unit: &str, index: u64, field: &str, value: f64) -> String {
    if field.is_empty() {
        format!("{unit} {index} is {value}")
    } else {
        format!("{unit} {index} has {field} = {value}")
    }
}

impl Error {
    /// [`Error::Io`]: the OS error `source` of `op` ("open", "read", "write", ...) on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// [`Error::TensorSizeOverflow`]: `what` ("element count", "byte size",
    /// "offset + size", ...) of the tensor `tensor` overflows.
    pub(crate) fn size_overflow(tensor: &str, what: &'static str) -> Error {
        Error::TensorSizeOverflow {
            tensor: tensor.to_owned(),
            what,
        }
    }

    /// What kind of failure this is, in the spirit of `io::ErrorKind`: a
    /// small, stable category for code that handles errors by class (the
    /// C ABI returns one `WM_ERR_*` code per kind).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Error::Io { .. } | Error::NotRegularDestination { .. } | Error::NoSpace { .. } => K::Io,
            Error::KeyNotFound { .. }
            | Error::TensorNotFound { .. }
            | Error::TensorIndex { .. }
            | Error::NoSuchExpert { .. } => K::NotFound,
            Error::WrongValueType { .. } | Error::IntOutOfRange { .. } => K::WrongType,
            Error::InvalidAlignment { .. }
            | Error::RowOutOfRange { .. }
            | Error::OutputLength { .. }
            | Error::ViewType { .. }
            | Error::ViewLayout { .. }
            | Error::OutOfBuffer { .. }
            | Error::MisalignedPlacement { .. }
            | Error::ReadOnly { .. }
            | Error::NotHost { .. }
            | Error::AllocSizeTooSmall { .. }
            | Error::HostPtrUnsupported { .. } => K::InvalidArgument,
            Error::MmapFailed { .. } => K::MmapFailed,
            Error::OutOfMemory { .. }
            | Error::Alloc { .. }
            | Error::BufferTooLarge { .. }
            | Error::OverBudget { .. } => K::OutOfMemory,
            Error::NoDequantize { .. } => K::Unsupported,
            Error::Transform { .. } => K::InvalidArgument,
            Error::Cancelled | Error::Interrupted { .. } => K::Cancelled,
            // The stream path's own failure decides.
            Error::FallbackFailed { source, .. } => source.kind(),
            _ => K::InvalidFile,
        }
    }

    /// A short, stable name for the variant (`"truncated"`,
    /// `"tensor_not_found"`, ...), for JSON output and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::EmptyFile { .. } => "empty_file",
            Error::NotAFile { .. } => "not_a_file",
            Error::UnknownFormat => "unknown_format",
            Error::NotRegularDestination { .. } => "not_regular_destination",
            Error::NoSpace { .. } => "no_space",
            Error::Interrupted { .. } => "interrupted",
            Error::OutOfMemory { .. } => "out_of_memory",
            Error::BadMagic { .. } => "bad_magic",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::BigEndian { .. } => "big_endian",
            Error::Truncated { .. } => "truncated",
            Error::CountTooLarge { .. } => "count_too_large",
            Error::UnknownValueType { .. } => "unknown_value_type",
            Error::NestedArray { .. } => "nested_array",
            Error::EmptyKey { .. } => "empty_key",
            Error::DuplicateKey { .. } => "duplicate_key",
            Error::InvalidUtf8 { .. } => "invalid_utf8",
            Error::AlignmentType { .. } => "alignment_type",
            Error::AlignmentValue { .. } => "alignment_value",
            Error::TensorNameTooLong { .. } => "tensor_name_too_long",
            Error::DuplicateTensor { .. } => "duplicate_tensor",
            Error::TooManyDims { .. } => "too_many_dims",
            Error::NegativeDim { .. } => "negative_dim",
            Error::UnknownTensorType { .. } => "unknown_tensor_type",
            Error::TensorSizeOverflow { .. } => "tensor_size_overflow",
            Error::BlockMismatch { .. } => "block_mismatch",
            Error::MisalignedOffset { .. } => "misaligned_offset",
            Error::TensorOutOfBounds { .. } => "tensor_out_of_bounds",
            Error::TensorOverlap { .. } => "tensor_overlap",
            Error::GgmlWouldRefuse { .. } => "ggml_would_refuse",
            Error::MetadataIncomplete { .. } => "metadata_incomplete",
            Error::SafetensorsHeader { .. } => "safetensors_header",
            Error::KeyNotFound { .. } => "key_not_found",
            Error::WrongValueType { .. } => "wrong_value_type",
            Error::IntOutOfRange { .. } => "int_out_of_range",
            Error::PerLayerLength { .. } => "per_layer_length",
            Error::TensorNotFound { .. } => "tensor_not_found",
            Error::TensorIndex { .. } => "tensor_index",
            Error::NoSuchExpert { .. } => "no_such_expert",
            Error::RowOutOfRange { .. } => "row_out_of_range",
            Error::ShapeMismatch { .. } => "shape_mismatch",
            Error::TypeMismatch { .. } => "type_mismatch",
            Error::ViewType { .. } => "view_type",
            Error::ViewLayout { .. } => "view_layout",
            Error::InvalidAlignment { .. } => "invalid_alignment",
            Error::BufferTooLarge { .. } => "buffer_too_large",
            Error::Alloc { .. } => "alloc",
            Error::OutOfBuffer { .. } => "out_of_buffer",
            Error::MisalignedPlacement { .. } => "misaligned_placement",
            Error::ReadOnly { .. } => "read_only",
            Error::NotHost { .. } => "not_host",
            Error::NoDequantize { .. } => "no_dequantize",
            Error::RaggedBlocks { .. } => "ragged_blocks",
            Error::OutputLength { .. } => "output_length",
            Error::NonFiniteData { .. } => "non_finite_data",
            Error::MmapFailed { .. } => "mmap_failed",
            Error::FallbackFailed { .. } => "fallback_failed",
            Error::Cancelled => "cancelled",
            Error::MissingShard { .. } => "missing_shard",
            Error::NotAShard { .. } => "not_a_shard",
            Error::SplitCountMismatch { .. } => "split_count_mismatch",
            Error::SplitNoInvalid { .. } => "split_no_invalid",
            Error::SplitTensorsCount { .. } => "split_tensors_count",
            Error::DuplicateShardTensor { .. } => "duplicate_shard_tensor",
            Error::TensorNotInShard { .. } => "tensor_not_in_shard",
            Error::UnlistedShardTensor { .. } => "unlisted_shard_tensor",
            Error::ShardIndex { .. } => "shard_index",
            Error::AllocSizeTooSmall { .. } => "alloc_size_too_small",
            Error::HostPtrUnsupported { .. } => "host_ptr_unsupported",
            Error::Mlock { .. } => "mlock",
            Error::OverBudget { .. } => "over_budget",
            Error::Transform { .. } => "transform",
        }
    }
}

/// The category of an [`Error`] ([`Error::kind`]): what a caller can do
/// about it, whatever the precise variant. Each has one C ABI code
/// (`WM_ERR_*` in `weightmap.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file is not a valid model: malformed, truncated, inconsistent
    /// shards, or not what the caller's shape check expects.
    InvalidFile,
    /// The operating system refused an operation on a file (missing,
    /// unreadable, no space, ...): see the `io::Error` inside.
    Io,
    /// A key or tensor name that is not there.
    NotFound,
    /// A metadata value of another type than asked for.
    WrongType,
    /// The caller asked for something out of range or not allowed
    /// (a row past the end, a write to a read-only buffer, ...).
    InvalidArgument,
    /// The mapped path could not be used and fallback was off.
    MmapFailed,
    /// Memory could not be had (or a size does not fit in memory).
    OutOfMemory,
    /// Valid, but not something weightmap does (dequantizing Q8_1, ...).
    Unsupported,
    /// The caller stopped the operation.
    Cancelled,
}

impl ErrorKind {
    /// A short, stable name: `"invalid_file"`, `"io"`, `"not_found"`,
    /// `"wrong_type"`, `"invalid_argument"`, `"mmap_failed"`,
    /// `"out_of_memory"`, `"unsupported"`, `"cancelled"`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidFile => "invalid_file",
            ErrorKind::Io => "io",
            ErrorKind::NotFound => "not_found",
            ErrorKind::WrongType => "wrong_type",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::MmapFailed => "mmap_failed",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the mapped path was not used. Only causes the stream path can do
/// better on are fallback reasons; a missing, unreadable, empty or invalid
/// file is an [`Error`] in either mode.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FallbackReason {
    /// This platform has no file mapping weightmap uses.
    Unsupported,
    /// The buffer type cannot view host memory: it is not host-visible and
    /// has no `buffer_from_host_ptr`, so tensors must be copied to it.
    NotHostBuffer {
        /// The buffer type's name.
        buffer_type: String,
    },
    /// `mmap` failed (a filesystem that refuses it, no address space, ...).
    Map {
        /// The OS error.
        error: String,
    },
    /// A tensor's address is not aligned for its buffer type, and the
    /// options asked for every tensor mapped or none
    /// (`LoadOptions::require_all_mapped`). Without that option, such a
    /// tensor is copied and the rest stay mapped.
    Misaligned {
        /// The first such tensor, in file order.
        tensor: String,
        /// Its address in the mapping.
        address: usize,
        /// Its file offset.
        file_offset: u64,
        /// The alignment it needs.
        alignment: usize,
    },
    /// The file changed between being opened and being placed: its length
    /// or modification time, or the path now names another file.
    FileChanged {
        /// What changed, e.g. `length 4096 -> 2048`.
        detail: String,
    },
}

impl FallbackReason {
    /// A short, stable name: `"unsupported"`, `"not_host"`, `"map"`,
    /// `"misaligned"`, `"file_changed"`.
    pub fn name(&self) -> &'static str {
        match self {
            FallbackReason::Unsupported => "unsupported",
            FallbackReason::NotHostBuffer { .. } => "not_host",
            FallbackReason::Map { .. } => "map",
            FallbackReason::Misaligned { .. } => "misaligned",
            FallbackReason::FileChanged { .. } => "file_changed",
        }
    }
}

impl std::fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FallbackReason::Unsupported => write!(f, "file mapping is not supported on this platform"),
            FallbackReason::NotHostBuffer { buffer_type } => write!(
                f,
                "buffer type '{buffer_type}' is not host-visible and cannot wrap host memory"
            ),
            FallbackReason::Map { error } => write!(f, "mmap failed: {error}"),
            FallbackReason::Misaligned {
                tensor,
                address,
                file_offset,
                alignment,
            } => write!(
                f,
                "tensor '{tensor}' at file offset {file_offset} (address {address:#x}) is not aligned to {alignment}"
            ),
            FallbackReason::FileChanged { detail } => write!(f, "the file changed while mapped: {detail}"),
        }
    }
}

/// One rule of ggml's parser that weightmap's default validation does not
/// apply. See [`crate::gguf::check_ggml`] for each rule's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlRule {
    /// A key, string value or string array element longer than
    /// [`GgmlRule::MAX_STRING_LENGTH`].
    StringLength,
    /// An array with more than [`GgmlRule::MAX_ARRAY_ELEMENTS`] elements.
    ArrayLength,
    /// Two tensor names equal up to their first NUL byte.
    TensorName,
    /// A tensor offset other than the running sum of padded sizes (a gap,
    /// tensors out of order, or padding other than the alignment's).
    PackedOffsets,
    /// A data section that, padded to the alignment, runs past the file.
    DataSection,
}

impl GgmlRule {
    /// Every rule, in the order [`check_ggml`](crate::gguf::check_ggml) applies them.
    pub const ALL: [GgmlRule; 5] = [
        GgmlRule::StringLength,
        GgmlRule::ArrayLength,
        GgmlRule::TensorName,
        GgmlRule::PackedOffsets,
        GgmlRule::DataSection,
    ];

    /// A short, stable name: `"string_length"`, `"array_length"`,
    /// `"tensor_name"`, `"packed_offsets"`, `"data_section"`.
    pub fn name(self) -> &'static str {
        match self {
            GgmlRule::StringLength => "string_length",
            GgmlRule::ArrayLength => "array_length",
            GgmlRule::TensorName => "tensor_name",
            GgmlRule::PackedOffsets => "packed_offsets",
            GgmlRule::DataSection => "data_section",
        }
    }

    /// Who refuses a file that breaks the rule: `"llama.cpp"` for every rule
    /// but [`GgmlRule::DataSection`], which only readers that load tensor
    /// data through ggml (`gguf_init_from_file` with `no_alloc = false`)
    /// apply; llama.cpp's model loader reads metadata only (`no_alloc =
    /// true`) and checks each tensor's end, which the default rules do too.
    pub fn refused_by(self) -> &'static str {
        match self {
            GgmlRule::DataSection => {
                "ggml's gguf_init_from_file with tensor data (not llama.cpp's loader, \
                 which reads metadata only)"
            }
            _ => "llama.cpp",
        }
    }

    /// What the rule requires, in a few words.
    pub fn description(self) -> &'static str {
        match self {
            GgmlRule::StringLength => "strings of at most 1 GiB",
            GgmlRule::ArrayLength => "arrays of at most 2^30 elements",
            GgmlRule::TensorName => "tensor names unique up to a NUL byte",
            GgmlRule::PackedOffsets => "tensors packed in order",
            GgmlRule::DataSection => "data section padded to the alignment within the file",
        }
    }
}

impl std::fmt::Display for GgmlRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
