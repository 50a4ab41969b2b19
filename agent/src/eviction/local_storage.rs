//! Local ephemeral storage limits, enforced by eviction as the kubelet's
//! `localStorageEviction` does whatever the node's pressure: a disk-backed
//! emptyDir over its `sizeLimit`, a pod over the sum of its containers'
//! `ephemeral-storage` limits, a container over its own limit.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use super::usage::{ContainerUsage, EmptyDirUsage};

/// The volumes directory's plugin directory of emptyDirs.
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";

/// Bytes of `quantity`, when it parses.
fn bytes(quantity: &str) -> Option<u64> {
    kube_util::quantity::value(quantity)
        .ok()
        .map(|v| v.max(0) as u64)
}

/// The disk-backed emptyDirs of `pod`: name, size limit as written (if
/// any), and the bytes used under `volumes_dir` (blocking: walks them).
pub fn empty_dir_usage(volumes_dir: &Path, pod: &Pod) -> Vec<EmptyDirUsage> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if e.medium.as_deref() == Some("Memory") {
                // tmpfs: memory, sized by its limit already.
                return None;
            }
            Some(EmptyDirUsage {
                name: v.name.clone(),
                limit: e.size_limit.as_ref().map(|q| q.0.clone()),
                used: disk_usage(&volumes_dir.join(EMPTY_DIR).join(&v.name)),
            })
        })
        .collect()
}

/// Whether `pod` has a limit this module enforces: an `ephemeral-storage`
/// limit on a container, or a disk-backed emptyDir with a `sizeLimit`.
pub fn has_limits(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let containers = spec.containers.iter().any(|c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key("ephemeral-storage"))
    });
    let volumes = spec.volumes.iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.size_limit.is_some() && e.medium.as_deref() != Some("Memory"))
    });
    containers || volumes
}

/// Bytes allocated under `path`, as `du` counts them (symbolic links not
/// followed, other file systems not entered).
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(root) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = 0;
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            total += meta.blocks() * 512;
            if meta.is_dir() && meta.dev() == root.dev() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// Why `pod` must be evicted for its storage, in upstream's words; None
/// when it is within every limit. `empty_dirs` from [`empty_dir_usage`].
pub fn violation(
    pod: &Pod,
    containers: &[ContainerUsage],
    empty_dirs: &[EmptyDirUsage],
) -> Option<String> {
    for d in empty_dirs {
        let Some(limit) = &d.limit else { continue };
        if bytes(limit).is_some_and(|l| d.used > l) {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {limit:?}. ",
                d.name
            ));
        }
    }
    let specs = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let limit_of = |name: &str| {
        specs
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("ephemeral-storage"))
            .map(|q| q.0.clone())
    };
    let limits: Vec<u64> = specs
        .iter()
        .filter_map(|c| limit_of(&c.name))
        .filter_map(|l| bytes(&l))
        .collect();
    if !limits.is_empty() {
        let limit: u64 = limits.iter().sum();
        let used: u64 = containers.iter().map(|c| c.storage).sum::<u64>()
            + empty_dirs.iter().map(|d| d.used).sum::<u64>();
        if used > limit {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                kube_util::quantity::binary_si(limit)
            ));
        }
    }
    for c in containers {
        let Some(limit) = limit_of(&c.name) else {
            continue;
        };
        if bytes(&limit).is_some_and(|l| c.storage > l) {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {limit:?}. ",
                c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(limits: &[(&str, &str)]) -> Pod {
        let containers: Vec<serde_json::Value> = limits
            .iter()
            .map(|(name, limit)| {
                serde_json::json!({"name": name, "resources": {"limits": {"ephemeral-storage": limit}}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"spec": {"containers": containers}})).unwrap()
    }

    fn usage(name: &str, storage: u64) -> ContainerUsage {
        ContainerUsage {
            name: name.into(),
            memory: 0,
            storage,
        }
    }

    #[test]
    fn empty_dir_over_its_size_limit() {
        let p = pod(&[]);
        let dir = |used| EmptyDirUsage {
            name: "scratch".into(),
            limit: Some("1Mi".into()),
            used,
        };
        let dirs = vec![dir(2 << 20)];
        assert_eq!(
            violation(&p, &[], &dirs).unwrap(),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
        );
        let within = vec![dir(1 << 20)];
        assert_eq!(violation(&p, &[], &within), None);
    }

    #[test]
    fn pod_over_the_sum_of_limits_then_a_container_over_its_own() {
        let p = pod(&[("a", "1Mi"), ("b", "1Mi")]);
        let sum = violation(&p, &[usage("a", 1 << 20), usage("b", 1 << 20)], &[]);
        assert_eq!(sum, None);
        // Within the pod's total, over its own.
        let over = violation(&p, &[usage("a", 0), usage("b", (1 << 20) + 1)], &[]);
        assert_eq!(
            over.unwrap(),
            "Container b exceeded its local ephemeral storage limit \"1Mi\". "
        );
        let dirs = vec![EmptyDirUsage {
            name: "d".into(),
            limit: None,
            used: 1 << 20,
        }];
        let total = violation(&p, &[usage("a", 1 << 20), usage("b", 1)], &dirs);
        assert_eq!(
            total.unwrap(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
        );
    }

    #[test]
    fn disk_usage_counts_allocated_blocks() {
        let dir = std::env::temp_dir().join(format!("skiff-du-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), vec![1u8; 64 * 1024]).unwrap();
        let used = disk_usage(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(used >= 64 * 1024, "{used}");
        assert_eq!(disk_usage(Path::new("/nonexistent/skiff")), 0);
    }
}
