//! `/logs/` on the node server: the node's `/var/log`, as the kubelet's
//! system log handler serves it (Go's file server: a `<pre>` listing of
//! links for a directory, the file itself otherwise), so that
//! `kubectl get --raw /api/v1/nodes/NAME/proxy/logs/` reads a node's logs.
//!
//! Unlike Go's file server, a symbolic link that leads out of the
//! directory is not followed: the handler reads system logs, not the node.

use std::path::{Component, Path as FsPath, PathBuf};

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// The directory served.
pub const LOG_DIR: &str = "/var/log";

pub fn routes() -> Router {
    Router::new()
        .route("/logs", get(|| async { Redirect::permanent("logs/") }))
        .route("/logs/", get(|req: Request| serve(String::new(), req)))
        .route(
            "/logs/{*path}",
            get(|Path(path): Path<String>, req: Request| serve(path, req)),
        )
}

async fn serve(rel: String, req: Request) -> Response {
    let trailing_slash = req.uri().path().ends_with('/');
    let found = match resolve(FsPath::new(LOG_DIR), &rel) {
        Some(p) => p,
        None => return (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    };
    let meta = match tokio::fs::metadata(&found).await {
        Ok(m) => m,
        Err(e) => return not_readable(&e),
    };
    if meta.is_dir() {
        if !trailing_slash {
            // Relative, as Go's file server redirects: it stays right behind
            // the API server's proxy prefix.
            let base = rel.rsplit('/').next().unwrap_or_default();
            return Redirect::permanent(&format!("{base}/")).into_response();
        }
        return match listing(&found).await {
            Ok(html) => {
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
            }
            Err(e) => not_readable(&e),
        };
    }
    match tokio::fs::File::open(&found).await {
        Ok(f) => (
            [
                (
                    header::CONTENT_TYPE,
                    "text/plain; charset=utf-8".to_string(),
                ),
                (header::CONTENT_LENGTH, meta.len().to_string()),
            ],
            Body::from_stream(tokio_util::io::ReaderStream::new(f)),
        )
            .into_response(),
        Err(e) => not_readable(&e),
    }
}

fn not_readable(e: &std::io::Error) -> Response {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
        }
        std::io::ErrorKind::PermissionDenied => {
            (StatusCode::FORBIDDEN, "403 Forbidden\n").into_response()
        }
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("500 Internal Server Error: {e}\n"),
        )
            .into_response(),
    }
}

/// `rel` under `root`, when it names something that is really there:
/// no `..`, and nothing that a symbolic link takes outside `root`.
fn resolve(root: &FsPath, rel: &str) -> Option<PathBuf> {
    let rel = FsPath::new(rel.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let root = root.canonicalize().ok()?;
    let found = root.join(rel).canonicalize().ok()?;
    found.starts_with(&root).then_some(found)
}

/// Go's directory listing: one link per entry, directories with a slash,
/// sorted by name.
async fn listing(dir: &FsPath) -> std::io::Result<String> {
    let mut entries = tokio::fs::read_dir(dir).await?;
    let mut names = Vec::new();
    while let Some(e) = entries.next_entry().await? {
        let mut name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().await.is_ok_and(|t| t.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    let mut html = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in names {
        let href: String = form_urlencoded::byte_serialize(name.as_bytes())
            .collect::<String>()
            .replace("%2F", "/")
            .replace('+', "%20");
        html.push_str(&format!("<a href=\"{href}\">{}</a>\n", escape(&name)));
    }
    html.push_str("</pre>\n");
    Ok(html)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("apt")).unwrap();
        std::fs::write(root.join("apt/history.log"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        assert!(resolve(root, "apt/history.log").is_some());
        assert!(resolve(root, "").is_some());
        assert!(resolve(root, "../etc/passwd").is_none());
        assert!(resolve(root, "apt/../../etc").is_none());
        assert!(
            resolve(root, "out/passwd").is_none(),
            "a link out of the directory"
        );
        assert!(resolve(root, "missing").is_none());
    }

    #[tokio::test]
    async fn lists_as_go_does() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("apt")).unwrap();
        std::fs::write(dir.path().join("a <b>.log"), "x").unwrap();
        let html = listing(dir.path()).await.unwrap();
        assert!(html.contains("<pre>\n<a href=\"a%20%3Cb%3E.log\">a &lt;b&gt;.log</a>\n<a href=\"apt/\">apt/</a>\n</pre>\n"), "{html}");
    }
}
