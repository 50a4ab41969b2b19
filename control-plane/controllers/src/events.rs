//! Events of the controllers (events.k8s.io/v1; the server stores them
//! with core/v1 events, so `kubectl get events` lists them), one per
//! distinct message, as upstream's recorder makes them: "Created pod:
//! web-x2k4f" and "Created pod: web-9sd7q" are two events, and only the
//! exact same message again within ten minutes becomes a repeat
//! (`series.count`) of the first.
//!
//! kube-runtime's `Recorder` keys repeats on the reason alone, which would
//! fold every pod creation of a ReplicaSet, and every scaling step of a
//! Deployment, into its first message.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;
use std::sync::{Mutex, MutexGuard};

/// How long an event can get repeats before a new one is written.
const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);

#[derive(Hash, PartialEq, Eq)]
struct Key {
    uid: String,
    type_: &'static str,
    reason: String,
    note: String,
}

struct Seen {
    name: String,
    namespace: String,
    count: i32,
    first: Instant,
}

/// Records events as `controller` (for example `deployment-controller`).
pub struct Recorder {
    client: kube::Client,
    controller: String,
    seen: Mutex<HashMap<Key, Seen>>,
}

impl Recorder {
    pub fn new(client: kube::Client, controller: &str) -> Self {
        Recorder {
            client,
            controller: controller.to_string(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A Normal event on `obj`. Failures are logged: an event is never
    /// worth failing a reconcile for.
    pub async fn normal<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.publish(obj.object_ref(&()), "Normal", reason, note)
            .await;
    }

    /// A Warning event on `obj`.
    pub async fn warning<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(obj.object_ref(&()), "Warning", reason, note)
            .await;
    }

    async fn publish(
        &self,
        regarding: ObjectReference,
        type_: &'static str,
        reason: &str,
        note: String,
    ) {
        let key = Key {
            uid: regarding.uid.clone().unwrap_or_default(),
            type_,
            reason: reason.to_string(),
            note: note.clone(),
        };
        let now = jiff::Timestamp::now();
        // The lock is never held across an API call: events of one
        // controller must not queue behind each other.
        let repeat = {
            let mut seen = self.lock();
            seen.retain(|_, s| s.first.elapsed() < SERIES_WINDOW);
            seen.get_mut(&key).map(|s| {
                s.count += 1;
                (s.name.clone(), s.namespace.clone(), s.count)
            })
        };
        if let Some((name, namespace, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let series =
                json!({"series": EventSeries { count, last_observed_time: MicroTime(now) }});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
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
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(reason.to_string()),
            reason: Some(reason.to_string()),
            note: Some(note),
            type_: Some(type_.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.controller.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {
                self.lock().insert(
                    key,
                    Seen {
                        name,
                        namespace,
                        count: 1,
                        first: Instant::now(),
                    },
                );
            }
            Err(e) => tracing::warn!(reason, "recording event failed: {e}"),
        }
    }
}
