//! PodDisruptionBudgets as preemption reads them: per namespace, which
//! pods each selects and how many disruptions it still allows
//! (upstream's `getPodDisruptionBudgets` through the PDB lister). Fed by
//! the PDB watch; preemption prefers victims whose removal breaks none.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_util::informer::Change;
use kube_util::selector;

use crate::podinfo::PodInfo;

/// One budget's facts.
#[derive(Debug)]
struct Budget {
    selector: LabelSelector,
    /// `status.disruptionsAllowed`.
    allowed: i32,
    /// `status.disruptedPods`: evictions the controller has not yet seen
    /// through; they were charged already.
    disrupted: HashSet<String>,
}

/// Every budget, by namespace, then by name.
#[derive(Debug, Default)]
pub struct Budgets {
    by_namespace: HashMap<String, BTreeMap<String, Budget>>,
    /// `namespace/name` seen since a re-list started.
    relist: Option<HashSet<(String, String)>>,
}

/// What removing some pods costs the budgets: how many disruptions each
/// still allows, counted down as victims are chosen.
#[derive(Debug, Clone)]
pub struct Allowance(HashMap<(String, String), i32>);

impl Budgets {
    pub fn apply(&mut self, change: Change<PodDisruptionBudget>) {
        match change {
            Change::Relisting => self.relist = Some(HashSet::new()),
            Change::Applied(pdb) => {
                let (ns, name) = names(&pdb);
                if let Some(seen) = &mut self.relist {
                    seen.insert((ns.clone(), name.clone()));
                }
                match budget(&pdb) {
                    Some(b) => {
                        self.by_namespace.entry(ns).or_default().insert(name, b);
                    }
                    None => self.remove(&ns, &name),
                }
            }
            Change::Deleted(pdb) => {
                let (ns, name) = names(&pdb);
                self.remove(&ns, &name);
            }
            Change::Listed => {
                if let Some(seen) = self.relist.take() {
                    let namespaces: Vec<String> = self.by_namespace.keys().cloned().collect();
                    for ns in namespaces {
                        if let Some(budgets) = self.by_namespace.get_mut(&ns) {
                            budgets.retain(|name, _| seen.contains(&(ns.clone(), name.clone())));
                            if budgets.is_empty() {
                                self.by_namespace.remove(&ns);
                            }
                        }
                    }
                }
            }
        }
    }

    fn remove(&mut self, ns: &str, name: &str) {
        if let Some(budgets) = self.by_namespace.get_mut(ns) {
            budgets.remove(name);
            if budgets.is_empty() {
                self.by_namespace.remove(ns);
            }
        }
    }

    /// The disruptions every budget allows now.
    pub fn allowance(&self) -> Allowance {
        Allowance(
            self.by_namespace
                .iter()
                .flat_map(|(ns, budgets)| {
                    budgets
                        .iter()
                        .map(move |(name, b)| ((ns.clone(), name.clone()), b.allowed))
                })
                .collect(),
        )
    }

    /// Charge the removal of `pod` to the budgets selecting it; true
    /// when one of them allows no more (upstream's
    /// `filterPodsWithPDBViolation`). A pod the budget already counts as
    /// disrupted costs nothing again.
    pub fn violates(&self, pod: &PodInfo, allowance: &mut Allowance) -> bool {
        let Some(budgets) = self.by_namespace.get(&pod.namespace) else {
            return false;
        };
        let labels = pod.labels();
        let mut violated = false;
        for (name, b) in budgets {
            // An empty selector selects nothing here, as upstream.
            if selector::is_empty(&b.selector) || !selector::matches(&b.selector, labels) {
                continue;
            }
            if b.disrupted.contains(&pod.name) {
                continue;
            }
            if let Some(left) = allowance.0.get_mut(&(pod.namespace.clone(), name.clone())) {
                *left -= 1;
                violated |= *left < 0;
            }
        }
        violated
    }
}

fn names(pdb: &PodDisruptionBudget) -> (String, String) {
    (
        pdb.metadata.namespace.clone().unwrap_or_default(),
        pdb.metadata.name.clone().unwrap_or_default(),
    )
}

/// A budget's facts; `None` for one whose selector is missing or does
/// not parse (it protects nothing).
fn budget(pdb: &PodDisruptionBudget) -> Option<Budget> {
    let selector = pdb.spec.as_ref()?.selector.clone()?;
    selector::selector(&selector).ok()?;
    let status = pdb.status.as_ref();
    Some(Budget {
        selector,
        allowed: status.and_then(|s| s.disruptions_allowed).unwrap_or(0),
        disrupted: status
            .and_then(|s| s.disrupted_pods.as_ref())
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    use std::sync::Arc;

    fn pdb(name: &str, allowed: i32) -> Change<PodDisruptionBudget> {
        Change::Applied(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1,
                           "expectedPods": 2, "disruptedPods": {"db-gone": "2026-01-01T00:00:00Z"}}
            }))
            .unwrap(),
        ))
    }

    fn pod(name: &str, app: &str) -> PodInfo {
        PodInfo::new(
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": app}},
                "spec": {"containers": [{"name": "c"}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn budgets_are_charged_per_victim() {
        let mut b = Budgets::default();
        b.apply(pdb("db", 1));
        let mut allowance = b.allowance();
        assert!(!b.violates(&pod("db-0", "db"), &mut allowance));
        assert!(b.violates(&pod("db-1", "db"), &mut allowance));
        assert!(
            !b.violates(&pod("db-gone", "db"), &mut allowance),
            "already disrupted"
        );
        assert!(!b.violates(&pod("web-0", "web"), &mut allowance));
    }

    #[test]
    fn relists_drop_what_is_gone() {
        let mut b = Budgets::default();
        b.apply(pdb("db", 0));
        b.apply(Change::Relisting);
        b.apply(Change::Listed);
        let mut allowance = b.allowance();
        assert!(!b.violates(&pod("db-0", "db"), &mut allowance));
    }
}
