//! Session pins over the API: a value fixed when the session is made
//! (`pin` on creation or fork) that no later request gives again — not a
//! message, a resume, a PUT, a continuation, not even the owner's — kept
//! across a restart, changed only by a fork with a new pin. The real
//! binary over TCP, an SQLite store on disk.

use crate::common::*;
use bindery_tests::sidecar::{Api, Reply};
use serde_json::{json, Value};

async fn post(api: &Api, path: &str, body: Value) -> Reply {
    api.call("POST", path, Some(OWNER), Some(&body)).await
}

async fn put_params(api: &Api, id: &str, params: Value) -> Reply {
    api.call(
        "PUT",
        &format!("/v1/sessions/{id}/params"),
        Some(OWNER),
        Some(&json!({ "params": params })),
    )
    .await
}

async fn view(api: &Api, id: &str) -> Reply {
    api.call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await
}

/// A pinned refusal: 403 `forbidden_params` naming `name`, saying it is
/// pinned for the session and that a fork changes it.
fn pinned_refusal(r: &Reply, name: &str) {
    assert_eq!(
        error_of(r),
        refusal(403, "forbidden_params", &[name]),
        "{}",
        r.text
    );
    let m = r.json["message"].as_str().unwrap();
    assert!(
        m.contains("pinned for this session") && m.contains("fork"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_value_is_refused_to_every_later_request_and_survives_a_restart() {
    pins_hold(&World::new(tool_then_answer).await, &[], || true).await;
}

/// The same on a PostgreSQL store. The killed server held the session's
/// secret value: until its lease passes the store takes it for alive, and
/// a request about the session carrying a secret value would be sent to it
/// (refused here without peer TLS), so the test lets the lease pass.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_survives_a_restart_on_postgres_too() {
    let pg = bindery_tests::postgres::Postgres::start();
    pg.create_database("pins");
    let mut w = World::new(tool_then_answer).await;
    w.store = pg.url("pins");
    let quick = ["--runner-heartbeat", "200ms", "--runner-lease", "1s"];
    pins_hold(&w, &quick, || {
        pg.sql("pins", "SELECT count(*) FROM bindery_runners")
            .trim()
            == "1"
    })
    .await;
}

/// `extra`: the servers' flags; `alone`: whether the restarted server is
/// the only one the store takes for alive.
async fn pins_hold(w: &World, extra: &[&str], alone: impl Fn() -> bool) {
    let (mut sidecar, api) = w.start(extra, &[]);
    let created = post(
        &api,
        "/v1/sessions",
        json!({"agent": "invoices", "pin": {"tenant": "acme-corp"},
               "params": {"billing_token": CANARY}, "session_token": true}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let st = created.json["session_token"].as_str().unwrap().to_string();
    assert_eq!(created.json["pinned"], json!(["tenant"]));
    assert_eq!(created.json["params"]["tenant"], "acme-corp");

    // The owner's message, resume and PUT may not give it, nor remove it.
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/messages"),
        json!({"prompt": "overdue?", "params": {"tenant": "globex"}}),
    )
    .await;
    pinned_refusal(&r, "tenant");
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/resume"),
        json!({"params": {"tenant": "globex"}}),
    )
    .await;
    pinned_refusal(&r, "tenant");
    pinned_refusal(
        &put_params(&api, &id, json!({"tenant": "globex"})).await,
        "tenant",
    );
    pinned_refusal(
        &put_params(&api, &id, json!({"tenant": null})).await,
        "tenant",
    );
    // A session-token holder is refused too (it sets no value at all).
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(&st),
            Some(&json!({"prompt": "hi", "params": {"tenant": "globex"}})),
        )
        .await;
    assert_eq!(error_of(&r).1, "forbidden_params", "{}", r.text);
    // Nothing changed; the run uses the pinned value.
    let done = message_waited(&api, &id, "overdue?").await;
    assert_eq!(done.json["params"]["tenant"], "acme-corp");

    // A restart: the pin is still there, and still refuses.
    sidecar.kill();
    let (_sidecar, api) = w.start(extra, &[]);
    until("the killed server's lease passes", PATIENCE, &alone).await;
    let v = view(&api, &id).await;
    assert_eq!(v.json["pinned"], json!(["tenant"]), "{}", v.text);
    pinned_refusal(
        &put_params(&api, &id, json!({"tenant": "globex"})).await,
        "tenant",
    );

    // A fork keeps the pin; its `params` may not change it, its `pin` may.
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/fork"),
        json!({"params": {"tenant": "globex", "billing_token": "t2"}}),
    )
    .await;
    pinned_refusal(&r, "tenant");
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/fork"),
        json!({"params": {"billing_token": "t2"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["pinned"], json!(["tenant"]));
    assert_eq!(r.json["params"]["tenant"], "acme-corp");
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/fork"),
        json!({"pin": {"tenant": "globex"}, "params": {"billing_token": "t2"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["pinned"], json!(["tenant"]));
    assert_eq!(r.json["params"]["tenant"], "globex");
    // `null` in a fork's pin drops the pin and its value (a required
    // one must then be given)…
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/fork"),
        json!({"pin": {"tenant": null}, "params": {"billing_token": "t2"}}),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "params_required", &["tenant"]),
        "{}",
        r.text
    );
    // …and `params` may give it a plain value that later requests change.
    let r = post(
        &api,
        &format!("/v1/sessions/{id}/fork"),
        json!({"pin": {"tenant": null}, "params": {"tenant": "initech", "billing_token": "t2"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["pinned"], json!([]));
    assert_eq!(r.json["params"]["tenant"], "initech");
    let unpinned = r.json["session_id"].as_str().unwrap().to_string();
    let r = put_params(&api, &unpinned, json!({"tenant": "globex"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The source is as it was.
    let v = view(&api, &id).await;
    assert_eq!(v.json["params"]["tenant"], "acme-corp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_secret_is_never_stored_and_only_its_owner_gives_it_again_after_a_restart() {
    let w = World::new(tool_then_answer).await;
    let (mut sidecar, api) = w.start(&[], &[]);
    let created = post(
        &api,
        "/v1/sessions",
        json!({"agent": "invoices", "params": {"tenant": "acme-corp"},
               "pin": {"billing_token": CANARY}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    assert_eq!(created.json["pinned"], json!(["billing_token"]));
    assert_eq!(created.json["secret_params"], json!(["billing_token"]));
    assert!(!created.text.contains(CANARY), "{}", created.text);
    pinned_refusal(
        &put_params(&api, &id, json!({"billing_token": "other"})).await,
        "billing_token",
    );
    message_waited(&api, &id, "overdue?").await;
    sidecar.kill();
    let stored = raw_files(&w.dir.path().join("store"), "bindery.sqlite");
    assert!(!stored.is_empty());
    assert!(!contains(&stored, CANARY), "a pinned secret was stored");

    // After a restart the secret is gone, the pin is not: the owner gives
    // the value again once, then it is pinned as before.
    let (_sidecar, api) = w.start(&[], &[]);
    let v = view(&api, &id).await;
    assert_eq!(v.json["pinned"], json!(["billing_token"]));
    assert_eq!(v.json["secret_params"], json!([]));
    let r = put_params(&api, &id, json!({"billing_token": CANARY})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    pinned_refusal(
        &put_params(&api, &id, json!({"billing_token": "other"})).await,
        "billing_token",
    );
    message_waited(&api, &id, "overdue?").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_pinned_is_refused_and_the_document_shows_pins() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--pin", "region=us"], &[]);
    let base =
        |pin: Value, params: Value| json!({"agent": "invoices", "pin": pin, "params": params});
    let full = json!({"tenant": "a", "billing_token": "t"});
    // A message-scope value lasts one run: it cannot be pinned.
    let r = post(
        &api,
        "/v1/sessions",
        base(json!({"otp": "1"}), full.clone()),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "invalid_params", &["otp"]),
        "{}",
        r.text
    );
    // One name in both.
    let r = post(
        &api,
        "/v1/sessions",
        base(json!({"tenant": "b"}), full.clone()),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "invalid_params", &["tenant"]),
        "{}",
        r.text
    );
    // A process-scope or operator-pinned name, an unknown one.
    let r = post(
        &api,
        "/v1/sessions",
        base(json!({"region": "eu"}), full.clone()),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["region"]),
        "{}",
        r.text
    );
    let r = post(
        &api,
        "/v1/sessions",
        base(json!({"nope": "x"}), full.clone()),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "unknown_params", &["nope"]),
        "{}",
        r.text
    );

    let doc = api.call("GET", "/openapi.json", None, None).await.json;
    let schemas = &doc["components"]["schemas"];
    for s in ["CreateSessionRequest", "ForkRequest"] {
        assert!(
            schemas[s]["properties"]["pin"].is_object(),
            "{s}: {}",
            schemas[s]
        );
    }
    assert!(
        schemas["SessionView"]["properties"]["pinned"].is_object(),
        "{}",
        schemas["SessionView"]
    );
}
