//! What a runtime does right after the load: rows, dequantization from a
//! handle, owned `'static` tensors, scopes and per-layer grouping.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weightmap::gguf::Writer;
use weightmap::{quant, Error, LoadOptions, Tensor, TensorType, Weights};

/// Q8_0 embedding 64 × 5 rows, two layers with an f32 norm and an f16
/// matrix each, and an output.
fn model(dir: &Path) -> PathBuf {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    // Q8_0 blocks with a finite f16 scale (1.0 = 0x3C00) and varied quants.
    let mut embd = Vec::new();
    for b in 0..10u8 {
        embd.extend_from_slice(&[0x00, 0x3C]);
        embd.extend((0..32u8).map(|j| j.wrapping_mul(3).wrapping_add(b)));
    }
    w.tensor("token_embd.weight", TensorType::Q8_0, &[64, 5], embd);
    for l in 0..2 {
        let norm: Vec<u8> = (0..64)
            .flat_map(|i| (i as f32 + l as f32).to_le_bytes())
            .collect();
        w.tensor(
            &format!("blk.{l}.attn_norm.weight"),
            TensorType::F32,
            &[64],
            norm,
        );
        let m: Vec<u8> = (0..64 * 3)
            .flat_map(|i| half::f16::from_f32(i as f32 / 8.0).to_le_bytes())
            .collect();
        w.tensor(
            &format!("blk.{l}.attn_q.weight"),
            TensorType::F16,
            &[64, 3],
            m,
        );
    }
    w.tensor("output.weight", TensorType::F32, &[4], vec![0; 16]);
    let path = dir.join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

fn load(path: &Path) -> Weights {
    // SAFETY: the test's file is not modified while loaded.
    unsafe { Weights::load(path, &LoadOptions::default()) }.unwrap()
}

#[test]
fn rows_are_zero_copy_slices_and_dequantize_like_the_whole_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let w = load(&model(dir.path()));
    let e = w.tensor("token_embd.weight").unwrap();
    assert_eq!((e.n_rows(), e.row_len(), e.row_bytes()), (5, 64, 68));
    let all = e.host_bytes().unwrap();
    let row3 = e.row(3).unwrap();
    assert_eq!(row3, &all[3 * 68..4 * 68]);
    assert_eq!(row3.as_ptr(), all[3 * 68..].as_ptr(), "zero-copy");
    assert_eq!(e.rows().unwrap().count(), 5);
    let whole = e.to_f32_vec().unwrap();
    assert_eq!(
        whole,
        quant::dequantize_to_vec(TensorType::Q8_0, all).unwrap()
    );
    let mut r = vec![0f32; 64];
    e.row_f32(3, &mut r).unwrap();
    assert_eq!(r, whole[3 * 64..4 * 64]);
    let mut two = vec![0f32; 128];
    e.rows_f32(1..3, &mut two).unwrap();
    assert_eq!(two, whole[64..192]);
    let mut out = vec![0f32; 320];
    e.dequantize_into(&mut out).unwrap();
    assert_eq!(out, whole);
    let blocks: &[weightmap::quant::BlockQ8_0] = e.row_as(4).unwrap();
    assert_eq!(blocks.len(), 2);
    // Out of range, typed.
    assert!(matches!(
        e.row(5),
        Err(Error::RowOutOfRange {
            row: 6,
            rows: 5,
            ..
        })
    ));
    assert!(matches!(
        e.rows_f32(4..9, &mut out),
        Err(Error::RowOutOfRange {
            row: 9,
            rows: 5,
            ..
        })
    ));
    // A vector is one row.
    let n = w.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!((n.n_rows(), n.row_len()), (1, 64));
    assert_eq!(n.row_as::<f32>(0).unwrap()[5], 5.0);
}

#[test]
fn owned_tensors_keep_shared_weights_alive() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Weights>();
    send_sync::<Tensor>();

    struct Layer {
        q: Tensor,
    }
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let weights = Arc::new(load(&path));
    let expect = weights
        .tensor("blk.1.attn_q.weight")
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let layers: Vec<Layer> = weights
        .blocks()
        .iter()
        .map(|(_, b)| Layer {
            q: Tensor::new(&weights, b.tensor("attn_q.weight").unwrap().name()).unwrap(),
        })
        .collect();
    let weak = Arc::downgrade(&weights);
    drop(weights);
    assert!(weak.upgrade().is_some(), "the tensors hold the weights");
    let q = &layers[1].q;
    assert_eq!(q.name(), "blk.1.attn_q.weight");
    assert_eq!(q.to_f32_vec().unwrap(), expect);
    assert_eq!(q.view::<half::f16>().unwrap().len(), 64 * 3);
    let mut row = vec![0f32; 64];
    q.row_f32(2, &mut row).unwrap();
    assert_eq!(row, expect[128..]);
    // Moved to another thread, it still reads.
    let q2 = q.clone();
    let n = std::thread::spawn(move || q2.to_vec().unwrap().len())
        .join()
        .unwrap();
    assert_eq!(n, 64 * 3 * 2);
    drop(layers);
    assert!(
        weak.upgrade().is_none(),
        "the last tensor freed the weights"
    );
    assert!(matches!(
        Tensor::new(&Arc::new(load(&path)), "nope"),
        Err(Error::TensorNotFound { .. })
    ));
}

#[test]
fn scopes_narrow_lookups_and_check_shape_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let w = load(&model(dir.path()));
    let blocks = w.blocks();
    assert_eq!(blocks.iter().map(|b| b.0).collect::<Vec<_>>(), [0, 1]);
    let b1 = &blocks[1].1;
    assert_eq!(b1.prefix(), "blk.1.");
    assert_eq!(b1.tensors().count(), 2);
    let q = b1
        .tensor_checked(
            "attn_q.weight",
            &[64, 3],
            &[TensorType::F16, TensorType::Q8_0],
        )
        .unwrap();
    assert_eq!(q.name(), "blk.1.attn_q.weight");
    assert!(b1.opt_tensor("ffn_up.weight").is_none());
    match b1.tensor("ffn_up.weight") {
        Err(Error::TensorNotFound { name }) => assert_eq!(name, "blk.1.ffn_up.weight"),
        other => panic!("{other:?}"),
    }
    match b1.tensor_checked("attn_q.weight", &[3, 64], &[]) {
        Err(Error::ShapeMismatch {
            tensor,
            expected,
            found,
        }) => {
            assert_eq!(tensor, "blk.1.attn_q.weight");
            assert_eq!((expected, found), (vec![3, 64], vec![64, 3]));
        }
        other => panic!("{other:?}"),
    }
    let e = w
        .tensor_checked("token_embd.weight", &[64, 5], &[TensorType::F32])
        .unwrap_err();
    assert!(
        matches!(&e, Error::TypeMismatch { found: "q8_0", expected, .. } if expected == &["f32"]),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "tensor 'token_embd.weight' is q8_0, expected one of [\"f32\"]"
    );
}
