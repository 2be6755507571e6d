//! Forwarding to the replica that holds a session: one layer in front of
//! every route about a session.
//!
//! Replicas on a shared store keep some of a session in memory only: its
//! secret values (the holder's), and while a run goes on, its `delta`
//! events (the runner's). A request about a session that another live
//! replica holds this way is sent there ([`to_holder`]) and answered by it,
//! whatever it asks: the view (whose `secret_params` are the names the
//! holder holds), a message, a resume, a fork, new values, a cancel, a
//! revocation, an answer to a pending item, the event stream, or an `/mcp`
//! call that names the session. The forward is signed for its one request
//! (`api/peers.rs`) and carries the caller this replica found; the holder
//! checks the door as if the client had come to it.
//!
//! When it forwards:
//! - only on a shared store: on the embedded SQLite store nothing is held
//!   elsewhere, and the layer reads nothing, not even the request;
//! - never a request that is a forward already (no loops): it is served
//!   where it landed;
//! - not when this replica runs the session's run or holds secret values
//!   of it itself (read from memory);
//! - only for a caller this replica recognised (the owner, the approver, a
//!   session token or a live share of that session; an answer link stands for the
//!   approver): anyone else is refused here, as before. An `/mcp` body is
//!   read (to find the session a call names) only for the owner token or
//!   a session token with its session named;
//! - an `/mcp` batch goes whole to the holder of the one session its calls
//!   name (a session token's: its own session, the only one it may act
//!   on); an owner's batch whose calls name several sessions, one of them
//!   held by another live replica, is refused (400, saying which): one
//!   POST reaches one replica, and served here those calls would run
//!   without the values their holder keeps;
//! - only to a live replica that advertises an address (a heartbeat within
//!   the lease), read with the session's record: the one read the check
//!   costs, which a session token's check would make anyway (the handler
//!   takes the caller found then, and reads nothing for it);
//! - a request that carries a secret value only over mutual TLS: over
//!   plain HTTP it is refused with 409 `peer_tls_required`; a holder that
//!   takes forwards over TLS when this replica has no `--peer-tls-dir`, or
//!   a holder that cannot be reached or refuses the signature (a replica of
//!   another version), leaves the request to be served here, as if it held
//!   nothing; so does one whose heartbeat lapses before it answers (a
//!   server frozen or cut off: its lease passed, so its memory counts as
//!   gone).
//!
//! A revocation answered by the holder also ends the streams this replica
//! serves of that session with what it revoked: the session tokens and
//! shares (`DELETE …/token`, 204), or the one share (`DELETE
//! …/shares/{share_id}`, 200).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::{path_session, Identified, Identity, TokenCheck};
use super::peers::{forward, is_forwarded, secret_values_in, tls_required, Incoming};
use super::state::AppState;
use bindery_session::validate::Caller;
use bindery_store::model::SessionRecord;

/// What an answer of the holder to a forwarded revocation also ends here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ends {
    Nothing,
    /// `DELETE …/token` (204): the session-token and share streams.
    Tokens,
    /// `DELETE …/shares/{share_id}` (200): that share's streams.
    Share,
}

/// What a route is about, as far as forwarding goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum About {
    /// The session in the path (`/v1/sessions/{id}…`) or named by the
    /// continuation token in it (`/v1/continuations/{token}`); `values`:
    /// the body's fields that carry parameter values.
    Session { values: &'static [&'static str] },
    /// An answer link (`/v1/approvals/{token}`): the token is the only
    /// credential, and a forward of it goes as the approver's.
    Link,
    /// `POST /mcp`: the session a call names, if it names one.
    Mcp,
}

/// The routes about a session.
fn about(method: &Method, path: &str) -> Option<(About, Ends)> {
    const NONE: &[&str] = &[];
    const PARAMS: &[&str] = &["params"];
    let session = |values| Some((About::Session { values }, Ends::Nothing));
    match (method.as_str(), path) {
        ("GET", "/v1/sessions/{id}") => session(NONE),
        ("POST", "/v1/sessions/{id}/messages") => session(PARAMS),
        ("POST", "/v1/sessions/{id}/resume") => session(PARAMS),
        ("POST", "/v1/sessions/{id}/cancel") => session(NONE),
        // The copy takes the source's values: where they are.
        ("POST", "/v1/sessions/{id}/fork") => session(&["params", "pin"]),
        ("PUT", "/v1/sessions/{id}/params") => session(PARAMS),
        ("DELETE", "/v1/sessions/{id}/token") => {
            Some((About::Session { values: NONE }, Ends::Tokens))
        }
        // Shares are in the record; a revocation goes where the session's
        // streams are served.
        ("POST" | "GET", "/v1/sessions/{id}/shares") => session(NONE),
        ("DELETE", "/v1/sessions/{id}/shares/{share_id}") => {
            Some((About::Session { values: NONE }, Ends::Share))
        }
        // `delta` events exist only where the run is.
        ("GET", "/v1/sessions/{id}/events") => session(NONE),
        ("POST", "/v1/continuations/{token}") => session(PARAMS),
        ("POST", "/v1/approvals/{token}") => Some((About::Link, Ends::Nothing)),
        ("POST", "/mcp") => Some((About::Mcp, Ends::Nothing)),
        _ => None,
    }
}

/// In front of every route: a request about a session that another live
/// replica holds is answered by that replica (see the module's doc).
pub async fn to_holder(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !s.service.store().shared() || is_forwarded(req.headers()) {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| about(req.method(), p.as_str()));
    let Some((about, ends)) = route else {
        return next.run(req).await;
    };
    let (mut parts, body) = req.into_parts();
    let mut body = Some(body);
    // The request's body, once read.
    let mut read: Option<Bytes> = None;
    // The share a revocation names, from the path.
    let mut share_id = None;
    let (session, mcp) = match about {
        About::Mcp => {
            // `/mcp` reads no body before it knows its caller: only the
            // owner's or a session token's call can be forwarded.
            let owner = is_owner(&s, &parts);
            if !may_name_a_session(owner, &parts) {
                return next.run(rebuilt(parts, read, body)).await;
            }
            let bytes = match read_body(&parts, body.take()).await {
                Ok(b) => b,
                Err(refused) => return refused,
            };
            let message: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
            read = Some(bytes);
            let mut named = message
                .as_ref()
                .map(|m| super::mcp::sessions_named(&parts.headers, m))
                .unwrap_or_default();
            if !owner {
                // A session token acts on its own session only: the calls
                // of a batch that name another are refused wherever it is
                // served, so they do not keep the rest from its holder.
                let own = super::mcp::token_session_header(&parts.headers);
                named.retain(|id| Some(id) == own.as_ref());
            }
            match named.as_slice() {
                [] => return next.run(rebuilt(parts, read, body)).await,
                [one] => (one.clone(), message),
                several => {
                    if let Some(refused) = held_apart(&s, several).await {
                        return refused;
                    }
                    return next.run(rebuilt(parts, read, body)).await;
                }
            }
        }
        _ => {
            let params = RawPathParams::from_request_parts(&mut parts, &s).await;
            if let Ok(params) = &params {
                share_id = params
                    .iter()
                    .find(|(name, _)| *name == "share_id")
                    .map(|(_, v)| v.to_string());
            }
            match params.ok().as_ref().and_then(path_session) {
                Some(id) => (id, None),
                None => return next.run(rebuilt(parts, read, body)).await,
            }
        }
    };
    if s.service.secrets().holds_here(&session) {
        return next.run(rebuilt(parts, read, body)).await;
    }
    let rec = match s.service.store().get(&session).await {
        Ok(rec) => rec,
        // The handler reads it again, and says what went wrong.
        Err(_) => return next.run(rebuilt(parts, read, body)).await,
    };
    let who = match about {
        About::Link => Identity::Approver,
        About::Mcp => {
            // A session token names its session in a header.
            let named = super::mcp::token_session_header(&parts.headers);
            // The record read is that of the session the call names: a
            // token of another one is checked in the store, as `Who` would.
            let check = match named.as_deref() == Some(session.as_str()) {
                true => TokenCheck::Read(rec.as_ref()),
                false => TokenCheck::Store,
            };
            let who = s
                .identify_with(&parts.headers, named.as_deref(), check)
                .await;
            parts.extensions.insert(Identified {
                session: named,
                identity: who.clone(),
            });
            match who {
                Identity::Owner => who,
                Identity::Session(ref id) if *id == session => who,
                _ => Identity::Anonymous,
            }
        }
        About::Session { .. } => {
            let who = s
                .identify_with(
                    &parts.headers,
                    Some(&session),
                    TokenCheck::Read(rec.as_ref()),
                )
                .await;
            parts.extensions.insert(Identified {
                session: Some(session.clone()),
                identity: who.clone(),
            });
            who
        }
    };
    let (Some(caller), Some(rec)) = (who.caller(), rec) else {
        return next.run(rebuilt(parts, read, body)).await;
    };
    let Some(to) = s.service.secrets().held_elsewhere(&rec).await else {
        return next.run(rebuilt(parts, read, body)).await;
    };
    let bytes = match read {
        Some(b) => b,
        None => match read_body(&parts, body.take()).await {
            Ok(b) => b,
            Err(refused) => return refused,
        },
    };
    let (instance, to) = (to.instance, to.address);
    let tls = to.starts_with("https://");
    // A person's identity token is a bearer credential: it crosses the pod
    // network over the peers' mutual TLS only. In clear, the forward names
    // them and nothing more (a run it starts has none of their values, as
    // one without their token).
    let caller = match caller {
        Caller::EndUser(person) if !tls => {
            Caller::EndUser(bindery_identity::Person::named(person.subject))
        }
        other => other,
    };
    let client = if tls {
        let Some(client) = &s.peers_tls else {
            tracing::warn!(session = %session, peer = %to, "cannot forward a request to the server holding the session: it takes forwards over TLS, and this server has no --peer-tls-dir");
            return next.run(rebuilt(parts, Some(bytes), None)).await;
        };
        client
    } else {
        let secrets = secret_values(&s, &rec, about, &parts, &bytes, mcp.as_ref());
        if !secrets.is_empty() {
            let e = tls_required(secrets);
            return match &mcp {
                Some(message) => super::mcp::refusal(message, e),
                None => super::status::ApiError(e).into_response(),
            };
        }
        &s.peers
    };
    let incoming = Incoming {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: bytes.clone(),
    };
    let key = s.owner.peer_key();
    let answer = tokio::select! {
        answer = forward(client, &key, (&instance, &to), &caller, &incoming) => answer,
        () = s.service.secrets().lapsed(&instance) => Err(super::peers::ForwardError::Lapsed),
    };
    match answer {
        Ok(answer) => {
            match (ends, share_id) {
                (Ends::Tokens, _) if answer.status() == StatusCode::NO_CONTENT => {
                    s.service.tokens().end_streams(&session);
                }
                (Ends::Share, Some(share)) if answer.status() == StatusCode::OK => {
                    s.service.shares().end_streams(&session, &share);
                }
                _ => {}
            }
            answer
        }
        Err(why) => {
            tracing::warn!(session = %session, peer = %to, "cannot forward a request to the server holding the session: {why}");
            next.run(rebuilt(parts, Some(bytes), None)).await
        }
    }
}

/// Whether an `/mcp` POST's credentials are the owner token or a session
/// token with its session named (checked for good later), the only callers
/// whose calls name a session (`owner`: [`is_owner`]).
fn may_name_a_session(owner: bool, parts: &Parts) -> bool {
    owner
        || (super::auth::bearer(&parts.headers).is_some_and(|t| t.starts_with("st_"))
            && super::mcp::token_session_header(&parts.headers).is_some())
}

/// Whether an `/mcp` POST's bearer token is the owner's.
fn is_owner(s: &AppState, parts: &Parts) -> bool {
    super::auth::bearer(&parts.headers).is_some_and(|t| s.owner.matches(t))
}

/// An owner's batch whose calls name several sessions: one POST goes to one
/// replica, so when another live replica holds one of them, the batch is
/// refused whole, saying which (served here, those calls would run
/// without the values their holder keeps). `None`: none is held
/// elsewhere, and the batch is served here.
async fn held_apart(s: &AppState, sessions: &[String]) -> Option<Response> {
    let mut elsewhere = Vec::new();
    for id in sessions {
        if s.service.secrets().holds_here(id) {
            continue;
        }
        // A session that cannot be read is the handler's to report.
        let Ok(Some(rec)) = s.service.store().get(id).await else {
            continue;
        };
        if s.service.secrets().held_elsewhere(&rec).await.is_some() {
            elsewhere.push(format!("`{id}`"));
        }
    }
    if elsewhere.is_empty() {
        return None;
    }
    Some(super::mcp::batch_refused(format!(
        "this batch's calls name {} sessions, and {} {} held by another server: \
         send each session's calls in a POST of their own, which reaches the server that holds it",
        sessions.len(),
        elsewhere.join(", "),
        if elsewhere.len() == 1 { "is" } else { "are" },
    )))
}

/// The request again, with the body as read (or as it came).
fn rebuilt(parts: Parts, read: Option<Bytes>, body: Option<Body>) -> Request {
    let body = match read {
        Some(bytes) => Body::from(bytes),
        None => body.unwrap_or_default(),
    };
    Request::from_parts(parts, body)
}

/// The body, read as a handler reads it (its limit, its refusal).
async fn read_body(parts: &Parts, body: Option<Body>) -> Result<Bytes, Response> {
    let mut req = Request::new(body.unwrap_or_default());
    *req.headers_mut() = parts.headers.clone();
    Bytes::from_request(req, &())
        .await
        .map_err(IntoResponse::into_response)
}

/// The names of the secret values a request gives for session `rec`'s
/// agent (every value it gives when the agent is not known here: none may
/// go in clear by mistake).
fn secret_values(
    s: &AppState,
    rec: &SessionRecord,
    about: About,
    parts: &Parts,
    body: &[u8],
    mcp: Option<&serde_json::Value>,
) -> Vec<String> {
    let agent = s.service.agents().find(&rec.agent).map(|(a, _)| a);
    let secret = |name: &str| {
        agent
            .as_ref()
            .is_none_or(|a| a.params.decl(name).is_none_or(|d| d.secret))
    };
    match (about, mcp) {
        (About::Session { values }, _) => secret_values_in(body, values, secret),
        (About::Link, _) => secret_values_in(body, &["params"], secret),
        (About::Mcp, Some(message)) => super::mcp::values_named(&parts.headers, message)
            .into_iter()
            .filter(|n| secret(n))
            .collect(),
        (About::Mcp, None) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route about a session is forwarded: each operation of the
    /// document whose path names a session or a pending item's token, and
    /// `/mcp`; nothing else is.
    #[test]
    fn every_route_about_a_session_is_in_the_layer() {
        let doc = super::super::server::document();
        let mut covered = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
                let about_a_session = path.starts_with("/v1/sessions/{id}")
                    || path.ends_with("/{token}")
                    || path == "/mcp";
                assert_eq!(
                    about(&m, path).is_some(),
                    about_a_session,
                    "{method} {path}"
                );
                if about_a_session {
                    covered.push(format!("{method} {path}"));
                }
            }
        }
        assert_eq!(covered.len(), 14, "{covered:?}");
    }
}
