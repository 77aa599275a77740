//! `weightmap validate FILE [--data]`.

use std::path::PathBuf;
use std::time::Instant;

use weightmap::{quant, LoadOptions, TensorType, Weights, WeightsHeader};

use super::{emit, CliResult};

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
            t.name, t.file_offset
        ));
    }
    if a.data {
        // Nothing goes to stdout unless the data is clean too.
        out.push_str(&check_data(a)?);
    }
    emit(&out)
}

/// Load the file and check every tensor's data; the report line.
fn check_data(a: &Args) -> CliResult<String> {
    let t0 = Instant::now();
    // SAFETY: the file must not change while `weights` lives. `--help`
    // states that requirement; the weights live only for this check, and
    // every tensor is copied out before it is read.
    let weights = unsafe { Weights::load(&a.file, &LoadOptions::default())? };
    let (mut tensors, mut bytes, mut threads) = (0usize, 0u64, 1usize);
    let mut batch: Vec<(String, TensorType, Vec<u8>)> = Vec::new();
    let mut batch_bytes = 0u64;
    let mut flush = |batch: &mut Vec<(String, TensorType, Vec<u8>)>| -> CliResult {
        let refs = batch.iter().map(|(n, ty, b)| (n.as_str(), *ty, &b[..]));
        let s = quant::check_tensors(refs)?;
        tensors += s.tensors;
        bytes = bytes.saturating_add(s.bytes);
        threads = threads.max(s.threads);
        batch.clear();
        Ok(())
    };
    for t in weights.tensors() {
        let info = t.info();
        batch.push((info.name.clone(), info.ty, t.to_vec()?));
        batch_bytes = batch_bytes.saturating_add(info.nbytes);
        if batch_bytes >= BATCH_BYTES {
            flush(&mut batch)?;
            batch_bytes = 0;
        }
    }
    flush(&mut batch)?;
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
