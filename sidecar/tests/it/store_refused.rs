//! A `--store` the server cannot work with is refused at start, saying
//! what to fix and never showing the password: a PostgreSQL database that
//! does not answer, an `sslmode` it does not support, a shared database
//! without one owner token, a scheme it does not know. No database runs.

use std::process::{Command, Stdio};

use crate::common::*;

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
