//! The combinator: partial application of tool arguments.
//!
//! A [`BoundTool`] wraps any [`Tool`] with bindings. Towards the model a
//! bound argument is gone from the schema without a trace; at call time the
//! bound value is merged over whatever the model sent, and wins. The wrapped
//! registration is never changed: values come from the run's snapshot at
//! each call, so one registration serves every session.

#![forbid(unsafe_code)]

pub mod apply;
pub mod cache;
pub mod confirm;
pub mod depends;
pub mod glob;
pub mod listing;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use bindery_params::scrub::Scrubber;
use bindery_params::{ParamValue, SecretString, Values};
use bindery_spec::{BindingValue, WhenUnbound};
use bindery_tools::{
    CallArgs, CallContext, Disposition, Tool, ToolError, ToolOutput, ToolSpec, Transport,
};

pub use apply::{apply_bindings, BindingLayer, Diagnostic, Level};
pub use glob::glob_matches;

/// One binding as it applies to one tool.
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedBinding {
    pub arg: String,
    pub value: BoundValue,
    pub when_unbound: WhenUnbound,
}

/// What a bound argument gets.
#[derive(Clone, Debug, PartialEq)]
pub enum BoundValue {
    /// The current value of one of the agent's own parameters.
    Param(String),
    /// The author's literal.
    Literal(serde_json::Value),
    /// A value a calling agent resolved in its own scope for this call (a
    /// narrowing); a secret stays a secret.
    Fixed(ParamValue),
}

impl From<BindingValue> for BoundValue {
    fn from(v: BindingValue) -> Self {
        match v {
            BindingValue::Param(p) => BoundValue::Param(p),
            BindingValue::Literal(l) => BoundValue::Literal(l),
            // An end user's value is in the run's values under its own
            // name, which no declared parameter can take.
            BindingValue::Identity(i) => BoundValue::Param(i.key()),
        }
    }
}

/// A tool with its bindings.
#[derive(Clone)]
pub struct BoundTool {
    inner: Arc<dyn Tool>,
    bindings: Arc<[AppliedBinding]>,
    /// Why a call waits instead of running, if it does (its toolbox's
    /// say; agent-level `confirm` is looked up by name at call time).
    disposition: Option<Disposition>,
    /// Declared read-only (`readOnly: true`) although its kind may write.
    read_only: bool,
    /// The lookups that fill its API-owned arguments, in order.
    depends: Arc<[bindery_spec::Dependency]>,
    /// Its toolbox's `confirm` conditions (CEL): a call asks when one holds.
    confirm_when: Arc<[String]>,
    /// Its output may carry instructions from outside (`untrusted: true`).
    untrusted: bool,
    /// It can send data out of the tenant (`egress: true`).
    egress: bool,
    /// Hidden from the model until this on-demand group is activated.
    toolgroup: Option<Arc<str>>,
}

/// A bound argument as the operator sees it in `describe` (never a value of
/// a parameter; literals are the author's own text).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BoundArg {
    pub arg: String,
    /// `param tenant` or `literal "csv"`.
    pub to: String,
    #[serde(rename = "whenUnbound")]
    pub when_unbound: WhenUnbound,
    /// `env`, `dashdashspace`, … for bash tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// The outcome of merging: the arguments to dispatch and what was dropped.
#[derive(Debug)]
pub struct Merged {
    pub args: CallArgs,
    /// Bound keys the model sent anyway (dropped: the bound value won).
    pub dropped: Vec<String>,
}

/// Why a merge refused to dispatch. Operator-facing only (D8): the model is
/// told "tool unavailable".
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum MergeError {
    #[error("argument `{arg}` is bound to parameter `{param}`, which has no value")]
    Unbound { arg: String, param: String },
    /// Bound to an end user's value (`subject`, `claim:NAME`,
    /// `token:AUDIENCE…`) that the run does not have: the session is no
    /// end user's, their token lacks the claim, or the exchange failed.
    #[error("argument `{arg}` is bound to the end user's {value}, which this run does not have (the session is no end user's, their token lacks it, or it could not be exchanged: the log says which)")]
    NoEndUser { arg: String, value: String },
    #[error(
        "argument `{arg}` is bound to parameter `{param}`, whose value is {kind}: a bash tool takes strings, numbers or booleans"
    )]
    NotText {
        arg: String,
        param: String,
        kind: &'static str,
    },
}

impl BoundTool {
    pub fn new(inner: Arc<dyn Tool>) -> Self {
        BoundTool {
            inner,
            bindings: Arc::from(Vec::new()),
            disposition: None,
            read_only: false,
            depends: Arc::from(Vec::new()),
            confirm_when: Arc::from(Vec::new()),
            untrusted: false,
            egress: false,
            toolgroup: None,
        }
    }

    /// The same tool, in on-demand group `group` (none: always shown).
    pub fn in_group(self, group: Option<&str>) -> Self {
        BoundTool {
            toolgroup: group.map(Arc::from),
            ..self
        }
    }

    /// The on-demand group it belongs to, if any.
    pub fn toolgroup(&self) -> Option<&str> {
        self.toolgroup.as_deref()
    }

    /// The same tool, whose calls also ask when `condition` holds.
    pub fn with_confirm_when(&self, condition: &str) -> Self {
        let mut all = self.confirm_when.to_vec();
        all.push(condition.to_string());
        BoundTool {
            confirm_when: Arc::from(all),
            ..self.clone()
        }
    }

    /// The `confirm` conditions of its toolbox.
    pub fn confirm_when(&self) -> &[String] {
        &self.confirm_when
    }

    /// Its results may carry instructions from outside: once a session has
    /// taken one in, its `egress` calls ask first.
    pub fn untrusted(&self) -> bool {
        self.untrusted
    }

    /// It can send data out.
    pub fn egress(&self) -> bool {
        self.egress
    }

    /// The same tool, whose calls wait for `d`.
    pub fn with_disposition(&self, d: Disposition) -> Self {
        BoundTool {
            disposition: Some(d),
            ..self.clone()
        }
    }

    /// Why a call waits, as its toolbox says.
    pub fn disposition(&self) -> Option<Disposition> {
        self.disposition
    }

    /// The names of the parameters bound into this tool (never a value):
    /// part of a pending call's digest.
    pub fn bound_params(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .bindings
            .iter()
            .filter_map(|b| match &b.value {
                BoundValue::Param(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The same tool with more bindings after the existing ones. Used at
    /// load time (checked first) and, later, for per-call narrowing.
    pub fn with_bindings(&self, more: impl IntoIterator<Item = AppliedBinding>) -> Self {
        let mut all = self.bindings.to_vec();
        all.extend(more);
        BoundTool {
            inner: self.inner.clone(),
            bindings: Arc::from(all),
            ..self.clone()
        }
    }

    /// The same tool with a declaration applied: read-only, untrusted,
    /// egress (each only ever added) and more dependencies.
    pub fn with_decl(&self, d: &bindery_spec::ToolDecl) -> Self {
        let mut all = self.depends.to_vec();
        all.extend(d.depends_on.iter().cloned());
        BoundTool {
            read_only: self.read_only || d.read_only,
            untrusted: self.untrusted || d.untrusted,
            egress: self.egress || d.egress,
            depends: Arc::from(all),
            ..self.clone()
        }
    }

    /// Whether a call may change something: its kind says so and it was
    /// not declared `readOnly`.
    pub fn writes(&self) -> bool {
        self.spec().writes && !self.read_only
    }

    /// The lookups to run before the tool, in declaration order.
    /// Whether a call hands the tool the session's context.
    pub fn receives_session(&self) -> bool {
        self.inner.receives_session()
    }

    pub fn depends(&self) -> &[bindery_spec::Dependency] {
        &self.depends
    }

    /// The top-level arguments its dependencies fill (the model never sees them).
    pub fn filled_args(&self) -> BTreeSet<String> {
        self.depends.iter().flat_map(|d| d.destinations()).collect()
    }

    pub fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    /// The same tool, shown to the model by `spec` (see [`listing`]).
    fn relisted(self, spec: ToolSpec) -> Self {
        BoundTool {
            inner: Arc::new(listing::Relisted {
                spec,
                inner: self.inner.clone(),
            }),
            ..self
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.spec().name
    }

    pub fn bindings(&self) -> &[AppliedBinding] {
        &self.bindings
    }

    pub fn binding_for(&self, arg: &str) -> Option<&AppliedBinding> {
        self.bindings.iter().find(|b| b.arg == arg)
    }

    /// Arguments hidden from the model given the current values: every
    /// bound one, except an `expose` binding whose parameter is unbound.
    pub fn hidden_args(&self, values: &Values) -> BTreeSet<&str> {
        self.bindings
            .iter()
            .filter(|b| !exposed(b, values))
            .map(|b| b.arg.as_str())
            .collect()
    }

    /// The JSON schema of the arguments the model sees.
    pub fn model_schema(&self, values: &Values) -> serde_json::Value {
        let hidden = self.hidden_args(values);
        let filled = self.filled_args();
        self.spec()
            .json_schema(|a| !hidden.contains(a.name.as_str()) && !filled.contains(a.name.as_str()))
    }

    /// Whether a call under `values` would hand the tool a secret value.
    pub fn uses_secret(&self, values: &Values) -> bool {
        self.bindings.iter().any(|b| match &b.value {
            BoundValue::Param(p) => values.get(p).is_some_and(ParamValue::is_secret),
            BoundValue::Literal(_) => false,
            BoundValue::Fixed(v) => v.is_secret(),
        })
    }

    /// Secrets this tool may hand over besides the run's values: its own
    /// (an OpenAPI toolbox's loaded credential) and those a calling agent
    /// fixed by narrowing (named by the argument).
    pub fn secrets(&self) -> Vec<(String, SecretString)> {
        let mut out = self.inner.secrets();
        for b in self.bindings.iter() {
            if let BoundValue::Fixed(ParamValue::Secret(s)) = &b.value {
                out.push((b.arg.clone(), s.clone()));
            }
        }
        out
    }

    /// The non-secret values fixed by narrowings, for cache keys.
    pub fn fixed_values(&self) -> Vec<(&str, &serde_json::Value)> {
        self.bindings
            .iter()
            .filter_map(|b| match &b.value {
                BoundValue::Fixed(v) => v.plain().map(|p| (b.arg.as_str(), p)),
                _ => None,
            })
            .collect()
    }

    /// The bound arguments, for the operator.
    pub fn bound_args(&self) -> Vec<BoundArg> {
        self.bindings
            .iter()
            .map(|b| BoundArg {
                arg: b.arg.clone(),
                to: match &b.value {
                    BoundValue::Param(p) => format!("param {p}"),
                    BoundValue::Literal(l) => format!("literal {l}"),
                    BoundValue::Fixed(_) => "fixed by the calling agent".to_string(),
                },
                when_unbound: b.when_unbound,
                mode: self.spec().arg(&b.arg).and_then(|a| match a.transport {
                    Transport::Bash(m) => Some(m.as_str().to_string()),
                    Transport::Json => None,
                }),
            })
            .collect()
    }

    /// Merge the model's arguments with the bound values (pure).
    pub fn merge(
        &self,
        model_args: serde_json::Map<String, serde_json::Value>,
        values: &Values,
    ) -> Result<Merged, MergeError> {
        let mut args = CallArgs::new();
        let mut taken = BTreeSet::new();
        for b in self.bindings.iter() {
            // The first binding of an argument wins; later ones cannot rebind.
            if !taken.insert(b.arg.as_str()) {
                continue;
            }
            let value = match &b.value {
                BoundValue::Literal(l) => ParamValue::Plain(l.clone()),
                BoundValue::Fixed(v) => v.clone(),
                BoundValue::Param(p) => match values.get(p) {
                    Some(v) => {
                        self.check_text(&b.arg, p, v)?;
                        v.clone()
                    }
                    None => match b.when_unbound {
                        WhenUnbound::Fail if p.starts_with(bindery_spec::IDENTITY_PREFIX) => {
                            return Err(MergeError::NoEndUser {
                                arg: b.arg.clone(),
                                value: p[bindery_spec::IDENTITY_PREFIX.len()..].to_string(),
                            })
                        }
                        WhenUnbound::Fail => {
                            return Err(MergeError::Unbound {
                                arg: b.arg.clone(),
                                param: p.clone(),
                            })
                        }
                        WhenUnbound::Omit => continue,
                        WhenUnbound::Expose => {
                            // The model sees this argument: its value stands.
                            taken.remove(b.arg.as_str());
                            continue;
                        }
                    },
                },
            };
            args.insert(b.arg.clone(), self.as_declared(&b.arg, value));
        }
        let mut dropped = Vec::new();
        for (k, v) in model_args {
            if taken.contains(k.as_str()) {
                dropped.push(k);
            } else {
                args.insert(k, ParamValue::Plain(v));
            }
        }
        Ok(Merged { args, dropped })
    }

    /// A bound number or boolean for an argument declared a string, as the
    /// string of its JSON text (`true`, `42`, `1.5`): what a bash tool gets
    /// on its command line, every other tool gets too, whether the value
    /// was bound in the file, by a parameter or by a narrowing.
    fn as_declared(&self, arg: &str, value: ParamValue) -> ParamValue {
        let declared_string = self
            .spec()
            .arg(arg)
            .and_then(|a| a.schema.get("type"))
            .is_some_and(|t| t == "string");
        match value {
            ParamValue::Plain(v @ (serde_json::Value::Bool(_) | serde_json::Value::Number(_)))
                if declared_string =>
            {
                ParamValue::Plain(serde_json::Value::String(v.to_string()))
            }
            other => other,
        }
    }

    fn check_text(&self, arg: &str, param: &str, v: &ParamValue) -> Result<(), MergeError> {
        let to_bash = matches!(
            self.spec().arg(arg).map(|a| a.transport),
            Some(Transport::Bash(_))
        );
        if to_bash && v.to_text().is_none() {
            return Err(MergeError::NotText {
                arg: arg.to_string(),
                param: param.to_string(),
                kind: v
                    .plain()
                    .map_or("a secret", bindery_params::value::json_kind),
            });
        }
        Ok(())
    }

    /// Run the tool as the model asked, through the bindings.
    pub async fn call(
        &self,
        model_args: serde_json::Value,
        values: &Values,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let tool = self.name();
        let model_args = match model_args {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => serde_json::Map::new(),
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "arguments must be a JSON object, got {}",
                    bindery_params::value::json_kind(&other)
                )))
            }
        };
        let merged = self.merge(model_args, values).map_err(|e| {
            tracing::warn!(tool, session = %ctx.session_id, agent = %ctx.agent_id, "call refused: {e}");
            ToolError::Unavailable
        })?;
        for key in &merged.dropped {
            tracing::info!(tool, arg = %key, "the model sent a bound argument; the bound value was used");
        }
        if ctx.scrubber.is_empty() {
            // Where the tool cuts its output, it scrubs first (the run
            // scrubs the whole result again, to the same markers).
            let ctx = CallContext {
                scrubber: Arc::new(scrubber_for(values, std::slice::from_ref(self))),
                ..ctx.clone()
            };
            return self.inner.call(merged.args, &ctx).await;
        }
        self.inner.call(merged.args, ctx).await
    }
}

/// What scrubs the output of `tools` called with `values`: every secret
/// value, bound or held by a tool.
pub fn scrubber_for(values: &Values, tools: &[BoundTool]) -> Scrubber {
    Scrubber::of(&secrets_for(values, tools))
}

/// Every secret value of `values` (named by parameter), those `tools`
/// hold, and the server's own credentials: what their output and what
/// they say of themselves must not show.
pub fn secrets_for(values: &Values, tools: &[BoundTool]) -> Vec<(String, SecretString)> {
    let mut out: Vec<(String, SecretString)> = values
        .iter()
        .filter_map(|(name, v)| match v {
            ParamValue::Secret(s) => Some((name.clone(), s.clone())),
            ParamValue::Plain(_) => None,
        })
        .collect();
    out.extend(tools.iter().flat_map(BoundTool::secrets));
    // A tool that prints one of the server's own credentials (read from
    // wherever it could) leaves no trace of it either.
    out.extend(bindery_params::live::own());
    out
}

fn exposed(b: &AppliedBinding, values: &Values) -> bool {
    match (&b.value, b.when_unbound) {
        (BoundValue::Param(p), WhenUnbound::Expose) => !values.contains_key(p),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
