//! CustomResourceDefinitions (apiextensions.k8s.io/v1): the kinds they
//! define, served by the generic verbs through a strategy built from the
//! definition.
//!
//! - [`definition`]: the CustomResourceDefinition kind's own rules.
//! - [`establish`]: naming, establishing and cleanup, following the store.
//! - [`registry`]: what this server serves beyond its built-in kinds.
//! - [`custom`]: a custom kind's model and strategy (schema, columns, scale).
//! - [`conversion`]: conversion webhooks between a kind's versions.
//! - [`structural`]: structural schemas: checks, pruning, defaulting, validation.
//! - [`crate::apiserver::cel`] runs the schemas' `x-kubernetes-validations` rules.
//! - [`jsonpath`]: the printer columns' paths; [`versions`]: version order;
//!   [`intern`]: the `'static` rows custom kinds are served under.

pub mod conversion;
pub mod custom;
pub mod definition;
pub mod establish;
mod intern;
pub mod jsonpath;
pub mod registry;
pub mod structural;
pub mod versions;

pub use registry::Registry;

use super::status::{ApiError, ApiResult};
use super::Req;

/// Holds a deleted definition until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// No object of a definition being deleted may be created: the cleanup
/// would miss it (upstream's 405).
///
/// # Errors
/// 405 MethodNotAllowed.
pub(crate) fn admit_create(crds: &Registry, r: &Req) -> ApiResult<()> {
    if crds.is_terminating(r.def.group, r.def.plural) {
        return Err(ApiError::method_not_allowed(
            "create not allowed while custom resource definition is terminating",
        ));
    }
    Ok(())
}
