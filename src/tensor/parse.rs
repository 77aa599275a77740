//! [`Parse`]: what parsing a header from a file's first bytes gives.

/// The outcome of parsing a header from the first bytes of a file
/// ([`crate::gguf::GgufHeader::parse_prefix`],
/// [`crate::safetensors::SafetensorsHeader::parse_prefix`]): the header, or
/// how long a prefix to try next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<T> {
    /// The prefix held the whole header.
    Complete(T),
    /// The prefix ends inside the header; at least `min_len` bytes of the file are needed.
    NeedMore {
        /// The prefix length to try next (at most the file's length).
        min_len: u64,
    },
}

impl<T> Parse<T> {
    /// The same outcome with the header mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Parse<U> {
        match self {
            Parse::Complete(h) => Parse::Complete(f(h)),
            Parse::NeedMore { min_len } => Parse::NeedMore { min_len },
        }
    }
}
