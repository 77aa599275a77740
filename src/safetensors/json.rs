//! The pass over a safetensors JSON header.
//!
//! A serde visitor reads the header once and builds weightmap's tensor table
//! as it goes: no `serde_json::Value` tree, no second parse into the
//! `safetensors` crate's types, no scan of the text for repeated keys. Each
//! entry is checked as soon as it has been read (dtype, element count and
//! byte size overflow, `data_offsets` against dtype × shape and against the
//! file).
//!
//! Two visitors do this. The strict one reads every value as the type it
//! must have and gives up at the first thing that is not right; names are
//! indexed (and a repeat found) when the table is finished. A header it
//! takes is valid, and read once. Only a header it gives up on is read
//! again, by the lenient visitor, to say what is wrong; that one looks up
//! each key in the names seen so far as it goes.
//!
//! The lenient visitors are lenient: a value of the wrong type is consumed whole and
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

use super::spec::{header_err, tensor_type, METADATA_KEY};
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
    /// The `__metadata__` map; `None` when the header has no such key.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Parse `text`, the JSON header, in one pass when it is valid.
///
/// A strict pass reads each value as the type it must have and gives up at
/// the first thing that is not right; a header it accepts is valid, and
/// its table is the answer. Only when it gives up does the lenient pass
/// (below) read the whole text again to find which error to report, so a
/// valid header is read once and an invalid one at most twice. Its values
/// are read by type, not through `deserialize_any`, which is markedly
/// slower on a header of many entries (BENCHMARKS.md, "Many tensors").
///
/// # Errors
/// [`Error::SafetensorsHeader`] for invalid JSON or a malformed entry,
/// [`Error::DuplicateTensor`] for a repeated tensor name, the typed size and
/// bounds errors of [`check_tensor`], [`Error::OutOfMemory`].
pub(super) fn parse(text: &str, bounds: Bounds) -> Result<Parsed> {
    if let Some(parsed) = parse_valid(text, bounds)? {
        return Ok(parsed);
    }
    parse_lenient(text, bounds)
}

/// The strict pass: `Ok(None)` when the header is not valid (the lenient
/// pass says why), an error only for a failed allocation.
fn parse_valid(text: &str, bounds: Bounds) -> Result<Option<Parsed>> {
    let mut b = Builder::new(bounds)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let read = de
        .deserialize_map(Strict {
            b: &mut b,
            shape: Vec::new(),
        })
        .and_then(|()| de.end());
    if let Some(e) = b.problems.fatal {
        return Err(e);
    }
    let clean = b.problems.repeat.is_none() && b.problems.first.is_none();
    Ok((read.is_ok() && clean).then_some(Parsed {
        tensors: b.tensors,
        metadata: b.metadata,
    }))
}

/// The lenient pass: reads everything, and reports the error of highest
/// precedence (see the module's documentation).
fn parse_lenient(text: &str, bounds: Bounds) -> Result<Parsed> {
    let mut b = Builder::new(bounds)?;
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
        metadata: b.metadata,
    })
}

/// The strict pass's reading of the header object: the same table as
/// [`Builder`]'s, but every value read as its type, and names left to be
/// indexed (and a repeat found) by [`TableBuilder::finish`].
struct Strict<'b> {
    b: &'b mut Builder,
    /// The shape being read, reused from entry to entry.
    shape: Vec<u64>,
}

/// Give up the strict pass (the message is never shown).
fn give_up<E: de::Error>() -> E {
    E::custom("not valid: read again leniently")
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let b = &mut *self.b;
        while let Some(key) = map.next_key_seed(Key)? {
            if key == METADATA_KEY {
                if b.seen_metadata {
                    return Err(give_up());
                }
                b.seen_metadata = true;
                // Small, and read leniently: its problems are recorded.
                match map.next_value_seed(As::<StringMap>::new(&mut b.problems, Under::Metadata))? {
                    Ok(StringMap(m)) => b.metadata = Some(m),
                    Err(_) => return Err(give_up()),
                }
            } else {
                let (dtype, offsets) = map.next_value_seed(StrictEntry {
                    shape: &mut self.shape,
                })?;
                let entry = EntryParts {
                    dtype,
                    shape: &self.shape,
                    offsets,
                };
                let (ty, nbytes) =
                    check_parts(&key, &entry, b.bounds).map_err(|_| give_up::<A::Error>())?;
                // Names are indexed by `TableBuilder::finish`, all at once
                // (as GGUF's are). A repeated name is then the only error
                // left, and it is the first repeat in text order, as the
                // lenient pass would report it.
                if let Err(e) = b
                    .tensors
                    .push_unindexed(&key, ty, entry.shape, offsets.0, nbytes)
                {
                    return Err(b.problems.stop(e));
                }
            }
            if b.problems.fatal.is_some()
                || b.problems.repeat.is_some()
                || b.problems.first.is_some()
            {
                return Err(give_up());
            }
        }
        Ok(())
    }
}

/// One tensor entry, strictly: exactly `dtype` (a name), `shape` (counts)
/// and `data_offsets` (two counts), each once, in any order. The shape goes
/// to `shape`; the dtype and the offsets are returned.
struct StrictEntry<'s> {
    shape: &'s mut Vec<u64>,
}

impl<'de> DeserializeSeed<'de> for StrictEntry<'_> {
    type Value = (Dtype, (u64, u64));

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StrictEntry<'_> {
    type Value = (Dtype, (u64, u64));

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Entry::WHAT)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut dtype, mut shape, mut offsets) = (None, false, None);
        while let Some(key) = map.next_key_seed(Key)? {
            match &*key {
                "dtype" if dtype.is_none() => {
                    let name: Cow<'de, str> = map.next_value_seed(Key)?;
                    let d = de::value::StrDeserializer::<de::value::Error>::new(&name);
                    dtype = Some(Dtype::deserialize(d).map_err(|_| give_up::<A::Error>())?);
                }
                "shape" if !shape => {
                    self.shape.clear();
                    map.next_value_seed(StrictDims(&mut *self.shape))?;
                    shape = true;
                }
                "data_offsets" if offsets.is_none() => {
                    let [begin, end] = map.next_value::<[u64; 2]>()?;
                    offsets = Some((begin, end));
                }
                // A repeat, or a field the lenient pass must look into.
                _ => return Err(give_up()),
            }
        }
        match (dtype, shape, offsets) {
            (Some(dtype), true, Some(offsets)) => Ok((dtype, offsets)),
            _ => Err(give_up()),
        }
    }
}

/// A shape, strictly: a list of counts, appended to the vector.
struct StrictDims<'s>(&'s mut Vec<u64>);

impl<'de> DeserializeSeed<'de> for StrictDims<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for StrictDims<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Dims::WHAT)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(d) = seq.next_element::<u64>()? {
            // The vector is reused: it grows only past the longest shape yet.
            self.0.try_reserve(1).map_err(|_| give_up::<A::Error>())?;
            self.0.push(d);
        }
        Ok(())
    }
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
    /// An empty table for a header within `bounds`.
    fn new(bounds: Bounds) -> Result<Builder> {
        Ok(Builder {
            bounds,
            tensors: TableBuilder::new(true, 0)?,
            metadata: None,
            seen_metadata: false,
            problems: Problems::default(),
        })
    }

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
fn check_tensor(name: &str, e: &Entry, b: Bounds) -> Result<(crate::types::TensorType, u64)> {
    let parts = EntryParts {
        dtype: e.dtype,
        shape: &e.shape,
        offsets: e.offsets,
    };
    check_parts(name, &parts, b)
}

/// An entry's fields, wherever they were read into.
struct EntryParts<'a> {
    dtype: Dtype,
    shape: &'a [u64],
    offsets: (u64, u64),
}

/// [`check_tensor`] of an entry's fields.
fn check_parts(
    name: &str,
    e: &EntryParts<'_>,
    b: Bounds,
) -> Result<(crate::types::TensorType, u64)> {
    let ty = tensor_type(name, e.dtype)?;
    let n_elements = e
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::size_overflow(name, "element count"))?;
    if n_elements % ty.block_size() != 0 {
        // A sub-byte dtype (F4, F6_*) whose elements do not fill whole bytes.
        return Err(header_err(format!(
            "tensor '{name}': dtype {:?} shape {:?} has {n_elements} elements, not a \
             whole number of bytes ({} elements to {} bytes)",
            e.dtype,
            e.shape,
            ty.block_size(),
            ty.type_size()
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BOUNDS: Bounds = Bounds {
        data_offset: 1000,
        data_len: 64,
        file_len: 1064,
    };

    /// What a pass makes of `text`: the finished table, or the error's text.
    fn outcome(
        p: Result<Parsed>,
    ) -> std::result::Result<(crate::tensor::TensorTable, Vec<(String, String)>), String> {
        let p = p.map_err(|e| e.to_string())?;
        let t = p
            .tensors
            .finish(BOUNDS.data_offset, BOUNDS.file_len)
            .map_err(|e| e.to_string())?;
        Ok((t, p.metadata.unwrap_or_default().into_iter().collect()))
    }

    #[test]
    fn the_strict_pass_takes_valid_headers_and_gives_up_on_the_rest() {
        let valid = [
            r#"{}"#,
            r#"{"__metadata__":{"a":"b"},"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
            r#"{"x":{"data_offsets":[0,16],"shape":[4],"dtype":"F32"},"y":{"dtype":"U8","shape":[],"data_offsets":[16,17]}}"#,
            // A repeated tensor name is left to `finish`.
            r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        ];
        for text in valid {
            assert!(parse_valid(text, BOUNDS).unwrap().is_some(), "{text}");
        }
        let e = r#""dtype":"U8","shape":[1],"data_offsets":[0,1]"#;
        let invalid = [
            format!(r#"{{"x":{{{e},"dtype":"U8"}}}}"#), // a repeated field
            // An unknown field: valid (the crate ignores them too), but only
            // the lenient pass looks into its value for repeated keys.
            format!(r#"{{"x":{{{e},"extra":1}}}}"#),
            r#"{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":["0",1]}}"#.into(),
            r#"{"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,2]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[99,100]}}"#.into(),
            r#"{"x":{"dtype":"U8","shape":[1]}}"#.into(),
            r#"{"x":[1]}"#.into(),
            r#"{"__metadata__":{"a":1}}"#.into(),
            r#"{"__metadata__":{},"__metadata__":{}}"#.into(),
            r#"{"__metadata__":{"a":"b","a":"c"}}"#.into(),
            r#"{"x":"#.into(),
        ];
        for (i, text) in invalid.iter().enumerate() {
            assert!(parse_valid(text, BOUNDS).unwrap().is_none(), "{text}");
            assert_eq!(outcome(parse(text, BOUNDS)).is_ok(), i == 1, "{text}");
        }
    }

    /// Pieces of a header: valid entries, and the ways one goes wrong.
    fn piece() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec!["a", "b", "c", "a\\u0062"]);
        let entry = (
            prop::sample::select(vec!["\"U8\"", "\"F32\"", "\"I4\"", "7", "\"F8_E4M3\""]),
            prop::sample::select(vec!["[1]", "[2,2]", "[]", "[-1]", "[1.5]", "{}", "[4]"]),
            prop::sample::select(vec![
                "[0,1]", "[0,4]", "[1,2]", "[0,16]", "[2,1]", "[0]", "[0,1,2]", "[60,80]", "\"x\"",
            ]),
            prop::sample::select(vec![
                "",
                ",\"dtype\":\"U8\"",
                ",\"z\":[1,{\"q\":1,\"q\":2}]",
                ",\"z\":null",
            ]),
            any::<bool>(),
        )
            .prop_map(|(d, s, o, extra, flip)| {
                if flip {
                    format!(r#"{{"data_offsets":{o},"shape":{s},"dtype":{d}{extra}}}"#)
                } else {
                    format!(r#"{{"dtype":{d},"shape":{s},"data_offsets":{o}{extra}}}"#)
                }
            });
        prop_oneof![
            4 => (name, entry).prop_map(|(n, e)| format!("\"{n}\":{e}")),
            1 => prop::sample::select(vec![
                r#""__metadata__":{"k":"v"}"#,
                r#""__metadata__":{"k":1}"#,
                r#""__metadata__":{"k":"v","k":"w"}"#,
                r#""__metadata__":[]"#,
            ])
            .prop_map(String::from),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the header, the two passes give the same answer: the
        /// strict pass only ever speeds up what the lenient one would say.
        #[test]
        fn strict_then_lenient_is_the_lenient_answer(pieces in prop::collection::vec(piece(), 0..5), cut in any::<bool>()) {
            let mut text = format!("{{{}}}", pieces.join(","));
            if cut && text.len() > 2 {
                text.truncate(text.len() - 2);
            }
            prop_assert_eq!(
                outcome(parse(&text, BOUNDS)),
                outcome(parse_lenient(&text, BOUNDS)),
                "{}", text
            );
        }
    }
}
