//! Runs that wait: a call that needs a person's approval, a deferred call
//! the client runs, their continuations, and what a restart, a cancel and
//! another session's token do to them. The real binary over TCP, real bash
//! tools, a scripted model.

use std::path::PathBuf;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_names, tool_results, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Reply, Sidecar};
use serde_json::{json, Value};

/// The model: "where…" asks the client for `get_location`, anything else
/// deletes invoice INV-7; after a tool result it answers with it.
fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    // The boss (helpers test) delegates to the clerk.
    if tool_names(req).iter().any(|t| t == "prompt_agent_clerk") && last["role"] == "user" {
        return MockReply::tool_call("prompt_agent_clerk", json!({"what": "delete invoice 7"}));
    }
    match last["role"].as_str() {
        Some("tool") => {
            MockReply::text(format!("done: {}", last["content"].as_str().unwrap_or("")))
        }
        _ if last["content"].as_str().unwrap_or("").contains("where") => {
            MockReply::tool_call("get_location", json!({"precision": "city"}))
        }
        _ if last["content"].as_str().unwrap_or("").contains("count") => {
            MockReply::tool_call("bash_count-invoices", json!({}))
        }
        _ => MockReply::tool_call("bash_delete-invoice", json!({"id": "INV-7"})),
    }
}

/// An agent file up to its tools: the model at `url`, a session-scope
/// `tenant` and an optional secret `billing_token`.
fn agent_head(name: &str, url: &str) -> String {
    format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: {name}
spec:
  model: {{url: "{url}", name: mock-model}}
  parameters:
    - {{name: tenant, scope: session}}
    - {{name: billing_token, secret: true, scope: session, required: false}}"#
    )
}

pub(crate) struct Clerk {
    pub(crate) dir: tempfile::TempDir,
    mock: MockLlm,
    agent: PathBuf,
    store: String,
}

/// An agent `clerk` whose bash tool `delete-invoice` needs confirmation
/// (it gets the secret `billing_token`, and counts its runs in a file) and
/// whose deferred tool `get_location` the client runs. `spec_extra` is
/// added to the agent's spec (`confirmTtl: 1s`).
pub(crate) async fn clerk(spec_extra: &str) -> Clerk {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(script).await;
    let tools = dir.path().join("clerk-tools");
    std::fs::create_dir_all(&tools).unwrap();
    executable(
        &tools.join("delete-invoice"),
        &format!(
            r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "delete-invoice", "description": "Deletes an invoice.", "args": [
    {{"name": "id", "description": "the invoice", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}},
    {{"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "optional", "mode": "env"}}]}}'
  exit 0
fi
echo run >> "{runs}"
printf 'deleted %s, token-sha256 %s\n' "$3" "$(printf %s "${{TOKEN:-}}" | sha256sum | cut -d' ' -f1)"
"#,
            runs = dir.path().join("delete-runs").display()
        ),
    );
    // A tool that needs nobody: it runs when called.
    executable(
        &tools.join("count-invoices"),
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  echo '{"slug": "count-invoices", "description": "Counts invoices.", "args": []}'
  exit 0
fi
echo 3 invoices
"#,
    );
    let text = format!(
        r#"{head}
  toolboxes:
    - bash:
        directory: "{tools}"
        confirm: [{{tool: "delete-*"}}]
        bindings:
          - {{arg: token, value: {{param: billing_token}}, whenUnbound: omit}}
    - deferred:
        tools:
          - name: get_location
            description: Where the user is.
            parameters: {{type: object, properties: {{precision: {{type: string}}}}}}
{spec_extra}"#,
        head = agent_head("clerk", &mock.url()),
        tools = tools.display()
    );
    let agent = dir.path().join("clerk.yaml");
    std::fs::write(&agent, text).unwrap();
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
        std::fs::read_to_string(self.dir.path().join("delete-runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
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

/// `POST /v1/sessions?wait=true` with `body`, as the owner.
async fn create_waited(api: &Api, body: Value) -> Reply {
    api.call("POST", "/v1/sessions?wait=true", Some(OWNER), Some(&body))
        .await
}

/// A session of `clerk` asked `prompt`, run until it blocks.
async fn waiting(api: &Api, prompt: &str) -> Reply {
    let r = create_waited(
        api,
        json!({"agent": "clerk", "prompt": prompt,
                "params": {"tenant": "acme", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    r
}

/// `METHOD /v1/sessions/{id}{path}` as the owner.
async fn on_session(api: &Api, method: &str, id: &str, path: &str, body: Option<Value>) -> Reply {
    api.call(
        method,
        &format!("/v1/sessions/{id}{path}"),
        Some(OWNER),
        body.as_ref(),
    )
    .await
}

/// The secret `billing_token` given again (`PUT …/params`).
async fn give_secret(api: &Api, id: &str) -> Reply {
    let body = json!({"params": {"billing_token": CANARY}});
    on_session(api, "PUT", id, "/params", Some(body)).await
}

fn id_of(r: &Reply) -> String {
    r.json["session_id"].as_str().unwrap().to_string()
}

fn token_of(r: &Reply) -> String {
    r.json["pending"][0]["continuation_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no pending token: {}", r.text))
        .to_string()
}

async fn answer(api: &Api, token: &str, body: Value) -> Reply {
    api.call(
        "POST",
        &format!("/v1/continuations/{token}?wait=true"),
        Some(OWNER),
        Some(&body),
    )
    .await
}

fn sha256(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_runs_once_and_its_token_is_good_once() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = waiting(&api, "delete invoice 7").await;
    let item = &r.json["pending"][0];
    assert_eq!(item["disposition"], "confirm");
    assert_eq!(item["tool"], "bash_delete-invoice");
    assert_eq!(item["call"], json!({"id": "INV-7"}));
    assert!(item["tool_call_id"].is_string());
    assert!(
        r.json["status_detail"]
            .as_str()
            .unwrap()
            .contains("approval of bash_delete-invoice"),
        "{}",
        r.text
    );
    assert_eq!(c.runs(), 0, "the tool ran before approval");
    let token = token_of(&r);
    assert!(token.starts_with("ct_"), "{token}");

    let r = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["pending"], json!([]));
    assert_eq!(c.runs(), 1);
    let out = last_tool_output(&r);
    assert!(out.contains("deleted INV-7"), "{out}");
    assert!(
        out.contains(&sha256(CANARY)),
        "the bound secret reached the tool: {out}"
    );

    let again = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&again), refusal(409, "continuation_used", &[]));
    assert_eq!(c.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_call_reaches_the_model_as_a_tool_result() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = waiting(&api, "delete invoice 7").await;
    let token = token_of(&r);
    let wrong = answer(&api, &token, json!({"result": "ok"})).await;
    assert_eq!(error_of(&wrong).0, 400, "{}", wrong.text);

    let r = answer(
        &api,
        &token,
        json!({"approve": false, "reason": "not today"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    assert_eq!(c.runs(), 0);
    let last = c.mock.requests().last().cloned().unwrap();
    let results = tool_results(&last);
    assert!(
        results
            .iter()
            .any(|t| t.contains("did not approve") && t.contains("not today")),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_session_is_unknown() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let a = waiting(&api, "delete invoice 7").await;
    let b = waiting(&api, "delete invoice 7").await;
    let (ta, idb) = (token_of(&a), id_of(&b));
    let named = answer(&api, &ta, json!({"approve": true, "session_id": idb})).await;
    assert_eq!(error_of(&named), refusal(404, "not_found", &[]));
    // The same secret part under the other session's name.
    let forged = ta.replace(&id_of(&a), &idb);
    let r = answer(&api, &forged, json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(404, "not_found", &[]));
    let r = answer(&api, "ct_nothing", json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(404, "not_found", &[]));
    assert_eq!(c.runs(), 0);
    // Its own session named: fine.
    let r = answer(&api, &ta, json!({"approve": true, "session_id": id_of(&a)})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_confirmation_expires_as_not_approved() {
    let c = clerk("  confirmTtl: 1s\n").await;
    let (_sidecar, api) = c.start(&["--runner-heartbeat", "100ms"]);
    let r = waiting(&api, "delete invoice 7").await;
    assert!(r.json["pending"][0]["expires_at"].is_string(), "{}", r.text);
    let (id, token) = (id_of(&r), token_of(&r));
    let view = eventually("the confirmation expires", PATIENCE, || async {
        let view = on_session(&api, "GET", &id, "", None).await;
        (view.json["status"] == "idle").then_some(view)
    })
    .await;
    assert!(
        last_tool_output(&view).contains("nobody approved this call in time"),
        "{}",
        view.text
    );
    assert_eq!(c.runs(), 0);
    let late = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&late), refusal(409, "continuation_expired", &[]));
    assert_eq!(c.runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_call_waits_for_the_clients_result() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = waiting(&api, "where am I?").await;
    let item = &r.json["pending"][0];
    assert_eq!(item["disposition"], "deferred");
    assert_eq!(item["tool"], "get_location");
    assert_eq!(item["call"], json!({"precision": "city"}));
    let token = token_of(&r);
    let wrong = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&wrong).0, 400, "{}", wrong.text);
    let r = answer(&api, &token, json!({"result": "Lyon"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    let turns = r.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "done: Lyon", "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_waiting_run_closes_its_calls() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = waiting(&api, "delete invoice 7").await;
    let (id, token) = (id_of(&r), token_of(&r));
    let r = on_session(&api, "POST", &id, "/cancel", None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    assert_eq!(r.json["status_detail"], "cancelled");
    assert_eq!(r.json["pending"], json!([]));
    assert_eq!(last_tool_output(&r), "error: the run was cancelled");
    let late = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&late), refusal(409, "continuation_used", &[]));
    assert_eq!(c.runs(), 0);
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

/// `run: step` takes one model turn and runs its calls, then stops; a
/// resume goes on. A message to a waiting session is refused until its
/// calls are answered; a continuation takes `run` like any request that
/// starts a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_step_takes_one_turn_and_a_waiting_session_takes_no_message() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = create_waited(
        &api,
        json!({"agent": "clerk", "prompt": "count them", "run": "step",
                "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(
        r.json["status_detail"]
            .as_str()
            .unwrap()
            .contains("one step"),
        "{}",
        r.text
    );
    assert_eq!(last_tool_output(&r), "3 invoices\n");
    let before = c.mock.request_count();
    let r = on_session(&api, "POST", &id_of(&r), "/resume?wait=true", None).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], Value::Null, "{}", r.text);
    assert_eq!(c.mock.request_count(), before + 1);

    let r = waiting(&api, "delete invoice 7").await;
    let id = id_of(&r);
    let msg = on_session(
        &api,
        "POST",
        &id,
        "/messages",
        Some(json!({"prompt": "and invoice 8"})),
    )
    .await;
    assert_eq!(error_of(&msg), refusal(409, "waiting_external", &[]));
    let r = answer(&api, &token_of(&r), json!({"approve": true, "run": "step"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
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

/// A fork copies no pending call: its last turn is closed as a cancel
/// closes it, and the source still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_copies_no_pending_call() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = waiting(&api, "delete invoice 7").await;
    let id = id_of(&r);
    let f = on_session(&api, "POST", &id, "/fork", Some(json!({}))).await;
    assert_eq!(f.status, 201, "{}", f.text);
    assert_eq!(f.json["status"], "idle");
    assert_eq!(f.json["pending"], json!([]));
    assert_eq!(last_tool_output(&f), "error: the run was cancelled");
    let src = on_session(&api, "GET", &id, "", None).await;
    assert_eq!(src.json["status"], "waiting_external");
    assert_eq!(token_of(&src), token_of(&r));
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

/// One JSON-RPC `tools/call` over `POST /mcp`, the secret as a header.
async fn mcp_call(api: &Api, params: Value) -> Value {
    let resp = api
        .http
        .post(format!("{}/mcp", api.base))
        .bearer_auth(OWNER)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("Agents-Param-tenant", "acme")
        .header("Agents-Param-billing_token", CANARY)
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"].is_null(), "{v}");
    v["result"].clone()
}

/// Over MCP a blocked run answers with its pending items; the next call
/// carries the decision (and the values again) and runs on to the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_that_blocks_is_continued_by_the_next_call() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = mcp_call(
        &api,
        json!({"name": "ask_clerk", "arguments": {"prompt": "delete invoice 7"}}),
    )
    .await;
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("approval of bash_delete-invoice"), "{text}");
    let pending = &r["_meta"]["bindery.dev/pending"][0];
    assert_eq!(pending["disposition"], "confirm");
    assert_eq!(c.runs(), 0);
    let token = pending["continuation_token"].as_str().unwrap();

    let r = mcp_call(
        &api,
        json!({"name": "ask_clerk", "arguments": {},
               "_meta": {"bindery.dev/continuations": [{"token": token, "approve": true}]}}),
    )
    .await;
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("done: deleted INV-7"), "{text}");
    assert!(text.contains(&sha256(CANARY)), "{text}");
    assert!(r["_meta"].get("bindery.dev/pending").is_none(), "{r}");
    assert_eq!(c.runs(), 1);
}

/// A call that waits inside a helper shows in the top-level session's
/// `pending` (`via` the helper); its answer resumes the helper, whose
/// answer goes back to the caller, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helpers_pending_call_surfaces_and_resumes_the_helper_then_its_caller() {
    let c = clerk("").await;
    let boss = c.dir.path().join("boss.yaml");
    std::fs::write(
        &boss,
        format!(
            r#"{head}
  helpers:
    - path: ./clerk.yaml
      with: {{tenant: {{param: tenant}}, billing_token: {{param: billing_token}}}}
"#,
            head = agent_head("boss", &c.mock.url())
        ),
    )
    .unwrap();
    let (_sidecar, api) = serve(&boss, &c.store, &[], &[], c.dir.path());
    let r = create_waited(
        &api,
        json!({"agent": "boss", "prompt": "ask the clerk to delete invoice 7",
                "params": {"tenant": "acme", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let item = &r.json["pending"][0];
    assert_eq!(item["tool"], "bash_delete-invoice");
    assert_eq!(item["via"], json!(["prompt_agent_clerk"]));
    assert_eq!(item["call"], json!({"id": "INV-7"}));
    assert!(r.json["status_detail"]
        .as_str()
        .unwrap()
        .contains("(in prompt_agent_clerk)"));
    assert_eq!(c.runs(), 0);

    let r = answer(&api, &token_of(&r), json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(c.runs(), 1);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    // The boss got the clerk's answer as its tool result, then answered.
    let helper_result = last_tool_output(&r);
    assert!(
        helper_result.starts_with("done: deleted INV-7"),
        "{}",
        r.text
    );
    assert!(helper_result.contains(&sha256(CANARY)), "{}", r.text);
    assert!(
        turns.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .starts_with("done: done: deleted INV-7"),
        "{}",
        r.text
    );
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

/// A message-scope value lasts one run: the request that resumes a waiting
/// run must bring it again, or it is 409 params_required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_scope_values_come_with_the_answer_that_resumes() {
    let c = clerk("").await;
    let text = std::fs::read_to_string(&c.agent).unwrap();
    let with_otp = text.replace(
        "  toolboxes:",
        "    - {name: otp, scope: message, secret: true}\n  toolboxes:",
    );
    std::fs::write(&c.agent, with_otp).unwrap();
    let (_sidecar, api) = c.start(&[]);
    let r = create_waited(
        &api,
        json!({"agent": "clerk", "prompt": "delete invoice 7",
                "params": {"tenant": "acme", "billing_token": CANARY, "otp": "123456"}}),
    )
    .await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let token = token_of(&r);
    let r = answer(&api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(409, "params_required", &["otp"]));
    assert_eq!(c.runs(), 0);
    let r = answer(
        &api,
        &token,
        json!({"approve": true, "params": {"otp": "654321"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
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

/// A session-token holder sees what the session waits for, never a token,
/// and cannot answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_sees_pending_calls_without_their_tokens() {
    let c = clerk("").await;
    let (_sidecar, api) = c.start(&[]);
    let r = create_waited(
        &api,
        json!({"agent": "clerk", "prompt": "delete invoice 7", "session_token": true,
                "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let (id, st, token) = (
        id_of(&r),
        r.json["session_token"].as_str().unwrap().to_string(),
        token_of(&r),
    );
    let seen = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(&st), None)
        .await;
    assert_eq!(seen.json["pending"][0]["tool"], "bash_delete-invoice");
    assert!(seen.json["pending"][0].get("continuation_token").is_none());
    assert!(!seen.text.contains(&token));
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{token}"),
            Some(&st),
            Some(&json!({"approve": true})),
        )
        .await;
    // Known, and refused: only the owner answers.
    assert_eq!(error_of(&r), refusal(403, "forbidden", &[]));
    assert_eq!(c.runs(), 0);
}
