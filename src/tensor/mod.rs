//! What both formats share: the table of tensor descriptors, the outcome of
//! parsing a header from a file's first bytes, and typed views of a
//! tensor's bytes.

mod parse;
mod table;
pub(crate) mod view;

pub use parse::Parse;
pub(crate) use table::TableBuilder;
pub use table::{TensorInfo, TensorTable};
pub use view::Element;
pub(crate) use view::{blocks, view, view_mut};
