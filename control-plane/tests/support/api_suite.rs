//! The API test suite body, run against SQLite (api_*.rs) and etcd
//! (api_etcd.rs) servers alike.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use super::api::{eventually, fails, ok, raw, TestServer};

/// One manifest per served kind, with a field to change on update.
pub const MANIFESTS: &[(&str, &str)] = &[
    ("configmaps", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm1}\ndata: {k: v}\n"),
    ("secrets", "apiVersion: v1\nkind: Secret\nmetadata: {name: s1}\nstringData: {k: v}\n"),
    ("serviceaccounts", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa1}\n"),
    ("services", "apiVersion: v1\nkind: Service\nmetadata: {name: svc1}\nspec:\n  selector: {app: a}\n  ports: [{port: 80}]\n"),
    ("endpoints", "apiVersion: v1\nkind: Endpoints\nmetadata: {name: ep1}\nsubsets: [{addresses: [{ip: 198.18.0.5}], ports: [{port: 80}]}]\n"),
    ("pods", "apiVersion: v1\nkind: Pod\nmetadata: {name: pod1}\nspec:\n  containers: [{name: c, image: busybox:1}]\n"),
    ("events", "apiVersion: v1\nkind: Event\nmetadata: {name: ev1}\ninvolvedObject: {kind: Pod, name: pod1, namespace: default}\nreason: Tested\nmessage: hello\ntype: Normal\n"),
    ("nodes", "apiVersion: v1\nkind: Node\nmetadata: {name: node1}\n"),
    ("namespaces", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns1}\n"),
    ("deployments.apps", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d1}\nspec:\n  selector: {matchLabels: {app: d1}}\n  template:\n    metadata: {labels: {app: d1}}\n    spec: {containers: [{name: c, image: busybox:1}]}\n"),
    ("replicasets.apps", "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: rs1}\nspec:\n  selector: {matchLabels: {app: rs1}}\n  template:\n    metadata: {labels: {app: rs1}}\n    spec: {containers: [{name: c, image: busybox:1}]}\n"),
    ("daemonsets.apps", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: ds1}\nspec:\n  selector: {matchLabels: {app: ds1}}\n  template:\n    metadata: {labels: {app: ds1}}\n    spec: {containers: [{name: c, image: busybox:1}]}\n"),
    ("jobs.batch", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j1}\nspec:\n  template:\n    spec: {restartPolicy: Never, containers: [{name: c, image: busybox:1}]}\n"),
    ("leases.coordination.k8s.io", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: l1}\nspec: {holderIdentity: me}\n"),
    ("endpointslices.discovery.k8s.io", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: es1}\naddressType: IPv4\nendpoints: [{addresses: [198.18.0.5]}]\n"),
    ("events.events.k8s.io", "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {name: eev1}\neventTime: 2026-01-01T00:00:00.000000Z\nreportingController: test\nreportingInstance: t1\naction: Test\nreason: Tested\nregarding: {kind: Pod, name: pod1}\ntype: Normal\n"),
    ("roles.rbac.authorization.k8s.io", "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r1}\nrules: [{apiGroups: [''], resources: [pods], verbs: [get]}]\n"),
    ("rolebindings.rbac.authorization.k8s.io", "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: rb1}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r1}\nsubjects: [{kind: User, name: u1}]\n"),
    ("clusterroles.rbac.authorization.k8s.io", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: cr1}\nrules: [{apiGroups: [''], resources: [nodes], verbs: [get]}]\n"),
    ("clusterrolebindings.rbac.authorization.k8s.io", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: crb1}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cr1}\nsubjects: [{kind: User, name: u1}]\n"),
];

/// create, get, list, label (patch), replace (update), delete of every kind
/// with kubectl.
pub async fn kubectl_crud_every_kind(s: &TestServer) {
    for (res, manifest) in MANIFESTS {
        let name = manifest
            .split("name: ")
            .nth(1)
            .and_then(|r| r.split('}').next())
            .unwrap()
            .trim();
        ok(s.kubectl_stdin(&["create", "-f", "-"], manifest));
        let got: Value =
            serde_json::from_str(&ok(s.kubectl(&["get", res, name, "-o", "json"]))).unwrap();
        assert_eq!(got["metadata"]["name"], *name, "{res}");
        assert!(
            got["metadata"]["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty()),
            "{res} has a uid"
        );
        assert!(got["metadata"]["creationTimestamp"].is_string(), "{res}");
        let rv1: i64 = got["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let list = ok(s.kubectl(&["get", res, "-o", "name"]));
        assert!(
            list.lines().any(|l| l.ends_with(&format!("/{name}"))),
            "{res} list: {list}"
        );
        ok(s.kubectl(&["label", res, name, "tested=yes"]));
        let labelled = ok(s.kubectl(&["get", res, "-l", "tested=yes", "-o", "name"]));
        assert!(labelled.contains(name), "{res} label selector: {labelled}");
        let mut obj: Value =
            serde_json::from_str(&ok(s.kubectl(&["get", res, name, "-o", "json"]))).unwrap();
        obj["metadata"]["annotations"] = json!({"replaced": "true"});
        ok(s.kubectl_stdin(&["replace", "-f", "-"], &obj.to_string()));
        let after: Value =
            serde_json::from_str(&ok(s.kubectl(&["get", res, name, "-o", "json"]))).unwrap();
        assert_eq!(
            after["metadata"]["annotations"]["replaced"], "true",
            "{res}"
        );
        let rv2: i64 = after["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv2 > rv1, "{res}: resourceVersion moves forward");
        assert_eq!(
            after["metadata"]["uid"], got["metadata"]["uid"],
            "{res}: uid is kept"
        );
        if *res != "namespaces" {
            ok(s.kubectl(&["delete", res, name, "--wait=false"]));
            // Bound pods would wait for their node; this one is not bound.
            let gone = fails(s.kubectl(&["get", res, name]));
            assert!(gone.contains("NotFound"), "{res}: {gone}");
        }
    }
}

/// Typed round trips through kube-rs (create, get, list, patch, replace,
/// delete) and the defaults the server fills.
pub async fn kube_rs_round_trips(s: &TestServer) {
    let client = s.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "gen-", "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(
        name.starts_with("gen-") && name.len() == 9,
        "generateName: {name}"
    );
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("Always")
    );
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let listed = pods
        .list(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let patched = pods
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "c"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["b"], "c");
    // Strategic merge keeps the other container fields.
    let patched = pods
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("busybox:2")
    );
    assert_eq!(
        patched.spec.as_ref().unwrap().containers[0]
            .termination_message_path
            .as_deref(),
        Some("/dev/termination-log")
    );
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    assert!(
        pods.get_opt(&name).await.unwrap().is_none(),
        "unbound pod deletes at once"
    );

    let deps: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "typed"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}
    }))
    .unwrap();
    let d = deps.create(&PostParams::default(), &d).await.unwrap();
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));
    assert_eq!(spec.progress_deadline_seconds, Some(600));
    assert_eq!(
        spec.strategy.as_ref().unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    assert_eq!(d.metadata.generation, Some(1));
    // A spec change bumps generation; a status write does not.
    let d2 = deps
        .patch(
            "typed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(d2.metadata.generation, Some(2));
    let d3 = deps
        .patch_status(
            "typed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 3, "observedGeneration": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(d3.metadata.generation, Some(2));
    assert_eq!(d3.status.as_ref().unwrap().replicas, Some(3));
    // The main resource ignores status; the status subresource ignores spec.
    let d4 = deps
        .patch(
            "typed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(d4.status.as_ref().unwrap().replicas, Some(3));
    let scale = deps.get_scale("typed").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(3));
}

/// `kubectl apply` twice: image change and a removed env var (strategic
/// merge with the last-applied annotation).
pub async fn apply_twice(s: &TestServer) {
    let v1 = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: app\n        image: busybox:1.36\n        env:\n        - {name: KEEP, value: '1'}\n        - {name: DROP, value: '2'}\n";
    let out = ok(s.kubectl_stdin(&["apply", "-f", "-"], v1));
    assert!(out.contains("deployment.apps/web created"), "{out}");
    // Something else (a controller) adds a field kubectl never applied.
    ok(s.kubectl(&["annotate", "deploy", "web", "other=kept"]));
    let v2 = v1
        .replace("busybox:1.36", "busybox:1.37")
        .replace("        - {name: DROP, value: '2'}\n", "");
    let out = ok(s.kubectl_stdin(&["apply", "-f", "-"], &v2));
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let d: Value =
        serde_json::from_str(&ok(s.kubectl(&["get", "deploy", "web", "-o", "json"]))).unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "busybox:1.37");
    assert_eq!(c["env"], json!([{"name": "KEEP", "value": "1"}]));
    assert_eq!(d["metadata"]["annotations"]["other"], "kept");
    assert_eq!(d["metadata"]["generation"], 2);
    let out = ok(s.kubectl_stdin(&["apply", "-f", "-"], &v2));
    assert!(out.contains("unchanged"), "{out}");
    // Server-side apply works for the common case too.
    let out = ok(s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa}\ndata: {a: '1'}\n",
    ));
    assert!(out.contains("serverside-applied"), "{out}");
}

/// Optimistic concurrency: a write with a stale resourceVersion gets 409.
pub async fn conflicts(s: &TestServer) {
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cc"}, "data": {"a": "1"}})).unwrap();
    let v1 = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("a".to_string(), "2".to_string())].into());
    cms.replace("cc", &PostParams::default(), &v2)
        .await
        .unwrap();
    let mut stale = v1.clone();
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    match cms.replace("cc", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 409);
            assert!(
                st.message.contains("the object has been modified"),
                "{}",
                st.message
            );
        }
        other => panic!("stale update: expected 409, got {other:?}"),
    }
    match cms.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"))
        }
        other => panic!("duplicate create: expected 409, got {other:?}"),
    }
}

/// limit/continue returns every object once, at one revision.
pub async fn pagination(s: &TestServer) {
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("page-{i:02}"), "labels": {"page": "y"}}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut names = BTreeSet::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut rv = None;
    loop {
        let mut lp = ListParams::default().labels("page=y").limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 10);
        if rv.is_none() {
            rv = page.metadata.resource_version.clone();
        }
        for i in page.items {
            assert!(
                names.insert(i.metadata.name.unwrap()),
                "an object came twice"
            );
        }
        token = page.metadata.continue_.filter(|c| !c.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(names.len(), 25);
    assert_eq!(pages, 3);
    let out = ok(s.kubectl(&["get", "cm", "-l", "page=y", "--chunk-size=7", "-o", "name"]));
    assert_eq!(out.lines().count(), 25);
    let (code, _, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=2&continue=bogus",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 400, "{body}");
}

/// Server-side printing: kubectl's headers and columns.
pub async fn tables(s: &TestServer) {
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata: {name: tp}\nspec:\n  containers: [{name: c, image: busybox:1}]\n"));
    let out = ok(s.kubectl(&["get", "pods"]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("tp ") && l.contains("0/1") && l.contains("Pending")),
        "{out}"
    );
    let wide = ok(s.kubectl(&["get", "pods", "-o", "wide"]));
    let h = wide.lines().next().unwrap();
    for col in ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"] {
        assert!(h.contains(col), "wide header {h}");
    }
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: td}\nspec:\n  selector: {matchLabels: {app: td}}\n  template:\n    metadata: {labels: {app: td}}\n    spec: {containers: [{name: c, image: busybox:1}]}\n"));
    let out = ok(s.kubectl(&["get", "deploy"]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    let out = ok(s.kubectl(&["get", "ns"]));
    assert!(
        out.starts_with("NAME") && out.contains("STATUS") && out.contains("kube-system"),
        "{out}"
    );
    let out = ok(s.kubectl(&["get", "svc"]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    let all = ok(s.kubectl(&["get", "all"]));
    assert!(
        all.contains("pod/tp") && all.contains("deployment.apps/td"),
        "{all}"
    );
    ok(s.kubectl(&[
        "get",
        "po,cm,secrets,ep,ev,sa,nodes,rs,ds,jobs,leases,endpointslices,roles,clusterroles",
    ]));
}

/// Binding, graceful deletion, finalizers and namespace termination.
pub async fn pod_lifecycle(s: &TestServer) {
    let client = s.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "life"}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods/life/binding",
        "application/json",
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "life"}, "target": {"kind": "Node", "name": "n1"}})).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let bound = pods.get("life").await.unwrap();
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("n1")
    );
    let conds = bound.status.as_ref().unwrap().conditions.clone().unwrap();
    assert!(conds
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True"));
    // A second binding is refused.
    let (code, _, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods/life/binding",
        "application/json",
        serde_json::to_vec(
            &json!({"metadata": {"name": "life"}, "target": {"kind": "Node", "name": "n2"}}),
        )
        .unwrap(),
    )
    .await;
    assert_eq!(code, 409);
    // Bound: graceful delete keeps it with deletionTimestamp...
    pods.delete("life", &DeleteParams::default()).await.unwrap();
    let terminating = pods.get("life").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    let out = ok(s.kubectl(&["get", "pod", "life"]));
    assert!(out.contains("Terminating"), "{out}");
    // ...until the node finishes it with grace 0 and a uid precondition.
    let uid = terminating.metadata.uid.clone().unwrap();
    pods.delete(
        "life",
        &DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(pods.get_opt("life").await.unwrap().is_none());

    // Finalizers hold a deletion until the last one is removed.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "fin", "finalizers": ["example.com/hold"]}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("fin", &DeleteParams::default()).await.unwrap();
    let held = cms.get("fin").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        cms.get_opt("fin").await.unwrap().is_none(),
        "last finalizer removed: gone"
    );

    // Namespace termination: Terminating, no new content, finalize ends it.
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    nss.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let ns = nss.get("doomed").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let in_doomed: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    match in_doomed
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
        )
        .await
    {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 403, "{}", st.message),
        other => panic!("create in terminating namespace: {other:?}"),
    }
    let (code, _, body) = raw(&client, "PUT", "/api/v1/namespaces/doomed/finalize", "application/json",
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}, "spec": {"finalizers": []}})).unwrap()).await;
    assert_eq!(code, 200, "{body}");
    assert!(nss.get_opt("doomed").await.unwrap().is_none());
    let in_missing: Api<ConfigMap> = Api::namespaced(client.clone(), "missing-ns");
    match in_missing
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
        )
        .await
    {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 404),
        other => panic!("create in missing namespace: {other:?}"),
    }
    // Scale subresource through kubectl.
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: sc}\nspec:\n  selector: {matchLabels: {app: sc}}\n  template:\n    metadata: {labels: {app: sc}}\n    spec: {containers: [{name: c, image: busybox:1}]}\n"));
    ok(s.kubectl(&["scale", "rs", "sc", "--replicas=4"]));
    assert_eq!(
        ok(s.kubectl(&["get", "rs", "sc", "-o", "jsonpath={.spec.replicas}"])),
        "4"
    );
    // Streaming routes go to the pod's node, and say so when it is unknown.
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "logs"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i:1"}]}})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let err = fails(s.kubectl(&["logs", "logs"]));
    assert!(err.contains("nodes \"n1\" not found"), "{err}");
}

/// Events list and filter like upstream (`--field-selector involvedObject.name=`).
pub async fn events(s: &TestServer) {
    for (name, obj) in [("e1", "a"), ("e2", "b")] {
        ok(s.kubectl_stdin(&["create", "-f", "-"], &format!("apiVersion: v1\nkind: Event\nmetadata: {{name: {name}}}\ninvolvedObject: {{kind: Pod, name: {obj}, namespace: default}}\nreason: R\nmessage: m-{name}\ntype: Warning\nlastTimestamp: '2026-01-01T00:00:00Z'\n")));
    }
    let out = ok(s.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=a",
        "--sort-by=.lastTimestamp",
    ]));
    assert!(out.contains("m-e1") && !out.contains("m-e2"), "{out}");
    assert!(out.starts_with("LAST SEEN"), "{out}");
    assert!(out.contains("pod/a"), "{out}");
    // events.k8s.io Events (what kube-rs's recorder writes) are the same
    // objects as core Events.
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {name: rec1}\neventTime: 2026-01-01T00:00:00.000000Z\nreportingController: skiff/test\nreportingInstance: t1\naction: Sync\nreason: Recorded\nnote: from-recorder\nregarding: {kind: Pod, name: c, namespace: default}\ntype: Normal\n"));
    let out = ok(s.kubectl(&["get", "events", "--field-selector", "involvedObject.name=c"]));
    assert!(
        out.contains("from-recorder") && out.contains("Recorded"),
        "{out}"
    );
    let out = ok(s.kubectl(&[
        "get",
        "events.events.k8s.io",
        "rec1",
        "-o",
        "jsonpath={.note} {.regarding.name}",
    ]));
    assert_eq!(out, "from-recorder c");
    let err = fails(s.kubectl(&["get", "pods", "--field-selector", "spec.bogus=1"]));
    assert!(err.contains("field label not supported"), "{err}");
    let watch_ok = eventually(Duration::from_secs(1), || async { true }).await;
    assert!(watch_ok);
}

/// Until the definition `name` has condition `ty` at `status`; returns it.
pub async fn crd_condition(s: &TestServer, name: &str, ty: &str, status: &str) -> Value {
    let mut crd = Value::Null;
    let ok = eventually(Duration::from_secs(10), || {
        let out = s.kubectl(&["get", "crd", name, "-o", "json"]);
        crd = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let done = crd["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == status));
        async move { done }
    })
    .await;
    assert!(ok, "no {ty}={status}: {crd}");
    crd
}

/// Until the definition `name` is Established; returns it.
pub async fn established(s: &TestServer, name: &str) -> Value {
    crd_condition(s, name, "Established", "True").await
}

#[derive(
    kube::CustomResource, serde::Deserialize, serde::Serialize, Clone, Debug, kube::KubeSchema,
)]
#[kube(group = "kube.rs", version = "v1", kind = "Document", namespaced)]
#[kube(status = "DocumentStatus", shortname = "doc")]
pub struct DocumentSpec {
    #[x_kube(validation = kube::core::Rule::new("self.size() > 0").message("a document needs a title"))]
    title: String,
    pages: Option<u32>,
    tags: Vec<String>,
}

#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, Default, schemars::JsonSchema)]
pub struct DocumentStatus {
    published: bool,
}

/// A kube-rs `#[derive(CustomResource)]` type: its generated definition is
/// accepted, and typed clients create, watch, patch status, list and
/// delete its objects.
pub async fn derived_custom_resources(s: &TestServer) {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{WatchEvent, WatchParams};
    use kube::CustomResourceExt;
    let client = s.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Document::crd())
        .await
        .expect("create the derived definition");
    established(s, "documents.kube.rs").await;

    let docs: Api<Document> = Api::namespaced(client.clone(), "default");
    let mut watch = docs
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    let d = Document::new(
        "guide",
        DocumentSpec {
            title: "Guide".into(),
            pages: Some(3),
            tags: vec!["a".into()],
        },
    );
    let created = docs
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    assert_eq!(created.spec.title, "Guide");
    // The derived CEL rule runs on the server.
    let mut untitled = d.clone();
    untitled.metadata.name = Some("untitled".into());
    untitled.spec.title = String::new();
    let err = docs
        .create(&PostParams::default(), &untitled)
        .await
        .expect_err("an untitled document");
    assert!(
        err.to_string()
            .contains("spec.title: Invalid value: \"string\": a document needs a title"),
        "{err}"
    );
    let ev = tokio::time::timeout(Duration::from_secs(10), watch.try_next())
        .await
        .expect("a watch event")
        .expect("watch ok");
    assert!(
        matches!(ev, Some(WatchEvent::Added(ref o)) if o.spec.title == "Guide"),
        "{ev:?}"
    );

    let status = serde_json::json!({"status": {"published": true}});
    let patched = docs
        .patch_status("guide", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch status");
    assert!(patched.status.expect("status").published);

    // Server-side apply: the creator owns the pages it set, so another
    // manager's change to them conflicts until forced; then it owns them.
    let config = |pages: u32| {
        serde_json::json!({"apiVersion": "kube.rs/v1", "kind": "Document",
            "metadata": {"name": "guide"},
            "spec": {"title": "Guide", "pages": pages, "tags": ["a"]}})
    };
    let err = (docs.patch(
        "guide",
        &PatchParams::apply("docs-ctl"),
        &Patch::Apply(config(4)),
    ))
    .await
    .expect_err("a conflict over pages");
    assert!(
        matches!(&err, kube::Error::Api(e) if e.code == 409 && e.message.contains(".spec.pages")),
        "{err}"
    );
    let forced = PatchParams::apply("docs-ctl").force();
    let applied = (docs.patch("guide", &forced, &Patch::Apply(config(4))))
        .await
        .expect("a forced apply");
    assert_eq!(applied.spec.pages, Some(4));
    let owners = applied.metadata.managed_fields.unwrap_or_default();
    let ours = owners
        .iter()
        .find(|m| m.manager.as_deref() == Some("docs-ctl"));
    assert!(
        ours.is_some_and(|m| m.operation.as_deref() == Some("Apply")),
        "{owners:?}"
    );
    let listed = docs.list(&ListParams::default()).await.expect("list");
    assert_eq!(listed.items.len(), 1);

    docs.delete("guide", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(docs
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
}
