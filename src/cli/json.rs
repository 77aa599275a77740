//! A small JSON value that keeps object keys in insertion order (serde_json's
//! `Map` sorts them without its `preserve_order` feature), with a compact
//! pretty printer: containers that fit on one line stay on one line.

use std::fmt::Write;

/// A JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    /// Non-finite values print as `null`.
    F64(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs.
    pub fn obj<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// A string.
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// `Null` for `None`.
    pub fn opt_u64(v: Option<u64>) -> Json {
        v.map_or(Json::Null, Json::U64)
    }

    /// A float rounded to `places` decimals (`Null` when not finite).
    pub fn round(v: f64, places: i32) -> Json {
        let p = 10f64.powi(places);
        Json::F64((v * p).round() / p)
    }

    /// Indented, one value per line, except containers short enough to fit.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write_pretty(&mut out, 0);
        out.push('\n');
        out
    }

    fn compact(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::U64(v) => {
                let _ = write!(out, "{v}");
            }
            Json::I64(v) => {
                let _ = write!(out, "{v}");
            }
            Json::F64(v) => match serde_json::Number::from_f64(*v) {
                Some(n) => {
                    let _ = write!(out, "{n}");
                }
                None => out.push_str("null"),
            },
            Json::Str(s) => push_str(out, s),
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.compact(out);
                }
                out.push(']');
            }
            Json::Obj(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    push_str(out, k);
                    out.push_str(": ");
                    v.compact(out);
                }
                out.push('}');
            }
        }
    }

    fn write_pretty(&self, out: &mut String, indent: usize) {
        const WIDTH: usize = 120;
        let start = out.len();
        self.compact(out);
        let fits = out.len() - start + indent <= WIDTH && !out[start..].contains('\n');
        let is_container = matches!(self, Json::Arr(v) if !v.is_empty())
            || matches!(self, Json::Obj(v) if !v.is_empty());
        if fits || !is_container {
            return;
        }
        out.truncate(start);
        let pad = "  ".repeat(indent + 1);
        match self {
            Json::Arr(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    out.push_str(&pad);
                    v.write_pretty(out, indent + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
            }
            Json::Obj(pairs) => {
                out.push_str("{\n");
                for (i, (k, v)) in pairs.iter().enumerate() {
                    out.push_str(&pad);
                    push_str(out, k);
                    out.push_str(": ");
                    v.write_pretty(out, indent + 1);
                    out.push_str(if i + 1 < pairs.len() { ",\n" } else { "\n" });
                }
            }
            _ => unreachable!("scalars returned above"),
        }
        out.push_str(&"  ".repeat(indent));
        out.push(if matches!(self, Json::Arr(_)) {
            ']'
        } else {
            '}'
        });
    }
}

fn push_str(out: &mut String, s: &str) {
    // Serializing a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_serde_json() {
        let v = Json::obj([
            ("z", Json::U64(u64::MAX)),
            ("a", Json::I64(-5)),
            ("f", Json::F64(0.1)),
            ("nan", Json::F64(f64::NAN)),
            ("s", Json::str("tab\t\"quote\" é")),
            ("long", Json::Arr((0..100).map(Json::U64).collect())),
            ("empty", Json::Arr(vec![])),
            ("o", Json::obj([("k", Json::Null), ("b", Json::Bool(true))])),
        ]);
        let text = v.pretty();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["z"], serde_json::json!(u64::MAX));
        assert_eq!(parsed["f"], serde_json::json!(0.1));
        assert_eq!(parsed["nan"], serde_json::Value::Null);
        assert_eq!(parsed["s"], "tab\t\"quote\" é");
        assert_eq!(parsed["long"].as_array().unwrap().len(), 100);
        // Insertion order is kept.
        assert!(text.find("\"z\"").unwrap() < text.find("\"a\"").unwrap());
    }
}
