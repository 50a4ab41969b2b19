//! The agent's Prometheus metrics, one registry for the process. Modules
//! observe into [`metrics()`]; the node server renders it on `/metrics`.
//! Names follow the kubelet's where one exists, so dashboards carry over.
//! The service proxy's metrics (skiff-proxy) are registered here too.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
        // The proxy's own metrics, shared with its /metrics endpoint.
        skiff_proxy::metrics::metrics().register(&mut registry);
        Metrics {
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
