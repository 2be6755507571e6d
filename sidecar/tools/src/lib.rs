//! Tools: what every toolbox produces, whatever it talks to.
//!
//! A [`Tool`] describes its arguments ([`ToolSpec`]) and runs with
//! [`CallArgs`]. Registrations are loaded once and shared by every session;
//! per-call values reach them through the arguments and the [`CallContext`],
//! never through the registration. Bindings wrap any `Tool` (see
//! the bindery-bindings crate).

pub mod attach;
pub mod bash;
pub mod builtin;
pub mod deferred;
pub mod lineage;
pub mod mcp;
pub mod openapi;
pub mod slots;
pub mod sqlite;
pub mod sqlite_versions;

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use bindery_llm::Media;
use bindery_params::scrub::Scrubber;
use bindery_params::{ParamValue, SecretString};

/// How an argument travels to the tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// As a JSON value (HTTP and MCP tools, helpers).
    Json,
    /// To an executable, in one of the bash tool protocol's modes.
    Bash(bash::Mode),
}

impl Transport {
    /// Where a secret passed this way would show, if it would, and what to
    /// do instead: the bindings refuse such a binding at load.
    pub fn secret_exposure(&self) -> Option<String> {
        match self {
            Transport::Bash(mode) if *mode != bash::Mode::Env => Some(format!(
                "passed in mode `{}` where it would show in the process list and traces; declare the argument with \"mode\": \"env\" in the tool's describe output",
                mode.as_str()
            )),
            _ => None,
        }
    }

    /// What it carries, when that is scalars only (no objects or arrays).
    pub fn scalars_only(&self) -> Option<&'static str> {
        match self {
            Transport::Bash(_) => Some("a bash tool takes strings, numbers or booleans"),
            Transport::Json => None,
        }
    }
}

/// One argument of a tool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArgSpec {
    pub name: String,
    pub description: String,
    pub required: bool,
    /// The JSON schema of the argument's value (`{"type": "string", …}`).
    pub schema: serde_json::Value,
    pub transport: Transport,
}

/// What a tool is, before any binding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolSpec {
    /// The name the model sees (`bash_query-invoices`).
    pub name: String,
    /// The name inside its toolbox (`query-invoices`), which toolbox-level
    /// binding globs match.
    pub local_name: String,
    pub description: String,
    pub args: Vec<ArgSpec>,
    /// Whether a call may change something (so `confirm: writes` asks):
    /// an MCP tool not annotated read-only, an HTTP operation other than
    /// GET, HEAD or OPTIONS, any executable.
    pub writes: bool,
}

/// Why a tool call waits instead of running. More reasons may follow (an
/// input the API owns, a selection); each one is a pending item with its
/// own continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// The client runs the tool and posts its result.
    Deferred,
    /// A person approves the call (or not) before it runs.
    Confirm,
    /// A field the user owns is missing or invalid: the client sends it
    /// (`input`), before any lookup runs.
    NeedsInput,
    /// A lookup returned options: a person chooses one (`choice`).
    NeedsSelection,
    /// The prepared call of a tool that writes, with its facts: a person
    /// approves it (or not) before it runs.
    NeedsConfirmation,
    /// A `confirm` budget is used up: a person lets the run go on past it
    /// (or not). Before a model request the item holds no call.
    Budget,
}

impl Disposition {
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Deferred => "deferred",
            Disposition::Confirm => "confirm",
            Disposition::NeedsInput => "needs_input",
            Disposition::NeedsSelection => "needs_selection",
            Disposition::NeedsConfirmation => "needs_confirmation",
            Disposition::Budget => "budget",
        }
    }
}

impl ToolSpec {
    pub fn arg(&self, name: &str) -> Option<&ArgSpec> {
        self.args.iter().find(|a| a.name == name)
    }

    /// The JSON schema of the tool's arguments, keeping only those `keep`
    /// accepts. A hidden argument leaves no trace: not in `properties`, not
    /// in `required`.
    pub fn json_schema(&self, keep: impl Fn(&ArgSpec) -> bool) -> serde_json::Value {
        let mut properties = serde_json::Map::new();
        let mut required = Vec::new();
        for arg in self.args.iter().filter(|a| keep(a)) {
            properties.insert(arg.name.clone(), arg.schema.clone());
            if arg.required {
                required.push(serde_json::Value::String(arg.name.clone()));
            }
        }
        serde_json::json!({
            "type": "object",
            "properties": properties,
            "required": required,
        })
    }
}

/// A tool's arguments at call time: the model's, merged with bound values.
/// Secret values stay marked as such down to the transport.
pub type CallArgs = BTreeMap<String, ParamValue>;

/// Who is calling: passed to bash tools as `AGENT_*` environment variables.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    pub session_id: String,
    pub conversation_id: String,
    pub turn_id: String,
    /// The model turn the call belongs to (the id of that turn's first
    /// call): calls the model made together share it.
    pub step_id: String,
    pub agent_id: String,
    /// The session as the model made it (`{"session_id", "agent",
    /// "turns"}`), for bash tools' `AGENT_SESSION_JSON`; absent outside a
    /// session. Turns never hold a bound value, so neither does this.
    pub session_json: Option<std::sync::Arc<str>>,
    /// What scrubs the call's output where a tool cuts it at a limit
    /// ([`Scrubber::scrub_cut`]): every secret the call can reach. The
    /// bindings fill it in when it is empty.
    pub scrubber: std::sync::Arc<Scrubber>,
    /// The calling session's fork lineage, for `list-sessions` and
    /// `search-sessions`; absent outside a session's run (the CLI).
    pub lineage: Option<std::sync::Arc<dyn lineage::SessionLineage>>,
    /// How many tool processes may run at once, of the call's run and of
    /// the server: a bash tool's call waits for its slots.
    pub processes: slots::ProcessSlots,
}

impl CallContext {
    /// A call in session `id` (its conversation too) by agent `agent`,
    /// with nothing else known yet.
    pub fn of_session(id: &str, agent: &str) -> CallContext {
        CallContext {
            session_id: id.to_string(),
            conversation_id: id.to_string(),
            agent_id: agent.to_string(),
            ..CallContext::default()
        }
    }

    /// A call outside any run (the command line's `tool-call`, a replay):
    /// `id` names the call, its turn and its conversation.
    pub fn one_off(session: &str, id: &str, agent: &str) -> CallContext {
        CallContext {
            turn_id: id.to_string(),
            step_id: id.to_string(),
            conversation_id: id.to_string(),
            ..CallContext::of_session(session, agent)
        }
    }
    /// The context with nothing of the session: what a tool shared across
    /// sessions is given. Its output is scrubbed all the same.
    pub fn without_session(&self) -> CallContext {
        CallContext {
            agent_id: self.agent_id.clone(),
            scrubber: self.scrubber.clone(),
            processes: self.processes.clone(),
            ..CallContext::default()
        }
    }

    /// Record the conversation so far for the tools of this call.
    pub fn with_session<T: Serialize>(self, turns: &[T]) -> Self {
        self.with_encoded_session(&[], turns)
    }

    /// [`CallContext::with_session`] of turns whose first ones are
    /// `encoded` already (comma-separated, as a run's conversation holds
    /// them) and the rest `after`: the same JSON, without encoding the
    /// whole conversation again for each call.
    pub fn with_encoded_session<T: Serialize>(mut self, encoded: &[u8], after: &[T]) -> Self {
        match session_json(&self.session_id, &self.agent_id, encoded, after) {
            Ok(json) => self.session_json = Some(json.into()),
            // Turns are plain data; should one not serialize, the tool
            // runs without the session rather than not at all.
            Err(e) => tracing::warn!("AGENT_SESSION_JSON left out: {e}"),
        }
        self
    }
}

/// Why the session's JSON was left out of a call.
#[derive(Debug, thiserror::Error)]
enum SessionJsonError {
    #[error("{0}")]
    Encode(#[from] serde_json::Error),
    /// The turns encoded already were not UTF-8.
    #[error("{0}")]
    NotUtf8(#[from] std::string::FromUtf8Error),
}

/// `{"session_id", "agent", "turns"}`, written straight from the turns (no
/// JSON tree of the whole conversation is built for each call): `encoded`
/// first, then `after`.
fn session_json<T: Serialize>(
    session_id: &str,
    agent: &str,
    encoded: &[u8],
    after: &[T],
) -> Result<String, SessionJsonError> {
    let mut json = Vec::with_capacity(encoded.len() + 128);
    json.extend_from_slice(br#"{"session_id":"#);
    serde_json::to_writer(&mut json, session_id)?;
    json.extend_from_slice(br#","agent":"#);
    serde_json::to_writer(&mut json, agent)?;
    json.extend_from_slice(br#","turns":["#);
    json.extend_from_slice(encoded);
    for (i, turn) in after.iter().enumerate() {
        if i > 0 || !encoded.is_empty() {
            json.push(b',');
        }
        serde_json::to_writer(&mut json, turn)?;
    }
    json.extend_from_slice(b"]}");
    Ok(String::from_utf8(json)?)
}

/// What a tool returns to the model.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutput {
    /// Text (most tools).
    Text(String),
    /// Structured data (a SQLite query's rows): the model gets its JSON
    /// text, as agents-exe sends a `JsonResponse`.
    Json(serde_json::Value),
    /// Bytes of a media type: a bash tool's stdout when its `describe`
    /// declares `output-media-type`, or stdout that is not UTF-8
    /// (`application/octet-stream`).
    Media(Media),
    /// Text and media, in order (an MCP tool's text and image content).
    Mixed(Vec<OutputPart>),
}

/// One part of a [`ToolOutput::Mixed`].
#[derive(Clone, Debug, PartialEq)]
pub enum OutputPart {
    Text(String),
    Media(Media),
}

/// The media type a script's stdout is taken as when it is not UTF-8 and
/// its `describe` declares none (agents-exe's rule).
pub const OCTET_STREAM: &str = bindery_llm::content::OCTET_STREAM;

impl ToolOutput {
    /// A text result.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput::Text(text.into())
    }

    /// What a program printed: media of the `declared` type when there is
    /// one; else its text when it is UTF-8; else
    /// `application/octet-stream` media (never text with replacement
    /// characters in it).
    pub fn from_stdout(stdout: Vec<u8>, declared: Option<&str>) -> Self {
        match declared {
            Some(mime) => ToolOutput::Media(Media {
                mime: mime.to_string(),
                bytes: stdout,
            }),
            None => match String::from_utf8(stdout) {
                Ok(text) => ToolOutput::Text(text),
                Err(e) => ToolOutput::Media(Media {
                    mime: OCTET_STREAM.to_string(),
                    bytes: e.into_bytes(),
                }),
            },
        }
    }

    /// Its text when it has nothing but text (text, or JSON's text).
    pub fn as_text(&self) -> Option<String> {
        match self {
            ToolOutput::Text(t) => Some(t.clone()),
            ToolOutput::Json(v) => Some(v.to_string()),
            ToolOutput::Media(_) | ToolOutput::Mixed(_) => None,
        }
    }

    /// Its text, each medium as `[<mime>, <n> bytes]`: what a terminal
    /// shows (`tool-call`) and a lookup reads.
    pub fn shown(&self) -> String {
        match self {
            ToolOutput::Text(t) => t.clone(),
            ToolOutput::Json(v) => v.to_string(),
            ToolOutput::Media(m) => format!("[{}]", m.describe()),
            ToolOutput::Mixed(parts) => parts
                .iter()
                .map(|p| match p {
                    OutputPart::Text(t) => t.clone(),
                    OutputPart::Media(m) => format!("[{}]", m.describe()),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Its parts, in order: text (JSON as its text) and media.
    pub fn into_parts(self) -> Vec<OutputPart> {
        match self {
            ToolOutput::Text(t) => vec![OutputPart::Text(t)],
            ToolOutput::Json(v) => vec![OutputPart::Text(v.to_string())],
            ToolOutput::Media(m) => vec![OutputPart::Media(m)],
            ToolOutput::Mixed(parts) => parts,
        }
    }
}

/// Why a call failed. The `Display` text is what the model is told.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ToolError {
    /// The model's arguments do not fit the tool; it can retry.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// An HTTP API answered with a failure `status` (an OpenAPI or PostgREST
    /// tool's call, an MCP server over HTTP, or a bash tool whose error
    /// output starts `HTTP <status>`); `message` is what the model is told,
    /// the status among it. Matched by status, never by the text: a 409 or
    /// 410 says the prepared input went stale.
    #[error("{message}")]
    Http { status: u16, message: String },
    /// The tool cannot run for a reason the model must not learn (an
    /// unbound parameter, a bound value of the wrong shape); the operator's
    /// log says which.
    #[error("tool unavailable")]
    Unavailable,
}

impl ToolError {
    /// The same error with every secret in its text replaced (an API's
    /// error body may quote the credential it was sent).
    pub fn scrubbed(self, scrubber: &Scrubber) -> ToolError {
        match self {
            ToolError::InvalidArguments(m) => ToolError::InvalidArguments(scrubber.scrub(&m)),
            ToolError::Failed(m) => ToolError::Failed(scrubber.scrub(&m)),
            ToolError::Http { status, message } => ToolError::Http {
                status,
                message: scrubber.scrub(&message),
            },
            ToolError::Unavailable => ToolError::Unavailable,
        }
    }
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    /// Secret values the tool holds itself (read when it loaded, not bound
    /// per call), each with the name its output is scrubbed to.
    fn secrets(&self) -> Vec<(String, SecretString)> {
        Vec::new()
    }
    /// Whether a call hands the tool the session's context (a bash tool's
    /// `AGENT_SESSION_*` variables): then its result may depend on the
    /// conversation, and a cached one may answer only the same context.
    fn receives_session(&self) -> bool {
        false
    }
    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_llm::ChatMessage;

    /// Built from turns encoded already and the rest, the session's JSON
    /// is byte for byte what serde gives for all of it at once, wherever
    /// the encoded part ends (none of it, for `with_session`).
    #[test]
    fn a_session_built_from_encoded_turns_is_the_one_encoded_at_once() {
        let turns = [
            ChatMessage::user("which \"invoices\"?\n"),
            ChatMessage::assistant("none ✓"),
            ChatMessage::tool_result("call_1", "a\tb"),
            ChatMessage::user("thanks"),
        ];
        let ctx = CallContext {
            session_id: "s-\"1\"".into(),
            agent_id: "invoices".into(),
            ..CallContext::default()
        };
        #[derive(Serialize)]
        struct Session<'a> {
            session_id: &'a str,
            agent: &'a str,
            turns: &'a [ChatMessage],
        }
        let whole = serde_json::to_string(&Session {
            session_id: &ctx.session_id,
            agent: &ctx.agent_id,
            turns: &turns,
        })
        .unwrap();
        let all_at_once = ctx.clone().with_session(&turns).session_json.unwrap();
        assert_eq!(*all_at_once, *whole);
        for k in 0..=turns.len() {
            let encoded: Vec<String> = turns[..k]
                .iter()
                .map(|t| serde_json::to_string(t).unwrap())
                .collect();
            let built = ctx
                .clone()
                .with_encoded_session(encoded.join(",").as_bytes(), &turns[k..])
                .session_json
                .unwrap();
            assert_eq!(*built, *whole, "{k} encoded already");
        }
    }
}
