//! Parameter values, and the raw values callers supply before we know
//! whether they are secret.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::SecretString;

/// A secret parameter was given something else than a string: the kind
/// given (`an object`), never the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("a secret parameter takes a string, got {0}")]
pub struct SecretNotString(pub &'static str);

/// A resolved parameter value. Values are JSON; a secret one is a string
/// held as a [`SecretString`] and prints as `<secret>` wherever it goes.
#[derive(Clone, PartialEq)]
pub enum ParamValue {
    Plain(serde_json::Value),
    Secret(SecretString),
}

impl ParamValue {
    /// Classify a supplied value for a parameter: a secret parameter takes a
    /// string only. The error never contains the value.
    pub fn for_parameter(
        secret: bool,
        value: serde_json::Value,
    ) -> Result<ParamValue, SecretNotString> {
        if !secret {
            return Ok(ParamValue::Plain(value));
        }
        match value {
            serde_json::Value::String(s) => Ok(ParamValue::Secret(SecretString::new(s))),
            other => Err(SecretNotString(json_kind(&other))),
        }
    }

    pub fn is_secret(&self) -> bool {
        matches!(self, ParamValue::Secret(_))
    }

    /// The value when it is not secret.
    pub fn plain(&self) -> Option<&serde_json::Value> {
        match self {
            ParamValue::Plain(v) => Some(v),
            ParamValue::Secret(_) => None,
        }
    }

    /// The value as the text a program receives (bash argv, stdin or
    /// environment): strings as they are, numbers and booleans as their JSON
    /// text. `None` for objects and arrays, which have no single text form.
    pub fn to_text(&self) -> Option<ArgText<'_>> {
        match self {
            ParamValue::Secret(s) => Some(ArgText::Secret(s.expose())),
            ParamValue::Plain(v) => match v {
                serde_json::Value::String(s) => Some(ArgText::Plain(s.clone())),
                serde_json::Value::Number(_) | serde_json::Value::Bool(_) => {
                    Some(ArgText::Plain(v.to_string()))
                }
                serde_json::Value::Null => Some(ArgText::Plain(String::new())),
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => None,
            },
        }
    }
}

/// A value in text form, still marked when it is secret.
pub enum ArgText<'a> {
    Plain(String),
    Secret(&'a str),
}

impl fmt::Debug for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Plain(v) => write!(f, "{v}"),
            ParamValue::Secret(s) => write!(f, "{s:?}"),
        }
    }
}

impl Serialize for ParamValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamValue::Plain(v) => v.serialize(s),
            ParamValue::Secret(x) => x.serialize(s),
        }
    }
}

/// Resolved values by parameter name: what a run sees.
pub type Values = BTreeMap<String, ParamValue>;

/// A value as a caller supplied it (a flag, a file, the environment, a
/// request) before it is matched with a declaration. It may be a secret, so
/// it does not print.
#[derive(Clone, PartialEq)]
pub struct Supplied(pub serde_json::Value);

impl fmt::Debug for Supplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<supplied value>")
    }
}

pub use bindery_spec::json_kind;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_values_must_be_strings_and_never_print() {
        let v = ParamValue::for_parameter(true, json!("canary-7f3a9c")).unwrap();
        assert!(v.is_secret());
        assert_eq!(format!("{v:?}"), "<secret>");
        assert_eq!(serde_json::to_value(&v).unwrap(), json!("<secret>"));
        let err = ParamValue::for_parameter(true, json!({"k": "canary"})).unwrap_err();
        assert_eq!(err, SecretNotString("an object"));
        let err = err.to_string();
        assert!(err.contains("takes a string, got an object"), "{err}");
        assert!(!err.contains("canary"));
        assert_eq!(
            format!("{:?}", Supplied(json!("canary"))),
            "<supplied value>"
        );
    }

    #[test]
    fn text_forms() {
        let text = |v: serde_json::Value| match ParamValue::Plain(v).to_text() {
            Some(ArgText::Plain(s)) => Some(s),
            _ => None,
        };
        assert_eq!(text(json!("a b")).as_deref(), Some("a b"));
        assert_eq!(text(json!(10)).as_deref(), Some("10"));
        assert_eq!(text(json!(true)).as_deref(), Some("true"));
        assert_eq!(text(json!([1])), None);
    }
}
