//! Prometheus metrics: request latency and counts by verb/resource/code,
//! current watchers, and store operation latency.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{b}\"}} {}",
                self.counts.get(i).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// The server's metrics registry.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Histogram>>,
    store_ops: Mutex<BTreeMap<(&'static str, &'static str), Histogram>>,
    watchers: AtomicI64,
}

/// Decrements the watcher gauge when dropped (the watch stream ended).
pub struct WatcherGuard<'a>(&'a Metrics);

impl Drop for WatcherGuard<'_> {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn observe_request(&self, verb: &str, resource: &str, code: u16, took: Duration) {
        let mut m = self.requests.lock().expect("metrics lock");
        m.entry((verb.to_string(), resource.to_string(), code))
            .or_default()
            .observe(took.as_secs_f64());
    }

    pub fn observe_store(&self, backend: &'static str, op: &'static str, took: Duration) {
        let mut m = self.store_ops.lock().expect("metrics lock");
        m.entry((backend, op))
            .or_default()
            .observe(took.as_secs_f64());
    }

    pub fn watcher(&self) -> WatcherGuard<'_> {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        WatcherGuard(self)
    }

    pub fn current_watchers(&self) -> i64 {
        self.watchers.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let reqs = self.requests.lock().expect("metrics lock").clone();
        out.push_str("# HELP apiserver_request_duration_seconds Response latency distribution in seconds for each verb, resource and code.\n");
        out.push_str("# TYPE apiserver_request_duration_seconds histogram\n");
        for ((verb, res, code), h) in &reqs {
            h.render(
                &mut out,
                "apiserver_request_duration_seconds",
                &format!("verb=\"{verb}\",resource=\"{res}\",code=\"{code}\""),
            );
        }
        out.push_str("# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, resource and HTTP response code.\n");
        out.push_str("# TYPE apiserver_request_total counter\n");
        for ((verb, res, code), h) in &reqs {
            let _ = writeln!(
                out,
                "apiserver_request_total{{verb=\"{verb}\",resource=\"{res}\",code=\"{code}\"}} {}",
                h.count
            );
        }
        out.push_str(
            "# HELP apiserver_current_watchers Number of currently open watch requests.\n",
        );
        out.push_str("# TYPE apiserver_current_watchers gauge\n");
        let _ = writeln!(
            out,
            "apiserver_current_watchers {}",
            self.current_watchers()
        );
        out.push_str("# HELP skiff_store_operation_duration_seconds Latency of store operations by backend and operation.\n");
        out.push_str("# TYPE skiff_store_operation_duration_seconds histogram\n");
        let ops = self.store_ops.lock().expect("metrics lock").clone();
        for ((backend, op), h) in &ops {
            h.render(
                &mut out,
                "skiff_store_operation_duration_seconds",
                &format!("backend=\"{backend}\",operation=\"{op}\""),
            );
        }
        out
    }
}

/// A [`Store`] that records each operation's latency.
pub struct MeteredStore {
    inner: std::sync::Arc<dyn crate::store::Store>,
    metrics: std::sync::Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(
        inner: std::sync::Arc<dyn crate::store::Store>,
        metrics: std::sync::Arc<Metrics>,
    ) -> Self {
        MeteredStore { inner, metrics }
    }

    async fn timed<T>(&self, op: &'static str, f: impl std::future::Future<Output = T>) -> T {
        let start = std::time::Instant::now();
        let out = f.await;
        self.metrics
            .observe_store(self.inner.backend(), op, start.elapsed());
        out
    }
}

#[async_trait::async_trait]
impl crate::store::Store for MeteredStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn current_revision(&self) -> crate::store::Result<i64> {
        self.timed("current_revision", self.inner.current_revision())
            .await
    }
    async fn get(&self, key: &str) -> crate::store::Result<Option<crate::store::KeyValue>> {
        self.timed("get", self.inner.get(key)).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> crate::store::Result<crate::store::ListResult> {
        self.timed(
            "list",
            self.inner.list(prefix, start_after, limit, revision),
        )
        .await
    }
    async fn create(
        &self,
        key: &str,
        value: Vec<u8>,
    ) -> crate::store::Result<crate::store::KeyValue> {
        self.timed("create", self.inner.create(key, value)).await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
    ) -> crate::store::Result<crate::store::KeyValue> {
        self.timed("update", self.inner.update(key, value, expected_revision))
            .await
    }
    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<i64>,
    ) -> crate::store::Result<(crate::store::KeyValue, i64)> {
        self.timed("delete", self.inner.delete(key, expected_revision))
            .await
    }
    async fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
    ) -> crate::store::Result<crate::store::WatchStream> {
        self.timed("watch", self.inner.watch(prefix, after_revision))
            .await
    }
    async fn compact(&self, revision: i64) -> crate::store::Result<()> {
        self.timed("compact", self.inner.compact(revision)).await
    }
    async fn health(&self) -> crate::store::Result<()> {
        self.inner.health().await
    }
    async fn snapshot_save(
        &self,
        path: &std::path::Path,
    ) -> crate::store::Result<crate::store::SnapshotInfo> {
        self.inner.snapshot_save(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.observe_request("GET", "pods", 200, Duration::from_millis(3));
        {
            let _w = m.watcher();
            assert!(m.render().contains("apiserver_current_watchers 1"));
        }
        let text = m.render();
        assert!(
            text.contains("apiserver_request_total{verb=\"GET\",resource=\"pods\",code=\"200\"} 1")
        );
        assert!(text.contains("apiserver_request_duration_seconds_bucket{verb=\"GET\",resource=\"pods\",code=\"200\",le=\"0.005\"} 1"));
        assert!(text.contains("apiserver_current_watchers 0"));
    }
}
