//! Preemption, upstream's DefaultPreemption: when no node fits a pod,
//! find the node where removing the fewest, least important pods of
//! lower priority makes it fit, without breaking PodDisruptionBudgets
//! where possible.
//!
//! The dry run works on the scheduler's own cache: the lower-priority
//! pods of a node are lifted out of it, the filters run as for a real
//! attempt (topology spread and inter-pod affinity counted again, so an
//! anti-affinity to a victim is resolved by removing it), the pods that
//! are not needed gone are put back one by one, most important first
//! (upstream's reprieve), and everything is restored before returning:
//! nothing changes until the victims' deletions come through the watch.
//!
//! Pods nominated to a node (waiting for their victims to go) are not
//! counted in the dry run, as upstream's preemption does not count
//! lower-priority ones; the scheduling loop holds their room against
//! other pods.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;

use crate::budgets::Budgets;
use crate::cache::{Cache, Lifted};
use crate::filter::{self, Reason, Topology};
use crate::podinfo::PodInfo;
use crate::volumes::PodVolumes;

/// Upstream's per-node verdicts, as they appear after "preemption: " in
/// FailedScheduling messages.
const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
const NO_VICTIMS: &str = "No preemption victims found for incoming pod";

/// Where to preempt and whom.
#[derive(Debug)]
pub struct Candidate {
    pub node: String,
    /// Most important first.
    pub victims: Vec<Arc<PodInfo>>,
    /// Victims whose removal a PodDisruptionBudget does not allow.
    pub violations: usize,
}

/// Why `pod` may not preempt now (upstream
/// `PodEligibleToPreemptOthers`), as the message after "preemption: ";
/// `None` when it may. `nominated` is the node it already preempted on:
/// while lower-priority pods there are still terminating, it waits for
/// them instead of preempting more.
pub fn ineligible(pod: &PodInfo, nominated: Option<&str>, cache: &Cache) -> Option<&'static str> {
    let policy = pod.spec().and_then(|s| s.preemption_policy.as_deref());
    if policy == Some("Never") {
        return Some("not eligible due to preemptionPolicy=Never.");
    }
    let node = nominated?;
    cache
        .pods()
        .any(|(p, n)| n == node && p.terminating && p.priority < pod.priority)
        .then_some("not eligible due to a terminating pod on the nominated node.")
}

/// The best place to preempt for `pod`, or upstream's message saying
/// why there is none ("0/3 nodes are available: 1 No preemption victims
/// found for incoming pod, 2 Preemption is not helpful for scheduling.").
///
/// `cache` is changed during the dry run and restored before returning.
pub fn find(
    pod: &PodInfo,
    volumes: Option<&PodVolumes>,
    cache: &mut Cache,
    budgets: &Budgets,
) -> Result<Candidate, String> {
    let mut lower: HashMap<String, Vec<String>> = HashMap::new();
    for (p, node) in cache.pods() {
        if p.priority < pod.priority {
            lower
                .entry(node.to_string())
                .or_default()
                .push(p.uid.clone());
        }
    }
    let topology = Topology::prefilter(pod, cache);
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    let mut candidates = Vec::new();
    let names = cache.node_names();
    for name in &names {
        let Some(node) = cache.node(name) else {
            continue;
        };
        let mut helpful = true;
        let fits = filter::check(pod, volumes, &topology, node, &mut |r| {
            helpful &= resolvable(r);
        });
        if fits || !helpful {
            // Fits already (only nominated pods held it back: removing
            // pods will not change that) or fails on something no
            // removal changes.
            *verdicts.entry(NOT_HELPFUL.to_string()).or_default() += 1;
            continue;
        }
        let Some(uids) = lower.remove(name.as_str()) else {
            *verdicts.entry(NO_VICTIMS.to_string()).or_default() += 1;
            continue;
        };
        match select_victims(pod, volumes, cache, budgets, name, &uids) {
            Ok(c) => candidates.push(c),
            Err(reasons) => {
                for r in reasons {
                    *verdicts.entry(r).or_default() += 1;
                }
            }
        }
    }
    pick(candidates).ok_or_else(|| filter::unavailable(names.len(), &verdicts))
}

/// Failures preemption may cure (upstream's `Unschedulable`, as opposed
/// to `UnschedulableAndUnresolvable`): what other pods take or forbid.
fn resolvable(r: Reason<'_>) -> bool {
    matches!(
        r,
        Reason::HostPorts
            | Reason::TooManyPods
            | Reason::Insufficient(_)
            | Reason::ReadWriteOncePodConflict
            | Reason::Spread
            | Reason::PodAntiAffinity
            | Reason::ExistingPodsAntiAffinity
    )
}

/// Upstream `SelectVictimsOnNode`: the fewest pods of `lower` (UIDs of
/// lower-priority pods on `node`) to remove for `pod` to fit, or the
/// filters' reasons when even removing all of them is not enough.
fn select_victims(
    pod: &PodInfo,
    volumes: Option<&PodVolumes>,
    cache: &mut Cache,
    budgets: &Budgets,
    node: &str,
    lower: &[String],
) -> Result<Candidate, Vec<String>> {
    let mut lifted: Vec<Lifted> = lower.iter().filter_map(|uid| cache.lift(uid)).collect();
    let fits = |cache: &Cache| {
        let topology = Topology::prefilter(pod, cache);
        cache
            .node(node)
            .is_some_and(|n| filter::fits(pod, volumes, &topology, n))
    };
    if !fits(cache) {
        let topology = Topology::prefilter(pod, cache);
        let mut reasons = Vec::new();
        if let Some(n) = cache.node(node) {
            filter::check(pod, volumes, &topology, n, &mut |r| {
                reasons.push(r.to_string())
            });
        }
        for l in lifted {
            cache.restore(l);
        }
        return Err(reasons);
    }
    lifted.sort_by(|a, b| more_important(&a.info, &b.info));
    // Those whose removal breaks a budget are reprieved first, so that
    // the fewest of them end up victims.
    let mut allowance = budgets.allowance();
    let (violating, other): (Vec<_>, Vec<_>) = lifted
        .into_iter()
        .map(|l| {
            let v = budgets.violates(&l.info, &mut allowance);
            (l, v)
        })
        .partition(|(_, v)| *v);
    let mut victims = Vec::new();
    let mut violations = 0;
    for (l, violates) in violating.into_iter().chain(other) {
        let uid = l.info.uid.clone();
        cache.restore(l);
        if !fits(cache) {
            if let Some(l) = cache.lift(&uid) {
                victims.push(l);
                violations += usize::from(violates);
            }
        }
    }
    let infos: Vec<Arc<PodInfo>> = victims.iter().map(|l| l.info.clone()).collect();
    for l in victims {
        cache.restore(l);
    }
    if infos.is_empty() {
        return Err(vec![NO_VICTIMS.to_string()]);
    }
    Ok(Candidate {
        node: node.to_string(),
        victims: infos,
        violations,
    })
}

/// Upstream `MoreImportantPod`: higher priority, then started earlier.
fn more_important(a: &PodInfo, b: &PodInfo) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then_with(|| start_time(a).cmp(&start_time(b)))
}

/// When the pod started; now for one that has not (upstream
/// `GetPodStartTime`).
fn start_time(p: &PodInfo) -> Timestamp {
    p.pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or_else(Timestamp::now, |t| t.0)
}

/// Upstream `pickOneNodeForPreemption`: fewest budget violations, then
/// the lowest highest victim priority, the lowest sum of priorities, the
/// fewest victims, the latest start among the most important victims;
/// the first of equals.
fn pick(candidates: Vec<Candidate>) -> Option<Candidate> {
    candidates.into_iter().min_by_key(|c| {
        let highest = c.victims.first().map_or(i32::MIN, |v| v.priority);
        // Shifted so that negative priorities do not lower the sum.
        let sum: i64 = c
            .victims
            .iter()
            .map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1)
            .sum();
        let earliest_of_highest = c
            .victims
            .iter()
            .filter(|v| v.priority == highest)
            .map(|v| start_time(v))
            .min();
        (
            c.violations,
            highest,
            sum,
            c.victims.len(),
            Reverse(earliest_of_highest),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube_util::informer::Change;
    use serde_json::json;

    fn cache_with(nodes: &[(&str, &str)]) -> Cache {
        let mut c = Cache::default();
        for (name, cpu) in nodes {
            c.upsert_node(
                serde_json::from_value::<Node>(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                    "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                               "conditions": [{"type": "Ready", "status": "True"}]}
                }))
                .unwrap(),
            );
        }
        c
    }

    fn pod(name: &str, cpu: &str, priority: i32, extra: serde_json::Value) -> Arc<PodInfo> {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": name}},
            "spec": {"priority": priority,
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"startTime": "2026-01-01T00:00:00Z"}
        });
        for (k, x) in extra.as_object().unwrap() {
            for (f, y) in x.as_object().unwrap() {
                v[k][f] = y.clone();
            }
        }
        Arc::new(PodInfo::new(serde_json::from_value::<Pod>(v).unwrap()))
    }

    fn bind(c: &mut Cache, p: &Arc<PodInfo>, node: &str) {
        c.set_bound(p.clone(), node);
    }

    fn names(c: &Candidate) -> Vec<&str> {
        c.victims.iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn the_fewest_lowest_victims_on_the_best_node() {
        let mut c = cache_with(&[("a", "2"), ("b", "2")]);
        // a: two low pods of 1 cpu; b: one pod of priority 5 and one of 1.
        bind(&mut c, &pod("a1", "1", 1, json!({})), "a");
        bind(&mut c, &pod("a2", "1", 1, json!({})), "a");
        bind(&mut c, &pod("b1", "1", 5, json!({})), "b");
        bind(&mut c, &pod("b2", "1", 1, json!({})), "b");
        let high = pod("high", "1", 10, json!({}));
        let before = c.node("a").unwrap().requested.cpu;
        let found = find(&high, None, &mut c, &Budgets::default()).unwrap();
        // Either node needs one pod of priority 1 gone (b keeps its
        // priority-5 pod): equal, so the first node.
        assert_eq!(found.node, "a");
        assert_eq!(names(&found).len(), 1);
        assert_eq!(c.node("a").unwrap().requested.cpu, before, "restored");
        assert_eq!(c.pods().count(), 4);

        // A pod needing 2 cpus empties a node: a, whose most important
        // victim has priority 1, not b, which would lose its priority 5.
        let big = pod("big", "2", 10, json!({}));
        let found = find(&big, None, &mut c, &Budgets::default()).unwrap();
        assert_eq!(found.node, "a");
        assert_eq!(names(&found).len(), 2);
    }

    #[test]
    fn budgets_are_spared_when_possible() {
        let mut c = cache_with(&[("a", "1"), ("b", "1")]);
        let guarded = pod("db", "1", 1, json!({"metadata": {"labels": {"app": "db"}}}));
        bind(&mut c, &guarded, "a");
        bind(&mut c, &pod("web", "1", 1, json!({})), "b");
        let mut budgets = Budgets::default();
        budgets.apply(Change::Applied(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
            }))
            .unwrap(),
        )));
        let high = pod("high", "1", 10, json!({}));
        let found = find(&high, None, &mut c, &budgets).unwrap();
        assert_eq!((found.node.as_str(), found.violations), ("b", 0));
        assert_eq!(names(&found), ["web"]);
    }

    #[test]
    fn no_candidates_say_why_as_upstream() {
        let mut c = cache_with(&[("a", "1"), ("b", "1"), ("c", "1")]);
        // a: an equal-priority pod (no victims); b: tainted
        // (unresolvable); c: a low pod too small to make room.
        bind(&mut c, &pod("same", "1", 10, json!({})), "a");
        c.upsert_node(
            serde_json::from_value::<Node>(json!({
                "metadata": {"name": "b"},
                "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"cpu": "1", "memory": "4Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap(),
        );
        bind(&mut c, &pod("low", "200m", 1, json!({})), "c");
        let huge = pod("huge", "1500m", 10, json!({}));
        let e = find(&huge, None, &mut c, &Budgets::default()).unwrap_err();
        assert_eq!(
            e,
            "0/3 nodes are available: 1 Insufficient cpu, 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn never_and_terminating_victims_make_a_pod_wait() {
        let mut c = cache_with(&[("a", "1")]);
        let never = pod(
            "never",
            "1",
            10,
            json!({"spec": {"preemptionPolicy": "Never"}}),
        );
        assert_eq!(
            ineligible(&never, None, &c),
            Some("not eligible due to preemptionPolicy=Never.")
        );
        let going = pod(
            "going",
            "1",
            1,
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        bind(&mut c, &going, "a");
        let high = pod("high", "1", 10, json!({}));
        assert_eq!(ineligible(&high, None, &c), None);
        assert!(ineligible(&high, Some("a"), &c).is_some());
    }

    #[test]
    fn anti_affinity_to_a_victim_is_resolved_by_removing_it() {
        let mut c = cache_with(&[("a", "4")]);
        bind(&mut c, &pod("low", "100m", 1, json!({})), "a");
        bind(&mut c, &pod("other", "100m", 1, json!({})), "a");
        let picky = pod(
            "picky",
            "100m",
            10,
            json!({"spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "low"}}, "topologyKey": "kubernetes.io/hostname"}]}}}}),
        );
        let found = find(&picky, None, &mut c, &Budgets::default()).unwrap();
        assert_eq!(names(&found), ["low"], "only the pod it is anti-affine to");
    }
}
