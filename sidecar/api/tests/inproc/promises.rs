//! The session API keeps what /openapi.json promises, in process: every
//! error, axum's own rejections included, has the `{"error", "message"}`
//! shape with the right status; `timeout` has a bound that is enforced; a
//! fork's `at_turn` copies the turns before it; an agent's view shows
//! which parameters are bound and pinned, never their values; a refusal
//! says how to give a missing value, and a misshapen PUT changes nothing.

use crate::harness::*;
use serde_json::{json, Value};

/// An invoices session created with a prompt, its run waited for.
async fn invoices_run(api: &Api) -> Reply {
    let body = json!({"agent": "invoices", "prompt": "overdue?",
        "params": {"tenant": "acme", "billing_token": CANARY}});
    let r = api
        .call("POST", "/v1/sessions?wait=true", Some(OWNER), Some(&body))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r
}

#[tokio::test]
async fn rejections_are_json_errors_with_their_status() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let api = &Server::start(&[agent], dir.path(), tool_then_answer)
        .await
        .api;
    for (method, path, status, code) in [
        ("POST", "/v1/sessions?wait=maybe", 400, "bad_request"),
        ("POST", "/v1/sessions?timeout=-1", 400, "bad_request"),
        (
            "POST",
            "/v1/sessions?wait=true&timeout=601",
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/sessions/x/events?after=soon",
            400,
            "bad_request",
        ),
        ("DELETE", "/v1/agents", 405, "method_not_allowed"),
        ("GET", "/v1/nothing-here", 404, "not_found"),
    ] {
        let r = api
            .raw(method, path, Some(OWNER), "{}", Some("application/json"))
            .await;
        assert_eq!(
            (r.status, r.json["error"].as_str()),
            (status, Some(code)),
            "{method} {path}: {}",
            r.text
        );
        assert!(r.json["message"].is_string(), "{method} {path}: {}", r.text);
    }
    let r = api
        .raw(
            "POST",
            "/v1/sessions?wait=true&timeout=601",
            Some(OWNER),
            "{}",
            None,
        )
        .await;
    assert!(
        r.json["message"].as_str().unwrap().contains("at most 600"),
        "{}",
        r.text
    );
}

fn turns(r: &Value) -> usize {
    r["session"]["turns"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_fork_at_a_turn_copies_the_turns_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let api = &Server::start(&[agent], dir.path(), tool_then_answer)
        .await
        .api;
    let r = invoices_run(api).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let fork = |mut body: Value| {
        let id = id.clone();
        body["params"] = json!({"billing_token": CANARY});
        async move {
            api.call(
                "POST",
                &format!("/v1/sessions/{id}/fork"),
                Some(OWNER),
                Some(&body),
            )
            .await
        }
    };
    let r = fork(json!({"at_turn": 1})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.json["session"]["turns"],
        json!([{"role": "user", "content": "overdue?"}])
    );
    let r = fork(json!({"at_turn": 4})).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    let r = fork(json!({})).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    // Cut between a tool call and its result: the call is closed as
    // unfinished, as in any fork.
    let r = fork(json!({"at_turn": 2})).await;
    assert_eq!(turns(&r.json), 3, "{}", r.text);
    assert_eq!(r.json["session"]["turns"][2]["role"], "tool", "{}", r.text);

    let r = fork(json!({"at_turn": 5})).await;
    assert_eq!(error_of(&r), refusal(400, "bad_request", &[]));
    assert!(
        r.json["message"].as_str().unwrap().contains("has 4 turns"),
        "{}",
        r.text
    );
    let r = create(api, json!({"agent": "invoices", "at_turn": 1})).await;
    assert_eq!(error_of(&r), refusal(400, "bad_request", &[]));
}

/// A session's id in a creation's reply.
fn id_of(r: &Reply) -> String {
    r.json["session_id"].as_str().unwrap().to_string()
}

/// A session with the tenant `acme` and the secret `billing_token`.
fn valid_params() -> Value {
    json!({"tenant": "acme", "billing_token": CANARY})
}

#[tokio::test]
async fn agent_views_show_flags_never_values() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let load = process_values(
        &[
            ("--pin", "tenant=acme-corp"),
            ("--set", "region=region-7c1e"),
        ],
        &[],
    );
    let api = &Server::with_options(&[agent], dir.path(), tool_then_answer, load)
        .await
        .api;
    let list = api.call("GET", "/v1/agents", Some(OWNER), None).await;
    assert_eq!(list.status, 200, "{}", list.text);
    let one = api
        .call("GET", "/v1/agents/invoices", Some(OWNER), None)
        .await;
    assert_eq!(one.status, 200, "{}", one.text);
    assert_eq!(list.json["agents"][0], one.json);
    assert_eq!(list.json["agents"].as_array().unwrap().len(), 1);
    for r in [&list, &one] {
        assert!(!r.text.contains("acme-corp"), "{}", r.text);
        assert!(!r.text.contains("region-7c1e"), "{}", r.text);
    }
    assert_eq!(one.json["slug"], "invoices");
    let params = one.json["parameters"].as_array().unwrap();
    let flags = |name: &str| -> (bool, bool) {
        let p = params
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {params:?}"));
        assert!(
            p.get("value").is_none() && p.get("default").is_none(),
            "{p}"
        );
        (
            p["bound"].as_bool().unwrap(),
            p["pinned"].as_bool().unwrap(),
        )
    };
    assert_eq!(flags("tenant"), (true, true));
    assert_eq!(flags("billing_token"), (false, false));
    assert_eq!(flags("otp"), (false, false));
    assert_eq!(flags("region"), (true, false));
    assert_eq!(params.len(), 4, "{params:?}");
    let tools = one.json["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("bash_query-invoices")), "{tools:?}");

    let r = api
        .call("GET", "/v1/agents/nobody", Some(OWNER), None)
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.json["error"], "not_found", "{}", r.text);
    let r = api.call("GET", "/v1/agents", None, None).await;
    assert_eq!(r.status, 401, "{}", r.text);
}

/// A required message-scope value that is missing: the 409 says to send it
/// with the message, in `params` (where PUT params refuses it), and doing
/// so works. A PUT params body without the `params` wrapper is refused
/// with 422, naming what was expected, and changes nothing.
#[tokio::test]
async fn the_api_says_how_to_give_a_missing_value_and_refuses_a_misshapen_put() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent_file(
        dir.path(),
        "    - {name: tenant, scope: session}
    - {name: billing_token, secret: true, scope: session}
    - {name: otp, secret: true, scope: message}
",
    );
    let api = &Server::start(&[agent], dir.path(), tool_then_answer)
        .await
        .api;
    let r = create(api, json!({"agent": "invoices", "params": valid_params()})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = id_of(&r);
    let messages = format!("/v1/sessions/{id}/messages?wait=true");
    let r = api
        .call(
            "POST",
            &messages,
            Some(OWNER),
            Some(&json!({"prompt": "hi"})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["otp"]),
        "{}",
        r.text
    );
    let hint = r.json["message"].as_str().unwrap_or_default();
    assert!(
        hint.contains("send otp with the message, in its `params`"),
        "{}",
        r.text
    );
    assert!(!hint.contains("supply them with PUT"), "{}", r.text);
    // The hint, followed, works.
    let r = api
        .call(
            "POST",
            &messages,
            Some(OWNER),
            Some(&json!({"prompt": "hi", "params": {"otp": "123456"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let params = format!("/v1/sessions/{id}/params");
    let r = api
        .call(
            "PUT",
            &params,
            Some(OWNER),
            Some(&json!({"tenant": "globex"})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "invalid_params", &["tenant"]),
        "{}",
        r.text
    );
    assert!(
        r.json["message"]
            .as_str()
            .unwrap_or_default()
            .contains(r#"{"params": {"NAME": value, …}}"#),
        "{}",
        r.text
    );
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["params"]["tenant"], "acme", "{}", r.text);
    // The wrapped form still works, and an empty body changes nothing.
    let r = api
        .call(
            "PUT",
            &params,
            Some(OWNER),
            Some(&json!({"params": {"tenant": "globex"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["params"]["tenant"], "globex", "{}", r.text);
    let r = api
        .call("PUT", &params, Some(OWNER), Some(&json!({})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}
