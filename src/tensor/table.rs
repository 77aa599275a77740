//! The tensor table, shared by both formats: a compact table of
//! descriptors and the view of one of its entries.
//!
//! A header's tensors are stored column by column ([`TensorTable`]): every
//! name in one string, every dimension in one vector, and per tensor a
//! 24-byte entry and a type byte, with a hash index over the names. A
//! million tensors cost what their names and shapes do plus about 60 bytes
//! each, with no allocation per tensor; [`TensorInfo`] is the borrowed view
//! of one entry that the rest of the crate and its users read.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::types::TensorType;

/// One tensor as a weight file describes it: validated, a view into its
/// header's [`TensorTable`] (`Copy`, and as cheap to pass as a reference).
///
/// `shape` is in the file's own order: for GGUF that is ggml's `ne[0]`
/// first (the innermost, fastest-varying dimension); for safetensors it is
/// the numpy order (outermost first). [`TensorInfo::ne`] gives ggml order for
/// both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorInfo<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its element type.
    pub ty: TensorType,
    /// Its dimensions, in the file's order.
    pub shape: &'a [u64],
    /// Whether `shape` is outermost first (safetensors) rather than ggml's `ne[0]` first.
    pub outer_first: bool,
    /// Offset of its first byte from the start of the data section.
    pub offset: u64,
    /// Offset of its first byte from the start of the file.
    pub file_offset: u64,
    /// Its size in bytes.
    pub nbytes: u64,
}

impl TensorInfo<'_> {
    /// Number of elements (the product of the dimensions; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        // Validated at parse time not to overflow.
        self.shape.iter().product()
    }

    /// Elements per row: `ne[0]`, the innermost dimension (1 for a scalar).
    /// Computed from the shape in place, as row lookups call it each time.
    pub(crate) fn row_len(&self) -> u64 {
        let inner = if self.outer_first {
            self.shape.last()
        } else {
            self.shape.first()
        };
        inner.copied().unwrap_or(1)
    }

    /// Number of rows: the product of `ne[1..]` (1 for a vector or scalar).
    pub(crate) fn n_rows(&self) -> u64 {
        let outer = match (self.outer_first, self.shape.len()) {
            (_, 0) => &[][..],
            (true, n) => &self.shape[..n - 1],
            (false, _) => &self.shape[1..],
        };
        outer.iter().product()
    }

    /// Dimensions in ggml order, `ne[0]` (innermost) first.
    pub fn ne(&self) -> Vec<u64> {
        let mut v = self.shape.to_vec();
        if self.outer_first {
            v.reverse();
        }
        v
    }

    /// The absolute byte range `[file_offset, file_offset + nbytes)` in the file.
    pub fn file_range(&self) -> Range<u64> {
        self.file_offset..self.file_offset + self.nbytes
    }

    /// How many experts a mixture-of-experts tensor holds: its outermost
    /// dimension (ggml's `ne[2]` of an `ffn_*_exps` tensor, `ne[n - 1]` in
    /// general; the first of a safetensors shape), each expert's slice
    /// whole rows. 0 for a tensor of fewer than two dimensions, whose
    /// slices would not be whole rows.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, Header, TensorType};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// // 4 experts of 2 rows of 8 f32 each: ne = [8, 2, 4].
    /// w.tensor("ffn_up_exps", TensorType::F32, &[8, 2, 4], vec![0; 256]);
    /// let bytes = w.to_bytes();
    /// let header = Header::parse(&bytes)?;
    /// let t = header.tensors().get(0).unwrap();
    /// assert_eq!(t.experts(), 4);
    /// let third = t.expert_range(2).unwrap();
    /// assert_eq!(third.start - t.file_offset, 2 * 64);
    /// assert_eq!(third.end - third.start, 64);
    /// assert!(t.expert_range(4).is_none());
    /// # Ok(()) }
    /// ```
    pub fn experts(&self) -> u64 {
        let outer = if self.outer_first {
            self.shape.first()
        } else {
            self.shape.last()
        };
        match outer {
            // Zero experts hold zero bytes: no slice to give.
            Some(&n) if self.shape.len() >= 2 && n > 0 && self.nbytes % n == 0 => n,
            _ => 0,
        }
    }

    /// The absolute byte range in the file of expert `expert`'s slice (see
    /// [`TensorInfo::experts`]), or `None` past the last expert.
    pub fn expert_range(&self, expert: u64) -> Option<Range<u64>> {
        let n = self.experts();
        if expert >= n {
            return None;
        }
        // Inside the tensor's validated range, so none overflows.
        let each = self.nbytes / n;
        let start = self.file_offset + expert * each;
        Some(start..start + each)
    }
}

/// One tensor's columns, apart from its type. Its name and dimensions are
/// the arena ranges ending at `name_end` and `dims_end` and starting where
/// the previous entry's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    offset: u64,
    nbytes: u64,
    name_end: u32,
    dims_end: u32,
}

/// A header's tensor descriptors, in file order, indexed by name.
///
/// ```
/// use weightmap::{gguf::Writer, Header, TensorType};
/// # fn main() -> weightmap::Result<()> {
/// let mut w = Writer::new(32);
/// w.tensor("a", TensorType::F32, &[4], vec![0; 16]);
/// w.tensor("b", TensorType::F16, &[8, 2], vec![0; 32]);
/// let bytes = w.to_bytes();
/// let header = Header::parse(&bytes)?;
/// let table = header.tensors();
/// assert_eq!(table.len(), 2);
/// for t in table {
///     assert_eq!(table.find(t.name), Some(t));
/// }
/// assert_eq!(table.get(1).map(|t| t.shape), Some(&[8u64, 2][..]));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TensorTable {
    names: String,
    dims: Vec<u64>,
    entries: Vec<Entry>,
    types: Vec<TensorType>,
    outer_first: bool,
    /// Absolute offset of the data section: each entry's `offset` is from it.
    data_offset: u64,
    index: NameIndex,
}

impl PartialEq for TensorTable {
    fn eq(&self, other: &TensorTable) -> bool {
        // The index follows from the names (and its seed is random).
        self.names == other.names
            && self.dims == other.dims
            && self.entries == other.entries
            && self.types == other.types
            && self.outer_first == other.outer_first
            && self.data_offset == other.data_offset
    }
}

impl Eq for TensorTable {}

impl TensorTable {
    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `i`th tensor, in file order.
    pub fn get(&self, i: usize) -> Option<TensorInfo<'_>> {
        (i < self.len()).then(|| self.at(i))
    }

    /// Every tensor, in file order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            table: self,
            range: 0..self.len(),
        }
    }

    /// Index (in file order) of the tensor called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        let hash = self.index.hash(name);
        self.index.find(hash, |i| self.name(i) == name)
    }

    /// The tensor called `name`.
    pub fn find(&self, name: &str) -> Option<TensorInfo<'_>> {
        self.index_of(name).map(|i| self.at(i))
    }

    /// The `i`th tensor; panics past the end.
    pub(crate) fn at(&self, i: usize) -> TensorInfo<'_> {
        let e = self.entries[i];
        let (name, dims) = self.ranges(i);
        TensorInfo {
            name: &self.names[name],
            ty: self.types[i],
            shape: &self.dims[dims],
            outer_first: self.outer_first,
            offset: e.offset,
            // Checked in `TableBuilder::finish` not to overflow.
            file_offset: self.data_offset + e.offset,
            nbytes: e.nbytes,
        }
    }

    /// The `i`th tensor's [`TensorInfo::file_range`], from its entry alone.
    pub(crate) fn file_range(&self, i: usize) -> Range<u64> {
        let e = &self.entries[i];
        let start = self.data_offset + e.offset;
        start..start + e.nbytes
    }

    /// The type of the `i`th tensor.
    pub(crate) fn ty(&self, i: usize) -> TensorType {
        self.types[i]
    }

    /// The name of the `i`th tensor.
    pub(crate) fn name(&self, i: usize) -> &str {
        &self.names[self.ranges(i).0]
    }

    /// Where the `i`th tensor's name and dimensions are in the arenas.
    fn ranges(&self, i: usize) -> (Range<usize>, Range<usize>) {
        let e = &self.entries[i];
        let (n0, d0) = match i.checked_sub(1) {
            Some(p) => (self.entries[p].name_end, self.entries[p].dims_end),
            None => (0, 0),
        };
        (
            n0 as usize..e.name_end as usize,
            d0 as usize..e.dims_end as usize,
        )
    }

    /// A table holding `t` alone (for an owned copy of one tensor).
    pub(crate) fn of_one(t: TensorInfo<'_>) -> Result<TensorTable> {
        let mut b = TableBuilder::new(t.outer_first, 1)?;
        let hash = b.hash(t.name)?;
        b.push(t.name, hash, t.ty, t.shape, t.offset, t.nbytes)?;
        let mut table = b.table;
        table.data_offset = t.file_offset - t.offset;
        Ok(table)
    }

    /// Index every name added by `TableBuilder::push_unindexed`, in
    /// order; a name seen before is [`Error::DuplicateTensor`]. Each name's
    /// slot is fetched several entries ahead, so the misses overlap.
    fn index_rest(&mut self) -> Result<()> {
        const AHEAD: usize = 8;
        let t = self;
        let n = t.len();
        let first = t.index.len;
        t.index.reserve(n)?;
        let mut hashes = [0u32; AHEAD];
        for i in first..(first + AHEAD).min(n) {
            hashes[i % AHEAD] = t.index.hash(t.name(i));
            t.index.prefetch(hashes[i % AHEAD]);
        }
        for i in first..n {
            let hash = hashes[i % AHEAD];
            if i + AHEAD < n {
                let h = t.index.hash(t.name(i + AHEAD));
                t.index.prefetch(h);
                hashes[i % AHEAD] = h;
            }
            let name = t.name(i);
            if t.index.find(hash, |j| t.name(j) == name).is_some() {
                return Err(Error::DuplicateTensor {
                    name: name.to_owned(),
                });
            }
            t.index.insert(hash, i)?;
        }
        Ok(())
    }

    /// This table with its entries in data order: by offset, then by end
    /// (a zero-size tensor before one starting at the same offset), then by
    /// name. A table already in that order (as writers leave it) is returned
    /// as it is.
    pub(crate) fn into_data_order(self) -> Result<TensorTable> {
        let key = |i: usize| {
            let e = &self.entries[i];
            (e.offset, e.nbytes)
        };
        let in_order = |a: usize, b: usize| match key(a).cmp(&key(b)) {
            std::cmp::Ordering::Equal => self.name(a) <= self.name(b),
            o => o.is_lt(),
        };
        if (1..self.len()).all(|i| in_order(i - 1, i)) {
            return Ok(self);
        }
        let key = |i: usize| (key(i).0, key(i).1, self.name(i));
        let mut order = crate::alloc::index(self.len(), "the tensor order")?;
        order.sort_unstable_by(|&a, &b| key(a as usize).cmp(&key(b as usize)));
        let mut b = TableBuilder::new(self.outer_first, self.len())?;
        for &i in &order {
            let t = self.at(i as usize);
            let hash = b.hash(t.name)?;
            b.push(t.name, hash, t.ty, t.shape, t.offset, t.nbytes)?;
        }
        let mut out = b.table;
        out.data_offset = self.data_offset;
        Ok(out)
    }

    /// Reject tensors that share bytes, in any order. Zero-byte tensors
    /// occupy nothing. After sorting by start, if no tensor starts before
    /// the previous one ends, the ends increase too, so no two tensors
    /// overlap at all. Files list their tensors in offset order, which is
    /// checked first, so the sort is skipped.
    pub(crate) fn check_overlap(&self) -> Result<()> {
        let overlap = |a: usize, b: usize| {
            let (a, b) = (self.at(a), self.at(b));
            Error::TensorOverlap {
                tensor: b.name.to_owned(),
                start: b.file_offset,
                end: b.file_offset + b.nbytes,
                other: a.name.to_owned(),
            }
        };
        let mut prev: Option<(usize, u64)> = None;
        let mut sorted = true;
        for (i, e) in self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.nbytes > 0)
        {
            if let Some((p, end)) = prev {
                if e.offset < self.entries[p].offset {
                    sorted = false;
                    break;
                }
                if e.offset < end {
                    return Err(overlap(p, i));
                }
            }
            prev = Some((i, e.offset + e.nbytes));
        }
        if sorted {
            return Ok(());
        }
        let mut by_start: Vec<u32> = crate::alloc::with_capacity(self.len(), "the overlap check")?;
        by_start.extend((0..self.len() as u32).filter(|&i| self.entries[i as usize].nbytes > 0));
        by_start.sort_unstable_by_key(|&i| self.entries[i as usize].offset);
        for w in by_start.windows(2) {
            let (a, b) = (&self.entries[w[0] as usize], &self.entries[w[1] as usize]);
            if b.offset < a.offset + a.nbytes {
                return Err(overlap(w[0] as usize, w[1] as usize));
            }
        }
        Ok(())
    }
}

/// The tensors of a [`TensorTable`], in file order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    table: &'a TensorTable,
    range: Range<usize>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = TensorInfo<'a>;

    fn next(&mut self) -> Option<TensorInfo<'a>> {
        self.range.next().map(|i| self.table.at(i))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }

    fn nth(&mut self, n: usize) -> Option<TensorInfo<'a>> {
        self.range.nth(n).map(|i| self.table.at(i))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.range.next_back().map(|i| self.table.at(i))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl std::iter::FusedIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a TensorTable {
    type Item = TensorInfo<'a>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// A [`TensorTable`] being read, entry by entry.
pub(crate) struct TableBuilder {
    table: TensorTable,
}

/// [`Error::OutOfMemory`] for the tensor table.
fn table_oom(what: &'static str, bytes: usize) -> Error {
    Error::OutOfMemory {
        what,
        bytes: bytes as u64,
    }
}

impl TableBuilder {
    /// An empty table, with room for `expected` entries (a count the caller
    /// has bounded by the bytes left to read).
    pub(crate) fn new(outer_first: bool, expected: usize) -> Result<TableBuilder> {
        let mut entries = Vec::new();
        entries
            .try_reserve_exact(expected)
            .map_err(|_| table_oom("the tensor table", expected.saturating_mul(24)))?;
        let mut types = Vec::new();
        types
            .try_reserve_exact(expected)
            .map_err(|_| table_oom("the tensor table", expected))?;
        let mut index = NameIndex::default();
        index.reserve(expected)?;
        Ok(TableBuilder {
            table: TensorTable {
                names: String::new(),
                dims: Vec::new(),
                entries,
                types,
                outer_first,
                data_offset: 0,
                index,
            },
        })
    }

    /// Hash `name` for [`TableBuilder::push`], making room in the index for
    /// one more name and starting to fetch its slot: a caller that reads
    /// the rest of the entry meanwhile hides the cache miss.
    pub(crate) fn hash(&mut self, name: &str) -> Result<u32> {
        self.table
            .index
            .reserve(self.table.len().saturating_add(1))?;
        let hash = self.table.index.hash(name);
        self.table.index.prefetch(hash);
        Ok(hash)
    }

    /// Add a tensor: `name` of hash `hash` (from [`TableBuilder::hash`]),
    /// at `offset` from the data section. Returns the index of an earlier
    /// tensor of the same name, in which case nothing is added.
    pub(crate) fn push(
        &mut self,
        name: &str,
        hash: u32,
        ty: TensorType,
        shape: &[u64],
        offset: u64,
        nbytes: u64,
    ) -> Result<Option<usize>> {
        let t = &self.table;
        if let Some(j) = t.index.find(hash, |j| t.name(j) == name) {
            return Ok(Some(j));
        }
        let i = t.len();
        self.push_unindexed(name, ty, shape, offset, nbytes)?;
        self.table.index.insert(hash, i)?;
        Ok(None)
    }

    /// Add a tensor as [`TableBuilder::push`] does, but leave it out of the
    /// name index until [`TableBuilder::finish`]: for a reader with
    /// little work between one name and the next, which cannot hide the
    /// index's cache misses.
    pub(crate) fn push_unindexed(
        &mut self,
        name: &str,
        ty: TensorType,
        shape: &[u64],
        offset: u64,
        nbytes: u64,
    ) -> Result<()> {
        let t = &mut self.table;
        let i = t.len();
        let name_end = u32::try_from(t.names.len() + name.len())
            .map_err(|_| table_oom("the tensor names", t.names.len() + name.len()))?;
        let dims_end = u32::try_from(t.dims.len() + shape.len())
            .map_err(|_| table_oom("the tensor shapes", (t.dims.len() + shape.len()) * 8))?;
        let oom = |what, n| table_oom(what, n);
        t.names
            .try_reserve(name.len())
            .map_err(|_| oom("the tensor names", t.names.len() + name.len()))?;
        t.dims
            .try_reserve(shape.len())
            .map_err(|_| oom("the tensor shapes", (t.dims.len() + shape.len()) * 8))?;
        t.entries
            .try_reserve(1)
            .map_err(|_| oom("the tensor table", (i + 1) * 24))?;
        t.types
            .try_reserve(1)
            .map_err(|_| oom("the tensor table", i + 1))?;
        t.names.push_str(name);
        t.dims.extend_from_slice(shape);
        t.entries.push(Entry {
            offset,
            nbytes,
            name_end,
            dims_end,
        });
        t.types.push(ty);
        Ok(())
    }

    /// The table, its data section at `data_offset` in a file of
    /// `file_len` bytes. Every tensor must end within the file (llama.cpp's
    /// rule: its end, not its padding).
    ///
    /// # Errors
    /// [`Error::TensorSizeOverflow`], [`Error::TensorOutOfBounds`]; then, for
    /// names added unindexed, [`Error::DuplicateTensor`].
    pub(crate) fn finish(self, data_offset: u64, file_len: u64) -> Result<TensorTable> {
        let mut t = self.table;
        for (i, e) in t.entries.iter().enumerate() {
            let name = || t.name(i);
            let start = data_offset
                .checked_add(e.offset)
                .ok_or_else(|| Error::size_overflow(name(), "offset + size"))?;
            let end = start
                .checked_add(e.nbytes)
                .ok_or_else(|| Error::size_overflow(name(), "offset + size"))?;
            if end > file_len {
                return Err(Error::TensorOutOfBounds {
                    tensor: name().to_owned(),
                    start,
                    end,
                    file_len,
                });
            }
        }
        if t.index.len < t.len() {
            t.index_rest()?;
        }
        t.data_offset = data_offset;
        Ok(t)
    }
}

/// The names of a tensor table, indexed by hash.
///
/// An open-addressing table of `u64` slots, each a name's 32-bit hash (high
/// half) and its index in the table plus one (low half); 0 is an empty slot.
/// At most half full, so 8 to 16 bytes a name: a `HashMap<String, _>` (or
/// of 64-bit hashes to indices) costs 2 to 4 times that, and sorting the
/// names instead would take a large share of a load of many tensors
/// (BENCHMARKS.md, "Many tensors"). Names are compared only when their
/// hashes agree. The hash is keyed at random, so a file cannot aim for
/// collisions.
#[derive(Clone, Debug, Default)]
struct NameIndex {
    slots: Vec<u64>,
    len: usize,
    hasher: RandomState,
}

impl NameIndex {
    fn hash(&self, name: &str) -> u32 {
        // The low 32 bits, on purpose: they place the slot, and are kept in it.
        self.hasher.hash_one(name) as u32
    }

    /// Grow (by doubling, from 64 slots) until `n` names fit at most half full.
    fn reserve(&mut self, n: usize) -> Result<()> {
        let want = n.saturating_mul(2);
        if want <= self.slots.len() {
            return Ok(());
        }
        let mut size = self.slots.len().max(64);
        while size < want {
            size = size
                .checked_mul(2)
                .ok_or_else(|| table_oom("the tensor name index", usize::MAX))?;
        }
        let mut slots: Vec<u64> = crate::alloc::with_capacity(size, "the tensor name index")?;
        slots.resize(size, 0);
        let mask = size - 1;
        for &slot in self.slots.iter().filter(|&&s| s != 0) {
            let mut at = (slot >> 32) as usize & mask;
            while slots[at] != 0 {
                at = (at + 1) & mask;
            }
            slots[at] = slot;
        }
        self.slots = slots;
        Ok(())
    }

    /// Start fetching the slot of `hash`: a table of a million names is far
    /// larger than the cache, so a lookup would otherwise wait on memory
    /// (BENCHMARKS.md, "Many tensors").
    fn prefetch(&self, hash: u32) {
        let Some(slot) = self
            .slots
            .get(hash as usize & self.slots.len().wrapping_sub(1))
        else {
            return;
        };
        crate::os::prefetch_cache_line(slot);
    }

    /// The index of the name of hash `hash` for which `eq` holds.
    fn find(&self, hash: u32, eq: impl Fn(usize) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1; // a power of two
        let mut at = hash as usize & mask;
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                return None;
            }
            let i = (slot as u32 - 1) as usize;
            if (slot >> 32) as u32 == hash && eq(i) {
                return Some(i);
            }
            at = (at + 1) & mask;
        }
    }

    /// Remember tensor `i` under `hash`; the caller has checked it is new
    /// and reserved room for it.
    fn insert(&mut self, hash: u32, i: usize) -> Result<()> {
        let index = u32::try_from(i)
            .ok()
            .and_then(|i| i.checked_add(1))
            .ok_or_else(|| table_oom("the tensor name index", usize::MAX))?;
        self.reserve(self.len + 1)?;
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        while self.slots[at] != 0 {
            at = (at + 1) & mask;
        }
        self.slots[at] = u64::from(hash) << 32 | u64::from(index);
        self.len += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_counted_in_ggml_order_whatever_the_file_order() {
        let shapes: [&[u64]; 4] = [&[], &[7], &[3, 5], &[2, 3, 4]];
        for shape in shapes {
            for outer_first in [false, true] {
                let info = TensorInfo {
                    name: "t",
                    ty: TensorType::F32,
                    shape,
                    outer_first,
                    offset: 0,
                    file_offset: 0,
                    nbytes: 0,
                };
                let ne = info.ne();
                assert_eq!(info.row_len(), ne.first().copied().unwrap_or(1));
                assert_eq!(info.n_rows(), ne.iter().skip(1).product::<u64>());
            }
        }
    }

    fn build(names: &[&str]) -> Result<TensorTable> {
        let mut b = TableBuilder::new(false, 0)?;
        for (k, n) in names.iter().enumerate() {
            let h = b.hash(n)?;
            if let Some(j) = b.push(
                n,
                h,
                TensorType::F32,
                &[2, k as u64 + 1],
                64 * k as u64,
                8 * (k as u64 + 1),
            )? {
                return Err(Error::DuplicateTensor {
                    name: format!("{n} (first at {j})"),
                });
            }
        }
        b.finish(32, 1 << 20)
    }

    #[test]
    fn entries_read_back_with_their_names_shapes_and_offsets() {
        let names: Vec<String> = (0..1000).map(|i| format!("blk.{i}.w")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let t = build(&refs).unwrap();
        assert_eq!(t.len(), 1000);
        for (k, info) in t.iter().enumerate() {
            assert_eq!(info.name, names[k]);
            assert_eq!(info.shape, &[2, k as u64 + 1]);
            assert_eq!(info.offset, 64 * k as u64);
            assert_eq!(info.file_offset, 32 + 64 * k as u64);
            assert_eq!(info.nbytes, 8 * (k as u64 + 1));
            assert_eq!(t.index_of(&names[k]), Some(k));
        }
        assert_eq!(t.index_of("blk.1000.w"), None);
        assert_eq!(t.index_of(""), None);
        assert_eq!(t.iter().next_back().unwrap().name, "blk.999.w");
        assert_eq!(t.get(1000), None);
    }

    #[test]
    fn a_repeated_name_is_found_and_not_added() {
        let err = build(&["a", "b", "a"]).unwrap_err();
        assert!(
            matches!(&err, Error::DuplicateTensor { name } if name == "a (first at 0)"),
            "{err}"
        );
        // The empty name is a name like any other.
        assert!(build(&["", "x", ""]).is_err());
        assert!(build(&["", "x"]).is_ok());
    }

    #[test]
    fn finish_checks_every_end_against_the_file() {
        let mut b = TableBuilder::new(false, 1).unwrap();
        let h = b.hash("w").unwrap();
        b.push("w", h, TensorType::F32, &[4], 0, 16).unwrap();
        assert!(matches!(
            b.finish(100, 115),
            Err(Error::TensorOutOfBounds { end: 116, .. })
        ));
        let mut b = TableBuilder::new(false, 1).unwrap();
        let h = b.hash("w").unwrap();
        b.push("w", h, TensorType::F32, &[4], u64::MAX - 8, 16)
            .unwrap();
        assert!(matches!(
            b.finish(0, u64::MAX),
            Err(Error::TensorSizeOverflow { .. })
        ));
    }

    #[test]
    fn overlap_is_found_in_order_and_out_of_order() {
        let table = |spans: &[(u64, u64)]| {
            let mut b = TableBuilder::new(false, 0).unwrap();
            for (k, &(off, n)) in spans.iter().enumerate() {
                let name = format!("t{k}");
                let h = b.hash(&name).unwrap();
                b.push(&name, h, TensorType::U8, &[n], off, n).unwrap();
            }
            b.finish(0, 1 << 20).unwrap()
        };
        assert!(table(&[(0, 10), (10, 10), (20, 0), (20, 5)])
            .check_overlap()
            .is_ok());
        assert!(table(&[(20, 5), (0, 10), (10, 10)]).check_overlap().is_ok());
        // A zero-byte tensor inside another occupies nothing.
        assert!(table(&[(0, 10), (5, 0)]).check_overlap().is_ok());
        for spans in [
            &[(0, 10), (9, 10)][..],
            &[(30, 5), (0, 10), (9, 10)],
            &[(0, 100), (50, 1), (10, 1)],
        ] {
            let e = table(spans).check_overlap().unwrap_err();
            assert!(matches!(e, Error::TensorOverlap { .. }), "{spans:?}: {e}");
        }
    }
}
