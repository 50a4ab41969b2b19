//! A private containerd per test: its own root, state, socket, CNI network
//! (bridge + /24 of 198.18.0.0/16) and runc root, torn down completely when
//! the fixture is dropped.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let containerd = skiff_tests::Containerd::start().await?;
//! let version = containerd.client().version(Default::default()).await?;
//! containerd.cleanup().await?; // or just drop it
//! # Ok(()) }
//! ```

use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cri_proto::{v1, CriClient};

use crate::cleanup::{self, RunLock, RunRecord, TEST_ROOT};
use crate::images::{self, Images};
use crate::registry::Registry;

/// Time containerd gets to report RuntimeReady and NetworkReady.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline of the fixture's CRI client.
const CRI_TIMEOUT: Duration = Duration::from_secs(20);
/// Grace period between SIGTERM and SIGKILL for containerd.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Debian's crun as containerd's `crun` runtime handler runs it: through
/// the repository's wrapper, since crun 1.8 refuses these machines'
/// hybrid cgroup layout (see the script).
pub const CRUN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/crun-hybrid");
/// CNI plugins of containernetworking-plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Third octets handed out to fixtures: 198.18.100.0/24 .. 198.18.254.0/24.
/// The lower part of 198.18.0.0/16 is left to cluster fixtures that give
/// nodes pod CIDRs inside network namespaces.
const SUBNET_RANGE: std::ops::RangeInclusive<u8> = 100..=254;

/// Options for [`Containerd`]; start with [`Containerd::builder`].
#[derive(Debug, Clone)]
pub struct ContainerdBuilder {
    mirrors: Vec<(String, Vec<String>)>,
    extra_config: String,
    default_images: bool,
    snapshotter: Option<String>,
    ready_timeout: Duration,
    /// Set by [`ContainerdBuilder::external_cni`]: the subnet someone else
    /// leased and configures.
    external_subnet: Option<u8>,
    /// Run containerd in this network namespace (`/run/netns/NAME`).
    netns: Option<PathBuf>,
}

impl Default for ContainerdBuilder {
    fn default() -> Self {
        ContainerdBuilder {
            mirrors: Vec::new(),
            extra_config: String::new(),
            default_images: true,
            snapshotter: None,
            ready_timeout: READY_TIMEOUT,
            external_subnet: None,
            netns: None,
        }
    }
}

impl ContainerdBuilder {
    /// Pull `host` (for example `127.0.0.1:5000`) through `endpoints`
    /// (`http://...` for plain HTTP), via the CRI plugin's
    /// `registry.mirrors` table (containerd 1.6; deprecated but honoured in
    /// 1.7).
    pub fn registry_mirror(mut self, host: impl Into<String>, endpoint: impl Into<String>) -> Self {
        let host = host.into();
        let endpoint = endpoint.into();
        match self.mirrors.iter_mut().find(|(h, _)| *h == host) {
            Some((_, eps)) => eps.push(endpoint),
            None => self.mirrors.push((host, vec![endpoint])),
        }
        self
    }

    /// Lets containerd pull from a loopback [`Registry`] over plain HTTP.
    ///
    /// containerd 1.6.20 already falls back to plain HTTP for `127.0.0.1`
    /// hosts without any configuration; the explicit mirror keeps that true
    /// for runtimes and versions that do not.
    pub fn registry(self, registry: &Registry) -> Self {
        let host = registry.host();
        let endpoint = format!("http://{host}");
        self.registry_mirror(host, endpoint)
    }

    /// TOML appended verbatim to the generated config. It must only add
    /// tables that the generated config does not define (TOML forbids
    /// defining a table twice); see [`Containerd::config_path`] for the file.
    pub fn extra_config(mut self, toml: impl AsRef<str>) -> Self {
        self.extra_config.push_str(toml.as_ref());
        self.extra_config.push('\n');
        self
    }

    /// Do not side-load the pause and toolbox images at start (the pause
    /// image is still configured as `sandbox_image`).
    pub fn without_default_images(mut self) -> Self {
        self.default_images = false;
        self
    }

    /// Force a snapshotter instead of detecting overlayfs support.
    pub fn snapshotter(mut self, name: impl Into<String>) -> Self {
        self.snapshotter = Some(name.into());
        self
    }

    /// How long to wait for CRI readiness (default 30 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The pod network is configured by someone else, as on a real node
    /// where the agent writes the CNI configuration for the podCIDR the
    /// control plane assigned: no conflist is written into
    /// [`Containerd::cni_conf_dir`], and start waits for RuntimeReady only
    /// (containerd reports NetworkReady once a configuration appears).
    ///
    /// `subnet_index` (198.18.X.0/24, leased by the caller, who also
    /// releases it) is recorded as the run's subnet, so cleanup still
    /// removes the network namespaces and firewall rules of addresses in
    /// it; the CNI network must use [`Containerd::bridge`] as its bridge
    /// (and name), which cleanup deletes. [`Containerd::set_subnet`]
    /// corrects the subnet once the real one is known.
    pub fn external_cni(mut self, subnet_index: u8) -> Self {
        self.external_subnet = Some(subnet_index);
        self
    }

    /// Run containerd inside the network namespace pinned at `path` (only
    /// the network namespace is entered, see DESIGN.md): its pods' network
    /// (bridge, veths, portmap rules) lives there, as on a node.
    pub fn netns(mut self, path: impl Into<PathBuf>) -> Self {
        self.netns = Some(path.into());
        self
    }

    /// Creates the run directory, config and CNI network, starts containerd,
    /// waits for RuntimeReady and NetworkReady and side-loads the default
    /// images. Sweeps stale runs of dead test processes first.
    ///
    /// # Errors
    /// Fails when not root, when no subnet is free, when containerd does not
    /// become ready (the error carries the tail of its log) or an image
    /// cannot be loaded. Whatever was created is removed again.
    pub async fn start(self) -> Result<Containerd> {
        if !nix::unistd::geteuid().is_root() {
            bail!("the containerd fixture needs root (run the e2e tests as root)");
        }
        tokio::task::spawn_blocking(cleanup::sweep_stale).await?;
        let snapshotter = match self.snapshotter.clone() {
            Some(s) => s,
            None => tokio::task::spawn_blocking(default_snapshotter)
                .await?
                .to_string(),
        };
        let external = self.external_subnet;
        let (record, lock) = tokio::task::spawn_blocking(move || create_run(external)).await??;
        let socket = record.socket.clone();
        let mut containerd = Containerd {
            client: CriClient::connect_lazy(&socket, CRI_TIMEOUT)?,
            config_path: record.dir.join("config.toml"),
            log_path: record.dir.join("containerd.log"),
            snapshotter,
            ready_timeout: self.ready_timeout,
            external_cni: external.is_some(),
            netns: self.netns.clone(),
            record,
            child: None,
            cleaned: false,
            _lock: lock,
        };
        // From here on, Drop removes everything if a step fails.
        containerd.write_files(&self)?;
        containerd.start_again().await?;
        if self.default_images {
            let (pause, toolbox) = tokio::task::spawn_blocking(|| {
                Ok::<_, anyhow::Error>((images::pause()?, images::toolbox()?))
            })
            .await??;
            containerd.images().load(&pause).await?;
            containerd.images().load(&toolbox).await?;
        }
        Ok(containerd)
    }
}

/// A running private containerd with the CRI plugin.
///
/// # Guarantees
/// Dropping it (or [`cleanup`](Self::cleanup)) removes every sandbox,
/// container, shim, mount, netns, the bridge, firewall rules mentioning the
/// run's subnet/bridge/network and the run directory, also after a panic. A
/// run killed with SIGKILL is cleaned by the next fixture start on the
/// machine ([`cleanup::sweep_stale`]).
#[derive(Debug)]
pub struct Containerd {
    record: RunRecord,
    config_path: PathBuf,
    log_path: PathBuf,
    snapshotter: String,
    ready_timeout: Duration,
    /// The CNI configuration is not ours (see
    /// [`ContainerdBuilder::external_cni`]).
    external_cni: bool,
    /// The network namespace containerd runs in, if not the host's.
    netns: Option<PathBuf>,
    /// None while stopped.
    child: Option<Child>,
    client: CriClient,
    cleaned: bool,
    /// Held for the run's life: marks it alive for other processes' sweeps.
    _lock: RunLock,
}

impl Containerd {
    /// Starts one with default options (see [`ContainerdBuilder::start`]).
    ///
    /// # Errors
    /// See [`ContainerdBuilder::start`].
    pub async fn start() -> Result<Containerd> {
        ContainerdBuilder::default().start().await
    }

    /// Options for a fixture.
    pub fn builder() -> ContainerdBuilder {
        ContainerdBuilder::default()
    }

    /// The run id (6 hex chars); unique among live runs on this machine.
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// containerd's gRPC socket path.
    pub fn socket(&self) -> &Path {
        &self.record.socket
    }

    /// `unix://<socket>`, the form `--container-runtime-endpoint` takes.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.record.socket.display())
    }

    /// The run directory `/tmp/skiff-test/<id>`.
    pub fn dir(&self) -> &Path {
        &self.record.dir
    }

    /// The CNI subnet, `198.18.X.0/24`.
    pub fn subnet(&self) -> String {
        self.record.subnet()
    }

    /// The subnet's gateway (the bridge's address), `198.18.X.1`.
    pub fn gateway(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(198, 18, self.record.subnet_index, 1)
    }

    /// Changes the run's recorded subnet (in memory and in `run.json`, for
    /// sweeps) to 198.18.`index`.0/24: for fixtures started with
    /// [`ContainerdBuilder::external_cni`] once the network's real subnet
    /// is known (a node's podCIDR assigned by the control plane).
    ///
    /// # Errors
    /// Fails when this run leased its own subnet (its lease would leak), or
    /// when `run.json` cannot be written.
    pub fn set_subnet(&mut self, index: u8) -> Result<()> {
        if !self.external_cni {
            bail!(
                "run {} leased 198.18.{}.0/24 itself; only external-CNI runs change subnet",
                self.record.id,
                self.record.subnet_index
            );
        }
        self.record.subnet_index = index;
        self.record.save()
    }

    /// The directory containerd loads its CNI configuration from (the
    /// first `*.conflist` in it, watched for changes).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.record.dir.join("cni")
    }

    /// The Linux bridge the CNI bridge plugin creates (`skb-<id>`).
    pub fn bridge(&self) -> &str {
        &self.record.bridge
    }

    /// The CNI network name (`skiff-<id>`).
    pub fn network_name(&self) -> &str {
        &self.record.network
    }

    /// The snapshotter in use (`overlayfs`, or `native` where overlay mounts
    /// do not work).
    pub fn snapshotter(&self) -> &str {
        &self.snapshotter
    }

    /// crun's state root for the `crun` handler (`<root>/k8s.io/<id>`).
    pub fn crun_root(&self) -> PathBuf {
        self.record.dir.join("crun")
    }

    /// The generated containerd config.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// containerd's log (appended to across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// What cleanup needs to know about this run.
    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// A CRI client for this containerd (cheap clone of a shared
    /// connection that reconnects by itself after [`restart`](Self::restart)).
    pub fn client(&self) -> CriClient {
        self.client.clone()
    }

    /// containerd's pid while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Side-loading into this containerd's `k8s.io` namespace.
    pub fn images(&self) -> Images<'_> {
        Images {
            socket: &self.record.socket,
            dir: &self.record.dir,
            snapshotter: &self.snapshotter,
            client: self.client.clone(),
        }
    }

    /// SIGTERMs containerd and waits for it (SIGKILL after 10 s). Containers
    /// keep running in their shims.
    ///
    /// # Errors
    /// Fails only when waiting for the process fails.
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            tokio::task::spawn_blocking(move || cleanup::terminate_child(&mut child, STOP_GRACE))
                .await??;
        }
        Ok(())
    }

    /// Starts containerd again on the same directories (after
    /// [`stop`](Self::stop)) and waits until CRI is ready. A no-op while it
    /// runs.
    ///
    /// # Errors
    /// Fails when containerd does not become ready; the error carries the
    /// tail of its log.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display()))
                    .arg("--")
                    .arg("containerd");
                c
            }
            None => Command::new("containerd"),
        };
        let child = command
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Own process group: a terminal's Ctrl-C reaches the test, whose
            // cleanup then stops containerd in order.
            .process_group(0)
            .spawn()
            .context("spawning containerd (is it installed?)")?;
        self.child = Some(child);
        self.wait_ready().await
    }

    /// [`stop`](Self::stop) then [`start_again`](Self::start_again).
    ///
    /// # Errors
    /// As those two.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.start_again().await
    }

    /// Removes everything (see the type's guarantees). Equivalent to
    /// dropping, but async-friendly (the CRI part runs on the caller's
    /// runtime) and it reports failures instead of printing them.
    ///
    /// # Errors
    /// Lists every step that failed; all steps run regardless.
    pub async fn cleanup(mut self) -> Result<()> {
        self.cleaned = true;
        let (netns, mut errors) = if self.child.is_none() {
            // Stopped: there is no CRI to ask; runc and the rest remain.
            (Vec::new(), Vec::new())
        } else {
            let teardown = cleanup::cri_teardown(&self.client);
            match tokio::time::timeout(Duration::from_secs(60), teardown).await {
                Ok(r) => r,
                Err(_) => (
                    Vec::new(),
                    vec![anyhow!("CRI teardown timed out after 60 s")],
                ),
            }
        };
        let record = self.record.clone();
        let mut child = self.child.take();
        let sync =
            tokio::task::spawn_blocking(move || cleanup::teardown(&record, child.as_mut(), &netns))
                .await;
        match sync {
            Ok(e) => errors.extend(e),
            Err(e) => errors.push(anyhow!("teardown task: {e}")),
        }
        if errors.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = errors.iter().map(|e| format!("{e:#}")).collect();
        bail!(
            "cleanup of run {} incomplete: {}",
            self.record.id,
            list.join("; ")
        )
    }

    /// Polls CRI `Status` until RuntimeReady and NetworkReady are true.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.ready_timeout;
        let mut last = String::from("no answer yet");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!(
                        "containerd exited with {status} while starting (config {}); log tail:\n{}",
                        self.config_path.display(),
                        self.log_tail(40)
                    );
                }
            }
            if self.record.socket.exists() {
                match self
                    .client
                    .status(v1::StatusRequest { verbose: false })
                    .await
                {
                    Ok(resp) => {
                        let conditions = resp.status.map(|s| s.conditions).unwrap_or_default();
                        let ready = |t: &str| conditions.iter().any(|c| c.r#type == t && c.status);
                        if ready("RuntimeReady") && (self.external_cni || ready("NetworkReady")) {
                            return Ok(());
                        }
                        last = format!("{conditions:?}");
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "containerd at {} not ready after {:?} (last CRI status: {last}); log tail:\n{}",
                    self.record.socket.display(),
                    self.ready_timeout,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn write_files(&self, opts: &ContainerdBuilder) -> Result<()> {
        let dir = &self.record.dir;
        for sub in ["root", "state", "cni", "cni-ipam", "runc", "opt", "pods"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::write(&self.config_path, self.config_toml(opts))?;
        if !self.external_cni {
            fs::write(
                dir.join("cni").join("10-skiff.conflist"),
                self.cni_conflist(),
            )?;
        }
        Ok(())
    }

    /// containerd's config (version 2 schema, containerd 1.6).
    fn config_toml(&self, opts: &ContainerdBuilder) -> String {
        let d = self.record.dir.display();
        let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
        let mut t = String::new();
        let _ = writeln!(t, "version = 2");
        let _ = writeln!(t, "root = \"{d}/root\"");
        let _ = writeln!(t, "state = \"{d}/state\"");
        let _ = writeln!(t, "oom_score = 0\n");
        let _ = writeln!(
            t,
            "[grpc]\n  address = \"{}\"\n",
            self.record.socket.display()
        );
        let _ = writeln!(t, "[ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n");
        // Empty addresses turn the debug socket and metrics listener off.
        let _ = writeln!(t, "[debug]\n  address = \"\"\n  level = \"info\"\n");
        let _ = writeln!(t, "[metrics]\n  address = \"\"\n");
        let _ = writeln!(
            t,
            "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt\"\n"
        );
        let _ = writeln!(t, "[{cri}]");
        let _ = writeln!(t, "  sandbox_image = \"{}\"", images::PAUSE_IMAGE);
        // Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj and every
        // sandbox fails with "can't get final child's PID from pipe".
        let _ = writeln!(t, "  restrict_oom_score_adj = {}", !has_cap_sys_resource());
        // The default stream server listens on :10010 on all interfaces:
        // loopback and a random port, so parallel fixtures do not collide.
        let _ = writeln!(t, "  stream_server_address = \"127.0.0.1\"");
        let _ = writeln!(t, "  stream_server_port = \"0\"");
        let _ = writeln!(t, "  enable_selinux = false");
        let _ = writeln!(t, "  max_container_log_line_size = 16384\n");
        let _ = writeln!(t, "[{cri}.containerd]");
        let _ = writeln!(t, "  snapshotter = \"{}\"", self.snapshotter);
        let _ = writeln!(t, "  default_runtime_name = \"runc\"\n");
        let _ = writeln!(t, "[{cri}.containerd.runtimes.runc]");
        let _ = writeln!(t, "  runtime_type = \"io.containerd.runc.v2\"\n");
        let _ = writeln!(t, "[{cri}.containerd.runtimes.runc.options]");
        let _ = writeln!(t, "  SystemdCgroup = false");
        // A private runc root: leftovers are found (and deleted) there.
        let _ = writeln!(t, "  Root = \"{}\"\n", self.record.runc_root.display());
        // A second OCI runtime for RuntimeClasses: the same shim with crun.
        let _ = writeln!(t, "[{cri}.containerd.runtimes.crun]");
        let _ = writeln!(t, "  runtime_type = \"io.containerd.runc.v2\"\n");
        let _ = writeln!(t, "[{cri}.containerd.runtimes.crun.options]");
        let _ = writeln!(t, "  BinaryName = \"{CRUN}\"");
        let _ = writeln!(t, "  SystemdCgroup = false");
        let _ = writeln!(t, "  Root = \"{d}/crun\"\n");
        let _ = writeln!(t, "[{cri}.cni]");
        let _ = writeln!(t, "  bin_dir = \"{CNI_BIN_DIR}\"");
        let _ = writeln!(t, "  conf_dir = \"{d}/cni\"");
        let _ = writeln!(t, "  max_conf_num = 1\n");
        for (host, endpoints) in &opts.mirrors {
            let eps = endpoints
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                t,
                "[{cri}.registry.mirrors.\"{host}\"]\n  endpoint = [{eps}]\n"
            );
        }
        t.push_str(&opts.extra_config);
        t
    }

    /// bridge + host-local + portmap. The loopback interface is set up by
    /// containerd itself (go-cni's loopback network), not by this list.
    fn cni_conflist(&self) -> String {
        let r = &self.record;
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": r.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": r.bridge,
                    "isGateway": true,
                    // Never NAT pod traffic off the host.
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": r.subnet(), "gateway": format!("198.18.{}.1", r.subnet_index) }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": r.dir.join("cni-ipam"),
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        serde_json::to_string_pretty(&conf).expect("static JSON serialises")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        let mut child = self.child.take();
        if child.is_none() {
            // Stopped: nothing to ask through CRI.
            let errors = cleanup::teardown(&self.record, None, &[]);
            cleanup::report(&self.record.id, &errors);
        } else {
            cleanup::teardown_blocking(&self.record, child.as_mut());
        }
    }
}

/// Creates `/tmp/skiff-test/<id>` with its lock held, leases a subnet
/// (unless `external_subnet` was leased by the caller) and writes
/// `run.json`.
fn create_run(external_subnet: Option<u8>) -> Result<(RunRecord, RunLock)> {
    let (id, dir, lock) = cleanup::create_run_dir()?;
    let subnet_index = match external_subnet {
        Some(x) => x,
        None => match lease_free_subnet(&id) {
            Ok(x) => x,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        },
    };
    let record = RunRecord {
        socket: dir.join("containerd.sock"),
        runc_root: dir.join("runc"),
        bridge: format!("skb-{id}"),
        network: format!("skiff-{id}"),
        owner_pid: std::process::id(),
        subnet_index,
        dir,
        id,
    };
    record.save()?;
    Ok((record, lock))
}

/// Leases the first free 198.18.X.0/24 (random start): no lease file and no
/// address or route on the host overlapping it.
fn lease_free_subnet(id: &str) -> Result<u8> {
    let used = cleanup::host_ipv4_networks();
    let (lo, hi) = (*SUBNET_RANGE.start(), *SUBNET_RANGE.end());
    let span = u16::from(hi - lo) + 1;
    let start = rand::random::<u16>() % span;
    for i in 0..span {
        let x = lo + ((start + i) % span) as u8;
        let net = (std::net::Ipv4Addr::new(198, 18, x, 0), 24);
        if used.iter().any(|u| cleanup::overlaps(*u, net)) {
            continue;
        }
        if cleanup::lease_subnet(x, id)? {
            return Ok(x);
        }
    }
    bail!(
        "no free /24 in 198.18.{lo}-{hi}.0 (leases in {})",
        cleanup::SUBNET_DIR
    )
}

/// Whether this process has CAP_SYS_RESOURCE (bit 24 of CapEff).
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// `overlayfs` when an overlay mount works under /tmp/skiff-test (checked
/// once per process), else `native`.
pub fn default_snapshotter() -> &'static str {
    static SNAPSHOTTER: OnceLock<&'static str> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        if overlay_works() {
            "overlayfs"
        } else {
            "native"
        }
    })
}

fn overlay_works() -> bool {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let base = Path::new(TEST_ROOT).join(format!(".overlay-check-{}", std::process::id()));
    let dirs = ["lower", "upper", "work", "merged"].map(|d| base.join(d));
    let ok = dirs.iter().all(|d| fs::create_dir_all(d).is_ok()) && {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            dirs[0].display(),
            dirs[1].display(),
            dirs[2].display()
        );
        let mounted = mount(
            Some("overlay"),
            &dirs[3],
            Some("overlay"),
            MsFlags::empty(),
            Some(opts.as_str()),
        );
        if mounted.is_ok() {
            let _ = umount2(&dirs[3], MntFlags::MNT_DETACH);
        }
        mounted.is_ok()
    };
    let _ = fs::remove_dir_all(&base);
    ok
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
