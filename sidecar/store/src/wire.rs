//! What clients see of a session, as Rust types: the events a run sends
//! (stored, streamed over SSE, read back over `/mcp`), the pending items a
//! view and a `pending` event list, and the words they share. Each type is
//! what is sent, and `/openapi.json` derives its schemas from these same
//! types, so the document cannot drift from the wire.
//!
//! Pure: no I/O. A stored event is its kind and its `data` as JSON
//! ([`SessionEvent::kind`], [`SessionEvent::data`]); reading one back
//! keeps that JSON as it is, so a store written by an older or newer
//! server still reads.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::model::SessionStatus;
use crate::usage::Totals;
use bindery_metrics::{RunOutcome, ToolCaller};
use bindery_spec::budget::{Limit, Meter, Per};
use bindery_tools::Disposition;

/// Defines [`SessionEvent`] from its variants, each with its SSE `event`
/// name, so the kind, the data and the schema list come from one table.
macro_rules! session_events {
    ($($(#[$doc:meta])* $variant:ident($data:ty) = $kind:literal,)*) => {
        /// One event of a session's stream, as a run (or an answer, a
        /// cancel, a change of values) makes it.
        #[derive(Clone, Debug, PartialEq)]
        pub enum SessionEvent {
            $($(#[$doc])* $variant($data),)*
        }

        impl SessionEvent {
            /// The SSE `event` name, and the stored kind.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(SessionEvent::$variant(_) => $kind,)*
                }
            }

            /// The SSE `data`, and the stored data.
            pub fn data(&self) -> Value {
                let data = match self {
                    $(SessionEvent::$variant(d) => serde_json::to_value(d),)*
                };
                data.expect("an event's data is plain JSON")
            }

            /// Each stored kind with the schema name of its data, for
            /// `/openapi.json`'s `x-events`.
            pub fn kinds() -> Vec<(&'static str, String)> {
                vec![$(($kind, <$data as ToSchema>::name().into_owned()),)*]
            }

            /// The schemas of every kind's data, and of what they hold.
            pub fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
                $(
                    out.push((<$data as ToSchema>::name().into_owned(), <$data as PartialSchema>::schema()));
                    <$data as ToSchema>::schemas(out);
                )*
            }
        }
    };
}

session_events! {
    /// A run began.
    RunStarted(RunStarted) = "run_started",
    /// The model's text (with or without tool calls).
    Message(AssistantText) = "message",
    /// A tool call, as the model (or an MCP client) made it.
    ToolCall(ToolCallEvent) = "tool_call",
    /// What a tool call gave back.
    ToolResult(ToolResult) = "tool_result",
    /// The run stopped; these calls wait.
    Pending(PendingEvent) = "pending",
    /// A pending call was answered or closed.
    Resolved(Resolved) = "resolved",
    /// The run ended.
    RunFinished(RunFinished) = "run_finished",
    /// Session values were set or removed.
    ParamsChanged(ParamsChanged) = "params_changed",
    /// A budget went past 80% of its limit, or reached it.
    Budget(BudgetEvent) = "budget",
    /// The model failed and its next fallback was asked instead.
    ModelFallback(ModelFallback) = "model_fallback",
    /// A budget past its `downgrade.at`: the run's requests go to a cheaper
    /// model.
    ModelDowngrade(ModelDowngrade) = "model_downgrade",
    /// Session tokens or share links were revoked: the streams opened with
    /// them end, on every replica.
    AccessRevoked(AccessRevoked) = "access_revoked",
}

/// `model_downgrade`: budget `budget` is used past `at` percent (`used` of
/// `limit`), so the run's model requests go to `to` instead of `from`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelDowngrade {
    pub from: String,
    pub to: String,
    pub budget: String,
    pub used: f64,
    pub limit: f64,
    pub at: u8,
}

/// `model_fallback`: model `from` failed (`error`, without what its
/// endpoint said) and `to`, its next fallback, was asked instead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelFallback {
    pub from: String,
    pub to: String,
    pub error: String,
}

/// `run_started`: a run began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunStarted {
    /// The message that started it; `null` for a resume or a client's
    /// call.
    pub prompt: Option<String>,
    /// `mcp`: the run is an MCP client's call of an exposed tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<ToolCaller>,
}

/// `message`: the model's text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AssistantText {
    pub role: AssistantRole,
    pub content: String,
}

/// Only the model's messages are events (the user's is `run_started`'s
/// prompt, a tool's is `tool_result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AssistantRole {
    Assistant,
}

impl AssistantText {
    pub fn new(content: impl Into<String>) -> Self {
        AssistantText {
            role: AssistantRole::Assistant,
            content: content.into(),
        }
    }
}

/// `tool_call`: a tool was called.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallEvent {
    pub id: String,
    pub name: String,
    /// As the model sent them; not necessarily valid JSON. Bound values
    /// are merged later and never appear.
    pub arguments: String,
    /// `mcp`: an MCP client made the call, not the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<ToolCaller>,
}

/// `tool_result`: what a tool call gave back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolResult {
    /// The tool call's id.
    pub id: String,
    pub ok: bool,
    /// As given to the model.
    pub output: String,
}

/// `pending`: the run stopped; these calls wait. Without tokens (events
/// are stored, tokens never are): read them from the session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PendingEvent {
    pub pending: Vec<PendingItem>,
}

/// `resolved`: a pending call was answered or closed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Resolved {
    pub tool_call_id: String,
    /// Absent when the call closed with its run (expired, cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub outcome: Outcome,
    /// Who decided; absent when nobody did (expired, cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Decider>,
    /// The answer cleared the taint guard.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleared_taint: bool,
}

impl Resolved {
    /// A call closed without anyone's answer.
    pub fn closed(tool_call_id: impl Into<String>, outcome: Outcome) -> Self {
        Resolved {
            tool_call_id: tool_call_id.into(),
            tool: None,
            outcome,
            by: None,
            cleared_taint: false,
        }
    }
}

/// How a pending call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A deferred call's result, from the client.
    Result,
    Approved,
    /// A selection's answer.
    Chosen,
    /// The fields a `needs_input` item asked for.
    Input,
    Rejected,
    /// Nobody answered within `confirmTtl`, or what the answer rests on
    /// went stale.
    Expired,
    /// The run was cancelled while the call waited.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Result => "result",
            Outcome::Approved => "approved",
            Outcome::Chosen => "chosen",
            Outcome::Input => "input",
            Outcome::Rejected => "rejected",
            Outcome::Expired => "expired",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Who answered a pending call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// The owner token (or a session token, for what it may answer).
    Owner,
    /// The approver token.
    Approver,
    /// A webhook notice's answer URL.
    Webhook,
    /// The end user the session belongs to (a choice of their own
    /// conversation: a selection, an input).
    EndUser,
}

impl Decider {
    pub fn as_str(self) -> &'static str {
        match self {
            Decider::Owner => "owner",
            Decider::Approver => "approver",
            Decider::Webhook => "webhook",
            Decider::EndUser => "end_user",
        }
    }
}

/// `run_finished`: the run ended (`blocked`: calls wait, see `pending`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunFinished {
    pub status: RunOutcome,
    pub detail: Option<String>,
    /// The session's status after the run.
    pub session_status: SessionStatus,
    /// What this run used (since it last resumed, for a run that waited).
    /// Absent when another server closed the run as lost: what it used
    /// is in the usage report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Totals>,
}

/// `access_revoked`: every session token and share link of the session
/// (`session_tokens`), or the shares `shares`, were revoked. Whoever
/// follows the stream with one of them gets nothing after it: the replica
/// serving the stream ends it when it reads this event, wherever the
/// revocation was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AccessRevoked {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session_tokens: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<String>,
}

impl AccessRevoked {
    /// The stored event `kind` with `data`, read back: what it revoked.
    pub fn read(kind: &str, data: &Value) -> Option<AccessRevoked> {
        (kind == "access_revoked")
            .then(|| serde_json::from_value(data.clone()).ok())
            .flatten()
    }
}

/// `params_changed`: session values were set or removed. Names only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ParamsChanged {
    pub names: Vec<String>,
}

/// `budget`: a budget went past 80% of its limit, or reached it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetEvent {
    pub budget: String,
    pub state: BudgetState,
    pub used: f64,
    pub limit: f64,
    pub meter: Meter,
    /// The window: a duration (`24h`), `session` or `run`.
    pub per: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetState {
    NearlyUsed,
    UsedUp,
}

/// `delta`: a piece of the model's text as it streams in. Not stored, so
/// it has no id and is never replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delta {
    pub content: String,
}

/// A tool call the run waits for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PendingItem {
    /// Unique in the session, even for a call made inside a helper
    /// (`<prompt_agent call id>/<call id>`).
    pub tool_call_id: String,
    /// `ct_…`: `POST /v1/continuations/{token}` answers the call. Only in
    /// a session view (never in events), and stored only as a digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation_token: Option<String>,
    /// The model-visible tool name; empty for a budget held before a
    /// model request.
    pub tool: String,
    /// The helpers (`prompt_agent_*`) the call was made in, outermost
    /// first; answering it resumes them, then their caller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<String>,
    pub disposition: Disposition,
    /// The model's arguments (`{}` for a budget held before a model
    /// request). Bound values never appear.
    pub call: Value,
    /// `needs_input`: the fields to send as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<Vec<String>>,
    /// `needs_selection`: the lookup tool the options come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<String>,
    /// `needs_selection`: what the API offered, in its order. An `id` is
    /// opaque when the lookup's ids are sensitive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<PendingOption>>,
    /// `needs_confirmation`: what the chosen options said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub facts: Option<Value>,
    /// Why it asks (no exact match, several, the API refused the earlier
    /// call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// An egress call held by the taint guard: the untrusted calls whose
    /// results the session took in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tainted_by: Vec<TaintSource>,
    /// RFC 3339: when an unanswered confirmation closes as not approved.
    /// Only in a session view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// `budget`: the used-up budget the run waits at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Exceeded>,
}

/// A pending item that waits for a person, as an approver sees it: the
/// item as its session shows it (its token included), with its session
/// and agent, and nothing else of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Approval {
    pub session_id: String,
    /// The agent's slug.
    pub agent: String,
    #[serde(flatten)]
    pub item: PendingItem,
}

/// What a lookup asks of a person, as a pending item shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Asked {
    pub missing: Option<Vec<String>>,
    pub lookup: Option<String>,
    pub options: Option<Vec<PendingOption>>,
    pub facts: Option<Value>,
    pub note: Option<String>,
}

/// One option of a `needs_selection` item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PendingOption {
    pub id: String,
    pub label: String,
    #[schema(value_type = Object)]
    pub facts: Value,
}

/// A call whose untrusted result a session took in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaintSource {
    pub tool_call_id: String,
    pub tool: String,
}

/// A used-up budget: in a 429's body (with `error: budget_exceeded`), a
/// failed run's detail and a pending item of disposition `budget`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Exceeded {
    pub budget: String,
    pub meter: Meter,
    pub limit: f64,
    pub used: f64,
    /// The window as written (`24h`, `session`, `run`).
    pub per: String,
    /// Seconds until the oldest use in a rolling window leaves it (the
    /// earliest anything frees up); absent for `session` and `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// The budget counts each end user apart: `used` is this user's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_user: bool,
}

impl Exceeded {
    /// Limit `limit` as `standing` found it at `now`.
    pub fn of(limit: &Limit, standing: &crate::usage::Standing, now: i64) -> Exceeded {
        let retry_after = match limit.per {
            Per::Rolling(window) => standing.oldest.map(|oldest| {
                let ms = (oldest + window - now).max(1);
                u64::try_from(ms).unwrap_or(0).div_ceil(1000)
            }),
            Per::Session | Per::Run => None,
        };
        Exceeded {
            budget: limit.name.clone(),
            meter: limit.meter,
            limit: limit.limit,
            used: standing.used,
            per: limit.per_text.clone(),
            retry_after,
            per_user: limit.per_user,
        }
    }

    /// `budget daily-tokens is used up: 200412 of 200000 tokens per 24h`.
    pub fn detail(&self) -> String {
        let amount = |x: f64| match self.meter {
            Meter::Cost => format!("{x:.4}"),
            Meter::Tokens | Meter::ToolCalls => format!("{x:.0}"),
        };
        let mut text = format!(
            "budget {} is used up{}: {} of {} {} per {}",
            self.budget,
            if self.per_user {
                " for this user (it counts each end user apart)"
            } else {
                ""
            },
            amount(self.used),
            amount(self.limit),
            self.meter.as_str().replace('_', " "),
            self.per
        );
        if let Some(s) = self.retry_after {
            text.push_str(&format!("; it frees up in {s} s"));
        }
        text
    }

    /// The fields a 429 adds to `error` and `message`.
    pub fn fields(&self) -> serde_json::Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }
}

/// How far a run goes, as a request's `run` says it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunRequest {
    /// No run: a creation stays idle, an answer to a pending call is
    /// recorded only.
    None,
    /// One model turn and its tool calls.
    Step,
    /// Until the model answers or a call waits.
    #[default]
    UntilBlocked,
}

/// How far the run a message or a resume starts goes. Such a request
/// exists to start a run, so `none` is not taken here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StartRun {
    /// One model turn and its tool calls.
    Step,
    /// Until the model answers or a call waits.
    #[default]
    UntilBlocked,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_event_is_its_kind_and_the_data_clients_always_got() {
        let cases = [
            (
                SessionEvent::RunStarted(RunStarted {
                    prompt: None,
                    caller: None,
                }),
                "run_started",
                json!({"prompt": null}),
            ),
            (
                SessionEvent::RunStarted(RunStarted {
                    prompt: None,
                    caller: Some(ToolCaller::Mcp),
                }),
                "run_started",
                json!({"prompt": null, "caller": "mcp"}),
            ),
            (
                SessionEvent::Message(AssistantText::new("hi")),
                "message",
                json!({"role": "assistant", "content": "hi"}),
            ),
            (
                SessionEvent::Resolved(Resolved::closed("c1", Outcome::Expired)),
                "resolved",
                json!({"tool_call_id": "c1", "outcome": "expired"}),
            ),
            (
                SessionEvent::RunFinished(RunFinished {
                    status: RunOutcome::Cancelled,
                    detail: Some("cancelled".into()),
                    session_status: SessionStatus::Idle,
                    usage: None,
                }),
                "run_finished",
                json!({"status": "cancelled", "detail": "cancelled", "session_status": "idle"}),
            ),
            (
                SessionEvent::Budget(BudgetEvent {
                    budget: "daily".into(),
                    state: BudgetState::NearlyUsed,
                    used: 81.0,
                    limit: 100.0,
                    meter: Meter::ToolCalls,
                    per: "24h".into(),
                }),
                "budget",
                json!({"budget": "daily", "state": "nearly_used", "used": 81.0, "limit": 100.0,
                       "meter": "tool_calls", "per": "24h"}),
            ),
            (
                SessionEvent::ModelFallback(ModelFallback {
                    from: "claude".into(),
                    to: "gpt".into(),
                    error: "HTTP 529 after 4 attempts".into(),
                }),
                "model_fallback",
                json!({"from": "claude", "to": "gpt", "error": "HTTP 529 after 4 attempts"}),
            ),
            (
                SessionEvent::AccessRevoked(AccessRevoked {
                    session_tokens: false,
                    shares: vec!["sh_1".into()],
                }),
                "access_revoked",
                json!({"shares": ["sh_1"]}),
            ),
            (
                SessionEvent::AccessRevoked(AccessRevoked {
                    session_tokens: true,
                    shares: Vec::new(),
                }),
                "access_revoked",
                json!({"session_tokens": true}),
            ),
        ];
        for (event, kind, data) in cases {
            assert_eq!(event.kind(), kind);
            assert_eq!(event.data(), data, "{kind}");
        }
    }

    #[test]
    fn every_kind_has_a_schema_under_its_own_name() {
        let kinds = SessionEvent::kinds();
        let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "run_started",
                "message",
                "tool_call",
                "tool_result",
                "pending",
                "resolved",
                "run_finished",
                "params_changed",
                "budget",
                "model_fallback",
                "model_downgrade",
                "access_revoked"
            ]
        );
        let mut schemas = Vec::new();
        SessionEvent::schemas(&mut schemas);
        let defined: std::collections::BTreeSet<&str> =
            schemas.iter().map(|(n, _)| n.as_str()).collect();
        for (kind, name) in &kinds {
            assert!(defined.contains(name.as_str()), "{kind}: {name}");
        }
        // What the data hold is defined too (a pending item, a status).
        for nested in ["PendingItem", "SessionStatus", "Totals", "Disposition"] {
            assert!(defined.contains(nested), "{nested}: {defined:?}");
        }
        let distinct: std::collections::BTreeSet<&str> =
            kinds.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(distinct.len(), kinds.len());
    }

    #[test]
    fn a_request_names_its_run_in_snake_case_and_a_message_refuses_none() {
        let r: RunRequest = serde_json::from_value(json!("none")).unwrap();
        assert_eq!(r, RunRequest::None);
        let s: StartRun = serde_json::from_value(json!("step")).unwrap();
        assert_eq!(s, StartRun::Step);
        let e = serde_json::from_value::<StartRun>(json!("none")).unwrap_err();
        assert!(e.to_string().contains("step"), "{e}");
    }
}
