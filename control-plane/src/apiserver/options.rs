//! Request options from the query string, validated as upstream's
//! `ValidateCreateOptions` / `UpdateOptions` / `PatchOptions` /
//! `ListOptions`: a value the server does not know is refused, never
//! ignored.

use super::patch::PatchType;
use super::request::Query;
use super::status::{ApiError, ApiResult, Cause};
use super::validation;

/// What `fieldValidation` asks for unknown and duplicate fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them, with a warning each (the default).
    Warn,
    /// Refuse the request.
    Strict,
}

/// Which write the options are of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Create,
    Update,
    Patch(PatchType),
}

impl Write {
    fn kind(self) -> &'static str {
        match self {
            Write::Create => "CreateOptions",
            Write::Update => "UpdateOptions",
            Write::Patch(_) => "PatchOptions",
        }
    }
}

/// The options of a write, validated.
///
/// # Errors
/// 422 naming each bad option, as upstream's options validation.
pub fn write(query: &Query, write: Write) -> ApiResult<FieldValidation> {
    let mut c = Vec::new();
    let manager = query.get("fieldManager").unwrap_or_default();
    validation::field_manager("fieldManager", manager, &mut c);
    match write {
        Write::Patch(PatchType::Apply) if manager.is_empty() => {
            c.push(Cause::required_because(
                "fieldManager",
                "is required for apply patch",
            ));
        }
        Write::Patch(PatchType::Apply) => {}
        _ if query.0.contains_key("force") => {
            c.push(Cause::forbidden(
                "force",
                "may not be specified for non-apply patch",
            ));
        }
        _ => {}
    }
    dry_run(query, &mut c);
    let fv = match query.get("fieldValidation") {
        None | Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        Some(other) => {
            c.push(Cause::not_supported(
                "fieldValidation",
                other,
                &["", "Ignore", "Strict", "Warn"],
            ));
            FieldValidation::Warn
        }
    };
    if c.is_empty() {
        Ok(fv)
    } else {
        Err(invalid(write.kind(), c))
    }
}

/// `dryRun` may only be `All`.
fn dry_run(query: &Query, c: &mut Vec<Cause>) {
    if let Some(d) = query
        .0
        .get("dryRun")
        .filter(|d| !d.is_empty() && *d != "All")
    {
        c.push(Cause::not_supported("dryRun", d, &["All"]));
    }
}

/// `dryRun` of a delete, validated.
///
/// # Errors
/// 422 for a value other than `All`.
pub fn delete(query: &Query) -> ApiResult<()> {
    let mut c = Vec::new();
    dry_run(query, &mut c);
    if c.is_empty() {
        Ok(())
    } else {
        Err(invalid("DeleteOptions", c))
    }
}

/// The `resourceVersion` of a list or watch: a revision (an unsigned
/// integer), or None when unset.
///
/// # Errors
/// 400 for anything else (upstream's `ParseResourceVersion`), which would
/// otherwise replay history from a negative revision or be ignored.
pub fn resource_version(query: &Query) -> ApiResult<Option<i64>> {
    let Some(rv) = query.get("resourceVersion") else {
        return Ok(None);
    };
    let revision = rv
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| rv.parse::<i64>().ok())
        .flatten();
    revision.map(Some).ok_or_else(|| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {rv:?}: must be a non-negative integer"
        ))
    })
}

/// `resourceVersionMatch` of a list: whether it asks for the list exactly
/// at `resourceVersion`.
///
/// # Errors
/// 422 as upstream's `ValidateListOptions`.
pub fn exact_match(query: &Query, rv: Option<i64>) -> ApiResult<bool> {
    let cause = match (query.get("resourceVersionMatch"), rv) {
        (None, _) => return Ok(false),
        (Some(_), None) => Cause::forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (Some("Exact"), Some(0)) => Cause::forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
        (Some("Exact"), Some(_)) => return Ok(true),
        (Some("NotOlderThan"), Some(_)) => return Ok(false),
        (Some(other), Some(_)) => Cause::not_supported(
            "resourceVersionMatch",
            other,
            &["Exact", "NotOlderThan", ""],
        ),
    };
    Err(invalid("ListOptions", vec![cause]))
}

/// `KIND.meta.k8s.io "" is invalid: ...`.
fn invalid(kind: &str, causes: Vec<Cause>) -> ApiError {
    ApiError::invalid(kind, "meta.k8s.io", "", causes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Query {
        Query::parse(Some(s))
    }

    #[test]
    fn options_are_refused_not_ignored() {
        assert_eq!(write(&q(""), Write::Create).unwrap(), FieldValidation::Warn);
        assert_eq!(
            write(&q("fieldValidation=Strict"), Write::Update).unwrap(),
            FieldValidation::Strict
        );
        let e = write(&q("fieldValidation=Bogus"), Write::Create).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.starts_with("CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Bogus\""), "{}", e.message);
        let e = write(&q(""), Write::Patch(PatchType::Apply)).unwrap_err();
        assert!(
            e.message
                .contains("fieldManager: Required value: is required for apply patch"),
            "{}",
            e.message
        );
        assert!(write(&q("fieldManager=kubectl"), Write::Patch(PatchType::Apply)).is_ok());
        assert!(write(&q("force=true"), Write::Patch(PatchType::Merge)).is_err());
        assert!(write(&q("dryRun=Everything"), Write::Create).is_err());
        assert!(delete(&q("dryRun=All")).is_ok());
        assert!(delete(&q("dryRun=x")).is_err());
    }

    #[test]
    fn resource_versions_are_revisions() {
        assert_eq!(resource_version(&q("")).unwrap(), None);
        assert_eq!(
            resource_version(&q("resourceVersion=12")).unwrap(),
            Some(12)
        );
        assert_eq!(
            resource_version(&q("resourceVersion=-5")).unwrap_err().code,
            400
        );
        assert_eq!(
            resource_version(&q("resourceVersion=abc"))
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            resource_version(&q("resourceVersion=+5")).unwrap_err().code,
            400
        );
        assert_eq!(
            resource_version(&q("resourceVersion=18446744073709551615"))
                .unwrap_err()
                .code,
            400
        );
        assert!(!exact_match(&q(""), None).unwrap());
        assert!(exact_match(&q("resourceVersionMatch=Exact"), Some(7)).unwrap());
        assert_eq!(
            exact_match(&q("resourceVersionMatch=Exact"), None)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            exact_match(&q("resourceVersionMatch=Exact"), Some(0))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            exact_match(&q("resourceVersionMatch=Soon"), Some(3))
                .unwrap_err()
                .code,
            422
        );
    }
}
