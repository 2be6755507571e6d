//! `confirm: [{tool, when}]`: a condition on a call, in CEL (the Common
//! Expression Language Kubernetes validation rules use), over `args` (the
//! call's arguments as the tool receives them, bound values included, a
//! secret one reading `"<secret>"`) and `params` (the run's non-secret
//! values). `check` and the operator compile every condition; a call asks
//! for approval when its condition holds, and also when it cannot be
//! evaluated (a missing field, a type mismatch): a broken rule asks rather
//! than lets the call through.
//!
//! Compiled programs are kept by source text, so each condition is
//! compiled once per process however many calls it decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

/// Why a condition could not decide a call (then the call asks).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConditionError {
    /// It is not CEL; the text is positioned: `at line 1, column 12: …`.
    #[error("{0}")]
    Compile(String),
    /// The call's `args` or the run's `params` are not values CEL reads.
    #[error("`{name}` cannot be read: {why}")]
    Unreadable { name: &'static str, why: String },
    /// It gave something else than true or false (the type it gave).
    #[error("the condition gave {0}, not true or false")]
    NotBoolean(String),
    /// It failed on this call (a missing field, a type mismatch).
    #[error("{0}")]
    Evaluation(String),
}

/// A condition's compile error, positioned: `at line 1, column 12: …`.
pub fn compile_error(source: &str) -> Option<ConditionError> {
    program(source).err()
}

/// How many compiled conditions are kept at most.
const MAX_CACHED: usize = 1024;

fn program(source: &str) -> Result<Arc<cel::Program>, ConditionError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<cel::Program>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(source) {
        return Ok(p.clone());
    }
    let compiled = cel::Program::compile(source).map_err(|e| {
        let positioned = e
            .errors
            .iter()
            .map(|err| {
                // The parser counts lines from 1 and columns from 0.
                let (line, column) = err.pos;
                format!("at line {line}, column {}: {}", column + 1, err.msg)
            })
            .collect::<Vec<_>>()
            .join("; ");
        ConditionError::Compile(positioned)
    })?;
    let compiled = Arc::new(compiled);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    // Agents' files hold a handful of conditions; stored agents may bring
    // more over time, so the cache never grows past a bound.
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(source.to_string(), compiled.clone());
    Ok(compiled)
}

/// Whether the condition `source` holds for a call with `args` under
/// `params`; `Err` says why it could not be told (then the call asks).
pub fn holds(source: &str, args: &Value, params: &Value) -> Result<bool, ConditionError> {
    let program = program(source)?;
    let mut context = cel::Context::default();
    for (name, value) in [("args", args), ("params", params)] {
        let value = cel::to_value(value).map_err(|e| ConditionError::Unreadable {
            name,
            why: e.to_string(),
        })?;
        context.add_variable_from_value(name, value);
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(ConditionError::NotBoolean(format!("{:?}", other.type_of()))),
        Err(e) => Err(ConditionError::Evaluation(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_condition_decides_on_arguments_and_values() {
        let rule = "args.amount > 100 || args.currency != 'EUR'";
        let eur = |amount: Value| json!({"amount": amount, "currency": "EUR"});
        assert_eq!(holds(rule, &eur(json!(5)), &json!({})), Ok(false));
        assert_eq!(holds(rule, &eur(json!(150)), &json!({})), Ok(true));
        assert_eq!(holds(rule, &eur(json!(100.5)), &json!({})), Ok(true));
        assert_eq!(
            holds(rule, &json!({"amount": 5, "currency": "USD"}), &json!({})),
            Ok(true)
        );
        let by_tenant = "params.tenant == 'acme' && args.amount >= 10";
        assert_eq!(
            holds(
                by_tenant,
                &json!({"amount": 10}),
                &json!({"tenant": "acme"})
            ),
            Ok(true)
        );
        assert_eq!(
            holds(
                by_tenant,
                &json!({"amount": 10}),
                &json!({"tenant": "globex"})
            ),
            Ok(false)
        );
    }

    #[test]
    fn what_cannot_be_told_is_an_error_not_a_no() {
        // A field the call does not have, a type that does not compare, a
        // result that is not a boolean: each is an Err, which asks.
        let no_amount = holds("args.amount > 100", &json!({}), &json!({}));
        assert!(
            matches!(no_amount, Err(ConditionError::Evaluation(_))),
            "{no_amount:?}"
        );
        let many = holds("args.amount > 100", &json!({"amount": "many"}), &json!({}));
        assert!(
            matches!(many, Err(ConditionError::Evaluation(_))),
            "{many:?}"
        );
        assert_eq!(
            holds("args.amount", &json!({"amount": 3}), &json!({})),
            Err(ConditionError::NotBoolean("UInt".into()))
        );
    }

    #[test]
    fn a_compile_error_names_its_position() {
        let e = compile_error("args.amount > > 100").expect("an error");
        assert!(matches!(e, ConditionError::Compile(_)), "{e:?}");
        assert!(e.to_string().starts_with("at line 1, column "), "{e}");
        assert!(compile_error("args.amount > 100 && has(args.currency)").is_none());
    }
}
