//! Parsers for the units users type: sizes, durations, bandwidths, probabilities.

use std::time::Duration;

/// Splits `"16MiB"` into `("16", "MiB")`.
fn split_number(s: &str) -> (&str, &str) {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_' || c == 'e' || c == '-'))
        .unwrap_or(s.len());
    // `e` is an exponent only when followed by a digit or sign (`1e-4`), not in `1eB`.
    (s[..end].trim(), s[end..].trim())
}

fn number(s: &str, what: &str) -> Result<f64, String> {
    let n: f64 = s
        .replace('_', "")
        .parse()
        .map_err(|_| format!("{what}: `{s}` is not a number"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{what}: `{s}` must be a non-negative number"));
    }
    Ok(n)
}

/// The largest size accepted: 2^63 - 1 bytes (a buffer's length must fit an `isize`).
pub(crate) const MAX_SIZE: u64 = i64::MAX as u64;

/// A byte count with an optional binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal (`kB`, `MB`,
/// `GB`) suffix: `16MiB`, `4KiB`, `1048576`, `1.5MiB`. Parsed exactly (no floating point): a
/// value that is not a whole number of bytes, or is above [`MAX_SIZE`], is refused.
pub(crate) fn size(s: &str) -> Result<u64, String> {
    let (n, unit) = split_number(s);
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "size `{s}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, kB, MB, GB)"
            ));
        }
    };
    match exact_bytes(n, mult) {
        Ok(v) if v <= u128::from(MAX_SIZE) => Ok(v as u64),
        Ok(_) | Err(Inexact::TooLarge) => Err(format!(
            "size `{s}` is too large (at most {MAX_SIZE} B, 2^63 - 1)"
        )),
        Err(Inexact::Fraction) => Err(format!("size `{s}` is not a whole number of bytes")),
        Err(Inexact::Negative) => Err(format!("size: `{n}` must be a non-negative number")),
        Err(Inexact::NotNumber) => Err(format!("size: `{n}` is not a number")),
        Err(Inexact::TooManyDigits) => Err(format!("size `{s}` has too many digits")),
    }
}

/// Why a decimal is not an exact byte count.
#[derive(Debug, PartialEq, Eq)]
enum Inexact {
    NotNumber,
    Negative,
    Fraction,
    TooLarge,
    TooManyDigits,
}

/// Significant digits [`exact_bytes`] keeps: 10^25 times a unit of at most 2^40 fits a `u128`.
const MAX_DIGITS: usize = 25;

/// `n` (digits and `_`, an optional `.` fraction, an optional `e` exponent) times `mult`,
/// exactly, in integer arithmetic.
fn exact_bytes(n: &str, mult: u64) -> Result<u128, Inexact> {
    let n = n.replace('_', "");
    if n.starts_with('-') {
        return Err(Inexact::Negative);
    }
    let (mantissa, exp) = match n.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().map_err(|_| Inexact::NotNumber)?),
        None => (n.as_str(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |d: &str| d.bytes().all(|c| c.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return Err(Inexact::NotNumber);
    }
    // value = significand * 10^scale, the significand without leading or trailing zeros.
    let all = format!("{int}{frac}");
    let all = all.trim_start_matches('0');
    let significand = all.trim_end_matches('0');
    if significand.is_empty() {
        return Ok(0);
    }
    let scale = i64::from(exp) - frac.len() as i64 + (all.len() - significand.len()) as i64;
    if significand.len() > MAX_DIGITS {
        return Err(if scale >= 0 {
            Inexact::TooLarge
        } else {
            Inexact::TooManyDigits
        });
    }
    let m: u128 = significand.parse().map_err(|_| Inexact::NotNumber)?;
    let m = m * u128::from(mult); // < 10^25 * 2^40 < 2^128
    if scale >= 0 {
        let scale = u32::try_from(scale).map_err(|_| Inexact::TooLarge)?;
        return 10u128
            .checked_pow(scale)
            .and_then(|p| m.checked_mul(p))
            .ok_or(Inexact::TooLarge);
    }
    // A non-zero `m` below 10^k is not a multiple of it: 10^39 > 2^128 covers every `m`.
    let p = u32::try_from(-scale)
        .ok()
        .and_then(|k| 10u128.checked_pow(k))
        .ok_or(Inexact::Fraction)?;
    if m.is_multiple_of(p) {
        Ok(m / p)
    } else {
        Err(Inexact::Fraction)
    }
}

/// A duration: `500ns`, `1.5us`, `20µs`, `3ms`, `1s`.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = split_number(s);
    let ns_per: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "" => return Err(format!("duration `{s}` needs a unit (ns, us, ms, s)")),
        other => return Err(format!("duration `{s}`: unknown unit `{other}`")),
    };
    let ns = number(n, "duration")? * ns_per;
    if ns > 1e18 {
        return Err(format!("duration `{s}` is too long"));
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

/// A duration above zero (a deadline of zero would expire at once).
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        Duration::ZERO => Err(format!("duration `{s}` must be above zero")),
        d => Ok(d),
    }
}

/// A bandwidth in bytes per second: `100Gbps` (bits), `12.5GB/s` (bytes); a bare number is
/// Gbit/s.
pub(crate) fn bandwidth(s: &str) -> Result<u64, String> {
    let (n, unit) = split_number(s);
    let bytes_per: f64 = match unit {
        "" | "G" | "Gbps" | "Gbit/s" | "Gb/s" => 1e9 / 8.0,
        "Mbps" | "Mbit/s" | "Mb/s" => 1e6 / 8.0,
        "Tbps" | "Tbit/s" | "Tb/s" => 1e12 / 8.0,
        "GB/s" | "GBps" => 1e9,
        "MB/s" | "MBps" => 1e6,
        other => {
            return Err(format!(
                "bandwidth `{s}`: unknown unit `{other}` (use Gbps, Mbps, Tbps, GB/s, MB/s)"
            ));
        }
    };
    let v = (number(n, "bandwidth")? * bytes_per).round();
    if !(1.0..=1e15).contains(&v) {
        return Err(format!("bandwidth `{s}` is out of range"));
    }
    Ok(v as u64)
}

/// A probability in `[0, 1]`: `1e-4`, `0.01`.
pub(crate) fn probability(s: &str) -> Result<f64, String> {
    let p = number(s.trim(), "probability")?;
    if p > 1.0 {
        return Err(format!("probability `{s}` must be at most 1"));
    }
    Ok(p)
}

/// A byte count for people: `0 B`, `512 B`, `64 KiB`, `16.5 MiB`.
pub(crate) fn human(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size("16MiB"), Ok(16 << 20));
        assert_eq!(size("4KiB"), Ok(4096));
        assert_eq!(size("1.5 KiB"), Ok(1536));
        assert_eq!(size("100"), Ok(100));
        assert_eq!(size("2GiB"), Ok(2 << 30));
        assert!(size("12XB").is_err());
        assert!(size("MiB").is_err());
        assert!(size("-1KiB").is_err());
        assert!(size("0.3B").is_err());
    }

    #[test]
    fn sizes_are_exact_integers() {
        // Through f64 this became ...992.
        assert_eq!(size("9007199254740993"), Ok(9_007_199_254_740_993));
        assert_eq!(size("9_007_199_254_740_993 B"), Ok(9_007_199_254_740_993));
        assert_eq!(size("9223372036854775807"), Ok(i64::MAX as u64));
        for big in [
            "9223372036854775808",
            "18446744073709551616",
            "99999999999999999999999999999999999999999",
            "8388608TiB",
            "1e19",
            "1e400",
        ] {
            let e = size(big).expect_err(big);
            assert!(e.contains("too large"), "{big}: {e}");
        }
        assert_eq!(size("8388607TiB"), Ok(8_388_607 << 40));
        assert_eq!(size("1.5MiB"), Ok(3 << 19));
        assert_eq!(
            size("0.5B"),
            Err("size `0.5B` is not a whole number of bytes".into())
        );
        assert_eq!(size("1.001kB"), Ok(1001));
        assert_eq!(size("1.0001kB").map_err(|e| e.contains("whole")), Err(true));
        assert_eq!(size("1e3"), Ok(1000));
        assert_eq!(size("2.5e1"), Ok(25));
        assert_eq!(size("0.000"), Ok(0));
        assert_eq!(size("100.000"), Ok(100));
        assert_eq!(size(".5KiB"), Ok(512));
        for bad in ["", ".", "1.2.3", "1e", "1eB", "_", "1-2", "x"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn positive_durations() {
        assert!(positive_duration("0ns").is_err());
        assert!(positive_duration("0.1ns").is_err());
        assert_eq!(positive_duration("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human((16 << 20) + (512 << 10)), "16.5 MiB");
    }

    #[test]
    fn durations() {
        assert_eq!(duration("500ns"), Ok(Duration::from_nanos(500)));
        assert_eq!(duration("1.5us"), Ok(Duration::from_nanos(1500)));
        assert_eq!(duration("3ms"), Ok(Duration::from_millis(3)));
        assert!(duration("3").is_err());
        assert!(duration("3h").is_err());
    }

    #[test]
    fn bandwidths_and_probabilities() {
        assert_eq!(bandwidth("100Gbps"), Ok(12_500_000_000));
        assert_eq!(bandwidth("12.5GB/s"), Ok(12_500_000_000));
        assert_eq!(bandwidth("400"), Ok(50_000_000_000));
        assert!(bandwidth("0").is_err());
        assert_eq!(probability("1e-4"), Ok(1e-4));
        assert!(probability("2").is_err());
        assert!(probability("x").is_err());
    }
}
