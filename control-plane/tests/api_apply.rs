//! Server-side apply through the real `kubectl apply --server-side`: each
//! field manager's fields recorded in `metadata.managedFields`, a change
//! to another manager's field refused with upstream's conflict message
//! until `--force-conflicts` takes it over, fields an applier drops
//! removed, list items merged by key, and the same apply twice a no-op.

use crate::api;

use api::{fails, ok, TestServer};
use serde_json::Value;

/// `kubectl apply --server-side` of `yaml` as `manager` (with `extra`
/// flags).
fn apply(s: &TestServer, manager: &str, extra: &[&str], yaml: &str) -> std::process::Output {
    let flag = format!("--field-manager={manager}");
    let mut args = vec!["apply", "--server-side", flag.as_str(), "-f", "-"];
    args.extend(extra);
    s.kubectl_stdin(&args, yaml)
}

/// `kubectl edit what` with `editor` (run through a shell, the file's path
/// appended) as the editor.
fn edit(s: &TestServer, editor: &str, what: &str) -> std::process::Output {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".into());
    std::process::Command::new(kubectl)
        .env("KUBECONFIG", s.admin_kubeconfig())
        .env("HOME", s.dir.path())
        .env("KUBE_EDITOR", editor)
        .args(["edit", what])
        .output()
        .expect("run kubectl edit")
}

/// `what` (`deployment/web`) as JSON, managedFields included.
fn get(s: &TestServer, what: &str) -> Value {
    let out = ok(s.kubectl(&["get", what, "-o", "json", "--show-managed-fields"]));
    serde_json::from_str(&out).unwrap()
}

fn deployment(s: &TestServer) -> Value {
    get(s, "deployment/web")
}

/// The managers of `d` and what each owns, as (manager, operation, fieldsV1).
fn managers(d: &Value) -> Vec<(String, String, Value)> {
    let list = d["metadata"]["managedFields"].as_array().cloned();
    let entry = |e: &Value| {
        (
            e["manager"].as_str().unwrap_or_default().to_string(),
            e["operation"].as_str().unwrap_or_default().to_string(),
            e["fieldsV1"].clone(),
        )
    };
    list.unwrap_or_default().iter().map(entry).collect()
}

const ALICE: &str = "
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: c
        image: nginx:1.25
        env: [{name: A, value: a}]
";

#[tokio::test(flavor = "multi_thread")]
async fn managers_own_their_fields_and_conflict_over_others() {
    let s = TestServer::start().await;
    ok(apply(&s, "alice", &[], ALICE));
    let d = deployment(&s);
    let m = managers(&d);
    let alice = m
        .iter()
        .find(|(n, _, _)| n == "alice")
        .expect("alice's entry");
    assert_eq!(alice.1, "Apply", "{m:?}");
    assert!(alice.2["f:spec"]["f:replicas"].is_object(), "{}", alice.2);
    assert!(
        alice.2["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:image"]
            .is_object(),
        "{}",
        alice.2
    );
    // Hidden unless asked for.
    let plain = ok(s.kubectl(&["get", "deployment", "web", "-o", "yaml"]));
    assert!(!plain.contains("managedFields"), "{plain}");

    // The same apply again changes nothing.
    let rv = d["metadata"]["resourceVersion"].clone();
    ok(apply(&s, "alice", &[], ALICE));
    assert_eq!(deployment(&s)["metadata"]["resourceVersion"], rv);

    // Bob may set what nobody owns, and add to a keyed list item.
    let bob = "
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations: {owner: bob}
spec:
  template:
    spec:
      containers:
      - name: c
        env: [{name: B, value: b}]
";
    ok(apply(&s, "bob", &[], bob));
    let d = deployment(&s);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "nginx:1.25", "{d}");
    let env: Vec<&str> = (c["env"].as_array().unwrap().iter())
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["A", "B"], "{d}");
    assert_eq!(d["metadata"]["annotations"]["owner"], "bob");

    // Alice's replicas are hers: a conflict for carol, then taken by
    // force.
    let carol = "
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 5}
";
    let err = fails(apply(&s, "carol", &[], carol));
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "alice": .spec.replicas"#),
        "{err}"
    );
    assert_eq!(deployment(&s)["spec"]["replicas"], 2);
    ok(apply(&s, "carol", &["--force-conflicts"], carol));
    let d = deployment(&s);
    assert_eq!(d["spec"]["replicas"], 5);
    let m = managers(&d);
    let alice = m.iter().find(|(n, _, _)| n == "alice").unwrap();
    assert!(alice.2["f:spec"].get("f:replicas").is_none(), "{m:?}");

    // Alice drops her `tier` label and her replicas: the label goes, the
    // replicas are carol's now and stay, bob's fields stay.
    let trimmed = ALICE
        .replace("labels: {app: web, tier: front}", "labels: {app: web}")
        .replace("  replicas: 2\n", "");
    ok(apply(&s, "alice", &[], &trimmed));
    let d = deployment(&s);
    assert!(d["metadata"]["labels"].get("tier").is_none(), "{d}");
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["annotations"]["owner"], "bob");
    let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env.as_array().map(Vec::len), Some(2), "{d}");

    // Bob drops his annotation: it goes with him.
    ok(apply(
        &s,
        "bob",
        &[],
        &bob.replace("  annotations: {owner: bob}\n", ""),
    ));
    let d = deployment(&s);
    assert!(
        d["metadata"]
            .get("annotations")
            .is_none_or(|a| a.get("owner").is_none()),
        "{d}"
    );

    // Without a field manager there is no apply.
    let err = fails(s.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=", "-f", "-"],
        ALICE,
    ));
    assert!(err.contains("fieldManager"), "{err}");
}

/// Every other writer is recorded too: client-side apply creates, `kubectl
/// edit` then owns what it changed, so a server-side apply that would undo
/// the edit conflicts with it; kubectl's migration from client-side apply
/// (a JSON patch of managedFields) is taken, after which a label the
/// manifest drops is removed, and the last-applied annotation follows.
#[tokio::test(flavor = "multi_thread")]
async fn updates_are_recorded_and_client_side_apply_migrates() {
    let s = TestServer::start().await;
    let manifest = ALICE.replace("name: web\n", "name: csa\n");
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &manifest));
    let m = managers(&get(&s, "deployment/csa"));
    let csa = m.iter().find(|(n, _, _)| n == "kubectl-client-side-apply");
    let csa = csa.unwrap_or_else(|| panic!("{m:?}"));
    assert_eq!(csa.1, "Update");
    assert!(csa.2["f:spec"]["f:replicas"].is_object(), "{m:?}");

    ok(edit(
        &s,
        "sed -i 's/replicas: 2/replicas: 3/'",
        "deployment/csa",
    ));
    let m = managers(&get(&s, "deployment/csa"));
    let edit = m.iter().find(|(n, _, _)| n == "kubectl-edit");
    let edit = edit.unwrap_or_else(|| panic!("{m:?}"));
    assert_eq!(edit.1, "Update");
    assert!(edit.2["f:spec"]["f:replicas"].is_object(), "{m:?}");
    let csa = m.iter().find(|(n, _, _)| n == "kubectl-client-side-apply");
    assert!(
        csa.is_some_and(|c| c.2["f:spec"].get("f:replicas").is_none()),
        "{m:?}"
    );

    let err = fails(s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &manifest));
    assert!(
        err.contains(r#"conflict with "kubectl-edit" using apps/v1: .spec.replicas"#),
        "{err}"
    );

    // Without replicas and the `tier` label: kubectl moved the client-side
    // applier's fields to its own apply, so the label is its to drop.
    let trimmed = manifest
        .replace("labels: {app: web, tier: front}", "labels: {app: web}")
        .replace("  replicas: 2\n", "");
    ok(s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &trimmed));
    let d = get(&s, "deployment/csa");
    assert!(d["metadata"]["labels"].get("tier").is_none(), "{d}");
    assert_eq!(d["spec"]["replicas"], 3);
    let m = managers(&d);
    assert!(
        m.iter().any(|(n, op, _)| n == "kubectl" && op == "Apply"),
        "{m:?}"
    );
    let last = &d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"];
    let last: Value = serde_json::from_str(last.as_str().unwrap_or("null")).unwrap();
    assert_eq!(
        last["metadata"]["labels"],
        serde_json::json!({"app": "web"}),
        "{last}"
    );

    // A create records its writer, and managedFields set to [] clear them.
    ok(s.kubectl(&["create", "configmap", "made", "--from-literal=a=b"]));
    let cm = get(&s, "configmap/made");
    let m = managers(&cm);
    assert!(
        m.iter().any(|(n, op, f)| n == "kubectl-create"
            && op == "Update"
            && f["f:data"]["f:a"].is_object()),
        "{m:?}"
    );
    ok(s.kubectl(&[
        "patch",
        "configmap",
        "made",
        "--type=merge",
        "-p",
        r#"{"metadata":{"managedFields":[{}]}}"#,
    ]));
    let cm = get(&s, "configmap/made");
    assert!(cm["metadata"].get("managedFields").is_none(), "{cm}");

    // kube-rs's Patch::Apply on a built-in kind: an operator's apply owns
    // what it sends and prunes what it stops sending.
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let params = PatchParams::apply("operator");
    let config = |data: Value| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "operated"}, "data": data})
    };
    let both = config(serde_json::json!({"a": "1", "b": "2"}));
    api.patch("operated", &params, &Patch::Apply(both))
        .await
        .expect("apply creates");
    let one = config(serde_json::json!({"a": "1"}));
    let cm = (api.patch("operated", &params, &Patch::Apply(one)))
        .await
        .expect("apply prunes");
    let keys: Vec<String> = cm.data.unwrap_or_default().into_keys().collect();
    assert_eq!(keys, ["a"]);
}

/// An apply through a subresource that builds its own update keeps the
/// applier's ownership, under the subresource; the scale subresource
/// refuses one rather than apply it unowned.
#[tokio::test(flavor = "multi_thread")]
async fn subresource_applies_are_owned_or_refused() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let s = TestServer::start().await;
    let pods: Api<Pod> = Api::namespaced(s.client().await, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "debugged"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let debugger = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "debugged"},
        "spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox", "stdin": true}]}});
    let applied = pods
        .patch_subresource(
            "ephemeralcontainers",
            "debugged",
            &PatchParams::apply("debugger"),
            &Patch::Apply(&debugger),
        )
        .await
        .expect("apply to ephemeralcontainers");
    let spec = applied.spec.unwrap();
    assert_eq!(spec.ephemeral_containers.unwrap()[0].name, "debug");
    let entry = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("debugger"))
        .expect("the applier's entry");
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    assert_eq!(entry.subresource.as_deref(), Some("ephemeralcontainers"));
    let owned = serde_json::to_string(&entry.fields_v1.unwrap().0).unwrap();
    assert!(owned.contains(r#"k:{\"name\":\"debug\"}"#), "{owned}");

    ok(apply(
        &s,
        "alice",
        &[],
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n",
    ));
    let (code, _, body) = api::raw(
        &s.client().await,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/web/scale?fieldManager=hpa",
        "application/apply-patch+yaml",
        b"apiVersion: autoscaling/v1\nkind: Scale\nmetadata: {name: web}\nspec: {replicas: 3}\n"
            .to_vec(),
    )
    .await;
    assert_eq!(code, 415, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("server-side apply is not supported on the scale subresource"),
        "{body}"
    );
    assert_eq!(deployment(&s)["spec"]["replicas"], 1);
}
