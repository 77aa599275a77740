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

use std::hint::black_box;
use std::io::{self, Read, Seek, SeekFrom};

use criterion::{criterion_group, Criterion};
use gguf_rs_lib::reader::GGUFFileReader;
use weightmap::gguf::GgufHeader;
use weightmap::gguf::{OwnedValue, Writer};
use weightmap::{Parse, TensorType};

// ---- the suite's counting allocator ------------------------------------------

#[path = "../tests/common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

// ---- the header --------------------------------------------------------------

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
    const Q8_0: TensorType = TensorType::Q8_0;
    const F32: TensorType = TensorType::F32;
    let toks = tokens();
    let vocab_bytes = toks.iter().map(String::len).sum();

    let mut w = Writer::new(32);
    for (k, v) in [
        ("general.architecture", "gemma3"),
        ("general.type", "model"),
        ("general.name", "Gemma 3 270m It"),
        ("general.finetune", "it"),
        ("general.basename", "gemma-3"),
        ("general.size_label", "270M"),
        ("general.license", "gemma"),
    ] {
        w.kv_str(k, v);
    }
    for (k, v) in [
        ("general.file_type", 7),
        ("general.quantization_version", 2),
        ("gemma3.context_length", 32768),
        ("gemma3.embedding_length", EMBD as u32),
        ("gemma3.block_count", 18),
        ("gemma3.feed_forward_length", FF as u32),
        ("gemma3.attention.head_count", 4),
        ("gemma3.attention.head_count_kv", 1),
        ("gemma3.attention.key_length", HEAD as u32),
        ("gemma3.attention.value_length", HEAD as u32),
        ("gemma3.attention.sliding_window", 512),
    ] {
        w.kv_u32(k, v);
    }
    w.kv("gemma3.rope.freq_base", OwnedValue::F32(1_000_000.0));
    w.kv(
        "gemma3.attention.layer_norm_rms_epsilon",
        OwnedValue::F32(1e-6),
    );
    w.kv_str("tokenizer.ggml.model", "llama");
    w.kv_str("tokenizer.ggml.pre", "default");
    w.kv_str_array("tokenizer.ggml.tokens", &toks);
    let scores: Vec<f32> = (0..N_VOCAB).map(|i| -(i as f32)).collect();
    w.kv_f32_array("tokenizer.ggml.scores", &scores);
    let types: Vec<i32> = (0..N_VOCAB).map(|i| if i < 256 { 6 } else { 1 }).collect();
    w.kv_i32_array("tokenizer.ggml.token_type", &types);
    for (k, v) in [
        ("tokenizer.ggml.bos_token_id", 2),
        ("tokenizer.ggml.eos_token_id", 106),
        ("tokenizer.ggml.unknown_token_id", 3),
        ("tokenizer.ggml.padding_token_id", 0),
    ] {
        w.kv_u32(k, v);
    }
    w.kv("tokenizer.ggml.add_bos_token", OwnedValue::Bool(true));
    w.kv("tokenizer.ggml.add_eos_token", OwnedValue::Bool(false));
    let template = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}".repeat(12);
    w.kv_str("tokenizer.chat_template", &template);

    // Tensors, in gguf order, as (name, type, ne); their data is never
    // written (the bench claims the file's length instead).
    let mut ts: Vec<(String, TensorType, Vec<u64>)> = vec![
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
    for (name, ty, ne) in &ts {
        w.tensor_deferred(name, *ty, ne);
    }

    let (bytes, offsets) = w.header_bytes();
    let (last, ty, ne) = (
        offsets[ts.len() - 1],
        ts[ts.len() - 1].1,
        &ts[ts.len() - 1].2,
    );
    let end = last + ty.bytes_for(ne.iter().product()).unwrap();
    let file_len = bytes.len() as u64 + end.div_ceil(32) * 32;
    let n_kv = match GgufHeader::parse_prefix(&bytes, file_len).unwrap() {
        Parse::Complete(h) => h.kv_count(),
        Parse::NeedMore { min_len } => panic!("header incomplete, needs {min_len}"),
    };
    Header {
        file_len,
        bytes,
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
fn measure<T>(parse: impl FnOnce() -> T) -> (i64, i64, i64, T) {
    // Return freed heap to the OS so that reused pages do not hide growth.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0)
    };
    let before = rss_anon_kib();
    let (out, n) = counting_alloc::measure(|| black_box(parse()));
    let after = rss_anon_kib();
    (after as i64 - before as i64, n.live, n.peak, out)
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
        // Per tensor: a 24-byte entry, its type byte, up to 16 bytes of
        // name index, its name and its dimensions (see src/tensor.rs).
        .map(|t| 24 + 1 + 16 + t.name.len() + 8 * t.shape.len())
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
