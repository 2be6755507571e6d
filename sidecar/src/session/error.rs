//! Errors the session API answers with: an HTTP status, a stable code, a
//! message that says what to do, and the parameter names concerned.

use super::store::StoreError;
use super::validate::ParamsError;

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub params: Vec<String>,
}

impl ServiceError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ServiceError {
            status,
            code,
            message: message.into(),
            params: Vec::new(),
        }
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        ServiceError::new(404, "not_found", what)
    }

    pub fn bad_request(what: impl Into<String>) -> Self {
        ServiceError::new(400, "bad_request", what)
    }

    pub fn forbidden(what: impl Into<String>) -> Self {
        ServiceError::new(403, "forbidden", what)
    }
}

impl From<ParamsError> for ServiceError {
    fn from(e: ParamsError) -> Self {
        ServiceError {
            status: e.status(),
            code: e.code(),
            message: e.message(),
            params: e.names().to_vec(),
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => ServiceError::not_found(format!("no session {id}")),
            StoreError::Conflict(_) => ServiceError::new(409, "conflict", e.to_string()),
            other => {
                tracing::error!("{other}");
                ServiceError::new(
                    500,
                    "internal",
                    "the session store failed; see the server log",
                )
            }
        }
    }
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}
