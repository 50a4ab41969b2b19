//! Scores: of the nodes a pod fits, which is best? Upstream's default
//! score plugins with their weights, normalisation and integer
//! arithmetic: NodeResourcesFit, NodeResourcesBalancedAllocation,
//! InterPodAffinity, PodTopologySpread, NodeAffinity, TaintToleration and
//! ImageLocality. A node's score is the sum over the plugins of weight x
//! normalised score (0..100); ties are broken at random, as upstream's
//! `selectHost`, so that equal nodes share a burst.
//!
//! What needs other pods is counted once per attempt by
//! [`State::prescore`], as upstream's PreScore: from the cache's label
//! groups (one match per group of alike pods, not per pod) and the few
//! pods with affinity terms, so that scoring a node is a few lookups.
//!
//! # Layout
//! - here: the configuration ([`Scoring`]), the per-attempt [`State`],
//!   the weighted sum ([`scores`]) and the choice ([`select`]).
//! - `resources`: NodeResourcesFit and NodeResourcesBalancedAllocation.
//! - `node`: NodeAffinity, TaintToleration and ImageLocality.
//! - `interpod`: InterPodAffinity.
//! - `spread`: PodTopologySpread.
//!
//! The plugins' modules share this one's imports (`use super::*`).

mod interpod;
mod node;
mod resources;
mod spread;

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use kube_util::{nodeaffinity, taints};
use rand::Rng;

use crate::cache::Cache;
use crate::interpod::{Preferred, Term};
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;
use crate::spread::Constraint;

use self::interpod::*;
use self::node::*;
use self::resources::*;
use self::spread::*;

/// Scores run from 0 to this (upstream `MaxNodeScore`).
pub const MAX_SCORE: i64 = 100;

/// How a profile scores: [`crate::profile`] fills it from a
/// KubeSchedulerConfiguration; `Default` is upstream's default profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Scoring {
    /// Plugin name (upstream's) -> weight; a plugin absent does not score.
    pub weights: std::collections::BTreeMap<String, i64>,
    /// NodeResourcesFit's scoringStrategy.
    pub fit: FitStrategy,
    /// InterPodAffinity's weight for existing pods' required affinity.
    pub hard_pod_affinity_weight: i64,
    /// PodTopologySpread's defaultConstraints (`List`); `None`: the system
    /// defaults (`System`).
    pub default_constraints: Option<Vec<k8s_openapi::api::core::v1::TopologySpreadConstraint>>,
}

/// NodeResourcesFit's scoring strategies, with (resource, weight) pairs.
#[derive(Debug, Clone, PartialEq)]
pub enum FitStrategy {
    LeastAllocated(Vec<(String, i64)>),
    MostAllocated(Vec<(String, i64)>),
    /// `shape`: (utilization, score) points, utilization increasing.
    RequestedToCapacityRatio {
        resources: Vec<(String, i64)>,
        shape: Vec<(i64, i64)>,
    },
}

/// The score plugins, by upstream's names, with their default weights.
const DEFAULT_WEIGHTS: &[(&str, i64)] = &[
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodeResourcesFit", 1),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("InterPodAffinity", 2),
    ("PodTopologySpread", 2),
];

/// The score plugins this scheduler has.
pub const PLUGINS: &[&str] = &[
    "TaintToleration",
    "NodeAffinity",
    "NodeResourcesFit",
    "NodeResourcesBalancedAllocation",
    "ImageLocality",
    "InterPodAffinity",
    "PodTopologySpread",
];

/// A score plugin's weight in upstream's default profile (1 for one
/// enabled without a weight elsewhere).
pub fn default_weight(plugin: &str) -> i64 {
    DEFAULT_WEIGHTS
        .iter()
        .find(|(p, _)| *p == plugin)
        .map_or(1, |(_, w)| *w)
}

impl Default for Scoring {
    fn default() -> Self {
        Scoring {
            weights: DEFAULT_WEIGHTS
                .iter()
                .map(|(p, w)| (p.to_string(), *w))
                .collect(),
            fit: FitStrategy::LeastAllocated(vec![("cpu".into(), 1), ("memory".into(), 1)]),
            hard_pod_affinity_weight: 1,
            default_constraints: None,
        }
    }
}

/// Upstream `helper.DefaultNormalizeScore`: scale to the highest, and
/// flip when fewer is better (`reverse`).
fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0).max(0);
    for s in scores.iter_mut() {
        if max == 0 {
            if reverse {
                *s = MAX_SCORE;
            }
            continue;
        }
        let scaled = MAX_SCORE * *s / max;
        *s = if reverse { MAX_SCORE - scaled } else { scaled };
    }
}

/// What the scoring of one attempt needs of the other pods and nodes
/// (upstream's PreScore states), worked out once per attempt.
#[derive(Debug, Default)]
pub struct State {
    /// InterPodAffinity: weight per topology pair; `None`: no term
    /// concerns the pod (the plugin does not score).
    interpod: Option<Counts>,
    spread: Option<Spread>,
    /// ImageLocality: of each of the pod's images, how many nodes have it.
    image_nodes: HashMap<String, usize>,
    /// Nodes known (ImageLocality's spread denominator).
    nodes: usize,
}

impl State {
    /// Count for `pod` over the pods and nodes of `cache`, for the
    /// plugins `scoring` enables. Nothing is counted when there is no
    /// choice to make.
    pub fn prescore(
        pod: &PodInfo,
        cache: &Cache,
        feasible: &[&NodeInfo],
        scoring: &Scoring,
    ) -> State {
        let on = |p: &str| scoring.weights.get(p).is_some_and(|w| *w != 0);
        let mut state = State::default();
        if feasible.len() <= 1 {
            return state;
        }
        if on("InterPodAffinity") {
            state.interpod = interpod_prescore(pod, cache, scoring.hard_pod_affinity_weight);
        }
        if on("PodTopologySpread") {
            state.spread = spread_prescore(pod, cache, feasible, scoring);
        }
        if on("ImageLocality") && !pod.images.is_empty() {
            for node in cache.nodes().filter(|n| n.node.is_some()) {
                state.nodes += 1;
                for image in &pod.images {
                    if node.images.contains_key(image) {
                        *state.image_nodes.entry(image.clone()).or_insert(0) += 1;
                    }
                }
            }
        }
        state
    }
}

/// The best of `feasible` for `pod` under `scoring`, with `state` from
/// [`State::prescore`]; ties broken uniformly at random.
pub fn select<'a>(
    pod: &PodInfo,
    feasible: &[&'a NodeInfo],
    state: &State,
    scoring: &Scoring,
    rng: &mut impl Rng,
) -> Option<&'a NodeInfo> {
    if feasible.len() <= 1 {
        return feasible.first().copied();
    }
    let totals = scores(pod, feasible, state, scoring);
    let mut best: Option<&NodeInfo> = None;
    let mut best_score = i64::MIN;
    let mut ties = 0u32;
    for (&node, &score) in feasible.iter().zip(&totals) {
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

/// Each feasible node's total: the weighted sum of the normalised plugin
/// scores. A plugin weighted 0 (or absent) is not run.
pub fn scores(pod: &PodInfo, feasible: &[&NodeInfo], state: &State, scoring: &Scoring) -> Vec<i64> {
    let weight = |p: &str| scoring.weights.get(p).copied().unwrap_or(0);
    let each = |f: &dyn Fn(&NodeInfo) -> i64| feasible.iter().map(|n| f(n)).collect::<Vec<_>>();
    let mut totals = vec![0i64; feasible.len()];
    let mut add = |w: i64, scores: Vec<i64>| {
        for (t, s) in totals.iter_mut().zip(scores) {
            *t += w * s;
        }
    };
    let w = weight("NodeResourcesFit");
    if w != 0 {
        let shape: Vec<(i64, i64)> = match &scoring.fit {
            FitStrategy::RequestedToCapacityRatio { shape, .. } => shape
                .iter()
                .map(|(u, s)| (*u, s * (MAX_SCORE / MAX_CUSTOM_SCORE)))
                .collect(),
            _ => Vec::new(),
        };
        add(w, each(&|n| fit(pod, n, &scoring.fit, &shape)));
    }
    let w = weight("NodeResourcesBalancedAllocation");
    // Upstream skips best-effort pods here: they would all pile onto
    // the node whose shares are most alike.
    if w != 0 && (pod.requests.cpu != 0 || pod.requests.memory != 0) {
        add(w, each(&|n| balanced(pod, n)));
    }
    let w = weight("InterPodAffinity");
    if let Some(counts) = state.interpod.as_ref().filter(|_| w != 0) {
        let mut scores = each(&|n| interpod_score(counts, n));
        min_max_normalize(&mut scores);
        add(w, scores);
    }
    let w = weight("PodTopologySpread");
    if let Some(spread) = state.spread.as_ref().filter(|_| w != 0) {
        let raw: Vec<Option<i64>> = feasible.iter().map(|n| spread_score(spread, n)).collect();
        add(w, spread_normalize(&raw));
    }
    let w = weight("NodeAffinity");
    if w != 0 {
        let mut scores = each(&|n| node_affinity(pod, n));
        default_normalize(&mut scores, false);
        add(w, scores);
    }
    let w = weight("TaintToleration");
    if w != 0 {
        let mut scores = each(&|n| intolerable(pod, n));
        default_normalize(&mut scores, true);
        add(w, scores);
    }
    let w = weight("ImageLocality");
    if w != 0 {
        add(w, each(&|n| image_locality(pod, n, state)));
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use rand::SeedableRng;
    use serde_json::{json, Value};

    fn node_with(name: &str, cpu: &str, memory: &str, extra: Value) -> NodeInfo {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}
        });
        for (k, x) in extra.as_object().unwrap() {
            for (k2, x2) in x.as_object().unwrap() {
                v[k][k2] = x2.clone();
            }
        }
        let mut n = NodeInfo::new(name);
        n.set_node(serde_json::from_value::<Node>(v).unwrap());
        n
    }

    fn node(name: &str, cpu: &str, memory: &str) -> NodeInfo {
        node_with(name, cpu, memory, json!({}))
    }

    fn pod_with(cpu: &str, memory: &str, spec: Value) -> PodInfo {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "app",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
        });
        for (k, x) in spec.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        PodInfo::new(serde_json::from_value::<Pod>(v).unwrap())
    }

    fn pod(cpu: &str, memory: &str) -> PodInfo {
        pod_with(cpu, memory, json!({}))
    }

    fn least() -> FitStrategy {
        Scoring::default().fit
    }

    #[test]
    fn least_allocated_as_upstream() {
        // Upstream's "nothing scheduled, resources requested, differently
        // sized nodes": 37 and 50.
        let p = pod("3000m", "5000");
        let (n1, n2) = (node("n1", "4000m", "10000"), node("n2", "6000m", "10000"));
        assert_eq!(fit(&p, &n1, &least(), &[]), 37);
        assert_eq!(fit(&p, &n2, &least(), &[]), 50);
        assert_eq!(least_requested(5, 4), 0);
        assert_eq!(least_requested(1, 0), 0);
    }

    #[test]
    fn most_allocated_as_upstream() {
        // Upstream's "nothing scheduled, resources requested, differently
        // sized nodes": 22 and 18.
        let most = FitStrategy::MostAllocated(vec![("cpu".into(), 1), ("memory".into(), 1)]);
        let p = pod("1000m", "2000");
        assert_eq!(fit(&p, &node("n1", "4000m", "10000"), &most, &[]), 22);
        assert_eq!(fit(&p, &node("n2", "6000m", "10000"), &most, &[]), 18);
        assert_eq!(most_requested(5, 4), MAX_SCORE);
    }

    #[test]
    fn requested_to_capacity_ratio() {
        let rtcr = FitStrategy::RequestedToCapacityRatio {
            resources: vec![("cpu".into(), 1), ("memory".into(), 1)],
            shape: vec![(0, 0), (100, 10)],
        };
        let scoring = Scoring {
            fit: rtcr.clone(),
            ..Scoring::default()
        };
        let p = pod("3000m", "5000");
        let n = node("n1", "4000m", "10000");
        // cpu 75% -> 75, memory 50% -> 50: the mean 62.5 rounds up.
        let shape = [(0, 0), (100, 100)];
        assert_eq!(fit(&p, &n, &rtcr, &shape), 63);
        let feasible = [&n, &n];
        let only_fit = Scoring {
            weights: [("NodeResourcesFit".to_string(), 1)].into(),
            ..scoring
        };
        assert_eq!(
            scores(&p, &feasible, &State::default(), &only_fit),
            vec![63, 63]
        );
        // Extended resources count when the pod asks for them.
        let gpu = FitStrategy::RequestedToCapacityRatio {
            resources: vec![("example.com/gpu".into(), 1)],
            shape: vec![(0, 0), (100, 10)],
        };
        let n = node_with(
            "g",
            "4",
            "1Gi",
            json!({"status": {"allocatable": {
            "cpu": "4", "memory": "1Gi", "pods": "110", "example.com/gpu": "4"}}}),
        );
        let p = pod_with(
            "1",
            "1Mi",
            json!({"containers": [{"name": "c", "resources": {
            "requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}}}]}),
        );
        assert_eq!(fit(&p, &n, &gpu, &shape), 25);
        assert_eq!(fit(&pod("1", "1Mi"), &n, &gpu, &shape), 0);
    }

    #[test]
    fn broken_linear_shape() {
        let shape = [(0, 0), (50, 100), (100, 0)];
        assert_eq!(broken_linear(&shape, 25), 50);
        assert_eq!(broken_linear(&shape, 50), 100);
        assert_eq!(broken_linear(&shape, 75), 50);
        assert_eq!(broken_linear(&[(10, 30), (20, 50)], 5), 30);
        assert_eq!(broken_linear(&[(10, 30), (20, 50)], 90), 50);
    }

    #[test]
    fn balanced_allocation_as_upstream() {
        // Upstream's "nothing scheduled, resources requested, differently
        // sized nodes": 87 and 100.
        let p = pod("3000m", "5000");
        assert_eq!(balanced(&p, &node("n1", "4000m", "10000")), 87);
        assert_eq!(balanced(&p, &node("n2", "6000m", "10000")), 100);
        // Shares over 1 count as 1.
        assert_eq!(balanced(&pod("8", "5000"), &node("n3", "4", "10000")), 75);
    }

    #[test]
    fn normalisations() {
        let mut s = [0, 5, 10];
        default_normalize(&mut s, false);
        assert_eq!(s, [0, 50, 100]);
        let mut s = [0, 1, 2];
        default_normalize(&mut s, true);
        assert_eq!(s, [100, 50, 0]);
        let mut s = [0, 0];
        default_normalize(&mut s, true);
        assert_eq!(s, [100, 100]);
        let mut s = [-10, 0, 10, 10];
        min_max_normalize(&mut s);
        assert_eq!(s, [0, 50, 100, 100]);
        assert_eq!(
            spread_normalize(&[Some(1), Some(3), None]),
            vec![100, 33, 0]
        );
        assert_eq!(spread_normalize(&[Some(0), Some(0)]), vec![100, 100]);
    }

    #[test]
    fn node_affinity_sums_matching_weights() {
        let p = pod_with(
            "1",
            "1Mi",
            json!({"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [
                    {"key": "disk", "operator": "In", "values": ["ssd"]}]}},
                {"weight": 5, "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a"]}]}},
                {"weight": 7, "preference": {}}]}}}),
        );
        let a = node_with(
            "a",
            "4",
            "1Gi",
            json!({"metadata": {"labels": {
            "kubernetes.io/hostname": "a", "disk": "ssd"}}}),
        );
        let b = node("b", "4", "1Gi");
        assert_eq!(node_affinity(&p, &a), 15);
        assert_eq!(node_affinity(&p, &b), 0);
    }

    #[test]
    fn prefer_no_schedule_taints() {
        let tainted = node_with(
            "t",
            "4",
            "1Gi",
            json!({"spec": {"taints": [
            {"key": "a", "value": "x", "effect": "PreferNoSchedule"},
            {"key": "b", "effect": "PreferNoSchedule"},
            {"key": "c", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(intolerable(&pod("1", "1Mi"), &tainted), 2);
        let tolerant = pod_with(
            "1",
            "1Mi",
            json!({"tolerations": [
            {"key": "a", "operator": "Exists", "effect": "PreferNoSchedule"},
            // Tolerations for another effect do not count.
            {"key": "b", "operator": "Exists", "effect": "NoSchedule"}]}),
        );
        assert_eq!(intolerable(&tolerant, &tainted), 1);
        let all = pod_with("1", "1Mi", json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(intolerable(&all, &tainted), 0);
    }

    #[test]
    fn image_locality_scales_by_spread() {
        let with_image = |name: &str| {
            node_with(
                name,
                "4",
                "1Gi",
                json!({"status": {"allocatable": {"cpu": "4",
                "memory": "1Gi", "pods": "110"},
                "images": [{"names": ["app:latest", "app@sha256:1"], "sizeBytes": 500 * MB}]}}),
            )
        };
        let (a, b) = (with_image("a"), node("b", "4", "1Gi"));
        let p = pod("1", "1Mi");
        let state = State {
            image_nodes: [("app:latest".to_string(), 1)].into(),
            nodes: 2,
            ..State::default()
        };
        // 500 MB on one node of two: 250 MB, (250 - 23) * 100 / (1000 - 23).
        assert_eq!(image_locality(&p, &a, &state), 23);
        assert_eq!(image_locality(&p, &b, &state), 0);
        let everywhere = State {
            image_nodes: [("app:latest".to_string(), 1)].into(),
            nodes: 1,
            ..State::default()
        };
        assert_eq!(image_locality(&p, &a, &everywhere), 48);
    }

    #[test]
    fn ties_are_shared() {
        let nodes: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"), "4", "4Gi")).collect();
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let p = pod("100m", "1Gi");
        let scoring = Scoring::default();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let chosen = select(&p, &refs, &State::default(), &scoring, &mut rng);
            seen.insert(chosen.unwrap().name.clone());
        }
        assert_eq!(seen.len(), 4, "every tied node gets picked: {seen:?}");
        assert!(select(&p, &[], &State::default(), &scoring, &mut rng).is_none());
    }

    #[test]
    fn weights_add_up() {
        // The emptier node wins on resources; a preferred node affinity
        // (weight 2) for the other outweighs that.
        let big = node("big", "8", "8Gi");
        let small = node_with(
            "small",
            "4",
            "8Gi",
            json!({"metadata": {"labels": {"disk": "ssd"}}}),
        );
        let plain = pod("1", "64Mi");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let scoring = Scoring::default();
        let chosen = select(
            &plain,
            &[&small, &big],
            &State::default(),
            &scoring,
            &mut rng,
        );
        assert_eq!(chosen.unwrap().name, "big");
        let prefers = pod_with(
            "1",
            "64Mi",
            json!({"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                "matchExpressions": [{"key": "disk", "operator": "Exists"}]}}]}}}),
        );
        let chosen = select(
            &prefers,
            &[&small, &big],
            &State::default(),
            &scoring,
            &mut rng,
        );
        assert_eq!(chosen.unwrap().name, "small");
        let totals = scores(&prefers, &[&small, &big], &State::default(), &scoring);
        // small: fit (75 + 99) / 2 = 87, balanced 87, affinity 2 x 100,
        // taints 3 x 100, no images 0.
        assert_eq!(totals[0], 87 + 87 + 200 + 300);
        let off = Scoring {
            weights: [("NodeAffinity".to_string(), 0)].into(),
            ..Scoring::default()
        };
        assert_eq!(
            scores(&prefers, &[&small, &big], &State::default(), &off),
            vec![0, 0]
        );
    }

    #[test]
    fn image_names() {
        use crate::podinfo::normalized_image;
        assert_eq!(normalized_image("nginx"), "nginx:latest");
        assert_eq!(
            normalized_image("host:5000/nginx"),
            "host:5000/nginx:latest"
        );
        assert_eq!(normalized_image("nginx:1.2"), "nginx:1.2");
    }
}
