//! How many requests the server answers at once, and for how long one may
//! run: kube-apiserver's `--max-requests-inflight`,
//! `--max-mutating-requests-inflight` (API Priority and Fairness's simple
//! predecessor) and `--request-timeout`.
//!
//! Long-running requests (watches, exec, attach, port-forward, proxy,
//! followed logs) are neither counted nor timed, as upstream; nor are
//! requests of `system:masters`, which upstream exempts so that an
//! administrator can still reach an overloaded server.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::request::{Query, ResourcePath};
use super::status::ApiError;
use crate::auth::Identity;

/// The group upstream never throttles.
const PRIVILEGED_GROUP: &str = "system:masters";

/// The limits, shared by every connection (clones share the slots).
#[derive(Debug, Clone)]
pub struct Inflight {
    readonly: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
    timeout: Option<Duration>,
}

/// What a request may use, decided before it is served: a slot held until
/// this is dropped, and a deadline. Long-running and exempt requests get
/// neither.
#[derive(Debug, Default)]
pub struct Admit {
    _permit: Option<OwnedSemaphorePermit>,
    pub timeout: Option<Duration>,
}

impl Inflight {
    /// 0 turns a limit off, as upstream.
    pub fn new(readonly: usize, mutating: usize, timeout: Duration) -> Self {
        let sem = |n: usize| (n > 0).then(|| Arc::new(Semaphore::new(n)));
        Inflight {
            readonly: sem(readonly),
            mutating: sem(mutating),
            timeout: (!timeout.is_zero()).then_some(timeout),
        }
    }

    /// No limits (tests and tools that build an `ApiServer` directly).
    pub fn unlimited() -> Self {
        Inflight::new(0, 0, Duration::ZERO)
    }

    /// A slot for this request, or 429 with upstream's message when every
    /// slot of its kind is taken.
    ///
    /// # Errors
    /// 429 Too Many Requests.
    pub fn admit(
        &self,
        identity: &Identity,
        method: &Method,
        path: Option<&ResourcePath>,
        query: &Query,
    ) -> Result<Admit, ApiError> {
        if long_running(method, path, query)
            || identity.groups.iter().any(|g| g == PRIVILEGED_GROUP)
        {
            return Ok(Admit::default());
        }
        let mutating = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let sem = if mutating {
            &self.mutating
        } else {
            &self.readonly
        };
        let permit = match sem {
            None => None,
            Some(s) => Some(s.clone().try_acquire_owned().map_err(|_| too_many())?),
        };
        Ok(Admit {
            _permit: permit,
            timeout: self.timeout,
        })
    }
}

/// kube-apiserver's `TooManyRequests` answer; the `Retry-After` header is
/// added from `details.retryAfterSeconds` where responses are written.
pub fn too_many() -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
    );
    e.details = Some(serde_json::json!({ "retryAfterSeconds": 1 }));
    e
}

/// The 504 a request gets when it runs past `--request-timeout`.
pub fn timed_out() -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        "request did not complete within requested timeout - context deadline exceeded",
    )
}

/// Upstream's long-running request check: watches, and the streaming
/// subresources (a log only when followed). The audit log writes these
/// requests' ResponseStarted stage.
pub(crate) fn long_running(method: &Method, path: Option<&ResourcePath>, query: &Query) -> bool {
    let Some(p) = path else {
        return false;
    };
    if super::request::verb(method, p, query) == "watch" {
        return true;
    }
    match p.subresource.as_deref() {
        Some("exec" | "attach" | "portforward" | "proxy") => true,
        Some("log") => query.flag("follow"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(groups: &[&str]) -> Identity {
        Identity::new("u", groups.iter().map(|g| g.to_string()).collect())
    }

    fn pods(sub: Option<&str>) -> ResourcePath {
        ResourcePath {
            version: "v1".into(),
            resource: "pods".into(),
            namespace: Some("default".into()),
            name: sub.map(|_| "p".into()),
            subresource: sub.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn slots_run_out_per_kind_and_come_back() {
        let f = Inflight::new(1, 1, Duration::from_secs(60));
        let q = Query::parse(None);
        let u = user(&["system:authenticated"]);
        let get = f.admit(&u, &Method::GET, Some(&pods(None)), &q).unwrap();
        let e = f
            .admit(&u, &Method::GET, Some(&pods(None)), &q)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        // Writes have their own slots.
        let post = f.admit(&u, &Method::POST, Some(&pods(None)), &q).unwrap();
        assert!(f.admit(&u, &Method::DELETE, Some(&pods(None)), &q).is_err());
        drop((get, post));
        assert!(f.admit(&u, &Method::GET, Some(&pods(None)), &q).is_ok());
    }

    #[test]
    fn watches_streams_and_masters_are_not_counted() {
        let f = Inflight::new(1, 1, Duration::from_secs(60));
        let u = user(&[]);
        let _held = f
            .admit(&u, &Method::GET, Some(&pods(None)), &Query::parse(None))
            .unwrap();
        let watch = Query::parse(Some("watch=true"));
        for (method, sub, q) in [
            (&Method::GET, None, &watch),
            (&Method::POST, Some("exec"), &Query::parse(None)),
            (
                &Method::GET,
                Some("log"),
                &Query::parse(Some("follow=true")),
            ),
        ] {
            let a = f.admit(&u, method, Some(&pods(sub)), q).unwrap();
            assert!(
                a._permit.is_none() && a.timeout.is_none(),
                "{method} {sub:?}"
            );
        }
        assert!(f
            .admit(
                &u,
                &Method::GET,
                Some(&pods(Some("log"))),
                &Query::parse(None)
            )
            .is_err());
        let admin = user(&["system:masters"]);
        assert!(f
            .admit(&admin, &Method::GET, Some(&pods(None)), &Query::parse(None))
            .is_ok());
    }
}
