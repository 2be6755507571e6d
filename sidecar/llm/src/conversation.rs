//! A request that grows by whole messages, encoded for the wire as it grows.
//!
//! A run sends the conversation so far at every step, and the conversation
//! only grows. Encoding it anew for each request costs time in proportion to
//! its length (tens of microseconds at a few dozen turns); a
//! [`Conversation`] encodes each message once, when it is added, and each
//! request body is the encoded parts put together. It keeps no copy of the
//! messages themselves: the run holds them already, and copying a long
//! history at each run's start cost as much as encoding it.
//!
//! A tool's result with media (a turn in agents-exe's form: parts in a
//! `tool` message) is sent the way Chat Completions takes it: the tool
//! message gets its text and a note, and the media go in one `user`
//! message after the last of the results in a row (OpenAI, and vLLM
//! serving Kimi, refuse an image in a tool message; a user message may
//! not come between the results of one turn's calls). See
//! [`tool_media`].

use bytes::Bytes;
use serde::Serialize;

use super::content::{Content, ContentPart};
use super::error::LlmError;
use super::types::{ChatMessage, ChatRequest, ToolDefinition};
use super::Turn;

/// The messages and tools of a run's requests, in their wire encoding.
///
/// Messages can only be added, never changed, so what was encoded stays true.
pub struct Conversation {
    tools: Vec<ToolDefinition>,
    /// The encoded messages, comma-separated, without the brackets.
    messages: Vec<u8>,
    /// How many messages were added.
    count: usize,
    /// Their characters as [`ChatMessage::chars`] counts them.
    chars: usize,
    /// `,"tools":[...]`, or nothing when there are no tools.
    wire_tools: Vec<u8>,
    /// Why a part could not be encoded; every body then fails with it.
    unencodable: Option<String>,
    /// Where the session's history begins, in bytes of `messages` and in
    /// messages: after what the agent puts first (its system prompt).
    history_from: Option<(usize, usize)>,
    /// Media of the tool results just added, for the user message that
    /// follows them (written when a message other than a result is
    /// added, or at the end of a body).
    pending: Vec<ContentPart>,
    /// A result with media was sent in another form than its turn's:
    /// the history's encoding is no longer the turns'.
    rewritten: bool,
    /// The messages as added (a turn's copy is a reference count): what
    /// a provider other than chat completions encodes its body from.
    turns: Vec<Turn>,
}

impl Conversation {
    /// A conversation with no messages yet, offering `tools`.
    pub fn new(tools: Vec<ToolDefinition>) -> Self {
        let mut conversation = Conversation {
            tools: Vec::new(),
            messages: Vec::new(),
            count: 0,
            chars: 0,
            wire_tools: Vec::new(),
            unencodable: None,
            history_from: None,
            pending: Vec::new(),
            rewritten: false,
            turns: Vec::new(),
        };
        conversation.set_tools(tools);
        conversation
    }

    /// Offers `tools` from the next request on, in place of those before
    /// (on-demand tools come and go between steps; the messages stay).
    pub fn set_tools(&mut self, tools: Vec<ToolDefinition>) {
        if tools == self.tools {
            return;
        }
        self.wire_tools.clear();
        if !tools.is_empty() {
            let wire: Vec<WireTool<'_>> = tools.iter().map(WireTool::of).collect();
            self.wire_tools.extend_from_slice(br#","tools":"#);
            if let Err(e) = serde_json::to_writer(&mut self.wire_tools, &wire) {
                self.unencodable = Some(format!("a tool definition: {e}"));
            }
        }
        self.tools = tools;
    }

    /// Adds `message` at the end.
    pub fn push(&mut self, message: &ChatMessage) {
        let turn = Turn::new(message.clone());
        self.add(turn.message(), Some(turn.json()));
        self.turns.push(turn);
    }

    /// Adds `turn` at the end: its text as it is, not encoded again.
    pub fn push_turn(&mut self, turn: &Turn) {
        self.add(turn.message(), Some(turn.json()));
        self.turns.push(turn.clone());
    }

    /// The messages as they were added, oldest first.
    pub fn messages(&self) -> impl Iterator<Item = &ChatMessage> + Clone {
        self.turns.iter().map(Turn::message)
    }

    /// Adds `message`, whose encoding is `json` when it is known: a tool's
    /// result with media in its wire form (see [`tool_media`]), anything
    /// else as it is, after the media of the results before it.
    fn add(&mut self, message: &ChatMessage, json: Option<&str>) {
        if !matches!(message, ChatMessage::Tool { .. }) {
            self.flush_media();
        }
        match message {
            // Another provider's reasoning is not chat completions': the
            // turn goes without it.
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning: Some(_),
            } => {
                self.rewritten = true;
                let plain = ChatMessage::Assistant {
                    content: content.clone(),
                    tool_calls: tool_calls.clone(),
                    reasoning: None,
                };
                self.write(&plain, None);
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } if content.has_media() => {
                let (text, media) = tool_media(tool_call_id, content);
                self.rewritten = true;
                self.pending.extend(media);
                self.write(&ChatMessage::tool_result(tool_call_id, text), None);
            }
            _ => self.write(message, json),
        }
        // Counted now, media and all, wherever they are sent.
        self.chars += message.chars();
    }

    /// The user message carrying the pending media, if any.
    fn media_message(&self) -> Option<ChatMessage> {
        (!self.pending.is_empty()).then(|| ChatMessage::User {
            content: Content::Parts(self.pending.clone()),
        })
    }

    fn flush_media(&mut self) {
        if let Some(message) = self.media_message() {
            self.pending.clear();
            self.write(&message, None);
        }
    }

    fn write(&mut self, message: &ChatMessage, json: Option<&str>) {
        let mark = self.messages.len();
        if self.count > 0 {
            self.messages.push(b',');
        }
        match json {
            Some(json) => self.messages.extend_from_slice(json.as_bytes()),
            None => {
                if let Err(e) = serde_json::to_writer(&mut self.messages, message) {
                    self.messages.truncate(mark);
                    self.unencodable
                        .get_or_insert_with(|| format!("message {}: {e}", self.count));
                }
            }
        }
        self.count += 1;
    }

    /// The messages as a body holds them: those added, then the pending
    /// media's user message.
    fn wire_messages(&self) -> Result<Vec<u8>, LlmError> {
        let mut list = Vec::with_capacity(self.messages.len() + 2);
        list.push(b'[');
        list.extend_from_slice(&self.messages);
        if let Some(media) = self.media_message() {
            if self.count > 0 {
                list.push(b',');
            }
            serde_json::to_writer(&mut list, &media)
                .map_err(|e| LlmError::Config(format!("cannot encode a tool's media: {e}")))?;
        }
        list.push(b']');
        Ok(list)
    }

    /// Adds `turns` at the end, in order.
    pub fn extend_turns(&mut self, turns: &[Turn]) {
        // Room for all of them at once: a long history would otherwise
        // be copied again at every doubling of the buffer.
        self.messages.reserve(Turn::encoded_len(turns));
        for turn in turns {
            self.push_turn(turn);
        }
    }

    /// Adds `messages` at the end, in order.
    pub fn extend<'a>(&mut self, messages: impl IntoIterator<Item = &'a ChatMessage>) {
        for message in messages {
            self.push(message);
        }
    }

    /// Marks the messages added from now on as the session's history (see
    /// [`Conversation::history`]).
    pub fn history_starts(&mut self) {
        self.history_from = Some((self.messages.len(), self.count));
    }

    /// The messages added since [`Conversation::history_starts`], encoded
    /// and comma-separated as in a body, and how many they are: `None`
    /// before it, when a message could not be encoded, or when a result
    /// with media was sent in another form than its turn's.
    pub fn history(&self) -> Option<(&[u8], usize)> {
        let (at, from) = self.history_from?;
        if self.unencodable.is_some() || self.rewritten {
            return None;
        }
        let bytes = &self.messages[at..];
        Some((bytes.strip_prefix(b",").unwrap_or(bytes), self.count - from))
    }

    /// The tools on offer.
    pub fn tools(&self) -> &[ToolDefinition] {
        &self.tools
    }

    /// The characters of its messages' texts and calls, for estimating
    /// their tokens.
    pub fn message_chars(&self) -> usize {
        self.chars
    }

    /// The messages and tools as plain data, decoded from their encoding:
    /// for a model served in this process, which takes them so.
    pub fn request(&self) -> Result<ChatRequest, LlmError> {
        if let Some(why) = &self.unencodable {
            return Err(LlmError::Config(format!(
                "cannot encode the request: {why}"
            )));
        }
        let list = self.wire_messages()?;
        let messages = serde_json::from_slice(&list)
            .map_err(|e| LlmError::Config(format!("cannot decode the request's messages: {e}")))?;
        Ok(ChatRequest {
            messages,
            tools: self.tools.clone(),
        })
    }

    /// The request body for `model`: `{"model", "messages", "tools" (when
    /// there are some), what `flavor` adds, "stream", "stream_options"
    /// (when streamed)}`.
    #[cfg(test)]
    pub(crate) fn body(
        &self,
        model: &str,
        flavor: bindery_spec::flavor::Flavor,
        stream: bool,
    ) -> Result<Bytes, LlmError> {
        self.body_with(model, flavor, "", stream)
    }

    /// [`Conversation::body`] with `extra` (`,"key":value` members, or
    /// nothing) after what the flavour adds.
    pub(crate) fn body_with(
        &self,
        model: &str,
        flavor: bindery_spec::flavor::Flavor,
        extra: &str,
        stream: bool,
    ) -> Result<Bytes, LlmError> {
        if let Some(why) = &self.unencodable {
            return Err(LlmError::Config(format!(
                "cannot encode the request: {why}"
            )));
        }
        let tail: &[u8] = match stream {
            true => br#","stream":true,"stream_options":{"include_usage":true}}"#,
            false => br#","stream":false}"#,
        };
        let mut body = Vec::with_capacity(
            96 + model.len() + self.messages.len() + self.wire_tools.len() + tail.len(),
        );
        body.extend_from_slice(br#"{"model":"#);
        serde_json::to_writer(&mut body, model)
            .map_err(|e| LlmError::Config(format!("cannot encode the model's name: {e}")))?;
        body.extend_from_slice(br#","messages":"#);
        body.extend_from_slice(&self.wire_messages()?);
        body.extend_from_slice(&self.wire_tools);
        body.extend_from_slice(flavor.request_fields().as_bytes());
        body.extend_from_slice(extra.as_bytes());
        body.extend_from_slice(tail);
        Ok(Bytes::from(body))
    }
}

impl From<ChatRequest> for Conversation {
    fn from(request: ChatRequest) -> Self {
        let mut conversation = Conversation::new(request.tools);
        conversation.extend(&request.messages);
        conversation
    }
}

impl std::fmt::Debug for Conversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Counts only: the messages may hold anything the user typed.
        f.debug_struct("Conversation")
            .field("messages", &self.count)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

/// A tool's result with media, as Chat Completions takes it: the text
/// for its `tool` message (its text parts, and a note for each medium),
/// and the parts for the `user` message after the results (a line that
/// says whose output they are, then the media).
pub fn tool_media(tool_call_id: &str, content: &Content) -> (String, Vec<ContentPart>) {
    let Content::Parts(parts) = content else {
        return (content.text().into_owned(), Vec::new());
    };
    let mut text: Vec<String> = Vec::new();
    let mut media = vec![ContentPart::text(format!(
        "[output of tool call {tool_call_id}, not a message from the user]"
    ))];
    for part in parts {
        match part {
            ContentPart::Text { text: t } => text.push(t.clone()),
            medium => {
                text.push(format!(
                    "[{} attached in the next user message]",
                    medium.mime().unwrap_or("media")
                ));
                media.push(medium.clone());
            }
        }
    }
    (text.join("\n"), media)
}

/// The tools as a chat-completions request lists them.
pub(crate) fn wire_tools(tools: &[ToolDefinition]) -> Vec<serde_json::Value> {
    tools
        .iter()
        .filter_map(|t| serde_json::to_value(WireTool::of(t)).ok())
        .collect()
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionDef<'a>,
}

impl<'a> WireTool<'a> {
    fn of(tool: &'a ToolDefinition) -> Self {
        WireTool {
            kind: "function",
            function: WireFunctionDef {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        }
    }
}

#[derive(Serialize)]
struct WireFunctionDef<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolCall;
    use serde_json::{json, Value};

    fn parsed(body: &Bytes) -> Value {
        serde_json::from_slice(body).expect("the body is JSON")
    }

    fn echo_tool() -> ToolDefinition {
        ToolDefinition {
            name: "echo".into(),
            description: "Echo the text".into(),
            parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        }
    }

    #[test]
    fn the_body_has_tools_only_when_there_are_some() {
        let mut plain = Conversation::new(vec![]);
        plain.push(&ChatMessage::user("hi"));
        assert_eq!(
            parsed(&plain.body("m", Default::default(), false).unwrap()),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false})
        );

        let mut tooled = Conversation::new(vec![echo_tool()]);
        tooled.push(&ChatMessage::user("hi"));
        let body = parsed(&tooled.body("m", Default::default(), true).unwrap());
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {
                "name": "echo", "description": "Echo the text",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}
            }}])
        );
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn an_empty_conversation_sends_an_empty_list() {
        let body = parsed(
            &Conversation::new(vec![])
                .body("m", Default::default(), false)
                .unwrap(),
        );
        assert_eq!(body["messages"], json!([]));
    }

    /// The whole request encoded at once by serde, fields in the order the
    /// body writes them: what a grown conversation must equal, byte for byte.
    #[derive(Serialize)]
    struct AtOnce<'a> {
        model: &'a str,
        messages: &'a [ChatMessage],
        tools: Vec<WireTool<'a>>,
        stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        stream_options: Option<Value>,
    }

    /// Growing a conversation step by step gives, at every step and in both
    /// modes, the body that encoding all of it at once gives, byte for byte.
    #[test]
    fn growing_encodes_what_encoding_at_once_does() {
        let turns = [
            ChatMessage::system("be \"brief\"\n\tand kind ✓"),
            ChatMessage::user("read a.txt"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "echo".into(),
                    arguments: r#"{"text":"</script>\u0000"}"#.into(),
                }],
                reasoning: None,
            },
            ChatMessage::tool_result("call_1", "line one\nline two"),
            ChatMessage::assistant("done"),
        ];
        let model = "gpt-\"quoted\"";
        let tool = echo_tool();
        let mut grown = Conversation::new(vec![tool.clone()]);
        // The same messages as turns: their texts spliced, not encoded.
        let mut spliced = Conversation::new(vec![tool.clone()]);
        for (i, turn) in turns.iter().enumerate() {
            grown.push(turn);
            spliced.push_turn(&Turn::new(turn.clone()));
            assert_eq!(spliced.message_chars(), grown.message_chars());
            for stream in [false, true] {
                let once = serde_json::to_vec(&AtOnce {
                    model,
                    messages: &turns[..=i],
                    tools: vec![WireTool::of(&tool)],
                    stream,
                    stream_options: stream.then(|| json!({"include_usage": true})),
                })
                .unwrap();
                let body = grown.body(model, Default::default(), stream).unwrap();
                assert_eq!(
                    std::str::from_utf8(&body).unwrap(),
                    std::str::from_utf8(&once).unwrap(),
                    "step {i}, stream {stream}"
                );
                assert_eq!(
                    spliced.body(model, Default::default(), stream).unwrap(),
                    body,
                    "step {i}, stream {stream}, spliced"
                );
            }
            let whole = Conversation::from(grown.request().unwrap());
            assert_eq!(
                whole.body(model, Default::default(), false).unwrap(),
                grown.body(model, Default::default(), false).unwrap(),
                "step {i}"
            );
            assert_eq!(grown.request().unwrap().messages.len(), i + 1);
            assert_eq!(
                grown.message_chars(),
                turns[..=i].iter().map(ChatMessage::chars).sum::<usize>()
            );
        }
        let decoded = grown.request().unwrap();
        assert_eq!(decoded.messages, turns);
        assert_eq!(decoded.tools, vec![tool]);
    }

    /// The history is the messages after the mark, encoded as in a body,
    /// with or without a system prompt before it.
    #[test]
    fn the_history_is_what_came_after_its_mark() {
        let turns = [
            ChatMessage::user("hi"),
            ChatMessage::assistant("hello \"you\""),
        ];
        for prompt in [None, Some(ChatMessage::system("be brief"))] {
            let mut c = Conversation::new(vec![]);
            assert!(c.history().is_none());
            if let Some(p) = &prompt {
                c.push(p);
            }
            c.history_starts();
            assert_eq!(c.history(), Some((&b""[..], 0)));
            for (i, turn) in turns.iter().enumerate() {
                c.push(turn);
                let (bytes, n) = c.history().unwrap();
                let whole = format!("[{}]", std::str::from_utf8(bytes).unwrap());
                let once = serde_json::to_string(&turns[..=i]).unwrap();
                assert_eq!((whole, n), (once, i + 1), "prompt {prompt:?}");
            }
        }
    }

    /// A tool's result with an image is sent as Chat Completions takes
    /// it: the tool message text only, the image in one user message
    /// after the last result in a row (at the end of the body, or before
    /// the next message); its turn and the history keep agents-exe's form.
    #[test]
    fn a_results_media_follow_the_results_in_a_user_message() {
        use crate::content::{Content, ContentPart, ImageUrl};
        let image = ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: "data:image/png;base64,iVBORw==".into(),
            },
        };
        let calls = ChatMessage::Assistant {
            content: None,
            tool_calls: ["c1", "c2"]
                .map(|id| ToolCall {
                    id: id.into(),
                    name: "bash_chart".into(),
                    arguments: "{}".into(),
                })
                .to_vec(),
            reasoning: None,
        };
        let with_image = ChatMessage::Tool {
            tool_call_id: "c1".into(),
            content: Content::Parts(vec![ContentPart::text("a chart"), image.clone()]),
        };
        // Its turn is agents-exe's form.
        assert_eq!(
            serde_json::to_value(&with_image).unwrap(),
            json!({"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "text", "text": "a chart"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}]})
        );
        let mut c = Conversation::new(vec![]);
        c.history_starts();
        c.push(&ChatMessage::user("draw"));
        c.push(&calls);
        c.push_turn(&Turn::new(with_image));
        c.push(&ChatMessage::tool_result("c2", "plain"));
        let sent = json!([
            {"role": "user", "content": "draw"},
            serde_json::to_value(&calls).unwrap(),
            {"role": "tool", "tool_call_id": "c1",
             "content": "a chart\n[image/png attached in the next user message]"},
            {"role": "tool", "tool_call_id": "c2", "content": "plain"},
            {"role": "user", "content": [
                {"type": "text", "text": "[output of tool call c1, not a message from the user]"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}]},
        ]);
        let body = parsed(&c.body("m", Default::default(), false).unwrap());
        assert_eq!(body["messages"], sent);
        // The history's encoding is no longer the turns': not offered.
        assert!(c.history().is_none());
        assert_eq!(c.request().unwrap().messages.len(), 5);
        // The next message comes after the media, which are not sent twice.
        c.push(&ChatMessage::assistant("done"));
        let body = parsed(&c.body("m", Default::default(), false).unwrap());
        let mut more = sent.as_array().unwrap().clone();
        more.push(json!({"role": "assistant", "content": "done"}));
        assert_eq!(body["messages"], json!(more));
    }

    /// A conversation is shown by its counts, never its messages' text.
    #[test]
    fn debug_shows_no_text() {
        let mut c = Conversation::new(vec![echo_tool()]);
        c.push(&ChatMessage::user("my account number is 12345"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("12345"), "{shown}");
        assert!(shown.contains("messages: 1"), "{shown}");
    }
}
