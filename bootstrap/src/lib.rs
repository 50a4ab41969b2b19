//! What `skiff-server` and `skiff-agent` agree on to join a node to a
//! cluster, kept in one place so that the two sides cannot drift apart.
//!
//! # Layout
//! - [`token`]: bootstrap tokens (`abcdef.0123456789abcdef`, upstream's
//!   format) and the join token that carries the cluster CA's hash with
//!   them (`K10<sha256>::<id>.<secret>`, k3s's format).
//! - [`csr`]: node certificate requests: built on the node (the key stays
//!   there), recognized by the API server, the approver and the signers.
//! - [`identity`]: the user and groups a client certificate names, as
//!   each side authenticates the other.
//! - [`names`]: the well-known names both sides use: the bootstrap token
//!   Secrets and their keys, the bootstrap identities, the signers of node
//!   certificates, the CA endpoint.
//! - [`discovery`]: the cluster CA, fetched without trust and pinned by
//!   the join token (agents and joining servers alike).
#![forbid(unsafe_code)]

pub mod csr;
pub mod discovery;
pub mod identity;
pub mod names;
pub mod token;

pub use token::{BootstrapToken, JoinToken};
