//! The agent's Prometheus metrics, one registry for the process. Modules
//! observe into [`metrics()`]; the node server renders it on `/metrics`.
//! Names follow the kubelet's where one exists, so dashboards carry over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `probe_type` is Liveness / Readiness / Startup, `result` is
/// successful / failed / unknown (the kubelet's label values).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    /// `kubelet_pod_start_duration_seconds`: from the agent first seeing the
    /// pod to all its containers running.
    pub pod_start: Histogram,
    /// `kubelet_pleg_relist_duration_seconds`.
    pub pleg_relist: Histogram,
    /// `prober_probe_duration_seconds`.
    pub probe_duration: Histograms<ProbeLabels>,
    /// `prober_probe_total`.
    pub probe_total: Family<ProbeLabels, Counter>,
    /// `kubelet_runtime_operations_duration_seconds`, by CRI method.
    pub cri_duration: Histograms<OperationLabels>,
    /// `kubelet_runtime_operations_errors_total`, by CRI method.
    pub cri_errors: Family<OperationLabels, Counter>,
    pub proxy: ProxyMetrics,
}

/// The service proxy's, with kube-proxy's names.
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

fn probe_latency() -> Histogram {
    // 0.25 ms .. ~9 s in steps of 25 %: fine enough to compare a probe's
    // latency with the raw call it makes (bench-probes).
    Histogram::new(exponential_buckets(0.00025, 1.25, 48))
}

fn slow() -> Histogram {
    // 50 ms .. ~27 min: pod start-up includes image pulls.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let pod_start = slow();
        let pleg_relist = latency();
        let probe_duration: Histograms<ProbeLabels> = Family::new_with_constructor(probe_latency);
        let probe_total = Family::<ProbeLabels, Counter>::default();
        let cri_duration: Histograms<OperationLabels> = Family::new_with_constructor(latency);
        let cri_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "Seconds from the agent seeing a pod to all its containers running",
            pod_start.clone(),
        );
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Seconds taken to relist the pods in the runtime",
            pleg_relist.clone(),
        );
        registry.register(
            "prober_probe_duration_seconds",
            "Duration of a container probe, by probe type and result",
            probe_duration.clone(),
        );
        registry.register(
            "prober_probe",
            "Container probes run, by probe type and result",
            probe_total.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "Duration of CRI operations, by method",
            cri_duration.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "CRI operations that failed, by method",
            cri_errors.clone(),
        );
        let proxy = ProxyMetrics {
            sync: latency(),
            full: latency(),
            partial: latency(),
            last_sync: Gauge::default(),
            programmed: Gauge::default(),
            failures: Counter::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            seen_changes: Default::default(),
        };
        let p = &proxy;
        for (name, help, h) in [
            (
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "Seconds a proxy rule sync took",
                &p.sync,
            ),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "Seconds a full proxy rule sync took",
                &p.full,
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "Seconds a partial proxy rule sync took",
                &p.partial,
            ),
        ] {
            registry.register(name, help, h.clone());
        }
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When proxy rules were last synced (Unix seconds)",
            p.last_sync.clone(),
        );
        registry.register(
            "skiff_proxy_rules_programmed",
            "Proxy map elements and chains in the kernel",
            p.programmed.clone(),
        );
        registry.register(
            "skiff_proxy_sync_failures",
            "Proxy rule syncs that failed",
            p.failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Service changes the proxy has seen",
            p.service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "EndpointSlice changes the proxy has seen",
            p.endpoint_changes.clone(),
        );
        Metrics {
            proxy,
            registry,
            pod_start,
            pleg_relist,
            probe_duration,
            probe_total,
            cri_duration,
            cri_errors,
        }
    }

    /// Record one probe run.
    pub fn probe(&self, probe_type: &str, result: &str, took: Duration) {
        let labels = ProbeLabels {
            probe_type: probe_type.into(),
            result: result.into(),
        };
        self.probe_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.probe_total.get_or_create(&labels).inc();
    }

    /// Record one CRI call.
    pub fn cri_call(&self, method: &str, took: Duration, failed: bool) {
        let labels = OperationLabels {
            operation_type: method.into(),
        };
        self.cri_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.cri_errors.get_or_create(&labels).inc();
        }
    }

    /// Record a successful proxy sync.
    pub fn proxy_sync(&self, full: bool, took: Duration, programmed: usize) {
        let p = &self.proxy;
        p.sync.observe(took.as_secs_f64());
        if full { &p.full } else { &p.partial }.observe(took.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        p.last_sync.set(now.as_secs_f64());
        p.programmed
            .set(i64::try_from(programmed).unwrap_or(i64::MAX));
    }

    pub fn proxy_sync_error(&self) {
        self.proxy.failures.inc();
    }

    /// The proxy state's running totals of service and endpoint changes.
    pub fn proxy_changes(&self, services: u64, endpoints: u64) {
        let p = &self.proxy;
        let s = p.seen_changes.0.swap(services, Ordering::Relaxed);
        let e = p.seen_changes.1.swap(endpoints, Ordering::Relaxed);
        p.service_changes.inc_by(services.saturating_sub(s));
        p.endpoint_changes.inc_by(endpoints.saturating_sub(e));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_observed_values() {
        let m = Metrics::new();
        m.probe("Readiness", "successful", Duration::from_millis(3));
        m.cri_call("ExecSync", Duration::from_millis(20), true);
        let text = m.render();
        assert!(
            text.contains("prober_probe_total{probe_type=\"Readiness\",result=\"successful\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_runtime_operations_errors_total{operation_type=\"ExecSync\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pod_start_duration_seconds_count 0"),
            "{text}"
        );
    }
}
