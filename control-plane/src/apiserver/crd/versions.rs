//! Upstream's version priority (`version.CompareKubeAwareVersionStrings`):
//! GA before beta before alpha, higher numbers first, anything that is not
//! a Kubernetes version last in alphabetical order. Discovery lists a
//! group's versions in this order; the first is the preferred one.

use std::cmp::Ordering;

/// (stability rank, major, minor) of a Kubernetes-style version; None for
/// other names.
fn parse(v: &str) -> Option<(u8, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major: u64 = rest[..digits].parse().ok()?;
    if major == 0 {
        return None;
    }
    let tail = &rest[digits..];
    if tail.is_empty() {
        return Some((2, major, 0));
    }
    let (rank, num) = if let Some(n) = tail.strip_prefix("beta") {
        (1, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (0, n)
    } else {
        return None;
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((rank, major, num.parse().ok()?))
}

/// Higher priority first.
pub fn compare(a: &str, b: &str) -> Ordering {
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

pub fn sort(versions: &mut [String]) {
    versions.sort_by(|a, b| compare(a, b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_order() {
        let mut v: Vec<String> = [
            "foo1",
            "v1alpha1",
            "v10",
            "v11alpha2",
            "v1",
            "v2beta1",
            "v12alpha1",
            "v1beta2",
            "foo10",
            "v2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sort(&mut v);
        assert_eq!(
            v,
            [
                "v10",
                "v2",
                "v1",
                "v2beta1",
                "v1beta2",
                "v12alpha1",
                "v11alpha2",
                "v1alpha1",
                "foo1",
                "foo10"
            ]
        );
    }
}
