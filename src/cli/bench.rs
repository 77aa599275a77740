//! `weightmap bench [FILE] [--iters N] [--warmup N] [--json] [--format gguf|safetensors]`.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use weightmap::{Format, WeightsHeader};

use super::cache;
use super::{emit, human_bytes, json_text, round3, table, CliError, CliResult, FormatArg};

pub const LONG_ABOUT: &str = "\
Compare the mapped and stream load paths, each in fresh processes.

For each iteration, bench runs `weightmap load FILE --mode mmap --no-fallback
--json`, `weightmap load FILE --mode stream --json` and a baseline that reads
the whole file into one buffer with a single sequential read, each in a new
child process, interleaved (mmap, stream, baseline, mmap, ...) so that drift
affects all alike. Warmup iterations are run the same way and discarded.
The file is read once before timing so that every run finds it in the page
cache. One more child per mode loads with --hashes, and the sha256 of every
tensor is compared across the two modes.

Without FILE, a default synthetic model (512 MiB of tensors, 300 tensors,
262,144-token vocabulary, mixed f32/f16/q8_0/q4_K/q6_K) is generated once
into $WEIGHTMAP_CACHE, or target/weightmap-cache/ under the current directory
if it is writable, or weightmap-cache/ in the system temporary directory, and
reused while its size matches. --format safetensors generates the safetensors
variant instead.

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
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Format of the default model (only without FILE).
    #[arg(long, value_enum, conflicts_with = "file")]
    format: Option<FormatArg>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mmap,
    Stream,
    Baseline,
}

const KINDS: [Kind; 3] = [Kind::Mmap, Kind::Stream, Kind::Baseline];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mmap => "mmap",
            Kind::Stream => "stream",
            Kind::Baseline => "baseline",
        }
    }

    fn args(self, file: &Path, hashes: bool) -> Vec<OsString> {
        let mut v: Vec<OsString> = match self {
            Kind::Baseline => vec!["read-baseline".into(), file.into()],
            Kind::Mmap => vec![
                "load".into(),
                file.into(),
                "--mode".into(),
                "mmap".into(),
                "--no-fallback".into(),
            ],
            Kind::Stream => vec!["load".into(), file.into(), "--mode".into(), "stream".into()],
        };
        v.push("--json".into());
        if hashes {
            v.push("--hashes".into());
        }
        v
    }
}

/// One child's report.
#[derive(Debug)]
struct Sample {
    load_ms: f64,
    rss_anon_kib: Option<u64>,
    rss_file_kib: Option<u64>,
    vm_hwm_kib: Option<u64>,
    bytes_mapped: Option<u64>,
    bytes_copied: Option<u64>,
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
}

pub fn run(a: &Args) -> CliResult {
    let (file, generated) = match &a.file {
        Some(f) => (f.clone(), false),
        None => (
            cache::default_model(a.format.map_or(Format::Gguf, Into::into))?,
            true,
        ),
    };
    // Fail early, with the loader's own message, on a file that cannot load.
    let wh = WeightsHeader::read(&file)?;
    let h = wh.header();
    let exe = std::env::current_exe()
        .map_err(|e| CliError::msg(format!("cannot find this executable to run children: {e}")))?;
    let warm = warm_page_cache(&file)?;

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for i in 0..a.warmup + a.iters {
        for (k, kind) in KINDS.iter().enumerate() {
            let s = run_child(&exe, &file, *kind, false)?;
            if i >= a.warmup {
                samples[k].push(s);
            }
        }
    }
    let mmap_hashes = run_child(&exe, &file, Kind::Mmap, true)?
        .tensors
        .unwrap_or_default();
    let stream_hashes = run_child(&exe, &file, Kind::Stream, true)?
        .tensors
        .unwrap_or_default();
    let identical = mmap_hashes == stream_hashes && mmap_hashes.len() == h.tensors().len();
    let first_diff = mmap_hashes
        .iter()
        .zip(&stream_hashes)
        .find(|(m, s)| m != s)
        .map(|(m, _)| m.0.clone());

    let stats: Vec<Option<Stats>> = samples
        .iter()
        .map(|v| Stats::of(&v.iter().map(|s| s.load_ms).collect::<Vec<_>>()))
        .collect();
    let peak = |k: usize, f: fn(&Sample) -> Option<u64>| samples[k].iter().filter_map(f).max();
    let median = |k: usize| stats[k].as_ref().map(|s| s.median);
    let ratio = |num: Option<f64>, den: Option<f64>| match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    };
    let stream_over_mmap = ratio(median(1), median(0));
    let stream_over_baseline = ratio(median(1), median(2));

    let out = if a.json {
        let modes: Map<String, Value> = KINDS
            .iter()
            .enumerate()
            .map(|(k, kind)| {
                let st = stats[k].as_ref();
                let f = |g: fn(&Stats) -> f64| st.map(|s| round3(g(s)));
                let samples_ms: Vec<Value> = samples[k].iter().map(|s| round3(s.load_ms)).collect();
                let mut o = json!({
                    "load_ms": {
                        "mean": f(|s| s.mean),
                        "median": f(|s| s.median),
                        "min": f(|s| s.min),
                        "max": f(|s| s.max),
                        "samples": samples_ms,
                    },
                    "peak_rss_anon_kib": peak(k, |s| s.rss_anon_kib),
                    "peak_rss_file_kib": peak(k, |s| s.rss_file_kib),
                    "peak_vm_hwm_kib": peak(k, |s| s.vm_hwm_kib),
                });
                if *kind != Kind::Baseline {
                    let first = samples[k].first();
                    o["bytes_mapped"] = first.and_then(|s| s.bytes_mapped).into();
                    o["bytes_copied"] = first.and_then(|s| s.bytes_copied).into();
                }
                (kind.name().to_owned(), o)
            })
            .collect();
        json_text(&json!({
            "file": file.display().to_string(),
            "generated": generated,
            "format": h.format().name(),
            "file_size": h.file_len(),
            "tensors_count": h.tensors().len(),
            "iters": a.iters,
            "warmup": a.warmup,
            "page_cache": "warm",
            "warm_read_ms": round3(warm.as_secs_f64() * 1e3),
            "order": KINDS.map(Kind::name),
            "modes": modes,
            "ratios": {
                "stream_over_mmap_median": stream_over_mmap.map(round3),
                "stream_over_baseline_median": stream_over_baseline.map(round3),
            },
            "identical_bytes": identical,
            "tensors_compared": mmap_hashes.len().min(stream_hashes.len()),
        }))
    } else {
        let mut out = format!(
            "bench: {} ({}, {}, {} tensors)\n",
            file.display(),
            h.format().name(),
            human_bytes(h.file_len()),
            h.tensors().len()
        );
        out.push_str(&format!(
            "page cache: warm (the file was read once before timing, {:.1} ms)\n",
            warm.as_secs_f64() * 1e3
        ));
        out.push_str(&format!(
            "runs: {} timed + {} warmup per mode, each a fresh process, interleaved mmap, stream, baseline\n\
             baseline: one read() of the whole file into one Vec\n\n",
            a.iters, a.warmup
        ));
        let kib = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
        let mut rows = vec![[
            "mode",
            "mean ms",
            "median ms",
            "min ms",
            "max ms",
            "peak RssAnon kB",
            "peak RssFile kB",
            "peak VmHWM kB",
        ]
        .map(String::from)
        .to_vec()];
        for (k, kind) in KINDS.iter().enumerate() {
            let mut r = vec![kind.name().to_owned()];
            match &stats[k] {
                Some(s) => r.extend([s.mean, s.median, s.min, s.max].map(|v| format!("{v:.3}"))),
                None => r.extend(vec!["n/a".to_owned(); 4]),
            }
            r.push(kib(peak(k, |s| s.rss_anon_kib)));
            r.push(kib(peak(k, |s| s.rss_file_kib)));
            r.push(kib(peak(k, |s| s.vm_hwm_kib)));
            rows.push(r);
        }
        out.push_str(&table(&rows, 1, ""));
        let fmt_ratio = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}x"));
        out.push_str(&format!(
            "\nstream/mmap median:     {}\nstream/baseline median: {}\n",
            fmt_ratio(stream_over_mmap),
            fmt_ratio(stream_over_baseline)
        ));
        out.push_str(&if identical {
            format!(
                "tensor bytes identical across modes: yes ({} tensors, sha256)\n",
                mmap_hashes.len()
            )
        } else {
            format!(
                "tensor bytes identical across modes: NO (first difference: {})\n",
                first_diff.unwrap_or_else(|| "tensor lists differ in length".into())
            )
        });
        out
    };
    emit(&out)
}

/// Run one child and parse its JSON report.
fn run_child(exe: &Path, file: &Path, kind: Kind, hashes: bool) -> CliResult<Sample> {
    let args = kind.args(file, hashes);
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
    if kind != Kind::Baseline {
        let used = v["mode_used"].as_str().ok_or_else(|| bad("mode_used"))?;
        if used != kind.name() {
            return Err(CliError::msg(format!(
                "{} used mode {used}, not {}",
                shown(),
                kind.name()
            )));
        }
    }
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
    Ok(Sample {
        load_ms: v["load_ms"].as_f64().ok_or_else(|| bad("load_ms"))?,
        rss_anon_kib: v["rss_anon_kib"].as_u64(),
        rss_file_kib: v["rss_file_kib"].as_u64(),
        vm_hwm_kib: v["vm_hwm_kib"].as_u64(),
        bytes_mapped: v["bytes_mapped"].as_u64(),
        bytes_copied: v["bytes_copied"].as_u64(),
        tensors,
    })
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
