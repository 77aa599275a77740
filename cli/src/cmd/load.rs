//! `weightmap load FILE [--mode mmap|stream] [--no-fallback] [--advice A]
//! [--prefetch P] [--evict] [--touch] [--hashes] [--json]`.

use std::path::PathBuf;
use std::time::Instant;

use indicatif::ProgressBar;
use serde_json::json;
use sha2::{Digest, Sha256};
use weightmap::cache::parse_size;
use weightmap::DirectIo;
use weightmap::{
    AccessAdvice, AdvicePolicy, HugePages, LoadOptions, LoadReport, Prefetch, Weights,
};

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
    #[arg(long, value_parser = parse_size)]
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
    #[arg(long, value_parser = parse_size)]
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

/// What `load` measured around the load, beside the loader's own report.
struct Measured {
    /// With --evict: the percentage of the file still resident after the
    /// eviction, before the load.
    resident_before: Option<f64>,
    /// The process's memory right after the load, before any tensor is read.
    mem: MemStatus,
    /// With --touch: the touch time (ms) and the memory after it.
    touched: Option<(f64, MemStatus)>,
    /// What the tensors settled into once the touch (if any) was done.
    settled: Settled,
    /// With --evict: how much of the file the load (and touch) left cached.
    resident_after: Option<f64>,
    /// With --pass: the pass time (ms) and its read-ahead window (bytes).
    passed: Option<(f64, u64)>,
    /// With --hashes: every tensor's sha256, in pass order.
    hashes: Vec<TensorHash>,
}

/// The load time the loader reported, in ms.
fn load_ms(r: &LoadReport) -> f64 {
    r.elapsed.as_secs_f64() * 1e3
}

impl Measured {
    fn touch_ms(&self) -> Option<f64> {
        self.touched.as_ref().map(|t| t.0)
    }

    /// What a runtime waits for: the load plus its first pass (--touch).
    fn ready_ms(&self, r: &LoadReport) -> Option<f64> {
        self.touch_ms().map(|t| load_ms(r) + t)
    }

    fn mem_after_touch(&self) -> Option<MemStatus> {
        self.touched.as_ref().map(|t| t.1)
    }
}

/// The state decode will read through, taken after the touch.
struct Settled {
    /// Where the placed tensors sit: huge pages or base pages.
    huge: HugePages,
    /// Page faults over load plus touch.
    faults: Option<Faults>,
    /// The prefetch's bytes read so far (`None`: no prefetch ran).
    prefetched: Option<u64>,
    /// The prefetch's bytes read again (--reread-small-folios).
    reread: Option<u64>,
}

impl Settled {
    fn read(a: &Args, weights: &Weights, faults_before: Option<Faults>) -> Settled {
        // Measured after the touch (the first pass maps the pages), else
        // right after the load; after the re-read of small folios when one
        // was asked for, since that re-read is what changes them.
        if a.reread_small_folios {
            weights.wait_prefetch();
        }
        let huge = weights.huge_pages();
        let faults = match (faults_before, Faults::read()) {
            (Some(a), Some(b)) => Some(b.since(a)),
            _ => None,
        };
        let progress = weights.prefetch_progress();
        Settled {
            huge,
            faults,
            prefetched: progress.map(|p| p.bytes_done),
            reread: progress.map(|p| p.bytes_reread),
        }
    }
}

/// One tensor's line of --hashes.
struct TensorHash {
    name: String,
    sha256: String,
    placement: &'static str,
}

/// `load`: load the file as the flags ask, measure what that took, and
/// print the report (text, or JSON with --json).
pub fn run(a: &Args) -> CliResult {
    let pb = super::progress::bar("load");
    let opts = load_options(a, &pb);
    let resident_before = if a.evict { Some(evict(&a.file)?) } else { None };
    let faults_before = Faults::read();
    // SAFETY: the file must not change while `weights` lives. This command
    // documents that requirement (`load --help`), holds the weights only
    // while it reports on them, and the process exits right after.
    let weights = unsafe { Weights::load(&a.file, &opts)? };
    // A background prefetch goes on filling the bar until it is measured.
    if weights.prefetch_progress().is_none() {
        pb.finish_and_clear();
    }
    let mem = MemStatus::read();
    // From here on tensor bytes are read: a file truncated underneath is a
    // one-line error, not a silent SIGBUS.
    let _sigbus = super::sigbus::guard(&a.file);
    let touched = if a.touch {
        Some(timed_touch(&weights)?)
    } else {
        None
    };
    let settled = Settled::read(a, &weights, faults_before);
    pb.finish_and_clear();
    let resident_after = if a.evict { resident_pct(&a.file) } else { None };
    let passed = if a.pass {
        Some(timed_pass(&weights, a.window)?)
    } else {
        None
    };
    let hashes = if a.hashes {
        tensor_hashes(&weights, a.window)?
    } else {
        Vec::new()
    };
    let m = Measured {
        resident_before,
        mem,
        touched,
        settled,
        resident_after,
        passed,
        hashes,
    };
    let r = weights.report();
    emit(&if a.json {
        report_json(a, r, &m)
    } else {
        report_text(a, r, &m)
    })
}

/// The loader's options as the flags ask, with progress shown on `pb`.
fn load_options(a: &Args, pb: &ProgressBar) -> LoadOptions {
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
    // Without --budget the loader reads its own from the system.
    let opts = match a.budget {
        Some(b) => opts.budget(b),
        None => opts,
    };
    let bar = pb.clone();
    opts.progress(move |done, total| {
        super::progress::update(&bar, done, total);
        std::ops::ControlFlow::Continue(())
    })
}

/// --touch: touch every tensor byte once, in file order; returns the time
/// it took (ms) and the memory after it.
fn timed_touch(weights: &Weights) -> CliResult<(f64, MemStatus)> {
    let t0 = Instant::now();
    touch_all(weights)?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, MemStatus::read()))
}

/// The percentage of `path` in the page cache, if it can be measured.
fn resident_pct(path: &std::path::Path) -> Option<f64> {
    weightmap::file_residency(path)
        .ok()
        .map(|r| r.fraction() * 100.0)
}

/// --pass: read every tensor once through the bounded pass; returns the
/// time it took (ms) and the pass's window (bytes).
fn timed_pass(weights: &Weights, window: Option<u64>) -> CliResult<(f64, u64)> {
    let t0 = Instant::now();
    let pass = pass_of(weights, window);
    let window = pass.window_bytes();
    for t in pass {
        let t = t?;
        match t.host_bytes() {
            Some(b) => touch(b),
            None => touch(&t.to_vec()?),
        };
    }
    Ok((t0.elapsed().as_secs_f64() * 1e3, window))
}

/// --hashes: the sha256 of every tensor's bytes, read in one bounded pass.
fn tensor_hashes(weights: &Weights, window: Option<u64>) -> CliResult<Vec<TensorHash>> {
    let mut hashes = Vec::new();
    for t in pass_of(weights, window) {
        let t = t?;
        let digest = match t.host_bytes() {
            Some(b) => Sha256::digest(b),
            None => Sha256::digest(t.to_vec()?),
        };
        hashes.push(TensorHash {
            name: t.name().to_owned(),
            sha256: format!("{digest:x}"),
            placement: t.placement_kind().name(),
        });
    }
    Ok(hashes)
}

/// The report as JSON (--json). Its fields are relied on by scripts and by
/// `bench`, which reads every child's.
fn report_json(a: &Args, r: &LoadReport, m: &Measured) -> String {
    let s = &m.settled;
    let after = m.mem_after_touch();
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
        "load_ms": round3(load_ms(r)),
        "touch_ms": m.touch_ms().map(round3),
        "ready_ms": m.ready_ms(r).map(round3),
        "major_faults": s.faults.map(|f| f.major),
        "minor_faults": s.faults.map(|f| f.minor),
        "resident_before_pct": m.resident_before.map(round3),
        "resident_after_pct": m.resident_after.map(round3),
        "read": r.read.as_ref().map(|rd| json!({
            "threads": rd.threads,
            "direct": rd.direct.to_string(),
            "direct_used": rd.direct == weightmap::DirectOutcome::Used,
        })),
        "pass_ms": m.passed.map(|p| round3(p.0)),
        "window_bytes": m.passed.map(|p| p.1),
        "budget_bytes": r.budget.bytes,
        "budget_source": r.budget.source,
        "prefetch": r.prefetch.to_string(),
        "prefetch_kind": r.prefetch.name(),
        "prefetched_bytes": s.prefetched,
        "prefetch_reread_bytes": s.reread,
        "reread_small_folios": r.reread.to_string(),
        "residency": r.residency.to_string(),
        "residency_kind": r.residency.name(),
        "random_access_tensors": r.random_access_tensors,
        "shards": r.shards.len().max(1),
        "shard_files": r.shards.iter().map(|sh| json!({
            "path": sh.path.display().to_string(),
            "tensors": sh.tensors,
            "bytes": sh.bytes,
            "mode_used": sh.mode_used.name(),
        })).collect::<Vec<_>>(),
        "warnings": r.warnings,
        "rss_anon_kib": m.mem.rss_anon_kib,
        "rss_file_kib": m.mem.rss_file_kib,
        "vm_hwm_kib": m.mem.vm_hwm_kib,
        "rss_anon_after_touch_kib": after.and_then(|m| m.rss_anon_kib),
        "rss_file_after_touch_kib": after.and_then(|m| m.rss_file_kib),
        "vm_hwm_after_touch_kib": after.and_then(|m| m.vm_hwm_kib),
        "huge_pages": super::huge_pages_json(&s.huge),
    });
    // Beside the rest (one more key in `json!` passes its recursion limit).
    o["streamed_tensors"] = json!(r.streamed_tensors);
    // What a cgroup's budget counted (null for other figures).
    o["budget_limit"] = json!(r.budget.limit);
    o["budget_usage"] = json!(r.budget.usage);
    o["budget_reclaimable"] = json!(r.budget.reclaimable);
    o["budget_own_cached"] = json!(r.budget.own_cached);
    // Only with --hashes: without it the key is absent, not empty.
    if a.hashes {
        o["tensors"] = m
            .hashes
            .iter()
            .map(|h| json!({"name": h.name, "sha256": h.sha256, "placement": h.placement}))
            .collect();
    }
    json_text(&o)
}

/// The report for people: a two-column table, then with --hashes the
/// table of tensor digests.
fn report_text(a: &Args, r: &LoadReport, m: &Measured) -> String {
    let mut out = table(&report_rows(a, r, m), 2, "");
    if a.hashes {
        out.push_str("\nsha256 of each tensor's bytes:\n");
        let rows: Vec<Vec<String>> = m
            .hashes
            .iter()
            .map(|h| {
                vec![
                    h.sha256.clone(),
                    h.placement.to_owned(),
                    super::escape(&h.name).into_owned(),
                ]
            })
            .collect();
        out.push_str(&table(&rows, 3, "  "));
    }
    out
}

/// The rows of the text report: a label and a value each.
fn report_rows(a: &Args, r: &LoadReport, m: &Measured) -> Vec<Vec<String>> {
    let kib = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v} kB"));
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3} ms"));
    let count = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
    let pct = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |p| format!("{p:.1}%"));
    let s = &m.settled;
    let after = m.mem_after_touch();
    let fallback = r
        .fallback
        .as_ref()
        .map_or_else(|| "none".to_owned(), |f| format!("{}: {f}", f.name()));
    let mode = format!(
        "{} (requested {})",
        r.mode_used.name(),
        r.mode_requested.name()
    );
    let tensors = format!(
        "{} ({} mapped, {} copied)",
        r.tensors_count, r.tensors_mapped, r.tensors_copied
    );
    let reads = r.read.as_ref().map_or_else(
        || "none (nothing copied)".into(),
        |rd| format!("{}, {} threads", rd.direct, rd.threads),
    );
    let names = |tensors: &[String]| match tensors.is_empty() {
        true => "none".to_owned(),
        false => tensors.join(", "),
    };
    let huge_label = if a.touch {
        "huge pages after touch:"
    } else {
        "huge pages:"
    };
    let rows = [
        ("file:", a.file.display().to_string()),
        ("format:", r.format.name().into()),
        ("mode:", mode),
        ("fallback:", fallback),
        ("copied:", copied_text(r)),
        ("tensors:", tensors),
        ("bytes mapped:", r.bytes_mapped.to_string()),
        ("bytes copied:", r.bytes_copied.to_string()),
        ("files:", files_text(r)),
        ("budget:", budget_text(r)),
        ("prefetch:", r.prefetch.to_string()),
        ("residency:", r.residency.to_string()),
        ("reads:", reads),
        ("random-access tensors:", names(&r.random_access_tensors)),
        ("streamed tensors:", names(&r.streamed_tensors)),
        ("resident before:", pct(m.resident_before)),
        ("resident after:", pct(m.resident_after)),
        ("load time:", format!("{:.3} ms", load_ms(r))),
        ("touch time:", ms(m.touch_ms())),
        ("ready time:", ms(m.ready_ms(r))),
        ("major faults:", count(s.faults.map(|f| f.major))),
        ("minor faults:", count(s.faults.map(|f| f.minor))),
        ("RssAnon:", kib(m.mem.rss_anon_kib)),
        ("RssFile:", kib(m.mem.rss_file_kib)),
        ("VmHWM:", kib(m.mem.vm_hwm_kib)),
        (
            "RssAnon after touch:",
            kib(after.and_then(|m| m.rss_anon_kib)),
        ),
        (
            "RssFile after touch:",
            kib(after.and_then(|m| m.rss_file_kib)),
        ),
        (huge_label, super::huge_pages_text(&s.huge)),
        ("small folios:", super::small_folios_text(&s.huge, s.reread)),
        ("re-read of small folios:", r.reread.to_string()),
    ];
    rows.into_iter()
        .map(|(label, value)| vec![label.to_owned(), value])
        .collect()
}

/// The tensors the load copied, for people: the first eight and how many
/// more, so that a model copied whole does not flood the report.
fn copied_text(r: &LoadReport) -> String {
    if r.copied.is_empty() {
        return "none".into();
    }
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
}

/// The model's files, for people: `1` for a single file, else each shard
/// with its tensor count.
fn files_text(r: &LoadReport) -> String {
    if r.shards.is_empty() {
        return "1".into();
    }
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
}

/// The memory budget and where it came from, for people.
fn budget_text(r: &LoadReport) -> String {
    match r.budget.bytes {
        Some(b) => {
            let mut text = format!("{} ({})", super::human_bytes(b), r.budget.source);
            let b = &r.budget;
            if let (Some(limit), Some(usage), Some(reclaimable), Some(own)) =
                (b.limit, b.usage, b.reclaimable, b.own_cached)
            {
                let h = super::human_bytes;
                text += &format!(
                    ": limit {}, usage {}, of it reclaimable {} and the model's own {}",
                    h(limit),
                    h(usage),
                    h(reclaimable),
                    h(own)
                );
            }
            text
        }
        None => r.budget.source.clone(),
    }
}
