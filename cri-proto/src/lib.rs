//! CRI v1 (`runtime.v1`) protobuf types and a typed client for container
//! runtimes such as containerd, over a unix socket.
//!
//! # Layout
//!
//! - [`v1`]: messages and tonic clients generated from
//!   `proto/runtime/v1/api.proto` (wire-identical to kubernetes/cri-api;
//!   Windows-only parts left out). The `server` feature adds the server
//!   traits, for fake runtimes in tests.
//! - [`CriClient`] (`client.rs`): one async method per RPC, each with a
//!   deadline, on a lazily (re)connecting channel.
//! - [`Error`] (`error.rs`): what failed, on which socket, and whether it is
//!   worth retrying.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cri_proto::Error> {
//! use std::time::Duration;
//! use cri_proto::{v1, CriClient};
//!
//! let cri = CriClient::connect_lazy("unix:///run/containerd/containerd.sock", Duration::from_secs(10))?;
//! let version = cri.version(v1::VersionRequest::default()).await?;
//! println!("{} {}", version.runtime_name, version.runtime_version);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod client;
mod error;
pub mod v1;

pub use client::{CriClient, Observer, DEFAULT_PULL_TIMEOUT};
pub use error::{Error, Result};
