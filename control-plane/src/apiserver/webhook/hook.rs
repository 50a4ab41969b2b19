//! One webhook of a configuration, read once when the configuration
//! changes: what it matches ([`Constraints`]), its compiled match
//! conditions, where to call it and how to trust it (upstream's
//! `webhook.Accessor`).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use cel::{Program, Value as Cel};
use serde_json::Value;

use super::call::Client;
use crate::apiserver::cel::expression::{self, Vars};
use crate::apiserver::matching::Constraints;
use crate::apiserver::strategy::webhookconfig::MATCH_VARIABLES;

/// Where the webhook is called.
#[derive(Debug, Clone)]
pub enum Target {
    Url(String),
    Service {
        namespace: String,
        name: String,
        path: String,
        port: u16,
    },
}

impl Target {
    /// A `clientConfig`'s `url` or `service`; None for one validation
    /// would have refused.
    pub fn from_client_config(cc: &Value) -> Option<Target> {
        Some(match cc["url"].as_str() {
            Some(url) => Target::Url(url.to_string()),
            None => Target::Service {
                namespace: cc["service"]["namespace"].as_str()?.to_string(),
                name: cc["service"]["name"].as_str()?.to_string(),
                path: cc["service"]["path"].as_str().unwrap_or("/").to_string(),
                port: u16::try_from(cc["service"]["port"].as_u64().unwrap_or(443)).ok()?,
            },
        })
    }
}

/// A `clientConfig`'s `caBundle`, decoded (empty: the system's roots).
pub fn ca_bundle(cc: &Value) -> Vec<u8> {
    cc["caBundle"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default()
}

/// A webhook, ready to match and call.
pub struct Hook {
    /// The configuration it belongs to.
    pub config: String,
    pub name: String,
    pub mutating: bool,
    pub matches: Constraints,
    pub ignore_failures: bool,
    conditions: Vec<(String, Arc<Program>)>,
    pub timeout: Duration,
    pub reinvoke: bool,
    pub target: Target,
    pub client: Client,
}

impl Hook {
    /// The webhook `spec` of configuration `config`; None for one its
    /// configuration's validation would have refused.
    pub fn new(config: &str, spec: &Value, mutating: bool) -> Option<Hook> {
        let conditions = spec["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let source = c["expression"].as_str()?;
                let p = expression::compile(source, &MATCH_VARIABLES).ok()?;
                Some((c["name"].as_str()?.to_string(), p))
            })
            .collect::<Option<Vec<_>>>()?;
        let cc = &spec["clientConfig"];
        let target = Target::from_client_config(cc)?;
        let timeout = spec["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30);
        Some(Hook {
            config: config.to_string(),
            name: spec["name"].as_str()?.to_string(),
            mutating,
            matches: Constraints::from_json(spec, "rules")?,
            ignore_failures: spec["failurePolicy"].as_str() == Some("Ignore"),
            conditions,
            timeout: Duration::from_secs(timeout),
            reinvoke: spec["reinvocationPolicy"].as_str() == Some("IfNeeded"),
            target,
            client: Client::new(&ca_bundle(cc)),
        })
    }

    pub fn has_conditions(&self) -> bool {
        !self.conditions.is_empty()
    }

    /// Whether every match condition holds; the name of the condition
    /// and the error of one that cannot be evaluated.
    pub fn conditions_hold(&self, vars: &Vars, budget: &mut f64) -> Result<bool, (String, String)> {
        conditions_hold(&self.conditions, vars, budget)
    }
}

/// Whether every named condition holds over `vars` (webhooks' and
/// policies' `matchConditions`); the name and error of one that cannot
/// be evaluated.
pub fn conditions_hold(
    conditions: &[(String, Arc<Program>)],
    vars: &Vars,
    budget: &mut f64,
) -> Result<bool, (String, String)> {
    for (name, p) in conditions {
        match expression::evaluate(p, vars, budget) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => return Ok(false),
            Ok(other) => {
                return Err((
                    name.clone(),
                    format!(
                        "expression must evaluate to a bool, not {}",
                        other.type_of()
                    ),
                ))
            }
            Err(e) => return Err((name.clone(), e)),
        }
    }
    Ok(true)
}
