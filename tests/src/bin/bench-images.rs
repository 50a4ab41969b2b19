//! Images on a node: pull-and-start through the agent against the raw
//! cost, and the image garbage collector's cost per pass.
//!
//! - pull: a ~50 MB image from the loopback registry. Raw: `ctr images
//!   pull` into a fresh containerd, then the pod's sandbox and container
//!   through direct CRI calls; agent: from the static pod manifest
//!   appearing to the container running, in another fresh containerd.
//! - GC: 200 images on the node. CPU and wall time of a collection that
//!   removes nothing (list, match, statvfs) against the raw CRI listing it
//!   makes; then one collection that removes all 200.
//!
//! Run: `cargo run --release -p skiff-tests --bin bench-images [-- --rounds 3 --images 200 --mb 50]`

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cri_proto::{v1, CriClient};
use skiff_agent::images::collector::Collector;
use skiff_agent::images::gc::Policy;
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::bench::arg;
use skiff_tests::rawcri::raw_pod_of;
use skiff_tests::{Containerd, Registry};

const T: Duration = Duration::from_secs(300);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let rounds = arg("--rounds", 3);
    let mb = arg("--mb", 50);
    let n_images = arg("--images", 200);
    pull(rounds, mb).await?;
    gc(n_images).await
}

async fn pull(rounds: usize, mb: usize) -> Result<()> {
    let registry = Registry::start().await?;
    let image = tokio::task::spawn_blocking(move || {
        skiff_tests::images::toolbox_with_blob("bench/big:1", mb * 1_000_000)
    })
    .await??;
    registry.push("bench/big", "1", &image);
    let reference = registry.reference("bench/big", "1");
    let (mut raw_pull, mut raw_total, mut agent_total) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let cd = Containerd::builder().registry(&registry).start().await?;
        let t = Instant::now();
        // Under a timeout, killed on drop: what the lint asks for.
        #[allow(clippy::disallowed_methods)]
        let pull = tokio::process::Command::new("ctr")
            .arg("--address")
            .arg(cd.socket())
            .args([
                "-n",
                "k8s.io",
                "images",
                "pull",
                "--plain-http",
                "--snapshotter",
            ])
            .arg(cd.snapshotter())
            .arg(&reference)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(T, pull)
            .await
            .context("ctr images pull took too long")?
            .context("running ctr images pull")?;
        if !out.status.success() {
            bail!("ctr images pull: {}", String::from_utf8_lossy(&out.stderr));
        }
        raw_pull.push(t.elapsed());
        raw_pod_of(
            &cd.client(),
            &format!("raw-{round}"),
            &cd.dir().join("raw-logs"),
            &reference,
        )
        .await?;
        raw_total.push(t.elapsed());
        drop(cd);

        let cd = Containerd::builder().registry(&registry).start().await?;
        let agent = Agent::start(&cd, AgentOptions::default()).await?;
        let name = format!("big-{round}");
        let t = Instant::now();
        agent.write_manifest(
            "big.yaml",
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {reference}\n    command: [sleep, '3600']\n"
            ),
        )?;
        agent
            .wait_pod(&agent.pod_name(&name), T, "Running", |p| {
                pods::running(p, "c")
            })
            .await?;
        agent_total.push(t.elapsed());
    }
    let ms = |v: &[Duration]| median(v).as_secs_f64() * 1000.0;
    println!(
        "pull and start of a {mb} MB image from the loopback registry, median of {rounds} (ms):"
    );
    println!("  ctr images pull           {:8.0}", ms(&raw_pull));
    println!("  ctr pull + raw CRI start  {:8.0}", ms(&raw_total));
    println!("  agent (manifest->running) {:8.0}", ms(&agent_total));
    println!(
        "  ratio agent / raw {:.2}   (aim: <= 1.2)   agent / ctr pull alone {:.2}",
        ms(&agent_total) / ms(&raw_total),
        ms(&agent_total) / ms(&raw_pull)
    );
    Ok(())
}

async fn gc(n: usize) -> Result<()> {
    let cd = Containerd::start().await?;
    let cri = cd.client();
    for i in 0..n {
        cd.images().load_toolbox_tag(&format!("gc-{i}")).await?;
    }
    let listed = cri
        .list_images(v1::ListImagesRequest { filter: None })
        .await?
        .images
        .len();
    const PASSES: u32 = 50;
    let meter = Meter::start()?;
    for _ in 0..PASSES {
        raw_listing(&cri).await?;
    }
    let (raw_cpu, raw_wall) = meter.per_pass(PASSES)?;
    let keep = Policy {
        high_threshold_percent: 100,
        ..Policy::default()
    };
    let mut collector = Collector::new(cri.clone(), keep, Duration::from_secs(300), None);
    let began = Instant::now();
    let meter = Meter::start()?;
    for _ in 0..PASSES {
        collector.collect(began).await?;
    }
    let (cpu, wall) = meter.per_pass(PASSES)?;
    // Everything unused is past a one-second maximum age, counted from a
    // start an hour ago.
    let remove_all = Policy {
        high_threshold_percent: 100,
        min_age: Duration::ZERO,
        max_age: Duration::from_secs(1),
        ..Policy::default()
    };
    let mut collector = Collector::new(cri.clone(), remove_all, Duration::from_secs(300), None);
    let long_ago = Instant::now()
        .checked_sub(Duration::from_secs(3600))
        .context("clock too young")?;
    let t = Instant::now();
    collector.collect(long_ago).await?;
    let removal = t.elapsed();
    let left = cri
        .list_images(v1::ListImagesRequest { filter: None })
        .await?
        .images
        .len();
    println!("image GC with {listed} images on the node, mean of {PASSES} passes:");
    println!(
        "  raw CRI listing (ListImages+ListContainers+ImageFsInfo)  cpu {:6.2} ms  wall {:6.2} ms",
        raw_cpu, raw_wall
    );
    println!(
        "  collection removing nothing                            cpu {:6.2} ms  wall {:6.2} ms",
        cpu, wall
    );
    println!(
        "  ratio cpu {:.2}  wall {:.2}",
        cpu / raw_cpu.max(0.01),
        wall / raw_wall.max(0.01)
    );
    println!(
        "  one collection removing {} images: {:.0} ms ({:.1} ms per image)",
        listed - left,
        removal.as_secs_f64() * 1000.0,
        removal.as_secs_f64() * 1000.0 / (listed - left).max(1) as f64
    );
    Ok(())
}

async fn raw_listing(cri: &CriClient) -> Result<()> {
    let (images, containers, fs) = tokio::join!(
        cri.list_images(v1::ListImagesRequest { filter: None }),
        cri.list_containers(v1::ListContainersRequest { filter: None }),
        cri.image_fs_info(v1::ImageFsInfoRequest::default()),
    );
    images?;
    containers?;
    fs?;
    Ok(())
}

/// CPU (this process, user + system) and wall time since it started.
struct Meter {
    cpu_ms: f64,
    at: Instant,
}

impl Meter {
    fn start() -> Result<Meter> {
        Ok(Meter {
            cpu_ms: cpu_ms()?,
            at: Instant::now(),
        })
    }

    /// Mean CPU and wall time in milliseconds of each of `passes`.
    fn per_pass(&self, passes: u32) -> Result<(f64, f64)> {
        let n = f64::from(passes);
        let wall = self.at.elapsed().as_secs_f64() * 1000.0 / n;
        Ok(((cpu_ms()? - self.cpu_ms) / n, wall))
    }
}

/// This process's user + system CPU time so far, from /proc/self/stat.
fn cpu_ms() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    Ok(ticks as f64 * 1000.0 / hz)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
