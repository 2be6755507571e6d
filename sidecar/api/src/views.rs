//! JSON shapes of the API's answers (agents-server compatible). No view
//! ever holds a parameter's value unless it is a non-secret session value.

use serde::Serialize;
use utoipa::ToSchema;

use bindery_llm::{ChatMessage, Turn};
use bindery_params::ParamStatus;
use bindery_store::model::{SessionRecord, SessionStatus};
use bindery_store::wire::PendingItem;
use bindery_tools::Disposition;
use bindery_tree::LoadedAgent;

/// An agent as callers see it: what it takes, never any value.
#[derive(Serialize, ToSchema)]
pub struct AgentView {
    pub slug: String,
    /// Where its definition comes from: `file` (the server's files),
    /// `crd` (an `Agent` resource, given by the operator) or `store` (kept
    /// over the API).
    pub source: bindery_session::state::agents::AgentSource,
    /// What the agent says it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub announce: Option<String>,
    pub parameters: Vec<ParameterView>,
    /// The names of the tools the agent may call.
    pub tools: Vec<String>,
    /// The tools whose calls wait, by name: for a person's approval
    /// (`confirm`) or for the client's result (`deferred`).
    pub waits: std::collections::BTreeMap<String, Disposition>,
    /// The tools with `depends_on`, by name: their lookups, in order. Their
    /// calls may stop at `needs_input`, `needs_selection` or
    /// `needs_confirmation`.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub depends_on: std::collections::BTreeMap<String, Vec<String>>,
    /// MCP clients see its tools on `/mcp` besides `ask_<slug>`
    /// (`spec.mcp.exposeTools`), deferred ones excepted.
    pub exposes_tools: bool,
    /// The tools whose output may carry instructions from outside
    /// (`untrusted: true`).
    pub untrusted: Vec<String>,
    /// The tools that can send data out (`egress: true`): after an
    /// untrusted result, their calls wait for a person.
    pub egress: Vec<String>,
    /// What caps the agent's runs (its own budgets, or a tenant's over
    /// them): see `GET /v1/usage` for what was used.
    pub budgets: Vec<BudgetView>,
}

/// One budget of an agent.
#[derive(Serialize, ToSchema)]
pub struct BudgetView {
    pub name: String,
    pub meter: bindery_spec::budget::Meter,
    pub limit: f64,
    /// The window: a duration (`24h`), `session` or `run`.
    pub per: String,
    pub on_exceed: bindery_spec::budget::OnExceed,
}

/// `GET /v1/agents`.
#[derive(Serialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentView>,
}

/// `GET /v1/sessions`.
#[derive(Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionSummary>,
}

#[derive(Serialize, ToSchema)]
pub struct ParameterView {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub description: Option<String>,
    /// Who sets it: the server (process), a session, or each message.
    pub scope: bindery_spec::Scope,
    pub secret: bool,
    pub required: bool,
    /// A value is bound at process level.
    pub bound: bool,
    /// The process-level value may not be overridden.
    pub pinned: bool,
}

impl From<ParamStatus> for ParameterView {
    fn from(s: ParamStatus) -> Self {
        ParameterView {
            name: s.name,
            description: s.description,
            scope: s.scope,
            secret: s.secret,
            required: s.required,
            bound: s.bound,
            pinned: s.pinned,
        }
    }
}

pub fn agent_view(
    a: &LoadedAgent,
    source: bindery_session::state::agents::AgentSource,
) -> AgentView {
    AgentView {
        slug: a.name.clone(),
        source,
        announce: a.spec.announce.clone(),
        parameters: a
            .params
            .statuses()
            .into_iter()
            .map(ParameterView::from)
            .collect(),
        tools: a.tools.iter().map(|t| t.name().to_string()).collect(),
        waits: a
            .tools
            .iter()
            .filter_map(|t| Some((t.name().to_string(), a.disposition(t.name(), Some(&t))?)))
            .collect(),
        depends_on: a
            .tools
            .iter()
            .filter(|t| !t.depends().is_empty())
            .map(|t| {
                let deps = t.depends().iter().map(|d| d.tool.clone()).collect();
                (t.name().to_string(), deps)
            })
            .collect(),
        exposes_tools: a.spec.mcp.expose_tools,
        untrusted: a
            .tools
            .iter()
            .filter(|t| t.untrusted())
            .map(|t| t.name().to_string())
            .collect(),
        egress: a
            .tools
            .iter()
            .filter(|t| t.egress())
            .map(|t| t.name().to_string())
            .collect(),
        budgets: a
            .budget_limits()
            .into_iter()
            .map(|l| BudgetView {
                meter: l.meter,
                limit: l.limit,
                on_exceed: l.on_exceed,
                per: l.per_text,
                name: l.name,
            })
            .collect(),
    }
}

#[derive(Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    /// The agent's slug.
    pub agent: String,
    /// The session this one was forked from (agents-server's name; same as
    /// `forked_from`).
    pub parent_session_id: Option<String>,
    /// Who created the session: `owner` (this API) or `mcp` (a call on
    /// /mcp).
    pub owner: String,
    /// The end user the session belongs to (their identity token's
    /// subject), when one created or forked it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// `idle`: ready for a message; `running`: a run is in progress;
    /// `failed`: the last run failed (see `status_detail`);
    /// `waiting_external`: the run stopped with tool calls pending (see
    /// `pending`).
    pub status: SessionStatus,
    /// Why the last run failed, stopped, or what it waits for.
    pub status_detail: Option<String>,
    /// Bumped on every change of the session.
    pub version: i64,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// The session this one was forked from.
    pub forked_from: Option<String>,
    /// Only the owner may change parameters.
    pub sealed: bool,
    /// The session's non-secret values, by parameter name.
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The names of the secret values the session holds; never the values.
    pub secret_params: Vec<String>,
    /// The names pinned for this session: no request may give them (fork
    /// with a new `pin` to change one).
    pub pinned: Vec<String>,
    #[schema(inline)]
    pub session: Turns,
    /// Tool calls the run waits for, each answered through its
    /// continuation. A session-token holder sees them without tokens.
    pub pending: Vec<PendingItem>,
    /// What the session's runs used (null when the store could not say).
    pub usage: Option<bindery_store::usage::SessionUsage>,
    /// A new session token (`st_…`), only in the response that created it
    /// (session creation or fork with `session_token: true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub session_token: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Turns {
    /// The conversation, oldest first. What the model reasoned before a
    /// reply (kept to send back to its provider) is not shown.
    #[schema(value_type = Vec<ChatMessage>)]
    pub turns: Vec<Turn>,
}

#[derive(Serialize, ToSchema)]
pub struct SessionSummary {
    pub session_id: String,
    pub agent: String,
    pub status: SessionStatus,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    pub forked_from: Option<String>,
    /// The end user the session belongs to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

pub fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

pub fn session_view(
    rec: SessionRecord,
    secret_params: Vec<String>,
    token: Option<String>,
) -> SessionView {
    SessionView {
        session_id: rec.id,
        agent: rec.agent,
        parent_session_id: rec.forked_from.clone(),
        owner: rec
            .security
            .owner
            .clone()
            .unwrap_or_else(|| "owner".to_string()),
        subject: rec.security.subject.as_ref().map(|s| s.to_string()),
        status: rec.status,
        status_detail: rec.status_detail,
        version: rec.version,
        created_at: rfc3339(rec.created_at),
        updated_at: rfc3339(rec.updated_at),
        forked_from: rec.forked_from,
        sealed: rec.security.sealed,
        params: rec.params.as_map().clone().into_iter().collect(),
        secret_params,
        pinned: rec.security.pinned.clone(),
        session: Turns { turns: rec.turns },
        pending: Vec::new(),
        usage: None,
        session_token: token,
    }
}

pub fn session_summary(rec: &SessionRecord) -> SessionSummary {
    SessionSummary {
        session_id: rec.id.clone(),
        agent: rec.agent.clone(),
        status: rec.status,
        created_at: rfc3339(rec.created_at),
        updated_at: rfc3339(rec.updated_at),
        forked_from: rec.forked_from.clone(),
        subject: rec.security.subject.as_ref().map(|s| s.to_string()),
    }
}
