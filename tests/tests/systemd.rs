//! The daemons under systemd: the shipped unit files verify, both daemons
//! speak the notify protocol (READY=1, WATCHDOG=1, STOPPING=1) on a socket
//! the test listens on, their logs carry journald priorities when stderr
//! is the journal, and a real systemd as PID 1 of a private container
//! installs, starts, restarts, stops and uninstalls them through systemctl
//! (with real systemd-logind holding the agent's shutdown delay lock).
#![allow(clippy::disallowed_methods)] // a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use skiff_daemon::install::{Unit, AGENT_UNIT, SERVER_UNIT};
use skiff_tests::agent::{free_port, workspace_binary};
use skiff_tests::cleanup;
use skiff_tests::pid1::{Pid1, BIN_DIR, FILES_DIR};

fn rendered(name: &'static str, template: &'static str, binary: &Path) -> String {
    Unit {
        name,
        template,
        binary: binary.to_owned(),
        paths: Vec::new(),
    }
    .render()
}

#[test]
fn unit_files_pass_systemd_analyze_verify() -> Result<()> {
    let agent = workspace_binary("skiff-agent", "skiff-agent")?;
    let server = workspace_binary("skiff-control-plane", "skiff-server")?;
    let (_, dir, _lock) = cleanup::create_run_dir()?;
    let units = [
        (
            "skiff-agent.service",
            rendered("skiff-agent.service", AGENT_UNIT, &agent),
        ),
        (
            "skiff-server.service",
            rendered("skiff-server.service", SERVER_UNIT, &server),
        ),
    ];
    // In a private mount namespace with its own /run: the verifier's
    // manager leaves a stamp file in /run/systemd otherwise.
    let verify = |paths: &[&Path]| -> Result<(bool, String)> {
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount -t tmpfs tmpfs /run && exec systemd-analyze verify "$@""#)
            .arg("verify")
            .args(paths)
            .output()
            .context("running systemd-analyze")?;
        Ok((
            out.status.success() && out.stderr.is_empty(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let mut paths = Vec::new();
    for (name, text) in &units {
        // Only the binary's path differs from the shipped file.
        ensure!(
            text.contains("Type=notify") && text.contains("Restart=always"),
            "{name}"
        );
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        paths.push(p);
    }
    let agent_unit = &units[0].1;
    for want in [
        "KillMode=process",
        "After=containerd.service",
        "Wants=containerd.service",
        "LimitNOFILE=",
        "WatchdogSec=",
    ] {
        ensure!(agent_unit.contains(want), "the agent unit lacks {want}");
    }
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let (ok, errors) = verify(&refs)?;
    let broken = dir.join("broken.service");
    std::fs::write(&broken, units[0].1.replace("Type=notify", "Type=notifyy"))?;
    let (broken_ok, _) = verify(&[broken.as_path()])?;
    std::fs::remove_dir_all(&dir)?;
    ensure!(ok, "systemd-analyze verify: {errors}");
    ensure!(!broken_ok, "systemd-analyze verify accepts anything");
    Ok(())
}

/// Read notify datagrams until `want` returns true or `within` passes.
fn read_notify(
    sock: &UnixDatagram,
    within: Duration,
    mut want: impl FnMut(&str) -> bool,
) -> Result<Vec<String>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(Duration::from_millis(500)))?;
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = want(&msg);
                seen.push(msg);
                if done {
                    return Ok(seen);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    bail!("notifications so far: {seen:?}")
}

fn terminate(child: &mut Child) -> Result<()> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    Ok(())
}

/// Start `binary args` with the notify socket and a 1 s watchdog; expect
/// READY=1, then watchdog pings, then STOPPING=1 on SIGTERM.
fn notify_protocol(what: &str, binary: &Path, args: &[String], dir: &Path) -> Result<()> {
    let path = dir.join(format!("{what}-notify.sock"));
    let sock = UnixDatagram::bind(&path)?;
    let log = std::fs::File::create(dir.join(format!("{what}.log")))?;
    let mut child = Command::new(binary)
        .args(args)
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "1000000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let result = (|| -> Result<()> {
        let seen = read_notify(&sock, Duration::from_secs(60), |m| {
            m.lines().any(|l| l == "READY=1")
        })
        .with_context(|| format!("{what}: no READY=1"))?;
        ensure!(
            seen.iter().any(|m| m.contains("STATUS=")),
            "{what}: READY=1 without a STATUS: {seen:?}"
        );
        let mut pings = 0;
        read_notify(&sock, Duration::from_secs(10), |m| {
            pings += m.lines().filter(|l| *l == "WATCHDOG=1").count();
            pings >= 3
        })
        .with_context(|| format!("{what}: fewer than 3 watchdog pings"))?;
        terminate(&mut child)?;
        read_notify(&sock, Duration::from_secs(20), |m| {
            m.lines().any(|l| l == "STOPPING=1")
        })
        .with_context(|| format!("{what}: no STOPPING=1 after SIGTERM"))?;
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.map_err(|e| {
        let log = std::fs::read_to_string(dir.join(format!("{what}.log"))).unwrap_or_default();
        e.context(format!("{what} log:\n{log}"))
    })
}

#[test]
fn daemons_notify_readiness_and_feed_the_watchdog() -> Result<()> {
    let agent = workspace_binary("skiff-agent", "skiff-agent")?;
    let server = workspace_binary("skiff-control-plane", "skiff-server")?;
    let (_, dir, _lock) = cleanup::create_run_dir()?;
    let result = (|| -> Result<()> {
        let server_args = vec![
            format!("--data-dir={}", dir.join("server").display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--disable-controller-manager".into(),
            "--disable-scheduler".into(),
        ];
        notify_protocol("skiff-server", &server, &server_args, &dir)?;
        // A standalone agent: no API server, no runtime needed to serve.
        let agent_args = vec![
            format!("--root-dir={}", dir.join("agent").display()),
            format!("--pod-log-dir={}", dir.join("logs").display()),
            format!("--config-dir={}", dir.join("agent-config").display()),
            format!(
                "--container-runtime-endpoint=unix://{}",
                dir.join("no-runtime.sock").display()
            ),
            "--status-address=none".into(),
            "--port=0".into(),
        ];
        notify_protocol("skiff-agent", &agent, &agent_args, &dir)
    })();
    let _ = cleanup::unmount_under(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[test]
fn logs_carry_journald_priorities_only_when_stderr_is_the_journal() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let agent = workspace_binary("skiff-agent", "skiff-agent")?;
    let (_, dir, _lock) = cleanup::create_run_dir()?;
    let run = |journal: bool| -> Result<String> {
        let path = dir.join(format!("agent-{journal}.log"));
        let log = std::fs::File::create(&path)?;
        let meta = std::fs::metadata(&path)?;
        let mut cmd = Command::new(&agent);
        cmd.args([
            format!("--root-dir={}", dir.join("agent").display()),
            format!("--pod-log-dir={}", dir.join("logs").display()),
            format!("--config-dir={}", dir.join("agent-config").display()),
            format!(
                "--container-runtime-endpoint=unix://{}",
                dir.join("none.sock").display()
            ),
            "--status-address=none".into(),
            "--port=0".into(),
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        if journal {
            // What systemd sets when it connects stderr to the journal.
            cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        } else {
            cmd.env("JOURNAL_STREAM", "1:1");
        }
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&path)?.contains("skiff-agent starting") {
            ensure!(Instant::now() < deadline, "the agent logged nothing");
            std::thread::sleep(Duration::from_millis(100));
        }
        terminate(&mut child)?;
        let _ = child.wait();
        Ok(std::fs::read_to_string(&path)?)
    };
    let result = (|| -> Result<()> {
        let journal = run(true)?;
        let line = journal
            .lines()
            .find(|l| l.contains("skiff-agent starting"))
            .context("no start line")?;
        ensure!(line.starts_with("<6>INFO "), "journal line: {line:?}");
        ensure!(
            journal
                .lines()
                .filter(|l| !l.is_empty())
                .all(|l| l.starts_with('<')),
            "every journal line has a priority: {journal}"
        );
        ensure!(!journal.contains('\u{1b}'), "colour codes in the journal");
        let plain = run(false)?;
        ensure!(
            !plain.contains("<6>") && !plain.contains('\u{1b}'),
            "plain log: {plain}"
        );
        ensure!(plain.contains("skiff-agent starting"), "{plain}");
        Ok(())
    })();
    let _ = cleanup::unmount_under(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The agent's config inside the container: no runtime there (nspawn
/// hands out no writable cgroup controllers for runc), a short watchdog is
/// added by a drop-in, graceful shutdown armed.
const AGENT_CONFIG: &str = "containerRuntimeEndpoint: unix:///run/no-runtime.sock
rotateCertificates: true
shutdownGracePeriod: 10s
shutdownGracePeriodCriticalPods: 3s
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_as_pid1_installs_starts_restarts_and_uninstalls_both_daemons() -> Result<()> {
    let agent = workspace_binary("skiff-agent", "skiff-agent")?;
    let bin_dir = agent.parent().context("binary dir")?.to_owned();
    let c = Pid1::boot(&bin_dir, &[("agent.yaml", AGENT_CONFIG)]).await?;
    let result = scenario(&c).await;
    if result.is_err() {
        eprintln!("----- container console\n{}", c.console_tail(80));
        if let Ok(r) = c.exec(&["journalctl", "--no-pager", "-n", "80"]) {
            eprintln!("----- journal\n{}{}", r.stdout, r.stderr);
        }
    }
    // The machine goes down with the agent holding its delay lock: logind
    // announces it, the agent stops its (no) pods and releases the lock,
    // and only then does systemd stop the agent.
    let console = c.poweroff();
    result?;
    let console = console?;
    let find = |needle: &str| {
        console
            .find(needle)
            .with_context(|| format!("no {needle:?} on the console:\n{console}"))
    };
    let announced = find("node is shutting down: stopping pods")?;
    let released = find("releasing the inhibitor lock")?;
    ensure!(announced < released, "released before stopping pods");
    Ok(())
}

async fn wait_inside<F: Fn() -> Result<()>>(what: &str, within: Duration, probe: F) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        match probe() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("{what}: {e:#}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `skiff-server token create` inside; the join token.
fn create_token(c: &Pid1) -> Result<String> {
    Ok(c.exec_ok(&[
        "/usr/local/bin/skiff-server",
        "token",
        "create",
        "--data-dir",
        "/var/lib/skiff-server",
    ])?
    .trim()
    .to_string())
}

/// `skiff-agent install` inside, joining the server there as `pid1-node`.
fn install_agent(c: &Pid1, token: &str) -> Result<()> {
    c.exec_ok(&[
        &format!("{BIN_DIR}/skiff-agent"),
        "install",
        "--server",
        "https://127.0.0.1:6443",
        "--token",
        token,
        "--node-name",
        "pid1-node",
        "--config-from",
        &format!("{FILES_DIR}/agent.yaml"),
    ])
    .map(drop)
}

async fn scenario(c: &Pid1) -> Result<()> {
    let server = format!("{BIN_DIR}/skiff-server");
    let agent = format!("{BIN_DIR}/skiff-agent");
    // The control plane, installed and started by systemd.
    c.exec_ok(&[&server, "install", "--data-dir", "/var/lib/skiff-server"])?;
    ensure!(c.property("skiff-server.service", "ActiveState")? == "active");
    ensure!(c.property("skiff-server.service", "Type")? == "notify");
    // `systemctl start` of a Type=notify unit returns after READY=1.
    ensure!(
        c.property("skiff-server.service", "StatusText")?
            .starts_with("serving on "),
        "StatusText: {}",
        c.property("skiff-server.service", "StatusText")?
    );
    let token = create_token(c)?;

    // The agent: join and start in one command.
    install_agent(c, &token)?;
    ensure!(c.property("skiff-agent.service", "ActiveState")? == "active");
    for (prop, want) in [
        ("KillMode", "process"),
        ("Type", "notify"),
        ("Restart", "always"),
        ("LimitNOFILE", "1048576"),
    ] {
        ensure!(c.property("skiff-agent.service", prop)? == want, "{prop}");
    }
    let kubectl = |args: &[&str]| -> Result<String> {
        let mut all = vec![
            "kubectl",
            "--kubeconfig",
            "/var/lib/skiff-server/admin.kubeconfig",
        ];
        all.extend_from_slice(args);
        c.exec_ok(&all)
    };
    wait_inside("the agent's Node", Duration::from_secs(60), || {
        kubectl(&["get", "node", "pid1-node", "-o", "name"]).map(drop)
    })
    .await?;
    // Real logind holds the agent's delay lock.
    wait_inside(
        "the agent's inhibitor lock",
        Duration::from_secs(30),
        || {
            let list = c.exec_ok(&["systemd-inhibit", "--list", "--no-pager"])?;
            ensure!(
                list.lines().any(|l| l.contains("skiff-agent")
                    && l.contains("shutdown")
                    && l.contains("delay")),
                "{list}"
            );
            Ok(())
        },
    )
    .await?;

    // A short watchdog through a drop-in: systemd records the pings.
    c.exec_ok(&["mkdir", "-p", "/etc/systemd/system/skiff-agent.service.d"])?;
    c.exec_ok(&[
        "sh",
        "-c",
        "printf '[Service]\\nWatchdogSec=2s\\n' > /etc/systemd/system/skiff-agent.service.d/watchdog.conf",
    ])?;
    c.exec_ok(&["systemctl", "daemon-reload"])?;
    let pid_before = c.property("skiff-agent.service", "MainPID")?;
    c.exec_ok(&["systemctl", "restart", "skiff-agent.service"])?;
    let pid_after = c.property("skiff-agent.service", "MainPID")?;
    ensure!(
        pid_before != pid_after && pid_after != "0",
        "restart kept MainPID {pid_before}"
    );
    ensure!(c.property("skiff-agent.service", "WatchdogUSec")? == "2s");
    let first = c.property("skiff-agent.service", "WatchdogTimestampMonotonic")?;
    wait_inside("watchdog pings recorded", Duration::from_secs(20), || {
        let now = c.property("skiff-agent.service", "WatchdogTimestampMonotonic")?;
        ensure!(
            now != first && now != "0",
            "WatchdogTimestampMonotonic stays {now}"
        );
        Ok(())
    })
    .await?;
    // Pings keep it alive past several watchdog periods.
    tokio::time::sleep(Duration::from_secs(6)).await;
    ensure!(
        c.property("skiff-agent.service", "MainPID")? == pid_after,
        "the watchdog killed the agent"
    );
    ensure!(c.property("skiff-agent.service", "NRestarts")? == "0");

    c.exec_ok(&["systemctl", "stop", "skiff-agent.service"])?;
    ensure!(c.property("skiff-agent.service", "ActiveState")? == "inactive");
    c.exec_ok(&["systemctl", "start", "skiff-agent.service"])?;
    ensure!(c.property("skiff-agent.service", "ActiveState")? == "active");

    // Uninstall: the unit, its binary, and with --purge the credentials.
    c.exec_ok(&[&agent, "uninstall", "--purge"])?;
    ensure!(
        c.exec(&["test", "-e", "/etc/systemd/system/skiff-agent.service"])?
            .ok
            == false
    );
    ensure!(c.exec(&["test", "-e", "/etc/skiff/agent/kubeconfig"])?.ok == false);
    ensure!(c.exec(&["test", "-e", "/usr/local/bin/skiff-agent"])?.ok == false);
    ensure!(c.property("skiff-agent.service", "LoadState")? == "not-found");
    c.exec_ok(&[&server, "uninstall", "--purge"])?;
    ensure!(c.exec(&["test", "-e", "/var/lib/skiff-server"])?.ok == false);
    ensure!(c.property("skiff-server.service", "LoadState")? == "not-found");

    // Installed again, the agent's logs also on the console, for the
    // shutdown at the end.
    c.exec_ok(&[&server, "install", "--data-dir", "/var/lib/skiff-server"])?;
    let token = create_token(c)?;
    install_agent(c, &token)?;
    c.exec_ok(&[
        "sh",
        "-c",
        "printf '[Service]\\nStandardOutput=journal+console\\nStandardError=journal+console\\n' > /etc/systemd/system/skiff-agent.service.d/console.conf",
    ])?;
    c.exec_ok(&["systemctl", "daemon-reload"])?;
    c.exec_ok(&["systemctl", "restart", "skiff-agent.service"])?;
    wait_inside(
        "the agent's inhibitor lock again",
        Duration::from_secs(30),
        || {
            let list = c.exec_ok(&["systemd-inhibit", "--list", "--no-pager"])?;
            ensure!(list.contains("skiff-agent"), "{list}");
            Ok(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_purge_removes_the_nodes_pods_mounts_state_and_credentials() -> Result<()> {
    use skiff_tests::agent::{pods, Agent, AgentOptions};
    use skiff_tests::{Containerd, TOOLBOX_IMAGE};
    let cd = Containerd::start().await?;
    let mut agent = Agent::start(&cd, AgentOptions::default()).await?;
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: doomed}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n    volumeMounts: [{{name: mem, mountPath: /mem}}]\n  volumes: [{{name: mem, emptyDir: {{medium: Memory}}}}]\n"
    );
    agent.write_manifest("doomed.yaml", &manifest)?;
    let name = agent.pod_name("doomed");
    agent
        .wait_pod(&name, Duration::from_secs(90), "running", pods::all_running)
        .await?;
    // Stopping the agent leaves its containers running (KillMode=process
    // relies on that); purging is what removes them.
    agent.terminate()?;
    let cri = cd.client();
    let running = |cs: &[cri_proto::v1::Container]| {
        cs.iter()
            .filter(|c| c.state == cri_proto::v1::ContainerState::ContainerRunning as i32)
            .count()
    };
    let listed = cri
        .list_containers(cri_proto::v1::ListContainersRequest::default())
        .await?
        .containers;
    ensure!(
        running(&listed) == 1,
        "the pod stopped with the agent: {listed:?}"
    );
    let root = agent.dir().join("root");
    ensure!(
        !cleanup::mounts_under(&root).is_empty(),
        "no tmpfs under the root dir"
    );

    // What install leaves: the config and the credentials of a join.
    let config_dir = agent.dir().join("config");
    std::fs::create_dir_all(config_dir.join("pki"))?;
    std::fs::write(
        config_dir.join("config.yaml"),
        format!(
            "containerRuntimeEndpoint: {}\nrootDir: {}\npodLogDir: {}\n",
            cd.endpoint(),
            root.display(),
            agent.log_dir().display()
        ),
    )?;
    std::fs::write(config_dir.join("kubeconfig"), "{}")?;
    std::fs::write(config_dir.join("pki/kubelet-client-current.pem"), "secret")?;
    let binary = workspace_binary("skiff-agent", "skiff-agent")?;
    // In a network namespace of its own, with what a node of a cluster
    // has programmed there (the proxy's table and chains, the masquerade
    // table, a route to another node's pods), none of which may survive.
    let node_network = "set -e; ip link set lo up; \
         nft add table ip skiff-proxy; nft add table ip skiff-network; \
         iptables -w -t nat -N SKIFF-SERVICES; \
         iptables -w -t nat -A PREROUTING -m comment --comment 'skiff service portals' -j SKIFF-SERVICES; \
         ip route add 198.18.250.0/24 dev lo proto 88; \
         \"$@\"; set +e; echo ==; nft list tables | grep skiff; iptables-save | grep SKIFF; ip route show proto 88; true";
    let out = Command::new("unshare")
        .args(["--net", "sh", "-c", node_network, "sh"])
        .arg(&binary)
        .args(["uninstall", "--purge"])
        .arg(format!("--config-dir={}", config_dir.display()))
        .arg(format!(
            "--unit-dir={}",
            agent.dir().join("units").display()
        ))
        .arg(format!("--bin-dir={}", agent.dir().join("bin").display()))
        .output()?;
    ensure!(
        out.status.success(),
        "uninstall --purge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (_, left_programmed) = stdout.split_once("==\n").context("no listing")?;
    ensure!(
        left_programmed.trim().is_empty(),
        "proxy rules, masquerade table or pod routes left: {left_programmed}"
    );
    let left = cri
        .list_containers(cri_proto::v1::ListContainersRequest::default())
        .await?
        .containers;
    ensure!(left.is_empty(), "containers left: {left:?}");
    let sandboxes = cri
        .list_pod_sandbox(cri_proto::v1::ListPodSandboxRequest::default())
        .await?
        .items;
    ensure!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    ensure!(
        cleanup::mounts_under(&root).is_empty(),
        "mounts left under {}",
        root.display()
    );
    ensure!(!root.exists(), "root dir left");
    ensure!(!config_dir.exists(), "config dir (credentials) left");
    let logs: Vec<_> = std::fs::read_dir(agent.log_dir())
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    ensure!(logs.is_empty(), "pod logs left: {logs:?}");
    Ok(())
}
