//! `pods/ephemeralcontainers`: debugging containers added to a running pod
//! (`kubectl debug`), upstream's `podEphemeralContainersStrategy` and
//! `ValidatePodEphemeralContainersUpdate`.
//!
//! A write through the subresource changes spec.ephemeralContainers only,
//! and may only add containers: the node starts each once and never
//! restarts or changes it. The main resource keeps the stored ones (see
//! [`super::Pod`]'s `prepare_for_update`).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Map, Value};

use crate::apiserver::defaults;
use crate::apiserver::handlers::{self, get_object, write_update_warned, Attempt};
use crate::apiserver::objects;
use crate::apiserver::patch::PatchType;
use crate::apiserver::server_side_apply;
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::validation;
use crate::apiserver::{decode_body, json_response, with_warnings, ApiServer, Req};

const FIELD: &str = "spec.ephemeralContainers";

/// Container fields an ephemeral container may not set: it has no
/// resources of its own, serves nothing and is never probed or restarted.
const FORBIDDEN: &[&str] = &[
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// `GET`, `PUT` and `PATCH` (every patch type) of a pod's ephemeral
/// containers; the answer is the whole Pod, as upstream's.
pub(super) async fn ephemeral_containers(
    api: &Arc<ApiServer>,
    method: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    if *method == Method::GET {
        return handlers::get(api, r).await;
    }
    let mut warnings = Vec::new();
    for _ in 0..8 {
        let (cur, old) = get_object(api, r).await?;
        let wanted = match *method {
            Method::PUT => decode_body(&body, r.content_type())?,
            Method::PATCH => {
                let pt = PatchType::from_content_type(r.content_type())
                    .ok_or_else(|| ApiError::unsupported_media(r.content_type()))?;
                if body.is_empty() {
                    return Err(ApiError::bad_request("the patch body is empty"));
                }
                server_side_apply::patched(r, &old, &body, pt)?
            }
            ref m => {
                return Err(ApiError::method_not_allowed(format!(
                    "{m} is not supported on pods/ephemeralcontainers"
                )))
            }
        };
        if objects::name(&wanted).is_some_and(|n| n != r.name()) {
            return Err(ApiError::bad_request(format!(
                "the name of the object does not match the name on the URL ({})",
                r.name()
            )));
        }
        let precondition = objects::meta_str(&wanted, "resourceVersion")
            .filter(|s| !s.is_empty())
            .map(String::from);
        if precondition
            .as_deref()
            .is_some_and(|rv| rv != cur.mod_revision.to_string())
        {
            return Err(ApiError::stale("", "pods", r.name()));
        }
        let mut new = old.clone();
        new["spec"]["ephemeralContainers"] = wanted["spec"]["ephemeralContainers"].clone();
        if let Some(spec) = new["spec"].as_object_mut() {
            default(spec);
            if spec
                .get("ephemeralContainers")
                .is_some_and(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
            {
                spec.remove("ephemeralContainers");
            }
        }
        server_side_apply::keep_applied_fields(r, &wanted, &mut new);
        let causes = validate_update(&old, &new);
        if !causes.is_empty() {
            return Err(ApiError::invalid("Pod", "", r.name(), causes));
        }
        // Pod validation and Pod Security admission run on the whole pod
        // through the subresource's request.
        let attempt = write_update_warned(
            api,
            r,
            &cur,
            &old,
            new,
            precondition.is_some(),
            &mut warnings,
        );
        if let Attempt::Done(v) = attempt.await? {
            return Ok(with_warnings(json_response(200, &v), &warnings));
        }
    }
    Err(ApiError::stale("", "pods", r.name()))
}

/// Upstream's defaults for an ephemeral container: those of any
/// container but resources, which it may not have.
pub(super) fn default(spec: &mut Map<String, Value>) {
    let Some(cs) = spec
        .get_mut("ephemeralContainers")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in cs.iter_mut().filter_map(Value::as_object_mut) {
        let image = c
            .get("image")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        c.entry("imagePullPolicy")
            .or_insert_with(|| json!(defaults::pull_policy(&image)));
        c.entry("terminationMessagePath")
            .or_insert_with(|| json!("/dev/termination-log"));
        c.entry("terminationMessagePolicy")
            .or_insert_with(|| json!("File"));
    }
}

/// The ephemeral containers of a pod spec at `path` (upstream's
/// `validateEphemeralContainers`): names unique among all the pod's
/// containers, an image, a target that is one of the pod's containers,
/// and none of the fields only regular containers have.
pub(super) fn validate(path: &str, spec: &Value, c: &mut Vec<Cause>) {
    let Some(eph) = spec.get("ephemeralContainers").and_then(Value::as_array) else {
        return;
    };
    let names = |k: &str| -> Vec<&str> {
        spec[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect()
    };
    let targets: Vec<&str> = [names("containers"), names("initContainers")].concat();
    let mut seen = targets.clone();
    for (i, ctr) in eph.iter().enumerate() {
        let p = format!("{path}.ephemeralContainers[{i}]");
        let Some(ctr) = ctr.as_object() else {
            c.push(Cause::invalid(&p, &ctr.to_string(), "must be an object"));
            continue;
        };
        let name = ctr.get("name").and_then(Value::as_str).unwrap_or_default();
        validation::dns_label(&format!("{p}.name"), name, c);
        if !name.is_empty() && seen.contains(&name) {
            c.push(Cause::duplicate(format!("{p}.name"), name));
        }
        seen.push(name);
        let image = ctr.get("image").and_then(Value::as_str).unwrap_or_default();
        if image.trim().is_empty() {
            c.push(Cause::required(format!("{p}.image")));
        }
        for f in FORBIDDEN {
            let set = match ctr.get(*f) {
                None | Some(Value::Null) => false,
                Some(Value::Object(m)) => !m.is_empty(),
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::String(s)) => !s.is_empty(),
                Some(_) => true,
            };
            if set {
                c.push(Cause::forbidden(
                    format!("{p}.{f}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        if let Some(t) = ctr
            .get("targetContainerName")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            if !targets.contains(&t) {
                c.push(Cause {
                    reason: "FieldValueNotFound",
                    field: format!("{p}.targetContainerName"),
                    message: format!("Not found: {t:?}"),
                });
            }
        }
    }
}

/// A write through the subresource: the new ephemeral containers are
/// valid, and the existing ones are all still there, unchanged.
pub(super) fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    validate("spec", &new["spec"], &mut c);
    let list = |v: &Value| {
        v["spec"]["ephemeralContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let now = list(new);
    for o in list(old) {
        let name = o["name"].as_str().unwrap_or_default();
        match now.iter().find(|n| n["name"] == o["name"]) {
            None => c.push(Cause::forbidden(
                FIELD,
                &format!("existing ephemeral containers {name:?} may not be removed"),
            )),
            Some(n) if *n != o => c.push(Cause::forbidden(
                FIELD,
                &format!("existing ephemeral containers {name:?} may not be changed"),
            )),
            Some(_) => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(eph: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "ephemeralContainers": eph}})
    }

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter()
            .map(|c| format!("{} {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn adding_a_debugger_is_allowed() {
        let old = pod(json!([]));
        let new =
            pod(json!([{"name": "debugger", "image": "busybox", "targetContainerName": "app"}]));
        assert_eq!(fields(&validate_update(&old, &new)), Vec::<String>::new());
    }

    #[test]
    fn existing_ones_may_not_change_or_go() {
        let old =
            pod(json!([{"name": "d1", "image": "busybox"}, {"name": "d2", "image": "busybox"}]));
        let new = pod(json!([{"name": "d1", "image": "alpine"}]));
        let got = fields(&validate_update(&old, &new));
        assert_eq!(
            got,
            vec![
                "spec.ephemeralContainers Forbidden: existing ephemeral containers \"d1\" may not be changed",
                "spec.ephemeralContainers Forbidden: existing ephemeral containers \"d2\" may not be removed",
            ]
        );
    }

    #[test]
    fn names_are_unique_across_all_containers() {
        let new = pod(
            json!([{"name": "app", "image": "busybox"}, {"name": "d", "image": "b"}, {"name": "d", "image": "b"}]),
        );
        let got = fields(&validate_update(&pod(json!([])), &new));
        assert_eq!(
            got,
            vec![
                "spec.ephemeralContainers[0].name Duplicate value: \"app\"",
                "spec.ephemeralContainers[2].name Duplicate value: \"d\"",
            ]
        );
    }

    #[test]
    fn container_only_fields_are_forbidden() {
        let new = pod(json!([{"name": "d", "image": "busybox",
            "ports": [{"containerPort": 80}], "readinessProbe": {"exec": {"command": ["true"]}},
            "resources": {"limits": {"cpu": "1"}}, "lifecycle": {"preStop": {"exec": {"command": ["x"]}}}}]));
        let got = fields(&validate_update(&pod(json!([])), &new));
        let msg = "Forbidden: cannot be set for an Ephemeral Container";
        assert_eq!(
            got,
            vec![
                format!("spec.ephemeralContainers[0].ports {msg}"),
                format!("spec.ephemeralContainers[0].readinessProbe {msg}"),
                format!("spec.ephemeralContainers[0].lifecycle {msg}"),
                format!("spec.ephemeralContainers[0].resources {msg}"),
            ]
        );
        // The empty resources every container is defaulted with are fine.
        let new = pod(json!([{"name": "d", "image": "busybox", "resources": {}}]));
        assert!(validate_update(&pod(json!([])), &new).is_empty());
    }

    #[test]
    fn the_target_must_be_a_container_of_the_pod() {
        let new = pod(json!([{"name": "d", "image": "busybox", "targetContainerName": "nope"}]));
        let got = fields(&validate_update(&pod(json!([])), &new));
        assert_eq!(
            got,
            vec!["spec.ephemeralContainers[0].targetContainerName Not found: \"nope\""]
        );
    }

    #[test]
    fn an_image_is_required_and_defaults_apply() {
        let new = pod(json!([{"name": "d"}]));
        let got = fields(&validate_update(&pod(json!([])), &new));
        assert_eq!(
            got,
            vec!["spec.ephemeralContainers[0].image Required value"]
        );
        let mut p = pod(json!([{"name": "d", "image": "busybox"}]));
        default(p["spec"].as_object_mut().expect("spec"));
        let c = &p["spec"]["ephemeralContainers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert!(c.get("resources").is_none());
    }
}
