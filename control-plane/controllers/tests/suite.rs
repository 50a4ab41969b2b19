//! Every integration test of this crate in one binary: each file below
//! was its own, and each linked the whole API server again (CI's disk
//! held ~90 such binaries). Run one file's tests with
//! `cargo test -p CRATE --test suite FILE::`.

// Shared by the test modules below.
#[path = "workloads_support/mod.rs"]
mod workloads_support;

mod disruption;
mod endpointslice;
mod gc;
mod namespace;
mod nodeipam;
mod nodelifecycle;
mod resourcequota;
mod volumes;
mod workloads_cronjob;
mod workloads_daemonset;
mod workloads_deployment;
mod workloads_job;
mod workloads_replicaset;
mod workloads_replicationcontroller;
mod workloads_statefulset;
