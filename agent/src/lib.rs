//! skiff-agent: the node agent, in the kubelet's role. It runs the pods
//! its sources want through containerd's CRI and reports their status.
//!
//! # Layout
//! - [`config`]: flags and the YAML config file.
//! - [`source`]: where desired pods come from (the static pod directory).
//! - [`manager`]: desired pods -> one worker per pod; orphans torn down.
//! - [`worker`]: the per-pod sync loop: observe, plan, act, report.
//! - [`plan`]: the pure decision of a sync (the kubelet's computePodActions).
//! - [`runtime`]: CRI configs, observation and compound CRI operations.
//! - [`pleg`]: relisting (and CRI events) to wake workers; runtime health.
//! - [`status`]: PodStatus as the kubelet computes it.
//! - [`prober`]: liveness, readiness and startup probes.
//! - [`lifecycle`]: postStart and preStop hooks.
//! - [`volumes`]: the pod's volumes, set up before its containers, torn
//!   down after them; configMaps and secrets read from the API.
//! - [`backoff`]: CrashLoopBackOff / ImagePullBackOff delays.
//! - [`node`]: the Node object: facts, registration, status, Lease.
//! - [`network`]: the pod network: the CNI configuration for the node's
//!   pod CIDR, and routes to the other nodes' pod CIDRs.
//! - [`proxy`]: the service proxy (kube-proxy's role), nftables or
//!   iptables.
//! - [`dns`]: the cluster DNS server (cluster domain from the Service and
//!   EndpointSlice stores, other names forwarded upstream).
//! - [`logs`]: container log files: reading them, rotating them.
//! - [`server`]: the read-only status endpoint and the node server (10250).
//! - [`metrics`]: the process's Prometheus registry.
//! - [`certs`]: joining with a token; node certificates through CSRs and
//!   their rotation.
//! - [`install`]: `install` / `uninstall` as a systemd service.
//! - [`shutdown`]: graceful node shutdown (logind inhibitor lock).
//! - [`agent`]: wiring it all together.
#![forbid(unsafe_code)]

pub mod agent;
pub mod apiclient;
pub mod backoff;
pub mod certs;
pub mod config;
pub mod dns;
pub mod events;
pub mod install;
pub mod lifecycle;
pub mod logs;
pub mod manager;
pub mod metrics;
pub mod mirror;
pub mod network;
pub mod node;
pub mod plan;
pub mod pleg;
pub mod pod;
pub mod prober;
pub mod proxy;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod source;
pub mod status;
pub mod volumes;
pub mod worker;

pub use agent::run;
pub use config::Config;
