//! A run's end: how it ended, recorded with its answer and its pending
//! calls in one write, published, announced.

use super::start::{Driven, Runs};
use super::Events;
use super::RunEnd;
use super::RunMode;
use crate::state::recorder::RunWrite;
use bindery_llm::ChatMessage;
use bindery_llm::Turn;
use bindery_metrics::RunOutcome;
use bindery_store::clock::random_key;
use bindery_store::model::SessionRecord;
use bindery_store::model::SessionStatus;
use bindery_store::pending;
use bindery_store::pending::PendingCall;
use bindery_store::wire::PendingEvent;
use bindery_store::wire::RunFinished;
use bindery_store::wire::SessionEvent;
use bindery_tools::Disposition;
use std::time::Duration;

impl Runs {
    /// The pending items of the calls a run stopped before: each with a
    /// fresh nonce (its token derives from it) and its digest.
    pub(super) fn pending_items(
        &self,
        id: &str,
        calls: &[super::Blocked],
        ttl: Option<Duration>,
    ) -> Vec<PendingCall> {
        let now = self.clock.now_ms();
        calls
            .iter()
            .map(|b| {
                let call = super::call_arguments(&b.call);
                let mut item = PendingCall {
                    tool_call_id: b.call.id.clone(),
                    tool: b.call.name.clone(),
                    disposition: b.disposition,
                    digest: pending::call_digest(&b.call.name, &call, &b.bound_params),
                    call,
                    bound_params: b.bound_params.clone(),
                    nonce: hex::encode(random_key()),
                    token_digest: String::new(),
                    expires_at: ttl
                        .filter(|_| {
                            matches!(
                                b.disposition,
                                Disposition::Confirm
                                    | Disposition::NeedsConfirmation
                                    | Disposition::Budget
                            )
                        })
                        .map(|t| now + i64::try_from(t.as_millis()).unwrap_or(i64::MAX / 2)),
                    resolution: None,
                    frames: b.frames.clone(),
                    lookup: b.lookup.clone(),
                    tainted_by: b.tainted_by.clone(),
                    budget: b.budget.clone(),
                };
                if let Some(l) = &b.lookup {
                    // A choice or confirmation lasts no longer than what it rests on.
                    item.expires_at = match (item.expires_at, l.expires_at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                item.token_digest = pending::token_digest(&self.approvals.token_of(id, &item));
                item
            })
            .collect()
    }

    /// Record how a run ended, with its answer, unless it was taken away
    /// (`taken`, or found so now): then the server that closed it has said
    /// how it ended. The session as stored, if it was.
    pub(super) async fn finish(
        &self,
        id: &str,
        driven: Driven,
        pending: Vec<PendingCall>,
        mode: RunMode,
    ) -> Option<Box<SessionRecord>> {
        let Driven {
            end,
            answer,
            taken,
            run,
            usage,
            leftover,
        } = driven;
        let waiting = pending::Pending {
            client_call: mode == RunMode::Call && !pending.is_empty(),
            run: (!pending.is_empty()).then_some(run),
            items: pending,
            used: Vec::new(),
            expired: Vec::new(),
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
            RunEnd::OverBudget(why) => (
                SessionStatus::Failed,
                Some(format!("budget_exceeded: {why}")),
                RunOutcome::Failed,
            ),
        };
        // Stored with the record's end, in the same write.
        let (answer, mut events) = match answer {
            Some((msg, events)) => (Some(msg), events),
            None => (None, Events::new()),
        };
        if !waiting.is_empty() {
            // Without tokens: events are stored, tokens never are.
            let pending = waiting.items.iter().map(PendingCall::shown).collect();
            events.push(SessionEvent::Pending(PendingEvent { pending }));
        }
        events.push(SessionEvent::RunFinished(RunFinished {
            status: outcome,
            detail: detail.clone(),
            session_status: status,
            usage: Some(usage),
        }));
        let waited = std::time::Instant::now();
        let written = if taken {
            RunWrite::Taken
        } else {
            self.recorder
                .write_run(
                    id,
                    |rec| {
                        rec.turns.extend(answer.clone());
                        rec.status = status;
                        rec.status_detail = detail.clone();
                        rec.runner = None;
                        rec.cancel_requested = false;
                        rec.pending.items = waiting.items.clone();
                        rec.pending.client_call = waiting.client_call;
                        rec.pending.run = waiting.run.clone();
                    },
                    &events,
                    &leftover.usage,
                )
                .await
        };
        self.metrics.run_store_wait(waited.elapsed());
        match written {
            // Stored with the end.
            RunWrite::Written(..) => self.budgets.leftover_written(&leftover),
            _ => self.budgets.record_leftover(id, &leftover).await,
        }
        let (stored, record) = match written {
            RunWrite::Written(stored, record) => (Some(stored), record),
            RunWrite::Taken => {
                self.metrics.run_finished(RunOutcome::Failed);
                tracing::warn!(
                    session = id,
                    "run stopped: another server closed it as lost (this server's heartbeat had lapsed)"
                );
                return None;
            }
            RunWrite::Failed(e) => {
                tracing::error!(session = id, "cannot record the end of a run: {e}");
                (None, None)
            }
        };
        self.metrics.run_finished(outcome);
        tracing::info!(session = id, status = status.as_str(), detail = ?detail, "run finished");
        match stored {
            Some(stored) => self.recorder.publish(id, stored),
            // The end could not be stored; its events may still be.
            None => self.recorder.emit_all(id, events).await,
        }
        if let Some(rec) = record.as_deref().filter(|r| !r.pending.is_empty()) {
            self.approvals.announce(rec);
        }
        record
    }
}

/// How a cancelled run's unanswered calls are answered (a fork's too).
pub const CANCELLED: &str = "error: the run was cancelled";

/// Answer every tool call that has no result yet with `why`, so the history
/// stays well-formed for the model.
pub fn close_pending(mut turns: Vec<Turn>, why: &str) -> Vec<Turn> {
    let Some(pos) = turns.iter().rposition(
        |m| matches!(m.message(), ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty()),
    ) else {
        return turns;
    };
    let ChatMessage::Assistant { tool_calls, .. } = turns[pos].message() else {
        return turns;
    };
    let answered: Vec<String> = turns[pos + 1..]
        .iter()
        .filter_map(|m| match m.message() {
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
        turns.push(Turn::new(ChatMessage::tool_result(id, why)));
    }
    turns
}
