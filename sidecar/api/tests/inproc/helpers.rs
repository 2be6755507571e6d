//! Helpers and narrowing in process: a three-level chain root → middle →
//! leaf, each agent's model scripted, told apart by its system prompt.
//! What only the binary shows (no secret in its logs while narrowings
//! travel and are refused) stays in the sidecar's
//! `tests/it/server_helpers.rs`.

use crate::harness::*;
use bindery_tests::fixtures::chain::{self, answer, message, root_session};
use bindery_tests::scripts::chain_script;
use serde_json::json;

/// A server of the chain (`serve --no-stream`), and the directory that
/// holds its files and store.
async fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let root = chain::agents(dir.path(), MODEL_URL);
    let server = Server::configured(&[root], dir.path(), chain_script, Default::default(), |c| {
        c.stream = false;
    })
    .await;
    (dir, server)
}

/// Errors the calling model can fix come back before the helper runs.
#[tokio::test]
async fn refusals_reach_the_calling_model() {
    let (_dir, w) = start().await;
    let api = &w.api;
    let id = root_session(api).await;
    let before = w.mock.request_count();
    let out = answer(&message(api, &id, "sealed").await);
    assert!(
        out.contains("helper `sealed` is not narrowable: call it with `what` only"),
        "{out}"
    );
    let out = answer(&message(api, &id, "bad path").await);
    assert!(
        out.contains("`agent: nowhere`: `middle` has no helper `nowhere` (its helpers: leaf)"),
        "{out}"
    );
    // Only root's model was asked: no helper ran.
    assert_eq!(w.mock.request_count() - before, 4);
}

/// Narrowing takes a number or a boolean for a string argument, as a
/// binding in a file does, and the tool gets its JSON text (`42`, `true`).
#[tokio::test]
async fn narrowing_takes_numbers_and_booleans_for_string_arguments() {
    let (_dir, w) = start().await;
    let api = &w.api;
    let id = root_session(api).await;
    let out = answer(&message(api, &id, "scalars below").await);
    assert!(out.contains("argv: [--repo] [42] [true]"), "{out}");
}

/// derive_agent names a narrowing; a later message uses it with `as`; an
/// unknown name is refused; a fork keeps the name (it lives in the history).
#[tokio::test]
async fn derived_narrowings_live_in_the_history() {
    let (_dir, w) = start().await;
    let api = &w.api;
    let id = root_session(api).await;
    let out = answer(&message(api, &id, "derive").await);
    assert!(out.contains(r#""stored":true"#), "{out}");
    let out = answer(&message(api, &id, "use r1").await);
    assert!(out.contains("argv: [--repo] [r-derived] [n-mid]"), "{out}");
    let out = answer(&message(api, &id, "use unknown").await);
    assert!(
        out.contains("no narrowing `nope` of `middle`: call derive_agent first"),
        "{out}"
    );

    let fork = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/fork"),
            Some(OWNER),
            Some(&json!({})),
        )
        .await;
    assert_eq!(fork.status, 201, "{}", fork.text);
    let fid = fork.json["session_id"].as_str().unwrap().to_string();
    let out = answer(&message(api, &fid, "use r1").await);
    assert!(
        out.contains("argv: [--repo] [r-derived] [n-mid]"),
        "the fork keeps the narrowing: {out}"
    );
    // The last run answered: nothing to resume; the values' own refusal
    // (the message-scope token missing) comes first.
    for (params, error) in [
        (json!({"gh_token": CANARY}), "nothing_to_resume"),
        (json!({}), "params_required"),
    ] {
        let r = api
            .call(
                "POST",
                &format!("/v1/sessions/{id}/resume?wait=true"),
                Some(OWNER),
                Some(&json!({ "params": params })),
            )
            .await;
        assert_eq!(
            (r.status, r.json["error"].as_str()),
            (409, Some(error)),
            "{}",
            r.text
        );
    }
}
