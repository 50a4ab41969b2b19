//! This node in the API: the facts it reports, its registration, status
//! and Lease heartbeat, and the CNI configuration for its pod CIDR.
//!
//! # Layout
//! - [`facts`]: capacity, addresses and nodeInfo from the system.
//! - [`runtime`]: the container runtime's health for the Ready condition.
//! - [`conditions`]: heartbeat / transition bookkeeping and node events.
//! - [`register`]: create or adopt the Node.
//! - [`status`]: the status loop (and re-registration, pod CIDR, uid).
//! - [`lease`]: the `kube-node-lease` heartbeat.
//! - [`NodeAgent`]: all of it started and stopped together.

pub mod conditions;
pub mod facts;
pub mod lease;
pub mod register;
pub mod runtime;
pub mod status;

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use facts::{Facts, AGENT_VERSION};
pub use runtime::{CriProbe, RuntimeHealth, RuntimeProbe};

use crate::config::Config;
use crate::events::{ApiRecorder, NORMAL};
use crate::network::Network;

/// Longest wait for one API call of the node loop.
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// A failed API call about this node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered with an error, or could not be reached.
    #[error("{action} {object}: {source} (retrying; check that the API server is reachable and the node's credentials are valid)")]
    Api {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// No answer in time.
    #[error("{action} {object}: no answer from the API server within {after:?} (retrying)")]
    Timeout {
        action: &'static str,
        object: String,
        after: Duration,
    },
}

impl Error {
    /// The HTTP status of an API error.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Run `fut` with a deadline, naming the action and object in its error.
async fn call<T>(
    action: &'static str,
    object: &str,
    after: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(Error::Api {
            action,
            object: object.to_string(),
            source,
        }),
        Err(_) => Err(Error::Timeout {
            action,
            object: object.to_string(),
            after,
        }),
    }
}

/// Exponential back-off between retries: `initial`, doubling, capped.
#[derive(Debug)]
struct Retry {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Retry {
    fn new(initial: Duration, max: Duration) -> Retry {
        Retry {
            initial,
            max,
            next: initial,
        }
    }

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Logs an outage once when it starts and once when it ends, rather than
/// on every failed retry.
#[derive(Debug)]
struct Outage {
    what: String,
    failing: bool,
}

impl Outage {
    fn new(what: String) -> Outage {
        Outage {
            what,
            failing: false,
        }
    }

    fn failed(&mut self, e: &Error) {
        if self.failing {
            tracing::debug!(object = %self.what, "{e}");
        } else {
            tracing::warn!(object = %self.what, "{e}");
        }
        self.failing = true;
    }

    fn ok(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(object = %self.what, "API server reachable again");
        }
    }
}

/// The node's side of joining the API: registration and status, the
/// Lease, and the CNI configuration for the pod CIDR. Each part retries
/// on its own while the API is down; none of them blocks the pods.
pub struct NodeAgent {
    client: kube::Client,
    config: Arc<Config>,
    facts: Arc<Facts>,
    probe: Arc<dyn RuntimeProbe>,
    recorder: Option<ApiRecorder>,
    pod_cidr: watch::Sender<Option<String>>,
    pressure: Option<Arc<crate::pressure::Pressure>>,
}

impl NodeAgent {
    /// `probe` answers for the runtime (a [`CriProbe`] in the agent);
    /// `recorder` receives the node's events (Starting, NodeReady ...).
    pub fn new(
        client: kube::Client,
        config: Arc<Config>,
        facts: Arc<Facts>,
        probe: Arc<dyn RuntimeProbe>,
        recorder: Option<ApiRecorder>,
    ) -> NodeAgent {
        let (pod_cidr, _) = watch::channel(config.pod_cidr.clone());
        NodeAgent {
            client,
            config,
            facts,
            probe,
            recorder,
            pod_cidr,
            pressure: None,
        }
    }

    /// Report the eviction manager's pressure conditions.
    pub fn with_pressure(mut self, pressure: Arc<crate::pressure::Pressure>) -> NodeAgent {
        self.pressure = Some(pressure);
        self
    }

    /// The node's pod CIDR as it becomes known: `--pod-cidr` at once,
    /// else the Node's `spec.podCIDR` once the control plane assigned it.
    pub fn pod_cidr(&self) -> watch::Receiver<Option<String>> {
        self.pod_cidr.subscribe()
    }

    /// Publish the pod CIDR on a channel made earlier (whose receivers
    /// were handed out before the node agent existed).
    pub fn with_pod_cidr(mut self, sender: watch::Sender<Option<String>>) -> NodeAgent {
        sender.send_replace(self.config.pod_cidr.clone());
        self.pod_cidr = sender;
        self
    }

    /// Run until `shutdown` resolves, then stop every loop. The Node and
    /// Lease stay as they are: the node lifecycle controller notices the
    /// missing heartbeat.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop) = watch::channel(false);
        let name = self.config.node_name.clone();
        if let Some(r) = &self.recorder {
            r.node_event(NORMAL, "Starting", "Starting kubelet.");
        }
        let mut tasks = Vec::new();
        if let Some(net) = Network::from_config(&self.config) {
            tasks.push(tokio::spawn(
                net.run(self.pod_cidr.subscribe(), stop.clone()),
            ));
            if self.config.pod_routes {
                let routes = crate::network::routes::Routes::new(self.client.clone(), &name);
                tasks.push(tokio::spawn(routes.run(stop.clone())));
            }
        }
        let (uid_tx, uid_rx) = watch::channel(None);
        let heartbeat = lease::Heartbeat::new(
            self.client.clone(),
            &name,
            self.config.node_lease_duration_seconds,
            uid_rx,
        );
        tasks.push(tokio::spawn(heartbeat.run(stop.clone())));
        let node_loop = status::NodeLoop {
            client: self.client,
            config: self.config,
            facts: self.facts,
            probe: self.probe,
            recorder: self.recorder,
            outputs: status::Outputs {
                pod_cidr: self.pod_cidr,
                node_uid: uid_tx,
            },
            pressure: self.pressure,
            cidr_warned: AtomicBool::new(false),
        };
        tasks.push(tokio::spawn(node_loop.run(stop.clone())));
        shutdown.await;
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        tracing::info!(node = %name, "node status and lease loops stopped");
    }
}
