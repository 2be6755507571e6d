//! The HTTP session API (agents-server's routes and shapes), over the
//! session service.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures::Stream;
use serde::Deserialize;
use serde_json::json;

use super::auth::{caller, Door, OwnerToken};
use super::metrics::Metrics;
use super::peers::{forward, is_forwarded, Incoming};
use super::views::{agent_view, session_summary, session_view};
use crate::session::error::ServiceError;
use crate::session::service::{Answer, CreateSession, Feed, LiveEvent, RunMode, RunWait, Service};
use crate::session::validate::Caller;

pub struct AppState {
    pub service: Arc<Service>,
    pub owner: OwnerToken,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    /// Forwards requests to other servers on a shared store.
    pub peers: reqwest::Client,
}

impl AppState {
    /// Who sends this request on `session` through `door`.
    pub(crate) async fn caller(
        &self,
        headers: &HeaderMap,
        session: Option<&str>,
        door: Door,
    ) -> Result<Caller, ServiceError> {
        caller(headers, &self.owner, &self.service, session, door).await
    }

    /// `req` on session `id` sent on to the server holding what it needs
    /// in memory (see [`Service::held_elsewhere`]); `None`: serve it here
    /// (it came from a peer already, no other live server holds it, or
    /// that server cannot be reached).
    async fn forward_to_holder(&self, id: &str, who: &Caller, req: &Incoming) -> Option<Response> {
        if is_forwarded(&req.headers) {
            return None;
        }
        let to = self.service.held_elsewhere(id).await?;
        let key = self.owner.peer_key();
        let sent = forward(&self.peers, &key, &to, who, req).await;
        match sent {
            Ok(r) => Some(r),
            Err(why) => {
                tracing::warn!(session = id, peer = %to, "cannot forward a request to the server holding the session: {why}");
                None
            }
        }
    }

    /// A request refused here for want of secret values another live
    /// server holds is answered by that server; anything else stands.
    async fn or_forward(
        &self,
        e: ServiceError,
        id: &str,
        who: &Caller,
        req: &Incoming,
    ) -> ApiResult {
        if e.code != "params_required" {
            return Err(e);
        }
        self.forward_to_holder(id, who, req).await.ok_or(e)
    }
}

/// Default and upper bound of `?timeout=` (seconds) with `?wait=true`.
const DEFAULT_WAIT: u64 = 60;
const MAX_WAIT: u64 = 600;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(|| async { Json(super::openapi::document(env!("CARGO_PKG_VERSION"))) }),
        )
        .route("/v1/agents", get(list_agents))
        .route("/v1/agents/{slug}", get(get_agent))
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session))
        .route("/v1/sessions/{id}/messages", post(post_message))
        .route("/v1/sessions/{id}/resume", post(resume))
        .route("/v1/sessions/{id}/cancel", post(cancel))
        .route("/v1/sessions/{id}/fork", post(fork))
        .route("/v1/sessions/{id}/params", put(put_params))
        .route(
            "/v1/sessions/{id}/token",
            axum::routing::delete(revoke_token),
        )
        .route("/v1/sessions/{id}/events", get(events))
        .route("/v1/continuations/{token}", post(continuation))
        .route(
            "/mcp",
            // Every other method (GET: no stream; DELETE: no session) is a
            // 405 that says `Allow: POST`.
            post(super::mcp::post).fallback(super::mcp::not_allowed),
        )
        .merge(super::chat::routes())
        .fallback(|| async { ServiceError::not_found("no such route (see /openapi.json)") })
        .layer(middleware::map_response(json_errors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(req).await;
    state
        .metrics
        .http_request(&route, response.status().as_u16());
    response
}

/// Every error in the API's `{"error", "message"}` shape: axum's own
/// rejections (a query string, path or body it cannot read, a method a
/// route does not take) answer in plain text; they are rewritten here,
/// keeping their status and their text as the message.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("the request failed")
            .to_string()
    } else {
        text
    };
    let mut out = (status, Json(json!({"error": code, "message": message}))).into_response();
    // Keep what the rejection said besides its body (`Allow` on a 405).
    for (k, v) in parts.headers.iter() {
        if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({"error": self.code, "message": self.message});
        if !self.params.is_empty()
            || self.code.ends_with("params")
            || self.code == "params_required"
        {
            body["params"] = json!(self.params);
        }
        (status, Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ServiceError>;

/// `at_turn` as an index: a whole number from 0 (JSON Schema's `integer`
/// takes `3.0`, so this does too).
fn turn_index(n: Option<serde_json::Number>) -> Result<Option<usize>, ServiceError> {
    let Some(n) = n else { return Ok(None) };
    let whole = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0)
            .map(|f| f as u64)
    });
    match whole {
        Some(i) => Ok(Some(usize::try_from(i).unwrap_or(usize::MAX))),
        None => Err(ServiceError::bad_request(format!(
            "`at_turn` is a turn index, a whole number from 0; got {n}"
        ))),
    }
}

/// A JSON body, whatever `Content-Type` says (agents-server clients, and
/// plain `curl -d`, often send none). An empty body is the default value.
fn body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ServiceError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ServiceError::bad_request(format!(
            "the request body is not what this route takes: {e}"
        ))
    })
}

#[derive(Deserialize, Default)]
pub struct WaitQuery {
    #[serde(default)]
    wait: Option<bool>,
    #[serde(default)]
    timeout: Option<u64>,
}

impl WaitQuery {
    /// A `timeout` past the documented bound is refused, not cut short.
    fn check(&self) -> Result<(), ServiceError> {
        match self.timeout {
            Some(t) if t > MAX_WAIT => Err(ServiceError::bad_request(format!(
                "`timeout` is at most {MAX_WAIT} seconds; got {t}"
            ))),
            _ => Ok(()),
        }
    }

    async fn wait(&self, run: Option<RunWait>) -> bool {
        match (self.wait.unwrap_or(false), run) {
            (true, Some(r)) => {
                r.wait(Duration::from_secs(
                    self.timeout.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT),
                ))
                .await
            }
            _ => false,
        }
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let not_ready = |error: &str, message: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": error, "message": message})),
        )
            .into_response()
    };
    if !state.ready.load(Ordering::Relaxed) {
        not_ready("starting", "the server is starting")
    } else if !state.service.store_ok() {
        not_ready(
            "store_unavailable",
            "the session store did not take this server's last heartbeat; see the server's log",
        )
    } else {
        Json(json!({"status": "ready"})).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn list_agents(State(s): State<Arc<AppState>>, headers: HeaderMap) -> ApiResult {
    s.caller(&headers, None, Door::OwnerOnly).await?;
    let agents: Vec<_> = s
        .service
        .tree()
        .agents
        .values()
        .map(|a| agent_view(a))
        .collect();
    Ok(Json(json!({"agents": agents})).into_response())
}

async fn get_agent(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(slug): Path<String>,
) -> ApiResult {
    s.caller(&headers, None, Door::OwnerOnly).await?;
    let agent = s
        .service
        .tree()
        .agent(&slug)
        .ok_or_else(|| ServiceError::not_found(format!("no agent named `{slug}`")))?;
    Ok(Json(agent_view(agent)).into_response())
}

/// `POST /v1/sessions` (and the fork route's) body.
#[derive(Deserialize, Default)]
pub struct CreateBody {
    agent: Option<String>,
    prompt: Option<String>,
    /// agents-server's `{"message": {"text": …}}` form of `prompt`.
    message: Option<MessageBody>,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    seal: bool,
    #[serde(default)]
    session_token: bool,
    fork: Option<String>,
    /// With a fork: copy only the turns before this index (any JSON number
    /// that is a whole one: `3.0` too).
    at_turn: Option<serde_json::Number>,
    /// `none` creates the session idle even with a prompt; `step` runs one
    /// model turn; `until_blocked` (the default) until the answer or a
    /// pending call.
    run: Option<String>,
}

/// A request's `run`: `None` for `none` (no run at all).
fn run_mode(run: Option<&str>) -> Result<Option<RunMode>, ServiceError> {
    match run {
        None | Some("until_blocked") => Ok(Some(RunMode::UntilBlocked)),
        Some("step") => Ok(Some(RunMode::Step)),
        Some("none") => Ok(None),
        Some(other) => Err(ServiceError::bad_request(format!(
            "`run` is one of none, step, until_blocked; got `{other}`"
        ))),
    }
}

#[derive(Deserialize, Default)]
pub struct MessageBody {
    text: String,
}

impl CreateBody {
    fn prompt(&mut self) -> Result<(Option<String>, RunMode), ServiceError> {
        let prompt = self
            .prompt
            .take()
            .or_else(|| self.message.take().map(|m| m.text));
        Ok(match run_mode(self.run.as_deref())? {
            Some(mode) => (prompt, mode),
            None => (None, RunMode::UntilBlocked),
        })
    }
}

async fn create_session(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<WaitQuery>,
    b: Bytes,
) -> ApiResult {
    let who = s.caller(&headers, None, Door::OwnerOnly).await?;
    q.check()?;
    let b: CreateBody = body(&b)?;
    let fork = b.fork.clone();
    create(&s, &who, &q, b, fork).await
}

/// Create a session (a fork when `fork` names a source) and answer 201.
async fn create(
    s: &AppState,
    who: &Caller,
    q: &WaitQuery,
    mut b: CreateBody,
    fork: Option<String>,
) -> ApiResult {
    let (prompt, mode) = b.prompt()?;
    let created = s
        .service
        .create(
            who,
            CreateSession {
                agent: b.agent,
                prompt,
                params: b.params,
                seal: b.seal,
                session_token: b.session_token,
                fork,
                mode,
                owner: None,
                at_turn: turn_index(b.at_turn)?,
            },
        )
        .await?;
    q.wait(created.run).await;
    let view = view(s, &created.id, who, created.token).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn view(
    s: &AppState,
    id: &str,
    who: &Caller,
    token: Option<String>,
) -> Result<super::views::SessionView, ServiceError> {
    let rec = s.service.record(id).await?;
    let pending = s.service.pending_view(&rec);
    let mut v = session_view(rec, s.service.secret_names(id), token);
    v.pending = pending;
    if let Caller::SessionToken(_) = who {
        // A session token may read the conversation, not its parameters,
        // and cannot answer a pending call.
        v.params.clear();
        v.secret_params.clear();
        for p in &mut v.pending {
            if let Some(o) = p.as_object_mut() {
                o.remove("continuation_token");
            }
        }
    }
    Ok(v)
}

async fn list_sessions(State(s): State<Arc<AppState>>, headers: HeaderMap) -> ApiResult {
    s.caller(&headers, None, Door::OwnerOnly).await?;
    let list: Vec<_> = s
        .service
        .store()
        .list()
        .await?
        .iter()
        .map(session_summary)
        .collect();
    Ok(Json(json!({"sessions": list})).into_response())
}

async fn get_session(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let who = s.caller(&headers, Some(&id), Door::SessionToken).await?;
    Ok(Json(view(&s, &id, &who, None).await?).into_response())
}

#[derive(Deserialize, Default)]
pub struct MessagePost {
    prompt: Option<String>,
    message: Option<MessageBody>,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    run: Option<String>,
}

async fn post_message(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    req: Incoming,
) -> ApiResult {
    let who = s
        .caller(&req.headers, Some(&id), Door::SessionToken)
        .await?;
    q.check()?;
    let b: MessagePost = body(&req.body)?;
    let prompt = b
        .prompt
        .or(b.message.map(|m| m.text))
        .ok_or_else(|| ServiceError::bad_request("`prompt` is required"))?;
    let Some(mode) = run_mode(b.run.as_deref())? else {
        return Err(ServiceError::bad_request(
            "a message starts a run: `run` is step or until_blocked here",
        ));
    };
    let run = match s
        .service
        .post_message(&who, &id, prompt, &b.params, mode)
        .await
    {
        Ok(run) => run,
        Err(e) => return s.or_forward(e, &id, &who, &req).await,
    };
    ran(&s, &id, &who, &q, run).await
}

async fn ran(s: &AppState, id: &str, who: &Caller, q: &WaitQuery, run: RunWait) -> ApiResult {
    let finished = q.wait(Some(run)).await;
    let status = if finished {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(view(s, id, who, None).await?)).into_response())
}

#[derive(Deserialize, Default)]
pub struct ParamsBody {
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    run: Option<String>,
}

async fn resume(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    req: Incoming,
) -> ApiResult {
    let who = s.caller(&req.headers, Some(&id), Door::OwnerOnly).await?;
    q.check()?;
    let b: ParamsBody = body(&req.body)?;
    let Some(mode) = run_mode(b.run.as_deref())? else {
        return Err(ServiceError::bad_request(
            "a resume starts a run: `run` is step or until_blocked here",
        ));
    };
    let run = match s.service.resume(&who, &id, &b.params, mode).await {
        Ok(run) => run,
        Err(e) => return s.or_forward(e, &id, &who, &req).await,
    };
    ran(&s, &id, &who, &q, run).await
}

async fn cancel(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let who = s.caller(&headers, Some(&id), Door::SessionToken).await?;
    s.service.cancel(&id).await?;
    Ok(Json(view(&s, &id, &who, None).await?).into_response())
}

async fn fork(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    b: Bytes,
) -> ApiResult {
    let who = s.caller(&headers, Some(&id), Door::OwnerOnly).await?;
    q.check()?;
    let b: CreateBody = body(&b)?;
    create(&s, &who, &q, b, Some(id)).await
}

async fn put_params(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Incoming,
) -> ApiResult {
    let who = s
        .caller(&req.headers, Some(&id), Door::SessionToken)
        .await?;
    let b: ParamsBody = body(&req.body)?;
    if let Caller::SessionToken(_) = who {
        return Err(ServiceError {
            status: 403,
            code: "forbidden_params",
            message: "a session token cannot set parameters".into(),
            params: b.params.keys().cloned().collect(),
        });
    }
    // Where the session's other secret values are, so that they stay together.
    if let Some(r) = s.forward_to_holder(&id, &who, &req).await {
        return Ok(r);
    }
    s.service.put_params(&who, &id, &b.params).await?;
    Ok(Json(view(&s, &id, &who, None).await?).into_response())
}

async fn revoke_token(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    s.caller(&headers, Some(&id), Door::OwnerOnly).await?;
    s.service.revoke_tokens(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/continuations/:token` body: `result` for a deferred call,
/// `approve` (and `reason`) for a confirmation, `choice` for a selection,
/// `input` for missing user-owned fields.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ContinuationBody {
    /// The session the caller means; a token of another session is unknown.
    session_id: Option<String>,
    result: Option<serde_json::Value>,
    approve: Option<bool>,
    reason: Option<String>,
    /// A selection's answer: the `id` of an offered option.
    choice: Option<String>,
    /// A `needs_input` item's answer: the missing fields.
    input: Option<serde_json::Map<String, serde_json::Value>>,
    resume: Option<bool>,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    run: Option<String>,
}

async fn continuation(
    State(s): State<Arc<AppState>>,
    Path(token): Path<String>,
    Query(q): Query<WaitQuery>,
    req: Incoming,
) -> ApiResult {
    let who = s.caller(&req.headers, None, Door::OwnerOnly).await?;
    let b: ContinuationBody = body(&req.body)?;
    let session = crate::session::pending::token_session(&token).map(str::to_owned);
    let mode = run_mode(b.run.as_deref())?;
    let answer = Answer {
        session_id: b.session_id,
        result: b.result,
        approve: b.approve,
        reason: b.reason,
        choice: b.choice,
        input: b.input,
        // `run: none` records the answer and starts nothing, like `resume: false`.
        resume: if mode.is_none() {
            Some(false)
        } else {
            b.resume
        },
        params: b.params,
        mode: mode.unwrap_or_default(),
    };
    let (id, run) = match s.service.answer(&who, &token, answer).await {
        Ok(answered) => answered,
        Err(e) => {
            let Some(id) = session else { return Err(e) };
            return s.or_forward(e, &id, &who, &req).await;
        }
    };
    match run {
        Some(run) => ran(&s, &id, &who, &q, run).await,
        None => Ok(Json(view(&s, &id, &who, None).await?).into_response()),
    }
}

#[derive(Deserialize, Default)]
pub struct EventsQuery {
    after: Option<i64>,
}

async fn events(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    req: Incoming,
) -> ApiResult {
    let who = s
        .caller(&req.headers, Some(&id), Door::SessionToken)
        .await?;
    // `delta` events exist only where the run is: a run on another server,
    // or the next one (that server holds the session's secret values),
    // streams from there.
    if !s.service.is_running(&id) {
        if let Some(r) = s.forward_to_holder(&id, &who, &req).await {
            return Ok(r);
        }
    }
    let after = req
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .or(q.after)
        .unwrap_or(0);
    let (stored, feed) = s.service.events(&id, after).await?;
    Ok(Sse::new(event_stream(s.service.clone(), stored, feed))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn to_sse(e: &crate::session::model::EventRecord) -> Event {
    Event::default()
        .id(e.seq.to_string())
        .event(e.kind.clone())
        .data(e.data.to_string())
}

/// Stored events first, then the feed's (see `Service::next_events`). A
/// subscriber that falls too far behind is dropped; it reconnects with
/// `Last-Event-ID`.
fn event_stream(
    service: Arc<Service>,
    stored: Vec<crate::session::model::EventRecord>,
    feed: Feed,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let replay = futures::stream::iter(stored.iter().map(to_sse).map(Ok).collect::<Vec<_>>());
    let live = futures::stream::unfold((service, feed), |(service, mut feed)| async move {
        let events = service.next_events(&mut feed).await?;
        let sse: Vec<_> = events
            .iter()
            .map(|e| match e {
                LiveEvent::Stored(e) => Ok(to_sse(e)),
                LiveEvent::Delta(text) => Ok(Event::default()
                    .event("delta")
                    .data(json!({"content": text}).to_string())),
            })
            .collect();
        Some((futures::stream::iter(sse), (service, feed)))
    });
    futures::StreamExt::chain(replay, futures::StreamExt::flatten(live))
}
