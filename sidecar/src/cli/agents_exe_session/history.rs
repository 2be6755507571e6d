//! `run --session-file`: Bindery's conversation and agents-exe's session
//! document, each made from the other.
//!
//! Reading, a session's turns (newest first) become the messages a run
//! goes on from, oldest first: a UserTurn's query a user message, its
//! `userToolResponses` tool messages, an LlmTurn an assistant message
//! with its calls. Writing, a run's new messages become turns put on top
//! of the file's own, which are kept as they were stored; the document
//! is shaped as agents-exe's `ToJSON` writes it (`Session/Types.hs`).

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::model::{self, Part, Session, ToolResponse, TurnKind, UserTurn};
use bindery_llm::{ChatMessage, Content, ContentPart, ToolCall, ToolDefinition};

/// What a call the file never answered is answered with, so the
/// conversation stays one a model takes (each call has its result).
pub const UNANSWERED: &str =
    "error: no result was recorded for this call (the session file ends before it was answered)";

/// A session as a run goes on from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// Oldest first.
    pub messages: Vec<ChatMessage>,
    /// How many of `messages` the file's turns hold; the rest (results
    /// for its newest step's calls, never answered) are the run's, to
    /// be written with its turns.
    pub carried: usize,
}

/// The conversation of `s`.
pub fn history_of(s: &Session) -> Resumed {
    let mut out = Vec::new();
    // The calls of the last LlmTurn not answered yet, in order.
    let mut open: Vec<String> = Vec::new();
    for turn in s.turns.iter().rev() {
        match &turn.kind {
            TurnKind::User(u) | TurnKind::Partial { user: u, .. } => user(&mut out, &mut open, u),
            TurnKind::Llm(l) => {
                close(&mut out, &mut open);
                let calls: Vec<ToolCall> = l.calls.iter().map(tool_call).collect();
                open = calls.iter().map(|c| c.id.clone()).collect();
                let content = match (&l.text, calls.is_empty()) {
                    (None, true) => Some(String::new()),
                    (text, _) => text.clone(),
                };
                out.push(ChatMessage::Assistant {
                    content,
                    tool_calls: calls,
                    reasoning: None,
                });
            }
        }
    }
    let carried = out.len();
    close(&mut out, &mut open);
    Resumed {
        messages: out,
        carried,
    }
}

/// A UserTurn: its results (answering the LlmTurn before it), then its query.
fn user(out: &mut Vec<ChatMessage>, open: &mut Vec<String>, u: &UserTurn) {
    for (call, response) in &u.responses {
        let Some(id) = call.get("id").and_then(Value::as_str) else {
            continue;
        };
        // A result for no call of the step before is left out: a model
        // refuses a result that answers nothing.
        let Some(at) = open.iter().position(|o| o == id) else {
            continue;
        };
        open.remove(at);
        out.push(ChatMessage::Tool {
            tool_call_id: id.to_string(),
            content: Content::Text(response_text(response)),
        });
    }
    if let Some(q) = &u.query {
        close(out, open);
        out.push(ChatMessage::user(q.clone()));
    }
}

/// Each call still open answered with [`UNANSWERED`].
fn close(out: &mut Vec<ChatMessage>, open: &mut Vec<String>) {
    for id in open.drain(..) {
        out.push(ChatMessage::tool_result(&id, UNANSWERED));
    }
}

/// A stored call object as Bindery's call: `arguments` kept as the text
/// the model sent (agents-exe stores a JSON string; another value is
/// written out as JSON).
fn tool_call(c: &Value) -> ToolCall {
    let arguments = match c.get("function").and_then(|f| f.get("arguments")) {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => "{}".to_string(),
        Some(other) => other.to_string(),
    };
    ToolCall {
        id: c
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        name: model::call_name(c).unwrap_or_default().to_string(),
        arguments,
    }
}

/// What a model is sent of a stored result. The file's reading keeps no
/// media bytes, so media is named, not sent again.
fn response_text(r: &ToolResponse) -> String {
    let media = |m: &model::Media| {
        format!(
            "[{} media ({} base64 characters) from the session file, not sent again]",
            m.mime, m.base64_len
        )
    };
    match r {
        ToolResponse::Text(t) => t.clone(),
        ToolResponse::Json(v) => v.to_string(),
        ToolResponse::Media(m) => media(m),
        ToolResponse::Mixed(parts) => parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Media(m) => media(m),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// A message a run added, with the tools on offer once it was (those the
/// next request offers: what the UserTurn it is part of records).
#[derive(Debug, Clone)]
pub struct Added {
    pub message: ChatMessage,
    pub tools: Arc<Vec<ToolDefinition>>,
}

/// The session document: `prior`'s (the file's, as stored) with the turns
/// of `new` (the run's messages, oldest first) on top, each UserTurn with
/// the system prompt `prompt`; `turnId` the newest step's. A new session
/// takes `session_id`.
pub fn session_doc(
    prior: Option<&Value>,
    new: &[Added],
    prompt: &str,
    session_id: &str,
    turn_id: &str,
) -> Value {
    let mut doc = match prior {
        Some(Value::Object(o)) => o.clone(),
        _ => Map::new(),
    };
    let old = match doc.remove("turns") {
        Some(Value::Array(t)) => t,
        _ => Vec::new(),
    };
    let mut turns = turns_of(new, prompt);
    turns.reverse();
    turns.extend(old);
    doc.insert("turns".into(), Value::Array(turns));
    if !doc.get("sessionId").is_some_and(Value::is_string) {
        doc.insert("sessionId".into(), json!(session_id));
        doc.insert("sessionVersion".into(), json!(1));
    }
    doc.entry("forkedFromSessionId").or_insert(Value::Null);
    doc.insert("turnId".into(), json!(turn_id));
    Value::Object(doc)
}

/// A UserTurn in the making.
#[derive(Default)]
struct PendingUser {
    text: Option<String>,
    media: Vec<Value>,
    responses: Vec<Value>,
    tools: Arc<Vec<ToolDefinition>>,
}

/// The turns of `messages`, oldest first: a UserTurn before each LlmTurn
/// (and one at the end for results not yet sent to the model).
fn turns_of(messages: &[Added], prompt: &str) -> Vec<Value> {
    let mut turns = Vec::new();
    let mut pending: Option<PendingUser> = None;
    // The call objects of the last LlmTurn, which its results pair with.
    let mut calls: Vec<Value> = Vec::new();
    let flush = |pending: &mut Option<PendingUser>, turns: &mut Vec<Value>| {
        if let Some(u) = pending.take() {
            turns.push(user_turn(prompt, u));
        }
    };
    for Added { message, tools } in messages {
        if !matches!(
            message,
            ChatMessage::Assistant { .. } | ChatMessage::System { .. }
        ) {
            pending.get_or_insert_with(Default::default).tools = tools.clone();
        }
        match message {
            ChatMessage::System { .. } => {}
            ChatMessage::User { content } => {
                let u = pending.get_or_insert_with(Default::default);
                let text = content.text();
                u.text = Some(match u.text.take() {
                    Some(before) => format!("{before}\n{text}"),
                    None => text.into_owned(),
                });
                if let Content::Parts(parts) = content {
                    u.media.extend(parts.iter().filter_map(attachment));
                }
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                let call = calls
                    .iter()
                    .find(|c| c.get("id").and_then(Value::as_str) == Some(tool_call_id))
                    .cloned()
                    .unwrap_or_else(|| {
                        call_json(
                            0,
                            &ToolCall {
                                id: tool_call_id.clone(),
                                name: String::new(),
                                arguments: String::new(),
                            },
                        )
                    });
                pending
                    .get_or_insert_with(Default::default)
                    .responses
                    .push(json!([call, response_json(content)]));
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => {
                flush(&mut pending, &mut turns);
                calls = tool_calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| call_json(i, c))
                    .collect();
                turns.push(llm_turn(content.as_deref(), &calls));
            }
        }
    }
    flush(&mut pending, &mut turns);
    turns
}

fn user_turn(prompt: &str, u: PendingUser) -> Value {
    let tools: Vec<Value> = u.tools.iter().map(user_tool).collect();
    let query = match (u.text, u.media.is_empty()) {
        (None, _) => Value::Null,
        // agents-exe writes a query without media as its bare text.
        (Some(t), true) => json!(t),
        (Some(t), false) => json!({"text": t, "media": u.media}),
    };
    json!({"tag": "UserTurn", "contents": {
        "userPrompt": prompt,
        "userTools": tools,
        "userQuery": query,
        "userToolResponses": u.responses,
    }})
}

/// An LlmTurn; `rawResponse` is the reply as an OpenAI chat completion
/// (Bindery keeps no provider's raw JSON).
fn llm_turn(text: Option<&str>, calls: &[Value]) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    json!({"tag": "LlmTurn", "contents": {
        "llmResponse": {
            "responseText": text,
            "responseThinking": null,
            "rawResponse": {"object": "chat.completion", "choices": [
                {"index": 0, "finish_reason": finish, "message": message}]},
        },
        "llmToolCalls": calls,
    }})
}

fn call_json(index: usize, c: &ToolCall) -> Value {
    json!({"id": c.id, "type": "function", "index": index,
           "function": {"name": c.name, "arguments": c.arguments}})
}

/// A result in agents-exe's `UserToolResponse` form.
fn response_json(content: &Content) -> Value {
    match content {
        Content::Text(t) => json!({"type": "text", "content": t}),
        Content::Parts(parts) if !content.has_media() => {
            json!({"type": "text", "content": Content::Parts(parts.clone()).text()})
        }
        Content::Parts(parts) => json!({"type": "mixed", "parts": parts
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
                media => attachment(media).map(|mut m| {
                    m["type"] = json!("media");
                    m
                }),
            })
            .collect::<Vec<_>>()}),
    }
}

/// A media part as agents-exe's `MediaAttachment`: its `data:` URL split.
fn attachment(part: &ContentPart) -> Option<Value> {
    let (url, filename) = match part {
        ContentPart::Text { .. } => return None,
        ContentPart::ImageUrl { image_url } => (&image_url.url, None),
        ContentPart::File { file } => (&file.file_data, Some(&file.filename)),
    };
    let (head, data) = url.strip_prefix("data:")?.split_once(',')?;
    let mime = head.split(';').next()?;
    let mut m = json!({"mimeType": mime, "base64Data": data});
    if let Some(f) = filename {
        m["filename"] = json!(f);
    }
    Some(m)
}

/// A tool offered, as agents-exe's `SystemToolDefinition` `V1`.
fn user_tool(t: &ToolDefinition) -> Value {
    json!({"tag": "V1", "contents": {
        "name": t.name,
        "llmName": t.name,
        "description": t.description,
        "properties": properties(&t.parameters),
        "raw": super::super::check_tools::openai_view(t),
    }})
}

/// A JSON schema's properties as agents-exe's `ParamProperty` list.
fn properties(schema: &Value) -> Vec<Value> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(k, s)| {
            json!({
                "propertyKey": k,
                "propertyType": param_type(s),
                "propertyDescription": s.get("description").and_then(Value::as_str).unwrap_or(""),
                "propertyRequired": required.contains(&k.as_str()),
            })
        })
        .collect()
}

/// A property's schema as agents-exe's `ParamType` (Aeson's tagged form).
fn param_type(s: &Value) -> Value {
    let enumerated: Option<Vec<&str>> = s
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.iter().map(Value::as_str).collect());
    if let Some(values) = enumerated {
        return json!({"tag": "EnumParamType", "contents": values});
    }
    let ty = match s.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // `["string", "null"]`: its first type.
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ => "object",
    };
    match ty {
        "string" => json!({"tag": "StringParamType"}),
        "boolean" => json!({"tag": "BoolParamType"}),
        "number" | "integer" => json!({"tag": "NumberParamType"}),
        "null" => json!({"tag": "NullParamType"}),
        "object" if s.get("properties").is_some() => {
            json!({"tag": "ObjectParamType", "contents": properties(s)})
        }
        other => json!({"tag": "OpaqueParamType", "contents": other}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_llm::content::{FileData, ImageUrl};

    fn call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn tools() -> Vec<ToolDefinition> {
        vec![ToolDefinition {
            name: "bash_probe".into(),
            description: "Reports.".into(),
            parameters: json!({"type": "object", "properties": {
                "repo": {"type": "string", "description": "a repository"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "level": {"type": ["integer", "null"]},
                "opts": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
                "list": {"type": "array"}},
                "required": ["repo"]}),
        }]
    }

    /// One run: a query, a call and its result, an answer.
    fn run() -> Vec<ChatMessage> {
        vec![
            ChatMessage::user("probe it"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![call("c1", "bash_probe", r#"{"repo":"r"}"#)],
                reasoning: None,
            },
            ChatMessage::tool_result("c1", "argv: [--repo] [r]"),
            ChatMessage::assistant("probed"),
        ]
    }

    fn offer_doc(prior: Option<&Value>, new: &[ChatMessage]) -> Value {
        let tools = Arc::new(tools());
        let added: Vec<Added> = new
            .iter()
            .map(|m| Added {
                message: m.clone(),
                tools: tools.clone(),
            })
            .collect();
        session_doc(prior, &added, "You probe.", "s-1", "t-1")
    }

    #[test]
    fn each_user_turn_records_the_tools_offered_after_it() {
        let none = Arc::new(Vec::new());
        let added = |message: ChatMessage, tools: &Arc<Vec<ToolDefinition>>| Added {
            message,
            tools: tools.clone(),
        };
        let all = Arc::new(tools());
        let new = [
            added(ChatMessage::user("go"), &none),
            added(
                ChatMessage::Assistant {
                    content: None,
                    tool_calls: vec![call("a", "meta_activate_tool", "{}")],
                    reasoning: None,
                },
                &none,
            ),
            added(ChatMessage::tool_result("a", "activated"), &all),
            added(ChatMessage::assistant("done"), &all),
        ];
        let doc = session_doc(None, &new, "p", "s", "t");
        assert_eq!(doc["turns"][3]["contents"]["userTools"], json!([]));
        assert_eq!(
            doc["turns"][1]["contents"]["userTools"][0]["contents"]["name"],
            "bash_probe"
        );
    }

    #[test]
    fn a_run_is_written_newest_first_as_agents_exe_writes_it() {
        let doc = offer_doc(None, &run());
        assert_eq!(doc["sessionId"], "s-1");
        assert_eq!(doc["turnId"], "t-1");
        assert_eq!(doc["forkedFromSessionId"], Value::Null);
        let tags: Vec<&str> = doc["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tag"].as_str().unwrap())
            .collect();
        assert_eq!(tags, ["LlmTurn", "UserTurn", "LlmTurn", "UserTurn"]);
        let first = &doc["turns"][3]["contents"];
        assert_eq!(first["userQuery"], "probe it");
        assert_eq!(first["userPrompt"], "You probe.");
        assert_eq!(first["userToolResponses"], json!([]));
        let tool = &first["userTools"][0];
        assert_eq!(tool["tag"], "V1");
        assert_eq!(tool["contents"]["llmName"], "bash_probe");
        assert_eq!(tool["contents"]["raw"]["function"]["name"], "bash_probe");
        let props = &tool["contents"]["properties"];
        let by_key = |k: &str| {
            props
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["propertyKey"] == k)
                .unwrap()
                .clone()
        };
        assert_eq!(
            by_key("repo"),
            json!({"propertyKey": "repo", "propertyType": {"tag": "StringParamType"},
                   "propertyDescription": "a repository", "propertyRequired": true})
        );
        assert_eq!(
            by_key("mode")["propertyType"],
            json!({"tag": "EnumParamType", "contents": ["a", "b"]})
        );
        assert_eq!(
            by_key("level")["propertyType"],
            json!({"tag": "NumberParamType"})
        );
        assert_eq!(
            by_key("opts")["propertyType"]["contents"][0]["propertyRequired"],
            true
        );
        assert_eq!(
            by_key("list")["propertyType"],
            json!({"tag": "OpaqueParamType", "contents": "array"})
        );
        let asked = &doc["turns"][2]["contents"];
        let c1 = json!({"id": "c1", "type": "function", "index": 0,
            "function": {"name": "bash_probe", "arguments": "{\"repo\":\"r\"}"}});
        assert_eq!(asked["llmToolCalls"], json!([c1]));
        let raw = &asked["llmResponse"]["rawResponse"]["choices"][0];
        assert_eq!(raw["finish_reason"], "tool_calls");
        assert_eq!(raw["message"]["tool_calls"], json!([c1]));
        assert_eq!(asked["llmResponse"]["responseText"], Value::Null);
        let answered = &doc["turns"][1]["contents"];
        assert_eq!(answered["userQuery"], Value::Null);
        assert_eq!(
            answered["userToolResponses"],
            json!([[c1, {"type": "text", "content": "argv: [--repo] [r]"}]])
        );
        let last = &doc["turns"][0]["contents"]["llmResponse"];
        assert_eq!(last["responseText"], "probed");
        assert_eq!(last["rawResponse"]["choices"][0]["finish_reason"], "stop");
        // Bindery's own reader takes it, each call once.
        let s = Session::parse(&doc).unwrap();
        assert_eq!(s.calls().count(), 1);
    }

    #[test]
    fn a_written_session_reads_back_as_the_same_conversation() {
        let doc = offer_doc(None, &run());
        let back = history_of(&Session::parse(&doc).unwrap());
        assert_eq!(back.messages, run());
        assert_eq!(back.carried, 4);
    }

    #[test]
    fn a_resumed_session_keeps_its_turns_and_gains_the_new_ones_on_top() {
        let prior = json!({"turns": [{"tag": "UserTurn", "contents": {"userPrompt": "old",
            "userTools": [], "userQuery": "first", "userToolResponses": []}, "byteUsage": {"x": 1}}],
            "sessionId": "old-id", "forkedFromSessionId": "f", "turnId": "t0", "sessionVersion": 2});
        let new = vec![ChatMessage::assistant("hello"), ChatMessage::user("again")];
        let doc = offer_doc(Some(&prior), &new);
        assert_eq!(doc["sessionId"], "old-id");
        assert_eq!(doc["forkedFromSessionId"], "f");
        assert_eq!(doc["sessionVersion"], 2);
        assert_eq!(doc["turnId"], "t-1");
        let turns = doc["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[0]["contents"]["userQuery"], "again");
        assert_eq!(turns[1]["contents"]["llmResponse"]["responseText"], "hello");
        // The stored turn as it was.
        assert_eq!(turns[2], prior["turns"][0]);
    }

    #[test]
    fn media_is_written_as_agents_exe_attachments() {
        let image = ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: "data:image/png;base64,AAAA".into(),
            },
        };
        let pdf = ContentPart::File {
            file: FileData {
                filename: "a.pdf".into(),
                file_data: "data:application/pdf;base64,BBBB".into(),
            },
        };
        let new = vec![
            ChatMessage::User {
                content: Content::Parts(vec![ContentPart::text("look"), pdf]),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![call("c", "bash_shot", "{}")],
                reasoning: None,
            },
            ChatMessage::Tool {
                tool_call_id: "c".into(),
                content: Content::Parts(vec![ContentPart::text("shot"), image]),
            },
        ];
        let doc = offer_doc(None, &new);
        assert_eq!(
            doc["turns"][2]["contents"]["userQuery"],
            json!({"text": "look", "media": [{"mimeType": "application/pdf",
                "base64Data": "BBBB", "filename": "a.pdf"}]})
        );
        assert_eq!(
            doc["turns"][0]["contents"]["userToolResponses"][0][1],
            json!({"type": "mixed", "parts": [{"type": "text", "text": "shot"},
                {"type": "media", "mimeType": "image/png", "base64Data": "AAAA"}]})
        );
        // Read back, the media is named, not sent again.
        let back = history_of(&Session::parse(&doc).unwrap());
        let ChatMessage::Tool { content, .. } = &back.messages[2] else {
            panic!("{:?}", back.messages)
        };
        assert_eq!(
            content.text(),
            "shot\n[image/png media (4 base64 characters) from the session file, not sent again]"
        );
    }

    #[test]
    fn agents_exe_sessions_resume_with_every_call_answered() {
        let text = include_str!("../../../tests/fixtures/agents-exe/sessions/multi.session.json");
        let s = Session::parse(&serde_json::from_str(text).unwrap()).unwrap();
        let r = history_of(&s);
        assert_eq!(r.carried, r.messages.len());
        assert!(matches!(&r.messages[0], ChatMessage::User { .. }));
        answered(&r.messages);
        // A step cut after its calls: they are answered as never answered,
        // and those answers are the run's to write.
        let cut = json!({"turns": [
            {"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": null,
                "responseThinking": null, "rawResponse": {}},
                "llmToolCalls": [{"id": "x", "function": {"name": "bash_ls", "arguments": {"dir": "/"}}}]}},
            {"tag": "UserTurn", "contents": {"userPrompt": "", "userTools": [], "userQuery": "go",
                "userToolResponses": [[{"id": "stray"}, {"type": "text", "content": "?"}]]}}]});
        let r = history_of(&Session::parse(&cut).unwrap());
        assert_eq!(r.carried, 2);
        assert_eq!(
            r.messages[1],
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![call("x", "bash_ls", r#"{"dir":"/"}"#)],
                reasoning: None,
            }
        );
        assert_eq!(r.messages[2], ChatMessage::tool_result("x", UNANSWERED));
        answered(&r.messages);
        // A step in progress (agents-exe's async mode): its completed
        // results are sent, its pending calls answered as never answered.
        let text = include_str!("../../../tests/fixtures/agents-exe/sessions/partial.session.json");
        let s = Session::parse(&super::super::parse_text(text, "f").unwrap()).unwrap();
        let r = history_of(&s);
        answered(&r.messages);
        assert!(r.carried < r.messages.len(), "{:?}", r.messages);
        assert!(r.messages[r.carried..].iter().all(
            |m| matches!(m, ChatMessage::Tool { content, .. } if content.text() == UNANSWERED)
        ));
    }

    /// Each call has exactly one result, right after its assistant message.
    fn answered(messages: &[ChatMessage]) {
        let mut open: Vec<&str> = Vec::new();
        for m in messages {
            match m {
                ChatMessage::Assistant { tool_calls, .. } => {
                    assert!(open.is_empty(), "{messages:?}");
                    open = tool_calls.iter().map(|c| c.id.as_str()).collect();
                }
                ChatMessage::Tool { tool_call_id, .. } => {
                    let at = open.iter().position(|o| o == tool_call_id).unwrap();
                    open.remove(at);
                }
                _ => assert!(open.is_empty(), "{messages:?}"),
            }
        }
    }
}
