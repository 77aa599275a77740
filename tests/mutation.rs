//! Mutated valid files through the loader in both modes: flipped
//! and overwritten bytes (mostly in the header), interesting integers written
//! over header fields, truncation, inserted and deleted bytes. Whatever the
//! mutation, neither mode may panic, and the two must agree: the same error
//! (same `kind()`, same Display), or the same tensors with identical bytes,
//! each tensor's bytes being the mutated file's bytes at its `file_offset`.
//!
//! 256 cases in all, so a debug `cargo test` stays fast.

use std::cell::Cell;
use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use weightmap::gguf::Writer;
use weightmap::{Header, LoadOptions, TensorType, Weights};

/// A base file and the length of its header region (where mutations are aimed).
struct Base {
    name: &'static str,
    bytes: Vec<u8>,
    header_len: usize,
}

fn writer_built() -> Vec<u8> {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", 2);
    w.kv_str_array(
        "tokenizer.ggml.tokens",
        &["<s>", "</s>", "hello", "wörld", ""],
    );
    w.kv_f32_array("tokenizer.ggml.scores", &[0.0, -1.0, -2.5, -3.0, -4.0]);
    w.kv_i32_array("test.ids", &[1, -2, 3]);
    let pat = |n: usize, k: u8| (0..n).map(|i| (i as u8).wrapping_mul(13) ^ k).collect();
    w.tensor("token_embd.weight", TensorType::F32, &[8, 3], pat(96, 1));
    w.tensor(
        "blk.0.attn_q.weight",
        TensorType::Q4_0,
        &[32, 2],
        pat(36, 2),
    );
    w.tensor("blk.0.ffn.weight", TensorType::Q8_0, &[64], pat(68, 3));
    w.tensor("output_norm.weight", TensorType::F16, &[5], pat(10, 4));
    w.tensor("empty", TensorType::F32, &[0], Vec::new());
    w.tensor("last", TensorType::I8, &[3], pat(3, 5));
    w.to_bytes()
}

fn bases() -> Vec<Base> {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let mut files: Vec<(&'static str, Vec<u8>)> =
        ["tiny-llama.gguf", "quant-types.gguf", "tiny.safetensors"]
            .into_iter()
            .map(|n| (n, std::fs::read(testdata.join(n)).unwrap()))
            .collect();
    files.push(("writer-built.gguf", writer_built()));
    files
        .into_iter()
        .map(|(name, bytes)| {
            let header_len = Header::parse(&bytes)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .data_offset() as usize;
            Base {
                name,
                bytes,
                header_len,
            }
        })
        .collect()
}

/// Integers worth writing over a length, count, type, dim or offset field.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    8,
    13,
    31,
    32,
    63,
    64,
    255,
    0xFFFF,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    (1 << 61) + 1,
    1 << 62,
    (1 << 62) - 4,
    0x7FFF_FFFF_FFFF_FFC0,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 15,
    u64::MAX - 7,
    u64::MAX,
];

#[derive(Clone, Debug)]
enum Mutation {
    /// Overwrite one byte.
    Set { at: Index, header: bool, byte: u8 },
    /// Flip one bit.
    Flip { at: Index, header: bool, bit: u8 },
    /// Write an interesting integer, little-endian, as 4 or 8 bytes.
    Int {
        at: Index,
        header: bool,
        value: Index,
        wide: bool,
    },
    /// Cut the file.
    Truncate { at: Index },
    /// Insert bytes.
    Insert {
        at: Index,
        header: bool,
        bytes: Vec<u8>,
    },
    /// Delete up to `n` bytes.
    Delete { at: Index, header: bool, n: u8 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // `header` is true 3 times in 4: most mutations hit the header region.
    let header = prop::bool::weighted(0.75);
    prop_oneof![
        3 => (any::<Index>(), header, any::<u8>())
            .prop_map(|(at, header, byte)| Mutation::Set { at, header, byte }),
        3 => (any::<Index>(), header, 0u8..8)
            .prop_map(|(at, header, bit)| Mutation::Flip { at, header, bit }),
        3 => (any::<Index>(), header, any::<Index>(), any::<bool>())
            .prop_map(|(at, header, value, wide)| Mutation::Int { at, header, value, wide }),
        1 => any::<Index>().prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<Index>(), header, prop::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(at, header, bytes)| Mutation::Insert { at, header, bytes }),
        1 => (any::<Index>(), header, 1u8..16)
            .prop_map(|(at, header, n)| Mutation::Delete { at, header, n }),
    ]
}

/// A position in the header region or anywhere in the file.
fn pos(at: &Index, header: bool, header_len: usize, len: usize) -> usize {
    let span = if header { header_len.min(len) } else { len };
    if span == 0 {
        0
    } else {
        at.index(span)
    }
}

fn apply(bytes: &mut Vec<u8>, header_len: usize, m: &Mutation) {
    let len = bytes.len();
    if len == 0 {
        return;
    }
    match m {
        Mutation::Set { at, header, byte } => bytes[pos(at, *header, header_len, len)] = *byte,
        Mutation::Flip { at, header, bit } => {
            bytes[pos(at, *header, header_len, len)] ^= 1 << bit;
        }
        Mutation::Int {
            at,
            header,
            value,
            wide,
        } => {
            let v = INTERESTING[value.index(INTERESTING.len())].to_le_bytes();
            let v = if *wide { &v[..] } else { &v[..4] };
            let p = pos(at, *header, header_len, len).min(len.saturating_sub(v.len()));
            let n = v.len().min(len - p);
            bytes[p..p + n].copy_from_slice(&v[..n]);
        }
        Mutation::Truncate { at } => bytes.truncate(at.index(len)),
        Mutation::Insert {
            at,
            header,
            bytes: b,
        } => {
            let p = pos(at, *header, header_len, len);
            bytes.splice(p..p, b.iter().copied());
        }
        Mutation::Delete { at, header, n } => {
            let p = pos(at, *header, header_len, len);
            let end = (p + *n as usize).min(len);
            bytes.drain(p..end);
        }
    }
}

fn summary(r: &weightmap::Result<Weights>) -> String {
    match r {
        Ok(w) => format!("Ok({} tensors)", w.len()),
        Err(e) => format!("Err({}: {e})", e.name()),
    }
}

/// Load `bytes` both ways and check the two agree: whether they loaded.
fn check(dir: &Path, bytes: &[u8]) -> Result<bool, TestCaseError> {
    let path = dir.join("mutated.bin");
    std::fs::write(&path, bytes).unwrap();
    let opts = LoadOptions::default();
    // SAFETY: the file is private to this test case and not modified while
    // loaded.
    let m = unsafe { Weights::load(&path, &opts) };
    let s = Weights::load_streamed(&path, &opts);
    let loaded = m.is_ok();
    match (&m, &s) {
        (Err(a), Err(b)) => {
            prop_assert_eq!(a.name(), b.name());
            prop_assert_eq!(a.to_string(), b.to_string());
        }
        (Ok(a), Ok(b)) => {
            prop_assert!(a.tensor_infos().eq(b.tensor_infos()));
            for (x, y) in a.tensors().zip(b.tensors()) {
                let (xb, yb) = (x.to_vec().unwrap(), y.to_vec().unwrap());
                let r = x.info().file_range();
                prop_assert!(xb == yb, "tensor '{}' differs between modes", x.name());
                prop_assert!(
                    xb == bytes[r.start as usize..r.end as usize],
                    "tensor '{}' is not the file's bytes at {:?}",
                    x.name(),
                    r
                );
            }
            if let (Some(mm), Some(sm)) = (a.gguf_metadata(), b.gguf_metadata()) {
                // Debug text: an f32 NaN is not equal to itself.
                prop_assert_eq!(
                    format!("{:?}", mm.iter().collect::<Vec<_>>()),
                    format!("{:?}", sm.iter().collect::<Vec<_>>())
                );
            }
            prop_assert_eq!(a.safetensors_metadata(), b.safetensors_metadata());
        }
        _ => prop_assert!(
            false,
            "modes disagree: mapped {}, streamed {}",
            summary(&m),
            summary(&s)
        ),
    }
    Ok(loaded)
}

#[test]
fn unmutated_bases_load_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    for b in bases() {
        check(dir.path(), &b.bytes).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let w = Weights::load_streamed(dir.path().join("mutated.bin"), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", b.name));
        assert!(!w.is_empty(), "{}", b.name);
    }
}

#[test]
fn mutated_files_agree_in_both_modes() {
    let bases = bases();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        // Failures print the minimal mutation list; nothing is written to the tree.
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (any::<Index>(), prop::collection::vec(mutation(), 1..5));
    let (loaded, rejected) = (Cell::new(0u32), Cell::new(0u32));
    let dir = tempfile::tempdir().unwrap();
    let result = runner.run(&strategy, |(which, mutations)| {
        let base = &bases[which.index(bases.len())];
        let mut bytes = base.bytes.clone();
        for m in &mutations {
            apply(&mut bytes, base.header_len, m);
        }
        let ok = check(dir.path(), &bytes)
            .map_err(|e| TestCaseError::fail(format!("{} with {mutations:?}: {e}", base.name)))?;
        let counter = if ok { &loaded } else { &rejected };
        counter.set(counter.get() + 1);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!(
        "mutated files: {} loaded, {} rejected",
        loaded.get(),
        rejected.get()
    );
    // Both outcomes must occur, or the mutations are not testing much.
    assert!(loaded.get() > 0 && rejected.get() > 0);
}
