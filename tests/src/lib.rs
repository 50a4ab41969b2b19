//! End-to-end test harness for skiff: a private containerd per test, test
//! images built locally, a loopback registry, and cleanup that leaves
//! nothing behind.
//!
//! # Layout
//!
//! - [`containerd`]: the [`Containerd`] fixture. Each run gets a unique id
//!   and `/tmp/skiff-test/<id>/` holding containerd's root, state, sockets,
//!   config, log, CNI config (bridge `skb-<id>`, a leased 198.18.X.0/24,
//!   portmap) and runc root. `start()` waits for CRI RuntimeReady and
//!   NetworkReady and side-loads the pause and toolbox images;
//!   `stop()`/`start_again()`/`restart()` restart containerd under running
//!   containers.
//! - [`images`]: OCI image layouts built with `oci-spec`: [`PAUSE_IMAGE`]
//!   (a static pause compiled from `tests/images/pause.c`), [`TOOLBOX_IMAGE`]
//!   (busybox-static with every applet), extra toolbox tags with distinct
//!   digests, and side-loading through `ctr images import`.
//! - [`registry`]: a read-only OCI distribution registry on
//!   127.0.0.1:<random port> (axum) for real CRI `PullImage` tests.
//! - [`distribution`]: a private registry (the distribution server) with TLS
//!   of a test CA and htpasswd auth, for pull-secret tests.
//! - [`agent`]: a `skiff-agent` process run against a fixture's containerd
//!   (root, logs and static pod dir inside the run directory).
//! - [`cluster`]: a control plane (the `skiff-server` binary) and N nodes
//!   (a containerd and a joined `skiff-agent` each) on this machine, node
//!   pod subnets assigned by the server's node IPAM from a leased block;
//!   real kubectl as admin; kill and restart of agents and server.
//! - [`netns`]: a cluster's LAN (a bridge) and its nodes as network
//!   namespaces cabled to it.
//! - [`ha`]: several skiff-servers on managed etcd, each in a namespace
//!   of its own, the first starting the cluster and the others joining.
//! - [`join`]: nodes joined with `skiff-server token create` and
//!   `skiff-agent join`, their agents started on the joined kubeconfig.
//! - [`logind`]: a private D-Bus bus (real dbus-daemon) with a fake
//!   systemd-logind, for graceful node shutdown.
//! - [`pid1`]: a real systemd as PID 1 of a private nspawn container that
//!   shares nothing writable with the host.
//! - [`python`]: scripts of `tests/python/` run with the official Python
//!   client (pinned, installed by `scripts/test-deps.sh`) against a cluster.
//! - [`bench`]: what the cluster benchmarks share (sizes, a pod watch that
//!   counts pods reaching a state, waiting for a round's pods to go).
//! - [`cleanup`]: teardown in dependency order (CRI, containerd, runc,
//!   shims, mounts, netns, bridge, iptables/nft, directory, subnet lease),
//!   run from `Drop` even after a panic, and a sweeper that tears down runs
//!   of test processes that died (SIGKILL) before they could.
//!
//! Everything here needs root and only touches loopback and addresses the
//! fixture created (198.18.0.0/15).
#![allow(clippy::disallowed_methods)]
// a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout
#![forbid(unsafe_code)]

pub mod agent;
pub mod aggregation;
pub mod bench;
pub mod cleanup;
pub mod cluster;
pub mod containerd;
pub mod distribution;
pub mod ha;
pub mod images;
pub mod join;
pub mod logind;
pub mod netns;
pub mod pid1;
pub mod python;
pub mod rawcri;
pub mod registry;
pub mod webhooks;

pub use containerd::{Containerd, ContainerdBuilder};
pub use images::{OciImage, PAUSE_IMAGE, TOOLBOX_IMAGE};
pub use registry::Registry;
