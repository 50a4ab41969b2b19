//! Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1e3`) as exact
//! integers: CPU in millicores, everything else in base units, both
//! rounded up as upstream's `Quantity.MilliValue()` / `Value()` do.
//!
//! Exact integer arithmetic matters: the scheduler's fit check compares
//! sums of requests against allocatable, and a float rounding error would
//! turn "exactly full" into "Insufficient memory"; QoS compares requests
//! with limits for equality.

/// Why text is not a usable quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No digits, two decimal points, or nothing before the suffix.
    #[error("invalid quantity {0:?}: expected a number such as 100m, 1.5, 128Mi or 1e3")]
    Number(String),
    /// A suffix that is none of n u m k M G T P E Ki..Ei or an exponent.
    #[error(
        "invalid quantity {0:?}: unknown suffix (use n, u, m, k, M, G, T, P, E, Ki..Ei or e<N>)"
    )]
    Suffix(String),
    /// The value does not fit in 64 bits in the unit asked for.
    #[error("quantity {0:?} is too large")]
    Overflow(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The value of `s` in units of 10^`scale` (-3 for millis, 0 for base
/// units), rounded away from zero, as a 128-bit integer so that callers
/// can compare quantities beyond i64 millis (`8Ei` of memory).
pub fn scaled(s: &str, scale: i32) -> Result<i128> {
    let text = s;
    let s = s.trim();
    let bad = || Error::Number(text.to_string());
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        Some(_) => (false, s),
        None => return Err(bad()),
    };
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(bad());
    }
    // mantissa * 10^exp10 * 2^exp2
    let mut mantissa: i128 = 0;
    let mut exp10: i32 = 0;
    let mut after_point = false;
    for c in number.bytes() {
        if c == b'.' {
            after_point = true;
            continue;
        }
        // Digits past 30 significant ones cannot change a 64-bit result
        // except through rounding up, which the remainder check keeps.
        if mantissa > 10i128.pow(30) {
            if !after_point {
                exp10 += 1;
            } else if c != b'0' {
                mantissa += 1;
            }
            continue;
        }
        mantissa = mantissa * 10 + i128::from(c - b'0');
        if after_point {
            exp10 -= 1;
        }
    }
    let (e10, exp2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e if e.starts_with(['e', 'E']) && e.len() > 1 => (
            e[1..]
                .parse::<i32>()
                .map_err(|_| Error::Suffix(text.to_string()))?,
            0,
        ),
        _ => return Err(Error::Suffix(text.to_string())),
    };
    let overflow = || Error::Overflow(text.to_string());
    let exp10 = exp10
        .checked_add(e10)
        .and_then(|e| e.checked_sub(scale))
        .ok_or_else(overflow)?;
    let mut value = mantissa.checked_mul(1i128 << exp2).ok_or_else(overflow)?;
    if exp10 >= 0 {
        let mul = u32::try_from(exp10)
            .ok()
            .and_then(|e| 10i128.checked_pow(e))
            .ok_or_else(overflow)?;
        value = value.checked_mul(mul).ok_or_else(overflow)?;
    } else {
        let div = u32::try_from(-exp10)
            .ok()
            .and_then(|e| 10i128.checked_pow(e));
        value = match div {
            // Round away from zero like upstream (ceil of the magnitude).
            Some(d) => value / d + i128::from(value % d != 0),
            None => i128::from(value != 0),
        };
    }
    Ok(if negative { -value } else { value })
}

fn to_i64(s: &str, v: i128) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow(s.to_string()))
}

/// Millicores (or milli-units) of `s`, rounded up: `"100m"` -> 100,
/// `"1.5"` -> 1500.
///
/// # Errors
/// Text that is not a quantity, or a value past i64 millis.
pub fn milli_value(s: &str) -> Result<i64> {
    to_i64(s, scaled(s, -3)?)
}

/// Base units of `s`, rounded up: `"128Mi"` -> 134217728, `"1k"` -> 1000,
/// `"100m"` -> 1.
///
/// # Errors
/// Text that is not a quantity, or a value past i64.
pub fn value(s: &str) -> Result<i64> {
    to_i64(s, scaled(s, 0)?)
}

/// `a` against `b` by value (`1Gi` equals `1024Mi`), at the finest scale
/// (nano, milli, then units) both fit in; None when either is not a
/// quantity at any.
pub fn compare(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    [-9, -3, 0]
        .into_iter()
        .find_map(|scale| Some(scaled(a, scale).ok()?.cmp(&scaled(b, scale).ok()?)))
}

/// `bytes` as upstream prints a `resource.NewQuantity(n, BinarySI)`: the
/// largest binary suffix that divides it exactly (`52Mi`, `1207Ki`),
/// else the plain number.
pub fn binary_si(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_by_value_at_the_finest_scale_that_fits() {
        use std::cmp::Ordering::*;
        assert_eq!(compare("1Gi", "1024Mi"), Some(Equal));
        assert_eq!(compare("250m", "0.25"), Some(Equal));
        assert_eq!(compare("-1", "0"), Some(Less));
        assert_eq!(compare("1n", "0"), Some(Greater));
        // Too big for nano or milli units, still compared in units.
        assert_eq!(compare("1E20", "0"), Some(Greater));
        assert_eq!(compare("lots", "0"), None);
    }

    #[test]
    fn binary_si_as_upstream_prints_it() {
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(100 * 1024 * 1024), "100Mi");
        assert_eq!(binary_si(1207 * 1024), "1207Ki");
        assert_eq!(binary_si(1_234_567), "1234567");
        assert_eq!(binary_si(1 << 30), "1Gi");
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(milli_value("100m"), Ok(100));
        assert_eq!(milli_value("1"), Ok(1000));
        assert_eq!(milli_value("1.5"), Ok(1500));
        assert_eq!(milli_value("0.1"), Ok(100));
        assert_eq!(milli_value("1e3"), Ok(1_000_000));
        assert_eq!(milli_value("1E3"), Ok(1_000_000));
        assert_eq!(milli_value("250000u"), Ok(250));
        assert_eq!(milli_value("+2"), Ok(2000));
        assert_eq!(milli_value("-100m"), Ok(-100));
        // Rounded up, as upstream's MilliValue.
        assert_eq!(milli_value("1n"), Ok(1));
        assert_eq!(milli_value("0.0001"), Ok(1));
        assert_eq!(milli_value("0"), Ok(0));
    }

    #[test]
    fn memory_forms() {
        assert_eq!(value("128Mi"), Ok(128 << 20));
        assert_eq!(value("1Gi"), Ok(1 << 30));
        assert_eq!(value("1G"), Ok(1_000_000_000));
        assert_eq!(value("1.5Gi"), Ok(3 << 29));
        assert_eq!(value("129e6"), Ok(129_000_000));
        assert_eq!(value("1e3"), Ok(1000));
        assert_eq!(value("123456"), Ok(123_456));
        assert_eq!(value("100m"), Ok(1));
        assert_eq!(value("0.1"), Ok(1));
        assert_eq!(value("110"), Ok(110));
        assert_eq!(value("1Ki"), Ok(1024));
        assert_eq!(value("1k"), Ok(1000));
    }

    #[test]
    fn overflow_is_an_error_but_wide_values_are_exact() {
        assert_eq!(value("8Ei"), Err(Error::Overflow("8Ei".into())));
        assert_eq!(scaled("8Ei", 0), Ok(8i128 << 60));
        assert_eq!(scaled("8Ei", -3), Ok((8i128 << 60) * 1000));
        assert!(matches!(value("1e400"), Err(Error::Overflow(_))));
    }

    #[test]
    fn rejects_garbage_with_the_right_error() {
        for s in ["", "abc", "1.2.3", ".", "e3", "-", " "] {
            assert_eq!(value(s), Err(Error::Number(s.into())), "{s:?}");
        }
        for s in ["1Qi", "1e", "1ex", "5 m", "1KiB"] {
            assert_eq!(value(s), Err(Error::Suffix(s.into())), "{s:?}");
        }
    }
}
