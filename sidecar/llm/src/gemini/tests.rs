use super::*;
use crate::content::{FileData, ImageUrl};

fn endpoint() -> ModelEndpoint {
    ModelEndpoint::new("http://x/v1beta", "gemini-test")
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

/// Gemini's answer to "look up a and b" with thinking on: a thought, then
/// two parallel calls, the first signed, no ids (Gemini's API gives none).
fn gemini_turn() -> Vec<Value> {
    vec![
        json!({"text": "I should look both up", "thought": true}),
        json!({"functionCall": {"name": "find", "args": {"q": "a"}}, "thoughtSignature": "c2lnLWE="}),
        json!({"functionCall": {"name": "find", "args": {"q": "b"}}}),
    ]
}

fn reply_of(parts: Vec<Value>, finish: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10, "thoughtsTokenCount": 30,
                          "cachedContentTokenCount": 60, "totalTokenCount": 140},
        "modelVersion": "gemini-test", "responseId": "resp-1"
    })
}

#[test]
fn a_two_turn_tool_conversation_becomes_system_instruction_and_user_model_turns() {
    let history = vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("look up a"),
        ChatMessage::Assistant {
            content: Some("looking".into()),
            tool_calls: vec![call("call_1", "find", r#"{"q":"a"}"#)],
            reasoning: None,
        },
        ChatMessage::tool_result("call_1", r#"{"found": true}"#),
    ];
    let mut e = endpoint();
    e.max_tokens = Some(1000);
    let body = encoded(&history, &[tool("find"), tool("files.read")], &e);
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "be brief"}]})
    );
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3, "{contents:#?}");
    assert_eq!(
        contents[0],
        json!({"role": "user", "parts": [{"text": "look up a"}]})
    );
    // A call made without Gemini's signature carries the documented
    // sentinel on the turn's first call; our id never goes on the wire.
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [
            {"text": "looking"},
            {"functionCall": {"name": "find", "args": {"q": "a"}},
             "thoughtSignature": "skip_thought_signature_validator"}
        ]})
    );
    // The result is named as its call, its text whole under `output`.
    assert_eq!(
        contents[2],
        json!({"role": "user", "parts": [{"functionResponse": {
            "name": "find", "response": {"output": "{\"found\": true}"}}}]})
    );
    assert_eq!(body["generationConfig"], json!({"maxOutputTokens": 1000}));
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [
            {"name": "find", "description": "find things",
             "parametersJsonSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
            {"name": "files.read", "description": "files.read things",
             "parametersJsonSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        ]}])
    );
    // Nothing asked: no generationConfig, no tools.
    let bare = encoded(&[ChatMessage::user("hi")], &[], &endpoint());
    assert_eq!(
        bare,
        json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    );
}

#[test]
fn parallel_results_go_in_one_user_turn_before_what_the_user_says_next() {
    let history = vec![
        ChatMessage::user("look up a and b"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![
                call("x1", "find", r#"{"q":"a"}"#),
                call("x2", "lookup", r#"{"q":"b"}"#),
            ],
            reasoning: None,
        },
        ChatMessage::tool_result("x1", "A"),
        ChatMessage::tool_result("x2", "B"),
        ChatMessage::system("a note"),
        ChatMessage::user("and then?"),
    ];
    let body = encoded(&history, &[], &endpoint());
    assert!(body.get("systemInstruction").is_none());
    let c = body["contents"].as_array().unwrap();
    assert_eq!(c.len(), 3);
    let calls = c[1]["parts"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].get("thoughtSignature").is_none(), "only the first");
    assert_eq!(
        c[2]["parts"],
        json!([
            {"functionResponse": {"name": "find", "response": {"output": "A"}}},
            {"functionResponse": {"name": "lookup", "response": {"output": "B"}}},
            {"text": "[system] a note"},
            {"text": "and then?"},
        ])
    );
}

#[test]
fn a_result_of_no_call_before_it_is_said_as_text() {
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::assistant("nothing to call"),
        ChatMessage::tool_result("lost", "out"),
    ];
    let body = encoded(&history, &[], &endpoint());
    assert_eq!(
        body["contents"][2]["parts"],
        json!([{"text": "[output of tool call lost]\nout"}])
    );
}

#[test]
fn media_become_inline_data_and_a_tools_media_follow_the_results() {
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
            tool_calls: vec![call("s", "shot", "{}"), call("t", "find", "{}")],
            reasoning: None,
        },
        ChatMessage::Tool {
            tool_call_id: "s".into(),
            content: Content::Parts(vec![ContentPart::text("taken"), png]),
        },
        ChatMessage::tool_result("t", "found"),
    ];
    let body = encoded(&history, &[], &endpoint());
    let c = body["contents"].as_array().unwrap();
    assert_eq!(
        c[0]["parts"],
        json!([
            {"text": "see"},
            {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
            {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
        ])
    );
    let parts = c[2]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 4, "{parts:#?}");
    let output = parts[0]["functionResponse"]["response"]["output"]
        .as_str()
        .unwrap();
    assert!(output.starts_with("taken\n[image/png attached"), "{output}");
    assert_eq!(parts[1]["functionResponse"]["name"], "find");
    assert_eq!(
        parts[2]["text"],
        "[output of tool call s, not a message from the user]"
    );
    assert_eq!(parts[3]["inlineData"]["mimeType"], "image/png");
    // A medium that is not a data URL is refused.
    let bad = ChatMessage::User {
        content: Content::Parts(vec![ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: "https://example.com/a.png".into(),
            },
        }]),
    };
    let err = body_err(&[bad]);
    assert!(err.contains("data URL"), "{err}");
}

fn body_err(history: &[ChatMessage]) -> String {
    body(history, &[], &endpoint(), false)
        .unwrap_err()
        .to_string()
}

#[test]
fn gemini_turns_go_back_part_for_part_with_their_signatures_and_ids() {
    let mut parts = gemini_turn();
    // A model that gives ids (the Gemini API on some models) gets them back.
    parts[2]["functionCall"]["id"] = json!("gem-2");
    let r = parse(&reply_of(parts.clone(), "STOP").to_string()).unwrap();
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(r.tool_calls[1].id, "gem-2");
    let reasoning = r.reasoning.clone().unwrap();
    assert_eq!(reasoning.provider, "gemini");
    assert_eq!(reasoning.blocks, parts);
    let mut history = vec![ChatMessage::user("look up a and b"), r.to_message()];
    for c in &r.tool_calls {
        history.push(ChatMessage::tool_result(&c.id, c.name.to_uppercase()));
    }
    let mut e = endpoint();
    e.thinking_budget = Some(2048);
    let body = encoded(&history, &[tool("find")], &e);
    assert_eq!(
        body["generationConfig"],
        json!({"thinkingConfig": {"thinkingBudget": 2048}})
    );
    let c = body["contents"].as_array().unwrap();
    assert_eq!(c[1], json!({"role": "model", "parts": parts}));
    assert_eq!(
        c[2]["parts"],
        json!([
            {"functionResponse": {"name": "find", "response": {"output": "FIND"}}},
            {"functionResponse": {"name": "find", "id": "gem-2", "response": {"output": "FIND"}}},
        ])
    );
    // Another provider's reasoning is never sent: the turn is rebuilt,
    // its first call with the sentinel.
    let mut other = history.clone();
    if let ChatMessage::Assistant { reasoning, .. } = &mut other[1] {
        reasoning.as_mut().unwrap().provider = "anthropic".into();
    }
    let body = encoded(&other, &[], &e);
    let turn = body["contents"][1]["parts"].as_array().unwrap();
    assert_eq!(turn.len(), 2);
    assert!(!body.to_string().contains("I should look"), "{body}");
    assert!(!body.to_string().contains("c2lnLWE="));
    assert_eq!(turn[0]["thoughtSignature"], FOREIGN_SIGNATURE);
    assert!(turn[1]["functionCall"].get("id").is_none());
    assert!(body["contents"][2]["parts"][1]["functionResponse"]
        .get("id")
        .is_none());
    // A message changed since (its calls, or its text) no longer matches
    // its parts: rebuilt the same way, never a signature on another call.
    for change in 0..2 {
        let mut changed = history.clone();
        if let ChatMessage::Assistant {
            tool_calls,
            content,
            ..
        } = &mut changed[1]
        {
            match change {
                0 => tool_calls[0].arguments = r#"{"q":"z"}"#.into(),
                _ => *content = Some("edited".into()),
            }
        }
        let body = encoded(&changed, &[], &e);
        assert!(!body.to_string().contains("c2lnLWE="), "{change}: {body}");
        assert_eq!(
            body["contents"][1]["parts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["thoughtSignature"] == FOREIGN_SIGNATURE)
                .count(),
            1
        );
    }
}

#[test]
fn a_signed_text_reply_is_kept_and_an_unsigned_one_is_not() {
    let signed = reply_of(
        vec![json!({"text": "Done.", "thoughtSignature": "dGV4dA=="})],
        "STOP",
    );
    let r = parse(&signed.to_string()).unwrap();
    assert_eq!(r.content.as_deref(), Some("Done."));
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    let history = [ChatMessage::user("q"), r.to_message()];
    assert_eq!(
        encoded(&history, &[], &endpoint())["contents"][1]["parts"],
        json!([{"text": "Done.", "thoughtSignature": "dGV4dA=="}])
    );
    let plain = parse(&reply_of(vec![json!({"text": "Done."})], "STOP").to_string()).unwrap();
    assert!(plain.reasoning.is_none());
}

#[test]
fn a_whole_reply_gives_text_calls_stable_ids_and_usage() {
    let mut parts = vec![json!({"text": "Looking."})];
    parts.extend(gemini_turn());
    let text = reply_of(parts, "STOP").to_string();
    let r = parse(&text).unwrap();
    assert_eq!(
        r.content.as_deref(),
        Some("Looking."),
        "a thought is not text"
    );
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(r.tool_calls[0].name, "find");
    assert_eq!(r.tool_calls[0].arguments, r#"{"q":"a"}"#);
    let (a, b) = (&r.tool_calls[0].id, &r.tool_calls[1].id);
    assert!(
        a.starts_with("call_0_") && b.starts_with("call_1_"),
        "{a} {b}"
    );
    assert_ne!(a, b);
    // Stable: the same reply gives the same ids; another reply others.
    assert_eq!(parse(&text).unwrap().tool_calls, r.tool_calls);
    let again = text.replace("resp-1", "resp-2");
    assert_ne!(parse(&again).unwrap().tool_calls[0].id, *a);
    let u = r.usage.unwrap();
    assert_eq!(
        (
            u.prompt_tokens,
            u.completion_tokens,
            u.total_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens
        ),
        (100, 40, 140, 60, 0),
        "thoughts are billed as output; the cache's reads are within the prompt"
    );
    let wrong = parse(r#"{"choices": []}"#).unwrap_err().to_string();
    assert!(wrong.contains("generateContent"), "{wrong}");
}

#[test]
fn finish_reasons_read_as_bindery_reads_them() {
    let of = |reason: &str, parts: Vec<Value>| {
        parse(&reply_of(parts, reason).to_string())
            .unwrap()
            .finish_reason
            .unwrap()
    };
    assert_eq!(of("STOP", vec![json!({"text": "x"})]), "stop");
    assert_eq!(of("MAX_TOKENS", vec![json!({"text": "x"})]), "length");
    assert_eq!(of("MAX_TOKENS", gemini_turn()), "length");
    assert_eq!(of("SAFETY", vec![]), "SAFETY");
    assert_eq!(
        of("MALFORMED_FUNCTION_CALL", vec![]),
        "MALFORMED_FUNCTION_CALL"
    );
    // A candidate stopped by a filter, with no content at all, is an empty reply.
    let r = parse(r#"{"candidates": [{"finishReason": "RECITATION"}]}"#).unwrap();
    assert_eq!((r.content, r.tool_calls.len()), (None, 0));
}

#[test]
fn a_blocked_prompt_is_an_error_not_an_empty_reply() {
    let blocked = json!({"promptFeedback": {"blockReason": "SAFETY",
        "blockReasonMessage": "the prompt was blocked"},
        "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 5}});
    let err = parse(&blocked.to_string()).unwrap_err().to_string();
    assert!(
        err.contains("blocked the prompt (SAFETY)") && err.contains("the prompt was blocked"),
        "{err}"
    );
    let mut s = Stream::default();
    let err = s
        .handle_event(&blocked.to_string(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("blocked the prompt (SAFETY)"), "{err}");
}

/// A streamed reply, in the chunks Gemini sends: a thought in pieces, the
/// text in pieces (one cut in the middle of a character's word), the
/// calls whole in one chunk, then the finish with the usage; every chunk
/// with the counts so far.
fn stream_chunks() -> Vec<Value> {
    let chunk = |parts: Vec<Value>, finish: Option<&str>, output: u64| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(f) = finish {
            candidate["finishReason"] = json!(f);
        }
        json!({"candidates": [candidate], "responseId": "resp-s", "modelVersion": "gemini-test",
               "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": output,
                                 "thoughtsTokenCount": 7, "cachedContentTokenCount": 12}})
    };
    vec![
        chunk(vec![json!({"text": "secret ", "thought": true})], None, 0),
        chunk(vec![json!({"text": "plan", "thought": true})], None, 0),
        chunk(vec![json!({"text": "On i"})], None, 1),
        chunk(vec![json!({"text": "t, ünï"})], None, 2),
        chunk(vec![json!({"text": "code"})], None, 3),
        chunk(
            vec![
                json!({"functionCall": {"name": "find", "args": {"q": "x"}}, "thoughtSignature": "Zmlyc3Q="}),
                json!({"functionCall": {"name": "find", "args": {}}}),
            ],
            None,
            9,
        ),
        chunk(vec![], Some("STOP"), 11),
    ]
}

fn run(events: &[Value]) -> Result<(ChatResponse, Vec<StreamDelta>), LlmError> {
    let mut s = Stream::default();
    let mut deltas = Vec::new();
    for e in events {
        s.handle_event(&e.to_string(), &mut |d| deltas.push(d))?;
        assert!(!s.is_done(), "the stream ends with the body");
    }
    Ok((s.finish()?, deltas))
}

#[test]
fn a_stream_forwards_text_and_calls_and_keeps_the_thoughts_to_itself() {
    let (r, deltas) = run(&stream_chunks()).unwrap();
    let id0 = r.tool_calls[0].id.clone();
    let id1 = r.tool_calls[1].id.clone();
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Content("On i".into()),
            StreamDelta::Content("t, ünï".into()),
            StreamDelta::Content("code".into()),
            StreamDelta::ToolCallStarted {
                index: 0,
                id: id0,
                name: "find".into()
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: r#"{"q":"x"}"#.into()
            },
            StreamDelta::ToolCallStarted {
                index: 1,
                id: id1,
                name: "find".into()
            },
            StreamDelta::ToolCallArguments {
                index: 1,
                fragment: "{}".into()
            },
        ]
    );
    assert!(!format!("{deltas:?}").contains("secret"));
    assert_eq!(r.content.as_deref(), Some("On it, ünïcode"));
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    // The pieces of one text are one part; the signed call stays as it came.
    assert_eq!(
        r.reasoning.clone().unwrap().blocks,
        vec![
            json!({"text": "secret plan", "thought": true}),
            json!({"text": "On it, ünïcode"}),
            json!({"functionCall": {"name": "find", "args": {"q": "x"}}, "thoughtSignature": "Zmlyc3Q="}),
            json!({"functionCall": {"name": "find", "args": {}}}),
        ]
    );
    let u = r.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens),
        (20, 18, 12),
        "the last chunk's counts"
    );
    // The next request sends the turn back as it came.
    let mut history = vec![ChatMessage::user("q"), r.to_message()];
    for c in &r.tool_calls {
        history.push(ChatMessage::tool_result(&c.id, "out"));
    }
    let body = encoded(&history, &[], &endpoint());
    assert_eq!(
        body["contents"][1]["parts"][2]["thoughtSignature"],
        "Zmlyc3Q="
    );
    assert_eq!(
        body["contents"][2]["parts"].as_array().unwrap().len(),
        2,
        "{body}"
    );
}

#[test]
fn a_signature_streamed_alone_after_the_text_stays_a_part_of_its_own() {
    let chunk = |part: Value, finish: Option<&str>| {
        let mut c = json!({"content": {"role": "model", "parts": [part]}});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        json!({ "candidates": [c] })
    };
    let (r, deltas) = run(&[
        chunk(json!({"text": "Hel"}), None),
        chunk(json!({"text": "lo"}), None),
        chunk(
            json!({"text": "", "thoughtSignature": "c2ln"}),
            Some("STOP"),
        ),
    ])
    .unwrap();
    assert_eq!(deltas.len(), 2, "an empty text is no delta");
    assert_eq!(r.content.as_deref(), Some("Hello"));
    assert_eq!(
        r.reasoning.unwrap().blocks,
        vec![
            json!({"text": "Hello"}),
            json!({"text": "", "thoughtSignature": "c2ln"})
        ]
    );
    // Nor is a piece put onto a signed part before it.
    let (r, _) = run(&[
        chunk(json!({"text": "Hel", "thoughtSignature": "c2ln"}), None),
        chunk(json!({"text": "lo"}), Some("STOP")),
    ])
    .unwrap();
    assert_eq!(r.reasoning.unwrap().blocks.len(), 2);
}

#[test]
fn whole_and_streamed_replies_read_alike() {
    let parts: Vec<Value> = stream_chunks()
        .into_iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    let mut whole = reply_of(parts, "STOP");
    whole["responseId"] = json!("resp-s");
    let w = parse(&whole.to_string()).unwrap();
    let (s, _) = run(&stream_chunks()).unwrap();
    assert_eq!(w.content, s.content);
    assert_eq!(w.tool_calls, s.tool_calls, "the same ids");
    assert_eq!(w.finish_reason, s.finish_reason);
}

#[test]
fn a_stream_error_a_cut_or_parts_after_the_finish_are_errors() {
    let mut s = Stream::default();
    let err = s
        .handle_event(
            r#"{"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}"#,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 429, .. }), "{err}");
    // A code that is no error status is the server's failure.
    let err = parse(r#"{"error": {"code": 99999999999}}"#).unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 500, .. }), "{err}");
    // Cut before the finish.
    let chunks = stream_chunks();
    let err = run(&chunks[..5]).unwrap_err().to_string();
    assert!(err.contains("finishReason"), "{err}");
    // A chunk of usage only after the finish is taken; more parts are not.
    let mut more = chunks.clone();
    more.push(json!({"usageMetadata": {"promptTokenCount": 21, "candidatesTokenCount": 11}}));
    assert_eq!(run(&more).unwrap().0.usage.unwrap().prompt_tokens, 21);
    more.push(chunks[2].clone());
    let err = run(&more).unwrap_err().to_string();
    assert!(err.contains("after the candidate finished"), "{err}");
    // Empty data (a keep-alive) is nothing.
    let mut s = Stream::default();
    s.handle_event("  ", &mut |_| {}).unwrap();
}

/// Every reply that does not read is refused, naming what is wrong, never
/// a panic nor a part kept half.
#[test]
fn malformed_replies_are_refused() {
    let cases: Vec<(Value, &str)> = vec![
        (json!(["not", "an", "object"]), "no candidate"),
        (
            json!({"candidates": {"0": {}}}),
            "`candidates` is not a list",
        ),
        (json!({"candidates": []}), "no candidate"),
        (
            json!({"candidates": [{"content": "text"}]}),
            "`content` is not an object",
        ),
        (
            json!({"candidates": [{"content": {"parts": {}}}]}),
            "`parts` is not a list",
        ),
        (
            json!({"candidates": [{"finishReason": 3}]}),
            "`finishReason` that is not text",
        ),
        (
            reply_of(vec![json!("text")], "STOP"),
            "a part that is not an object",
        ),
        (
            reply_of(vec![json!({"text": 5})], "STOP"),
            "`text` is not text",
        ),
        (
            reply_of(vec![json!({"text": "x", "thought": "yes"})], "STOP"),
            "`thought` is not true or false",
        ),
        (
            reply_of(vec![json!({"text": "x", "thoughtSignature": 1})], "STOP"),
            "`thoughtSignature` that is not text",
        ),
        (
            reply_of(vec![json!({"functionCall": {"args": {}}})], "STOP"),
            "without a name",
        ),
        (
            reply_of(vec![json!({"functionCall": {"name": ""}})], "STOP"),
            "without a name",
        ),
        (
            reply_of(vec![json!({"functionCall": "find"})], "STOP"),
            "not an object",
        ),
        (
            reply_of(
                vec![json!({"functionCall": {"name": "f", "args": [1]}})],
                "STOP",
            ),
            "`args` is not an object",
        ),
        (
            reply_of(
                vec![json!({"functionCall": {"name": "f", "id": 7}})],
                "STOP",
            ),
            "`id` is not text",
        ),
        (
            reply_of(
                vec![json!({"functionCall": {"name": "f", "partialArgs": []}})],
                "STOP",
            ),
            "streamed in pieces",
        ),
        (
            reply_of(
                vec![json!({"functionCall": {"name": "f"}, "thought": true})],
                "STOP",
            ),
            "marked as a thought",
        ),
        (
            reply_of(
                vec![json!({"executableCode": {"code": "print(1)"}})],
                "STOP",
            ),
            "`executableCode` part",
        ),
        (
            reply_of(
                vec![json!({"inlineData": {"mimeType": "image/png", "data": "x"}})],
                "STOP",
            ),
            "`inlineData` part",
        ),
        (
            reply_of(
                vec![json!({"text": "x", "functionCall": {"name": "f"}})],
                "STOP",
            ),
            "more than one kind",
        ),
        (
            reply_of(vec![json!({"mystery": 1})], "STOP"),
            "no kind Bindery knows",
        ),
    ];
    for (reply, expected) in cases {
        let text = reply.to_string();
        let err = parse(&text).unwrap_err();
        assert!(matches!(err, LlmError::Malformed(_)), "{text}: {err}");
        assert!(err.to_string().contains(expected), "{text}: {err}");
        // The same, streamed.
        let mut s = Stream::default();
        let streamed = s.handle_event(&text, &mut |_| {});
        if expected != "no candidate" {
            assert!(streamed.is_err(), "{text}");
        }
    }
    assert!(parse("not json").is_err());
    let mut s = Stream::default();
    assert!(s.handle_event("{not json", &mut |_| {}).is_err());
    assert!(s.handle_event("[1]", &mut |_| {}).is_err());
    // A signature alone is a part; an empty id gets one of ours.
    let r = parse(
        &reply_of(
            vec![
                json!({"thoughtSignature": "c2ln"}),
                json!({"functionCall": {"name": "f", "id": ""}}),
            ],
            "STOP",
        )
        .to_string(),
    )
    .unwrap();
    assert!(r.tool_calls[0].id.starts_with("call_0_"));
    assert_eq!(r.reasoning.unwrap().blocks.len(), 2);
}

/// Counts a model could not have used never overflow, nor reach a store
/// as more than [`Usage::MAX_REPORTED`].
#[test]
fn absurd_usage_counts_are_cut_not_summed_past_their_type() {
    let huge = u64::MAX;
    let mut reply = reply_of(vec![json!({"text": "x"})], "STOP");
    reply["usageMetadata"] = json!({"promptTokenCount": huge, "candidatesTokenCount": huge,
        "thoughtsTokenCount": huge, "cachedContentTokenCount": huge, "toolUsePromptTokenCount": huge,
        "totalTokenCount": huge});
    let u = parse(&reply.to_string()).unwrap().usage.unwrap();
    assert_eq!(u.prompt_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.completion_tokens, Usage::MAX_REPORTED);
    assert_eq!(u.total_tokens, 2 * Usage::MAX_REPORTED);
    assert!(u.cache_read_tokens <= u.prompt_tokens);
    // Counts that are not numbers count as none.
    reply["usageMetadata"] = json!({"promptTokenCount": "many", "candidatesTokenCount": -1});
    let u = parse(&reply.to_string()).unwrap().usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (0, 0));
}

#[test]
fn tool_names_follow_geminis_rule() {
    for ok in ["find", "_x", "files.read", "ns:tool-1", &"a".repeat(64)] {
        assert!(valid_name(ok), "{ok}");
    }
    for bad in [
        "",
        "1tool",
        "-x",
        ".x",
        "a b",
        "tool/x",
        "é",
        &"a".repeat(65),
    ] {
        assert!(!valid_name(bad), "{bad}");
    }
    let err = body(
        &[ChatMessage::user("q")],
        &[tool("9lives")],
        &endpoint(),
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`9lives`") && err.contains("rename"), "{err}");
    // A schema that is not an object is an empty object's.
    let mut t = tool("t");
    t.parameters = Value::Null;
    assert_eq!(
        tools(&[t]).unwrap()[0]["functionDeclarations"][0]["parametersJsonSchema"],
        json!({"type": "object"})
    );
}

#[test]
fn the_path_names_the_model_as_one_segment() {
    let mut e = endpoint();
    assert_eq!(
        path(&e, false).unwrap(),
        "/models/gemini-test:generateContent"
    );
    assert_eq!(
        path(&e, true).unwrap(),
        "/models/gemini-test:streamGenerateContent?alt=sse"
    );
    e.model = "models/gemini-2.5-flash".into();
    assert_eq!(
        path(&e, false).unwrap(),
        "/models/gemini-2.5-flash:generateContent"
    );
    e.model = "my model:v1?x#é".into();
    assert_eq!(
        path(&e, false).unwrap(),
        "/models/my%20model%3Av1%3Fx%23%C3%A9:generateContent"
    );
    for bad in ["", "models/", ".", "..", "a/b", "models/a/b", "a\nb"] {
        e.model = bad.into();
        let err = path(&e, false).unwrap_err();
        assert!(matches!(err, LlmError::Config(_)), "{bad:?}: {err}");
    }
}

/// A result answers the call of that id in the turn just before it, even
/// when a model reused the id (Gemini's `id`, or a fallback's) in a later
/// turn; a tool's text in parts is its text, one part a line.
#[test]
fn results_follow_the_calls_of_their_own_turn() {
    let history = vec![
        ChatMessage::user("q"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("same", "one", "{}")],
            reasoning: None,
        },
        ChatMessage::tool_result("same", "first"),
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![call("same", "two", "{}")],
            reasoning: None,
        },
        ChatMessage::Tool {
            tool_call_id: "same".into(),
            content: Content::Parts(vec![ContentPart::text("a"), ContentPart::text("b")]),
        },
    ];
    let body = encoded(&history, &[], &endpoint());
    let c = body["contents"].as_array().unwrap();
    assert_eq!(c[2]["parts"][0]["functionResponse"]["name"], "one");
    assert_eq!(
        c[4]["parts"],
        json!([{"functionResponse": {"name": "two", "response": {"output": "a\nb"}}}])
    );
}
