//! `bindery-sidecar session …` against a real `serve` over TCP: start a
//! session, send a message, follow its events, fork it, list and show.

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockReply};
use serde_json::json;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `bindery-sidecar session --server URL --token-file F ARGS…`.
async fn session(url: &str, token_file: &std::path::Path, args: &[&str]) -> Out {
    session_with_stdin(url, token_file, args, "").await
}

/// The same, with `stdin` piped in (the answers a person would type).
async fn session_with_stdin(
    url: &str,
    token_file: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> Out {
    use std::io::Write;
    if !stdin.is_empty() {
        // What is typed is a person's answer: on a terminal, as only a
        // terminal's are taken.
        let token_file = token_file.display().to_string();
        let all: Vec<&str> = ["session", "--server", url, "--token-file", &token_file]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let t = tokio::task::block_in_place(|| on_a_terminal(&all, &[], true, stdin));
        return Out {
            code: t.code,
            stdout: t.stdout,
            stderr: t.stderr,
        };
    }
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["session", "--server", url, "--token-file"])
        .arg(token_file)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let stdin = stdin.to_string();
    let o = tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        // A client that stops reading early closes the pipe: not an error here.
        let _ = pipe.write_all(stdin.as_bytes());
        drop(pipe);
        child.wait_with_output().unwrap()
    })
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
        out.stderr
            .starts_with("error: not_found: no session no-such-session")
            && out.stderr.contains("`session list` shows the sessions"),
        "{}",
        out.stderr
    );
    let wrong = w.dir.path().join("wrong-token");
    std::fs::write(&wrong, "nope").unwrap();
    let out = run(session(&url, &wrong, &["list"]).await);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.starts_with("error: unauthorized: ")
            && out.stderr.contains("check --token-file or BINDERY_TOKEN"),
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

/// The `session-id: …` line of a start.
fn started_id(o: &Out) -> String {
    o.stdout
        .lines()
        .find_map(|l| l.strip_prefix("session-id: "))
        .unwrap_or_else(|| panic!("no session id: {}{}", o.stdout, o.stderr))
        .to_string()
}

/// The first `token: ct_…` line of a `pending` list.
fn listed_token(o: &Out) -> String {
    o.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token listed: {}{}", o.stdout, o.stderr))
        .to_string()
}

fn failed_with(o: &Out, start: &str) {
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.starts_with(start), "{}", o.stderr);
}

/// --pin, --pin-json and a params file's `{"value", "pinned"}` pin a value
/// for the session; then no verb may give it (the server refuses, and
/// says how to change it), a verb that makes no session refuses to pin,
/// and a fork with a new pin changes it. `set` and `clear` change the
/// values that are not pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_values_from_the_terminal() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, _api) = w.start(&[], &[]);
    let url = sidecar.url.clone();
    let token = w.dir.path().join("token");
    std::fs::write(&token, OWNER).unwrap();
    let file = |name: &str, v: serde_json::Value| {
        let p = w.dir.path().join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p.display().to_string()
    };
    let pins = file(
        "pins.json",
        json!({"tenant": {"value": "acme-corp", "pinned": true}, "billing_token": CANARY}),
    );
    let secret = file("secret.json", json!({"billing_token": CANARY}));
    let mut seen = String::new();

    let out = session(
        &url,
        &token,
        &[
            "start",
            "--agent",
            "invoices",
            "--params-file",
            &pins,
            "--prompt",
            "which are overdue?",
            "--wait",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("INV-1002"), "{}", out.stdout);
    let id = started_id(&out);
    let view: serde_json::Value =
        serde_json::from_str(&session(&url, &token, &["show", &id]).await.stdout).unwrap();
    assert_eq!(view["pinned"], json!(["tenant"]));

    for args in [
        vec![
            "send",
            &id,
            "--set",
            "tenant=globex",
            "--prompt",
            "and now?",
        ],
        vec!["resume", &id, "--set-json", r#"tenant="globex""#],
        vec!["set", &id, "--param", "tenant=globex"],
        vec!["clear", &id, "tenant"],
    ] {
        let out = session(&url, &token, &args).await;
        seen += &(out.stdout.clone() + &out.stderr);
        failed_with(
            &out,
            "error: forbidden_params: tenant: pinned for this session",
        );
        assert!(out.stderr.contains("fork"), "{}", out.stderr);
    }
    let out = session(
        &url,
        &token,
        &["send", &id, "--pin", "tenant=globex", "--prompt", "hi"],
    )
    .await;
    failed_with(&out, "error: `session send` cannot pin tenant");
    assert!(out.stderr.contains("session start"), "{}", out.stderr);

    // A fork with a new pin (as JSON) changes it.
    let out = session(
        &url,
        &token,
        &[
            "start",
            "--fork",
            &id,
            "--pin-json",
            r#"tenant="globex""#,
            "--params-file",
            &secret,
            "--prompt",
            "and now?",
            "--wait",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("INV-2002"), "{}", out.stdout);
    let fork = started_id(&out);
    let view: serde_json::Value =
        serde_json::from_str(&session(&url, &token, &["show", &fork]).await.stdout).unwrap();
    assert_eq!(view["pinned"], json!(["tenant"]));
    assert_eq!(view["params"]["tenant"], "globex");

    // Values that are not pinned: set, then clear.
    let out = session(
        &url,
        &token,
        &[
            "start",
            "--agent",
            "invoices",
            "--set",
            "tenant=acme-corp",
            "--params-file",
            &secret,
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let plain = started_id(&out);
    let out = session(&url, &token, &["set", &plain, "--set", "tenant=globex"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "tenant=\"globex\"\nbilling_token=<secret>\n");
    let out = session(&url, &token, &["clear", &plain, "tenant"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "billing_token=<secret>\n");
    let out = session(&url, &token, &["set", &plain]).await;
    failed_with(&out, "error: `session set` needs values");
    seen += &(out.stdout + &out.stderr);
    assert!(
        !seen.contains(CANARY),
        "a secret reached the terminal: {seen}"
    );
}

/// Every way of answering a pending call, from the terminal: list them,
/// reject with a reason, approve, give a deferred result, cancel and
/// resume; a session-token holder may read the calls but answer none and
/// set no value; a pinned value stays pinned when an answer carries it; a
/// wrong or used token says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_calls_are_answered_from_the_terminal() {
    let c = crate::server_pending::clerk("").await;
    let (sidecar, _api) = c.start(&[]);
    let url = sidecar.url.clone();
    let owner = c.dir.path().join("owner-token-file");
    std::fs::write(&owner, OWNER).unwrap();
    let secret = c.dir.path().join("secret.json");
    std::fs::write(&secret, json!({"billing_token": CANARY}).to_string()).unwrap();
    let secret = secret.display().to_string();
    let start = |prompt: &'static str, extra: &'static [&'static str]| {
        let (url, owner, secret) = (url.clone(), owner.clone(), secret.clone());
        async move {
            let mut args = vec![
                "start",
                "--agent",
                "clerk",
                "--params-file",
                &secret,
                "--prompt",
                prompt,
                "--wait",
            ];
            args.extend(extra);
            let out = session(&url, &owner, &args).await;
            assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
            out
        }
    };

    // Reject, with a reason the model reads.
    let out = start("delete invoice 7", &["--set", "tenant=acme"]).await;
    let first = started_id(&out);
    assert!(
        out.stdout.contains(
            "status: waiting_external\n1. bash_delete-invoice confirm {\"id\":\"INV-7\"}"
        ),
        "{}",
        out.stdout
    );
    let id = started_id(&out);
    let listed = session(&url, &owner, &["pending", &id]).await;
    assert!(
        listed.stdout.contains("answer: session approve TOKEN"),
        "{}",
        listed.stdout
    );
    let out = session(
        &url,
        &owner,
        &["reject", &id, "--reason", "not today", "--wait"],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("their reason: not today"),
        "{}",
        out.stdout
    );
    assert_eq!(c.runs(), 0);

    // A session-token holder, on a session whose tenant is pinned.
    let out = start(
        "delete invoice 7",
        &["--pin", "tenant=acme", "--session-token"],
    )
    .await;
    let id = started_id(&out);
    let st = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("session-token: "))
        .unwrap()
        .to_string();
    let st_file = c.dir.path().join("st");
    std::fs::write(&st_file, &st).unwrap();
    let ct = listed_token(&session(&url, &owner, &["pending", &id]).await);
    let theirs = session(&url, &st_file, &["pending", &id]).await;
    assert_eq!(theirs.code, 0, "{}", theirs.stderr);
    assert!(
        theirs.stdout.contains("bash_delete-invoice confirm") && !theirs.stdout.contains("ct_"),
        "{}",
        theirs.stdout
    );
    failed_with(
        &session(&url, &st_file, &["approve", &ct]).await,
        "error: forbidden: only the session's owner",
    );
    failed_with(
        &session(&url, &st_file, &["approve", &id]).await,
        "error: forbidden: session",
    );
    failed_with(
        &session(&url, &st_file, &["set", &id, "--set", "tenant=x"]).await,
        "error: forbidden_params: a session token cannot set parameters",
    );
    assert_eq!(
        session(&url, &st_file, &["revoke-token", &id]).await.code,
        1
    );
    // Nor may it read or touch another session.
    for args in [
        vec!["pending", &first],
        vec!["follow", &first],
        vec!["cancel", &first],
    ] {
        failed_with(
            &session(&url, &st_file, &args).await,
            "error: unauthorized: ",
        );
    }
    // The owner's answer may not carry the pinned tenant either.
    let out = session(
        &url,
        &owner,
        &["approve", &ct, "--set", "tenant=globex", "--wait"],
    )
    .await;
    failed_with(
        &out,
        "error: forbidden_params: tenant: pinned for this session",
    );
    assert_eq!(c.runs(), 0);
    let out = session(&url, &owner, &["approve", &ct, "--wait"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("done: deleted INV-7"),
        "{}",
        out.stdout
    );
    assert_eq!(c.runs(), 1);
    failed_with(
        &session(&url, &owner, &["approve", &ct]).await,
        "error: continuation_used: ",
    );
    failed_with(
        &session(&url, &owner, &["approve", "ct_nothing_here"]).await,
        "error: not_found: ",
    );
    let out = session(&url, &owner, &["approve", "ct_nothing_here"]).await;
    assert!(
        out.stderr.contains("`session pending SESSION_ID`"),
        "{}",
        out.stderr
    );
    let out = session(&url, &owner, &["revoke-token", &id]).await;
    assert_eq!(
        out.stdout,
        format!("revoked: every session token of {id}\n"),
        "{}",
        out.stderr
    );
    failed_with(
        &session(&url, &st_file, &["show", &id]).await,
        "error: unauthorized: ",
    );

    // A deferred call's result.
    let out = start("where am I?", &["--set", "tenant=acme"]).await;
    let id = started_id(&out);
    let out = session(&url, &owner, &["result", &id, "--output", "Lyon", "--wait"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "done: Lyon\n");

    // Cancel the calls a run waits for, then resume.
    let out = start("delete invoice 7", &["--set", "tenant=acme"]).await;
    let id = started_id(&out);
    let out = session(&url, &owner, &["cancel", &id]).await;
    assert_eq!(out.stdout, "status: idle\n", "{}", out.stderr);
    let out = session(&url, &owner, &["pending", &id]).await;
    assert_eq!(
        out.stdout,
        format!("session {id} waits for nothing (status: idle)\n")
    );
    failed_with(
        &session(&url, &owner, &["approve", &id]).await,
        "error: session",
    );
    let out = session(&url, &owner, &["resume", &id, "--wait"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "done: error: the run was cancelled\n");
    assert_eq!(c.runs(), 1);
}

/// `--follow` and `session follow`: the run's progress, each call it waits
/// for asked on stdin (the date a booking needs, a choice by label or
/// number, a confirmation, or `--yes` for it), until the answer. Nothing
/// is booked that the person did not confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_follows_a_run_and_answers_what_it_waits_for() {
    use crate::common::booking::{booking, two_slots, DAY};
    let b = booking(two_slots(), |t| t).await;
    let (sidecar, _api) = b.start();
    let url = sidecar.url.clone();
    let owner = b.dir.path().join("owner-token-file");
    std::fs::write(&owner, OWNER).unwrap();

    // Input, a choice by label, a confirmation: typed in.
    let out = session_with_stdin(
        &url,
        &owner,
        &[
            "start",
            "--agent",
            "booking",
            "--prompt",
            r#"book {"service": "Haircut"}"#,
            "--follow",
        ],
        &format!("{{\"date\": \"{DAY}\"}}\n11:00\ny\n"),
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("session-id: "), "{}", out.stdout);
    let answer = out.stdout.trim_end().lines().last().unwrap();
    assert!(
        answer.starts_with("done: ") && answer.contains("\"booked\": true"),
        "{}",
        out.stdout
    );
    for asked in [
        "needs [\"date\"]",
        "needs a choice:",
        "2. 11:00",
        "Approve? [y/N]",
        "-> bash_book",
    ] {
        assert!(out.stderr.contains(asked), "{asked}: {}", out.stderr);
    }
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-b")]);

    // A choice by number; --yes approves without asking.
    let prompt = format!(r#"book {{"service": "Haircut", "date": "{DAY}"}}"#);
    let out = session_with_stdin(
        &url,
        &owner,
        &[
            "start", "--agent", "booking", "--prompt", &prompt, "--follow", "--yes",
        ],
        "1\n",
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("approved (--yes)"), "{}", out.stderr);
    assert_eq!(
        b.bookings(),
        vec![format!("{DAY} slot-b"), format!("{DAY} slot-a")]
    );

    // `session follow` on a session that waits; a "no" books nothing.
    let out = session(
        &url,
        &owner,
        &["start", "--agent", "booking", "--prompt", &prompt, "--wait"],
    )
    .await;
    assert!(out.stdout.contains("needs_selection"), "{}", out.stdout);
    let id = started_id(&out);
    let out = session_with_stdin(&url, &owner, &["follow", &id], "11:00\nn\n").await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("did not approve"), "{}", out.stdout);
    assert_eq!(b.bookings().len(), 2);

    // `send --follow` on it: the next run, its own progress only.
    let out = session_with_stdin(
        &url,
        &owner,
        &["send", &id, "--prompt", &prompt, "--follow"],
        "11:00\ny\n",
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stderr.matches("-> bash_book").count(),
        1,
        "{}",
        out.stderr
    );
    assert_eq!(b.bookings().len(), 3);

    // A session-token holder follows but cannot answer.
    let out = session(
        &url,
        &owner,
        &[
            "start",
            "--agent",
            "booking",
            "--prompt",
            &prompt,
            "--wait",
            "--session-token",
        ],
    )
    .await;
    let id = started_id(&out);
    let st = b.dir.path().join("st");
    let token = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("session-token: "))
        .unwrap();
    std::fs::write(&st, token).unwrap();
    let out = session_with_stdin(&url, &st, &["follow", &id, "--yes"], "1\n").await;
    failed_with(&out, "error: session");
    assert!(
        out.stderr.contains("only the session's owner answers"),
        "{}",
        out.stderr
    );
    assert_eq!(b.bookings().len(), 3);
}

/// What a model may say to drive a terminal: an OSC that retitles the
/// window, a screen clear, a bell, and a bidi override that reorders what
/// follows.
const DRIVES_A_TERMINAL: &str = "Answer: \u{1b}]0;PWNED\u{7}\u{1b}[2J\u{202e}evil";

fn drives_the_terminal(text: &str) -> bool {
    text.contains(['\u{1b}', '\u{7}', '\u{202e}'])
}

/// The model's answer, its tool calls' arguments (`--follow`'s progress) and
/// the events reach a person's terminal with their control characters and
/// bidi marks escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_client_cannot_be_driven_by_what_the_model_says() {
    let w = World::new(|req| {
        if last_message(req)["role"] == "tool" {
            MockReply::text(DRIVES_A_TERMINAL)
        } else {
            MockReply::tool_call(
                "bash_query-invoices",
                json!({"status": "overdue\u{202e}\u{1b}[2J"}),
            )
        }
    })
    .await;
    let (sidecar, _api) = w.start(&[], &[]);
    let token = w.dir.path().join("token");
    std::fs::write(&token, format!("{OWNER}\n")).unwrap();
    let values = w.dir.path().join("values.json");
    std::fs::write(&values, json!({"billing_token": CANARY}).to_string()).unwrap();
    let values = values.display().to_string();
    let start = |how: &'static str| {
        [
            "start",
            "--agent",
            "invoices",
            "--param",
            "tenant=acme-corp",
            "--params-file",
            &values,
            "--prompt",
            "which are overdue?",
            how,
        ]
        .map(str::to_owned)
    };
    for how in ["--wait", "--follow"] {
        let args = start(how);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = session(&sidecar.url, &token, &args).await;
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        assert!(!drives_the_terminal(&out.stdout), "{how}: {:?}", out.stdout);
        assert!(!drives_the_terminal(&out.stderr), "{how}: {:?}", out.stderr);
        // Shown, escaped: a person still reads what the model said.
        assert!(out.stdout.contains("Answer: "), "{how}: {}", out.stdout);
        assert!(out.stdout.contains("evil"), "{how}: {}", out.stdout);
        if how == "--follow" {
            assert!(
                out.stderr.contains("-> bash_query-invoices"),
                "{}",
                out.stderr
            );
        }
        let id = started_id(&out);
        let out = session(
            &sidecar.url,
            &token,
            &["events", &id, "--until", "run_finished"],
        )
        .await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(
            !drives_the_terminal(&out.stdout),
            "events: {:?}",
            out.stdout
        );
    }
}

/// A server that answers more than any view of Bindery's (here 17 MiB) is
/// refused before its answer is all held, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_is_refused_before_it_is_held() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 4096];
        let _ = conn.read(&mut head).await;
        let size = 17 * 1024 * 1024;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..(size / chunk.len()) {
            // The client hangs up once it has seen enough.
            if conn.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{OWNER}\n")).unwrap();
    let out = session(&url, &token, &["list"]).await;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("over 16 MiB"), "{}", out.stderr);
    server.abort();
}
