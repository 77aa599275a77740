//! Zero-copy metadata: keys and values borrow the file's bytes; arrays are
//! decoded element by element when asked.

use std::borrow::Cow;
use std::ops::Range;

use crate::error::{Error, Result};

/// A GGUF metadata value type (the file's type ids 0–12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueType {
    /// u8
    U8,
    /// i8
    I8,
    /// u16
    U16,
    /// i16
    I16,
    /// u32
    U32,
    /// i32
    I32,
    /// f32
    F32,
    /// bool (one byte; nonzero is true)
    Bool,
    /// string (u64 length, then bytes)
    String,
    /// array (u32 element type, u64 count, elements)
    Array,
    /// u64
    U64,
    /// i64
    I64,
    /// f64
    F64,
}

impl ValueType {
    /// The type for a file's type id, if it is one of the 13.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The type's id in the file.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Lowercase name ("u32", "string", ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Whether this is one of the eight integer types (u8 to i64; not bool).
    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }

    /// Byte size of a value of this type, or `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// Where one key/value pair lies in the file's bytes.
#[derive(Clone, Debug)]
pub(crate) struct KvEntry {
    pub(crate) key: Range<usize>,
    pub(crate) key_offset: u64,
    pub(crate) vtype: ValueType,
    /// Scalars: the value's bytes. Strings: the string's bytes. Arrays: the elements' bytes.
    pub(crate) value: Range<usize>,
    /// Arrays: the element type.
    pub(crate) elem: ValueType,
    /// Arrays: the element count.
    pub(crate) count: u64,
}

/// Where one key/value entry sits in the file, as [`Metadata::layout`] gives
/// it. Offsets are from the start of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout<'a> {
    /// The key.
    pub key: &'a str,
    /// Offset of the entry: its key's 8-byte length comes first, then the
    /// key, then the 4-byte value type.
    pub offset: u64,
    /// The value's type.
    pub value_type: ValueType,
    /// The value's bytes: a scalar's bytes; a string's bytes (its 8-byte
    /// length just before); an array's elements (its 4-byte element type
    /// and 8-byte count just before; string elements length-prefixed).
    pub value: Range<u64>,
    /// An array's element type (`None` for anything else).
    pub elem_type: Option<ValueType>,
    /// An array's element count; a string's length in bytes; 1 for a scalar.
    pub count: u64,
}

/// A string value: bytes from the file, checked as UTF-8 only when asked.
///
/// ggml does not require metadata strings to be UTF-8, so neither does the
/// parser; [`GgufStr::to_str`] checks when a caller wants `&str`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GgufStr<'a>(&'a [u8]);

impl<'a> GgufStr<'a> {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// As `&str`, if the bytes are UTF-8.
    pub fn to_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.0).ok()
    }

    /// As text, with invalid UTF-8 replaced.
    pub fn to_string_lossy(&self) -> std::borrow::Cow<'a, str> {
        String::from_utf8_lossy(self.0)
    }
}

impl std::fmt::Debug for GgufStr<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

/// One metadata value, borrowing the file.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GgufStr<'a>),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an `i128` if it is an integer (u8 to i64; not bool), so
    /// that every stored integer converts without loss.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Decode a scalar of type `t` from exactly its bytes.
    fn scalar(t: ValueType, b: &[u8]) -> Option<Value<'a>> {
        Some(match t {
            ValueType::U8 => Value::U8(b[0]),
            ValueType::I8 => Value::I8(b[0] as i8),
            ValueType::Bool => Value::Bool(b[0] != 0),
            ValueType::U16 => Value::U16(u16::from_le_bytes(b.try_into().ok()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(b.try_into().ok()?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(b.try_into().ok()?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(b.try_into().ok()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(b.try_into().ok()?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(b.try_into().ok()?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(b.try_into().ok()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(b.try_into().ok()?)),
            ValueType::String | ValueType::Array => return None,
        })
    }
}

/// An array value: its element bytes, decoded on demand.
///
/// ```
/// # use weightmap::gguf::{self, GgufHeader};
/// # fn main() -> weightmap::Result<()> {
/// let mut w = gguf::Writer::new(32);
/// w.kv_str_array("tokenizer.ggml.tokens", &["<s>", "hello", "wörld"]);
/// w.kv_f32_array("tokenizer.ggml.scores", &[0.0, -1.5, -2.0]);
/// let bytes = w.to_bytes();
/// let file = GgufHeader::parse(&bytes)?;
/// let md = file.metadata_in(&bytes);
/// let tokens: Vec<&str> = md.get_array("tokenizer.ggml.tokens")?
///     .strings()?.map(|s| s.to_str().unwrap()).collect();
/// assert_eq!(tokens, ["<s>", "hello", "wörld"]);
/// let scores: Vec<f32> = md.get_array("tokenizer.ggml.scores")?.values::<f32>()?.collect();
/// assert_eq!(scores, [0.0, -1.5, -2.0]);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Array<'a> {
    key: &'a str,
    elem: ValueType,
    len: u64,
    bytes: &'a [u8],
}

impl<'a> Array<'a> {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements' raw little-endian bytes (for strings: length-prefixed).
    pub fn raw_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Element `i`: O(1) for fixed-size elements, O(i) for strings.
    pub fn get(&self, i: u64) -> Option<Value<'a>> {
        if i >= self.len {
            return None;
        }
        match self.elem.fixed_size() {
            Some(sz) => {
                let start = usize::try_from(i.checked_mul(sz)?).ok()?;
                let b = self.bytes.get(start..start + sz as usize)?;
                Value::scalar(self.elem, b)
            }
            None => self.iter().nth(usize::try_from(i).ok()?),
        }
    }

    /// Every element, decoded as it is reached.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        let this = *self;
        let mut strings = StrIter {
            bytes: self.bytes,
            left: if self.elem == ValueType::String {
                self.len
            } else {
                0
            },
        };
        let mut i = 0u64;
        std::iter::from_fn(move || {
            if this.elem == ValueType::String {
                return strings.next().map(Value::String);
            }
            let v = this.get(i);
            i += 1;
            v
        })
    }

    /// The string elements.
    ///
    /// # Errors
    /// [`Error::WrongValueType`] if the elements are not strings.
    pub fn strings(&self) -> Result<impl ExactSizeIterator<Item = GgufStr<'a>> + Clone + 'a> {
        if self.elem != ValueType::String {
            return Err(self.wrong("array of string"));
        }
        Ok(StrIter {
            bytes: self.bytes,
            left: self.len,
        })
    }

    /// The elements as `T` (`u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `f32`,
    /// `bool`, `u64`, `i64`, `f64`), decoded one at a time (the bytes need not
    /// be aligned for `T`).
    ///
    /// # Errors
    /// [`Error::WrongValueType`] if the elements are another type.
    pub fn values<T: ArrayElem>(&self) -> Result<impl ExactSizeIterator<Item = T> + 'a> {
        if self.elem != T::TYPE {
            return Err(self.wrong(T::ARRAY_NAME));
        }
        Ok(self.bytes.chunks_exact(T::SIZE).map(T::decode))
    }

    /// The elements as a slice of `T` (`u8`, `i8`, `u16`, `i16`, `u32`,
    /// `i32`, `f32`, `u64`, `i64`, `f64`): borrowed from the file when its
    /// bytes are aligned for `T` (and the host is little-endian), otherwise
    /// decoded into a copy. GGUF aligns nothing in the header, so a u32 array
    /// is borrowed only when it happens to start at a multiple of 4.
    ///
    /// ```
    /// # use weightmap::gguf::{GgufHeader, Writer};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.kv_i32_array("tokenizer.ggml.token_type", &[1, 3, 1]);
    /// let bytes = w.to_bytes();
    /// let file = GgufHeader::parse(&bytes)?;
    /// let types = file.metadata_in(&bytes).get_array("tokenizer.ggml.token_type")?.as_slice::<i32>()?;
    /// assert_eq!(&types[..], [1, 3, 1]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::WrongValueType`] if the elements are another type.
    pub fn as_slice<T: ArrayElem + bytemuck::Pod>(&self) -> Result<Cow<'a, [T]>> {
        if self.elem != T::TYPE {
            return Err(self.wrong(T::ARRAY_NAME));
        }
        if cfg!(target_endian = "little") {
            if let Ok(s) = bytemuck::try_cast_slice::<u8, T>(self.bytes) {
                return Ok(Cow::Borrowed(s));
            }
        }
        Ok(Cow::Owned(
            self.bytes.chunks_exact(T::SIZE).map(T::decode).collect(),
        ))
    }

    fn wrong(&self, expected: &'static str) -> Error {
        Error::WrongValueType {
            key: self.key.to_owned(),
            expected,
            found: array_name(self.elem),
        }
    }
}

fn array_name(t: ValueType) -> &'static str {
    use ValueType::*;
    match t {
        U8 => "array of u8",
        I8 => "array of i8",
        U16 => "array of u16",
        I16 => "array of i16",
        U32 => "array of u32",
        I32 => "array of i32",
        F32 => "array of f32",
        Bool => "array of bool",
        String => "array of string",
        Array => "array of array",
        U64 => "array of u64",
        I64 => "array of i64",
        F64 => "array of f64",
    }
}

/// Iterator over the strings of a string array, without allocating.
#[derive(Clone, Debug)]
pub(crate) struct StrIter<'a> {
    bytes: &'a [u8],
    left: u64,
}

impl ExactSizeIterator for StrIter<'_> {}

impl<'a> Iterator for StrIter<'a> {
    type Item = GgufStr<'a>;

    fn next(&mut self) -> Option<GgufStr<'a>> {
        if self.left == 0 {
            return None;
        }
        // The parser walked every length, so these reads are in bounds; a
        // short slice (a hand-built header) just ends the iteration.
        let (len, rest) = self.bytes.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        let s = rest.get(..len)?;
        self.bytes = &rest[len..];
        self.left -= 1;
        Some(GgufStr(s))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

/// A fixed-size array element type.
pub trait ArrayElem: Sized + Copy + 'static {
    /// The GGUF value type.
    const TYPE: ValueType;
    /// Bytes per element.
    const SIZE: usize;
    /// Name used in errors.
    const ARRAY_NAME: &'static str;
    /// Decode from exactly `SIZE` little-endian bytes.
    fn decode(b: &[u8]) -> Self;
}

macro_rules! array_elem {
    ($($t:ty => $vt:ident, $name:literal;)*) => {$(
        impl ArrayElem for $t {
            const TYPE: ValueType = ValueType::$vt;
            const SIZE: usize = std::mem::size_of::<$t>();
            const ARRAY_NAME: &'static str = $name;
            fn decode(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}

array_elem! {
    u8 => U8, "array of u8";
    i8 => I8, "array of i8";
    u16 => U16, "array of u16";
    i16 => I16, "array of i16";
    u32 => U32, "array of u32";
    i32 => I32, "array of i32";
    f32 => F32, "array of f32";
    u64 => U64, "array of u64";
    i64 => I64, "array of i64";
    f64 => F64, "array of f64";
}

impl ArrayElem for bool {
    const TYPE: ValueType = ValueType::Bool;
    const SIZE: usize = 1;
    const ARRAY_NAME: &'static str = "array of bool";
    fn decode(b: &[u8]) -> Self {
        b[0] != 0
    }
}

/// The key naming the model architecture, the prefix of its hyperparameter keys.
pub(crate) const ARCHITECTURE_KEY: &str = "general.architecture";

mod sealed {
    pub trait Sealed {}
}

/// An integer type that [`Metadata::get_int`] converts stored integers to:
/// `u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `u64`, `i64`, `usize`, `isize`.
pub trait MetaInt: Copy + sealed::Sealed {
    /// The type's name, for errors.
    const NAME: &'static str;
    /// `v` as this type, if it fits.
    fn from_i128(v: i128) -> Option<Self>;
}

macro_rules! meta_int {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl MetaInt for $t {
            const NAME: &'static str = stringify!($t);
            fn from_i128(v: i128) -> Option<Self> {
                <$t>::try_from(v).ok()
            }
        }
    )*};
}

meta_int!(u8, i8, u16, i16, u32, i32, u64, i64, usize, isize);

/// `v`, stored under `key`, as `T`.
fn int_to<T: MetaInt>(key: &str, v: i128) -> Result<T> {
    T::from_i128(v).ok_or_else(|| Error::IntOutOfRange {
        key: key.to_owned(),
        value: v,
        target: T::NAME,
    })
}

/// The metadata of a GGUF file: typed getters over borrowed bytes.
///
/// The `get_*` getters are strict about types: `get_u32` on a key stored as
/// u64 is a [`Error::WrongValueType`] naming the key and both types. Each has
/// a `get_opt_*` form that returns `Ok(None)` for a missing key (a wrong type
/// is still an error). [`Metadata::get_int`] accepts any integer type and
/// checks the value fits; the `arch_*` getters prefix the key with
/// [`Metadata::architecture`]; [`Metadata::per_layer`] reads a scalar or a
/// per-layer array.
#[derive(Clone, Copy, Debug)]
pub struct Metadata<'a> {
    bytes: &'a [u8],
    kvs: &'a [KvEntry],
    sorted: &'a [u32],
}

macro_rules! getter {
    ($($(#[$doc:meta])* $fn:ident, $opt:ident -> $t:ty, $variant:ident, $name:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        /// [`Error::KeyNotFound`], or [`Error::WrongValueType`] for another type.
        pub fn $fn(&self, key: &str) -> Result<$t> {
            self.$opt(key)?.ok_or_else(|| not_found(key))
        }

        $(#[$doc])*
        /// `Ok(None)` when the key is absent.
        ///
        /// # Errors
        /// [`Error::WrongValueType`] if the key holds another type.
        pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
            match self.get(key) {
                None => Ok(None),
                Some(Value::$variant(v)) => Ok(Some(v)),
                Some(other) => Err(Error::WrongValueType {
                    key: key.to_owned(),
                    expected: $name,
                    found: other.value_type().name(),
                }),
            }
        }
    )*};
}

fn not_found(key: &str) -> Error {
    Error::KeyNotFound {
        key: key.to_owned(),
    }
}

impl<'a> Metadata<'a> {
    pub(crate) fn new(bytes: &'a [u8], kvs: &'a [KvEntry], sorted: &'a [u32]) -> Self {
        Metadata { bytes, kvs, sorted }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.kvs.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.kvs.is_empty()
    }

    fn key_of(&self, e: &KvEntry) -> &'a str {
        // Keys were checked as UTF-8 by the parser.
        self.bytes
            .get(e.key.clone())
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    fn value_of(&self, e: &KvEntry) -> Option<Value<'a>> {
        let b = self.bytes.get(e.value.clone())?;
        match e.vtype {
            ValueType::String => Some(Value::String(GgufStr(b))),
            ValueType::Array => Some(Value::Array(Array {
                key: self.key_of(e),
                elem: e.elem,
                len: e.count,
                bytes: b,
            })),
            t => Value::scalar(t, b),
        }
    }

    /// Where each entry sits in the file, in file order: for readers that
    /// hand out views of the file's own bytes (gguf-py's `GGUFReader`
    /// fields, say) without parsing the header again.
    pub fn layout(&self) -> impl Iterator<Item = KvLayout<'a>> + '_ {
        self.kvs.iter().map(move |e| KvLayout {
            key: self.key_of(e),
            offset: e.key_offset,
            value_type: e.vtype,
            value: e.value.start as u64..e.value.end as u64,
            elem_type: (e.vtype == ValueType::Array).then_some(e.elem),
            count: e.count,
        })
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + '_ {
        self.kvs
            .iter()
            .filter_map(move |e| Some((self.key_of(e), self.value_of(e)?)))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        let k = self
            .sorted
            .binary_search_by(|&i| {
                let e = &self.kvs[i as usize];
                self.bytes
                    .get(e.key.clone())
                    .unwrap_or(&[])
                    .cmp(key.as_bytes())
            })
            .ok()?;
        self.value_of(&self.kvs[self.sorted[k] as usize])
    }

    getter! {
        /// A u8 value.
        get_u8, get_opt_u8 -> u8, U8, "u8";
        /// An i8 value.
        get_i8, get_opt_i8 -> i8, I8, "i8";
        /// A u16 value.
        get_u16, get_opt_u16 -> u16, U16, "u16";
        /// An i16 value.
        get_i16, get_opt_i16 -> i16, I16, "i16";
        /// A u32 value, such as `llama.block_count`.
        get_u32, get_opt_u32 -> u32, U32, "u32";
        /// An i32 value.
        get_i32, get_opt_i32 -> i32, I32, "i32";
        /// An f32 value.
        get_f32, get_opt_f32 -> f32, F32, "f32";
        /// A bool value.
        get_bool, get_opt_bool -> bool, Bool, "bool";
        /// A u64 value.
        get_u64, get_opt_u64 -> u64, U64, "u64";
        /// An i64 value.
        get_i64, get_opt_i64 -> i64, I64, "i64";
        /// An f64 value.
        get_f64, get_opt_f64 -> f64, F64, "f64";
        /// An array value.
        get_array, get_opt_array -> Array<'a>, Array, "array";
        /// A string value as raw bytes (not checked as UTF-8).
        get_gguf_str, get_opt_gguf_str -> GgufStr<'a>, String, "string";
    }

    /// A string value as `&str`.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], [`Error::WrongValueType`], or
    /// [`Error::InvalidUtf8`] naming the key.
    pub fn get_str(&self, key: &str) -> Result<&'a str> {
        self.get_opt_str(key)?.ok_or_else(|| not_found(key))
    }

    /// A string value as `&str`; `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`Error::WrongValueType`], or [`Error::InvalidUtf8`] naming the key.
    pub fn get_opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        let Some(s) = self.get_opt_gguf_str(key)? else {
            return Ok(None);
        };
        s.to_str().map(Some).ok_or_else(|| Error::InvalidUtf8 {
            what: format!("string value of key '{key}'"),
            offset: self.string_offset(key),
        })
    }

    /// An integer value stored as any of GGUF's integer types (u8 to i64),
    /// converted to `T`, the way runtimes read counts and sizes whatever
    /// width the converter chose.
    ///
    /// ```
    /// # use weightmap::gguf::{GgufHeader, OwnedValue, Writer};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.kv("llama.context_length", OwnedValue::U64(4096));
    /// w.kv("llama.rope.dimension_count", OwnedValue::I32(-1));
    /// let bytes = w.to_bytes();
    /// let file = GgufHeader::parse(&bytes)?;
    /// let md = file.metadata_in(&bytes);
    /// assert_eq!(md.get_int::<u32>("llama.context_length")?, 4096);
    /// assert_eq!(md.get_int::<i64>("llama.rope.dimension_count")?, -1);
    /// let e = md.get_int::<u32>("llama.rope.dimension_count").unwrap_err();
    /// assert_eq!(e.name(), "int_out_of_range");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::KeyNotFound`], [`Error::WrongValueType`] for a value that is
    /// not an integer (bool, float, string, array), or
    /// [`Error::IntOutOfRange`] naming the key, the value and `T`.
    pub fn get_int<T: MetaInt>(&self, key: &str) -> Result<T> {
        self.get_opt_int(key)?.ok_or_else(|| not_found(key))
    }

    /// [`Metadata::get_int`], with `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// As [`Metadata::get_int`], but never [`Error::KeyNotFound`].
    pub fn get_opt_int<T: MetaInt>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i128() {
                Some(i) => int_to(key, i).map(Some),
                None => Err(Error::WrongValueType {
                    key: key.to_owned(),
                    expected: "integer",
                    found: v.value_type().name(),
                }),
            },
        }
    }

    /// The model architecture, `general.architecture` ("llama", "qwen2", ...).
    ///
    /// # Errors
    /// As [`Metadata::get_str`] for `general.architecture`.
    pub fn architecture(&self) -> Result<&'a str> {
        self.get_str(ARCHITECTURE_KEY)
    }

    /// The architecture-specific key `"{arch}.{suffix}"`:
    /// `arch_key("context_length")` is `"llama.context_length"` in a llama file.
    ///
    /// # Errors
    /// As [`Metadata::architecture`].
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// [`Metadata::get_int`] of [`Metadata::arch_key`]`(suffix)`.
    ///
    /// ```
    /// # use weightmap::gguf::{GgufHeader, Writer};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.kv_str("general.architecture", "qwen2");
    /// w.kv_u32("qwen2.block_count", 24);
    /// let bytes = w.to_bytes();
    /// let file = GgufHeader::parse(&bytes)?;
    /// let md = file.metadata_in(&bytes);
    /// assert_eq!(md.arch_key("block_count")?, "qwen2.block_count");
    /// assert_eq!(md.arch_int::<usize>("block_count")?, 24);
    /// assert_eq!(md.arch_opt_int::<u64>("context_length")?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Metadata::architecture`] and [`Metadata::get_int`].
    pub fn arch_int<T: MetaInt>(&self, suffix: &str) -> Result<T> {
        self.get_int(&self.arch_key(suffix)?)
    }

    /// [`Metadata::get_opt_int`] of [`Metadata::arch_key`]`(suffix)`.
    ///
    /// # Errors
    /// As [`Metadata::architecture`] (a missing architecture is an error,
    /// not `None`) and [`Metadata::get_opt_int`].
    pub fn arch_opt_int<T: MetaInt>(&self, suffix: &str) -> Result<Option<T>> {
        self.get_opt_int(&self.arch_key(suffix)?)
    }

    /// [`Metadata::get_f32`] of [`Metadata::arch_key`]`(suffix)`, such as
    /// `attention.layer_norm_rms_epsilon`.
    ///
    /// # Errors
    /// As [`Metadata::architecture`] and [`Metadata::get_f32`].
    pub fn arch_f32(&self, suffix: &str) -> Result<f32> {
        self.get_f32(&self.arch_key(suffix)?)
    }

    /// [`Metadata::get_opt_f32`] of [`Metadata::arch_key`]`(suffix)`, such as
    /// `rope.freq_base`.
    ///
    /// # Errors
    /// As [`Metadata::architecture`] and [`Metadata::get_opt_f32`].
    pub fn arch_opt_f32(&self, suffix: &str) -> Result<Option<f32>> {
        self.get_opt_f32(&self.arch_key(suffix)?)
    }

    /// The layer count, `{arch}.block_count`, as any integer type.
    ///
    /// # Errors
    /// As [`Metadata::arch_int`].
    pub fn block_count(&self) -> Result<u32> {
        self.arch_int("block_count")
    }

    /// The training context length, `{arch}.context_length`.
    ///
    /// # Errors
    /// As [`Metadata::arch_int`].
    pub fn context_length(&self) -> Result<u64> {
        self.arch_int("context_length")
    }

    /// The embedding width, `{arch}.embedding_length`.
    ///
    /// # Errors
    /// As [`Metadata::arch_int`].
    pub fn embedding_length(&self) -> Result<u64> {
        self.arch_int("embedding_length")
    }

    /// A per-layer integer, as llama.cpp's `get_key_or_arr` reads it: either
    /// one integer for every layer, or an array of exactly `n_layers`
    /// integers (any integer types, each converted to `T`).
    ///
    /// ```
    /// # use weightmap::gguf::{GgufHeader, Writer};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.kv_u32("llama.attention.head_count", 8);
    /// w.kv_i32_array("llama.attention.head_count_kv", &[2, 2, 4]);
    /// let bytes = w.to_bytes();
    /// let file = GgufHeader::parse(&bytes)?;
    /// let md = file.metadata_in(&bytes);
    /// assert_eq!(md.per_layer::<u32>("llama.attention.head_count", 3)?, [8, 8, 8]);
    /// assert_eq!(md.per_layer::<u32>("llama.attention.head_count_kv", 3)?, [2, 2, 4]);
    /// let e = md.per_layer::<u32>("llama.attention.head_count_kv", 4).unwrap_err();
    /// assert_eq!(e.name(), "per_layer_length");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`Error::KeyNotFound`].
    /// - [`Error::WrongValueType`] for a value that is neither an integer nor
    ///   an array of integers.
    /// - [`Error::PerLayerLength`] for an array whose length is not `n_layers`.
    /// - [`Error::IntOutOfRange`] for a value (`key[i]` for an element) that
    ///   does not fit `T`.
    /// - [`Error::Alloc`] if the `n_layers` values cannot be allocated.
    pub fn per_layer<T: MetaInt>(&self, key: &str, n_layers: usize) -> Result<Vec<T>> {
        let wrong = |found: &'static str| Error::WrongValueType {
            key: key.to_owned(),
            expected: "integer or array of integers",
            found,
        };
        let value = self.get(key).ok_or_else(|| not_found(key))?;
        match value {
            Value::Array(a) => {
                if !a.elem.is_integer() {
                    return Err(wrong(array_name(a.elem)));
                }
                if a.len != n_layers as u64 {
                    return Err(Error::PerLayerLength {
                        key: key.to_owned(),
                        expected: n_layers as u64,
                        found: a.len,
                    });
                }
                // The length is the file's own element count, so the vector
                // is no larger than the bytes the array occupies times 8.
                a.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let x = v.as_i128().ok_or_else(|| wrong(array_name(a.elem)))?;
                        int_to(&format!("{key}[{i}]"), x)
                    })
                    .collect()
            }
            v => {
                let x = v.as_i128().ok_or_else(|| wrong(v.value_type().name()))?;
                let x: T = int_to(key, x)?;
                // `n_layers` may come from the file (`block_count`): try the
                // allocation rather than abort on a huge count.
                let mut out = Vec::new();
                out.try_reserve_exact(n_layers).map_err(|e| Error::Alloc {
                    size: n_layers.saturating_mul(std::mem::size_of::<T>()),
                    source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()),
                })?;
                out.resize(n_layers, x);
                Ok(out)
            }
        }
    }

    /// [`Metadata::per_layer`] of [`Metadata::arch_key`]`(suffix)` with
    /// [`Metadata::block_count`] layers: `arch_per_layer::<u32>("attention.head_count_kv")`.
    ///
    /// # Errors
    /// As [`Metadata::block_count`] and [`Metadata::per_layer`].
    pub fn arch_per_layer<T: MetaInt>(&self, suffix: &str) -> Result<Vec<T>> {
        let n = self.block_count()?;
        let n = usize::try_from(n).map_err(|_| Error::IntOutOfRange {
            key: self.arch_key("block_count").unwrap_or_default(),
            value: i128::from(n),
            target: "usize",
        })?;
        self.per_layer(&self.arch_key(suffix)?, n)
    }

    fn string_offset(&self, key: &str) -> u64 {
        self.kvs
            .iter()
            .find(|e| self.key_of(e) == key)
            .map_or(0, |e| e.value.start as u64)
    }
}
