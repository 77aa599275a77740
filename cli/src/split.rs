//! Writing a model as several files: llama.cpp's split GGUF and Hugging
//! Face's sharded safetensors with an index. `weightmap gen --shards N`
//! generates one model and splits it with [`split_model`], so the tensors'
//! bytes are the unsplit model's.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::outfile::OutFile;
use weightmap::gguf::{OwnedValue, Writer};
use weightmap::gguf::{Value, ValueType};
use weightmap::Format;
use weightmap::Header;
use weightmap::TensorType;
use weightmap::{Error, Result};
use weightmap::{TensorInfo, TensorTable};

/// Split the model at `src` into `shards` files named after `out`: for
/// GGUF, `NAME-00001-of-0000N.gguf` with `split.no`, `split.count` and
/// `split.tensors.count`, all metadata in the first shard (llama.cpp's
/// layout); for safetensors, `NAME-00001-of-0000N.safetensors` and
/// `NAME.safetensors.index.json`. Tensors keep their order; each shard takes
/// a run of them of about equal bytes. Returns the files written, the index
/// last.
///
/// # Errors
/// Reading `src`, writing the outputs (each through [`OutFile`]), or a
/// safetensors dtype the writer does not name.
pub fn split_model(src: &Path, out: &Path, shards: usize) -> Result<Vec<PathBuf>> {
    let wh = Header::read(src)?;
    let file = std::fs::File::open(src).map_err(|e| Error::io("open", src, e))?;
    let tensors = wh.tensors();
    let sizes: Vec<u64> = tensors.iter().map(|t| t.nbytes).collect();
    let groups = partition(&sizes, shards.max(1));
    let n = groups.len();
    let dir = out.parent().unwrap_or(Path::new(""));
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let mut written = Vec::new();
    match wh.format() {
        Format::Gguf => {
            let prefix = name.strip_suffix(".gguf").unwrap_or(name);
            let md = wh.gguf_metadata();
            for (i, g) in groups.iter().enumerate() {
                let mut w = Writer::new(wh.file_alignment());
                if i == 0 {
                    if let Some(md) = &md {
                        for (k, v) in md.iter() {
                            if k == "general.alignment" || k.starts_with("split.") {
                                continue;
                            }
                            w.kv(k, owned(&v));
                        }
                    }
                }
                w.kv("split.no", OwnedValue::U16(i as u16))
                    .kv("split.count", OwnedValue::U16(n as u16))
                    .kv("split.tensors.count", OwnedValue::I32(tensors.len() as i32));
                for &t in g {
                    let t = tensors.get(t).expect("an index below the table's length");
                    w.tensor_deferred(t.name, t.ty, &t.ne());
                }
                let path = dir.join(format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1));
                write_gguf(&w, &file, src, tensors, g, &path)?;
                written.push(path);
            }
        }
        Format::Safetensors => {
            let prefix = name.strip_suffix(".safetensors").unwrap_or(name);
            let meta = wh.safetensors_metadata().cloned().unwrap_or_default();
            let mut weight_map = BTreeMap::new();
            let mut total = 0u64;
            for (i, g) in groups.iter().enumerate() {
                let fname = format!("{prefix}-{:05}-of-{n:05}.safetensors", i + 1);
                let path = dir.join(&fname);
                total += write_safetensors(&file, src, tensors, g, &meta, &path)?;
                for &t in g {
                    weight_map.insert(
                        tensors
                            .get(t)
                            .expect("an index below the table's length")
                            .name
                            .to_owned(),
                        fname.clone(),
                    );
                }
                written.push(path);
            }
            let index = serde_json::json!({
                "metadata": {"total_size": total},
                "weight_map": weight_map,
            });
            let path = dir.join(format!("{prefix}.safetensors.index.json"));
            let f = OutFile::create(&path)?;
            std::io::Write::write_all(&mut f.file(), format!("{index:#}\n").as_bytes())
                .map_err(|e| Error::io("write", &path, e))?;
            f.commit()?;
            written.push(path);
        }
    }
    Ok(written)
}

/// Runs of tensor indices of about equal bytes, at most `n` of them and
/// none empty (fewer when there are fewer tensors).
fn partition(sizes: &[u64], n: usize) -> Vec<Vec<usize>> {
    let total: u64 = sizes.iter().sum();
    let n = n.min(sizes.len()).max(1);
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    let mut acc = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        let left = sizes.len() - i;
        let need = n - groups.len();
        let full = acc >= total / n as u64 * groups.len() as u64;
        if !groups.last().is_some_and(Vec::is_empty) && need > 0 && (full || left == need) {
            groups.push(Vec::new());
        }
        groups.last_mut().expect("one group at least").push(i);
        acc += size;
    }
    groups.retain(|g| !g.is_empty());
    groups
}

fn owned(v: &Value<'_>) -> OwnedValue {
    match *v {
        Value::U8(x) => OwnedValue::U8(x),
        Value::I8(x) => OwnedValue::I8(x),
        Value::U16(x) => OwnedValue::U16(x),
        Value::I16(x) => OwnedValue::I16(x),
        Value::U32(x) => OwnedValue::U32(x),
        Value::I32(x) => OwnedValue::I32(x),
        Value::F32(x) => OwnedValue::F32(x),
        Value::Bool(x) => OwnedValue::Bool(x),
        Value::U64(x) => OwnedValue::U64(x),
        Value::I64(x) => OwnedValue::I64(x),
        Value::F64(x) => OwnedValue::F64(x),
        Value::String(s) => OwnedValue::String(s.to_string_lossy().into_owned()),
        Value::Array(a) => {
            let elem = a.elem_type();
            OwnedValue::Array(
                if elem == ValueType::Array {
                    ValueType::U8
                } else {
                    elem
                },
                a.iter().map(|e| owned(&e)).collect(),
            )
        }
    }
}

/// Copy tensor bytes from `src`, in the writer's chunks.
fn copier<'a>(
    file: &'a std::fs::File,
    tensors: &'a TensorTable,
    group: &'a [usize],
) -> impl FnMut(usize, &mut [u8]) -> std::io::Result<()> + 'a {
    let mut at: Vec<u64> = vec![0; group.len()];
    move |i, buf| {
        let t = tensors
            .get(group[i])
            .expect("a group holds indices of the table");
        read_exact_at(file, buf, t.file_offset + at[i])?;
        at[i] += buf.len() as u64;
        Ok(())
    }
}

/// Fill `buf` from `file` at `offset`: `pread` on Unix; on Windows
/// `ReadFile` at an offset (`seek_read`), which also moves the file
/// position (nothing here reads the file by position) and may return
/// fewer bytes, so it is repeated until `buf` is full.
#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &std::fs::File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::io::ErrorKind;
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_gguf(
    w: &Writer,
    file: &std::fs::File,
    src: &Path,
    tensors: &TensorTable,
    group: &[usize],
    path: &Path,
) -> Result<()> {
    let out = OutFile::create(path)?;
    w.try_write_with(BufWriter::new(out.file()), copier(file, tensors, group))
        .map_err(|e| Error::io("copy tensors from", src, e))?;
    out.commit()
}

fn dtype(t: &TensorInfo) -> Result<&'static str> {
    Ok(match t.ty {
        TensorType::F64 => "F64",
        TensorType::F32 => "F32",
        TensorType::F16 => "F16",
        TensorType::BF16 => "BF16",
        TensorType::I8 => "I8",
        TensorType::I16 => "I16",
        TensorType::I32 => "I32",
        TensorType::I64 => "I64",
        TensorType::U8 => "U8",
        TensorType::U16 => "U16",
        TensorType::U32 => "U32",
        TensorType::U64 => "U64",
        TensorType::Bool => "BOOL",
        other => {
            return Err(Error::SafetensorsHeader {
                detail: format!("tensor '{}': cannot write dtype {}", t.name, other.name()),
            })
        }
    })
}

/// One safetensors shard; returns its tensor bytes.
fn write_safetensors(
    file: &std::fs::File,
    src: &Path,
    tensors: &TensorTable,
    group: &[usize],
    meta: &BTreeMap<String, String>,
    path: &Path,
) -> Result<u64> {
    let mut root = serde_json::Map::new();
    if !meta.is_empty() {
        root.insert(
            weightmap::safetensors::SafetensorsHeader::METADATA_KEY.into(),
            serde_json::json!(meta),
        );
    }
    let mut off = 0u64;
    for &i in group {
        let t = tensors.get(i).expect("an index below the table's length");
        root.insert(
            t.name.to_owned(),
            serde_json::json!({"dtype": dtype(&t)?, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}),
        );
        off += t.nbytes;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(root)).map_err(|e| {
        Error::SafetensorsHeader {
            detail: format!("serializing a shard header: {e}"),
        }
    })?;
    // Pad so the data starts 8-aligned, as the reference writer does.
    json.resize((8 + json.len()).next_multiple_of(8) - 8, b' ');
    let out = OutFile::create(path)?;
    let mut w = BufWriter::new(out.file());
    let io = |e| Error::io("write", path, e);
    std::io::Write::write_all(&mut w, &(json.len() as u64).to_le_bytes()).map_err(io)?;
    std::io::Write::write_all(&mut w, &json).map_err(io)?;
    let mut copy = copier(file, tensors, group);
    let mut buf = vec![0u8; 4 << 20];
    for (k, &i) in group.iter().enumerate() {
        let mut left = tensors
            .get(i)
            .expect("an index below the table's length")
            .nbytes as usize;
        while left > 0 {
            let n = left.min(buf.len());
            copy(k, &mut buf[..n]).map_err(|e| Error::io("read", src, e))?;
            std::io::Write::write_all(&mut w, &buf[..n]).map_err(io)?;
            left -= n;
        }
    }
    std::io::Write::flush(&mut w).map_err(io)?;
    drop(w);
    out.commit()?;
    Ok(off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_exact_at_reads_at_the_offset_and_fails_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, (0..=255u8).collect::<Vec<_>>()).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut buf = [0u8; 4];
        read_exact_at(&f, &mut buf, 100).unwrap();
        assert_eq!(buf, [100, 101, 102, 103]);
        read_exact_at(&f, &mut buf, 0).unwrap();
        assert_eq!(buf, [0, 1, 2, 3]);
        let e = read_exact_at(&f, &mut buf, 254).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn partition_balances_bytes_and_leaves_no_shard_empty() {
        let ts = [10, 10, 10, 10, 10, 10];
        assert_eq!(partition(&ts, 3), vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(partition(&ts, 1).len(), 1);
        assert_eq!(partition(&ts[..2], 5), vec![vec![0], vec![1]]);
        let skew = [100, 1, 1, 1];
        let g = partition(&skew, 3);
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|g| !g.is_empty()));
        assert_eq!(g.concat(), vec![0, 1, 2, 3]);
    }
}
