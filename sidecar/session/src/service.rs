//! The session service: the API's way in. It builds the session's
//! collaborators (`crate::state`) and the run driver (`crate::run`), and
//! holds the flows that use several of them: `sessions` (create, message,
//! resume, parameters, fork), `cancel`, `tokens`, `feed` (events for
//! subscribers) and `continuation` (answers to pending calls). The HTTP
//! layer is a thin skin over it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::ServiceError;
pub use crate::fanout::LiveEvent;
use crate::lease::LeaseConfig;
use crate::run::heartbeat::Heartbeat;
use crate::run::{RunMode, Runs};
use crate::state::agents::Agents;
use crate::state::approvals::Approvals;
use crate::state::audit::AuditLog;
use crate::state::budgets::Budgets;
use crate::state::live_sessions::{LiveSessions, RunWait};
use crate::state::recorder::Recorder;
use crate::state::secrets::Secrets;
use bindery_bindings::cache::ToolCache;
use bindery_llm::ChatClient;
use bindery_metrics::Metrics;
use bindery_store::health::{Health, StoreState};
use bindery_store::model::SessionRecord;
use bindery_store::timed::Timed;
use bindery_store::SessionStore;
use bindery_tree::AgentTree;

/// How long a cancel waits for the run to record its end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// How often a stopping server looks whether its runs have ended.
const DRAIN_POLL: Duration = Duration::from_millis(100);

mod cancel;
mod continuation;
mod feed;
mod sessions;
mod shares;
#[cfg(test)]
mod tests;
mod tokens;

pub use crate::fanout::Opened;
pub use continuation::{end_user_answers, Answer};
pub use feed::{Feed, FeedItem};
pub use sessions::{may_use, Sessions};
pub use shares::{share_in, NewShare, Shared, Shares, MAX_LIVE_SHARES, MAX_NOTE_CHARS};
pub use tokens::{token_digest, token_in, Tokens};

pub struct ServiceConfig {
    pub max_steps: u32,
    /// Ask the model for streamed replies and forward text as `delta` events.
    pub stream: bool,
    /// Cache successful tool results this long (`None`: no cache).
    pub tool_cache_ttl: Option<Duration>,
    /// How often this server beats, and how long a beat vouches for its runs.
    pub lease: LeaseConfig,
    /// Derives continuation tokens (see [`pending::token_for`](bindery_store::pending::token_for)): replicas
    /// that share it show the same tokens. Never stored.
    pub continuation_key: [u8; 32],
    /// Forget a session's secret values once it has been idle this long
    /// (`None`: keep them until the server stops).
    pub live_session_ttl: Option<Duration>,
    /// At most this many live sessions: past it, the least recently used
    /// idle one forgets its secrets (the `session::lru` policy). `None`: no limit.
    pub max_live_sessions: Option<usize>,
    /// Where the other servers on a shared store reach this one
    /// (`--advertise-url`), recorded with its heartbeat. `None`: they
    /// cannot forward requests here.
    pub advertise: Option<String>,
    /// Where the agents loaded at start come from, as `GET /v1/agents`
    /// shows it: files, or `Agent` resources the operator wrote as files.
    pub agents_source: crate::state::agents::AgentSource,
    /// Where people reach this server (`--public-url`): the base of the
    /// answer URLs in approval notices.
    pub public_url: Option<String>,
    /// How approval notices are retried.
    pub notice_retries: crate::notify::Retries,
    /// What time it is (the wall clock; tokio's in tests that pause it).
    pub clock: Arc<dyn Clock>,
    /// How many tool processes run at once, on this server and in one run
    /// (`--max-tool-processes`, `--max-tool-processes-per-run`). Default:
    /// no bound.
    pub tool_processes: bindery_tools::slots::ProcessSlots,
    /// Exchanges end users' tokens for downstream audiences
    /// (`{identity: {token: …}}` bindings); none: such bindings go
    /// unbound.
    pub exchanger: Option<Arc<bindery_identity::Exchanger>>,
    /// At most this many runs in progress at once per end user
    /// (`--max-runs-per-user`), counted in the store. `None`: no bound.
    pub max_runs_per_user: Option<u32>,
    /// Limits on tools' calls per minute (`--tool-rate-limit`).
    pub tool_rates: Vec<crate::rate::ToolRate>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_steps: 20,
            stream: true,
            tool_cache_ttl: None,
            lease: LeaseConfig::default(),
            continuation_key: random_key(),
            live_session_ttl: None,
            max_live_sessions: None,
            advertise: None,
            agents_source: crate::state::agents::AgentSource::File,
            public_url: None,
            notice_retries: Default::default(),
            clock: Arc::new(WallClock),
            tool_processes: Default::default(),
            exchanger: None,
            max_runs_per_user: None,
            tool_rates: Vec::new(),
        }
    }
}

pub use bindery_store::clock::random_key;
use bindery_store::clock::{Clock, WallClock};

/// A session creation request.
#[derive(Debug, Default)]
pub struct CreateSession {
    pub agent: Option<String>,
    pub prompt: Option<String>,
    pub params: BTreeMap<String, serde_json::Value>,
    /// Values pinned for the session: `null` (in a fork) drops a pin the
    /// source had, and its value.
    pub pin: BTreeMap<String, serde_json::Value>,
    pub seal: bool,
    pub session_token: bool,
    pub fork: Option<String>,
    pub mode: RunMode,
    /// Who asks, as the session view's `owner` shows it (default `owner`).
    pub owner: Option<String>,
    /// With `fork`: copy only the turns before this index.
    pub at_turn: Option<usize>,
    /// A client's call of one of the agent's tools, run at once instead of
    /// a prompt (`RunMode::Call`; `prompt` is then ignored).
    pub call: Option<bindery_llm::ToolCall>,
}

/// A session that was just created or forked.
pub struct Created {
    pub id: String,
    /// The session token, returned once.
    pub token: Option<String>,
    pub run: Option<RunWait>,
}

/// The session service: its collaborators, each with fields of its own
/// (see ARCHITECTURE.md, "The session service"), and the flows that use
/// several of them.
pub struct Service {
    cfg: ServiceConfig,
    store: Arc<dyn SessionStore>,
    audit: Arc<AuditLog>,
    /// This process, as runs record who runs them (random, per start).
    instance: String,
    /// What exists of sessions in memory only.
    live: Arc<LiveSessions>,
    /// The agents it runs, and their model clients.
    agents: Arc<Agents>,
    /// Runs' writes, and the events subscribers hear of.
    recorder: Arc<Recorder>,
    /// Starts and drives runs, and records their ends.
    runs: Arc<Runs>,
    /// This server's heartbeat, and its judgement of runs by others'.
    heartbeat: Arc<Heartbeat>,
    /// Secret values in memory, and which server holds them.
    secrets: Arc<Secrets>,
    tokens: Tokens,
    /// Share links.
    shares: Shares,
    /// Pending calls' tokens, views and notices.
    approvals: Arc<Approvals>,
    /// The session API's flows.
    sessions: Arc<Sessions>,
    /// The agents' budgets.
    budgets: Arc<Budgets>,
    /// Warning Events on the tenant, where the operator allows them.
    kube_events: Arc<std::sync::OnceLock<crate::kube_events::KubeEvents>>,
    /// What the store's operations found of it.
    store_health: Arc<Health>,
}

impl Service {
    pub fn new(
        tree: Arc<AgentTree>,
        clients: BTreeMap<String, ChatClient>,
        store: Arc<dyn SessionStore>,
        metrics: Arc<Metrics>,
        cfg: ServiceConfig,
    ) -> Arc<Service> {
        // Every operation is timed for the metrics, and its outcome read
        // for readiness (see `store_state`).
        let store_health = Arc::new(Health::default());
        let store: Arc<dyn SessionStore> = {
            let (metrics, health) = (metrics.clone(), store_health.clone());
            Arc::new(Timed::new(
                store,
                Arc::new(move |op, took, error| {
                    metrics.store_operation(op, took);
                    health.saw(op, error);
                }),
            ))
        };
        let instance = uuid::Uuid::new_v4().to_string();
        let me: Arc<str> = Arc::from(instance.as_str());
        let clock = &cfg.clock;
        let live = Arc::new(LiveSessions::new(metrics.clone(), cfg.max_live_sessions));
        let kube_events = Arc::new(std::sync::OnceLock::new());
        let audit = Arc::new(AuditLog::new(store.clone(), clock.clone()));
        let agents = Arc::new(Agents::new(
            tree,
            clients,
            cfg.agents_source,
            store.clone(),
            clock.clone(),
            audit.clone(),
        ));
        let recorder = Arc::new(Recorder::new(
            store.clone(),
            live.clone(),
            metrics.clone(),
            me.clone(),
            clock.clone(),
        ));
        let heartbeat = Arc::new(Heartbeat::new(
            store.clone(),
            me.clone(),
            cfg.lease,
            cfg.advertise.clone(),
            clock.clone(),
            recorder.clone(),
        ));
        let secrets = Arc::new(Secrets::new(
            live.clone(),
            store.clone(),
            me.clone(),
            cfg.lease,
            cfg.live_session_ttl,
            clock.clone(),
        ));
        let budgets = Arc::new(Budgets::new(
            store.clone(),
            recorder.clone(),
            metrics.clone(),
            agents.clone(),
            clock.clone(),
            kube_events.clone(),
        ));
        let approvals = Arc::new(Approvals::new(
            cfg.continuation_key,
            store.clone(),
            live.clone(),
            agents.clone(),
            metrics.clone(),
            clock.clone(),
            cfg.public_url.clone(),
            cfg.notice_retries,
            kube_events.clone(),
        ));
        let runs = Arc::new(Runs {
            store: store.clone(),
            live: live.clone(),
            recorder: recorder.clone(),
            heartbeat: heartbeat.clone(),
            agents: agents.clone(),
            secrets: secrets.clone(),
            budgets: budgets.clone(),
            approvals: approvals.clone(),
            metrics: metrics.clone(),
            cache: cfg.tool_cache_ttl.map(|ttl| ToolCache::new(ttl, 10_000)),
            lookups: Default::default(),
            instance: me,
            clock: clock.clone(),
            max_steps: cfg.max_steps,
            stream: cfg.stream,
            tool_processes: cfg.tool_processes.clone(),
            heartbeat_every: cfg.lease.heartbeat,
            max_runs_per_user: cfg.max_runs_per_user,
            tool_rates: crate::rate::ToolRates::new(&cfg.tool_rates),
            stopping: Default::default(),
            exchanger: cfg.exchanger.clone(),
            audit: audit.clone(),
        });
        let tokens = Tokens::new(
            store.clone(),
            live.clone(),
            clock.clone(),
            audit.clone(),
            recorder.clone(),
        );
        let shares = Shares::new(
            store.clone(),
            live.clone(),
            clock.clone(),
            audit.clone(),
            cfg.public_url.clone(),
            recorder.clone(),
        );
        let sessions = Arc::new(Sessions {
            store: store.clone(),
            live: live.clone(),
            agents: agents.clone(),
            secrets: secrets.clone(),
            runs: runs.clone(),
            approvals: approvals.clone(),
            recorder: recorder.clone(),
            heartbeat: heartbeat.clone(),
            clock: clock.clone(),
            audit: audit.clone(),
        });
        Arc::new(Service {
            audit,
            sessions,
            cfg,
            store,
            instance,
            live,
            agents,
            recorder,
            runs,
            heartbeat,
            secrets,
            tokens,
            shares,
            approvals,
            budgets,
            kube_events,
            store_health,
        })
    }

    /// Record Warning Events on the pod's AgentTenant.
    pub fn enable_kube_events(&self, events: crate::kube_events::KubeEvents) {
        let _ = self.kube_events.set(events);
    }

    /// What exists of sessions in memory only (for the run's tests).
    #[cfg(test)]
    pub(crate) fn live(&self) -> &Arc<LiveSessions> {
        &self.live
    }

    /// The agents this server runs.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The store as this server finds it: a server that cannot reach its
    /// store (its last operation found it out, or it did not take the last
    /// heartbeat) or found it damaged is not ready (`/readyz`), so a load
    /// balancer sends sessions elsewhere until it can.
    pub fn store_state(&self) -> StoreState {
        match self.store_health.state() {
            StoreState::Answering if !self.heartbeat.ok() => StoreState::Unavailable,
            state => state,
        }
    }

    /// Runs' writes, and the feed of events subscribers read.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// The session API's flows: create, message, resume, parameters and
    /// answers to pending calls.
    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    /// The run driver: starts, drives and cancels runs.
    pub fn runs(&self) -> &Arc<Runs> {
        &self.runs
    }

    /// Pending calls' tokens, views and notices.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    /// The agents' budgets.
    pub fn budgets(&self) -> &Arc<Budgets> {
        &self.budgets
    }

    /// The tenant's audit log.
    pub fn audit(&self) -> &Arc<AuditLog> {
        &self.audit
    }

    /// The session tokens.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The share links.
    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// This server's heartbeat in the store.
    pub fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// Secret values in memory, and which server holds them.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    pub fn tree(&self) -> &AgentTree {
        self.agents.tree()
    }

    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// What time it is, by the service's clock.
    pub fn now_ms(&self) -> i64 {
        self.cfg.clock.now_ms()
    }

    /// This server's instance id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Give back what sessions that went held and left behind: the live
    /// map's room for them and the store's cache. Called after a sweep
    /// that forgot many.
    pub async fn release_memory(&self) {
        self.live.shrink();
        self.store.release_memory().await;
    }

    /// How many sessions are live (in memory) now.
    pub fn live_count(&self) -> usize {
        self.live.count()
    }

    /// Drop a session's live entry when it holds nothing worth keeping.
    pub(crate) fn evict_if_idle(&self, id: &str) {
        self.live.evict_if_idle(id)
    }

    /// Forget idle sessions' secret values once `--live-session-ttl`
    /// passes (a session outlives it by at most a quarter of it), until
    /// `stop`; `released` is told when fewer sessions are held than at
    /// the last sweep, once what they held is let go (the binary gives
    /// the freed memory back to the OS then). Nothing without a TTL.
    pub async fn forget_idle(self: Arc<Self>, stop: CancellationToken, released: impl Fn() + Send) {
        let Some(ttl) = self.cfg.live_session_ttl else {
            return;
        };
        let every = (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let mut tick = tokio::time::interval(every);
        let mut live = self.live_count();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.secrets.expire();
            let now = self.live_count();
            if now < live {
                self.release_memory().await;
                released();
            }
            live = now;
        }
    }

    /// How many runs this process has under way.
    pub fn live_runs(&self) -> usize {
        self.live.runs()
    }

    /// Stop starting runs, and wait until this process has none under
    /// way, at most `within`; how many are still under way then. A server that stops (a pod
    /// being replaced) lets its runs end before it stops their tools: it
    /// keeps beating meanwhile, so no other server takes them for lost.
    pub async fn drain(&self, within: Duration) -> usize {
        // A request a peer forwards (it holds a session's values) starts
        // nothing it would have to cut off.
        self.runs
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let runs = self.live.runs();
            if runs == 0 || tokio::time::Instant::now() >= deadline {
                return runs;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Beat and sweep every heartbeat interval until `stop`; then forget
    /// this server, so that others take its runs for lost at once.
    pub async fn keep_alive(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.lease.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick completes at once, and serve has just beaten.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.heartbeat.beat_and_tell().await;
            match self.heartbeat.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(n, "runs of a server that stopped were marked failed"),
                Err(e) => tracing::warn!("cannot look for lost runs: {e}"),
            }
            if let Err(e) = self.sessions.expire_due().await {
                tracing::warn!("cannot close expired pending calls: {e}");
            }
        }
        self.heartbeat.forget().await;
    }

    pub async fn record(&self, id: &str) -> Result<SessionRecord, ServiceError> {
        crate::state::stored_session(&*self.store, id).await
    }

    pub fn is_running(&self, id: &str) -> bool {
        self.live.is_running(id)
    }
}
