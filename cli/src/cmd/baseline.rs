//! `weightmap read-baseline FILE --json` (hidden): read the whole file into
//! one buffer with a plain sequential read, the yardstick `bench` holds the
//! stream path to. For a model of several files (a split GGUF, a sharded
//! safetensors index), each file into a buffer of its own, one after the
//! other: what a runtime without weightmap would do.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::proc_status::{Faults, MemStatus};
use super::touch::touch;
use super::{emit, round3, CliError, CliResult};

/// Arguments of `read-baseline`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The file to read (any shard of a split GGUF, a safetensors index or
    /// its directory: every file of the model).
    file: PathBuf,
    /// Print JSON (the only output; accepted for symmetry with `load`).
    #[arg(long)]
    json: bool,
    /// Read every byte of the buffer once after the read, as `load --touch`.
    #[arg(long)]
    touch: bool,
    /// Drop the file from the page cache first, as `load --evict`.
    #[arg(long)]
    evict: bool,
}

pub fn run(a: &Args) -> CliResult {
    // Which files, before the clock starts (as `load` resolves them too).
    let files = weightmap::ModelHeaders::model_files(&a.file)?;
    let resident_before = if a.evict {
        let mut sum = 0.0;
        for f in &files {
            sum += super::load::evict(f)?;
        }
        Some(sum / files.len() as f64)
    } else {
        None
    };
    let faults0 = Faults::read();
    let t0 = Instant::now();
    let mut bufs = Vec::with_capacity(files.len());
    for file in &files {
        bufs.push(read_whole(file)?);
    }
    let len: usize = bufs.iter().map(Vec::len).sum();
    let elapsed = t0.elapsed();
    let mem = MemStatus::read();
    std::hint::black_box(&bufs);
    let load_ms = elapsed.as_secs_f64() * 1e3;
    let touch_ms = a.touch.then(|| {
        let t1 = Instant::now();
        for buf in &bufs {
            touch(buf);
        }
        t1.elapsed().as_secs_f64() * 1e3
    });
    let faults = match (faults0, Faults::read()) {
        (Some(a), Some(b)) => Some(b.since(a)),
        _ => None,
    };
    let after = MemStatus::read();
    let out = json!({
        "bytes": len as u64,
        "load_ms": round3(load_ms),
        "touch_ms": touch_ms.map(round3),
        "ready_ms": touch_ms.map(|t| round3(load_ms + t)),
        "major_faults": faults.map(|f| f.major),
        "minor_faults": faults.map(|f| f.minor),
        "resident_before_pct": resident_before.map(round3),
        "rss_anon_kib": mem.rss_anon_kib,
        "rss_file_kib": mem.rss_file_kib,
        "vm_hwm_kib": mem.vm_hwm_kib,
        "rss_anon_after_touch_kib": a.touch.then_some(after.rss_anon_kib).flatten(),
        "rss_file_after_touch_kib": a.touch.then_some(after.rss_file_kib).flatten(),
        "vm_hwm_after_touch_kib": a.touch.then_some(after.vm_hwm_kib).flatten(),
    });
    // One line: only `bench` reads this.
    emit(&format!("{out}\n"))
}

/// The whole of `file`, in one `read_exact`.
fn read_whole(file: &std::path::Path) -> CliResult<Vec<u8>> {
    let path = file.display();
    let mut f = File::open(file).map_err(|e| CliError::msg(format!("open {path}: {e}")))?;
    let len = f
        .metadata()
        .map_err(|e| CliError::msg(format!("stat {path}: {e}")))?
        .len();
    let len =
        usize::try_from(len).map_err(|_| CliError::msg(format!("{path}: too large to read")))?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)
        .map_err(|e| CliError::msg(format!("read {path}: {e}")))?;
    Ok(buf)
}
