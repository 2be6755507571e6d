//! End users through the binary, against the real identity provider
//! (Keycloak, `bindery_tests::idp`): its tokens taken, a forged or
//! foreign one refused, a rotated signing key followed, each person's
//! sessions their own, and a tool acting with the person's token
//! exchanged (RFC 8693) by Keycloak for the tool's audience.

use serde_json::{json, Value};

use crate::common::{serve, sqlite_in};
use bindery_tests::fixtures::bash_tool_with_args;
use bindery_tests::fixtures::session::OWNER;
use bindery_tests::idp::{Client, ClientAuth, Idp};
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};

const APP_REDIRECT: &str = "http://127.0.0.1:9/callback";

/// The model calls `whoami` as mallory, then repeats what it said.
fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    match last["role"].as_str() {
        Some("tool") => {
            MockReply::text(format!("said: {}", last["content"].as_str().unwrap_or("")))
        }
        _ => MockReply::tool_call("bash_whoami", json!({"user": "mallory", "token": "forged"})),
    }
}

fn tool_output(r: &bindery_tests::sidecar::Reply) -> String {
    bindery_tests::fixtures::session::last_tool_output(r)
}

#[tokio::test]
async fn people_of_the_real_identity_provider_use_their_own_sessions_and_their_own_rights() {
    let idp = Idp::shared();
    let realm = idp
        .realm("bindery-users")
        .user("alice", "alice-password")
        .user("bob", "bob-password")
        // The chat front end people sign in to; its tokens are for Bindery.
        .client(Client::public("chat", APP_REDIRECT).audience("bindery"))
        // Bindery exchanges them for the billing API's audience.
        .client(
            Client::confidential("bindery", ClientAuth::SecretBasic)
                .token_exchange()
                .audience("billing"),
        )
        .client(Client::confidential("billing", ClientAuth::SecretBasic))
        .create()
        .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let mock = MockLlm::start(script).await;
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    // It prints who it acts for and whom the token it got is for (the
    // token's `aud` and `sub`), never the token.
    bash_tool_with_args(
        &tools,
        "whoami",
        "Says who the call acts for.",
        r#"[
    {"name": "user", "description": "who", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"},
    {"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "single", "mode": "env"}]"#,
        r#"claims=$(printf %s "${TOKEN:-}" | cut -d. -f2 | tr '_-' '/+')
while (( ${#claims} % 4 )); do claims="$claims="; done
payload=$(printf %s "$claims" | base64 -d 2>/dev/null)
aud=$(printf %s "$payload" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("aud"))' 2>/dev/null || echo none)
sub=$(printf %s "$payload" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sub"))' 2>/dev/null || echo none)
printf 'user=%s aud=%s token-sub=%s\n' "$3" "$aud" "$sub""#,
    );
    let agent = dir.path().join("whoami.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: whoami}}
spec:
  model: {{url: "{}", name: mock-model}}
  toolboxes:
    - bash:
        directory: "{}"
        bindings:
          - {{arg: user, value: {{identity: subject}}}}
          - {{arg: token, value: {{identity: "token:billing"}}}}
"#,
            mock.url(),
            tools.display()
        ),
    )
    .unwrap();
    let secret_file = dir.path().join("exchange-secret");
    std::fs::write(
        &secret_file,
        realm
            .credentials("bindery")
            .secret()
            .expect("a client secret"),
    )
    .unwrap();
    let issuer = realm.issuer();
    let (_server, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[
            "--identity-issuer",
            &issuer,
            "--identity-audience",
            "bindery",
            "--identity-exchange-client-id",
            "bindery",
            "--identity-exchange-secret-file",
            &secret_file.display().to_string(),
        ],
        &[],
        dir.path(),
    );
    let alice = realm.user_token("alice", "chat", &[]).await;
    let bob = realm.user_token("bob", "chat", &[]).await;
    let alice_sub = alice.claims()["sub"].as_str().unwrap().to_string();

    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(&alice.access_token),
            Some(&json!({"agent": "whoami", "prompt": "who am I?"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["subject"], alice_sub.as_str());
    assert_eq!(
        tool_output(&r).trim(),
        format!("user={alice_sub} aud=billing token-sub={alice_sub}"),
        "the tool got Alice's own token, exchanged by Keycloak for the billing API: {}",
        r.text
    );
    let mine = r.json["session_id"].as_str().unwrap().to_string();

    // Bob sees none of it.
    let r = api
        .call("GET", "/v1/sessions", Some(&bob.access_token), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["sessions"], json!([]), "{}", r.text);
    let r = api
        .call(
            "GET",
            &format!("/v1/sessions/{mine}"),
            Some(&bob.access_token),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = api
        .call("GET", &format!("/v1/sessions/{mine}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "the owner sees all: {}", r.text);

    // A token for another audience (the exchanged one) is not a key here.
    let exchanged = realm
        .exchange(
            &realm.credentials("bindery"),
            &alice.access_token,
            "billing",
            &[],
        )
        .await
        .unwrap();
    let r = api
        .call("GET", "/v1/sessions", Some(&exchanged.access_token), None)
        .await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert!(r.text.contains("another audience"), "{}", r.text);

    // A rotated signing key: new tokens carry its id, and are taken.
    realm.rotate_signing_key().await;
    let rotated = realm.user_token("alice", "chat", &[]).await;
    let r = api
        .call("GET", "/v1/sessions", Some(&rotated.access_token), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["sessions"][0]["session_id"], mine.as_str());
}
