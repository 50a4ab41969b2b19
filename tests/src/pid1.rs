//! A real systemd as PID 1 of a private container (`systemd-nspawn`),
//! sharing nothing writable with the host, for tests that install and run
//! the daemons through systemctl.
//!
//! # Isolation
//! - PID, mount, UTS, IPC and network namespaces of its own; the network
//!   has only loopback, so nothing it runs reaches beyond it.
//! - Its root is a skeleton in the run directory, read-only, with the
//!   host's `/usr` bound read-only; `/etc` is an overlay whose upper layer
//!   is in the run directory (the host's `/etc` is never written);
//!   `/var`, `/tmp`, `/root` and `/usr/local/bin` are fresh tmpfs; nspawn
//!   gives it its own `/run`, `/dev` and `/proc`. systemd-tmpfiles inside
//!   can only clean what is the container's.
//! - nspawn itself runs in a private mount namespace with a private tmpfs
//!   on `/run`, so not even its bookkeeping touches the host's `/run`.
//! - Its processes live in a cgroup `skiff-test-<id>` of the name=systemd
//!   and unified hierarchies; stopping it kills that cgroup and removes it,
//!   and a later boot sweeps such cgroups of dead runs.
//!
//! The test binaries are bound read-only at `/opt/skiff` inside.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cleanup::{self, RunLock};
use crate::join::Ran;

/// Where the test binaries appear inside.
pub const BIN_DIR: &str = "/opt/skiff";
/// Where the run directory's `files/` appears inside.
pub const FILES_DIR: &str = "/opt/files";
/// The cgroup hierarchies the container's processes are put in.
const HIERARCHIES: &[&str] = &["/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"];
/// How long a boot and a poweroff may take.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one command inside may take.
const EXEC_TIMEOUT: Duration = Duration::from_secs(180);

/// A booted container.
pub struct Pid1 {
    id: String,
    dir: PathBuf,
    nspawn: Option<Child>,
    leader: u32,
    /// Held for the container's life; dropped after everything else.
    _lock: RunLock,
}

/// The unit the container boots into: the system bus and logind, nothing
/// of the host's enabled units.
const TARGET: &str =
    "[Unit]\nDescription=skiff test target\nWants=dbus.socket systemd-logind.service\n";

fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    HIERARCHIES
        .iter()
        .map(|h| Path::new(h).join(format!("skiff-test-{id}")))
        .collect()
}

/// Kill every process of a cgroup tree and remove it, deepest first.
fn remove_cgroup_tree(root: &Path) {
    if !root.exists() {
        return;
    }
    // cgroup.kill exists on the unified hierarchy (Linux 5.14+).
    let _ = std::fs::write(root.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut dirs = Vec::new();
        collect_dirs(root, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        let mut left = false;
        for d in &dirs {
            if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            if std::fs::remove_dir(d).is_err() {
                left = true;
            }
        }
        if !left || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn collect_dirs(d: &Path, out: &mut Vec<PathBuf>) {
    out.push(d.to_owned());
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}

/// Cgroups of earlier runs whose run directory is gone (a SIGKILLed test).
fn sweep_stale_cgroups() {
    for h in HIERARCHIES {
        for e in std::fs::read_dir(h).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name.strip_prefix("skiff-test-") else {
                continue;
            };
            if !Path::new(cleanup::TEST_ROOT).join(id).exists() {
                remove_cgroup_tree(&e.path());
            }
        }
    }
}

impl Pid1 {
    /// Boot a container with `binaries` bound at [`BIN_DIR`] and
    /// `files` (copied into the run directory) at [`FILES_DIR`], and wait
    /// until its systemd reports the system running.
    ///
    /// # Errors
    /// Not root, no systemd-nspawn, or the boot does not finish.
    pub async fn boot(binaries: &Path, files: &[(&str, &str)]) -> Result<Pid1> {
        ensure!(
            nix::unistd::geteuid().is_root(),
            "the systemd container needs root"
        );
        ensure!(
            Path::new("/usr/bin/systemd-nspawn").exists(),
            "systemd-nspawn is missing (Debian package systemd-container; scripts/deps.sh installs it)"
        );
        tokio::task::spawn_blocking(|| {
            cleanup::sweep_stale();
            sweep_stale_cgroups();
        })
        .await?;
        let (id, dir, lock) = cleanup::create_run_dir()?;
        let mut c = Pid1 {
            id,
            dir,
            nspawn: None,
            leader: 0,
            _lock: lock,
        };
        c.spawn(binaries, files)?;
        c.wait_running().await?;
        Ok(c)
    }

    fn spawn(&mut self, binaries: &Path, files: &[(&str, &str)]) -> Result<()> {
        let root = self.dir.join("root");
        for d in [
            "usr",
            "etc",
            "var",
            "tmp",
            "run",
            "dev",
            "proc",
            "sys",
            "root",
            "opt/skiff",
            "opt/files",
        ] {
            std::fs::create_dir_all(root.join(d))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            std::os::unix::fs::symlink(to, root.join(link))?;
        }
        // nspawn looks for os-release before it mounts anything.
        std::fs::copy("/etc/os-release", root.join("etc/os-release"))?;
        let upper = self.dir.join("etc-upper");
        std::fs::create_dir_all(upper.join("systemd/system"))?;
        std::fs::create_dir_all(upper.join("skiff"))?;
        std::fs::write(upper.join("systemd/system/skiff-test.target"), TARGET)?;
        // The host's containerd cannot run containers here (no writable
        // cgroup controllers): masked, so that units wanting it go on
        // without it at once.
        std::os::unix::fs::symlink("/dev/null", upper.join("systemd/system/containerd.service"))?;
        let host_files = self.dir.join("files");
        std::fs::create_dir_all(&host_files)?;
        for (name, text) in files {
            std::fs::write(host_files.join(name), text)?;
        }
        for cg in cgroup_dirs(&self.id) {
            std::fs::create_dir_all(&cg)
                .with_context(|| format!("creating cgroup {}", cg.display()))?;
        }
        let procs: Vec<String> = cgroup_dirs(&self.id)
            .iter()
            .map(|c| format!("echo $$ > {}/cgroup.procs", c.display()))
            .collect();
        let nspawn = format!(
            "systemd-nspawn --quiet --machine=skiff-{id} --directory={root} --read-only \
             --private-network --register=no --keep-unit \
             --bind-ro=/usr --overlay=/etc:{upper}:/etc \
             --tmpfs=/usr/local/bin --tmpfs=/var --tmpfs=/tmp --tmpfs=/root \
             --bind-ro={bin}:{BIN_DIR} --bind-ro={files}:{FILES_DIR} \
             -b -- systemd.unit=skiff-test.target",
            id = self.id,
            root = root.display(),
            upper = upper.display(),
            bin = binaries.display(),
            files = host_files.display(),
        );
        let script = format!(
            "{} && mount -t tmpfs tmpfs /run && exec {nspawn}",
            procs.join(" && ")
        );
        let console = std::fs::File::create(self.dir.join("console.log"))?;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(console.try_clone()?)
            .stderr(console)
            .spawn()
            .context("starting systemd-nspawn")?;
        self.nspawn = Some(child);
        Ok(())
    }

    /// The container's PID 1 as the host sees it: the one process of
    /// `payload/init.scope`.
    fn find_leader(&self) -> Option<u32> {
        let procs = Path::new(HIERARCHIES[0])
            .join(format!("skiff-test-{}", self.id))
            .join("payload/init.scope/cgroup.procs");
        std::fs::read_to_string(procs)
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    async fn wait_running(&mut self) -> Result<()> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Some(child) = self.nspawn.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "systemd-nspawn exited ({status}):\n{}",
                        self.console_tail(40)
                    );
                }
            }
            if self.leader == 0 {
                self.leader = self.find_leader().unwrap_or(0);
            }
            if self.leader != 0 {
                let r = self.exec(&["systemctl", "is-system-running"])?;
                let state = r.stdout.trim().to_string();
                if state == "running" || state == "degraded" {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the container did not finish booting:\n{}",
                    self.console_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Run `args` inside (all its namespaces), bounded in time.
    ///
    /// # Errors
    /// nsenter cannot be run.
    pub fn exec(&self, args: &[&str]) -> Result<Ran> {
        let out = Command::new("timeout")
            .arg(format!("{}", EXEC_TIMEOUT.as_secs()))
            .args(["nsenter", "-t", &self.leader.to_string(), "-a", "--"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running nsenter")?;
        Ok(out.into())
    }

    /// [`exec`](Self::exec) that must succeed; its stdout.
    ///
    /// # Errors
    /// It failed (stderr and stdout in the error).
    pub fn exec_ok(&self, args: &[&str]) -> Result<String> {
        let r = self.exec(args)?;
        ensure!(r.ok, "{args:?} failed: {}{}", r.stderr, r.stdout);
        Ok(r.stdout)
    }

    /// `systemctl show UNIT -p PROP --value`.
    ///
    /// # Errors
    /// systemctl failed.
    pub fn property(&self, unit: &str, prop: &str) -> Result<String> {
        Ok(self
            .exec_ok(&["systemctl", "show", unit, "-p", prop, "--value"])?
            .trim()
            .to_string())
    }

    /// The container's console (systemd's and nspawn's output).
    pub fn console_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Power the container off the way an operator does (`systemctl
    /// poweroff`: through logind, which honours inhibitor locks), wait for
    /// it, and return its whole console; what remains is killed and
    /// everything it created removed.
    ///
    /// # Errors
    /// It did not power off in time (it was killed then).
    pub fn poweroff(mut self) -> Result<String> {
        let clean = self.stop(true);
        let console = std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default();
        self.remove();
        clean.map(|()| console)
    }

    fn stop(&mut self, gracefully: bool) -> Result<()> {
        let Some(mut child) = self.nspawn.take() else {
            return Ok(());
        };
        if gracefully && self.leader != 0 {
            let _ = self.exec(&["systemctl", "poweroff"]);
            let deadline = Instant::now() + BOOT_TIMEOUT;
            while Instant::now() < deadline {
                if child.try_wait()?.is_some() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        for cg in cgroup_dirs(&self.id) {
            remove_cgroup_tree(&cg);
        }
        let _ = child.kill();
        let _ = child.wait();
        if gracefully {
            bail!(
                "the container did not power off in time:\n{}",
                self.console_tail(30)
            );
        }
        Ok(())
    }

    fn remove(&mut self) {
        for cg in cgroup_dirs(&self.id) {
            remove_cgroup_tree(&cg);
        }
        let _ = cleanup::unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Pid1 {
    fn drop(&mut self) {
        if self.nspawn.is_some() {
            eprintln!("----- container console\n{}", self.console_tail(60));
            let _ = self.stop(false);
        }
        self.remove();
    }
}
