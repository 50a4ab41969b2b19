//! Joining nodes with tokens, end to end with real processes: `skiff-server
//! token create`, `skiff-agent join`, the agents started on what the join
//! wrote, a Deployment over the joined nodes, certificate rotation with a
//! short certificate lifetime, and every way a join must fail cleanly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::ListParams;
use kube::Api;
use skiff_tests::agent::free_port;
use skiff_tests::cluster::{node_ready, node_server_address, wait_for, Cluster, ClusterOptions};
use skiff_tests::join::{client_pem_of, kubeconfig_of, JoinCli};
use skiff_tests::TOOLBOX_IMAGE;

/// Time for anything that involves starting pods or nodes.
const T: Duration = Duration::from_secs(90);
/// The longest certificate the signer issues in the rotation test: short,
/// so that both certificates rotate more than once during the test.
const CERT_LIFETIME: &str = "40s";

const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: IMAGE
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
"#;

/// Serial number and issuer CN of a PEM certificate.
fn identity_of(pem: &str) -> Result<(String, String, String)> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("not PEM: {e}"))?;
    let cert = block.parse_x509().context("not a certificate")?;
    let cn = |n: &x509_parser::x509::X509Name| {
        n.iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    Ok((
        cert.raw_serial_as_string(),
        cn(cert.subject()),
        cn(cert.issuer()),
    ))
}

/// The certificate the node server at `endpoint` (ip:port) presents.
fn served_certificate(endpoint: &str) -> Result<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", endpoint])
        .stdin(Stdio::null())
        .output()
        .context("running openssl s_client")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find("-----BEGIN CERTIFICATE-----")
        .context("no certificate in the handshake")?;
    let end = text
        .find("-----END CERTIFICATE-----")
        .context("truncated certificate")?;
    Ok(text[start..end + "-----END CERTIFICATE-----".len()].to_string() + "\n")
}

/// Container ids and restart counts of the Deployment's pods.
async fn containers(client: &kube::Client) -> Result<BTreeMap<String, (String, i32)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("app=web"))
        .await?;
    let mut out = BTreeMap::new();
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let cs = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let c = cs
            .first()
            .with_context(|| format!("{name}: no container status"))?;
        ensure!(c.ready, "{name} is not ready");
        out.insert(
            name,
            (c.container_id.clone().unwrap_or_default(), c.restart_count),
        );
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_nodes_run_a_deployment_and_rotate_their_certificates() -> Result<()> {
    let options = ClusterOptions {
        server_args: vec![format!("--cluster-signing-duration={CERT_LIFETIME}")],
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start(0, options).await?;
    let cli = JoinCli::new(&cluster)?;
    let token = cli.token_create(&["--ttl", "10m", "--description", "e2e"])?;
    ensure!(
        token.starts_with("K10") && token.contains("::"),
        "not a join token: {token}"
    );
    let listed = cli.token(&["list"])?;
    ensure!(
        listed.ok && listed.stdout.contains("e2e"),
        "token list: {listed:?}"
    );
    ensure!(
        !listed
            .stdout
            .contains(token.split('.').nth(1).unwrap_or("?")),
        "token list shows the secret"
    );

    let mut names = Vec::new();
    for _ in 0..2 {
        names.push(
            cli.add_joined_node(&mut cluster, &token, &["--rotate-server-certificates"])
                .await?,
        );
    }
    let client = cluster.client().await?;
    for n in &names {
        let cn = identity_of(&std::fs::read_to_string(client_pem_of(&cli.config_dir(n)))?)?.1;
        ensure!(
            cn == format!("system:node:{n}"),
            "{n}'s client certificate is for {cn}"
        );
    }

    cluster
        .apply(&DEPLOYMENT.replace("IMAGE", TOOLBOX_IMAGE))
        .await?;
    let before = wait_for("the Deployment's pods on both nodes", T, || async {
        let pods = Api::<Pod>::namespaced(client.clone(), "default")
            .list(&ListParams::default().labels("app=web"))
            .await?;
        let on: BTreeSet<String> = pods
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        ensure!(on.len() == 2, "pods on {on:?}");
        let c = containers(&client).await?;
        ensure!(c.len() == 2, "{} ready pods", c.len());
        Ok(c)
    })
    .await?;

    // Rotation: watch both certificates of both nodes change twice while
    // the nodes stay Ready and no container restarts.
    let mut seen: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    let mut not_ready = Vec::new();
    let nodes_api = Api::<NodeObject>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        for n in &names {
            let client_pem = std::fs::read_to_string(client_pem_of(&cli.config_dir(n)))?;
            let (serial, _, issuer) = identity_of(&client_pem)?;
            ensure!(
                issuer == "skiff-ca",
                "{n}'s client certificate is issued by {issuer}"
            );
            let entry = seen.entry(n.clone()).or_default();
            entry.0.insert(serial);
            let served = served_certificate(&node_server_address(&client, n).await?)?;
            let (serial, subject, issuer) = identity_of(&served)?;
            // Until the first serving certificate is issued, the node
            // serves its self-signed one.
            if issuer == "skiff-ca" {
                ensure!(
                    subject == format!("system:node:{n}"),
                    "{n} serves a certificate for {subject}"
                );
                entry.1.insert(serial);
            }
            let node = nodes_api.get(n).await?;
            if !node_ready(&node) {
                not_ready.push(format!("{n} at {:?}", Instant::now()));
            }
        }
        let done = seen.values().all(|(c, s)| c.len() >= 3 && s.len() >= 3);
        if done {
            break;
        }
        if Instant::now() > deadline {
            bail!("certificates did not rotate twice: {seen:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ensure!(
        not_ready.is_empty(),
        "nodes went NotReady during rotation: {not_ready:?}"
    );
    let after = containers(&client).await?;
    ensure!(
        after == before,
        "containers changed during rotation: before {before:?}, after {after:?}"
    );
    // The node still acts with its rotated certificate: its Lease moves.
    for n in &names {
        cluster.wait_node_ready(n, T).await?;
    }
    // Every CSR went through the API: approved, issued.
    // (A renewal may be in flight as we look: pending rows are fine.)
    let table = cluster.kubectl_ok(&["get", "csr"]).await?;
    let rows: Vec<&str> = table.lines().skip(1).collect();
    let issued = rows
        .iter()
        .filter(|r| r.ends_with("Approved,Issued"))
        .count();
    ensure!(issued >= 2 * (3 + 3), "CSRs: {table}");
    ensure!(
        !rows
            .iter()
            .any(|r| r.contains("Denied") || r.contains("Failed")),
        "no CSR denied or failed: {table}"
    );
    ensure!(
        rows.iter().any(
            |r| r.contains("kubernetes.io/kubelet-serving") && r.contains("system:node:node-1")
        ),
        "{table}"
    );
    ensure!(
        rows.iter().any(|r| r.contains("kube-apiserver-client-kubelet") && r.contains("system:bootstrap:")),
        "{table}"
    );
    cluster.finish().await
}

/// Whether `dir` holds anything.
fn is_empty_or_missing(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

async fn csr_count(client: &kube::Client) -> Result<usize> {
    Ok(Api::<CertificateSigningRequest>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_joins_fail_clearly_and_leave_nothing_behind() -> Result<()> {
    // No token cleaner: an expired token must be refused by the API
    // server itself, not merely be gone.
    let options = ClusterOptions {
        server_args: vec!["--controllers=*,-tokencleaner".into()],
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(0, options).await?;
    let client = cluster.client().await?;
    let cli = JoinCli::new(&cluster)?;
    let server = cli.server_url().to_string();
    let good = cli.token_create(&[])?;
    let (hash, creds) = good.split_once("::").context("join token")?;

    let expired = cli.token_create(&["--ttl", "1s"])?;
    let deleted = cli.token_create(&[])?;
    let r = cli.token(&["delete", &deleted])?;
    ensure!(r.ok, "token delete: {r:?}");
    let unknown = format!("{hash}::abcdef.0123456789abcdef");
    let wrong_ca = format!("K10{}::{creds}", "0".repeat(64));
    let dead = format!("https://127.0.0.1:{}", free_port()?);
    // Past the expired token's expiration, by its own clock.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let cases: [(&str, &str, &str, &str); 7] = [
        ("malformed", &server, "not-a-token", "malformed join token"),
        ("bare bootstrap token", &server, creds, "carries no CA hash"),
        (
            "unknown",
            &server,
            &unknown,
            "rejected the credentials (401",
        ),
        (
            "expired",
            &server,
            &expired,
            "rejected the credentials (401",
        ),
        (
            "deleted",
            &server,
            &deleted,
            "rejected the credentials (401",
        ),
        (
            "wrong CA hash",
            &server,
            &wrong_ca,
            "does not match the join token's CA hash",
        ),
        ("unreachable", &dead, &good, "cannot reach the API server"),
    ];
    for (i, (what, server, token, expect)) in cases.iter().enumerate() {
        let node = format!("bad-{i}");
        let r = cli.join(server, token, &node)?;
        ensure!(!r.ok, "{what}: join succeeded: {r:?}");
        ensure!(
            r.stderr.contains(expect),
            "{what}: expected {expect:?} in: {}",
            r.stderr
        );
        ensure!(
            !r.stderr.contains(creds.split('.').nth(1).unwrap_or("?")),
            "{what}: the token's secret is printed: {}",
            r.stderr
        );
        ensure!(
            is_empty_or_missing(&cli.config_dir(&node)),
            "{what}: state left in {}",
            cli.config_dir(&node).display()
        );
        // None of these got as far as a CSR; for the wrong CA hash this is
        // the proof that no credentials went out.
        ensure!(
            csr_count(&client).await? == 0,
            "{what}: the server saw a CSR"
        );
    }

    let r = cli.join(&server, &good, "joined")?;
    ensure!(r.ok, "a good join failed: {r:?}");
    ensure!(csr_count(&client).await? == 1, "one CSR for one join");
    let kubeconfig = kubeconfig_of(&cli.config_dir("joined"));
    let before = std::fs::read(&kubeconfig)?;
    let r = cli.join(&server, &good, "joined")?;
    ensure!(
        !r.ok && r.stderr.contains("already joined"),
        "second join: {r:?}"
    );
    ensure!(
        std::fs::read(&kubeconfig)? == before,
        "a second join changed the kubeconfig"
    );
    ensure!(csr_count(&client).await? == 1, "a second join sent a CSR");
    cluster.finish().await
}

/// The `NAME  ...  LEADER` rows of `skiff-server etcd status`: (name,
/// leader).
fn etcd_members(status: &str) -> Vec<(String, bool)> {
    status
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.first()?.to_string(), cols.get(3) == Some(&"true")))
        })
        .collect()
}

/// The stdout of a command that succeeded; what it printed, as the
/// error, otherwise.
fn succeeded(out: std::process::Output) -> Result<String> {
    ensure!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn etcd_status(s: &skiff_tests::ha::HaServer) -> Result<String> {
    succeeded(s.cli(&["etcd", "status"]).await?).context("etcd status")
}

/// The etcd members `s` lists are exactly `expected`.
async fn ensure_members(s: &skiff_tests::ha::HaServer, expected: &[&str]) -> Result<()> {
    let members = etcd_members(&etcd_status(s).await?);
    let names: BTreeSet<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(
        names == expected.iter().copied().collect(),
        "members: {members:?}"
    );
    Ok(())
}

/// The resourceVersion of ConfigMap `name`, read through `s`.
async fn configmap_version(s: &skiff_tests::ha::HaServer, name: &str) -> Result<String> {
    succeeded(
        s.kubectl(&[
            "get",
            "configmap",
            name,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .await?,
    )
}

/// Three servers on managed etcd, each its own machine: one starts the
/// cluster, two join with a server token; they serve one store; a join
/// whose token pins another CA is refused before anything is sent; the
/// loss of one machine leaves the others writing; without a quorum
/// writes fail and readyz says so, until a member returns; the lost
/// member is removed, and a fourth server joins and leaves (its Node
/// deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_join_on_managed_etcd_and_survive_a_loss() -> Result<()> {
    let mut c = skiff_tests::ha::HaCluster::start(3).await?;
    let result = servers_scenario(&mut c).await;
    c.report(result)
}

async fn servers_scenario(c: &mut skiff_tests::ha::HaCluster) -> Result<()> {
    let members = etcd_members(&etcd_status(&c.servers()[0]).await?);
    let names: BTreeSet<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(
        names == BTreeSet::from(["s0", "s1", "s2"]),
        "members: {members:?}"
    );
    ensure!(
        members.iter().filter(|(_, l)| *l).count() == 1,
        "one leader: {members:?}"
    );

    succeeded(
        c.servers()[1]
            .kubectl(&["create", "configmap", "ha", "--from-literal=a=1"])
            .await?,
    )?;
    let a = succeeded(
        c.servers()[2]
            .kubectl(&["get", "configmap", "ha", "-o", "jsonpath={.data.a}"])
            .await?,
    )?;
    ensure!(a == "1", "read through another server: {a:?}");
    // Each server's own admin kubeconfig is signed by the one cluster CA.
    succeeded(
        c.servers()[2]
            .kubectl(&["--server", &c.servers()[0].url(), "get", "ns", "default"])
            .await?,
    )?;
    let servers = &c.servers()[0];
    wait_for("default/kubernetes to list three servers", T, || async {
        let ips = succeeded(
            servers
                .kubectl(&[
                    "get",
                    "endpoints",
                    "kubernetes",
                    "-o",
                    "jsonpath={.subsets[*].addresses[*].ip}",
                ])
                .await?,
        )?;
        ensure!(ips.split_whitespace().count() == 3, "addresses: {ips:?}");
        Ok(())
    })
    .await?;

    // A token pinning another CA: refused, nothing sent, no member added.
    let token = c.token().to_string();
    let (_, rest) = token.split_once("::").context("join token format")?;
    let wrong = format!("K10{}::{rest}", "0".repeat(64));
    let url = c.servers()[0].url();
    let log = c.try_add(&["--server", &url, "--token", &wrong]).await?;
    ensure!(
        log.contains("does not match the join token's CA hash"),
        "log: {log}"
    );
    ensure_members(&c.servers()[0], &["s0", "s1", "s2"]).await?;

    // One machine lost: the two others keep taking writes.
    c.server_mut(0).kill();
    let survivor = &c.servers()[1];
    wait_for("a write after the loss", T, || async {
        succeeded(
            survivor
                .kubectl(&["create", "configmap", "after-loss", "--from-literal=b=2"])
                .await?,
        )
        .map(|_| ())
    })
    .await?;
    let b = succeeded(
        c.servers()[2]
            .kubectl(&["get", "configmap", "after-loss", "-o", "jsonpath={.data.b}"])
            .await?,
    )?;
    ensure!(b == "2", "{b:?}");
    let ready = succeeded(
        c.servers()[2]
            .kubectl(&["get", "--raw", "/readyz?verbose"])
            .await?,
    )?;
    ensure!(ready.contains("[+]etcd ok"), "{ready}");

    // Two of three lost (one frozen): no quorum, writes fail with a 5xx
    // and readyz says why; when the member returns, so do writes, and
    // nothing acknowledged is lost.
    let etcd_of_s2 = c.servers()[2].data_dir.join("etcd");
    let freeze = |signal| {
        skiff_tests::cleanup::kill_processes_mentioning(&etcd_of_s2.to_string_lossy(), signal)
    };
    freeze(nix::sys::signal::Signal::SIGSTOP);
    let refused = c.servers()[1]
        .kubectl(&["create", "configmap", "no-quorum"])
        .await?;
    let readyz = c.servers()[1]
        .kubectl(&["get", "--raw", "/readyz?verbose"])
        .await?;
    freeze(nix::sys::signal::Signal::SIGCONT);
    ensure!(
        !refused.status.success(),
        "a write without quorum succeeded"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        stderr.contains("Internal error occurred: etcd store"),
        "{stderr}"
    );
    ensure!(
        !readyz.status.success(),
        "readyz without quorum: {}",
        String::from_utf8_lossy(&readyz.stdout)
    );
    wait_for("writes after the member returns", T, || async {
        succeeded(
            survivor
                .kubectl(&["create", "configmap", "quorum-back"])
                .await?,
        )
        .map(|_| ())
    })
    .await?;
    for name in ["ha", "after-loss"] {
        succeeded(c.servers()[2].kubectl(&["get", "configmap", name]).await?)?;
    }

    // The cluster shrinks: the lost member is removed.
    succeeded(c.servers()[1].cli(&["etcd", "remove", "s0"]).await?).context("etcd remove")?;
    ensure_members(&c.servers()[2], &["s1", "s2"]).await?;

    // A fourth server joins (through the second: the first is gone) and
    // leaves again.
    let (url, token) = (c.servers()[1].url(), c.token().to_string());
    c.add(&["--server", &url, "--token", &token]).await?;
    succeeded(
        c.servers()[3]
            .kubectl(&["get", "configmap", "quorum-back"])
            .await?,
    )?;
    // Its machine also runs an agent under its name: that Node is marked
    // as a control-plane node, and deleting it removes the member.
    let node = c.dir().join("s3-node.yaml");
    std::fs::write(&node, "apiVersion: v1\nkind: Node\nmetadata:\n  name: s3\n")?;
    succeeded(
        c.servers()[1]
            .kubectl(&["create", "-f", &node.to_string_lossy()])
            .await?,
    )?;
    wait_for("s3's Node marked as control plane", T, || async {
        let marked = succeeded(
            c.servers()[2]
                .kubectl(&[
                    "get",
                    "node",
                    "s3",
                    "-o",
                    "jsonpath={.metadata.labels.node-role\\.kubernetes\\.io/etcd} {.metadata.finalizers}",
                ])
                .await?,
        )?;
        ensure!(marked.contains("true") && marked.contains("etcd.skiff.dev/member"), "{marked}");
        Ok(())
    })
    .await?;
    let roles = succeeded(
        c.servers()[1]
            .kubectl(&["get", "node", "s3", "--no-headers"])
            .await?,
    )?;
    ensure!(roles.contains("control-plane,etcd"), "{roles}");
    succeeded(
        c.servers()[1]
            .kubectl(&["delete", "node", "s3", "--timeout=60s"])
            .await?,
    )
    .context("deleting the fourth server's Node")?;
    ensure_members(&c.servers()[1], &["s1", "s2"]).await?;
    c.server_mut(3).kill();
    succeeded(
        c.servers()[2]
            .kubectl(&["create", "configmap", "after-leave"])
            .await?,
    )?;
    Ok(())
}

/// The documented drill: a scheduled snapshot of a three-server cluster,
/// every server's data directory destroyed, one server reset from the
/// snapshot (its keys opened with the kept cluster secret), the others
/// joining anew: every object back at its resourceVersion, under the
/// cluster's own CA and keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_cluster_is_restored_from_a_scheduled_snapshot() -> Result<()> {
    let mut c = skiff_tests::ha::HaCluster::start(3).await?;
    let result = restore_scenario(&mut c).await;
    c.report(result)
}

/// The newest scheduled snapshot in `dir`, if taken at `revision` or
/// later, copied to `keep` (the schedule's retention prunes its files).
async fn keep_snapshot_at(
    s: &skiff_tests::ha::HaServer,
    dir: &Path,
    revision: i64,
    keep: &Path,
) -> Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("etcd-snapshot-") && !n.contains(".part"))
        .collect();
    names.sort();
    let newest = names.pop().context("no snapshot yet")?;
    let file = dir.join(&newest);
    let status = succeeded(
        s.cli(&["snapshot", "status", &file.to_string_lossy()])
            .await?,
    )?;
    let taken: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("revision: "))
        .context("no revision")?
        .trim()
        .parse()?;
    ensure!(
        taken >= revision,
        "{newest} is at revision {taken}, before {revision}"
    );
    std::fs::copy(&file, keep)?;
    Ok(())
}

async fn restore_scenario(c: &mut skiff_tests::ha::HaCluster) -> Result<()> {
    // The operator's backups: snapshots on a disk of their own, and the
    // cluster secret.
    let backups = c.dir().join("backups");
    std::fs::create_dir_all(&backups)?;
    let secret = backups.join("cluster-secret");
    std::fs::copy(c.servers()[0].data_dir.join("pki/cluster-secret"), &secret)?;
    let ca = std::fs::read_to_string(c.servers()[0].data_dir.join("pki/ca.crt"))?;
    let schedule = "--etcd-snapshot-schedule-cron=*/2 * * * * *".to_string();
    let dir_flag = format!("--etcd-snapshot-dir={}", backups.display());
    c.restart(1, &[&schedule, &dir_flag]).await?;

    succeeded(
        c.servers()[1]
            .kubectl(&["create", "configmap", "kept", "--from-literal=a=1"])
            .await?,
    )?;
    let rv = configmap_version(&c.servers()[0], "kept").await?;
    let revision: i64 = rv.parse()?;
    let snapshot = backups.join("drill.db");
    wait_for("a scheduled snapshot with the ConfigMap", T, || {
        keep_snapshot_at(&c.servers()[1], &backups, revision, &snapshot)
    })
    .await?;
    succeeded(
        c.servers()[1]
            .kubectl(&["create", "configmap", "after-snapshot"])
            .await?,
    )?;

    // Every machine loses its data directory.
    for i in 0..3 {
        c.server_mut(i).kill();
        let dir = c.servers()[i].data_dir.clone();
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let s0 = &c.servers()[0];
    let bind = format!("--bind-address={}", s0.ns.ip);
    let reset = [
        bind.as_str(),
        "--cluster-reset",
        "--cluster-reset-restore-path",
        &snapshot.to_string_lossy(),
    ];
    // Without the cluster secret the keys stay sealed: refused, nothing
    // restored.
    let refused = s0.cli(&reset).await?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && stderr.contains("--cluster-secret-file"),
        "{stderr}"
    );
    ensure!(
        !s0.data_dir.join("etcd").exists(),
        "a refused reset restored the snapshot"
    );
    let secret_flag = format!("--cluster-secret-file={}", secret.display());
    let out = succeeded(
        s0.cli(&[&reset[..], &[secret_flag.as_str()]].concat())
            .await?,
    )?;
    ensure!(out.contains("reset to one member, s0"), "{out}");
    ensure!(
        std::fs::read_to_string(s0.data_dir.join("pki/ca.crt"))? == ca,
        "the restored server made a CA of its own"
    );
    c.restart(0, &[]).await?;
    let url = c.servers()[0].url();
    let token = c.token().to_string();
    for i in 1..3 {
        c.restart(i, &["--server", &url, "--token", &token]).await?;
    }

    let back = configmap_version(&c.servers()[2], "kept").await?;
    ensure!(back == rv, "resourceVersion {back:?}, was {rv:?}");
    let gone = c.servers()[1]
        .kubectl(&["get", "configmap", "after-snapshot"])
        .await?;
    ensure!(
        !gone.status.success(),
        "a write after the snapshot came back"
    );
    ensure_members(&c.servers()[1], &["s0", "s1", "s2"]).await?;
    for s in c.servers() {
        ensure!(
            std::fs::read_to_string(s.data_dir.join("pki/ca.crt"))? == ca,
            "{} serves under another CA",
            s.name
        );
    }
    succeeded(
        c.servers()[2]
            .kubectl(&["create", "configmap", "after-restore"])
            .await?,
    )?;
    Ok(())
}

/// Three servers on managed etcd and two nodes whose agents talk to the
/// server leading the scheduler. That server is SIGKILLed with its etcd:
/// another one takes the scheduler and the controllers over, the agents
/// move to a live server, the Deployment scales on, and no pod restarts
/// or runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_outlives_the_leading_server() -> Result<()> {
    let mut c = skiff_tests::ha::HaCluster::start(3).await?;
    let result = leader_loss_scenario(&mut c).await;
    c.report(result)
}

async fn leader_loss_scenario(c: &mut skiff_tests::ha::HaCluster) -> Result<()> {
    let first = skiff_tests::cluster::client_from(&c.servers()[0].admin_kubeconfig()).await?;
    let leader = wait_for("a scheduler leader", T, || {
        skiff_tests::ha::lease_holder(&first, "kube-scheduler")
    })
    .await?;
    c.add_agent(leader).await?;
    c.add_agent(leader).await?;
    let survivor = (leader + 1) % 3;
    let client =
        skiff_tests::cluster::client_from(&c.servers()[survivor].admin_kubeconfig()).await?;
    let manifest = c.dir().join("web.yaml");
    std::fs::write(
        &manifest,
        DEPLOYMENT
            .replace("IMAGE", TOOLBOX_IMAGE)
            .replace("replicas: 2", "replicas: 4"),
    )?;
    succeeded(
        c.servers()[leader]
            .kubectl(&["apply", "-f", &manifest.to_string_lossy()])
            .await?,
    )?;
    let before = wait_for("4 ready pods", T, || async {
        let pods = containers(&client).await?;
        ensure!(pods.len() == 4, "{} pods", pods.len());
        Ok(pods)
    })
    .await?;
    let mut running_before = BTreeSet::new();
    for a in c.agents() {
        for ct in a.running_containers().await? {
            running_before.insert(ct.id);
        }
    }

    // The leading server's machine is gone.
    c.server_mut(leader).kill();
    let killed = jiff::Timestamp::now();
    wait_for("a new scheduler leader", T, || async {
        let now = skiff_tests::ha::lease_holder(&client, "kube-scheduler").await?;
        ensure!(now != leader, "still s{leader}");
        Ok(())
    })
    .await?;
    succeeded(
        c.servers()[survivor]
            .kubectl(&["scale", "deployment", "web", "--replicas=6"])
            .await?,
    )?;
    let after = wait_for("6 ready pods", T, || async {
        let pods = containers(&client).await?;
        ensure!(pods.len() == 6, "{} pods", pods.len());
        Ok(pods)
    })
    .await?;
    for (name, (id, restarts)) in &before {
        ensure!(
            after.get(name) == Some(&(id.clone(), *restarts)) && *restarts == 0,
            "{name} changed: before {id} x{restarts}, after {:?}",
            after.get(name)
        );
    }
    ensure!(after.values().all(|(_, r)| *r == 0), "restarts: {after:?}");
    let mut running_after = BTreeSet::new();
    for a in c.agents() {
        for ct in a.running_containers().await? {
            running_after.insert(ct.id);
        }
    }
    ensure!(
        running_before.is_subset(&running_after),
        "containers of before the loss are gone: {:?}",
        running_before
            .difference(&running_after)
            .collect::<Vec<_>>()
    );
    // The agents report through a live server: their Leases renewed
    // after the kill.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    wait_for("node leases renewed after the loss", T, || async {
        for a in c.agents() {
            let renewed = leases
                .get(&a.name)
                .await?
                .spec
                .and_then(|s| s.renew_time)
                .context("no renewTime")?;
            ensure!(
                renewed.0 > killed,
                "{} last renewed {:?}",
                a.name,
                renewed.0
            );
        }
        Ok(())
    })
    .await?;
    for a in c.agents() {
        ensure!(a.running(), "{} exited", a.name);
        ensure!(
            a.log().contains("API server not ready: using another"),
            "{} never moved to another server",
            a.name
        );
    }
    Ok(())
}
