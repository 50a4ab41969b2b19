//! `pods/eviction`: a delete through the API that respects the pod's
//! PodDisruptionBudget, as `kubectl drain` asks for it (upstream's
//! `pkg/registry/core/pod/storage/eviction.go`).
//!
//! A pod that already stopped, is still Pending or is being deleted has
//! caused its disruption already: it is deleted without asking its
//! budget. Otherwise the one PDB that selects the pod must allow a
//! disruption; the eviction takes it (decrements `disruptionsAllowed` and
//! records the pod in `disruptedPods`, so the disruption controller does
//! not count it healthy until it is gone) before deleting the pod. A
//! refusal is a 429, which `kubectl drain` retries.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{json, Value};

use crate::apiserver::handlers::{delete_one, get_object, DeleteOptions};
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::resources::{lookup, ResourceDef};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::subresources::success;
use crate::apiserver::{decode_body, json_response, ApiServer, Req};
use crate::store::{self, KeyValue};

/// Attempts at a write that lost a race before giving up with 409
/// (upstream's `EvictionsRetry` has 5 steps).
const RETRIES: usize = 5;

/// More entries than this in `disruptedPods` means the controller is not
/// keeping up: refuse rather than grow the map (upstream
/// `MaxDisruptedPodSize`).
const MAX_DISRUPTED_PODS: usize = 2000;

/// The message of every refusal for lack of budget.
const REFUSED: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

/// `pods/eviction` (create).
///
/// # Errors
/// 404 when the pod does not exist; 429 when its budget allows no
/// disruption now (or has not yet seen its latest spec); 500 when more
/// than one budget selects the pod; 409 when a precondition fails.
pub(super) async fn eviction(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let eviction = if body.is_empty() {
        json!({})
    } else {
        decode_body(&body, r.content_type())?
    };
    if let Some(n) = objects::name(&eviction).filter(|n| !n.is_empty()) {
        if n != r.name() {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
    }
    let d = &eviction["deleteOptions"];
    let opts = DeleteOptions {
        grace: d["gracePeriodSeconds"].as_i64(),
        uid: d["preconditions"]["uid"].as_str().map(String::from),
        resource_version: d["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from),
        propagation: d["propagationPolicy"].as_str().map(String::from),
    };
    // A dry run asked for in the Eviction's own DeleteOptions counts as
    // one asked for on the request (upstream `propagateDryRun`).
    let mut main = Req {
        sub: None,
        ..r.clone()
    };
    let dry_in_body = d["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "All"));
    if dry_in_body {
        main.query.0.insert("dryRun".into(), "All".into());
    }
    evict(api, &main, opts).await?;
    Ok(json_response(201, &success("pods", r.name(), 201)))
}

async fn evict(api: &ApiServer, r: &Req, opts: DeleteOptions) -> ApiResult<()> {
    let dry_run = crate::apiserver::handlers::is_dry_run(r);
    // A client's own resourceVersion precondition is final: no retries.
    let client_rv = opts.resource_version.is_some();
    let mut pod = None;
    for _ in 0..RETRIES {
        let (cur, p) = get_object(api, r).await?;
        if !can_ignore_budget(&p) {
            pod = Some((cur, p));
            break;
        }
        let mut o = opts.clone();
        if enforce_resource_version(&p) && !client_rv {
            o.resource_version = Some(cur.mod_revision.to_string());
        }
        match mark_and_delete(api, r, &o, dry_run).await {
            Err(e) if e.code == 409 && !client_rv => continue,
            res => return res,
        }
    }
    let Some((cur, pod)) = pod else {
        return Err(ApiError::stale("", "pods", r.name()));
    };

    let ns = r.ns.as_deref().unwrap_or_default();
    let pdbs = budgets_of(api, ns, &pod).await?;
    let mut pdb = match pdbs.len() {
        0 => return mark_and_delete(api, r, &opts, dry_run).await,
        1 => pdbs.into_iter().next().ok_or_else(|| ApiError::internal("budget vanished"))?,
        _ => {
            return Err(ApiError::new(
                500,
                "",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };

    // A pod that is not Ready does not count as healthy: evicting it
    // takes nothing from the budget, when the budget allows it. The pod
    // must then stay as it was read, or it might have become Ready.
    if !is_ready(&pod) {
        let st = &pdb.1["status"];
        let healthy_budget = st["currentHealthy"].as_i64().unwrap_or(0)
            >= st["desiredHealthy"].as_i64().unwrap_or(0)
            && st["desiredHealthy"].as_i64().unwrap_or(0) > 0;
        let always = pdb.1["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        if healthy_budget || always {
            let mut o = opts.clone();
            if !client_rv {
                o.resource_version = Some(cur.mod_revision.to_string());
            }
            return mark_and_delete(api, r, &o, dry_run).await;
        }
    }

    let def = pdb_resource()?;
    let mut done = false;
    for attempt in 0..RETRIES {
        if attempt > 0 {
            pdb = match api.store.get(&pdb.0.key).await? {
                Some(kv) => {
                    let v = objects::decode_stored(&kv.value, kv.mod_revision)
                        .ok_or_else(|| ApiError::internal("stored budget is not valid JSON"))?;
                    (kv, v)
                }
                // The budget went away meanwhile: nothing protects the pod.
                None => return mark_and_delete(api, r, &opts, dry_run).await,
            };
        }
        let new = take_disruption(&pdb.1, r.name(), &objects::now_rfc3339())?;
        if dry_run {
            done = true;
            break;
        }
        match api
            .store
            .update(
                &pdb.0.key,
                objects::encode_for_store(&new),
                pdb.0.mod_revision,
            )
            .await
        {
            Ok(_) => {
                done = true;
                break;
            }
            Err(store::Error::Conflict { .. }) => continue,
            Err(e) => {
                let name = objects::name(&pdb.1).unwrap_or_default();
                return Err(ApiError::from_store(e, def.group, def.plural, name));
            }
        }
    }
    if !done {
        let name = objects::name(&pdb.1).unwrap_or_default().to_string();
        return Err(ApiError::stale(def.group, def.plural, &name));
    }
    mark_and_delete(api, r, &opts, dry_run).await
}

/// The budget with one more disruption taken for `pod` (upstream
/// `checkAndDecrement`), or the refusal.
fn take_disruption(pdb: &Value, pod: &str, now: &str) -> ApiResult<Value> {
    let name = objects::name(pdb).unwrap_or_default();
    let st = &pdb["status"];
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(0);
    if st["observedGeneration"].as_i64().unwrap_or(0) < generation {
        return Err(too_many_requests(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let allowed = st["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed < 0 {
        return Err(ApiError::forbidden(format!(
            "poddisruptionbudgets.policy {name:?} is forbidden: pdb disruptions allowed is negative"
        )));
    }
    if st["disruptedPods"]
        .as_object()
        .is_some_and(|m| m.len() > MAX_DISRUPTED_PODS)
    {
        return Err(ApiError::forbidden(format!(
            "poddisruptionbudgets.policy {name:?} is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        )));
    }
    if allowed == 0 {
        return Err(too_many_requests(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            st["desiredHealthy"].as_i64().unwrap_or(0),
            st["currentHealthy"].as_i64().unwrap_or(0)
        )));
    }
    let mut new = pdb.clone();
    let status = &mut new["status"];
    status["disruptionsAllowed"] = json!(allowed - 1);
    if !status["disruptedPods"].is_object() {
        status["disruptedPods"] = json!({});
    }
    status["disruptedPods"][pod] = json!(now);
    if allowed == 1 {
        set_condition(status, "False", "InsufficientPods", "", now);
    }
    Ok(new)
}

/// The DisruptionAllowed condition, its transition time kept while its
/// status does not change.
fn set_condition(status: &mut Value, value: &str, reason: &str, msg: &str, now: &str) {
    let generation = status["observedGeneration"].clone();
    let mut conds: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let since = conds
        .iter()
        .find(|c| c["type"] == "DisruptionAllowed" && c["status"] == value)
        .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
        .unwrap_or_else(|| now.to_string());
    conds.retain(|c| c["type"] != "DisruptionAllowed");
    conds.push(json!({
        "type": "DisruptionAllowed", "status": value, "reason": reason, "message": msg,
        "observedGeneration": generation, "lastTransitionTime": since,
    }));
    status["conditions"] = json!(conds);
}

/// A 429 with one DisruptionBudget cause, as upstream's refusals.
fn too_many_requests(cause: String) -> ApiError {
    ApiError {
        details: Some(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]})),
        ..ApiError::new(429, "TooManyRequests", REFUSED)
    }
}

/// A stopped, Pending or deleted pod has no budget to respect (upstream
/// `canIgnorePDB`).
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed" | "Pending")
    ) || objects::has_deletion_timestamp(pod)
}

/// Whether the delete must find the pod as it was read: a pod that is
/// not terminal could become Ready meanwhile (upstream
/// `shouldEnforceResourceVersion`).
fn enforce_resource_version(pod: &Value) -> bool {
    !matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    ) && !objects::has_deletion_timestamp(pod)
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn pdb_resource() -> ApiResult<&'static ResourceDef> {
    lookup("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))
}

/// The budgets of `ns` that select `pod`: a missing selector selects
/// nothing, an empty one everything (policy/v1).
async fn budgets_of(api: &ApiServer, ns: &str, pod: &Value) -> ApiResult<Vec<(KeyValue, Value)>> {
    let prefix = pdb_resource()?.prefix(Some(ns));
    let list = api.store.list(&prefix, None, 0, None).await?;
    let labels: std::collections::BTreeMap<String, String> = pod["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    Ok(list
        .kvs
        .into_iter()
        .filter_map(|kv| {
            let v = objects::decode_stored(&kv.value, kv.mod_revision)?;
            let sel: LabelSelector = serde_json::from_value(v["spec"]["selector"].clone()).ok()?;
            // `matches` refuses what `selector` would not parse: such a
            // budget protects nothing, as upstream skips it.
            kube_util::selector::selector(&sel).ok()?;
            kube_util::selector::matches(&sel, Some(&labels)).then_some((kv, v))
        })
        .collect())
}

/// Mark the pod as a disruption target, then delete it (upstream
/// `addConditionAndDeletePod`). The condition write moves the pod's
/// resourceVersion, so a precondition on it moves along.
async fn mark_and_delete(
    api: &ApiServer,
    r: &Req,
    opts: &DeleteOptions,
    dry_run: bool,
) -> ApiResult<()> {
    let mut opts = opts.clone();
    if !dry_run {
        let (cur, mut pod) = get_object(api, r).await?;
        check_preconditions(r.name(), &cur, &pod, &opts)?;
        mark_target(&mut pod, &objects::now_rfc3339());
        let kv = api
            .store
            .update(&cur.key, objects::encode_for_store(&pod), cur.mod_revision)
            .await
            .map_err(|e| ApiError::from_store(e, "", "pods", r.name()))?;
        if opts.resource_version.is_some() {
            opts.resource_version = Some(kv.mod_revision.to_string());
        }
    }
    delete_one(api, r, &opts).await.map(|_| ())
}

fn check_preconditions(
    name: &str,
    cur: &KeyValue,
    pod: &Value,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    if let Some(uid) = &opts.uid {
        let have = objects::meta_str(pod, "uid").unwrap_or_default();
        if uid != have {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
    }
    if let Some(rv) = &opts.resource_version {
        if *rv != cur.mod_revision.to_string() {
            return Err(ApiError::conflict("", "pods", name, &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", cur.mod_revision)));
        }
    }
    Ok(())
}

/// The DisruptionTarget condition the eviction API sets (upstream
/// `UpdatePodCondition`: the transition time moves only with the status).
fn mark_target(pod: &mut Value, now: &str) {
    let mut conds: Vec<Value> = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let since = conds
        .iter()
        .find(|c| c["type"] == "DisruptionTarget" && c["status"] == "True")
        .map(|c| c["lastTransitionTime"].clone())
        .unwrap_or_else(|| json!(now));
    conds.retain(|c| c["type"] != "DisruptionTarget");
    conds.push(json!({
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": since,
    }));
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    pod["status"]["conditions"] = json!(conds);
    // The stored form carries no resourceVersion.
    meta_mut(pod).remove("resourceVersion");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(allowed: i64, generation: i64, observed: i64) -> Value {
        json!({"metadata": {"name": "b", "generation": generation},
               "status": {"disruptionsAllowed": allowed, "observedGeneration": observed,
                          "desiredHealthy": 2, "currentHealthy": 2}})
    }

    #[test]
    fn taking_a_disruption_records_the_pod() {
        let new = take_disruption(&pdb(1, 1, 1), "p", "T").unwrap();
        assert_eq!(new["status"]["disruptionsAllowed"], 0);
        assert_eq!(new["status"]["disruptedPods"]["p"], "T");
        assert_eq!(new["status"]["conditions"][0]["reason"], "InsufficientPods");
    }

    #[test]
    fn refusals_are_429_with_a_cause() {
        let e = take_disruption(&pdb(0, 1, 1), "p", "T").unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (429, REFUSED));
        let s = e.to_status();
        assert_eq!(s["reason"], "TooManyRequests");
        assert_eq!(
            s["details"]["causes"][0]["message"],
            "The disruption budget b needs 2 healthy pods and has 2 currently"
        );
        let e = take_disruption(&pdb(3, 2, 1), "p", "T").unwrap_err();
        assert_eq!(e.code, 429);
        assert_eq!(
            e.to_status()["details"]["causes"][0]["message"],
            "The disruption budget b is still being processed by the server."
        );
    }

    #[test]
    fn terminal_pending_and_deleted_pods_skip_the_budget() {
        assert!(can_ignore_budget(&json!({"status": {"phase": "Failed"}})));
        assert!(can_ignore_budget(&json!({"status": {"phase": "Pending"}})));
        assert!(can_ignore_budget(
            &json!({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Running"}})
        ));
        assert!(!can_ignore_budget(&json!({"status": {"phase": "Running"}})));
    }
}
