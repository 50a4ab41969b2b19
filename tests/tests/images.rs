//! The node's images beyond pulls: the image garbage collector removes
//! what no container uses and keeps what one does and the sandbox image;
//! an absent, unpullable sandbox image is reported at start. Standalone
//! agents on the harness's containerd: no API server needed.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use cri_proto::{v1, CriClient};
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::cluster::wait_for;
use skiff_tests::images::PAUSE_IMAGE;
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const T: Duration = Duration::from_secs(60);

async fn image_names(cri: &CriClient) -> Result<Vec<String>> {
    let images = cri
        .list_images(v1::ListImagesRequest { filter: None })
        .await?
        .images;
    Ok(images.into_iter().flat_map(|i| i.repo_tags).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_removes_unused_images_and_keeps_used_ones_and_the_sandbox_image() -> Result<()> {
    let cd = Containerd::start().await?;
    let unused = cd.images().load_toolbox_tag("unused").await?;
    let cri = cd.client();
    ensure!(image_names(&cri)
        .await?
        .contains(&unused.name().to_string()));
    let agent = Agent::start(
        &cd,
        AgentOptions {
            extra_args: vec![
                // By age only: the disk's usage is whatever the machine's is.
                "--image-gc-high-threshold=100".into(),
                "--image-maximum-gc-age=10s".into(),
                "--image-minimum-gc-age=0s".into(),
                "--image-gc-period=1s".into(),
            ],
            ..Default::default()
        },
    )
    .await?;
    agent.write_manifest(
        "user.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: user\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {TOOLBOX_IMAGE}\n    command: [sleep, '3600']\n"
        ),
    )?;
    agent
        .wait_pod(&agent.pod_name("user"), T, "Running", |p| {
            pods::running(p, "main")
        })
        .await?;
    let names = wait_for("the unused image removed", T, || async {
        let names = image_names(&cri).await?;
        ensure!(
            !names.contains(&unused.name().to_string()),
            "unused image still present: {names:?}"
        );
        Ok(names)
    })
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail(40)))?;
    ensure!(
        names.iter().any(|n| n == TOOLBOX_IMAGE),
        "the image a container uses was removed: {names:?}"
    );
    ensure!(
        names.iter().any(|n| n == PAUSE_IMAGE),
        "the sandbox image was removed: {names:?}"
    );
    let pod = agent.pod(&agent.pod_name("user")).await?;
    ensure!(
        pod.as_ref().is_some_and(|p| pods::running(p, "main")),
        "the pod stopped running"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_unpullable_sandbox_image_is_reported_at_start() -> Result<()> {
    // Nothing listens on the discard port: the pull fails at once, and
    // nothing leaves the machine.
    let cd = Containerd::builder()
        .without_default_images()
        .registry_mirror("skiff.test", "http://127.0.0.1:9")
        .start()
        .await?;
    let agent = Agent::start(
        &cd,
        AgentOptions {
            no_client_ca: true,
            ..Default::default()
        },
    )
    .await?;
    let expected = format!("sandbox image \"{PAUSE_IMAGE}\" is not present and cannot be pulled");
    wait_for("the error about the sandbox image", T, || async {
        let log = agent.log_tail(100);
        ensure!(log.contains(&expected), "agent log:\n{log}");
        Ok(())
    })
    .await
}

/// An archive dropped (gzip) into the import directory is imported and
/// runs with `imagePullPolicy: Never`; `skiff-agent images` imports a
/// zstd one, lists it as crictl does and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_are_imported_from_the_directory_and_the_command_line() -> Result<()> {
    let cd = Containerd::start().await?;
    let cri = cd.client();
    let (dropped, typed) = tokio::task::spawn_blocking(|| {
        Ok::<_, anyhow::Error>((
            skiff_tests::images::toolbox_tag("dropped")?,
            skiff_tests::images::toolbox_tag("typed")?,
        ))
    })
    .await??;
    let agent = Agent::start(
        &cd,
        AgentOptions {
            no_client_ca: true,
            ..Default::default()
        },
    )
    .await?;

    // Written aside and renamed in, as a careful copy would.
    let import_dir = agent.dir().join("root/images");
    std::fs::create_dir_all(&import_dir)?;
    let tar = cd.dir().join("dropped.tar");
    dropped.write_layout_tar(&tar)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &std::fs::read(&tar)?)?;
    let partial = import_dir.join("dropped.partial");
    std::fs::write(&partial, gz.finish()?)?;
    std::fs::rename(&partial, import_dir.join("dropped.tar.gz"))?;
    wait_for("the dropped archive imported", T, || async {
        let names = image_names(&cri).await?;
        ensure!(
            names.iter().any(|n| n == dropped.name()),
            "images: {names:?}"
        );
        Ok(())
    })
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail(40)))?;
    agent.write_manifest(
        "dropped.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: dropped\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: Never\n    command: [sleep, '3600']\n",
            dropped.name()
        ),
    )?;
    agent
        .wait_pod(&agent.pod_name("dropped"), T, "Running", |p| {
            pods::running(p, "main")
        })
        .await?;
    ensure!(
        agent
            .log_tail(200)
            .contains(&format!("Imported {}", dropped.name())),
        "no import line in the agent's log"
    );

    let zst = cd.dir().join("typed.tar.zst");
    typed.write_layout_tar(&tar)?;
    let compressed = ruzstd::encoding::compress_to_vec(
        std::fs::File::open(&tar)?,
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    std::fs::write(&zst, compressed)?;
    let endpoint = format!("--container-runtime-endpoint={}", cd.endpoint());
    let images = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(skiff_tests::agent::workspace_binary(
            "skiff-agent",
            "skiff-agent",
        )?)
        .arg("images")
        .arg(&endpoint)
        .args(args)
        .output()?;
        ensure!(
            out.status.success(),
            "skiff-agent images {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    let imported = images(&["import", &zst.to_string_lossy()])?;
    ensure!(
        imported.trim() == format!("Imported: {}", typed.name()),
        "import said {imported:?}"
    );
    let listed = images(&["list"])?;
    let header = listed.lines().next().unwrap_or_default();
    ensure!(
        header.split_whitespace().collect::<Vec<_>>() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"],
        "header {header:?}"
    );
    let short_id: String = typed.config_digest().trim_start_matches("sha256:")[..13].into();
    ensure!(
        listed.lines().any(|l| l.split_whitespace().take(3).eq([
            "skiff.test/toolbox",
            "typed",
            short_id.as_str()
        ])),
        "typed image not listed:\n{listed}"
    );
    let removed = images(&["rm", typed.name()])?;
    ensure!(
        removed.trim() == format!("Deleted: {}", typed.name()),
        "rm said {removed:?}"
    );
    ensure!(
        !image_names(&cri).await?.iter().any(|n| n == typed.name()),
        "removed image still listed"
    );
    Ok(())
}
