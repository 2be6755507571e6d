//! Requests per minute: the server's (the tenant's API, every client
//! together) and each end user's. Over either, a request is answered 429
//! `rate_limited` with `retry-after`, before any work. Counted by this
//! server (see `bindery_session::rate`): a request another replica
//! forwards here was counted there for the tenant, and is counted here,
//! where its handler runs, for its user.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;
use super::status::ApiError;
use bindery_metrics::RateLimited;
use bindery_session::error::{Code, ErrorKind, ServiceError};
use bindery_session::rate::Limiter;

/// The server's request limits (`--requests-per-minute`,
/// `--per-user-requests-per-minute`); none by default.
#[derive(Debug, Default)]
pub struct RequestRates {
    pub tenant: Option<Limiter>,
    pub per_user: Option<Limiter>,
}

impl RequestRates {
    pub fn new(tenant: Option<u32>, per_user: Option<u32>) -> RequestRates {
        RequestRates {
            tenant: tenant.map(Limiter::new),
            per_user: per_user.map(Limiter::new),
        }
    }
}

/// Probes and scrapes are never limited: a busy tenant must not look
/// dead to its kubelet or blind to its Prometheus.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// The 429 of a limit of `per_minute` that frees up in `retry_after` s.
fn limited(scope: RateLimited, per_minute: u32, retry_after: u64) -> ServiceError {
    let whose = match scope {
        RateLimited::User => "this user's requests",
        _ => "this server's requests",
    };
    let mut e = ServiceError::new(
        ErrorKind::Exhausted,
        Code::RateLimited,
        format!(
            "{whose} are over their rate limit of {per_minute} per minute; \
             send the request again in {retry_after} s"
        ),
    );
    let mut extra = serde_json::Map::new();
    extra.insert("scope".into(), scope.as_str().into());
    extra.insert("limit_per_minute".into(), per_minute.into());
    extra.insert("retry_after".into(), retry_after.into());
    e.extra = Some(Box::new(extra));
    e
}

/// The server's limit, in front of every route but the probes: inside
/// the peers' `admit`, so that a forward it vouched for (counted by the
/// replica the client reached) is not counted twice.
pub async fn tenant(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(limiter) = &state.rates.tenant else {
        return next.run(req).await;
    };
    if exempt(req.uri().path()) || super::peers::vouched(req.headers()).is_some() {
        return next.run(req).await;
    }
    match limiter.take("", state.service.now_ms()) {
        Ok(()) => next.run(req).await,
        Err(retry_after) => {
            state.metrics.rate_limited(RateLimited::Tenant);
            ApiError(limited(
                RateLimited::Tenant,
                limiter.per_minute(),
                retry_after,
            ))
            .into_response()
        }
    }
}

/// End user `subject`'s limit, taken where their request is let in.
pub fn user(state: &AppState, subject: &str) -> Result<(), ServiceError> {
    let Some(limiter) = &state.rates.per_user else {
        return Ok(());
    };
    limiter
        .take(subject, state.service.now_ms())
        .map_err(|retry_after| {
            state.metrics.rate_limited(RateLimited::User);
            limited(RateLimited::User, limiter.per_minute(), retry_after)
        })
}
