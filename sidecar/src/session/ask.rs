//! One-shot runs, as MCP's `tools/call` makes them: a new session of the
//! owner's, one run to its end, the model's last text as the answer.
//!
//! The session is kept (listed, readable, continuable by the owner) like
//! any other; its secret values are dropped from memory when the run ends
//! or blocks, since they came with one request. A run that blocks answers
//! with its pending items; [`Service::ask_continue`] carries the answers
//! (and the values again) and runs on to the end.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::ServiceError;
use super::model::SessionStatus;
use super::service::{CreateSession, Service};
use super::validate::Caller;
use crate::llm::ChatMessage;

/// How a one-shot run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub session_id: String,
    /// The model's answer, or why there is none (`is_error`).
    pub text: String,
    pub is_error: bool,
    /// The calls the run waits for (with their tokens), if it blocked.
    pub pending: Vec<serde_json::Value>,
}

/// One answer of [`Service::ask_continue`]: a pending item's token and the
/// decision or result for it.
pub type Reply = (String, super::service::Answer);

impl Service {
    /// Validate `params` as a creation that starts a run (session and
    /// message scope coincide: both come with this one request), run
    /// `prompt` on `agent` until the run ends, and answer.
    ///
    /// When the future is dropped before the run ends (the client went
    /// away), the run is cancelled: nobody is left to read its answer.
    pub async fn ask(
        self: &Arc<Self>,
        caller: &Caller,
        agent: &str,
        prompt: String,
        params: BTreeMap<String, serde_json::Value>,
    ) -> Result<Answer, ServiceError> {
        let created = self
            .create(
                caller,
                CreateSession {
                    agent: Some(agent.to_string()),
                    prompt: Some(prompt),
                    params,
                    owner: Some("mcp".to_string()),
                    ..CreateSession::default()
                },
            )
            .await?;
        let mut guard = CancelOnDrop {
            service: self.clone(),
            id: created.id.clone(),
            armed: true,
        };
        if let Some(run) = created.run {
            run.finished().await;
        }
        guard.armed = false;
        self.forget_secrets(&created.id);
        self.answer_of(&created.id).await
    }

    /// Answer the pending calls of a one-shot run (`replies`, the last one
    /// carrying `params`, which must come again: they lasted one request)
    /// and run on until the run ends or blocks again.
    pub async fn ask_continue(
        self: &Arc<Self>,
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
            let (id, r) = self.answer(caller, &token, answer).await?;
            session = Some(id);
            run = r.or(run);
        }
        let id = session.ok_or_else(|| {
            ServiceError::bad_request("no answer given: list at least one {token, …}")
        })?;
        let mut guard = CancelOnDrop {
            service: self.clone(),
            id: id.clone(),
            armed: true,
        };
        if let Some(run) = run {
            run.finished().await;
        }
        guard.armed = false;
        self.forget_secrets(&id);
        self.answer_of(&id).await
    }

    /// A one-shot run's answer, from its session as it stands.
    async fn answer_of(&self, id: &str) -> Result<Answer, ServiceError> {
        let rec = self.record(id).await?;
        if rec.status == SessionStatus::WaitingExternal {
            return Ok(Answer {
                session_id: rec.id.clone(),
                text: format!(
                    "The run is {}. Call this tool again with _meta \"bindery.dev/continuations\": [{{\"token\": <continuation_token>, \"approve\": true|false}}] for a confirmation or [{{\"token\": …, \"result\": …}}] for a deferred call, and the parameters again.",
                    rec.pending.detail()
                ),
                is_error: false,
                pending: self.pending_view(&rec),
            });
        }
        let (text, is_error) = match (rec.status, rec.status_detail) {
            (SessionStatus::Failed, detail) => (
                detail.unwrap_or_else(|| "the run failed; see the server log".into()),
                true,
            ),
            // Cancelled, or out of steps: no answer.
            (_, Some(detail)) => (detail, true),
            (_, None) => match rec.turns.last() {
                Some(ChatMessage::Assistant { content, .. }) => {
                    (content.clone().unwrap_or_default(), false)
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
}

/// Cancels the run of session `id` when dropped while armed.
struct CancelOnDrop {
    service: Arc<Service>,
    id: String,
    armed: bool,
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
        rt.spawn(async move {
            tracing::info!(session = %id, "the client went away; cancelling its run");
            let _ = service.cancel(&id).await;
            service.forget_secrets(&id);
        });
    }
}
