//! The ServiceAccount token controller (upstream's `serviceaccount-token`):
//! Secrets of type `kubernetes.io/service-account-token` get a long-lived
//! token for the ServiceAccount their annotation names, with the cluster CA
//! and the namespace beside it, as clients written before TokenRequest
//! expect. Secrets naming a ServiceAccount that does not exist (or no
//! longer has the uid they recorded) are deleted, as upstream does; the
//! API server refuses their tokens either way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use kube_util::informer::{Informer, Scope};

use crate::{Ctx, Error};

pub const SECRET_TYPE: &str = "kubernetes.io/service-account-token";
pub const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
pub const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

const RETRY: Duration = Duration::from_secs(5);
/// How long a Secret whose ServiceAccount is not (yet) in the cache waits
/// before it is looked at again: the account may be created right after.
const SA_GRACE: Duration = Duration::from_secs(3);

/// Signs a legacy token: the API server's service-account key, handed to
/// the controller manager as upstream's `--service-account-private-key-file`.
pub trait LegacyTokenSigner: Send + Sync + std::fmt::Debug {
    /// The token of Secret `secret` in `namespace` for ServiceAccount
    /// `sa_name` (uid `sa_uid`).
    ///
    /// # Errors
    /// Signing failed.
    fn sign_legacy(
        &self,
        namespace: &str,
        secret: &str,
        sa_name: &str,
        sa_uid: &str,
    ) -> Result<String, String>;
}

struct State {
    ctx: Ctx,
    accounts: Informer<ServiceAccount>,
    signer: Arc<dyn LegacyTokenSigner>,
    ca: Option<String>,
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let Some(signer) = ctx.config.token_signer.clone() else {
        return Err(Error::Config(
            "serviceaccount-token needs the service account signing key".into(),
        ));
    };
    let scope = Scope::default().with_fields(&format!("type={SECRET_TYPE}"));
    let secrets = ctx.informers.get_scoped::<Secret>(scope);
    let state = State {
        accounts: ctx.informers.get::<ServiceAccount>(),
        ca: ctx.config.root_ca_pem.clone(),
        signer,
        ctx,
    };
    crate::reconciler::run(secrets, Arc::new(state), reconcile, error_policy).await;
    Ok(())
}

fn error_policy(s: Arc<Secret>, err: &Error, _: Arc<State>) -> Action {
    tracing::warn!(secret = %s.name_any(), "filling the service account token failed, retrying: {err}");
    Action::requeue(RETRY)
}

/// What a token Secret needs.
#[derive(Debug, PartialEq)]
enum Plan {
    /// Complete, or not ours to touch.
    Nothing,
    /// Its ServiceAccount is not known (yet): look again later.
    Wait,
    /// Its ServiceAccount is gone or is another one now.
    Delete,
    /// Fill in the token (and whatever else is missing) for this account.
    Fill { sa_name: String, sa_uid: String },
}

fn plan(s: &Secret, sa: Option<&ServiceAccount>, ca: Option<&str>, age: Duration) -> Plan {
    if s.type_.as_deref() != Some(SECRET_TYPE) || s.metadata.deletion_timestamp.is_some() {
        return Plan::Nothing;
    }
    let ann = s.annotations();
    let Some(name) = ann.get(NAME_ANNOTATION).filter(|n| !n.is_empty()) else {
        return Plan::Nothing;
    };
    let want_uid = ann.get(UID_ANNOTATION).filter(|u| !u.is_empty());
    let Some(sa) = sa else {
        return if age < SA_GRACE {
            Plan::Wait
        } else {
            Plan::Delete
        };
    };
    let uid = sa.uid().unwrap_or_default();
    if want_uid.is_some_and(|w| *w != uid) {
        return Plan::Delete;
    }
    let data = s.data.as_ref();
    let has = |k: &str| data.is_some_and(|d| d.get(k).is_some_and(|v| !v.0.is_empty()));
    let complete =
        has("token") && has("namespace") && (ca.is_none() || has("ca.crt")) && want_uid.is_some();
    if complete {
        Plan::Nothing
    } else {
        Plan::Fill {
            sa_name: name.clone(),
            sa_uid: uid,
        }
    }
}

fn age(s: &Secret) -> Duration {
    s.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| jiff::Timestamp::now().duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::MAX)
}

async fn reconcile(s: Arc<Secret>, st: Arc<State>) -> Result<Action, Error> {
    let ns = s.namespace().unwrap_or_default();
    let sa_name = s
        .annotations()
        .get(NAME_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let sa = st
        .accounts
        .store()
        .get(&kube::runtime::reflector::ObjectRef::new(&sa_name).within(&ns));
    let api: Api<Secret> = Api::namespaced(st.ctx.client.clone(), &ns);
    match plan(&s, sa.as_deref(), st.ca.as_deref(), age(&s)) {
        Plan::Nothing => Ok(Action::await_change()),
        Plan::Wait => Ok(Action::requeue(SA_GRACE)),
        Plan::Delete => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: s.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&s.name_any(), &dp).await {
                Ok(_) => {
                    tracing::info!(secret = %s.name_any(), namespace = ns, "deleted the token of a missing service account")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
        Plan::Fill { sa_name, sa_uid } => {
            let token = st
                .signer
                .sign_legacy(&ns, &s.name_any(), &sa_name, &sa_uid)
                .map_err(Error::Config)?;
            let mut next = (*s).clone();
            next.annotations_mut()
                .insert(UID_ANNOTATION.into(), sa_uid.clone());
            let data = next.data.get_or_insert_with(BTreeMap::new);
            data.insert("token".into(), ByteString(token.into_bytes()));
            data.insert("namespace".into(), ByteString(ns.clone().into_bytes()));
            if let Some(ca) = &st.ca {
                data.insert("ca.crt".into(), ByteString(ca.clone().into_bytes()));
            }
            match api
                .replace(&s.name_any(), &PostParams::default(), &next)
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %s.name_any(), namespace = ns, "filled in a service account token")
                }
                // A newer version is on its way through the informer.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn secret(ann: &[(&str, &str)], data: &[&str]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("robot-token".into()),
                namespace: Some("ns".into()),
                annotations: Some(
                    ann.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(
                data.iter()
                    .map(|k| (k.to_string(), ByteString(b"x".to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn sa(uid: &str) -> ServiceAccount {
        ServiceAccount {
            metadata: ObjectMeta {
                name: Some("robot".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        }
    }

    const OLD: Duration = Duration::from_secs(60);

    #[test]
    fn new_secrets_are_filled_for_their_account() {
        let s = secret(&[(NAME_ANNOTATION, "robot")], &[]);
        assert_eq!(
            plan(&s, Some(&sa("u1")), Some("CA"), OLD),
            Plan::Fill {
                sa_name: "robot".into(),
                sa_uid: "u1".into()
            }
        );
        let done = secret(
            &[(NAME_ANNOTATION, "robot"), (UID_ANNOTATION, "u1")],
            &["token", "namespace", "ca.crt"],
        );
        assert_eq!(plan(&done, Some(&sa("u1")), Some("CA"), OLD), Plan::Nothing);
        // A CA that appeared later is filled in.
        let no_ca = secret(
            &[(NAME_ANNOTATION, "robot"), (UID_ANNOTATION, "u1")],
            &["token", "namespace"],
        );
        assert!(matches!(
            plan(&no_ca, Some(&sa("u1")), Some("CA"), OLD),
            Plan::Fill { .. }
        ));
    }

    #[test]
    fn missing_or_replaced_accounts_lose_their_secrets() {
        let s = secret(
            &[(NAME_ANNOTATION, "robot"), (UID_ANNOTATION, "u1")],
            &["token"],
        );
        assert_eq!(plan(&s, None, None, Duration::ZERO), Plan::Wait);
        assert_eq!(plan(&s, None, None, OLD), Plan::Delete);
        assert_eq!(plan(&s, Some(&sa("u2")), None, OLD), Plan::Delete);
    }

    #[test]
    fn other_secrets_are_left_alone() {
        let mut s = secret(&[(NAME_ANNOTATION, "robot")], &[]);
        s.type_ = Some("Opaque".into());
        assert_eq!(plan(&s, None, None, OLD), Plan::Nothing);
        let unnamed = secret(&[], &[]);
        assert_eq!(plan(&unnamed, None, None, OLD), Plan::Nothing);
    }
}
