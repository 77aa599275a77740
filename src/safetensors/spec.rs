//! The format's constants and the mapping of its dtypes onto weightmap's
//! types, shared by the header parser and its JSON visitor.

use ::safetensors::Dtype;

use crate::error::{Error, Result};
use crate::types::TensorType;

/// Largest JSON header accepted, in bytes: the `safetensors` crate's limit.
pub(crate) const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the little-endian header length that starts the file.
pub(crate) const LEN_PREFIX: u64 = 8;

/// The key of the free-form string map in the JSON header.
pub(crate) const METADATA_KEY: &str = "__metadata__";

/// An [`Error::SafetensorsHeader`] saying `detail`.
pub(crate) fn header_err(detail: String) -> Error {
    Error::SafetensorsHeader { detail }
}

/// Map a safetensors dtype to weightmap's type. The sub-byte dtypes (F4,
/// F6_E2M3, F6_E3M2) are types whose "blocks" are the fewest elements that
/// fill whole bytes; a dtype the crate adds later is not supported.
pub(crate) fn tensor_type(name: &str, dtype: Dtype) -> Result<TensorType> {
    Ok(match dtype {
        Dtype::F64 => TensorType::F64,
        Dtype::F32 => TensorType::F32,
        Dtype::F16 => TensorType::F16,
        Dtype::BF16 => TensorType::BF16,
        Dtype::I8 => TensorType::I8,
        Dtype::I16 => TensorType::I16,
        Dtype::I32 => TensorType::I32,
        Dtype::I64 => TensorType::I64,
        Dtype::U8 => TensorType::U8,
        Dtype::U16 => TensorType::U16,
        Dtype::U32 => TensorType::U32,
        Dtype::U64 => TensorType::U64,
        Dtype::BOOL => TensorType::Bool,
        Dtype::F8_E4M3 => TensorType::F8_E4M3,
        Dtype::F8_E5M2 => TensorType::F8_E5M2,
        Dtype::F8_E4M3FNUZ => TensorType::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ => TensorType::F8_E5M2FNUZ,
        Dtype::F8_E8M0 => TensorType::F8_E8M0,
        Dtype::C64 => TensorType::C64,
        Dtype::F4 => TensorType::F4,
        Dtype::F6_E2M3 => TensorType::F6_E2M3,
        Dtype::F6_E3M2 => TensorType::F6_E3M2,
        other => {
            return Err(header_err(format!(
                "tensor '{name}': dtype {other:?} ({} bits per element) is not supported: \
                 weightmap views whole bytes",
                other.bitsize()
            )))
        }
    })
}
