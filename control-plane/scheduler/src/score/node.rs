//! What the node itself offers: NodeAffinity's preferred terms,
//! TaintToleration's `PreferNoSchedule` taints, ImageLocality's images.

use super::*;

/// ImageLocality's bounds: below this much already on the node there is
/// no gain, and a container's image counts up to the other.
pub(super) const MB: i64 = 1024 * 1024;
pub(super) const MIN_IMAGE_THRESHOLD: i64 = 23 * MB;
pub(super) const MAX_CONTAINER_IMAGE_THRESHOLD: i64 = 1000 * MB;

/// NodeAffinity: the summed weights of the preferred node affinity terms
/// the node matches.
pub(super) fn node_affinity(pod: &PodInfo, node: &NodeInfo) -> i64 {
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
pub(super) fn intolerable(pod: &PodInfo, node: &NodeInfo) -> i64 {
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
pub(super) fn image_locality(pod: &PodInfo, node: &NodeInfo, state: &State) -> i64 {
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
