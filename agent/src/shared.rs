//! What every pod worker of the node shares (the kubelet struct's role):
//! the configuration, the runtime, the event recorder, the status store,
//! the back-offs, the prober and the volume manager. Its own module, below
//! the worker, the runtime operations and the lifecycle hooks that all
//! take it, so that none of them needs another to reach it.

use std::sync::{Arc, Mutex};

use crate::backoff::Backoff;
use crate::config::Config;
use crate::events::Recorder;
use crate::runtime::image::ImagePuller;
use crate::runtime::Runtime;
use crate::status::StatusStore;

/// What the whole node's workers share.
pub struct Shared {
    pub config: Config,
    /// Shared with the PLEG, which prunes its caches on every relist.
    pub runtime: Arc<Runtime>,
    pub recorder: Box<dyn Recorder>,
    /// The node conditions under pressure (sender: the eviction manager;
    /// readers: node status and pod admission).
    pub pressure: Arc<crate::pressure::Pressure>,
    pub statuses: Arc<StatusStore>,
    /// CrashLoopBackOff delays, keyed `uid/container`.
    pub crash_backoff: Mutex<Backoff>,
    /// Image pulls and their ImagePullBackOff delays.
    pub images: ImagePuller,
    /// The runtime handlers of the pods' RuntimeClasses.
    pub runtime_classes: crate::runtime::runtimeclass::Lookup,
    pub host_ip: String,
    /// Liveness / readiness / startup probe workers and their results.
    pub prober: crate::prober::Prober,
    /// The pods' volumes, and the API objects they and env project.
    pub volumes: crate::volumes::VolumeManager,
    /// Set when the agent serves the cluster DNS itself, on the pod
    /// network's gateway: the node's pod CIDR (sender: the node agent).
    pub served_dns: Option<tokio::sync::watch::Receiver<Option<String>>>,
}

impl Shared {
    /// The nameservers of ClusterFirst pods: `--cluster-dns`, else the
    /// agent's own DNS server on the pod CIDR's gateway (known before any
    /// pod can have a network: the CNI configuration needs the CIDR too).
    pub fn cluster_dns(&self) -> Vec<String> {
        if !self.config.cluster_dns.is_empty() {
            return self.config.cluster_dns.clone();
        }
        let Some(cidr) = &self.served_dns else {
            return Vec::new();
        };
        let cidr = cidr.borrow().clone();
        cidr.as_deref()
            .and_then(crate::network::gateway)
            .map(|ip| vec![ip.to_string()])
            .unwrap_or_default()
    }
}
