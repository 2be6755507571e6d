use super::*;
use crate::Content;

fn endpoint() -> ModelEndpoint {
    let mut e = ModelEndpoint::new("http://x/v1", "claude-test");
    e.provider = bindery_spec::provider::Provider::Anthropic;
    e
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

#[test]
fn a_conversation_becomes_system_tool_use_and_one_user_turn_of_results() {
    let history = vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("look up a and b"),
        ChatMessage::Assistant {
            content: Some("looking".into()),
            tool_calls: vec![
                call("toolu_1", "find", r#"{"q":"a"}"#),
                call("call.2", "find", r#"{"q":"b"}"#),
            ],
            reasoning: None,
        },
        ChatMessage::tool_result("toolu_1", "A"),
        ChatMessage::tool_result("call.2", "B"),
        ChatMessage::user("and then?"),
    ];
    let body = encoded(&history, &[tool("find"), tool("other")], &endpoint());
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["max_tokens"], 8192, "Anthropic requires one");
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
    );
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    let uses = messages[1]["content"].as_array().unwrap();
    assert_eq!(uses[0], json!({"type": "text", "text": "looking"}));
    assert_eq!(uses[1]["input"], json!({"q": "a"}));
    // An id Anthropic refuses is mapped, alike in the call and its result.
    let mapped = uses[2]["id"].as_str().unwrap();
    assert!(mapped.starts_with("call_2_"), "{mapped}");
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], mapped);
    assert_eq!(results[2]["text"], "and then?");
    // The prefix's end is a cache breakpoint, as are the tools' and the system's.
    assert_eq!(results[2]["cache_control"], json!({"type": "ephemeral"}));
    assert!(results[1].get("cache_control").is_none());
    let tools = body["tools"].as_array().unwrap();
    assert!(tools[0].get("cache_control").is_none());
    assert_eq!(tools[1]["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(tools[0]["input_schema"]["type"], "object");
    assert!(body.get("thinking").is_none());
}

#[test]
fn thinking_is_asked_for_and_its_blocks_go_back_first_in_their_turn() {
    let mut e = endpoint();
    e.thinking_budget = Some(2048);
    e.max_tokens = Some(4096);
    let thought = json!({"type": "thinking", "thinking": "hmm", "signature": "sig=="});
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("toolu_1", "find", "{}")],
            reasoning: Some(Reasoning {
                provider: "anthropic".into(),
                blocks: vec![thought.clone()],
                endpoint: None,
            }),
        },
        ChatMessage::tool_result("toolu_1", "A"),
    ];
    let body = encoded(&history, &[], &e);
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(body["max_tokens"], 4096);
    assert_eq!(body["messages"][1]["content"][0], thought);
    assert_eq!(body["messages"][1]["content"][1]["type"], "tool_use");

    // Another provider's reasoning is not sent; and a turn of calls made
    // without Anthropic's thinking (a fallback's) goes on without asking
    // for thinking, which Anthropic would require the turn to begin with.
    let mut other = history.clone();
    if let ChatMessage::Assistant { reasoning, .. } = &mut other[1] {
        reasoning.as_mut().unwrap().provider = "gemini".into();
    }
    let body = encoded(&other, &[], &e);
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
    assert!(body.get("thinking").is_none(), "{body}");
    // Once that turn is answered, thinking is asked for again.
    other.push(ChatMessage::assistant("done"));
    other.push(ChatMessage::user("and now?"));
    assert_eq!(encoded(&other, &[], &e)["thinking"]["budget_tokens"], 2048);
}

#[test]
fn media_become_base64_sources_and_a_late_system_message_is_marked() {
    let png = Content::Parts(vec![
        ContentPart::text("see"),
        ContentPart::ImageUrl {
            image_url: crate::content::ImageUrl {
                url: "data:image/png;base64,iVBO".into(),
            },
        },
    ]);
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::assistant("a"),
        ChatMessage::system("a note"),
        ChatMessage::User { content: png },
    ];
    let body = encoded(&history, &[], &endpoint());
    assert!(body.get("system").is_none());
    let last = &body["messages"][2]["content"];
    assert_eq!(last[0]["text"], "[system] a note");
    assert_eq!(
        last[2]["source"],
        json!({"type": "base64", "media_type": "image/png", "data": "iVBO"})
    );
}

#[test]
fn a_tool_name_anthropic_refuses_is_named_in_the_error() {
    let err = body(
        &[ChatMessage::user("q")],
        &[tool("files.read")],
        &endpoint(),
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`files.read`") && err.contains("rename"),
        "{err}"
    );
}

#[test]
fn ids_map_apart_and_stay_when_valid() {
    assert_eq!(wire_id("toolu_01A-b"), "toolu_01A-b");
    let (a, b) = (wire_id("call.1"), wire_id("call:1"));
    assert_ne!(a, b);
    assert_eq!(a, wire_id("call.1"));
    assert!(wire_id("").len() > 1);
    for id in [a, b, wire_id(""), wire_id("é/ü")] {
        assert!(valid_name(&id) || id.len() > 128, "{id}");
    }
}

#[test]
fn a_whole_reply_gives_text_calls_reasoning_and_the_caches_counts() {
    let reply = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "let me see", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_9", "name": "find", "input": {"q": "x"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 7,
                  "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000}
    });
    let r = parse(&reply.to_string()).unwrap();
    assert_eq!(r.content.as_deref(), Some("Looking."));
    assert_eq!(r.tool_calls, vec![call("toolu_9", "find", r#"{"q":"x"}"#)]);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    let reasoning = r.reasoning.unwrap();
    assert_eq!(reasoning.blocks.len(), 2);
    assert_eq!(reasoning.blocks[0]["signature"], "c2ln");
    let u = r.usage.unwrap();
    assert_eq!(
        (
            u.prompt_tokens,
            u.completion_tokens,
            u.total_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens
        ),
        (1110, 7, 1117, 1000, 100)
    );
    let wrong = parse(r#"{"choices": []}"#).unwrap_err().to_string();
    assert!(wrong.contains("Messages API"), "{wrong}");
}

/// The events of one streamed reply, in the order Anthropic documents.
fn stream_events() -> Vec<Value> {
    vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
               "model": "claude-test", "content": [], "stop_reason": null, "stop_sequence": null,
               "usage": {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 0}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "secret plan"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "ping"}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "On it"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "find", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"q\":"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"x\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "find", "input": {}}}),
        json!({"type": "content_block_stop", "index": 3}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 30}}),
        json!({"type": "message_stop"}),
    ]
}

#[test]
fn a_stream_forwards_text_and_calls_and_keeps_the_thinking_to_itself() {
    let mut stream = Stream::default();
    let mut deltas = Vec::new();
    for e in stream_events() {
        stream
            .handle_event(&e.to_string(), &mut |d| deltas.push(d))
            .unwrap();
    }
    assert!(stream.is_done());
    let r = stream.finish().unwrap();
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Content("On it".into()),
            StreamDelta::ToolCallStarted {
                index: 0,
                id: "toolu_1".into(),
                name: "find".into()
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: "{\"q\":".into()
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: "\"x\"}".into()
            },
            StreamDelta::ToolCallStarted {
                index: 1,
                id: "toolu_2".into(),
                name: "find".into()
            },
        ]
    );
    assert!(!format!("{deltas:?}").contains("secret plan"));
    assert_eq!(r.content.as_deref(), Some("On it"));
    assert_eq!(r.tool_calls[0].arguments, r#"{"q":"x"}"#);
    assert_eq!(r.tool_calls[1].arguments, "{}");
    assert_eq!(
        r.reasoning.unwrap().blocks,
        vec![json!({"type": "thinking", "thinking": "secret plan", "signature": "c2ln"})]
    );
    let u = r.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens),
        (55, 30, 50)
    );
}

#[test]
fn a_stream_error_or_a_cut_is_an_error() {
    let mut stream = Stream::default();
    let err = stream
        .handle_event(
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 529, .. }), "{err}");
    let mut cut = Stream::default();
    cut.handle_event(&stream_events()[0].to_string(), &mut |_| {})
        .unwrap();
    assert!(cut.finish().is_err());
    let mut stray = Stream::default();
    assert!(stray
        .handle_event(
            r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#,
            &mut |_| {}
        )
        .is_err());
}

/// A block's index is the next one or the reply does not read: an index
/// the model names never sizes anything (review 68: 300 bytes asked for
/// gigabytes, or overflowed).
#[test]
fn a_block_starting_anywhere_but_at_the_next_index_is_refused() {
    for index in ["1", "2000000", "1099511627776", "18446744073709551615"] {
        let mut s = Stream::default();
        s.handle_event(&stream_events()[0].to_string(), &mut |_| {})
            .unwrap();
        let start = format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"text","text":""}}}}"#
        );
        let err = s.handle_event(&start, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("where the next is 0"), "{index}: {err}");
    }
    // Starting an open index again is refused too.
    let mut s = Stream::default();
    let start =
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
    s.handle_event(start, &mut |_| {}).unwrap();
    assert!(s.handle_event(start, &mut |_| {}).is_err());
}

/// Counts a model could not have used never overflow, nor reach a store
/// as more than [`Usage::MAX_REPORTED`] (review 68: u64::MAX panicked, and
/// 2^63 sums turned a SQLite report column into a REAL).
#[test]
fn absurd_usage_counts_are_cut_not_summed_past_their_type() {
    let huge = u64::MAX;
    let reply = json!({
        "content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": huge, "output_tokens": huge,
                  "cache_read_input_tokens": huge, "cache_creation_input_tokens": huge}
    });
    let u = parse(&reply.to_string()).unwrap().usage.unwrap();
    assert_eq!(u.prompt_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.completion_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.total_tokens, 2 * Usage::MAX_REPORTED);
    assert!(u.cache_read_tokens + u.cache_write_tokens <= u.prompt_tokens);
    let mut s = Stream::default();
    let start = json!({"type": "message_start", "message": {"usage": {
        "input_tokens": huge, "cache_read_input_tokens": huge, "output_tokens": 1}}});
    for e in [start, json!({"type": "message_stop"})] {
        s.handle_event(&e.to_string(), &mut |_| {}).unwrap();
    }
    assert_eq!(
        s.finish().unwrap().usage.unwrap().prompt_tokens,
        Usage::MAX_REPORTED
    );
}

/// What review 68 found loose in a stream: each is malformed, never kept
/// half or shown as text.
#[test]
fn deltas_of_another_kind_blocks_never_stopped_and_odd_blocks_are_refused() {
    let run = |events: &[Value]| -> Result<ChatResponse, LlmError> {
        let mut s = Stream::default();
        for e in events {
            s.handle_event(&e.to_string(), &mut |_| {})?;
        }
        s.finish()
    };
    let start = |i: usize, block: Value| json!({"type": "content_block_start", "index": i, "content_block": block});
    let delta = |i: usize, d: Value| json!({"type": "content_block_delta", "index": i, "delta": d});
    let stop = json!({"type": "message_stop"});
    let thinking = json!({"type": "thinking", "thinking": "", "signature": ""});
    // Text streamed into a thinking block.
    let err = run(&[
        start(0, thinking.clone()),
        delta(0, json!({"type": "text_delta", "text": "LIVE"})),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("a text_delta for a \"thinking\" block"),
        "{err}"
    );
    // Arguments for a text block.
    assert!(run(&[
        start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "input_json_delta", "partial_json": "{}"}))
    ])
    .is_err());
    // A tool call, or a block of a type Bindery does not take, never stopped.
    for block in [
        json!({"type": "tool_use", "id": "t", "name": "n", "input": {}}),
        json!({"type": "server_tool_use", "id": "s", "name": "web_search"}),
    ] {
        let err = run(&[start(0, block), stop.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("block 0 never stopped"), "{err}");
    }
    // A block that is not an object.
    assert!(run(&[start(0, json!(["text"]))]).is_err());
    // Thinking streamed in many pieces is whole, in order.
    let mut events = vec![start(0, thinking)];
    events.extend((0..1000).map(|i| {
        delta(
            0,
            json!({"type": "thinking_delta", "thinking": format!("{i},")}),
        )
    }));
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.push(stop);
    let r = run(&events).unwrap();
    let text = r.reasoning.unwrap().blocks[0]["thinking"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.starts_with("0,1,2,") && text.ends_with("998,999,"),
        "{text}"
    );
}

/// Two calls never share an id in a request: not an id that maps onto
/// another call's mapping (review 68), nor one the model reused in a later
/// turn; each result answers its own call.
#[test]
fn calls_keep_distinct_ids_and_results_follow_them() {
    let mapped = wire_id("a.b");
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("a.b", "one", "{}"), call(&mapped, "two", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result("a.b", "ONE"),
        ChatMessage::tool_result(&mapped, "TWO"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("toolu_1", "one", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result("toolu_1", "first"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("toolu_1", "one", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result("toolu_1", "again"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let m = body["messages"].as_array().unwrap();
    let uses: Vec<&str> = [1, 3, 5]
        .iter()
        .flat_map(|&i| m[i]["content"].as_array().unwrap())
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<_> = uses.iter().collect();
    assert_eq!(distinct.len(), uses.len(), "{uses:?}");
    // Each result names its own call's id.
    assert_eq!(m[2]["content"][0]["tool_use_id"], uses[0]);
    assert_eq!(m[2]["content"][1]["tool_use_id"], uses[1]);
    assert_eq!(m[2]["content"][1]["content"], "TWO");
    assert_eq!(m[4]["content"][0]["tool_use_id"], uses[2]);
    assert_eq!(m[6]["content"][0]["tool_use_id"], uses[3]);
    assert_eq!(uses[2], "toolu_1");
    assert_eq!(uses[3], "toolu_1_2");
}
