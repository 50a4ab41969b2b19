//! skiff-agent: the node agent, in the kubelet's role. It runs the pods
//! its sources want through containerd's CRI and reports their status.
//!
//! # Layout
//! - [`config`]: every setting once ([`config::Settings`]): flags and the
//!   YAML config file decode into it, flags win, defaults fill the rest.
//! - [`source`]: where desired pods come from (the static pod directory).
//! - [`manager`]: desired pods -> one worker per pod; orphans torn down.
//! - [`worker`]: the per-pod sync loop: observe, plan, act, report.
//! - [`shared`]: what every pod worker shares (config, runtime, recorder,
//!   statuses, back-offs, prober, volumes).
//! - [`plan`]: the pure decision of a sync (the kubelet's computePodActions).
//! - [`runtime`]: the only code that writes through CRI: configs,
//!   observation, starting sandboxes and containers ([`runtime::start`]),
//!   image pulls and their back-off ([`runtime::image`]) with the pods'
//!   pull secrets ([`runtime::credentials`]), stops and teardown.
//! - [`registries`]: registry mirrors, logins and TLS from the
//!   registries file, written as containerd's registry host configuration.
//! - [`pleg`]: relisting (and CRI events) to wake workers; runtime health.
//! - [`status`]: PodStatus as the kubelet computes it; the status store
//!   and the manager that writes it to the API.
//! - [`prober`]: liveness, readiness and startup probes.
//! - [`lifecycle`]: postStart and preStop hooks.
//! - [`volumes`]: the pod's volumes, set up before its containers, torn
//!   down after them; configMaps and secrets read from the API.
//! - [`backoff`]: CrashLoopBackOff / ImagePullBackOff delays.
//! - [`node`]: the Node object: facts, registration, status, Lease.
//! - [`network`]: the pod network: the CNI configuration for the node's
//!   pod CIDR, and routes to the other nodes' pod CIDRs.
//! - [`logs`]: container log files: reading them, rotating them.
//! - [`server`]: the read-only status endpoint and the node server (10250).
//! - [`metrics`]: the process's Prometheus registry.
//! - [`certs`]: joining with a token; node certificates through CSRs and
//!   their rotation.
//! - [`install`]: `install` / `uninstall` as a systemd service.
//! - [`shutdown`]: graceful node shutdown (logind inhibitor lock).
//! - [`agent`]: wiring it all together.
//!
//! The service proxy (kube-proxy's role) and the cluster DNS server are
//! crates of their own beside this one, `skiff-proxy` (`agent/proxy/`) and
//! `skiff-dns` (`agent/dns/`): they alone pull in their dependencies
//! (hickory for DNS), and [`agent`] runs both in-process with the
//! `--proxy-*`, `--serve-cluster-dns` and `--resolv-conf` settings.
//!
//! No two modules import each other, directly or round a cycle:
//! `tests/import_cycles.rs` reads the module graph from the sources and
//! fails on one.
#![forbid(unsafe_code)]

pub mod agent;
pub mod apiclient;
pub mod backoff;
pub mod certs;
pub mod config;
pub mod events;
pub mod eviction;
pub mod halt;
pub mod images;
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
pub mod pressure;
pub mod prober;
pub mod registries;
pub mod runtime;
pub mod server;
pub mod shared;
pub mod shutdown;
pub mod source;
pub mod status;
pub mod ticks;
pub mod volumes;
pub mod worker;

pub use agent::run;
pub use config::Config;
