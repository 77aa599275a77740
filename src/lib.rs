#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

mod alloc;
pub mod buffer;
pub mod error;
pub mod format;
pub mod gen;
pub mod gguf;
pub mod loader;
pub mod mmap;
pub mod outfile;
pub mod safetensors;
pub mod tensor;
pub mod types;

pub use error::{Error, Result};
pub use format::{Format, Header};
pub use loader::{
    FallbackReason, LoadMode, LoadOptions, LoadReport, MappedWeights, OwnedTensor, Prefetch,
    TensorRef, Weights, WeightsHeader,
};
pub use mmap::AccessAdvice;
pub use tensor::TensorInfo;
pub use types::TensorType;
