//! Replicas on a shared store forward to each other the requests that need
//! what lives in one server's memory only: a session's secret values, its
//! run's `delta` events. The server a client reached checks the client's
//! credentials; the forward carries the caller it found, vouched for by a
//! credential derived from the owner token every replica shares, and is
//! served as if it came directly, never forwarded again.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderName, Method, Uri};
use axum::response::{IntoResponse, Response};

use crate::session::error::{ErrorKind, ServiceError};
use crate::session::pending::hmac;
use crate::session::validate::Caller;

/// The peer credential: from a server of the same tenant, never a client.
pub const PEER_HEADER: &str = "x-bindery-peer";
/// The caller the forwarding server authenticated (`owner`, `session:ID`).
pub const CALLER_HEADER: &str = "x-bindery-peer-caller";

/// What a client's request passes on to a peer.
const PASSED: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    HeaderName::from_static("last-event-id"),
];

fn caller_name(who: &Caller) -> String {
    match who {
        Caller::Owner => "owner".into(),
        Caller::SessionToken(id) => format!("session:{id}"),
    }
}

/// The credential vouching for `caller`: bound to it, so one seen for a
/// session token's holder does not make its bearer the owner.
fn credential(key: &[u8; 32], caller: &str) -> String {
    hex::encode(hmac(key, format!("bindery peer\n{caller}").as_bytes()))
}

/// Whether a request says it comes from a peer (then it is served here,
/// whatever it needs).
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(PEER_HEADER)
}

/// The caller a peer vouches for; `None` when the request does not claim to
/// come from one. A claim whose credential does not match is refused: a
/// client cannot pose as a peer.
pub fn vouched(headers: &HeaderMap, key: &[u8; 32]) -> Option<Result<Caller, ServiceError>> {
    let presented = headers.get(PEER_HEADER)?;
    let refused = || {
        Err(ServiceError::new(
            ErrorKind::Unauthorized,
            "unauthorized",
            format!("`{PEER_HEADER}` is for the servers of one tenant forwarding to each other; a client sends `Authorization: Bearer <token>` only"),
        ))
    };
    let Some(name) = headers.get(CALLER_HEADER).and_then(|v| v.to_str().ok()) else {
        return Some(refused());
    };
    let expected = credential(key, name);
    let matches = presented.as_bytes().len() == expected.len()
        && presented
            .as_bytes()
            .iter()
            .zip(expected.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !matches {
        return Some(refused());
    }
    Some(match name.strip_prefix("session:") {
        None if name == "owner" => Ok(Caller::Owner),
        Some(id) if !id.is_empty() => Ok(Caller::SessionToken(id.to_string())),
        _ => refused(),
    })
}

/// A client's request as a peer would get it, if it has to be forwarded
/// (an extractor: a route that may forward takes it instead of the body).
pub struct Incoming {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl<S: Send + Sync> FromRequest<S> for Incoming {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let method = req.method().clone();
        let uri = req.uri().clone();
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Incoming {
            method,
            uri,
            headers,
            body,
        })
    }
}

/// Send a client's request to the peer at `to` (`http://HOST:PORT`) on
/// behalf of `who`, and stream its answer back as it comes (an event
/// stream stays open). `Err`: the peer could not be reached.
pub async fn forward(
    client: &reqwest::Client,
    key: &[u8; 32],
    to: &str,
    who: &Caller,
    incoming: &Incoming,
) -> Result<Response, String> {
    let path = incoming.uri.path_and_query().map_or("/", |p| p.as_str());
    let name = caller_name(who);
    let mut req = client
        .request(incoming.method.clone(), format!("{to}{path}"))
        .header(PEER_HEADER, credential(key, &name))
        .header(CALLER_HEADER, name);
    for h in &PASSED {
        if let Some(v) = incoming.headers.get(h) {
            req = req.header(h, v);
        }
    }
    let answer = req
        .body(incoming.body.clone())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Response::builder().status(answer.status());
    for h in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = answer.headers().get(&h) {
            out = out.header(h, v);
        }
    }
    out.body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| e.to_string())
}

/// The HTTP client a server forwards with: no proxy (peers are on the
/// cluster's network), a short connect timeout, no overall one (an event
/// stream lasts as long as its client).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_peer_vouches_for_the_caller_its_credential_names() {
        let key = [7u8; 32];
        let owner = credential(&key, "owner");
        let h = headers(&[(PEER_HEADER, &owner), (CALLER_HEADER, "owner")]);
        assert_eq!(vouched(&h, &key).unwrap().unwrap(), Caller::Owner);
        let s1 = credential(&key, "session:s1");
        let h = headers(&[(PEER_HEADER, &s1), (CALLER_HEADER, "session:s1")]);
        assert_eq!(
            vouched(&h, &key).unwrap().unwrap(),
            Caller::SessionToken("s1".into())
        );
        assert!(vouched(&HeaderMap::new(), &key).is_none());
    }

    #[test]
    fn a_credential_for_another_caller_or_key_is_refused() {
        let key = [7u8; 32];
        let s1 = credential(&key, "session:s1");
        for h in [
            headers(&[(PEER_HEADER, &s1), (CALLER_HEADER, "owner")]),
            headers(&[
                (PEER_HEADER, &credential(&[8u8; 32], "owner")),
                (CALLER_HEADER, "owner"),
            ]),
            headers(&[(PEER_HEADER, "owner"), (CALLER_HEADER, "owner")]),
            headers(&[(PEER_HEADER, &s1)]),
        ] {
            let e = vouched(&h, &key).unwrap().unwrap_err();
            assert_eq!(
                (e.kind, e.code),
                (ErrorKind::Unauthorized, "unauthorized"),
                "{h:?}"
            );
        }
    }
}
