//! Required inter-pod affinity and anti-affinity, and topology spread
//! constraints, against a real (in-process) API server: placements and
//! upstream's FailedScheduling messages.

use crate::support;

use std::collections::HashMap;

use kube::api::DeleteParams;
use serde_json::{json, Value};
use support::{poll, Cluster, WITHIN};

/// Three nodes: n1 and n2 in zone z1, n3 in zone z2.
async fn three_nodes(c: &Cluster) {
    for (name, zone) in [("n1", "z1"), ("n2", "z1"), ("n3", "z2")] {
        c.node(
            name,
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}}),
        )
        .await;
    }
}

fn labelled(app: &str, spec: Value) -> Value {
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

fn required(kind: &str, app: &str, key: &str) -> Value {
    json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}})
}

/// Wait until exactly `want` of `names` are bound; name -> node.
async fn placed(c: &Cluster, names: &[String], want: usize) -> HashMap<String, String> {
    poll(WITHIN, || async {
        let mut placed = HashMap::new();
        for n in names {
            if let Some(node) = c.node_of("default", n).await {
                placed.insert(n.clone(), node);
            }
        }
        (placed.len() == want).then_some(placed)
    })
    .await
    .unwrap_or_else(|| panic!("never exactly {want} of {names:?} bound"))
}

/// A FailedScheduling message without what preemption adds (upstream's
/// ` preemption: ...` suffix): the filters' part these tests are about.
fn filters(message: String) -> String {
    match message.split_once(" preemption: ") {
        Some((filters, _)) => filters.to_string(),
        None => message,
    }
}

fn per_node(placed: &HashMap<String, String>) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for node in placed.values() {
        *out.entry(node.clone()).or_default() += 1;
    }
    out
}

#[tokio::test]
async fn anti_affinity_on_hostname_places_one_pod_per_node() {
    let mut c = Cluster::start().await;
    three_nodes(&c).await;
    c.start_scheduler().await;
    let names: Vec<String> = (0..6).map(|i| format!("web-{i}")).collect();
    for n in &names {
        let spec = required("podAntiAffinity", "web", "kubernetes.io/hostname");
        c.pod("default", n, "100m", labelled("web", spec)).await;
    }
    let bound = placed(&c, &names, 3).await;
    assert_eq!(per_node(&bound).len(), 3, "one per node: {bound:?}");
    let pending: Vec<&String> = names.iter().filter(|n| !bound.contains_key(*n)).collect();
    let expected = "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.";
    for p in &pending {
        assert_eq!(
            filters(c.event_note("default", p, "FailedScheduling").await),
            expected
        );
        let (reason, message) = c.unschedulable_condition("default", p).await;
        let message = filters(message);
        assert_eq!(
            (reason.as_str(), message.as_str()),
            ("Unschedulable", expected)
        );
    }
    // A bound pod goes: exactly one pending pod takes its node.
    let (victim, node) = bound.iter().next().expect("a bound pod");
    c.pods("default")
        .delete(victim, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    let rest: Vec<String> = pending.iter().map(|s| s.to_string()).collect();
    let now = placed(&c, &rest, 1).await;
    assert_eq!(now.values().next(), Some(node));
    c.stop_scheduler().await;
}

#[tokio::test]
async fn spread_over_zones_balances_even_against_the_resource_score() {
    let mut c = Cluster::start().await;
    // z1 has far more room: the resource score alone would put every pod
    // there. A node without the zone label is no domain.
    let big = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}}});
    c.node("big", big).await;
    for (name, zone) in [("n2", "z2"), ("n3", "z3")] {
        c.node(
            name,
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}}),
        )
        .await;
    }
    c.node("bare", json!({})).await;
    c.start_scheduler().await;
    let spread = |extra: Value| {
        let mut con = json!({"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}});
        support::merge(&mut con, extra);
        json!({"topologySpreadConstraints": [con]})
    };
    let names: Vec<String> = (0..6).map(|i| format!("web-{i}")).collect();
    for n in &names {
        c.pod("default", n, "100m", labelled("web", spread(json!({}))))
            .await;
        // One at a time: a burst of pending pods is scheduled as well,
        // but then the test would not see each decision on its own.
        c.bound("default", n).await;
    }
    let bound = placed(&c, &names, 6).await;
    assert_eq!(
        per_node(&bound),
        HashMap::from([("big".into(), 2), ("n2".into(), 2), ("n3".into(), 2)])
    );

    // minDomains 4 with three zones: the minimum stays 0, so one pod per
    // zone, and the fourth fits nowhere.
    let strict = |extra: Value| {
        let mut s = spread(json!({"minDomains": 4,
            "labelSelector": {"matchLabels": {"app": "strict"}}}));
        support::merge(&mut s, extra);
        labelled("strict", s)
    };
    let names: Vec<String> = (0..4).map(|i| format!("strict-{i}")).collect();
    for n in &names {
        c.pod("default", n, "100m", strict(json!({}))).await;
    }
    let bound = placed(&c, &names, 3).await;
    assert_eq!(per_node(&bound).len(), 3, "{bound:?}");
    let pending = names
        .iter()
        .find(|n| !bound.contains_key(*n))
        .expect("one left");
    assert_eq!(
        filters(c.event_note("default", pending, "FailedScheduling").await),
        "0/4 nodes are available: 1 node(s) didn't match pod topology spread constraints \
         (missing required label), 3 node(s) didn't match pod topology spread constraints."
    );
    c.stop_scheduler().await;
}

#[tokio::test]
async fn affinity_follows_a_labelled_pod_and_waits_for_one() {
    let mut c = Cluster::start().await;
    three_nodes(&c).await;
    c.start_scheduler().await;
    // Nothing labelled app=db yet, and the pod does not match its own
    // term: it waits.
    let follower = |key: &str| labelled("api", required("podAffinity", "db", key));
    c.pod(
        "default",
        "early",
        "100m",
        follower("kubernetes.io/hostname"),
    )
    .await;
    assert_eq!(
        filters(c.event_note("default", "early", "FailedScheduling").await),
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules."
    );
    // The db pod lands on n2: the waiting pod follows it there.
    c.pod(
        "default",
        "db",
        "100m",
        labelled(
            "db",
            json!({"nodeSelector": {"kubernetes.io/hostname": "n2"}}),
        ),
    )
    .await;
    assert_eq!(c.bound("default", "db").await, "n2");
    assert_eq!(c.bound("default", "early").await, "n2");
    for i in 0..3 {
        let name = format!("host-{i}");
        c.pod("default", &name, "100m", follower("kubernetes.io/hostname"))
            .await;
        assert_eq!(c.bound("default", &name).await, "n2");
    }
    // Affinity by zone: n1 or n2 (z1), never n3.
    let mut nodes = std::collections::HashSet::new();
    for i in 0..6 {
        let name = format!("zone-{i}");
        c.pod(
            "default",
            &name,
            "100m",
            follower("topology.kubernetes.io/zone"),
        )
        .await;
        nodes.insert(c.bound("default", &name).await);
    }
    assert!(!nodes.contains("n3"), "{nodes:?}");
    // The first pod of a self-affine group may go anywhere; the rest
    // join it.
    let group = labelled(
        "cache",
        required("podAffinity", "cache", "kubernetes.io/hostname"),
    );
    c.pod("default", "cache-0", "100m", group.clone()).await;
    let first = c.bound("default", "cache-0").await;
    for i in 1..3 {
        let name = format!("cache-{i}");
        c.pod("default", &name, "100m", group.clone()).await;
        assert_eq!(c.bound("default", &name).await, first);
    }
    c.stop_scheduler().await;
}

#[tokio::test]
async fn existing_pods_anti_affinity_keeps_others_out() {
    let mut c = Cluster::start().await;
    three_nodes(&c).await;
    c.start_scheduler().await;
    // A db pod on n1 that wants no web pod in its zone (z1).
    let mut db = required("podAntiAffinity", "web", "topology.kubernetes.io/zone");
    db["nodeSelector"] = json!({"kubernetes.io/hostname": "n1"});
    c.pod("default", "db", "100m", labelled("db", db)).await;
    assert_eq!(c.bound("default", "db").await, "n1");
    // Web pods have no rules of their own, yet all go to z2.
    for i in 0..4 {
        let name = format!("web-{i}");
        c.pod("default", &name, "100m", labelled("web", json!({})))
            .await;
        assert_eq!(c.bound("default", &name).await, "n3");
    }
    // Other pods are not affected.
    c.pod(
        "default",
        "api",
        "100m",
        labelled(
            "api",
            json!({"nodeSelector": {"kubernetes.io/hostname": "n2"}}),
        ),
    )
    .await;
    assert_eq!(c.bound("default", "api").await, "n2");
    // A web pod pinned to z1 fits nowhere, and says why.
    c.pod(
        "default",
        "pinned",
        "100m",
        labelled(
            "web",
            json!({"nodeSelector": {"topology.kubernetes.io/zone": "z1"}}),
        ),
    )
    .await;
    assert_eq!(
        filters(c.event_note("default", "pinned", "FailedScheduling").await),
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
         2 node(s) didn't satisfy existing pods anti-affinity rules."
    );
    // The db pod goes: its rule with it.
    c.pods("default")
        .delete("db", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    let node = c.bound("default", "pinned").await;
    assert!(node == "n1" || node == "n2", "{node}");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_namespace_selector_other_than_all_is_refused() {
    let c = Cluster::start().await;
    let term = |sel: Value| {
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname",
             "namespaceSelector": sel}]}}})
    };
    let mut picky = json!({
        "metadata": {"name": "picky", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    support::merge(
        &mut picky,
        json!({"spec": term(json!({"matchLabels": {"team": "a"}}))}),
    );
    let picky: k8s_openapi::api::core::v1::Pod = serde_json::from_value(picky).expect("pod");
    let err = c
        .pods("default")
        .create(&Default::default(), &picky)
        .await
        .expect_err("refused");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains(
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]\
             .namespaceSelector: Forbidden: not supported by this server"
        ),
        "{}",
        status.message
    );
    // `{}` (every namespace) is honoured, so accepted.
    c.pod("default", "all", "100m", json!({"spec": term(json!({}))}))
        .await;
}
