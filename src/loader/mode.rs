//! Which load path to take ([`LoadMode`]): what options ask for and
//! reports say ran.

/// Which load path to take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadMode {
    /// Map the file read-only and point tensors at it (the default).
    #[default]
    Mmap,
    /// Read the tensors into owned buffers.
    Stream,
}

impl LoadMode {
    /// `"mmap"` or `"stream"`.
    pub fn name(self) -> &'static str {
        match self {
            LoadMode::Mmap => "mmap",
            LoadMode::Stream => "stream",
        }
    }
}
