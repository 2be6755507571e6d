//! One loaded agent's parameters: declarations, the operator's values,
//! resolved defaults, and the snapshot a run sees.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::process::ProcessValues;
use super::resolve::{resolve, Layers, ProcessBinding, Source};
use super::sources::{read_source, ApiKeys};
use super::value::{ParamValue, Values};
use bindery_spec::{ParameterDecl, Scope};

#[derive(Clone, Debug, Default)]
pub struct AgentParams {
    decls: Vec<ParameterDecl>,
    process: BTreeMap<String, ProcessBinding>,
    /// Resolved defaults with how each reads (`env BILLING_TOKEN`).
    defaults: BTreeMap<String, (ParamValue, String)>,
    /// Defaults that could not be read, and why.
    default_problems: BTreeMap<String, String>,
}

/// How one parameter stands, for `check`, `GET /v1/agents` and status.
/// Holds no value.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ParamStatus {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub scope: Scope,
    pub secret: bool,
    pub required: bool,
    /// `pinned`, `set`, `env BINDERY_PARAM_X`, `default:env X`, `session`, `message`, `unbound`.
    pub source: String,
    /// The process supplies a value (so a session need not).
    pub bound: bool,
    pub pinned: bool,
    /// What is wrong, when something is (a default that could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl AgentParams {
    /// Match process values with declarations and read defaults. Problems
    /// come back as messages naming the parameter (the caller adds the
    /// agent and file).
    pub fn build(
        decls: &[ParameterDecl],
        process: &ProcessValues,
        base_dir: &Path,
        api_keys: &ApiKeys,
    ) -> (AgentParams, Vec<String>) {
        let mut out = AgentParams {
            decls: decls.to_vec(),
            ..Default::default()
        };
        let mut errors = Vec::new();
        for decl in decls {
            if let Some(pv) = process.get(&decl.name) {
                match ParamValue::for_parameter(decl.secret, pv.value.0.clone()) {
                    Ok(value) => {
                        out.process.insert(
                            decl.name.clone(),
                            ProcessBinding {
                                value,
                                pinned: pv.pinned,
                                origin: pv.origin.clone(),
                            },
                        );
                    }
                    Err(e) => {
                        errors.push(format!("parameter `{}` ({}): {e}", decl.name, pv.origin))
                    }
                }
            }
            if let Some(src) = &decl.default {
                let how = src.describe();
                let value = read_source(src, base_dir, api_keys)
                    .map_err(|e| e.to_string())
                    .and_then(|v| {
                        ParamValue::for_parameter(decl.secret, v).map_err(|e| e.to_string())
                    });
                match value {
                    Ok(v) => {
                        out.defaults.insert(decl.name.clone(), (v, how));
                    }
                    Err(e) => {
                        out.default_problems
                            .insert(decl.name.clone(), format!("default ({how}): {e}"));
                    }
                }
            }
        }
        (out, errors)
    }

    pub fn decls(&self) -> &[ParameterDecl] {
        &self.decls
    }

    pub fn decl(&self, name: &str) -> Option<&ParameterDecl> {
        self.decls.iter().find(|d| d.name == name)
    }

    pub fn is_pinned(&self, name: &str) -> bool {
        self.process.get(name).is_some_and(|p| p.pinned)
    }

    fn layers<'a>(&'a self, name: &str, session: &'a Values, message: &'a Values) -> Layers<'a> {
        Layers {
            process: self.process.get(name),
            session: session.get(name),
            message: message.get(name),
            default: self.defaults.get(name).map(|(v, how)| (v, how.as_str())),
        }
    }

    /// One parameter's value and source given a session's and a run's values.
    pub fn resolve<'a>(
        &'a self,
        decl: &ParameterDecl,
        session: &'a Values,
        message: &'a Values,
    ) -> (Option<&'a ParamValue>, Source) {
        resolve(decl, self.layers(&decl.name, session, message))
    }

    /// Every bound parameter's value for one run.
    pub fn snapshot(&self, session: &Values, message: &Values) -> Values {
        self.decls
            .iter()
            .filter_map(|d| {
                let (v, _) = self.resolve(d, session, message);
                v.map(|v| (d.name.clone(), v.clone()))
            })
            .collect()
    }

    /// Required parameters with no value in this snapshot.
    pub fn missing_required(&self, values: &Values) -> Vec<String> {
        self.decls
            .iter()
            .filter(|d| d.required && !values.contains_key(&d.name))
            .map(|d| d.name.clone())
            .collect()
    }

    /// Why a default did not resolve, if it did not.
    pub fn default_problem(&self, name: &str) -> Option<&str> {
        self.default_problems.get(name).map(String::as_str)
    }

    /// How each parameter stands with process values only.
    pub fn statuses(&self) -> Vec<ParamStatus> {
        let none = Values::new();
        self.decls
            .iter()
            .map(|d| {
                let (value, source) = self.resolve(d, &none, &none);
                let source = match (&source, d.scope) {
                    (Source::Unbound, Scope::Session) => "session".to_string(),
                    (Source::Unbound, Scope::Message) => "message".to_string(),
                    _ => source.to_string(),
                };
                ParamStatus {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    scope: d.scope,
                    secret: d.secret,
                    required: d.required,
                    source,
                    bound: value.is_some(),
                    pinned: self.is_pinned(&d.name),
                    problem: self.default_problem(&d.name).map(str::to_string),
                }
            })
            .collect()
    }
}
