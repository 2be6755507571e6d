//! The chat page at `/`, used in a real browser (the `browser-tests`
//! feature): Debian's headless chromium driven by playwright-core
//! (tests/browser/chat-page.mjs, as `tests/setup.sh` installs them)
//! against the real sidecar and the mock model. The script connects with the owner token, fills the agent's
//! parameter form (a secret among them), sends a message, sees the answer
//! stream with its tool call, forks, lists the sessions and opens the
//! shared link in a fresh profile; it saves a screenshot of each state
//! under `target/tmp/chat-page/` (the path is printed). The test then
//! checks that the secret value reached neither the model, the logs nor
//! the store. A second scenario answers a waiting run's calls from their
//! cards: approve, reject with a reason, a deferred result; a third books
//! through the booking example's input, choice and confirmation; a
//! fourth opens a read-only share link (no composer) and a write one
//! (it chats).

use std::path::Path;
use std::process::Command;

use crate::common::booking::{booking, two_slots, DAY};
use crate::common::{contains, executable, raw_files, tool_then_answer, World, CANARY, OWNER};
use bindery_tests::mock_llm::{last_message, MockReply};
use bindery_tests::sidecar::Sidecar;
use serde_json::{json, Value};

fn browser_script() -> std::path::PathBuf {
    crate::common::repo().join("tests/browser/chat-page.mjs")
}

/// Runs the browser script's `scenario` against `sidecar`, its screenshots
/// under `target/tmp/chat-page/<scenario>/`; fails the test with its output
/// and the sidecar's log unless every step passed.
async fn browser(sidecar: &Sidecar, scenario: &str) {
    browser_with(sidecar, scenario, &[]).await;
}

/// [`browser`], with the script's environment given `env`.
async fn browser_with(sidecar: &Sidecar, scenario: &str, env: &[(&str, &str)]) {
    let node_modules = crate::common::repo().join("tests/browser/node_modules/playwright-core");
    assert!(
        node_modules.is_dir(),
        "{} is missing: run tests/setup.sh (it installs playwright-core and chromium)",
        node_modules.display()
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: run tests/setup.sh (apt-get install chromium)"
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("chat-page")
        .join(scenario);
    let _ = std::fs::remove_dir_all(&shots);
    let url = sidecar.url.clone();
    let scenario = scenario.to_string();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(browser_script())
            .args([&url, OWNER, CANARY])
            .arg(&shots)
            .arg(&scenario)
            .env("CHROMIUM", chromium)
            .envs(env)
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser script failed ({}):\n{stdout}\n{stderr}\nsidecar log:\n{}",
        out.status,
        sidecar.logs()
    );
    assert!(stdout.contains("all steps passed"), "{stdout}");
}

/// The secret never went to the model, the log or the store.
fn secret_kept(w: &World, sidecar: &Sidecar) {
    for (_, body) in w.mock.raw_requests() {
        assert!(!body.contains(CANARY), "the model saw the secret: {body}");
    }
    assert!(!sidecar.logs().contains(CANARY), "the secret is in the log");
    let store = raw_files(&w.dir.path().join("store"), "bindery.sqlite");
    assert!(!store.is_empty());
    assert!(!contains(&store, CANARY), "the secret is in the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_chats_forks_and_lists_in_a_real_browser() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, _api) = w.start(&[], &[]);
    browser(&sidecar, "chat").await;
    // Two runs (the owner's message, the link holder's), each a tool call
    // then an answer.
    assert_eq!(w.mock.request_count(), 4);
    secret_kept(&w, &sidecar);
}

/// The model: "where…" asks the client for `get_location`, "delete…" calls
/// `bash_delete-invoice` (which needs approval); after a tool result it
/// answers with it.
fn waits(req: &Value) -> MockReply {
    let last = last_message(req);
    let content = last["content"].as_str().unwrap_or("");
    match last["role"].as_str() {
        Some("tool") => MockReply::text(format!("done: {content}")),
        _ if content.contains("where") => {
            MockReply::tool_call("get_location", json!({"precision": "city"}))
        }
        _ => MockReply::tool_call("bash_delete-invoice", json!({"id": "INV-7"})),
    }
}

/// A bash tool `delete-invoice` that needs a person's approval (it counts
/// its runs in `delete-runs`) and a deferred `get_location`.
fn waiting_toolboxes(dir: &Path) -> String {
    let tools = dir.join("approve-tools");
    std::fs::create_dir_all(&tools).unwrap();
    executable(
        &tools.join("delete-invoice"),
        &format!(
            r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "delete-invoice", "description": "Deletes an invoice.", "args": [
    {{"name": "id", "description": "the invoice", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}}]}}'
  exit 0
fi
echo run >> "{runs}"
echo "deleted $*"
"#,
            runs = dir.join("delete-runs").display()
        ),
    );
    format!(
        r#"    - bash:
        directory: "{tools}"
        confirm: [{{tool: "delete-*"}}]
    - deferred:
        tools:
          - name: get_location
            description: Where the user is.
            parameters: {{type: object, properties: {{precision: {{type: string}}}}}}
"#,
        tools = tools.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_pending_calls_in_a_real_browser() {
    let w = World::with_toolboxes(waits, waiting_toolboxes).await;
    let (sidecar, _api) = w.start(&[], &[]);
    browser(&sidecar, "pending").await;

    // Approved once, rejected once: the tool ran once.
    let runs = std::fs::read_to_string(w.dir.path().join("delete-runs")).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "delete-invoice runs: {runs:?}");
    // What the model read after each answer.
    let results: Vec<String> = w
        .mock
        .raw_requests()
        .iter()
        .filter_map(|(_, body)| {
            let req: Value = serde_json::from_str(body).ok()?;
            let last = last_message(&req);
            (last["role"] == "tool").then(|| last["content"].as_str().unwrap_or("").to_string())
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].contains("INV-7"), "{results:?}");
    assert!(
        results[1].contains("did not approve") && results[1].contains("not before the audit"),
        "{results:?}"
    );
    assert_eq!(results[2], "Lisbon, Portugal");
    secret_kept(&w, &sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_gives_input_chooses_and_confirms_a_booking_in_a_real_browser() {
    let b = booking(two_slots(), |t| t).await;
    let (sidecar, _api) = b.start();
    browser(&sidecar, "booking").await;
    // The option the person chose, booked once, after the confirmation.
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-b")]);
    for req in b._mock.requests() {
        assert!(
            !req.to_string().contains(CANARY),
            "the model saw the API key"
        );
    }
    assert!(
        !sidecar.logs().contains(CANARY),
        "the API key is in the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_lets_a_run_go_past_a_budget_in_a_real_browser() {
    let w = World::with_toolboxes(
        |req| tool_then_answer(req).with_usage(30, 10),
        |_| {
            "  budgets:\n    - {name: per-session, tokens: 10, per: session, onExceed: confirm}\n"
                .into()
        },
    )
    .await;
    let priced = std::fs::read_to_string(&w.agent).unwrap().replace(
        "name: mock-model}",
        "name: mock-model, pricing: {inputPerMillion: 1.0, outputPerMillion: 2.0}}",
    );
    std::fs::write(&w.agent, priced).unwrap();
    let (sidecar, _api) = w.start(&[], &[]);
    browser(&sidecar, "budget").await;
    // The first run's two turns; the second run ended before the model.
    assert_eq!(w.mock.requests().len(), 2);
    secret_kept(&w, &sidecar);
}

/// Share links on the page: a read-only share's shows the conversation
/// and follows it with no composer; a write share's chats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_links_open_the_page_to_read_or_to_chat() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&[], &[]);
    let r = bindery_tests::fixtures::session::create_waited(
        &api,
        json!({"agent": "invoices", "prompt": "Which invoices are overdue?",
               "params": {"tenant": "acme-corp", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let link = |mode: &str| {
        let api = api.clone();
        let (id, mode, url) = (id.clone(), mode.to_string(), sidecar.url.clone());
        async move {
            let r = api
                .call(
                    "POST",
                    &format!("/v1/sessions/{id}/shares"),
                    Some(OWNER),
                    Some(&json!({"mode": mode})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            let (link, token) = (
                r.json["link"].as_str().unwrap(),
                r.json["token"].as_str().unwrap(),
            );
            let fragment = format!("#session={id}&token={token}&mode={mode}");
            assert!(link.ends_with(&format!("/{fragment}")), "{link}");
            format!("{url}/{fragment}")
        }
    };
    let (read, write) = (link("read").await, link("write").await);
    browser_with(
        &sidecar,
        "shares",
        &[("READ_LINK", &read), ("WRITE_LINK", &write)],
    )
    .await;
    // Two runs (the owner's, the write share's), each a tool call then an
    // answer.
    assert_eq!(w.mock.request_count(), 4);
    secret_kept(&w, &sidecar);
}

/// Two replicas on one PostgreSQL database; the session was made on B,
/// which holds its secret value. The page served by A is served by B for
/// everything about that session: the owner opens it from A's list and
/// chats (the answer streams), and its shared link on A does the same.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_on_a_replica_without_the_secret_is_served_by_the_holder() {
    const DB: &str = "chat_replicas";
    let pg = bindery_tests::postgres::Postgres::start();
    pg.create_database(DB);
    let mut w = World::new(tool_then_answer).await;
    w.store = pg.url(DB);
    let (b, api_b) = w.start(&[], &[]);
    let (a, _api_a) = w.start(&[], &[]);
    let r = crate::common::create(
        &api_b,
        json!({"agent": "invoices", "session_token": true,
               "params": {"tenant": "acme-corp", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap();
    let token = r.json["session_token"].as_str().unwrap();
    let link = format!("{}/#session={id}&token={token}", a.url);

    browser_with(&a, "replica", &[("LINK", &link)]).await;
    // Two runs, each a tool call then an answer, both on B.
    assert_eq!(w.mock.request_count(), 4);
    let on_b = crate::common::served(&api_b, "/v1/sessions/{id}/messages").await;
    assert_eq!(on_b, 2.0, "B ran both messages");
    assert!(crate::common::served(&api_b, "/v1/sessions/{id}").await >= 2.0);
    for (_, body) in w.mock.raw_requests() {
        assert!(!body.contains(CANARY), "the model saw the secret: {body}");
    }
    for s in [&a, &b] {
        assert!(!s.logs().contains(CANARY), "the secret is in a log");
    }
    assert!(!pg.dump(DB).contains(CANARY), "the secret is in the store");
}
