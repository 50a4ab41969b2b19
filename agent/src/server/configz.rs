//! `/configz` on the node server: the configuration the agent runs with,
//! as the kubelet shows it (`{"kubeletconfig": KubeletConfiguration}`),
//! for `kubectl get --raw /api/v1/nodes/NAME/proxy/configz` and the
//! tools that read it. Only the settings that mean the same as the
//! kubelet's fields are listed, under the kubelet's names; durations are
//! Go durations (`10s`, `1m0s`) as in the kubelet's answer.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use kube_util::duration::format_go;
use serde_json::{json, Value};

use super::readonly::ServerState;
use crate::config::Config;

pub fn routes(state: ServerState) -> Router {
    Router::new()
        .route("/configz", get(configz))
        .with_state(state)
}

async fn configz(State(s): State<ServerState>) -> Json<Value> {
    Json(json!({ "kubeletconfig": kubelet_configuration(&s.shared.config) }))
}

/// `c` as the fields of KubeletConfiguration that skiff has.
fn kubelet_configuration(c: &Config) -> Value {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut v = json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "syncFrequency": format_go(c.sync_frequency),
        "address": c.address.to_string(),
        "port": c.port,
        "readOnlyPort": c.status_address.map_or(0, |a| a.port()),
        "rotateCertificates": c.rotate_certificates,
        "serverTLSBootstrap": c.rotate_server_certificates,
        "authentication": {
            "x509": {"clientCAFile": c.client_ca_file.as_deref().map(path).unwrap_or_default()},
            "anonymous": {"enabled": false},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": c.cluster_domain,
        "clusterDNS": c.cluster_dns,
        "nodeStatusUpdateFrequency": format_go(c.node_status_update_frequency),
        "nodeStatusReportFrequency": format_go(c.node_status_report_frequency),
        "nodeLeaseDurationSeconds": c.node_lease_duration_seconds,
        "runtimeRequestTimeout": format_go(c.runtime_request_timeout),
        "resolvConf": path(&c.resolv_conf),
        "maxPods": c.max_pods,
        "containerLogMaxFiles": c.container_log_max_files,
        "containerLogMonitorInterval": format_go(c.container_log_monitor_interval),
        "imageGCHighThresholdPercent": c.image_gc.high_threshold_percent,
        "imageGCLowThresholdPercent": c.image_gc.low_threshold_percent,
        "imageMinimumGCAge": format_go(c.image_gc.min_age),
        "imageMaximumGCAge": format_go(c.image_gc.max_age),
        "containerRuntimeEndpoint": c.container_runtime_endpoint,
        "podLogsDir": path(&c.pod_log_dir),
        "registerNode": c.register_node,
        "shutdownGracePeriod": format_go(c.shutdown_grace_period),
        "shutdownGracePeriodCriticalPods": format_go(c.shutdown_grace_period_critical_pods),
        "enableSystemLogHandler": true,
    });
    let optional = [
        ("staticPodPath", c.static_pod_path.as_deref().map(path)),
        ("tlsCertFile", c.tls_cert_file.as_deref().map(path)),
        (
            "tlsPrivateKeyFile",
            c.tls_private_key_file.as_deref().map(path),
        ),
        ("podCIDR", c.pod_cidr.clone()),
        // The kubelet writes sizes as quantities; bytes are one.
        (
            "containerLogMaxSize",
            c.container_log_max_size.map(|b| b.to_string()),
        ),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            v[key] = Value::String(value);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_names_and_go_durations() {
        let c = crate::config::Settings::default().resolve();
        let v = kubelet_configuration(&c);
        assert_eq!(v["kind"], "KubeletConfiguration");
        assert_eq!(v["syncFrequency"], "10s");
        assert_eq!(v["maxPods"], 110);
        assert_eq!(v["readOnlyPort"], 10255);
        assert_eq!(v["containerLogMaxSize"], "10485760");
        assert!(v.get("staticPodPath").is_none(), "{v}");
    }
}
