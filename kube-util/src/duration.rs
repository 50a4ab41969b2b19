//! Durations as Kubernetes writes them: Go's `time.ParseDuration` and
//! `Duration.String()` (flags, config files, event messages: `1m30s`,
//! `500ms`, `5m0s`), and apimachinery's `HumanDuration`, the AGE column
//! of kubectl (`5m3s`, `3h1m`, `2d`).

use std::time::Duration;

/// Why text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not of the form `[-+]?([0-9]*(\.[0-9]*)?unit)+`.
    #[error("invalid duration {0:?}: expected for example 10s, 1m30s, 500ms or 1h")]
    Invalid(String),
    /// A number without a unit (only `0` may go without).
    #[error("invalid duration {0:?}: missing unit (ns, us, ms, s, m or h)")]
    MissingUnit(String),
    /// A unit Go does not know.
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit { input: String, unit: String },
    /// Below zero: nothing here waits for a negative time.
    #[error("invalid duration {0:?}: must not be negative")]
    Negative(String),
    /// Past what a duration holds.
    #[error("invalid duration {0:?}: too large")]
    Overflow(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

const NANOS_PER_SEC: u128 = 1_000_000_000;

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        // Go takes both the micro sign (U+00B5) and the Greek mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Go's `time.ParseDuration`: `1h2m3.5s`, `500ms`, `1.5h`, `+10s`, `0`.
/// Fractions below a nanosecond are truncated, as Go does.
///
/// # Errors
/// Text that Go would refuse, and negative durations (which Go accepts
/// but no setting here can use).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let input = s;
    let invalid = || Error::Invalid(input.to_string());
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let overflow = || Error::Overflow(input.to_string());
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = |t: &str| t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let int_len = digits(rest);
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => {
                let n = digits(f);
                (Some(&f[..n]), &f[n..])
            }
            None => (None, after),
        };
        if int.is_empty() && frac.is_none_or(str::is_empty) {
            return Err(invalid());
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(Error::MissingUnit(input.to_string()));
        }
        let scale = unit_nanos(unit).ok_or_else(|| Error::UnknownUnit {
            input: input.to_string(),
            unit: unit.to_string(),
        })?;
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| overflow())?
        };
        let mut nanos = whole.checked_mul(scale).ok_or_else(overflow)?;
        if let Some(f) = frac {
            // Enough digits to reach below a nanosecond of an hour.
            let f = &f[..f.len().min(20)];
            if !f.is_empty() {
                let num: u128 = f.parse().map_err(|_| invalid())?;
                let den = 10u128.pow(f.len() as u32);
                nanos = nanos.checked_add(num * scale / den).ok_or_else(overflow)?;
            }
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        rest = next;
    }
    if negative && total > 0 {
        return Err(Error::Negative(input.to_string()));
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| overflow())?;
    Ok(Duration::new(secs, (total % NANOS_PER_SEC) as u32))
}

/// [`parse_duration`], but a bare integer is seconds: what the config
/// files and flags here have always accepted (`--node-monitor-period=5`).
///
/// # Errors
/// As [`parse_duration`].
pub fn parse_duration_or_seconds(s: &str) -> Result<Duration> {
    let t = s.trim();
    match t.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => parse_duration(t),
    }
}

/// `v / scale` with its fraction, trailing zeros trimmed: `1.5`, `2`.
fn decimal(v: u128, scale: u128) -> String {
    let (int, frac) = (v / scale, v % scale);
    if frac == 0 {
        return int.to_string();
    }
    let width = scale.ilog10() as usize;
    let f = format!("{frac:0width$}");
    format!("{int}.{}", f.trim_end_matches('0'))
}

/// Go's `Duration.String()`: `0s`, `1.5µs`, `523ms`, `10s`, `1m20s`,
/// `5m0s`, `2h0m1.5s`.
pub fn format_go(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < NANOS_PER_SEC {
        let (unit, scale) = match ns {
            0..1_000 => ("ns", 1),
            1_000..1_000_000 => ("\u{b5}s", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", decimal(ns, scale));
    }
    let secs = ns / NANOS_PER_SEC;
    let (h, m) = (secs / 3600, (secs % 3600) / 60);
    let s = decimal(
        (secs % 60) * NANOS_PER_SEC + ns % NANOS_PER_SEC,
        NANOS_PER_SEC,
    );
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// [`format_go`] of `d` truncated to milliseconds, as the kubelet prints
/// durations in event messages (`1.234s`, not `1.234567891s`).
pub fn format_go_millis(d: Duration) -> String {
    format_go(Duration::from_millis(d.as_millis() as u64))
}

/// apimachinery's `duration.HumanDuration` of `secs` seconds: kubectl's
/// AGE column. Precise while small, coarser as it grows: `59s`, `2m5s`,
/// `15m`, `3h1m`, `20h`, `3d4h`, `30d`, `2y45d`, `10y`. A time slightly in
/// the future (clock skew) reads `0s`; further, `<invalid>`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let with = |big: i64, big_unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit}{small}{small_unit}")
        }
    };
    let minutes = secs / 60;
    if minutes < 10 {
        return with(minutes, "m", secs % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return with(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return with(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return with(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_like_go() {
        let cases = [
            ("1m30s", ms(90_000)),
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("+10s", ms(10_000)),
            ("500ms", ms(500)),
            ("1.5h", ms(5_400_000)),
            ("1h2m3.5s", ms(3_723_500)),
            (".5s", ms(500)),
            ("1.s", ms(1000)),
            ("100us", Duration::from_micros(100)),
            ("100\u{b5}s", Duration::from_micros(100)),
            ("100\u{3bc}s", Duration::from_micros(100)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000019s", Duration::new(1, 1)),
            ("0s", Duration::ZERO),
            ("3m0s", ms(180_000)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_duration(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        for s in ["", "+", "-", ".", "s", "1.2.3s", "1m 2s", " 1s"] {
            assert!(parse_duration(s).is_err(), "{s:?}");
        }
        assert_eq!(parse_duration("10"), Err(Error::MissingUnit("10".into())));
        assert_eq!(parse_duration("1m2"), Err(Error::MissingUnit("1m2".into())));
        assert_eq!(
            parse_duration("5d"),
            Err(Error::UnknownUnit {
                input: "5d".into(),
                unit: "d".into()
            })
        );
        assert_eq!(parse_duration("-1s"), Err(Error::Negative("-1s".into())));
        assert!(matches!(
            parse_duration("99999999999999999999999999999999999999999h"),
            Err(Error::Overflow(_))
        ));
    }

    #[test]
    fn bare_seconds_for_settings() {
        assert_eq!(parse_duration_or_seconds("40"), Ok(ms(40_000)));
        assert_eq!(parse_duration_or_seconds(" 5m "), Ok(ms(300_000)));
        assert!(parse_duration_or_seconds("5x").is_err());
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(100), "100ns"),
            (Duration::from_nanos(1500), "1.5\u{b5}s"),
            (ms(523), "523ms"),
            (ms(1), "1ms"),
            (ms(10_000), "10s"),
            (ms(80_000), "1m20s"),
            (ms(300_000), "5m0s"),
            (ms(1_234), "1.234s"),
            (ms(62_500), "1m2.5s"),
            (ms(7_201_500), "2h0m1.5s"),
            (Duration::from_secs(72 * 3600 + 180), "72h3m0s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go(d), want, "{d:?}");
            assert_eq!(parse_duration(want), Ok(d), "round trip {want}");
        }
        assert_eq!(format_go_millis(Duration::new(1, 234_567_891)), "1.234s");
        assert_eq!(format_go_millis(Duration::from_micros(999)), "0s");
    }

    #[test]
    fn human_ages() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (125, "2m5s"),
            (180, "3m"),
            (15 * 60 + 3, "15m"),
            (3 * 3600 + 60, "3h1m"),
            (5 * 3600, "5h"),
            (20 * 3600 + 59 * 60, "20h"),
            (3 * 86400, "3d"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (30 * 86400, "30d"),
            ((2 * 365 + 45) * 86400, "2y45d"),
            (10 * 365 * 86400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }
}
