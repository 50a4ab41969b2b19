//! Node health, as upstream's monitorNodeHealth judges it: a node is
//! overdue when neither its Lease nor its Ready heartbeat changed for the
//! grace period, timed on this process's clock (the node's own clock may
//! be skewed); an overdue node's conditions become Unknown; the Ready
//! condition decides the NoExecute taint, and every condition (plus
//! `spec.unschedulable`) the NoSchedule taints the scheduler heeds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

pub use kube_util::taints::{
    NO_EXECUTE, NO_SCHEDULE, TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE,
};

/// The conditions the agent reports and the controller marks Unknown.
pub const CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// What was last seen of a node's heartbeats, and when (local clock).
#[derive(Debug, Clone)]
struct Probe {
    uid: String,
    renew: Option<jiff::Timestamp>,
    heartbeat: Option<jiff::Timestamp>,
    at: Instant,
}

/// Heartbeat observations of every node.
#[derive(Debug, Default)]
pub struct Health {
    probes: HashMap<String, Probe>,
}

/// The node's Ready condition status (`True`, `False`, `Unknown`), if any.
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

fn ready_heartbeat(node: &Node) -> Option<jiff::Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
}

impl Health {
    /// Record what `node` and its `lease` show at `now`; true if neither
    /// heartbeat moved for longer than `grace`. A node seen for the first
    /// time gets the full grace period (as upstream after a restart).
    pub fn overdue(
        &mut self,
        node: &Node,
        lease: Option<&Lease>,
        now: Instant,
        grace: Duration,
    ) -> bool {
        let uid = node.uid().unwrap_or_default();
        let renew = lease
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0);
        let heartbeat = ready_heartbeat(node);
        let p = self.probes.entry(node.name_any()).or_insert_with(|| Probe {
            uid: uid.clone(),
            renew,
            heartbeat,
            at: now,
        });
        if p.uid != uid || p.renew != renew || p.heartbeat != heartbeat {
            *p = Probe {
                uid,
                renew,
                heartbeat,
                at: now,
            };
        }
        now.duration_since(p.at) > grace
    }

    /// Forget nodes that are gone.
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.probes.retain(|name, _| alive(name));
    }
}

/// The node's conditions with every agent-reported one Unknown, or None
/// if they all are already. Existing ones keep their heartbeat time;
/// missing ones are added as never updated.
pub fn unknown_conditions(node: &Node, now: jiff::Timestamp) -> Option<Vec<NodeCondition>> {
    let mut conds: Vec<NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut changed = false;
    for ty in CONDITIONS {
        match conds.iter_mut().find(|c| c.type_ == ty) {
            Some(c) if c.status == "Unknown" => {}
            Some(c) => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(Time(now));
                changed = true;
            }
            None => {
                conds.push(NodeCondition {
                    type_: ty.into(),
                    status: "Unknown".into(),
                    reason: Some("NodeStatusNeverUpdated".into()),
                    message: Some("Kubelet never posted node status.".into()),
                    last_heartbeat_time: node.creation_timestamp(),
                    last_transition_time: Some(Time(now)),
                });
                changed = true;
            }
        }
    }
    changed.then_some(conds)
}

/// Put on a node whose MemoryPressure condition is True.
pub const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
/// Put on a node whose DiskPressure condition is True.
pub const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
/// Put on a node whose PIDPressure condition is True.
pub const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
/// Put on a node whose NetworkUnavailable condition is True.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Upstream's `nodeConditionToTaintKeyStatusMap`: the NoSchedule taint a
/// condition in a given status stands for (TaintNodesByCondition).
const CONDITION_TAINTS: [(&str, &str, &str); 6] = [
    ("Ready", "False", TAINT_NOT_READY),
    ("Ready", "Unknown", TAINT_UNREACHABLE),
    ("MemoryPressure", "True", TAINT_MEMORY_PRESSURE),
    ("DiskPressure", "True", TAINT_DISK_PRESSURE),
    ("PIDPressure", "True", TAINT_PID_PRESSURE),
    ("NetworkUnavailable", "True", TAINT_NETWORK_UNAVAILABLE),
];

/// The node's taints as the controller wants them, or None if they
/// already are: the NoExecute not-ready / unreachable taint following the
/// Ready condition ([`no_execute_taints`]) and the NoSchedule taints
/// following every condition and `spec.unschedulable`
/// ([`no_schedule_taints`]). Taints the controller does not own stay as
/// they are, so one patch carries both passes.
pub fn desired_taints(node: &Node, now: jiff::Timestamp) -> Option<Vec<Taint>> {
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let out = no_execute_taints(node, taints.clone(), now);
    let out = no_schedule_taints(node, out);
    (out != taints).then_some(out)
}

/// `taints` with the controller's NoExecute taint matching the node's
/// Ready condition (unreachable for Unknown, not-ready for False, none
/// for True); untouched while the node has no Ready condition. A kept
/// taint keeps its timeAdded: eviction deadlines count from it.
fn no_execute_taints(node: &Node, taints: Vec<Taint>, now: jiff::Timestamp) -> Vec<Taint> {
    let Some(ready) = ready_status(node) else {
        return taints;
    };
    let want = match ready {
        "Unknown" => Some(TAINT_UNREACHABLE),
        "False" => Some(TAINT_NOT_READY),
        _ => None,
    };
    let ours = |t: &Taint| {
        t.effect == NO_EXECUTE && (t.key == TAINT_UNREACHABLE || t.key == TAINT_NOT_READY)
    };
    let mut out: Vec<Taint> = taints
        .into_iter()
        .filter(|t| !ours(t) || Some(t.key.as_str()) == want)
        .collect();
    if let Some(key) = want {
        if !out.iter().any(|t| t.key == key && t.effect == NO_EXECUTE) {
            out.push(Taint {
                key: key.into(),
                effect: NO_EXECUTE.into(),
                value: None,
                // Whole seconds: what the wire format keeps anyway.
                time_added: jiff::Timestamp::from_second(now.as_second()).ok().map(Time),
            });
        }
    }
    out
}

/// `taints` with the NoSchedule taints of upstream's
/// `doNoScheduleTaintingPass`: one per condition in a tainting status
/// ([`CONDITION_TAINTS`]) plus node.kubernetes.io/unschedulable for a
/// cordoned node; stale ones of those keys removed. As upstream, a taint
/// is matched by key and effect only, and added without timeAdded
/// (nothing counts from a NoSchedule taint).
fn no_schedule_taints(node: &Node, taints: Vec<Taint>) -> Vec<Taint> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut want: Vec<&str> = CONDITION_TAINTS
        .iter()
        .filter(|(ty, status, _)| {
            conditions
                .iter()
                .any(|c| c.type_ == *ty && c.status == *status)
        })
        .map(|(_, _, key)| *key)
        .collect();
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        want.push(TAINT_UNSCHEDULABLE);
    }
    let owned = |key: &str| {
        key == TAINT_UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == key)
    };
    let mut out: Vec<Taint> = taints
        .into_iter()
        .filter(|t| t.effect != NO_SCHEDULE || !owned(&t.key) || want.contains(&t.key.as_str()))
        .collect();
    for key in want {
        if !out.iter().any(|t| t.key == key && t.effect == NO_SCHEDULE) {
            out.push(Taint {
                key: key.into(),
                effect: NO_SCHEDULE.into(),
                value: None,
                time_added: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: Option<&str>, taints: serde_json::Value) -> Node {
        let conds = match ready {
            Some(s) => {
                json!([{"type": "Ready", "status": s, "lastHeartbeatTime": "2026-01-01T00:00:00Z"}])
            }
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "n", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"taints": taints},
            "status": {"conditions": conds},
        }))
        .unwrap()
    }

    #[test]
    fn overdue_after_grace_without_heartbeats() {
        let mut h = Health::default();
        let n = node(Some("True"), json!([]));
        let t0 = Instant::now();
        let grace = Duration::from_secs(40);
        assert!(!h.overdue(&n, None, t0, grace));
        assert!(!h.overdue(&n, None, t0 + Duration::from_secs(39), grace));
        assert!(h.overdue(&n, None, t0 + Duration::from_secs(41), grace));
        // A lease renewal resets the clock.
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"renewTime": "2026-01-01T00:00:10.000000Z"}})).unwrap();
        assert!(!h.overdue(&n, Some(&lease), t0 + Duration::from_secs(42), grace));
        assert!(h.overdue(&n, Some(&lease), t0 + Duration::from_secs(83), grace));
    }

    #[test]
    fn stale_conditions_become_unknown_once() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let n = node(Some("True"), json!([]));
        let conds = unknown_conditions(&n, now).unwrap();
        assert_eq!(conds.len(), 4);
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(
            ready.message.as_deref(),
            Some("Kubelet stopped posting node status.")
        );
        assert_eq!(
            ready.last_heartbeat_time.as_ref().unwrap().0.to_string(),
            "2026-01-01T00:00:00Z"
        );
        let mem = conds.iter().find(|c| c.type_ == "MemoryPressure").unwrap();
        assert_eq!(mem.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        let mut n2 = n.clone();
        n2.status.as_mut().unwrap().conditions = Some(conds);
        assert!(unknown_conditions(&n2, now).is_none());
    }

    fn keys(taints: &[Taint]) -> Vec<(&str, &str)> {
        taints
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect()
    }

    /// A node with the given (type, status) conditions and taints.
    fn node_with(conds: &[(&str, &str)], unschedulable: bool, taints: serde_json::Value) -> Node {
        let conds: Vec<_> = conds
            .iter()
            .map(|(ty, st)| json!({"type": ty, "status": st}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "n", "uid": "u"},
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"conditions": conds},
        }))
        .unwrap()
    }

    #[test]
    fn taints_follow_ready() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let other = json!({"key": "x", "effect": "NoSchedule"});
        let t = desired_taints(&node(Some("Unknown"), json!([other])), now).unwrap();
        assert_eq!(
            keys(&t),
            vec![
                ("x", "NoSchedule"),
                (TAINT_UNREACHABLE, "NoExecute"),
                (TAINT_UNREACHABLE, "NoSchedule")
            ]
        );
        assert_eq!(t[1].time_added.as_ref().unwrap().0, now);
        assert!(t[2].time_added.is_none());
        let unreachable = json!({"key": TAINT_UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"});
        let unreachable_ns = json!({"key": TAINT_UNREACHABLE, "effect": "NoSchedule"});
        assert!(desired_taints(
            &node(Some("Unknown"), json!([unreachable, unreachable_ns])),
            now
        )
        .is_none());
        let t = desired_taints(
            &node(Some("False"), json!([unreachable, other, unreachable_ns])),
            now,
        )
        .unwrap();
        assert_eq!(
            keys(&t),
            vec![
                ("x", "NoSchedule"),
                (TAINT_NOT_READY, "NoExecute"),
                (TAINT_NOT_READY, "NoSchedule")
            ]
        );
        let t = desired_taints(
            &node(Some("True"), json!([unreachable, other, unreachable_ns])),
            now,
        )
        .unwrap();
        assert_eq!(keys(&t), vec![("x", "NoSchedule")]);
        assert!(desired_taints(&node(None, json!([])), now).is_none());
    }

    #[test]
    fn no_schedule_taints_follow_conditions() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let pressured = [
            ("Ready", "True"),
            ("MemoryPressure", "True"),
            ("DiskPressure", "True"),
            ("PIDPressure", "True"),
            ("NetworkUnavailable", "True"),
        ];
        let t = desired_taints(&node_with(&pressured, false, json!([])), now).unwrap();
        assert_eq!(
            keys(&t),
            vec![
                (TAINT_MEMORY_PRESSURE, "NoSchedule"),
                (TAINT_DISK_PRESSURE, "NoSchedule"),
                (TAINT_PID_PRESSURE, "NoSchedule"),
                (TAINT_NETWORK_UNAVAILABLE, "NoSchedule"),
            ]
        );
        assert!(t.iter().all(|t| t.time_added.is_none()));
        // Already there: nothing to patch.
        let n = node_with(&pressured, false, serde_json::to_value(&t).unwrap());
        assert!(desired_taints(&n, now).is_none());
        // Pressure gone (False or Unknown): taints removed, others kept.
        let mut mine = serde_json::to_value(&t).unwrap();
        mine.as_array_mut().unwrap().extend([
            json!({"key": "x", "effect": "NoSchedule"}),
            // Same key, another effect: not the NoSchedule pass's.
            json!({"key": TAINT_DISK_PRESSURE, "effect": "NoExecute"}),
        ]);
        let calm = [
            ("Ready", "True"),
            ("MemoryPressure", "False"),
            ("DiskPressure", "Unknown"),
            ("PIDPressure", "False"),
        ];
        let t = desired_taints(&node_with(&calm, false, mine), now).unwrap();
        assert_eq!(
            keys(&t),
            vec![("x", "NoSchedule"), (TAINT_DISK_PRESSURE, "NoExecute")]
        );
    }

    #[test]
    fn no_schedule_taint_matched_by_key_and_effect() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let with_value =
            json!([{"key": TAINT_DISK_PRESSURE, "value": "v", "effect": "NoSchedule"}]);
        let n = node_with(&[("DiskPressure", "True")], false, with_value);
        assert!(desired_taints(&n, now).is_none());
    }

    #[test]
    fn cordon_adds_unschedulable_taint() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        // No conditions at all yet: the cordon still counts.
        let t = desired_taints(&node_with(&[], true, json!([])), now).unwrap();
        assert_eq!(keys(&t), vec![(TAINT_UNSCHEDULABLE, "NoSchedule")]);
        let n = node_with(
            &[("Ready", "True")],
            false,
            serde_json::to_value(&t).unwrap(),
        );
        assert_eq!(desired_taints(&n, now).unwrap(), vec![]);
    }
}
