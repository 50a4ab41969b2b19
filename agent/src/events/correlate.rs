//! The event correlator of client-go's recorder, which the kubelet uses:
//! a repeat of an event (same source, object, type, reason and message)
//! bumps the existing Event's `count` and `lastTimestamp` instead of
//! creating a new object, and a per-object token bucket (burst 25, one
//! more every 5 minutes) keeps a flapping pod from flooding the API.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// client-go's `maxLruCacheEntries`.
pub const CACHE_SIZE: usize = 4096;
/// client-go's `defaultSpamBurst`.
pub const SPAM_BURST: f64 = 25.0;
/// client-go's `defaultSpamQPS`: one event per object per 5 minutes once
/// the burst is spent.
pub const SPAM_QPS: f64 = 1.0 / 300.0;

/// What to send to the API for one recorded event.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A first occurrence: create this Event.
    Create(Event),
    /// A repeat: patch `count`, `lastTimestamp` and `message` of the Event
    /// already written; `event` (same name, full content) is created
    /// instead when that one has expired.
    Repeat {
        event: Event,
        patch: serde_json::Value,
    },
}

impl Write {
    pub fn event(&self) -> &Event {
        match self {
            Write::Create(e) | Write::Repeat { event: e, .. } => e,
        }
    }
}

/// What the API holds for an event key.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    first: Option<Time>,
}

/// A small least-recently-used map: eviction scans for the oldest entry,
/// which is cheap at a few thousand entries and happens once per insert
/// beyond capacity.
#[derive(Debug)]
struct Lru<K, V> {
    cap: usize,
    tick: u64,
    map: HashMap<K, (u64, V)>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru {
            cap: cap.max(1),
            tick: 0,
            map: HashMap::new(),
        }
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(k).map(|(used, v)| {
            *used = t;
            v
        })
    }

    fn insert(&mut self, k: K, v: V) {
        self.tick += 1;
        if !self.map.contains_key(&k) && self.map.len() >= self.cap {
            if let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
            {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(k, (self.tick, v));
    }
}

/// A token bucket: `burst` tokens, refilled at `qps`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Correlates events before they are written. Not shared: the writer task
/// owns it.
#[derive(Debug)]
pub struct Correlator {
    seen: Lru<String, Seen>,
    spam: Lru<String, Bucket>,
    burst: f64,
    qps: f64,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator::new(CACHE_SIZE, SPAM_BURST, SPAM_QPS)
    }
}

impl Correlator {
    pub fn new(cache: usize, burst: f64, qps: f64) -> Correlator {
        Correlator {
            seen: Lru::new(cache),
            spam: Lru::new(cache),
            burst,
            qps,
        }
    }

    /// Decide how to write `event` (a fresh Event with count 1) recorded at
    /// `now`, or None when the object has used up its budget (the event is
    /// dropped, as upstream does).
    pub fn correlate(&mut self, mut event: Event, now: Instant) -> Option<Write> {
        if !self.allow(&spam_key(&event), now) {
            return None;
        }
        let Some(seen) = self.seen.get_mut(&event_key(&event)).cloned() else {
            return Some(Write::Create(event));
        };
        let count = seen.count.saturating_add(1);
        event.metadata.name = Some(seen.name);
        event.count = Some(count);
        event.first_timestamp = seen.first.or(event.first_timestamp);
        let patch = serde_json::json!({
            "count": count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        Some(Write::Repeat { event, patch })
    }

    /// Remember what the API now holds, after a successful write.
    pub fn written(&mut self, event: &Event) {
        let Some(name) = event.metadata.name.clone() else {
            return;
        };
        self.seen.insert(
            event_key(event),
            Seen {
                name,
                count: event.count.unwrap_or(1),
                first: event.first_timestamp.clone(),
            },
        );
    }

    fn allow(&mut self, key: &str, now: Instant) -> bool {
        let (burst, qps) = (self.burst, self.qps);
        let key = key.to_string();
        if self.spam.get_mut(&key).is_none() {
            let full = Bucket {
                tokens: burst,
                at: now,
            };
            self.spam.insert(key.clone(), full);
        }
        let Some(b) = self.spam.get_mut(&key) else {
            return true;
        };
        let elapsed = now.saturating_duration_since(b.at);
        b.tokens = (b.tokens + elapsed.as_secs_f64() * qps).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

fn object_fields(e: &Event) -> [&str; 7] {
    let o = &e.involved_object;
    let s = e.source.as_ref();
    fn f(v: &Option<String>) -> &str {
        v.as_deref().unwrap_or("")
    }
    [
        s.map(|s| f(&s.component)).unwrap_or(""),
        s.map(|s| f(&s.host)).unwrap_or(""),
        f(&o.kind),
        f(&o.namespace),
        f(&o.name),
        f(&o.uid),
        f(&o.api_version),
    ]
}

/// client-go's `getSpamKey`: source and involved object.
fn spam_key(e: &Event) -> String {
    object_fields(e).join("\u{0}")
}

/// client-go's `getEventKey`: source, object (with field path), type,
/// reason and message.
fn event_key(e: &Event) -> String {
    let f = |v: &Option<String>| v.clone().unwrap_or_default();
    let mut parts: Vec<String> = object_fields(e).iter().map(|s| s.to_string()).collect();
    parts.push(f(&e.involved_object.field_path));
    parts.push(f(&e.type_));
    parts.push(f(&e.reason));
    parts.push(f(&e.message));
    parts.join("\u{0}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;

    fn ev(obj: &str, reason: &str, message: &str, name: &str) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some(obj.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{obj}")),
                api_version: Some("v1".into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            count: Some(1),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some("n1".into()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn repeats_patch_the_first_event() {
        let mut c = Correlator::default();
        let now = Instant::now();
        let Some(Write::Create(first)) = c.correlate(ev("p", "BackOff", "m", "p.1"), now) else {
            panic!("first occurrence must create");
        };
        c.written(&first);
        let Some(Write::Repeat { event, patch }) = c.correlate(ev("p", "BackOff", "m", "p.2"), now)
        else {
            panic!("repeat must patch");
        };
        assert_eq!(event.metadata.name.as_deref(), Some("p.1"));
        assert_eq!(patch["count"], 2);
        c.written(&event);
        let Some(Write::Repeat { patch, .. }) = c.correlate(ev("p", "BackOff", "m", "p.3"), now)
        else {
            panic!("repeat must patch");
        };
        assert_eq!(patch["count"], 3);
        // Another message is another event.
        assert!(matches!(
            c.correlate(ev("p", "BackOff", "other", "p.4"), now),
            Some(Write::Create(_))
        ));
        // A repeat whose first write failed is still a first occurrence.
        assert!(matches!(
            c.correlate(ev("q", "Pulled", "m", "q.1"), now),
            Some(Write::Create(_))
        ));
        assert!(matches!(
            c.correlate(ev("q", "Pulled", "m", "q.2"), now),
            Some(Write::Create(_))
        ));
    }

    #[test]
    fn spam_filter_allows_a_burst_per_object_then_refills() {
        let mut c = Correlator::new(16, 3.0, 1.0 / 300.0);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(c.correlate(ev("p", "R", &i.to_string(), "x"), t0).is_some());
        }
        assert!(c.correlate(ev("p", "R", "4", "x"), t0).is_none());
        // Other objects have their own bucket.
        assert!(c.correlate(ev("q", "R", "1", "x"), t0).is_some());
        // One token back after 5 minutes, not two.
        let later = t0 + Duration::from_secs(300);
        assert!(c.correlate(ev("p", "R", "5", "x"), later).is_some());
        assert!(c.correlate(ev("p", "R", "6", "x"), later).is_none());
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert("a", 1);
        l.insert("b", 2);
        assert!(l.get_mut(&"a").is_some());
        l.insert("c", 3);
        assert!(l.get_mut(&"b").is_none());
        assert!(l.get_mut(&"a").is_some());
        assert!(l.get_mut(&"c").is_some());
    }
}
