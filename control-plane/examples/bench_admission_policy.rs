//! ValidatingAdmissionPolicy benchmark: ConfigMap creates that a policy
//! of 3 CEL validations checks (bound with `Deny` to objects labelled
//! `policy: on`) against unlabelled ConfigMap creates that no binding
//! selects, through the same client at the same concurrency into the same
//! namespace, in rounds that alternate which side goes first. Names
//! always sort after the ones before them, so both sides append to the
//! store's key range (inserting into its middle costs more).
//!
//! Run: `cargo run --release -p skiff-control-plane --example
//! bench_admission_policy -- [--objects N] [--concurrency C] [--rounds R]`.
//! Prints figures and the ratio (aim: checked/unchecked throughput >=
//! 0.8), then one JSON line.

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_control_plane::store::bench::timed;
use skiff_control_plane::testkit::TestServer;

#[derive(Parser, Debug)]
struct Args {
    /// Creates on each side, over all rounds.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

const POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: bench.skiff.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [''], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [configmaps]}
  validations:
  - expression: "has(object.data) && size(object.data) <= 20"
    message: at most 20 keys
  - expression: "object.data.all(k, k.startsWith('key'))"
    message: keys start with key
  - expression: "!('forbidden' in object.data)"
    message: no forbidden key
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: bench-binding}
spec:
  policyName: bench.skiff.io
  validationActions: [Deny]
  matchResources:
    objectSelector: {matchLabels: {policy: 'on'}}
"#;

/// Seconds to create `n` ConfigMaps named `PREFIX-I` through `maps`, `c`
/// at once, labelled for the policy when `checked`.
async fn creates(
    maps: &Api<ConfigMap>,
    prefix: &str,
    checked: bool,
    n: usize,
    c: usize,
) -> anyhow::Result<f64> {
    let labels = match checked {
        true => json!({"policy": "on"}),
        false => json!({}),
    };
    Ok(timed(n, c, |i| {
        let maps = maps.clone();
        let labels = labels.clone();
        async move {
            let data: serde_json::Map<String, serde_json::Value> = (0..10)
                .map(|k| (format!("key{k}"), json!(format!("value-{k}"))))
                .collect();
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("{prefix}-{i:06}"), "labels": labels},
                "data": data}))
            .map_err(kube::Error::SerdeError)?;
            maps.create(&PostParams::default(), &cm).await.map(|_| ())
        }
    })
    .await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s = TestServer::start().await;
    s.kubectl(&["create", "namespace", "bench"]);
    let out = s.kubectl_stdin(&["apply", "-f", "-"], POLICY);
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr));
    }
    // In force once a forbidden key is refused.
    let probe = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe, namespace: bench, labels: {policy: 'on'}}\ndata: {forbidden: '1'}\n";
    let deadline = Instant::now() + Duration::from_secs(10);
    while s
        .kubectl_stdin(&["create", "-f", "-"], probe)
        .status
        .success()
    {
        if Instant::now() > deadline {
            bail!("the policy never came into force");
        }
        s.kubectl(&["delete", "configmap", "probe", "-n", "bench"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = s.client().await;
    let maps: Api<ConfigMap> = Api::namespaced(client, "bench");
    let per_round = args.objects / args.rounds.max(1);
    let (mut plain_secs, mut policy_secs) = (0.0, 0.0);
    for round in 0..args.rounds {
        // Each side goes first in every other round: the store grows as
        // the run goes on, so a fixed order would favour the first side.
        let c = args.concurrency;
        let (first, second) = (format!("cm-{round:03}-a"), format!("cm-{round:03}-b"));
        if round % 2 == 0 {
            plain_secs += creates(&maps, &first, false, per_round, c).await?;
            policy_secs += creates(&maps, &second, true, per_round, c).await?;
        } else {
            policy_secs += creates(&maps, &first, true, per_round, c).await?;
            plain_secs += creates(&maps, &second, false, per_round, c).await?;
        }
    }
    let n = (per_round * args.rounds) as f64;
    let (plain_rate, policy_rate) = (n / plain_secs, n / policy_secs);
    let ratio = policy_rate / plain_rate;
    println!(
        "{n} ConfigMap creates each, concurrency {}, {} rounds:",
        args.concurrency, args.rounds
    );
    println!("  no policy                      {plain_rate:8.0} /s");
    println!("  policy with 3 CEL validations  {policy_rate:8.0} /s");
    println!("  ratio {ratio:.2}   (aim: >= 0.8)");
    println!(
        "{}",
        json!({"bench": "admission-policy", "objects": n, "unchecked_per_s": plain_rate,
               "checked_per_s": policy_rate, "ratio": ratio})
    );
    Ok(())
}
