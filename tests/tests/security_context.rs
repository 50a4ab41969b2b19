//! securityContext enforced on the node, end to end on one node with real
//! containerd, checked from inside the containers (`/proc/self/status`,
//! `id`, write attempts):
//!
//! - capabilities drop ALL / add NET_ADMIN: CapEff is exactly NET_ADMIN;
//! - allowPrivilegeEscalation false: NoNewPrivs 1 (unset: 0);
//! - seccompProfile RuntimeDefault (pod level): Seccomp 2; a container's
//!   Unconfined overrides it: Seccomp 0;
//! - readOnlyRootFilesystem: writing `/` fails;
//! - runAsUser / runAsGroup / supplementalGroups / fsGroup: `id`, and the
//!   emptyDir owned by the fsGroup with setgid, new files in that group;
//! - sysctls: a safe one and one allowed by `--allowed-unsafe-sysctls` are
//!   set in the pod; one not allowed refuses the pod (Failed,
//!   SysctlForbidden, upstream's message and event);
//! - runAsNonRoot with a root image: CreateContainerConfigError with the
//!   kubelet's message;
//! - appArmorProfile: refused with reason AppArmor where the host has no
//!   AppArmor, applied (the process's `attr/current`) where it has;
//! - the API refuses a Localhost seccomp profile without its name.
#![allow(clippy::disallowed_methods)] // a test harness: short-lived commands run under the test's own timeout

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use skiff_tests::cluster::{give_up, wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

const WAIT: Duration = Duration::from_secs(90);

/// Progress on stderr, so a slow stage shows in the test's output.
fn stage(start: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
}

/// The lines of `/proc/self/status` the checks read.
const STATUS: &str = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status";

/// `kubectl get pod NAME -o jsonpath=PATH`.
async fn jsonpath(cluster: &Cluster, pod: &str, path: &str) -> Result<String> {
    cluster
        .kubectl_ok(&["get", "pod", pod, "-o", &format!("jsonpath={path}")])
        .await
}

/// A status line's value (`NoNewPrivs:\t1` -> `1`) in `out`.
fn field<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// A shell script as the body of a YAML block scalar in an `args` list.
fn block(script: &str) -> String {
    script.lines().map(|l| format!("      {l}\n")).collect()
}

/// Whether this host enforces AppArmor.
fn host_apparmor() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.starts_with('Y'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_context_is_enforced_on_the_node() -> Result<()> {
    let t0 = Instant::now();
    let options = ClusterOptions {
        agent_args: vec!["--allowed-unsafe-sysctls=kernel.sem".into()],
        ..Default::default()
    };
    let cluster = Cluster::start(1, options).await?;
    stage(t0, "cluster up");

    // Each container reports and exits; scripts go in YAML block scalars.
    let ids_script = format!(
        "id\nls -ldn /data | awk '{{print $1, $4}}'\ntouch /data/f\nls -ln /data/f | awk '{{print \"file\", $4}}'\n\
         echo sem $(cat /proc/sys/kernel/sem)\necho port $(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)\n{STATUS}\n"
    );
    let caps_script = format!(
        "{STATUS}\nif touch /written 2>/dev/null; then echo rootfs writable; else echo rootfs read-only; fi\n"
    );
    let apparmor = if host_apparmor() {
        format!(
            "  - name: aa\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c]\n    args:\n    - |\n{}    securityContext: {{appArmorProfile: {{type: RuntimeDefault}}}}\n",
            block("echo aa $(cat /proc/self/attr/current)\n")
        )
    } else {
        String::new()
    };
    cluster
        .apply(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: sec}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    supplementalGroups: [4000]
    fsGroup: 2000
    fsGroupChangePolicy: OnRootMismatch
    seccompProfile: {{type: RuntimeDefault}}
    sysctls:
    - {{name: kernel.sem, value: "250 32000 100 128"}}
    - {{name: net.ipv4.ip_unprivileged_port_start, value: "1000"}}
  volumes:
  - {{name: data, emptyDir: {{}}}}
  containers:
  - name: ids
    image: {TOOLBOX_IMAGE}
    command: [sh, -c]
    args:
    - |
{ids}    volumeMounts: [{{name: data, mountPath: /data}}]
  - name: caps
    image: {TOOLBOX_IMAGE}
    command: [sh, -c]
    args:
    - |
{caps}    securityContext:
      runAsUser: 0
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {{drop: [ALL], add: [NET_ADMIN]}}
  - name: unconfined
    image: {TOOLBOX_IMAGE}
    command: [sh, -c]
    args:
    - |
{status}    securityContext:
      runAsUser: 0
      seccompProfile: {{type: Unconfined}}
{apparmor}---
apiVersion: v1
kind: Pod
metadata: {{name: nonroot}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsNonRoot: true}}
  containers:
  - {{name: c, image: {TOOLBOX_IMAGE}, command: [sleep, "3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sysctl-unsafe}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    sysctls: [{{name: kernel.msgmax, value: "65536"}}]
  containers:
  - {{name: c, image: {TOOLBOX_IMAGE}, command: [sleep, "3600"]}}
"#,
            ids = block(&ids_script),
            caps = block(&caps_script),
            status = block(&format!("{STATUS}\n")),
        ))
        .await?;
    if !host_apparmor() {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: apparmor}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sleep, '3600']\n    securityContext: {{appArmorProfile: {{type: RuntimeDefault}}}}\n"
            ))
            .await?;
    }
    stage(t0, "pods created");

    // The checking pod runs to completion.
    wait_for("pod sec to succeed", WAIT, || async {
        match jsonpath(&cluster, "sec", "{.status.phase}").await?.as_str() {
            "Succeeded" => Ok(()),
            "Failed" => Err(give_up(anyhow::anyhow!("pod sec failed"))),
            p => bail!("phase {p:?}"),
        }
    })
    .await?;
    stage(t0, "sec succeeded");
    let logs = |c: &'static str| {
        let cluster = &cluster;
        async move { cluster.kubectl_ok(&["logs", "sec", "-c", c]).await }
    };

    let ids = logs("ids").await?;
    let id_line = ids.lines().next().unwrap_or_default();
    ensure!(
        id_line.contains("uid=1000") && id_line.contains("gid=3000"),
        "runAsUser/runAsGroup: {ids}"
    );
    let groups = id_line.split("groups=").nth(1).unwrap_or_default();
    ensure!(
        groups.contains("2000") && groups.contains("4000"),
        "supplementalGroups and fsGroup in `id`: {ids}"
    );
    ensure!(
        ids.lines()
            .any(|l| l.starts_with("drwxrwsrwx") && l.ends_with(" 2000")),
        "the emptyDir is the fsGroup's, setgid: {ids}"
    );
    ensure!(
        ids.lines().any(|l| l == "file 2000"),
        "a new file in the emptyDir belongs to the fsGroup: {ids}"
    );
    ensure!(
        ids.lines().any(|l| l == "sem 250 32000 100 128"),
        "allowed unsafe sysctl kernel.sem: {ids}"
    );
    ensure!(
        ids.lines().any(|l| l == "port 1000"),
        "safe sysctl ip_unprivileged_port_start: {ids}"
    );
    ensure!(
        field(&ids, "Seccomp") == Some("2"),
        "pod-level RuntimeDefault seccomp: {ids}"
    );
    ensure!(
        field(&ids, "NoNewPrivs") == Some("0"),
        "allowPrivilegeEscalation unset allows it: {ids}"
    );
    ensure!(
        field(&ids, "CapEff") == Some("0000000000000000"),
        "a non-root user has no effective capabilities: {ids}"
    );

    let caps = logs("caps").await?;
    // NET_ADMIN is capability 12.
    ensure!(
        field(&caps, "CapEff") == Some("0000000000001000"),
        "drop ALL, add NET_ADMIN: {caps}"
    );
    ensure!(
        field(&caps, "NoNewPrivs") == Some("1"),
        "allowPrivilegeEscalation false: {caps}"
    );
    ensure!(
        caps.lines().any(|l| l == "rootfs read-only"),
        "readOnlyRootFilesystem: {caps}"
    );

    let unconfined = logs("unconfined").await?;
    ensure!(
        field(&unconfined, "Seccomp") == Some("0"),
        "a container's Unconfined overrides the pod's RuntimeDefault: {unconfined}"
    );
    if host_apparmor() {
        let aa = logs("aa").await?;
        ensure!(
            aa.contains("(enforce)"),
            "RuntimeDefault AppArmor profile in force: {aa}"
        );
    }
    stage(t0, "in-container checks done");

    // runAsNonRoot with an image that runs as root.
    let uid = jsonpath(&cluster, "nonroot", "{.metadata.uid}").await?;
    let want = format!(
        "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: c)"
    );
    wait_for("nonroot to be refused", WAIT, || async {
        let w = jsonpath(
            &cluster,
            "nonroot",
            "{.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
        )
        .await?;
        ensure!(
            w == format!("CreateContainerConfigError|{want}"),
            "waiting: {w}"
        );
        Ok(())
    })
    .await?;
    stage(t0, "runAsNonRoot refused");

    // An unsafe sysctl not allowed on the node: rejected at admission.
    let rejected = |pod: &'static str, reason: &'static str, message: &'static str| {
        let cluster = &cluster;
        async move {
            wait_for(&format!("{pod} to be rejected"), WAIT, || async {
                let s = jsonpath(
                    cluster,
                    pod,
                    "{.status.phase}|{.status.reason}|{.status.message}",
                )
                .await?;
                ensure!(
                    s == format!("Failed|{reason}|Pod was rejected: {message}"),
                    "status: {s}"
                );
                Ok(())
            })
            .await?;
            let events = cluster
                .kubectl_ok(&[
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={pod}"),
                    "-o",
                    "jsonpath={range .items[*]}{.type}|{.reason}|{.message}{\"\\n\"}{end}",
                ])
                .await?;
            ensure!(
                events
                    .lines()
                    .any(|l| l == format!("Warning|{reason}|{message}")),
                "{pod}'s events: {events}"
            );
            anyhow::Ok(())
        }
    };
    rejected(
        "sysctl-unsafe",
        "SysctlForbidden",
        "forbidden sysctl: \"kernel.msgmax\" not allowlisted",
    )
    .await?;
    if !host_apparmor() {
        rejected(
            "apparmor",
            "AppArmor",
            "Cannot enforce AppArmor: AppArmor is not enabled on the host",
        )
        .await?;
    }
    stage(t0, "admission refusals checked");

    // Validation belongs to the API: a Localhost profile needs its name.
    let out = cluster
        .kubectl_stdin(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: badseccomp}}\nspec:\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    securityContext: {{seccompProfile: {{type: Localhost}}}}\n"
            )),
        )
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && err.contains("spec.containers[0].securityContext.seccompProfile.localhostProfile")
            && err.contains("must be set when seccomp type is Localhost"),
        "Localhost seccomp without a profile was not refused: {err}"
    );

    cluster
        .kubectl_ok(&["delete", "pod", "--all", "--wait=true", "--timeout=60s"])
        .await
        .context("deleting the pods")?;
    cluster.finish().await
}
