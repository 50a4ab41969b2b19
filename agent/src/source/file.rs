//! The static pod directory (`--static-pod-path`): one Pod per file, YAML or
//! JSON, watched with inotify and rescanned every 20 s as a safety net (the
//! kubelet's file source does the same rescans).
//!
//! Static pods get the kubelet's treatment: the node name appended to their
//! name, a uid derived from the file's content, node and path (so an agent
//! restart finds the same uid and adopts the running containers), and
//! `spec.nodeName` set to this node. A changed file is a new pod.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{
    defaults, validate, PodUpdate, SourceError, CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION,
};

const RESCAN_PERIOD: Duration = Duration::from_secs(20);
/// Editors and `cp` write in several steps: wait for the burst to settle.
const DEBOUNCE: Duration = Duration::from_millis(5);

/// What one file parsed to, cached by (mtime, size).
#[derive(Clone)]
struct Parsed {
    stamp: (SystemTime, u64),
    result: Result<Pod, ManifestError>,
}

/// Watches one directory and sends a full snapshot whenever it changes.
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    cache: HashMap<PathBuf, Parsed>,
    last_sent: Option<(Vec<String>, Vec<SourceError>)>,
}

impl FileSource {
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        FileSource {
            dir: dir.into(),
            node_name: node_name.into(),
            cache: HashMap::new(),
            last_sent: None,
        }
    }

    /// Read the directory once: the pods and the files that failed.
    pub fn scan(&mut self) -> PodUpdate {
        let mut pods = Vec::new();
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return PodUpdate {
                    source: "file",
                    pods,
                    errors,
                };
            }
            Err(e) => {
                errors.push(SourceError {
                    origin: self.dir.display().to_string(),
                    message: format!("cannot read static pod directory: {e}"),
                });
                return PodUpdate {
                    source: "file",
                    pods,
                    errors,
                };
            }
        };
        let mut seen = BTreeMap::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            // Like the kubelet: hidden files (editor swap files, our own
            // temporaries) are not manifests.
            if name.starts_with('.') {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let stamp = (
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
            );
            let parsed = match self.cache.get(&path) {
                Some(p) if p.stamp == stamp => p.clone(),
                _ => {
                    let p = Parsed {
                        stamp,
                        result: load_static_pod(&path, &self.node_name),
                    };
                    self.cache.insert(path.clone(), p.clone());
                    p
                }
            };
            seen.insert(path, parsed.result);
        }
        self.cache.retain(|p, _| seen.contains_key(p));
        let mut names: HashMap<(String, String), PathBuf> = HashMap::new();
        for (path, result) in seen {
            match result {
                Ok(pod) => {
                    let key = (
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    if let Some(first) = names.get(&key) {
                        errors.push(SourceError {
                            origin: path.display().to_string(),
                            message: format!(
                                "pod {}/{} is already defined in {}; rename one of them",
                                key.0,
                                key.1,
                                first.display()
                            ),
                        });
                        continue;
                    }
                    names.insert(key, path);
                    pods.push(pod);
                }
                Err(e) => errors.push(SourceError {
                    origin: path.display().to_string(),
                    message: e.to_string(),
                }),
            }
        }
        PodUpdate {
            source: "file",
            pods,
            errors,
        }
    }

    /// Scan and send when something changed; first snapshot always sent.
    async fn scan_and_send(&mut self, tx: &mpsc::Sender<PodUpdate>) -> bool {
        let update = self.scan();
        let mut uids: Vec<String> = update
            .pods
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        uids.sort();
        let key = (uids, update.errors.clone());
        if self.last_sent.as_ref() == Some(&key) {
            return true;
        }
        for e in &update.errors {
            let known = self
                .last_sent
                .as_ref()
                .is_some_and(|(_, errs)| errs.contains(e));
            if !known {
                tracing::warn!(file = %e.origin, "skipping static pod manifest: {}", e.message);
            }
        }
        self.last_sent = Some(key);
        tx.send(update).await.is_ok()
    }

    /// Send snapshots until `tx` closes.
    pub async fn run(mut self, tx: mpsc::Sender<PodUpdate>) {
        let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // inotify reports opens and reads too, and the scan itself opens
            // the directory: reacting to those would rescan forever.
            let access = matches!(&res, Ok(e) if e.kind.is_access());
            if !access {
                let _ = ev_tx.send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "cannot watch static pod directory, rescanning every 20s: {e}");
                None
            }
        };
        let mut watching = false;
        loop {
            if !watching {
                if let Some(w) = watcher.as_mut() {
                    watching = w.watch(&self.dir, RecursiveMode::NonRecursive).is_ok();
                }
            }
            if !self.scan_and_send(&tx).await {
                return;
            }
            let period = if watching {
                RESCAN_PERIOD
            } else {
                Duration::from_secs(1)
            };
            tokio::select! {
                ev = ev_rx.recv() => {
                    if ev.is_none() { watching = false; }
                    tokio::time::sleep(DEBOUNCE).await;
                    while ev_rx.try_recv().is_ok() {}
                }
                _ = tokio::time::sleep(period) => {}
                _ = tx.closed() => return,
            }
        }
    }
}

/// Why a manifest file is not a static pod; cached with the file's stamp
/// and reported until the file changes, hence `Clone`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read: {0}")]
    Read(Arc<std::io::Error>),
    #[error("not UTF-8 text")]
    NotUtf8,
    #[error("invalid {format}: {message}")]
    Syntax {
        format: &'static str,
        message: String,
    },
    #[error(
        "expected apiVersion: v1 and kind: Pod, found apiVersion: {api_version:?}, kind: {kind:?}"
    )]
    NotAPod { api_version: String, kind: String },
    /// A field does not decode into a Pod.
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    /// The Pod decodes but breaks validation rules.
    #[error("invalid pod: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Parse, validate and default one manifest file.
///
/// # Errors
/// The file cannot be read, is not a Pod, or is not a valid one.
pub fn load_static_pod(path: &Path, node_name: &str) -> Result<Pod, ManifestError> {
    let bytes = std::fs::read(path).map_err(|e| ManifestError::Read(Arc::new(e)))?;
    let mut pod = parse_pod(&bytes)?;
    let errs = validate::validate_pod(&pod);
    if !errs.is_empty() {
        return Err(ManifestError::Invalid(
            errs.iter().map(|e| e.to_string()).collect(),
        ));
    }
    defaults::apply_pod_defaults(&mut pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let mut h = Sha256::new();
        h.update(&bytes);
        h.update(format!("host:{node_name}file:{}", path.display()));
        pod.metadata.uid = Some(hex::encode(&h.finalize()[..16]));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ann = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    ann.insert(CONFIG_SOURCE_ANNOTATION.into(), "file".into());
    ann.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_string());
    }
    Ok(pod)
}

/// YAML is a superset of JSON, but serde_json gives better messages for JSON.
fn parse_pod(bytes: &[u8]) -> Result<Pod, ManifestError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ManifestError::NotUtf8)?;
    let syntax = |format: &'static str, message: String| ManifestError::Syntax { format, message };
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| syntax("JSON", e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| syntax("YAML", e.to_string()))?
    };
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    let api = value
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or("");
    if kind != "Pod" || api != "v1" {
        return Err(ManifestError::NotAPod {
            api_version: api.to_string(),
            kind: kind.to_string(),
        });
    }
    serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n";

    #[test]
    fn static_pod_gets_node_suffix_stable_uid_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), POD).unwrap();
        let mut src = FileSource::new(dir.path(), "Node1");
        let a = src.scan();
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        let pod = &a.pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        let uid = pod.metadata.uid.clone().unwrap();
        // A fresh source (an agent restart) derives the same uid.
        let b = FileSource::new(dir.path(), "Node1").scan();
        assert_eq!(b.pods[0].metadata.uid.as_deref(), Some(uid.as_str()));
    }

    #[test]
    fn bad_manifests_are_reported_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good.yaml"), POD).unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: c, image: i, ports: [{containerPort: abc}]}]\n").unwrap();
        std::fs::write(dir.path().join("notyaml.json"), "{ nope").unwrap();
        std::fs::write(
            dir.path().join("svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "garbage: [").unwrap();
        let u = FileSource::new(dir.path(), "n").scan();
        assert_eq!(u.pods.len(), 1);
        assert_eq!(u.errors.len(), 3, "{:?}", u.errors);
        let bad = u
            .errors
            .iter()
            .find(|e| e.origin.ends_with("bad.yaml"))
            .unwrap();
        assert!(
            bad.message
                .contains("spec.containers[0].ports[0].containerPort"),
            "{}",
            bad.message
        );
        let svc = u
            .errors
            .iter()
            .find(|e| e.origin.ends_with("svc.yaml"))
            .unwrap();
        assert!(svc.message.contains("kind: \"Service\""), "{}", svc.message);
        let e = load_static_pod(&dir.path().join("svc.yaml"), "n").unwrap_err();
        assert!(matches!(e, ManifestError::NotAPod { .. }), "{e:?}");
        let e = load_static_pod(&dir.path().join("notyaml.json"), "n").unwrap_err();
        assert!(
            matches!(e, ManifestError::Syntax { format: "JSON", .. }),
            "{e:?}"
        );
    }
}
