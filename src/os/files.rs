//! Files this process writes and must not lose or tear: blocks reserved
//! before a mapping writes them, a writable mapping, locks, durable
//! renames, and who may write in a directory. The transform cache
//! (`crate::cache`) is their one user.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::mpsc;

use memmap2::MmapMut;

use super::io::{open_direct_writer, DIRECT_ALIGN};
use super::sys;

pub(crate) use sys::{
    file_identity, is_no_space, is_read_only, shared_dir_problem, sync_dir, try_lock, LOCKS,
};

/// Give `file` exactly `len` bytes, every block of them allocated: where
/// the filesystem cannot reserve blocks, zeros are written. A full disk is
/// an error here, never a SIGBUS from a later write through a mapping.
pub(crate) fn allocate(file: &mut File, len: u64) -> io::Result<()> {
    file.set_len(len)?;
    match sys::reserve(file, len) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => write_zeros(file, len),
        other => other,
    }
}

fn write_zeros(file: &mut File, len: u64) -> io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    file.seek(SeekFrom::Start(0))?;
    let mut left = len;
    while left > 0 {
        // At most CHUNK, which fits usize.
        let n = left.min(CHUNK as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.flush()
}

/// Write all of `buf` at `offset` (`pwrite`; Windows `WriteFile` with an
/// offset), without moving a shared file position.
pub(crate) fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            match std::os::windows::fs::FileExt::seek_write(file, &buf[done..], at) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (file, buf, offset);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Write `pieces` (file offsets and their bytes, in order of offset, not
/// overlapping, ending at most at `len`) as the first `len` bytes of
/// `file`, which this process created at `path` and allocated to `len`
/// bytes; the bytes between pieces are zeros.
///
/// Where the system can (`O_DIRECT` on Linux and Android, unbuffered
/// writes on Windows), the bytes go to the device through a small aligned
/// staging buffer, without taking page-cache pages: written through the
/// cache, a file of N bytes whose contents are already in memory costs N
/// more bytes of (dirty, until written back) memory, charged to the
/// process's cgroup like the rest, and on a VM whose free memory the host
/// has taken back, as many fresh pages, which cost several times the copy
/// (ARCHITECTURE.md, "The transform cache"). Where it cannot, or direct
/// writes fail, positioned buffered writes.
pub(crate) fn write_pieces(
    file: &File,
    path: &Path,
    len: u64,
    pieces: &[(u64, &[u8])],
) -> io::Result<()> {
    debug_assert!(pieces
        .windows(2)
        .all(|w| w[0].0 + w[0].1.len() as u64 <= w[1].0));
    if let Ok(direct) = open_direct_writer(path) {
        // A refusal (`EINVAL` from a file system that takes the open but
        // not the writes, an alignment it wants larger) or any other
        // failure: the plain way rewrites it all, and says what fails.
        if write_staged(&direct, file, len, pieces).is_ok() {
            return Ok(());
        }
    }
    for &(offset, bytes) in pieces {
        write_at(file, bytes, offset)?;
    }
    Ok(())
}

/// [`write_pieces`] through `direct`, in parts of `STAGE` bytes assembled
/// in aligned buffers; a last part shorter than [`DIRECT_ALIGN`] goes
/// through `file`, buffered. A thread of its own writes each part while
/// the next is assembled: the copy then costs no time beside the device's.
fn write_staged(direct: &File, file: &File, len: u64, pieces: &[(u64, &[u8])]) -> io::Result<()> {
    const STAGE: usize = 8 << 20;
    const BUFFERS: u64 = 3;
    // Page-aligned, so multiples of DIRECT_ALIGN; at most STAGE each.
    let stage_len = len.min(STAGE as u64) as usize;
    let (empty_tx, empty_rx) = mpsc::channel();
    for _ in 0..len.div_ceil(STAGE as u64).clamp(1, BUFFERS) {
        // Never fails here: the receiver lives.
        let _ = empty_tx.send(MmapMut::map_anon(stage_len.max(1))?);
    }
    let (full_tx, full_rx) = mpsc::sync_channel::<(MmapMut, u64, usize)>(BUFFERS as usize);
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> io::Result<()> {
            for (buf, start, n) in full_rx {
                let aligned = n - n % DIRECT_ALIGN;
                write_at(direct, &buf[..aligned], start)?;
                write_at(file, &buf[aligned..n], start + aligned as u64)?;
                if empty_tx.send(buf).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let mut next = 0;
        let mut start = 0u64;
        while start < len {
            // A writer that failed has dropped its end: it says why below.
            let Ok(mut buf) = empty_rx.recv() else { break };
            // At most STAGE, which fits usize.
            let n = (len - start).min(STAGE as u64) as usize;
            assemble(&mut buf[..n], start, pieces, &mut next);
            if full_tx.send((buf, start, n)).is_err() {
                break;
            }
            start += n as u64;
        }
        drop(full_tx);
        writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Fill `buf`, the file's bytes from `start`, from `pieces` (from the
/// `*next`th on, which is left at the first piece not yet wholly placed)
/// and zeros between them.
fn assemble(buf: &mut [u8], start: u64, pieces: &[(u64, &[u8])], next: &mut usize) {
    let end = start + buf.len() as u64;
    // Offsets within `buf`, whose length fits usize.
    let at_of = |offset: u64| (offset - start) as usize;
    let mut at = start;
    while let Some(&(offset, bytes)) = pieces.get(*next) {
        if offset >= end {
            break;
        }
        let piece_end = offset + bytes.len() as u64;
        let from = at.max(offset);
        let to = piece_end.min(end);
        buf[at_of(at)..at_of(from)].fill(0);
        buf[at_of(from)..at_of(to)]
            .copy_from_slice(&bytes[(from - offset) as usize..(to - offset) as usize]);
        at = to;
        if piece_end > end {
            break; // the rest of it goes in the next part
        }
        *next += 1;
    }
    buf[at_of(at)..].fill(0);
}

/// A shared, writable mapping of a whole file this process has just
/// created: what it writes goes to the page cache and, on
/// [`WritableMap::flush`], to the disk, and is never anonymous memory.
pub(crate) struct WritableMap {
    map: MmapMut,
}

impl WritableMap {
    /// Map all of `file` for writing.
    ///
    /// # Safety
    /// Nothing else may truncate or write `file` while the map lives: the
    /// caller created it under a name only it uses, in a directory only
    /// this user can write ([`shared_dir_problem`]), and has allocated its
    /// blocks ([`allocate`]).
    pub(crate) unsafe fn new(file: &File) -> io::Result<WritableMap> {
        // SAFETY: the caller's contract above: the file keeps its length
        // and no other writer changes it under the mapping.
        let map = unsafe { MmapMut::map_mut(file)? };
        Ok(WritableMap { map })
    }

    /// The file's bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Start writing every dirty page to the disk, without waiting
    /// (`msync(MS_ASYNC)`, `FlushViewOfFile`); an fsync of the file then
    /// waits for them.
    pub(crate) fn start_flush(&self) -> io::Result<()> {
        self.map.flush_async()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces at unaligned offsets, one across a part's end, one across
    /// three parts, more parts than staging buffers, a file whose length
    /// is not a multiple of the direct-I/O granule.
    fn case() -> (u64, Vec<(u64, Vec<u8>)>) {
        let len = (40 << 20) + 5 * 4096 + 1234;
        let pieces = vec![
            (0, vec![1; 100]),
            (164, vec![2; 4000]),
            ((8 << 20) + 5010, vec![]),
            ((8 << 20) - 5000, vec![3; 10_000]),
            (
                (8 << 20) + 5000 + 64,
                (0..12_000).map(|i| i as u8).collect(),
            ),
            (
                (12 << 20) + 1,
                (0..(20 << 20)).map(|i| (i % 251) as u8).collect(),
            ),
            ((40 << 20) + 7, vec![4; 5 * 4096]),
        ];
        let mut pieces = pieces;
        pieces.sort_by_key(|p| p.0);
        (len, pieces)
    }

    fn expected(len: u64, pieces: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let mut want = vec![0u8; len as usize];
        for (off, bytes) in pieces {
            want[*off as usize..*off as usize + bytes.len()].copy_from_slice(bytes);
        }
        want
    }

    fn new_file(dir: &tempfile::TempDir, len: u64) -> (std::path::PathBuf, File) {
        let path = dir.path().join("entry");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        // Garbage where the zeros go: they must be written, not assumed.
        file.write_all(&vec![0xee; len as usize]).unwrap();
        (path, file)
    }

    /// `write` over a garbage-filled file gives exactly the case's bytes.
    fn check(write: impl Fn(&File, &Path, u64, &[(u64, &[u8])]) -> io::Result<()>) {
        let (len, pieces) = case();
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = new_file(&dir, len);
        let borrowed: Vec<(u64, &[u8])> = pieces.iter().map(|(o, b)| (*o, &b[..])).collect();
        write(&file, &path, len, &borrowed).unwrap();
        file.sync_all().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected(len, &pieces));
    }

    #[test]
    fn write_pieces_writes_every_byte_in_place() {
        check(write_pieces);
    }

    #[test]
    fn staging_assembles_parts_with_zeros_between_pieces() {
        // A buffered handle as the "direct" one: the assembly alone.
        check(|file, _path, len, pieces| write_staged(file, file, len, pieces));
    }
}
