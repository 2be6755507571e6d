//! A server in this process: agents loaded from real files, the session
//! service on a SQLite store in a temporary directory, the mock model's
//! script answered in process (no socket), and `router(state)` driven by
//! `tower::ServiceExt::oneshot`. What the spawned binary showed of the
//! API's logic, without the process, the port or the model's HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use axum::Router;
use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use bindery_api::auth::OwnerToken;
use bindery_api::state::AppState;
use bindery_llm::{ChatClient, ChatRequest, ChatResponse, LlmError, LocalModel, ToolCall};
use bindery_metrics::Metrics;
use bindery_params::ProcessValues;
use bindery_session::clients::{build_clients, ClientOptions};
use bindery_session::service::{Service, ServiceConfig};
use bindery_store::clock::{Clock, TokioClock};
use bindery_store::sqlite::SqliteStore;
use bindery_tests::fixtures::session::SessionApi;
use bindery_tests::mock_llm::{MockLlm, MockReply};
pub use bindery_tests::sidecar::Reply;
use bindery_tree::{AgentSources, LoadOptions};

pub use bindery_tests::fixtures::repo;
pub use bindery_tests::fixtures::session::{
    create, error_of, last_tool_output, message_waited, new_session, refusal, CANARY, OWNER,
};

/// The model URL agent files name: no one listens there, the client
/// answers in process.
pub const MODEL_URL: &str = "http://model.invalid/v1";

/// The mock model's script, answered in process: the request it is given
/// is the JSON body the client would have posted, and its reply is read
/// back as the client reads one.
struct InProcess(Arc<MockLlm>);

impl LocalModel for InProcess {
    fn complete<'a>(
        &'a self,
        req: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let (status, body) = self.0.respond(&wire(req)).await;
            if status != 200 {
                return Err(LlmError::Http { status, body });
            }
            completion(&body)
        })
    }
}

/// `req` as the body of `POST /chat/completions`, unstreamed.
fn wire(req: &ChatRequest) -> Value {
    let mut body = json!({"model": "mock-model", "messages": req.messages, "stream": false});
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
    }
    body
}

/// A chat completion's JSON body as the reply it is.
fn completion(body: &str) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_str(body).map_err(|e| LlmError::Malformed(e.to_string()))?;
    let choice = &v["choices"][0];
    let message = &choice["message"];
    let tool_calls: Vec<ToolCall> = match &message["tool_calls"] {
        Value::Null => Vec::new(),
        calls => {
            serde_json::from_value(calls.clone()).map_err(|e| LlmError::Malformed(e.to_string()))?
        }
    };
    Ok(ChatResponse {
        content: message["content"].as_str().map(str::to_string),
        tool_calls,
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        usage: serde_json::from_value(v["usage"].clone()).ok(),
        ..Default::default()
    })
}

/// The router of one server, and the model it asks.
pub struct Server {
    pub api: Api,
    pub mock: Arc<MockLlm>,
    /// The service's clock: tokio's, so that a paused test moves it.
    pub clock: TokioClock,
    /// The service's store, to look at what it holds.
    pub store: Arc<dyn bindery_store::SessionStore>,
}

impl Server {
    /// A server of the agent files `agents`, its store in `dir`, its model
    /// answering by `script`, configured as `serve` is by default.
    pub async fn start(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
    ) -> Server {
        Self::with_options(agents, dir, script, LoadOptions::default()).await
    }

    /// The same, the agents loaded with `load` (process-scope values as
    /// `--set` and `BINDERY_PARAM_*` give them).
    pub async fn with_options(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        load: LoadOptions,
    ) -> Server {
        Self::configured(agents, dir, script, load, |_| {}).await
    }

    /// The same, `cfg` changing the service's configuration (what
    /// `serve`'s flags set) before it starts.
    pub async fn configured(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        load: LoadOptions,
        cfg: impl FnOnce(&mut ServiceConfig),
    ) -> Server {
        Self::build(agents, dir, script, load, cfg, None, (None, None)).await
    }

    /// A server as [`Self::start`] makes it that also takes end users'
    /// identity tokens of `identity`'s issuer.
    pub async fn identified(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        identity: bindery_identity::IdentityConfig,
    ) -> Server {
        Self::identified_with(agents, dir, script, LoadOptions::default(), identity).await
    }

    /// [`Self::identified`], the agents loaded with `load`.
    pub async fn identified_with(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        load: LoadOptions,
        identity: bindery_identity::IdentityConfig,
    ) -> Server {
        // The test issuer's exchange client (`TestIssuer`).
        let exchanger = bindery_identity::Exchanger::new(
            identity.clone(),
            bindery_identity::ExchangeClient {
                client_id: "bindery".into(),
                client_secret: bindery_params::SecretString::new("exchange-secret"),
                token_url: None,
            },
        )
        .unwrap();
        let cfg = move |c: &mut ServiceConfig| c.exchanger = Some(Arc::new(exchanger));
        Self::build(agents, dir, script, load, cfg, Some(identity), (None, None)).await
    }

    /// A server as [`Self::identified`] makes it, `cfg` changing the
    /// service's configuration and `rates` the requests per minute it
    /// takes, the server's and each end user's (`--requests-per-minute`,
    /// `--per-user-requests-per-minute`).
    pub async fn limited(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        identity: bindery_identity::IdentityConfig,
        cfg: impl FnOnce(&mut ServiceConfig),
        rates: (Option<u32>, Option<u32>),
    ) -> Server {
        Self::build(
            agents,
            dir,
            script,
            LoadOptions::default(),
            cfg,
            Some(identity),
            rates,
        )
        .await
    }

    async fn build(
        agents: &[PathBuf],
        dir: &Path,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        load: LoadOptions,
        cfg: impl FnOnce(&mut ServiceConfig),
        identity: Option<bindery_identity::IdentityConfig>,
        rates: (Option<u32>, Option<u32>),
    ) -> Server {
        let tree = bindery_tree::load(&AgentSources::Files(agents.to_vec()), &load)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mock = Arc::new(MockLlm::detached(script));
        let model: Arc<dyn LocalModel> = Arc::new(InProcess(mock.clone()));
        let options = ClientOptions {
            timeout: Duration::from_secs(120),
            max_retries: 0,
            limits: Default::default(),
            model: None,
        };
        let (clients, _) = build_clients(&tree, &options).unwrap();
        // Each agent's endpoint as its file says, answered in process.
        let clients: BTreeMap<String, ChatClient> = clients
            .into_iter()
            .map(|(agent, c)| {
                let local = ChatClient::in_process(c.endpoint().clone(), model.clone()).unwrap();
                (agent, local)
            })
            .collect();
        let store = SqliteStore::open(&dir.join("store.sqlite").to_string_lossy()).unwrap();
        let owner = OwnerToken::new(OWNER);
        let metrics = Arc::new(Metrics::default());
        let clock = TokioClock::new();
        let mut config = ServiceConfig {
            clock: Arc::new(clock),
            continuation_key: owner.continuation_key(),
            // The server's default (`--live-session-ttl 1h`).
            live_session_ttl: Some(Duration::from_secs(3600)),
            ..ServiceConfig::default()
        };
        cfg(&mut config);
        let service = Service::new(
            Arc::new(tree),
            clients,
            Arc::new(store),
            metrics.clone(),
            config,
        );
        // As `serve` starts it: beat and sweep once, then on every
        // heartbeat (which also closes expired pending calls) until the
        // test's runtime ends.
        service.heartbeat().beat().await.unwrap();
        service.heartbeat().sweep().await.unwrap();
        tokio::spawn(service.clone().keep_alive(CancellationToken::new()));
        let listen = "127.0.0.1:8080".parse().unwrap();
        let state = Arc::new(AppState {
            service: service.clone(),
            peer_auth: Arc::new(bindery_api::peers::PeerAuth::new(
                owner.peer_key(),
                service.instance(),
                false,
            )),
            owner,
            mcp_client: None,
            approver: None,
            metrics,
            ready: AtomicBool::new(true),
            peers: bindery_api::peers::client(),
            peers_tls: None,
            origins: Arc::new(bindery_api::origin::OriginPolicy::new(listen, &[], &[])),
            identity: identity.map(|c| Arc::new(bindery_identity::Verifier::new(c).unwrap())),
            rates: bindery_api::rate_limit::RequestRates::new(rates.0, rates.1),
        });
        let store = service.store().clone();
        Server {
            api: Api(bindery_api::server::router(state)),
            mock,
            clock,
            store,
        }
    }

    /// The service's time of day, in milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// The session API of a server in process.
#[derive(Clone)]
pub struct Api(Router);

impl Api {
    /// `method path` with `token` and the JSON `body`: the reply.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        self.call_with(method, path, token, &[], body).await.reply
    }

    /// The same with the extra `headers`; the reply and its content type.
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Answer {
        let mut headers = headers.to_vec();
        let body = match body {
            Some(b) => {
                headers.push(("content-type", "application/json"));
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        self.send(method, path, token, &headers, body).await
    }

    /// `GET path` with `token`: the response as it comes, its body unread
    /// (an event stream stays open while it is read).
    pub async fn open(&self, path: &str, token: Option<&str>) -> axum::response::Response {
        let mut req = Request::builder()
            .method("GET")
            .uri(path)
            .header(header::HOST, "localhost");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        self.0
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    /// `body` as it is, with the `Content-Type` given (none when `None`).
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
        content_type: Option<&str>,
    ) -> Reply {
        let headers: Vec<_> = content_type
            .map(|ct| ("content-type", ct))
            .into_iter()
            .collect();
        self.send(method, path, token, &headers, Body::from(body.to_string()))
            .await
            .reply
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let response = self
            .0
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            content_type,
            retry_after,
            reply: Reply { status, json, text },
            headers,
        }
    }
}

impl SessionApi for Api {
    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> impl std::future::Future<Output = Reply> + Send {
        Api::call(self, method, path, token, body)
    }
}

/// A reply and its `Content-Type`.
pub struct Answer {
    pub content_type: String,
    /// Its `Retry-After`, if any.
    pub retry_after: Option<String>,
    pub reply: Reply,
    pub headers: axum::http::HeaderMap,
}

pub use bindery_tests::fixtures::executable;

/// The text of `examples/<example>/agent.yaml` with its model at
/// [`MODEL_URL`] (no API key) and its bash tools where they are.
pub fn example_agent_text(example: &str) -> String {
    bindery_tests::fixtures::example_agent_text(example, MODEL_URL)
}

/// Load options with the process-scope values `serve` would take from
/// its flags (`("--set", "NAME=VALUE")`, `("--pin", …)`) and from the
/// environment (`env`, `BINDERY_PARAM_*`).
pub fn process_values(flags: &[(&'static str, &str)], env: &[(&str, &str)]) -> LoadOptions {
    let mut process = ProcessValues::new();
    for (flag, arg) in flags {
        process.add_flag(flag, arg).unwrap();
    }
    process
        .add_env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .unwrap();
    LoadOptions {
        process,
        ..LoadOptions::default()
    }
}

/// An invoices agent like the example's, its model at [`MODEL_URL`],
/// with the parameters most tests serve
/// ([`bindery_tests::fixtures::INVOICES_PARAMETERS`]).
pub fn invoices_agent(dir: &Path) -> PathBuf {
    invoices_agent_file(dir, bindery_tests::fixtures::INVOICES_PARAMETERS)
}

/// The invoices agent with `parameters` (YAML list items, indented four
/// spaces), which must declare `tenant` and `billing_token`.
pub fn invoices_agent_file(dir: &Path, parameters: &str) -> PathBuf {
    bindery_tests::fixtures::invoices_agent_file(dir, MODEL_URL, parameters, "")
}

pub use bindery_tests::scripts::tool_then_answer;
