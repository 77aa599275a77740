//! Writes the ggml proof's model: one weight of each of F32, F16, Q8_0,
//! Q4_0, Q4_K, Q6_K and IQ4_NL (256 x ROWS, default 8, deterministic
//! pseudo-random blocks whose f16 scales are finite), plus a Q8_0 token
//! embedding of twice as many rows. The proof of the transform cache takes
//! a large one, whose transformed bytes dwarf the process's own memory.
//!
//! With `moe` for ROWS, a mixture-of-experts model instead, for the proof
//! of the announcing hook (moe_hook.c): OLMoE's tensor names and layout, 2
//! layers, embedding 256, 8 experts of FFN 128, 2 used per token, vocab 64.
//!
//! `cargo run -p weightmap-capi --example gen_proof_model -- OUT.gguf [ROWS|moe]`

use half::f16;
use weightmap::gguf::Writer;
use weightmap::TensorType;

/// xorshift64*: the same bytes on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    /// A float in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A finite, small, nonzero f16 scale, little-endian.
    fn scale(&mut self) -> [u8; 2] {
        f16::from_f32(0.001 + 0.02 * (self.unit() + 1.0)).to_le_bytes()
    }
}

/// `rows` rows of `ne0` elements of `ty`, block by block.
fn data(ty: TensorType, ne0: u64, rows: u64, rng: &mut Rng) -> Vec<u8> {
    let blocks = ne0 / ty.block_size() * rows;
    let mut out = Vec::new();
    for _ in 0..blocks {
        let start = out.len();
        let size = ty.type_size() as usize;
        out.extend((0..size).map(|_| rng.byte()));
        let b = &mut out[start..];
        match ty {
            TensorType::F32 => b.copy_from_slice(&rng.unit().to_le_bytes()),
            TensorType::F16 => b.copy_from_slice(&f16::from_f32(rng.unit()).to_le_bytes()),
            // d first (and dmin second for Q4_K); the rest are quants.
            TensorType::Q8_0 | TensorType::Q4_0 | TensorType::IQ4_NL => {
                b[..2].copy_from_slice(&rng.scale())
            }
            TensorType::Q4_K => {
                b[..2].copy_from_slice(&rng.scale());
                b[2..4].copy_from_slice(&rng.scale());
            }
            // ql, qh, scales (i8), then d last.
            TensorType::Q6_K => b[208..210].copy_from_slice(&rng.scale()),
            other => panic!("no generator for {other}"),
        }
    }
    out
}

/// The mixture-of-experts model: per layer an attention weight read whole,
/// the router, and three expert tensors (`ne[2]` = the experts).
fn moe(w: &mut Writer, rng: &mut Rng) {
    let (embd, ff, experts, used, vocab) = (256u64, 128u64, 8u64, 2u64, 64u64);
    w.kv_str("general.architecture", "olmoe");
    w.kv_str("general.name", "weightmap ggml proof, mixture of experts");
    w.kv_u32("olmoe.block_count", 2);
    w.kv_u32("olmoe.expert_count", experts as u32);
    w.kv_u32("olmoe.expert_used_count", used as u32);
    let q8 = TensorType::Q8_0;
    w.tensor(
        "token_embd.weight",
        q8,
        &[embd, vocab],
        data(q8, embd, vocab, rng),
    );
    for layer in 0..2 {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        let (q4, f32) = (TensorType::Q4_0, TensorType::F32);
        w.tensor(
            &name("attn_q"),
            q4,
            &[embd, embd],
            data(q4, embd, embd, rng),
        );
        let router = data(f32, embd, experts, rng);
        w.tensor(&name("ffn_gate_inp"), f32, &[embd, experts], router);
        for t in ["ffn_gate_exps", "ffn_up_exps"] {
            let d = data(q4, embd, ff * experts, rng);
            w.tensor(&name(t), q4, &[embd, ff, experts], d);
        }
        let d = data(q4, ff, embd * experts, rng);
        w.tensor(&name("ffn_down_exps"), q4, &[ff, embd, experts], d);
    }
}

/// One weight of each type, `rows` rows, and the token embedding.
fn dense(w: &mut Writer, rng: &mut Rng, rows: u64) {
    w.kv_str("general.architecture", "llama");
    w.kv_str("general.name", "weightmap ggml proof");
    let ne0 = 256u64;
    for ty in [
        TensorType::F32,
        TensorType::F16,
        TensorType::Q8_0,
        TensorType::Q4_0,
        TensorType::Q4_K,
        TensorType::Q6_K,
        TensorType::IQ4_NL,
    ] {
        let name = format!("proof.{}", ty.name().to_lowercase());
        w.tensor(&name, ty, &[ne0, rows], data(ty, ne0, rows, rng));
    }
    let embd = data(TensorType::Q8_0, ne0, 2 * rows, rng);
    w.tensor(
        "token_embd.weight",
        TensorType::Q8_0,
        &[ne0, 2 * rows],
        embd,
    );
}

fn main() {
    let usage = "usage: gen_proof_model OUT.gguf [ROWS|moe]";
    let out = std::env::args().nth(1).expect(usage);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut w = Writer::new(32);
    match std::env::args().nth(2).as_deref() {
        Some("moe") => moe(&mut w, &mut rng),
        rows => dense(
            &mut w,
            &mut rng,
            rows.map_or(8, |r| r.parse().expect(usage)),
        ),
    }
    let file = std::fs::File::create(&out).expect("create the output file");
    w.write_with(file, |_, _| {}).expect("write the model");
    println!("wrote {out}");
}
