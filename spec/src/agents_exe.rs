//! agents-exe's JSON agent files, read unchanged and turned into
//! [`AgentSpec`]s, so existing agents and their tools move over with no edits.
//!
//! Only the reading direction exists: Bindery writes its own format.
//!
//! Unlike Bindery's own format, these types take fields they do not know:
//! agents-exe files carry fields Bindery has no use for (and newer
//! agents-exe versions add more). The loader reads them with
//! [`serde_ignored`] and warns about each one, by its path in the file
//! ([`ignored_path`]), so a typo is still seen.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{
    AgentSpec, BashToolbox, Binding, BindingValue, EndpointFilter, HelperRef, McpToolbox,
    ModelSpec, OpenApiSecret, OpenApiToolbox, ParameterDecl, Scope, SecretHeader, Toolbox,
    ValueSource, WhenUnbound,
};

/// The model an agents-exe file names. `ClaudeV1` is Claude with extended
/// thinking (10000 tokens); Bindery speaks it in Anthropic's own Messages
/// API at the file's `modelUrl` (Anthropic's `https://api.anthropic.com/v1`
/// serves both), so that thinking blocks are carried across turns with
/// their signatures, which the chat-completions compatibility layer drops.
/// The other flavours stay dialects of chat completions.
fn model_of(
    flavor: Option<String>,
    url: String,
    name: String,
    api_key_id: Option<String>,
) -> ModelSpec {
    let claude = flavor.as_deref().and_then(crate::flavor::Flavor::parse)
        == Some(crate::flavor::Flavor::Claude);
    let (provider, flavor, max_tokens, thinking) = match claude {
        true => (
            crate::provider::Provider::Anthropic,
            "openai".to_string(),
            Some(CLAUDE_V1_MAX_TOKENS),
            Some(crate::provider::Thinking {
                budget_tokens: crate::flavor::Flavor::Claude
                    .thinking_budget()
                    .unwrap_or(crate::provider::MIN_THINKING_BUDGET),
            }),
        ),
        false => (
            Default::default(),
            flavor.unwrap_or_else(|| "openai".to_string()),
            None,
            None,
        ),
    };
    ModelSpec {
        provider,
        flavor,
        url,
        name,
        api_key: api_key_id.map(ValueSource::ApiKey),
        pricing: None,
        max_tokens,
        thinking,
        bedrock: None,
        azure: None,
        fallbacks: Vec::new(),
    }
}

/// The reply's bound for `ClaudeV1`: its 10000 thinking tokens must be
/// under it, with room for the answer.
const CLAUDE_V1_MAX_TOKENS: u32 = 16000;

/// The top level of an agents-exe agent file.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum AgentFile {
    OpenAIAgentDescription(Description),
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    pub slug: String,
    #[serde(default)]
    pub api_key_id: Option<String>,
    #[serde(default)]
    pub flavor: Option<String>,
    pub model_url: String,
    pub model_name: String,
    #[serde(default)]
    pub announce: Option<String>,
    #[serde(default)]
    pub system_prompt: Vec<String>,
    #[serde(default)]
    pub parameters: Vec<Parameter>,
    #[serde(default)]
    /// Each entry read on its own (`entries`): one bad entry is
    /// reported without hiding the others.
    pub bash_toolboxes: Vec<serde_json::Value>,
    #[serde(default)]
    pub bindings: Vec<ExeBinding>,
    #[serde(default)]
    pub extra_agents: Vec<ExtraAgent>,
    /// A directory of helper agent files; each becomes a helper.
    #[serde(default)]
    pub tool_directory: Option<String>,
    #[serde(default)]
    /// Each entry read on its own (`entries`): one bad entry is
    /// reported without hiding the others.
    pub mcp_servers: Vec<serde_json::Value>,
    #[serde(default)]
    /// Each entry read on its own (`entries`): one bad entry is
    /// reported without hiding the others.
    pub open_api_toolboxes: Vec<serde_json::Value>,
    #[serde(default)]
    /// Each entry read on its own (`entries`): one bad entry is
    /// reported without hiding the others.
    pub postgrest_toolboxes: Vec<serde_json::Value>,
    /// Tagged builtin toolboxes: `SystemToolbox` and `SqliteToolbox` load,
    /// other kinds are refused, saying why.
    #[serde(default)]
    pub builtin_toolboxes: Vec<serde_json::Value>,
    /// agents-exe's skills: not loaded, so refused rather than dropped.
    #[serde(default)]
    pub skill_sources: Vec<serde_json::Value>,
}

/// agents-exe's `Activation`: `"always"` (or absent, or null) is `None`;
/// `{"tag": "on-demand", "toolgroup": NAME}` is the group's name. Nothing
/// else: agents-exe itself refuses any other form.
fn activation<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    use serde::de::Error;
    use serde_json::Value;
    let v = Value::deserialize(d)?;
    match &v {
        Value::Null => Ok(None),
        Value::String(s) if s == "always" => Ok(None),
        Value::Object(o) if o.get("tag").and_then(Value::as_str) == Some("on-demand") => {
            match o.get("toolgroup").and_then(Value::as_str) {
                Some(g) if !g.trim().is_empty() => Ok(Some(g.to_string())),
                _ => Err(D::Error::custom(
                    "an on-demand `Activation` needs `toolgroup`: the group's name, which the model activates",
                )),
            }
        }
        _ => Err(D::Error::custom(format!(
            "`Activation` is \"always\" or {{\"tag\": \"on-demand\", \"toolgroup\": NAME}}, not {v}"
        ))),
    }
}

/// A `postgrestToolboxes` entry.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum PostgrestToolboxDescription {
    PostgRESTServer(PostgrestServer),
}

/// agents-exe's keys (`SpecUrl`, `BaseUrl`, …); the lower-case spelling
/// Bindery read before is kept as an alias.
#[derive(Deserialize, Debug)]
pub struct PostgrestServer {
    #[serde(rename = "SpecUrl", alias = "specUrl")]
    pub spec_url: String,
    #[serde(rename = "BaseUrl", alias = "baseUrl")]
    pub base_url: String,
    /// Part of the tools' names; default: the base URL's host and port.
    #[serde(default)]
    pub name: Option<String>,
    /// Sent as `Authorization: Bearer …` with every request, the
    /// document's fetch included.
    #[serde(rename = "Token", alias = "token", default)]
    pub token: Option<String>,
    /// Sent with every call.
    #[serde(rename = "Headers", alias = "headers", default)]
    pub headers: BTreeMap<String, String>,
    #[serde(rename = "AllowedMethods", alias = "allowedMethods", default)]
    pub allowed_methods: Option<Vec<String>>,
    #[serde(rename = "Filter", alias = "filter", default)]
    pub filter: Option<ExePredicate>,
    #[serde(rename = "Secrets", alias = "secrets", default)]
    pub secrets: Vec<ExeSecret>,
    #[serde(rename = "Bindings", alias = "bindings", default)]
    pub bindings: Vec<ExeBinding>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

/// agents-exe's `EndpointPredicate`: `{"tag": "MethodEquals", "contents":
/// "GET"}`, `And`/`Or` of exactly two.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "tag", content = "contents")]
pub enum ExePredicate {
    And(Box<ExePredicate>, Box<ExePredicate>),
    Or(Box<ExePredicate>, Box<ExePredicate>),
    Not(Box<ExePredicate>),
    PathPrefix(String),
    PathSuffix(String),
    PathEqual(String),
    PathContains(String),
    MethodEquals(String),
    OperationIdEquals(String),
    TableNameEquals(String),
    AlwaysTrue,
    AlwaysFalse,
}

impl From<ExePredicate> for EndpointFilter {
    fn from(p: ExePredicate) -> Self {
        use EndpointFilter as F;
        match p {
            ExePredicate::And(a, b) => F::And(vec![(*a).into(), (*b).into()]),
            ExePredicate::Or(a, b) => F::Or(vec![(*a).into(), (*b).into()]),
            ExePredicate::Not(a) => F::Not(Box::new((*a).into())),
            ExePredicate::PathPrefix(s) => F::PathPrefix(s),
            ExePredicate::PathSuffix(s) => F::PathSuffix(s),
            ExePredicate::PathEqual(s) => F::PathEqual(s),
            ExePredicate::PathContains(s) => F::PathContains(s),
            ExePredicate::MethodEquals(s) => F::MethodEquals(s),
            ExePredicate::OperationIdEquals(s) => F::OperationIdEquals(s),
            ExePredicate::TableNameEquals(s) => F::TableNameEquals(s),
            ExePredicate::AlwaysTrue => F::AlwaysTrue,
            ExePredicate::AlwaysFalse => F::AlwaysFalse,
        }
    }
}

/// `scheme://host:port` of an http(s) URL, lower-cased, the default port
/// written out; `None` for one that URL parsers may read differently (a
/// `\`, userinfo, white space or a control character), which then never
/// counts as the API's origin.
fn origin(url: &str) -> Option<String> {
    if url
        .chars()
        .any(|c| c == '\\' || c == '@' || c.is_whitespace() || c.is_control())
    {
        return None;
    }
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?.to_ascii_lowercase();
    let with_port = match (host_port.rsplit_once(':'), scheme.as_str()) {
        (Some((_, port)), _) if !port.is_empty() && !host_port.ends_with(']') => host_port,
        (_, "https") => format!("{host_port}:443"),
        _ => format!("{host_port}:80"),
    };
    Some(format!("{scheme}://{with_port}"))
}

/// A value written in the file, sent as header `name` (through
/// `template`), with the document's fetch too when `fetch_spec`.
fn given_header(
    value: String,
    name: String,
    template: Option<String>,
    fetch_spec: bool,
) -> OpenApiSecret {
    OpenApiSecret {
        source: super::SecretSource::Value(serde_json::Value::String(value)),
        header: Some(SecretHeader { name, template }),
        query: None,
        fetch_spec,
        decode: None,
        keep_whitespace: false,
    }
}

/// agents-exe's `Token`: `Authorization: Bearer <token>` on every
/// request, the document's fetch (over http) included.
fn token_secret(token: String, fetched: bool) -> OpenApiSecret {
    given_header(
        token,
        "Authorization".into(),
        Some("Bearer {{secret}}".into()),
        fetched,
    )
}

/// agents-exe's static `Headers` (sent with calls, not the document's
/// fetch), split: a header that carries a credential by its name becomes
/// a secret (never shown or logged), the rest plain headers. One that a
/// secret also sets gives way to it, as in agents-exe.
fn split_headers(
    headers: BTreeMap<String, String>,
    secrets: &mut Vec<OpenApiSecret>,
) -> BTreeMap<String, String> {
    let mut plain = BTreeMap::new();
    for (name, value) in headers {
        if super::secret_sets_header(secrets, &name) {
            continue;
        }
        if crate::checks::credential_header(&name) {
            secrets.push(given_header(value, name, None, false));
        } else {
            plain.insert(name, value);
        }
    }
    plain
}

impl From<PostgrestServer> for super::PostgrestToolbox {
    fn from(p: PostgrestServer) -> Self {
        let name = p.name.clone().unwrap_or_else(|| {
            let host = p
                .base_url
                .split("://")
                .nth(1)
                .unwrap_or(&p.base_url)
                .split('/')
                .next()
                .unwrap_or_default();
            let mut n: String = host
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            n.truncate(32);
            n
        });
        let o: OpenApiToolbox = OpenApiServer {
            spec_url: p.spec_url,
            base_url: p.base_url,
            headers: p.headers,
            token: p.token,
            filter: p.filter,
            secrets: p.secrets,
            bindings: p.bindings,
            toolgroup: p.toolgroup,
        }
        .into();
        super::PostgrestToolbox {
            toolgroup: o.toolgroup,
            confirm: None,
            name,
            base_url: o.base_url,
            spec: Some(o.spec),
            // agents-exe's default is GET, HEAD and OPTIONS: of those,
            // PostgREST's document describes GET.
            allowed_methods: p
                .allowed_methods
                .filter(|m| !m.is_empty())
                .map(|m| m.into_iter().map(|m| m.to_ascii_uppercase()).collect())
                .unwrap_or_else(|| vec!["GET".to_string()]),
            filter: o.filter,
            headers: o.headers,
            timeout_seconds: None,
            max_response_bytes: None,
            redirects: Default::default(),
            secrets: o.secrets,
            bindings: o.bindings,
        }
    }
}

/// agents-exe's `SystemToolbox` description (both spellings of its keys).
#[derive(Deserialize, Debug)]
pub struct SystemToolboxDescription {
    #[serde(alias = "Name")]
    pub name: String,
    #[serde(default, alias = "Description")]
    pub description: Option<String>,
    #[serde(alias = "Capabilities")]
    pub capabilities: Vec<String>,
    /// agents-exe matches it as a substring of the names; Bindery reads it
    /// as exact names separated by commas or spaces (see [`env_var_names`]).
    #[serde(default, rename = "envVarFilter", alias = "EnvVarFilter")]
    pub env_var_filter: Option<String>,
    /// Whether `read-session` shows the tools' outputs (default: yes).
    #[serde(default, rename = "SessionIntrospectionIncludeToolOutputs")]
    pub include_tool_outputs: Option<bool>,
    /// Which sessions `list-sessions` and `search-sessions` reach, read
    /// within the calling session's fork lineage (default `subtree`).
    #[serde(default, rename = "SessionIntrospectionScope")]
    pub scope: Option<super::SessionScope>,
    /// The most sessions one answer holds (default 50).
    #[serde(default, rename = "SessionIntrospectionMaxResults")]
    pub max_results: Option<u32>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
    /// Which files `attach-file` may read (default: none).
    #[serde(rename = "FileSandbox", default)]
    pub file_sandbox: Option<crate::sandbox::AgentsExeSandbox>,
}

/// `envVarFilter` as the list of names `env-vars` shows: exact names,
/// separated by commas or white space. A substring filter would show any
/// variable whose name happens to contain it, later ones included.
pub fn env_var_names(filter: Option<&str>) -> Vec<String> {
    filter
        .unwrap_or_default()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// agents-exe's `SqliteToolbox` description: the current form (`versioning`)
/// and the older one (`path` and `access`).
/// agents-exe spells the keys `Name`, `Description`, `Versioning`; the
/// lower-case ones Bindery read before are aliases.
#[derive(Deserialize, Debug)]
pub struct SqliteToolboxDescription {
    #[serde(rename = "Name", alias = "name")]
    pub name: String,
    #[serde(rename = "Description", alias = "description", default)]
    pub description: Option<String>,
    #[serde(rename = "Versioning", alias = "versioning", default)]
    pub versioning: Option<SqliteVersioning>,
    #[serde(rename = "Path", alias = "path", default)]
    pub path: Option<String>,
    #[serde(rename = "Access", alias = "access", default)]
    pub access: Option<String>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "tag")]
pub enum SqliteVersioning {
    SqliteReadOnly {
        path: String,
    },
    SqliteReadWrite {
        path: String,
    },
    SqliteNoVersioning {
        path: String,
    },
    /// A copy of the database per write, shared as `shared` says.
    SqliteVersioned {
        shared: super::SqliteSharing,
        #[serde(rename = "basePath")]
        base_path: String,
        #[serde(rename = "storageRoot", default)]
        storage_root: Option<String>,
    },
}

/// Why a `builtinToolboxes` entry is not loaded; `entry` names it as the
/// file does (`builtinToolboxes[2] (\`LuaToolbox\`)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuiltinError {
    /// Bindery does not offer what it asks for: why, and what to do.
    #[error("{entry}: {why}; {instead}, and remove this entry")]
    Refused {
        entry: String,
        why: &'static str,
        instead: &'static str,
    },
    #[error("{entry}: access `{access}` is not one of read-only, read-write")]
    Access { entry: String, access: String },
    #[error("{entry}: give `Versioning` ({{\"tag\": \"SqliteReadOnly\", \"path\": …}})")]
    NoVersioning { entry: String },
    /// Its `contents` do not read.
    #[error("{entry}: {message}")]
    Contents { entry: String, message: String },
}

/// One `builtinToolboxes` entry (the `index`th) as a Bindery toolbox, or
/// why not; the paths (from the entry) of the fields it did not read go to
/// `ignored`.
fn builtin_toolbox(
    index: usize,
    v: serde_json::Value,
    ignored: &mut Vec<String>,
) -> Result<Toolbox, BuiltinError> {
    let tag = v["tag"].as_str().unwrap_or("(no tag)").to_string();
    let here = format!("builtinToolboxes[{index}] (`{tag}`)");
    let refuse = |why: &'static str, instead: &'static str| {
        Err(BuiltinError::Refused {
            entry: here.clone(),
            why,
            instead,
        })
    };
    let contents = |e: serde_json::Error| BuiltinError::Contents {
        entry: here.clone(),
        message: e.to_string(),
    };
    match tag.as_str() {
        "SystemToolbox" | "SqliteToolbox" => {}
        "DeveloperToolbox" => {
            return refuse(
                "Bindery does not offer agents-exe's developer toolbox: it writes and patches files and scaffolds agents on the server, which every tenant shares",
                "to edit files, give the agent a bash tool that changes the one place you mean (run `bindery-sidecar check` to validate agents and tools)",
            )
        }
        "LuaToolbox" => {
            return refuse(
                "Bindery does not run model-written Lua: a script chosen by the model would run inside the server",
                "give the agent the tools the script would call (bash, OpenAPI, MCP); the model calls them in turn",
            )
        }
        _ => {
            return refuse(
                "Bindery knows no such builtin toolbox (it offers `SystemToolbox` and `SqliteToolbox`)",
                "use a bash, OpenAPI, PostgREST or MCP toolbox for what it does",
            )
        }
    }
    if let Some(o) = v.as_object() {
        ignored.extend(
            o.keys()
                .filter(|k| *k != "tag" && *k != "contents")
                .cloned(),
        );
    }
    let mut note =
        |p: serde_ignored::Path<'_>| ignored.push(format!("contents.{}", ignored_path(&p)));
    if tag == "SqliteToolbox" {
        let d: SqliteToolboxDescription =
            serde_ignored::deserialize(v["contents"].clone(), &mut note).map_err(contents)?;
        let mut versioned = None;
        let (path, read_write) = match (d.versioning, d.path, d.access.as_deref()) {
            (Some(SqliteVersioning::SqliteReadOnly { path }), _, _) => (path, false),
            (Some(SqliteVersioning::SqliteReadWrite { path }), _, _)
            | (Some(SqliteVersioning::SqliteNoVersioning { path }), _, _) => (path, true),
            (
                Some(SqliteVersioning::SqliteVersioned {
                    shared,
                    base_path,
                    storage_root,
                }),
                _,
                _,
            ) => {
                versioned = Some(super::SqliteVersions {
                    shared,
                    storage_root,
                    max_copies: None,
                    max_bytes: None,
                });
                (base_path, true)
            }
            (None, Some(_), Some("snapshot")) => {
                return refuse(
                    "the old `access: snapshot` form is gone from agents-exe",
                    "write `Versioning: {\"tag\": \"SqliteVersioned\", \"shared\": \"conversation\", \"basePath\": …}`",
                )
            }
            (None, Some(path), None | Some("read-only")) => (path, false),
            (None, Some(path), Some("read-write")) => (path, true),
            (None, Some(_), Some(other)) => {
                return Err(BuiltinError::Access {
                    entry: here,
                    access: other.to_string(),
                })
            }
            (None, None, _) => {
                return Err(BuiltinError::NoVersioning { entry: here })
            }
        };
        return Ok(Toolbox::Sqlite(super::SqliteToolbox {
            name: d.name,
            description: d.description,
            path,
            read_write,
            // agents-exe opens the file with SQLite's defaults, which create it.
            create: true,
            max_rows: None,
            timeout_seconds: None,
            bindings: Vec::new(),
            versioned,
            toolgroup: d.toolgroup,
        }));
    }
    let d: SystemToolboxDescription =
        serde_ignored::deserialize(v["contents"].clone(), &mut note).map_err(contents)?;
    Ok(Toolbox::Builtin(super::BuiltinToolbox {
        session_tool_outputs: d.include_tool_outputs.unwrap_or(true),
        session_scope: d.scope.unwrap_or_default(),
        session_max_results: d.max_results,
        name: d.name,
        description: d.description,
        capabilities: d.capabilities,
        env_vars: env_var_names(d.env_var_filter.as_deref()),
        file_sandbox: d.file_sandbox.map(Into::into),
        bindings: Vec::new(),
        toolgroup: d.toolgroup,
    }))
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Parameter {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub secret: bool,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default = "yes")]
    pub required: bool,
    #[serde(default)]
    pub default: Option<SecretSource>,
}

fn yes() -> bool {
    true
}

/// agents-exe's `SecretSource`.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum SecretSource {
    Given(String),
    ApiKey(String),
    FileSystem(String),
    EnvVar(String),
    /// Program then arguments.
    Command(Vec<String>),
}

/// An `mcpServers` entry.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum McpServerDescription {
    McpSimpleBinary(McpSimpleBinary),
}

/// A server started as a child process, spoken to over stdio.
#[derive(Deserialize, Debug)]
pub struct McpSimpleBinary {
    pub name: String,
    pub executable: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// The server's environment: literals and process-scope parameters.
    #[serde(default)]
    pub env: BTreeMap<String, ExeBindingValue>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

impl From<McpSimpleBinary> for McpToolbox {
    fn from(m: McpSimpleBinary) -> Self {
        McpToolbox {
            name: m.name,
            command: std::iter::once(m.executable).chain(m.args).collect(),
            env: m.env.into_iter().map(|(k, v)| (k, v.into())).collect(),
            url: None,
            headers: BTreeMap::new(),
            redirects: Default::default(),
            oauth: None,
            confirm: None,
            bindings: Vec::new(),
            tools: Vec::new(),
            toolgroup: m.toolgroup,
            shared_tool_list: false,
        }
    }
}

/// An `openApiToolboxes` entry.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum OpenApiToolboxDescription {
    OpenAPIServer(OpenApiServer),
}

#[derive(Deserialize, Debug)]
pub struct OpenApiServer {
    /// `file://…`, `http(s)://…` or a path.
    #[serde(rename = "SpecUrl")]
    pub spec_url: String,
    #[serde(rename = "BaseUrl")]
    pub base_url: String,
    /// Sent with every call (not the document's fetch).
    #[serde(rename = "Headers", default)]
    pub headers: BTreeMap<String, String>,
    /// Sent as `Authorization: Bearer …` with every request.
    #[serde(rename = "Token", default)]
    pub token: Option<String>,
    /// Which operations become tools.
    #[serde(rename = "Filter", default)]
    pub filter: Option<ExePredicate>,
    #[serde(rename = "Secrets", default)]
    pub secrets: Vec<ExeSecret>,
    #[serde(rename = "Bindings", alias = "bindings", default)]
    pub bindings: Vec<ExeBinding>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

/// One of an OpenAPI server's secrets.
#[derive(Deserialize, Debug)]
pub struct ExeSecret {
    pub source: ExeSecretSource,
    #[serde(default)]
    pub decoder: Option<ExeDecoder>,
    pub serializer: ExeSerializer,
}

/// A `SecretSource`, plus `ParamSource` (a parameter, per request).
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum ExeSecretSource {
    ParamSource(String),
    Given(String),
    ApiKey(String),
    FileSystem(String),
    EnvVar(String),
    Command(Vec<String>),
}

/// How the secret's bytes are read; only `Clear` (as they are) exists here.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum ExeDecoder {
    /// As read; `true`: trailing white space removed.
    Clear(bool),
    Base64,
    Hexadecimal,
}

/// Where the secret goes in a request.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum ExeSerializer {
    /// Header name and an optional template (`Bearer {{secret}}`).
    Header(String, Option<String>),
    QueryString(String),
}

impl From<OpenApiServer> for OpenApiToolbox {
    fn from(o: OpenApiServer) -> Self {
        // agents-exe sends its credentials with the document's fetch
        // wherever the document is; Bindery only when it is on the
        // API's own origin, so that a public document elsewhere never
        // receives the API's token.
        let fetched = super::http_url(&o.spec_url) && origin(&o.spec_url) == origin(&o.base_url);
        let mut t = OpenApiToolbox {
            spec: o
                .spec_url
                .strip_prefix("file://")
                .map(str::to_string)
                .unwrap_or(o.spec_url),
            base_url: o.base_url,
            timeout_seconds: None,
            max_response_bytes: None,
            redirects: Default::default(),
            confirm: None,
            tools: Vec::new(),
            secrets: o
                .secrets
                .into_iter()
                .map(|s| {
                    let from_param = matches!(s.source, ExeSecretSource::ParamSource(_));
                    let source = match s.source {
                        ExeSecretSource::ParamSource(p) => super::SecretSource::Param(p),
                        ExeSecretSource::Given(v) => {
                            super::SecretSource::Value(serde_json::Value::String(v))
                        }
                        ExeSecretSource::ApiKey(v) => super::SecretSource::ApiKey(v),
                        ExeSecretSource::FileSystem(v) => super::SecretSource::File(v),
                        ExeSecretSource::EnvVar(v) => super::SecretSource::Env(v),
                        ExeSecretSource::Command(v) => super::SecretSource::Command(v),
                    };
                    let (header, query) = match s.serializer {
                        ExeSerializer::Header(name, template) => {
                            (Some(SecretHeader { name, template }), None)
                        }
                        ExeSerializer::QueryString(q) => (None, Some(q)),
                    };
                    let (decode, keep_whitespace) = match s.decoder {
                        None | Some(ExeDecoder::Clear(true)) => (None, false),
                        Some(ExeDecoder::Clear(false)) => (None, true),
                        Some(ExeDecoder::Base64) => (Some(super::SecretDecode::Base64), false),
                        Some(ExeDecoder::Hexadecimal) => (Some(super::SecretDecode::Hex), false),
                    };
                    OpenApiSecret {
                        source,
                        header,
                        query,
                        // agents-exe sends its load-time secrets with the
                        // spec request; parameter secrets exist only per request.
                        fetch_spec: fetched && !from_param,
                        decode,
                        keep_whitespace,
                    }
                })
                .collect(),
            bindings: o.bindings.into_iter().map(Binding::from).collect(),
            filter: o.filter.map(EndpointFilter::from),
            headers: BTreeMap::new(),
            toolgroup: o.toolgroup,
        };
        if let Some(token) = o.token {
            t.secrets.insert(0, token_secret(token, fetched));
        }
        t.headers = split_headers(o.headers, &mut t.secrets);
        t
    }
}

#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum BashToolboxDescription {
    FileSystemDirectory(DirectoryDescription),
    SingleTool(SingleToolDescription),
}

#[derive(Deserialize, Debug)]
pub struct DirectoryDescription {
    #[serde(rename = "Path")]
    pub path: String,
    /// Legacy agents-exe field; when present the directory is `Root/Path`.
    #[serde(rename = "Root", default)]
    pub root: Option<String>,
    #[serde(rename = "BasenameFilter", default)]
    pub basename_filter: Option<String>,
    #[serde(rename = "Bindings", alias = "bindings", default)]
    pub bindings: Vec<ExeBinding>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct SingleToolDescription {
    #[serde(rename = "Path")]
    pub path: String,
    #[serde(rename = "Bindings", alias = "bindings", default)]
    pub bindings: Vec<ExeBinding>,
    /// agents-exe's `Activation`: an on-demand group's name.
    #[serde(rename = "Activation", default, deserialize_with = "activation")]
    pub toolgroup: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ExeBinding {
    #[serde(default)]
    pub tool: Option<String>,
    pub arg: String,
    pub value: ExeBindingValue,
    #[serde(default)]
    pub when_unbound: WhenUnbound,
}

/// `{"tag": "Param", "contents": "tenant"}` or `{"tag": "Literal", "contents": …}`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "tag", content = "contents")]
pub enum ExeBindingValue {
    Param(String),
    Literal(serde_json::Value),
}

impl From<ExeBindingValue> for BindingValue {
    fn from(v: ExeBindingValue) -> Self {
        match v {
            ExeBindingValue::Param(p) => BindingValue::Param(p),
            ExeBindingValue::Literal(l) => BindingValue::Literal(l),
        }
    }
}

#[derive(Deserialize, Debug)]
pub struct ExtraAgent {
    pub slug: String,
    pub path: String,
    #[serde(default)]
    pub with: BTreeMap<String, ExeBindingValue>,
    #[serde(default = "yes")]
    pub narrowable: bool,
}

/// What converting a file needs to tell its caller beyond the spec.
pub struct Converted {
    /// What is wrong with the file, each said (an entry that does not
    /// read, a kind Bindery refuses); the rest is converted all the same,
    /// so every problem shows at once.
    pub errors: Vec<String>,
    pub name: String,
    pub spec: AgentSpec,
    /// `toolDirectory`, resolved by the loader (it lists files).
    pub tool_directory: Option<String>,
    /// Fields of `builtinToolboxes` entries Bindery did not read, by their
    /// path in the file (the typed pass sees only the rest).
    pub ignored: Vec<String>,
}

/// A path as serde_ignored gives it, written the way a user reads the file:
/// `contents.mcpServers[0].contents.fooBar`.
pub fn ignored_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// `v` as JSON text with each object's `tag` key written first: serde
/// buffers a tagged object read `contents` first, and the fields it then
/// skips go unseen by the ignored-field pass.
pub fn tag_first(v: &serde_json::Value) -> String {
    fn write(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                out.push('{');
                let keys = m
                    .keys()
                    .filter(|k| *k == "tag")
                    .chain(m.keys().filter(|k| *k != "tag"));
                for (i, k) in keys.enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// The entries of list `key` that read as `T`; each that does not is an
/// error naming its path, and the fields each skips go to `ignored`.
fn entries<T: serde::de::DeserializeOwned>(
    key: &str,
    list: Vec<serde_json::Value>,
    ignored: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (i, v) in list.into_iter().enumerate() {
        let text = tag_first(&v);
        let mut here = Vec::new();
        let de = &mut serde_json::Deserializer::from_str(&text);
        let read: Result<T, _> =
            serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut |p| {
                here.push(ignored_path(&p))
            }));
        match read {
            Ok(t) => {
                out.push(t);
                ignored.extend(here.into_iter().map(|p| format!("contents.{key}[{i}].{p}")));
            }
            Err(e) => {
                let path = e.path().to_string();
                let at = if path == "." {
                    String::new()
                } else {
                    format!(".{path}")
                };
                errors.push(format!("at `contents.{key}[{i}]{at}`: {}", e.inner()));
            }
        }
    }
    out
}

impl Description {
    /// The same agent in Bindery's own types. Toolbox kinds this build
    /// cannot run are named in `errors` rather than dropped.
    pub fn convert(self) -> Converted {
        let mut errors = Vec::new();
        let mut ignored = Vec::new();
        if !self.skill_sources.is_empty() {
            errors.push("contents.skillSources: Bindery does not load agents-exe's skills yet, so the tools they add (`skill_describe_<skill>`, `skill_<skill>_<script>`) would be missing while the prompt may name them; remove `skillSources`, or give each skill's scripts as a bash toolbox".to_string());
        }
        let bash: Vec<BashToolboxDescription> = entries(
            "bashToolboxes",
            self.bash_toolboxes,
            &mut ignored,
            &mut errors,
        );
        let openapi: Vec<OpenApiToolboxDescription> = entries(
            "openApiToolboxes",
            self.open_api_toolboxes,
            &mut ignored,
            &mut errors,
        );
        let postgrest: Vec<PostgrestToolboxDescription> = entries(
            "postgrestToolboxes",
            self.postgrest_toolboxes,
            &mut ignored,
            &mut errors,
        );
        let mcp: Vec<McpServerDescription> =
            entries("mcpServers", self.mcp_servers, &mut ignored, &mut errors);
        let bindings = |v: Vec<ExeBinding>| v.into_iter().map(Binding::from).collect::<Vec<_>>();
        let mut toolboxes: Vec<Toolbox> = bash
            .into_iter()
            .map(|t| match t {
                BashToolboxDescription::FileSystemDirectory(d) => Toolbox::Bash(BashToolbox {
                    directory: Some(match d.root {
                        Some(root) => format!("{}/{}", root.trim_end_matches('/'), d.path),
                        None => d.path,
                    }),
                    basename_filter: d.basename_filter,
                    script: None,
                    confirm: None,
                    bindings: bindings(d.bindings),
                    tools: Vec::new(),
                    cache: None,
                    toolgroup: d.toolgroup,
                }),
                BashToolboxDescription::SingleTool(s) => Toolbox::Bash(BashToolbox {
                    directory: None,
                    basename_filter: None,
                    script: Some(s.path),
                    confirm: None,
                    bindings: bindings(s.bindings),
                    tools: Vec::new(),
                    cache: None,
                    toolgroup: s.toolgroup,
                }),
            })
            .collect();
        // agents-exe runs the scripts of `toolDirectory` as a bash
        // directory of their own (from the working directory, as every
        // bash path); its helper agent files are the loader's.
        if let Some(dir) = &self.tool_directory {
            toolboxes.insert(
                0,
                Toolbox::Bash(BashToolbox {
                    directory: Some(dir.clone()),
                    basename_filter: None,
                    script: None,
                    confirm: None,
                    bindings: Vec::new(),
                    tools: Vec::new(),
                    cache: None,
                    toolgroup: None,
                }),
            );
        }
        toolboxes.extend(openapi.into_iter().map(|t| match t {
            OpenApiToolboxDescription::OpenAPIServer(o) => Toolbox::Openapi(o.into()),
        }));
        toolboxes.extend(postgrest.into_iter().map(|t| match t {
            PostgrestToolboxDescription::PostgRESTServer(p) => Toolbox::Postgrest(p.into()),
        }));
        toolboxes.extend(mcp.into_iter().map(|m| match m {
            McpServerDescription::McpSimpleBinary(m) => Toolbox::Mcp(m.into()),
        }));
        for (i, b) in self.builtin_toolboxes.into_iter().enumerate() {
            let mut here = Vec::new();
            match builtin_toolbox(i, b, &mut here) {
                Ok(t) => toolboxes.push(t),
                Err(e) => errors.push(e.to_string()),
            }
            ignored.extend(
                here.into_iter()
                    .map(|p| format!("contents.builtinToolboxes[{i}].{p}")),
            );
        }
        let spec = AgentSpec {
            announce: self.announce,
            model: model_of(
                self.flavor,
                self.model_url,
                self.model_name,
                self.api_key_id,
            ),
            system_prompt: self.system_prompt.join("\n"),
            parameters: self
                .parameters
                .into_iter()
                .map(ParameterDecl::from)
                .collect(),
            toolboxes,
            bindings: bindings(self.bindings),
            tools: Vec::new(),
            confirm: Vec::new(),
            confirm_ttl: None,
            mcp: Default::default(),
            approvals: None,
            budgets: Vec::new(),
            helpers: self
                .extra_agents
                .into_iter()
                .map(|e| HelperRef {
                    slug: Some(e.slug),
                    agent: None,
                    path: Some(e.path),
                    with: e.with.into_iter().map(|(k, v)| (k, v.into())).collect(),
                    narrowable: e.narrowable,
                })
                .collect(),
            max_steps: None,
            // Its tools keep the names agents-exe gives them.
            naming: super::Naming::AgentsExe,
        };
        Converted {
            errors,
            name: self.slug,
            spec,
            tool_directory: self.tool_directory,
            ignored,
        }
    }
}

impl From<ExeBinding> for Binding {
    fn from(b: ExeBinding) -> Self {
        Binding {
            tool: b.tool,
            arg: b.arg,
            value: b.value.into(),
            when_unbound: b.when_unbound,
        }
    }
}

impl From<Parameter> for ParameterDecl {
    fn from(p: Parameter) -> Self {
        ParameterDecl {
            name: p.name,
            description: p.description,
            secret: p.secret,
            scope: p.scope,
            required: p.required,
            default: p.default.map(|d| match d {
                SecretSource::Given(v) => ValueSource::Value(serde_json::Value::String(v)),
                SecretSource::ApiKey(id) => ValueSource::ApiKey(id),
                SecretSource::FileSystem(p) => ValueSource::File(p),
                SecretSource::EnvVar(v) => ValueSource::Env(v),
                SecretSource::Command(c) => ValueSource::Command(c),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SecretSource as Src;

    #[test]
    fn an_openapi_server_converts_to_an_openapi_toolbox() {
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {
                "slug": "callbacks", "modelUrl": "http://llm", "modelName": "m",
                "parameters": [
                    {"name": "project_id", "scope": "session"},
                    {"name": "callback_token", "secret": true, "scope": "session"}
                ],
                "openApiToolboxes": [{
                    "tag": "OpenAPIServer",
                    "contents": {
                        "SpecUrl": "file://./api.json",
                        "BaseUrl": "https://api.example.com/agent-callbacks",
                        "Secrets": [
                            {"source": {"tag": "ParamSource", "contents": "callback_token"},
                             "decoder": {"tag": "Clear", "contents": true},
                             "serializer": {"tag": "Header", "contents": ["Authorization", "Bearer {{secret}}"]}},
                            {"source": {"tag": "EnvVar", "contents": "API_KEY"},
                             "decoder": {"tag": "Hexadecimal"},
                             "serializer": {"tag": "QueryString", "contents": "key"}}
                        ],
                        "Bindings": [
                            {"arg": "project_id", "value": {"tag": "Param", "contents": "project_id"}}
                        ]
                    }
                }]
            }
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let c = d.convert();
        let [Toolbox::Openapi(o)] = c.spec.toolboxes.as_slice() else {
            panic!("{:?}", c.spec.toolboxes)
        };
        assert_eq!(o.spec, "./api.json");
        assert_eq!(o.base_url, "https://api.example.com/agent-callbacks");
        assert_eq!(
            o.secrets,
            [
                OpenApiSecret {
                    source: Src::Param("callback_token".into()),
                    header: Some(SecretHeader {
                        name: "Authorization".into(),
                        template: Some("Bearer {{secret}}".into())
                    }),
                    query: None,
                    fetch_spec: false,
                    decode: None,
                    keep_whitespace: false,
                },
                OpenApiSecret {
                    source: Src::Env("API_KEY".into()),
                    header: None,
                    query: Some("key".into()),
                    // The spec is a file: nothing to fetch.
                    fetch_spec: false,
                    decode: Some(crate::SecretDecode::Hex),
                    keep_whitespace: false,
                },
            ]
        );
        assert_eq!(o.bindings[0].arg, "project_id");
        assert_eq!(
            o.bindings[0].value,
            BindingValue::Param("project_id".into())
        );
        let diags = crate::checks::check_definition(&c.name, &c.spec, "here");
        assert!(diags.is_empty(), "{diags:?}");
    }

    /// `ClaudeV1` is spoken in Anthropic's own API with its thinking; the
    /// other flavours stay dialects of chat completions.
    #[test]
    fn claude_v1_becomes_anthropics_messages_api_with_its_thinking() {
        let convert = |flavor: &str| {
            let file: AgentFile = serde_json::from_value(serde_json::json!({
                "tag": "OpenAIAgentDescription",
                "contents": {"slug": "a", "modelUrl": "https://api.anthropic.com/v1",
                    "modelName": "claude-sonnet-4-5", "apiKeyId": "anthropic", "flavor": flavor}
            }))
            .unwrap();
            let AgentFile::OpenAIAgentDescription(d) = file;
            d.convert().spec
        };
        let claude = convert("ClaudeV1");
        let m = &claude.model;
        assert_eq!(m.provider, crate::provider::Provider::Anthropic);
        assert_eq!(m.flavor, "openai");
        assert_eq!(m.thinking.as_ref().map(|t| t.budget_tokens), Some(10000));
        assert_eq!(m.max_tokens, Some(16000));
        assert_eq!(m.api_key, Some(ValueSource::ApiKey("anthropic".into())));
        let diags = crate::checks::check_definition("a", &claude, "here");
        assert!(diags.is_empty(), "{diags:?}");
        for flavor in ["MistralV1", "KimiV1", "OpenAIv1"] {
            let m = convert(flavor).model;
            assert_eq!(
                (m.provider, m.flavor.as_str(), m.thinking),
                (Default::default(), flavor, None)
            );
        }
    }

    #[test]
    fn postgrest_and_system_toolboxes_convert() {
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                "parameters": [{"name": "tenant", "scope": "session"}],
                "postgrestToolboxes": [{"tag": "PostgRESTServer", "contents": {
                    "specUrl": "http://127.0.0.1:3000/", "baseUrl": "http://127.0.0.1:3000",
                    "allowedMethods": ["GET", "POST"], "token": "jwt",
                    "bindings": [{"arg": "tenant_id", "value": {"tag": "Param", "contents": "tenant"}}]}}],
                "builtinToolboxes": [{"tag": "SystemToolbox", "contents": {
                    "name": "system", "description": "System context", "capabilities": ["date"], "envVarFilter": null}}]}
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let c = d.convert();
        let [Toolbox::Postgrest(p), Toolbox::Builtin(b)] = c.spec.toolboxes.as_slice() else {
            panic!("{:?}", c.spec.toolboxes)
        };
        assert_eq!(p.name, "127_0_0_1_3000");
        assert_eq!(p.allowed_methods, ["GET", "POST"]);
        assert_eq!(p.bindings[0].value, BindingValue::Param("tenant".into()));
        assert_eq!(p.secrets[0].header.as_ref().unwrap().name, "Authorization");
        assert!(p.secrets[0].fetch_spec);
        assert_eq!(
            (b.name.as_str(), b.capabilities.as_slice()),
            ("system", &["date".to_string()][..])
        );
        let diags = crate::checks::check_definition(&c.name, &c.spec, "here");
        assert!(diags.is_empty(), "{diags:?}");

        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                "builtinToolboxes": [{"tag": "LuaToolbox", "contents": {}}]}
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let err = d.convert().errors.join("\n");
        assert!(
            err.starts_with(
                "builtinToolboxes[0] (`LuaToolbox`): Bindery does not run model-written Lua"
            ),
            "{err}"
        );
    }

    #[test]
    fn postgrest_reads_agents_exe_keys_filter_token_and_headers() {
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                "postgrestToolboxes": [{"tag": "PostgRESTServer", "contents": {
                    "SpecUrl": "http://db:3000/", "BaseUrl": "http://db:3000",
                    "AllowedMethods": ["get", "patch"], "Token": "jwt",
                    "Headers": {"Accept-Profile": "api", "X-Api-Key": "k", "Authorization": "old", "X-Jwt": "j"},
                    "Filter": {"tag": "Or", "contents": [
                        {"tag": "TableNameEquals", "contents": "pets"},
                        {"tag": "AlwaysFalse"}]}}}]}
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let c = d.convert();
        let [Toolbox::Postgrest(p)] = c.spec.toolboxes.as_slice() else {
            panic!("{:?}", c.spec.toolboxes)
        };
        assert_eq!(p.allowed_methods, ["GET", "PATCH"]);
        assert_eq!(
            p.filter,
            Some(EndpointFilter::Or(vec![
                EndpointFilter::TableNameEquals("pets".into()),
                EndpointFilter::AlwaysFalse
            ]))
        );
        // The plain header stays plain; the credential is a secret; the
        // static Authorization gives way to the token's.
        assert_eq!(
            p.headers,
            BTreeMap::from([("Accept-Profile".to_string(), "api".to_string())])
        );
        let secrets: Vec<(&str, Option<&str>, bool)> = p
            .secrets
            .iter()
            .map(|s| {
                let h = s.header.as_ref().unwrap();
                (h.name.as_str(), h.template.as_deref(), s.fetch_spec)
            })
            .collect();
        assert_eq!(
            secrets,
            [
                ("Authorization", Some("Bearer {{secret}}"), true),
                ("X-Api-Key", None, false),
                ("X-Jwt", None, false)
            ]
        );
        let diags = crate::checks::check_definition(&c.name, &c.spec, "here");
        assert!(diags.is_empty(), "{diags:?}");
        // A document on another origin than the API's gets no credential.
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                "openApiToolboxes": [{"tag": "OpenAPIServer", "contents": {
                    "SpecUrl": "https://specs.example.org/pets.json", "BaseUrl": "https://api.example.com",
                    "Token": "t"}}, {"tag": "OpenAPIServer", "contents": {
                    "SpecUrl": "https://API.example.com:443/openapi.json", "BaseUrl": "https://api.example.com/v1",
                    "Token": "t"}}]}
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let c = d.convert();
        let fetch: Vec<bool> = c
            .spec
            .toolboxes
            .iter()
            .map(|t| match t {
                Toolbox::Openapi(o) => o.secrets[0].fetch_spec,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(fetch, [false, true]);
        // A parser differential: one reads the host as 127.0.0.1, another
        // (the HTTP client) as 127.0.0.2. No credential either way.
        for spec in [
            "http://127.0.0.2:18101\\@127.0.0.1:18101/doc.json",
            "http://u@127.0.0.1:18101/doc.json",
        ] {
            let file: AgentFile = serde_json::from_value(serde_json::json!({
                "tag": "OpenAIAgentDescription",
                "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                    "openApiToolboxes": [{"tag": "OpenAPIServer", "contents": {
                        "SpecUrl": spec, "BaseUrl": "http://127.0.0.1:18101", "Token": "t"}}]}
            }))
            .unwrap();
            let AgentFile::OpenAIAgentDescription(d) = file;
            let c = d.convert();
            let Toolbox::Openapi(o) = &c.spec.toolboxes[0] else {
                unreachable!()
            };
            assert!(!o.secrets[0].fetch_spec, "{spec}");
        }
        // And of two exactly, as agents-exe reads it.
        let three = serde_json::from_value::<ExePredicate>(serde_json::json!(
            {"tag": "And", "contents": [{"tag": "AlwaysTrue"}, {"tag": "AlwaysTrue"}, {"tag": "AlwaysTrue"}]}
        ));
        assert!(three.is_err());
    }

    #[test]
    fn skills_are_refused_rather_than_dropped() {
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {"slug": "a", "modelUrl": "u", "modelName": "m",
                "skillSources": [{"tag": "SkillDirectory", "contents": "skills"}]}
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let err = d.convert().errors.join("\n");
        assert!(
            err.starts_with("contents.skillSources: Bindery does not load"),
            "{err}"
        );
    }

    #[test]
    fn an_mcp_simple_binary_converts_to_an_mcp_toolbox() {
        let file: AgentFile = serde_json::from_value(serde_json::json!({
            "tag": "OpenAIAgentDescription",
            "contents": {
                "slug": "a", "modelUrl": "u", "modelName": "m",
                "parameters": [{"name": "region"}, {"name": "tenant", "scope": "session"}],
                "mcpServers": [{
                    "tag": "McpSimpleBinary",
                    "contents": {
                        "name": "billing",
                        "executable": "/usr/bin/billing-mcp",
                        "args": ["--stdio", "-v"],
                        "env": {
                            "REGION": {"tag": "Param", "contents": "region"},
                            "MODE": {"tag": "Literal", "contents": "ro"}
                        }
                    }
                }, {
                    "tag": "McpSimpleBinary",
                    "contents": {"name": "plain", "executable": "srv", "args": []}
                }]
            }
        }))
        .unwrap();
        let AgentFile::OpenAIAgentDescription(d) = file;
        let c = d.convert();
        let [Toolbox::Mcp(m), Toolbox::Mcp(plain)] = c.spec.toolboxes.as_slice() else {
            panic!("{:?}", c.spec.toolboxes)
        };
        assert_eq!(m.name, "billing");
        assert_eq!(m.command, ["/usr/bin/billing-mcp", "--stdio", "-v"]);
        assert_eq!(m.env["REGION"], BindingValue::Param("region".into()));
        assert_eq!(m.env["MODE"], BindingValue::Literal("ro".into()));
        assert_eq!(m.url, None);
        assert_eq!(plain.command, ["srv"]);
        assert!(plain.env.is_empty());
        let diags = crate::checks::check_definition(&c.name, &c.spec, "here");
        assert!(diags.is_empty(), "{diags:?}");
    }
}
