//! The `Available` condition of APIServices (upstream's availability
//! controller): `Local` ones always are; a registered one is when its
//! backend answers its discovery (`/apis/GROUP/VERSION`), checked every
//! few seconds and at once when an APIService changes. The discovery
//! document answered is kept for aggregated discovery.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use super::{def, proxy, Backend, USER_HEADER};
use crate::apiserver::crd::establish::set_condition;
use crate::apiserver::handlers::{get_object, write_update, Attempt};
use crate::apiserver::{ApiServer, Req};

/// How often every APIService is checked.
const PERIOD: Duration = Duration::from_secs(5);
/// How long one discovery check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a discovery document that is read.
const MAX_DISCOVERY: usize = 4 << 20;

pub async fn run(api: Arc<ApiServer>) {
    let mut shutdown = api.shutdown.clone();
    loop {
        check_all(&api).await;
        tokio::select! {
            _ = tokio::time::sleep(PERIOD) => {}
            _ = api.aggregator.changed.notified() => {}
            _ = crate::leader::stopped(&mut shutdown) => return,
        }
    }
}

async fn check_all(api: &ApiServer) {
    let Ok(list) = api.store.list(&def().prefix(None), None, 0, None).await else {
        return;
    };
    for kv in list.kvs {
        let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        let group = obj["spec"]["group"].as_str().unwrap_or_default();
        let version = obj["spec"]["version"].as_str().unwrap_or_default();
        let (status, reason, message) = match api.aggregator.backend(group, version) {
            None => (
                "True",
                "Local",
                "Local APIServices are always available".to_string(),
            ),
            Some(b) => match discover(api, &b).await {
                Ok(doc) => {
                    *b.resources.lock().expect("backend discovery lock") = Some(doc);
                    ("True", "Passed", "all checks passed".to_string())
                }
                Err((reason, message)) => {
                    *b.resources.lock().expect("backend discovery lock") = None;
                    ("False", reason, message)
                }
            },
        };
        let current = obj["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Available");
        let same = current.is_some_and(|c| {
            c["status"] == status && c["reason"] == reason && c["message"] == message.as_str()
        });
        if !same {
            write_condition(api, &obj, status, reason, &message).await;
        }
    }
}

async fn write_condition(api: &ApiServer, obj: &Value, status: &str, reason: &str, message: &str) {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let r = Req {
        sub: Some("status".into()),
        ..Req::system(def(), "update", None, Some(name.to_string()))
    };
    for _ in 0..5 {
        let Ok((cur, old)) = get_object(api, &r).await else {
            return;
        };
        let mut new = old.clone();
        set_condition(&mut new, "Available", status, reason, message);
        match write_update(api, &r, &cur, &old, new, false).await {
            Ok(Attempt::Retry) => continue,
            Ok(Attempt::Done(_)) => return,
            Err(e) => {
                tracing::warn!(apiservice = name, error = %e.message, "availability: status write failed");
                return;
            }
        }
    }
}

/// The backend's discovery document, or (reason, message) of why not.
async fn discover(api: &ApiServer, b: &Backend) -> Result<Value, (&'static str, String)> {
    let path = format!("/apis/{}/{}", b.group, b.version);
    let url = format!("https://{}.{}.svc:{}{path}", b.service, b.namespace, b.port);
    let failing = |e: String| {
        (
            "FailedDiscoveryCheck",
            format!("failing or missing response from {url}: {e}"),
        )
    };
    let check = async {
        let io = proxy::connect(api, b).await.map_err(|e| {
            if e.contains("not found") {
                (
                    "ServiceNotFound",
                    format!("service/{} in {:?} is not present", b.service, b.namespace),
                )
            } else if e.contains("no endpoints") {
                (
                    "MissingEndpoints",
                    format!(
                        "endpoints for service/{} in {:?} have no addresses",
                        b.service, b.namespace
                    ),
                )
            } else {
                failing(e)
            }
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| failing(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get(&path)
            .header(
                http::header::HOST,
                format!("{}.{}.svc", b.service, b.namespace),
            )
            .header(http::header::ACCEPT, "application/json")
            .header(USER_HEADER, "system:kube-aggregator")
            .body(Empty::<Bytes>::new())
            .map_err(|e| failing(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| failing(e.to_string()))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_DISCOVERY)
            .collect()
            .await
            .map_err(|e| failing(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(failing(format!(
                "bad status from {url}: {}",
                status.as_u16()
            )));
        }
        serde_json::from_slice::<Value>(&body)
            .map_err(|e| failing(format!("not a discovery document: {e}")))
    };
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(failing("context deadline exceeded".into())))
}

/// A backend's `APIResourceList` as aggregated discovery's resources:
/// subresources (`name/sub`) under their resource.
pub fn aggregated_resources(list: &Value, group: &str, version: &str) -> Vec<Value> {
    let all = list["resources"].as_array().map_or(&[][..], Vec::as_slice);
    let mut out: Vec<Value> = Vec::new();
    for r in all {
        let name = r["name"].as_str().unwrap_or_default();
        if name.contains('/') {
            continue;
        }
        let kind = r["kind"].as_str().unwrap_or_default();
        let mut v = json!({
            "resource": name,
            "responseKind": {"group": group, "version": version, "kind": kind},
            "scope": if r["namespaced"] == true { "Namespaced" } else { "Cluster" },
            "singularResource": r["singularName"].as_str().filter(|s| !s.is_empty()).map_or_else(|| kind.to_lowercase(), String::from),
            "verbs": r["verbs"],
        });
        for k in ["shortNames", "categories"] {
            if r[k].as_array().is_some_and(|a| !a.is_empty()) {
                v[k] = r[k].clone();
            }
        }
        let subs: Vec<Value> = all
            .iter()
            .filter_map(|s| {
                let (parent, sub) = s["name"].as_str()?.split_once('/')?;
                (parent == name).then(|| {
                    json!({"subresource": sub,
                        "responseKind": {"group": group, "version": version, "kind": s["kind"]},
                        "verbs": s["verbs"]})
                })
            })
            .collect();
        v["subresources"] = json!(subs);
        out.push(v);
    }
    out
}
