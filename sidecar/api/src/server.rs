//! The HTTP session API (agents-server's routes and shapes), over the
//! session service.

// utoipa's `IntoParams` expansion spells out paths that are in scope.
#![allow(unused_qualifications)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{door, Authed, Rule};
use super::openapi::{
    AnswerRefused, BadRequest, ErrorBody, Forbidden, ForbiddenAnswer, ForbiddenParams, ForkRequest,
    Health, NewSessionParams, NotFound, NotReady, NotRunning, ParamValues, Ready, ResumeBlocked,
    RunBlocked, SessionParams, SetParamsRequest, SseEvent, Unauthorized, BAD_REQUEST,
    INVALID_PARAMS,
};
use super::request::{body, run_mode, start_mode, ContinuationBody, WaitQuery};
use super::state::AppState;
use super::status::{ApiError, ApiResult};
use super::views::{
    agent_view, session_summary, session_view, AgentList, AgentView, SessionList, SessionView,
};
use bindery_session::error::{Code, ErrorKind, ServiceError};
use bindery_session::run::RunMode;
use bindery_session::service::{CreateSession, Opened};
use bindery_session::state::live_sessions::{Ended, RunWait};
use bindery_session::validate::Caller;
use bindery_store::health::StoreState;
use bindery_store::wire::{RunRequest, StartRun};

/// Every route of the API, each registered once: its handler's
/// `#[utoipa::path]` gives the router its path and method, and the
/// OpenAPI document its operation.
pub fn routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(list_agents))
        .routes(routes!(
            get_agent,
            super::stored_agents::put,
            super::stored_agents::delete
        ))
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session))
        .routes(routes!(post_message))
        .routes(routes!(resume))
        .routes(routes!(cancel))
        .routes(routes!(fork))
        .routes(routes!(put_params))
        .routes(routes!(revoke_token))
        .routes(routes!(super::shares::create, super::shares::list))
        .routes(routes!(super::shares::revoke))
        .routes(routes!(events))
        .routes(routes!(continuation))
        .routes(routes!(super::usage::report))
        .routes(routes!(super::audit::export))
        .routes(routes!(super::approvals::list))
        .routes(routes!(super::approvals::answer_link))
        .routes(routes!(super::mcp::post))
        // Every other method on /mcp (GET: no stream; DELETE: no session)
        // is a 405 that says `Allow: POST`.
        .route(
            "/mcp",
            MethodRouter::new().fallback(super::mcp::not_allowed),
        )
        .merge(super::chat::routes())
}

/// The OpenAPI document of [`routes()`], as `GET /openapi.json` serves it.
pub fn document() -> serde_json::Value {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            super::openapi::document(routes().into_openapi(), env!("CARGO_PKG_VERSION"))
        })
        .clone()
}

pub fn router(state: Arc<AppState>) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(|| async {
            ApiError(ServiceError::not_found("no such route (see /openapi.json)"))
        })
        // Inside `admit`: it sees a peer's forward only once its signature
        // was checked, and never forwards one again.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            super::holder::to_holder,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            super::rate_limit::tenant,
        ))
        .layer(middleware::from_fn_with_state(
            state.peer_auth.clone(),
            super::peers::admit,
        ))
        .layer(middleware::map_response(json_errors))
        .layer(middleware::from_fn_with_state(
            state.origins.clone(),
            super::origin::guard,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// Every request counted, in a span of its own (`request`, its method and
/// route, and the end user once their token is checked: see
/// `AppState::identify_with`), so that its log lines and traces name them.
async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        route = %route,
        subject = tracing::field::Empty
    );
    let response = next.run(req).instrument(span).await;
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

/// A session's view as JSON, in a buffer sized for its turns up front:
/// axum's `Json` starts at 128 bytes and grows by copying, a dozen copies
/// of a long conversation's view.
impl IntoResponse for SessionView {
    fn into_response(self) -> Response {
        let turns = bindery_llm::Turn::encoded_len(&self.session.turns);
        let mut body = Vec::with_capacity(turns + 1024);
        match serde_json::to_writer(&mut body, &self) {
            Ok(()) => (
                [(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            // Not seen: a view is strings, numbers and string-keyed maps.
            Err(e) => ApiError(ServiceError::new(
                ErrorKind::Internal,
                Code::Internal,
                format!("cannot encode the session: {e}"),
            ))
            .into_response(),
        }
    }
}

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

/// Liveness: the process is up
#[utoipa::path(get, path = "/healthz", tag = "health", operation_id = "healthz", security(),
    responses((status = 200, description = "Up.", body = Health)),
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// This document
#[utoipa::path(get, path = "/openapi.json", tag = "health", operation_id = "openapi",
    security(),
    responses((status = 200, description = "The OpenAPI 3.1 document.", body = Object)),
)]
async fn openapi() -> Json<serde_json::Value> {
    Json(document())
}

/// Readiness: the server can take requests
#[utoipa::path(get, path = "/readyz", tag = "health", operation_id = "readyz", security(), responses(
    (status = 200, description = "Ready.", body = Ready),
    (status = 503, description = "Not ready: starting, the session store does not answer, or it is damaged.",
        body = inline(NotReady)),
))]
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
    } else {
        match state.service.store_state() {
            StoreState::Answering => Json(json!({"status": "ready"})).into_response(),
            StoreState::Unavailable => not_ready(
                "store_unavailable",
                "the session store does not answer; see the server's log",
            ),
            StoreState::Corrupt => not_ready(
                "store_corrupt",
                "the session store is damaged: repair or restore it, then restart the server; see the server's log",
            ),
        }
    }
}

/// Prometheus metrics
#[utoipa::path(get, path = "/metrics", tag = "health", operation_id = "metrics", security(), responses(
    (status = 200, description = "The metrics as OpenMetrics text.", body = String,
        content_type = "application/openmetrics-text"),
))]
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            bindery_metrics::CONTENT_TYPE,
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The agents this server runs
#[utoipa::path(get, path = "/v1/agents", tag = "agents", operation_id = "listAgents", security(("ownerToken" = []), ("identityToken" = [])), responses(
    (status = 200, description = "Every agent.", body = AgentList),
    (status = 401, response = Unauthorized),
))]
async fn list_agents(State(s): State<Arc<AppState>>, _: Authed<door::OwnerOrEndUser>) -> ApiResult {
    let agents: Vec<_> = s
        .service
        .agents()
        .all()
        .await
        .into_iter()
        .map(|(a, source)| agent_view(&a, source))
        .collect();
    Ok(Json(AgentList { agents }).into_response())
}

/// One agent
#[utoipa::path(get, path = "/v1/agents/{slug}", tag = "agents", operation_id = "getAgent", security(("ownerToken" = []), ("identityToken" = [])),
    params(("slug" = String, Path, description = "The agent's slug.")),
    responses(
        (status = 200, description = "The agent.", body = AgentView),
        (status = 401, response = Unauthorized),
        (status = 404, description = "No such agent.", body = inline(NotFound)),
    ),
)]
async fn get_agent(
    State(s): State<Arc<AppState>>,
    Path(slug): Path<String>,
    _: Authed<door::OwnerOrEndUser>,
) -> ApiResult {
    let (agent, source) = s.service.agents().get(&slug).await?;
    Ok(Json(agent_view(&agent, source)).into_response())
}

// The fork route parses this too; the document shows its part as
// `ForkRequest`. It leaves out `message` (agents-server's form of `prompt`)
// and `at_turn` (a creation without `fork` takes none).
/// `POST /v1/sessions`'s body.
#[derive(Deserialize, Default, ToSchema)]
#[schema(as = CreateSessionRequest)]
pub struct CreateBody {
    /// The agent's slug.
    #[schema(value_type = String, required = true)]
    agent: Option<String>,
    /// A first message: starts a run.
    #[schema(value_type = String, required = false)]
    prompt: Option<String>,
    /// agents-server's `{"message": {"text": …}}` form of `prompt`.
    #[schema(ignore)]
    message: Option<MessageBody>,
    #[serde(default)]
    #[schema(value_type = ParamValues)]
    params: BTreeMap<String, serde_json::Value>,
    /// Values pinned for this session: set like `params`, then refused
    /// (403 `forbidden_params`) to every later request, the owner's too.
    /// A fork keeps its source's pins; its own `pin` replaces one (`null`
    /// drops it, and its value).
    #[serde(default)]
    #[schema(value_type = ParamValues)]
    pin: BTreeMap<String, serde_json::Value>,
    /// Only the owner may change the parameters from now on.
    #[serde(default)]
    seal: bool,
    /// Hand out a session token in the response.
    #[serde(default)]
    session_token: bool,
    /// The id of a session to start from a copy of.
    #[schema(value_type = String, required = false)]
    fork: Option<String>,
    /// With a fork: copy only the turns before this index (any JSON number
    /// that is a whole one: `3.0` too).
    #[schema(ignore)]
    at_turn: Option<serde_json::Number>,
    /// `none` creates the session idle even with a prompt; `step` runs one
    /// model turn; `until_blocked` (the default) until the answer or a
    /// pending call.
    #[serde(default)]
    run: RunRequest,
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
        Ok(match run_mode(self.run) {
            Some(mode) => (prompt, mode),
            None => (None, RunMode::UntilBlocked),
        })
    }
}

/// Start a session, or fork one, and optionally a first run
///
/// With `prompt`, a first run starts at once. With `fork`, the new session
/// starts from a copy of that session's conversation and parameters.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", operation_id = "createSession", security(("ownerToken" = []), ("identityToken" = [])),
    params(WaitQuery),
    request_body = CreateBody,
    responses(
        (status = 201, body = SessionView, description = "Created, and the run (if any) \
            finished. `session_token` is there, this once, when it was asked for."),
        (status = 202, body = SessionView,
            description = "Created, and a run was started and not waited for."),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, body = inline(ForbiddenParams), description = "Parameters that may \
            not be set here: process-scope or pinned ones."),
        (status = 404, body = inline(NotFound),
            description = "No such agent, or no such session to fork from."),
        (status = 422, description = INVALID_PARAMS, body = inline(NewSessionParams)),
    ),
)]
async fn create_session(
    State(s): State<Arc<AppState>>,
    Query(q): Query<WaitQuery>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
    b: Bytes,
) -> ApiResult {
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
        .sessions()
        .create(
            who,
            CreateSession {
                agent: b.agent,
                prompt,
                params: b.params,
                pin: b.pin,
                seal: b.seal,
                session_token: b.session_token,
                fork,
                mode,
                owner: None,
                at_turn: turn_index(b.at_turn)?,
                call: None,
            },
        )
        .await?;
    let ended = q.wait(created.run).await;
    let view = view(s, &created.id, who, created.token, ended).await?;
    Ok((StatusCode::CREATED, view).into_response())
}

/// The session as `who` may see it: as the run that `ended` left it, or
/// as stored now.
async fn view(
    s: &AppState,
    id: &str,
    who: &Caller,
    token: Option<String>,
    ended: Option<Ended>,
) -> Result<SessionView, ServiceError> {
    let rec = match ended.and_then(|e| e.record) {
        Some(rec) => Arc::unwrap_or_clone(rec),
        None => s.service.record(id).await?,
    };
    let mut pending = s.service.approvals().pending_view(&rec);
    if let Caller::EndUser(_) = who {
        // An end user answers the choices of their conversation; an
        // approval's token is the owner's and the approver's.
        for (p, call) in pending.iter_mut().zip(rec.pending.open()) {
            if !bindery_session::service::end_user_answers(call) {
                p.continuation_token = None;
            }
        }
    }
    let usage = s.service.budgets().session_usage(&rec).await;
    let mut v = session_view(rec, s.service.secrets().names(id), token);
    v.pending = pending;
    v.usage = usage;
    if who.of_one_session() {
        // A session token or a share may read the conversation, not its
        // parameters, and cannot answer a pending call.
        v.params.clear();
        v.secret_params.clear();
        for p in &mut v.pending {
            p.continuation_token = None;
        }
    }
    Ok(v)
}

/// Every session
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", operation_id = "listSessions", security(("ownerToken" = []), ("identityToken" = [])),
    responses((status = 200, description = "The sessions.", body = SessionList), (status = 401, response = Unauthorized)),
)]
async fn list_sessions(
    State(s): State<Arc<AppState>>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
) -> ApiResult {
    let sessions: Vec<_> = s
        .service
        .store()
        .list()
        .await?
        .iter()
        // An end user's own sessions only.
        .filter(|r| bindery_session::service::may_use(&who, r))
        .map(session_summary)
        .collect();
    Ok(Json(SessionList { sessions }).into_response())
}

/// One session
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", operation_id = "getSession",
    security(("ownerToken" = []), ("sessionToken" = []), ("shareToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    responses((status = 200, description = "The session.", body = SessionView), (status = 401, response = Unauthorized), (status = 404, description = "No such session.", body = inline(NotFound))),
)]
async fn get_session(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Authed { caller: who, .. }: Authed<door::Reader>,
) -> ApiResult {
    Ok(view(&s, &id, &who, None, None).await?.into_response())
}

#[derive(Deserialize, Default, ToSchema)]
#[schema(as = MessageRequest)]
pub struct MessagePost {
    #[schema(value_type = String, required = true)]
    prompt: Option<String>,
    // agents-server's form of `prompt`; the document shows `prompt` only.
    #[schema(ignore)]
    message: Option<MessageBody>,
    #[serde(default)]
    #[schema(value_type = ParamValues)]
    params: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    run: StartRun,
}

/// Say something: add a user message and start a run
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    operation_id = "postMessage", security(("ownerToken" = []), ("sessionToken" = []), ("shareToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id."), WaitQuery),
    request_body = MessagePost,
    responses(
        (status = 200, description = "The run finished (waited for).", body = SessionView),
        (status = 202, description = "The run started and was not waited for.",
            body = SessionView),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, body = inline(ForbiddenAnswer), description = "Parameters this caller \
            may not set: process-scope or pinned ones, or any session value of a sealed \
            session for a session-token holder; or (`forbidden`) a session-token or share \
            holder's message that picks an option of a pending selection, which only the owner \
            answers, or a read-only share."),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 409, body = inline(RunBlocked), description = "A run is in progress \
            (`run_in_progress`), the session waits for pending calls (`waiting_external`), \
            or required parameters are still unbound (`params_required`)."),
        (status = 422, description = INVALID_PARAMS, body = inline(SessionParams)),
    ),
)]
async fn post_message(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    Authed { caller: who, .. }: Authed<door::OwnerOrSessionToken>,
    b: Bytes,
) -> ApiResult {
    q.check()?;
    let b: MessagePost = body(&b)?;
    let prompt = b
        .prompt
        .or(b.message.map(|m| m.text))
        .ok_or_else(|| ServiceError::bad_request("`prompt` is required"))?;
    let mode = start_mode(b.run);
    let run = s
        .service
        .sessions()
        .post_message(&who, &id, prompt, &b.params, mode)
        .await?;
    ran(&s, &id, &who, &q, run).await
}

async fn ran(s: &AppState, id: &str, who: &Caller, q: &WaitQuery, run: RunWait) -> ApiResult {
    let ended = q.wait(Some(run)).await;
    let status = if ended.is_some() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, view(s, id, who, None, ended).await?).into_response())
}

// The params route parses this too; the document shows its part as
// `SetParamsRequest`.
/// `POST /v1/sessions/{id}/resume`'s body.
#[derive(Deserialize, Default, ToSchema)]
#[schema(as = ResumeRequest)]
pub struct ParamsBody {
    #[serde(default)]
    #[schema(value_type = ParamValues)]
    params: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    run: StartRun,
}

/// Start a run again from where the conversation stands
///
/// For a session whose last run failed or was cancelled; `params` may first
/// bind what was missing.
#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions",
    operation_id = "resumeSession", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id."), WaitQuery),
    request_body(content = Option<ParamsBody>),
    responses(
        (status = 200, description = "The run finished (waited for).", body = SessionView),
        (status = 202, description = "The run started and was not waited for.",
            body = SessionView),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 409, body = inline(ResumeBlocked), description = "A run is in progress, a \
            pending call is not answered yet, required parameters are still unbound, or the \
            last run answered and there is nothing to resume."),
        (status = 422, description = INVALID_PARAMS, body = inline(SessionParams)),
    ),
)]
async fn resume(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
    b: Bytes,
) -> ApiResult {
    q.check()?;
    let b: ParamsBody = body(&b)?;
    let mode = start_mode(b.run);
    let run = s
        .service
        .sessions()
        .resume(&who, &id, &b.params, mode)
        .await?;
    ran(&s, &id, &who, &q, run).await
}

/// Cancel the run in progress (or the calls it waits for)
#[utoipa::path(post, path = "/v1/sessions/{id}/cancel", tag = "sessions",
    operation_id = "cancelSession", security(("ownerToken" = []), ("sessionToken" = []), ("shareToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "Cancelled.", body = SessionView),
        (status = 401, response = Unauthorized),
        (status = 403, description = "A read-only share.", body = inline(Forbidden)),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 409, description = "No run is in progress.", body = inline(NotRunning)),
    ),
)]
async fn cancel(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Authed { caller: who, .. }: Authed<door::OwnerOrSessionToken>,
) -> ApiResult {
    s.service.runs().cancel(&id).await?;
    Ok(view(&s, &id, &who, None, None).await?.into_response())
}

/// Start a new session from a copy of this one
///
/// The copy takes the conversation (up to `at_turn` when given) and the
/// session's parameter values; `params` then changes them. With `prompt`, a
/// first run starts at once.
#[utoipa::path(post, path = "/v1/sessions/{id}/fork", tag = "sessions",
    operation_id = "forkSession", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    request_body(content = Option<ForkRequest>),
    responses(
        (status = 201, body = SessionView, description = "The new session. `session_token` \
            is there, this once, when it was asked for."),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, body = ErrorBody, description = "Session-token holders may not \
            fork, or parameters that may not be set (process-scope or pinned ones)."),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 422, description = INVALID_PARAMS, body = inline(NewSessionParams)),
    ),
)]
async fn fork(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    Authed { caller: who, .. }: Authed<door::OwnerOrEndUser>,
    b: Bytes,
) -> ApiResult {
    q.check()?;
    let b: CreateBody = body(&b)?;
    create(&s, &who, &q, b, Some(id)).await
}

/// Set or remove session-scope parameter values
#[utoipa::path(put, path = "/v1/sessions/{id}/params", tag = "sessions",
    operation_id = "setSessionParams", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    request_body = SetParamsRequest,
    responses(
        (status = 200, description = "The session, with its new values.", body = SessionView),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, body = ErrorBody, description = "Not allowed: a session token was \
            used, the session is sealed and the caller is not its owner, or the parameters \
            are process-scope or pinned."),
        (status = 404, description = "No such session.", body = inline(NotFound)),
        (status = 422, body = inline(SessionParams), description = "Parameters not declared \
            by the agent (`unknown_params`), or values that do not fit (`invalid_params`: \
            wrong type, a secret that is not a string, a message-scope parameter, or a \
            body with keys beside `params`)."),
    ),
)]
async fn put_params(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Authed { caller: who, .. }: Authed<door::OwnerOrSessionToken>,
    bytes: Bytes,
) -> ApiResult {
    let b: ParamsBody = body(&bytes)?;
    let stray = beside_params(&bytes);
    if who.of_one_session() {
        let what = match who {
            Caller::Share(_) => "a share link",
            _ => "a session token",
        };
        return Err(ServiceError {
            extra: None,
            kind: ErrorKind::Forbidden,
            code: Code::ForbiddenParams,
            message: format!("{what} cannot set parameters"),
            params: b.params.keys().cloned().collect(),
        }
        .into());
    }
    if !stray.is_empty() {
        // An unknown session is a 404 whatever the body.
        view(&s, &id, &who, None, None).await?;
        return Err(ServiceError {
            extra: None,
            kind: ErrorKind::Invalid,
            code: Code::InvalidParams,
            message: format!(
                "the body holds {} beside `params`; this route takes {{\"params\": {{\"NAME\": value, …}}}} (null removes a value), nothing else",
                stray.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
            ),
            params: stray,
        }
        .into());
    }
    s.service
        .sessions()
        .put_params(&who, &id, &b.params)
        .await?;
    Ok(view(&s, &id, &who, None, None).await?.into_response())
}

/// The keys of a PUT params body beside `params`. Values put at the top
/// level (`{"tenant": "x"}`) would otherwise be dropped in silence, with a
/// 200 that changed nothing.
fn beside_params(bytes: &Bytes) -> Vec<String> {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(serde_json::Value::Object(o)) => o.keys().filter(|k| *k != "params").cloned().collect(),
        _ => Vec::new(),
    }
}

/// Revoke every session token and every share link of this session
#[utoipa::path(delete, path = "/v1/sessions/{id}/token", tag = "sessions",
    operation_id = "revokeSessionTokens", security(("ownerToken" = []), ("identityToken" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    responses((status = 204, description = "Revoked (also when there was none): the session's tokens and its share links; the event streams opened with them end at once."), (status = 401, response = Unauthorized), (status = 404, description = "No such session.", body = inline(NotFound))),
)]
async fn revoke_token(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    who: Authed<door::OwnerOrEndUser>,
) -> ApiResult {
    s.service.tokens().revoke(&who.caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Answer a pending tool call: a deferred call's result, or a decision
///
/// Each item of a session's `pending` carries a `continuation_token`. For a
/// `deferred` call send `result` (the tool's output: a string, or any JSON
/// given to the model as its text); for a `confirm` call send `approve` (and
/// an optional `reason`, which the model reads when the call is refused);
/// for a `needs_selection` item send `choice` (the `id` of one of its
/// `options`), for `needs_confirmation` `approve`, for `needs_input` `input`
/// (the missing fields). A selection or confirmation that rests on lookups
/// past their `ttl_ms` is refused (409 `continuation_expired`) and asked
/// again. The token names its session (`ct_<session id>_<mac>`): no other
/// identifier is needed. `session_id` may say which session the caller
/// means; a token of another session is then unknown (404). A token is good
/// for one answer (a second is 409 `continuation_used`), and is bound to the
/// exact call: the tool, the model's arguments and the names of the
/// parameters bound into it; when those changed (the agent was reloaded with
/// other bindings) the answer is 409 `call_changed`. Past the agent's
/// `confirmTtl` the call is closed as not approved (409
/// `continuation_expired`). When the last pending call is answered the run
/// resumes (unless `resume: false` or `run: none`); `params` then follow the
/// same rules as on resume, so message-scope values come with this request,
/// and a call that gets a secret session value this server no longer holds
/// (after a restart) answers 409 `params_required` until it is given again
/// with `PUT /v1/sessions/{id}/params`. The owner, or the approver (who
/// may set no `params`, and is answered with the session's status and what
/// it waits for, never its turns). `clear_taint: true` clears the taint
/// guard with the answer.
#[utoipa::path(post, path = "/v1/continuations/{token}", tag = "sessions",
    operation_id = "postContinuation", security(("ownerToken" = []), ("approverToken" = []), ("identityToken" = [])),
    params(
        ("token" = String, Path, description = "The pending item's `continuation_token`."),
        WaitQuery,
    ),
    request_body = ContinuationBody,
    responses(
        (status = 200, body = SessionView, description = "The answer is recorded; the run it \
            resumed finished or blocked again (waited for), or no run was started."),
        (status = 202, description = "The run resumed and was not waited for.",
            body = SessionView),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, body = inline(ForbiddenAnswer), description = "A session token \
            (`forbidden`: only the owner answers pending calls), or parameters this caller \
            may not set."),
        (status = 404, description = "No pending call of the named session has this token.",
            body = inline(NotFound)),
        (status = 409, body = inline(AnswerRefused), description = "The token was used \
            already, the call changed, the confirmation expired, or a required or bound \
            secret value is missing."),
        (status = 422, description = INVALID_PARAMS, body = inline(SessionParams)),
    ),
)]
async fn continuation(
    State(s): State<Arc<AppState>>,
    Path(token): Path<String>,
    Query(q): Query<WaitQuery>,
    // The token names its session: a session token of that session is
    // known here, so that the service refuses it as it does on every path
    // that answers a pending call (any other token is none).
    Authed { caller: who, .. }: Authed<door::Approvals>,
    b: Bytes,
) -> ApiResult {
    let b: ContinuationBody = body(&b)?;
    let answer = b.into_answer()?;
    let (id, run) = s.service.sessions().answer(&who, &token, answer).await?;
    if who == Caller::Approver {
        return super::approvals::answered(&s, &id, &q, run, false).await;
    }
    match run {
        Some(run) => ran(&s, &id, &who, &q, run).await,
        None => Ok(view(&s, &id, &who, None, None).await?.into_response()),
    }
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Like `Last-Event-ID`, which wins when both are given.
    #[param(value_type = i64, required = false)]
    after: Option<i64>,
}

/// Follow the session's events (server-sent events)
///
/// Each event is sent as `id: <seq>` (left out for `delta`), `event: <kind>`
/// and `data: <JSON>`. With `Last-Event-ID`, the stored events after that id
/// are replayed first. `x-events` gives the `data` schema of each kind.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "sessions",
    operation_id = "streamEvents", security(("ownerToken" = []), ("sessionToken" = []), ("shareToken" = []), ("identityToken" = [])),
    params(
        ("id" = String, Path, description = "The session's id."),
        ("Last-Event-ID" = Option<String>, Header, description = "Replay the stored events \
            after this one (an event's `id`) before following new ones. A value that is not \
            a whole number is ignored."),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "The event stream; it stays open.", body = inline(SseEvent),
            content_type = "text/event-stream"),
        (status = 400, description = BAD_REQUEST, body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 404, description = "No such session.", body = inline(NotFound)),
    ),
)]
async fn events(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    Authed { caller: who, .. }: Authed<door::Reader>,
    headers: HeaderMap,
) -> ApiResult {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .or(q.after)
        .unwrap_or(0);
    let opened = match &who {
        Caller::SessionToken(_) => Opened::SessionToken,
        Caller::Share(holder) => Opened::Share(holder.share.clone()),
        _ => Opened::Standing,
    };
    let revocable = opened != Opened::Standing;
    let (stored, feed) = s.service.recorder().events(&id, after, opened).await?;
    if revocable {
        // Subscribed: a revocation from now on ends this stream. One that
        // came between the check above and the subscription shows here
        // (the store is read again).
        Rule::Read.admit(s.identify(&headers, Some(&id)).await)?;
    }
    Ok(super::event_stream::response(
        s.service.clone(),
        stored,
        feed,
    ))
}
