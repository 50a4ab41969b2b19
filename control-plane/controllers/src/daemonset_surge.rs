//! DaemonSet rolling updates with `maxSurge` (upstream
//! `pkg/controller/daemon/update.go` `rollingUpdate` when surging): the
//! new daemon starts beside the old one, which goes once the new one is
//! available, so a node is never without a working daemon.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::daemonset::{is_updated, oldest_running_first, should_run};
use crate::pods;
use crate::workload::Result;
use crate::workload_hash::scaled;

/// How far a rolling update may go at once, in nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Nodes that may run a new daemon beside the old one.
    pub surge: i32,
    /// Nodes that may be without an available daemon.
    pub unavailable: i32,
}

/// The budget against `desired` scheduled nodes (upstream
/// `updatedDesiredNodeCounts`): both round up; when both come to zero one
/// node may be unavailable, or nothing could ever move.
///
/// # Errors
/// One of them is a malformed string (validation refuses those).
pub(crate) fn budget(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<Budget> {
    let surge = scaled(max_surge, desired, true, "maxSurge")?.max(0);
    let mut unavailable = scaled(max_unavailable, desired, true, "maxUnavailable")?.max(0);
    if desired > 0 && surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok(Budget { surge, unavailable })
}

/// Whether the DaemonSet rolls with surge at all (upstream `AllowsSurge`:
/// any non-zero maxSurge, a percentage counting against one node), which
/// decides whether the manage pass tolerates two daemons on a node.
pub(crate) fn allows_surge(ds: &DaemonSet) -> bool {
    let Some(strategy) = ds.spec.update_strategy.as_ref() else {
        return false;
    };
    if strategy.type_.as_deref().unwrap_or("RollingUpdate") != "RollingUpdate" {
        return false;
    }
    let surge = strategy
        .rolling_update
        .as_ref()
        .and_then(|r| r.max_surge.as_ref());
    scaled(surge, 1, true, "maxSurge").is_ok_and(|n| n > 0)
}

/// What the manage pass keeps of a node's live daemons while surging
/// (upstream `podsShouldBeOnNode`): the oldest new and the oldest old pod
/// may run side by side until the old one is not ready or the new one is
/// available; every other pod goes. Returns the pods to delete.
pub(crate) fn excess_on_node(
    mut running: Vec<Arc<Pod>>,
    hash: &str,
    min_ready: i32,
    now: jiff::Timestamp,
) -> Vec<Arc<Pod>> {
    running.sort_by(oldest_running_first);
    let (mut oldest_new, mut oldest_old) = (None, None);
    let mut delete = Vec::new();
    for pod in running {
        let slot = if is_updated(&pod, hash) {
            &mut oldest_new
        } else {
            &mut oldest_old
        };
        if slot.is_none() {
            *slot = Some(pod);
        } else {
            delete.push(pod);
        }
    }
    if let (Some(new), Some(old)) = (oldest_new, oldest_old) {
        if !pods::is_ready(&old) || pods::is_available(&new, min_ready, now) {
            delete.push(old);
        }
    }
    delete
}

/// One step of a surging rolling update.
#[derive(Debug, Default)]
pub(crate) struct Step {
    /// Nodes that get a new daemon beside their old one.
    pub create: Vec<String>,
    /// Old daemons whose node has an available new one, or that are
    /// unavailable where no daemon may run any more.
    pub delete: Vec<Arc<Pod>>,
    /// When a new daemon that is ready becomes available (minReadySeconds),
    /// so its old one can go then.
    pub retry: Option<Duration>,
}

/// A node's live daemon of the current revision and its older one.
type NewAndOld<'a> = (Option<&'a Arc<Pod>>, Option<&'a Arc<Pod>>);

/// The live new and old daemon of a node, or `None` when there are more
/// than one of either (upstream `findUpdatedPodsOnNode`).
fn new_and_old<'a>(here: &'a [Arc<Pod>], hash: &str) -> Option<NewAndOld<'a>> {
    let (mut new, mut old) = (None, None);
    for pod in here
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let slot = if is_updated(pod, hash) {
            &mut new
        } else {
            &mut old
        };
        if slot.replace(pod).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// Surge new daemons onto nodes and retire old ones (upstream
/// `rollingUpdate` with maxSurge > 0). Invariants, as upstream:
/// a node whose old daemon is unavailable gets its new one at once, past
/// the budget; an old daemon goes once the new one on its node is
/// available; at most `max_surge` nodes run a new daemon beside an
/// available old one at any time. Old daemons on nodes they may no longer
/// be scheduled to go only while enough daemons elsewhere are available.
pub(crate) fn rolling_update(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    max_surge: i32,
    now: jiff::Timestamp,
) -> Step {
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let nodes: HashMap<String, &Arc<Node>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let desired = nodes.values().filter(|n| should_run(ds, n).0).count() as i32;
    let mut step = Step::default();
    let mut allowed = Vec::new();
    let mut candidates = Vec::new();
    let mut not_to_run = Vec::new();
    let mut waiting = Vec::new();
    let (mut surging, mut available) = (0, 0);
    let mut names: Vec<&String> = by_node.keys().collect();
    // Deterministic order: the same nodes go first on every pass.
    names.sort();
    for name in names {
        // Pods for vanished nodes are the manage pass's to delete.
        let Some(node) = nodes.get(name) else {
            continue;
        };
        let Some((new, old)) = new_and_old(&by_node[name], hash) else {
            // Duplicates: the manage pass sorts the node out; it counts
            // as surging meanwhile.
            surging += 1;
            continue;
        };
        if old
            .or(new)
            .is_some_and(|p| pods::is_available(p, min_ready, now))
        {
            available += 1;
        }
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                let run = should_run(ds, node).0;
                match (pods::is_available(old, min_ready, now), run) {
                    (false, false) => step.delete.push(old.clone()),
                    (false, true) => allowed.push(name.clone()),
                    (true, false) => not_to_run.push(old.clone()),
                    (true, true) => candidates.push(name.clone()),
                }
            }
            (Some(new), Some(old)) => {
                if pods::is_available(new, min_ready, now) {
                    step.delete.push(old.clone());
                } else {
                    surging += 1;
                    waiting.push(new.clone());
                }
            }
        }
    }
    // Everyone expects every node served: a daemon on a node it no longer
    // fits goes only while more than the desired number are available.
    let deletable = (available - desired).clamp(0, not_to_run.len() as i32) as usize;
    step.delete.extend(not_to_run.into_iter().take(deletable));
    let room = (max_surge - surging).clamp(0, candidates.len() as i32) as usize;
    step.create = allowed;
    step.create.extend(candidates.into_iter().take(room));
    step.retry = pods::next_available_in(&waiting, min_ready, now);
    step
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemonset::REVISION_HASH;
    use k8s_openapi::api::apps::v1::{
        DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
    };
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn int(i: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(i))
    }

    fn pct(s: &str) -> Option<IntOrString> {
        Some(IntOrString::String(s.into()))
    }

    #[test]
    fn budget_rounds_up_and_never_stalls() {
        let b = |s: Option<IntOrString>, u: Option<IntOrString>, d| {
            budget(s.as_ref(), u.as_ref(), d).unwrap()
        };
        assert_eq!(
            b(int(1), int(0), 2),
            Budget {
                surge: 1,
                unavailable: 0
            }
        );
        // 10% of 15 nodes is 1.5: two nodes surge.
        assert_eq!(
            b(pct("10%"), int(0), 15),
            Budget {
                surge: 2,
                unavailable: 0
            }
        );
        assert_eq!(
            b(pct("1%"), pct("0%"), 3),
            Budget {
                surge: 1,
                unavailable: 0
            }
        );
        assert_eq!(
            b(pct("100%"), int(0), 7),
            Budget {
                surge: 7,
                unavailable: 0
            }
        );
        // Both zero: one node at a time rather than never.
        assert_eq!(
            b(int(0), int(0), 5),
            Budget {
                surge: 0,
                unavailable: 1
            }
        );
        assert_eq!(
            b(pct("0%"), None, 5),
            Budget {
                surge: 0,
                unavailable: 1
            }
        );
        // No nodes, nothing to move.
        assert_eq!(
            b(pct("50%"), int(0), 0),
            Budget {
                surge: 0,
                unavailable: 0
            }
        );
        assert!(budget(pct("x").as_ref(), None, 3).is_err());
    }

    fn ds(surge: Option<IntOrString>, kind: &str) -> DaemonSet {
        DaemonSet {
            spec: DaemonSetSpec {
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some(kind.into()),
                    rolling_update: Some(RollingUpdateDaemonSet {
                        max_surge: surge,
                        max_unavailable: int(0),
                    }),
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn surge_is_allowed_for_any_nonzero_rolling_maxsurge() {
        assert!(allows_surge(&ds(int(1), "RollingUpdate")));
        assert!(allows_surge(&ds(pct("1%"), "RollingUpdate")));
        assert!(!allows_surge(&ds(int(0), "RollingUpdate")));
        assert!(!allows_surge(&ds(pct("0%"), "RollingUpdate")));
        assert!(!allows_surge(&ds(None, "RollingUpdate")));
        assert!(!allows_surge(&ds(int(1), "OnDelete")));
    }

    fn node(name: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    /// A daemon pod of revision `hash` created at second `born`, ready
    /// since second `ready` if any.
    fn pod(name: &str, hash: &str, born: i64, ready: Option<i64>) -> Arc<Pod> {
        let ts = |s| Time(jiff::Timestamp::from_second(s).unwrap());
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(ts(born)),
                labels: Some([(REVISION_HASH.to_string(), hash.to_string())].into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready.is_some() { "True" } else { "False" }.into(),
                    last_transition_time: ready.map(ts),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn surges_within_budget_and_retires_old_once_new_is_available() {
        let d = ds(int(1), "RollingUpdate");
        let nodes: Vec<Arc<Node>> = ["a", "b", "c"].into_iter().map(node).collect();
        let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        by_node.insert("a".into(), vec![pod("a-old", "v1", 1, Some(2))]);
        by_node.insert("b".into(), vec![pod("b-old", "v1", 1, Some(2))]);
        by_node.insert("c".into(), vec![pod("c-old", "v1", 1, None)]);
        // c's old daemon is not available: replaced past the budget; one
        // available node surges.
        let s = rolling_update(&d, "v2", &nodes, &by_node, 1, at(100));
        assert_eq!(s.create, ["c", "a"]);
        assert!(s.delete.is_empty());

        // a's new daemon not yet ready: the budget is spent.
        by_node
            .get_mut("a")
            .unwrap()
            .push(pod("a-new", "v2", 50, None));
        let s = rolling_update(&d, "v2", &nodes, &by_node, 1, at(100));
        assert_eq!(s.create, ["c"]);
        assert!(s.delete.is_empty());

        // Ready: the old one goes, the next node surges after.
        by_node.insert(
            "a".into(),
            vec![
                pod("a-old", "v1", 1, Some(2)),
                pod("a-new", "v2", 50, Some(60)),
            ],
        );
        let s = rolling_update(&d, "v2", &nodes, &by_node, 1, at(100));
        assert_eq!(names(&s.delete), ["a-old"]);
        assert_eq!(s.create, ["c", "b"]);
    }

    #[test]
    fn min_ready_seconds_holds_the_old_daemon_and_asks_to_look_again() {
        let mut d = ds(int(1), "RollingUpdate");
        d.spec.min_ready_seconds = Some(30);
        let nodes = vec![node("a")];
        let by_node = HashMap::from([(
            "a".to_string(),
            vec![
                pod("a-old", "v1", 1, Some(2)),
                pod("a-new", "v2", 50, Some(90)),
            ],
        )]);
        let s = rolling_update(&d, "v2", &nodes, &by_node, 1, at(100));
        assert!(s.delete.is_empty() && s.create.is_empty());
        assert_eq!(s.retry, Some(Duration::from_secs(21)));
        let s = rolling_update(&d, "v2", &nodes, &by_node, 1, at(121));
        assert_eq!(names(&s.delete), ["a-old"]);
    }

    #[test]
    fn manage_keeps_old_and_new_until_the_new_is_available() {
        let old = pod("old", "v1", 1, Some(2));
        let new = pod("new", "v2", 50, None);
        let extra = pod("extra", "v2", 60, None);
        let del = excess_on_node(
            vec![old.clone(), extra.clone(), new.clone()],
            "v2",
            0,
            at(100),
        );
        assert_eq!(names(&del), ["extra"]);
        let ready_new = pod("new", "v2", 50, Some(60));
        let del = excess_on_node(vec![old.clone(), ready_new], "v2", 0, at(100));
        assert_eq!(names(&del), ["old"]);
        // An old daemon that is not ready is no reason to wait.
        let sick = pod("old", "v1", 1, None);
        let del = excess_on_node(vec![sick, new], "v2", 0, at(100));
        assert_eq!(names(&del), ["old"]);
    }
}
