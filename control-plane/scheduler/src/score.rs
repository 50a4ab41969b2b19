//! Scores: of the nodes a pod fits, which is best? Least allocated (CPU
//! and memory, upstream NodeResourcesFit's default strategy) plus
//! spreading the pods of one controller across nodes (what upstream's
//! default topology spreading does over hostnames). Ties are broken at
//! random, as upstream's `selectHost`, so that equal nodes share a burst.

use rand::Rng;

use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;

/// Scores run from 0 to this (upstream `MaxNodeScore`).
pub const MAX_SCORE: i64 = 100;
/// Spreading weighs twice the resource score, as upstream's
/// PodTopologySpread (weight 2) against NodeResourcesFit (weight 1).
pub const SPREAD_WEIGHT: i64 = 2;

/// Upstream `leastRequestedScore`: the share of the node left free after
/// placing the pod, 0 when over capacity.
fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_SCORE / capacity
}

/// Least allocated over CPU and memory (weight 1 each), counting the
/// non-zero requests so that pods without requests still spread.
pub fn least_allocated(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let cpu = least_requested(node.non_zero_cpu + pod.non_zero_cpu, node.allocatable.cpu);
    let memory = least_requested(
        node.non_zero_memory + pod.non_zero_memory,
        node.allocatable.memory,
    );
    (cpu + memory) / 2
}

/// Spreading: fewer pods of the same owner on a node score higher,
/// relative to the candidate with the most (`max`).
pub fn spread(count: u32, max: u32) -> i64 {
    if max == 0 {
        return MAX_SCORE;
    }
    MAX_SCORE * i64::from(max - count.min(max)) / i64::from(max)
}

/// The best of `feasible` for `pod`, ties broken uniformly at random.
pub fn select<'a>(
    pod: &PodInfo,
    feasible: &[&'a NodeInfo],
    rng: &mut impl Rng,
) -> Option<&'a NodeInfo> {
    let owner = pod.owner.as_deref();
    let max_owned = owner.map_or(0, |o| {
        feasible.iter().map(|n| n.owner_count(o)).max().unwrap_or(0)
    });
    let mut best: Option<&NodeInfo> = None;
    let mut best_score = i64::MIN;
    let mut ties = 0u32;
    for &node in feasible {
        let mut score = least_allocated(pod, node);
        if let Some(o) = owner {
            score += SPREAD_WEIGHT * spread(node.owner_count(o), max_owned);
        }
        if score > best_score {
            best = Some(node);
            best_score = score;
            ties = 1;
        } else if score == best_score {
            // Reservoir sampling: each of the k tied nodes ends up chosen
            // with probability 1/k, without collecting them.
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = Some(node);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use rand::SeedableRng;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> NodeInfo {
        let mut n = NodeInfo::new(name);
        n.set_node(
            serde_json::from_value::<Node>(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"}}
            }))
            .unwrap(),
        );
        n
    }

    fn pod(cpu: &str, owner: Option<&str>) -> PodInfo {
        let owners: Vec<_> = owner
            .map(|o| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}))
            .into_iter()
            .collect();
        PodInfo::new(
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u", "ownerReferences": owners},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let big = node("big", "4");
        let small = node("small", "2");
        let p = pod("1", None);
        // cpu: (4-1)/4 = 75, (2-1)/2 = 50; memory: (4-1)/4 = 75 on both.
        assert_eq!(least_allocated(&p, &big), 75);
        assert_eq!(least_allocated(&p, &small), 62);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert_eq!(select(&p, &[&small, &big], &mut rng).unwrap().name, "big");
    }

    #[test]
    fn over_capacity_scores_zero() {
        assert_eq!(least_requested(5, 4), 0);
        assert_eq!(least_requested(1, 0), 0);
        assert_eq!(least_requested(0, 4), 100);
    }

    #[test]
    fn owners_spread() {
        let mut a = node("a", "4");
        let b = node("b", "4");
        let p = pod("100m", Some("rs1"));
        a.add_pod(&p);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for _ in 0..20 {
            assert_eq!(select(&p, &[&a, &b], &mut rng).unwrap().name, "b");
        }
        // Another owner's pods are not pushed away by rs1's.
        assert_eq!(spread(0, 0), MAX_SCORE);
        assert_eq!(spread(1, 2), MAX_SCORE / 2);
    }

    #[test]
    fn ties_are_shared() {
        let nodes: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"), "4")).collect();
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let p = pod("100m", None);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            seen.insert(select(&p, &refs, &mut rng).unwrap().name.clone());
        }
        assert_eq!(seen.len(), 4, "every tied node gets picked: {seen:?}");
        assert!(select(&p, &[], &mut rng).is_none());
    }
}
