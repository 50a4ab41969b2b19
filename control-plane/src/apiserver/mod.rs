//! The Kubernetes REST API over the store.
//!
//! # Layout
//! - [`request`]: URL -> what is asked (discovery, resource, non-resource)
//! - [`resources`]: the table of served kinds
//! - [`handlers`]: the generic verbs (get/list/create/update/patch/delete)
//!   over the store; they never test for a kind
//! - [`strategy`]: each kind's rules (defaults, validation, allocation,
//!   deletion, its own subresources, table columns), reached from its row
//! - [`model`]: each kind's typed model (canonical JSON, unknown fields)
//! - [`crd`]: CustomResourceDefinitions and the kinds they define
//! - [`admission`]: the built-in admission plugins around every write;
//!   [`storageadmission`]: the storage ones (default class, protection
//!   finalizers, resize)
//!   and [`quota`]: ResourceQuota admission (checks and charges creates)
//! - [`subresources`]: generic status and scale, dispatch to the kinds' own
//! - [`nodeproxy`]: pods/log, exec, attach, portforward proxied to the node
//! - [`watch`]: watch streams with bookmarks and 410 Gone
//! - [`patch`], [`defaults`], [`validation`], [`selectors`], [`convert`]:
//!   object semantics several kinds share
//! - [`table`]: server-side printing; [`discovery`], [`openapi`]: documents
//! - [`health`]: /healthz, /livez, /readyz; [`bootstrap`]: first-start objects
//! - [`audit`]: the audit log (policy, events, the log file)

pub mod admission;
pub mod admission_request;
pub mod aggregator;
pub mod audit;
pub mod authenticate;
pub mod bootstrap;
pub mod cel;
pub mod convert;
pub mod crd;
pub mod defaults;
pub mod discovery;
pub mod fieldmanager;
pub mod handlers;
pub mod health;
pub mod httpproxy;
pub mod inflight;
pub mod ipalloc;
pub mod limitranger;
pub mod matching;
pub mod model;
pub mod namespacecache;
pub mod nodeproxy;
pub mod objects;
pub mod openapi;
pub mod options;
pub mod order;
pub mod patch;
pub mod peers;
pub mod podsecurity;
pub mod policy;
pub mod priority;
pub mod protobuf;
pub mod quota;
pub mod request;
pub mod resources;
pub mod review;
pub mod runtimeclass;
pub mod selectors;
pub mod server_side_apply;
pub mod serviceaccounts;
pub mod status;
pub mod storageadmission;
pub mod strategy;
pub mod subresources;
pub mod table;
pub mod tokenreview;
pub mod validation;
pub mod watch;
pub mod webhook;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use futures::FutureExt;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::auth::{self, node, rbac::Rbac, Attributes, Authenticator, Identity};
use crate::metrics::{Metrics, RequestKind};
use crate::store::Store;
use request::{Query, Target};
use resources::ResourceDef;
use status::{ApiError, ApiResult};

/// Request bodies larger than this get 413 (upstream's limit is 3 MiB too).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the API server needs to know beyond the store.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// ClusterIPs come from here.
    pub service_cidr: ipalloc::Cidr,
    /// Address and port pods reach the API on: the `kubernetes` service's
    /// endpoints.
    pub advertise: Option<(std::net::IpAddr, u16)>,
    /// What the DefaultTolerationSeconds admission gives new pods.
    pub default_toleration_seconds: admission::DefaultTolerationSeconds,
    /// How long events live after their last write (`--event-ttl`).
    pub event_ttl: Option<std::time::Duration>,
    /// Requests in flight and their deadline.
    pub inflight: inflight::Inflight,
    /// The audit log (off by default).
    pub audit: audit::Auditor,
}

/// The API server: shared by every connection.
pub struct ApiServer {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) authn: Authenticator,
    pub(crate) rbac: Arc<Rbac>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) ips: ipalloc::Allocator,
    pub(crate) advertise: Option<(std::net::IpAddr, u16)>,
    pub(crate) default_toleration_seconds: admission::DefaultTolerationSeconds,
    pub(crate) event_ttl: Option<std::time::Duration>,
    inflight: inflight::Inflight,
    pub(crate) audit: audit::Auditor,
    /// Namespaces found active, and when (namespace lifecycle admission);
    /// deleted ones, and when (see [`ApiServer::note_namespace_active`]).
    active_namespaces: std::sync::Mutex<std::collections::HashMap<String, NamespaceSeen>>,
    /// Flips to true on shutdown; watch streams end when it does.
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    /// TLS towards node servers (the kubelet-client certificate); set once
    /// at start by [`ApiServer::set_kubelet_client`].
    pub(crate) node_tls: std::sync::OnceLock<Arc<rustls::ClientConfig>>,
    /// The components running beside the server (`componentstatuses`).
    pub components: Arc<health::ComponentHealth>,
    /// The cluster CA bundle (PEM) served to joining nodes at
    /// `/cacerts`; set once at start by [`ApiServer::set_cluster_ca`].
    pub(crate) cluster_ca: std::sync::OnceLock<String>,
    /// What servers joining through this one are given; set once at start
    /// by [`ApiServer::set_server_join`] when it runs a managed etcd
    /// member.
    pub(crate) server_join: std::sync::OnceLock<crate::store::managed::join::Source>,
    /// Signs and verifies ServiceAccount tokens; set once at start by
    /// [`ApiServer::set_service_account_tokens`].
    pub(crate) sa_tokens: std::sync::OnceLock<Arc<auth::satoken::Tokens>>,
    /// OIDC issuers trusted for people; set once at start by
    /// [`ApiServer::set_oidc`].
    pub(crate) oidc: std::sync::OnceLock<Arc<auth::oidc::Oidc>>,
    /// Pod Security admission's defaults and exemptions; set once at start
    /// by [`ApiServer::set_pod_security`].
    pub(crate) pod_security: std::sync::OnceLock<podsecurity::Config>,
    /// The custom kinds served from CustomResourceDefinitions.
    pub(crate) crds: crd::Registry,
    /// The admission webhooks configured.
    pub(crate) webhooks: webhook::Webhooks,
    /// The ValidatingAdmissionPolicies in force.
    pub(crate) policies: policy::Policies,
    /// The namespaces, for dynamic admission.
    pub(crate) namespaces: namespacecache::NamespaceCache,
    /// The APIServices: aggregated group versions and their backends.
    pub aggregator: aggregator::Aggregator,
}

/// What namespace lifecycle admission last learnt of a namespace.
enum NamespaceSeen {
    Active(Instant),
    Deleted(Instant),
}

/// A resource request after routing and authentication.
#[derive(Clone)]
pub struct Req {
    pub def: &'static ResourceDef,
    pub ns: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: Query,
    pub headers: HeaderMap,
    pub identity: Identity,
    pub attrs: Attributes,
}

impl Req {
    /// The server's own request to `verb` an object of `def` (bootstrap
    /// objects, the CRD cleanup), as `system:apiserver` in
    /// `system:masters`.
    pub(crate) fn system(
        def: &'static ResourceDef,
        verb: &str,
        ns: Option<String>,
        name: Option<String>,
    ) -> Req {
        Req {
            def,
            ns,
            name,
            sub: None,
            query: Query::default(),
            // Its writes are recorded in managedFields under upstream's name.
            headers: HeaderMap::from_iter([(
                header::USER_AGENT,
                header::HeaderValue::from_static("kube-apiserver"),
            )]),
            identity: Identity::new("system:apiserver", vec!["system:masters".into()]),
            attrs: crate::auth::Attributes {
                verb: verb.into(),
                resource_request: true,
                ..Default::default()
            },
        }
    }

    /// Whether the request is about the main resource `plural` of
    /// `group` ("" for core), not one of its subresources: what an
    /// admission plugin checks before it looks at the object.
    pub fn is_resource(&self, group: &str, plural: &str) -> bool {
        self.attrs.group == group
            && self.attrs.resource == plural
            && self.attrs.subresource.is_empty()
    }
    pub fn key(&self) -> String {
        self.def
            .key(self.ns.as_deref(), self.name.as_deref().unwrap_or_default())
    }
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
    pub fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }
    pub fn accept(&self) -> &str {
        self.headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    pub fn node(&self) -> Option<&str> {
        self.identity.node_name()
    }
}

impl ApiServer {
    /// Build the server over `store`; call [`ApiServer::start_background`]
    /// to load RBAC and bootstrap objects.
    pub fn new(
        store: Arc<dyn Store>,
        cfg: ApiConfig,
        authn: Authenticator,
        metrics: Arc<Metrics>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Self> {
        Arc::new(ApiServer {
            store,
            authn,
            rbac: Rbac::new(),
            ips: ipalloc::Allocator::new(cfg.service_cidr),
            advertise: cfg.advertise,
            default_toleration_seconds: cfg.default_toleration_seconds,
            event_ttl: cfg.event_ttl,
            inflight: cfg.inflight,
            audit: cfg.audit,
            active_namespaces: Default::default(),
            shutdown,
            node_tls: Default::default(),
            components: Default::default(),
            cluster_ca: Default::default(),
            server_join: Default::default(),
            sa_tokens: Default::default(),
            oidc: Default::default(),
            pod_security: Default::default(),
            crds: Default::default(),
            webhooks: webhook::Webhooks::new(metrics.webhooks()),
            policies: Default::default(),
            namespaces: Default::default(),
            aggregator: Default::default(),
            metrics,
        })
    }

    /// Serve `pem` at `/cacerts` (unauthenticated): joining nodes read it
    /// and check it against their join token's hash before they trust it.
    pub fn set_cluster_ca(&self, pem: &str) {
        let _ = self.cluster_ca.set(pem.to_string());
    }

    /// Let servers join through this one (`POST /skiff/v1/servers`).
    pub fn set_server_join(&self, source: crate::store::managed::join::Source) {
        let _ = self.server_join.set(source);
    }

    /// Issue and accept ServiceAccount tokens with `tokens` (TokenRequest,
    /// their authentication, the issuer's discovery documents).
    pub fn set_service_account_tokens(&self, tokens: Arc<auth::satoken::Tokens>) {
        let _ = self.sa_tokens.set(tokens);
    }

    /// Accept ID tokens of `oidc`'s issuers (bearer JWTs whose `iss`
    /// names one of them).
    pub fn set_oidc(&self, oidc: Arc<auth::oidc::Oidc>) {
        let _ = self.oidc.set(oidc);
    }

    /// First-start objects, allocator state, and the RBAC watch.
    ///
    /// # Errors
    /// The store cannot be read or written.
    pub async fn start_background(self: &Arc<Self>) -> ApiResult<()> {
        bootstrap::run(self).await?;
        self.rbac.relist(self.store.as_ref()).await?;
        tokio::spawn(crd::establish::run(self.clone()));
        tokio::spawn(webhook::run(self.clone()));
        tokio::spawn(policy::run(self.clone()));
        tokio::spawn(aggregator::run(self.clone()));
        let api = self.clone();
        tokio::spawn(async move {
            api.namespaces
                .run(api.store.as_ref(), api.shutdown.clone())
                .await
        });
        tokio::spawn(
            self.rbac
                .clone()
                .sync(self.store.clone(), self.shutdown.clone()),
        );
        Ok(())
    }

    pub(crate) fn namespace_recently_active(&self, ns: &str) -> bool {
        let m = self.active_namespaces.lock().expect("namespace cache lock");
        matches!(m.get(ns), Some(NamespaceSeen::Active(t)) if t.elapsed() < std::time::Duration::from_secs(1))
    }

    /// `ns` was found active. A namespace deleted in the last 30 s is
    /// not cached (lookups stay live), so that a lookup that raced its
    /// delete cannot mark it active again (upstream's forceLiveLookup).
    pub(crate) fn note_namespace_active(&self, ns: &str) {
        let mut m = self.active_namespaces.lock().expect("namespace cache lock");
        if matches!(m.get(ns), Some(NamespaceSeen::Deleted(t)) if t.elapsed() < std::time::Duration::from_secs(30))
        {
            return;
        }
        if m.len() > 10_000 {
            m.clear();
        }
        m.insert(ns.to_string(), NamespaceSeen::Active(Instant::now()));
    }

    pub(crate) fn forget_namespace(&self, ns: &str) {
        self.active_namespaces
            .lock()
            .expect("namespace cache lock")
            .insert(ns.to_string(), NamespaceSeen::Deleted(Instant::now()));
    }

    /// The store this server writes (tests compact it to provoke 410s).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serve one request. `peer` is the identity of a verified client
    /// certificate, if the connection presented one.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Body>,
        peer: Option<Identity>,
    ) -> Response<Body> {
        let start = Instant::now();
        let path = req.uri().path().to_string();
        let query = Query::parse(req.uri().query());
        let target = request::parse_path(&path);
        let kind = RequestKind::of(req.method(), &target, &query);
        let identity = self.authenticate(req.headers(), peer).await;
        let mut audit = self.audit.begin(&req, &target, &query, identity.as_ref());
        // Admission plugins add audit annotations from inside the handler.
        let fut = audit::scoped(
            audit.notes(),
            self.route(req, target, query, identity, &mut audit),
        );
        let outcome = AssertUnwindSafe(fut).catch_unwind().await;
        let resp = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                audit.failed(&e);
                error_response(&e)
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(path, panic = what, "request handler panicked");
                audit.panicked(&what);
                error_response(&ApiError::internal(
                    "the server failed while handling this request",
                ))
            }
        };
        let resp = audit.respond(resp).await;
        self.metrics
            .observe_request(kind, resp.status().as_u16(), start.elapsed());
        resp
    }

    /// Who sent the request: the client certificate's identity, else the
    /// bearer token's ([`ApiServer::authenticate_token`]); None for nobody.
    async fn authenticate(&self, headers: &HeaderMap, peer: Option<Identity>) -> Option<Identity> {
        if peer.is_some() {
            return peer;
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(auth::authn::bearer_token)?;
        match self.authenticate_token(token, None).await {
            Ok((id, _)) => Some(id),
            Err(why) => {
                tracing::debug!(%why, "bearer token refused");
                None
            }
        }
    }

    async fn route(
        self: &Arc<Self>,
        req: Request<Body>,
        target: Target,
        query: Query,
        identity: Option<Identity>,
        audit: &mut audit::Recorder,
    ) -> ApiResult<Response<Body>> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        let public = matches!(
            path,
            "/healthz" | "/livez" | "/readyz" | skiff_bootstrap::names::CA_PATH
        ) || path.starts_with("/healthz/")
            || path.starts_with("/livez/")
            || path.starts_with("/readyz/");
        let identity = match identity {
            Some(id) => id,
            None if public && parts.method == Method::GET => {
                return self
                    .non_resource(&parts.method, path, &query, &parts.headers)
                    .await;
            }
            // The issuer's discovery documents may be read without
            // credentials, RBAC permitting (upstream's anonymous requests,
            // limited here to these paths); bad credentials are still 401.
            None if issuer_discovery_path(path)
                && !parts.headers.contains_key(header::AUTHORIZATION) =>
            {
                Identity::anonymous()
            }
            None => return Err(ApiError::unauthorized()),
        };
        let path_of = match &target {
            Target::Resource(p) => Some(p),
            _ => None,
        };
        // Held until the answer is ready.
        let admitted = self
            .inflight
            .admit(&identity, &parts.method, path_of, &query)?;
        let served = self.dispatch(parts, body, target, query, identity, audit);
        match admitted.timeout {
            Some(t) => tokio::time::timeout(t, served)
                .await
                .unwrap_or_else(|_| Err(inflight::timed_out())),
            None => served.await,
        }
    }

    async fn dispatch(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: Body,
        target: Target,
        query: Query,
        identity: Identity,
        audit: &mut audit::Recorder,
    ) -> ApiResult<Response<Body>> {
        let path = parts.uri.path();
        let attrs = request::attributes(&parts.method, &target, &query, path);
        let decision = self.authorize(&identity, &attrs).await;
        audit.authorized(&decision);
        decision?;
        // An aggregated group version goes to its backend, authorized
        // here and authenticated by the headers it is sent.
        let aggregated = match &target {
            Target::Resource(p) => self.aggregator.backend(&p.group, &p.version),
            Target::GroupVersion { group, version } => self.aggregator.backend(group, version),
            _ => None,
        };
        if let Some(backend) = aggregated {
            return aggregator::proxy::forward_boxed(self, backend, identity, parts, body).await;
        }
        match target {
            Target::Resource(p) => {
                let def = self
                    .crds
                    .lookup(&p.group, &p.version, &p.resource)
                    .ok_or_else(|| ApiError::not_found_path(path))?;
                if def.namespaced != p.namespace.is_some() && !(def.namespaced && p.name.is_none())
                {
                    return Err(ApiError::not_found_path(path));
                }
                if def.node_serves(p.subresource.as_deref()) && p.name.is_some() {
                    let (ns, name) = (p.namespace.unwrap_or_default(), p.name.unwrap_or_default());
                    if p.subresource.as_deref() == Some("proxy") {
                        return httpproxy::proxy(self, def, &ns, &name, parts, body).await;
                    }
                    return nodeproxy::proxy(self, def, &ns, &name, parts, body).await;
                }
                let body = read_body(&parts.headers, body).await?;
                audit.request_body(&body, content_type(&parts.headers));
                let r = Req {
                    def,
                    ns: p.namespace,
                    name: p.name,
                    sub: p.subresource,
                    query,
                    headers: parts.headers,
                    identity,
                    attrs,
                };
                self.resource(&parts.method, r, body).await
            }
            Target::CoreVersions if discovery::wants_aggregated(accept(&parts.headers)) => {
                Ok(json_response_ct(
                    200,
                    &discovery::aggregated(&self.crds, true),
                    discovery::AGGREGATED_CONTENT_TYPE,
                ))
            }
            Target::Groups if discovery::wants_aggregated(accept(&parts.headers)) => {
                let mut list = discovery::aggregated(&self.crds, false);
                self.aggregator.merge_aggregated(&mut list);
                Ok(json_response_ct(
                    200,
                    &list,
                    discovery::AGGREGATED_CONTENT_TYPE,
                ))
            }
            Target::CoreVersions => Ok(json_response(200, &discovery::core_versions())),
            Target::Groups => {
                let mut list = discovery::groups(&self.crds);
                self.aggregator.merge_groups(&mut list);
                Ok(json_response(200, &list))
            }
            Target::Group(g) => discovery::group(&self.crds, &g)
                .or_else(|| self.aggregator.group(&g))
                .map(|v| json_response(200, &v))
                .ok_or_else(|| ApiError::not_found_path(path)),
            Target::GroupVersion { group, version } => {
                discovery::group_version(&self.crds, &group, &version)
                    .map(|v| json_response(200, &v))
                    .ok_or_else(|| ApiError::not_found_path(path))
            }
            _ if path == crate::store::managed::join::PATH && parts.method == Method::POST => {
                let body = read_body(&parts.headers, body).await?;
                self.join_server(&body).await
            }
            _ => {
                self.non_resource(&parts.method, path, &query, &parts.headers)
                    .await
            }
        }
    }

    /// A server joining: its etcd member added, the shared files
    /// returned (authorized by RBAC as a non-resource `post`).
    async fn join_server(&self, body: &[u8]) -> ApiResult<Response<Body>> {
        use crate::store::managed::join;
        let source = self.server_join.get().ok_or_else(|| {
            ApiError::method_not_allowed(
                "this server runs no managed etcd (start it with --cluster-init to let servers join)",
            )
        })?;
        let req: join::Request = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("a join request: {e}")))?;
        let bundle = join::admit(source, &req)
            .await
            .map_err(|e| ApiError::new(503, "ServiceUnavailable", e))?;
        Ok(json_response(
            200,
            &serde_json::to_value(bundle).map_err(|e| ApiError::internal(e.to_string()))?,
        ))
    }

    /// RBAC, with system:masters, the CSR rules of joining nodes and the
    /// Node authorizer first.
    pub(crate) async fn authorize(&self, id: &Identity, a: &Attributes) -> ApiResult<()> {
        if id.in_group("system:masters") {
            return Ok(());
        }
        // The specific authorizers first; each allows, denies, or leaves
        // the request to the next.
        let d = auth::csr::authorize(id, a, self.store.as_ref()).await;
        if let Some(v) = decided(d, id, a) {
            return v;
        }
        if let Some(node_name) = id.node_name() {
            let d = node::authorize(node_name, a, self.store.as_ref()).await;
            if let Some(v) = decided(d, id, a) {
                return v;
            }
        }
        if self.rbac.allows(id, a) {
            return Ok(());
        }
        Err(ApiError::forbidden(a.forbidden_message(&id.user)))
    }

    async fn non_resource(
        &self,
        method: &Method,
        path: &str,
        query: &Query,
        _headers: &HeaderMap,
    ) -> ApiResult<Response<Body>> {
        if method != Method::GET && method != Method::HEAD {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on {path}"
            )));
        }
        match path.trim_end_matches('/') {
            "/version" => Ok(json_response(200, &discovery::version())),
            skiff_bootstrap::names::CA_PATH => match self.cluster_ca.get() {
                Some(pem) => Ok(text_response(200, pem.clone(), "application/x-pem-file")),
                None => Err(ApiError::not_found_path(path)),
            },
            "/healthz" | "/livez" | "/readyz" => Ok(health::check(self, path, query).await),
            "/metrics" => Ok(text_response(
                200,
                self.metrics.render(),
                "text/plain; version=0.0.4",
            )),
            OPENID_CONFIGURATION => {
                let doc = self.sa_tokens.get().and_then(|t| t.openid_configuration());
                let doc = doc.ok_or_else(|| ApiError::not_found_path(path))?;
                Ok(public_cache(json_response(200, &doc)))
            }
            OPENID_JWKS => {
                let set = self.sa_tokens.get().map(|t| t.jwks());
                let set = set.ok_or_else(|| ApiError::not_found_path(path))?;
                Ok(public_cache(json_response_ct(
                    200,
                    &set,
                    "application/jwk-set+json",
                )))
            }
            "/openapi/v3" => Ok(json_response(200, &openapi::index(&self.crds))),
            "/openapi/v2" => Err(ApiError::not_found_path(path)),
            p if p.starts_with("/openapi/v3/") => {
                let doc = openapi::document(&self.crds, &p["/openapi/v3/".len()..])
                    .ok_or_else(|| ApiError::not_found_path(path))?;
                let etag = HeaderValue::from_str(&format!("\"{}\"", doc.hash))
                    .unwrap_or(HeaderValue::from_static("\"\""));
                let mut resp = Response::new(Body::from(doc.body));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                resp.headers_mut().insert(header::ETAG, etag);
                Ok(resp)
            }
            p if p.starts_with("/healthz/")
                || p.starts_with("/livez/")
                || p.starts_with("/readyz/") =>
            {
                Ok(health::check(self, path, query).await)
            }
            _ => Err(ApiError::not_found_path(path)),
        }
    }

    async fn resource(
        self: &Arc<Self>,
        method: &Method,
        r: Req,
        body: Bytes,
    ) -> ApiResult<Response<Body>> {
        if let Some(sub) = r.sub.clone() {
            return subresources::dispatch(self, method, r, &sub, body).await;
        }
        if let Some(computed) = r.def.computed {
            if !computed.verbs.contains(&r.attrs.verb.as_str()) {
                return Err(ApiError::method_not_allowed(format!(
                    "only {} supported on {}",
                    computed.verbs.join(" and "),
                    r.def.plural
                )));
            }
            return (computed.serve)(self, method, &r, body).await;
        }
        match (method.clone(), r.name.is_some()) {
            (Method::GET, true) => handlers::get(self, &r).await,
            (Method::GET, false) if r.attrs.verb == "watch" => watch::serve(self, &r).await,
            (Method::GET, false) => handlers::list(self, &r).await,
            (Method::POST, false) => handlers::create(self, &r, body).await,
            (Method::PUT, true) => handlers::update(self, &r, body).await,
            (Method::PATCH, true) => handlers::patch(self, &r, body).await,
            (Method::DELETE, true) => handlers::delete(self, &r, body).await,
            (Method::DELETE, false) => handlers::delete_collection(self, &r, body).await,
            (m, _) => Err(ApiError::method_not_allowed(format!(
                "{m} is not supported on {}",
                r.attrs.path
            ))),
        }
    }
}

/// What an authorizer's decision means for the request: allowed, a 403
/// with its reason, or None to ask the next authorizer.
fn decided(d: node::Decision, id: &Identity, a: &Attributes) -> Option<ApiResult<()>> {
    match d {
        node::Decision::Allow => Some(Ok(())),
        node::Decision::Deny(why) => Some(Err(ApiError::forbidden(format!(
            "{}: {why}",
            a.forbidden_message(&id.user)
        )))),
        node::Decision::NoOpinion => None,
    }
}

fn content_type(h: &HeaderMap) -> &str {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn accept(h: &HeaderMap) -> &str {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Past this much, an oversized body is not even drained: the connection
/// is dropped instead.
const MAX_DRAIN: usize = 64 * 1024 * 1024;

/// Read the body, refusing more than [`MAX_BODY`] bytes with 413. An
/// oversized body is still read (and dropped) up to [`MAX_DRAIN`], so that
/// the client, still writing, gets the 413 rather than a broken pipe.
async fn read_body(headers: &HeaderMap, body: Body) -> ApiResult<Bytes> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_DRAIN) {
        return Err(ApiError::too_large());
    }
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen > MAX_DRAIN {
                break;
            }
            if seen <= MAX_BODY {
                buf.extend_from_slice(&data);
            }
        }
    }
    if seen > MAX_BODY {
        return Err(ApiError::too_large());
    }
    Ok(buf.freeze())
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    json_response_ct(code, v, "application/json")
}

/// Already serialized JSON (in upstream's order, as stored), ended with
/// the newline upstream's encoder writes.
pub(crate) fn bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Body::from(order::with_newline(body)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `v` as JSON in upstream's field order, with its newline.
pub(crate) fn json_response_ct(code: u16, v: &Value, ct: &'static str) -> Response<Body> {
    let body = order::with_newline(order::to_vec(v));
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

pub(crate) fn text_response(code: u16, text: String, ct: &'static str) -> Response<Body> {
    let mut resp = Response::new(Body::from(text));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    if e.code >= 500 {
        tracing::warn!(code = e.code, message = %e.message, "request failed");
    }
    let mut resp = json_response(e.code, &e.to_status());
    // Clients back off by the header; the Status carries the same number.
    if let Some(secs) = e
        .details
        .as_ref()
        .and_then(|d| d["retryAfterSeconds"].as_u64())
    {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// The ServiceAccount issuer's OIDC discovery document and key set.
const OPENID_CONFIGURATION: &str = "/.well-known/openid-configuration";
const OPENID_JWKS: &str = "/openid/v1/jwks";

fn issuer_discovery_path(path: &str) -> bool {
    matches!(
        path.trim_end_matches('/'),
        OPENID_CONFIGURATION | OPENID_JWKS
    )
}

/// Relying parties may cache the issuer's documents for an hour, as
/// upstream lets them.
fn public_cache(mut resp: Response<Body>) -> Response<Body> {
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    resp
}

/// Add `Warning` headers (fieldValidation=Warn and deprecations).
pub(crate) fn with_warnings(mut resp: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let v = format!("299 - {:?}", w);
        if let Ok(h) = HeaderValue::from_str(&v) {
            resp.headers_mut().append(header::WARNING, h);
        }
    }
    resp
}

/// The media type of a Content-Type header, without its parameters
/// (`application/json; charset=utf-8` is `application/json`).
pub(crate) fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// Decode a JSON or YAML request body into an object.
///
/// # Errors
/// 400 for anything that is not one JSON/YAML object.
pub fn decode_body(body: &[u8], content_type: &str) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty: expected an object",
        ));
    }
    let base = media_type(content_type);
    let v: Value = match base {
        // JSON is YAML, and what most clients send (kube-rs's apply
        // patches): its own parser reads it several times faster.
        "application/yaml" => match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => serde_saphyr::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        },
        "application/vnd.kubernetes.protobuf" => protobuf::decode(body).map_err(|e| match e {
            protobuf::Error::Unsupported(_) => ApiError::unsupported_media(base),
            e => ApiError::bad_request(e.to_string()),
        })?,
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        // Upstream serves these three (and CBOR, which is not served here).
        other => return Err(ApiError::unsupported_media(other)),
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// Check or fill `apiVersion`/`kind` of a body for `def`.
pub(crate) fn check_type_meta(def: &ResourceDef, obj: &mut Value) -> ApiResult<()> {
    let want_av = def.api_version();
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if (!av.is_empty() && av != want_av) || (!kind.is_empty() && kind != def.kind) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) and kind ({kind}) do not match the resource {} ({want_av}, {})",
            def.plural, def.kind
        )));
    }
    obj["apiVersion"] = Value::String(want_av);
    obj["kind"] = Value::String(def.kind.to_string());
    Ok(())
}
