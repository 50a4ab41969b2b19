//! ValidatingAdmissionPolicy benchmark: ConfigMap creates that a policy
//! of 3 CEL validations checks (bound with `Deny` to their namespace)
//! against ConfigMap creates in a namespace no binding selects, through
//! the same client at the same concurrency, in alternating rounds.
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
    namespaceSelector: {matchLabels: {policy: 'on'}}
"#;

/// Seconds to create `n` ConfigMaps through `maps`, `c` at once.
async fn creates(maps: &Api<ConfigMap>, base: usize, n: usize, c: usize) -> anyhow::Result<f64> {
    Ok(timed(n, c, |i| {
        let maps = maps.clone();
        async move {
            let data: serde_json::Map<String, serde_json::Value> = (0..10)
                .map(|k| (format!("key{k}"), json!(format!("value-{k}"))))
                .collect();
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("cm-{}", base + i)}, "data": data}))
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
    for ns in ["unchecked", "checked"] {
        s.kubectl(&["create", "namespace", ns]);
    }
    s.kubectl(&["label", "namespace", "checked", "policy=on"]);
    let out = s.kubectl_stdin(&["apply", "-f", "-"], POLICY);
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr));
    }
    // In force once a forbidden key is refused.
    let probe = s.kubectl(&[
        "create",
        "configmap",
        "probe",
        "-n",
        "checked",
        "--from-literal=forbidden=1",
    ]);
    let mut refused = !probe.status.success();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !refused && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let out = s.kubectl(&[
            "create",
            "configmap",
            "probe2",
            "-n",
            "checked",
            "--from-literal=forbidden=1",
        ]);
        refused = !out.status.success();
    }
    if !refused {
        bail!("the policy never came into force");
    }
    let client = s.client().await;
    let unchecked: Api<ConfigMap> = Api::namespaced(client.clone(), "unchecked");
    let checked: Api<ConfigMap> = Api::namespaced(client.clone(), "checked");
    let per_round = args.objects / args.rounds.max(1);
    let (mut plain_secs, mut policy_secs) = (0.0, 0.0);
    for round in 0..args.rounds {
        let base = round * per_round;
        plain_secs += creates(&unchecked, base, per_round, args.concurrency).await?;
        policy_secs += creates(&checked, base, per_round, args.concurrency).await?;
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
