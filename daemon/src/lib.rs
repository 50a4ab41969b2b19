//! What both skiff daemons need to run well under systemd.
//!
//! # Layout
//! - [`notify`]: `sd_notify(3)` readiness (`READY=1`, `STOPPING=1`) and the
//!   watchdog keep-alive (`WATCHDOG=1` every half of `WATCHDOG_USEC`).
//! - [`logging`]: the `tracing` subscriber: journald's `<N>` priority
//!   prefixes and no timestamps or colours when stderr is the journal,
//!   colours only on a terminal otherwise.
//! - [`limits`]: bounds on a network server's callers: the descriptor
//!   limit raised, connection caps in all and per source, idle timeouts.
//! - [`serve`]: the HTTPS accept loop and connections both servers run,
//!   within those bounds.
//! - [`install`]: the shipped unit files, rendered and installed with the
//!   binary; `systemctl` behind a narrow trait.
#![forbid(unsafe_code)]

pub mod install;
pub mod limits;
pub mod logging;
pub mod notify;
pub mod serve;
