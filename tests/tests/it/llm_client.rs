//! The sidecar's chat-completions client against the scripted mock LLM.

use std::time::{Duration, Instant};

use bindery_llm::{
    ChatClient, ChatMessage, Conversation, LlmError, ModelEndpoint, StreamDelta, ToolDefinition,
};
use bindery_params::SecretString;
use bindery_tests::eventually::{eventually_or, PATIENCE};
use bindery_tests::mock_llm::{last_message, tool_names, tool_schema, Gate, MockLlm, MockReply};
use serde_json::json;

const KEY: &str = "sk-test-canary-7f3a9c";

fn endpoint(url: String) -> ModelEndpoint {
    ModelEndpoint {
        base_url: url,
        model: "mock-model".to_owned(),
        api_key: None,
        timeout: Duration::from_secs(10),
        max_retries: 2,
        initial_backoff: Duration::from_millis(10),
        limits: Default::default(),
        ..ModelEndpoint::new("", "")
    }
}

fn client(llm: &MockLlm) -> ChatClient {
    ChatClient::new(endpoint(llm.url())).unwrap()
}

fn ask(text: &str) -> Conversation {
    ask_with(text, vec![])
}

fn ask_with(text: &str, tools: Vec<ToolDefinition>) -> Conversation {
    let mut conversation = Conversation::new(tools);
    conversation.push(&ChatMessage::system("You are a test."));
    conversation.push(&ChatMessage::user(text));
    conversation
}

fn read_file_tool() -> ToolDefinition {
    ToolDefinition {
        name: "read_file".to_owned(),
        description: "Read a file of the workspace".to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        }),
    }
}

/// A port nothing listens on.
async fn closed_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn plain_answer() {
    let llm = MockLlm::start_sequence(vec![MockReply::Text("Hello there".into())]).await;
    let response = client(&llm).complete(&ask("hi")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("Hello there"));
    assert!(response.tool_calls.is_empty());
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    let usage = response.usage.expect("usage");
    assert!(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    assert_eq!(
        usage.total_tokens,
        usage.prompt_tokens + usage.completion_tokens
    );

    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0],
        json!({
            "model": "mock-model",
            "messages": [
                {"role": "system", "content": "You are a test."},
                {"role": "user", "content": "hi"},
            ],
            "stream": false,
        })
    );
    // After the script, the sequence mock says "done".
    let response = client(&llm).complete(&ask("again")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("done"));
    assert_eq!(llm.request_count(), 2);
    llm.shutdown().await;
}

#[tokio::test]
async fn a_held_reply_waits_for_its_gate() {
    let gate = Gate::new();
    let held = gate.clone();
    let llm = MockLlm::start(move |_| MockReply::text("let go").held(&held)).await;
    let c = client(&llm);
    let request = ask("hold on");
    let mut pending = Box::pin(c.complete(&request));
    // The request arrives and stays unanswered until the gate opens: the
    // client is still waiting a round after the mock has it.
    let mut rounds_since_arrival = 0;
    eventually_or(
        "two rounds after the request arrives",
        PATIENCE,
        async || {
            tokio::select! {
                r = &mut pending => panic!("answered before the gate opened: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            if llm.request_count() == 1 {
                rounds_since_arrival += 1;
            }
            if rounds_since_arrival == 2 {
                Ok(())
            } else {
                Err(format!(
                    "{} requests, {rounds_since_arrival} rounds since",
                    llm.request_count()
                ))
            }
        },
    )
    .await;
    gate.open();
    let response = pending.await.unwrap();
    assert_eq!(response.content.as_deref(), Some("let go"));
    // An open gate holds nothing.
    let response = c.complete(&ask("again")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("let go"));
    llm.shutdown().await;
}

#[tokio::test]
async fn tool_calls_round_trip() {
    let llm = MockLlm::start(|req| {
        if last_message(req)["role"] == "tool" {
            MockReply::Text(format!(
                "the file says {}",
                last_message(req)["content"].as_str().unwrap_or("?")
            ))
        } else {
            MockReply::ToolCalls(vec![("read_file".into(), json!({"path": "notes.txt"}))])
        }
    })
    .await;
    let client = client(&llm);
    let mut req = ask_with("what do my notes say?", vec![read_file_tool()]);

    let first = client.complete(&req).await.unwrap();
    assert_eq!(first.content, None);
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.tool_calls.len(), 1);
    let call = &first.tool_calls[0];
    assert_eq!(call.id, "call_1");
    assert_eq!(call.name, "read_file");
    assert_eq!(
        call.parse_arguments().unwrap(),
        json!({"path": "notes.txt"})
    );

    req.push(&first.to_message());
    req.push(&ChatMessage::tool_result(call.id.clone(), "buy milk"));
    let second = client.complete(&req).await.unwrap();
    assert_eq!(second.content.as_deref(), Some("the file says buy milk"));

    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0]["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the workspace",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }])
    );
    assert_eq!(tool_names(&requests[0]), vec!["read_file"]);
    assert_eq!(
        tool_schema(&requests[0], "read_file"),
        Some(&read_file_tool().parameters)
    );
    let messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(
        messages[2],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\":\"notes.txt\"}"},
            }],
        })
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "buy milk"})
    );
    llm.shutdown().await;
}

#[tokio::test]
async fn streaming_text() {
    let text = "Streaming is fün ✓ — it comes in many small pieces.";
    let llm = MockLlm::start_sequence(vec![MockReply::Text(text.into())]).await;
    let mut deltas = Vec::new();
    let response = client(&llm)
        .complete_streaming(&ask("stream please"), &mut |d| deltas.push(d))
        .await
        .unwrap();
    assert_eq!(response.content.as_deref(), Some(text));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert!(
        response.usage.is_some(),
        "usage asked for with stream_options"
    );
    assert!(deltas.len() > 3, "{deltas:?}");
    let streamed: String = deltas
        .iter()
        .map(|d| match d {
            StreamDelta::Content(c) => c.as_str(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(streamed, text);

    let req = &llm.requests()[0];
    assert_eq!(req["stream"], json!(true));
    assert_eq!(req["stream_options"], json!({"include_usage": true}));
    let (headers, _) = &llm.raw_requests()[0];
    assert!(headers
        .iter()
        .any(|(n, v)| n == "accept" && v == "text/event-stream"));
    llm.shutdown().await;
}

#[tokio::test]
async fn streaming_tool_call_arguments() {
    let args_a = json!({"path": "a/long/path/to/a/file.txt", "encoding": "utf-8"});
    let args_b = json!({"pattern": "fn main", "max": 10});
    let llm = MockLlm::start_sequence(vec![MockReply::ToolCalls(vec![
        ("read_file".into(), args_a.clone()),
        ("grep".into(), args_b.clone()),
    ])])
    .await;
    let req = ask_with("look around", vec![read_file_tool()]);
    let mut deltas = Vec::new();
    let response = client(&llm)
        .complete_streaming(&req, &mut |d| deltas.push(d))
        .await
        .unwrap();

    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.content, None);
    let calls = &response.tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].id.as_str(), calls[0].name.as_str()),
        ("call_1", "read_file")
    );
    assert_eq!(
        (calls[1].id.as_str(), calls[1].name.as_str()),
        ("call_2", "grep")
    );
    assert_eq!(calls[0].parse_arguments().unwrap(), args_a);
    assert_eq!(calls[1].parse_arguments().unwrap(), args_b);

    // Deltas: each call starts, then its arguments come in several pieces
    // that add up to the final arguments.
    assert_eq!(
        deltas[0],
        StreamDelta::ToolCallStarted {
            index: 0,
            id: "call_1".into(),
            name: "read_file".into()
        }
    );
    let mut started = Vec::new();
    let mut fragments = [Vec::new(), Vec::new()];
    for d in &deltas {
        match d {
            StreamDelta::ToolCallStarted { index, .. } => started.push(*index),
            StreamDelta::ToolCallArguments { index, fragment } => {
                assert!(started.contains(index), "arguments before start");
                fragments[*index].push(fragment.clone());
            }
            StreamDelta::Content(c) => panic!("unexpected content {c:?}"),
        }
    }
    assert_eq!(started, vec![0, 1]);
    for (i, call) in calls.iter().enumerate() {
        assert!(fragments[i].len() > 1, "{:?}", fragments[i]);
        assert_eq!(fragments[i].concat(), call.arguments);
    }
    llm.shutdown().await;
}

#[tokio::test]
async fn streaming_request_answered_with_plain_json() {
    // A server that ignores `stream: true` and sends one JSON reply.
    let reply = json!({
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.",
            "tool_calls": [{"id": "x1", "type": "function",
                            "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}],
        }}],
    });
    let llm = MockLlm::start_sequence(vec![MockReply::Raw(reply.to_string())]).await;
    let mut deltas = Vec::new();
    let response = client(&llm)
        .complete_streaming(&ask("hi"), &mut |d| deltas.push(d))
        .await
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("Let me look."));
    assert_eq!(response.tool_calls[0].arguments, "{\"path\":\"a\"}");
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Content("Let me look.".into()),
            StreamDelta::ToolCallStarted {
                index: 0,
                id: "x1".into(),
                name: "read_file".into()
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: "{\"path\":\"a\"}".into()
            },
        ]
    );
    llm.shutdown().await;
}

#[tokio::test]
async fn rate_limit_with_retry_after_then_success() {
    let llm = MockLlm::start_sequence(vec![
        MockReply::Status {
            status: 429,
            retry_after: Some(1),
            body: r#"{"error": {"message": "slow down"}}"#.into(),
        },
        MockReply::Text("ok".into()),
    ])
    .await;
    let started = Instant::now();
    let response = client(&llm).complete(&ask("hi")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("ok"));
    assert_eq!(llm.request_count(), 2);
    // Retry-After (1 s) won over the 10 ms backoff.
    assert!(started.elapsed() >= Duration::from_millis(950));
    llm.shutdown().await;
}

#[tokio::test]
async fn server_errors_exhaust_the_retries() {
    let llm = MockLlm::start(|_| MockReply::status(500, "internal boom")).await;
    let client = client(&llm);
    let err = client.complete(&ask("hi")).await.unwrap_err();
    match &err {
        LlmError::RetriesExhausted { attempts, last } => {
            assert_eq!(*attempts, 3);
            assert!(
                matches!(&**last, LlmError::Http { status: 500, body } if body == "internal boom"),
                "{last:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("HTTP 500"), "{err}");
    assert_eq!(llm.request_count(), 3);

    // The streaming call retries the same way.
    let err = client
        .complete_streaming(&ask("hi"), &mut |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, LlmError::RetriesExhausted { attempts: 3, .. }),
        "{err:?}"
    );
    assert_eq!(llm.request_count(), 6);
    llm.shutdown().await;
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let llm = MockLlm::start(|_| MockReply::status(404, "no such model")).await;
    let err = client(&llm).complete(&ask("hi")).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Http { status: 404, body } if body == "no such model"),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("check the base URL and the model name"));
    assert_eq!(llm.request_count(), 1);
    llm.shutdown().await;
}

#[tokio::test]
async fn unreachable_endpoint_is_retried_then_reported() {
    let client = ChatClient::new(endpoint(closed_port_url().await)).unwrap();
    let err = client.complete(&ask("hi")).await.unwrap_err();
    match &err {
        LlmError::RetriesExhausted { attempts: 3, last } => {
            assert!(matches!(&**last, LlmError::Transport(_)), "{last:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
}

#[tokio::test]
async fn malformed_replies() {
    let llm = MockLlm::start_sequence(vec![
        MockReply::Raw("<html>this is not json</html>".into()),
        MockReply::Raw(r#"{"choices": []}"#.into()),
        MockReply::Raw(
            r#"{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]}"#
                .into(),
        ),
        MockReply::Raw("definitely not an event stream".into()),
    ])
    .await;
    let client = client(&llm);
    for expected in ["not JSON", "no choices", "no function name"] {
        match client.complete(&ask("hi")).await {
            Err(LlmError::Malformed(msg)) => assert!(msg.contains(expected), "{msg}"),
            other => panic!("{expected}: {other:?}"),
        }
    }
    let err = client
        .complete_streaming(&ask("hi"), &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Malformed(_)), "{err:?}");
    // Malformed replies are not retried.
    assert_eq!(llm.request_count(), 4);
    llm.shutdown().await;
}

#[tokio::test]
async fn slow_endpoint_times_out() {
    let slow = MockReply::Text("too late".into()).delayed(Duration::from_secs(5));
    let llm = MockLlm::start_sequence(vec![slow.clone(), slow]).await;
    let mut endpoint = endpoint(llm.url());
    endpoint.timeout = Duration::from_millis(200);
    let client = ChatClient::new(endpoint).unwrap();

    let started = Instant::now();
    let err = client.complete(&ask("hi")).await.unwrap_err();
    assert!(matches!(err, LlmError::Timeout), "{err:?}");
    let err = client
        .complete_streaming(&ask("hi"), &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Timeout), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
    // Timeouts are not retried.
    assert_eq!(llm.request_count(), 2);
    llm.shutdown().await;
}

#[tokio::test]
async fn api_key_goes_in_the_header_and_nowhere_else() {
    let llm = MockLlm::start_sequence(vec![
        MockReply::status(401, r#"{"error": {"message": "invalid api key"}}"#),
        MockReply::Raw("not json".into()),
        MockReply::Text("welcome".into()).delayed(Duration::from_secs(5)),
        MockReply::Text("welcome".into()),
    ])
    .await;
    let mut with_key = endpoint(llm.url());
    with_key.api_key = Some(SecretString::new(KEY));
    with_key.timeout = Duration::from_millis(500);
    let client = ChatClient::new(with_key.clone()).unwrap();

    let mut errors = vec![
        client.complete(&ask("hi")).await.unwrap_err(),
        client.complete(&ask("hi")).await.unwrap_err(),
        client.complete(&ask("hi")).await.unwrap_err(),
    ];
    assert!(matches!(errors[0], LlmError::Http { status: 401, .. }));
    assert!(errors[0].to_string().contains("check the API key"));
    assert!(matches!(errors[1], LlmError::Malformed(_)));
    assert!(matches!(errors[2], LlmError::Timeout));
    let response = client.complete(&ask("hi")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("welcome"));

    let mut unreachable = with_key.clone();
    unreachable.base_url = closed_port_url().await;
    unreachable.max_retries = 0;
    errors.push(
        ChatClient::new(unreachable)
            .unwrap()
            .complete(&ask("hi"))
            .await
            .unwrap_err(),
    );
    assert!(matches!(
        errors[3],
        LlmError::RetriesExhausted { attempts: 1, .. }
    ));

    for err in &errors {
        let shown = format!("{err} {err:?} {err:#?}");
        assert!(!shown.contains(KEY), "key leaked: {shown}");
    }
    let shown = format!("{client:?} {with_key:?}");
    assert!(!shown.contains(KEY), "key leaked: {shown}");

    let raw = llm.raw_requests();
    assert_eq!(raw.len(), 4);
    for (headers, body) in &raw {
        let auth: Vec<_> = headers
            .iter()
            .filter(|(n, _)| n == "authorization")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(auth, vec![format!("Bearer {KEY}")]);
        assert!(!body.contains(KEY));
    }
    llm.shutdown().await;
}

#[tokio::test]
async fn no_key_no_authorization_header() {
    let llm = MockLlm::start_sequence(vec![]).await;
    let mut empty_key = endpoint(format!("{}/", llm.url()));
    empty_key.api_key = Some(SecretString::new(""));
    for endpoint in [endpoint(llm.url()), empty_key] {
        let response = ChatClient::new(endpoint)
            .unwrap()
            .complete(&ask("hi"))
            .await
            .unwrap();
        assert_eq!(response.content.as_deref(), Some("done"));
    }
    for (headers, _) in llm.raw_requests() {
        assert!(headers.iter().all(|(n, _)| n != "authorization"));
        assert!(headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == "application/json"));
    }
    llm.shutdown().await;
}

#[tokio::test]
async fn mock_serves_only_chat_completions() {
    let llm = MockLlm::start_sequence(vec![]).await;
    let mut wrong = endpoint(llm.url());
    wrong.base_url = llm.url().trim_end_matches("/v1").to_owned();
    let err = ChatClient::new(wrong)
        .unwrap()
        .complete(&ask("hi"))
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 404, .. }), "{err:?}");
    assert_eq!(llm.request_count(), 0);
    llm.shutdown().await;
}

/// A client whose replies may hold at most `max_bytes` and `max_calls`.
fn limited(llm: &MockLlm, max_bytes: usize, max_calls: usize) -> ChatClient {
    let mut e = endpoint(llm.url());
    e.limits.max_bytes = max_bytes;
    e.limits.max_tool_calls = max_calls;
    ChatClient::new(e).unwrap()
}

#[tokio::test]
async fn a_reply_past_the_byte_limit_is_refused_streamed_or_not() {
    let llm = MockLlm::start(|_| MockReply::text("x".repeat(64 * 1024))).await;
    let c = limited(&llm, 16 * 1024, 8);
    let conv = ask("long");
    for streamed in [false, true] {
        let r = if streamed {
            c.complete_streaming(&conv, &mut |_| {}).await
        } else {
            c.complete(&conv).await
        };
        match r {
            Err(LlmError::TooLarge { limit }) => assert_eq!(limit, 16 * 1024),
            other => panic!("streamed {streamed}: {other:?}"),
        }
    }
    // Within the limit, the same reply is whole.
    let c = limited(&llm, 128 * 1024, 8);
    let r = c.complete(&conv).await.unwrap();
    assert_eq!(r.content.as_deref().map(str::len), Some(64 * 1024));
}

#[tokio::test]
async fn a_reply_asking_for_too_many_calls_is_refused() {
    let calls: Vec<(String, serde_json::Value)> =
        (0..20).map(|i| (format!("t{i}"), json!({}))).collect();
    let llm = MockLlm::start(move |_| MockReply::ToolCalls(calls.clone())).await;
    let c = limited(&llm, 1 << 20, 16);
    let conv = ask("go");
    for streamed in [false, true] {
        let r = if streamed {
            c.complete_streaming(&conv, &mut |_| {}).await
        } else {
            c.complete(&conv).await
        };
        match r {
            Err(
                e @ LlmError::TooManyCalls {
                    count: 20,
                    limit: 16,
                },
            ) => {
                assert!(e.to_string().contains("none of them ran"), "{e}")
            }
            other => panic!("streamed {streamed}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_request_past_its_deadline_is_stopped_however_it_trickles() {
    // Each attempt is answered at once (503), each retry waits longer:
    // every wait is within the per-attempt timeout, their sum is not.
    let llm = MockLlm::start(|_| MockReply::status(503, "busy")).await;
    let mut e = endpoint(llm.url());
    e.timeout = Duration::from_millis(200);
    e.limits.deadline = Duration::from_millis(500);
    e.max_retries = 100;
    e.initial_backoff = Duration::from_millis(100);
    let c = ChatClient::new(e).unwrap();
    let started = Instant::now();
    match c.complete(&ask("slow")).await {
        Err(e @ LlmError::Deadline(_)) => assert!(e.to_string().contains("--llm-deadline"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Review 68 (second): each model of a chain had the whole deadline, so
/// eight fallbacks made one request last nine deadlines. The deadline
/// bounds the request, fallbacks included, streamed or not.
#[tokio::test]
async fn a_chain_of_fallbacks_ends_within_one_deadline() {
    let llm =
        MockLlm::start(|_| MockReply::Text("late".into()).delayed(Duration::from_secs(30))).await;
    let slow = |deadline: Duration| {
        let mut e = endpoint(llm.url());
        e.timeout = Duration::from_secs(30);
        e.limits.deadline = deadline;
        e.max_retries = 0;
        e
    };
    let deadline = Duration::from_millis(800);
    // Each model alone gives up at its deadline, which falls back.
    let chain = ChatClient::new(slow(deadline)).unwrap().with_fallbacks(
        (0..4)
            .map(|_| ChatClient::new(slow(deadline)).unwrap())
            .collect(),
    );
    for stream in [false, true] {
        let started = Instant::now();
        let result = if stream {
            chain.complete_streaming(&ask("slow"), &mut |_| {}).await
        } else {
            chain.complete(&ask("slow")).await
        };
        assert!(
            matches!(result, Err(LlmError::Deadline(d)) if d == deadline),
            "{result:?}"
        );
        // Five deadlines' worth without the bound; one and the slack of a
        // loaded machine with it.
        assert!(started.elapsed() < deadline * 3, "{:?}", started.elapsed());
    }
}

/// A chain that fails whole says each model it tried and why, in order
/// (review 68: its switches had left no trace), and goes no further.
#[tokio::test]
async fn a_chain_that_fails_whole_names_each_model_it_tried() {
    let busy = MockLlm::start(|_| MockReply::status(503, "busy")).await;
    let model = |name: &str| {
        let mut e = endpoint(busy.url());
        e.model = name.to_owned();
        e.max_retries = 0;
        ChatClient::new(e).unwrap()
    };
    let chain = model("first").with_fallbacks(vec![model("second"), model("third")]);
    let err = chain.complete(&ask("hi")).await.unwrap_err();
    let LlmError::ChainFailed {
        tried, last_model, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let names: Vec<&str> = tried.iter().map(|f| f.model.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
    assert_eq!(last_model, "third");
    assert!(!bindery_llm::falls_back(&err));
    let said = err.to_string();
    assert!(
        said.starts_with(
            "every model failed: first (HTTP 503), then second (HTTP 503); the last, third: "
        ),
        "{said}"
    );
    assert_eq!(busy.request_count(), 3);
}

/// Found by the attacker's second review: a model URL's password reached
/// the run's failure detail (the session, its events, the store, the
/// logs) through the transport error. Errors show the URL without its
/// user, password or query.
#[tokio::test]
async fn an_unreachable_models_error_shows_no_credential_of_its_url() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut e = endpoint(format!(
        "http://someone:CANARY-urlpw@127.0.0.1:{port}/v1?key=CANARY-q"
    ));
    e.max_retries = 0;
    let c = ChatClient::new(e).unwrap();
    let err = c.complete(&ask("hi")).await.unwrap_err().to_string();
    assert!(!err.contains("CANARY"), "{err}");
    assert!(
        err.contains(&format!("http://127.0.0.1:{port}/v1")),
        "{err}"
    );
}

/// Review 69 (second): a model endpoint that puts the key it was sent in
/// its reply, in pieces across the stream's events (text and a call's
/// arguments), gets none of it past the client: not in a forwarded delta,
/// not in the reply kept, run or sent on.
#[tokio::test]
async fn a_key_echoed_in_pieces_goes_no_further_than_the_client() {
    let llm = MockLlm::start_sequence(vec![
        MockReply::Text(format!("here: {KEY} done")),
        MockReply::tool_call("read_file", json!({"path": KEY})),
    ])
    .await;
    let keyed = ChatClient::new(ModelEndpoint {
        api_key: Some(SecretString::new(KEY)),
        ..endpoint(llm.url())
    })
    .unwrap();
    let mut deltas = Vec::new();
    let text = keyed
        .complete_streaming(&ask("hi"), &mut |d| deltas.push(d))
        .await
        .unwrap();
    let streamed: String = deltas
        .iter()
        .map(|d| match d {
            StreamDelta::Content(c) => c.clone(),
            _ => String::new(),
        })
        .collect();
    assert!(!streamed.contains("canary"), "{streamed}");
    assert!(
        streamed.starts_with("here: <secret:") && streamed.ends_with(" done"),
        "{streamed}"
    );
    assert_eq!(text.content.as_deref(), Some(streamed.as_str()));
    let call = keyed
        .complete_streaming(&ask_with("read", vec![read_file_tool()]), &mut |_| {})
        .await
        .unwrap();
    let args = &call.tool_calls[0].arguments;
    assert!(!args.contains("canary"), "{args}");
    assert!(args.contains("<secret:"), "{args}");
    llm.shutdown().await;
}
