//! The volume controllers (upstream's `pkg/controller/volume/...`):
//! binding claims to volumes and provisioning local-path volumes
//! ([`binder`], [`provision`]), growing bound volumes ([`expand`]), the
//! protection finalizers ([`protection`]) and the claims of generic
//! ephemeral volumes ([`ephemeral`]).
//!
//! Each loop is level-triggered over whole caches: any change of a kind
//! it reads (and a periodic resync, as upstream's 15 s) runs one pass
//! that looks at every object, decides with the pure functions of its
//! module and writes what differs. Writes carry the resourceVersion they
//! were decided from; a conflict is simply decided again next pass.

pub mod binder;
pub mod ephemeral;
pub mod expand;
pub mod protection;
pub mod provision;

use std::pin::Pin;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use kube_util::informer::{Informer, Object};
use serde_json::json;

use crate::Error;

/// How often every object is looked at again without a change
/// (upstream's `--pvclaimbinder-sync-period` default).
const RESYNC: Duration = Duration::from_secs(15);

/// The change streams a pass waits on, merged.
type Triggers = futures::stream::SelectAll<Pin<Box<dyn Stream<Item = ()> + Send>>>;

fn trigger<K: Object>(informer: &Informer<K>) -> Pin<Box<dyn Stream<Item = ()> + Send>> {
    informer.subscribe().into_stream().map(|_| ()).boxed()
}

/// Wait until an informer changes or the resync is due, taking every
/// change already queued so one pass covers a burst. `false` once every
/// watch ended.
async fn next_pass(triggers: &mut Triggers, tick: &mut tokio::time::Interval) -> bool {
    tokio::select! {
        got = triggers.next() => {
            if got.is_none() {
                return false;
            }
            while let Some(Some(())) = triggers.next().now_or_never() {}
            true
        }
        _ = tick.tick() => true,
    }
}

fn resync() -> tokio::time::Interval {
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

async fn ready<K: Object>(informer: &Informer<K>) -> Result<(), Error> {
    informer
        .ready()
        .await
        .map_err(|e| Error::Config(e.to_string()))
}

/// Whether a write failed only because the object changed or went away
/// meanwhile: the next pass decides again from the newer state.
fn stale(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404 || r.code == 409)
}

/// Log a failed write (the pass goes on with the other objects).
fn log_write(what: &str, name: &str, e: &kube::Error) {
    if stale(e) {
        tracing::debug!(
            object = name,
            "{what}: object changed meanwhile, retrying next pass: {e}"
        );
    } else {
        tracing::warn!(object = name, "{what} failed: {e}");
    }
}

/// `meta`'s finalizers without `finalizer`, if it has it.
fn without_finalizer(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<String>> {
    let list = meta.finalizers.as_deref().unwrap_or_default();
    list.iter()
        .any(|f| f == finalizer)
        .then(|| list.iter().filter(|f| *f != finalizer).cloned().collect())
}

/// `meta`'s finalizers with `finalizer` added, if it lacks it.
fn with_finalizer(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<String>> {
    let list = meta.finalizers.as_deref().unwrap_or_default();
    (!list.iter().any(|f| f == finalizer)).then(|| {
        let mut l = list.to_vec();
        l.push(finalizer.to_string());
        l
    })
}

/// Replace the finalizers of `obj`, as of the version it was read at.
async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<K, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = obj.meta();
    let patch = json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "finalizers": finalizers,
    }});
    api.patch(
        meta.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Merge `status` into the status of `obj`, as of the version it was read
/// at (a conflict: decided again next pass).
async fn patch_status_at<K>(
    api: &Api<K>,
    obj: &K,
    status: serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = obj.meta();
    let patch = json!({
        "metadata": {"resourceVersion": meta.resource_version},
        "status": status,
    });
    api.patch_status(
        meta.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}
