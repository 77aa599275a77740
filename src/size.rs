//! Byte counts written as text: the one syntax of every size the library
//! reads from the environment, and of the command's size options.

/// The syntax of the sizes the library reads from text
/// (`$WEIGHTMAP_CACHE_MAX_SIZE`, `$WEIGHTMAP_BUDGET`): a byte count, digits then optionally K/M/G/T (binary),
/// KiB/MiB/GiB/TiB (binary) or KB/MB/GB/TB (decimal), any case; `B` alone
/// is bytes. Public so that a tool's own size options take exactly what the
/// variables take: the command's (`cache prune --max-size`, whose default
/// is the variable, and its other sizes alike) do.
///
/// ```
/// assert_eq!(weightmap::cache::parse_size("20G"), Ok(20 << 30));
/// assert_eq!(weightmap::cache::parse_size("1MB"), Ok(1_000_000));
/// assert!(weightmap::cache::parse_size("lots").is_err());
/// ```
///
/// # Errors
/// A message naming what is wrong with `s`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count (e.g. 4096, 64M, 1GiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown size unit '{u}' (use K, M, G, T, KiB, MB, ...)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2kb"), Ok(2000));
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
