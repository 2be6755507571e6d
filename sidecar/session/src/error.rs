//! Errors of the session layer: what kind of failure, a stable code, a
//! message that says what to do, and the parameter names concerned. The
//! API edge turns the kind into an HTTP status (and `/mcp` into a JSON-RPC
//! error); nothing here knows HTTP.

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
    /// Something the server needs is out for now (its store): the same
    /// request may succeed later.
    Unavailable,
}

/// What went wrong, as a client tells it apart: each code's wire name is
/// the `error` of an API error body (docs/session-api.md lists them), and
/// never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    Internal,
    /// Parameters the agent does not declare.
    UnknownParams,
    /// Parameters this caller may not set.
    ForbiddenParams,
    /// Values that do not fit what the agent declares.
    InvalidParams,
    /// Required parameters left without a value.
    ParamsRequired,
    RunInProgress,
    NotRunning,
    /// The session waits for answers to pending calls.
    WaitingExternal,
    ContinuationUsed,
    ContinuationExpired,
    CallChanged,
    BudgetExceeded,
    /// A forward would carry a secret value over plain HTTP.
    PeerTlsRequired,
    StoredAgentsDisabled,
    InvalidAgent,
    AgentExists,
    /// The session store does not answer for now: retry later.
    StoreUnavailable,
    /// A resume of a session whose last run answered.
    NothingToResume,
    /// The server is stopping and starts no new run: retry (elsewhere).
    ServerStopping,
    /// The identity provider's keys cannot be fetched: retry later.
    IdentityUnavailable,
    /// An end user has as many runs in progress as a user may have at once.
    TooManyRuns,
    /// Requests (or a tool's calls) over their rate limit.
    RateLimited,
    /// A session has as many live share links as it may have.
    TooManyShares,
}

impl Code {
    /// The code as the API's error bodies spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad_request",
            Code::Unauthorized => "unauthorized",
            Code::Forbidden => "forbidden",
            Code::NotFound => "not_found",
            Code::Conflict => "conflict",
            Code::Internal => "internal",
            Code::UnknownParams => "unknown_params",
            Code::ForbiddenParams => "forbidden_params",
            Code::InvalidParams => "invalid_params",
            Code::ParamsRequired => "params_required",
            Code::RunInProgress => "run_in_progress",
            Code::NotRunning => "not_running",
            Code::WaitingExternal => "waiting_external",
            Code::ContinuationUsed => "continuation_used",
            Code::ContinuationExpired => "continuation_expired",
            Code::CallChanged => "call_changed",
            Code::BudgetExceeded => "budget_exceeded",
            Code::PeerTlsRequired => "peer_tls_required",
            Code::StoredAgentsDisabled => "stored_agents_disabled",
            Code::InvalidAgent => "invalid_agent",
            Code::AgentExists => "agent_exists",
            Code::StoreUnavailable => "store_unavailable",
            Code::NothingToResume => "nothing_to_resume",
            Code::ServerStopping => "server_stopping",
            Code::IdentityUnavailable => "identity_unavailable",
            Code::TooManyRuns => "too_many_runs",
            Code::RateLimited => "rate_limited",
            Code::TooManyShares => "too_many_shares",
        }
    }

    /// A code about given values (`unknown_params`, `forbidden_params`,
    /// `invalid_params`): its body always names them.
    pub const fn refuses_values(self) -> bool {
        matches!(
            self,
            Code::UnknownParams | Code::ForbiddenParams | Code::InvalidParams
        )
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceError {
    pub kind: ErrorKind,
    pub code: Code,
    pub message: String,
    pub params: Vec<String>,
    /// Fields the error's body carries besides `error` and `message` (a
    /// budget's name, limit and use).
    pub extra: Option<Box<serde_json::Map<String, serde_json::Value>>>,
}

impl ServiceError {
    pub fn new(kind: ErrorKind, code: Code, message: impl Into<String>) -> Self {
        ServiceError {
            kind,
            code,
            message: message.into(),
            params: Vec::new(),
            extra: None,
        }
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::NotFound, Code::NotFound, what)
    }

    pub fn bad_request(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::BadRequest, Code::BadRequest, what)
    }

    pub fn forbidden(what: impl Into<String>) -> Self {
        ServiceError::new(ErrorKind::Forbidden, Code::Forbidden, what)
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => ServiceError::not_found(format!("no session {id}")),
            StoreError::Conflict(_) => {
                ServiceError::new(ErrorKind::Conflict, Code::Conflict, e.to_string())
            }
            StoreError::Unavailable(_) => {
                tracing::warn!("{e}");
                ServiceError::new(
                    ErrorKind::Unavailable,
                    Code::StoreUnavailable,
                    "the session store does not answer for now; retry later (the server's log says why)",
                )
            }
            StoreError::Corrupt(_) => {
                tracing::error!("{e}; repair or restore the store, then restart the server");
                ServiceError::new(
                    ErrorKind::Internal,
                    Code::Internal,
                    "the session store is damaged; see the server log",
                )
            }
            other => {
                tracing::error!("{other}");
                ServiceError::new(
                    ErrorKind::Internal,
                    Code::Internal,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An outage is retryable and says so; damage and other failures are
    /// the server's, and their text (which names files) stays in the log.
    #[test]
    fn each_kind_of_store_failure_is_its_own_answer() {
        let of = |e: StoreError| {
            let s = ServiceError::from(e);
            (s.kind, s.code, s.message)
        };
        let (kind, code, message) = of(StoreError::Unavailable("/data/s.db: locked".into()));
        assert_eq!(
            (kind, code),
            (ErrorKind::Unavailable, Code::StoreUnavailable)
        );
        assert!(message.contains("retry later") && !message.contains("/data"));
        let (kind, code, message) = of(StoreError::Corrupt("/data/s.db: page 7".into()));
        assert_eq!((kind, code), (ErrorKind::Internal, Code::Internal));
        assert!(message.contains("damaged") && !message.contains("/data"));
        let (kind, code, _) = of(StoreError::Backend("boom".into()));
        assert_eq!((kind, code), (ErrorKind::Internal, Code::Internal));
    }
}
