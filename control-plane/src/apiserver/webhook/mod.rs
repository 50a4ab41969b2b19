//! Dynamic admission through webhooks (admissionregistration.k8s.io/v1):
//! the MutatingWebhookConfigurations and ValidatingWebhookConfigurations
//! in the store, followed into memory, and the calls of the webhooks
//! whose rules, selectors and match conditions a write meets (upstream's
//! `plugin/webhook/mutating` and `validating` dispatchers).
//!
//! Mutating webhooks run one after the other, after the built-in
//! mutating plugins, each seeing the previous ones' patches; those with
//! `reinvocationPolicy: IfNeeded` are called once more when a later one
//! changed the object. Validating webhooks run together, after the
//! built-in validating plugins. Writes of the admission configurations
//! themselves never go to a webhook, so a broken webhook cannot lock
//! its own fix out.
//!
//! # Layout
//! - [`hook`]: one webhook as configured, and whether a request meets it.
//! - [`call`]: the HTTPS call.
//! - [`review`]: AdmissionReview v1 and the checks on the answer.

pub mod call;
pub mod hook;
pub mod review;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use futures::future::join_all;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{json, Value};

use rand::Rng as _;

use self::call::{Dial, Post};
use self::hook::{Hook, Target};
use super::admission_request::{exempt, operation, AdmissionRequest};
use super::cel::expression::Vars;
use super::httpproxy;
use super::objects;
use super::resources;
use super::status::{ApiError, ApiResult};
use super::{ApiServer, Req};
use crate::store::follow::follow;

/// `apiserver_admission_webhook_admission_duration_seconds` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub name: String,
    pub operation: String,
    pub rejected: String,
    #[prometheus(flatten)]
    pub kind: TypeLabel,
}

/// `apiserver_admission_webhook_rejection_count` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub name: String,
    pub operation: String,
    pub error_type: &'static str,
    pub rejection_code: String,
    #[prometheus(flatten)]
    pub kind: TypeLabel,
}

/// `type`: `admit` (mutating) or `validating`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: &'static str,
}

/// The webhook metrics (registered by the server's metrics).
#[derive(Debug, Clone)]
pub struct Counters {
    pub duration: Family<DurationLabels, Histogram, fn() -> Histogram>,
    pub rejections: Family<RejectionLabels, Counter>,
}

/// The webhooks of every configuration, mutating and validating, in
/// upstream's order: configurations by name, webhooks as listed.
pub struct Webhooks {
    mutating: RwLock<Arc<Vec<Arc<Hook>>>>,
    validating: RwLock<Arc<Vec<Arc<Hook>>>>,
    counters: Counters,
}

impl Webhooks {
    pub fn new(counters: Counters) -> Webhooks {
        Webhooks {
            mutating: RwLock::default(),
            validating: RwLock::default(),
            counters,
        }
    }

    fn hooks(&self, mutating: bool) -> Arc<Vec<Arc<Hook>>> {
        let side = if mutating {
            &self.mutating
        } else {
            &self.validating
        };
        side.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn publish(&self, mutating: bool, configs: &BTreeMap<String, Vec<Arc<Hook>>>) {
        let side = if mutating {
            &self.mutating
        } else {
            &self.validating
        };
        let all = configs.values().flatten().cloned().collect();
        *side.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(all);
    }
}

/// Follow both kinds of configuration until the server shuts down.
pub async fn run(api: Arc<ApiServer>) {
    let side = |mutating: bool| {
        let api = api.clone();
        async move {
            let plural = if mutating {
                "mutatingwebhookconfigurations"
            } else {
                "validatingwebhookconfigurations"
            };
            let def = resources::lookup("admissionregistration.k8s.io", "v1", plural)
                .expect("webhook configurations are served");
            let mut configs: BTreeMap<String, Vec<Arc<Hook>>> = BTreeMap::new();
            let hooks_of = |value: &[u8]| -> Vec<Arc<Hook>> {
                let Ok(cfg) = serde_json::from_slice::<Value>(value) else {
                    return Vec::new();
                };
                let name = objects::name(&cfg).unwrap_or_default().to_string();
                cfg["webhooks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|spec| Hook::new(&name, spec, mutating).map(Arc::new))
                    .collect()
            };
            follow(
                api.store.as_ref(),
                &def.prefix(None),
                api.shutdown.clone(),
                plural,
                |change| {
                    change.apply_to(&mut configs, |v| Some(hooks_of(v)));
                    api.webhooks.publish(mutating, &configs);
                },
            )
            .await;
        }
    };
    tokio::join!(side(true), side(false));
}

/// What every webhook of one request shares.
struct Call<'a> {
    base: AdmissionRequest<'a>,
}

impl<'a> Call<'a> {
    fn new(api: &'a ApiServer, r: &'a Req, operation: &'static str) -> Self {
        Call {
            base: AdmissionRequest::new(api, r, operation),
        }
    }

    /// Whether `hook` is to be called for these objects, and in which
    /// version; an error for a match condition that failed to evaluate
    /// under failurePolicy Fail.
    async fn wanted(
        &mut self,
        hook: &Hook,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> ApiResult<Option<String>> {
        let Some(version) = self.base.selected(&hook.matches, old, new).await? else {
            return Ok(None);
        };
        if !hook.has_conditions() {
            return Ok(Some(version));
        }
        let request = self.base.request(&version, old, new);
        let vars = Vars::new(&[
            ("object", new.unwrap_or(&Value::Null)),
            ("oldObject", old.unwrap_or(&Value::Null)),
            ("request", &request),
        ]);
        match hook.conditions_hold(&vars, &mut self.base.budget) {
            Ok(true) => Ok(Some(version)),
            Ok(false) => Ok(None),
            Err(_) if hook.ignore_failures => Ok(None),
            Err((name, why)) => Err(ApiError::internal(format!(
                "failed calling webhook {:?}: failed to evaluate match condition {name:?}: {why}",
                hook.name
            ))),
        }
    }

    /// Call `hook` in `version`; its answer, or None when it failed and
    /// its failurePolicy is Ignore.
    async fn call(
        &self,
        hook: &Hook,
        version: &str,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> ApiResult<Option<review::Answer>> {
        let start = Instant::now();
        let kind = TypeLabel {
            r#type: if hook.mutating { "admit" } else { "validating" },
        };
        let converted = |o: Option<&Value>| {
            o.map(|o| {
                let mut o = o.clone();
                if version != self.base.r.def.version {
                    o["apiVersion"] = json!(self
                        .base
                        .r
                        .def
                        .api_version()
                        .replace(self.base.r.def.version, version));
                }
                o
            })
        };
        let (old_v, new_v) = (converted(old), converted(new));
        let request = self.base.request(version, old_v.as_ref(), new_v.as_ref());
        let body = serde_json::to_vec(&review::review(request)).unwrap_or_default();
        let result = match self.post(hook, body).await {
            Ok(post) => hook
                .client
                .post(self.base.api, post)
                .await
                .and_then(|bytes| {
                    review::answer(&bytes, &self.base.uid, hook.mutating)
                        .map_err(|e| format!("received invalid webhook response: {e}"))
                }),
            Err(e) => Err(format!("failed to call webhook: {e}")),
        };
        let rejected = !matches!(&result, Ok(a) if a.allowed);
        self.base
            .api
            .webhooks
            .counters
            .duration
            .get_or_create(&DurationLabels {
                name: hook.name.clone(),
                operation: self.base.operation.into(),
                rejected: rejected.to_string(),
                kind: kind.clone(),
            })
            .observe(start.elapsed().as_secs_f64());
        let reject = |error_type: &'static str, code: u16| {
            self.base
                .api
                .webhooks
                .counters
                .rejections
                .get_or_create(&RejectionLabels {
                    name: hook.name.clone(),
                    operation: self.base.operation.into(),
                    error_type,
                    rejection_code: code.to_string(),
                    kind: kind.clone(),
                })
                .inc();
        };
        match result {
            Ok(answer) if answer.allowed => Ok(Some(answer)),
            Ok(answer) => {
                let e = denial(&hook.name, &answer.status);
                reject("no_error", e.code);
                Err(e)
            }
            Err(why) if hook.ignore_failures => {
                tracing::warn!(webhook = %hook.name, error = %why, "admission webhook failed; ignored (failurePolicy Ignore)");
                Ok(None)
            }
            Err(why) => {
                reject("calling_webhook_error", 500);
                Err(ApiError::internal(format!(
                    "failed calling webhook {:?}: {why}",
                    hook.name
                )))
            }
        }
    }

    /// Where and how to post to `hook`.
    async fn post(&self, hook: &Hook, body: Vec<u8>) -> Result<Post, String> {
        post_to(self.base.api, &hook.target, body, hook.timeout).await
    }
}

/// Where and how to post `body` to `target`: its URL, or a ready endpoint
/// of its service (a random one).
///
/// # Errors
/// The URL cannot be parsed, or the service has no ready endpoint.
pub(crate) async fn post_to(
    api: &ApiServer,
    target: &Target,
    body: Vec<u8>,
    timeout: std::time::Duration,
) -> Result<Post, String> {
    let (dial, server_name, url) = match target {
        Target::Url(url) => {
            let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
            let host = uri.host().unwrap_or_default();
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            (Dial::Direct(host.clone(), port), host, url.clone())
        }
        Target::Service {
            namespace,
            name,
            path,
            port,
        } => {
            let host = format!("{name}.{namespace}.svc");
            let url = format!("https://{host}:{port}{path}");
            let endpoints =
                httpproxy::service_endpoints(api, namespace, name, Some(&port.to_string()))
                    .await
                    .map_err(|e| format!("Post {url:?}: {}", e.message))?;
            if endpoints.is_empty() {
                return Err(format!(
                    "Post {url:?}: no endpoints available for service {name:?}"
                ));
            }
            let pick = rand::rng().random_range(0..endpoints.len());
            let e = endpoints[pick].clone();
            let dial = match e.node {
                Some(node) => Dial::Tunnel {
                    node,
                    ip: e.ip,
                    port: e.port,
                },
                None => Dial::Direct(e.ip, e.port),
            };
            (dial, host, url)
        }
    };
    Ok(Post {
        dial,
        server_name,
        url,
        body,
        timeout,
    })
}

/// A denial as the client sees it (upstream's `ToStatusErr`).
fn denial(webhook: &str, status: &Value) -> ApiError {
    let denied = format!("admission webhook {webhook:?} denied the request");
    let text = |k: &str| status[k].as_str().unwrap_or_default();
    let message = if !text("message").is_empty() {
        format!("{denied}: {}", text("message"))
    } else if !text("reason").is_empty() {
        format!("{denied}: {}", text("reason"))
    } else {
        format!("{denied} without explanation")
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(403);
    ApiError::new(code, reason(text("reason")), message)
}

/// A webhook's `status.reason` as one of the StatusReasons upstream
/// defines ("" for others: the message says it all).
fn reason(r: &str) -> &'static str {
    const REASONS: [&str; 18] = [
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    REASONS.iter().find(|x| **x == r).copied().unwrap_or("")
}

/// Mutating webhooks on a create or update (`old`): each matching
/// webhook in turn, its patch applied to `obj`; then, once, those with
/// `reinvocationPolicy: IfNeeded` that a later patch came after.
/// Returns the webhooks' warnings.
///
/// # Errors
/// A denial, a failed call under failurePolicy Fail, or a patch that
/// cannot be applied.
pub(crate) async fn mutate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    obj: &mut Value,
) -> ApiResult<Vec<String>> {
    let hooks = api.webhooks.hooks(true);
    if hooks.is_empty() || exempt(r) {
        return Ok(Vec::new());
    }
    let mut call = Call::new(api, r, operation(old, Some(obj)));
    let mut warnings = Vec::new();
    // Which webhook was called in which round, and the last to change
    // the object.
    let mut called: HashMap<usize, usize> = HashMap::new();
    let mut last_change = None;
    for round in 0..2 {
        for (i, hook) in hooks.iter().enumerate() {
            if round == 1
                && !(hook.reinvoke && called.contains_key(&i) && last_change.is_some_and(|l| l > i))
            {
                continue;
            }
            let Some(version) = call.wanted(hook, old, Some(obj)).await? else {
                continue;
            };
            let Some(answer) = call.call(hook, &version, old, Some(obj)).await? else {
                continue;
            };
            called.insert(i, round);
            warnings.extend(answer.warnings);
            if let Some(patch) = answer.patch {
                let mut patched = obj.clone();
                json_patch::patch(&mut patched, &patch).map_err(|e| {
                    ApiError::internal(format!(
                        "admission webhook {:?} returned a patch that cannot be applied: {e}",
                        hook.name
                    ))
                })?;
                if !patched.is_object()
                    || patched["apiVersion"] != obj["apiVersion"]
                    || patched["kind"] != obj["kind"]
                {
                    return Err(ApiError::internal(format!(
                        "admission webhook {:?} changed the object's kind or apiVersion",
                        hook.name
                    )));
                }
                if patched != *obj {
                    *obj = patched;
                    last_change = Some(i);
                }
            }
        }
        if round == 0
            && !hooks.iter().enumerate().any(|(i, h)| {
                h.reinvoke && called.contains_key(&i) && last_change.is_some_and(|l| l > i)
            })
        {
            break;
        }
    }
    Ok(warnings)
}

/// Mutating webhooks on a delete: they are asked, but may not patch.
pub(crate) async fn mutate_delete(api: &ApiServer, r: &Req, old: &Value) -> ApiResult<Vec<String>> {
    let hooks = api.webhooks.hooks(true);
    if hooks.is_empty() || exempt(r) {
        return Ok(Vec::new());
    }
    let mut call = Call::new(api, r, "DELETE");
    let mut warnings = Vec::new();
    for hook in hooks.iter() {
        let Some(version) = call.wanted(hook, Some(old), None).await? else {
            continue;
        };
        let Some(answer) = call.call(hook, &version, Some(old), None).await? else {
            continue;
        };
        if answer.patch.is_some() {
            return Err(ApiError::internal(format!(
                "admission webhook {:?} attempted to modify the object, which is not supported for this operation",
                hook.name
            )));
        }
        warnings.extend(answer.warnings);
    }
    Ok(warnings)
}

/// Validating webhooks on a create, update or delete (`new` None), all
/// called at once. Returns their warnings.
///
/// # Errors
/// The first denial or failed call (under failurePolicy Fail), in the
/// webhooks' order.
pub(crate) async fn validate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<Vec<String>> {
    let hooks = api.webhooks.hooks(false);
    if hooks.is_empty() || exempt(r) {
        return Ok(Vec::new());
    }
    let mut call = Call::new(api, r, operation(old, new));
    let mut wanted = Vec::new();
    for hook in hooks.iter() {
        if let Some(version) = call.wanted(hook, old, new).await? {
            wanted.push((hook, version));
        }
    }
    let call = &call;
    let answers = join_all(
        wanted
            .iter()
            .map(|(hook, version)| call.call(hook, version, old, new)),
    )
    .await;
    let mut warnings = Vec::new();
    for answer in answers {
        if let Some(a) = answer? {
            warnings.extend(a.warnings);
        }
    }
    Ok(warnings)
}
