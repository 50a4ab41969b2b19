//! An admission webhook server for the webhook tests: on loopback HTTPS
//! with a CA of its own ([`serve`], the API server tests), or on any
//! listener with a given certificate ([`spawn`], the test image's
//! `admission-webhook` binary, which includes this file). Each path is
//! one webhook's behaviour; every review received is kept for the test
//! to inspect.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

pub struct WebhookServer {
    pub port: u16,
    /// The CA's certificate, base64 of the PEM (a `caBundle`).
    pub ca_bundle: String,
    calls: Calls,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebhookServer {
    /// (path, review request) of every call so far.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }

    /// The requests `path` has received.
    pub fn calls_to(&self, path: &str) -> Vec<Value> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

fn allowed(uid: &Value) -> Value {
    json!({"uid": uid, "allowed": true})
}

fn reviewed(response: Value) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
            .to_string(),
    )
}

fn patch(ops: Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(ops.to_string())
}

fn converted(response: Value) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": response})
            .to_string(),
    )
}

/// The conversion of the conversion tests' Gauge kind: `spec.size` (a
/// string) at v1 is `spec.count` (an integer) at v2.
fn convert_gauges(request: &Value) -> Vec<Value> {
    let to = request["desiredAPIVersion"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for o in request["objects"].as_array().into_iter().flatten() {
        let mut o = o.clone();
        o["apiVersion"] = json!(to);
        if let Some(spec) = o["spec"].as_object_mut() {
            if to.ends_with("/v2") {
                let size = spec.remove("size");
                let n = size
                    .as_ref()
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse::<i64>().ok());
                spec.insert("count".into(), json!(n.unwrap_or(0)));
            } else {
                let count = spec.remove("count").and_then(|c| c.as_i64()).unwrap_or(0);
                spec.insert("size".into(), json!(count.to_string()));
            }
        }
        out.push(o);
    }
    out
}

/// The answer of the webhook at `path` to `request`:
/// - `/mutate`: labels the object `webhook.test.skiff.io/mutated: "true"`.
/// - `/annotate`: annotates it with how many labels it has.
/// - `/validate`: denies objects labelled `deny`, deletes of objects
///   labelled `protect`; warns about everything else.
/// - `/garbage`: not JSON. `/bad-patch`: a patch that cannot apply.
///   `/patch`: a patch (from a validating webhook, where it is refused).
///   `/huge`: a 100 MiB answer. `/slow`: answers after 30 s.
/// - `/convert`: ConversionReviews of Gauges ([`convert_gauges`]);
///   `/convert-fail` refuses them, `/convert-uid` answers another uid.
async fn answer(path: &str, request: &Value) -> Bytes {
    let uid = &request["uid"];
    let obj = &request["object"];
    match path {
        "/convert" => converted(
            json!({"uid": uid, "result": {"status": "Success"}, "convertedObjects": convert_gauges(request)}),
        ),
        "/convert-fail" => converted(
            json!({"uid": uid, "result": {"status": "Failure", "message": "this webhook converts nothing"}}),
        ),
        "/convert-uid" => converted(
            json!({"uid": "not-the-request-uid", "result": {"status": "Success"}, "convertedObjects": convert_gauges(request)}),
        ),
        "/mutate" => {
            let ops = if obj["metadata"]["labels"].is_object() {
                json!([{"op": "add", "path": "/metadata/labels/webhook.test.skiff.io~1mutated", "value": "true"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"webhook.test.skiff.io/mutated": "true"}}])
            };
            reviewed(
                json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch(ops)}),
            )
        }
        "/annotate" => {
            let n = obj["metadata"]["labels"].as_object().map_or(0, |l| l.len());
            let ops = if obj["metadata"]["annotations"].is_object() {
                json!([{"op": "add", "path": "/metadata/annotations/webhook.test.skiff.io~1labels", "value": n.to_string()}])
            } else {
                json!([{"op": "add", "path": "/metadata/annotations", "value": {"webhook.test.skiff.io/labels": n.to_string()}}])
            };
            reviewed(
                json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch(ops)}),
            )
        }
        "/validate" => {
            let old = &request["oldObject"];
            if !obj["metadata"]["labels"]["deny"].is_null() {
                reviewed(json!({"uid": uid, "allowed": false,
                    "status": {"code": 403, "reason": "Forbidden", "message": "objects labelled deny are not allowed"}}))
            } else if request["operation"] == "DELETE"
                && !old["metadata"]["labels"]["protect"].is_null()
            {
                reviewed(
                    json!({"uid": uid, "allowed": false, "status": {"code": 422, "message": "this object is protected"}}),
                )
            } else {
                reviewed(
                    json!({"uid": uid, "allowed": true, "warnings": ["seen by the validating webhook"]}),
                )
            }
        }
        "/garbage" => Bytes::from_static(b"this is not JSON"),
        "/bad-patch" => reviewed(
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": patch(json!([{"op": "remove", "path": "/no/such/field"}]))}),
        ),
        "/patch" => reviewed(
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": patch(json!([{"op": "add", "path": "/metadata/labels", "value": {}}]))}),
        ),
        "/huge" => Bytes::from(vec![b' '; 100 << 20]),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            reviewed(allowed(uid))
        }
        _ => reviewed(allowed(uid)),
    }
}

/// (path, review request) of every call.
pub type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// Answer reviews on `listener` with `tls` until dropped, keeping every
/// request in `calls`.
pub async fn spawn(listener: tokio::net::TcpListener, tls: rustls::ServerConfig, calls: Calls) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        let kept = calls.clone();
        tokio::spawn(async move {
            let Ok(io) = acceptor.accept(tcp).await else {
                return;
            };
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let request = review["request"].clone();
                        kept.lock().unwrap().push((path.clone(), request.clone()));
                        let out = answer(&path, &request).await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(out)))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), svc)
                .await;
        });
    }
}

/// A new CA and a serving certificate it signed for `names` (IPs or DNS
/// names): (CA PEM, certificate PEM, key PEM).
pub fn certificate(names: &[&str]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test webhook CA");
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// TLS serving `cert_pem` with `key_pem`.
pub fn server_config(cert_pem: &str, key_pem: &str) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject as _;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
    rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate and key match")
}

/// Serve on 127.0.0.1 with a certificate for 127.0.0.1 and `dns_names`.
pub async fn serve(dns_names: &[&str]) -> WebhookServer {
    let mut names = vec!["127.0.0.1"];
    names.extend(dns_names);
    let (ca_pem, cert, key) = certificate(&names);
    let tls = server_config(&cert, &key);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls: Calls = Arc::default();
    let task = tokio::spawn(spawn(listener, tls, calls.clone()));
    WebhookServer {
        port,
        ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca_pem),
        calls,
        task,
    }
}
