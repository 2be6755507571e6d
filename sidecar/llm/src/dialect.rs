//! Each provider's shape, in one place: the path a request goes to, the
//! body a conversation becomes, and the reply read back, whole or as its
//! stream's frames. The provider modules hold the shapes; `client` the HTTP.

use bindery_spec::provider::Provider;
use bindery_sse::Parser as SseParser;
use std::borrow::Cow;

use bytes::Bytes;

use super::conversation::Conversation;
use super::error::LlmError;
use super::parse::{parse_completion, StreamState};
use super::sent::Sent;
use super::types::{ChatMessage, ChatResponse, ModelEndpoint, StreamDelta, ToolDefinition};
use super::{anthropic, bedrock, gemini, responses};

/// The path under the endpoint's base URL (with its query, if any).
pub(crate) fn path(endpoint: &ModelEndpoint, stream: bool) -> Result<String, LlmError> {
    Ok(match endpoint.provider {
        Provider::OpenAi => "/chat/completions".to_owned(),
        Provider::Anthropic => "/messages".to_owned(),
        Provider::OpenAiResponses => responses::PATH.to_owned(),
        Provider::Gemini => gemini::path(endpoint, stream)?,
        Provider::Bedrock => bedrock::path(endpoint, stream),
        Provider::AzureOpenAi => format!(
            "/openai/deployments/{}/chat/completions?api-version={}",
            azure_segment(&endpoint.model, "deployment")?,
            azure_segment(endpoint.azure_api_version(), "api-version")?
        ),
    })
}

/// A deployment name or api-version as it goes in Azure's URL: letters,
/// digits, `-`, `_` and `.` (the checks refuse others at load).
fn azure_segment<'a>(text: &'a str, what: &str) -> Result<&'a str, LlmError> {
    let ok = !text.is_empty()
        && text != "."
        && text != ".."
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match ok {
        true => Ok(text),
        false => Err(LlmError::Config(format!(
            "the Azure OpenAI {what} {text:?} cannot go in a URL: letters, digits, `-`, `_` and `.` only"
        ))),
    }
}

/// Who reasoned, as a reply's [`Reasoning`](super::Reasoning) records it:
/// the endpoint's origin (no credentials, no path) and its model.
pub(crate) fn reasoner(endpoint: &ModelEndpoint) -> String {
    let origin = reqwest::Url::parse(endpoint.base_url.trim())
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_default();
    format!("{origin} {}", endpoint.model)
}

/// The request body for `req` in the endpoint's provider's shape. Each
/// turn's reasoning goes back only to the endpoint that reasoned it: a
/// turn of another's is sent without it (the providers' modules then
/// treat it as a turn made without reasoning).
/// `me` is the endpoint's [`reasoner`].
pub(crate) fn body(
    req: &Conversation,
    endpoint: &ModelEndpoint,
    me: &str,
    stream: bool,
) -> Result<Bytes, LlmError> {
    let foreign = |m: &ChatMessage| {
        matches!(m, ChatMessage::Assistant { reasoning: Some(r), .. }
            if r.endpoint.as_deref() != Some(me))
    };
    if endpoint.provider.speaks_chat_completions() || !req.messages().any(foreign) {
        return body_of(req.messages(), req, endpoint, stream);
    }
    let owned: Vec<Cow<'_, ChatMessage>> = req
        .messages()
        .map(|m| match m {
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } if foreign(m) => Cow::Owned(ChatMessage::Assistant {
                content: content.clone(),
                tool_calls: tool_calls.clone(),
                reasoning: None,
            }),
            _ => Cow::Borrowed(m),
        })
        .collect();
    body_of(owned.iter().map(AsRef::as_ref), req, endpoint, stream)
}

fn body_of<'a>(
    history: impl Iterator<Item = &'a ChatMessage> + Clone,
    req: &Conversation,
    endpoint: &ModelEndpoint,
    stream: bool,
) -> Result<Bytes, LlmError> {
    match endpoint.provider {
        Provider::OpenAi | Provider::AzureOpenAi => {
            let extra = endpoint
                .max_tokens
                .map(|n| format!(r#","max_completion_tokens":{n}"#))
                .unwrap_or_default();
            req.body_with(&endpoint.model, endpoint.flavor, &extra, stream)
        }
        Provider::Anthropic => anthropic::body(history, req.tools(), endpoint, stream),
        Provider::OpenAiResponses => responses::body(history, req.tools(), endpoint, stream),
        Provider::Gemini => gemini::body(history, req.tools(), endpoint, stream),
        Provider::Bedrock => bedrock::body(history, req.tools(), endpoint),
    }
}

/// A whole reply in `provider`'s shape.
pub(crate) fn parse(provider: Provider, text: &str) -> Result<ChatResponse, LlmError> {
    match provider {
        Provider::OpenAi | Provider::AzureOpenAi => parse_completion(text),
        Provider::Anthropic => anthropic::parse(text),
        Provider::OpenAiResponses => responses::parse(text),
        Provider::Gemini => gemini::parse(text),
        Provider::Bedrock => bedrock::parse(text),
    }
}

/// `tools` exactly as `provider`'s requests carry them.
pub(crate) fn tools(
    provider: Provider,
    tools: &[ToolDefinition],
) -> Result<Vec<serde_json::Value>, LlmError> {
    match provider {
        Provider::OpenAi | Provider::AzureOpenAi => Ok(super::conversation::wire_tools(tools)),
        Provider::Anthropic => anthropic::tools(tools),
        Provider::OpenAiResponses => responses::tools(tools),
        Provider::Gemini => gemini::tools(tools),
        Provider::Bedrock => bedrock::tools(tools),
    }
}

/// A streamed reply being read: its framing (server-sent events, or AWS's
/// binary event stream) and its provider's events.
pub(crate) struct Streamed {
    framing: Framing,
    state: State,
    /// The request's credentials, taken out of each event before it is read.
    sent: Sent,
}

enum Framing {
    Sse(SseParser),
    AwsEvents(bedrock::Frames),
}

enum State {
    OpenAi(StreamState),
    Anthropic(anthropic::Stream),
    Responses(responses::Stream),
    Gemini(gemini::Stream),
    Bedrock(bedrock::Stream),
}

impl Streamed {
    pub(crate) fn of(provider: Provider, sent: Sent) -> Self {
        let (framing, state) = match provider {
            Provider::OpenAi | Provider::AzureOpenAi => (
                Framing::Sse(SseParser::default()),
                State::OpenAi(StreamState::default()),
            ),
            Provider::Anthropic => (
                Framing::Sse(SseParser::default()),
                State::Anthropic(anthropic::Stream::default()),
            ),
            Provider::OpenAiResponses => (
                Framing::Sse(SseParser::default()),
                State::Responses(responses::Stream::default()),
            ),
            Provider::Gemini => (
                Framing::Sse(SseParser::default()),
                State::Gemini(gemini::Stream::default()),
            ),
            Provider::Bedrock => (
                Framing::AwsEvents(bedrock::Frames::scrubbing(sent.clone())),
                State::Bedrock(bedrock::Stream::default()),
            ),
        };
        Streamed {
            framing,
            state,
            sent,
        }
    }

    /// Whether the reply is whole (what follows is not read).
    pub(crate) fn is_done(&self) -> bool {
        match &self.state {
            State::OpenAi(s) => s.is_done(),
            State::Anthropic(s) => s.is_done(),
            State::Responses(s) => s.is_done(),
            State::Gemini(s) => s.is_done(),
            State::Bedrock(s) => s.is_done(),
        }
    }

    /// Reads `chunk` of the body, forwarding what it completes.
    pub(crate) fn feed(
        &mut self,
        chunk: &[u8],
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        match &mut self.framing {
            Framing::AwsEvents(frames) => {
                for mut frame in frames.feed(chunk)? {
                    if let Cow::Owned(clean) = self.sent.scrub_bytes(&frame.payload) {
                        frame.payload = Bytes::from(clean);
                    }
                    self.state.handle_frame(&frame, on_delta)?;
                    if self.is_done() {
                        break;
                    }
                }
            }
            Framing::Sse(parser) => {
                let events = parser
                    .feed(chunk)
                    .map_err(|e| LlmError::Malformed(e.to_string()))?;
                for event in events {
                    self.state
                        .handle_event(&self.sent.scrub(&event.data), on_delta)?;
                    if self.is_done() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// The body ended: reads what its framing still holds.
    pub(crate) fn end(
        &mut self,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        match &mut self.framing {
            Framing::AwsEvents(frames) if !frames.is_empty() => Err(LlmError::Malformed(
                "the event stream ended inside a frame".to_owned(),
            )),
            Framing::AwsEvents(_) => Ok(()),
            Framing::Sse(parser) => match parser.finish() {
                Some(event) => self
                    .state
                    .handle_event(&self.sent.scrub(&event.data), on_delta),
                None => Ok(()),
            },
        }
    }

    pub(crate) fn finish(self) -> Result<ChatResponse, LlmError> {
        match self.state {
            State::OpenAi(s) => s.finish(),
            State::Anthropic(s) => s.finish(),
            State::Responses(s) => s.finish(),
            State::Gemini(s) => s.finish(),
            State::Bedrock(s) => s.finish(),
        }
    }
}

impl State {
    /// A server-sent event's data.
    fn handle_event(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        match self {
            State::OpenAi(s) => s.handle_event(data, on_delta),
            State::Anthropic(s) => s.handle_event(data, on_delta),
            State::Responses(s) => s.handle_event(data, on_delta),
            State::Gemini(s) => s.handle_event(data, on_delta),
            State::Bedrock(_) => Err(mixed()),
        }
    }

    /// An AWS event-stream frame.
    fn handle_frame(
        &mut self,
        frame: &bedrock::Frame,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<(), LlmError> {
        match self {
            State::Bedrock(s) => s.handle_frame(frame, on_delta),
            _ => Err(mixed()),
        }
    }
}

/// A framing and a provider that do not go together (never built so).
fn mixed() -> LlmError {
    LlmError::Malformed("the stream's framing is not its provider's".to_owned())
}
