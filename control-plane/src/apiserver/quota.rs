//! ResourceQuota admission (upstream's `plugin/pkg/admission/resourcequota`):
//! a new object is checked against every quota of its namespace that
//! constrains it, and charged to them, before it is stored.
//!
//! Charging writes the quota's `status.used` with the revision it was read
//! at as a precondition, retried on conflict: two creates racing for the
//! last unit of a quota cannot both win, as each must move `status.used`
//! from the value it checked. The resourcequota controller recomputes
//! `status.used` from what is stored, which gives back what deleted or
//! finished objects held, and what a write that failed after its charge
//! took (upstream leaks those the same way until its controller syncs).
//!
//! Upstream runs this plugin last among the validating ones, after
//! LimitRanger's defaults: [`super::admission::validate`] calls it last.

use kube_util::quota::{self as usage, Usage};
use serde_json::{json, Value};

use super::handlers::is_dry_run;
use super::objects;
use super::resources::{lookup, ResourceDef, RESOURCES};
use super::status::{qualified, ApiError, ApiResult};
use super::{ApiServer, Req};

/// How often a charge is retried when another write moved the quota
/// first; each retry re-reads it, so only a storm of writers exhausts it.
const MAX_CONFLICT_RETRIES: usize = 32;

/// Check and charge a create (`old` None) or an update of the object in
/// `new` against its namespace's quotas.
///
/// Pods are charged on create only (their resources do not change after);
/// claims and services also on updates that raise their usage (a claim's
/// resize, a Service turned NodePort), by the increase.
///
/// # Errors
/// 403 `exceeded quota` when a quota would go over its hard limit, 403
/// `failed quota` when a quota on CPU or memory meets a container without
/// the request or limit; store errors.
pub(crate) async fn admit(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let def = r.def;
    if !def.namespaced || !r.attrs.subresource.is_empty() || def.computed.is_some() {
        return Ok(());
    }
    let (group, plural) = (def.group, def.plural);
    if old.is_some()
        && !(group.is_empty() && matches!(plural, "persistentvolumeclaims" | "services"))
    {
        return Ok(());
    }
    let Some(ns) = objects::namespace(new) else {
        return Ok(());
    };
    let mut delta = usage::usage(group, plural, new);
    if let Some(old) = old {
        let before = usage::usage(group, plural, old);
        for (k, v) in delta.iter_mut() {
            *v = (*v - before.get(k).copied().unwrap_or(0)).max(0);
        }
        if delta.values().all(|v| *v == 0) {
            return Ok(());
        }
    }
    let quota_def = quota_def()?;
    let listed = api
        .store
        .list(&quota_def.prefix(Some(ns)), None, 0, None)
        .await?;
    if listed.kvs.is_empty() {
        return Ok(());
    }
    let name = objects::name(new).unwrap_or_default();
    let forbidden = |why: String| {
        ApiError::forbidden(format!(
            "{} {name:?} is forbidden: {why}",
            qualified(group, plural)
        ))
    };
    // Check every quota before charging any, so that a refusal by one
    // leaves the others untouched.
    let mut quotas = Vec::new();
    for kv in &listed.kvs {
        let Some(q) = objects::decode_stored(&kv.value, kv.mod_revision) else {
            continue;
        };
        if check(api, &q, group, plural, new, old.is_none(), &delta)
            .await
            .map_err(&forbidden)?
            .is_some()
        {
            quotas.push((q, kv.mod_revision));
        }
    }
    if is_dry_run(r) {
        return Ok(());
    }
    for (q, revision) in quotas {
        charge(
            api,
            quota_def,
            q,
            revision,
            group,
            plural,
            new,
            old.is_none(),
            &delta,
        )
        .await
        .map_err(|e| match e {
            Charge::Refused(why) => forbidden(why),
            Charge::Api(e) => e,
        })?;
    }
    Ok(())
}

enum Charge {
    Refused(String),
    Api(ApiError),
}

impl From<ApiError> for Charge {
    fn from(e: ApiError) -> Self {
        Charge::Api(e)
    }
}

/// Write the quota's new `status.used`, re-reading and re-checking it
/// when another write moved it since `revision`.
#[allow(clippy::too_many_arguments)]
async fn charge(
    api: &ApiServer,
    quota_def: &'static ResourceDef,
    mut q: Value,
    mut revision: i64,
    group: &str,
    plural: &str,
    obj: &Value,
    create: bool,
    delta: &Usage,
) -> Result<(), Charge> {
    let key = quota_def.key(
        objects::namespace(&q),
        objects::name(&q).unwrap_or_default(),
    );
    for _ in 0..MAX_CONFLICT_RETRIES {
        let Some(status) = check(api, &q, group, plural, obj, create, delta)
            .await
            .map_err(Charge::Refused)?
        else {
            return Ok(());
        };
        q["status"] = status;
        match api
            .store
            .update(&key, super::convert::encode(quota_def, &q), revision)
            .await
        {
            Ok(_) => return Ok(()),
            Err(crate::store::Error::Conflict { .. }) => {}
            // Deleted meanwhile: nothing left to charge.
            Err(crate::store::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(ApiError::from(e).into()),
        }
        let Some(kv) = api.store.get(&key).await.map_err(ApiError::from)? else {
            return Ok(());
        };
        let Some(fresh) = objects::decode_stored(&kv.value, kv.mod_revision) else {
            return Ok(());
        };
        (q, revision) = (fresh, kv.mod_revision);
    }
    Err(ApiError::new(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on resourcequotas {:?}: too many concurrent writes, please retry", objects::name(&q).unwrap_or_default()),
    )
    .into())
}

/// Whether the quota constrains the object and has room for it: the
/// quota's new status when it does (None when it does not constrain it).
///
/// # Errors
/// Why the object is refused, in upstream's words (without the `... is
/// forbidden: ` prefix). A kind [`recompute`] cannot list counts as
/// nothing rather than failing the write.
async fn check(
    api: &ApiServer,
    q: &Value,
    group: &str,
    plural: &str,
    obj: &Value,
    create: bool,
    delta: &Usage,
) -> Result<Option<Value>, String> {
    let qname = objects::name(q).unwrap_or_default();
    let hard = usage::parse_list(&q["spec"]["hard"]);
    let constrained: Vec<&String> = hard
        .keys()
        .filter(|k| usage::matches_resource(group, plural, k))
        .collect();
    if constrained.is_empty() || !usage::in_scope(q, group, plural, obj) {
        return Ok(None);
    }
    if create && group.is_empty() && plural == "pods" {
        let required: Vec<&str> = constrained
            .iter()
            .map(|k| k.as_str())
            .filter(|k| usage::POD_REQUIRED.contains(k))
            .collect();
        let missing = usage::missing_requests(obj, &required);
        if !missing.is_empty() {
            let list: Vec<String> = missing
                .iter()
                .map(|(r, names)| format!("{r} for: {}", names.join(",")))
                .collect();
            return Err(format!(
                "failed quota: {qname}: must specify {}",
                list.join("; ")
            ));
        }
    }
    let mut used = usage::parse_list(&q["status"]["used"]);
    if hard.keys().any(|k| !used.contains_key(k)) {
        // Never synced by the controller (a quota created just now):
        // count what is there, as the controller would.
        used = recompute(api, q, &hard).await;
    }
    // Upstream lists only the exceeded resources, each as requested,
    // used and limited: `pods=1`.
    let (mut requested, mut now, mut limited) = (Vec::new(), Vec::new(), Vec::new());
    for k in &constrained {
        let (r, u, h) = (
            delta.get(*k).copied().unwrap_or(0),
            used.get(*k).copied().unwrap_or(0),
            hard[*k],
        );
        if u + r > h {
            requested.push(format!("{k}={}", usage::format(k, r)));
            now.push(format!("{k}={}", usage::format(k, u)));
            limited.push(format!("{k}={}", usage::format(k, h)));
        }
    }
    if !requested.is_empty() {
        return Err(format!(
            "exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
            requested.join(","),
            now.join(","),
            limited.join(",")
        ));
    }
    for k in constrained {
        *used.entry(k.clone()).or_default() += delta.get(k).copied().unwrap_or(0);
    }
    Ok(Some(json!({
        "hard": q["spec"]["hard"],
        "used": usage::to_list(&used),
    })))
}

/// The quota's usage counted from the store: every hard resource, over
/// the objects of the namespace in its scopes (what the resourcequota
/// controller writes).
async fn recompute(api: &ApiServer, q: &Value, hard: &Usage) -> Usage {
    let ns = objects::namespace(q).unwrap_or_default();
    let mut used: Usage = hard.keys().map(|k| (k.clone(), 0)).collect();
    let mut seen = std::collections::HashSet::new();
    for def in RESOURCES
        .iter()
        .filter(|d| d.namespaced && d.computed.is_none() && d.stored_as.is_none())
    {
        if !seen.insert((def.group, def.plural)) || !usage::constrains(hard, def.group, def.plural)
        {
            continue;
        }
        let Ok(list) = api.store.list(&def.prefix(Some(ns)), None, 0, None).await else {
            continue;
        };
        for kv in &list.kvs {
            let Some(obj) = super::convert::decode(def, &kv.value, kv.mod_revision) else {
                continue;
            };
            usage::add_usage(&mut used, q, def.group, def.plural, &obj);
        }
    }
    used
}

fn quota_def() -> ApiResult<&'static ResourceDef> {
    lookup("", "v1", "resourcequotas")
        .ok_or_else(|| ApiError::internal("resourcequotas are not served"))
}
