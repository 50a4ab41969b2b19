//! What the node reports about itself on the node server: `/stats/summary`
//! (the kubelet's Summary API, `stats/v1alpha1`, as metrics-server and
//! `kubectl top` read it) and `/metrics` (the agent's Prometheus registry).
//!
//! Node figures come from /proc and statvfs of the root directory; pod and
//! container figures from CRI ListContainerStats and ListPodSandboxStats.
//! containerd 1.6 may not implement pod sandbox stats: a pod's CPU and
//! memory are then the sums of its containers'.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cri_proto::v1;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::readonly::ServerState;
use crate::pod::PodExt;
use crate::runtime::sandbox::pod_log_dir;
use crate::shared::Shared;

pub fn routes(state: ServerState) -> Router {
    Router::new()
        .route("/stats/summary", get(summary))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn metrics() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::metrics().render(),
    )
        .into_response()
}

async fn summary(State(s): State<ServerState>) -> Response {
    match collect(&s.shared).await {
        Ok(summary) => Json(summary).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: failed to get stats from the container runtime: {e}"),
        )
            .into_response(),
    }
}

/// `stats/v1alpha1.Summary`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

#[derive(Debug, Default, Serialize)]
pub struct RlimitStats {
    pub time: String,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
}

#[derive(Debug, Default, Serialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// metav1.Time: RFC 3339 in seconds.
fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn ns_time(ns: i64) -> String {
    time(Timestamp::from_nanosecond(ns as i128).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The node's and its pods' figures now: the summary API's, and what the
/// eviction manager decides on.
///
/// # Errors
/// The runtime's container stats could not be listed.
pub async fn collect(shared: &Shared) -> Result<Summary, cri_proto::Error> {
    let cri = &shared.runtime.cri;
    let (containers, sandboxes, node) = tokio::join!(
        cri.list_container_stats(v1::ListContainerStatsRequest::default()),
        cri.list_pod_sandbox_stats(v1::ListPodSandboxStatsRequest::default()),
        node_only(shared),
    );
    let containers = containers?.stats;
    let sandboxes = match sandboxes {
        Ok(r) => r.stats,
        Err(e) => {
            tracing::debug!("no pod sandbox stats from the runtime, summing containers: {e}");
            Vec::new()
        }
    };
    let pods = shared.statuses.list();
    let log_root = shared.config.pod_log_dir.clone();
    // The log directories: blocking file system work.
    let log_sizes = tokio::task::spawn_blocking({
        let pods = pods.clone();
        move || log_sizes(&log_root, &pods)
    })
    .await
    .map_err(|e| cri_proto::Error::InvalidEndpoint {
        endpoint: format!("stats task: {e}"),
    })?;
    let mut node = node;
    node.cpu = node_cpu().await;
    let image_fs = node.runtime.as_ref().and_then(|r| r.image_fs.clone());
    let pods = pods
        .iter()
        .map(|p| pod_stats(p, &containers, &sandboxes, &log_sizes, image_fs.as_ref()))
        .collect();
    Ok(Summary { node, pods })
}

/// The node's own figures (memory, the root and image file systems,
/// PIDs) without CPU or pods: what the eviction manager reads every
/// period, at a fraction of [`collect`]'s cost.
pub async fn node_only(shared: &Shared) -> NodeStats {
    let image_fs = shared
        .runtime
        .cri
        .image_fs_info(v1::ImageFsInfoRequest::default())
        .await
        .ok()
        .and_then(|r| r.image_filesystems.into_iter().next());
    let root = shared.config.root_dir.clone();
    let (mut node, image_fs) = tokio::task::spawn_blocking(move || {
        (node_stats(&root), image_fs.map(|u| image_fs_stats(&u)))
    })
    .await
    .unwrap_or_default();
    node.node_name = shared.config.node_name.clone();
    node.runtime = Some(RuntimeStats { image_fs });
    node
}

/// One pod's stats: its running containers' CRI stats, and the sandbox's
/// (or the containers' sums).
fn pod_stats(
    pod: &Pod,
    containers: &[v1::ContainerStats],
    sandboxes: &[v1::PodSandboxStats],
    logs: &HashMap<(String, String), (u64, u64)>,
    image_fs: Option<&FsStats>,
) -> PodStats {
    let status = pod.status.clone().unwrap_or_default();
    let by_id: HashMap<&str, &v1::ContainerStats> = containers
        .iter()
        .filter_map(|c| c.attributes.as_ref().map(|a| (a.id.as_str(), c)))
        .collect();
    let mut out = PodStats {
        pod_ref: PodReference {
            name: pod.name().into(),
            namespace: pod.namespace().into(),
            uid: pod.uid().into(),
        },
        start_time: status.start_time.as_ref().map(|t| time(t.0)),
        ..Default::default()
    };
    for cs in status.container_statuses.iter().flatten() {
        let Some(running) = cs.state.as_ref().and_then(|s| s.running.as_ref()) else {
            continue;
        };
        let id = cs
            .container_id
            .as_deref()
            .and_then(|i| i.split_once("://"))
            .map_or("", |(_, id)| id);
        let stats = by_id.get(id);
        let rootfs = stats
            .and_then(|s| s.writable_layer.as_ref())
            .map(|w| FsStats {
                time: ns_time(w.timestamp),
                used_bytes: w.used_bytes.as_ref().map(|v| v.value),
                inodes_used: w.inodes_used.as_ref().map(|v| v.value),
                // The writable layer lives on the image filesystem.
                available_bytes: image_fs.and_then(|f| f.available_bytes),
                capacity_bytes: image_fs.and_then(|f| f.capacity_bytes),
                inodes: image_fs.and_then(|f| f.inodes),
                inodes_free: image_fs.and_then(|f| f.inodes_free),
            });
        let logs = logs
            .get(&(pod.uid().to_string(), cs.name.clone()))
            .map(|(used, files)| FsStats {
                time: time(Timestamp::now()),
                used_bytes: Some(*used),
                inodes_used: Some(*files),
                ..Default::default()
            });
        out.containers.push(ContainerStats {
            name: cs.name.clone(),
            start_time: running.started_at.as_ref().map(|t| time(t.0)),
            cpu: stats.and_then(|s| s.cpu.as_ref()).map(cpu_stats),
            memory: stats.and_then(|s| s.memory.as_ref()).map(memory_stats),
            rootfs,
            logs,
        });
    }
    let sandbox = sandboxes
        .iter()
        .find(|s| {
            s.attributes
                .as_ref()
                .and_then(|a| a.metadata.as_ref())
                .is_some_and(|m| m.uid == pod.uid())
        })
        .and_then(|s| s.linux.as_ref());
    out.cpu = sandbox
        .and_then(|l| l.cpu.as_ref())
        .map(cpu_stats)
        .or_else(|| sum_cpu(out.containers.iter().filter_map(|c| c.cpu.as_ref())));
    out.memory = sandbox
        .and_then(|l| l.memory.as_ref())
        .map(memory_stats)
        .or_else(|| sum_memory(out.containers.iter().filter_map(|c| c.memory.as_ref())));
    let used: u64 = out
        .containers
        .iter()
        .flat_map(|c| [c.rootfs.as_ref(), c.logs.as_ref()])
        .flatten()
        .filter_map(|f| f.used_bytes)
        .sum();
    out.ephemeral_storage = Some(FsStats {
        time: time(Timestamp::now()),
        used_bytes: Some(used),
        available_bytes: image_fs.and_then(|f| f.available_bytes),
        capacity_bytes: image_fs.and_then(|f| f.capacity_bytes),
        ..Default::default()
    });
    out
}

fn cpu_stats(c: &v1::CpuUsage) -> CpuStats {
    CpuStats {
        time: ns_time(c.timestamp),
        usage_nano_cores: c.usage_nano_cores.as_ref().map(|v| v.value),
        usage_core_nano_seconds: c.usage_core_nano_seconds.as_ref().map(|v| v.value),
    }
}

fn memory_stats(m: &v1::MemoryUsage) -> MemoryStats {
    MemoryStats {
        time: ns_time(m.timestamp),
        available_bytes: m.available_bytes.as_ref().map(|v| v.value),
        usage_bytes: m.usage_bytes.as_ref().map(|v| v.value),
        working_set_bytes: m.working_set_bytes.as_ref().map(|v| v.value),
        rss_bytes: m.rss_bytes.as_ref().map(|v| v.value),
        page_faults: m.page_faults.as_ref().map(|v| v.value),
        major_page_faults: m.major_page_faults.as_ref().map(|v| v.value),
    }
}

/// Sum of optional figures: None when none has one.
fn sum(values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.flatten().reduce(|a, b| a + b)
}

fn sum_cpu<'a>(cs: impl Iterator<Item = &'a CpuStats> + Clone) -> Option<CpuStats> {
    let time = cs.clone().map(|c| c.time.clone()).max()?;
    Some(CpuStats {
        time,
        usage_nano_cores: sum(cs.clone().map(|c| c.usage_nano_cores)),
        usage_core_nano_seconds: sum(cs.map(|c| c.usage_core_nano_seconds)),
    })
}

fn sum_memory<'a>(ms: impl Iterator<Item = &'a MemoryStats> + Clone) -> Option<MemoryStats> {
    let time = ms.clone().map(|m| m.time.clone()).max()?;
    Some(MemoryStats {
        time,
        available_bytes: None,
        usage_bytes: sum(ms.clone().map(|m| m.usage_bytes)),
        working_set_bytes: sum(ms.clone().map(|m| m.working_set_bytes)),
        rss_bytes: sum(ms.clone().map(|m| m.rss_bytes)),
        page_faults: sum(ms.clone().map(|m| m.page_faults)),
        major_page_faults: sum(ms.map(|m| m.major_page_faults)),
    })
}

/// Bytes and files of each container's logs (rotated ones included),
/// keyed (pod uid, container name).
fn log_sizes(root: &Path, pods: &[Pod]) -> HashMap<(String, String), (u64, u64)> {
    let mut out = HashMap::new();
    for p in pods {
        let dir = pod_log_dir(root, p);
        for c in p.containers().iter().chain(p.init_containers()) {
            let mut used = 0;
            let mut files = 0;
            for e in std::fs::read_dir(dir.join(&c.name))
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(m) = e.metadata() {
                    used += m.len();
                    files += 1;
                }
            }
            out.insert((p.uid().to_string(), c.name.clone()), (used, files));
        }
    }
    out
}

/// Capacity, free space and inodes of the file system holding `path`.
fn statvfs(path: &Path) -> Option<FsStats> {
    let v = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = v.fragment_size() as u64;
    let blocks = v.blocks() as u64;
    Some(FsStats {
        time: time(Timestamp::now()),
        capacity_bytes: Some(blocks * frsize),
        available_bytes: Some(v.blocks_available() as u64 * frsize),
        used_bytes: Some(blocks.saturating_sub(v.blocks_free() as u64) * frsize),
        inodes: Some(v.files() as u64),
        inodes_free: Some(v.files_free() as u64),
        inodes_used: Some((v.files() as u64).saturating_sub(v.files_free() as u64)),
    })
}

fn image_fs_stats(u: &v1::FilesystemUsage) -> FsStats {
    let mountpoint = u
        .fs_id
        .as_ref()
        .map(|f| f.mountpoint.clone())
        .unwrap_or_default();
    let fs = statvfs(Path::new(&mountpoint)).unwrap_or_default();
    FsStats {
        time: ns_time(u.timestamp),
        used_bytes: u.used_bytes.as_ref().map(|v| v.value),
        inodes_used: u.inodes_used.as_ref().map(|v| v.value),
        ..fs
    }
}

/// Node memory, filesystem and process figures (blocking reads).
fn node_stats(root: &Path) -> NodeStats {
    let now = time(Timestamp::now());
    let start_time = procfs::boot_time_secs()
        .ok()
        .and_then(|s| Timestamp::from_second(s as i64).ok())
        .map(time);
    let memory = procfs::Current::current().ok().map(|m: procfs::Meminfo| {
        let usage = m.mem_total.saturating_sub(m.mem_free);
        let working_set = usage.saturating_sub(m.inactive_file.unwrap_or(0));
        let vm = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let vmstat = |key: &str| {
            vm.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        };
        MemoryStats {
            time: now.clone(),
            // As the kubelet: capacity less the working set.
            available_bytes: Some(m.mem_total.saturating_sub(working_set)),
            usage_bytes: Some(usage),
            working_set_bytes: Some(working_set),
            rss_bytes: m.anon_pages,
            page_faults: vmstat("pgfault"),
            major_page_faults: vmstat("pgmajfault"),
        }
    });
    let curproc = std::fs::read_dir("/proc").ok().map(|d| {
        d.flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .count() as u64
    });
    let maxpid = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    NodeStats {
        start_time,
        memory,
        fs: statvfs(root).or_else(|| statvfs(Path::new("/"))),
        rlimit: Some(RlimitStats {
            time: now,
            maxpid,
            curproc,
        }),
        ..Default::default()
    }
}

/// Busy CPU time of the node in nanoseconds, from /proc/stat.
fn cpu_busy_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| f.get(*i)).sum();
    let tick = procfs::ticks_per_second().max(1);
    Some(busy * (1_000_000_000 / tick))
}

/// Node CPU: cumulative usage and the rate since the previous request (or
/// over a short sample on the first one).
async fn node_cpu() -> Option<CpuStats> {
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    let mut now = cpu_busy_ns()?;
    let mut at = Instant::now();
    let prev = *LAST.lock().unwrap_or_else(|e| e.into_inner());
    let prev = match prev {
        Some((t, v)) if at.duration_since(t) >= Duration::from_millis(100) => (t, v),
        _ => {
            let first = (at, now);
            tokio::time::sleep(Duration::from_millis(200)).await;
            now = cpu_busy_ns()?;
            at = Instant::now();
            first
        }
    };
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, now));
    let secs = at.duration_since(prev.0).as_secs_f64();
    let rate = (now.saturating_sub(prev.1) as f64 / secs) as u64;
    Some(CpuStats {
        time: time(Timestamp::now()),
        usage_nano_cores: Some(rate),
        usage_core_nano_seconds: Some(now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_figures_fall_back_to_container_sums() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"containerStatuses": [
                {"name": "a", "containerID": "containerd://ca", "image": "", "imageID": "",
                 "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-11-30T06:00:00Z"}}},
                {"name": "b", "containerID": "containerd://cb", "image": "", "imageID": "",
                 "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-11-30T06:00:00Z"}}}
            ]}
        }))
        .unwrap();
        let stats = |id: &str, cpu: u64, mem: u64| v1::ContainerStats {
            attributes: Some(v1::ContainerAttributes {
                id: id.into(),
                ..Default::default()
            }),
            cpu: Some(v1::CpuUsage {
                timestamp: 1_000_000_000,
                usage_core_nano_seconds: Some(v1::UInt64Value { value: cpu }),
                usage_nano_cores: Some(v1::UInt64Value { value: cpu / 10 }),
                ..Default::default()
            }),
            memory: Some(v1::MemoryUsage {
                timestamp: 1_000_000_000,
                working_set_bytes: Some(v1::UInt64Value { value: mem }),
                ..Default::default()
            }),
            writable_layer: Some(v1::FilesystemUsage {
                timestamp: 1_000_000_000,
                used_bytes: Some(v1::UInt64Value { value: 4096 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let containers = [
            stats("ca", 100, 1000),
            stats("cb", 300, 2000),
            stats("other", 7, 7),
        ];
        let logs = HashMap::from([(("u1".to_string(), "a".to_string()), (10, 1))]);
        let p = pod_stats(&pod, &containers, &[], &logs, None);
        assert_eq!(p.containers.len(), 2);
        assert_eq!(p.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(400));
        assert_eq!(p.cpu.as_ref().unwrap().usage_nano_cores, Some(40));
        assert_eq!(p.memory.as_ref().unwrap().working_set_bytes, Some(3000));
        assert_eq!(
            p.ephemeral_storage.as_ref().unwrap().used_bytes,
            Some(4096 * 2 + 10)
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["podRef"]["uid"], "u1");
        assert_eq!(json["containers"][0]["rootfs"]["usedBytes"], 4096);
        assert_eq!(json["containers"][0]["logs"]["usedBytes"], 10);
        assert!(json.get("ephemeral-storage").is_some());
    }

    #[tokio::test]
    async fn node_figures_from_proc() {
        let dir = tempfile::tempdir().unwrap();
        let n = node_stats(dir.path());
        assert!(n.memory.unwrap().working_set_bytes.unwrap() > 0);
        assert!(n.fs.unwrap().capacity_bytes.unwrap() > 0);
        let cpu = node_cpu().await.unwrap();
        assert!(cpu.usage_core_nano_seconds.unwrap() > 0);
        assert!(cpu.usage_nano_cores.is_some());
    }
}
