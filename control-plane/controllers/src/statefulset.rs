//! StatefulSet controller (upstream `pkg/controller/statefulset`): pods
//! with stable names `<set>-<ordinal>`, each with its own claims
//! `<template>-<pod>`, created in ordinal order (OrderedReady: one at a
//! time, each Running and Ready before the next) or all at once
//! (Parallel), removed from the highest ordinal down, and rolled to a new
//! template from the highest ordinal down to the partition, through
//! ControllerRevisions ([`crate::workload_revision`]).
//!
//! Observe: the set, its pods and revisions from the caches. Diff: the
//! ordinals `[start, start + replicas)` against the pods there are, and
//! each pod's revision against the update revision. Act: at most what the
//! management policy allows this pass, then write the status; every pod
//! change brings the next pass.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::selector;
use serde_json::json;

use crate::pods::{self, is_active};
use crate::workload::{self, controller_owner, ApiResultExt, Result};
use crate::workload_claim::{self as claim, Claim};
use crate::workload_hash;
use crate::workload_revision::{self as revision, HASH_LABEL};

/// The label naming a pod's StatefulSet pod (upstream
/// `StatefulSetPodNameLabel`): a Service can select one replica.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label carrying a pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

struct State {
    client: kube::Client,
    pods: Store<Pod>,
    revisions: Store<ControllerRevision>,
    events: Recorder,
}

/// Run the StatefulSet controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let sets = ctx.informers.get::<StatefulSet>();
    let _sets_trigger =
        workload::trigger(&sets, tx.clone(), |s: &StatefulSet, _| workload::itself(s));
    let pod_cache = ctx.informers.get::<Pod>();
    let _pods_trigger = workload::trigger(&pod_cache, tx.clone(), {
        let sets = sets.store().clone();
        move |pod: &Pod, exists| owners_of(&pod.metadata, exists && is_active(pod), &sets)
    });
    let revisions = ctx.informers.get::<ControllerRevision>();
    let _revisions_trigger = workload::trigger(&revisions, tx, {
        let sets = sets.store().clone();
        move |r: &ControllerRevision, exists| owners_of(&r.metadata, exists, &sets)
    });
    workload::ready(&sets).await?;
    workload::ready(&pod_cache).await?;
    workload::ready(&revisions).await?;
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("statefulset-controller")),
        client,
        pods: pod_cache.store().clone(),
        revisions: revisions.store().clone(),
    });
    workload::drive("statefulset", sets.store().clone(), rx, state, reconcile).await;
    Ok(())
}

/// The sets an object change concerns: its controller, or for an orphan
/// every set that selects it (one of them adopts it).
fn owners_of(
    meta: &ObjectMeta,
    adoptable: bool,
    sets: &Store<StatefulSet>,
) -> Vec<ObjectRef<StatefulSet>> {
    if let Some(owner) = controller_owner::<StatefulSet>(meta) {
        return vec![owner];
    }
    if claim::controller_of(meta).is_some() || !adoptable {
        return Vec::new();
    }
    let ns = meta.namespace.as_deref().unwrap_or_default();
    sets.state_filter(|s| {
        s.metadata.namespace.as_deref() == Some(ns)
            && !selector::is_empty(&s.spec.selector)
            && selector::matches(&s.spec.selector, meta.labels.as_ref())
    })
    .iter()
    .map(|s| ObjectRef::from_obj(&**s))
    .collect()
}

/// The ordinal a pod name of `set` carries (`<set>-<n>`), if it is one.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Running and Ready: what OrderedReady waits for before the next pod.
fn is_running_and_ready(p: &Pod) -> bool {
    pods::phase(p) == "Running" && pods::is_ready(p)
}

/// The revision a pod was made from: upstream labels StatefulSet pods with
/// the ControllerRevision's name (DaemonSet pods carry only the hash).
fn revision_of(p: &Pod) -> Option<&str> {
    p.metadata
        .labels
        .as_ref()?
        .get(HASH_LABEL)
        .map(String::as_str)
}

async fn reconcile(set: Arc<StatefulSet>, st: Arc<State>) -> Result<Action> {
    let ns = set.namespace().unwrap_or_default();
    let key = workload::key(&*set);
    let uid = set.uid().unwrap_or_default();
    let rev_api: Api<ControllerRevision> = Api::namespaced(st.client.clone(), &ns);
    let old_status = set.status.clone().unwrap_or_default();

    let owned = claim_pods(&set, &st).await?;
    claim_revisions(&set, &st).await?;
    let revs = revision::owned(&st.revisions, &ns, &uid);

    let template = set.spec.template.clone();
    let labels = set.spec.selector.match_labels.clone().unwrap_or_default();
    let (update, collisions) = revision::ensure(
        &rev_api,
        &revs,
        &*set,
        &labels,
        revision::data_of(&template),
        old_status.collision_count.unwrap_or(0),
        |d, c| revision::hash(d, Some(c)),
    )
    .await?;
    let update_rev = update.name_any();
    let current_rev = old_status
        .current_revision
        .clone()
        .filter(|c| revs.iter().any(|r| r.name_any() == *c) || *c == update_rev)
        .unwrap_or_else(|| update_rev.clone());

    let now = workload::now();
    if set.metadata.deletion_timestamp.is_none() {
        manage(&set, &owned, &current_rev, &update_rev, &st, now).await?;
    }

    let status = status_of(&set, &owned, &current_rev, &update_rev, collisions, now);
    if set.status.as_ref() != Some(&status) {
        let mut updated = (*set).clone();
        updated.status = Some(status.clone());
        Api::<StatefulSet>::namespaced(st.client.clone(), &ns)
            .replace_status(&set.name_any(), &PostParams::default(), &updated)
            .await
            .ctx(|| format!("updating status of stateful set {key}"))?;
    }

    let mut live: HashSet<String> = owned
        .iter()
        .filter_map(|p| revision_of(p).map(String::from))
        .collect();
    live.insert(status.current_revision.clone().unwrap_or_default());
    live.insert(update_rev);
    let revs = revision::owned(&st.revisions, &ns, &uid);
    revision::truncate(
        &rev_api,
        &revs,
        &live,
        set.spec.revision_history_limit.unwrap_or(10),
    )
    .await?;

    let min_ready = set.spec.min_ready_seconds.unwrap_or(0);
    Ok(match pods::next_available_in(&owned, min_ready, now) {
        Some(d) => Action::requeue(d.max(Duration::from_millis(100))),
        None => Action::await_change(),
    })
}

/// The pods of this set after adopting matching orphans and releasing
/// owned pods it no longer selects; terminating pods included (their
/// names are still taken).
async fn claim_pods(set: &StatefulSet, st: &State) -> Result<Vec<Arc<Pod>>> {
    let ns = set.namespace().unwrap_or_default();
    let uid = set.uid().unwrap_or_default();
    let deleting = set.metadata.deletion_timestamp.is_some();
    let sel = &set.spec.selector;
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    let name = set.name_any();
    let candidates = st
        .pods
        .state_filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()));
    let mut owned = Vec::new();
    let mut may_adopt = None;
    for pod in candidates {
        // Upstream adopts only pods whose name is one of the set's.
        let selected = !selector::is_empty(sel)
            && selector::matches(sel, pod.metadata.labels.as_ref())
            && ordinal_of(&name, &pod.name_any()).is_some();
        match claim::classify(&uid, deleting, selected, &pod.metadata) {
            Claim::Owned => owned.push(pod),
            Claim::Adopt if is_active(&pod) => {
                if may_adopt.is_none() {
                    let sets = Api::<StatefulSet>::namespaced(st.client.clone(), &ns);
                    may_adopt = Some(claim::can_adopt(&sets, set).await?);
                }
                if may_adopt == Some(true) {
                    let adopted =
                        claim::adopt(&api, &*pod, claim::controller_ref(set), None).await?;
                    owned.push(Arc::new(adopted));
                }
            }
            Claim::Release => claim::release(&api, &*pod, &uid).await?,
            Claim::Adopt | Claim::NotOurs => {}
        }
    }
    Ok(owned)
}

/// Adopt orphaned revisions the selector matches and release owned ones it
/// no longer does (upstream `ClaimControllerRevisions`).
async fn claim_revisions(set: &StatefulSet, st: &State) -> Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let uid = set.uid().unwrap_or_default();
    let deleting = set.metadata.deletion_timestamp.is_some();
    let sel = &set.spec.selector;
    let api: Api<ControllerRevision> = Api::namespaced(st.client.clone(), &ns);
    for r in st
        .revisions
        .state_filter(|r| r.metadata.namespace.as_deref() == Some(ns.as_str()))
    {
        let selected =
            !selector::is_empty(sel) && selector::matches(sel, r.metadata.labels.as_ref());
        match claim::classify(&uid, deleting, selected, &r.metadata) {
            Claim::Adopt => {
                claim::adopt(&api, &*r, claim::controller_ref(set), None).await?;
            }
            Claim::Release => claim::release(&api, &*r, &uid).await?,
            Claim::Owned | Claim::NotOurs => {}
        }
    }
    Ok(())
}

/// The rolling update's partition: ordinals (relative to `ordinals.start`)
/// below it keep the current revision.
fn partition(set: &StatefulSet) -> i32 {
    set.spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
}

fn is_on_delete(set: &StatefulSet) -> bool {
    set.spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        == Some("OnDelete")
}

fn is_parallel(set: &StatefulSet) -> bool {
    set.spec.pod_management_policy.as_deref() == Some("Parallel")
}

/// One pass of upstream's `updateStatefulSet`: replace failed pods, create
/// missing ones, delete condemned ones, then roll.
async fn manage(
    set: &StatefulSet,
    owned: &[Arc<Pod>],
    current_rev: &str,
    update_rev: &str,
    st: &State,
    now: jiff::Timestamp,
) -> Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    let start = set
        .spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0);
    let replicas = set.spec.replicas.unwrap_or(1).max(0);
    let parallel = is_parallel(set);
    let min_ready = set.spec.min_ready_seconds.unwrap_or(0);

    let mut slots: BTreeMap<i32, Arc<Pod>> = BTreeMap::new();
    let mut condemned: Vec<Arc<Pod>> = Vec::new();
    for p in owned {
        let Some(ord) = ordinal_of(&name, &p.name_any()) else {
            continue;
        };
        if (start..start + replicas).contains(&ord) {
            slots.insert(ord, p.clone());
        } else {
            condemned.push(p.clone());
        }
    }
    condemned.sort_by_key(|p| std::cmp::Reverse(ordinal_of(&name, &p.name_any())));

    // Create, replace and wait, lowest ordinal first.
    for ord in start..start + replicas {
        match slots.get(&ord) {
            None => {
                let rev = if !is_on_delete(set)
                    && current_rev != update_rev
                    && ord - start < partition(set)
                {
                    current_rev
                } else {
                    update_rev
                };
                create_pod(set, ord, rev, &api, st).await?;
                if !parallel {
                    return Ok(());
                }
            }
            Some(p) if pods::is_finished(p) && p.metadata.deletion_timestamp.is_none() => {
                // A failed (or succeeded) pod never restarts in place:
                // delete it, the next pass creates it again.
                delete_pod(set, p, &api, st).await?;
                if !parallel {
                    return Ok(());
                }
            }
            Some(p)
                if !parallel
                    && (p.metadata.deletion_timestamp.is_some() || !is_running_and_ready(p)) =>
            {
                return Ok(());
            }
            Some(_) => {}
        }
    }

    // Scale down, highest ordinal first; OrderedReady one at a time, and
    // only once every kept pod is healthy.
    let healthy = slots.values().all(|p| is_running_and_ready(p));
    for p in &condemned {
        if p.metadata.deletion_timestamp.is_some() {
            if parallel {
                continue;
            }
            return Ok(());
        }
        if !parallel && !healthy {
            return Ok(());
        }
        retain_claims_for_scale_down(set, p, st).await?;
        delete_pod(set, p, &api, st).await?;
        if !parallel {
            return Ok(());
        }
    }

    if is_on_delete(set) || replicas == 0 {
        return Ok(());
    }
    // Rolling update from the highest ordinal down to the partition,
    // keeping at most maxUnavailable of those pods unavailable.
    let floor = start + partition(set);
    let max_unavailable = set
        .spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.as_ref())
        .map(|v| workload_hash::scaled(Some(v), replicas, false, "maxUnavailable"))
        .transpose()?
        .unwrap_or(1)
        .max(1);
    let mut unavailable = slots
        .values()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_some() || !pods::is_available(p, min_ready, now)
        })
        .count() as i32;
    for (ord, p) in slots.iter().rev() {
        if *ord < floor || unavailable >= max_unavailable {
            break;
        }
        if revision_of(p) != Some(update_rev) && p.metadata.deletion_timestamp.is_none() {
            let was_available = pods::is_available(p, min_ready, now);
            delete_pod(set, p, &api, st).await?;
            if was_available {
                unavailable += 1;
            }
        }
    }
    Ok(())
}

/// The claim `template` gives the pod `pod`.
pub fn claim_name(template: &str, pod: &str) -> String {
    format!("{template}-{pod}")
}

/// Create the pod of ordinal `ord` at revision `rev`, its claims first.
async fn create_pod(
    set: &StatefulSet,
    ord: i32,
    rev: &str,
    api: &Api<Pod>,
    st: &State,
) -> Result<()> {
    let name = set.name_any();
    let pod_name = format!("{name}-{ord}");
    let template = revision_template(set, rev, st);
    let mut pod = pods::from_template(&template, String::new(), claim::controller_ref(set));
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(pod_name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(POD_NAME_LABEL.into(), pod_name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ord.to_string());
    labels.insert(HASH_LABEL.into(), rev.to_string());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.hostname = Some(pod_name.clone());
    if !set
        .spec
        .service_name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        spec.subdomain = set.spec.service_name.clone();
    }
    for t in set.spec.volume_claim_templates.iter().flatten() {
        let tname = t.name_any();
        let claim = claim_name(&tname, &pod_name);
        ensure_claim(set, t, &claim, &pod_name, st).await?;
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| v.name != tname);
        volumes.push(Volume {
            name: tname,
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: None,
            }),
            ..Default::default()
        });
    }
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => {
            st.events.normal(
                set,
                "SuccessfulCreate",
                format!("create Pod {pod_name} in StatefulSet {name} successful"),
            );
            Ok(())
        }
        // The cache had not seen it yet: the next pass will.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => {
            st.events.warning(
                set,
                "FailedCreate",
                format!("create Pod {pod_name} in StatefulSet {name} failed error: {e}"),
            );
            Err(e).ctx(|| {
                format!(
                    "creating pod {pod_name} of stateful set {}",
                    workload::key(set)
                )
            })
        }
    }
}

/// The template of revision `rev`: the set's own when it is the update
/// revision, else the one the revision's data restores.
fn revision_template(
    set: &StatefulSet,
    rev: &str,
    st: &State,
) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    let ns = set.namespace().unwrap_or_default();
    st.revisions
        .get(&ObjectRef::new(rev).within(&ns))
        .map(|r| r.data.clone())
        .and_then(|d| {
            let mut t = d.0["spec"]["template"].clone();
            if let Some(m) = t.as_object_mut() {
                m.remove("$patch");
            }
            serde_json::from_value(t).ok()
        })
        .unwrap_or_else(|| set.spec.template.clone())
}

/// Create the claim `name` for `pod` from template `t` unless it exists.
/// With `whenDeleted: Delete` the set owns it, so deleting the set removes
/// it (through the garbage collector).
async fn ensure_claim(
    set: &StatefulSet,
    t: &PersistentVolumeClaim,
    name: &str,
    pod: &str,
    st: &State,
) -> Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(st.client.clone(), &ns);
    match api.get_opt(name).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(e) => return Err(e).ctx(|| format!("reading claim {name}")),
    }
    let mut labels = t.metadata.labels.clone().unwrap_or_default();
    labels.extend(set.spec.selector.match_labels.clone().unwrap_or_default());
    let when_deleted = set
        .spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|p| p.when_deleted.as_deref());
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: t.metadata.annotations.clone(),
            owner_references: (when_deleted == Some("Delete")).then(|| vec![owner_ref(set)]),
            ..Default::default()
        },
        spec: t.spec.clone(),
        status: None,
    };
    let set_name = set.name_any();
    match api.create(&PostParams::default(), &claim).await {
        Ok(_) => {
            st.events.normal(
                set,
                "SuccessfulCreate",
                format!("create Claim {name} Pod {pod} in StatefulSet {set_name} success"),
            );
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => {
            st.events.warning(
                set,
                "FailedCreate",
                format!(
                    "create Claim {name} for Pod {pod} in StatefulSet {set_name} failed error: {e}"
                ),
            );
            Err(e).ctx(|| format!("creating claim {name}"))
        }
    }
}

/// A non-controller owner reference (claims are owned, not controlled:
/// the garbage collector deletes them with their owner).
fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..claim::controller_ref(owner)
    }
}

/// With `whenScaled: Delete`, a scaled-down pod's claims become the pod's,
/// so they go with it.
async fn retain_claims_for_scale_down(set: &StatefulSet, pod: &Pod, st: &State) -> Result<()> {
    let when_scaled = set
        .spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|p| p.when_scaled.as_deref());
    if when_scaled != Some("Delete") {
        return Ok(());
    }
    let ns = set.namespace().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(st.client.clone(), &ns);
    for t in set.spec.volume_claim_templates.iter().flatten() {
        let name = claim_name(&t.name_any(), &pod.name_any());
        let Some(c) = api
            .get_opt(&name)
            .await
            .ctx(|| format!("reading claim {name}"))?
        else {
            continue;
        };
        let mut refs = c.metadata.owner_references.clone().unwrap_or_default();
        if refs
            .iter()
            .any(|r| Some(&r.uid) == pod.metadata.uid.as_ref())
        {
            continue;
        }
        refs.push(owner_ref(pod));
        let patch = json!({"metadata": {"ownerReferences": refs}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ctx(|| format!("handing claim {name} to its pod"))?;
    }
    Ok(())
}

async fn delete_pod(set: &StatefulSet, pod: &Pod, api: &Api<Pod>, st: &State) -> Result<()> {
    let name = pod.name_any();
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    let set_name = set.name_any();
    match api.delete(&name, &dp).await {
        Ok(_) => {
            st.events.normal(
                set,
                "SuccessfulDelete",
                format!("delete Pod {name} in StatefulSet {set_name} successful"),
            );
            Ok(())
        }
        Err(e) if workload::is_not_found(&e) => Ok(()),
        Err(e) => {
            st.events.warning(
                set,
                "FailedDelete",
                format!("delete Pod {name} in StatefulSet {set_name} failed error: {e}"),
            );
            Err(e).ctx(|| format!("deleting pod {name} of stateful set {}", workload::key(set)))
        }
    }
}

/// The status the pods give (upstream `computeReplicaStatus` and
/// `completeRollingUpdate`).
fn status_of(
    set: &StatefulSet,
    owned: &[Arc<Pod>],
    current_rev: &str,
    update_rev: &str,
    collisions: i32,
    now: jiff::Timestamp,
) -> StatefulSetStatus {
    let min_ready = set.spec.min_ready_seconds.unwrap_or(0);
    let counted: Vec<&Arc<Pod>> = owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !pods::is_finished(p))
        .collect();
    let at = |rev: &str| {
        counted
            .iter()
            .filter(|p| revision_of(p) == Some(rev))
            .count() as i32
    };
    let replicas = counted.len() as i32;
    let ready = counted.iter().filter(|p| pods::is_ready(p)).count() as i32;
    let available = counted
        .iter()
        .filter(|p| pods::is_available(p, min_ready, now))
        .count() as i32;
    let updated = at(update_rev);
    let mut current = at(current_rev);
    let mut current_rev = current_rev.to_string();
    let want = set.spec.replicas.unwrap_or(1).max(0);
    // The rollout is complete when every wanted pod runs the update
    // revision: it becomes the current one.
    if updated == want && replicas == want && ready == want {
        current_rev = update_rev.to_string();
        current = updated;
    }
    let old = set.status.clone().unwrap_or_default();
    StatefulSetStatus {
        replicas,
        ready_replicas: Some(ready),
        current_replicas: Some(current),
        updated_replicas: Some(updated),
        available_replicas: Some(available),
        current_revision: Some(current_rev),
        update_revision: Some(update_rev.to_string()),
        observed_generation: set.metadata.generation,
        collision_count: (collisions > 0).then_some(collisions),
        conditions: old.conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_names() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-01"), Some(1));
    }
}
