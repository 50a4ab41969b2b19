//! ReplicaSet controller (upstream `pkg/controller/replicaset`): keeps
//! `spec.replicas` active pods that match the selector, creating them from
//! the template in slow-start batches and deleting the most expendable
//! first; adopts matching orphans, releases owned pods that stopped
//! matching, and reports replicas / fullyLabeledReplicas / readyReplicas /
//! availableReplicas in the status.
//!
//! ReplicationControllers run the same loop through [`Replicated`]: their
//! equality selector and spec read as a ReplicaSet's (upstream likewise
//! converts them, `pkg/controller/replication`).
//!
//! Observe: the ReplicaSet, and the pods of its namespace from the cache.
//! Diff: active owned pods against `spec.replicas`. Act: create or delete
//! (only when earlier creations and deletions show in the cache), then
//! write the status.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::selector;

use crate::pods::{self, is_active};
use crate::workload::{self, controller_owner, ApiResultExt, Error, Result};
use crate::workload_claim::{self as claim, Claim};
use crate::workload_expectations::Expectations;

/// At most this many pods are created or deleted in one pass (upstream
/// `BurstReplicas`).
pub const BURST: usize = 500;

/// A kind this loop keeps replicas of: read as a ReplicaSet, written back
/// as itself (owner references, events and status name the real kind).
pub trait Replicated:
    kube_util::informer::Object
    + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + serde::Serialize
{
    /// The controller's name in logs and `ALL`.
    const CONTROLLER: &'static str;
    /// The event reporter (upstream's component name).
    const REPORTER: &'static str;
    /// The kind in error messages ("replica set").
    const WORDS: &'static str;
    /// This object's metadata, spec and status as a ReplicaSet's.
    fn view(&self) -> ReplicaSet;
    /// This object with `status` in place of its own.
    fn with_status(&self, status: ReplicaSetStatus) -> Self;
}

impl Replicated for ReplicaSet {
    const CONTROLLER: &'static str = "replicaset";
    const REPORTER: &'static str = "replicaset-controller";
    const WORDS: &'static str = "replica set";
    fn view(&self) -> ReplicaSet {
        self.clone()
    }
    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let mut updated = self.clone();
        updated.status = Some(status);
        updated
    }
}

struct State {
    client: kube::Client,
    pods: Store<Pod>,
    replicasets: Store<ReplicaSet>,
    expectations: Arc<Expectations>,
    events: Recorder,
}

/// Run the ReplicaSet controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    run_for::<ReplicaSet>(ctx).await
}

/// Run the loop for kind `K` until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run_for<K: Replicated>(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let expectations = Arc::new(Expectations::default());
    let rs_cache = ctx.informers.get::<K>();
    let _rs_cache_trigger = workload::trigger(&rs_cache, tx.clone(), {
        let exp = expectations.clone();
        move |rs: &K, exists| {
            if !exists {
                exp.forget(&workload::key(rs));
            }
            workload::itself(rs)
        }
    });
    let pod_cache = ctx.informers.get::<Pod>();
    let _pod_cache_trigger = workload::trigger(&pod_cache, tx, {
        let rss = rs_cache.store().clone();
        let exp = expectations.clone();
        move |pod: &Pod, exists| owners_of(pod, exists, &rss, &exp)
    });
    workload::ready(&rs_cache).await?;
    workload::ready(&pod_cache).await?;
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new(K::REPORTER)),
        client,
        pods: pod_cache.store().clone(),
        replicasets: ctx.informers.get::<ReplicaSet>().store().clone(),
        expectations,
    });
    workload::drive(
        K::CONTROLLER,
        rs_cache.store().clone(),
        rx,
        state,
        reconcile::<K>,
    )
    .await;
    Ok(())
}

/// The ReplicaSets a pod change concerns: its controller, or for an
/// orphan every ReplicaSet that selects it (one of them adopts it).
fn owners_of<K: Replicated>(
    pod: &Pod,
    exists: bool,
    rss: &Store<K>,
    exp: &Expectations,
) -> Vec<ObjectRef<K>> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(owner) = controller_owner::<K>(&pod.metadata) {
        exp.observe(&format!("{ns}/{}", owner.name), pod, exists);
        return vec![owner];
    }
    if claim::controller_of(&pod.metadata).is_some() || !exists || !is_active(pod) {
        return Vec::new();
    }
    rss.state_filter(|rs| {
        let rs = rs.view();
        rs.metadata.namespace.as_deref() == Some(ns)
            && !selector::is_empty(&rs.spec.selector)
            && selector::matches(&rs.spec.selector, pod.metadata.labels.as_ref())
    })
    .iter()
    .map(|rs| ObjectRef::from_obj(&**rs))
    .collect()
}

async fn reconcile<K: Replicated>(obj: Arc<K>, st: Arc<State>) -> Result<Action> {
    let rs = obj.view();
    let ns = rs.namespace().unwrap_or_default();
    let key = workload::key(&rs);
    let spec = &rs.spec;
    let now = workload::now();
    let mut owned = claim_pods(&*obj, &rs, &st).await?;

    let mut manage_err = None;
    let settled = st
        .expectations
        .satisfied(&key, |n| st.pods.get(&ObjectRef::new(n).within(&ns)));
    if settled && rs.metadata.deletion_timestamp.is_none() {
        match manage(&*obj, &rs, &owned, &st, now).await {
            // Deleted pods no longer count, so the status written below
            // (which the Deployment controller trusts for availability)
            // already shows the scale-down.
            Ok(gone) => {
                owned.retain(|p| !gone.contains(p.metadata.uid.as_deref().unwrap_or_default()))
            }
            Err(e) => manage_err = Some(e),
        }
    }

    let status = calculate_status(&rs, &owned, manage_err.as_ref(), now);
    if rs.status.as_ref() != Some(&status) {
        let updated = obj.with_status(status);
        Api::<K>::namespaced(st.client.clone(), &ns)
            .replace_status(&rs.name_any(), &PostParams::default(), &updated)
            .await
            .ctx(|| format!("updating status of {} {key}", K::WORDS))?;
    }
    if let Some(e) = manage_err {
        return Err(e);
    }
    let requeue = [
        pods::next_available_in(&owned, spec.min_ready_seconds.unwrap_or(0), now),
        (!settled)
            .then(|| st.expectations.expires_in(&key))
            .flatten(),
    ];
    Ok(match requeue.into_iter().flatten().min() {
        Some(d) => Action::requeue(d.max(Duration::from_millis(100))),
        None => Action::await_change(),
    })
}

/// The active pods this ReplicaSet owns after adopting matching orphans
/// and releasing owned pods it no longer selects.
async fn claim_pods<K: Replicated>(obj: &K, rs: &ReplicaSet, st: &State) -> Result<Vec<Arc<Pod>>> {
    let ns = rs.namespace().unwrap_or_default();
    let uid = rs.uid().unwrap_or_default();
    let deleting = rs.metadata.deletion_timestamp.is_some();
    let sel = &rs.spec.selector;
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    let candidates = st
        .pods
        .state_filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && is_active(p));
    let mut owned = Vec::new();
    let mut may_adopt = None;
    for pod in candidates {
        let selected =
            !selector::is_empty(sel) && selector::matches(sel, pod.metadata.labels.as_ref());
        match claim::classify(&uid, deleting, selected, &pod.metadata) {
            Claim::Owned => owned.push(pod),
            Claim::Adopt => {
                if may_adopt.is_none() {
                    let rs_api = Api::<K>::namespaced(st.client.clone(), &ns);
                    may_adopt = Some(claim::can_adopt(&rs_api, obj).await?);
                }
                if may_adopt == Some(true) {
                    let adopted =
                        claim::adopt(&api, &*pod, claim::controller_ref(obj), None).await?;
                    tracing::info!(replicaset = %workload::key(rs), pod = %pod.name_any(), "adopted pod");
                    owned.push(Arc::new(adopted));
                }
            }
            Claim::Release => {
                claim::release(&api, &*pod, &uid).await?;
                tracing::info!(replicaset = %workload::key(rs), pod = %pod.name_any(), "released pod that no longer matches the selector");
            }
            Claim::NotOurs => {}
        }
    }
    Ok(owned)
}

/// Create or delete pods so that `owned` reaches `spec.replicas`. Returns
/// the uids of the pods deleted.
async fn manage<K: Replicated>(
    obj: &K,
    rs: &ReplicaSet,
    owned: &[Arc<Pod>],
    st: &State,
    now: jiff::Timestamp,
) -> Result<HashSet<String>> {
    let ns = rs.namespace().unwrap_or_default();
    let key = workload::key(rs);
    let spec = rs.spec.clone();
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    if owned.len() < want {
        let n = (want - owned.len()).min(BURST);
        let template = spec.template.unwrap_or_default();
        let prefix = pods::name_prefix(&rs.name_any());
        let owner = claim::controller_ref(obj);
        st.expectations.creating(&key, n);
        let (_, made, err) = pods::slow_start(n, |_| {
            let pod = pods::from_template(&template, prefix.clone(), owner.clone());
            let (api, key) = (&api, &key);
            async move { pods::create(api, &pod, obj, &st.events, &st.expectations, key).await }
        })
        .await;
        for _ in made..n {
            st.expectations.created(&key, None);
        }
        if let Some(e) = err {
            return Err(e).ctx(|| format!("creating pods for {} {key}", K::WORDS));
        }
        return Ok(HashSet::new());
    }
    if owned.len() > want {
        let n = (owned.len() - want).min(BURST);
        let victims = pods::pick_victims(owned, &related_pods(rs, owned, st), n, now);
        for v in &victims {
            st.expectations.deleting(
                &key,
                &v.name_any(),
                v.metadata.uid.as_deref().unwrap_or_default(),
            );
        }
        let results =
            futures::future::join_all(victims.iter().map(|v| delete_pod(&api, obj, v, st))).await;
        let mut gone = HashSet::new();
        let mut first_err = None;
        for (v, r) in victims.iter().zip(results) {
            match r {
                Ok(()) => {
                    gone.insert(v.metadata.uid.clone().unwrap_or_default());
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        return Ok(gone);
    }
    Ok(HashSet::new())
}

async fn delete_pod<K: Replicated>(api: &Api<Pod>, obj: &K, pod: &Pod, st: &State) -> Result<()> {
    workload::delete_owned_pod(api, obj, pod, None, &st.events, &st.expectations, K::WORDS).await
}

/// Active pods of every ReplicaSet with the same controller as `rs` (the
/// other revisions of a Deployment): who shares a node with whom.
fn related_pods(rs: &ReplicaSet, owned: &[Arc<Pod>], st: &State) -> Vec<Arc<Pod>> {
    let Some(controller) = claim::controller_of(&rs.metadata).map(|r| r.uid.clone()) else {
        return owned.to_vec();
    };
    let ns = rs.namespace().unwrap_or_default();
    let siblings: HashSet<String> = st
        .replicasets
        .state_filter(|o| {
            o.metadata.namespace.as_deref() == Some(ns.as_str())
                && claim::controller_of(&o.metadata).is_some_and(|r| r.uid == controller)
        })
        .iter()
        .filter_map(|o| o.metadata.uid.clone())
        .collect();
    st.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns.as_str())
            && is_active(p)
            && claim::controller_of(&p.metadata).is_some_and(|r| siblings.contains(&r.uid))
    })
}

fn nonzero(n: usize) -> Option<i32> {
    (n > 0).then_some(n as i32)
}

/// The status `owned` pods give (upstream `calculateStatus`), with a
/// ReplicaFailure condition while creating or deleting fails.
fn calculate_status(
    rs: &ReplicaSet,
    owned: &[Arc<Pod>],
    err: Option<&Error>,
    now: jiff::Timestamp,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let fully_labeled = owned
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            template_labels
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .count();
    let ready = owned.iter().filter(|p| pods::is_ready(p)).count();
    let available = owned
        .iter()
        .filter(|p| pods::is_available(p, min_ready, now))
        .count();
    let old = rs.status.clone().unwrap_or_default();
    let mut conditions: Vec<ReplicaSetCondition> = old.conditions.clone().unwrap_or_default();
    let has_failure = conditions
        .iter()
        .any(|c| c.type_.as_deref() == Some("ReplicaFailure"));
    match err {
        Some(e) if !has_failure => {
            let want = spec.replicas.unwrap_or(1).max(0) as usize;
            let reason = if owned.len() < want {
                "FailedCreate"
            } else {
                "FailedDelete"
            };
            conditions.push(ReplicaSetCondition {
                type_: Some("ReplicaFailure".into()),
                status: Some("True".into()),
                reason: Some(reason.into()),
                message: Some(e.to_string()),
                last_transition_time: Some(Time(now)),
            });
        }
        None if has_failure => conditions.retain(|c| c.type_.as_deref() != Some("ReplicaFailure")),
        _ => {}
    }
    ReplicaSetStatus {
        replicas: owned.len() as i32,
        fully_labeled_replicas: nonzero(fully_labeled),
        ready_replicas: nonzero(ready),
        available_replicas: nonzero(available),
        observed_generation: rs.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        terminating_replicas: old.terminating_replicas,
    }
}
