//! GGUF header parse benchmark on a gemma-3-shaped header (gemma-3-270m:
//! 18 blocks, 236 tensors, a 262,144-token vocabulary), weightmap against
//! gguf-rs-lib on the same bytes. Only the header is built: the data section
//! is claimed (weightmap's `parse_prefix` takes the file length; gguf-rs-lib
//! reads through a `Read + Seek` that reports the same length), so both
//! parsers validate tensor ranges against a file of the real size.
//!
//! Before the benchmarks, `main` prints the memory one weightmap parse keeps
//! and touches: RssAnon growth from /proc/self/status, and exact heap bytes
//! from a counting allocator (live after the parse, and peak during it).
//!
//! Run: `cargo bench --bench parse -- --warm-up-time 1 --measurement-time 3`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

use criterion::{criterion_group, Criterion};
use gguf_rs_lib::reader::GGUFFileReader;
use weightmap::gguf::{GgufHeader, Parse};

// ---- a counting allocator (counts only while enabled) -----------------------

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn count(delta: isize) {
    if COUNTING.load(Relaxed) {
        let now = LIVE.fetch_add(delta, Relaxed) + delta;
        PEAK.fetch_max(now, Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as isize));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new as isize - l.size() as isize);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- the header --------------------------------------------------------------

#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn key(&mut self, k: &str, type_id: u32) {
        self.str(k);
        self.u32(type_id);
    }
}

const N_VOCAB: usize = 262_144;

/// Deterministic token strings, 1 to 13 bytes (about 7 on average), a
/// quarter starting with the 3-byte SentencePiece space "▁".
fn tokens() -> Vec<String> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,'-";
    (0..N_VOCAB)
        .map(|i| {
            if i < 256 {
                return format!("<0x{i:02X}>");
            }
            let r = next();
            let mut s = String::new();
            let mut len = 1 + (r % 12) as usize;
            if r >> 60 < 4 {
                s.push('▁');
                len = len.saturating_sub(2).max(1);
            }
            for k in 0..len {
                s.push(ALPHA[((r >> (8 + 4 * k)) % ALPHA.len() as u64) as usize] as char);
            }
            s
        })
        .collect()
}

struct Header {
    bytes: Vec<u8>,
    file_len: u64,
    n_tensors: usize,
    n_kv: usize,
    vocab_bytes: usize,
}

/// gemma-3-270m's header: ~30 keys, the tokenizer arrays, 236 tensors
/// (token_embd, output_norm and 13 per block), Q8_0 weights and F32 norms.
fn gemma3_header() -> Header {
    const EMBD: u64 = 640;
    const FF: u64 = 2048;
    const Q: u64 = 1024;
    const KV: u64 = 256;
    const HEAD: u64 = 256;
    const Q8_0: u32 = 8;
    const F32: u32 = 0;
    let toks = tokens();
    let vocab_bytes = toks.iter().map(String::len).sum();

    let mut kv = Out::default();
    let mut n_kv = 0;
    let mut add = |kv: &mut Out, k: &str, t: u32, payload: &dyn Fn(&mut Out)| {
        kv.key(k, t);
        payload(kv);
        n_kv += 1;
    };
    add(&mut kv, "general.architecture", 8, &|o| o.str("gemma3"));
    add(&mut kv, "general.type", 8, &|o| o.str("model"));
    add(&mut kv, "general.name", 8, &|o| o.str("Gemma 3 270m It"));
    add(&mut kv, "general.finetune", 8, &|o| o.str("it"));
    add(&mut kv, "general.basename", 8, &|o| o.str("gemma-3"));
    add(&mut kv, "general.size_label", 8, &|o| o.str("270M"));
    add(&mut kv, "general.license", 8, &|o| o.str("gemma"));
    add(&mut kv, "general.file_type", 4, &|o| o.u32(7));
    add(&mut kv, "general.quantization_version", 4, &|o| o.u32(2));
    add(&mut kv, "gemma3.context_length", 4, &|o| o.u32(32768));
    add(&mut kv, "gemma3.embedding_length", 4, &|o| {
        o.u32(EMBD as u32)
    });
    add(&mut kv, "gemma3.block_count", 4, &|o| o.u32(18));
    add(&mut kv, "gemma3.feed_forward_length", 4, &|o| {
        o.u32(FF as u32)
    });
    add(&mut kv, "gemma3.attention.head_count", 4, &|o| o.u32(4));
    add(&mut kv, "gemma3.attention.head_count_kv", 4, &|o| o.u32(1));
    add(&mut kv, "gemma3.attention.key_length", 4, &|o| {
        o.u32(HEAD as u32)
    });
    add(&mut kv, "gemma3.attention.value_length", 4, &|o| {
        o.u32(HEAD as u32)
    });
    add(&mut kv, "gemma3.attention.sliding_window", 4, &|o| {
        o.u32(512)
    });
    add(&mut kv, "gemma3.rope.freq_base", 6, &|o| {
        o.u32(1_000_000f32.to_bits())
    });
    add(
        &mut kv,
        "gemma3.attention.layer_norm_rms_epsilon",
        6,
        &|o| o.u32(1e-6f32.to_bits()),
    );
    add(&mut kv, "tokenizer.ggml.model", 8, &|o| o.str("llama"));
    add(&mut kv, "tokenizer.ggml.pre", 8, &|o| o.str("default"));
    add(&mut kv, "tokenizer.ggml.tokens", 9, &|o| {
        o.u32(8);
        o.u64(N_VOCAB as u64);
        for t in &toks {
            o.str(t);
        }
    });
    add(&mut kv, "tokenizer.ggml.scores", 9, &|o| {
        o.u32(6);
        o.u64(N_VOCAB as u64);
        for i in 0..N_VOCAB {
            o.u32((-(i as f32)).to_bits());
        }
    });
    add(&mut kv, "tokenizer.ggml.token_type", 9, &|o| {
        o.u32(5);
        o.u64(N_VOCAB as u64);
        for i in 0..N_VOCAB {
            o.u32(if i < 256 { 6 } else { 1 });
        }
    });
    for (k, v) in [
        ("tokenizer.ggml.bos_token_id", 2),
        ("tokenizer.ggml.eos_token_id", 106),
        ("tokenizer.ggml.unknown_token_id", 3),
        ("tokenizer.ggml.padding_token_id", 0),
    ] {
        add(&mut kv, k, 4, &|o| o.u32(v));
    }
    add(&mut kv, "tokenizer.ggml.add_bos_token", 7, &|o| o.0.push(1));
    add(&mut kv, "tokenizer.ggml.add_eos_token", 7, &|o| o.0.push(0));
    let template = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}".repeat(12);
    add(&mut kv, "tokenizer.chat_template", 8, &|o| o.str(&template));

    // Tensors, in gguf order, as (name, type, ne).
    let mut ts: Vec<(String, u32, Vec<u64>)> = vec![
        ("token_embd.weight".into(), Q8_0, vec![EMBD, N_VOCAB as u64]),
        ("output_norm.weight".into(), F32, vec![EMBD]),
    ];
    for b in 0..18 {
        let t = |n: &str, ty, ne: &[u64]| (format!("blk.{b}.{n}.weight"), ty, ne.to_vec());
        ts.extend([
            t("attn_norm", F32, &[EMBD]),
            t("attn_q", Q8_0, &[EMBD, Q]),
            t("attn_k", Q8_0, &[EMBD, KV]),
            t("attn_v", Q8_0, &[EMBD, KV]),
            t("attn_q_norm", F32, &[HEAD]),
            t("attn_k_norm", F32, &[HEAD]),
            t("attn_output", Q8_0, &[Q, EMBD]),
            t("post_attention_norm", F32, &[EMBD]),
            t("ffn_norm", F32, &[EMBD]),
            t("ffn_gate", Q8_0, &[EMBD, FF]),
            t("ffn_up", Q8_0, &[EMBD, FF]),
            t("ffn_down", Q8_0, &[FF, EMBD]),
            t("post_ffw_norm", F32, &[EMBD]),
        ]);
    }
    assert_eq!(ts.len(), 236);

    let mut h = Out::default();
    h.0.extend_from_slice(b"GGUF");
    h.u32(3);
    h.u64(ts.len() as u64);
    h.u64(n_kv as u64);
    h.0.extend_from_slice(&kv.0);
    let mut off = 0u64;
    for (name, ty, ne) in &ts {
        h.str(name);
        h.u32(ne.len() as u32);
        for &d in ne {
            h.u64(d);
        }
        h.u32(*ty);
        h.u64(off);
        let n: u64 = ne.iter().product();
        let size = if *ty == Q8_0 { n / 32 * 34 } else { n * 4 };
        off = (off + size).div_ceil(32) * 32;
    }
    let padded = h.0.len().div_ceil(32) * 32;
    h.0.resize(padded, 0);
    Header {
        file_len: padded as u64 + off,
        bytes: h.0,
        n_tensors: ts.len(),
        n_kv,
        vocab_bytes,
    }
}

/// The header bytes as a file of `len` bytes: reads past them give zeros.
struct ClaimedFile<'a> {
    bytes: &'a [u8],
    len: u64,
    pos: u64,
}

impl Read for ClaimedFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.len.saturating_sub(self.pos) as usize);
        let start = (self.pos as usize).min(self.bytes.len());
        let from_bytes = n.min(self.bytes.len() - start);
        buf[..from_bytes].copy_from_slice(&self.bytes[start..start + from_bytes]);
        buf[from_bytes..n].fill(0);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ClaimedFile<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::End(d) => self.len.checked_add_signed(d).unwrap(),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).unwrap(),
        };
        Ok(self.pos)
    }
}

fn parse_weightmap(h: &Header) -> GgufHeader {
    match GgufHeader::parse_prefix(&h.bytes, h.file_len).unwrap() {
        Parse::Complete(hdr) => hdr,
        Parse::NeedMore { min_len } => panic!("header incomplete, needs {min_len}"),
    }
}

fn parse_gguf_rs_lib(h: &Header) -> GGUFFileReader<ClaimedFile<'_>> {
    let f = ClaimedFile {
        bytes: &h.bytes,
        len: h.file_len,
        pos: 0,
    };
    GGUFFileReader::new(f).unwrap()
}

// ---- memory ---------------------------------------------------------------------

fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// (RssAnon growth KiB, heap live after, heap peak during) across one `parse`.
fn measure<T>(parse: impl FnOnce() -> T) -> (i64, isize, isize, T) {
    // Return freed heap to the OS so that reused pages do not hide growth.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    let before = rss_anon_kib();
    COUNTING.store(true, Relaxed);
    let out = black_box(parse());
    COUNTING.store(false, Relaxed);
    let after = rss_anon_kib();
    (
        after as i64 - before as i64,
        LIVE.load(Relaxed),
        PEAK.load(Relaxed),
        out,
    )
}

fn report_memory(h: &Header) {
    println!(
        "gemma-3 header: {} bytes, {} keys, {} tensors, {} tokens ({} token bytes, {:.2} avg), claimed file {} bytes",
        h.bytes.len(),
        h.n_kv,
        h.n_tensors,
        N_VOCAB,
        h.vocab_bytes,
        h.vocab_bytes as f64 / N_VOCAB as f64,
        h.file_len
    );
    let (rss, live, peak, hdr) = measure(|| parse_weightmap(h));
    let table: usize = hdr
        .tensors()
        .iter()
        .map(|t| std::mem::size_of_val(t) + t.name.len() + 8 * t.shape.len())
        .sum();
    println!(
        "weightmap parse:   RssAnon +{rss} KiB; heap live after {live} B, peak during {peak} B; tensor table ~{table} B"
    );
    drop(hdr);
    let (rss, live, peak, r) = measure(|| parse_gguf_rs_lib(h));
    println!(
        "gguf-rs-lib parse: RssAnon +{rss} KiB; heap live after {live} B, peak during {peak} B"
    );
    drop(r);
}

// ---- benchmarks -------------------------------------------------------------------

fn bench_parse(c: &mut Criterion) {
    let h = gemma3_header();
    // Both parsers see the same file.
    let wm = parse_weightmap(&h);
    let grl = parse_gguf_rs_lib(&h);
    assert_eq!(wm.tensors().len(), grl.tensor_count());
    assert_eq!(wm.kv_count(), grl.metadata().len());
    assert_eq!(wm.data_offset(), grl.tensor_data_offset());
    drop((wm, grl));

    let mut g = c.benchmark_group("gemma3_header");
    g.sample_size(20);
    g.bench_function("weightmap", |b| b.iter(|| parse_weightmap(black_box(&h))));
    g.bench_function("gguf_rs_lib", |b| {
        b.iter(|| parse_gguf_rs_lib(black_box(&h)))
    });
    g.finish();
}

criterion_group!(benches, bench_parse);

fn main() {
    report_memory(&gemma3_header());
    benches();
    Criterion::default().configure_from_args().final_summary();
}
