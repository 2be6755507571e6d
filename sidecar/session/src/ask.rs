//! One-shot runs, as MCP's `tools/call` makes them: a new session of the
//! owner's (or a session the client names), one run to its end, the
//! model's last text as the answer; or, for an exposed tool, one call of
//! it made by the client ([`call_tool`]), its result as the answer.
//!
//! The session is kept (listed, readable, continuable by the owner) like
//! any other; its secret values are dropped from memory when the run ends
//! or blocks, since they came with one request. A run that blocks answers
//! with its pending items; [`ask_continue`] carries the answers
//! (and the values again) and runs on to the end.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::ServiceError;
use super::validate::Caller;
use crate::run::{Opening, RunMode};
use crate::service::{CreateSession, Service};
use crate::state::live_sessions::RunWait;
use bindery_llm::{ChatMessage, ToolCall};
use bindery_store::model::SessionStatus;

/// How a one-shot run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub session_id: String,
    /// The model's answer, or why there is none (`is_error`).
    pub text: String,
    pub is_error: bool,
    /// The calls the run waits for (with their tokens), if it blocked.
    pub pending: Vec<bindery_store::wire::PendingItem>,
}

/// One answer of [`ask_continue`]: a pending item's token and the
/// decision or result for it.
pub type Reply = (String, super::service::Answer);

/// Validate `params` as a creation that starts a run (session and
/// message scope coincide: both come with this one request), run
/// `prompt` on `agent` until the run ends, and answer.
///
/// When the future is dropped before the run ends (the client went
/// away), the run is cancelled: nobody is left to read its answer.
pub async fn ask(
    service: &Arc<Service>,
    caller: &Caller,
    agent: &str,
    prompt: String,
    params: BTreeMap<String, serde_json::Value>,
) -> Result<Answer, ServiceError> {
    let session = CreateSession {
        prompt: Some(prompt),
        ..CreateSession::default()
    };
    in_new_session(service, caller, agent, params, session).await
}

/// `session` (its prompt or call) in a new session of `agent`, owned by
/// `mcp`, with the request's `params`; its run's answer.
async fn in_new_session(
    service: &Arc<Service>,
    caller: &Caller,
    agent: &str,
    params: BTreeMap<String, serde_json::Value>,
    session: CreateSession,
) -> Result<Answer, ServiceError> {
    let created = service
        .sessions()
        .create(
            caller,
            CreateSession {
                agent: Some(agent.to_string()),
                params,
                owner: Some("mcp".to_string()),
                ..session
            },
        )
        .await?;
    wait_and_answer(service, &created.id, created.run, true).await
}

/// `prompt` as a message in session `id` (named by an MCP client; a
/// session token's holder may name its own session only), run until
/// it ends, and answer. The session keeps its values; `params` are the
/// message's, validated as any message's.
pub async fn ask_in(
    service: &Arc<Service>,
    caller: &Caller,
    id: &str,
    prompt: String,
    params: BTreeMap<String, serde_json::Value>,
) -> Result<Answer, ServiceError> {
    let run = service
        .sessions()
        .post_message(caller, id, prompt, &params, RunMode::UntilBlocked)
        .await?;
    wait_and_answer(service, id, Some(run), false).await
}

/// One call of an exposed tool of `agent`, made by an MCP client: in a
/// new session of its own (owner `mcp`), or in session `id` when the
/// client names one (its values then apply, as to a message). The call
/// goes the way a model's goes (confirmations, lookups, bindings, the
/// cache, the scrubber), with no model turn; the answer is its result.
pub async fn call_tool(
    service: &Arc<Service>,
    caller: &Caller,
    agent: &str,
    call: ToolCall,
    params: BTreeMap<String, serde_json::Value>,
    session: Option<&str>,
) -> Result<Answer, ServiceError> {
    if let Some(id) = session {
        let rec = service.record(id).await?;
        if rec.agent != agent {
            return Err(ServiceError::bad_request(format!(
                "session {id} is a session of agent `{}`, not of `{agent}`: name one of `{agent}`'s sessions, or none",
                rec.agent
            )));
        }
        let run = service
            .sessions()
            .run_request(
                caller,
                id,
                super::validate::Op::Message,
                Opening::Call(call),
                &params,
                RunMode::Call,
            )
            .await;
        service.evict_if_idle(id);
        return wait_and_answer(service, id, Some(run?), false).await;
    }
    let session = CreateSession {
        call: Some(call),
        ..CreateSession::default()
    };
    in_new_session(service, caller, agent, params, session).await
}

/// Wait for the run on session `id` to end (cancelled if the future is
/// dropped first), forget the values that came with this one request
/// when the session was made for it (`forget`), and answer.
async fn wait_and_answer(
    service: &Arc<Service>,
    id: &str,
    run: Option<RunWait>,
    forget: bool,
) -> Result<Answer, ServiceError> {
    let mut guard = CancelOnDrop {
        service: service.clone(),
        id: id.to_string(),
        armed: true,
        forget,
    };
    if let Some(run) = run {
        run.finished().await;
    }
    guard.armed = false;
    if forget {
        service.secrets().forget(id);
    }
    answer_of(service, id).await
}

/// Answer the pending calls of a one-shot run (`replies`, the last one
/// carrying `params`, which must come again: they lasted one request)
/// and run on until the run ends or blocks again.
pub async fn ask_continue(
    service: &Arc<Service>,
    caller: &Caller,
    replies: Vec<Reply>,
    params: BTreeMap<String, serde_json::Value>,
) -> Result<Answer, ServiceError> {
    let n = replies.len();
    let mut session = None;
    let mut run = None;
    let mut params = Some(params);
    for (i, (token, mut answer)) in replies.into_iter().enumerate() {
        if i + 1 == n {
            answer.params = params.take().unwrap_or_default();
        }
        let (id, r) = service.sessions().answer(caller, &token, answer).await?;
        session = Some(id);
        run = r.or(run);
    }
    let id = session.ok_or_else(|| {
        ServiceError::bad_request("no answer given: list at least one {token, …}")
    })?;
    // A session made for an MCP request forgets the values it came
    // with; a session the client named keeps its own.
    let forget = service
        .record(&id)
        .await
        .map_or(true, |r| r.security.owner.as_deref() == Some("mcp"));
    wait_and_answer(service, &id, run, forget).await
}

/// A one-shot run's answer, from its session as it stands.
async fn answer_of(service: &Service, id: &str) -> Result<Answer, ServiceError> {
    let rec = service.record(id).await?;
    if rec.status == SessionStatus::WaitingExternal {
        return Ok(Answer {
            session_id: rec.id.clone(),
            text: format!(
                "The run is {}. Call this tool again with _meta \"bindery.dev/continuations\": [{{\"token\": <continuation_token>, \"approve\": true|false}}] for a confirmation or [{{\"token\": …, \"result\": …}}] for a deferred call, and the parameters again.",
                rec.pending.detail()
            ),
            is_error: false,
            pending: service.approvals().pending_view(&rec),
        });
    }
    let (text, is_error) = match (rec.status, rec.status_detail) {
        (SessionStatus::Failed, detail) => (
            detail.unwrap_or_else(|| "the run failed; see the server log".into()),
            true,
        ),
        // Cancelled, or out of steps: no answer.
        (_, Some(detail)) => (detail, true),
        (_, None) => match rec.turns.last().map(|t| t.message()) {
            Some(ChatMessage::Assistant { content, .. }) => {
                (content.clone().unwrap_or_default(), false)
            }
            // A client's call (`call_tool`): its result, scrubbed when
            // it was recorded; a failure is recorded as `error: …`.
            // Media stay in the session; the answer is its text.
            Some(ChatMessage::Tool { content, .. }) => {
                let text = content.text().into_owned();
                let failed = text.starts_with("error: ");
                (text, failed)
            }
            _ => ("the run ended without an answer".into(), true),
        },
    };
    Ok(Answer {
        session_id: rec.id,
        text,
        is_error,
        pending: Vec::new(),
    })
}

/// Cancels the run of session `id` when dropped while armed (and forgets
/// its values when they came with the one request).
struct CancelOnDrop {
    service: Arc<Service>,
    id: String,
    armed: bool,
    forget: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.service.clone();
        let id = std::mem::take(&mut self.id);
        let forget = self.forget;
        rt.spawn(async move {
            tracing::info!(session = %id, "the client went away; cancelling its run");
            let _ = service.runs().cancel(&id).await;
            if forget {
                service.secrets().forget(&id);
            }
        });
    }
}
