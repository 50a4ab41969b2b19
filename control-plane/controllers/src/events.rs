//! Events for the objects controllers act on, through events.k8s.io/v1
//! (the server stores them with core/v1 events, so `kubectl get events`
//! lists them).

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Resource;

/// One recorder for a controller, reporting as `controller`.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, controller: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: None,
        };
        Events {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Record a Normal event on `obj`; failures are logged, never fatal.
    pub async fn normal<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.publish(obj, EventType::Normal, reason, note).await;
    }

    /// Record a Warning event on `obj`.
    pub async fn warning<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(obj, EventType::Warning, reason, note).await;
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(reason, "recording event failed: {e}");
        }
    }
}
