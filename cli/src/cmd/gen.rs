//! `weightmap gen OUT [--size BYTES] [--tensors N] [--vocab N] [--types LIST]
//! [--alignment N] [--format gguf|safetensors] [--seed N] [--shards N]
//! [--arch llama|gemma3]`.

use std::path::{Path, PathBuf};

use crate::synth::{self, Arch, GenSpec};
use weightmap::cache::parse_size;
use weightmap::TensorType;

use super::{emit, human_bytes, CliError, CliResult, FormatArg};

/// Arguments of `gen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the model: absent or a regular file (a device, FIFO or
    /// directory is refused). Written under a unique temporary name next to
    /// it, then renamed over it; removed on error, SIGINT or SIGTERM.
    out: PathBuf,
    /// Target total tensor bytes: a number, optionally with K, M, G, T
    /// (binary: KiB, MiB, ...) or KB, MB, GB, TB (decimal). It must be at
    /// least the smallest model for --tensors, --vocab and --types
    /// (embedding and feed-forward length 256): 107.9 MiB with the defaults,
    /// 1.6 MiB for --tensors 20 --vocab 1000; a smaller size is an error
    /// that names the minimum. [default: 512M]
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Number of tensors. [default: 300]
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    tensors: Option<u64>,
    /// Vocabulary size. [default: 262144]
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=16_777_216))]
    vocab: Option<u64>,
    /// Comma-separated tensor types, by ggml name, any case
    /// (e.g. f32,f16,q8_0,q4_K). [default: f32,f16,q8_0,q4_K,q6_K]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_type)]
    types: Option<Vec<TensorType>>,
    /// GGUF data alignment, a power of two up to 1 MiB; for safetensors the
    /// data section starts at a multiple of it (or 8). [default: 32]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    alignment: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Gguf)]
    format: FormatArg,
    /// Seed of the tensor bytes and tokens. [default: the built-in seed]
    #[arg(long)]
    seed: Option<u64>,
    /// Write the model in N files: for GGUF llama.cpp's split layout
    /// (OUT-00001-of-0000N.gguf, with split.no, split.count and
    /// split.tensors.count; metadata in the first), for safetensors
    /// Hugging Face's shards and OUT.safetensors.index.json. The tensors'
    /// bytes are those of the unsplit model.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=99_999))]
    shards: Option<u64>,
    /// The architecture imitated. gemma3: heads of 256 together twice as
    /// wide as the embedding (attn_q is [n_embd, 2 n_embd]), one KV head,
    /// q/k and post norms (13 tensors a block, so --tensors 2 + 13 × blocks
    /// gives whole blocks), no output.weight (tied to token_embd), and
    /// gemma3.attention.key_length / value_length.
    #[arg(long, value_enum, default_value_t = ArchArg::Llama)]
    arch: ArchArg,
}

/// `--arch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ArchArg {
    /// llama: attention as wide as the embedding, 9 tensors a block.
    Llama,
    /// gemma 3 (like gemma-3-270m): attention wider than the embedding.
    Gemma3,
}

impl From<ArchArg> for Arch {
    fn from(a: ArchArg) -> Arch {
        match a {
            ArchArg::Llama => Arch::Llama,
            ArchArg::Gemma3 => Arch::Gemma3,
        }
    }
}

pub fn run(a: &Args) -> CliResult {
    let d = GenSpec::default();
    let spec = GenSpec {
        format: a.format.into(),
        size: a.size.unwrap_or(d.size),
        tensors: a.tensors.map_or(d.tensors, |n| n as usize),
        vocab: a.vocab.map_or(d.vocab, |n| n as usize),
        types: a.types.clone().unwrap_or(d.types),
        alignment: a.alignment.unwrap_or(d.alignment),
        seed: a.seed.unwrap_or(d.seed),
        arch: a.arch.into(),
    };
    let min = synth::minimum_size(&spec)?;
    if spec.size < min {
        return Err(CliError::msg(format!(
            "--size {} is below the smallest model for {} tensors and a {}-token vocabulary: {}",
            spec.size,
            spec.tensors,
            spec.vocab,
            human_bytes(min)
        )));
    }
    if let Some(n) = a.shards.filter(|&n| n > 1) {
        // Generate whole beside the output, then split it.
        let dir = a
            .out
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = tempfile_in(dir)?;
        let whole = tmp.path().join("whole");
        let plan = generate_with_progress(&spec, &whole, "gen")?;
        let files = crate::split::split_model(&whole, &a.out, n as usize)?;
        let mut out = format!(
            "wrote {} files: {}, {} tensors, {} of tensor data\n",
            files.len(),
            spec.format.name(),
            plan.tensors.len(),
            human_bytes(plan.tensor_bytes)
        );
        for f in &files {
            out.push_str(&format!("  {}\n", super::escape(&f.display().to_string())));
        }
        return emit(&out);
    }
    let plan = generate_with_progress(&spec, &a.out, "gen")?;
    emit(&format!(
        "wrote {}: {}, {} tensors, {} of tensor data, file {}\n",
        a.out.display(),
        spec.format.name(),
        plan.tensors.len(),
        human_bytes(plan.tensor_bytes),
        human_bytes(plan.file_size),
    ))
}

/// A private temporary directory in `dir` (removed on drop).
fn tempfile_in(dir: &Path) -> CliResult<TempDir> {
    let base = dir.join(format!(".weightmap-gen-{}", std::process::id()));
    std::fs::create_dir(&base)
        .map_err(|e| CliError::msg(format!("creating {}: {e}", base.display())))?;
    Ok(TempDir(base))
}

/// A directory removed with its contents on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Generate `spec` at `out`, with a progress line on stderr when stderr is
/// a terminal.
pub fn generate_with_progress(spec: &GenSpec, out: &Path, label: &str) -> CliResult<synth::Plan> {
    let plan = synth::plan(spec)?;
    let pb = super::progress::bar(label);
    let mut progress = |done: u64, total: u64| super::progress::update(&pb, done, total);
    let result = synth::generate_until(spec, out, &mut progress, super::signals::stop_flag());
    pb.finish_and_clear();
    result?;
    Ok(plan)
}

/// A tensor type by its ggml name, case-insensitively.
pub fn parse_type(s: &str) -> Result<TensorType, String> {
    let s = s.trim();
    TensorType::ALL
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            let names: Vec<&str> = TensorType::ALL.iter().map(|t| t.name()).collect();
            format!("unknown tensor type '{s}' (known: {})", names.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert_eq!(parse_type("Q4_k"), Ok(TensorType::Q4_K));
        assert_eq!(parse_type("F16"), Ok(TensorType::F16));
        assert!(parse_type("q9").is_err());
    }
}
