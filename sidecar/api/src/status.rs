//! The HTTP status of each kind of session-layer error: the one place the
//! two meet (REST answers with it; `/mcp` puts it in an error's `data`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use bindery_session::error::{Code, ErrorKind, ServiceError};

pub fn of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Exhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// What a 503 tells a client to wait before it tries again: about a
/// heartbeat, when readiness next looks at the store.
pub const RETRY_AFTER_SECS: u64 = 5;

/// A session-layer error as a REST answer: its status, and a body naming
/// the error's code, its message, the parameters it concerns and whatever
/// else it carries (a budget's numbers).
#[derive(Debug)]
pub struct ApiError(pub ServiceError);

/// What a handler answers: its response, or the error's.
pub type ApiResult = Result<Response, ApiError>;

impl<E: Into<ServiceError>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = of(e.kind);
        let mut body = json!({"error": e.code, "message": e.message});
        if !e.params.is_empty() || e.code.refuses_values() || e.code == Code::ParamsRequired {
            body["params"] = json!(e.params);
        }
        for (k, v) in e.extra.into_iter().flat_map(|m| *m) {
            body[k] = v;
        }
        // A 429 that knows when room frees up says so in the header too.
        let retry_after = match e.kind {
            ErrorKind::Unavailable => Some(RETRY_AFTER_SECS),
            ErrorKind::Exhausted => body.get("retry_after").and_then(|v| v.as_u64()),
            _ => None,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statuses_the_api_promises() {
        // The validation table's codes (docs/session-api.md, /openapi.json).
        assert_eq!(of(ErrorKind::Invalid).as_u16(), 422);
        assert_eq!(of(ErrorKind::Forbidden).as_u16(), 403);
        assert_eq!(of(ErrorKind::Conflict).as_u16(), 409);
        assert_eq!(of(ErrorKind::Unauthorized).as_u16(), 401);
        assert_eq!(of(ErrorKind::NotFound).as_u16(), 404);
        assert_eq!(of(ErrorKind::Exhausted).as_u16(), 429);
        assert_eq!(of(ErrorKind::Unavailable).as_u16(), 503);
    }

    #[test]
    fn a_429_that_knows_when_room_frees_up_says_so_in_its_header() {
        let mut e = ServiceError::new(ErrorKind::Exhausted, Code::TooManyRuns, "busy");
        let mut extra = serde_json::Map::new();
        extra.insert("retry_after".into(), 7.into());
        e.extra = Some(Box::new(extra));
        let r = ApiError(e).into_response();
        assert_eq!(r.status().as_u16(), 429);
        assert_eq!(r.headers()["retry-after"], "7");
        let bare = ServiceError::new(ErrorKind::Exhausted, Code::BudgetExceeded, "used up");
        assert!(!ApiError(bare)
            .into_response()
            .headers()
            .contains_key("retry-after"));
    }

    #[test]
    fn an_unavailable_store_answers_503_with_retry_after() {
        let e = ServiceError::from(bindery_store::StoreError::Unavailable("down".into()));
        let r = ApiError(e).into_response();
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(
            r.headers()["retry-after"],
            RETRY_AFTER_SECS.to_string().as_str()
        );
    }
}
