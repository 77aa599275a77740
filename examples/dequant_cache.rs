//! A runtime that computes on F32 copies of quantized weights, with and
//! without weightmap's transform cache: every quantized tensor dequantized
//! to F32 (weightmap's kernels), then every F32 byte read once, as a first
//! decode step would. Prints one JSON line: what the cache did, the wall
//! time until the F32 weights were ready and until they had all been read,
//! and how far RssAnon grew meanwhile.
//!
//! ```text
//! cargo run --release --example dequant_cache -- MODEL --cache DIR   # fill, then hits
//! cargo run --release --example dequant_cache -- MODEL --no-cache    # in memory, every time
//! ```
//!
//! `benches/transform_cache.sh` runs it in fresh processes, cold and warm,
//! and prints the medians (BENCHMARKS.md, "The transform cache").

use std::path::PathBuf;
use std::time::Instant;

use weightmap::cache::{Cache, Transform};
use weightmap::{LoadOptions, TensorType};

fn rss_anon_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(
        args.next()
            .ok_or("usage: dequant_cache MODEL (--cache DIR | --no-cache)")?,
    );
    let cache = match (args.next().as_deref(), args.next()) {
        (Some("--cache"), Some(dir)) => Cache::at(dir),
        // The transform runs in memory, as it would without a cache.
        (Some("--no-cache"), None) => Cache::off(),
        _ => return Err("usage: dequant_cache MODEL (--cache DIR | --no-cache)".into()),
    };
    let dequant = Transform::new("dequant-f32", 1, |info, src, dst| {
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(dst).map_err(|e| e.to_string())?;
        weightmap::quant::dequantize(info.ty, src, out).map_err(|e| e.to_string())
    })
    .select(|info| {
        let quantized = !matches!(
            info.ty,
            TensorType::F32 | TensorType::F16 | TensorType::BF16
        );
        (quantized && info.ty.has_dequantize()).then(|| (TensorType::F32, info.ne()))
    });
    let before = rss_anon_kib();
    let t0 = Instant::now();
    // SAFETY: nothing modifies the model or the cache's entries while this
    // process runs.
    let cached = unsafe { cache.load(&model, &dequant, &LoadOptions::default())? };
    let ready = t0.elapsed();
    // Read every F32 byte once, as a first decode step would.
    let mut sum = 0f32;
    let mut bytes = 0u64;
    for t in cached.weights().tensors() {
        let v: &[f32] = t.view()?;
        sum += v.iter().step_by(16).sum::<f32>();
        bytes += t.info().nbytes;
    }
    let read = t0.elapsed();
    let growth = before.zip(rss_anon_kib()).map(|(b, a)| a.saturating_sub(b));
    println!(
        "{{\"outcome\":\"{}\",\"reason\":{:?},\"f32_bytes\":{bytes},\"ready_ms\":{:.1},\"read_ms\":{:.1},\"rss_anon_growth_kib\":{},\"checksum\":{sum}}}",
        cached.report().outcome.name(),
        match &cached.report().outcome {
            weightmap::cache::CacheOutcome::InMemory(why) => why.name(),
            _ => "",
        },
        ready.as_secs_f64() * 1e3,
        read.as_secs_f64() * 1e3,
        growth.map_or("null".into(), |g| g.to_string()),
    );
    Ok(())
}
