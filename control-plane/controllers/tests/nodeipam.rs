//! Node IPAM against a real API server: unique podCIDRs from the cluster
//! range, pre-set ones kept, freed ones reused, exhaustion reported, and
//! nothing reshuffled by a controller restart.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use serde_json::json;
use skiff_control_plane::testkit::{eventually, TestServer};
use skiff_controllers::Config;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(20);

async fn start_controllers(server: &TestServer) -> oneshot::Sender<()> {
    let client = server
        .client_for("system:kube-controller-manager", &[])
        .await;
    let cfg = Config {
        controllers: vec!["nodeipam".into()],
        // 4 node subnets: small enough to exhaust.
        cluster_cidr: Some("198.18.0.0/22".into()),
        node_cidr_mask_size: 24,
        ..Config::default()
    };
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(skiff_controllers::run(client, cfg, async {
        let _ = rx.await;
    }));
    tx
}

async fn create_node(nodes: &Api<Node>, name: &str, cidr: Option<&str>) {
    let mut spec = json!({});
    if let Some(c) = cidr {
        spec = json!({"podCIDR": c, "podCIDRs": [c]});
    }
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
}

async fn cidr_of(nodes: &Api<Node>, name: &str) -> Option<String> {
    let n = nodes.get(name).await.ok()?;
    let spec = n.spec?;
    let c = spec.pod_cidr?;
    // podCIDRs must agree with podCIDR.
    assert_eq!(spec.pod_cidrs, Some(vec![c.clone()]), "node {name}");
    Some(c)
}

#[tokio::test]
async fn node_ipam_assigns_unique_keeps_preset_and_reuses_freed() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let stop = start_controllers(&server).await;

    create_node(&nodes, "n0", Some("198.18.1.0/24")).await;
    for n in ["n1", "n2", "n3"] {
        create_node(&nodes, n, None).await;
    }
    assert!(
        eventually(WAIT, || async {
            for n in ["n1", "n2", "n3"] {
                if cidr_of(&nodes, n).await.is_none() {
                    return false;
                }
            }
            true
        })
        .await,
        "every node gets a podCIDR"
    );
    let mut got = Vec::new();
    for n in ["n1", "n2", "n3"] {
        got.push(cidr_of(&nodes, n).await.unwrap());
    }
    assert_eq!(
        cidr_of(&nodes, "n0").await.as_deref(),
        Some("198.18.1.0/24")
    );
    let all: HashSet<&str> = got.iter().map(String::as_str).collect();
    let want: HashSet<&str> = ["198.18.0.0/24", "198.18.2.0/24", "198.18.3.0/24"].into();
    assert_eq!(
        all, want,
        "unique subnets of the range, pre-set one skipped"
    );

    // The range is full: the next node waits and is told why.
    create_node(&nodes, "n4", None).await;
    let events: Api<Event> = Api::all(admin.clone());
    assert!(
        eventually(WAIT, || async {
            let evs = events.list(&ListParams::default()).await.unwrap();
            evs.items.iter().any(|e| {
                e.involved_object.name.as_deref() == Some("n4")
                    && e.reason.as_deref() == Some("CIDRNotAvailable")
            })
        })
        .await,
        "CIDRNotAvailable event on n4"
    );
    assert_eq!(cidr_of(&nodes, "n4").await, None);

    // Deleting a node frees its subnet for the waiting one.
    let freed = cidr_of(&nodes, "n2").await.unwrap();
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    assert!(
        eventually(WAIT, || async {
            cidr_of(&nodes, "n4").await.as_deref() == Some(freed.as_str())
        })
        .await,
        "n4 gets the freed {freed}"
    );

    // A restarted controller keeps every assignment and still allocates.
    let _ = stop.send(());
    let before: Vec<Option<String>> = {
        let mut v = Vec::new();
        for n in ["n0", "n1", "n3", "n4"] {
            v.push(cidr_of(&nodes, n).await);
        }
        v
    };
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    let _stop = start_controllers(&server).await;
    create_node(&nodes, "n5", None).await;
    let n1_cidr = before[1].clone().unwrap();
    assert!(
        eventually(WAIT, || async {
            cidr_of(&nodes, "n5").await.as_deref() == Some(n1_cidr.as_str())
        })
        .await,
        "n5 gets n1's freed {n1_cidr} after a restart"
    );
    for (n, b) in ["n0", "n3", "n4"]
        .iter()
        .zip([&before[0], &before[2], &before[3]])
    {
        assert_eq!(&cidr_of(&nodes, n).await, b, "{n} keeps its podCIDR");
    }
}
