//! Expectations (upstream `ControllerExpectations`): the pod creations and
//! deletions a controller made that its pod cache has not shown yet. While
//! any is outstanding the controller does not create or delete again, so a
//! cache that lags behind its own writes cannot make it double up.
//!
//! Unlike upstream's counters these remember names (creations) and uids
//! (deletions), so they can also be settled by looking at the cache, and
//! they expire after five minutes as upstream's do, in case an event was
//! lost for good.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// How long unobserved expectations hold a controller back (upstream
/// `ExpectationsTimeout`).
pub const TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Default)]
struct Pending {
    /// Creations whose API call has not returned yet.
    in_flight: usize,
    /// Pod names seen by the cache while creations were in flight: a
    /// watch event can beat the create response.
    seen_in_flight: HashSet<String>,
    /// Created pod names not yet seen by the cache.
    creates: HashSet<String>,
    /// Deleted pods (name -> uid) the cache still shows alive.
    deletes: HashMap<String, String>,
    since: Option<Instant>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.in_flight == 0 && self.creates.is_empty() && self.deletes.is_empty()
    }
}

/// Expectations of one controller, keyed by its objects' `namespace/name`.
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        // A panic elsewhere must not wedge every controller loop.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `n` creations are about to be sent for `key`.
    pub fn creating(&self, key: &str, n: usize) {
        let mut m = self.lock();
        let p = m.entry(key.to_string()).or_default();
        p.in_flight += n;
        p.since = Some(Instant::now());
    }

    /// One creation for `key` returned: the pod is `name`, or `None` when
    /// the call failed (or was never made).
    pub fn created(&self, key: &str, name: Option<&str>) {
        let mut m = self.lock();
        let Some(p) = m.get_mut(key) else { return };
        p.in_flight = p.in_flight.saturating_sub(1);
        if let Some(name) = name {
            if !p.seen_in_flight.contains(name) {
                p.creates.insert(name.to_string());
            }
        }
        if p.in_flight == 0 {
            p.seen_in_flight.clear();
        }
    }

    /// Pod `name` (`uid`) of `key` is about to be deleted.
    pub fn deleting(&self, key: &str, name: &str, uid: &str) {
        let mut m = self.lock();
        let p = m.entry(key.to_string()).or_default();
        p.deletes.insert(name.to_string(), uid.to_string());
        p.since = Some(Instant::now());
    }

    /// A deletion did not happen: the cache will not show it.
    pub fn delete_failed(&self, key: &str, name: &str) {
        if let Some(p) = self.lock().get_mut(key) {
            p.deletes.remove(name);
        }
    }

    /// The pod cache shows `pod` of `key` (`exists` false: its deletion).
    pub fn observe(&self, key: &str, pod: &Pod, exists: bool) {
        let mut m = self.lock();
        let Some(p) = m.get_mut(key) else { return };
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if p.in_flight > 0 {
            p.seen_in_flight.insert(name.to_string());
        }
        p.creates.remove(name);
        let gone = !exists || pod.metadata.deletion_timestamp.is_some();
        if gone && p.deletes.get(name) == pod.metadata.uid.as_ref() {
            p.deletes.remove(name);
        }
    }

    /// Whether `key` may create or delete again. `cached(name)` looks a pod
    /// up in the cache; what it already shows settles its expectation.
    pub fn satisfied(&self, key: &str, cached: impl Fn(&str) -> Option<Arc<Pod>>) -> bool {
        let mut m = self.lock();
        let Some(p) = m.get_mut(key) else {
            return true;
        };
        p.creates.retain(|name| cached(name).is_none());
        p.deletes.retain(|name, uid| {
            cached(name).is_some_and(|pod| {
                pod.metadata.uid.as_deref() == Some(uid.as_str())
                    && pod.metadata.deletion_timestamp.is_none()
            })
        });
        let expired = p.since.is_some_and(|s| s.elapsed() > TIMEOUT);
        if p.is_empty() || expired {
            if expired {
                tracing::warn!(controller = key, "expected pod creations or deletions never showed up in the cache; acting again");
            }
            m.remove(key);
            return true;
        }
        false
    }

    /// When outstanding expectations of `key` expire.
    pub fn expires_in(&self, key: &str) -> Option<Duration> {
        let m = self.lock();
        let since = m.get(key)?.since?;
        Some(TIMEOUT.saturating_sub(since.elapsed()))
    }

    /// The controller object is gone.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn creations_wait_for_the_cache() {
        let e = Expectations::default();
        e.creating("ns/rs", 2);
        e.created("ns/rs", Some("a"));
        assert!(!e.satisfied("ns/rs", |_| None), "one still in flight");
        e.created("ns/rs", None);
        assert!(!e.satisfied("ns/rs", |_| None), "a not seen yet");
        e.observe("ns/rs", &pod("a", "1"), true);
        assert!(e.satisfied("ns/rs", |_| None));
    }

    #[test]
    fn an_event_faster_than_the_create_response_counts() {
        let e = Expectations::default();
        e.creating("ns/rs", 1);
        // Created and deleted again before the response arrived.
        e.observe("ns/rs", &pod("a", "1"), true);
        e.observe("ns/rs", &pod("a", "1"), false);
        e.created("ns/rs", Some("a"));
        assert!(e.satisfied("ns/rs", |_| None));
    }

    #[test]
    fn deletions_settle_by_event_or_by_cache() {
        let e = Expectations::default();
        let a = Arc::new(pod("a", "1"));
        e.deleting("ns/rs", "a", "1");
        assert!(!e.satisfied("ns/rs", |_| Some(a.clone())));
        assert!(e.satisfied("ns/rs", |_| None));
        e.deleting("ns/rs", "a", "1");
        e.observe("ns/rs", &a, false);
        assert!(e.satisfied("ns/rs", |_| Some(a.clone())));
        // A namesake with another uid does not stand in for the deleted pod.
        e.deleting("ns/rs", "a", "1");
        assert!(e.satisfied("ns/rs", |_| Some(Arc::new(pod("a", "2")))));
    }
}
