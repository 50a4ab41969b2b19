//! `pods/ephemeralcontainers` through the real `kubectl debug` and raw
//! requests: a debugger is added with every write verb, existing ones may
//! not change or go, ephemeral-only rules are enforced, an update of the
//! pod itself keeps the stored ones, and a create may not carry them.

use crate::api;

use api::{fails, ok, raw, TestServer};
use serde_json::{json, Value};

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default}\nspec:\n  containers:\n  - name: app\n    image: busybox\n";
const PATH: &str = "/api/v1/namespaces/default/pods/web/ephemeralcontainers";

fn ephemeral(pod: &Value) -> Vec<String> {
    pod["spec"]["ephemeralContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn ephemeral_containers_subresource() {
    let server = TestServer::start().await;
    let client = server.client().await;
    ok(server.kubectl_stdin(&["apply", "-f", "-"], POD));

    // kubectl debug sends a strategic merge patch to the subresource.
    ok(server.kubectl(&[
        "debug",
        "web",
        "--image=busybox",
        "-c",
        "debugger",
        "--target=app",
        "--",
        "sleep",
        "1",
    ]));
    let (code, _, pod) = raw(&client, "GET", PATH, "application/json", Vec::new()).await;
    assert_eq!(code, 200, "{pod}");
    assert_eq!(ephemeral(&pod), vec!["debugger"]);
    let d = &pod["spec"]["ephemeralContainers"][0];
    assert_eq!(d["targetContainerName"], "app");
    assert_eq!(d["terminationMessagePolicy"], "File");

    // A JSON merge patch and a PUT of the whole pod add more.
    let mut eph = pod["spec"]["ephemeralContainers"].clone();
    eph.as_array_mut()
        .unwrap()
        .push(json!({"name": "d2", "image": "busybox"}));
    let body = serde_json::to_vec(&json!({"spec": {"ephemeralContainers": eph}})).unwrap();
    let (code, _, out) = raw(&client, "PATCH", PATH, "application/merge-patch+json", body).await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(ephemeral(&out), vec!["debugger", "d2"]);
    let mut whole = out.clone();
    whole["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "d3", "image": "busybox"}));
    // Other fields sent through the subresource are not written.
    whole["metadata"]["labels"] = json!({"sneaky": "yes"});
    let (code, _, out) = raw(
        &client,
        "PUT",
        PATH,
        "application/json",
        serde_json::to_vec(&whole).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(ephemeral(&out), vec!["debugger", "d2", "d3"]);
    assert!(out["metadata"]["labels"]["sneaky"].is_null(), "{out}");

    // Existing ones may not change or go.
    let mut changed = out.clone();
    changed["spec"]["ephemeralContainers"][0]["image"] = json!("alpine");
    changed["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .pop();
    let (code, _, err) = raw(
        &client,
        "PUT",
        PATH,
        "application/json",
        serde_json::to_vec(&changed).unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{err}");
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(r#"Forbidden: existing ephemeral containers "debugger" may not be changed"#),
        "{msg}"
    );
    assert!(
        msg.contains(r#"Forbidden: existing ephemeral containers "d3" may not be removed"#),
        "{msg}"
    );

    // Container-only fields, clashing names and unknown targets (the
    // strategic merge patch appends to the three there are).
    let body = json!({"spec": {"ephemeralContainers": [
        {"name": "app", "image": "busybox"},
        {"name": "p", "image": "busybox", "ports": [{"containerPort": 80}]},
        {"name": "t", "image": "busybox", "targetContainerName": "nope"}]}});
    let (code, _, err) = raw(
        &client,
        "PATCH",
        PATH,
        "application/strategic-merge-patch+json",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{err}");
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(r#"spec.ephemeralContainers[3].name: Duplicate value: "app""#),
        "{msg}"
    );
    assert!(
        msg.contains("ports: Forbidden: cannot be set for an Ephemeral Container"),
        "{msg}"
    );
    assert!(
        msg.contains(r#"targetContainerName: Not found: "nope""#),
        "{msg}"
    );

    // An update of the pod itself keeps the stored ephemeral containers.
    let mut pod = out.clone();
    pod["spec"]["ephemeralContainers"] = json!([]);
    pod["metadata"]["labels"] = json!({"kept": "yes"});
    let (code, _, upd) = raw(
        &client,
        "PUT",
        "/api/v1/namespaces/default/pods/web",
        "application/json",
        serde_json::to_vec(&pod).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{upd}");
    assert_eq!(upd["metadata"]["labels"]["kept"], "yes");
    assert_eq!(ephemeral(&upd), vec!["debugger", "d2", "d3"]);

    // A new pod may not carry them.
    let with = format!(
        "{}  ephemeralContainers:\n  - name: d\n    image: busybox\n",
        POD.replace("name: web", "name: other")
    );
    let err = fails(server.kubectl_stdin(&["create", "-f", "-"], &with));
    assert!(
        err.contains("spec.ephemeralContainers: Forbidden: cannot be set on create"),
        "{err}"
    );
}
