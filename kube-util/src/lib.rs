//! Kubernetes mechanisms that the scheduler, the controllers, the agent
//! and the API server must agree on, each written once: matching
//! (selectors, node affinity, tolerations), arithmetic (quantities, a
//! pod's requests, its QoS class), wording (kubectl's pod STATUS,
//! durations), and the two pieces of client machinery every control loop
//! needs (one informer per kind, one event recorder).
//!
//! # Layout
//!
//! - [`selector`]: label selectors and `key: value` map selectors.
//! - [`nodeaffinity`]: node selector terms (`matchExpressions` with Gt /
//!   Lt, `matchFields`), a pod's nodeSelector and required node affinity.
//! - [`storage`]: persistent volumes' well-known names, a pod's claims,
//!   which PV serves which claim, local-path directory names.
//! - [`taints`]: `tolerates`, the untolerated taint of a node, the
//!   well-known taint keys and effects.
//! - [`quantity`]: exact quantities (`100m`, `1.5Gi`, `1e3`).
//! - [`resources`]: a pod's effective requests, a node's allocatable.
//! - [`qos`]: a pod's QoS class.
//! - [`quota`]: what an object uses of a ResourceQuota, and which
//!   quotas' scopes it falls in.
//! - [`podstatus`]: the STATUS column of `kubectl get pods`.
//! - [`cron`]: CronJob schedules and their next times.
//! - [`indexes`]: Indexed Job completion index sets (`1,3-5,7`).
//! - [`duration`]: Go durations (`1m30s`) and kubectl ages (`5m3s`, `2d`).
//! - [`informer`]: a watched cache per kind, its subscriptions, and the
//!   factory that shares them across a process.
//! - [`events`]: the event recorder (one event per distinct message,
//!   repeats as a series, never waiting on the API).

#![forbid(unsafe_code)]

pub mod cron;
pub mod duration;
pub mod events;
pub mod indexes;
pub mod informer;
pub mod nodeaffinity;
pub mod podstatus;
pub mod qos;
pub mod quantity;
pub mod quota;
pub mod resources;
pub mod selector;
pub mod storage;
pub mod taints;

pub use events::Recorder;
pub use informer::{Factory, Informer};

/// Any failure of this crate, for callers that gather them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Quantity(#[from] quantity::Error),
    #[error(transparent)]
    Duration(#[from] duration::Error),
    #[error(transparent)]
    Selector(#[from] selector::Error),
    #[error(transparent)]
    Informer(#[from] informer::Error),
}
