//! Output files that never clobber: written under a unique temporary name
//! created exclusively next to the destination, renamed over it only when
//! complete, and removed if anything fails first.
//!
//! The steps, in order:
//! 1. The destination must be absent or a regular file (or a symlink to
//!    one): a device node, FIFO, socket or directory is refused, so that
//!    `gen /dev/null` or a mistyped directory is an error, not a replacement.
//! 2. The temporary file `.NAME.PID-N.tmp` is created in the destination's
//!    directory exclusively: it never opens an existing file, and never
//!    follows a symlink someone planted there. Unix: `O_CREAT | O_EXCL |
//!    O_NOFOLLOW | O_CLOEXEC`, mode 0644 (less the umask). Windows:
//!    `CREATE_NEW` (`create_new(true)`), which fails on any existing name,
//!    a symlink or junction included, so it never follows one either; the
//!    handle is not inherited (std's default) and the file takes its
//!    directory's inherited ACL.
//! 3. The caller writes; [`OutFile::commit`] syncs, renames over the
//!    destination (atomic within a directory; on Windows `MoveFileExW`
//!    with `MOVEFILE_REPLACE_EXISTING`) and, on Unix, syncs the directory.
//!    Windows cannot open a directory as a file to flush it; NTFS journals
//!    the rename itself, so that step is skipped there.
//! 4. Dropping an uncommitted [`OutFile`] removes the temporary file.
//!
//! ```
//! use std::io::Write;
//! # fn main() -> weightmap::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let out = weightmap::outfile::OutFile::create(&dir.path().join("a.txt"))?;
//! out.file().write_all(b"whole or nothing").unwrap();
//! out.commit()?;
//! assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"whole or nothing");
//! # Ok(()) }
//! ```

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use weightmap::{Error, Result};

#[cfg(unix)]
use unix as sys;
#[cfg(windows)]
use windows as sys;

/// A temporary file that becomes `dest` on [`OutFile::commit`].
#[derive(Debug)]
pub struct OutFile {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

/// Distinguishes temporary names within one process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

impl OutFile {
    /// Check `dest` and create a fresh temporary file next to it.
    ///
    /// # Errors
    /// [`Error::NotRegularDestination`] if `dest` exists and is not a regular
    /// file (following a symlink); [`Error::Io`] if the temporary file
    /// cannot be created.
    pub fn create(dest: &Path) -> Result<OutFile> {
        check_destination(dest)?;
        let name = dest
            .file_name()
            .ok_or_else(|| Error::NotRegularDestination {
                path: dest.into(),
                kind: "a directory",
            })?;
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let pid = std::process::id();
        // O_EXCL makes a collision an error, never a shared file; a few
        // retries step past names left by other processes.
        let mut last_err = None;
        for _ in 0..64 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let mut tmp_name = OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".{pid}-{n}-{nanos:08x}.tmp"));
            let tmp = dir.join(tmp_name);
            match sys::create_new(&tmp) {
                Ok(file) => {
                    return Ok(OutFile {
                        dest: dest.into(),
                        tmp,
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some((tmp, e)),
                Err(e) => return Err(Error::io("create", tmp, e)),
            }
        }
        let (tmp, e) = last_err.expect("the loop ran");
        Err(Error::io("create", tmp, e))
    }

    /// The open temporary file.
    pub fn file(&self) -> &File {
        self.file
            .as_ref()
            .expect("an OutFile holds its file until commit")
    }

    /// The temporary file's path.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Fail with [`Error::NoSpace`] unless the file system holding the
    /// temporary file has `needed` bytes free for this user.
    pub fn ensure_space(&self, needed: u64) -> Result<()> {
        // Advisory: a file system that cannot say goes on to the writes,
        // which report running out of space themselves.
        let Some(available) = sys::available_space(self.file(), &self.tmp) else {
            return Ok(());
        };
        if needed > available {
            return Err(Error::NoSpace {
                path: self.dest.clone(),
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Sync the file, rename it over the destination, sync the directory.
    ///
    /// # Errors
    /// [`Error::Io`] from the sync or the rename; the temporary file is
    /// removed then.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("commit is called once");
        file.sync_all()
            .map_err(|e| Error::io("sync", &self.tmp, e))?;
        drop(file);
        // The destination may have been replaced by something else since
        // `create` looked: look again just before the rename.
        check_destination(&self.dest)?;
        fs::rename(&self.tmp, &self.dest).map_err(|e| Error::io("rename", &self.dest, e))?;
        // Renamed: nothing to remove any more.
        self.tmp = PathBuf::new();
        if let Some(dir) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            sys::sync_dir(dir);
        }
        Ok(())
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        // Closed first: Windows removes an open file only when its last
        // handle closes.
        drop(self.file.take());
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// `Ok` if `dest` is absent, a regular file, or a symlink to a regular file
/// or to nothing (the rename replaces the link, not its target).
fn check_destination(dest: &Path) -> Result<()> {
    let refuse = |kind| {
        Err(Error::NotRegularDestination {
            path: dest.into(),
            kind,
        })
    };
    let stat_failed = |e: io::Error| match sys::device_kind(dest) {
        Some(kind) => refuse(kind),
        None => Err(Error::io("stat", dest, e)),
    };
    let meta = match fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return stat_failed(e),
    };
    let meta = if meta.file_type().is_symlink() {
        match fs::metadata(dest) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return stat_failed(e),
        }
    } else {
        meta
    };
    let t = meta.file_type();
    if t.is_file() {
        return match sys::device_kind(dest) {
            Some(kind) => refuse(kind),
            None => Ok(()),
        };
    }
    refuse(if t.is_dir() {
        "a directory"
    } else {
        sys::special_kind(&t)
    })
}

#[cfg(unix)]
mod unix {
    use std::fs::{File, FileType, OpenOptions};
    use std::io;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    use std::path::Path;

    /// Create `path`, which must not exist (not even as a dangling
    /// symlink), for writing.
    pub fn create_new(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o644)
            .open(path)
    }

    /// Bytes free for this user on the file system holding `file`
    /// (`fstatvfs`: `f_bavail × f_frsize`); `None` if it cannot say.
    pub fn available_space(file: &File, _path: &Path) -> Option<u64> {
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: the descriptor is open for as long as `file` lives, and
        // `st` points to writable memory of the type fstatvfs fills.
        let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: fstatvfs returned 0, so it initialised `st`.
        let st = unsafe { st.assume_init() };
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }

    /// fsync the directory, making a rename in it durable. Advisory: not
    /// every file system allows it.
    pub fn sync_dir(dir: &Path) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }

    /// What a file that is neither regular nor a directory is.
    pub fn special_kind(t: &FileType) -> &'static str {
        if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        }
    }

    /// Devices are told by their metadata here: nothing more to ask.
    pub fn device_kind(_path: &Path) -> Option<&'static str> {
        None
    }
}

#[cfg(windows)]
mod windows {
    use std::fs::{File, FileType, OpenOptions};
    use std::os::windows::ffi::OsStrExt;
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use std::path::Path;

    use windows_sys::Win32::Storage::FileSystem::{
        GetDiskFreeSpaceExW, GetFileType, FILE_FLAG_BACKUP_SEMANTICS, FILE_TYPE_CHAR,
        FILE_TYPE_PIPE,
    };

    /// Create `path`, which must not exist, for writing: `CREATE_NEW`
    /// fails on any existing name, a symlink or junction included, so no
    /// planted link is followed.
    pub fn create_new(path: &Path) -> std::io::Result<File> {
        OpenOptions::new().write(true).create_new(true).open(path)
    }

    /// Bytes free for this user (quotas included) on the volume holding
    /// `path`: `GetDiskFreeSpaceExW`'s `lpFreeBytesAvailableToCaller` for
    /// its directory; `None` if it cannot say.
    pub fn available_space(_file: &File, path: &Path) -> Option<u64> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut dir = std::path::absolute(dir).ok()?.into_os_string();
        // A UNC share needs its trailing backslash; any directory takes one.
        if !dir.as_encoded_bytes().ends_with(b"\\") {
            dir.push("\\");
        }
        let wide: Vec<u16> = dir.encode_wide().chain(Some(0)).collect();
        let mut free = 0u64;
        // SAFETY: `wide` is NUL-terminated and outlives the call; `free` is
        // a live local; the two other outputs are optional (null).
        let ok = unsafe {
            GetDiskFreeSpaceExW(
                wide.as_ptr(),
                &mut free,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        (ok != 0).then_some(free)
    }

    /// Nothing: Windows cannot open a directory as a file to flush it
    /// (`FlushFileBuffers` needs a handle opened for writing), and NTFS
    /// journals the rename's metadata itself.
    pub fn sync_dir(_dir: &Path) {}

    /// What a file that is neither regular nor a directory is (std tells
    /// only files, directories and links apart here).
    pub fn special_kind(_t: &FileType) -> &'static str {
        "not a regular file"
    }

    /// A device (`NUL`, `CON`, `COM1`) or a named pipe, which std's
    /// metadata cannot describe (or describes as a file): asked of the
    /// handle, opened without access as std's metadata opens it.
    pub fn device_kind(path: &Path) -> Option<&'static str> {
        let f = OpenOptions::new()
            .access_mode(0)
            .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
            .open(path)
            .ok()?;
        // SAFETY: the handle is open for as long as `f` lives; GetFileType
        // only reads it.
        match unsafe { GetFileType(f.as_raw_handle()) } {
            FILE_TYPE_CHAR => Some("a character device"),
            FILE_TYPE_PIPE => Some("a named pipe"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn commit_renames_and_drop_removes() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        let f = OutFile::create(&dest).unwrap();
        let tmp = f.tmp_path().to_owned();
        f.file().write_all(b"abc").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"abc");
        assert!(!tmp.exists());

        let f = OutFile::create(&dest).unwrap();
        let tmp = f.tmp_path().to_owned();
        assert!(tmp.exists());
        drop(f);
        assert!(!tmp.exists());
        assert_eq!(
            fs::read(&dest).unwrap(),
            b"abc",
            "an abandoned write leaves the old file"
        );
    }

    #[test]
    fn refuses_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let e = OutFile::create(dir.path()).unwrap_err();
        assert_eq!(e.name(), "not_regular_destination", "{e}");
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let e = OutFile::create(&sub).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        assert!(sub.is_dir());
    }

    #[test]
    fn ensure_space_refuses_more_than_the_disk_holds() {
        let dir = tempfile::tempdir().unwrap();
        let f = OutFile::create(&dir.path().join("big")).unwrap();
        f.ensure_space(1).unwrap();
        let e = f.ensure_space(u64::MAX).unwrap_err();
        assert_eq!(e.name(), "no_space", "{e}");
    }

    #[cfg(windows)]
    #[test]
    fn refuses_the_null_device() {
        let e = OutFile::create(Path::new("NUL")).unwrap_err();
        assert_eq!(e.name(), "not_regular_destination", "{e}");
        assert!(e.to_string().contains("character device"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn refuses_non_regular_destinations() {
        let dir = tempfile::tempdir().unwrap();
        let e = OutFile::create(dir.path()).unwrap_err();
        assert_eq!(e.name(), "not_regular_destination", "{e}");
        let e = OutFile::create(Path::new("/dev/null")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(OutFile::create(&link).is_err());
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(OutFile::create(&dangling).is_ok());
    }
}
