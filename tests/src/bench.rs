//! What the cluster benchmarks (`src/bin/bench-*.rs`) share: their
//! command-line sizes, a pod watch that counts pods reaching a state, and
//! the wait for a round's pods to be gone before the next round.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};

/// How long one round may take before the benchmark gives up.
const ROUND_LIMIT: Duration = Duration::from_secs(180);

/// The number after `--name` on the command line, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Each round in whole milliseconds, for printing.
pub fn millis(v: &[Duration]) -> Vec<u64> {
    v.iter().map(|d| d.as_millis() as u64).collect()
}

/// The mean of the rounds in milliseconds.
pub fn mean_ms(v: &[Duration]) -> f64 {
    v.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / v.len().max(1) as f64
}

/// A watch of the pods labelled `label`, returned once its initial list is
/// in: every event after that is a change made by the round.
pub async fn pod_watch(
    pods: &Api<Pod>,
    label: &str,
) -> Result<BoxStream<'static, Result<Event<Pod>, watcher::Error>>> {
    let mut events =
        watcher::watcher(pods.clone(), watcher::Config::default().labels(label)).boxed();
    while let Some(ev) = events.try_next().await? {
        if matches!(ev, Event::InitDone) {
            break;
        }
    }
    Ok(events)
}

/// Wait until the watch has shown `n` distinct pods for which `reached`
/// holds; `started` is when the round began.
pub async fn wait_pods(
    events: &mut BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
    n: usize,
    what: &str,
    started: Instant,
    reached: impl Fn(&Pod) -> bool,
) -> Result<()> {
    let mut seen = HashSet::new();
    let deadline = started + ROUND_LIMIT;
    while seen.len() < n {
        let ev = match tokio::time::timeout_at(deadline.into(), events.try_next()).await {
            Ok(ev) => ev?,
            Err(_) => bail!(
                "{what}: only {} of {n} pods after {ROUND_LIMIT:?}",
                seen.len()
            ),
        };
        let Some(Event::Apply(p) | Event::InitApply(p)) = ev else {
            continue;
        };
        if reached(&p) {
            seen.insert(p.metadata.name.clone().unwrap_or_default());
        }
    }
    Ok(())
}

/// Whether a pod's phase is Running.
pub fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Whether a pod's Ready condition is True.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Wait until no pod labelled `label` is left.
pub async fn wait_no_pods(pods: &Api<Pod>, label: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels(label))
        .await?
        .items
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("pods {label} still there after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
