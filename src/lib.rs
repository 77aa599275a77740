#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

// The layers, lowest first; every import points down (tests/layers.rs
// checks it): error and types; os and alloc; the formats (tensor, gguf,
// safetensors, format); buffer, quant and the page plan; the loader; the
// transform cache.
mod alloc;
pub mod buffer;
pub mod cache;
mod error;
mod format;
pub mod gguf;
mod loader;
mod os;
mod page_plan;
pub mod quant;
pub mod safetensors;
mod size;
mod tensor;
mod types;

pub use error::{Error, ErrorKind, FallbackReason, Result};
pub use format::{Format, Header};
pub use loader::{
    BorrowedWeights, Budget, BufferReport, CopiedTensor, CopyReason, DirectIo, DirectOutcome,
    HugePages, LoadMode, LoadOptions, LoadReport, MappedWeights, ModelHeaders, Need, OwnedTensor,
    Pass, PlacementKind, ReadReport, Route, Scope, ShardReport, Tensor, TensorRef, Weights,
};
pub use os::{
    evict, file_residency, page_size, transparent_huge_pages, AccessAdvice, Residency,
    TransparentHugePages,
};
pub use page_plan::{
    AdvicePolicy, Prefetch, PrefetchDecision, PrefetchProgress, PrefetchState, ProgressFn, Reread,
    RereadRefusal, ResidencyPlan, SkipReason,
};
pub use tensor::{Element, Parse, TensorInfo, TensorTable};
pub use types::TensorType;
