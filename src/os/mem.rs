//! What the system says of memory (the page size, the memory-lock limit), and a cache prefetch hint.

/// The system page size.
pub fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions; it only reads a constant.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// The soft `RLIMIT_MEMLOCK`, as text, for error messages.
pub fn memlock_limit() -> String {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `r` is a valid, writable rlimit for getrlimit to fill.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
        if rc == 0 {
            return if r.rlim_cur == libc::RLIM_INFINITY {
                "unlimited".into()
            } else {
                format!("{} bytes", r.rlim_cur)
            };
        }
    }
    "unknown".into()
}

/// Ask the CPU to start loading the cache line of `value`: a hint, which
/// reads nothing and cannot fault. A no-op where weightmap has no hint for
/// the architecture.
pub(crate) fn prefetch_cache_line<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; it only
    // hints at an address (here a valid reference) and reads nothing.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
