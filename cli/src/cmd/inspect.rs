//! `weightmap inspect FILE [--json] [--full]`.

use std::path::PathBuf;

use serde_json::{json, Value as Json};
use weightmap::gguf::Value;
use weightmap::{Header, ModelHeaders};

use std::io::Write;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::{escape, human_bytes, table, write_table, CliError, CliResult};

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
    let model = ModelHeaders::read(&a.file)?;
    if model.files.len() == 1 {
        let wh = model.first();
        if a.json {
            return write_json(&Doc { wh, full: a.full });
        }
        return write_text(|out| to_text(wh, a, out));
    }
    // Several files: each one's header, in shard order.
    if a.json {
        return write_json(&Shards {
            model: &model,
            full: a.full,
        });
    }
    write_text(|out| {
        let n = model.files.len();
        writeln!(out, "{} files, {} tensors", n, model.tensor_count())?;
        for w in &model.warnings {
            writeln!(out, "warning: {}", escape(w))?;
        }
        for (i, (p, wh)) in model.files.iter().enumerate() {
            writeln!(
                out,
                "\n== shard {}/{n}: {}",
                i + 1,
                escape(&p.display().to_string())
            )?;
            to_text(wh, a, out)?;
        }
        Ok(())
    })
}

/// Text written straight to stdout as it is made, so memory stays O(1)
/// beyond the header whatever the tensor count; a closed pipe stops it.
fn write_text(f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> CliResult {
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout);
    f(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => CliError::BrokenPipe,
            _ => CliError::msg(format!("writing to stdout: {e}")),
        })
}

/// `inspect --json` of a model in several files.
struct Shards<'a> {
    model: &'a weightmap::ModelHeaders,
    full: bool,
}

impl Serialize for Shards<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct List<'a>(&'a weightmap::ModelHeaders, bool);
        impl Serialize for List<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.files.len()))?;
                for (p, wh) in &self.0.files {
                    seq.serialize_element(&(p.display().to_string(), Doc { wh, full: self.1 }))?;
                }
                seq.end()
            }
        }
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("shards_count", &self.model.files.len())?;
        m.serialize_entry("warnings", &self.model.warnings)?;
        m.serialize_entry("shards", &List(self.model, self.full))?;
        m.end()
    }
}

/// The JSON document, serialized straight to stdout as it is walked: memory
/// stays O(1) beyond the header, whatever the tensor count or value sizes.
fn write_json(doc: &impl Serialize) -> CliResult {
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout);
    let mut ser = serde_json::Serializer::pretty(&mut out);
    let result = doc
        .serialize(&mut ser)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    result.map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => CliError::BrokenPipe,
        _ => CliError::msg(format!("writing to stdout: {e}")),
    })
}

/// `inspect --json`'s document.
struct Doc<'a> {
    wh: &'a Header,
    full: bool,
}

impl Serialize for Doc<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let h = self.wh;
        let mut m = s.serialize_map(Some(7))?;
        m.serialize_entry("format", h.format().name())?;
        m.serialize_entry("version", &version(h))?;
        m.serialize_entry("alignment", &h.file_alignment())?;
        m.serialize_entry("data_offset", &h.data_offset())?;
        m.serialize_entry("file_size", &h.file_len())?;
        m.serialize_entry("metadata", &MetaSer(self.wh, self.full))?;
        m.serialize_entry("tensors", &TensorsSer(h.tensors()))?;
        m.end()
    }
}

/// The metadata map, in file order.
struct MetaSer<'a>(&'a Header, bool);

impl Serialize for MetaSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.0.gguf_metadata(), self.0.safetensors_metadata()) {
            (Some(md), _) => {
                let mut m = s.serialize_map(Some(md.len()))?;
                for (k, v) in md.iter() {
                    m.serialize_entry(k, &ValueSer(&v, self.1))?;
                }
                m.end()
            }
            (None, Some(map)) => map.serialize(s),
            (None, None) => s.serialize_map(Some(0))?.end(),
        }
    }
}

/// One metadata value: numbers, strings (borrowed from the file when valid
/// UTF-8), arrays as a summary plus, with `--full`, every element.
struct ValueSer<'a, 'v>(&'a Value<'v>, bool);

impl Serialize for ValueSer<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(x) => s.serialize_str(&x.to_string_lossy()),
            Value::Array(arr) => {
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("type", "array")?;
                m.serialize_entry("elem_type", arr.elem_type().name())?;
                m.serialize_entry("len", &arr.len())?;
                if self.1 {
                    m.serialize_entry("values", &ArraySer(arr, self.1))?;
                }
                m.end()
            }
            other => value_json(other, self.1).serialize(s),
        }
    }
}

/// Every element of an array, one at a time.
struct ArraySer<'a, 'v>(&'a weightmap::gguf::Array<'v>, bool);

impl Serialize for ArraySer<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(None)?;
        for e in self.0.iter() {
            q.serialize_element(&ValueSer(&e, self.1))?;
        }
        q.end()
    }
}

/// The tensor table, one entry at a time.
struct TensorsSer<'a>(&'a weightmap::TensorTable);

impl Serialize for TensorsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for t in self.0 {
            q.serialize_element(&TensorSer(&t))?;
        }
        q.end()
    }
}

struct TensorSer<'a>(&'a weightmap::TensorInfo<'a>);

impl Serialize for TensorSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("name", &t.name)?;
        m.serialize_entry("type", t.ty.name())?;
        m.serialize_entry("type_id", &t.ty.ggml_id())?;
        m.serialize_entry("shape", &t.shape)?;
        m.serialize_entry("offset", &t.file_offset)?;
        m.serialize_entry("nbytes", &t.nbytes)?;
        m.end()
    }
}

fn version(h: &Header) -> Option<u32> {
    h.gguf().map(|g| g.version())
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

fn to_text(wh: &Header, a: &Args, out: &mut dyn Write) -> std::io::Result<()> {
    let h = wh;
    let version = version(h).map_or_else(String::new, |v| format!(" (version {v})"));
    out.write_all(
        table(
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
        )
        .as_bytes(),
    )?;
    // Each table is walked twice, for its widths and then its rows: no
    // row outlives its line.
    if let Some(md) = wh.gguf_metadata() {
        writeln!(out, "\nmetadata ({} keys):", md.iter().count())?;
        let rows = || {
            md.iter().map(|(k, v)| {
                let (ty, val) = value_text(&v, a.full);
                [escape(k), ty.into(), val.into()]
            })
        };
        write_table(out, rows, 3, "  ")?;
    } else {
        let map = h.safetensors_metadata();
        writeln!(out, "\nmetadata ({} keys):", map.map_or(0, |m| m.len()))?;
        let rows = || {
            map.into_iter()
                .flatten()
                .map(|(k, v)| [escape(k), "string".into(), quote(v, a.full).into()])
        };
        write_table(out, rows, 3, "  ")?;
    }

    let order = if h.format() == weightmap::Format::Gguf {
        "ggml order, ne[0] first"
    } else {
        "numpy order, outermost first"
    };
    let total = h
        .tensors()
        .iter()
        .fold(0u64, |acc, t| acc.saturating_add(t.nbytes));
    writeln!(
        out,
        "\ntensors ({}, {}):",
        h.tensors().len(),
        human_bytes(total)
    )?;
    let head = format!("shape ({order})");
    let rows = || {
        let head = [
            "name".into(),
            "type".into(),
            head.as_str().into(),
            "offset".into(),
            "nbytes".into(),
        ];
        std::iter::once(head).chain(h.tensors().iter().map(|t| {
            let mut shape = String::from("[");
            for (i, d) in t.shape.iter().enumerate() {
                if i > 0 {
                    shape.push_str(", ");
                }
                shape.push_str(&d.to_string());
            }
            shape.push(']');
            [
                escape(t.name),
                t.ty.name().into(),
                shape.into(),
                t.file_offset.to_string().into(),
                t.nbytes.to_string().into(),
            ]
        }))
    };
    write_table(out, rows, 3, "  ")
}
