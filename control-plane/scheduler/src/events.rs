//! What the scheduler tells users: `Scheduled` and `FailedScheduling`
//! events (events.k8s.io/v1, through kube-runtime's Recorder, which
//! folds repeats into a series) and the pod's `PodScheduled=False`
//! condition with reason `Unschedulable`.
//!
//! These writes run in their own task, fed through a bounded channel, so
//! that they never hold up decisions or bindings. Like upstream's event
//! broadcaster, events that do not fit in the channel are dropped: they
//! are informational. The pod condition is re-sent on the next failed
//! attempt if it was dropped, because the scheduling loop decides on it
//! from the pod as the watch shows it.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::podinfo::PodInfo;

/// How many notices may wait; past this they are dropped.
const CAPACITY: usize = 8192;
/// Writes in flight at once. Kept low so that bindings get the API
/// server's attention first.
const CONCURRENCY: usize = 4;

/// Something to tell about a pod.
#[derive(Debug)]
pub enum Notice {
    /// The pod was bound to `node`.
    Scheduled { pod: ObjectReference, node: String },
    /// No node fits. With `condition`, also set PodScheduled=False with
    /// this message and that last transition time.
    FailedScheduling {
        pod: ObjectReference,
        message: String,
        condition: Option<Time>,
    },
}

/// A reference to `pod` for events.
pub fn reference(pod: &PodInfo) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

/// The sending side, held by the scheduling loop.
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Notice>,
}

impl Notifier {
    /// Queue `notice`; drops it when the writer is too far behind.
    pub fn send(&self, notice: Notice) {
        if let Err(e) = self.tx.try_send(notice) {
            debug!(error = %e, "event writer behind, dropping a scheduler event");
        }
    }
}

/// A notifier and the writer task's body, which runs until the notifier
/// is dropped and the queued notices are written (or `stop` resolves).
pub fn channel(
    client: kube::Client,
    scheduler_name: &str,
    stop: impl Future<Output = ()>,
) -> (Notifier, impl Future<Output = ()>) {
    let (tx, mut rx) = mpsc::channel(CAPACITY);
    let reporter = Reporter {
        controller: scheduler_name.to_string(),
        instance: Some(scheduler_name.to_string()),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    let writer = async move {
        let notices = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let all =
            notices.for_each_concurrent(CONCURRENCY, |n| write(&client, &reporter, &recorder, n));
        tokio::select! {
            _ = all => {}
            _ = stop => {}
        }
    };
    (Notifier { tx }, writer)
}

async fn write(client: &kube::Client, reporter: &Reporter, recorder: &Recorder, notice: Notice) {
    match notice {
        Notice::Scheduled { pod, node } => {
            let note = format!(
                "Successfully assigned {}/{} to {node}",
                pod.namespace.as_deref().unwrap_or_default(),
                pod.name.as_deref().unwrap_or_default()
            );
            let ev = Event {
                type_: EventType::Normal,
                reason: "Scheduled".into(),
                note: Some(note),
                action: "Binding".into(),
                secondary: None,
            };
            // A pod is scheduled once: nothing to fold into a series, so
            // a recorder of its own, whose cache stays empty. The shared
            // one would keep every pod for six minutes and scan them all
            // on each publish, which a burst of thousands feels.
            let once = Recorder::new(client.clone(), reporter.clone());
            if let Err(e) = once.publish(&ev, &pod).await {
                debug!(pod = ?pod.name, error = %e, "could not record the Scheduled event");
            }
        }
        Notice::FailedScheduling {
            pod,
            message,
            condition,
        } => {
            if let Some(since) = condition {
                set_condition(client, &pod, &message, since).await;
            }
            let ev = Event {
                type_: EventType::Warning,
                reason: "FailedScheduling".into(),
                note: Some(message),
                action: "Scheduling".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&ev, &pod).await {
                debug!(pod = ?pod.name, error = %e, "could not record the FailedScheduling event");
            }
        }
    }
}

/// PodScheduled=False, reason Unschedulable, through pods/status: a
/// strategic merge patch, which merges conditions by type.
async fn set_condition(client: &kube::Client, pod: &ObjectReference, message: &str, since: Time) {
    let (Some(ns), Some(name)) = (pod.namespace.as_deref(), pod.name.as_deref()) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = json!({
        "status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": since,
        }]}
    });
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        warn!(pod = %format!("{ns}/{name}"), error = %e,
            "could not set the PodScheduled=False condition; it is retried on the next attempt");
    }
}
