//! PodTopologySpread: the pod's `ScheduleAnyway` constraints, or the
//! default ones.

use super::*;

pub(super) const HOSTNAME: &str = "kubernetes.io/hostname";
pub(super) const ZONE: &str = "topology.kubernetes.io/zone";

/// PodTopologySpread's normalisation: fewer matching pods is better;
/// ignored nodes (`None`: missing a required key) score 0.
pub(super) fn spread_normalize(raw: &[Option<i64>]) -> Vec<i64> {
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

/// One ScheduleAnyway constraint as counted for an attempt.
#[derive(Debug)]
pub(super) struct Soft {
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
pub(super) struct Spread {
    constraints: Vec<Soft>,
    /// Feasible nodes lacking a key (when every key is required).
    ignored: HashSet<String>,
}

/// Upstream's system default constraints (`defaultingType: System`).
pub(super) fn system_defaults() -> Vec<TopologySpreadConstraint> {
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

/// PodTopologySpread's PreScore. A pod with constraints of its own is
/// scored by its ScheduleAnyway ones (none: not at all); a pod without
/// any by the default constraints. Upstream selects the pods those count
/// by the Services, ReplicationControllers, ReplicaSets and StatefulSets
/// that select the pod; this scheduler watches none of those, so they
/// count the pods of the pod's controller (same controller
/// ownerReference uid), and a pod without one is not spread.
pub(super) fn spread_prescore(
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

pub(super) fn soft_states(list: Vec<(Constraint, Option<String>)>) -> Vec<Soft> {
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
pub(super) fn spread_score(spread: &Spread, node: &NodeInfo) -> Option<i64> {
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
