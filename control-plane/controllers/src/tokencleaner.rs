//! The token cleaner (upstream's `tokencleaner`): bootstrap token Secrets
//! in `kube-system` are deleted once their `expiration` has passed, so
//! expired join tokens do not linger (the API server refuses them already:
//! deletion is housekeeping, not the security boundary).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use kube_util::informer::Scope;
use skiff_bootstrap::names;

use crate::{Ctx, Error};

const RETRY: Duration = Duration::from_secs(5);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    // Only bootstrap tokens: watching every Secret of the cluster for
    // them would cost far more than this scoped watch.
    let scope = Scope::default().with_fields(&format!("type={}", names::TOKEN_SECRET_TYPE));
    let tokens = ctx
        .informers
        .namespaced::<Secret>(names::TOKEN_NAMESPACE, scope);
    crate::reconciler::run(tokens, Arc::new(ctx), reconcile, error_policy).await;
    Ok(())
}

fn error_policy(s: Arc<Secret>, err: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(secret = %s.name_any(), "deleting the expired bootstrap token failed, retrying: {err}");
    Action::requeue(RETRY)
}

/// When the token expires: None for never, or for a Secret that is not a
/// bootstrap token. A malformed time counts as expired, as upstream.
pub fn expiration(s: &Secret) -> Option<jiff::Timestamp> {
    if s.type_.as_deref() != Some(names::TOKEN_SECRET_TYPE) {
        return None;
    }
    let raw = s.data.as_ref()?.get(names::KEY_EXPIRATION)?;
    let text = String::from_utf8_lossy(&raw.0);
    Some(
        text.trim()
            .parse::<jiff::Timestamp>()
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
    )
}

async fn reconcile(s: Arc<Secret>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let Some(at) = expiration(&s) else {
        return Ok(Action::await_change());
    };
    let now = jiff::Timestamp::now();
    if at > now {
        let left = at.duration_since(now).unsigned_abs();
        // A second late, so the token is surely expired when looked at.
        return Ok(Action::requeue(left + Duration::from_secs(1)));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), names::TOKEN_NAMESPACE);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: s.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&s.name_any(), &dp).await {
        Ok(_) => tracing::info!(secret = %s.name_any(), "deleted the expired bootstrap token"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn token(expiration: Option<&str>) -> Secret {
        let mut data = std::collections::BTreeMap::new();
        if let Some(e) = expiration {
            data.insert(
                names::KEY_EXPIRATION.to_string(),
                ByteString(e.as_bytes().to_vec()),
            );
        }
        Secret {
            type_: Some(names::TOKEN_SECRET_TYPE.into()),
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn expirations() {
        assert_eq!(expiration(&token(None)), None);
        assert_eq!(
            expiration(&token(Some("2030-01-02T03:04:05Z"))),
            Some("2030-01-02T03:04:05Z".parse().unwrap())
        );
        assert_eq!(
            expiration(&token(Some("soon"))),
            Some(jiff::Timestamp::UNIX_EPOCH)
        );
        let mut opaque = token(Some("2000-01-01T00:00:00Z"));
        opaque.type_ = Some("Opaque".into());
        assert_eq!(expiration(&opaque), None);
    }
}
