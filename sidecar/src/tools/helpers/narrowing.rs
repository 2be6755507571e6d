//! Narrowing a helper for one call: bindings chosen by a calling model,
//! addressed at the helper, at one of its helpers (`a/b`) or at everything
//! below (`**`), resolved in the caller's scope, applied to a per-call copy
//! of the helper's tools, and carried down re-rooted. Pure functions.
//!
//! Narrowing only narrows: an argument that is already bound (by the
//! helper's own file or by an ancestor's narrowing) keeps its value; a
//! binding naming it is dropped with a trace, never an error, since the
//! model could not have known.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::bindings::{glob_matches, AppliedBinding, BoundTool, BoundValue};
use crate::params::{ParamValue, Values};
use crate::spec::agents_exe::ExeBindingValue;
use crate::spec::{BindingValue, WhenUnbound};
use crate::tools::Transport;

/// Where a narrowing applies, relative to the helper being called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// The helper itself.
    Here,
    /// A helper below, by slugs (`a/b`).
    Path(Vec<String>),
    /// The helper and every narrowable helper below (`**`).
    Everywhere,
}

impl Address {
    pub fn parse(s: Option<&str>) -> Result<Address, String> {
        match s.map(str::trim) {
            None | Some("") => Ok(Address::Here),
            Some("**") => Ok(Address::Everywhere),
            Some(p) => {
                let parts: Vec<String> = p.split('/').map(str::to_string).collect();
                if parts.iter().any(|s| s.is_empty() || s == "**") {
                    return Err(format!(
                        "`agent: {p}` is not an address: use a helper slug, `a/b`, or `**`"
                    ));
                }
                Ok(Address::Path(parts))
            }
        }
    }

    /// The address as seen from the child `slug`, if it concerns it.
    pub fn descend(&self, slug: &str) -> Option<Address> {
        match self {
            Address::Here => None,
            Address::Everywhere => Some(Address::Everywhere),
            Address::Path(p) if p.first().is_some_and(|s| s == slug) => Some(if p.len() == 1 {
                Address::Here
            } else {
                Address::Path(p[1..].to_vec())
            }),
            Address::Path(_) => None,
        }
    }

    fn applies_here(&self) -> bool {
        matches!(self, Address::Here | Address::Everywhere)
    }
}

/// A binding resolved in the caller's scope, with where it applies.
#[derive(Clone, Debug, PartialEq)]
pub struct ScopedBinding {
    pub address: Address,
    pub tool: Option<String>,
    pub arg: String,
    pub value: ParamValue,
}

/// A binding as a calling model writes it.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CallBinding {
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub tool: Option<String>,
    pub arg: String,
    pub value: CallValue,
}

/// `{"tag": "Param", "contents": NAME}` (agents-exe's form) or `{"param": NAME}`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum CallValue {
    Tagged(ExeBindingValue),
    Native(BindingValue),
}

impl CallValue {
    pub fn binding_value(&self) -> BindingValue {
        match self {
            CallValue::Tagged(t) => t.clone().into(),
            CallValue::Native(n) => n.clone(),
        }
    }
}

/// A value in the caller's scope: a literal is never secret; a parameter
/// keeps its secrecy.
pub fn resolve_value(v: &BindingValue, caller: &Values, what: &str) -> Result<ParamValue, String> {
    match v {
        BindingValue::Literal(l) => Ok(ParamValue::Plain(l.clone())),
        BindingValue::Param(p) => caller
            .get(p)
            .cloned()
            .ok_or_else(|| format!("{what}: your parameter `{p}` has no value")),
    }
}

/// Resolve a call's bindings in the caller's scope.
pub fn resolve_bindings(
    bindings: &[CallBinding],
    caller: &Values,
) -> Result<Vec<ScopedBinding>, String> {
    bindings
        .iter()
        .map(|b| {
            Ok(ScopedBinding {
                address: Address::parse(b.agent.as_deref())?,
                tool: b.tool.clone(),
                arg: b.arg.clone(),
                value: resolve_value(
                    &b.value.binding_value(),
                    caller,
                    &format!("binding of `{}`", b.arg),
                )?,
            })
        })
        .collect()
}

/// The per-call tools of a helper: `scoped` bindings applied in order
/// (ancestors' first), and the rest to carry further down. `strict` marks
/// the bindings the calling model wrote for this call (errors it can fix);
/// inherited ones apply where they fit.
pub struct Narrowed {
    pub tools: Vec<BoundTool>,
    /// (binding, tool) pairs dropped because the argument was already bound.
    pub dropped: Vec<(String, String)>,
}

pub fn narrow(
    tools: &[BoundTool],
    inherited: &[ScopedBinding],
    own: &[ScopedBinding],
) -> Result<Narrowed, String> {
    let mut out: Vec<BoundTool> = tools.to_vec();
    let mut dropped = Vec::new();
    for (b, strict) in inherited
        .iter()
        .map(|b| (b, false))
        .chain(own.iter().map(|b| (b, true)))
    {
        if !b.address.applies_here() {
            continue;
        }
        let glob = b.tool.as_deref().unwrap_or("*");
        let matched: Vec<usize> = (0..out.len())
            .filter(|&i| glob_matches(glob, out[i].name()))
            .collect();
        if strict && b.address == Address::Here {
            if matched.is_empty() {
                let names: Vec<&str> = out.iter().map(|t| t.name()).collect();
                return Err(format!(
                    "no tool matches `{glob}` (tools: {})",
                    list(&names)
                ));
            }
            if !matched.iter().any(|&i| out[i].spec().arg(&b.arg).is_some()) {
                let open: Vec<String> = matched.iter().map(|&i| open_args(&out[i])).collect();
                return Err(format!(
                    "no tool matching `{glob}` has an open argument `{}` (open: {})",
                    b.arg,
                    open.join("; ")
                ));
            }
        }
        for i in matched {
            let Some(arg) = out[i].spec().arg(&b.arg) else {
                continue;
            };
            if out[i].binding_for(&b.arg).is_some() {
                dropped.push((b.arg.clone(), out[i].name().to_string()));
                continue;
            }
            if matches!(arg.transport, Transport::Bash(_)) && b.value.to_text().is_none() {
                if strict {
                    return Err(format!(
                        "`{}` of `{}` takes a string, a number or a boolean",
                        b.arg,
                        out[i].name()
                    ));
                }
                continue;
            }
            out[i] = out[i].with_bindings([AppliedBinding {
                arg: b.arg.clone(),
                value: BoundValue::Fixed(b.value.clone()),
                when_unbound: WhenUnbound::Fail,
            }]);
        }
    }
    for (arg, tool) in &dropped {
        tracing::info!(%arg, %tool, "narrowing dropped: the argument is already bound above");
    }
    Ok(Narrowed {
        tools: out,
        dropped,
    })
}

/// `tool: a, b` — what is still open on a tool.
fn open_args(t: &BoundTool) -> String {
    let hidden = t.hidden_args(&Values::new());
    let open: Vec<&str> = t
        .spec()
        .args
        .iter()
        .map(|a| a.name.as_str())
        .filter(|a| !hidden.contains(a))
        .collect();
    format!("{}: {}", t.name(), list(&open))
}

fn list(items: &[&str]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// What travels to the child `slug` from `all` (inherited and own).
pub fn carry(all: &[ScopedBinding], slug: &str) -> Vec<ScopedBinding> {
    all.iter()
        .filter_map(|b| {
            b.address.descend(slug).map(|address| ScopedBinding {
                address,
                ..b.clone()
            })
        })
        .collect()
}

/// The arguments the inherited bindings addressed here already bind.
pub fn bound_here(inherited: &[ScopedBinding]) -> BTreeSet<(Option<String>, String)> {
    inherited
        .iter()
        .filter(|b| b.address.applies_here())
        .map(|b| (b.tool.clone(), b.arg.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sb(addr: &str, arg: &str) -> ScopedBinding {
        ScopedBinding {
            address: Address::parse(Some(addr)).unwrap(),
            tool: None,
            arg: arg.into(),
            value: ParamValue::Plain(json!("v")),
        }
    }

    #[test]
    fn addresses_re_root() {
        assert_eq!(Address::parse(None).unwrap(), Address::Here);
        assert_eq!(Address::parse(Some("**")).unwrap(), Address::Everywhere);
        let p = Address::parse(Some("mid/leaf")).unwrap();
        assert_eq!(p.descend("mid"), Some(Address::Path(vec!["leaf".into()])));
        assert_eq!(p.descend("other"), None);
        assert_eq!(
            Address::Path(vec!["leaf".into()]).descend("leaf"),
            Some(Address::Here)
        );
        assert_eq!(Address::Here.descend("x"), None);
        assert_eq!(Address::Everywhere.descend("x"), Some(Address::Everywhere));
        assert!(Address::parse(Some("a//b")).is_err());

        let all = vec![
            sb("", "a"),
            sb("mid", "b"),
            sb("mid/leaf", "c"),
            sb("**", "d"),
        ];
        let to_mid = carry(&all, "mid");
        let args: Vec<(&str, Address)> = to_mid
            .iter()
            .map(|b| (b.arg.as_str(), b.address.clone()))
            .collect();
        assert_eq!(
            args,
            vec![
                ("b", Address::Here),
                ("c", Address::Path(vec!["leaf".into()])),
                ("d", Address::Everywhere)
            ]
        );
    }

    #[test]
    fn call_values_take_both_forms() {
        let b: CallBinding = serde_json::from_value(
            json!({"arg": "repo", "value": {"tag": "Literal", "contents": "x"}}),
        )
        .unwrap();
        assert_eq!(b.value.binding_value(), BindingValue::Literal(json!("x")));
        let b: CallBinding =
            serde_json::from_value(json!({"arg": "repo", "value": {"param": "p"}})).unwrap();
        assert_eq!(b.value.binding_value(), BindingValue::Param("p".into()));
        let caller: Values = [(
            "p".to_string(),
            ParamValue::Secret(crate::params::SecretString::new("s")),
        )]
        .into();
        assert!(
            resolve_value(&BindingValue::Param("p".into()), &caller, "x")
                .unwrap()
                .is_secret()
        );
        assert!(
            resolve_value(&BindingValue::Param("q".into()), &caller, "x")
                .unwrap_err()
                .contains("`q` has no value")
        );
    }
}
