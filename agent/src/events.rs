//! Events about pods and the node, with the kubelet's reasons (Pulling,
//! Pulled, Created, Started, Killing, BackOff, Failed; Starting, NodeReady
//! ...). [`LogRecorder`] writes them as log lines; [`ApiRecorder`] also
//! writes them to the API server as core/v1 Events, the way the kubelet's
//! client-go recorder does: source `kubelet` on this host, repeats folded
//! into one Event's `count`, a per-object rate limit, and a bounded queue
//! drained by a background task so no pod worker ever waits on the API.

mod correlate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use tokio::sync::mpsc;

pub use correlate::{Correlator, Write};

use crate::pod::PodExt;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// The reporting component of every event the agent writes, as upstream.
pub const COMPONENT: &str = "kubelet";

/// client-go's `maxQueuedEvents`: beyond this, new events are dropped.
const QUEUE: usize = 1000;
/// client-go's `maxTriesPerEvent` and the sleep between tries.
const TRIES: u32 = 12;
const RETRY_SLEEP: Duration = Duration::from_secs(10);
/// One API call must not hold the queue longer than this.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Where pod events go.
pub trait Recorder: Send + Sync {
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str);
}

/// Writes each event as one log line.
pub struct LogRecorder;

impl Recorder for LogRecorder {
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        if type_ == WARNING {
            tracing::warn!(pod = %pod.key(), reason, "{message}");
        } else {
            tracing::info!(pod = %pod.key(), reason, "{message}");
        }
    }
}

/// The reference events about `pod` carry.
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace().to_string()),
        name: Some(pod.name().to_string()),
        uid: Some(pod.uid().to_string()),
        ..Default::default()
    }
}

/// The reference of node events. Like the kubelet, the uid is the node's
/// name (kubectl describe node searches both).
pub fn node_reference(node_name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node_name.to_string()),
        uid: Some(node_name.to_string()),
        ..Default::default()
    }
}

/// One event waiting in the queue.
struct Pending {
    regarding: ObjectReference,
    type_: String,
    reason: String,
    message: String,
    at: jiff::Timestamp,
}

/// Records events through the API (and as log lines). Cheap to clone: all
/// clones feed the same queue. The writer task ends once every clone is
/// dropped and the queue is drained.
#[derive(Clone)]
pub struct ApiRecorder {
    /// Receiver: the writer task, which stops when all senders are gone.
    tx: mpsc::Sender<Pending>,
    node: Arc<str>,
    /// Set once a full queue dropped an event, so the warning is logged
    /// once per episode rather than once per event.
    dropping: Arc<AtomicBool>,
}

/// An [`ApiRecorder`] writing as `kubelet` on `node_name`.
///
/// # Caveats
/// Spawns the writer task: call inside a tokio runtime.
pub fn api_recorder(client: kube::Client, node_name: &str) -> ApiRecorder {
    ApiRecorder::start(client, node_name)
}

impl ApiRecorder {
    /// Start the writer task; see [`api_recorder`].
    pub fn start(client: kube::Client, node_name: &str) -> ApiRecorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        let node: Arc<str> = node_name.into();
        tokio::spawn(write_loop(client, node.clone(), rx));
        ApiRecorder {
            tx,
            node,
            dropping: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// Queue an event about any object. Never waits: when the queue is
    /// full the event is dropped.
    pub fn record(&self, regarding: ObjectReference, type_: &str, reason: &str, message: &str) {
        let p = Pending {
            regarding,
            type_: type_.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            at: jiff::Timestamp::now(),
        };
        match self.tx.try_send(p) {
            Ok(()) => {
                self.dropping.store(false, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(p)) => {
                if !self.dropping.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        reason = %p.reason,
                        "event queue full ({QUEUE} events waiting for the API server); dropping events"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Queue an event about this node (logged too).
    pub fn node_event(&self, type_: &str, reason: &str, message: &str) {
        if type_ == WARNING {
            tracing::warn!(node = %self.node, reason, "{message}");
        } else {
            tracing::info!(node = %self.node, reason, "{message}");
        }
        self.record(node_reference(&self.node), type_, reason, message);
    }
}

/// An event about this node through `recorder`; without one (a
/// standalone agent) it is only logged.
pub fn report_node(recorder: Option<&ApiRecorder>, type_: &str, reason: &str, message: &str) {
    match recorder {
        Some(r) => r.node_event(type_, reason, message),
        None if type_ == WARNING => tracing::warn!(reason, "{message}"),
        None => tracing::info!(reason, "{message}"),
    }
}

impl Recorder for ApiRecorder {
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        LogRecorder.event(pod, type_, reason, message);
        self.record(pod_reference(pod), type_, reason, message);
    }
}

/// The Event object for a first occurrence, named like client-go's
/// (`<object>.<unix nanos in hex>`). Events about cluster-scoped objects
/// (the node) live in `default`.
pub fn new_event(
    node: &str,
    regarding: &ObjectReference,
    type_: &str,
    reason: &str,
    message: &str,
    at: jiff::Timestamp,
) -> Event {
    let namespace = regarding
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    let object = regarding.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", at.as_nanosecond())),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: regarding.clone(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(type_.to_string()),
        count: Some(1),
        first_timestamp: Some(Time(at)),
        last_timestamp: Some(Time(at)),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Default::default()
    }
}

/// Drain the queue: correlate, then write with retries.
async fn write_loop(client: kube::Client, node: Arc<str>, mut rx: mpsc::Receiver<Pending>) {
    let mut correlator = Correlator::default();
    while let Some(p) = rx.recv().await {
        let event = new_event(&node, &p.regarding, &p.type_, &p.reason, &p.message, p.at);
        let Some(write) = correlator.correlate(event, Instant::now()) else {
            tracing::debug!(reason = %p.reason, "event dropped by the per-object rate limit");
            continue;
        };
        let mut tries = 0;
        loop {
            tries += 1;
            match send(&client, &write).await {
                Ok(written) => {
                    correlator.written(&written);
                    break;
                }
                Err(e) if tries < TRIES && retriable(&e) => {
                    tracing::debug!(reason = %p.reason, "writing event failed, retrying: {e}");
                    // The first retry is jittered so that agents that lost
                    // the API together do not come back in lockstep.
                    let sleep = if tries == 1 {
                        RETRY_SLEEP.mul_f64(rand::random::<f64>())
                    } else {
                        RETRY_SLEEP
                    };
                    tokio::time::sleep(sleep).await;
                }
                Err(e) => {
                    tracing::warn!(
                        reason = %p.reason,
                        object = %p.regarding.name.as_deref().unwrap_or(""),
                        "dropping event after {tries} attempt(s): {e}"
                    );
                    break;
                }
            }
        }
    }
}

/// Why an event could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing event {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "writing event {namespace}/{name}: no answer from the API server within {CALL_TIMEOUT:?}"
    )]
    Timeout { namespace: String, name: String },
}

fn code(e: &Error) -> Option<u16> {
    match e {
        Error::Api {
            source: kube::Error::Api(s),
            ..
        } => Some(s.code),
        _ => None,
    }
}

/// Rejections (4xx other than 429) will not succeed on a retry.
fn retriable(e: &Error) -> bool {
    !matches!(code(e), Some(c) if (400..500).contains(&c) && c != 429)
}

/// Create, or patch the earlier Event; create it afresh when it expired.
async fn send(client: &kube::Client, write: &Write) -> Result<Event, Error> {
    let event = write.event();
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let name = event.metadata.name.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let wrap = |r: Option<Result<Event, kube::Error>>| match r {
        Some(Ok(e)) => Ok(e),
        Some(Err(source)) => Err(Error::Api {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        }),
        None => Err(Error::Timeout {
            namespace: namespace.clone(),
            name: name.clone(),
        }),
    };
    if let Write::Repeat { patch, .. } = write {
        let r = tokio::time::timeout(
            CALL_TIMEOUT,
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .await
        .ok();
        match wrap(r) {
            Err(e) if code(&e) == Some(404) => {}
            other => return other,
        }
    }
    let r = tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), event))
        .await
        .ok();
    match wrap(r) {
        // An earlier try that timed out may have written it after all.
        Err(e) if code(&e) == Some(409) => Ok(event.clone()),
        other => other,
    }
}
