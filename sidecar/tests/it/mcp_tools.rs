//! An agent's own tools on `/mcp` (`spec.mcp.exposeTools`), driven by the
//! official Python SDK as an IDE assistant would: the schemas have no
//! bound argument, a prompt-injected `tenant_id` still reaches the tool
//! as the pinned tenant, a secret the tool prints never comes back, a
//! confirm tool waits and is answered, a `depends_on` tool asks for its
//! selection (through the continuation route, and through elicitation on
//! protocol 2026-07-28), and each token reaches only what it may.

use crate::common::*;
use bindery_tests::fixtures::session::answer;
use bindery_tests::mcp_client;
use bindery_tests::mock_llm::MockReply;
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

const CLIENT: &str = "mcp-client-token-for-tests";

/// The model is never asked by an exposed tool's call: any request to it
/// fails the call it was made for.
fn no_model(_: &Value) -> MockReply {
    MockReply::text("the model was asked, and should not have been")
}

/// A toolbox whose `leak` tool prints the billing token it is given.
fn leaky(dir: &std::path::Path) -> String {
    let tools = dir.join("leaky");
    std::fs::create_dir_all(&tools).unwrap();
    bindery_tests::fixtures::bash_tool_with_args(
        &tools,
        "leak",
        "Says which token it was given.",
        r#"[{"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "single", "mode": "env"}]"#,
        "echo \"my token is $TOKEN\"\n",
    );
    format!(
        "    - bash:\n        directory: \"{}\"\n        bindings:\n          - {{arg: token, value: {{param: billing_token}}}}\n",
        tools.display()
    )
}

/// The invoices world, its agent exposing its tools (and `extra` spliced
/// into its spec).
async fn world(extra: &str) -> World {
    let w = World::with_toolboxes(no_model, leaky).await;
    let text = std::fs::read_to_string(&w.agent).unwrap().replace(
        "  toolboxes:",
        &format!("  mcp:\n    exposeTools: true\n{extra}  toolboxes:"),
    );
    std::fs::write(&w.agent, text).unwrap();
    w
}

/// A server with the tenant pinned and the billing token from the
/// environment (as the operator gives them), and the MCP client token.
fn start(w: &World) -> (Sidecar, Api) {
    w.start(
        &["--pin", "tenant=acme-corp", "--log-format", "json"],
        &[
            ("BINDERY_PARAM_BILLING_TOKEN", CANARY),
            ("BINDERY_MCP_CLIENT_TOKEN", CLIENT),
            ("BINDERY_LOG", "debug"),
        ],
    )
}

fn connection(token: &str, calls: Value) -> Value {
    json!({"headers": {"Authorization": format!("Bearer {token}")}, "calls": calls})
}

async fn client(sidecar: &Sidecar, connections: Value) -> Vec<Value> {
    let out = mcp_client::run(&json!({
        "url": format!("{}/mcp", sidecar.url),
        "connections": connections,
    }))
    .await;
    out["connections"].as_array().unwrap().clone()
}

fn names(conn: &Value) -> Vec<String> {
    conn["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {conn}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn text(call: &Value) -> String {
    call["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {call}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_no_bound_argument_and_cannot_override_the_tenant() {
    let w = world("").await;
    let (mut sidecar, api) = start(&w);
    let injected = json!({"status": "overdue", "tenant_id": "globex", "token": "attacker"});
    let conns = client(
        &sidecar,
        json!([
            connection(OWNER, json!([
                {"tool": "bash_query-invoices", "arguments": injected},
                {"tool": "bash_leak", "arguments": {}},
                {"tool": "bash_query-invoices", "arguments": {"status": "overdue"},
                 "meta": {"agents-exe/params": {"tenant": "globex"}}},
                {"tool": "bash_nothing", "arguments": {}},
            ])),
            connection(CLIENT, json!([
                {"tool": "bash_query-invoices", "arguments": {"status": "paid", "tenant_id": "initech"}},
                {"tool": "ask_invoices", "arguments": {"prompt": "hi"}},
            ])),
        ]),
    )
    .await;

    // The owner sees the ask tool and the exposed ones; the schema is the
    // model's, with neither tenant_id nor token.
    let owner = &conns[0];
    assert_eq!(
        names(owner),
        ["ask_invoices", "bash_query-invoices", "bash_leak"]
    );
    let query = &owner["tools"][1];
    let props = query["inputSchema"]["properties"].as_object().unwrap();
    assert!(
        props.contains_key("status") && props.contains_key("since"),
        "{query}"
    );
    assert!(
        !props.contains_key("tenant_id") && !props.contains_key("token"),
        "{query}"
    );
    assert_eq!(query["annotations"]["readOnlyHint"], false, "{query}");
    assert!(
        query["description"]
            .as_str()
            .unwrap()
            .contains("2 of its arguments are set by the server"),
        "{query}"
    );
    // The prompt-injected tenant lost to the pinned one.
    let calls = owner["calls"].as_array().unwrap();
    let got = text(&calls[0]);
    assert_eq!(calls[0]["result"]["isError"], false, "{}", calls[0]);
    assert!(got.contains("INV-1002"), "{got}");
    assert!(!got.contains("INV-2002"), "globex's invoice: {got}");
    // A secret the tool prints is scrubbed from what comes back.
    let leak = text(&calls[1]);
    assert!(leak.starts_with("my token is "), "{leak}");
    assert!(!leak.contains(CANARY), "{leak}");
    // A pinned value cannot come in _meta either: the same refusal as the API's.
    assert_eq!(
        calls[2]["error"]["data"]["error"], "forbidden_params",
        "{}",
        calls[2]
    );
    assert_eq!(calls[2]["error"]["data"]["params"], json!(["tenant"]));
    assert!(calls[3]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown tool"));

    // The MCP client token: the exposed tools only.
    let other = &conns[1];
    assert_eq!(names(other), ["bash_query-invoices", "bash_leak"]);
    let got = text(&other["calls"][0]);
    assert!(
        got.contains("INV-1001") && !got.contains("INV-3001"),
        "{got}"
    );
    assert!(other["calls"][1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("exposed tools only"));

    // Each call is a session of its own, recorded as the client made it
    // (never a bound value), with the caller in its events.
    let sessions = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
    assert_eq!(
        sessions.json["sessions"].as_array().unwrap().len(),
        3,
        "{}",
        sessions.text
    );
    let id = calls[0]["result"]["_meta"]["bindery.dev/session_id"]
        .as_str()
        .unwrap();
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert!(
        view.text.contains("attacker") && view.text.contains("globex"),
        "{}",
        view.text
    );
    assert!(!view.text.contains(CANARY), "{}", view.text);
    let (_, raw) = first_event(&api, id, "run_finished").await;
    assert!(raw.contains("\"caller\":\"mcp\""), "{raw}");
    assert!(!raw.contains(CANARY));
    let agent = api
        .call("GET", "/v1/agents/invoices", Some(OWNER), None)
        .await;
    assert_eq!(agent.json["exposes_tools"], true, "{}", agent.text);
    let metrics = api.call("GET", "/metrics", None, None).await;
    assert_eq!(
        sample(
            &metrics.text,
            "bindery_tool_calls_total{tool=\"bash_query-invoices\",outcome=\"ok\",caller=\"mcp\",agent=\"invoices\"}"
        ),
        Some(2.0),
        "{}",
        metrics.text
    );
    assert!(w.mock.requests().is_empty(), "the model was asked");
    sidecar.stop();
    let logs = sidecar.logs();
    assert!(logs.contains("\"caller\":\"mcp\""), "no caller in the logs");
    assert!(!logs.contains(CANARY), "the secret in the logs");
    assert!(!contains(
        &raw_files(w.dir.path(), "bindery.sqlite"),
        CANARY
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_tool_waits_and_is_answered_by_the_owner() {
    let w = world("  confirm:\n    - {tool: bash_query-invoices}\n").await;
    let (_sidecar, api) = start(&w);
    let conns = client(
        &_sidecar,
        json!([
            connection(OWNER, json!([
                {"tool": "bash_query-invoices", "arguments": {"status": "open", "tenant_id": "globex"}},
            ])),
            connection(CLIENT, json!([
                {"tool": "bash_query-invoices", "arguments": {"status": "overdue"}},
            ])),
        ]),
    )
    .await;
    // The call did not run: an error result carrying the pending item.
    let waited = &conns[0]["calls"][0]["result"];
    assert_eq!(waited["isError"], true, "{waited}");
    let item = &waited["structuredContent"]["pending"][0];
    assert_eq!(item["disposition"], "confirm", "{waited}");
    assert_eq!(item["tool"], "bash_query-invoices");
    assert_eq!(
        item["call"]["tenant_id"], "globex",
        "the call as the client made it"
    );
    let token = item["continuation_token"]
        .as_str()
        .expect("the owner's token");
    let session = waited["structuredContent"]["session_id"].as_str().unwrap();

    // The client token's call waits too, and is shown no token to answer with.
    let theirs = &conns[1]["calls"][0]["result"];
    assert_eq!(theirs["isError"], true, "{theirs}");
    assert!(
        theirs["structuredContent"]["pending"][0]
            .get("continuation_token")
            .is_none(),
        "{theirs}"
    );
    assert!(!theirs.to_string().contains("ct_"), "{theirs}");

    // The owner approves through the session API; the call runs, with the
    // pinned tenant, and ends the run without a model turn.
    let r = answer(&api, token, json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["session_id"], session);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let last = r.json["session"]["turns"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool", "{}", r.text);
    assert!(
        last["content"].as_str().unwrap().contains("INV-1003"),
        "{last}"
    );

    // The client token's item, answered again through _meta by the owner's
    // MCP client: the same continuation, the result in the answer.
    let rec = api
        .call(
            "GET",
            &format!(
                "/v1/sessions/{}",
                theirs["structuredContent"]["session_id"].as_str().unwrap()
            ),
            Some(OWNER),
            None,
        )
        .await;
    let token = rec.json["pending"][0]["continuation_token"]
        .as_str()
        .unwrap();
    let conns = client(
        &_sidecar,
        json!([
            connection(
                CLIENT,
                json!([
                    {"tool": "bash_query-invoices", "arguments": {},
                     "meta": {"bindery.dev/continuations": [{"token": token, "approve": true}]}},
                ])
            ),
            connection(
                OWNER,
                json!([
                    {"tool": "bash_query-invoices", "arguments": {},
                     "meta": {"bindery.dev/continuations": [{"token": token, "approve": true}]}},
                ])
            ),
        ]),
    )
    .await;
    let refused = &conns[0]["calls"][0]["error"];
    assert_eq!(refused["data"]["error"], "forbidden", "{refused}");
    let answered = &conns[1]["calls"][0];
    assert_eq!(answered["result"]["isError"], false, "{answered}");
    assert!(text(answered).contains("INV-1002"), "{answered}");
    assert!(w.mock.requests().is_empty(), "the model was asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_depends_on_tool_asks_for_its_selection() {
    let b = booking::booking(booking::two_slots(), |t| {
        t.replace(
            "  toolboxes:",
            "  mcp:\n    exposeTools: true\n  toolboxes:",
        )
    })
    .await;
    let (mut sidecar, api) = b.start();
    let call =
        json!({"tool": "bash_book", "arguments": {"date": booking::DAY, "service": "haircut"}});
    let conns = client(
        &sidecar,
        json!([
            // The handshake's protocol: the items come back to answer.
            connection(OWNER, json!([call.clone()])),
            // 2026-07-28, which asks through elicitation.
            {"mode": "2026-07-28", "headers": {"Authorization": format!("Bearer {OWNER}")},
             "elicit": [{"choose": "11:00"}, {"action": "accept", "content": {"approve": true}}],
             "calls": [call]},
        ]),
    )
    .await;

    // The schema is the model's: the slot token a lookup fills is not there.
    let tools = conns[0]["tools"].as_array().unwrap();
    let book = tools.iter().find(|t| t["name"] == "bash_book").unwrap();
    assert!(
        book["inputSchema"]["properties"]
            .get("slot_token")
            .is_none(),
        "{book}"
    );
    assert!(
        book["inputSchema"]["properties"].get("api_key").is_none(),
        "{book}"
    );

    let waited = &conns[0]["calls"][0]["result"];
    assert_eq!(waited["isError"], true, "{waited}");
    let item = &waited["structuredContent"]["pending"][0];
    assert_eq!(item["disposition"], "needs_selection", "{waited}");
    let labels: Vec<&str> = item["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["10:00", "11:00"], "{item}");
    assert!(
        !waited.to_string().contains("slot-b"),
        "a real slot token: {waited}"
    );

    // Through elicitation: the choice, then the confirmation, then booked.
    let modern = &conns[1];
    let asked = modern["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "{modern}");
    assert!(
        asked[0]["requestedSchema"]["properties"]["choice"]["oneOf"].is_array(),
        "{}",
        asked[0]
    );
    assert!(
        asked[1]["message"].as_str().unwrap().contains("11:00"),
        "{}",
        asked[1]
    );
    let booked = &modern["calls"][0];
    assert_eq!(booked["result"]["isError"], false, "{booked}");
    assert!(text(booked).contains("\"booked\": true"), "{booked}");
    assert_eq!(b.bookings(), vec![format!("{} slot-b", booking::DAY)]);
    assert!(!modern.to_string().contains("slot-b"), "{modern}");

    // The first client's item is answered through the session API.
    let token = item["continuation_token"].as_str().unwrap();
    let choice = item["options"][0]["id"].as_str().unwrap();
    let r = answer(&api, token, json!({"choice": choice})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["pending"][0]["disposition"], "needs_confirmation",
        "{}",
        r.text
    );
    sidecar.stop();
    let logs = sidecar.logs();
    assert!(!logs.contains(CANARY), "the API key in the logs");
    for c in &conns {
        assert!(!c.to_string().contains(CANARY));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_reaches_only_its_own_sessions_ask() {
    let w = World::new(tool_then_answer).await;
    let text_ = std::fs::read_to_string(&w.agent).unwrap().replace(
        "  toolboxes:",
        "  mcp:\n    exposeTools: true\n  toolboxes:",
    );
    std::fs::write(&w.agent, text_).unwrap();
    let (sidecar, api) = w.start(&[], &[]);
    let r = create(
        &api,
        json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
    )
    .await;
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let token = r.json["session_token"].as_str().unwrap().to_string();
    let other = new_session(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    let with_session = |session: &str, calls: Value| {
        json!({"headers": {"Authorization": format!("Bearer {token}"), "Bindery-Session-Id": session},
               "calls": calls})
    };
    let conns = client(
        &sidecar,
        json!([
            with_session(
                &id,
                json!([
                    {"tool": "ask_invoices", "arguments": {"prompt": "which are overdue?"}},
                    {"tool": "bash_query-invoices", "arguments": {}},
                    {"tool": "ask_invoices", "arguments": {"prompt": "x"},
                     "meta": {"bindery.dev/session_id": other}},
                ])
            ),
            // Another session's id with this token: as good as no token.
            with_session(&other, json!([])),
        ]),
    )
    .await;
    let mine = &conns[0];
    assert_eq!(names(mine), ["ask_invoices"]);
    let calls = mine["calls"].as_array().unwrap();
    assert!(text(&calls[0]).starts_with("answer: "), "{}", calls[0]);
    assert_eq!(
        calls[0]["result"]["_meta"]["bindery.dev/session_id"],
        id.as_str()
    );
    assert!(calls[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown tool"));
    assert!(calls[2]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown tool"));
    assert_eq!(conns[1]["error"]["code"], -32001, "{}", conns[1]);
    // The message went into the token's own session.
    let s = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert!(s.text.contains("which are overdue?"), "{}", s.text);
    let o = api
        .call("GET", &format!("/v1/sessions/{other}"), Some(OWNER), None)
        .await;
    assert!(!o.text.contains("which are overdue?"), "{}", o.text);
}

/// rmcp's client (protocol 2026-07-28, no handshake) lists an exposed tool
/// without its bound arguments and calls it with a prompt-injected tenant:
/// the pinned tenant is the one the tool reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_calls_an_exposed_tool_with_the_pinned_tenant() {
    use rmcp::model::CallToolRequestParams;

    let w = world("").await;
    let (mut sidecar, _api) = start(&w);
    let client = stateless_mcp_client(&sidecar.url, CLIENT, Default::default()).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    let query = tools
        .iter()
        .find(|t| t.name == "bash_query-invoices")
        .expect("the exposed tool");
    let schema = serde_json::to_value(&query.input_schema).unwrap();
    assert!(schema["properties"].get("tenant_id").is_none(), "{schema}");
    assert!(schema["properties"].get("token").is_none(), "{schema}");

    let call = CallToolRequestParams::new("bash_query-invoices").with_arguments(
        json!({"tenant_id": "globex", "token": "stolen", "status": "overdue"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let result = client.call_tool(call).await.expect("tools/call");
    let text = serde_json::to_string(&result).unwrap();
    assert_eq!(result.is_error, Some(false), "{text}");
    assert!(
        text.contains("INV-1002") && !text.contains("INV-2002"),
        "{text}"
    );
    let leak = client
        .call_tool(CallToolRequestParams::new("bash_leak"))
        .await
        .expect("tools/call");
    let text = serde_json::to_string(&leak).unwrap();
    assert!(
        text.contains("my token is") && !text.contains(CANARY),
        "{text}"
    );
    client.cancel().await.ok();
    sidecar.stop();
    assert!(!sidecar.logs().contains(CANARY));
}

/// A toolbox declared `cache: shared` whose `count` tool appends a line to
/// `calls` each time it really runs.
fn counting(dir: &std::path::Path) -> String {
    let tools = dir.join("counting");
    std::fs::create_dir_all(&tools).unwrap();
    bindery_tests::fixtures::bash_tool(
        &tools,
        "count",
        "Counts its runs.",
        &format!(
            "echo run >> '{}'\necho \"counted\"\n",
            dir.join("calls").display()
        ),
    );
    format!(
        "    - bash:\n        directory: \"{}\"\n        cache: shared\n",
        tools.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_tools_result_is_cached_like_a_models_call() {
    let w = World::with_toolboxes(no_model, counting).await;
    let text_ = std::fs::read_to_string(&w.agent).unwrap().replace(
        "  toolboxes:",
        "  mcp:\n    exposeTools: true\n  toolboxes:",
    );
    std::fs::write(&w.agent, text_).unwrap();
    let (sidecar, _api) = w.start(
        &["--tool-cache-ttl", "60", "--pin", "tenant=acme-corp"],
        &[("BINDERY_PARAM_BILLING_TOKEN", CANARY)],
    );
    let call = json!({"tool": "bash_count", "arguments": {}});
    let conns = client(
        &sidecar,
        json!([connection(OWNER, json!([call.clone(), call]))]),
    )
    .await;
    for c in conns[0]["calls"].as_array().unwrap() {
        assert_eq!(text(c).trim(), "counted", "{c}");
    }
    let runs = std::fs::read_to_string(w.dir.path().join("calls")).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "the second call ran the tool again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_a_named_session_takes_that_sessions_values() {
    let w = world("").await;
    // No process values this time: the session brings them.
    let (sidecar, api) = w.start(&[], &[("BINDERY_MCP_CLIENT_TOKEN", CLIENT)]);
    let secret = "session-secret-5b2e";
    let id = new_session(
        &api,
        json!({"agent": "invoices", "params": {"tenant": "globex", "billing_token": secret}}),
    )
    .await;
    let in_session = |tool: &str| {
        json!({"tool": tool, "arguments": {"status": "overdue", "tenant_id": "initech"},
               "meta": {"bindery.dev/session_id": id}})
    };
    let conns = client(
        &sidecar,
        json!([
            connection(
                OWNER,
                json!([
                    in_session("bash_query-invoices"),
                    in_session("bash_leak"),
                    // Without the session, the tenant is missing.
                    {"tool": "bash_query-invoices", "arguments": {}},
                ])
            ),
            connection(CLIENT, json!([in_session("bash_query-invoices")])),
        ]),
    )
    .await;
    let calls = conns[0]["calls"].as_array().unwrap();
    let got = text(&calls[0]);
    assert!(
        got.contains("INV-2002") && !got.contains("INV-1002"),
        "{got}"
    );
    assert_eq!(
        calls[0]["result"]["_meta"]["bindery.dev/session_id"],
        id.as_str()
    );
    let leak = text(&calls[1]);
    assert!(
        leak.starts_with("my token is ") && !leak.contains(secret),
        "{leak}"
    );
    assert_eq!(
        calls[2]["error"]["data"]["error"], "params_required",
        "{}",
        calls[2]
    );
    // The client token may not borrow a session's values.
    assert_eq!(
        conns[1]["calls"][0]["error"]["data"]["error"], "forbidden",
        "{}",
        conns[1]
    );

    // The calls are in the session's history, and it keeps its secret.
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(view.json["status"], "idle", "{}", view.text);
    assert_eq!(
        view.json["secret_params"],
        json!(["billing_token"]),
        "{}",
        view.text
    );
    let tools: Vec<&Value> = view.json["session"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "tool")
        .collect();
    assert_eq!(tools.len(), 2, "{}", view.text);
    assert!(!view.text.contains(secret), "{}", view.text);
    assert!(w.mock.requests().is_empty(), "the model was asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_agents_each_tool_is_named_by_its_agent() {
    let w = world("").await;
    let billing = w.dir.path().join("billing.yaml");
    std::fs::write(
        &billing,
        std::fs::read_to_string(&w.agent)
            .unwrap()
            .replace("name: invoices", "name: billing"),
    )
    .unwrap();
    let (sidecar, _api) = serve(
        &w.agent,
        &w.store,
        &[
            "--agent-file",
            billing.to_str().unwrap(),
            "--pin",
            "tenant=acme-corp",
        ],
        &[("BINDERY_PARAM_BILLING_TOKEN", CANARY)],
        w.dir.path(),
    );
    let conns = client(
        &sidecar,
        json!([connection(
            OWNER,
            json!([
                {"tool": "billing__bash_query-invoices", "arguments": {"status": "paid"}},
                {"tool": "bash_query-invoices", "arguments": {}},
            ])
        )]),
    )
    .await;
    let mut listed = names(&conns[0]);
    listed.sort();
    assert_eq!(
        listed,
        [
            "ask_billing",
            "ask_invoices",
            "billing__bash_leak",
            "billing__bash_query-invoices",
            "invoices__bash_leak",
            "invoices__bash_query-invoices",
        ]
    );
    let calls = conns[0]["calls"].as_array().unwrap();
    assert!(text(&calls[0]).contains("INV-1001"), "{}", calls[0]);
    assert!(calls[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown tool"));
}

/// docs/mcp.md's Python example, as written: the example agent served
/// with its tenant pinned and an MCP client token, and the script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_python_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let token = dir.path().join("mcp-token");
    std::fs::write(&token, "doc-example-token\n").unwrap();
    let agent = repo().join("examples/mcp-client/invoices.yaml");
    let (sidecar, _api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[
            "--pin",
            "tenant=acme-corp",
            "--mcp-client-token-file",
            token.to_str().unwrap(),
        ],
        &[],
        dir.path(),
    );
    let python = std::env::var_os("BINDERY_MCP_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo().join("tests/mcp/.venv/bin/python"));
    let out = tokio::process::Command::new(python)
        .arg(repo().join("examples/mcp-client/pinned_tools.py"))
        .arg(format!("{}/mcp", sidecar.url))
        .arg(&token)
        .output()
        .await
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "bash_query-invoices ['since', 'status']\n2026-10-01\tINV-1002\t850.50 EUR\toverdue\n"
    );
}
