//! A world for the service in process: agents loaded from real files, a
//! SQLite store in a temporary directory, a scripted model in place of the
//! endpoint (no HTTP), and tokio's clock as the service's, so that a test
//! that starts paused moves leases, heartbeats and TTLs by advancing time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::error::ServiceError;
use crate::service::{CreateSession, RunMode, RunWait, Service, ServiceConfig};
use crate::validate::Caller;
use bindery_llm::{
    ChatClient, ChatMessage, ChatRequest, ChatResponse, LlmError, LocalModel, ModelEndpoint,
    ToolCall,
};
use bindery_spec::budget::Meter;
use bindery_store::clock::TokioClock;
use bindery_store::model::{EventRecord, SessionRecord, SessionStatus};
use bindery_store::sqlite::SqliteStore;
use bindery_store::usage::{Claimed, Gauge, Group, ReportRow, Standing, Totals, Unwritten, Use};
use bindery_store::{Notice, Peer, SessionStore, StoreError};
use bindery_tree::{AgentSources, AgentTree, LoadOptions};

/// What the scripted model says next.
#[derive(Clone, Debug)]
pub enum Reply {
    Text(&'static str),
    /// Calls of `(tool, arguments)`, with ids `c1`, `c2`, … in the run.
    Calls(Vec<(&'static str, Value)>),
    /// Never answers: the request waits until the endpoint's timeout (or
    /// the run is cancelled).
    Hang,
    /// Panics, as a bug in the run's loop would.
    Panic,
}

/// A model that answers from a script, one reply a request, and keeps the
/// requests it was sent (what the model saw).
#[derive(Default)]
pub struct Scripted {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<ChatRequest>>,
    calls: Mutex<u32>,
}

impl Scripted {
    pub fn then(&self, reply: Reply) -> &Self {
        self.replies.lock().unwrap().push_back(reply);
        self
    }

    /// Every request the model was sent, oldest first.
    pub fn seen(&self) -> Vec<ChatRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl LocalModel for Scripted {
    fn complete<'a>(
        &'a self,
        req: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        self.seen.lock().unwrap().push(req.clone());
        let reply = self.replies.lock().unwrap().pop_front();
        Box::pin(async move {
            match reply {
                None => panic!("the model was asked more than the test scripted"),
                Some(Reply::Hang) => std::future::pending().await,
                Some(Reply::Panic) => panic!("a scripted panic (expected by this test)"),
                Some(Reply::Text(text)) => Ok(ChatResponse {
                    content: Some(text.into()),
                    tool_calls: Vec::new(),
                    finish_reason: Some("stop".into()),
                    usage: None,
                    ..Default::default()
                }),
                Some(Reply::Calls(calls)) => Ok(ChatResponse {
                    content: None,
                    tool_calls: calls
                        .into_iter()
                        .map(|(name, args)| {
                            let mut n = self.calls.lock().unwrap();
                            *n += 1;
                            ToolCall {
                                id: format!("c{n}"),
                                name: name.into(),
                                arguments: args.to_string(),
                            }
                        })
                        .collect(),
                    finish_reason: Some("tool_calls".into()),
                    usage: None,
                    ..Default::default()
                }),
            }
        })
    }
}

/// How long the scripted model's requests may take before they time out.
pub const MODEL_TIMEOUT: Duration = Duration::from_secs(3600);

/// An agent file's head: `name`, a model no one listens at (the client
/// answers in process), and a builtin `system` toolbox (`io_system`: the
/// date or the host name), which runs in process too. `spec` is added to
/// the agent's spec.
pub fn agent(name: &str, spec: &str) -> String {
    format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: {name}}}
spec:
  model: {{url: "http://model.invalid/v1", name: scripted}}
  systemPrompt: You help.
  toolboxes:
    - builtin: {{name: system, capabilities: [date, hostname]}}
{spec}"#
    )
}

/// The agents, loaded from real files, the store and the model that
/// servers of one world share.
pub struct World {
    /// Holds the agent files and the store.
    _dir: tempfile::TempDir,
    pub tree: Arc<AgentTree>,
    pub store: Arc<dyn SessionStore>,
    pub model: Arc<Scripted>,
}

impl World {
    /// A world of `agent_files` on a SQLite store of its own.
    pub async fn new(agent_files: &[String]) -> World {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.sqlite").to_string_lossy()).unwrap();
        Self::with_store(dir, agent_files, Arc::new(store)).await
    }

    /// Its store as replicas share one: runs are vouched for by their
    /// server's heartbeats, as on PostgreSQL.
    pub async fn shared(agent_files: &[String]) -> World {
        Self::watched(agent_files, true, Arc::new(Unwatched)).await
    }

    /// A world whose store tells `hook` of its session reads and writes,
    /// and says it is `shared` or not.
    pub async fn watched(agent_files: &[String], shared: bool, hook: Arc<dyn Hook>) -> World {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.sqlite").to_string_lossy()).unwrap();
        let store = Watched {
            store,
            shared,
            hook,
        };
        Self::with_store(dir, agent_files, Arc::new(store)).await
    }

    async fn with_store(
        dir: tempfile::TempDir,
        agent_files: &[String],
        store: Arc<dyn SessionStore>,
    ) -> World {
        let files: Vec<_> = agent_files
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let path = dir.path().join(format!("agent-{i}.yaml"));
                std::fs::write(&path, text).unwrap();
                path
            })
            .collect();
        let tree = bindery_tree::load(&AgentSources::Files(files), &LoadOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        World {
            _dir: dir,
            tree: Arc::new(tree),
            store,
            model: Arc::default(),
        }
    }

    /// A server of this world, on the tokio clock, that has beaten once.
    pub async fn server(&self, cfg: ServiceConfig) -> Arc<Service> {
        let clients: BTreeMap<String, ChatClient> = self
            .tree
            .agents
            .keys()
            .map(|name| {
                let mut endpoint = ModelEndpoint::new("http://model.invalid/v1", "scripted");
                endpoint.timeout = MODEL_TIMEOUT;
                // As the command line makes it: never below one attempt's.
                endpoint.limits.deadline = MODEL_TIMEOUT;
                let client = ChatClient::in_process(endpoint, self.model.clone()).unwrap();
                (name.clone(), client)
            })
            .collect();
        let service = Service::new(
            self.tree.clone(),
            clients,
            self.store.clone(),
            Arc::default(),
            ServiceConfig {
                clock: Arc::new(TokioClock::new()),
                ..cfg
            },
        );
        service.heartbeat().beat().await.unwrap();
        service
    }
}

/// Session helpers over a server.
pub struct Client<'a>(pub &'a Arc<Service>);

impl Client<'_> {
    /// Create a session of `agent` with `params` and no prompt.
    pub async fn open(&self, agent: &str, params: Value) -> String {
        let created = self
            .0
            .sessions()
            .create(
                &Caller::Owner,
                CreateSession {
                    agent: Some(agent.into()),
                    params: serde_json::from_value(params).unwrap(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("create: {}", e.message));
        created.id
    }

    /// Send `prompt` as the owner: the run it started, or why it was refused.
    pub async fn send(&self, id: &str, prompt: &str) -> Result<RunWait, ServiceError> {
        self.0
            .sessions()
            .post_message(
                &Caller::Owner,
                id,
                prompt.into(),
                &BTreeMap::new(),
                RunMode::UntilBlocked,
            )
            .await
    }

    /// Send `prompt` and wait for its run to end (or to wait on a call).
    pub async fn say(&self, id: &str, prompt: &str) -> SessionRecord {
        self.send(id, prompt)
            .await
            .unwrap_or_else(|e| panic!("message: {}", e.message))
            .finished()
            .await;
        self.0.record(id).await.unwrap()
    }

    /// Send `prompt`, which must be refused: why it was.
    pub async fn refused(&self, id: &str, prompt: &str) -> ServiceError {
        self.send(id, prompt)
            .await
            .err()
            .unwrap_or_else(|| panic!("the message `{prompt}` was taken"))
    }

    /// The kinds of the session's stored events, in order.
    pub async fn kinds(&self, id: &str) -> Vec<String> {
        self.events(id).await.into_iter().map(|e| e.kind).collect()
    }

    pub async fn events(&self, id: &str) -> Vec<EventRecord> {
        self.0.store().events_after(id, 0).await.unwrap()
    }
}

/// The session once no run goes on in it (a run a background job started,
/// as an expiry's resume).
pub async fn settled(server: &Arc<Service>, id: &str) -> SessionRecord {
    bindery_tests::eventually::until("the run ends", Duration::from_secs(600), || {
        !server.is_running(id)
    })
    .await;
    server.record(id).await.unwrap()
}

/// The last turn's text, if it is the assistant's.
pub fn answer(rec: &SessionRecord) -> Option<&str> {
    match rec.turns.last()?.message() {
        ChatMessage::Assistant { content, .. } => content.as_deref(),
        _ => None,
    }
}

/// The arguments' schema of tool `name` as the model was shown it.
pub fn shown(req: &ChatRequest, name: &str) -> Value {
    let tool = req
        .tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("the model was not shown {name}"));
    tool.parameters.clone()
}

/// Until the model has been asked `n` times (tokio's time moves on while
/// this waits, as the paused runtime advances it).
pub async fn asked(model: &Scripted, n: usize) {
    let what = format!("the model is asked {n} times");
    bindery_tests::eventually::until(&what, Duration::from_secs(600), || model.seen().len() >= n)
        .await;
}

pub fn no_params() -> Value {
    json!({})
}

/// What a test does when its store reads or writes a session: a step of
/// its own at an exact point between the service's steps (the store is
/// where the service waits).
#[async_trait]
pub trait Hook: Send + Sync {
    /// Session `id` was read.
    async fn read(&self, _id: &str) {}
    /// `rec` was written, with events (its turns, its start or its end).
    async fn written(&self, _rec: &SessionRecord) {}
    /// `entry` is to be appended to the audit log: an `Err` and it is not.
    fn audit(&self, _entry: &bindery_store::audit::Entry) -> Result<(), StoreError> {
        Ok(())
    }
}

struct Unwatched;

impl Hook for Unwatched {}

/// A step a test takes between two of the service's, once: when the store
/// first writes a session with status `at`, the step starts on a task of
/// its own with the server and the record as written, and that write
/// returns only once the step has read a session from the store. A step
/// that reads the session and then takes its lock (an answer, a token's
/// revocation) is thus queued for the lock behind the writer, which holds
/// it.
pub struct Between<T> {
    at: SessionStatus,
    step: Mutex<Option<Step<T>>>,
    server: OnceLock<Weak<Service>>,
    /// Told when the store reads a session.
    read: Notify,
    taken: Mutex<Option<JoinHandle<T>>>,
}

type Step<T> = Box<dyn FnOnce(Arc<Service>, SessionRecord) -> BoxFuture<'static, T> + Send>;

impl<T: Send + 'static> Between<T> {
    pub fn new(
        at: SessionStatus,
        step: impl FnOnce(Arc<Service>, SessionRecord) -> BoxFuture<'static, T> + Send + 'static,
    ) -> Arc<Self> {
        Arc::new(Between {
            at,
            step: Mutex::new(Some(Box::new(step))),
            server: OnceLock::new(),
            read: Notify::new(),
            taken: Mutex::new(None),
        })
    }

    /// The server the step is given (the world's server is made after its
    /// store, and so after this hook).
    pub fn on(&self, server: &Arc<Service>) {
        assert!(
            self.server.set(Arc::downgrade(server)).is_ok(),
            "one server"
        );
    }

    /// What the step came to; it must have been taken.
    pub async fn outcome(&self) -> T {
        let taken = self.taken.lock().unwrap().take();
        let step = taken.unwrap_or_else(|| panic!("no session was written {:?}", self.at));
        step.await.unwrap()
    }
}

#[async_trait]
impl<T: Send + 'static> Hook for Between<T> {
    async fn read(&self, _id: &str) {
        self.read.notify_waiters();
    }

    async fn written(&self, rec: &SessionRecord) {
        if rec.status != self.at {
            return;
        }
        let Some(step) = self.step.lock().unwrap().take() else {
            return;
        };
        let server = self
            .server
            .get()
            .and_then(Weak::upgrade)
            .expect("Between::on");
        // Created before the step runs: it hears the step's first read.
        let read = self.read.notified();
        *self.taken.lock().unwrap() = Some(tokio::spawn(step(server, rec.clone())));
        read.await;
    }
}

/// A SQLite store that tells a test's [`Hook`] of its reads and writes,
/// and that may say it is shared, so that two servers on it judge each
/// other's runs by heartbeats and leases as they would on PostgreSQL.
struct Watched {
    store: SqliteStore,
    shared: bool,
    hook: Arc<dyn Hook>,
}

#[async_trait]
impl SessionStore for Watched {
    fn shared(&self) -> bool {
        self.shared
    }
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        None
    }
    async fn create(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        self.store.create(rec).await
    }
    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let read = self.store.get(id).await;
        self.hook.read(id).await;
        read
    }
    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.store.list().await
    }
    async fn lineage(
        &self,
        id: &str,
        max: usize,
    ) -> Result<Vec<bindery_tools::lineage::Kin>, StoreError> {
        self.store.lineage(id, max).await
    }
    async fn running(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.store.running().await
    }
    async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.store.waiting().await
    }
    async fn update(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        self.store.update(rec).await
    }
    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &Value,
        at: i64,
    ) -> Result<i64, StoreError> {
        self.store.append_event(session, kind, data, at).await
    }
    async fn update_with_events(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, Value)],
        at: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let seqs = self.store.update_with_events(rec, events, at).await?;
        self.hook.written(rec).await;
        Ok(seqs)
    }
    async fn update_with_usage(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, Value)],
        at: i64,
        usage: &Unwritten,
    ) -> Result<Vec<i64>, StoreError> {
        let seqs = self.store.update_with_usage(rec, events, at, usage).await?;
        self.hook.written(rec).await;
        Ok(seqs)
    }
    async fn start_capped(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, Value)],
        at: i64,
        cap: &bindery_store::quota::RunCap,
    ) -> Result<bindery_store::quota::Started, StoreError> {
        let started = self.store.start_capped(rec, events, at, cap).await?;
        self.hook.written(rec).await;
        Ok(started)
    }
    async fn events_after(
        &self,
        session: &str,
        after: i64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.store.events_after(session, after).await
    }
    async fn last_event_seq(&self, session: &str) -> Result<i64, StoreError> {
        self.store.last_event_seq(session).await
    }
    async fn beat(&self, instance: &str, at: i64, address: Option<&str>) -> Result<(), StoreError> {
        self.store.beat(instance, at, address).await
    }
    async fn peer(&self, instance: &str) -> Result<Option<Peer>, StoreError> {
        self.store.peer(instance).await
    }
    async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.store.heartbeats().await
    }
    async fn forget_runner(&self, instance: &str) -> Result<(), StoreError> {
        self.store.forget_runner(instance).await
    }
    async fn prune_runners(&self, before: i64) -> Result<u64, StoreError> {
        self.store.prune_runners(before).await
    }
    async fn claim(
        &self,
        limits: &[(Gauge, f64)],
        earlier: &Unwritten,
        row: &Use,
    ) -> Result<Claimed, StoreError> {
        self.store.claim(limits, earlier, row).await
    }
    async fn record(&self, earlier: &Unwritten) -> Result<(), StoreError> {
        self.store.record(earlier).await
    }
    async fn measure(&self, gauges: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
        self.store.measure(gauges).await
    }
    async fn peak(
        &self,
        agent: &str,
        meter: Meter,
        by: bindery_store::usage::PeakBy,
        since: i64,
    ) -> Result<f64, StoreError> {
        self.store.peak(agent, meter, by, since).await
    }
    async fn report(&self, from: i64, to: i64, group: Group) -> Result<Vec<ReportRow>, StoreError> {
        self.store.report(from, to, group).await
    }
    async fn session_totals(&self, session: &str) -> Result<Totals, StoreError> {
        self.store.session_totals(session).await
    }
    async fn append_audit(
        &self,
        entry: &bindery_store::audit::Entry,
    ) -> Result<bindery_store::audit::Sealed, StoreError> {
        self.hook.audit(entry)?;
        self.store.append_audit(entry).await
    }
    async fn audit_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<bindery_store::audit::Sealed>, StoreError> {
        self.store.audit_after(after, limit).await
    }
    async fn audit_head(&self) -> Result<Option<bindery_store::audit::Head>, StoreError> {
        self.store.audit_head().await
    }
}
