//! SIGINT and SIGTERM while writing a file: the handler only sets a flag
//! (an atomic store, async-signal-safe); the writer loop checks it between
//! chunks, removes its temporary file and reports the interruption.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the handler; read by the writer loop.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Route SIGINT and SIGTERM to the stop flag from now on, and return it.
/// Without SA_RESTART, a blocked write returns early, so the loop sees the
/// flag within one chunk.
pub fn stop_flag() -> &'static AtomicBool {
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
            // Advisory: if it fails, the signal keeps its default action and
            // only the temporary file's cleanup is lost.
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    &STOP
}
