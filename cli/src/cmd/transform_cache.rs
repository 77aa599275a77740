//! `weightmap cache ls|verify|prune|clear`: the cache of transformed
//! tensors ([`weightmap::cache`]), seen and kept by hand. (bench's cache
//! of its default model is another thing: `cmd/model_cache.rs`.)

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Subcommand;
use serde_json::{json, Value as Json};
use weightmap::cache::{parse_size, Cache, CacheBypass, EntryInfo, PruneReport};

use super::{emit, escape, human_bytes, json_text, table, CliError, CliResult};

/// Arguments of `cache`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

pub const LONG_ABOUT: &str = "\
List, check and trim the cache of transformed tensors: entries that a
runtime's transform (a dequantization, a repack) wrote once so that every
later load maps them like any weights. Each entry is a GGUF file named by
its key, and is one by its contents: a regular file of this user's whose
stored key hashes to its name. Nothing else in the directory (a model that
happens to be named like an entry, say) is listed, checked or removed, and
a FIFO, a device or a link is never opened.

The cache is $WEIGHTMAP_CACHE_DIR, else $XDG_CACHE_HOME/weightmap, else
~/.cache/weightmap (Windows: %LOCALAPPDATA%\\weightmap), or --dir; its size
limit is $WEIGHTMAP_CACHE_MAX_SIZE (a byte count such as 20G), else 16 GiB.
A limit that is not a byte count does not stop ls, verify or clear (ls
shows it as invalid); prune then needs --max-size.

Every subcommand applies a load's rules to the directory. On Unix, one
that another user owns, that other users may write in, or whose path
another user could redirect is refused (exit status 1, naming the
problem), and one that others may only read or search is made private
(mode 700) first.";

#[derive(Debug, Subcommand)]
enum Action {
    /// List the entries: size, last use, transform, source, and whether the
    /// source changed since (stale).
    #[command(long_about = LS_ABOUT)]
    Ls(LsArgs),
    /// Check every byte of every entry against its checksums; exit status 1
    /// if any entry is bad.
    #[command(long_about = VERIFY_ABOUT)]
    Verify(VerifyArgs),
    /// Remove stale entries, then the least recently used down to a size.
    #[command(long_about = PRUNE_ABOUT)]
    Prune(PruneArgs),
    /// Remove every entry.
    #[command(long_about = CLEAR_ABOUT)]
    Clear(ClearArgs),
}

const LS_ABOUT: &str = "\
List the entries: file, bytes, last use, transform@version, tensors,
source, and a note: \"stale\" when the source changed or is gone (the entry
can never be used again; prune removes it), \"unreadable: ...\" when the
entry's header lacks a field this listing shows (verify then fails it, and
prune removes it). A total line gives the bytes and the limit, or says the
limit is invalid (with $WEIGHTMAP_CACHE_MAX_SIZE's problem).

--json prints an array with one object per entry, in file-name order:
  path               the entry's file
  key                its key (the file name without .gguf)
  bytes              its length, or null if it cannot be read
  last_used          when it was last used, seconds since the Unix epoch,
                     or null
  transform          the transform's name (null if unreadable)
  transform_version  its version (null if unreadable)
  tensors            tensors in the entry (null if unreadable)
  source             the file it was made from (null if unreadable)
  stale              true when the source changed or is gone (null if
                     unreadable)
  error              why the entry cannot be read, or null";

const VERIFY_ABOUT: &str = "\
Check every byte of every entry against the checksums stored in it (the
header's and each tensor's), and print each entry with \"ok\" or what is
wrong (naming the tensor). Exit status 1, with one error line naming the
bad entries, if any is bad. A bad entry is removed (unless --keep-bad), so
that the next load of its source rebuilds it. A load that uses an entry
checks it in the same way; this checks every entry at once, those no load
has used lately too.

--json prints an array with one object per entry:
  path     the entry's file
  key      its key (the file name without .gguf)
  ok       true when every check passed
  error    what is wrong, or null
  removed  true when the bad entry was removed";

const PRUNE_ABOUT: &str = "\
Remove the entries whose source changed or is gone and those whose header
lacks a field, then the least recently used until at most --max-size bytes
remain (by default the cache's limit), and the temporary files of fills
that were killed. Prints each file removed and why, then what is kept.
Exit status 1 if a file could not be removed, or if --max-size is not
given and $WEIGHTMAP_CACHE_MAX_SIZE is not a byte count (nothing is
removed then).

--json prints one object:
  removed     an array of {path, bytes, reason}
  kept        entries kept
  kept_bytes  their bytes
  max_size    the size pruned to
  failed      an array of {path, error}: files that could not be removed";

const CLEAR_ABOUT: &str = "\
Remove every entry, and the temporary files of fills that were killed
(a fill under way keeps its own). Prints each file removed. Exit status 1
if a file could not be removed.

--json prints what prune --json prints (max_size 0).";

/// `--dir`, shared by every action.
#[derive(Debug, clap::Args)]
struct Where {
    /// The cache directory, instead of $WEIGHTMAP_CACHE_DIR (or
    /// $XDG_CACHE_HOME/weightmap, or ~/.cache/weightmap).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct LsArgs {
    #[command(flatten)]
    dir: Where,
    /// Print a JSON array instead of text (fields: see --help).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    #[command(flatten)]
    dir: Where,
    /// Print a JSON array instead of text (fields: see --help).
    #[arg(long)]
    json: bool,
    /// Leave bad entries in place (by default they are removed, so that the
    /// next load of their source rebuilds them).
    #[arg(long)]
    keep_bad: bool,
}

#[derive(Debug, clap::Args)]
struct PruneArgs {
    #[command(flatten)]
    dir: Where,
    /// Keep at most this many bytes (4096, 64M, 1GiB, 20GB, ...)
    /// [default: the cache's limit, $WEIGHTMAP_CACHE_MAX_SIZE or 16 GiB;
    /// required when that variable is not a byte count].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_size: Option<u64>,
    /// Print a JSON object instead of text (fields: see --help).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ClearArgs {
    #[command(flatten)]
    dir: Where,
    /// Print a JSON object instead of text (fields: see --help).
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> CliResult {
    match &a.action {
        Action::Ls(a) => ls(a),
        Action::Verify(a) => verify(a),
        Action::Prune(a) => {
            let cache = open(&a.dir)?;
            // Pruning to a limit nobody set could remove what the user
            // meant to keep: without one, only --max-size says how far.
            let max_size = match a.max_size {
                Some(bytes) => bytes,
                None => cache.limit().map_err(CliError::msg)?,
            };
            let report = cache.prune(max_size)?;
            print_pruned(&cache, &report, max_size, a.json)
        }
        Action::Clear(a) => {
            let cache = open(&a.dir)?;
            let report = cache.clear()?;
            print_pruned(&cache, &report, 0, a.json)
        }
    }
}

/// The cache the user means: `--dir`, else the environment's; with the
/// environment's limit either way, as the library reads it. A limit that
/// is not a byte count stops only what needs one (prune without
/// --max-size), with the library's own message.
fn open(w: &Where) -> CliResult<Cache> {
    let cache = match &w.dir {
        Some(dir) => Cache::new().in_dir(dir),
        None => Cache::new(),
    };
    if cache.dir().is_none() {
        return Err(CliError::msg(
            "no cache directory: set WEIGHTMAP_CACHE_DIR (or XDG_CACHE_HOME, or HOME), \
             or pass --dir",
        ));
    }
    Ok(cache)
}

fn dir_of(cache: &Cache) -> String {
    let dir = cache.dir().unwrap_or(Path::new(""));
    escape(&dir.display().to_string()).into_owned()
}

/// An entry's file name, which is its key and `.gguf`.
fn file_name(path: &Path) -> String {
    let name = path.file_name().unwrap_or(path.as_os_str());
    escape(&name.to_string_lossy()).into_owned()
}

fn key_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn unix_seconds(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// How long ago `t` was, for people: `40s ago`, `5m ago`, `3h ago`, `2d ago`.
fn age(t: SystemTime) -> String {
    let Ok(d) = SystemTime::now().duration_since(t) else {
        return "just now".into();
    };
    match d.as_secs() {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86400),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ls(a: &LsArgs) -> CliResult {
    let cache = open(&a.dir)?;
    let entries = cache.entries()?;
    if a.json {
        let list: Vec<Json> = entries.iter().map(|(p, e)| entry_json(p, e)).collect();
        return emit(&json_text(&Json::Array(list)));
    }
    let mut rows = vec![[
        "ENTRY",
        "BYTES",
        "LAST USED",
        "TRANSFORM",
        "TENSORS",
        "SOURCE",
        "",
    ]
    .map(String::from)
    .to_vec()];
    let (mut total, mut stale, mut unreadable) = (0u64, 0, 0);
    for (path, entry) in &entries {
        let row = match entry {
            Ok(e) => {
                total += e.bytes;
                stale += usize::from(!e.source_current);
                vec![
                    file_name(path),
                    e.bytes.to_string(),
                    age(e.last_used),
                    escape(&format!("{}@{}", e.transform, e.transform_version)).into_owned(),
                    e.tensors.to_string(),
                    escape(&e.source).into_owned(),
                    if e.source_current { "" } else { "stale" }.into(),
                ]
            }
            Err(err) => {
                unreadable += 1;
                let meta = std::fs::metadata(path).ok();
                total += meta.as_ref().map_or(0, |m| m.len());
                vec![
                    file_name(path),
                    meta.as_ref().map_or("?".into(), |m| m.len().to_string()),
                    meta.and_then(|m| m.modified().ok()).map_or("?".into(), age),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    escape(&format!("unreadable: {err}")).into_owned(),
                ]
            }
        };
        rows.push(row);
    }
    let mut out = String::new();
    if !entries.is_empty() {
        out.push_str(&table(&right_align(rows, &[1, 4]), usize::MAX, ""));
    }
    let mut notes = Vec::new();
    if stale > 0 {
        notes.push(format!("{stale} stale"));
    }
    if unreadable > 0 {
        notes.push(format!("{unreadable} unreadable"));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    out.push_str(&format!(
        "total: {}{notes}, {} of {}, in {}\n",
        plural(entries.len(), "entry", "entries"),
        human_bytes(total),
        limit_text(cache.limit()),
        dir_of(&cache),
    ));
    emit(&out)
}

/// The limit, for the total line: `a 17179869184 (16.0 GiB) limit`, or
/// `an invalid limit (WEIGHTMAP_CACHE_MAX_SIZE: ...)`.
fn limit_text(limit: Result<u64, &CacheBypass>) -> String {
    match limit {
        Ok(bytes) => format!("a {} limit", human_bytes(bytes)),
        Err(why) => format!("an invalid limit ({})", escape(&why.to_string())),
    }
}

/// `rows` with the cells of `columns` padded on the left to their widest,
/// so that a table of left-aligned columns shows them right-aligned.
fn right_align(mut rows: Vec<Vec<String>>, columns: &[usize]) -> Vec<Vec<String>> {
    for &c in columns {
        let width = rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
        for r in &mut rows {
            r[c] = format!("{:>width$}", r[c]);
        }
    }
    rows
}

fn entry_json(path: &Path, entry: &weightmap::Result<EntryInfo>) -> Json {
    match entry {
        Ok(e) => json!({
            "path": path.to_string_lossy(),
            "key": key_of(path),
            "bytes": e.bytes,
            "last_used": unix_seconds(e.last_used),
            "transform": e.transform,
            "transform_version": e.transform_version,
            "tensors": e.tensors,
            "source": e.source,
            "stale": !e.source_current,
            "error": null,
        }),
        Err(err) => {
            let meta = std::fs::metadata(path).ok();
            json!({
                "path": path.to_string_lossy(),
                "key": key_of(path),
                "bytes": meta.as_ref().map(|m| m.len()),
                "last_used": meta.and_then(|m| m.modified().ok()).and_then(unix_seconds),
                "transform": null,
                "transform_version": null,
                "tensors": null,
                "source": null,
                "stale": null,
                "error": err.to_string(),
            })
        }
    }
}

fn verify(a: &VerifyArgs) -> CliResult {
    let cache = open(&a.dir)?;
    let verdicts = cache.verify()?;
    let bad: Vec<(&PathBuf, &String)> = verdicts
        .iter()
        .filter_map(|(p, v)| v.as_ref().err().map(|e| (p, e)))
        .collect();
    // A bad entry is removed, so that the next load rebuilds it; one that
    // cannot be removed says why, and one a fill replaced with a good
    // entry meanwhile is kept (`Ok(false)`).
    let removal = |path: &PathBuf| -> Option<Result<bool, String>> {
        let bad = verdicts.iter().any(|(p, v)| p == path && v.is_err());
        (bad && !a.keep_bad).then(|| cache.remove_bad(path).map_err(|e| e.to_string()))
    };
    let removed: Vec<Option<Result<bool, String>>> =
        verdicts.iter().map(|(p, _)| removal(p)).collect();
    let out = if a.json {
        let list = verdicts
            .iter()
            .zip(&removed)
            .map(|((path, verdict), removed)| {
                json!({
                    "path": path.to_string_lossy(),
                    "key": key_of(path),
                    "ok": verdict.is_ok(),
                    "error": verdict.as_ref().err(),
                    "removed": matches!(removed, Some(Ok(true))),
                })
            });
        json_text(&Json::Array(list.collect()))
    } else {
        let mut out = String::new();
        for ((path, verdict), removed) in verdicts.iter().zip(&removed) {
            let fate = match removed {
                Some(Ok(true)) => "; removed (the next load rebuilds it)".to_owned(),
                Some(Ok(false)) => "; kept: a good entry took its place meanwhile".to_owned(),
                Some(Err(e)) => format!("; could not be removed: {}", escape(e)),
                None => String::new(),
            };
            let line = match verdict {
                Ok(()) => format!("ok   {}\n", file_name(path)),
                Err(e) => format!("BAD  {}: {}{fate}\n", file_name(path), escape(e)),
            };
            out.push_str(&line);
        }
        out.push_str(&format!(
            "{}: {} ok, {} bad, in {}\n",
            plural(verdicts.len(), "entry", "entries"),
            verdicts.len() - bad.len(),
            bad.len(),
            dir_of(&cache)
        ));
        out
    };
    emit(&out)?;
    if bad.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = bad
        .iter()
        .map(|(p, e)| format!("{} ({e})", p.display()))
        .collect();
    Err(CliError::msg(format!(
        "{} of {} cache entries are bad: {}",
        bad.len(),
        verdicts.len(),
        named.join("; ")
    )))
}

/// What `prune` or `clear` did; exit status 1 if a file could not be
/// removed.
fn print_pruned(cache: &Cache, r: &PruneReport, max_size: u64, json: bool) -> CliResult {
    let out = if json {
        let removed = r.removed.iter().map(|(path, bytes, why)| {
            json!({"path": path.to_string_lossy(), "bytes": bytes, "reason": why})
        });
        let failed = r
            .failed
            .iter()
            .map(|(path, why)| json!({"path": path.to_string_lossy(), "error": why}));
        json_text(&json!({
            "removed": removed.collect::<Vec<_>>(),
            "kept": r.kept,
            "kept_bytes": r.kept_bytes,
            "max_size": max_size,
            "failed": failed.collect::<Vec<_>>(),
        }))
    } else {
        let rows: Vec<Vec<String>> = r
            .removed
            .iter()
            .map(|(path, bytes, why)| {
                vec![
                    "removed".into(),
                    file_name(path),
                    bytes.to_string(),
                    escape(why).into_owned(),
                ]
            })
            .collect();
        let mut out = table(&right_align(rows, &[2]), usize::MAX, "");
        let freed: u64 = r.removed.iter().map(|(_, b, _)| b).sum();
        out.push_str(&format!(
            "total: removed {}, {}; kept {}, {} (at most {}), in {}\n",
            plural(r.removed.len(), "file", "files"),
            human_bytes(freed),
            plural(r.kept, "entry", "entries"),
            human_bytes(r.kept_bytes),
            human_bytes(max_size),
            dir_of(cache),
        ));
        out
    };
    emit(&out)?;
    if r.failed.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = r
        .failed
        .iter()
        .map(|(p, e)| format!("{} ({e})", p.display()))
        .collect();
    Err(CliError::msg(format!(
        "{} could not be removed: {}",
        plural(r.failed.len(), "file", "files"),
        named.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn age_reads_in_the_largest_whole_unit() {
        let ago = |s| age(SystemTime::now() - Duration::from_secs(s));
        assert_eq!(ago(5), "5s ago");
        assert_eq!(ago(5 * 60 + 59), "5m ago");
        assert_eq!(ago(3 * 3600), "3h ago");
        assert_eq!(ago(2 * 86400 + 5), "2d ago");
        assert_eq!(age(SystemTime::now() + Duration::from_secs(60)), "just now");
    }

    #[test]
    fn right_align_pads_only_the_columns_named() {
        let rows = vec![
            vec!["a".to_string(), "1".to_string()],
            vec!["bb".to_string(), "100".to_string()],
        ];
        let rows = right_align(rows, &[1]);
        assert_eq!(rows[0], ["a", "  1"]);
        assert_eq!(rows[1], ["bb", "100"]);
    }
}
