//! The RuntimeClass admission plugin, for as long as `node.k8s.io`
//! RuntimeClasses are not served: every class a pod names is one that
//! does not exist, and upstream refuses a pod naming a missing class (and
//! an `overhead` no class set). Refusing keeps `runtimeClassName` from
//! being accepted and then ignored.

use serde_json::Value;

use super::objects;
use super::priority::forbidden;
use super::ApiResult;

/// Mutating admission of a new pod (the caller checked it is one).
///
/// # Errors
/// 403 with upstream's message for a `runtimeClassName` or an `overhead`.
pub(crate) fn admit_create(pod: &Value) -> ApiResult<()> {
    let name = objects::name(pod).unwrap_or_default();
    let spec = &pod["spec"];
    if let Some(class) = spec["runtimeClassName"].as_str().filter(|c| !c.is_empty()) {
        return Err(forbidden(
            "",
            "pods",
            name,
            format!("pod rejected: RuntimeClass {class:?} not found"),
        ));
    }
    if spec["overhead"].as_object().is_some_and(|o| !o.is_empty()) {
        return Err(forbidden(
            "",
            "pods",
            name,
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                .into(),
        ));
    }
    Ok(())
}
