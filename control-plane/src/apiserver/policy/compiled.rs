//! A ValidatingAdmissionPolicy and a binding as enforcement reads them:
//! compiled once when they change (upstream's `PolicyHook`).

use std::sync::Arc;

use cel::Program;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::apiserver::cel::expression;
use crate::apiserver::matching::Constraints;
use crate::apiserver::strategy::admissionpolicy::{REASONS, VARIABLES};

/// One `validations[]` entry.
pub struct Check {
    pub source: String,
    pub program: Arc<Program>,
    pub message: Option<String>,
    pub message_expression: Option<Arc<Program>>,
    pub reason: &'static str,
}

pub struct Policy {
    pub name: String,
    pub matches: Constraints,
    pub ignore_failures: bool,
    /// (group, version, kind) of the parameters.
    pub param_kind: Option<(String, String, String)>,
    pub conditions: Vec<(String, Arc<Program>)>,
    pub variables: Vec<(String, Arc<Program>)>,
    pub checks: Vec<Check>,
    /// (key, valueExpression) of `auditAnnotations`.
    pub annotations: Vec<(String, Arc<Program>)>,
    /// The variables its expressions read (the others are not built).
    pub reads: Vec<&'static str>,
}

impl Policy {
    pub fn reads(&self, name: &str) -> bool {
        self.reads.contains(&name)
    }
}

fn compile(v: &Value) -> Option<Arc<Program>> {
    expression::compile(v.as_str()?, &VARIABLES).ok()
}

fn named(list: &Value, name_key: &str, expr_key: &str) -> Option<Vec<(String, Arc<Program>)>> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|e| Some((e[name_key].as_str()?.to_string(), compile(&e[expr_key])?)))
        .collect()
}

impl Policy {
    /// None for a policy validation would have refused.
    pub fn new(obj: &Value) -> Option<Policy> {
        let spec = &obj["spec"];
        let param_kind = match spec.get("paramKind").filter(|v| !v.is_null()) {
            None => None,
            Some(pk) => {
                let api_version = pk["apiVersion"].as_str()?;
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                Some((
                    group.to_string(),
                    version.to_string(),
                    pk["kind"].as_str()?.to_string(),
                ))
            }
        };
        let checks = spec["validations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let source = v["expression"].as_str()?.to_string();
                Some(Check {
                    program: compile(&v["expression"])?,
                    source,
                    message: v["message"].as_str().map(String::from),
                    message_expression: match v.get("messageExpression") {
                        Some(m) if !m.is_null() => Some(compile(m)?),
                        _ => None,
                    },
                    reason: REASONS
                        .iter()
                        .find(|r| v["reason"].as_str() == Some(**r))
                        .copied()
                        .unwrap_or("Invalid"),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let conditions = named(&spec["matchConditions"], "name", "expression")?;
        let variables = named(&spec["variables"], "name", "expression")?;
        let annotations = named(&spec["auditAnnotations"], "key", "valueExpression")?;
        let programs: Vec<&Program> = conditions
            .iter()
            .chain(&variables)
            .chain(&annotations)
            .map(|(_, p)| p.as_ref())
            .chain(checks.iter().map(|c| c.program.as_ref()))
            .chain(
                checks
                    .iter()
                    .filter_map(|c| c.message_expression.as_deref()),
            )
            .collect();
        let reads = VARIABLES
            .into_iter()
            .filter(|v| programs.iter().any(|p| expression::reads_variable(p, v)))
            .collect();
        Some(Policy {
            name: obj["metadata"]["name"].as_str()?.to_string(),
            matches: Constraints::from_json(&spec["matchConstraints"], "resourceRules")?,
            ignore_failures: spec["failurePolicy"].as_str() == Some("Ignore"),
            param_kind,
            conditions,
            variables,
            checks,
            annotations,
            reads,
        })
    }
}

/// A binding's `paramRef`.
pub struct ParamRef {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub selector: Option<LabelSelector>,
    pub deny_if_missing: bool,
}

pub struct Binding {
    pub name: String,
    pub policy: String,
    pub param: Option<ParamRef>,
    /// `matchResources`; None: the policy's constraints alone.
    pub matches: Option<Constraints>,
    pub deny: bool,
    pub warn: bool,
    pub audit: bool,
}

impl Binding {
    /// None for a binding validation would have refused.
    pub fn new(obj: &Value) -> Option<Binding> {
        let spec = &obj["spec"];
        let actions: Vec<&str> = spec["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let param = match spec.get("paramRef").filter(|v| !v.is_null()) {
            None => None,
            Some(pr) => Some(ParamRef {
                name: pr["name"].as_str().map(String::from),
                namespace: pr["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .map(String::from),
                selector: match pr.get("selector") {
                    Some(s) if !s.is_null() => Some(serde_json::from_value(s.clone()).ok()?),
                    _ => None,
                },
                deny_if_missing: pr["parameterNotFoundAction"].as_str() == Some("Deny"),
            }),
        };
        let matches = match spec.get("matchResources").filter(|v| !v.is_null()) {
            None => None,
            Some(m) => Some(Constraints::from_json(m, "resourceRules")?.or_all()),
        };
        Some(Binding {
            name: obj["metadata"]["name"].as_str()?.to_string(),
            policy: spec["policyName"].as_str()?.to_string(),
            param,
            matches,
            deny: actions.contains(&"Deny"),
            warn: actions.contains(&"Warn"),
            audit: actions.contains(&"Audit"),
        })
    }
}
