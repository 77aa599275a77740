//! The one pass over a safetensors JSON header.
//!
//! A serde visitor reads the header once and builds weightmap's tensor table
//! as it goes: no `serde_json::Value` tree, no second parse into the
//! `safetensors` crate's types, no scan of the text for repeated keys. Each
//! entry is checked as soon as it has been read (dtype, element count and
//! byte size overflow, `data_offsets` against dtype × shape and against the
//! file), and each key is looked up in a set of the names seen so far.
//!
//! The visitors are lenient: a value of the wrong type is consumed whole and
//! remembered as a problem rather than stopping the parse, so that which
//! error a header gets does not depend on where in the text the problems
//! are. In order of precedence: invalid JSON anywhere, then the first
//! repeated key (at any depth, in text order), then the first other problem
//! (in text order). Only a failed allocation stops the parse at once.
//!
//! The `safetensors` crate contributes its [`Dtype`]: the names it accepts,
//! its "unknown variant" message, and the bit sizes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use ::safetensors::Dtype;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

use super::{header_err, tensor_type, METADATA_KEY};
use crate::error::{Error, Result};
use crate::tensor::TableBuilder;

/// Where a header's entries must lie: the data section and the file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// Bytes from the data section to the end of the file.
    pub data_len: u64,
    /// The file's length.
    pub file_len: u64,
}

/// What one pass over the JSON found.
pub(super) struct Parsed {
    /// Every tensor, in the JSON's order, validated against [`Bounds`].
    pub tensors: TableBuilder,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
}

/// Parse `text`, the JSON header, in one pass.
///
/// # Errors
/// [`Error::SafetensorsHeader`] for invalid JSON or a malformed entry,
/// [`Error::DuplicateTensor`] for a repeated tensor name, the typed size and
/// bounds errors of [`check_tensor`], [`Error::OutOfMemory`].
pub(super) fn parse(text: &str, bounds: Bounds) -> Result<Parsed> {
    let mut b = Builder {
        bounds,
        tensors: TableBuilder::new(true, 0)?,
        metadata: None,
        seen_metadata: false,
        problems: Problems::default(),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let read = de.deserialize_map(&mut b).and_then(|()| de.end());
    let Problems {
        fatal,
        repeat,
        first,
    } = b.problems;
    if let Some(e) = fatal {
        return Err(e);
    }
    read.map_err(|e| header_err(format!("invalid JSON: {e}")))?;
    if let Some(e) = repeat.or(first) {
        return Err(e);
    }
    Ok(Parsed {
        tensors: b.tensors,
        metadata: b.metadata.unwrap_or_default(),
    })
}

/// The problems found so far.
#[derive(Default)]
struct Problems {
    /// An allocation failed: the parse stopped there.
    fatal: Option<Error>,
    /// The first repeated key.
    repeat: Option<Error>,
    /// The first other problem.
    first: Option<Error>,
}

impl Problems {
    fn repeat(&mut self, e: impl FnOnce() -> Error) {
        if self.repeat.is_none() {
            self.repeat = Some(e());
        }
    }

    fn invalid(&mut self, e: impl FnOnce() -> Error) {
        if self.first.is_none() {
            self.first = Some(e());
        }
    }

    /// Stop the parse with `e` (an allocation failure): the error serde
    /// carries out is a placeholder, `fatal` is what [`parse`] returns.
    fn stop<E: de::Error>(&mut self, e: Error) -> E {
        self.fatal = Some(e);
        E::custom("stopped")
    }
}

/// Which object a nested key is in, for the message about a repeat.
#[derive(Clone, Copy)]
enum Under<'a> {
    /// `__metadata__` or a value inside it.
    Metadata,
    /// The entry of this tensor or a value inside it.
    Tensor(&'a str),
}

impl Under<'_> {
    fn repeated(self, key: &str) -> Error {
        match self {
            Under::Metadata => header_err(format!("duplicate {METADATA_KEY} key '{key}'")),
            Under::Tensor(t) => header_err(format!("tensor '{t}': duplicate key '{key}'")),
        }
    }
}

/// The header object being read: the tensor table as far as it goes.
struct Builder {
    bounds: Bounds,
    /// Every valid entry read, in text order. After a problem the later
    /// entries are added by name only (to find repeats): the header will be
    /// rejected.
    tensors: TableBuilder,
    metadata: Option<BTreeMap<String, String>>,
    seen_metadata: bool,
    problems: Problems,
}

impl Builder {
    /// Add the entry of the tensor `name` (of hash `hash`, from
    /// [`TableBuilder::hash`]), as read.
    fn add(&mut self, name: &str, hash: u32, found: Lenient<Entry>) -> Result<()> {
        let checked = match found {
            Ok(entry) => match check_tensor(name, &entry, self.bounds) {
                // begin <= end <= data_len: within the file.
                Ok((ty, nbytes)) => Some((ty, entry.shape, entry.offsets.0, nbytes)),
                Err(e) => {
                    self.problems.invalid(|| e);
                    None
                }
            },
            Err(why) => {
                self.problems
                    .invalid(|| header_err(format!("tensor '{name}': {why}")));
                None
            }
        };
        let (ty, shape, offset, nbytes) =
            checked.unwrap_or((crate::types::TensorType::U8, Box::default(), 0, 0));
        if self
            .tensors
            .push(name, hash, ty, &shape, offset, nbytes)?
            .is_some()
        {
            self.problems.repeat(|| Error::DuplicateTensor {
                name: name.to_owned(),
            });
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for &mut Builder {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(Key)? {
            if key == METADATA_KEY {
                if self.seen_metadata {
                    self.problems
                        .repeat(|| header_err(format!("duplicate key '{METADATA_KEY}'")));
                }
                self.seen_metadata = true;
                let found =
                    map.next_value_seed(As::<StringMap>::new(&mut self.problems, Under::Metadata))?;
                match found {
                    Ok(StringMap(m)) => {
                        self.metadata.get_or_insert(m);
                    }
                    Err(why) => self.problems.invalid(|| {
                        header_err(format!("{METADATA_KEY}: {why} (expected a map of strings)"))
                    }),
                }
            } else {
                let name = key;
                let hash = match self.tensors.hash(&name) {
                    Ok(hash) => hash,
                    Err(e) => return Err(self.problems.stop(e)),
                };
                let found = map
                    .next_value_seed(As::<Entry>::new(&mut self.problems, Under::Tensor(&name)))?;
                if let Err(e) = self.add(&name, hash, found) {
                    return Err(self.problems.stop(e));
                }
            }
            if self.problems.fatal.is_some() {
                return Err(de::Error::custom("stopped"));
            }
        }
        Ok(())
    }
}

/// A key, borrowed from the text unless it has escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// A value read whole, or why it is not what was expected.
type Lenient<T> = std::result::Result<T, String>;

/// Why a value of the wrong type is not what `what` expects.
fn wrong(found: Unexpected<'_>, what: &'static str) -> String {
    struct Expected(&'static str);
    impl de::Expected for Expected {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    <de::value::Error as de::Error>::invalid_type(found, &Expected(what)).to_string()
}

/// A value weightmap reads from a header: what it accepts of each JSON type.
/// Each method returns `None` for a type it does not take; a value of the
/// right type that is still wrong is `Some(Err(why))`.
trait Expect<'de>: Sized {
    /// What the value should be, for messages ("a dtype name").
    const WHAT: &'static str;

    fn from_str(_: Cow<'de, str>) -> Option<Lenient<Self>> {
        None
    }

    fn from_u64(_: u64) -> Option<Lenient<Self>> {
        None
    }

    fn from_seq<A: SeqAccess<'de>>(
        seq: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        drain_seq(seq, p, under)?;
        Ok(None)
    }

    fn from_map<A: MapAccess<'de>>(
        map: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        drain_map(map, p, under)?;
        Ok(None)
    }
}

/// Reads any JSON value as a `T`, consuming it whole whatever it is.
struct As<'p, 'u, T> {
    p: &'p mut Problems,
    under: Under<'u>,
    t: PhantomData<T>,
}

impl<'p, 'u, T> As<'p, 'u, T> {
    fn new(p: &'p mut Problems, under: Under<'u>) -> Self {
        As {
            p,
            under,
            t: PhantomData,
        }
    }
}

impl<'de, T: Expect<'de>> DeserializeSeed<'de> for As<'_, '_, T> {
    type Value = Lenient<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Expect<'de>> Visitor<'de> for As<'_, '_, T> {
    type Value = Lenient<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::WHAT)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Err(wrong(Unexpected::Bool(v), T::WHAT)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Ok(Err(wrong(Unexpected::Signed(v), T::WHAT))),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(T::from_u64(v).unwrap_or_else(|| Err(wrong(Unexpected::Unsigned(v), T::WHAT))))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Err(wrong(Unexpected::Float(v), T::WHAT)))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(
            T::from_str(Cow::Borrowed(v))
                .unwrap_or_else(|| Err(wrong(Unexpected::Str(v), T::WHAT))),
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(T::from_str(Cow::Owned(v.to_owned()))
            .unwrap_or_else(|| Err(wrong(Unexpected::Str(v), T::WHAT))))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err(wrong(Unexpected::Unit, T::WHAT)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Ok(T::from_seq(seq, self.p, self.under)?
            .unwrap_or_else(|| Err(wrong(Unexpected::Seq, T::WHAT))))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Ok(T::from_map(map, self.p, self.under)?
            .unwrap_or_else(|| Err(wrong(Unexpected::Map, T::WHAT))))
    }
}

/// Any value at all, read and dropped; repeated keys in its objects are
/// still found.
struct Skip;

impl Expect<'_> for Skip {
    const WHAT: &'static str = "any value";

    fn from_str(_: Cow<'_, str>) -> Option<Lenient<Self>> {
        Some(Ok(Skip))
    }

    fn from_u64(_: u64) -> Option<Lenient<Self>> {
        Some(Ok(Skip))
    }
}

/// Read and drop the rest of a sequence.
fn drain_seq<'de, A: SeqAccess<'de>>(
    mut seq: A,
    p: &mut Problems,
    under: Under<'_>,
) -> Result<(), A::Error> {
    while seq.next_element_seed(As::<Skip>::new(p, under))?.is_some() {}
    Ok(())
}

/// Read and drop the rest of an object, finding a repeated key in it.
fn drain_map<'de, A: MapAccess<'de>>(
    mut map: A,
    p: &mut Problems,
    under: Under<'_>,
) -> Result<(), A::Error> {
    let mut keys: Vec<Cow<'de, str>> = Vec::new();
    while let Some(key) = map.next_key_seed(Key)? {
        // Any value will do: what it is does not matter.
        let _ = map.next_value_seed(As::<Skip>::new(p, under))?;
        if let Err(e) = crate::alloc::push(&mut keys, key, "the keys of a header object") {
            return Err(p.stop(e));
        }
    }
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        p.repeat(|| under.repeated(&w[1]));
    }
    Ok(())
}

/// `__metadata__`: a map of strings.
struct StringMap(BTreeMap<String, String>);

/// A string value.
struct Text<'de>(Cow<'de, str>);

impl<'de> Expect<'de> for Text<'de> {
    const WHAT: &'static str = "a string";

    fn from_str(s: Cow<'de, str>) -> Option<Lenient<Self>> {
        Some(Ok(Text(s)))
    }
}

impl<'de> Expect<'de> for StringMap {
    const WHAT: &'static str = "a map of strings";

    fn from_map<A: MapAccess<'de>>(
        mut map: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        let mut out = BTreeMap::new();
        let mut bad = None;
        while let Some(key) = map.next_key_seed(Key)? {
            let value = map.next_value_seed(As::<Text<'de>>::new(p, under))?;
            if out.contains_key(&*key) {
                p.repeat(|| under.repeated(&key));
            }
            match value {
                Ok(Text(v)) => {
                    out.insert(key.into_owned(), v.into_owned());
                }
                Err(why) => {
                    bad.get_or_insert_with(|| format!("key '{key}': {why}"));
                    // Kept for its key: a later repeat is still found.
                    out.insert(key.into_owned(), String::new());
                }
            }
        }
        Ok(Some(match bad {
            Some(why) => Err(why),
            None => Ok(StringMap(out)),
        }))
    }
}

/// One tensor's entry, read but not yet checked.
struct Entry {
    dtype: Dtype,
    shape: Box<[u64]>,
    offsets: (u64, u64),
}

impl<'de> Expect<'de> for Entry {
    const WHAT: &'static str = "a tensor entry {\"dtype\", \"shape\", \"data_offsets\"}";

    fn from_map<A: MapAccess<'de>>(
        mut map: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        while let Some(key) = map.next_key_seed(Key)? {
            // Each known field: where it goes, read as its type.
            let fresh = match &*key {
                "dtype" => field(&mut map, p, under, &mut dtype)?,
                "shape" => field(&mut map, p, under, &mut shape)?,
                "data_offsets" => field(&mut map, p, under, &mut offsets)?,
                // The safetensors crate ignores other fields; so does weightmap.
                _ => {
                    // Any value will do: what it is does not matter.
                    let _ = map.next_value_seed(As::<Skip>::new(p, under))?;
                    true
                }
            };
            if !fresh {
                p.repeat(|| under.repeated(&key));
            }
            if p.fatal.is_some() {
                return Err(de::Error::custom("stopped"));
            }
        }
        Ok(Some(take(dtype, "dtype").and_then(|DtypeName(dtype)| {
            let Dims(shape) = take(shape, "shape")?;
            let Offsets(offsets) = take(offsets, "data_offsets")?;
            Ok(Entry {
                dtype,
                shape,
                offsets,
            })
        })))
    }
}

/// Read the value of a field into `slot` the first time it appears.
/// Returns whether it was the first time.
fn field<'de, A: MapAccess<'de>, T: Expect<'de>>(
    map: &mut A,
    p: &mut Problems,
    under: Under<'_>,
    slot: &mut Option<Lenient<T>>,
) -> Result<bool, A::Error> {
    let value = map.next_value_seed(As::<T>::new(p, under))?;
    let fresh = slot.is_none();
    if fresh {
        *slot = Some(value);
    }
    Ok(fresh)
}

/// The value of the field `key`, or why there is none.
fn take<T>(slot: Option<Lenient<T>>, key: &str) -> Lenient<T> {
    match slot {
        None => Err(format!("missing field `{key}`")),
        Some(v) => v.map_err(|why| format!("{key}: {why}")),
    }
}

/// A dtype, by the `safetensors` crate's names.
struct DtypeName(Dtype);

impl<'de> Expect<'de> for DtypeName {
    const WHAT: &'static str = "a dtype name";

    fn from_str(s: Cow<'de, str>) -> Option<Lenient<Self>> {
        let d = de::value::StrDeserializer::<de::value::Error>::new(&s);
        Some(
            Dtype::deserialize(d)
                .map(DtypeName)
                .map_err(|e| e.to_string()),
        )
    }
}

/// A count or offset.
struct Count(u64);

impl Expect<'_> for Count {
    const WHAT: &'static str = "an unsigned integer";

    fn from_u64(v: u64) -> Option<Lenient<Self>> {
        Some(Ok(Count(v)))
    }
}

/// Read the counts of a sequence, the first bad one remembered.
fn counts<'de, A: SeqAccess<'de>>(
    mut seq: A,
    p: &mut Problems,
    under: Under<'_>,
    mut each: impl FnMut(usize, u64) -> Result<()>,
) -> Result<Lenient<usize>, A::Error> {
    let (mut n, mut bad) = (0usize, None);
    while let Some(v) = seq.next_element_seed(As::<Count>::new(p, under))? {
        match v {
            Ok(Count(v)) if bad.is_none() => {
                if let Err(e) = each(n, v) {
                    return Err(p.stop(e));
                }
            }
            Ok(_) => {}
            Err(why) => {
                bad.get_or_insert_with(|| format!("element {n}: {why}"));
            }
        }
        n = n.saturating_add(1);
    }
    Ok(bad.map_or(Ok(n), Err))
}

/// `shape`: dimensions, outermost first.
struct Dims(Box<[u64]>);

impl<'de> Expect<'de> for Dims {
    const WHAT: &'static str = "a list of dimensions";

    fn from_seq<A: SeqAccess<'de>>(
        seq: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        // Most tensors have at most 4 dimensions, but a file decides how
        // many: the first few on the stack, the rest (if any) in a Vec, and
        // one allocation of the exact size for the table.
        const INLINE: usize = 8;
        let (mut inline, mut spill) = ([0u64; INLINE], Vec::new());
        let read = counts(seq, p, under, |i, d| match inline.get_mut(i) {
            Some(slot) => {
                *slot = d;
                Ok(())
            }
            None => crate::alloc::push(&mut spill, d, "a tensor's shape"),
        })?;
        let n = match read {
            Ok(n) => n,
            Err(why) => return Ok(Some(Err(why))),
        };
        let head = &inline[..n.min(INLINE)];
        if spill.is_empty() {
            return Ok(Some(Ok(Dims(head.into()))));
        }
        let mut all = match crate::alloc::with_capacity(n, "a tensor's shape") {
            Ok(all) => all,
            Err(e) => return Err(p.stop(e)),
        };
        all.extend_from_slice(head);
        all.extend_from_slice(&spill);
        Ok(Some(Ok(Dims(all.into_boxed_slice()))))
    }
}

/// `data_offsets`: `[begin, end]` in the data section.
struct Offsets((u64, u64));

impl<'de> Expect<'de> for Offsets {
    const WHAT: &'static str = "data offsets [begin, end]";

    fn from_seq<A: SeqAccess<'de>>(
        seq: A,
        p: &mut Problems,
        under: Under<'_>,
    ) -> Result<Option<Lenient<Self>>, A::Error> {
        let mut two = [0u64; 2];
        let read = counts(seq, p, under, |i, v| {
            if let Some(slot) = two.get_mut(i) {
                *slot = v;
            }
            Ok(())
        })?;
        Ok(Some(match read {
            Ok(2) => Ok(Offsets((two[0], two[1]))),
            Ok(n) => Err(format!("{n} values, expected data offsets [begin, end]")),
            Err(why) => Err(why),
        }))
    }
}

/// Check one entry against the file: its type, its size, and that
/// `data_offsets` hold exactly its bytes within the data section. Returns the
/// type and the byte size.
fn check_tensor(name: &str, e: &Entry, b: Bounds) -> Result<(crate::TensorType, u64)> {
    let ty = tensor_type(name, e.dtype)?;
    let n_elements = e
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::size_overflow(name, "element count"))?;
    let nbytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| Error::size_overflow(name, "byte size"))?;
    let (begin, end) = e.offsets;
    if end < begin {
        return Err(header_err(format!(
            "tensor '{name}': data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    if end - begin != nbytes {
        return Err(header_err(format!(
            "tensor '{name}': dtype {:?} shape {:?} needs {nbytes} bytes but data_offsets \
             [{begin}, {end}] hold {}",
            e.dtype,
            e.shape,
            end - begin
        )));
    }
    if end > b.data_len {
        let at = |x: u64| {
            b.data_offset
                .checked_add(x)
                .ok_or_else(|| Error::size_overflow(name, "offset + size"))
        };
        return Err(Error::TensorOutOfBounds {
            tensor: name.to_owned(),
            start: at(begin)?,
            end: at(end)?,
            file_len: b.file_len,
        });
    }
    Ok((ty, nbytes))
}
