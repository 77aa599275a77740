//! The committed header `include/weightmap.h` is what cbindgen generates
//! from the sources now. `WM_UPDATE_HEADER=1` rewrites it instead.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = dir.join("include/weightmap.h");
    if std::env::var_os("WM_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/weightmap.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "capi/include/weightmap.h is not what cbindgen generates from capi/src; \
         run `WM_UPDATE_HEADER=1 cargo test -p weightmap-capi --test header` and commit it"
    );
}
