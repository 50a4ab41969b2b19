//! Server-side apply benchmark: one annotation of a Deployment changed by
//! a server-side apply of the whole configuration (what `kubectl apply
//! --server-side` and controllers built on kube-rs's `Patch::Apply` send)
//! against the same change as a strategic merge patch (what client-side
//! `kubectl apply` sends), over the same Deployments at the same
//! concurrency, in rounds that alternate which side goes first.
//!
//! Run: `cargo run --release -p skiff-control-plane --example bench_apply
//! -- [--deployments D] [--writes N] [--concurrency C] [--rounds R]`.
//! Prints figures and the ratio (aim: apply/strategic time per write <=
//! 1.5), then one JSON line.

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use skiff_control_plane::store::bench::timed;
use skiff_control_plane::testkit::TestServer;

#[derive(Parser, Debug)]
struct Args {
    /// Deployments the writes go round.
    #[arg(long, default_value_t = 64)]
    deployments: usize,
    /// Writes on each side, over all rounds.
    #[arg(long, default_value_t = 4_000)]
    writes: usize,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

/// Deployment `name`'s whole configuration, annotated `rev`.
fn config(name: &str, rev: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}, "annotations": {"rev": rev}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "web", "image": "nginx:1.25",
                    "ports": [{"containerPort": 80}, {"containerPort": 443}],
                    "env": [{"name": "A", "value": "a"}, {"name": "B", "value": "b"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }]},
            },
        },
    })
}

/// Seconds for `n` writes of annotation `rev` round the deployments, by
/// server-side apply or by strategic merge patch.
async fn writes(
    api: &Api<Deployment>,
    args: &Args,
    n: usize,
    tag: &str,
    apply: bool,
) -> anyhow::Result<f64> {
    // The patches take the annotation over from the applier, and back:
    // the applier forces, as controllers do.
    let params = PatchParams::apply("bench").force();
    let plain = PatchParams {
        field_manager: Some("bench-patch".into()),
        ..PatchParams::default()
    };
    Ok(timed(n, args.concurrency, |i| {
        let (api, params, plain) = (api.clone(), params.clone(), plain.clone());
        let name = format!("web-{}", i % args.deployments);
        let rev = format!("{tag}-{i}");
        async move {
            if apply {
                api.patch(&name, &params, &Patch::Apply(config(&name, &rev)))
                    .await?;
            } else {
                let change = json!({"metadata": {"annotations": {"rev": rev}}});
                api.patch(&name, &plain, &Patch::Strategic(change)).await?;
            }
            Ok::<_, kube::Error>(())
        }
    })
    .await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s = TestServer::start().await;
    let api: Api<Deployment> = Api::namespaced(s.client().await, "default");
    let params = PatchParams::apply("bench");
    for d in 0..args.deployments {
        let name = format!("web-{d}");
        api.patch(&name, &params, &Patch::Apply(config(&name, "0")))
            .await?;
    }
    let per_round = args.writes / args.rounds.max(1);
    let (mut apply_secs, mut strategic_secs) = (0.0, 0.0);
    for round in 0..args.rounds {
        let tag = format!("r{round}");
        if round % 2 == 0 {
            strategic_secs += writes(&api, &args, per_round, &tag, false).await?;
            apply_secs += writes(&api, &args, per_round, &tag, true).await?;
        } else {
            apply_secs += writes(&api, &args, per_round, &tag, true).await?;
            strategic_secs += writes(&api, &args, per_round, &tag, false).await?;
        }
    }
    let n = (per_round * args.rounds) as f64;
    let (apply_ms, strategic_ms) = (apply_secs * 1e3 / n, strategic_secs * 1e3 / n);
    let ratio = apply_ms / strategic_ms;
    println!(
        "{n} annotation changes each over {} Deployments, concurrency {}, {} rounds:",
        args.deployments, args.concurrency, args.rounds
    );
    println!(
        "  strategic merge patch   {:8.0} /s  ({strategic_ms:.3} ms per write at this concurrency)",
        n / strategic_secs
    );
    println!(
        "  server-side apply       {:8.0} /s  ({apply_ms:.3} ms per write)",
        n / apply_secs
    );
    println!("  ratio {ratio:.2}   (aim: <= 1.5)");
    println!(
        "{}",
        json!({"bench": "apply", "writes": n, "strategic_per_s": n / strategic_secs,
               "apply_per_s": n / apply_secs, "ratio": ratio})
    );
    Ok(())
}
