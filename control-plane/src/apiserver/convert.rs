//! One stored form, several API forms: stored bytes <-> the object a
//! resource serves, through its strategy's conversion (events.k8s.io
//! Events are stored as core ones; see [`super::strategy::event`]).

use serde_json::Value;

use super::objects::{decode_stored, encode_for_store};
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::ApiServer;

/// Which of a kind's forms [`Strategy::convert`] brings objects to.
///
/// [`Strategy::convert`]: super::strategy::Strategy::convert
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The version the request is served at.
    Served,
    /// The version objects are stored at.
    Stored,
}

/// Whether `def`'s API form differs from its stored form.
pub fn converts(def: &ResourceDef) -> bool {
    def.strategy.converts()
}

/// Decode stored bytes into `def`'s API form, with resourceVersion set.
pub fn decode(def: &ResourceDef, value: &[u8], revision: i64) -> Option<Value> {
    let obj = decode_stored(value, revision)?;
    Some(if converts(def) {
        def.strategy.to_served(def, obj)
    } else {
        obj
    })
}

/// Bytes to store for an object in `def`'s API form.
pub fn encode(def: &ResourceDef, obj: &Value) -> Vec<u8> {
    if converts(def) {
        encode_for_store(&def.strategy.to_stored(def, obj))
    } else {
        encode_for_store(obj)
    }
}

/// Objects [`decode`]d for `def`, in its API form: those decoding could
/// not convert (a conversion webhook's kinds) converted all in one call.
///
/// # Errors
/// 500 when the conversion fails.
pub async fn served(api: &ApiServer, def: &ResourceDef, objs: Vec<Value>) -> ApiResult<Vec<Value>> {
    if !def.strategy.converts_by_call() || objs.is_empty() {
        return Ok(objs);
    }
    def.strategy.convert(api, def, objs, Version::Served).await
}

/// [`served`] for one object.
///
/// # Errors
/// 500 when the conversion fails.
pub async fn served_one(api: &ApiServer, def: &ResourceDef, obj: Value) -> ApiResult<Value> {
    one(served(api, def, vec![obj]).await?)
}

/// [`encode`] for `obj` in `def`'s API form, brought to the stored
/// version first where that takes a call.
///
/// # Errors
/// 500 when the conversion fails.
pub async fn encode_converted(
    api: &ApiServer,
    def: &ResourceDef,
    obj: &Value,
) -> ApiResult<Vec<u8>> {
    if !def.strategy.converts_by_call() {
        return Ok(encode(def, obj));
    }
    let stored = one(def
        .strategy
        .convert(api, def, vec![obj.clone()], Version::Stored)
        .await?)?;
    Ok(encode(def, &stored))
}

fn one(objs: Vec<Value>) -> ApiResult<Value> {
    objs.into_iter()
        .next()
        .ok_or_else(|| ApiError::internal("conversion returned no object"))
}
