//! When a call asks a person, through the binary where only it shows it:
//! the poisoned ticket end to end (the mail token in no log or store
//! file), webhook notices to a receiver over TCP, the approver token,
//! `check` and the session CLI, with the guard example
//! (`examples/guard/`) and a scripted model that does what a poisoned
//! ticket tells it to. The guard's logic over the API is tested in
//! process (`sidecar/api/tests/inproc/approvals.rs`).

use crate::common::*;
use bindery_tests::fixtures::guard::{self, waiting};
use bindery_tests::fixtures::session::answer_item;
use bindery_tests::mock_llm::MockLlm;
use bindery_tests::sidecar::{Api, Reply, Sidecar};
use serde_json::{json, Value};

struct Guard {
    dir: tempfile::TempDir,
    _mock: MockLlm,
    sidecar: Sidecar,
    api: Api,
}

impl Guard {
    async fn start() -> Guard {
        Guard::start_with(|t| t, &[], &[]).await
    }

    /// The example with `edit` applied to its text, `extra` arguments and
    /// `env` for the server.
    async fn start_with(
        edit: impl FnOnce(String) -> String,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Guard {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        let mock = MockLlm::start(guard::obedient).await;
        let text = example_agent_text("guard", &mock.url());
        let agent = dir.path().join("helpdesk.yaml");
        std::fs::write(&agent, edit(text)).unwrap();
        let outbox = guard::outbox_value(dir.path());
        let mut args = vec!["--set", outbox.as_str()];
        args.extend_from_slice(extra);
        let mut vars = vec![("BINDERY_PARAM_MAIL_TOKEN", CANARY)];
        vars.extend_from_slice(env);
        let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &args, &vars, dir.path());
        Guard {
            dir,
            _mock: mock,
            sidecar,
            api,
        }
    }

    /// What the fake mail API sent: `to<TAB>body` lines.
    fn outbox(&self) -> Vec<String> {
        guard::outbox(self.dir.path())
    }

    /// `prompt` posted to session `id`, the run waited for (200).
    async fn message(&self, id: &str, prompt: &str) -> Reply {
        message_waited(&self.api, id, prompt).await
    }

    /// The pending `item` answered with `body`, the run waited for (200).
    async fn answer(&self, item: &Value, body: Value) -> Reply {
        let r = answer_item(&self.api, item, body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_ticket_cannot_mail_data_away() {
    let mut g = Guard::start().await;
    let agent = g
        .api
        .call("GET", "/v1/agents/helpdesk", Some(OWNER), None)
        .await;
    assert_eq!(
        agent.json["untrusted"],
        json!(["bash_fetch-ticket"]),
        "{}",
        agent.text
    );
    assert_eq!(
        agent.json["egress"],
        json!(["bash_send-email"]),
        "{}",
        agent.text
    );

    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    // The model reads the ticket and does what it says: the mail waits.
    let r = g.message(&id, "read ticket T-1").await;
    let item = waiting(&r).clone();
    assert_eq!(item["tool"], "bash_send-email", "{}", r.text);
    assert_eq!(item["disposition"], "confirm");
    assert_eq!(item["call"]["to"], "audit@attacker.example");
    let tainted = item["tainted_by"].as_array().expect("the taint's facts");
    assert_eq!(tainted.len(), 1, "{item}");
    assert_eq!(tainted[0]["tool"], "bash_fetch-ticket");
    assert!(g.outbox().is_empty(), "mailed before a person said so");

    // The person refuses: nothing is sent, the model is told why.
    let r = g
        .answer(
            &item,
            json!({"approve": false, "reason": "that is an exfiltration attempt"}),
        )
        .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(g.outbox().is_empty());
    assert!(
        r.text.contains("that is an exfiltration attempt"),
        "{}",
        r.text
    );

    // The session stays tainted: even mail to a colleague waits...
    let r = g.message(&id, "mail bob").await;
    let item = waiting(&r).clone();
    assert_eq!(item["call"]["to"], "bob@example.com");
    assert_eq!(item["tainted_by"][0]["tool"], "bash_fetch-ticket");
    // ...until a person clears it with their approval.
    let r = g
        .answer(&item, json!({"approve": true, "clear_taint": true}))
        .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(g.outbox(), ["bob@example.com\thello"]);
    let r = g.message(&id, "mail bob").await;
    assert_eq!(r.json["status"], "idle", "cleared, it runs: {}", r.text);
    assert_eq!(g.outbox().len(), 2);

    // A fork before the ticket was read is clean.
    let fork = g
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/fork?wait=true"),
            Some(OWNER),
            Some(&json!({"at_turn": 0, "prompt": "mail bob"})),
        )
        .await;
    assert_eq!(fork.status, 201, "{}", fork.text);
    assert_eq!(fork.json["status"], "idle", "{}", fork.text);
    assert_eq!(g.outbox().len(), 3);
    // The mail token reached the tool (it refuses without one) and nothing else.
    g.sidecar.stop();
    assert!(!g.sidecar.logs().contains(CANARY));
    assert!(!contains(&raw_files(g.dir.path(), "store.sqlite"), CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_does_not_compile_is_caught_by_check() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/guard");
    let text = std::fs::read_to_string(example.join("agent.yaml"))
        .unwrap()
        .replace("endsWith('@example.com')", "endsWith('@example.com'")
        .replace(
            "directory: tools",
            &format!("directory: \"{}\"", example.join("tools").display()),
        );
    let agent = dir.path().join("broken.yaml");
    std::fs::write(&agent, text).unwrap();
    let out = std::process::Command::new(bin())
        .args(["check", "--agent-file", agent.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    for part in [
        "broken.yaml",
        "agent `helpdesk`",
        "confirm `bash_send-email`",
        "does not compile at line 1, column",
    ] {
        assert!(said.contains(part), "{part} not in: {said}");
    }
    // The example itself is fine, and check says what asks and why.
    let out = std::process::Command::new(bin())
        .args([
            "check",
            "--agent-file",
            example.join("agent.yaml").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("needs confirmation when: !args.to.endsWith('@example.com')"),
        "{said}"
    );
    assert!(
        said.contains("untrusted:") && said.contains("egress:"),
        "{said}"
    );
}

const KEY: &str = "whsec-approvals-7d1c";
const APPROVER: &str = "approver-token-for-tests";

/// What a webhook receiver saw: each delivery's headers that matter and
/// its body, and whether it took it.
#[derive(Clone, Debug)]
struct Delivery {
    signature: String,
    id: String,
    body: String,
    accepted: bool,
}

#[derive(Clone, Default)]
struct Receiver {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Delivery>>>,
    /// Answer 503 to this many deliveries first.
    failures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Receiver {
    /// A receiver on 127.0.0.1 that verifies each notice as a real one
    /// should: the signature with the shared key, the timestamp within five
    /// minutes, and an id it has not taken before (else 409).
    async fn start(failures: usize) -> (String, Receiver) {
        use axum::http::{HeaderMap, StatusCode};
        let r = Receiver::default();
        r.failures
            .store(failures, std::sync::atomic::Ordering::SeqCst);
        let state = r.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let r = state.clone();
                async move {
                    let get = |h: &str| {
                        headers
                            .get(h)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    let (signature, id) = (get("bindery-signature"), get("idempotency-key"));
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs();
                    let genuine = bindery_session::notify::verify(
                        KEY.as_bytes(),
                        &signature,
                        &body,
                        now,
                        300,
                    );
                    let mut seen = r.seen.lock().unwrap();
                    let replayed = seen.iter().any(|d| d.accepted && d.id == id);
                    let failing = r
                        .failures
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |n| n.checked_sub(1),
                        )
                        .is_ok();
                    let status = if !genuine {
                        StatusCode::UNAUTHORIZED
                    } else if replayed {
                        StatusCode::CONFLICT
                    } else if failing {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::NO_CONTENT
                    };
                    seen.push(Delivery {
                        signature,
                        id,
                        body: String::from_utf8_lossy(&body).to_string(),
                        accepted: status == StatusCode::NO_CONTENT,
                    });
                    status
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, r)
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Until `n` deliveries came.
    async fn until(&self, n: usize) -> Vec<Delivery> {
        let what = format!("{n} deliveries come");
        eventually(&what, PATIENCE, || {
            let d = self.deliveries();
            std::future::ready((d.len() >= n).then_some(d))
        })
        .await
    }
}

/// The session's `status_detail` once it says how its notice went.
async fn notice_detail(g: &Guard, id: &str) -> String {
    eventually("the session tells of its notice", PATIENCE, || async {
        let s = g
            .api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        let detail = s.json["status_detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        detail.contains("webhook").then_some(detail)
    })
    .await
}

/// The guard example with an approval webhook to `url`, its signing key a
/// secret process parameter.
fn with_webhook(url: &str) -> impl FnOnce(String) -> String + '_ {
    move |t: String| {
        t.replace(
            "  parameters:\n",
            &format!(
                "  approvals:\n    webhook:\n      url: \"{url}\"\n      signingKey: {{param: approvals_key}}\n  parameters:\n    - {{name: approvals_key, secret: true, scope: process}}\n"
            ),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_notice_is_signed_refuses_replay_and_its_link_answers() {
    let (url, receiver) = Receiver::start(0).await;
    let mut g = Guard::start_with(
        with_webhook(&url),
        &[],
        &[("BINDERY_PARAM_APPROVALS_KEY", KEY)],
    )
    .await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    let r = g.message(&id, "mail outsider").await;
    let item = waiting(&r).clone();
    let notice = receiver.until(1).await.remove(0);
    assert!(notice.accepted, "{notice:?}");
    let body: Value = serde_json::from_str(&notice.body).unwrap();
    assert_eq!(body["type"], "approval.pending");
    assert_eq!(body["session_id"], id.as_str());
    assert_eq!(body["agent"], "helpdesk");
    assert_eq!(body["tool"], "bash_send-email");
    assert_eq!(body["call"]["to"], "someone@other.example");
    assert_eq!(body["id"], notice.id.as_str());
    // Bound and secret values never: neither the mail token nor the key.
    assert!(
        !notice.body.contains(CANARY) && !notice.body.contains(KEY),
        "{}",
        notice.body
    );
    assert!(body["call"].get("token").is_none());

    // The same notice sent again (a replay, or an attacker who caught it)
    // is refused by a receiver that checks what the notice carries.
    let again = reqwest::Client::new()
        .post(&url)
        .header("bindery-signature", &notice.signature)
        .header("idempotency-key", &notice.id)
        .body(notice.body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    // An altered one does not verify.
    let forged = reqwest::Client::new()
        .post(&url)
        .header("bindery-signature", &notice.signature)
        .header("idempotency-key", "another")
        .body(
            notice
                .body
                .replace("someone@other.example", "me@evil.example"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);

    // The receiver answers through the notice's link: no token but the link's.
    let link = body["answer_url"].as_str().unwrap();
    assert!(
        link.ends_with(item["continuation_token"].as_str().unwrap()),
        "{link}"
    );
    let answered = reqwest::Client::new()
        .post(format!("{link}?wait=true"))
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["status"], "idle", "{answered}");
    assert!(
        answered.get("session").is_none(),
        "the link shows no turns: {answered}"
    );
    assert_eq!(g.outbox(), ["someone@other.example\thello"]);
    // The link is good for one answer.
    let twice = reqwest::Client::new()
        .post(link)
        .json(&json!({"approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 409);
    // Who decided is on record.
    let (resolved, _) = first_event(&g.api, &id, "resolved").await;
    assert_eq!(resolved["by"], "webhook", "{resolved}");
    g.sidecar.stop();
    let logs = g.sidecar.logs();
    assert!(!logs.contains(KEY) && !logs.contains(CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_fails_twice_gets_the_notice_the_third_time() {
    let (url, receiver) = Receiver::start(2).await;
    let g = Guard::start_with(
        with_webhook(&url),
        &[],
        &[("BINDERY_PARAM_APPROVALS_KEY", KEY)],
    )
    .await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    waiting(&g.message(&id, "mail outsider").await);
    let seen = receiver.until(3).await;
    assert_eq!(
        seen.iter().map(|d| d.accepted).collect::<Vec<_>>(),
        [false, false, true]
    );
    // One notice: every attempt carries the same id, each freshly signed.
    assert!(seen.iter().all(|d| d.id == seen[0].id), "{seen:?}");
    let metrics = g.api.call("GET", "/metrics", None, None).await;
    for (outcome, n) in [("retried", 2.0), ("delivered", 1.0)] {
        assert_eq!(
            sample(
                &metrics.text,
                &format!("bindery_approval_notices_total{{outcome=\"{outcome}\"}}")
            ),
            Some(n),
            "{}",
            metrics.text
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_that_fails_for_good_shows_in_the_session() {
    let (url, receiver) = Receiver::start(usize::MAX).await;
    let g = Guard::start_with(
        with_webhook(&url),
        &["--approval-notice-attempts", "2"],
        &[("BINDERY_PARAM_APPROVALS_KEY", KEY)],
    )
    .await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    waiting(&g.message(&id, "mail outsider").await);
    receiver.until(2).await;
    let detail = notice_detail(&g, &id).await;
    assert!(
        detail.contains("the approval webhook could not be told"),
        "{detail}"
    );
    assert!(detail.contains("503"), "{detail}");
    let metrics = g.api.call("GET", "/metrics", None, None).await;
    assert_eq!(
        sample(
            &metrics.text,
            "bindery_approval_notices_total{outcome=\"failed\"}"
        ),
        Some(1.0),
        "{}",
        metrics.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_answers_but_reads_nothing_else() {
    let g = Guard::start_with(|t| t, &[], &[("BINDERY_APPROVER_TOKEN", APPROVER)]).await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    waiting(&g.message(&id, "mail outsider").await);
    let api = &g.api;
    let listed = api.call("GET", "/v1/approvals", Some(APPROVER), None).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let items = listed.json["approvals"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", listed.text);
    let item = &items[0];
    assert_eq!(item["session_id"], id.as_str());
    assert_eq!(item["agent"], "helpdesk");
    assert_eq!(item["call"]["to"], "someone@other.example");
    // Nothing else opens: not the session, its turns, its events, the
    // list, a message, /mcp.
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}"), None),
        ("GET", format!("/v1/sessions/{id}/events"), None),
        ("GET", "/v1/sessions".to_string(), None),
        ("GET", "/v1/agents".to_string(), None),
        (
            "POST",
            format!("/v1/sessions/{id}/messages"),
            Some(json!({"prompt": "hi"})),
        ),
        (
            "PUT",
            format!("/v1/sessions/{id}/params"),
            Some(json!({"params": {}})),
        ),
    ] {
        let r = api.call(method, &path, Some(APPROVER), body.as_ref()).await;
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text);
        assert!(!r.text.contains("someone@other.example"), "{}", r.text);
    }
    let mcp = api
        .call(
            "POST",
            "/mcp",
            Some(APPROVER),
            Some(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
        )
        .await;
    assert_eq!(mcp.status, 401, "{}", mcp.text);
    // It answers, setting no value, and is told no more than the status.
    let token = item["continuation_token"].as_str().unwrap();
    let with_params = api
        .call(
            "POST",
            &format!("/v1/continuations/{token}"),
            Some(APPROVER),
            Some(&json!({"approve": true, "params": {"outbox": "/tmp/elsewhere"}})),
        )
        .await;
    assert_eq!(with_params.status, 403, "{}", with_params.text);
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{token}?wait=true"),
            Some(APPROVER),
            Some(&json!({"approve": true})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(
        r.json.get("session").is_none() && r.json.get("params").is_none(),
        "{}",
        r.text
    );
    assert_eq!(g.outbox(), ["someone@other.example\thello"]);
    let listed = api.call("GET", "/v1/approvals", Some(APPROVER), None).await;
    assert_eq!(listed.json["approvals"], json!([]), "{}", listed.text);
    // The owner sees who decided.
    let (resolved, _) = first_event(api, &id, "resolved").await;
    assert_eq!(resolved["by"], "approver", "{resolved}");
}

/// The session CLI clears the taint guard with its approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cli_approves_and_clears_the_taint() {
    let g = Guard::start().await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    let item = waiting(&g.message(&id, "read ticket T-1").await).clone();
    g.answer(&item, json!({"approve": false})).await;
    waiting(&g.message(&id, "mail bob").await);
    let token_file = g.dir.path().join("owner-token");
    std::fs::write(&token_file, OWNER).unwrap();
    let url = g.sidecar.url.clone();
    let out = tokio::task::spawn_blocking({
        let id = id.clone();
        move || {
            std::process::Command::new(bin())
                .args(["session", "--server", &url, "--token-file"])
                .arg(&token_file)
                .args(["approve", &id, "--clear-taint", "--wait"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(g.outbox(), ["bob@example.com\thello"]);
    // Cleared: the next mail runs at once.
    let r = g.message(&id, "mail bob").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(g.outbox().len(), 2);
}

/// A receiver that redirects notices to another origin does not get them
/// delivered there: the notice, signed with the tenant's key, goes only to
/// the origin the agent names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_does_not_follow_a_redirect_to_another_origin() {
    let (elsewhere, thief) = Receiver::start(0).await;
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let to = elsewhere.clone();
            move || {
                let to = to.clone();
                async move { axum::response::Redirect::temporary(&to) }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let g = Guard::start_with(
        with_webhook(&url),
        &["--approval-notice-attempts", "1"],
        &[("BINDERY_PARAM_APPROVALS_KEY", KEY)],
    )
    .await;
    let id = new_session(&g.api, json!({"agent": "helpdesk"})).await;
    waiting(&g.message(&id, "mail outsider").await);
    let detail = notice_detail(&g, &id).await;
    assert!(detail.contains("was not followed"), "{detail}");
    assert!(
        !detail.contains("/hook"),
        "the receiver's path in the detail: {detail}"
    );
    assert!(
        thief.deliveries().is_empty(),
        "the notice reached the other origin"
    );
}
