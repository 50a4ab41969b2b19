//! A tiny read-only OCI distribution registry on 127.0.0.1:<random port>,
//! serving [`OciImage`]s from memory, so that real CRI `PullImage` calls
//! can be tested without any network.
//!
//! Implements the pull side of the distribution spec only:
//! `GET /v2/`, `GET|HEAD /v2/<name>/manifests/<tag|digest>` (with
//! `Content-Type` and `Docker-Content-Digest`), `GET|HEAD
//! /v2/<name>/blobs/<digest>`; unknown names, manifests and blobs get 404
//! with the spec's error JSON. Plain HTTP: point containerd at it with
//! [`ContainerdBuilder::registry`](crate::ContainerdBuilder::registry).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::images::OciImage;

const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

#[derive(Default)]
struct Repository {
    /// tag -> manifest digest
    tags: HashMap<String, String>,
    /// digest -> blob (manifests, configs and layers alike)
    blobs: HashMap<String, Arc<Vec<u8>>>,
    /// digests that are manifests
    manifests: std::collections::HashSet<String>,
}

#[derive(Default)]
struct Store {
    repos: Mutex<HashMap<String, Repository>>,
    /// `METHOD path -> status` of every request, oldest first.
    requests: Mutex<Vec<String>>,
}

/// A running loopback registry; stops when dropped.
pub struct Registry {
    addr: SocketAddr,
    store: Arc<Store>,
    /// Dropping (or sending on) it stops the server task.
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Registry {
    /// Binds 127.0.0.1:0 and serves on the current tokio runtime.
    ///
    /// # Errors
    /// Fails when the listener cannot be bound.
    pub async fn start() -> Result<Registry> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the test registry on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::default());
        let app = Router::new()
            .route("/v2/", get(api_version))
            .route("/v2/{*rest}", get(serve))
            .with_state(store.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let server = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            if let Err(e) = server.await {
                eprintln!("skiff-tests: registry on {addr}: {e}");
            }
        });
        Ok(Registry {
            addr,
            store,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// Publishes `image` as `<repository>:<tag>` (for example
    /// `skiff/toolbox`, `1.0`). It is also reachable by manifest digest.
    pub fn push(&self, repository: &str, tag: &str, image: &OciImage) {
        let mut repos = self.store.repos.lock().unwrap_or_else(|e| e.into_inner());
        let repo = repos.entry(repository.to_string()).or_default();
        for (digest, data) in image.blobs() {
            repo.blobs
                .entry(digest.to_string())
                .or_insert_with(|| Arc::new(data.to_vec()));
        }
        repo.manifests.insert(image.manifest_digest().to_string());
        repo.tags
            .insert(tag.to_string(), image.manifest_digest().to_string());
    }

    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:<port>`, the registry host part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `127.0.0.1:<port>/<repository>:<tag>`.
    pub fn reference(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.host())
    }

    /// Every request served so far as `METHOD /path -> status`.
    pub fn requests(&self) -> Vec<String> {
        self.store
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops serving and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn api_version(State(store): State<Arc<Store>>, method: Method) -> Response<Body> {
    log(&store, &method, "/v2/", StatusCode::OK);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header("Docker-Distribution-API-Version", "registry/2.0")
        .body(Body::from("{}"))
        .expect("static response")
}

/// `/v2/<name>/manifests/<reference>` or `/v2/<name>/blobs/<digest>`;
/// `<name>` may contain slashes.
async fn serve(
    State(store): State<Arc<Store>>,
    method: Method,
    Path(rest): Path<String>,
) -> Response<Body> {
    let response = route(&store, &rest);
    log(&store, &method, &format!("/v2/{rest}"), response.status());
    response
}

fn route(store: &Store, rest: &str) -> Response<Body> {
    let repos = store.repos.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        let Some(repo) = repos.get(name) else {
            return error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
                name,
            );
        };
        let digest = if reference.starts_with("sha256:") {
            Some(reference.to_string()).filter(|d| repo.manifests.contains(d))
        } else {
            repo.tags.get(reference).cloned()
        };
        return match digest.and_then(|d| repo.blobs.get(&d).map(|b| (d, b.clone()))) {
            Some((digest, data)) => content(MANIFEST_MEDIA_TYPE, &digest, data),
            None => error(
                StatusCode::NOT_FOUND,
                "MANIFEST_UNKNOWN",
                "manifest unknown",
                reference,
            ),
        };
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        let Some(repo) = repos.get(name) else {
            return error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
                name,
            );
        };
        return match repo.blobs.get(digest) {
            Some(data) => content("application/octet-stream", digest, data.clone()),
            None => error(
                StatusCode::NOT_FOUND,
                "BLOB_UNKNOWN",
                "blob unknown to registry",
                digest,
            ),
        };
    }
    error(
        StatusCode::NOT_FOUND,
        "UNSUPPORTED",
        "the operation is unsupported",
        rest,
    )
}

/// A blob or manifest. For HEAD requests axum drops the body and keeps the
/// headers, Content-Length included.
fn content(media_type: &str, digest: &str, data: Arc<Vec<u8>>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, media_type)
        .header(header::CONTENT_LENGTH, data.len())
        .header(
            "Docker-Content-Digest",
            HeaderValue::from_str(digest).unwrap_or(HeaderValue::from_static("")),
        )
        .header("Docker-Distribution-API-Version", "registry/2.0")
        .body(Body::from(data.as_ref().clone()))
        .expect("valid response")
}

/// The distribution spec's error body.
fn error(status: StatusCode, code: &str, message: &str, detail: &str) -> Response<Body> {
    let body =
        serde_json::json!({ "errors": [{ "code": code, "message": message, "detail": detail }] });
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("valid response")
}

fn log(store: &Store, method: &Method, path: &str, status: StatusCode) {
    store
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(format!("{method} {path} -> {}", status.as_u16()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn http(addr: SocketAddr, method: &str, path: &str) -> (String, Vec<u8>) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        (
            String::from_utf8_lossy(&buf[..split]).to_lowercase(),
            buf[split + 4..].to_vec(),
        )
    }

    #[tokio::test]
    async fn serves_manifests_blobs_and_errors() {
        let image = crate::images::ImageBuilder::new("x/y:1")
            .layer(
                crate::images::LayerBuilder::new()
                    .file("hello", "hi", 0o644)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let reg = Registry::start().await.unwrap();
        reg.push("skiff/y", "1", &image);
        let (head, _) = http(reg.addr(), "GET", "/v2/").await;
        assert!(head.starts_with("http/1.1 200"));
        let (head, body) = http(reg.addr(), "GET", "/v2/skiff/y/manifests/1").await;
        assert!(head.contains(MANIFEST_MEDIA_TYPE));
        assert!(head.contains(&format!(
            "docker-content-digest: {}",
            image.manifest_digest()
        )));
        assert_eq!(body, image.manifest());
        let (head, body) = http(
            reg.addr(),
            "HEAD",
            &format!("/v2/skiff/y/manifests/{}", image.manifest_digest()),
        )
        .await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", image.manifest().len())),
            "{head}"
        );
        assert!(body.is_empty());
        let layer = &image.layer_digests()[0];
        let (_, body) = http(reg.addr(), "GET", &format!("/v2/skiff/y/blobs/{layer}")).await;
        assert_eq!(body, image.blob(layer).unwrap());
        let (head, body) = http(reg.addr(), "GET", "/v2/skiff/y/manifests/nope").await;
        assert!(head.starts_with("http/1.1 404"));
        assert!(String::from_utf8_lossy(&body).contains("MANIFEST_UNKNOWN"));
        let (head, _) = http(reg.addr(), "GET", "/v2/other/blobs/sha256:00").await;
        assert!(head.starts_with("http/1.1 404"));
        reg.shutdown().await;
    }
}
