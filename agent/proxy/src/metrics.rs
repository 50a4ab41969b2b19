//! The proxy's Prometheus metrics, with kube-proxy's names. One set per
//! process ([`metrics()`]); a process that serves its own registry (the
//! agent) adds them to it with [`ProxyMetrics::register`], and the proxy's
//! `/metrics` endpoint renders what [`crate::ProxyConfig::render_metrics`]
//! says (by default, these alone).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The service proxy's metrics.
pub struct ProxyMetrics {
    /// `kubeproxy_sync_proxy_rules_duration_seconds`: every sync.
    pub sync: Histogram,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds`.
    pub full: Histogram,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds`.
    pub partial: Histogram,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub last_sync: Gauge<f64, AtomicU64>,
    /// `skiff_proxy_rules_programmed`: map elements plus chains (nftables)
    /// or chains (iptables) in the kernel.
    pub programmed: Gauge,
    /// `skiff_proxy_sync_failures_total`.
    pub failures: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_total` and
    /// `..._endpoint_changes_total`.
    pub service_changes: Counter,
    pub endpoint_changes: Counter,
    seen_changes: (AtomicU64, AtomicU64),
}

fn latency() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl ProxyMetrics {
    fn new() -> ProxyMetrics {
        ProxyMetrics {
            sync: latency(),
            full: latency(),
            partial: latency(),
            last_sync: Gauge::default(),
            programmed: Gauge::default(),
            failures: Counter::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            seen_changes: Default::default(),
        }
    }

    /// Add these metrics to `registry` (they stay shared: observing here
    /// shows there).
    pub fn register(&self, registry: &mut Registry) {
        for (name, help, h) in [
            (
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "Seconds a proxy rule sync took",
                &self.sync,
            ),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "Seconds a full proxy rule sync took",
                &self.full,
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "Seconds a partial proxy rule sync took",
                &self.partial,
            ),
        ] {
            registry.register(name, help, h.clone());
        }
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When proxy rules were last synced (Unix seconds)",
            self.last_sync.clone(),
        );
        registry.register(
            "skiff_proxy_rules_programmed",
            "Proxy map elements and chains in the kernel",
            self.programmed.clone(),
        );
        registry.register(
            "skiff_proxy_sync_failures",
            "Proxy rule syncs that failed",
            self.failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Service changes the proxy has seen",
            self.service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "EndpointSlice changes the proxy has seen",
            self.endpoint_changes.clone(),
        );
    }

    /// Record a successful proxy sync.
    pub fn sync_ok(&self, full: bool, took: Duration, programmed: usize) {
        self.sync.observe(took.as_secs_f64());
        if full { &self.full } else { &self.partial }.observe(took.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_sync.set(now.as_secs_f64());
        self.programmed
            .set(i64::try_from(programmed).unwrap_or(i64::MAX));
    }

    pub fn sync_error(&self) {
        self.failures.inc();
    }

    /// The proxy state's running totals of service and endpoint changes.
    pub fn changes(&self, services: u64, endpoints: u64) {
        let s = self.seen_changes.0.swap(services, Ordering::Relaxed);
        let e = self.seen_changes.1.swap(endpoints, Ordering::Relaxed);
        self.service_changes.inc_by(services.saturating_sub(s));
        self.endpoint_changes.inc_by(endpoints.saturating_sub(e));
    }
}

/// The process's proxy metrics.
pub fn metrics() -> &'static ProxyMetrics {
    static METRICS: OnceLock<ProxyMetrics> = OnceLock::new();
    METRICS.get_or_init(ProxyMetrics::new)
}

/// The Prometheus text exposition of the proxy's metrics alone: the
/// default of [`crate::ProxyConfig::render_metrics`].
pub fn render() -> String {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        metrics().register(&mut r);
        r
    });
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_proxy_metrics() {
        metrics().sync_error();
        let text = render();
        assert!(text.contains("skiff_proxy_sync_failures_total "), "{text}");
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"),
            "{text}"
        );
    }
}
