//! `weightmap inspect FILE [--json] [--full]`.

use std::path::PathBuf;

use weightmap::gguf::Value;
use weightmap::{Header, WeightsHeader};

use super::json::Json;
use super::{emit, human_bytes, table, CliResult};

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
        to_json(&wh, a.full).pretty()
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
        Json::F64(v)
    } else if v.is_nan() {
        Json::str("NaN")
    } else if v > 0.0 {
        Json::str("Infinity")
    } else {
        Json::str("-Infinity")
    }
}

fn value_json(v: &Value<'_>, full: bool) -> Json {
    match v {
        Value::U8(x) => Json::U64((*x).into()),
        Value::I8(x) => Json::I64((*x).into()),
        Value::U16(x) => Json::U64((*x).into()),
        Value::I16(x) => Json::I64((*x).into()),
        Value::U32(x) => Json::U64((*x).into()),
        Value::I32(x) => Json::I64((*x).into()),
        Value::U64(x) => Json::U64(*x),
        Value::I64(x) => Json::I64(*x),
        Value::F32(x) => float((*x).into()),
        Value::F64(x) => float(*x),
        Value::Bool(x) => Json::Bool(*x),
        Value::String(s) => Json::str(s.to_string_lossy()),
        Value::Array(arr) => {
            let mut o = vec![
                ("type".to_owned(), Json::str("array")),
                ("elem_type".to_owned(), Json::str(arr.elem_type().name())),
                ("len".to_owned(), Json::U64(arr.len())),
            ];
            if full {
                o.push((
                    "values".to_owned(),
                    Json::Arr(arr.iter().map(|e| value_json(&e, full)).collect()),
                ));
            }
            Json::Obj(o)
        }
    }
}

fn metadata_json(wh: &WeightsHeader, full: bool) -> Json {
    match (wh.gguf_metadata(), wh.header().safetensors_metadata()) {
        (Some(md), _) => Json::Obj(
            md.iter()
                .map(|(k, v)| (k.to_owned(), value_json(&v, full)))
                .collect(),
        ),
        (None, Some(map)) => Json::obj(map.iter().map(|(k, v)| (k.as_str(), Json::str(v)))),
        (None, None) => Json::Obj(vec![]),
    }
}

fn to_json(wh: &WeightsHeader, full: bool) -> Json {
    let h = wh.header();
    let tensors = h
        .tensors()
        .iter()
        .map(|t| {
            Json::obj([
                ("name", Json::str(&t.name)),
                ("type", Json::str(t.ty.name())),
                ("type_id", Json::opt_u64(t.ty.ggml_id().map(u64::from))),
                (
                    "shape",
                    Json::Arr(t.shape.iter().map(|&d| Json::U64(d)).collect()),
                ),
                ("offset", Json::U64(t.file_offset)),
                ("nbytes", Json::U64(t.nbytes)),
            ])
        })
        .collect();
    Json::obj([
        ("format", Json::str(h.format().name())),
        ("version", Json::opt_u64(version(h).map(u64::from))),
        ("alignment", Json::U64(h.file_alignment())),
        ("data_offset", Json::U64(h.data_offset())),
        ("file_size", Json::U64(h.file_len())),
        ("metadata", metadata_json(wh, full)),
        ("tensors", Json::Arr(tensors)),
    ])
}

/// A string for a terminal: quoted and escaped (no control characters
/// reach the screen), cut short unless `full`.
fn quote(s: &str, full: bool) -> String {
    let n = s.chars().count();
    if full || n <= MAX_TEXT {
        Json::str(s).pretty().trim_end().to_owned()
    } else {
        let cut: String = s.chars().take(MAX_TEXT).collect();
        format!(
            "{}… ({} bytes)",
            Json::str(cut).pretty().trim_end(),
            s.len()
        )
    }
}

fn value_text(v: &Value<'_>, full: bool) -> (String, String) {
    let scalar = |j: Json| j.pretty().trim_end().to_owned();
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
        other => (ty, scalar(value_json(other, full))),
    }
}

fn to_text(wh: &WeightsHeader, a: &Args) -> String {
    let h = wh.header();
    let mut out = String::new();
    let version = version(h).map_or_else(String::new, |v| format!(" (version {v})"));
    out.push_str(&table(
        &[
            vec!["file:".into(), a.file.display().to_string()],
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
            rows.push(vec![k.to_owned(), ty, val]);
        }
    } else if let Some(map) = h.safetensors_metadata() {
        for (k, v) in map {
            rows.push(vec![k.clone(), "string".into(), quote(v, a.full)]);
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
            t.name.clone(),
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
