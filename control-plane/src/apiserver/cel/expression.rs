//! Expressions outside schemas: admission's `matchConditions` and
//! policies' validations, over variables that are whole JSON values
//! (`object`, `oldObject`, `request`, `params`). They are checked when the
//! configuration holding them is written, and each is bounded by
//! upstream's per-call limit and the request's budget before it runs.

use std::sync::Arc;

use cel::{Context, Program, Value as Cel};
use serde_json::Value;

use super::compile::{env, located, program, reads};
use super::cost::{self, Observed, Size};
use super::values::to_cel;
use super::{CALL_LIMIT, REQUEST_BUDGET};

/// A fresh budget for one request's expressions.
pub fn budget() -> f64 {
    REQUEST_BUDGET
}

/// `source` compiled for variables `vars`, or cel-go's compile error
/// (parse errors, undeclared variables and functions).
pub fn compile(source: &str, vars: &[&str]) -> Result<Arc<Program>, String> {
    let p = program(source)?;
    let one = Size {
        len: 1.0,
        bytes: 1.0,
    };
    let sized: Vec<(&str, Size)> = vars.iter().map(|v| (*v, one)).collect();
    cost::estimate_untyped(p.expression(), &sized).map_err(|problem| located(&p, &problem))?;
    Ok(p)
}

/// Whether `p` names variable `name`.
pub fn reads_variable(p: &Program, name: &str) -> bool {
    reads(p.expression(), name)
}

/// The type errors of `p` when `vars` have these schemas (None:
/// untyped), as cel-go reports them (`ERROR: <input>:1:8: undefined
/// field 'x'`).
pub fn type_errors(p: &Program, vars: &[(&str, Option<&Value>)]) -> Option<String> {
    cost::check_typed(p.expression(), vars)
        .err()
        .map(|problem| located(p, &problem))
}

/// The variables of a request's expressions, converted and measured
/// once for all of them: the context they are bound in is shared by
/// every evaluation, because binding a value converts it whole.
pub struct Vars {
    sizes: Vec<(String, Size)>,
    ctx: Context<'static, 'static>,
}

impl Vars {
    pub fn new(vars: &[(&str, &Value)]) -> Vars {
        let mut out = Vars {
            sizes: Vec::new(),
            ctx: Context::with_env(env()),
        };
        for (name, v) in vars {
            out.set(name, v);
        }
        out
    }

    /// Set (or replace) variable `name`.
    pub fn set(&mut self, name: &str, v: &Value) {
        let size = Observed::default().observe(None, v, 0);
        self.ctx
            .add_variable_from_value(name, to_cel(None, v, false));
        match self.sizes.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = size,
            None => self.sizes.push((name.to_string(), size)),
        }
    }
}

/// Run `p` over `vars`, charging its bound on these values to `budget`.
///
/// # Errors
/// Upstream's messages when the expression costs too much, else the
/// evaluation's error.
pub fn evaluate(p: &Program, vars: &Vars, budget: &mut f64) -> Result<Cel, String> {
    let sized: Vec<(&str, Size)> = vars.sizes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let cost =
        cost::estimate_untyped(p.expression(), &sized).map_err(|problem| located(p, &problem))?;
    if cost > CALL_LIMIT {
        return Err("operation cancelled: actual cost limit exceeded".into());
    }
    if cost > *budget {
        return Err("validation failed due to running out of cost budget, no further validation rules will be run".into());
    }
    *budget -= cost;
    p.execute(&vars.ctx).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn expressions_see_their_variables_and_nothing_else() {
        let p = compile(
            "object.metadata.name == 'a' && request.operation == 'CREATE'",
            &["object", "request"],
        )
        .unwrap();
        let obj = json!({"metadata": {"name": "a"}});
        let req = json!({"operation": "CREATE"});
        let mut b = budget();
        assert_eq!(
            evaluate(
                &p,
                &Vars::new(&[("object", &obj), ("request", &req)]),
                &mut b
            ),
            Ok(Cel::Bool(true))
        );
        assert!(b < budget());
        let e = compile("params.x", &["object"]).unwrap_err();
        assert!(e.contains("undeclared reference to 'params'"), "{e}");
        assert!(compile("object.", &["object"]).is_err());
    }

    #[test]
    fn costly_expressions_are_stopped_before_they_run() {
        let p = compile(
            "object.items.all(a, object.items.all(b, a != b || true))",
            &["object"],
        )
        .unwrap();
        let obj = json!({"items": (0..5000).collect::<Vec<_>>()});
        let e = evaluate(&p, &Vars::new(&[("object", &obj)]), &mut budget()).unwrap_err();
        assert!(e.contains("cost limit exceeded"), "{e}");
    }
}
