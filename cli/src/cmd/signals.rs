//! Interruption while writing a file: the handler only sets a flag (an
//! atomic store); the writer loop checks it between chunks, removes its
//! temporary file and reports the interruption.
//!
//! - Unix: SIGINT and SIGTERM (`sigaction`, without `SA_RESTART`, so a
//!   blocked write returns early and the loop sees the flag within one
//!   chunk).
//! - Windows: the console's Ctrl+C, Ctrl+Break and close events
//!   (`SetConsoleCtrlHandler`). The handler runs on a thread the system
//!   starts for it. For the close event the system ends the process as soon
//!   as the handler returns, so the handler waits a little first (within
//!   the 5 s the system grants) for the writer to clean up and exit.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the handler; read by the writer loop.
static STOP: AtomicBool = AtomicBool::new(false);

/// Route interruptions to the stop flag from now on, and return it.
/// Advisory: if the handler cannot be installed, an interruption keeps its
/// default action and only the temporary file's cleanup is lost.
pub fn stop_flag() -> &'static AtomicBool {
    install();
    &STOP
}

#[cfg(unix)]
extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

#[cfg(unix)]
fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `sa` is zeroed (a valid "no flags, empty mask" sigaction)
        // before the fields are set; `on_signal` has the signature sigaction
        // expects for a handler without SA_SIGINFO and only does an atomic
        // store, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

#[cfg(windows)]
unsafe extern "system" fn on_console_event(event: u32) -> windows_sys::core::BOOL {
    use windows_sys::Win32::Foundation::{FALSE, TRUE};
    use windows_sys::Win32::System::Console::{CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_C_EVENT};
    match event {
        CTRL_C_EVENT | CTRL_BREAK_EVENT => {
            STOP.store(true, Ordering::SeqCst);
            TRUE
        }
        CTRL_CLOSE_EVENT => {
            STOP.store(true, Ordering::SeqCst);
            // Returning ends the process at once: give the writer (which
            // sees the flag within one chunk) time to remove its temporary
            // file and exit, which ends this thread too.
            std::thread::sleep(std::time::Duration::from_secs(3));
            TRUE
        }
        // Logoff and shutdown go to the next handler (the default: exit).
        _ => FALSE,
    }
}

#[cfg(windows)]
fn install() {
    use std::sync::Once;
    use windows_sys::Win32::Foundation::TRUE;
    use windows_sys::Win32::System::Console::SetConsoleCtrlHandler;
    // Handlers are kept in a list: add this one once, however often a
    // writer asks for the flag.
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `on_console_event` has the HandlerRoutine signature, lives
        // for the whole program, and only stores to an atomic and sleeps.
        unsafe { SetConsoleCtrlHandler(Some(on_console_event), TRUE) };
    });
}
