//! The event recorder of the scheduler and the controllers
//! (events.k8s.io/v1; the server also lists them as core/v1 events, so
//! `kubectl get events` shows them).
//!
//! Grouping is upstream's: one event per distinct (object, type, reason,
//! message), and only the exact same one again within ten minutes becomes
//! a repeat (`series.count`) of the first. "Created pod: web-x2k4f" and
//! "Created pod: web-9sd7q" are two events. kube-runtime's `Recorder`
//! keys repeats without the message, which folds every pod creation of a
//! ReplicaSet into its first message.
//!
//! Recording never waits on the API: events go into a bounded queue that
//! background tasks drain, and when the queue is full they are dropped,
//! as client-go's broadcaster drops them. An event is information about
//! an action, never worth slowing the action down for.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as ApiEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long an event can gather repeats before a new one is written.
pub const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Events waiting to be written, over all lanes, before new ones are
/// dropped.
pub const DEFAULT_CAPACITY: usize = 8192;
/// Writers working at once. Each owns the events whose key hashes to it,
/// so repeats of one event are written in order by one writer, and a
/// burst of distinct events (a thousand pods scheduled) is not written
/// one round trip at a time. Few, so that the writes that matter (pod
/// bindings, status) get the API server's attention first.
const LANES: usize = 4;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event to record about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// Why, in UpperCamelCase (`Scheduled`, `SuccessfulCreate`).
    pub reason: String,
    /// What happened, for humans (core/v1 `message`).
    pub note: String,
    /// What was done (`Binding`); the controllers use the reason.
    pub action: String,
}

/// Who reports: `reportingController` and `reportingInstance`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reporter {
    pub controller: String,
    pub instance: String,
}

impl Reporter {
    /// A reporter whose instance is its controller name, as the
    /// controllers and the scheduler here report.
    pub fn new(controller: &str) -> Self {
        Reporter {
            controller: controller.to_string(),
            instance: controller.to_string(),
        }
    }
}

/// What makes two events the same event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The object's uid, or kind/namespace/name when it has none.
    object: String,
    type_: EventType,
    reason: String,
    note: String,
}

impl Key {
    fn new(regarding: &ObjectReference, ev: &Event) -> Key {
        let object = match regarding.uid.as_deref().filter(|u| !u.is_empty()) {
            Some(uid) => uid.to_string(),
            None => format!(
                "{}/{}/{}",
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default()
            ),
        };
        Key {
            object,
            type_: ev.type_,
            reason: ev.reason.clone(),
            note: ev.note.clone(),
        }
    }

    fn lane(&self) -> usize {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        (h.finish() % LANES as u64) as usize
    }
}

/// An event written, gathering repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    name: String,
    namespace: String,
    count: i32,
    first: Instant,
}

/// What a lane remembers of the events it wrote in the last
/// [`SERIES_WINDOW`]. Pure bookkeeping, so that it can be tested alone.
#[derive(Debug, Default)]
struct Series {
    written: HashMap<Key, Written>,
    /// Keys by when they were first written, to expire them in order
    /// without scanning every entry on every event (a burst of thousands
    /// of Scheduled events would otherwise scan them all each time).
    order: VecDeque<(Instant, Key)>,
}

impl Series {
    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < SERIES_WINDOW {
                break;
            }
            let (at, key) = self.order.pop_front().expect("front exists");
            // Rewritten since (the first expired, a new one was made):
            // that one has its own entry further back.
            if self.written.get(&key).is_some_and(|w| w.first == at) {
                self.written.remove(&key);
            }
        }
    }

    /// A repeat of an event written within the window: its name,
    /// namespace and new count.
    fn repeat(&mut self, key: &Key, now: Instant) -> Option<(String, String, i32)> {
        self.expire(now);
        let w = self.written.get_mut(key)?;
        w.count += 1;
        Some((w.name.clone(), w.namespace.clone(), w.count))
    }

    fn wrote(&mut self, key: Key, name: String, namespace: String, now: Instant) {
        self.order.push_back((now, key.clone()));
        self.written.insert(
            key,
            Written {
                name,
                namespace,
                count: 1,
                first: now,
            },
        );
    }
}

struct Job {
    key: Key,
    regarding: ObjectReference,
    event: Event,
}

struct Inner {
    /// Senders to the lane tasks; dropping them (the last recorder
    /// handle going) lets the lanes write what they hold and end.
    lanes: Vec<mpsc::Sender<Job>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Records events; cheap to clone, all clones share the queue.
///
/// # Guarantees
///
/// [`Recorder::record`] never waits. Events that do not fit are dropped
/// (with a debug log). The writers stop once every clone is dropped and
/// the queued events are written, or at [`Recorder::shutdown`].
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `reporter`, with [`DEFAULT_CAPACITY`].
    /// Must be called within a tokio runtime: it starts the writers.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self::with_capacity(client, reporter, DEFAULT_CAPACITY)
    }

    /// A recorder holding up to about `capacity` unwritten events.
    pub fn with_capacity(client: kube::Client, reporter: Reporter, capacity: usize) -> Self {
        let per_lane = capacity.div_ceil(LANES).max(1);
        let reporter = Arc::new(reporter);
        let mut lanes = Vec::with_capacity(LANES);
        let mut tasks = Vec::with_capacity(LANES);
        for _ in 0..LANES {
            let (tx, rx) = mpsc::channel(per_lane);
            lanes.push(tx);
            tasks.push(tokio::spawn(lane(client.clone(), reporter.clone(), rx)));
        }
        Recorder {
            inner: Arc::new(Inner {
                lanes,
                tasks: Mutex::new(tasks),
            }),
        }
    }

    /// Queue `event` about `regarding`.
    pub fn record(&self, regarding: ObjectReference, event: Event) {
        let key = Key::new(&regarding, &event);
        let lane = &self.inner.lanes[key.lane()];
        let job = Job {
            key,
            regarding,
            event,
        };
        if let Err(e) = lane.try_send(job) {
            let job = match e {
                mpsc::error::TrySendError::Full(j) | mpsc::error::TrySendError::Closed(j) => j,
            };
            tracing::debug!(reason = %job.event.reason, object = ?job.regarding.name,
                "event writer behind, dropping an event");
        }
    }

    /// A Normal event on `obj`, whose action is its reason.
    pub fn normal<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.on(obj, EventType::Normal, reason, note);
    }

    /// A Warning event on `obj`, whose action is its reason.
    pub fn warning<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.on(obj, EventType::Warning, reason, note);
    }

    fn on<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.record(
            obj.object_ref(&()),
            Event {
                type_,
                reason: reason.to_string(),
                note,
                action: reason.to_string(),
            },
        );
    }

    /// Stop taking events, give the writers up to `grace` to write what
    /// is queued, then stop them. Other clones can still record, but
    /// nothing writes what they queue after this.
    pub async fn shutdown(self, grace: Duration) {
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        // Only the last handle's drop closes the queues; with others
        // alive, the writers are stopped after the grace period.
        drop(self);
        // Aborts the writers if this future is dropped half-way too.
        let mut writers = AbortAll(tasks);
        let all = futures::future::join_all(writers.0.iter_mut());
        let _ = tokio::time::timeout(grace, all).await;
    }
}

/// Tasks aborted when this is dropped.
struct AbortAll(Vec<JoinHandle<()>>);

impl Drop for AbortAll {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// One writer: writes its events in order, folding repeats.
async fn lane(client: kube::Client, reporter: Arc<Reporter>, mut rx: mpsc::Receiver<Job>) {
    let mut series = Series::default();
    while let Some(job) = rx.recv().await {
        write(&client, &reporter, &mut series, job).await;
    }
}

async fn write(client: &kube::Client, reporter: &Reporter, series: &mut Series, job: Job) {
    let Job {
        key,
        regarding,
        event,
    } = job;
    let reason = event.reason.as_str();
    let now = jiff::Timestamp::now();
    if let Some((name, namespace, count)) = series.repeat(&key, Instant::now()) {
        let api: Api<ApiEvent> = Api::namespaced(client.clone(), &namespace);
        let patch = json!({"series": EventSeries { count, last_observed_time: MicroTime(now) }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            // Gone (expired or deleted): write a new one below.
            Err(e) => tracing::debug!(reason, "updating event series failed: {e}"),
        }
    }
    let namespace = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let name = format!(
        "{}.{:x}",
        regarding.name.as_deref().unwrap_or(&reporter.controller),
        now.as_nanosecond()
    );
    let ev = ApiEvent {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: Some(event.note),
        type_: Some(event.type_.as_str().to_string()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone()),
        ..Default::default()
    };
    let api: Api<ApiEvent> = Api::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), &ev).await {
        Ok(_) => series.wrote(key, name, namespace, Instant::now()),
        Err(e) => tracing::warn!(reason, "recording event failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: &str, reason: &str, note: &str) -> Key {
        let r = ObjectReference {
            uid: Some(uid.into()),
            ..Default::default()
        };
        Key::new(
            &r,
            &Event {
                type_: EventType::Normal,
                reason: reason.into(),
                note: note.into(),
                action: reason.into(),
            },
        )
    }

    #[test]
    fn distinct_messages_are_distinct_events() {
        let t0 = Instant::now();
        let mut s = Series::default();
        let a = key("rs", "SuccessfulCreate", "Created pod: web-x2k4f");
        let b = key("rs", "SuccessfulCreate", "Created pod: web-9sd7q");
        assert_eq!(s.repeat(&a, t0), None);
        s.wrote(a.clone(), "a".into(), "ns".into(), t0);
        assert_eq!(s.repeat(&b, t0), None, "another message: a new event");
        s.wrote(b.clone(), "b".into(), "ns".into(), t0);
        assert_eq!(s.repeat(&a, t0), Some(("a".into(), "ns".into(), 2)));
        assert_eq!(s.repeat(&a, t0), Some(("a".into(), "ns".into(), 3)));
        assert_eq!(s.repeat(&b, t0), Some(("b".into(), "ns".into(), 2)));
        // Another object, type or reason: another event.
        assert_eq!(
            s.repeat(
                &key("rs2", "SuccessfulCreate", "Created pod: web-x2k4f"),
                t0
            ),
            None
        );
        assert_eq!(
            s.repeat(&key("rs", "FailedCreate", "Created pod: web-x2k4f"), t0),
            None
        );
        let mut warning = a.clone();
        warning.type_ = EventType::Warning;
        assert_eq!(s.repeat(&warning, t0), None);
    }

    #[test]
    fn repeats_fold_only_within_the_window() {
        let t0 = Instant::now();
        let mut s = Series::default();
        let a = key("pod", "FailedScheduling", "0/1 nodes are available");
        s.wrote(a.clone(), "a".into(), "ns".into(), t0);
        let late = t0 + SERIES_WINDOW - Duration::from_secs(1);
        assert_eq!(s.repeat(&a, late), Some(("a".into(), "ns".into(), 2)));
        let after = t0 + SERIES_WINDOW;
        assert_eq!(s.repeat(&a, after), None, "window over: a new event");
        s.wrote(a.clone(), "a2".into(), "ns".into(), after);
        assert_eq!(s.repeat(&a, after), Some(("a2".into(), "ns".into(), 2)));
        assert_eq!(s.order.len(), 1, "expired entries are dropped");
    }

    #[test]
    fn objects_without_uid_are_keyed_by_name() {
        let r = |name: &str| ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..Default::default()
        };
        let ev = Event {
            type_: EventType::Normal,
            reason: "R".into(),
            note: "n".into(),
            action: "R".into(),
        };
        assert_ne!(Key::new(&r("a"), &ev), Key::new(&r("b"), &ev));
        assert_eq!(Key::new(&r("a"), &ev), Key::new(&r("a"), &ev));
    }

    #[tokio::test]
    async fn record_never_waits_and_drops_when_full() {
        // Nothing listens on port 1: writes fail, slowly or fast, and the
        // queue fills; record must return at once regardless.
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(cfg).unwrap();
        let rec = Recorder::with_capacity(client, Reporter::new("test"), 4);
        let pod = k8s_openapi::api::core::v1::Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        for i in 0..10_000 {
            rec.normal(&pod, "Test", format!("event {i}"));
        }
        rec.shutdown(Duration::from_millis(100)).await;
    }
}
