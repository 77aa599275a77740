//! What a caller holds: [`Weights`] (what a load returns, over one file or
//! several), the tensors it hands out ([`TensorRef`] borrowed, [`Tensor`]
//! shared and `'static`, [`OwnedTensor`] a writable copy), [`Scope`]
//! (lookups under a name prefix), [`Pass`] (every tensor once, in file
//! order, within the memory budget) and [`Need`] (what a runtime announces
//! it reads next, for [`Weights::prefetch`]).

mod announce;
mod handle;
mod pass;
mod tensor_ref;
mod weights;

pub use announce::Need;
pub use handle::{Scope, Tensor};
pub use pass::Pass;
pub use tensor_ref::{OwnedTensor, TensorRef};
pub use weights::{BorrowedWeights, MappedWeights, Weights};
