//! The loader: [`Weights::load`] maps a file and places its tensors
//! zero-copy (copying only those that cannot be viewed in place), or streams
//! them into owned buffers, and reports which ran.
//!
//! One idea a module: [`options`](LoadOptions) (what to do), `report` (what
//! was done), `mapped` (the mapped path), `stream` (the stream path),
//! `page_plan` (every page-size decision of a mapped load, made once),
//! `prefetch` (the prefetcher that carries it out), `place` (owned buffers
//! laid out and filled, shared by both), `weights`
//! (the [`Weights`] facade and its tensor handles).
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
mod handle;
mod headers;
mod loaded;
mod mapped;
mod options;
mod page_plan;
mod pass;
mod place;
mod prefetch;
mod read;
mod report;
mod shards;
mod source;
mod stream;
mod tensor_ref;
mod weights;

pub use handle::{Scope, Tensor};
pub use headers::ModelHeaders;
pub use options::{LoadMode, LoadOptions, Route};
pub use page_plan::{AdvicePolicy, Prefetch, Reread, RereadRefusal, SkipReason};
pub use pass::Pass;
pub use prefetch::{PrefetchDecision, PrefetchProgress, PrefetchState};
pub use read::{DirectIo, DirectOutcome, ProgressFn, ReadReport};
pub use report::{
    Budget, BufferReport, CopiedTensor, CopyReason, HugePages, LoadReport, PlacementKind,
    ShardReport,
};
pub use tensor_ref::{OwnedTensor, TensorRef};
pub use weights::{BorrowedWeights, MappedWeights, Weights};

#[cfg(test)]
mod tests;
