//! Arbitrary bytes written to a file and loaded in both modes: no panic; both
//! fail with the same error, or both succeed with the same tensors whose bytes
//! are the file's bytes at each tensor's offset.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use weightmap::{LoadOptions, TensorType, Weights};

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(data).expect("write");
    f.flush().expect("flush");
    let path = f.path();
    let opts = LoadOptions::default();
    // SAFETY: the temp file is private to this process and not modified
    // while `mapped` lives.
    let mapped = unsafe { Weights::load(path, &opts) };
    let streamed = Weights::load_streamed(path, &opts);
    match (mapped, streamed) {
        (Ok(m), Ok(s)) => {
            assert_eq!(m.len(), s.len());
            for (a, b) in m.tensors().zip(s.tensors()) {
                assert_eq!(a.name(), b.name());
                assert_eq!(a.info(), b.info());
                let (ab, bb) = (a.to_vec().expect("mapped"), b.to_vec().expect("streamed"));
                assert!(ab == bb, "tensor '{}' differs between modes", a.name());
                // Typed views work in both modes (both place tensors aligned
                // for their element type), empty tensors included.
                if a.info().ty == TensorType::F32 {
                    let (va, vb) = (a.view::<f32>(), b.view::<f32>());
                    assert!(
                        va.is_ok() && vb.is_ok(),
                        "f32 view of '{}': mapped {:?}, streamed {:?}",
                        a.name(),
                        va.map(<[f32]>::len),
                        vb.map(<[f32]>::len)
                    );
                }
                let r = a.info().file_range();
                assert!(
                    ab == data[r.start as usize..r.end as usize],
                    "tensor '{}' is not the file's bytes",
                    a.name()
                );
            }
            if let (Some(mm), Some(sm)) = (m.gguf_metadata(), s.gguf_metadata()) {
                assert_eq!(mm.len(), sm.len());
                for ((ka, va), (kb, vb)) in mm.iter().zip(sm.iter()) {
                    assert_eq!(ka, kb);
                    // As Debug text: an f32 NaN is not equal to itself.
                    assert_eq!(format!("{va:?}"), format!("{vb:?}"));
                }
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.name(), b.name(), "{a} / {b}");
            assert_eq!(a.to_string(), b.to_string());
        }
        (m, s) => panic!(
            "modes disagree: mapped {:?}, streamed {:?}",
            m.map(|w| w.len()),
            s.map(|w| w.len())
        ),
    }
});
