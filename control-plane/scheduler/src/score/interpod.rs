//! InterPodAffinity: the pod's preferred terms toward placed pods, and
//! placed pods' terms toward it.

use super::*;

/// InterPodAffinity's normalisation: min-max over the candidates (scores
/// may be negative).
pub(super) fn min_max_normalize(scores: &mut [i64]) {
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

/// Matching pods per topology key, then value.
pub(super) type Counts = HashMap<String, HashMap<String, i64>>;

pub(super) fn add(counts: &mut Counts, key: &str, value: &str, n: i64) {
    *counts
        .entry(key.to_string())
        .or_default()
        .entry(value.to_string())
        .or_insert(0) += n;
}

/// InterPodAffinity's PreScore: the pod's preferred terms against the
/// placed pods (matched per label group), and the placed pods' required
/// affinity (at `hard_weight`) and preferred terms against the pod.
pub(super) fn interpod_prescore(pod: &PodInfo, cache: &Cache, hard_weight: i64) -> Option<Counts> {
    let mut counts = Counts::new();
    if let Some(preferred) = pod.preferred.as_deref() {
        let weighted: Vec<(i64, &Term)> = preferred.signed().collect();
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
        let weighted = weighted.chain(preferred.into_iter().flat_map(Preferred::signed));
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

pub(super) fn interpod_score(counts: &Counts, node: &NodeInfo) -> i64 {
    let Some(labels) = node.labels() else {
        return 0;
    };
    counts
        .iter()
        .filter_map(|(key, values)| values.get(labels.get(key)?))
        .sum()
}
