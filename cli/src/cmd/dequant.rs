//! `weightmap dequant FILE TENSOR [--rows A..B | --rows I,J,K] -o OUT`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::PathBuf;

use weightmap::{quant, LoadOptions, Weights};

use super::{emit, CliError, CliResult};

/// Arguments of `dequant`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF or safetensors file. It must not change while it is read.
    file: PathBuf,
    /// The tensor's name.
    tensor: String,
    /// Rows to write, a row being ne[0] elements: a half-open range `A..B`
    /// or a list `I,J,K` (in that order). Default: every row.
    #[arg(long, value_parser = parse_rows)]
    rows: Option<Rows>,
    /// Where to write the little-endian f32 values; `-` for stdout.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

/// `--rows`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rows {
    /// `A..B`: rows A to B-1.
    Range(Range<u64>),
    /// `I,J,K`: these rows, in this order.
    List(Vec<u64>),
}

fn parse_rows(s: &str) -> Result<Rows, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|_| format!("'{t}' is not a row number"))
    };
    if let Some((a, b)) = s.split_once("..") {
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("range {a}..{b} is reversed"));
        }
        return Ok(Rows::Range(a..b));
    }
    s.split(',')
        .map(num)
        .collect::<Result<_, _>>()
        .map(Rows::List)
}

pub fn run(a: &Args) -> CliResult {
    // SAFETY: the file must not change while `weights` lives. `--help`
    // states that requirement; the tensor is copied out before it is
    // dequantized and the weights are dropped when this returns.
    let weights = unsafe { Weights::load(&a.file, &LoadOptions::default())? };
    let t = weights.tensor(&a.tensor)?;
    let info = t.info();
    let ty = info.ty;
    if !ty.has_dequantize() {
        return Err(CliError::msg(format!(
            "tensor '{}': {ty} has no dequantization to f32",
            info.name
        )));
    }
    // A row is ne[0] elements; a 0-dimensional tensor is one row of one.
    let ne = info.ne();
    let ne0 = ne.first().copied().unwrap_or(1);
    let n_rows = info.n_elements().checked_div(ne0).unwrap_or(0);
    let row_bytes = ty.row_size(ne0).ok_or_else(|| {
        CliError::msg(format!(
            "tensor '{}': a row of {ne0} {ty} elements has no whole byte size",
            info.name
        ))
    })?;
    let rows: Vec<u64> = match &a.rows {
        None => (0..n_rows).collect(),
        Some(Rows::Range(r)) => {
            if r.end > n_rows {
                return Err(out_of_range(info.name, r.end - 1, n_rows));
            }
            r.clone().collect()
        }
        Some(Rows::List(l)) => {
            if let Some(&bad) = l.iter().find(|&&r| r >= n_rows) {
                return Err(out_of_range(info.name, bad, n_rows));
            }
            l.clone()
        }
    };

    let data = t.to_vec()?;
    let mut sink: Box<dyn Write> = if a.output.as_os_str() == "-" {
        Box::new(BufWriter::new(io::stdout().lock()))
    } else {
        let f = File::create(&a.output)
            .map_err(|e| CliError::msg(format!("create {}: {e}", a.output.display())))?;
        Box::new(BufWriter::new(f))
    };
    let write_err = |e: io::Error| match e.kind() {
        io::ErrorKind::BrokenPipe => CliError::BrokenPipe,
        _ => CliError::msg(format!("writing {}: {e}", a.output.display())),
    };
    let mut out_bytes = Vec::new();
    for &r in &rows {
        // r < n_rows, so the row lies within the tensor's bytes; the checked
        // arithmetic guards against a descriptor that says otherwise.
        let range = r
            .checked_mul(row_bytes)
            .and_then(|s| Some(s..s.checked_add(row_bytes)?))
            .and_then(|x| Some(usize::try_from(x.start).ok()?..usize::try_from(x.end).ok()?))
            .and_then(|x| data.get(x))
            .ok_or_else(|| {
                CliError::msg(format!(
                    "tensor '{}': row {r} is outside its data",
                    info.name
                ))
            })?;
        let values = quant::dequantize_to_vec(ty, range)?;
        out_bytes.clear();
        out_bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        sink.write_all(&out_bytes).map_err(write_err)?;
    }
    sink.flush().map_err(write_err)?;
    drop(sink);
    if a.output.as_os_str() != "-" {
        let n = rows.len() as u64;
        emit(&format!(
            "wrote {n} rows of {ne0} f32 ({} bytes) from tensor '{}' ({ty}) to {}\n",
            n.saturating_mul(ne0).saturating_mul(4),
            info.name,
            a.output.display()
        ))?;
    }
    Ok(())
}

fn out_of_range(tensor: &str, row: u64, n_rows: u64) -> CliError {
    CliError::msg(format!(
        "tensor '{tensor}': row {row} is out of range (it has {n_rows} rows, 0..{n_rows})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse() {
        assert_eq!(parse_rows("2..5"), Ok(Rows::Range(2..5)));
        assert_eq!(parse_rows("3..3"), Ok(Rows::Range(3..3)));
        assert_eq!(parse_rows("7"), Ok(Rows::List(vec![7])));
        assert_eq!(parse_rows("4,1, 4"), Ok(Rows::List(vec![4, 1, 4])));
        assert!(parse_rows("5..2").is_err());
        assert!(parse_rows("a..2").is_err());
        assert!(parse_rows("1,,2").is_err());
        assert!(parse_rows("-1").is_err());
        assert!(parse_rows("").is_err());
    }
}
