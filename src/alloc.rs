//! Allocations whose size a file decides: fallible, so that a hostile or
//! huge file is [`Error::OutOfMemory`], never an abort.

use crate::error::{Error, Result};

/// [`Error::OutOfMemory`] for `n` elements of `T` needed for `what`.
fn oom<T>(what: &'static str, n: usize) -> Error {
    Error::OutOfMemory {
        what,
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    }
}

/// An empty vector with room for `n` elements.
pub(crate) fn with_capacity<T>(n: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| oom::<T>(what, n))?;
    Ok(v)
}

/// Make room in `v` for `more` elements.
pub(crate) fn reserve<T>(v: &mut Vec<T>, more: usize, what: &'static str) -> Result<()> {
    v.try_reserve(more)
        .map_err(|_| oom::<T>(what, v.len().saturating_add(more)))
}

/// Push `x`, growing `v` (geometrically) without aborting.
pub(crate) fn push<T>(v: &mut Vec<T>, x: T, what: &'static str) -> Result<()> {
    if v.len() == v.capacity() {
        reserve(v, v.len().max(16), what)?;
    }
    v.push(x);
    Ok(())
}

/// `s` as an owned string, without aborting.
pub(crate) fn string(s: &str, what: &'static str) -> Result<String> {
    let mut out = String::new();
    out.try_reserve_exact(s.len())
        .map_err(|_| Error::OutOfMemory {
            what,
            bytes: s.len() as u64,
        })?;
    out.push_str(s);
    Ok(out)
}

/// Collect `it` (of known length) without aborting.
pub(crate) fn collect<T>(
    it: impl ExactSizeIterator<Item = T>,
    what: &'static str,
) -> Result<Vec<T>> {
    let mut v = with_capacity(it.len(), what)?;
    v.extend(it);
    Ok(v)
}

/// `0..n` as u32 indices (tables are bounded by the file size, far below 2^32
/// entries for any file an index is built for).
pub(crate) fn index(n: usize, what: &'static str) -> Result<Vec<u32>> {
    let mut v = with_capacity(n, what)?;
    v.extend(0..n as u32);
    Ok(v)
}

/// Extend `v` to `len` bytes (from its length now), filled by `read` with
/// the bytes from the offset of its first new byte (`read(buf, offset)`).
///
/// # Errors
/// [`Error::OutOfMemory`], and what `read` returns.
pub(crate) fn read_more(
    v: &mut Vec<u8>,
    len: u64,
    read: &mut impl FnMut(&mut [u8], u64) -> Result<()>,
) -> Result<()> {
    let have = v.len();
    let len = usize::try_from(len).map_err(|_| Error::OutOfMemory {
        what: "the header",
        bytes: len,
    })?;
    reserve(v, len.saturating_sub(have), "the header")?;
    crate::os::prefault_spare(v, len.saturating_sub(have));
    v.resize(len.max(have), 0);
    read(&mut v[have..], have as u64)
}
