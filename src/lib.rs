#![doc = "weightmap: map model weights read-only, validate them, place them in backend buffers."]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod error;
pub mod gguf;
pub mod tensor;
pub mod types;

pub use error::{Error, Result};
pub use tensor::TensorInfo;
pub use types::TensorType;

/// Placeholder until the loader lands.
pub mod loader {
    /// Why the mapped path was not used.
    #[derive(Debug)]
    pub struct FallbackReason;
    impl std::fmt::Display for FallbackReason {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("?")
        }
    }
}
