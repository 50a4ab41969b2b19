//! `skiff-agent pods`: the node's pods as `kubectl get pods -o wide` shows them.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::List;
use skiff_agent::status::display_status;

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
        let cs = st.container_statuses.clone().unwrap_or_default();
        let ready = cs.iter().filter(|c| c.ready).count();
        let restarts: i32 = cs.iter().map(|c| c.restart_count).sum();
        let age = st
            .start_time
            .as_ref()
            .map(|t| human_age(jiff::Timestamp::now().duration_since(t.0).as_secs()))
            .unwrap_or_else(|| "<unknown>".into());
        println!(
            "{:<16}{:<40}{:<8}{:<20}{:<10}{:<8}{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
            format!("{ready}/{}", cs.len()),
            display_status(pod, &st),
            restarts,
            age,
            st.pod_ip.as_deref().unwrap_or("<none>"),
        );
    }
    Ok(())
}

fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}
