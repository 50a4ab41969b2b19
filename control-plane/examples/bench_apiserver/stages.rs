//! `--stages`: the CPU of each step of a pod create's object pipeline, in
//! this process, on the benchmark's pod, against the least any JSON API
//! does with the same bytes (parse them into a tree and write it back).
//! It says how much of the server's CPU per create the object work is,
//! and so how much a cheaper pipeline could win. This process's allocator
//! is the system's, not the server's mimalloc.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skiff_control_plane::apiserver::{admission, convert, model, objects, resources, validation};

use crate::load::pod_json;

const STAGES: [&str; 6] = [
    "decode into the typed model, then a tree",
    "uid, creationTimestamp, status",
    "defaults and default tolerations",
    "validation",
    "encode for the store",
    "drop the tree",
];

pub fn run(n: usize) -> anyhow::Result<()> {
    let def = resources::lookup("", "v1", "pods").ok_or_else(|| anyhow::anyhow!("no pods"))?;
    let mut pod = pod_json(1);
    pod["metadata"]["namespace"] = json!("default");
    let body = serde_json::to_vec(&pod)?;
    let tolerations = admission::DefaultTolerationSeconds::default();
    let mut spent = [Duration::ZERO; STAGES.len()];
    let mut raw = Duration::ZERO;
    let mut stored = 0;
    for _ in 0..n {
        let mut marks = [Instant::now(); STAGES.len() + 1];
        let mut obj = model::decode_json_body(def, &body)
            .ok_or_else(|| anyhow::anyhow!("the benchmark's pod does not decode"))?;
        marks[1] = Instant::now();
        let meta = obj["metadata"].as_object_mut().expect("a pod has metadata");
        meta.insert("uid".into(), json!(objects::new_uid()));
        meta.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
        obj["status"] = json!({"phase": "Pending", "qosClass": "Burstable"});
        marks[2] = Instant::now();
        def.strategy.default(&mut obj);
        admission::default_tolerations(&mut obj, &tolerations);
        marks[3] = Instant::now();
        let causes = validation::validate(def, &obj);
        anyhow::ensure!(
            causes.is_empty(),
            "the benchmark's pod is invalid: {causes:?}"
        );
        marks[4] = Instant::now();
        stored += convert::encode(def, &obj).len();
        marks[5] = Instant::now();
        drop(obj);
        marks[6] = Instant::now();
        for (s, w) in spent.iter_mut().zip(marks.windows(2)) {
            *s += w[1] - w[0];
        }
        let start = Instant::now();
        let tree: Value = serde_json::from_slice(&body)?;
        std::hint::black_box(serde_json::to_vec(&tree)?);
        drop(tree);
        raw += start.elapsed();
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
    println!(
        "pod create object pipeline, {n} times in this process ({} bytes in, {} stored):",
        body.len(),
        stored / n.max(1)
    );
    for (name, d) in STAGES.iter().zip(spent) {
        println!("  {name:42} {:6.2} us", us(d));
    }
    let total: Duration = spent.iter().sum();
    println!(
        "  {:42} {:6.2} us; parse into a tree and write it back: {:.2} us; ratio {:.1}",
        "all",
        us(total),
        us(raw),
        us(total) / us(raw).max(1e-9)
    );
    Ok(())
}
