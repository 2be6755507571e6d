//! MCP toolboxes: the tools of an MCP server, as `mcp_<server>_<tool>`.
//!
//! A server is a program the sidecar starts once per agent tree and talks
//! to over its stdin and stdout, or a remote server over streamable HTTP.
//! Every session shares it, so what configures it (`env`, `headers`) is
//! read once, at load, from literals and process-scope parameters. The
//! program gets no environment of the sidecar's but `PATH` and `HOME`: the
//! sidecar's own variables hold the operator's values and tokens. The
//! secrets it was given are scrubbed (`<secret:NAME>`) from its stderr,
//! which goes to the sidecar's log, and, like every tool's, from its tools'
//! results (see [`bindery_params::scrub`]).
//!
//! The client is rmcp, the official Rust SDK. The sidecar spawns the
//! program itself and hands rmcp the pipes, so that it owns the child's
//! environment and sees its exit status. A server that exits is not
//! restarted: its tools fail, naming the server and how it ended.

pub mod error;
pub mod listing;
pub mod oauth;
pub mod per_user;

pub use error::{ServerError, SharedValueError, StartError, ToolSpecError};
pub use per_user::PerUserServer;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot, watch};

use super::bash::Limits;
use super::{CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec};
use bindery_llm::egress;
use bindery_params::scrub::Scrubber;
use bindery_params::{ParamValue, SecretString, Values};
use bindery_spec::{BindingValue, McpToolbox};

/// How long a server may take to start and answer `initialize`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server with an `authorization-code` grant may take to
/// answer `initialize`: a person may be giving their consent.
const CONSENT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a closed pipe waits for the program's exit status.
const EXIT_PATIENCE: Duration = Duration::from_secs(5);

/// A value of a server's `env` or `headers`, as it was read at load.
#[derive(Clone, Debug, PartialEq)]
pub enum SharedValue {
    Plain(String),
    Secret(SecretString),
}

impl SharedValue {
    fn expose(&self) -> &str {
        match self {
            SharedValue::Plain(s) => s,
            SharedValue::Secret(s) => s.expose(),
        }
    }
}

/// The values of `env` or `headers` under the load-time `values`: literals
/// as text, parameters as their value (a secret stays one). An unbound
/// parameter leaves its entry out (a required one has stopped the load
/// already). Pure.
pub fn shared_values(
    map: &BTreeMap<String, BindingValue>,
    values: &Values,
) -> Result<Vec<(String, SharedValue)>, SharedValueError> {
    let mut out = Vec::new();
    for (key, v) in map {
        let text = match v {
            BindingValue::Literal(serde_json::Value::String(s)) => SharedValue::Plain(s.clone()),
            BindingValue::Literal(
                l @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)),
            ) => SharedValue::Plain(l.to_string()),
            BindingValue::Literal(serde_json::Value::Null) => SharedValue::Plain(String::new()),
            BindingValue::Literal(l) => {
                return Err(SharedValueError::Literal {
                    key: key.clone(),
                    kind: bindery_params::value::json_kind(l),
                })
            }
            BindingValue::Identity(i) => {
                return Err(SharedValueError::Identity {
                    key: key.clone(),
                    what: i.describe(),
                })
            }
            BindingValue::Param(p) => match values.get(p) {
                None => continue,
                Some(ParamValue::Secret(s)) => SharedValue::Secret(s.clone()),
                Some(pv) => match pv.to_text() {
                    Some(bindery_params::value::ArgText::Plain(s)) => SharedValue::Plain(s),
                    _ => {
                        return Err(SharedValueError::Param {
                            key: key.clone(),
                            param: p.clone(),
                            holds: pv
                                .plain()
                                .map_or("a secret", bindery_params::value::json_kind),
                        })
                    }
                },
            },
        };
        out.push((key.clone(), text));
    }
    Ok(out)
}

/// What scrubs the server's stderr: its own secrets, named by the variable
/// or header that carries them.
fn scrubber_of(secrets: &[(String, SecretString)]) -> Scrubber {
    let mut s = Scrubber::default();
    for (name, secret) in secrets {
        s.add(name, secret);
    }
    s
}

type InFlight = Arc<std::sync::Mutex<Vec<Arc<Scrubber>>>>;

/// A call's scrubber, in flight until this is dropped.
struct InCall<'a>(&'a InFlight, Arc<Scrubber>);

impl<'a> InCall<'a> {
    fn new(calls: &'a InFlight, scrubber: &Arc<Scrubber>) -> InCall<'a> {
        let mut list = calls.lock().unwrap_or_else(|p| p.into_inner());
        list.push(scrubber.clone());
        InCall(calls, scrubber.clone())
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = list.iter().position(|s| Arc::ptr_eq(s, &self.1)) {
            list.swap_remove(i);
        }
    }
}

/// A line of the server's stderr scrubbed of its own secrets and of those
/// of every call in flight.
fn scrub_stderr(line: &str, own: &Scrubber, calls: &InFlight) -> String {
    let mut line = own.scrub(line);
    let in_flight: Vec<Arc<Scrubber>> = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for s in in_flight {
        line = s.scrub(&line);
    }
    line
}

/// How the program ended, given a moment to be recorded: a closed pipe
/// comes before the exit status, which explains more.
async fn exit_of(exited: &watch::Receiver<Option<String>>) -> Option<String> {
    let mut exited = exited.clone();
    let recorded = tokio::time::timeout(EXIT_PATIENCE, exited.wait_for(Option::is_some)).await;
    match recorded {
        Ok(Ok(how)) => how.clone(),
        _ => None,
    }
}

/// What failed a request: a redirect the egress policy refused is told as
/// such, anything else as rmcp says it.
fn why(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(o) = oauth_in(e) {
        return format!("oauth: {o}");
    }
    match refused_in(e) {
        Some(refused) => refused.to_string(),
        None => e.to_string(),
    }
}

/// The OAuth failure that failed a request, if one did (told alone: rmcp's
/// wrapping names its own types).
fn oauth_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a oauth::OAuthError> {
    use rmcp::service::ClientInitializeError;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(StreamableHttpError::Client(oauth::transport::Failure::OAuth(o))) =
            c.downcast_ref::<StreamableHttpError<oauth::transport::Failure>>()
        {
            return Some(o);
        }
        cause = match c.downcast_ref::<ClientInitializeError>() {
            Some(ClientInitializeError::TransportError { error, .. }) => Some(error),
            _ => c.source(),
        };
    }
    None
}

/// The HTTP status a remote server answered, if that failed a request
/// (rmcp keeps it as an `HttpStatusError` inside its transport error).
fn http_status_in(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    use rmcp::transport::streamable_http_client::{HttpStatusError, StreamableHttpError};
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<HttpStatusError>() {
            return Some(h.status);
        }
        if let Some(StreamableHttpError::HttpStatus(h)) =
            c.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return Some(h.status);
        }
        if let Some(StreamableHttpError::HttpStatus(h)) =
            c.downcast_ref::<StreamableHttpError<oauth::transport::Failure>>()
        {
            return Some(h.status);
        }
        cause = c.source();
    }
    None
}

/// The redirect the egress policy refused, if that failed a request. rmcp
/// gives neither the HTTP client's error nor an initialize request's
/// transport error as a cause (`source`), so both are looked into here.
fn refused_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a egress::Refused> {
    use rmcp::service::ClientInitializeError;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(refused) = egress::refused(c) {
            return Some(refused);
        }
        if let Some(StreamableHttpError::Client(inner)) =
            c.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return egress::refused(inner);
        }
        if let Some(StreamableHttpError::Client(oauth::transport::Failure::Http(inner))) =
            c.downcast_ref::<StreamableHttpError<oauth::transport::Failure>>()
        {
            return egress::refused(inner);
        }
        cause = match c.downcast_ref::<ClientInitializeError>() {
            Some(ClientInitializeError::TransportError { error, .. }) => Some(error),
            _ => c.source(),
        };
    }
    None
}

fn secrets_of(values: &[(String, SharedValue)]) -> Vec<(String, SecretString)> {
    values
        .iter()
        .filter_map(|(k, v)| match v {
            SharedValue::Secret(s) => Some((k.clone(), s.clone())),
            SharedValue::Plain(_) => None,
        })
        .collect()
}

/// Tells the agent's tool list that a server's tools changed.
struct Handler {
    changed: mpsc::UnboundedSender<usize>,
    index: usize,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        // The receiver is gone only when the agent tree is.
        let _ = self.changed.send(self.index);
    }
}

/// A running (or connected) MCP server.
pub struct McpServer {
    name: String,
    service: RunningService<RoleClient, Handler>,
    /// How the program ended, once it has (stdio servers).
    exited: watch::Receiver<Option<String>>,
    /// The secret values of its `env` or `headers`, scrubbed from results.
    secrets: Vec<(String, SecretString)>,
    /// A remote server's OAuth, whose tokens are scrubbed from results too.
    oauth: Option<Arc<oauth::OAuth>>,
    /// The scrubbers of the calls in flight: a server that logs its
    /// arguments has its stderr scrubbed of the values each call can reach
    /// too (a line read after its call has ended is left to the logs' own
    /// scrubbing of every live value).
    calls: InFlight,
    /// Dropping it stops the program.
    stop_on_drop: Option<oneshot::Sender<()>>,
    limits: Limits,
}

impl McpServer {
    /// Start (or connect to) the server of toolbox `tb`. `values` are the
    /// load-time parameter values; a tools/list_changed notification sends
    /// `index` on `changed`.
    /// `consent` asks a person for an `authorization-code` grant's
    /// consent (none where nobody can be asked).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        tb: &McpToolbox,
        base: &Path,
        values: &Values,
        limits: Limits,
        changed: mpsc::UnboundedSender<usize>,
        index: usize,
        consent: Option<Arc<dyn oauth::Consent>>,
    ) -> Result<Arc<McpServer>, StartError> {
        let handler = Handler { changed, index };
        match (&tb.url, tb.command.split_first()) {
            (Some(url), None) => {
                let headers = shared_values(&tb.headers, values).map_err(StartError::Header)?;
                let oauth = match &tb.oauth {
                    Some(o) => Some(Arc::new(Self::oauth(tb, url, o, values, consent)?)),
                    None => None,
                };
                Self::connect(tb, url, headers, oauth, handler, limits).await
            }
            (None, Some((program, args))) => {
                let env = shared_values(&tb.env, values).map_err(StartError::Env)?;
                Self::spawn(tb, base, program, args, env, handler, limits).await
            }
            // A malformed toolbox is reported by `spec::checks`.
            _ => Err(StartError::CommandOrUrl),
        }
    }

    /// The toolbox's OAuth, its values read and its key parsed.
    pub(super) fn oauth(
        tb: &McpToolbox,
        url: &str,
        o: &bindery_spec::McpOAuth,
        values: &Values,
        consent: Option<Arc<dyn oauth::Consent>>,
    ) -> Result<oauth::OAuth, StartError> {
        let read = shared_values(&o.values(), values).map_err(StartError::OAuthValue)?;
        let get = |key: &str| {
            read.iter().find(|(k, _)| k == key).map(|(_, v)| match v {
                SharedValue::Plain(s) => SecretString::new(s.clone()),
                SharedValue::Secret(s) => s.clone(),
            })
        };
        let settings = oauth::Settings::new(
            o,
            get("clientId").map(|s| s.expose().to_string()),
            get("clientSecret"),
            get("privateKey"),
        )
        .map_err(StartError::OAuth)?;
        oauth::OAuth::new(&tb.name, url, settings, consent).map_err(StartError::OAuth)
    }

    async fn connect(
        tb: &McpToolbox,
        url: &str,
        headers: Vec<(String, SharedValue)>,
        oauth: Option<Arc<oauth::OAuth>>,
        handler: Handler,
        limits: Limits,
    ) -> Result<Arc<McpServer>, StartError> {
        let mut map = HashMap::new();
        for (k, v) in &headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| StartError::HeaderName { name: k.clone() })?;
            let mut value = reqwest::header::HeaderValue::from_str(v.expose())
                .map_err(|_| StartError::HeaderValue { name: k.clone() })?;
            value.set_sensitive(true);
            map.insert(name, value);
        }
        // The headers go only to the server's own origin (see `egress`).
        let client = egress::client(tb.redirects)
            .connect_timeout(START_TIMEOUT)
            .build()
            .map_err(StartError::Client)?;
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(map);
        let served = match &oauth {
            None => {
                let transport = StreamableHttpClientTransport::with_client(client, config);
                tokio::time::timeout(START_TIMEOUT, handler.serve(transport)).await
            }
            Some(o) => {
                let client = oauth::transport::Authorized {
                    inner: client,
                    oauth: o.clone(),
                };
                let transport = StreamableHttpClientTransport::with_client(client, config);
                // A person's consent may take longer than a server's start.
                let patience = match tb.oauth.as_ref().map(|o| o.grant) {
                    Some(bindery_spec::OAuthGrant::AuthorizationCode) => CONSENT_TIMEOUT,
                    _ => START_TIMEOUT,
                };
                tokio::time::timeout(patience, handler.serve(transport)).await
            }
        };
        let service = served
            .map_err(|_| StartError::ConnectTimeout {
                url: egress::shown_text(url),
            })?
            .map_err(|e| StartError::Connect {
                url: egress::shown_text(url),
                why: why(&e),
            })?;
        Ok(Arc::new(McpServer {
            name: tb.name.clone(),
            service,
            // Never set: a remote server has no program to exit.
            exited: watch::channel(None).1,
            secrets: secrets_of(&headers),
            oauth,
            calls: InFlight::default(),
            stop_on_drop: None,
            limits,
        }))
    }

    async fn spawn(
        tb: &McpToolbox,
        base: &Path,
        program: &str,
        args: &[String],
        env: Vec<(String, SharedValue)>,
        handler: Handler,
        limits: Limits,
    ) -> Result<Arc<McpServer>, StartError> {
        let path = if program.contains('/') {
            base.join(program)
        } else {
            program.into()
        };
        let mut cmd = tokio::process::Command::new(&path);
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Enough to find and run an interpreter (`npx`, `python3`); the
        // declared `env` may override either.
        for key in ["PATH", "HOME"] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        for (k, v) in &env {
            cmd.env(k, v.expose());
        }
        // Marked as a bash tool's process is: what the server leaves
        // running when it dies (this server gets EOF on its stdin; what it
        // started does not) is ended by the next start.
        let (mark, server) = bindery_reaper::mark();
        cmd.env(mark, server);
        let secrets = secrets_of(&env);
        let (mut child, kept) = bindery_reaper::spawn_kept(|| {
            let child = cmd.spawn()?;
            let pid = child.id();
            Ok((child, pid))
        })
        .map_err(|error| StartError::Spawn {
            path: path.clone(),
            error,
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(StartError::Pipes);
        };

        let (server, scrubber) = (tb.name.clone(), scrubber_of(&secrets));
        let calls = InFlight::default();
        let in_flight = calls.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line = scrub_stderr(&line, &scrubber, &in_flight);
                tracing::info!(mcp_server = %server, "stderr: {line}");
            }
        });
        let (record, exited) = watch::channel(None);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tb.name.clone();
        tokio::spawn(async move {
            // Kept from the sweep for as long as it runs.
            let _kept = kept;
            tokio::select! {
                status = child.wait() => {
                    let how = match status {
                        Ok(s) => s.to_string(),
                        Err(e) => format!("cannot tell how: {e}"),
                    };
                    tracing::warn!(mcp_server = %server, "the MCP server exited ({how}); its tools fail until the sidecar restarts");
                    record.send_replace(Some(how));
                }
                _ = stopped => {
                    let _ = child.kill().await;
                }
            }
        });

        let service = tokio::time::timeout(START_TIMEOUT, handler.serve((stdout, stdin)))
            .await
            .map_err(|_| StartError::StartTimeout {
                program: program.to_string(),
            });
        let service = match service {
            Ok(Ok(s)) => s,
            Ok(Err(error)) => {
                let program = program.to_string();
                return Err(match exit_of(&exited).await {
                    Some(how) => StartError::Exited { program, how },
                    None => StartError::Handshake {
                        program,
                        error: Box::new(error),
                    },
                });
            }
            Err(e) => return Err(e),
        };
        Ok(Arc::new(McpServer {
            name: tb.name.clone(),
            service,
            exited,
            secrets,
            oauth: None,
            calls,
            stop_on_drop: Some(stop),
            limits,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What went wrong talking to the server, in the words the model and the
    /// log get: the exit of its program if it has exited.
    fn failure(&self, e: impl std::fmt::Display) -> ServerError {
        let server = self.name.clone();
        match self.exited.borrow().as_ref() {
            Some(how) => ServerError::Exited {
                server,
                how: how.clone(),
            },
            None => ServerError::Failed {
                server,
                why: e.to_string(),
            },
        }
    }

    /// The server's tools now, plus a warning for each one skipped.
    pub async fn tools(self: &Arc<Self>) -> Result<(Vec<McpTool>, Vec<String>), ServerError> {
        let listed = tokio::time::timeout(
            self.limits.call_timeout,
            self.service.peer().list_all_tools(),
        )
        .await
        .map_err(|_| self.failure("`tools/list` timed out"))?
        .map_err(|e| self.failure(why(&e)))?;
        let mut tools = Vec::new();
        let mut warnings = Vec::new();
        for t in listed {
            let json = serde_json::to_value(&t).unwrap_or_default();
            match listing::tool_spec(&self.name, &json) {
                Ok(spec) => tools.push(McpTool {
                    spec,
                    route: Route::Shared(self.clone()),
                    connect: false,
                }),
                Err(why) => warnings.push(format!("skipped: {why}")),
            }
        }
        Ok((tools, warnings))
    }
}

/// An MCP toolbox's server: one connection shared by every session, or
/// one per person.
#[derive(Clone)]
pub enum McpConnection {
    Shared(Arc<McpServer>),
    PerUser(Arc<PerUserServer>),
}

impl McpConnection {
    /// Start (or connect to) the server of toolbox `tb`, or, for a
    /// per-user one ([`McpToolbox::per_user`]), get ready to connect each
    /// person on first need. See [`McpServer::start`].
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        tb: &McpToolbox,
        base: &Path,
        values: &Values,
        limits: Limits,
        changed: mpsc::UnboundedSender<usize>,
        index: usize,
        consent: Option<Arc<dyn oauth::Consent>>,
    ) -> Result<McpConnection, StartError> {
        if tb.per_user() {
            return PerUserServer::new(tb, values, limits, changed, index)
                .map(McpConnection::PerUser);
        }
        McpServer::start(tb, base, values, limits, changed, index, consent)
            .await
            .map(McpConnection::Shared)
    }

    /// The server's tools now, plus a warning for each one skipped.
    pub async fn tools(&self) -> Result<(Vec<McpTool>, Vec<String>), ServerError> {
        match self {
            McpConnection::Shared(s) => s.tools().await,
            McpConnection::PerUser(s) => s.tools().await,
        }
    }

    /// The bound arguments its tools take, each with the name of the run's
    /// value bound to it (a per-user server's person and header values).
    pub fn credentials(tb: &McpToolbox) -> Vec<(String, String)> {
        match tb.per_user() {
            true => PerUserServer::credentials(tb),
            false => Vec::new(),
        }
    }
}

/// Where a tool's calls go.
enum Route {
    Shared(Arc<McpServer>),
    PerUser(Arc<PerUserServer>),
}

/// One tool of an MCP server.
pub struct McpTool {
    spec: ToolSpec,
    route: Route,
    /// A per-user server's `connect`, offered until its tools are listed.
    connect: bool,
}

impl McpTool {
    fn server_name(&self) -> &str {
        match &self.route {
            Route::Shared(s) => &s.name,
            Route::PerUser(s) => s.name(),
        }
    }
}

/// The model's arguments as the protocol's JSON object.
fn arguments_of(args: CallArgs) -> serde_json::Map<String, serde_json::Value> {
    args.into_iter()
        .map(|(k, v)| {
            let json = match v {
                ParamValue::Plain(j) => j,
                ParamValue::Secret(s) => serde_json::Value::String(s.expose().to_string()),
            };
            (k, json)
        })
        .collect()
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn secrets(&self) -> Vec<(String, SecretString)> {
        match &self.route {
            Route::Shared(server) => {
                let mut s = server.secrets.clone();
                if let Some(o) = &server.oauth {
                    s.extend(o.secrets());
                }
                s
            }
            // The person's own values are the run's, scrubbed as such.
            Route::PerUser(server) => server.secrets(),
        }
    }

    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let started = Instant::now();
        let outcome = match &self.route {
            Route::Shared(server) => self.call_shared(server, args, ctx).await,
            Route::PerUser(server) => self.call_per_user(server, args, ctx).await,
        };
        tracing::info!(
            tool = %self.spec.name,
            session = %ctx.session_id,
            mcp_server = %self.server_name(),
            ok = outcome.is_ok(),
            duration_ms = started.elapsed().as_millis() as u64,
            "MCP tool call"
        );
        // The server's own credentials are scrubbed with the run's (see
        // `secrets`).
        outcome
    }
}

impl McpTool {
    async fn call_shared(
        &self,
        server: &Arc<McpServer>,
        args: CallArgs,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let params = CallToolRequestParams::new(self.spec.local_name.clone())
            .with_arguments(arguments_of(args));
        let _in_call = InCall::new(&server.calls, &ctx.scrubber);
        let answer = tokio::time::timeout(
            server.limits.call_timeout,
            server.service.peer().call_tool(params),
        )
        .await;
        match answer {
            Err(_) => Err(ToolError::Failed(format!(
                "MCP server `{}` did not answer within {:?}",
                server.name, server.limits.call_timeout
            ))),
            Ok(Err(e)) => {
                // A closed connection to a program: wait for how it ended.
                let closed = matches!(
                    e,
                    rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
                );
                if closed && server.stop_on_drop.is_some() {
                    exit_of(&server.exited).await;
                }
                let message = server.failure(why(&e)).to_string();
                Err(match http_status_in(&e) {
                    Some(status) => ToolError::Http { status, message },
                    None => ToolError::Failed(message),
                })
            }
            Ok(Ok(result)) => {
                let json = serde_json::to_value(&result).unwrap_or_default();
                listing::result_output(&json, server.limits.max_output, &ctx.scrubber)
            }
        }
    }

    /// A call on the calling person's own connection (made now if they
    /// have none); `connect` only makes it.
    async fn call_per_user(
        &self,
        server: &Arc<PerUserServer>,
        mut args: CallArgs,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let (subject, current) = server.person_of(&mut args)?;
        // The person's values are on the connection until this is dropped,
        // as the call ends.
        let (conn, _held) = server
            .connection(&subject, current)
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        if self.connect {
            return Ok(ToolOutput::text(format!(
                "Connected to MCP server `{}`: its tools are now available.",
                server.name()
            )));
        }
        let params = CallToolRequestParams::new(self.spec.local_name.clone())
            .with_arguments(arguments_of(args));
        let answer = tokio::time::timeout(
            server.limits.call_timeout,
            conn.service.peer().call_tool(params),
        )
        .await;
        match answer {
            Err(_) => Err(ToolError::Failed(format!(
                "MCP server `{}` did not answer within {:?}",
                server.name(),
                server.limits.call_timeout
            ))),
            Ok(Err(e)) => {
                let message = server.failed(why(&e)).to_string();
                Err(match http_status_in(&e) {
                    Some(status) => ToolError::Http { status, message },
                    None => ToolError::Failed(message),
                })
            }
            Ok(Ok(result)) => {
                let json = serde_json::to_value(&result).unwrap_or_default();
                listing::result_output(&json, server.limits.max_output, &ctx.scrubber)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shared_values_read_literals_and_parameters() {
        let map: BTreeMap<String, BindingValue> = [
            ("A".to_string(), BindingValue::Literal(json!("x"))),
            ("B".to_string(), BindingValue::Literal(json!(3))),
            ("C".to_string(), BindingValue::Param("region".into())),
            ("D".to_string(), BindingValue::Param("token".into())),
            ("E".to_string(), BindingValue::Param("unset".into())),
        ]
        .into();
        let mut values = Values::new();
        values.insert("region".into(), ParamValue::Plain(json!("eu")));
        values.insert(
            "token".into(),
            ParamValue::Secret(SecretString::new("s3cr3t")),
        );
        let got = shared_values(&map, &values).unwrap();
        assert_eq!(
            got,
            [
                ("A".to_string(), SharedValue::Plain("x".into())),
                ("B".to_string(), SharedValue::Plain("3".into())),
                ("C".to_string(), SharedValue::Plain("eu".into())),
                (
                    "D".to_string(),
                    SharedValue::Secret(SecretString::new("s3cr3t"))
                ),
            ]
        );
        let bad: BTreeMap<String, BindingValue> =
            [("X".to_string(), BindingValue::Literal(json!({"a": 1})))].into();
        let err = shared_values(&bad, &values).unwrap_err();
        assert_eq!(
            err,
            SharedValueError::Literal {
                key: "X".into(),
                kind: "an object"
            }
        );
        assert!(err.to_string().contains("an object"), "{err}");
    }

    #[test]
    fn stderr_lines_are_scrubbed_of_the_calls_in_flight_too() {
        let own = scrubber_of(&[("API_TOKEN".into(), SecretString::new("s3cr3t"))]);
        let calls = InFlight::default();
        let mut call = Scrubber::default();
        call.add("token", &SecretString::new("session-secret-1"));
        let call = Arc::new(call);
        let line = r#"args: {"token": "session-secret-1"} env: s3cr3t"#;
        {
            let _in_call = InCall::new(&calls, &call);
            assert_eq!(
                scrub_stderr(line, &own, &calls),
                r#"args: {"token": "<secret:token>"} env: <secret:API_TOKEN>"#
            );
        }
        assert!(calls.lock().unwrap().is_empty());
        assert_eq!(
            scrub_stderr(line, &own, &calls),
            r#"args: {"token": "session-secret-1"} env: <secret:API_TOKEN>"#
        );
    }

    #[test]
    fn stderr_lines_are_scrubbed() {
        let s = scrubber_of(&[("API_TOKEN".into(), SecretString::new("s3cr3t"))]);
        assert_eq!(s.scrub("token=s3cr3t!"), "token=<secret:API_TOKEN>!");
    }
}
