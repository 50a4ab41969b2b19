//! Volumes and configuration end to end, on real containerd: emptyDir
//! (disk and a sized tmpfs), hostPath with its type checks, subPath and
//! readOnly mounts on a static pod; configMap, secret, downwardAPI and
//! projected volumes and env from the API through real kubectl, an update
//! reaching a running pod without a torn read, pods waiting for missing
//! objects and starting once they appear; and teardown leaving no mount
//! and no directory behind.
//!
//! Containers report what they see into a hostPath directory, read here
//! from the host.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const T: Duration = Duration::from_secs(60);

/// Poll `f` every 200 ms until it returns `Some`, or fail after `timeout`.
async fn until<V, F, Fut>(timeout: Duration, what: &str, mut f: F) -> Result<V>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<V>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Progress on stderr, so a slow stage shows in the test's output.
fn stage(start: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The host's mount points under `dir`.
fn host_mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.display().to_string();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(String::from)
        .collect()
}

/// Indent a shell script as a YAML block scalar at `indent` spaces.
fn block(script: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    script
        .lines()
        .map(|l| format!("{pad}{l}\n"))
        .collect::<String>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_dir_host_path_sub_path_and_teardown() -> Result<()> {
    let t0 = Instant::now();
    let cd = Containerd::start().await?;
    let mut agent = Agent::start(&cd, AgentOptions::default()).await?;
    stage(t0, "agent started");
    let root = agent.dir().join("root");
    let out = agent.dir().join("out");
    let given = agent.dir().join("given-file");
    std::fs::write(&given, "given")?;

    let script = "grep ' /mem ' /proc/self/mountinfo > /out/mem\n\
        echo hi > /scratch/x\n\
        echo sub > /sub/y\n\
        cat /given > /out/given\n\
        if (echo no > /given) 2>/dev/null; then echo writable > /out/ro; else echo readonly > /out/ro; fi\n\
        echo done > /out/done\n\
        exec sleep 3600\n";
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: vols}}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {{fsGroup: 2345}}\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    resources: {{limits: {{memory: 64Mi}}}}\n    command: [sh, -c]\n    args:\n    - |\n{}    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n    - {{name: scratch, mountPath: /sub, subPath: deep/er}}\n    - {{name: mem, mountPath: /mem}}\n    - {{name: out, mountPath: /out}}\n    - {{name: given, mountPath: /given, readOnly: true}}\n  volumes:\n  - {{name: scratch, emptyDir: {{}}}}\n  - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}\n  - {{name: out, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n  - {{name: given, hostPath: {{path: {}, type: File}}}}\n",
        block(script, 6),
        out.display(),
        given.display()
    );
    agent.write_manifest("vols.yaml", &manifest)?;
    let name = agent.pod_name("vols");
    let pod = agent
        .wait_pod(&name, T, "Running", pods::all_running)
        .await?;
    let uid = pod.metadata.uid.clone().context("uid")?;
    stage(t0, "vols running");
    until(T, "the container's report", || async {
        Ok(read(&out.join("done")))
    })
    .await?;

    // The memory emptyDir is a tmpfs of the asked size, in the container
    // and on the host.
    let mem = read(&out.join("mem")).unwrap_or_default();
    ensure!(
        mem.contains(" - tmpfs ") && mem.contains("size=16384k"),
        "/mem in the container's mountinfo: {mem:?}"
    );
    let volumes = root.join("pods").join(&uid).join("volumes");
    let host = host_mounts_under(&volumes);
    ensure!(
        host.iter()
            .any(|m| m.ends_with("kubernetes.io~empty-dir/mem")),
        "no tmpfs on the host under {}: {host:?}",
        volumes.display()
    );
    // The disk emptyDir and its subPath are files under the agent's root.
    let scratch = volumes.join("kubernetes.io~empty-dir/scratch");
    assert_eq!(read(&scratch.join("x")).as_deref(), Some("hi\n"));
    assert_eq!(read(&scratch.join("deep/er/y")).as_deref(), Some("sub\n"));
    // fsGroup owns the emptyDir (setgid: the container's files too).
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&scratch)?;
        assert_eq!((m.gid(), m.mode() & 0o7777), (2345, 0o2777));
        assert_eq!(std::fs::metadata(scratch.join("x"))?.gid(), 2345);
    }
    // hostPath File, mounted read-only.
    assert_eq!(read(&out.join("given")).as_deref(), Some("given"));
    assert_eq!(read(&out.join("ro")).as_deref(), Some("readonly\n"));
    assert_eq!(read(&given).as_deref(), Some("given"));

    // A hostPath that fails its type check holds the pod back with
    // FailedMount; the pod starts once the path is there.
    let missing = agent.dir().join("appears-later");
    agent.write_manifest(
        "waits.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: waits}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, command: [sleep, '3600'], volumeMounts: [{{name: bad, mountPath: /bad}}]}}\n  volumes:\n  - {{name: bad, hostPath: {{path: {}, type: Directory}}}}\n",
            missing.display()
        ),
    )?;
    let waits = agent.pod_name("waits");
    stage(t0, "checked vols; waits written");
    agent
        .wait_pod(&waits, T, "ContainerCreating", |p| {
            pods::waiting_reason(p, "c") == "ContainerCreating"
        })
        .await?;
    let want = format!(
        "MountVolume.SetUp failed for volume \"bad\" : hostPath type check failed: {} is not a directory",
        missing.display()
    );
    until(T, "the FailedMount event in the agent's log", || async {
        Ok(agent.log_tail(400).contains(&want).then_some(()))
    })
    .await?;
    stage(t0, "waits waiting with FailedMount");
    std::fs::create_dir_all(&missing)?;
    agent
        .wait_pod(&waits, T, "Running once the path exists", |p| {
            pods::all_running(p)
        })
        .await?;

    stage(t0, "waits running");

    // An agent killed and restarted adopts the pod without mounting its
    // tmpfs twice, and sweeps the directory (and tmpfs) of a pod that no
    // longer exists, as a crash mid-teardown leaves it.
    let orphan = root.join("pods/0rphan-0000");
    let orphan_mem = orphan.join("volumes/kubernetes.io~empty-dir/mem");
    std::fs::create_dir_all(&orphan_mem)?;
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&orphan_mem)
        .status()?;
    ensure!(mounted.success(), "mount tmpfs for the orphan");
    // Old enough not to be taken for a pod starting right now.
    std::fs::File::open(&orphan)?
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))?;
    let before = agent.pod(&name).await?.context("vols")?;
    let id = pods::container_id(&before, "c");
    agent.restart().await?;
    until(T, "the orphan swept", || async {
        Ok((!orphan.exists()).then_some(()))
    })
    .await?;
    ensure!(host_mounts_under(&orphan).is_empty(), "orphan tmpfs left");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = agent
        .wait_pod(&name, T, "Running after restart", pods::all_running)
        .await?;
    assert_eq!(pods::container_id(&after, "c"), id, "no restart");
    let mems: Vec<_> = host_mounts_under(&volumes)
        .into_iter()
        .filter(|m| m.ends_with("/mem"))
        .collect();
    assert_eq!(mems.len(), 1, "{mems:?}");
    stage(t0, "restarted; orphan swept");

    // Teardown: no mount and no directory of the pod is left.
    agent.remove_manifest("vols.yaml")?;
    agent.remove_manifest("waits.yaml")?;
    agent.wait_pod_gone(&name, T).await?;
    agent.wait_pod_gone(&waits, T).await?;
    stage(t0, "pods gone");
    let pod_dir = root.join("pods").join(&uid);
    until(T, "the pod's directory removed", || async {
        Ok((!pod_dir.exists()).then_some(()))
    })
    .await?;
    let left = host_mounts_under(&pod_dir);
    ensure!(left.is_empty(), "mounts left behind: {left:?}");
    assert!(
        out.join("done").exists() && given.exists(),
        "hostPaths stay"
    );
    Ok(())
}

async fn pod_json(c: &Cluster, name: &str) -> Result<Option<Value>> {
    let out = c.kubectl(&["get", "pod", name, "-o", "json"]).await?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_slice(&out.stdout)?))
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
}

fn waiting(p: &Value) -> (String, String) {
    let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
    (
        w["reason"].as_str().unwrap_or("").to_string(),
        w["message"].as_str().unwrap_or("").to_string(),
    )
}

fn config_map(name: &str, data: &[(&str, &str)]) -> String {
    let mut y = format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata:\n");
    for (k, v) in data {
        y += &format!("  {k}: {v:?}\n");
    }
    y
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_secrets_downward_api_and_env_through_the_api() -> Result<()> {
    let t0 = Instant::now();
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    stage(t0, "cluster started");
    let node = cluster.nodes()[0].name().to_string();
    let root = cluster.nodes()[0].dir().join("root");
    let out = cluster.nodes()[0].dir().join("out");
    std::fs::create_dir_all(&out)?;

    cluster
        .apply(&config_map("cfg", &[("one", "v0"), ("two", "v0")]))
        .await?;
    cluster
        .apply("apiVersion: v1\nkind: Secret\nmetadata: {name: sec}\nstringData: {a: alpha, b: beta}\n")
        .await?;

    // The reader resolves `..data` once and reads both keys from that
    // version: any mix of versions is a torn read.
    let script = "stat -L -c %a /sec/a > /out/mode-a\n\
        stat -L -c %a /sec/sub/b > /out/mode-b\n\
        stat -L -c %a /cfg/one > /out/mode-cfg\n\
        env > /out/env\n\
        cat /info/labels > /out/labels\n\
        cat /proj/one /proj/podname > /out/proj\n\
        while true; do\n\
        \x20 d=$(readlink /cfg/..data)\n\
        \x20 if a=$(cat /cfg/$d/one 2>/dev/null) && b=$(cat /cfg/$d/two 2>/dev/null); then\n\
        \x20   [ \"$a\" = \"$b\" ] || echo \"$a $b\" >> /out/torn\n\
        \x20   echo \"$a\" > /out/seen.tmp && mv /out/seen.tmp /out/seen\n\
        \x20 fi\n\
        \x20 usleep 20000\n\
        done\n";
    let pod = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: app, labels: {{app: demo}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    resources: {{limits: {{memory: 64Mi}}}}
    command: [sh, -c]
    args:
    - |
{}    envFrom:
    - {{configMapRef: {{name: cfg}}, prefix: CM_}}
    - secretRef: {{name: sec}}
    - configMapRef: {{name: absent, optional: true}}
    env:
    - {{name: X, valueFrom: {{configMapKeyRef: {{name: cfg, key: one}}}}}}
    - {{name: S, valueFrom: {{secretKeyRef: {{name: sec, key: b}}}}}}
    - {{name: OPT, valueFrom: {{configMapKeyRef: {{name: absent, key: k, optional: true}}}}}}
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
    - {{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: HOST_IP, valueFrom: {{fieldRef: {{fieldPath: status.hostIP}}}}}}
    - {{name: MEM_MI, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
    volumeMounts:
    - {{name: cfg, mountPath: /cfg}}
    - {{name: sec, mountPath: /sec}}
    - {{name: info, mountPath: /info}}
    - {{name: proj, mountPath: /proj}}
    - {{name: out, mountPath: /out}}
  volumes:
  - {{name: cfg, configMap: {{name: cfg}}}}
  - name: sec
    secret:
      secretName: sec
      defaultMode: 256
      items: [{{key: a, path: a}}, {{key: b, path: sub/b, mode: 416}}]
  - name: info
    downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}
  - name: proj
    projected:
      sources:
      - configMap: {{name: cfg, items: [{{key: one, path: one}}]}}
      - downwardAPI: {{items: [{{path: podname, fieldRef: {{fieldPath: metadata.name}}}}]}}
  - {{name: out, hostPath: {{path: {}}}}}
",
        block(script, 6),
        out.display()
    );
    cluster.apply(&pod).await?;
    let p = until(T, "app Running", || async {
        Ok(pod_json(&cluster, "app").await?.filter(running))
    })
    .await?;
    let uid = p["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let pod_ip = p["status"]["podIP"].as_str().unwrap_or("").to_string();
    stage(t0, "app running");
    until(T, "the container's first read", || async {
        Ok(read(&out.join("seen")))
    })
    .await?;

    // Secret modes: defaultMode 0400, the item's own 0640.
    assert_eq!(read(&out.join("mode-a")).as_deref(), Some("400\n"));
    assert_eq!(read(&out.join("mode-b")).as_deref(), Some("640\n"));
    assert_eq!(read(&out.join("mode-cfg")).as_deref(), Some("644\n"));
    assert_eq!(read(&out.join("labels")).as_deref(), Some("app=\"demo\""));
    assert_eq!(read(&out.join("proj")).as_deref(), Some("v0app"));

    // Env: envFrom with prefix, key refs, optional, fields, resources.
    let env = read(&out.join("env")).unwrap_or_default();
    let has = |line: &str| env.lines().any(|l| l == line);
    for want in [
        "CM_one=v0".to_string(),
        "CM_two=v0".into(),
        "a=alpha".into(),
        "b=beta".into(),
        "X=v0".into(),
        "S=beta".into(),
        "POD_NAME=app".into(),
        "POD_NS=default".into(),
        format!("POD_UID={uid}"),
        format!("NODE={node}"),
        format!("POD_IP={pod_ip}"),
        "MEM_MI=64".into(),
    ] {
        ensure!(has(&want), "no {want} in the container's env:\n{env}");
    }
    ensure!(
        !env.contains("OPT="),
        "an optional missing key is unset:\n{env}"
    );
    ensure!(
        env.lines().any(|l| l.starts_with("HOST_IP=")),
        "no HOST_IP:\n{env}"
    );

    // Secrets and projected volumes are tmpfs mounts on the host.
    let volumes = root.join("pods").join(&uid).join("volumes");
    let mounts = host_mounts_under(&volumes);
    for m in ["kubernetes.io~secret/sec", "kubernetes.io~projected/proj"] {
        ensure!(
            mounts.iter().any(|x| x.ends_with(m)),
            "no tmpfs for {m}: {mounts:?}"
        );
    }

    stage(t0, "app checked");
    // Updates reach the running pod; the reader never sees a mix.
    for v in 1..=3 {
        let val = format!("v{v}");
        cluster
            .apply(&config_map("cfg", &[("one", &val), ("two", &val)]))
            .await?;
        let want = format!("{val}\n");
        until(T, &format!("{val} seen in the pod"), || async {
            Ok((read(&out.join("seen")).as_deref() == Some(want.as_str())).then_some(()))
        })
        .await?;
        stage(t0, &format!("{val} seen"));
    }
    let torn = read(&out.join("torn"));
    ensure!(torn.is_none(), "torn reads: {torn:?}");

    // A missing configMap in env: CreateContainerConfigError, then Running
    // once it is created.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: late-env}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: IfNotPresent\n    command: [sleep, '3600']\n    env: [{{name: K, valueFrom: {{configMapKeyRef: {{name: late, key: k}}}}}}]\n"
        ))
        .await?;
    let p = until(T, "late-env CreateContainerConfigError", || async {
        Ok(pod_json(&cluster, "late-env")
            .await?
            .filter(|p| waiting(p).0 == "CreateContainerConfigError"))
    })
    .await?;
    assert_eq!(waiting(&p).1, "configmap \"late\" not found", "{p}");
    stage(t0, "late-env waits");
    cluster.apply(&config_map("late", &[("k", "1")])).await?;
    until(T, "late-env Running", || async {
        Ok(pod_json(&cluster, "late-env").await?.filter(running))
    })
    .await?;

    stage(t0, "late-env running");
    // A missing configMap volume: FailedMount, then Running.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: late-vol}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v}}]}}\n  volumes:\n  - {{name: v, configMap: {{name: late2}}}}\n"
        ))
        .await?;
    let want = "MountVolume.SetUp failed for volume \"v\" : configmap \"late2\" not found";
    until(T, "the FailedMount event", || async {
        let ev = cluster
            .kubectl_ok(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=late-vol,reason=FailedMount",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .await?;
        Ok(ev.contains(want).then_some(()))
    })
    .await?;
    stage(t0, "late-vol FailedMount");
    let p = pod_json(&cluster, "late-vol").await?.context("late-vol")?;
    assert_eq!(waiting(&p).0, "ContainerCreating", "{p}");
    cluster.apply(&config_map("late2", &[("k", "1")])).await?;
    until(T, "late-vol Running", || async {
        Ok(pod_json(&cluster, "late-vol").await?.filter(running))
    })
    .await?;

    stage(t0, "late-vol running");
    // Deletion leaves no mount and no directory.
    cluster
        .kubectl_ok(&[
            "delete",
            "pod",
            "app",
            "late-env",
            "late-vol",
            "--wait=false",
        ])
        .await?;
    // All three go together; a pod's mounts are gone before its directory.
    let pods_dir: PathBuf = root.join("pods");
    until(T, "the pods' directories removed", || async {
        let left = std::fs::read_dir(&pods_dir).map_or(0, |d| d.count());
        Ok((left == 0).then_some(()))
    })
    .await?;
    stage(t0, "pods gone");
    let left = host_mounts_under(&root.join("pods"));
    ensure!(left.is_empty(), "mounts left behind: {left:?}");
    cluster.finish().await
}
