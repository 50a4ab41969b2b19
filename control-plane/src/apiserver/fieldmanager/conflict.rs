//! Apply conflicts and their wire form (upstream `internal/conflict.go`):
//! the message of the 409 and its `FieldManagerConflict` causes.

use std::fmt;

use super::managers::{ManagerId, Operation};
use super::path::Path;
use super::set::FieldSet;
use crate::apiserver::status::Cause;

/// A field an apply would change that another manager owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: ManagerId,
    pub path: Path,
}

/// One apply's conflicts, by manager identifier (as upstream sorts them),
/// then path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflicts(pub Vec<Conflict>);

impl Conflicts {
    /// Each manager with the fields of its set that the apply would change.
    pub fn new(mut by_manager: Vec<(ManagerId, FieldSet)>) -> Self {
        by_manager.sort_by_cached_key(|(m, _)| m.identifier());
        let all = by_manager.into_iter().flat_map(|(manager, set)| {
            set.paths().into_iter().map(move |path| Conflict {
                manager: manager.clone(),
                path,
            })
        });
        Conflicts(all.collect())
    }

    /// `details.causes` of the 409 Status (reason `Conflict`).
    pub fn causes(&self) -> Vec<Cause> {
        let cause = |c: &Conflict| Cause {
            reason: "FieldManagerConflict",
            field: c.path.to_string(),
            message: format!("conflict with {}", describe(&c.manager)),
        };
        self.0.iter().map(cause).collect()
    }
}

impl fmt::Display for Conflicts {
    /// Upstream's message word for word: kubectl shows it as it comes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [one] = self.0.as_slice() {
            let who = describe(&one.manager);
            return write!(
                f,
                "Apply failed with 1 conflict: conflict with {who}: {}",
                one.path
            );
        }
        write!(f, "Apply failed with {} conflicts: ", self.0.len())?;
        for (i, c) in self.0.iter().enumerate() {
            if i == 0 || self.0[i - 1].manager != c.manager {
                let sep = if i == 0 { "" } else { "\n" };
                write!(f, "{sep}conflicts with {}:", describe(&c.manager))?;
            }
            write!(f, "\n- {}", c.path)?;
        }
        Ok(())
    }
}

/// Upstream `printManager`: `"name"`, `with subresource "s"`, and for an
/// update manager `using apps/v1`. (Identifiers hold no time, so
/// upstream's `at <time>` never shows.)
fn describe(m: &ManagerId) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut s = quote(&m.manager);
    if !m.subresource.is_empty() {
        s = format!("{s} with subresource {}", quote(&m.subresource));
    }
    if m.operation == Operation::Update {
        s = format!("{s} using {}", m.api_version);
    }
    s
}
