//! schemathesis (tests/schemathesis, installed by tests/setup.sh) against
//! the served /openapi.json, stateful links included, for a bounded time
//! (`SCHEMATHESIS_MAX_TIME` seconds for its stateless phases, default 40;
//! `SCHEMATHESIS_STATEFUL_TIME` for its stateful one, default 60): no 5xx, no response that
//! disagrees with the document, no schema-valid request refused, no secret
//! in any response, and the document's links followed far enough that its
//! stateful phase applies at least half of them.

use std::path::Path;
use std::process::Stdio;

use bindery_tests::mock_llm::{last_message, MockReply};
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

use crate::common::*;

/// The invoices agent's model, with one more tool: a message about
/// overdue invoices queries them; any other calls `bash_note`, which waits
/// for the owner's confirmation, so that sessions have pending items (and
/// continuation tokens) for the fuzzer to follow.
fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    match (last["role"].as_str(), last["content"].as_str()) {
        (Some("tool"), text) => MockReply::text(format!("answer: {}", text.unwrap_or(""))),
        (_, Some(text)) if text.contains("overdue") => tool_then_answer(req),
        _ => MockReply::tool_call("bash_note", json!({})),
    }
}

/// A toolbox with `note`, whose calls wait for confirmation.
fn confirmed_toolbox(dir: &Path) -> String {
    let tools = dir.join("note-tools");
    std::fs::create_dir_all(&tools).unwrap();
    executable(
        &tools.join("note"),
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  echo '{"slug": "note", "description": "Notes something down.", "args": []}'
  exit 0
fi
echo noted
"#,
    );
    format!(
        "    - bash: {{directory: \"{}\", confirm: [{{tool: note}}]}}\n",
        tools.display()
    )
}

/// `API Links: <covered> covered / <selected> selected / <total> total`
/// of schemathesis's summary.
fn links(stdout: &str) -> Option<(u32, u32)> {
    let line = stdout.lines().find(|l| l.contains("API Links:"))?;
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers.as_slice() {
        [covered, _selected, total, ..] => Some((*covered, *total)),
        _ => None,
    }
}

#[test]
fn the_summary_line_of_links_is_read() {
    let out = "   Scenarios:    15\n   API Links:    12 covered / 73 selected / 73 total\n";
    assert_eq!(links(out), Some((12, 73)));
    assert_eq!(
        links("API Links: 40 covered / 63 selected / 70 total (7 inferred)"),
        Some((40, 70))
    );
    assert_eq!(links("Scenarios: 3"), None);
}

/// One run of schemathesis over the served document: the `phases` given,
/// for at most `max_time` seconds; its stdout, after checking that it
/// found nothing.
async fn schemathesis(w: &World, api: &Api, phases: &str, max_time: &str) -> String {
    let st = repo().join("tests/schemathesis/.venv/bin/schemathesis");
    assert!(
        st.exists(),
        "{} is missing: run tests/setup.sh",
        st.display()
    );
    let out = tokio::process::Command::new(&st)
        .arg("run")
        .arg(format!("{}/openapi.json", api.base))
        .args(["--phases", phases])
        .args(["--checks", "all"])
        .args(["--header", &format!("Authorization: Bearer {OWNER}")])
        .args(["--max-time", max_time])
        .args(["--request-timeout", "10"])
        .args(["--workers", "1"])
        .args([
            "--seed",
            &std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into()),
        ])
        .args(["--report", "har"])
        .arg("--report-dir")
        .arg(w.dir.path().join("schemathesis"))
        // Its caches and its configuration (schemathesis.toml) are the
        // test's directory's, not the repository's.
        .current_dir(w.dir.path())
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stdout.contains("FAILURES"),
        "schemathesis ({phases}) found problems:\n{stdout}\n{stderr}"
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing() {
    let w = World::with_toolboxes(script, confirmed_toolbox).await;
    // The invoices agent with nothing required, so that a session the
    // fuzzer creates (or forks) from an agent's slug is one it can go on
    // with; the canary is still a secret session value.
    let parameters = "    - {name: tenant, scope: session, required: false}
    - {name: billing_token, secret: true, scope: session, required: false}
    - {name: otp, secret: true, scope: message, required: false}
";
    let toolbox = confirmed_toolbox(w.dir.path());
    invoices_agent_file(w.dir.path(), &w.mock.url(), parameters, &toolbox);
    // The links the document declares are the API's: none inferred. An
    // event stream stays open: it is read for half a second.
    std::fs::write(
        w.dir.path().join("schemathesis.toml"),
        r#"[phases.stateful.inference]
algorithms = []

# A schema-valid body may still name parameters this agent does not
# declare: those 422s are the API working. A 400 for a request the
# document allows is not.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

[[operations]]
include-operation-id = "streamEvents"
request-timeout = 0.5

# What no schema can say, and the document does: what `/mcp` takes depends
# on its MCP-Protocol-Version header (only 2025-03-26 has batches; a
# 2026-07-28 request carries `_meta` that agrees with its headers), a
# fork's `at_turn` past its source's last turn is a 400, and which answer
# a continuation takes (`approve`, `choice`, `input`, `result`) depends on
# the item its token names.
[[operations]]
include-operation-id = ["mcp", "forkSession", "postContinuation"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "422", "429"]
"#,
    )
    .unwrap();
    let (_sidecar, api) = w.start(&["--no-stream"], &[]);
    // A session that holds the canary, for the fuzzer to find if it can,
    // and one that waits for a confirmation.
    invoices_run(&api).await;
    let waiting = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "prompt": "note this", "params": valid_params()})),
        )
        .await;
    assert_eq!(
        waiting.json["status"], "waiting_external",
        "{}",
        waiting.text
    );
    let max_time = std::env::var("SCHEMATHESIS_MAX_TIME").unwrap_or_else(|_| "40".into());
    schemathesis(&w, &api, "examples,coverage,fuzzing", &max_time).await;
    // The stateful phase's coverage is what it reaches in its time, and
    // this test runs beside the binary's others on two cores: 60 s reached
    // 23 of 50 links once in CI (every scenario passing), so it has 120.
    let stateful_time =
        std::env::var("SCHEMATHESIS_STATEFUL_TIME").unwrap_or_else(|_| "120".into());
    let stdout = schemathesis(&w, &api, "stateful", &stateful_time).await;
    let (covered, total) = links(&stdout)
        .unwrap_or_else(|| panic!("no `API Links:` line in schemathesis's output:\n{stdout}"));
    assert!(
        total > 0 && covered * 2 >= total,
        "the stateful phase applied {covered} of {total} links (at least half wanted):\n{stdout}"
    );
    let mut har = String::new();
    for e in std::fs::read_dir(w.dir.path().join("schemathesis"))
        .unwrap()
        .flatten()
    {
        har.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
    }
    assert!(har.contains("/v1/sessions"), "no exchange recorded");
    assert!(!har.contains(CANARY), "a response holds the secret");
}
