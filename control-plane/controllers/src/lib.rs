//! The controller manager: level-triggered reconcile loops over the API,
//! each in its own module, all run by [`run`] with one client identity
//! (`system:kube-controller-manager`).
//!
//! Every controller reads the same caches: [`Ctx::informers`] holds one
//! informer (one watch) per kind for the whole manager, as client-go's
//! shared informer factory does. Selectors, taints and events are
//! `kube_util`'s, shared with the scheduler.
#![forbid(unsafe_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

pub mod certificates;
pub mod cidrset;
pub mod cronjob;
pub mod daemonset;
mod daemonset_surge;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
pub mod gc;
pub mod job;
pub mod job_index;
pub mod job_policy;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod pods;
pub mod reconciler;
pub mod replicaset;
pub mod replicationcontroller;
pub mod resourcequota;
pub mod rootcacert;
pub mod served;
pub mod serviceaccount;
pub mod serviceaccounttoken;
pub mod statefulset;
pub mod tokencleaner;
pub mod volume;
pub mod workload;
pub mod workload_claim;
pub mod workload_expectations;
pub mod workload_hash;
pub mod workload_job;
pub mod workload_revision;
pub mod workload_rollout;

/// Every controller, by the name `--controllers` uses.
pub const ALL: &[&str] = &[
    "deployment",
    "replicaset",
    "daemonset",
    "statefulset",
    "replicationcontroller",
    "job",
    "cronjob",
    "disruption",
    "resourcequota",
    "nodelifecycle",
    "garbagecollector",
    "namespace",
    "endpointslice",
    "nodeipam",
    "csrapproving",
    "csrsigning",
    "tokencleaner",
    "serviceaccount-token",
    "serviceaccount",
    "root-ca-cert-publisher",
    "persistentvolume-binder",
    "persistentvolume-expander",
    "pvc-protection",
    "pv-protection",
    "ephemeral-volume",
];

/// Controller manager settings (flag names as kube-controller-manager's).
#[derive(Debug, Clone)]
pub struct Config {
    /// Which controllers run: names from [`ALL`], `*` for all, `-name` to
    /// leave one out.
    pub controllers: Vec<String>,
    /// `--cluster-cidr`: node podCIDRs are carved from it; `None` disables
    /// node IPAM.
    pub cluster_cidr: Option<String>,
    /// `--node-cidr-mask-size`.
    pub node_cidr_mask_size: u8,
    /// `--node-monitor-period`: how often node health is checked.
    pub node_monitor_period: Duration,
    /// `--node-monitor-grace-period`: a node whose Lease is older than this
    /// is marked Ready=Unknown.
    pub node_monitor_grace_period: Duration,
    /// `--cluster-signing-cert-file` / `-key-file`: the CA that the
    /// `csrsigning` controller issues certificates with; None disables it.
    pub signing: Option<Arc<SigningCa>>,
    /// `--cluster-signing-duration`: the longest certificate it issues.
    pub cluster_signing_duration: Duration,
    /// `--root-ca-file`: the CA bundle pods are given to trust the API
    /// server with (token Secrets' and `kube-root-ca.crt`'s `ca.crt`).
    pub root_ca_pem: Option<String>,
    /// `--service-account-private-key-file`: signs legacy tokens; None
    /// disables the `serviceaccount-token` controller.
    pub token_signer: Option<Arc<dyn serviceaccounttoken::LegacyTokenSigner>>,
}

/// A CA certificate and its private key (PEM).
pub struct SigningCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SigningCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningCa(<key redacted>)")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            controllers: vec!["*".into()],
            cluster_cidr: None,
            node_cidr_mask_size: 24,
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: Duration::from_secs(40),
            signing: None,
            // Upstream's default: a year.
            cluster_signing_duration: Duration::from_secs(365 * 24 * 3600),
            root_ca_pem: None,
            token_signer: None,
        }
    }
}

impl Config {
    /// Whether controller `name` is enabled by `controllers`.
    pub fn enabled(&self, name: &str) -> bool {
        let mut on = false;
        for c in &self.controllers {
            match c.as_str() {
                "*" => on = true,
                c if c.strip_prefix('-') == Some(name) => return false,
                c if c == name => on = true,
                _ => {}
            }
        }
        on
    }
}

/// Errors a controller loop ends with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Config(String),
}

/// What every controller gets.
#[derive(Clone)]
pub struct Ctx {
    pub client: kube::Client,
    pub config: Arc<Config>,
    /// The manager's informers, one per kind (and scope), shared by
    /// every controller and kept across a controller's restart.
    pub informers: kube_util::Factory,
}

/// Run the enabled controllers until `shutdown` resolves. A controller
/// that fails is logged and started again after a pause: one broken loop
/// must not take the others down.
pub async fn run(client: kube::Client, config: Config, shutdown: impl Future<Output = ()>) {
    let ctx = Ctx {
        informers: kube_util::Factory::new(client.clone()),
        client,
        config: Arc::new(config),
    };
    let mut tasks = JoinSet::new();
    for &name in ALL {
        if !ctx.config.enabled(name) {
            continue;
        }
        let ctx = ctx.clone();
        tasks.spawn(async move {
            loop {
                let res = match name {
                    "deployment" => deployment::run(ctx.clone()).await,
                    "replicaset" => replicaset::run(ctx.clone()).await,
                    "daemonset" => daemonset::run(ctx.clone()).await,
                    "statefulset" => statefulset::run(ctx.clone()).await,
                    "replicationcontroller" => replicationcontroller::run(ctx.clone()).await,
                    "job" => job::run(ctx.clone()).await,
                    "cronjob" => cronjob::run(ctx.clone()).await,
                    "disruption" => disruption::run(ctx.clone()).await,
                    "resourcequota" => resourcequota::run(ctx.clone()).await,
                    "nodelifecycle" => nodelifecycle::run(ctx.clone()).await,
                    "garbagecollector" => gc::run(ctx.clone()).await,
                    "namespace" => namespace::run(ctx.clone()).await,
                    "endpointslice" => endpointslice::run(ctx.clone()).await,
                    "nodeipam" => nodeipam::run(ctx.clone()).await,
                    "csrapproving" => certificates::approve::run(ctx.clone()).await,
                    "csrsigning" => certificates::sign::run(ctx.clone()).await,
                    "tokencleaner" => tokencleaner::run(ctx.clone()).await,
                    "serviceaccount-token" => serviceaccounttoken::run(ctx.clone()).await,
                    "serviceaccount" => serviceaccount::run(ctx.clone()).await,
                    "root-ca-cert-publisher" => rootcacert::run(ctx.clone()).await,
                    "persistentvolume-binder" => volume::binder::run(ctx.clone()).await,
                    "persistentvolume-expander" => volume::expand::run(ctx.clone()).await,
                    "pvc-protection" => volume::protection::run_pvc(ctx.clone()).await,
                    "pv-protection" => volume::protection::run_pv(ctx.clone()).await,
                    "ephemeral-volume" => volume::ephemeral::run(ctx.clone()).await,
                    _ => unreachable!("every name in ALL is matched"),
                };
                match res {
                    Ok(()) => return,
                    Err(e) => tracing::error!(
                        controller = name,
                        "controller failed, restarting in 5s: {e}"
                    ),
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }
    tracing::info!(controllers = tasks.len(), "controller manager started");
    shutdown.await;
    tasks.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_selection_follows_kube_controller_manager() {
        let c = |v: &[&str]| Config {
            controllers: v.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        };
        assert!(c(&["*"]).enabled("job"));
        assert!(!c(&["*", "-job"]).enabled("job"));
        assert!(c(&["*", "-job"]).enabled("deployment"));
        assert!(c(&["job"]).enabled("job"));
        assert!(!c(&["job"]).enabled("deployment"));
    }
}
