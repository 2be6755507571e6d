//! `serve --live-session-ttl`: a session idle for longer than the TTL loses
//! its secret values, and its next message answers 409 `params_required`
//! exactly as after a restart, until they are supplied again.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_forget_their_secrets() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--live-session-ttl", "1s"], &[]);
    let created = create(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let message = |prompt: &'static str| {
        let api = &api;
        let id = id.clone();
        async move {
            api.call(
                "POST",
                &format!("/v1/sessions/{id}/messages?wait=true"),
                Some(OWNER),
                Some(&json!({"prompt": prompt})),
            )
            .await
        }
    };
    let r = message("first").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);

    // Wait until the session says it holds no secret any more.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        assert_eq!(view.status, 200, "{}", view.text);
        if view.json["secret_params"] == json!([]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the secret was never forgotten: {}",
            view.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = w.mock.request_count();
    let r = message("again").await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"])
    );
    assert_eq!(w.mock.request_count(), before, "no run started");

    let r = api
        .call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = message("again").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
}

#[test]
fn the_ttl_is_a_duration() {
    let out = std::process::Command::new(bin())
        .args(["serve", "--live-session-ttl", "soon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--live-session-ttl"), "{err}");
}
