//! Scalar conversions to f32: ggml's f16, bf16, E8M0 and UE4M3 decoders, and
//! the safetensors 8-bit float formats.

/// f16 bits to f32, as ggml's `ggml_compute_fp16_to_fp32` (ggml-impl.h) does it:
/// the same integer and float operations, so NaN payloads come out as ggml's do.
/// Every finite f16 and ±inf convert exactly.
#[inline(always)]
pub(crate) fn fp16(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);

    // Normal values: move the exponent and mantissa into place, rebias by 2^-112.
    const EXP_OFFSET: u32 = 0xE0 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + EXP_OFFSET) * exp_scale;

    // Subnormals: the mantissa as the low bits of 0.5's mantissa, minus 0.5.
    const MAGIC_MASK: u32 = 126 << 23;
    let denormalized = f32::from_bits((two_w >> 17) | MAGIC_MASK) - 0.5;

    const DENORMALIZED_CUTOFF: u32 = 1 << 27;
    let bits = if two_w < DENORMALIZED_CUTOFF {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | bits)
}

/// The f16 stored little-endian in a block's `half::f16` field.
#[inline(always)]
pub(crate) fn fp16_field(h: half::f16) -> f32 {
    fp16(u16::from_le(h.to_bits()))
}

/// bf16 bits to f32: the upper half of an f32 (ggml's `ggml_compute_bf16_to_fp32`).
#[inline(always)]
pub(crate) fn bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Half of an E8M0 scale, 2^(x-128), as ggml's `ggml_e8m0_to_fp32_half`
/// (ggml-impl.h): x = 0 and 1 are f32 subnormals; 255 is 2^127, not NaN.
#[inline(always)]
pub(crate) fn e8m0_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// Half of a UE4M3 scale, as ggml's `ggml_ue4m3_to_fp32` (ggml-impl.h): 4
/// exponent bits (bias 7), 3 mantissa bits, the top bit ignored; 0x00 and
/// 0x7F are 0. Halved because ggml's E2M1 code book is doubled.
#[inline(always)]
pub(crate) fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xF);
    let man = f32::from(x & 0x7);
    // ggml computes ldexpf(m, e); with these small exponents ldexpf is exact,
    // as is multiplying by the power of two built here.
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// 2^e for a normal-range exponent.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// An 8-bit float layout: exponent bits, mantissa bits, bias and how the
/// top codes are used.
#[derive(Clone, Copy)]
pub(crate) struct Minifloat {
    man_bits: u32,
    bias: i32,
    special: Special,
}

#[derive(Clone, Copy, PartialEq)]
enum Special {
    /// `F8_E4M3` (OCP E4M3FN): no infinities; exponent and mantissa all ones are NaN.
    FiniteNanAllOnes,
    /// Only 0x80 is NaN ("fnuz": no negative zero, no infinities).
    Fnuz,
}

/// `F8_E4M3` (OCP "E4M3FN", ml_dtypes `float8_e4m3fn`): bias 7, max 448.
pub(crate) const E4M3FN: Minifloat = Minifloat {
    man_bits: 3,
    bias: 7,
    special: Special::FiniteNanAllOnes,
};
/// `F8_E4M3FNUZ` (ml_dtypes `float8_e4m3fnuz`): bias 8, NaN is 0x80.
pub(crate) const E4M3FNUZ: Minifloat = Minifloat {
    man_bits: 3,
    bias: 8,
    special: Special::Fnuz,
};
/// `F8_E5M2FNUZ` (ml_dtypes `float8_e5m2fnuz`): bias 16, NaN is 0x80.
pub(crate) const E5M2FNUZ: Minifloat = Minifloat {
    man_bits: 2,
    bias: 16,
    special: Special::Fnuz,
};

impl Minifloat {
    /// Decode one code. Every value of these formats is exact in f32; NaN
    /// codes give f32's quiet NaN with the code's sign bit.
    pub(crate) fn to_f32(self, x: u8) -> f32 {
        let negative = x & 0x80 != 0;
        let exp = i32::from(x & 0x7F) >> self.man_bits;
        let man = u32::from(x) & ((1 << self.man_bits) - 1);
        let nan = match self.special {
            Special::FiniteNanAllOnes => x & 0x7F == 0x7F,
            Special::Fnuz => x == 0x80,
        };
        if nan {
            return if negative { -f32::NAN } else { f32::NAN };
        }
        let magnitude = if exp == 0 {
            // Subnormal: man × 2^(1 - bias - man_bits).
            man as f32 * pow2(1 - self.bias - self.man_bits as i32)
        } else {
            f32::from_bits((((exp - self.bias + 127) as u32) << 23) | (man << (23 - self.man_bits)))
        };
        if negative {
            -magnitude
        } else {
            magnitude
        }
    }
}

/// `F8_E5M2` (OCP E5M2, ml_dtypes `float8_e5m2`): the top byte of an IEEE f16,
/// infinities and NaNs included, so it decodes as that f16.
#[inline(always)]
pub(crate) fn e5m2(x: u8) -> f32 {
    fp16(u16::from(x) << 8)
}

/// `F8_E8M0` (OCP E8M0, ml_dtypes `float8_e8m0fnu`): 2^(x-127); 0 is 2^-127
/// (an f32 subnormal), 0xFF is NaN.
#[inline(always)]
pub(crate) fn e8m0(x: u8) -> f32 {
    if x == 0xFF {
        f32::NAN
    } else if x == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        f32::from_bits(u32::from(x) << 23)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's f16 decoder agrees with `half`'s exact conversion on every
    /// non-NaN f16, and gives a NaN for every NaN.
    #[test]
    fn fp16_is_exact_for_all_65536() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = fp16(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn e8m0_half_is_half_of_e8m0() {
        for x in 0..=254u8 {
            assert_eq!(e8m0_half(x), e8m0(x) / 2.0, "{x}");
        }
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    /// Hand-checked against the UE4M3 definition: 0x38 = 2^(7-7) = 1, halved.
    #[test]
    fn ue4m3_values() {
        assert_eq!(ue4m3_half(0x38), 0.5);
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-9) * 0.5);
        assert_eq!(ue4m3_half(0x7E), 448.0 * 0.5);
        assert_eq!(ue4m3_half(0x7F), 0.0);
        assert_eq!(ue4m3_half(0xB8), 0.5); // the sign bit is ignored
    }
}
