//! The HTTP status of each kind of session-layer error: the one place the
//! two meet (REST answers with it; `/mcp` puts it in an error's `data`).

use axum::http::StatusCode;

use crate::session::error::ErrorKind;

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
    }
}
