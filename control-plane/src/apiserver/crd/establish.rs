//! The definitions' controllers, in the API server as upstream's
//! apiextensions-apiserver runs them: naming (`NamesAccepted`, accepted
//! names, conflicts within a group), establishing (`Established`, then
//! served through the [`super::Registry`]), stored versions, and the
//! cleanup finalizer (a deleted definition's objects are deleted, then
//! the definition goes).
//!
//! Follows the store like the RBAC cache: list, then watch; every change
//! to any definition looks at all of them (there are few).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::registry::condition_true;
use super::CLEANUP_FINALIZER;
use crate::apiserver::handlers::{delete_one, get_object, write_update, Attempt, DeleteOptions};
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::resources::{self, ResourceDef};
use crate::apiserver::{convert, ApiServer, Req};
use crate::store::{self, Event, KeyValue};

fn crd_def() -> &'static ResourceDef {
    resources::lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .expect("CustomResourceDefinitions are served")
}

/// Set condition `ty` of a definition; the transition time moves only
/// when the status does.
pub fn set_condition(obj: &mut Value, ty: &str, status: &str, reason: &str, message: &str) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let Some(conds) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    let now = objects::now_rfc3339();
    match conds.iter_mut().find(|c| c["type"] == ty) {
        Some(c) => {
            if c["status"] != status {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        None => conds.push(json!({"type": ty, "status": status, "lastTransitionTime": now, "reason": reason, "message": message})),
    }
}

/// The names a definition asks for, in the order upstream checks them.
fn requested(crd: &Value) -> &Value {
    &crd["spec"]["names"]
}

/// Upstream's naming controller: a name already accepted for another
/// definition of the same group is a conflict. None: no conflict.
fn conflict(crd: &Value, others: &[&Value]) -> Option<(&'static str, String)> {
    let group = &crd["spec"]["group"];
    let names = requested(crd);
    let taken: Vec<&Value> = others
        .iter()
        .filter(|o| o["spec"]["group"] == *group)
        .map(|o| &o["status"]["acceptedNames"])
        .collect();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let plural = s(&names["plural"]);
    let singular = s(&names["singular"]);
    let in_use = |n: &str| format!("{n:?} is already in use");
    for t in &taken {
        if s(&t["plural"]) == plural || s(&t["singular"]) == plural {
            return Some(("PluralConflict", in_use(&plural)));
        }
    }
    for t in &taken {
        if !singular.is_empty() && (s(&t["plural"]) == singular || s(&t["singular"]) == singular) {
            return Some(("SingularConflict", in_use(&singular)));
        }
    }
    for short in objects::str_list(&names["shortNames"]) {
        if taken.iter().any(|t| {
            objects::str_list(&t["shortNames"]).contains(&short)
                || s(&t["plural"]) == short
                || s(&t["singular"]) == short
        }) {
            return Some(("ShortNamesConflict", in_use(short)));
        }
    }
    let kind = s(&names["kind"]);
    let list_kind = s(&names["listKind"]);
    for t in &taken {
        if s(&t["kind"]) == kind || s(&t["listKind"]) == kind {
            return Some(("KindConflict", in_use(&kind)));
        }
    }
    for t in &taken {
        if s(&t["kind"]) == list_kind || s(&t["listKind"]) == list_kind {
            return Some(("ListKindConflict", in_use(&list_kind)));
        }
    }
    None
}

/// The status `crd` should have, given the others.
fn desired(crd: &Value, others: &[&Value]) -> Value {
    let mut next = crd.clone();
    match conflict(crd, others) {
        None => {
            next["status"]["acceptedNames"] = requested(crd).clone();
            set_condition(
                &mut next,
                "NamesAccepted",
                "True",
                "NoConflicts",
                "no conflicts found",
            );
            if !objects::has_deletion_timestamp(crd) {
                set_condition(
                    &mut next,
                    "Established",
                    "True",
                    "InitialNamesAccepted",
                    "the initial names have been accepted",
                );
            }
        }
        Some((reason, message)) => {
            set_condition(&mut next, "NamesAccepted", "False", reason, &message);
            if !condition_true(crd, "Established") {
                set_condition(
                    &mut next,
                    "Established",
                    "False",
                    "NotAccepted",
                    "not all names are accepted",
                );
            }
        }
    }
    let storage = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str());
    if let Some(storage) = storage {
        let stored = &mut next["status"]["storedVersions"];
        if !stored.is_array() {
            *stored = json!([]);
        }
        if let Some(a) = stored.as_array_mut() {
            if !a.iter().any(|v| v == storage) {
                a.push(json!(storage));
            }
        }
    }
    next
}

/// Write a definition's new status over `cur` (its stored form, `old`
/// decoded) through the status subresource's pipeline; a lost race is
/// settled by the next watch event.
async fn write_status(api: &ApiServer, cur: &KeyValue, old: &Value, new: Value) {
    let r = Req {
        sub: Some("status".into()),
        ..Req::system(
            crd_def(),
            "update",
            None,
            objects::name(&new).map(String::from),
        )
    };
    match write_update(api, &r, cur, old, new, false).await {
        Ok(_) => {}
        Err(e) if e.code == 404 => {}
        Err(e) => tracing::warn!(crd = r.name(), error = %e.message, "crd: status write failed"),
    }
}

/// Definitions being cleaned up now (one task each).
type Cleaning = Arc<Mutex<HashSet<String>>>;

async fn reconcile(api: &Arc<ApiServer>, cleaning: &Cleaning) -> store::Result<i64> {
    let list = api
        .store
        .list(&crd_def().prefix(None), None, 0, None)
        .await?;
    let mut crds: Vec<(&KeyValue, Value)> = list
        .kvs
        .iter()
        .filter_map(|kv| convert::decode(crd_def(), &kv.value, kv.mod_revision).map(|v| (kv, v)))
        .collect();
    // Names once accepted stay with their definition; among the others
    // the oldest gets a contested name.
    crds.sort_by_cached_key(|(_, v)| {
        (
            !condition_true(v, "NamesAccepted"),
            v["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            objects::name(v).unwrap_or_default().to_string(),
        )
    });
    let mut settled: Vec<Value> = Vec::new();
    for (kv, crd) in &crds {
        let others: Vec<&Value> = settled
            .iter()
            .filter(|o| condition_true(o, "NamesAccepted"))
            .collect();
        let next = desired(crd, &others);
        if next != *crd {
            write_status(api, kv, crd, next.clone()).await;
        }
        settled.push(next);
    }
    api.crds.set(&settled);
    for crd in settled
        .iter()
        .filter(|c| objects::has_deletion_timestamp(c))
    {
        let name = objects::name(crd).unwrap_or_default().to_string();
        if !objects::finalizers(crd)
            .iter()
            .any(|f| f == CLEANUP_FINALIZER)
            || !cleaning.lock().expect("cleaning lock").insert(name.clone())
        {
            continue;
        }
        let (api, cleaning, crd) = (api.clone(), cleaning.clone(), crd.clone());
        tokio::spawn(async move {
            cleanup(&api, &crd).await;
            cleaning.lock().expect("cleaning lock").remove(&name);
        });
    }
    Ok(list.revision)
}

/// How long the cleanup waits between lists: at first, and at most.
const FIRST_PAUSE: Duration = Duration::from_millis(300);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Delete every object of a deleted definition (their own finalizers
/// still hold them), then take the cleanup finalizer off once none is
/// left. Creates are refused meanwhile ([`super::admit_create`]), so
/// nothing new appears behind the last list.
async fn cleanup(api: &Arc<ApiServer>, crd: &Value) {
    let name = objects::name(crd).unwrap_or_default();
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    let prefix = format!("/registry/{group}/{plural}/");
    let def = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .find_map(|v| api.crds.lookup(group, v, plural));
    let mut shutdown = api.shutdown.clone();
    // A create admitted just before the definition was marked may still
    // be on its way to the store: the list must come back empty twice.
    let mut empty = 0;
    let (mut pause, mut last_left) = (FIRST_PAUSE, usize::MAX);
    loop {
        let left = match api.store.list(&prefix, None, 0, None).await {
            Ok(l) => l.kvs,
            Err(e) => {
                tracing::warn!(crd = name, error = %e, "crd cleanup: list failed");
                empty = 0;
                Vec::new()
            }
        };
        if left.is_empty() {
            empty += 1;
            if empty == 2 {
                break;
            }
        } else {
            empty = 0;
        }
        for kv in &left {
            let Some(obj) = objects::decode_stored(&kv.value, kv.mod_revision) else {
                continue;
            };
            if objects::has_deletion_timestamp(&obj) {
                continue;
            }
            let result = match def {
                Some(def) => {
                    let r = Req::system(
                        def,
                        "delete",
                        objects::namespace(&obj).map(String::from),
                        objects::name(&obj).map(String::from),
                    );
                    delete_one(api, &r, &DeleteOptions::default())
                        .await
                        .map(|_| ())
                }
                // Never served: nothing can hold it back.
                None => api
                    .store
                    .delete(&kv.key, Some(kv.mod_revision))
                    .await
                    .map(|_| ())
                    .map_err(|e| crate::apiserver::status::ApiError::internal(e.to_string())),
            };
            match result {
                Err(e) if e.code != 404 => {
                    tracing::warn!(crd = name, key = kv.key, error = %e.message, "crd cleanup: delete failed");
                }
                _ => {}
            }
        }
        // Objects held by their own finalizers may stay a long time: look
        // less often while the same ones are left.
        pause = if left.len() == last_left {
            (pause * 2).min(MAX_PAUSE)
        } else {
            FIRST_PAUSE
        };
        last_left = left.len();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
    }
    finish(api, name).await;
}

/// Take the cleanup finalizer off through the generic update, which
/// removes the definition once no finalizer is left.
async fn finish(api: &ApiServer, name: &str) {
    let r = Req::system(crd_def(), "update", None, Some(name.to_string()));
    for _ in 0..8 {
        let (cur, old) = match get_object(api, &r).await {
            Ok(found) => found,
            Err(e) if e.code == 404 => return,
            Err(e) => {
                tracing::warn!(crd = name, error = %e.message, "crd cleanup: reading the definition failed");
                return;
            }
        };
        let finalizers: Vec<String> = objects::finalizers(&old)
            .into_iter()
            .filter(|f| f != CLEANUP_FINALIZER)
            .collect();
        let mut new = old.clone();
        meta_mut(&mut new).insert("finalizers".into(), json!(finalizers));
        match write_update(api, &r, &cur, &old, new, false).await {
            Ok(Attempt::Done(_)) => return,
            Ok(Attempt::Retry) => continue,
            Err(e) if e.code == 404 => return,
            Err(e) => {
                tracing::warn!(crd = name, error = %e.message, "crd cleanup: finalizer removal failed");
                return;
            }
        }
    }
}

/// Keep the definitions' status and the served kinds current until the
/// server shuts down.
pub async fn run(api: Arc<ApiServer>) {
    let mut shutdown = api.shutdown.clone();
    let cleaning: Cleaning = Arc::default();
    loop {
        let rev = match reconcile(&api, &cleaning).await {
            Ok(rev) => rev,
            Err(e) => {
                tracing::warn!(error = %e, "crd: listing definitions failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = shutdown.changed() => return,
                }
            }
        };
        let mut stream = match api.store.watch(&crd_def().prefix(None), rev).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "crd: watch failed; re-listing");
                continue;
            }
        };
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(Event::Put { .. } | Event::Delete { .. })) => {
                        if let Err(e) = reconcile(&api, &cleaning).await {
                            tracing::warn!(error = %e, "crd: reconcile failed");
                        }
                    }
                    Some(Err(_)) | None => break,
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}
