//! Where a GGUF header's key/value section ends, found by walking its
//! length fields over the bytes read so far, reading more as the walk needs
//! them.
//!
//! The key/value section is read into memory whole before it is parsed (its
//! descriptors are read through a window after it). Growing the read
//! geometrically until the parse completes overshoots by up to the
//! section's own size and parses it again at every step; the walk reads
//! [`STEP`] bytes at a time into the vector that is kept, so every byte is
//! read once, the parse runs once, and the read overshoots the section by
//! less than a step. Anything odd stops the walk: the parser, which runs
//! next either way, is the one that says what is wrong.

use crate::error::Result;

use super::metadata::ValueType;

/// Bytes the walk reads at a time, at least.
const STEP: u64 = 1 << 20;

/// The walk so far over `bytes`, the first bytes of a `len`-byte model.
struct Walk<'a, R> {
    bytes: &'a mut Vec<u8>,
    read: &'a mut R,
    pos: u64,
    len: u64,
}

impl<R: FnMut(&mut [u8], u64) -> Result<()>> Walk<'_, R> {
    /// Make sure `n` bytes from `pos` are in memory; `Ok(false)` when the
    /// model is shorter than that.
    fn need(&mut self, n: u64) -> Result<bool> {
        let Some(end) = self.pos.checked_add(n).filter(|&e| e <= self.len) else {
            return Ok(false);
        };
        let have = self.bytes.len() as u64;
        if end > have {
            let want = end.max(have.saturating_add(STEP)).min(self.len);
            crate::alloc::read_more(self.bytes, want, self.read)?;
        }
        Ok(true)
    }

    fn bytes<const N: usize>(&mut self) -> Result<Option<[u8; N]>> {
        if !self.need(N as u64)? {
            return Ok(None);
        }
        let at = self.pos as usize;
        self.pos += N as u64;
        Ok(self.bytes[at..at + N].try_into().ok())
    }

    fn u32(&mut self) -> Result<Option<u32>> {
        Ok(self.bytes()?.map(u32::from_le_bytes))
    }

    fn u64(&mut self) -> Result<Option<u64>> {
        Ok(self.bytes()?.map(u64::from_le_bytes))
    }

    /// Step over `n` bytes, which need not be read yet.
    fn skip(&mut self, n: u64) -> Option<()> {
        self.pos = self.pos.checked_add(n).filter(|&p| p <= self.len)?;
        Some(())
    }

    /// A length-prefixed string.
    fn string(&mut self) -> Result<Option<()>> {
        Ok(self.u64()?.and_then(|n| self.skip(n)))
    }
}

/// Walk the key/value section of the GGUF header of a `len`-byte model
/// whose first bytes are `bytes`, reading more into `bytes` (with `read`,
/// given a buffer and the model offset of its first byte) as the walk
/// needs it. Returns where the section ends (the first tensor descriptor's
/// offset), with at least that much of the model in `bytes`, or `None`
/// where the walk meets anything it does not expect (leaving in `bytes`
/// whatever it read).
///
/// # Errors
/// What `read` returns, and [`crate::Error::OutOfMemory`].
pub(crate) fn read_kv(
    bytes: &mut Vec<u8>,
    len: u64,
    mut read: impl FnMut(&mut [u8], u64) -> Result<()>,
) -> Result<Option<u64>> {
    let mut w = Walk {
        bytes,
        read: &mut read,
        pos: 0,
        len,
    };
    let end = walk(&mut w)?;
    // The walk steps over values without reading them: read to the end.
    if let Some(end) = end.filter(|&e| e > w.bytes.len() as u64) {
        crate::alloc::read_more(w.bytes, end, w.read)?;
    }
    Ok(end)
}

/// The walk itself: `Ok(None)` at anything unexpected.
fn walk<R: FnMut(&mut [u8], u64) -> Result<()>>(w: &mut Walk<'_, R>) -> Result<Option<u64>> {
    macro_rules! get {
        ($e:expr) => {
            match $e? {
                Some(v) => v,
                None => return Ok(None),
            }
        };
    }
    if get!(w.bytes::<4>()) != super::spec::MAGIC {
        return Ok(None);
    }
    let len = w.len;
    let _version = get!(w.u32());
    let n_tensors = get!(w.u64());
    let n_kv = get!(w.u64());
    // Each pair and each descriptor takes bytes: counts past the file are
    // the parser's to report.
    if n_kv > len / 8 || n_tensors > len / 24 {
        return Ok(None);
    }
    for _ in 0..n_kv {
        get!(w.string()); // the key
        let Some(ty) = ValueType::from_id(get!(w.u32())) else {
            return Ok(None);
        };
        match ty {
            ValueType::String => get!(w.string()),
            ValueType::Array => {
                let Some(elem) = ValueType::from_id(get!(w.u32())) else {
                    return Ok(None);
                };
                let count = get!(w.u64());
                match elem.fixed_size() {
                    Some(size) => {
                        if count.checked_mul(size).and_then(|n| w.skip(n)).is_none() {
                            return Ok(None);
                        }
                    }
                    None if elem == ValueType::String => {
                        if count > len / 8 {
                            return Ok(None);
                        }
                        for _ in 0..count {
                            get!(w.string());
                        }
                    }
                    None => return Ok(None), // nested arrays
                }
            }
            fixed => {
                if fixed.fixed_size().and_then(|n| w.skip(n)).is_none() {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(w.pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Writer;
    use crate::types::TensorType;

    /// `read_kv` over `model`, starting from its first `first` bytes:
    /// the answer, the bytes it left, and the bytes it read (each once).
    fn walk(model: &[u8], first: usize) -> (Option<u64>, Vec<u8>, u64) {
        let mut bytes = model[..first.min(model.len())].to_vec();
        let mut read_bytes = 0u64;
        let end = read_kv(&mut bytes, model.len() as u64, |buf, off| {
            let off = off as usize;
            buf.copy_from_slice(&model[off..off + buf.len()]);
            read_bytes += buf.len() as u64;
            Ok(())
        })
        .unwrap();
        assert_eq!(bytes[..], model[..bytes.len()], "the bytes are the model's");
        (end, bytes, read_bytes)
    }

    #[test]
    fn the_walk_ends_where_the_descriptors_begin() {
        let mut w = Writer::new(64);
        w.kv_str("general.architecture", "llama");
        let tokens: Vec<String> = (0..300_000).map(|i| format!("tok{i}")).collect();
        w.kv_str_array("tokenizer.ggml.tokens", &tokens);
        w.kv_f32_array("tokenizer.ggml.scores", &vec![0.5; 300_000]);
        for i in 0..300 {
            w.tensor(&format!("blk.{i}.w"), TensorType::F32, &[4, 2], vec![0; 32]);
        }
        let bytes = w.to_bytes();
        let h = crate::gguf::GgufHeader::parse(&bytes).unwrap();
        // The first descriptor: 300 of them end the header, each a name
        // length, a name, n_dims, 2 dims, a type and an offset.
        let descriptors: u64 = (0..300)
            .map(|i| 8 + format!("blk.{i}.w").len() as u64 + 4 + 16 + 4 + 8)
            .sum();
        let kv = h.header_len() - descriptors;
        assert!(kv > 3 * STEP, "{kv}");
        for first in [0, 24, 1000, STEP as usize] {
            let (end, held, read) = walk(&bytes, first);
            assert_eq!(end, Some(kv), "from {first} bytes");
            // It holds the section, overshoots it by less than a step,
            // and read each byte once.
            assert!(held.len() as u64 >= kv && (held.len() as u64) < kv + STEP);
            assert_eq!(read, held.len() as u64 - first as u64);
        }
        // Cut short: no end, and never a read past the model.
        let cut = kv as usize - 1;
        assert_eq!(walk(&bytes[..cut], 0).0, None);
        // Not GGUF, or a count the file cannot hold: no end.
        assert_eq!(walk(b"GGUX and more bytes than that", 0).0, None);
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(walk(&huge, 0).0, None);
    }
}
