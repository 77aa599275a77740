//! Tensor descriptors, shared by both formats.

use crate::error::{Error, Result};
use crate::types::TensorType;

/// One tensor as a weight file describes it: validated, owned, small.
///
/// `shape` is in the file's own order: for GGUF that is ggml's `ne[0]`
/// first (the innermost, fastest-varying dimension); for safetensors it is
/// the numpy order (outermost first). [`TensorInfo::ne`] gives ggml order for
/// both.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub ty: TensorType,
    /// Its dimensions, in the file's order.
    pub shape: Box<[u64]>,
    /// Whether `shape` is outermost first (safetensors) rather than ggml's `ne[0]` first.
    pub outer_first: bool,
    /// Offset of its first byte from the start of the data section.
    pub offset: u64,
    /// Offset of its first byte from the start of the file.
    pub file_offset: u64,
    /// Its size in bytes.
    pub nbytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of the dimensions; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        // Validated at parse time not to overflow.
        self.shape.iter().product()
    }

    /// Dimensions in ggml order, `ne[0]` (innermost) first.
    pub fn ne(&self) -> Vec<u64> {
        let mut v = self.shape.to_vec();
        if self.outer_first {
            v.reverse();
        }
        v
    }

    /// The absolute byte range `[file_offset, file_offset + nbytes)` in the file.
    pub fn file_range(&self) -> std::ops::Range<u64> {
        self.file_offset..self.file_offset + self.nbytes
    }
}

/// Reject tensors that share bytes, in any order. Zero-byte tensors occupy
/// nothing. After sorting by start, if no tensor starts before the previous
/// one ends, the ends increase too, so no two tensors overlap at all.
pub(crate) fn check_overlap(tensors: &[TensorInfo]) -> Result<()> {
    let mut by_start: Vec<&TensorInfo> =
        crate::alloc::with_capacity(tensors.len(), "the overlap check")?;
    by_start.extend(tensors.iter().filter(|t| t.nbytes > 0));
    by_start.sort_unstable_by_key(|t| t.file_offset);
    for w in by_start.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.file_offset < a.file_offset + a.nbytes {
            return Err(Error::TensorOverlap {
                tensor: b.name.clone(),
                start: b.file_offset,
                end: b.file_offset + b.nbytes,
                other: a.name.clone(),
            });
        }
    }
    Ok(())
}

/// Tensor descriptors in file order, indexed by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorTable {
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    by_name: Vec<u32>,
}

impl TensorTable {
    /// Index `tensors` by name; a name that appears twice is
    /// [`Error::DuplicateTensor`].
    pub(crate) fn new(tensors: Vec<TensorInfo>) -> Result<TensorTable> {
        // u32 indices: a table is bounded by the file size, and each entry
        // takes at least 24 bytes of it.
        let mut by_name = crate::alloc::index(tensors.len(), "the tensor name index")?;
        by_name.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
        for w in by_name.windows(2) {
            if tensors[w[0] as usize].name == tensors[w[1] as usize].name {
                return Err(Error::DuplicateTensor {
                    name: tensors[w[1] as usize].name.clone(),
                });
            }
        }
        Ok(TensorTable { tensors, by_name })
    }

    pub(crate) fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Index (in file order) of the tensor called `name`.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.by_name
            .binary_search_by(|&i| self.tensors[i as usize].name.as_str().cmp(name))
            .ok()
            .map(|k| self.by_name[k] as usize)
    }
}
