//! Who is calling: the owner (bearer of the owner token) or the holder of a
//! session token, which opens exactly four doors of its own session.

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::params::secret::constant_time_eq;
use crate::session::error::{ErrorKind, ServiceError};
use crate::session::service::Service;
use crate::session::validate::Caller;

/// What a route lets a session-token holder do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// Owner only.
    OwnerOnly,
    /// Read the session, post a message, read its events, cancel a run.
    SessionToken,
    /// Pending approvals and their answers: the owner, the approver, and a
    /// session token of the session the route names (which may read
    /// pending items but never answers one).
    Approvals,
}

pub struct OwnerToken {
    digest: [u8; 32],
}

impl OwnerToken {
    pub fn new(token: &str) -> Self {
        OwnerToken {
            digest: Sha256::digest(token.trim().as_bytes()).into(),
        }
    }

    /// The key continuation tokens derive from: servers that share the
    /// owner token (replicas) show the same tokens.
    pub fn continuation_key(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(b"bindery continuation tokens\0")
            .chain_update(self.digest)
            .finalize()
            .into()
    }

    /// The key the servers sharing the owner token (replicas) sign the
    /// requests they forward to each other with (`api/peers.rs`).
    pub fn peer_key(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(b"bindery peer request signatures\0")
            .chain_update(self.digest)
            .finalize()
            .into()
    }

    /// Whether `presented` is this token (in constant time).
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        constant_time_eq(&d, &self.digest)
    }
}

pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

pub fn unauthorized(msg: &str) -> ServiceError {
    ServiceError::new(ErrorKind::Unauthorized, "unauthorized", msg)
}

fn approver_only() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        "forbidden",
        "an approver token lists pending approvals (GET /v1/approvals) and answers them (POST /v1/continuations/:token); nothing else",
    )
}

fn session_token_only() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        "forbidden",
        "a session token can read the session and its events, post messages and cancel a run; nothing else",
    )
}

/// The tokens the server takes besides session tokens.
pub struct Tokens<'a> {
    pub owner: &'a OwnerToken,
    pub approver: Option<&'a OwnerToken>,
}

/// The caller of a request on `session` (when the route names one) through `door`.
pub async fn caller(
    headers: &HeaderMap,
    tokens: Tokens<'_>,
    service: &Service,
    session: Option<&str>,
    door: Door,
) -> Result<Caller, ServiceError> {
    let owner = tokens.owner;
    // Forwarded by a replica, which checked the client's own credentials
    // (its signature was checked in front of the route).
    if let Some(vouched) = super::peers::vouched(headers) {
        return match vouched? {
            Caller::Owner => Ok(Caller::Owner),
            Caller::SessionToken(id) if session != Some(id.as_str()) => {
                Err(unauthorized("the token is not valid here"))
            }
            Caller::SessionToken(_) if door == Door::OwnerOnly => Err(session_token_only()),
            Caller::Approver if door != Door::Approvals => Err(approver_only()),
            who => Ok(who),
        };
    }
    let Some(token) = bearer(headers) else {
        return Err(unauthorized("send `Authorization: Bearer <token>`"));
    };
    if owner.matches(token) {
        return Ok(Caller::Owner);
    }
    if tokens.approver.is_some_and(|a| a.matches(token)) {
        return match door {
            Door::Approvals => Ok(Caller::Approver),
            _ => Err(approver_only()),
        };
    }
    // A session token is honoured only on its own session's routes; anywhere
    // else it is as good as no token, so it cannot be used to probe.
    if let (Some(id), true) = (session, token.starts_with("st_")) {
        if service.token_matches(id, token).await {
            return match door {
                Door::SessionToken | Door::Approvals => Ok(Caller::SessionToken(id.to_string())),
                Door::OwnerOnly => Err(session_token_only()),
            };
        }
    }
    Err(unauthorized("the token is not valid here"))
}
