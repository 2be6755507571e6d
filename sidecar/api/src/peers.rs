//! Replicas on a shared store forward to each other the requests that need
//! what lives in one server's memory only: a session's secret values, its
//! run's `delta` events. The server a client reached checks the client's
//! credentials; the forward carries the caller it found and is served as if
//! it came directly, never forwarded again.
//!
//! A forward is signed, one request at a time: HMAC-SHA256 under a key
//! derived from the owner token every replica shares (its own label, so it
//! is no other key the token derives), over the method, the path and query,
//! the SHA-256 of the body, the caller, the time it was sent, a random
//! nonce and the instance it is sent to (so a forward captured on the way
//! to one replica is good at no other, the sender included: each replica
//! remembers the nonces it took), and the headers that change what an
//! `/mcp` call does
//! (`signed_headers`: they go with its forward, and a forward without
//! them is signed over exactly what it was before). The receiver ([`admit`], in front of every route) refuses a
//! signature that does not match, a time more than [`WINDOW`] away from its
//! own clock, and a nonce it has seen already; it remembers nonces for
//! twice the window, which is as long as their time could be accepted, and
//! no longer. So a captured forward is good for that one request, once, and
//! for a short while: replayed, or with its path or body changed, or its
//! headers put on another request, it is refused (401).
//!
//! Replicas of the version before signed requests (a fixed credential per
//! caller) and of this one cannot forward to each other. During a rolling
//! update a request that reaches a new replica and needs an old one is
//! refused by the old one (401); the new one takes that as it takes a peer
//! it cannot reach, and serves the request itself (`409 params_required`
//! when it needs secret values it does not hold, an event stream without
//! `delta` events). A forward from an old replica is refused by the new one
//! (401), and the old replica passes that answer on to its client. Once
//! every replica runs the new version, forwards work again.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::status::ApiError;
use bindery_llm::egress;
use bindery_params::secret::constant_time_eq;
use bindery_session::error::{Code, ErrorKind, ServiceError};
use bindery_session::validate::Caller;
use bindery_spec::Redirects;
use bindery_store::pending::hmac;

/// The signature of a forward: from a server of the same tenant, never a
/// client.
pub const PEER_HEADER: &str = "x-bindery-peer";
/// The caller the forwarding server authenticated (`owner`, `session:ID`).
pub const CALLER_HEADER: &str = "x-bindery-peer-caller";
/// When the forward was sent: seconds since the Unix epoch.
pub const TIME_HEADER: &str = "x-bindery-peer-time";
/// A random value, never sent twice: 16 bytes in hex.
pub const NONCE_HEADER: &str = "x-bindery-peer-nonce";
/// An end user's identity token, on a forward made for them: the receiver
/// verifies it again, so that a run it starts may act with the person's
/// rights (their token exchanged) as a run on the server they reached
/// would. Signed with the rest; removed from every request that is not a
/// forward, so that no client sets it.
pub const IDENTITY_HEADER: &str = "x-bindery-peer-identity";
/// Set by [`admit`] on a forward whose signature it checked, to the caller
/// it vouches for; removed from every other request, so that no client can
/// set it.
const VOUCHED_HEADER: &str = "x-bindery-peer-vouched";

/// How far a forward's time may be from the receiver's clock, either way.
/// Replicas run on nodes whose clocks are kept in sync (NTP keeps them
/// within well under a second); 30 s leaves room for that and for a slow
/// network, while a captured request stops being accepted soon after.
pub const WINDOW: Duration = Duration::from_secs(30);

/// The largest body a forward may carry (axum's default limit for a
/// request's body, which the routes apply to a client's request too).
const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// What a client's request passes on to a peer.
const PASSED: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    HeaderName::from_static("last-event-id"),
];

/// The headers besides [`PASSED`] a forward carries, and is signed over:
/// those that change what an `/mcp` call does (its protocol version,
/// method and tool, the session a session token names, and parameter
/// values), each name with its values in the order they came, by name.
/// A request without any is signed as before these were.
fn signed_headers(headers: &HeaderMap) -> Vec<(&str, &[u8])> {
    let mut out: Vec<(&str, &[u8])> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            matches!(
                name,
                "bindery-session-id"
                    | "mcp-protocol-version"
                    | "mcp-method"
                    | "mcp-name"
                    | IDENTITY_HEADER
            ) || name.starts_with("agents-param-")
        })
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect();
    // Stable: a name's values keep their order.
    out.sort_by_key(|(name, _)| *name);
    out
}

fn caller_name(who: &Caller) -> String {
    match who {
        Caller::Owner => "owner".into(),
        Caller::SessionToken(id) => format!("session:{id}"),
        Caller::Approver => "approver".into(),
        // Hex: a subject may hold any printable character, a header value
        // only visible ASCII.
        Caller::EndUser(person) => format!("user:{}", hex::encode(person.subject.as_str())),
        // The session last: its id is the server's, but read from the
        // right whatever it holds.
        Caller::Share(holder) => format!(
            "share:{}:{}:{}",
            match holder.mode {
                bindery_store::model::ShareMode::Read => "r",
                bindery_store::model::ShareMode::Write => "w",
            },
            holder.share,
            holder.session
        ),
    }
}

/// What one forward is signed over.
struct Signed<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a [u8],
    caller: &'a str,
    time: u64,
    nonce: &'a str,
    /// The instance id of the replica it is sent to.
    receiver: &'a str,
    /// [`signed_headers`].
    headers: Vec<(&'a str, &'a [u8])>,
}

impl Signed<'_> {
    fn signature(&self, key: &[u8; 32]) -> [u8; 32] {
        let digest = hex::encode(Sha256::digest(self.body));
        let mut text = format!(
            "bindery peer request\n{}\n{}\n{digest}\n{}\n{}\n{}\nto {}",
            self.method, self.path, self.caller, self.time, self.nonce, self.receiver
        )
        .into_bytes();
        // A header value holds no line break, a name no colon.
        for (name, value) in &self.headers {
            text.push(b'\n');
            text.extend_from_slice(name.as_bytes());
            text.push(b':');
            text.extend_from_slice(value);
        }
        hmac(key, &text)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The nonces of the forwards accepted within the last two windows: a
/// nonce is remembered as long as its time could still be accepted, then
/// forgotten, so memory is bounded by the rate of forwards.
#[derive(Default)]
pub struct Nonces {
    seen: Mutex<Seen>,
}

/// The nonces, and the same in the order they came, with when.
#[derive(Default)]
struct Seen {
    set: HashSet<String>,
    order: VecDeque<(Instant, String)>,
}

impl Nonces {
    /// Whether `nonce` is new (it is remembered from now on); `false`: it
    /// was seen within the last two windows.
    fn first_use(&self, nonce: &str, now: Instant) -> bool {
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let Seen { set, order } = &mut *guard;
        while let Some((at, _)) = order.front() {
            if now.saturating_duration_since(*at) <= 2 * WINDOW {
                break;
            }
            if let Some((_, old)) = order.pop_front() {
                set.remove(&old);
            }
        }
        if !set.insert(nonce.to_string()) {
            return false;
        }
        order.push_back((now, nonce.to_string()));
        true
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.lock().unwrap().set.len()
    }
}

/// What [`admit`] checks forwards with.
pub struct PeerAuth {
    key: [u8; 32],
    nonces: Nonces,
    /// This server's instance id: a forward must be signed for it.
    instance: String,
    /// With peer TLS, forwards come in on the peer port only.
    tls_only: bool,
}

impl PeerAuth {
    /// `key`: [`super::auth::OwnerToken::peer_key`]; `instance`: this
    /// server's; `tls_only`: it has a peer port (`--peer-tls-dir`).
    pub fn new(key: [u8; 32], instance: &str, tls_only: bool) -> Self {
        PeerAuth {
            key,
            nonces: Nonces::default(),
            instance: instance.to_string(),
            tls_only,
        }
    }
}

fn refused(why: &str) -> ServiceError {
    ServiceError::new(
        ErrorKind::Unauthorized,
        Code::Unauthorized,
        format!("`{PEER_HEADER}` is for the servers of one tenant forwarding to each other, each request signed once ({why}); a client sends `Authorization: Bearer <token>` only"),
    )
}

/// The caller a forward is signed for, if its signature, time and nonce
/// hold (the nonce is remembered only then: a forged request cannot fill
/// the memory).
fn verify(
    auth: &PeerAuth,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    now: u64,
    at: Instant,
) -> Result<String, ServiceError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(presented), Some(caller), Some(time), Some(nonce)) = (
        text(PEER_HEADER),
        text(CALLER_HEADER),
        text(TIME_HEADER),
        text(NONCE_HEADER),
    ) else {
        return Err(refused(&format!(
            "a forward carries `{PEER_HEADER}`, `{CALLER_HEADER}`, `{TIME_HEADER}` and `{NONCE_HEADER}`"
        )));
    };
    let Ok(time) = time.parse::<u64>() else {
        return Err(refused(&format!("`{TIME_HEADER}` is not a time")));
    };
    if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refused(&format!("`{NONCE_HEADER}` is not 16 bytes in hex")));
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let expected = Signed {
        method: method.as_str(),
        path,
        body,
        caller,
        time,
        nonce,
        receiver: &auth.instance,
        headers: signed_headers(headers),
    }
    .signature(&auth.key);
    let matches = hex::decode(presented).is_ok_and(|p| constant_time_eq(&p, &expected));
    if !matches {
        return Err(refused("the signature does not match this request"));
    }
    if now.abs_diff(time) > WINDOW.as_secs() {
        return Err(refused(&format!(
            "its time is more than {} s from this server's clock: keep the replicas' clocks in sync",
            WINDOW.as_secs()
        )));
    }
    if !auth.nonces.first_use(nonce, at) {
        return Err(refused("this request was accepted once already"));
    }
    Ok(caller.to_string())
}

/// In front of every route: a request that says it is a peer's forward is
/// admitted only with a good signature, and then carries the caller it
/// vouches for; the peer headers go, and no other request carries a
/// vouched caller.
pub async fn admit(State(auth): State<Arc<PeerAuth>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(VOUCHED_HEADER);
    let claims = [PEER_HEADER, CALLER_HEADER, TIME_HEADER, NONCE_HEADER]
        .iter()
        .any(|h| parts.headers.contains_key(*h));
    if !claims {
        parts.headers.remove(IDENTITY_HEADER);
        return next.run(Request::from_parts(parts, body)).await;
    }
    if auth.tls_only && parts.extensions.get::<PeerPort>().is_none() {
        // A forward in clear on the client port is one a sniffer could
        // have read; replicas with peer TLS never send one.
        return ApiError(refused(
            "this server takes forwards on its peer port only, over mutual TLS with the tenant's certificate",
        ))
        .into_response();
    }
    let Ok(body) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the forward's body is too large",
        )
            .into_response();
    };
    let caller = verify(
        &auth,
        &parts.method,
        &parts.uri,
        &parts.headers,
        &body,
        unix_now(),
        Instant::now(),
    );
    let caller = match caller.map(|c| HeaderValue::from_str(&c)) {
        Ok(Ok(c)) => c,
        Ok(Err(_)) => return ApiError(refused("the caller is not a header value")).into_response(),
        Err(e) => return ApiError(e).into_response(),
    };
    for h in [PEER_HEADER, CALLER_HEADER, TIME_HEADER, NONCE_HEADER] {
        parts.headers.remove(h);
    }
    parts.headers.insert(VOUCHED_HEADER, caller);
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// Whether a request is a peer's forward (then it is served here, whatever
/// it needs).
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(VOUCHED_HEADER)
}

/// The caller a peer vouches for, its forward admitted by [`admit`];
/// `None` when the request is not a forward.
pub fn vouched(headers: &HeaderMap) -> Option<Result<Caller, ServiceError>> {
    let name = headers.get(VOUCHED_HEADER)?.to_str().unwrap_or_default();
    if let Some(user) = name.strip_prefix("user:") {
        return Some(
            hex::decode(user)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| bindery_identity::Subject::new(s).ok())
                .map(|s| Caller::EndUser(bindery_identity::Person::named(s)))
                .ok_or_else(|| refused("the caller `user:…` names no subject")),
        );
    }
    if let Some(share) = name.strip_prefix("share:") {
        return Some(share_caller(share).ok_or_else(|| {
            refused("the caller `share:…` is not `share:r|w:SHARE_ID:SESSION_ID`")
        }));
    }
    Some(match name.strip_prefix("session:") {
        None if name == "owner" => Ok(Caller::Owner),
        None if name == "approver" => Ok(Caller::Approver),
        Some(id) if !id.is_empty() => Ok(Caller::SessionToken(id.to_string())),
        _ => Err(refused("the caller is neither `owner` nor `session:ID`")),
    })
}

/// `r|w:SHARE_ID:SESSION_ID`, as [`caller_name`] writes a share's holder.
fn share_caller(named: &str) -> Option<Caller> {
    let (mode, rest) = named.split_once(':')?;
    let (share, session) = rest.split_once(':')?;
    let mode = match mode {
        "r" => bindery_store::model::ShareMode::Read,
        "w" => bindery_store::model::ShareMode::Write,
        _ => return None,
    };
    (share.starts_with("sh_") && share.len() > 3 && !session.is_empty()).then(|| {
        Caller::Share(bindery_session::validate::ShareHolder {
            session: session.to_string(),
            share: share.to_string(),
            mode,
        })
    })
}

/// A client's request as a peer gets it (see `api/holder.rs`).
pub struct Incoming {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Send a client's request to the peer `instance` at `to`
/// (`http://HOST:PORT`) on behalf of `who`, signed for this one request
/// to that instance, and stream its answer back
/// as it comes (an event stream stays open). `Err`: the peer could not be
/// reached, or refused the signature (a replica of another version, or
/// with another owner token).
pub async fn forward(
    client: &reqwest::Client,
    key: &[u8; 32],
    (instance, to): (&str, &str),
    who: &Caller,
    incoming: &Incoming,
) -> Result<Response, ForwardError> {
    let path = incoming.uri.path_and_query().map_or("/", |p| p.as_str());
    let name = caller_name(who);
    let nonce = bindery_params::random::hex::<16>("a forward's nonce")?;
    let time = unix_now();
    // A person's token goes with a forward made for them (and only then:
    // `admit` took any a client sent).
    let mut headers = incoming.headers.clone();
    headers.remove(IDENTITY_HEADER);
    if let Caller::EndUser(person) = who {
        if let Some(token) = person.live_token() {
            if let Ok(mut v) = HeaderValue::from_str(token.expose()) {
                v.set_sensitive(true);
                headers.insert(IDENTITY_HEADER, v);
            }
        }
    }
    let signature = Signed {
        method: incoming.method.as_str(),
        path,
        body: &incoming.body,
        caller: &name,
        time,
        nonce: &nonce,
        receiver: instance,
        headers: signed_headers(&headers),
    }
    .signature(key);
    let mut req = client
        .request(incoming.method.clone(), format!("{to}{path}"))
        .header(PEER_HEADER, hex::encode(signature))
        .header(CALLER_HEADER, name)
        .header(TIME_HEADER, time.to_string())
        .header(NONCE_HEADER, nonce);
    for h in &PASSED {
        if let Some(v) = incoming.headers.get(h) {
            req = req.header(h, v);
        }
    }
    for (name, value) in signed_headers(&headers) {
        req = req.header(name, value);
    }
    let answer = req
        .body(incoming.body.clone())
        .send()
        .await
        .map_err(ForwardError::Unreachable)?;
    if answer.status() == StatusCode::UNAUTHORIZED {
        return Err(ForwardError::SignatureRefused);
    }
    let mut out = Response::builder().status(answer.status());
    for h in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = answer.headers().get(&h) {
            out = out.header(h, v);
        }
    }
    out.body(Body::from_stream(answer.bytes_stream()))
        .map_err(ForwardError::Answer)
}

/// Why a request could not be forwarded to the server holding its
/// session (the request is then served here, without that server's
/// secret values).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Nonce(#[from] bindery_params::random::NoRandomness),
    #[error("{0}")]
    Unreachable(reqwest::Error),
    #[error("it refused this server's signature (a replica of another version, during a rolling update, or one with another owner token)")]
    SignatureRefused,
    #[error("its answer could not be passed on: {0}")]
    Answer(axum::http::Error),
    #[error("it stopped beating before it answered (its lease passed)")]
    Lapsed,
}

/// The HTTP client a server forwards with: no proxy (peers are on the
/// cluster's network), a short connect timeout, no overall one (an event
/// stream lasts as long as its client), and the outbound policy of every
/// client with no redirect followed: a forward goes to its peer and
/// nowhere else.
pub fn client() -> reqwest::Client {
    egress::client(Redirects::Never)
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

/// The same over mutual TLS (`--peer-tls-dir`): `tls` presents this
/// server's certificate and checks the peer's (see `peer_tls.rs`).
pub fn tls_client(tls: rustls::ClientConfig) -> Result<reqwest::Client, reqwest::Error> {
    egress::client(Redirects::Never)
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .tls_backend_preconfigured(tls)
        .build()
}

/// The names of the secret values `body` (a message, resume, fork,
/// continuation or `PUT …/params` body) gives in its `fields` (`params`,
/// a fork's `pin`) for an agent whose parameters `secret` tells apart:
/// what a forward of it would carry.
pub fn secret_values_in(
    body: &[u8],
    fields: &[&str],
    secret: impl Fn(&str) -> bool,
) -> Vec<String> {
    let Ok(serde_json::Value::Object(body)) = serde_json::from_slice(body) else {
        return Vec::new();
    };
    let mut names: Vec<String> = fields
        .iter()
        .filter_map(|f| body.get(*f).and_then(serde_json::Value::as_object))
        .flat_map(|values| values.iter())
        .filter(|(name, value)| !value.is_null() && secret(name))
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The answer to a request that would carry secret values `names` to a
/// peer over plain HTTP.
pub fn tls_required(names: Vec<String>) -> ServiceError {
    ServiceError {
        extra: None,
        kind: ErrorKind::Conflict,
        code: Code::PeerTlsRequired,
        message: format!(
            "another replica holds this session's secret values, and this request would carry the secret value of {} to it over plain HTTP, which is not done: give every replica the tenant's peer certificate with `serve --peer-tls-dir DIR` (ca.crt, tls.crt, tls.key), `--peer-tls-name NAME` and `--peer-listen ADDR`, so that replicas forward to each other over mutual TLS (the operator does this for an AgentTenant)",
            names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        ),
        params: names,
    }
}

/// Marks a request that came in on the peer port (mutual TLS with the
/// tenant's certificate: no browser's page reaches it).
#[derive(Clone, Copy, Debug)]
pub struct PeerPort;

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7u8; 32];
    const NONCE: &str = "00112233445566778899aabbccddeeff";

    /// The headers of a forward of `POST /v1/sessions/s1/messages` with
    /// `body`, signed under `key` at `time` with `nonce` for `caller`.
    fn signed(key: &[u8; 32], caller: &str, body: &[u8], time: u64, nonce: &str) -> HeaderMap {
        let sig = Signed {
            method: "POST",
            path: "/v1/sessions/s1/messages?wait=true",
            body,
            caller,
            time,
            nonce,
            receiver: "b",
            headers: Vec::new(),
        }
        .signature(key);
        let mut h = HeaderMap::new();
        h.insert(PEER_HEADER, hex::encode(sig).parse().unwrap());
        h.insert(CALLER_HEADER, caller.parse().unwrap());
        h.insert(TIME_HEADER, time.to_string().parse().unwrap());
        h.insert(NONCE_HEADER, nonce.parse().unwrap());
        h
    }

    fn check(
        auth: &PeerAuth,
        uri: &str,
        h: &HeaderMap,
        body: &[u8],
        now: u64,
        at: Instant,
    ) -> Result<String, ServiceError> {
        verify(auth, &Method::POST, &uri.parse().unwrap(), h, body, now, at)
    }

    const URI: &str = "/v1/sessions/s1/messages?wait=true";

    #[test]
    fn a_forward_is_admitted_once_for_the_request_it_was_signed_for() {
        let auth = PeerAuth::new(KEY, "b", false);
        let at = Instant::now();
        let h = signed(&KEY, "session:s1", b"{}", 1000, NONCE);
        assert_eq!(
            check(&auth, URI, &h, b"{}", 1000, at).unwrap(),
            "session:s1"
        );
        // The same again: refused, however soon.
        let e = check(&auth, URI, &h, b"{}", 1000, at).unwrap_err();
        assert!(e.message.contains("accepted once already"), "{}", e.message);
    }

    /// A forward signed for one replica is good at no other: the one that
    /// sent it (which never saw its nonce) refuses it too.
    #[test]
    fn a_forward_is_good_only_at_the_replica_it_was_sent_to() {
        let at = Instant::now();
        let h = signed(&KEY, "owner", b"{}", 1000, NONCE);
        let sender = PeerAuth::new(KEY, "a", false);
        let e = check(&sender, URI, &h, b"{}", 1000, at).unwrap_err();
        assert!(e.message.contains("does not match"), "{}", e.message);
        let receiver = PeerAuth::new(KEY, "b", false);
        assert_eq!(check(&receiver, URI, &h, b"{}", 1000, at).unwrap(), "owner");
    }

    #[test]
    fn a_forward_changed_in_any_part_is_refused() {
        let at = Instant::now();
        let h = signed(&KEY, "owner", b"{\"prompt\":\"a\"}", 1000, NONCE);
        let mut other_caller = h.clone();
        other_caller.insert(CALLER_HEADER, "session:s1".parse().unwrap());
        let mut other_time = h.clone();
        other_time.insert(TIME_HEADER, "1001".parse().unwrap());
        let mut other_nonce = h.clone();
        other_nonce.insert(
            NONCE_HEADER,
            "ffffffffffffffffffffffffffffffff".parse().unwrap(),
        );
        let other_key = signed(&[8u8; 32], "owner", b"{\"prompt\":\"a\"}", 1000, NONCE);
        let cases: [(&str, &HeaderMap, &[u8]); 6] = [
            (URI, &h, b"{\"prompt\":\"b\"}"),
            (
                "/v1/sessions/s2/messages?wait=true",
                &h,
                b"{\"prompt\":\"a\"}",
            ),
            (URI, &other_caller, b"{\"prompt\":\"a\"}"),
            (URI, &other_time, b"{\"prompt\":\"a\"}"),
            (URI, &other_nonce, b"{\"prompt\":\"a\"}"),
            (URI, &other_key, b"{\"prompt\":\"a\"}"),
        ];
        for (uri, headers, body) in cases {
            let auth = PeerAuth::new(KEY, "b", false);
            let e = check(&auth, uri, headers, body, 1000, at).unwrap_err();
            assert_eq!(
                (e.kind, e.code),
                (ErrorKind::Unauthorized, Code::Unauthorized)
            );
            assert!(
                e.message.contains("does not match"),
                "{uri} {headers:?}: {}",
                e.message
            );
            assert_eq!(auth.nonces.len(), 0, "a forged request's nonce is not kept");
        }
        // On another method.
        let auth = PeerAuth::new(KEY, "b", false);
        let e = verify(
            &auth,
            &Method::PUT,
            &URI.parse().unwrap(),
            &h,
            b"{\"prompt\":\"a\"}",
            1000,
            at,
        );
        assert!(e.is_err());
    }

    #[test]
    fn a_forward_outside_the_window_or_missing_a_part_is_refused() {
        let auth = PeerAuth::new(KEY, "b", false);
        let at = Instant::now();
        let w = WINDOW.as_secs();
        for now in [1000 + w + 1, 1000 - w - 1] {
            let h = signed(&KEY, "owner", b"", 1000, NONCE);
            let e = check(&auth, URI, &h, b"", now, at).unwrap_err();
            assert!(e.message.contains("clock"), "{}", e.message);
        }
        for now in [1000 + w, 1000 - w] {
            let nonce = format!("{now:032x}");
            let h = signed(&KEY, "owner", b"", 1000, &nonce);
            check(&auth, URI, &h, b"", now, at).unwrap();
        }
        for missing in [PEER_HEADER, CALLER_HEADER, TIME_HEADER, NONCE_HEADER] {
            let mut h = signed(&KEY, "owner", b"", 1000, NONCE);
            h.remove(missing);
            assert!(check(&auth, URI, &h, b"", 1000, at).is_err(), "{missing}");
        }
        let h = signed(&KEY, "owner", b"", 1000, "short");
        assert!(check(&auth, URI, &h, b"", 1000, at).is_err());
    }

    /// The headers that change an `/mcp` call are signed with it: one
    /// changed, added or removed is refused; a forward without any is
    /// signed over exactly the text it always was, so replicas of the
    /// version before still take it.
    #[test]
    fn an_mcp_forwards_headers_are_signed_and_others_unchanged() {
        let at = Instant::now();
        let plain = Signed {
            method: "POST",
            path: URI,
            body: b"{}",
            caller: "owner",
            time: 1000,
            nonce: NONCE,
            receiver: "b",
            headers: Vec::new(),
        }
        .signature(&KEY);
        let text = format!(
            "bindery peer request\nPOST\n{URI}\n{}\nowner\n1000\n{NONCE}\nto b",
            hex::encode(Sha256::digest(b"{}"))
        );
        assert_eq!(plain, hmac(&KEY, text.as_bytes()), "the format");

        let mut sent = HeaderMap::new();
        sent.insert("agents-param-tenant", "acme".parse().unwrap());
        sent.insert("mcp-method", "tools/call".parse().unwrap());
        sent.insert(header::ACCEPT, "application/json".parse().unwrap());
        let sig = Signed {
            method: "POST",
            path: URI,
            body: b"{}",
            caller: "owner",
            time: 1000,
            nonce: NONCE,
            receiver: "b",
            headers: signed_headers(&sent),
        }
        .signature(&KEY);
        assert_ne!(sig, plain);
        let with = |extra: &[(&str, &str)], drop: Option<&str>| {
            let mut h = sent.clone();
            if let Some(d) = drop {
                h.remove(d);
            }
            for (k, v) in extra {
                h.insert(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            h.insert(PEER_HEADER, hex::encode(sig).parse().unwrap());
            h.insert(CALLER_HEADER, "owner".parse().unwrap());
            h.insert(TIME_HEADER, "1000".parse().unwrap());
            h.insert(NONCE_HEADER, NONCE.parse().unwrap());
            h
        };
        for (extra, drop) in [
            (&[("agents-param-tenant", "globex")][..], None),
            (&[("agents-param-billing-token", "x")][..], None),
            (&[("bindery-session-id", "s2")][..], None),
            // Somebody else's identity token put on a forward.
            (&[(IDENTITY_HEADER, "eyJ.other.token")][..], None),
            (&[][..], Some("agents-param-tenant")),
        ] {
            let auth = PeerAuth::new(KEY, "b", false);
            let e = check(&auth, URI, &with(extra, drop), b"{}", 1000, at).unwrap_err();
            assert!(e.message.contains("does not match"), "{extra:?} {drop:?}");
        }
        // `Accept` is passed, not signed; the signed ones as they were pass.
        let auth = PeerAuth::new(KEY, "b", false);
        let h = with(&[(header::ACCEPT.as_str(), "*/*")], None);
        assert_eq!(check(&auth, URI, &h, b"{}", 1000, at).unwrap(), "owner");
    }

    /// A person's identity token reaches a peer only on a forward made for
    /// them, signed with it: a client that sends the header itself has it
    /// taken away before any route sees it.
    #[tokio::test]
    async fn an_identity_token_goes_only_with_a_signed_forward() {
        use axum::routing::get;
        let auth = Arc::new(PeerAuth::new(KEY, "b", false));
        let app = axum::Router::new()
            .route(
                "/seen",
                get(|headers: HeaderMap| async move {
                    let token = headers
                        .get(IDENTITY_HEADER)
                        .map(|v| v.to_str().unwrap().to_string());
                    token.unwrap_or_else(|| "none".into())
                }),
            )
            .layer(axum::middleware::from_fn_with_state(auth, admit));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();

        let direct = client
            .get(format!("{base}/seen"))
            .header(IDENTITY_HEADER, "eyJ.planted.token")
            .send()
            .await
            .unwrap();
        assert_eq!(direct.text().await.unwrap(), "none");

        let person = bindery_identity::Person {
            token: Some(Arc::new(bindery_params::SecretString::new(String::from(
                "eyJ.alice.token",
            )))),
            expires_at: u64::MAX,
            ..bindery_identity::Person::named(bindery_identity::Subject::new("alice").unwrap())
        };
        let incoming = Incoming {
            method: Method::GET,
            uri: "/seen".parse().unwrap(),
            // A token the client planted is not what goes.
            headers: [(
                HeaderName::from_static(IDENTITY_HEADER),
                HeaderValue::from_static("eyJ.planted.token"),
            )]
            .into_iter()
            .collect(),
            body: Bytes::new(),
        };
        for (who, expected) in [
            (Caller::EndUser(person), "eyJ.alice.token"),
            (Caller::Owner, "none"),
        ] {
            let r = forward(&client, &KEY, ("b", &base), &who, &incoming)
                .await
                .unwrap_or_else(|_| panic!("forwarded for {who:?}"));
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            assert_eq!(&body[..], expected.as_bytes(), "{who:?}");
        }
        served.abort();
    }

    #[test]
    fn nonces_are_forgotten_once_their_time_is_past() {
        let nonces = Nonces::default();
        let t0 = Instant::now();
        assert!(nonces.first_use("a", t0));
        assert!(!nonces.first_use("a", t0 + WINDOW));
        assert!(nonces.first_use("b", t0 + WINDOW));
        assert_eq!(nonces.len(), 2);
        // Past two windows `a` is gone; `b` is still within its own.
        assert!(nonces.first_use("c", t0 + 2 * WINDOW + Duration::from_secs(1)));
        assert_eq!(nonces.len(), 2);
        assert!(!nonces.first_use("b", t0 + 2 * WINDOW + Duration::from_secs(1)));
    }

    #[test]
    fn a_vouched_caller_is_the_owner_or_one_session() {
        let mut h = HeaderMap::new();
        assert!(vouched(&h).is_none());
        h.insert(VOUCHED_HEADER, "owner".parse().unwrap());
        assert_eq!(vouched(&h).unwrap().unwrap(), Caller::Owner);
        h.insert(VOUCHED_HEADER, "session:s1".parse().unwrap());
        assert_eq!(
            vouched(&h).unwrap().unwrap(),
            Caller::SessionToken("s1".into())
        );
        for bad in ["session:", "admin"] {
            h.insert(VOUCHED_HEADER, bad.parse().unwrap());
            assert!(vouched(&h).unwrap().is_err(), "{bad}");
        }
    }

    /// A share's holder crosses to a peer as they are: the session, the
    /// share and its mode, and reads back only from that form.
    #[test]
    fn a_share_holder_is_vouched_for_faithfully() {
        use bindery_session::validate::ShareHolder;
        use bindery_store::model::ShareMode;
        let mut h = HeaderMap::new();
        for (mode, letter) in [(ShareMode::Read, "r"), (ShareMode::Write, "w")] {
            let who = Caller::Share(ShareHolder {
                session: "6f1c-a:b".into(),
                share: "sh_0123456789abcdef".into(),
                mode,
            });
            let name = caller_name(&who);
            assert_eq!(name, format!("share:{letter}:sh_0123456789abcdef:6f1c-a:b"));
            h.insert(VOUCHED_HEADER, name.parse().unwrap());
            assert_eq!(vouched(&h).unwrap().unwrap(), who);
        }
        for bad in [
            "share:",
            "share:x:sh_1:s1",
            "share:r:sh_1:",
            "share:r:sh_:s1",
            "share:r:st_1:s1",
            "share:r:sh_1",
            "share:read:sh_1:s1",
        ] {
            h.insert(VOUCHED_HEADER, bad.parse().unwrap());
            assert!(vouched(&h).unwrap().is_err(), "{bad}");
        }
    }

    /// A peer that answers with a redirect elsewhere: the forward (its
    /// signed headers, caller and body) goes nowhere else.
    #[tokio::test]
    async fn a_forward_follows_no_redirect() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let there = elsewhere.local_addr().unwrap();
        let reached = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = reached.clone();
        tokio::spawn(async move {
            let (mut s, _) = elsewhere.accept().await.unwrap();
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await;
        });
        let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = peer.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = peer.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{there}/v1/sessions\r\nContent-Length: 0\r\n\r\n"
            );
            s.write_all(answer.as_bytes()).await.unwrap();
        });
        let incoming = Incoming {
            method: Method::POST,
            uri: "/v1/sessions/s/messages".parse().unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{\"message\": \"hi\"}"),
        };
        let r = forward(
            &client(),
            &KEY,
            ("b", &format!("http://{at}")),
            &Caller::Owner,
            &incoming,
        )
        .await;
        assert!(r.is_err(), "the redirect was followed");
        assert!(
            !reached.load(std::sync::atomic::Ordering::SeqCst),
            "the other origin was reached"
        );
    }
}
