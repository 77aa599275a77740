//! No allocation sized by a count the file claims: files under
//! 1 KiB that claim 2^62 tensors, keys, array elements or string bytes, or a
//! huge safetensors header, must be rejected by the parser, the stream load
//! and the mapped load while the calling thread allocates at most 1 MiB.
//!
//! The suite's counting `#[global_allocator]` (tests/common/counting_alloc.rs)
//! wraps `System` and adds up the bytes allocated by the current thread
//! while its counter is switched on (other test threads run in parallel and
//! are not counted). It sees heap allocations only: weightmap's owned
//! buffers of `CpuBuffer::MAP_THRESHOLD` bytes or more are anonymous
//! mappings and the mapped path is a file mapping, neither of which goes
//! through the allocator — but every file here is rejected while its header is parsed,
//! before any buffer exists (the tests check the error is a header error).

mod common;

use std::path::Path;

use common::{vt, RawGguf};
use weightmap::gguf::GgufHeader;
use weightmap::safetensors::SafetensorsHeader;
use weightmap::{Error, LoadOptions, Weights};

// ---- the counting allocator --------------------------------------------------------

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

/// Run `f` with this thread's counter on: its result, the bytes and the
/// number of allocations it made on this thread.
fn measure<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    let (r, n) = counting_alloc::measure(f);
    (r, n.bytes, n.count)
}

const LIMIT: u64 = 1 << 20;

// ---- the counter works -------------------------------------------------------------

#[test]
fn counter_sees_a_2_mib_vec() {
    let (v, bytes, count) = measure(|| std::hint::black_box(vec![1u8; 2 << 20]));
    assert_eq!(v.len(), 2 << 20);
    assert!(bytes >= 2 << 20, "counted {bytes} bytes");
    assert!(count >= 1);
    // It would fail the bound.
    assert!(bytes > LIMIT);

    // Growth by realloc is counted too.
    let (v, bytes, _) = measure(|| {
        let mut v: Vec<u64> = Vec::new();
        for i in 0..(1 << 18) {
            v.push(std::hint::black_box(i));
        }
        v
    });
    assert_eq!(v.len(), 1 << 18);
    assert!(bytes >= 8 << 18, "counted {bytes} bytes");
}

#[test]
fn counter_is_per_thread_and_off_outside_measure() {
    // Another thread's 8 MiB is not this thread's.
    let ((), bytes, _) = measure(|| {
        std::thread::spawn(|| {
            std::hint::black_box(vec![0u8; 8 << 20]);
        })
        .join()
        .unwrap();
    });
    assert!(bytes < LIMIT, "counted {bytes} bytes of another thread's");
    // Nothing is counted while off.
    std::hint::black_box(vec![0u8; 4 << 20]);
    let ((), bytes, count) = measure(|| {});
    assert_eq!((bytes, count), (0, 0));
}

#[test]
fn counter_sees_the_loader_reading_a_header() {
    // The stream path reads the header into a Vec: for this 8960-byte
    // fixture, the whole file. The counter must see it.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-llama.gguf");
    let len = std::fs::metadata(&path).unwrap().len();
    let (w, bytes, _) = measure(|| Weights::load_streamed(&path, &LoadOptions::default()));
    assert!(!w.unwrap().is_empty());
    assert!(bytes >= len, "counted {bytes} bytes, file is {len}");
}

// ---- hostile claims in small files ---------------------------------------------------

/// A file of `len` bytes (under 1 KiB): `r`, then filler (0x01, so every
/// length or count read from it is small and nonzero).
fn small(mut r: RawGguf, len: usize) -> Vec<u8> {
    assert!(len < 1024 && r.len() <= len);
    let n = len - r.len();
    r.fill(n, 1);
    r.into_bytes()
}

/// `bytes` must be rejected with an error `ok_err` accepts by the header
/// parser `parse`, by `Weights::load_streamed` and by the mapped
/// `Weights::load`, each allocating at most `LIMIT` bytes on this thread.
#[track_caller]
fn rejected_within_limit(
    bytes: &[u8],
    parse: fn(&[u8]) -> Option<Error>,
    ok_err: impl Fn(&Error) -> bool,
) {
    assert!(bytes.len() < 1024);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claim.bin");
    std::fs::write(&path, bytes).unwrap();
    let opts = LoadOptions::default();

    let (e, n, _) = measure(|| parse(bytes));
    let e = e.expect("the parser accepted the file");
    assert!(ok_err(&e), "parser: {e:?}");
    assert!(n <= LIMIT, "parser allocated {n} bytes ({e})");

    let (r, n, _) = measure(|| Weights::load_streamed(&path, &opts));
    let e = r.expect_err("load_streamed accepted the file");
    assert!(n <= LIMIT, "load_streamed allocated {n} bytes ({e})");
    // The loader may detect the format differently (see the safetensors case).
    let streamed = e.to_string();

    // SAFETY: the file is not modified while loaded.
    let (r, n, _) = measure(|| unsafe { Weights::load(&path, &opts) });
    let e = r.expect_err("load accepted the file");
    assert!(n <= LIMIT, "mapped load allocated {n} bytes ({e})");
    assert_eq!(e.to_string(), streamed);
}

fn gguf_parse(b: &[u8]) -> Option<Error> {
    GgufHeader::parse(b).err()
}

fn st_parse(b: &[u8]) -> Option<Error> {
    SafetensorsHeader::parse(b).err()
}

#[test]
fn claims_2_pow_62_tensors() {
    let mut r = RawGguf::new();
    r.header(3, 1 << 62, 0);
    rejected_within_limit(
        &small(r, 512),
        gguf_parse,
        |e| matches!(e, Error::CountTooLarge { what, count, .. } if what == "tensor" && *count == 1 << 62),
    );
}

#[test]
fn claims_2_pow_62_keys() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1 << 62);
    rejected_within_limit(
        &small(r, 512),
        gguf_parse,
        |e| matches!(e, Error::CountTooLarge { what, count, .. } if what == "key/value" && *count == 1 << 62),
    );
}

#[test]
fn claims_a_string_array_of_2_pow_62_elements() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1)
        .kv_array("tokens", vt::STRING, 1 << 62, &[]);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::CountTooLarge { what, count, .. } if what.contains("'tokens'") && *count == 1 << 62),
    );
}

#[test]
fn claims_a_u32_array_of_2_pow_62_elements() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("ids", vt::U32, 1 << 62, &[]);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::CountTooLarge { what, count, .. } if what.contains("'ids'") && *count == 1 << 62),
    );
    // u8 elements: the byte size fits a u64, and runs far past the end.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("ids", vt::U8, 1 << 62, &[]);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::Truncated { needed, .. } if *needed == 1 << 62),
    );
}

#[test]
fn claims_a_string_of_2_pow_62_bytes() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1)
        .string(b"general.name")
        .u32(vt::STRING)
        .u64(1 << 62);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::Truncated { what, needed, .. } if what.contains("general.name") && *needed == 1 << 62),
    );
    // As a key, and as a tensor name.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).u64(1 << 62);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::Truncated { needed, .. } if *needed == 1 << 62),
    );
    let mut r = RawGguf::new();
    r.header(3, 1, 0).u64(1 << 62);
    rejected_within_limit(
        &small(r, 900),
        gguf_parse,
        |e| matches!(e, Error::TensorNameTooLong { len, .. } if *len == 1 << 62),
    );
}

#[test]
fn claims_a_huge_safetensors_header() {
    // 2^62 bytes of JSON: over the 100 MB cap. The parser says so; the
    // loader does not even take it for safetensors (the sniff requires a
    // length within the cap), so it is an unknown format.
    let mut b = (1u64 << 62).to_le_bytes().to_vec();
    b.extend_from_slice(br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
    b.resize(512, b' ');
    rejected_within_limit(
        &b,
        st_parse,
        |e| matches!(e, Error::SafetensorsHeader { detail } if detail.contains("exceeds")),
    );
    // Exactly at the cap (100 MB): sniffed as safetensors, and truncated —
    // with no 100 MB buffer for the JSON.
    let mut b = weightmap::safetensors::SafetensorsHeader::MAX_HEADER_LEN
        .to_le_bytes()
        .to_vec();
    b.extend_from_slice(b"{}");
    b.resize(512, b' ');
    rejected_within_limit(
        &b,
        st_parse,
        |e| matches!(e, Error::Truncated { needed, .. } if *needed == weightmap::safetensors::SafetensorsHeader::MAX_HEADER_LEN),
    );
}

// ---- owned copies ----------------------------------------------------------------

#[test]
fn a_small_owned_copy_is_a_heap_block_and_a_large_one_is_not() {
    use weightmap::buffer::CpuBuffer;
    use weightmap::gguf::Writer;
    use weightmap::TensorType;
    let big = CpuBuffer::MAP_THRESHOLD;
    let mut w = Writer::new(32);
    w.tensor("norm", TensorType::F32, &[64], vec![1; 256]);
    w.tensor("big", TensorType::I8, &[big as u64], vec![2; big]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    // SAFETY: the file is not modified while loaded.
    let weights = unsafe { Weights::load(&path, &LoadOptions::default()) }.unwrap();

    // The 256-byte norm: its 256 bytes come from the allocator (no mmap).
    let norm = weights.tensor("norm").unwrap();
    let (owned, bytes, _) = measure(|| norm.to_owned_tensor().unwrap());
    assert_eq!(owned.bytes(), &[1u8; 256][..]);
    assert_eq!(owned.bytes().as_ptr() as usize % 32, 0);
    assert!(bytes >= 256, "counted {bytes} bytes");
    // The large one is a mapping: the allocator sees only small bookkeeping.
    let large = weights.tensor("big").unwrap();
    let (owned, bytes, _) = measure(|| large.to_owned_tensor().unwrap());
    assert!(owned.bytes().iter().all(|&b| b == 2));
    assert!(bytes < big as u64 / 2, "counted {bytes} bytes");
}
