//! Taints and tolerations (upstream `Toleration.ToleratesTaint` and
//! `FindMatchingUntoleratedTaint`), and the taint keys and effects the
//! node lifecycle controller, the scheduler and DaemonSets agree on.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Pods that do not tolerate the taint are not scheduled on the node.
pub const NO_SCHEDULE: &str = "NoSchedule";
/// The scheduler avoids the node for pods that do not tolerate it.
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
/// Pods that do not tolerate the taint are evicted, and not scheduled.
pub const NO_EXECUTE: &str = "NoExecute";

/// Put on a node whose Ready condition is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Put on a node whose Ready condition is Unknown (it stopped reporting).
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Stands for `spec.unschedulable` (a cordoned node) in tolerations.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// Whether `t` tolerates `taint`: an empty effect matches every effect,
/// an empty key (only valid with `Exists`) every key; `Exists` ignores the
/// value and `Equal`, the default operator, compares it. An unknown
/// operator tolerates nothing.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    tolerates_parts(
        t,
        &taint.key,
        taint.value.as_deref().unwrap_or_default(),
        &taint.effect,
    )
}

/// [`tolerates`] for a taint given by its parts, for taints a caller
/// only imagines (the scheduler treats a not-ready node as tainted before
/// the controller has tainted it) without building a [`Taint`].
pub fn tolerates_parts(t: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != effect)
    {
        return false;
    }
    if t.key.as_deref().is_some_and(|k| !k.is_empty() && k != key) {
        return false;
    }
    match t.operator.as_deref().unwrap_or_default() {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or_default() == value,
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// The first of `taints` for which `relevant` holds that no toleration
/// tolerates.
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    relevant: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| relevant(taint) && !tolerated(tolerations, taint))
}

/// Whether a taint with `effect` keeps pods off the node (NoSchedule or
/// NoExecute; PreferNoSchedule only weighs in scoring).
pub fn blocks_scheduling(effect: &str) -> bool {
    effect == NO_SCHEDULE || effect == NO_EXECUTE
}

/// The first NoSchedule or NoExecute taint not tolerated: what keeps a
/// pod off the node (upstream's TaintToleration filter).
pub fn untolerated_blocking<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
) -> Option<&'a Taint> {
    untolerated(taints, tolerations, |t| blocks_scheduling(&t.effect))
}

/// The first NoExecute taint not tolerated: what evicts a running pod.
pub fn untolerated_no_execute<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
) -> Option<&'a Taint> {
    untolerated(taints, tolerations, |t| t.effect == NO_EXECUTE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    #[test]
    fn upstream_semantics() {
        let t = taint("dedicated", Some("gpu"), NO_SCHEDULE);
        let cases = [
            (
                json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
                true,
            ),
            // Equal is the default operator.
            (json!({"key": "dedicated", "value": "gpu"}), true),
            (json!({"key": "dedicated", "value": "cpu"}), false),
            (json!({"key": "dedicated"}), false),
            (json!({"key": "dedicated", "operator": "Exists"}), true),
            // An empty effect matches every effect; a given one must match.
            (
                json!({"key": "dedicated", "operator": "Exists", "effect": ""}),
                true,
            ),
            (
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
            (
                json!({"key": "dedicated", "operator": "Bogus", "value": "gpu"}),
                false,
            ),
        ];
        for (v, want) in cases {
            assert_eq!(tolerates(&tol(v.clone()), &t), want, "{v}");
        }
    }

    #[test]
    fn empty_key_with_exists_tolerates_everything() {
        let all = tol(json!({"operator": "Exists"}));
        let empty_key = tol(json!({"key": "", "operator": "Exists"}));
        for t in [
            taint("a", Some("b"), NO_EXECUTE),
            taint("node.kubernetes.io/unreachable", None, NO_SCHEDULE),
            taint("x", None, PREFER_NO_SCHEDULE),
        ] {
            assert!(tolerates(&all, &t));
            assert!(tolerates(&empty_key, &t));
        }
        // Restricted to one effect, it tolerates only that one.
        let no_exec = tol(json!({"operator": "Exists", "effect": "NoExecute"}));
        assert!(tolerates(&no_exec, &taint("a", None, NO_EXECUTE)));
        assert!(!tolerates(&no_exec, &taint("a", None, NO_SCHEDULE)));
        // An empty key with Equal matches only an empty-keyed taint with
        // the same value (validation refuses it; it must not match all).
        let empty_equal = tol(json!({"key": "", "value": ""}));
        assert!(!tolerates(&empty_equal, &taint("a", Some("b"), NO_EXECUTE)));
    }

    #[test]
    fn parts_agree_with_taints() {
        let t = tol(
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}),
        );
        assert!(tolerates_parts(&t, TAINT_NOT_READY, "", NO_SCHEDULE));
        assert!(!tolerates_parts(&t, TAINT_NOT_READY, "", NO_EXECUTE));
        assert!(!tolerates_parts(&t, TAINT_UNREACHABLE, "", NO_SCHEDULE));
    }

    #[test]
    fn untolerated_helpers() {
        let taints = [
            taint("soft", Some("x"), PREFER_NO_SCHEDULE),
            taint("hard", Some("y"), NO_SCHEDULE),
            taint("evict", None, NO_EXECUTE),
        ];
        assert_eq!(untolerated_blocking(&taints, &[]).unwrap().key, "hard");
        assert_eq!(untolerated_no_execute(&taints, &[]).unwrap().key, "evict");
        let tols = [tol(json!({"key": "hard", "operator": "Exists"}))];
        assert_eq!(untolerated_blocking(&taints, &tols).unwrap().key, "evict");
        assert!(untolerated(&taints, &tols, |t| t.effect == NO_SCHEDULE).is_none());
        assert!(untolerated_blocking(&taints, &[tol(json!({"operator": "Exists"}))]).is_none());
        assert!(untolerated(&taints, &[], |_| false).is_none());
        assert!(blocks_scheduling(NO_EXECUTE) && !blocks_scheduling(PREFER_NO_SCHEDULE));
    }
}
