//! ServiceAccount tokens for `serviceAccountToken` projections (the
//! kubelet's token manager, `pkg/kubelet/token/token_manager.go`): each
//! token is requested through the TokenRequest API bound to its pod, cached
//! per (ServiceAccount, audiences, expiration, pod), handed out again on
//! every pod sync until it is due for a refresh, and forgotten with its pod.
//!
//! No loop of its own: the pod worker re-runs the volume set-up every sync
//! period, the set-up asks here, and once a token is due a fresh one comes
//! back; the atomic writer then swaps the volume's files to it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount, ServiceAccountTokenProjection};

use crate::pod::PodExt;

/// A projection without `expirationSeconds` asks for an hour (upstream's
/// default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The API refuses shorter projections; so do we, rather than ask for a
/// token the server would refuse or lengthen.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// A token is refreshed at the latest this long after it was issued, even
/// when it lives longer (upstream's `maxTTL`).
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Refreshes are spread by up to this much, so that pods started together
/// do not all ask at once (upstream's `maxJitter`).
const MAX_JITTER_SECS: u64 = 10;

/// Why no token could be handed out. The texts end up in the pod's
/// `FailedMount` event, in upstream's words where it has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The first request for this token failed (the API's message).
    #[error("failed to fetch token: {0}")]
    Fetch(String),
    /// The cached token expired and the refresh failed.
    #[error("token for serviceaccount {namespace}/{name} expired and refresh failed: {message}")]
    Expired {
        namespace: String,
        name: String,
        message: String,
    },
    /// The projection asks for less than the API allows.
    #[error("serviceAccountToken expirationSeconds {0}: may not specify a duration less than 10 minutes")]
    TooShort(i64),
    /// The alpha per-file owner is not implemented: refused, not ignored.
    #[error("serviceAccountToken user is not supported by skiff-agent (the file's owner follows the pod's fsGroup)")]
    User,
    /// The pod runs as no ServiceAccount (admission normally sets one).
    #[error("pod has no serviceAccountName: cannot request a serviceAccountToken")]
    NoServiceAccount,
    /// The agent runs without an API connection.
    #[error("serviceAccountToken cannot be requested: this node has no API server connection")]
    NoApi,
}

/// The TokenRequest call: the real one goes to the API server, tests use a
/// recording fake.
pub trait Requester: Send + Sync {
    /// `POST .../serviceaccounts/{name}/token`; the error is the API's
    /// message.
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        request: TokenRequest,
    ) -> BoxFuture<'a, Result<TokenRequest, String>>;
}

/// The API server, with the node's own identity (the Node authorizer and
/// NodeRestriction let it ask only for tokens bound to its own pods).
struct ApiRequester(kube::Client);

impl Requester for ApiRequester {
    fn request<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        request: TokenRequest,
    ) -> BoxFuture<'a, Result<TokenRequest, String>> {
        Box::pin(async move {
            kube::Api::<ServiceAccount>::namespaced(self.0.clone(), namespace)
                .create_token_request(name, &Default::default(), &request)
                .await
                .map_err(|e| match e {
                    kube::Error::Api(s) => s.message,
                    other => other.to_string(),
                })
        })
    }
}

/// What one cached token is for (upstream's `keyFunc`: name, namespace,
/// audiences, expiration and the bound object).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    name: String,
    audiences: Vec<String>,
    expiration_seconds: i64,
    pod_name: String,
    pod_uid: String,
}

#[derive(Debug, Clone)]
struct Cached {
    token: String,
    expires: SystemTime,
    refresh_at: SystemTime,
}

/// Requests and caches tokens; shared by every pod worker.
pub struct TokenManager {
    requester: Arc<dyn Requester>,
    cache: Mutex<HashMap<Key, Cached>>,
}

impl TokenManager {
    /// Tokens from the API server behind `client`.
    pub fn new(client: kube::Client) -> TokenManager {
        TokenManager::with_requester(Arc::new(ApiRequester(client)))
    }

    pub fn with_requester(requester: Arc<dyn Requester>) -> TokenManager {
        TokenManager {
            requester,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The token the projection should hold now: the cached one until it
    /// is due for a refresh, then a fresh one.
    ///
    /// # Errors
    /// The first request failed, or the token expired and its refresh
    /// failed. A failed refresh of a still valid token keeps the old token
    /// (logged), as upstream.
    pub async fn token(
        &self,
        pod: &Pod,
        source: &ServiceAccountTokenProjection,
    ) -> Result<String, Error> {
        let expiration_seconds = source
            .expiration_seconds
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
        if source.user.is_some() {
            return Err(Error::User);
        }
        if expiration_seconds < MIN_EXPIRATION_SECONDS {
            return Err(Error::TooShort(expiration_seconds));
        }
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .ok_or(Error::NoServiceAccount)?;
        // An empty audience means the API server's own audiences.
        let audiences: Vec<String> = source
            .audience
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect();
        let key = Key {
            namespace: pod.namespace().to_string(),
            name,
            audiences,
            expiration_seconds,
            pod_name: pod.name().to_string(),
            pod_uid: pod.uid().to_string(),
        };
        let now = SystemTime::now();
        let cached = self.lock().get(&key).cloned();
        if let Some(c) = cached.as_ref().filter(|c| now < c.refresh_at) {
            return Ok(c.token.clone());
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(key.audiences.clone()),
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(key.pod_name.clone()),
                    uid: Some(key.pod_uid.clone()),
                }),
                attestations: None,
            }),
            ..Default::default()
        };
        let answer = self
            .requester
            .request(&key.namespace, &key.name, request)
            .await
            .and_then(|tr| fresh(&key, tr));
        let mut cache = self.lock();
        // Tokens past their expiry are of no use to anyone (upstream's
        // periodic cleanup).
        cache.retain(|_, c| c.expires > now);
        match (answer, cached) {
            (Ok(c), _) => {
                let token = c.token.clone();
                cache.insert(key, c);
                Ok(token)
            }
            (Err(m), None) => Err(Error::Fetch(m)),
            (Err(message), Some(c)) if c.expires <= now => Err(Error::Expired {
                namespace: key.namespace,
                name: key.name,
                message,
            }),
            (Err(m), Some(c)) => {
                tracing::warn!(
                    serviceaccount = %format!("{}/{}", key.namespace, key.name),
                    pod = %key.pod_name,
                    "couldn't refresh token, keeping the current one: {m}"
                );
                let token = c.token.clone();
                cache.insert(key, c);
                Ok(token)
            }
        }
    }

    /// Forget the tokens bound to a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.lock().retain(|k, _| k.pod_uid != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A token from the API's answer, with when to refresh it.
fn fresh(key: &Key, tr: TokenRequest) -> Result<Cached, String> {
    let status = tr.status.unwrap_or_default();
    let token = status.token.filter(|t| !t.is_empty());
    let (Some(token), Some(expires)) = (token, status.expiration_timestamp) else {
        return Err("the TokenRequest answer holds no token or no expirationTimestamp".into());
    };
    let expires = SystemTime::from(expires.0);
    // The server may grant another lifetime than asked; its spec says which.
    let ttl = tr
        .spec
        .and_then(|s| s.expiration_seconds)
        .unwrap_or(key.expiration_seconds);
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
    Ok(Cached {
        token,
        expires,
        refresh_at: refresh_at(expires, ttl, jitter(key)),
    })
}

/// When a token expiring at `expires` after living `ttl` is due for a
/// refresh (upstream's `requiresRefresh`): once 80% of its lifetime has
/// passed, or 24 h after it was issued, whichever is first, minus `jitter`.
pub fn refresh_at(expires: SystemTime, ttl: Duration, jitter: Duration) -> SystemTime {
    let issued = expires.checked_sub(ttl).unwrap_or(expires);
    let by_age = issued + MAX_TTL;
    let by_lifetime = expires.checked_sub(ttl / 5).unwrap_or(expires);
    let due = by_age.min(by_lifetime);
    due.checked_sub(jitter).unwrap_or(due)
}

/// A per-token spread in [0, MAX_JITTER_SECS): stable for a key, so a
/// token's due time does not move between syncs.
fn jitter(key: &Key) -> Duration {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    Duration::from_secs(h.finish() % MAX_JITTER_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// Answers each request with token `t<n>` expiring `lifetime` from
    /// now, or with `fail` once set; records every request.
    #[derive(Default)]
    struct Fake {
        lifetime: Mutex<Duration>,
        fail: Mutex<Option<String>>,
        asked: Mutex<Vec<(String, String, TokenRequest)>>,
    }

    impl Requester for Fake {
        fn request<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
            request: TokenRequest,
        ) -> BoxFuture<'a, Result<TokenRequest, String>> {
            Box::pin(async move {
                let mut asked = self.asked.lock().unwrap();
                asked.push((namespace.into(), name.into(), request.clone()));
                if let Some(m) = self.fail.lock().unwrap().clone() {
                    return Err(m);
                }
                let lifetime = *self.lifetime.lock().unwrap();
                let expires = jiff::Timestamp::try_from(SystemTime::now() + lifetime).unwrap();
                Ok(TokenRequest {
                    status: Some(TokenRequestStatus {
                        token: Some(format!("t{}", asked.len())),
                        expiration_timestamp: Some(Time(expires)),
                    }),
                    ..request
                })
            })
        }
    }

    fn pod(uid: &str) -> Pod {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: p, namespace: ns, uid: {uid}}}\nspec:\n  serviceAccountName: robot\n  containers: [{{name: c, image: i}}]\n"
        ))
        .unwrap()
    }

    fn source(audience: &str, exp: Option<i64>) -> ServiceAccountTokenProjection {
        ServiceAccountTokenProjection {
            audience: Some(audience.into()),
            expiration_seconds: exp,
            path: "token".into(),
            user: None,
        }
    }

    fn fake(lifetime: Duration) -> (Arc<Fake>, TokenManager) {
        let f = Arc::new(Fake::default());
        *f.lifetime.lock().unwrap() = lifetime;
        (f.clone(), TokenManager::with_requester(f))
    }

    #[test]
    fn refresh_is_due_at_80_percent_or_24_hours() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let h = |n: u64| Duration::from_secs(n * 3600);
        // One hour: due 48 minutes after issue.
        assert_eq!(
            refresh_at(t0 + h(1), h(1), Duration::ZERO),
            t0 + Duration::from_secs(48 * 60)
        );
        // 600 s: due at 480 s; the jitter brings it forward.
        assert_eq!(
            refresh_at(
                t0 + Duration::from_secs(600),
                Duration::from_secs(600),
                Duration::from_secs(5)
            ),
            t0 + Duration::from_secs(475)
        );
        // A year-long token is still renewed daily.
        assert_eq!(
            refresh_at(t0 + h(24 * 365), h(24 * 365), Duration::ZERO),
            t0 + h(24)
        );
        assert!(
            jitter(&Key {
                namespace: "ns".into(),
                name: "n".into(),
                audiences: vec![],
                expiration_seconds: 600,
                pod_name: "p".into(),
                pod_uid: "u".into(),
            }) < Duration::from_secs(MAX_JITTER_SECS)
        );
    }

    #[tokio::test]
    async fn requests_bound_tokens_and_caches_them() {
        let (f, tm) = fake(Duration::from_secs(3600));
        assert_eq!(tm.token(&pod("u1"), &source("", None)).await.unwrap(), "t1");
        assert_eq!(tm.token(&pod("u1"), &source("", None)).await.unwrap(), "t1");
        // Another audience or another pod is another token.
        assert_eq!(
            tm.token(&pod("u1"), &source("vault", None)).await.unwrap(),
            "t2"
        );
        assert_eq!(tm.token(&pod("u2"), &source("", None)).await.unwrap(), "t3");
        let asked = f.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 3);
        let (ns, name, tr) = &asked[0];
        assert_eq!((ns.as_str(), name.as_str()), ("ns", "robot"));
        let spec = tr.spec.clone().unwrap();
        assert_eq!(
            spec.audiences,
            Some(vec![]),
            "empty audience: the server's default"
        );
        assert_eq!(spec.expiration_seconds, Some(DEFAULT_EXPIRATION_SECONDS));
        let r = spec.bound_object_ref.unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.api_version.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("Pod"), Some("v1"), Some("p"), Some("u1"))
        );
        assert_eq!(
            asked[1].2.spec.as_ref().unwrap().audiences,
            Some(vec!["vault".to_string()])
        );
        // The pod goes: its tokens go with it.
        tm.forget_pod("u1");
        assert_eq!(tm.token(&pod("u1"), &source("", None)).await.unwrap(), "t4");
        assert_eq!(tm.token(&pod("u2"), &source("", None)).await.unwrap(), "t3");
    }

    #[tokio::test]
    async fn due_tokens_are_refreshed_and_failures_reported() {
        // Granted for 60 s of an asked 600: 90% of its life is gone, so
        // every use is a refresh.
        let (f, tm) = fake(Duration::from_secs(60));
        let s = source("", Some(600));
        assert_eq!(tm.token(&pod("u1"), &s).await.unwrap(), "t1");
        assert_eq!(tm.token(&pod("u1"), &s).await.unwrap(), "t2");
        // A failed refresh keeps the still valid token.
        *f.fail.lock().unwrap() = Some("etcd is down".into());
        assert_eq!(tm.token(&pod("u1"), &s).await.unwrap(), "t2");
        // With nothing cached the failure is the volume's.
        let e = tm.token(&pod("u9"), &s).await.unwrap_err();
        assert_eq!(e.to_string(), "failed to fetch token: etcd is down");
        assert_eq!(
            tm.token(&pod("u1"), &source("", Some(599)))
                .await
                .unwrap_err(),
            Error::TooShort(599)
        );
        let mut nosa = pod("u1");
        nosa.spec.as_mut().unwrap().service_account_name = None;
        assert_eq!(
            tm.token(&nosa, &s).await.unwrap_err(),
            Error::NoServiceAccount
        );
    }

    #[tokio::test]
    async fn projected_volume_is_rewritten_with_the_fresh_token() {
        let t = tempfile::tempdir().unwrap();
        let (_f, tm) = fake(Duration::from_secs(60));
        let vm = super::super::VolumeManager::new(t.path(), None).with_tokens(Some(tm));
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  serviceAccountName: robot\n  securityContext: {fsGroup: 2000}\n  containers: [{name: c, image: i}]\n  volumes:\n  - name: api\n    projected:\n      defaultMode: 420\n      sources:\n      - serviceAccountToken: {path: token, expirationSeconds: 600}\n      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}\n",
        )
        .unwrap();
        let s = vm.setup(&pod).await;
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let dir = s.volumes["api"].path.clone();
        let file = dir.join("token");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "t1");
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&file).unwrap();
        // With an fsGroup: 0600 whatever the defaultMode, plus group read.
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        let first = std::fs::read_link(dir.join(super::super::atomic::DATA_DIR)).unwrap();
        // The next sync finds the token due: a new version is swapped in
        // whole, the user-visible name unchanged.
        let s = vm.setup(&pod).await;
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "t2");
        assert_eq!(
            std::fs::read_to_string(dir.join("namespace")).unwrap(),
            "ns"
        );
        let second = std::fs::read_link(dir.join(super::super::atomic::DATA_DIR)).unwrap();
        assert_ne!(first, second);
        assert!(!dir.join(&first).exists(), "the old version is removed");
        vm.teardown("u1").await;
    }

    #[tokio::test]
    async fn a_failed_token_request_fails_the_volume() {
        let t = tempfile::tempdir().unwrap();
        let (f, tm) = fake(Duration::from_secs(3600));
        *f.fail.lock().unwrap() = Some("serviceaccounts \"robot\" not found".into());
        let vm = super::super::VolumeManager::new(t.path(), None).with_tokens(Some(tm));
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  serviceAccountName: robot\n  containers: [{name: c, image: i}]\n  volumes:\n  - name: api\n    projected: {sources: [{serviceAccountToken: {path: token}}]}\n",
        )
        .unwrap();
        let s = vm.setup(&pod).await;
        assert!(s.blocked());
        assert_eq!(
            s.errors[0].to_string(),
            "MountVolume.SetUp failed for volume \"api\" : failed to fetch token: serviceaccounts \"robot\" not found"
        );
        vm.teardown("u1").await;
    }
}
