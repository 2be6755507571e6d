//! Runs that wait, where only the binary shows them: what a restart does
//! to a waiting call, the CLI's prompts on a terminal and from piped
//! stdin, `check`, and two replicas on one PostgreSQL database. Their
//! logic over the API (approvals, deferred calls, continuations, cancel,
//! fork, helpers, MCP, session tokens) is tested in process
//! (`sidecar/api/tests/inproc/pending.rs`).

use std::path::PathBuf;

use crate::common::*;
use bindery_tests::fixtures::clerk::{self, waiting};
use bindery_tests::fixtures::session::{answer, id_of, on_session, token_of};
use bindery_tests::mock_llm::MockLlm;
use bindery_tests::sidecar::{Api, Reply, Sidecar};
use serde_json::{json, Value};

pub(crate) struct Clerk {
    pub(crate) dir: tempfile::TempDir,
    mock: MockLlm,
    agent: PathBuf,
    store: String,
}

/// An agent `clerk` ([`clerk::agent`]) in a directory of its own, its
/// model at a mock. `spec_extra` is added to the agent's spec
/// (`confirmTtl: 1s`).
pub(crate) async fn clerk(spec_extra: &str) -> Clerk {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(clerk::script).await;
    let agent = clerk::agent(dir.path(), &mock.url(), spec_extra);
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let store = sqlite_in(dir.path());
    Clerk {
        dir,
        mock,
        agent,
        store,
    }
}

impl Clerk {
    pub(crate) fn start(&self, extra: &[&str]) -> (Sidecar, Api) {
        serve(&self.agent, &self.store, extra, &[], self.dir.path())
    }

    /// How often the confirmed tool ran.
    pub(crate) fn runs(&self) -> usize {
        clerk::runs(self.dir.path())
    }
}

/// `bindery-sidecar SUBCOMMAND --agent-file <clerk>`: whether it succeeded,
/// stdout, and stdout and stderr together.
async fn clerk_cli(c: &Clerk, subcommand: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin())
        .args([subcommand, "--agent-file"])
        .arg(&c.agent)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = stdout.clone() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), stdout, all)
}

/// The secret `billing_token` given again (`PUT …/params`).
async fn give_secret(api: &Api, id: &str) -> Reply {
    let body = json!({"params": {"billing_token": CANARY}});
    on_session(api, "PUT", id, "/params", Some(body)).await
}

fn sha256(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// After a restart a deferred call (no secret in it) resumes; a confirmed
/// call that gets the secret answers 409 params_required until the secret
/// is given again. The canary is nowhere: pending items, events, store, log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_call_survives_a_restart_and_never_runs_without_its_secret() {
    let c = clerk("").await;
    let (mut sidecar, api) = c.start(&[]);
    let deferred = waiting(&api, "where am I?").await;
    let confirm = waiting(&api, "delete invoice 7").await;
    assert!(!sidecar.logs().contains(CANARY));
    sidecar.kill();

    let (sidecar, api) = c.start(&[]);
    let id = id_of(&confirm);
    let view = on_session(&api, "GET", &id, "", None).await;
    assert_eq!(view.json["status"], "waiting_external", "{}", view.text);
    // The same token after the restart: derived, never stored.
    assert_eq!(token_of(&view), token_of(&confirm));

    let r = answer(&api, &token_of(&deferred), json!({"result": "Lyon"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);

    let r = answer(&api, &token_of(&confirm), json!({"approve": true})).await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"])
    );
    assert_eq!(c.runs(), 0);
    let r = give_secret(&api, &id).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = answer(&api, &token_of(&confirm), json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
    assert!(last_tool_output(&r).contains(&sha256(CANARY)), "{}", r.text);

    let (status, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let seen = stream
        .until("resolved", std::time::Duration::from_secs(10))
        .await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    assert!(kinds.contains(&"pending"), "{kinds:?}");
    assert!(kinds.contains(&"resolved"), "{kinds:?}");
    assert!(!stream.raw.contains(CANARY));
    assert!(!stream.raw.contains("ct_"), "a token in a stored event");
    assert!(!view.text.contains(CANARY));
    assert!(!contains(&raw_files(c.dir.path(), "store.sqlite"), CANARY));
    assert!(!contains(
        &raw_files(c.dir.path(), "store.sqlite"),
        &token_of(&confirm)
    ));
    assert!(!sidecar.logs().contains(CANARY));
    assert!(!c
        .mock
        .requests()
        .iter()
        .any(|r| r.to_string().contains(CANARY)));
}

/// `bindery-sidecar run --prompt …` on a terminal, `typed` typed at it:
/// stdout, stderr, and whether it succeeded.
fn run_cli_on_a_terminal(c: &Clerk, prompt: &str, typed: &str) -> (String, String, bool) {
    let agent = c.agent.display().to_string();
    let args = [
        "run",
        "--agent-file",
        &agent,
        "--set",
        "tenant=acme",
        "--prompt",
        prompt,
    ];
    let out = clerk_on_a_terminal(&args, typed);
    (out.stdout, out.stderr, out.code == 0)
}

/// The binary on a terminal, the clerk's secret in its environment.
fn clerk_on_a_terminal(args: &[&str], typed: &str) -> OnATerminal {
    tokio::task::block_in_place(|| {
        on_a_terminal(
            args,
            &[("BINDERY_PARAM_BILLING_TOKEN", CANARY)],
            false,
            typed,
        )
    })
}

/// The binary given `args`, `stdin` piped in, the clerk's secret in its
/// environment: stdout, stderr, and whether it succeeded.
async fn piped(args: &[&str], stdin: &str) -> (String, String, bool) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin())
        .args(args)
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// `as-tool run` is another runtime's bash tool: its stdin is that
/// runtime's data, so a `y` piped in approves nothing and the call that
/// needs a person is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_tool_run_takes_no_approval_from_piped_stdin() {
    let c = clerk("").await;
    let agent = c.agent.display().to_string();
    let (stdout, stderr, _) = piped(
        &[
            "as-tool",
            "--agent-file",
            &agent,
            "run",
            "--prompt",
            "delete invoice 7",
            "--tenant",
            "acme",
        ],
        "y\n",
    )
    .await;
    assert!(
        stderr.contains("stdin is not a terminal: refused"),
        "{stderr}"
    );
    assert!(!stdout.contains("deleted INV-7"), "{stdout}");
    assert_eq!(c.runs(), 0);
}

/// `replay-tool-call --agent-file` runs a recorded call, whose arguments
/// anyone may have written, only with a person's approval when the agent
/// says it needs one: asked on a terminal, refused with stdin piped (a
/// `y` there too), given by `--yes`; as agents-exe's argv form too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_call_that_needs_approval_is_asked() {
    let c = clerk("").await;
    let agent = c.agent.display().to_string();
    let session = c.dir.path().join("recorded.json");
    std::fs::write(
        &session,
        serde_json::to_string(&json!({"session": {"turns": [
            {"role": "user", "content": "tidy up"},
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                "function": {"name": "bash_delete-invoice", "arguments": "{\"id\":\"INV-9\"}"}}]}
        ]}}))
        .unwrap(),
    )
    .unwrap();
    let session = session.display().to_string();
    let replay = [
        "replay-tool-call",
        "-s",
        &session,
        "-i",
        "0",
        "--agent-file",
        &agent,
        "--set",
        "tenant=acme",
    ];
    for stdin in ["", "y\n"] {
        let (stdout, stderr, ok) = piped(&replay, stdin).await;
        assert!(!ok, "{stdout}");
        assert!(
            stderr.contains("stdin is not a terminal: refused"),
            "{stderr}"
        );
        assert!(stderr.contains("needs a person's approval"), "{stderr}");
    }
    let argv_form = [
        "--agent-file",
        &agent,
        "replay-tool-call",
        "-s",
        &session,
        "-i",
        "0",
        "--set",
        "tenant=acme",
    ];
    let (_, stderr, ok) = piped(&argv_form, "y\n").await;
    assert!(
        !ok && stderr.contains("stdin is not a terminal"),
        "{stderr}"
    );
    assert_eq!(c.runs(), 0);
    // The call a person is shown cannot be reordered by bidi marks in it.
    let spoofed = c.dir.path().join("spoofed.json");
    std::fs::write(
        &spoofed,
        serde_json::to_string(&json!({"session": {"turns": [
            {"role": "user", "content": "tidy up"},
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                "function": {"name": "bash_delete-invoice", "arguments": "{\"id\":\"INV-9\u{202e}7-VNI\"}"}}]}
        ]}}))
        .unwrap(),
    )
    .unwrap();
    let spoofed = spoofed.display().to_string();
    let mut shown = replay.to_vec();
    shown[2] = &spoofed;
    let (_, stderr, _) = piped(&shown, "").await;
    assert!(!stderr.contains('\u{202e}'), "{stderr:?}");
    assert!(stderr.contains("\\u{202e}"), "{stderr}");

    let out = clerk_on_a_terminal(&replay, "n\n");
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("Approve? [y/N]"), "{}", out.stderr);
    assert_eq!(c.runs(), 0);
    let out = clerk_on_a_terminal(&replay, "y\n");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("deleted INV-9"), "{}", out.stdout);
    assert_eq!(c.runs(), 1);

    let mut yes = replay.to_vec();
    yes.push("--yes");
    let (stdout, stderr, ok) = piped(&yes, "").await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("deleted INV-9"), "{stdout}");
    assert!(stderr.contains("approved (--yes)"), "{stderr}");
    assert_eq!(c.runs(), 2);
}

/// `bindery-sidecar run --prompt …` with `stdin` on its terminal; stdout,
/// stderr, and whether it succeeded.
async fn run_cli(c: &Clerk, prompt: &str, extra: &[&str], stdin: &str) -> (String, String, bool) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin())
        .args(["run", "--agent-file"])
        .arg(&c.agent)
        .args(["--set", "tenant=acme", "--prompt", prompt])
        .args(extra)
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// `run` asks on the terminal: y/n for a confirmation (showing the tool
/// and the model's arguments, never the secret), `--yes` approves without
/// asking, a deferred call's result is read from the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_asks_on_the_terminal() {
    let c = clerk("").await;
    let (stdout, stderr, ok) = run_cli_on_a_terminal(&c, "delete invoice 7", "n\n");
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(r#"bash_delete-invoice wants to run with {"id":"INV-7"}. Approve? [y/N]"#),
        "{stderr}"
    );
    assert!(stdout.contains("did not approve"), "{stdout}");
    assert_eq!(c.runs(), 0);

    // A `y` piped in is data, not a person: refused.
    let (stdout, stderr, ok) = run_cli(&c, "delete invoice 7", &[], "y\n").await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("stdin is not a terminal: refused"),
        "{stderr}"
    );
    assert!(!stdout.contains("deleted INV-7"), "{stdout}");
    assert_eq!(c.runs(), 0);

    let (stdout, stderr, ok) = run_cli_on_a_terminal(&c, "delete invoice 7", "y\n");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("deleted INV-7"), "{stdout}");
    assert!(stdout.contains(&sha256(CANARY)), "{stdout}");
    assert_eq!(c.runs(), 1);

    let (stdout, stderr, ok) = run_cli(&c, "delete invoice 7", &["--yes"], "").await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("deleted INV-7"), "{stdout}");
    assert_eq!(c.runs(), 2);

    let (stdout, stderr, ok) = run_cli(&c, "where am I?", &[], "Lyon\n").await;
    assert!(ok, "{stderr}");
    assert!(stderr.contains("get_location"), "{stderr}");
    assert_eq!(stdout, "done: Lyon\n");
    for s in [&stdout, &stderr] {
        assert!(!s.contains(CANARY));
    }
}

/// `check` and `describe` say which tools wait, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_describe_show_the_tools_that_wait() {
    let c = clerk("  confirm: [{tool: get_*}]\n").await;
    let (ok, stdout, _) = clerk_cli(&c, "check").await;
    assert!(ok, "{stdout}");
    assert!(
        stdout.contains(
            "    bash_delete-invoice(id)\n      needs confirmation: a person approves each call\n"
        ),
        "{stdout}"
    );
    // A deferred tool stays deferred: the client runs it, whatever `confirm` says.
    assert!(
        stdout.contains("    get_location(precision?)\n      deferred: the client runs it"),
        "{stdout}"
    );
    let (_, stdout, _) = clerk_cli(&c, "describe").await;
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let waits: Vec<(String, Value)> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                t["waits"].clone(),
            )
        })
        .collect();
    assert_eq!(
        waits,
        [
            ("bash_count-invoices".to_string(), Value::Null),
            ("bash_delete-invoice".to_string(), json!("confirm")),
            ("get_location".to_string(), json!("deferred")),
        ]
    );
    // And GET /v1/agents/clerk, for API clients.
    let (_sidecar, api) = c.start(&[]);
    let r = api.call("GET", "/v1/agents/clerk", Some(OWNER), None).await;
    assert_eq!(
        r.json["waits"],
        json!({"bash_delete-invoice": "confirm", "get_location": "deferred"}),
        "{}",
        r.text
    );
}

/// Two servers on one PostgreSQL database: a call that waits on one is
/// answered at the other, which forwards the answer to the server holding
/// the session's secret value, where the tool runs and the run resumes;
/// both show the same token, and the token is good once across both.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_take_the_continuation_at_either() {
    let pg = bindery_tests::postgres::Postgres::start();
    pg.create_database("pending");
    let mut c = clerk("").await;
    c.store = pg.url("pending");
    let (_a, api_a) = c.start(&[]);
    let (_b, api_b) = c.start(&[]);
    let r = waiting(&api_a, "delete invoice 7").await;
    let id = id_of(&r);
    let token = token_of(&r);
    let seen_by_b = on_session(&api_b, "GET", &id, "", None).await;
    assert_eq!(token_of(&seen_by_b), token);
    // The secret lives in A's memory only: B has A answer.
    let r = answer(&api_b, &token, json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(c.runs(), 1);
    let again = answer(&api_a, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&again), refusal(409, "continuation_used", &[]));

    // A deferred call the other way round: waits on B, answered at A.
    let r = waiting(&api_b, "where am I?").await;
    let r = answer(&api_a, &token_of(&r), json!({"result": "Lyon"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let dump = pg.sql("pending", "SELECT pending, turns FROM bindery_sessions");
    assert!(!dump.contains(CANARY));
    assert!(!dump.contains(&token));
}

/// A confirm selector that matches no tool protects nothing: `check` says
/// so, naming the selector and the tools there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_selector_that_matches_nothing_is_an_error() {
    let c = clerk("  confirm: [{tool: bash_delte-*}]\n").await;
    let (ok, _, all) = clerk_cli(&c, "check").await;
    assert!(!ok, "{all}");
    assert!(
        all.contains("agent `clerk`, agent-level confirm: confirm selector `bash_delte-*` matches no tool (tools: bash_count-invoices, bash_delete-invoice, get_location)"),
        "{all}"
    );
}

/// `resume: false` records a result without running; a resume goes on. A
/// call whose bound parameters changed (the agent file was edited and the
/// server restarted) is not the call its token was issued for: 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_can_wait_for_a_resume_and_a_changed_call_is_refused() {
    let c = clerk("").await;
    let (mut sidecar, api) = c.start(&[]);
    let r = waiting(&api, "where am I?").await;
    let id = id_of(&r);
    let r = answer(
        &api,
        &token_of(&r),
        json!({"result": "Lyon", "resume": false}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    assert_eq!(r.json["pending"], json!([]));
    assert!(
        r.json["status_detail"].as_str().unwrap().contains("resume"),
        "{}",
        r.text
    );
    let r = on_session(&api, "POST", &id, "/resume?wait=true", Some(json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(
        r.json["session"]["turns"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["content"],
        "done: Lyon"
    );

    let r = waiting(&api, "delete invoice 7").await;
    let token = token_of(&r);
    sidecar.kill();
    let text = std::fs::read_to_string(&c.agent).unwrap();
    std::fs::write(
        &c.agent,
        text.replace("{param: billing_token}", "{param: tenant}"),
    )
    .unwrap();
    let (_sidecar, api) = c.start(&[]);
    let r = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(409, "call_changed", &[]));
    assert_eq!(c.runs(), 0);
}

/// A deferred tool runs at the client, which gets only the model's
/// arguments: binding a value into one is refused at load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_can_be_bound_into_a_deferred_tool() {
    let c = clerk("  bindings: [{tool: get_*, arg: precision, value: {literal: city}}]\n").await;
    let (ok, _, all) = clerk_cli(&c, "check").await;
    assert!(!ok, "{all}");
    assert!(
        all.contains("tool `get_location` is deferred (the client runs it, and gets only the model's arguments), so nothing can be bound into it"),
        "{all}"
    );
}
