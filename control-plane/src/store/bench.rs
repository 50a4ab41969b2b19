//! Raw store write benchmark: the physical limit the API benchmark compares
//! itself with ("the same writes straight into the store").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Store;

/// A pod-sized JSON value (about 1 KiB), like what the API server writes.
fn pod_value(i: usize) -> Vec<u8> {
    format!(
        concat!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"bench-{i}","namespace":"bench","#,
            r#""uid":"00000000-0000-0000-0000-{i:012}","labels":{{"app":"bench","tier":"raw"}}}},"#,
            r#""spec":{{"containers":[{{"name":"c","image":"busybox:1.36","command":["sleep","3600"],"#,
            r#""resources":{{"requests":{{"cpu":"10m","memory":"16Mi"}}}}}}],"restartPolicy":"Always","#,
            r#""terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","schedulerName":"default-scheduler"}},"#,
            r#""status":{{"phase":"Pending","qosClass":"Burstable"}},"padding":"{pad}"}}"#
        ),
        i = i,
        pad = "x".repeat(400)
    )
    .into_bytes()
}

/// Create `n` new keys (pod-sized values) with `concurrency` concurrent
/// writers; returns each successful create's latency and the wall time.
///
/// Keys go under `/registry/skiff-bench/<run>/`, unique per call; they are
/// left in the store. A failed create is logged and has no latency, so
/// `latencies.len() < n` means some failed.
pub async fn bench_raw_writes(
    store: Arc<dyn Store>,
    n: usize,
    concurrency: usize,
) -> (Vec<Duration>, Duration) {
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (store, next) = (store.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return latencies;
                    }
                    let key = format!("/registry/skiff-bench/{run}/pod-{i:06}");
                    let value = pod_value(i);
                    let t = Instant::now();
                    match store.create(&key, value).await {
                        Ok(_) => latencies.push(t.elapsed()),
                        Err(e) => tracing::warn!(key, error = %e, "raw store write failed"),
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(n);
    for w in workers {
        match w.await {
            Ok(l) => latencies.extend(l),
            Err(e) => tracing::warn!(error = %e, "raw store write worker failed"),
        }
    }
    (latencies, started.elapsed())
}

/// The `p`-quantile (0.0..=1.0) of `latencies` (sorted here); zero when empty.
pub fn percentile(latencies: &[Duration], p: f64) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    sorted[idx]
}

/// Seconds to run `create(0..n)`, `c` at once; the first error, if any.
///
/// # Errors
/// The first of `create`'s errors.
pub async fn timed<F, Fut, E>(n: usize, c: usize, create: F) -> Result<f64, E>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    use futures::StreamExt;
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(&create)
        .buffer_unordered(c)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, E>>()?;
    Ok(start.elapsed().as_secs_f64())
}
