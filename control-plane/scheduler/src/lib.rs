//! The scheduler: for each pod without a node, filter the nodes, score the
//! ones left, and bind through pods/binding.

use std::future::Future;

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Pods whose `spec.schedulerName` is this are ours.
    pub scheduler_name: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scheduler_name: "default-scheduler".into(),
        }
    }
}

/// Schedule pods until `shutdown` resolves.
pub async fn run(_client: kube::Client, _config: Config, shutdown: impl Future<Output = ()>) {
    shutdown.await;
}
