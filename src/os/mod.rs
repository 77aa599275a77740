//! Every system call weightmap makes, behind safe functions: the file
//! mapping and its advice, residency and eviction; positioned, direct and
//! prefaulting I/O; what the system says of memory. The rest of the crate
//! calls no `libc` or `windows-sys` function and names no platform.
//!
//! As memmap2 does it, one private module per OS family, `sys`, is chosen
//! here and nowhere else:
//!
//! | module | targets | maps | prefetch | budget |
//! |---|---|---|---|---|
//! | `sys/unix.rs` | Linux, Android, macOS, iOS, the BSDs | `mmap(PROT_READ, MAP_PRIVATE)` | `MADV_WILLNEED` (Apple: `F_RDADVISE` too) | cgroups + `MemAvailable`; host VM statistics (macOS); `os_proc_available_memory` (iOS) |
//! | `sys/windows.rs` | Windows | `CreateFileMappingW(PAGE_READONLY)` + `MapViewOfFile(FILE_MAP_READ)` | `PrefetchVirtualMemory`, then a reader touching each page | job object limits + available physical memory |
//! | `sys/stub.rs` | everything else (WASI, ...) | no: every load streams, `FallbackReason::Unsupported` | none | none ("unreadable") |
//!
//! Each `sys` module defines the same items, which the platform-independent
//! modules here build on:
//!
//! - memory: `page_size`, `map_granularity` (where a file map may start),
//!   `memlock_limit`, `populate_write`, `advise_huge_pages`;
//! - the mapping: `MAPS`, `FileMap` (`map`, `ptr`, `len`, `advise`,
//!   `huge_pages`, `will_need`, `populate_read`, `release`, `residency`,
//!   `lock`), `CacheProbe` (residency of a file without reading it),
//!   `PageMap` (which pages this process has mapped);
//! - the page cache: `evict`, `drop_cached`, `advise_no_readahead`;
//! - I/O: `read_at`, `read_some_at`, `reopen_for_reader`, `open_direct`,
//!   `open_direct_writer`, `DIRECT_IO`, `refuses_direct_io`,
//!   `same_file_identity`;
//! - `read_budget`;
//! - files the transform cache writes: `file_identity`, `shared_dir_problem`,
//!   `reserve`, `sync_dir`, `try_lock`.
//!
//! What a platform cannot do is a function that returns `Unsupported` or
//! does nothing; the loader reports it (a fallback reason, a skipped
//! prefetch, "residency unknown") and nothing fails for it.

#[cfg_attr(unix, path = "sys/unix.rs")]
#[cfg_attr(windows, path = "sys/windows.rs")]
#[cfg_attr(not(any(unix, windows)), path = "sys/stub.rs")]
mod sys;

mod advice;
mod budget;
mod cgroup;
mod files;
mod io;
mod mapping;
mod mem;
mod pages;
mod smaps;

pub(crate) use budget::*;
pub(crate) use files::*;
pub(crate) use io::*;
pub(crate) use mapping::*;
pub(crate) use mem::*;
pub(crate) use smaps::page_sizes;
/// The error a refused map gives here (Unix `ENODEV`, a filesystem that
/// cannot map; Windows 1455, the paging file too small), for tests that
/// inject one.
#[cfg(test)]
pub(crate) use sys::REFUSED_MAP_ERROR;
pub(crate) use sys::{read_budget, same_file};

// The page-cache helpers a caller may use directly.
pub use mapping::{evict, file_residency, AccessAdvice, Residency};
pub use mem::{page_size, transparent_huge_pages, TransparentHugePages};
