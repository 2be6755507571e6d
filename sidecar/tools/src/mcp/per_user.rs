//! Per-user connections to a remote MCP server: a toolbox whose `headers`
//! take an end user's values (`{identity: …}`) acts with each person's own
//! account, so one connection shared by every session would be wrong.
//!
//! Each person (their subject) gets a connection of their own, made on
//! first need in their run, kept while used, closed after [`IDLE`] and
//! capped at [`MAX_LIVE`] (the least recently used goes first). The map is
//! keyed by the subject, never by a token, and a connection is never lent
//! to another subject. The person's header values come with each call (as
//! bound arguments the model never sees) and replace the connection's
//! current ones, so an exchanged token that expired is replaced without
//! reconnecting.
//!
//! Tools stay agent-level. Until a person's connection has listed the
//! server's tools, the toolbox offers one tool, `mcp_<server>_connect`;
//! the first listing installs the server's tools through the agent's live
//! re-listing (the same channel as `tools/list_changed`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use sse_stream::Sse;
use tokio::sync::mpsc;

use super::{
    listing, shared_values, why, Handler, McpTool, Route, ServerError, StartError, START_TIMEOUT,
};
use crate::bash::Limits;
use crate::{ArgSpec, CallArgs, ToolError, Transport};
use bindery_llm::egress;
use bindery_params::live::Registration;
use bindery_params::{ParamValue, SecretString, Values};
use bindery_spec::{BindingValue, McpToolbox};

/// A connection unused this long is closed.
pub const IDLE: Duration = Duration::from_secs(600);
/// The most live connections of one toolbox; past it the least recently
/// used is closed.
pub const MAX_LIVE: usize = 256;
/// How often idle connections are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The bound argument that carries the calling run's end user (their
/// subject), bound to `@identity:subject`.
pub const PERSON_ARG: &str = "bindery-person";

/// What the model reads when a run without an end user calls a tool of a
/// per-user server (no call is made).
pub const NO_END_USER: &str =
    "this tool acts with a person's account; this session has no end user";

/// The bound argument of the `n`th header that takes an end user's value.
fn header_arg(n: usize) -> String {
    format!("bindery-header-{}", n + 1)
}

/// A header of the toolbox: the same for everyone, or the person's own
/// value, from a bound argument.
#[derive(Clone)]
enum Header {
    Shared(HeaderValue),
    /// `bearer`: the person's token in `Authorization`, sent as `Bearer
    /// <token>`.
    Person {
        arg: String,
        bearer: bool,
    },
}

type Current = Arc<std::sync::Mutex<HashMap<HeaderName, HeaderValue>>>;

/// The HTTP client of one person's connection: each request carries the
/// person's current header values (renewed by each call), over the
/// toolbox's own headers.
#[derive(Clone)]
pub struct PersonHeaders<C> {
    pub inner: C,
    current: Current,
}

impl<C> PersonHeaders<C> {
    fn merged(
        &self,
        mut headers: HashMap<HeaderName, HeaderValue>,
    ) -> HashMap<HeaderName, HeaderValue> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in current.iter() {
            headers.insert(k.clone(), v.clone());
        }
        headers
    }
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for PersonHeaders<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<C::Error>> {
        let headers = self.merged(custom_headers);
        self.inner
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<C::Error>> {
        let headers = self.merged(custom_headers);
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<C::Error>> {
        let headers = self.merged(custom_headers);
        self.inner
            .delete_session(uri, session_id, auth_header, headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<C::Error>> {
        let headers = self.merged(custom_headers);
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<C::Error>> {
        let headers = self.merged(custom_headers);
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }
}

/// One person's connection.
pub(super) struct Conn {
    pub(super) service: RunningService<RoleClient, Handler>,
    /// The person's header values, while a call of theirs holds the
    /// connection (empty otherwise: what it sends between calls carries
    /// none of them).
    current: Current,
    last_used: std::sync::Mutex<Instant>,
    /// The person's header values, registered with the logs' scrubber
    /// while the connection holds them.
    live: std::sync::Mutex<Option<Registration>>,
    /// How many calls hold it now.
    calls: std::sync::Mutex<usize>,
}

/// A call's hold on a person's connection: their values are on it while
/// any call of theirs holds it, and taken off when the last one lets go.
pub(super) struct Held(Arc<Conn>);

impl Drop for Held {
    fn drop(&mut self) {
        let mut calls = self.0.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls = calls.saturating_sub(1);
        if *calls == 0 {
            self.0
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            *self.0.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl Conn {
    /// Held by one more call, with the person's values as it brings them.
    fn hold(
        self: &Arc<Self>,
        current: HashMap<HeaderName, HeaderValue>,
        live: Option<Registration>,
    ) -> Held {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls += 1;
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = live;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = current;
        self.touch();
        Held(self.clone())
    }

    fn held(&self) -> bool {
        *self.calls.lock().unwrap_or_else(|p| p.into_inner()) > 0
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A person's slot: their connection once made (a failed one is tried
/// again by the next call).
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

/// A remote MCP server connected once per person.
pub struct PerUserServer {
    name: String,
    url: String,
    redirects: bindery_spec::Redirects,
    headers: Vec<(HeaderName, Header)>,
    /// The secret values of the shared headers, scrubbed from results.
    secrets: Vec<(String, SecretString)>,
    pub(super) limits: Limits,
    changed: mpsc::UnboundedSender<usize>,
    index: usize,
    /// The toolbox's `oauth` (client-credentials: the tenant's token, the
    /// same on every person's connection).
    oauth: Option<Arc<super::oauth::OAuth>>,
    conns: std::sync::Mutex<HashMap<String, Slot>>,
    /// The server's tools as a person's connection last listed them.
    listed: std::sync::Mutex<Option<Vec<serde_json::Value>>>,
    /// The server said its tools changed while no call held a connection
    /// to list them with: the next call lists them.
    stale: std::sync::atomic::AtomicBool,
}

impl PerUserServer {
    /// The per-user server of toolbox `tb` (nothing is connected yet).
    /// `values` are the load-time values of its shared headers.
    pub fn new(
        tb: &McpToolbox,
        values: &Values,
        limits: Limits,
        changed: mpsc::UnboundedSender<usize>,
        index: usize,
    ) -> Result<Arc<PerUserServer>, StartError> {
        let url = tb.url.clone().ok_or(StartError::CommandOrUrl)?;
        let shared: std::collections::BTreeMap<String, BindingValue> = tb
            .headers
            .iter()
            .filter(|(_, v)| !matches!(v, BindingValue::Identity(_)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let shared = shared_values(&shared, values).map_err(StartError::Header)?;
        let mut headers = Vec::new();
        let mut person = 0;
        for (k, v) in &tb.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| StartError::HeaderName { name: k.clone() })?;
            let header = match v {
                BindingValue::Identity(i) => {
                    person += 1;
                    Header::Person {
                        arg: header_arg(person - 1),
                        bearer: i.is_secret() && k.eq_ignore_ascii_case("authorization"),
                    }
                }
                _ => {
                    let Some((_, value)) = shared.iter().find(|(key, _)| key == k) else {
                        continue;
                    };
                    let mut value = HeaderValue::from_str(value.expose())
                        .map_err(|_| StartError::HeaderValue { name: k.clone() })?;
                    value.set_sensitive(true);
                    Header::Shared(value)
                }
            };
            headers.push((name, header));
        }
        let oauth = match (&tb.oauth, &tb.url) {
            (Some(o), Some(url)) => {
                Some(Arc::new(super::McpServer::oauth(tb, url, o, values, None)?))
            }
            _ => None,
        };
        let server = Arc::new(PerUserServer {
            name: tb.name.clone(),
            url,
            redirects: tb.redirects,
            headers,
            secrets: super::secrets_of(&shared),
            limits,
            changed,
            index,
            oauth,
            conns: Default::default(),
            listed: Default::default(),
            stale: Default::default(),
        });
        let weak = Arc::downgrade(&server);
        tokio::spawn(sweep(weak));
        Ok(server)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bound arguments every tool of it takes, each with the name of
    /// the run's value bound to it: the person, and each header that takes
    /// an end user's value.
    pub fn credentials(tb: &McpToolbox) -> Vec<(String, String)> {
        let mut out = vec![(
            PERSON_ARG.to_string(),
            bindery_spec::IdentityValue::Subject.key(),
        )];
        let identities = tb.headers.values().filter_map(|v| match v {
            BindingValue::Identity(i) => Some(i.key()),
            _ => None,
        });
        out.extend(identities.enumerate().map(|(n, key)| (header_arg(n), key)));
        out
    }

    pub(super) fn secrets(&self) -> Vec<(String, SecretString)> {
        let mut s = self.secrets.clone();
        if let Some(o) = &self.oauth {
            s.extend(o.secrets());
        }
        s
    }

    /// The tools now: the server's, as a person's connection a call holds
    /// lists them (else as last listed, and the next call lists them), or
    /// `connect` until any has been.
    pub async fn tools(self: &Arc<Self>) -> Result<(Vec<McpTool>, Vec<String>), ServerError> {
        match self.most_recent() {
            Some(conn) => {
                let listed = self.list(&conn).await?;
                *self.listed.lock().unwrap_or_else(|p| p.into_inner()) = Some(listed);
            }
            None => self.stale.store(true, std::sync::atomic::Ordering::Relaxed),
        }
        let listed = self
            .listed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let connect = listed.is_none();
        let (specs, warnings) = match listed {
            Some(tools) => {
                let mut specs = Vec::new();
                let mut warnings = Vec::new();
                for t in &tools {
                    match listing::tool_spec(&self.name, t) {
                        Ok(spec) => specs.push(spec),
                        Err(why) => warnings.push(format!("skipped: {why}")),
                    }
                }
                (specs, warnings)
            }
            None => (vec![self.connect_spec()], Vec::new()),
        };
        let tools = specs
            .into_iter()
            .map(|mut spec| {
                spec.args.extend(self.hidden_args());
                McpTool {
                    spec,
                    route: Route::PerUser(self.clone()),
                    connect,
                }
            })
            .collect();
        Ok((tools, warnings))
    }

    fn hidden_args(&self) -> Vec<ArgSpec> {
        let persons = self.headers.iter().filter_map(|(_, h)| match h {
            Header::Person { arg, .. } => Some(arg.clone()),
            Header::Shared(_) => None,
        });
        std::iter::once(PERSON_ARG.to_string())
            .chain(persons)
            .map(|name| ArgSpec {
                name,
                description: "the end user's value, bound; never shown to the model".into(),
                required: false,
                schema: serde_json::json!({"type": "string"}),
                transport: Transport::Json,
            })
            .collect()
    }

    fn connect_spec(&self) -> crate::ToolSpec {
        let mut spec = listing::tool_spec(
            &self.name,
            &serde_json::json!({
                "name": "connect",
                "inputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": true},
            }),
        )
        .unwrap_or_else(|_| unreachable!("a fixed, valid listing"));
        spec.description = format!(
            "Connects the person's account to the MCP server `{}`. Its tools appear after it; call it first.",
            self.name
        );
        spec
    }

    async fn list(&self, conn: &Conn) -> Result<Vec<serde_json::Value>, ServerError> {
        let listed = tokio::time::timeout(
            self.limits.call_timeout,
            conn.service.peer().list_all_tools(),
        )
        .await
        .map_err(|_| self.failed("`tools/list` timed out"))?
        .map_err(|e| self.failed(why(&e)))?;
        Ok(listed
            .into_iter()
            .map(|t| serde_json::to_value(&t).unwrap_or_default())
            .collect())
    }

    pub(super) fn failed(&self, why: impl std::fmt::Display) -> ServerError {
        ServerError::Failed {
            server: self.name.clone(),
            why: why.to_string(),
        }
    }

    /// The most recently used connection a call holds now (its person's
    /// values are on it), if any.
    fn most_recent(&self) -> Option<Arc<Conn>> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .values()
            .filter_map(|s| s.try_lock().ok().and_then(|c| c.clone()))
            .filter(|c| c.held())
            .max_by_key(|c| c.last_used())
    }

    /// The person's header values from the call's bound arguments (taken
    /// out of `args`), and the person. `Err`: what the model reads.
    pub(super) fn person_of(
        &self,
        args: &mut CallArgs,
    ) -> Result<(String, HashMap<HeaderName, HeaderValue>), ToolError> {
        let subject = match args.remove(PERSON_ARG) {
            Some(ParamValue::Plain(serde_json::Value::String(s))) if !s.is_empty() => s,
            _ => {
                for (_, h) in &self.headers {
                    if let Header::Person { arg, .. } = h {
                        args.remove(arg);
                    }
                }
                return Err(ToolError::Failed(NO_END_USER.into()));
            }
        };
        let mut current = HashMap::new();
        for (name, h) in &self.headers {
            let Header::Person { arg, bearer } = h else {
                continue;
            };
            let text = match args.remove(arg) {
                Some(ParamValue::Secret(s)) => s.expose().to_string(),
                Some(ParamValue::Plain(serde_json::Value::String(s))) => s,
                Some(ParamValue::Plain(v)) => v.to_string(),
                None => {
                    return Err(ToolError::Failed(format!(
                        "this tool acts with a person's account, and the end user's value of header `{name}` is not available to this run (their token could not be exchanged); try again later"
                    )))
                }
            };
            let text = match bearer {
                true => format!("Bearer {text}"),
                false => text,
            };
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                ToolError::Failed(format!(
                    "the end user's value of header `{name}` does not fit in a header"
                ))
            })?;
            value.set_sensitive(true);
            current.insert(name.clone(), value);
        }
        Ok((subject, current))
    }

    /// The person's connection, made now if they have none, held by the
    /// call with their current header values (taken off when the hold is
    /// dropped).
    pub(super) async fn connection(
        self: &Arc<Self>,
        subject: &str,
        current: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(Arc<Conn>, Held), ServerError> {
        let slot = {
            let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            conns.entry(subject.to_string()).or_default().clone()
        };
        let mut slot = slot.lock().await;
        let (conn, hold) = match slot.as_ref() {
            Some(conn) => {
                let live = self.registered(&current);
                let hold = conn.hold(current, live);
                (conn.clone(), hold)
            }
            None => {
                let live = self.registered(&current);
                // Made held by this call (its values are on it from the start).
                let conn = Arc::new(self.connect(current, live).await?);
                let hold = Held(conn.clone());
                *slot = Some(conn.clone());
                (conn, hold)
            }
        };
        drop(slot);
        self.evict();
        // The first person's connection lists the server's tools, and so
        // does the next call after the server said they changed.
        let first = self
            .listed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        let stale = self.stale.swap(false, std::sync::atomic::Ordering::Relaxed);
        if first || stale {
            let listed = self.list(&conn).await?;
            *self.listed.lock().unwrap_or_else(|p| p.into_inner()) = Some(listed);
            // The agent's live tools are rebuilt from it (the receiver is
            // gone only with the agent tree).
            let _ = self.changed.send(self.index);
        }
        Ok((conn, hold))
    }

    /// The person's header values registered with the logs' scrubber.
    fn registered(&self, current: &HashMap<HeaderName, HeaderValue>) -> Option<Registration> {
        let secrets = current
            .iter()
            .filter_map(|(k, v)| {
                let text = v.to_str().ok()?;
                Some((
                    format!("mcp_{}_{}", self.name, k.as_str()),
                    SecretString::new(text),
                ))
            })
            .collect();
        bindery_params::live::register(secrets)
    }

    async fn connect(
        &self,
        current: HashMap<HeaderName, HeaderValue>,
        live: Option<Registration>,
    ) -> Result<Conn, ServerError> {
        let shown = egress::shown_text(&self.url);
        let shared: HashMap<HeaderName, HeaderValue> = self
            .headers
            .iter()
            .filter_map(|(k, h)| match h {
                Header::Shared(v) => Some((k.clone(), v.clone())),
                Header::Person { .. } => None,
            })
            .collect();
        // The headers go only to the server's own origin (see `egress`).
        let client = egress::client(self.redirects)
            .connect_timeout(START_TIMEOUT)
            .build()
            .map_err(|e| self.failed(format!("cannot build an HTTP client: {e}")))?;
        let current: Current = Arc::new(std::sync::Mutex::new(current));
        let config =
            StreamableHttpClientTransportConfig::with_uri(self.url.as_str()).custom_headers(shared);
        let handler = Handler {
            changed: self.changed.clone(),
            index: self.index,
        };
        let served = match &self.oauth {
            None => {
                let client = PersonHeaders {
                    inner: client,
                    current: current.clone(),
                };
                let transport = StreamableHttpClientTransport::with_client(client, config);
                tokio::time::timeout(START_TIMEOUT, handler.serve(transport)).await
            }
            Some(oauth) => {
                let client = PersonHeaders {
                    inner: super::oauth::transport::Authorized {
                        inner: client,
                        oauth: oauth.clone(),
                    },
                    current: current.clone(),
                };
                let transport = StreamableHttpClientTransport::with_client(client, config);
                tokio::time::timeout(START_TIMEOUT, handler.serve(transport)).await
            }
        };
        let service = served
            .map_err(|_| {
                self.failed(format!(
                    "{shown} did not answer `initialize` within {START_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| self.failed(format!("cannot connect to {shown}: {}", why(&e))))?;
        Ok(Conn {
            service,
            current,
            last_used: std::sync::Mutex::new(Instant::now()),
            live: std::sync::Mutex::new(live),
            calls: std::sync::Mutex::new(1),
        })
    }

    /// Close the connections idle past [`IDLE`], then the least recently
    /// used past [`MAX_LIVE`].
    fn evict(&self) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        // A slot held by a call in progress (or a connect) is in use.
        let idle: Vec<(String, Option<Instant>)> = conns
            .iter()
            .filter_map(|(subject, slot)| {
                let held = slot.try_lock().ok()?;
                Some((subject.clone(), held.as_ref().map(|c| c.last_used())))
            })
            .collect();
        for subject in to_close(&idle, Instant::now(), IDLE, MAX_LIVE) {
            conns.remove(&subject);
        }
    }

    /// How many people have a live connection (for tests and metrics).
    pub fn live(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Which of the people's connections (`None`: none made) to close: those
/// without one or idle for `idle`, then the least recently used past
/// `max`. Pure.
fn to_close(
    conns: &[(String, Option<Instant>)],
    now: Instant,
    idle: Duration,
    max: usize,
) -> Vec<String> {
    let mut close = Vec::new();
    let mut live = Vec::new();
    for (subject, used) in conns {
        match used {
            Some(at) if now.saturating_duration_since(*at) < idle => live.push((subject, *at)),
            _ => close.push(subject.clone()),
        }
    }
    if live.len() > max {
        live.sort_by_key(|(_, at)| *at);
        let surplus = live.len() - max;
        close.extend(live[..surplus].iter().map(|(s, _)| (*s).clone()));
    }
    close
}

/// Closes idle connections while the server is in use.
async fn sweep(server: Weak<PerUserServer>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(s) = server.upgrade() else { return };
        s.evict();
    }
}

#[cfg(test)]
mod tests;
