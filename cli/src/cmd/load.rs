//! `weightmap load FILE [--mode mmap|stream] [--no-fallback] [--advice A]
//! [--prefetch P] [--evict] [--touch] [--hashes] [--json]`.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use sha2::{Digest, Sha256};
use weightmap::DirectIo;
use weightmap::{AccessAdvice, AdvicePolicy, LoadOptions, Prefetch, Weights};

use super::proc_status::{Faults, MemStatus};
use super::touch::touch;
use super::{emit, json_text, round3, table, CliError, CliResult, ModeArg};

pub const LONG_ABOUT: &str = "\
Load a file and report what the loader did and the memory it used.

With --mode mmap (the default) the file is mapped and tensors are viewed in
place; when that cannot be done (a misaligned tensor, a filesystem that
refuses mmap, ...) the loader falls back to the stream path and says why,
unless --no-fallback is given. The memory figures (RssAnon, RssFile, VmHWM
from /proc/self/status, in kB) are read right after the load, before any
tensor is touched, and again after --touch.

What a runtime waits for is the load plus its first pass over the weights:
--touch reads every tensor byte once, in file order, after the load, and
reports the touch time and the ready time (load plus touch). --evict drops
the file from the page cache first (posix_fadvise POSIX_FADV_DONTNEED; no
privilege needed) and reports how much of it was still resident, to measure
a cold start. Page faults are counted over load plus touch.

By default the mapped tensor region is advised MADV_NORMAL, with MADV_RANDOM
on row-lookup tables only (--advice per-tensor), and a background thread
reads the region in file order while the load returns, if it fits in half
of the memory budget (--prefetch background).

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
    /// Access advice for the mapped tensor region.
    #[arg(long, value_enum, default_value_t = AdviceArg::PerTensor)]
    advice: AdviceArg,
    /// Prefetch of the mapped tensor region.
    #[arg(long, value_enum, default_value_t = PrefetchArg::Background)]
    prefetch: PrefetchArg,
    /// Fall back to the stream path (or, with --no-fallback, fail) when any
    /// tensor would have to be copied, instead of copying just those.
    #[arg(long)]
    require_all_mapped: bool,
    /// Direct I/O on the stream path: auto (direct unless the file is
    /// mostly in the page cache), on, or off.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    direct_io: DirectArg,
    /// Threads reading copied tensors (0: the available parallelism, at most
    /// 4, or 4 for direct reads).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Hold the load to this memory budget (bytes, or with a K/M/G suffix)
    /// instead of the one read from MemAvailable and the memory cgroup.
    #[arg(long, value_parser = super::gen::parse_size)]
    budget: Option<u64>,
    /// Go ahead with copies and locks larger than the memory budget instead
    /// of refusing them (exit 1, "... over the memory budget ...").
    #[arg(long)]
    ignore_budget: bool,
    /// Owned buffers in base pages, not transparent huge pages (the
    /// default: MADV_HUGEPAGE, huge-page aligned).
    #[arg(long)]
    no_huge_pages: bool,
    /// Once the prefetch has mapped the region, drop and read again what
    /// the page cache held in small folios (filled by another process), so
    /// that decode reads huge pages; for a server that will decode for hours.
    #[arg(long)]
    reread_small_folios: bool,
    /// Drop the file from the page cache before loading (a cold start).
    #[arg(long)]
    evict: bool,
    /// After the load, read every tensor byte once in file order, and
    /// report the touch and ready times.
    #[arg(long)]
    touch: bool,
    /// Also print the sha256 of every tensor's bytes (read in one bounded
    /// pass, as --pass does).
    #[arg(long)]
    hashes: bool,
    /// After the load, read every tensor once in file order through the
    /// bounded pass (reads queued a window ahead, pages behind dropped), and
    /// report the pass time (`pass_ms`) and the window.
    #[arg(long)]
    pass: bool,
    /// The pass's read-ahead window (bytes, or with a K/M/G suffix;
    /// default: half of the memory budget, from 4 MiB to 64 MiB).
    #[arg(long, value_parser = super::gen::parse_size)]
    window: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `--advice`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AdviceArg {
    /// MADV_NORMAL, and MADV_RANDOM on row-lookup tables (the default).
    PerTensor,
    /// MADV_RANDOM over the whole region (no read-ahead).
    Random,
    /// MADV_NORMAL over the whole region.
    Normal,
    /// MADV_SEQUENTIAL over the whole region.
    Sequential,
}

impl From<AdviceArg> for AdvicePolicy {
    fn from(a: AdviceArg) -> AdvicePolicy {
        match a {
            AdviceArg::PerTensor => AdvicePolicy::PerTensor,
            AdviceArg::Random => AdvicePolicy::Uniform(AccessAdvice::Random),
            AdviceArg::Normal => AdvicePolicy::Uniform(AccessAdvice::Normal),
            AdviceArg::Sequential => AdvicePolicy::Uniform(AccessAdvice::Sequential),
        }
    }
}

/// `--direct-io`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DirectArg {
    /// Direct unless the file is mostly cached.
    Auto,
    /// Direct where the layout and filesystem allow.
    On,
    /// Through the page cache.
    Off,
}

impl From<DirectArg> for DirectIo {
    fn from(d: DirectArg) -> DirectIo {
        match d {
            DirectArg::Auto => DirectIo::Auto,
            DirectArg::On => DirectIo::On,
            DirectArg::Off => DirectIo::Off,
        }
    }
}

/// `--prefetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefetchArg {
    /// A background thread, within half of the memory budget (the default).
    Background,
    /// No prefetch.
    Off,
    /// MADV_WILLNEED over the region before returning.
    Willneed,
    /// Read and map every page before returning.
    Populate,
}

impl From<PrefetchArg> for Prefetch {
    fn from(p: PrefetchArg) -> Prefetch {
        match p {
            PrefetchArg::Background => Prefetch::DEFAULT,
            PrefetchArg::Off => Prefetch::None,
            PrefetchArg::Willneed => Prefetch::WillNeed,
            PrefetchArg::Populate => Prefetch::Populate,
        }
    }
}

/// Evict `path` from the page cache and return the percentage of it still
/// resident afterwards. Where the platform cannot drop a file's pages
/// (Windows, macOS: `weightmap::evict` says `Unsupported`), an error that
/// says so: a cold start cannot be measured there, and a warm one must not
/// pass for it.
pub fn evict(path: &std::path::Path) -> CliResult<f64> {
    let shown = path.display();
    weightmap::evict(path).map_err(|e| evict_error(path, &e))?;
    let r = weightmap::file_residency(path)
        .map_err(|e| CliError::msg(format!("measuring residency of {shown}: {e}")))?;
    Ok(r.fraction() * 100.0)
}

/// The error of evicting `path`; for a platform that cannot, one that says
/// which options need eviction.
pub fn evict_error(path: &std::path::Path, e: &std::io::Error) -> CliError {
    let shown = path.display();
    if e.kind() == std::io::ErrorKind::Unsupported {
        CliError::msg(format!(
            "evicting {shown} from the page cache: {e} (load --evict, read-baseline --evict \
             and bench --cold need a platform that can: Linux or Android)"
        ))
    } else {
        CliError::msg(format!("evicting {shown} from the page cache: {e}"))
    }
}

/// The bounded pass over `weights`, with `window` when one is given.
fn pass_of(weights: &Weights, window: Option<u64>) -> weightmap::Pass<'_> {
    match window {
        Some(n) => weights.pass().window(n),
        None => weights.pass(),
    }
}

/// Touch every tensor byte once, in file order; returns the bytes touched.
fn touch_all(weights: &Weights) -> CliResult<u64> {
    let mut order: Vec<_> = weights.tensors().collect();
    order.sort_by_key(|t| t.info().file_offset);
    let mut n = 0u64;
    for t in order {
        match t.host_bytes() {
            Some(b) => {
                touch(b);
            }
            None => {
                touch(&t.to_vec()?);
            }
        }
        n += t.placement().len as u64;
    }
    Ok(n)
}

pub fn run(a: &Args) -> CliResult {
    let opts = LoadOptions::default()
        .mode(a.mode.into())
        .fallback(!a.no_fallback)
        .advice(a.advice.into())
        .prefetch(a.prefetch.into())
        .require_all_mapped(a.require_all_mapped)
        .direct_io(a.direct_io.into())
        .read_threads(a.threads)
        .ignore_budget(a.ignore_budget)
        .reread_small_folios(a.reread_small_folios)
        .buffer_type(std::sync::Arc::new(
            weightmap::buffer::CpuBufferType::new().huge_pages(!a.no_huge_pages),
        ));
    let opts = match a.budget {
        Some(b) => opts.budget(b),
        None => opts,
    };
    let pb = super::progress::bar("load");
    let bar = pb.clone();
    let opts = opts.progress(move |done, total| {
        super::progress::update(&bar, done, total);
        std::ops::ControlFlow::Continue(())
    });
    let resident_before = if a.evict { Some(evict(&a.file)?) } else { None };
    let faults0 = Faults::read();
    // SAFETY: the file must not change while `weights` lives. This command
    // documents that requirement (`load --help`), holds the weights only
    // while it reports on them, and the process exits right after.
    let weights = unsafe { Weights::load(&a.file, &opts)? };
    if weights.prefetch_progress().is_none() {
        pb.finish_and_clear();
    }
    let mem = MemStatus::read();
    let r = weights.report();
    // From here on tensor bytes are read: a file truncated underneath is a
    // one-line error, not a silent SIGBUS.
    let _sigbus = super::sigbus::guard(&a.file);
    let touched = if a.touch {
        let t0 = Instant::now();
        touch_all(&weights)?;
        Some((t0.elapsed().as_secs_f64() * 1e3, MemStatus::read()))
    } else {
        None
    };
    // What decode will read through: measured after the touch (the first
    // pass maps the pages), else right after the load; after the re-read of
    // small folios when one was asked for.
    if a.reread_small_folios {
        weights.wait_prefetch();
    }
    let huge = weights.huge_pages();
    let faults = match (faults0, Faults::read()) {
        (Some(a), Some(b)) => Some(b.since(a)),
        _ => None,
    };
    let prefetch_progress = weights.prefetch_progress();
    let prefetched = prefetch_progress.map(|p| p.bytes_done);
    let reread = prefetch_progress.map(|p| p.bytes_reread);
    pb.finish_and_clear();
    // With --evict: how much of the file the load (and touch) left cached.
    let resident_after = if a.evict {
        weightmap::file_residency(&a.file)
            .ok()
            .map(|r| r.fraction() * 100.0)
    } else {
        None
    };

    let passed = if a.pass {
        let t0 = Instant::now();
        let pass = pass_of(&weights, a.window);
        let window = pass.window_bytes();
        for t in pass {
            let t = t?;
            match t.host_bytes() {
                Some(b) => touch(b),
                None => touch(&t.to_vec()?),
            };
        }
        Some((t0.elapsed().as_secs_f64() * 1e3, window))
    } else {
        None
    };
    let mut hashes = Vec::new();
    if a.hashes {
        for t in pass_of(&weights, a.window) {
            let t = t?;
            let digest = match t.host_bytes() {
                Some(b) => Sha256::digest(b),
                None => Sha256::digest(t.to_vec()?),
            };
            hashes.push((
                t.name().to_owned(),
                format!("{digest:x}"),
                t.placement_kind().name(),
            ));
        }
    }

    let load_ms = r.elapsed.as_secs_f64() * 1e3;
    let touch_ms = touched.as_ref().map(|t| t.0);
    let ready_ms = touch_ms.map(|t| load_ms + t);
    let after = touched.as_ref().map(|t| t.1);
    let out = if a.json {
        let fallback = r
            .fallback
            .as_ref()
            .map(|f| json!({"kind": f.name(), "detail": f.to_string()}));
        let mut o = json!({
            "format": r.format.name(),
            "mode_requested": r.mode_requested.name(),
            "mode_used": r.mode_used.name(),
            "fallback": fallback,
            "tensors_count": r.tensors_count,
            "tensors_mapped": r.tensors_mapped,
            "tensors_copied": r.tensors_copied,
            "bytes_mapped": r.bytes_mapped,
            "bytes_copied": r.bytes_copied,
            "copied": r.copied.iter().map(|c| json!({"name": c.name, "reason": c.reason.to_string()})).collect::<Vec<_>>(),
            "buffers": r.buffers.iter().map(|b| json!({
                "buffer_type": b.buffer_type,
                "mapped": b.mapped,
                "tensors": b.tensors,
                "bytes": b.bytes,
            })).collect::<Vec<_>>(),
            "load_ms": round3(load_ms),
            "touch_ms": touch_ms.map(round3),
            "ready_ms": ready_ms.map(round3),
            "major_faults": faults.map(|f| f.major),
            "minor_faults": faults.map(|f| f.minor),
            "resident_before_pct": resident_before.map(round3),
            "resident_after_pct": resident_after.map(round3),
            "read": r.read.as_ref().map(|rd| json!({
                "threads": rd.threads,
                "direct": rd.direct.to_string(),
                "direct_used": rd.direct == weightmap::DirectOutcome::Used,
            })),
            "pass_ms": passed.map(|p| round3(p.0)),
            "window_bytes": passed.map(|p| p.1),
            "budget_bytes": r.budget.bytes,
            "budget_source": r.budget.source,
            "prefetch": r.prefetch.to_string(),
            "prefetch_kind": r.prefetch.name(),
            "prefetched_bytes": prefetched,
            "prefetch_reread_bytes": reread,
            "reread_small_folios": r.reread.to_string(),
            "random_access_tensors": r.random_access_tensors,
            "shards": r.shards.len().max(1),
            "shard_files": r.shards.iter().map(|sh| json!({
                "path": sh.path.display().to_string(),
                "tensors": sh.tensors,
                "bytes": sh.bytes,
                "mode_used": sh.mode_used.name(),
            })).collect::<Vec<_>>(),
            "warnings": r.warnings,
            "rss_anon_kib": mem.rss_anon_kib,
            "rss_file_kib": mem.rss_file_kib,
            "vm_hwm_kib": mem.vm_hwm_kib,
            "rss_anon_after_touch_kib": after.and_then(|m| m.rss_anon_kib),
            "rss_file_after_touch_kib": after.and_then(|m| m.rss_file_kib),
            "vm_hwm_after_touch_kib": after.and_then(|m| m.vm_hwm_kib),
            "huge_pages": super::huge_pages_json(&huge),
        });
        if a.hashes {
            o["tensors"] = hashes
                .iter()
                .map(|(n, h, p)| json!({"name": n, "sha256": h, "placement": p}))
                .collect();
        }
        json_text(&o)
    } else {
        let kib = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v} kB"));
        let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3} ms"));
        let count = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
        let fallback = r
            .fallback
            .as_ref()
            .map_or_else(|| "none".to_owned(), |f| format!("{}: {f}", f.name()));
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
                vec![
                    "copied:".into(),
                    if r.copied.is_empty() {
                        "none".into()
                    } else {
                        let mut v: Vec<String> = r
                            .copied
                            .iter()
                            .take(8)
                            .map(|c| format!("{} ({})", super::escape(&c.name), c.reason))
                            .collect();
                        if r.copied.len() > 8 {
                            v.push(format!("and {} more", r.copied.len() - 8));
                        }
                        v.join(", ")
                    },
                ],
                vec![
                    "tensors:".into(),
                    format!(
                        "{} ({} mapped, {} copied)",
                        r.tensors_count, r.tensors_mapped, r.tensors_copied
                    ),
                ],
                vec!["bytes mapped:".into(), r.bytes_mapped.to_string()],
                vec!["bytes copied:".into(), r.bytes_copied.to_string()],
                vec![
                    "files:".into(),
                    if r.shards.is_empty() {
                        "1".into()
                    } else {
                        r.shards
                            .iter()
                            .map(|sh| {
                                format!(
                                    "{} ({} tensors)",
                                    super::escape(&sh.path.display().to_string()),
                                    sh.tensors
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                ],
                vec![
                    "budget:".into(),
                    match r.budget.bytes {
                        Some(b) => format!("{} ({})", super::human_bytes(b), r.budget.source),
                        None => r.budget.source.clone(),
                    },
                ],
                vec!["prefetch:".into(), r.prefetch.to_string()],
                vec![
                    "reads:".into(),
                    r.read.as_ref().map_or_else(
                        || "none (nothing copied)".into(),
                        |rd| format!("{}, {} threads", rd.direct, rd.threads),
                    ),
                ],
                vec![
                    "random-access tensors:".into(),
                    if r.random_access_tensors.is_empty() {
                        "none".into()
                    } else {
                        r.random_access_tensors.join(", ")
                    },
                ],
                vec![
                    "resident before:".into(),
                    resident_before.map_or_else(|| "n/a".into(), |p| format!("{p:.1}%")),
                ],
                vec![
                    "resident after:".into(),
                    resident_after.map_or_else(|| "n/a".into(), |p| format!("{p:.1}%")),
                ],
                vec!["load time:".into(), format!("{load_ms:.3} ms")],
                vec!["touch time:".into(), ms(touch_ms)],
                vec!["ready time:".into(), ms(ready_ms)],
                vec!["major faults:".into(), count(faults.map(|f| f.major))],
                vec!["minor faults:".into(), count(faults.map(|f| f.minor))],
                vec!["RssAnon:".into(), kib(mem.rss_anon_kib)],
                vec!["RssFile:".into(), kib(mem.rss_file_kib)],
                vec!["VmHWM:".into(), kib(mem.vm_hwm_kib)],
                vec![
                    "RssAnon after touch:".into(),
                    kib(after.and_then(|m| m.rss_anon_kib)),
                ],
                vec![
                    "RssFile after touch:".into(),
                    kib(after.and_then(|m| m.rss_file_kib)),
                ],
                vec![
                    if a.touch {
                        "huge pages after touch:".into()
                    } else {
                        "huge pages:".into()
                    },
                    super::huge_pages_text(&huge),
                ],
                vec![
                    "small folios:".into(),
                    super::small_folios_text(&huge, reread),
                ],
                vec!["re-read of small folios:".into(), r.reread.to_string()],
            ],
            2,
            "",
        );
        if a.hashes {
            out.push_str("\nsha256 of each tensor's bytes:\n");
            let rows: Vec<Vec<String>> = hashes
                .into_iter()
                .map(|(n, h, p)| vec![h, p.to_owned(), super::escape(&n).into_owned()])
                .collect();
            out.push_str(&table(&rows, 3, "  "));
        }
        out
    };
    emit(&out)
}
