use super::*;
use crate::content::{FileData, ImageUrl};
use crate::Content;

fn endpoint() -> ModelEndpoint {
    ModelEndpoint::new("http://x/v1", "gpt-test")
}

fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: format!("{name} things"),
        parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
    }
}

fn encoded(history: &[ChatMessage], tools: &[ToolDefinition], e: &ModelEndpoint) -> Value {
    serde_json::from_slice(&body(history, tools, e, false).unwrap()).unwrap()
}

/// A reasoning item as the API returns it (nulls included).
fn thought(id: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
           "encrypted_content": format!("enc-{id}"), "content": null, "status": null})
}

fn ours(items: Vec<Value>) -> Option<Reasoning> {
    Some(Reasoning {
        provider: PROVIDER.into(),
        blocks: items,
        endpoint: None,
    })
}

#[test]
fn a_two_turn_tool_conversation_becomes_instructions_and_input_items() {
    let history = vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("look up a"),
        ChatMessage::Assistant {
            content: Some("looking".into()),
            tool_calls: vec![call("call_1", "find", r#"{"q":"a"}"#)],
            reasoning: None,
        },
        ChatMessage::tool_result("call_1", "A"),
        ChatMessage::assistant("it is A"),
        ChatMessage::user("thanks"),
    ];
    let mut e = endpoint();
    e.max_tokens = Some(4096);
    let body = encoded(&history, &[tool("find")], &e);
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["instructions"], "be brief");
    assert_eq!(body["store"], false, "Bindery owns the history");
    assert!(body.get("previous_response_id").is_none());
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(body["max_output_tokens"], 4096);
    assert_eq!(body["parallel_tool_calls"], true);
    assert_eq!(body["stream"], false);
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "name": "find", "description": "find things", "strict": false,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}])
    );
    assert_eq!(
        body["input"],
        json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look up a"}]},
            {"type": "message", "role": "assistant", "content": "looking"},
            {"type": "function_call", "call_id": "call_1", "name": "find", "arguments": "{\"q\":\"a\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "A"},
            {"type": "message", "role": "assistant", "content": "it is A"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ])
    );
    let streamed: Value =
        serde_json::from_slice(&super::body(&history, &[], &endpoint(), true).unwrap()).unwrap();
    assert_eq!(streamed["stream"], true);
    assert!(streamed.get("tools").is_none() && streamed.get("parallel_tool_calls").is_none());
    assert!(streamed.get("max_output_tokens").is_none());
}

#[test]
fn parallel_calls_go_in_order_and_foreign_ids_map_alike_in_call_and_output() {
    let long = "x".repeat(65);
    let history = vec![
        ChatMessage::user("look up a, b and c"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![
                call("toolu_01A", "find", r#"{"q":"a"}"#),
                call("functions.find:1", "find", r#"{"q":"b"}"#),
                call(&long, "find", ""),
            ],
            reasoning: None,
        },
        ChatMessage::tool_result("functions.find:1", "B"),
        ChatMessage::tool_result("toolu_01A", "A"),
        ChatMessage::tool_result(&long, "C"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let input = body["input"].as_array().unwrap();
    assert_eq!(input.len(), 7, "{input:#?}");
    assert_eq!(input[1]["call_id"], "toolu_01A");
    let mapped = input[2]["call_id"].as_str().unwrap();
    assert!(mapped.starts_with("functions_find_1_"), "{mapped}");
    assert!(valid_name(mapped));
    let cut = input[3]["call_id"].as_str().unwrap();
    assert!(valid_name(cut) && cut.len() <= MAX_CALL_ID, "{cut}");
    assert_eq!(
        input[3]["arguments"], "{}",
        "no arguments are an empty object"
    );
    assert_eq!(input[4]["call_id"], mapped);
    assert_eq!(input[4]["output"], "B");
    assert_eq!(input[5]["call_id"], "toolu_01A");
    assert_eq!(input[6]["call_id"], cut);
    assert!(
        input[1..4].iter().all(|i| i.get("id").is_none()),
        "no fc_ ids"
    );
}

/// Two calls never share a `call_id` in a request: not an id that maps
/// onto another call's mapping, nor one the model reused in a later turn;
/// each output answers its own call, and a suffixed id still fits 64.
#[test]
fn calls_keep_distinct_ids_and_outputs_follow_them() {
    let full = "c".repeat(64);
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call(&full, "one", "{}"), call("a.b", "two", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result(&full, "ONE"),
        ChatMessage::tool_result("a.b", "TWO"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call(&full, "one", "{}"), call(&wire_id("a.b"), "two", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result(&full, "again"),
        ChatMessage::tool_result(wire_id("a.b"), "TWO again"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let input = body["input"].as_array().unwrap();
    let of = |kind: &str| -> Vec<String> {
        input
            .iter()
            .filter(|i| i["type"] == kind)
            .map(|i| i["call_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let calls = of("function_call");
    let outputs = of("function_call_output");
    let distinct: std::collections::BTreeSet<_> = calls.iter().collect();
    assert_eq!(distinct.len(), 4, "{calls:?}");
    assert_eq!(calls, outputs);
    assert_eq!(calls[0], full);
    assert_eq!(calls[2].len(), 64);
    assert!(calls[2].ends_with("_2"), "{}", calls[2]);
    assert!(calls.iter().all(|c| valid_name(c)), "{calls:?}");
}

#[test]
fn ids_map_apart_stay_when_valid_and_always_fit() {
    assert_eq!(wire_id("call_AbC-1"), "call_AbC-1");
    let (a, b) = (wire_id("call.1"), wire_id("call:1"));
    assert_ne!(a, b);
    assert_eq!(a, wire_id("call.1"));
    for id in [a, b, wire_id(""), wire_id("é/ü"), wire_id(&"é".repeat(200))] {
        assert!(valid_name(&id), "{id}");
    }
}

#[test]
fn media_become_input_images_and_files_in_messages_and_outputs() {
    let png = ContentPart::ImageUrl {
        image_url: ImageUrl {
            url: "data:image/png;base64,iVBO".into(),
        },
    };
    let pdf = ContentPart::File {
        file: FileData {
            filename: "a.pdf".into(),
            file_data: "data:application/pdf;base64,JVBE".into(),
        },
    };
    let history = vec![
        ChatMessage::User {
            content: Content::Parts(vec![ContentPart::text("see"), png.clone(), pdf]),
        },
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("call_1", "shot", "{}")],
            reasoning: None,
        },
        ChatMessage::Tool {
            tool_call_id: "call_1".into(),
            content: Content::Parts(vec![ContentPart::text("a screenshot"), png]),
        },
    ];
    let body = encoded(&history, &[], &endpoint());
    assert_eq!(
        body["input"][0]["content"],
        json!([
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"},
        ])
    );
    // The API takes media in a function's output: no user message after.
    assert_eq!(
        body["input"][2]["output"],
        json!([
            {"type": "input_text", "text": "a screenshot"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto"},
        ])
    );
    assert_eq!(body["input"].as_array().unwrap().len(), 3);
}

#[test]
fn reasoning_goes_back_before_its_turns_calls_and_never_for_another_provider() {
    let item = reasoning_item(&thought("rs_1")).unwrap().unwrap();
    let history = vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: Some("let me look".into()),
            tool_calls: vec![call("call_1", "find", "{}"), call("call_2", "find", "{}")],
            reasoning: ours(vec![item.clone()]),
        },
        ChatMessage::tool_result("call_1", "A"),
        ChatMessage::tool_result("call_2", "B"),
        ChatMessage::system("now answer"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let input = body["input"].as_array().unwrap();
    assert_eq!(input[1], item, "verbatim, first in its turn");
    assert_eq!(input[1]["encrypted_content"], "enc-rs_1");
    assert!(input[1].get("content").is_none(), "a null is not sent");
    assert_eq!(input[2]["role"], "assistant");
    assert_eq!(input[3]["type"], "function_call");
    assert_eq!(input[4]["type"], "function_call");
    // A late system message stays in its place, as the developer's.
    assert_eq!(
        input[7],
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "now answer"}]})
    );
    assert_eq!(body["instructions"], "be brief");

    // Another provider's reasoning is never sent.
    let mut other = history.clone();
    if let ChatMessage::Assistant { reasoning, .. } = &mut other[2] {
        *reasoning = Some(Reasoning {
            provider: "anthropic".into(),
            blocks: vec![json!({"type": "thinking", "thinking": "x", "signature": "s"})],
            endpoint: None,
        });
    }
    let body = encoded(&other, &[], &endpoint());
    assert!(!body.to_string().contains("thinking"), "{body}");
    assert_eq!(body["input"][1]["role"], "assistant");
    // A turn of reasoning alone (no text, no call) is left out whole: a
    // reasoning item must precede the item it led to.
    let alone = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: Some("  ".into()),
            tool_calls: vec![],
            reasoning: ours(vec![item]),
        },
        ChatMessage::user("again"),
    ];
    assert_eq!(
        encoded(&alone, &[], &endpoint())["input"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn arguments_that_are_not_json_go_as_json() {
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("call_1", "find", "q=a")],
            reasoning: None,
        },
        ChatMessage::tool_result("call_1", "A"),
    ];
    let body = encoded(&history, &[], &endpoint());
    assert_eq!(body["input"][1]["arguments"], r#"{"arguments":"q=a"}"#);
}

#[test]
fn a_tool_name_openai_refuses_is_named_in_the_error() {
    for name in ["files.read", "", &"n".repeat(65)] {
        let err = body(&[ChatMessage::user("q")], &[tool(name)], &endpoint(), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("`{name}`")) && err.contains("rename"),
            "{err}"
        );
    }
    assert!(tools(&[tool(&"n".repeat(64)), tool("a-b_C9")]).is_ok());
    let odd = ToolDefinition {
        parameters: json!(true),
        description: String::new(),
        ..tool("x")
    };
    assert_eq!(
        tools(&[odd]).unwrap()[0],
        json!({"type": "function", "name": "x", "strict": false,
               "parameters": {"type": "object", "properties": {}}})
    );
}

fn usage_json(input: u64, cached: u64, output: u64, reasoning: u64) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 7},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning},
           "total_tokens": input.saturating_add(output)})
}

fn response(output: Value, status: &str) -> Value {
    json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-test",
           "status": status, "output": output, "parallel_tool_calls": true, "tool_choice": "auto",
           "tools": [], "error": null, "incomplete_details": null,
           "usage": usage_json(1200, 1000, 50, 30)})
}

#[test]
fn a_whole_reply_gives_text_calls_reasoning_and_the_usage() {
    let reply = response(
        json!([
            thought("rs_1"),
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "phase": null,
             "content": [{"type": "output_text", "text": "Looking", "annotations": [], "logprobs": null},
                         {"type": "output_text", "text": ".", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "find",
             "arguments": "{\"q\":\"x\"}", "status": "completed"},
            {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "find",
             "arguments": "{\"q\":\"y\"}", "status": "completed"},
        ]),
        "completed",
    );
    let mut parsed = Reply::default();
    for item in reply["output"].as_array().unwrap() {
        parsed.item(item).unwrap();
    }
    parsed.end(&reply).unwrap();
    assert_eq!(
        parsed.reasoning_tokens,
        Some(30),
        "for the lead's Usage field"
    );
    let r = parse(&reply.to_string()).unwrap();
    assert_eq!(r.content.as_deref(), Some("Looking."), "never the summary");
    assert_eq!(
        r.tool_calls,
        vec![
            call("call_a", "find", r#"{"q":"x"}"#),
            call("call_b", "find", r#"{"q":"y"}"#)
        ]
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    let reasoning = r.reasoning.unwrap();
    assert_eq!(reasoning.provider, "openai-responses");
    assert_eq!(
        reasoning.blocks,
        vec![
            json!({"id": "rs_1", "type": "reasoning", "encrypted_content": "enc-rs_1",
                    "summary": [{"type": "summary_text", "text": "plan"}]})
        ]
    );
    let u = r.usage.unwrap();
    assert_eq!(
        (
            u.prompt_tokens,
            u.completion_tokens,
            u.total_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens
        ),
        (1200, 50, 1250, 1000, 7)
    );
    let wrong = parse(r#"{"choices": []}"#).unwrap_err().to_string();
    assert!(wrong.contains("Responses API"), "{wrong}");
}

#[test]
fn an_incomplete_a_failed_and_a_refused_reply() {
    let text = json!([{"type": "message", "id": "m", "role": "assistant", "status": "incomplete",
                       "content": [{"type": "output_text", "text": "Par", "annotations": []}]}]);
    let mut cut = response(text, "incomplete");
    cut["incomplete_details"] = json!({"reason": "max_output_tokens"});
    let r = parse(&cut.to_string()).unwrap();
    assert_eq!(
        (r.content.as_deref(), r.finish_reason.as_deref()),
        (Some("Par"), Some("length"))
    );
    let mut failed = response(json!([]), "failed");
    failed["error"] = json!({"code": "server_error", "message": "The server had an error"});
    let err = parse(&failed.to_string()).unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 500, .. }), "{err}");
    assert!(err.to_string().contains("The server had an error"), "{err}");
    failed["error"] = json!({"code": "invalid_prompt", "message": "flagged"});
    let err = parse(&failed.to_string()).unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 400, .. }), "{err}");
    for status in ["in_progress", "queued", "cancelled"] {
        let err = parse(&response(json!([]), status).to_string()).unwrap_err();
        assert!(err.to_string().contains(status), "{err}");
    }
    let refused = response(
        json!([{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                "content": [{"type": "refusal", "refusal": "I can't help with that."}]}]),
        "completed",
    );
    let r = parse(&refused.to_string()).unwrap();
    assert_eq!(r.content.as_deref(), Some("I can't help with that."));
    assert_eq!(r.finish_reason.as_deref(), Some("content_filter"));
}

#[test]
fn odd_whole_replies_are_refused_and_bare_reasoning_left_out() {
    let run = |output: Value| parse(&response(output, "completed").to_string());
    let err = run(json!([{"type": "web_search_call", "id": "ws", "status": "completed"}]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"web_search_call\""), "{err}");
    for bad in [
        json!([{"type": "function_call", "call_id": "c", "arguments": "{}"}]),
        json!([{"type": "message", "content": "text"}]),
        json!([{"type": "message", "content": [{"type": "output_audio"}]}]),
        json!([{"type": "reasoning", "summary": [], "encrypted_content": "e"}]),
        json!(["reasoning"]),
        json!([null]),
    ] {
        assert!(run(bad.clone()).is_err(), "{bad}");
    }
    // Without its encrypted content a reasoning item names an item nobody
    // stored (`store: false`): it is not kept to be sent back.
    let r = run(json!([{"type": "reasoning", "id": "rs_1", "summary": []},
                       {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]))
    .unwrap();
    assert!(r.reasoning.is_none());
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    assert!(parse("not json").is_err());
    assert!(parse("[]").is_err());
}

/// Counts a model could not have used never overflow, nor reach a store
/// as more than [`Usage::MAX_REPORTED`].
#[test]
fn absurd_usage_counts_are_cut() {
    let mut reply = response(json!([]), "completed");
    reply["usage"] = usage_json(u64::MAX, u64::MAX, u64::MAX, u64::MAX);
    let u = parse(&reply.to_string()).unwrap().usage.unwrap();
    assert_eq!(u.prompt_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.completion_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.total_tokens, 2 * Usage::MAX_REPORTED);
    assert!(u.cache_read_tokens + u.cache_write_tokens <= u.prompt_tokens);
    reply["usage"] = json!("lots");
    assert!(parse(&reply.to_string()).unwrap().usage.is_none());
}

/// The events of one streamed reply, in the order the API documents:
/// reasoning (its summary streamed, its encrypted content whole only at
/// its `.done`), a message in pieces, two calls with arguments in pieces,
/// then the completed response with the usage.
fn stream_events() -> Vec<Value> {
    let added = |i: u64, item: Value| json!({"type": "response.output_item.added", "output_index": i, "item": item, "sequence_number": 0});
    let done = |i: u64, item: Value| json!({"type": "response.output_item.done", "output_index": i, "item": item, "sequence_number": 0});
    let text = |delta: &str| {
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                                    "content_index": 0, "delta": delta, "logprobs": [], "sequence_number": 0})
    };
    let args = |i: u64, id: &str, delta: &str| {
        json!({"type": "response.function_call_arguments.delta",
                                                      "item_id": id, "output_index": i, "delta": delta, "sequence_number": 0})
    };
    let call = |id: &str, call_id: &str, arguments: &str| {
        json!({"type": "function_call", "id": id, "call_id": call_id,
                                                                  "name": "find", "arguments": arguments, "status": "completed"})
    };
    let message = |text: &str| {
        json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                                      "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let mut partial = thought("rs_1");
    partial["encrypted_content"] = json!("enc-");
    partial["summary"] = json!([]);
    let created = response(json!([]), "in_progress");
    let mut completed = response(json!([]), "completed");
    completed["output"] = json!([
        thought("rs_1"),
        message("On it, héllo"),
        call("fc_1", "call_a", "{\"q\":\"x\"}"),
        call("fc_2", "call_b", "{}")
    ]);
    vec![
        json!({"type": "response.created", "response": created, "sequence_number": 0}),
        json!({"type": "response.in_progress", "response": created, "sequence_number": 1}),
        added(0, partial),
        json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0,
               "summary_index": 0, "part": {"type": "summary_text", "text": ""}, "sequence_number": 0}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
               "summary_index": 0, "delta": "secret plan", "sequence_number": 0}),
        json!({"type": "response.reasoning_summary_text.done", "item_id": "rs_1", "output_index": 0,
               "summary_index": 0, "text": "secret plan", "sequence_number": 0}),
        json!({"type": "response.reasoning_summary_part.done", "item_id": "rs_1", "output_index": 0,
               "summary_index": 0, "part": {"type": "summary_text", "text": "secret plan"}, "sequence_number": 0}),
        done(0, thought("rs_1")),
        added(
            1,
            json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}),
        ),
        json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, "content_index": 0,
               "part": {"type": "output_text", "text": "", "annotations": []}, "sequence_number": 0}),
        text("On i"),
        text("t, h"),
        text("éllo"),
        json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
               "text": "On it, héllo", "logprobs": [], "sequence_number": 0}),
        json!({"type": "response.content_part.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
               "part": {"type": "output_text", "text": "On it, héllo", "annotations": []}, "sequence_number": 0}),
        done(1, message("On it, héllo")),
        added(2, call("fc_1", "call_a", "")),
        args(2, "fc_1", "{\"q\":"),
        args(2, "fc_1", "\"x\"}"),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2,
               "arguments": "{\"q\":\"x\"}", "sequence_number": 0}),
        done(2, call("fc_1", "call_a", "{\"q\":\"x\"}")),
        added(3, call("fc_2", "call_b", "")),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_2", "output_index": 3,
               "arguments": "{}", "sequence_number": 0}),
        done(3, call("fc_2", "call_b", "{}")),
        json!({"type": "response.completed", "response": completed, "sequence_number": 0}),
    ]
}

fn run(events: &[Value]) -> Result<(ChatResponse, Vec<StreamDelta>), LlmError> {
    let mut s = Stream::default();
    let mut deltas = Vec::new();
    for e in events {
        s.handle_event(&e.to_string(), &mut |d| deltas.push(d))?;
    }
    s.finish().map(|r| (r, deltas))
}

#[test]
fn a_stream_forwards_text_and_calls_and_keeps_the_reasoning_to_itself() {
    let mut s = Stream::default();
    let mut deltas = Vec::new();
    let events = stream_events();
    for (i, e) in events.iter().enumerate() {
        assert!(!s.is_done(), "done before event {i}");
        s.handle_event(&e.to_string(), &mut |d| deltas.push(d))
            .unwrap();
    }
    assert!(s.is_done());
    let r = s.finish().unwrap();
    let started = |index: usize, id: &str| StreamDelta::ToolCallStarted {
        index,
        id: id.into(),
        name: "find".into(),
    };
    let args = |index: usize, fragment: &str| StreamDelta::ToolCallArguments {
        index,
        fragment: fragment.into(),
    };
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Content("On i".into()),
            StreamDelta::Content("t, h".into()),
            StreamDelta::Content("éllo".into()),
            started(0, "call_a"),
            args(0, "{\"q\":"),
            args(0, "\"x\"}"),
            started(1, "call_b"),
            args(1, "{}"),
        ]
    );
    assert!(!format!("{deltas:?}").contains("secret plan"));
    assert_eq!(r.content.as_deref(), Some("On it, héllo"));
    assert_eq!(
        r.tool_calls,
        vec![
            call("call_a", "find", r#"{"q":"x"}"#),
            call("call_b", "find", "{}")
        ]
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    // The item's `.done` is its whole form: the encrypted content that
    // came partial in `.added` is whole.
    assert_eq!(
        r.reasoning.unwrap().blocks,
        vec![reasoning_item(&thought("rs_1")).unwrap().unwrap()]
    );
    let u = r.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens),
        (1200, 50, 1000)
    );
}

#[test]
fn a_stream_in_many_pieces_is_whole_and_in_order() {
    let mut events = stream_events();
    let at = events
        .iter()
        .position(|e| e["type"] == "response.output_text.delta")
        .unwrap();
    events.drain(at..at + 4);
    let pieces: Vec<String> = (0..1000).map(|i| format!("{i},")).collect();
    let whole: String = pieces.concat();
    for (n, piece) in pieces.iter().enumerate() {
        events.insert(
            at + n,
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                   "content_index": 0, "delta": piece, "logprobs": []}),
        );
    }
    events.insert(
        at + 1000,
        json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1,
               "content_index": 0, "text": whole}),
    );
    let (r, deltas) = run(&events).unwrap();
    assert_eq!(r.content.as_deref(), Some(whole.as_str()));
    assert_eq!(
        deltas.len(),
        1000 + 5,
        "the text in its pieces, and the two calls"
    );
}

#[test]
fn an_incomplete_stream_says_length_and_a_failed_one_is_an_error() {
    let mut events = stream_events();
    let mut cut = response(json!([]), "incomplete");
    cut["incomplete_details"] = json!({"reason": "max_output_tokens"});
    *events.last_mut().unwrap() = json!({"type": "response.incomplete", "response": cut});
    let (r, _) = run(&events).unwrap();
    assert_eq!(r.finish_reason.as_deref(), Some("length"));

    let mut failed = response(json!([]), "failed");
    failed["error"] = json!({"code": "rate_limit_exceeded", "message": "slow down"});
    *events.last_mut().unwrap() = json!({"type": "response.failed", "response": failed});
    let err = run(&events).unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 429, .. }), "{err}");
    assert!(err.to_string().contains("slow down"), "{err}");

    let err =
        run(&[json!({"type": "error", "code": "server_error", "message": "boom", "param": null})])
            .unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 500, .. }), "{err}");
    assert!(err.to_string().contains("boom"), "{err}");
}

#[test]
fn a_stream_that_sends_the_reply_only_at_its_end_is_read_and_forwarded() {
    let events = stream_events();
    let (r, deltas) = run(&[events[0].clone(), events.last().unwrap().clone()]).unwrap();
    assert_eq!(r.content.as_deref(), Some("On it, héllo"));
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(r.reasoning.unwrap().blocks.len(), 1);
    assert_eq!(deltas[0], StreamDelta::Content("On it, héllo".into()));
    assert_eq!(deltas.len(), 5);
}

#[test]
fn a_stream_cut_short_or_ending_with_an_item_open_is_refused() {
    let events = stream_events();
    for cut in [0, 1, 2, 10, events.len() - 1] {
        let err = run(&events[..cut]).unwrap_err().to_string();
        assert!(err.contains("response.completed"), "{cut}: {err}");
    }
    // The completed response while an item is still open.
    let mut open = events[..events.len() - 2].to_vec();
    open.push(events.last().unwrap().clone());
    let err = run(&open).unwrap_err().to_string();
    assert!(err.contains("output item 3 never done"), "{err}");
}

/// An item's index is the next one or the reply does not read: an index
/// the model names never sizes anything.
#[test]
fn an_item_starting_anywhere_but_at_the_next_index_is_refused() {
    for index in [
        "1",
        "2000000",
        "1099511627776",
        "18446744073709551615",
        "-1",
        "\"0\"",
    ] {
        let start = format!(
            r#"{{"type":"response.output_item.added","output_index":{index},"item":{{"type":"message","id":"m","content":[]}}}}"#
        );
        let err = Stream::default()
            .handle_event(&start, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("where the next is 0"), "{index}: {err}");
    }
    // Starting an index again is refused too.
    let events = stream_events();
    let mut again = events[..3].to_vec();
    again.push(events[2].clone());
    assert!(run(&again).is_err());
}

/// What a hostile or broken stream could slip in: each is malformed (or
/// the API's error), never a panic, never kept half or shown as text.
#[test]
fn odd_events_are_refused() {
    let events = stream_events();
    let find = |t: &str| events.iter().position(|e| e["type"] == t).unwrap();
    let with = |at: usize, event: Value| {
        let mut e = events.clone();
        e.insert(at, event);
        e
    };
    let replaced = |at: usize, event: Value| {
        let mut e = events.clone();
        e[at] = event;
        e
    };
    let text_at = find("response.output_text.delta");
    let args_at = find("response.function_call_arguments.delta");
    let cases: Vec<(&str, Vec<Value>)> = vec![
        // Text for the reasoning item, or before its part, or after it.
        (
            "text into reasoning",
            with(
                3,
                json!({"type": "response.output_text.delta", "output_index": 0,
                                              "content_index": 0, "delta": "LIVE"}),
            ),
        ),
        (
            "text with no part",
            with(text_at - 1, events[text_at].clone()),
        ),
        (
            "text after its item",
            with(text_at + 6, events[text_at].clone()),
        ),
        (
            "a refusal delta in a text part",
            with(
                text_at,
                json!({"type": "response.refusal.delta", "output_index": 1,
                                                                "content_index": 0, "delta": "no"}),
            ),
        ),
        (
            "a delta without text",
            replaced(
                text_at,
                json!({"type": "response.output_text.delta", "output_index": 1,
                                                          "content_index": 0, "delta": 5}),
            ),
        ),
        (
            "text done unlike its deltas",
            replaced(
                text_at + 3,
                json!({"type": "response.output_text.done",
                                                  "output_index": 1, "content_index": 0, "text": "other"}),
            ),
        ),
        (
            "a part at another index",
            replaced(
                text_at - 1,
                json!({"type": "response.content_part.added",
                 "output_index": 1, "content_index": 7, "part": {"type": "output_text", "text": ""}}),
            ),
        ),
        (
            "a part of another kind",
            replaced(
                text_at - 1,
                json!({"type": "response.content_part.added",
                 "output_index": 1, "content_index": 0, "part": {"type": "output_audio"}}),
            ),
        ),
        (
            "a second part while one is open",
            with(text_at, events[text_at - 1].clone()),
        ),
        (
            "an item done with its part open",
            with(text_at + 4, events[text_at + 5].clone()),
        ),
        (
            "arguments for a message",
            with(
                text_at,
                json!({"type": "response.function_call_arguments.delta",
                                                        "output_index": 1, "delta": "{"}),
            ),
        ),
        (
            "arguments done unlike their deltas",
            replaced(
                args_at + 2,
                json!({"type": "response.function_call_arguments.done",
                                                   "output_index": 2, "item_id": "fc_1", "arguments": "{}"}),
            ),
        ),
        (
            "arguments for another item id",
            replaced(
                args_at,
                json!({"type": "response.function_call_arguments.delta",
                                                   "output_index": 2, "item_id": "fc_9", "delta": "{"}),
            ),
        ),
        (
            "a call done with another id",
            replaced(
                args_at + 3,
                json!({"type": "response.output_item.done", "output_index": 2,
                 "item": {"type": "function_call", "id": "fc_1", "call_id": "call_z", "name": "find", "arguments": "{\"q\":\"x\"}"}}),
            ),
        ),
        (
            "an item done as another type",
            replaced(
                args_at + 3,
                json!({"type": "response.output_item.done", "output_index": 2,
                 "item": {"type": "message", "id": "fc_1", "content": []}}),
            ),
        ),
        (
            "a built-in tool's item",
            with(
                2,
                json!({"type": "response.output_item.added", "output_index": 0,
                 "item": {"type": "web_search_call", "id": "ws_1", "status": "in_progress"}}),
            ),
        ),
        (
            "a call without a name",
            replaced(
                args_at - 1,
                json!({"type": "response.output_item.added", "output_index": 2,
                 "item": {"type": "function_call", "id": "fc_1", "call_id": "call_a", "arguments": ""}}),
            ),
        ),
        (
            "a reasoning event for a message",
            with(
                text_at,
                json!({"type": "response.reasoning_summary_text.delta",
                 "output_index": 1, "summary_index": 0, "delta": "x"}),
            ),
        ),
        (
            "a reasoning item without an id",
            replaced(
                7,
                json!({"type": "response.output_item.done", "output_index": 0,
                 "item": {"type": "reasoning", "summary": [], "encrypted_content": "e"}}),
            ),
        ),
        (
            "a completed event without its response",
            replaced(events.len() - 1, json!({"type": "response.completed"})),
        ),
        (
            "a part ended that is not open",
            with(
                text_at,
                json!({"type": "response.content_part.done",
                 "output_index": 1, "content_index": 3, "part": {"type": "output_text", "text": ""}}),
            ),
        ),
        ("not JSON", with(3, json!("{not json"))),
    ];
    for (what, case) in cases {
        let mut s = Stream::default();
        let mut shown = String::new();
        let result = case.iter().try_for_each(|e| {
            let data = match e {
                Value::String(raw) => raw.clone(),
                other => other.to_string(),
            };
            s.handle_event(&data, &mut |d| shown.push_str(&format!("{d:?}")))
        });
        let result = result.and_then(|()| Stream::finish(std::mem::take(&mut s)));
        assert!(result.is_err(), "{what}: accepted");
        assert!(
            !shown.contains("LIVE") && !shown.contains("secret"),
            "{what}: {shown}"
        );
    }
}

#[test]
fn a_part_or_call_whose_text_comes_only_at_its_end_is_forwarded_once() {
    let events = stream_events();
    // No text deltas: the text comes with `.done`.
    let no_deltas: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] != "response.output_text.delta")
        .cloned()
        .collect();
    let (r, deltas) = run(&no_deltas).unwrap();
    assert_eq!(r.content.as_deref(), Some("On it, héllo"));
    assert_eq!(deltas[0], StreamDelta::Content("On it, héllo".into()));
    assert_eq!(
        deltas
            .iter()
            .filter(|d| matches!(d, StreamDelta::Content(_)))
            .count(),
        1
    );
    // No part events at all: the text comes with the item's `.done`; no
    // argument events: the arguments come with theirs.
    let bare: Vec<Value> = events
        .iter()
        .filter(|e| {
            let t = e["type"].as_str().unwrap();
            !t.starts_with("response.output_text")
                && !t.starts_with("response.content_part")
                && !t.starts_with("response.function_call_arguments")
        })
        .cloned()
        .collect();
    let (r, deltas) = run(&bare).unwrap();
    assert_eq!(r.content.as_deref(), Some("On it, héllo"));
    let mut empty = bare.clone();
    let last = empty.len() - 2;
    empty[last]["item"]["arguments"] = json!("");
    assert_eq!(run(&empty).unwrap().0.tool_calls[1].arguments, "{}");
    assert_eq!(r.tool_calls[0].arguments, r#"{"q":"x"}"#);
    assert_eq!(
        deltas
            .iter()
            .filter(|d| matches!(d, StreamDelta::ToolCallArguments { index: 0, .. }))
            .count(),
        1
    );
}
