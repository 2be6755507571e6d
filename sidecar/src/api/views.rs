//! JSON shapes of the API's answers (agents-server compatible). No view
//! ever holds a parameter's value unless it is a non-secret session value.

use serde::Serialize;

use crate::llm::ChatMessage;
use crate::params::ParamStatus;
use crate::session::model::SessionRecord;
use crate::tools::Disposition;
use crate::tree::LoadedAgent;

#[derive(Serialize)]
pub struct AgentView {
    pub slug: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announce: Option<String>,
    pub parameters: Vec<ParameterView>,
    pub tools: Vec<String>,
    /// Tool name → `confirm` or `deferred`, for the tools whose calls wait.
    pub waits: std::collections::BTreeMap<String, Disposition>,
    /// Tool name → the lookups that run before it (`depends_on`), in order.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub depends_on: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Serialize)]
pub struct ParameterView {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub scope: &'static str,
    pub secret: bool,
    pub required: bool,
    pub bound: bool,
    pub pinned: bool,
}

impl From<ParamStatus> for ParameterView {
    fn from(s: ParamStatus) -> Self {
        ParameterView {
            name: s.name,
            description: s.description,
            scope: s.scope.as_str(),
            secret: s.secret,
            required: s.required,
            bound: s.bound,
            pinned: s.pinned,
        }
    }
}

pub fn agent_view(a: &LoadedAgent) -> AgentView {
    AgentView {
        slug: a.name.clone(),
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
    }
}

#[derive(Serialize)]
pub struct SessionView {
    pub session_id: String,
    pub agent: String,
    /// The session this one was forked from (agents-server's name for it).
    pub parent_session_id: Option<String>,
    /// Who created it: `owner` (the session API) or `mcp`.
    pub owner: String,
    pub status: &'static str,
    pub status_detail: Option<String>,
    pub version: i64,
    pub created_at: String,
    pub updated_at: String,
    pub forked_from: Option<String>,
    pub sealed: bool,
    /// Non-secret session values.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Names of the secret values the session holds now.
    pub secret_params: Vec<String>,
    pub session: Turns,
    pub pending: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

#[derive(Serialize)]
pub struct Turns {
    pub turns: Vec<ChatMessage>,
}

#[derive(Serialize)]
pub struct SessionSummary {
    pub session_id: String,
    pub agent: String,
    pub status: &'static str,
    pub created_at: String,
    pub updated_at: String,
    pub forked_from: Option<String>,
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
        status: rec.status.as_str(),
        status_detail: rec.status_detail,
        version: rec.version,
        created_at: rfc3339(rec.created_at),
        updated_at: rfc3339(rec.updated_at),
        forked_from: rec.forked_from,
        sealed: rec.security.sealed,
        params: rec.params.as_map().clone().into_iter().collect(),
        secret_params,
        session: Turns { turns: rec.turns },
        pending: Vec::new(),
        session_token: token,
    }
}

pub fn session_summary(rec: &SessionRecord) -> SessionSummary {
    SessionSummary {
        session_id: rec.id.clone(),
        agent: rec.agent.clone(),
        status: rec.status.as_str(),
        created_at: rfc3339(rec.created_at),
        updated_at: rfc3339(rec.updated_at),
        forked_from: rec.forked_from.clone(),
    }
}
