//! OpenAI's Responses API (`POST /v1/responses`): the request a
//! conversation becomes, and the reply, whole or streamed, read back into
//! the one [`ChatResponse`].
//!
//! What it takes care of, that a compatibility layer gets wrong:
//! - stateless use: `store: false` and the whole history as `input` items
//!   every time (Bindery owns the history; no `previous_response_id`);
//! - the system prompt the agent puts first goes in `instructions`, a later
//!   one as a `developer` message in its place; user text and media as
//!   `input_text`, `input_image` and `input_file` parts; an assistant turn
//!   as its reasoning items, its text, then its `function_call` items;
//!   each result as a `function_call_output` answering its call;
//! - a call's id is the API's `call_id` (never the item's `fc_…` id): one
//!   the API takes (`^[a-zA-Z0-9_-]{1,64}$`) is sent as it is, any other (a
//!   session begun with another provider) is mapped the same way in the
//!   call and in its output ([`call_ids::wire_id`](super::call_ids::wire_id));
//! - reasoning items come back with their `encrypted_content`
//!   (`include: ["reasoning.encrypted_content"]`) as the assistant turn's
//!   [`Reasoning`], go back as they came before that turn's calls, are
//!   never sent for another provider's reasoning, and their summaries are
//!   never the reply's text;
//! - usage: the prompt's tokens with the cache's read and written ones,
//!   the reply's with its reasoning tokens ([`Reply::reasoning_tokens`]).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::call_ids::{Ids, Rule};
use super::content::{Content, ContentPart};
use super::error::{excerpt, LlmError};
use super::types::{ChatMessage, ChatResponse, ModelEndpoint, Reasoning, StreamDelta};
use super::types::{ToolCall, ToolDefinition, Usage};

/// The provider's name on [`Reasoning`].
pub(crate) const PROVIDER: &str = "openai-responses";
/// Appended to the base URL (`https://api.openai.com/v1`).
pub(crate) const PATH: &str = "/responses";

/// The longest `call_id` the API takes (`string_above_max_length` past it).
const MAX_CALL_ID: usize = 64;

/// The request body for `history`, offering `offered`.
pub(crate) fn body<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage> + Clone,
    offered: &[ToolDefinition],
    endpoint: &ModelEndpoint,
    stream: bool,
) -> Result<Bytes, LlmError> {
    let (instructions, input) = input(history)?;
    let mut body = Map::new();
    body.insert("model".into(), json!(endpoint.model));
    if let Some(instructions) = instructions {
        body.insert("instructions".into(), json!(instructions));
    }
    body.insert("input".into(), Value::Array(input));
    if !offered.is_empty() {
        body.insert("tools".into(), Value::Array(tools(offered)?));
        body.insert("parallel_tool_calls".into(), json!(true));
    }
    if let Some(max) = endpoint.max_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    // Nothing kept at OpenAI: each request carries the whole history, and
    // a reasoning model's reasoning comes back encrypted to be sent again.
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    body.insert("stream".into(), json!(stream));
    serde_json::to_vec(&Value::Object(body))
        .map(Bytes::from)
        .map_err(|e| LlmError::Config(format!("cannot encode the request: {e}")))
}

/// The tools as the request lists them: functions, not strict (Bindery's
/// schemas are not all of the strict subset).
pub(crate) fn tools(tools: &[ToolDefinition]) -> Result<Vec<Value>, LlmError> {
    let mut out = Vec::with_capacity(tools.len());
    for t in tools {
        if !valid_name(&t.name) {
            return Err(LlmError::Config(format!(
                "tool `{}`: OpenAI takes tool names of 1 to 64 letters, digits, `_` and `-`; rename it (a toolbox's `as`, or its prefix)",
                t.name
            )));
        }
        let mut schema = t.parameters.clone();
        if !schema.is_object() {
            schema = json!({"type": "object", "properties": {}});
        }
        let mut tool =
            json!({"type": "function", "name": t.name, "parameters": schema, "strict": false});
        if !t.description.is_empty() {
            tool["description"] = json!(t.description);
        }
        out.push(tool);
    }
    Ok(out)
}

/// Whether `s` is 1 to 64 letters, digits, `_` and `-`: a tool name as the
/// API takes it, and a `call_id` sent as it is.
fn valid_name(s: &str) -> bool {
    (1..=MAX_CALL_ID).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The Responses API's `call_id`s: 1 to 64 letters, digits, `_` and `-`
/// (OpenAI's `call_…`, Anthropic's `toolu_…` as they are); of a refused
/// one, 40 kept.
const IDS: Rule = Rule {
    max: MAX_CALL_ID,
    keep: 40,
};

/// A call's id as a `call_id` (see [`call_ids::wire_id`]).
#[cfg(test)]
pub(crate) fn wire_id(id: &str) -> String {
    super::call_ids::wire_id(IDS, id)
}

/// The `instructions` (the system prompt the agent put first) and the
/// `input` items.
fn input<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage>,
) -> Result<(Option<String>, Vec<Value>), LlmError> {
    let mut instructions: Vec<&str> = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    let mut ids = Ids::new(IDS);
    for (i, message) in history.into_iter().enumerate() {
        match message {
            // The prompt the agent puts first is the instructions: the
            // API's own place for them, the same for every request (the
            // start of the cached prefix).
            ChatMessage::System { content } if out.is_empty() => instructions.push(content),
            // One later in the conversation stays where it was said, with
            // the role OpenAI gives the application's instructions.
            ChatMessage::System { content } => out.push(json!({
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": content}],
            })),
            ChatMessage::User { content } => out.push(json!({
                "type": "message",
                "role": "user",
                "content": parts(content),
            })),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => out.push(json!({
                "type": "function_call_output",
                "call_id": ids.of_result(tool_call_id),
                "output": match content {
                    Content::Text(text) => json!(text),
                    Content::Parts(_) => Value::Array(parts(content)),
                },
            })),
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                ids.next_turn();
                let text = content.as_deref().filter(|t| !t.trim().is_empty());
                if text.is_none() && tool_calls.is_empty() {
                    // Nothing was said; a reasoning item alone would have
                    // no item to precede.
                    tracing::debug!(message = i, "an empty assistant turn left out");
                    continue;
                }
                if let Some(r) = reasoning.as_ref().filter(|r| r.provider == PROVIDER) {
                    out.extend(
                        r.blocks
                            .iter()
                            .filter(|b| b["type"] == "reasoning")
                            .cloned(),
                    );
                }
                if let Some(text) = text {
                    // The SDK's output message needs an `id` and a
                    // `status` the turn does not keep (and a made-up id
                    // names an item nobody stored): the easy form, whose
                    // assistant text the API reads as output text.
                    out.push(json!({"type": "message", "role": "assistant", "content": text}));
                }
                for call in tool_calls {
                    out.push(json!({
                        "type": "function_call",
                        "call_id": ids.of_call(&call.id),
                        "name": call.name,
                        "arguments": arguments_of(call),
                    }));
                }
            }
        }
    }
    let instructions = (!instructions.is_empty()).then(|| instructions.join("\n\n"));
    Ok((instructions, out))
}

/// A call's arguments as JSON text: the model's when they are JSON, `{}`
/// when empty, else the raw text under `arguments` (a call another
/// provider's model made with text that is not JSON).
fn arguments_of(call: &ToolCall) -> String {
    if call.arguments.trim().is_empty() {
        return "{}".to_owned();
    }
    match call.parse_arguments() {
        Ok(_) => call.arguments.clone(),
        Err(_) => json!({"arguments": call.arguments}).to_string(),
    }
}

/// A user's or a tool's content as input parts: text, images (a data URL
/// or any URL the API fetches) and files (a PDF, as a data URL).
fn parts(content: &Content) -> Vec<Value> {
    let parts = match content {
        Content::Text(t) => return vec![json!({"type": "input_text", "text": t})],
        Content::Parts(parts) => parts,
    };
    parts
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => json!({"type": "input_text", "text": text}),
            ContentPart::ImageUrl { image_url } => {
                json!({"type": "input_image", "image_url": image_url.url, "detail": "auto"})
            }
            ContentPart::File { file } => json!({
                "type": "input_file",
                "filename": file.filename,
                "file_data": file.file_data,
            }),
        })
        .collect()
}

/// `usage` read: `input_tokens` counts the cached ones too (OpenAI's
/// prompt caching is part of the prompt), `output_tokens` the reasoning.
fn usage(value: &Value) -> Option<Usage> {
    if !value.is_object() {
        return None;
    }
    let n = |p: &str| value.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(
        Usage {
            prompt_tokens: n("/input_tokens"),
            completion_tokens: n("/output_tokens"),
            total_tokens: 0,
            cache_read_tokens: n("/input_tokens_details/cached_tokens"),
            cache_write_tokens: n("/input_tokens_details/cache_write_tokens"),
            reasoning_tokens: 0,
        }
        .bounded(),
    )
}

/// What the API said of a failed response (`response.failed`, a whole
/// reply of status `failed`, an `error` event), as the status it answers
/// that error with before a reply: a rate limit or a server error is busy
/// (retried, or passed to a fallback), anything else refused.
fn api_error(error: Option<&Value>, what: &str) -> LlmError {
    let text = |k: &str| error.and_then(|e| e.get(k)).and_then(Value::as_str);
    let code = text("code").or(text("type")).unwrap_or("no code");
    let message = text("message").unwrap_or("no message");
    LlmError::Http {
        status: match code {
            "rate_limit_exceeded" => 429,
            "server_error" | "vector_store_timeout" => 500,
            _ => 400,
        },
        body: excerpt(&format!("{what}: {code}: {message}")),
    }
}

/// A reasoning item as it goes back: its fields as they came, but for
/// those null (null means absent, and the request's types take no null
/// there); `None` (left out) for one without its `encrypted_content`,
/// which with `store: false` names an item nobody kept, and which the API
/// refuses.
fn reasoning_item(item: &Value) -> Result<Option<Value>, LlmError> {
    let Some(fields) = item.as_object() else {
        return Err(LlmError::Malformed(format!(
            "a reasoning item is not an object: {}",
            excerpt(&item.to_string())
        )));
    };
    if !fields.get("id").is_some_and(Value::is_string) {
        return Err(LlmError::Malformed(format!(
            "a reasoning item has no id: {}",
            excerpt(&item.to_string())
        )));
    }
    if fields
        .get("encrypted_content")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        tracing::debug!("a reasoning item without its encrypted_content left out");
        return Ok(None);
    }
    let kept: Map<String, Value> = fields
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Some(Value::Object(kept)))
}

/// A whole (not streamed) reply.
pub(crate) fn parse(text: &str) -> Result<ChatResponse, LlmError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        LlmError::Malformed(format!("the reply is not JSON ({e}): {}", excerpt(text)))
    })?;
    let output = value
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            LlmError::Malformed(format!(
                "the reply has no `output` list (is this OpenAI's Responses API?): {}",
                excerpt(text)
            ))
        })?;
    let mut reply = Reply::default();
    for item in output {
        reply.item(item)?;
    }
    reply.end(&value)?;
    Ok(reply.finish())
}

/// A reply as its items arrive.
#[derive(Default)]
struct Reply {
    text: Option<String>,
    /// A refusal was said (its text is the reply's).
    refused: bool,
    calls: Vec<ToolCall>,
    reasoning: Vec<Value>,
    usage: Option<Usage>,
    /// `usage.output_tokens_details.reasoning_tokens`, part of the
    /// completion's tokens; for `Usage` once it has a field for them.
    reasoning_tokens: Option<u64>,
    stop: Option<String>,
}

impl Reply {
    fn say(&mut self, text: &str) {
        self.text.get_or_insert_with(String::new).push_str(text);
    }

    /// One whole output item.
    fn item(&mut self, item: &Value) -> Result<(), LlmError> {
        match item["type"].as_str() {
            Some("message") => {
                let content = item["content"].as_array().ok_or_else(|| {
                    malformed("a message item without a content list", &item.to_string())
                })?;
                for part in content {
                    match (part["type"].as_str(), part["text"].as_str(), part["refusal"].as_str()) {
                        (Some("output_text"), Some(text), _) => self.say(text),
                        (Some("refusal"), _, Some(refusal)) => {
                            self.refused = true;
                            self.say(refusal)
                        }
                        _ => {
                            return Err(malformed(
                                "a message part that is neither output_text nor refusal",
                                &part.to_string(),
                            ))
                        }
                    }
                }
            }
            Some("function_call") => self.calls.push(call_of(item)?),
            Some("reasoning") => self.reasoning.extend(reasoning_item(item)?),
            other => {
                return Err(LlmError::Malformed(format!(
                    "the reply has an output item of type {other:?}, which Bindery does not take (a built-in tool?)"
                )))
            }
        }
        Ok(())
    }

    /// The response's status and usage (a whole reply, or the one of
    /// `response.completed` or `response.incomplete`).
    fn end(&mut self, response: &Value) -> Result<(), LlmError> {
        match response["status"].as_str() {
            // A server that says no status answered in full.
            Some("completed") | None => {}
            Some("incomplete") => {
                let reason = response
                    .pointer("/incomplete_details/reason")
                    .and_then(Value::as_str);
                self.stop = Some(
                    match reason {
                        Some("max_output_tokens") => "length",
                        Some("content_filter") => "content_filter",
                        Some(other) => other,
                        None => "incomplete",
                    }
                    .to_owned(),
                );
            }
            Some("failed") => return Err(api_error(response.get("error"), "the response failed")),
            Some(other) => {
                return Err(LlmError::Malformed(format!(
                    "the response ended {other:?}, neither completed nor incomplete"
                )))
            }
        }
        if self.stop.is_none() {
            self.stop = Some(
                if !self.calls.is_empty() {
                    "tool_calls"
                } else if self.refused {
                    "content_filter"
                } else {
                    "stop"
                }
                .to_owned(),
            );
        }
        if let Some(u) = response.get("usage") {
            self.usage = usage(u);
            self.reasoning_tokens = u
                .pointer("/output_tokens_details/reasoning_tokens")
                .and_then(Value::as_u64)
                .map(|n| n.min(Usage::MAX_REPORTED));
        }
        Ok(())
    }

    fn finish(mut self) -> ChatResponse {
        // A call of no arguments sent none: an empty object, as the
        // chat-completions reading gives it.
        for call in &mut self.calls {
            if call.arguments.trim().is_empty() {
                call.arguments = "{}".to_owned();
            }
        }
        let reasoning_tokens = self.reasoning_tokens.unwrap_or(0);
        ChatResponse {
            content: self.text,
            tool_calls: self.calls,
            finish_reason: self.stop,
            usage: self.usage.map(|u| {
                Usage {
                    reasoning_tokens,
                    ..u
                }
                .bounded()
            }),
            reasoning: (!self.reasoning.is_empty()).then(|| Reasoning {
                provider: PROVIDER.to_owned(),
                blocks: self.reasoning,
                endpoint: None,
            }),
            ..ChatResponse::default()
        }
    }
}

/// A `function_call` item as a call: its `call_id` is the call's id.
fn call_of(item: &Value) -> Result<ToolCall, LlmError> {
    let name = item["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| malformed("a function call without a name", &item.to_string()))?;
    Ok(ToolCall {
        id: item["call_id"].as_str().unwrap_or_default().to_owned(),
        name: name.to_owned(),
        arguments: item["arguments"].as_str().unwrap_or("{}").to_owned(),
    })
}

/// A streamed reply, fed each event's `data` in order.
///
/// Text and arguments are gathered from their deltas (forwarded as they
/// come) and checked against their `.done` events; each item's final form
/// is its `response.output_item.done` (the SDK: a reasoning item's
/// `encrypted_content` is only whole there); `response.completed` (or
/// `.incomplete`) gives the status and the usage. Its `response.output`
/// repeats the items: it is read only when no item was streamed (a server
/// that sends the reply whole at the end), so what was forwarded is what
/// is kept.
#[derive(Default)]
pub(crate) struct Stream {
    reply: Reply,
    /// The items started, at their output index: they start at the next
    /// index only, so this grows by one per item the reply's bytes paid
    /// for, never to an index the model names.
    items: Vec<Open>,
    /// The content part being streamed (one at a time, in order).
    part: Option<Part>,
    done: bool,
}

struct Open {
    id: Option<String>,
    kind: Kind,
    done: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A message and how many content parts it started.
    Message { parts: usize },
    /// The call at this position of the reply's calls, and whether its
    /// arguments came (in deltas or in `.done`).
    Call { at: usize, arguments: bool },
    /// A reasoning item and how many content parts it started.
    Reasoning { parts: usize },
}

struct Part {
    output_index: usize,
    content_index: usize,
    kind: PartKind,
    /// Where its text begins in the reply's text.
    start: usize,
    /// Whether deltas came for it.
    deltas: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PartKind {
    Text,
    Refusal,
    /// Reasoning's own text (open-weight models): never the reply's.
    Reasoning,
}

impl Stream {
    /// Whether `response.completed` or `response.incomplete` has arrived.
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
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        let event: Value = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(data)
            ))
        })?;
        let index = event["output_index"].as_u64();
        match event["type"].as_str() {
            Some("response.output_item.added") => self.added(&event, data, on_delta)?,
            Some("response.content_part.added") => {
                let at = self.open(&event, data)?;
                if self.part.is_some() {
                    return Err(malformed(
                        "a content part starts while another is open",
                        data,
                    ));
                }
                let content_index = event["content_index"].as_u64();
                let (kind, parts) = match (&mut self.items[at].kind, event["part"]["type"].as_str())
                {
                    (Kind::Message { parts }, Some("output_text")) => (PartKind::Text, parts),
                    (Kind::Message { parts }, Some("refusal")) => (PartKind::Refusal, parts),
                    (Kind::Reasoning { parts }, Some("reasoning_text")) => {
                        (PartKind::Reasoning, parts)
                    }
                    (kind, part) => {
                        return Err(malformed(
                            &format!("a content part of type {part:?} in a {kind:?} item"),
                            data,
                        ))
                    }
                };
                if content_index != Some(*parts as u64) {
                    return Err(malformed(
                        &format!(
                            "a content part starts at {content_index:?}, where the next is {parts}"
                        ),
                        data,
                    ));
                }
                *parts += 1;
                self.part = Some(Part {
                    output_index: at,
                    content_index: *parts - 1,
                    kind,
                    start: self.reply.text.as_ref().map_or(0, String::len),
                    deltas: false,
                });
            }
            Some(t @ ("response.output_text.delta" | "response.refusal.delta")) => {
                let kind = if t == "response.output_text.delta" {
                    PartKind::Text
                } else {
                    PartKind::Refusal
                };
                let piece = event["delta"]
                    .as_str()
                    .ok_or_else(|| malformed("a delta without its text", data))?;
                self.part_of(&event, kind, data)?.deltas = true;
                self.say(kind, piece, on_delta);
            }
            Some(t @ ("response.output_text.done" | "response.refusal.done")) => {
                let (kind, key) = if t == "response.output_text.done" {
                    (PartKind::Text, "text")
                } else {
                    (PartKind::Refusal, "refusal")
                };
                let whole = event[key]
                    .as_str()
                    .ok_or_else(|| malformed("a part's end without its text", data))?;
                let part = self.part_of(&event, kind, data)?;
                let (start, deltas) = (part.start, part.deltas);
                part.deltas = true;
                if !deltas {
                    self.say(kind, whole, on_delta);
                } else if self.reply.text.as_deref().and_then(|t| t.get(start..)) != Some(whole) {
                    return Err(malformed("a part's end differs from its deltas", data));
                }
            }
            Some("response.content_part.done") => {
                let part = self
                    .part
                    .take()
                    .filter(|p| {
                        index == Some(p.output_index as u64)
                            && event["content_index"].as_u64() == Some(p.content_index as u64)
                    })
                    .ok_or_else(|| malformed("a content part ends that is not open", data))?;
                // A part whose text came only here (no delta, no `.done`).
                if !part.deltas && part.kind != PartKind::Reasoning {
                    let key = if part.kind == PartKind::Text {
                        "text"
                    } else {
                        "refusal"
                    };
                    if let Some(text) = event["part"][key].as_str() {
                        self.say(part.kind, text, on_delta);
                    }
                }
            }
            Some("response.function_call_arguments.delta") => {
                let piece = event["delta"]
                    .as_str()
                    .ok_or_else(|| malformed("a delta without its text", data))?;
                let (item, at) = self.call_of(&event, data)?;
                if let Kind::Call { arguments, .. } = &mut self.items[item].kind {
                    *arguments = true;
                }
                self.reply.calls[at].arguments.push_str(piece);
                if !piece.is_empty() {
                    on_delta(StreamDelta::ToolCallArguments {
                        index: at,
                        fragment: piece.to_owned(),
                    });
                }
            }
            Some("response.function_call_arguments.done") => {
                let whole = event["arguments"]
                    .as_str()
                    .ok_or_else(|| malformed("the arguments' end without them", data))?;
                let (item, _) = self.call_of(&event, data)?;
                self.arguments(item, whole, data, on_delta)?;
            }
            Some(
                "response.reasoning_summary_part.added"
                | "response.reasoning_summary_part.done"
                | "response.reasoning_summary_text.delta"
                | "response.reasoning_summary_text.done"
                | "response.reasoning_text.delta"
                | "response.reasoning_text.done",
            ) => {
                // Kept whole from the item's `.done`; never forwarded.
                let at = self.open(&event, data)?;
                if !matches!(self.items[at].kind, Kind::Reasoning { .. }) {
                    return Err(malformed(
                        "a reasoning event for an item that is not reasoning",
                        data,
                    ));
                }
            }
            Some("response.output_item.done") => self.item_done(&event, data, on_delta)?,
            Some("response.completed" | "response.incomplete") => {
                let response = &event["response"];
                if !response.is_object() {
                    return Err(malformed("the response's end without the response", data));
                }
                if self.items.is_empty() {
                    // Nothing streamed: the reply is all here.
                    if let Some(output) = response["output"].as_array() {
                        for item in output {
                            self.reply.item(item)?;
                        }
                        if let Some(text) = self.reply.text.clone().filter(|t| !t.is_empty()) {
                            on_delta(StreamDelta::Content(text));
                        }
                        for (index, call) in self.reply.calls.iter().enumerate() {
                            on_delta(StreamDelta::ToolCallStarted {
                                index,
                                id: call.id.clone(),
                                name: call.name.clone(),
                            });
                            on_delta(StreamDelta::ToolCallArguments {
                                index,
                                fragment: call.arguments.clone(),
                            });
                        }
                    }
                }
                if let Some(at) = self.items.iter().position(|i| !i.done) {
                    return Err(LlmError::Malformed(format!(
                        "the response ended with output item {at} never done"
                    )));
                }
                self.reply.end(response)?;
                self.done = true;
            }
            Some("response.failed") => {
                return Err(api_error(
                    event.pointer("/response/error"),
                    "the response failed",
                ))
            }
            Some("error") => {
                let error = event
                    .get("error")
                    .filter(|e| e.is_object())
                    .unwrap_or(&event);
                return Err(api_error(Some(error), "the stream reported an error"));
            }
            // `response.created`, `.in_progress`, `.queued`, annotations,
            // and events added after this version: nothing to do.
            _ => {}
        }
        Ok(())
    }

    /// `response.output_item.added`.
    fn added(
        &mut self,
        event: &Value,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let next = self.items.len();
        let index = event["output_index"].as_u64();
        if index != Some(next as u64) {
            return Err(malformed(
                &format!("an item starts at output index {index:?}, where the next is {next}"),
                data,
            ));
        }
        let item = &event["item"];
        let kind = match item["type"].as_str() {
            Some("message") => Kind::Message { parts: 0 },
            Some("reasoning") => Kind::Reasoning { parts: 0 },
            Some("function_call") => {
                let call = call_of(item)?;
                let at = self.reply.calls.len();
                on_delta(StreamDelta::ToolCallStarted {
                    index: at,
                    id: call.id.clone(),
                    name: call.name.clone(),
                });
                let arguments = item["arguments"].as_str().unwrap_or_default();
                if !arguments.is_empty() {
                    on_delta(StreamDelta::ToolCallArguments {
                        index: at,
                        fragment: arguments.to_owned(),
                    });
                }
                self.reply.calls.push(ToolCall {
                    arguments: arguments.to_owned(),
                    ..call
                });
                Kind::Call {
                    at,
                    arguments: !arguments.is_empty(),
                }
            }
            other => {
                return Err(malformed(
                    &format!("an output item of type {other:?}, which Bindery does not take (a built-in tool?)"),
                    data,
                ))
            }
        };
        self.items.push(Open {
            id: item["id"].as_str().map(str::to_owned),
            kind,
            done: false,
        });
        Ok(())
    }

    /// `response.output_item.done`: the item's final form.
    fn item_done(
        &mut self,
        event: &Value,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let at = self.open(event, data)?;
        if self.part.as_ref().is_some_and(|p| p.output_index == at) {
            return Err(malformed("an item is done with a content part open", data));
        }
        let item = &event["item"];
        let open = &self.items[at];
        if let (Some(id), Some(done)) = (open.id.as_deref(), item["id"].as_str()) {
            if id != done {
                return Err(malformed(
                    "an item is done with another id than it began with",
                    data,
                ));
            }
        }
        match (open.kind, item["type"].as_str()) {
            (Kind::Message { parts: 0 }, Some("message")) => {
                // Its text came only here.
                let before = self.reply.text.as_ref().map_or(0, String::len);
                self.reply.item(item)?;
                if let Some(text) = self.reply.text.as_deref().and_then(|t| t.get(before..)) {
                    if !text.is_empty() {
                        on_delta(StreamDelta::Content(text.to_owned()));
                    }
                }
            }
            (Kind::Message { .. }, Some("message")) => {}
            (Kind::Reasoning { .. }, Some("reasoning")) => {
                self.reply.reasoning.extend(reasoning_item(item)?);
            }
            (
                Kind::Call {
                    at: call,
                    arguments,
                },
                Some("function_call"),
            ) => {
                let done = call_of(item)?;
                let started = &self.reply.calls[call];
                if done.name != started.name || (!started.id.is_empty() && done.id != started.id) {
                    return Err(malformed(
                        "a call is done with another name or id than it began with",
                        data,
                    ));
                }
                if started.id.is_empty() {
                    self.reply.calls[call].id = done.id;
                }
                match item["arguments"].as_str() {
                    Some(whole) => self.arguments(at, whole, data, on_delta)?,
                    None if !arguments => self.arguments(at, "{}", data, on_delta)?,
                    None => {}
                }
            }
            (kind, other) => {
                return Err(malformed(
                    &format!("a {kind:?} item is done as one of type {other:?}"),
                    data,
                ))
            }
        }
        self.items[at].done = true;
        Ok(())
    }

    /// The position of the open (started, not done) item an event names by
    /// `output_index` (and `item_id`, when both are known).
    fn open(&self, event: &Value, data: &str) -> Result<usize, LlmError> {
        let at = event["output_index"]
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| self.items.get(i).is_some_and(|o| !o.done))
            .ok_or_else(|| malformed("an event for an item that is not open", data))?;
        if let (Some(id), Some(named)) = (self.items[at].id.as_deref(), event["item_id"].as_str()) {
            if id != named {
                return Err(malformed(
                    "an event names another item than its output index",
                    data,
                ));
            }
        }
        Ok(at)
    }

    /// The open content part an event of `kind` is for.
    fn part_of(
        &mut self,
        event: &Value,
        kind: PartKind,
        data: &str,
    ) -> Result<&mut Part, LlmError> {
        let at = self.open(event, data)?;
        self.part
            .as_mut()
            .filter(|p| {
                p.output_index == at
                    && event["content_index"].as_u64() == Some(p.content_index as u64)
                    && p.kind == kind
            })
            .ok_or_else(|| {
                malformed(
                    "a delta for a part that is not open, or of another kind",
                    data,
                )
            })
    }

    /// The open call item an event is for: its output index, and its
    /// position among the reply's calls.
    fn call_of(&self, event: &Value, data: &str) -> Result<(usize, usize), LlmError> {
        let item = self.open(event, data)?;
        match self.items[item].kind {
            Kind::Call { at, .. } => Ok((item, at)),
            _ => Err(malformed("arguments for an item that is not a call", data)),
        }
    }

    /// The whole arguments of the call item at output index `item`: taken
    /// (and forwarded) when none came before, else checked against what
    /// came.
    fn arguments(
        &mut self,
        item: usize,
        whole: &str,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let Some(Open {
            kind: Kind::Call { at, arguments },
            ..
        }) = self.items.get_mut(item)
        else {
            return Err(malformed("arguments for an item that is not a call", data));
        };
        let call = self
            .reply
            .calls
            .get_mut(*at)
            .ok_or_else(|| malformed("arguments for a call that did not start", data))?;
        if !*arguments {
            call.arguments.push_str(whole);
            if !whole.is_empty() {
                on_delta(StreamDelta::ToolCallArguments {
                    index: *at,
                    fragment: whole.to_owned(),
                });
            }
        } else if call.arguments != whole {
            return Err(malformed(
                "a call's arguments differ from their deltas",
                data,
            ));
        }
        *arguments = true;
        Ok(())
    }

    /// Text of a part: the reply's (forwarded) unless it is reasoning.
    fn say(&mut self, kind: PartKind, text: &str, on_delta: &mut (dyn FnMut(StreamDelta) + Send)) {
        match kind {
            PartKind::Reasoning => {}
            PartKind::Text | PartKind::Refusal => {
                self.reply.refused |= kind == PartKind::Refusal;
                self.reply.say(text);
                if !text.is_empty() {
                    on_delta(StreamDelta::Content(text.to_owned()));
                }
            }
        }
    }

    /// The reply, once the stream ended.
    pub fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.done {
            return Err(LlmError::Malformed(
                "the stream ended before `response.completed` (or `.incomplete`)".to_owned(),
            ));
        }
        Ok(self.reply.finish())
    }
}

fn malformed(what: &str, data: &str) -> LlmError {
    LlmError::Malformed(format!("{what}: {}", excerpt(data)))
}

#[cfg(test)]
mod tests;
