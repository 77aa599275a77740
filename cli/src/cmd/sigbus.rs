//! A mapped file that cannot be read any more: one `error:` line, exit
//! status 1, instead of a crash with no word of why.
//!
//! [`guard`] installs, for as long as the returned [`Guard`] lives, a
//! handler for the fault a read of a mapped page raises when the page
//! cannot be read. The message is formatted before the handler is
//! installed; the handler only loads a pointer, writes the message to
//! stderr and ends the process with status 1, no allocation or lock.
//!
//! - Unix: a mapped file truncated (or replaced) by another process turns
//!   reads of the vanished pages into SIGBUS, which by default kills the
//!   process with a core dump. The SIGBUS handler writes
//!   `error: FILE changed while mapped (truncated?)` with write(2) and
//!   calls `_exit(1)`, all async-signal-safe.
//! - Windows: a mapped file cannot be truncated, but a failed in-page read
//!   (an I/O error, a network drive gone) raises `EXCEPTION_IN_PAGE_ERROR`,
//!   which kills the process. A vectored exception handler
//!   (`AddVectoredExceptionHandler`) writes
//!   `error: FILE could not be read while mapped (in-page error)` with
//!   `WriteFile` on the standard error handle and calls
//!   `TerminateProcess(GetCurrentProcess(), 1)`; every other exception
//!   goes on to the next handler (`EXCEPTION_CONTINUE_SEARCH`).
//!
//! `load` takes the guard right before tensors are read:
//! `let _sigbus = super::sigbus::guard(&a.file);`

use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::escape;

#[cfg(unix)]
use unix as sys;
#[cfg(windows)]
use windows as sys;

/// The message the handler writes: set before the handler is installed,
/// never freed while it is.
static MESSAGE: AtomicPtr<Vec<u8>> = AtomicPtr::new(std::ptr::null_mut());

/// The message's bytes, if one is set. Only an atomic load and a memory
/// read: callable from a signal or exception handler.
fn message() -> Option<&'static [u8]> {
    let msg = MESSAGE.load(Ordering::SeqCst);
    if msg.is_null() {
        return None;
    }
    // SAFETY: a non-null MESSAGE points to a Vec leaked by `guard` that is
    // only freed after the handler that calls this has been uninstalled
    // (and a handler already running never returns: it ends the process).
    Some(unsafe { (*msg).as_slice() })
}

/// Restores the previous handling of the fault when dropped.
#[must_use = "the handler is removed when the guard is dropped"]
pub struct Guard {
    previous: sys::Previous,
    previous_message: *mut Vec<u8>,
    message: *mut Vec<u8>,
}

/// Turn a failed read of a mapped page into `error: PATH ...` and exit
/// status 1 until the returned guard is dropped.
pub fn guard(path: &Path) -> Guard {
    let text = format!(
        "error: {} {}\n",
        escape(&path.display().to_string()),
        sys::WHAT
    );
    let message = Box::into_raw(Box::new(text.into_bytes()));
    let previous_message = MESSAGE.swap(message, Ordering::SeqCst);
    Guard {
        previous: sys::install(),
        previous_message,
        message,
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        sys::restore(&self.previous);
        MESSAGE.store(self.previous_message, Ordering::SeqCst);
        // SAFETY: `message` came from Box::into_raw in `guard`, is freed only
        // here, and is no longer reachable from MESSAGE (restored above).
        // A fault already running the handler never returns (it exits).
        drop(unsafe { Box::from_raw(self.message) });
    }
}

#[cfg(unix)]
mod unix {
    /// What the message says happened to the file.
    pub const WHAT: &str = "changed while mapped (truncated?)";

    /// The SIGBUS action `install` replaced.
    pub type Previous = libc::sigaction;

    pub extern "C" fn on_sigbus(_sig: libc::c_int) {
        if let Some(msg) = super::message() {
            // SAFETY: write(2) on fd 2 with the pointer/length pair of a
            // live buffer; async-signal-safe. Its result is ignored: nothing
            // else could be done about a failure here.
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        }
        // SAFETY: _exit is async-signal-safe and does not return.
        unsafe { libc::_exit(1) };
    }

    /// Route SIGBUS to `on_sigbus`; returns the previous action.
    pub fn install() -> Previous {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
        // value; `on_sigbus` has the signature of a handler without
        // SA_SIGINFO; the old action is written to `old`, a live local.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &sa, &mut old);
            old
        }
    }

    /// Put back the action `install` replaced.
    pub fn restore(previous: &Previous) {
        // SAFETY: restores an action sigaction itself returned; a plain
        // syscall reading a live value.
        unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    }
}

#[cfg(windows)]
mod windows {
    use windows_sys::Win32::Foundation::EXCEPTION_IN_PAGE_ERROR;
    use windows_sys::Win32::Storage::FileSystem::WriteFile;
    use windows_sys::Win32::System::Console::{GetStdHandle, STD_ERROR_HANDLE};
    use windows_sys::Win32::System::Diagnostics::Debug::{
        AddVectoredExceptionHandler, RemoveVectoredExceptionHandler, EXCEPTION_CONTINUE_SEARCH,
        EXCEPTION_POINTERS,
    };
    use windows_sys::Win32::System::Threading::{ExitProcess, GetCurrentProcess, TerminateProcess};

    /// What the message says happened to the file.
    pub const WHAT: &str = "could not be read while mapped (in-page error)";

    /// The handle `AddVectoredExceptionHandler` returned (null if it
    /// failed: then nothing is removed).
    pub type Previous = *mut core::ffi::c_void;

    pub unsafe extern "system" fn on_exception(info: *mut EXCEPTION_POINTERS) -> i32 {
        // SAFETY: the system calls a vectored handler with valid exception
        // pointers; the null checks cover a caller that does not.
        let code = unsafe {
            match info.as_ref().and_then(|i| i.ExceptionRecord.as_ref()) {
                Some(record) => record.ExceptionCode,
                None => return EXCEPTION_CONTINUE_SEARCH,
            }
        };
        if code != EXCEPTION_IN_PAGE_ERROR {
            return EXCEPTION_CONTINUE_SEARCH;
        }
        if let Some(mut msg) = super::message() {
            // SAFETY: GetStdHandle has no preconditions; an invalid or null
            // handle makes WriteFile fail, which is ignored (nothing else
            // could be done about it here). WriteFile reads `msg`, a live
            // buffer, for at most its length, and writes the count to a
            // live local.
            unsafe {
                let err = GetStdHandle(STD_ERROR_HANDLE);
                while !msg.is_empty() {
                    let mut done = 0u32;
                    let len = msg.len().min(u32::MAX as usize) as u32;
                    let ok = WriteFile(err, msg.as_ptr(), len, &mut done, std::ptr::null_mut());
                    if ok == 0 || done == 0 {
                        break;
                    }
                    msg = &msg[done as usize..];
                }
            }
        }
        // SAFETY: ends this process with status 1 at once, as _exit does:
        // no destructor, no DLL notification, nothing that could take a
        // lock the faulting thread holds. ExitProcess only if that failed.
        unsafe {
            TerminateProcess(GetCurrentProcess(), 1);
            ExitProcess(1)
        }
    }

    /// Add `on_exception` first in the list of vectored handlers.
    pub fn install() -> Previous {
        // SAFETY: `on_exception` has the PVECTORED_EXCEPTION_HANDLER
        // signature and lives for the whole program; the returned handle
        // is removed once, by `restore`.
        unsafe { AddVectoredExceptionHandler(1, Some(on_exception)) }
    }

    /// Remove the handler `install` added.
    pub fn restore(handle: &Previous) {
        if !handle.is_null() {
            // SAFETY: `handle` is the live registration `install` returned,
            // removed only here (a guard is dropped once).
            unsafe { RemoveVectoredExceptionHandler(*handle) };
        }
    }
}

#[cfg(all(test, unix))]
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
                unix::on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t
            );
        }
        assert_eq!(current(), before);
    }
}

#[cfg(all(test, windows))]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::atomic::AtomicUsize;
    use windows_sys::Win32::Foundation::EXCEPTION_IN_PAGE_ERROR;
    use windows_sys::Win32::System::Diagnostics::Debug::{
        AddVectoredExceptionHandler, RaiseException, RemoveVectoredExceptionHandler, SetErrorMode,
        EXCEPTION_CONTINUE_EXECUTION, EXCEPTION_CONTINUE_SEARCH, EXCEPTION_POINTERS,
        SEM_FAILCRITICALERRORS, SEM_NOGPFAULTERRORBOX,
    };

    const CHILD_ENV: &str = "WEIGHTMAP_INPAGE_TEST_FILE";
    /// An application exception code (bit 29 set), not the in-page one.
    const OTHER: u32 = 0xE057_0001;

    /// Run as a child by the test below: raise the exception a failed
    /// in-page read raises, with the guard held.
    #[test]
    fn child_raises_an_in_page_error() {
        let Some(path) = std::env::var_os(CHILD_ENV) else {
            return; // Not the child: nothing to do.
        };
        // SAFETY: SetErrorMode only sets this process's error mode (no
        // crash dialog should the guard fail to end the process).
        unsafe { SetErrorMode(SEM_FAILCRITICALERRORS | SEM_NOGPFAULTERRORBOX) };
        let _g = guard(Path::new(&path));
        // SAFETY: a continuable exception without arguments; the guard's
        // handler ends the process.
        unsafe { RaiseException(EXCEPTION_IN_PAGE_ERROR as u32, 0, 0, std::ptr::null()) };
        // Not reached.
        println!("survived");
        std::process::exit(0);
    }

    #[test]
    fn in_page_error_is_one_error_line_and_exit_1() {
        let path = "victim\u{1b}]0;x\u{7}.bin";
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cmd::sigbus::tests::child_raises_an_in_page_error",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = format!(
            "error: {} could not be read while mapped (in-page error)",
            escape(path)
        );
        assert_eq!(stderr.lines().last(), Some(want.as_str()), "{stderr}");
        assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
        assert!(!stderr.contains('\u{1b}'), "the path is escaped");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
    }

    /// Exceptions of the two codes the test raises, counted by `catch`.
    static CAUGHT: AtomicUsize = AtomicUsize::new(0);

    /// The last handler: resumes after the test's own exceptions.
    unsafe extern "system" fn catch(info: *mut EXCEPTION_POINTERS) -> i32 {
        // SAFETY: the system passes valid exception pointers.
        let code = unsafe { (*(*info).ExceptionRecord).ExceptionCode } as u32;
        if code == EXCEPTION_IN_PAGE_ERROR as u32 || code == OTHER {
            CAUGHT.fetch_add(1, Ordering::SeqCst);
            return EXCEPTION_CONTINUE_EXECUTION;
        }
        EXCEPTION_CONTINUE_SEARCH
    }

    #[test]
    fn guard_passes_other_exceptions_on_and_is_removed_on_drop() {
        // SAFETY: `catch` has the handler signature and lives for the whole
        // program; it is removed below.
        let catcher = unsafe { AddVectoredExceptionHandler(0, Some(catch)) };
        assert!(!catcher.is_null());
        let raise = |code: u32| {
            // SAFETY: a continuable exception without arguments, which
            // `catch` resumes (were the guard still installed, an in-page
            // error would end this process with status 1 instead).
            unsafe { RaiseException(code, 0, 0, std::ptr::null()) }
        };
        {
            let _g = guard(Path::new("x"));
            raise(OTHER);
            assert_eq!(CAUGHT.load(Ordering::SeqCst), 1, "passed on");
        }
        raise(EXCEPTION_IN_PAGE_ERROR as u32);
        assert_eq!(CAUGHT.load(Ordering::SeqCst), 2, "the guard is gone");
        assert!(MESSAGE.load(Ordering::SeqCst).is_null());
        // SAFETY: the registration made above, removed once.
        unsafe { RemoveVectoredExceptionHandler(catcher) };
    }
}
