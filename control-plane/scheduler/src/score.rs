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

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use kube_util::{nodeaffinity, taints};
use rand::Rng;

use crate::cache::Cache;
use crate::interpod::Term;
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;
use crate::spread::Constraint;

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

/// Upstream `MaxCustomPriorityScore`: RequestedToCapacityRatio's shape
/// scores run 0..10 in the configuration, scaled here to 0..[`MAX_SCORE`].
const MAX_CUSTOM_SCORE: i64 = 10;
/// Utilization in the shape runs 0..100 (percent).
const MAX_UTILIZATION: i64 = 100;

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// ImageLocality's bounds: below this much already on the node there is
/// no gain, and a container's image counts up to the other.
const MB: i64 = 1024 * 1024;
const MIN_IMAGE_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_IMAGE_THRESHOLD: i64 = 1000 * MB;

/// Upstream `leastRequestedScore`: the share of the node left free after
/// placing the pod, 0 when over capacity.
fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_SCORE / capacity
}

/// Upstream `mostRequestedScore`: the share used, capped at full.
fn most_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 {
        return 0;
    }
    requested.min(capacity) * MAX_SCORE / capacity
}

/// Upstream `buildBrokenLinearFunction`: the shape's score at
/// utilization `p`, linear between points, flat beyond the ends.
fn broken_linear(shape: &[(i64, i64)], p: i64) -> i64 {
    for (i, &(utilization, score)) in shape.iter().enumerate() {
        if p <= utilization {
            let Some(&(u0, s0)) = i.checked_sub(1).and_then(|j| shape.get(j)) else {
                return score;
            };
            // p > u0 here (the previous point did not take it), so the
            // divisor is positive.
            return s0 + (score - s0) * (p - u0) / (utilization - u0);
        }
    }
    shape.last().map_or(0, |&(_, s)| s)
}

/// (requested with the pod, allocatable) of `resource` on `node`, or
/// `None` when it does not count (upstream's
/// `calculateResourceAllocatableRequest`): the node has none of it, or
/// it is an extended resource the pod does not ask for. `non_zero`: CPU
/// and memory with the defaults for pods without requests
/// (NodeResourcesFit), else plain requests (BalancedAllocation).
fn allocation(
    pod: &PodInfo,
    node: &NodeInfo,
    resource: &str,
    non_zero: bool,
) -> Option<(i64, i64)> {
    let (requested, allocatable) = match resource {
        "cpu" if non_zero => (node.non_zero_cpu + pod.non_zero_cpu, node.allocatable.cpu),
        "cpu" => (node.requested.cpu + pod.requests.cpu, node.allocatable.cpu),
        "memory" if non_zero => (
            node.non_zero_memory + pod.non_zero_memory,
            node.allocatable.memory,
        ),
        "memory" => (
            node.requested.memory + pod.requests.memory,
            node.allocatable.memory,
        ),
        "ephemeral-storage" => (
            node.requested.scalar(resource) + pod.requests.scalar(resource),
            node.allocatable.scalar(resource),
        ),
        other => {
            let asked = pod.requests.scalar(other);
            if asked == 0 {
                return None;
            }
            (
                node.requested.scalar(other) + asked,
                node.allocatable.scalar(other),
            )
        }
    };
    (allocatable != 0).then_some((requested, allocatable))
}

/// Weighted mean over `resources` of `score` (integer division, as
/// upstream's least and most allocated scorers).
fn weighted(
    pod: &PodInfo,
    node: &NodeInfo,
    resources: &[(String, i64)],
    score: fn(i64, i64) -> i64,
) -> i64 {
    let (mut sum, mut weights) = (0, 0);
    for (resource, weight) in resources {
        if let Some((requested, allocatable)) = allocation(pod, node, resource, true) {
            sum += score(requested, allocatable) * weight;
            weights += weight;
        }
    }
    if weights == 0 {
        0
    } else {
        sum / weights
    }
}

/// NodeResourcesFit's score of `node` for `pod`. `shape`: the
/// RequestedToCapacityRatio shape already scaled to 0..100.
fn fit(pod: &PodInfo, node: &NodeInfo, strategy: &FitStrategy, shape: &[(i64, i64)]) -> i64 {
    match strategy {
        FitStrategy::LeastAllocated(r) => weighted(pod, node, r, least_requested),
        FitStrategy::MostAllocated(r) => weighted(pod, node, r, most_requested),
        FitStrategy::RequestedToCapacityRatio { resources, .. } => {
            let (mut sum, mut weights) = (0, 0);
            for (resource, weight) in resources {
                let Some((requested, allocatable)) = allocation(pod, node, resource, true) else {
                    continue;
                };
                let utilization = if requested > allocatable {
                    MAX_UTILIZATION
                } else {
                    requested * MAX_UTILIZATION / allocatable
                };
                let score = broken_linear(shape, utilization);
                // Upstream leaves resources scoring 0 out of the mean.
                if score > 0 {
                    sum += score * weight;
                    weights += weight;
                }
            }
            if weights == 0 {
                0
            } else {
                (sum as f64 / weights as f64).round() as i64
            }
        }
    }
}

/// NodeResourcesBalancedAllocation: 100 x (1 - the standard deviation of
/// the CPU and memory shares the node would have in use).
fn balanced(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let fractions: Vec<f64> = ["cpu", "memory"]
        .iter()
        .filter_map(|r| allocation(pod, node, r, false))
        .map(|(requested, allocatable)| (requested as f64 / allocatable as f64).min(1.0))
        .collect();
    let std = match fractions[..] {
        [a, b] => ((a - b) / 2.0).abs(),
        _ => 0.0,
    };
    ((1.0 - std) * MAX_SCORE as f64) as i64
}

/// NodeAffinity: the summed weights of the preferred node affinity terms
/// the node matches.
fn node_affinity(pod: &PodInfo, node: &NodeInfo) -> i64 {
    pod.spec()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .filter(|t| {
            t.weight != 0 && nodeaffinity::term_matches(&t.preference, node.labels(), &node.name)
        })
        .map(|t| i64::from(t.weight))
        .sum()
}

/// TaintToleration: the node's PreferNoSchedule taints that none of the
/// pod's tolerations for that effect (or for every effect) tolerates.
fn intolerable(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let tolerations: Vec<_> = pod
        .spec()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| matches!(t.effect.as_deref(), None | Some("" | "PreferNoSchedule")))
        .cloned()
        .collect();
    node.taints()
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule" && !taints::tolerated(&tolerations, t))
        .count() as i64
}

/// ImageLocality: the sizes of the pod's images the node already has,
/// each scaled by the share of nodes that have it (so that an image on
/// every node does not pull every pod to the same few), between the
/// thresholds.
fn image_locality(pod: &PodInfo, node: &NodeInfo, state: &State) -> i64 {
    if state.nodes == 0 || pod.images.is_empty() {
        return 0;
    }
    let mut sum = 0;
    for image in &pod.images {
        if let (Some(size), Some(n)) = (node.images.get(image), state.image_nodes.get(image)) {
            sum += (*size as f64 * (*n as f64 / state.nodes as f64)) as i64;
        }
    }
    let max = MAX_CONTAINER_IMAGE_THRESHOLD * pod.images.len() as i64;
    let sum = sum.clamp(MIN_IMAGE_THRESHOLD, max);
    MAX_SCORE * (sum - MIN_IMAGE_THRESHOLD) / (max - MIN_IMAGE_THRESHOLD)
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

/// InterPodAffinity's normalisation: min-max over the candidates (scores
/// may be negative).
fn min_max_normalize(scores: &mut [i64]) {
    let min = scores.iter().copied().min().unwrap_or(0);
    let max = scores.iter().copied().max().unwrap_or(0);
    let diff = max - min;
    for s in scores.iter_mut() {
        *s = if diff > 0 {
            (MAX_SCORE as f64 * ((*s - min) as f64 / diff as f64)) as i64
        } else {
            0
        };
    }
}

/// PodTopologySpread's normalisation: fewer matching pods is better;
/// ignored nodes (`None`: missing a required key) score 0.
fn spread_normalize(raw: &[Option<i64>]) -> Vec<i64> {
    let min = raw.iter().flatten().copied().min().unwrap_or(i64::MAX);
    let max = raw.iter().flatten().copied().max().unwrap_or(0).max(0);
    raw.iter()
        .map(|s| match s {
            None => 0,
            Some(_) if max == 0 => MAX_SCORE,
            Some(s) => MAX_SCORE * (max + min - s) / max,
        })
        .collect()
}

/// Matching pods per topology key, then value.
type Counts = HashMap<String, HashMap<String, i64>>;

fn add(counts: &mut Counts, key: &str, value: &str, n: i64) {
    *counts
        .entry(key.to_string())
        .or_default()
        .entry(value.to_string())
        .or_insert(0) += n;
}

/// One ScheduleAnyway constraint as counted for an attempt.
#[derive(Debug)]
struct Soft {
    constraint: Constraint,
    /// Count the pods of this controller (the default constraints);
    /// `None`: those the constraint's selector matches.
    owner: Option<String>,
    /// Matching pods per value of the key (not for the hostname key,
    /// counted per node).
    values: HashMap<String, i64>,
    /// Matching pods per node name, for selector constraints.
    per_node: HashMap<String, i64>,
    /// Upstream `topologyNormalizingWeight`: ln(domains + 2), so that
    /// constraints over few domains do not outweigh those over many.
    weight: f64,
}

impl Soft {
    fn on_node(&self, node: &NodeInfo) -> i64 {
        match &self.owner {
            Some(uid) => i64::from(node.owner_count(uid)),
            None => self.per_node.get(&node.name).copied().unwrap_or(0),
        }
    }
}

/// PodTopologySpread's PreScore state.
#[derive(Debug)]
struct Spread {
    constraints: Vec<Soft>,
    /// Feasible nodes lacking a key (when every key is required).
    ignored: HashSet<String>,
}

/// Upstream's system default constraints (`defaultingType: System`).
fn system_defaults() -> Vec<TopologySpreadConstraint> {
    [(HOSTNAME, 3), (ZONE, 5)]
        .into_iter()
        .map(|(key, max_skew)| TopologySpreadConstraint {
            max_skew,
            topology_key: key.to_string(),
            when_unsatisfiable: "ScheduleAnyway".to_string(),
            ..Default::default()
        })
        .collect()
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

/// InterPodAffinity's PreScore: the pod's preferred terms against the
/// placed pods (matched per label group), and the placed pods' required
/// affinity (at `hard_weight`) and preferred terms against the pod.
fn interpod_prescore(pod: &PodInfo, cache: &Cache, hard_weight: i64) -> Option<Counts> {
    let mut counts = Counts::new();
    if let Some(preferred) = pod.preferred.as_deref() {
        let weighted = preferred
            .affinity
            .iter()
            .map(|(w, t)| (*w, t))
            .chain(preferred.anti_affinity.iter().map(|(w, t)| (-*w, t)));
        let weighted: Vec<(i64, &Term)> = weighted.collect();
        for group in cache.label_groups() {
            for (weight, term) in &weighted {
                if !term.matches(&group.namespace, Some(&group.labels)) {
                    continue;
                }
                for (name, n) in &group.nodes {
                    let Some((_, labels)) = cache.node_labels(name) else {
                        continue;
                    };
                    if let Some(value) = labels.get(&term.topology_key) {
                        add(
                            &mut counts,
                            &term.topology_key,
                            value,
                            weight * i64::from(n.pods),
                        );
                    }
                }
            }
        }
    }
    for (other, node) in cache.pods_with_affinity() {
        let required = other
            .terms
            .as_deref()
            .map(|t| t.affinity.as_slice())
            .filter(|_| hard_weight > 0)
            .unwrap_or_default();
        let preferred = other.preferred.as_deref();
        if (required.is_empty() && preferred.is_none()) || other.uid == pod.uid {
            continue;
        }
        let Some((_, labels)) = cache.node_labels(node) else {
            continue;
        };
        let weighted = required.iter().map(|t| (hard_weight, t));
        let weighted = weighted.chain(preferred.into_iter().flat_map(|p| {
            p.affinity
                .iter()
                .map(|(w, t)| (*w, t))
                .chain(p.anti_affinity.iter().map(|(w, t)| (-*w, t)))
        }));
        for (weight, term) in weighted {
            if let Some(value) = labels.get(&term.topology_key) {
                if term.matches_pod(pod) {
                    add(&mut counts, &term.topology_key, value, weight);
                }
            }
        }
    }
    (!counts.is_empty()).then_some(counts)
}

fn interpod_score(counts: &Counts, node: &NodeInfo) -> i64 {
    let Some(labels) = node.labels() else {
        return 0;
    };
    counts
        .iter()
        .filter_map(|(key, values)| values.get(labels.get(key)?))
        .sum()
}

/// PodTopologySpread's PreScore. A pod with constraints of its own is
/// scored by its ScheduleAnyway ones (none: not at all); a pod without
/// any by the default constraints. Upstream selects the pods those count
/// by the Services, ReplicationControllers, ReplicaSets and StatefulSets
/// that select the pod; this scheduler watches none of those, so they
/// count the pods of the pod's controller (same controller
/// ownerReference uid), and a pod without one is not spread.
fn spread_prescore(
    pod: &PodInfo,
    cache: &Cache,
    feasible: &[&NodeInfo],
    scoring: &Scoring,
) -> Option<Spread> {
    let (mut constraints, require_all): (Vec<Soft>, bool) = if pod.has_spread_constraints {
        let soft = pod.soft_spread.iter().map(|c| (c.clone(), None)).collect();
        (soft_states(soft), true)
    } else {
        let owner = pod.owner.as_ref()?;
        let (list, system) = match &scoring.default_constraints {
            Some(list) => (list.clone(), false),
            None => (system_defaults(), true),
        };
        let soft = list
            .iter()
            .filter(|c| c.when_unsatisfiable == "ScheduleAnyway")
            .map(|c| (Constraint::new(c, pod.labels()), Some(owner.clone())))
            .collect();
        // The system defaults also spread over nodes without a zone.
        (soft_states(soft), !system)
    };
    if constraints.is_empty() {
        return None;
    }
    let has_keys = |labels: Option<&BTreeMap<String, String>>, constraints: &[Soft]| {
        constraints
            .iter()
            .all(|s| labels.is_some_and(|l| l.contains_key(&s.constraint.topology_key)))
    };
    let mut ignored = HashSet::new();
    for node in feasible {
        if require_all && !has_keys(node.labels(), &constraints) {
            ignored.insert(node.name.clone());
            continue;
        }
        for s in constraints
            .iter_mut()
            .filter(|s| s.constraint.topology_key != HOSTNAME)
        {
            let value = node
                .labels()
                .and_then(|l| l.get(&s.constraint.topology_key))
                .map_or("", String::as_str);
            if !s.values.contains_key(value) {
                s.values.insert(value.to_string(), 0);
            }
        }
    }
    let candidates = feasible.len() - ignored.len();
    for s in constraints.iter_mut() {
        let domains = if s.constraint.topology_key == HOSTNAME {
            candidates
        } else {
            s.values.len()
        };
        s.weight = ((domains + 2) as f64).ln();
    }
    if constraints.iter().any(|s| s.owner.is_none()) {
        for group in cache
            .label_groups()
            .filter(|g| g.namespace == pod.namespace)
        {
            for s in constraints.iter_mut().filter(|s| s.owner.is_none()) {
                if !s.constraint.matches(Some(&group.labels)) {
                    continue;
                }
                for (name, n) in &group.nodes {
                    *s.per_node.entry(name.clone()).or_insert(0) +=
                        i64::from(n.pods - n.terminating);
                }
            }
        }
    }
    for node in cache.nodes().filter(|n| n.node.is_some()) {
        let labels = node.labels();
        if require_all && !has_keys(labels, &constraints) {
            continue;
        }
        for s in constraints
            .iter_mut()
            .filter(|s| s.constraint.topology_key != HOSTNAME)
        {
            let value = labels
                .and_then(|l| l.get(&s.constraint.topology_key))
                .map_or("", String::as_str);
            if !s.values.contains_key(value) || !s.constraint.includes(&pod.pod, node) {
                continue;
            }
            let n = s.on_node(node);
            if let Some(count) = s.values.get_mut(value) {
                *count += n;
            }
        }
    }
    Some(Spread {
        constraints,
        ignored,
    })
}

fn soft_states(list: Vec<(Constraint, Option<String>)>) -> Vec<Soft> {
    list.into_iter()
        .map(|(constraint, owner)| Soft {
            constraint,
            owner,
            values: HashMap::new(),
            per_node: HashMap::new(),
            weight: 0.0,
        })
        .collect()
}

/// Upstream's score of a node for PodTopologySpread before
/// normalisation: per constraint, the matching pods in the node's domain
/// (weighted by the domain count) plus maxSkew - 1.
fn spread_score(spread: &Spread, node: &NodeInfo) -> Option<i64> {
    if spread.ignored.contains(&node.name) {
        return None;
    }
    let mut score = 0.0;
    for s in &spread.constraints {
        let Some(value) = node
            .labels()
            .and_then(|l| l.get(&s.constraint.topology_key))
        else {
            continue;
        };
        let count = if s.constraint.topology_key == HOSTNAME {
            s.on_node(node)
        } else {
            s.values.get(value).copied().unwrap_or(0)
        };
        score += count as f64 * s.weight + (s.constraint.max_skew - 1) as f64;
    }
    Some(score.round() as i64)
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
