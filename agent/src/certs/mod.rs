//! The node's credentials: joining a cluster with a token, obtaining
//! certificates through CertificateSigningRequests, and rotating them
//! before they expire.
//!
//! # Layout
//! - [`files`]: where credentials live; combined certificate-and-key files
//!   replaced atomically; reading validity and identity.
//! - [`request`]: one certificate through the CSR API (key made here).
//! - [`join`]: `skiff-agent join`.
//! - [`rotate`]: renewal of the client and serving certificates.

pub mod files;
pub mod join;
pub mod request;
pub mod rotate;
