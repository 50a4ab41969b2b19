//! Template hashes and scaled fenceposts shared by the rollout controllers.
//!
//! The hash names a pod template the way upstream's `controller.ComputeHash`
//! does: FNV-1a (32 bit) over the template (here its JSON, upstream a Go
//! dump) plus the collision count, printed in decimal and re-encoded in an
//! alphabet without vowels, so a Deployment's ReplicaSet is
//! `<deployment>-<hash>` and a DaemonSet's pods carry
//! `controller-revision-hash=<hash>`.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::workload::{Error, Result};

/// The characters upstream's `rand.SafeEncodeString` maps to: no vowels,
/// no look-alikes, so no words.
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn fnv1a32(bytes: &[u8], mut h: u32) -> u32 {
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The stable hash of `template` (and `collision_count`, bumped when two
/// templates hash alike).
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    // k8s-openapi serialises fields in a fixed order and maps sorted, so
    // equal templates give equal bytes.
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut h = fnv1a32(&json, 0x811c_9dc5);
    if let Some(c) = collision_count {
        let mut buf = [0u8; 8];
        buf[..4].copy_from_slice(&(c as u32).to_le_bytes());
        h = fnv1a32(&buf, h);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// `v` resolved against `total`: a number as is, a percentage of `total`
/// rounded up or down (upstream `GetScaledValueFromIntOrPercent`).
///
/// # Errors
/// `v` is a string that is not a percentage.
pub fn scaled(v: Option<&IntOrString>, total: i32, round_up: bool, field: &str) -> Result<i32> {
    match v {
        None => Ok(0),
        Some(IntOrString::Int(i)) => Ok(*i),
        Some(IntOrString::String(s)) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "{field} {s:?} is neither a number nor a percentage such as \"25%\"; fix the object's spec"
                    ))
                })?;
            let x = pct * i64::from(total);
            let v = if round_up {
                (x + 99).div_euclid(100)
            } else {
                x.div_euclid(100)
            };
            Ok(v as i32)
        }
    }
}

/// maxSurge and maxUnavailable of a rolling update against `desired`
/// (upstream `ResolveFenceposts`): surge rounds up, unavailable down, and
/// when both come to zero one pod may be unavailable, or nothing could
/// ever move.
///
/// # Errors
/// One of them is a malformed string.
pub fn fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32)> {
    let surge = scaled(max_surge, desired, true, "maxSurge")?;
    let mut unavailable = scaled(max_unavailable, desired, false, "maxUnavailable")?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn hashes_are_stable_and_safe() {
        let t = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        };
        let h = template_hash(&t, None);
        assert_eq!(h, template_hash(&t.clone(), None));
        assert_ne!(h, template_hash(&t, Some(1)));
        assert!(h.bytes().all(|b| ALPHANUMS.contains(&b)), "{h}");
        assert!((1..=10).contains(&h.len()));
    }

    #[test]
    fn fenceposts_round_like_upstream() {
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        // 25% of 10: surge 2.5 -> 3, unavailable 2.5 -> 2.
        assert_eq!(
            fenceposts(pct("25%").as_ref(), pct("25%").as_ref(), 10).unwrap(),
            (3, 2)
        );
        // 25% of 1: surge 1, unavailable 0.
        assert_eq!(
            fenceposts(pct("25%").as_ref(), pct("25%").as_ref(), 1).unwrap(),
            (1, 0)
        );
        // Both zero: one may be unavailable.
        let zero = Some(IntOrString::Int(0));
        assert_eq!(fenceposts(zero.as_ref(), zero.as_ref(), 3).unwrap(), (0, 1));
        assert!(fenceposts(pct("x").as_ref(), None, 3).is_err());
    }
}
