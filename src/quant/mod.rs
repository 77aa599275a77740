//! Dequantization: any tensor type ggml can turn into floats, to `f32`.
//!
//! [`dequantize`] follows ggml's reference `dequantize_row_*` functions
//! (`src/ggml-quants.c` in ggml-org/ggml, commit d99724f2b141) and its
//! `ggml_fp16_to_fp32_row` / `ggml_bf16_to_fp32_row`: the same integer
//! decoding and the same float operations in the same order, so the output
//! is bit-for-bit ggml's. The code is portable safe Rust; the per-block loops
//! run over fixed-size arrays for the compiler to vectorize.
//!
//! ```
//! use weightmap::{quant, TensorType};
//! # fn main() -> weightmap::Result<()> {
//! // One Q8_0 block: an f16 scale of 0.5 (0x3800), then 32 signed bytes.
//! let mut block = vec![0x00, 0x38];
//! block.extend((0..32).map(|i| i as u8));
//! let w = quant::dequantize_to_vec(TensorType::Q8_0, &block)?;
//! assert_eq!(w.len(), 32);
//! assert_eq!(w[3], 1.5);
//! assert!(!TensorType::Q8_1.has_dequantize()); // ggml has none
//! # Ok(()) }
//! ```
//!
//! # Coverage
//! - ggml's float types F32, F16, BF16, and F64 (rounded to nearest, as a C
//!   `(float)` cast does).
//! - Every quantized type with a ggml `to_float`: Q1_0, Q2_0, Q4_0, Q4_1,
//!   Q5_0, Q5_1, Q8_0, Q2_K–Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
//!   IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4.
//! - Q8_K, whose `to_float` slot ggml leaves empty but whose reference
//!   `dequantize_row_q8_K` exists in `ggml-quants.c`: `d * qs[j]`.
//! - Integers I8–I64, U8–U64 and Bool (0 or 1) as their values, rounded to
//!   the nearest f32.
//! - The safetensors 8-bit floats F8_E4M3 (OCP E4M3FN), F8_E5M2, F8_E4M3FNUZ,
//!   F8_E5M2FNUZ and F8_E8M0, all exact in f32 (NaN codes give a NaN).
//!
//! Not covered, [`Error::NoDequantize`]: Q8_1 (ggml defines no
//! dequantization for it: it exists only as the other operand of dot
//! products), C64 (a complex number is not one float) and safetensors'
//! sub-byte floats F4, F6_E2M3 and F6_E3M2 (their bytes can be viewed, not
//! dequantized).
//!
//! # Data checks
//! [`check_data`] and [`check_tensors`] find NaN and infinity the way
//! llama.cpp's `--check-tensors` does (ggml's `ggml_validate_row_data`):
//! every element of a float tensor (F32, F16, BF16, F64, the 8-bit floats,
//! C64), and the float scale fields of every quantized block: `d`, also
//! `m`/`dmin`/`s` where the block has them, IQ1_M's packed f16 scale, and
//! MXFP4's E8M0 exponent (0xFF, E8M0's NaN code, is rejected as ggml does).
//! Quantized values themselves are small integers or code-book indices and
//! cannot be NaN. Integer and bool tensors, and NVFP4 (whose UE4M3 scales
//! decode to a finite value for every code), have nothing to check.

mod blocks;
mod check;
mod grids;
mod kernels;
mod scalar;

pub use blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL,
    BlockIQ4XS, BlockMXFP4, BlockNVFP4, BlockQ1_0, BlockQ2K, BlockQ2_0, BlockQ3K, BlockQ4K,
    BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    BlockTQ1_0, BlockTQ2_0,
};

pub use check::{check_data, check_tensors, CheckStats};

use bytemuck::Pod;

use crate::error::{Error, Result};
use crate::types::TensorType;

/// A dequantizer over whole blocks: `bytes` is a whole number of blocks and
/// `out` holds exactly their elements (checked by [`dequantize`]).
type Kernel = fn(&[u8], &mut [f32]);

/// Run `f` over each block of `bytes` and its `N` outputs.
///
/// Aligned input is viewed in place; unaligned input (GGUF allows alignment
/// 1, safetensors data starts anywhere) is copied one block at a time.
#[inline(always)]
fn each_block<B: Pod, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&B, &mut [f32; N]),
) {
    let outs = out
        .chunks_exact_mut(N)
        .map(|c| <&mut [f32; N]>::try_from(c).expect("chunks_exact_mut yields N elements"));
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => blocks.iter().zip(outs).for_each(|(b, y)| f(b, y)),
        Err(_) => bytes
            .chunks_exact(std::mem::size_of::<B>())
            .zip(outs)
            .for_each(|(c, y)| f(&bytemuck::pod_read_unaligned::<B>(c), y)),
    }
}

/// Run `f` over each `W`-byte element of `bytes`.
#[inline(always)]
fn each_elem<const W: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; W]) -> f32) {
    for (c, y) in bytes.chunks_exact(W).zip(out) {
        *y = f(<[u8; W]>::try_from(c).expect("chunks_exact yields W bytes"));
    }
}

macro_rules! block_kernels {
    ($($name:ident: $block:ty, $n:literal => $f:path;)*) => {$(
        pub(super) fn $name(bytes: &[u8], out: &mut [f32]) {
            each_block::<$block, $n>(bytes, out, $f);
        }
    )*};
}

mod row {
    use super::kernels as k;
    use super::*;

    block_kernels! {
        q1_0: BlockQ1_0, 128 => k::q1_0;
        q2_0: BlockQ2_0, 64 => k::q2_0;
        q4_0: BlockQ4_0, 32 => k::q4_0;
        q4_1: BlockQ4_1, 32 => k::q4_1;
        q5_0: BlockQ5_0, 32 => k::q5_0;
        q5_1: BlockQ5_1, 32 => k::q5_1;
        q8_0: BlockQ8_0, 32 => k::q8_0;
        mxfp4: BlockMXFP4, 32 => k::mxfp4;
        nvfp4: BlockNVFP4, 64 => k::nvfp4;
        q2_k: BlockQ2K, 256 => k::q2_k;
        q3_k: BlockQ3K, 256 => k::q3_k;
        q4_k: BlockQ4K, 256 => k::q4_k;
        q5_k: BlockQ5K, 256 => k::q5_k;
        q6_k: BlockQ6K, 256 => k::q6_k;
        q8_k: BlockQ8K, 256 => k::q8_k;
        tq1_0: BlockTQ1_0, 256 => k::tq1_0;
        tq2_0: BlockTQ2_0, 256 => k::tq2_0;
        iq2_xxs: BlockIQ2XXS, 256 => k::iq2_xxs;
        iq2_xs: BlockIQ2XS, 256 => k::iq2_xs;
        iq2_s: BlockIQ2S, 256 => k::iq2_s;
        iq3_xxs: BlockIQ3XXS, 256 => k::iq3_xxs;
        iq3_s: BlockIQ3S, 256 => k::iq3_s;
        iq1_s: BlockIQ1S, 256 => k::iq1_s;
        iq1_m: BlockIQ1M, 256 => k::iq1_m;
        iq4_nl: BlockIQ4NL, 32 => k::iq4_nl;
        iq4_xs: BlockIQ4XS, 256 => k::iq4_xs;
    }

    pub(super) fn f32(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, f32::from_le_bytes);
    }
    pub(super) fn f16(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| scalar::fp16(u16::from_le_bytes(c)));
    }
    pub(super) fn bf16(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| scalar::bf16(u16::from_le_bytes(c)));
    }
    pub(super) fn f64(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| f64::from_le_bytes(c) as f32);
    }
    pub(super) fn i8(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| f32::from(c[0] as i8));
    }
    pub(super) fn i16(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| f32::from(i16::from_le_bytes(c)));
    }
    pub(super) fn i32(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| i32::from_le_bytes(c) as f32);
    }
    pub(super) fn i64(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| i64::from_le_bytes(c) as f32);
    }
    pub(super) fn u8(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| f32::from(c[0]));
    }
    pub(super) fn u16(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| f32::from(u16::from_le_bytes(c)));
    }
    pub(super) fn u32(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| u32::from_le_bytes(c) as f32);
    }
    pub(super) fn u64(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c| u64::from_le_bytes(c) as f32);
    }
    pub(super) fn bool(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| if c[0] != 0 { 1.0 } else { 0.0 });
    }
    pub(super) fn f8_e4m3(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| scalar::E4M3FN.to_f32(c[0]));
    }
    pub(super) fn f8_e5m2(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| scalar::e5m2(c[0]));
    }
    pub(super) fn f8_e4m3fnuz(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| scalar::E4M3FNUZ.to_f32(c[0]));
    }
    pub(super) fn f8_e5m2fnuz(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| scalar::E5M2FNUZ.to_f32(c[0]));
    }
    pub(super) fn f8_e8m0(b: &[u8], y: &mut [f32]) {
        each_elem(b, y, |c: [u8; 1]| scalar::e8m0(c[0]));
    }
}

/// The kernel for `ty`, or `None` if the type has no dequantization.
fn kernel(ty: TensorType) -> Option<Kernel> {
    use TensorType as T;
    Some(match ty {
        T::F32 => row::f32,
        T::F16 => row::f16,
        T::BF16 => row::bf16,
        T::F64 => row::f64,
        T::Q1_0 => row::q1_0,
        T::Q2_0 => row::q2_0,
        T::Q4_0 => row::q4_0,
        T::Q4_1 => row::q4_1,
        T::Q5_0 => row::q5_0,
        T::Q5_1 => row::q5_1,
        T::Q8_0 => row::q8_0,
        T::Q2_K => row::q2_k,
        T::Q3_K => row::q3_k,
        T::Q4_K => row::q4_k,
        T::Q5_K => row::q5_k,
        T::Q6_K => row::q6_k,
        T::Q8_K => row::q8_k,
        T::IQ2_XXS => row::iq2_xxs,
        T::IQ2_XS => row::iq2_xs,
        T::IQ2_S => row::iq2_s,
        T::IQ3_XXS => row::iq3_xxs,
        T::IQ3_S => row::iq3_s,
        T::IQ1_S => row::iq1_s,
        T::IQ1_M => row::iq1_m,
        T::IQ4_NL => row::iq4_nl,
        T::IQ4_XS => row::iq4_xs,
        T::TQ1_0 => row::tq1_0,
        T::TQ2_0 => row::tq2_0,
        T::MXFP4 => row::mxfp4,
        T::NVFP4 => row::nvfp4,
        T::I8 => row::i8,
        T::I16 => row::i16,
        T::I32 => row::i32,
        T::I64 => row::i64,
        T::U8 => row::u8,
        T::U16 => row::u16,
        T::U32 => row::u32,
        T::U64 => row::u64,
        T::Bool => row::bool,
        T::F8_E4M3 => row::f8_e4m3,
        T::F8_E5M2 => row::f8_e5m2,
        T::F8_E4M3FNUZ => row::f8_e4m3fnuz,
        T::F8_E5M2FNUZ => row::f8_e5m2fnuz,
        T::F8_E8M0 => row::f8_e8m0,
        T::Q8_1 | T::C64 | T::F4 | T::F6_E2M3 | T::F6_E3M2 => return None,
    })
}

impl TensorType {
    /// Whether [`dequantize`] handles this type: every type but Q8_1, C64
    /// and safetensors' sub-byte floats (F4, F6_E2M3, F6_E3M2).
    pub fn has_dequantize(self) -> bool {
        kernel(self).is_some()
    }
}

/// The number of elements in `nbytes` bytes of `ty`, checking that the bytes
/// are whole blocks.
fn element_count(ty: TensorType, nbytes: usize) -> Result<usize> {
    // Block sizes and bytes per block are small constants (≤ 292): these
    // conversions cannot fail on any target weightmap builds for.
    let block_bytes = ty.type_size() as usize;
    let block_elems = ty.block_size() as usize;
    if nbytes % block_bytes != 0 {
        return Err(Error::RaggedBlocks {
            ty,
            nbytes,
            block_bytes,
        });
    }
    // Q1_0 packs 128 elements in 18 bytes, so the element count of a huge
    // byte slice can pass usize::MAX. It saturates: no `&mut [f32]` is that
    // long, so the caller gets `OutputLength` (or `Alloc`), never a wrap.
    Ok((nbytes / block_bytes).saturating_mul(block_elems))
}

/// Dequantize `bytes`, whole blocks of `ty` as stored in a file, into `out`,
/// one f32 per element, bit-identical to ggml's reference dequantization
/// (see the [module docs](self) for the list of types).
///
/// `bytes` may sit at any address. Multi-byte fields are read little-endian.
///
/// # Errors
/// - [`Error::NoDequantize`] if `ty` has none (Q8_1, C64, F4, F6_E2M3, F6_E3M2).
/// - [`Error::RaggedBlocks`] if `bytes` is not a whole number of blocks.
/// - [`Error::OutputLength`] if `out.len()` is not the number of elements.
pub fn dequantize(ty: TensorType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let kernel = kernel(ty).ok_or(Error::NoDequantize { ty })?;
    let n = element_count(ty, bytes.len())?;
    if out.len() != n {
        return Err(Error::OutputLength {
            ty,
            expected: n,
            found: out.len(),
        });
    }
    kernel(bytes, out);
    Ok(())
}

/// [`dequantize`] into a new vector.
///
/// # Errors
/// As [`dequantize`], and [`Error::Alloc`] if the vector cannot be allocated
/// (the allocation is tried, not assumed: a failure is an error, not an abort).
pub fn dequantize_to_vec(ty: TensorType, bytes: &[u8]) -> Result<Vec<f32>> {
    if kernel(ty).is_none() {
        return Err(Error::NoDequantize { ty });
    }
    let n = element_count(ty, bytes.len())?;
    let alloc_error = |size: usize, detail: String| Error::Alloc {
        size,
        source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, detail),
    };
    let size = n
        .checked_mul(std::mem::size_of::<f32>())
        .ok_or_else(|| alloc_error(usize::MAX, format!("{n} f32 overflow usize")))?;
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|e| alloc_error(size, e.to_string()))?;
    out.resize(n, 0.0);
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}
