//! Errors of CRI calls; every message names the socket and the RPC.

use std::path::PathBuf;
use std::time::Duration;

use tonic::Code;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed CRI call or connection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is neither a plain socket path nor a `unix://` URL.
    #[error("invalid cri endpoint {endpoint:?}: want a unix socket path or unix:///path")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
    },

    /// The eager [`connect`](crate::CriClient::connect) could not reach the socket.
    #[error("cannot connect to cri runtime at {}", socket.display())]
    Connect {
        /// The unix socket path.
        socket: PathBuf,
        /// Why the connection failed.
        #[source]
        source: tonic::transport::Error,
    },

    /// No answer within the client-side deadline (the same deadline is also
    /// sent as `grpc-timeout`, so the runtime gives up on its side too).
    #[error("cri {method} on {} timed out after {after:?}", socket.display())]
    Timeout {
        /// RPC name, e.g. `"RunPodSandbox"`.
        method: &'static str,
        /// The unix socket path.
        socket: PathBuf,
        /// The deadline that passed.
        after: Duration,
    },

    /// The runtime answered with a gRPC error, or the connection failed
    /// (see [`Error::is_unavailable`]).
    #[error("cri {method} on {} failed: {:?}: {}", socket.display(), status.code(), status.message())]
    Status {
        /// RPC name, e.g. `"RunPodSandbox"`.
        method: &'static str,
        /// The unix socket path.
        socket: PathBuf,
        /// The gRPC status as received.
        #[source]
        status: tonic::Status,
    },
}

impl Error {
    /// The gRPC code: the runtime's for [`Error::Status`], `DeadlineExceeded`
    /// for [`Error::Timeout`], `Unavailable` for [`Error::Connect`], none for
    /// a bad endpoint.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            Error::Timeout { .. } => Some(Code::DeadlineExceeded),
            Error::Connect { .. } => Some(Code::Unavailable),
            Error::InvalidEndpoint { .. } => None,
        }
    }

    /// The object does not exist. Runtimes answer `NotFound` for status
    /// calls on unknown ids; kubelet treats that as "already gone".
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound)
    }

    /// The runtime does not implement the RPC (e.g. an older containerd):
    /// callers fall back, as the kubelet does for evented PLEG.
    pub fn is_unimplemented(&self) -> bool {
        self.code() == Some(Code::Unimplemented)
    }

    /// The runtime is down or not answering: `Unavailable`, connection
    /// failures and timeouts. Worth retrying later.
    ///
    /// Includes the first call after the runtime dropped the connection
    /// (e.g. a containerd restart): tonic reports that as `Unknown:
    /// transport error`; the next call reconnects.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::Timeout { .. } => true,
            Error::Status { status, .. } => {
                status.code() == Code::Unavailable
                    || std::error::Error::source(status)
                        .is_some_and(|s| s.is::<tonic::transport::Error>())
            }
            Error::InvalidEndpoint { .. } => false,
        }
    }
}
