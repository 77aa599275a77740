//! Deterministic synthetic models: llama-shaped GGUF or safetensors files of
//! a chosen size, for benchmarks and tests (what `weightmap gen` and
//! `weightmap bench` write).
//!
//! The layout follows a llama model: `token_embd.weight` (`[embd, vocab]` in
//! ggml order), then blocks of nine tensors (`blk.N.attn_norm`, `attn_q`,
//! `attn_k`, `attn_v`, `attn_output`, `ffn_norm`, `ffn_gate`, `ffn_up`,
//! `ffn_down`), then `output_norm.weight` (1-D) and `output.weight`. The
//! safetensors variant uses the Hugging Face names (`model.embed_tokens.weight`,
//! `model.layers.N.self_attn.q_proj.weight`, ..., `lm_head.weight`) and numpy
//! order shapes. Exactly [`GenSpec::tensors`] tensors are written: when the
//! count is not `3 + 9 × blocks`, the last block is partial.
//!
//! [`GenSpec::arch`] [`Arch::Gemma3`] writes a gemma-3-like model instead:
//! attention heads of 256 whose total width (`n_head × head_dim`) is twice
//! the embedding length, one KV head, thirteen tensors a block (adding
//! `attn_q_norm`, `attn_k_norm`, `post_attention_norm` and `post_ffw_norm`),
//! no `output.weight` (tied to `token_embd.weight`), and the `gemma3.*` keys
//! that describe it, `attention.key_length` and `value_length` among them.
//! It is for runtimes that must not assume `n_head × head_dim = n_embd`.
//!
//! The embedding length and feed-forward length are multiples of 256 (so
//! every `ne[0]` is a whole number of blocks of every ggml type), chosen so
//! that the total tensor bytes come as close to [`GenSpec::size`] as those
//! steps allow. A size below the smallest such model gives the smallest one;
//! the embedding length stops at 256 × 4096, so a huge size with very few
//! tensors falls short of it.
//!
//! Tensor bytes are pseudo-random (splitmix64, seeded per tensor from
//! [`GenSpec::seed`]): meaningless as numbers (float and quant scale fields
//! may hold NaN), but the same seed and spec always give the same file, byte
//! for byte. Data is produced in chunks of at most 4 MiB, never the whole
//! model or a whole tensor in memory; the file is
//! written under a unique temporary name next to `path` and renamed into
//! place (see [`generate`]).
//!
//! ```
//! use weightmap::{synth::{self, GenSpec}, Format, Header, TensorType};
//! # fn main() -> weightmap::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("small.gguf");
//! let spec = GenSpec {
//!     size: 2 << 20,
//!     tensors: 21,
//!     vocab: 500,
//!     types: vec![TensorType::F32, TensorType::Q4_K],
//!     ..GenSpec::default()
//! };
//! synth::generate(&spec, &path, &mut |_done, _total| {})?;
//! let header = Header::parse(&std::fs::read(&path).unwrap())?;
//! assert_eq!(header.format(), Format::Gguf);
//! assert_eq!(header.tensors().len(), 21);
//! # Ok(()) }
//! ```

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::outfile::OutFile;
use weightmap::gguf::ValueType;
use weightmap::gguf::{OwnedValue, Writer};
use weightmap::TensorType;
use weightmap::{Error, Result};
use weightmap::{Format, Header, Parse};

/// Bumped whenever the generator's output for a given spec changes, so that
/// caches keyed on the spec (as `weightmap bench` keeps) can tell stale files.
pub const GENERATOR_VERSION: u32 = 2;

/// What to generate.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct GenSpec {
    /// GGUF or safetensors.
    pub format: Format,
    /// Target total tensor bytes (headers and padding not counted).
    pub size: u64,
    /// Exact number of tensors.
    pub tensors: usize,
    /// Vocabulary size: the token embedding's and output's row count, and
    /// (GGUF) the length of the tokenizer arrays. Memory use while writing
    /// the GGUF header grows with it (a few dozen bytes per token).
    pub vocab: usize,
    /// Tensor types to use, cycled over the weight matrices. 1-D norms are
    /// F32 when F32 is listed; the token embedding takes the most compact
    /// type listed, the output the next. Types a format cannot hold are
    /// mapped: for GGUF, types without a ggml id become the ggml integer of
    /// the same width (`u8` → `i8`, ...); for safetensors, quantized types
    /// become F16, and other types it lacks become U8, F16 or F32 by width.
    /// An empty list means F32.
    pub types: Vec<TensorType>,
    /// GGUF: the data alignment (a power of two; not 32 is recorded as
    /// `general.alignment`). safetensors: the JSON header is padded with
    /// spaces (as the Python writer pads it to 8) so that the data section
    /// starts at a multiple of the larger of 8 and this.
    pub alignment: u64,
    /// Seed of the tensor bytes and of the tokens' shapes.
    pub seed: u64,
    /// The architecture imitated: tensor names, attention shapes, metadata.
    pub arch: Arch,
}

// Not derived: `weightmap bench` keys its model cache on this text, so a
// llama spec (every spec before `arch` existed) must print as it always did.
impl fmt::Debug for GenSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("GenSpec");
        s.field("format", &self.format)
            .field("size", &self.size)
            .field("tensors", &self.tensors)
            .field("vocab", &self.vocab)
            .field("types", &self.types)
            .field("alignment", &self.alignment)
            .field("seed", &self.seed);
        if self.arch != Arch::Llama {
            s.field("arch", &self.arch);
        }
        s.finish()
    }
}

/// The architecture a generated model imitates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arch {
    /// llama: nine tensors a block; heads of 64, together as wide as the
    /// embedding; a KV head per four query heads; an `output.weight`.
    #[default]
    Llama,
    /// gemma 3 (as llama.cpp writes gemma-3-270m): thirteen tensors a block
    /// with q/k and post norms; heads of 256, together twice as wide as the
    /// embedding; one KV head; the output tied to the token embedding.
    Gemma3,
}

impl Arch {
    /// `general.architecture`, and the prefix of the architecture's keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// The attention for embedding length `e` (a multiple of 256).
    fn attention(self, e: u64) -> Attention {
        match self {
            // q is e wide and k, v e / 4: the shapes this generator has
            // always written.
            Arch::Llama => Attention {
                heads: e / 64,
                kv_heads: e / 256,
                head_dim: 64,
            },
            // gemma 3's head size; twice e so that q is never e wide (so a
            // runtime that assumes it is fails), one KV head as in
            // gemma-3-270m and 1b (any head count is a multiple of it).
            Arch::Gemma3 => Attention {
                heads: e / 128,
                kv_heads: 1,
                head_dim: 256,
            },
        }
    }

    /// The roles of one block's tensors, in file order.
    fn block(self) -> &'static [Role] {
        match self {
            Arch::Llama => &LLAMA_BLOCK,
            Arch::Gemma3 => &GEMMA3_BLOCK,
        }
    }

    /// The roles after the blocks: gemma 3 has no output matrix (llama.cpp
    /// uses the token embedding's).
    fn tail(self) -> &'static [Role] {
        match self {
            Arch::Llama => &[Role::OutputNorm, Role::Output],
            Arch::Gemma3 => &[Role::OutputNorm],
        }
    }
}

/// Attention dimensions: `heads` query heads and `kv_heads` key/value heads,
/// each `head_dim` wide (keys and values alike).
#[derive(Clone, Copy, Debug)]
struct Attention {
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
}

impl Attention {
    /// Width of the queries (`attn_q`'s `ne[1]`, `attn_output`'s `ne[0]`).
    fn q_width(self) -> u64 {
        self.heads * self.head_dim
    }

    /// Width of the keys and of the values (`attn_k`'s and `attn_v`'s `ne[1]`).
    fn kv_width(self) -> u64 {
        self.kv_heads * self.head_dim
    }
}

impl Default for GenSpec {
    /// A 512 MiB GGUF with 300 tensors, a 262,144-token vocabulary and mixed
    /// F32, F16, Q8_0, Q4_K and Q6_K tensors, aligned to 32.
    fn default() -> Self {
        GenSpec {
            format: Format::Gguf,
            size: 512 << 20,
            tensors: 300,
            vocab: 262_144,
            types: vec![
                TensorType::F32,
                TensorType::F16,
                TensorType::Q8_0,
                TensorType::Q4_K,
                TensorType::Q6_K,
            ],
            alignment: 32,
            seed: 0x5EED_5EED,
            arch: Arch::Llama,
        }
    }
}

/// The shapes [`generate`] will write for a spec, from [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// Embedding length (a multiple of 256).
    pub embedding_length: u64,
    /// Feed-forward length (a multiple of 256).
    pub feed_forward_length: u64,
    /// Blocks (the last may be partial).
    pub block_count: u64,
    /// Tensors: name, type, dims in the file's order (ggml `ne[0]` first for
    /// GGUF, outermost first for safetensors), bytes; in file order.
    pub tensors: Vec<(String, TensorType, Vec<u64>, u64)>,
    /// Sum of the tensors' bytes.
    pub tensor_bytes: u64,
    /// Length of the file [`generate`] writes.
    pub file_size: u64,
}

/// Work out the shapes and file size for `spec` without writing anything.
///
/// # Errors
/// [`Error::InvalidAlignment`] if the alignment is not a power of two that
/// fits a u32; [`Error::TensorSizeOverflow`] if the shapes overflow.
pub fn plan(spec: &GenSpec) -> Result<Plan> {
    let layout = Layout::new(spec)?;
    let file_size = match spec.format {
        Format::Gguf => {
            let w = layout.gguf_writer(spec);
            gguf_file_len(&layout, &w, spec.alignment)
        }
        Format::Safetensors => {
            let h = layout.safetensors_header(spec)?;
            h.len() as u64 + layout.tensor_bytes
        }
    };
    Ok(Plan {
        embedding_length: layout.embd,
        feed_forward_length: layout.ff,
        block_count: layout.blocks,
        tensors: layout
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.to_owned(),
                    t.ty,
                    layout.file_dims(spec.format, t),
                    t.nbytes,
                )
            })
            .collect(),
        tensor_bytes: layout.tensor_bytes,
        file_size,
    })
}

/// Generate the model `spec` describes at `path`, calling
/// `progress(done, total)` with tensor bytes produced so far as it goes.
///
/// The file is written under a fresh temporary name in `path`'s directory
/// (created exclusively, never through a symlink), checked (its header is
/// parsed back with weightmap's own validating parser before the data is
/// written), then renamed over `path`. On any error the temporary file is
/// removed and `path` is left as it was. Memory use does not grow with the
/// tensors' sizes: data is produced and written in chunks of at most 4 MiB.
///
/// # Errors
/// As [`plan`]; [`Error::NotRegularDestination`] if `path` exists and is not
/// a regular file; [`Error::NoSpace`] if its file system lacks room for the
/// file; [`Error::Io`] for the file; any validation error if the header does
/// not parse back (a bug).
#[cfg(test)]
pub fn generate(
    spec: &GenSpec,
    path: impl AsRef<Path>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    generate_until(spec, path, progress, &AtomicBool::new(false))
}

/// [`generate`], stopping with [`Error::Interrupted`] (and the temporary
/// file removed) soon after `stop` becomes true: it is checked between
/// chunks, so a signal handler that only sets it is enough.
///
/// # Errors
/// As [`generate`], and [`Error::Interrupted`].
pub fn generate_until(
    spec: &GenSpec,
    path: impl AsRef<Path>,
    progress: &mut dyn FnMut(u64, u64),
    stop: &AtomicBool,
) -> Result<()> {
    let path = path.as_ref();
    let layout = Layout::new(spec)?;
    let out = OutFile::create(path)?;
    let result = write_file(spec, &layout, &out, progress, stop);
    if stop.load(Ordering::Relaxed) {
        // Whatever the write reported, the reason it stopped is the signal.
        return Err(Error::Interrupted { path: path.into() });
    }
    result?;
    out.commit()?;
    progress(layout.tensor_bytes, layout.tensor_bytes);
    Ok(())
}

/// The smallest total tensor bytes a model with `spec`'s tensor count,
/// vocabulary and types can have (embedding and feed-forward length 256):
/// a [`GenSpec::size`] below it still gives a model of this size.
///
/// # Errors
/// As [`plan`].
pub fn minimum_size(spec: &GenSpec) -> Result<u64> {
    Layout::new(&GenSpec {
        size: 0,
        ..spec.clone()
    })
    .map(|l| l.tensor_bytes)
}

/// The error a writer loop returns when `stop` was set.
fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "stopped by a signal")
}

fn write_file(
    spec: &GenSpec,
    layout: &Layout,
    out_file: &OutFile,
    progress: &mut dyn FnMut(u64, u64),
    stop: &AtomicBool,
) -> Result<()> {
    let tmp = out_file.tmp_path();
    let total = layout.tensor_bytes;
    progress(0, total);
    let header = match spec.format {
        Format::Gguf => {
            let w = layout.gguf_writer(spec);
            let (header, _) = w.header_bytes();
            (Some(w), header)
        }
        Format::Safetensors => (None, layout.safetensors_header(spec)?),
    };
    let file_len = match spec.format {
        Format::Gguf => (header.1.len() as u64).checked_add(layout.gguf_data_len(spec.alignment)),
        Format::Safetensors => (header.1.len() as u64).checked_add(total),
    }
    .ok_or_else(|| Error::TensorSizeOverflow {
        tensor: layout
            .tensors
            .first()
            .map_or_else(String::new, |t| t.name.to_owned()),
        what: "offset + size",
    })?;
    check_header(&header.1, file_len)?;
    // Refuse up front what the disk cannot hold, rather than fill it.
    out_file.ensure_space(file_len)?;
    let mut out = BufWriter::with_capacity(1 << 20, out_file.file());
    let mut done = 0u64;
    let mut filler: Option<(usize, Filler)> = None;
    match header {
        (Some(w), _) => {
            w.try_write_with(&mut out, |i, buf| {
                if stop.load(Ordering::Relaxed) {
                    return Err(stopped());
                }
                // Chunks of a tensor arrive in order, each but the last a
                // multiple of 8 bytes: one stream per tensor continues.
                if !matches!(filler, Some((j, _)) if j == i) {
                    filler = Some((i, Filler::for_tensor(spec.seed, i)));
                }
                if let Some((_, f)) = filler.as_mut() {
                    f.fill(buf);
                }
                done += buf.len() as u64;
                progress(done, total);
                Ok(())
            })
            .map_err(|e| Error::io("write", tmp, e))?;
        }
        (None, header) => {
            out.write_all(&header)
                .map_err(|e| Error::io("write", tmp, e))?;
            let mut chunk = vec![0u8; CHUNK.min(layout.max_tensor_bytes() as usize)];
            for (i, t) in layout.tensors.iter().enumerate() {
                let mut filler = Filler::for_tensor(spec.seed, i);
                let mut left = t.nbytes;
                while left > 0 {
                    if stop.load(Ordering::Relaxed) {
                        return Err(Error::io("write", tmp, stopped()));
                    }
                    let n = left.min(chunk.len() as u64) as usize;
                    filler.fill(&mut chunk[..n]);
                    out.write_all(&chunk[..n])
                        .map_err(|e| Error::io("write", tmp, e))?;
                    left -= n as u64;
                    done += n as u64;
                    progress(done, total);
                }
            }
        }
    }
    out.flush().map_err(|e| Error::io("write", tmp, e))?;
    Ok(())
}

/// Bytes of safetensors data produced and written at a time (a multiple of 8,
/// so chunked output equals whole-tensor output).
const CHUNK: usize = 4 << 20;

/// Parse a header we are about to write, against the file length it will
/// have: a generator bug surfaces as the parser's own error, before any data.
fn check_header(prefix: &[u8], file_len: u64) -> Result<()> {
    match Header::parse_prefix(prefix, file_len)? {
        Parse::Complete(_) => Ok(()),
        Parse::NeedMore { min_len: n } => Err(Error::Truncated {
            what: "generated header".into(),
            offset: prefix.len() as u64,
            needed: n.saturating_sub(prefix.len() as u64),
            file_len,
        }),
    }
}

fn gguf_file_len(layout: &Layout, w: &Writer, alignment: u64) -> u64 {
    w.header_bytes().0.len() as u64 + layout.gguf_data_len(alignment)
}

/// A splitmix64 stream: fast, deterministic, good enough to look random.
struct Filler(u64);

impl Filler {
    fn for_tensor(seed: u64, index: usize) -> Filler {
        let mut f = Filler(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        f.next();
        f
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fill `buf`; consecutive calls continue the stream as long as every
    /// buffer but the last is a multiple of 8 bytes.
    fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            rest.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }
    }
}

fn mix(seed: u64, i: u64) -> u64 {
    Filler(seed ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).next()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    TokEmbd,
    OutputNorm,
    Output,
    AttnNorm,
    Q,
    K,
    V,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
    // gemma 3's: RMS norms of each query and key head, and of the attention's
    // and the feed-forward's outputs.
    QNorm,
    KNorm,
    PostAttnNorm,
    PostFfwNorm,
}

const LLAMA_BLOCK: [Role; 9] = [
    Role::AttnNorm,
    Role::Q,
    Role::K,
    Role::V,
    Role::O,
    Role::FfnNorm,
    Role::Gate,
    Role::Up,
    Role::Down,
];

/// The tensors of a gemma 3 block, as llama.cpp's gemma3 loader names them.
const GEMMA3_BLOCK: [Role; 13] = [
    Role::AttnNorm,
    Role::Q,
    Role::K,
    Role::V,
    Role::QNorm,
    Role::KNorm,
    Role::O,
    Role::PostAttnNorm,
    Role::FfnNorm,
    Role::Gate,
    Role::Up,
    Role::Down,
    Role::PostFfwNorm,
];

impl Role {
    fn name(self, format: Format, arch: Arch, block: u64) -> String {
        let gguf = format == Format::Gguf;
        let (g, h) = match self {
            Role::TokEmbd => return pick(gguf, "token_embd.weight", "model.embed_tokens.weight"),
            Role::OutputNorm => return pick(gguf, "output_norm.weight", "model.norm.weight"),
            Role::Output => return pick(gguf, "output.weight", "lm_head.weight"),
            Role::AttnNorm => ("attn_norm", "input_layernorm"),
            Role::Q => ("attn_q", "self_attn.q_proj"),
            Role::K => ("attn_k", "self_attn.k_proj"),
            Role::V => ("attn_v", "self_attn.v_proj"),
            Role::O => ("attn_output", "self_attn.o_proj"),
            // Hugging Face's gemma 3 has a post_attention_layernorm of its own.
            Role::FfnNorm if arch == Arch::Gemma3 => ("ffn_norm", "pre_feedforward_layernorm"),
            Role::FfnNorm => ("ffn_norm", "post_attention_layernorm"),
            Role::Gate => ("ffn_gate", "mlp.gate_proj"),
            Role::Up => ("ffn_up", "mlp.up_proj"),
            Role::Down => ("ffn_down", "mlp.down_proj"),
            Role::QNorm => ("attn_q_norm", "self_attn.q_norm"),
            Role::KNorm => ("attn_k_norm", "self_attn.k_norm"),
            Role::PostAttnNorm => ("post_attention_norm", "post_attention_layernorm"),
            Role::PostFfwNorm => ("post_ffw_norm", "post_feedforward_layernorm"),
        };
        if gguf {
            format!("blk.{block}.{g}.weight")
        } else {
            format!("model.layers.{block}.{h}.weight")
        }
    }

    fn is_norm(self) -> bool {
        matches!(
            self,
            Role::OutputNorm
                | Role::AttnNorm
                | Role::FfnNorm
                | Role::QNorm
                | Role::KNorm
                | Role::PostAttnNorm
                | Role::PostFfwNorm
        )
    }

    /// ggml-order dims for embedding `e`, attention `a`, feed-forward `f`, vocab `v`.
    fn dims(self, e: u64, a: Attention, f: u64, v: u64) -> Vec<u64> {
        match self {
            Role::TokEmbd | Role::Output => vec![e, v],
            Role::OutputNorm
            | Role::AttnNorm
            | Role::FfnNorm
            | Role::PostAttnNorm
            | Role::PostFfwNorm => vec![e],
            Role::QNorm | Role::KNorm => vec![a.head_dim],
            Role::Q => vec![e, a.q_width()],
            Role::O => vec![a.q_width(), e],
            Role::K | Role::V => vec![e, a.kv_width()],
            Role::Gate | Role::Up => vec![e, f],
            Role::Down => vec![f, e],
        }
    }
}

fn pick(gguf: bool, g: &str, h: &str) -> String {
    if gguf { g } else { h }.to_owned()
}

struct PlannedTensor {
    name: String,
    ty: TensorType,
    ne: Vec<u64>,
    nbytes: u64,
}

struct Layout {
    arch: Arch,
    embd: u64,
    attention: Attention,
    ff: u64,
    blocks: u64,
    tensors: Vec<PlannedTensor>,
    tensor_bytes: u64,
}

/// Embedding lengths searched: 256 × 1 ..= 256 × MAX_STEPS.
const MAX_STEPS: u64 = 1 << 12;

impl Layout {
    fn new(spec: &GenSpec) -> Result<Layout> {
        if !spec.alignment.is_power_of_two() || spec.alignment > u64::from(u32::MAX) {
            return Err(Error::InvalidAlignment {
                alignment: usize::try_from(spec.alignment).unwrap_or(usize::MAX),
            });
        }
        let roles = roles(spec.tensors, spec.arch);
        let types = assign_types(spec, &roles);
        let v = spec.vocab as u64;
        // Total bytes for embedding step k and ff step m (both × 256), or None on overflow.
        let total = |k: u64, m: u64| -> Option<u64> {
            let (e, f) = (k * 256, m * 256);
            roles
                .iter()
                .zip(&types)
                .try_fold(0u64, |acc, ((role, _), ty)| {
                    let n = role
                        .dims(e, spec.arch.attention(e), f, v)
                        .iter()
                        .try_fold(1u64, |a, &d| a.checked_mul(d))?;
                    acc.checked_add(ty.bytes_for(n)?)
                })
        };
        let ideal_ff = |k: u64| (k * 8).div_ceil(3).max(1);
        let fits = |k: u64| total(k, ideal_ff(k)).is_some_and(|t| t <= spec.size);
        // Largest k whose llama-proportioned model fits (total grows with k).
        let (mut lo, mut hi) = (1u64, MAX_STEPS);
        let independent_of_embd = total(1, ideal_ff(1)) == total(MAX_STEPS, ideal_ff(MAX_STEPS));
        if !fits(1) || independent_of_embd {
            // Nothing fits, or nothing depends on the embedding length (no
            // tensors, or only empty ones): the smallest model.
            hi = 1;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        // Then, for that embedding length, the ff length that comes closest
        // (at least the llama proportion, since that fits).
        let k = lo;
        let solve_ff = || -> Option<u64> {
            let t1 = total(k, 1)?;
            let slope = total(k, 2)?.checked_sub(t1)?;
            if slope == 0 {
                return Some(ideal_ff(k));
            }
            let steps = spec.size.saturating_sub(t1).saturating_add(slope / 2) / slope;
            let m = steps.saturating_add(1).min(MAX_STEPS * 4);
            total(k, m).map(|_| m)
        };
        let Some(m) = solve_ff() else {
            return Err(Error::TensorSizeOverflow {
                tensor: roles
                    .first()
                    .map_or_else(String::new, |(r, b)| r.name(spec.format, spec.arch, *b)),
                what: "byte size",
            });
        };
        let (e, f) = (k * 256, m * 256);
        let attention = spec.arch.attention(e);
        let mut tensors = Vec::with_capacity(roles.len());
        let mut tensor_bytes = 0u64;
        for ((role, block), ty) in roles.iter().zip(&types) {
            let ne = role.dims(e, attention, f, v);
            // Cannot fail: `total` computed the same products without overflow.
            let nbytes = ne
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| ty.bytes_for(n))
                .unwrap_or(0);
            tensor_bytes += nbytes;
            tensors.push(PlannedTensor {
                name: role.name(spec.format, spec.arch, *block),
                ty: *ty,
                ne,
                nbytes,
            });
        }
        // Tensors outside the blocks: token_embd and the tail.
        let outside = 1 + spec.arch.tail().len();
        let blocks = if spec.tensors > outside {
            (spec.tensors - outside).div_ceil(spec.arch.block().len()) as u64
        } else {
            0
        };
        Ok(Layout {
            arch: spec.arch,
            embd: e,
            attention,
            ff: f,
            blocks,
            tensors,
            tensor_bytes,
        })
    }

    fn max_tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.nbytes)
            .max()
            .unwrap_or(0)
            .max(1)
    }

    fn file_dims(&self, format: Format, t: &PlannedTensor) -> Vec<u64> {
        let mut d = t.ne.clone();
        if format == Format::Safetensors {
            d.reverse();
        }
        d
    }

    fn gguf_writer(&self, spec: &GenSpec) -> Writer {
        let e = self.embd;
        let a = self.attention;
        let arch = self.arch.name();
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let u32v = |x: u64| u32::try_from(x).map_or(OwnedValue::U64(x), OwnedValue::U32);
        // Context, rope base and norm epsilon: llama 2's, or gemma-3-270m's.
        let (context, rope_base, eps) = match self.arch {
            Arch::Llama => (4096, 10000.0, 1e-5),
            Arch::Gemma3 => (32768, 1_000_000.0, 1e-6),
        };
        let mut w = Writer::new(spec.alignment);
        w.kv_str("general.architecture", arch)
            .kv_str("general.name", &format!("weightmap synthetic {arch}"))
            .kv("general.quantization_version", OwnedValue::U32(2))
            .kv(&key("block_count"), u32v(self.blocks))
            .kv(&key("context_length"), OwnedValue::U32(context))
            .kv(&key("embedding_length"), u32v(e))
            .kv(&key("feed_forward_length"), u32v(self.ff))
            .kv(&key("attention.head_count"), u32v(a.heads))
            .kv(&key("attention.head_count_kv"), u32v(a.kv_heads));
        if self.arch == Arch::Gemma3 {
            // The head size is not n_embd / n_head: files must say what it
            // is, as llama.cpp's gemma 3 files do. (Not written for llama,
            // whose output stays as it always was.)
            w.kv(&key("attention.key_length"), u32v(a.head_dim))
                .kv(&key("attention.value_length"), u32v(a.head_dim))
                .kv(&key("attention.sliding_window"), OwnedValue::U32(512));
        }
        w.kv(&key("rope.freq_base"), OwnedValue::F32(rope_base))
            .kv(&key("rope.dimension_count"), u32v(a.head_dim))
            .kv(
                &key("attention.layer_norm_rms_epsilon"),
                OwnedValue::F32(eps),
            )
            .kv(&key("vocab_size"), u32v(spec.vocab as u64))
            .kv_str("tokenizer.ggml.model", "llama");
        let vocab = Vocab { seed: spec.seed };
        w.kv(
            "tokenizer.ggml.tokens",
            OwnedValue::Array(
                ValueType::String,
                (0..spec.vocab)
                    .map(|i| OwnedValue::String(vocab.token(i)))
                    .collect(),
            ),
        );
        w.kv(
            "tokenizer.ggml.scores",
            OwnedValue::Array(
                ValueType::F32,
                (0..spec.vocab)
                    .map(|i| OwnedValue::F32(vocab.score(i)))
                    .collect(),
            ),
        );
        w.kv(
            "tokenizer.ggml.token_type",
            OwnedValue::Array(
                ValueType::I32,
                (0..spec.vocab)
                    .map(|i| OwnedValue::I32(vocab.token_type(i)))
                    .collect(),
            ),
        );
        for (key, id) in [
            ("tokenizer.ggml.unknown_token_id", 0u32),
            ("tokenizer.ggml.bos_token_id", 1),
            ("tokenizer.ggml.eos_token_id", 2),
        ] {
            if (id as usize) < spec.vocab {
                w.kv_u32(key, id);
            }
        }
        w.kv("weightmap.gen.seed", OwnedValue::U64(spec.seed))
            .kv_u32("weightmap.gen.version", GENERATOR_VERSION);
        for t in &self.tensors {
            w.tensor_deferred(&t.name, t.ty, &t.ne);
        }
        w
    }

    /// The 8-byte length and the JSON header, padded with spaces.
    fn safetensors_header(&self, spec: &GenSpec) -> Result<Vec<u8>> {
        use serde_json::{json, Map, Value};
        let mut meta = Map::new();
        for (k, v) in [
            ("format", "pt".to_owned()),
            ("generator", format!("weightmap gen v{GENERATOR_VERSION}")),
            ("architecture", self.arch.name().to_owned()),
            ("seed", spec.seed.to_string()),
            ("vocab_size", spec.vocab.to_string()),
            ("hidden_size", self.embd.to_string()),
            ("intermediate_size", self.ff.to_string()),
            ("num_hidden_layers", self.blocks.to_string()),
        ] {
            meta.insert(k.to_owned(), Value::String(v));
        }
        if self.arch == Arch::Gemma3 {
            // As for GGUF: the head size is not hidden_size / heads.
            let a = self.attention;
            for (k, v) in [
                ("num_attention_heads", a.heads),
                ("num_key_value_heads", a.kv_heads),
                ("head_dim", a.head_dim),
            ] {
                meta.insert(k.to_owned(), Value::String(v.to_string()));
            }
        }
        let mut root = Map::new();
        root.insert(
            weightmap::safetensors::SafetensorsHeader::METADATA_KEY.to_owned(),
            Value::Object(meta),
        );
        let mut off = 0u64;
        for t in &self.tensors {
            let dtype = match t.ty {
                TensorType::F32 => "F32",
                TensorType::F16 => "F16",
                TensorType::BF16 => "BF16",
                TensorType::I8 => "I8",
                _ => "U8",
            };
            let shape = self.file_dims(Format::Safetensors, t);
            root.insert(
                t.name.to_owned(),
                json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + t.nbytes]}),
            );
            off += t.nbytes;
        }
        let mut json =
            serde_json::to_vec(&Value::Object(root)).map_err(|e| Error::SafetensorsHeader {
                detail: format!("serializing the generated header: {e}"),
            })?;
        let pad = spec.alignment.max(8);
        let padded = (8 + json.len() as u64).next_multiple_of(pad) - 8;
        json.resize(padded as usize, b' ');
        let mut out = Vec::with_capacity(8 + json.len());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        Ok(out)
    }

    fn gguf_data_len(&self, alignment: u64) -> u64 {
        let mut off = 0u64;
        for t in &self.tensors {
            off = (off + t.nbytes).next_multiple_of(alignment);
        }
        off
    }
}

/// Roles in file order, with block numbers, for `n` tensors: the token
/// embedding, the blocks (the last one partial if need be), then the tail;
/// below `1 + tail` tensors, the first `n` of the token embedding and tail.
fn roles(n: usize, arch: Arch) -> Vec<(Role, u64)> {
    let (block, tail) = (arch.block(), arch.tail());
    let mut r = Vec::with_capacity(n);
    if n == 0 {
        return r;
    }
    r.push((Role::TokEmbd, 0));
    let in_blocks = n.saturating_sub(1 + tail.len());
    for i in 0..in_blocks {
        r.push((block[i % block.len()], (i / block.len()) as u64));
    }
    r.extend(tail.iter().take(n - 1 - in_blocks).map(|&t| (t, 0)));
    r
}

/// Map a type to one `format` can hold.
fn storable(ty: TensorType, format: Format) -> TensorType {
    match format {
        Format::Gguf if ty.ggml_id().is_some() => ty,
        Format::Gguf => match ty.type_size() {
            1 => TensorType::I8,
            2 => TensorType::I16,
            4 => TensorType::I32,
            _ => TensorType::I64,
        },
        Format::Safetensors => match ty {
            TensorType::F32
            | TensorType::F16
            | TensorType::BF16
            | TensorType::I8
            | TensorType::U8 => ty,
            t if t.is_quantized() => TensorType::F16,
            t => match t.type_size() {
                1 => TensorType::U8,
                2 => TensorType::F16,
                _ => TensorType::F32,
            },
        },
    }
}

/// Bytes per element, for ordering types by compactness.
fn density(ty: TensorType) -> f64 {
    ty.type_size() as f64 / ty.block_size() as f64
}

fn assign_types(spec: &GenSpec, roles: &[(Role, u64)]) -> Vec<TensorType> {
    let requested: Vec<TensorType> = if spec.types.is_empty() {
        vec![TensorType::F32]
    } else {
        spec.types.clone()
    };
    let mut by_density = requested.clone();
    by_density.sort_by(|a, b| density(*a).total_cmp(&density(*b)));
    by_density.dedup();
    let embd_ty = by_density[0];
    let out_ty = *by_density.get(1).unwrap_or(&embd_ty);
    let norm_f32 = requested.contains(&TensorType::F32);
    let mut k = 0usize;
    roles
        .iter()
        .map(|(role, _)| {
            let ty = match role {
                Role::TokEmbd => embd_ty,
                Role::Output => out_ty,
                r if r.is_norm() && norm_f32 => TensorType::F32,
                _ => {
                    k += 1;
                    requested[(k - 1) % requested.len()]
                }
            };
            storable(ty, spec.format)
        })
        .collect()
}

/// A deterministic SentencePiece-like vocabulary: `<unk>`, `<s>`, `</s>`,
/// 256 byte tokens `<0x00>`..`<0xFF>`, then words of two-character
/// syllables (some non-ASCII), about half with the `▁` word-start mark.
/// Every token is distinct.
struct Vocab {
    seed: u64,
}

const SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];
const FIRST_WORD: usize = 3 + 256;
const NON_ASCII_SYLLABLES: [&str; 12] = [
    "é", "ö", "ñu", "ça", "日本", "語学", "да", "не", "λα", "ση", "ün", "ß",
];

impl Vocab {
    fn syllable(d: usize) -> String {
        const C: &[u8] = b"bcdfghjklmnprstvwxyz";
        const V: &[u8] = b"aeiou";
        let ascii = C.len() * V.len();
        if d < ascii {
            let mut s = String::with_capacity(2);
            s.push(C[d / V.len()] as char);
            s.push(V[d % V.len()] as char);
            s
        } else {
            NON_ASCII_SYLLABLES[d - ascii].to_owned()
        }
    }

    fn token(&self, i: usize) -> String {
        if i < 3 {
            return SPECIALS[i].to_owned();
        }
        if i < FIRST_WORD {
            return format!("<0x{:02X}>", i - 3);
        }
        // Bijective base-B numeration of the word index over the syllables:
        // distinct indices give distinct syllable sequences.
        let base = 20 * 5 + NON_ASCII_SYLLABLES.len();
        let mut j = i - FIRST_WORD + 1;
        let mut digits = Vec::new();
        while j > 0 {
            j -= 1;
            digits.push(j % base);
            j /= base;
        }
        let mut s = String::new();
        if mix(self.seed, i as u64) % 8 < 5 {
            s.push('\u{2581}');
        }
        for d in digits.iter().rev() {
            s.push_str(&Self::syllable(*d));
        }
        s
    }

    fn score(&self, i: usize) -> f32 {
        if i < FIRST_WORD {
            0.0
        } else {
            -((i - FIRST_WORD) as f32)
        }
    }

    fn token_type(&self, i: usize) -> i32 {
        match i {
            0 => 2,             // unknown
            1 | 2 => 3,         // control
            3..FIRST_WORD => 6, // byte
            _ => 1,             // normal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use weightmap::Header;

    fn small(format: Format) -> GenSpec {
        GenSpec {
            format,
            size: 4 << 20,
            tensors: 40,
            vocab: 1000,
            seed: 7,
            ..GenSpec::default()
        }
    }

    fn gen_bytes(spec: &GenSpec, dir: &Path, name: &str) -> Vec<u8> {
        let path = dir.join(name);
        let mut calls = 0u64;
        let mut last = (0, 0);
        generate(spec, &path, &mut |d, t| {
            assert!(d <= t);
            calls += 1;
            last = (d, t);
        })
        .unwrap();
        assert!(calls >= 2);
        assert_eq!(last.0, last.1);
        let leftovers: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        std::fs::read(&path).unwrap()
    }

    #[test]
    fn gguf_small_parses_with_requested_shape() {
        let dir = tempfile::tempdir().unwrap();
        let spec = small(Format::Gguf);
        let bytes = gen_bytes(&spec, dir.path(), "m.gguf");
        let plan = plan(&spec).unwrap();
        assert_eq!(plan.file_size, bytes.len() as u64);
        let h = Header::parse(&bytes).unwrap();
        assert_eq!(h.format(), Format::Gguf);
        assert_eq!(h.tensors().len(), 40);
        assert_eq!(h.file_alignment(), 32);
        let md = h.gguf_metadata().unwrap();
        assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
        let tokens: Vec<String> = md
            .get_array("tokenizer.ggml.tokens")
            .unwrap()
            .strings()
            .unwrap()
            .map(|s| s.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(tokens.len(), 1000);
        assert_eq!(
            tokens.iter().collect::<BTreeSet<_>>().len(),
            1000,
            "tokens are distinct"
        );
        assert!(tokens.iter().any(|t| !t.is_ascii()));
        assert!(tokens[FIRST_WORD..]
            .iter()
            .all(|t| (2..=16).contains(&t.len())));
        assert_eq!(
            md.get_array("tokenizer.ggml.scores")
                .unwrap()
                .values::<f32>()
                .unwrap()
                .len(),
            1000
        );
        assert_eq!(
            md.get_array("tokenizer.ggml.token_type")
                .unwrap()
                .values::<i32>()
                .unwrap()
                .len(),
            1000
        );
        assert!(md.get_f32("llama.rope.freq_base").is_ok());
        let embd = md.get_u32("llama.embedding_length").unwrap() as u64;
        assert_eq!(md.get_u32("llama.block_count").unwrap(), 5); // 37 = 4 × 9 + 1
        let t0 = h.tensors().get(0).unwrap();
        assert_eq!(
            (t0.name, t0.shape),
            ("token_embd.weight", &[embd, 1000][..])
        );
        let on = h.tensors().get(38).unwrap();
        assert_eq!(
            (on.name, on.ty, on.shape),
            ("output_norm.weight", TensorType::F32, &[embd][..])
        );
        assert_eq!(h.tensors().get(39).unwrap().name, "output.weight");
        assert_eq!(h.tensors().get(37).unwrap().name, "blk.4.attn_norm.weight");
        let used: BTreeSet<_> = h.tensors().iter().map(|t| t.ty).collect();
        let wanted: BTreeSet<_> = spec.types.iter().copied().collect();
        assert_eq!(used, wanted);
        for t in h.tensors() {
            assert_eq!(t.shape[0] % 256, 0, "{}", t.name);
        }
        let total: u64 = h.tensors().iter().map(|t| t.nbytes).sum();
        assert_eq!(total, plan.tensor_bytes);
        let err = total.abs_diff(spec.size) as f64 / spec.size as f64;
        assert!(err < 0.1, "total {total} vs size {}", spec.size);
    }

    #[test]
    fn safetensors_small_parses_with_requested_shape() {
        let dir = tempfile::tempdir().unwrap();
        let spec = small(Format::Safetensors);
        let bytes = gen_bytes(&spec, dir.path(), "m.safetensors");
        assert_eq!(plan(&spec).unwrap().file_size, bytes.len() as u64);
        let st = weightmap::safetensors::SafetensorsHeader::parse(&bytes).unwrap();
        assert_eq!(st.data_offset() % 32, 0);
        assert_eq!(st.metadata()["vocab_size"], "1000");
        let h = Header::parse(&bytes).unwrap();
        assert_eq!(h.tensors().len(), 40);
        let e = h
            .tensors()
            .get(h.tensor_index("model.embed_tokens.weight").unwrap())
            .unwrap();
        assert_eq!(e.shape[0], 1000);
        let used: BTreeSet<_> = h.tensors().iter().map(|t| t.ty).collect();
        // Q8_0, Q4_K and Q6_K have no safetensors dtype: they become F16.
        assert_eq!(used, BTreeSet::from([TensorType::F32, TensorType::F16]));
        assert!(h
            .tensor_index("model.layers.3.mlp.down_proj.weight")
            .is_some());
        assert!(h.tensor_index("lm_head.weight").is_some());
        // Tensors are laid out in generation order, contiguously.
        let mut end = h.data_offset();
        for t in h.tensors() {
            assert_eq!(t.file_offset, end);
            end += t.nbytes;
        }
        assert_eq!(end, bytes.len() as u64);
    }

    #[test]
    fn same_seed_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for format in [Format::Gguf, Format::Safetensors] {
            let spec = GenSpec {
                size: 1 << 20,
                ..small(format)
            };
            let a = gen_bytes(&spec, dir.path(), "a");
            let b = gen_bytes(&spec, dir.path(), "b");
            assert!(a == b, "{format:?}: same seed, different bytes");
            let c = gen_bytes(&GenSpec { seed: 8, ..spec }, dir.path(), "c");
            assert!(a != c, "{format:?}: another seed, same bytes");
        }
    }

    #[test]
    fn tensor_counts_and_alignment() {
        let dir = tempfile::tempdir().unwrap();
        for n in [0, 1, 2, 3, 4, 12, 13] {
            for format in [Format::Gguf, Format::Safetensors] {
                let spec = GenSpec {
                    format,
                    size: 64 << 10,
                    tensors: n,
                    vocab: 10,
                    alignment: 8,
                    types: vec![TensorType::Q4_0, TensorType::BF16, TensorType::U8],
                    ..GenSpec::default()
                };
                let bytes = gen_bytes(&spec, dir.path(), "m");
                let h = Header::parse(&bytes).unwrap();
                assert_eq!(h.tensors().len(), n, "{format:?} {n}");
                if format == Format::Gguf {
                    assert_eq!(h.file_alignment(), 8);
                    // u8 has no ggml id: written as i8.
                    assert!(h.tensors().iter().all(|t| t.ty != TensorType::U8));
                }
            }
        }
    }

    #[test]
    fn degenerate_specs() {
        let none = GenSpec {
            tensors: 0,
            vocab: 0,
            ..GenSpec::default()
        };
        let p = plan(&none).unwrap();
        assert_eq!((p.embedding_length, p.tensor_bytes), (256, 0));
        let dir = tempfile::tempdir().unwrap();
        let err = generate(&none, dir.path(), &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, Error::NotRegularDestination { .. }), "{err}");
        // A huge target with three tensors: capped, not overflowing.
        let huge = GenSpec {
            size: u64::MAX,
            tensors: 3,
            vocab: 1,
            ..GenSpec::default()
        };
        assert_eq!(plan(&huge).unwrap().embedding_length, 256 * MAX_STEPS);
    }

    #[test]
    fn gemma3_attention_is_not_the_embedding_width() {
        let dir = tempfile::tempdir().unwrap();
        // Two whole blocks of 13, token_embd and output_norm.
        let spec = GenSpec {
            arch: Arch::Gemma3,
            tensors: 28,
            ..small(Format::Gguf)
        };
        let bytes = gen_bytes(&spec, dir.path(), "g.gguf");
        assert_eq!(plan(&spec).unwrap().file_size, bytes.len() as u64);
        let h = Header::parse(&bytes).unwrap();
        let md = h.gguf_metadata().unwrap();
        assert_eq!(md.architecture().unwrap(), "gemma3");
        assert_eq!(md.block_count().unwrap(), 2);
        let e = md.embedding_length().unwrap();
        let heads: u64 = md.arch_int("attention.head_count").unwrap();
        let kv: u64 = md.arch_int("attention.head_count_kv").unwrap();
        let k: u64 = md.arch_int("attention.key_length").unwrap();
        assert_eq!((k, kv, heads * k), (256, 1, 2 * e));
        let ne = |name: &str| {
            let i = h.tensor_index(name).unwrap_or_else(|| panic!("{name}"));
            h.tensors().get(i).unwrap().ne()
        };
        assert_eq!(ne("blk.1.attn_q.weight"), [e, 2 * e]);
        assert_eq!(ne("blk.1.attn_k.weight"), [e, 256]);
        assert_eq!(ne("blk.1.attn_output.weight"), [2 * e, e]);
        assert_eq!(ne("blk.1.attn_q_norm.weight"), [256]);
        assert_eq!(ne("blk.1.post_ffw_norm.weight"), [e]);
        assert_eq!(h.tensors().get(27).unwrap().name, "output_norm.weight");
        assert!(h.tensor_index("output.weight").is_none(), "tied output");
        // The Hugging Face names, gemma 3's norms among them.
        let st = GenSpec {
            format: Format::Safetensors,
            ..spec
        };
        let bytes = gen_bytes(&st, dir.path(), "g.safetensors");
        let h = Header::parse(&bytes).unwrap();
        for name in [
            "model.layers.1.self_attn.k_norm.weight",
            "model.layers.1.post_attention_layernorm.weight",
            "model.layers.1.pre_feedforward_layernorm.weight",
            "model.layers.1.post_feedforward_layernorm.weight",
        ] {
            assert!(h.tensor_index(name).is_some(), "{name}");
        }
        assert!(h.tensor_index("lm_head.weight").is_none());
    }

    #[test]
    fn a_llama_spec_prints_as_before_arch_existed() {
        // The cache key of `weightmap bench`: what the derived Debug printed.
        #[derive(Debug)]
        #[allow(dead_code)]
        struct GenSpec {
            format: Format,
            size: u64,
            tensors: usize,
            vocab: usize,
            types: Vec<TensorType>,
            alignment: u64,
            seed: u64,
        }
        let d = super::GenSpec::default();
        let before = GenSpec {
            format: d.format,
            size: d.size,
            tensors: d.tensors,
            vocab: d.vocab,
            types: d.types.clone(),
            alignment: d.alignment,
            seed: d.seed,
        };
        assert_eq!(format!("{d:?}"), format!("{before:?}"));
        assert_eq!(format!("{d:#?}"), format!("{before:#?}"));
        let g = super::GenSpec {
            arch: Arch::Gemma3,
            ..d
        };
        assert!(format!("{g:?}").ends_with(", arch: Gemma3 }"), "{g:?}");
    }

    #[test]
    fn bad_alignment_is_an_error() {
        for a in [0, 3, 1 << 40] {
            let spec = GenSpec {
                alignment: a,
                ..GenSpec::default()
            };
            assert!(matches!(plan(&spec), Err(Error::InvalidAlignment { .. })));
        }
    }

    #[test]
    fn default_plan_is_close_to_512_mib() {
        let spec = GenSpec::default();
        let p = plan(&spec).unwrap();
        assert_eq!(p.tensors.len(), 300);
        let err = p.tensor_bytes.abs_diff(spec.size) as f64 / spec.size as f64;
        assert!(err < 0.02, "{} vs {}", p.tensor_bytes, spec.size);
        let st = plan(&GenSpec {
            format: Format::Safetensors,
            ..spec.clone()
        })
        .unwrap();
        let err = st.tensor_bytes.abs_diff(spec.size) as f64 / spec.size as f64;
        assert!(err < 0.02, "{} vs {}", st.tensor_bytes, spec.size);
    }
}
