//! The string formats upstream validates (`kube-openapi`'s strfmt subset
//! that apiextensions keeps). Unknown formats are accepted and not
//! checked, as upstream does.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `s` is of `format`; None when the format is not one we check.
pub fn matches(format: &str, s: &str) -> Option<bool> {
    Some(match format {
        "byte" => base64_ok(s),
        "date" => jiff::civil::Date::strptime("%Y-%m-%d", s).is_ok(),
        "date-time" | "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "duration" => kube_util::duration::parse_duration(s).is_ok(),
        "uuid" => uuid::Uuid::parse_str(s).is_ok() && s.len() == 36,
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => cidr_ok(s),
        "hostname" => hostname_ok(s),
        "email" => email_ok(s),
        "uri" => uri_ok(s),
        "int32" | "int64" | "float" | "double" | "password" => true,
        _ => return None,
    })
}

fn base64_ok(s: &str) -> bool {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).is_ok()
}

fn cidr_ok(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => bits <= 32,
        Ok(IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

fn hostname_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn email_ok(s: &str) -> bool {
    match s.rsplit_once('@') {
        Some((local, domain)) => !local.is_empty() && hostname_ok(domain),
        None => false,
    }
}

fn uri_ok(s: &str) -> bool {
    match s.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn formats() {
        assert_eq!(matches("date-time", "2024-01-02T03:04:05Z"), Some(true));
        assert_eq!(matches("date-time", "yesterday"), Some(false));
        assert_eq!(matches("date", "2024-01-02"), Some(true));
        assert_eq!(matches("ipv4", "10.0.0.1"), Some(true));
        assert_eq!(matches("ipv4", "10.0.0"), Some(false));
        assert_eq!(matches("cidr", "10.0.0.0/8"), Some(true));
        assert_eq!(matches("cidr", "10.0.0.0/33"), Some(false));
        assert_eq!(
            matches("uuid", "6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
            Some(true)
        );
        assert_eq!(matches("hostname", "a.b-c.d"), Some(true));
        assert_eq!(matches("hostname", "-a"), Some(false));
        assert_eq!(matches("byte", "aGVsbG8="), Some(true));
        assert_eq!(matches("duration", "1h30m"), Some(true));
        assert_eq!(matches("whatever", "x"), None);
    }
}
