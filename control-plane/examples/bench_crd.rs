//! Custom resource benchmark, against the built-in cost in the same run:
//! creates of a custom kind (a schema of 20 fields and one CEL rule)
//! against ConfigMap
//! creates through the same client at the same concurrency, in
//! alternating rounds; and the time from a definition's create to its
//! kind being Established and served.
//!
//! Run: `cargo run --release -p skiff-control-plane --example bench_crd --
//! [--objects N] [--concurrency C] [--rounds R] [--definitions D]`.
//! Prints figures, the ratio (aim: custom/ConfigMap throughput >= 0.8;
//! definition to served p99 <= 1 s), then one JSON line.
//!
//! The server runs in this process (the test fixture): both kinds go
//! through the same HTTPS client and server, so the ratio compares the
//! custom kind's schema work with a built-in kind's typed decoding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value};
use skiff_control_plane::store::bench::{percentile, timed};
use skiff_control_plane::testkit::TestServer;

#[derive(Parser, Debug)]
struct Args {
    /// Creates of each kind, over all rounds.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Definitions created one after another for the establish timing.
    #[arg(long, default_value_t = 20)]
    definitions: usize,
}

/// A definition of `plural`.`group` with a 20-field spec and one CEL rule.
fn definition(group: &str, plural: &str, kind: &str) -> Value {
    let mut props = serde_json::Map::new();
    for i in 0..10 {
        props.insert(format!("s{i}"), json!({"type": "string", "maxLength": 64}));
        props.insert(format!("n{i}"), json!({"type": "integer", "minimum": 0}));
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": props,
                        "x-kubernetes-validations": [{
                            "rule": "self.n0 <= self.n9 && self.s0.startsWith('value')",
                            "message": "n0 may not exceed n9"}]}}}}}]}
    })
}

fn spec() -> Value {
    let mut spec = serde_json::Map::new();
    for i in 0..10 {
        spec.insert(format!("s{i}"), json!(format!("value-{i}")));
        spec.insert(format!("n{i}"), json!(i));
    }
    Value::Object(spec)
}

async fn established(crds: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<()> {
    loop {
        let crd = crds.get(name).await?;
        let ok = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if ok {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s = TestServer::start().await;
    let client = s.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());

    // Definition -> Established -> served.
    let mut to_served = Vec::new();
    for i in 0..args.definitions {
        let plural = format!("things{i}");
        let crd: CustomResourceDefinition = serde_json::from_value(definition(
            "bench.example.com",
            &plural,
            &format!("Thing{i}"),
        ))?;
        let start = Instant::now();
        crds.create(&PostParams::default(), &crd).await?;
        established(&crds, &format!("{plural}.bench.example.com")).await?;
        let res = ApiResource {
            group: "bench.example.com".into(),
            version: "v1".into(),
            api_version: "bench.example.com/v1".into(),
            kind: format!("Thing{i}"),
            plural: plural.clone(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &res);
        while api.list(&Default::default()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        to_served.push(start.elapsed());
    }

    let res = ApiResource {
        group: "bench.example.com".into(),
        version: "v1".into(),
        api_version: "bench.example.com/v1".into(),
        kind: "Thing0".into(),
        plural: "things0".into(),
    };
    let custom: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &res);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let per_round = args.objects / args.rounds.max(1);
    let (mut cr_secs, mut cm_secs) = (0.0, 0.0);
    let spec = Arc::new(spec());
    for round in 0..args.rounds {
        let base = round * per_round;
        cm_secs += timed(per_round, args.concurrency, |i| {
            let maps = maps.clone();
            let data: serde_json::Map<String, Value> = spec
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), json!(v.to_string())))
                .collect();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("cm-{}", base + i)}, "data": data}))
                .map_err(kube::Error::SerdeError)?;
                maps.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        })
        .await?;
        cr_secs += timed(per_round, args.concurrency, |i| {
            let custom = custom.clone();
            let spec = spec.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "bench.example.com/v1", "kind": "Thing0",
                    "metadata": {"name": format!("cr-{}", base + i)}, "spec": *spec}))
                .map_err(kube::Error::SerdeError)?;
                custom
                    .create(&PostParams::default(), &obj)
                    .await
                    .map(|_| ())
            }
        })
        .await?;
    }
    let n = (per_round * args.rounds) as f64;
    let (cr_rate, cm_rate) = (n / cr_secs, n / cm_secs);
    let ratio = cr_rate / cm_rate;
    let p50 = percentile(&to_served, 0.5);
    let p99 = percentile(&to_served, 0.99);
    println!(
        "{} creates each, concurrency {}, {} rounds:",
        n, args.concurrency, args.rounds
    );
    println!("  ConfigMap        {cm_rate:8.0} /s");
    println!("  custom (20 fields, 1 rule) {cr_rate:6.0} /s");
    println!("  ratio custom/ConfigMap {ratio:.2}   (aim: >= 0.8)");
    println!(
        "definition create -> Established and served ({} definitions): p50 {:.0} ms, p99 {:.0} ms   (aim: p99 <= 1000 ms)",
        to_served.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    println!(
        "{}",
        json!({"objects": n, "configmap_per_s": cm_rate, "custom_per_s": cr_rate, "ratio": ratio,
               "served_p50_ms": p50.as_secs_f64() * 1e3, "served_p99_ms": p99.as_secs_f64() * 1e3})
    );
    if to_served.len() != args.definitions {
        bail!("not every definition was served");
    }
    Ok(())
}
