//! The scheduling queue, after upstream's three queues: `active` pods are
//! tried next (higher priority first, then oldest first); pods that
//! failed wait in `backoff` (1 s doubling to 10 s per failed attempt, as
//! upstream's podInitialBackoff / podMaxBackoff) or, when no node fit,
//! as `unschedulable` until a cluster change could help them
//! ([`Queue::move_unschedulable`]) or until they have waited too long
//! ([`Queue::flush`]). Nothing here spins: a pod goes back to `active`
//! only through an event or a deadline.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::podinfo::PodInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Active,
    Backoff,
    Unschedulable,
    /// Popped and being decided on.
    InFlight,
}

#[derive(Debug)]
struct Entry {
    info: Arc<PodInfo>,
    state: State,
    /// Bumped on every state change; heap items with an older version
    /// are stale and skipped (lazy deletion).
    version: u64,
    /// Order of first arrival: FIFO among equal priorities.
    order: u64,
    attempts: u32,
    backoff_until: Instant,
    unschedulable_since: Instant,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveItem {
    priority: i32,
    order: u64,
    version: u64,
    uid: String,
}

impl Ord for ActiveItem {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher priority first, then lower (older) order.
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.order.cmp(&self.order))
    }
}

impl PartialOrd for ActiveItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Back-off settings.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// How long an unschedulable pod waits for a helpful event before it
    /// is retried anyway (upstream podMaxInUnschedulablePodsDuration).
    pub unschedulable_timeout: Duration,
}

impl Backoff {
    /// Back-off after `attempts` failed attempts: initial * 2^(attempts-1),
    /// capped at max.
    pub fn after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// Pending pods of this scheduler.
#[derive(Debug)]
pub struct Queue {
    backoff: Backoff,
    entries: HashMap<String, Entry>,
    active: BinaryHeap<ActiveItem>,
    /// (due, version, uid) of pods backing off, earliest first.
    waiting: BinaryHeap<Reverse<(Instant, u64, String)>>,
    counter: u64,
}

impl Queue {
    pub fn new(backoff: Backoff) -> Queue {
        Queue {
            backoff,
            entries: HashMap::new(),
            active: BinaryHeap::new(),
            waiting: BinaryHeap::new(),
            counter: 0,
        }
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Pods in the queue, in any state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// UIDs of every queued pod (for reconciling after a re-list).
    pub fn uids(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// True when a pod is ready to be tried.
    pub fn has_active(&self) -> bool {
        // Stale items may sit on top; pop() skips them. Close enough for
        // a readiness hint: at worst one empty pop.
        !self.active.is_empty()
    }

    fn set_state(&mut self, uid: &str, state: State, now: Instant) {
        let version = self.next();
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        e.state = state;
        e.version = version;
        match state {
            State::Active => self.active.push(ActiveItem {
                priority: e.info.priority,
                order: e.order,
                version,
                uid: uid.to_string(),
            }),
            State::Backoff => {
                self.waiting
                    .push(Reverse((e.backoff_until, version, uid.to_string())))
            }
            State::Unschedulable => e.unschedulable_since = now,
            State::InFlight => {}
        }
    }

    /// A pending pod was seen (new or updated). New pods become active;
    /// an unschedulable pod whose spec changed is moved as on a cluster
    /// event (the change may be what lets it fit).
    pub fn add_or_update(&mut self, info: Arc<PodInfo>, now: Instant) {
        let uid = info.uid.clone();
        match self.entries.get_mut(&uid) {
            Some(e) => {
                let changed = e.info.pod.spec != info.pod.spec
                    || e.info.pod.metadata.labels != info.pod.metadata.labels;
                e.info = info;
                if changed && e.state == State::Unschedulable {
                    self.move_one(&uid, now);
                }
            }
            None => {
                let order = self.next();
                self.entries.insert(
                    uid.clone(),
                    Entry {
                        info,
                        state: State::InFlight,
                        version: 0,
                        order,
                        attempts: 0,
                        backoff_until: now,
                        unschedulable_since: now,
                    },
                );
                self.set_state(&uid, State::Active, now);
            }
        }
    }

    /// Re-queue a pod whose binding failed (it had left the queue when it
    /// was assumed): it backs off for one more failed attempt.
    pub fn requeue_failed(&mut self, info: Arc<PodInfo>, attempts: u32, now: Instant) {
        let uid = info.uid.clone();
        if self.entries.contains_key(&uid) {
            return;
        }
        let attempts = attempts + 1;
        let order = self.next();
        self.entries.insert(
            uid.clone(),
            Entry {
                info,
                state: State::InFlight,
                version: 0,
                order,
                attempts,
                backoff_until: now + self.backoff.after(attempts),
                unschedulable_since: now,
            },
        );
        self.set_state(&uid, State::Backoff, now);
    }

    /// Drop a pod (deleted, bound by someone else, terminating).
    pub fn remove(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    /// The next pod to try, if any is active.
    pub fn pop(&mut self) -> Option<Arc<PodInfo>> {
        while let Some(item) = self.active.pop() {
            let Some(e) = self.entries.get_mut(&item.uid) else {
                continue;
            };
            if e.state != State::Active || e.version != item.version {
                continue;
            }
            e.state = State::InFlight;
            return Some(e.info.clone());
        }
        None
    }

    /// The popped pod was assumed on a node: it leaves the queue. Returns
    /// its failed attempts so far (kept with the assumed pod in case the
    /// binding fails).
    pub fn done(&mut self, uid: &str) -> u32 {
        self.entries.remove(uid).map_or(0, |e| e.attempts)
    }

    /// No node fit the popped pod: it waits for a helpful event, and
    /// backs off for one more failed attempt.
    pub fn unschedulable(&mut self, uid: &str, now: Instant) {
        let backoff = self.backoff;
        if let Some(e) = self.entries.get_mut(uid) {
            e.attempts += 1;
            e.backoff_until = now + backoff.after(e.attempts);
            self.set_state(uid, State::Unschedulable, now);
        }
    }

    fn move_one(&mut self, uid: &str, now: Instant) {
        let Some(e) = self.entries.get(uid) else {
            return;
        };
        let state = if e.backoff_until <= now {
            State::Active
        } else {
            State::Backoff
        };
        self.set_state(uid, state, now);
    }

    /// A cluster change (node added or changed, a pod gone) may let
    /// unschedulable pods fit: move them to active, or to back-off if
    /// their back-off has not run out. Returns how many moved.
    pub fn move_unschedulable(&mut self, now: Instant) -> usize {
        self.move_unschedulable_if(now, |_| true)
    }

    /// [`Queue::move_unschedulable`] for the pods `helps` picks: a
    /// change to a claim or volume helps only pods with claims.
    pub fn move_unschedulable_if(
        &mut self,
        now: Instant,
        helps: impl Fn(&PodInfo) -> bool,
    ) -> usize {
        let uids: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.state == State::Unschedulable && helps(&e.info))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &uids {
            self.move_one(uid, now);
        }
        uids.len()
    }

    /// Activate pods whose back-off ran out, and unschedulable pods that
    /// waited longer than the timeout.
    pub fn flush(&mut self, now: Instant) {
        while let Some(Reverse((due, version, _))) = self.waiting.peek() {
            if *due > now {
                break;
            }
            let version = *version;
            let Some(Reverse((_, _, uid))) = self.waiting.pop() else {
                break;
            };
            let current = self
                .entries
                .get(&uid)
                .is_some_and(|e| e.state == State::Backoff && e.version == version);
            if current {
                self.set_state(&uid, State::Active, now);
            }
        }
        let timeout = self.backoff.unschedulable_timeout;
        let stale: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.state == State::Unschedulable
                    && now.duration_since(e.unschedulable_since) >= timeout
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            self.move_one(&uid, now);
        }
    }

    /// When the earliest back-off runs out.
    pub fn next_backoff_due(&self) -> Option<Instant> {
        self.waiting.peek().map(|Reverse((due, _, _))| *due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            unschedulable_timeout: Duration::from_secs(300),
        }
    }

    fn pod(uid: &str, priority: i32) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(
            serde_json::from_value(json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {"priority": priority, "containers": [{"name": "c"}]}
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = backoff();
        let secs: Vec<u64> = (1..=6).map(|a| b.after(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.after(1000).as_secs(), 10);
    }

    #[test]
    fn priority_then_fifo() {
        let now = Instant::now();
        let mut q = Queue::new(backoff());
        q.add_or_update(pod("a", 0), now);
        q.add_or_update(pod("b", 10), now);
        q.add_or_update(pod("c", 0), now);
        let order: Vec<String> = std::iter::from_fn(|| q.pop())
            .map(|p| p.uid.clone())
            .collect();
        assert_eq!(order, ["b", "a", "c"]);
    }

    #[test]
    fn unschedulable_waits_for_an_event_then_backs_off() {
        let t0 = Instant::now();
        let mut q = Queue::new(backoff());
        q.add_or_update(pod("a", 0), t0);
        let p = q.pop().unwrap();
        q.unschedulable(&p.uid, t0);
        assert!(q.pop().is_none());
        // Deadlines alone do not retry it before the timeout.
        q.flush(t0 + Duration::from_secs(60));
        assert!(q.pop().is_none());
        // An event within its back-off parks it in back-off...
        assert_eq!(q.move_unschedulable(t0 + Duration::from_millis(500)), 1);
        assert!(q.pop().is_none());
        assert_eq!(q.next_backoff_due(), Some(t0 + Duration::from_secs(1)));
        // ...until the back-off runs out.
        q.flush(t0 + Duration::from_secs(1));
        assert_eq!(q.pop().unwrap().uid, "a");
        // Second failure: 2 s; an event after that activates at once.
        q.unschedulable("a", t0 + Duration::from_secs(1));
        q.move_unschedulable(t0 + Duration::from_secs(4));
        assert_eq!(q.pop().unwrap().uid, "a");
        // The timeout retries it without any event.
        q.unschedulable("a", t0);
        q.flush(t0 + Duration::from_secs(300));
        assert_eq!(q.pop().unwrap().uid, "a");
    }

    #[test]
    fn spec_change_retries_and_status_change_does_not() {
        let t0 = Instant::now();
        let mut q = Queue::new(backoff());
        q.add_or_update(pod("a", 0), t0);
        q.pop();
        q.unschedulable("a", t0);
        let later = t0 + Duration::from_secs(5);
        let mut same = (*pod("a", 0)).clone();
        same.pod.status = Some(Default::default());
        q.add_or_update(Arc::new(same), later);
        assert!(q.pop().is_none());
        q.add_or_update(pod("a", 5), later);
        assert_eq!(q.pop().unwrap().priority, 5);
    }

    #[test]
    fn failed_binds_back_off_and_removed_pods_vanish() {
        let t0 = Instant::now();
        let mut q = Queue::new(backoff());
        q.add_or_update(pod("a", 0), t0);
        q.pop();
        let attempts = q.done("a");
        assert!(q.is_empty());
        q.requeue_failed(pod("a", 0), attempts, t0);
        assert!(q.pop().is_none());
        q.flush(t0 + Duration::from_secs(1));
        assert!(q.pop().is_some());
        q.remove("a");
        assert!(q.is_empty() && q.pop().is_none());
    }
}
