//! Taint-based eviction (upstream's NoExecute taint manager): a pod on a
//! node with NoExecute taints goes at once if it does not tolerate one of
//! them, or when the shortest `tolerationSeconds` among the tolerations
//! used runs out, counted from the taint's timeAdded.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};
use kube_util::taints::{tolerates, NO_EXECUTE};

/// What to do with a pod on a tainted node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    EvictNow,
    EvictAt(jiff::Timestamp),
}

/// The verdict for `pod` given its node's `taints` at `now`. `added`
/// gives a taint's start when it has no timeAdded (then the controller
/// uses when it first saw it).
pub fn verdict(
    pod: &Pod,
    taints: &[Taint],
    now: jiff::Timestamp,
    added: impl Fn(&Taint) -> jiff::Timestamp,
) -> Verdict {
    let tolerations: &[Toleration] = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let mut deadline: Option<jiff::Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == NO_EXECUTE) {
        // The first toleration that matches is the one used (as upstream).
        let Some(t) = tolerations.iter().find(|t| tolerates(t, taint)) else {
            return Verdict::EvictNow;
        };
        let Some(secs) = t.toleration_seconds else {
            continue; // tolerated forever
        };
        let start = taint
            .time_added
            .as_ref()
            .map_or_else(|| added(taint), |t| t.0);
        let at = start
            .checked_add(jiff::SignedDuration::from_secs(secs.max(0)))
            .unwrap_or(start);
        deadline = Some(deadline.map_or(at, |d| d.min(at)));
    }
    match deadline {
        Some(at) if at <= now => Verdict::EvictNow,
        Some(at) => Verdict::EvictAt(at),
        None => Verdict::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn pod(tolerations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": tolerations}})).unwrap()
    }

    fn taint(key: &str, effect: &str, at: i64) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: Some(Time(ts(at))),
        }
    }

    #[test]
    fn verdicts() {
        let never = |_: &Taint| ts(0);
        let unreachable = taint("node.kubernetes.io/unreachable", "NoExecute", 1000);
        let none = pod(json!([]));
        assert_eq!(verdict(&none, &[], ts(1000), never), Verdict::Keep);
        assert_eq!(
            verdict(&none, std::slice::from_ref(&unreachable), ts(1000), never),
            Verdict::EvictNow
        );
        // NoSchedule taints do not evict.
        let nosched = taint("x", "NoSchedule", 1000);
        assert_eq!(verdict(&none, &[nosched], ts(1000), never), Verdict::Keep);
        let two = pod(
            json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]),
        );
        assert_eq!(
            verdict(&two, std::slice::from_ref(&unreachable), ts(1001), never),
            Verdict::EvictAt(ts(1002))
        );
        assert_eq!(
            verdict(&two, std::slice::from_ref(&unreachable), ts(1002), never),
            Verdict::EvictNow
        );
        let forever = pod(json!([{"operator": "Exists"}]));
        assert_eq!(
            verdict(
                &forever,
                std::slice::from_ref(&unreachable),
                ts(5000),
                never
            ),
            Verdict::Keep
        );
        let zero = pod(
            json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 0}]),
        );
        assert_eq!(
            verdict(&zero, std::slice::from_ref(&unreachable), ts(1000), never),
            Verdict::EvictNow
        );
        // Without timeAdded, the first sighting counts.
        let mut bare = unreachable.clone();
        bare.time_added = None;
        assert_eq!(
            verdict(&two, &[bare], ts(1001), |_| ts(1000)),
            Verdict::EvictAt(ts(1002))
        );
    }

    #[test]
    fn toleration_matching_follows_upstream() {
        let t = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        let mut tn = taint("k", "NoExecute", 0);
        tn.value = Some("v".into());
        assert!(tolerates(&t(json!({"key": "k", "value": "v"})), &tn));
        assert!(!tolerates(&t(json!({"key": "k", "value": "w"})), &tn));
        assert!(tolerates(
            &t(json!({"key": "k", "operator": "Exists", "effect": "NoExecute"})),
            &tn
        ));
        assert!(!tolerates(
            &t(json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"})),
            &tn
        ));
        assert!(tolerates(&t(json!({"operator": "Exists"})), &tn));
        assert!(!tolerates(
            &t(json!({"key": "j", "operator": "Exists"})),
            &tn
        ));
    }
}
