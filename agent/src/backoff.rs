//! Keyed exponential back-off (the kubelet's `flowcontrol.Backoff`), for
//! CrashLoopBackOff and ImagePullBackOff: the delay starts at `initial`,
//! doubles on every failure up to `max`, and an entry left alone for twice
//! `max` is forgotten.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Sleeps `delay` after a failure and never completes otherwise: the
/// retry arm of a loop that also waits for its inputs to change.
pub async fn retry_after(failed: bool, delay: Duration) {
    if failed {
        tokio::time::sleep(delay).await
    } else {
        std::future::pending().await
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            entries: HashMap::new(),
        }
    }

    /// Record a failure at `now`: the next delay for `key`.
    pub fn next(&mut self, key: &str, now: Instant) -> Duration {
        let (initial, max) = (self.initial, self.max);
        let e = self.entries.entry(key.to_string()).or_insert(Entry {
            delay: Duration::ZERO,
            last_update: now,
        });
        e.delay = if e.delay.is_zero() || now.saturating_duration_since(e.last_update) > 2 * max {
            initial
        } else {
            (e.delay * 2).min(max)
        };
        e.last_update = now;
        e.delay
    }

    /// Whether `key` must still wait, counting from `since` (for a crashed
    /// container: when it finished); returns the time left.
    pub fn remaining(&self, key: &str, since: Instant, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        let until = since + e.delay;
        (now < until).then(|| until - now)
    }

    /// Whether `key` must still wait, counting from its last failure.
    pub fn remaining_since_update(&self, key: &str, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        self.remaining(key, e.last_update, now)
    }

    /// The current delay of `key`, if it has failed before.
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Forget every key with this prefix (a pod's keys when it goes away).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }

    /// Drop entries not touched for twice the maximum delay.
    pub fn gc(&mut self, now: Instant) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last_update) <= 2 * max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_max_and_resets_after_quiet() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        let delays: Vec<u64> = (0..7)
            .map(|i| b.next("k", t0 + Duration::from_secs(i)).as_secs())
            .collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.next("k", t0 + Duration::from_secs(1000)).as_secs(), 10);
    }

    #[test]
    fn remaining_counts_from_since() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        assert_eq!(b.remaining("k", t0, t0), None);
        b.next("k", t0);
        assert_eq!(
            b.remaining("k", t0, t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(b.remaining("k", t0, t0 + Duration::from_secs(10)), None);
        b.forget_prefix("k");
        assert_eq!(b.delay("k"), None);
    }
}
