//! `PUT` and `DELETE /v1/agents/:slug`: agents kept in the session store
//! (see `session::service::stored` for what a stored agent may use).
//! Owner only, like every agent route.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::{door, Authed};
use super::openapi::{
    AgentExists, BadRequest, InvalidAgent, NotFound, StoredAgentsDisabled, Unauthorized,
};
use super::state::AppState;
use super::views::{agent_view, AgentView};
use bindery_session::error::ServiceError;

/// `PUT /v1/agents/:slug`'s answer.
#[derive(Serialize, ToSchema)]
pub struct PutAgentReply {
    pub agent: AgentView,
    /// What loading it warned about (fields Bindery does not read, …).
    pub warnings: Vec<String>,
}

/// Keep an agent
///
/// The body is the agent's definition: Bindery's document (`apiVersion`,
/// `kind: Agent`, `metadata.name`, `spec`; JSON, or YAML with any
/// content type) or an agents-exe JSON agent file. Its name must be the
/// slug. It is checked exactly as a file is, and may use only toolboxes
/// that run no code on the server (OpenAPI and PostgREST by URL, MCP by
/// URL, deferred, builtins other than `env-vars` and `attach-file`). Only on a server
/// started with `--stored-agents`.
#[utoipa::path(put, path = "/v1/agents/{slug}", tag = "agents", operation_id = "putAgent", security(("ownerToken" = [])),
    params(("slug" = String, Path, description = "The agent's slug.")),
    request_body(content = Object, content_type = "application/json", description = "The agent's definition."),
    responses(
        (status = 200, description = "Replaced.", body = PutAgentReply),
        (status = 201, description = "Kept.", body = PutAgentReply),
        (status = 400, description = "The body is not JSON or YAML.", body = inline(BadRequest)),
        (status = 401, response = Unauthorized),
        (status = 403, description = "This server keeps no agents (no `--stored-agents`).", body = inline(StoredAgentsDisabled)),
        (status = 409, description = "An agent of the server's files has this slug.", body = inline(AgentExists)),
        (status = 422, description = "The definition does not load; `message` lists every problem, as `check` would.", body = inline(InvalidAgent)),
    ),
)]
pub async fn put(
    State(s): State<Arc<AppState>>,
    Path(slug): Path<String>,
    who: Authed<door::Owner>,
    body: axum::body::Bytes,
) -> Result<Response, super::status::ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ServiceError::bad_request("the body is not UTF-8 text"))?;
    let (created, agent, warnings) = s.service.agents().put(&who.caller, &slug, text).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let reply = PutAgentReply {
        agent: agent_view(&agent, bindery_session::state::agents::AgentSource::Store),
        warnings,
    };
    Ok((status, Json(reply)).into_response())
}

/// Forget a stored agent
///
/// Its sessions stay readable; they no longer run.
#[utoipa::path(delete, path = "/v1/agents/{slug}", tag = "agents", operation_id = "deleteAgent", security(("ownerToken" = [])),
    params(("slug" = String, Path, description = "The agent's slug.")),
    responses(
        (status = 204, description = "Forgotten."),
        (status = 401, response = Unauthorized),
        (status = 403, description = "This server keeps no agents (no `--stored-agents`).", body = inline(StoredAgentsDisabled)),
        (status = 404, description = "No stored agent has this slug.", body = inline(NotFound)),
        (status = 409, description = "The slug is a file agent's, which the API does not remove.", body = inline(AgentExists)),
    ),
)]
pub async fn delete(
    State(s): State<Arc<AppState>>,
    Path(slug): Path<String>,
    who: Authed<door::Owner>,
) -> Result<Response, super::status::ApiError> {
    s.service.agents().delete(&who.caller, &slug).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
