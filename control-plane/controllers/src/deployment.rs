//! Deployment controller (upstream `pkg/controller/deployment`): one
//! ReplicaSet per pod template (`<deployment>-<pod-template-hash>`), rolled
//! from old to new with RollingUpdate (within maxSurge and maxUnavailable)
//! or Recreate; revisions in annotations so `kubectl rollout history` and
//! `rollout undo` work; old ReplicaSets beyond revisionHistoryLimit
//! removed; status and the Available and Progressing conditions for
//! `kubectl rollout status`.
//!
//! Observe: the Deployment and the ReplicaSets it owns (adopting and
//! releasing by selector). Diff and act, as upstream's `syncDeployment`:
//! a paused Deployment or a change of replicas only resizes; otherwise one
//! step of the strategy, then the status.
//!
//! One safeguard beyond upstream: scale-down decisions wait until every
//! ReplicaSet's status reflects its current spec, and surge counts the
//! pods an old ReplicaSet still has while it shrinks, so a lagging status
//! can never make the rollout dip below or overshoot its bounds.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::selector;
use serde_json::json;

use crate::workload::{self, controller_owner, is_not_found, ApiResultExt, Result};
use crate::workload_claim::{self as claim, Claim};
use crate::workload_hash::template_hash;
use crate::workload_rollout::{self as ro, desired, rs_replicas};

struct State {
    client: kube::Client,
    replicasets: Store<ReplicaSet>,
    events: Recorder,
}

/// Run the Deployment controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let deployments = ctx.informers.get::<Deployment>();
    let _deployments_trigger = workload::trigger(&deployments, tx.clone(), |d: &Deployment, _| {
        workload::itself(d)
    });
    let rs_cache = ctx.informers.get::<ReplicaSet>();
    let _rs_cache_trigger = workload::trigger(&rs_cache, tx, {
        let ds = deployments.store().clone();
        move |rs: &ReplicaSet, exists| owners_of(rs, exists, &ds)
    });
    workload::ready(&deployments).await?;
    workload::ready(&rs_cache).await?;
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("deployment-controller")),
        client,
        replicasets: rs_cache.store().clone(),
    });
    workload::drive(
        "deployment",
        deployments.store().clone(),
        rx,
        state,
        reconcile,
    )
    .await;
    Ok(())
}

/// The Deployments a ReplicaSet change concerns: its controller, or for an
/// orphan those that select it.
fn owners_of(rs: &ReplicaSet, exists: bool, ds: &Store<Deployment>) -> Vec<ObjectRef<Deployment>> {
    if let Some(owner) = controller_owner::<Deployment>(&rs.metadata) {
        return vec![owner];
    }
    if claim::controller_of(&rs.metadata).is_some() || !exists {
        return Vec::new();
    }
    let ns = rs.metadata.namespace.as_deref();
    ds.state_filter(|d| {
        d.metadata.namespace.as_deref() == ns
            && !selector::is_empty(&d.spec.selector)
            && selector::matches(&d.spec.selector, rs.metadata.labels.as_ref())
    })
    .iter()
    .map(|d| ObjectRef::from_obj(&**d))
    .collect()
}

async fn reconcile(d: Arc<Deployment>, st: Arc<State>) -> Result<Action> {
    let mut r = Rollout::new(&st, (*d).clone());
    if selector::is_empty(&r.d.spec.selector) {
        // Upstream refuses to act on a Deployment that would select every
        // pod in the namespace.
        r.st.events.warning(
            &r.d,
            "SelectingAll",
            "This deployment is selecting all pods. A non-empty selector is required.".into(),
        );
        let mut s = r.d.status.clone().unwrap_or_default();
        s.observed_generation = r.d.metadata.generation;
        r.write_status(s).await?;
        return Ok(Action::await_change());
    }
    let mut rss = r.claim_replica_sets().await?;
    if r.d.metadata.deletion_timestamp.is_some() {
        let (new_rs, old) = r.all_replica_sets(&mut rss, false).await?;
        r.sync_status(new_rs.as_ref(), &old).await?;
        return Ok(Action::await_change());
    }
    r.check_paused_conditions().await?;
    if r.d.spec.paused == Some(true) {
        return r.sync(&mut rss).await;
    }
    let (new_rs, old) = r.all_replica_sets(&mut rss, false).await?;
    let all: Vec<&ReplicaSet> = old.iter().chain(new_rs.as_ref()).collect();
    if ro::is_scaling_event(&r.d, &all) {
        return r.sync(&mut rss).await;
    }
    if ro::is_rolling(&r.d) {
        r.rollout_rolling(&mut rss).await
    } else {
        r.rollout_recreate(&mut rss).await
    }
}

/// One sync of one Deployment. `d` follows every write, so each later
/// write carries the resourceVersion of the one before.
struct Rollout<'a> {
    st: &'a State,
    d: Deployment,
    ns: String,
    name: String,
    now: jiff::Timestamp,
}

impl<'a> Rollout<'a> {
    fn new(st: &'a State, d: Deployment) -> Self {
        Rollout {
            ns: d.namespace().unwrap_or_default(),
            name: d.name_any(),
            now: workload::now(),
            st,
            d,
        }
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.st.client.clone(), &self.ns)
    }

    fn replicasets(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.st.client.clone(), &self.ns)
    }

    fn fenceposts(&self) -> Result<(i32, i32)> {
        ro::surge_and_unavailable(&self.d)
    }

    /// The ReplicaSets this Deployment owns, after adopting orphans it
    /// selects and releasing those it no longer selects.
    async fn claim_replica_sets(&self) -> Result<Vec<ReplicaSet>> {
        let uid = self.d.uid().unwrap_or_default();
        let deleting = self.d.metadata.deletion_timestamp.is_some();
        let sel = &self.d.spec.selector;
        let candidates = self
            .st
            .replicasets
            .state_filter(|rs| rs.metadata.namespace.as_deref() == Some(self.ns.as_str()));
        let mut owned = Vec::new();
        let mut may_adopt = None;
        for rs in candidates {
            let selected = selector::matches(sel, rs.metadata.labels.as_ref());
            match claim::classify(&uid, deleting, selected, &rs.metadata) {
                Claim::Owned => owned.push((*rs).clone()),
                Claim::Adopt => {
                    if may_adopt.is_none() {
                        may_adopt = Some(claim::can_adopt(&self.deployments(), &self.d).await?);
                    }
                    if may_adopt == Some(true) {
                        let adopted = claim::adopt(
                            &self.replicasets(),
                            &*rs,
                            claim::controller_ref(&self.d),
                            None,
                        )
                        .await?;
                        tracing::info!(deployment = %self.key(), replicaset = %rs.name_any(), "adopted replica set");
                        owned.push(adopted);
                    }
                }
                Claim::Release => claim::release(&self.replicasets(), &*rs, &uid).await?,
                Claim::NotOurs => {}
            }
        }
        Ok(owned)
    }

    /// The new ReplicaSet (created when `create` and missing) and the old
    /// ones, with revisions brought up to date (upstream
    /// `getAllReplicaSetsAndSyncRevision`).
    /// A ReplicaSet written here replaces its entry in `rss`, so later
    /// writes in this sync carry its new resourceVersion.
    async fn all_replica_sets(
        &mut self,
        rss: &mut Vec<ReplicaSet>,
        create: bool,
    ) -> Result<(Option<ReplicaSet>, Vec<ReplicaSet>)> {
        let new_idx = ro::find_new(&self.d, rss);
        let old: Vec<ReplicaSet> = rss
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != new_idx)
            .map(|(_, rs)| rs.clone())
            .collect();
        let new_rs = self
            .new_replica_set(new_idx.map(|i| &rss[i]), &old, create)
            .await?;
        match (new_idx, &new_rs) {
            (Some(i), Some(rs)) => rss[i] = rs.clone(),
            (None, Some(rs)) => rss.push(rs.clone()),
            _ => {}
        }
        Ok((new_rs, old))
    }

    async fn new_replica_set(
        &mut self,
        existing: Option<&ReplicaSet>,
        old: &[ReplicaSet],
        create: bool,
    ) -> Result<Option<ReplicaSet>> {
        let new_revision = ro::max_revision(old) + 1;
        let (max_surge, _) = self.fenceposts()?;
        if let Some(existing) = existing {
            let mut rs = existing.clone();
            let changed =
                ro::set_new_rs_annotations(&self.d, &mut rs, new_revision, true, max_surge);
            let min_ready = self.d.spec.min_ready_seconds;
            if changed || rs.spec.min_ready_seconds != min_ready {
                rs.spec.min_ready_seconds = min_ready;
                let updated = self
                    .replicasets()
                    .replace(&rs.name_any(), &PostParams::default(), &rs)
                    .await
                    .ctx(|| {
                        format!(
                            "updating annotations of replica set {}/{}",
                            self.ns,
                            rs.name_any()
                        )
                    })?;
                return Ok(Some(updated));
            }
            let rev = ro::revision(&rs).to_string();
            self.set_revision(&rev).await?;
            let mut s = self.d.status.clone().unwrap_or_default();
            if ro::progress_deadline(&self.d).is_some()
                && ro::condition(&s, "Progressing").is_none()
            {
                let msg = format!("Found new replica set \"{}\"", rs.name_any());
                ro::set_condition(
                    &mut s,
                    ro::new_condition("Progressing", "True", ro::FOUND_NEW_RS, msg, self.now),
                );
                self.write_status(s).await?;
            }
            return Ok(Some(rs));
        }
        if !create {
            return Ok(None);
        }
        self.create_replica_set(old, new_revision, max_surge)
            .await
            .map(Some)
    }

    async fn create_replica_set(
        &mut self,
        old: &[ReplicaSet],
        new_revision: i64,
        max_surge: i32,
    ) -> Result<ReplicaSet> {
        let d = &self.d;
        let collisions = d.status.as_ref().and_then(|s| s.collision_count);
        let hash = template_hash(&d.spec.template, collisions);
        let mut template = d.spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert(ro::POD_TEMPLATE_HASH.into(), hash.clone());
        let mut sel = d.spec.selector.clone();
        sel.match_labels
            .get_or_insert_with(Default::default)
            .insert(ro::POD_TEMPLATE_HASH.into(), hash.clone());
        let name = format!("{}-{hash}", self.name);
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.ns.clone()),
                owner_references: Some(vec![claim::controller_ref(d)]),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..Default::default()
            },
            spec: ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: d.spec.min_ready_seconds,
                selector: sel,
                template: Some(template),
            },
            status: None,
        };
        let all: Vec<&ReplicaSet> = old.iter().chain([&rs]).collect();
        let replicas = ro::new_rs_new_replicas(d, ro::surge_count(&all), 0, max_surge);
        rs.spec.replicas = Some(replicas);
        ro::set_new_rs_annotations(d, &mut rs, new_revision, false, max_surge);
        let (created, already) = match self.replicasets().create(&PostParams::default(), &rs).await
        {
            Ok(c) => (c, false),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                (self.existing_or_collision(&name).await?, true)
            }
            Err(e) => {
                let msg = format!("Failed to create new replica set \"{name}\": {e}");
                if ro::progress_deadline(&self.d).is_some() {
                    let mut s = self.d.status.clone().unwrap_or_default();
                    ro::set_condition(
                        &mut s,
                        ro::new_condition(
                            "Progressing",
                            "False",
                            ro::FAILED_RS_CREATE,
                            msg.clone(),
                            self.now,
                        ),
                    );
                    // The create error is what matters; a failed status
                    // write is retried with it.
                    let _ = self.write_status(s).await;
                }
                self.st.events.warning(&self.d, ro::FAILED_RS_CREATE, msg);
                return Err(e).ctx(|| format!("creating replica set {}/{name}", self.ns));
            }
        };
        if !already && replicas > 0 {
            self.st.events.normal(
                &self.d,
                "ScalingReplicaSet",
                format!("Scaled up replica set {name} from 0 to {replicas}"),
            );
        }
        self.set_revision(&new_revision.to_string()).await?;
        if !already && ro::progress_deadline(&self.d).is_some() {
            let mut s = self.d.status.clone().unwrap_or_default();
            let msg = format!("Created new replica set \"{name}\"");
            ro::set_condition(
                &mut s,
                ro::new_condition("Progressing", "True", ro::NEW_RS_CREATED, msg, self.now),
            );
            self.write_status(s).await?;
        }
        tracing::info!(deployment = %self.key(), replicaset = %name, replicas, "created replica set");
        Ok(created)
    }

    /// A ReplicaSet of the new name exists: ours (a cache that lagged), or
    /// another template with the same hash, which a bumped collisionCount
    /// renames on the next sync.
    async fn existing_or_collision(&mut self, name: &str) -> Result<ReplicaSet> {
        let rs = self
            .replicasets()
            .get(name)
            .await
            .ctx(|| format!("reading existing replica set {}/{name}", self.ns))?;
        let ours = claim::controller_of(&rs.metadata)
            .is_some_and(|r| Some(&r.uid) == self.d.metadata.uid.as_ref());
        if ours
            && rs
                .spec
                .template
                .as_ref()
                .is_some_and(|t| ro::equal_ignore_hash(t, &self.d.spec.template))
        {
            return Ok(rs);
        }
        let mut s = self.d.status.clone().unwrap_or_default();
        s.collision_count = Some(s.collision_count.unwrap_or(0) + 1);
        tracing::info!(deployment = %self.key(), replicaset = name, "pod template hash collision, bumping collisionCount");
        self.write_status(s).await?;
        Err(workload::Error::Invalid(format!(
            "replica set {}/{name} exists with another template; retrying with a new collisionCount",
            self.ns
        )))
    }

    /// Put the revision annotation on the Deployment (where kubectl reads
    /// it) when it differs.
    async fn set_revision(&mut self, rev: &str) -> Result<()> {
        let cur = self
            .d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ro::REVISION));
        if cur.map(String::as_str) == Some(rev) {
            return Ok(());
        }
        let patch = json!({"metadata": {
            "resourceVersion": self.d.metadata.resource_version,
            "annotations": {ro::REVISION: rev},
        }});
        self.d = self
            .deployments()
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ctx(|| format!("setting the revision of deployment {}", self.key()))?;
        Ok(())
    }

    /// Write `s` as the status, unless it is what the API already has.
    async fn write_status(&mut self, s: DeploymentStatus) -> Result<()> {
        if self.d.status.as_ref() == Some(&s) {
            return Ok(());
        }
        let mut d = self.d.clone();
        d.status = Some(s);
        self.d = self
            .deployments()
            .replace_status(&self.name, &PostParams::default(), &d)
            .await
            .ctx(|| format!("updating status of deployment {}", self.key()))?;
        Ok(())
    }

    /// Resize `rs` to `to`, recording a ScalingReplicaSet event. Returns
    /// whether its size changed, and the ReplicaSet as written.
    async fn scale_rs(&mut self, rs: &ReplicaSet, to: i32) -> Result<(bool, ReplicaSet)> {
        let from = rs_replicas(rs);
        let (max_surge, _) = self.fenceposts()?;
        let (want, max) = (desired(&self.d), desired(&self.d) + max_surge);
        let resize = from != to;
        if !resize && !ro::replicas_annotations_need_update(rs, want, max) {
            return Ok((false, rs.clone()));
        }
        let mut copy = rs.clone();
        copy.spec.replicas = Some(to);
        ro::set_replicas_annotations(&mut copy, want, max);
        let written = self
            .replicasets()
            .replace(&rs.name_any(), &PostParams::default(), &copy)
            .await
            .ctx(|| {
                format!(
                    "scaling replica set {}/{} from {from} to {to}",
                    self.ns,
                    rs.name_any()
                )
            })?;
        if resize {
            let op = if from < to { "up" } else { "down" };
            let msg = format!(
                "Scaled {op} replica set {} from {from} to {to}",
                rs.name_any()
            );
            tracing::info!(deployment = %self.key(), replicaset = %rs.name_any(), from, to, "scaled replica set");
            self.st.events.normal(&self.d, "ScalingReplicaSet", msg);
        }
        Ok((resize, written))
    }

    /// Paused Deployments and changes of replicas: resize only (upstream
    /// `sync`).
    async fn sync(&mut self, rss: &mut Vec<ReplicaSet>) -> Result<Action> {
        let (new_rs, mut old) = self.all_replica_sets(rss, false).await?;
        self.scale(new_rs.as_ref(), &mut old).await?;
        if self.d.spec.paused == Some(true) {
            self.cleanup(&old).await?;
        }
        self.sync_status(new_rs.as_ref(), &old).await?;
        Ok(Action::await_change())
    }

    async fn scale(&mut self, new_rs: Option<&ReplicaSet>, old: &mut [ReplicaSet]) -> Result<()> {
        if let Some(rs) = ro::find_active_or_latest(new_rs, old).cloned() {
            if rs_replicas(&rs) != desired(&self.d) {
                self.scale_rs(&rs, desired(&self.d)).await?;
            }
            return Ok(());
        }
        if let Some(new_rs) = new_rs {
            if ro::is_saturated(&self.d, new_rs) {
                for rs in old.iter().filter(|rs| rs_replicas(rs) > 0) {
                    self.scale_rs(rs, 0).await?;
                }
                return Ok(());
            }
        }
        if !ro::is_rolling(&self.d) {
            return Ok(());
        }
        let (max_surge, _) = self.fenceposts()?;
        let active: Vec<ReplicaSet> = old
            .iter()
            .chain(new_rs)
            .filter(|rs| rs_replicas(rs) > 0)
            .cloned()
            .collect();
        let refs: Vec<&ReplicaSet> = active.iter().collect();
        let status_replicas = self.d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let sizes = ro::proportional_sizes(&self.d, &refs, max_surge, status_replicas);
        for (rs, size) in active.iter().zip(sizes) {
            self.scale_rs(rs, size).await?;
        }
        Ok(())
    }

    /// One step of a rolling update (upstream `rolloutRolling`).
    async fn rollout_rolling(&mut self, rss: &mut Vec<ReplicaSet>) -> Result<Action> {
        let (new_rs, old) = self.all_replica_sets(rss, true).await?;
        let Some(new_rs) = new_rs else {
            return Ok(Action::await_change());
        };
        let all: Vec<&ReplicaSet> = old.iter().chain([&new_rs]).collect();
        if !all.iter().all(|rs| ro::rs_observed(rs)) {
            // A status that does not reflect its spec yet cannot be
            // trusted for availability; its update wakes us again.
            return self.sync_rollout_status(Some(&new_rs), &old).await;
        }
        if self.reconcile_new(&all, &new_rs).await? {
            return self.sync_rollout_status(Some(&new_rs), &old).await;
        }
        if self.reconcile_old(&all, &old, &new_rs).await? {
            return self.sync_rollout_status(Some(&new_rs), &old).await;
        }
        if ro::deployment_complete(&self.d, &self.d.status.clone().unwrap_or_default()) {
            self.cleanup(&old).await?;
        }
        self.sync_rollout_status(Some(&new_rs), &old).await
    }

    /// Scale the new ReplicaSet up as far as maxSurge allows (or down to
    /// the desired count). Returns whether it was resized.
    async fn reconcile_new(&mut self, all: &[&ReplicaSet], new_rs: &ReplicaSet) -> Result<bool> {
        let want = desired(&self.d);
        let have = rs_replicas(new_rs);
        if have == want {
            return Ok(false);
        }
        if have > want {
            return Ok(self.scale_rs(new_rs, want).await?.0);
        }
        let (max_surge, _) = self.fenceposts()?;
        let to = ro::new_rs_new_replicas(&self.d, ro::surge_count(all), have, max_surge);
        Ok(self.scale_rs(new_rs, to).await?.0)
    }

    /// Scale old ReplicaSets down as far as maxUnavailable allows, their
    /// unhealthy pods first (upstream `reconcileOldReplicaSets`).
    async fn reconcile_old(
        &mut self,
        all: &[&ReplicaSet],
        old: &[ReplicaSet],
        new_rs: &ReplicaSet,
    ) -> Result<bool> {
        let mut old: Vec<ReplicaSet> = old
            .iter()
            .filter(|rs| rs_replicas(rs) > 0)
            .cloned()
            .collect();
        if old.is_empty() {
            return Ok(false);
        }
        let (_, max_unavailable) = self.fenceposts()?;
        let all_pods: i32 = all.iter().map(|rs| rs_replicas(rs)).sum();
        let min_available = desired(&self.d) - max_unavailable;
        let new_unavailable = rs_replicas(new_rs) - ro::rs_available(new_rs);
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        old.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        });

        // Unhealthy replicas first: removing them costs no availability.
        let mut cleaned = 0;
        for rs in old.iter_mut() {
            if cleaned >= max_scaled_down {
                break;
            }
            let (want, avail) = (rs_replicas(rs), ro::rs_available(rs));
            if want == 0 || want == avail {
                continue;
            }
            let n = (max_scaled_down - cleaned).min(want - avail);
            let (_, written) = self.scale_rs(rs, want - n).await?;
            *rs = written;
            cleaned += n;
        }

        // Then healthy ones, down to minAvailable.
        let mut all_now: Vec<&ReplicaSet> = old.iter().collect();
        all_now.push(new_rs);
        let available: i32 = all_now.iter().map(|rs| ro::rs_available(rs)).sum();
        let mut scaled = 0;
        if available > min_available {
            let total = available - min_available;
            for rs in old.clone() {
                if scaled >= total {
                    break;
                }
                let want = rs_replicas(&rs);
                if want == 0 {
                    continue;
                }
                let n = want.min(total - scaled);
                self.scale_rs(&rs, want - n).await?;
                scaled += n;
            }
        }
        Ok(cleaned + scaled > 0)
    }

    /// One step of a Recreate rollout: old pods all gone before the new
    /// ReplicaSet scales up (upstream `rolloutRecreate`).
    async fn rollout_recreate(&mut self, rss: &mut Vec<ReplicaSet>) -> Result<Action> {
        let (mut new_rs, mut old) = self.all_replica_sets(rss, false).await?;
        let mut scaled_down = false;
        for rs in old
            .iter()
            .filter(|rs| rs_replicas(rs) > 0)
            .cloned()
            .collect::<Vec<_>>()
        {
            scaled_down |= self.scale_rs(&rs, 0).await?.0;
        }
        if scaled_down {
            return self.sync_rollout_status(new_rs.as_ref(), &old).await;
        }
        if self.old_pods_running(new_rs.as_ref(), &old).await? {
            self.sync_rollout_status(new_rs.as_ref(), &old).await?;
            // Terminating pods do not show in ReplicaSet status: look again.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        if new_rs.is_none() {
            (new_rs, old) = self.all_replica_sets(rss, true).await?;
        }
        if let Some(rs) = &new_rs {
            if rs_replicas(rs) != desired(&self.d) {
                let (_, written) = self.scale_rs(rs, desired(&self.d)).await?;
                new_rs = Some(written);
            }
        }
        if ro::deployment_complete(&self.d, &self.d.status.clone().unwrap_or_default()) {
            self.cleanup(&old).await?;
        }
        self.sync_rollout_status(new_rs.as_ref(), &old).await
    }

    /// Whether pods of old ReplicaSets still exist and have not finished.
    async fn old_pods_running(
        &self,
        new_rs: Option<&ReplicaSet>,
        old: &[ReplicaSet],
    ) -> Result<bool> {
        if old.iter().any(|rs| ro::rs_actual(rs) > 0) {
            return Ok(true);
        }
        let old_uids: Vec<&str> = old
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .collect();
        if old_uids.is_empty() {
            return Ok(false);
        }
        let new_uid = new_rs.and_then(|rs| rs.metadata.uid.as_deref());
        let pods = Api::<Pod>::namespaced(self.st.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .ctx(|| format!("listing pods of deployment {}", self.key()))?;
        Ok(pods.items.iter().any(|p| {
            let owner = claim::controller_of(&p.metadata).map(|r| r.uid.as_str());
            owner.is_some_and(|o| old_uids.contains(&o) && Some(o) != new_uid)
                && !crate::pods::is_finished(p)
        }))
    }

    /// Delete old ReplicaSets without pods beyond revisionHistoryLimit,
    /// oldest revisions first.
    async fn cleanup(&mut self, old: &[ReplicaSet]) -> Result<()> {
        let Some(limit) = self.d.spec.revision_history_limit else {
            return Ok(());
        };
        let mut alive: Vec<&ReplicaSet> = old
            .iter()
            .filter(|rs| rs.metadata.deletion_timestamp.is_none())
            .collect();
        let extra = alive.len() as i64 - i64::from(limit.max(0));
        if extra <= 0 {
            return Ok(());
        }
        alive.sort_by(|a, b| {
            ro::revision(a).cmp(&ro::revision(b)).then_with(|| {
                a.metadata
                    .creation_timestamp
                    .cmp(&b.metadata.creation_timestamp)
            })
        });
        for rs in alive.into_iter().take(extra as usize) {
            if ro::rs_actual(rs) != 0 || rs_replicas(rs) != 0 || !ro::rs_observed(rs) {
                continue;
            }
            let name = rs.name_any();
            match self
                .replicasets()
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    tracing::info!(deployment = %self.key(), replicaset = %name, "deleted old replica set beyond revisionHistoryLimit")
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    return Err(e).ctx(|| format!("deleting old replica set {}/{name}", self.ns))
                }
            }
        }
        Ok(())
    }

    /// Status from the ReplicaSets (upstream `syncDeploymentStatus`).
    async fn sync_status(&mut self, new_rs: Option<&ReplicaSet>, old: &[ReplicaSet]) -> Result<()> {
        let (_, max_unavailable) = self.fenceposts()?;
        let all: Vec<&ReplicaSet> = old.iter().chain(new_rs).collect();
        let s = ro::calculate_status(&self.d, &all, new_rs, max_unavailable, self.now);
        self.write_status(s).await
    }

    /// Status with the Progressing condition (upstream
    /// `syncRolloutStatus`); requeues for the progress deadline.
    async fn sync_rollout_status(
        &mut self,
        new_rs: Option<&ReplicaSet>,
        old: &[ReplicaSet],
    ) -> Result<Action> {
        let (_, max_unavailable) = self.fenceposts()?;
        let all: Vec<&ReplicaSet> = old.iter().chain(new_rs).collect();
        let mut s = ro::calculate_status(&self.d, &all, new_rs, max_unavailable, self.now);
        let has_deadline = ro::progress_deadline(&self.d).is_some();
        if !has_deadline {
            ro::remove_condition(&mut s, "Progressing");
        }
        let cur = self.d.status.clone().unwrap_or_default();
        let current = ro::condition(&cur, "Progressing");
        let complete_before = s.replicas == s.updated_replicas
            && current.is_some_and(|c| c.reason.as_deref() == Some(ro::NEW_RS_AVAILABLE));
        if has_deadline && !complete_before {
            let rs_name = new_rs.map(|rs| rs.name_any());
            let what = |end: &str| match &rs_name {
                Some(n) => format!("ReplicaSet \"{n}\" {end}"),
                None => format!("Deployment \"{}\" {end}", self.name),
            };
            if ro::deployment_complete(&self.d, &s) {
                let c = ro::new_condition(
                    "Progressing",
                    "True",
                    ro::NEW_RS_AVAILABLE,
                    what("has successfully progressed."),
                    self.now,
                );
                ro::set_condition(&mut s, c);
            } else if ro::deployment_progressing(&self.d, &s) {
                let mut c = ro::new_condition(
                    "Progressing",
                    "True",
                    ro::RS_UPDATED,
                    what("is progressing."),
                    self.now,
                );
                // Progress refreshes lastUpdateTime even with the same
                // reason: that is what the deadline counts from.
                if let Some(cur) = current {
                    if cur.status.as_deref() == Some("True") {
                        c.last_transition_time = cur.last_transition_time.clone();
                    }
                    ro::remove_condition(&mut s, "Progressing");
                }
                ro::set_condition(&mut s, c);
            } else if ro::timed_out(&self.d, &s, self.now) {
                let c = ro::new_condition(
                    "Progressing",
                    "False",
                    ro::TIMED_OUT,
                    what("has timed out progressing."),
                    self.now,
                );
                ro::set_condition(&mut s, c);
            }
        }
        match failure_condition(&all, new_rs) {
            Some(f) => ro::set_condition(&mut s, f),
            None => ro::remove_condition(&mut s, "ReplicaFailure"),
        }
        self.write_status(s.clone()).await?;
        // Look again when the deadline passes, unless progress comes first.
        Ok(match ro::deadline_at(&self.d, &s) {
            Some(at) if !ro::deployment_complete(&self.d, &s) => {
                let secs = at.duration_since(self.now).as_secs().max(0) as u64;
                Action::requeue(Duration::from_secs(secs + 1))
            }
            _ => Action::await_change(),
        })
    }

    /// Paused and resumed show in Progressing, so the deadline does not
    /// count the time a Deployment spent paused.
    async fn check_paused_conditions(&mut self) -> Result<()> {
        if ro::progress_deadline(&self.d).is_none() {
            return Ok(());
        }
        let mut s = self.d.status.clone().unwrap_or_default();
        let cond = ro::condition(&s, "Progressing");
        if cond.is_some_and(|c| c.reason.as_deref() == Some(ro::TIMED_OUT)) {
            return Ok(());
        }
        let paused_cond = cond.is_some_and(|c| c.reason.as_deref() == Some(ro::PAUSED));
        let paused = self.d.spec.paused == Some(true);
        if paused && !paused_cond {
            ro::set_condition(
                &mut s,
                ro::new_condition(
                    "Progressing",
                    "Unknown",
                    ro::PAUSED,
                    "Deployment is paused".into(),
                    self.now,
                ),
            );
        } else if !paused && paused_cond {
            ro::set_condition(
                &mut s,
                ro::new_condition(
                    "Progressing",
                    "Unknown",
                    ro::RESUMED,
                    "Deployment is resumed".into(),
                    self.now,
                ),
            );
        } else {
            return Ok(());
        }
        self.write_status(s).await
    }
}

/// A ReplicaFailure condition of the new (or else any) ReplicaSet, carried
/// over to the Deployment.
fn failure_condition(
    all: &[&ReplicaSet],
    new_rs: Option<&ReplicaSet>,
) -> Option<k8s_openapi::api::apps::v1::DeploymentCondition> {
    let from = |rs: &ReplicaSet| {
        rs.status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_.as_deref() == Some("ReplicaFailure"))
            .map(|c| k8s_openapi::api::apps::v1::DeploymentCondition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: c.last_transition_time.clone(),
                last_update_time: c.last_transition_time.clone(),
            })
    };
    new_rs
        .and_then(from)
        .or_else(|| all.iter().find_map(|rs| from(rs)))
}
