//! What the tenant's runs used: `GET /v1/usage` sums the store's usage
//! rows over a time range by agent, session, tool, model or end user, as JSON or as
//! CSV for a spreadsheet. The owner only: a session's id and its agent are
//! the tenant's business.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::auth::{door, Authed};
use super::openapi::{BadRequest, Unauthorized};
use super::state::AppState;
use super::status::ApiResult;
use super::views::rfc3339;
use bindery_session::error::ServiceError;
use bindery_store::usage::{report_csv, Group, ReportRow};

/// How far back a report goes when `from` is not given: 30 days.
const DEFAULT_SPAN_MS: i64 = 30 * 86_400_000;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the range, RFC 3339 (default: 30 days before `to`).
    #[param(format = DateTime)]
    from: Option<String>,
    /// End of the range, excluded, RFC 3339 (default: now).
    #[param(format = DateTime)]
    to: Option<String>,
    /// What rows are summed by (default `agent`). By `tool`, the model
    /// requests are one row with a null key; by `user` (the end user's
    /// subject), the use of sessions of no end user is.
    #[param(inline)]
    group_by: Option<Group>,
}

/// `GET /v1/usage`'s JSON answer: the type the handler answers with, so
/// the document and the answer cannot drift apart.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct UsageReport {
    #[schema(format = DateTime)]
    from: String,
    #[schema(format = DateTime)]
    to: String,
    #[schema(inline)]
    group_by: Group,
    /// The currency of `cost` (the agents' pricing); `mixed` when agents
    /// are priced in different ones, null when none is priced.
    currency: Option<String>,
    /// Largest total tokens first.
    rows: Vec<ReportRow>,
}

/// `s` as milliseconds since the epoch (a time before 1970 as 0, since
/// nothing was used then), or a 400 naming `name`.
fn instant(name: &str, s: &str) -> Result<i64, ServiceError> {
    let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|_| {
        ServiceError::bad_request(format!(
            "`{name}` is an RFC 3339 time such as 2026-12-01T00:00:00Z"
        ))
    })?;
    Ok(t.timestamp_millis().max(0))
}

/// What runs used
///
/// Tokens (prompt, completion, and how many of them were estimated because
/// the model reported none), model requests, tool calls and cost, summed
/// over `[from, to)` by `group_by`. `Accept: text/csv` gives the same rows
/// as CSV. The owner only.
#[utoipa::path(get, path = "/v1/usage", tag = "usage", operation_id = "getUsage",
    security(("ownerToken" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "The sums, by group (CSV for `Accept: text/csv`).",
            content((inline(UsageReport) = "application/json"), (String = "text/csv"))),
        (status = 400, description = "A time that does not read.", body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
    ),
)]
pub async fn report(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<UsageQuery>,
    _: Authed<door::Owner>,
) -> ApiResult {
    let to = match &q.to {
        Some(t) => instant("to", t)?,
        None => s.service.now_ms(),
    };
    let from = match &q.from {
        Some(f) => instant("from", f)?,
        None => to.saturating_sub(DEFAULT_SPAN_MS),
    };
    // `from` after `to`: an empty range, which holds nothing.
    let group = q.group_by.unwrap_or(Group::Agent);
    let rows = s.service.store().report(from, to, group).await?;
    let currency = s.service.budgets().pricing_currency();
    let csv = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/csv"));
    if csv {
        let body = report_csv(group, &rows, currency.as_deref().unwrap_or(""));
        return Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response());
    }
    Ok(Json(UsageReport {
        from: rfc3339(from),
        to: rfc3339(to),
        group_by: group,
        currency,
        rows,
    })
    .into_response())
}
