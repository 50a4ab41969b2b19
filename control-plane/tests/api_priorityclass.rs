//! PriorityClasses through the API: validation, the built-in system
//! classes, one global default, and the Priority admission resolving a
//! pod's class into its `priority` and `preemptionPolicy` (upstream's
//! messages), with what the real `kubectl` prints for `get pc`.

use crate::api;

use api::{header, ok, TestServer};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};

fn class(name: &str, value: i64, extra: Value) -> PriorityClass {
    let mut v = json!({"metadata": {"name": name}, "value": value});
    if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    serde_json::from_value(v).unwrap()
}

fn pod(name: &str, spec: Value) -> Pod {
    let mut s = json!({"containers": [{"name": "c", "image": "busybox"}]});
    if let (Some(m), Some(e)) = (s.as_object_mut(), spec.as_object()) {
        m.extend(e.clone());
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": s})).unwrap()
}

fn api_message(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn system_classes_are_built_in_and_kept() {
    let s = TestServer::start().await;
    let classes: Api<PriorityClass> = Api::all(s.client().await);
    let node = classes.get("system-node-critical").await.unwrap();
    assert_eq!(node.value, Some(2_000_001_000));
    assert_eq!(
        classes.get("system-cluster-critical").await.unwrap().value,
        Some(2_000_000_000)
    );

    let err = classes
        .delete("system-node-critical", &DeleteParams::default())
        .await
        .unwrap_err();
    let (code, message) = api_message(err);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("this is a system priority class and cannot be deleted"),
        "{message}"
    );
    let mut changed = node.clone();
    changed.value = Some(5);
    let (code, _) = api_message(
        classes
            .replace("system-node-critical", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);

    let get = ok(s.kubectl(&["get", "pc"]));
    assert_eq!(
        header(&get),
        ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    );
    let row = get
        .lines()
        .find(|l| l.starts_with("system-node-critical"))
        .unwrap_or_default();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..3], ["2000001000", "false"], "{get}");
    assert_eq!(cells.last(), Some(&"PreemptLowerPriority"), "{get}");
}

#[tokio::test(flavor = "multi_thread")]
async fn validation_and_one_global_default() {
    let s = TestServer::start().await;
    let classes: Api<PriorityClass> = Api::all(s.client().await);
    let pp = PostParams::default();
    for (pc, want) in [
        (
            class("too-high", 1_000_000_001, json!({})),
            "maximum allowed value of a user defined priority is 1000000000",
        ),
        (
            class("system-mine", 10, json!({})),
            "priority class names with 'system-' prefix are reserved for system use only",
        ),
        (
            class("odd", 10, json!({"preemptionPolicy": "Sometimes"})),
            "preemptionPolicy",
        ),
    ] {
        let (code, message) = api_message(classes.create(&pp, &pc).await.unwrap_err());
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(want), "{message}");
    }
    let created = classes
        .create(&pp, &class("high", 1000, json!({})))
        .await
        .unwrap();
    assert_eq!(
        created.preemption_policy.as_deref(),
        Some("PreemptLowerPriority")
    );
    let mut changed = created.clone();
    changed.value = Some(2000);
    let (code, message) = api_message(classes.replace("high", &pp, &changed).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(
        message.contains("value: Forbidden: may not be changed in an update."),
        "{message}"
    );

    // kubectl's client-side schema check knows the kind.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: applied\nvalue: 7\npreemptionPolicy: Never\ndescription: from kubectl\n",
    ));
    let applied = classes.get("applied").await.unwrap();
    assert_eq!(applied.value, Some(7));
    assert_eq!(applied.preemption_policy.as_deref(), Some("Never"));

    classes
        .create(&pp, &class("first", 10, json!({"globalDefault": true})))
        .await
        .unwrap();
    let (code, message) = api_message(
        classes
            .create(&pp, &class("second", 20, json!({"globalDefault": true})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains(
            "PriorityClass first is already marked as default. Only one default can exist"
        ),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_get_their_class_priority() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    classes
        .create(&pp, &class("high", 1000, json!({})))
        .await
        .unwrap();
    classes
        .create(
            &pp,
            &class("polite", 500, json!({"preemptionPolicy": "Never"})),
        )
        .await
        .unwrap();

    // No class and no default class: priority 0.
    let p = pods.create(&pp, &pod("plain", json!({}))).await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.priority, Some(0));
    assert_eq!(
        spec.preemption_policy.as_deref(),
        Some("PreemptLowerPriority")
    );

    let p = pods
        .create(&pp, &pod("hi", json!({"priorityClassName": "high"})))
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().priority, Some(1000));
    let p = pods
        .create(&pp, &pod("never", json!({"priorityClassName": "polite"})))
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.priority, Some(500));
    assert_eq!(spec.preemption_policy.as_deref(), Some("Never"));
    // The same value as the class's is allowed.
    pods.create(
        &pp,
        &pod(
            "same",
            json!({"priorityClassName": "high", "priority": 1000}),
        ),
    )
    .await
    .unwrap();

    for (name, spec, want) in [
        (
            "unknown",
            json!({"priorityClassName": "nope"}),
            "no PriorityClass with name nope was found",
        ),
        (
            "mismatch",
            json!({"priorityClassName": "high", "priority": 7}),
            "the integer value of priority (7) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name",
        ),
    ] {
        let (code, message) = api_message(pods.create(&pp, &pod(name, spec)).await.unwrap_err());
        assert_eq!(code, 403, "{message}");
        assert!(message.contains(want), "{message}");
    }
    // The system classes serve every namespace (upstream since 1.17).
    let p = pods
        .create(
            &pp,
            &pod(
                "critical",
                json!({"priorityClassName": "system-node-critical"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().priority, Some(2_000_001_000));

    // A global default class names pods that name none.
    classes
        .create(&pp, &class("fallback", 42, json!({"globalDefault": true})))
        .await
        .unwrap();
    let p = pods
        .create(&pp, &pod("defaulted", json!({})))
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.priority, Some(42));
    assert_eq!(spec.priority_class_name.as_deref(), Some("fallback"));

    // Templates keep the name alone: their pods are resolved on create.
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"priorityClassName": "high", "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap();
    let d = deployments.create(&pp, &d).await.unwrap();
    let template = d.spec.template.spec.unwrap();
    assert_eq!(template.priority, None);
    assert_eq!(template.priority_class_name.as_deref(), Some("high"));
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_updates_keep_the_resolved_priority() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    classes
        .create(&pp, &class("high", 1000, json!({})))
        .await
        .unwrap();
    let p = pods
        .create(&pp, &pod("p", json!({"priorityClassName": "high"})))
        .await
        .unwrap();
    // A replace that leaves the resolved fields out keeps them.
    let mut v = serde_json::to_value(&p).unwrap();
    v["spec"].as_object_mut().unwrap().remove("priority");
    v["spec"]
        .as_object_mut()
        .unwrap()
        .remove("preemptionPolicy");
    v["metadata"]["labels"] = json!({"x": "y"});
    let replaced = pods
        .replace("p", &pp, &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
    assert_eq!(replaced.spec.as_ref().unwrap().priority, Some(1000));
    // Changing it is refused.
    let mut v = serde_json::to_value(&replaced).unwrap();
    v["spec"]["priority"] = json!(5);
    let (code, message) = api_message(
        pods.replace("p", &pp, &serde_json::from_value(v).unwrap())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("pod updates may not change fields"),
        "{message}"
    );
}

/// A pod naming a RuntimeClass that does not exist is refused (upstream's
/// RuntimeClass admission), rather than accepted and run without it; so
/// is an overhead no class set. `api_runtimeclass` covers classes that exist.
#[tokio::test(flavor = "multi_thread")]
async fn pods_naming_a_runtime_class_are_refused() {
    let s = TestServer::start().await;
    let pods: Api<Pod> = Api::namespaced(s.client().await, "default");
    let err = pods
        .create(
            &PostParams::default(),
            &pod("gvisor", json!({"runtimeClassName": "gvisor"})),
        )
        .await
        .unwrap_err();
    let (code, message) = api_message(err);
    assert_eq!(code, 403, "{message}");
    assert_eq!(
        message,
        "pods \"gvisor\" is forbidden: pod rejected: RuntimeClass \"gvisor\" not found"
    );
    let err = pods
        .create(
            &PostParams::default(),
            &pod("heavy", json!({"overhead": {"cpu": "100m"}})),
        )
        .await
        .unwrap_err();
    let (code, message) = api_message(err);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.ends_with("Pod Overhead set without corresponding RuntimeClass defined Overhead"),
        "{message}"
    );
}
