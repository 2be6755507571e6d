//! Approvals where people are: the approver's list of what waits for a
//! person (`GET /v1/approvals`), what an approver is told after answering,
//! and the one-time answer link an approval webhook's notice carries
//! (`POST /v1/approvals/:token`).
//!
//! An approver sees a pending item's facts (the tool, the call as the model
//! made it, what a lookup found, which untrusted calls tainted the session)
//! and nothing else of the conversation: no turns, no parameters.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::auth::{door, Authed};
use super::openapi::{AnswerRefused, BadRequest, NotFound, Unauthorized};
use super::request::{body, ContinuationBody, WaitQuery};
use super::state::AppState;
use super::status::ApiResult;
use bindery_session::state::live_sessions::RunWait;
use bindery_session::validate::Caller;

/// Every call that waits for a person
///
/// The open pending items of every session that waits, each with its
/// `session_id`, `agent` and `continuation_token`, to answer it with `POST
/// /v1/continuations/{token}`. Deferred calls (the client runs them) are
/// not listed. The owner and the approver token.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", operation_id = "listApprovals",
    security(("ownerToken" = []), ("approverToken" = [])),
    responses(
        (status = 200, description = "What waits for a person.", body = inline(ApprovalList)),
        (status = 401, response = Unauthorized),
    ),
)]
pub async fn list(State(s): State<Arc<AppState>>, _: Authed<door::Approvals>) -> ApiResult {
    let approvals = s.service.approvals().list().await?;
    Ok(Json(ApprovalList { approvals }).into_response())
}

/// `GET /v1/approvals`' answer.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ApprovalList {
    /// Oldest session first.
    approvals: Vec<bindery_store::wire::Approval>,
}

/// What an approver (or an answer link) is told after answering: the
/// session's id and status and what it waits for now, never its turns. A
/// link holder (`by_link`) is not told the other items' tokens: a link
/// answers its one item.
pub async fn answered(
    s: &AppState,
    id: &str,
    q: &WaitQuery,
    run: Option<RunWait>,
    by_link: bool,
) -> ApiResult {
    let ended = q.wait(run).await;
    let rec = match ended.and_then(|e| e.record) {
        Some(rec) => Arc::unwrap_or_clone(rec),
        None => s.service.record(id).await?,
    };
    let mut pending = s.service.approvals().pending_view(&rec);
    if by_link {
        for p in &mut pending {
            p.continuation_token = None;
        }
    }
    let answered = ApprovalAnswered {
        pending,
        session_id: rec.id,
        status: rec.status,
    };
    Ok(Json(answered).into_response())
}

/// Answer one pending item through the link of its webhook notice
///
/// The token in the path is the item's continuation token: it is the only
/// credential, good for this one item and one answer. The body is the
/// continuation route's (`approve` and `reason`, `choice`, `input`), without
/// `params` and `clear_taint` (a link decides its item, nothing more of
/// the session). The answer is recorded as the webhook's (`by: webhook`).
#[utoipa::path(post, path = "/v1/approvals/{token}", tag = "approvals",
    operation_id = "answerApprovalLink", security(),
    params(("token" = String, Path, description = "The `continuation_token` of the notice's item."),
        WaitQuery),
    request_body = ContinuationBody,
    responses(
        (status = 200, description = "Recorded; the session's status and what it waits for now.",
            body = inline(ApprovalAnswered)),
        (status = 400, description = "Not an answer this item takes.", body = inline(BadRequest)),
        (status = 403, description = "`params` or `clear_taint` were given: a link answers \
            its one item, it sets nothing and clears no guard.",
            body = inline(super::openapi::ForbiddenAnswer)),
        (status = 404, description = "No pending item has this token.", body = inline(NotFound)),
        (status = 409, description = "Answered already, expired, or the call changed.",
            body = inline(AnswerRefused)),
    ),
)]
pub async fn answer_link(
    State(s): State<Arc<AppState>>,
    Path(token): Path<String>,
    Query(q): Query<WaitQuery>,
    b: axum::body::Bytes,
) -> ApiResult {
    let b: ContinuationBody = body(&b)?;
    let mut answer = b.into_answer()?;
    answer.by = Some(bindery_store::wire::Decider::Webhook);
    let (id, run) = s
        .service
        .sessions()
        .answer(&Caller::Approver, &token, answer)
        .await?;
    let r = answered(&s, &id, &q, run, true).await?;
    Ok((StatusCode::OK, r).into_response())
}

/// What an answer link or an approver's answer returns.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ApprovalAnswered {
    session_id: String,
    status: bindery_store::model::SessionStatus,
    /// What the session waits for now.
    pending: Vec<bindery_store::wire::PendingItem>,
}
