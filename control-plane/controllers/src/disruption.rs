//! Disruption controller (upstream `pkg/controller/disruption`): how many
//! of the pods a PodDisruptionBudget selects may be disrupted now.
//!
//! Observe: the budget, the pods of its namespace it selects, and for
//! percentages and `maxUnavailable` the scale of the pods' controllers
//! (Deployment through its ReplicaSets, ReplicaSet, StatefulSet,
//! ReplicationController). Diff: Ready pods not being deleted nor just
//! evicted (`disruptedPods`) against the desired count. Act: write
//! `status` (the eviction API reads `disruptionsAllowed` from it).
//!
//! An eviction records its pod in `disruptedPods` before deleting it; the
//! pod does not count as healthy while the entry is fresh. An entry whose
//! pod is still there after [`DELETION_TIMEOUT`] is dropped with a
//! `NotDeleted` warning, as upstream.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::informer::Informer;
use kube_util::selector;

use crate::pods;
use crate::workload::{self, ApiResultExt, Error, Result};
use crate::workload_claim::controller_of;
use crate::workload_hash::scaled;

/// How long an evicted pod may take to be deleted before the budget
/// counts it again (upstream `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// The condition the eviction API and `kubectl` read.
const CONDITION: &str = "DisruptionAllowed";

struct State {
    client: kube::Client,
    pods: Informer<Pod>,
    deployments: Informer<Deployment>,
    replicasets: Informer<ReplicaSet>,
    statefulsets: Informer<StatefulSet>,
    rcs: Informer<ReplicationController>,
    events: Recorder,
}

/// Run the disruption controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let pdbs = ctx.informers.get::<PodDisruptionBudget>();
    let _pdb_trigger = workload::trigger(&pdbs, tx.clone(), |pdb: &PodDisruptionBudget, _| {
        workload::itself(pdb)
    });
    let pod_cache = ctx.informers.get::<Pod>();
    let _pod_trigger = workload::trigger(&pod_cache, tx, {
        let pdbs = pdbs.clone();
        move |pod: &Pod, _| budgets_of(pod, &pdbs)
    });
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("controllermanager")),
        client,
        pods: pod_cache,
        deployments: ctx.informers.get(),
        replicasets: ctx.informers.get(),
        statefulsets: ctx.informers.get(),
        rcs: ctx.informers.get(),
    });
    workload::ready(&pdbs).await?;
    workload::ready(&state.pods).await?;
    workload::ready(&state.deployments).await?;
    workload::ready(&state.replicasets).await?;
    workload::ready(&state.statefulsets).await?;
    workload::ready(&state.rcs).await?;
    workload::drive("disruption", pdbs.store().clone(), rx, state, reconcile).await;
    Ok(())
}

/// The budgets of the pod's namespace that select it.
fn budgets_of(
    pod: &Pod,
    pdbs: &Informer<PodDisruptionBudget>,
) -> Vec<ObjectRef<PodDisruptionBudget>> {
    let ns = pod.metadata.namespace.as_deref();
    pdbs.list()
        .iter()
        .filter(|b| b.metadata.namespace.as_deref() == ns && selects(b, pod))
        .map(|b| ObjectRef::from_obj(&**b))
        .collect()
}

/// policy/v1: a missing selector selects nothing, an empty one every pod
/// of the namespace.
fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    pdb.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|sel| {
            selector::selector(sel).is_ok() && selector::matches(sel, pod.metadata.labels.as_ref())
        })
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, st: Arc<State>) -> Result<Action> {
    let ns = pdb.namespace().unwrap_or_default();
    let now = workload::now();
    let pods: Vec<Arc<Pod>> = st
        .pods
        .list()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(&ns) && selects(&pdb, p))
        .collect();
    if pods.is_empty() {
        st.events
            .normal(&*pdb, "NoPods", "No matching pods found".into());
    }
    let status = match expected_count(&pdb, &pods, &st) {
        Ok((expected, desired, unmanaged)) => {
            if !unmanaged.is_empty() {
                st.events.warning(&*pdb, "UnmanagedPods", format!(
                    "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                    selector_string(&pdb)
                ));
            }
            let (disrupted, recheck, stale) = disrupted_pods(&pdb, &pods, now);
            for name in stale {
                st.events.warning(
                    &*pdb,
                    "NotDeleted",
                    format!(
                        "Pod was expected by PDB {ns}/{} to be deleted but it wasn't",
                        pdb.name_any()
                    ),
                );
                tracing::debug!(pdb = %workload::key(&*pdb), pod = name, "evicted pod not deleted in time");
            }
            let healthy = count_healthy(&pods, &disrupted, now);
            (
                compute_status(&pdb, expected, desired, healthy, disrupted, now),
                recheck,
            )
        }
        Err(e) => {
            st.events.warning(
                &*pdb,
                "CalculateExpectedPodCountFailed",
                format!("Failed to calculate the number of expected pods: {e}"),
            );
            (fail_safe(&pdb, &e.to_string(), now), None)
        }
    };
    let (status, recheck) = status;
    if pdb.status.as_ref() != Some(&status) {
        let mut updated = (*pdb).clone();
        updated.status = Some(status);
        Api::<PodDisruptionBudget>::namespaced(st.client.clone(), &ns)
            .replace_status(&pdb.name_any(), &PostParams::default(), &updated)
            .await
            .ctx(|| {
                format!(
                    "updating status of pod disruption budget {}",
                    workload::key(&*pdb)
                )
            })?;
    }
    Ok(match recheck {
        Some(at) => {
            // Wake when the first fresh eviction expires, to count its
            // pod again if it was never deleted.
            let wait = at.duration_since(now).unsigned_abs();
            Action::requeue(wait + Duration::from_secs(1))
        }
        None => Action::await_change(),
    })
}

/// (expectedPods, desiredHealthy, unmanaged pod names), as upstream's
/// `getExpectedPodCount`: an integer minAvailable counts the selected
/// pods; a percentage, or maxUnavailable, the replicas their controllers
/// ask for.
fn expected_count(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    st: &State,
) -> Result<(i32, i32, Vec<String>)> {
    let spec = pdb.spec.clone().unwrap_or_default();
    if let Some(max) = spec.max_unavailable.as_ref() {
        let (expected, unmanaged) = expected_scale(pods, st)?;
        let max = scaled(Some(max), expected, true, "maxUnavailable")?;
        return Ok((expected, (expected - max).max(0), unmanaged));
    }
    match spec.min_available.as_ref() {
        Some(IntOrString::Int(n)) => Ok((len_i32(pods.len()), *n, Vec::new())),
        Some(min @ IntOrString::String(_)) => {
            let (expected, unmanaged) = expected_scale(pods, st)?;
            Ok((
                expected,
                scaled(Some(min), expected, true, "minAvailable")?,
                unmanaged,
            ))
        }
        None => Ok((0, 0, Vec::new())),
    }
}

fn len_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The replicas the selected pods' controllers want, each controller
/// once; pods without a controller are returned by name.
///
/// # Errors
/// [`Error::Invalid`] for a pod whose controller cannot be found.
fn expected_scale(pods: &[Arc<Pod>], st: &State) -> Result<(i32, Vec<String>)> {
    let mut seen = HashSet::new();
    let mut unmanaged = Vec::new();
    let mut total: i32 = 0;
    for pod in pods {
        let Some(owner) = controller_of(&pod.metadata) else {
            unmanaged.push(pod.name_any());
            continue;
        };
        let ns = pod.metadata.namespace.as_deref();
        let scale = controller_scale(
            &owner.kind,
            &owner.api_version,
            &owner.name,
            &owner.uid,
            ns,
            st,
        )
        .ok_or_else(|| {
            Error::Invalid(format!("found no controllers for pod {:?}", pod.name_any()))
        })?;
        if seen.insert(scale.0) {
            total = total.saturating_add(scale.1);
        }
    }
    Ok((total, unmanaged))
}

/// The (uid, replicas) of the controller a pod's reference names, when
/// the reference's uid matches. A ReplicaSet run by a Deployment answers
/// with the Deployment (upstream's finders).
fn controller_scale(
    kind: &str,
    api_version: &str,
    name: &str,
    uid: &str,
    ns: Option<&str>,
    st: &State,
) -> Option<(String, i32)> {
    let uid_is = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.uid.as_deref() == Some(uid)
    };
    match (kind, api_version) {
        ("ReplicaSet", "apps/v1") => {
            let rs = st
                .replicasets
                .get(ns, name)
                .filter(|rs| uid_is(&rs.metadata))?;
            if let Some(d) = controller_of(&rs.metadata)
                .filter(|r| r.kind == "Deployment" && r.api_version == "apps/v1")
            {
                let dep = st
                    .deployments
                    .get(ns, &d.name)
                    .filter(|x| x.metadata.uid.as_deref() == Some(&d.uid))?;
                let replicas = dep.spec.replicas.unwrap_or(1);
                return Some((d.uid.clone(), replicas));
            }
            Some((uid.into(), rs.spec.replicas.unwrap_or(1)))
        }
        ("StatefulSet", "apps/v1") => {
            let s = st
                .statefulsets
                .get(ns, name)
                .filter(|x| uid_is(&x.metadata))?;
            Some((uid.into(), s.spec.replicas.unwrap_or(1)))
        }
        ("ReplicationController", "v1") => {
            let rc = st.rcs.get(ns, name).filter(|x| uid_is(&x.metadata))?;
            Some((
                uid.into(),
                rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            ))
        }
        _ => None,
    }
}

/// The `disruptedPods` entries still pending (pods selected, not yet
/// being deleted, evicted less than [`DELETION_TIMEOUT`] ago), the time
/// the first of them expires, and the pods whose entry expired.
fn disrupted_pods(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    now: jiff::Timestamp,
) -> (BTreeMap<String, Time>, Option<jiff::Timestamp>, Vec<String>) {
    let old = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
    let (mut keep, mut recheck, mut stale) = (BTreeMap::new(), None, Vec::new());
    let Some(old) = old else {
        return (keep, recheck, stale);
    };
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.name_any();
        let Some(at) = old.get(&name) else { continue };
        let expires = at.0 + DELETION_TIMEOUT;
        if expires < now {
            stale.push(name);
            continue;
        }
        recheck = Some(recheck.map_or(expires, |r: jiff::Timestamp| r.min(expires)));
        keep.insert(name, at.clone());
    }
    (keep, recheck, stale)
}

/// Ready pods that are neither being deleted nor evicted (upstream
/// `countHealthyPods`).
fn count_healthy(
    pods: &[Arc<Pod>],
    disrupted: &BTreeMap<String, Time>,
    now: jiff::Timestamp,
) -> i32 {
    len_i32(
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                disrupted
                    .get(&p.name_any())
                    .is_none_or(|t| t.0 + DELETION_TIMEOUT <= now)
            })
            .filter(|p| pods::is_ready(p))
            .count(),
    )
}

/// The status for these counts (upstream `updatePdbStatus`).
fn compute_status(
    pdb: &PodDisruptionBudget,
    expected: i32,
    desired: i32,
    healthy: i32,
    disrupted: BTreeMap<String, Time>,
    now: jiff::Timestamp,
) -> PodDisruptionBudgetStatus {
    let allowed = if expected <= 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    let mut status = pdb.status.clone().unwrap_or_default();
    status.current_healthy = Some(healthy);
    status.desired_healthy = Some(desired);
    status.expected_pods = Some(expected);
    status.disruptions_allowed = Some(allowed);
    status.disrupted_pods = (!disrupted.is_empty()).then_some(disrupted);
    status.observed_generation = pdb.metadata.generation;
    let (value, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    set_condition(&mut status, value, reason, "", now);
    status
}

/// A budget whose pods cannot be counted allows nothing (upstream
/// `failSafe`), saying why in its condition.
fn fail_safe(
    pdb: &PodDisruptionBudget,
    why: &str,
    now: jiff::Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = Some(0);
    status.observed_generation = pdb.metadata.generation;
    set_condition(&mut status, "False", "SyncFailed", why, now);
    status
}

/// upstream `apimeta.SetStatusCondition`: the transition time moves only
/// with the status.
fn set_condition(
    status: &mut PodDisruptionBudgetStatus,
    value: &str,
    reason: &str,
    msg: &str,
    now: jiff::Timestamp,
) {
    let generation = status.observed_generation;
    let conds = status.conditions.get_or_insert_with(Vec::new);
    let since = conds
        .iter()
        .find(|c| c.type_ == CONDITION && c.status == value)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    conds.retain(|c| c.type_ != CONDITION);
    conds.push(Condition {
        type_: CONDITION.into(),
        status: value.into(),
        reason: reason.into(),
        message: msg.into(),
        observed_generation: generation,
        last_transition_time: since,
    });
}

/// The selector as `kubectl` prints it, for the UnmanagedPods warning.
fn selector_string(pdb: &PodDisruptionBudget) -> String {
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return String::new();
    };
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let vals = e.values.clone().unwrap_or_default().join(",");
        parts.push(format!("{} {} ({vals})", e.key, e.operator));
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;

    fn pdb(generation: i64) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: kube::api::ObjectMeta {
                name: Some("b".into()),
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec::default()),
            status: None,
        }
    }

    #[test]
    fn allowed_is_healthy_beyond_desired() {
        let now = workload::now();
        let s = compute_status(&pdb(3), 3, 2, 3, BTreeMap::new(), now);
        assert_eq!(
            (s.disruptions_allowed, s.observed_generation),
            (Some(1), Some(3))
        );
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "SufficientPods")
        );
        let s = compute_status(&pdb(1), 3, 2, 1, BTreeMap::new(), now);
        assert_eq!(s.disruptions_allowed, Some(0));
        assert_eq!(s.conditions.as_ref().unwrap()[0].reason, "InsufficientPods");
        // No pods expected: nothing may be disrupted.
        assert_eq!(
            compute_status(&pdb(1), 0, 0, 2, BTreeMap::new(), now).disruptions_allowed,
            Some(0)
        );
    }

    #[test]
    fn transition_time_stays_while_the_status_does() {
        let t0 = workload::now();
        let t1 = t0 + Duration::from_secs(60);
        let mut b = pdb(1);
        b.status = Some(compute_status(&b, 3, 2, 3, BTreeMap::new(), t0));
        let s = compute_status(&b, 3, 2, 3, BTreeMap::new(), t1);
        assert_eq!(
            s.conditions.as_ref().unwrap()[0].last_transition_time,
            Time(t0)
        );
        let s = fail_safe(&b, "boom", t1);
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("SyncFailed", "boom")
        );
        assert_eq!(c.last_transition_time, Time(t1));
    }

    #[test]
    fn fresh_evictions_do_not_count_as_healthy() {
        let now = workload::now();
        let pod = |name: &str| {
            let mut p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap();
            p.metadata.namespace = Some("ns".into());
            Arc::new(p)
        };
        let pods = vec![pod("a"), pod("b"), pod("c")];
        let mut b = pdb(1);
        let old = now - Duration::from_secs(300);
        b.status = Some(PodDisruptionBudgetStatus {
            disrupted_pods: Some(BTreeMap::from([
                ("a".to_string(), Time(now)),
                ("b".to_string(), Time(old)),
                ("gone".to_string(), Time(now)),
            ])),
            ..Default::default()
        });
        let (kept, recheck, stale) = disrupted_pods(&b, &pods, now);
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(stale, ["b"]);
        assert_eq!(recheck, Some(now + DELETION_TIMEOUT));
        assert_eq!(count_healthy(&pods, &kept, now), 2);
    }
}
