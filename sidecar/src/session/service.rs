//! The session service: creates sessions, validates parameters, starts and
//! cancels runs, forks, keeps secret values in memory only, and streams
//! events. The HTTP layer is a thin skin over it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::error::ServiceError;
use super::fanout::Fanout;
pub use super::fanout::LiveEvent;
use super::lease::{LeaseConfig, Liveness};
use super::lru;
use super::model::{EventRecord, SessionRecord, SessionStatus, StoredParams};
use super::pending::{self, PendingCall};
use super::runner::{self, RunContext, RunEnd, RunSink};
use super::store::{Notice, SessionStore, StoreError};
use super::validate::{validate, Caller, Op};
use crate::api::metrics::{Metrics, RunOutcome};
use crate::llm::{ChatClient, ChatMessage};
use crate::params::{ParamValue, Values};
use crate::tools::cache::ToolCache;
use crate::tools::helpers::HelperEnv;
use crate::tools::CallContext;

/// How a cancelled run's unanswered calls are answered (a fork's too).
const CANCELLED: &str = "error: the run was cancelled";

/// How long a cancel waits for the run to record its end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// How deep helpers may nest below the agent a session talks to.
pub const MAX_HELPER_DEPTH: usize = 5;
use crate::tree::{AgentTree, LoadedAgent};

mod continuation;
pub use continuation::Answer;

pub struct ServiceConfig {
    pub max_steps: u32,
    /// Ask the model for streamed replies and forward text as `delta` events.
    pub stream: bool,
    /// Cache successful tool results this long (`None`: no cache).
    pub tool_cache_ttl: Option<Duration>,
    /// How often this server beats, and how long a beat vouches for its runs.
    pub lease: LeaseConfig,
    /// Derives continuation tokens (see [`pending::token_for`]): replicas
    /// that share it show the same tokens. Never stored.
    pub continuation_key: [u8; 32],
    /// Forget a session's secret values once it has been idle this long
    /// (`None`: keep them until the server stops).
    pub live_session_ttl: Option<Duration>,
    /// At most this many live sessions: past it, the least recently used
    /// idle one forgets its secrets (see [`super::lru`]). `None`: no limit.
    pub max_live_sessions: Option<usize>,
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
        }
    }
}

/// A key of this process's own (one server, no replica to agree with).
pub fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    if getrandom::fill(&mut key).is_err() {
        // Without randomness the tokens would be guessable: refuse to run.
        panic!("no randomness for the continuation key");
    }
    key
}

/// How far a run goes (`run` on create, messages, resume, continuations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunMode {
    /// Until the model answers or a call waits.
    #[default]
    UntilBlocked,
    /// One model turn and its tool calls.
    Step,
}

/// What exists of a session in memory only.
struct Live {
    /// Serializes read-modify-write of the stored record.
    lock: tokio::sync::Mutex<()>,
    /// Session-scope secret values: never written anywhere.
    secrets: Mutex<Values>,
    /// When the secrets were last set or used, or a run ended.
    used: Mutex<std::time::Instant>,
    run: Mutex<Option<RunHandle>>,
    events: Fanout,
    /// On a shared store: bumped when another server appends an event to
    /// this session (see [`Service::relay_notices`]); subscribers then read
    /// the store.
    elsewhere: watch::Sender<()>,
}

impl Live {
    fn touch(&self) {
        *self.used.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
    }
}

#[derive(Clone)]
struct RunHandle {
    cancel: CancellationToken,
    done: watch::Receiver<bool>,
}

/// A session creation request.
#[derive(Debug, Default)]
pub struct CreateSession {
    pub agent: Option<String>,
    pub prompt: Option<String>,
    pub params: BTreeMap<String, serde_json::Value>,
    pub seal: bool,
    pub session_token: bool,
    pub fork: Option<String>,
    pub mode: RunMode,
    /// Who asks, as the session view's `owner` shows it (default `owner`).
    pub owner: Option<String>,
    /// With `fork`: copy only the turns before this index.
    pub at_turn: Option<usize>,
}

/// A session that was just created or forked.
pub struct Created {
    pub id: String,
    /// The session token, returned once.
    pub token: Option<String>,
    pub run: Option<RunWait>,
}

/// Waits for a run to end.
pub struct RunWait(watch::Receiver<bool>);

impl RunWait {
    /// `true` when the run ended within `timeout`.
    pub async fn wait(mut self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.0.wait_for(|done| *done))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Until the run ends, however long that takes.
    pub async fn finished(mut self) {
        let _ = self.0.wait_for(|done| *done).await;
    }
}

pub struct Service {
    tree: Arc<AgentTree>,
    clients: BTreeMap<String, ChatClient>,
    store: Arc<dyn SessionStore>,
    metrics: Arc<Metrics>,
    cache: Option<ToolCache>,
    /// Results of tools' dependency lookups (each with its own `ttl_ms`).
    lookups: crate::session::depends::LookupCache,
    cfg: ServiceConfig,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// This process, as runs record who runs them (random, per start).
    instance: String,
    /// Whether the last heartbeat reached the store (readiness follows it).
    store_ok: std::sync::atomic::AtomicBool,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// SHA-256 of a session token, as stored.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn new_token() -> Result<String, ServiceError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        tracing::error!("no randomness for a session token: {e}");
        ServiceError::new(500, "internal", "cannot mint a session token")
    })?;
    Ok(format!("st_{}", hex::encode(bytes)))
}

impl Service {
    pub fn new(
        tree: Arc<AgentTree>,
        clients: BTreeMap<String, ChatClient>,
        store: Arc<dyn SessionStore>,
        metrics: Arc<Metrics>,
        cfg: ServiceConfig,
    ) -> Arc<Service> {
        if let Some(limit) = cfg.max_live_sessions {
            metrics.set_sessions_live_limit(limit as u64);
        }
        Arc::new(Service {
            tree,
            clients,
            store,
            metrics,
            cache: cfg.tool_cache_ttl.map(|ttl| ToolCache::new(ttl, 10_000)),
            lookups: Default::default(),
            cfg,
            live: Mutex::new(HashMap::new()),
            instance: uuid::Uuid::new_v4().to_string(),
            store_ok: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Whether the store took this server's last heartbeat: a server that
    /// cannot reach its store is not ready (`/readyz`), so a load balancer
    /// sends sessions elsewhere until it can.
    pub fn store_ok(&self) -> bool {
        self.store_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn tree(&self) -> &AgentTree {
        &self.tree
    }

    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// This server's instance id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn live(&self, id: &str) -> Arc<Live> {
        let mut map = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(live) = map.get(id) {
            return live.clone();
        }
        let live = Arc::new(Live {
            lock: tokio::sync::Mutex::new(()),
            secrets: Mutex::new(Values::new()),
            used: Mutex::new(std::time::Instant::now()),
            run: Mutex::new(None),
            events: Fanout::default(),
            elsewhere: watch::Sender::new(()),
        });
        map.insert(id.to_string(), live.clone());
        self.metrics.set_sessions_live(map.len() as u64);
        live
    }

    /// Past `max_live_sessions`, drop the least recently used idle entries.
    /// Their secret values go with them, as on a restart. Called when a
    /// session takes secret values: a request that is refused or only
    /// reads never pushes a session out.
    fn evict_past_limit(&self) {
        let Some(limit) = self.cfg.max_live_sessions else {
            return;
        };
        // With the map locked, an entry only the map holds cannot be
        // taken meanwhile.
        let mut map = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let excess = map.len().saturating_sub(limit);
        if excess == 0 {
            return;
        }
        let entries = map.iter().map(|(id, l)| lru::Entry {
            key: id.clone(),
            used: *l.used.lock().unwrap_or_else(|p| p.into_inner()),
            // Held elsewhere: a request, a run or a stream is at work on it.
            busy: Arc::strong_count(l) > 1
                || l.run.lock().unwrap_or_else(|p| p.into_inner()).is_some()
                || !l.events.is_empty(),
        });
        for id in lru::victims(entries, excess) {
            map.remove(&id);
            self.metrics.session_evicted();
            tracing::info!(session = %id, limit, "past --max-live-sessions: the least recently used session's secret values were forgotten");
        }
        self.metrics.set_sessions_live(map.len() as u64);
    }

    /// How many sessions are live (in memory) now.
    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The live entry if there is one (reads never create one).
    fn peek(&self, id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Drop a session's live entry when it holds nothing worth keeping: no
    /// run, no secret, no event subscriber, and nobody else holds it.
    fn evict_if_idle(&self, id: &str) {
        let mut map = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let idle = map.get(id).is_some_and(|l| {
            Arc::strong_count(l) == 1
                && l.run.lock().unwrap_or_else(|p| p.into_inner()).is_none()
                && l.secrets
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
                && l.events.is_empty()
        });
        if idle {
            map.remove(id);
        }
        self.metrics.set_sessions_live(map.len() as u64);
    }

    fn agent(&self, name: &str) -> Result<&Arc<LoadedAgent>, ServiceError> {
        self.tree
            .agent(name)
            .ok_or_else(|| ServiceError::not_found(format!("no agent named `{name}`")))
    }

    pub async fn record(&self, id: &str) -> Result<SessionRecord, ServiceError> {
        self.store
            .get(id)
            .await?
            .ok_or_else(|| ServiceError::not_found(format!("no session {id}")))
    }

    /// The session-scope values a session holds now: stored ones and the
    /// secrets in memory.
    fn session_values(&self, rec: &SessionRecord) -> Values {
        let mut values: Values = rec
            .params
            .as_map()
            .iter()
            .map(|(k, v)| (k.clone(), ParamValue::Plain(v.clone())))
            .collect();
        if let Some(live) = self.peek(&rec.id) {
            live.touch();
            let secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            values.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        values
    }

    /// Names of the secret values a session holds (never the values).
    pub fn secret_names(&self, id: &str) -> Vec<String> {
        self.peek(id).map_or_else(Vec::new, |live| {
            let secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            secrets.keys().cloned().collect()
        })
    }

    fn keep_secrets(&self, id: &str, session: &Values) {
        let kept: Values = session
            .iter()
            .filter(|(_, v)| v.is_secret())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let live = match self.peek(id) {
            Some(live) => live,
            None if kept.is_empty() => return,
            None => self.live(id),
        };
        *live.secrets.lock().unwrap_or_else(|p| p.into_inner()) = kept;
        live.touch();
        self.evict_past_limit();
    }

    /// Forget the secret values of every session idle for longer than
    /// `live_session_ttl` (no run, nothing set or used since): a later
    /// message answers `params_required`, as after a restart. Returns how
    /// many sessions lost theirs.
    pub fn expire_secrets(&self) -> usize {
        let Some(ttl) = self.cfg.live_session_ttl else {
            return 0;
        };
        let entries: Vec<(String, Arc<Live>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut expired = 0;
        for (id, live) in entries {
            let idle = live.run.lock().unwrap_or_else(|p| p.into_inner()).is_none()
                && live
                    .used
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed()
                    >= ttl;
            let mut secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            if idle && !secrets.is_empty() {
                secrets.clear();
                expired += 1;
                tracing::info!(session = %id, "idle session: its secret values were forgotten");
            }
            drop(secrets);
            drop(live);
            self.evict_if_idle(&id);
        }
        expired
    }

    /// Give back what sessions that went held and left behind: the live
    /// map's room for them (a map never shrinks by itself) and the store's
    /// cache. Called after a sweep that forgot many.
    pub async fn release_memory(&self) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shrink_to_fit();
        self.store.release_memory().await;
    }

    /// Drop a session's secret values from memory (a one-shot run's, once
    /// it has ended); a later run needs them supplied again.
    pub fn forget_secrets(&self, id: &str) {
        if let Some(live) = self.peek(id) {
            live.secrets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        self.evict_if_idle(id);
    }

    pub fn is_running(&self, id: &str) -> bool {
        self.peek(id)
            .is_some_and(|l| l.run.lock().unwrap_or_else(|p| p.into_inner()).is_some())
    }

    pub async fn create(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateSession,
    ) -> Result<Created, ServiceError> {
        if *caller != Caller::Owner {
            return Err(ServiceError::forbidden(
                "only the owner can create or fork sessions",
            ));
        }
        let (agent_name, base, turns, op) = match &req.fork {
            Some(source_id) => {
                let source = self.record(source_id).await.map_err(|e| {
                    if e.status == 404 {
                        ServiceError::not_found(format!("no session {source_id} to fork"))
                    } else {
                        e
                    }
                })?;
                if let Some(a) = req.agent.as_ref().filter(|a| **a != source.agent) {
                    return Err(ServiceError::bad_request(format!(
                        "a fork keeps its source's agent (`{}`); drop `agent` or give `{}`, not `{a}`",
                        source.agent, source.agent
                    )));
                }
                let mut source = source;
                if let Some(n) = req.at_turn {
                    if n > source.turns.len() {
                        return Err(ServiceError::bad_request(format!(
                            "`at_turn` is {n}, but session {source_id} has {} turns",
                            source.turns.len()
                        )));
                    }
                    source.turns.truncate(n);
                }
                // Non-secret values only: secrets are never inherited.
                let base: Values = source
                    .params
                    .as_map()
                    .iter()
                    .map(|(k, v)| (k.clone(), ParamValue::Plain(v.clone())))
                    .collect();
                (
                    source.agent.clone(),
                    base,
                    // Pending calls are not copied: the fork's last turn is
                    // closed the way a cancel closes it.
                    close_pending(source.turns, CANCELLED),
                    if req.prompt.is_some() {
                        Op::Fork
                    } else {
                        Op::ForkIdle
                    },
                )
            }
            None if req.at_turn.is_some() => {
                return Err(ServiceError::bad_request(
                    "`at_turn` applies to a fork (POST /v1/sessions/:id/fork) only",
                ))
            }
            None => {
                let agent = req.agent.clone().ok_or_else(|| {
                    ServiceError::bad_request("`agent` is required (see GET /v1/agents)")
                })?;
                let op = if req.prompt.is_some() {
                    Op::Create
                } else {
                    Op::CreateIdle
                };
                (agent, Values::new(), Vec::new(), op)
            }
        };
        let agent = self.agent(&agent_name)?.clone();
        let accepted = validate(&agent.params, op, caller, false, &base, &req.params)?;
        let token = if req.session_token {
            Some(new_token()?)
        } else {
            None
        };
        let now = now_ms();
        let rec = SessionRecord {
            id: uuid::Uuid::new_v4().to_string(),
            agent: agent_name,
            status: SessionStatus::Idle,
            status_detail: None,
            created_at: now,
            updated_at: now,
            version: 1,
            turns,
            params: StoredParams::from_values(&accepted.session),
            security: super::model::Security {
                sealed: req.seal,
                token_digests: token.iter().map(|t| token_digest(t)).collect(),
                owner: Some(req.owner.unwrap_or_else(|| "owner".to_string())),
            },
            forked_from: req.fork.clone(),
            runner: None,
            cancel_requested: false,
            pending: Default::default(),
        };
        self.store.create(&rec).await?;
        self.keep_secrets(&rec.id, &accepted.session);
        tracing::info!(session = %rec.id, agent = %rec.agent, forked_from = ?rec.forked_from, "session created");
        let run = match req.prompt {
            Some(prompt) => Some(
                self.start_run(&rec.id, Some(prompt), accepted.message, req.mode)
                    .await?,
            ),
            None => None,
        };
        self.evict_if_idle(&rec.id);
        Ok(Created {
            id: rec.id,
            token,
            run,
        })
    }

    pub async fn post_message(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        prompt: String,
        params: &BTreeMap<String, serde_json::Value>,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        // A message that names an option of the one open selection answers it.
        if let Some(token) = self.chat_choice(id, &prompt).await? {
            let answer = Answer {
                session_id: Some(id.to_string()),
                choice: token.1,
                params: params.clone(),
                mode,
                ..Default::default()
            };
            let (_, run) = self.answer(caller, &token.0, answer).await?;
            if let Some(run) = run {
                return Ok(run);
            }
        }
        let r = self
            .run_request(caller, id, Op::Message, Some(prompt), params, mode)
            .await;
        self.evict_if_idle(id);
        r
    }

    pub async fn resume(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        params: &BTreeMap<String, serde_json::Value>,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        let r = self
            .run_request(caller, id, Op::Resume, None, params, mode)
            .await;
        self.evict_if_idle(id);
        r
    }

    /// A request that starts a run: its values are validated and stored,
    /// and the run reserved, in one critical section, so a request refused
    /// with `run_in_progress` changes nothing.
    async fn run_request(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        op: Op,
        prompt: Option<String>,
        params: &BTreeMap<String, serde_json::Value>,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        // No live entry for an id that names no session.
        self.record(id).await?;
        let live = self.live(id);
        let guard = live.lock.lock().await;
        let rec = self.record(id).await?;
        if rec.status == SessionStatus::WaitingExternal
            && (op == Op::Message || !rec.pending.all_resolved())
        {
            return Err(ServiceError::new(
                409,
                "waiting_external",
                format!(
                    "the session is {}; answer each call through its continuation (POST /v1/continuations/:token) or cancel the run",
                    rec.pending.detail()
                ),
            ));
        }
        let message = self.apply_params_locked(caller, id, op, params).await?;
        self.start_run_locked(guard, id, prompt, message, mode)
            .await
    }

    pub async fn put_params(
        &self,
        caller: &Caller,
        id: &str,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), ServiceError> {
        self.record(id).await?;
        let r = {
            let live = self.live(id);
            let _guard = live.lock.lock().await;
            self.apply_params_locked(caller, id, Op::PutParams, params)
                .await
        };
        self.evict_if_idle(id);
        r.map(drop)
    }

    /// Validate and store a request's values; returns its message-scope values.
    /// The caller holds the session's lock.
    async fn apply_params_locked(
        &self,
        caller: &Caller,
        id: &str,
        op: Op,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Values, ServiceError> {
        let mut rec = self.record(id).await?;
        if op != Op::PutParams && self.is_running(id) {
            return Err(ServiceError::new(
                409,
                "run_in_progress",
                "a run is in progress on this session; wait for it or cancel it",
            ));
        }
        if op != Op::PutParams && rec.status == SessionStatus::Running {
            rec = self.close_if_lost(rec).await?;
        }
        let agent = self.agent(&rec.agent)?.clone();
        let current = self.session_values(&rec);
        let accepted = validate(
            &agent.params,
            op,
            caller,
            rec.security.sealed,
            &current,
            params,
        )?;
        let session_changed = accepted.changed.iter().any(|n| {
            agent
                .params
                .decl(n)
                .is_some_and(|d| d.scope == crate::spec::Scope::Session)
        });
        if session_changed {
            rec.params = StoredParams::from_values(&accepted.session);
            rec.version += 1;
            rec.updated_at = now_ms();
            self.store.update(&rec).await?;
            self.keep_secrets(id, &accepted.session);
            self.emit(id, "params_changed", json!({"names": accepted.changed}))
                .await;
        }
        Ok(accepted.message)
    }

    pub async fn revoke_tokens(&self, id: &str) -> Result<(), ServiceError> {
        self.record(id).await?;
        let r = async {
            let live = self.live(id);
            let _guard = live.lock.lock().await;
            let mut rec = self.record(id).await?;
            rec.security.token_digests.clear();
            rec.version += 1;
            rec.updated_at = now_ms();
            self.store.update(&rec).await?;
            Ok(())
        }
        .await;
        self.evict_if_idle(id);
        r
    }

    /// Whether `token` is a live session token of session `id`.
    pub async fn token_matches(&self, id: &str, token: &str) -> bool {
        let digest = token_digest(token);
        match self.store.get(id).await {
            Ok(Some(rec)) => rec
                .security
                .token_digests
                .iter()
                .any(|d| constant_time_eq(d, &digest)),
            _ => false,
        }
    }

    pub async fn cancel(&self, id: &str) -> Result<(), ServiceError> {
        self.record(id).await?;
        let handle = self
            .peek(id)
            .and_then(|l| l.run.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let Some(handle) = handle else {
            if self.cancel_waiting(id).await? {
                return Ok(());
            }
            return self.request_cancel(id).await;
        };
        handle.cancel.cancel();
        // The run closes its last turn and records its end; wait for that.
        let _ = RunWait(handle.done).wait(CANCEL_WAIT).await;
        Ok(())
    }

    /// Cancel a run that another server runs: the request is recorded in
    /// the session, that server acts on it within a heartbeat (its sweep,
    /// or the run's next write), and the run's end is awaited here as a
    /// local cancel awaits it. A lost run is closed, as any request would.
    async fn request_cancel(&self, id: &str) -> Result<(), ServiceError> {
        let not_running =
            || ServiceError::new(409, "not_running", "no run is in progress on this session");
        let live = self.live(id);
        let requested = async {
            let _guard = live.lock.lock().await;
            for _ in 0..3 {
                match self.close_if_lost(self.record(id).await?).await {
                    // Not running (any more), or lost and closed just now.
                    Ok(_) => return Err(not_running()),
                    Err(e) if e.code == "run_in_progress" => {}
                    Err(e) => return Err(e),
                }
                let mut rec = self.record(id).await?;
                if rec.status != SessionStatus::Running {
                    return Err(not_running());
                }
                if rec.cancel_requested {
                    return Ok(rec.runner);
                }
                rec.cancel_requested = true;
                rec.version += 1;
                rec.updated_at = now_ms();
                match self.store.update(&rec).await {
                    Ok(()) => return Ok(rec.runner),
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(ServiceError::new(
                409,
                "conflict",
                format!("session {id} kept changing concurrently; try the cancel again"),
            ))
        }
        .await;
        drop(live);
        self.evict_if_idle(id);
        let runner = requested?;
        tracing::info!(session = id, runner = ?runner, "cancel requested of the server running the run");
        // Until that run has ended (or another has replaced it).
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(self.poll_interval()).await;
            let rec = self.record(id).await?;
            if rec.status != SessionStatus::Running || rec.runner != runner {
                break;
            }
        }
        Ok(())
    }

    /// How often a server reads the store for the end of a run it asked
    /// another server to cancel. A quarter second, or the heartbeat if that
    /// is shorter.
    fn poll_interval(&self) -> Duration {
        self.cfg.lease.heartbeat.min(Duration::from_millis(250))
    }

    /// Cancel this process's run of `id`, if it has one (a cancel requested
    /// through the store by another server).
    fn cancel_here(&self, id: &str) {
        let handle = self
            .peek(id)
            .and_then(|l| l.run.lock().unwrap_or_else(|p| p.into_inner()).clone());
        if let Some(handle) = handle {
            if !handle.cancel.is_cancelled() {
                tracing::info!(session = id, "cancelling the run as another server asked");
                handle.cancel.cancel();
            }
        }
    }

    async fn start_run(
        self: &Arc<Self>,
        id: &str,
        prompt: Option<String>,
        message: Values,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        let live = self.live(id);
        let guard = live.lock.lock().await;
        self.start_run_locked(guard, id, prompt, message, mode)
            .await
    }

    /// Start a run; `guard` is the session's lock, released once the run
    /// is recorded as started.
    async fn start_run_locked(
        self: &Arc<Self>,
        guard: tokio::sync::MutexGuard<'_, ()>,
        id: &str,
        prompt: Option<String>,
        message: Values,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        let live = self.live(id);
        let (cancel, done_tx, done_rx) = {
            let mut run = live.run.lock().unwrap_or_else(|p| p.into_inner());
            if run.is_some() {
                return Err(ServiceError::new(
                    409,
                    "run_in_progress",
                    "a run is in progress on this session; wait for it or cancel it",
                ));
            }
            let (tx, rx) = watch::channel(false);
            let cancel = CancellationToken::new();
            *run = Some(RunHandle {
                cancel: cancel.clone(),
                done: rx.clone(),
            });
            (cancel, tx, rx)
        };
        let started = async {
            let mut rec = self.record(id).await?;
            if rec.status == SessionStatus::Running {
                // Another server may have started one since the request's
                // values were checked.
                rec = self.close_if_lost(rec).await?;
            }
            // The answered calls a waiting run resumes with.
            let resolved = if rec.status == SessionStatus::WaitingExternal {
                if !rec.pending.all_resolved() {
                    return Err(ServiceError::new(
                        409,
                        "waiting_external",
                        format!("the session is {}", rec.pending.detail()),
                    ));
                }
                rec.pending.retire_tokens();
                std::mem::take(&mut rec.pending.items)
            } else {
                Vec::new()
            };
            if let Some(p) = &prompt {
                rec.turns.push(ChatMessage::user(p.clone()));
            }
            rec.status = SessionStatus::Running;
            rec.status_detail = None;
            rec.runner = Some(self.instance.clone());
            rec.cancel_requested = false;
            rec.version += 1;
            rec.updated_at = now_ms();
            self.store.update(&rec).await?;
            Ok::<_, ServiceError>((rec, resolved))
        }
        .await;
        let (rec, resolved) = match started {
            Ok(rec) => rec,
            Err(e) => {
                *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                return Err(e);
            }
        };
        drop(guard);
        let agent = self.agent(&rec.agent)?.clone();
        let session = self.session_values(&rec);
        let values = agent.params.snapshot(&session, &message);
        drop(message);
        self.metrics.run_started();
        self.emit(id, "run_started", json!({"prompt": prompt}))
            .await;
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let (end, taken) = this
                .drive(&agent, &id, rec.turns, values, &resolved, mode, &cancel)
                .await;
            let pending = match &end {
                RunEnd::Blocked(calls) => this.pending_items(&id, calls, agent.confirm_ttl()),
                _ => Vec::new(),
            };
            this.finish(&id, end, pending, taken).await;
            if let Some(live) = this.peek(&id) {
                *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                live.touch();
            }
            let _ = done_tx.send(true);
            this.evict_if_idle(&id);
        });
        Ok(RunWait(done_rx))
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive(
        &self,
        agent: &LoadedAgent,
        id: &str,
        mut history: Vec<ChatMessage>,
        values: Values,
        resolved: &[PendingCall],
        mode: RunMode,
        cancel: &CancellationToken,
    ) -> (RunEnd, bool) {
        let Some(client) = self.clients.get(&agent.name) else {
            let why = format!("no model client for agent `{}`", agent.name);
            return (RunEnd::Failed(why), false);
        };
        // The tools as of the run's start; an MCP server's change applies to the next run.
        let tools = agent.tools.snapshot();
        let ctx = RunContext {
            agent,
            tools: &tools,
            helpers: Some(HelperEnv {
                tree: &self.tree,
                clients: &self.clients,
                stack: vec![agent.name.clone()],
                inherited: Vec::new(),
                max_depth: MAX_HELPER_DEPTH,
            }),
            client,
            values: &values,
            call: CallContext {
                session_id: id.to_string(),
                conversation_id: id.to_string(),
                turn_id: String::new(),
                agent_id: agent.name.clone(),
                session_json: None,
            },
            cache: self.cache.as_ref(),
            lookups: Some(&self.lookups),
            metrics: &self.metrics,
            max_steps: match mode {
                RunMode::Step => 1,
                RunMode::UntilBlocked => agent.spec.max_steps.unwrap_or(self.cfg.max_steps),
            },
            stream: self.cfg.stream,
        };
        let sink = SessionSink {
            service: self,
            id,
            cancel,
            taken: AtomicBool::new(false),
        };
        let end = match runner::answer_resolved(&ctx, resolved, &mut history, &sink, cancel).await {
            Some(end) => end,
            None => runner::run(&ctx, &mut history, &sink, cancel).await,
        };
        let end = match (mode, end) {
            (RunMode::Step, RunEnd::MaxSteps(_)) => RunEnd::Stepped,
            (_, end) => end,
        };
        (end, sink.taken.load(Ordering::Relaxed))
    }

    /// Record how a run ended, unless it was taken away (`taken`, or found
    /// so now): then the server that closed it has said how it ended.
    async fn finish(&self, id: &str, end: RunEnd, pending: Vec<PendingCall>, taken: bool) {
        let waiting = pending::Pending {
            items: pending,
            used: Vec::new(),
        };
        let (status, detail, outcome) = match &end {
            RunEnd::Blocked(_) => (
                SessionStatus::WaitingExternal,
                Some(waiting.detail()),
                RunOutcome::Blocked,
            ),
            RunEnd::Stepped => (
                SessionStatus::Idle,
                Some("one step done (run: step); resume to go on".to_string()),
                RunOutcome::Completed,
            ),
            RunEnd::Completed => (SessionStatus::Idle, None, RunOutcome::Completed),
            RunEnd::Cancelled => (
                SessionStatus::Idle,
                Some("cancelled".to_string()),
                RunOutcome::Cancelled,
            ),
            RunEnd::MaxSteps(n) => (
                SessionStatus::Idle,
                Some(format!("stopped after {n} model turns without an answer")),
                RunOutcome::MaxSteps,
            ),
            RunEnd::Failed(why) => (SessionStatus::Failed, Some(why.clone()), RunOutcome::Failed),
        };
        let written = if taken {
            RunWrite::Taken
        } else {
            self.write_run(id, |rec| {
                rec.status = status;
                rec.status_detail = detail.clone();
                rec.runner = None;
                rec.cancel_requested = false;
                rec.pending.items = waiting.items.clone();
            })
            .await
        };
        match written {
            RunWrite::Written => {}
            RunWrite::Taken => {
                self.metrics.run_finished(RunOutcome::Failed);
                tracing::warn!(
                    session = id,
                    "run stopped: another server closed it as lost (this server's heartbeat had lapsed)"
                );
                return;
            }
            RunWrite::Failed(e) => {
                tracing::error!(session = id, "cannot record the end of a run: {e}");
            }
        }
        self.metrics.run_finished(outcome);
        tracing::info!(session = id, status = status.as_str(), detail = ?detail, "run finished");
        if !waiting.is_empty() {
            // Without tokens: events are stored, tokens never are.
            let items: Vec<_> = waiting.items.iter().map(PendingCall::shown).collect();
            self.emit(id, "pending", json!({"pending": items})).await;
        }
        self.emit(
            id,
            "run_finished",
            json!({"status": outcome.as_str(), "session_status": status.as_str(), "detail": detail}),
        )
        .await;
    }

    /// Read-modify-write of a session by the run this process has on it,
    /// under the session's lock. Nothing is written once the run is no
    /// longer ours (another server found it lost and closed it); a write
    /// that lost a race with a change elsewhere (parameters) is redone on
    /// the fresh record.
    async fn write_run(&self, id: &str, change: impl Fn(&mut SessionRecord)) -> RunWrite {
        let live = self.live(id);
        let _guard = live.lock.lock().await;
        for _ in 0..3 {
            let mut rec = match self.record(id).await {
                Ok(rec) => rec,
                Err(e) => return RunWrite::Failed(e.to_string()),
            };
            if rec.status != SessionStatus::Running
                || rec.runner.as_deref() != Some(self.instance.as_str())
            {
                return RunWrite::Taken;
            }
            if rec.cancel_requested {
                // Another server asked to cancel this run.
                self.cancel_here(id);
            }
            change(&mut rec);
            rec.version += 1;
            rec.updated_at = now_ms();
            match self.store.update(&rec).await {
                Ok(()) => return RunWrite::Written,
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return RunWrite::Failed(e.to_string()),
            }
        }
        RunWrite::Failed(format!(
            "session {id} kept changing concurrently; gave up after 3 attempts"
        ))
    }

    async fn append_turn(&self, id: &str, msg: &ChatMessage) -> RunWrite {
        let written = self.write_run(id, |rec| rec.turns.push(msg.clone())).await;
        if let RunWrite::Failed(e) = &written {
            tracing::error!(session = id, "cannot store a turn: {e}");
        }
        written
    }

    async fn emit(&self, id: &str, kind: &'static str, data: serde_json::Value) {
        let at = now_ms();
        match self.store.append_event(id, kind, &data, at).await {
            Ok(seq) => {
                let Some(live) = self.peek(id) else {
                    return; // nobody in memory, so nobody listening
                };
                live.events.send(LiveEvent::Stored(Arc::new(EventRecord {
                    seq,
                    kind: kind.to_string(),
                    data,
                    at,
                })));
            }
            Err(e) => tracing::error!(session = id, "cannot store an event: {e}"),
        }
    }

    /// Subscribe first, then read what is stored: nothing falls in between.
    /// The stored events after `after`, and the feed of those to come.
    pub async fn events(
        &self,
        id: &str,
        after: i64,
    ) -> Result<(Vec<EventRecord>, Feed), ServiceError> {
        self.record(id).await?;
        let live = self.live(id);
        let rx = live.events.subscribe();
        let elsewhere = self.store.shared().then(|| live.elsewhere.subscribe());
        drop(live);
        let stored = self.store.events_after(id, after).await?;
        let feed = Feed {
            id: id.to_string(),
            last: stored.last().map_or(after, |e| e.seq),
            rx,
            elsewhere,
        };
        Ok((stored, feed))
    }

    /// The next events of `feed`, in order: this server's live ones as they
    /// happen and, on a shared store while this server does not run the
    /// session, those another server stores, read when the store's notice
    /// of them arrives (an idle subscriber costs no query). `None` once the
    /// subscriber has fallen too far behind (it reconnects with
    /// `Last-Event-ID`).
    pub async fn next_events(&self, feed: &mut Feed) -> Option<Vec<LiveEvent>> {
        loop {
            let Feed {
                id,
                rx,
                last,
                elsewhere,
            } = &mut *feed;
            let tick = async {
                match elsewhere {
                    Some(w) => {
                        if w.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let gap = tokio::select! {
                got = rx.recv() => match got {
                    Some(LiveEvent::Delta(text)) => return Some(vec![LiveEvent::Delta(text)]),
                    Some(LiveEvent::Stored(e)) => match next_step(*last, e.seq) {
                        Step::Skip => continue,
                        Step::Send => {
                            *last = e.seq;
                            return Some(vec![LiveEvent::Stored(e)]);
                        }
                        Step::Fetch => Some(e),
                    },
                    // Dropped for falling behind (or the session left memory).
                    None => return None,
                },
                _ = tick => {
                    if self.is_running(id) {
                        continue; // the live feed has it all
                    }
                    None
                }
            };
            match self.store.events_after(id, *last).await {
                Ok(events) if !events.is_empty() => {
                    *last = events.last().map_or(*last, |e| e.seq);
                    let events = events.into_iter().map(|e| LiveEvent::Stored(Arc::new(e)));
                    return Some(events.collect());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = %id, "cannot read the session's new events: {e}");
                    if let Some(e) = gap {
                        *last = e.seq;
                        return Some(vec![LiveEvent::Stored(e)]);
                    }
                }
            }
        }
    }

    /// Pass the store's notices of other servers' appends to the sessions'
    /// subscribers here, until `stop`. One listening connection serves all
    /// of them; a store of our own has none, and this returns at once.
    pub async fn relay_notices(self: Arc<Self>, stop: CancellationToken) {
        let Some(mut notices) = self.store.notices() else {
            return;
        };
        loop {
            let notice = tokio::select! {
                _ = stop.cancelled() => return,
                n = notices.recv() => n,
            };
            match notice {
                Ok(Notice::Appended { session, .. }) => {
                    if let Some(live) = self.peek(&session) {
                        live.elsewhere.send_replace(());
                    }
                }
                Ok(Notice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let live: Vec<Arc<Live>> = self
                        .live
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .values()
                        .cloned()
                        .collect();
                    for l in live {
                        l.elsewhere.send_replace(());
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Record this server's heartbeat: it vouches for its runs for a lease.
    pub async fn beat(&self) -> Result<(), ServiceError> {
        Ok(self.store.beat(&self.instance, now_ms()).await?)
    }

    /// What this server knows of runs' liveness at `now`, given the
    /// servers' `heartbeats`.
    fn liveness<'a>(&'a self, heartbeats: &'a HashMap<String, i64>, now: i64) -> Liveness<'a> {
        Liveness {
            me: &self.instance,
            exclusive: !self.store.shared(),
            now,
            lease: self.cfg.lease.lease,
            heartbeats,
        }
    }

    /// Close every lost run (see [`Liveness`]); how many. At startup on a
    /// store of our own that is every run in progress: the last process's.
    pub async fn sweep(&self) -> Result<usize, ServiceError> {
        // Running sessions first, heartbeats second: a server beats before
        // it starts runs, so any runner in the list has its beat read here.
        let running = self.store.running().await?;
        let heartbeats = self.store.heartbeats().await?;
        let now = now_ms();
        let liveness = self.liveness(&heartbeats, now);
        let mut closed = 0;
        for rec in running {
            if rec.cancel_requested && rec.runner.as_deref() == Some(self.instance.as_str()) {
                self.cancel_here(&rec.id);
            }
            if liveness.is_lost(&rec, self.is_running(&rec.id))
                && self.close_interrupted(rec).await?
            {
                closed += 1;
            }
        }
        // A stale heartbeat says no more than a missing one.
        let lease = i64::try_from(self.cfg.lease.lease.as_millis()).unwrap_or(i64::MAX);
        self.store.prune_runners(now.saturating_sub(lease)).await?;
        Ok(closed)
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
            let beat = self.beat().await;
            let was_ok = self
                .store_ok
                .swap(beat.is_ok(), std::sync::atomic::Ordering::Relaxed);
            match beat {
                Err(e) => tracing::warn!(
                    lease = %humantime::format_duration(self.cfg.lease.lease),
                    "cannot record this server's heartbeat ({e}); not ready until it can, and once the lease passes, other servers take its runs for lost"
                ),
                Ok(()) if !was_ok => tracing::info!("the session store answers again; ready"),
                Ok(()) => {}
            }
            match self.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(n, "runs of a server that stopped were marked failed"),
                Err(e) => tracing::warn!("cannot look for lost runs: {e}"),
            }
            if let Err(e) = self.expire_due().await {
                tracing::warn!("cannot close expired pending calls: {e}");
            }
        }
        if let Err(e) = self.store.forget_runner(&self.instance).await {
            tracing::warn!("cannot remove this server's heartbeat: {e}");
        }
    }

    /// A session recorded as running that this process does not run: the
    /// run goes on elsewhere (409), or it is lost and closed here, and the
    /// fresh record returned. The caller holds the session's lock.
    async fn close_if_lost(&self, mut rec: SessionRecord) -> Result<SessionRecord, ServiceError> {
        for _ in 0..3 {
            if rec.status != SessionStatus::Running {
                return Ok(rec);
            }
            let heartbeats = self.store.heartbeats().await?;
            let liveness = self.liveness(&heartbeats, now_ms());
            if !liveness.is_lost(&rec, self.is_running(&rec.id)) {
                break;
            }
            // Closed here, or by another server first: read what it says now.
            let id = rec.id.clone();
            self.close_interrupted(rec).await?;
            rec = self.record(&id).await?;
        }
        Err(ServiceError::new(
            409,
            "run_in_progress",
            "a run is in progress on this session on another server; wait for it to end",
        ))
    }

    /// Close an interrupted run (`rec` as it was read): unanswered tool
    /// calls are answered, the session fails, `run_finished` is emitted.
    /// Nothing is retried blind. `false` when the session changed since it
    /// was read (another server closed it first, or the run moved on).
    async fn close_interrupted(&self, mut rec: SessionRecord) -> Result<bool, ServiceError> {
        let (detail, call) = if self.store.shared() {
            (
                "interrupted: the server running it stopped",
                "error: the server running this call stopped; it was not retried",
            )
        } else {
            (
                "interrupted by a restart of the server",
                "error: the server restarted during this call; it was not retried",
            )
        };
        let runner = rec.runner.take();
        rec.cancel_requested = false;
        rec.turns = close_pending(std::mem::take(&mut rec.turns), call);
        rec.status = SessionStatus::Failed;
        rec.status_detail = Some(detail.into());
        rec.version += 1;
        rec.updated_at = now_ms();
        match self.store.update(&rec).await {
            Ok(()) => {}
            Err(StoreError::Conflict(_)) => {
                tracing::debug!(session = %rec.id, "a lost run changed meanwhile: left to whoever changed it");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        self.emit(
            &rec.id,
            "run_finished",
            json!({"status": "failed", "session_status": "failed", "detail": detail}),
        )
        .await;
        tracing::warn!(session = %rec.id, runner = ?runner, "{detail}: run marked failed");
        Ok(true)
    }
}

/// A subscriber's place in a session's event stream (see
/// [`Service::next_events`]).
pub struct Feed {
    id: String,
    rx: super::fanout::Receiver,
    /// The `seq` of the last stored event given.
    last: i64,
    /// On a shared store: changes when another server stores an event of
    /// this session.
    elsewhere: Option<watch::Receiver<()>>,
}

/// What a feed that has given stored events up to `last` does with a live
/// one numbered `seq`.
#[derive(Debug, PartialEq)]
enum Step {
    /// Given already.
    Skip,
    /// The next one.
    Send,
    /// Some before it are not given yet (stored by another server, or
    /// broadcast out of order): read them from the store.
    Fetch,
}

fn next_step(last: i64, seq: i64) -> Step {
    if seq <= last {
        Step::Skip
    } else if seq == last + 1 {
        Step::Send
    } else {
        Step::Fetch
    }
}

/// What became of a run's write to its session.
enum RunWrite {
    Written,
    /// The run is no longer this process's: another server closed it.
    Taken,
    Failed(String),
}

/// Answer every tool call that has no result yet with `why`, so the history
/// stays well-formed for the model.
pub fn close_pending(mut turns: Vec<ChatMessage>, why: &str) -> Vec<ChatMessage> {
    let Some(pos) = turns.iter().rposition(
        |m| matches!(m, ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty()),
    ) else {
        return turns;
    };
    let ChatMessage::Assistant { tool_calls, .. } = &turns[pos] else {
        return turns;
    };
    let answered: Vec<String> = turns[pos + 1..]
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.clone()),
            _ => None,
        })
        .collect();
    let missing: Vec<String> = tool_calls
        .iter()
        .map(|c| c.id.clone())
        .filter(|id| !answered.contains(id))
        .collect();
    for id in missing {
        turns.push(ChatMessage::tool_result(id, why));
    }
    turns
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

struct SessionSink<'a> {
    service: &'a Service,
    id: &'a str,
    cancel: &'a CancellationToken,
    /// Another server closed the run as lost: it is stopped, and writes
    /// nothing more.
    taken: AtomicBool,
}

#[async_trait]
impl RunSink for SessionSink<'_> {
    async fn turn(&self, msg: &ChatMessage) {
        if self.taken.load(Ordering::Relaxed) {
            return;
        }
        if let RunWrite::Taken = self.service.append_turn(self.id, msg).await {
            tracing::warn!(
                session = self.id,
                "another server closed this run as lost (this server's heartbeat had lapsed): stopping it"
            );
            self.taken.store(true, Ordering::Relaxed);
            self.cancel.cancel();
        }
    }

    async fn event(&self, kind: &'static str, data: serde_json::Value) {
        if !self.taken.load(Ordering::Relaxed) {
            self.service.emit(self.id, kind, data).await;
        }
    }

    fn delta(&self, text: &str) {
        if let Some(live) = self.service.peek(self.id) {
            live.events.send(LiveEvent::Delta(text.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_sends_the_next_event_skips_old_ones_and_reads_a_gap() {
        assert_eq!(next_step(3, 4), Step::Send);
        assert_eq!(next_step(3, 3), Step::Skip);
        assert_eq!(next_step(3, 1), Step::Skip);
        assert_eq!(next_step(3, 6), Step::Fetch);
        assert_eq!(next_step(0, 1), Step::Send);
    }
}
