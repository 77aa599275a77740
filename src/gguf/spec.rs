//! The format's constants, as ggml's `gguf.h` and `gguf.cpp` define them.

/// The GGUF magic, the file's first four bytes.
pub(crate) const MAGIC: [u8; 4] = *b"GGUF";

/// The alignment that applies when `general.alignment` is absent.
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;

/// The key that sets the data alignment.
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";

/// Longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME - 1`).
pub(crate) const MAX_NAME_LEN: u64 = 63;

/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub(crate) const MAX_DIMS: u32 = 4;
