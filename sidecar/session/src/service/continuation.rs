//! Pending calls of a session: the items a blocked run leaves (with their
//! tokens, derived, never stored), the answers to them through their
//! continuations, their expiry (`confirmTtl`), and the cancel of a run that
//! waits. The run that resumes is started like any other.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Sessions;
use crate::error::{Code, ErrorKind, ServiceError};
use crate::run::Opening;
use crate::run::RunMode;
use crate::state::audit::{actor, answerer};
use crate::state::live_sessions::Live;
use crate::state::live_sessions::RunWait;
use crate::validate::{Caller, Op};
use bindery_params::secret::constant_time_eq;
use bindery_params::Values;
use bindery_store::audit::{Action, Actor};
use bindery_store::model::SessionRecord;
use bindery_store::model::SessionStatus;
use bindery_store::pending::{self, PendingCall, Resolution};
use bindery_store::wire::{Decider, Outcome, Resolved, SessionEvent};
use bindery_store::StoreError;
use bindery_tools::Disposition;

/// An answer to a pending call (`POST /v1/continuations/:token`).
#[derive(Debug, Default)]
pub struct Answer {
    /// The session the caller means, if it says (a token of another
    /// session is then unknown).
    pub session_id: Option<String>,
    /// A deferred call's result.
    pub result: Option<serde_json::Value>,
    /// A confirmation's decision.
    pub approve: Option<bool>,
    pub reason: Option<String>,
    /// A selection's answer: the `id` of an offered option.
    pub choice: Option<String>,
    /// A `needs_input` item's answer: the missing fields.
    pub input: Option<serde_json::Map<String, serde_json::Value>>,
    /// `false`: record the answer, start no run (a later resume does).
    pub resume: Option<bool>,
    pub params: BTreeMap<String, serde_json::Value>,
    /// Clear the taint guard: untrusted results taken in so far no longer
    /// hold the session's egress calls.
    pub clear_taint: bool,
    /// Who decided, as the `resolved` event and the log record it, when it
    /// is not the caller's role (`webhook`: through a notice's answer URL).
    pub by: Option<Decider>,
    pub mode: RunMode,
}

/// Whether `caller` may answer a session's pending items: its owner only.
/// Every path that answers one (the continuation route, `/mcp`, a chat
/// message that picks an option, and so the chat page, which uses them)
/// comes through [`Sessions::answer`], which asks this before anything
/// else; a session token reads the items but never answers them.
fn may_answer(caller: &Caller) -> Result<(), ServiceError> {
    match caller {
        // An end user's answers are checked item by item (`end_user_may`).
        Caller::Owner | Caller::Approver | Caller::EndUser(_) => Ok(()),
        Caller::SessionToken(_) => Err(ServiceError::forbidden(
            "only the session's owner may answer its pending calls (a continuation, or a chat message that picks an option); a session token may read them, not answer them",
        )),
        Caller::Share(holder) => Err(ServiceError::forbidden(format!(
            "only the session's owner may answer its pending calls; {}",
            holder.may()
        ))),
    }
}

/// Whether `item` is an end user's to answer (in their own session): a
/// selection or an input their conversation asks for. A confirmation, even
/// of a tool with lookups, is an approval.
pub fn end_user_answers(item: &PendingCall) -> bool {
    item.lookup.is_some()
        && matches!(
            item.disposition,
            Disposition::NeedsSelection | Disposition::NeedsInput
        )
}

/// Whether an end user may give `answer` to `item` of their own session:
/// the choices of their conversation (a selection, an input, the
/// confirmation of a tool with lookups: `depends_on`), yes; an approval of
/// a tool's call (`confirm`), a deferred result, a held egress call or a
/// budget stays with the owner and the approver, and so does clearing the
/// taint guard.
fn end_user_may(item: &PendingCall, answer: &Answer) -> Result<(), ServiceError> {
    if answer.clear_taint {
        return Err(ServiceError::forbidden(
            "an end user cannot clear the session's taint guard; the owner or the approver clears it",
        ));
    }
    if !end_user_answers(item) {
        return Err(ServiceError::forbidden(format!(
            "the {} of {} is the owner's or the approver's to answer; an end user answers the selections and inputs their conversation asks for",
            item.disposition.as_str(),
            item.tool
        )));
    }
    Ok(())
}

impl Sessions {
    /// Answer a pending call (`POST /v1/continuations/:token`): the call's
    /// session comes from the token. When every call is answered the run
    /// resumes (unless `resume: false`); the `RunWait` is that run's.
    pub async fn answer(
        self: &Arc<Self>,
        caller: &Caller,
        token: &str,
        answer: Answer,
    ) -> Result<(String, Option<RunWait>), ServiceError> {
        may_answer(caller)?;
        if answer.clear_taint && answer.by == Some(Decider::Webhook) {
            // A link decides its one item; clearing the guard reaches every
            // later egress call of the session.
            return Err(ServiceError::new(
                ErrorKind::Forbidden,
                Code::Forbidden,
                "a notice's answer link decides its one item and cannot clear the session's taint guard; the owner or the approver clears it (POST /v1/continuations/{token} with `clear_taint: true`)",
            ));
        }
        let unknown = || ServiceError::not_found("no pending call has this continuation token");
        let id = pending::token_session(token)
            .ok_or_else(unknown)?
            .to_string();
        if answer.session_id.as_ref().is_some_and(|s| *s != id) {
            return Err(unknown());
        }
        if self.store.get(&id).await?.is_none() {
            return Err(unknown());
        }
        let live = self.live.entry(&id);
        let r = self.answer_locked(caller, &live, &id, token, answer).await;
        drop(live);
        self.live.evict_if_idle(&id);
        r.map(|run| (id, run))
    }

    async fn answer_locked(
        self: &Arc<Self>,
        caller: &Caller,
        live: &Arc<Live>,
        id: &str,
        token: &str,
        answer: Answer,
    ) -> Result<Option<RunWait>, ServiceError> {
        let guard = live.lock.lock().await;
        let digest = pending::token_digest(token);
        let rec = self.record(id).await?;
        if !super::sessions::may_use(caller, &rec) {
            return Err(ServiceError::not_found(
                "no pending call has this continuation token",
            ));
        }
        let used = || {
            ServiceError::new(
                ErrorKind::Conflict,
                Code::ContinuationUsed,
                "this continuation was answered already (a token is good for one answer)",
            )
        };
        let Some(item) = rec
            .pending
            .items
            .iter()
            .find(|i| constant_time_eq(i.token_digest.as_bytes(), digest.as_bytes()))
            .cloned()
        else {
            let among = |digests: &[String]| {
                digests
                    .iter()
                    .any(|d| constant_time_eq(d.as_bytes(), digest.as_bytes()))
            };
            if among(&rec.pending.expired) {
                return Err(ServiceError::new(
                    ErrorKind::Conflict,
                    Code::ContinuationExpired,
                    "this call was not answered in time (the agent's confirmTtl, or the lookups it rested on went stale) and was closed without running",
                ));
            }
            if among(&rec.pending.used) {
                return Err(used());
            }
            return Err(ServiceError::not_found(
                "no pending call has this continuation token",
            ));
        };
        if let Caller::EndUser(_) = caller {
            end_user_may(&item, &answer)?;
            // An approver's answer resumes the person's run with their
            // rights; the person's own answer brings their token anew.
            super::sessions::present(live, caller);
        }
        let expired = matches!(item.resolution, Some(Resolution::Expired));
        if item.resolution.is_some() && !expired {
            return Err(used());
        }
        if expired || item.expires_at.is_some_and(|t| t <= self.clock.now_ms()) {
            drop(guard);
            if !expired {
                self.expire_session(id).await?;
            }
            let why = if item.lookup.is_some() {
                format!(
                    "the {} for {} rested on lookups that went stale (their ttl_ms passed); they run again and the session asks anew: answer the new pending item",
                    item.disposition.as_str(),
                    item.tool
                )
            } else {
                format!(
                    "the call of {} waited longer than the agent's confirmTtl and was closed as not approved",
                    item.tool
                )
            };
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::ContinuationExpired,
                why,
            ));
        }
        let agent = self.agents.agent(&rec.agent)?.clone();
        if answer.by == Some(Decider::Webhook) {
            // A link answers what a notice announced, and nothing else: an
            // approval of the session's agent, which has a webhook. A
            // continuation token handed out otherwise (an end user's
            // selection) is no link.
            let hook = agent
                .spec
                .approvals
                .as_ref()
                .is_some_and(|a| a.webhook.is_some());
            let announced = matches!(
                item.disposition,
                Disposition::Confirm | Disposition::NeedsConfirmation
            );
            if !(hook && announced) {
                return Err(ServiceError::not_found(
                    "no pending call has this continuation token",
                ));
            }
        }
        // The agent whose tool it is: the session's, or a helper's.
        let owner = item.frames.iter().try_fold(agent.clone(), |a, f| {
            let slug = crate::subagents::helper_slug(&a, &f.tool)?;
            let h = a.helpers.iter().find(|h| h.slug == slug)?;
            self.agents.tree().agent(&h.agent).cloned()
        });
        let bound_now = owner
            .as_ref()
            .and_then(|a| a.tool(&item.tool))
            .map(|t| t.bound_params())
            .unwrap_or_default();
        if item.digest != pending::call_digest(&item.tool, &item.call, &item.bound_params)
            || item.digest != pending::call_digest(&item.tool, &item.call, &bound_now)
        {
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::CallChanged,
                format!(
                    "the call of {} is not the one this continuation was issued for (the tool's bound parameters changed since); cancel the run and ask again",
                    item.tool
                ),
            ));
        }
        let resolution = pending::resolution_for(
            &item,
            pending::Reply {
                result: answer.result.as_ref(),
                approve: answer.approve,
                reason: answer.reason.as_deref(),
                choice: answer.choice.as_deref(),
                input: answer.input.as_ref(),
            },
        )
        .map_err(|e| ServiceError::bad_request(e.to_string()))?;
        let last = rec.pending.open().count() == 1;
        let resume = last && answer.resume != Some(false);
        let message = if resume {
            self.apply_params_locked(caller, id, Op::Resume, &answer.params, rec)
                .await?
                .0
        } else {
            if !answer.params.is_empty() {
                self.apply_params_locked(caller, id, Op::PutParams, &answer.params, rec)
                    .await?;
            }
            Values::new()
        };
        let mut rec = self.record(id).await?;
        if resolution == Resolution::Approved {
            // The call never runs without its values: a secret that is gone
            // (a restart) must be given again first.
            let missing = self.missing_secrets(&agent, &rec, &item);
            if !missing.is_empty() {
                return Err(ServiceError {
                    extra: None,
                    kind: ErrorKind::Conflict,
                    code: Code::ParamsRequired,
                    message: format!(
                        "the call of {} needs secret parameter(s) {} that this server no longer holds; give them again with PUT /v1/sessions/{id}/params",
                        item.tool,
                        missing.join(", ")
                    ),
                    params: missing,
                });
            }
        }
        let Some(slot) = rec
            .pending
            .items
            .iter_mut()
            .find(|i| i.id() == item.id() && i.resolution.is_none())
        else {
            return Err(used());
        };
        slot.resolution = Some(resolution.clone());
        rec.pending.retire_tokens();
        if answer.clear_taint {
            // What the person was shown: the untrusted results before the
            // turn that made this call. A result of that turn's other calls
            // (or later) came after, and still holds egress calls.
            let call = item
                .frames
                .first()
                .map_or(item.tool_call_id.as_str(), |f| f.call_id.as_str());
            let made_at = rec.turns.iter().position(|t| match t.message() {
                bindery_llm::ChatMessage::Assistant { tool_calls, .. } => {
                    tool_calls.iter().any(|c| c.id == call)
                }
                _ => false,
            });
            rec.security.taint_cleared_at = Some(made_at.unwrap_or(rec.turns.len()));
            tracing::info!(session = id, "the taint guard was cleared: earlier untrusted results no longer hold egress calls");
        }
        // On record before the answer is: a call approved unaudited never runs.
        let who = answerer(caller, answer.by == Some(Decider::Webhook));
        let decided = match (&item.budget, &resolution) {
            (Some(b), Resolution::Approved) if item.disposition == Disposition::Budget => {
                Action::BudgetOverridden {
                    budget: b.budget.clone(),
                    tool_call_id: item.tool_call_id.clone(),
                }
            }
            _ => Action::PendingAnswered {
                tool: item.tool.clone(),
                tool_call_id: item.tool_call_id.clone(),
                outcome: resolution.outcome().as_str().to_string(),
                cleared_taint: answer.clear_taint,
            },
        };
        self.audit.record(who, Some(id), decided).await?;
        rec.status_detail = Some(rec.pending.detail());
        rec.version += 1;
        rec.updated_at = self.clock.now_ms();
        self.store.update(&mut rec).await?;
        let by = answer.by.unwrap_or(match caller {
            Caller::Approver => Decider::Approver,
            Caller::EndUser(_) => Decider::EndUser,
            _ => Decider::Owner,
        });
        let resolved = Resolved {
            tool_call_id: item.id(),
            tool: Some(item.tool.clone()),
            outcome: resolution.outcome(),
            by: Some(by),
            cleared_taint: answer.clear_taint,
        };
        self.recorder
            .emit_for(&rec, SessionEvent::Resolved(resolved))
            .await;
        let (outcome, by) = (resolution.outcome().as_str(), by.as_str());
        tracing::info!(session = id, tool = %item.tool, outcome, by, "pending call answered");
        if !resume {
            return Ok(None);
        }
        let by = actor(caller);
        self.runs
            .start_run_locked(
                by,
                guard,
                Some(rec),
                id,
                Opening::Resume,
                message,
                answer.mode,
            )
            .await
            .map(Some)
    }

    /// The secret session values bound into a call of the session's own
    /// agent that this server does not hold (a helper's values come from
    /// its caller's, which a resume checks as a whole).
    fn missing_secrets(
        &self,
        agent: &bindery_tree::LoadedAgent,
        rec: &SessionRecord,
        item: &PendingCall,
    ) -> Vec<String> {
        if !item.frames.is_empty() {
            return Vec::new();
        }
        // What the process gives (a pin, BINDERY_PARAM_*, a default) is
        // never gone.
        let held = agent
            .params
            .snapshot(&self.secrets.session_values(rec), &Values::new());
        item.bound_params
            .iter()
            .filter(|p| {
                agent
                    .params
                    .decl(p)
                    .is_some_and(|d| d.scope == bindery_spec::Scope::Session && d.secret)
                    && !held.contains_key(*p)
            })
            .cloned()
            .collect()
    }

    /// Close the calls of session `id` whose confirmation time ran out, and
    /// resume its run when nothing else waits. Whether any was closed.
    async fn expire_session(self: &Arc<Self>, id: &str) -> Result<bool, ServiceError> {
        let live = self.live.entry(id);
        let guard = live.lock.lock().await;
        let mut rec = self.record(id).await?;
        if rec.status != SessionStatus::WaitingExternal {
            return Ok(false);
        }
        let expired = rec.pending.expire(self.clock.now_ms());
        if expired.is_empty() {
            return Ok(false);
        }
        let all = rec.pending.all_resolved();
        rec.status_detail = Some(rec.pending.detail());
        rec.version += 1;
        rec.updated_at = self.clock.now_ms();
        match self.store.update(&mut rec).await {
            Ok(()) => {}
            // Another server closed them first.
            Err(StoreError::Conflict(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        for call in &expired {
            let closed = Resolved::closed(call.clone(), Outcome::Expired);
            self.recorder
                .emit_for(&rec, SessionEvent::Resolved(closed))
                .await;
        }
        tracing::info!(
            session = id,
            n = expired.len(),
            "pending calls expired (confirmTtl)"
        );
        if all {
            self.runs
                .start_run_locked(
                    Actor::Server,
                    guard,
                    Some(rec),
                    id,
                    Opening::Resume,
                    Values::new(),
                    RunMode::UntilBlocked,
                )
                .await?;
        }
        Ok(true)
    }

    /// Close every call whose confirmation time ran out (each heartbeat).
    pub async fn expire_due(self: &Arc<Self>) -> Result<usize, ServiceError> {
        // Reading the waiting sessions is for agents that set a confirmTtl only.
        if !self
            .agents
            .tree()
            .agents
            .values()
            .any(|a| a.confirm_ttl().is_some())
        {
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let mut n = 0;
        for rec in self.store.waiting().await? {
            let due = rec
                .pending
                .open()
                // A stale choice is asked again only when someone answers it.
                .any(|i| i.lookup.is_none() && i.expires_at.is_some_and(|t| t <= now));
            if due && self.expire_session(&rec.id).await? {
                n += 1;
            }
            self.live.evict_if_idle(&rec.id);
        }
        Ok(n)
    }
}
