//! Every tensor accessor on models in several files, for every tensor of
//! the model (not just the first shard's): llama.cpp split GGUF loaded from
//! each of its shards, and Hugging Face sharded safetensors loaded from the
//! index or its directory, mapped and streamed.
//!
//! The ground truth is the fixtures themselves: each shard's own header
//! (`Header::parse` of that one file), whose tensors are that shard's and
//! whose bytes sit at `file_offset..file_offset + nbytes`; the expected
//! names and shards come from testdata/shards/manifest.json, and are
//! checked against those headers (and, for safetensors, against the raw
//! JSON header of each file).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};
use weightmap::{
    AccessAdvice, Error, Header, LoadMode, LoadOptions, PlacementKind, Tensor, TensorType, Weights,
};

fn shards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/shards")
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(shards_dir().join("manifest.json")).unwrap()).unwrap()
}

fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// One tensor as its own shard's header and bytes describe it.
#[derive(Clone, Debug)]
struct Expected {
    name: String,
    shard: PathBuf,
    ty: TensorType,
    /// ggml order.
    ne: Vec<u64>,
    file_offset: u64,
    nbytes: u64,
    bytes: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fixture {
    SplitGguf,
    ShardedSafetensors,
}

impl Fixture {
    const ALL: [Fixture; 2] = [Fixture::SplitGguf, Fixture::ShardedSafetensors];

    fn manifest_key(self) -> &'static str {
        match self {
            Fixture::SplitGguf => "gguf",
            Fixture::ShardedSafetensors => "safetensors",
        }
    }

    fn shard_dir(self) -> PathBuf {
        match self {
            Fixture::SplitGguf => shards_dir(),
            Fixture::ShardedSafetensors => shards_dir().join("hf"),
        }
    }

    /// What to load the model from: the first shard and the later ones; the
    /// index and its directory.
    fn load_paths(self) -> Vec<PathBuf> {
        match self {
            Fixture::SplitGguf => (1..=3)
                .map(|i| shards_dir().join(format!("split-0000{i}-of-00003.gguf")))
                .collect(),
            Fixture::ShardedSafetensors => {
                let dir = shards_dir().join("hf");
                vec![dir.join("model.safetensors.index.json"), dir]
            }
        }
    }

    /// The shard files, in shard order (their names sort in that order:
    /// `-0000N-of-`), as the manifest names them.
    fn shards(self) -> Vec<PathBuf> {
        let m = manifest();
        let files: BTreeSet<String> = m[self.manifest_key()]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["shard"].as_str().unwrap().to_owned())
            .collect();
        files
            .into_iter()
            .map(|f| self.shard_dir().join(f))
            .collect()
    }

    /// Every tensor of the model, in load order (shard by shard, each in its
    /// own file's order), from each shard's own header; checked against the
    /// manifest (names, shards, hashes).
    fn expected(self) -> Vec<Expected> {
        let mut out = Vec::new();
        for shard in self.shards() {
            let file = std::fs::read(&shard).unwrap();
            let header =
                Header::parse(&file).unwrap_or_else(|e| panic!("{} alone: {e}", shard.display()));
            let raw_shapes = (self == Fixture::ShardedSafetensors).then(|| st_shapes(&file));
            for t in header.tensors().iter() {
                let r = t.file_offset as usize..(t.file_offset + t.nbytes) as usize;
                let e = Expected {
                    name: t.name.to_owned(),
                    shard: shard.clone(),
                    ty: t.ty,
                    ne: t.ne(),
                    file_offset: t.file_offset,
                    nbytes: t.nbytes,
                    bytes: file[r].to_vec(),
                };
                if let Some(shapes) = &raw_shapes {
                    // numpy order in the file, ggml order from `ne()`.
                    let mut ne = shapes[&e.name].clone();
                    ne.reverse();
                    assert_eq!(e.ne, ne, "{}", e.name);
                }
                out.push(e);
            }
        }
        let m = manifest();
        let m = m[self.manifest_key()].as_object().unwrap();
        let names: BTreeSet<&str> = out.iter().map(|e| e.name.as_str()).collect();
        let want: BTreeSet<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(names, want, "{self:?}: shard headers vs manifest");
        assert_eq!(
            out.len(),
            m.len(),
            "{self:?}: a name repeated across shards"
        );
        for e in &out {
            let w = &m[&e.name];
            assert!(
                e.shard.ends_with(w["shard"].as_str().unwrap()),
                "{}: in {} by its header, {} by the manifest",
                e.name,
                e.shard.display(),
                w["shard"]
            );
            assert_eq!(sha(&e.bytes), w["sha256"], "{}", e.name);
        }
        // The fixture is a real multi-file model: tensors in more than one
        // shard, and some past the first.
        let first = &self.shards()[0];
        assert!(out.iter().any(|e| &e.shard != first));
        out
    }
}

/// The `shape` of every tensor in a safetensors file's JSON header, read
/// here without weightmap.
fn st_shapes(file: &[u8]) -> BTreeMap<String, Vec<u64>> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let json: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    json.as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (k.clone(), shape)
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Mapped,
    Streamed,
}

fn load(path: &Path, mode: Mode) -> Weights {
    let w = match mode {
        // SAFETY: the committed fixtures are only read, never modified or
        // truncated, while these weights (and their handles) live.
        Mode::Mapped => unsafe { Weights::load(path, &LoadOptions::default()) },
        Mode::Streamed => Weights::load_streamed(path, &LoadOptions::default()),
    }
    .unwrap_or_else(|e| panic!("{} ({mode:?}): {e}", path.display()));
    let want = match mode {
        Mode::Mapped => LoadMode::Mmap,
        Mode::Streamed => LoadMode::Stream,
    };
    assert_eq!(w.report().mode_used, want, "{}", path.display());
    w
}

/// One loaded model, with what it should hold.
struct Case {
    what: String,
    fixture: Fixture,
    mode: Mode,
    weights: Weights,
    expected: Vec<Expected>,
}

/// Every fixture, from every load path, in both modes.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for fixture in Fixture::ALL {
        let expected = fixture.expected();
        for path in fixture.load_paths() {
            for mode in [Mode::Mapped, Mode::Streamed] {
                out.push(Case {
                    what: format!(
                        "{fixture:?} from {} ({mode:?})",
                        path.strip_prefix(shards_dir()).unwrap().display()
                    ),
                    fixture,
                    mode,
                    weights: load(&path, mode),
                    expected: expected.clone(),
                });
            }
        }
    }
    assert_eq!(out.len(), (3 + 2) * 2);
    out
}

/// Names no shard holds: unknown, a prefix of a real name, a real name with
/// a suffix, a block that does not exist.
const MISSING: [&str; 4] = [
    "no.such.tensor",
    "blk.1.attn_q",
    "output.weight.bias",
    "blk.9.attn_q.weight",
];

fn assert_not_found<T: std::fmt::Debug>(r: weightmap::Result<T>, name: &str, what: &str) {
    match r {
        Err(Error::TensorNotFound { name: n }) => assert_eq!(n, name, "{what}"),
        other => panic!("{what}: {name}: expected TensorNotFound, got {other:?}"),
    }
}

#[test]
fn len_tensors_and_tensor_infos_list_every_tensor_of_every_shard() {
    for c in cases() {
        let w = &c.weights;
        let want = &c.expected;
        assert_eq!(w.len(), want.len(), "{}", c.what);
        assert!(!w.is_empty());

        // tensor_infos: every descriptor, shard by shard, as each file has it.
        let infos: Vec<_> = w.tensor_infos().collect();
        assert_eq!(w.tensor_infos().len(), want.len(), "{}", c.what);
        assert_eq!(infos.len(), want.len(), "{}", c.what);
        for (info, e) in infos.iter().zip(want) {
            assert_eq!(info.name, e.name, "{}", c.what);
            assert_eq!(info.ty, e.ty, "{}: {}", c.what, e.name);
            assert_eq!(info.ne(), e.ne, "{}: {}", c.what, e.name);
            assert_eq!(info.file_offset, e.file_offset, "{}: {}", c.what, e.name);
            assert_eq!(info.nbytes, e.nbytes, "{}: {}", c.what, e.name);
        }

        // tensors: the same order, with the file's bytes.
        assert_eq!(w.tensors().len(), want.len(), "{}", c.what);
        let mut seen = 0;
        for (t, e) in w.tensors().zip(want) {
            assert_eq!(t.name(), e.name, "{}", c.what);
            assert_eq!(t.info().ne(), e.ne, "{}: {}", c.what, e.name);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
            assert_eq!(
                t.host_bytes().unwrap(),
                &e.bytes[..],
                "{}: {}",
                c.what,
                e.name
            );
            if c.mode == Mode::Streamed {
                assert_eq!(t.placement_kind(), PlacementKind::Copied, "{}", c.what);
            }
            seen += 1;
        }
        assert_eq!(seen, want.len(), "{}", c.what);

        // Every shard is in the report, each with its own tensors.
        let shards: Vec<PathBuf> = w.report().shards.iter().map(|s| s.path.clone()).collect();
        let files = c.fixture.shards();
        assert_eq!(shards.len(), files.len(), "{}", c.what);
        for (s, f) in w.report().shards.iter().zip(&files) {
            assert_eq!(
                s.path.canonicalize().unwrap(),
                f.canonicalize().unwrap(),
                "{}",
                c.what
            );
            let n = want.iter().filter(|e| &e.shard == f).count();
            assert_eq!(s.tensors, n, "{}: {}", c.what, f.display());
        }
    }
}

#[test]
fn tensor_at_and_tensor_index_cover_every_tensor_of_a_split_model() {
    for c in cases() {
        let w = &c.weights;
        for (i, e) in c.expected.iter().enumerate() {
            assert_eq!(
                w.tensor_index(&e.name),
                Some(i),
                "{}: tensor_index({})",
                c.what,
                e.name
            );
            let t = w
                .tensor_at(i)
                .unwrap_or_else(|| panic!("{}: tensor_at({i})", c.what));
            assert_eq!(t.name(), e.name, "{}: tensor_at({i})", c.what);
            assert_eq!(t.info().ty, e.ty, "{}: {}", c.what, e.name);
            assert_eq!(t.info().ne(), e.ne, "{}: {}", c.what, e.name);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
            // tensor_at(tensor_index(name)) is the tensor of that name.
            let j = w.tensor_index(t.name()).unwrap();
            assert_eq!(w.tensor_at(j).unwrap().name(), e.name, "{}", c.what);
        }
        assert!(w.tensor_at(w.len()).is_none(), "{}", c.what);
        assert!(w.tensor_at(usize::MAX).is_none(), "{}", c.what);
        for name in MISSING {
            assert_eq!(w.tensor_index(name), None, "{}: {name}", c.what);
        }
    }
}

#[test]
fn tensor_by_name_finds_every_tensor_of_a_split_model() {
    for c in cases() {
        let w = &c.weights;
        for e in &c.expected {
            let t = w
                .tensor(&e.name)
                .unwrap_or_else(|err| panic!("{}: tensor({}): {err}", c.what, e.name));
            assert_eq!(t.name(), e.name, "{}", c.what);
            let info = t.info();
            assert_eq!(info.ty, e.ty, "{}: {}", c.what, e.name);
            assert_eq!(info.ne(), e.ne, "{}: {}", c.what, e.name);
            assert_eq!(info.file_offset, e.file_offset, "{}: {}", c.what, e.name);
            assert_eq!(info.nbytes, e.nbytes, "{}: {}", c.what, e.name);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
            assert_eq!(
                t.host_bytes().unwrap(),
                &e.bytes[..],
                "{}: {}",
                c.what,
                e.name
            );
        }
    }
}

#[test]
fn tensor_new_finds_every_tensor_of_a_split_model() {
    for c in cases() {
        let what = c.what;
        let arc = Arc::new(c.weights);
        let handles: Vec<Tensor> = c
            .expected
            .iter()
            .map(|e| {
                Tensor::new(&arc, &e.name)
                    .unwrap_or_else(|err| panic!("{what}: Tensor::new({}): {err}", e.name))
            })
            .collect();
        // The handles own the weights: they outlive the caller's Arc.
        drop(arc);
        for (t, e) in handles.iter().zip(&c.expected) {
            assert_eq!(t.name(), e.name, "{what}");
            let info = t.info();
            assert_eq!(info.name, e.name, "{what}");
            assert_eq!(info.ty, e.ty, "{what}: {}", e.name);
            assert_eq!(info.ne(), e.ne, "{what}: {}", e.name);
            assert_eq!(info.file_offset, e.file_offset, "{what}: {}", e.name);
            assert_eq!(info.nbytes, e.nbytes, "{what}: {}", e.name);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{what}: {}", e.name);
            assert_eq!(t.host_bytes().unwrap(), &e.bytes[..], "{what}: {}", e.name);
            assert_eq!(t.get().name(), e.name, "{what}");
            assert!(Arc::ptr_eq(t.weights(), handles[0].weights()), "{what}");
        }
    }
}

/// The split GGUF's case named in the brief: the tensors of shards 2 and 3
/// through `Tensor::new`, loaded from a later shard.
#[test]
fn tensor_new_finds_every_tensor_of_a_split_gguf() {
    let expected = Fixture::SplitGguf.expected();
    for shard in [1, 3] {
        let p = shards_dir().join(format!("split-0000{shard}-of-00003.gguf"));
        for mode in [Mode::Mapped, Mode::Streamed] {
            let arc = Arc::new(load(&p, mode));
            assert_eq!(arc.len(), expected.len());
            for e in &expected {
                let t = Tensor::new(&arc, &e.name).unwrap_or_else(|err| {
                    panic!(
                        "Tensor::new({}) (in {}) from shard {shard} ({mode:?}): {err}",
                        e.name,
                        e.shard.display()
                    )
                });
                assert_eq!(t.name(), e.name);
                assert_eq!(t.info().ne(), e.ne, "{}", e.name);
                assert_eq!(t.to_vec().unwrap(), e.bytes, "{}", e.name);
            }
        }
    }
}

#[test]
fn tensor_at_handle_covers_every_tensor_of_a_split_model() {
    for c in cases() {
        let what = c.what;
        let arc = Arc::new(c.weights);
        for (i, e) in c.expected.iter().enumerate() {
            let t = Tensor::at(&arc, i).unwrap_or_else(|| panic!("{what}: Tensor::at({i})"));
            assert_eq!(t.name(), e.name, "{what}: Tensor::at({i})");
            assert_eq!(t.info().ty, e.ty, "{what}: {}", e.name);
            assert_eq!(t.info().ne(), e.ne, "{what}: {}", e.name);
            assert_eq!(t.info().file_offset, e.file_offset, "{what}: {}", e.name);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{what}: {}", e.name);
            // The same tensor as by name.
            let by_name = Tensor::new(&arc, &e.name).unwrap();
            assert_eq!(by_name.to_vec().unwrap(), t.to_vec().unwrap(), "{what}");
        }
        assert!(Tensor::at(&arc, c.expected.len()).is_none(), "{what}");
        assert!(Tensor::at(&arc, usize::MAX).is_none(), "{what}");
    }
}

/// `blk.N.` and the rest of the name, for a block tensor.
fn block_of(name: &str) -> Option<(u32, &str, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, tail) = rest.split_once('.')?;
    let i = n.parse().ok()?;
    Some((i, &name[..4 + n.len() + 1], tail))
}

#[test]
fn scopes_and_blocks_reach_tensors_in_every_shard() {
    for c in cases() {
        let w = &c.weights;
        // The blocks the names hold, each with its tensors in load order.
        let mut want: BTreeMap<u32, Vec<&Expected>> = BTreeMap::new();
        for e in &c.expected {
            if let Some((n, _, _)) = block_of(&e.name) {
                want.entry(n).or_default().push(e);
            }
        }
        assert!(want.len() > 1, "{}: the fixture has several blocks", c.what);
        // The blocks lie in different shards.
        let block_shards: BTreeSet<&PathBuf> = want.values().flatten().map(|e| &e.shard).collect();
        assert!(block_shards.len() > 1, "{}", c.what);

        let blocks = w.blocks();
        let got: Vec<u32> = blocks.iter().map(|(n, _)| *n).collect();
        assert_eq!(got, want.keys().copied().collect::<Vec<_>>(), "{}", c.what);

        for (n, scope) in &blocks {
            let prefix = format!("blk.{n}.");
            assert_eq!(scope.prefix(), prefix, "{}", c.what);
            let direct = w.prefix(&prefix);
            let es = &want[n];
            for s in [*scope, direct] {
                let names: Vec<&str> = s.tensors().map(|t| t.name()).collect();
                let want_names: Vec<&str> = es.iter().map(|e| e.name.as_str()).collect();
                assert_eq!(names, want_names, "{}: {prefix}", c.what);
                for (t, e) in s.tensors().zip(es.iter()) {
                    assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
                }
                for e in es {
                    let (_, _, tail) = block_of(&e.name).unwrap();
                    let t = s
                        .tensor(tail)
                        .unwrap_or_else(|err| panic!("{}: {prefix}{tail}: {err}", c.what));
                    assert_eq!(t.name(), e.name, "{}", c.what);
                    assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
                    let o = s
                        .opt_tensor(tail)
                        .unwrap_or_else(|| panic!("{}: opt {prefix}{tail}", c.what));
                    assert_eq!(o.name(), e.name, "{}", c.what);
                    assert_eq!(o.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
                    let k = s
                        .tensor_checked(tail, &e.ne, &[e.ty])
                        .unwrap_or_else(|err| panic!("{}: checked {prefix}{tail}: {err}", c.what));
                    assert_eq!(k.name(), e.name, "{}", c.what);
                    assert_eq!(k.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
                    assert!(s.tensor_checked(tail, &e.ne, &[]).is_ok(), "{}", c.what);
                    let mut wrong = e.ne.clone();
                    wrong[0] += 1;
                    assert!(
                        matches!(
                            s.tensor_checked(tail, &wrong, &[]),
                            Err(Error::ShapeMismatch { ref tensor, .. }) if *tensor == e.name
                        ),
                        "{}: {}",
                        c.what,
                        e.name
                    );
                }
                // A name under the prefix that no shard holds.
                assert!(s.opt_tensor("no_such.weight").is_none(), "{}", c.what);
            }
        }

        // A scope over a prefix that is not a block: every tensor whose
        // name starts with it, from whichever shard.
        for e in &c.expected {
            let first = e.name.split('.').next().unwrap();
            let p = format!("{first}.");
            let s = w.prefix(&p);
            let names: Vec<&str> = s.tensors().map(|t| t.name()).collect();
            let want_names: Vec<&str> = c
                .expected
                .iter()
                .filter(|x| x.name.starts_with(&p))
                .map(|x| x.name.as_str())
                .collect();
            assert_eq!(names, want_names, "{}: {p}", c.what);
            let t = s.tensor(&e.name[p.len()..]).unwrap();
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
        }
        // The empty prefix is the whole model.
        assert_eq!(
            w.prefix("").tensors().count(),
            c.expected.len(),
            "{}",
            c.what
        );
    }
}

#[test]
fn tensor_checked_and_check_shape_accept_every_tensor_of_a_split_model() {
    for c in cases() {
        let w = &c.weights;
        // The same model again, shared, for owned handles.
        let arc = Arc::new(load_like(&c));
        for e in &c.expected {
            let t = w
                .tensor_checked(&e.name, &e.ne, &[e.ty])
                .unwrap_or_else(|err| panic!("{}: tensor_checked({}): {err}", c.what, e.name));
            assert_eq!(t.name(), e.name, "{}", c.what);
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
            // Any type, when none is named.
            assert!(w.tensor_checked(&e.name, &e.ne, &[]).is_ok(), "{}", c.what);

            // The wrong shape: more dimensions, a different ne[0], and the
            // shape reversed when that differs (numpy order given for ggml's).
            let mut longer = e.ne.clone();
            longer.push(1);
            let mut off = e.ne.clone();
            off[0] += 1;
            let mut wrongs = vec![longer, off, vec![]];
            let rev: Vec<u64> = e.ne.iter().rev().copied().collect();
            if rev != e.ne {
                wrongs.push(rev);
            }
            for wrong in wrongs {
                match w.tensor_checked(&e.name, &wrong, &[]) {
                    Err(Error::ShapeMismatch {
                        tensor,
                        expected,
                        found,
                    }) => {
                        assert_eq!(tensor, e.name, "{}", c.what);
                        assert_eq!(expected, wrong, "{}", c.what);
                        assert_eq!(found, e.ne, "{}", c.what);
                    }
                    other => panic!("{}: {} as {wrong:?}: {other:?}", c.what, e.name),
                }
                assert!(
                    matches!(t.check_shape(&wrong, &[]), Err(Error::ShapeMismatch { .. })),
                    "{}: {}",
                    c.what,
                    e.name
                );
            }

            // The wrong type.
            let other = TensorType::ALL
                .iter()
                .copied()
                .find(|ty| *ty != e.ty)
                .unwrap();
            match w.tensor_checked(&e.name, &e.ne, &[other]) {
                Err(Error::TypeMismatch { tensor, found, .. }) => {
                    assert_eq!(tensor, e.name, "{}", c.what);
                    assert_eq!(found, e.ty.name(), "{}", c.what);
                }
                r => panic!("{}: {} as {other:?}: {r:?}", c.what, e.name),
            }
            assert!(
                w.tensor_checked(&e.name, &e.ne, &[other, e.ty]).is_ok(),
                "{}",
                c.what
            );

            // TensorRef::check_shape, on the handle from each lookup path.
            let arc_free = w.tensor(&e.name).unwrap();
            let by_index = w.tensor_at(w.tensor_index(&e.name).unwrap()).unwrap();
            for r in [t, arc_free, by_index] {
                let ok = r
                    .check_shape(&e.ne, &[e.ty])
                    .unwrap_or_else(|err| panic!("{}: check_shape({}): {err}", c.what, e.name));
                assert_eq!(ok.name(), e.name, "{}", c.what);
                assert_eq!(ok.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
                assert!(
                    matches!(
                        r.check_shape(&e.ne, &[other]),
                        Err(Error::TypeMismatch { .. })
                    ),
                    "{}: {}",
                    c.what,
                    e.name
                );
            }
            // And on an owned handle's borrowed view.
            let h = Tensor::new(&arc, &e.name).unwrap();
            let ok = h.get().check_shape(&e.ne, &[e.ty]).unwrap();
            assert_eq!(ok.name(), e.name, "{}", c.what);
            assert!(
                matches!(
                    h.get().check_shape(&e.ne[1..], &[]),
                    Err(Error::ShapeMismatch { .. })
                ),
                "{}: {}",
                c.what,
                e.name
            );
        }
    }
}

/// A fresh load of the same model as `c` (from its first shard or index).
fn load_like(c: &Case) -> Weights {
    load(&c.fixture.load_paths()[0], c.mode)
}

#[test]
fn advise_release_and_residency_work_by_name_on_every_shard() {
    let advices = [
        AccessAdvice::Normal,
        AccessAdvice::Random,
        AccessAdvice::Sequential,
        AccessAdvice::WillNeed,
    ];
    for c in cases() {
        let w = &c.weights;
        for e in &c.expected {
            for a in advices {
                w.advise(&e.name, a)
                    .unwrap_or_else(|err| panic!("{}: advise({}, {a:?}): {err}", c.what, e.name));
            }
            let t = w.tensor(&e.name).unwrap();
            // Touch the bytes, so its pages are in the page cache.
            assert_eq!(t.to_vec().unwrap(), e.bytes, "{}: {}", c.what, e.name);
            let res = w
                .residency(&e.name)
                .unwrap_or_else(|err| panic!("{}: residency({}): {err}", c.what, e.name));
            match (c.mode, t.placement_kind()) {
                (Mode::Mapped, PlacementKind::Mapped) => {
                    let r = res.unwrap_or_else(|| {
                        panic!(
                            "{}: residency({}) of a mapped tensor is None",
                            c.what, e.name
                        )
                    });
                    assert!(r.total_pages >= 1, "{}: {}: {r:?}", c.what, e.name);
                    assert_eq!(
                        r.resident_pages, r.total_pages,
                        "{}: {}: {r:?}",
                        c.what, e.name
                    );
                }
                // Streamed weights and copied tensors have no mapping.
                _ => assert_eq!(res, None, "{}: {}", c.what, e.name),
            }
            w.release(&e.name)
                .unwrap_or_else(|err| panic!("{}: release({}): {err}", c.what, e.name));
            // Still reads right: its pages come back from the file.
            assert_eq!(
                w.tensor(&e.name).unwrap().to_vec().unwrap(),
                e.bytes,
                "{}: {} after release",
                c.what,
                e.name
            );
        }
        // In mapped mode the shards past the first are mapped too.
        if c.mode == Mode::Mapped {
            let mapped = w
                .tensors()
                .filter(|t| t.placement_kind() == PlacementKind::Mapped)
                .count();
            assert_eq!(mapped, w.report().tensors_mapped, "{}", c.what);
            for s in &w.report().shards {
                assert_eq!(
                    s.mode_used,
                    LoadMode::Mmap,
                    "{}: {}",
                    c.what,
                    s.path.display()
                );
            }
        }
        w.release_all().unwrap();
        for (t, e) in w.tensors().zip(&c.expected) {
            assert_eq!(
                t.to_vec().unwrap(),
                e.bytes,
                "{}: {} after release_all",
                c.what,
                e.name
            );
        }
    }
}

#[test]
fn missing_names_are_tensor_not_found_through_every_lookup() {
    for c in cases() {
        let what = c.what;
        let arc = Arc::new(c.weights);
        let w = &*arc;
        for name in MISSING {
            assert_eq!(w.tensor_index(name), None, "{what}");
            assert_not_found(w.tensor(name), name, &format!("{what}: tensor"));
            assert_not_found(
                Tensor::new(&arc, name),
                name,
                &format!("{what}: Tensor::new"),
            );
            for ne in [&[][..], &[32][..]] {
                assert_not_found(
                    w.tensor_checked(name, ne, &[]),
                    name,
                    &format!("{what}: tensor_checked"),
                );
            }
            assert_not_found(
                w.advise(name, AccessAdvice::WillNeed),
                name,
                &format!("{what}: advise"),
            );
            assert_not_found(w.release(name), name, &format!("{what}: release"));
            assert_not_found(w.residency(name), name, &format!("{what}: residency"));

            // Scopes: the error names the full name.
            let (prefix, tail) = match block_of(name) {
                Some((_, p, t)) => (p, t),
                None => ("", name),
            };
            let s = w.prefix(prefix);
            assert!(s.opt_tensor(tail).is_none(), "{what}: {name}");
            assert_not_found(s.tensor(tail), name, &format!("{what}: scope.tensor"));
            assert_not_found(
                s.tensor_checked(tail, &[32], &[]),
                name,
                &format!("{what}: scope.tensor_checked"),
            );
        }
        // Real names, and their tails, under a block prefix where no shard
        // holds them (`blk.0.output.weight`, `blk.1.blk.0.attn_q.weight`).
        let mut tried = 0;
        for (_, scope) in w.blocks() {
            for t in w.tensors() {
                let tail = block_of(t.name()).map(|(_, _, tail)| tail);
                for name in std::iter::once(t.name()).chain(tail) {
                    let full = format!("{}{name}", scope.prefix());
                    if w.tensor_index(&full).is_some() {
                        continue;
                    }
                    tried += 1;
                    assert!(scope.opt_tensor(name).is_none(), "{what}: {full}");
                    assert_not_found(scope.tensor(name), &full, &format!("{what}: scope"));
                    assert_not_found(
                        scope.tensor_checked(name, &t.info().ne(), &[]),
                        &full,
                        &format!("{what}: scope.tensor_checked"),
                    );
                }
            }
        }
        assert!(tried > 0, "{what}");
        // Tensor names are whole names: a tail alone is not one.
        for e in &c.expected {
            if let Some((_, _, tail)) = block_of(&e.name) {
                assert_not_found(w.tensor(tail), tail, &format!("{what}: tail"));
                assert_not_found(Tensor::new(&arc, tail), tail, &format!("{what}: tail"));
            }
        }
    }
}
