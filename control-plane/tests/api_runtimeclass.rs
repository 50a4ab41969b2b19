//! RuntimeClasses through the real `kubectl`: served in discovery, printed
//! as upstream (NAME HANDLER AGE), validated (handler a DNS label and
//! immutable), readable by nodes, and applied to pods by the RuntimeClass
//! admission plugin (overhead, node selector, tolerations; upstream's
//! messages for a missing class).

use crate::api;

use api::{fails, header, ok, TestServer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, PostParams};
use serde_json::json;

const GVISOR: &str = "\
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
overhead:
  podFixed:
    cpu: 250m
    memory: 64Mi
scheduling:
  nodeSelector:
    skiff.io/sandbox: gvisor
  tolerations:
  - key: sandbox
    operator: Exists
    effect: NoSchedule
";

fn pod(name: &str, class: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  runtimeClassName: {class}\n  nodeSelector:\n    disk: ssd\n  containers:\n  - name: c\n    image: busybox\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_classes_are_served_and_applied_to_pods() {
    let s = TestServer::start().await;

    let resources = ok(s.kubectl(&["api-resources", "--api-group=node.k8s.io"]));
    let row = resources
        .lines()
        .find(|l| l.starts_with("runtimeclasses"))
        .unwrap_or_else(|| panic!("{resources}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[1..],
        ["node.k8s.io/v1", "false", "RuntimeClass"],
        "{row}"
    );

    ok(s.kubectl_stdin(&["apply", "-f", "-"], GVISOR));
    let get = ok(s.kubectl(&["get", "runtimeclass"]));
    assert_eq!(header(&get), ["NAME", "HANDLER", "AGE"], "{get}");
    let cells: Vec<&str> = get
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(cells[..2], ["gvisor", "runsc"], "{get}");

    // A pod naming the class gets its overhead and scheduling.
    ok(s.kubectl_stdin(&["create", "-f", "-"], &pod("sandboxed", "gvisor")));
    let out = ok(s.kubectl(&["get", "pod", "sandboxed", "-o", "json"]));
    let p: Pod = serde_json::from_str(&out).unwrap();
    let spec = serde_json::to_value(p.spec.unwrap()).unwrap();
    assert_eq!(spec["overhead"], json!({"cpu": "250m", "memory": "64Mi"}));
    assert_eq!(
        spec["nodeSelector"],
        json!({"disk": "ssd", "skiff.io/sandbox": "gvisor"})
    );
    let tolerations = spec["tolerations"].as_array().unwrap();
    assert!(
        tolerations
            .contains(&json!({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"})),
        "{tolerations:?}"
    );

    // Upstream's refusals.
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &pod("lost", "missing")));
    assert!(
        err.contains(r#"pods "lost" is forbidden: pod rejected: RuntimeClass "missing" not found"#),
        "{err}"
    );
    let bad = GVISOR
        .replace("name: gvisor", "name: bad")
        .replace("handler: runsc", "handler: Bad_Name");
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &bad));
    assert!(
        err.contains(r#"handler: Invalid value: "Bad_Name": a lowercase RFC 1123 label"#),
        "{err}"
    );
    let err = fails(s.kubectl(&[
        "patch",
        "runtimeclass",
        "gvisor",
        "--type=merge",
        "-p",
        r#"{"handler":"kata"}"#,
    ]));
    assert!(
        err.contains(r#"handler: Invalid value: "kata": field is immutable"#),
        "{err}"
    );

    // Nodes read classes (the agent looks up a pod's handler).
    let node: Api<RuntimeClass> = Api::all(s.client_for("system:node:n1", &["system:nodes"]).await);
    assert_eq!(node.get("gvisor").await.unwrap().handler, "runsc");
    assert_eq!(node.list(&Default::default()).await.unwrap().items.len(), 1);
    let pp = PostParams::default();
    let other: RuntimeClass =
        serde_json::from_value(json!({"metadata": {"name": "kata"}, "handler": "kata"})).unwrap();
    assert!(
        node.create(&pp, &other).await.is_err(),
        "nodes only read classes"
    );
}
