//! Dequantization throughput, in bytes of f32 output per second, for Q4_K,
//! Q6_K, Q8_0 and IQ4_XS: 2^20 elements (4 MiB of output) per call, one
//! thread, into a preallocated buffer. The input is random blocks with their
//! f16 scales set to normal values (no subnormal or NaN arithmetic).
//!
//! Run: `cargo bench --bench dequant -- --warm-up-time 1 --measurement-time 3`
//! and, for gguf-py/numpy on the same sizes, `python3 benches/dequant_numpy.py`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use weightmap::quant::dequantize;
use weightmap::TensorType;

/// Elements per call.
const N: usize = 1 << 20;

/// The types benchmarked and the byte offsets of each block's f16 scales.
const CASES: &[(TensorType, &[usize])] = &[
    (TensorType::Q4_K, &[0, 2]),
    (TensorType::Q6_K, &[208]),
    (TensorType::Q8_0, &[0]),
    (TensorType::IQ4_XS, &[0]),
];

/// Random blocks (xorshift64, fixed seed) with normal f16 scales.
fn blocks(ty: TensorType, scales: &[usize]) -> Vec<u8> {
    let block_bytes = ty.type_size() as usize;
    let n_blocks = N / ty.block_size() as usize;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut bytes: Vec<u8> = (0..n_blocks * block_bytes).map(|_| next() as u8).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &off in scales {
            // Exponent 8..=23 (2^-7 .. 2^8), random sign and mantissa.
            let r = next();
            let h = ((r as u16) & 0x83FF) | ((8 + (r >> 16) as u16 % 16) << 10);
            block[off..off + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    bytes
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("dequantize");
    group.throughput(Throughput::BytesDecimal((N * 4) as u64));
    let mut out = vec![0f32; N];
    for &(ty, scales) in CASES {
        let bytes = blocks(ty, scales);
        group.bench_function(ty.name(), |b| {
            b.iter(|| dequantize(ty, black_box(&bytes), black_box(&mut out)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
