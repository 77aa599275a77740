//! Files this process writes and must not lose or tear: blocks reserved
//! before a mapping writes them, a writable mapping, locks, durable
//! renames, and who may write in a directory. The transform cache
//! (`crate::cache`) is their one user.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};

use memmap2::MmapMut;

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
