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

use bindery_bindings::{glob_matches, AppliedBinding, BoundTool, BoundValue};
use bindery_params::{ParamValue, Values};
use bindery_spec::agents_exe::ExeBindingValue;
use bindery_spec::{BindingValue, WhenUnbound};
use bindery_tools::bash::Mode;
use bindery_tools::{ArgSpec, Transport};

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

/// Why a narrowing the calling model wrote cannot apply; the text is what
/// the model is told, to fix its call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NarrowingError {
    #[error("`agent: {0}` is not an address: use a helper slug, `a/b`, or `**`")]
    NotAnAddress(String),
    /// `what` names the binding (`binding of `limit``).
    #[error("{what}: your parameter `{param}` has no value")]
    NoValue { what: String, param: String },
    /// `tools`: the names there are.
    #[error("no tool matches `{glob}` (tools: {tools})")]
    NoToolMatches { glob: String, tools: String },
    /// `open`: each matching tool's open arguments.
    #[error("no tool matching `{glob}` has an open argument `{arg}` (open: {open})")]
    NoOpenArgument {
        glob: String,
        arg: String,
        open: String,
    },
    #[error("`{arg}` of `{tool}` {why}")]
    DoesNotFit {
        arg: String,
        tool: String,
        why: Misfit,
    },
}

/// Why a value may not fill an argument; the text follows the argument's
/// name (`` `token` of `bash_probe` is passed on the command line… ``).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Misfit {
    /// A secret for a bash argument in this mode.
    #[error("is passed on the command line ({0}), where other processes can read it; a secret may fill only an `env` or `stdin` argument")]
    OnCommandLine(&'static str),
    #[error("takes a string, a number or a boolean")]
    NotText,
    /// `want`: `an integer`; `got`: the value's kind.
    #[error("takes {want}, got {got}")]
    WrongType { want: String, got: &'static str },
}

impl Address {
    pub fn parse(s: Option<&str>) -> Result<Address, NarrowingError> {
        match s.map(str::trim) {
            None | Some("") => Ok(Address::Here),
            Some("**") => Ok(Address::Everywhere),
            Some(p) => {
                let parts: Vec<String> = p.split('/').map(str::to_string).collect();
                if parts.iter().any(|s| s.is_empty() || s == "**") {
                    return Err(NarrowingError::NotAnAddress(p.to_string()));
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
pub fn resolve_value(
    v: &BindingValue,
    caller: &Values,
    what: &str,
) -> Result<ParamValue, NarrowingError> {
    match v {
        BindingValue::Literal(l) => Ok(ParamValue::Plain(l.clone())),
        BindingValue::Param(p) => caller
            .get(p)
            .cloned()
            .ok_or_else(|| NarrowingError::NoValue {
                what: what.to_string(),
                param: p.clone(),
            }),
        // The author's `with` may hand a helper the end user's value, which
        // the run holds under its own name.
        BindingValue::Identity(i) => {
            caller
                .get(&i.key())
                .cloned()
                .ok_or_else(|| NarrowingError::NoValue {
                    what: what.to_string(),
                    param: i.describe(),
                })
        }
    }
}

/// Resolve a call's bindings in the caller's scope.
pub fn resolve_bindings(
    bindings: &[CallBinding],
    caller: &Values,
) -> Result<Vec<ScopedBinding>, NarrowingError> {
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
) -> Result<Narrowed, NarrowingError> {
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
        if strict && b.address == Address::Here {
            check_binding(&out, b)?;
        }
        let glob = b.tool.as_deref().unwrap_or("*");
        let matched: Vec<usize> = (0..out.len())
            .filter(|&i| glob_matches(glob, out[i].name()))
            .collect();
        for i in matched {
            let Some(arg) = out[i].spec().arg(&b.arg) else {
                continue;
            };
            if out[i].binding_for(&b.arg).is_some() {
                dropped.push((b.arg.clone(), out[i].name().to_string()));
                continue;
            }
            // Checked before the helper runs (`check_binding`); where an
            // inherited `**` binding does not fit, it leaves the argument open.
            if let Err(why) = fits(arg, &b.value) {
                tracing::info!(arg = %b.arg, tool = %out[i].name(), "narrowing not applied: {why}");
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

/// Check a calling model's binding against the tools it is aimed at: a
/// tool matches, one of them has the argument, and the value fits each
/// argument it would fill. Returns how many arguments it would fill.
pub fn check_binding(tools: &[BoundTool], b: &ScopedBinding) -> Result<usize, NarrowingError> {
    let glob = b.tool.as_deref().unwrap_or("*");
    let matched: Vec<&BoundTool> = tools
        .iter()
        .filter(|t| glob_matches(glob, t.name()))
        .collect();
    if matched.is_empty() {
        let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        return Err(NarrowingError::NoToolMatches {
            glob: glob.to_string(),
            tools: list(&names),
        });
    }
    let with_arg: Vec<(&BoundTool, &ArgSpec)> = matched
        .iter()
        .filter_map(|t| t.spec().arg(&b.arg).map(|a| (*t, a)))
        .collect();
    if with_arg.is_empty() {
        let open: Vec<String> = matched.iter().map(|t| open_args(t)).collect();
        return Err(NarrowingError::NoOpenArgument {
            glob: glob.to_string(),
            arg: b.arg.clone(),
            open: open.join("; "),
        });
    }
    for (t, arg) in &with_arg {
        fits(arg, &b.value).map_err(|why| NarrowingError::DoesNotFit {
            arg: b.arg.clone(),
            tool: t.name().to_string(),
            why,
        })?;
    }
    Ok(with_arg.len())
}

/// Whether `value` may fill `arg`: its JSON type matches the argument's,
/// a bash argument gets text, and a secret never goes on a command line.
pub fn fits(arg: &ArgSpec, value: &ParamValue) -> Result<(), Misfit> {
    if let Transport::Bash(mode) = arg.transport {
        if value.is_secret() && !matches!(mode, Mode::Env | Mode::Stdin) {
            return Err(Misfit::OnCommandLine(mode.as_str()));
        }
        if value.to_text().is_none() {
            return Err(Misfit::NotText);
        }
    }
    let want = arg.schema.get("type").and_then(|t| t.as_str());
    let ok = match (want, value) {
        (None, _) => true,
        // A secret is text.
        (Some(t), ParamValue::Secret(_)) => t == "string",
        (Some(t), ParamValue::Plain(v)) => match t {
            // The one rule for string arguments, at load time and at call
            // time: a number or a boolean is taken, and the tool gets its
            // JSON text (`true`, `42`, `1.5`; see `BoundTool::merge`).
            "string" => v.is_string() || v.is_number() || v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            "null" => v.is_null(),
            _ => true,
        },
    };
    if ok {
        Ok(())
    } else {
        let got = value
            .plain()
            .map_or("a secret string", bindery_params::value::json_kind);
        Err(Misfit::WrongType {
            want: a_type(want.unwrap_or("")),
            got,
        })
    }
}

fn a_type(t: &str) -> String {
    match t {
        "integer" | "object" | "array" => format!("an {t}"),
        "null" => "null".to_string(),
        _ => format!("a {t}"),
    }
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

/// What travels to the child `slug` from `all` (inherited and own): nothing
/// to a helper its caller marked `narrowable: false`, not even `**`.
pub fn carry(all: &[ScopedBinding], slug: &str, narrowable: bool) -> Vec<ScopedBinding> {
    if !narrowable {
        return Vec::new();
    }
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
pub(super) mod tests {
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
        assert!(carry(&all, "mid", false).is_empty(), "not even `**`");
        let to_mid = carry(&all, "mid", true);
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
            ParamValue::Secret(bindery_params::SecretString::new("s")),
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
                .to_string()
                .contains("`q` has no value")
        );
    }

    /// An argument of type `ty` that travels by `transport`.
    pub(in crate::subagents) fn arg(name: &str, ty: &str, transport: Transport) -> ArgSpec {
        ArgSpec {
            name: name.into(),
            description: String::new(),
            required: false,
            schema: json!({"type": ty}),
            transport,
        }
    }

    /// A tool that only describes itself.
    pub(in crate::subagents) fn tool(name: &str, args: Vec<ArgSpec>) -> BoundTool {
        use bindery_tools::{CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec};
        struct T(ToolSpec);
        #[async_trait::async_trait]
        impl Tool for T {
            fn spec(&self) -> &ToolSpec {
                &self.0
            }
            async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
                unreachable!()
            }
        }
        BoundTool::new(std::sync::Arc::new(T(ToolSpec {
            name: name.into(),
            local_name: name.into(),
            description: String::new(),
            args,
            writes: true,
        })))
    }

    /// A tool with a positional and an env argument, and one with an
    /// integer JSON argument.
    fn tools() -> Vec<BoundTool> {
        vec![
            tool(
                "bash_probe",
                vec![
                    arg("repo", "string", Transport::Bash(Mode::Positional)),
                    arg("token", "string", Transport::Bash(Mode::Env)),
                ],
            ),
            tool("get_item", vec![arg("limit", "integer", Transport::Json)]),
        ]
    }

    fn own(arg: &str, value: ParamValue) -> ScopedBinding {
        ScopedBinding {
            address: Address::Here,
            tool: None,
            arg: arg.into(),
            value,
        }
    }

    fn secret() -> ParamValue {
        ParamValue::Secret(bindery_params::SecretString::new("canary-7f3a9c"))
    }

    #[test]
    fn a_secret_narrowing_into_argv_is_refused() {
        let err = narrow(&tools(), &[], &[own("repo", secret())])
            .err()
            .unwrap();
        assert!(
            matches!(
                &err,
                NarrowingError::DoesNotFit {
                    why: Misfit::OnCommandLine("positional"),
                    ..
                }
            ),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains("`repo` of `bash_probe` is passed on the command line (positional)"),
            "{err}"
        );
        assert!(!err.contains("canary"));
        // Into an env argument it is fine; inherited, it leaves argv alone.
        let ok = narrow(&tools(), &[], &[own("token", secret())]).unwrap();
        assert!(ok.tools[0].binding_for("token").is_some());
        let mut inherited = own("repo", secret());
        inherited.address = Address::Everywhere;
        let n = narrow(&tools(), &[inherited], &[]).unwrap();
        assert!(n.tools[0].binding_for("repo").is_none());
    }

    #[test]
    fn a_wrong_type_is_caught_for_every_kind_of_tool() {
        let err = narrow(
            &tools(),
            &[],
            &[own("limit", ParamValue::Plain(json!("ten")))],
        )
        .err()
        .unwrap();
        assert_eq!(
            err,
            NarrowingError::DoesNotFit {
                arg: "limit".into(),
                tool: "get_item".into(),
                why: Misfit::WrongType {
                    want: "an integer".into(),
                    got: "a string"
                }
            }
        );
        assert_eq!(
            err.to_string(),
            "`limit` of `get_item` takes an integer, got a string"
        );
        let err = narrow(&tools(), &[], &[own("limit", secret())])
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "`limit` of `get_item` takes an integer, got a secret string"
        );
        let err = narrow(&tools(), &[], &[own("repo", ParamValue::Plain(json!([1])))])
            .err()
            .unwrap();
        assert!(
            matches!(
                &err,
                NarrowingError::DoesNotFit {
                    why: Misfit::NotText,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("takes a string, a number or a boolean"),
            "{err}"
        );
        assert!(narrow(&tools(), &[], &[own("limit", ParamValue::Plain(json!(10)))]).is_ok());
        assert_eq!(
            check_binding(&tools(), &own("nothing", ParamValue::Plain(json!(1))))
                .unwrap_err()
                .to_string(),
            "no tool matching `*` has an open argument `nothing` (open: bash_probe: repo, token; get_item: limit)"
        );
    }
}
