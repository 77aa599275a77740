//! The copying paths: the stream path ([`stream`]: every tensor read into
//! owned buffers), and what it shares with the mapped path for the tensors
//! that cannot be viewed in place: owned buffers laid out and filled
//! ([`place`]), read in parallel, directly from storage where that wins
//! ([`read`]).

pub(crate) mod place;
pub(crate) mod read;
pub(crate) mod stream;
