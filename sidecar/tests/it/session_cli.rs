//! `bindery-sidecar session …` against a real `serve` over TCP: start a
//! session, send a message, follow its events, fork it, list and show.

use crate::common::*;
use serde_json::json;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `bindery-sidecar session --server URL --token-file F ARGS…`.
async fn session(url: &str, token_file: &std::path::Path, args: &[&str]) -> Out {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["session", "--server", url, "--token-file"])
        .arg(token_file)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    let o = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_drives_sessions_on_a_running_server() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, _api) = w.start(&[], &[]);
    let url = sidecar.url.clone();
    let token = w.dir.path().join("token");
    std::fs::write(&token, format!("{OWNER}\n")).unwrap();
    // Secrets go in a file, never in argv.
    let values = w.dir.path().join("values.json");
    std::fs::write(&values, json!({"billing_token": CANARY}).to_string()).unwrap();
    let values_arg = values.display().to_string();
    let mut seen = String::new();
    let mut run = |o: Out| {
        seen.push_str(&o.stdout);
        seen.push_str(&o.stderr);
        o
    };

    let out = run(session(
        &url,
        &token,
        &[
            "start",
            "--agent",
            "invoices",
            "--param",
            "tenant=acme-corp",
            "--params-file",
            &values_arg,
            "--prompt",
            "which are overdue?",
            "--wait",
        ],
    )
    .await);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let mut lines = out.stdout.lines();
    let id = lines
        .next()
        .unwrap()
        .strip_prefix("session-id: ")
        .unwrap()
        .to_string();
    assert_eq!(
        lines.next(),
        Some("answer: 2026-10-01\tINV-1002\t850.50 EUR\toverdue"),
        "{}",
        out.stdout
    );

    let out = run(session(
        &url,
        &token,
        &["send", &id, "--prompt", "and again?", "--wait"],
    )
    .await);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("answer: 2026-10-01\tINV-1002"),
        "{}",
        out.stdout
    );

    // Events from the start, until the first run's end.
    let out = run(session(&url, &token, &["events", &id, "--until", "run_finished"]).await);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let kinds: Vec<&str> = out
        .stdout
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "tool_call",
            "tool_result",
            "message",
            "run_finished"
        ],
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.starts_with("1\trun_started\t{"),
        "{}",
        out.stdout
    );
    // …and after an id: the second run's.
    let after = out
        .stdout
        .lines()
        .last()
        .unwrap()
        .split('\t')
        .next()
        .unwrap()
        .to_string();
    let out = run(session(
        &url,
        &token,
        &["events", &id, "--after", &after, "--until", "run_finished"],
    )
    .await);
    assert_eq!(out.stdout.lines().count(), 5, "{}", out.stdout);

    // A fork needs its secret again; it keeps the history.
    let fresh = w.dir.path().join("fresh.json");
    std::fs::write(&fresh, json!({"billing_token": "fresh-token"}).to_string()).unwrap();
    let out = run(session(
        &url,
        &token,
        &[
            "start",
            "--fork",
            &id,
            "--params-file",
            &fresh.display().to_string(),
            "--prompt",
            "once more",
            "--wait",
        ],
    )
    .await);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let fork = out
        .stdout
        .lines()
        .next()
        .unwrap()
        .strip_prefix("session-id: ")
        .unwrap()
        .to_string();
    let out = run(session(&url, &token, &["show", &fork]).await);
    let view: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(view["parent_session_id"], json!(id));
    assert_eq!(view["session"]["turns"].as_array().unwrap().len(), 12);

    let out = run(session(&url, &token, &["list"]).await);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("SESSION "), "{}", out.stdout);
    let fork_row = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&fork))
        .expect("the fork is listed");
    assert!(fork_row.trim_end().ends_with(&id), "{fork_row}");
    assert!(
        out.stdout.lines().any(|l| l.starts_with(&id)),
        "{}",
        out.stdout
    );

    // Errors say what the server said.
    let out = run(session(&url, &token, &["send", "no-such-session", "--prompt", "hi"]).await);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("the server answered 404"),
        "{}",
        out.stderr
    );
    let wrong = w.dir.path().join("wrong-token");
    std::fs::write(&wrong, "nope").unwrap();
    let out = run(session(&url, &wrong, &["list"]).await);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("the server answered 401"),
        "{}",
        out.stderr
    );

    assert!(
        !seen.contains(CANARY),
        "a secret reached the terminal: {seen}"
    );
}

/// The session client takes values with the flags every other command
/// uses: `--set`, `--set-json`, and `--params-file` (repeatable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_client_takes_values_as_every_command_does() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, _api) = w.start(&[], &[]);
    let token = w.dir.path().join("token");
    std::fs::write(&token, format!("{OWNER}\n")).unwrap();
    let secret = w.dir.path().join("secret.json");
    std::fs::write(&secret, json!({"billing_token": CANARY}).to_string()).unwrap();
    let tenant = w.dir.path().join("tenant.json");
    std::fs::write(&tenant, json!({"tenant": "initech"}).to_string()).unwrap();
    let (secret, tenant) = (secret.display().to_string(), tenant.display().to_string());
    let out = session(
        &sidecar.url,
        &token,
        &[
            "start",
            "--agent",
            "invoices",
            "--params-file",
            &secret,
            "--params-file",
            &tenant,
            "--set",
            "tenant=acme-corp",
            "--prompt",
            "which are overdue?",
            "--wait",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    // --set wins over the file's tenant.
    assert!(
        out.stdout
            .contains("answer: 2026-10-01\tINV-1002\t850.50 EUR\toverdue"),
        "{}",
        out.stdout
    );
    let id = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("session-id: "))
        .unwrap()
        .to_string();
    let out = session(
        &sidecar.url,
        &token,
        &[
            "send",
            &id,
            "--set-json",
            r#"tenant="globex""#,
            "--prompt",
            "and now?",
            "--wait",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("answer: 2026-10-20\tINV-2002\t7400.00 EUR\toverdue"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains(CANARY) && !out.stderr.contains(CANARY));
}
