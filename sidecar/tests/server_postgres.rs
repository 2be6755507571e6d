//! The real server on a shared PostgreSQL store (`--store postgres://…`):
//! sessions survive a restart, two servers on one database see each
//! other's sessions, and neither a secret value nor the database password
//! ends up where it must not.

mod common;

use std::process::{Command, Stdio};

use bindery_tests::postgres::Postgres;
use common::*;
use serde_json::json;

const DB: &str = "tenant_acme";

fn session_id(r: &bindery_tests::sidecar::Reply) -> String {
    r.json["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.text))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_sharing_a_database_share_sessions_across_restarts() {
    let pg = Postgres::start();
    pg.create_database(DB);
    let url = pg.url(DB);
    let mut w = World::new(tool_then_answer).await;
    w.store = url.clone();

    // One server takes the URL as --store, the other from BINDERY_STORE.
    let (mut a, api_a) = w.start(&[], &[]);
    let r = api_a
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({
                "agent": "invoices", "prompt": "overdue?",
                "params": {"tenant": "globex", "billing_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let first = session_id(&r);
    assert_eq!(r.json["session"]["turns"].as_array().unwrap().len(), 4);

    let mut args = vec!["--agent-file".to_string(), w.agent.display().to_string()];
    args.extend(["--store-connect-timeout".to_string(), "5".to_string()]);
    let b = bindery_tests::sidecar::Sidecar::start(bindery_tests::sidecar::Launch {
        bin: bin(),
        args,
        env: vec![("BINDERY_STORE".into(), url.clone())],
        log_dir: &w.dir.path().join("logs"),
        owner_token: OWNER,
    });
    let api_b = bindery_tests::sidecar::Api::new(&b.url);
    let r = api_b
        .call("GET", &format!("/v1/sessions/{first}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["params"], json!({"tenant": "globex"}));
    assert_eq!(r.json["session"]["turns"].as_array().unwrap().len(), 4);
    let r = create(
        &api_b,
        json!({"agent": "invoices", "params": valid_params()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let second = session_id(&r);
    let listed = api_a.call("GET", "/v1/sessions", Some(OWNER), None).await;
    assert!(
        listed.text.contains(&first) && listed.text.contains(&second),
        "{}",
        listed.text
    );

    // A restart (a crash, even) loses nothing stored.
    a.kill();
    let (a, api_a) = w.start(&[], &[]);
    let r = api_a
        .call("GET", &format!("/v1/sessions/{second}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{second}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "and now?"})),
        )
        .await;
    // The secret went with the server that had it in memory.
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json["params"], json!(["billing_token"]));

    // A server starting on a shared store leaves running sessions alone:
    // their runs may be going on in another server.
    pg.sql(
        DB,
        &format!("UPDATE bindery_sessions SET status = 'running' WHERE id = '{first}'"),
    );
    let (c, api_c) = w.start(&[], &[]);
    let r = api_c
        .call("GET", &format!("/v1/sessions/{first}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["status"], "running", "{}", r.text);
    drop(c);

    // What the database holds: the plain values, never the secret.
    let dump = pg.dump(DB);
    assert!(dump.contains("globex"), "the dump shows the sessions");
    assert!(
        !dump.contains(CANARY),
        "a secret value reached the database"
    );
    for s in [&a, &b] {
        let logs = s.logs();
        assert!(
            logs.contains(&format!("127.0.0.1:{}/{DB}", pg.port)),
            "{logs}"
        );
        assert!(
            !logs.contains(Postgres::PASSWORD),
            "the password is in a log:\n{logs}"
        );
        assert!(!logs.contains(CANARY), "{logs}");
    }
}

/// `serve` on `store`, which must fail: what it printed (never the password).
fn serve_fails(w: &World, store: &str, extra: &[&str], owner_token: bool) -> String {
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--agent-file"])
        .arg(&w.agent)
        .args(extra)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BINDERY_STORE", store)
        .current_dir(w.dir.path())
        .stdin(Stdio::null());
    if owner_token {
        cmd.env("BINDERY_OWNER_TOKEN", OWNER);
    }
    let out = cmd.output().expect("bindery-sidecar runs");
    assert!(!out.status.success(), "serve should have failed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("pw-0b7d2"), "the password is shown:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_work_is_refused_with_what_to_fix() {
    let w = World::new(tool_then_answer).await;
    // A port nothing listens on: taken and let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://bindery:pw-0b7d2@127.0.0.1:{port}/sessions");

    let err = serve_fails(&w, &url, &["--store-connect-timeout", "0"], true);
    assert!(
        err.contains(&format!(
            "cannot connect to the session store postgres://bindery@127.0.0.1:{port}/sessions"
        )),
        "{err}"
    );

    let err = serve_fails(&w, &format!("{url}?sslmode=verify-ca"), &[], true);
    assert!(err.contains("sslmode=verify-ca is not supported"), "{err}");

    let err = serve_fails(&w, &url, &[], false);
    assert!(
        err.contains("give them one owner token with --owner-token-file or BINDERY_OWNER_TOKEN"),
        "{err}"
    );
    assert!(
        !w.dir.path().join("data").exists(),
        "nothing written locally"
    );

    let err = serve_fails(&w, "mysql://bindery:pw-0b7d2@db/x", &[], true);
    assert!(err.contains("unknown scheme `mysql`"), "{err}");
}
