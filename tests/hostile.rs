//! Hostile files through the loader: every malformed file must give
//! a typed error — never a panic — and the SAME error (same `kind()`, same
//! Display) from the mapped load (`Weights::load`, mmap with fallback) and the
//! stream load (`Weights::load_streamed`). For files with bad content the
//! mapped path with fallback off must itself reject the file (so the error is
//! not only the stream path's), naming the same error kind.
//!
//! tests/gguf_rules.rs checks each rule at the parser; here every class runs
//! end to end through files on disk, in both modes, plus what only the loader
//! sees: empty files, non-files, permissions, truncation at every byte, and a
//! file rewritten under the mapping.

mod common;

use std::path::Path;
#[cfg(unix)]
use std::path::PathBuf;

use common::{sample_spec, tt, vt, GgufSpec, Kv, RawGguf, Tensor};
use weightmap::{Error, LoadMode, LoadOptions, LoadReport, Weights};

// ---- helpers -------------------------------------------------------------------

fn load_mapped(path: &Path) -> weightmap::Result<Weights> {
    // SAFETY: the test files are private to each test and not modified while
    // loaded (the one test that rewrites a file does so through the hook,
    // before any tensor is handed out).
    unsafe { Weights::load(path, &LoadOptions::default()) }
}

fn load_mapped_no_fallback(path: &Path) -> weightmap::Result<Weights> {
    let opts = LoadOptions::default().fallback(false);
    // SAFETY: as in `load_mapped`.
    unsafe { Weights::load(path, &opts) }
}

fn load_streamed(path: &Path) -> weightmap::Result<Weights> {
    Weights::load_streamed(path, &LoadOptions::default())
}

fn summary(r: &weightmap::Result<Weights>) -> String {
    match r {
        Ok(w) => format!("Ok({} tensors)", w.len()),
        Err(e) => format!("Err({}: {e})", e.name()),
    }
}

/// Load `path` both ways; both must fail with the same error. Returns the
/// mapped load's error.
#[track_caller]
fn both_err(path: &Path) -> Error {
    let m = load_mapped(path);
    let s = load_streamed(path);
    match (m, s) {
        (Err(m), Err(s)) => {
            assert_eq!(m.name(), s.name(), "mapped: {m}\nstreamed: {s}");
            assert_eq!(m.to_string(), s.to_string());
            m
        }
        (m, s) => panic!(
            "expected an error from both modes: mapped {}, streamed {}",
            summary(&m),
            summary(&s)
        ),
    }
}

/// The mapped path, with fallback off, must reject a bad file itself, with
/// the same error as the stream path: an invalid file is an error in either
/// mode, never a fallback reason.
#[track_caller]
fn assert_mapped_path_rejects(path: &Path, e: &Error) {
    match load_mapped_no_fallback(path) {
        Err(m) => {
            assert_eq!(m.name(), e.name(), "{m}");
            assert_eq!(m.to_string(), e.to_string());
        }
        other => panic!(
            "mapped path without fallback: expected a rejection, got {}",
            summary(&other)
        ),
    }
}

/// Write `bytes` to a fresh file and load it in both modes: the error.
#[track_caller]
fn hostile(bytes: &[u8]) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.bin");
    std::fs::write(&path, bytes).unwrap();
    let e = both_err(&path);
    if !matches!(e, Error::EmptyFile { .. }) {
        assert_mapped_path_rejects(&path, &e);
    }
    e
}

/// What a valid file loaded to, checked equal in both modes.
struct Loaded {
    names: Vec<String>,
    nbytes: Vec<u64>,
    bytes: Vec<Vec<u8>>,
    mapped_report: LoadReport,
}

/// Load `path` both ways; both must succeed with the same tensors, each
/// tensor's bytes being the file's bytes at its `file_offset`.
#[track_caller]
fn both_ok_path(path: &Path) -> Loaded {
    let raw = std::fs::read(path).unwrap();
    let (m, s) = match (load_mapped(path), load_streamed(path)) {
        (Ok(m), Ok(s)) => (m, s),
        (m, s) => panic!(
            "expected both modes to load: mapped {}, streamed {}",
            summary(&m),
            summary(&s)
        ),
    };
    assert!(m.tensor_infos().eq(s.tensor_infos()));
    let mut bytes = Vec::new();
    for (a, b) in m.tensors().zip(s.tensors()) {
        let (ab, bb) = (a.to_vec().unwrap(), b.to_vec().unwrap());
        assert_eq!(ab, bb, "tensor '{}' differs between modes", a.name());
        let r = a.info().file_range();
        assert_eq!(ab, raw[r.start as usize..r.end as usize], "{}", a.name());
        bytes.push(ab);
    }
    Loaded {
        names: m.tensor_infos().map(|t| t.name.to_owned()).collect(),
        nbytes: m.tensor_infos().map(|t| t.nbytes).collect(),
        bytes,
        mapped_report: m.report().clone(),
    }
}

#[track_caller]
fn both_ok(bytes: &[u8]) -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.bin");
    std::fs::write(&path, bytes).unwrap();
    both_ok_path(&path)
}

/// A small file padded with zeros to `len` bytes (so counts and lengths are
/// judged against a file that has room for something).
fn padded(mut r: RawGguf, len: usize) -> Vec<u8> {
    assert!(r.len() <= len);
    let n = len - r.len();
    r.zeros(n);
    r.into_bytes()
}

// ---- oversized string lengths ----------------------------------------------------

#[test]
fn oversized_string_lengths() {
    // Key length u64::MAX: pos + len wraps.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).u64(u64::MAX);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::Truncated { ref what, needed: u64::MAX, .. } if what == "key of entry 0"),
        "{e:?}"
    );

    // A string value of 2^62 bytes in a 100-byte file.
    let mut r = RawGguf::new();
    r.header(3, 0, 1)
        .string(b"k")
        .u32(vt::STRING)
        .string_with_len(1 << 62, b"abc");
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::Truncated { ref what, needed, file_len: 100, .. }
            if what == "string value of key 'k'" && needed == 1 << 62),
        "{e:?}"
    );

    // A string length that makes pos + len wrap to just past the start.
    let mut r = RawGguf::new();
    r.header(3, 0, 1)
        .string(b"k")
        .u32(vt::STRING)
        .string_with_len(u64::MAX - 40, b"");
    let e = hostile(&padded(r, 100));
    assert!(matches!(e, Error::Truncated { .. }), "{e:?}");

    // A string of 2^62 bytes inside a string array.
    let mut r = RawGguf::new();
    let mut payload = RawGguf::new();
    payload.string(b"ok").string_with_len(1 << 62, b"x");
    r.header(3, 0, 1)
        .kv_array("arr", vt::STRING, 2, &payload.bytes);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::Truncated { ref what, .. } if what == "string 1 of array 'arr'"),
        "{e:?}"
    );

    // A tensor name of 2^62 bytes.
    let mut r = RawGguf::new();
    r.header(3, 1, 0).string_with_len(1 << 62, b"t");
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::TensorNameTooLong { len, offset: 24 } if len == 1 << 62),
        "{e:?}"
    );
}

// ---- array counts --------------------------------------------------------------

#[test]
fn oversized_array_counts() {
    // u32 elements, 2^62 of them: the byte size (2^64) overflows.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("a", vt::U32, 1 << 62, &[]);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::CountTooLarge { ref what, count, .. } if what.contains("'a'") && count == 1 << 62),
        "{e:?}"
    );

    // u64 elements, u64::MAX of them.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("a", vt::U64, u64::MAX, &[]);
    assert!(matches!(
        hostile(&padded(r, 100)),
        Error::CountTooLarge {
            count: u64::MAX,
            ..
        }
    ));

    // u8 elements, 2^40: no overflow, just far past the end.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("a", vt::U8, 1 << 40, &[]);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::Truncated { ref what, needed, .. } if what == "array value of key 'a'" && needed == 1 << 40),
        "{e:?}"
    );

    // Strings, 2^62 of them: more 8-byte lengths than bytes left.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("s", vt::STRING, 1 << 62, &[]);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::CountTooLarge { ref what, count, .. } if what.contains("'s'") && count == 1 << 62),
        "{e:?}"
    );
}

// ---- tensor and key counts ---------------------------------------------------------

#[test]
fn counts_whose_products_overflow() {
    // n * 24 (the least bytes of a tensor descriptor) wraps to 8: a naive
    // `n * 24 > remaining` check would pass.
    let n_tensors = u64::MAX / 24 + 1;
    assert!(n_tensors.wrapping_mul(24) < 76);
    let mut r = RawGguf::new();
    r.header(3, n_tensors, 0);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::CountTooLarge { ref what, count, offset: 8, remaining: 76 }
            if what == "tensor" && count == n_tensors),
        "{e:?}"
    );

    // n * 14 (the least bytes of a key/value) wraps to 12.
    let n_kv = u64::MAX / 14 + 1;
    assert!(n_kv.wrapping_mul(14) < 76);
    let mut r = RawGguf::new();
    r.header(3, 0, n_kv);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::CountTooLarge { ref what, count, offset: 16, .. }
            if what == "key/value" && count == n_kv),
        "{e:?}"
    );

    // Each count fits alone; together they do not (3 * 24 + 5 * 14 > 76).
    let mut r = RawGguf::new();
    r.header(3, 3, 5);
    let e = hostile(&padded(r, 100));
    assert!(
        matches!(e, Error::CountTooLarge { ref what, count: 5, .. } if what == "key/value"),
        "{e:?}"
    );

    // Both u64::MAX.
    let mut r = RawGguf::new();
    r.header(3, u64::MAX, u64::MAX);
    assert!(matches!(
        hostile(&padded(r, 100)),
        Error::CountTooLarge { .. }
    ));
}

// ---- dimensions and sizes -------------------------------------------------------------

#[test]
fn more_than_four_dims() {
    let mut t = Tensor::new("t5", tt::F32, &[1, 1, 1, 1, 1]);
    t.n_dims = Some(5);
    let e = hostile(&GgufSpec::new().tensor(t).bytes());
    assert!(
        matches!(e, Error::TooManyDims { ref tensor, n_dims: 5 } if tensor == "t5"),
        "{e:?}"
    );
    // n_dims u32::MAX with no dims following: rejected before any dim is read.
    let mut t = Tensor::new("tmax", tt::F32, &[]);
    t.n_dims = Some(u32::MAX);
    let e = hostile(&GgufSpec::new().tensor(t).bytes());
    assert!(
        matches!(e, Error::TooManyDims { ref tensor, n_dims: u32::MAX } if tensor == "tmax"),
        "{e:?}"
    );
}

#[test]
fn element_count_overflow() {
    for dims in [
        &[1u64 << 32, 1 << 32][..],
        &[1 << 16, 1 << 16, 1 << 16, 1 << 16],
        &[1 << 62, 2],
        &[i64::MAX as u64, 1], // not below INT64_MAX
    ] {
        let e = hostile(
            &GgufSpec::new()
                .tensor(Tensor::new("big", tt::F32, dims))
                .bytes(),
        );
        assert!(
            matches!(e, Error::TensorSizeOverflow { ref tensor, what: "element count" } if tensor == "big"),
            "{dims:?}: {e:?}"
        );
    }
}

#[test]
fn byte_size_overflow() {
    // Element counts below INT64_MAX whose byte sizes overflow: F32 and F64
    // of 2^62 elements (2^64 and 2^65 bytes); Q8_0 of 2^63 - 32 elements
    // (34/32 bytes each: past isize::MAX though it fits a u64).
    for (ty, dims) in [
        (tt::F32, [1u64 << 62]),
        (28, [1 << 62]),
        (tt::Q8_0, [(1 << 63) - 32]),
    ] {
        let e = hostile(
            &GgufSpec::new()
                .tensor(Tensor::new("huge", ty, &dims))
                .bytes(),
        );
        assert!(
            matches!(e, Error::TensorSizeOverflow { ref tensor, what: "byte size" } if tensor == "huge"),
            "type {ty}: {e:?}"
        );
    }
}

// ---- offsets ---------------------------------------------------------------------

#[test]
fn offset_outside_the_file() {
    let mut t = Tensor::new("far", tt::F32, &[4]);
    t.offset = Some(1 << 40);
    let e = hostile(&GgufSpec::new().tensor(t).bytes());
    assert!(
        matches!(e, Error::TensorOutOfBounds { ref tensor, .. } if tensor == "far"),
        "{e:?}"
    );
}

#[test]
fn offset_wrapping_back_inside_the_file() {
    // data_offset + offset == 2^64: with wrapping arithmetic the tensor
    // would start at byte 0 of the file, which is in bounds.
    let spec = || GgufSpec::new().tensor(Tensor::new("w", tt::F32, &[4]));
    let data_offset = spec().build().data_offset as u64;
    let mut t = Tensor::new("w", tt::F32, &[4]);
    t.offset = Some(0u64.wrapping_sub(data_offset));
    let bytes = GgufSpec::new().tensor(t).bytes();
    let e = hostile(&bytes);
    assert!(
        matches!(e, Error::TensorSizeOverflow { ref tensor, what: "offset + size" } if tensor == "w"),
        "{e:?}"
    );

    // offset + size wraps (alignment 1 lets any offset through).
    let mut t = Tensor::new("w", tt::F32, &[4]);
    t.offset = Some(u64::MAX - 7);
    let e = hostile(&GgufSpec::new().alignment_key(1).tensor(t).bytes());
    assert!(
        matches!(e, Error::TensorSizeOverflow { ref tensor, what: "offset + size" } if tensor == "w"),
        "{e:?}"
    );

    // A second tensor pointing back inside the first one.
    let mut b = Tensor::new("b", tt::F32, &[8]);
    b.offset = Some(0);
    let e = hostile(
        &GgufSpec::new()
            .tensor(Tensor::new("a", tt::F32, &[16]))
            .tensor(b)
            .bytes(),
    );
    assert!(
        matches!(e, Error::TensorOverlap { ref tensor, ref other, .. }
            if (tensor.as_str(), other.as_str()) == ("b", "a") || (tensor.as_str(), other.as_str()) == ("a", "b")),
        "{e:?}"
    );
}

// ---- duplicates ------------------------------------------------------------------

#[test]
fn duplicate_keys_and_tensor_names() {
    let spec = GgufSpec::new()
        .kv(Kv::u32("k", 1))
        .kv(Kv::u32("other", 2))
        .kv(Kv::string("k", b"again"));
    let e = hostile(&spec.bytes());
    assert!(
        matches!(e, Error::DuplicateKey { ref key, .. } if key == "k"),
        "{e:?}"
    );

    let spec = GgufSpec::new()
        .tensor(Tensor::new("w", tt::F32, &[4]))
        .tensor(Tensor::new("v", tt::F32, &[4]))
        .tensor(Tensor::new("w", tt::F32, &[4]));
    let e = hostile(&spec.bytes());
    assert!(
        matches!(e, Error::DuplicateTensor { ref name } if name == "w"),
        "{e:?}"
    );
}

// ---- alignment --------------------------------------------------------------------

#[test]
fn alignment_of_the_wrong_type_or_zero() {
    for (kv, found) in [
        (Kv::i32("general.alignment", 32), "i32"),
        (Kv::u64("general.alignment", 32), "u64"),
        (Kv::u8("general.alignment", 32), "u8"),
        (Kv::string("general.alignment", b"32"), "string"),
    ] {
        let e = hostile(&GgufSpec::new().kv(kv).bytes());
        assert!(
            matches!(e, Error::AlignmentType { found: f } if f == found),
            "{found}: {e:?}"
        );
    }
    let e = hostile(&GgufSpec::new().kv(Kv::u32("general.alignment", 0)).bytes());
    assert!(matches!(e, Error::AlignmentValue { value: 0 }), "{e:?}");
}

// ---- other malformed headers --------------------------------------------------------

#[test]
fn other_header_errors_are_the_same_in_both_modes() {
    let mut r = RawGguf::new();
    r.magic(b"GGUX").u32(3).u64(0).u64(0);
    // Starts like the magic for 3 bytes only, and is no safetensors header.
    assert!(matches!(hostile(&r.bytes), Error::UnknownFormat));

    for version in [0u32, 1, 4, u32::MAX] {
        let mut r = RawGguf::new();
        r.header(version, 0, 0);
        let e = hostile(&r.bytes);
        assert!(
            matches!(e, Error::UnsupportedVersion { version: v } if v == version),
            "{version}: {e:?}"
        );
    }
    let mut r = RawGguf::new();
    r.header(3 << 16, 0, 0);
    assert!(matches!(hostile(&r.bytes), Error::BigEndian { .. }));

    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_raw(b"k", 13, &[0; 8]);
    assert!(matches!(
        hostile(&padded(r, 64)),
        Error::UnknownValueType { type_id: 13, .. }
    ));

    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("n", vt::ARRAY, 1, &[0; 16]);
    assert!(matches!(hostile(&padded(r, 80)), Error::NestedArray { .. }));

    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_raw(b"\xff\xfe", vt::U8, &[1]);
    assert!(matches!(hostile(&padded(r, 64)), Error::InvalidUtf8 { .. }));

    let e = hostile(&GgufSpec::new().tensor(Tensor::new("t", 43, &[4])).bytes());
    assert!(
        matches!(e, Error::UnknownTensorType { type_id: 43, .. }),
        "{e:?}"
    );
    let e = hostile(&GgufSpec::new().tensor(Tensor::new("t", 4, &[32])).bytes());
    assert!(
        matches!(e, Error::UnknownTensorType { type_id: 4, .. }),
        "{e:?}"
    );
    let e = hostile(
        &GgufSpec::new()
            .tensor(Tensor::new("q", tt::Q4_0, &[33]))
            .bytes(),
    );
    assert!(matches!(e, Error::BlockMismatch { ne0: 33, .. }), "{e:?}");
    let e = hostile(
        &GgufSpec::new()
            .tensor(Tensor::new("neg", tt::F32, &[4, u64::MAX]))
            .bytes(),
    );
    assert!(matches!(e, Error::NegativeDim { index: 1, .. }), "{e:?}");
    let name = "n".repeat(64);
    let e = hostile(
        &GgufSpec::new()
            .tensor(Tensor::new(&name, tt::F32, &[4]))
            .bytes(),
    );
    assert!(
        matches!(e, Error::TensorNameTooLong { len: 64, .. }),
        "{e:?}"
    );
}

// ---- empty, magic only, truncation at every byte -----------------------------------

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(both_err(&path), Error::EmptyFile { .. }));
    assert!(matches!(
        load_mapped_no_fallback(&path),
        Err(Error::EmptyFile { .. })
    ));
}

#[test]
fn magic_only() {
    let e = hostile(b"GGUF");
    assert!(
        matches!(e, Error::Truncated { ref what, offset: 4, file_len: 4, .. } if what == "version"),
        "{e:?}"
    );
    // Not even the whole magic.
    for n in 1..4 {
        let e = hostile(&b"GGUF"[..n]);
        assert!(
            matches!(e, Error::Truncated { ref what, offset: 0, .. } if what == "magic"),
            "{n}: {e:?}"
        );
    }
}

/// Every prefix of a small valid file: shorter than the last tensor's end,
/// an error (the same in both modes, and found by the mapped path itself);
/// from there on (only padding is missing), a valid file. The truncations
/// inside the header must hit every one of its sections.
#[test]
fn every_prefix_of_a_valid_file() {
    let built = sample_spec().build();
    let last_end = (0..built.offsets.len())
        .map(|i| built.tensor_end(i))
        .max()
        .unwrap();
    assert!(last_end <= built.bytes.len());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prefix.gguf");
    let mut whats = std::collections::BTreeSet::new();
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for cut in 0..=built.bytes.len() {
        std::fs::write(&path, &built.bytes[..cut]).unwrap();
        if cut >= last_end {
            let l = both_ok_path(&path);
            assert_eq!(l.names.len(), 3, "cut {cut}");
            continue;
        }
        let e = both_err(&path);
        *kinds.entry(e.name()).or_default() += 1;
        match (&e, cut) {
            (Error::EmptyFile { .. }, 0) => continue,
            (Error::Truncated { what, file_len, .. }, _) if cut < built.header_len => {
                assert_eq!(*file_len, cut as u64);
                // "key of entry 0" -> "key of entry", "string value of key 'x'" -> "string value of key".
                let section = what
                    .split(|c: char| c == '\'' || c.is_ascii_digit())
                    .next()
                    .unwrap()
                    .trim()
                    .to_owned();
                whats.insert(section);
            }
            (Error::CountTooLarge { .. }, _) if cut < built.header_len => {}
            (Error::TensorOutOfBounds { file_len, .. }, _) if cut >= built.header_len => {
                assert_eq!(*file_len, cut as u64);
            }
            _ => panic!("cut at {cut}: unexpected {e:?}"),
        }
        assert_mapped_path_rejects(&path, &e);
    }
    for section in [
        "magic",
        "version",
        "tensor count",
        "key/value count",
        "key length of entry",
        "key of entry",
        "value type of key",
        "string length of key",
        "string value of key",
        "value of key",
        "array element type of key",
        "array length of key",
        "array value of key",
        "length of string",
        "string",
        "name length of tensor",
        "name of tensor",
        "n_dims of tensor",
        "dimension",
        "type of tensor",
        "offset of tensor",
    ] {
        assert!(
            whats.contains(section),
            "no truncation inside '{section}'; saw {whats:?}"
        );
    }
    assert!(kinds["truncated"] > built.header_len / 2, "{kinds:?}");
    assert!(kinds["tensor_out_of_bounds"] > 0, "{kinds:?}");
}

#[test]
fn last_tensor_one_byte_short() {
    let built = sample_spec().build();
    let last = built.offsets.len() - 1;
    let end = built.tensor_end(last);
    let e = hostile(&built.truncated(end - 1));
    assert!(
        matches!(e, Error::TensorOutOfBounds { ref tensor, end: e_end, file_len, .. }
            if tensor == "output_norm.weight" && e_end == end as u64 && file_len == end as u64 - 1),
        "{e:?}"
    );
    // Ending exactly at the last tensor's end (no trailing padding) is valid.
    let l = both_ok(&built.truncated(end));
    assert_eq!(l.names.len(), 3);
}

// ---- things that are not regular, readable files ------------------------------------

// FIFOs, symbolic links without privilege and mode bits are Unix's.
#[cfg(unix)]
#[test]
fn directory_fifo_and_device_are_not_files_in_either_mode() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = dir.path().join("link-to-dir");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    let mut paths: Vec<PathBuf> = vec![dir.path().to_owned(), fifo, link];
    if Path::new("/dev/null").exists() {
        paths.push("/dev/null".into());
    }
    for path in &paths {
        // Neither mode may open a FIFO (it would block until a writer appears).
        let e = both_err(path);
        assert!(
            matches!(e, Error::NotAFile { path: ref p } if p == path),
            "{}: {e:?}",
            path.display()
        );
        assert!(
            matches!(load_mapped_no_fallback(path), Err(Error::NotAFile { .. })),
            "{}",
            path.display()
        );
    }
}

#[test]
fn missing_path_and_dangling_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("does-not-exist.gguf");
    #[allow(unused_mut)] // pushed to on Unix only
    let mut paths = vec![missing.clone()];
    // Windows makes symbolic links only with a privilege.
    #[cfg(unix)]
    {
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(&missing, &dangling).unwrap();
        paths.push(dangling);
    }
    for path in paths {
        let e = both_err(&path);
        assert!(
            matches!(e, Error::Io { op: "stat", ref source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        // Not a fallback reason: the same typed error, NotFound kept.
        assert!(matches!(
            load_mapped_no_fallback(&path),
            Err(Error::Io { op: "stat", ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound
        ));
    }
}

// FIFOs, symbolic links without privilege and mode bits are Unix's.
#[cfg(unix)]
#[test]
fn file_without_read_permission() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret.gguf");
    std::fs::write(&path, sample_spec().bytes()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root (CAP_DAC_OVERRIDE) opens a mode-000 file anyway, so there is
        // no permission error to observe: the loads just must not panic.
        let _ = load_mapped(&path);
        let _ = load_streamed(&path);
        return;
    }
    let e = both_err(&path);
    assert!(
        matches!(e, Error::Io { op: "open", ref source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied),
        "{e:?}"
    );
    assert!(matches!(
        load_mapped_no_fallback(&path),
        Err(Error::Io { op: "open", ref source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied
    ));
}

// ---- ggml's own verdicts (tests/test-gguf.cpp) ----------------------------------------

#[test]
fn ggml_no_tensors_and_no_keys_is_valid() {
    let mut r = RawGguf::new();
    r.header(3, 0, 0);
    let l = both_ok(&r.bytes);
    assert!(l.names.is_empty());
}

#[test]
fn ggml_empty_key_is_invalid() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_raw(b"", vt::U32, &7u32.to_le_bytes());
    let e = hostile(&padded(r, 64));
    assert!(matches!(e, Error::EmptyKey { offset: 24 }), "{e:?}");
}

#[test]
fn ggml_zero_dimension_tensor_is_valid_with_0_bytes() {
    let spec = GgufSpec::new()
        .tensor(Tensor::new("empty", tt::F32, &[0, 4]))
        .tensor(Tensor::new("next", tt::F32, &[2]));
    let l = both_ok(&spec.bytes());
    assert_eq!(l.names, ["empty", "next"]);
    assert_eq!(l.nbytes, [0, 8]);
    assert!(l.bytes[0].is_empty());
    assert_eq!(l.bytes[1], common::pattern(1, 8));
}

#[test]
fn ggml_byte_size_2_pow_64_minus_16_is_invalid() {
    // 2^62 - 4 F32 elements: 2^64 - 16 bytes, which wraps to 0 padded to 32.
    let n = (1u64 << 62) - 4;
    assert_eq!(n * 4, u64::MAX - 15);
    let e = hostile(
        &GgufSpec::new()
            .tensor(Tensor::new("huge", tt::F32, &[n]))
            .bytes(),
    );
    assert!(
        matches!(e, Error::TensorSizeOverflow { ref tensor, what: "byte size" } if tensor == "huge"),
        "{e:?}"
    );
}

#[test]
fn ggml_two_huge_i8_tensors_are_invalid() {
    const N: u64 = 0x7FFF_FFFF_FFFF_FFC0;
    let mut r = RawGguf::new();
    r.header(3, 2, 0)
        .tensor(b"a", &[N], tt::I8, 0)
        .tensor(b"b", &[N], tt::I8, N)
        .pad_to(32)
        .zeros(64);
    let e = hostile(&r.bytes);
    assert!(
        matches!(e, Error::TensorOutOfBounds { ref tensor, .. } if tensor == "a"),
        "{e:?}"
    );
}

#[test]
fn ggml_alignment_1_is_valid() {
    // Tensors at odd offsets: valid, but not zero-copy placeable in a
    // 32-byte-aligned buffer, so the mapped load copies them and says why.
    let spec = GgufSpec::new()
        .alignment_key(1)
        .tensor(Tensor::new("a", tt::F32, &[3]))
        .tensor(Tensor::new("b", tt::I8, &[5]))
        .tensor(Tensor::new("c", tt::F16, &[3]));
    let built = spec.build();
    assert_eq!(built.offsets, [0, 12, 17]);
    let l = both_ok(&built.bytes);
    assert_eq!(l.nbytes, [12, 5, 6]);
    for (i, b) in l.bytes.iter().enumerate() {
        assert_eq!(*b, common::pattern(i, l.nbytes[i] as usize));
    }
    assert_eq!(l.mapped_report.mode_used, LoadMode::Mmap);
    assert_eq!(l.mapped_report.fallback, None);
    // With alignment 1 the data section itself starts unpadded, so all
    // three sit at addresses off 32 (and f32 "a" off 4): all are copied.
    let copied: Vec<&str> = l
        .mapped_report
        .copied
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(copied, ["a", "b", "c"]);
}

#[test]
fn ggml_offsets_laid_out_with_alignment_1_without_the_key_are_invalid() {
    let mut spec = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[3]))
        .tensor(Tensor::new("b", tt::F32, &[2]));
    spec.layout_alignment = 1;
    let e = hostile(&spec.bytes());
    assert!(
        matches!(e, Error::MisalignedOffset { ref tensor, offset: 12, alignment: 32 } if tensor == "b"),
        "{e:?}"
    );
}

#[test]
fn ggml_alignment_13_or_int32_is_invalid() {
    let e = hostile(&GgufSpec::new().kv(Kv::u32("general.alignment", 13)).bytes());
    assert!(matches!(e, Error::AlignmentValue { value: 13 }), "{e:?}");
    let e = hostile(&GgufSpec::new().kv(Kv::i32("general.alignment", 32)).bytes());
    assert!(matches!(e, Error::AlignmentType { found: "i32" }), "{e:?}");
}

// ---- safetensors through the loader -------------------------------------------------

/// A safetensors file: the 8-byte length, `json`, then `data`.
fn st(json: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn safetensors_header_length_past_the_end() {
    // Claims 1000 bytes of JSON in a 20-byte file.
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}          ");
    let e = hostile(&bytes);
    assert!(
        matches!(e, Error::Truncated { ref what, needed: 1000, file_len: 20, .. } if what == "safetensors JSON header"),
        "{e:?}"
    );
    // Over the 100 MB header cap: its own message, not "unknown format".
    let mut bytes = (1u64 << 62).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let e = hostile(&bytes);
    assert!(
        matches!(e, Error::SafetensorsHeader { ref detail } if detail.contains("exceeds the limit")),
        "{e:?}"
    );
    // Only the length, no JSON.
    let e = hostile(&2u64.to_le_bytes());
    assert!(matches!(e, Error::UnknownFormat), "{e:?}");
}

#[test]
fn safetensors_overlapping_offsets() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let e = hostile(&st(json, &[1; 12]));
    assert!(
        matches!(e, Error::TensorOverlap { ref tensor, ref other, .. } if tensor == "b" && other == "a"),
        "{e:?}"
    );
    // One large tensor covering a later one.
    let json = r#"{"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    let e = hostile(&st(json, &[1; 16]));
    assert!(matches!(e, Error::TensorOverlap { .. }), "{e:?}");
}

#[test]
fn safetensors_dtype_shape_mismatch() {
    let json = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let e = hostile(&st(json, &[1; 8]));
    assert!(
        matches!(e, Error::SafetensorsHeader { ref detail } if detail.contains("'a'") && detail.contains("needs 12 bytes")),
        "{e:?}"
    );
    // A shape whose element count overflows u64.
    let json = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
    let e = hostile(&st(json, &[1; 8]));
    assert!(
        matches!(e, Error::TensorSizeOverflow { ref tensor, what: "element count" } if tensor == "a"),
        "{e:?}"
    );
    // An unknown dtype.
    let json = r#"{"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}"#;
    let e = hostile(&st(json, &[1; 8]));
    assert!(matches!(e, Error::SafetensorsHeader { .. }), "{e:?}");
}

#[test]
fn safetensors_duplicate_names() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    let e = hostile(&st(json, &[1; 8]));
    assert!(
        matches!(e, Error::DuplicateTensor { ref name } if name == "a"),
        "{e:?}"
    );
}

#[test]
fn safetensors_data_past_the_end_or_left_over() {
    let json = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#;
    let e = hostile(&st(json, &[1; 7]));
    assert!(
        matches!(e, Error::TensorOutOfBounds { ref tensor, .. } if tensor == "a"),
        "{e:?}"
    );
    let e = hostile(&st(json, &[1; 9]));
    assert!(matches!(e, Error::SafetensorsHeader { .. }), "{e:?}");
    let e = hostile(&st("{not json", &[]));
    assert!(
        matches!(e, Error::SafetensorsHeader { ref detail } if detail.contains("JSON")),
        "{e:?}"
    );
    // And the well-formed version loads in both modes.
    let l = both_ok(&st(json, &[7; 8]));
    assert_eq!(l.bytes, [vec![7u8; 8]]);
}

// ---- a file changed under the mapping ----------------------------------------------

// On Linux, where a private read-only mapping shows the page cache as it is.
#[cfg(target_os = "linux")]
mod rewritten_under_the_mapping {
    use super::*;
    use std::path::PathBuf;
    use weightmap::gguf::{GgufHeader, Writer};
    use weightmap::TensorType;

    const REWRITE_BYTE: u8 = 0xA5;

    /// Overwrite every tensor's bytes with `REWRITE_BYTE`, in place: same length.
    fn rewrite_tensor_bytes(path: &Path) {
        let raw = std::fs::read(path).unwrap();
        let file = GgufHeader::parse(&raw).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        for t in file.tensors() {
            let r = t.file_range();
            common::write_at(&f, &vec![REWRITE_BYTE; (r.end - r.start) as usize], r.start);
        }
        f.sync_all().unwrap();
    }

    /// Overwrite the header after the counts with 0xFF, in place: same length.
    fn rewrite_header_bytes(path: &Path) {
        let raw = std::fs::read(path).unwrap();
        let header_len = GgufHeader::parse(&raw).unwrap().header_len() as usize;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        common::write_at(&f, &vec![0xFF; header_len - 24], 24);
    }

    fn rewrite_fixture(dir: &Path) -> (PathBuf, Vec<u8>) {
        let mut w = Writer::new(32);
        w.kv_str_array("tokenizer.ggml.tokens", &["a", "bc", "def"]);
        w.kv_u32("llama.block_count", 1);
        let data: Vec<u8> = (0..64u8).collect();
        w.tensor("w", TensorType::F32, &[16], data.clone());
        let path = dir.join("model.gguf");
        std::fs::write(&path, w.to_bytes()).unwrap();
        (path, data)
    }

    /// The file's tensor bytes rewritten (same length) after the load returned
    /// (a rewrite before placement is noticed by its modification time, see the
    /// loader's unit tests). On Linux the mapping shows the NEW bytes: a
    /// read-only MAP_PRIVATE mapping shares the page cache until a page is
    /// written through the mapping (never, here), so pages read before or after
    /// the rewrite both show the file as it is now. This is exactly why
    /// `Weights::load` is `unsafe`: had a `&[u8]` of the tensor been held across
    /// the rewrite, memory Rust assumes immutable would have changed under it;
    /// this test takes its views only afterwards. The stream path copies, so it
    /// sees whatever the file held when read.
    #[test]
    fn tensor_bytes_rewritten_under_the_mapping_show_through() {
        let dir = tempfile::tempdir().unwrap();
        let (path, original) = rewrite_fixture(dir.path());
        let before = load_streamed(&path).unwrap();
        assert_eq!(before.tensor("w").unwrap().to_vec().unwrap(), original);

        let opts = LoadOptions::default().fallback(false);
        // SAFETY: the file is changed once, below, while no view of it is held,
        // and not afterwards.
        let w = unsafe { Weights::load(&path, &opts) }.unwrap();
        rewrite_tensor_bytes(&path);
        assert_eq!(w.report().mode_used, LoadMode::Mmap);
        assert_eq!(w.report().fallback, None);
        let t = w.tensor("w").unwrap();
        assert_eq!(t.host_bytes().unwrap(), &[REWRITE_BYTE; 64][..]);
        // The mapping is of the file as it now is, header included.
        assert_eq!(
            w.mapped().unwrap().file_bytes(),
            &std::fs::read(&path).unwrap()[..]
        );
        // The copy taken before the rewrite keeps the old bytes.
        assert_eq!(before.tensor("w").unwrap().to_vec().unwrap(), original);
    }

    /// The header rewritten after the load: the loader keeps the header it
    /// validated (tensor descriptors are owned), so placement is unaffected;
    /// metadata is read lazily from the mapping and now reads garbage — which
    /// must not panic (string-array lengths are re-read from the bytes).
    #[test]
    fn header_rewritten_under_the_mapping_does_not_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (path, original) = rewrite_fixture(dir.path());
        let opts = LoadOptions::default().fallback(false);
        // SAFETY: the file is changed once, below, while no view of it is held,
        // and not afterwards.
        let w = unsafe { Weights::load(&path, &opts) }.unwrap();
        rewrite_header_bytes(&path);
        assert_eq!(w.report().mode_used, LoadMode::Mmap);
        assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), original);
        let md = w.gguf_metadata().unwrap();
        for (_key, value) in md.iter() {
            if let weightmap::gguf::Value::Array(a) = value {
                let _ = a.iter().count();
                if let Ok(s) = a.strings() {
                    let _ = s.count();
                }
            }
        }
        let _ = md.get_u32("llama.block_count");
        let _ = md.get_array("tokenizer.ggml.tokens");
        // The file on disk is now invalid, and both modes say so alike.
        let e = both_err(&path);
        assert!(
            matches!(e, Error::Truncated { ref what, needed: u64::MAX, .. } if what == "key of entry 0"),
            "{e:?}"
        );
    }
}

// ---- valid edge cases next to the hostile ones -------------------------------------

#[test]
fn zero_byte_tensor_after_the_last_byte() {
    // An empty tensor laid out after a 12-byte one sits at data offset 32.
    // With the file padded, it is at the very end of the file: valid.
    let built = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[3]))
        .tensor(Tensor::new("z", tt::F32, &[0, 7]))
        .build();
    let l = both_ok(&built.bytes);
    assert_eq!(l.nbytes, [12, 0]);
    assert!(l.bytes[1].is_empty());
    // Cut at the end of 'a', the empty tensor's offset lies past the end:
    // out of bounds, as llama.cpp judges it (offset > file size).
    let e = hostile(&built.truncated(built.tensor_end(0)));
    assert!(
        matches!(e, Error::TensorOutOfBounds { ref tensor, start, end, .. } if tensor == "z" && start == end),
        "{e:?}"
    );
}

/// REGRESSION (found by this suite; fixed in a0b19af): a valid GGUF whose
/// only tensors have zero bytes (ggml accepts zero dims) loaded on the mapped
/// path but failed on the stream path with `MisalignedPlacement { address:
/// 0x1 }`: the stream path allocates a 0-byte `CpuBuffer`, whose base address
/// was the dangling pointer of `&[]` (0x1), and `place()` checks it against
/// the 32-byte alignment even for a 0-byte placement.
#[test]
fn regression_gguf_with_only_zero_byte_tensors_loads_in_both_modes() {
    let built = GgufSpec::new()
        .tensor(Tensor::new("z", tt::F32, &[0]))
        .tensor(Tensor::new("y", tt::F16, &[4, 0]))
        .build();
    assert_eq!(built.data_offset, built.bytes.len());
    let l = both_ok(&built.bytes);
    assert_eq!(l.nbytes, [0, 0]);
}

/// REGRESSION: as above, for safetensors with only empty tensors.
#[test]
fn regression_safetensors_with_only_empty_tensors_loads_in_both_modes() {
    let json = r#"{"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"U8","shape":[3,0],"data_offsets":[0,0]}}"#;
    let l = both_ok(&st(json, &[]));
    assert_eq!(l.nbytes, [0, 0]);
}

/// REGRESSION (open library bug): a typed view of an empty tensor must be an
/// empty slice, whatever holds it. A 0-byte `CpuBuffer` has no memory and
/// `CpuBuffer::bytes()` returns `&[]`, whose pointer is 0x1 (a0b19af aligned
/// its `base_addr()` but not its bytes), so `view::<f32>()` fails with
/// `ViewLayout { address: 1, reason: TargetAlignmentGreaterAndInputNotAligned }`
/// (1) on `to_owned_tensor()` of ANY empty tensor, e.g. tiny-llama.gguf's
/// `test.empty`, in either mode; (2) on the stream load of a file whose only
/// tensors are empty, where the mapped load gives `Ok(&[])`.
#[test]
fn regression_empty_tensor_views_agree_in_both_modes() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-llama.gguf");
    let built = GgufSpec::new()
        .tensor(Tensor::new("z", tt::F32, &[0]))
        .build();
    let dir = tempfile::tempdir().unwrap();
    let only_empty = dir.path().join("only-empty.gguf");
    std::fs::write(&only_empty, &built.bytes).unwrap();
    let mut failures = Vec::new();
    for (path, name) in [(&tiny, "test.empty"), (&only_empty, "z")] {
        for w in [load_mapped(path).unwrap(), load_streamed(path).unwrap()] {
            let mode = w.report().mode_used;
            let file = path.file_name().unwrap().to_string_lossy();
            let t = w.tensor(name).unwrap();
            assert_eq!(t.info().nbytes, 0);
            match t.view::<f32>() {
                Ok([]) => {}
                r => failures.push(format!("{file} {mode:?} view: {r:?}")),
            }
            let mut owned = t.to_owned_tensor().unwrap();
            if let Err(e) = owned.view::<f32>() {
                failures.push(format!("{file} {mode:?} owned view: {e}"));
            }
            if let Err(e) = owned.view_mut::<f32>() {
                failures.push(format!("{file} {mode:?} owned view_mut: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// REGRESSION, found by `fuzz/load_file` (artifact crash-7ba51c54...,
/// 133 bytes): a GGUF whose one tensor (42 NUL bytes of name, F32, ne = [0])
/// is empty. The stream load's typed view fails where the mapped one gives
/// `Ok(&[])`: the open bug of `regression_empty_tensor_views_agree_in_both_modes`.
#[test]
fn regression_fuzz_load_file_empty_tensor_view() {
    let mut r = RawGguf::new();
    r.header(3, 1, 0)
        .string(&[0; 42])
        .u32(1)
        .u64(0)
        .u32(tt::F32)
        .u64(0)
        .zeros(35);
    let bytes = r.into_bytes();
    assert_eq!(bytes.len(), 133);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash-7ba51c54.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let l = both_ok_path(&path);
    assert_eq!(l.nbytes, [0]);
    let name = "\0".repeat(42);
    for w in [load_mapped(&path).unwrap(), load_streamed(&path).unwrap()] {
        let v = w.tensor(&name).unwrap().view::<f32>().map(<[f32]>::len);
        assert!(matches!(v, Ok(0)), "{:?}: {v:?}", w.report().mode_used);
    }
}
