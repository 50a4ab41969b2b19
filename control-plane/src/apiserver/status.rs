//! API errors and their wire form, the `meta.k8s.io/v1` `Status` object.
//!
//! Messages and reasons follow upstream's `k8s.io/apimachinery/pkg/api/errors`
//! word for word where clients parse them (kubectl prints them as they come,
//! kube-rs and client-go switch on `reason` and `code`).

use serde_json::{json, Value};

use crate::store;

/// One field-level validation failure (`details.causes[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// Path like `spec.containers[0].image`.
    pub field: String,
    pub message: String,
}

impl Cause {
    /// `field: message`, as a cause shows in an Invalid status's message.
    pub fn line(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
    pub fn required(field: impl Into<String>) -> Self {
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }
    /// Required, with upstream's reason why (`Required value: verbs must
    /// contain at least one value`).
    pub fn required_because(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message: format!("Required value: {detail}"),
        }
    }
    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value:?}: {detail}"),
        }
    }
    /// Invalid, the value shown as JSON (`Invalid value: 31: ...`, as
    /// upstream prints numbers).
    pub fn invalid_json(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {detail}"),
        }
    }
    pub fn not_supported(field: impl Into<String>, value: &str, allowed: &[&str]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {value:?}: supported values: {}",
                allowed.join(", ")
            ),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Cause {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Cause {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {value:?}"),
        }
    }
    pub fn too_many(field: impl Into<String>, n: usize, max: usize) -> Self {
        Cause {
            reason: "FieldValueTooMany",
            field: field.into(),
            message: format!("Too many: {n}: must have at most {max} items"),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }
}

/// An error answered to the client as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// `pods` or `deployments.apps`: how upstream names a resource in messages.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    json!({ "name": name, "group": group, "kind": plural })
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    pub fn not_found_path(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource (path {path})"),
        )
    }
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} {name:?} not found", qualified(group, plural)),
            )
        }
    }
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", qualified(group, plural)),
            )
        }
    }
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    qualified(group, plural)
                ),
            )
        }
    }
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }
    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct:?})"))
    }
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes.iter().map(|c| c.line()).collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let qkind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field }))
            .collect();
        ApiError {
            details: Some(
                json!({ "name": name, "group": group, "kind": kind, "causes": causes_json }),
            ),
            ..Self::new(
                422,
                "Invalid",
                format!("{qkind} {name:?} is invalid: {joined}"),
            )
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// A store error on object `name` of a resource.
    pub fn from_store(e: store::Error, group: &str, plural: &str, name: &str) -> Self {
        match e {
            store::Error::NotFound { .. } => Self::not_found(group, plural, name),
            store::Error::AlreadyExists { .. } => Self::already_exists(group, plural, name),
            store::Error::Conflict { .. } => Self::stale(group, plural, name),
            store::Error::Compacted {
                requested,
                compacted,
            } => Self::gone(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            store::Error::FutureRevision { .. } => {
                ApiError::new(504, "Timeout", "Too large resource version")
            }
            e @ store::Error::Backend { .. } => Self::internal(e.to_string()),
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let mut d = d.clone();
            omit_empty(&mut d);
            v["details"] = d;
        }
        if let Value::Object(m) = &mut v {
            m.retain(|k, x| !(matches!(k.as_str(), "message" | "reason") && x == ""));
        }
        v
    }
}

/// Go's `omitempty` on StatusDetails and its causes: empty strings, zeros,
/// empty lists and nulls are left out (a NotFound names no `group` of the
/// core group).
fn omit_empty(v: &mut Value) {
    let Value::Object(m) = v else { return };
    for causes in m.values_mut().filter_map(Value::as_array_mut) {
        causes.iter_mut().for_each(omit_empty);
    }
    m.retain(|_, x| match x {
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Null => false,
        _ => true,
    });
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        ApiError::from_store(e, "", "", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_message_matches_upstream() {
        let e = ApiError::invalid(
            "Pod",
            "",
            "p",
            vec![Cause::required("spec.containers[0].image")],
        );
        assert_eq!(
            e.message,
            "Pod \"p\" is invalid: spec.containers[0].image: Required value"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][0]["field"],
            "spec.containers[0].image"
        );
        let e = ApiError::not_found("apps", "deployments", "d");
        assert_eq!(e.message, "deployments.apps \"d\" not found");
    }

    #[test]
    fn empty_details_are_left_out_as_go_omits_them() {
        let s = ApiError::not_found("", "pods", "p").to_status();
        assert_eq!(s["details"], json!({"name": "p", "kind": "pods"}));
        let s = ApiError::invalid("Pod", "", "p", vec![Cause::required("f")]).to_status();
        assert!(s["details"].get("group").is_none(), "{s}");
        assert_eq!(s["details"]["causes"][0]["field"], "f");
        let s = ApiError::new(418, "", "teapot").to_status();
        assert!(s.get("reason").is_none(), "{s}");
    }
}
