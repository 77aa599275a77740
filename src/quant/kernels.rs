//! One function per block type: a block in, its weights out.
//!
//! Each follows ggml's reference `dequantize_row_*` (ggml-org/ggml
//! `src/ggml-quants.c`, commit d99724f2b141) operation for operation: the same
//! integer decoding, the same float operations in the same order (Rust never
//! fuses a multiply and an add), so the results are bit-identical. The loops
//! are written over fixed-size arrays so the compiler can drop bounds checks
//! and vectorize them.

use super::blocks::*;
use super::grids::*;
use super::scalar::{e8m0_half, fp16, fp16_field, ue4m3_half};

/// The two halves of a 32-weight output.
#[inline(always)]
fn halves<const N: usize>(y: &mut [f32; N]) -> (&mut [f32], &mut [f32]) {
    y.split_at_mut(N / 2)
}

/// Split `y` into `K`-element groups as arrays.
#[inline(always)]
fn groups<const K: usize>(y: &mut [f32]) -> impl Iterator<Item = &mut [f32; K]> {
    y.chunks_exact_mut(K)
        .map(|c| <&mut [f32; K]>::try_from(c).expect("chunks_exact_mut yields K elements"))
}

pub(crate) fn q1_0(b: &BlockQ1_0, y: &mut [f32; 128]) {
    let d = fp16_field(b.d);
    let neg_d = -d;
    for (j, y) in y.iter_mut().enumerate() {
        let bit = (b.qs[j / 8] >> (j % 8)) & 1;
        *y = if bit != 0 { d } else { neg_d };
    }
}

pub(crate) fn q2_0(b: &BlockQ2_0, y: &mut [f32; 64]) {
    let d = fp16_field(b.d);
    for (j, y) in y.iter_mut().enumerate() {
        let q = (b.qs[j / 4] >> ((j % 4) * 2)) & 3;
        *y = (i32::from(q) - 1) as f32 * d;
    }
}

pub(crate) fn q4_0(b: &BlockQ4_0, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    let (lo, hi) = halves(y);
    for ((q, lo), hi) in b.qs.iter().zip(lo).zip(hi) {
        *lo = (i32::from(q & 0x0F) - 8) as f32 * d;
        *hi = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

pub(crate) fn q4_1(b: &BlockQ4_1, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    let m = fp16_field(b.m);
    let (lo, hi) = halves(y);
    for ((q, lo), hi) in b.qs.iter().zip(lo).zip(hi) {
        *lo = f32::from(q & 0x0F) * d + m;
        *hi = f32::from(q >> 4) * d + m;
    }
}

pub(crate) fn q5_0(b: &BlockQ5_0, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = halves(y);
    for (j, ((q, lo), hi)) in b.qs.iter().zip(lo).zip(hi).enumerate() {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        *lo = (i32::from((q & 0x0F) | xh_0) - 16) as f32 * d;
        *hi = (i32::from((q >> 4) | xh_1) - 16) as f32 * d;
    }
}

pub(crate) fn q5_1(b: &BlockQ5_1, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    let m = fp16_field(b.m);
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = halves(y);
    for (j, ((q, lo), hi)) in b.qs.iter().zip(lo).zip(hi).enumerate() {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        *lo = f32::from((q & 0x0F) | xh_0) * d + m;
        *hi = f32::from((q >> 4) | xh_1) * d + m;
    }
}

pub(crate) fn q8_0(b: &BlockQ8_0, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    for (q, y) in b.qs.iter().zip(y) {
        *y = f32::from(*q) * d;
    }
}

pub(crate) fn mxfp4(b: &BlockMXFP4, y: &mut [f32; 32]) {
    let d = e8m0_half(b.e);
    let (lo, hi) = halves(y);
    for ((q, lo), hi) in b.qs.iter().zip(lo).zip(hi) {
        *lo = f32::from(KVALUES_FP4[usize::from(q & 0x0F)]) * d;
        *hi = f32::from(KVALUES_FP4[usize::from(q >> 4)]) * d;
    }
}

pub(crate) fn nvfp4(b: &BlockNVFP4, y: &mut [f32; 64]) {
    for ((s, qs), y) in b.d.iter().zip(b.qs.chunks_exact(8)).zip(groups::<16>(y)) {
        let d = ue4m3_half(*s);
        let (lo, hi) = halves(y);
        for ((q, lo), hi) in qs.iter().zip(lo).zip(hi) {
            *lo = f32::from(KVALUES_FP4[usize::from(q & 0x0F)]) * d;
            *hi = f32::from(KVALUES_FP4[usize::from(q >> 4)]) * d;
        }
    }
}

pub(crate) fn q2_k(b: &BlockQ2K, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let min = fp16_field(b.dmin);
    // Two halves of 128 weights, each over 32 bytes of `qs`; within a half,
    // four 2-bit planes, each of two 16-weight groups with their own scale.
    for (n, (q, y)) in b.qs.chunks_exact(32).zip(groups::<128>(y)).enumerate() {
        for (j, y) in groups::<32>(y).enumerate() {
            let shift = 2 * j;
            for (g, y) in groups::<16>(y).enumerate() {
                let sc = b.scales[8 * n + 2 * j + g];
                let dl = d * f32::from(sc & 0xF);
                let ml = min * f32::from(sc >> 4);
                for (q, y) in q[16 * g..16 * g + 16].iter().zip(y) {
                    *y = dl * f32::from((q >> shift) & 3) - ml;
                }
            }
        }
    }
}

pub(crate) fn q3_k(b: &BlockQ3K, y: &mut [f32; 256]) {
    let d_all = fp16_field(b.d);
    // Unpack the sixteen 6-bit scales as ggml does: four u32 words, the
    // third holding the high bits of all sixteen.
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word = |i: usize| {
        u32::from_le_bytes([
            b.scales[4 * i],
            b.scales[4 * i + 1],
            b.scales[4 * i + 2],
            b.scales[4 * i + 3],
        ])
    };
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut scales = [0i8; 16];
    for (s, w) in scales.chunks_exact_mut(4).zip(aux) {
        for (s, byte) in s.iter_mut().zip(w.to_le_bytes()) {
            *s = byte as i8;
        }
    }

    for (n, (q, y)) in b.qs.chunks_exact(32).zip(groups::<128>(y)).enumerate() {
        for (j, y) in groups::<32>(y).enumerate() {
            let shift = 2 * j;
            let m = 1u8 << (4 * n + j);
            for (g, y) in groups::<16>(y).enumerate() {
                let dl = d_all * f32::from(i16::from(scales[8 * n + 2 * j + g]) - 32);
                let q = &q[16 * g..16 * g + 16];
                let hm = &b.hmask[16 * g..16 * g + 16];
                for ((q, h), y) in q.iter().zip(hm).zip(y) {
                    let low = ((q >> shift) & 3) as i8;
                    let high = if h & m != 0 { 0 } else { 4 };
                    *y = dl * f32::from(low - high);
                }
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: scale and min `j` (0..8) of a Q4_K/Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(crate) fn q4_k(b: &BlockQ4K, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let min = fp16_field(b.dmin);
    for (i, (q, y)) in b.qs.chunks_exact(32).zip(groups::<64>(y)).enumerate() {
        let (sc, m) = scale_min_k4(2 * i, &b.scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * i + 1, &b.scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let (lo, hi) = halves(y);
        for ((q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = d1 * f32::from(q & 0xF) - m1;
            *hi = d2 * f32::from(q >> 4) - m2;
        }
    }
}

pub(crate) fn q5_k(b: &BlockQ5K, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let min = fp16_field(b.dmin);
    for (i, (ql, y)) in b.qs.chunks_exact(32).zip(groups::<64>(y)).enumerate() {
        let (sc, m) = scale_min_k4(2 * i, &b.scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * i + 1, &b.scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
        let (lo, hi) = halves(y);
        for (((ql, qh), lo), hi) in ql.iter().zip(&b.qh).zip(lo).zip(hi) {
            let h1 = if qh & u1 != 0 { 16 } else { 0 };
            let h2 = if qh & u2 != 0 { 16 } else { 0 };
            *lo = d1 * f32::from((ql & 0xF) + h1) - m1;
            *hi = d2 * f32::from((ql >> 4) + h2) - m2;
        }
    }
}

pub(crate) fn q6_k(b: &BlockQ6K, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    for (n, y) in groups::<128>(y).enumerate() {
        let ql = &b.ql[64 * n..64 * n + 64];
        let qh = &b.qh[32 * n..32 * n + 32];
        let sc = &b.scales[8 * n..8 * n + 8];
        let (y01, y23) = y.split_at_mut(64);
        let (y0, y1) = y01.split_at_mut(32);
        let (y2, y3) = y23.split_at_mut(32);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            y0[l] = d * f32::from(sc[is]) * f32::from(q1);
            y1[l] = d * f32::from(sc[is + 2]) * f32::from(q2);
            y2[l] = d * f32::from(sc[is + 4]) * f32::from(q3);
            y3[l] = d * f32::from(sc[is + 6]) * f32::from(q4);
        }
    }
}

pub(crate) fn q8_k(b: &BlockQ8K, y: &mut [f32; 256]) {
    let d = f32::from_bits(u32::from_le(b.d.to_bits()));
    for (q, y) in b.qs.iter().zip(y) {
        *y = d * f32::from(*q);
    }
}

pub(crate) fn tq1_0(b: &BlockTQ1_0, y: &mut [f32; 256]) {
    const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];
    let d = fp16_field(b.d);
    // Each byte holds five base-3 digits, read most significant first by
    // multiplying the fixed-point fraction by 3^n (mod 256) and taking the
    // integer part of ×3.
    let trit = |byte: u8, n: usize| -> f32 {
        let q = byte.wrapping_mul(POW3[n]);
        let xi = ((u16::from(q) * 3) >> 8) as i16;
        f32::from(xi - 1) * d
    };
    let (y_main, y_qh) = y.split_at_mut(240);
    let (y32, y16) = y_main.split_at_mut(160);
    for (n, y) in y32.chunks_exact_mut(32).enumerate() {
        for (q, y) in b.qs[..32].iter().zip(y) {
            *y = trit(*q, n);
        }
    }
    for (n, y) in y16.chunks_exact_mut(16).enumerate() {
        for (q, y) in b.qs[32..].iter().zip(y) {
            *y = trit(*q, n);
        }
    }
    for (n, y) in y_qh.chunks_exact_mut(4).enumerate() {
        for (q, y) in b.qh.iter().zip(y) {
            *y = trit(*q, n);
        }
    }
}

pub(crate) fn tq2_0(b: &BlockTQ2_0, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    for (q, y) in b.qs.chunks_exact(32).zip(groups::<128>(y)) {
        for (l, y) in groups::<32>(y).enumerate() {
            for (q, y) in q.iter().zip(y) {
                let q = ((q >> (2 * l)) & 3) as i8;
                *y = f32::from(q - 1) * d;
            }
        }
    }
}

/// `v * grid * (±1)`: ggml multiplies by -1.0 or 1.0 rather than negating.
#[inline(always)]
fn signed(v: f32, signs: u8, j: usize) -> f32 {
    v * if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

pub(crate) fn iq2_xxs(b: &BlockIQ2XXS, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    for (qs, y) in b.qs.chunks_exact(4).zip(groups::<32>(y)) {
        let lo = u32::from(u16::from_le(qs[0])) | (u32::from(u16::from_le(qs[1])) << 16);
        let hi = u32::from(u16::from_le(qs[2])) | (u32::from(u16::from_le(qs[3])) << 16);
        let db = d * (0.5 + (hi >> 28) as f32) * 0.25;
        for (l, y) in groups::<8>(y).enumerate() {
            let grid = IQ2XXS_GRID[((lo >> (8 * l)) & 0xFF) as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((hi >> (7 * l)) & 127) as usize];
            for (j, y) in y.iter_mut().enumerate() {
                *y = signed(db * f32::from(grid[j]), signs, j);
            }
        }
    }
}

pub(crate) fn iq2_xs(b: &BlockIQ2XS, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    for ((qs, sc), y) in b.qs.chunks_exact(4).zip(b.scales).zip(groups::<32>(y)) {
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        for (l, y) in groups::<8>(y).enumerate() {
            let q = u16::from_le(qs[l]);
            let grid = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
            let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
            for (j, y) in y.iter_mut().enumerate() {
                *y = signed(db[l / 2] * f32::from(grid[j]), signs, j);
            }
        }
    }
}

pub(crate) fn iq2_s(b: &BlockIQ2S, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let (qs, signs) = b.qs.split_at(32);
    for (ib32, y) in groups::<32>(y).enumerate() {
        let sc = b.scales[ib32];
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        let qh = u32::from(b.qh[ib32]);
        for (l, y) in groups::<8>(y).enumerate() {
            let dl = db[l / 2];
            let index = u32::from(qs[4 * ib32 + l]) | ((qh << (8 - 2 * l)) & 0x300);
            let grid = IQ2S_GRID[index as usize].to_le_bytes();
            let s = signs[4 * ib32 + l];
            for (j, y) in y.iter_mut().enumerate() {
                *y = signed(dl * f32::from(grid[j]), s, j);
            }
        }
    }
}

pub(crate) fn iq3_xxs(b: &BlockIQ3XXS, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let (qs, scales_and_signs) = b.qs.split_at(64);
    for ((qs, ss), y) in qs
        .chunks_exact(8)
        .zip(scales_and_signs.chunks_exact(4))
        .zip(groups::<32>(y))
    {
        let aux32 = u32::from_le_bytes([ss[0], ss[1], ss[2], ss[3]]);
        let db = d * (0.5 + (aux32 >> 28) as f32) * 0.5;
        for (l, y) in groups::<8>(y).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux32 >> (7 * l)) & 127) as usize];
            let grid1 = IQ3XXS_GRID[usize::from(qs[2 * l])].to_le_bytes();
            let grid2 = IQ3XXS_GRID[usize::from(qs[2 * l + 1])].to_le_bytes();
            for j in 0..4 {
                y[j] = signed(db * f32::from(grid1[j]), signs, j);
                y[j + 4] = signed(db * f32::from(grid2[j]), signs, j + 4);
            }
        }
    }
}

pub(crate) fn iq3_s(b: &BlockIQ3S, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    // Groups of 32 weights: 8 bytes of qs, 4 of signs, one qh byte each;
    // a scale byte holds the scales of two consecutive groups.
    for (ib32, y) in groups::<32>(y).enumerate() {
        let sc = b.scales[ib32 / 2];
        let nibble = if ib32 % 2 == 0 { sc & 0xf } else { sc >> 4 };
        let db = d * f32::from(1 + 2 * u16::from(nibble));
        let qs = &b.qs[8 * ib32..8 * ib32 + 8];
        let signs = &b.signs[4 * ib32..4 * ib32 + 4];
        let qh = u32::from(b.qh[ib32]);
        for (l, y) in groups::<8>(y).enumerate() {
            let i1 = u32::from(qs[2 * l]) | ((qh << (8 - 2 * l)) & 256);
            let i2 = u32::from(qs[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
            let grid1 = IQ3S_GRID[i1 as usize].to_le_bytes();
            let grid2 = IQ3S_GRID[i2 as usize].to_le_bytes();
            for j in 0..4 {
                y[j] = signed(db * f32::from(grid1[j]), signs[l], j);
                y[j + 4] = signed(db * f32::from(grid2[j]), signs[l], j + 4);
            }
        }
    }
}

/// ggml's `IQ1S_DELTA` (and `IQ1M_DELTA`, the same value).
const IQ1S_DELTA: f32 = 0.125;

pub(crate) fn iq1_s(b: &BlockIQ1S, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    for ((qs, qh), y) in b.qs.chunks_exact(4).zip(b.qh).zip(groups::<32>(y)) {
        let qh = u16::from_le(qh);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for (l, y) in groups::<8>(y).enumerate() {
            let index = usize::from(qs[l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            let grid = IQ1S_GRID[index].to_le_bytes();
            for (g, y) in grid.iter().zip(y) {
                *y = dl * (f32::from(*g as i8) + delta);
            }
        }
    }
}

pub(crate) fn iq1_m(b: &BlockIQ1M, y: &mut [f32; 256]) {
    let sc: [u16; 4] =
        std::array::from_fn(|i| u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]]));
    let scale =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = fp16(scale);
    for (ib, ((qs, qh), y)) in
        b.qs.chunks_exact(4)
            .zip(b.qh.chunks_exact(2))
            .zip(groups::<32>(y))
            .enumerate()
    {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl1 = d * f32::from(2 * (s & 0x7) + 1);
        let dl2 = d * f32::from(2 * ((s >> 3) & 0x7) + 1);
        let (h0, h1) = (u16::from(qh[0]), u16::from(qh[1]));
        let idx = [
            u16::from(qs[0]) | ((h0 << 8) & 0x700),
            u16::from(qs[1]) | ((h0 << 4) & 0x700),
            u16::from(qs[2]) | ((h1 << 8) & 0x700),
            u16::from(qs[3]) | ((h1 << 4) & 0x700),
        ];
        let delta = |bit: bool| if bit { -IQ1S_DELTA } else { IQ1S_DELTA };
        let deltas = [
            delta(h0 & 0x08 != 0),
            delta(h0 & 0x80 != 0),
            delta(h1 & 0x08 != 0),
            delta(h1 & 0x80 != 0),
        ];
        for (l, y) in groups::<8>(y).enumerate() {
            let dl = if l < 2 { dl1 } else { dl2 };
            let grid = IQ1S_GRID[usize::from(idx[l])].to_le_bytes();
            for (g, y) in grid.iter().zip(y) {
                *y = dl * (f32::from(*g as i8) + deltas[l]);
            }
        }
    }
}

pub(crate) fn iq4_nl(b: &BlockIQ4NL, y: &mut [f32; 32]) {
    let d = fp16_field(b.d);
    let (lo, hi) = halves(y);
    for ((q, lo), hi) in b.qs.iter().zip(lo).zip(hi) {
        *lo = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
        *hi = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

pub(crate) fn iq4_xs(b: &BlockIQ4XS, y: &mut [f32; 256]) {
    let d = fp16_field(b.d);
    let scales_h = u16::from_le(b.scales_h);
    for (ib, (qs, y)) in b.qs.chunks_exact(16).zip(groups::<32>(y)).enumerate() {
        let ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf)
            | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
        let dl = d * f32::from(i16::from(ls) - 32);
        let (lo, hi) = halves(y);
        for ((q, lo), hi) in qs.iter().zip(lo).zip(hi) {
            *lo = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
            *hi = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}
