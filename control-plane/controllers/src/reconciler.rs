//! A reconcile function run over the objects of one shared informer:
//! kube-runtime's `Controller` (the applier with its scheduling and
//! retries) without a watch of its own, for the controllers that
//! reconcile one object at a time (namespace, CSR approval and signing,
//! token cleaning).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube_util::informer::{Informer, Object};

/// Run `reconcile` for every object of `informer` as it changes (and for
/// all of them after each list), retrying failures as `error_policy`
/// says, until the informer's watch ends.
pub async fn run<K, C, F, Fut, E>(
    informer: Informer<K>,
    ctx: Arc<C>,
    reconcile: F,
    error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
) where
    K: Object,
    C: Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    let queue = informer
        .subscribe()
        .objects()
        .map(|o| Ok::<_, Infallible>(ObjectRef::from_obj(&*o)));
    let mut reconcile = reconcile;
    controller::applier(
        move |obj, ctx| Box::pin(reconcile(obj, ctx)),
        error_policy,
        ctx,
        informer.store().clone(),
        queue,
        controller::Config::default(),
    )
    .for_each(|_| async {})
    .await;
}
