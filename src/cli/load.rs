//! `weightmap load FILE [--mode mmap|stream] [--no-fallback] [--hashes] [--json]`.

use std::path::PathBuf;

use serde_json::json;
use sha2::{Digest, Sha256};
use weightmap::{LoadOptions, Weights};

use super::proc_status::MemStatus;
use super::{emit, json_text, round3, table, CliResult, ModeArg};

pub const LONG_ABOUT: &str = "\
Load a file and report what the loader did and the memory it used.

With --mode mmap (the default) the file is mapped and tensors are viewed in
place; when that cannot be done (a misaligned tensor, a filesystem that
refuses mmap, ...) the loader falls back to the stream path and says why,
unless --no-fallback is given. The memory figures (RssAnon, RssFile, VmHWM
from /proc/self/status, in kB) are read right after the load, before any
tensor is touched.

The file must not be modified or truncated while this command runs: a
mapped file that changes underneath changes memory the program assumes
immutable. The process exits right after printing the report.";

/// Arguments of `load`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF or safetensors file.
    file: PathBuf,
    /// The load path to ask for.
    #[arg(long, value_enum, default_value_t = ModeArg::Mmap)]
    mode: ModeArg,
    /// Fail instead of falling back to the stream path when mapping cannot be used.
    #[arg(long)]
    no_fallback: bool,
    /// Also print the sha256 of every tensor's bytes.
    #[arg(long)]
    hashes: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> CliResult {
    let opts = LoadOptions {
        mode: a.mode.into(),
        fallback: !a.no_fallback,
        ..LoadOptions::default()
    };
    // SAFETY: the file must not change while `weights` lives. This command
    // documents that requirement (`load --help`), holds the weights only
    // while it reports on them, and the process exits right after.
    let weights = unsafe { Weights::load(&a.file, &opts)? };
    let mem = MemStatus::read();
    let r = weights.report();

    let _sigbus = super::sigbus::guard(&a.file);
    let mut hashes = Vec::new();
    if a.hashes {
        for t in weights.tensors() {
            let digest = match t.host_bytes() {
                Some(b) => Sha256::digest(b),
                None => Sha256::digest(t.to_vec()?),
            };
            hashes.push((t.name().to_owned(), hex(&digest)));
        }
    }

    let load_ms = r.elapsed.as_secs_f64() * 1e3;
    let out = if a.json {
        let fallback = r
            .fallback
            .as_ref()
            .map(|f| json!({"kind": f.kind(), "detail": f.to_string()}));
        let mut o = json!({
            "format": r.format.name(),
            "mode_requested": r.mode_requested.name(),
            "mode_used": r.mode_used.name(),
            "fallback": fallback,
            "tensors_count": r.tensors_count,
            "bytes_mapped": r.bytes_mapped,
            "bytes_copied": r.bytes_copied,
            "load_ms": round3(load_ms),
            "rss_anon_kib": mem.rss_anon_kib,
            "rss_file_kib": mem.rss_file_kib,
            "vm_hwm_kib": mem.vm_hwm_kib,
        });
        if a.hashes {
            o["tensors"] = hashes
                .iter()
                .map(|(n, h)| json!({"name": n, "sha256": h}))
                .collect();
        }
        json_text(&o)
    } else {
        let kib = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v} kB"));
        let fallback = r
            .fallback
            .as_ref()
            .map_or_else(|| "none".to_owned(), |f| format!("{}: {f}", f.kind()));
        let mut out = table(
            &[
                vec!["file:".into(), a.file.display().to_string()],
                vec!["format:".into(), r.format.name().into()],
                vec![
                    "mode:".into(),
                    format!(
                        "{} (requested {})",
                        r.mode_used.name(),
                        r.mode_requested.name()
                    ),
                ],
                vec!["fallback:".into(), fallback],
                vec!["tensors:".into(), r.tensors_count.to_string()],
                vec!["bytes mapped:".into(), r.bytes_mapped.to_string()],
                vec!["bytes copied:".into(), r.bytes_copied.to_string()],
                vec!["load time:".into(), format!("{load_ms:.3} ms")],
                vec!["RssAnon:".into(), kib(mem.rss_anon_kib)],
                vec!["RssFile:".into(), kib(mem.rss_file_kib)],
                vec!["VmHWM:".into(), kib(mem.vm_hwm_kib)],
            ],
            2,
            "",
        );
        if a.hashes {
            out.push_str("\nsha256 of each tensor's bytes:\n");
            let rows: Vec<Vec<String>> = hashes.into_iter().map(|(n, h)| vec![h, n]).collect();
            out.push_str(&table(&rows, 2, "  "));
        }
        out
    };
    emit(&out)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
