//! `x-kubernetes-validations`: CEL rules in custom resource schemas, as
//! upstream's `apiextensions-apiserver/pkg/apiserver/schema/cel`, run by
//! the `cel` crate.
//!
//! A definition's rules are compiled and their cost estimated when it is
//! written ([`check`]): a rule that does not parse, calls what the
//! environment lacks, names a field its schema does not declare, or could
//! cost more than upstream's limits is refused then. Objects are validated
//! ([`validate`]) with each rule's cost estimated again from the sizes the
//! object really has, before it runs, against upstream's per-call limit
//! and per-request budget: no rule can hang or exhaust the server.
//!
//! The environment is CEL's standard library with the strings extension
//! and, of Kubernetes' own libraries, the list and regex functions and the
//! `isIP`/`isCIDR` checks ([`library`]); the rest (the `ip`, `cidr`, `url`
//! and `quantity` types, the authorizer) are not there, and rules calling
//! them are refused by name.

mod compile;
mod cost;
mod eval;
pub mod expression;
mod library;
mod values;

pub use compile::check;
pub use eval::validate;

/// Upstream's `StaticEstimatedCostLimit`: one rule, estimated from the
/// schema's bounds.
const RULE_LIMIT: f64 = 10_000_000.0;
/// Upstream's `StaticEstimatedCRDCostLimit`: every rule of a schema, each
/// times how often it can run.
const SCHEMA_LIMIT: f64 = 100_000_000.0;
/// Upstream's `PerCallLimit`: one rule on one value, at run time.
const CALL_LIMIT: f64 = 1_000_000.0;
/// Upstream's `RuntimeCELCostBudget`: every rule run for one request.
const REQUEST_BUDGET: f64 = 10_000_000.0;

/// The most a request body can hold, and so any string, list or map in a
/// stored object (the API server's body limit).
const MAX_SIZE: f64 = crate::apiserver::MAX_BODY as f64;

/// The `x-kubernetes-validations` entries of a schema node.
fn rules(schema: &serde_json::Value) -> &[serde_json::Value] {
    schema
        .get("x-kubernetes-validations")
        .and_then(serde_json::Value::as_array)
        .map_or(&[], Vec::as_slice)
}
