//! Removing everything a fixture run created, even after a failure, a panic
//! or a SIGKILLed test process.
//!
//! A run owns one directory `/tmp/skiff-test/<id>/` and holds an exclusive
//! `flock` on `<id>/lock` for its whole life. The kernel drops that lock when
//! the owning process dies, however it dies, so a run directory whose lock
//! can be taken belongs to a dead run: [`sweep_stale`] (called by every
//! fixture start) tears such runs down exactly like a normal cleanup does.
//!
//! Teardown order matters and mirrors how the pieces depend on each other:
//! 1. CRI: stop and remove every pod sandbox and container ([`cri_teardown`]).
//!    StopPodSandbox runs CNI DEL, which removes the veth, the IPAM lease and
//!    portmap's NAT rules, and containerd then removes the netns.
//! 2. containerd: SIGTERM, then SIGKILL after a grace period.
//! 3. runc: whatever CRI could not remove is killed and deleted with `runc`
//!    on our private runc root (containers survive their shims otherwise).
//! 4. shims: `containerd-shim-runc-v2` processes whose command line names our
//!    socket, and their sockets under `/run/containerd/s/`.
//! 5. mounts under the run directory (deepest first, lazily).
//! 6. network namespaces our sandboxes used, the bridge, iptables/nft rules
//!    that mention our subnet, bridge or CNI network name.
//! 7. the run directory, then the subnet lease.
//!
//! Every step is best effort and idempotent: a failure is reported and the
//! next step still runs, and running the whole teardown twice is harmless.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context, Result};
use cri_proto::{v1, CriClient};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Root of everything the harness writes.
pub const TEST_ROOT: &str = "/tmp/skiff-test";
/// One lease file per /24 of 198.18.0.0/16 in use: `subnets/<X>` holds the id
/// of the run that uses 198.18.X.0/24.
pub const SUBNET_DIR: &str = "/tmp/skiff-test/subnets";
/// Where containerd 1.6's CRI plugin pins sandbox network namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";
/// Where containerd 1.6 puts shim sockets (hashed from address, ns, id).
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// portmap's chains shared by every CNI network on the host: never deleted,
/// only the rules in them that mention us.
const SHARED_CHAINS: &[&str] = &[
    "CNI-HOSTPORT-DNAT",
    "CNI-HOSTPORT-SNAT",
    "CNI-HOSTPORT-MASQ",
    "CNI-HOSTPORT-SETMARK",
];

/// What a run created, written to `<dir>/run.json` so that a later process
/// can tear a dead run down.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Short unique id (6 hex chars).
    pub id: String,
    /// `/tmp/skiff-test/<id>`.
    pub dir: PathBuf,
    /// containerd's gRPC socket.
    pub socket: PathBuf,
    /// The `X` of 198.18.X.0/24.
    pub subnet_index: u8,
    /// Linux bridge created by the CNI bridge plugin.
    pub bridge: String,
    /// CNI network name (appears in portmap rule comments).
    pub network: String,
    /// runc root given to the runc shim (`<runc_root>/k8s.io/<container>`).
    pub runc_root: PathBuf,
    /// Process that owned the run (informational; liveness is the flock).
    pub owner_pid: u32,
}

impl RunRecord {
    /// `198.18.X.0/24`.
    pub fn subnet(&self) -> String {
        format!("198.18.{}.0/24", self.subnet_index)
    }

    /// Strings whose presence in a firewall rule means the rule is ours.
    pub fn firewall_markers(&self) -> Vec<String> {
        vec![
            format!("198.18.{}.", self.subnet_index),
            self.bridge.clone(),
            self.network.clone(),
        ]
    }

    /// Reads `<dir>/run.json`.
    ///
    /// # Errors
    /// Fails when the file is missing or malformed.
    pub fn load(dir: &Path) -> Result<RunRecord> {
        let path = dir.join("run.json");
        let data = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&data).with_context(|| format!("parsing {}", path.display()))
    }

    /// Writes `<dir>/run.json` atomically.
    ///
    /// # Errors
    /// Fails when the directory is not writable.
    pub fn save(&self) -> Result<()> {
        let tmp = self.dir.join("run.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(&tmp, self.dir.join("run.json"))?;
        Ok(())
    }
}

/// The exclusive lock that marks a run as alive.
#[derive(Debug)]
pub struct RunLock {
    _lock: Flock<fs::File>,
}

impl RunLock {
    /// Creates `<dir>/lock` already locked: the lock file is created and
    /// locked under a temporary name and renamed into place, so a sweeper
    /// never sees an unlocked lock file of a live run.
    ///
    /// # Errors
    /// Fails when the file cannot be created or locked.
    pub fn create(dir: &Path) -> Result<RunLock> {
        let tmp = dir.join("lock.tmp");
        let file = fs::File::create(&tmp)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| anyhow!("locking {}: {e}", tmp.display()))?;
        fs::rename(&tmp, dir.join("lock"))?;
        Ok(RunLock { _lock: lock })
    }

    /// Takes the lock of an existing run if its owner is gone.
    /// `Ok(None)` means the run is alive (or has no lock file yet).
    fn try_take(dir: &Path) -> Result<Option<RunLock>> {
        let file = match fs::File::open(dir.join("lock")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(RunLock { _lock: lock })),
            Err((_, Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(anyhow!("flock {}: {e}", dir.display())),
        }
    }
}

/// Creates a fresh run directory `/tmp/skiff-test/<id>` (a new random id)
/// with its lock held. Containerd runs add `run.json`; a run without one
/// (a cluster fixture's directory: server data, node agents' state) is
/// swept by killing the processes that name the directory in their
/// command line, unmounting and removing it.
///
/// # Errors
/// Fails when `/tmp/skiff-test` is not writable or no id is free.
pub fn create_run_dir() -> Result<(String, PathBuf, RunLock)> {
    fs::create_dir_all(TEST_ROOT)?;
    for _ in 0..100 {
        let id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let dir = Path::new(TEST_ROOT).join(&id);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(anyhow!("creating {}: {e}", dir.display())),
        }
        let lock = RunLock::create(&dir)?;
        return Ok((id, dir, lock));
    }
    Err(anyhow!("no free run id under {TEST_ROOT} after 100 tries"))
}

/// Stops and removes every pod sandbox and container through CRI.
///
/// Returns the network namespace paths the sandboxes used (from the verbose
/// sandbox status), so that later steps can remove them if containerd did
/// not. Errors of single calls are collected, not fatal; a pass that
/// leaves errors is tried again a few times, since a container caught
/// starting (its agent stopped mid-StartContainer) cannot be removed
/// until containerd has finished starting it.
pub async fn cri_teardown(client: &CriClient) -> (Vec<PathBuf>, Vec<anyhow::Error>) {
    const PASSES: usize = 5;
    let mut netns = Vec::new();
    let mut errors = Vec::new();
    for pass in 0..PASSES {
        if pass > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let (found, left) = cri_teardown_pass(client).await;
        netns.extend(found);
        errors = left;
        if errors.is_empty() {
            break;
        }
    }
    netns.sort();
    netns.dedup();
    (netns, errors)
}

async fn cri_teardown_pass(client: &CriClient) -> (Vec<PathBuf>, Vec<anyhow::Error>) {
    let mut errors = Vec::new();
    let mut netns = Vec::new();
    let sandboxes = match client
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
    {
        Ok(r) => r.items,
        Err(e) => {
            errors.push(anyhow!("CRI ListPodSandbox: {e}"));
            Vec::new()
        }
    };
    for sb in &sandboxes {
        let status = client
            .pod_sandbox_status(v1::PodSandboxStatusRequest {
                pod_sandbox_id: sb.id.clone(),
                verbose: true,
            })
            .await;
        if let Ok(status) = status {
            if let Some(path) = status
                .info
                .get("info")
                .and_then(|i| netns_from_verbose_info(i))
            {
                netns.push(path);
            }
        }
        // StopPodSandbox kills the containers (timeout 0: SIGKILL), runs CNI
        // DEL and removes the netns; RemovePodSandbox removes the containers.
        let stop = client.stop_pod_sandbox(v1::StopPodSandboxRequest {
            pod_sandbox_id: sb.id.clone(),
        });
        if let Err(e) = stop.await {
            errors.push(anyhow!("CRI StopPodSandbox {}: {e}", sb.id));
        }
        let remove = client.remove_pod_sandbox(v1::RemovePodSandboxRequest {
            pod_sandbox_id: sb.id.clone(),
        });
        if let Err(e) = remove.await {
            errors.push(anyhow!("CRI RemovePodSandbox {}: {e}", sb.id));
        }
    }
    match client
        .list_containers(v1::ListContainersRequest::default())
        .await
    {
        Ok(r) => {
            for c in r.containers {
                let stop = client.stop_container(v1::StopContainerRequest {
                    container_id: c.id.clone(),
                    timeout: 0,
                });
                let _ = stop.await;
                let remove = client.remove_container(v1::RemoveContainerRequest {
                    container_id: c.id.clone(),
                });
                if let Err(e) = remove.await {
                    errors.push(anyhow!("CRI RemoveContainer {}: {e}", c.id));
                }
            }
        }
        Err(e) => errors.push(anyhow!("CRI ListContainers: {e}")),
    }
    (netns, errors)
}

/// The netns path in containerd's verbose sandbox info
/// (`runtimeSpec.linux.namespaces[type=network].path`).
pub fn netns_from_verbose_info(info: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    v.pointer("/runtimeSpec/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|ns| ns["type"] == "network")
        .and_then(|ns| ns["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// [`cri_teardown`] from synchronous code (Drop): runs on a fresh thread with
/// its own current-thread runtime, because the caller may be inside another
/// runtime, where blocking on a future panics.
///
/// Does nothing when no containerd serves `socket` any more (its process,
/// found by the `config.toml` next to the socket, is gone).
pub fn cri_teardown_blocking(socket: &Path) -> (Vec<PathBuf>, Vec<anyhow::Error>) {
    let config = socket.with_file_name("config.toml");
    let serving = processes_mentioning(&config.to_string_lossy())
        .into_iter()
        .any(is_alive);
    if !socket.exists() || !serving {
        return (Vec::new(), Vec::new());
    }
    let socket = socket.to_path_buf();
    let worker = std::thread::Builder::new()
        .name("skiff-cri-teardown".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    return (
                        Vec::new(),
                        vec![anyhow!("building a runtime for CRI teardown: {e}")],
                    )
                }
            };
            rt.block_on(async {
                let connect = CriClient::connect(&socket, Duration::from_secs(10));
                match tokio::time::timeout(Duration::from_secs(5), connect).await {
                    Ok(Ok(client)) => {
                        match tokio::time::timeout(Duration::from_secs(60), cri_teardown(&client))
                            .await
                        {
                            Ok(r) => r,
                            Err(_) => (
                                Vec::new(),
                                vec![anyhow!("CRI teardown timed out after 60 s")],
                            ),
                        }
                    }
                    Ok(Err(e)) => (
                        Vec::new(),
                        vec![anyhow!("connecting to CRI for teardown: {e}")],
                    ),
                    Err(_) => (
                        Vec::new(),
                        vec![anyhow!("connecting to CRI for teardown timed out")],
                    ),
                }
            })
        });
    match worker {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| (Vec::new(), vec![anyhow!("CRI teardown thread panicked")])),
        Err(e) => (
            Vec::new(),
            vec![anyhow!("spawning CRI teardown thread: {e}")],
        ),
    }
}

/// Everything after CRI: stops containerd (`child` when we started it, else
/// found by command line), kills leftovers, unmounts, removes netns, bridge,
/// firewall rules, the directory and the subnet lease. `known_netns` are
/// namespaces CRI reported for our sandboxes.
///
/// Returns the errors of steps that failed; every step runs regardless.
pub fn teardown(
    record: &RunRecord,
    child: Option<&mut Child>,
    known_netns: &[PathBuf],
) -> Vec<anyhow::Error> {
    let mut errors = Vec::new();
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            errors.push(e);
        }
    };
    note(stop_containerd(record, child, Duration::from_secs(10)));
    let mut netns: BTreeSet<PathBuf> = known_netns.iter().cloned().collect();
    netns.extend(runc_netns(&record.runc_root));
    note(runc_kill_all(&record.runc_root));
    note(kill_shims(record));
    note(unmount_under(&record.dir).map(|_| ()));
    netns.extend(netns_with_subnet(record.subnet_index));
    for ns in &netns {
        note(remove_netns(ns));
    }
    note(delete_link(&record.bridge));
    note(remove_firewall_rules(&record.firewall_markers()));
    note(remove_dir(&record.dir));
    note(release_subnet(record.subnet_index, &record.id));
    errors
}

/// Full teardown from synchronous code: CRI part on a fresh thread, then
/// [`teardown`]. Errors are printed to stderr (this runs from Drop).
pub fn teardown_blocking(record: &RunRecord, child: Option<&mut Child>) {
    let (netns, mut errors) = cri_teardown_blocking(&record.socket);
    errors.extend(teardown(record, child, &netns));
    report(&record.id, &errors);
}

pub(crate) fn report(id: &str, errors: &[anyhow::Error]) {
    for e in errors {
        eprintln!("skiff-tests: cleanup of run {id}: {e:#}");
    }
}

/// Tears down every run under [`TEST_ROOT`] whose owner is dead (its lock
/// can be taken), and removes subnet leases whose run directory is gone.
/// Returns the ids of the runs it cleaned.
pub fn sweep_stale() -> Vec<String> {
    let Ok(entries) = fs::read_dir(TEST_ROOT) else {
        return Vec::new();
    };
    // Take every dead run first: the order of teardown matters across runs.
    let mut dead = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !is_run_id(&name) {
            continue;
        }
        let dir = entry.path();
        let lock = match RunLock::try_take(&dir) {
            Ok(Some(lock)) => lock,
            // No lock file: a run being created right now (skip), or one
            // that died while being created (old: take it over).
            Ok(None) if !dir.join("lock").exists() && age(&dir) > Duration::from_secs(120) => {
                match RunLock::create(&dir) {
                    Ok(lock) => lock,
                    Err(_) => continue,
                }
            }
            _ => continue,
        };
        let record = RunRecord::load(&dir).ok();
        dead.push((name, dir, record, lock));
    }
    // Runs without run.json: a cluster fixture's directory (its server and
    // agents name it in their flags), or a run that died before writing it
    // (perhaps with a containerd that never got further). Their processes
    // go first: a dead cluster's agents would start sandboxes again while
    // its containerds are torn down.
    for (_, dir, _, _) in dead.iter().filter(|d| d.2.is_none()) {
        let pids = kill_processes_mentioning(&dir.to_string_lossy(), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (_, _, record, _) in &dead {
        if let Some(record) = record {
            let (netns, mut errors) = cri_teardown_blocking(&record.socket);
            errors.extend(teardown(record, None, &netns));
            report(&record.id, &errors);
        }
    }
    // Their directories last: a containerd's CNI DEL writes host-local
    // state into the agent's root directory inside a cluster's. A
    // cluster's node namespaces and LAN go with it.
    for (name, dir, _, _) in dead.iter().filter(|d| d.2.is_none()) {
        for e in crate::netns::sweep(name) {
            eprintln!("skiff-tests: cleanup of cluster {name}: {e}");
        }
        let _ = unmount_under(dir);
        let _ = remove_dir(dir);
    }
    // A cluster leases a block of subnets under its own id.
    for (name, dir, _, _) in &dead {
        if !dir.exists() {
            release_subnets_of(name);
        }
    }
    sweep_subnet_leases();
    dead.into_iter().map(|(name, ..)| name).collect()
}

/// Removes every subnet lease owned by run `id`.
fn release_subnets_of(id: &str) {
    let Ok(entries) = fs::read_dir(SUBNET_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        if fs::read_to_string(entry.path()).is_ok_and(|owner| owner.trim() == id) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn sweep_subnet_leases() {
    let Ok(entries) = fs::read_dir(SUBNET_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(owner) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let owner = owner.trim();
        // A lease is written right after its run directory is created; give
        // a lease without directory a moment in case we raced a creation.
        if is_run_id(owner)
            && !Path::new(TEST_ROOT).join(owner).exists()
            && age(&entry.path()) > Duration::from_secs(5)
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn age(path: &Path) -> Duration {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default()
}

/// Whether `name` looks like a run id (6 lowercase hex digits).
pub fn is_run_id(name: &str) -> bool {
    name.len() == 6
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Takes the lease file `subnets/<index>` for `id`. `Ok(false)` when taken.
///
/// # Errors
/// Fails when the lease directory is not writable.
pub fn lease_subnet(index: u8, id: &str) -> Result<bool> {
    fs::create_dir_all(SUBNET_DIR)?;
    let path = Path::new(SUBNET_DIR).join(index.to_string());
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(id.as_bytes())?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(anyhow!("creating {}: {e}", path.display())),
    }
}

/// Removes `subnets/<index>` if it still belongs to `id`.
///
/// # Errors
/// Fails when the lease exists, is ours and cannot be removed.
pub fn release_subnet(index: u8, id: &str) -> Result<()> {
    let path = Path::new(SUBNET_DIR).join(index.to_string());
    match fs::read_to_string(&path) {
        Ok(owner) if owner.trim() == id => fs::remove_file(&path)
            .with_context(|| format!("removing subnet lease {}", path.display())),
        _ => Ok(()),
    }
}

/// SIGTERMs containerd, waits `grace`, then SIGKILLs it.
fn stop_containerd(record: &RunRecord, child: Option<&mut Child>, grace: Duration) -> Result<()> {
    let config = record.dir.join("config.toml");
    match child {
        Some(child) => terminate_child(child, grace),
        None => {
            let needle = config.to_string_lossy().to_string();
            let pids = processes_mentioning(&needle);
            for pid in &pids {
                let _ = kill(*pid, Signal::SIGTERM);
            }
            let deadline = Instant::now() + grace;
            while pids.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            for pid in pids.iter().filter(|p| is_alive(**p)) {
                let _ = kill(*pid, Signal::SIGKILL);
            }
            Ok(())
        }
    }
}

/// SIGTERM a child, wait up to `grace` for it, then SIGKILL and reap it.
pub(crate) fn terminate_child(child: &mut Child, grace: Duration) -> Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait()?;
    Ok(())
}

/// Whether `pid` runs (a zombie, exited but not yet reaped, does not).
pub fn is_alive(pid: Pid) -> bool {
    // A zombie still answers kill(0); look at its state instead.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Pids of processes whose command line contains `needle` as one argument
/// or part of one (never our own process).
pub fn processes_mentioning(needle: &str) -> Vec<Pid> {
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(needle))
        {
            pids.push(Pid::from_raw(pid as i32));
        }
    }
    pids
}

pub fn kill_processes_mentioning(needle: &str, signal: Signal) -> Vec<Pid> {
    let pids = processes_mentioning(needle);
    for pid in &pids {
        let _ = kill(*pid, signal);
    }
    pids
}

/// Kills `containerd-shim-runc-v2` processes started for our socket and
/// removes their sockets in `/run/containerd/s/`.
fn kill_shims(record: &RunRecord) -> Result<()> {
    let address = record.socket.to_string_lossy().to_string();
    let pids = processes_mentioning(&address);
    let mut sockets = Vec::new();
    for pid in &pids {
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        let flag = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        if let (Some(ns), Some(id)) = (flag("-namespace"), flag("-id")) {
            sockets.push(shim_socket(&address, &ns, &id));
        }
        let _ = kill(*pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in sockets {
        let _ = fs::remove_file(s);
    }
    match pids.iter().find(|p| is_alive(**p)) {
        Some(p) => Err(anyhow!("shim {p} survived SIGKILL")),
        None => Ok(()),
    }
}

/// containerd 1.6 `shim.SocketAddress`: sha256 of `address/ns/id` under
/// `/run/containerd/s/`.
fn shim_socket(address: &str, namespace: &str, id: &str) -> PathBuf {
    let hash = Sha256::digest(format!("{address}/{namespace}/{id}").as_bytes());
    Path::new(SHIM_SOCKET_DIR).join(hex::encode(hash))
}

/// Container ids in a runc root (`<root>/<namespace>/<id>/state.json`).
fn runc_containers(runc_root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(namespaces) = fs::read_dir(runc_root) else {
        return out;
    };
    for ns in namespaces.flatten() {
        let Ok(containers) = fs::read_dir(ns.path()) else {
            continue;
        };
        for c in containers.flatten() {
            if c.path().join("state.json").exists() {
                out.push((ns.path(), c.file_name().to_string_lossy().to_string()));
            }
        }
    }
    out
}

/// Network namespace paths that runc containers in our root joined (the
/// sandboxes' CNI netns): read before the containers are deleted.
fn runc_netns(runc_root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (root, id) in runc_containers(runc_root) {
        let Ok(data) = fs::read(root.join(&id).join("state.json")) else {
            continue;
        };
        let Ok(state) = serde_json::from_slice::<serde_json::Value>(&data) else {
            continue;
        };
        if let Some(namespaces) = state
            .pointer("/config/namespaces")
            .and_then(|n| n.as_array())
        {
            for ns in namespaces {
                if ns["type"] == "NEWNET" {
                    // The sandbox's pinned netns (containers join it via
                    // /proc/<pid>/ns/net, which is nothing to remove).
                    let pinned = ns["path"]
                        .as_str()
                        .filter(|p| !p.is_empty() && !p.starts_with("/proc/"));
                    if let Some(path) = pinned {
                        out.push(PathBuf::from(path));
                    }
                }
            }
        }
    }
    out
}

/// Kills and deletes every container left in our runc root.
fn runc_kill_all(runc_root: &Path) -> Result<()> {
    let mut failed = Vec::new();
    for (root, id) in runc_containers(runc_root) {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["kill", "--all", &id, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let out = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", &id])
            .output();
        match out {
            Ok(o) if o.status.success() || !root.join(&id).exists() => {}
            Ok(o) => failed.push(format!(
                "{id}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => failed.push(format!("{id}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "runc delete --force failed for {}",
            failed.join("; ")
        ))
    }
}

/// Mount points at or under `dir` (from /proc/self/mountinfo), deepest
/// first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// Lazily unmounts every mount at or under `dir`, deepest first, repeating
/// while mounts remain (stacked mounts on one point). Returns how many
/// unmounts succeeded.
///
/// # Errors
/// Fails when mounts are still there after a few rounds.
pub fn unmount_under(dir: &Path) -> Result<usize> {
    let mut count = 0;
    for _ in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return Ok(count);
        }
        for m in mounts {
            if umount2(&m, MntFlags::MNT_DETACH).is_ok() {
                count += 1;
            }
        }
    }
    let left = mounts_under(dir);
    if left.is_empty() {
        Ok(count)
    } else {
        Err(anyhow!("mounts left under {}: {left:?}", dir.display()))
    }
}

/// Network namespaces in [`NETNS_DIR`] that hold an address in
/// 198.18.`index`.0/24 (our sandboxes' eth0).
fn netns_with_subnet(index: u8) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(NETNS_DIR) else {
        return out;
    };
    let prefix = format!(" 198.18.{index}.");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Ok(o) = Command::new("ip")
            .args(["-n", &name, "-o", "-4", "addr", "show"])
            .output()
        else {
            continue;
        };
        if String::from_utf8_lossy(&o.stdout).contains(&prefix) {
            out.push(entry.path());
        }
    }
    out
}

/// Unmounts and removes one pinned network namespace (if it exists).
fn remove_netns(path: &Path) -> Result<()> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let _ = umount2(path, MntFlags::MNT_DETACH);
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow!("removing netns {}: {e}", path.display())),
    }
}

/// Whether a network interface exists in the host namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// `ip link del NAME` if it exists.
fn delete_link(name: &str) -> Result<()> {
    if !link_exists(name) {
        return Ok(());
    }
    let out = Command::new("ip")
        .args(["link", "del", name])
        .output()
        .context("running ip link del")?;
    if out.status.success() || !link_exists(name) {
        Ok(())
    } else {
        Err(anyhow!(
            "ip link del {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes iptables rules (nft and legacy backends) and native nftables rules
/// whose text contains any of `markers`, plus the per-container CNI chains
/// those rules used.
///
/// # Errors
/// Fails when a rule could not be deleted.
pub fn remove_firewall_rules(markers: &[String]) -> Result<()> {
    let mut errors = Vec::new();
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("iptables-legacy-save", "iptables-legacy-restore"),
    ] {
        if let Err(e) = remove_iptables_rules(save, restore, markers) {
            errors.push(format!("{e:#}"));
        }
    }
    if let Err(e) = remove_nft_rules(markers) {
        errors.push(format!("{e:#}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("firewall cleanup: {}", errors.join("; ")))
    }
}

/// Rules of one table from `iptables-save`: chain -> rule specs (the text
/// after `-A CHAIN `).
type Table = BTreeMap<String, Vec<String>>;

fn parse_iptables_save(text: &str) -> BTreeMap<String, Table> {
    let mut tables = BTreeMap::new();
    let mut current: Option<(String, Table)> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            current = Some((name.to_string(), Table::new()));
        } else if line == "COMMIT" {
            if let Some((name, table)) = current.take() {
                tables.insert(name, table);
            }
        } else if let Some((_, table)) = current.as_mut() {
            if let Some(chain) = line.strip_prefix(':') {
                let chain = chain.split(' ').next().unwrap_or_default().to_string();
                table.entry(chain).or_default();
            } else if let Some(rule) = line.strip_prefix("-A ") {
                if let Some((chain, spec)) = rule.split_once(' ') {
                    table
                        .entry(chain.to_string())
                        .or_default()
                        .push(spec.to_string());
                }
            }
        }
    }
    tables
}

/// What to run through `iptables-restore --noflush` for one table: delete
/// rules that mention a marker or jump to a chain of ours, then flush and
/// delete our chains. Our chains: non-shared `CNI-*` chains that a rule
/// mentioning a marker jumps to (portmap's `CNI-DN-*` is entered from a rule
/// whose comment names our network), or whose rules all mention a marker.
fn iptables_cleanup_script(table_name: &str, table: &Table, markers: &[String]) -> Option<String> {
    let mentions = |s: &str| markers.iter().any(|m| s.contains(m.as_str()));
    let targets = |spec: &str| -> Vec<String> {
        let words: Vec<&str> = spec.split_whitespace().collect();
        words
            .windows(2)
            .filter(|w| w[0] == "-j" || w[0] == "-g")
            .map(|w| w[1].to_string())
            .collect()
    };
    let own_candidate = |chain: &str| chain.starts_with("CNI-") && !SHARED_CHAINS.contains(&chain);
    let mut ours: BTreeSet<&str> = table
        .iter()
        .filter(|(chain, rules)| {
            own_candidate(chain) && !rules.is_empty() && rules.iter().all(|r| mentions(r))
        })
        .map(|(c, _)| c.as_str())
        .collect();
    for rules in table.values() {
        for rule in rules.iter().filter(|r| mentions(r)) {
            for target in targets(rule) {
                if let Some((chain, _)) = table.get_key_value(&target) {
                    if own_candidate(chain) {
                        ours.insert(chain.as_str());
                    }
                }
            }
        }
    }
    let jumps_to_ours = |spec: &str| targets(spec).iter().any(|t| ours.contains(t.as_str()));
    let mut script = String::new();
    for (chain, rules) in table {
        if ours.contains(chain.as_str()) {
            continue;
        }
        for spec in rules.iter().filter(|r| mentions(r) || jumps_to_ours(r)) {
            script.push_str(&format!("-D {chain} {spec}\n"));
        }
    }
    for chain in &ours {
        script.push_str(&format!("-F {chain}\n"));
    }
    for chain in &ours {
        script.push_str(&format!("-X {chain}\n"));
    }
    if script.is_empty() {
        None
    } else {
        Some(format!("*{table_name}\n{script}COMMIT\n"))
    }
}

fn remove_iptables_rules(save: &str, restore: &str, markers: &[String]) -> Result<()> {
    let Ok(out) = Command::new(save).stderr(Stdio::null()).output() else {
        return Ok(()); // that backend is not installed
    };
    let text = String::from_utf8_lossy(&out.stdout);
    if !markers.iter().any(|m| text.contains(m.as_str())) {
        return Ok(());
    }
    let mut errors = Vec::new();
    for (name, table) in parse_iptables_save(&text) {
        let Some(script) = iptables_cleanup_script(&name, &table, markers) else {
            continue;
        };
        if let Err(e) = run_with_stdin(restore, &["--noflush"], &script) {
            // One stale line (a rule that vanished meanwhile) fails the whole
            // batch: retry line by line.
            let mut single_failures = 0;
            for line in script.lines().filter(|l| l.starts_with('-')) {
                let one = format!("*{name}\n{line}\nCOMMIT\n");
                if run_with_stdin(restore, &["--noflush"], &one).is_err() {
                    single_failures += 1;
                }
            }
            if single_failures > 0 {
                errors.push(format!("{restore} ({name}): {e:#}"));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(errors.join("; ")))
    }
}

fn run_with_stdin(program: &str, args: &[&str], input: &str) -> Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(anyhow!(
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Native nftables rules (tables not managed by iptables-nft, for example a
/// newer portmap's nft backend) whose text mentions a marker.
fn remove_nft_rules(markers: &[String]) -> Result<()> {
    let Ok(out) = Command::new("nft")
        .args(["-a", "list", "ruleset"])
        .stderr(Stdio::null())
        .output()
    else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut errors = Vec::new();
    let (mut family, mut table, mut chain) = (String::new(), String::new(), String::new());
    for line in text.lines() {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["table", fam, name, ..] => {
                family = fam.to_string();
                table = name.to_string();
            }
            ["chain", name, ..] => chain = name.to_string(),
            _ if markers.iter().any(|m| t.contains(m.as_str())) => {
                let Some(handle) = t
                    .rsplit_once("# handle ")
                    .map(|(_, h)| h.trim().to_string())
                else {
                    continue;
                };
                let out = Command::new("nft")
                    .args(["delete", "rule", &family, &table, &chain, "handle", &handle])
                    .output()?;
                if !out.status.success() {
                    errors.push(format!(
                        "nft delete rule {family} {table} {chain} handle {handle}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
            _ => {}
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(errors.join("; ")))
    }
}

/// `rm -rf dir`, unmounting again if something is still mounted (EBUSY).
fn remove_dir(dir: &Path) -> Result<()> {
    for attempt in 0..3 {
        match fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == 2 => return Err(anyhow!("removing {}: {e}", dir.display())),
            Err(_) => {
                let _ = unmount_under(dir);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}

/// What is left of a run on this machine; empty when cleanup was complete.
/// `netns` are namespace paths the test saw its sandboxes use.
pub fn leftovers(record: &RunRecord, netns: &[PathBuf]) -> Vec<String> {
    let mut left = Vec::new();
    if record.dir.exists() {
        left.push(format!("directory {}", record.dir.display()));
    }
    for m in mounts_under(&record.dir) {
        left.push(format!("mount {}", m.display()));
    }
    if link_exists(&record.bridge) {
        left.push(format!("bridge {}", record.bridge));
    }
    for ns in netns {
        if fs::symlink_metadata(ns).is_ok() {
            left.push(format!("netns {}", ns.display()));
        }
    }
    for ns in netns_with_subnet(record.subnet_index) {
        left.push(format!(
            "netns {} with an address in {}",
            ns.display(),
            record.subnet()
        ));
    }
    for pid in processes_mentioning(&record.dir.to_string_lossy()) {
        if is_alive(pid) {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            left.push(format!(
                "process {pid}: {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    let markers = record.firewall_markers();
    for save in ["iptables-save", "iptables-legacy-save"] {
        if let Ok(out) = Command::new(save).stderr(Stdio::null()).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if markers.iter().any(|m| line.contains(m.as_str())) {
                    left.push(format!("{save}: {line}"));
                }
            }
        }
    }
    if let Ok(owner) =
        fs::read_to_string(Path::new(SUBNET_DIR).join(record.subnet_index.to_string()))
    {
        if owner.trim() == record.id {
            left.push(format!("subnet lease {}", record.subnet()));
        }
    }
    left
}

/// IPv4 networks configured on this host (interface addresses and routes of
/// all tables), as (network, prefix length).
pub fn host_ipv4_networks() -> Vec<(Ipv4Addr, u8)> {
    let mut nets = Vec::new();
    let mut parse = |args: &[&str], field: usize| {
        if let Ok(out) = Command::new("ip").args(args).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let words: Vec<&str> = line.split_whitespace().collect();
                let Some(word) = words.get(field) else {
                    continue;
                };
                if let Some(net) = parse_cidr(word) {
                    nets.push(net);
                }
            }
        }
    };
    parse(&["-o", "-4", "addr", "show"], 3);
    parse(&["-4", "route", "show", "table", "all"], 0);
    // Route keywords such as "local" / "broadcast" precede the destination.
    parse(&["-4", "route", "show", "table", "all"], 1);
    nets
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a.parse().ok()?, l.parse().ok()?),
        None => (s.parse().ok()?, 32),
    };
    (len <= 32).then_some((addr, len))
}

/// Whether two IPv4 networks overlap.
pub fn overlaps(a: (Ipv4Addr, u8), b: (Ipv4Addr, u8)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(a.0) & mask) == (u32::from(b.0) & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_script_deletes_our_rules_and_chains_only() {
        let save = "\
*nat
:PREROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-DN-abc - [0:0]
:CNI-DN-other - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"skiff-a1b2c3\\\" id: \\\"x\\\"\" -m multiport --dports 80 -j CNI-DN-abc
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"other\\\" id: \\\"y\\\"\" -j CNI-DN-other
-A CNI-DN-abc -s 198.18.9.0/24 -p tcp -m tcp --dport 80 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-abc -s 127.0.0.1/32 -d 127.0.0.1/32 -p tcp -m tcp --dport 80 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-abc -p tcp -m tcp --dport 80 -j DNAT --to-destination 198.18.9.5:80
-A CNI-DN-other -p tcp -m tcp --dport 81 -j DNAT --to-destination 10.88.0.5:80
COMMIT
";
        let markers = vec![
            "198.18.9.".to_string(),
            "skb-a1b2c3".to_string(),
            "skiff-a1b2c3".to_string(),
        ];
        let tables = parse_iptables_save(save);
        let script = iptables_cleanup_script("nat", &tables["nat"], &markers).unwrap();
        assert!(script.starts_with("*nat\n"));
        assert!(script.contains(
            "-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"skiff-a1b2c3\\\""
        ));
        assert!(script.contains("-F CNI-DN-abc\n"));
        assert!(script.contains("-X CNI-DN-abc\n"));
        assert!(!script.contains("other"));
        assert!(!script.contains("PREROUTING"));
    }

    #[test]
    fn overlap_and_cidr_parsing() {
        let a = parse_cidr("198.18.7.1/24").unwrap();
        assert!(overlaps(a, parse_cidr("198.18.7.0/24").unwrap()));
        assert!(overlaps(a, parse_cidr("198.18.0.0/15").unwrap()));
        assert!(!overlaps(a, parse_cidr("198.18.8.0/24").unwrap()));
        assert!(parse_cidr("default").is_none());
    }

    #[test]
    fn netns_path_from_containerd_verbose_info() {
        let info = r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}"#;
        assert_eq!(
            netns_from_verbose_info(info),
            Some(PathBuf::from("/var/run/netns/cni-1"))
        );
    }

    #[test]
    fn mountinfo_unescaping_and_run_ids() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert!(is_run_id("0a1b2c"));
        assert!(!is_run_id("cache"));
        assert!(!is_run_id("0A1B2C"));
    }
}
