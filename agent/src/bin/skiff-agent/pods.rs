//! `skiff-agent pods`: the node's pods as `kubectl get pods -o wide` shows them.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::List;
use kube_util::duration::human_duration;
use kube_util::podstatus;

pub async fn run(address: &str, output: &str) -> Result<()> {
    let url = format!("http://{address}/pods");
    let list: List<Pod> = reqwest::get(&url)
        .await
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("cannot reach the agent at {url}: is skiff-agent running (and --status-address set)?"))?
        .json()
        .await
        .context("the agent answered something that is not a PodList")?;
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<16}{:<40}{:<8}{:<20}{:<10}{:<8}IP",
        "NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"
    );
    for pod in &list.items {
        let st = pod.status.clone().unwrap_or_default();
        let summary = podstatus::summary(pod);
        let age = st
            .start_time
            .as_ref()
            .map(|t| human_duration(jiff::Timestamp::now().duration_since(t.0).as_secs()))
            .unwrap_or_else(|| "<unknown>".into());
        println!(
            "{:<16}{:<40}{:<8}{:<20}{:<10}{:<8}{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
            format!("{}/{}", summary.ready, summary.total),
            summary.status,
            summary.restarts,
            age,
            st.pod_ip.as_deref().unwrap_or("<none>"),
        );
    }
    Ok(())
}
