//! Events about pods, with the kubelet's reasons (Pulling, Pulled, Created,
//! Started, Killing, BackOff, Failed). Recorded as structured log lines
//! today; the API recorder joins when the agent talks to an API server.

use k8s_openapi::api::core::v1::Pod;

use crate::pod::PodExt;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Where pod events go.
pub trait Recorder: Send + Sync {
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str);
}

/// Writes each event as one log line.
pub struct LogRecorder;

impl Recorder for LogRecorder {
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        if type_ == WARNING {
            tracing::warn!(pod = %pod.key(), reason, "{message}");
        } else {
            tracing::info!(pod = %pod.key(), reason, "{message}");
        }
    }
}
