//! Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1e3`) as exact
//! integers: CPU in millicores, everything else in base units, both
//! rounded up as upstream's `Quantity.MilliValue()` / `Value()` do.
//!
//! Exact integer arithmetic matters here: the fit check compares sums of
//! requests against allocatable, and a float rounding error would turn
//! "exactly full" into "Insufficient memory".

/// The value of `s` in units of 10^`scale` (scale -3 for millis, 0 for
/// base units), rounded up; `None` for text that is not a quantity or
/// does not fit in an i64.
fn scaled(s: &str, scale: i32) -> Option<i64> {
    let s = s.trim();
    let (negative, s) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
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
        // Digits past 30 significant ones cannot change an i64 result
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
        e if e.starts_with(['e', 'E']) && e.len() > 1 => (e[1..].parse::<i32>().ok()?, 0),
        _ => return None,
    };
    let exp10 = exp10.checked_add(e10)?.checked_sub(scale)?;
    let mut value = mantissa.checked_mul(1i128 << exp2)?;
    if exp10 >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exp10).ok()?)?)?;
    } else {
        let div = 10i128.checked_pow(u32::try_from(-exp10).ok()?);
        value = match div {
            // Round away from zero like upstream (ceil of the magnitude).
            Some(d) => value / d + i128::from(value % d != 0),
            None => i128::from(value != 0),
        };
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// Millicores (or milli-units) of `s`, rounded up: `"100m"` -> 100,
/// `"1.5"` -> 1500.
pub fn milli_value(s: &str) -> Option<i64> {
    scaled(s, -3)
}

/// Base units of `s`, rounded up: `"128Mi"` -> 134217728, `"1k"` -> 1000.
pub fn value(s: &str) -> Option<i64> {
    scaled(s, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_forms() {
        assert_eq!(milli_value("100m"), Some(100));
        assert_eq!(milli_value("1"), Some(1000));
        assert_eq!(milli_value("1.5"), Some(1500));
        assert_eq!(milli_value("0.1"), Some(100));
        assert_eq!(milli_value("1e3"), Some(1_000_000));
        assert_eq!(milli_value("250000u"), Some(250));
        // Rounded up, as upstream's MilliValue.
        assert_eq!(milli_value("1n"), Some(1));
        assert_eq!(milli_value("0.0001"), Some(1));
        assert_eq!(milli_value("0"), Some(0));
    }

    #[test]
    fn memory_forms() {
        assert_eq!(value("128Mi"), Some(128 << 20));
        assert_eq!(value("1Gi"), Some(1 << 30));
        assert_eq!(value("1G"), Some(1_000_000_000));
        assert_eq!(value("1.5Gi"), Some(3 << 29));
        assert_eq!(value("129e6"), Some(129_000_000));
        assert_eq!(value("123456"), Some(123_456));
        assert_eq!(value("100m"), Some(1));
        assert_eq!(value("110"), Some(110));
        assert_eq!(value("8Ei"), None, "overflows i64");
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "abc", "1Qi", "1.2.3", ".", "e3", "1e"] {
            assert_eq!(value(s), None, "{s:?}");
        }
    }
}
