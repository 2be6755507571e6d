//! The agent definition: one type tree that is both Bindery's file format
//! and the `Agent` custom resource's `spec`, with the static checks and the
//! diagnostics they give. Both binaries depend on this crate: the sidecar
//! reads agent files into these types, the operator reads `Agent` resources.
//!
//! A native agent file is a Kubernetes-style document (`apiVersion`,
//! `kind: Agent`, `metadata.name`, `spec`), so the very file a platform team
//! `kubectl apply`s is the one `bindery-sidecar check` reads. agents-exe's
//! JSON files are read too (see [`agents_exe`]) and converted into the same
//! types.

pub mod agents_exe;
pub mod budget;
pub mod checks;
pub mod condition;
#[cfg(feature = "crd")]
pub mod crd;
pub mod depends;
pub mod diagnostic;
pub mod document;
pub mod filter;
pub mod flavor;
pub mod jsonpath;
pub mod prices;
pub mod provider;
pub mod sandbox;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use depends::{Dependency, ToolDecl};
pub use document::{from_yaml, to_yaml, AgentDocument, Metadata, YamlError, API_VERSION, KIND};
pub use filter::EndpointFilter;

/// A parameter name: `[a-z][a-z0-9_]*`.
pub fn valid_param_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// Whether `s` is an `http://` or `https://` URL, its scheme in any case
/// (`HTTP://…` too, which URL parsers accept: it is never a file's path).
pub fn http_url(s: &str) -> bool {
    let lower = |n: usize| s.get(..n).map(str::to_ascii_lowercase);
    lower(7).as_deref() == Some("http://") || lower(8).as_deref() == Some("https://")
}

/// `s` as a diagnostic quotes it: control characters escaped, and cut
/// to 80 characters (a name may be anything a file holds).
pub fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_default).collect();
    if s.chars().nth(80).is_some() {
        out.push('…');
    }
    out
}

/// "a string", "an object": for messages that must not quote a value.
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

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
// A cost budget needs a price, the model's own or the shipped table's
// (`prices`): checked by the operator and the server, not the API server,
// which does not have the table.
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
    /// What the author says about tools by model-visible name (`bash_book`): `readOnly`, and
    /// the lookups a tool depends on (`depends_on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDecl>,
    /// Sub-agents this agent may prompt, each exposed as `prompt_agent_<slug>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helpers: Vec<HelperRef>,
    /// Upper bound on model turns in one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// How its tools are named: `bindery` (the default), or `agentsExe`:
    /// as agents-exe names them (`sqlite_<name>_query` taking `sql`,
    /// `system_<name>_system_info`, `openapi_openapi_<operationId>`,
    /// `postgrest_postgrest_<method>_<table>`), so that prompts and
    /// recorded sessions written for agents-exe keep matching. agents-exe's
    /// own files load with it.
    #[serde(default, skip_serializing_if = "Naming::is_default")]
    pub naming: Naming,
    /// Tools whose calls wait for a person's approval, by model-visible
    /// name (`bash_delete-*`), on top of each toolbox's own `confirm`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirm: Vec<ConfirmSelector>,
    /// How long a call waits for approval (`90s`, `15m`, `2h`) before it is
    /// closed as not approved; absent: as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[0-9]+[smhd]$')",
        "message": "confirmTtl is a number and a unit: 90s, 15m, 2h or 1d"
    }]))]
    pub confirm_ttl: Option<String>,
    /// What `/mcp` serves of this agent besides its `ask_<agent>` tool.
    #[serde(default, skip_serializing_if = "McpSpec::is_default")]
    pub mcp: McpSpec,
    /// Where the calls that wait for a person are announced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<ApprovalsSpec>,
    /// Caps on the tokens, tool calls and cost of this agent's runs, each
    /// over a window; a tenant may replace one by name or add more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub budgets: Vec<budget::Budget>,
}

/// Approvals delivered out of band.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalsSpec {
    /// A signed notice is POSTed here for every call that starts waiting
    /// for a person's approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
}

/// An approval webhook: where notices go, and the key that signs them.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    /// The receiver, `https://` (or `http://`).
    #[schemars(length(max = 2048))]
    pub url: String,
    /// The HMAC-SHA256 key: a secret, process-scope parameter of this
    /// agent (`{param: approvals_key}`), which a tenant maps to its Secret.
    pub signing_key: ParamRef,
}

/// A parameter of the agent, by name.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParamRef {
    pub param: String,
}

/// What an agent offers MCP clients on the server's `/mcp` endpoint.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpSpec {
    /// List the agent's own tools on `/mcp`, as its model sees them (bound
    /// arguments removed), and run a client's call of one through the same
    /// bindings, confirmations and lookups as a model's call. Off by default.
    #[serde(default)]
    pub expose_tools: bool,
}

impl McpSpec {
    fn is_default(&self) -> bool {
        *self == McpSpec::default()
    }
}

/// One selector of tools that need a person's approval: a glob (`*`
/// matches any run of characters) on the tool name, like a binding's `tool`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfirmSelector {
    pub tool: String,
    /// Ask only when this CEL condition holds for the call, over `args` (its
    /// arguments as the tool gets them, bound values included; a secret
    /// reads `"<secret>"`) and `params` (the run's non-secret values):
    /// `args.amount > 100 || args.currency != 'EUR'`. A condition that
    /// cannot be evaluated asks. Absent: every call asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub when: Option<String>,
}

/// A toolbox's `confirm`: `writes` (every tool that may change something:
/// MCP tools not annotated `readOnlyHint: true`, OpenAPI operations other
/// than GET, HEAD and OPTIONS, every bash tool not declared `readOnly`), or selectors on the
/// tools' names inside the toolbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum ToolboxConfirm {
    Writes(ConfirmKeyword),
    Tools(Vec<ConfirmSelector>),
}

/// The keyword form of a toolbox's `confirm`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ConfirmKeyword {
    Writes,
}

/// A string or a list: kept as JSON in a CRD schema (`writes` or `[{tool}]`).
fn toolbox_confirm_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "`writes` (every tool that may change something), or a list of `{tool: glob}` on the tools' names inside the toolbox: their calls wait for a person's approval.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A `confirmTtl` such as `90s`, `15m`, `2h` or `1d`, in seconds.
pub fn parse_ttl(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    n.checked_mul(mult).filter(|s| *s > 0)
}

/// The model an agent talks to, and in which API.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// The API spoken: `openai` (chat completions, the default),
    /// `openai-responses`, `anthropic`, `gemini`, `bedrock` or
    /// `azure-openai`. See docs/providers.md.
    #[serde(default, skip_serializing_if = "provider::Provider::is_default")]
    pub provider: provider::Provider,
    /// API dialect, all of them OpenAI's chat completions: `openai` (the
    /// default), `kimi`, `mistral` (adds `tool_choice: auto` and
    /// `parallel_tool_calls: true` to every request) or `claude` (adds
    /// extended thinking), as agents-exe's flavours of those names do;
    /// agents-exe's spellings (`MistralV1`, …) are read too.
    #[serde(default = "default_flavor")]
    pub flavor: String,
    /// Base URL; requests go to `{url}/chat/completions` (`openai`),
    /// `{url}/messages` (`anthropic`), or the provider's own path under it
    /// (docs/providers.md).
    pub url: String,
    /// The model name sent in each request (Bedrock's model id or
    /// inference profile; Azure's deployment).
    pub name: String,
    /// Where the API key comes from (none: no key is sent, or, for
    /// `bedrock` and `azure-openai`, the pod's cloud identity is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ValueSource>,
    /// What the model costs, for usage reports and `cost` budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<budget::Pricing>,
    /// The longest reply, in tokens (`max_tokens`, or OpenAI's
    /// `max_completion_tokens`). Anthropic requires one: 8192 when not
    /// given; elsewhere none is sent unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
    /// Thinking before answering (`anthropic`, `bedrock`'s Claude models,
    /// `gemini`): its budget, less than `maxTokens`. Its blocks go back to the model with each next
    /// request, as the API requires, and are never shown as the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<provider::Thinking>,
    /// Amazon Bedrock's region and keys (`provider: bedrock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock: Option<provider::BedrockSettings>,
    /// Azure OpenAI's `apiVersion` (`provider: azure-openai`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<provider::AzureSettings>,
    /// Other models, any provider, tried in order when this one (after its
    /// retries) answers 429, 529 or another 5xx, cannot be reached, or
    /// does not answer in time. See docs/providers.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub fallbacks: Vec<FallbackModel>,
}

/// A model tried when the one before it fails: a model's fields without
/// fallbacks of its own (a CRD's schema cannot be recursive).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FallbackModel {
    /// As the model's `provider`.
    #[serde(default, skip_serializing_if = "provider::Provider::is_default")]
    pub provider: provider::Provider,
    /// As the model's `flavor`.
    #[serde(default = "default_flavor")]
    pub flavor: String,
    /// As the model's `url`.
    pub url: String,
    /// As the model's `name`.
    pub name: String,
    /// As the model's `apiKey`: its own key, for its own URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ValueSource>,
    /// As the model's `pricing`: what a request it answers costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<budget::Pricing>,
    /// As the model's `maxTokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
    /// As the model's `thinking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<provider::Thinking>,
    /// As the model's `bedrock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock: Option<provider::BedrockSettings>,
    /// As the model's `azure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<provider::AzureSettings>,
}

impl FallbackModel {
    /// This fallback as a model of its own (no fallbacks).
    pub fn as_model(&self) -> ModelSpec {
        ModelSpec {
            provider: self.provider,
            flavor: self.flavor.clone(),
            url: self.url.clone(),
            name: self.name.clone(),
            api_key: self.api_key.clone(),
            pricing: self.pricing.clone(),
            max_tokens: self.max_tokens,
            thinking: self.thinking.clone(),
            bedrock: self.bedrock.clone(),
            azure: self.azure.clone(),
            fallbacks: Vec::new(),
        }
    }
}

impl ModelSpec {
    /// The models in the order they are tried: this one (without its
    /// fallbacks), then each fallback.
    pub fn chain(&self) -> Vec<ModelSpec> {
        let first = ModelSpec {
            fallbacks: Vec::new(),
            ..self.clone()
        };
        std::iter::once(first)
            .chain(self.fallbacks.iter().map(FallbackModel::as_model))
            .collect()
    }
}

fn default_flavor() -> String {
    "openai".to_string()
}

/// How an agent's tools are named (see [`AgentSpec::naming`]).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Naming {
    #[default]
    #[serde(rename = "bindery")]
    Bindery,
    #[serde(rename = "agentsExe")]
    AgentsExe,
}

impl Naming {
    pub fn is_default(&self) -> bool {
        *self == Naming::default()
    }

    /// The prefix of a helper's tool: `prompt_agent_`, or agents-exe's
    /// `io_prompt_agent_`.
    pub fn helper_prefix(self) -> &'static str {
        match self {
            Naming::Bindery => "prompt_agent_",
            Naming::AgentsExe => "io_prompt_agent_",
        }
    }
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
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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

/// A source of tools: executables (bash), an HTTP API described by an
/// OpenAPI document, a PostgREST server, an MCP server, or tools built
/// into the sidecar.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Toolbox {
    Bash(BashToolbox),
    Openapi(OpenApiToolbox),
    Postgrest(PostgrestToolbox),
    Mcp(McpToolbox),
    Deferred(DeferredToolbox),
    Builtin(BuiltinToolbox),
    Sqlite(SqliteToolbox),
}

impl Toolbox {
    /// The on-demand group its tools belong to, if any.
    pub fn toolgroup(&self) -> Option<&str> {
        match self {
            Toolbox::Bash(t) => t.toolgroup.as_deref(),
            Toolbox::Openapi(t) => t.toolgroup.as_deref(),
            Toolbox::Postgrest(t) => t.toolgroup.as_deref(),
            Toolbox::Mcp(t) => t.toolgroup.as_deref(),
            Toolbox::Builtin(t) => t.toolgroup.as_deref(),
            Toolbox::Sqlite(t) => t.toolgroup.as_deref(),
            Toolbox::Deferred(_) => None,
        }
    }
}

/// Tools given by their schema only: the model calls them, the client runs
/// them. A call stops the run with the call pending until the client posts
/// its result to the call's continuation.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeferredToolbox {
    pub tools: Vec<DeferredTool>,
}

/// One deferred tool, as the model sees it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeferredTool {
    /// The model-visible name, as is.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The JSON schema of the arguments (an object schema).
    #[serde(default = "empty_object_schema")]
    #[schemars(schema_with = "any_json")]
    pub parameters: serde_json::Value,
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// A PostgREST server: one tool per table and allowed method,
/// `postgrest_<name>_<method>_<table>`. Its arguments (column filters,
/// `select`, `order`, `limit`, `offset`, body columns) are bound exactly
/// like an OpenAPI toolbox's.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgrestToolbox {
    /// Part of the tools' names: letters, digits, `_` and `-`.
    pub name: String,
    /// Where requests go (PostgREST's root).
    pub base_url: String,
    /// The OpenAPI document PostgREST serves (default: `{baseUrl}/`), or a
    /// file relative to the agent file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
    /// `GET` (the default), `POST`, `PATCH`, `DELETE`.
    #[serde(default = "read_only", skip_serializing_if = "is_read_only")]
    pub allowed_methods: Vec<String>,
    /// Which of those operations become tools (default: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "filter::filter_schema")]
    pub filter: Option<EndpointFilter>,
    /// Headers sent with every call (not when the document is fetched);
    /// no credential: those go in `secrets`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// Which redirects requests follow: `sameOrigin` (the default: only to
    /// the same scheme, host and port) or `none`.
    #[serde(default, skip_serializing_if = "Redirects::is_default")]
    pub redirects: Redirects,
    /// Credentials added to every request (as for OpenAPI), e.g. a JWT as
    /// `Authorization: Bearer {{secret}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<OpenApiSecret>,
    /// Which tools wait for a person's approval before they run (`writes`:
    /// every method but GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "toolbox_confirm_schema")]
    pub confirm: Option<ToolboxConfirm>,
    /// Bindings matched against `<method>_<table>` (`get_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

fn read_only() -> Vec<String> {
    vec!["GET".to_string()]
}

fn is_read_only(v: &Vec<String>) -> bool {
    *v == read_only()
}

impl PostgrestToolbox {
    /// The same server as an OpenAPI toolbox: what loading and the checks
    /// of secrets and bindings share with OpenAPI.
    pub fn as_openapi(&self) -> OpenApiToolbox {
        OpenApiToolbox {
            spec: self
                .spec
                .clone()
                .unwrap_or_else(|| format!("{}/", self.base_url.trim_end_matches('/'))),
            base_url: self.base_url.clone(),
            timeout_seconds: self.timeout_seconds,
            max_response_bytes: self.max_response_bytes,
            redirects: self.redirects,
            secrets: self.secrets.clone(),
            filter: self.filter.clone(),
            headers: self.headers.clone(),
            confirm: self.confirm.clone(),
            tools: Vec::new(),
            bindings: self.bindings.clone(),
            toolgroup: self.toolgroup.clone(),
        }
    }
}

/// Tools built into the sidecar, in agents-exe's system toolbox's terms:
/// one tool `io_<name>` whose `capability` argument picks what it reports
/// (bind it to a literal to offer a single capability).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuiltinToolbox {
    /// The tool is `io_<name>`: letters, digits, `_` and `-`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `date`, `hostname`, `operating-system`, `working-directory`,
    /// `running-user`, `uptime`, `process-info`, `env-vars`, the calling
    /// session's `read-session` and `get-session-stats`,
    /// `list-sessions` and `search-sessions` over its fork lineage, and
    /// `attach-file` (a file `fileSandbox` allows, as media).
    pub capabilities: Vec<String>,
    /// With `env-vars`: the only environment variables it shows, by exact
    /// name (never one that holds a parameter's or credential's value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_vars: Vec<String>,
    /// With `read-session`: whether the tools' outputs in the session are
    /// shown (default: yes); `false` shows each as elided.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub session_tool_outputs: bool,
    /// With `list-sessions` and `search-sessions`: which sessions of the
    /// calling session's fork lineage they reach (default `subtree`).
    /// Never more than that lineage: `all` is the lineage too.
    #[serde(default, skip_serializing_if = "SessionScope::is_subtree")]
    pub session_scope: SessionScope,
    /// With `list-sessions` and `search-sessions`: the most sessions one
    /// answer holds (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_max_results: Option<u32>,
    /// With `attach-file`: which files it may read (judged on the canonical
    /// path); absent: none, as in agents-exe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sandbox: Option<sandbox::FileSandbox>,
    /// Bindings matched against `<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

/// Which sessions of the calling session's fork lineage (itself, the
/// sessions it was forked from and those forked from it, transitively)
/// `list-sessions` and `search-sessions` reach: agents-exe's
/// `SessionIntrospectionScope`, read within that lineage.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SessionScope {
    /// The sessions it was forked from, transitively.
    ParentsOnly,
    /// The sessions forked from it, transitively.
    ChildrenOnly,
    /// Its ancestors, itself and its descendants: the whole lineage.
    #[default]
    Subtree,
    /// agents-exe's every session of the store; here the whole lineage,
    /// as `subtree` (`check` warns).
    All,
}

impl SessionScope {
    fn is_subtree(&self) -> bool {
        *self == SessionScope::Subtree
    }

    /// Its name in agent files.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionScope::ParentsOnly => "parents-only",
            SessionScope::ChildrenOnly => "children-only",
            SessionScope::Subtree => "subtree",
            SessionScope::All => "all",
        }
    }
}

/// An SQLite database file the model queries with SQL, one statement a
/// call, through the tool `sqlite_<name>` (arguments `query` and `params`).
/// Read-only unless `readWrite`; no statement may attach another file,
/// change a pragma or load an extension.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SqliteToolbox {
    /// The tool is `sqlite_<name>`: letters, digits, `_` and `-`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The database file; relative to the agent file. It must exist,
    /// unless `create`.
    pub path: String,
    /// Allow statements that change the database (default: read-only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_write: bool,
    /// Create an empty database where there is none (agents-exe does).
    #[serde(default, skip_serializing_if = "is_false")]
    pub create: bool,
    /// At most this many rows in a result (default 200); more are cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<u32>,
    /// A statement running longer is interrupted (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Bindings matched against `<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// Each write goes to a new copy of the database, never to `path`
    /// itself (agents-exe's `SqliteVersioned`); a second tool,
    /// `<tool>_promote`, makes a copy the new `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioned: Option<SqliteVersions>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

/// Copies of a database kept per write, and who sees which.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SqliteVersions {
    /// Whose latest copy a statement reads: `global` (every session's),
    /// `conversation` (the session's), `turn` (the model turn's) or
    /// `tool-call` (none: each call starts from `path`).
    pub shared: SqliteSharing,
    /// Where the copies go (relative like `path`); default agents-exe's:
    /// `$XDG_DATA_HOME/agents/sqlite-versions`, else
    /// `~/.local/share/agents/sqlite-versions`, else
    /// `/tmp/agents-sqlite-versions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_root: Option<String>,
    /// The most copies one session may make (default 100): each is the
    /// whole database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_copies: Option<u32>,
    /// The most bytes one session's copies may take together (default
    /// 1 GiB): a copy is refused past it, and a write cannot grow one
    /// beyond it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// [`SqliteVersions::shared`].
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SqliteSharing {
    Global,
    Conversation,
    Turn,
    ToolCall,
}

/// An MCP server whose tools the agent gets as `mcp_<name>_<tool>`: a
/// program started once per agent tree (stdio), or a remote server over
/// streamable HTTP (exactly one of `command` or `url`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpToolbox {
    /// The server's name in tool names: letters, digits, `_` and `-`.
    pub name: String,
    /// Program and arguments, no shell. A relative program path with a `/`
    /// is relative to the agent file; a bare name is looked up in `PATH`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The program's whole environment besides `PATH` and `HOME`: literals
    /// and process-scope parameters only (the process serves every session).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, BindingValue>,
    /// A remote server's streamable-HTTP endpoint (`http(s)://…/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent to a remote server with every request: literals and
    /// process-scope parameters only, like `env`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, BindingValue>,
    /// Which redirects requests to a remote server follow: `sameOrigin`
    /// (the default: only to the same scheme, host and port) or `none`.
    #[serde(default, skip_serializing_if = "Redirects::is_default")]
    pub redirects: Redirects,
    /// How a remote server authorizes its clients: OAuth 2.1 as the MCP
    /// authorization spec says (discovery from the server's 401, tokens
    /// from its authorization server, kept in memory only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<McpOAuth>,
    /// Which tools wait for a person's approval before they run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "toolbox_confirm_schema")]
    pub confirm: Option<ToolboxConfirm>,
    /// Bindings matched against the server's own tool names (`get_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// What the author says about tools by their names inside the toolbox: `readOnly`, and
    /// the lookups a tool depends on (`depends_on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDecl>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
    /// A per-user server (its `headers` take an end user's value): its
    /// tools are listed through a person's own connection and shown to
    /// every person's model. `true` says the server lists the same tools
    /// for everyone, holding nothing of a person's; without it such a
    /// toolbox is refused at load (per-person tool lists are not offered).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_tool_list: bool,
}

/// OAuth 2.1 for a remote MCP server (`url`). The client secret and the
/// private key are literals or, better, process-scope secret parameters
/// (an AgentTenant maps them from Kubernetes Secrets).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpOAuth {
    /// `client-credentials`: the tenant's own connection, no person
    /// involved; `authorization-code`: a person's connection, with their
    /// consent (PKCE S256).
    pub grant: OAuthGrant,
    /// The client id registered with the authorization server. Without it,
    /// an `authorization-code` client uses `clientMetadataUrl` where the
    /// server accepts one, else registers itself (RFC 7591) where the
    /// server offers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<BindingValue>,
    /// The client secret (`client_secret_basic`, `client_secret_post`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<BindingValue>,
    /// A PEM private key (PKCS#8, or PKCS#1 for RSA) that signs the client
    /// assertion of `private_key_jwt` (RFC 7523).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<BindingValue>,
    /// How the client authenticates at the token endpoint; by default
    /// `private_key_jwt` with `privateKey`, `client_secret_basic` with
    /// `clientSecret` (`client_secret_post` if the server only takes
    /// that), else `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// The assertion's algorithm, `RS256` or `ES256`; by default the
    /// key's own (an RSA key signs RS256, a P-256 key ES256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_algorithm: Option<JwtAlgorithm>,
    /// The scopes asked for; by default those of the server's challenge,
    /// else those its metadata lists, else none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// `authorization-code`: where the authorization server sends the
    /// person back with the code (default `http://localhost/oauth/callback`;
    /// a pre-registered client must have it registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_uri: Option<String>,
    /// `authorization-code`: an https URL of this client's metadata
    /// document, used as its client id by servers that accept those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// The authorization server trusted with the client's credential: the
    /// discovered server's `issuer` must be exactly this URL. Without it, a
    /// toolbox with `clientSecret` or `privateKey` takes only an
    /// authorization server on the MCP server's own origin (the server's
    /// metadata could otherwise send the credential anywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

impl McpToolbox {
    /// Whether the toolbox connects once per person: a remote server whose
    /// `headers` take an end user's value (`{identity: …}`).
    pub fn per_user(&self) -> bool {
        self.url.is_some()
            && self
                .headers
                .values()
                .any(|v| matches!(v, BindingValue::Identity(_)))
    }
}

impl McpOAuth {
    /// Its values that may be parameters, named as the file names them.
    pub fn values(&self) -> BTreeMap<String, BindingValue> {
        [
            ("clientId", &self.client_id),
            ("clientSecret", &self.client_secret),
            ("privateKey", &self.private_key),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
        .collect()
    }
}

/// Which OAuth grant gets the tokens.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OAuthGrant {
    ClientCredentials,
    AuthorizationCode,
}

/// Token endpoint client authentication, by its RFC 7591 name.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TokenEndpointAuth {
    ClientSecretBasic,
    ClientSecretPost,
    PrivateKeyJwt,
    None,
}

impl TokenEndpointAuth {
    pub fn as_str(&self) -> &'static str {
        match self {
            TokenEndpointAuth::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuth::ClientSecretPost => "client_secret_post",
            TokenEndpointAuth::PrivateKeyJwt => "private_key_jwt",
            TokenEndpointAuth::None => "none",
        }
    }
}

/// A client assertion's signature algorithm.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum JwtAlgorithm {
    RS256,
    ES256,
}

/// An HTTP API described by an OpenAPI 3.x document: one tool per operation.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiToolbox {
    /// The OpenAPI document (JSON or YAML): a file, relative to the agent
    /// file (`file://` URLs too), or an `http(s)` URL fetched when the agent loads.
    pub spec: String,
    /// Where requests go: `{baseUrl}{path}`.
    pub base_url: String,
    /// How long one request may take (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Bytes of response body kept; the rest is cut and the model told so
    /// (default 262144).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// Which redirects requests follow: `sameOrigin` (the default: only to
    /// the same scheme, host and port) or `none`.
    #[serde(default, skip_serializing_if = "Redirects::is_default")]
    pub redirects: Redirects,
    /// Credentials added to every request, never visible to the model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<OpenApiSecret>,
    /// Which operations become tools (default: all of them). One it
    /// refuses is no tool at all: the model cannot call it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "filter::filter_schema")]
    pub filter: Option<EndpointFilter>,
    /// Headers sent with every call (not when the document is fetched);
    /// no credential: those go in `secrets`, which a header of the same
    /// name gives way to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Which tools wait for a person's approval before they run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "toolbox_confirm_schema")]
    pub confirm: Option<ToolboxConfirm>,
    /// Bindings matched against the operation's tool name (`list_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// What the author says about tools by their names inside the toolbox: `readOnly`, and
    /// the lookups a tool depends on (`depends_on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDecl>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

/// Which redirects an HTTP toolbox's requests follow. Credentials go only
/// to the origin they were written for, so a redirect to another origin
/// (scheme, host or port) is never followed: the call fails instead.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Redirects {
    /// Those that stay on the origin of the request, a few hops at most.
    #[default]
    #[serde(rename = "sameOrigin")]
    SameOrigin,
    /// None: a redirect answer fails the call.
    #[serde(rename = "none")]
    Never,
}

impl Redirects {
    pub fn is_default(&self) -> bool {
        *self == Redirects::default()
    }
}

/// A credential of an OpenAPI toolbox: where its value comes from and where
/// it goes in each request (exactly one of `header` or `query`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiSecret {
    pub source: SecretSource,
    /// Sent as a request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<SecretHeader>,
    /// Sent as this query-string parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Also send it when fetching `spec` over http(s) at load time. Such a
    /// secret cannot come from a session- or message-scope parameter.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fetch_spec: bool,
    /// How the value read is turned into the secret: `base64` or `hex`
    /// (its bytes must then be UTF-8 text). Absent: as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<SecretDecode>,
    /// Keep the value's trailing white space (a file's last newline);
    /// by default it is removed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_whitespace: bool,
}

/// Whether one of `secrets` is sent as header `name` (any case): a plain
/// header of that name gives way to it.
pub fn secret_sets_header(secrets: &[OpenApiSecret], name: &str) -> bool {
    secrets.iter().any(|s| {
        s.header
            .as_ref()
            .is_some_and(|h| h.name.eq_ignore_ascii_case(name))
    })
}

/// How a secret's value is decoded (agents-exe's `Base64`, `Hexadecimal`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretDecode {
    #[serde(rename = "base64")]
    Base64,
    #[serde(rename = "hex")]
    Hex,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Where a toolbox secret's value comes from: `{param: NAME}`, a parameter
/// of the agent read at each request from the run's values (so a
/// session-scope token works), or any [`ValueSource`] form, read once when
/// the agent loads.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum SecretSource {
    /// One of the agent's parameters, at each request.
    Param(String),
    /// The value itself.
    Value(#[schemars(schema_with = "any_json")] serde_json::Value),
    /// An environment variable of the sidecar process.
    Env(String),
    /// A file's content, trimmed; relative to the agent file.
    File(String),
    /// A command's trimmed stdout.
    Command(Vec<String>),
    /// An entry of the API-keys file.
    ApiKey(String),
    /// Taken from the end user the session belongs to (their token
    /// exchanged for a downstream audience, as a rule).
    Identity(IdentityValue),
}

impl SecretSource {
    /// The load-time source, or `None` for a parameter.
    pub fn value_source(&self) -> Option<ValueSource> {
        Some(match self {
            SecretSource::Param(_) | SecretSource::Identity(_) => return None,
            SecretSource::Value(v) => ValueSource::Value(v.clone()),
            SecretSource::Env(v) => ValueSource::Env(v.clone()),
            SecretSource::File(v) => ValueSource::File(v.clone()),
            SecretSource::Command(v) => ValueSource::Command(v.clone()),
            SecretSource::ApiKey(v) => ValueSource::ApiKey(v.clone()),
        })
    }

    /// How the source reads in messages: `param token`, `env API_TOKEN`.
    pub fn describe(&self) -> String {
        match (self, self.value_source()) {
            (SecretSource::Param(p), _) => format!("param {p}"),
            (SecretSource::Identity(i), _) => i.describe(),
            (_, Some(v)) => v.describe(),
            (_, None) => unreachable!("only a param or an identity has no value source"),
        }
    }
}

impl From<ValueSource> for SecretSource {
    fn from(v: ValueSource) -> Self {
        match v {
            ValueSource::Value(v) => SecretSource::Value(v),
            ValueSource::Env(v) => SecretSource::Env(v),
            ValueSource::File(v) => SecretSource::File(v),
            ValueSource::Command(v) => SecretSource::Command(v),
            ValueSource::ApiKey(v) => SecretSource::ApiKey(v),
        }
    }
}

/// A header carrying a secret.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretHeader {
    /// `Authorization`.
    pub name: String,
    /// The header value, with `{{secret}}` standing for the secret
    /// (`Bearer {{secret}}`); absent: the secret itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
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
    /// Which tools wait for a person's approval before they run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "toolbox_confirm_schema")]
    pub confirm: Option<ToolboxConfirm>,
    /// Bindings matched against the script's own slug (`query-*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// What the author says about tools by their names inside the toolbox: `readOnly`, and
    /// the lookups a tool depends on (`depends_on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDecl>,
    /// `shared`: the scripts run without the session's context (no `AGENT_SESSION_ID`,
    /// `AGENT_CONVERSATION_ID`, `AGENT_TURN_ID` or `AGENT_SESSION_JSON`), so with `serve
    /// --tool-cache-ttl` one result may answer the same call from any session. Absent: a
    /// result is reused only for a call handed the very same context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<ToolboxCache>,
    /// On demand: the toolbox's tools are hidden from the model until it
    /// activates this group (`meta_activate_tool`); absent: always shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

/// Whose calls a toolbox's cached results may answer.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ToolboxCache {
    /// Any session's: the tools are given nothing of the session.
    Shared,
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
    /// Taken from the end user the session belongs to: their subject, a
    /// claim of their identity token, or that token exchanged for one
    /// issued to a downstream audience.
    Identity(IdentityValue),
}

/// What a binding takes from the end user the session belongs to, written
/// as one word: `subject`, `claim:NAME`, or `token:AUDIENCE [SCOPE…]`
/// (scopes space-separated, as OAuth writes them). A run with no end user
/// (the owner's session) has none of these values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdentityValue {
    /// Their subject: the identity provider's id of them.
    Subject,
    /// One claim of their identity token (`email`, `groups`…).
    Claim(String),
    /// Their identity token exchanged (RFC 8693) at the identity provider
    /// for a token issued to `audience`: a secret value.
    Token(TokenExchange),
}

/// The downstream token an end user's identity token is exchanged for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenExchange {
    /// The downstream service the token is for (its client id or URI at
    /// the identity provider).
    pub audience: String,
    /// The scopes asked for (none: the provider's default).
    pub scopes: Vec<String>,
}

impl std::fmt::Display for IdentityValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key()[IDENTITY_PREFIX.len()..])
    }
}

impl std::str::FromStr for IdentityValue {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!("`{s}` names no value of the end user: write `subject`, `claim:NAME` or `token:AUDIENCE [SCOPE…]`")
        };
        let word =
            |w: &str| !w.is_empty() && !w.chars().any(|c| c.is_whitespace() || c.is_control());
        if s == "subject" {
            return Ok(IdentityValue::Subject);
        }
        if let Some(claim) = s.strip_prefix("claim:") {
            return if word(claim) {
                Ok(IdentityValue::Claim(claim.to_string()))
            } else {
                Err(bad())
            };
        }
        if let Some(rest) = s.strip_prefix("token:") {
            let mut words = rest.split(' ');
            let audience = words.next().unwrap_or_default();
            let scopes: Vec<String> = words.map(str::to_string).collect();
            if !word(audience) || !scopes.iter().all(|s| word(s)) {
                return Err(bad());
            }
            return Ok(IdentityValue::Token(TokenExchange {
                audience: audience.to_string(),
                scopes,
            }));
        }
        Err(bad())
    }
}

impl Serialize for IdentityValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdentityValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for IdentityValue {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IdentityValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A value of the end user the session belongs to: `subject`, `claim:NAME`, or `token:AUDIENCE [SCOPE…]` (their identity token exchanged, RFC 8693, for one issued to AUDIENCE).",
            "type": "string",
            "pattern": "^(subject|claim:\\S+|token:\\S+( \\S+)*)$"
        })
    }
}

/// The prefix of the names identity values go by in a run's values: no
/// parameter name can start with it.
pub const IDENTITY_PREFIX: &str = "@identity:";

impl AgentSpec {
    /// Every end user's value the agent binds: in bindings, credentials of
    /// HTTP toolboxes and helpers' `with` (a literal is the author's text,
    /// never read as one). Found once, as the agent loads.
    pub fn identity_values(&self) -> std::collections::BTreeSet<IdentityValue> {
        fn walk(v: &serde_json::Value, out: &mut std::collections::BTreeSet<IdentityValue>) {
            match v {
                serde_json::Value::Object(map) => {
                    for (k, v) in map {
                        match k.as_str() {
                            "literal" => {}
                            "identity" => {
                                if let Ok(i) = serde_json::from_value::<IdentityValue>(v.clone()) {
                                    out.insert(i);
                                }
                            }
                            _ => walk(v, out),
                        }
                    }
                }
                serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
                _ => {}
            }
        }
        let mut out = std::collections::BTreeSet::new();
        if let Ok(v) = serde_json::to_value(self) {
            walk(&v, &mut out);
        }
        // A per-user MCP server's call goes to the calling person's own
        // connection, found by their subject.
        let per_user = self.toolboxes.iter().any(|t| match t {
            Toolbox::Mcp(m) => m.per_user(),
            _ => false,
        });
        if per_user {
            out.insert(IdentityValue::Subject);
        }
        out
    }
}

impl IdentityValue {
    /// The name the value goes by in a run's values (`@identity:subject`,
    /// `@identity:claim:email`, `@identity:token:AUDIENCE SCOPE…`).
    pub fn key(&self) -> String {
        match self {
            IdentityValue::Subject => format!("{IDENTITY_PREFIX}subject"),
            IdentityValue::Claim(c) => format!("{IDENTITY_PREFIX}claim:{c}"),
            IdentityValue::Token(t) => {
                let mut scopes = t.scopes.clone();
                scopes.sort();
                scopes.dedup();
                let mut key = format!("{IDENTITY_PREFIX}token:{}", t.audience);
                for s in scopes {
                    key.push(' ');
                    key.push_str(&s);
                }
                key
            }
        }
    }

    /// Whether the value is a secret (a token).
    pub fn is_secret(&self) -> bool {
        matches!(self, IdentityValue::Token(_))
    }

    /// How the value reads in messages: `the end user's subject`.
    pub fn describe(&self) -> String {
        match self {
            IdentityValue::Subject => "the end user's subject".into(),
            IdentityValue::Claim(c) => format!("the end user's claim `{c}`"),
            IdentityValue::Token(t) => {
                format!(
                    "the end user's token exchanged for audience `{}`",
                    t.audience
                )
            }
        }
    }
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

/// An OAuth error code as an authorization server answered it, fit to be
/// shown: the code itself when it is one (RFC 6749's `error`: letters,
/// digits, `_`, `-`, `.`, at most 64), else a placeholder. A server may echo
/// what it was sent (a secret) into its answer; a code cannot hold one.
pub fn oauth_error_code(error: &str) -> String {
    let code = !error.is_empty()
        && error.len() <= 64
        && error
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if code {
        error.to_string()
    } else {
        "(an error that is not an OAuth error code; not repeated)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_values_are_found_wherever_the_author_binds_them_and_never_in_a_literal() {
        let yaml: serde_json::Value = serde_yaml::from_str(
            r#"
model: {url: "http://m.invalid/v1", name: m}
toolboxes:
  - openapi:
      spec: api.yaml
      baseUrl: https://billing.example.com
      secrets:
        - source: {identity: "token:billing invoices.read"}
          header: {name: Authorization, template: "Bearer {{secret}}"}
      bindings:
        - {arg: user, value: {identity: subject}}
        - {arg: email, value: {identity: "claim:email"}}
        - {arg: note, value: {literal: {identity: subject_not_this}}}
"#,
        )
        .unwrap();
        let spec: AgentSpec = serde_json::from_value(yaml).unwrap();
        let keys: Vec<String> = spec.identity_values().iter().map(|i| i.key()).collect();
        assert_eq!(
            keys,
            [
                "@identity:subject",
                "@identity:claim:email",
                "@identity:token:billing invoices.read"
            ]
        );
    }

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

    #[test]
    fn redirects_default_to_the_same_origin_and_read_as_written() {
        let read = |extra: &str| {
            serde_json::from_str::<Toolbox>(&format!(
                r#"{{"openapi": {{"spec": "api.json", "baseUrl": "http://x"{extra}}}}}"#
            ))
        };
        let Toolbox::Openapi(o) = read("").unwrap() else {
            panic!("not openapi")
        };
        assert_eq!(o.redirects, Redirects::SameOrigin);
        // The default is not written back.
        assert!(!serde_json::to_string(&o).unwrap().contains("redirects"));
        let Toolbox::Openapi(o) = read(r#", "redirects": "none""#).unwrap() else {
            panic!("not openapi")
        };
        assert_eq!(o.redirects, Redirects::Never);
        // A PostgREST toolbox's is its OpenAPI reading's.
        let pg: Toolbox = serde_json::from_str(
            r#"{"postgrest": {"name": "shop", "baseUrl": "http://x", "redirects": "none"}}"#,
        )
        .unwrap();
        let Toolbox::Postgrest(pg) = pg else {
            panic!("not postgrest")
        };
        assert_eq!(pg.as_openapi().redirects, Redirects::Never);
        let e = read(r#", "redirects": "always""#).unwrap_err().to_string();
        assert!(e.contains("sameOrigin") && e.contains("none"), "{e}");
    }
}
