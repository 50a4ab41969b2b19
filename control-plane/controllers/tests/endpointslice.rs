//! EndpointSlice controller against a real API server: slices follow pod
//! readiness, named target ports, selector changes and pod deletion;
//! Endpoints follow along; unrelated changes write nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use skiff_control_plane::testkit::{eventually, TestServer};
use skiff_controllers::Config;

const WAIT: Duration = Duration::from_secs(20);

async fn start_controllers(server: &TestServer) -> tokio::sync::oneshot::Sender<()> {
    let client = server
        .client_for("system:kube-controller-manager", &[])
        .await;
    let cfg = Config {
        controllers: vec!["endpointslice".into()],
        ..Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(skiff_controllers::run(client, cfg, async {
        let _ = rx.await;
    }));
    tx
}

async fn create_pod(pods: &Api<Pod>, name: &str, app: &str, http_port: i32) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "c", "image": "busybox:1", "ports": [
                {"name": "http", "containerPort": http_port},
                {"name": "metrics", "containerPort": 9090},
            ]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
}

/// What the agent would report: running, with an IP, ready or not.
async fn set_status(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn slices_of(api: &Api<EndpointSlice>, svc: &str) -> Vec<EndpointSlice> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    api.list(&lp).await.unwrap().items
}

/// Endpoints of a service's slices: pod name -> (ports, ready, serving, terminating).
type Seen = BTreeMap<String, (Vec<i32>, bool, bool, bool)>;

async fn seen(api: &Api<EndpointSlice>, svc: &str) -> Seen {
    let mut out = Seen::new();
    for s in slices_of(api, svc).await {
        let ports: Vec<i32> = s.ports.iter().flatten().filter_map(|p| p.port).collect();
        for e in s.endpoints.iter().flatten() {
            let name = e.target_ref.as_ref().and_then(|r| r.name.clone()).unwrap();
            let c = e.conditions.clone().unwrap_or_default();
            out.insert(
                name,
                (
                    ports.clone(),
                    c.ready.unwrap_or(false),
                    c.serving.unwrap_or(false),
                    c.terminating.unwrap_or(false),
                ),
            );
        }
    }
    out
}

fn seen_of(entries: &[(&str, &[i32], bool, bool, bool)]) -> Seen {
    entries
        .iter()
        .map(|(n, p, r, s, t)| (n.to_string(), (p.to_vec(), *r, *s, *t)))
        .collect()
}

async fn wait_seen(api: &Api<EndpointSlice>, svc: &str, want: Seen) {
    let ok = eventually(WAIT, || async { seen(api, svc).await == want }).await;
    assert!(
        ok,
        "slices of {svc}: want {want:?}, have {:?}",
        seen(api, svc).await
    );
}

fn endpoint_of<'a>(slices: &'a [EndpointSlice], pod: &str) -> &'a Endpoint {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .find(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .unwrap()
}

#[tokio::test]
async fn endpoint_slices_follow_pods_ports_and_selectors() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let svcs: Api<Service> = Api::namespaced(admin.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), "default");
    let eps: Api<Endpoints> = Api::namespaced(admin.clone(), "default");
    let _stop = start_controllers(&server).await;

    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"team": "a"}},
        "spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "metrics", "port": 9000, "targetPort": 9090},
        ]},
    }))
    .unwrap();
    let svc = svcs.create(&PostParams::default(), &svc).await.unwrap();

    // No pods yet: one placeholder slice, owned by the service.
    assert!(
        eventually(WAIT, || async {
            slices_of(&slices, "web").await.len() == 1
        })
        .await,
        "placeholder slice"
    );
    let s = &slices_of(&slices, "web").await[0];
    assert!(s.name_any().starts_with("web-"));
    assert_eq!(s.address_type, "IPv4");
    assert_eq!(
        s.labels()["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(s.labels()["team"], "a");
    let owner = &s.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Service", svc.uid().unwrap().as_str())
    );
    assert_eq!(owner.controller, Some(true));
    assert!(s.endpoints.iter().flatten().next().is_none());

    // Two pods whose "http" container ports differ: two port groups.
    create_pod(&pods, "a", "web", 8080).await;
    create_pod(&pods, "b", "web", 8081).await;
    create_pod(&pods, "no-ip", "web", 8080).await;
    set_status(&pods, "a", "198.18.0.10", true).await;
    set_status(&pods, "b", "198.18.0.11", false).await;
    wait_seen(
        &slices,
        "web",
        seen_of(&[
            ("a", &[8080, 9090], true, true, false),
            ("b", &[8081, 9090], false, false, false),
        ]),
    )
    .await;
    assert!(
        eventually(WAIT, || async {
            slices_of(&slices, "web").await.len() == 2
        })
        .await,
        "one slice per port list, no placeholder left"
    );
    let all = slices_of(&slices, "web").await;
    let a = endpoint_of(&all, "a");
    assert_eq!(a.addresses, vec!["198.18.0.10".to_string()]);
    assert_eq!(a.node_name.as_deref(), Some("node-1"));
    let tr = a.target_ref.as_ref().unwrap();
    assert_eq!(
        (tr.kind.as_deref(), tr.namespace.as_deref()),
        (Some("Pod"), Some("default"))
    );
    let port_names: Vec<String> = all[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.clone())
        .collect();
    assert_eq!(port_names, vec!["http".to_string(), "metrics".to_string()]);

    // Readiness flips follow.
    set_status(&pods, "b", "198.18.0.11", true).await;
    wait_seen(
        &slices,
        "web",
        seen_of(&[
            ("a", &[8080, 9090], true, true, false),
            ("b", &[8081, 9090], true, true, false),
        ]),
    )
    .await;

    // The core/v1 Endpoints agree.
    assert!(
        eventually(WAIT, || async {
            let Ok(e) = eps.get("web").await else {
                return false;
            };
            let mut ips: Vec<String> = e
                .subsets
                .iter()
                .flatten()
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| a.ip.clone())
                .collect();
            ips.sort();
            ips == ["198.18.0.10", "198.18.0.11"]
        })
        .await,
        "Endpoints web lists both pods: {:?}",
        eps.get("web").await.ok().map(|e| e.subsets)
    );

    // A change that concerns no endpoint writes nothing: record versions,
    // change an unrelated pod, then prove the controller has moved on by
    // waiting for another service's slice.
    let before: Vec<(String, Option<String>)> = slices_of(&slices, "web")
        .await
        .iter()
        .map(|s| (s.name_any(), s.resource_version()))
        .collect();
    create_pod(&pods, "other", "other", 8080).await;
    set_status(&pods, "other", "198.18.0.20", true).await;
    let annotate = json!({"metadata": {"annotations": {"touched": "yes"}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let probe: Service = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"selector": {"app": "other"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    svcs.create(&PostParams::default(), &probe).await.unwrap();
    wait_seen(
        &slices,
        "probe",
        seen_of(&[("other", &[8080], true, true, false)]),
    )
    .await;
    let mut after: Vec<(String, Option<String>)> = slices_of(&slices, "web")
        .await
        .iter()
        .map(|s| (s.name_any(), s.resource_version()))
        .collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "unrelated changes rewrote slices of web");

    // Selector change: the old pods leave, the newly selected one comes.
    let sel = json!({"spec": {"selector": {"app": "other"}}});
    svcs.patch("web", &PatchParams::default(), &Patch::Merge(&sel))
        .await
        .unwrap();
    wait_seen(
        &slices,
        "web",
        seen_of(&[("other", &[8080, 9090], true, true, false)]),
    )
    .await;

    // Graceful deletion: terminating, still serving, not ready.
    pods.delete("other", &DeleteParams::default())
        .await
        .unwrap();
    wait_seen(
        &slices,
        "web",
        seen_of(&[("other", &[8080, 9090], false, true, true)]),
    )
    .await;
    // The node finishes the deletion: the service is empty again.
    pods.delete("other", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_seen(&slices, "web", Seen::new()).await;
    assert!(
        eventually(WAIT, || async {
            slices_of(&slices, "web").await.len() == 1
        })
        .await,
        "back to one placeholder slice"
    );
    assert!(
        eventually(WAIT, || async {
            eps.get("web")
                .await
                .is_ok_and(|e| e.subsets.iter().flatten().next().is_none())
        })
        .await,
        "Endpoints web is empty"
    );
    let e: Value = serde_json::to_value(eps.get("web").await.unwrap()).unwrap();
    assert_eq!(
        e["metadata"]["labels"]["endpointslice.kubernetes.io/skip-mirror"],
        "true"
    );
}

#[tokio::test]
async fn endpoint_slices_split_at_100_and_survive_a_restart() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let svcs: Api<Service> = Api::namespaced(admin.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), "default");
    for i in 0..120 {
        let name = format!("p{i}");
        create_pod(&pods, &name, "many", 8080).await;
        set_status(&pods, &name, &format!("198.18.1.{}", i + 1), true).await;
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "many"},
        "spec": {"selector": {"app": "many"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    let stop = start_controllers(&server).await;
    let sizes = || async {
        let mut v: Vec<usize> = slices_of(&slices, "many")
            .await
            .iter()
            .map(|s| s.endpoints.iter().flatten().count())
            .collect();
        v.sort();
        v
    };
    assert!(
        eventually(WAIT, || async { sizes().await == vec![20, 100] }).await,
        "120 endpoints in slices of 100 and 20: {:?}",
        sizes().await
    );
    let names = |v: Vec<EndpointSlice>| {
        let mut n: Vec<String> = v.iter().map(|s| s.name_any()).collect();
        n.sort();
        n
    };
    let before = names(slices_of(&slices, "many").await);
    // A restarted controller adopts what is there instead of starting over.
    let _ = stop.send(());
    let _stop = start_controllers(&server).await;
    pods.delete("p0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            sizes().await == vec![19, 100] || sizes().await == vec![20, 99]
        })
        .await,
        "p0 removed in place: {:?}",
        sizes().await
    );
    assert_eq!(names(slices_of(&slices, "many").await), before);
}
