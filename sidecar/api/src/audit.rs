//! The tenant's audit log: `GET /v1/audit` hands out its records as JSON
//! lines, in seq order, each exactly as the store sealed it; every answer
//! names the log's head (its last record's seq and hash) in headers, the
//! anchor `bindery-sidecar audit verify --head` checks an export against.
//! The owner only.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::IntoResponse;
use serde::Deserialize;

use super::auth::{door, Authed};
use super::openapi::{BadRequest, Unauthorized};
use super::state::AppState;
use super::status::ApiResult;
use bindery_session::error::ServiceError;
use bindery_store::audit::GENESIS;

/// Records an answer holds when `limit` is not given, and at most.
const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;

/// The log's last record's seq when the answer was read (0: empty).
pub const HEAD_SEQ: HeaderName = HeaderName::from_static("bindery-audit-head-seq");
/// The log's last record's hash then (the genesis: empty).
pub const HEAD_HASH: HeaderName = HeaderName::from_static("bindery-audit-head-hash");

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Records with a greater seq (default 0: from the first).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// At most this many records (default 1000, at most 10000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
}

/// The audit log
///
/// Every decision that granted or used authority (a session created, a
/// message posted, a tool called with which credentials, a pending call
/// answered, a budget overridden, a stored agent changed, …), one
/// hash-chained record a line, in seq order (docs/audit.md). The headers
/// `Bindery-Audit-Head-Seq` and `Bindery-Audit-Head-Hash` name the log's
/// last record when the answer was read: keep them apart from the store,
/// as the anchor `bindery-sidecar audit verify --head` checks an export
/// against. The owner only.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", operation_id = "getAudit",
    security(("ownerToken" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "The records after `after`, one JSON object a line.",
            content((String = "application/jsonl")),
            headers(
                ("Bindery-Audit-Head-Seq" = i64, description = "The log's last seq (0: empty)."),
                ("Bindery-Audit-Head-Hash" = String, description = "The log's last record's hash."),
            )),
        (status = 400, description = "`after` or `limit` out of range.", body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
    ),
)]
pub async fn export(
    State(s): State<Arc<AppState>>,
    Query(q): Query<AuditQuery>,
    _: Authed<door::Owner>,
) -> ApiResult {
    let after = q.after.unwrap_or(0);
    if after < 0 {
        return Err(ServiceError::bad_request("`after` is a seq: 0 or more").into());
    }
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ServiceError::bad_request(format!(
            "`limit` is from 1 to {MAX_LIMIT}; page with `after` (the last seq read)"
        ))
        .into());
    }
    let store = s.service.store();
    // The head first: the records read after it reach it at least.
    let head = store.audit_head().await.map_err(ServiceError::from)?;
    let records = store
        .audit_after(after, limit)
        .await
        .map_err(ServiceError::from)?;
    let mut body = String::with_capacity(records.iter().map(|r| r.line.len() + 1).sum());
    for r in &records {
        body.push_str(&r.line);
        body.push('\n');
    }
    let (seq, hash) = head.map_or((0, GENESIS.to_string()), |h| (h.seq, h.hash));
    let value = |s: String| HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static(""));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/jsonl"),
            ),
            (HEAD_SEQ, value(seq.to_string())),
            (HEAD_HASH, value(hash)),
        ],
        body,
    )
        .into_response())
}
