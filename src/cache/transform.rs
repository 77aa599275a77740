//! What goes into an entry: [`EntryContents`], the general form (extra
//! metadata, the tensors' names, types and shapes, and a fill for each),
//! and [`Transform`], the common case of one output tensor per source
//! tensor computed by a closure from the source's bytes.

use crate::error::Result;

use super::key::TransformId;
use crate::gguf::OwnedValue;
use crate::loader::Weights;
use crate::tensor::TensorInfo;
use crate::types::TensorType;

/// A tensor an entry will hold, as [`EntryContents::tensors`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    /// Its name (at most 63 bytes, GGUF's limit).
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Its shape in ggml order (`ne[0]` first).
    pub ne: Vec<u64>,
}

/// The contents of an entry, produced once, on a miss.
///
/// After a miss ([`crate::cache::Cache::lookup`]),
/// [`Miss::store`](crate::cache::Miss::store) and its kin ask for
/// [`tensors`](Self::tensors) and [`metadata`](Self::metadata) to lay the
/// entry out, then for each tensor's bytes ([`bytes`](Self::bytes) where
/// the contents hold them, else [`fill`](Self::fill)), in order, straight
/// into the entry's file (or, when the cache cannot be written, into
/// memory: then `fill` may be called a second time for the same tensor).
pub trait EntryContents {
    /// The tensors, in the order they are filled and stored.
    fn tensors(&self) -> Vec<PlannedTensor>;

    /// Extra GGUF key/values to store (keys outside `weightmap.cache.`).
    fn metadata(&self) -> Vec<(String, OwnedValue)> {
        Vec::new()
    }

    /// Tensor `index`'s bytes, when the contents already hold them in
    /// memory (a converted state dict, say): then they are written to the
    /// entry's file past the page cache where the system can (`O_DIRECT`),
    /// so that the entry does not cost its size again in memory while it
    /// is written, and `fill` is not called. `None` (the default) for any
    /// tensor: every tensor is `fill`ed.
    fn bytes(&self, index: usize) -> Option<&[u8]> {
        let _ = index;
        None
    }

    /// Write tensor `index`'s bytes into `dst` (exactly its size, zeroed).
    /// An `Err` stops the fill; its message is reported as
    /// [`crate::Error::Transform`].
    fn fill(&mut self, index: usize, dst: &mut [u8]) -> std::result::Result<(), String>;
}

type Select<'a> = dyn Fn(&TensorInfo<'_>) -> Option<(TensorType, Vec<u64>)> + 'a;
type Apply<'a> = dyn Fn(&TensorInfo<'_>, &[u8], &mut [u8]) -> std::result::Result<(), String> + 'a;

/// A transform of a model's tensors, one at a time: a closure from a
/// source tensor's bytes to its transformed bytes, with the name and
/// version that key its entries.
///
/// Bump the version whenever the output changes for the same input, and
/// name in [`machine`](Transform::machine) every fact of the machine the
/// output depends on (the CPU features a repack targets, say): entries made
/// under other facts are then never used. weightmap adds the page size,
/// the architecture and the OS itself.
///
/// ```
/// use weightmap::cache::Transform;
/// use weightmap::TensorType;
///
/// // Every F32 tensor, negated; other tensors are left out of the entry.
/// let negate = Transform::new("negate", 1, |_info, src, dst| {
///     for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
///         let x = -f32::from_le_bytes(s.try_into().unwrap());
///         d.copy_from_slice(&x.to_le_bytes());
///     }
///     Ok(())
/// })
/// .select(|info| (info.ty == TensorType::F32).then(|| (TensorType::F32, info.ne())));
/// assert_eq!(negate.id().name, "negate");
/// ```
pub struct Transform<'a> {
    name: String,
    version: u32,
    machine: String,
    select: Box<Select<'a>>,
    apply: Box<Apply<'a>>,
}

impl<'a> Transform<'a> {
    /// A transform called `name`, at `version`, that computes each output
    /// tensor with `apply(source_info, source_bytes, output_bytes)`. By
    /// default every tensor is transformed and keeps its type and shape
    /// (a repack); [`select`](Transform::select) changes that.
    pub fn new(
        name: impl Into<String>,
        version: u32,
        apply: impl Fn(&TensorInfo<'_>, &[u8], &mut [u8]) -> std::result::Result<(), String> + 'a,
    ) -> Transform<'a> {
        Transform {
            name: name.into(),
            version,
            machine: String::new(),
            select: Box::new(|info| Some((info.ty, info.ne()))),
            apply: Box::new(apply),
        }
    }

    /// Which tensors the entry holds, and as what: `Some((type, ne))` for
    /// an output of that type and shape (ggml order), `None` to leave the
    /// tensor out (the caller takes it from the source).
    pub fn select(
        mut self,
        select: impl Fn(&TensorInfo<'_>) -> Option<(TensorType, Vec<u64>)> + 'a,
    ) -> Transform<'a> {
        self.select = Box::new(select);
        self
    }

    /// The machine facts the output depends on, as one string (CPU
    /// features, a kernel's tile size, ...).
    pub fn machine(mut self, facts: impl Into<String>) -> Transform<'a> {
        self.machine = facts.into();
        self
    }

    /// What keys its entries: the name, version and machine facts.
    pub fn id(&self) -> TransformId {
        TransformId {
            name: self.name.clone(),
            version: self.version,
            machine: self.machine.clone(),
        }
    }

    /// This transform of `source`: the contents of its entry.
    pub(crate) fn contents<'t>(&'t self, source: &'t Weights) -> Result<TransformOf<'t, 'a>> {
        let mut picked = Vec::new();
        for (i, info) in source.tensor_infos().enumerate() {
            if let Some((ty, ne)) = (self.select)(&info) {
                let planned = PlannedTensor {
                    name: info.name.to_owned(),
                    ty,
                    ne,
                };
                planned.nbytes()?;
                picked.push((i, planned));
            }
        }
        Ok(TransformOf {
            transform: self,
            source,
            picked,
        })
    }
}

/// A [`Transform`] applied to one source.
pub(crate) struct TransformOf<'t, 'a> {
    transform: &'t Transform<'a>,
    source: &'t Weights,
    /// The source tensor's index, and what it becomes.
    picked: Vec<(usize, PlannedTensor)>,
}

impl EntryContents for TransformOf<'_, '_> {
    fn tensors(&self) -> Vec<PlannedTensor> {
        self.picked.iter().map(|(_, t)| t.clone()).collect()
    }

    fn fill(&mut self, index: usize, dst: &mut [u8]) -> std::result::Result<(), String> {
        let (i, _) = &self.picked[index];
        let t = self
            .source
            .tensor_at(*i)
            .ok_or_else(|| format!("source tensor {i} is gone"))?;
        let src = t
            .host_bytes()
            .ok_or_else(|| "the source tensor is not in host memory".to_owned())?;
        (self.transform.apply)(&t.info(), src, dst)
    }
}

impl std::fmt::Debug for Transform<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transform")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}
