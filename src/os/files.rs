//! Files this process writes and must not lose or tear, in a directory no
//! other user controls: the directory opened once and checked, files made,
//! opened, renamed and removed relative to it, blocks reserved before a
//! mapping writes them, a writable mapping, direct writes, locks. The
//! transform cache (`crate::cache`) is their one user.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::SystemTime;

use memmap2::MmapMut;

use super::io::DIRECT_ALIGN;
use super::sys;

pub(crate) use sys::{change_time_ns, file_identity, is_no_space, is_read_only, try_lock, LOCKS};

#[cfg(not(unix))]
pub(crate) use by_path::{make_file_private, open_regular};
#[cfg(not(unix))]
use by_path::{path_problem, path_trail, DirHandle};
#[cfg(unix)]
pub(crate) use sys::{make_file_private, open_regular};
#[cfg(unix)]
use sys::{path_problem, DirHandle};

/// A directory that no other user can write in, or swap for another, or
/// (where there are modes) read: opened once, checked through the handle,
/// and every file in it reached through that handle.
pub(crate) struct PrivateDir {
    handle: DirHandle,
    path: PathBuf,
}

/// Why a [`PrivateDir`] could not be had.
#[derive(Debug)]
pub(crate) enum DirRefusal {
    /// It does not exist (and was not to be created).
    Missing,
    /// Another user could change what is in it, or what its path leads to.
    Unsafe(String),
    /// The system refused `op`.
    Io(&'static str, io::Error),
}

impl PrivateDir {
    /// Open the directory at `path`, creating it (and its missing parents,
    /// private to this user) when `create`. Refused when any step of the
    /// path lets another user swap what it leads to, when the directory is
    /// another user's, or when others may write in it; a directory others
    /// may only read or search is made private (0700), and the second value
    /// says so.
    pub(crate) fn open(
        path: &Path,
        create: bool,
    ) -> std::result::Result<(PrivateDir, Option<String>), DirRefusal> {
        let walked = match path_problem(path) {
            Ok(Ok(walked)) => walked,
            Ok(Err(why)) => return Err(DirRefusal::Unsafe(why)),
            Err(e) => return Err(DirRefusal::Io("resolve", e)),
        };
        if !walked.missing.is_empty() && !create {
            return Err(DirRefusal::Missing);
        }
        let mut handle = match DirHandle::open(&walked.real) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(DirRefusal::Missing),
            Err(e) => return Err(DirRefusal::Io("open", e)),
        };
        // Each missing step is made in the one before, through its handle,
        // and checked as it is made: never a path created in one go.
        let mut at = walked.real;
        for name in &walked.missing {
            handle = match handle.make_child(&at, name) {
                Ok(Ok(child)) => child,
                Ok(Err(why)) => return Err(DirRefusal::Unsafe(why)),
                Err(e) => return Err(DirRefusal::Io("create", e)),
            };
            at.push(name);
        }
        match handle.make_private() {
            Ok((Some(problem), _)) => Err(DirRefusal::Unsafe(problem)),
            Ok((None, note)) => Ok((
                PrivateDir {
                    handle,
                    path: path.to_owned(),
                },
                note,
            )),
            Err(e) => Err(DirRefusal::Io("stat", e)),
        }
    }

    /// The path it was opened at (for messages and reports).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Open regular file `name` of this user's in it, for reading (and
    /// writing with `write`): never a link, a FIFO or a device, and the
    /// open never waits. `NotFound` when there is none.
    pub(crate) fn open_file(&self, name: &OsStr, write: bool) -> io::Result<File> {
        self.handle.open_file(name, write)
    }

    /// Create file `name` in it, this user's alone, failing if any file or
    /// link has that name.
    pub(crate) fn create_new(&self, name: &OsStr) -> io::Result<File> {
        self.handle.create_new(name)
    }

    /// Rename `from` to `to` in it, replacing `to`.
    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        self.handle.rename(from, to)
    }

    /// Remove file `name` from it.
    pub(crate) fn remove(&self, name: &OsStr) -> io::Result<()> {
        self.handle.remove(name)
    }

    /// Give file `from` in it the second name `to`; fails if `to` exists.
    pub(crate) fn link(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        self.handle.link(from, to)
    }

    /// Whether `name` in it is the open `file` (`NotFound` when there is
    /// no `name`).
    pub(crate) fn holds(&self, name: &OsStr, file: &File) -> io::Result<bool> {
        self.handle.holds(name, file)
    }

    /// Its regular files: name, length, modification time.
    pub(crate) fn files(&self) -> io::Result<Vec<(OsString, u64, SystemTime)>> {
        self.handle.files()
    }

    /// Make its renames durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.handle.sync()
    }
}

/// One step of a [`PathTrail`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TrailStep {
    /// Device and inode (Windows: volume and file index).
    pub id: (u64, u64),
    /// The change time (ns): set by a rename or link of this step, and by
    /// any change of its entries if it is a directory.
    pub changed: u64,
    /// The modification time (ns): a directory's is set with its change
    /// time by a change of its entries, and is left by its own rename.
    pub modified: u64,
    pub dir: bool,
}

#[cfg(unix)]
impl TrailStep {
    fn of(m: &std::fs::Metadata) -> TrailStep {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| u64::try_from(i128::from(s) * 1_000_000_000 + i128::from(n));
        TrailStep {
            id: (m.dev(), m.ino()),
            changed: ns(m.ctime(), m.ctime_nsec()).unwrap_or(0),
            modified: ns(m.mtime(), m.mtime_nsec()).unwrap_or(0),
            dir: m.is_dir(),
        }
    }
}

/// The steps of `path`'s trail, and whether another user could change it.
#[cfg(unix)]
fn path_trail(path: &Path) -> io::Result<(Vec<TrailStep>, bool)> {
    let (steps, open_to_others) = sys::path_trail(path)?;
    Ok((steps.iter().map(TrailStep::of).collect(), open_to_others))
}

/// What a path led through to its file, step by step (`/`, every directory
/// and link on the way, the file), and whether another user could change
/// where it leads. Taken at two times, two trails say whether the path may
/// have led elsewhere in between ([`PathTrail::same_way`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathTrail {
    steps: Vec<TrailStep>,
    open_to_others: bool,
}

impl PathTrail {
    /// `path`'s trail now.
    pub(crate) fn of(path: &Path) -> io::Result<PathTrail> {
        let (steps, open_to_others) = path_trail(path)?;
        Ok(PathTrail {
            steps,
            open_to_others,
        })
    }

    /// The device and inode of the file it ends at.
    pub(crate) fn file(&self) -> Option<(u64, u64)> {
        self.steps.last().map(|s| s.id)
    }

    /// Whether `now`, taken after `self`, shows that the path led to the
    /// same file all along: every step the same inode, and none renamed,
    /// linked or unlinked meanwhile, which sets its change time (a link
    /// flipped by `ln -sfn` is a new inode; a directory swapped out and
    /// back, or a file exchanged and back, keeps its inode and shows a new
    /// change time). A directory whose change came with a modification
    /// had its entries changed, not itself moved; that is allowed where
    /// only this user and root could change the path, so that files coming
    /// and going beside the model do not refuse every fill, but not where
    /// another user could, who might move a directory back and then touch
    /// an entry of it to hide the move. Save a change and its undoing within
    /// one tick of the file system's clock, which Linux 6.13's multigrain
    /// timestamps close for changes after a `stat`.
    pub(crate) fn same_way(&self, now: &PathTrail) -> bool {
        let strict = self.open_to_others || now.open_to_others;
        self.steps.len() == now.steps.len()
            && self.steps.iter().zip(&now.steps).all(|(a, b)| {
                let entries_only = a.dir && b.modified != a.modified && b.modified == b.changed;
                a.id == b.id && (a.changed == b.changed || (!strict && entries_only))
            })
    }
}

/// Where there is no `openat` (Windows, and systems without mapping), a
/// directory is reached by its path each time: what is written there
/// relies on the directory's ACL, which a user's own profile directory
/// keeps to the user. Windows has no mode bits, and a directory's owner is
/// often a group (Administrators), not the user: a directory under the
/// user's profile (`%LOCALAPPDATA%`) inherits its ACL, which is relied on,
/// as for any file the user creates. No step of a path is refused, and no
/// file's mode changed.
#[cfg(not(unix))]
mod by_path {
    use std::ffi::{OsStr, OsString};
    use std::fs::{self, File, OpenOptions};
    use std::io;
    use std::path::{Path, PathBuf};
    use std::time::SystemTime;

    use super::TrailStep;

    /// How far a path exists, and what is missing below: as on Unix,
    /// without the checks (no step of it is refused here).
    pub(crate) struct Walked {
        pub real: PathBuf,
        pub missing: Vec<OsString>,
    }

    /// The path, made absolute (`..` resolved by the system), split where
    /// it stops existing: no step of it is refused here.
    pub(crate) fn path_problem(path: &Path) -> io::Result<Result<Walked, String>> {
        let mut real = std::path::absolute(path)?;
        let mut missing = Vec::new();
        while fs::symlink_metadata(&real).is_err() {
            let Some(name) = real.file_name().map(OsStr::to_owned) else {
                break;
            };
            missing.push(name);
            real.pop();
        }
        missing.reverse();
        Ok(Ok(Walked { real, missing }))
    }

    /// Only the file a path leads to, by its identity: a path that leads
    /// elsewhere at the commit is seen, one that led elsewhere and back is
    /// not (`std` shows no change time of a directory here).
    pub(crate) fn path_trail(path: &Path) -> io::Result<(Vec<TrailStep>, bool)> {
        let id = super::sys::file_identity(&File::open(path)?)?;
        let step = TrailStep {
            id,
            changed: 0,
            modified: 0,
            dir: false,
        };
        Ok((vec![step], false))
    }

    /// Files inherit the directory's ACL: nothing to change.
    pub(crate) fn make_file_private(_file: &File) -> io::Result<()> {
        Ok(())
    }

    /// Open `path` for reading if it is a regular file (a named pipe or a
    /// device is refused with `InvalidInput`).
    pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
        if !fs::metadata(path)?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        File::open(path)
    }

    pub(crate) struct DirHandle {
        path: PathBuf,
    }

    impl DirHandle {
        pub(crate) fn open(real: &Path) -> io::Result<DirHandle> {
            if !fs::metadata(real)?.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a directory",
                ));
            }
            Ok(DirHandle {
                path: real.to_owned(),
            })
        }

        pub(crate) fn make_child(
            &self,
            _at: &Path,
            name: &OsStr,
        ) -> io::Result<Result<DirHandle, String>> {
            let path = self.at(name)?;
            match fs::create_dir(&path) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            DirHandle::open(&path).map(Ok)
        }

        pub(crate) fn make_private(&self) -> io::Result<(Option<String>, Option<String>)> {
            Ok((None, None))
        }

        fn at(&self, name: &OsStr) -> io::Result<PathBuf> {
            let p = Path::new(name);
            if p.components().count() != 1 || p.file_name() != Some(name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a file name in the directory",
                ));
            }
            Ok(self.path.join(name))
        }

        pub(crate) fn open_file(&self, name: &OsStr, write: bool) -> io::Result<File> {
            let path = self.at(name)?;
            if !fs::symlink_metadata(&path)?.is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file",
                ));
            }
            OpenOptions::new().read(true).write(write).open(path)
        }

        pub(crate) fn create_new(&self, name: &OsStr) -> io::Result<File> {
            let path = self.at(name)?;
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
        }

        pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
            fs::rename(self.at(from)?, self.at(to)?)
        }

        pub(crate) fn remove(&self, name: &OsStr) -> io::Result<()> {
            fs::remove_file(self.at(name)?)
        }

        pub(crate) fn link(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
            fs::hard_link(self.at(from)?, self.at(to)?)
        }

        /// Without locks a fill's file is told from an orphan by its age,
        /// never removed young: taken as held.
        pub(crate) fn holds(&self, name: &OsStr, _file: &File) -> io::Result<bool> {
            fs::symlink_metadata(self.at(name)?).map(|_| true)
        }

        pub(crate) fn files(&self) -> io::Result<Vec<(OsString, u64, SystemTime)>> {
            let mut out = Vec::new();
            for item in fs::read_dir(&self.path)? {
                let item = item?;
                let Ok(m) = fs::symlink_metadata(item.path()) else {
                    continue;
                };
                if m.is_file() {
                    let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    out.push((item.file_name(), m.len(), mtime));
                }
            }
            Ok(out)
        }

        /// NTFS journals its metadata: a completed rename needs no
        /// directory flush (and a directory cannot be opened as a `File`
        /// without backup semantics).
        pub(crate) fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }
}

/// A path's exact bytes, to be stored and given back by
/// [`path_from_bytes`]: Unix's bytes as they are (not necessarily UTF-8);
/// Windows' UTF-16 units, little-endian (not necessarily valid UTF-16).
pub(crate) fn path_to_bytes(path: &Path) -> Vec<u8> {
    #[cfg(unix)]
    {
        std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec()
    }
    #[cfg(windows)]
    {
        std::os::windows::ffi::OsStrExt::encode_wide(path.as_os_str())
            .flat_map(u16::to_le_bytes)
            .collect()
    }
    #[cfg(not(any(unix, windows)))]
    {
        path.to_string_lossy().into_owned().into_bytes()
    }
}

/// The path [`path_to_bytes`] gave `bytes` for; `None` for bytes it cannot
/// have given (an odd length on Windows).
pub(crate) fn path_from_bytes(bytes: &[u8]) -> Option<PathBuf> {
    #[cfg(unix)]
    {
        Some(PathBuf::from(
            <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes),
        ))
    }
    #[cfg(windows)]
    {
        if bytes.len() % 2 != 0 {
            return None;
        }
        let units: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        Some(PathBuf::from(
            <OsString as std::os::windows::ffi::OsStringExt>::from_wide(&units),
        ))
    }
    #[cfg(not(any(unix, windows)))]
    {
        String::from_utf8(bytes.to_vec()).ok().map(PathBuf::from)
    }
}

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
/// `file`, which this process created and allocated to `len` bytes; the
/// bytes between pieces are zeros.
///
/// Where the system can (`O_DIRECT` set on `file` itself on Linux and
/// Android, a `ReOpenFile` of it without buffering on Windows: never its
/// path opened again), the bytes go to the device through a small aligned
/// staging buffer, without taking page-cache pages: written through the
/// cache, a file of N bytes whose contents are already in memory costs N
/// more bytes of (dirty, until written back) memory, charged to the
/// process's cgroup like the rest, and on a VM whose free memory the host
/// has taken back, as many fresh pages, which cost several times the copy
/// (ARCHITECTURE.md, "The transform cache"). Where it cannot, or direct
/// writes fail, positioned buffered writes.
pub(crate) fn write_pieces(file: &File, len: u64, pieces: &[(u64, &[u8])]) -> io::Result<()> {
    debug_assert!(pieces
        .windows(2)
        .all(|w| w[0].0 + w[0].1.len() as u64 <= w[1].0));
    if let Ok(direct) = sys::DirectWrites::start(file) {
        let staged = write_staged(direct.file(), len, pieces);
        drop(direct);
        // A refusal (`EINVAL` from a file system that takes the flag but
        // not the writes, an alignment it wants larger) or any other
        // failure: the plain way rewrites it all, and says what fails.
        if let Ok(tail) = staged {
            if let Some((at, bytes)) = tail {
                write_at(file, &bytes, at)?;
            }
            return Ok(());
        }
    }
    for &(offset, bytes) in pieces {
        write_at(file, bytes, offset)?;
    }
    Ok(())
}

/// [`write_pieces`] through `direct`, in parts of `STAGE` bytes assembled
/// in aligned buffers. A thread of its own writes each part while the next
/// is assembled: the copy then costs no time beside the device's. The last
/// part's bytes past a multiple of [`DIRECT_ALIGN`], which no direct write
/// takes, are returned with their offset, for a buffered write.
fn write_staged(
    direct: &File,
    len: u64,
    pieces: &[(u64, &[u8])],
) -> io::Result<Option<(u64, Vec<u8>)>> {
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
        let writer = scope.spawn(move || -> io::Result<Option<(u64, Vec<u8>)>> {
            let mut tail = None;
            for (buf, start, n) in full_rx {
                let aligned = n - n % DIRECT_ALIGN;
                write_at(direct, &buf[..aligned], start)?;
                if aligned < n {
                    tail = Some((start + aligned as u64, buf[aligned..n].to_vec()));
                }
                if empty_tx.send(buf).is_err() {
                    break;
                }
            }
            Ok(tail)
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
    /// this user can write ([`PrivateDir`]), and has allocated its
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
        check(|file, _path, len, pieces| write_pieces(file, len, pieces));
    }

    #[test]
    fn staging_assembles_parts_with_zeros_between_pieces() {
        // A buffered handle as the "direct" one: the assembly alone.
        check(|file, _path, len, pieces| {
            if let Some((at, tail)) = write_staged(file, len, pieces)? {
                write_at(file, &tail, at)?;
            }
            Ok(())
        });
    }
}
