//! Every header parser over arbitrary bytes: no panic, and every value of a
//! successful parse can be walked (metadata, arrays, strings, tensor ranges).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weightmap::gguf::{GgufHeader, Metadata, Value};
use weightmap::safetensors::SafetensorsHeader;
use weightmap::{Header, Parse, TensorTable};

/// Touch every metadata value: scalars, strings, every array element (by
/// iteration, by index and as typed values).
fn walk_metadata(md: &Metadata<'_>) {
    let mut n = 0usize;
    for (key, value) in md.iter() {
        n += 1;
        // Lookup by key must find the same value (compared as Debug text:
        // an f32 NaN is not equal to itself).
        assert_eq!(
            format!("{:?}", md.get(key)),
            format!("{:?}", Some(value)),
            "lookup of key {key:?}"
        );
        if let Value::Array(a) = value {
            let mut count = 0u64;
            for v in a.iter() {
                std::hint::black_box(v);
                count += 1;
            }
            assert_eq!(count, a.len(), "array {key:?} length");
            if !a.is_empty() {
                assert!(a.get(0).is_some());
                assert!(a.get(a.len() - 1).is_some());
            }
            assert!(a.get(a.len()).is_none());
            if let Ok(strings) = a.strings() {
                for s in strings {
                    std::hint::black_box(s.to_string_lossy());
                }
            }
            let _ = a.values::<u32>().map(|it| it.count());
            let _ = a.values::<f32>().map(|it| it.count());
            let _ = a.values::<bool>().map(|it| it.count());
        }
        let _ = md.get_str(key);
    }
    assert_eq!(n, md.len());
}

fn check_tensors(tensors: &TensorTable, file_len: u64) {
    for t in tensors {
        let r = t.file_range();
        assert!(
            r.start <= r.end && r.end <= file_len,
            "{t:?} outside {file_len}"
        );
        std::hint::black_box((t.n_elements(), t.ne()));
    }
}

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;

    if let Ok(h) = Header::parse(data) {
        check_tensors(h.tensors(), len);
        std::hint::black_box(h.tensor_region());
        if let Some(md) = h.gguf_metadata() {
            walk_metadata(&md);
        }
    }

    if let Ok(g) = GgufHeader::parse(data) {
        walk_metadata(&g.metadata_in(data));
        for t in g.tensors() {
            // Validated at parse: every tensor lies within the bytes.
            assert!(t.file_offset + t.nbytes <= len);
        }
    }

    // The prefix parser with a file longer than, equal to and shorter than the bytes.
    for file_len in [len, len / 2, len + 1, len + 4096, u64::MAX] {
        match GgufHeader::parse_prefix(data, file_len) {
            Ok(Parse::Complete(h)) => {
                check_tensors(h.tensors(), file_len);
                walk_metadata(&h.metadata_in(data));
            }
            Ok(Parse::NeedMore { min_len }) => {
                assert!(min_len > data.len().min(file_len as usize) as u64);
                assert!(min_len <= file_len);
            }
            Err(e) => {
                std::hint::black_box((e.kind(), e.to_string()));
            }
        }
    }

    // Descriptors read through a window give what the whole bytes give.
    let whole = GgufHeader::parse(data);
    let window = 1 + data.first().copied().unwrap_or(0) as usize;
    match (&whole, weightmap::gguf::read_windowed_for_fuzzing(data, window)) {
        (Ok(a), Ok((b, kv))) => {
            assert_eq!(a.tensors(), b.tensors());
            assert_eq!(a.header_len(), b.header_len());
            assert_eq!(a.kv_count(), b.kv_count());
            walk_metadata(&b.metadata_in(&kv));
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("whole {:?} but windowed {:?}", a.is_ok(), b.is_ok()),
    }

    if let Ok(h) = SafetensorsHeader::parse(data) {
        check_tensors(h.tensors(), len);
        std::hint::black_box(h.metadata().len());
    }
});
