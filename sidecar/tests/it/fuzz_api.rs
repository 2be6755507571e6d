//! schemathesis (tests/schemathesis, installed by tests/setup.sh) against
//! the served /openapi.json, stateful links included, for a bounded time
//! (`SCHEMATHESIS_MAX_TIME` seconds, default 20): no 5xx, no response that
//! disagrees with the document, and no secret in any response.

use std::process::Stdio;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing() {
    let st = repo().join("tests/schemathesis/.venv/bin/schemathesis");
    assert!(
        st.exists(),
        "{} is missing: run tests/setup.sh",
        st.display()
    );
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--no-stream"], &[]);
    // A session that holds the canary, for the fuzzer to find if it can.
    invoices_run(&api).await;
    let max_time = std::env::var("SCHEMATHESIS_MAX_TIME").unwrap_or_else(|_| "20".into());
    let report = w.dir.path().join("schemathesis");
    let out = tokio::process::Command::new(&st)
        .arg("run")
        .arg(format!("{}/openapi.json", api.base))
        .args(["--checks", "all"])
        // A schema-valid body may still name parameters this agent does not
        // declare, or leave out ones it requires: those 422s are the API
        // working, so valid data need not be accepted.
        .args(["--exclude-checks", "positive_data_acceptance"])
        .args(["--header", &format!("Authorization: Bearer {OWNER}")])
        .args(["--max-time", &max_time])
        .args(["--workers", "1"])
        .args([
            "--seed",
            &std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into()),
        ])
        .args(["--report", "har"])
        .arg("--report-dir")
        .arg(&report)
        // Its caches go to the test's directory, not the repository.
        .current_dir(w.dir.path())
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{stderr}"
    );
    let mut har = String::new();
    for e in std::fs::read_dir(&report).unwrap().flatten() {
        har.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
    }
    assert!(har.contains("/v1/sessions"), "no exchange recorded");
    assert!(!har.contains(CANARY), "a response holds the secret");
}
