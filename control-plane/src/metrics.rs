//! The API server's Prometheus metrics (prometheus-client): request latency
//! and counts by verb/resource/code, current watchers, and store operation
//! latency; what each request is recorded under.
//!
//! Label values come from the matched route, never from the raw URL, and
//! every request answered 401 is recorded under one label set: a client,
//! authenticated or not, cannot grow the series without bound. The encoder
//! escapes label values, so no path can break the exposition format.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::apiserver::request::{self, Query, Target};
use crate::apiserver::resources;

/// Seconds; upstream's `apiserver_request_duration_seconds` buckets.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
];

fn latency() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

/// What a request is recorded under, known before it is served: the verb
/// (upper case, as upstream writes it) and the resource of the matched route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestKind {
    verb: &'static str,
    resource: &'static str,
}

impl RequestKind {
    /// Requests answered 401: one label set, whatever their method and path,
    /// since nothing about an unauthenticated caller is to be trusted.
    const UNAUTHENTICATED: RequestKind = RequestKind {
        verb: "UNKNOWN",
        resource: "unknown",
    };

    /// A resource request is labelled with the served resource's plural, or
    /// `unknown` when no served resource matches; any other request with an
    /// empty resource. The verb is the Kubernetes verb for resource requests
    /// and the HTTP method otherwise, `UNKNOWN` for methods HTTP does not
    /// define (clients may send any token).
    pub fn of(method: &Method, target: &Target, query: &Query) -> RequestKind {
        match target {
            Target::Resource(p) => RequestKind {
                verb: upper_verb(request::verb(method, p, query)),
                resource: resources::lookup(&p.group, &p.version, &p.resource)
                    .map_or("unknown", |def| def.plural),
            },
            _ => RequestKind {
                verb: http_method(method),
                resource: "",
            },
        }
    }
}

fn upper_verb(verb: &str) -> &'static str {
    match verb {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "CREATE",
        "update" => "UPDATE",
        "patch" => "PATCH",
        "delete" => "DELETE",
        "deletecollection" => "DELETECOLLECTION",
        _ => "UNKNOWN",
    }
}

fn http_method(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "UNKNOWN",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    resource: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    backend: &'static str,
    operation: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The server's metrics registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `apiserver_request_duration_seconds`.
    request_duration: Histograms<RequestLabels>,
    /// `apiserver_request_total`.
    requests: Family<RequestLabels, Counter>,
    /// `apiserver_current_watchers`.
    watchers: Gauge,
    /// `skiff_store_operation_duration_seconds`.
    store_ops: Histograms<StoreLabels>,
    /// `apiserver_audit_event_total`, `apiserver_audit_error_total`.
    audit: crate::apiserver::audit::Counters,
    /// `apiserver_admission_webhook_admission_duration_seconds`,
    /// `apiserver_admission_webhook_rejection_count`.
    webhooks: crate::apiserver::webhook::Counters,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let request_duration: Histograms<RequestLabels> = Family::new_with_constructor(latency);
        let requests = Family::<RequestLabels, Counter>::default();
        let watchers = Gauge::default();
        let store_ops: Histograms<StoreLabels> = Family::new_with_constructor(latency);
        // prometheus-client ends each help text with a period, and writes a
        // counter registered as `x` as samples `x_total`.
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, resource and code",
            request_duration.clone(),
        );
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, resource and HTTP response code",
            requests.clone(),
        );
        registry.register(
            "apiserver_current_watchers",
            "Number of currently open watch requests",
            watchers.clone(),
        );
        registry.register(
            "skiff_store_operation_duration_seconds",
            "Latency of store operations by backend and operation",
            store_ops.clone(),
        );
        // Upstream labels the errors by backend; the log is the only one.
        // A counter's clones share its value.
        let audit_errors = Family::<PluginLabels, Counter>::default();
        let audit = crate::apiserver::audit::Counters {
            events: Counter::default(),
            errors: audit_errors
                .get_or_create(&PluginLabels { plugin: "log" })
                .clone(),
        };
        registry.register(
            "apiserver_audit_event",
            "Counter of audit events generated and sent to the audit backend",
            audit.events.clone(),
        );
        registry.register(
            "apiserver_audit_error",
            "Counter of audit events that failed to be audited properly",
            audit_errors,
        );
        let webhooks = crate::apiserver::webhook::Counters {
            duration: Family::new_with_constructor(latency),
            rejections: Family::default(),
        };
        registry.register(
            "apiserver_admission_webhook_admission_duration_seconds",
            "Admission webhook latency histogram in seconds, identified by name and broken out for each operation and API resource and type (validate or admit)",
            webhooks.duration.clone(),
        );
        // prometheus-client writes a counter's samples as `NAME_total`,
        // where upstream's for this one have no suffix.
        registry.register(
            "apiserver_admission_webhook_rejection_count",
            "Admission webhook rejection count, identified by name and broken out for each admission type (validating or admit) and operation",
            webhooks.rejections.clone(),
        );
        Metrics {
            registry,
            request_duration,
            requests,
            watchers,
            store_ops,
            audit,
            webhooks,
        }
    }
}

/// Decrements the watcher gauge when dropped (the watch stream ended).
pub struct WatcherGuard<'a>(&'a Metrics);

impl Drop for WatcherGuard<'_> {
    fn drop(&mut self) {
        self.0.watchers.dec();
    }
}

impl Metrics {
    /// Record one served request; 401s go under
    /// [`RequestKind::UNAUTHENTICATED`] whatever `kind` says.
    pub fn observe_request(&self, kind: RequestKind, code: u16, took: Duration) {
        let kind = if code == 401 {
            RequestKind::UNAUTHENTICATED
        } else {
            kind
        };
        let labels = RequestLabels {
            verb: kind.verb,
            resource: kind.resource,
            code,
        };
        self.request_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.requests.get_or_create(&labels).inc();
    }

    pub fn observe_store(&self, backend: &'static str, op: &'static str, took: Duration) {
        let labels = StoreLabels {
            backend,
            operation: op,
        };
        self.store_ops
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// The admission webhooks' metrics (shared with this registry).
    pub fn webhooks(&self) -> crate::apiserver::webhook::Counters {
        self.webhooks.clone()
    }

    /// The audit log's counters (shared with this registry).
    pub fn audit(&self) -> crate::apiserver::audit::Counters {
        self.audit.clone()
    }

    pub fn watcher(&self) -> WatcherGuard<'_> {
        self.watchers.inc();
        WatcherGuard(self)
    }

    pub fn current_watchers(&self) -> i64 {
        self.watchers.get()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A [`Store`] that records each operation's latency.
pub struct MeteredStore {
    inner: Arc<dyn crate::store::Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn crate::store::Store>, metrics: Arc<Metrics>) -> Self {
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
    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> crate::store::Result<crate::store::KeyValue> {
        self.timed("create", self.inner.create_with_ttl(key, value, ttl))
            .await
    }
    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> crate::store::Result<crate::store::KeyValue> {
        self.timed(
            "update",
            self.inner
                .update_with_ttl(key, value, expected_revision, ttl),
        )
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

    fn kind(method: Method, path: &str) -> RequestKind {
        RequestKind::of(&method, &request::parse_path(path), &Query::default())
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.observe_request(
            kind(Method::GET, "/api/v1/pods"),
            200,
            Duration::from_millis(3),
        );
        m.observe_store("sqlite", "list", Duration::from_millis(1));
        {
            let _w = m.watcher();
            assert!(m.render().contains("apiserver_current_watchers 1"));
        }
        let text = m.render();
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"LIST\",resource=\"pods\",code=\"200\"} 1"
            ),
            "{text}"
        );
        // prometheus-client writes `le` before the family's labels.
        assert!(text.contains("apiserver_request_duration_seconds_bucket{le=\"0.005\",verb=\"LIST\",resource=\"pods\",code=\"200\"} 1"), "{text}");
        assert!(text.contains("apiserver_request_duration_seconds_bucket{le=\"+Inf\",verb=\"LIST\",resource=\"pods\",code=\"200\"} 1"));
        assert!(text.contains("apiserver_request_duration_seconds_count{verb=\"LIST\",resource=\"pods\",code=\"200\"} 1"));
        assert!(text.contains("# TYPE apiserver_request_duration_seconds histogram"));
        assert!(text.contains(
            "# HELP apiserver_current_watchers Number of currently open watch requests.\n"
        ));
        assert!(text.contains("apiserver_current_watchers 0"));
        assert!(text.contains(
            "skiff_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"list\"} 1"
        ));
    }

    #[test]
    fn labels_come_from_the_route() {
        assert_eq!(
            kind(Method::GET, "/apis/apps/v1/namespaces/a/deployments/d"),
            RequestKind {
                verb: "GET",
                resource: "deployments"
            }
        );
        assert_eq!(
            kind(Method::GET, "/api/v1/inj\"},evil=\"1"),
            RequestKind {
                verb: "LIST",
                resource: "unknown"
            }
        );
        assert_eq!(
            kind(Method::from_bytes(b"BREW").unwrap(), "/healthz"),
            RequestKind {
                verb: "UNKNOWN",
                resource: ""
            }
        );
        assert_eq!(
            kind(Method::POST, "/version"),
            RequestKind {
                verb: "POST",
                resource: ""
            }
        );
    }

    #[test]
    fn unauthenticated_requests_share_one_label_set() {
        let m = Metrics::default();
        for path in ["/api/v1/pods", "/api/v1/x1", "/random"] {
            m.observe_request(kind(Method::GET, path), 401, Duration::ZERO);
        }
        let text = m.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total"))
            .collect();
        assert_eq!(
            series,
            ["apiserver_request_total{verb=\"UNKNOWN\",resource=\"unknown\",code=\"401\"} 3"]
        );
    }
}
