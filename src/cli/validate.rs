//! `weightmap validate FILE [--data]`.

use std::path::PathBuf;
use std::time::Instant;

use weightmap::{quant, LoadOptions, TensorRef, Weights, WeightsHeader};

use super::{emit, escape, CliResult};

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
             a mapped load copies it (and any like it) into owned memory\n",
            escape(&t.name),
            t.file_offset
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
    // states that requirement; the weights live only for this check.
    let weights = unsafe { Weights::load(&a.file, &LoadOptions::default())? };
    // Checked in place, in the mapping (no copy): a file truncated under
    // the check is one error line, not a SIGBUS.
    let _sigbus = super::sigbus::guard(&a.file);
    let copies: Vec<(usize, Vec<u8>)> = weights
        .tensors()
        .enumerate()
        .filter(|(_, t)| t.host_bytes().is_none())
        .map(|(i, t)| t.to_vec().map(|v| (i, v)))
        .collect::<weightmap::Result<_>>()?;
    let all: Vec<TensorRef<'_>> = weights.tensors().collect();
    let refs = all.iter().enumerate().map(|(i, t)| {
        let bytes = match t.host_bytes() {
            Some(b) => b,
            None => copies
                .iter()
                .find(|c| c.0 == i)
                .map_or(&[][..], |c| &c.1[..]),
        };
        (t.info().name.as_str(), t.info().ty, bytes)
    });
    let s = quant::check_tensors(refs)?;
    let (tensors, bytes, threads) = (s.tensors, s.bytes, s.threads);
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
