//! The library's module graph: no import cycles, and every arrow points down
//! the layers of the design (ARCHITECTURE.md, "Layers and their arrows").
//!
//! The graph is read from the source text of `src/`, not from rustc, so the
//! test needs nothing beyond std and sees inline paths (`crate::x::f()`) as
//! well as `use` lines. Test-only code (`#[cfg(test)] mod`) may import
//! anything and is skipped. In a folder of folders (`src/loader/mapped/`),
//! each sub-folder is one part of the folder above it, so the arrows between
//! the loader's wings are checked as those between files. Not handled, as
//! the crate has none: `#[path]` other than a platform's choice of file.
//! `the_graph_reader_finds_edges` guards the reader, since one that saw
//! nothing would let every other check pass.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// The layers, lowest first. A module may import its own layer or lower.
const LAYERS: &[&[&str]] = &[
    &["error", "types", "size"],
    &["os", "alloc"],
    &["tensor", "gguf", "safetensors", "format"],
    &["buffer", "quant", "page_plan"],
    &["loader"],
    &["cache"],
];

/// The folders whose parts are layered too, lowest first (`mod` is the
/// folder's mod.rs, which declares every part and so sits on top). A part
/// may import its own layer or lower.
const FOLDER_LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "loader",
        &[
            // The floor: what a load is asked, what it did, and the facts
            // both paths start from.
            &[
                "budget", "headers", "loaded", "mode", "options", "report", "shards", "source",
            ],
            // The wings: the copying paths, the mapped path (which copies
            // what it cannot view in place), the handles a caller holds.
            &["copy"],
            &["mapped"],
            &["handles"],
            &["mod"],
        ],
    ),
    (
        "page_plan",
        &[
            &["choices", "residency"],
            &["plan"],
            &["announce", "prefetch"],
            &["mod"],
        ],
    ),
];

/// The most Rust files one folder of `src/` may hold, so that a newcomer
/// can see what belongs together.
const MOST_FILES_A_FOLDER: usize = 12;

/// Inside layer 0, "no cycle" is not enough: the bottom of the crate must
/// stay a leaf, so these are the only arrows allowed there.
const LAYER0_MAY_IMPORT: &[(&str, &[&str], &str)] = &[
    ("types", &[], "nothing of the crate"),
    ("error", &["types"], "only `types`"),
    ("size", &[], "nothing of the crate"),
];

// ------------------------------------------------------------------ reading

type Tokens = Vec<(String, usize)>; // token, line
type Paths = Vec<(Vec<String>, usize)>; // absolute module path, line

const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];

fn is_word(s: &str) -> bool {
    s.starts_with(|c: char| c.is_alphanumeric() || c == '_')
}

/// Words, `::` and single punctuation, each with its line. Comments (doc
/// comments too), strings and char literals give no token, so a path in
/// prose or in a message is never taken for an import.
fn lex(src: &str) -> Tokens {
    let b = src.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(b' ');
    let find = |from: usize, pat: &str| src.get(from..).and_then(|s| s.find(pat)).map(|k| from + k);
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let (mut toks, mut i, mut line) = (Vec::new(), 0, 1);
    while i < b.len() {
        let mut end = i + 1;
        match (at(i), at(i + 1)) {
            (b'/', b'/') => end = find(i, "\n").unwrap_or(b.len()),
            (b'/', b'*') => end = find(i + 2, "*/").map_or(b.len(), |e| e + 2),
            (b'"', _) => {
                while end < b.len() && b[end] != b'"' {
                    end += if b[end] == b'\\' { 2 } else { 1 };
                }
                end += 1;
            }
            (b'\'', b'\\') => end = find(i + 3, "'").map_or(b.len(), |e| e + 1),
            (b'\'', _) if at(i + 2) == b'\'' => end = i + 3, // else a lifetime
            (c, _) if word(c) => {
                end = (i..b.len()).find(|&j| !word(b[j])).unwrap_or(b.len());
                let hashes = src[end..].len() - src[end..].trim_start_matches('#').len();
                if matches!(&src[i..end], "r" | "br" | "cr") && at(end + hashes) == b'"' {
                    let close = format!("\"{}", "#".repeat(hashes)); // raw: no escapes
                    end = find(end + hashes + 1, &close).map_or(b.len(), |e| e + close.len());
                } else {
                    toks.push((src[i..end].to_string(), line));
                }
            }
            (c, next) if !c.is_ascii_whitespace() => {
                end += usize::from(c == b':' && next == b':');
                toks.push((src[i..end].to_string(), line));
            }
            _ => {}
        }
        let end = end.min(b.len());
        line += src[i..end].matches('\n').count();
        i = end;
    }
    toks
}

/// The `mod name;` lines of one file, and every path into the crate that it
/// names, made absolute (`crate::` is `[]`); `super::` and `self::` resolve
/// from where they stand, in inline modules too.
fn scan(src: &str, module: &[String]) -> (Vec<(String, usize)>, Paths) {
    let t = lex(src);
    let tok = |i: usize| t.get(i).map_or("", |x| x.0.as_str());
    let (mut decls, mut paths, mut i, mut depth) = (Vec::new(), Vec::new(), 0, 0i32);
    // Inline modules open here: (name, brace depth, under `#[cfg(test)]`).
    let mut inline: Vec<(String, i32, bool)> = Vec::new();
    let mut cfg_test = false; // holds until the next item starts or ends
    while i < t.len() {
        let name = tok(i + 1).to_string();
        match tok(i) {
            "#" if (0..7).all(|k| tok(i + k) == CFG_TEST[k]) => cfg_test = true,
            "mod" if is_word(&name) && tok(i + 2) == ";" && !cfg_test && inline.is_empty() => {
                decls.push((name, t[i].1));
            }
            "mod" if is_word(&name) && tok(i + 2) == "{" => inline.push((name, depth, cfg_test)),
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|m| m.1 == depth) {
                    inline.pop();
                }
            }
            w @ ("crate" | "super" | "self") if name == "::" && tok(i.wrapping_sub(1)) != "::" => {
                let here = module.iter().chain(inline.iter().map(|m| &m.0));
                let mut base: Vec<String> = here.filter(|_| w != "crate").cloned().collect();
                i += if w == "super" { 0 } else { 2 };
                while tok(i) == "super" && tok(i + 1) == "::" {
                    base.pop();
                    i += 2;
                }
                let (in_test, mut ignored) = (inline.iter().any(|m| m.2), Vec::new());
                let out = if in_test { &mut ignored } else { &mut paths };
                use_tree(&t, &mut i, base, out);
                continue;
            }
            _ => {}
        }
        cfg_test &= !matches!(tok(i), ";" | "{" | "}" | "mod");
        i += 1;
    }
    (decls, paths)
}

/// Reads what follows a `prefix::`: a path (`a::X`), `*`, or a brace group
/// (`{a::X, b::{c, D}, self}`), pushing every leaf path with its line.
fn use_tree(t: &Tokens, i: &mut usize, mut path: Vec<String>, out: &mut Paths) {
    let Some((tok, line)) = t.get(*i) else { return };
    *i += 1;
    match tok.as_str() {
        "{" => {
            while *i < t.len() && t[*i].0 != "}" {
                match t[*i].0.as_str() {
                    "," => *i += 1,
                    _ => use_tree(t, i, path.clone(), out),
                }
            }
            *i += 1;
        }
        w if is_word(w) && w != "self" => {
            path.push(w.to_string());
            if t.get(*i).is_some_and(|(sep, _)| sep == "::") {
                *i += 1;
                use_tree(t, i, path, out);
            } else {
                out.push((path, *line));
            }
        }
        _ => out.push((path, *line)), // `*`, `self` (the path itself), or a generic
    }
}

// ------------------------------------------------------------------ the graph

/// The files of modules chosen per platform (`#[cfg_attr(unix, path =
/// "unix.rs")] mod sys;`): each file is that module, `os::sys`, whatever
/// its own name. Filled by [`library_files`].
static CHOSEN: std::sync::Mutex<BTreeMap<String, Vec<String>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// `src/x/y.rs` is file `y` of module `x`; `src/x.rs` and `src/x/mod.rs`
/// are module `x`; `src/lib.rs` is the root, `[]`.
fn module_of(rel: &str) -> Vec<String> {
    if let Some(m) = CHOSEN.lock().unwrap().get(rel) {
        return m.clone();
    }
    let path = rel.strip_prefix("src/").and_then(|p| p.strip_suffix(".rs"));
    let mut m: Vec<String> = path.unwrap().split('/').map(String::from).collect();
    if m == ["lib"] || m.last().is_some_and(|f| f == "mod") {
        m.pop();
    }
    m
}

/// The library's files (path from the manifest dir, text), found as rustc
/// finds them: from the `mod` lines of lib.rs down. So `src/main.rs`, the
/// command's modules and test-only files are not part of it.
fn library_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut todo, mut files) = (vec!["src/lib.rs".to_string()], Vec::new());
    while let Some(rel) = todo.pop() {
        let text = std::fs::read_to_string(root.join(&rel));
        let text = text.unwrap_or_else(|e| panic!("{rel}: {e}"));
        let module = module_of(&rel);
        for (name, line) in scan(&text, &module).0 {
            let mut parts = module.clone();
            parts.push(name.clone());
            let stem = format!("src/{}", parts.join("/"));
            // A module chosen per platform (`#[cfg_attr(unix, path =
            // "unix.rs")]`, as `os::sys`) is every file its attributes name.
            let dir = rel.rsplit_once('/').map_or("src", |(d, _)| d);
            let chosen = path_attributes(&text, line);
            if !chosen.is_empty() {
                for f in chosen {
                    let file = format!("{dir}/{f}");
                    CHOSEN.lock().unwrap().insert(file.clone(), parts.clone());
                    todo.push(file);
                }
                continue;
            }
            let child = [format!("{stem}.rs"), format!("{stem}/mod.rs")];
            match child.into_iter().find(|c| root.join(c).exists()) {
                Some(c) => todo.push(c),
                None => panic!("{rel}:{line}: `mod {name};` but no {stem}.rs or {stem}/mod.rs"),
            }
        }
        files.push((rel, text));
    }
    files.sort();
    files
}

/// The files named by `path = "..."` in the attribute lines right above
/// line `line` (1-based) of `text`.
fn path_attributes(text: &str, line: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut files = Vec::new();
    for l in lines[..line.saturating_sub(1)].iter().rev() {
        let l = l.trim();
        if !l.starts_with("#[") {
            break;
        }
        if let Some((_, rest)) = l.split_once("path = \"") {
            if let Some((file, _)) = rest.split_once('"') {
                files.push(file.to_string());
            }
        }
    }
    files
}

#[derive(Debug)]
struct Edge {
    from: String,
    to: String,
    at: String, // "src/x.rs:12": where to go to cut the arrow
}

#[derive(Debug, Default)]
struct Graph {
    modules: BTreeMap<String, String>, // top-level module -> its file
    top: Vec<Edge>,
    folders: BTreeMap<String, Vec<Edge>>, // "loader" -> arrows between its files
    through_root: Vec<String>,
}

/// The last names of the modules one level below `parent`.
fn children<'a>(modules: &'a [Vec<String>], parent: &[String]) -> BTreeSet<&'a str> {
    let below = |m: &&Vec<String>| m.len() == parent.len() + 1 && m.starts_with(parent);
    let names = modules.iter().filter(below);
    names.map(|m| m[parent.len()].as_str()).collect()
}

fn graph_of(files: &[(String, String)]) -> Graph {
    let modules: Vec<Vec<String>> = files.iter().map(|(rel, _)| module_of(rel)).collect();
    let mut g = Graph::default();
    for ((rel, _), m) in files.iter().zip(&modules).filter(|(_, m)| m.len() == 1) {
        g.modules.insert(m[0].clone(), rel.clone());
    }
    // lib.rs is left out: its imports are its re-exports, above every layer.
    for ((rel, text), module) in files.iter().zip(&modules).filter(|(_, m)| !m.is_empty()) {
        let (decls, paths) = scan(text, module);
        let (top, at) = (&module[0], |line| format!("{rel}:{line}"));
        // A file with files below it (a mod.rs) is file `mod` of its folder.
        let owns_dir = rel.ends_with("/mod.rs") || !children(&modules, module).is_empty();
        let (folder, me) = match module.split_last() {
            Some((name, folder)) if !owns_dir => (folder, name.as_str()),
            _ => (&module[..], "mod"),
        };
        let mut file_edge = |to: &str, line| {
            let (from, to, at) = (me.to_string(), to.to_string(), at(line));
            g.folders
                .entry(folder.join("/"))
                .or_default()
                .push(Edge { from, to, at });
        };
        // mod.rs sits above the files it declares, so a file importing from
        // mod.rs closes a cycle: mod.rs should only declare and re-export.
        for (child, line) in decls.iter().filter(|_| owns_dir) {
            file_edge(child, *line);
        }
        for (path, line) in paths {
            match path.first() {
                Some(n) if n == top => {
                    // In each folder that holds the file, from the
                    // outermost in, an arrow from the part that holds it
                    // (a file, or a folder of files) to the part that holds
                    // the item: an item of mod.rs, or one it re-exports, is
                    // `mod`'s.
                    for depth in 1..=folder.len() {
                        let outer = &folder[..depth];
                        if !path.starts_with(outer) {
                            break; // the file's own items, or a cousin's
                        }
                        let from = module.get(depth).filter(|_| depth < folder.len());
                        let from = from.map_or(me, String::as_str);
                        let parts = children(&modules, outer);
                        let to = path.get(depth).map(String::as_str);
                        let to = to.filter(|n| parts.contains(n)).unwrap_or("mod");
                        if to != from {
                            let (from, to, at) = (from.to_string(), to.to_string(), at(line));
                            let edges = g.folders.entry(outer.join("/")).or_default();
                            edges.push(Edge { from, to, at });
                        }
                    }
                }
                Some(n) if g.modules.contains_key(n) => {
                    let (from, to, at) = (top.clone(), n.clone(), at(line));
                    g.top.push(Edge { from, to, at });
                }
                _ => g.through_root.push(format!(
                    "{}: `crate::{}` imports through the crate root; \
                     import it from the module that defines it",
                    at(line),
                    path.join("::"),
                )),
            }
        }
    }
    g
}

// ------------------------------------------------------------------ cycles

/// Tarjan's strongly connected components that have more than one member.
fn cycles(edges: &[Edge]) -> Vec<Vec<String>> {
    #[derive(Default)]
    struct Tarjan<'a> {
        adj: BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, (usize, usize)>, // (index, lowlink)
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut Tarjan<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, (n, n));
        t.stack.push(v);
        for w in t.adj.get(v).cloned().unwrap_or_default() {
            let low = match t.index.get(w).copied() {
                None => {
                    visit(t, w);
                    t.index[w].1
                }
                Some((index, _)) if t.stack.contains(&w) => index,
                Some(_) => continue,
            };
            let lowlink = &mut t.index.get_mut(v).unwrap().1;
            *lowlink = (*lowlink).min(low);
        }
        if t.index[v].0 == t.index[v].1 {
            let at = t.stack.iter().rposition(|&x| x == v).unwrap();
            let mut scc: Vec<String> = t.stack.drain(at..).map(String::from).collect();
            scc.sort();
            if scc.len() > 1 {
                t.out.push(scc);
            }
        }
    }
    let mut t = Tarjan::default();
    for e in edges {
        t.adj.entry(&e.from).or_default().insert(&e.to);
    }
    for v in t.adj.keys().copied().collect::<Vec<_>>() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// Each distinct arrow with every place that makes it.
fn arrows(edges: &[Edge]) -> BTreeMap<(&str, &str), Vec<&str>> {
    let mut m: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for e in edges {
        let at = m.entry((e.from.as_str(), e.to.as_str())).or_default();
        if at.last() != Some(&e.at.as_str()) {
            at.push(&e.at); // one `use` line naming two items is one place
        }
    }
    m
}

/// Each cycle as one shortest loop through its first member, then the other
/// arrows inside the same component: cutting the loop may not be enough.
fn describe_cycles(what: &str, edges: &[Edge]) -> Vec<String> {
    let arrows = arrows(edges);
    let show =
        |&(a, b): &(&str, &str)| format!("    {a} -> {b}   at {}\n", arrows[&(a, b)].join(", "));
    let mut out = Vec::new();
    for scc in cycles(edges) {
        let inside = |n: &str| scc.iter().any(|s| s == n);
        // Breadth first from the first member until an arrow leads back to it.
        let start = scc[0].as_str();
        let (mut prev, mut queue, mut last) = (BTreeMap::new(), VecDeque::from([start]), None);
        while let (None, Some(v)) = (last, queue.pop_front()) {
            for &(a, b) in arrows.keys().filter(|&&(a, b)| a == v && inside(b)) {
                if b == start {
                    last = Some(a);
                } else if !prev.contains_key(b) {
                    prev.insert(b, a);
                    queue.push_back(b);
                }
            }
        }
        let mut lp = vec![(last.expect("a component of two or more has a cycle"), start)];
        while lp[0].0 != start {
            lp.insert(0, (prev[lp[0].0], lp[0].0));
        }
        let mut s = format!("{what} {} import each other in a cycle:\n", scc.join(", "));
        s.extend(lp.iter().map(show));
        let rest = arrows.keys().filter(|&&(a, b)| inside(a) && inside(b));
        let rest: String = rest.filter(|a| !lp.contains(a)).map(show).collect();
        if !rest.is_empty() {
            s += &format!("  other arrows among them:\n{rest}");
        }
        out.push(s);
    }
    out
}

fn fail_if_any(headline: &str, problems: Vec<String>) {
    let n = problems.len();
    assert!(n == 0, "{headline} ({n} found):\n\n{}", problems.join("\n"));
}

// ------------------------------------------------------------------ the checks

#[test]
fn top_level_modules_have_no_import_cycle() {
    let problems = describe_cycles("modules", &graph_of(&library_files()).top);
    fail_if_any(
        "top-level modules in an import cycle, cut one arrow of each",
        problems,
    );
}

#[test]
fn no_folder_has_an_import_cycle_among_its_files() {
    let folders = graph_of(&library_files()).folders;
    let each = folders
        .iter()
        .map(|(f, e)| describe_cycles(&format!("in src/{f}/, files"), e));
    fail_if_any(
        "files of one folder in an import cycle",
        each.flatten().collect(),
    );
}

#[test]
fn every_import_points_down_the_layers() {
    let g = graph_of(&library_files());
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let mut problems = Vec::new();
    for (m, file) in g.modules.iter().filter(|(m, _)| layer(m).is_none()) {
        problems.push(format!(
            "`{m}` ({file}) is in no layer: place it in LAYERS in tests/layers.rs, \
             above what it imports and below what imports it, or move it out of the library"
        ));
    }
    for ((from, to), at) in arrows(&g.top) {
        let (Some(i), Some(j), at) = (layer(from), layer(to), at.join(", ")) else {
            continue;
        };
        let leaf = LAYER0_MAY_IMPORT.iter().find(|(m, ..)| *m == from);
        if j > i {
            let up = format!("`{from}` (layer {i}) imports `{to}` (layer {j})");
            problems.push(format!("{up}, pointing up, at {at}"));
        } else if let Some((.., says)) = leaf.filter(|(_, ok, _)| j == 0 && !ok.contains(&to)) {
            problems.push(format!(
                "`{from}` may import {says}, but imports `{to}` at {at}"
            ));
        }
    }
    problems.extend(g.through_root);
    fail_if_any("imports that do not point down the layers", problems);
}

#[test]
fn every_import_inside_a_layered_folder_points_down() {
    let g = graph_of(&library_files());
    let mut problems = Vec::new();
    for (folder, layers) in FOLDER_LAYERS {
        let layer = |m: &str| layers.iter().position(|l| l.contains(&m));
        let edges = g.folders.get(*folder).map_or(&[][..], Vec::as_slice);
        if edges.is_empty() {
            problems.push(format!(
                "src/{folder}/ read as no arrows: is it still there?"
            ));
        }
        let parts = edges.iter().flat_map(|e| [e.from.as_str(), e.to.as_str()]);
        for part in parts.collect::<BTreeSet<_>>() {
            if layer(part).is_none() {
                problems.push(format!(
                    "`{part}` of src/{folder}/ is in no layer: place it in FOLDER_LAYERS"
                ));
            }
        }
        for ((from, to), at) in arrows(edges) {
            if let (Some(i), Some(j)) = (layer(from), layer(to)) {
                if j > i {
                    problems.push(format!(
                        "in src/{folder}/, `{from}` (layer {i}) imports `{to}` (layer {j}), \
                         pointing up, at {}",
                        at.join(", ")
                    ));
                }
            }
        }
    }
    fail_if_any("imports inside a folder that do not point down", problems);
}

#[test]
fn no_folder_holds_more_than_a_dozen_rust_files() {
    fn walk(dir: &Path, problems: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        let paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        let rust = paths
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "rs"));
        let n = rust.count();
        if n > MOST_FILES_A_FOLDER {
            problems.push(format!("{} holds {n} Rust files", dir.display()));
        }
        for sub in paths.iter().filter(|p| p.is_dir()) {
            walk(sub, problems);
        }
    }
    let mut problems = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut problems,
    );
    fail_if_any(
        &format!("folders of more than {MOST_FILES_A_FOLDER} Rust files: give them wings"),
        problems,
    );
}

/// Small files, each after a `==> path` line, with every form the reader
/// must understand. What `a.rs` says of `c` in prose, strings and test code
/// must not be an edge.
const FIXTURE: &str = r##"
==> src/lib.rs
mod a;
pub mod b;
mod c;
#[cfg(test)] mod tests;
==> src/a.rs
//! Prose names `crate::c`.
use crate::b::X; // crate::c in a comment
/* crate::c */ const S: &str = "crate::c \" crate::c";
fn f<'a>(_: &'a str) -> crate::Result<char> { let _ = r#"crate::c"#; Ok('}') }
#[cfg(test)] mod tests { use crate::c::Y; }
==> src/b/mod.rs
mod x;
mod y;
mod z;
pub use self::x::X;
#[cfg(test)]
#[allow(unused)]
pub(crate) mod tests;
==> src/b/x.rs
use super::{y::Helper, Shared};
use crate::{
    a::A,
    c::{C, D},
};
==> src/b/y.rs
pub fn g() -> crate::b::x::X { super::super::c::f() }
==> src/b/z/mod.rs
mod w;
==> src/b/z/w.rs
use crate::b::y::g;
fn h() -> super::super::x::X { super::w::k() }
==> src/c.rs
mod inner { use super::*; use super::super::Error; }
"##;

/// What the reader must find in `FIXTURE`, one arrow a line.
const FIXTURE_GRAPH: &str = "\
a -> b  src/a.rs:2
b -> a  src/b/x.rs:3
b -> c  src/b/x.rs:4
b -> c  src/b/x.rs:4
b -> c  src/b/y.rs:1
b: mod -> x  src/b/mod.rs:1
b: mod -> y  src/b/mod.rs:2
b: mod -> z  src/b/mod.rs:3
b: mod -> x  src/b/mod.rs:4
b: x -> y  src/b/x.rs:1
b: x -> mod  src/b/x.rs:1
b: y -> x  src/b/y.rs:1
b: z -> y  src/b/z/w.rs:1
b: z -> x  src/b/z/w.rs:2
b/z: mod -> w  src/b/z/mod.rs:1
src/a.rs:4: `crate::Result`
src/c.rs:1: `crate::Error`
";

#[test]
fn the_graph_reader_finds_edges() {
    let files = FIXTURE
        .split("==> ")
        .skip(1)
        .map(|f| f.split_once('\n').unwrap());
    let files: Vec<_> = files.map(|(rel, text)| (rel.into(), text.into())).collect();
    let g = graph_of(&files);
    let top = g.top.iter().map(|e| (String::new(), e));
    let in_folders = g
        .folders
        .iter()
        .flat_map(|(f, es)| es.iter().map(move |e| (format!("{f}: "), e)));
    let mut got = String::new();
    for (folder, e) in top.chain(in_folders) {
        got += &format!("{folder}{} -> {}  {}\n", e.from, e.to, e.at);
    }
    for r in &g.through_root {
        got += &format!("{}\n", &r[..r.find(" imports").unwrap()]);
    }
    assert_eq!(got, FIXTURE_GRAPH);
    assert_eq!(cycles(&g.top), [["a", "b"]]);
    assert_eq!(cycles(&g.folders["b"]), [["mod", "x", "y", "z"]]);
    let described = describe_cycles("files", &g.folders["b"]).concat();
    let lp = "    mod -> x   at src/b/mod.rs:1, src/b/mod.rs:4\n    x -> mod   at src/b/x.rs:1\n";
    assert!(described.contains(lp), "{described}");

    // The real tree: the command's files are not the library's, and the
    // reader finds the arrows there are.
    let real = library_files();
    let command = |rel: &String| rel == "src/main.rs" || rel.starts_with("src/cli/");
    assert!(!real.iter().any(|(rel, _)| command(rel)));
    let g = graph_of(&real);
    let (modules, top) = (g.modules.len(), g.top.len());
    let edges = top + g.folders.values().map(Vec::len).sum::<usize>();
    assert!(
        modules >= 8 && edges >= 15,
        "src/ read as {modules} modules, {edges} arrows"
    );
}
