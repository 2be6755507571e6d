//! Errors of the session layer: what kind of failure, a stable code, a
//! message that says what to do, and the parameter names concerned. The
//! API edge turns the kind into an HTTP status (and `/mcp` into a JSON-RPC
//! error); nothing here knows HTTP.

use super::validate::ParamsError;
use bindery_store::StoreError;

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed.
    BadRequest,
    /// No valid credential.
    Unauthorized,
    /// The caller may not do this (a pinned value, a sealed session).
    Forbidden,
    /// No such session, token or agent.
    NotFound,
    /// The session's state does not allow it now (a run in progress,
    /// a secret value missing, a spent continuation).
    Conflict,
    /// Values that do not fit what the agent declares.
    Invalid,
    /// A budget is used up: nothing more starts until it frees up.
    Exhausted,
    /// The server's own failure; the log says more.
    Internal,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceError {
    pub kind: ErrorKind,
    pub code: &'static str,
    pub message: String,
    pub params: Vec<String>,
    /// Fields the error's body carries besides `error` and `message` (a
    /// budget's name, limit and use).
    pub extra: Option<Box<serde_json::Map<String, serde_json::Value>>>,
}

impl ServiceError {
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> Self {
        ServiceError {
            kind,
            code,
            message: message.into(),
            params: Vec::new(),
            extra: None,
        }
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::NotFound, "not_found", what)
    }

    pub fn bad_request(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::BadRequest, "bad_request", what)
    }

    pub fn forbidden(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::Forbidden, "forbidden", what)
    }
}

impl From<ParamsError> for ServiceError {
    fn from(e: ParamsError) -> Self {
        ServiceError {
            kind: e.kind(),
            code: e.code(),
            message: e.message(),
            params: e.names().to_vec(),
            extra: None,
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => ServiceError::not_found(format!("no session {id}")),
            StoreError::Conflict(_) => {
                ServiceError::new(ErrorKind::Conflict, "conflict", e.to_string())
            }
            other => {
                tracing::error!("{other}");
                ServiceError::new(
                    ErrorKind::Internal,
                    "internal",
                    "the session store failed; see the server log",
                )
            }
        }
    }
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}
