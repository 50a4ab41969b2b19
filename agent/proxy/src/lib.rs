//! The service proxy, in kube-proxy's role: Services and EndpointSlices
//! from the API become packet rules on this node, in nftables (default)
//! or iptables.
//!
//! # Layout
//! - [`model`]: Service ports and endpoints as the proxy sees them, and
//!   which endpoints traffic may use.
//! - [`state`]: what the watchers delivered, and what changed since the
//!   last sync.
//! - [`source`]: the Service and EndpointSlice watchers (whose stores the
//!   cluster DNS reads too).
//! - [`slots`]: stable load-balancing slots, so that an endpoint change
//!   costs one or two map elements.
//! - [`nftables`] and [`iptables`]: the two proxiers, each turning
//!   changes into one transaction of its tool.
//! - [`conntrack`]: stale UDP conntrack entries, cleared after a sync.
//! - [`exec`]: running `nft` / `iptables-restore`.
//! - [`health`]: `/healthz` and `/metrics` on kube-proxy's ports.
//! - [`metrics`]: kube-proxy's sync metrics.
//!
//! The sync loop ([`run`]) is level-triggered: it waits until both
//! watchers have listed, does one full sync (replacing whatever a
//! previous run left), then applies changes as they come, at most once
//! per `min_sync_period`, with a periodic repairing full sync.
#![forbid(unsafe_code)]

pub mod conntrack;
pub mod exec;
pub mod health;
pub mod iptables;
pub mod metrics;
pub mod model;
pub mod nftables;
pub mod slots;
pub mod source;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use self::model::{Protocol, ServicePort, ServicePortName, Targets};

/// Errors that stop the proxy from starting, or a cleanup from finishing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown proxy mode {0:?} (expected nftables, iptables or none)")]
    Mode(String),
    #[error("cannot listen on {address} for the proxy's {what}: {source}")]
    Listen {
        what: &'static str,
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Exec(#[from] exec::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `--proxy-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Nftables,
    Iptables,
    None,
}

impl std::str::FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Mode> {
        match s {
            "nftables" | "" => Ok(Mode::Nftables),
            "iptables" => Ok(Mode::Iptables),
            "none" => Ok(Mode::None),
            other => Err(Error::Mode(other.to_string())),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Nftables => "nftables",
            Mode::Iptables => "iptables",
            Mode::None => "none",
        })
    }
}

/// The proxy's settings (KubeProxyConfiguration's names where one
/// exists).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub mode: Mode,
    pub node_name: String,
    /// Changes arriving closer together than this share one sync.
    pub min_sync_period: Duration,
    /// How often everything is rewritten, repairing any tampering.
    pub sync_period: Duration,
    /// `/healthz` (kube-proxy's 10256); None turns it off.
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// `/metrics` (kube-proxy's 10249); None turns it off.
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// What `/metrics` serves: the proxy's own metrics by default; a
    /// process that runs the proxy beside other work (the agent) renders
    /// its whole registry, as kube-proxy serves its process's metrics.
    pub render_metrics: fn() -> String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: Mode::Nftables,
            node_name: String::new(),
            min_sync_period: Duration::from_millis(100),
            sync_period: Duration::from_secs(3600),
            healthz_bind_address: Some(([0, 0, 0, 0], 10256).into()),
            metrics_bind_address: Some(([127, 0, 0, 1], 10249).into()),
            render_metrics: metrics::render,
        }
    }
}

/// One changed Service: its ports as they are now (none once deleted).
#[derive(Debug, Clone)]
pub struct Change {
    pub namespace: String,
    pub name: String,
    pub ports: Vec<(ServicePort, Targets)>,
}

impl Change {
    /// The ports among `known` that belong to the changed Service, those
    /// it no longer has included. A Service's ports sort together (the
    /// name orders by namespace, then name), so this reads only them: a
    /// change costs the same among ten Services or ten thousand.
    pub fn known_ports<V>(&self, known: &BTreeMap<ServicePortName, V>) -> Vec<ServicePortName> {
        let first = ServicePortName {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            // The least port name and protocol: the Service's first key.
            port: String::new(),
            protocol: Protocol::Tcp,
        };
        known
            .range(first..)
            .map(|(p, _)| p)
            .take_while(|p| p.namespace == self.namespace && p.name == self.name)
            .cloned()
            .collect()
    }
}

/// What a sync wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub service_ports: usize,
    pub elements: usize,
    pub chains: usize,
}

/// What both proxiers keep besides their rules: the node's pod CIDR
/// (traffic from it is the node's own pods) and whether the kernel holds
/// what they wrote.
#[derive(Debug, Default)]
pub struct Basis {
    pub local_cidr: Option<String>,
    /// False until a full sync succeeded, and again after a failed one.
    synced: bool,
}

impl Basis {
    pub fn new(local_cidr: Option<String>) -> Basis {
        Basis {
            local_cidr,
            synced: false,
        }
    }

    /// Whether the next sync must be a full one.
    pub fn needs_full_sync(&self) -> bool {
        !self.synced
    }

    /// Forget the kernel state: the next sync writes everything.
    pub fn invalidate(&mut self) {
        self.synced = false;
    }

    /// The last script was applied.
    pub fn commit(&mut self) {
        self.synced = true;
    }

    /// A changed pod CIDR changes rules of every service: sync fully.
    pub fn set_local_cidr(&mut self, cidr: Option<String>) {
        if cidr != self.local_cidr {
            self.local_cidr = cidr;
            self.synced = false;
        }
    }
}

/// Either proxier, with how it applies its scripts.
pub enum Backend {
    Nftables(nftables::Proxier),
    Iptables(iptables::Proxier),
}

/// A sync's outcome, for metrics and health.
#[derive(Debug, Clone, Copy)]
pub struct Synced {
    pub full: bool,
    pub took: Duration,
    pub stats: SyncStats,
}

impl Backend {
    pub fn new(mode: Mode, local_cidr: Option<String>) -> Option<Backend> {
        match mode {
            Mode::Nftables => Some(Backend::Nftables(nftables::Proxier::new(local_cidr))),
            Mode::Iptables => Some(Backend::Iptables(iptables::Proxier::new(local_cidr))),
            Mode::None => None,
        }
    }

    fn basis(&self) -> &Basis {
        match self {
            Backend::Nftables(p) => &p.basis,
            Backend::Iptables(p) => &p.basis,
        }
    }

    fn basis_mut(&mut self) -> &mut Basis {
        match self {
            Backend::Nftables(p) => &mut p.basis,
            Backend::Iptables(p) => &mut p.basis,
        }
    }

    pub fn needs_full_sync(&self) -> bool {
        self.basis().needs_full_sync()
    }

    pub fn invalidate(&mut self) {
        self.basis_mut().invalidate();
    }

    pub fn set_local_cidr(&mut self, cidr: Option<String>) {
        self.basis_mut().set_local_cidr(cidr);
    }

    /// Rules (nftables: map elements and chains; iptables: chains) now
    /// programmed.
    pub fn programmed(&self) -> usize {
        match self {
            Backend::Nftables(p) => {
                let (elements, chains) = p.programmed();
                elements + chains
            }
            Backend::Iptables(p) => p.programmed(),
        }
    }

    /// Write everything. `repair` keeps kernel state that is not ours to
    /// rebuild (nftables affinity sets) instead of replacing the table.
    ///
    /// # Errors
    /// The tool failed; the proxier then forgets what it knew, so the next
    /// sync is a full one again.
    pub async fn full_sync(
        &mut self,
        all: &[(ServicePort, Targets)],
        repair: bool,
    ) -> Result<Synced> {
        let start = Instant::now();
        let existing = match self {
            Backend::Iptables(_) => iptables_existing().await,
            Backend::Nftables(_) => BTreeSet::new(),
        };
        let (text, stats) = self.full_script(all, repair, &existing);
        let mut result = self.load(&text).await.map(|_| stats);
        if result.is_ok() && matches!(self, Backend::Iptables(_)) {
            result = ensure_iptables_jumps().await.map(|()| stats);
        }
        self.settle(result, true, start)
    }

    /// Write what changed; Ok with zero stats when nothing did.
    ///
    /// # Errors
    /// As [`Self::full_sync`].
    pub async fn partial_sync(&mut self, changes: &[Change]) -> Result<Synced> {
        let start = Instant::now();
        let (text, stats) = self.partial_script(changes);
        let result = if text.is_empty() {
            Ok(stats)
        } else {
            self.load(&text).await.map(|_| stats)
        };
        self.settle(result, false, start)
    }

    /// The script that writes everything, which the proxier from now on
    /// takes as programmed (until [`Self::invalidate`]). `existing`: the
    /// iptables chains in the kernel, so that stale ones are deleted
    /// (nftables replaces or repairs its table instead).
    pub fn full_script(
        &mut self,
        all: &[(ServicePort, Targets)],
        repair: bool,
        existing: &BTreeSet<(iptables::Table, String)>,
    ) -> (String, SyncStats) {
        let all = all.iter().map(|(s, t)| (s, t));
        match self {
            Backend::Nftables(p) => {
                let mode = if repair && !p.basis.needs_full_sync() {
                    nftables::Full::Repair
                } else {
                    nftables::Full::Replace
                };
                p.full_sync(mode, all)
            }
            Backend::Iptables(p) => {
                let script = p.full_sync(all, existing);
                (script.text, script.stats)
            }
        }
    }

    /// The script for what changed; empty when nothing in the kernel needs
    /// to change.
    pub fn partial_script(&mut self, changes: &[Change]) -> (String, SyncStats) {
        match self {
            Backend::Nftables(p) => p.partial_sync(changes),
            Backend::Iptables(p) => {
                let script = p.partial_sync(changes);
                (script.text, script.stats)
            }
        }
    }

    /// Load a script of this backend's mode with its tool.
    ///
    /// # Errors
    /// The tool failed.
    pub async fn load(&self, script: &str) -> exec::Result<String> {
        match self {
            Backend::Nftables(_) => exec::nft(script).await,
            Backend::Iptables(_) => exec::iptables_restore(script).await,
        }
    }

    fn settle(
        &mut self,
        result: exec::Result<SyncStats>,
        full: bool,
        start: Instant,
    ) -> Result<Synced> {
        match result {
            Ok(stats) => {
                self.basis_mut().commit();
                Ok(Synced {
                    full,
                    took: start.elapsed(),
                    stats,
                })
            }
            Err(e) => {
                self.invalidate();
                Err(e.into())
            }
        }
    }
}

/// The proxy's chains now in the kernel, so that a full sync deletes
/// stale ones; none when iptables-save cannot run.
async fn iptables_existing() -> BTreeSet<(iptables::Table, String)> {
    let mut out = BTreeSet::new();
    for table in ["nat", "filter"] {
        if let Ok(text) = exec::run("iptables-save", &["-t", table], "").await {
            out.extend(iptables::existing_chains(&text));
        }
    }
    out
}

/// Make sure the built-in chains jump to the proxy's (check, else insert).
async fn ensure_iptables_jumps() -> exec::Result<()> {
    for (table, from, to) in iptables::JUMPS {
        // Declared empty first so that a jump never names a missing chain.
        let new_chain = ["-w", exec::LOCK_WAIT, "-t", table.name(), "-N", to];
        let _ = exec::run("iptables", &new_chain, "").await;
        let args = iptables::jump_args(*table, to);
        let rule: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut check = vec!["-w", exec::LOCK_WAIT, "-t", table.name(), "-C", from];
        check.extend(&rule);
        if exec::run("iptables", &check, "").await.is_ok() {
            continue;
        }
        let mut insert = vec!["-w", exec::LOCK_WAIT, "-t", table.name(), "-I", from];
        insert.extend(&rule);
        exec::run("iptables", &insert, "").await?;
    }
    Ok(())
}

/// The most copies of one jump rule `cleanup` deletes.
const MAX_JUMP_COPIES: usize = 100;

/// Remove everything either mode created (`--cleanup`, and at start for
/// the mode not in use): the nftables table, and the iptables jumps and
/// `SKIFF-` chains. Other tables and chains are left alone. A tool that is
/// not installed has nothing to clean.
///
/// # Errors
/// A tool that exists failed.
pub async fn cleanup(modes: &[Mode]) -> Result<()> {
    if modes.contains(&Mode::Nftables) && exec::available("nft").await {
        exec::nft(&nftables::cleanup_script()).await?;
    }
    if modes.contains(&Mode::Iptables) && exec::available("iptables").await {
        for (table, from, to) in iptables::JUMPS {
            let args = iptables::jump_args(*table, to);
            let rule: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut delete = vec!["-w", exec::LOCK_WAIT, "-t", table.name(), "-D", from];
            delete.extend(&rule);
            // Delete every copy; a missing rule ends the loop, and so does
            // the bound (no chain holds that many copies of our jump).
            let removed =
                exec::repeat_while_ok(MAX_JUMP_COPIES, || exec::run("iptables", &delete, "")).await;
            if removed == MAX_JUMP_COPIES {
                tracing::warn!(
                    table = table.name(),
                    chain = from,
                    "still deleting the proxy's jump after {MAX_JUMP_COPIES} copies; giving up"
                );
            }
        }
        let existing = iptables_existing().await;
        if !existing.is_empty() {
            let mut text = String::new();
            for table in [iptables::Table::Filter, iptables::Table::Nat] {
                let chains: Vec<&String> = existing
                    .iter()
                    .filter(|(t, _)| *t == table)
                    .map(|(_, c)| c)
                    .collect();
                if chains.is_empty() {
                    continue;
                }
                text.push_str(&format!("*{}\n", table.name()));
                for c in &chains {
                    text.push_str(&format!(":{c} - [0:0]\n"));
                }
                for c in &chains {
                    text.push_str(&format!("-X {c}\n"));
                }
                text.push_str("COMMIT\n");
            }
            exec::iptables_restore(&text).await?;
        }
    }
    Ok(())
}

/// Shared between the sync loop and the health endpoint.
#[derive(Debug, Default)]
pub struct Status {
    /// When the last successful sync ended.
    pub last_sync: Option<SystemTime>,
    /// When a change was first queued that no sync has applied yet.
    pub oldest_pending: Option<SystemTime>,
}

/// Run the proxy until `stop` resolves: sync what the watchers behind
/// `stores` deliver (see [`source::Source`]), and serve health. A health
/// port that cannot be bound is logged; the proxy runs without it.
pub async fn run(
    config: ProxyConfig,
    stores: source::Stores,
    mut pod_cidr: watch::Receiver<Option<String>>,
    stop: impl Future<Output = ()>,
) {
    let Some(mut backend) = Backend::new(config.mode, pod_cidr.borrow().clone()) else {
        return;
    };
    let other = match config.mode {
        Mode::Nftables => Mode::Iptables,
        _ => Mode::Nftables,
    };
    if let Err(e) = cleanup(&[other]).await {
        tracing::warn!(mode = %other, "could not remove rules of the other proxy mode: {e}");
    }
    let status = Arc::new(Mutex::new(Status::default()));
    let health = health::Health::new(status.clone(), config.render_metrics);
    let servers = health
        .bind(config.healthz_bind_address, config.metrics_bind_address)
        .await
        .unwrap_or_else(|e| {
            tracing::error!("{e}; the proxy runs without it");
            Vec::new()
        });
    let (stop_tx, stop_rx) = watch::channel(false);
    for server in servers {
        let mut rx = stop_rx.clone();
        tokio::spawn(server.serve(async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
    }
    let state = stores.state.clone();
    let notify = stores.notify.clone();
    tracing::info!(mode = %config.mode, node = %config.node_name, "service proxy starting");

    tokio::pin!(stop);
    let mut last_sync: Option<Instant> = None;
    let mut next_full = Instant::now() + config.sync_period;
    let mut retry = Duration::ZERO;
    let mut failing = false;
    let mut udp = conntrack::Tracker::default();
    loop {
        let mut repair = false;
        tokio::select! {
            () = &mut stop => break,
            () = notify.notified() => {}
            r = pod_cidr.changed() => {
                if r.is_ok() {
                    backend.set_local_cidr(pod_cidr.borrow_and_update().clone());
                }
            }
            () = tokio::time::sleep_until(next_full.into()) => repair = true,
            () = tokio::time::sleep(retry), if failing => {}
        }
        {
            let mut st = status.lock().unwrap_or_else(|p| p.into_inner());
            st.oldest_pending.get_or_insert_with(SystemTime::now);
        }
        if !state.lock().unwrap_or_else(|p| p.into_inner()).synced() {
            continue;
        }
        // Changes arriving within min_sync_period of the last sync wait
        // for the rest of it, and go together.
        if let Some(last) = last_sync {
            let ready_at = last + config.min_sync_period;
            if Instant::now() < ready_at {
                tokio::select! {
                    () = &mut stop => break,
                    () = tokio::time::sleep_until(ready_at.into()) => {}
                }
            }
        }
        let full = repair || backend.needs_full_sync();
        let result = if full {
            let (all, services) = {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                let all = st.all();
                (all, st.service_count())
            };
            next_full = Instant::now() + config.sync_period;
            let r = backend.full_sync(&all, repair).await;
            if r.is_ok() {
                conntrack::apply(&udp.replaced(&all)).await;
            }
            if let Ok(s) = &r {
                tracing::info!(
                    services,
                    service_ports = s.stats.service_ports,
                    took_ms = s.took.as_millis() as u64,
                    repair,
                    "proxy rules fully synced"
                );
            }
            r
        } else {
            let changes = state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take_changes();
            if changes.is_empty() {
                status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .oldest_pending = None;
                continue;
            }
            let r = backend.partial_sync(&changes).await;
            if r.is_ok() {
                conntrack::apply(&udp.changed(&changes)).await;
            }
            r
        };
        last_sync = Some(Instant::now());
        let m = metrics::metrics();
        {
            let st = state.lock().unwrap_or_else(|p| p.into_inner());
            m.changes(st.service_changes, st.endpoint_changes);
        }
        match result {
            Ok(synced) => {
                if failing {
                    tracing::info!("proxy rules synced again");
                }
                failing = false;
                retry = Duration::ZERO;
                m.sync_ok(synced.full, synced.took, backend.programmed());
                let mut st = status.lock().unwrap_or_else(|p| p.into_inner());
                st.last_sync = Some(SystemTime::now());
                st.oldest_pending = None;
            }
            Err(e) => {
                m.sync_error();
                retry = (retry * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
                tracing::error!(
                    "syncing proxy rules failed, retrying everything in {retry:?}: {e}"
                );
                failing = true;
            }
        }
    }
    let _ = stop_tx.send(true);
    tracing::info!("service proxy stopped; its rules stay in place");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(namespace: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
            protocol,
        }
    }

    #[test]
    fn known_ports_are_the_changed_services_and_only_them() {
        let names = [
            port("a", "b", "", Protocol::Udp),
            port("a", "b", "dns", Protocol::Tcp),
            port("a", "b", "dns", Protocol::Udp),
            port("a", "b-x", "", Protocol::Tcp),
            port("a", "a", "z", Protocol::Sctp),
            port("ab", "b", "", Protocol::Tcp),
            port("a-b", "", "", Protocol::Tcp),
        ];
        let known: BTreeMap<ServicePortName, ()> = names.iter().map(|n| (n.clone(), ())).collect();
        let change = |namespace: &str, name: &str| Change {
            namespace: namespace.into(),
            name: name.into(),
            ports: Vec::new(),
        };
        assert_eq!(change("a", "b").known_ports(&known), names[..3].to_vec());
        assert_eq!(change("a", "b-x").known_ports(&known), names[3..4].to_vec());
        assert_eq!(change("ab", "b").known_ports(&known), names[5..6].to_vec());
        assert!(change("a", "c").known_ports(&known).is_empty());
        assert!(change("b", "b").known_ports(&known).is_empty());
    }
}
