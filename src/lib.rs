#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

// The layers, lowest first; every import points down (tests/layers.rs
// checks it): error and types; os and alloc; the formats (tensor, gguf,
// safetensors, format); buffer and quant; the loader; the transform cache.
mod alloc;
pub mod buffer;
pub mod cache;
mod error;
mod format;
pub mod gguf;
mod loader;
mod os;
pub mod quant;
pub mod safetensors;
mod tensor;
mod types;

pub use error::{Error, ErrorKind, FallbackReason, Result};
pub use format::{Format, Header};
pub use loader::{
    AdvicePolicy, BorrowedWeights, Budget, BufferReport, CopiedTensor, CopyReason, DirectIo,
    DirectOutcome, HugePages, LoadMode, LoadOptions, LoadReport, MappedWeights, ModelHeaders,
    OwnedTensor, Pass, PlacementKind, Prefetch, PrefetchDecision, PrefetchProgress, PrefetchState,
    ProgressFn, ReadReport, Reread, RereadRefusal, Route, Scope, ShardReport, SkipReason, Tensor,
    TensorRef, Weights,
};
pub use os::{
    evict, file_residency, page_size, transparent_huge_pages, AccessAdvice, Residency,
    TransparentHugePages,
};
pub use tensor::{Element, Parse, TensorInfo, TensorTable};
pub use types::TensorType;
