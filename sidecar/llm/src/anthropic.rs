//! Anthropic's Messages API: the request a conversation becomes, and the
//! reply, whole or streamed, read back into the one [`ChatResponse`].
//!
//! What it takes care of, that a compatibility layer gets wrong:
//! - the system prompt goes in `system`, each tool result in a
//!   `tool_result` block of the user turn after the call, consecutive
//!   user-side messages in one turn (results first);
//! - a tool call's id is one Anthropic accepts (`^[a-zA-Z0-9_-]+$`): any
//!   other (a session begun with another provider) is mapped the same way
//!   in the call and in its result ([`call_ids::wire_id`](super::call_ids::wire_id));
//! - thinking blocks come back with their signatures byte for byte as the
//!   assistant turn's [`Reasoning`], go back first in that turn's content,
//!   and are never forwarded as the reply's text;
//! - prompt caching: breakpoints on the tools, the system prompt and the
//!   last message (the stable prefix grows by a step each request), and
//!   the cache's read and write counts in [`Usage`].

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::call_ids::{self, Ids, Rule};
use super::content::{Content, ContentPart};
use super::error::{excerpt, LlmError};
use super::types::{ChatMessage, ChatResponse, ModelEndpoint, Reasoning, StreamDelta};
use super::types::{ToolCall, ToolDefinition, Usage};

/// The API version every request names (`anthropic-version`).
pub(crate) const VERSION: &str = "2023-06-01";
/// The provider's name on [`Reasoning`].
pub(crate) const PROVIDER: &str = "anthropic";

/// The request body for `req`.
pub(crate) fn body<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage> + Clone,
    offered: &[ToolDefinition],
    endpoint: &ModelEndpoint,
    stream: bool,
) -> Result<Bytes, LlmError> {
    let thinking = endpoint
        .thinking_budget
        .filter(|_| !call_ids::continues_a_turn_without_reasoning(history.clone(), PROVIDER));
    let (system, messages) = messages(history)?;
    let max_tokens = endpoint
        .max_tokens
        .or(endpoint.provider.default_max_tokens())
        .unwrap_or(8192);
    let mut body = Map::new();
    body.insert("model".into(), json!(endpoint.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !offered.is_empty() {
        body.insert("tools".into(), Value::Array(tools(offered)?));
    }
    if let Some(budget) = thinking {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    body.insert("stream".into(), json!(stream));
    serde_json::to_vec(&Value::Object(body))
        .map(Bytes::from)
        .map_err(|e| LlmError::Config(format!("cannot encode the request: {e}")))
}

/// The cache breakpoint put on the last block of a stable prefix.
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// The tools, the last one a cache breakpoint (the tools come first in
/// Anthropic's prefix, and change least).
pub(crate) fn tools(tools: &[ToolDefinition]) -> Result<Vec<Value>, LlmError> {
    let mut out = Vec::with_capacity(tools.len());
    for t in tools {
        if !valid_name(&t.name) {
            return Err(LlmError::Config(format!(
                "tool `{}`: Anthropic takes tool names of 1 to 128 letters, digits, `_` and `-`; rename it (a toolbox's `as`, or its prefix)",
                t.name
            )));
        }
        let mut schema = t.parameters.clone();
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        let mut tool = json!({"name": t.name, "input_schema": schema});
        if !t.description.is_empty() {
            tool["description"] = json!(t.description);
        }
        out.push(tool);
    }
    if let Some(last) = out.last_mut() {
        last["cache_control"] = ephemeral();
    }
    Ok(out)
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Anthropic's call ids: letters, digits, `_` and `-`, of any length.
const IDS: Rule = Rule {
    max: usize::MAX,
    keep: usize::MAX,
};

/// A tool call's id as Anthropic takes it (see [`call_ids::wire_id`]).
#[cfg(test)]
pub(crate) fn wire_id(id: &str) -> String {
    call_ids::wire_id(IDS, id)
}

/// The system blocks (the last a cache breakpoint) and the messages.
fn messages<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage>,
) -> Result<(Vec<Value>, Vec<Value>), LlmError> {
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    // The user turn being gathered: tool results first, then text and media.
    let mut results: Vec<Value> = Vec::new();
    let mut ids = Ids::new(IDS);
    let mut user: Vec<Value> = Vec::new();
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
            // later in the conversation (there is no such role in a
            // Messages turn) is said to the model as the user's, marked.
            ChatMessage::System { content } if out.is_empty() && user.is_empty() => {
                system.push(json!({"type": "text", "text": content}));
            }
            ChatMessage::System { content } => {
                user.push(json!({"type": "text", "text": format!("[system] {content}")}));
            }
            ChatMessage::User { content } => user.extend(blocks(content)?),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                let inner = match content {
                    Content::Text(t) => json!(t),
                    Content::Parts(_) => Value::Array(blocks(content)?),
                };
                results.push(json!({
                    "type": "tool_result",
                    "tool_use_id": ids.of_result(tool_call_id),
                    "content": inner,
                }));
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                flush(&mut out, &mut results, &mut user);
                ids.next_turn();
                let mut turn = Vec::new();
                if let Some(r) = reasoning.as_ref().filter(|r| r.provider == PROVIDER) {
                    turn.extend(r.blocks.iter().cloned());
                }
                if let Some(text) = content.as_deref().filter(|t| !t.trim().is_empty()) {
                    turn.push(json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    turn.push(json!({
                        "type": "tool_use",
                        "id": ids.of_call(&call.id),
                        "name": call.name,
                        "input": input_of(call),
                    }));
                }
                if turn.is_empty() {
                    // An empty turn is refused; nothing was said.
                    tracing::debug!(message = i, "an empty assistant turn left out");
                    continue;
                }
                out.push(json!({"role": "assistant", "content": turn}));
            }
        }
    }
    flush(&mut out, &mut results, &mut user);
    if let Some(last) = system.last_mut() {
        last["cache_control"] = ephemeral();
    }
    // The conversation so far is the next request's prefix: its last
    // block marks where the cache may end.
    if let Some(block) = out
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
        .filter(|b| matches!(b["type"].as_str(), Some("text" | "tool_result" | "image")))
    {
        block["cache_control"] = ephemeral();
    }
    Ok((system, out))
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

/// A user or tool content as blocks: text, and media as base64 sources.
fn blocks(content: &Content) -> Result<Vec<Value>, LlmError> {
    let parts = match content {
        Content::Text(t) => return Ok(vec![json!({"type": "text", "text": t})]),
        Content::Parts(parts) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        out.push(match part {
            ContentPart::Text { text } => json!({"type": "text", "text": text}),
            ContentPart::ImageUrl { image_url } => {
                let (mime, data) = data_url(&image_url.url)?;
                json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}})
            }
            ContentPart::File { file } => {
                let (mime, data) = data_url(&file.file_data)?;
                json!({"type": "document", "title": file.filename,
                       "source": {"type": "base64", "media_type": mime, "data": data}})
            }
        });
    }
    Ok(out)
}

/// `data:<mime>;base64,<data>` split.
fn data_url(url: &str) -> Result<(&str, &str), LlmError> {
    url.strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .ok_or_else(|| LlmError::Config("a medium is not a base64 data URL".to_owned()))
}

/// Anthropic's stop reasons in the words the rest of Bindery reads.
fn finish_reason(stop: &str) -> String {
    match stop {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "refusal" => "content_filter",
        other => other,
    }
    .to_owned()
}

/// `usage` read: the prompt's tokens are the uncached, the cache's written
/// and the cache's read together (Anthropic counts them apart).
fn usage(value: &Value, into: &mut Usage) {
    let n = |k: &str| value.get(k).and_then(Value::as_u64);
    if let Some(v) = n("input_tokens") {
        into.prompt_tokens = v;
    }
    if let Some(v) = n("cache_creation_input_tokens") {
        into.cache_write_tokens = v;
    }
    if let Some(v) = n("cache_read_input_tokens") {
        into.cache_read_tokens = v;
    }
    if let Some(v) = n("output_tokens") {
        into.completion_tokens = v;
    }
}

/// The usage as Bindery counts it: prompt tokens all of them.
fn total(mut u: Usage) -> Usage {
    u.prompt_tokens = u
        .prompt_tokens
        .saturating_add(u.cache_read_tokens)
        .saturating_add(u.cache_write_tokens);
    u.bounded()
}

/// A whole (not streamed) reply.
pub(crate) fn parse(text: &str) -> Result<ChatResponse, LlmError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        LlmError::Malformed(format!("the reply is not JSON ({e}): {}", excerpt(text)))
    })?;
    let content = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            LlmError::Malformed(format!(
                "the reply has no `content` list (is this Anthropic's Messages API?): {}",
                excerpt(text)
            ))
        })?;
    let mut reply = Reply::default();
    for block in content {
        reply.block(block.clone())?;
    }
    let mut u = Usage::default();
    if let Some(v) = value.get("usage") {
        usage(v, &mut u);
    }
    reply.usage = value.get("usage").map(|_| u);
    reply.stop = value
        .get("stop_reason")
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
    fn block(&mut self, block: Value) -> Result<(), LlmError> {
        match block["type"].as_str() {
            Some("text") => self
                .text
                .get_or_insert_with(String::new)
                .push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => self.calls.push(ToolCall {
                id: block["id"].as_str().unwrap_or_default().to_owned(),
                name: block["name"].as_str().unwrap_or_default().to_owned(),
                arguments: block.get("input").map_or("{}".to_owned(), Value::to_string),
            }),
            Some("thinking" | "redacted_thinking") => self.reasoning.push(block),
            other => {
                return Err(LlmError::Malformed(format!(
                    "the reply has a content block of type {other:?}, which Bindery does not take (a server tool?)"
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
            usage: self.usage.map(total),
            reasoning: (!self.reasoning.is_empty()).then(|| Reasoning {
                provider: PROVIDER.to_owned(),
                blocks: self.reasoning,
                endpoint: None,
            }),
            ..ChatResponse::default()
        }
    }
}

/// A streamed reply, fed each event's `data` in order.
#[derive(Default)]
pub(crate) struct Stream {
    reply: Reply,
    /// The block open at each index: its JSON so far and, for a
    /// `tool_use`, the partial input and its position among the calls.
    /// Blocks start at the next index only (Anthropic numbers them in
    /// order), so it grows by one per block the reply's bytes paid for,
    /// never to an index the model names.
    open: Vec<Option<Open>>,
    usage: Usage,
    saw_usage: bool,
    done: bool,
}

struct Open {
    block: Value,
    partial: String,
    call: Option<usize>,
}

impl Stream {
    /// Whether `message_stop` has arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes the `data` of one event.
    pub fn handle_event(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(());
        }
        let event: Value = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(data)
            ))
        })?;
        let index = event["index"].as_u64().map(|i| i as usize);
        match event["type"].as_str() {
            Some("message_start") => {
                if let Some(u) = event.pointer("/message/usage") {
                    usage(u, &mut self.usage);
                    self.saw_usage = true;
                }
            }
            Some("content_block_start") => {
                let i = index.ok_or_else(|| malformed("a block starts without an index", data))?;
                if i != self.open.len() {
                    return Err(malformed(
                        &format!(
                            "a block starts at index {i}, where the next is {}",
                            self.open.len()
                        ),
                        data,
                    ));
                }
                let block = event["content_block"].clone();
                if !block.is_object() {
                    return Err(malformed("a block that is not an object", data));
                }
                let mut call = None;
                if block["type"] == "tool_use" {
                    let at = self.reply.calls.len();
                    let id = block["id"].as_str().unwrap_or_default().to_owned();
                    let name = block["name"].as_str().unwrap_or_default().to_owned();
                    on_delta(StreamDelta::ToolCallStarted {
                        index: at,
                        id: id.clone(),
                        name: name.clone(),
                    });
                    self.reply.calls.push(ToolCall {
                        id,
                        name,
                        arguments: String::new(),
                    });
                    call = Some(at);
                }
                self.open.push(Some(Open {
                    block,
                    partial: String::new(),
                    call,
                }));
            }
            Some("content_block_delta") => {
                let open = index
                    .and_then(|i| self.open.get_mut(i))
                    .and_then(Option::as_mut)
                    .ok_or_else(|| malformed("a delta for a block that is not open", data))?;
                let delta = &event["delta"];
                let piece = |k: &str| delta[k].as_str().unwrap_or_default();
                // Each delta adds to a block of its own kind only.
                let kind = delta["type"].as_str().unwrap_or_default();
                let fits = match kind {
                    "text_delta" => open.block["type"] == "text",
                    "input_json_delta" => open.call.is_some(),
                    "thinking_delta" | "signature_delta" => open.block["type"] == "thinking",
                    _ => true,
                };
                if !fits {
                    return Err(malformed(
                        &format!("a {kind} for a {} block", open.block["type"]),
                        data,
                    ));
                }
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        let text = piece("text");
                        if !text.is_empty() {
                            on_delta(StreamDelta::Content(text.to_owned()));
                        }
                        append(&mut open.block, "text", text);
                    }
                    Some("input_json_delta") => {
                        let fragment = piece("partial_json");
                        open.partial.push_str(fragment);
                        if let (Some(at), false) = (open.call, fragment.is_empty()) {
                            on_delta(StreamDelta::ToolCallArguments {
                                index: at,
                                fragment: fragment.to_owned(),
                            });
                        }
                    }
                    // Reasoning is kept, never forwarded as the reply.
                    Some("thinking_delta") => {
                        append(&mut open.block, "thinking", piece("thinking"))
                    }
                    Some("signature_delta") => {
                        append(&mut open.block, "signature", piece("signature"))
                    }
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                let open = index
                    .and_then(|i| self.open.get_mut(i))
                    .and_then(Option::take)
                    .ok_or_else(|| malformed("a block stops that is not open", data))?;
                match open.call {
                    Some(at) => {
                        self.reply.calls[at].arguments = if open.partial.trim().is_empty() {
                            open.block
                                .get("input")
                                .map_or("{}".to_owned(), Value::to_string)
                        } else {
                            open.partial
                        };
                    }
                    None => self.reply.block(open.block)?,
                }
            }
            Some("message_delta") => {
                if let Some(stop) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.reply.stop = Some(finish_reason(stop));
                }
                if let Some(u) = event.get("usage") {
                    usage(u, &mut self.usage);
                    self.saw_usage = true;
                }
            }
            Some("message_stop") => self.done = true,
            Some("error") => {
                let kind = event.pointer("/error/type").and_then(Value::as_str);
                return Err(LlmError::Http {
                    // What Anthropic answers these with before a stream.
                    status: match kind {
                        Some("overloaded_error") => 529,
                        Some("rate_limit_error") => 429,
                        Some("api_error") => 500,
                        _ => 400,
                    },
                    body: excerpt(data),
                });
            }
            // `ping`, and events added after this version: nothing to do.
            _ => {}
        }
        Ok(())
    }

    /// The reply, once the stream ended.
    pub fn finish(mut self) -> Result<ChatResponse, LlmError> {
        if !self.done {
            return Err(LlmError::Malformed(
                "the stream ended before `message_stop`".to_owned(),
            ));
        }
        if let Some(at) = self.open.iter().position(Option::is_some) {
            return Err(LlmError::Malformed(format!(
                "the stream ended with block {at} never stopped"
            )));
        }
        self.reply.usage = self.saw_usage.then_some(self.usage);
        Ok(self.reply.finish())
    }
}

/// `piece` added to the text at `key` of an object `block`, in place: a
/// long block streamed in many pieces is copied once per growth of its
/// buffer, not once per piece (review 68: 13 s for an 8 MB thinking block).
fn append(block: &mut Value, key: &str, piece: &str) {
    let Value::Object(fields) = block else {
        return;
    };
    match fields.get_mut(key) {
        Some(Value::String(text)) => text.push_str(piece),
        _ => {
            fields.insert(key.to_owned(), Value::String(piece.to_owned()));
        }
    }
}

fn malformed(what: &str, data: &str) -> LlmError {
    LlmError::Malformed(format!("{what}: {}", excerpt(data)))
}

#[cfg(test)]
mod tests;
