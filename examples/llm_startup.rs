//! What an LLM runtime does at startup, with weightmap: load a GGUF, read
//! the hyper-parameters and the tokenizer's vocabulary, build a per-layer
//! tensor table with shape and type checks, and embed a few tokens.
//!
//! ```text
//! cargo run --release -- gen /tmp/m.gguf --size 200M
//! cargo run --release --example llm_startup -- /tmp/m.gguf
//! ```

use std::sync::Arc;

use weightmap::{LoadOptions, Tensor, TensorType, Weights};

/// The tensors of one transformer block, owned (no borrow of the weights).
#[allow(dead_code)]
struct Layer {
    attn_norm: Tensor,
    attn_q: Tensor,
    attn_k: Tensor,
    attn_v: Tensor,
    attn_output: Tensor,
    ffn_norm: Tensor,
    ffn_gate: Tensor,
    ffn_up: Tensor,
    ffn_down: Tensor,
}

#[allow(dead_code)]
struct Model {
    n_embd: u64,
    n_head: Vec<u32>,
    n_head_kv: Vec<u32>,
    vocab: Vec<String>,
    token_embd: Tensor,
    layers: Vec<Layer>,
    output_norm: Tensor,
    output: Tensor,
}

fn build(weights: &Arc<Weights>) -> weightmap::Result<Model> {
    let md = weights.gguf_metadata().expect("a GGUF file");
    let arch = md.architecture()?;
    let n_layer = u64::from(md.block_count()?);
    let n_embd: u64 = md.embedding_length()?;
    let n_ff: u64 = md.arch_int("feed_forward_length")?;
    // Scalars here, arrays in models whose layers differ (llama.cpp's
    // get_key_or_arr): per_layer takes both.
    let n_head: Vec<u32> = md.arch_per_layer("attention.head_count")?;
    let n_head_kv: Vec<u32> = md.arch_per_layer("attention.head_count_kv")?;
    let eps = md
        .arch_opt_f32("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-5);
    let vocab: Vec<String> = md
        .get_array("tokenizer.ggml.tokens")?
        .strings()?
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    println!(
        "{arch}: {n_layer} layers, n_embd {n_embd}, n_ff {n_ff}, heads {} / kv {}, eps {eps}, vocab {}",
        n_head[0],
        n_head_kv[0],
        vocab.len()
    );

    let head_dim = n_embd / u64::from(n_head[0]);
    let quant = [
        TensorType::F32,
        TensorType::F16,
        TensorType::Q8_0,
        TensorType::Q4_K,
        TensorType::Q6_K,
    ];
    let own = |t: weightmap::TensorRef<'_>| Tensor::new(weights, t.name());
    let mut layers = Vec::new();
    for (i, blk) in weights.blocks() {
        let kv = u64::from(n_head_kv[i as usize]) * head_dim;
        let norm = |n: &str| own(blk.get(n, &[n_embd], &[TensorType::F32])?);
        let mat = |n: &str, ne: &[u64]| own(blk.get(n, ne, &quant)?);
        layers.push(Layer {
            attn_norm: norm("attn_norm.weight")?,
            attn_q: mat("attn_q.weight", &[n_embd, n_embd])?,
            attn_k: mat("attn_k.weight", &[n_embd, kv])?,
            attn_v: mat("attn_v.weight", &[n_embd, kv])?,
            attn_output: mat("attn_output.weight", &[n_embd, n_embd])?,
            ffn_norm: norm("ffn_norm.weight")?,
            ffn_gate: mat("ffn_gate.weight", &[n_embd, n_ff])?,
            ffn_up: mat("ffn_up.weight", &[n_embd, n_ff])?,
            ffn_down: mat("ffn_down.weight", &[n_ff, n_embd])?,
        });
    }
    assert_eq!(layers.len() as u64, n_layer, "every block present");
    let n_vocab = vocab.len() as u64;
    Ok(Model {
        n_embd,
        n_head,
        n_head_kv,
        token_embd: own(weights.get("token_embd.weight", &[n_embd, n_vocab], &quant)?)?,
        output_norm: own(weights.get("output_norm.weight", &[n_embd], &[TensorType::F32])?)?,
        output: own(weights.get("output.weight", &[n_embd, n_vocab], &quant)?)?,
        vocab,
        layers,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: llm_startup MODEL.gguf")?;
    // SAFETY: the model file is not modified while this program runs.
    let weights = Arc::new(unsafe { Weights::load(&path, &LoadOptions::default())? });
    let r = weights.report();
    println!(
        "loaded {} tensors in {:.1} ms ({}, {} mapped, {} copied; prefetch: {})",
        r.tensors_count,
        r.elapsed.as_secs_f64() * 1e3,
        r.mode_used.name(),
        r.tensors_mapped,
        r.tensors_copied,
        r.prefetch
    );
    let model = build(&weights)?;
    drop(weights); // the model owns its tensors now
    println!(
        "{} layers ready; token_embd is {} ({} rows of {})",
        model.layers.len(),
        model.token_embd.info().ty.name(),
        model.token_embd.n_rows(),
        model.token_embd.row_len()
    );
    // Embed a few tokens: dequantize their rows.
    let n = model.n_embd as usize;
    let mut row = vec![0f32; n];
    for &id in &[1u64, 2, 3] {
        model.token_embd.row_f32(id, &mut row)?;
        let finite = row.iter().filter(|x| x.is_finite()).count();
        println!(
            "token {id} {:?}: {n} values, {finite} finite, first {:?}",
            model
                .vocab
                .get(id as usize)
                .map(String::as_str)
                .unwrap_or("?"),
            &row[..4.min(n)]
        );
    }
    Ok(())
}
