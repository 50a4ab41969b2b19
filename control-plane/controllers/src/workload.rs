//! Shared machinery of the workload controllers (deployment, replicaset,
//! daemonset, job): triggers that turn every change of a shared informer
//! into reconcile requests, the applier loop that runs one reconcile per
//! object at a time, and the error type of those reconciles.
//!
//! Why not `Controller::owns`/`watches`: those open a second watch for
//! every related kind and fire before any cache of that kind is updated, so
//! a reconcile woken by "pod became ready" could read a cache that does not
//! show it yet and never be woken again. Here a trigger comes from the
//! informer's subscription, which hears of a change only after its cache
//! applied it; a relist (after a watch desync) replays once the fresh list
//! is in place, including deletions of objects that vanished meanwhile
//! (upstream informers' `DeletedFinalStateUnknown`).

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use kube_util::informer::{Informer, Object};
use tokio::task::JoinHandle;

/// What a workload reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed; `action` names the request and the object.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The object's spec cannot be acted on (for example a maxSurge that
    /// is neither a number nor a percentage); fix the object.
    #[error("{0}")]
    Invalid(String),
    /// A reconcile task panicked or was cancelled.
    #[error("reconcile task ended abnormally: {0}")]
    Task(#[from] tokio::task::JoinError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The API answered 409: our cached copy was stale, or someone else
    /// wrote first. The next watch event brings a fresh copy.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// Attach what was being done to an API error.
pub trait ApiResultExt<T> {
    fn ctx(self, action: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ApiResultExt<T> for Result<T, kube::Error> {
    fn ctx(self, action: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Api {
            action: action(),
            source,
        })
    }
}

/// Whether a kube error is the API's 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Turn every change of `informer` into reconcile requests: after the
/// informer's store applied a change to an object, `map(object,
/// still_exists)` names the roots to reconcile, which are sent on `tx`.
/// Runs until the returned handle is dropped or `tx`'s receiver is.
pub fn trigger<K, R, I, M>(
    informer: &Informer<K>,
    tx: mpsc::Sender<ObjectRef<R>>,
    mut map: M,
) -> AbortOnDrop<()>
where
    K: Object,
    R: Resource<DynamicType = ()> + 'static,
    I: IntoIterator<Item = ObjectRef<R>>,
    M: FnMut(&K, bool) -> I + Send + 'static,
{
    let mut changes = informer.subscribe();
    AbortOnDrop::spawn(async move {
        let mut tx = tx;
        while let Some(change) = changes.recv().await {
            let Some((obj, exists)) = change.object() else {
                continue;
            };
            let roots: Vec<ObjectRef<R>> = map(obj, exists).into_iter().collect();
            for r in roots {
                if tx.send(r).await.is_err() {
                    return;
                }
            }
        }
    })
}

/// Wait until `informer` has its first full list. A reconcile that read a
/// half-filled cache would, for example, create pods that exist.
pub async fn ready<K: Object>(informer: &Informer<K>) -> Result<(), crate::Error> {
    informer
        .ready()
        .await
        .map_err(|e| crate::Error::Config(format!("cache never filled: {e}")))
}

/// The API refused a create because the namespace is being deleted: the
/// namespace controller removes the owner soon, so this is no failure
/// (upstream ignores `NamespaceTerminating` the same way).
pub fn is_namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 && s.message.contains("because it is being terminated"))
}

/// A reconcile request for `obj` itself (the usual `map` of a root cache).
pub fn itself<K: Resource<DynamicType = ()>>(obj: &K) -> Option<ObjectRef<K>> {
    Some(ObjectRef::from_obj(obj))
}

/// The reconcile requests for the owners of kind `R` named by `obj`'s
/// controller reference.
pub fn controller_owner<R: Resource<DynamicType = ()>>(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<ObjectRef<R>> {
    let r = crate::workload_claim::controller_of(meta)?;
    let (group, _) = split_api_version(&r.api_version);
    if r.kind != R::kind(&()) || group != R::group(&()) {
        return None;
    }
    Some(ObjectRef::new(&r.name).within(meta.namespace.as_deref().unwrap_or_default()))
}

fn split_api_version(v: &str) -> (&str, &str) {
    match v.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", v),
    }
}

/// Run `reconcile` for every object of `store` named on `queue`, one at a
/// time per object, until the queue closes. Failed reconciles are retried
/// after a pause (sooner for conflicts, which a fresh watch event resolves).
pub async fn drive<K, C, F, Fut>(
    name: &'static str,
    store: Store<K>,
    queue: mpsc::Receiver<ObjectRef<K>>,
    ctx: Arc<C>,
    reconcile: F,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let runs = controller::applier(
        move |obj, ctx| {
            let reconcile = reconcile.clone();
            AbortOnDrop(tokio::spawn(async move { reconcile(obj, ctx).await }))
        },
        move |obj: Arc<K>, err: &Error, _| {
            if err.is_conflict() {
                tracing::debug!(controller = name, object = %obj.name_any(), "stale write, retrying: {err}");
                Action::requeue(Duration::from_millis(500))
            } else {
                tracing::warn!(controller = name, namespace = obj.namespace().unwrap_or_default(), object = %obj.name_any(), "reconcile failed, retrying in 5s: {err}");
                Action::requeue(Duration::from_secs(5))
            }
        },
        ctx,
        store,
        queue.map(Ok::<_, Infallible>),
        controller::Config::default(),
    );
    runs.for_each(|r| async move {
        match r {
            Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
            // A deleted object's last events: nothing left to do.
            Err(controller::Error::ObjectNotFound(o)) => {
                tracing::trace!(controller = name, object = %o, "gone before its reconcile")
            }
            Err(e) => tracing::warn!(controller = name, "controller queue: {e}"),
        }
    })
    .await;
}

/// A spawned task that is aborted when this handle is dropped (so that a
/// controller shut down mid-reconcile leaves nothing running).
pub struct AbortOnDrop<T>(JoinHandle<T>);

impl<T: Send + 'static> AbortOnDrop<T> {
    pub fn spawn(f: impl Future<Output = T> + Send + 'static) -> Self {
        AbortOnDrop(tokio::spawn(f))
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<Result<T>> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| match r {
            Ok(out) => out,
            Err(e) => Err(Error::Task(e)),
        })
    }
}

/// Now, to the second: the API serialises times with second precision, so
/// a finer time would make every status look changed.
pub fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now())
}

/// The key expectations and logs use for a namespaced object.
pub fn key<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// Delete `pod` of `owner` (uid precondition; `grace` overrides the pod's
/// own period), recording SuccessfulDelete / FailedDelete on the owner as
/// upstream does. A failed delete is taken back from `expectations`: the
/// cache will never show a deletion that did not happen. `kind` names the
/// owner in the error ("replica set", "daemon set").
pub async fn delete_owned_pod<K: kube::Resource<DynamicType = ()>>(
    api: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    owner: &K,
    pod: &k8s_openapi::api::core::v1::Pod,
    grace: Option<u32>,
    events: &kube_util::Recorder,
    expectations: &crate::workload_expectations::Expectations,
    kind: &str,
) -> Result<()> {
    let key = key(owner);
    let name = kube::ResourceExt::name_any(pod);
    let dp = kube::api::DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(kube::api::Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {
            events.normal(owner, "SuccessfulDelete", format!("Deleted pod: {name}"));
            Ok(())
        }
        Err(e) => {
            expectations.delete_failed(&key, &name);
            if is_not_found(&e) {
                return Ok(());
            }
            events.warning(owner, "FailedDelete", format!("Error deleting: {e}"));
            Err(e).ctx(|| format!("deleting pod {name} of {kind} {key}"))
        }
    }
}
