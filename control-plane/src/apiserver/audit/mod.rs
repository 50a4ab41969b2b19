//! kube-apiserver's audit log: every request the policy selects is
//! written as `audit.k8s.io/v1` `Event`s, one JSON line each, at the
//! stages of its life (`--audit-policy-file`, `--audit-log-path`,
//! `--audit-log-maxsize|maxbackup|maxage`).
//!
//! # Layout
//! - [`policy`]: the `Policy` file, its checks, and the rule matching
//! - [`event`]: the `Event` and its parts, as upstream serializes them
//! - [`record`]: one request's events, from received to complete
//! - [`sink`]: the bounded queue and the writer thread
//! - [`rotate`]: the log file and its lumberjack-style backups
//! - [`annotations`]: annotations added from inside a request's handler
//!
//! Every response carries an `Audit-Id` header, audited or not, as
//! upstream's: the client's own `Audit-Id` when it sent one, else a new
//! UUID, and the same ID in that request's events.

pub mod annotations;
pub mod event;
pub mod policy;
pub mod record;
pub mod rotate;
pub mod sink;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::Request;

use super::request::{Query, Target};
use crate::auth::Identity;
pub use annotations::{annotate, scoped};
pub use policy::Policy;
pub use record::Recorder;
pub use sink::{Counters, Destination, Sink};

/// Audit errors: the policy file or the log, named with the field or path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy file cannot be read.
    #[error("reading audit policy {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML or JSON of a Policy's shape (serde's message names the
    /// unknown or mistyped field).
    #[error("parsing audit policy {path}: {message}")]
    Parse { path: String, message: String },
    /// A field has a value upstream refuses too.
    #[error("audit policy {path}: {field}: {why}")]
    Invalid {
        path: String,
        field: String,
        why: String,
    },
    /// The log file (or its writer) cannot be set up.
    #[error("opening audit log {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Name `path` in a policy error.
    fn in_file(self, file: &Path) -> Error {
        let named = file.display().to_string();
        match self {
            Error::Parse { message, .. } => Error::Parse {
                path: named,
                message,
            },
            Error::Invalid { field, why, .. } => Error::Invalid {
                path: named,
                field,
                why,
            },
            other => other,
        }
    }
}

/// What the flags ask for (resolved by [`crate::config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub policy_file: PathBuf,
    pub log: Destination,
}

/// The server's auditing, shared by every request: off, or a policy and
/// a sink.
#[derive(Debug, Clone, Default)]
pub struct Auditor {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    policy: Policy,
    sink: Sink,
}

impl Auditor {
    /// Load the policy and open the log, or stay off without options.
    ///
    /// # Errors
    /// The policy is unreadable or refused, or the log cannot be opened.
    pub fn start(opts: Option<&Options>, counters: Counters) -> Result<Auditor> {
        let Some(o) = opts else {
            return Ok(Auditor::default());
        };
        let policy = Policy::load(&o.policy_file)?;
        let sink = Sink::open(&o.log, counters)?;
        let to = match &o.log {
            Destination::Stdout => "stdout".to_string(),
            Destination::File(f) => f.path.display().to_string(),
        };
        tracing::info!(policy = %o.policy_file.display(), log = %to, "audit logging on");
        Ok(Auditor {
            inner: Some(Arc::new(Inner { policy, sink })),
        })
    }

    /// Start recording a request by `identity` (None: unauthenticated,
    /// audited as `system:anonymous`); writes its RequestReceived event
    /// when the policy selects it.
    pub fn begin<B>(
        &self,
        req: &Request<B>,
        target: &Target,
        query: &Query,
        identity: Option<&Identity>,
    ) -> Recorder {
        let id = req
            .headers()
            .get(record::AUDIT_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .unwrap_or_else(super::objects::new_uid);
        match &self.inner {
            None => Recorder::off(id),
            Some(inner) => {
                Recorder::begin(id, &inner.policy, &inner.sink, req, target, query, identity)
            }
        }
    }

    /// Wait until every event so far is written (shutdown).
    pub async fn flush(&self) {
        if let Some(inner) = &self.inner {
            inner.sink.flush().await;
        }
    }
}
