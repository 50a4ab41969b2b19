//! skiff control plane: `skiff-server`, a Kubernetes-compatible API server
//! over an embedded (SQLite) or etcd store.
//!
//! # Layout
//! - [`store`]: the `Store` trait and its SQLite and etcd backends
//! - [`apiserver`]: the Kubernetes REST API (discovery, CRUD, watch, patch,
//!   subresources, Table printing, OpenAPI)
//! - [`auth`]: authentication, RBAC, the Node authorizer
//! - [`pki`]: CA, serving and client certificates, kubeconfigs
//! - [`tokens`]: join tokens (bootstrap token Secrets) for `token create`
//! - [`install`]: `install` / `uninstall` as a systemd service
//! - [`server`]: HTTPS listener and lifecycle
//! - [`config`]: flags + YAML config; [`metrics`]: Prometheus metrics
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod auth;
pub mod components;
pub mod config;
pub mod install;
pub mod leader;
pub mod metrics;
pub mod pki;
pub mod server;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tokens;

pub use config::Config;
pub use server::{start, ServerHandle};
