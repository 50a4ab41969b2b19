//! Node condition bookkeeping as the kubelet's status setters do it:
//! `lastHeartbeatTime` is every report, `lastTransitionTime` moves only
//! when a condition's status changes, and each change is announced with
//! an event (NodeReady, NodeHasSufficientMemory, ...).

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Set `lastHeartbeatTime` to `now` on every desired condition, and
/// `lastTransitionTime` to `now` unless `previous` has the condition with
/// the same status (then its transition time is kept).
pub fn stamp(previous: &[NodeCondition], desired: &mut [NodeCondition], now: &Time) {
    for c in desired.iter_mut() {
        c.last_heartbeat_time = Some(now.clone());
        c.last_transition_time = match find(previous, &c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone().or(Some(now.clone())),
            _ => Some(now.clone()),
        };
    }
}

/// Whether any desired condition is new or differs from `previous` in
/// status, reason or message (heartbeats do not count).
pub fn changed(previous: &[NodeCondition], desired: &[NodeCondition]) -> bool {
    desired.iter().any(|c| match find(previous, &c.type_) {
        None => true,
        Some(p) => p.status != c.status || p.reason != c.reason || p.message != c.message,
    })
}

/// The events for conditions whose status changed (or that are new):
/// the kubelet's reason for the new status, e.g. `NodeReady`.
pub fn transitions(previous: &[NodeCondition], desired: &[NodeCondition]) -> Vec<&'static str> {
    desired
        .iter()
        .filter(|c| find(previous, &c.type_).map(|p| &p.status) != Some(&c.status))
        .filter_map(|c| event_reason(&c.type_, &c.status))
        .collect()
}

/// The kubelet's event reason for a condition's status.
fn event_reason(type_: &str, status: &str) -> Option<&'static str> {
    let is_true = status == "True";
    Some(match (type_, is_true) {
        ("Ready", true) => "NodeReady",
        ("Ready", false) => "NodeNotReady",
        ("MemoryPressure", false) => "NodeHasSufficientMemory",
        ("MemoryPressure", true) => "NodeHasInsufficientMemory",
        ("DiskPressure", false) => "NodeHasNoDiskPressure",
        ("DiskPressure", true) => "NodeHasDiskPressure",
        ("PIDPressure", false) => "NodeHasSufficientPID",
        ("PIDPressure", true) => "NodeHasInsufficientPID",
        _ => return None,
    })
}

/// Whether the Ready condition in `conditions` is True.
pub fn is_ready(conditions: &[NodeCondition]) -> bool {
    find(conditions, "Ready").is_some_and(|c| c.status == "True")
}

fn find<'a>(conditions: &'a [NodeCondition], type_: &str) -> Option<&'a NodeCondition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, status: &str, transition: Option<i64>) -> NodeCondition {
        NodeCondition {
            type_: t.into(),
            status: status.into(),
            reason: Some("R".into()),
            message: Some("m".into()),
            last_transition_time: transition
                .map(|s| Time(jiff::Timestamp::from_second(s).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let now = Time(jiff::Timestamp::from_second(1000).unwrap());
        let prev = vec![
            cond("Ready", "False", Some(10)),
            cond("DiskPressure", "False", Some(20)),
        ];
        let mut desired = vec![
            cond("Ready", "True", None),
            cond("DiskPressure", "False", None),
        ];
        desired[1].message = Some("other".into());
        stamp(&prev, &mut desired, &now);
        assert_eq!(desired[0].last_transition_time, Some(now.clone()));
        assert_eq!(desired[0].last_heartbeat_time, Some(now.clone()));
        assert_eq!(
            desired[1].last_transition_time,
            prev[1].last_transition_time
        );
        assert!(changed(&prev, &desired));
        assert_eq!(transitions(&prev, &desired), vec!["NodeReady"]);
        // The same conditions again: nothing changed, nothing to announce.
        let again = desired.clone();
        assert!(!changed(&desired, &again));
        assert!(transitions(&desired, &again).is_empty());
        // First report: every condition is announced.
        let first = vec![
            cond("MemoryPressure", "False", None),
            cond("Ready", "False", None),
        ];
        assert_eq!(
            transitions(&[], &first),
            vec!["NodeHasSufficientMemory", "NodeNotReady"]
        );
        assert!(is_ready(&desired));
        assert!(!is_ready(&first));
    }
}
