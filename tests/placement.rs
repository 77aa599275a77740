//! Placement per tensor: hybrid placement (map what can be mapped, copy
//! only what must be), routing to buffer types, `buffer_from_host_ptr`, and
//! the checks placement makes.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::pattern;
use weightmap::buffer::{Buffer, BufferType, CpuBufferType, SimDeviceBufferType};
use weightmap::gguf::Writer;
use weightmap::{
    CopyReason, Error, LoadMode, LoadOptions, PlacementKind, Prefetch, TensorInfo, TensorType,
    Weights,
};

fn load(path: &Path, opts: &LoadOptions) -> weightmap::Result<Weights> {
    // SAFETY: the tests' files are not modified while loaded.
    unsafe { Weights::load(path, opts) }
}

fn bytes_of(w: &Weights) -> Vec<(String, Vec<u8>)> {
    w.tensors()
        .map(|t| (t.name().to_owned(), t.to_vec().unwrap()))
        .collect()
}

/// A llama-shaped GGUF: token_embd, `layers` layers of two tensors, output.
fn layered(dir: &Path, layers: usize) -> PathBuf {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let mut i = 0;
    let mut t = |w: &mut Writer, name: String| {
        w.tensor(&name, TensorType::F32, &[64, 4], pattern(i, 64 * 4 * 4));
        i += 1;
    };
    t(&mut w, "token_embd.weight".into());
    for l in 0..layers {
        t(&mut w, format!("blk.{l}.attn_q.weight"));
        t(&mut w, format!("blk.{l}.ffn_up.weight"));
    }
    t(&mut w, "output.weight".into());
    let path = dir.join("layered.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// A safetensors file whose offsets suit neither 32 bytes nor, for `f`,
/// its element size: `u` (one U8) then `f` (four F32) at data offset 1,
/// then `g` (four F32) at data offset 17.
fn odd_safetensors(dir: &Path) -> PathBuf {
    let json = r#"{"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[4],"data_offsets":[1,17]},"g":{"dtype":"F32","shape":[4],"data_offsets":[17,33]}}"#;
    // Pad the JSON so the data starts 8-aligned, as the reference writer does.
    let mut header = json.as_bytes().to_vec();
    while (8 + header.len()) % 8 != 0 {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend((0..33u8).map(|b| b.wrapping_mul(7) | 1));
    let path = dir.join("odd.safetensors");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn odd_offset_safetensors_copy_only_the_tensors_views_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    let path = odd_safetensors(dir.path());
    let w = load(&path, &LoadOptions::default()).unwrap();
    let r = w.report();
    assert_eq!(r.mode_used, LoadMode::Mmap);
    assert!(r.fallback.is_none());
    let copied: Vec<&str> = r.copied.iter().map(|c| c.name.as_str()).collect();
    // `u` (a byte) maps anywhere; `f` sits at an odd address; `g`, at data
    // offset 17, too.
    assert_eq!(copied, ["f", "g"]);
    assert!(matches!(
        r.copied[0].reason,
        CopyReason::Misaligned { alignment: 4, .. }
    ));
    assert_eq!(
        w.tensor("u").unwrap().placement_kind(),
        PlacementKind::Mapped
    );
    assert_eq!(w.tensor("f").unwrap().view::<f32>().unwrap().len(), 4);
    let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&w), bytes_of(&s));
    // Every buffer's alignment is true of every tensor in it.
    for t in w.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        assert_eq!(addr % t.buffer().alignment(), 0, "{}", t.name());
    }
    assert_eq!(r.buffers.len(), 2);
    assert_eq!((r.buffers[0].mapped, r.buffers[0].tensors), (true, 1));
    assert_eq!((r.buffers[1].mapped, r.buffers[1].tensors), (false, 2));
    assert_eq!(r.bytes_copied, 32);
}

fn layer_of(t: &TensorInfo) -> Option<usize> {
    t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

#[test]
fn routing_sends_chosen_layers_to_a_device_and_maps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = layered(dir.path(), 4);
    let dev: Arc<dyn BufferType> = Arc::new(SimDeviceBufferType::new(256, usize::MAX).unwrap());
    let d = Arc::clone(&dev);
    let opts = LoadOptions::default()
        .prefetch(Prefetch::None)
        .staging_bytes(100)
        .route(move |t| layer_of(t).filter(|&l| l < 2).map(|_| Arc::clone(&d)));
    let w = load(&path, &opts).unwrap();
    let r = w.report();
    assert_eq!(r.mode_used, LoadMode::Mmap);
    assert_eq!(r.tensors_copied, 4);
    assert_eq!(r.tensors_mapped, 6);
    for c in &r.copied {
        assert!(
            c.name.starts_with("blk.0.") || c.name.starts_with("blk.1."),
            "{}",
            c.name
        );
        assert_eq!(
            c.reason,
            CopyReason::Routed {
                buffer_type: "SimDevice".into()
            }
        );
    }
    // One buffer per type: the mapping's and the device's.
    assert_eq!(w.buffers().count(), 2);
    let kinds: Vec<(&str, bool, usize)> = r
        .buffers
        .iter()
        .map(|b| (b.buffer_type.as_str(), b.mapped, b.tensors))
        .collect();
    assert_eq!(kinds, [("CPU_Mapped", true, 6), ("SimDevice", false, 4)]);
    for t in w.tensors() {
        let on_device = layer_of(&t.info()).is_some_and(|l| l < 2);
        assert_eq!(!t.buffer().is_host(), on_device, "{}", t.name());
        assert_eq!(t.host_bytes().is_none(), on_device);
        if on_device {
            assert_eq!(t.placement().offset % 256, 0);
        }
    }
    let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&w), bytes_of(&s));

    // The stream path routes the same way.
    let ws = Weights::load_streamed(&path, &opts).unwrap();
    assert_eq!(ws.buffers().count(), 2);
    assert_eq!(bytes_of(&ws), bytes_of(&s));
    assert!(ws
        .tensor("blk.1.ffn_up.weight")
        .unwrap()
        .host_bytes()
        .is_none());
}

#[test]
fn a_device_that_wraps_host_memory_receives_the_mapped_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = layered(dir.path(), 2);
    let dev: Arc<dyn BufferType> = Arc::new(
        SimDeviceBufferType::new(32, usize::MAX)
            .unwrap()
            .with_host_ptr(true),
    );
    let d = Arc::clone(&dev);
    let opts = LoadOptions::default()
        .prefetch(Prefetch::None)
        .route(move |t| layer_of(t).map(|_| Arc::clone(&d)));
    let w = load(&path, &opts).unwrap();
    let r = w.report();
    // Nothing copied: the device buffer views the mapping.
    assert_eq!(r.tensors_copied, 0);
    assert_eq!(r.bytes_copied, 0);
    let kinds: Vec<(&str, bool, usize)> = r
        .buffers
        .iter()
        .map(|b| (b.buffer_type.as_str(), b.mapped, b.tensors))
        .collect();
    assert_eq!(kinds, [("CPU_Mapped", true, 2), ("SimDevice", true, 4)]);
    let base = w.mapped().unwrap().file_bytes().as_ptr() as usize;
    for t in w.tensors() {
        if layer_of(&t.info()).is_some() {
            let b = t.buffer();
            assert!(!b.is_host() && !b.owns_memory());
            // Its device address is the tensor's address in the mapping.
            assert_eq!(
                b.base_addr() + t.placement().offset - base,
                t.info().file_offset as usize
            );
        }
    }
    let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&w), bytes_of(&s));

    // As the default type, a host-wrapping device maps everything; one that
    // cannot wrap host memory falls back.
    let w = load(&path, &LoadOptions::default().buffer_type(Arc::clone(&dev))).unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Mmap);
    assert_eq!(w.report().tensors_copied, 0);
    let plain: Arc<dyn BufferType> = Arc::new(SimDeviceBufferType::new(32, usize::MAX).unwrap());
    let w = load(&path, &LoadOptions::default().buffer_type(plain)).unwrap();
    assert_eq!(
        w.report().fallback.as_ref().map(|f| f.name()),
        Some("not_host")
    );
    assert_eq!(bytes_of(&w), bytes_of(&s));
}

/// A CPU type whose `alloc_size` is short of the tensor: placement must
/// refuse it rather than lay tensors over each other.
#[derive(Debug)]
struct Stingy;

impl BufferType for Stingy {
    fn name(&self) -> &str {
        "Stingy"
    }
    fn alignment(&self) -> usize {
        32
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc_buffer(&self, size: usize) -> weightmap::Result<Box<dyn Buffer>> {
        CpuBufferType::new().alloc_buffer(size)
    }
    fn alloc_size(&self, t: &TensorInfo) -> usize {
        (t.nbytes / 2) as usize
    }
}

#[test]
fn an_alloc_size_below_the_tensor_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = layered(dir.path(), 1);
    let err = Weights::load_streamed(&path, &LoadOptions::default().buffer_type(Arc::new(Stingy)))
        .unwrap_err();
    match err {
        Error::AllocSizeTooSmall {
            buffer_type,
            tensor,
            alloc_size,
            nbytes,
        } => {
            assert_eq!(buffer_type, "Stingy");
            assert_eq!(tensor, "token_embd.weight");
            assert_eq!(alloc_size as u64 * 2, nbytes);
        }
        other => panic!("{other:?}"),
    }
}
