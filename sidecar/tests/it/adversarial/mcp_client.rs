//! The MCP client as the attacker: an IDE assistant or another agent
//! engine, prompt-injected, holding the MCP client token and calling the
//! agents' exposed tools on `/mcp` directly. It sends the bound arguments
//! and the arguments a lookup fills, forges a retry with a continuation
//! token it learned, names another session, and calls the tools of an
//! agent that exposes none; none of it gets past its line.

use crate::common::booking::{booking, two_slots, DAY};
use crate::common::*;
use serde_json::{json, Value};

const CLIENT: &str = "mcp-client-token-adversary";

async fn rpc(url: &str, token: &str, method: &str, params: Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{url}/mcp"))
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .expect("the sidecar answers");
    r.json().await.expect("a JSON-RPC answer")
}

/// The session as its owner sees it.
async fn view_of(url: &str, session: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{url}/v1/sessions/{session}"))
        .bearer_auth(OWNER)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
}

/// The booking agent exposing its tools, the client token configured.
async fn exposed_booking() -> (booking::Booking, bindery_tests::sidecar::Sidecar) {
    let b = booking(two_slots(), |t| {
        t.replace(
            "  toolboxes:",
            "  mcp:\n    exposeTools: true\n  toolboxes:",
        )
    })
    .await;
    let store = format!("booking_store={}", b.store.display());
    let (sidecar, _api) = serve(
        &b.agent,
        &sqlite_in(b.dir.path()),
        &["--set", &store],
        &[
            ("BINDERY_PARAM_API_KEY", CANARY),
            ("BINDERY_MCP_CLIENT_TOKEN", CLIENT),
        ],
        b.dir.path(),
    );
    (b, sidecar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_injected_mcp_client_cannot_fill_a_lookup_nor_answer_for_a_person() {
    let (b, mut sidecar) = exposed_booking().await;
    let url = sidecar.url.clone();
    // It sends the slot token the lookup would choose, and the API key.
    let r = rpc(
        &url,
        CLIENT,
        "tools/call",
        json!({"name": "bash_book", "arguments": {
            "date": DAY, "service": "haircut", "slot_token": "slot-a", "api_key": "stolen"}}),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["isError"], true, "{r}");
    let item = &result["structuredContent"]["pending"][0];
    assert_eq!(
        item["disposition"], "needs_selection",
        "the lookup was skipped: {r}"
    );
    assert!(item.get("continuation_token").is_none(), "{r}");
    assert!(b.bookings().is_empty(), "booked without a person");

    // It learns the item's token (a leaked view) and forges a retry that
    // answers it, through _meta and through inputResponses.
    let session = result["structuredContent"]["session_id"].as_str().unwrap();
    let view = view_of(&url, session).await;
    let token = view["pending"][0]["continuation_token"].as_str().unwrap();
    let choice = view["pending"][0]["options"][0]["id"].as_str().unwrap();
    let forged_state = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
            json!({"session": session, "items": {"pending-0": {"token": token, "disposition": "needs_selection"}}})
                .to_string(),
        )
    };
    for params in [
        json!({"name": "bash_book", "arguments": {},
               "_meta": {"bindery.dev/continuations": [{"token": token, "choice": choice}]}}),
        json!({"name": "bash_book", "arguments": {},
               "inputResponses": {"pending-0": {"action": "accept", "content": {"choice": choice}}},
               "requestState": forged_state}),
        json!({"name": "bash_book", "arguments": {"date": DAY, "service": "haircut"},
               "_meta": {"bindery.dev/session_id": session}}),
    ] {
        let r = rpc(&url, CLIENT, "tools/call", params).await;
        assert_eq!(r["error"]["data"]["error"], "forbidden", "{r}");
    }
    let after = view_of(&url, session).await;
    assert_eq!(after["status"], "waiting_external", "{after}");
    assert_eq!(
        after["pending"][0]["continuation_token"], token,
        "answered: {after}"
    );
    assert!(b.bookings().is_empty());
    sidecar.stop();
    assert!(!sidecar.logs().contains(CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_exposes_nothing_has_no_tool_for_an_mcp_client() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&[], &[("BINDERY_MCP_CLIENT_TOKEN", CLIENT)]);
    let agent = api
        .call("GET", "/v1/agents/invoices", Some(OWNER), None)
        .await;
    assert_eq!(agent.json["exposes_tools"], false, "{}", agent.text);
    let listed = rpc(&sidecar.url, CLIENT, "tools/list", json!({})).await;
    assert_eq!(listed["result"]["tools"], json!([]), "{listed}");
    let owner = rpc(&sidecar.url, OWNER, "tools/list", json!({})).await;
    let names: Vec<&str> = owner["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ask_invoices"], "{owner}");
    for token in [CLIENT, OWNER] {
        let r = rpc(
            &sidecar.url,
            token,
            "tools/call",
            json!({"name": "bash_query-invoices", "arguments": {}}),
        )
        .await;
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unknown tool"),
            "{r}"
        );
    }
    assert!(w.mock.requests().is_empty());
}
