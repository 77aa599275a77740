//! Typed, zero-copy views of tensor bytes, through bytemuck.

use bytemuck::Pod;
use half::{bf16, f16};

use super::table::TensorInfo;
use crate::error::{Error, Result};
use crate::types::TensorType;

/// A type a tensor's bytes can be viewed as: a plain element (`f32`,
/// `half::f16`, `i8`, ...) or a quantized block struct ([`crate::quant::BlockQ4_0`], ...).
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
/// Fields may carry docs.
macro_rules! blocks {
    ($($(#[$doc:meta])* $name:ident for $ty:ident { $($(#[$fdoc:meta])* $field:ident: $fty:ty),* $(,)? })*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[allow(missing_docs)]
        pub struct $name { $($(#[$fdoc])* pub $field: $fty),* }

        impl $crate::tensor::view::Element for $name {
            const NAME: &'static str = stringify!($name);
            fn accepts(ty: $crate::types::TensorType) -> bool {
                ty == $crate::types::TensorType::$ty
            }
        }

        const _: () = assert!(
            std::mem::size_of::<$name>() as u64 == $crate::types::TensorType::$ty.type_size(),
            concat!(stringify!($name), " does not match ggml's block size"),
        );
    )*};
}
pub(crate) use blocks;

/// View `bytes` (the bytes of the tensor `info`) as a slice of `T`, without copying.
///
/// # Errors
/// [`Error::ViewType`] if the tensor's type is not `T`'s; [`Error::ViewLayout`]
/// if the bytes are not a whole number of `T` or not aligned for `T`.
pub(crate) fn view<'a, T: Element>(info: &TensorInfo, bytes: &'a [u8]) -> Result<&'a [T]> {
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
pub(crate) fn view_mut<'a, T: Element>(
    info: &TensorInfo,
    bytes: &'a mut [u8],
) -> Result<&'a mut [T]> {
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

impl TensorInfo<'_> {
    /// View `bytes`, the bytes of this tensor (from a file read or mapped
    /// by the caller), as a slice of `T`, without copying. Loaded tensors
    /// have the same view through [`crate::TensorRef::view`].
    ///
    /// ```
    /// use weightmap::gguf::{GgufHeader, Writer};
    /// use weightmap::quant::BlockQ8_0;
    /// use weightmap::TensorType;
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.tensor("x", TensorType::Q8_0, &[64], vec![0u8; 68]);
    /// let bytes = w.to_bytes();
    /// let header = GgufHeader::parse(&bytes)?;
    /// let info = header.tensors().get(0).unwrap();
    /// let data = &bytes[info.file_offset as usize..][..info.nbytes as usize];
    /// let blocks: &[BlockQ8_0] = info.view(data)?;
    /// assert_eq!(blocks.len(), 2);
    /// assert!(info.view::<f32>(data).is_err()); // wrong type
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::ViewType`] if the tensor's type is not `T`'s;
    /// [`Error::ViewLayout`] if the bytes are not a whole number of `T` or
    /// not aligned for `T`.
    pub fn view<'b, T: Element>(&self, bytes: &'b [u8]) -> Result<&'b [T]> {
        view(self, bytes)
    }
}
