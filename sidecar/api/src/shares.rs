//! A session's share links: made, listed and revoked by its owner or the
//! end user it belongs to (`door::OwnerOrEndUser`). A share's token is in
//! the answer that makes it, once; the list and a revocation never show a
//! token or its digest.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{door, Authed};
use super::openapi::{BadRequest, Forbidden, NotFound, TooManyShares, Unauthorized, BAD_REQUEST};
use super::request::body;
use super::state::AppState;
use super::status::ApiResult;
use bindery_session::error::ServiceError;
use bindery_session::service::NewShare;
use bindery_store::model::{Share, ShareMode};

/// `POST /v1/sessions/{id}/shares`'s body.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ShareRequest)]
pub struct ShareBody {
    /// `read`: the session, its events and its pending items, read-only.
    /// `write`: also post messages and cancel a run, as a session token.
    #[schema(value_type = ShareMode, required = true)]
    mode: Option<ShareMode>,
    /// For the people who list the shares: at most 200 characters, no
    /// control character (one line).
    #[schema(max_length = 200, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    note: Option<String>,
}

/// A share link as listed: never its token.
#[derive(Serialize, ToSchema)]
#[schema(as = ShareView)]
pub struct ShareView {
    /// `sh_…`: names the share in its revocation and in the audit log.
    id: String,
    mode: ShareMode,
    /// Who shared: `owner`, or `user:<subject>` (an end user).
    shared_by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// Milliseconds since the Unix epoch.
    created_at: i64,
    /// When it was revoked (milliseconds since the Unix epoch); absent
    /// while it is live.
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at: Option<i64>,
}

impl From<Share> for ShareView {
    fn from(s: Share) -> Self {
        ShareView {
            id: s.id,
            mode: s.mode,
            shared_by: s.shared_by,
            note: s.note,
            created_at: s.created_at,
            revoked_at: s.revoked_at,
        }
    }
}

/// A share link just made: its token, this once.
#[derive(Serialize, ToSchema)]
#[schema(as = SharedView)]
pub struct SharedView {
    id: String,
    mode: ShareMode,
    /// `bsh_…`: the bearer token of the share, shown this once (the server
    /// keeps its SHA-256 only).
    token: String,
    /// Who shared: `owner`, or `user:<subject>`.
    shared_by: String,
    /// Milliseconds since the Unix epoch.
    created_at: i64,
    /// The chat page opening the session with the token in the URL's
    /// fragment, under the server's `--public-url` (by default the address
    /// it listens on; relative, `/#session=…`, when that is every address).
    link: String,
}

/// A session's share links.
#[derive(Serialize, ToSchema)]
#[schema(as = ShareList)]
pub struct ShareList {
    /// Oldest first; revoked ones too (the newest 50 of them).
    shares: Vec<ShareView>,
}

/// Share the session: a link that reads it, or reads and writes
///
/// The owner, or the end user the session belongs to. The answer holds
/// the share's token once; at most 50 live shares a session.
#[utoipa::path(post, path = "/v1/sessions/{id}/shares", tag = "sessions",
    operation_id = "shareSession", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    request_body = ShareBody,
    responses(
        (status = 201, description = "Shared.", body = SharedView),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, description = "A session token or a share link: neither shares.",
            body = inline(Forbidden)),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 409, description = "The session has 50 live shares: revoke one first.",
            body = inline(TooManyShares)),
    ),
)]
pub async fn create(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
    b: Bytes,
) -> ApiResult {
    let b: ShareBody = body(&b)?;
    let mode = b.mode.ok_or_else(|| {
        ServiceError::bad_request("`mode` is required: `read` (read-only) or `write`")
    })?;
    let shared = s
        .service
        .shares()
        .share(&who, &id, NewShare { mode, note: b.note })
        .await?;
    let view = SharedView {
        id: shared.share.id,
        mode: shared.share.mode,
        token: shared.token,
        shared_by: shared.share.shared_by,
        created_at: shared.share.created_at,
        link: shared.link,
    };
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// The session's share links
#[utoipa::path(get, path = "/v1/sessions/{id}/shares", tag = "sessions",
    operation_id = "listShares", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "Every share, live or revoked; never a token.", body = ShareList),
        (status = 401, response = Unauthorized),
        (status = 403, description = "A session token or a share link.", body = inline(Forbidden)),
        (status = 404, description = "No such session.", body = inline(NotFound)),
    ),
)]
pub async fn list(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    _: Authed<door::OwnerOrEndUser>,
) -> ApiResult {
    let shares = s.service.shares().list(&id).await?;
    let shares = shares.into_iter().map(ShareView::from).collect();
    Ok(Json(ShareList { shares }).into_response())
}

/// Revoke one share link
///
/// Its event streams end at once. Revoking it again answers the same.
#[utoipa::path(delete, path = "/v1/sessions/{id}/shares/{share_id}", tag = "sessions",
    operation_id = "revokeShare", security(("ownerToken" = []), ("identityToken" = [])),
    params(
        ("id" = String, Path, description = "The session's id."),
        ("share_id" = String, Path, description = "The share's id (`sh_…`)."),
    ),
    responses(
        (status = 200, description = "Revoked (now or before).", body = ShareView),
        (status = 401, response = Unauthorized),
        (status = 403, description = "A session token or a share link.", body = inline(Forbidden)),
        (status = 404, description = "No such session, or no such share of it.",
            body = inline(NotFound)),
    ),
)]
pub async fn revoke(
    State(s): State<Arc<AppState>>,
    Path((id, share_id)): Path<(String, String)>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
) -> ApiResult {
    let share = s.service.shares().revoke(&who, &id, &share_id).await?;
    Ok(Json(ShareView::from(share)).into_response())
}
