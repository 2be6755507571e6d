//! Driving a run: registering it, running the model loop with this session
//! as its sink, recording each turn and event and its end.

use super::run_budget;
use super::session_host::{RunAudit, RunRates, SessionHost};
use super::session_sink;
use super::session_sink::SessionSink;
use crate::error::Code;
use crate::error::ErrorKind;
use crate::error::ServiceError;
use crate::lineage::StoreLineage;
use crate::lookups::LookupCache;
use crate::run::heartbeat::Heartbeat;
use crate::run::Events;
use crate::run::Opening;
use crate::run::RunContext;
use crate::run::RunEnd;
use crate::run::RunMode;
use crate::state::agents::Agents;
use crate::state::approvals::Approvals;
use crate::state::budgets::Budgets;
use crate::state::live_sessions::Ended;
use crate::state::live_sessions::LiveSessions;
use crate::state::live_sessions::RunHandle;
use crate::state::live_sessions::RunWait;
use crate::state::live_sessions::Written;
use crate::state::recorder::stored_events;
use crate::state::recorder::Recorder;
use crate::state::secrets::Secrets;
use crate::state::stored_session;
use crate::subagents::HelperEnv;
use crate::subagents::MAX_HELPER_DEPTH;
use bindery_bindings::cache::ToolCache;
use bindery_llm::ChatMessage;
use bindery_llm::Turn;
use bindery_metrics::Metrics;
use bindery_metrics::ToolCaller;
use bindery_params::Values;
use bindery_store::audit::Actor;
use bindery_store::clock::random_key;
use bindery_store::clock::Clock;
use bindery_store::model::SessionRecord;
use bindery_store::model::SessionStatus;
use bindery_store::pending;
use bindery_store::pending::PendingCall;
use bindery_store::quota::{RunCap, Started};
use bindery_store::wire::RunStarted;
use bindery_store::wire::SessionEvent;
use bindery_store::wire::ToolCallEvent;
use bindery_store::SessionStore;
use bindery_tools::CallContext;
use bindery_tree::LoadedAgent;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The run driver: starts a session's run, drives the model loop with the
/// session as its sink, and records how the run ended.
pub struct Runs {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) live: Arc<LiveSessions>,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) heartbeat: Arc<Heartbeat>,
    pub(crate) agents: Arc<Agents>,
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) budgets: Arc<Budgets>,
    pub(crate) approvals: Arc<Approvals>,
    pub(crate) metrics: Arc<Metrics>,
    /// Successful tool results, when the server keeps them.
    pub(crate) cache: Option<ToolCache>,
    /// Results of tools' dependency lookups (each with its own `ttl_ms`).
    pub(crate) lookups: LookupCache,
    /// This server's instance id, as a run's record names its runner.
    pub(crate) instance: Arc<str>,
    pub(crate) clock: Arc<dyn Clock>,
    /// `--max-steps`, for an agent that sets none.
    pub(crate) max_steps: u32,
    /// Ask for streamed replies and forward text as `delta` events.
    pub(crate) stream: bool,
    /// The server's bound on tool processes at once; each run takes its own
    /// share of it.
    pub(crate) tool_processes: bindery_tools::slots::ProcessSlots,
    /// How often servers beat: a cancel asked of another server is
    /// looked for at least this often.
    pub(crate) heartbeat_every: Duration,
    /// At most this many runs of one end user at once (`None`: no bound).
    pub(crate) max_runs_per_user: Option<u32>,
    /// The calls per minute the tools may take (`--tool-rate-limit`).
    pub(crate) tool_rates: crate::rate::ToolRates,
    /// Set once the server stops ([`crate::service::Service::drain`]): the
    /// runs under way end, and none starts.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// Exchanges the end user's token for the audiences the agent binds.
    pub(crate) exchanger: Option<Arc<bindery_identity::Exchanger>>,
    /// Where each tool call is recorded before it is made.
    pub(crate) audit: Arc<crate::state::audit::AuditLog>,
}

impl Runs {
    /// The cap on runs at once that a start of session `rec` is under: its
    /// end user's, when the server sets one.
    fn cap_of(&self, rec: &SessionRecord) -> Option<RunCap> {
        let max = self.max_runs_per_user?;
        let subject = rec.security.subject.as_ref()?.as_str().to_string();
        Some(RunCap { subject, max })
    }

    /// Session `id` as stored.
    pub(crate) async fn record(&self, id: &str) -> Result<SessionRecord, ServiceError> {
        stored_session(&*self.store, id).await
    }

    pub(crate) async fn start_run(
        self: &Arc<Self>,
        by: Actor,
        id: &str,
        opening: Opening,
        message: Values,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        let live = self.live.entry(id);
        let guard = live.lock.lock().await;
        self.start_run_locked(by, guard, None, id, opening, message, mode)
            .await
    }

    /// Start a run; `guard` is the session's lock, released once the run
    /// is recorded as started; `rec`, the record as the caller read or
    /// wrote it under that lock, if it has it. `by` started it: the run's
    /// tool calls are made on its behalf.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start_run_locked(
        self: &Arc<Self>,
        by: Actor,
        mut guard: tokio::sync::MutexGuard<'_, Written>,
        rec: Option<SessionRecord>,
        id: &str,
        opening: Opening,
        message: Values,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ServiceError::new(
                ErrorKind::Unavailable,
                Code::ServerStopping,
                "this server is stopping and starts no new run: send the request again (another replica takes it, or this one once it is back)",
            ));
        }
        let live = self.live.entry(id);
        let (cancel, done_tx, done_rx) = {
            let mut run = live.run.lock().unwrap_or_else(|p| p.into_inner());
            if run.is_some() {
                return Err(ServiceError::new(
                    ErrorKind::Conflict,
                    Code::RunInProgress,
                    "a run is in progress on this session; wait for it or cancel it",
                ));
            }
            let (tx, rx) = watch::channel(None);
            let cancel = CancellationToken::new();
            *run = Some(RunHandle {
                cancel: cancel.clone(),
                done: rx.clone(),
            });
            (cancel, tx, rx)
        };
        let prepared = async {
            let mut rec = match rec {
                Some(rec) => rec,
                None => self.record(id).await?,
            };
            if rec.status == SessionStatus::Running {
                // Another server may have started one since the request's
                // values were checked.
                rec = self.heartbeat.close_if_lost(rec).await?;
            }
            // A client's calls that waited end their run once answered.
            let mode = if std::mem::take(&mut rec.pending.client_call) {
                RunMode::Call
            } else {
                mode
            };
            // A waiting run goes on as itself; any other start is a new run.
            let run = match rec.pending.run.take() {
                Some(run) if rec.status == SessionStatus::WaitingExternal => run,
                _ => pending::WaitingRun {
                    id: hex::encode(&random_key()[..12]),
                    budgets_approved: Vec::new(),
                },
            };
            // The answered calls a waiting run resumes with.
            let resolved = if rec.status == SessionStatus::WaitingExternal {
                if !rec.pending.all_resolved() {
                    return Err(ServiceError::new(
                        ErrorKind::Conflict,
                        Code::WaitingExternal,
                        format!("the session is {}", rec.pending.detail()),
                    ));
                }
                rec.pending.retire_tokens();
                std::mem::take(&mut rec.pending.items)
            } else {
                Vec::new()
            };
            let agent = self.agents.agent(&rec.agent)?.clone();
            self.budgets.refuse_if_spent(&agent, &rec, &run).await?;
            let mut events = Events::new();
            match &opening {
                Opening::Resume => events.push(SessionEvent::RunStarted(RunStarted {
                    prompt: None,
                    caller: None,
                })),
                Opening::Prompt(p) => {
                    rec.turns.push(Turn::new(ChatMessage::user(p.clone())));
                    events.push(SessionEvent::RunStarted(RunStarted {
                        prompt: Some(p.clone()),
                        caller: None,
                    }));
                }
                Opening::Call(call) => {
                    // Stored with the run's start: the call is on record
                    // before it may act, as a model's call is.
                    rec.turns.push(Turn::new(ChatMessage::Assistant {
                        content: None,
                        tool_calls: vec![call.clone()],
                        reasoning: None,
                    }));
                    let caller = Some(ToolCaller::Mcp);
                    events.push(SessionEvent::RunStarted(RunStarted {
                        prompt: None,
                        caller,
                    }));
                    events.push(SessionEvent::ToolCall(ToolCallEvent {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        caller,
                    }));
                }
            }
            rec.status = SessionStatus::Running;
            rec.status_detail = None;
            rec.runner = Some(self.instance.to_string());
            rec.cancel_requested = false;
            rec.version += 1;
            rec.updated_at = self.clock.now_ms();
            Ok::<_, ServiceError>((rec, resolved, agent, mode, events, run))
        }
        .await;
        let (mut rec, resolved, agent, mode, event, run) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                return Err(e);
            }
        };
        let at = rec.updated_at;
        let event = self.recorder.encoded_for(&rec, &event);
        // A start an end user's cap decides is stored before the run may
        // send anything: one past the cap must not reach the model. (An
        // uncapped start is stored while its first request goes out.)
        let capped = match self.cap_of(&rec) {
            Some(cap) => {
                let refused = match self.store.start_capped(&mut rec, &event, at, &cap).await {
                    Ok(Started::Stored(seqs)) => Ok(seqs),
                    Ok(Started::Full { running }) => Err(too_many_runs(running, cap.max)),
                    Err(e) => Err(ServiceError::from(e)),
                };
                match refused {
                    Ok(seqs) => Some(seqs),
                    Err(e) => {
                        *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        let session = self.secrets.session_values(&rec);
        let mut values = agent.params.snapshot(&session, &message);
        let mut origins = credential_origins(&agent, &session, &message);
        let mut tokens_until = None;
        let person = live
            .person
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(person) = person.filter(|p| rec.security.subject.as_ref() == Some(&p.subject)) {
            let identity = crate::identity::values(
                &agent.identity_values,
                &person,
                self.exchanger.as_deref(),
                id,
            )
            .await;
            for (key, value) in identity {
                if let Some(audience) = value
                    .is_secret()
                    .then(|| key.strip_prefix("@identity:token:"))
                    .flatten()
                {
                    // The person's rights handed to a run: on record first,
                    // or not handed at all.
                    let by = Actor::EndUser {
                        subject: person.subject.to_string(),
                    };
                    let action = bindery_store::audit::Action::TokenExchanged {
                        audience: audience.to_string(),
                    };
                    if let Err(e) = self.audit.record(by, Some(id), action).await {
                        tracing::error!(
                            session = id,
                            "the end user's token was not handed to the run: {}",
                            e.message
                        );
                        continue;
                    }
                    origins.insert(key.clone(), format!("end user {}", person.subject));
                    // Good as long as the person's own token is.
                    let until = i64::try_from(person.expires_at)
                        .unwrap_or(i64::MAX / 1000)
                        .saturating_mul(1000);
                    tokens_until = Some(until);
                }
                values.insert(key, value);
            }
        }
        drop(message);
        // The run asks the model while its start is stored; its sink holds
        // back everything else until the start is on record.
        let (starter, gate) = session_sink::start_gate();
        let this = self.clone();
        let run_id = id.to_string();
        let turns = rec.turns.clone();
        let taint_from = rec.security.taint_cleared_at.unwrap_or(0);
        let subject = rec
            .security
            .subject
            .as_ref()
            .map(|s| s.as_str().to_string());
        let stop = cancel.clone();
        let (running, run_started) = tokio::sync::oneshot::channel::<()>();
        let this_run = done_rx.clone();
        tokio::spawn(async move {
            let _ = running.send(());
            let id = run_id;
            let drive = this.drive(
                &agent,
                &id,
                Driving {
                    history: turns,
                    taint_from,
                    run,
                    by,
                    origins,
                    subject,
                    tokens_until,
                },
                values,
                &resolved,
                mode,
                &cancel,
                gate,
            );
            let Some(driven) = drive.await else {
                // Its start was not stored: as far as anyone knows, this
                // run never was.
                return;
            };
            let pending = match &driven.end {
                RunEnd::Blocked(calls) => this.pending_items(&id, calls, agent.confirm_ttl()),
                _ => Vec::new(),
            };
            let record = this.finish(&id, driven, pending, mode).await;
            if let Some(live) = this.live.peek(&id) {
                let mut written = live.lock.lock().await;
                let mut handle = live.run.lock().unwrap_or_else(|p| p.into_inner());
                // A stored end let the session go (and another run may
                // hold it now). A run that was taken away, or could not
                // store its end, lets it go here, with the last write it
                // may have left.
                if handle
                    .as_ref()
                    .is_some_and(|h| h.done.same_channel(&this_run))
                {
                    *handle = None;
                    written.take();
                }
                drop(handle);
                drop(written);
                live.touch();
            }
            let _ = done_tx.send(Some(Ended {
                record: record.map(Arc::from),
            }));
            this.live.evict_if_idle(&id);
        });
        // Stored with the record that says it runs: one transaction. The
        // run goes first, to send its model request: a store may write on
        // this thread (SQLite does), and the run, just spawned, would
        // otherwise wait for the write. Once it says it started, it runs on
        // to its first wait (usually for the model's answer) before this
        // write does, or beside it on another worker.
        let _ = run_started.await;
        let stored = match capped {
            Some(seqs) => Ok(seqs),
            None => self
                .store
                .update_with_events(&mut rec, &event, at)
                .await
                .map_err(ServiceError::from),
        };
        match stored {
            Ok(seqs) => {
                *guard = Some(Box::new(rec));
                drop(guard);
                self.metrics.run_started();
                self.recorder.publish(id, stored_events(seqs, &event, at));
                starter.stored(&self.recorder, id);
                Ok(RunWait(done_rx))
            }
            Err(e) => {
                // The run stops before it stores or runs anything.
                stop.cancel();
                drop(starter);
                *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Err(e)
            }
        }
    }

    /// The run's loop, once `gate` says its start is stored (`None` if it
    /// was not: the run then stops and leaves nothing).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn drive(
        self: &Arc<Self>,
        agent: &LoadedAgent,
        id: &str,
        driving: Driving,
        values: Values,
        resolved: &[PendingCall],
        mode: RunMode,
        cancel: &CancellationToken,
        gate: session_sink::StartGate,
    ) -> Option<Driven> {
        let Driving {
            mut history,
            taint_from,
            run,
            by,
            origins,
            subject,
            tokens_until,
        } = driving;
        let sink = SessionSink::new(&self.recorder, id, cancel, gate);
        let client = self.agents.client_for(&agent.name);
        let Some(client) = client.as_ref() else {
            let why = format!("no model client for agent `{}`", agent.name);
            return sink.close().await.map(|(answer, taken)| Driven {
                end: RunEnd::Failed(why),
                answer,
                taken,
                run,
                usage: Default::default(),
                leftover: Default::default(),
            });
        };
        let host = SessionHost {
            sink,
            budget: run_budget::RunBudget::new(&self.budgets, agent, id, subject.as_deref(), &run),
            audit: RunAudit {
                log: &self.audit,
                session: id,
                by: Actor::Run {
                    run: run.id.clone(),
                    on_behalf_of: Box::new(by),
                },
                origins,
            },
            rates: RunRates {
                rates: &self.tool_rates,
                subject: subject.as_deref(),
                clock: &*self.clock,
                metrics: &self.metrics,
            },
        };
        // The tools as of the run's start; an MCP server's change applies to the next run.
        let tools = agent.tools.snapshot();
        let ctx = RunContext {
            agent,
            tools: &tools,
            helpers: Some(HelperEnv {
                tree: self.agents.tree(),
                clients: self.agents.clients(),
                stack: vec![agent.name.clone()],
                inherited: Vec::new(),
                max_depth: MAX_HELPER_DEPTH,
            }),
            client,
            values: &values,
            call: CallContext {
                lineage: Some(Arc::new(StoreLineage::new(self.store.clone(), id))),
                processes: self.tool_processes.for_run(),
                ..CallContext::of_session(id, &agent.name)
            },
            cache: self.cache.as_ref(),
            lookups: Some(&self.lookups),
            metrics: &self.metrics,
            max_steps: match mode {
                RunMode::Step | RunMode::Call => 1,
                RunMode::UntilBlocked => agent.spec.max_steps.unwrap_or(self.max_steps),
            },
            stream: self.stream,
            origin: match mode {
                RunMode::Call => ToolCaller::Mcp,
                _ => ToolCaller::Model,
            },
            taint_from,
            caller_taint: &[],
            clock: &*self.clock,
            subject: subject.as_deref(),
            tokens_until,
        };
        let end =
            match crate::run::answer_resolved(&ctx, resolved, &mut history, &host, cancel).await {
                Some(end) => end,
                // A client's calls, answered now: nothing more to do.
                None if mode == RunMode::Call && !resolved.is_empty() => RunEnd::Completed,
                None if mode == RunMode::Call => {
                    crate::run::run_calls(&ctx, &mut history, &host, cancel).await
                }
                None => crate::run::run(&ctx, &mut history, &host, cancel).await,
            };
        let end = match (mode, end) {
            (RunMode::Step, RunEnd::MaxSteps(_)) => RunEnd::Stepped,
            (_, end) => end,
        };
        let leftover = host.budget.leftover();
        let Some((answer, taken)) = host.sink.close().await else {
            self.budgets.record_leftover(id, &leftover).await;
            return None;
        };
        let run = pending::WaitingRun {
            budgets_approved: host.budget.approved(),
            ..run
        };
        Some(Driven {
            end,
            answer,
            taken,
            run,
            usage: host.budget.spent(),
            leftover,
        })
    }
}

/// How long a user refused for having too many runs is told to wait: runs
/// end on their own time, so this is a hint to poll at, not a promise.
pub const TOO_MANY_RUNS_RETRY_SECS: u64 = 5;

/// The 429 of a start past an end user's cap on runs at once.
fn too_many_runs(running: u64, max: u32) -> ServiceError {
    let mut e = ServiceError::new(
        ErrorKind::Exhausted,
        Code::TooManyRuns,
        format!(
            "this user has {running} runs in progress, and a user may have at most {max} at once \
             (--max-runs-per-user); wait for one to end, then send the request again"
        ),
    );
    let mut extra = serde_json::Map::new();
    extra.insert("running".into(), running.into());
    extra.insert("max".into(), max.into());
    extra.insert("retry_after".into(), TOO_MANY_RUNS_RETRY_SECS.into());
    e.extra = Some(Box::new(extra));
    e
}

/// The conversation a run goes on from, and where its taint counts from
/// (see `RunContext::taint_from`).
pub(super) struct Driving {
    history: Vec<Turn>,
    taint_from: usize,
    /// The run's id and the budgets a person let it go past.
    run: pending::WaitingRun,
    /// Who started the run.
    by: Actor,
    /// Where each secret parameter's value came from (see [`credential_origins`]).
    origins: BTreeMap<String, String>,
    /// The end user whose session it is, whose per-user budgets it counts against.
    subject: Option<String>,
    /// When the person's token expires, if the run holds tokens exchanged
    /// for it (see `RunContext::tokens_until`).
    tokens_until: Option<i64>,
}

/// Each bound secret parameter of `agent` in a run with these values, and
/// where its value comes from (`session`, `message`, `pinned`,
/// `env BINDERY_PARAM_X`, `default:env X`): what a tool call's audit
/// record names of its credentials. Never a value.
fn credential_origins(
    agent: &LoadedAgent,
    session: &Values,
    message: &Values,
) -> BTreeMap<String, String> {
    agent
        .params
        .decls()
        .iter()
        .filter(|d| d.secret)
        .filter_map(|d| match agent.params.resolve(d, session, message) {
            (Some(_), source) => Some((d.name.clone(), source.to_string())),
            (None, _) => None,
        })
        .collect()
}

/// What a run's loop leaves for its end to record.
pub(super) struct Driven {
    pub(super) end: RunEnd,
    /// The answer, stored with the end (see [`Host::answer`](crate::run::Host::answer)).
    pub(super) answer: Option<(Turn, Events)>,
    /// Another server closed the run as lost.
    pub(super) taken: bool,
    /// What the run's next part needs if it waits.
    pub(super) run: pending::WaitingRun,
    /// What this part of the run used.
    pub(super) usage: bindery_store::usage::Totals,
    /// What of it is not written yet: with the end.
    pub(super) leftover: crate::state::budgets::Leftover,
}
