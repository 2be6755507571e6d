//! A model that asks for a thousand calls in one turn does not decide how
//! many tool processes run at once: a run holds at most
//! `--max-tool-processes-per-run`, the server `--max-tool-processes`, the
//! rest wait their turn; and another session's call is not starved. A
//! reply of more calls than a reply may ask for runs none, streamed or not.

use std::path::Path;

use crate::common::*;
use bindery_tests::fixtures::session::session;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

/// Counts its processes running now (in all sessions, and in its own),
/// keeps the most ever seen, and, unless it is the free one, waits for
/// the test to open the gate before it ends.
fn counter(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == describe ]]; then
  echo '{{"slug": "count", "description": "counts", "args": [{{"name": "gated", "description": "wait for the gate", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}}]}}'
  exit 0
fi
d='{d}'; me="$d/run-$AGENT_SESSION_ID"
bump() {{ # file delta: add delta to the count in file, keep the most in file.max
  local n; n=$(( $(cat "$1" 2>/dev/null || echo 0) + $2 )); echo "$n" > "$1"
  if [ "$n" -gt "$(cat "$1.max" 2>/dev/null || echo 0)" ]; then echo "$n" > "$1.max"; fi
}}
exec 9>>"$d/lock"
flock 9; bump "$d/now" 1; bump "$me" 1; flock -u 9
if [[ " $* " == *" --gated yes "* ]]; then
  until [ -e "$d/open" ]; do sleep 0.01; done
fi
flock 9; bump "$d/now" -1; bump "$me" -1; echo x >> "$d/done"; flock -u 9
echo counted
"#
    )
}

fn read_n(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

async fn post(api: &Api, id: &str, prompt: &str) {
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({ "prompt": prompt })),
        )
        .await;
    assert!(r.status == 202 || r.status == 200, "{}", r.text);
}

async fn status(api: &Api, id: &str) -> String {
    session(api, id).await.json["status"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_calls_never_run_more_processes_than_the_bounds() {
    const MANY: usize = 1000;
    const OTHER: usize = 40;
    const PER_RUN: usize = 8;
    const PER_SERVER: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let count = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("count");
    executable(&script, &counter(count.path()));
    // `many N`: N gated calls in one reply; `one`: one free call.
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            return MockReply::text("done");
        }
        let prompt = last["content"].as_str().unwrap_or("");
        let (n, gated) = match prompt.strip_prefix("many ") {
            Some(n) => (n.parse().unwrap_or(1), "yes"),
            None => (1, "no"),
        };
        MockReply::ToolCalls(
            (0..n)
                .map(|_| ("bash_count".to_string(), json!({ "gated": gated })))
                .collect(),
        )
    })
    .await;
    let agent = bash_agent(dir.path(), &mock.url(), &tools);
    let (_sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[
            "--max-tool-processes",
            &PER_SERVER.to_string(),
            "--max-tool-processes-per-run",
            &PER_RUN.to_string(),
            "--model-max-tool-calls",
            &MANY.to_string(),
            "--tool-timeout",
            "600",
        ],
        &[],
        dir.path(),
    );
    let c = count.path().to_path_buf();
    // A thousand calls held at the gate: the run's bound fills, no more.
    let many = new_session(&api, json!({"agent": "a"})).await;
    post(&api, &many, &format!("many {MANY}")).await;
    let now = c.join("now");
    until("the first run holds its slots", PATIENCE, || {
        read_n(&now) == PER_RUN
    })
    .await;
    // Another session's call runs meanwhile: the thousand do not starve it.
    let one = new_session(&api, json!({"agent": "a"})).await;
    let r = message_waited(&api, &one, "one").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(last_tool_output(&r).trim(), "counted");
    // A second busy run takes what is left of the server's bound.
    let other = new_session(&api, json!({"agent": "a"})).await;
    post(&api, &other, &format!("many {OTHER}")).await;
    until("the server's slots are all held", PATIENCE, || {
        read_n(&now) == PER_SERVER
    })
    .await;
    // What /metrics says meanwhile: the slots held, the rest waiting.
    let m = api.call("GET", "/metrics", None, None).await.text;
    assert_eq!(
        sample(&m, "bindery_tool_processes_running"),
        Some(PER_SERVER as f64),
        "{m}"
    );
    let waiting = sample(&m, "bindery_tool_processes_waiting").unwrap_or(0.0);
    assert!(waiting > 0.0 && waiting <= (MANY + OTHER) as f64, "{m}");
    std::fs::write(c.join("open"), "").unwrap();
    let done = c.join("done");
    let lines = || {
        std::fs::read_to_string(&done)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    until(
        "every call ran",
        std::time::Duration::from_secs(300),
        || lines() == MANY + OTHER + 1,
    )
    .await;
    for id in [&many, &other] {
        eventually_or("the run ends", PATIENCE, async || {
            let s = status(&api, id).await;
            if s == "idle" {
                Ok(())
            } else {
                Err(s)
            }
        })
        .await;
    }
    assert_eq!(read_n(&c.join("now.max")), PER_SERVER, "the server's bound");
    let m = api.call("GET", "/metrics", None, None).await.text;
    assert_eq!(
        sample(&m, "bindery_tool_processes_running"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "bindery_tool_processes_waiting"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        read_n(&c.join(format!("run-{many}.max"))),
        PER_RUN,
        "one run's bound"
    );
    assert!(read_n(&c.join(format!("run-{other}.max"))) <= PER_RUN);
    mock.shutdown().await;
}

/// Streamed or not, a reply asking for more calls than
/// `--model-max-tool-calls` (128 by default) runs none of them: the run
/// fails saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_of_too_many_calls_runs_none_streamed_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let count = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("count");
    executable(&script, &counter(count.path()));
    let mock = MockLlm::start(|_: &Value| {
        MockReply::ToolCalls(
            (0..200)
                .map(|_| ("bash_count".to_string(), json!({ "gated": "no" })))
                .collect(),
        )
    })
    .await;
    let agent = bash_agent(dir.path(), &mock.url(), &tools);
    for extra in [&["--no-stream"][..], &[]] {
        let (_sidecar, api) = serve(&agent, &sqlite_in(dir.path()), extra, &[], dir.path());
        let id = new_session(&api, json!({"agent": "a"})).await;
        let r = message_waited(&api, &id, "go").await;
        assert_eq!(r.json["status"], "failed", "{extra:?}: {}", r.text);
        assert!(
            r.json["status_detail"]
                .as_str()
                .is_some_and(|d| d.contains("200 tool calls")),
            "{extra:?}: {}",
            r.text
        );
        assert!(!count.path().join("done").exists(), "{extra:?}: a call ran");
    }
    mock.shutdown().await;
}
