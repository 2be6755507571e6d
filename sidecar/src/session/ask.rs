//! One-shot runs, as MCP's `tools/call` makes them: a new session of the
//! owner's, one run to its end, the model's last text as the answer.
//!
//! The session is kept (listed, readable, continuable by the owner) like
//! any other; its secret values are dropped from memory when the run ends,
//! since they came with one request.

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
}

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
        let rec = self.record(&created.id).await?;
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
            session_id: created.id,
            text,
            is_error,
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
