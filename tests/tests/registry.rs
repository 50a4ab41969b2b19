//! Pulls from a private registry (the distribution server over TLS with
//! htpasswd auth, see `skiff_tests::distribution`) on a real node: a pod
//! with the right `imagePullSecrets` runs; with a wrong password it waits
//! in ErrImagePull / ImagePullBackOff with the registry's 401 in the
//! message; a pod whose ServiceAccount carries the pull secret gets it and
//! runs; a pull secret that does not exist is reported and skipped.
//!
//! A registries file (k3s's registries.yaml) on the node: a mirror for
//! docker.io and a registry's own TLS and login reach containerd through
//! its registry host files; a change applies without a restart, a change
//! that does not read is refused and reported.
//!
//! One cluster of one node per test; each pod has an image tag of its
//! own, so that none finds its image already present.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::Api;
use skiff_tests::agent::free_port;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::distribution::Distribution;
use skiff_tests::images;
use tokio::task::JoinHandle;

/// Time for anything that involves pulling and starting pods.
const T: Duration = Duration::from_secs(120);
const USER: &str = "skiff";
const PASSWORD: &str = "s3cret-pull";
const REPOSITORY: &str = "private/app";
/// One tag (a distinct image) per pod.
const TAGS: [&str; 4] = ["good", "bad", "account", "partial"];

fn pod(name: &str, image: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
{extra}
  containers:
  - name: c
    image: {image}
    imagePullPolicy: IfNotPresent
    command: [sleep, "3600"]
"#
    )
}

/// (reason, message) of every waiting state of pod `name`'s container, in
/// order, deduplicated; until aborted.
fn record_waits(
    pods: Api<Pod>,
    name: &str,
    waits: Arc<Mutex<Vec<(String, String)>>>,
) -> JoinHandle<()> {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher::watcher(pods, cfg).boxed();
        while let Ok(Some(ev)) = events.try_next().await {
            let (WatchEvent::Apply(p) | WatchEvent::InitApply(p)) = ev else {
                continue;
            };
            let waiting = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state)
                .and_then(|s| s.waiting);
            let Some(w) = waiting else { continue };
            let w = (w.reason.unwrap_or_default(), w.message.unwrap_or_default());
            let mut waits = waits.lock().unwrap_or_else(|e| e.into_inner());
            if waits.last() != Some(&w) {
                waits.push(w);
            }
        }
    })
}

/// The private registry serving `images` for `cluster`'s nodes, which
/// reach the host on the API server's LAN address only.
fn serve(cluster: &Cluster, images: &[(&str, &str, &images::OciImage)]) -> Result<Distribution> {
    let url: http::Uri = cluster.server_url().parse()?;
    let ip: IpAddr = url
        .host()
        .ok_or_else(|| anyhow!("no host in {}", cluster.server_url()))?
        .parse()?;
    Distribution::start(
        &cluster.dir().join("distribution"),
        ip,
        free_port()?,
        USER,
        PASSWORD,
        images,
    )
}

#[tokio::test]
async fn private_registry_pull_secrets() -> Result<()> {
    let mut cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let built: Vec<_> = TAGS
        .iter()
        .map(|t| images::toolbox_tag(&format!("private-{t}")))
        .collect::<Result<_>>()?;
    let served: Vec<_> = TAGS
        .iter()
        .zip(&built)
        .map(|(t, i)| (REPOSITORY, *t, i))
        .collect();
    let registry = serve(&cluster, &served)?;

    // The node's containerd trusts the test CA (and only for this host).
    let node = &mut cluster.nodes_mut()[0];
    let config = node.containerd().config_path().to_path_buf();
    let mut toml = std::fs::read_to_string(&config)?;
    toml.push_str(&registry.containerd_config());
    std::fs::write(&config, toml)?;
    node.containerd_mut().restart().await?;
    let name = node.name().to_string();
    cluster.wait_node_ready(&name, T).await?;

    let server = registry.host();
    for (secret, password) in [
        ("regcred", PASSWORD),
        ("badcred", "wrong"),
        ("sacred", PASSWORD),
    ] {
        cluster
            .kubectl_ok(&[
                "create",
                "secret",
                "docker-registry",
                secret,
                &format!("--docker-server={server}"),
                &format!("--docker-username={USER}"),
                &format!("--docker-password={password}"),
            ])
            .await?;
    }
    let image = |tag: &str| registry.reference(REPOSITORY, tag);
    // The account exists before its pod is admitted.
    cluster
        .apply(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: puller, namespace: default}\nimagePullSecrets: [{name: sacred}]\n",
        )
        .await?;
    let pods_yaml = [
        pod(
            "good",
            &image("good"),
            "  imagePullSecrets: [{name: regcred}]",
        ),
        pod(
            "bad",
            &image("bad"),
            "  imagePullSecrets: [{name: badcred}]",
        ),
        pod("account", &image("account"), "  serviceAccountName: puller"),
        pod(
            "partial",
            &image("partial"),
            "  imagePullSecrets: [{name: nosuch}, {name: regcred}]",
        ),
    ];
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Every waiting state of `bad`, seen by a watch from before its creation.
    let waits = Arc::new(Mutex::new(Vec::new()));
    let recorder = record_waits(pods.clone(), "bad", waits.clone());
    cluster.apply(&pods_yaml.join("---\n")).await?;

    // The account's pull secret was copied into its pod.
    let account = pods.get("account").await?;
    let copied: Vec<String> = account
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name)
        .collect();
    ensure!(
        copied == ["sacred"],
        "account pod's imagePullSecrets: {copied:?}"
    );

    for name in ["good", "account", "partial"] {
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{name}"),
                "--timeout=120s",
            ])
            .await
            .with_context(|| format!("pod {name} did not run:\n{}", registry.log()))?;
    }

    // Wrong password: the registry's 401 reaches the waiting reason, first
    // as ErrImagePull, then as ImagePullBackOff.
    let backoff = wait_for("bad pod in ImagePullBackOff", T, || {
        let waits = waits.clone();
        async move {
            let last = waits.lock().unwrap().last().cloned();
            match last {
                Some((reason, message)) if reason == "ImagePullBackOff" => Ok(message),
                other => Err(anyhow!("bad waits with {other:?}")),
            }
        }
    })
    .await?;
    recorder.abort();
    let seen = waits.lock().unwrap().clone();
    let first_err = seen
        .iter()
        .position(|(r, _)| r == "ErrImagePull")
        .with_context(|| format!("bad never waited with ErrImagePull: {seen:?}"))?;
    ensure!(
        seen[first_err].1.contains("401"),
        "ErrImagePull without the registry's 401: {seen:?}"
    );
    ensure!(
        seen[..first_err]
            .iter()
            .all(|(r, _)| r == "ContainerCreating"),
        "bad waited with something else before ErrImagePull: {seen:?}"
    );
    ensure!(
        backoff.contains(&format!("Back-off pulling image \"{}\"", image("bad"))),
        "ImagePullBackOff message: {backoff}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=bad"))
        .await?;
    let failed: Vec<String> = list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Failed"))
        .filter_map(|e| e.message.clone())
        .collect();
    ensure!(
        failed.iter().any(
            |m| m.starts_with(&format!("Failed to pull image \"{}\"", image("bad")))
                && m.contains("401")
        ),
        "no Failed event with the 401: {failed:?}"
    );
    // The missing secret is reported, the other one used.
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=partial"))
        .await?;
    ensure!(
        list.items.iter().any(|e| {
            e.reason.as_deref() == Some("FailedToRetrieveImagePullSecret")
                && e.message.as_deref()
                    == Some("Unable to retrieve some image pull secrets (nosuch); attempting to pull the image may not succeed.")
        }),
        "no FailedToRetrieveImagePullSecret event: {:?}",
        list.items.iter().map(|e| (&e.reason, &e.message)).collect::<Vec<_>>()
    );

    drop(registry);
    cluster.finish().await
}

#[tokio::test]
async fn registries_file_mirrors_logins_and_tls() -> Result<()> {
    let mut cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mirrored = images::toolbox_tag("mirrored")?;
    let direct = images::toolbox_tag("direct")?;
    let registry = serve(
        &cluster,
        &[
            ("library/mirrored", "v1", &mirrored),
            ("team/direct", "v1", &direct),
        ],
    )?;
    let host = registry.host();

    // containerd reads registry host files from the node's certs.d; the
    // agent learns that directory from containerd and writes there.
    let node = &mut cluster.nodes_mut()[0];
    let hosts_dir = node.dir().join("certs.d");
    let config = node.containerd().config_path().to_path_buf();
    let mut toml = std::fs::read_to_string(&config)?;
    toml.push_str(&format!(
        "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"{}\"\n",
        hosts_dir.display()
    ));
    std::fs::write(&config, toml)?;
    node.containerd_mut().restart().await?;

    let file = node.dir().join("registries.yaml");
    let configs = format!(
        "configs:\n  \"{host}\":\n    auth: {{username: {USER}, password: {PASSWORD}}}\n    tls: {{ca_file: {}}}\n",
        registry.ca_file().display()
    );
    let mirrors = format!("mirrors:\n  docker.io:\n    endpoint: [\"https://{host}\"]\n");
    std::fs::write(&file, format!("{mirrors}{configs}"))?;
    node.set_agent_flag("registries-config", &file.display().to_string());
    node.kill_agent();
    node.start_agent()?;
    let name = node.name().to_string();
    cluster.wait_node_ready(&name, T).await?;

    // `mirrored:v1` is docker.io/library/mirrored:v1: only the mirror has
    // it. `direct` names the registry itself: its CA and login apply.
    let pods_yaml = [
        pod("mirrored", "mirrored:v1", ""),
        pod("direct", &format!("{host}/team/direct:v1"), ""),
    ];
    cluster.apply(&pods_yaml.join("---\n")).await?;
    for pod in ["mirrored", "direct"] {
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=120s",
            ])
            .await
            .with_context(|| {
                format!(
                    "pod {pod} did not run; agent log:\n{}\nregistry log:\n{}",
                    cluster.nodes()[0].agent_log_tail(40),
                    registry.log()
                )
            })?;
    }
    let mirror_file = hosts_dir.join("docker.io/hosts.toml");
    let written = std::fs::read_to_string(&mirror_file)?;
    ensure!(
        written.contains(&format!("[host.\"https://{host}\"]")),
        "{written}"
    );

    // A change that does not read is reported and changes nothing.
    std::fs::write(
        &file,
        format!("{mirrors}    rewrite: {{\"^library/(.*)\": \"mirror/$1\"}}\n{configs}"),
    )?;
    let message = cluster
        .wait_event("default", &name, "RegistriesConfigInvalid", T)
        .await?;
    ensure!(
        message.contains("mirrors.\"docker.io\".rewrite: rewrite rules are not supported"),
        "{message}"
    );
    ensure!(mirror_file.exists(), "a refused change removed the mirror");

    // Without the mirror, its file goes; the registry's own stays.
    std::fs::write(&file, &configs)?;
    wait_for("the mirror's host file removed", T, || {
        let gone = !mirror_file.exists();
        async move { gone.then_some(()).ok_or_else(|| anyhow!("still there")) }
    })
    .await?;
    ensure!(hosts_dir.join(&host).join("hosts.toml").exists());

    drop(registry);
    cluster.finish().await
}
