//! `weightmap validate FILE [--data] [--ggml]`.

use std::path::PathBuf;
use std::time::Instant;

use weightmap::gguf::ggml::{self, GgmlRule};
use weightmap::{quant, Header, LoadOptions, TensorRef, Weights, WeightsHeader};

use super::{emit, escape, CliError, CliResult};

/// Arguments of `validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF or safetensors file.
    file: PathBuf,
    /// Also read every tensor and check its data for NaN and infinity (float
    /// elements, and the scales of quantized blocks), as llama.cpp's
    /// --check-tensors does. The file must not change while it is checked.
    #[arg(long)]
    data: bool,
    /// Also apply the rules of ggml's reference parser (gguf.cpp) that the
    /// default checks do not: tensors packed in file order with no gaps,
    /// strings of at most 1 GiB, arrays of at most 2^30 elements, tensor
    /// names unique up to a NUL byte (llama.cpp refuses files that break
    /// these), and the data section padded to the alignment within the file
    /// (ggml needs it when it reads tensor data; llama.cpp's loader does
    /// not, and the error says so). Answers "will llama.cpp load this
    /// file?". GGUF only: a safetensors file fails (llama.cpp loads GGUF only).
    #[arg(long)]
    ggml: bool,
}

/// Tensors are copied out of the mapping and checked in batches of about
/// this many bytes (a bigger tensor is a batch of its own).
const BATCH_BYTES: u64 = 256 << 20;

pub fn run(a: &Args) -> CliResult {
    // Every check the loader makes short of mapping and placing tensors.
    let wh = WeightsHeader::read(&a.file)?;
    let h = wh.header();
    let bytes = h
        .tensors()
        .iter()
        .fold(0u64, |acc, t| acc.saturating_add(t.nbytes));
    let mut out = format!(
        "ok: {}, {} tensors, {} bytes\n",
        h.format().name(),
        h.tensors().len(),
        bytes
    );
    // What the default (CPU) buffer type needs for zero-copy placement.
    let alignment = LoadOptions::default().buffer_type.alignment();
    if let Some((t, need)) = wh.first_misaligned(alignment) {
        out.push_str(&format!(
            "note: tensor '{}' at file offset {} is not aligned to {need}: \
             a mapped load would fall back to the stream path\n",
            escape(&t.name),
            t.file_offset
        ));
    }
    if a.ggml {
        out.push_str(&check_ggml(a, &wh)?);
    }
    if a.data {
        // Nothing goes to stdout unless the data is clean too.
        out.push_str(&check_data(a)?);
    }
    emit(&out)
}

/// The ggml rules; the report line.
fn check_ggml(a: &Args, wh: &WeightsHeader) -> CliResult<String> {
    let (Header::Gguf(h), Some(md)) = (wh.header(), wh.gguf_metadata()) else {
        return Err(CliError::msg(format!(
            "{}: --ggml applies to GGUF files only; this file is {} (llama.cpp loads GGUF only)",
            a.file.display(),
            wh.header().format().name()
        )));
    };
    let s = ggml::check_ggml(h, &md)?;
    let rules: Vec<&str> = GgmlRule::ALL.iter().map(|r| r.description()).collect();
    Ok(format!(
        "llama.cpp would load this file (ggml's rules: {}; {} keys, {} strings, {} arrays, \
         {} tensors in a {}-byte data section aligned to {})\n",
        rules.join(", "),
        s.keys,
        s.strings,
        s.arrays,
        s.tensors,
        s.data_section_len,
        h.alignment()
    ))
}

/// Copy `batch` out of the weights, on as many threads as the checker uses
/// (copying from a fresh mapping is page faults as much as memcpy).
fn copy_out(batch: &[TensorRef<'_>]) -> CliResult<Vec<Vec<u8>>> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let per = batch.len().div_ceil(n).max(1);
    let parts: Vec<weightmap::Result<Vec<Vec<u8>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = batch
            .chunks(per)
            .map(|c| s.spawn(move || c.iter().map(|t| t.to_vec()).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut out = Vec::with_capacity(batch.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Load the file and check every tensor's data; the report line.
fn check_data(a: &Args) -> CliResult<String> {
    let t0 = Instant::now();
    // SAFETY: the file must not change while `weights` lives. `--help`
    // states that requirement; the weights live only for this check, and
    // every tensor is copied out before it is read.
    let weights = unsafe { Weights::load(&a.file, &LoadOptions::default())? };
    let all: Vec<_> = weights.tensors().collect();
    let (mut tensors, mut bytes, mut threads) = (0usize, 0u64, 1usize);
    // Batches of whole tensors of about BATCH_BYTES, in file order.
    let mut start = 0;
    while start < all.len() {
        let mut end = start;
        let mut batch_bytes = 0u64;
        while end < all.len() && (end == start || batch_bytes < BATCH_BYTES) {
            batch_bytes = batch_bytes.saturating_add(all[end].info().nbytes);
            end += 1;
        }
        let copies = copy_out(&all[start..end])?;
        let refs = all[start..end]
            .iter()
            .zip(&copies)
            .map(|(t, b)| (t.info().name.as_str(), t.info().ty, &b[..]));
        let s = quant::check_tensors(refs)?;
        tensors += s.tensors;
        bytes = bytes.saturating_add(s.bytes);
        threads = threads.max(s.threads);
        start = end;
    }
    let secs = t0.elapsed().as_secs_f64();
    let gbps = if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    };
    Ok(format!(
        "data ok: {tensors} tensors, {bytes} bytes checked in {secs:.3} s \
         ({gbps:.2} GB/s, {threads} threads)\n"
    ))
}
