//! `kubectl drain` (1.27 to 1.33) against the API alone: it cordons the
//! node, then evicts each pod through `pods/eviction` (found in discovery
//! with its policy/v1 Eviction kind), sending its delete and eviction
//! bodies as protobuf (`k8s\0` ...), and waits for the pods to go.

use crate::api;

use api::{ok, TestServer, KUBECTL_DIR};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_drain_evicts_and_completes() {
    let s = TestServer::start().await;
    let admin = s.admin_kubeconfig();
    for minor in 27..=33 {
        let node = format!("n{minor}");
        let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}});
        ok(s.kubectl_stdin(&["apply", "-f", "-"], &obj.to_string()));
        for i in 0..2 {
            // No agent runs here: a grace period of 0 lets the eviction
            // delete the pod at once.
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{minor}-{i}")},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "busybox"}]}});
            ok(s.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()));
        }
        let kubectl = format!("{KUBECTL_DIR}/kubectl.1.{minor}");
        let drain = ["drain", &node, "--force", "--timeout=60s"];
        let out = ok(s.kubectl_binary(&kubectl, &admin, &drain, None));
        assert!(
            out.contains(&format!("node/{node} drained")),
            "{kubectl}: {out}"
        );
        for i in 0..2 {
            assert!(
                out.contains(&format!("pod/p{minor}-{i} evicted")),
                "{kubectl}: {out}"
            );
        }
        let selector = format!("spec.nodeName={node}");
        let left = ok(s.kubectl(&["get", "pods", "-o", "name", "--field-selector", &selector]));
        assert!(
            left.trim().is_empty(),
            "{kubectl}: pods left after the drain: {left}"
        );
        let jsonpath = "jsonpath={.spec.unschedulable}";
        let cordoned = ok(s.kubectl(&["get", "node", &node, "-o", jsonpath]));
        assert_eq!(cordoned, "true", "{kubectl}");
    }
}
