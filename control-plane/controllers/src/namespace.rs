//! Namespace controller: empties a namespace being deleted, then lets it
//! go.
//!
//! The API server marks a deleted namespace (deletionTimestamp, phase
//! Terminating) and keeps it while `spec.finalizers` holds `kubernetes`;
//! it refuses new content in it. This controller deletes every namespaced
//! object in it (all served resources, found by discovery), reports
//! progress in the namespace's conditions, waits until nothing is left
//! (pods finish their graceful deletion on their nodes, finalizers run),
//! and then removes `kubernetes` through `namespaces/NAME/finalize`; the
//! server deletes the namespace when no finalizer is left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::served::{self, Served};
use crate::{Ctx, Error};

/// The finalizer this controller owns.
pub const FINALIZER: &str = "kubernetes";
/// Look again this soon while content remains (pods terminate on their
/// nodes, other finalizers run: nothing here is notified of that).
const RECHECK: Duration = Duration::from_secs(2);
/// After a failure.
const RETRY: Duration = Duration::from_secs(2);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let namespaces = ctx.informers.get::<Namespace>();
    crate::reconciler::run(namespaces, Arc::new(ctx), reconcile, error_policy).await;
    Ok(())
}

fn error_policy(ns: Arc<Namespace>, err: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(namespace = %ns.name_any(), "namespace deletion step failed, retrying: {err}");
    Action::requeue(RETRY)
}

/// What one pass over a terminating namespace found.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// Discovery failed: nothing could be deleted.
    pub discovery: Option<String>,
    /// Deletes or lists that failed, one message each.
    pub failures: Vec<String>,
    /// Objects left, by group-resource (`pods`, `replicasets.apps`).
    pub remaining: BTreeMap<String, usize>,
    /// Finalizers on the objects left, with how many objects carry each.
    pub finalizers: BTreeMap<String, usize>,
}

impl Report {
    /// Nothing left and nothing failed: the namespace may go.
    pub fn empty(&self) -> bool {
        self.discovery.is_none() && self.failures.is_empty() && self.remaining.is_empty()
    }
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ns.name_any();
    let holds = ns
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
    if ns.metadata.deletion_timestamp.is_none() || !holds {
        return Ok(Action::await_change());
    }
    let report = empty_namespace(&ctx.client, &name).await;
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let old = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let new = conditions(&old, &report, jiff::Timestamp::now());
    if new != old {
        let patch = json!({"status": {"conditions": new}});
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    if !report.empty() {
        tracing::debug!(namespace = %name, remaining = ?report.remaining, failures = report.failures.len(), "namespace not empty yet");
        return Ok(Action::requeue(RECHECK));
    }
    finalize(&api, &name).await?;
    tracing::info!(namespace = %name, "namespace emptied, finalizer removed");
    Ok(Action::await_change())
}

/// Delete everything in `ns` and report what is left.
async fn empty_namespace(client: &kube::Client, ns: &str) -> Report {
    let mut report = Report::default();
    let resources = match served::discover(client).await {
        Ok(r) => r,
        Err(e) => {
            report.discovery = Some(format!("discovery failed: {e}"));
            return report;
        }
    };
    for r in resources.iter().filter(|r| r.namespaced()) {
        if let Err(e) = delete_all(client, ns, r).await {
            report
                .failures
                .push(format!("deleting {}: {e}", r.group_resource()));
            continue;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &r.res);
        match api.list_metadata(&ListParams::default()).await {
            Ok(list) if !list.items.is_empty() => {
                *report.remaining.entry(r.group_resource()).or_default() += list.items.len();
                for item in &list.items {
                    for f in item.finalizers() {
                        *report.finalizers.entry(f.clone()).or_default() += 1;
                    }
                }
            }
            Ok(_) => {}
            Err(e) => report
                .failures
                .push(format!("listing {}: {e}", r.group_resource())),
        }
    }
    report
}

/// Delete every object of `r` in `ns`: one deletecollection where served,
/// else one delete per object. Dependents go in the background (the
/// garbage collector's, and this loop's next pass, get them).
async fn delete_all(client: &kube::Client, ns: &str, r: &Served) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &r.res);
    let dp = DeleteParams::background();
    if r.supports(kube::discovery::verbs::DELETE_COLLECTION) {
        return api
            .delete_collection(&dp, &ListParams::default())
            .await
            .map(|_| ());
    }
    for item in api.list_metadata(&ListParams::default()).await?.items {
        if item.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match api.delete(&item.name_any(), &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Remove our finalizer through the finalize subresource.
async fn finalize(api: &Api<Namespace>, name: &str) -> Result<(), Error> {
    // Read fresh: the finalize body replaces spec.finalizers, and another
    // finalizer may have been removed meanwhile.
    let mut ns = match api.get(name).await {
        Ok(ns) => ns,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let spec = ns.spec.get_or_insert_with(Default::default);
    let rest: Vec<String> = spec
        .finalizers
        .iter()
        .flatten()
        .filter(|f| f.as_str() != FINALIZER)
        .cloned()
        .collect();
    spec.finalizers = Some(rest);
    match api
        .replace_subresource("finalize", name, &PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The deletion conditions upstream's namespace controller reports, from
/// `report`; a condition keeps its transition time while its status
/// stays.
pub fn conditions(
    old: &[NamespaceCondition],
    report: &Report,
    now: jiff::Timestamp,
) -> Vec<NamespaceCondition> {
    let list = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, n)| format!("{k} has {n} resource instances"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let fins = report
        .finalizers
        .iter()
        .map(|(k, n)| format!("{k} in {n} resource instances"))
        .collect::<Vec<_>>()
        .join(", ");
    let wanted: [(&str, bool, &str, String); 5] = [
        match &report.discovery {
            Some(e) => (
                "NamespaceDeletionDiscoveryFailure",
                true,
                "DiscoveryFailed",
                e.clone(),
            ),
            None => (
                "NamespaceDeletionDiscoveryFailure",
                false,
                "ResourcesDiscovered",
                "All resources successfully discovered".into(),
            ),
        },
        (
            "NamespaceDeletionGroupVersionParsingFailure",
            false,
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed".into(),
        ),
        if report.failures.is_empty() {
            (
                "NamespaceDeletionContentFailure",
                false,
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization".into(),
            )
        } else {
            (
                "NamespaceDeletionContentFailure",
                true,
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    report.failures.len(),
                    report.failures.join(", ")
                ),
            )
        },
        if report.remaining.is_empty() {
            (
                "NamespaceContentRemaining",
                false,
                "ContentRemoved",
                "All content successfully removed".into(),
            )
        } else {
            (
                "NamespaceContentRemaining",
                true,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", list(&report.remaining)),
            )
        },
        if report.finalizers.is_empty() {
            (
                "NamespaceFinalizersRemaining",
                false,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
            )
        } else {
            (
                "NamespaceFinalizersRemaining",
                true,
                "SomeFinalizersRemain",
                format!("Some content in the namespace has finalizers remaining: {fins}"),
            )
        },
    ];
    let mut out: Vec<NamespaceCondition> = old
        .iter()
        .filter(|c| !wanted.iter().any(|w| w.0 == c.type_))
        .cloned()
        .collect();
    for (ty, on, reason, message) in wanted {
        let status = if on { "True" } else { "False" };
        let prev = old.iter().find(|c| c.type_ == ty);
        let since = match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(Time(now)),
        };
        out.push(NamespaceCondition {
            type_: ty.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: since,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_report_what_remains_and_keep_transition_times() {
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let t1 = jiff::Timestamp::from_second(2_000).unwrap();
        let mut r = Report::default();
        r.remaining.insert("pods".into(), 2);
        r.finalizers.insert("foregroundDeletion".into(), 1);
        let c0 = conditions(&[], &r, t0);
        let remaining = c0
            .iter()
            .find(|c| c.type_ == "NamespaceContentRemaining")
            .unwrap();
        assert_eq!(remaining.status, "True");
        assert_eq!(
            remaining.message.as_deref(),
            Some("Some resources are remaining: pods has 2 resource instances")
        );
        let c1 = conditions(&c0, &Report::default(), t1);
        let at = |cs: &[NamespaceCondition], ty: &str| {
            cs.iter()
                .find(|c| c.type_ == ty)
                .unwrap()
                .last_transition_time
                .clone()
                .unwrap()
                .0
        };
        // Changed status: new time; unchanged: old time.
        assert_eq!(at(&c1, "NamespaceContentRemaining"), t1);
        assert_eq!(at(&c1, "NamespaceDeletionDiscoveryFailure"), t0);
        assert_eq!(conditions(&c1, &Report::default(), t1), c1);
        assert!(Report::default().empty());
        assert!(!r.empty());
    }
}
