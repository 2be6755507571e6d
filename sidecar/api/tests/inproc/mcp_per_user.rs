//! A remote MCP server connected once per person: its `Authorization`
//! header is the end user's token exchanged for the server, so each
//! person's calls reach it with their own token, and a session without an
//! end user reaches it not at all.

use serde_json::{json, Value};

use crate::harness::*;
use bindery_identity::testkeys::TestIssuer;
use bindery_identity::IdentityConfig;
use bindery_tests::eventually::{eventually, PATIENCE};
use bindery_tests::mock_llm::{last_message, MockReply};
use bindery_tests::mock_mcp::MockMcp;

const AUD: &str = "bindery-chat";

fn agent(dir: &std::path::Path, mcp: &str) -> std::path::PathBuf {
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: crm
spec:
  model: {{url: "{MODEL_URL}", name: mock-model}}
  toolboxes:
    - mcp:
        name: crm
        url: "{mcp}"
        sharedToolList: true
        headers:
          Authorization: {{identity: "token:crm"}}
"#
    );
    let path = dir.join("crm.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn offers(req: &Value, tool: &str) -> bool {
    req["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == tool))
}

/// The model calls the server's `whoami` where it is offered, else
/// `connect` (then `whoami` if the run now offers it), then says what
/// the last tool said.
fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    let said = last["content"].as_str().unwrap_or("").to_string();
    match last["role"].as_str() {
        Some("tool") if said.starts_with("Connected") && offers(req, "mcp_crm_whoami") => {
            MockReply::tool_call("mcp_crm_whoami", json!({}))
        }
        Some("tool") => MockReply::text(format!("said: {said}")),
        _ if offers(req, "mcp_crm_whoami") => {
            // The model tries to act as someone else: the person is bound.
            MockReply::tool_call("mcp_crm_whoami", json!({"bindery-person": "mallory"}))
        }
        _ => MockReply::tool_call("mcp_crm_connect", json!({})),
    }
}

#[tokio::test]
async fn each_person_reaches_the_server_with_their_own_token_and_nobody_without_one() {
    let mcp = MockMcp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path(), &mcp.url);
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::identified(&[agent], dir.path(), script, config).await;
    // Nobody is connected at load: nothing was asked of the server.
    assert!(mcp.seen().is_empty(), "{:?}", mcp.seen());

    let ask = |token: String| {
        let api = server.api.clone();
        async move {
            let r = api
                .call(
                    "POST",
                    "/v1/sessions?wait=true",
                    Some(&token),
                    Some(&json!({"agent": "crm", "prompt": "who am I?"})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            r
        }
    };

    // The owner's session has no end user: the tool says so, no request.
    let r = ask(OWNER.to_string()).await;
    assert_eq!(
        last_tool_output(&r),
        "error: this tool acts with a person's account; this session has no end user",
        "{}",
        r.text
    );
    assert!(mcp.seen().is_empty(), "{:?}", mcp.seen());

    // Alice connects: her connection lists the server's tools.
    let alice = issuer.token("alice", AUD, json!({}));
    let r = ask(alice.clone()).await;
    assert!(
        mcp.seen().iter().any(|s| s.method == "tools/list"),
        "{}",
        r.text
    );
    // The agent's tools become the server's (re-listed as a change is).
    let api = server.api.clone();
    eventually(
        "the server's tools replace `connect`",
        PATIENCE,
        async || {
            let r = api.call("GET", "/v1/agents/crm", Some(OWNER), None).await;
            let tools = r.json["tools"].to_string();
            (tools.contains("mcp_crm_whoami") && !tools.contains("mcp_crm_connect")).then_some(())
        },
    )
    .await;
    // Her next run is offered the server's tools and calls one.
    let r = ask(alice).await;
    assert_eq!(last_tool_output(&r), "called", "{}", r.text);
    let bob = issuer.token("bob", AUD, json!({}));
    let r = ask(bob).await;
    assert_eq!(last_tool_output(&r), "called", "{}", r.text);

    // Each call carried its person's own token, never anyone else's.
    let calls = mcp.calls();
    for who in ["alice", "bob"] {
        let token = format!("Bearer exchanged-crm-for-{who}");
        assert!(calls.contains(&Some(token)), "{calls:?}");
    }
    for s in mcp.seen() {
        let auth = s.authorization.unwrap_or_default();
        assert!(
            auth == "Bearer exchanged-crm-for-alice" || auth == "Bearer exchanged-crm-for-bob",
            "{} went with {auth:?}",
            s.method
        );
    }
    // Two people, two connections.
    let inits = mcp
        .seen()
        .iter()
        .filter(|s| s.method == "initialize")
        .count();
    assert_eq!(inits, 2);
    // The model never saw the bound person or header.
    for req in server.mock.requests() {
        let tools = req["tools"].to_string();
        assert!(
            !tools.contains("bindery-person") && !tools.contains("bindery-header"),
            "{tools}"
        );
    }
}
