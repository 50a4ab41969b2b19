//! The agent's HTTP endpoints: the read-only status endpoint
//! ([`readonly`], loopback, no authentication) and the authenticated node
//! server on 10250 that the API server and users reach for logs, exec,
//! attach, port-forward, metrics, stats, its configuration (`/configz`),
//! its system logs (`/logs/`) and tunnels to its pods for the API server's
//! pods/proxy and services/proxy.

pub mod auth;
pub mod configz;
pub mod logs;
pub mod readonly;
pub mod secure;
pub mod spdy;
pub mod spdyclient;
pub mod stats;
pub mod stream;
pub mod syslogs;
pub mod tls;
pub mod tunnel;
pub mod upgrade;
pub mod wschannel;
pub mod wsportforward;
pub mod wstunnel;

pub use readonly::{router, serve, ServerState};
