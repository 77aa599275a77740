//! The loader: [`Weights::load`] maps a file and places its tensors
//! zero-copy (copying only those that cannot be viewed in place), or streams
//! them into owned buffers, and reports which ran.
//!
//! Three wings, each a folder, over a floor they share:
//!
//! - `mapped/`: the mapped path (map, validate, view in place, prefetch as
//!   the [page plan](crate::page_plan) says);
//! - `copy/`: the copying paths (the stream path, and the owned buffers
//!   that both paths lay out and fill, read in parallel, directly from
//!   storage where that wins);
//! - `handles/`: what a caller holds ([`Weights`], [`TensorRef`],
//!   [`Tensor`], [`Scope`], [`Pass`]);
//! - the floor: [`options`](LoadOptions) (what to do), `report` (what was
//!   done), `budget` (the memory a load is held to), `source` (where the
//!   bytes are), `loaded` (what a path made of one file), `shards` and
//!   `headers` (models in several files).
//!
//! Arrows point from the handles to the paths and from the paths to the
//! floor, and the mapped path uses the copying one for what it cannot view
//! in place (tests/layers.rs).
//!
//! ```
//! use weightmap::{gguf::Writer, LoadMode, LoadOptions, TensorType, Weights};
//! # fn main() -> weightmap::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.gguf");
//! let mut w = Writer::new(32);
//! w.kv_u32("llama.block_count", 1);
//! w.tensor("w", TensorType::F32, &[4], 1.5f32.to_le_bytes().repeat(4));
//! w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
//!
//! // SAFETY: nothing modifies or truncates the file while `weights` lives.
//! let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
//! assert_eq!(weights.report().tensors_mapped, 1);
//! assert_eq!(weights.report().mode_used, LoadMode::Mmap);
//! assert_eq!(weights.tensor("w")?.view::<f32>()?, &[1.5; 4]);
//! assert_eq!(weights.gguf_metadata().unwrap().get_u32("llama.block_count")?, 1);
//!
//! // The stream path is safe and gives the same bytes.
//! let streamed = Weights::load_streamed(&path, &LoadOptions::default())?;
//! assert_eq!(streamed.tensor("w")?.to_vec()?, weights.tensor("w")?.to_vec()?);
//! # Ok(()) }
//! ```

pub(crate) mod budget;
mod copy;
mod handles;
mod headers;
mod loaded;
mod mapped;
mod mode;
mod options;
mod report;
mod shards;
mod source;

pub use handles::{
    BorrowedWeights, MappedWeights, Need, OwnedTensor, Pass, Scope, Tensor, TensorRef, Weights,
};
pub use headers::ModelHeaders;
pub use mode::LoadMode;
pub use options::{DirectIo, LoadOptions, Route};
pub use report::{
    Budget, BufferReport, CopiedTensor, CopyReason, DirectOutcome, HugePages, LoadReport,
    PlacementKind, ReadReport, ShardReport,
};

#[cfg(test)]
mod tests;
