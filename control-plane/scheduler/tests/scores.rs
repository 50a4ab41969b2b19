//! Scores against a real (in-process) API server: each preference the
//! API accepts changes where a pod goes. Node "big" (8 CPUs, 16 GiB) wins
//! on resources over "small" (4 CPUs, 8 GiB) by a few points; each test
//! adds one preference for "small" that must outweigh that.

use crate::support;

use serde_json::{json, Value};
use support::Cluster;

async fn two_nodes(c: &Cluster, big_extra: Value) {
    let mut big = json!({"status": {
        "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}});
    support::merge(&mut big, big_extra);
    c.node("big", big).await;
    c.node(
        "small",
        json!({"metadata": {"labels": {"kubernetes.io/hostname": "small", "disk": "ssd"}}}),
    )
    .await;
}

#[tokio::test]
async fn resources_alone_pick_the_emptier_node() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    c.start_scheduler().await;
    c.pod("default", "plain", "1", json!({})).await;
    assert_eq!(c.bound("default", "plain").await, "big");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn preferred_node_affinity_pulls() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    c.start_scheduler().await;
    let spec = json!({"spec": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
            "matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}});
    c.pod("default", "fast", "1", spec).await;
    assert_eq!(c.bound("default", "fast").await, "small");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn prefer_no_schedule_taints_push() {
    let mut c = Cluster::start().await;
    two_nodes(
        &c,
        json!({"spec": {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}}),
    )
    .await;
    c.start_scheduler().await;
    c.pod("default", "avoids", "1", json!({})).await;
    assert_eq!(c.bound("default", "avoids").await, "small");
    // A pod tolerating the taint goes by resources again.
    let tolerant = json!({"spec": {"tolerations": [
        {"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}]}});
    c.pod("default", "tolerant", "1", tolerant).await;
    assert_eq!(c.bound("default", "tolerant").await, "big");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn preferred_pod_affinity_pulls_next_to_a_labelled_pod() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    let db = json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "small"}});
    c.pod("default", "db", "10m", db).await;
    c.start_scheduler().await;
    let spec = json!({"spec": {"affinity": {"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"app": "db"}},
            "topologyKey": "kubernetes.io/hostname"}}]}}}});
    c.pod("default", "web", "1", spec).await;
    assert_eq!(c.bound("default", "web").await, "small");
    // Preferred anti-affinity pushes away from it instead.
    let spec = json!({"spec": {"affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"app": "db"}},
            "topologyKey": "kubernetes.io/hostname"}}]}}}});
    c.pod("default", "away", "10m", spec).await;
    assert_eq!(c.bound("default", "away").await, "big");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn existing_pods_preferences_are_symmetric() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    // A placed pod that prefers app=web next to it draws app=web pods.
    let cache = json!({"metadata": {"labels": {"app": "cache"}}, "spec": {"nodeName": "small",
        "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}},
                "topologyKey": "kubernetes.io/hostname"}}]}}}});
    c.pod("default", "cache", "10m", cache).await;
    c.start_scheduler().await;
    let web = json!({"metadata": {"labels": {"app": "web"}}});
    c.pod("default", "web", "1", web).await;
    assert_eq!(c.bound("default", "web").await, "small");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn schedule_anyway_spread_pushes_away_from_the_crowd() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    for i in 0..2 {
        let crowd = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"nodeName": "big"}});
        c.pod("default", &format!("crowd-{i}"), "10m", crowd).await;
    }
    c.start_scheduler().await;
    let spec = json!({"metadata": {"labels": {"app": "web"}}, "spec": {
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "web"}}}]}});
    c.pod("default", "spread", "1", spec).await;
    assert_eq!(c.bound("default", "spread").await, "small");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn default_spreading_counts_the_controllers_pods() {
    let mut c = Cluster::start().await;
    two_nodes(&c, json!({})).await;
    let owner = support::owned_by("ReplicaSet", "rs", "rs-uid");
    for i in 0..2 {
        let mut crowd = json!({"spec": {"nodeName": "big"}});
        support::merge(&mut crowd, owner.clone());
        c.pod("default", &format!("crowd-{i}"), "10m", crowd).await;
    }
    c.start_scheduler().await;
    // Without constraints of its own, the system defaults spread the
    // ReplicaSet's pods.
    c.pod("default", "next", "1", owner).await;
    assert_eq!(c.bound("default", "next").await, "small");
    // Another controller's pod is not pushed away by them.
    c.pod(
        "default",
        "other",
        "1",
        support::owned_by("ReplicaSet", "rs2", "rs2-uid"),
    )
    .await;
    assert_eq!(c.bound("default", "other").await, "big");
    c.stop_scheduler().await;
}
