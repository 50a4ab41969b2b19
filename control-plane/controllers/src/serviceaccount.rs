//! The ServiceAccounts controller (upstream's `serviceaccount`): every
//! active namespace has a ServiceAccount named `default`, created with the
//! namespace and again whenever it is deleted, so pods that name no
//! account (and are given `default` by admission) can be admitted.
//!
//! Also the per-namespace trigger that this controller and the root CA
//! publisher share: a namespace is reconciled when it changes and when
//! the object it should hold changes.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use kube_util::informer::{Informer, Object};

use crate::{Ctx, Error};

/// The account every namespace gets.
pub const DEFAULT_NAME: &str = "default";

const RETRY: Duration = Duration::from_secs(5);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let namespaces = ctx.informers.get::<Namespace>();
    let accounts = ctx.informers.get::<ServiceAccount>();
    let state = Arc::new(State {
        ctx,
        accounts: accounts.clone(),
    });
    per_namespace(namespaces, &accounts, state, reconcile, "serviceaccount").await;
    Ok(())
}

struct State {
    ctx: Ctx,
    accounts: Informer<ServiceAccount>,
}

/// Whether objects may still be created in `ns` (upstream skips
/// terminating namespaces: creating there is refused anyway).
pub fn active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
}

/// Run `reconcile` for each namespace as it changes, and for the
/// namespace of each `owned` object as that changes (a deleted account
/// or ConfigMap is put back), with failures retried after a pause.
pub(crate) async fn per_namespace<K, C, F, Fut>(
    namespaces: Informer<Namespace>,
    owned: &Informer<K>,
    ctx: Arc<C>,
    reconcile: F,
    controller_name: &'static str,
) where
    K: Object,
    C: Send + Sync + 'static,
    F: FnMut(Arc<Namespace>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let by_namespace = namespaces
        .subscribe()
        .objects()
        .map(|n| ObjectRef::<Namespace>::new(&n.name_any()));
    let by_owned = owned
        .subscribe()
        .objects()
        .filter_map(|o| async move { o.namespace().map(|ns| ObjectRef::<Namespace>::new(&ns)) });
    let queue = stream::select(by_namespace, by_owned).map(Ok::<_, Infallible>);
    let mut reconcile = reconcile;
    controller::applier(
        move |ns, ctx| Box::pin(reconcile(ns, ctx)),
        move |ns: Arc<Namespace>, err: &Error, _| {
            tracing::warn!(controller = controller_name, namespace = %ns.name_any(),
                "reconciling the namespace failed, retrying: {err}");
            Action::requeue(RETRY)
        },
        ctx,
        namespaces.store().clone(),
        queue,
        controller::Config::default(),
    )
    .for_each(|_| async {})
    .await;
}

/// Whether a create failure means there is nothing to do: the object
/// exists already, or the namespace is going away.
pub(crate) fn benign_create_error(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(r) => {
            r.code == 409 || (r.code == 403 && r.message.contains("is being terminated"))
        }
        _ => false,
    }
}

/// The account to create in `namespace`, if it has none.
fn wanted(namespace: &Namespace, existing: Option<&ServiceAccount>) -> Option<ServiceAccount> {
    if !active(namespace) || existing.is_some() {
        return None;
    }
    Some(ServiceAccount {
        metadata: ObjectMeta {
            name: Some(DEFAULT_NAME.into()),
            namespace: Some(namespace.name_any()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    })
}

async fn reconcile(ns: Arc<Namespace>, st: Arc<State>) -> Result<Action, Error> {
    let name = ns.name_any();
    let existing = st.accounts.get(Some(&name), DEFAULT_NAME);
    let Some(sa) = wanted(&ns, existing.as_deref()) else {
        return Ok(Action::await_change());
    };
    let api: Api<ServiceAccount> = Api::namespaced(st.ctx.client.clone(), &name);
    match api.create(&PostParams::default(), &sa).await {
        Ok(_) => tracing::info!(namespace = %name, "created the default service account"),
        Err(e) if benign_create_error(&e) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NamespaceStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ns(phase: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some("team".into()),
                ..ObjectMeta::default()
            },
            status: Some(NamespaceStatus {
                phase: phase.map(Into::into),
                ..NamespaceStatus::default()
            }),
            ..Namespace::default()
        }
    }

    #[test]
    fn active_namespaces_without_one_get_a_default_account() {
        let sa = wanted(&ns(Some("Active")), None).expect("created");
        assert_eq!(sa.metadata.name.as_deref(), Some("default"));
        assert_eq!(sa.metadata.namespace.as_deref(), Some("team"));
        // No phase yet (just created): still active.
        assert!(wanted(&ns(None), None).is_some());
    }

    #[test]
    fn existing_accounts_and_terminating_namespaces_are_left_alone() {
        let existing = wanted(&ns(None), None).unwrap();
        assert!(wanted(&ns(Some("Active")), Some(&existing)).is_none());
        assert!(wanted(&ns(Some("Terminating")), None).is_none());
        let mut deleting = ns(Some("Active"));
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(wanted(&deleting, None).is_none());
    }

    #[test]
    fn conflicts_and_terminating_namespaces_are_not_failures() {
        let err = |code, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(benign_create_error(&err(409, "exists")));
        assert!(benign_create_error(&err(
            403,
            "unable to create new content in namespace x because it is being terminated"
        )));
        assert!(!benign_create_error(&err(403, "forbidden")));
        assert!(!benign_create_error(&err(500, "boom")));
    }
}
