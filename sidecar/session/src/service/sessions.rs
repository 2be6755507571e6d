//! A session's life through the API: created (or forked), sent messages,
//! resumed, given new parameter values ([`Sessions`]; its answers to
//! pending calls are in `continuation.rs`).

use super::token_digest;
use super::tokens::new_token;
use super::Answer;
use super::CreateSession;
use super::Created;
use crate::error::Code;
use crate::error::ErrorKind;
use crate::error::ServiceError;
use crate::run::close_pending;
use crate::run::heartbeat::Heartbeat;
use crate::run::Opening;
use crate::run::RunMode;
use crate::run::Runs;
use crate::run::CANCELLED;
use crate::state::agents::Agents;
use crate::state::approvals::Approvals;
use crate::state::audit::{actor, AuditLog};
use crate::state::live_sessions::LiveSessions;
use crate::state::live_sessions::RunWait;
use crate::state::recorder::Recorder;
use crate::state::secrets::Secrets;
use crate::state::stored_session;
use crate::validate::validate;
use crate::validate::Caller;
use crate::validate::Op;
use bindery_params::ParamValue;
use bindery_params::Values;
use bindery_store::audit::Action;
use bindery_store::clock::Clock;
use bindery_store::model::SessionRecord;
use bindery_store::model::SessionStatus;
use bindery_store::model::StoredParams;
use bindery_store::wire::ParamsChanged;
use bindery_store::wire::SessionEvent;
use bindery_store::SessionStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The session API's flows: what a request asks of a session, carried out
/// with the collaborators it takes.
pub struct Sessions {
    pub(super) store: Arc<dyn SessionStore>,
    pub(super) live: Arc<LiveSessions>,
    pub(super) agents: Arc<Agents>,
    pub(super) secrets: Arc<Secrets>,
    pub(super) runs: Arc<Runs>,
    pub(super) approvals: Arc<Approvals>,
    pub(super) recorder: Arc<Recorder>,
    pub(super) heartbeat: Arc<Heartbeat>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) audit: Arc<AuditLog>,
}

impl Sessions {
    /// Session `id` as stored.
    pub(super) async fn record(&self, id: &str) -> Result<SessionRecord, ServiceError> {
        stored_session(&*self.store, id).await
    }

    pub async fn create(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateSession,
    ) -> Result<Created, ServiceError> {
        if !matches!(caller, Caller::Owner | Caller::EndUser(_)) {
            return Err(ServiceError::forbidden(
                "only the owner or an end user can create or fork sessions",
            ));
        }
        let (agent_name, base, turns, op, source_pins) = match &req.fork {
            Some(source_id) => {
                let no_source =
                    || ServiceError::not_found(format!("no session {source_id} to fork"));
                let source = self.record(source_id).await.map_err(|e| {
                    if e.kind == ErrorKind::NotFound {
                        no_source()
                    } else {
                        e
                    }
                })?;
                // An end user forks their own sessions only; another's is
                // as absent as one that does not exist.
                if !may_use(caller, &source) {
                    return Err(no_source());
                }
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
                    source.security.pinned,
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
                let op = if req.prompt.is_some() || req.call.is_some() {
                    Op::Create
                } else {
                    Op::CreateIdle
                };
                (agent, Values::new(), Vec::new(), op, Vec::new())
            }
        };
        if let Err(e) = self.agents.refresh_stored(&agent_name).await {
            tracing::warn!(agent = %agent_name, "stored agent not read again: {}", e.message);
        }
        let agent = self.agents.agent(&agent_name)?.clone();
        let WithPins {
            supplied,
            kept,
            pinned,
        } = session_pins(&agent.params, &req, source_pins)?;
        let accepted = validate(&agent.params, op, caller, false, &kept, &base, &supplied)?;
        let token = if req.session_token {
            Some(new_token()?)
        } else {
            None
        };
        let now = self.clock.now_ms();
        let holder = self.secrets.holder_of(None, &accepted.session);
        let mut rec = SessionRecord {
            id: uuid::Uuid::new_v4().to_string(),
            agent: agent_name,
            status: SessionStatus::Idle,
            status_detail: None,
            created_at: now,
            updated_at: now,
            version: 1,
            turns,
            stored_turns: 0,
            params: StoredParams::from_values(&accepted.session),
            security: bindery_store::model::Security {
                sealed: req.seal,
                token_digests: token.iter().map(|t| token_digest(t)).collect(),
                owner: Some(req.owner.unwrap_or_else(|| "owner".to_string())),
                subject: caller.subject().cloned(),
                pinned,
                // A fork of a tainted history is tainted again until a
                // person clears it (a fork before the taint is clean).
                taint_cleared_at: None,
                // Shares are of one session: a fork has none.
                shares: Vec::new(),
            },
            forked_from: req.fork.clone(),
            runner: None,
            cancel_requested: false,
            pending: Default::default(),
            holder,
        };
        // On record before the session exists: the grant is never unaudited.
        let by = actor(caller);
        let created = Action::SessionCreated {
            agent: rec.agent.clone(),
            forked_from: rec.forked_from.clone(),
            sealed: rec.security.sealed,
        };
        self.audit
            .record(by.clone(), Some(&rec.id), created)
            .await?;
        if token.is_some() {
            let issued = Action::SessionTokenIssued {};
            self.audit.record(by.clone(), Some(&rec.id), issued).await?;
        }
        if req.prompt.is_some() {
            let posted = Action::MessagePosted {};
            self.audit.record(by.clone(), Some(&rec.id), posted).await?;
        }
        self.store.create(&mut rec).await?;
        self.secrets.keep(&rec.id, &accepted.session);
        present(&self.live.entry(&rec.id), caller);
        tracing::info!(session = %rec.id, agent = %rec.agent, forked_from = ?rec.forked_from, subject = rec.security.subject.as_ref().map(|s| s.as_str()), "session created");
        let run = match (req.call, req.prompt) {
            (Some(call), _) => Some(
                self.runs
                    .start_run(
                        by,
                        &rec.id,
                        Opening::Call(call),
                        accepted.message,
                        RunMode::Call,
                    )
                    .await?,
            ),
            (None, Some(prompt)) => Some(
                self.runs
                    .start_run(
                        by,
                        &rec.id,
                        Opening::Prompt(prompt),
                        accepted.message,
                        req.mode,
                    )
                    .await?,
            ),
            (None, None) => None,
        };
        self.live.evict_if_idle(&rec.id);
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
        let r = async {
            let e = match self
                .run_request(
                    caller,
                    id,
                    Op::Message,
                    Opening::Prompt(prompt.clone()),
                    params,
                    mode,
                )
                .await
            {
                Err(e) if e.code == Code::WaitingExternal => e,
                r => return r,
            };
            // A message that names an option of the one open selection
            // answers it (a session that waits refused it as a message, and
            // changed nothing).
            let Some(token) = self.approvals.chat_choice(id, &prompt).await? else {
                return Err(e);
            };
            let answer = Answer {
                session_id: Some(id.to_string()),
                choice: token.1,
                params: params.clone(),
                mode,
                ..Default::default()
            };
            match self.answer(caller, &token.0, answer).await? {
                (_, Some(run)) => Ok(run),
                (_, None) => {
                    self.run_request(
                        caller,
                        id,
                        Op::Message,
                        Opening::Prompt(prompt),
                        params,
                        mode,
                    )
                    .await
                }
            }
        }
        .await;
        self.live.evict_if_idle(id);
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
            .run_request(caller, id, Op::Resume, Opening::Resume, params, mode)
            .await;
        self.live.evict_if_idle(id);
        r
    }

    /// A request that starts a run: its values are validated and stored,
    /// and the run reserved, in one critical section, so a request refused
    /// with `run_in_progress` changes nothing.
    pub(crate) async fn run_request(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        op: Op,
        opening: Opening,
        params: &BTreeMap<String, serde_json::Value>,
        mode: RunMode,
    ) -> Result<RunWait, ServiceError> {
        // The live entry made for an id that names no session goes again
        // with the caller's `evict_if_idle`.
        let live = self.live.entry(id);
        let guard = live.lock.lock().await;
        let rec = self.record(id).await?;
        if rec.status == SessionStatus::WaitingExternal
            && (op == Op::Message || !rec.pending.all_resolved())
        {
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::WaitingExternal,
                format!(
                    "the session is {}; answer each call through its continuation (POST /v1/continuations/:token) or cancel the run",
                    rec.pending.detail()
                ),
            ));
        }
        if !may_use(caller, &rec) {
            return Err(ServiceError::not_found(format!("no session {id}")));
        }
        let (message, rec) = self
            .apply_params_locked(caller, id, op, params, rec)
            .await?;
        present(&live, caller);
        let by = actor(caller);
        let action = match op {
            Op::Resume => Action::RunResumed {},
            _ => Action::MessagePosted {},
        };
        self.audit.record(by.clone(), Some(id), action).await?;
        self.runs
            .start_run_locked(by, guard, Some(rec), id, opening, message, mode)
            .await
    }

    pub async fn put_params(
        &self,
        caller: &Caller,
        id: &str,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), ServiceError> {
        let r = async {
            // An id that names no session leaves no live entry behind:
            // `evict_if_idle` below drops it.
            let live = self.live.entry(id);
            let _guard = live.lock.lock().await;
            let rec = self.record(id).await?;
            self.apply_params_locked(caller, id, Op::PutParams, params, rec)
                .await
        }
        .await;
        self.live.evict_if_idle(id);
        r.map(drop)
    }

    /// Validate and store a request's values in `rec` (read under the
    /// session's lock, which the caller holds); returns its message-scope
    /// values and the record as it now stands.
    pub(super) async fn apply_params_locked(
        &self,
        caller: &Caller,
        id: &str,
        op: Op,
        params: &BTreeMap<String, serde_json::Value>,
        mut rec: SessionRecord,
    ) -> Result<(Values, SessionRecord), ServiceError> {
        if op != Op::PutParams && self.live.is_running(id) {
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::RunInProgress,
                "a run is in progress on this session; wait for it or cancel it",
            ));
        }
        if op != Op::PutParams && rec.status == SessionStatus::Running {
            rec = self.heartbeat.close_if_lost(rec).await?;
        }
        let agent = self.agents.agent(&rec.agent)?.clone();
        let current = self.secrets.session_values(&rec);
        let accepted = validate(
            &agent.params,
            op,
            caller,
            rec.security.sealed,
            &rec.security.pinned,
            &current,
            params,
        )?;
        // After the values' own refusals (they say more of the request),
        // before any is stored: a refused resume changes nothing.
        if op == Op::Resume {
            nothing_to_resume(&rec)?;
        }
        let session_changed = accepted.changed.iter().any(|n| {
            agent
                .params
                .decl(n)
                .is_some_and(|d| d.scope == bindery_spec::Scope::Session)
        });
        if session_changed {
            let set = Action::ParamsSet {
                names: accepted.changed.clone(),
            };
            self.audit.record(actor(caller), Some(id), set).await?;
            rec.params = StoredParams::from_values(&accepted.session);
            rec.holder = self.secrets.holder_of(rec.holder.take(), &accepted.session);
            rec.version += 1;
            rec.updated_at = self.clock.now_ms();
            self.store.update(&mut rec).await?;
            self.secrets.keep(id, &accepted.session);
            let names = accepted.changed.clone();
            self.recorder
                .emit_for(&rec, SessionEvent::ParamsChanged(ParamsChanged { names }))
                .await;
        }
        Ok((accepted.message, rec))
    }
}

/// A creation's values with its pins.
struct WithPins {
    /// What to validate: `params` and `pin` together.
    supplied: BTreeMap<String, serde_json::Value>,
    /// The inherited pins in force for that check (a fork's own `pin`
    /// replaces the source's).
    kept: Vec<String>,
    /// The new session's pins.
    pinned: Vec<String>,
}

fn session_pins(
    params: &bindery_params::AgentParams,
    req: &CreateSession,
    inherited: Vec<String>,
) -> Result<WithPins, crate::validate::ParamsError> {
    let both: Vec<String> = req
        .pin
        .iter()
        .filter(|(k, v)| !v.is_null() && req.params.contains_key(*k))
        .map(|(k, _)| k)
        .cloned()
        .collect();
    if !both.is_empty() {
        return Err(crate::validate::ParamsError::Invalid(
            both,
            "given in both `params` and `pin`; give each name once".into(),
        ));
    }
    let per_message: Vec<String> = req
        .pin
        .keys()
        .filter(|k| {
            params
                .decl(k)
                .is_some_and(|d| d.scope == bindery_spec::Scope::Message)
        })
        .cloned()
        .collect();
    if !per_message.is_empty() {
        return Err(crate::validate::ParamsError::Invalid(
            per_message,
            "message-scope parameters last one run and cannot be pinned for a session; pin session-scope ones".into(),
        ));
    }
    // A `null` pin drops the pin, and the value unless `params` gives one.
    let mut supplied = req.params.clone();
    for (k, v) in &req.pin {
        supplied.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let keep: Vec<String> = inherited
        .into_iter()
        .filter(|n| !req.pin.contains_key(n))
        .collect();
    let mut pinned: Vec<String> = keep
        .iter()
        .cloned()
        .chain(
            req.pin
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| k.clone()),
        )
        .collect();
    pinned.sort();
    pinned.dedup();
    Ok(WithPins {
        supplied,
        kept: keep,
        pinned,
    })
}

/// A resume goes on from where a run stopped short: one that failed, was
/// cancelled, stopped at its step or turn limit, or waited for calls now
/// answered. A session whose last run answered (or that never ran) has
/// nothing to resume: refused, so that a client retrying a resume whose
/// answer it missed does not run the model (and its tools) again.
fn nothing_to_resume(rec: &SessionRecord) -> Result<(), ServiceError> {
    if rec.status == SessionStatus::Idle && rec.status_detail.is_none() {
        return Err(ServiceError::new(
            ErrorKind::Conflict,
            Code::NothingToResume,
            "the session's last run answered (or it never ran): there is nothing to resume; send a message to go on",
        ));
    }
    Ok(())
}

/// Whether `caller` may use session `rec` at all: an end user only their
/// own sessions; the owner, an approver and a session token are let in by
/// the API's doors.
pub fn may_use(caller: &Caller, rec: &SessionRecord) -> bool {
    match caller {
        Caller::EndUser(person) => rec.security.subject.as_ref() == Some(&person.subject),
        _ => true,
    }
}

/// Keep the end user as this request presents them (their token, for the
/// exchanges of the run it starts), in memory only, in place of what an
/// earlier request of theirs left; a run someone else starts (the owner, a
/// session token) acts with no person's rights, so it clears them.
pub(crate) fn present(live: &crate::state::live_sessions::Live, caller: &Caller) {
    let mut held = live.person.lock().unwrap_or_else(|p| p.into_inner());
    *held = match caller {
        Caller::EndUser(person) if person.token.is_some() => Some(person.clone()),
        _ => None,
    };
}
