//! Google's Gemini API (`generateContent`): the request a conversation
//! becomes, and the reply, whole or streamed, read back into the one
//! [`ChatResponse`].
//!
//! What it takes care of, that a compatibility layer gets wrong:
//! - the system prompt goes in `systemInstruction`; the conversation in
//!   `contents` of roles `user` and `model`; each tool result is a
//!   `functionResponse` part (named as its call, `{"output": text}`) of
//!   the `user` turn after the call, the results of one turn's parallel
//!   calls in one turn, media as `inlineData` parts after them;
//! - thought signatures: a model turn that carried any (or a thought, or
//!   Gemini's own call ids) is kept whole, its parts as Gemini sent them,
//!   as the assistant message's [`Reasoning`], and goes back in the next
//!   requests part for part, each signature on the part it came on; a
//!   turn of calls Gemini did not sign (another provider's, a fallback's)
//!   goes with the documented sentinel on its first call, which Gemini 3
//!   requires there;
//! - thoughts (`thought: true` parts) are never the reply's text;
//! - calls without an id (Gemini gives none on most models) get one of
//!   ours, stable for the reply, which never goes back on the wire: a
//!   result goes back with the id its call had from Gemini, if any;
//! - tools with their whole JSON Schema (`parametersJsonSchema`, not the
//!   OpenAPI subset `parameters`), names checked against Gemini's rule;
//! - usage with the cache's reads, thoughts billed as output, and a
//!   blocked prompt an error, not an empty reply.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::content::{Content, ContentPart};
use super::conversation::tool_media;
use super::error::{excerpt, LlmError};
use super::types::{ChatMessage, ChatResponse, ModelEndpoint, Reasoning, StreamDelta};
use super::types::{ToolCall, ToolDefinition, Usage};

/// The provider's name on [`Reasoning`].
pub(crate) const PROVIDER: &str = "gemini";

/// The signature Gemini documents for a call it did not make itself
/// (another provider's turn, history written by hand): Gemini 3 refuses a
/// turn's first call without a signature, and takes this one instead.
const FOREIGN_SIGNATURE: &str = "skip_thought_signature_validator";

/// The longest tool name Gemini takes.
const MAX_NAME: usize = 64;

/// The path after the endpoint's base URL (`…/v1beta`):
/// `/models/{model}:generateContent`, or
/// `/models/{model}:streamGenerateContent?alt=sse` when streamed. The
/// model is one path segment, percent-encoded (`models/` before it, as
/// Google spells full names, is taken off).
pub(crate) fn path(endpoint: &ModelEndpoint, stream: bool) -> Result<String, LlmError> {
    let model = endpoint.model.as_str();
    let name = model.strip_prefix("models/").unwrap_or(model);
    if matches!(name, "" | "." | "..") || name.contains('/') || name.chars().any(char::is_control) {
        return Err(LlmError::Config(format!(
            "model {:?}: a Gemini model name is one path segment (`gemini-2.5-flash`, or `models/gemini-2.5-flash`)",
            endpoint.model
        )));
    }
    let mut segment = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            segment.push(b as char);
        } else {
            segment.push_str(&format!("%{b:02X}"));
        }
    }
    let method = if stream {
        "streamGenerateContent?alt=sse"
    } else {
        "generateContent"
    };
    Ok(format!("/models/{segment}:{method}"))
}

/// The request body for the conversation `history` (the same for a
/// streamed request: the path says it).
pub(crate) fn body<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage> + Clone,
    offered: &[ToolDefinition],
    endpoint: &ModelEndpoint,
    _stream: bool,
) -> Result<Bytes, LlmError> {
    let (system, contents) = contents(history)?;
    let mut body = Map::new();
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    body.insert("contents".into(), Value::Array(contents));
    if !offered.is_empty() {
        body.insert("tools".into(), Value::Array(tools(offered)?));
    }
    let mut config = Map::new();
    if let Some(n) = endpoint.max_tokens {
        config.insert("maxOutputTokens".into(), json!(n));
    }
    if let Some(budget) = endpoint.thinking_budget {
        // No `includeThoughts`: the summaries of the thoughts would be
        // bytes of the reply no one is shown (they are never the reply's
        // text) and the store keeps; the signatures come without them.
        config.insert("thinkingConfig".into(), json!({"thinkingBudget": budget}));
    }
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    serde_json::to_vec(&Value::Object(body))
        .map(Bytes::from)
        .map_err(|e| LlmError::Config(format!("cannot encode the request: {e}")))
}

/// The `tools` array as sent: one tool of every function declaration,
/// each with its JSON Schema whole in `parametersJsonSchema` (`parameters`
/// takes an OpenAPI subset only, and would lose what it lacks).
pub(crate) fn tools(tools: &[ToolDefinition]) -> Result<Vec<Value>, LlmError> {
    let mut declarations = Vec::with_capacity(tools.len());
    for t in tools {
        if !valid_name(&t.name) {
            return Err(LlmError::Config(format!(
                "tool `{}`: Gemini takes tool names of 1 to {MAX_NAME} letters, digits, `_`, `.`, `:` and `-`, beginning with a letter or `_`; rename it (a toolbox's `as`, or its prefix)",
                t.name
            )));
        }
        let mut schema = t.parameters.clone();
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        let mut declaration = json!({"name": t.name, "parametersJsonSchema": schema});
        if !t.description.is_empty() {
            declaration["description"] = json!(t.description);
        }
        declarations.push(declaration);
    }
    Ok(vec![json!({ "functionDeclarations": declarations })])
}

/// Gemini's rule for a function's name: a letter or `_`, then letters,
/// digits, `_`, `.`, `:` and `-`; at most 64 in all.
fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && name.len() <= MAX_NAME
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// What a result needs of the call it answers: the call's name, and the
/// id Gemini gave it (sent back only then).
struct Answered {
    name: String,
    id: Option<String>,
}

/// The system instruction's parts and the contents.
fn contents<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage>,
) -> Result<(Vec<Value>, Vec<Value>), LlmError> {
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    // The user turn being gathered: function responses first, then text
    // and media.
    let mut results: Vec<Value> = Vec::new();
    let mut user: Vec<Value> = Vec::new();
    // The calls of the last model turn, by their ids: what a result
    // answers.
    let mut calls: std::collections::HashMap<String, Answered> = Default::default();
    let flush = |out: &mut Vec<Value>, results: &mut Vec<Value>, user: &mut Vec<Value>| {
        if results.is_empty() && user.is_empty() {
            return;
        }
        let mut parts = std::mem::take(results);
        parts.append(user);
        out.push(json!({"role": "user", "parts": parts}));
    };
    for (i, message) in history.into_iter().enumerate() {
        match message {
            // The prompt the agent puts first is the system instruction;
            // one later in the conversation (a turn has no such role) is
            // said to the model as the user's, marked.
            ChatMessage::System { content } if out.is_empty() && user.is_empty() => {
                system.push(json!({ "text": content }));
            }
            ChatMessage::System { content } => {
                user.push(json!({"text": format!("[system] {content}")}));
            }
            ChatMessage::User { content } => user.extend(parts(content)?),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                let (text, media) = if content.has_media() {
                    tool_media(tool_call_id, content)
                } else {
                    (content.text().into_owned(), Vec::new())
                };
                match calls.get(tool_call_id) {
                    Some(call) => {
                        let mut response = json!({
                            "name": call.name,
                            "response": {"output": text},
                        });
                        if let Some(id) = &call.id {
                            response["id"] = json!(id);
                        }
                        results.push(json!({ "functionResponse": response }));
                    }
                    // A result of no call of the turn before (a history
                    // cut short): Gemini takes a function response only
                    // as the answer to a call of the turn before it, so
                    // it is said as text.
                    None => user.push(json!({
                        "text": format!("[output of tool call {tool_call_id}]\n{text}")
                    })),
                }
                user.extend(parts(&Content::Parts(media))?);
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                flush(&mut out, &mut results, &mut user);
                calls.clear();
                let kept = reasoning
                    .as_ref()
                    .filter(|r| r.provider == PROVIDER)
                    .and_then(|r| restored(&r.blocks, content.as_deref(), tool_calls));
                let turn = match kept {
                    Some((blocks, ids)) => {
                        for (call, id) in tool_calls.iter().zip(ids) {
                            calls.insert(
                                call.id.clone(),
                                Answered {
                                    name: call.name.clone(),
                                    id,
                                },
                            );
                        }
                        blocks
                    }
                    None => {
                        if reasoning.as_ref().is_some_and(|r| r.provider == PROVIDER) {
                            tracing::debug!(
                                message = i,
                                "a Gemini turn's parts no longer match its text and calls; sent without its signatures"
                            );
                        }
                        let mut turn = Vec::new();
                        if let Some(text) = content.as_deref().filter(|t| !t.trim().is_empty()) {
                            turn.push(json!({ "text": text }));
                        }
                        for (n, call) in tool_calls.iter().enumerate() {
                            let mut part = json!({"functionCall": {
                                "name": call.name,
                                "args": input_of(call),
                            }});
                            if n == 0 {
                                part["thoughtSignature"] = json!(FOREIGN_SIGNATURE);
                            }
                            turn.push(part);
                            calls.insert(
                                call.id.clone(),
                                Answered {
                                    name: call.name.clone(),
                                    id: None,
                                },
                            );
                        }
                        turn
                    }
                };
                if turn.is_empty() {
                    // An empty turn is refused; nothing was said.
                    tracing::debug!(message = i, "an empty model turn left out");
                    continue;
                }
                out.push(json!({"role": "model", "parts": turn}));
            }
        }
    }
    flush(&mut out, &mut results, &mut user);
    Ok((system, out))
}

/// The parts Gemini sent for a turn, to send back as they were, and the
/// id Gemini gave each call: when they still say what the message says
/// (the same text, the same calls in the same order), else `None` (the
/// message was changed since, and its parts would say something else).
fn restored(
    blocks: &[Value],
    content: Option<&str>,
    tool_calls: &[ToolCall],
) -> Option<(Vec<Value>, Vec<Option<String>>)> {
    let mut text = String::new();
    let mut ids = Vec::new();
    for block in blocks {
        let part = block.as_object()?;
        if let Some(call) = part.get("functionCall") {
            let ours = tool_calls.get(ids.len())?;
            let args = match call.get("args") {
                None | Some(Value::Null) => json!({}),
                Some(args) => args.clone(),
            };
            if call.get("name")?.as_str()? != ours.name || Some(args) != ours.parse_arguments().ok()
            {
                return None;
            }
            ids.push(call.get("id").and_then(Value::as_str).map(str::to_owned));
        } else if part.get("thought") != Some(&Value::Bool(true)) {
            if let Some(t) = part.get("text") {
                text.push_str(t.as_str()?);
            }
        }
    }
    (ids.len() == tool_calls.len() && text == content.unwrap_or_default())
        .then(|| (blocks.to_vec(), ids))
}

/// A call's arguments as the object `args` must be: the model's JSON when
/// it is an object, else the raw text under `arguments` (a call made by
/// another provider's model that sent no object).
fn input_of(call: &ToolCall) -> Value {
    match call.parse_arguments() {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"arguments": call.arguments}),
    }
}

/// A user or tool content as parts: text, and media as `inlineData`.
fn parts(content: &Content) -> Result<Vec<Value>, LlmError> {
    let items = match content {
        Content::Text(t) => return Ok(vec![json!({ "text": t })]),
        Content::Parts(items) => items,
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(match item {
            ContentPart::Text { text } => json!({ "text": text }),
            ContentPart::ImageUrl { image_url } => inline(&image_url.url)?,
            ContentPart::File { file } => inline(&file.file_data)?,
        });
    }
    Ok(out)
}

/// A `data:<mime>;base64,<data>` URL as an `inlineData` part.
fn inline(url: &str) -> Result<Value, LlmError> {
    let (mime, data) = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .filter(|(mime, _)| !mime.is_empty())
        .ok_or_else(|| LlmError::Config("a medium is not a base64 data URL".to_owned()))?;
    Ok(json!({"inlineData": {"mimeType": mime, "data": data}}))
}

/// Gemini's finish reasons in the words the rest of Bindery reads; the
/// others (`SAFETY`, `RECITATION`, `MALFORMED_FUNCTION_CALL`…) as Gemini
/// says them.
fn finish_reason(reason: &str, calls: bool) -> String {
    match reason {
        // Gemini stops a turn of calls with STOP.
        "STOP" if calls => "tool_calls",
        "STOP" => "stop",
        "MAX_TOKENS" => "length",
        other => other,
    }
    .to_owned()
}

/// `usageMetadata` read. The prompt's count includes the cache's reads
/// (and the server tools' prompts, counted apart); the thoughts are
/// billed as output, so they are in the completion's count.
fn usage(value: &Value) -> Usage {
    let n = |k: &str| value.get(k).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        prompt_tokens: n("promptTokenCount").saturating_add(n("toolUsePromptTokenCount")),
        completion_tokens: n("candidatesTokenCount").saturating_add(n("thoughtsTokenCount")),
        total_tokens: 0,
        cache_read_tokens: n("cachedContentTokenCount"),
        cache_write_tokens: 0,
        reasoning_tokens: n("thoughtsTokenCount"),
    }
    .bounded()
}

/// An error Google sent as the reply (`{"error": {"code", "message",
/// "status"}}`), as the status it names would have been.
fn error_of(value: &Value, text: &str) -> Option<LlmError> {
    let error = value.get("error").filter(|e| e.is_object())?;
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .filter(|c| (400..=599).contains(c))
        .map_or(500, |c| c as u16);
    Some(LlmError::Http {
        status,
        body: excerpt(text),
    })
}

/// The error of a prompt Gemini blocked (`promptFeedback.blockReason`,
/// and no candidate), if that is what `value` says.
fn blocked(value: &Value) -> Option<LlmError> {
    let feedback = value.get("promptFeedback")?;
    let reason = feedback.get("blockReason")?.as_str()?;
    let message = feedback
        .get("blockReasonMessage")
        .and_then(Value::as_str)
        .map(|m| format!(": {}", excerpt(m)))
        .unwrap_or_default();
    Some(LlmError::Malformed(format!(
        "Gemini blocked the prompt ({reason}) and gave no reply{message}"
    )))
}

/// The candidate Bindery asked for (the first; Bindery never asks for
/// more), `None` when the value has none.
fn candidate(value: &mut Value, text: &str) -> Result<Option<Value>, LlmError> {
    match value.get_mut("candidates") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(all)) => Ok(all
            .iter_mut()
            .find(|c| c.get("index").is_none_or(|i| i.as_u64() == Some(0)))
            .map(Value::take)),
        Some(_) => Err(malformed("`candidates` is not a list", text)),
    }
}

/// A candidate's parts and its finish reason.
fn parts_of(candidate: &mut Value, text: &str) -> Result<(Vec<Value>, Option<String>), LlmError> {
    let finish = match candidate.get("finishReason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(malformed("a `finishReason` that is not text", text)),
    };
    let parts = match candidate.get_mut("content").map(Value::take) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(mut content)) => match content.remove("parts") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(parts)) => parts,
            Some(_) => return Err(malformed("a candidate's `parts` is not a list", text)),
        },
        Some(_) => return Err(malformed("a candidate's `content` is not an object", text)),
    };
    Ok((parts, finish))
}

/// A whole (not streamed) reply.
pub(crate) fn parse(text: &str) -> Result<ChatResponse, LlmError> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| {
        LlmError::Malformed(format!("the reply is not JSON ({e}): {}", excerpt(text)))
    })?;
    if let Some(e) = error_of(&value, text) {
        return Err(e);
    }
    let Some(mut candidate) = candidate(&mut value, text)? else {
        return Err(blocked(&value).unwrap_or_else(|| {
            malformed(
                "the reply has no candidate (is this Gemini's generateContent?)",
                text,
            )
        }));
    };
    let (parts, finish) = parts_of(&mut candidate, text)?;
    let mut reply = Reply {
        response_id: value
            .get("responseId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..Reply::default()
    };
    for part in parts {
        reply.part(part, false, &mut |_| {})?;
    }
    reply.stop = finish;
    reply.usage = value.get("usageMetadata").map(usage);
    Ok(reply.finish())
}

/// A reply as its parts arrive.
#[derive(Default)]
struct Reply {
    text: String,
    calls: Vec<ToolCall>,
    /// The parts as Gemini sent them (a streamed text's pieces, but for
    /// signed ones, in one part).
    parts: Vec<Value>,
    /// Whether a part is one Gemini needs back as it was: a thought, a
    /// signature, a call's id of Gemini's.
    keep: bool,
    response_id: String,
    usage: Option<Usage>,
    stop: Option<String>,
}

/// The kinds of part Gemini may send; only text and calls are taken.
const KINDS: [&str; 9] = [
    "text",
    "functionCall",
    "functionResponse",
    "inlineData",
    "fileData",
    "executableCode",
    "codeExecutionResult",
    "toolCall",
    "toolResponse",
];

impl Reply {
    /// One part of the candidate: its text or its call forwarded, the
    /// part kept. Streamed (`merge`), a piece of plain text goes onto the
    /// plain text before it (never onto a signed part, nor a thought onto
    /// text).
    fn part(
        &mut self,
        part: Value,
        merge: bool,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        let Value::Object(fields) = &part else {
            return Err(LlmError::Malformed(format!(
                "a part that is not an object: {}",
                excerpt(&part.to_string())
            )));
        };
        let what = |problem: &str| {
            LlmError::Malformed(format!("{problem}: {}", excerpt(&part.to_string())))
        };
        let thought = match fields.get("thought") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(what("a part's `thought` is not true or false")),
        };
        match fields.get("thoughtSignature") {
            None | Some(Value::Null) => {}
            Some(Value::String(_)) => self.keep = true,
            Some(_) => return Err(what("a `thoughtSignature` that is not text")),
        }
        self.keep |= thought;
        let kinds: Vec<&str> = KINDS
            .iter()
            .copied()
            .filter(|k| fields.get(*k).is_some_and(|v| !v.is_null()))
            .collect();
        match kinds.as_slice() {
            ["text"] => {
                let Some(text) = fields["text"].as_str() else {
                    return Err(what("a part's `text` is not text"));
                };
                // A thought is kept, never forwarded as the reply.
                if !thought {
                    self.text.push_str(text);
                    if !text.is_empty() {
                        on_delta(StreamDelta::Content(text.to_owned()));
                    }
                }
                if merge && plain(fields) {
                    if let Some(Value::Object(last)) = self.parts.last_mut() {
                        if plain(last) && last.get("thought") == fields.get("thought") {
                            if let Some(Value::String(before)) = last.get_mut("text") {
                                // In place: a long text streamed in many
                                // pieces is copied once per growth.
                                before.push_str(text);
                                return Ok(());
                            }
                        }
                    }
                }
            }
            ["functionCall"] => {
                if thought {
                    return Err(what("a function call marked as a thought"));
                }
                let call = fields["functionCall"]
                    .as_object()
                    .ok_or_else(|| what("a `functionCall` that is not an object"))?;
                if call.contains_key("partialArgs") || call.contains_key("willContinue") {
                    return Err(what(
                        "a function call streamed in pieces, which Bindery does not ask for",
                    ));
                }
                let name = match call.get("name") {
                    Some(Value::String(n)) if !n.is_empty() => n.clone(),
                    _ => return Err(what("a function call without a name")),
                };
                let arguments = match call.get("args") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(args @ Value::Object(_)) => args.to_string(),
                    Some(_) => return Err(what("a function call's `args` is not an object")),
                };
                let index = self.calls.len();
                let id = match call.get("id") {
                    Some(Value::String(id)) if !id.is_empty() => {
                        self.keep = true;
                        id.clone()
                    }
                    None | Some(Value::Null | Value::String(_)) => {
                        made_id(&self.response_id, index, &name, &arguments)
                    }
                    Some(_) => return Err(what("a function call's `id` is not text")),
                };
                on_delta(StreamDelta::ToolCallStarted {
                    index,
                    id: id.clone(),
                    name: name.clone(),
                });
                on_delta(StreamDelta::ToolCallArguments {
                    index,
                    fragment: arguments.clone(),
                });
                self.calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
            // A signature alone (streamed after the text it signs).
            [] if fields
                .keys()
                .all(|k| k == "thought" || k == "thoughtSignature") => {}
            [] => return Err(what("a part of no kind Bindery knows")),
            [kind] => {
                return Err(what(&format!(
                "a `{kind}` part, which Bindery does not take (a server tool, or generated media?)"
            )))
            }
            _ => return Err(what("a part of more than one kind")),
        }
        self.parts.push(part);
        Ok(())
    }

    fn finish(self) -> ChatResponse {
        let calls = !self.calls.is_empty();
        ChatResponse {
            content: (!self.text.is_empty()).then_some(self.text),
            tool_calls: self.calls,
            finish_reason: self.stop.map(|s| finish_reason(&s, calls)),
            usage: self.usage,
            reasoning: self.keep.then(|| Reasoning {
                provider: PROVIDER.to_owned(),
                blocks: self.parts,
                endpoint: None,
            }),
            ..ChatResponse::default()
        }
    }
}

/// Whether a part is text and nothing else (no signature): one a streamed
/// piece may be put onto.
fn plain(part: &Map<String, Value>) -> bool {
    part.keys().all(|k| k == "text" || k == "thought")
}

/// The id of the call at `index` of a reply when Gemini gave none: the
/// same for the same call of the same reply (FNV-1a of the reply's id, the
/// name and the arguments), and its position in it.
fn made_id(response_id: &str, index: usize, name: &str, arguments: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = response_id
        .bytes()
        .chain([0])
        .chain(name.bytes())
        .chain([0])
        .chain(arguments.bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("call_{index}_{h:016x}")
}

/// A streamed reply, fed each event's `data` (one `GenerateContentResponse`
/// each) in order.
#[derive(Default)]
pub(crate) struct Stream {
    reply: Reply,
    /// Whether a chunk gave the candidate's finish reason.
    finished: bool,
}

impl Stream {
    /// Never: Gemini sends no event after the last, its stream ends with
    /// the body (and a chunk after the finish may still carry the usage).
    /// [`Stream::finish`] says whether the reply came whole.
    pub fn is_done(&self) -> bool {
        false
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
        let mut value: Value = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(data)
            ))
        })?;
        if let Some(e) = error_of(&value, data) {
            return Err(e);
        }
        if !value.is_object() {
            return Err(malformed("a stream event that is not an object", data));
        }
        if let Some(u) = value.get("usageMetadata") {
            // Each chunk's counts are the reply's so far.
            self.reply.usage = Some(usage(u));
        }
        if self.reply.response_id.is_empty() {
            if let Some(id) = value.get("responseId").and_then(Value::as_str) {
                self.reply.response_id = id.to_owned();
            }
        }
        let Some(mut candidate) = candidate(&mut value, data)? else {
            // A blocked prompt comes as a chunk of no candidate; another
            // such chunk carries the usage only.
            return match blocked(&value) {
                Some(e) => Err(e),
                None => Ok(()),
            };
        };
        let (parts, finish) = parts_of(&mut candidate, data)?;
        if self.finished && !parts.is_empty() {
            return Err(malformed("parts after the candidate finished", data));
        }
        for part in parts {
            self.reply.part(part, true, on_delta)?;
        }
        if let Some(reason) = finish {
            self.reply.stop = Some(reason);
            self.finished = true;
        }
        Ok(())
    }

    /// The reply, once the stream ended.
    pub fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.finished {
            return Err(LlmError::Malformed(
                "the stream ended before Gemini said why the reply stopped (`finishReason`)"
                    .to_owned(),
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
