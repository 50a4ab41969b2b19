//! Node health, as upstream's monitorNodeHealth judges it: a node is
//! overdue when neither its Lease nor its Ready heartbeat changed for the
//! grace period, timed on this process's clock (the node's own clock may
//! be skewed); an overdue node's conditions become Unknown; the Ready
//! condition decides the NoExecute taint.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

pub use kube_util::taints::{NO_EXECUTE, TAINT_NOT_READY, TAINT_UNREACHABLE};

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

/// The node's taints with the controller's NoExecute taint matching its
/// Ready condition (unreachable for Unknown, not-ready for False, none
/// for True), or None if they already do. A kept taint keeps its
/// timeAdded: eviction deadlines count from it.
pub fn desired_taints(node: &Node, now: jiff::Timestamp) -> Option<Vec<Taint>> {
    let want = match ready_status(node)? {
        "Unknown" => Some(TAINT_UNREACHABLE),
        "False" => Some(TAINT_NOT_READY),
        _ => None,
    };
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| {
        t.effect == NO_EXECUTE && (t.key == TAINT_UNREACHABLE || t.key == TAINT_NOT_READY)
    };
    let mut out: Vec<Taint> = taints
        .iter()
        .filter(|t| !ours(t) || Some(t.key.as_str()) == want)
        .cloned()
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
    (out != taints).then_some(out)
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

    #[test]
    fn taints_follow_ready() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let other = json!({"key": "x", "effect": "NoSchedule"});
        let t = desired_taints(&node(Some("Unknown"), json!([other])), now).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].key, TAINT_UNREACHABLE);
        assert_eq!(t[1].time_added.as_ref().unwrap().0, now);
        let unreachable = json!({"key": TAINT_UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"});
        assert!(desired_taints(&node(Some("Unknown"), json!([unreachable])), now).is_none());
        let t = desired_taints(&node(Some("False"), json!([unreachable, other])), now).unwrap();
        assert_eq!(
            t.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
            vec!["x", TAINT_NOT_READY]
        );
        let t = desired_taints(&node(Some("True"), json!([unreachable, other])), now).unwrap();
        assert_eq!(t.len(), 1);
        assert!(desired_taints(&node(None, json!([])), now).is_none());
    }
}
