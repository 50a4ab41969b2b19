//! `/metrics` under hostile requests: the series a client can create are
//! bounded (labels come from the matched route, not the URL), and no path
//! breaks the exposition format for the scrapers (label values escaped).

use crate::api;

use std::collections::HashSet;
use std::sync::Arc;

use api::{raw, TestServer};
use axum::body::Body;
use skiff_control_plane::apiserver::ApiServer;
use skiff_control_plane::auth::Identity;

/// A sample's labels, in the order written.
type Labels = Vec<(String, String)>;

/// One sample: metric name and labels.
type Sample = (String, Labels);

/// Reads the text exposition strictly: every line must be `# HELP name
/// text`, `# TYPE name type`, a final `# EOF`, or `name{label="value",...}
/// value`, with label values escaped as the format says (`\\`, `\"`, `\n`),
/// every sample belonging to a family declared by `# TYPE` before it, and no
/// series written twice. Any other line is an error naming it.
fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut families: Vec<(String, String)> = Vec::new();
    let mut seen = HashSet::new();
    let mut samples = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let bad = |why: &str| Err(format!("{why}: {line:?}"));
        if line == "# EOF" {
            if lines.peek().is_some() {
                return bad("# EOF before the end");
            }
            break;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !is_metric_name(name) {
                return bad("bad HELP name");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let known = [
                "counter",
                "gauge",
                "histogram",
                "summary",
                "untyped",
                "unknown",
            ];
            if !is_metric_name(name) || !known.contains(&kind) || parts.next().is_some() {
                return bad("bad TYPE line");
            }
            families.push((name.to_string(), kind.to_string()));
            continue;
        }
        let (name, labels, rest) = match sample(line) {
            Some(s) => s,
            None => return bad("not a sample"),
        };
        let mut fields = rest.split(' ');
        let value = fields.next().unwrap_or("");
        let number = matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok();
        let timestamp_ok = fields.next().is_none_or(|t| t.parse::<i64>().is_ok());
        if !number || !timestamp_ok || fields.next().is_some() {
            return bad("bad sample value");
        }
        let declared = families.iter().any(|(family, kind)| {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["", "_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name == format!("{family}{s}"))
        });
        if !declared {
            return bad("sample of no declared family");
        }
        if !seen.insert((name.clone(), labels.clone())) {
            return bad("series written twice");
        }
        samples.push((name, labels));
    }
    Ok(samples)
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name{labels} rest` -> (name, labels, rest after the one space).
fn sample(line: &str) -> Option<(String, Labels, &str)> {
    let end = line.find(['{', ' '])?;
    let name = &line[..end];
    if !is_metric_name(name) {
        return None;
    }
    let mut labels = Vec::new();
    let mut rest = &line[end..];
    if let Some(mut s) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = s.strip_prefix('}') {
                s = after;
                break;
            }
            let eq = s.find('=')?;
            let key = &s[..eq];
            if !is_label_name(key) {
                return None;
            }
            let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
            let mut value = String::new();
            let close = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        _ => return None,
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.to_string(), value));
            s = &s[eq + 1 + 1 + close + 1..];
            if let Some(after) = s.strip_prefix(',') {
                s = after;
            } else if !s.starts_with('}') {
                return None;
            }
        }
        rest = s;
    }
    Some((name.to_string(), labels, rest.strip_prefix(' ')?))
}

async fn scrape(api: &ApiServer) -> (usize, Vec<Sample>) {
    let text = api.metrics().render();
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("/metrics: {e}\n{text}"));
    (text.lines().count(), samples)
}

fn admin() -> Identity {
    Identity::new("admin", vec!["system:masters".into()])
}

/// Served in-process through `ApiServer::handle`, the entry point every
/// HTTP request takes.
async fn send(api: &Arc<ApiServer>, method: &str, path: &str, who: Option<Identity>) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .expect("request");
    api.handle(req, who).await.status().as_u16()
}

/// A path, method and (for the authenticated pass) identity that no route
/// serves, different for every `i`.
fn random_request(i: usize) -> (String, String) {
    let path = match i % 4 {
        0 => format!("/api/v1/r{i}"),
        1 => format!("/apis/g{i}.example.com/v1/namespaces/n{i}/x{i}"),
        2 => format!("/api/v1/namespaces/default/pods{i}/sub{i}"),
        _ => format!("/random/{i}"),
    };
    // Methods are tokens the client picks, too.
    let method = match i % 5 {
        0 => format!("M{i}"),
        _ => "GET".into(),
    };
    (method, path)
}

/// The test counted 20,000 requests; a few hundred distinct paths
/// show the bound as well. `SKIFF_METRICS_REQUESTS` raises the count (the
/// figures in the change's report were measured with 20000).
fn request_count() -> usize {
    std::env::var("SKIFF_METRICS_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_paths_leave_the_series_bounded() {
    let s = TestServer::start().await;
    let api = s.handle().api.clone();
    let n = request_count();
    let (lines_before, before) = scrape(&api).await;

    // Anonymous: answered 401 before any route is matched.
    for i in 0..n {
        let (method, path) = random_request(i);
        assert_eq!(
            send(&api, &method, &path, None).await,
            401,
            "{method} {path}"
        );
    }
    let (lines_anonymous, anonymous) = scrape(&api).await;
    println!(
        "{n} anonymous random-path requests: /metrics {lines_before} -> {lines_anonymous} lines, \
         {} -> {} series",
        before.len(),
        anonymous.len()
    );
    let unauthenticated: HashSet<_> = anonymous
        .iter()
        .filter(|(name, labels)| {
            name == "apiserver_request_total"
                && labels.iter().any(|(k, v)| k == "code" && v == "401")
        })
        .collect();
    assert_eq!(
        unauthenticated.len(),
        1,
        "401s are one label set: {unauthenticated:?}"
    );

    // Authenticated: 404s (and 405s) labelled by the route, not the URL.
    for i in 0..n {
        let (method, path) = random_request(i);
        send(&api, &method, &path, Some(admin())).await;
    }
    let (lines_after, after) = scrape(&api).await;
    let resources: HashSet<&str> = after
        .iter()
        .filter(|(name, _)| name == "apiserver_request_total")
        .flat_map(|(_, labels)| labels.iter())
        .filter(|(k, _)| k == "resource")
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        resources.iter().all(|r| !r.contains(char::is_numeric)),
        "resource labels come from the route: {resources:?}"
    );
    // The controllers and the scheduler in the fixture add series of their
    // own meanwhile (a bounded few); the requests above must add next to none.
    let grown = after.len().saturating_sub(before.len());
    println!(
        "then {n} authenticated: /metrics {lines_after} lines, {} series",
        after.len()
    );
    assert!(
        grown < 300,
        "{grown} new series after {n} random-path requests ({} -> {})",
        before.len(),
        after.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_with_quotes_and_braces_leaves_metrics_parseable() {
    let s = TestServer::start().await;
    let api = s.handle().api.clone();
    let evil = "/api/v1/inj\"},evil=\"1";
    // Over HTTPS without credentials, as the client sent it...
    let (code, _, _) = raw(
        &s.anonymous_client().await,
        "GET",
        evil,
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 401);
    // ...and authenticated, where the route is looked up.
    let (code, _, _) = raw(&s.client().await, "GET", evil, "application/json", vec![]).await;
    assert_eq!(code, 404);
    let (_, samples) = scrape(&api).await;
    assert!(
        samples
            .iter()
            .all(|(_, labels)| labels.iter().all(|(k, _)| k != "evil")),
        "a label injected through the path"
    );
}
