//! Element types: ggml's type table plus the extra dtypes safetensors files use.
//!
//! The ggml part follows ggml's own `type_traits` table (ggml 0.25.3, ids 0–42):
//! where other tables disagree, ggml wins. gguf-py 0.19, for instance, gives a
//! Q8_1 block 40 bytes where ggml gives it 36; weightmap says 36.

use std::fmt;

macro_rules! tensor_types {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, ggml $id:expr, block $blck:literal, bytes $size:literal; )*) => {
        /// The element type of a tensor.
        ///
        /// Every type ggml defines today (by its ggml id, see
        /// [`TensorType::from_ggml_id`]) and the safetensors dtypes ggml lacks
        /// (unsigned integers, bool, 8-bit floats), which have no ggml id.
        ///
        /// ```
        /// use weightmap::TensorType;
        /// let t = TensorType::from_ggml_id(12).unwrap();
        /// assert_eq!(t, TensorType::Q4_K);
        /// assert_eq!((t.block_size(), t.type_size()), (256, 144));
        /// // ids ggml removed (4, 5, 31-33, 36-38) are not types
        /// assert!(TensorType::from_ggml_id(4).is_none());
        /// ```
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum TensorType {
            $( $(#[$doc])* $variant, )*
        }

        impl TensorType {
            /// Every type, ggml's in id order first, then the extras.
            pub const ALL: &'static [TensorType] = &[$(TensorType::$variant,)*];

            /// The type's name as ggml (or, for the extras, safetensors) spells it.
            pub const fn name(self) -> &'static str {
                match self { $(TensorType::$variant => $name,)* }
            }

            /// ggml's numeric id, or `None` for a type ggml does not have.
            pub const fn ggml_id(self) -> Option<u32> {
                match self { $(TensorType::$variant => $id,)* }
            }

            /// Elements per block: 1 for plain types, 32, 64, 128 or 256 for quantized ones.
            pub const fn block_size(self) -> u64 {
                match self { $(TensorType::$variant => $blck,)* }
            }

            /// Bytes per block.
            pub const fn type_size(self) -> u64 {
                match self { $(TensorType::$variant => $size,)* }
            }
        }
    };
}

tensor_types! {
    /// 32-bit float.
    F32 = "f32", ggml Some(0), block 1, bytes 4;
    /// 16-bit IEEE float.
    F16 = "f16", ggml Some(1), block 1, bytes 2;
    /// 4-bit, 32-element blocks with an f16 scale.
    Q4_0 = "q4_0", ggml Some(2), block 32, bytes 18;
    /// 4-bit, 32-element blocks with f16 scale and min.
    Q4_1 = "q4_1", ggml Some(3), block 32, bytes 20;
    /// 5-bit, 32-element blocks.
    Q5_0 = "q5_0", ggml Some(6), block 32, bytes 22;
    /// 5-bit, 32-element blocks with a min.
    Q5_1 = "q5_1", ggml Some(7), block 32, bytes 24;
    /// 8-bit, 32-element blocks with an f16 scale.
    Q8_0 = "q8_0", ggml Some(8), block 32, bytes 34;
    /// 8-bit, 32-element blocks with scale and sum (36 bytes in ggml; gguf-py says 40).
    Q8_1 = "q8_1", ggml Some(9), block 32, bytes 36;
    /// 2-bit k-quant.
    Q2_K = "q2_K", ggml Some(10), block 256, bytes 84;
    /// 3-bit k-quant.
    Q3_K = "q3_K", ggml Some(11), block 256, bytes 110;
    /// 4-bit k-quant.
    Q4_K = "q4_K", ggml Some(12), block 256, bytes 144;
    /// 5-bit k-quant.
    Q5_K = "q5_K", ggml Some(13), block 256, bytes 176;
    /// 6-bit k-quant.
    Q6_K = "q6_K", ggml Some(14), block 256, bytes 210;
    /// 8-bit k-quant (intermediate).
    Q8_K = "q8_K", ggml Some(15), block 256, bytes 292;
    /// i-quant, 2.06 bits.
    IQ2_XXS = "iq2_xxs", ggml Some(16), block 256, bytes 66;
    /// i-quant, 2.31 bits.
    IQ2_XS = "iq2_xs", ggml Some(17), block 256, bytes 74;
    /// i-quant, 3.06 bits.
    IQ3_XXS = "iq3_xxs", ggml Some(18), block 256, bytes 98;
    /// i-quant, 1.56 bits.
    IQ1_S = "iq1_s", ggml Some(19), block 256, bytes 50;
    /// i-quant, 4-bit non-linear.
    IQ4_NL = "iq4_nl", ggml Some(20), block 32, bytes 18;
    /// i-quant, 3.44 bits.
    IQ3_S = "iq3_s", ggml Some(21), block 256, bytes 110;
    /// i-quant, 2.5 bits.
    IQ2_S = "iq2_s", ggml Some(22), block 256, bytes 82;
    /// i-quant, 4.25 bits.
    IQ4_XS = "iq4_xs", ggml Some(23), block 256, bytes 136;
    /// 8-bit signed integer.
    I8 = "i8", ggml Some(24), block 1, bytes 1;
    /// 16-bit signed integer.
    I16 = "i16", ggml Some(25), block 1, bytes 2;
    /// 32-bit signed integer.
    I32 = "i32", ggml Some(26), block 1, bytes 4;
    /// 64-bit signed integer.
    I64 = "i64", ggml Some(27), block 1, bytes 8;
    /// 64-bit float.
    F64 = "f64", ggml Some(28), block 1, bytes 8;
    /// i-quant, 1.75 bits.
    IQ1_M = "iq1_m", ggml Some(29), block 256, bytes 56;
    /// bfloat16.
    BF16 = "bf16", ggml Some(30), block 1, bytes 2;
    /// ternary, 1.69 bits.
    TQ1_0 = "tq1_0", ggml Some(34), block 256, bytes 54;
    /// ternary, 2.06 bits.
    TQ2_0 = "tq2_0", ggml Some(35), block 256, bytes 66;
    /// microscaling fp4.
    MXFP4 = "mxfp4", ggml Some(39), block 32, bytes 17;
    /// NVIDIA fp4 with 64-element blocks.
    NVFP4 = "nvfp4", ggml Some(40), block 64, bytes 36;
    /// 1-bit, 128-element blocks.
    Q1_0 = "q1_0", ggml Some(41), block 128, bytes 18;
    /// 2-bit, 64-element blocks.
    Q2_0 = "q2_0", ggml Some(42), block 64, bytes 18;
    /// Boolean byte (safetensors `BOOL`).
    Bool = "bool", ggml None, block 1, bytes 1;
    /// 8-bit unsigned integer (safetensors `U8`).
    U8 = "u8", ggml None, block 1, bytes 1;
    /// 16-bit unsigned integer (safetensors `U16`).
    U16 = "u16", ggml None, block 1, bytes 2;
    /// 32-bit unsigned integer (safetensors `U32`).
    U32 = "u32", ggml None, block 1, bytes 4;
    /// 64-bit unsigned integer (safetensors `U64`).
    U64 = "u64", ggml None, block 1, bytes 8;
    /// 8-bit float, e4m3 (safetensors `F8_E4M3`).
    F8_E4M3 = "f8_e4m3", ggml None, block 1, bytes 1;
    /// 8-bit float, e5m2 (safetensors `F8_E5M2`).
    F8_E5M2 = "f8_e5m2", ggml None, block 1, bytes 1;
    /// 8-bit float, e4m3 "fnuz" (safetensors `F8_E4M3FNUZ`).
    F8_E4M3FNUZ = "f8_e4m3fnuz", ggml None, block 1, bytes 1;
    /// 8-bit float, e5m2 "fnuz" (safetensors `F8_E5M2FNUZ`).
    F8_E5M2FNUZ = "f8_e5m2fnuz", ggml None, block 1, bytes 1;
    /// 8-bit exponent-only scale (safetensors `F8_E8M0`).
    F8_E8M0 = "f8_e8m0", ggml None, block 1, bytes 1;
    /// complex of two f32 (safetensors `C64`).
    C64 = "c64", ggml None, block 1, bytes 8;
    /// 4-bit float, e2m1, two to a byte (safetensors `F4`, torch's
    /// `float4_e2m1fn_x2`): a "block" of 2 elements in 1 byte.
    F4 = "f4", ggml None, block 2, bytes 1;
    /// 6-bit float, e2m3, four in 3 bytes (safetensors `F6_E2M3`).
    F6_E2M3 = "f6_e2m3", ggml None, block 4, bytes 3;
    /// 6-bit float, e3m2, four in 3 bytes (safetensors `F6_E3M2`).
    F6_E3M2 = "f6_e3m2", ggml None, block 4, bytes 3;
}

/// Highest id in ggml's table (`GGML_TYPE_COUNT - 1`).
#[cfg(test)]
const GGML_MAX_TYPE_ID: u32 = 42;

impl TensorType {
    /// Look a ggml type id up. Ids ggml removed (4, 5, 31–33, 36–38) and ids
    /// past the table give `None`.
    pub fn from_ggml_id(id: u32) -> Option<TensorType> {
        // The table is small and ordered by id; a linear scan of ~35 entries
        // runs once per tensor descriptor.
        TensorType::ALL
            .iter()
            .copied()
            .find(|t| t.ggml_id() == Some(id))
    }

    /// Whether several elements share a block (quantized types).
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes for `n_elements` elements, or `None` if `n_elements` is not a
    /// whole number of blocks or the product overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let blck = self.block_size();
        if n_elements % blck != 0 {
            return None;
        }
        (n_elements / blck).checked_mul(self.type_size())
    }

    /// Bytes for one row of `ne0` elements (ggml's `ggml_row_size`), or `None`
    /// if `ne0` is not a multiple of the block size or the product overflows.
    pub fn row_size(self, ne0: u64) -> Option<u64> {
        self.bytes_for(ne0)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_are_unique_and_cover_the_table() {
        let mut seen = std::collections::BTreeSet::new();
        for t in TensorType::ALL {
            if let Some(id) = t.ggml_id() {
                assert!(seen.insert(id), "duplicate id {id}");
                assert_eq!(TensorType::from_ggml_id(id), Some(*t));
            }
        }
        let removed = [4, 5, 31, 32, 33, 36, 37, 38];
        for id in 0..=GGML_MAX_TYPE_ID {
            assert_eq!(seen.contains(&id), !removed.contains(&id), "id {id}");
        }
        assert_eq!(TensorType::from_ggml_id(GGML_MAX_TYPE_ID + 1), None);
    }

    #[test]
    fn sizes_match_ggml_where_tables_disagree() {
        assert_eq!(TensorType::Q8_1.type_size(), 36);
        assert_eq!(TensorType::Q2_0.block_size(), 64);
        assert_eq!(TensorType::NVFP4.type_size(), 36);
        assert_eq!(TensorType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(TensorType::Q4_0.bytes_for(33), None);
        assert_eq!(TensorType::F32.bytes_for(u64::MAX), None);
        assert_eq!(TensorType::F32.bytes_for(0), Some(0));
    }
}
