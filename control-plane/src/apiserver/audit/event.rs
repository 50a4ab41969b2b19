//! The `audit.k8s.io/v1` `Event` as upstream writes it: one JSON object a
//! line, fields in upstream's order, empty ones left out as Go's
//! `omitempty` leaves them out.

use std::collections::BTreeMap;
use std::net::IpAddr;

use http::HeaderMap;
use serde::Serialize;
use serde_json::Value;

/// How much of a request is recorded (upstream's `audit.Level`); the
/// order is the order of the variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Level {
    /// Not logged.
    None,
    /// Who, what and when; no bodies.
    Metadata,
    /// Metadata and the request body.
    Request,
    /// Metadata, the request body and the response body.
    RequestResponse,
}

impl Level {
    pub const ALL: [&'static str; 4] = ["None", "Metadata", "Request", "RequestResponse"];

    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "None" => Level::None,
            "Metadata" => Level::Metadata,
            "Request" => Level::Request,
            "RequestResponse" => Level::RequestResponse,
            _ => return None,
        })
    }
}

/// When in a request's life an event is written (upstream's `audit.Stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Stage {
    /// As soon as the request is authenticated, before it is served.
    RequestReceived,
    /// Long-running requests only: the headers are sent, the body streams.
    ResponseStarted,
    /// The response is complete.
    ResponseComplete,
    /// The handler panicked.
    Panic,
}

impl Stage {
    pub const ALL: [&'static str; 4] = [
        "RequestReceived",
        "ResponseStarted",
        "ResponseComplete",
        "Panic",
    ];

    pub fn parse(s: &str) -> Option<Stage> {
        Some(match s {
            "RequestReceived" => Stage::RequestReceived,
            "ResponseStarted" => Stage::ResponseStarted,
            "ResponseComplete" => Stage::ResponseComplete,
            "Panic" => Stage::Panic,
            _ => return None,
        })
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of stages (`omitStages`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages(u8);

impl Stages {
    pub fn with(self, s: Stage) -> Stages {
        Stages(self.0 | s.bit())
    }
    pub fn union(self, other: Stages) -> Stages {
        Stages(self.0 | other.0)
    }
    pub fn contains(self, s: Stage) -> bool {
        self.0 & s.bit() != 0
    }
}

/// One audit event.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: Level,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: Stage,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// RFC 3339 with microseconds (`metav1.MicroTime`).
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

pub const KIND: &str = "Event";
pub const API_VERSION: &str = "audit.k8s.io/v1";

/// Annotation keys upstream writes.
pub const DECISION: &str = "authorization.k8s.io/decision";
pub const REASON: &str = "authorization.k8s.io/reason";
/// Set when a request or response object was left out for its size
/// (upstream's truncate plugin sets the same key).
pub const TRUNCATED: &str = "audit.k8s.io/truncated";

#[derive(Debug, Clone, Serialize)]
pub struct UserInfo {
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// What the request is about (resource requests only).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The bounded part of a `meta/v1` `Status` upstream copies into
/// `responseStatus`: the code always, the rest for failures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResponseStatus {
    /// Always `{}` (Go does not omit an empty struct).
    pub metadata: Empty,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    pub code: u16,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Empty {}

impl ResponseStatus {
    pub fn code(code: u16) -> ResponseStatus {
        ResponseStatus {
            code,
            ..Default::default()
        }
    }

    /// The fields of a `Status` object, or None when `v` is not one.
    pub fn from_status(v: &Value, code: u16) -> Option<ResponseStatus> {
        if v.get("kind").and_then(Value::as_str) != Some("Status") {
            return None;
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Some(ResponseStatus {
            metadata: Empty {},
            status: s("status"),
            message: s("message"),
            reason: s("reason"),
            details: v.get("details").cloned(),
            code: v
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(code),
        })
    }
}

/// The client's addresses as upstream's `SourceIPs` lists them: the
/// `X-Forwarded-For` chain, then `X-Real-Ip` unless already in it, then
/// the connection's peer unless it is the chain's last. The headers are
/// the client's word; the peer address is the one fact.
pub fn source_ips(headers: &HeaderMap, peer: Option<IpAddr>) -> Vec<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut ips: Vec<IpAddr> = header("x-forwarded-for")
        .map(|h| {
            h.split(',')
                .filter_map(|p| p.trim().parse::<IpAddr>().ok())
                .collect()
        })
        .unwrap_or_default();
    if let Some(ip) = header("x-real-ip").and_then(|h| h.trim().parse::<IpAddr>().ok()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    if let Some(ip) = peer.map(|p| p.to_canonical()) {
        if ips.last() != Some(&ip) {
            ips.push(ip);
        }
    }
    ips.iter().map(|ip| ip.to_canonical().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ips_as_upstream() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(source_ips(&h, Some(peer)), ["127.0.0.1"]);
        h.insert(
            "x-forwarded-for",
            "10.0.0.1, bogus, 10.0.0.2".parse().unwrap(),
        );
        h.insert("x-real-ip", "10.0.0.2".parse().unwrap());
        assert_eq!(
            source_ips(&h, Some(peer)),
            ["10.0.0.1", "10.0.0.2", "127.0.0.1"]
        );
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert_eq!(source_ips(&h, Some(mapped)), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn status_fields_and_empty_metadata() {
        let s = ResponseStatus::from_status(
            &serde_json::json!({"kind": "Status", "status": "Failure", "message": "m",
                "reason": "NotFound", "code": 404}),
            500,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"metadata": {}, "status": "Failure", "message": "m",
                "reason": "NotFound", "code": 404})
        );
        assert_eq!(
            serde_json::to_string(&ResponseStatus::code(200)).unwrap(),
            r#"{"metadata":{},"code":200}"#
        );
        assert!(ResponseStatus::from_status(&serde_json::json!({"kind": "Pod"}), 200).is_none());
    }
}
