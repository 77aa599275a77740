//! `weightmap inspect FILE [--json] [--full]`.

use std::path::PathBuf;

use serde_json::{json, Value as Json};
use weightmap::gguf::Value;
use weightmap::{Header, WeightsHeader};

use super::{emit, escape, human_bytes, json_text, table, CliResult};

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF or safetensors file.
    file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Print every element of metadata arrays and whole long strings.
    #[arg(long)]
    full: bool,
}

/// Elements of an array shown in text mode without `--full`.
const PREVIEW: usize = 6;
/// Characters of a string shown in text mode without `--full`.
const MAX_TEXT: usize = 80;

pub fn run(a: &Args) -> CliResult {
    let wh = WeightsHeader::read(&a.file)?;
    let out = if a.json {
        json_text(&to_json(&wh, a.full))
    } else {
        to_text(&wh, a)
    };
    emit(&out)
}

fn version(h: &Header) -> Option<u32> {
    match h {
        Header::Gguf(g) => Some(g.version()),
        _ => None,
    }
}

fn float(v: f64) -> Json {
    if v.is_finite() {
        v.into()
    } else if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "Infinity".into()
    } else {
        "-Infinity".into()
    }
}

fn value_json(v: &Value<'_>, full: bool) -> Json {
    match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        Value::F32(x) => float((*x).into()),
        Value::F64(x) => float(*x),
        Value::Bool(x) => (*x).into(),
        Value::String(s) => s.to_string_lossy().into(),
        Value::Array(arr) => {
            let mut o =
                json!({"type": "array", "elem_type": arr.elem_type().name(), "len": arr.len()});
            if full {
                o["values"] = arr.iter().map(|e| value_json(&e, full)).collect();
            }
            o
        }
    }
}

fn metadata_json(wh: &WeightsHeader, full: bool) -> Json {
    match (wh.gguf_metadata(), wh.header().safetensors_metadata()) {
        // File order (serde_json's `preserve_order`).
        (Some(md), _) => Json::Object(
            md.iter()
                .map(|(k, v)| (k.to_owned(), value_json(&v, full)))
                .collect(),
        ),
        (None, Some(map)) => json!(map),
        (None, None) => json!({}),
    }
}

fn to_json(wh: &WeightsHeader, full: bool) -> Json {
    let h = wh.header();
    let tensors: Vec<Json> = h
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "type_id": t.ty.ggml_id(),
                "shape": t.shape,
                "offset": t.file_offset,
                "nbytes": t.nbytes,
            })
        })
        .collect();
    json!({
        "format": h.format().name(),
        "version": version(h),
        "alignment": h.file_alignment(),
        "data_offset": h.data_offset(),
        "file_size": h.file_len(),
        "metadata": metadata_json(wh, full),
        "tensors": tensors,
    })
}

/// A string for a terminal: quoted and escaped (no control characters
/// reach the screen), cut short unless `full`.
fn quote(s: &str, full: bool) -> String {
    let n = s.chars().count();
    if full || n <= MAX_TEXT {
        // JSON quoting escapes C0; `escape` catches DEL, C1 and bidi controls.
        escape(&Json::from(s).to_string()).into_owned()
    } else {
        let cut: String = s.chars().take(MAX_TEXT).collect();
        format!(
            "{}… ({} bytes)",
            escape(&Json::from(cut).to_string()),
            s.len()
        )
    }
}

fn value_text(v: &Value<'_>, full: bool) -> (String, String) {
    let ty = v.value_type().name().to_owned();
    match v {
        Value::String(s) => (ty, quote(&s.to_string_lossy(), full)),
        Value::Array(arr) => {
            let ty = format!("[{}; {}]", arr.elem_type().name(), arr.len());
            let take = if full { usize::MAX } else { PREVIEW };
            let mut items: Vec<String> = arr
                .iter()
                .take(take)
                .map(|e| match e {
                    Value::String(s) => quote(&s.to_string_lossy(), full),
                    other => value_text(&other, full).1,
                })
                .collect();
            if arr.len() > take as u64 {
                items.push(format!("… {} more", arr.len() - take as u64));
            }
            (ty, items.join(", "))
        }
        other => (ty, value_json(other, full).to_string()),
    }
}

fn to_text(wh: &WeightsHeader, a: &Args) -> String {
    let h = wh.header();
    let mut out = String::new();
    let version = version(h).map_or_else(String::new, |v| format!(" (version {v})"));
    out.push_str(&table(
        &[
            vec![
                "file:".into(),
                escape(&a.file.display().to_string()).into_owned(),
            ],
            vec!["format:".into(), format!("{}{version}", h.format().name())],
            vec!["alignment:".into(), h.file_alignment().to_string()],
            vec!["data offset:".into(), h.data_offset().to_string()],
            vec!["file size:".into(), human_bytes(h.file_len())],
        ],
        2,
        "",
    ));
    let mut rows = Vec::new();
    if let Some(md) = wh.gguf_metadata() {
        for (k, v) in md.iter() {
            let (ty, val) = value_text(&v, a.full);
            rows.push(vec![escape(k).into_owned(), ty, val]);
        }
    } else if let Some(map) = h.safetensors_metadata() {
        for (k, v) in map {
            rows.push(vec![
                escape(k).into_owned(),
                "string".into(),
                quote(v, a.full),
            ]);
        }
    }
    out.push_str(&format!("\nmetadata ({} keys):\n", rows.len()));
    out.push_str(&table(&rows, 3, "  "));

    let order = if h.format() == weightmap::Format::Gguf {
        "ggml order, ne[0] first"
    } else {
        "numpy order, outermost first"
    };
    let mut rows = vec![vec![
        "name".to_owned(),
        "type".into(),
        format!("shape ({order})"),
        "offset".into(),
        "nbytes".into(),
    ]];
    let mut total = 0u64;
    for t in h.tensors() {
        total = total.saturating_add(t.nbytes);
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        rows.push(vec![
            escape(&t.name).into_owned(),
            t.ty.name().into(),
            format!("[{}]", shape.join(", ")),
            t.file_offset.to_string(),
            t.nbytes.to_string(),
        ]);
    }
    out.push_str(&format!(
        "\ntensors ({}, {}):\n",
        h.tensors().len(),
        human_bytes(total)
    ));
    out.push_str(&table(&rows, 3, "  "));
    out
}
