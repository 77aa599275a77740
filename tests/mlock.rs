//! `mlock` failure names RLIMIT_MEMLOCK. Its own test binary, because it
//! lowers a process-wide limit.

#![cfg(target_os = "linux")]

use weightmap::{gguf::Writer, Error, LoadOptions, TensorType, Weights};

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_IPC_LOCK: u32 = 14;

/// Drop CAP_IPC_LOCK from this thread's effective set (capabilities are
/// per-thread on Linux), so RLIMIT_MEMLOCK applies even to root.
fn drop_ipc_lock_for_this_thread() {
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills `data` (two structs for version 3) for this thread.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget");
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads `hdr` and `data`; lowering the effective set is always allowed.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset");
}

#[test]
fn mlock_over_the_limit_is_an_error_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let mut w = Writer::new(32);
    w.tensor("w", TensorType::F32, &[256 * 1024], vec![0; 1 << 20]);
    w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {})
        .unwrap();

    let limit = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to rlimit structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old), 0);
    }
    let limit = libc::rlimit {
        rlim_max: old.rlim_max,
        rlim_cur: limit.rlim_cur.min(old.rlim_max),
    };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0);

    let result = std::thread::spawn(move || {
        drop_ipc_lock_for_this_thread();
        let opts = LoadOptions::default().mlock(true);
        // SAFETY: the file is not modified while loaded.
        unsafe { Weights::load(&path, &opts) }.map(|w| w.len())
    })
    .join()
    .unwrap();
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &old) };

    match result {
        Err(e @ Error::Mlock { .. }) => {
            let text = e.to_string();
            assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
            assert!(
                text.contains(&format!("{} bytes", limit.rlim_cur)),
                "{text}"
            );
        }
        other => panic!("expected an mlock error, got {other:?}"),
    }

    // And with the limit out of the way, the same load locks and succeeds.
    let opts = LoadOptions::default().mlock(true);
    let path = dir.path().join("model.gguf");
    // SAFETY: as above.
    let w = unsafe { Weights::load(&path, &opts) }.unwrap();
    assert_eq!(w.len(), 1);
}
