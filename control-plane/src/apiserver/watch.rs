//! Watch streams: newline-delimited `WatchEvent`s from a store watch,
//! filtered by selectors, with bookmarks and upstream's 410 Gone handling.
//!
//! A watch from `resourceVersion` N replays every change after N from the
//! store's revision log, so a client that reconnects after a server restart
//! with its last seen version loses nothing. A version older than the
//! compaction point answers one `ERROR` event with a 410 `Expired` status,
//! which tells clients (kube-rs, client-go reflectors) to re-list.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderValue, Response};
use serde_json::{json, Value};

use super::convert;
use super::handlers::selectors;
use super::objects::meta_mut;
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::{options, order, table, ApiServer, Req};
use crate::store::{self, Event};

/// How often an idle watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

struct Encoder {
    def: &'static ResourceDef,
    table: bool,
    /// Objects as `PartialObjectMetadata` (metadata watches).
    metadata: bool,
    include: String,
    sent_columns: bool,
}

impl Encoder {
    fn event(&mut self, ty: &str, obj: Value) -> Bytes {
        let object = if self.table && ty != "ERROR" && ty != "BOOKMARK" {
            let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"].clone()});
            // Column definitions travel with the first event only, as upstream.
            let t = table::table(
                self.def,
                std::slice::from_ref(&obj),
                meta,
                &self.include,
                !self.sent_columns,
            );
            self.sent_columns = true;
            t
        } else if self.metadata && ty != "ERROR" {
            table::partial_metadata(&obj)
        } else {
            obj
        };
        // `type` first, as upstream's WatchEvent.
        let mut line = format!(r#"{{"type":"{ty}","object":"#).into_bytes();
        line.extend_from_slice(&order::to_vec(&object));
        line.extend_from_slice(b"}\n");
        Bytes::from(line)
    }

    fn bookmark(&mut self, rev: i64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj =
            json!({"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": meta});
        self.event("BOOKMARK", obj)
    }
}

pub(crate) async fn serve(api: &Arc<ApiServer>, r: &Req) -> ApiResult<Response<Body>> {
    let (ls, fs) = selectors(r)?;
    let def = r.def;
    let prefix = match (def.namespaced, r.ns.as_deref(), fs.name()) {
        (true, Some(ns), Some(name)) => format!("{}{name}", def.prefix(Some(ns))),
        (false, _, Some(name)) => format!("{}{name}", def.prefix(None)),
        (_, ns, _) => def.prefix(ns),
    };
    // Without selectors or printing, events are spliced from the stored
    // bytes: no parse per watcher (hundreds of watchers share one change).
    let raw_ok = !convert::converts(def)
        && ls.is_empty()
        && fs.is_empty()
        && !table::wants_table(r.accept())
        && !table::wants_metadata(r.accept());
    let matches = move |o: &Value| ls.matches(o) && fs.matches(o);
    let rv = options::resource_version(&r.query)?;
    let send_initial = r.query.flag("sendInitialEvents");
    let bookmarks = r.query.flag("allowWatchBookmarks");
    let timeout = r
        .query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let mut enc = Encoder {
        def,
        table: table::wants_table(r.accept()),
        metadata: table::wants_metadata(r.accept()),
        include: r
            .query
            .get("includeObject")
            .unwrap_or("Metadata")
            .to_string(),
        sent_columns: false,
    };

    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    // Unset or "0" means "start from now, with the current state as ADDED
    // events"; sendInitialEvents asks for the same and a bookmark after it.
    let mut initial: Vec<Value> = Vec::new();
    let start_rev = if rv.is_none_or(|v| v == 0) || send_initial {
        let list = api
            .store
            .list(&prefix, None, 0, None)
            .await
            .map_err(ApiError::from)?;
        for kv in list.kvs {
            if let Some(o) = convert::decode(def, &kv.value, kv.mod_revision) {
                if matches(&o) {
                    initial.push(o);
                }
            }
        }
        initial = convert::served(api, def, initial).await?;
        list.revision
    } else {
        rv.unwrap_or_default()
    };
    let stream = match api.store.watch(&prefix, start_rev).await {
        Ok(s) => Some(s),
        Err(store::Error::Compacted {
            requested,
            compacted,
        }) => {
            let status = ApiError::gone(format!(
                "too old resource version: {requested} ({compacted})"
            ))
            .to_status();
            let _ = tx.send(Ok(enc.event("ERROR", status))).await;
            None
        }
        Err(store::Error::FutureRevision { .. }) => {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {start_rev}"),
            ));
        }
        Err(e) => return Err(ApiError::from(e)),
    };

    if let Some(mut stream) = stream {
        let api = api.clone();
        tokio::spawn(async move {
            let _guard = api.metrics.watcher();
            let mut shutdown = api.shutdown.clone();
            for o in initial {
                if tx.send(Ok(enc.event("ADDED", o))).await.is_err() {
                    return;
                }
            }
            let mut last = start_rev;
            if send_initial && bookmarks && tx.send(Ok(enc.bookmark(last, true))).await.is_err() {
                return;
            }
            let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(365 * 86400)));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(BOOKMARK_EVERY);
            tick.tick().await;
            loop {
                let chunk = tokio::select! {
                    ev = stream.next() => match ev {
                        Some(Ok(ev)) => {
                            last = ev.revision();
                            match raw_ok.then(|| raw_event(&ev)).flatten() {
                                Some(line) => Some(line),
                                None => match translate(def, &ev, &matches) {
                                    None => None,
                                    Some((ty, o)) => match convert::served_one(&api, def, o).await {
                                        Ok(o) => Some(enc.event(ty, o)),
                                        Err(e) => {
                                            let _ = tx.send(Ok(enc.event("ERROR", e.to_status()))).await;
                                            return;
                                        }
                                    },
                                },
                            }
                        }
                        Some(Err(store::Error::Compacted { requested, compacted })) => {
                            let st = ApiError::gone(format!("too old resource version: {requested} ({compacted})")).to_status();
                            let _ = tx.send(Ok(enc.event("ERROR", st))).await;
                            return;
                        }
                        Some(Err(e)) => {
                            let st = ApiError::internal(e.to_string()).to_status();
                            let _ = tx.send(Ok(enc.event("ERROR", st))).await;
                            return;
                        }
                        None => return,
                    },
                    _ = tick.tick(), if bookmarks => Some(enc.bookmark(last, false)),
                    _ = &mut deadline => return,
                    _ = shutdown.changed() => return,
                    _ = tx.closed() => return,
                };
                if let Some(c) = chunk {
                    if tx.send(Ok(c)).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

/// A watch line built from stored bytes (no selector to apply).
fn raw_event(ev: &Event) -> Option<Bytes> {
    let (ty, value, rev) = match ev {
        Event::Put { kv, prev } => (
            if prev.is_some() { "MODIFIED" } else { "ADDED" },
            &kv.value,
            kv.mod_revision,
        ),
        Event::Delete { prev, revision } => ("DELETED", &prev.value, *revision),
    };
    let obj = super::objects::splice_resource_version(value, rev)?;
    let mut line = Vec::with_capacity(obj.len() + 32);
    line.extend_from_slice(format!(r#"{{"type":"{ty}","object":"#).as_bytes());
    line.extend_from_slice(&obj);
    line.extend_from_slice(b"}\n");
    Some(Bytes::from(line))
}

/// Store event -> watch event type and object, applying the selector the
/// way upstream does: an object that stops matching is DELETED for this
/// watcher, one that starts matching is ADDED.
fn translate(
    def: &ResourceDef,
    ev: &Event,
    matches: &dyn Fn(&Value) -> bool,
) -> Option<(&'static str, Value)> {
    match ev {
        Event::Put { kv, prev } => {
            let obj = convert::decode(def, &kv.value, kv.mod_revision)?;
            let was = prev
                .as_ref()
                .and_then(|p| convert::decode(def, &p.value, p.mod_revision))
                .map(|p| matches(&p));
            let is = matches(&obj);
            match (was, is) {
                (None, true) | (Some(false), true) => Some(("ADDED", obj)),
                (Some(true), true) => Some(("MODIFIED", obj)),
                (Some(true), false) => Some(("DELETED", obj)),
                _ => None,
            }
        }
        Event::Delete { prev, revision } => {
            let mut obj = convert::decode(def, &prev.value, prev.mod_revision)?;
            if !matches(&obj) {
                return None;
            }
            meta_mut(&mut obj).insert("resourceVersion".into(), json!(revision.to_string()));
            Some(("DELETED", obj))
        }
    }
}
