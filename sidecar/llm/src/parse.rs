//! Reading chat-completion replies: a whole JSON reply, or the chunks of a
//! streamed one.

use serde_json::Value;

use super::error::{excerpt, LlmError};
use super::types::{arguments_text, ChatResponse, StreamDelta, ToolCall, Usage};

/// The most tool calls one streamed reply may carry; an index beyond it is
/// taken for garbage rather than allocated.
const MAX_STREAMED_TOOL_CALLS: usize = 1024;

/// Parses a non-streamed reply body.
pub(crate) fn parse_completion(body: &str) -> Result<ChatResponse, LlmError> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        LlmError::Malformed(format!("the reply is not JSON ({e}): {}", excerpt(body)))
    })?;
    let Some(choice) = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return Err(LlmError::Malformed(format!(
            "the reply has no choices: {}",
            excerpt(body)
        )));
    };
    let Some(message) = choice.get("message").filter(|m| m.is_object()) else {
        return Err(LlmError::Malformed(format!(
            "the reply's first choice has no message: {}",
            excerpt(body)
        )));
    };
    let content = content_text(message.get("content")).ok_or_else(|| {
        LlmError::Malformed(format!(
            "the reply's message content is not text: {}",
            excerpt(body)
        ))
    })?;
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| parse_tool_call(i, call, body))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(LlmError::Malformed(format!(
                "the reply's tool_calls is not a list: {}",
                excerpt(body)
            )))
        }
    };
    Ok(ChatResponse {
        content,
        tool_calls,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        usage: parse_usage(value.get("usage")),
        ..ChatResponse::default()
    })
}

/// A message's content: `Some(None)` when absent or null, `Some(Some(text))`
/// for a string or a list of text parts, `None` for anything else.
fn content_text(content: Option<&Value>) -> Option<Option<String>> {
    match content {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(Value::Array(parts)) => Some(Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        )),
        Some(_) => None,
    }
}

fn parse_tool_call(index: usize, call: &Value, body: &str) -> Result<ToolCall, LlmError> {
    let function = call.get("function");
    let name = function
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            LlmError::Malformed(format!(
                "tool call {index} of the reply has no function name: {}",
                excerpt(body)
            ))
        })?;
    let arguments = function
        .and_then(|f| f.get("arguments"))
        .unwrap_or(&Value::Null);
    Ok(ToolCall {
        id: call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| synthetic_id(index), str::to_owned),
        name: name.to_owned(),
        arguments: arguments_text(arguments),
    })
}

/// The id given to a tool call the endpoint sent without one.
fn synthetic_id(index: usize) -> String {
    format!("call_{index}")
}

fn parse_usage(usage: Option<&Value>) -> Option<Usage> {
    let usage = usage.filter(|u| u.is_object())?;
    let mut parsed: Usage = serde_json::from_value(usage.clone()).ok()?;
    // Automatic prompt caching, part of `prompt_tokens`: OpenAI's in
    // `prompt_tokens_details`, Moonshot's (Kimi) at the top.
    parsed.cache_read_tokens = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .or_else(|| usage.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(parsed.prompt_tokens);
    parsed.cache_write_tokens = 0;
    Some(parsed.bounded())
}

/// The deltas a non-streamed reply amounts to, for a streaming caller whose
/// endpoint answered with plain JSON.
pub(crate) fn deltas_of(response: &ChatResponse, on_delta: &mut dyn FnMut(StreamDelta)) {
    if let Some(content) = response.content.as_ref().filter(|c| !c.is_empty()) {
        on_delta(StreamDelta::Content(content.clone()));
    }
    for (index, call) in response.tool_calls.iter().enumerate() {
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

/// A tool call being assembled from stream chunks.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
    started: bool,
}

/// The state of a streamed reply: fed the `data` of each event, it forwards
/// deltas and assembles the final [`ChatResponse`].
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    content: Option<String>,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    saw_choice: bool,
    done: bool,
}

impl StreamState {
    /// Whether `data: [DONE]` has arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes the `data` of one event.
    pub fn handle_event(
        &mut self,
        data: &str,
        on_delta: &mut dyn FnMut(StreamDelta),
    ) -> Result<(), LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "a stream event is not JSON ({e}): {}",
                excerpt(data)
            ))
        })?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(LlmError::Malformed(format!(
                "the endpoint reported an error in the stream: {}",
                excerpt(data)
            )));
        }
        if let Some(usage) = parse_usage(chunk.get("usage")) {
            self.usage = Some(usage);
        }
        let choice = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|choices| {
                choices
                    .iter()
                    .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
            });
        let Some(choice) = choice else {
            return Ok(());
        };
        self.saw_choice = true;
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) else {
            return Ok(());
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            if !text.is_empty() {
                self.content.get_or_insert_with(String::new).push_str(text);
                on_delta(StreamDelta::Content(text.to_owned()));
            }
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, call) in calls.iter().enumerate() {
                self.handle_tool_call_delta(position, call, data, on_delta)?;
            }
        }
        Ok(())
    }

    fn handle_tool_call_delta(
        &mut self,
        position: usize,
        call: &Value,
        data: &str,
        on_delta: &mut dyn FnMut(StreamDelta),
    ) -> Result<(), LlmError> {
        let index = match call.get("index") {
            None | Some(Value::Null) => position,
            Some(i) => i
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < MAX_STREAMED_TOOL_CALLS)
                .ok_or_else(|| {
                    LlmError::Malformed(format!(
                        "a streamed tool call has a bad index: {}",
                        excerpt(data)
                    ))
                })?,
        };
        if self.calls.len() <= index {
            self.calls.resize_with(index + 1, PartialCall::default);
        }
        let partial = &mut self.calls[index];
        if let Some(id) = call.get("id").and_then(Value::as_str) {
            if !id.is_empty() && partial.id.is_none() {
                partial.id = Some(id.to_owned());
            }
        }
        let function = call.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) {
            if !partial.started {
                partial.name.push_str(name);
            }
        }
        let fragment = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        partial.arguments.push_str(fragment);
        if partial.started {
            if !fragment.is_empty() {
                on_delta(StreamDelta::ToolCallArguments {
                    index,
                    fragment: fragment.to_owned(),
                });
            }
        } else if !partial.name.is_empty() {
            partial.started = true;
            on_delta(StreamDelta::ToolCallStarted {
                index,
                id: partial.id.clone().unwrap_or_else(|| synthetic_id(index)),
                name: partial.name.clone(),
            });
            if !partial.arguments.is_empty() {
                on_delta(StreamDelta::ToolCallArguments {
                    index,
                    fragment: partial.arguments.clone(),
                });
            }
        }
        Ok(())
    }

    /// The stream ended: the assembled reply.
    pub fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.saw_choice {
            return Err(LlmError::Malformed(
                "the stream ended without a single choice".to_owned(),
            ));
        }
        if !self.done && self.finish_reason.is_none() {
            return Err(LlmError::Malformed(
                "the stream ended before the reply was complete (no finish_reason, no [DONE])"
                    .to_owned(),
            ));
        }
        let tool_calls = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(index, call)| {
                if call.name.is_empty() {
                    return Err(LlmError::Malformed(format!(
                        "streamed tool call {index} has no function name"
                    )));
                }
                Ok(ToolCall {
                    id: call.id.unwrap_or_else(|| synthetic_id(index)),
                    name: call.name,
                    arguments: if call.arguments.is_empty() {
                        "{}".to_owned()
                    } else {
                        call.arguments
                    },
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ChatResponse {
            content: self.content,
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
            ..ChatResponse::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_sse::Parser as SseParser;
    use serde_json::json;

    #[test]
    fn parses_a_text_reply() {
        let body = json!({
            "id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        })
        .to_string();
        let r = parse_completion(&body).unwrap();
        assert_eq!(r.content.as_deref(), Some("Hello"));
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert_eq!(
            r.usage,
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 1,
                total_tokens: 6,
                ..Default::default()
            })
        );
    }

    #[test]
    fn cached_prompt_tokens_are_read_where_openai_and_kimi_put_them() {
        let usage = |u: Value| {
            let body = json!({"choices": [{"message": {"content": "x"}}], "usage": u});
            parse_completion(&body.to_string()).unwrap().usage.unwrap()
        };
        let openai = usage(
            json!({"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101,
                                  "prompt_tokens_details": {"cached_tokens": 64}}),
        );
        assert_eq!((openai.prompt_tokens, openai.cache_read_tokens), (100, 64));
        let kimi = usage(
            json!({"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101,
                                "cached_tokens": 80}),
        );
        assert_eq!(kimi.cache_read_tokens, 80);
        // Never more than the prompt.
        assert_eq!(
            usage(json!({"prompt_tokens": 10, "cached_tokens": 80})).cache_read_tokens,
            10
        );
        assert_eq!(usage(json!({"prompt_tokens": 10})).cache_read_tokens, 0);
    }

    #[test]
    fn parses_tool_calls() {
        let body = json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "read", "arguments": "{\"path\":\"x\"}"}},
                {"type": "function", "function": {"name": "list", "arguments": {"dir": "."}}},
                {"id": "call_c", "type": "function", "function": {"name": "now"}}
            ]}, "finish_reason": "tool_calls"}]
        })
        .to_string();
        let r = parse_completion(&body).unwrap();
        assert_eq!(r.content, None);
        assert_eq!(r.usage, None);
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "read".into(),
                    arguments: "{\"path\":\"x\"}".into()
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "list".into(),
                    arguments: "{\"dir\":\".\"}".into()
                },
                ToolCall {
                    id: "call_c".into(),
                    name: "now".into(),
                    arguments: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn rejects_malformed_replies() {
        let cases = [
            "<html>Bad gateway</html>".to_owned(),
            "".to_owned(),
            json!({"choices": []}).to_string(),
            json!({"object": "list", "data": []}).to_string(),
            json!({"choices": [{"text": "legacy completion"}]}).to_string(),
            json!({"choices": [{"message": {"content": 42}}]}).to_string(),
            json!({"choices": [{"message": {"tool_calls": {"a": 1}}}]}).to_string(),
            json!({"choices": [{"message": {"tool_calls": [
                {"id": "c", "function": {"arguments": "{}"}}
            ]}}]})
            .to_string(),
            json!({"choices": [{"message": {"tool_calls": [{"id": "c"}]}}]}).to_string(),
        ];
        for body in cases {
            match parse_completion(&body) {
                Err(LlmError::Malformed(msg)) => assert!(msg.len() < 500, "{msg}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        let long = format!("not json {}", "x".repeat(10_000));
        let Err(LlmError::Malformed(msg)) = parse_completion(&long) else {
            panic!()
        };
        assert!(msg.contains("not JSON") && msg.len() < 600, "{msg}");
    }

    /// Runs a whole event stream through the SSE parser and the stream state
    /// in pieces of `size` bytes.
    fn run_stream(stream: &str, size: usize) -> (Vec<StreamDelta>, Result<ChatResponse, LlmError>) {
        let mut parser = SseParser::default();
        let mut state = StreamState::default();
        let mut deltas = Vec::new();
        let mut push = |d| deltas.push(d);
        let mut result = Ok(());
        for piece in stream.as_bytes().chunks(size) {
            for event in parser.feed(piece).unwrap() {
                if result.is_ok() && !state.is_done() {
                    result = state.handle_event(&event.data, &mut push);
                }
            }
        }
        if let Some(event) = parser.finish() {
            if result.is_ok() && !state.is_done() {
                result = state.handle_event(&event.data, &mut push);
            }
        }
        let response = result.and_then(|()| state.finish());
        (deltas, response)
    }

    fn sse(chunks: &[Value]) -> String {
        let mut out = String::new();
        for c in chunks {
            out.push_str(&format!("data: {c}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    #[test]
    fn assembles_streamed_text() {
        let stream = sse(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hé"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "llo ✓"}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        ]);
        for size in [1, 2, 5, 17, 1000] {
            let (deltas, response) = run_stream(&stream, size);
            let response = response.unwrap();
            assert_eq!(
                deltas,
                vec![
                    StreamDelta::Content("Hé".into()),
                    StreamDelta::Content("llo ✓".into())
                ]
            );
            assert_eq!(response.content.as_deref(), Some("Héllo ✓"));
            assert_eq!(response.finish_reason.as_deref(), Some("stop"));
            assert_eq!(response.usage.map(|u| u.total_tokens), Some(5));
        }
    }

    #[test]
    fn assembles_streamed_tool_calls() {
        let stream = sse(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}
            ]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "{\"pa"}}
            ]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "th\":\"a\"}"}}
            ]}}]}),
            // The second call arrives whole, arguments and all.
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "id": "call_2", "type": "function", "function": {"name": "list", "arguments": "{}"}}
            ]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        for size in [1, 3, 64, 10_000] {
            let (deltas, response) = run_stream(&stream, size);
            let response = response.unwrap();
            assert_eq!(
                deltas,
                vec![
                    StreamDelta::ToolCallStarted {
                        index: 0,
                        id: "call_1".into(),
                        name: "read".into()
                    },
                    StreamDelta::ToolCallArguments {
                        index: 0,
                        fragment: "{\"pa".into()
                    },
                    StreamDelta::ToolCallArguments {
                        index: 0,
                        fragment: "th\":\"a\"}".into()
                    },
                    StreamDelta::ToolCallStarted {
                        index: 1,
                        id: "call_2".into(),
                        name: "list".into()
                    },
                    StreamDelta::ToolCallArguments {
                        index: 1,
                        fragment: "{}".into()
                    },
                ]
            );
            assert_eq!(response.content, None);
            assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
            assert_eq!(
                response.tool_calls,
                vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "read".into(),
                        arguments: "{\"path\":\"a\"}".into()
                    },
                    ToolCall {
                        id: "call_2".into(),
                        name: "list".into(),
                        arguments: "{}".into()
                    },
                ]
            );
        }
    }

    #[test]
    fn arguments_before_the_name_are_forwarded_once_it_comes() {
        let stream = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ":1}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let (deltas, response) = run_stream(&stream, 7);
        assert_eq!(
            deltas,
            vec![
                StreamDelta::ToolCallStarted {
                    index: 0,
                    id: "call_0".into(),
                    name: "f".into()
                },
                StreamDelta::ToolCallArguments {
                    index: 0,
                    fragment: "{\"a\":1}".into()
                },
            ]
        );
        assert_eq!(response.unwrap().tool_calls[0].arguments, "{\"a\":1}");
    }

    #[test]
    fn rejects_malformed_streams() {
        let nameless = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let gap = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 2, "id": "c", "function": {"name": "f"}}]}}]}),
        ]);
        let huge_index = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1u64 << 40, "function": {"name": "f"}}]}}]}),
        ]);
        let truncated = "data: {\"choices\": [{\"delta\": {\"content\": \"Hel\"}}]}\n\n".to_owned();
        let cases = [
            "this is not an event stream".to_owned(),
            "data: {not json}\n\n".to_owned(),
            sse(&[]),
            sse(&[json!({"error": {"message": "overloaded"}})]),
            nameless,
            gap,
            huge_index,
            truncated,
        ];
        for stream in cases {
            let (_, response) = run_stream(&stream, 4);
            assert!(
                matches!(response, Err(LlmError::Malformed(_))),
                "{stream}: {response:?}"
            );
        }
    }
}
