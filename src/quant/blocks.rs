//! Typed blocks of ggml's quantized types: a tensor's bytes viewed as a
//! slice of them (`TensorRef::view`), and the dequantization kernels' input.
//!
//! Each is ggml's `block_*` struct from `ggml-common.h` (ggml-org/ggml, commit
//! d99724f2b141), field for field, `#[repr(C)]` and without padding, so a
//! tensor's bytes can be viewed as a slice of them.
//! A compile-time check ties each struct's size to the type table's bytes per
//! block. Multi-byte fields are little-endian, as in the file.

use half::f16;

use crate::tensor::blocks;

blocks! {
    /// ggml's `block_q4_0`: 32 weights, 4 bits each, one f16 scale (18 bytes).
    BlockQ4_0 for Q4_0 { d: f16, qs: [u8; 16] }
    /// ggml's `block_q4_1`: scale and min, 32 4-bit weights (20 bytes).
    BlockQ4_1 for Q4_1 { d: f16, m: f16, qs: [u8; 16] }
    /// ggml's `block_q5_0` (22 bytes).
    BlockQ5_0 for Q5_0 { d: f16, qh: [u8; 4], qs: [u8; 16] }
    /// ggml's `block_q5_1` (24 bytes).
    BlockQ5_1 for Q5_1 { d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }
    /// ggml's `block_q8_0`: 32 signed bytes and an f16 scale (34 bytes).
    BlockQ8_0 for Q8_0 { d: f16, qs: [i8; 32] }
    /// ggml's `block_q8_1`: scale, scaled sum, 32 signed bytes (36 bytes).
    BlockQ8_1 for Q8_1 { d: f16, s: f16, qs: [i8; 32] }
    /// ggml's `block_q2_K` (84 bytes).
    BlockQ2K for Q2_K { scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }
    /// ggml's `block_q3_K` (110 bytes).
    BlockQ3K for Q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }
    /// ggml's `block_q4_K`: super-block of 256 weights (144 bytes).
    BlockQ4K for Q4_K { d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }
    /// ggml's `block_q5_K` (176 bytes).
    BlockQ5K for Q5_K { d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
    /// ggml's `block_q6_K`: super-block of 256 weights (210 bytes).
    BlockQ6K for Q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }
    /// ggml's `block_q8_K` (292 bytes).
    BlockQ8K for Q8_K { d: f32, qs: [i8; 256], bsums: [i16; 16] }
}

blocks! {
    /// ggml's `block_q1_0`: 128 weights of one bit each, `±d` (18 bytes).
    BlockQ1_0 for Q1_0 {
        /// Scale.
        d: f16,
        /// One bit per weight, weight `j` at bit `j % 8` of byte `j / 8`.
        qs: [u8; 16],
    }
    /// ggml's `block_q2_0`: 64 weights of two bits each, `(q - 1) * d` (18 bytes).
    BlockQ2_0 for Q2_0 {
        /// Scale.
        d: f16,
        /// Two bits per weight, weight `j` at bits `2 * (j % 4)` of byte `j / 4`.
        qs: [u8; 16],
    }
    /// ggml's `block_iq2_xxs`: 2.06 bits per weight (66 bytes).
    BlockIQ2XXS for IQ2_XXS {
        /// Super-block scale.
        d: f16,
        /// Per 32 weights, four grid indices (bytes) then 4×7 sign bits and a 4-bit scale.
        qs: [u16; 32],
    }
    /// ggml's `block_iq2_xs`: 2.31 bits per weight (74 bytes).
    BlockIQ2XS for IQ2_XS {
        /// Super-block scale.
        d: f16,
        /// 9-bit grid index and 7 sign bits per group of eight weights.
        qs: [u16; 32],
        /// Two 4-bit scales per 32 weights.
        scales: [u8; 8],
    }
    /// ggml's `block_iq2_s`: 2.56 bits per weight (82 bytes).
    BlockIQ2S for IQ2_S {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices (32 bytes), then the sign bytes (32 bytes).
        qs: [u8; 64],
        /// High 2 bits of the grid indices.
        qh: [u8; 8],
        /// Two 4-bit scales per 32 weights.
        scales: [u8; 8],
    }
    /// ggml's `block_iq3_xxs`: 3.06 bits per weight (98 bytes).
    BlockIQ3XXS for IQ3_XXS {
        /// Super-block scale.
        d: f16,
        /// Grid indices (64 bytes), then per 32 weights 4×7 sign bits and a 4-bit scale (32 bytes).
        qs: [u8; 96],
    }
    /// ggml's `block_iq3_s`: 3.44 bits per weight (110 bytes).
    BlockIQ3S for IQ3_S {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices.
        qs: [u8; 64],
        /// Ninth bit of the grid indices.
        qh: [u8; 8],
        /// One sign bit per weight.
        signs: [u8; 32],
        /// Two 4-bit scales per 64 weights.
        scales: [u8; 4],
    }
    /// ggml's `block_iq1_s`: 1.56 bits per weight (50 bytes).
    BlockIQ1S for IQ1_S {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices.
        qs: [u8; 32],
        /// Per 32 weights: 4×3 high index bits, a 3-bit scale and the delta's sign.
        qh: [u16; 8],
    }
    /// ggml's `block_iq1_m`: 1.75 bits per weight (56 bytes); the f16 scale is
    /// spread over the top nibbles of `scales`.
    BlockIQ1M for IQ1_M {
        /// Low 8 bits of the grid indices.
        qs: [u8; 32],
        /// High 3 bits of the grid indices and the delta's sign, per group of eight.
        qh: [u8; 16],
        /// 3-bit scales per 16 weights; bits 12–15 of the four `u16`s form the f16 scale.
        scales: [u8; 8],
    }
    /// ggml's `block_iq4_nl`: 32 weights through a non-linear 4-bit code book (18 bytes).
    BlockIQ4NL for IQ4_NL {
        /// Scale.
        d: f16,
        /// Code book indices: weight `j` in the low nibble of byte `j`, weight `j + 16` in the high one.
        qs: [u8; 16],
    }
    /// ggml's `block_iq4_xs`: 4.25 bits per weight (136 bytes).
    BlockIQ4XS for IQ4_XS {
        /// Super-block scale.
        d: f16,
        /// High 2 bits of the eight 6-bit scales.
        scales_h: u16,
        /// Low 4 bits of the eight 6-bit scales.
        scales_l: [u8; 4],
        /// Code book indices, two per byte.
        qs: [u8; 128],
    }
    /// ggml's `block_tq1_0`: ternary, five weights per byte in base 3 (54 bytes).
    BlockTQ1_0 for TQ1_0 {
        /// 240 weights, five per byte.
        qs: [u8; 48],
        /// 16 weights, four per byte.
        qh: [u8; 4],
        /// Scale.
        d: f16,
    }
    /// ggml's `block_tq2_0`: ternary, two bits per weight (66 bytes).
    BlockTQ2_0 for TQ2_0 {
        /// Two bits per weight.
        qs: [u8; 64],
        /// Scale.
        d: f16,
    }
    /// ggml's `block_mxfp4`: 32 E2M1 weights and an E8M0 scale (17 bytes).
    BlockMXFP4 for MXFP4 {
        /// E8M0 shared exponent.
        e: u8,
        /// E2M1 codes: weight `j` in the low nibble of byte `j`, weight `j + 16` in the high one.
        qs: [u8; 16],
    }
    /// ggml's `block_nvfp4`: 64 E2M1 weights, a UE4M3 scale per 16 (36 bytes).
    BlockNVFP4 for NVFP4 {
        /// UE4M3 scales, one per 16 weights.
        d: [u8; 4],
        /// E2M1 codes, 8 bytes per sub-block of 16: weight `j` in the low nibble of byte `j`, weight `j + 8` in the high one.
        qs: [u8; 32],
    }
}
