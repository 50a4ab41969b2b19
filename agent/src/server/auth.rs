//! Who may use the node server: authentication by client certificate (the
//! TLS layer verified it against the client CA; CN is the user, O the
//! groups) and authorization as the kubelet's webhook mode does it —
//! `system:masters` always, anyone else by a SubjectAccessReview to the API
//! server on the `nodes` resource, with the subresource the kubelet derives
//! from the path, and the answer cached for a short while.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;

/// The group that is never asked about (upstream's superuser group).
pub const MASTERS: &str = "system:masters";
/// How long an allowed answer is reused (the kubelet's webhook default is
/// 5 minutes).
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denial is reused (the kubelet's default is 30 s): short, so
/// that a new RoleBinding takes effect quickly.
const DENIED_TTL: Duration = Duration::from_secs(30);
/// A SubjectAccessReview that takes longer counts as a denial.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on cached answers; past it the cache is cleared.
const CACHE_MAX: usize = 4096;

/// An authenticated caller of the node server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
}

/// The identity in a client certificate (DER) that TLS already verified.
pub fn identity_from_cert(der: &[u8]) -> Option<Identity> {
    let (user, mut groups) = skiff_bootstrap::identity::from_cert(der)?;
    groups.push("system:authenticated".into());
    Some(Identity { user, groups })
}

/// The authorization question of a request: the verb from the method and
/// the `nodes` subresource from the path, as the kubelet maps them
/// (`/stats` -> stats, `/metrics` -> metrics, `/logs` -> log, anything
/// else, `/containerLogs`, `/exec`, `/pods` included -> proxy).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    pub verb: &'static str,
    pub subresource: &'static str,
}

impl Request {
    pub fn of(method: &http::Method, path: &str) -> Request {
        let verb = match *method {
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "get",
        };
        let under = |prefix: &str| {
            path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let subresource = if under("/stats") {
            "stats"
        } else if under("/metrics") {
            "metrics"
        } else if under("/logs") {
            "log"
        } else {
            "proxy"
        };
        Request { verb, subresource }
    }
}

/// Decides whether an identity may make a request of this node.
pub struct Authorizer {
    /// The API client that asks SubjectAccessReviews; without one (a
    /// standalone agent) only `system:masters` is allowed.
    client: Option<kube::Client>,
    node_name: String,
    cache: Mutex<HashMap<(Identity, Request), (bool, Instant)>>,
}

impl Authorizer {
    pub fn new(client: Option<kube::Client>, node_name: &str) -> Authorizer {
        Authorizer {
            client,
            node_name: node_name.to_string(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// `Ok(())` when allowed; `Err(reason)` otherwise.
    pub async fn authorize(&self, id: &Identity, req: &Request) -> Result<(), String> {
        if id.in_group(MASTERS) {
            return Ok(());
        }
        let denied = || {
            format!(
                "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                id.user, req.verb, req.subresource
            )
        };
        let Some(client) = &self.client else {
            return Err(denied());
        };
        let key = (id.clone(), req.clone());
        let cached = self.lock().get(&key).copied();
        if let Some((allowed, at)) = cached {
            let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
            if at.elapsed() < ttl {
                return if allowed { Ok(()) } else { Err(denied()) };
            }
        }
        let allowed = match self.review(client, id, req).await {
            Ok(a) => a,
            Err(e) => {
                // Not cached: the next request asks again.
                tracing::warn!(user = %id.user, error = %e, "SubjectAccessReview failed; denying");
                return Err(denied());
            }
        };
        let mut cache = self.lock();
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, (allowed, Instant::now()));
        if allowed {
            Ok(())
        } else {
            Err(denied())
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Identity, Request), (bool, Instant)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn review(
        &self,
        client: &kube::Client,
        id: &Identity,
        req: &Request,
    ) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(id.user.clone()),
                groups: Some(id.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(req.verb.into()),
                    resource: Some("nodes".into()),
                    subresource: Some(req.subresource.into()),
                    name: Some(self.node_name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(client.clone());
        let params = PostParams::default();
        let call = api.create(&params, &review);
        match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
            Ok(Ok(r)) => Ok(r.status.is_some_and(|s| s.allowed)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {REVIEW_TIMEOUT:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_mapping_follows_the_kubelet() {
        let get = http::Method::GET;
        assert_eq!(Request::of(&get, "/stats/summary").subresource, "stats");
        assert_eq!(Request::of(&get, "/metrics").subresource, "metrics");
        assert_eq!(
            Request::of(&get, "/metrics/cadvisor").subresource,
            "metrics"
        );
        assert_eq!(Request::of(&get, "/logs/syslog").subresource, "log");
        assert_eq!(
            Request::of(&get, "/containerLogs/ns/p/c").subresource,
            "proxy"
        );
        assert_eq!(Request::of(&get, "/statsx").subresource, "proxy");
        let exec = Request::of(&http::Method::POST, "/exec/ns/p/c");
        assert_eq!((exec.verb, exec.subresource), ("create", "proxy"));
    }

    #[tokio::test]
    async fn masters_pass_and_others_need_an_api() {
        let a = Authorizer::new(None, "n1");
        let req = Request::of(&http::Method::GET, "/pods");
        let admin = Identity {
            user: "admin".into(),
            groups: vec![MASTERS.into()],
        };
        assert!(a.authorize(&admin, &req).await.is_ok());
        let bob = Identity {
            user: "bob".into(),
            groups: vec![],
        };
        assert!(a.authorize(&bob, &req).await.is_err());
    }
}
