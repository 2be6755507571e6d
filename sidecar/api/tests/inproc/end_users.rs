//! End users on the session API: identity tokens of the platform's issuer
//! (a loopback issuer here; the real one, Keycloak, in the sidecar's
//! spawned tests), each person using their own sessions only, the owner
//! all of them.

use serde_json::{json, Value};

use crate::harness::*;
use bindery_identity::testkeys::{TestIssuer, TestKey};
use bindery_identity::IdentityConfig;
use bindery_tests::fixtures::clerk;

const AUD: &str = "bindery-chat";

struct World {
    api: Api,
    issuer: TestIssuer,
    dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::identified(&[agent], dir.path(), clerk::script, config).await;
    World {
        api: server.api.clone(),
        issuer,
        dir,
    }
}

impl World {
    fn token(&self, sub: &str) -> String {
        self.issuer.token(sub, AUD, json!({}))
    }

    async fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Reply {
        self.api
            .call(method, path, Some(token), body.as_ref())
            .await
    }

    /// A clerk session of `token`'s person, run until it waits.
    async fn waiting(&self, token: &str) -> String {
        let r = self
            .call(
                "POST",
                "/v1/sessions?wait=true",
                token,
                Some(json!({"agent": "clerk", "prompt": "delete", "params": {"tenant": "acme"}})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
        r.json["session_id"].as_str().unwrap().to_string()
    }
}

fn ids(r: &Reply) -> Vec<String> {
    r.json["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", r.text))
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn an_end_user_uses_their_own_sessions_and_no_one_elses() {
    let w = world().await;
    let (alice, bob) = (w.token("alice"), w.token("bob"));
    let mine = w.waiting(&alice).await;
    let r = w
        .call("GET", &format!("/v1/sessions/{mine}"), &alice, None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["subject"], "alice", "{}", r.text);
    // A `confirm` approval is not the end user's: no token shown to them.
    assert!(
        r.json["pending"][0]["continuation_token"].is_null(),
        "{}",
        r.text
    );
    let theirs = w.waiting(&bob).await;

    // Each lists their own; the owner lists both.
    let r = w.call("GET", "/v1/sessions", &alice, None).await;
    assert_eq!(ids(&r), std::slice::from_ref(&mine));
    let r = w.call("GET", "/v1/sessions", &bob, None).await;
    assert_eq!(ids(&r), std::slice::from_ref(&theirs));
    let mut all = ids(&w.call("GET", "/v1/sessions", OWNER, None).await);
    all.sort();
    let mut both = vec![mine.clone(), theirs.clone()];
    both.sort();
    assert_eq!(all, both);

    // Every route about Bob's session answers Alice as if it did not exist.
    let absent = w.call("GET", "/v1/sessions/no-such-id", &alice, None).await;
    assert_eq!(absent.status, 404, "{}", absent.text);
    for (method, path, body) in [
        ("GET", "", None),
        ("POST", "/messages", Some(json!({"prompt": "hi"}))),
        ("POST", "/cancel", None),
        ("POST", "/resume", Some(json!({}))),
        ("POST", "/fork", Some(json!({}))),
        (
            "PUT",
            "/params",
            Some(json!({"params": {"tenant": "evil"}})),
        ),
        ("DELETE", "/token", None),
        ("GET", "/events", None),
    ] {
        let r = w
            .call(
                method,
                &format!("/v1/sessions/{theirs}{path}"),
                &alice,
                body,
            )
            .await;
        assert_eq!(
            (r.status, r.json["error"].clone()),
            (404, json!("not_found")),
            "{method} {path}: {}",
            r.text
        );
        assert_eq!(
            r.json["message"],
            format!("no session {theirs}"),
            "{}",
            r.text
        );
    }
    // Nor through a fork named in a creation.
    let r = w
        .call(
            "POST",
            "/v1/sessions",
            &alice,
            Some(json!({"fork": theirs, "params": {"tenant": "acme"}})),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    // Nor by the continuation of Bob's pending item (the owner's view
    // shows it).
    let owner_view = w
        .call("GET", &format!("/v1/sessions/{theirs}"), OWNER, None)
        .await;
    let ct = owner_view.json["pending"][0]["continuation_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = w
        .call(
            "POST",
            &format!("/v1/continuations/{ct}"),
            &alice,
            Some(json!({"approve": true})),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    // Nor can Bob approve his own session's `confirm`: that is an approval.
    let r = w
        .call(
            "POST",
            &format!("/v1/continuations/{ct}"),
            &bob,
            Some(json!({"approve": true})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (403, json!("forbidden")),
        "{}",
        r.text
    );
    assert_eq!(clerk::runs(w.dir.path()), 0, "nothing was deleted");

    // Alice forks her own session; the fork is hers.
    let r = w
        .call(
            "POST",
            &format!("/v1/sessions/{mine}/fork"),
            &alice,
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["subject"], "alice");
    let fork = r.json["session_id"].as_str().unwrap().to_string();
    let r = w
        .call("GET", &format!("/v1/sessions/{fork}"), &bob, None)
        .await;
    assert_eq!(r.status, 404);
    // And cancels her own waiting run.
    let r = w
        .call("POST", &format!("/v1/sessions/{mine}/cancel"), &alice, None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn an_end_user_is_refused_the_owners_routes() {
    let w = world().await;
    let alice = w.token("alice");
    for (method, path) in [
        ("GET", "/v1/usage"),
        ("GET", "/v1/approvals"),
        ("PUT", "/v1/agents/mine"),
        ("DELETE", "/v1/agents/clerk"),
    ] {
        let r = w.call(method, path, &alice, None).await;
        assert_eq!(
            (r.status, r.json["error"].clone()),
            (403, json!("forbidden")),
            "{method} {path}: {}",
            r.text
        );
    }
    // The agents they may start, yes.
    let r = w.call("GET", "/v1/agents", &alice, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn a_token_that_does_not_hold_is_refused_with_its_reason() {
    let w = world().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |over: Value| {
        let mut c = json!({"iss": w.issuer.url, "aud": AUD, "sub": "alice",
                           "iat": now, "exp": now + 300});
        c.as_object_mut()
            .unwrap()
            .extend(over.as_object().unwrap().clone());
        c
    };
    let forger = TestKey::new(&w.issuer.key.kid);
    for (token, why) in [
        (
            w.issuer.key.sign(&claims(json!({"exp": now - 3600}))),
            "expired",
        ),
        (
            w.issuer.key.sign(&claims(json!({"aud": "another-app"}))),
            "another audience",
        ),
        (
            w.issuer
                .key
                .sign(&claims(json!({"iss": "https://evil.example"}))),
            "another issuer",
        ),
        (forger.sign(&claims(json!({}))), "signature does not verify"),
        (
            w.issuer.key.sign_as("unknown-kid", &claims(json!({}))),
            "does not publish",
        ),
    ] {
        let r = w.call("GET", "/v1/sessions", &token, None).await;
        assert_eq!(r.status, 401, "{why}: {}", r.text);
        assert!(
            r.json["message"].as_str().unwrap().contains(why),
            "{why}: {}",
            r.text
        );
        assert!(!r.text.contains(&token[..30]), "the token is not repeated");
    }
}

#[tokio::test]
async fn without_an_issuer_an_identity_token_is_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let server = Server::start(&[agent], dir.path(), clerk::script).await;
    let issuer = TestIssuer::start().await;
    let r = server
        .api
        .call(
            "GET",
            "/v1/sessions",
            Some(&issuer.token("alice", AUD, json!({}))),
            None,
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text);
}

/// An agent whose tool `whoami` prints who it acts for: `user` and
/// `email` bound to the end user's subject and claim, `token` (in its
/// environment) to their token exchanged for audience `billing`.
fn whoami_agent(dir: &std::path::Path) -> std::path::PathBuf {
    let tools = dir.join("whoami-tools");
    std::fs::create_dir_all(&tools).unwrap();
    bindery_tests::fixtures::bash_tool_with_args(
        &tools,
        "whoami",
        "Says who the call acts for.",
        r#"[
    {"name": "user", "description": "who", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"},
    {"name": "email", "description": "mail", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"},
    {"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "single", "mode": "env"}]"#,
        r#"printf 'user=%s email=%s token=%s\n' "$3" "$5" "${TOKEN:-none}""#,
    );
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: whoami
spec:
  model: {{url: "{MODEL_URL}", name: mock-model}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: user, value: {{identity: subject}}}}
          - {{arg: email, value: {{identity: "claim:email"}}}}
          - {{arg: token, value: {{identity: "token:billing"}}}}
"#,
        tools = tools.display()
    );
    let agent = dir.join("whoami.yaml");
    std::fs::write(&agent, text).unwrap();
    agent
}

/// The model calls `whoami` claiming to be mallory, then answers with
/// what the tool said.
fn whoami_script(req: &Value) -> bindery_tests::mock_llm::MockReply {
    use bindery_tests::mock_llm::{last_message, MockReply};
    let last = last_message(req);
    match last["role"].as_str() {
        Some("tool") => {
            MockReply::text(format!("said: {}", last["content"].as_str().unwrap_or("")))
        }
        _ => MockReply::tool_call(
            "bash_whoami",
            json!({"user": "mallory", "email": "mallory@evil.example", "token": "forged"}),
        ),
    }
}

#[tokio::test]
async fn a_tool_acts_with_the_end_users_own_identity_and_the_model_cannot_change_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = whoami_agent(dir.path());
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::identified(&[agent], dir.path(), whoami_script, config).await;
    let alice = issuer.token("alice", AUD, json!({"email": "alice@example.com"}));
    let r = server
        .api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(&alice),
            Some(&json!({"agent": "whoami", "prompt": "who am I?"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let out = last_tool_output(&r);
    assert_eq!(
        out.trim(),
        "user=alice email=alice@example.com token=<secret:@identity:token:billing>",
        "the bound values won; the exchanged token reached the tool and was scrubbed from what the model reads: {}",
        r.text
    );
    // The model never sees the bound arguments in the tool's schema.
    let tools = server.mock.requests()[0]["tools"].to_string();
    assert!(
        !tools.contains("\"user\"") && !tools.contains("\"token\""),
        "{tools}"
    );
    // The owner's session has no end user: the call fails, saying why.
    let r = server
        .api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "whoami", "prompt": "who am I?"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert!(!last_tool_output(&r).contains("user="), "{}", r.text);
}

/// A run that outlives the person's identity token uses what it was
/// exchanged for no more: the run starts while the token holds (the
/// exchange is made), the model's answer comes after it expired, and the
/// call it asks for gets no token (its binding fails as unbound).
#[tokio::test]
async fn a_run_that_outlives_the_persons_token_uses_their_exchanged_token_no_more() {
    use bindery_tests::mock_llm::Gate;
    let dir = tempfile::tempdir().unwrap();
    let agent = whoami_agent(dir.path());
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let gate = Gate::new();
    let held = gate.clone();
    let script = move |req: &Value| {
        let reply = whoami_script(req);
        match last_message_role(req) {
            Some("tool") => reply,
            _ => reply.held(&held),
        }
    };
    let server = Server::identified(&[agent], dir.path(), script, config).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = now + 2;
    let alice = issuer.key.sign(&json!({
        "iss": issuer.url, "sub": "alice", "aud": AUD, "iat": now, "exp": exp,
        "email": "alice@example.com",
    }));
    let api = server.api.clone();
    let asked = tokio::spawn(async move {
        api.call(
            "POST",
            "/v1/sessions?wait=true",
            Some(&alice),
            Some(&json!({"agent": "whoami", "prompt": "who am I?"})),
        )
        .await
    });
    // The run started (its model request waits); let the token expire.
    bindery_tests::eventually::until(
        "the model is asked",
        std::time::Duration::from_secs(30),
        || server.mock.request_count() > 0,
    )
    .await;
    bindery_tests::eventually::until(
        "the person's token has expired",
        std::time::Duration::from_secs(30),
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                > exp
        },
    )
    .await;
    gate.open();
    let r = asked.await.unwrap();
    assert_eq!(r.status, 201, "{}", r.text);
    let out = last_tool_output(&r);
    assert!(!out.contains("token=<secret"), "{out}");
    assert!(!out.contains("user=alice"), "the call did not run: {out}");
}

fn last_message_role(req: &Value) -> Option<&str> {
    bindery_tests::mock_llm::last_message(req)["role"].as_str()
}

/// The booking example (`depends_on`: a selection, then a confirmation of
/// the write) on a server that takes the test issuer's tokens.
async fn booking_world(
    slots: Value,
) -> (
    tempfile::TempDir,
    bindery_tests::fixtures::booking::BookingFiles,
    Server,
    TestIssuer,
) {
    use bindery_tests::fixtures::booking::{self, BookingFiles};
    let dir = tempfile::tempdir().unwrap();
    let files = BookingFiles::write(dir.path(), MODEL_URL, slots, |t| t);
    let store = format!("booking_store={}", files.store.display());
    let load = process_values(&[("--set", &store)], &[("BINDERY_PARAM_API_KEY", CANARY)]);
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::identified_with(
        std::slice::from_ref(&files.agent),
        dir.path(),
        booking::script,
        load,
        config,
    )
    .await;
    (dir, files, server, issuer)
}

/// The choices of their conversation are the person's; the confirmation
/// of the write is an approval, even for a tool with lookups (the
/// attacker's review: it was answered by the end user); and a
/// continuation token is no answer link on an agent with no webhook (the
/// review: a selection's token answered through the link route, whose
/// answer handed out the other items' tokens).
#[tokio::test]
async fn an_end_user_picks_their_options_but_never_confirms_a_write_nor_answers_through_a_link() {
    use bindery_tests::fixtures::booking::{two_slots, DAY};
    let (_dir, files, server, issuer) = booking_world(two_slots()).await;
    let api = &server.api;
    let alice = issuer.token("alice", AUD, json!({}));
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(&alice),
            Some(&json!({"agent": "booking",
                         "prompt": format!("book {}", json!({"date": DAY, "service": "Haircut"}))})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let selection = bindery_tests::fixtures::session::pending(&r, "needs_selection").clone();
    let token = selection["continuation_token"]
        .as_str()
        .expect("hers to answer")
        .to_string();
    // Not through the link route: that is a notice's, and there is none.
    let link = api
        .call(
            "POST",
            &format!("/v1/approvals/{token}"),
            None,
            Some(&json!({"choice": selection["options"][0]["id"]})),
        )
        .await;
    assert_eq!(link.status, 404, "{}", link.text);
    assert!(!link.text.contains("ct_"), "{}", link.text);
    // Through the continuation route, as herself: yes.
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{token}?wait=true"),
            Some(&alice),
            Some(&json!({"choice": selection["options"][0]["id"]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let confirm = bindery_tests::fixtures::session::pending(&r, "needs_confirmation");
    assert!(
        confirm["continuation_token"].is_null(),
        "not hers: {}",
        r.text
    );
    let owner_view = api
        .call(
            "GET",
            &format!("/v1/sessions/{}", r.json["session_id"].as_str().unwrap()),
            Some(OWNER),
            None,
        )
        .await;
    let ct = bindery_tests::fixtures::session::pending(&owner_view, "needs_confirmation")
        ["continuation_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{ct}"),
            Some(&alice),
            Some(&json!({"approve": true})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (403, json!("forbidden")),
        "{}",
        r.text
    );
    let r = api
        .call(
            "POST",
            &format!("/v1/approvals/{ct}"),
            None,
            Some(&json!({"approve": true})),
        )
        .await;
    assert_eq!(r.status, 404, "no webhook, no link: {}", r.text);
    assert!(files.bookings().is_empty(), "nothing was booked");
}

/// A run someone else starts in a person's session (the owner's message)
/// acts with no person's rights: the attacker's review had the owner's
/// message reuse the person's exchanged token.
#[tokio::test]
async fn a_run_the_owner_starts_in_a_persons_session_acts_with_no_persons_rights() {
    let dir = tempfile::tempdir().unwrap();
    let agent = whoami_agent(dir.path());
    let issuer = TestIssuer::start().await;
    let config = IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let server = Server::identified(&[agent], dir.path(), whoami_script, config).await;
    let alice = issuer.token("alice", AUD, json!({"email": "alice@example.com"}));
    let r = server
        .api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(&alice),
            Some(&json!({"agent": "whoami", "prompt": "who am I?"})),
        )
        .await;
    assert!(last_tool_output(&r).contains("user=alice"), "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let r = server
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "again"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(!last_tool_output(&r).contains("user=alice"), "{}", r.text);
    // Her own next message brings her rights back.
    let r = server
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(&alice),
            Some(&json!({"prompt": "and again"})),
        )
        .await;
    assert!(last_tool_output(&r).contains("user=alice"), "{}", r.text);
}
