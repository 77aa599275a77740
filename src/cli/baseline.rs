//! `weightmap read-baseline FILE --json` (hidden): read the whole file into
//! one buffer with a plain sequential read, the yardstick `bench` holds the
//! stream path to.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::proc_status::MemStatus;
use super::{emit, round3, CliError, CliResult};

/// Arguments of `read-baseline`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The file to read.
    file: PathBuf,
    /// Print JSON (the only output; accepted for symmetry with `load`).
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> CliResult {
    let path = a.file.display();
    let t0 = Instant::now();
    let mut f = File::open(&a.file).map_err(|e| CliError::msg(format!("open {path}: {e}")))?;
    let len = f
        .metadata()
        .map_err(|e| CliError::msg(format!("stat {path}: {e}")))?
        .len();
    let len =
        usize::try_from(len).map_err(|_| CliError::msg(format!("{path}: too large to read")))?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)
        .map_err(|e| CliError::msg(format!("read {path}: {e}")))?;
    let elapsed = t0.elapsed();
    let mem = MemStatus::read();
    std::hint::black_box(&buf);
    let out = json!({
        "bytes": len as u64,
        "load_ms": round3(elapsed.as_secs_f64() * 1e3),
        "rss_anon_kib": mem.rss_anon_kib,
        "rss_file_kib": mem.rss_file_kib,
        "vm_hwm_kib": mem.vm_hwm_kib,
    });
    // One line: only `bench` reads this.
    emit(&format!("{out}\n"))
}
