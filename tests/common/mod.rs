//! Test helpers: a raw GGUF byte builder that can write any bytes, valid or not.
//!
//! Two layers:
//!
//! * [`RawGguf`] appends little-endian fields one by one. Nothing is checked
//!   and nothing is derived: counts, lengths, type ids, dims and offsets are
//!   whatever the test passes, so it can express every malformed file
//!   (wrong counts, unknown type ids, lengths past the end, truncation at any
//!   byte with [`RawGguf::truncated`]).
//! * [`GgufSpec`] describes a *valid* file (keys, tensors, alignment) and
//!   [`GgufSpec::build`] lays it out the way ggml does: key/values, tensor
//!   descriptors, zero padding to the alignment, then each tensor's bytes at
//!   its aligned offset. Every field is public and can be overridden
//!   (`Tensor::offset`, `Tensor::n_dims`, `GgufSpec::tensor_count`, ...), so a
//!   test starts from a valid file and changes one thing. [`Built`] reports
//!   where everything landed, for truncation and byte-patching tests.
//!   Its layout of a valid file is the library writer's
//!   (`weightmap::gguf::Writer`) byte for byte, which
//!   `spec_layout_is_the_writers` in tests/gguf_rules.rs checks; a test that
//!   needs a valid file and no overrides or field offsets uses `Writer`.
//!
//! Value type ids are in [`vt`]; ggml tensor type ids are plain `u32`s (see
//! `weightmap::TensorType::ggml_id`) so that invalid ids can be written too.
//! Used by the GGUF rule, differential and hostile-file suites.
#![allow(dead_code)]

/// GGUF metadata value type ids, as stored in the file.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A few ggml tensor type ids used by tests.
pub mod tt {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const I8: u32 = 24;
    pub const Q2_0: u32 = 42;
}

/// Raw little-endian GGUF writer. Every method appends exactly the bytes it
/// names and returns `&mut Self` for chaining.
///
/// ```ignore
/// let mut r = RawGguf::new();
/// r.header(3, 0, 1).kv_raw(b"k", 13, &[0; 4]); // unknown value type 13
/// let bytes = r.into_bytes();
/// ```
#[derive(Clone, Debug, Default)]
pub struct RawGguf {
    /// Everything written so far.
    pub bytes: Vec<u8>,
}

impl RawGguf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Current length: the offset the next field will be written at.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    // ---- primitives ------------------------------------------------------

    /// Arbitrary bytes.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(b);
        self
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// A GGUF string: u64 length then the bytes (any bytes, not checked).
    pub fn string(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }

    /// A string whose length field says `claimed_len` whatever `s` holds.
    pub fn string_with_len(&mut self, claimed_len: u64, s: &[u8]) -> &mut Self {
        self.u64(claimed_len).raw(s)
    }

    /// `n` zero bytes.
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.bytes.resize(self.bytes.len() + n, 0);
        self
    }

    /// `n` copies of `byte`.
    pub fn fill(&mut self, n: usize, byte: u8) -> &mut Self {
        self.bytes.resize(self.bytes.len() + n, byte);
        self
    }

    /// Zero padding up to the next multiple of `align` (no-op if already aligned).
    pub fn pad_to(&mut self, align: usize) -> &mut Self {
        let n = (align - self.bytes.len() % align) % align;
        self.zeros(n)
    }

    // ---- header fields ---------------------------------------------------

    /// The four magic bytes (normally `b"GGUF"`).
    pub fn magic(&mut self, m: &[u8; 4]) -> &mut Self {
        self.raw(m)
    }

    /// Magic `GGUF`, `version`, then the two counts exactly as given.
    pub fn header(&mut self, version: u32, n_tensors: u64, n_kv: u64) -> &mut Self {
        self.magic(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }

    /// A key/value entry: key string, `type_id` (any u32) and `payload` as is.
    pub fn kv_raw(&mut self, key: &[u8], type_id: u32, payload: &[u8]) -> &mut Self {
        self.string(key).u32(type_id).raw(payload)
    }

    pub fn kv_u8(&mut self, key: &str, v: u8) -> &mut Self {
        self.kv_raw(key.as_bytes(), vt::U8, &[v])
    }

    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv_raw(key.as_bytes(), vt::U32, &v.to_le_bytes())
    }

    pub fn kv_i32(&mut self, key: &str, v: i32) -> &mut Self {
        self.kv_raw(key.as_bytes(), vt::I32, &v.to_le_bytes())
    }

    pub fn kv_u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.kv_raw(key.as_bytes(), vt::U64, &v.to_le_bytes())
    }

    /// A string value (any bytes).
    pub fn kv_str(&mut self, key: &str, v: &[u8]) -> &mut Self {
        self.string(key.as_bytes()).u32(vt::STRING).string(v)
    }

    /// An array header (element type id, count, both as given) followed by
    /// `payload` as is.
    pub fn kv_array(&mut self, key: &str, elem_type: u32, count: u64, payload: &[u8]) -> &mut Self {
        self.string(key.as_bytes())
            .u32(vt::ARRAY)
            .u32(elem_type)
            .u64(count)
            .raw(payload)
    }

    /// An array of strings with a correct count.
    pub fn kv_str_array(&mut self, key: &str, items: &[&[u8]]) -> &mut Self {
        let mut payload = RawGguf::new();
        for s in items {
            payload.string(s);
        }
        self.kv_array(key, vt::STRING, items.len() as u64, &payload.bytes)
    }

    /// A tensor descriptor whose `n_dims` is `dims.len()`.
    pub fn tensor(&mut self, name: &[u8], dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.tensor_raw(name, dims.len() as u32, dims, type_id, offset)
    }

    /// A tensor descriptor with an explicit `n_dims`, independent of how many
    /// `dims` follow (each written as a raw u64).
    pub fn tensor_raw(
        &mut self,
        name: &[u8],
        n_dims: u32,
        dims: &[u64],
        type_id: u32,
        offset: u64,
    ) -> &mut Self {
        self.string(name).u32(n_dims);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }

    // ---- output ----------------------------------------------------------

    /// A copy of the first `len` bytes (truncation at any byte).
    pub fn truncated(&self, len: usize) -> Vec<u8> {
        self.bytes[..len].to_vec()
    }

    /// Overwrite bytes at `at` (patching one field of a built file).
    pub fn patch(&mut self, at: usize, b: &[u8]) -> &mut Self {
        self.bytes[at..at + b.len()].copy_from_slice(b);
        self
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Pad `x` up to a multiple of `a` (saturating: layouts of absurd sizes stay absurd).
pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).saturating_mul(a)
}

/// Tensor data larger than this (or placed past it) is laid out but not
/// written: tests of huge sizes only need the descriptors.
pub const MAX_WRITTEN_DATA: u64 = 1 << 26;

/// One key/value of a [`GgufSpec`]: key bytes, value type id, payload bytes.
#[derive(Clone, Debug)]
pub struct Kv {
    pub key: Vec<u8>,
    pub type_id: u32,
    pub payload: Vec<u8>,
}

impl Kv {
    pub fn raw(key: &str, type_id: u32, payload: &[u8]) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            type_id,
            payload: payload.to_vec(),
        }
    }
    pub fn u8(key: &str, v: u8) -> Kv {
        Kv::raw(key, vt::U8, &[v])
    }
    pub fn u32(key: &str, v: u32) -> Kv {
        Kv::raw(key, vt::U32, &v.to_le_bytes())
    }
    pub fn i32(key: &str, v: i32) -> Kv {
        Kv::raw(key, vt::I32, &v.to_le_bytes())
    }
    pub fn u64(key: &str, v: u64) -> Kv {
        Kv::raw(key, vt::U64, &v.to_le_bytes())
    }
    pub fn f32(key: &str, v: f32) -> Kv {
        Kv::raw(key, vt::F32, &v.to_le_bytes())
    }
    pub fn bool(key: &str, v: u8) -> Kv {
        Kv::raw(key, vt::BOOL, &[v])
    }
    /// A string value of any bytes.
    pub fn string(key: &str, v: &[u8]) -> Kv {
        let mut p = RawGguf::new();
        p.string(v);
        Kv::raw(key, vt::STRING, &p.bytes)
    }
    /// An array of u32 with a correct count.
    pub fn u32_array(key: &str, v: &[u32]) -> Kv {
        let mut p = RawGguf::new();
        p.u32(vt::U32).u64(v.len() as u64);
        for &x in v {
            p.u32(x);
        }
        Kv::raw(key, vt::ARRAY, &p.bytes)
    }
    /// An array of strings with a correct count.
    pub fn str_array(key: &str, v: &[&str]) -> Kv {
        let mut p = RawGguf::new();
        p.u32(vt::STRING).u64(v.len() as u64);
        for s in v {
            p.string(s.as_bytes());
        }
        Kv::raw(key, vt::ARRAY, &p.bytes)
    }
}

/// One tensor of a [`GgufSpec`].
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: Vec<u8>,
    /// Written as `n_dims`; `None` means `dims.len()`.
    pub n_dims: Option<u32>,
    /// Written as raw u64s, ne[0] first.
    pub dims: Vec<u64>,
    /// ggml type id, written as is.
    pub type_id: u32,
    /// Data-section offset to write; `None` means the laid-out (aligned) one.
    pub offset: Option<u64>,
    /// Bytes of data to lay out and write; `None` means computed from the
    /// type and dims with weightmap's type table (0 if the type is unknown).
    pub nbytes: Option<u64>,
}

impl Tensor {
    pub fn new(name: &str, type_id: u32, dims: &[u64]) -> Tensor {
        Tensor {
            name: name.as_bytes().to_vec(),
            n_dims: None,
            dims: dims.to_vec(),
            type_id,
            offset: None,
            nbytes: None,
        }
    }

    /// Size from the type table (see [`Tensor::nbytes`]).
    pub fn size(&self) -> u64 {
        self.nbytes.unwrap_or_else(|| {
            let n = self
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d));
            n.and_then(|n| weightmap::TensorType::from_ggml_id(self.type_id)?.bytes_for(n))
                .unwrap_or(0)
        })
    }
}

/// A GGUF file to build. `GgufSpec::new()` is a valid empty v3 file; add
/// keys and tensors, then [`GgufSpec::build`].
#[derive(Clone, Debug)]
pub struct GgufSpec {
    pub magic: [u8; 4],
    pub version: u32,
    /// Tensor count to write; `None` means `tensors.len()`.
    pub tensor_count: Option<u64>,
    /// Key/value count to write; `None` means `kvs.len()`.
    pub kv_count: Option<u64>,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<Tensor>,
    /// Alignment used to lay out offsets and pad the header and data. It is
    /// NOT written as a key by itself: see [`GgufSpec::alignment_key`].
    pub layout_alignment: u64,
}

impl Default for GgufSpec {
    fn default() -> Self {
        GgufSpec {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            layout_alignment: 32,
        }
    }
}

/// Where things landed in a built file.
#[derive(Clone, Debug)]
pub struct Built {
    pub bytes: Vec<u8>,
    /// Offset of each key/value entry (its key-length field).
    pub kv_at: Vec<usize>,
    /// Offset of each tensor descriptor (its name-length field).
    pub tensor_desc_at: Vec<usize>,
    /// End of the last descriptor (the header proper).
    pub header_len: usize,
    /// Start of the data section.
    pub data_offset: usize,
    /// Each tensor's data-section offset as written.
    pub offsets: Vec<u64>,
    /// Each tensor's size as laid out.
    pub nbytes: Vec<u64>,
}

impl Built {
    /// Absolute end of tensor `i`'s bytes (for tensors that were written).
    pub fn tensor_end(&self, i: usize) -> usize {
        self.data_offset + (self.offsets[i] + self.nbytes[i]) as usize
    }

    /// The first `len` bytes.
    pub fn truncated(&self, len: usize) -> Vec<u8> {
        self.bytes[..len].to_vec()
    }
}

impl GgufSpec {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn kv(mut self, kv: Kv) -> Self {
        self.kvs.push(kv);
        self
    }

    pub fn tensor(mut self, t: Tensor) -> Self {
        self.tensors.push(t);
        self
    }

    /// Add `general.alignment` = `a` (u32) and lay out with it.
    pub fn alignment_key(mut self, a: u32) -> Self {
        self.kvs.push(Kv::u32("general.alignment", a));
        self.layout_alignment = u64::from(a);
        self
    }

    /// Lay the file out. Tensor data is a deterministic pattern that differs
    /// per tensor ([`pattern`]); header and inter-tensor padding is zero and
    /// the data section is padded at the end to the alignment, as ggml does.
    pub fn build(&self) -> Built {
        let a = self.layout_alignment;
        let mut r = RawGguf::new();
        r.magic(&self.magic)
            .u32(self.version)
            .u64(self.tensor_count.unwrap_or(self.tensors.len() as u64))
            .u64(self.kv_count.unwrap_or(self.kvs.len() as u64));
        let mut kv_at = Vec::new();
        for kv in &self.kvs {
            kv_at.push(r.len());
            r.kv_raw(&kv.key, kv.type_id, &kv.payload);
        }
        let mut tensor_desc_at = Vec::new();
        let mut offsets = Vec::new();
        let mut nbytes = Vec::new();
        let mut next = 0u64;
        for t in &self.tensors {
            tensor_desc_at.push(r.len());
            let size = t.size();
            let off = t.offset.unwrap_or(next);
            next = align_up(off.saturating_add(size), a);
            offsets.push(off);
            nbytes.push(size);
            r.tensor_raw(
                &t.name,
                t.n_dims.unwrap_or(t.dims.len() as u32),
                &t.dims,
                t.type_id,
                off,
            );
        }
        let header_len = r.len();
        r.pad_to(a as usize);
        let data_offset = r.len();
        for (i, (&off, &n)) in offsets.iter().zip(&nbytes).enumerate() {
            if off.saturating_add(n) > MAX_WRITTEN_DATA {
                continue;
            }
            let (start, end) = (data_offset + off as usize, data_offset + (off + n) as usize);
            if r.len() < end {
                r.bytes.resize(end, 0);
            }
            r.bytes[start..end].copy_from_slice(&pattern(i, n as usize));
        }
        r.pad_to(a as usize);
        Built {
            bytes: r.bytes,
            kv_at,
            tensor_desc_at,
            header_len,
            data_offset,
            offsets,
            nbytes,
        }
    }

    /// `build().bytes`.
    pub fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

/// The bytes [`GgufSpec::build`] writes for tensor `i`: never all zero, and
/// different for each tensor.
pub fn pattern(i: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|j| {
            (j as u8)
                .wrapping_mul(31)
                .wrapping_add(i as u8)
                .wrapping_add(1)
                | 1
        })
        .collect()
}

/// A valid file exercising most of the format: five keys of different
/// types (the first a 200-byte string, so truncations later in the header
/// leave the counts plausible) and three tensors, default alignment.
pub fn sample_spec() -> GgufSpec {
    GgufSpec::new()
        .kv(Kv::string("general.name", &[b'n'; 200]))
        .kv(Kv::u32("llama.block_count", 2))
        .kv(Kv::string("general.architecture", b"llama"))
        .kv(Kv::u32_array("test.u32_array", &[1, 2, 3, 4]))
        .kv(Kv::str_array(
            "tokenizer.ggml.tokens",
            &["<s>", "hello", "world"],
        ))
        .tensor(Tensor::new("token_embd.weight", tt::F32, &[4, 3]))
        .tensor(Tensor::new("blk.0.attn_q.weight", tt::Q4_0, &[32, 2]))
        .tensor(Tensor::new("output_norm.weight", tt::F16, &[5]))
}

// ---- files ggml refuses and weightmap's default rules accept ----------------

/// `prefix` followed by zeros up to `total` bytes, without touching the zeros.
pub fn zero_tail(prefix: &[u8], total: usize) -> Vec<u8> {
    let mut v = vec![0u8; total];
    v[..prefix.len()].copy_from_slice(prefix);
    v
}

/// One key whose value is `kind`'s oversized payload, then zeros: the
/// payload's bytes are the zero tail. `len` is the string length or
/// element count claimed.
pub fn big_kv_prefix(kind: &str, len: u64) -> (Vec<u8>, usize) {
    let mut r = RawGguf::new();
    r.header(3, 0, 1);
    let payload = match kind {
        "string" => {
            r.string(b"general.name").u32(vt::STRING).u64(len);
            len
        }
        "u8_array" => {
            r.string(b"big.u8").u32(vt::ARRAY).u32(vt::U8).u64(len);
            len
        }
        "string_in_array" => {
            r.string(b"tokenizer.ggml.tokens")
                .u32(vt::ARRAY)
                .u32(vt::STRING)
                .u64(1)
                .u64(len);
            len
        }
        _ => unreachable!(),
    };
    let total = r.len() + payload as usize;
    (r.into_bytes(), total)
}

pub fn big_kv(kind: &str, len: u64) -> Vec<u8> {
    let (prefix, total) = big_kv_prefix(kind, len);
    zero_tail(&prefix, total)
}

/// Two F32 tensors of 8 elements (32 bytes, one alignment unit each).
pub fn two_tensors(offset_a: u64, offset_b: u64) -> Vec<u8> {
    let mut a = Tensor::new("a", tt::F32, &[8]);
    a.offset = Some(offset_a);
    let mut b = Tensor::new("b", tt::F32, &[8]);
    b.offset = Some(offset_b);
    GgufSpec::new().tensor(a).tensor(b).bytes()
}

/// One F32 tensor of 3 elements (12 bytes) with the file cut right after
/// its data: 20 of its 32 - 12 padding bytes missing.
pub fn unpadded() -> Vec<u8> {
    let built = GgufSpec::new()
        .kv(Kv::string("general.architecture", b"llama"))
        .tensor(Tensor::new("t", tt::F32, &[3]))
        .build();
    built.truncated(built.tensor_end(0))
}

/// The committed GGUF fixtures in `testdata` (a folder), sorted.
pub fn gguf_fixtures(testdata: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<std::path::PathBuf> = std::fs::read_dir(testdata)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "the committed GGUF fixtures: {v:?}");
    v
}

/// Write `buf` at `offset` of the open `file`, in place (a positioned write
/// on every platform).
pub fn write_at(file: &std::fs::File, buf: &[u8], offset: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = file;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(buf).unwrap();
}

// ---- what a platform lets the tests observe of the page cache -------------

/// What this platform lets a test observe of the page cache, probed once
/// per test binary through the public API ([`page_cache_probe`]). Each is
/// `Ok`, or `Err` saying what was not honoured.
///
/// qemu-user 7.2 returns success for `MADV_WILLNEED` and
/// `MADV_POPULATE_READ` without doing them (it does pass `MADV_DONTNEED`
/// and `posix_fadvise` through); Windows cannot tell or drop a file's
/// cached pages (`evict` and `file_residency` return `Unsupported`) and its
/// residency is the working set; macOS cannot drop a file's pages either. A test keeps every byte-level assertion and
/// runs the ones about the page cache only where they can be observed.
#[derive(Debug)]
pub struct PageCacheProbe {
    /// `weightmap::evict` drops a file's clean pages, and
    /// `weightmap::file_residency` sees them come and go.
    pub files: Result<(), String>,
    /// `files`, and a mapping's pages follow the advice given to them:
    /// `Prefetch::Populate` makes a cold tensor resident before `load`
    /// returns, and `Weights::release` drops a tensor that was read, as
    /// `Weights::residency` tells.
    pub mapped: Result<(), String>,
}

/// The tensor the probe watches: 16 MiB of F32 after another 16 MiB, so
/// that the kernel's own read-ahead around the header does not reach it,
/// and a large folio shared with a neighbour at either edge is a small
/// part of it.
const PROBE_TENSOR: &str = "probe.weight";
const PROBE_BYTES: usize = 16 << 20;

/// The page-cache probe, run once per test binary.
pub fn page_cache_probe() -> &'static PageCacheProbe {
    static PROBE: std::sync::OnceLock<PageCacheProbe> = std::sync::OnceLock::new();
    PROBE.get_or_init(probe_page_cache)
}

/// Whether `evict` and `file_residency` work here; if not, print
/// `"{test}: page-cache assertions skipped: {why}"` and return false.
pub fn file_cache_observable(test: &str) -> bool {
    observable(test, &page_cache_probe().files)
}

/// Whether the page cache can be observed here both for files
/// ([`file_cache_observable`]) and for the pages of a mapping under advice
/// (populate, release); if not, print
/// `"{test}: page-cache assertions skipped: {why}"` and return false.
///
/// On Linux running natively (the kernel's architecture is the test's) a
/// failed probe is a failure, not a skip, so that a regression in
/// `evict`, `release` or the prefetch cannot turn these tests off; set
/// `WEIGHTMAP_TEST_NO_PAGE_CACHE=1` to skip where the kernel or the file
/// system really does not honour them (`TMPDIR` on tmpfs, for one).
pub fn page_cache_observable(test: &str) -> bool {
    let p = page_cache_probe();
    observable(test, &p.files) && observable(test, &p.mapped)
}

/// Whether `/proc/self/<file>` exists (`smaps`, `pagemap`: Linux and
/// Android, not under every emulator); if not, print
/// `"{test}: /proc/self/{file} assertions skipped: ..."` and return false.
pub fn proc_self_observable(test: &str, file: &str) -> bool {
    let path = format!("/proc/self/{file}");
    // Not on Windows, where Wine would find the Unix file on its `Z:` drive.
    if cfg!(unix) && std::path::Path::new(&path).exists() {
        return true;
    }
    print_skip(
        test,
        &format!("{path} assertions"),
        "it does not exist here",
    );
    false
}

fn observable(test: &str, probed: &Result<(), String>) -> bool {
    let Err(why) = probed else {
        return true;
    };
    if native_linux() && std::env::var_os("WEIGHTMAP_TEST_NO_PAGE_CACHE").is_none() {
        panic!(
            "{test}: the page cache cannot be observed on native Linux: {why} \
             (set WEIGHTMAP_TEST_NO_PAGE_CACHE=1 to skip these assertions where \
             the kernel or the file system does not honour this)"
        );
    }
    print_skip(test, "page-cache assertions", why);
    false
}

/// Print one skip line per test and reason. Written to stderr directly,
/// not through `eprintln!`, so that the test harness does not capture it.
fn print_skip(test: &str, what: &str, why: &str) {
    use std::io::Write;
    static PRINTED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let key = (test.to_owned(), why.to_owned());
    let mut printed = PRINTED.lock().unwrap_or_else(|e| e.into_inner());
    if !printed.contains(&key) {
        printed.push(key);
        let _ = writeln!(std::io::stderr().lock(), "{test}: {what} skipped: {why}");
    }
}

/// Whether this is Linux with a kernel of the test's own architecture, as
/// `/proc/sys/kernel/arch` names it: a user-mode emulator (qemu-user)
/// passes the host kernel's through. False where that cannot be read.
fn native_linux() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let Ok(arch) = std::fs::read_to_string("/proc/sys/kernel/arch") else {
        return false;
    };
    let (kernel, ours) = (arch.trim(), std::env::consts::ARCH);
    kernel == ours
        || (ours == "powerpc64" && kernel.starts_with("ppc64"))
        || (ours == "arm" && kernel.starts_with("arm"))
}

fn probe_page_cache() -> PageCacheProbe {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("a temporary directory for the probe");
    let data = pattern(1, PROBE_BYTES);
    let mut w = weightmap::gguf::Writer::new(32);
    w.tensor(
        "probe.head",
        weightmap::TensorType::F32,
        &[(PROBE_BYTES / 4) as u64],
        pattern(0, PROBE_BYTES),
    );
    w.tensor(
        PROBE_TENSOR,
        weightmap::TensorType::F32,
        &[(PROBE_BYTES / 4) as u64],
        data.clone(),
    );
    let bytes = w.to_bytes();
    let path = dir.path().join("probe.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    // Synced, so that its pages are clean and can be dropped.
    f.sync_all().unwrap();
    drop(f);
    let files = probe_files(&path, &bytes);
    let mapped = match &files {
        Ok(()) => probe_mapped(&path, &data),
        Err(why) => Err(why.clone()),
    };
    PageCacheProbe { files, mapped }
}

fn io_why(call: &str, e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::Unsupported {
        format!("{call}: unsupported on this platform ({e})")
    } else {
        format!("{call}: {e}")
    }
}

fn probe_files(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    use weightmap::{evict, file_residency};
    evict(path).map_err(|e| io_why("evict", e))?;
    assert_eq!(std::fs::read(path).unwrap(), bytes, "the probe file");
    let r = file_residency(path).map_err(|e| io_why("file_residency", e))?;
    if r.fraction() < 0.9 {
        return Err(format!("a file just read is not seen cached ({r:?})"));
    }
    evict(path).map_err(|e| io_why("evict", e))?;
    let r = file_residency(path).map_err(|e| io_why("file_residency", e))?;
    if r.fraction() > 0.1 {
        return Err(format!(
            "evicted pages stay cached (posix_fadvise ignored, or a file system \
             that keeps them, such as tmpfs): {r:?}"
        ));
    }
    Ok(())
}

/// On the cold file `path` (just evicted), whose one tensor is `data`.
fn probe_mapped(path: &std::path::Path, data: &[u8]) -> Result<(), String> {
    use weightmap::{LoadOptions, Prefetch, Weights};
    let opts = LoadOptions::default().prefetch(Prefetch::Populate);
    // SAFETY: the probe's file is private to it and not modified while loaded.
    let w = unsafe { Weights::load(path, &opts) }.expect("the probe file loads");
    let residency = |what: &str| {
        w.residency(PROBE_TENSOR)
            .map_err(|e| format!("residency {what}: {e}"))
            .map(|r| r.expect("mapped"))
    };
    let r = residency("after a populating load")?;
    if r.fraction() < 0.9 {
        return Err(format!(
            "populated pages are not resident (read advice ignored: \
             MADV_POPULATE_READ and MADV_WILLNEED, as under qemu-user): {r:?}"
        ));
    }
    let tensor = w.tensor(PROBE_TENSOR).unwrap();
    assert_eq!(tensor.to_vec().unwrap(), data, "the probe tensor's bytes");
    let r = residency("after reading every byte")?;
    if r.fraction() < 0.9 {
        return Err(format!("pages just read are not resident: {r:?}"));
    }
    w.release(PROBE_TENSOR)
        .map_err(|e| format!("release: {e}"))?;
    let r = residency("after release")?;
    if r.fraction() > 0.5 {
        return Err(format!(
            "released pages stay resident (MADV_DONTNEED ignored): {r:?}"
        ));
    }
    assert_eq!(
        tensor.to_vec().unwrap(),
        data,
        "the probe tensor read again"
    );
    Ok(())
}

/// The `VmFlags` of every mapping of this process that overlaps
/// `[addr, addr + len)`, with the part of the range each covers.
pub fn vm_flags(addr: usize, len: usize) -> Vec<(usize, usize, Vec<String>)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                cur = Some((a, b));
                continue;
            }
        }
        if let (Some(flags), Some((a, b))) = (line.strip_prefix("VmFlags:"), cur) {
            let (s, e) = (a.max(addr), b.min(addr + len));
            if s < e {
                out.push((s, e, flags.split_whitespace().map(str::to_owned).collect()));
            }
        }
    }
    out
}

/// Whether every mapping over `[addr, addr + len)` has (or, with `want`
/// false, lacks) the flag `flag`.
pub fn all_flagged(addr: usize, len: usize, flag: &str, want: bool) -> bool {
    let v = vm_flags(addr, len);
    !v.is_empty()
        && v.iter()
            .all(|(_, _, f)| f.iter().any(|x| x == flag) == want)
}
