//! Amazon Bedrock's Converse API: the request a conversation becomes, and
//! the reply, whole or streamed (AWS's binary event stream, [`Frames`]),
//! read back into the one [`ChatResponse`].
//!
//! What it takes care of, that a compatibility layer gets wrong:
//! - the system prompt goes in `system`, each tool result in a
//!   `toolResult` block of the user turn after the call, consecutive
//!   user-side messages in one turn (results first): Converse takes
//!   strictly alternating `user` and `assistant` turns;
//! - a tool call's id is one Converse and the Claude models behind it
//!   accept (`^[a-zA-Z0-9_-]{1,64}$`): any other (a session begun with
//!   another provider) is mapped the same way in the call and in its
//!   result ([`call_ids::wire_id`](super::call_ids::wire_id)); a tool's name is refused unless it is one the
//!   service takes (`^[a-zA-Z0-9_-]{1,64}$`);
//! - reasoning (`reasoningContent` blocks, with their signatures) comes back
//!   byte for byte as the assistant turn's [`Reasoning`], goes back first
//!   in that turn, and is never forwarded as the reply's text;
//! - prompt caching: `cachePoint` blocks after the system prompt, after the
//!   tools and at the end of the last message (the stable prefix grows by
//!   a step each request), and the cache's read and write counts in
//!   [`Usage`] (Bedrock's `inputTokens` are the uncached ones only).
//!
//! Nothing here signs a request: the client signs the body [`body`] gives
//! (SigV4, service `bedrock`) for the path [`path`] gives.

mod frames;

use std::collections::HashSet;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};

// The client's to use (the lead removes the allow when wiring).
pub(crate) use frames::{Frame, Frames};

use super::call_ids::{self, Ids, Rule};
use super::content::{Content, ContentPart};
use super::error::{excerpt, LlmError};
use super::types::{ChatMessage, ChatResponse, ModelEndpoint, Reasoning, StreamDelta};
use super::types::{ToolCall, ToolDefinition, Usage};

/// The provider's name on [`Reasoning`].
pub(crate) const PROVIDER: &str = "bedrock";
/// The longest tool call id and tool name the service takes
/// (`ToolUseId`, `ToolName` in its model).
const MAX_ID: usize = 64;
const MAX_NAME: usize = 64;
/// What `maxTokens` leaves the answer past the thinking budget, when the
/// agent names no `maxTokens` (the budget must be less than it).
const ANSWER_TOKENS: u32 = 8192;

/// The path, appended to the base URL
/// (`https://bedrock-runtime.{region}.amazonaws.com`), of the model's
/// `converse` or `converse-stream`: the model id (an id, an ARN, an
/// inference profile) as one path segment, percent-encoded as AWS's SDKs
/// encode it (all but `A-Z a-z 0-9 - . _ ~`: an ARN's `:` and `/` too).
pub(crate) fn path(endpoint: &ModelEndpoint, stream: bool) -> String {
    let action = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    format!("/model/{}/{action}", segment(&endpoint.model))
}

/// `text` percent-encoded but for the unreserved characters (RFC 3986),
/// as botocore's `percent_encode` does a non-greedy URI label.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The request body (the same for `converse` and `converse-stream`).
pub(crate) fn body<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage> + Clone,
    offered: &[ToolDefinition],
    endpoint: &ModelEndpoint,
) -> Result<Bytes, LlmError> {
    let thinking = endpoint
        .thinking_budget
        .filter(|_| !call_ids::continues_a_turn_without_reasoning(history.clone(), PROVIDER));
    let (system, messages) = messages(history, !offered.is_empty())?;
    let mut body = Map::new();
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    // The thinking budget must be less than `maxTokens`: without the
    // agent's, the answer gets its own tokens past the budget.
    let max_tokens = match (endpoint.max_tokens, thinking) {
        (Some(max), _) => Some(max),
        (None, Some(budget)) => Some(budget.saturating_add(ANSWER_TOKENS)),
        (None, None) => endpoint.provider.default_max_tokens(),
    };
    if let Some(max) = max_tokens {
        body.insert("inferenceConfig".into(), json!({"maxTokens": max}));
    }
    if !offered.is_empty() {
        body.insert("toolConfig".into(), json!({"tools": tools(offered)?}));
    }
    if let Some(budget) = thinking {
        body.insert(
            "additionalModelRequestFields".into(),
            json!({"thinking": {"type": "enabled", "budget_tokens": budget}}),
        );
    }
    serde_json::to_vec(&Value::Object(body))
        .map(Bytes::from)
        .map_err(|e| LlmError::Config(format!("cannot encode the request: {e}")))
}

/// The block that ends a stable prefix the service may cache.
fn cache_point() -> Value {
    json!({"cachePoint": {"type": "default"}})
}

/// `toolConfig.tools` as sent: each tool's `toolSpec`, then a cache point
/// (the tools come first in the prefix, and change least).
pub(crate) fn tools(tools: &[ToolDefinition]) -> Result<Vec<Value>, LlmError> {
    let mut out = Vec::with_capacity(tools.len() + 1);
    let mut names = HashSet::new();
    for t in tools {
        if !valid_name(&t.name) {
            return Err(LlmError::Config(format!(
                "tool `{}`: Bedrock takes tool names of 1 to {MAX_NAME} letters, digits, `_` and `-`; rename it (a toolbox's `as`, or its prefix)",
                t.name
            )));
        }
        if !names.insert(t.name.as_str()) {
            return Err(LlmError::Config(format!(
                "tool `{}` is offered twice: Bedrock takes each name once",
                t.name
            )));
        }
        let mut schema = t.parameters.clone();
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        let mut spec = json!({"name": t.name, "inputSchema": {"json": schema}});
        // `description` is a non-empty string or absent.
        if !t.description.is_empty() {
            spec["description"] = json!(t.description);
        }
        out.push(json!({"toolSpec": spec}));
    }
    if !out.is_empty() {
        out.push(cache_point());
    }
    Ok(out)
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len()) && name.bytes().all(id_byte)
}

fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Converse's call ids for the Claude models behind it: 1 to 64 letters,
/// digits, `_` and `-` (the service's `ToolUseId` also allows `.` and
/// `:`, which the models refuse); of a refused one, 40 kept.
const IDS: Rule = Rule {
    max: MAX_ID,
    keep: 40,
};

/// A tool call's id as Converse takes it (see [`call_ids::wire_id`]).
#[cfg(test)]
pub(crate) fn wire_id(id: &str) -> String {
    call_ids::wire_id(IDS, id)
}

/// The system blocks (then a cache point) and the messages (the last
/// ending with a cache point). Without tools on offer, the service
/// refuses `toolUse` and `toolResult` blocks (`toolConfig` must be
/// defined with them): the calls and results of earlier turns are then
/// said as text.
fn messages<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage>,
    with_tools: bool,
) -> Result<(Vec<Value>, Vec<Value>), LlmError> {
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    // The user turn being gathered: tool results first, then text and media.
    let mut results: Vec<Value> = Vec::new();
    let mut user: Vec<Value> = Vec::new();
    let mut ids = Ids::new(IDS);
    let flush = |out: &mut Vec<Value>, results: &mut Vec<Value>, user: &mut Vec<Value>| {
        if results.is_empty() && user.is_empty() {
            return;
        }
        let mut content = std::mem::take(results);
        content.append(user);
        out.push(json!({"role": "user", "content": content}));
    };
    for (i, message) in history.into_iter().enumerate() {
        match message {
            // The prompt the agent puts first is the system prompt; one
            // later in the conversation is said to the model as the
            // user's, marked. An empty text block is refused.
            ChatMessage::System { content } if content.is_empty() => {}
            ChatMessage::System { content } if out.is_empty() && user.is_empty() => {
                system.push(json!({"text": content}));
            }
            ChatMessage::System { content } => {
                user.push(json!({"text": format!("[system] {content}")}));
            }
            ChatMessage::User { content } => user.extend(blocks(content)?),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                let mut inner = match content {
                    Content::Text(t) => text_block(t).into_iter().collect(),
                    Content::Parts(_) => blocks(content)?,
                };
                if inner.is_empty() {
                    // A blank text block is refused; the result was empty.
                    inner.push(json!({"text": "(no output)"}));
                }
                let id = ids.of_result(tool_call_id);
                if with_tools {
                    results.push(json!({"toolResult": {"toolUseId": id, "content": inner}}));
                } else {
                    results.push(json!({"text": format!("[the result of call {id}]")}));
                    results.extend(inner);
                }
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                let mut turn = Vec::new();
                if let Some(r) = reasoning.as_ref().filter(|r| r.provider == PROVIDER) {
                    turn.extend(r.blocks.iter().cloned());
                }
                if let Some(text) = content.as_deref().filter(|t| !t.trim().is_empty()) {
                    turn.push(json!({"text": text}));
                }
                if turn.is_empty() && tool_calls.is_empty() {
                    // An empty turn is refused; nothing was said.
                    tracing::debug!(message = i, "an empty assistant turn left out");
                    continue;
                }
                // Two assistant turns in a row (one between them left
                // out) are one: the roles must alternate.
                let continues = results.is_empty()
                    && user.is_empty()
                    && out.last().is_some_and(|m| m["role"] == "assistant");
                flush(&mut out, &mut results, &mut user);
                if !continues {
                    ids.next_turn();
                }
                for call in tool_calls {
                    let id = ids.of_call(&call.id);
                    if with_tools {
                        turn.push(json!({"toolUse": {
                            "toolUseId": id, "name": call.name, "input": input_of(call),
                        }}));
                    } else {
                        turn.push(json!({"text": format!(
                            "[call {id}: the tool `{}` with {}]", call.name, call.arguments
                        )}));
                    }
                }
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if let Some(content) = last["content"].as_array_mut() {
                            content.extend(turn);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": turn})),
                }
            }
        }
    }
    flush(&mut out, &mut results, &mut user);
    if !system.is_empty() {
        system.push(cache_point());
    }
    // The conversation so far is the next request's prefix: its end is
    // where the cache may end.
    if let Some(content) = out
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .filter(|c| !c.is_empty())
    {
        content.push(cache_point());
    }
    Ok((system, out))
}

/// A text block, `None` for an empty text (the service refuses one).
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"text": text}))
}

/// A call's arguments as the object `input` must be: the model's JSON
/// when it is an object, else the raw text under `arguments` (a call made
/// by another provider's model that sent no object).
fn input_of(call: &ToolCall) -> Value {
    match call.parse_arguments() {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"arguments": call.arguments}),
    }
}

/// A user or tool content as blocks: text, images as `image` blocks, a PDF
/// as a `document` block (both base64 `bytes`).
fn blocks(content: &Content) -> Result<Vec<Value>, LlmError> {
    let parts = match content {
        Content::Text(t) => return Ok(text_block(t).into_iter().collect()),
        Content::Parts(parts) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            ContentPart::Text { text } => out.extend(text_block(text)),
            ContentPart::ImageUrl { image_url } => {
                let (mime, data) = data_url(&image_url.url)?;
                let format = match mime {
                    "image/png" => "png",
                    "image/jpeg" => "jpeg",
                    "image/gif" => "gif",
                    "image/webp" => "webp",
                    other => {
                        return Err(LlmError::Config(format!(
                            "Bedrock takes images of png, jpeg, gif and webp, not {}",
                            excerpt(other)
                        )))
                    }
                };
                out.push(json!({"image": {"format": format, "source": {"bytes": data}}}));
            }
            ContentPart::File { file } => {
                let (mime, data) = data_url(&file.file_data)?;
                if mime != "application/pdf" {
                    return Err(LlmError::Config(format!(
                        "Bedrock is sent PDF documents only, not {}",
                        excerpt(mime)
                    )));
                }
                out.push(json!({"document": {
                    "format": "pdf", "name": document_name(&file.filename),
                    "source": {"bytes": data},
                }}));
            }
        }
    }
    Ok(out)
}

/// A document's name as the service takes it: letters, digits, `-`, `(`,
/// `)`, `[`, `]` and single spaces, 1 to 200 characters; the others become
/// spaces (the extension's dot too: `report.pdf` is `report pdf`).
fn document_name(filename: &str) -> String {
    let mut name = String::new();
    for c in filename.chars() {
        let c = if c.is_ascii_alphanumeric() || "-()[]".contains(c) {
            c
        } else {
            ' '
        };
        if c == ' ' && (name.is_empty() || name.ends_with(' ')) {
            continue;
        }
        if name.len() >= 200 {
            break;
        }
        name.push(c);
    }
    let name = name.trim_end();
    if name.is_empty() {
        "document".to_owned()
    } else {
        name.to_owned()
    }
}

/// `data:<mime>;base64,<data>` split.
fn data_url(url: &str) -> Result<(&str, &str), LlmError> {
    url.strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .filter(|(_, data)| !data.is_empty())
        .ok_or_else(|| LlmError::Config("a medium is not a base64 data URL".to_owned()))
}

/// Bedrock's stop reasons in the words the rest of Bindery reads.
fn finish_reason(stop: &str) -> String {
    match stop {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "guardrail_intervened" | "content_filtered" => "content_filter",
        // `malformed_model_output`, `malformed_tool_use`, and any added.
        other => other,
    }
    .to_owned()
}

/// `usage` read: the prompt's tokens are the uncached (`inputTokens`), the
/// cache's written and the cache's read together (Bedrock counts them
/// apart, as Anthropic does; its `totalTokens` has them all).
fn usage(value: &Value) -> Usage {
    let n = |k: &str| value.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cache_read_tokens = n("cacheReadInputTokens");
    let cache_write_tokens = n("cacheWriteInputTokens");
    Usage {
        prompt_tokens: n("inputTokens")
            .saturating_add(cache_read_tokens)
            .saturating_add(cache_write_tokens),
        completion_tokens: n("outputTokens"),
        total_tokens: 0,
        cache_read_tokens,
        cache_write_tokens,
        reasoning_tokens: 0,
    }
    .bounded()
}

/// A whole (not streamed) reply: `ConverseResponse`.
pub(crate) fn parse(text: &str) -> Result<ChatResponse, LlmError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        LlmError::Malformed(format!("the reply is not JSON ({e}): {}", excerpt(text)))
    })?;
    let content = value
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            LlmError::Malformed(format!(
                "the reply has no `output.message.content` list (is this Bedrock's Converse API?): {}",
                excerpt(text)
            ))
        })?;
    let mut reply = Reply::default();
    for block in content {
        reply.block(block)?;
    }
    reply.usage = value.get("usage").map(usage);
    reply.stop = value
        .get("stopReason")
        .and_then(Value::as_str)
        .map(finish_reason);
    Ok(reply.finish())
}

/// A reply as its blocks arrive.
#[derive(Default)]
struct Reply {
    text: Option<String>,
    calls: Vec<ToolCall>,
    reasoning: Vec<Value>,
    usage: Option<Usage>,
    stop: Option<String>,
}

impl Reply {
    /// One block of a whole reply: a union of one member.
    fn block(&mut self, block: &Value) -> Result<(), LlmError> {
        let Some((kind, inner)) = block.as_object().and_then(|o| {
            let mut members = o.iter();
            members.next().filter(|_| members.next().is_none())
        }) else {
            return Err(malformed("a content block that is not one member", block));
        };
        match kind.as_str() {
            "text" => {
                let text = inner
                    .as_str()
                    .ok_or_else(|| malformed("a text block's text is not a string", block))?;
                self.text.get_or_insert_with(String::new).push_str(text);
            }
            "toolUse" => {
                let field = |k: &str| inner.get(k).and_then(Value::as_str);
                let (Some(id), Some(name)) = (field("toolUseId"), field("name")) else {
                    return Err(malformed("a toolUse without its id or name", block));
                };
                if inner.get("type").is_some() {
                    return Err(server_tool(block));
                }
                self.calls.push(ToolCall {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    arguments: inner.get("input").map_or("{}".to_owned(), Value::to_string),
                });
            }
            "reasoningContent" if inner.is_object() => self.reasoning.push(block.clone()),
            other => {
                return Err(LlmError::Malformed(format!(
                    "the reply has a content block of kind {}, which Bindery does not take (a server tool, citations?)",
                    excerpt(other)
                )))
            }
        }
        Ok(())
    }

    fn finish(self) -> ChatResponse {
        ChatResponse {
            content: self.text,
            tool_calls: self.calls,
            finish_reason: self.stop,
            usage: self.usage,
            reasoning: (!self.reasoning.is_empty()).then(|| Reasoning {
                provider: PROVIDER.to_owned(),
                blocks: self.reasoning,
                endpoint: None,
            }),
            ..ChatResponse::default()
        }
    }
}

/// A streamed reply, fed each event of the event stream in order
/// (`messageStart`, per block `contentBlockStart` for a tool call only,
/// `contentBlockDelta`s, `contentBlockStop`, then `messageStop` and
/// `metadata`).
#[derive(Default)]
pub(crate) struct Stream {
    reply: Reply,
    /// The block open at each index. A block opens at the next index only
    /// (by its start, or its first delta: text and reasoning have no
    /// start), so this grows by one per event the reply's bytes paid for,
    /// never to an index the model names.
    open: Vec<Option<Open>>,
    stopped: bool,
    metadata: bool,
}

/// A block being streamed.
enum Open {
    /// Started with no kind yet: its first delta says.
    Pending,
    Text(String),
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    /// Redacted reasoning: the bytes of its pieces, together.
    Redacted(Vec<u8>),
    /// The call at this position of the reply, and its input so far.
    Tool {
        call: usize,
        input: String,
    },
}

impl Stream {
    /// Whether `messageStop` and the `metadata` after it have arrived.
    pub fn is_done(&self) -> bool {
        self.stopped && self.metadata
    }

    /// Takes one event of the stream.
    pub fn handle_frame(
        &mut self,
        frame: &Frame,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let data = String::from_utf8_lossy(&frame.payload);
        let event: Value = serde_json::from_str(&data).map_err(|e| {
            LlmError::Malformed(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(&data)
            ))
        })?;
        if !event.is_object() {
            return Err(malformed_text("a stream event is not an object", &data));
        }
        let index = event
            .get("contentBlockIndex")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match frame.event_type.as_str() {
            "contentBlockStart" => {
                let i = index
                    .ok_or_else(|| malformed_text("a block starts without an index", &data))?;
                if i != self.open.len() {
                    return Err(malformed_text(
                        &format!(
                            "a block starts at index {i}, where the next is {}",
                            self.open.len()
                        ),
                        &data,
                    ));
                }
                let start = event.get("start").and_then(Value::as_object);
                let Some(start) = start else {
                    return Err(malformed_text(
                        "a block starts without a `start` object",
                        &data,
                    ));
                };
                let open = if let Some(tool) = start.get("toolUse") {
                    let field = |k: &str| tool.get(k).and_then(Value::as_str);
                    let (Some(id), Some(name)) = (field("toolUseId"), field("name")) else {
                        return Err(malformed_text(
                            "a toolUse starts without its id or name",
                            &data,
                        ));
                    };
                    if tool.get("type").is_some() {
                        return Err(server_tool(&event));
                    }
                    let call = self.reply.calls.len();
                    on_delta(StreamDelta::ToolCallStarted {
                        index: call,
                        id: id.to_owned(),
                        name: name.to_owned(),
                    });
                    self.reply.calls.push(ToolCall {
                        id: id.to_owned(),
                        name: name.to_owned(),
                        arguments: String::new(),
                    });
                    Open::Tool {
                        call,
                        input: String::new(),
                    }
                } else if let Some(kind) = start.keys().next() {
                    return Err(malformed_text(
                        &format!(
                            "a block starts as {}, which Bindery does not take (a server tool?)",
                            excerpt(kind)
                        ),
                        &data,
                    ));
                } else {
                    Open::Pending
                };
                self.open.push(Some(open));
            }
            "contentBlockDelta" => {
                let i = index.ok_or_else(|| malformed_text("a delta without an index", &data))?;
                let delta = event
                    .get("delta")
                    .and_then(Value::as_object)
                    .ok_or_else(|| malformed_text("a delta without a `delta` object", &data))?;
                if i == self.open.len() {
                    // Text and reasoning open with their first delta.
                    self.open.push(Some(Open::Pending));
                }
                let open = self
                    .open
                    .get_mut(i)
                    .and_then(Option::as_mut)
                    .ok_or_else(|| malformed_text("a delta for a block that is not open", &data))?;
                Self::delta(open, delta, &data, on_delta)?;
            }
            "contentBlockStop" => {
                let open = index
                    .and_then(|i| self.open.get_mut(i))
                    .and_then(Option::take)
                    .ok_or_else(|| malformed_text("a block stops that is not open", &data))?;
                self.close(open);
            }
            "messageStop" => {
                let stop = event
                    .get("stopReason")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed_text("a messageStop without its stopReason", &data))?;
                self.reply.stop = Some(finish_reason(stop));
                self.stopped = true;
            }
            "metadata" => {
                if let Some(u) = event.get("usage") {
                    self.reply.usage = Some(usage(u));
                }
                self.metadata = true;
            }
            // `messageStart`, and events added after this version.
            _ => {}
        }
        Ok(())
    }

    /// One delta added to its block: of the block's kind only (a pending
    /// block takes the kind of its first).
    fn delta(
        open: &mut Open,
        delta: &Map<String, Value>,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let mut members = delta.iter();
        let Some((kind, value)) = members.next().filter(|_| members.next().is_none()) else {
            return Err(malformed_text("a delta that is not one member", data));
        };
        let text = |v: &Value, what: &str| {
            v.as_str().map(str::to_owned).ok_or_else(|| {
                malformed_text(&format!("a {what} delta that is not a string"), data)
            })
        };
        match (kind.as_str(), &mut *open) {
            ("text", Open::Pending) => *open = Open::Text(String::new()),
            ("reasoningContent", Open::Pending) => {
                let redacted = value.get("redactedContent").is_some();
                *open = if redacted {
                    Open::Redacted(Vec::new())
                } else {
                    Open::Reasoning {
                        text: String::new(),
                        signature: None,
                    }
                };
            }
            _ => {}
        }
        match (kind.as_str(), open) {
            ("text", Open::Text(so_far)) => {
                let piece = text(value, "text")?;
                so_far.push_str(&piece);
                if !piece.is_empty() {
                    on_delta(StreamDelta::Content(piece));
                }
            }
            ("toolUse", Open::Tool { call, input }) => {
                let piece = text(value.get("input").unwrap_or(&Value::Null), "toolUse input")?;
                input.push_str(&piece);
                if !piece.is_empty() {
                    on_delta(StreamDelta::ToolCallArguments {
                        index: *call,
                        fragment: piece,
                    });
                }
            }
            // Reasoning is kept, never forwarded as the reply.
            (
                "reasoningContent",
                Open::Reasoning {
                    text: so_far,
                    signature,
                },
            ) => {
                let mut members = value.as_object().into_iter().flatten();
                match members.next().filter(|_| members.next().is_none()) {
                    Some((k, v)) if k == "text" => so_far.push_str(&text(v, "reasoning")?),
                    Some((k, v)) if k == "signature" => signature
                        .get_or_insert_with(String::new)
                        .push_str(&text(v, "signature")?),
                    _ => {
                        return Err(malformed_text(
                            "a reasoning delta of another kind than its block's",
                            data,
                        ))
                    }
                }
            }
            ("reasoningContent", Open::Redacted(bytes)) => {
                let piece = value
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.get("redactedContent"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        malformed_text("a redacted reasoning block given another delta", data)
                    })?;
                let piece = base64::engine::general_purpose::STANDARD
                    .decode(piece)
                    .map_err(|_| malformed_text("redacted reasoning that is not base64", data))?;
                bytes.extend_from_slice(&piece);
            }
            (kind, open) => {
                return Err(malformed_text(
                    &format!("a {} delta for a {} block", excerpt(kind), open.kind()),
                    data,
                ))
            }
        }
        Ok(())
    }

    /// A stopped block, into the reply.
    fn close(&mut self, open: Open) {
        match open {
            Open::Pending => {}
            Open::Text(text) => self
                .reply
                .text
                .get_or_insert_with(String::new)
                .push_str(&text),
            Open::Reasoning { text, signature } => {
                let mut inner = json!({"text": text});
                if let Some(signature) = signature {
                    inner["signature"] = json!(signature);
                }
                self.reply
                    .reasoning
                    .push(json!({"reasoningContent": {"reasoningText": inner}}));
            }
            Open::Redacted(bytes) => {
                let data = base64::engine::general_purpose::STANDARD.encode(bytes);
                self.reply
                    .reasoning
                    .push(json!({"reasoningContent": {"redactedContent": data}}));
            }
            Open::Tool { call, input } => {
                if let Some(c) = self.reply.calls.get_mut(call) {
                    c.arguments = if input.trim().is_empty() {
                        "{}".to_owned()
                    } else {
                        input
                    };
                }
            }
        }
    }

    /// The reply, once the stream ended.
    pub fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.stopped {
            return Err(LlmError::Malformed(
                "the stream ended before `messageStop`".to_owned(),
            ));
        }
        if let Some(at) = self.open.iter().position(Option::is_some) {
            return Err(LlmError::Malformed(format!(
                "the stream ended with block {at} never stopped"
            )));
        }
        Ok(self.reply.finish())
    }
}

impl Open {
    fn kind(&self) -> &'static str {
        match self {
            Open::Pending => "new",
            Open::Text(_) => "text",
            Open::Reasoning { .. } => "reasoning",
            Open::Redacted(_) => "redacted reasoning",
            Open::Tool { .. } => "toolUse",
        }
    }
}

/// A `toolUse` of `type` `server_tool_use`: a tool the service runs
/// itself, which Bindery neither offers nor runs.
fn server_tool(block: &Value) -> LlmError {
    malformed(
        "a toolUse of a server tool, which Bindery does not take",
        block,
    )
}

fn malformed(what: &str, block: &Value) -> LlmError {
    LlmError::Malformed(format!("{what}: {}", excerpt(&block.to_string())))
}

fn malformed_text(what: &str, data: &str) -> LlmError {
    LlmError::Malformed(format!("{what}: {}", excerpt(data)))
}

#[cfg(test)]
mod tests;
