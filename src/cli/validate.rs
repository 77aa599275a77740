//! `weightmap validate FILE`.

use std::path::PathBuf;

use weightmap::{LoadOptions, WeightsHeader};

use super::{emit, escape, CliResult};

/// Arguments of `validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF or safetensors file.
    file: PathBuf,
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
             a mapped load would fall back to the stream path\n",
            escape(&t.name),
            t.file_offset
        ));
    }
    emit(&out)
}
