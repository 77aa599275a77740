#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

mod alloc;
pub mod buffer;
pub mod error;
pub mod format;
pub mod gguf;
pub mod loader;
pub mod mmap;
pub mod prefetch;
pub mod quant;
pub mod safetensors;
pub mod tensor;
pub mod types;

pub use bytemuck::Pod;
pub use error::FallbackReason;
pub use error::{Error, Result};
pub use format::{Format, Header};
pub use half::{bf16, f16};
pub use loader::{
    CopyReason, LoadMode, LoadOptions, LoadReport, MappedWeights, OwnedTensor, PlacementKind,
    Prefetch, Scope, Tensor, TensorRef, Weights, WeightsHeader,
};
pub use mmap::AccessAdvice;
pub use prefetch::{AdvicePolicy, PrefetchDecision};
pub use tensor::TensorInfo;
pub use types::TensorType;
