//! `POST /mcp` driven by a real MCP client (the official Python SDK, see
//! `tests/mcp/client.py`) against the real server and the mock model:
//! `initialize`, `tools/list`, `tools/call` with `Agents-Param-*` headers
//! and with `_meta`, every code of the validation table, and the owner
//! token. Then the transport's edges over plain HTTP.

use std::time::Duration;

use crate::common::*;
use bindery_tests::mock_llm::MockReply;
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn post(api: &Api, headers: &[(&str, &str)], body: &str) -> (u16, Value, Option<String>) {
    let mut req = api
        .http
        .post(format!("{}/mcp", api.base))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        allow,
    )
}

/// The transport's edges, over plain HTTP: notifications, batches,
/// protocol versions, `Accept`, malformed bodies, `GET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_over_plain_http() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let owner = bearer(OWNER);
    let auth = ("authorization", owner.as_str());
    let both = ("accept", "application/json, text/event-stream");

    // initialize agrees on the client's version when it can.
    for (asked, agreed) in [
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2024-11-05", "2025-11-25"),
    ] {
        let (s, v, _) = post(
            &api,
            &[auth, both],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": asked, "capabilities": {},
                               "clientInfo": {"name": "curl", "version": "0"}}})
            .to_string(),
        )
        .await;
        assert_eq!(
            (s, v["result"]["protocolVersion"].clone()),
            (200, json!(agreed)),
            "{v}"
        );
    }

    // A notification or a response: 202, no body.
    let (s, v, _) = post(
        &api,
        &[auth],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!((s, v), (202, Value::Null));
    let (s, _, _) = post(&api, &[auth], r#"{"jsonrpc":"2.0","id":7,"result":{}}"#).await;
    assert_eq!(s, 202);

    // Batches in 2025-03-26 (the default without a version header) only.
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},
                    {"jsonrpc":"2.0","method":"notifications/initialized"},
                    {"jsonrpc":"2.0","id":2,"method":"initialize","params":{}},
                    {"jsonrpc":"2.0","id":3,"method":"tools/list"}]"#;
    let (s, v, _) = post(&api, &[auth], batch).await;
    assert_eq!(s, 200, "{v}");
    let answers = v.as_array().unwrap();
    assert_eq!(answers.len(), 3, "{v}");
    assert_eq!(answers[0], json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    assert_eq!(answers[1]["error"]["code"], -32600);
    assert_eq!(answers[2]["result"]["tools"][0]["name"], "ask_invoices");
    let (s, v, _) = post(&api, &[auth, ("mcp-protocol-version", "2025-06-18")], batch).await;
    assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32600)), "{v}");
    let (s, _, _) = post(&api, &[auth], "[]").await;
    assert_eq!(s, 400);

    // Versions and media types.
    let ping = r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#;
    let (s, v, _) = post(&api, &[auth, ("mcp-protocol-version", "2025-11-25")], ping).await;
    assert_eq!((s, v["result"].clone()), (200, json!({})));
    let (s, _, _) = post(&api, &[auth, ("mcp-protocol-version", "2099-01-01")], ping).await;
    assert_eq!(s, 400);
    let (s, _, _) = post(&api, &[auth, ("accept", "text/event-stream")], ping).await;
    assert_eq!(s, 406);

    // Malformed messages and unknown methods.
    let (s, v, _) = post(&api, &[auth], "{not json").await;
    assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32700)));
    let (s, v, _) = post(&api, &[auth], r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#).await;
    assert_eq!(
        (s, v["id"].clone(), v["error"]["code"].clone()),
        (400, json!(1), json!(-32600))
    );
    let (s, v, _) = post(
        &api,
        &[auth],
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#,
    )
    .await;
    assert_eq!((s, v["error"]["code"].clone()), (200, json!(-32601)));

    // The owner token is checked first, as on every other route.
    let (s, v, _) = post(&api, &[], ping).await;
    assert_eq!(
        (s, v["error"]["data"]["error"].clone()),
        (401, json!("unauthorized"))
    );

    // No stream to open, no session to delete.
    for method in ["GET", "DELETE"] {
        let r = api
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{}/mcp", api.base),
            )
            .header("authorization", owner.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method}");
        assert_eq!(r.headers()["allow"], "POST");
    }
    assert_eq!(w.mock.request_count(), 0);
}

/// A client that goes away during a call cancels its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_run() {
    let w = World::new(|_| MockReply::text("late").delayed(Duration::from_secs(120))).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "ask_invoices", "arguments": {"prompt": "slow"},
                   "_meta": {"agents-exe/params": {"tenant": "acme-corp", "billing_token": CANARY}}}});
    let request = api
        .http
        .post(format!("{}/mcp", api.base))
        .bearer_auth(OWNER)
        .json(&call)
        .send();
    let pending = tokio::spawn(request);
    // Wait until the model has the request: the run is in flight.
    until("the model gets the request", PATIENCE, || {
        w.mock.request_count() > 0
    })
    .await;
    assert_eq!(w.mock.request_count(), 1);
    pending.abort();
    let _ = pending.await;

    let last = eventually("the cancelled run's session is idle", PATIENCE, || async {
        let r = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
        let last = r.json["sessions"][0].clone();
        (last["status"] == "idle").then_some(last)
    })
    .await;
    let id = last["session_id"].as_str().unwrap();
    // The run records its end first; its secrets are dropped right after.
    let r = eventually("the session's secrets are dropped", PATIENCE, || async {
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        (r.json["secret_params"] == json!([])).then_some(r)
    })
    .await;
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
}

/// A client of protocol 2026-07-28 (rmcp's, with no handshake: it
/// discovers, then every request describes itself) lists the agents and
/// asks one, its values in `Agents-Param-*` headers and `_meta`; the
/// secret reaches the tool and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_the_stateless_protocol_discovers_lists_and_calls() {
    use rmcp::model::CallToolRequestParams;

    let w = World::new(tool_then_answer).await;
    let (sidecar, _api) = w.start(&[], &[]);
    let headers = [(
        reqwest::header::HeaderName::from_static("agents-param-billing-token"),
        reqwest::header::HeaderValue::from_static(CANARY),
    )]
    .into_iter()
    .collect();
    let client = stateless_mcp_client(&sidecar.url, OWNER, headers).await;

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"ask_invoices"), "{names:?}");

    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.insert("agents-exe/params".into(), json!({"tenant": "acme-corp"}));
    let mut call = CallToolRequestParams::new("ask_invoices").with_arguments(
        json!({"prompt": "which invoices are overdue?"})
            .as_object()
            .unwrap()
            .clone(),
    );
    call.meta = Some(meta);
    let result = client.call_tool(call).await.expect("tools/call");
    let text = serde_json::to_string(&result).unwrap();
    assert_eq!(result.is_error, Some(false), "{text}");
    assert!(text.contains("INV-1002"), "{text}");
    assert!(!text.contains(CANARY), "{text}");
    client.cancel().await.ok();
}

/// The official Python SDK's client (tests/mcp/client.py, its virtualenv
/// from tests/setup.sh): the `interop-tests` feature.
#[cfg(feature = "interop-tests")]
mod python_client {
    use super::*;
    use bindery_tests::mcp_client;
    use bindery_tests::mock_llm::{last_message, tool_schema};

    fn plan(url: &str, connections: Value) -> Value {
        json!({"url": format!("{url}/mcp"), "connections": connections})
    }

    fn ask(prompt: &str, meta: Value) -> Value {
        json!({"tool": "ask_invoices", "arguments": {"prompt": prompt}, "meta": meta})
    }

    fn params(v: Value) -> Value {
        json!({"agents-exe/params": v})
    }

    /// A call's JSON-RPC error as `(code, REST status, REST code, params)`.
    fn rpc_error(call: &Value) -> (i64, u64, String, Vec<String>) {
        let e = &call["error"];
        assert!(e.is_object(), "not an error: {call}");
        let names = e["data"]["params"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        (
            e["code"].as_i64().unwrap(),
            e["data"]["status"].as_u64().unwrap_or(0),
            e["data"]["error"].as_str().unwrap_or("").to_string(),
            names,
        )
    }

    fn refused(
        code: i64,
        status: u64,
        rest: &str,
        names: &[&str],
    ) -> (i64, u64, String, Vec<String>) {
        (
            code,
            status,
            rest.to_string(),
            names.iter().map(|s| s.to_string()).collect(),
        )
    }

    /// A call's answer text, after checking it is a successful result.
    fn answer(call: &Value) -> String {
        let r = &call["result"];
        assert_eq!(r["isError"], false, "{call}");
        assert_eq!(r["content"][0]["type"], "text", "{call}");
        r["content"][0]["text"].as_str().unwrap().to_string()
    }

    /// The model requests whose user message is `prompt`.
    fn requests_for(w: &World, prompt: &str) -> Vec<Value> {
        w.mock
            .requests()
            .into_iter()
            .filter(|r| {
                r["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["role"] == "user" && m["content"] == prompt)
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_real_mcp_client_asks_the_agent_with_header_and_meta_values() {
        let w = World::new(tool_then_answer).await;
        let (sidecar, api) = w.start(&["--log-format", "json"], &[("BINDERY_LOG", "debug")]);
        // A session token of some session: it must not open /mcp.
        let r = create(
            &api,
            json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
        )
        .await;
        let session_token = r.json["session_token"].as_str().unwrap().to_string();

        let out = mcp_client::run(&plan(
            &sidecar.url,
            json!([
                {
                    "headers": {
                        "Authorization": bearer(OWNER),
                        "Agents-Param-Tenant": "acme-corp",
                        "Agents-Param-Billing-Token": CANARY,
                    },
                    "calls": [
                        ask("from headers", json!(null)),
                        ask("meta wins", params(json!({"tenant": "globex"}))),
                        ask("typo", params(json!({"tennant": "initech"}))),
                        ask("process scope", params(json!({"region": "us"}))),
                        ask("a number for a secret", params(json!({"billing_token": 4242}))),
                        ask("null removes the header's value", params(json!({"billing_token": null}))),
                        {"tool": "ask_nobody", "arguments": {"prompt": "x"}},
                        {"tool": "ask_invoices", "arguments": {}},
                    ],
                },
                {
                    "headers": {"Authorization": bearer(OWNER)},
                    "calls": [
                        ask("nothing given", json!(null)),
                        ask("all in meta", params(json!({"tenant": "globex", "billing_token": CANARY}))),
                    ],
                },
                {"headers": {"Authorization": bearer("not-the-owner-token")}},
                {"headers": {"Authorization": bearer(&session_token)}},
                {"headers": {}},
            ]),
        ))
        .await;
        let conns = out["connections"].as_array().unwrap();

        // initialize and tools/list.
        let first = &conns[0];
        let init = &first["initialize"];
        assert_eq!(init["protocolVersion"], "2025-11-25", "{init}");
        assert_eq!(
            init["capabilities"],
            json!({"tools": {"listChanged": false}})
        );
        assert_eq!(init["serverInfo"]["name"], "bindery-sidecar");
        let tools = first["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 1, "{tools:?}");
        assert_eq!(tools[0]["name"], "ask_invoices");
        assert_eq!(
            tools[0]["inputSchema"]["required"],
            json!(["prompt"]),
            "{}",
            tools[0]
        );
        let description = tools[0]["description"].as_str().unwrap();
        assert!(
            description.starts_with("answers questions about one tenant's invoices."),
            "{description}"
        );
        assert!(
            description.contains("tenant (required)")
                && description.contains("billing_token (secret, required)")
                && !description.contains("region"),
            "{description}"
        );

        // tools/call: header values, then _meta winning over a header.
        let calls = first["calls"].as_array().unwrap();
        let text = answer(&calls[0]);
        assert!(
            text.contains("INV-1002") && !text.contains("INV-2002"),
            "{text}"
        );
        let text = answer(&calls[1]);
        assert!(
            text.contains("INV-2002") && !text.contains("INV-1002"),
            "{text}"
        );

        // Every code of the validation table, as a JSON-RPC error carrying
        // the REST code, status and names.
        assert_eq!(
            rpc_error(&calls[2]),
            refused(-32602, 422, "unknown_params", &["tennant"])
        );
        assert_eq!(
            rpc_error(&calls[3]),
            refused(-32602, 403, "forbidden_params", &["region"])
        );
        assert_eq!(
            rpc_error(&calls[4]),
            refused(-32602, 422, "invalid_params", &["billing_token"])
        );
        assert_eq!(
            rpc_error(&calls[5]),
            refused(-32602, 422, "params_required", &["billing_token"])
        );
        let message = calls[5]["error"]["message"].as_str().unwrap();
        assert!(message.contains("Agents-Param-"), "{message}");
        // Not a tool, no prompt: invalid params without a REST code.
        for call in &calls[6..8] {
            assert_eq!(call["error"]["code"], -32602, "{call}");
            assert!(call["error"]["data"].is_null(), "{call}");
        }
        assert_eq!(calls.len(), 8);

        let second = conns[1]["calls"].as_array().unwrap();
        assert_eq!(
            rpc_error(&second[0]),
            refused(-32602, 422, "params_required", &["tenant", "billing_token"])
        );
        assert!(answer(&second[1]).contains("INV-2002"), "{}", second[1]);

        // Without the owner token: refused before anything else, and a session
        // token is no owner token.
        for c in &conns[2..5] {
            assert!(c["initialize"].is_null(), "{c}");
            assert_eq!(c["error"]["code"], -32001, "{c}");
            assert_eq!(
                c["error"]["data"],
                json!({"error": "unauthorized", "status": 401})
            );
        }

        // The model saw each prompt with the bound arguments gone from the
        // tool's schema, and none of the refused calls reached it.
        for prompt in ["from headers", "meta wins", "all in meta"] {
            let reqs = requests_for(&w, prompt);
            assert_eq!(reqs.len(), 2, "{prompt}: a tool call, then the answer");
            let schema = tool_schema(&reqs[0], "bash_query-invoices").unwrap();
            let props = schema["properties"].as_object().unwrap();
            assert!(
                !props.contains_key("tenant_id") && !props.contains_key("token"),
                "{schema}"
            );
            assert_eq!(last_message(&reqs[1])["role"], "tool");
        }
        assert_eq!(w.mock.request_count(), 6);

        // Each call is a session of the owner's, kept and listed; its secret
        // is gone from memory once the call is answered.
        let id = calls[0]["result"]["_meta"]["bindery.dev/session_id"]
            .as_str()
            .unwrap();
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["params"], json!({"tenant": "acme-corp"}));
        assert_eq!(r.json["secret_params"], json!([]));
        assert_eq!(r.json["status"], "idle");
        assert_eq!(r.json["session"]["turns"][0]["content"], "from headers");
        assert_eq!(r.json["owner"], "mcp", "created through /mcp");
        assert_eq!(r.json["parent_session_id"], json!(null));
        let r = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
        assert_eq!(
            r.json["sessions"].as_array().unwrap().len(),
            4,
            "{}",
            r.text
        );

        // The secret is in no log line, no model request, no answer.
        let logs = sidecar.logs();
        assert!(logs.contains("MCP tools/call"), "debug logs were captured");
        assert!(!logs.contains(CANARY), "the log holds the secret:\n{logs}");
        for (headers, body) in w.mock.raw_requests() {
            assert!(!body.contains(CANARY));
            assert!(headers.iter().all(|(_, v)| !v.contains(CANARY)));
        }
        assert!(!out.to_string().contains(CANARY));
        assert!(!contains(
            &raw_files(&w.dir.path().join("store"), "bindery.sqlite"),
            CANARY
        ));
    }

    /// A pinned value is `forbidden_params` over MCP too, and used when no
    /// client gives one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pinned_value_cannot_be_overridden_over_mcp() {
        let w = World::new(tool_then_answer).await;
        let (sidecar, _api) = w.start(&["--pin", "tenant=acme-corp"], &[]);
        let out = mcp_client::run(&plan(
            &sidecar.url,
            json!([{
                "headers": {"Authorization": bearer(OWNER), "Agents-Param-Billing-Token": CANARY},
                "calls": [
                    ask("pinned", json!(null)),
                    ask("in meta", params(json!({"tenant": "globex"}))),
                ],
            }, {
                "headers": {
                    "Authorization": bearer(OWNER),
                    "Agents-Param-Billing-Token": CANARY,
                    "Agents-Param-Tenant": "globex",
                },
                "calls": [ask("as a header", json!(null))],
            }]),
        ))
        .await;
        let first = &out["connections"][0];
        let description = first["tools"][0]["description"].as_str().unwrap();
        assert!(!description.contains("tenant ("), "{description}");
        let calls = first["calls"].as_array().unwrap();
        assert!(answer(&calls[0]).contains("INV-1002"), "{}", calls[0]);
        assert_eq!(
            rpc_error(&calls[1]),
            refused(-32602, 403, "forbidden_params", &["tenant"])
        );
        let header = &out["connections"][1]["calls"][0];
        assert_eq!(
            rpc_error(header),
            refused(-32602, 403, "forbidden_params", &["tenant"])
        );
        assert_eq!(w.mock.request_count(), 2, "one run: `pinned`");
    }
}
