//! A `skiff-agent` process for end-to-end tests: its own root, log and
//! static pod directories inside a harness containerd's run directory, a
//! free loopback port for its status endpoint, and helpers to write
//! manifests, read pod statuses, and kill or restart it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::List;

use crate::containerd::Containerd;

/// Flags every test agent gets, unless a test gives them again (the last
/// one wins): image GC and eviction off (a test machine's disk may well
/// be over 85 % full, and side-loaded images have no registry to come
/// back from), and no registries file (the host's
/// /etc/skiff/registries.yaml belongs to the machine's own node).
pub const TEST_AGENT_FLAGS: [&str; 3] = [
    "--image-gc-high-threshold=100",
    "--eviction-hard=",
    "--registries-config=",
];

/// Path of a workspace binary, built once per test process (`cargo build`
/// is a no-op when it is up to date). `SKIFF_<NAME>_BIN` overrides it.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let env_name = format!(
        "SKIFF_{}_BIN",
        bin.trim_start_matches("skiff-")
            .to_uppercase()
            .replace('-', "_")
    );
    if let Ok(p) = std::env::var(&env_name) {
        return Ok(PathBuf::from(p));
    }
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let root = workspace_root();
    let release = !cfg!(debug_assertions);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let path = target
        .join(if release { "release" } else { "debug" })
        .join(bin);
    static BUILT: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    if !built
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&bin.to_string())
    {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&root)
            // Every binary of the workspace at once, as scripts/test.sh
            // builds them: one feature resolution, so nothing rebuilds.
            .args(["build", "-q", "--workspace", "--bins"]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .with_context(|| format!("running cargo build for {bin}"))?;
        if !status.success() {
            bail!("cargo build --workspace --bins failed (wanted {bin} of {package})");
        }
        built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(bin.to_string());
    }
    Ok(path)
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Options of a test agent; flags passed as is.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    pub node_name: Option<String>,
    /// Extra flags, e.g. `--crash-loop-back-off-initial=1s`.
    pub extra_args: Vec<String>,
    /// Start as the README's standalone example does: no client CA, so no
    /// node server.
    pub no_client_ca: bool,
}

pub struct Agent {
    child: Option<Child>,
    args: Vec<String>,
    binary: PathBuf,
    dir: PathBuf,
    manifests: PathBuf,
    status: SocketAddr,
    /// The node server's port (HTTPS, client certificates of `ca`).
    port: u16,
    /// The CA the node server trusts for client certificates (the
    /// standalone agent has no cluster CA of its own).
    ca: skiff_control_plane::pki::Pki,
    log: PathBuf,
    node_name: String,
    http: reqwest::Client,
}

impl Agent {
    /// Start an agent against `containerd`, with a fresh directory.
    pub async fn start(containerd: &Containerd, opts: AgentOptions) -> Result<Agent> {
        let binary = workspace_binary("skiff-agent", "skiff-agent")?;
        let n = std::fs::read_dir(containerd.dir())?.count();
        let dir = containerd.dir().join(format!("agent-{n}"));
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let status: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let port = free_port()?;
        let ca = skiff_control_plane::pki::Pki::load_or_create(&dir.join("ca"))?;
        let node_name = opts
            .node_name
            .clone()
            .unwrap_or_else(|| format!("node-{}", containerd.id()));
        let mut args = vec![
            format!("--container-runtime-endpoint={}", containerd.endpoint()),
            format!("--root-dir={}", dir.join("root").display()),
            format!("--pod-log-dir={}", dir.join("logs").display()),
            format!("--static-pod-path={}", manifests.display()),
            format!("--status-address={status}"),
            format!("--node-name={node_name}"),
            "--address=127.0.0.1".into(),
            format!("--port={port}"),
            "--runtime-request-timeout=30s".into(),
        ];
        if !opts.no_client_ca {
            args.push(format!(
                "--client-ca-file={}",
                dir.join("ca/pki/ca.crt").display()
            ));
        }
        args.extend(TEST_AGENT_FLAGS.map(String::from));
        args.extend(opts.extra_args);
        let mut agent = Agent {
            child: None,
            args,
            binary,
            log: dir.join("agent.log"),
            dir,
            manifests,
            status,
            port,
            ca,
            node_name,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        };
        agent.spawn().await?;
        Ok(agent)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            // As deployed (systemd/skiff-agent.service): what the start-up
            // benchmark measures is the agent users run.
            .env("MALLOC_ARENA_MAX", "2")
            .env(
                "RUST_LOG",
                std::env::var("SKIFF_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.http.get(self.url("/pods")).send().await.is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    bail!("skiff-agent exited with {status}:\n{}", self.log_tail(40));
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "skiff-agent did not serve its status endpoint in 20s:\n{}",
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.status)
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn manifests_dir(&self) -> &Path {
        &self.manifests
    }
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn status_address(&self) -> SocketAddr {
        self.status
    }
    /// `https://127.0.0.1:<port>` of the node server.
    pub fn node_port(&self) -> u16 {
        self.port
    }

    pub fn node_server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A client of the node server as `user` in `groups` (a certificate of
    /// the agent's client CA; the server's self-signed certificate is not
    /// verified). `system:masters` is allowed everything.
    ///
    /// # Errors
    /// The certificate cannot be issued.
    pub async fn node_client(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let text = self.ca.kubeconfig(&self.node_server_url(), user, &groups)?;
        insecure_client(&text, None).await
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The static pod name the agent gives a manifest's pod.
    pub fn pod_name(&self, manifest_name: &str) -> String {
        format!("{manifest_name}-{}", self.node_name)
    }

    /// Write a manifest atomically (a hidden temporary, then rename), as
    /// config management tools do.
    pub fn write_manifest(&self, file: &str, content: &str) -> Result<()> {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, content)?;
        std::fs::rename(&tmp, self.manifests.join(file))?;
        Ok(())
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        std::fs::remove_file(self.manifests.join(file))
            .with_context(|| format!("removing manifest {file}"))
    }

    /// The agent's pods with their statuses.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        let list: List<Pod> = self
            .http
            .get(self.url("/pods"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(list.items)
    }

    pub async fn pod(&self, name: &str) -> Result<Option<Pod>> {
        Ok(self
            .pods()
            .await?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name)))
    }

    /// Poll until `pred` holds for the named pod; on timeout the error
    /// carries the pod's last status and the agent's log tail.
    pub async fn wait_pod(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Pod) -> bool,
    ) -> Result<Pod> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Ok(Some(p)) = self.pod(name).await {
                if pred(&p) {
                    return Ok(p);
                }
                last = Some(p);
            }
            if Instant::now() > deadline {
                let status = last
                    .and_then(|p| p.status)
                    .map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
                bail!(
                    "pod {name}: timed out after {timeout:?} waiting for {what}; last status: {}\nagent log:\n{}",
                    status.unwrap_or_else(|| "<no pod>".into()),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Poll until the agent no longer lists the pod.
    pub async fn wait_pod_gone(&self, name: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.pod(name).await?.is_some() {
            if Instant::now() > deadline {
                bail!(
                    "pod {name} still listed after {timeout:?}\n{}",
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// SIGKILL, as a crash or OOM kill would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let mut c = self.child.take().context("agent not running")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        Ok(c.wait()?)
    }

    /// Start again with the same flags and directories.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A kube client from kubeconfig `text` (pointed at `server` when given)
/// that does not verify the server's certificate (node servers are
/// self-signed).
///
/// # Errors
/// The kubeconfig is invalid.
pub async fn insecure_client(text: &str, server: Option<&str>) -> Result<kube::Client> {
    let mut kc = kube::config::Kubeconfig::from_yaml(text)?;
    for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        c.certificate_authority_data = None;
        c.insecure_skip_tls_verify = Some(true);
        if let Some(s) = server {
            c.server = Some(s.to_string());
        }
    }
    let opts = kube::config::KubeConfigOptions::default();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &opts).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Pod status helpers for assertions.
pub mod pods {
    use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

    pub fn phase(p: &Pod) -> &str {
        p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("")
    }

    pub fn container<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
        let s = p.status.as_ref()?;
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == name)
    }

    pub fn running(p: &Pod, name: &str) -> bool {
        container(p, name)
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    }

    pub fn all_running(p: &Pod) -> bool {
        let s = p.status.as_ref();
        let cs = s.and_then(|s| s.container_statuses.as_ref());
        cs.is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    }

    pub fn ready(p: &Pod) -> bool {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    pub fn restarts(p: &Pod, name: &str) -> i32 {
        container(p, name).map(|c| c.restart_count).unwrap_or(-1)
    }

    pub fn container_id(p: &Pod, name: &str) -> String {
        container(p, name)
            .and_then(|c| c.container_id.clone())
            .unwrap_or_default()
    }

    pub fn waiting_reason(p: &Pod, name: &str) -> String {
        container(p, name)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
            .unwrap_or_default()
    }

    pub fn terminated_exit(p: &Pod, name: &str) -> Option<i32> {
        container(p, name)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
    }
}
