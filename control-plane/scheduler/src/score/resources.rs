//! NodeResourcesFit (LeastAllocated, MostAllocated,
//! RequestedToCapacityRatio) and NodeResourcesBalancedAllocation: how
//! full the node would be with the pod.

use super::*;

/// Upstream `MaxCustomPriorityScore`: RequestedToCapacityRatio's shape
/// scores run 0..10 in the configuration, scaled here to 0..[`MAX_SCORE`].
pub(super) const MAX_CUSTOM_SCORE: i64 = 10;
/// Utilization in the shape runs 0..100 (percent).
pub(super) const MAX_UTILIZATION: i64 = 100;

/// Upstream `leastRequestedScore`: the share of the node left free after
/// placing the pod, 0 when over capacity.
pub(super) fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_SCORE / capacity
}

/// Upstream `mostRequestedScore`: the share used, capped at full.
pub(super) fn most_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 {
        return 0;
    }
    requested.min(capacity) * MAX_SCORE / capacity
}

/// Upstream `buildBrokenLinearFunction`: the shape's score at
/// utilization `p`, linear between points, flat beyond the ends.
pub(super) fn broken_linear(shape: &[(i64, i64)], p: i64) -> i64 {
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
pub(super) fn allocation(
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
pub(super) fn weighted(
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
pub(super) fn fit(
    pod: &PodInfo,
    node: &NodeInfo,
    strategy: &FitStrategy,
    shape: &[(i64, i64)],
) -> i64 {
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
pub(super) fn balanced(pod: &PodInfo, node: &NodeInfo) -> i64 {
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
