//! Which value a parameter has, and why: the resolution order as a pure
//! function.
//!
//! First hit wins: a pinned process value; a message value (message scope
//! only); a session value (session scope only); a process value; the
//! declared default; otherwise unbound.

use std::fmt;

use super::value::ParamValue;
use bindery_spec::{ParameterDecl, Scope};

/// Where an operator-supplied (process) value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag such as `--set`.
    Flag(&'static str),
    /// An environment variable such as `BINDERY_PARAM_TENANT`.
    Env(String),
    /// A `--params-file`.
    ParamsFile(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "{flag}"),
            Origin::Env(var) => write!(f, "env {var}"),
            Origin::ParamsFile(path) => write!(f, "params-file {path}"),
        }
    }
}

/// A process value matched with its declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessBinding {
    pub value: ParamValue,
    pub pinned: bool,
    pub origin: Origin,
}

/// Why a parameter has the value it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Pinned(Origin),
    Message,
    Session,
    Process(Origin),
    /// The declared default; the string says which (`env BILLING_TOKEN`).
    Default(String),
    Unbound,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Pinned(Origin::Flag(_)) => f.write_str("pinned"),
            Source::Pinned(o) => write!(f, "pinned ({o})"),
            Source::Message => f.write_str("message"),
            Source::Session => f.write_str("session"),
            Source::Process(Origin::Flag(_)) => f.write_str("set"),
            Source::Process(o) => write!(f, "{o}"),
            Source::Default(d) => write!(f, "default:{d}"),
            Source::Unbound => f.write_str("unbound"),
        }
    }
}

/// Every place a value may come from, for one parameter.
#[derive(Default, Clone, Copy)]
pub struct Layers<'a> {
    pub process: Option<&'a ProcessBinding>,
    pub session: Option<&'a ParamValue>,
    pub message: Option<&'a ParamValue>,
    /// The default's value and how it reads (`env BILLING_TOKEN`).
    pub default: Option<(&'a ParamValue, &'a str)>,
}

/// The value a parameter resolves to, and its source.
pub fn resolve<'a>(decl: &ParameterDecl, layers: Layers<'a>) -> (Option<&'a ParamValue>, Source) {
    if let Some(p) = layers.process.filter(|p| p.pinned) {
        return (Some(&p.value), Source::Pinned(p.origin.clone()));
    }
    if decl.scope == Scope::Message {
        if let Some(v) = layers.message {
            return (Some(v), Source::Message);
        }
    }
    if decl.scope == Scope::Session {
        if let Some(v) = layers.session {
            return (Some(v), Source::Session);
        }
    }
    if let Some(p) = layers.process {
        return (Some(&p.value), Source::Process(p.origin.clone()));
    }
    if let Some((v, how)) = layers.default {
        return (Some(v), Source::Default(how.to_string()));
    }
    (None, Source::Unbound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decl(scope: Scope) -> ParameterDecl {
        ParameterDecl {
            name: "p".into(),
            description: None,
            secret: false,
            scope,
            required: true,
            default: None,
        }
    }

    fn v(s: &str) -> ParamValue {
        ParamValue::Plain(json!(s))
    }

    /// Every scope against every combination of the five layers.
    #[test]
    fn resolution_order_matrix() {
        let pinned = ProcessBinding {
            value: v("pin"),
            pinned: true,
            origin: Origin::Flag("--pin"),
        };
        let set = ProcessBinding {
            value: v("set"),
            pinned: false,
            origin: Origin::Flag("--set"),
        };
        let (msg, ses, def) = (v("message"), v("session"), v("default"));
        for scope in [Scope::Process, Scope::Session, Scope::Message] {
            for mask in 0u8..32 {
                let has = |bit: u8| mask & (1 << bit) != 0;
                // A pin and a plain set cannot both exist for one name.
                if has(0) && has(1) {
                    continue;
                }
                let layers = Layers {
                    process: if has(0) {
                        Some(&pinned)
                    } else if has(1) {
                        Some(&set)
                    } else {
                        None
                    },
                    message: has(2).then_some(&msg),
                    session: has(3).then_some(&ses),
                    default: has(4).then_some((&def, "value")),
                };
                let expected = if has(0) {
                    "pin"
                } else if has(2) && scope == Scope::Message {
                    "message"
                } else if has(3) && scope == Scope::Session {
                    "session"
                } else if has(1) {
                    "set"
                } else if has(4) {
                    "default"
                } else {
                    "unbound"
                };
                let (got, source) = resolve(&decl(scope), layers);
                let got = got.map_or("unbound".to_string(), |g| {
                    g.plain().unwrap().as_str().unwrap().to_string()
                });
                assert_eq!(got, expected, "scope {scope:?}, layers {mask:05b}");
                let source = source.to_string();
                let want_source = match expected {
                    "pin" => "pinned",
                    "default" => "default:value",
                    other => other,
                };
                assert_eq!(source, want_source, "scope {scope:?}, layers {mask:05b}");
            }
        }
    }

    #[test]
    fn sources_read_well() {
        assert_eq!(
            Source::Process(Origin::Env("BINDERY_PARAM_X".into())).to_string(),
            "env BINDERY_PARAM_X"
        );
        assert_eq!(
            Source::Pinned(Origin::Env("BINDERY_PIN_X".into())).to_string(),
            "pinned (env BINDERY_PIN_X)"
        );
        assert_eq!(
            Source::Default("env BILLING_TOKEN".into()).to_string(),
            "default:env BILLING_TOKEN"
        );
    }
}
