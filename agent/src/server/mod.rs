//! The agent's HTTP endpoints: the read-only status endpoint
//! ([`readonly`], loopback, no authentication) and the authenticated node
//! server on 10250 that the API server and users reach for logs, exec,
//! attach, port-forward, metrics and stats.

pub mod auth;
pub mod logs;
pub mod readonly;
pub mod secure;
pub mod spdy;
pub mod stats;
pub mod stream;
pub mod tls;
pub mod upgrade;
pub mod wschannel;
pub mod wstunnel;

pub use readonly::{router, serve, ServerState};
