//! etcd leases for keys with a TTL, shared between keys granted around the
//! same time, as kube-apiserver's lease manager does
//! (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/lease_manager.go`).
//!
//! One lease per write would mean one grant (a raft round) per event and
//! thousands of leases for etcd to track. Instead a lease is granted a
//! little longer than asked (the reuse window: 5 % of the TTL, at most a
//! minute) and handed to every write within that window, up to 1,000 keys;
//! so a key lives between its TTL and its TTL plus the window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upstream's defaults.
const REUSE_FRACTION: f64 = 0.05;
const MAX_REUSE: Duration = Duration::from_secs(60);
const MAX_KEYS_PER_LEASE: u32 = 1000;

/// The lease handed out last.
#[derive(Debug, Clone, Copy)]
struct Granted {
    id: i64,
    /// When etcd will drop it.
    expires: Instant,
    keys: u32,
}

/// Leases to attach to writes with a TTL; the granting itself is the
/// caller's (an etcd round trip is not made under the lock).
#[derive(Debug, Default)]
pub(crate) struct Leases {
    last: Mutex<Option<Granted>>,
}

/// The TTL to grant for a key that must live `ttl`: whole seconds, at
/// least one (etcd's unit), plus the reuse window.
pub(crate) fn grant_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    (secs.max(1) + reuse(secs).as_secs()) as i64
}

fn reuse(ttl_secs: u64) -> Duration {
    Duration::from_secs((ttl_secs as f64 * REUSE_FRACTION) as u64).min(MAX_REUSE)
}

impl Leases {
    /// A lease that outlives `now + ttl` by at most the reuse window, if
    /// one was granted recently enough.
    pub(crate) fn reusable(&self, ttl: Duration, now: Instant) -> Option<i64> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let g = last.as_mut()?;
        let long_enough = now + Duration::from_secs(secs) < g.expires;
        let not_too_long = now + Duration::from_secs(secs) + reuse(secs) >= g.expires;
        if long_enough && not_too_long && g.keys < MAX_KEYS_PER_LEASE {
            g.keys += 1;
            return Some(g.id);
        }
        None
    }

    /// Remember a lease just granted at `granted_at` for `grant_secs`.
    pub(crate) fn granted(&self, id: i64, grant_secs: i64, granted_at: Instant) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some(Granted {
            id,
            expires: granted_at + Duration::from_secs(grant_secs.max(0) as u64),
            keys: 1,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_whole_seconds_plus_the_reuse_window() {
        assert_eq!(grant_seconds(Duration::from_secs(3600)), 3600 + 60);
        assert_eq!(grant_seconds(Duration::from_secs(600)), 600 + 30);
        assert_eq!(grant_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(grant_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn a_lease_is_reused_within_its_window_only() {
        let ttl = Duration::from_secs(3600);
        let leases = Leases::default();
        let t0 = Instant::now();
        assert_eq!(leases.reusable(ttl, t0), None, "nothing granted yet");
        leases.granted(7, grant_seconds(ttl), t0);
        assert_eq!(leases.reusable(ttl, t0 + Duration::from_secs(59)), Some(7));
        // past the window the lease would expire before the TTL is over
        assert_eq!(leases.reusable(ttl, t0 + Duration::from_secs(61)), None);
        // a much shorter TTL would live too long on it
        assert_eq!(leases.reusable(Duration::from_secs(60), t0), None);
    }

    #[test]
    fn a_lease_carries_at_most_a_thousand_keys() {
        let ttl = Duration::from_secs(3600);
        let leases = Leases::default();
        let t0 = Instant::now();
        leases.granted(1, grant_seconds(ttl), t0);
        let reused = (0..2000)
            .filter(|_| leases.reusable(ttl, t0).is_some())
            .count();
        assert_eq!(reused, MAX_KEYS_PER_LEASE as usize - 1);
    }
}
