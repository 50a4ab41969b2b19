//! Every integration test of this crate in one binary: each file below
//! was its own, and each linked the whole API server again (CI's disk
//! held ~90 such binaries). Run one file's tests with
//! `cargo test -p CRATE --test suite FILE::`.

// Shared by the test modules below.
#[path = "support/aggregated_server.rs"]
mod aggregated_server;
#[path = "support/api.rs"]
mod api;
#[path = "support/api_suite.rs"]
mod api_suite;
#[path = "support/etcd.rs"]
mod etcd_support;
#[path = "support/fuzz.rs"]
mod fuzz;
#[path = "support/webhook_server.rs"]
mod webhook_server;

mod api_aggregation;
mod api_apply;
mod api_audit;
mod api_core_endpoints;
mod api_crd;
mod api_crd_conversion;
mod api_crud;
mod api_csr;
mod api_drain;
mod api_encryption;
mod api_ephemeral;
mod api_errors;
mod api_etcd;
mod api_eviction;
mod api_limitrange;
mod api_limits;
mod api_metrics;
mod api_oidc;
mod api_podsecurity;
mod api_policies;
mod api_priorityclass;
mod api_rbac;
mod api_resourcequota;
mod api_reviews;
mod api_runtimeclass;
mod api_serviceaccounts;
mod api_storage;
mod api_store;
mod api_validation;
mod api_watch;
mod api_webhooks;
mod cli;
mod fuzz_decoders;
mod fuzz_patches;
mod fuzz_selectors;
mod leader_election;
mod store_bench;
mod store_conformance;
mod store_etcd_cluster;
mod store_restore;
mod store_snapshots;
mod store_sqlite_bounds;
mod store_sqlite_crash;
