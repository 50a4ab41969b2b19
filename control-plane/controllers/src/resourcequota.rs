//! ResourceQuota controller (upstream `pkg/controller/resourcequota`):
//! keeps each quota's `status` true to what its namespace holds.
//!
//! Observe: the quota and the objects of its namespace it counts (from
//! the shared informers). Diff: their usage, in the quota's scopes,
//! against `status.used`, and `spec.hard` against `status.hard`. Act:
//! write `status` (with the quota's resourceVersion: a charge by the
//! API server's quota admission in between makes it a conflict, and the
//! retry counts again).
//!
//! Admission charges new objects; this controller is what gives back
//! what deleted and finished (Succeeded, Failed) pods, claims and the
//! like held. As upstream, a quota is synced when its `hard` changes,
//! when an object it may count is deleted (or a pod ends, or a claim or
//! Service changes), and on a periodic resync.
//!
//! # Caveats
//! `count/<resource>.<group>` is recomputed for the kinds listed in
//! [`run_with`] only (the core kinds, apps and batch workloads); other
//! kinds keep what admission charged them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota,
    ResourceQuotaStatus, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use kube_util::informer::Informer;
use kube_util::quota as usage;
use serde_json::Value;

use crate::workload::{self, AbortOnDrop, ApiResultExt, Result};

/// Upstream's `--resource-quota-sync-period`.
pub const RESYNC: Duration = Duration::from_secs(5 * 60);

/// A kind's objects of a namespace, as JSON.
type ListFn = Box<dyn Fn(&str) -> Vec<Value> + Send + Sync>;

/// One kind the controller counts: its group and plural, and its objects
/// of a namespace as JSON.
struct Counted {
    group: &'static str,
    plural: &'static str,
    list: ListFn,
}

struct State {
    client: kube::Client,
    kinds: Vec<Counted>,
    resync: Duration,
}

/// Run the resourcequota controller with upstream's resync period.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    run_with(ctx, RESYNC).await
}

/// Run the resourcequota controller, syncing every quota at least every
/// `resync` (tests shorten it).
///
/// # Errors
/// The caches cannot be filled.
pub async fn run_with(ctx: crate::Ctx, resync: Duration) -> Result<(), crate::Error> {
    let (tx, rx) = mpsc::channel(1024);
    let quotas = ctx.informers.get::<ResourceQuota>();
    let mut triggers = vec![workload::trigger(
        &quotas,
        tx.clone(),
        |q: &ResourceQuota, exists| {
            exists
                .then(|| ObjectRef::from_obj(q))
                .filter(|_| needs_sync(q))
        },
    )];
    let mut kinds = Vec::new();
    // Pods release on deletion and when they end; claims and Services
    // change usage in place (resize, type); the rest only by deletion.
    let ended = |p: &Pod| {
        matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    };
    counted::<Pod>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, ended).await?;
    counted::<PersistentVolumeClaim>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| true)
        .await?;
    counted::<Service>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| true).await?;
    counted::<ConfigMap>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<Secret>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<ReplicationController>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false)
        .await?;
    counted::<ResourceQuota>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<Deployment>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<ReplicaSet>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<StatefulSet>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<DaemonSet>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<Job>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    counted::<CronJob>(&ctx, &quotas, &tx, &mut kinds, &mut triggers, |_| false).await?;
    workload::ready(&quotas).await?;
    let state = Arc::new(State {
        client: ctx.client.clone(),
        kinds,
        resync,
    });
    workload::drive(
        "resourcequota",
        quotas.store().clone(),
        rx,
        state,
        reconcile,
    )
    .await;
    drop(triggers);
    Ok(())
}

/// Count kind `K`: its objects through the shared informer, and the
/// quotas of an object's namespace synced when it is deleted or when
/// `changes(obj)` says its usage may have moved.
async fn counted<K>(
    ctx: &crate::Ctx,
    quotas: &Informer<ResourceQuota>,
    tx: &mpsc::Sender<ObjectRef<ResourceQuota>>,
    kinds: &mut Vec<Counted>,
    triggers: &mut Vec<AbortOnDrop<()>>,
    changes: fn(&K) -> bool,
) -> Result<(), crate::Error>
where
    K: kube_util::informer::Object + k8s_openapi::Resource + serde::Serialize,
{
    let informer = ctx.informers.get::<K>();
    let quotas = quotas.clone();
    triggers.push(workload::trigger(
        &informer,
        tx.clone(),
        move |obj: &K, exists| {
            if exists && !changes(obj) {
                return Vec::new();
            }
            let ns = obj.namespace();
            quotas
                .list()
                .iter()
                .filter(|q| q.metadata.namespace == ns)
                .map(|q| ObjectRef::from_obj(&**q))
                .collect()
        },
    ));
    workload::ready(&informer).await?;
    kinds.push(Counted {
        group: <K as k8s_openapi::Resource>::GROUP,
        plural: <K as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        list: Box::new(move |ns| {
            informer
                .list_namespace(ns)
                .iter()
                .filter_map(|o| serde_json::to_value(&**o).ok())
                .collect()
        }),
    });
    Ok(())
}

/// The quota's status is not (yet) about its current `hard`.
fn needs_sync(q: &ResourceQuota) -> bool {
    let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
    let status = q.status.as_ref();
    let used = status.and_then(|s| s.used.as_ref());
    status.and_then(|s| s.hard.as_ref()) != hard
        || hard.is_some_and(|h| h.keys().any(|k| used.is_none_or(|u| !u.contains_key(k))))
}

/// What the quota's namespace uses of each of its hard resources.
fn used(q: &Value, hard: &usage::Usage, kinds: &[Counted]) -> usage::Usage {
    let ns = q["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut used: usage::Usage = hard.keys().map(|k| (k.clone(), 0)).collect();
    for kind in kinds {
        if !usage::constrains(hard, kind.group, kind.plural) {
            continue;
        }
        for obj in (kind.list)(ns) {
            usage::add_usage(&mut used, q, kind.group, kind.plural, &obj);
        }
    }
    used
}

fn quantities(u: &usage::Usage) -> BTreeMap<String, Quantity> {
    u.iter()
        .map(|(k, v)| (k.clone(), Quantity(usage::format(k, *v))))
        .collect()
}

async fn reconcile(q: Arc<ResourceQuota>, st: Arc<State>) -> Result<Action> {
    let obj = serde_json::to_value(&*q).unwrap_or(Value::Null);
    let hard = usage::parse_list(&obj["spec"]["hard"]);
    let now = used(&obj, &hard, &st.kinds);
    let status = ResourceQuotaStatus {
        hard: q.spec.as_ref().and_then(|s| s.hard.clone()),
        used: Some(quantities(&now)),
    };
    // Compare amounts, not spellings: `1Gi` and `1073741824` are one.
    let current = q.status.as_ref();
    let same_used = current
        .and_then(|s| s.used.as_ref())
        .is_some_and(|u| usage::parse_list(&serde_json::to_value(u).unwrap_or_default()) == now);
    if same_used && current.and_then(|s| s.hard.as_ref()) == status.hard.as_ref() {
        return Ok(Action::requeue(st.resync));
    }
    let mut updated = (*q).clone();
    updated.status = Some(status);
    let ns = q.namespace().unwrap_or_default();
    Api::<ResourceQuota>::namespaced(st.client.clone(), &ns)
        .replace_status(&q.name_any(), &PostParams::default(), &updated)
        .await
        .ctx(|| format!("update status of resourcequota {ns}/{}", q.name_any()))?;
    Ok(Action::requeue(st.resync))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(v: Value) -> ResourceQuota {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn synced_when_hard_moved_or_used_is_missing() {
        let spec = json!({"hard": {"pods": "2"}});
        assert!(needs_sync(&quota(json!({"spec": spec}))));
        assert!(needs_sync(&quota(
            json!({"spec": spec, "status": {"hard": {"pods": "1"}, "used": {"pods": "0"}}})
        )));
        assert!(needs_sync(&quota(
            json!({"spec": spec, "status": {"hard": {"pods": "2"}}})
        )));
        assert!(!needs_sync(&quota(
            json!({"spec": spec, "status": {"hard": {"pods": "2"}, "used": {"pods": "5"}}})
        )));
    }
}
