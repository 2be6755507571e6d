//! OpenAPI toolboxes: an HTTP API described by an OpenAPI 3.x document,
//! one tool per operation.
//!
//! Arguments are the operation's path and query parameters and the
//! top-level properties of its JSON request body, so bindings hide them
//! like any other argument. Credentials are not arguments the model could
//! see: a secret read at load is kept in the registration; a secret taken
//! from a parameter (`{param: callback_token}`) becomes a hidden argument
//! bound to that parameter, so the run's own value reaches each request
//! through the ordinary binding combinator and stays a
//! [`ParamValue::Secret`] down to the header. Neither is ever logged: a
//! request is logged as its method, path template, status and duration.

pub mod agents_exe_args;
pub mod document;
pub mod error;
pub mod postgrest;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Url;

pub use document::{operations, sanitize_name, DocumentError, Location, Operation};
pub use error::{DecodeError, LoadError, Quoting, SecretPlaceError, UrlError};

use super::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport};
use bindery_llm::egress;
use bindery_params::scrub::Scrubber;
use bindery_params::value::ArgText;
use bindery_params::{ApiKeys, ParamValue, SecretString, Values};
use bindery_spec::{OpenApiSecret, OpenApiToolbox, SecretSource};

/// Default request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bytes of response body kept.
pub const DEFAULT_MAX_RESPONSE: usize = 256 * 1024;
/// Bytes of an error response's body quoted to the model.
const MAX_ERROR_EXCERPT: usize = 2048;
/// Largest OpenAPI document read.
const MAX_DOCUMENT: usize = 16 * 1024 * 1024;

/// Where a secret goes in a request.
#[derive(Clone, Debug)]
pub enum SecretPlace {
    Header {
        name: HeaderName,
        template: Option<String>,
    },
    Query(String),
}

impl SecretPlace {
    /// What its value is shown as: the header's or query parameter's name.
    fn name(&self) -> &str {
        match self {
            SecretPlace::Header { name, .. } => name.as_str(),
            SecretPlace::Query(q) => q,
        }
    }
}

/// Where a secret's value is at call time.
#[derive(Clone, Debug)]
enum SecretValue {
    /// Read when the toolbox loaded.
    Loaded(SecretString),
    /// The hidden argument bound to a parameter.
    Arg(String),
}

#[derive(Clone, Debug)]
struct Secret {
    value: SecretValue,
    place: SecretPlace,
}

/// What the operations of one toolbox share.
struct Shared {
    /// The toolbox, as messages name it (`toolbox 2 (openapi ./api.yaml)`).
    label: String,
    base_url: String,
    client: reqwest::Client,
    max_response: usize,
    secrets: Vec<Secret>,
    /// The toolbox's `headers`, less those a secret sets.
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// One operation of an API.
pub struct OpenApiTool {
    spec: ToolSpec,
    op: Operation,
    shared: Arc<Shared>,
}

/// The hidden argument carrying secret `index` (0-based) of a toolbox.
fn secret_arg(index: usize) -> String {
    format!("bindery-secret-{}", index + 1)
}

/// A header's value: the template with `{{secret}}` replaced, or the secret.
pub fn header_value(template: Option<&str>, secret: &str) -> String {
    match template {
        Some(t) => t.replace("{{secret}}", secret),
        None => secret.to_string(),
    }
}

/// Percent-encode one path segment: everything but RFC 3986 unreserved characters.
pub fn encode_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `base` + `path` with each `{name}` replaced by its encoded value, then
/// the query pairs. A value of `.` or `..` is refused: it would move the
/// request to another path.
pub fn build_url(
    base: &str,
    path: &str,
    path_values: &[(&str, &str)],
    query: &[(String, String)],
) -> Result<Url, UrlError> {
    let mut filled = path.to_string();
    for (name, value) in path_values {
        if value.is_empty() || *value == "." || *value == ".." {
            return Err(UrlError::PathValue {
                name: name.to_string(),
                value: value.to_string(),
            });
        }
        filled = filled.replace(&format!("{{{name}}}"), &encode_segment(value));
    }
    let full = format!("{}{}", base.trim_end_matches('/'), filled);
    let mut url = Url::parse(&full).map_err(UrlError::Url)?;
    // The request goes where the toolbox says and to the very path a
    // filter judged: the parser may not have moved it (a path read into
    // the host, dot segments resolved, escapes decoded).
    let root = Url::parse(base).map_err(UrlError::BaseUrl)?;
    let expected = format!("{}{}", root.path().trim_end_matches('/'), filled);
    if url.origin() != root.origin() || url.path() != expected {
        return Err(UrlError::LeavesBase {
            path: path.to_string(),
        });
    }
    if !query.is_empty() {
        let mut pairs = url.query_pairs_mut();
        for (k, v) in query {
            pairs.append_pair(k, v);
        }
    }
    Ok(url)
}

/// The text of a path or query value; objects and arrays go as JSON.
fn text_of(v: &ParamValue) -> String {
    match v.to_text() {
        Some(ArgText::Plain(s)) => s,
        Some(ArgText::Secret(s)) => s.to_string(),
        None => v.plain().map(|j| j.to_string()).unwrap_or_default(),
    }
}

/// The `(key, text)` pairs of an object argument grouping query values
/// (agents-exe's PostgREST `filters`, `subset`, `ranking`): a key the
/// group does not take is refused, a null is left out, a string, number
/// or boolean is sent as its text.
fn grouped(
    arg: &str,
    v: &ParamValue,
    takes: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>, ToolError> {
    let bad = |what: String| ToolError::InvalidArguments(format!("`{arg}`: {what}"));
    let object = match v.plain() {
        Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(o)) => o,
        _ => return Err(bad("must be a JSON object".into())),
    };
    let mut out = Vec::new();
    for (key, value) in object {
        if !takes(key) {
            return Err(bad(format!("takes no key `{key}`")));
        }
        let text = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => return Err(bad(format!("`{key}` must be a string"))),
        };
        out.push((key.clone(), text));
    }
    Ok(out)
}

fn json_of(v: &ParamValue) -> serde_json::Value {
    match v {
        ParamValue::Plain(j) => j.clone(),
        ParamValue::Secret(s) => serde_json::Value::String(s.expose().to_string()),
    }
}

/// The request one call makes, before it is sent.
#[derive(Debug)]
pub struct Request {
    pub method: reqwest::Method,
    pub url: Url,
    /// The toolbox's plain headers, then those carrying secrets (marked sensitive).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Option<serde_json::Value>,
}

impl OpenApiTool {
    /// Build the request for `args` (pure: no I/O).
    pub fn request(&self, args: &CallArgs) -> Result<Request, ToolError> {
        let known = |k: &str| self.spec.arg(k).is_some();
        let unknown: Vec<&str> = args
            .keys()
            .map(String::as_str)
            .filter(|k| !known(k))
            .collect();
        if !unknown.is_empty() {
            return Err(ToolError::InvalidArguments(format!(
                "unknown argument{} {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            )));
        }
        let mut path_values: Vec<(&str, String)> = Vec::new();
        let mut query: Vec<(String, String)> = Vec::new();
        let mut body = serde_json::Map::new();
        for (name, location) in &self.op.locations {
            let Some(v) = args.get(name) else {
                if self.spec.arg(name).is_some_and(|a| a.required) {
                    return Err(ToolError::InvalidArguments(format!(
                        "missing required argument `{name}`"
                    )));
                }
                continue;
            };
            match location {
                Location::Path(wire) => path_values.push((wire, text_of(v))),
                Location::Query(wire) => match v.plain() {
                    Some(serde_json::Value::Null) => {}
                    Some(serde_json::Value::Array(items)) => {
                        for item in items {
                            query.push((wire.clone(), text_of(&ParamValue::Plain(item.clone()))));
                        }
                    }
                    _ => query.push((wire.clone(), text_of(v))),
                },
                Location::Body => {
                    body.insert(name.clone(), json_of(v));
                }
                Location::BodyField(field) => {
                    body.insert(field.clone(), json_of(v));
                }
                Location::Filter => match v.plain() {
                    Some(serde_json::Value::Null) => {}
                    _ => query.push((name.clone(), postgrest::filter_value(&text_of(v)))),
                },
                Location::WholeBody { keys, reserved } => match json_of(v) {
                    serde_json::Value::Object(o) => {
                        for k in o.keys() {
                            // A field a kept argument sets (a bound column;
                            // `reserved` holds every one of them) is not the
                            // body argument's to give, in any spelling.
                            if reserved.contains(&agents_exe_args::folded(k)) {
                                return Err(ToolError::InvalidArguments(format!(
                                    "`{name}` may not set `{k}`"
                                )));
                            }
                            if keys.as_ref().is_some_and(|keys| !keys.contains(k)) {
                                return Err(ToolError::InvalidArguments(format!(
                                    "`{name}` takes no key `{k}` (it takes {})",
                                    keys.as_deref().unwrap_or_default().join(", ")
                                )));
                            }
                        }
                        body.extend(o)
                    }
                    serde_json::Value::Null => {}
                    _ => {
                        return Err(ToolError::InvalidArguments(format!(
                            "`{name}` must be a JSON object (the request body)"
                        )))
                    }
                },
                Location::Filters(columns) => {
                    for (col, text) in grouped(name, v, |k| columns.iter().any(|c| c == k))? {
                        query.push((col, postgrest::filter_value(&text)));
                    }
                }
                Location::Subset(keys) => {
                    for (key, text) in grouped(name, v, |k| keys.iter().any(|x| x == k))? {
                        let wire = if key == "columns" {
                            "select".into()
                        } else {
                            key
                        };
                        query.push((wire, text));
                    }
                }
                Location::Ranking => query.extend(grouped(name, v, |k| k == "order")?),
            }
        }
        let mut headers = self.shared.headers.clone();
        for (k, v) in &self.op.headers {
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.push((k, v));
            }
        }
        for s in &self.shared.secrets {
            let value = match &s.value {
                SecretValue::Loaded(v) => v.expose().to_string(),
                SecretValue::Arg(arg) => match args.get(arg) {
                    Some(v) => match v.to_text() {
                        Some(ArgText::Secret(t)) => t.to_string(),
                        Some(ArgText::Plain(t)) => t,
                        None => {
                            tracing::warn!(
                                tool = %self.spec.name,
                                "a secret's parameter holds an object or array; a credential must be text"
                            );
                            return Err(ToolError::Unavailable);
                        }
                    },
                    // Unbound optional parameter: the credential is left out.
                    None => continue,
                },
            };
            match &s.place {
                SecretPlace::Header { name, template } => {
                    let mut hv = HeaderValue::from_str(&header_value(template.as_deref(), &value))
                        .map_err(|_| {
                            tracing::warn!(tool = %self.spec.name, header = %name, "a secret does not fit in a header value");
                            ToolError::Unavailable
                        })?;
                    hv.set_sensitive(true);
                    headers.push((name.clone(), hv));
                }
                SecretPlace::Query(q) => query.push((q.clone(), value)),
            }
        }
        if self.op.table.is_some() {
            if let Some(why) = query
                .iter()
                .filter(|(k, _)| k == "select")
                .find_map(|(_, v)| postgrest::embeds(v))
            {
                return Err(ToolError::InvalidArguments(why));
            }
        }
        let refs: Vec<(&str, &str)> = path_values.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let url = build_url(&self.shared.base_url, &self.op.path, &refs, &query)
            .map_err(|e| ToolError::InvalidArguments(e.to_string()))?;
        let method = reqwest::Method::from_bytes(self.op.method.as_bytes())
            .map_err(|_| ToolError::Failed(format!("bad method {}", self.op.method)))?;
        Ok(Request {
            method,
            url,
            headers,
            body: self.op.has_body.then_some(serde_json::Value::Object(body)),
        })
    }
}

#[async_trait]
impl Tool for OpenApiTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Credentials read when the toolbox loaded, named by the header or
    /// query parameter that carries them.
    fn secrets(&self) -> Vec<(String, SecretString)> {
        self.shared
            .secrets
            .iter()
            .filter_map(|s| match &s.value {
                SecretValue::Loaded(v) => Some((s.place.name().to_string(), v.clone())),
                SecretValue::Arg(_) => None,
            })
            .collect()
    }

    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let req = self.request(&args)?;
        let started = Instant::now();
        let mut builder = self.shared.client.request(req.method, req.url);
        for (k, v) in req.headers {
            builder = builder.header(k, v);
        }
        if let Some(body) = req.body {
            builder = builder.json(&body);
        }
        let log_failure = |what: &str| {
            tracing::info!(
                tool = %self.spec.name,
                session = %ctx.session_id,
                method = %self.op.method,
                path = %self.op.path,
                duration_ms = started.elapsed().as_millis() as u64,
                "HTTP request failed: {what}"
            );
        };
        let mut resp = match builder.send().await {
            Ok(r) => r,
            Err(e) => {
                if let Some(refused) = egress::refused(&e) {
                    log_failure(&refused.to_string());
                    return Err(ToolError::Failed(format!(
                        "{}: {refused}",
                        self.shared.label
                    )));
                }
                // `without_url`: the URL may carry a secret in its query string.
                let msg = if e.is_timeout() {
                    "the request timed out".to_string()
                } else {
                    e.without_url().to_string()
                };
                log_failure(&msg);
                return Err(ToolError::Failed(format!("HTTP request failed: {msg}")));
            }
        };
        let status = resp.status();
        // Past the limit, as much as the longest form of a secret: one that
        // starts before the limit is scrubbed whole, then cut.
        let max_response = self.shared.max_response;
        let read = max_response.saturating_add(ctx.scrubber.lookahead());
        let mut body = Vec::new();
        let mut truncated = false;
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    let room = read.saturating_sub(body.len());
                    if chunk.len() > room {
                        body.extend_from_slice(&chunk[..room]);
                        truncated = true;
                        break;
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    let msg = if e.is_timeout() {
                        "the request timed out".to_string()
                    } else {
                        e.without_url().to_string()
                    };
                    log_failure(&msg);
                    return Err(ToolError::Failed(format!("HTTP request failed: {msg}")));
                }
            }
        }
        tracing::info!(
            tool = %self.spec.name,
            session = %ctx.session_id,
            method = %self.op.method,
            path = %self.op.path,
            status = status.as_u16(),
            duration_ms = started.elapsed().as_millis() as u64,
            "HTTP request"
        );
        let raw = String::from_utf8_lossy(&body);
        if status.is_success() {
            let (text, cut) = ctx.scrubber.scrub_cut(&raw, max_response);
            let mut text = if text.is_empty() {
                format!("HTTP {status} (empty response body)")
            } else {
                text
            };
            if truncated || cut {
                text.push_str(&format!("\n[response cut at {max_response} bytes]"));
            }
            Ok(ToolOutput::Text(text))
        } else {
            let chars = raw
                .char_indices()
                .nth(MAX_ERROR_EXCERPT)
                .map_or(raw.len(), |(i, _)| i);
            let (excerpt, cut) = ctx.scrubber.scrub_cut(&raw, chars.min(max_response));
            let cut = if cut || truncated { " […]" } else { "" };
            Err(ToolError::Http {
                status: status.as_u16(),
                message: format!("HTTP {status}: {excerpt}{cut}"),
            })
        }
    }
}

/// An OpenAPI toolbox's tools, and the hidden arguments each of them has
/// for the toolbox's secrets given by a parameter: the loader binds each
/// such argument to its parameter, so the model never sees it.
pub struct Loaded {
    pub tools: Vec<Arc<dyn Tool>>,
    /// `(argument, parameter)`, the same for every tool of the toolbox.
    pub credentials: Vec<(String, String)>,
    /// One per operation skipped.
    pub warnings: Vec<String>,
}

/// Load an OpenAPI toolbox: read (or fetch) its document and turn each
/// operation into a tool. `values` are the parameter values known at load
/// (process values and defaults): secrets for fetching the document may
/// come from them. `label` names the toolbox in the tools' errors.
pub async fn load(
    tb: &OpenApiToolbox,
    label: &str,
    base: &Path,
    values: &Values,
    api_keys: &ApiKeys,
) -> Result<Loaded, LoadError> {
    load_with(tb, label, base, values, api_keys, operations).await
}

/// [`load`] with another reading of the document (PostgREST's).
pub async fn load_with(
    tb: &OpenApiToolbox,
    label: &str,
    base: &Path,
    values: &Values,
    api_keys: &ApiKeys,
    to_operations: impl FnOnce(
        &serde_json::Value,
    ) -> Result<(Vec<Operation>, Vec<String>), DocumentError>,
) -> Result<Loaded, LoadError> {
    let timeout = tb
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let client = egress::client(tb.redirects)
        .timeout(timeout)
        .build()
        .map_err(LoadError::Client)?;

    let mut secrets = Vec::new();
    let mut fetch_secrets = Vec::new();
    for (i, s) in tb.secrets.iter().enumerate() {
        let place = secret_place(s).map_err(|problem| LoadError::SecretPlace {
            secret: i + 1,
            problem,
        })?;
        let value = match (&s.source, s.source.value_source()) {
            // Per call, from the run's values under the end user's value's
            // name (the static checks refuse it for fetching the spec).
            (SecretSource::Identity(_), _) => SecretValue::Arg(secret_arg(i)),
            (SecretSource::Param(p), _) => {
                if s.fetch_spec {
                    match values.get(p) {
                        Some(v) => fetch_secrets.push(Secret {
                            value: SecretValue::Loaded(SecretString::new(text_of(v))),
                            place: place.clone(),
                        }),
                        None => {
                            return Err(LoadError::FetchSecretUnset {
                                secret: i + 1,
                                param: p.clone(),
                            })
                        }
                    }
                }
                SecretValue::Arg(secret_arg(i))
            }
            (_, Some(src)) => {
                let v = bindery_params::sources::read_source_as(
                    &src,
                    base,
                    api_keys,
                    !s.keep_whitespace,
                )
                .map_err(|error| LoadError::SecretSource {
                    secret: i + 1,
                    from: src.describe(),
                    error,
                })?;
                let text = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                let text = if s.keep_whitespace {
                    text
                } else {
                    text.trim_end().to_string()
                };
                let text = match s.decode {
                    None => text,
                    Some(how) => {
                        decode_secret(&text, how).map_err(|error| LoadError::SecretDecode {
                            secret: i + 1,
                            from: src.describe(),
                            error,
                        })?
                    }
                };
                let v = SecretValue::Loaded(SecretString::new(text));
                if s.fetch_spec {
                    fetch_secrets.push(Secret {
                        value: v.clone(),
                        place: place.clone(),
                    });
                }
                v
            }
            (_, None) => unreachable!("only a param has no value source"),
        };
        secrets.push(Secret { value, place });
    }

    // What the spec's server sends may echo any credential it was sent.
    let mut quoting = Scrubber::default();
    let mut folded = Vec::new();
    for s in secrets.iter().chain(&fetch_secrets) {
        if let SecretValue::Loaded(v) = &s.value {
            quoting.add(s.place.name(), v);
            folded.extend(bindery_params::scrub::folded(v));
        }
    }
    let doc = read_document(&tb.spec, base, &client, &fetch_secrets, &quoting).await?;
    let (mut ops, mut warnings) = to_operations(&doc).map_err(|error| LoadError::Document {
        spec: tb.spec.clone(),
        error: Quoting::new(error, &quoting),
    })?;
    ops.retain(|op| match document::unsafe_path(&op.path) {
        None => true,
        Some(why) => {
            warnings.push(format!(
                "{} {:?}: skipped, no tool: its path cannot be called as written: {why}",
                op.method, op.path
            ));
            false
        }
    });
    if let Some(filter) = &tb.filter {
        let before = ops.len();
        ops.retain(|op| filter.matches(&op.endpoint()));
        if before > 0 && ops.is_empty() {
            warnings.push(format!(
                "`filter` leaves none of the document's {before} operations: the toolbox has no tool"
            ));
        }
    }
    let headers = static_headers(tb)?;
    // A filter judges the request's path; a redirect, even on the same
    // origin, would take the call to a path it never judged (a server
    // that cleans `/pets/..%2Fadmin` answers 301 to /admin). With a
    // filter, calls follow no redirect.
    let client = match &tb.filter {
        None => client,
        Some(_) => egress::client(bindery_spec::Redirects::Never)
            .timeout(timeout)
            .build()
            .map_err(LoadError::Client)?,
    };
    let shared = Arc::new(Shared {
        label: label.to_string(),
        base_url: tb.base_url.clone(),
        client,
        max_response: tb
            .max_response_bytes
            .map(|b| b as usize)
            .unwrap_or(DEFAULT_MAX_RESPONSE),
        secrets: secrets.clone(),
        headers,
    });
    let hidden: Vec<(String, String)> = tb
        .secrets
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match &s.source {
            SecretSource::Param(p) => Some((secret_arg(i), p.clone())),
            SecretSource::Identity(id) => Some((secret_arg(i), id.key())),
            _ => None,
        })
        .collect();
    let tools = ops
        .into_iter()
        .map(|op| {
            let mut spec = op.spec.clone();
            for (arg, _) in &hidden {
                spec.args.push(ArgSpec {
                    name: arg.clone(),
                    description: "a credential, bound to a parameter; never shown to the model"
                        .to_string(),
                    required: false,
                    schema: serde_json::json!({"type": "string"}),
                    transport: Transport::Json,
                });
            }
            let tool = OpenApiTool {
                spec,
                op,
                shared: shared.clone(),
            };
            Arc::new(tool) as Arc<dyn Tool>
        })
        .collect();
    Ok(Loaded {
        tools,
        credentials: hidden,
        // A warning quotes the document (a parameter's place, a media
        // type), which may echo a credential; with no tool left, nothing
        // downstream knows the toolbox's credentials to scrub them.
        warnings: warnings
            .iter()
            .map(|w| quoted(w, &quoting, &folded))
            .collect(),
    })
}

/// A warning as it may be shown: its credentials as markers, or, when it
/// spells one otherwise (its letters and digits), not at all.
fn quoted(warning: &str, quoting: &Scrubber, folded: &[SecretString]) -> String {
    let scrubbed = quoting.scrub(warning);
    if bindery_params::scrub::holds_folded(&scrubbed, folded) {
        return "an operation is skipped; its warning spells one of the toolbox's credentials and is not shown".into();
    }
    scrubbed
}

/// The toolbox's plain `headers`, checked; one a secret also sets gives
/// way to the secret.
fn static_headers(tb: &OpenApiToolbox) -> Result<Vec<(HeaderName, HeaderValue)>, LoadError> {
    let mut out = Vec::new();
    for (name, value) in &tb.headers {
        if bindery_spec::secret_sets_header(&tb.secrets, name) {
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| LoadError::HeaderName { name: name.clone() })?;
        // The value is left out of the error: a header may hold a credential.
        let value = HeaderValue::from_str(value).map_err(|_| LoadError::HeaderValue {
            name: name.to_string(),
        })?;
        out.push((name, value));
    }
    Ok(out)
}

/// A secret's value decoded as its `decode` says; the bytes must be
/// UTF-8 text. Messages never quote the value.
pub fn decode_secret(text: &str, how: bindery_spec::SecretDecode) -> Result<String, DecodeError> {
    use base64::Engine as _;
    let bytes = match how {
        bindery_spec::SecretDecode::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| DecodeError::NotBase64)?,
        bindery_spec::SecretDecode::Hex => {
            hex::decode(text.trim()).map_err(|_| DecodeError::NotHex)?
        }
    };
    String::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)
}

fn secret_place(s: &OpenApiSecret) -> Result<SecretPlace, SecretPlaceError> {
    match (&s.header, &s.query) {
        (Some(h), None) => Ok(SecretPlace::Header {
            name: HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| SecretPlaceError::HeaderName(h.name.clone()))?,
            template: h.template.clone(),
        }),
        (None, Some(q)) => Ok(SecretPlace::Query(q.clone())),
        _ => Err(SecretPlaceError::NotOneOf),
    }
}

/// The document at `spec`: an http(s) URL, a `file://` URL or a path
/// relative to `base`; JSON or YAML.
async fn read_document(
    spec: &str,
    base: &Path,
    client: &reqwest::Client,
    secrets: &[Secret],
    quoting: &Scrubber,
) -> Result<serde_json::Value, LoadError> {
    let text = if bindery_spec::http_url(spec) {
        let mut query = Vec::new();
        let mut builder_headers = Vec::new();
        for s in secrets {
            let SecretValue::Loaded(v) = &s.value else {
                continue;
            };
            match &s.place {
                SecretPlace::Header { name, template } => {
                    let mut hv =
                        HeaderValue::from_str(&header_value(template.as_deref(), v.expose()))
                            .map_err(|_| LoadError::SecretHeader {
                                header: name.to_string(),
                            })?;
                    hv.set_sensitive(true);
                    builder_headers.push((name.clone(), hv));
                }
                SecretPlace::Query(q) => query.push((q.clone(), v.expose().to_string())),
            }
        }
        let mut url = Url::parse(spec).map_err(|error| LoadError::SpecUrl {
            spec: spec.to_string(),
            error,
        })?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut req = client.get(url);
        for (k, v) in builder_headers {
            req = req.header(k, v);
        }
        // Messages name `spec` as written, never the URL with secrets added.
        let fetch = |e: reqwest::Error| match egress::refused(&e) {
            Some(refused) => LoadError::FetchRefused {
                spec: spec.to_string(),
                refused: refused.clone(),
            },
            None => LoadError::Fetch {
                spec: spec.to_string(),
                error: e.without_url(),
            },
        };
        let resp = req.send().await.map_err(fetch)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(LoadError::FetchStatus {
                spec: spec.to_string(),
                status,
                with_secrets: !secrets.is_empty(),
            });
        }
        let bytes = resp.bytes().await.map_err(|e| LoadError::Fetch {
            spec: spec.to_string(),
            error: e.without_url(),
        })?;
        if bytes.len() > MAX_DOCUMENT {
            return Err(LoadError::TooLarge {
                spec: spec.to_string(),
            });
        }
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        let path = base.join(spec.strip_prefix("file://").unwrap_or(spec));
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => text,
            Err(error) => return Err(LoadError::Read { path, error }),
        }
    };
    match serde_json::from_str(&text) {
        Ok(v) => Ok(v),
        Err(json) => serde_yaml::from_str(&text).map_err(|yaml| LoadError::Syntax {
            spec: spec.to_string(),
            json: Quoting::new(json, quoting),
            yaml: Quoting::new(yaml, quoting),
        }),
    }
}

#[cfg(test)]
mod tests;
