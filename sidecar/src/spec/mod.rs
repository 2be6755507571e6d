//! The agent definition: one type tree that is both Bindery's file format
//! and the `Agent` custom resource's `spec`.
//!
//! A native agent file is a Kubernetes-style document (`apiVersion`,
//! `kind: Agent`, `metadata.name`, `spec`), so the very file a platform team
//! `kubectl apply`s is the one `bindery-sidecar check` reads. agents-exe's
//! JSON files are read too (see [`agents_exe`]) and converted into the same
//! types.

pub mod agents_exe;
pub mod checks;
#[cfg(feature = "crd")]
pub mod crd;
pub mod document;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use document::{from_yaml, to_yaml, AgentDocument, Metadata, API_VERSION, KIND};

/// What an agent is: its model, prompt, parameters, tools and helpers.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[cfg_attr(feature = "crd", derive(kube::CustomResource))]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "bindery.dev",
        version = "v1alpha1",
        kind = "Agent",
        namespaced,
        status = "crd::AgentStatus",
        shortname = "agt",
        category = "bindery",
        printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
        printcolumn = r#"{"name":"Announce","type":"string","jsonPath":".spec.announce","priority":1}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSpec {
    /// One line telling a calling agent (or a human) what this agent does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<String>,
    pub model: ModelSpec,
    /// The system prompt, verbatim. Parameters are never substituted into it.
    #[serde(default)]
    pub system_prompt: String,
    /// Named holes a caller fills with values; tool arguments bind to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<ParameterDecl>,
    /// Where the agent's tools come from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub toolboxes: Vec<Toolbox>,
    /// Bindings matched against model-visible tool names (`bash_query-*`),
    /// applied after every toolbox's own bindings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// Sub-agents this agent may prompt, each exposed as `prompt_agent_<slug>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helpers: Vec<HelperRef>,
    /// Upper bound on model turns in one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
}

/// The model an agent talks to, over an OpenAI-compatible API.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// API dialect. Any string is accepted; every flavor is spoken as
    /// OpenAI chat completions today.
    #[serde(default = "default_flavor")]
    pub flavor: String,
    /// Base URL; requests go to `{url}/chat/completions`.
    pub url: String,
    /// The model name sent in each request.
    pub name: String,
    /// Where the API key comes from (none: no `Authorization` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ValueSource>,
}

fn default_flavor() -> String {
    "openai".to_string()
}

/// Any JSON value; in a CRD schema, a field Kubernetes keeps as it is.
pub(crate) fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Any JSON value.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A parameter an agent declares.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParameterDecl {
    /// `[a-z][a-z0-9_]*`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A secret value is a string that is never persisted, logged, traced or returned.
    #[serde(default)]
    pub secret: bool,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default = "yes")]
    pub required: bool,
    /// Used when nobody supplies a value; resolved once, when the agent loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<ValueSource>,
}

fn yes() -> bool {
    true
}

/// Who may supply a parameter's value, and for how long it lasts.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    /// Only the operator, when the process starts.
    #[default]
    Process,
    /// A client too, for the life of a session.
    Session,
    /// A client too, for one run only.
    Message,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Process => "process",
            Scope::Session => "session",
            Scope::Message => "message",
        }
    }
}

/// Where a value comes from when it is not written inline.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ValueSource {
    /// The value itself (any JSON).
    Value(#[schemars(schema_with = "any_json")] serde_json::Value),
    /// An environment variable of the sidecar process.
    Env(String),
    /// A file's content, with trailing whitespace trimmed. Relative paths are
    /// relative to the agent file.
    File(String),
    /// A command (program and arguments, no shell) whose trimmed stdout is the value.
    Command(Vec<String>),
    /// An entry of the API-keys file, by id (agents-exe's `ApiKey` source).
    ApiKey(String),
}

impl ValueSource {
    /// How the source reads in `check`: `env BILLING_TOKEN`, `file ./token`.
    pub fn describe(&self) -> String {
        match self {
            ValueSource::Value(_) => "value".to_string(),
            ValueSource::Env(v) => format!("env {v}"),
            ValueSource::File(p) => format!("file {p}"),
            ValueSource::Command(c) => format!("command {}", c.first().map_or("", |s| s)),
            ValueSource::ApiKey(id) => format!("api-key {id}"),
        }
    }
}

/// A source of tools. Only bash toolboxes exist today; OpenAPI and MCP
/// toolboxes will be further variants of this enum.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Toolbox {
    Bash(BashToolbox),
}

/// Executables that speak the bash tool protocol (`describe` / `run`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BashToolbox {
    /// Every executable file in this directory is a tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// Only files whose name ends with this suffix (with `directory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basename_filter: Option<String>,
    /// A single executable is the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Bindings matched against the script's own slug (`query-*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
}

/// Ties one tool argument to a parameter or a literal. The argument
/// disappears from what the model sees; the value is merged in at call time.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    /// Glob (`*` matches any run of characters) on the tool name; absent: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub arg: String,
    pub value: BindingValue,
    #[serde(default, skip_serializing_if = "WhenUnbound::is_fail")]
    pub when_unbound: WhenUnbound,
}

/// The value side of a binding.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum BindingValue {
    /// The current value of one of the agent's parameters.
    Param(String),
    /// A fixed value.
    Literal(#[schemars(schema_with = "any_json")] serde_json::Value),
}

/// What a binding does when its parameter has no value.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum WhenUnbound {
    /// The call fails (the model is told only that the tool is unavailable).
    #[default]
    Fail,
    /// The argument is left out of the call (optional arguments only).
    Omit,
    /// The model sees and fills the argument while the parameter is unbound.
    Expose,
}

impl WhenUnbound {
    fn is_fail(&self) -> bool {
        *self == WhenUnbound::Fail
    }
}

/// A sub-agent this agent may prompt.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HelperRef {
    /// The name in `prompt_agent_<slug>`; defaults to the helper's own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    /// Another `Agent` by name (in Kubernetes: same namespace; on the
    /// command line: another loaded agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// An agent file, relative to this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The helper's parameters this agent fills, from its own scope.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub with: BTreeMap<String, BindingValue>,
    /// `false` refuses call-time narrowing of this helper.
    #[serde(default = "yes")]
    pub narrowable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON schema the Agent CRD is generated from covers the spec.
    #[test]
    fn the_spec_has_a_json_schema() {
        let schema = serde_json::to_value(schemars::schema_for!(AgentSpec)).unwrap();
        let props = schema["properties"].as_object().unwrap();
        for field in [
            "model",
            "systemPrompt",
            "parameters",
            "toolboxes",
            "bindings",
            "helpers",
        ] {
            assert!(props.contains_key(field), "{field} missing from {props:?}");
        }
        assert_eq!(schema["required"], serde_json::json!(["model"]));
    }
}
