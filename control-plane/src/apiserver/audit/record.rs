//! One request's audit events: what is known when it arrives, what the
//! authorizer decided, its body, and its answer (upstream's audit
//! context and `WithAudit` filter).
//!
//! # Guarantees
//! Bodies are held for the log only up to [`MAX_LOGGED_OBJECT`] bytes;
//! a larger request or response object is left out of the event, which
//! then carries `audit.k8s.io/truncated: "true"` (the annotation of
//! upstream's truncating backend). Streamed responses (watches, logs)
//! are never held: their events have no `responseObject`, as upstream's.
//!
//! # Caveats
//! For exec, attach and port-forward (HTTP upgrades) ResponseComplete is
//! written once the 101 answer is sent, not when the spliced stream ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};
use serde::Deserialize;
use serde_json::Value;

use super::annotations::Notes;
use super::event::{self, Event, Level, ObjectRef, ResponseStatus, Stage, UserInfo};
use super::policy::{Policy, RequestConfig};
use super::sink::Sink;
use crate::apiserver::request::{self, Query, Target};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{inflight, media_type, protobuf};
use crate::auth::Identity;

/// The request and response header carrying the audit ID.
pub const AUDIT_ID: &str = "audit-id";

/// The largest request or response object copied into an event.
pub const MAX_LOGGED_OBJECT: usize = 1024 * 1024;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Records one request; a no-op (but for the `Audit-Id` header) when the
/// policy does not select it.
pub struct Recorder {
    id: String,
    pending: Option<Box<Pending>>,
}

/// The event being built and where it goes.
struct Pending {
    event: Event,
    /// What the handler adds ([`super::annotate`]).
    notes: Notes,
    config: RequestConfig,
    sink: Sink,
    /// Watches and streams: ResponseStarted when the headers go, and
    /// ResponseComplete when the body ends.
    long_running: bool,
}

fn micro(t: jiff::Timestamp) -> String {
    format!("{t:.6}")
}

impl Recorder {
    pub(super) fn off(id: String) -> Recorder {
        Recorder { id, pending: None }
    }

    pub(super) fn begin<B>(
        id: String,
        policy: &Policy,
        sink: &Sink,
        req: &Request<B>,
        target: &Target,
        query: &Query,
        identity: Option<&Identity>,
    ) -> Recorder {
        let received = micro(jiff::Timestamp::now());
        let attrs = request::attributes(req.method(), target, query, req.uri().path());
        let anonymous = [String::from("system:unauthenticated")];
        let (user, uid, groups) = match identity {
            Some(i) => (i.user.as_str(), i.uid.as_str(), i.groups.as_slice()),
            None => ("system:anonymous", "", &anonymous[..]),
        };
        let config = policy.evaluate(user, groups, &attrs);
        if config.level == Level::None {
            return Recorder::off(id);
        }
        let path = match target {
            Target::Resource(p) => Some(p),
            _ => None,
        };
        let object_ref = path.map(|p| ObjectRef {
            resource: p.resource.clone(),
            namespace: p.namespace.clone().unwrap_or_default(),
            name: p.name.clone().unwrap_or_default(),
            api_group: p.group.clone(),
            api_version: p.version.clone(),
            subresource: p.subresource.clone().unwrap_or_default(),
            ..Default::default()
        });
        let peer = req
            .extensions()
            .get::<skiff_daemon::serve::RemoteAddr>()
            .map(|a| a.0.ip());
        let header = |h: header::HeaderName| {
            req.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let event = Event {
            kind: event::KIND,
            api_version: event::API_VERSION,
            level: config.level,
            audit_id: id.clone(),
            stage: Stage::RequestReceived,
            request_uri: req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default(),
            verb: attrs.verb,
            user: UserInfo {
                username: user.to_string(),
                uid: uid.to_string(),
                groups: groups.to_vec(),
            },
            source_ips: event::source_ips(req.headers(), peer),
            user_agent: header(header::USER_AGENT),
            object_ref,
            response_status: None,
            request_object: None,
            response_object: None,
            stage_timestamp: received.clone(),
            request_received_timestamp: received,
            annotations: Default::default(),
        };
        let mut p = Pending {
            event,
            notes: Notes::default(),
            config,
            sink: sink.clone(),
            long_running: inflight::long_running(req.method(), path, query),
        };
        p.emit(Stage::RequestReceived);
        Recorder {
            id,
            pending: Some(Box::new(p)),
        }
    }

    /// Where the handler's annotations go: run it in
    /// [`super::scoped`] with these (None when the request is not
    /// audited).
    pub fn notes(&self) -> Option<Notes> {
        self.pending.as_ref().map(|p| p.notes.clone())
    }

    /// What the authorizers decided (`authorization.k8s.io/*` annotations).
    pub fn authorized(&mut self, decision: &ApiResult<()>) {
        let Some(p) = self.pending.as_deref_mut() else {
            return;
        };
        let a = &mut p.event.annotations;
        match decision {
            Ok(()) => {
                a.insert(event::DECISION.into(), "allow".into());
            }
            Err(e) if e.code == 403 => {
                a.insert(event::DECISION.into(), "forbid".into());
                a.insert(event::REASON.into(), e.message.clone());
            }
            Err(_) => {}
        }
    }

    /// The request body: `requestObject` at Request and above; for creates
    /// and updates also the object's name, namespace, uid and
    /// resourceVersion where the URL had none (a create names its object
    /// in the body), as upstream's `LogRequestObject`.
    pub fn request_body(&mut self, body: &Bytes, content_type: &str) {
        let Some(p) = self.pending.as_deref_mut() else {
            return;
        };
        if body.is_empty() {
            return;
        }
        let names_object = matches!(p.event.verb.as_str(), "create" | "update");
        let ct = media_type(content_type);
        if p.config.level < Level::Request || body.len() > MAX_LOGGED_OBJECT {
            if p.config.level >= Level::Request {
                p.truncated();
            }
            if names_object {
                p.fill_ref(&object_meta(body, ct));
            }
            return;
        }
        let Some(mut v) = decode(body, ct) else {
            return;
        };
        if names_object {
            p.fill_ref(&Head::deserialize(&v).unwrap_or_default().metadata);
        }
        if p.config.omit_managed_fields {
            strip_managed_fields(&mut v);
        }
        p.event.request_object = Some(v);
    }

    /// The request failed with `e` (its Status is the response).
    pub fn failed(&mut self, e: &ApiError) {
        let Some(p) = self.pending.as_deref_mut() else {
            return;
        };
        let status = e.to_status();
        p.event.response_status = ResponseStatus::from_status(&status, e.code);
        if p.config.level >= Level::RequestResponse {
            p.event.response_object = Some(status);
        }
    }

    /// The handler panicked: the Panic stage, and nothing after it.
    pub fn panicked(&mut self, message: &str) {
        let Some(mut p) = self.pending.take() else {
            return;
        };
        p.event.response_status = Some(ResponseStatus {
            status: Some("Failure".into()),
            reason: Some("InternalError".into()),
            message: Some(format!("APIServer panic'd: {message}")),
            code: 500,
            ..Default::default()
        });
        p.emit(Stage::Panic);
    }

    /// Stamp the `Audit-Id` header and write the response's events
    /// (ResponseComplete, or ResponseStarted now and ResponseComplete when
    /// a streamed body ends).
    pub async fn respond(mut self, mut resp: Response<Body>) -> Response<Body> {
        if let Ok(v) = HeaderValue::from_str(&self.id) {
            resp.headers_mut().insert(AUDIT_ID, v);
        }
        let Some(mut p) = self.pending.take() else {
            return resp;
        };
        let code = resp.status().as_u16();
        if !p.long_running {
            let want_status = p.event.response_status.is_none() && code >= 400;
            let want_object =
                p.config.level >= Level::RequestResponse && p.event.response_object.is_none();
            if want_status || want_object {
                resp = p.read_response(resp, code).await;
            }
        }
        if p.event.response_status.is_none() {
            p.event.response_status = Some(ResponseStatus::code(code));
        }
        if !p.long_running {
            p.emit(Stage::ResponseComplete);
            return resp;
        }
        p.emit(Stage::ResponseStarted);
        let (parts, body) = resp.into_parts();
        let body = AuditedBody {
            inner: body,
            complete: Some(p),
        };
        Response::from_parts(parts, Body::new(body))
    }
}

impl Pending {
    fn emit(&mut self, stage: Stage) {
        for (k, v) in self.notes.take() {
            self.event.annotations.insert(k, v);
        }
        if self.config.omit_stages.contains(stage) {
            return;
        }
        self.event.stage = stage;
        self.event.stage_timestamp = micro(jiff::Timestamp::now());
        match serde_json::to_vec(&self.event) {
            Ok(mut line) => {
                line.push(b'\n');
                self.sink.send(line);
            }
            Err(e) => tracing::error!(error = %e, "encoding an audit event"),
        }
    }

    fn truncated(&mut self) {
        self.event
            .annotations
            .insert(event::TRUNCATED.into(), "true".into());
    }

    fn fill_ref(&mut self, m: &Meta) {
        let Some(r) = self.event.object_ref.as_mut() else {
            return;
        };
        for (field, value) in [
            (&mut r.name, &m.name),
            (&mut r.namespace, &m.namespace),
            (&mut r.uid, &m.uid),
            (&mut r.resource_version, &m.resource_version),
        ] {
            if field.is_empty() {
                field.clone_from(value);
            }
        }
    }

    /// Read an in-memory answer (at most [`MAX_LOGGED_OBJECT`]) for its
    /// Status and, at RequestResponse, its object; hand it on unchanged.
    async fn read_response(&mut self, resp: Response<Body>, code: u16) -> Response<Body> {
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(media_type)
            .unwrap_or_default()
            .to_string();
        if !matches!(ct.as_str(), "application/json" | PROTOBUF) {
            return resp;
        }
        match resp.body().size_hint().exact() {
            Some(n) if n <= MAX_LOGGED_OBJECT as u64 => {}
            // Too large to hold for the log.
            Some(_) => {
                if self.config.level >= Level::RequestResponse {
                    self.truncated();
                }
                return resp;
            }
            // A stream: never held.
            None => return resp,
        }
        let (parts, body) = resp.into_parts();
        let bytes = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) => {
                tracing::warn!(error = %e, "reading a response for the audit log");
                return crate::apiserver::error_response(&ApiError::internal(
                    "the server failed while writing this response",
                ));
            }
        };
        if let Some(mut v) = decode(&bytes, &ct) {
            if let Some(s) = ResponseStatus::from_status(&v, code) {
                self.event.response_status = Some(s);
            }
            if self.config.level >= Level::RequestResponse {
                if self.config.omit_managed_fields {
                    strip_managed_fields(&mut v);
                }
                self.event.response_object = Some(v);
            }
        }
        Response::from_parts(parts, Body::from(bytes))
    }
}

/// A streamed response body that writes ResponseComplete when it ends
/// (or the client goes away and it is dropped).
struct AuditedBody {
    inner: Body,
    complete: Option<Box<Pending>>,
}

impl Drop for AuditedBody {
    fn drop(&mut self) {
        if let Some(mut p) = self.complete.take() {
            p.emit(Stage::ResponseComplete);
        }
    }
}

impl hyper::body::Body for AuditedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body as JSON, whatever it came as; None when it does not decode.
fn decode(body: &[u8], media: &str) -> Option<Value> {
    match media {
        PROTOBUF => protobuf::decode(body).ok(),
        m if m.ends_with("yaml") => serde_saphyr::from_slice(body).ok(),
        // JSON and the JSON patch types.
        _ => serde_json::from_slice(body).ok(),
    }
}

/// Just the metadata of a body (JSON is not decoded further).
fn object_meta(body: &[u8], media: &str) -> Meta {
    let head = if media == "application/json" || media.is_empty() {
        serde_json::from_slice::<Head>(body).ok()
    } else {
        decode(body, media).and_then(|v| Head::deserialize(&v).ok())
    };
    head.unwrap_or_default().metadata
}

#[derive(Debug, Default, Deserialize)]
struct Head {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
}

/// `omitManagedFields`: drop `metadata.managedFields` of an object or of
/// each item of a list.
fn strip_managed_fields(v: &mut Value) {
    fn strip(o: &mut Value) {
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    }
    strip(v);
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_meta_from_any_body() {
        let json = br#"{"kind":"ConfigMap","metadata":{"name":"c","namespace":"d","resourceVersion":"7"},"data":{"k":"v"}}"#;
        let m = object_meta(json, "application/json");
        assert_eq!((m.name.as_str(), m.namespace.as_str()), ("c", "d"));
        assert_eq!(m.resource_version, "7");
        let m = object_meta(
            b"kind: ConfigMap\nmetadata:\n  name: from-yaml\n",
            "application/yaml",
        );
        assert_eq!(m.name, "from-yaml");
        assert_eq!(object_meta(b"not json", "application/json").name, "");
    }

    #[test]
    fn managed_fields_are_stripped_from_objects_and_lists() {
        let mut v = serde_json::json!({"metadata": {"name": "a", "managedFields": [{}]},
            "items": [{"metadata": {"managedFields": [{}], "name": "b"}}]});
        strip_managed_fields(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"metadata": {"name": "a"}, "items": [{"metadata": {"name": "b"}}]})
        );
    }
}
