//! SIGBUS while reading a mapped file: one `error:` line, exit status 1.
//!
//! A mapped file truncated (or replaced) by another process turns reads of
//! the vanished pages into SIGBUS, which by default kills the process with
//! a core dump and no word of why. [`guard`] installs, for as long as the
//! returned [`Guard`] lives, a handler that writes
//! `error: FILE changed while mapped (truncated?)` to stderr and calls
//! `_exit(1)`. The message is formatted before the handler is installed;
//! the handler only loads a pointer, calls write(2) and _exit(2), all
//! async-signal-safe.
//!
//! `load` takes the guard right before tensors are read:
//! `let _sigbus = super::sigbus::guard(&a.file);`

use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::escape;

/// The message the handler writes: set before the handler is installed,
/// never freed while it is.
static MESSAGE: AtomicPtr<Vec<u8>> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigbus(_sig: libc::c_int) {
    let msg = MESSAGE.load(Ordering::SeqCst);
    if !msg.is_null() {
        // SAFETY: a non-null MESSAGE points to a Vec leaked by `guard` that
        // is only freed after this handler has been uninstalled; reading
        // its pointer and length is a plain memory read.
        let (ptr, len) = unsafe { ((*msg).as_ptr(), (*msg).len()) };
        // SAFETY: write(2) on fd 2 with a pointer/length pair of a live
        // buffer; async-signal-safe. Its result is ignored: nothing else
        // could be done about a failure here.
        unsafe { libc::write(2, ptr.cast(), len) };
    }
    // SAFETY: _exit is async-signal-safe and does not return.
    unsafe { libc::_exit(1) };
}

/// Restores the previous SIGBUS disposition when dropped.
#[must_use = "the handler is removed when the guard is dropped"]
pub struct Guard {
    previous_action: libc::sigaction,
    previous_message: *mut Vec<u8>,
    message: *mut Vec<u8>,
}

/// Turn SIGBUS into `error: PATH changed while mapped (truncated?)` and
/// exit status 1 until the returned guard is dropped.
pub fn guard(path: &Path) -> Guard {
    let text = format!(
        "error: {} changed while mapped (truncated?)\n",
        escape(&path.display().to_string())
    );
    let message = Box::into_raw(Box::new(text.into_bytes()));
    let previous_message = MESSAGE.swap(message, Ordering::SeqCst);
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
    // `on_sigbus` has the signature of a handler without SA_SIGINFO; the
    // old action is written to `previous_action`, a live local.
    let previous_action = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGBUS, &sa, &mut old);
        old
    };
    Guard {
        previous_action,
        previous_message,
        message,
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: restores the action `guard` saved; a plain syscall on a
        // live local.
        unsafe { libc::sigaction(libc::SIGBUS, &self.previous_action, std::ptr::null_mut()) };
        MESSAGE.store(self.previous_message, Ordering::SeqCst);
        // SAFETY: `message` came from Box::into_raw in `guard`, is freed only
        // here, and is no longer reachable from MESSAGE (restored above).
        // A SIGBUS already running its handler never returns (it _exits).
        drop(unsafe { Box::from_raw(self.message) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const CHILD_ENV: &str = "WEIGHTMAP_SIGBUS_TEST_FILE";

    /// Run as a child by the test below: map a file, truncate it, read it.
    #[test]
    fn child_reads_a_truncated_mapping() {
        let Some(path) = std::env::var_os(CHILD_ENV) else {
            return; // Not the child: nothing to do.
        };
        let path = std::path::PathBuf::from(path);
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test truncates the file on purpose; the guard turns
        // the resulting SIGBUS into exit status 1.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        let _g = guard(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let sum: u64 = map.iter().map(|&b| u64::from(b)).sum();
        // Not reached: the read above faults.
        println!("read {sum}");
        std::process::exit(0);
    }

    #[test]
    fn sigbus_is_one_error_line_and_exit_1() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("victim\u{1b}]0;x\u{7}.bin");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cmd::sigbus::tests::child_reads_a_truncated_mapping",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = format!(
            "error: {} changed while mapped (truncated?)",
            escape(&path.display().to_string())
        );
        assert_eq!(stderr.lines().last(), Some(want.as_str()), "{stderr}");
        assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
        assert!(!stderr.contains('\u{1b}'), "the path is escaped");
    }

    #[test]
    fn guard_restores_the_previous_handler() {
        // SAFETY: reading the current action into a live local.
        let current = || unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old);
            old.sa_sigaction
        };
        let before = current();
        {
            let _g = guard(Path::new("x"));
            assert_eq!(
                current(),
                on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t
            );
        }
        assert_eq!(current(), before);
    }
}
