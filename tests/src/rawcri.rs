//! The raw CRI floor the benchmarks compare the agent against: the same
//! sandbox and container the agent makes, created with direct CRI calls.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use cri_proto::{v1, CriClient};

use crate::TOOLBOX_IMAGE;

/// The same sandbox and container the agent would make, minus its
/// bookkeeping: the floor the agent is measured against.
pub async fn raw_pod(cri: &CriClient, name: &str, logs: &std::path::Path) -> Result<()> {
    raw_pod_of(cri, name, logs, TOOLBOX_IMAGE).await
}

/// [`raw_pod`] with a container of `image` (present already).
pub async fn raw_pod_of(
    cri: &CriClient,
    name: &str,
    logs: &std::path::Path,
    image: &str,
) -> Result<()> {
    let uid = format!("raw-{name}");
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_string(), name.to_string()),
        (
            "io.kubernetes.pod.namespace".to_string(),
            "default".to_string(),
        ),
        ("io.kubernetes.pod.uid".to_string(), uid.clone()),
    ]);
    let log_dir = logs.join(&uid);
    std::fs::create_dir_all(log_dir.join("c"))?;
    let config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.into(),
            uid,
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        labels: labels.clone(),
        linux: Some(v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let sandbox = cri
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .pod_sandbox_id;
    let mut clabels = labels;
    clabels.insert("io.kubernetes.container.name".into(), "c".into());
    let container = cri
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: sandbox,
            config: Some(v1::ContainerConfig {
                metadata: Some(v1::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(v1::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                log_path: "c/0.log".into(),
                labels: clabels,
                linux: Some(v1::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await?
        .container_id;
    cri.start_container(v1::StartContainerRequest {
        container_id: container,
    })
    .await?;
    Ok(())
}

pub async fn remove_all(cri: &CriClient) -> Result<()> {
    for s in cri
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await?
        .items
    {
        cri.stop_pod_sandbox(v1::StopPodSandboxRequest {
            pod_sandbox_id: s.id.clone(),
        })
        .await?;
        cri.remove_pod_sandbox(v1::RemovePodSandboxRequest {
            pod_sandbox_id: s.id,
        })
        .await?;
    }
    Ok(())
}

/// The `p`th percentile of `v`.
pub fn pct(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)]
}
