//! `serve --live-session-ttl` (an hour unless set; `off` keeps them): a
//! session idle for longer than the TTL loses its secret values, and its
//! next message answers 409 `params_required` exactly as after a restart,
//! until they are supplied again.
//! `serve --max-live-sessions`: past the limit, the least recently used
//! session loses them the same way.

use crate::common::*;
use bindery_tests::sidecar::Api;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_forget_their_secrets() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--live-session-ttl", "1s"], &[]);
    let id = new_session(&api, json!({"agent": "invoices", "params": valid_params()})).await;
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
    eventually_or("the secret is forgotten", PATIENCE, || async {
        let view = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        assert_eq!(view.status, 200, "{}", view.text);
        match view.json["secret_params"] == json!([]) {
            true => Ok(()),
            false => Err(view.text),
        }
    })
    .await;
    let before = w.mock.request_count();
    let r = message("again").await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"])
    );
    assert_eq!(w.mock.request_count(), before, "no run started");

    give_token(&api, &id).await;
    let r = message("again").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
}

/// The names of the secret values session `id` holds now.
async fn secrets_of(api: &Api, id: &str) -> serde_json::Value {
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(view.status, 200, "{}", view.text);
    view.json["secret_params"].clone()
}

async fn give_token(api: &Api, id: &str) {
    let r = api
        .call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_the_least_recently_used_session_forgets_its_secrets() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&["--max-live-sessions", "2"], &[]);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = create(&api, json!({"agent": "invoices", "params": valid_params()})).await;
        assert_eq!(r.status, 201, "{}", r.text);
        ids.push(r.json["session_id"].as_str().unwrap().to_string());
    }
    let (a, b) = (ids[0].clone(), ids[1].clone());
    // `a` is used after `b`: `b` is now the least recently used.
    give_token(&api, &a).await;
    let r = create(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let c = r.json["session_id"].as_str().unwrap().to_string();
    assert_eq!(secrets_of(&api, &a).await, json!(["billing_token"]));
    assert_eq!(secrets_of(&api, &b).await, json!([]));
    assert_eq!(secrets_of(&api, &c).await, json!(["billing_token"]));

    let message = |id: String| {
        let api = &api;
        async move {
            api.call(
                "POST",
                &format!("/v1/sessions/{id}/messages?wait=true"),
                Some(OWNER),
                Some(&json!({"prompt": "Which invoices are overdue?"})),
            )
            .await
        }
    };
    let before = w.mock.request_count();
    let r = message(b.clone()).await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"])
    );
    assert_eq!(w.mock.request_count(), before, "no run started");
    // Given again, `b` runs; `a` (used before `c` was created) makes room.
    give_token(&api, &b).await;
    let r = message(b.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(secrets_of(&api, &a).await, json!([]));
    assert_eq!(secrets_of(&api, &c).await, json!(["billing_token"]));

    let metrics = api.call("GET", "/metrics", None, None).await.text;
    assert_eq!(
        sample(&metrics, "bindery_sessions_live"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "bindery_sessions_live_limit"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "bindery_sessions_evicted_total"),
        Some(2.0),
        "{metrics}"
    );
    assert!(
        !sidecar.logs().contains(CANARY),
        "a secret reached the logs"
    );
}

#[test]
fn the_limit_is_a_positive_number() {
    for bad in ["0", "many"] {
        let out = std::process::Command::new(bin())
            .args(["serve", "--max-live-sessions", bad])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--max-live-sessions"), "{err}");
    }
}

#[test]
fn the_ttl_is_a_duration_over_zero_or_off() {
    // Zero would forget at once: `off` is how to keep the values.
    for bad in ["soon", "0s"] {
        let out = std::process::Command::new(bin())
            .args(["serve", "--live-session-ttl", bad])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--live-session-ttl") && err.contains("`off`"),
            "{err}"
        );
    }
}
