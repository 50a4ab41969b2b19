//! A definition with two versions converted by a webhook (HTTPS, its own
//! CA): objects are stored at the storage version whatever version they
//! are written at, served at the version asked for (get, list in one
//! review, table, watch through kube-rs), and a webhook that fails or
//! answers wrongly fails the request with upstream's message, storing
//! nothing.

use crate::api;
use crate::api_suite;
use crate::webhook_server;

use std::time::Duration;

use api::{eventually, fails, ok, TestServer};
use api_suite::established;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
use serde_json::Value;

fn gauges(port: u16, ca_bundle: &str, path: &str) -> String {
    format!(
        r#"{{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {{"name": "gauges.example.com"}},
        "spec": {{"group": "example.com", "scope": "Namespaced",
            "names": {{"plural": "gauges", "kind": "Gauge"}},
            "conversion": {{"strategy": "Webhook", "webhook": {{
                "clientConfig": {{"url": "https://127.0.0.1:{port}{path}", "caBundle": "{ca_bundle}"}},
                "conversionReviewVersions": ["v1"]}}}},
            "versions": [
                {{"name": "v1", "served": true, "storage": true, "schema": {{"openAPIV3Schema":
                    {{"type": "object", "properties": {{"spec": {{"type": "object",
                        "properties": {{"size": {{"type": "string"}}}}}}}}}}}}}},
                {{"name": "v2", "served": true, "storage": false, "schema": {{"openAPIV3Schema":
                    {{"type": "object", "properties": {{"spec": {{"type": "object",
                        "properties": {{"count": {{"type": "integer"}}}}}}}}}}}},
                  "additionalPrinterColumns": [{{"name": "Count", "type": "integer", "jsonPath": ".spec.count"}}]}}]}}}}"#
    )
}

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn get(s: &TestServer, version: &str, name: &str) -> Value {
    json(ok(s.kubectl(&[
        "get",
        "--raw",
        &format!("/apis/example.com/{version}/namespaces/default/gauges/{name}"),
    ])))
}

/// The Gauge definition's webhook moved to `path` of the test server.
fn point_webhook(s: &TestServer, port: u16, path: &str) {
    let mut crd = json(ok(s.kubectl(&[
        "get",
        "crd",
        "gauges.example.com",
        "-o",
        "json",
    ])));
    crd["spec"]["conversion"]["webhook"]["clientConfig"]["url"] =
        serde_json::json!(format!("https://127.0.0.1:{port}{path}"));
    ok(s.kubectl_stdin(&["replace", "-f", "-"], &crd.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversion_webhook_converts_between_versions() {
    let s = TestServer::start().await;
    let hook = webhook_server::serve(&[]).await;
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &gauges(hook.port, &hook.ca_bundle, "/convert"),
    ));
    established(&s, "gauges.example.com").await;
    let reviews = || hook.calls_to("/convert");

    // Written at v1, the storage version: served at v2 through the hook.
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Gauge\nmetadata: {name: a}\nspec: {size: \"3\"}\n",
    ));
    assert!(reviews().is_empty(), "{:?}", reviews());
    let a = get(&s, "v2", "a");
    assert_eq!(a["apiVersion"], "example.com/v2", "{a}");
    assert_eq!(a["spec"], serde_json::json!({"count": 3}), "{a}");
    let review = reviews().pop().unwrap();
    assert_eq!(review["desiredAPIVersion"], "example.com/v2", "{review}");

    // Written at v2: stored at v1, so read at v1 without a call.
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v2\nkind: Gauge\nmetadata: {name: b}\nspec: {count: 5}\n",
    ));
    let review = reviews().pop().unwrap();
    assert_eq!(review["desiredAPIVersion"], "example.com/v1", "{review}");
    let before = reviews().len();
    let b = get(&s, "v1", "b");
    assert_eq!(b["spec"], serde_json::json!({"size": "5"}), "{b}");
    assert_eq!(reviews().len(), before, "a v1 read needs no conversion");

    // A list is one review of every object; the table has v2's column.
    let list = json(ok(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v2/namespaces/default/gauges",
    ])));
    let counts: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["spec"]["count"])
        .collect();
    assert_eq!(counts, [&serde_json::json!(3), &serde_json::json!(5)]);
    assert_eq!(reviews().len(), before + 1);
    assert_eq!(
        reviews().pop().unwrap()["objects"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let table = ok(s.kubectl(&["get", "gauges.v2.example.com"]));
    assert!(table.contains("COUNT"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("b ") && l.contains(" 5")),
        "{table}"
    );

    // An update at v2 is stored at v1.
    ok(s.kubectl(&[
        "patch",
        "gauges.v2.example.com",
        "a",
        "--type=merge",
        "-p",
        r#"{"spec":{"count":7}}"#,
    ]));
    assert_eq!(get(&s, "v1", "a")["spec"]["size"], "7");

    // A watch at v2 (kube-rs) sees a change written at v1 converted.
    let gvk = GroupVersionKind::gvk("example.com", "v2", "Gauge");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "gauges");
    let api: Api<DynamicObject> = Api::namespaced_with(s.client().await, "default", &ar);
    let mut events = api
        .watch(&WatchParams::default().timeout(20), "0")
        .await
        .unwrap()
        .boxed();
    ok(s.kubectl(&[
        "patch",
        "gauges.v1.example.com",
        "b",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":"9"}}"#,
    ]));
    let mut seen = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(20), events.try_next())
        .await
        .expect("a watch event")
        .unwrap()
    {
        if let WatchEvent::Modified(o) = ev {
            seen = Some(o);
            break;
        }
    }
    let seen = seen.expect("the change is watched");
    assert_eq!(seen.types.unwrap().api_version, "example.com/v2");
    assert_eq!(seen.data["spec"]["count"], 9, "{:?}", seen.data);

    // A failing webhook fails reads and writes that need it, storing
    // nothing; reads at the storage version go on.
    point_webhook(&s, hook.port, "/convert-fail");
    let path = "/apis/example.com/v2/namespaces/default/gauges/a";
    assert!(
        eventually(Duration::from_secs(10), || {
            let out = s.kubectl(&["get", "--raw", path]);
            async move { !out.status.success() }
        })
        .await
    );
    let err = fails(s.kubectl(&["get", "--raw", path]));
    assert!(
        err.contains("conversion webhook for example.com/v1, Kind=Gauge failed: this webhook converts nothing"),
        "{err}"
    );
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v2\nkind: Gauge\nmetadata: {name: c}\nspec: {count: 1}\n",
    ));
    assert!(
        err.contains("conversion webhook for example.com/v2, Kind=Gauge failed"),
        "{err}"
    );
    fails(s.kubectl(&["get", "gauges.v1.example.com", "c"]));
    assert_eq!(get(&s, "v1", "a")["spec"]["size"], "7");

    // An answer for another request is refused.
    point_webhook(&s, hook.port, "/convert-uid");
    assert!(
        eventually(Duration::from_secs(10), || {
            let out = s.kubectl(&["get", "--raw", path]);
            async move { String::from_utf8_lossy(&out.stderr).contains("expected response.uid=") }
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn conversion_settings_are_validated() {
    let s = TestServer::start().await;
    let mut crd = json(gauges(443, "", "/convert"));
    let conversion = &mut crd["spec"]["conversion"];
    conversion["webhook"]
        .as_object_mut()
        .unwrap()
        .remove("clientConfig");
    conversion["webhook"]["conversionReviewVersions"] = serde_json::json!(["v3", "v3"]);
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &crd.to_string()));
    for cause in [
        "spec.conversion.webhookClientConfig: Required value: required when strategy is set to Webhook",
        "spec.conversion.conversionReviewVersions[1]: Invalid value: \"v3\": duplicate version",
        "spec.conversion.conversionReviewVersions: Invalid value: [\"v3\",\"v3\"]: must include at least one of v1, v1beta1",
    ] {
        assert!(err.contains(cause), "{cause}\n{err}");
    }
    let mut crd = json(gauges(443, "", "/convert"));
    crd["spec"]["conversion"]["strategy"] = serde_json::json!("None");
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &crd.to_string()));
    assert!(
        err.contains("spec.conversion.webhookClientConfig: Forbidden: should not be set when strategy is not set to Webhook"),
        "{err}"
    );
    fails(s.kubectl(&["get", "crd", "gauges.example.com"]));
}
