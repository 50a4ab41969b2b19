//! What the scheduler tells users: `Scheduled`, `FailedScheduling` and
//! `Preempted` events (through `kube_util`'s recorder, shared with the controllers:
//! one event per distinct message, repeats folded into a series) and the
//! pod's `PodScheduled=False` condition with reason `Unschedulable`.
//!
//! Neither ever holds up decisions or bindings. The recorder queues
//! events and drops them when too far behind, as upstream's broadcaster
//! does: they are informational. The condition writes run in their own
//! task, fed through a bounded channel, and are dropped likewise: the
//! condition is re-sent on the next failed attempt, because the
//! scheduling loop decides on it from the pod as the watch shows it.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube_util::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::podinfo::PodInfo;

/// How many condition writes may wait; past this they are dropped.
const CAPACITY: usize = 8192;
/// Condition writes in flight at once. Kept low so that bindings get the
/// API server's attention first.
const CONCURRENCY: usize = 4;
/// How long queued events may take to be written at shutdown.
const FLUSH: Duration = Duration::from_secs(5);

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
    /// The pod was chosen as a victim of `by`'s preemption on `node`.
    Preempted {
        pod: ObjectReference,
        by: String,
        node: String,
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

/// A PodScheduled=False write.
#[derive(Debug)]
struct Condition {
    pod: ObjectReference,
    message: String,
    since: Time,
}

/// The sending side, held by the scheduling loop.
#[derive(Debug, Clone)]
pub struct Notifier {
    recorder: Recorder,
    conditions: mpsc::Sender<Condition>,
}

impl Notifier {
    /// Record `notice`; never waits, drops what does not fit.
    pub fn send(&self, notice: Notice) {
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
                    note,
                    action: "Binding".into(),
                };
                self.recorder.record(pod, ev);
            }
            Notice::FailedScheduling {
                pod,
                message,
                condition,
            } => {
                if let Some(since) = condition {
                    let write = Condition {
                        pod: pod.clone(),
                        message: message.clone(),
                        since,
                    };
                    if let Err(e) = self.conditions.try_send(write) {
                        debug!(error = %e, "condition writer behind, dropping a PodScheduled update");
                    }
                }
                let ev = Event {
                    type_: EventType::Warning,
                    reason: "FailedScheduling".into(),
                    note: message,
                    action: "Scheduling".into(),
                };
                self.recorder.record(pod, ev);
            }
            Notice::Preempted { pod, by, node } => {
                let ev = Event {
                    type_: EventType::Normal,
                    reason: "Preempted".into(),
                    note: format!("Preempted by pod {by} on node {node}"),
                    action: "Preempting".into(),
                };
                self.recorder.record(pod, ev);
            }
        }
    }
}

/// A notifier and the condition writer's body, which runs until the
/// notifier is dropped, the queued conditions are written and the queued
/// events flushed (or `stop` resolves).
pub fn channel(
    client: kube::Client,
    scheduler_name: &str,
    stop: impl Future<Output = ()>,
) -> (Notifier, impl Future<Output = ()>) {
    let (tx, mut rx) = mpsc::channel::<Condition>(CAPACITY);
    let recorder = Recorder::new(client.clone(), Reporter::new(scheduler_name));
    let flush = recorder.clone();
    let writer = async move {
        let conditions = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let work = async {
            conditions
                .for_each_concurrent(CONCURRENCY, |c| {
                    set_condition(&client, c.pod, c.message, c.since)
                })
                .await;
            flush.shutdown(FLUSH).await;
        };
        tokio::select! {
            _ = work => {}
            _ = stop => {}
        }
    };
    (
        Notifier {
            recorder,
            conditions: tx,
        },
        writer,
    )
}

/// PodScheduled=False, reason Unschedulable, through pods/status: a
/// strategic merge patch, which merges conditions by type.
async fn set_condition(client: &kube::Client, pod: ObjectReference, message: String, since: Time) {
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
