//! Handles a runtime keeps: [`Tensor`], a `'static` tensor that owns a share
//! of its [`Weights`], and [`Scope`], lookups narrowed to a name prefix
//! (`blk.3.`), with [`Weights::blocks`] to walk the layers.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::buffer::Placement;
use crate::error::Result;
use crate::tensor::Element;
use crate::tensor::TensorInfo;
use crate::types::TensorType;

use super::tensor_ref::TensorRef;
use super::weights::Weights;
use crate::loader::report::PlacementKind;

/// A tensor that holds its [`Weights`] through an `Arc`, so a model struct
/// can own its tensors (`struct Layer { q: Tensor, .. }`) without borrowing.
/// It has the same view, row and dequantize API as [`TensorRef`]; each call
/// borrows from this handle, which keeps the weights (and any mapping) alive.
///
/// ```
/// use std::sync::Arc;
/// use weightmap::{gguf::Writer, LoadOptions, Tensor, TensorType, Weights};
/// # fn main() -> weightmap::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("m.gguf");
/// # let mut w = Writer::new(32);
/// # w.tensor("token_embd.weight", TensorType::F32, &[4, 3], (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect());
/// # std::fs::write(&path, w.to_bytes()).unwrap();
/// struct Model {
///     embd: Tensor,
/// }
/// let weights = Arc::new(Weights::load_streamed(&path, &LoadOptions::default())?);
/// let model = Model { embd: Tensor::new(&weights, "token_embd.weight")? };
/// drop(weights); // the model's tensors keep the weights alive
/// let mut row = [0f32; 4];
/// model.embd.row_f32(2, &mut row)?;
/// assert_eq!(row, [8.0, 9.0, 10.0, 11.0]);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Tensor {
    weights: Arc<Weights>,
    index: usize,
}

impl Tensor {
    /// The tensor `name` of shared `weights`.
    ///
    /// # Errors
    /// [`crate::Error::TensorNotFound`].
    pub fn new(weights: &Arc<Weights>, name: &str) -> Result<Tensor> {
        let index = weights.index_of(name)?;
        Ok(Tensor {
            weights: Arc::clone(weights),
            index,
        })
    }

    /// The `i`th tensor in file order, if there is one.
    pub fn at(weights: &Arc<Weights>, i: usize) -> Option<Tensor> {
        (i < weights.len()).then(|| Tensor {
            weights: Arc::clone(weights),
            index: i,
        })
    }

    /// The weights it belongs to.
    pub fn weights(&self) -> &Arc<Weights> {
        &self.weights
    }

    /// The borrowed handle, for anything [`TensorRef`] has.
    pub fn get(&self) -> TensorRef<'_> {
        // `index` was checked against these weights when made.
        self.weights
            .tensor_at(self.index)
            .expect("a Tensor's index is in range of its own weights")
    }

    /// The descriptor.
    pub fn info(&self) -> TensorInfo<'_> {
        self.get().info()
    }
    /// The name.
    pub fn name(&self) -> &str {
        self.get().name()
    }
    /// Where it sits in its buffer.
    pub fn placement(&self) -> Placement {
        self.get().placement()
    }
    /// Mapped or copied.
    pub fn placement_kind(&self) -> PlacementKind {
        self.get().placement_kind()
    }
    /// The bytes, when host-visible.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        self.get().host_bytes()
    }
    /// See [`TensorRef::view`].
    ///
    /// # Errors
    /// As [`TensorRef::view`].
    pub fn view<T: Element>(&self) -> Result<&[T]> {
        self.get().view()
    }
    /// See [`TensorRef::to_vec`].
    ///
    /// # Errors
    /// As [`TensorRef::to_vec`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        self.get().to_vec()
    }
    /// See [`TensorRef::n_rows`].
    pub fn n_rows(&self) -> u64 {
        self.get().n_rows()
    }
    /// See [`TensorRef::row_len`].
    pub fn row_len(&self) -> u64 {
        self.get().row_len()
    }
    /// See [`TensorRef::row`].
    ///
    /// # Errors
    /// As [`TensorRef::row`].
    pub fn row(&self, i: u64) -> Result<&[u8]> {
        self.get().row(i)
    }
    /// See [`TensorRef::row_as`].
    ///
    /// # Errors
    /// As [`TensorRef::row_as`].
    pub fn row_as<T: Element>(&self, i: u64) -> Result<&[T]> {
        self.get().row_as(i)
    }
    /// See [`TensorRef::rows`].
    ///
    /// # Errors
    /// As [`TensorRef::rows`].
    pub fn rows(&self) -> Result<std::slice::ChunksExact<'_, u8>> {
        self.get().rows()
    }
    /// See [`TensorRef::row_f32`].
    ///
    /// # Errors
    /// As [`TensorRef::row_f32`].
    pub fn row_f32(&self, i: u64, out: &mut [f32]) -> Result<()> {
        self.get().row_f32(i, out)
    }
    /// See [`TensorRef::rows_f32`].
    ///
    /// # Errors
    /// As [`TensorRef::rows_f32`].
    pub fn rows_f32(&self, rows: std::ops::Range<u64>, out: &mut [f32]) -> Result<()> {
        self.get().rows_f32(rows, out)
    }
    /// See [`TensorRef::dequantize_into`].
    ///
    /// # Errors
    /// As [`TensorRef::dequantize_into`].
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<()> {
        self.get().dequantize_into(out)
    }
    /// See [`TensorRef::to_f32_vec`].
    ///
    /// # Errors
    /// As [`TensorRef::to_f32_vec`].
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.get().to_f32_vec()
    }
}

/// Lookups under a name prefix: `weights.prefix("blk.3.").tensor("attn_q.weight")`
/// finds `blk.3.attn_q.weight`.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'w> {
    weights: &'w Weights,
    prefix: &'w str,
}

impl<'w> Scope<'w> {
    /// The prefix.
    pub fn prefix(&self) -> &'w str {
        self.prefix
    }

    /// The tensor `prefix + name`.
    ///
    /// # Errors
    /// [`crate::Error::TensorNotFound`] with the full name.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'w>> {
        self.weights.tensor(&format!("{}{name}", self.prefix))
    }

    /// The tensor `prefix + name`, if present.
    pub fn opt_tensor(&self, name: &str) -> Option<TensorRef<'w>> {
        self.tensor(name).ok()
    }

    /// The tensor `prefix + name`, checked to have shape `ne` (ggml order)
    /// and one of `types` (any, when empty).
    ///
    /// # Errors
    /// [`crate::Error::TensorNotFound`], [`crate::Error::ShapeMismatch`], [`crate::Error::TypeMismatch`].
    pub fn tensor_checked(
        &self,
        name: &str,
        ne: &[u64],
        types: &[TensorType],
    ) -> Result<TensorRef<'w>> {
        self.tensor(name)?.check_shape(ne, types)
    }

    /// Every tensor under the prefix, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'w>> + 'w {
        let prefix = self.prefix;
        self.weights
            .tensors()
            .filter(move |t| t.name().starts_with(prefix))
    }
}

impl Weights {
    /// Lookups narrowed to names starting with `prefix`.
    pub fn prefix<'w>(&'w self, prefix: &'w str) -> Scope<'w> {
        Scope {
            weights: self,
            prefix,
        }
    }

    /// The tensor `name`, checked to have shape `ne` (ggml order) and one of
    /// `types` (any, when empty).
    ///
    /// # Errors
    /// [`crate::Error::TensorNotFound`], [`crate::Error::ShapeMismatch`], [`crate::Error::TypeMismatch`].
    pub fn tensor_checked(
        &self,
        name: &str,
        ne: &[u64],
        types: &[TensorType],
    ) -> Result<TensorRef<'_>> {
        self.tensor(name)?.check_shape(ne, types)
    }

    /// The layers: tensors named `blk.N.*` grouped by `N`, in order of `N`,
    /// each as a [`Scope`] over `blk.N.`.
    pub fn blocks(&self) -> Vec<(u32, Scope<'_>)> {
        let mut seen: BTreeMap<u32, &str> = BTreeMap::new();
        for t in self.tensor_infos() {
            let Some(rest) = t.name.strip_prefix("blk.") else {
                continue;
            };
            let Some((n, _)) = rest.split_once('.') else {
                continue;
            };
            if let Ok(i) = n.parse::<u32>() {
                // The prefix, borrowed from the tensor's own name.
                seen.entry(i).or_insert(&t.name[..4 + n.len() + 1]);
            }
        }
        seen.into_iter()
            .map(|(i, prefix)| (i, self.prefix(prefix)))
            .collect()
    }
}
