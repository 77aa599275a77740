//! Where a GGUF header's key/value section ends, found by walking its
//! length fields through a small buffer, without keeping what is read.
//!
//! The key/value section is read into memory whole before it is parsed (its
//! descriptors are read through a window after it). Growing the read
//! geometrically until the parse completes overshoots by up to the
//! section's own size; walking it first costs one buffered pass over the
//! same bytes and lets the read be exact. Anything odd stops the walk: the
//! parser, which runs next either way, is the one that says what is wrong.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};

use super::metadata::ValueType;

/// Positioned reads of `file` from `base`, as a `Read + Seek` that leaves the
/// file's own position alone.
struct At<'a> {
    file: &'a File,
    pos: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(unix)]
        let n = {
            use std::os::unix::fs::FileExt;
            self.file.read_at(buf, self.pos)?
        };
        #[cfg(not(unix))]
        let n = {
            let mut f = self.file;
            f.seek(SeekFrom::Start(self.pos))?;
            f.read(buf)?
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(_) => None,
        }
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

/// The walk so far: bytes consumed, bounded by the model's length.
struct Walk<'a> {
    r: BufReader<At<'a>>,
    pos: u64,
    len: u64,
}

impl Walk<'_> {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).ok()?;
        self.pos += N as u64;
        (self.pos <= self.len).then_some(b)
    }

    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        self.pos = self.pos.checked_add(n).filter(|&p| p <= self.len)?;
        let buffered = self.r.buffer().len() as u64;
        if n <= buffered {
            self.r.consume(n as usize);
        } else {
            self.r.seek_relative(i64::try_from(n).ok()?).ok()?;
        }
        Some(())
    }

    /// A length-prefixed string.
    fn string(&mut self) -> Option<()> {
        let n = self.u64()?;
        self.skip(n)
    }
}

/// Where the key/value section of the GGUF header of the `len`-byte model
/// at `base` in `file` ends (the first tensor descriptor's offset), or
/// `None` where the walk meets anything it does not expect.
pub(crate) fn kv_len(file: &File, base: u64, len: u64) -> Option<u64> {
    let mut w = Walk {
        r: BufReader::with_capacity(64 << 10, At { file, pos: base }),
        pos: 0,
        len,
    };
    if w.bytes::<4>()? != super::MAGIC {
        return None;
    }
    let _version = w.u32()?;
    let n_tensors = w.u64()?;
    let n_kv = w.u64()?;
    // Each pair and each descriptor takes bytes: counts past the file are
    // the parser's to report.
    if n_kv > len / 8 || n_tensors > len / 24 {
        return None;
    }
    for _ in 0..n_kv {
        w.string()?; // the key
        let ty = ValueType::from_id(w.u32()?)?;
        match ty {
            ValueType::String => w.string()?,
            ValueType::Array => {
                let elem = ValueType::from_id(w.u32()?)?;
                let count = w.u64()?;
                match elem.fixed_size() {
                    Some(size) => w.skip(count.checked_mul(size)?)?,
                    None if elem == ValueType::String => {
                        if count > len / 8 {
                            return None;
                        }
                        for _ in 0..count {
                            w.string()?;
                        }
                    }
                    None => return None, // nested arrays
                }
            }
            fixed => w.skip(fixed.fixed_size()?)?,
        }
    }
    Some(w.pos)
}

#[cfg(all(test, feature = "write"))]
mod tests {
    use super::*;
    use crate::gguf::write::Writer;
    use crate::types::TensorType;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn the_walk_ends_where_the_descriptors_begin() {
        let mut w = Writer::new(64);
        w.kv_str("general.architecture", "llama");
        let tokens: Vec<String> = (0..5000).map(|i| format!("tok{i}")).collect();
        w.kv_str_array("tokenizer.ggml.tokens", &tokens);
        w.kv_f32_array("tokenizer.ggml.scores", &vec![0.5; 5000]);
        for i in 0..300 {
            w.tensor(&format!("blk.{i}.w"), TensorType::F32, &[4, 2], vec![0; 32]);
        }
        let bytes = w.to_bytes();
        let h = crate::gguf::GgufHeader::parse(&bytes).unwrap();
        let f = file_of(&bytes);
        // The first descriptor: 300 of them end the header, each a name
        // length, a name, n_dims, 2 dims, a type and an offset.
        let descriptors: u64 = (0..300)
            .map(|i| 8 + format!("blk.{i}.w").len() as u64 + 4 + 16 + 4 + 8)
            .sum();
        let kv = h.header_len() - descriptors;
        assert_eq!(kv_len(f.as_file(), 0, bytes.len() as u64), Some(kv));
        // At an offset inside a larger file, as for a file range.
        let mut padded = vec![7u8; 4096];
        padded.extend_from_slice(&bytes);
        let f = file_of(&padded);
        assert_eq!(kv_len(f.as_file(), 4096, bytes.len() as u64), Some(kv));
        // Cut short: no length.
        let cut = kv - 1;
        let f = file_of(&bytes[..cut as usize]);
        assert_eq!(kv_len(f.as_file(), 0, cut), None);
        // Not GGUF, or a count the file cannot hold: no length.
        let f = file_of(b"GGUX and more bytes than that");
        assert_eq!(kv_len(f.as_file(), 0, 28), None);
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let f = file_of(&huge);
        assert_eq!(kv_len(f.as_file(), 0, huge.len() as u64), None);
    }
}
