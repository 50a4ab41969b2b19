//! The scheduler and the controller manager, run inside skiff-server the
//! way k3s does, but as API clients over loopback, each with its own
//! client certificate (`system:kube-scheduler`,
//! `system:kube-controller-manager`), so RBAC and the API's semantics
//! apply to them exactly as to any other client.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::apiserver::health::ComponentHealth;
use crate::config::Config;
use crate::leader;
use crate::pki::{self, Pki};

/// Why a component could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error(transparent)]
    ServiceAccountKeys(#[from] crate::auth::satoken::Error),
    #[error("building the {user} client: {source}")]
    Kubeconfig {
        user: &'static str,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building the {user} client: {source}")]
    Client {
        user: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Their names in `componentstatuses`, as upstream's.
const SCHEDULER: &str = "scheduler";
const CONTROLLER_MANAGER: &str = "controller-manager";

/// The running components; dropping it does not stop them, `shutdown` does.
pub struct Components {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Components {
    /// Stop every component and wait for them.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// A client for `user` in `groups`, signed by the cluster CA, talking
/// to `url`.
async fn client(
    pki: &Pki,
    url: &str,
    user: &'static str,
    groups: &[String],
) -> Result<kube::Client, Error> {
    let text = pki.kubeconfig(url, user, groups)?;
    let kc = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|source| Error::Kubeconfig { user, source })?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Kubeconfig { user, source })?;
    // The API server records each component's writes under its name
    // (managedFields), as upstream's `kube-scheduler/v1.33.0 ...`.
    let name = user.trim_start_matches("system:");
    let agent = format!("{name}/skiff-{}", env!("CARGO_PKG_VERSION"));
    if let Ok(v) = http::HeaderValue::from_str(&agent) {
        cfg.headers.push((http::header::USER_AGENT, v));
    }
    kube::Client::try_from(cfg).map_err(|source| Error::Client { user, source })
}

/// Until `done` turns true (owning it, as the components' shutdown
/// futures must).
async fn until(mut done: watch::Receiver<bool>) {
    leader::stopped(&mut done).await;
}

/// Run `work` until `stop`: under the Lease `lease` when `elect` names
/// this server (only while it leads; its identity is upstream's
/// `NAME_UUID`), else at once. `work` is handed the signal to
/// stop on: the server stopping, or the Lease lost.
async fn under_lease<W, Fut>(
    elect: Option<String>,
    client: kube::Client,
    lease: &str,
    stop: watch::Receiver<bool>,
    work: W,
) where
    W: Fn(watch::Receiver<bool>) -> Fut + Send,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if let Some(name) = elect {
        let identity = leader::identity(&name);
        leader::Elector::new(client, lease, identity, leader::Timing::default())
            .run(stop, work)
            .await;
    } else {
        work(stop).await;
    }
}

/// Start what `cfg` enables against the server at `url`, reporting
/// whether each runs in `health` (`componentstatuses`).
///
/// # Errors
/// The CA cannot sign the components' certificates.
pub async fn start(
    cfg: &Config,
    data_dir: &Path,
    url: &str,
    health: Arc<ComponentHealth>,
) -> Result<Components, Error> {
    let pki = Pki::load_or_create(data_dir)?;
    let (stop, _) = watch::channel(false);
    let mut tasks = JoinSet::new();
    if cfg.disable_scheduler {
        health.set(
            SCHEDULER,
            Err("not running here (--disable-scheduler)".into()),
        );
    } else {
        let c = client(&pki, url, "system:kube-scheduler", &[]).await?;
        let config = cfg.scheduler.clone();
        let work = {
            let c = c.clone();
            move |done| skiff_scheduler::run(c.clone(), config.clone(), until(done))
        };
        tasks.spawn(health.track(
            SCHEDULER,
            under_lease(
                cfg.leader_elect.then(|| cfg.node_name.clone()),
                c,
                "kube-scheduler",
                stop.subscribe(),
                work,
            ),
        ));
    }
    if cfg.disable_controller_manager {
        health.set(
            CONTROLLER_MANAGER,
            Err("not running here (--disable-controller-manager)".into()),
        );
    } else {
        let c = client(&pki, url, "system:kube-controller-manager", &[]).await?;
        let controllers = skiff_controllers::Config {
            controllers: cfg.controllers.clone(),
            cluster_cidr: Some(cfg.cluster_cidr.clone()),
            node_cidr_mask_size: cfg.node_cidr_mask_size,
            node_monitor_period: cfg.node_monitor_period,
            node_monitor_grace_period: cfg.node_monitor_grace_period,
            signing: Some(Arc::new(skiff_controllers::SigningCa {
                cert_pem: pki.ca_pem().to_string(),
                key_pem: pki.ca_key_pem().to_string(),
            })),
            cluster_signing_duration: cfg.cluster_signing_duration,
            root_ca_pem: Some(pki.ca_pem().to_string()),
            token_signer: Some(Arc::new(crate::auth::satoken::Tokens::load(
                &cfg.service_accounts,
            )?)),
        };
        let work = {
            let c = c.clone();
            move |done| skiff_controllers::run(c.clone(), controllers.clone(), until(done))
        };
        tasks.spawn(health.track(
            CONTROLLER_MANAGER,
            under_lease(
                cfg.leader_elect.then(|| cfg.node_name.clone()),
                c,
                "kube-controller-manager",
                stop.subscribe(),
                work,
            ),
        ));
    }
    if let (Some(m), Some(etcd)) = (&cfg.managed_etcd, crate::store::managed::Etcd::of(cfg)) {
        // The server itself, not a controller: it runs on every server,
        // with no Lease, and may remove etcd members.
        let c = client(&pki, url, "system:skiff-server", &["system:masters".into()]).await?;
        tasks.spawn(crate::store::managed::nodes::run(
            c,
            m.name.clone(),
            etcd,
            stop.subscribe(),
        ));
    }
    Ok(Components { stop, tasks })
}
