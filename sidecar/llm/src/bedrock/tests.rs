use super::frames::{crc32, MAX_FRAME_BYTES};
use super::*;
use crate::Content;

fn endpoint() -> ModelEndpoint {
    ModelEndpoint::new(
        "https://bedrock-runtime.eu-west-1.amazonaws.com",
        "anthropic.claude-sonnet-4-20250514-v1:0",
    )
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
    serde_json::from_slice(&body(history, tools, e).unwrap()).unwrap()
}

fn cache() -> Value {
    json!({"cachePoint": {"type": "default"}})
}

#[test]
fn the_path_names_the_model_as_one_encoded_segment() {
    let mut e = endpoint();
    assert_eq!(
        path(&e, false),
        "/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse"
    );
    e.model =
        "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.anthropic.claude-x~1".into();
    assert_eq!(
        path(&e, true),
        "/model/arn%3Aaws%3Abedrock%3Aeu-west-1%3A123456789012%3Ainference-profile%2Feu.anthropic.claude-x~1/converse-stream"
    );
    e.model = "a b?é#".into();
    assert_eq!(path(&e, false), "/model/a%20b%3F%C3%A9%23/converse");
}

#[test]
fn a_conversation_becomes_system_tool_use_and_one_user_turn_of_results() {
    let history = vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("look up a and b"),
        ChatMessage::Assistant {
            content: Some("looking".into()),
            tool_calls: vec![
                call("tooluse_1", "find", r#"{"q":"a"}"#),
                call("call.2", "find", r#"{"q":"b"}"#),
            ],
            reasoning: None,
        },
        ChatMessage::tool_result("tooluse_1", "A"),
        ChatMessage::tool_result("call.2", ""),
        ChatMessage::user("and then?"),
    ];
    let body = encoded(&history, &[tool("find"), tool("other")], &endpoint());
    assert!(body.get("modelId").is_none(), "the model is in the path");
    assert!(body.get("stream").is_none());
    assert!(body.get("inferenceConfig").is_none(), "{body}");
    assert!(body.get("additionalModelRequestFields").is_none());
    assert_eq!(body["system"], json!([{"text": "be brief"}, cache()]));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert_eq!(
        messages[0],
        json!({"role": "user", "content": [{"text": "look up a and b"}]})
    );
    assert_eq!(messages[1]["role"], "assistant");
    let uses = messages[1]["content"].as_array().unwrap();
    assert_eq!(uses[0], json!({"text": "looking"}));
    assert_eq!(
        uses[1],
        json!({"toolUse": {"toolUseId": "tooluse_1", "name": "find", "input": {"q": "a"}}})
    );
    // An id the models refuse is mapped, alike in the call and its result.
    let mapped = uses[2]["toolUse"]["toolUseId"].as_str().unwrap();
    assert!(mapped.starts_with("call_2_"), "{mapped}");
    assert_eq!(uses[2]["toolUse"]["input"], json!({"q": "b"}));
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(messages[2]["role"], "user");
    assert_eq!(
        results[0],
        json!({"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "A"}]}})
    );
    assert_eq!(results[1]["toolResult"]["toolUseId"], mapped);
    // An empty result is said, not sent blank (refused).
    assert_eq!(
        results[1]["toolResult"]["content"],
        json!([{"text": "(no output)"}])
    );
    assert_eq!(results[2], json!({"text": "and then?"}));
    // The prefix's end is a cache point, as are the tools' and the system's.
    assert_eq!(results[3], cache());
    assert_eq!(results.len(), 4);
    let tools = body["toolConfig"]["tools"].as_array().unwrap();
    assert_eq!(
        tools[0],
        json!({"toolSpec": {"name": "find", "description": "find things",
               "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "string"}}}}}})
    );
    assert_eq!(tools[2], cache());
    assert_eq!(tools.len(), 3);
    let text = body.to_string();
    assert_eq!(text.matches("cachePoint").count(), 3, "at most 4 in all");
}

#[test]
fn tools_as_sent_and_the_names_bedrock_refuses() {
    let sent = tools(&[ToolDefinition {
        name: "bare".into(),
        description: String::new(),
        parameters: json!(null),
    }])
    .unwrap();
    assert_eq!(
        sent,
        vec![
            json!({"toolSpec": {"name": "bare", "inputSchema": {"json": {"type": "object"}}}}),
            cache()
        ]
    );
    assert!(tools(&[]).unwrap().is_empty());
    for name in ["files.read", "", &"x".repeat(65), "é"] {
        let err = body(&[ChatMessage::user("q")], &[tool(name)], &endpoint())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("`{name}`")) && err.contains("rename"),
            "{err}"
        );
    }
    assert!(tools(&[tool(&"x".repeat(64))]).is_ok());
    let err = tools(&[tool("a"), tool("a")]).unwrap_err().to_string();
    assert!(err.contains("twice"), "{err}");
}

#[test]
fn thinking_is_asked_for_and_its_blocks_go_back_first_in_their_turn() {
    let mut e = endpoint();
    e.thinking_budget = Some(2048);
    e.max_tokens = Some(4096);
    let thought =
        json!({"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig=="}}});
    let redacted = json!({"reasoningContent": {"redactedContent": "b3BhcXVl"}});
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("tooluse_1", "find", "{}")],
            reasoning: Some(Reasoning {
                provider: "bedrock".into(),
                blocks: vec![thought.clone(), redacted.clone()],
                endpoint: None,
            }),
        },
        ChatMessage::tool_result("tooluse_1", "A"),
    ];
    let body = encoded(&history, &[tool("find")], &e);
    assert_eq!(
        body["additionalModelRequestFields"],
        json!({"thinking": {"type": "enabled", "budget_tokens": 2048}})
    );
    assert_eq!(body["inferenceConfig"], json!({"maxTokens": 4096}));
    let turn = body["messages"][1]["content"].as_array().unwrap();
    assert_eq!(turn[0], thought, "byte for byte, first");
    assert_eq!(turn[1], redacted);
    assert!(turn[2].get("toolUse").is_some());

    // Without a maxTokens of the agent's, one past the budget.
    e.max_tokens = None;
    let body = encoded(&history, &[tool("find")], &e);
    assert_eq!(body["inferenceConfig"]["maxTokens"], 2048 + 8192);

    // Another provider's reasoning is not sent; and a turn of calls made
    // without Bedrock's reasoning (a fallback's) goes on without asking
    // for thinking, which Claude would require the turn to begin with.
    let mut other = history.clone();
    if let ChatMessage::Assistant { reasoning, .. } = &mut other[1] {
        reasoning.as_mut().unwrap().provider = "anthropic".into();
    }
    let body = encoded(&other, &[tool("find")], &e);
    assert!(body["messages"][1]["content"][0].get("toolUse").is_some());
    assert!(!body.to_string().contains("reasoningContent"));
    assert!(body.get("additionalModelRequestFields").is_none(), "{body}");
    assert!(body.get("inferenceConfig").is_none(), "{body}");
    // Once that turn is answered, thinking is asked for again.
    other.push(ChatMessage::assistant("done"));
    other.push(ChatMessage::user("and now?"));
    assert_eq!(
        encoded(&other, &[], &e)["additionalModelRequestFields"]["thinking"]["budget_tokens"],
        2048
    );
}

#[test]
fn media_become_image_and_document_blocks_and_a_late_system_message_is_marked() {
    let parts = Content::Parts(vec![
        ContentPart::text("see"),
        ContentPart::ImageUrl {
            image_url: crate::content::ImageUrl {
                url: "data:image/jpeg;base64,/9j/".into(),
            },
        },
        ContentPart::File {
            file: crate::content::FileData {
                filename: "Q3  report.v2 (final).pdf".into(),
                file_data: "data:application/pdf;base64,JVBERi0=".into(),
            },
        },
    ]);
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::assistant("a"),
        ChatMessage::system("a note"),
        ChatMessage::User {
            content: parts.clone(),
        },
    ];
    let body = encoded(&history, &[], &endpoint());
    assert!(body.get("system").is_none());
    let last = &body["messages"][2]["content"];
    assert_eq!(last[0]["text"], "[system] a note");
    assert_eq!(last[1]["text"], "see");
    assert_eq!(
        last[2],
        json!({"image": {"format": "jpeg", "source": {"bytes": "/9j/"}}})
    );
    assert_eq!(
        last[3],
        json!({"document": {"format": "pdf", "name": "Q3 report v2 (final) pdf",
                            "source": {"bytes": "JVBERi0="}}})
    );
    assert_eq!(last[4], cache());
    // A tool's media go in its result.
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("t1", "shot", "{}")],
            reasoning: None,
        },
        ChatMessage::Tool {
            tool_call_id: "t1".into(),
            content: parts,
        },
    ];
    let body = encoded(&history, &[tool("shot")], &endpoint());
    let result = &body["messages"][2]["content"][0]["toolResult"];
    assert_eq!(result["content"][1]["image"]["format"], "jpeg");
    assert_eq!(result["content"][2]["document"]["format"], "pdf");
    // What Bedrock does not take is refused, never sent wrong.
    let bmp = Content::Parts(vec![ContentPart::ImageUrl {
        image_url: crate::content::ImageUrl {
            url: "data:image/bmp;base64,Qk0=".into(),
        },
    }]);
    let err = body_of(vec![ChatMessage::User { content: bmp }]).unwrap_err();
    assert!(err.to_string().contains("image/bmp"), "{err}");
    let not_data = Content::Parts(vec![ContentPart::ImageUrl {
        image_url: crate::content::ImageUrl {
            url: "https://example.com/a.png".into(),
        },
    }]);
    assert!(body_of(vec![ChatMessage::User { content: not_data }]).is_err());
    assert_eq!(document_name("..."), "document");
    assert_eq!(document_name(&"a".repeat(300)).len(), 200);
}

fn body_of(history: Vec<ChatMessage>) -> Result<Bytes, LlmError> {
    body(&history, &[], &endpoint())
}

#[test]
fn turns_alternate_empty_ones_are_left_out_and_blank_text_never_sent() {
    let history = vec![
        ChatMessage::system(""),
        ChatMessage::user("one"),
        ChatMessage::Assistant {
            content: Some("  ".into()),
            tool_calls: vec![],
            reasoning: None,
        },
        ChatMessage::user(""),
        ChatMessage::user("two"),
        ChatMessage::assistant("first"),
        ChatMessage::assistant("second"),
        ChatMessage::user("three"),
    ];
    let body = encoded(&history, &[], &endpoint());
    assert!(body.get("system").is_none());
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(
        body["messages"][0]["content"],
        json!([{"text": "one"}, {"text": "two"}])
    );
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"text": "first"}, {"text": "second"}])
    );
    assert!(!body.to_string().contains(r#""text":"""#), "{body}");
}

#[test]
fn without_tools_on_offer_earlier_calls_and_results_are_said_as_text() {
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("t1", "find", r#"{"q":"a"}"#)],
            reasoning: None,
        },
        ChatMessage::tool_result("t1", "A"),
        ChatMessage::user("sum up"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let text = body.to_string();
    assert!(
        !text.contains("toolUse") && !text.contains("toolResult"),
        "{text}"
    );
    assert!(body.get("toolConfig").is_none());
    assert_eq!(
        body["messages"][1]["content"][0]["text"],
        r#"[call t1: the tool `find` with {"q":"a"}]"#
    );
    assert_eq!(
        body["messages"][2]["content"],
        json!([{"text": "[the result of call t1]"}, {"text": "A"}, {"text": "sum up"}, cache()])
    );
}

#[test]
fn ids_map_apart_stay_when_valid_and_within_64() {
    assert_eq!(wire_id("tooluse_01A-b"), "tooluse_01A-b");
    let (a, b) = (wire_id("call.1"), wire_id("call:1"));
    assert_ne!(a, b);
    assert_eq!(a, wire_id("call.1"));
    let long = "x".repeat(65);
    for id in [
        a,
        b,
        wire_id(""),
        wire_id("é/ü"),
        wire_id(&long),
        wire_id(&"é".repeat(100)),
    ] {
        assert!(valid_name(&id), "{id}");
    }
    // A valid id of 64 reused: the suffixed one is cut to stay within 64.
    let sixty_four = "y".repeat(64);
    let mut ids = Ids::new(IDS);
    assert_eq!(ids.of_call(&sixty_four), sixty_four);
    for n in 2..=12 {
        let again = ids.of_call(&sixty_four);
        assert!(valid_name(&again), "{again}");
        assert!(again.ends_with(&format!("_{n}")), "{again}");
    }
}

/// Two calls never share an id in a request: not an id that maps onto
/// another call's mapping, nor one the model reused in a later turn; each
/// result answers its own call.
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
            tool_calls: vec![call("t_1", "one", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result("t_1", "first"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("t_1", "one", "not json")],
            reasoning: None,
        },
        ChatMessage::tool_result("t_1", "again"),
    ];
    let body = encoded(&history, &[tool("one"), tool("two")], &endpoint());
    let m = body["messages"].as_array().unwrap();
    let uses: Vec<&str> = [1, 3, 5]
        .iter()
        .flat_map(|&i| m[i]["content"].as_array().unwrap())
        .map(|b| b["toolUse"]["toolUseId"].as_str().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<_> = uses.iter().collect();
    assert_eq!(distinct.len(), uses.len(), "{uses:?}");
    let result = |i: usize, j: usize| &m[i]["content"][j]["toolResult"];
    assert_eq!(result(2, 0)["toolUseId"], uses[0]);
    assert_eq!(result(2, 1)["toolUseId"], uses[1]);
    assert_eq!(result(2, 1)["content"][0]["text"], "TWO");
    assert_eq!(result(4, 0)["toolUseId"], uses[2]);
    assert_eq!(result(6, 0)["toolUseId"], uses[3]);
    assert_eq!(uses[2], "t_1");
    assert_eq!(uses[3], "t_1_2");
    // Arguments that are no object are sent as one.
    assert_eq!(
        m[5]["content"][0]["toolUse"]["input"],
        json!({"arguments": "not json"})
    );
}

fn whole_reply() -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "let me see", "signature": "c2ln"}}},
            {"reasoningContent": {"redactedContent": "b3BhcXVl"}},
            {"text": "Looking."},
            {"toolUse": {"toolUseId": "tooluse_9", "name": "find", "input": {"q": "x"}}},
            {"toolUse": {"toolUseId": "tooluse_10", "name": "find", "input": {}}}
        ]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 7, "totalTokens": 1117,
                  "cacheReadInputTokens": 1000, "cacheWriteInputTokens": 100},
        "metrics": {"latencyMs": 12}
    })
}

#[test]
fn a_whole_reply_gives_text_calls_reasoning_and_the_caches_counts() {
    let r = parse(&whole_reply().to_string()).unwrap();
    assert_eq!(r.content.as_deref(), Some("Looking."));
    assert_eq!(
        r.tool_calls,
        vec![
            call("tooluse_9", "find", r#"{"q":"x"}"#),
            call("tooluse_10", "find", "{}")
        ]
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    let reasoning = r.reasoning.clone().unwrap();
    assert_eq!(reasoning.provider, "bedrock");
    assert_eq!(
        reasoning.blocks,
        whole_reply()["output"]["message"]["content"]
            .as_array()
            .unwrap()[..2]
            .to_vec()
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
        (1110, 7, 1117, 1000, 100)
    );
    // The reply goes back as it came: reasoning first, then text and calls.
    let history = vec![ChatMessage::user("q"), r.to_message()];
    let body = encoded(&history, &[tool("find")], &endpoint());
    assert_eq!(
        body["messages"][1]["content"].as_array().unwrap()[..5],
        whole_reply()["output"]["message"]["content"]
            .as_array()
            .unwrap()[..]
    );
    let wrong = parse(r#"{"choices": []}"#).unwrap_err().to_string();
    assert!(wrong.contains("Converse API"), "{wrong}");
}

#[test]
fn stop_reasons_read_as_bindery_says_them() {
    for (stop, said) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("malformed_tool_use", "malformed_tool_use"),
    ] {
        let reply = json!({"output": {"message": {"role": "assistant", "content": []}},
                           "stopReason": stop});
        let r = parse(&reply.to_string()).unwrap();
        assert_eq!(r.finish_reason.as_deref(), Some(said));
        assert_eq!(r.content, None);
        assert_eq!(r.usage, None);
    }
}

#[test]
fn a_malformed_whole_reply_is_refused_never_a_panic() {
    let with = |block: Value| {
        json!({"output": {"message": {"role": "assistant", "content": [block]}},
               "stopReason": "end_turn"})
        .to_string()
    };
    for (text, says) in [
        ("", "not JSON"),
        ("[]", "Converse API"),
        (
            r#"{"output": {"message": {"content": {}}}}"#,
            "Converse API",
        ),
        (&with(json!({"text": "a", "toolUse": {}})), "one member"),
        (&with(json!({})), "one member"),
        (&with(json!("text")), "one member"),
        (&with(json!({"text": 5})), "not a string"),
        (
            &with(json!({"toolUse": {"name": "f", "input": {}}})),
            "id or name",
        ),
        (
            &with(json!({"toolUse": {"toolUseId": "t", "input": {}}})),
            "id or name",
        ),
        (&with(json!({"toolUse": "x"})), "id or name"),
        (&with(json!({"reasoningContent": "x"})), "does not take"),
        (
            &with(
                json!({"toolUse": {"toolUseId": "s", "name": "web", "input": {}, "type": "server_tool_use"}}),
            ),
            "server tool",
        ),
        (&with(json!({"citationsContent": {}})), "does not take"),
        (&with(json!({"image": {"format": "png"}})), "does not take"),
    ] {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}

/// Counts a model could not have used never overflow, nor reach a store
/// as more than [`Usage::MAX_REPORTED`].
#[test]
fn absurd_usage_counts_are_cut_not_summed_past_their_type() {
    let huge = u64::MAX;
    let reply = json!({
        "output": {"message": {"role": "assistant", "content": [{"text": "x"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": huge, "outputTokens": huge, "totalTokens": huge,
                  "cacheReadInputTokens": huge, "cacheWriteInputTokens": huge}
    });
    let u = parse(&reply.to_string()).unwrap().usage.unwrap();
    assert_eq!(u.prompt_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.completion_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.total_tokens, 2 * Usage::MAX_REPORTED);
    assert!(u.cache_read_tokens + u.cache_write_tokens <= u.prompt_tokens);
    let negative = json!({"output": {"message": {"content": []}},
                          "usage": {"inputTokens": -5, "outputTokens": 1.5}});
    let u = parse(&negative.to_string()).unwrap().usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (0, 0));
}

// The event stream.

/// One message of AWS's event-stream encoding, string headers only.
fn message(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (name, value) in headers {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value.as_bytes());
    }
    raw_message(&h, payload)
}

fn raw_message(headers: &[u8], payload: &[u8]) -> Vec<u8> {
    let total = 12 + headers.len() + payload.len() + 4;
    let mut m = Vec::new();
    m.extend_from_slice(&(total as u32).to_be_bytes());
    m.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    let crc = crc32(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m.extend_from_slice(headers);
    m.extend_from_slice(payload);
    let crc = crc32(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m
}

fn event(kind: &str, payload: &Value) -> Vec<u8> {
    message(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

fn exception_message(kind: &str, text: &str) -> Vec<u8> {
    message(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json!({"message": text}).to_string().as_bytes(),
    )
}

/// The events of one streamed reply in the order Bedrock documents, each
/// with the random `p` padding the service adds to its payloads.
fn stream_events() -> Vec<(&'static str, Value)> {
    vec![
        ("messageStart", json!({"role": "assistant", "p": "abcdef"})),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "secret "}}, "p": "ab"}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "plan"}}}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "c2ln"}}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 1, "delta": {"text": "On "}}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 1, "delta": {"text": "it"}}),
        ),
        (
            "contentBlockStop",
            json!({"contentBlockIndex": 1, "p": "abcdefghij"}),
        ),
        (
            "contentBlockStart",
            json!({"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "find"}}}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "{\"q\":"}}}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "\"x\"}"}}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 2})),
        (
            "contentBlockStart",
            json!({"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "tooluse_2", "name": "find"}}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 3})),
        ("messageStop", json!({"stopReason": "tool_use"})),
        (
            "metadata",
            json!({"usage": {"inputTokens": 5, "outputTokens": 30, "totalTokens": 85,
                                      "cacheReadInputTokens": 50, "cacheWriteInputTokens": 0},
                            "metrics": {"latencyMs": 100}, "p": "abc"}),
        ),
    ]
}

fn stream_bytes() -> Vec<u8> {
    stream_events()
        .iter()
        .flat_map(|(kind, payload)| event(kind, payload))
        .collect()
}

/// `bytes` fed in chunks of `step` (split mid-message, mid-header), each
/// frame handed to a stream.
fn run_stream(bytes: &[u8], step: usize) -> Result<(Stream, Vec<StreamDelta>), LlmError> {
    let mut frames = Frames::default();
    let mut stream = Stream::default();
    let mut deltas = Vec::new();
    for chunk in bytes.chunks(step) {
        for frame in frames.feed(chunk)? {
            stream.handle_frame(&frame, &mut |d| deltas.push(d))?;
        }
    }
    assert!(frames.is_empty());
    Ok((stream, deltas))
}

#[test]
fn a_stream_forwards_text_and_calls_and_keeps_the_reasoning_to_itself() {
    for step in [1, 7, 64, 100_000] {
        let (stream, deltas) = run_stream(&stream_bytes(), step).unwrap();
        assert!(stream.is_done());
        let r = stream.finish().unwrap();
        assert_eq!(
            deltas,
            vec![
                StreamDelta::Content("On ".into()),
                StreamDelta::Content("it".into()),
                StreamDelta::ToolCallStarted {
                    index: 0,
                    id: "tooluse_1".into(),
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
                    id: "tooluse_2".into(),
                    name: "find".into()
                },
            ]
        );
        assert!(!format!("{deltas:?}").contains("secret"));
        assert_eq!(r.content.as_deref(), Some("On it"));
        assert_eq!(r.tool_calls[0].arguments, r#"{"q":"x"}"#);
        assert_eq!(r.tool_calls[1].arguments, "{}");
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.reasoning.unwrap().blocks,
            vec![
                json!({"reasoningContent": {"reasoningText": {"text": "secret plan", "signature": "c2ln"}}})
            ]
        );
        let u = r.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens),
            (55, 30, 50)
        );
    }
}

#[test]
fn a_stream_is_done_after_its_metadata_and_whole_without_it() {
    let mut frames = Frames::default();
    let mut stream = Stream::default();
    let events = stream_events();
    let (last, rest) = events.split_last().unwrap();
    for (kind, payload) in rest {
        for f in frames.feed(&event(kind, payload)).unwrap() {
            stream.handle_frame(&f, &mut |_| {}).unwrap();
        }
    }
    assert!(!stream.is_done(), "the usage comes after messageStop");
    let f = frames.feed(&event(last.0, &last.1)).unwrap();
    stream.handle_frame(&f[0], &mut |_| {}).unwrap();
    assert!(stream.is_done());
    // A stream cut after messageStop is whole, without its usage.
    let (stream, _) = run_stream(
        &rest
            .iter()
            .flat_map(|(k, p)| event(k, p))
            .collect::<Vec<_>>(),
        5,
    )
    .unwrap();
    let r = stream.finish().unwrap();
    assert_eq!(r.usage, None);
    assert_eq!(r.tool_calls.len(), 2);
}

#[test]
fn redacted_reasoning_streamed_in_pieces_is_its_bytes_together() {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let events = [
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": b64(b"opa")}}}),
        ),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": b64(b"que")}}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 1, "delta": {"text": "hi"}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 1})),
        ("messageStop", json!({"stopReason": "end_turn"})),
    ];
    let bytes: Vec<u8> = events.iter().flat_map(|(k, p)| event(k, p)).collect();
    let (stream, _) = run_stream(&bytes, 3).unwrap();
    let r = stream.finish().unwrap();
    assert_eq!(
        r.reasoning.unwrap().blocks,
        vec![json!({"reasoningContent": {"redactedContent": b64(b"opaque")}})]
    );
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn the_stream_s_exceptions_are_the_http_errors_they_stand_for() {
    for (kind, status) in [
        ("throttlingException", 429),
        ("serviceUnavailableException", 503),
        ("internalServerException", 500),
        ("modelStreamErrorException", 500),
        ("validationException", 400),
        ("somethingNewException", 500),
    ] {
        let mut bytes = event("messageStart", &json!({"role": "assistant"}));
        bytes.extend(exception_message(kind, "Too many tokens, please wait"));
        let err = Frames::default().feed(&bytes).unwrap_err();
        match err {
            LlmError::Http { status: s, body } => {
                assert_eq!(s, status, "{kind}");
                assert!(
                    body.contains(kind) && body.contains("please wait"),
                    "{body}"
                );
            }
            other => panic!("{kind}: {other}"),
        }
    }
    let error = message(
        &[
            (":message-type", "error"),
            (":error-code", "ThrottlingException"),
            (":error-message", "slow down"),
        ],
        b"",
    );
    let err = Frames::default().feed(&error).unwrap_err();
    assert!(
        matches!(err, LlmError::Http { status: 429, ref body } if body.contains("slow down")),
        "{err}"
    );
    // A long message is cut to an excerpt.
    let long = exception_message("validationException", &"x".repeat(10_000));
    let LlmError::Http { body, .. } = Frames::default().feed(&long).unwrap_err() else {
        panic!()
    };
    assert!(body.chars().count() < 400);
}

#[test]
fn the_crc_is_the_event_stream_s() {
    // The CRC-32 check value, and a frame botocore's EventStreamBuffer
    // decodes (written by tests/providers/bedrock.py's encoder).
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    let mut frames = Frames::default();
    let got = frames.feed(&hex(BOTOCORE_FRAME)).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event_type, "messageStop");
    assert_eq!(&got[0].payload[..], br#"{"stopReason":"end_turn"}"#);
}

/// A `messageStop` event as tests/providers/bedrock.py encodes it (its
/// self-test decodes that with botocore).
const BOTOCORE_FRAME: &str = "0000007a00000051ca2c46650b3a6576656e742d7479706507000b6d65737361676553746f700d3a636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e0d3a6d6573736167652d747970650700056576656e747b2273746f70526561736f6e223a22656e645f7475726e227d5fbf09fc";

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn frames_that_lie_or_fail_their_crc_are_refused() {
    let good = event("messageStop", &json!({"stopReason": "end_turn"}));
    let refused = |bytes: &[u8], says: &str| {
        let err = Frames::default().feed(bytes).unwrap_err().to_string();
        assert!(err.contains(says), "{says}: {err}");
    };
    // A bit flipped in the prelude, in the headers, in the payload.
    for (at, says) in [
        (1, "prelude fails its CRC"),
        (20, "fails its CRC"),
        (good.len() - 6, "fails its CRC"),
    ] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        refused(&bad, says);
    }
    // Lengths: over 16 MiB, under the least, headers past the message.
    let prelude = |total: u32, headers: u32| {
        let mut m = total.to_be_bytes().to_vec();
        m.extend_from_slice(&headers.to_be_bytes());
        let crc = crc32(&m);
        m.extend_from_slice(&crc.to_be_bytes());
        m
    };
    refused(&prelude(MAX_FRAME_BYTES as u32 + 1, 0), "bytes (from 16");
    refused(&prelude(u32::MAX, 0), "bytes (from 16");
    refused(&prelude(15, 0), "bytes (from 16");
    refused(&prelude(100, 85), "says its headers take 85");
    refused(&prelude(1 << 20, 200 << 10), "says its headers take");
    // Nothing is kept of a frame refused by its prelude alone: no waiting
    // for 16 MiB that will never be taken.
    let mut frames = Frames::default();
    assert!(frames
        .feed(&prelude(MAX_FRAME_BYTES as u32, 0))
        .unwrap()
        .is_empty());
    assert!(!frames.is_empty());
    // A header block that does not end where it says.
    for headers in [
        &[11u8, b':', b'e'][..],                // a name cut
        &[1, b'a', 7, 0, 9, b'x'][..],          // a string cut
        &[1, b'a', 9, 1, 2, 3][..],             // a uuid cut
        &[1, b'a', 5, 0, 0, 0, 0, 0, 0, 0][..], // a long cut
        &[1, b'a'][..],                         // no type
    ] {
        refused(&raw_message(headers, b"{}"), "does not end where it says");
    }
    refused(&raw_message(&[1, b'a', 42], b""), "of type 42");
    // Every header type is read, and passed over but those Bindery reads.
    let mut all = vec![1, b'a', 0, 1, b'b', 1, 1, b'c', 2, 9, 1, b'd', 3, 0, 1];
    all.extend([1, b'e', 4, 0, 0, 0, 1, 1, b'f', 5, 0, 0, 0, 0, 0, 0, 0, 1]);
    all.extend([
        1, b'g', 6, 0, 2, 0xff, 0xfe, 1, b'h', 8, 0, 0, 0, 0, 0, 0, 0, 1,
    ]);
    all.extend([1, b'i', 9]);
    all.extend([0u8; 16]);
    for (name, value) in [(":message-type", "event"), (":event-type", "messageStart")] {
        all.push(name.len() as u8);
        all.extend_from_slice(name.as_bytes());
        all.push(7);
        all.extend_from_slice(&(value.len() as u16).to_be_bytes());
        all.extend_from_slice(value.as_bytes());
    }
    let frames = Frames::default().feed(&raw_message(&all, b"{}")).unwrap();
    assert_eq!(frames[0].event_type, "messageStart");
    // The headers Bindery reads: strings, once each, an event's type given.
    let mut int_type = vec![13u8];
    int_type.extend_from_slice(b":message-type");
    int_type.extend([4, 0, 0, 0, 1]);
    refused(&raw_message(&int_type, b""), "not a string");
    refused(
        &message(
            &[(":message-type", "event"), (":message-type", "event")],
            b"",
        ),
        "given twice",
    );
    refused(
        &message(&[(":message-type", "event")], b"{}"),
        "without an `:event-type`",
    );
    refused(
        &message(&[(":event-type", "messageStart")], b"{}"),
        "of type None",
    );
    refused(
        &message(&[(":message-type", "ping"), (":event-type", "x")], b""),
        "of type Some(\"ping\")",
    );
    // A stream cut mid-message leaves bytes waiting.
    let mut frames = Frames::default();
    assert!(frames.feed(&good[..good.len() - 1]).unwrap().is_empty());
    assert!(!frames.is_empty());
    assert_eq!(frames.feed(&good[good.len() - 1..]).unwrap().len(), 1);
    assert!(frames.is_empty());
}

fn frame(kind: &str, payload: Value) -> Frame {
    Frame {
        event_type: kind.into(),
        payload: Bytes::from(payload.to_string()),
    }
}

fn run(events: &[(&str, Value)]) -> Result<ChatResponse, LlmError> {
    let mut s = Stream::default();
    for (kind, payload) in events {
        s.handle_frame(&frame(kind, payload.clone()), &mut |_| {})?;
    }
    s.finish()
}

/// A block's index is the next one or an open one, or the reply does not
/// read: an index the model names never sizes anything.
#[test]
fn a_block_anywhere_but_at_the_next_index_is_refused() {
    for index in [
        json!(1),
        json!(2000000),
        json!(1099511627776u64),
        json!(u64::MAX),
    ] {
        for (kind, payload) in [
            (
                "contentBlockDelta",
                json!({"contentBlockIndex": index, "delta": {"text": "x"}}),
            ),
            (
                "contentBlockStart",
                json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": "t", "name": "n"}}}),
            ),
            ("contentBlockStop", json!({"contentBlockIndex": index})),
        ] {
            let err = run(&[(kind, payload)]).unwrap_err().to_string();
            assert!(
                err.contains("not open") || err.contains("where the next is 0"),
                "{index}: {err}"
            );
        }
    }
    for index in [json!(-1), json!(0.5), json!("0"), json!(null)] {
        let err = run(&[(
            "contentBlockDelta",
            json!({"contentBlockIndex": index, "delta": {"text": "x"}}),
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("without an index"), "{err}");
    }
    // A stopped block takes no more, nor starts again.
    let text = |i: usize| {
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": i, "delta": {"text": "x"}}),
        )
    };
    let stop = |i: usize| ("contentBlockStop", json!({"contentBlockIndex": i}));
    assert!(run(&[text(0), stop(0), text(0)]).is_err());
    assert!(run(&[text(0), stop(0), stop(0)]).is_err());
    let start = (
        "contentBlockStart",
        json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t", "name": "n"}}}),
    );
    assert!(run(&[text(0), start.clone()]).is_err());
    assert!(run(&[start.clone(), start]).is_err());
}

/// What a hostile or broken stream may send: each is malformed, never
/// kept half or shown as text.
#[test]
fn deltas_of_another_kind_odd_events_and_blocks_never_stopped_are_refused() {
    let delta = |i: usize, d: Value| {
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": i, "delta": d}),
        )
    };
    let start_tool = (
        "contentBlockStart",
        json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t", "name": "n"}}}),
    );
    let stop = ("messageStop", json!({"stopReason": "end_turn"}));
    let reasoning = delta(0, json!({"reasoningContent": {"text": "hm"}}));
    for (events, says) in [
        // Text streamed into reasoning, reasoning into text, arguments
        // into text, text into a call, a signature into redacted bytes.
        (
            vec![reasoning.clone(), delta(0, json!({"text": "LIVE"}))],
            "a text delta for a reasoning block",
        ),
        (
            vec![delta(0, json!({"text": "a"})), reasoning.clone()],
            "a reasoningContent delta for a text block",
        ),
        (
            vec![delta(0, json!({"toolUse": {"input": "{}"}}))],
            "a toolUse delta for a new block",
        ),
        (
            vec![start_tool.clone(), delta(0, json!({"text": "a"}))],
            "a text delta for a toolUse block",
        ),
        (
            vec![
                delta(0, json!({"reasoningContent": {"redactedContent": "AA=="}})),
                delta(0, json!({"reasoningContent": {"signature": "s"}})),
            ],
            "another delta",
        ),
        (
            vec![
                reasoning.clone(),
                delta(0, json!({"reasoningContent": {"redactedContent": "AA=="}})),
            ],
            "another kind",
        ),
        (
            vec![delta(
                0,
                json!({"reasoningContent": {"redactedContent": "not base64!"}}),
            )],
            "not base64",
        ),
        (
            vec![delta(
                0,
                json!({"reasoningContent": {"text": "a", "signature": "s"}}),
            )],
            "another kind",
        ),
        (
            vec![delta(0, json!({"reasoningContent": "x"}))],
            "another kind",
        ),
        (vec![delta(0, json!({"citation": {}}))], "a citation delta"),
        (vec![delta(0, json!({"text": 5}))], "not a string"),
        (
            vec![
                start_tool.clone(),
                delta(0, json!({"toolUse": {"input": {"q": 1}}})),
            ],
            "not a string",
        ),
        (
            vec![delta(0, json!({"text": "a", "toolUse": {}}))],
            "not one member",
        ),
        (vec![delta(0, json!({}))], "not one member"),
        (
            vec![("contentBlockDelta", json!({"contentBlockIndex": 0}))],
            "without a `delta`",
        ),
        // Starts Bindery does not take, or without their id and name.
        (
            vec![(
                "contentBlockStart",
                json!({"contentBlockIndex": 0, "start": {"toolResult": {"toolUseId": "t"}}}),
            )],
            "does not take",
        ),
        (
            vec![(
                "contentBlockStart",
                json!({"contentBlockIndex": 0, "start": {"toolUse": {"name": "n"}}}),
            )],
            "id or name",
        ),
        (
            vec![("contentBlockStart", json!({"contentBlockIndex": 0}))],
            "without a `start`",
        ),
        (
            vec![(
                "contentBlockStart",
                json!({"contentBlockIndex": 0, "start": {"toolUse": {
                    "toolUseId": "s", "name": "web", "type": "server_tool_use"}}}),
            )],
            "server tool",
        ),
        // Blocks never stopped; no messageStop; one without its reason.
        (
            vec![start_tool.clone(), stop.clone()],
            "block 0 never stopped",
        ),
        (vec![reasoning, stop.clone()], "block 0 never stopped"),
        (
            vec![("messageStart", json!({"role": "assistant"}))],
            "before `messageStop`",
        ),
        (vec![("messageStop", json!({}))], "without its stopReason"),
        (vec![("metadata", json!([]))], "not an object"),
    ] {
        let err = run(&events).unwrap_err().to_string();
        assert!(err.contains(says), "{says}: {err}");
    }
    let mut s = Stream::default();
    let not_json = Frame {
        event_type: "messageStart".into(),
        payload: Bytes::from_static(b"\xff\xfe{"),
    };
    assert!(s.handle_frame(&not_json, &mut |_| {}).is_err());
    // Events added after this version are passed over; an empty start
    // opens a block its first delta gives a kind.
    let r = run(&[
        ("somethingNew", json!({"x": 1})),
        (
            "contentBlockStart",
            json!({"contentBlockIndex": 0, "start": {}}),
        ),
        delta(0, json!({"text": "ok"})),
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        stop,
    ])
    .unwrap();
    assert_eq!(r.content.as_deref(), Some("ok"));
}

#[test]
fn a_long_block_streamed_in_many_pieces_is_whole_in_order() {
    let mut events = Vec::new();
    for i in 0..1000 {
        events.push((
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": format!("{i},")}}}),
        ));
    }
    events.push(("contentBlockStop", json!({"contentBlockIndex": 0})));
    events.push(("messageStop", json!({"stopReason": "end_turn"})));
    let r = run(&events).unwrap();
    let blocks = r.reasoning.unwrap().blocks;
    let text = blocks[0]["reasoningContent"]["reasoningText"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.starts_with("0,1,2,") && text.ends_with("998,999,"),
        "{text}"
    );
    assert!(blocks[0]["reasoningContent"]["reasoningText"]
        .get("signature")
        .is_none());
}
