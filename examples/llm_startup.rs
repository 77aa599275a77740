//! What an LLM runtime does at startup, with weightmap: load a GGUF, read
//! the hyper-parameters and the tokenizer's vocabulary, build a per-layer
//! tensor table with shape and type checks, and embed a few tokens.
//!
//! Every expected shape comes from the file's own metadata, as llama.cpp
//! derives it: the attention's width is `n_head × key_length`, which need not
//! be `n_embd` (gemma-3-270m: 4 heads of 256 over an embedding of 640).
//! Tensors only some architectures have (gemma's q/k and post norms, an
//! `output.weight` that others tie to `token_embd.weight`) are optional, but
//! checked when present.
//!
//! ```text
//! cargo run --release -- gen /tmp/m.gguf --size 200M
//! cargo run --release --example llm_startup -- /tmp/m.gguf
//! cargo run --release -- gen /tmp/g.gguf --size 200M --arch gemma3
//! cargo run --release --example llm_startup -- /tmp/g.gguf
//! ```

use std::sync::Arc;

use weightmap::{LoadOptions, Tensor, TensorRef, TensorType, Weights};

/// The tensors of one transformer block, owned (no borrow of the weights).
#[allow(dead_code)]
struct Layer {
    attn_norm: Tensor,
    attn_q: Tensor,
    attn_k: Tensor,
    attn_v: Tensor,
    /// Per-head RMS norms of the queries and keys (gemma 3, qwen 3).
    attn_q_norm: Option<Tensor>,
    attn_k_norm: Option<Tensor>,
    attn_output: Tensor,
    /// Norm of the attention's output before the residual add (gemma 2, 3).
    post_attention_norm: Option<Tensor>,
    ffn_norm: Tensor,
    ffn_gate: Tensor,
    ffn_up: Tensor,
    ffn_down: Tensor,
    /// Norm of the feed-forward's output (gemma 2, 3).
    post_ffw_norm: Option<Tensor>,
}

/// The hyper-parameters the shapes follow from.
#[allow(dead_code)]
struct Hparams {
    n_layer: usize,
    n_embd: u64,
    /// Per layer: llama.cpp reads each of these as one integer or an array.
    n_head: Vec<u32>,
    n_head_kv: Vec<u32>,
    n_ff: Vec<u64>,
    /// Size of one key (query) head and of one value head.
    head_dim_k: u64,
    head_dim_v: u64,
    eps: f32,
}

#[allow(dead_code)]
struct Model {
    hp: Hparams,
    vocab: Vec<String>,
    token_embd: Tensor,
    layers: Vec<Layer>,
    output_norm: Tensor,
    /// `output.weight`, or `token_embd.weight` where the file ties them.
    output: Tensor,
    output_tied: bool,
}

type BoxError = Box<dyn std::error::Error>;

fn hparams(weights: &Weights) -> Result<Hparams, BoxError> {
    let md = weights.gguf_metadata().ok_or("not a GGUF file")?;
    let n_layer = usize::try_from(md.block_count()?)?;
    let n_embd: u64 = md.embedding_length()?;
    let n_head: Vec<u32> = md.arch_per_layer("attention.head_count")?;
    // Absent means one KV head per query head (no grouped-query attention).
    let n_head_kv: Vec<u32> = if md.get(&md.arch_key("attention.head_count_kv")?).is_some() {
        md.arch_per_layer("attention.head_count_kv")?
    } else {
        n_head.clone()
    };
    let n_ff: Vec<u64> = md.arch_per_layer("feed_forward_length")?;
    // Only models whose heads split the embedding evenly may leave the head
    // sizes out; llama.cpp takes n_embd / n_head (of the first layer) then.
    let split = match n_head.first() {
        Some(&h) if h > 0 => Some(n_embd / u64::from(h)),
        _ => None,
    };
    let head_dim = |key: &str| -> Result<u64, BoxError> {
        Ok(match md.arch_opt_int(key)? {
            Some(d) => d,
            None => split.ok_or_else(|| format!("no {key} and no heads to derive it from"))?,
        })
    };
    Ok(Hparams {
        n_layer,
        n_embd,
        head_dim_k: head_dim("attention.key_length")?,
        head_dim_v: head_dim("attention.value_length")?,
        n_head,
        n_head_kv,
        n_ff,
        eps: md
            .arch_opt_f32("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5),
    })
}

fn build(weights: &Arc<Weights>) -> Result<Model, BoxError> {
    let md = weights.gguf_metadata().ok_or("not a GGUF file")?;
    let arch = md.architecture()?;
    let hp = hparams(weights)?;
    let n_embd = hp.n_embd;
    // The vocabulary, if the file has a tokenizer; else its size is
    // whatever token_embd has rows for.
    let vocab: Vec<String> = if md.get("tokenizer.ggml.tokens").is_some() {
        md.get_array("tokenizer.ggml.tokens")?
            .strings()?
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    } else {
        Vec::new()
    };
    let n_vocab = match vocab.len() {
        0 => weights.tensor("token_embd.weight")?.n_rows(),
        n => n as u64,
    };
    // The first layer's (the per-layer values are usually all the same).
    let first = |v: &[u32]| v.first().copied().unwrap_or(0);
    println!(
        "{arch}: {} layers, n_embd {n_embd}, n_ff {}, heads {} / kv {} of {} (k) / {} (v), eps {}, vocab {n_vocab}",
        hp.n_layer,
        hp.n_ff.first().copied().unwrap_or(0),
        first(&hp.n_head),
        first(&hp.n_head_kv),
        hp.head_dim_k,
        hp.head_dim_v,
        hp.eps,
    );

    // A runtime lists the types its kernels take; this one computes through
    // weightmap's dequantizer, so it takes every type that has one.
    let quant: Vec<TensorType> = TensorType::ALL
        .iter()
        .copied()
        .filter(|t| t.has_dequantize())
        .collect();
    // llama.cpp's converters keep 1-D tensors in F32.
    let f32 = [TensorType::F32];
    let own = |t: TensorRef<'_>| Tensor::new(weights, t.name());
    // A tensor some architectures lack: None if absent, its shape and type
    // checked if present.
    let opt = |t: Option<TensorRef<'_>>, ne: &[u64], types: &[TensorType]| {
        t.map(|t| own(t.check_shape(ne, types)?)).transpose()
    };

    let blocks = weights.blocks();
    if blocks.len() != hp.n_layer {
        return Err(format!(
            "{} blocks in the file, block_count {}",
            blocks.len(),
            hp.n_layer
        )
        .into());
    }
    let mut layers = Vec::with_capacity(hp.n_layer);
    for (i, blk) in blocks {
        let i = i as usize;
        if i >= hp.n_layer {
            return Err(format!("block {i} beyond block_count {}", hp.n_layer).into());
        }
        // Query, key and value widths: heads × head size, whatever n_embd is.
        let q = u64::from(hp.n_head[i]) * hp.head_dim_k;
        let k = u64::from(hp.n_head_kv[i]) * hp.head_dim_k;
        let v = u64::from(hp.n_head_kv[i]) * hp.head_dim_v;
        // The attention's output projection takes the concatenated value heads.
        let attn_out = u64::from(hp.n_head[i]) * hp.head_dim_v;
        let n_ff = hp.n_ff[i];
        let norm = |n: &str| own(blk.tensor_checked(n, &[n_embd], &f32)?);
        let mat = |n: &str, ne: &[u64]| own(blk.tensor_checked(n, ne, &quant)?);
        layers.push(Layer {
            attn_norm: norm("attn_norm.weight")?,
            attn_q: mat("attn_q.weight", &[n_embd, q])?,
            attn_k: mat("attn_k.weight", &[n_embd, k])?,
            attn_v: mat("attn_v.weight", &[n_embd, v])?,
            attn_q_norm: opt(blk.opt_tensor("attn_q_norm.weight"), &[hp.head_dim_k], &f32)?,
            attn_k_norm: opt(blk.opt_tensor("attn_k_norm.weight"), &[hp.head_dim_k], &f32)?,
            attn_output: mat("attn_output.weight", &[attn_out, n_embd])?,
            post_attention_norm: opt(
                blk.opt_tensor("post_attention_norm.weight"),
                &[n_embd],
                &f32,
            )?,
            ffn_norm: norm("ffn_norm.weight")?,
            ffn_gate: mat("ffn_gate.weight", &[n_embd, n_ff])?,
            ffn_up: mat("ffn_up.weight", &[n_embd, n_ff])?,
            ffn_down: mat("ffn_down.weight", &[n_ff, n_embd])?,
            post_ffw_norm: opt(blk.opt_tensor("post_ffw_norm.weight"), &[n_embd], &f32)?,
        });
    }
    let token_embd =
        own(weights.tensor_checked("token_embd.weight", &[n_embd, n_vocab], &quant)?)?;
    // (`tensor` fails only for a missing name.)
    let output = opt(
        weights.tensor("output.weight").ok(),
        &[n_embd, n_vocab],
        &quant,
    )?;
    let output_tied = output.is_none();
    Ok(Model {
        output: output.unwrap_or_else(|| token_embd.clone()),
        output_tied,
        output_norm: own(weights.tensor_checked("output_norm.weight", &[n_embd], &f32)?)?,
        token_embd,
        hp,
        vocab,
        layers,
    })
}

fn main() -> Result<(), BoxError> {
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
        "{} layers ready; output {}",
        model.layers.len(),
        if model.output_tied {
            "tied to token_embd"
        } else {
            "separate"
        },
    );
    if let Some(l0) = model.layers.first() {
        println!(
            "blk.0: attn_q {:?}, attn_k {:?}, attn_output {:?}; q/k norms: {}, post norms: {}",
            l0.attn_q.info().ne(),
            l0.attn_k.info().ne(),
            l0.attn_output.info().ne(),
            l0.attn_q_norm.is_some() && l0.attn_k_norm.is_some(),
            l0.post_attention_norm.is_some() && l0.post_ffw_norm.is_some(),
        );
    }
    println!(
        "token_embd is {} ({} rows of {})",
        model.token_embd.info().ty.name(),
        model.token_embd.n_rows(),
        model.token_embd.row_len()
    );
    // Embed a few tokens: dequantize their rows.
    let n = model.hp.n_embd as usize;
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
