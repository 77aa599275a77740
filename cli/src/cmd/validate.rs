//! `weightmap validate FILE [--data] [--ggml]`.

use std::path::PathBuf;
use std::time::Instant;

use weightmap::gguf::{self, GgmlRule};
use weightmap::{quant, Header, LoadOptions, ModelHeaders, Weights};

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

pub fn run(a: &Args) -> CliResult {
    // Every check the loader makes short of mapping and placing tensors,
    // over every file of the model (shards checked against each other).
    let model = ModelHeaders::read(&a.file)?;
    let first = model.first();
    let mut out = if model.files.len() == 1 {
        format!(
            "ok: {}, {} tensors, {} bytes\n",
            first.format().name(),
            model.tensor_count(),
            model.tensor_bytes()
        )
    } else {
        let mut o = format!(
            "ok: {}, {} files, {} tensors, {} bytes\n",
            first.format().name(),
            model.files.len(),
            model.tensor_count(),
            model.tensor_bytes()
        );
        for (p, h) in &model.files {
            o.push_str(&format!(
                "  {}: {} tensors\n",
                escape(&p.display().to_string()),
                h.tensors().len()
            ));
        }
        o
    };
    for w in &model.warnings {
        out.push_str(&format!("warning: {}\n", escape(w)));
    }
    // What the default (CPU) buffer type needs for zero-copy placement.
    let alignment = weightmap::buffer::CpuBufferType::DEFAULT_ALIGNMENT;
    for (_, wh) in &model.files {
        if let Some((t, need)) = wh.first_misaligned(alignment) {
            out.push_str(&format!(
                "note: tensor '{}' at file offset {} is not aligned to {need}: \
                 a mapped load copies it (and any like it) into owned memory\n",
                escape(t.name),
                t.file_offset
            ));
        }
    }
    if a.ggml {
        for (p, wh) in &model.files {
            if model.files.len() > 1 {
                out.push_str(&format!("{}: ", escape(&p.display().to_string())));
            }
            out.push_str(&check_ggml(p, wh)?);
        }
    }
    if a.data {
        // Nothing goes to stdout unless the data is clean too.
        out.push_str(&check_data(a)?);
    }
    emit(&out)
}

/// The ggml rules; the report line.
fn check_ggml(file: &std::path::Path, wh: &Header) -> CliResult<String> {
    let (Some(h), Some(md)) = (wh.gguf(), wh.gguf_metadata()) else {
        return Err(CliError::msg(format!(
            "{}: --ggml applies to GGUF files only; this file is {} (llama.cpp loads GGUF only)",
            file.display(),
            wh.format().name()
        )));
    };
    let s = gguf::check_ggml(h, &md)?;
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

/// Load the file and check every tensor's data; the report line.
fn check_data(a: &Args) -> CliResult<String> {
    let t0 = Instant::now();
    // SAFETY: the file must not change while `weights` lives. `--help`
    // states that requirement; the weights live only for this check.
    let weights = unsafe { Weights::load(&a.file, &LoadOptions::default())? };
    // Checked in place, in the mapping (no copy): a file truncated under
    // the check is one error line, not a SIGBUS. One bounded pass in file
    // order: each tensor read when it is checked, its pages dropped after,
    // so a model larger than memory is checked at the disk's rate.
    let _sigbus = super::sigbus::guard(&a.file);
    let (mut tensors, mut bytes, mut threads) = (0, 0u64, 0);
    for t in weights.pass() {
        let t = t?;
        let owned;
        let data = match t.host_bytes() {
            Some(b) => b,
            None => {
                owned = t.to_vec()?;
                &owned[..]
            }
        };
        let s = quant::check_tensors([(t.name(), t.info().ty, data)], 0)?;
        tensors += s.tensors;
        bytes += s.bytes;
        threads = threads.max(s.threads);
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
