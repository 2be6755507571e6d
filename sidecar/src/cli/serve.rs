//! `run` and `serve`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::args::{AgentArgs, ModelArgs};
use super::load::{load_lenient, load_options};
use bindery_api::auth::OwnerToken;
use bindery_api::server::router;
use bindery_api::state::AppState;
use bindery_llm::Turn;
use bindery_metrics::Metrics;
use bindery_params::SecretString;
use bindery_session::budget::{Gate, Spent};
use bindery_session::clients::{build_clients, ClientOptions, ModelOverride};
use bindery_session::lease::LeaseConfig;
use bindery_session::run::{self, Host};
use bindery_session::service::{Service, ServiceConfig};
use bindery_spec::ModelSpec;
use bindery_store::wire::SessionEvent;
use bindery_store::{self as store, Location};

/// A whole model request's deadline: as given, else the default, or one
/// attempt's timeout when that is longer (a long `--llm-timeout` alone is
/// not cut by the default). One given shorter than the timeout cuts the
/// attempt: it is what was asked for.
fn deadline(given: Option<u64>, timeout: u64) -> Duration {
    match given {
        Some(secs) => Duration::from_secs(secs),
        None => bindery_llm::ReplyLimits::DEFAULT_DEADLINE.max(Duration::from_secs(timeout)),
    }
}

pub(super) fn client_options(m: &ModelArgs) -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(m.llm_timeout),
        max_retries: m.llm_retries,
        limits: bindery_llm::ReplyLimits {
            max_bytes: m.model_max_reply_bytes,
            max_tool_calls: m.model_max_tool_calls,
            deadline: deadline(m.llm_deadline, m.llm_timeout),
        },
        // The key only from the environment: an argv is visible to `ps`.
        model: m.model_url.as_ref().map(|url| ModelOverride {
            url: url.clone(),
            name: m.model_name.clone(),
            api_key: std::env::var("BINDERY_MODEL_API_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty())
                .map(SecretString::new),
        }),
    }
}

/// Prints streamed text to stderr as it comes; the answer goes to stdout.
pub(super) struct CliSink;

#[async_trait]
impl Host for CliSink {
    async fn turn(&self, _: &Turn, events: run::Events) {
        for event in events {
            if let SessionEvent::ToolCall(call) = event {
                tracing::info!(tool = %call.name, "tool call");
            }
        }
    }
    fn delta(&self, _: &str) {} // The command line counts no budget: every request and call goes.
    async fn before_model(&self, _: &ModelSpec, _: &(dyn Fn() -> u64 + Send + Sync)) -> Gate {
        Gate::Go(None)
    }
    async fn after_model(&self, _: Option<i64>, _: &ModelSpec, _: Option<Spent>) {}
    async fn before_tool(&self, _: &str) -> Gate {
        Gate::Go(None)
    }
    fn approve(&self, _: &str) {}
    // The command line acts for the person at the terminal, whose own
    // shell history is its record: it keeps no audit log.
    async fn before_call(&self, _: &str, _: &str, _: &[String]) -> Result<(), run::Unaudited> {
        Ok(())
    }
}

/// The client end users' tokens are exchanged as (`--identity-exchange-*`).
#[derive(Default)]
pub struct ExchangeArgs<'a> {
    pub client_id: Option<&'a str>,
    pub secret_file: Option<&'a Path>,
    pub token_url: Option<&'a str>,
}

pub struct ServeArgs<'a> {
    pub agents: &'a AgentArgs,
    pub model: &'a ModelArgs,
    pub listen: &'a str,
    /// `--store` / BINDERY_STORE as given (it may hold a password).
    pub store: Option<&'a str>,
    pub store_patience: Duration,
    pub store_pool_size: usize,
    pub advertise_url: Option<&'a str>,
    /// `--peer-tls-dir` and `--peer-tls-name`.
    pub peer_tls: Option<(&'a Path, &'a str)>,
    pub peer_listen: &'a str,
    pub owner_token_file: Option<&'a Path>,
    pub mcp_client_token_file: Option<&'a Path>,
    pub approver_token_file: Option<&'a Path>,
    /// `--identity-issuer` and the flags beside it, checked.
    pub identity: Option<bindery_identity::IdentityConfig>,
    /// `--identity-exchange-client-id` and the flags beside it.
    pub exchange: ExchangeArgs<'a>,
    /// `--max-runs-per-user` and the rate limits.
    pub limits: super::args::LimitsArgs,
    pub public_url: Option<&'a str>,
    pub approval_notice_attempts: u32,
    pub tool_cache_ttl: u64,
    /// `--max-tool-processes` and `--max-tool-processes-per-run`.
    pub tool_processes: bindery_tools::slots::ProcessSlots,
    pub stored_agents: bool,
    pub agents_source: super::args::AgentsSource,
    pub live_session_ttl: Option<Duration>,
    pub max_live_sessions: Option<usize>,
    pub events_keep_alive: Duration,
    /// What one client may hold of the server.
    pub conn_limits: super::http::ConnLimits,
    /// `--allowed-hosts` and `--allowed-origins`.
    pub allowed_hosts: &'a [String],
    pub allowed_origins: &'a [String],
    pub stream: bool,
    pub lease: LeaseConfig,
    /// `--drain-timeout`.
    pub drain_timeout: Duration,
}

/// Why the server did not start: its agents, flags and files, its store,
/// its ports. Each names the flag (or variable) to change; none holds a
/// token.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Load(#[from] super::load::LoadError),
    /// The model clients could not be made (named by agent and key
    /// source, never the key).
    #[error(transparent)]
    Clients(bindery_session::clients::ClientError),
    #[error(transparent)]
    Lease(#[from] bindery_session::lease::LeaseConfigError),
    /// `--identity-issuer` and the flags beside it.
    #[error("{0} (--identity-issuer, --identity-audience, --identity-jwks-url)")]
    Identity(#[from] bindery_identity::ConfigError),
    #[error("--identity-exchange-client-id needs its secret: --identity-exchange-secret-file, or BINDERY_IDENTITY_EXCHANGE_CLIENT_SECRET")]
    NoExchangeSecret,
    #[error(transparent)]
    Location(#[from] bindery_store::location::LocationError),
    #[error("--store {store}: {source}")]
    Store {
        store: String,
        source: bindery_store::StoreError,
    },
    /// `--peer-tls-dir`'s files (the message names the file).
    #[error(transparent)]
    PeerTls(bindery_api::peer_tls::PeerTlsError),
    #[error("cannot listen on {at}: {source}")]
    Listen { at: String, source: std::io::Error },
    #[error("cannot listen on --peer-listen {at}: {source}")]
    PeerListen { at: String, source: std::io::Error },
    #[error("{0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("--advertise-url (BINDERY_ADVERTISE_URL) `{url}`: with --peer-tls-dir, peers reach this server over TLS on --peer-listen: give https://HOST:PORT of that port, such as https://10.0.0.7:8443")]
    AdvertiseNeedsHttps { url: String },
    #[error("--advertise-url (BINDERY_ADVERTISE_URL) `{url}` is an https:// URL: peers forward over TLS only with --peer-tls-dir (and then to --peer-listen); give http://HOST:PORT, or add --peer-tls-dir")]
    AdvertiseNeedsPeerTls { url: String },
    #[error("--advertise-url (BINDERY_ADVERTISE_URL) `{url}` is not an http:// or https:// URL of a host and port, such as http://10.0.0.7:8080")]
    AdvertiseNotUrl { url: String },
    #[error("{flag} {file}: {source}")]
    TokenFile {
        flag: &'static str,
        file: String,
        source: std::io::Error,
    },
    #[error("{flag} {file} is empty")]
    EmptyTokenFile { flag: &'static str, file: String },
    #[error("--store {store} is a Postgres database, which servers may share: give them one owner token with --owner-token-file or BINDERY_OWNER_TOKEN")]
    SharedStoreNeedsToken { store: String },
    #[error("cannot create {dir}: {source}")]
    CreateDir { dir: String, source: std::io::Error },
    #[error(transparent)]
    NoRandomness(#[from] bindery_params::random::NoRandomness),
    #[error("cannot write {file}: {source}")]
    WriteToken {
        file: String,
        source: std::io::Error,
    },
    #[error("recording this server's heartbeat: {0}")]
    Heartbeat(bindery_session::error::ServiceError),
    #[error("recovering sessions: {0}")]
    Recover(bindery_session::error::ServiceError),
    /// The client forwarding to peers over TLS could not be made.
    #[error("the peer TLS client: {0}")]
    PeerClient(reqwest::Error),
}

pub async fn serve(a: ServeArgs<'_>) -> Result<ExitCode, ServeError> {
    let opts = load_options(a.agents)?;
    // The server's own credentials are live secrets while it serves: no
    // log line, span, tool result or `env-vars` answer carries one, and no
    // tool process is given one (its scripts run as the agents load).
    let mut env = Credentials::from_env();
    env.api_keys(&opts.api_keys);
    let _env = bindery_params::live::register_own(env.0);
    a.lease.check()?;
    let location = Location::parse(a.store)?;
    // Its tokens too, before the agents load: a toolbox's listing (a
    // script's `describe` that reads the token file) is scrubbed of them.
    let mut own = Credentials(Vec::new());
    own.store(&location);
    let owner = owner_token(a.owner_token_file, &location, &mut own)?;
    let mcp_client = optional_token(
        a.mcp_client_token_file,
        "--mcp-client-token-file",
        "BINDERY_MCP_CLIENT_TOKEN",
        &mut own,
    )?;
    let approver = optional_token(
        a.approver_token_file,
        "--approver-token-file",
        "BINDERY_APPROVER_TOKEN",
        &mut own,
    )?;
    let exchange_secret = match a.exchange.client_id {
        None => None,
        Some(_) => Some(
            optional_secret(
                a.exchange.secret_file,
                "--identity-exchange-secret-file",
                "BINDERY_IDENTITY_EXCHANGE_CLIENT_SECRET",
                &mut own,
            )?
            .ok_or(ServeError::NoExchangeSecret)?,
        ),
    };
    let _own = bindery_params::live::register_own(own.0);
    let (identity, exchanger) = match a.identity {
        Some(config) => {
            tracing::info!(issuer = %config.issuer, audiences = ?config.audiences, "end users' identity tokens are taken");
            let exchanger = match (a.exchange.client_id, exchange_secret) {
                (Some(client_id), Some(client_secret)) => {
                    let token_url = match a.exchange.token_url {
                        Some(u) => Some(reqwest::Url::parse(u).map_err(|_| {
                            bindery_identity::ConfigError::IssuerNotUrl(u.to_string())
                        })?),
                        None => None,
                    };
                    Some(Arc::new(bindery_identity::Exchanger::new(
                        config.clone(),
                        bindery_identity::ExchangeClient {
                            client_id: client_id.to_string(),
                            client_secret,
                            token_url,
                        },
                    )?))
                }
                _ => None,
            };
            (
                Some(Arc::new(bindery_identity::Verifier::new(config)?)),
                exchanger,
            )
        }
        None => (None, None),
    };
    if identity.is_none()
        && (a.limits.max_runs_per_user.is_some() || a.limits.per_user_requests_per_minute.is_some())
    {
        // Honoured (every end user is limited), but there is none: say so
        // rather than let the operator believe people are limited.
        tracing::warn!(
            "--max-runs-per-user and --per-user-requests-per-minute limit end users, and this \
             server takes no identity tokens (--identity-issuer), so they limit no one"
        );
    }
    let tree = Arc::new(load_lenient(a.agents).await?);
    // The process's own secret values, and those its toolboxes hold, stay
    // out of the logs for as long as it serves.
    let _live: Vec<_> = tree
        .agents
        .values()
        .filter_map(|agent| {
            let values = agent.process_values();
            let mut secrets: Vec<_> = values
                .iter()
                .filter_map(|(k, v)| match v {
                    bindery_params::ParamValue::Secret(s) => Some((k.clone(), s.clone())),
                    bindery_params::ParamValue::Plain(_) => None,
                })
                .collect();
            secrets.extend(agent.tools.snapshot().iter().flat_map(|t| t.secrets()));
            bindery_params::live::register(secrets)
        })
        .collect();
    let (clients, warnings) =
        build_clients(&tree, &client_options(a.model)).map_err(ServeError::Clients)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    let _keys = bindery_params::live::register_own(model_keys(&clients));
    let store = store::open(&location, a.store_patience, a.store_pool_size)
        .await
        .map_err(|source| ServeError::Store {
            store: location.shown(),
            source,
        })?;
    if let Location::Sqlite(path) = &location {
        // Every session of the server is in it: no `attach-file` reads it.
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            bindery_params::live::private_file(Path::new(&name));
        }
    }
    let peer_tls = match a.peer_tls {
        Some((dir, name)) => {
            let tls = bindery_api::peer_tls::load(dir, name).map_err(ServeError::PeerTls)?;
            // Its private key is a credential: no `attach-file` reads it.
            bindery_params::live::private_file(&dir.join("tls.key"));
            Some(tls)
        }
        None => None,
    };
    // Bound before the first heartbeat, which records where peers reach us;
    // nothing is accepted until the router serves.
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|source| ServeError::Listen {
            at: a.listen.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    // With peer TLS, peers reach us on a port of their own.
    let peer_listener =
        match &peer_tls {
            Some(_) => Some(tokio::net::TcpListener::bind(a.peer_listen).await.map_err(
                |source| ServeError::PeerListen {
                    at: a.peer_listen.to_string(),
                    source,
                },
            )?),
            None => None,
        };
    let advertise = match &peer_listener {
        Some(l) => advertise_url(
            a.advertise_url,
            l.local_addr().map_err(ServeError::LocalAddr)?,
            true,
        )?,
        None => advertise_url(a.advertise_url, addr, false)?,
    };
    let metrics = Arc::new(Metrics::default());
    let service = Service::new(
        tree.clone(),
        clients,
        store,
        metrics.clone(),
        ServiceConfig {
            max_steps: a.model.max_steps,
            exchanger,
            stream: a.stream,
            tool_cache_ttl: (a.tool_cache_ttl > 0).then(|| Duration::from_secs(a.tool_cache_ttl)),
            tool_processes: a
                .tool_processes
                .clone()
                .reported_to(metrics.tool_processes()),
            lease: a.lease,
            continuation_key: owner.continuation_key(),
            live_session_ttl: a.live_session_ttl,
            max_live_sessions: a.max_live_sessions,
            max_runs_per_user: a.limits.max_runs_per_user,
            tool_rates: a.limits.tool_rate_limits.clone(),
            public_url: a
                .public_url
                .map(str::to_string)
                .or_else(|| (!addr.ip().is_unspecified()).then(|| format!("http://{addr}"))),
            notice_retries: bindery_session::notify::Retries {
                attempts: a.approval_notice_attempts,
                ..Default::default()
            },
            advertise,
            agents_source: match a.agents_source {
                super::args::AgentsSource::Crd => bindery_session::state::agents::AgentSource::Crd,
                super::args::AgentsSource::File => {
                    bindery_session::state::agents::AgentSource::File
                }
            },
            clock: Arc::new(bindery_store::clock::WallClock),
        },
    );
    let webhooks = tree.agents.values().any(|a| {
        a.spec
            .approvals
            .as_ref()
            .is_some_and(|x| x.webhook.is_some())
    });
    if webhooks && a.public_url.is_none() && addr.ip().is_unspecified() {
        tracing::warn!("an agent has an approval webhook, but its notices' answer links are relative (/v1/approvals/…): give --public-url, the address receivers reach this server at");
    }
    match bindery_session::kube_events::KubeEvents::from_env() {
        Ok(Some(events)) => service.enable_kube_events(events),
        Ok(None) => {}
        Err(e) => tracing::warn!("no Kubernetes Events: {e}"),
    }
    tokio::spawn(service.budgets().clone().write_status());
    if a.stored_agents {
        service
            .agents()
            .enable_stored(bindery_session::state::agents::StoredAgents::new(
                opts.limits,
                client_options(a.model),
            ));
        if let Err(e) = service.agents().load_stored().await {
            tracing::warn!("stored agents not loaded: {}", e.message);
        }
    }
    // What the tools of a server that died left running ends before
    // their calls are closed as interrupted.
    let _ = tokio::task::spawn_blocking(bindery_reaper::end_what_dead_servers_left).await;
    // Beat before the first run can start, then close the runs no live
    // server vouches for (all of them on a store of our own: the last
    // process's); from then on, beat and sweep in the background.
    service
        .heartbeat()
        .beat()
        .await
        .map_err(ServeError::Heartbeat)?;
    tracing::info!(
        instance = service.instance(),
        "this server's instance id, as its runs record it"
    );
    let recovered = service
        .heartbeat()
        .sweep()
        .await
        .map_err(ServeError::Recover)?;
    if recovered > 0 {
        tracing::warn!(
            recovered,
            "runs whose server stopped (or the last process's) were marked failed"
        );
    }
    let stop_beating = CancellationToken::new();
    let beating = tokio::spawn(service.clone().keep_alive(stop_beating.clone()));
    tokio::spawn(
        service
            .recorder()
            .clone()
            .relay_notices(stop_beating.clone()),
    );
    tokio::spawn(
        service
            .recorder()
            .clone()
            .ping_streams(a.events_keep_alive, stop_beating.clone()),
    );
    tokio::spawn(
        service
            .clone()
            .forget_idle(stop_beating.clone(), super::memory::release_freed_memory),
    );
    let peer_auth = Arc::new(bindery_api::peers::PeerAuth::new(
        owner.peer_key(),
        service.instance(),
        peer_tls.is_some(),
    ));
    let state = Arc::new(AppState {
        service: service.clone(),
        owner,
        mcp_client,
        approver,
        metrics,
        ready: AtomicBool::new(false),
        peers: bindery_api::peers::client(),
        peers_tls: match &peer_tls {
            Some(t) => Some(
                bindery_api::peers::tls_client(t.client.clone()).map_err(ServeError::PeerClient)?,
            ),
            None => None,
        },
        peer_auth,
        origins: Arc::new(bindery_api::origin::OriginPolicy::new(
            addr,
            a.allowed_hosts,
            a.allowed_origins,
        )),
        identity,
        rates: bindery_api::rate_limit::RequestRates::new(
            a.limits.requests_per_minute,
            a.limits.per_user_requests_per_minute,
        ),
    });
    state
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(%addr, agents = ?tree.agents.keys().collect::<Vec<_>>(), "serving the session API");
    // One line on stdout for whoever started us (tests read the port here).
    println!("listening on http://{addr}");
    let app = router(state);
    let stop_peers = CancellationToken::new();
    let peers = match (peer_listener, peer_tls) {
        (Some(l), Some(tls)) => {
            let at = l.local_addr().map_err(ServeError::LocalAddr)?;
            tracing::info!(%at, "taking other replicas' forwards over mutual TLS");
            println!("listening for peers on https://{at}");
            let stop = stop_peers.clone();
            Some(tokio::spawn(super::http::serve_tls(
                l,
                tls.server,
                app.clone(),
                a.conn_limits,
                async move { stop.cancelled().await },
            )))
        }
        _ => None,
    };
    super::http::serve(listener, app, a.conn_limits, shutdown()).await;
    // The runs under way end here (a pod being replaced loses none of
    // its work), still vouched for by the heartbeat and reachable by
    // peers; past the drain timeout they are cut off as before.
    // No run starts from here on, whether or not one is under way.
    let runs = service.live_runs();
    if runs > 0 {
        tracing::info!(runs, timeout = ?a.drain_timeout, "letting the runs under way end");
    }
    let left = service.drain(a.drain_timeout).await;
    if left > 0 {
        tracing::warn!(
            left,
            "runs still under way at the drain timeout are cut off"
        );
    }
    // Nothing a tool started outlives the server's orderly end: the calls
    // still running are killed with all they started, and none starts.
    let _ = tokio::task::spawn_blocking(bindery_reaper::end_all).await;
    stop_peers.cancel();
    if let Some(p) = peers {
        let _ = p.await;
    }
    // Gone from the heartbeats: other servers take our runs at once.
    stop_beating.cancel();
    let _ = beating.await;
    Ok(ExitCode::SUCCESS)
}

/// Where peers reach this server: `--advertise-url` as given (an http(s)
/// URL without a path; `none`: nowhere), or the address listened on unless it is a
/// wildcard, which names no one host. With peer TLS (`tls`), `bound` is the
/// peer port and the URL is an https:// one.
fn advertise_url(
    given: Option<&str>,
    bound: std::net::SocketAddr,
    tls: bool,
) -> Result<Option<String>, ServeError> {
    let scheme = if tls { "https" } else { "http" };
    let Some(url) = given.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok((!bound.ip().is_unspecified()).then(|| format!("{scheme}://{bound}")));
    };
    if url == "none" {
        return Ok(None);
    }
    let url = url.trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(_) if tls && !url.starts_with("https://") => Err(ServeError::AdvertiseNeedsHttps {
            url: url.to_string(),
        }),
        Some(_) if !tls && url.starts_with("https://") => Err(ServeError::AdvertiseNeedsPeerTls {
            url: url.to_string(),
        }),
        Some(host) if !host.is_empty() && !host.contains('/') => Ok(Some(url.to_string())),
        _ => Err(ServeError::AdvertiseNotUrl {
            url: url.to_string(),
        }),
    }
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

/// A token the server takes only when one is given (the MCP client's, the
/// approver's): from the file `flag` names, or from the variable `env`
/// (how the operator gives it, from a Secret).
fn optional_token(
    file: Option<&Path>,
    flag: &'static str,
    env: &str,
    own: &mut Credentials,
) -> Result<Option<OwnerToken>, ServeError> {
    Ok(optional_secret(file, flag, env, own)?.map(|t| OwnerToken::new(t.expose())))
}

/// A secret given in the file of `flag`, or else in variable `env`
/// (none when neither is set); kept out of the logs from now on.
fn optional_secret(
    file: Option<&Path>,
    flag: &'static str,
    env: &str,
    own: &mut Credentials,
) -> Result<Option<SecretString>, ServeError> {
    let token = match file {
        Some(f) => {
            bindery_params::live::private_file(f);
            read_token_file(flag, f)?
        }
        None => match std::env::var(env) {
            Ok(t) if !t.trim().is_empty() => t,
            _ => return Ok(None),
        },
    };
    own.add(flag, &token);
    Ok(Some(SecretString::new(token)))
}

/// The token in file `f`, given with `flag`: one that cannot be read, or
/// is empty, is refused (naming the file, never what it holds).
fn read_token_file(flag: &'static str, f: &Path) -> Result<String, ServeError> {
    let file = || f.display().to_string();
    let t = std::fs::read_to_string(f).map_err(|source| ServeError::TokenFile {
        flag,
        file: file(),
        source,
    })?;
    if t.trim().is_empty() {
        return Err(ServeError::EmptyTokenFile { flag, file: file() });
    }
    Ok(t)
}

/// The owner token: from a file, from BINDERY_OWNER_TOKEN, or generated
/// into `owner-token` beside an SQLite store (mode 0600) for local use.
fn owner_token(
    file: Option<&Path>,
    store: &Location,
    own: &mut Credentials,
) -> Result<OwnerToken, ServeError> {
    let owner = |t: &str, own: &mut Credentials| {
        own.add("owner token", t);
        OwnerToken::new(t)
    };
    if let Some(f) = file {
        bindery_params::live::private_file(f);
        let t = read_token_file("--owner-token-file", f)?;
        return Ok(owner(&t, own));
    }
    if let Ok(t) = std::env::var("BINDERY_OWNER_TOKEN") {
        if !t.trim().is_empty() {
            return Ok(owner(&t, own));
        }
    }
    let store = match store {
        Location::Sqlite(path) => path,
        // Servers sharing a database serve the same sessions: one token
        // each, generated apart, would lock each other's callers out.
        Location::Postgres(_) => {
            return Err(ServeError::SharedStoreNeedsToken {
                store: store.shown(),
            })
        }
    };
    let path: PathBuf = store.parent().unwrap_or(Path::new(".")).join("owner-token");
    bindery_params::live::private_file(&path);
    if let Ok(t) = std::fs::read_to_string(&path) {
        if !t.trim().is_empty() {
            tracing::info!(file = %path.display(), "owner token read from file");
            return Ok(owner(&t, own));
        }
    }
    // A first run on a fresh clone has no data directory yet.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::CreateDir {
            dir: dir.display().to_string(),
            source,
        })?;
    }
    let token = bindery_params::random::hex::<32>("an owner token")?;
    write_private(&path, &token).map_err(|source| ServeError::WriteToken {
        file: path.display().to_string(),
        source,
    })?;
    bindery_params::live::private_file(&path);
    tracing::warn!(file = %path.display(), "no owner token given: one was generated into this file");
    Ok(owner(&token, own))
}

/// The keys the model clients send (an agent file's `apiKey`, read from
/// wherever it says): the server's own credentials too.
pub(super) fn model_keys(
    clients: &std::collections::BTreeMap<String, bindery_llm::ChatClient>,
) -> Vec<(String, SecretString)> {
    clients
        .iter()
        .flat_map(|(agent, c)| {
            c.api_keys().enumerate().filter_map(move |(i, key)| {
                let name = match i {
                    0 => format!("{agent} model key"),
                    n => format!("{agent} fallback {n} model key"),
                };
                Some((name, key?.clone()))
            })
        })
        .collect()
}

/// The server's own credentials, to register as live secrets.
pub(super) struct Credentials(pub(super) Vec<(String, SecretString)>);

impl Credentials {
    /// Every variable of [`bindery_spec::checks::SERVER_CREDENTIAL_ENV`]
    /// that is set.
    pub(super) fn from_env() -> Credentials {
        let mut own = Credentials(Vec::new());
        for name in bindery_spec::checks::SERVER_CREDENTIAL_ENV {
            if let Ok(v) = std::env::var(name) {
                own.add(name, &v);
            }
        }
        own
    }

    fn add(&mut self, name: &str, text: &str) {
        for v in [text, text.trim()] {
            if !v.is_empty() && !self.0.iter().any(|(_, s)| s.expose() == v) {
                self.0
                    .push((name.to_string(), SecretString::new(v.to_string())));
            }
        }
    }

    /// The model keys of the API-keys file.
    pub(super) fn api_keys(&mut self, keys: &bindery_params::ApiKeys) {
        for (id, key) in keys.iter() {
            self.add(id, key.expose());
        }
    }

    /// A PostgreSQL store's password, as its driver reads the URL (from
    /// the user info or a `password=` parameter), and the URL itself.
    fn store(&mut self, store: &Location) {
        if let Location::Postgres(url) = store {
            self.add("--store", url);
            if let Some(p) = url.parse::<tokio_postgres::Config>().ok().and_then(|c| {
                c.get_password()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            }) {
                self.add("--store password", &p);
            }
        }
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::{advertise_url, deadline};
    use std::time::Duration;

    /// Given, the deadline is what was asked for, even below the timeout;
    /// by default it is never shorter than one attempt's timeout.
    #[test]
    fn the_deadline_is_as_given_else_at_least_the_timeout() {
        assert_eq!(deadline(Some(8), 120), Duration::from_secs(8));
        assert_eq!(deadline(None, 120), Duration::from_secs(600));
        assert_eq!(deadline(None, 900), Duration::from_secs(900));
    }

    #[test]
    fn with_peer_tls_the_advertised_address_is_the_peer_port_over_https() {
        let bound = |s: &str| s.parse().unwrap();
        assert_eq!(
            advertise_url(None, bound("127.0.0.1:8443"), true).unwrap(),
            Some("https://127.0.0.1:8443".into())
        );
        assert_eq!(
            advertise_url(Some("https://10.0.0.7:8443"), bound("0.0.0.0:8443"), true).unwrap(),
            Some("https://10.0.0.7:8443".into())
        );
        let err =
            advertise_url(Some("http://10.0.0.7:8080"), bound("0.0.0.0:8443"), true).unwrap_err();
        assert!(
            matches!(err, super::ServeError::AdvertiseNeedsHttps { .. }),
            "{err}"
        );
        let err =
            advertise_url(Some("https://10.0.0.7:8443"), bound("0.0.0.0:8080"), false).unwrap_err();
        assert!(
            matches!(err, super::ServeError::AdvertiseNeedsPeerTls { .. }),
            "{err}"
        );
    }

    #[test]
    fn the_advertised_address_is_the_one_given_or_a_specific_one_listened_on() {
        let advertise_url = |given, bound| advertise_url(given, bound, false);
        let bound = |s: &str| s.parse().unwrap();
        assert_eq!(
            advertise_url(Some("http://10.0.0.7:8080/"), bound("0.0.0.0:8080")).unwrap(),
            Some("http://10.0.0.7:8080".into())
        );
        assert_eq!(
            advertise_url(None, bound("127.0.0.1:4100")).unwrap(),
            Some("http://127.0.0.1:4100".into())
        );
        assert_eq!(advertise_url(None, bound("0.0.0.0:8080")).unwrap(), None);
        assert_eq!(
            advertise_url(Some("none"), bound("127.0.0.1:4100")).unwrap(),
            None
        );
        assert_eq!(advertise_url(Some(" "), bound("[::]:8080")).unwrap(), None);
        for bad in ["10.0.0.7:8080", "http://", "http://h:1/v1", "ftp://h:1"] {
            let err = advertise_url(Some(bad), bound("0.0.0.0:8080")).unwrap_err();
            assert!(
                matches!(err, super::ServeError::AdvertiseNotUrl { .. }),
                "{err}"
            );
        }
    }
}
