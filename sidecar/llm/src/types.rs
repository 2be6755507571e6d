//! The data that goes to and comes back from a chat-completions endpoint.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::content::Content;
use bindery_params::SecretString;

/// Where a model is served and how patiently to talk to it.
#[derive(Debug, Clone)]
pub struct ModelEndpoint {
    /// The API root, e.g. `https://api.openai.com/v1` or
    /// `http://127.0.0.1:8080/v1`; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model name sent in every request.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set and not empty.
    pub api_key: Option<SecretString>,
    /// How long one attempt may take. For a streamed reply: until the
    /// response headers arrive, then between two chunks of the body.
    pub timeout: Duration,
    /// How many times a rate-limited, failed (5xx) or unreachable request is
    /// retried before giving up; 0 means a single attempt.
    pub max_retries: u32,
    /// The wait before the first retry; it doubles on each further retry.
    pub initial_backoff: Duration,
    /// What the agent's `flavor` adds to every request.
    pub flavor: bindery_spec::flavor::Flavor,
    /// The API spoken.
    pub provider: bindery_spec::provider::Provider,
    /// The longest reply in tokens, when the agent names one (Anthropic's
    /// default otherwise).
    pub max_tokens: Option<u32>,
    /// The thinking budget in tokens (Anthropic, Bedrock, Gemini).
    pub thinking_budget: Option<u32>,
    /// Azure OpenAI's `api-version` (the default when `None`).
    pub api_version: Option<String>,
    /// The AWS region Bedrock requests are signed for.
    pub region: Option<String>,
    /// Bedrock's static keys (else the pod's AWS identity signs).
    pub aws_keys: Option<crate::credentials::AwsKeys>,
    /// How large a reply may be, how many calls it may ask for, and how
    /// long a whole request may last.
    pub limits: ReplyLimits,
}

/// The bounds on what one model request may bring back: a reply past them
/// is refused (and not kept), whatever the model sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimits {
    /// Bytes of the reply's body, streamed or not (`--model-max-reply-bytes`).
    pub max_bytes: usize,
    /// Tool calls one reply may ask for (`--model-max-tool-calls`).
    pub max_tool_calls: usize,
    /// The whole request, retries and a streamed reply included
    /// (`--llm-deadline`): the per-attempt timeout bounds each wait, this
    /// the sum. Never shorter than one attempt's timeout.
    pub deadline: Duration,
}

impl ReplyLimits {
    /// 8 MiB: far past any chat answer, well within a pod's memory.
    pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
    pub const DEFAULT_MAX_TOOL_CALLS: usize = 128;
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            max_tool_calls: Self::DEFAULT_MAX_TOOL_CALLS,
            deadline: Self::DEFAULT_DEADLINE,
        }
    }
}

impl ModelEndpoint {
    /// The default per-attempt timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    /// The default number of retries.
    pub const DEFAULT_MAX_RETRIES: u32 = 3;
    /// The default wait before the first retry.
    pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(500);

    /// An endpoint without an API key, with the default timeout and retries.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ModelEndpoint {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            initial_backoff: Self::DEFAULT_INITIAL_BACKOFF,
            flavor: Default::default(),
            provider: Default::default(),
            max_tokens: None,
            thinking_budget: None,
            api_version: None,
            region: None,
            aws_keys: None,
            limits: ReplyLimits::default(),
        }
    }

    /// The `api-version` Azure OpenAI requests name.
    pub fn azure_api_version(&self) -> &str {
        self.api_version
            .as_deref()
            .unwrap_or(bindery_spec::provider::AZURE_API_VERSION)
    }

    /// The same endpoint, with this API key.
    pub fn with_api_key(mut self, key: SecretString) -> Self {
        self.api_key = Some(key);
        self
    }
}

/// One message of a conversation, in the OpenAI wire shape: an object tagged
/// by `role` (`system`, `user`, `assistant`, `tool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    /// Instructions to the model.
    System {
        /// The instructions.
        content: String,
    },
    /// What the user (or the agent's caller) says: text, or text and
    /// media parts (`run -m`).
    User {
        /// The text, or the parts.
        content: Content,
    },
    /// What the model said earlier: text, tool calls, or both. On the wire
    /// `content` is `null` when absent and `tool_calls` is left out when
    /// empty.
    Assistant {
        /// The text, if any.
        #[serde(default)]
        content: Option<String>,
        /// The tool calls the model asked for.
        #[serde(
            default,
            skip_serializing_if = "Vec::is_empty",
            deserialize_with = "null_as_empty"
        )]
        tool_calls: Vec<ToolCall>,
        /// What the model reasoned before this reply, as its provider
        /// requires it sent back (never sent to another provider, never
        /// part of the reply's text).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<Reasoning>,
    },
    /// The result of one tool call, answering the call with that id.
    Tool {
        /// The [`ToolCall::id`] this answers.
        tool_call_id: String,
        /// The tool's output: text, or parts when it returned media
        /// (agents-exe's form; a request sends the media in a user
        /// message after the results, see [`super::Conversation`]).
        content: Content,
    },
}

impl ChatMessage {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        ChatMessage::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage::User {
            content: Content::Text(content.into()),
        }
    }

    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        ChatMessage::Assistant {
            content: Some(content.into()),
            tool_calls: Vec::new(),
            reasoning: None,
        }
    }

    /// The result of the tool call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage::Tool {
            tool_call_id: tool_call_id.into(),
            content: Content::Text(content.into()),
        }
    }

    /// About how many characters it puts in a request (its texts and its
    /// calls' names and arguments), for estimating its tokens.
    pub fn chars(&self) -> usize {
        match self {
            ChatMessage::System { content } => content.len(),
            ChatMessage::User { content } => content.chars(),
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>()
            }
            ChatMessage::Tool { content, .. } => content.chars(),
        }
    }
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A call of one tool, as the model asked for it.
///
/// On the wire: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id the tool's result must quote in [`ChatMessage::Tool`].
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments: raw JSON text as the model sent it, which may well be
    /// invalid JSON or not match the tool's schema.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments parsed as JSON.
    pub fn parse_arguments(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.arguments)
    }
}

#[derive(Serialize)]
struct WireToolCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionOut<'a>,
}

#[derive(Serialize)]
struct WireFunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireToolCallOut {
            id: &self.id,
            kind: "function",
            function: WireFunctionOut {
                name: &self.name,
                arguments: &self.arguments,
            },
        }
        .serialize(s)
    }
}

/// The wire shape [`Serialize`] writes: `{id, type: "function", function:
/// {name, arguments}}`.
impl utoipa::PartialSchema for ToolCall {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let text = |description: Option<&str>| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(description)
        };
        let function = ObjectBuilder::new()
            .property("name", text(None))
            .property(
                "arguments",
                text(Some(
                    "JSON text as the model sent it; not necessarily valid.",
                )),
            )
            .required("name")
            .required("arguments");
        ObjectBuilder::new()
            .property("id", text(None))
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["function"])),
            )
            .property("function", function)
            .required("id")
            .required("type")
            .required("function")
            .into()
    }
}

impl utoipa::ToSchema for ToolCall {}

#[derive(Deserialize)]
struct WireToolCallIn {
    id: String,
    function: WireFunctionIn,
}

#[derive(Deserialize)]
struct WireFunctionIn {
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = WireToolCallIn::deserialize(d)?;
        Ok(ToolCall {
            id: wire.id,
            name: wire.function.name,
            arguments: arguments_text(&wire.function.arguments),
        })
    }
}

/// The arguments of a tool call as text: a JSON string is taken as is, an
/// absent value is `{}`, anything else (some servers send an object) is
/// written out as JSON.
pub(crate) fn arguments_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "{}".to_owned(),
        other => other.to_string(),
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// What to send: the conversation so far and the tools on offer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// The tools the model may call; left out of the request when empty.
    pub tools: Vec<ToolDefinition>,
}

/// A reply's reasoning, as its provider gave it and requires it back:
/// Anthropic's `thinking` and `redacted_thinking` blocks with their
/// signatures, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reasoning {
    /// Whose: `anthropic`. Another provider's reasoning is not sent.
    pub provider: String,
    /// The blocks, in the provider's own shape.
    #[schema(value_type = Vec<Object>)]
    pub blocks: Vec<serde_json::Value>,
    /// The endpoint that reasoned (its origin and model): the reasoning is
    /// sent back to that one only, never to another endpoint of the same
    /// provider (a fallback's account would refuse another's signatures,
    /// and is not owed them). Unknown (older turns): sent to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Token counts the endpoint reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the request.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens in the reply.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum.
    #[serde(default)]
    pub total_tokens: u64,
    /// Of `prompt_tokens`, those read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of `prompt_tokens`, those written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`, those the model spent reasoning (OpenAI's
    /// reasoning tokens, Gemini's thoughts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// The most tokens one request is taken to report in any count: far
    /// past any model's window, and sums of many stay exact integers in
    /// the stores (a model's 2^63 would overflow a sum, or turn a SQLite
    /// column's sum into a REAL no report reads).
    pub const MAX_REPORTED: u64 = 1 << 32;

    /// The counts as reported, each cut to [`Usage::MAX_REPORTED`], the
    /// cache's within the prompt's, the total their sum.
    pub fn bounded(self) -> Usage {
        let cut = |n: u64| n.min(Self::MAX_REPORTED);
        let prompt_tokens = cut(self.prompt_tokens);
        let completion_tokens = cut(self.completion_tokens);
        let cache_read_tokens = cut(self.cache_read_tokens).min(prompt_tokens);
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            cache_read_tokens,
            cache_write_tokens: cut(self.cache_write_tokens).min(prompt_tokens - cache_read_tokens),
            reasoning_tokens: cut(self.reasoning_tokens).min(completion_tokens),
        }
    }
}

/// The model's reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    /// The text, if any.
    pub content: Option<String>,
    /// The tool calls it asked for, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped (`stop`, `tool_calls`, `length`, ...), if said.
    pub finish_reason: Option<String>,
    /// Token counts, if the endpoint reported them.
    pub usage: Option<Usage>,
    /// What the model reasoned, to send back with the next request.
    pub reasoning: Option<Reasoning>,
    /// Which model of the client's chain answered: 0 the agent's own,
    /// `n` its `n`th fallback.
    pub served_by: usize,
    /// The models tried before it and why each was passed over, in order.
    pub fell_back: Vec<FellBack>,
}

/// A model passed over for the next of its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FellBack {
    /// Its name (`spec.model.name`, or the fallback's).
    pub model: String,
    /// Why, without what the endpoint said (`HTTP 529`, `timeout`).
    pub error: String,
}

impl ChatResponse {
    /// This reply as the assistant message to append to the conversation.
    pub fn to_message(&self) -> ChatMessage {
        ChatMessage::Assistant {
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
            reasoning: self.reasoning.clone(),
        }
    }

    /// The same reply with each tool call's id its own: an id the model
    /// left empty or gave an earlier call too becomes `call_<n>` (the
    /// first such name free), so each result answers exactly one call and
    /// none hides behind another's name (the taint guard reads results
    /// by their calls).
    pub fn with_unique_call_ids(mut self) -> Self {
        let mut seen = std::collections::HashSet::new();
        for i in 0..self.tool_calls.len() {
            let id = &self.tool_calls[i].id;
            if !id.is_empty() && seen.insert(id.clone()) {
                continue;
            }
            let taken = |c: &str| self.tool_calls.iter().any(|t| t.id == c) || seen.contains(c);
            let fresh = (i..)
                .map(|n| format!("call_{n}"))
                .find(|c| !taken(c))
                .expect("an unbounded range has a free name");
            seen.insert(fresh.clone());
            self.tool_calls[i].id = fresh;
        }
        self
    }
}

/// A piece of a streamed reply, forwarded as soon as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamDelta {
    /// More text.
    Content(String),
    /// The model started the tool call at `index` (its position in
    /// [`ChatResponse::tool_calls`]).
    ToolCallStarted {
        /// Position of the call in the reply.
        index: usize,
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
    },
    /// More argument text for the tool call at `index`.
    ToolCallArguments {
        /// Position of the call in the reply.
        index: usize,
        /// The next piece of the raw JSON arguments.
        fragment: String,
    },
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_call_of_a_reply_gets_an_id_of_its_own() {
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        };
        let reply = ChatResponse {
            content: None,
            tool_calls: vec![
                call("x", "read_ticket"),
                call("x", "date"),
                call("", "send"),
                call("call_1", "other"),
                call("call_1", "again"),
            ],
            finish_reason: None,
            usage: None,
            ..ChatResponse::default()
        }
        .with_unique_call_ids();
        let ids: Vec<&str> = reply.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["x", "call_2", "call_3", "call_1", "call_4"]);
        let names: Vec<&str> = reply.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["read_ticket", "date", "send", "other", "again"]);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn messages_serialize_to_the_wire_shape() {
        let messages = vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("hi"),
            ChatMessage::assistant("hello"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
                reasoning: None,
            },
            ChatMessage::tool_result("call_1", "contents"),
        ];
        let wire = serde_json::to_value(&messages).unwrap();
        assert_eq!(
            wire,
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "contents"},
            ])
        );
        let back: Vec<ChatMessage> = serde_json::from_value(wire).unwrap();
        assert_eq!(back, messages);
    }

    #[test]
    fn messages_deserialize_leniently() {
        let m: ChatMessage = serde_json::from_value(json!({
            "role": "assistant", "content": "x", "tool_calls": null
        }))
        .unwrap();
        assert_eq!(m, ChatMessage::assistant("x"));
        let m: ChatMessage = serde_json::from_value(json!({
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": {"a": 1}}}]
        }))
        .unwrap();
        assert_eq!(
            m,
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "c".into(),
                    name: "f".into(),
                    arguments: r#"{"a":1}"#.into()
                }],
                reasoning: None,
            }
        );
        assert!(serde_json::from_value::<ChatMessage>(json!({"role": "wizard"})).is_err());
    }
}
