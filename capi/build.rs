//! Link options the C library needs on some targets.
//!
//! Android 15 and later run on kernels with 16 KiB pages, and Google Play
//! requires apps targeting them to ship native libraries whose LOAD
//! segments are aligned for 16 KiB (developer.android.com/guide/practices/
//! page-sizes). NDK linkers before r28 align for 4 KiB, so the shared
//! library asks for 16 KiB itself. GNU ld for aarch64 Linux aligns for
//! 64 KiB already, which 16 and 64 KiB kernels both load; it is asked for
//! 64 KiB explicitly so that another default cannot undo it (`readelf -lW`
//! shows the alignment; `.ci/cross.sh` checks it).

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let max_page = match (os.as_str(), arch.as_str()) {
        ("android", _) => Some(16 << 10),
        ("linux", "aarch64") => Some(64 << 10),
        _ => None,
    };
    if let Some(bytes) = max_page {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,max-page-size={bytes}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
