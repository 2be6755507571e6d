//! Per-end-user limits as end users meet them: a budget that counts each
//! user apart, a cap on each user's runs at once, and requests and tool
//! calls per minute; and what the owner's usage report shows by user.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use bindery_identity::testkeys::TestIssuer;
use bindery_identity::IdentityConfig;
use bindery_session::service::ServiceConfig;
use bindery_tests::eventually::eventually;
use bindery_tests::fixtures::{counted, metered_agent};
use bindery_tests::mock_llm::{Gate, MockReply};
use bindery_tests::scripts::count_then_answer;

const AUD: &str = "bindery-chat";

struct World {
    server: Server,
    issuer: TestIssuer,
    dir: tempfile::TempDir,
}

/// The metered agent with `spec` added, served to end users of a loopback
/// issuer, `cfg` and `rates` configuring the server.
async fn world(
    script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
    spec: &str,
    cfg: impl FnOnce(&mut ServiceConfig),
    rates: (Option<u32>, Option<u32>),
) -> World {
    let dir = tempfile::tempdir().unwrap();
    let agent = metered_agent(dir.path(), MODEL_URL, "", spec);
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::limited(&[agent], dir.path(), script, config, cfg, rates).await;
    World {
        server,
        issuer,
        dir,
    }
}

impl World {
    fn token(&self, sub: &str) -> String {
        self.issuer.token(sub, AUD, json!({}))
    }

    /// `method path` as `token`'s caller: the reply and its `Retry-After`.
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (Reply, Option<String>) {
        let a = self
            .server
            .api
            .call_with(method, path, Some(token), &[], body.as_ref())
            .await;
        (a.reply, a.retry_after)
    }

    /// A new session of the metered agent, of `token`'s caller.
    async fn session(&self, token: &str) -> String {
        let (r, _) = self
            .call(
                "POST",
                "/v1/sessions",
                token,
                Some(json!({"agent": "metered"})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        r.json["session_id"].as_str().unwrap().to_string()
    }

    /// `prompt` to session `id` as `token`'s caller, waited for.
    async fn message(&self, token: &str, id: &str, prompt: &str) -> (Reply, Option<String>) {
        self.call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            token,
            Some(json!({"prompt": prompt})),
        )
        .await
    }
}

#[tokio::test]
async fn a_per_user_budget_stops_the_user_who_used_it_up_and_no_one_else() {
    let w = world(
        count_then_answer(2),
        "  budgets:\n    - {name: mine, tokens: 100, per: 24h, perUser: true}\n",
        |_| {},
        (None, None),
    )
    .await;
    let (alice, bob) = (w.token("alice"), w.token("bob"));

    // The owner's sessions have no user: the budget does not count them,
    // and their run goes to its end (three requests, 180 tokens).
    let owners = w.session(OWNER).await;
    let (r, _) = w.message(OWNER, &owners, "count twice").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["usage"]["total_tokens"], 180, "{}", r.text);

    // Alice's run stops once her own 100 tokens are used (two requests).
    let hers = w.session(&alice).await;
    let (r, _) = w.message(&alice, &hers, "count twice").await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    let detail = r.json["status_detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "budget_exceeded: budget mine is used up for this user (it counts each end user apart): 120 of 100 tokens per 24h"
        ),
        "{detail}"
    );
    // Her next message, in any session of hers, is refused before it starts.
    let another = w.session(&alice).await;
    let requests = w.server.mock.requests().len();
    let (r, retry) = w.message(&alice, &another, "again").await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json["error"], "budget_exceeded");
    assert_eq!(r.json["budget"], "mine");
    assert_eq!(r.json["per_user"], true);
    assert_eq!(r.json["used"], 120.0);
    let secs = r.json["retry_after"].as_u64().unwrap();
    assert_eq!(retry, Some(secs.to_string()), "the header says the same");
    assert_eq!(w.server.mock.requests().len(), requests, "nothing ran");

    // Bob has his own window: his run goes.
    let his = w.session(&bob).await;
    let (r, _) = w.message(&bob, &his, "count twice").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["usage"]["total_tokens"], 120, "{}", r.text);
    // So does the owner's, still.
    let (r, _) = w.message(OWNER, &owners, "count twice").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);

    // The owner's report by user: the owner's sessions under null.
    let (r, _) = w.call("GET", "/v1/usage?group_by=user", OWNER, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rows: Vec<_> = r.json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row["key"].clone(), row["total_tokens"].clone()))
        .collect();
    assert_eq!(
        rows,
        [
            (Value::Null, json!(360)),
            (json!("alice"), json!(120)),
            (json!("bob"), json!(120)),
        ],
        "{}",
        r.text
    );
    let csv = w
        .server
        .api
        .call_with(
            "GET",
            "/v1/usage?group_by=user",
            Some(OWNER),
            &[("accept", "text/csv")],
            None,
        )
        .await
        .reply
        .text;
    let lines: Vec<_> = csv.lines().collect();
    assert!(lines[0].starts_with("user,prompt_tokens,"), "{csv}");
    assert!(lines[1].starts_with(",240,120,360,"), "{csv}");
    assert!(lines[2].starts_with("alice,80,40,120,"), "{csv}");
    // An end user cannot read the tenant's report.
    let (r, _) = w.call("GET", "/v1/usage?group_by=user", &alice, None).await;
    assert_eq!(r.status, 403, "{}", r.text);
}

#[tokio::test]
async fn a_users_run_past_the_cap_is_refused_until_one_of_theirs_ends() {
    let gate = Gate::new();
    let held = gate.clone();
    let w = world(
        move |_| MockReply::text("done").held(&held),
        "",
        |c| c.max_runs_per_user = Some(1),
        (None, None),
    )
    .await;
    let (alice, bob) = (w.token("alice"), w.token("bob"));
    let first = w.session(&alice).await;
    let second = w.session(&alice).await;
    // Her first run starts and waits for the model.
    let (r, _) = w
        .call(
            "POST",
            &format!("/v1/sessions/{first}/messages"),
            &alice,
            Some(json!({"prompt": "one"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    // A second at once, in her other session, is one too many.
    let (r, retry) = w.message(&alice, &second, "two").await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json["error"], "too_many_runs", "{}", r.text);
    assert_eq!(r.json["running"], 1);
    assert_eq!(r.json["max"], 1);
    assert_eq!(retry.as_deref(), Some("5"));
    assert_eq!(
        w.server.mock.requests().len(),
        1,
        "the refused run asked nothing"
    );
    // Bob, and the owner, are not Alice.
    let bobs = w.session(&bob).await;
    let (r, _) = w
        .call(
            "POST",
            &format!("/v1/sessions/{bobs}/messages"),
            &bob,
            Some(json!({"prompt": "mine"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    // Once her run ends, her next one goes.
    gate.open();
    let api = w.server.api.clone();
    eventually(
        "alice's first run ends",
        Duration::from_secs(10),
        async || {
            let r = api
                .call("GET", &format!("/v1/sessions/{first}"), Some(OWNER), None)
                .await;
            (r.json["status"] == "idle").then_some(())
        },
    )
    .await;
    let (r, _) = w.message(&alice, &second, "two").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
}

#[tokio::test]
async fn requests_over_the_servers_or_a_users_rate_are_refused_with_retry_after() {
    let w = world(count_then_answer(0), "", |_| {}, (None, Some(2))).await;
    let (alice, bob) = (w.token("alice"), w.token("bob"));
    for _ in 0..2 {
        let (r, _) = w.call("GET", "/v1/sessions", &alice, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let (r, retry) = w.call("GET", "/v1/sessions", &alice, None).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json["error"], "rate_limited");
    assert_eq!(r.json["scope"], "user");
    assert_eq!(retry.as_deref(), Some("30"), "one back every 30 s");
    // Bob and the owner have their own.
    let (r, _) = w.call("GET", "/v1/sessions", &bob, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for _ in 0..3 {
        let (r, _) = w.call("GET", "/v1/sessions", OWNER, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }

    // The server's own limit counts every caller together, and leaves
    // probes alone.
    let w = world(count_then_answer(0), "", |_| {}, (Some(3), None)).await;
    let alice = w.token("alice");
    for token in [OWNER, alice.as_str(), OWNER] {
        let (r, _) = w.call("GET", "/v1/sessions", token, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let (r, retry) = w.call("GET", "/v1/sessions", OWNER, None).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json["scope"], "tenant");
    assert_eq!(retry.as_deref(), Some("20"));
    let health = w.server.api.call("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200);
    let metrics = w.server.api.call("GET", "/metrics", None, None).await.text;
    for line in [
        r#"bindery_rate_limited_total{scope="tenant"} 1"#,
        r#"bindery_http_requests_total{route="/v1/sessions",status="429"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[tokio::test]
async fn a_tool_over_its_rate_is_not_run_and_the_model_is_told_why() {
    let w = world(
        count_then_answer(2),
        "",
        |c| c.tool_rates = vec!["bash_*=1/user".parse().unwrap()],
        (None, None),
    )
    .await;
    let alice = w.token("alice");
    let hers = w.session(&alice).await;
    let (r, _) = w.message(&alice, &hers, "count twice").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "the run goes on: {}", r.text);
    assert_eq!(counted(w.dir.path()), 1, "the second call never ran");
    let requests = w.server.mock.requests();
    let told = bindery_tests::mock_llm::tool_results(&requests[2]);
    assert!(
        told.iter().any(|t| t.contains(
            "tool bash_count is rate limited (1 calls per minute of `bash_*`, for each user), so this call did not run"
        )),
        "{told:?}"
    );
    // Bob's calls have their own bucket.
    let bob = w.token("bob");
    let his = w.session(&bob).await;
    w.message(&bob, &his, "count once").await;
    assert_eq!(counted(w.dir.path()), 2);
    let metrics = w.server.api.call("GET", "/metrics", None, None).await.text;
    let line = r#"bindery_rate_limited_total{scope="tool"} 2"#;
    assert!(metrics.contains(line), "{line} not in\n{metrics}");
}

/// A session token or a share link of a person's session counts against
/// that person's rate: handing the session on is no way around it.
#[tokio::test]
async fn a_persons_session_token_and_share_links_count_against_their_rate() {
    let w = world(count_then_answer(0), "", |_| {}, (None, Some(4))).await;
    let carol = w.token("carol");
    let (r, _) = w
        .call(
            "POST",
            "/v1/sessions",
            &carol,
            Some(json!({"agent": "metered", "session_token": true})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let token = r.json["session_token"].as_str().unwrap().to_string();
    let (r, _) = w
        .call(
            "POST",
            &format!("/v1/sessions/{id}/shares"),
            &carol,
            Some(json!({"mode": "write"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let share = r.json["token"].as_str().unwrap().to_string();
    let path = format!("/v1/sessions/{id}");
    for credential in [&token, &share] {
        let (r, _) = w.call("GET", &path, credential, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    for credential in [&token, &share, &carol] {
        let (r, _) = w.call("GET", &path, credential, None).await;
        assert_eq!(r.status, 429, "{}", r.text);
        assert_eq!(r.json["scope"], "user", "{}", r.text);
    }
    // The owner's own session's token is nobody's: not limited per user.
    let (r, _) = w
        .call(
            "POST",
            "/v1/sessions",
            OWNER,
            Some(json!({"agent": "metered", "session_token": true})),
        )
        .await;
    let (id, token) = (
        r.json["session_id"].as_str().unwrap().to_string(),
        r.json["session_token"].as_str().unwrap().to_string(),
    );
    for _ in 0..5 {
        let (r, _) = w
            .call("GET", &format!("/v1/sessions/{id}"), &token, None)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}
