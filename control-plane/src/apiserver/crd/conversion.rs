//! Conversion webhooks (`spec.conversion.strategy: Webhook`), after
//! upstream's `webhookConverter`: objects at one version of a kind are
//! brought to another by posting a ConversionReview to the definition's
//! webhook. Objects already at the wanted version are not sent, a list
//! goes in one review, and an answer may change no metadata but labels
//! and annotations (the rest is restored from the original).

use std::time::Duration;

use serde_json::{json, Value};

use crate::apiserver::validation;
use crate::apiserver::webhook::call::Client;
use crate::apiserver::webhook::hook::{ca_bundle, Target};
use crate::apiserver::webhook::post_to;
use crate::apiserver::{objects, ApiServer};

/// Upstream's conversion calls have no configurable timeout; its REST
/// client gives up after 30 s.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The ConversionReview versions this server speaks, preferred first.
const REVIEW_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// One definition's conversion webhook, ready to call.
pub struct Webhook {
    /// `spec.conversion.webhook` as written: what tells two apart.
    spec: Value,
    target: Target,
    client: Client,
    /// The ConversionReview version spoken: the first of the webhook's
    /// `conversionReviewVersions` this server knows.
    review_version: &'static str,
}

impl PartialEq for Webhook {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook").field("spec", &self.spec).finish()
    }
}

impl Webhook {
    /// The webhook of a definition's `spec`; None when its strategy is not
    /// Webhook (or the configuration is one validation refuses).
    pub fn of_definition(spec: &Value) -> Option<Webhook> {
        if spec["conversion"]["strategy"] != "Webhook" {
            return None;
        }
        let wh = &spec["conversion"]["webhook"];
        let cc = &wh["clientConfig"];
        let review_version = wh["conversionReviewVersions"]
            .as_array()?
            .iter()
            .find_map(|v| REVIEW_VERSIONS.into_iter().find(|k| v == k))?;
        Some(Webhook {
            spec: wh.clone(),
            target: Target::from_client_config(cc)?,
            client: Client::new(&ca_bundle(cc)),
            review_version,
        })
    }

    /// `objs` at `to` (`GROUP/VERSION`), in order: those at another
    /// version converted by the webhook, all in one review.
    ///
    /// # Errors
    /// Upstream's messages, naming the first converted object's
    /// `GROUP/VERSION, Kind=KIND`: `conversion webhook for ... failed:
    /// ...` (the call, the review), `... returned N objects, expected M`,
    /// `... returned invalid converted object at index I: ...`.
    pub async fn convert(
        &self,
        api: &ApiServer,
        mut objs: Vec<Value>,
        to: &str,
    ) -> Result<Vec<Value>, String> {
        let pending: Vec<usize> = (0..objs.len())
            .filter(|&i| objs[i]["apiVersion"].as_str() != Some(to))
            .collect();
        let Some(&first) = pending.first() else {
            return Ok(objs);
        };
        let gvk = format!(
            "{}, Kind={}",
            objs[first]["apiVersion"].as_str().unwrap_or_default(),
            objs[first]["kind"].as_str().unwrap_or_default()
        );
        let failed = |e: String| format!("conversion webhook for {gvk} failed: {e}");
        let uid = objects::new_uid();
        let sent: Vec<&Value> = pending.iter().map(|&i| &objs[i]).collect();
        let review = json!({
            "apiVersion": format!("apiextensions.k8s.io/{}", self.review_version),
            "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": to, "objects": sent},
        });
        let body = serde_json::to_vec(&review).map_err(|e| failed(e.to_string()))?;
        let post = post_to(api, &self.target, body, TIMEOUT)
            .await
            .map_err(failed)?;
        let answer = self.client.post(api, post).await.map_err(failed)?;
        let converted = self.converted(&answer, &uid).map_err(failed)?;
        if converted.len() != pending.len() {
            return Err(format!(
                "conversion webhook for {gvk} returned {} objects, expected {}",
                converted.len(),
                pending.len()
            ));
        }
        for (n, (i, mut out)) in pending.into_iter().zip(converted).enumerate() {
            same_object(&objs[i], &out, to).map_err(|e| {
                format!("conversion webhook for {gvk} returned invalid converted object at index {n}: {e}")
            })?;
            restore_metadata(&objs[i], &mut out).map_err(|e| {
                format!("conversion webhook for {gvk} returned invalid metadata in object at index {n}: {e}")
            })?;
            objs[i] = out;
        }
        Ok(objs)
    }

    /// The converted objects of a ConversionReview answer.
    fn converted(&self, body: &[u8], uid: &str) -> Result<Vec<Value>, String> {
        let review: Value = serde_json::from_slice(body)
            .map_err(|e| format!("received invalid webhook response: {e}"))?;
        let expected = format!("apiextensions.k8s.io/{}", self.review_version);
        // v1beta1 answers were never checked for type or uid (upstream).
        if self.review_version == "v1" {
            let (api_version, kind) = (
                review["apiVersion"].as_str().unwrap_or_default(),
                review["kind"].as_str().unwrap_or_default(),
            );
            if api_version != expected || kind != "ConversionReview" {
                return Err(format!(
                    "expected webhook response of {expected}, Kind=ConversionReview, got {api_version}, Kind={kind}"
                ));
            }
        }
        let response = review
            .get("response")
            .filter(|r| r.is_object())
            .ok_or("no response provided")?;
        if self.review_version == "v1" && response["uid"].as_str() != Some(uid) {
            return Err(format!(
                "expected response.uid={uid:?}, got {:?}",
                response["uid"].as_str().unwrap_or_default()
            ));
        }
        let result = &response["result"];
        if result["status"] != "Success" {
            return Err(match result["message"].as_str() {
                Some(m) if !m.is_empty() => m.to_string(),
                _ => format!(
                    "response.result.status was '{}', not 'Success'",
                    result["status"].as_str().unwrap_or_default()
                ),
            });
        }
        Ok(response["convertedObjects"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// A converted object is the same object at `to`: kind, name, namespace
/// and uid unchanged.
fn same_object(original: &Value, converted: &Value, to: &str) -> Result<(), String> {
    let got = converted["apiVersion"].as_str().unwrap_or_default();
    if got != to {
        return Err(format!(
            "invalid groupVersion (expected {to}, received {got})"
        ));
    }
    let str_at = |o: &Value, ptr: &str| {
        o.pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    for (what, ptr) in [
        ("kind", "/kind"),
        ("name", "/metadata/name"),
        ("namespace", "/metadata/namespace"),
        ("UID", "/metadata/uid"),
    ] {
        let (e, a) = (str_at(original, ptr), str_at(converted, ptr));
        if e != a {
            return Err(format!("must have the same {what}: {e} != {a}"));
        }
    }
    Ok(())
}

/// The original's metadata with the converted object's labels and
/// annotations (which must be valid ones).
fn restore_metadata(original: &Value, converted: &mut Value) -> Result<(), String> {
    let answered = match converted.get("metadata") {
        None => return Err("missing metadata in converted object".into()),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(format!(
                "invalid metadata of type {} in converted object",
                super::structural::type_name(other)
            ))
        }
    };
    let mut meta = original["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for field in ["labels", "annotations"] {
        match answered.get(field) {
            None | Some(Value::Null) => {
                meta.remove(field);
            }
            Some(Value::Object(m)) => {
                if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{field}[{k}] must be a string in converted object"
                    ));
                }
                meta.insert(field.into(), Value::Object(m.clone()));
            }
            Some(other) => {
                return Err(format!(
                    "invalid metadata.{field} of type {} in converted object",
                    super::structural::type_name(other)
                ))
            }
        }
    }
    let meta = Value::Object(meta);
    let mut causes = Vec::new();
    validation::label_map(&meta["labels"], "metadata.labels", &mut causes);
    validation::annotations(&meta, &mut causes);
    if let Some(c) = causes.first() {
        return Err(c.line());
    }
    converted["metadata"] = meta;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget(version: &str) -> Value {
        json!({"apiVersion": format!("example.com/{version}"), "kind": "Widget",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"x": "1"}, "finalizers": ["f"]},
            "spec": {}})
    }

    #[test]
    fn metadata_but_labels_and_annotations_comes_from_the_original() {
        let original = widget("v1");
        let mut converted = widget("v2");
        converted["metadata"]["resourceVersion"] = json!("99");
        converted["metadata"]["finalizers"] = json!([]);
        converted["metadata"]["labels"] = json!({"y": "2"});
        converted["metadata"]["annotations"] = json!({"note": "converted"});
        restore_metadata(&original, &mut converted).unwrap();
        let m = &converted["metadata"];
        assert_eq!(m["resourceVersion"], "7");
        assert_eq!(m["finalizers"], json!(["f"]));
        assert_eq!(m["labels"], json!({"y": "2"}));
        assert_eq!(m["annotations"], json!({"note": "converted"}));
    }

    #[test]
    fn converted_objects_are_checked() {
        let original = widget("v1");
        let mut renamed = widget("v2");
        renamed["metadata"]["name"] = json!("b");
        assert_eq!(
            same_object(&original, &renamed, "example.com/v2").unwrap_err(),
            "must have the same name: a != b"
        );
        assert_eq!(
            same_object(&original, &widget("v3"), "example.com/v2").unwrap_err(),
            "invalid groupVersion (expected example.com/v2, received example.com/v3)"
        );
        let mut bad_label = widget("v2");
        bad_label["metadata"]["labels"] = json!({"a b": "x"});
        assert!(restore_metadata(&original, &mut bad_label)
            .unwrap_err()
            .starts_with("metadata.labels: Invalid value: \"a b\""));
        let mut number = widget("v2");
        number["metadata"]["labels"] = json!({"a": 1});
        assert!(restore_metadata(&original, &mut number).is_err());
    }

    #[test]
    fn review_versions_and_answers() {
        let spec = |versions: Value| {
            json!({"conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": "https://127.0.0.1:1/convert"},
                "conversionReviewVersions": versions}}})
        };
        assert!(Webhook::of_definition(&spec(json!(["v2"]))).is_none());
        let beta = Webhook::of_definition(&spec(json!(["v9", "v1beta1", "v1"]))).unwrap();
        assert_eq!(beta.review_version, "v1beta1");
        let hook = Webhook::of_definition(&spec(json!(["v1"]))).unwrap();
        let answer = |r: Value| {
            serde_json::to_vec(&json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "ConversionReview", "response": r}))
            .unwrap()
        };
        assert_eq!(
            hook.converted(
                &answer(json!({"uid": "other", "result": {"status": "Success"}})),
                "u"
            )
            .unwrap_err(),
            "expected response.uid=\"u\", got \"other\""
        );
        assert_eq!(
            hook.converted(
                &answer(json!({"uid": "u", "result": {"status": "Failure", "message": "no way"}})),
                "u"
            )
            .unwrap_err(),
            "no way"
        );
        let ok = hook
            .converted(
                &answer(json!({"uid": "u", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]})),
                "u",
            )
            .unwrap();
        assert_eq!(ok, vec![json!({"a": 1})]);
    }
}
