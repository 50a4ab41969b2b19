//! The cleanup of this node's local-path volumes: when a PV labelled with
//! this node is being deleted and still carries the
//! `skiff.io/local-path-cleanup` finalizer, remove its directory (reclaim
//! policy Delete) or keep it (Retain), then remove the finalizer so the
//! deletion completes. Only this agent can do it: the data is on its disk.

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::Api;
use kube_util::informer::Informer;
use kube_util::storage;

use super::localpath::{self, Removed};

/// How often volumes whose cleanup failed are tried again.
const RETRY: Duration = Duration::from_secs(10);

/// What to do with a PV's directory before its finalizer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// Not ours to clean (yet): not being deleted, or no finalizer.
    Nothing,
    /// Keep the data (Retain, or not a local-path PV): just remove the
    /// finalizer.
    Keep,
    /// Remove `path` (checked against `root`), then the finalizer.
    Remove { path: PathBuf, root: String },
}

/// What the cleanup of `pv` is.
pub fn cleanup(pv: &PersistentVolume) -> Cleanup {
    let has_finalizer = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == storage::LOCAL_PATH_CLEANUP_FINALIZER);
    if pv.metadata.deletion_timestamp.is_none() || !has_finalizer {
        return Cleanup::Nothing;
    }
    let spec = pv.spec.as_ref();
    let delete = spec
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Delete")
        == "Delete";
    let path = spec.and_then(|s| s.local.as_ref()).map(|l| l.path.clone());
    match path {
        Some(path) if delete && storage::is_local_path(pv) => Cleanup::Remove {
            path: path.into(),
            root: storage::annotation(
                &pv.metadata.annotations,
                storage::LOCAL_PATH_ROOT_ANNOTATION,
            )
            .unwrap_or_default()
            .to_string(),
        },
        _ => Cleanup::Keep,
    }
}

/// Blocking: carry out a cleanup's filesystem part. Returns whether the
/// finalizer may go.
pub fn clean(name: &str, c: &Cleanup) -> bool {
    let Cleanup::Remove { path, root } = c else {
        if *c == Cleanup::Keep {
            tracing::info!(
                volume = name,
                "keeping the data of deleted persistent volume"
            );
        }
        return *c == Cleanup::Keep;
    };
    match localpath::remove(path, root) {
        Ok(Removed::Missing) => {
            tracing::info!(volume = name, path = %path.display(), "local-path directory already gone");
            true
        }
        Ok(what) => {
            tracing::info!(volume = name, path = %path.display(), ?what, "removed local-path volume");
            true
        }
        Err(e) => {
            // Unsafe paths included: the finalizer stays, so an operator
            // decides (the deletion waits, the data is not lost).
            tracing::warn!(volume = name, "cannot clean up local-path volume: {e}");
            false
        }
    }
}

/// Watch this node's local-path PVs until `stop` resolves.
pub async fn run(client: kube::Client, node: String, stop: impl Future<Output = ()>) {
    let api: Api<PersistentVolume> = Api::all(client);
    let selector = format!("{}={node}", storage::LOCAL_PATH_NODE_LABEL);
    let informer = Informer::start(api.clone(), watcher::Config::default().labels(&selector));
    let mut changes = informer.subscribe();
    let mut stop = pin!(stop);
    let mut retry = tokio::time::interval(RETRY);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            c = changes.changed() => if !c { return },
            _ = retry.tick() => {}
        }
        for pv in informer.list() {
            reclaim(&api, pv).await;
        }
    }
}

async fn reclaim(api: &Api<PersistentVolume>, pv: Arc<PersistentVolume>) {
    let c = cleanup(&pv);
    if c == Cleanup::Nothing {
        return;
    }
    let name = pv.metadata.name.clone().unwrap_or_default();
    let n = name.clone();
    let done = tokio::task::spawn_blocking(move || clean(&n, &c))
        .await
        .unwrap_or(false);
    if !done {
        return;
    }
    // With the resourceVersion read: a concurrent change makes this fail
    // (409) and the next round sees the new object.
    let mut pv = (*pv).clone();
    if let Some(f) = pv.metadata.finalizers.as_mut() {
        f.retain(|f| f != storage::LOCAL_PATH_CLEANUP_FINALIZER);
    }
    if let Err(e) = api.replace(&name, &PostParams::default(), &pv).await {
        tracing::warn!(
            volume = name,
            "cannot remove finalizer {}: {e}",
            storage::LOCAL_PATH_CLEANUP_FINALIZER
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(policy: &str, local_path: bool, path: &str, root: &str) -> PersistentVolume {
        let mut annotations = json!({"skiff.io/local-path-root": root});
        if local_path {
            annotations["pv.kubernetes.io/provisioned-by"] = json!("skiff.io/local-path");
        }
        serde_json::from_value(json!({
            "metadata": {"name": "pv1", "deletionTimestamp": "2024-01-01T00:00:00Z",
                "finalizers": ["kubernetes.io/pv-protection", "skiff.io/local-path-cleanup"],
                "annotations": annotations},
            "spec": {"persistentVolumeReclaimPolicy": policy, "local": {"path": path}}
        }))
        .unwrap()
    }

    #[test]
    fn what_is_cleaned() {
        let d = pv("Delete", true, "/r/v", "/r");
        assert_eq!(
            cleanup(&d),
            Cleanup::Remove {
                path: "/r/v".into(),
                root: "/r".into()
            }
        );
        assert_eq!(cleanup(&pv("Retain", true, "/r/v", "/r")), Cleanup::Keep);
        assert_eq!(cleanup(&pv("Delete", false, "/r/v", "/r")), Cleanup::Keep);
        let mut live = d.clone();
        live.metadata.deletion_timestamp = None;
        assert_eq!(cleanup(&live), Cleanup::Nothing);
        let mut done = d;
        done.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
        assert_eq!(cleanup(&done), Cleanup::Nothing);
    }

    #[test]
    fn delete_removes_retain_keeps() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("lp");
        let r = root.to_str().unwrap();
        let dir = root.join("pvc-1_ns_c");
        let p = dir.to_str().unwrap();
        localpath::ensure(&dir, r, None, None).unwrap();
        std::fs::write(dir.join("data"), b"x").unwrap();

        assert!(clean("pv1", &cleanup(&pv("Retain", true, p, r))));
        assert!(dir.join("data").exists());
        assert!(clean("pv1", &cleanup(&pv("Delete", true, p, r))));
        assert!(!dir.exists());
        assert!(root.is_dir());
        // Already gone: fine.
        assert!(clean("pv1", &cleanup(&pv("Delete", true, p, r))));

        // A path outside its root is never removed, and the finalizer stays.
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        assert!(!clean(
            "pv1",
            &cleanup(&pv("Delete", true, outside.to_str().unwrap(), r))
        ));
        assert!(outside.is_dir());
    }
}
