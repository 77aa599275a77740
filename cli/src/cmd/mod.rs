//! The `weightmap` command line: argument parsing, dispatch, errors, and the
//! helpers the subcommands share.

mod baseline;
mod bench;
mod dequant;
mod gen;
mod inspect;
mod load;
mod model_cache;
mod proc_status;
mod progress;
mod sigbus;
mod signals;
mod touch;
mod transform_cache;
mod validate;

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use weightmap::{Format, LoadMode};

/// Map GGUF and safetensors model weights read-only: inspect, validate,
/// load, benchmark, and generate synthetic models.
///
/// Exit status: 0 on success, 1 when the input is invalid or the operation
/// fails (with one `error: ...` line on stderr), 2 on a usage error.
#[derive(Debug, Parser)]
#[command(name = "weightmap", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a file's header: format, alignment, metadata and tensor table.
    Inspect(inspect::Args),
    /// Check a file as the loader does (header, tensor table, bounds), without loading it;
    /// with --data, also check every tensor's data for NaN and infinity.
    Validate(validate::Args),
    /// Dequantize a tensor, or some of its rows, to little-endian f32.
    Dequant(dequant::Args),
    /// Load a file and report what the loader did and the memory it used.
    #[command(long_about = load::LONG_ABOUT)]
    Load(load::Args),
    /// Compare the mapped and stream load paths, each in fresh processes.
    #[command(long_about = bench::LONG_ABOUT)]
    Bench(bench::Args),
    /// Write a deterministic synthetic llama-shaped model.
    Gen(gen::Args),
    /// List, verify, prune or clear the cache of transformed tensors.
    #[command(long_about = transform_cache::LONG_ABOUT)]
    Cache(transform_cache::Args),
    /// Read a whole file into memory with one read (bench's baseline).
    #[command(hide = true, name = "read-baseline")]
    ReadBaseline(baseline::Args),
}

/// Parse the arguments, run the subcommand, and turn the outcome into an
/// exit status.
pub fn main() -> ExitCode {
    // Usage errors exit 2 from here (clap's default); --help and --version 0.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Dequant(a) => dequant::run(a),
        Command::Load(a) => load::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Gen(a) => gen::run(a),
        Command::Cache(a) => transform_cache::run(a),
        Command::ReadBaseline(a) => baseline::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`weightmap inspect big.gguf | head`): not a failure.
        Err(CliError::BrokenPipe) => ExitCode::SUCCESS,
        Err(CliError::Msg(m)) => {
            // One line, and nothing from the file (a tensor name, a key)
            // can drive the terminal.
            let _ = writeln!(io::stderr(), "error: {}", escape(&m));
            ExitCode::FAILURE
        }
    }
}

/// Why a subcommand failed.
#[derive(Debug)]
pub enum CliError {
    /// Printed as `error: <message>`, exit status 1.
    Msg(String),
    /// stdout was closed by its reader.
    BrokenPipe,
}

impl CliError {
    /// An error with this message.
    pub fn msg(m: impl fmt::Display) -> CliError {
        CliError::Msg(m.to_string())
    }
}

impl From<weightmap::Error> for CliError {
    fn from(e: weightmap::Error) -> Self {
        CliError::Msg(e.to_string())
    }
}

/// The subcommands' result.
pub type CliResult<T = ()> = Result<T, CliError>;

/// Write `text` to stdout.
pub fn emit(text: &str) -> CliResult {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => CliError::BrokenPipe,
            _ => CliError::msg(format!("writing to stdout: {e}")),
        })
}

/// `s` safe to print on a terminal: control characters (C0 including
/// newline, DEL, C1) and the bidirectional overrides and isolates, which
/// could move the cursor, retitle the window (`ESC ]0;…BEL`) or reorder
/// text, are shown as escapes: `\n`, `\r`, `\t`, `\0`, `\e`, else `\u{..}`.
/// A backslash is doubled only when something is escaped, so plain names
/// print unchanged. JSON output needs none of this: serde_json escapes.
pub fn escape(s: &str) -> Cow<'_, str> {
    let bad =
        |c: char| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            '\u{1b}' => out.push_str("\\e"),
            '\\' => out.push_str("\\\\"),
            c if bad(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `v` rounded to 3 decimals as JSON: `null` when not finite.
pub fn round3(v: f64) -> serde_json::Value {
    ((v * 1e3).round() / 1e3).into()
}

/// `v` as indented JSON text (`serde_json::to_string_pretty`), with a newline.
pub fn json_text(v: &serde_json::Value) -> String {
    format!("{v:#}\n")
}

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Map the file and view tensors in place.
    Mmap,
    /// Read the tensors into one owned buffer.
    Stream,
}

impl From<ModeArg> for LoadMode {
    fn from(m: ModeArg) -> LoadMode {
        match m {
            ModeArg::Mmap => LoadMode::Mmap,
            ModeArg::Stream => LoadMode::Stream,
        }
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// GGUF v3.
    Gguf,
    /// safetensors.
    Safetensors,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Gguf => Format::Gguf,
            FormatArg::Safetensors => Format::Safetensors,
        }
    }
}

/// [`weightmap::HugePages`] as JSON: `mapped_bytes`,
/// `mapped_resident_bytes`, `mapped_huge_bytes`,
/// `mapped_huge_capacity_bytes`, `mapped_small_bytes`, `owned_bytes`,
/// `owned_huge_bytes` (`null` where the platform cannot tell).
pub fn huge_pages_json(h: &weightmap::HugePages) -> serde_json::Value {
    serde_json::json!({
        "mapped_bytes": h.mapped_bytes,
        "mapped_resident_bytes": h.mapped_resident,
        "mapped_huge_bytes": h.mapped_huge,
        "mapped_huge_capacity_bytes": h.mapped_huge_capacity,
        "mapped_small_bytes": h.mapped_small(),
        "owned_bytes": h.owned_bytes,
        "owned_huge_bytes": h.owned_huge,
    })
}

/// [`weightmap::HugePages`] for people: `mapped 240.0 of 241.4 MiB, owned
/// none`, or "not available" where the platform cannot tell.
pub fn huge_pages_text(h: &weightmap::HugePages) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let part = |what: &str, bytes: u64, huge: Option<u64>| match (bytes, huge) {
        (0, _) => format!("{what} none"),
        (_, None) => format!("{what} not available"),
        (b, Some(n)) => format!("{what} {:.1} of {:.1} MiB", mib(n), mib(b)),
    };
    format!(
        "{}, {}",
        part("mapped", h.mapped_bytes, h.mapped_huge),
        part("owned", h.owned_bytes, h.owned_huge)
    )
}

/// Whether the mapped tensors sit in small page-cache folios, for people:
/// what [`weightmap::HugePages::mapped_small`] counts, and what
/// `--reread-small-folios` re-read (`reread`, from the prefetch).
pub fn small_folios_text(h: &weightmap::HugePages, reread: Option<u64>) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let reread = match reread {
        Some(n) if n > 0 => format!("; {:.1} MiB re-read", mib(n)),
        _ => String::new(),
    };
    match h.mapped_small() {
        None => "not available".into(),
        Some(n) if n >= (h.mapped_huge_capacity / 4).max(2 << 20) => format!(
            "{:.1} MiB of the mapped tensors in base pages: the page cache held them in \
             small folios (another process filled it); --reread-small-folios re-reads them{reread}",
            mib(n)
        ),
        Some(n) => format!("{:.1} MiB{reread}", mib(n)),
    }
}

/// Format a byte count for people: `536870912 (512.0 MiB)`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{n} ({v:.1} {})", UNITS[u])
    }
}

/// Lay `rows` out in columns: the first `left` columns left-aligned, the
/// rest right-aligned, two spaces apart, each line indented by `indent`.
pub fn table(rows: &[Vec<String>], left: usize, indent: &str) -> String {
    let mut out = Vec::new();
    write_table(&mut out, || rows.iter(), left, indent).expect("writing to a Vec");
    String::from_utf8(out).expect("the cells are strings")
}

/// Write the rows `rows()` yields as [`table`] lays them out, without
/// holding them: one pass for the column widths, one for the lines.
pub fn write_table<R, C, I>(
    out: &mut dyn Write,
    rows: impl Fn() -> I,
    left: usize,
    indent: &str,
) -> io::Result<()>
where
    I: Iterator<Item = R>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    let mut width: Vec<usize> = Vec::new();
    for r in rows() {
        let r = r.as_ref();
        if width.len() < r.len() {
            width.resize(r.len(), 0);
        }
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.as_ref().chars().count());
        }
    }
    let mut line = String::new();
    for r in rows() {
        let r = r.as_ref();
        line.clear();
        line.push_str(indent);
        for (i, c) in r.iter().enumerate() {
            let c = c.as_ref();
            if i > 0 {
                line.push_str("  ");
            }
            let pad = width[i] - c.chars().count();
            if i < left {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.extend(std::iter::repeat(' ').take(pad));
                }
            } else {
                line.extend(std::iter::repeat(' ').take(pad));
                line.push_str(c);
            }
        }
        out.write_all(line.trim_end().as_bytes())?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_keeps_order_exact_integers_and_nulls_non_finite() {
        let v = serde_json::json!({"z": u64::MAX, "a": round3(f64::NAN), "m": round3(0.12345)});
        let text = json_text(&v);
        assert!(text.find("\"z\"").unwrap() < text.find("\"a\"").unwrap());
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["z"].as_u64(), Some(u64::MAX));
        assert!(back["a"].is_null());
        assert_eq!(back["m"].as_f64(), Some(0.123));
    }

    #[test]
    fn escape_neutralises_terminal_controls() {
        assert_eq!(escape("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(escape("a\\b"), "a\\b", "plain text is unchanged");
        assert_eq!(
            escape("\u{1b}]0;pwned\u{7}x\0\n\\"),
            "\\e]0;pwned\\u{7}x\\0\\n\\\\"
        );
        assert_eq!(escape("\u{202e}abc\u{9b}"), "\\u{202e}abc\\u{9b}");
        assert!(!escape("\u{1b}[2J\u{7f}").chars().any(char::is_control));
    }

    #[test]
    fn table_aligns() {
        let t = table(
            &[
                vec!["a".into(), "1".into()],
                vec!["long".into(), "100".into()],
            ],
            1,
            "",
        );
        assert_eq!(t, "a       1\nlong  100\n");
    }
}
