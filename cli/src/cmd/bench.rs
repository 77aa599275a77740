//! `weightmap bench [FILE] [--iters N] [--warmup N] [--cold] [--modes LIST] [--json]
//! [--format gguf|safetensors]`.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use weightmap::{Format, ModelHeaders};

use super::model_cache;
use super::{emit, human_bytes, json_text, round3, table, CliError, CliResult, FormatArg};

pub const LONG_ABOUT: &str = "\
Compare load paths by what a runtime waits for, each run in a fresh process.

Every run is a child `weightmap load FILE ... --touch --json`: it loads, then
reads every tensor byte once in file order (a first forward pass), and
reports the load time and the ready time (load plus touch), page faults and
memory. The modes (--modes, in this order by default):

  mmap          the library's defaults: mapped, MADV_RANDOM on row-lookup
                tables only, background prefetch within half of the memory budget
  mmap-random   mapped, MADV_RANDOM over the whole region, no prefetch
                (weightmap's default before 0.2)
  mmap-normal   mapped, MADV_NORMAL over the whole region, no prefetch
                (the kernel's default read-ahead)
  stream        read into one owned buffer
  baseline      one read() of each file of the model into a Vec of its
                own, then the touch

and, on request, mmap-sequential (MADV_SEQUENTIAL, no prefetch),
mmap-populate (read and map every page before returning, as llama.cpp),
stream-buffered (through the page cache), stream-direct (O_DIRECT) and
stream-small (owned buffers in base pages, --no-huge-pages; stream's owned
buffers are in transparent huge pages).

Runs are interleaved (mmap, mmap-random, ..., mmap, ...) so that drift
affects all alike; warmup iterations are run the same way and discarded.
Without --cold the file is read once before timing so every run finds it in
the page cache. With --cold every run first drops the file from the page
cache (posix_fadvise POSIX_FADV_DONTNEED, no privilege needed) and reports
how much was still resident. One more child per mapped and stream mode loads
with --hashes, and the sha256 of every tensor is compared across modes.

Without FILE, a default synthetic model (512 MiB of tensors, 300 tensors,
262,144-token vocabulary, mixed f32/f16/q8_0/q4_K/q6_K) is generated once
into $WEIGHTMAP_CACHE, or target/weightmap-cache/ under the current directory
if it is writable, or weightmap-cache/ in the system temporary directory, and
reused while its sha256 matches the one recorded when it was written. A model
just generated is dropped from the page cache where the platform allows, so
that the warm-up read fills the cache as it would for a stored model (the
generator's writes leave small folios). --format safetensors generates the
safetensors variant instead.

The file must not be modified while bench runs.";

/// Arguments of `bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to load. Without it, the default synthetic model (see above).
    file: Option<PathBuf>,
    /// Timed iterations per mode.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    iters: u64,
    /// Discarded iterations per mode, before the timed ones.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    warmup: u64,
    /// Evict the file from the page cache before every run.
    #[arg(long)]
    cold: bool,
    /// The modes to run, comma-separated (see above).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Kind::Mmap, Kind::MmapRandom, Kind::MmapNormal, Kind::Stream, Kind::Baseline])]
    modes: Vec<Kind>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Format of the default model (only without FILE).
    #[arg(long, value_enum, conflicts_with = "file")]
    format: Option<FormatArg>,
}

/// A way of loading that bench times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Mapped, library defaults.
    Mmap,
    /// Mapped, MADV_RANDOM everywhere, no prefetch.
    MmapRandom,
    /// Mapped, MADV_NORMAL everywhere, no prefetch.
    MmapNormal,
    /// Mapped, MADV_SEQUENTIAL everywhere, no prefetch.
    MmapSequential,
    /// Mapped, every page read before returning.
    MmapPopulate,
    /// Streamed into an owned buffer (library defaults: direct I/O on a
    /// cold cache).
    Stream,
    /// Streamed, always through the page cache.
    StreamBuffered,
    /// Streamed, always with O_DIRECT.
    StreamDirect,
    /// Streamed into a buffer in base pages (`--no-huge-pages`).
    StreamSmall,
    /// One read() of each whole file of the model, then the touch.
    Baseline,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mmap => "mmap",
            Kind::MmapRandom => "mmap-random",
            Kind::MmapNormal => "mmap-normal",
            Kind::MmapSequential => "mmap-sequential",
            Kind::MmapPopulate => "mmap-populate",
            Kind::Stream => "stream",
            Kind::StreamBuffered => "stream-buffered",
            Kind::StreamDirect => "stream-direct",
            Kind::StreamSmall => "stream-small",
            Kind::Baseline => "baseline",
        }
    }

    fn mapped(self) -> bool {
        !matches!(
            self,
            Kind::Stream
                | Kind::StreamBuffered
                | Kind::StreamDirect
                | Kind::StreamSmall
                | Kind::Baseline
        )
    }

    fn args(self, file: &Path, cold: bool, hashes: bool) -> Vec<OsString> {
        let mode = |m: &str, extra: &[&str]| {
            let mut v: Vec<OsString> = vec!["load".into(), file.into(), "--mode".into(), m.into()];
            v.extend(extra.iter().map(OsString::from));
            v
        };
        let mut v = match self {
            Kind::Baseline => vec!["read-baseline".into(), file.into()],
            Kind::Mmap => mode("mmap", &[]),
            Kind::MmapRandom => mode("mmap", &["--advice", "random", "--prefetch", "off"]),
            Kind::MmapNormal => mode("mmap", &["--advice", "normal", "--prefetch", "off"]),
            Kind::MmapSequential => mode("mmap", &["--advice", "sequential", "--prefetch", "off"]),
            Kind::MmapPopulate => mode("mmap", &["--prefetch", "populate"]),
            Kind::Stream => mode("stream", &[]),
            Kind::StreamBuffered => mode("stream", &["--direct-io", "off"]),
            Kind::StreamDirect => mode("stream", &["--direct-io", "on"]),
            Kind::StreamSmall => mode("stream", &["--no-huge-pages"]),
        };
        v.push("--json".into());
        if hashes {
            v.push("--hashes".into());
        } else {
            v.push("--touch".into());
            if cold {
                v.push("--evict".into());
            }
        }
        v
    }
}

/// One child's report.
#[derive(Debug)]
struct Sample {
    load_ms: f64,
    ready_ms: Option<f64>,
    major_faults: Option<u64>,
    resident_before_pct: Option<f64>,
    resident_after_pct: Option<f64>,
    rss_anon_kib: Option<u64>,
    rss_anon_after_touch_kib: Option<u64>,
    rss_file_after_touch_kib: Option<u64>,
    /// The share of the placed tensors' bytes in huge pages after the
    /// touch, in percent (`load --json`'s `huge_pages`).
    huge_pct: Option<f64>,
    vm_hwm_kib: Option<u64>,
    bytes_mapped: Option<u64>,
    bytes_copied: Option<u64>,
    mode_used: Option<String>,
    fallback: Option<String>,
    prefetch: Option<String>,
    tensors: Option<Vec<(String, String)>>,
}

struct Stats {
    mean: f64,
    median: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(v: &[f64]) -> Option<Stats> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Stats {
            mean: s.iter().sum::<f64>() / n as f64,
            median,
            min: s[0],
            max: s[n - 1],
        })
    }

    fn json(s: Option<&Stats>, samples: &[f64]) -> Value {
        let f = |g: fn(&Stats) -> f64| s.map(|s| round3(g(s)));
        json!({
            "mean": f(|s| s.mean),
            "median": f(|s| s.median),
            "min": f(|s| s.min),
            "max": f(|s| s.max),
            "samples": samples.iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        })
    }
}

/// Per-mode results.
struct ModeResult {
    kind: Kind,
    samples: Vec<Sample>,
    load: Option<Stats>,
    ready: Option<Stats>,
}

impl ModeResult {
    /// The results of `kind` from its timed runs.
    fn of(kind: Kind, samples: Vec<Sample>) -> ModeResult {
        let mut r = ModeResult {
            kind,
            samples,
            load: None,
            ready: None,
        };
        r.load = Stats::of(&r.loads());
        r.ready = Stats::of(&r.readies());
        r
    }

    fn loads(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.load_ms).collect()
    }
    fn readies(&self) -> Vec<f64> {
        self.samples.iter().filter_map(|s| s.ready_ms).collect()
    }
    fn peak(&self, f: fn(&Sample) -> Option<u64>) -> Option<u64> {
        self.samples.iter().filter_map(f).max()
    }
    fn median_of(&self, f: fn(&Sample) -> Option<f64>) -> Option<f64> {
        Stats::of(&self.samples.iter().filter_map(f).collect::<Vec<_>>()).map(|s| s.median)
    }
    fn first(&self, f: fn(&Sample) -> Option<&String>) -> Option<String> {
        self.samples.first().and_then(f).cloned()
    }
}

/// What bench runs, settled before the first timed run.
struct Setup {
    /// The model every child loads.
    file: PathBuf,
    /// Whether `file` is the default model (no FILE was given).
    generated: bool,
    format: Format,
    file_len: u64,
    n_tensors: usize,
    /// How many files the model is in.
    n_files: usize,
    /// This executable: every child runs it.
    exe: PathBuf,
    /// The modes, each once, in the order first asked for.
    kinds: Vec<Kind>,
    /// Without --cold: how long the warm-up read of the file took.
    warm: Option<Duration>,
}

impl Setup {
    /// Check, resolve and warm up everything the runs need, failing before
    /// any of them on whatever would make them all fail.
    fn prepare(a: &Args) -> CliResult<Setup> {
        if a.cold {
            refuse_cold_where_nothing_evicts()?;
        }
        let (file, generated) = match &a.file {
            Some(f) => (f.clone(), false),
            None => (
                model_cache::default_model(a.format.map_or(Format::Gguf, Into::into))?,
                true,
            ),
        };
        // Fail early, with the loader's own message, on a file that cannot load.
        let model = ModelHeaders::read(&file)?;
        let exe = std::env::current_exe().map_err(|e| {
            CliError::msg(format!("cannot find this executable to run children: {e}"))
        })?;
        let warm = if a.cold {
            None
        } else {
            Some(warm_page_cache(&file)?)
        };
        Ok(Setup {
            format: model.first().format(),
            file_len: model.file_len(),
            n_tensors: model.tensor_count(),
            n_files: model.files.len(),
            file,
            generated,
            exe,
            kinds: distinct_in_order(&a.modes),
            warm,
        })
    }
}

/// `kinds` without repeats, each where it first appears.
fn distinct_in_order(kinds: &[Kind]) -> Vec<Kind> {
    let mut out: Vec<Kind> = Vec::new();
    for k in kinds {
        if !out.contains(k) {
            out.push(*k);
        }
    }
    out
}

/// Whether every mode placed the same tensor bytes.
struct ByteCheck {
    identical: bool,
    /// The first mode and tensor that differ from the reference.
    first_diff: Option<String>,
    /// How many tensors the reference mode hashed.
    compared: usize,
}

/// The named ratios of the modes' medians that bench reports, in order;
/// `None` where a mode was not run or a median is zero.
type Ratios = [(&'static str, Option<f64>); 6];

/// What bench found, ready to print.
struct Outcome {
    results: Vec<ModeResult>,
    bytes: ByteCheck,
    /// The best kernel advice without prefetch (and its ready median).
    best_advice: Option<(Kind, f64)>,
    ratios: Ratios,
}

/// `bench`: time every mode in fresh processes, check they place the same
/// bytes, and print the comparison (text, or JSON with --json).
pub fn run(a: &Args) -> CliResult {
    let setup = Setup::prepare(a)?;
    let results = time_modes(a, &setup)?;
    let bytes = compare_tensor_bytes(&setup)?;
    let best_advice = best_advice(&results);
    let ratios = ratios(&results, best_advice);
    let outcome = Outcome {
        results,
        bytes,
        best_advice,
        ratios,
    };
    emit(&if a.json {
        report_json(a, &setup, &outcome)
    } else {
        report_text(a, &setup, &outcome)
    })
}

/// Run every mode `a.warmup + a.iters` times and keep the timed runs.
fn time_modes(a: &Args, setup: &Setup) -> CliResult<Vec<ModeResult>> {
    let kinds = &setup.kinds;
    let mut samples: Vec<Vec<Sample>> = kinds.iter().map(|_| Vec::new()).collect();
    // Interleaved, one run of each mode in turn, so that drift (thermal,
    // other load) affects all modes alike.
    for i in 0..a.warmup + a.iters {
        for (k, kind) in kinds.iter().enumerate() {
            let s = run_child(&setup.exe, &setup.file, *kind, a.cold, false)?;
            if i >= a.warmup {
                samples[k].push(s);
            }
        }
    }
    Ok(kinds
        .iter()
        .zip(samples)
        .map(|(&kind, samples)| ModeResult::of(kind, samples))
        .collect())
}

/// Hash every tensor as each mode that places tensors loads it, and
/// compare each mode's hashes with the first one's.
fn compare_tensor_bytes(setup: &Setup) -> CliResult<ByteCheck> {
    let mut hashes: Vec<(Kind, Vec<(String, String)>)> = Vec::new();
    for &kind in setup.kinds.iter().filter(|k| **k != Kind::Baseline) {
        let t = run_child(&setup.exe, &setup.file, kind, false, true)?
            .tensors
            .unwrap_or_default();
        hashes.push((kind, t));
    }
    let reference = hashes.first().map(|(_, t)| t.clone()).unwrap_or_default();
    // A reference that missed tensors proves nothing, even if all agree.
    let mut identical = reference.len() == setup.n_tensors;
    let mut first_diff = None;
    for (kind, t) in &hashes {
        if t != &reference {
            identical = false;
            first_diff = first_diff.or_else(|| {
                let d = t.iter().zip(&reference).find(|(x, y)| x != y).map_or_else(
                    || "tensor lists differ in length".into(),
                    |(x, _)| x.0.clone(),
                );
                Some(format!("{}: {d}", kind.name()))
            });
        }
    }
    Ok(ByteCheck {
        identical,
        first_diff,
        compared: reference.len(),
    })
}

/// The median load (or, with `ready`, ready) time of `kind`, if it ran.
fn median_ms(results: &[ModeResult], kind: Kind, ready: bool) -> Option<f64> {
    results
        .iter()
        .find(|r| r.kind == kind)
        .and_then(|r| {
            if ready {
                r.ready.as_ref()
            } else {
                r.load.as_ref()
            }
        })
        .map(|s| s.median)
}

/// The best kernel advice without prefetch, among those run: the one with
/// the lowest median ready time.
fn best_advice(results: &[ModeResult]) -> Option<(Kind, f64)> {
    [Kind::MmapNormal, Kind::MmapSequential, Kind::MmapRandom]
        .into_iter()
        .filter_map(|k| median_ms(results, k, true).map(|m| (k, m)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
}

/// The ratios bench reports between the modes' medians.
fn ratios(results: &[ModeResult], best_advice: Option<(Kind, f64)>) -> Ratios {
    let med = |k: Kind, ready: bool| median_ms(results, k, ready);
    let ratio = |num: Option<f64>, den: Option<f64>| match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    };
    [
        (
            "stream_over_mmap_load",
            ratio(med(Kind::Stream, false), med(Kind::Mmap, false)),
        ),
        (
            "mmap_over_stream_ready",
            ratio(med(Kind::Mmap, true), med(Kind::Stream, true)),
        ),
        (
            "mmap_over_baseline_ready",
            ratio(med(Kind::Mmap, true), med(Kind::Baseline, true)),
        ),
        (
            "mmap_over_best_advice_ready",
            ratio(med(Kind::Mmap, true), best_advice.map(|b| b.1)),
        ),
        (
            "mmap_random_over_mmap_ready",
            ratio(med(Kind::MmapRandom, true), med(Kind::Mmap, true)),
        ),
        (
            "stream_over_baseline_load",
            ratio(med(Kind::Stream, false), med(Kind::Baseline, false)),
        ),
    ]
}

/// The comparison as JSON (--json). Its fields are relied on by scripts.
fn report_json(a: &Args, setup: &Setup, o: &Outcome) -> String {
    let modes: Map<String, Value> = o
        .results
        .iter()
        .map(|r| (r.kind.name().to_owned(), mode_json(r)))
        .collect();
    let ratios: Map<String, Value> = o
        .ratios
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.map(round3).unwrap_or(Value::Null)))
        .collect();
    json_text(&json!({
        "file": setup.file.display().to_string(),
        "generated": setup.generated,
        "format": setup.format.name(),
        "file_size": setup.file_len,
        "tensors_count": setup.n_tensors,
        "files": setup.n_files,
        "iters": a.iters,
        "warmup": a.warmup,
        "page_cache": if a.cold { "cold" } else { "warm" },
        "warm_read_ms": setup.warm.map(|w| round3(w.as_secs_f64() * 1e3)),
        "order": setup.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "modes": modes,
        "best_advice": o.best_advice.map(|b| b.0.name()),
        "ratios": ratios,
        "identical_bytes": o.bytes.identical,
        "tensors_compared": o.bytes.compared,
    }))
}

/// One mode's entry in the JSON `modes`.
fn mode_json(r: &ModeResult) -> Value {
    let mut o = json!({
        "load_ms": Stats::json(r.load.as_ref(), &r.loads()),
        "ready_ms": Stats::json(r.ready.as_ref(), &r.readies()),
        "major_faults_median": r.median_of(|s| s.major_faults.map(|v| v as f64)),
        "resident_before_pct_max": r.samples.iter().filter_map(|s| s.resident_before_pct)
            .max_by(f64::total_cmp).map(round3),
        "resident_after_pct_median": r.median_of(|s| s.resident_after_pct).map(round3),
        "peak_rss_anon_kib": r.peak(|s| s.rss_anon_kib),
        "peak_rss_anon_after_touch_kib": r.peak(|s| s.rss_anon_after_touch_kib),
        "peak_rss_file_after_touch_kib": r.peak(|s| s.rss_file_after_touch_kib),
        "peak_vm_hwm_kib": r.peak(|s| s.vm_hwm_kib),
        "huge_pages_pct_median": r.median_of(|s| s.huge_pct).map(round3),
    });
    // The baseline is no load: it places nothing and has no load report.
    if r.kind != Kind::Baseline {
        let first = r.samples.first();
        o["bytes_mapped"] = first.and_then(|s| s.bytes_mapped).into();
        o["bytes_copied"] = first.and_then(|s| s.bytes_copied).into();
        o["mode_used"] = r.first(|s| s.mode_used.as_ref()).into();
        o["fallback"] = r.first(|s| s.fallback.as_ref()).into();
        o["prefetch"] = r.first(|s| s.prefetch.as_ref()).into();
    }
    o
}

/// The comparison for people: what was run, the table of modes, then the
/// notes (fallbacks, ratios, the byte check).
fn report_text(a: &Args, setup: &Setup, o: &Outcome) -> String {
    let mut out = text_preamble(a, setup);
    out.push_str(&mode_table(&o.results));
    out.push_str(&text_notes(o));
    out
}

/// What was benched and how: the model, the page cache, the runs.
fn text_preamble(a: &Args, setup: &Setup) -> String {
    let mut out = format!(
        "bench: {} ({}, {}, {} tensors)\n",
        setup.file.display(),
        setup.format.name(),
        human_bytes(setup.file_len),
        setup.n_tensors
    );
    out.push_str(&match setup.warm {
        Some(w) => format!(
            "page cache: warm (the file was read once before timing, {:.1} ms)\n",
            w.as_secs_f64() * 1e3
        ),
        None => "page cache: cold (the file is evicted before every run)\n".to_owned(),
    });
    out.push_str(&format!(
        "runs: {} timed + {} warmup per mode, each a fresh process, interleaved {}\n\
         ready = load + one read of every tensor byte in file order (a first pass)\n\n",
        a.iters,
        a.warmup,
        setup
            .kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out
}

/// The table of modes, one row each, and the line that says how to read it.
fn mode_table(results: &[ModeResult]) -> String {
    let kib = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}"));
    let mut rows = vec![[
        "mode",
        "load ms",
        "ready ms",
        "ready min",
        "ready max",
        "major faults",
        "RssAnon kB",
        "RssAnon kB touched",
        "VmHWM kB",
        "cached after %",
        "huge pages %",
    ]
    .map(String::from)
    .to_vec()];
    for r in results {
        rows.push(vec![
            r.kind.name().to_owned(),
            ms(r.load.as_ref().map(|s| s.median)),
            ms(r.ready.as_ref().map(|s| s.median)),
            ms(r.ready.as_ref().map(|s| s.min)),
            ms(r.ready.as_ref().map(|s| s.max)),
            r.median_of(|s| s.major_faults.map(|v| v as f64))
                .map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
            kib(r.peak(|s| s.rss_anon_kib)),
            kib(r.peak(|s| s.rss_anon_after_touch_kib)),
            kib(r.peak(|s| s.vm_hwm_kib)),
            r.median_of(|s| s.resident_after_pct)
                .map_or_else(|| "n/a".into(), |v| format!("{v:.1}")),
            r.median_of(|s| s.huge_pct)
                .map_or_else(|| "n/a".into(), |v| format!("{v:.1}")),
        ]);
    }
    let mut out = table(&rows, 1, "");
    out.push_str(
        "(medians; RssAnon and VmHWM are peaks over the runs; huge pages: the share of \
         the placed tensors' bytes mapped in huge pages after the touch)\n\n",
    );
    out
}

/// The lines under the table: fallbacks, mmap's prefetch, the ratios, the
/// best advice and whether the bytes were identical.
fn text_notes(o: &Outcome) -> String {
    let mut out = String::new();
    for r in o.results.iter().filter(|r| r.kind.mapped()) {
        if let Some(f) = r.first(|s| s.fallback.as_ref()) {
            out.push_str(&format!(
                "{}: fell back to the stream path: {f}\n",
                r.kind.name()
            ));
        }
        if r.kind == Kind::Mmap {
            if let Some(p) = r.first(|s| s.prefetch.as_ref()) {
                out.push_str(&format!("mmap prefetch: {p}\n"));
            }
        }
    }
    for (name, v) in &o.ratios {
        if let Some(v) = v {
            out.push_str(&format!("{name}: {v:.2}x\n"));
        }
    }
    if let Some((k, _)) = o.best_advice {
        out.push_str(&format!("best advice without prefetch: {}\n", k.name()));
    }
    out.push_str(&if o.bytes.identical {
        format!(
            "tensor bytes identical across modes: yes ({} tensors, sha256)\n",
            o.bytes.compared
        )
    } else {
        format!(
            "tensor bytes identical across modes: NO (first difference: {})\n",
            o.bytes.first_diff.as_deref().unwrap_or("no tensors")
        )
    });
    out
}

/// Run one child and parse its JSON report.
fn run_child(exe: &Path, file: &Path, kind: Kind, cold: bool, hashes: bool) -> CliResult<Sample> {
    let args = kind.args(file, cold, hashes);
    let shown = || {
        let a: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        format!("`weightmap {}`", a.join(" "))
    };
    let out = Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CliError::msg(format!("running {}: {e}", shown())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(CliError::msg(format!(
            "{} failed ({}): {}",
            shown(),
            out.status,
            last.strip_prefix("error: ").unwrap_or(last)
        )));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CliError::msg(format!("{} printed invalid JSON: {e}", shown())))?;
    let bad = |what: &str| CliError::msg(format!("{} printed no {what}", shown()));
    let tensors = if hashes {
        let list = v["tensors"].as_array().ok_or_else(|| bad("tensors"))?;
        let pairs = list
            .iter()
            .map(|t| match (t["name"].as_str(), t["sha256"].as_str()) {
                (Some(n), Some(h)) => Ok((n.to_owned(), h.to_owned())),
                _ => Err(bad("tensor name and sha256")),
            })
            .collect::<CliResult<Vec<_>>>()?;
        Some(pairs)
    } else {
        None
    };
    let text = |k: &str| v[k].as_str().map(str::to_owned);
    Ok(Sample {
        load_ms: v["load_ms"].as_f64().ok_or_else(|| bad("load_ms"))?,
        ready_ms: v["ready_ms"].as_f64(),
        major_faults: v["major_faults"].as_u64(),
        resident_before_pct: v["resident_before_pct"].as_f64(),
        resident_after_pct: v["resident_after_pct"].as_f64(),
        rss_anon_kib: v["rss_anon_kib"].as_u64(),
        rss_anon_after_touch_kib: v["rss_anon_after_touch_kib"].as_u64(),
        rss_file_after_touch_kib: v["rss_file_after_touch_kib"].as_u64(),
        huge_pct: huge_pct(&v["huge_pages"]),
        vm_hwm_kib: v["vm_hwm_after_touch_kib"]
            .as_u64()
            .or_else(|| v["vm_hwm_kib"].as_u64()),
        bytes_mapped: v["bytes_mapped"].as_u64(),
        bytes_copied: v["bytes_copied"].as_u64(),
        mode_used: text("mode_used"),
        fallback: v["fallback"]["detail"]
            .as_str()
            .map(|d| format!("{}: {d}", v["fallback"]["kind"].as_str().unwrap_or("?"))),
        prefetch: text("prefetch"),
        tensors,
    })
}

/// The share of `load --json`'s `huge_pages` bytes in huge pages, in
/// percent; `None` where the platform cannot tell or nothing is placed.
fn huge_pct(h: &Value) -> Option<f64> {
    let bytes = h["mapped_bytes"].as_u64()? + h["owned_bytes"].as_u64()?;
    let known = |k: &str, b: &str| match h[b].as_u64() {
        Some(0) => Some(0),
        _ => h[k].as_u64(),
    };
    let huge =
        known("mapped_huge_bytes", "mapped_bytes")? + known("owned_huge_bytes", "owned_bytes")?;
    (bytes > 0).then(|| huge as f64 * 100.0 / bytes as f64)
}

/// With --cold, fail before anything is generated or run where the
/// platform cannot drop a file from the page cache (Windows, macOS: every
/// child would fail on it). Asked of an empty file of this process's own
/// in the temporary directory, so the model's pages are left alone; only
/// `Unsupported` stops bench here, anything else is left to the children.
fn refuse_cold_where_nothing_evicts() -> CliResult {
    let probe = std::env::temp_dir().join("weightmap-evict-probe");
    let Ok(out) = crate::outfile::OutFile::create(&probe) else {
        return Ok(());
    };
    let result = weightmap::evict(out.tmp_path());
    drop(out); // removes the file
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Err(CliError::msg(format!(
            "--cold: this platform cannot drop a file from the page cache ({e}); \
             run bench without --cold"
        ))),
        _ => Ok(()),
    }
}

/// Read the whole file once so the timed runs find it in the page cache.
fn warm_page_cache(file: &Path) -> CliResult<Duration> {
    let t0 = Instant::now();
    let mut f =
        File::open(file).map_err(|e| CliError::msg(format!("open {}: {e}", file.display())))?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CliError::msg(format!("read {}: {e}", file.display()))),
        }
    }
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.mean, s.median, s.min, s.max), (4.0, 2.5, 1.0, 10.0));
        assert_eq!(Stats::of(&[5.0]).unwrap().median, 5.0);
        assert!(Stats::of(&[]).is_none());
    }
}
