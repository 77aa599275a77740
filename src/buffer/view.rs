//! Typed, zero-copy views of tensor bytes, through bytemuck.

use bytemuck::Pod;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::tensor::TensorInfo;
use crate::types::TensorType;

/// A type a tensor's bytes can be viewed as: a plain element (`f32`,
/// `half::f16`, `i8`, ...) or a quantized block struct ([`BlockQ4_0`], ...).
pub trait Element: Pod {
    /// Name used in errors.
    const NAME: &'static str;
    /// Whether a tensor of type `ty` can be viewed as `Self`.
    fn accepts(ty: TensorType) -> bool;
}

macro_rules! element {
    ($($t:ty => $name:literal: $($tt:ident)|+;)*) => {$(
        impl Element for $t {
            const NAME: &'static str = $name;
            fn accepts(ty: TensorType) -> bool {
                matches!(ty, $(TensorType::$tt)|+)
            }
        }
    )*};
}

element! {
    f32 => "f32": F32;
    f64 => "f64": F64;
    f16 => "f16": F16;
    bf16 => "bf16": BF16;
    i8 => "i8": I8;
    i16 => "i16": I16;
    i32 => "i32": I32;
    i64 => "i64": I64;
    u8 => "u8": U8 | Bool | F8_E4M3 | F8_E5M2 | F8_E4M3FNUZ | F8_E5M2FNUZ | F8_E8M0;
    u16 => "u16": U16;
    u32 => "u32": U32;
    u64 => "u64": U64;
}

/// Block structs of ggml types: `#[repr(C)]` `Pod`, an [`Element`] of their
/// type, and a compile-time check of their size against the type table.
/// Fields may carry docs (the IQ/TQ/FP4 structs in `quant` do).
macro_rules! blocks {
    ($($(#[$doc:meta])* $name:ident for $ty:ident { $($(#[$fdoc:meta])* $field:ident: $fty:ty),* $(,)? })*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[allow(missing_docs)]
        pub struct $name { $($(#[$fdoc])* pub $field: $fty),* }

        impl $crate::buffer::Element for $name {
            const NAME: &'static str = stringify!($name);
            fn accepts(ty: $crate::TensorType) -> bool {
                ty == $crate::TensorType::$ty
            }
        }

        const _: () = assert!(
            std::mem::size_of::<$name>() as u64 == $crate::TensorType::$ty.type_size(),
            concat!(stringify!($name), " does not match ggml's block size"),
        );
    )*};
}
pub(crate) use blocks;

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

/// View `bytes` (the bytes of the tensor `info`) as a slice of `T`, without copying.
///
/// ```
/// use weightmap::buffer::{view, BlockQ8_0};
/// use weightmap::{gguf, TensorType};
/// # fn main() -> weightmap::Result<()> {
/// let mut w = gguf::write::Writer::new(32);
/// w.tensor("x", TensorType::Q8_0, &[64], vec![0u8; 68]);
/// let bytes = w.to_bytes();
/// let file = gguf::Gguf::parse(&bytes)?;
/// let info = &file.tensors().get(0).unwrap();
/// let blocks: &[BlockQ8_0] = view(info, file.tensor_bytes(info))?;
/// assert_eq!(blocks.len(), 2);
/// assert!(view::<f32>(info, file.tensor_bytes(info)).is_err()); // wrong type
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::ViewType`] if the tensor's type is not `T`'s; [`Error::ViewLayout`]
/// if the bytes are not a whole number of `T` or not aligned for `T`.
pub fn view<'a, T: Element>(info: &TensorInfo, bytes: &'a [u8]) -> Result<&'a [T]> {
    check_type::<T>(info)?;
    if bytes.is_empty() {
        // An empty tensor views as an empty slice wherever its (dangling)
        // address is: there is nothing to misalign.
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| Error::ViewLayout {
        tensor: info.name.to_owned(),
        elem: T::NAME,
        nbytes: bytes.len(),
        address: bytes.as_ptr() as usize,
        reason: e.to_string(),
    })
}

fn check_type<T: Element>(info: &TensorInfo) -> Result<()> {
    if T::accepts(info.ty) {
        Ok(())
    } else {
        Err(Error::ViewType {
            tensor: info.name.to_owned(),
            expected: T::NAME,
            found: info.ty,
        })
    }
}

/// [`view`] for writable bytes (owned copies only).
///
/// # Errors
/// As [`view`].
pub fn view_mut<'a, T: Element>(info: &TensorInfo, bytes: &'a mut [u8]) -> Result<&'a mut [T]> {
    check_type::<T>(info)?;
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    let (nbytes, address) = (bytes.len(), bytes.as_ptr() as usize);
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| Error::ViewLayout {
        tensor: info.name.to_owned(),
        elem: T::NAME,
        nbytes,
        address,
        reason: e.to_string(),
    })
}
