//! Models in several files: llama.cpp's split GGUF (`NAME-00001-of-00003.gguf`
//! with `split.no`, `split.count`, `split.tensors.count`) and Hugging Face's
//! sharded safetensors (`model.safetensors.index.json` with a `weight_map`).
//!
//! [`resolve`] turns the path a caller gives (any shard, an index file, or a
//! directory holding one) into the list of files; [`check`] validates every
//! shard's header against the others before anything is placed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

use crate::format::Header;

use super::headers::ModelHeaders;

/// The files of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Files {
    /// One file.
    Single(PathBuf),
    /// llama.cpp split GGUF: the shards in order, 1-based names.
    SplitGguf(Vec<PathBuf>),
    /// Sharded safetensors: the index and the shards in first-use order.
    Index {
        index: PathBuf,
        shards: Vec<PathBuf>,
    },
}

impl Files {
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        match self {
            Files::Single(p) => vec![p.clone()],
            Files::SplitGguf(v) | Files::Index { shards: v, .. } => v.clone(),
        }
    }
}

/// The split-name pattern: `PREFIX-NNNNN-of-MMMMM.gguf` (1-based `NNNNN`),
/// as llama.cpp's `llama_split_path` writes it. Returns (prefix, no, count).
pub(crate) fn split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    // ...-00001-of-00003
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let five = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !five(no) || !five(count) || prefix.is_empty() {
        return None;
    }
    Some((prefix.to_owned(), no.parse().ok()?, count.parse().ok()?))
}

/// llama.cpp's name for shard `no` (1-based) of `count`.
pub(crate) fn split_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// What `path` names: a directory with a safetensors index, an index file,
/// a shard of a split GGUF, or a single file.
pub(crate) fn resolve(path: &Path) -> Result<Files> {
    if path.is_dir() {
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| Error::io("read directory", path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(".safetensors.index.json"))
            })
            .collect();
        found.sort();
        return match found.len() {
            // No index: the loader says the directory is not a file.
            0 => Ok(Files::Single(path.to_owned())),
            1 => index_files(&found[0]),
            _ => Err(Error::ShardIndex {
                path: path.to_owned(),
                detail: format!(
                    "{} index files; name one: {}",
                    found.len(),
                    found
                        .iter()
                        .filter_map(|p| p.file_name()?.to_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        };
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".index.json") {
        return index_files(path);
    }
    if let Some((prefix, no, count)) = split_name(path) {
        if count > 1 && (1..=count).contains(&no) {
            let dir = path.parent().unwrap_or(Path::new(""));
            return Ok(Files::SplitGguf(
                (1..=count)
                    .map(|i| split_path(dir, &prefix, i, count))
                    .collect(),
            ));
        }
    }
    Ok(Files::Single(path.to_owned()))
}

/// A parsed `*.safetensors.index.json`.
pub(crate) struct Index {
    /// Tensor name → shard file name, as the index lists them.
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`, if present.
    pub total_size: Option<u64>,
}

pub(crate) fn read_index(path: &Path) -> Result<Index> {
    let bad = |detail: String| Error::ShardIndex {
        path: path.to_owned(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("read", path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .ok_or_else(|| bad("no \"weight_map\"".into()))?
        .as_object()
        .ok_or_else(|| bad("\"weight_map\" is not an object".into()))?;
    let mut weight_map = BTreeMap::new();
    for (k, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[\"{k}\"] is not a string")))?;
        if f.is_empty() || f.contains('/') || f.contains('\\') || f == "." || f == ".." {
            return Err(bad(format!(
                "weight_map[\"{k}\"] = \"{f}\" is not a file name beside the index"
            )));
        }
        weight_map.insert(k.clone(), f.to_owned());
    }
    let total_size = match v.get("metadata").and_then(|m| m.get("total_size")) {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => Some(
            t.as_u64()
                .ok_or_else(|| bad("metadata.total_size is not an unsigned integer".into()))?,
        ),
    };
    Ok(Index {
        weight_map,
        total_size,
    })
}

fn index_files(index: &Path) -> Result<Files> {
    let ix = read_index(index)?;
    let dir = index.parent().unwrap_or(Path::new(""));
    let mut shards: Vec<PathBuf> = Vec::new();
    for f in ix.weight_map.values() {
        let p = dir.join(f);
        if !shards.contains(&p) {
            shards.push(p);
        }
    }
    shards.sort();
    Ok(Files::Index {
        index: index.to_owned(),
        shards,
    })
}

/// One shard's header, read and validated.
pub(crate) struct ShardHeader {
    pub path: PathBuf,
    pub header: Header,
}

/// Read and validate every shard's header, and the shards against each
/// other, before anything is placed. Returns the headers in shard order
/// and any warnings.
pub(crate) fn check(files: &Files) -> Result<(Vec<ShardHeader>, Vec<String>)> {
    let mut warnings = Vec::new();
    let paths = files.paths();
    let mut shards = Vec::with_capacity(paths.len());
    for p in &paths {
        if !p.exists() {
            return Err(Error::MissingShard { path: p.clone() });
        }
        shards.push(ShardHeader {
            path: p.clone(),
            header: Header::read(p)?,
        });
    }
    // No tensor in two shards.
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for s in &shards {
        for t in s.header.tensors() {
            if let Some(first) = seen.insert(t.name, &s.path) {
                return Err(Error::DuplicateShardTensor {
                    tensor: t.name.to_owned(),
                    first: first.to_owned(),
                    second: s.path.clone(),
                });
            }
        }
    }
    match files {
        Files::Single(_) => {}
        Files::SplitGguf(_) => check_split(&shards)?,
        Files::Index { index, .. } => check_index(index, &shards, &mut warnings)?,
    }
    Ok((shards, warnings))
}

/// llama.cpp's split keys, read as any integer type.
fn split_keys(s: &ShardHeader) -> Result<(u64, u64, Option<u64>)> {
    let not_shard = |detail: &str| Error::NotAShard {
        path: s.path.clone(),
        detail: detail.to_owned(),
    };
    let md = s
        .header
        .gguf_metadata()
        .ok_or_else(|| not_shard("not a GGUF file"))?;
    let no = md
        .get_opt_int::<u64>("split.no")?
        .ok_or_else(|| not_shard("no split.no key"))?;
    let count = md
        .get_opt_int::<u64>("split.count")?
        .ok_or_else(|| not_shard("no split.count key"))?;
    let tensors = md.get_opt_int::<u64>("split.tensors.count")?;
    Ok((no, count, tensors))
}

fn check_split(shards: &[ShardHeader]) -> Result<()> {
    let n = shards.len() as u64;
    let mut seen = vec![false; shards.len()];
    let mut total_claim = None;
    for (i, s) in shards.iter().enumerate() {
        let (no, count, tensors) = split_keys(s)?;
        if count != n {
            return Err(Error::SplitCountMismatch {
                path: s.path.clone(),
                expected: n,
                found: count,
            });
        }
        // split.no is 0-based; the file name is 1-based.
        if no >= n || seen[no as usize] || no != i as u64 {
            return Err(Error::SplitNoInvalid {
                path: s.path.clone(),
                no,
                count: n,
                detail: if no >= n {
                    "out of range".into()
                } else if seen[no as usize] {
                    "repeated".into()
                } else {
                    format!("the file name says shard {}", i + 1)
                },
            });
        }
        seen[no as usize] = true;
        if i == 0 {
            total_claim = tensors;
        } else if tensors.is_some() && tensors != total_claim {
            return Err(Error::SplitTensorsCount {
                path: s.path.clone(),
                expected: total_claim.unwrap_or(0),
                found: tensors.unwrap_or(0),
            });
        }
    }
    let found: u64 = shards.iter().map(|s| s.header.tensors().len() as u64).sum();
    if let Some(claim) = total_claim {
        if claim != found {
            return Err(Error::SplitTensorsCount {
                path: shards[0].path.clone(),
                expected: claim,
                found,
            });
        }
    }
    Ok(())
}

fn check_index(index: &Path, shards: &[ShardHeader], warnings: &mut Vec<String>) -> Result<()> {
    let ix = read_index(index)?;
    let by_file: HashMap<String, &ShardHeader> = shards
        .iter()
        .filter_map(|s| Some((s.path.file_name()?.to_str()?.to_owned(), s)))
        .collect();
    for (tensor, file) in &ix.weight_map {
        let s = by_file.get(file).ok_or_else(|| Error::MissingShard {
            path: index.with_file_name(file),
        })?;
        if s.header.tensor_index(tensor).is_none() {
            return Err(Error::TensorNotInShard {
                tensor: tensor.clone(),
                path: s.path.clone(),
            });
        }
    }
    let mut total = 0u64;
    for s in shards {
        for t in s.header.tensors() {
            total += t.nbytes;
            let listed = ix.weight_map.get(t.name);
            let here = s.path.file_name().and_then(|n| n.to_str());
            if listed.map(String::as_str) != here {
                return Err(Error::UnlistedShardTensor {
                    tensor: t.name.to_owned(),
                    path: s.path.clone(),
                });
            }
        }
    }
    // transformers (modeling_utils, load_sharded_checkpoint) and
    // safetensors read only weight_map; huggingface_hub writes total_size as
    // the sum of tensor bytes but nothing checks it. So a mismatch is a
    // warning, not an error.
    if let Some(claim) = ix.total_size {
        if claim != total {
            warnings.push(format!(
                "{}: metadata.total_size is {claim}, the shards' tensors total {total} bytes",
                index.display()
            ));
        }
    }
    Ok(())
}

/// A single GGUF whose metadata says it is one shard of several, reached
/// by a name that does not follow the split pattern.
pub(crate) fn single_is_split(path: &Path, md_count: Option<u64>) -> Result<()> {
    match md_count {
        Some(c) if c > 1 => Err(Error::NotAShard {
            path: path.to_owned(),
            detail: format!(
                "split.count is {c}, but the name does not follow NAME-00001-of-{c:05}.gguf, so the other shards cannot be found"
            ),
        }),
        _ => Ok(()),
    }
}

impl ModelHeaders {
    /// The files of the model `path` names (one file, any shard of a
    /// split GGUF, a safetensors index or a directory holding one), in
    /// shard order, found by name and index alone: no header is read.
    ///
    /// # Errors
    /// [`Error::ShardIndex`] and the I/O errors of finding the files, as
    /// [`ModelHeaders::read`].
    pub fn model_files(path: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        Ok(resolve(path.as_ref())?.paths())
    }

    /// Read and validate the headers of every file of the model `path`
    /// names (one file, any shard of a split GGUF, a safetensors index or a
    /// directory holding one), and the files against each other: every
    /// check [`crate::Weights::load`] makes before placing anything.
    ///
    /// # Errors
    /// As [`crate::Weights::load`], less the tensor reads.
    pub fn read(path: impl AsRef<Path>) -> Result<ModelHeaders> {
        let files = resolve(path.as_ref())?;
        if let Files::Single(p) = &files {
            let h = Header::read(p)?;
            if let Some(md) = h.gguf_metadata() {
                single_is_split(p, md.get_opt_int::<u64>("split.count").ok().flatten())?;
            }
            return Ok(ModelHeaders {
                files: vec![(p.clone(), h)],
                warnings: Vec::new(),
            });
        }
        let (headers, warnings) = check(&files)?;
        Ok(ModelHeaders {
            files: headers.into_iter().map(|h| (h.path, h.header)).collect(),
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_parse_as_llama_cpp_writes_them() {
        assert_eq!(
            split_name(Path::new("/m/model-00002-of-00003.gguf")),
            Some(("model".into(), 2, 3))
        );
        assert_eq!(
            split_name(Path::new("a-b-00001-of-00010.gguf")),
            Some(("a-b".into(), 1, 10))
        );
        for bad in [
            "model.gguf",
            "model-1-of-3.gguf",
            "-00001-of-00002.gguf",
            "m-00001-of-00002.bin",
        ] {
            assert_eq!(split_name(Path::new(bad)), None, "{bad}");
        }
        assert_eq!(
            split_path(Path::new("/m"), "model", 3, 12),
            PathBuf::from("/m/model-00003-of-00012.gguf")
        );
    }
}
