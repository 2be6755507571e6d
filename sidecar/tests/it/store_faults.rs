//! A store the server cannot trust is not served, through the binary: a
//! second server on one SQLite file, by any name of it, refuses to start
//! and names the first;
//! a file with damaged pages is refused at start; a store that does not
//! answer (its write lock held by another process past the server's wait)
//! makes requests answer 503 with `Retry-After` and `/readyz` 503 at once,
//! never 500, until writes go through again (a read going through does
//! not make it ready), and both recover with the store.

use std::io::{Seek, SeekFrom, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use bindery_tests::eventually::eventually;
use serde_json::json;

use crate::common::*;

fn store_path(w: &World) -> std::path::PathBuf {
    std::path::PathBuf::from(w.store.strip_prefix("sqlite://").unwrap())
}

/// `serve` on the world's store, which must fail: what it printed.
fn serve_fails(w: &World) -> String {
    serve_fails_on(w, &w.store)
}

/// `serve` on `store`, which must fail: what it printed. One that starts
/// instead is stopped, and the test fails.
fn serve_fails_on(w: &World, store: &str) -> String {
    let log = w.dir.path().join("refused.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--agent-file"])
        .arg(&w.agent)
        .args(["--store", store])
        .env("BINDERY_OWNER_TOKEN", OWNER)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("bindery-sidecar runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let printed = std::fs::read_to_string(&log).unwrap();
    match status {
        Some(status) => assert!(!status.success(), "serve should have failed: {printed}"),
        None => panic!("serve on {store} started, and should have been refused: {printed}"),
    }
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_refuses_to_start_naming_the_first() {
    let w = World::new(tool_then_answer).await;
    let (first, api) = w.start(&[], &[]);
    let err = serve_fails(&w);
    assert!(
        err.contains(&format!("in use by Bindery server pid {} on ", first.pid())),
        "{err}"
    );
    assert!(err.contains("one SQLite file serves one server"), "{err}");
    // The same file by another name: a hard link (SQLite would give it a
    // write-ahead log of its own) or a symbolic link. No note of the
    // holder lies beside those names: the kernel's list of locks names it.
    let path = store_path(&w);
    let hard = w.dir.path().join("hard.db");
    std::fs::hard_link(&path, &hard).unwrap();
    let soft = w.dir.path().join("soft.db");
    std::os::unix::fs::symlink(&path, &soft).unwrap();
    for other in [&hard, &soft] {
        let err = serve_fails_on(&w, &format!("sqlite://{}", other.display()));
        assert!(
            err.contains(&format!("in use by pid {} on this machine", first.pid())),
            "{}: {err}",
            other.display()
        );
    }
    // Nor does deleting the note free the file.
    let mut note = path.clone().into_os_string();
    note.push(".lock");
    std::fs::remove_file(&note).unwrap();
    let err = serve_fails(&w);
    assert!(
        err.contains(&format!("in use by pid {} ", first.pid())),
        "{err}"
    );
    // The first goes on serving, its runs untouched.
    invoices_run(&api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_with_damaged_pages_is_refused_at_start() {
    let w = World::new(tool_then_answer).await;
    {
        let (mut server, api) = w.start(&[], &[]);
        for _ in 0..40 {
            invoices_run(&api).await;
        }
        server.stop();
    }
    let path = store_path(&w);
    // Whatever the log holds goes into the file first.
    rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let pages = std::fs::metadata(&path).unwrap().len() / 4096;
    assert!(pages > 16, "{pages} pages");
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for page in [pages / 2, pages / 2 + 2] {
        file.seek(SeekFrom::Start(page * 4096)).unwrap();
        file.write_all(&[0x5A; 4096]).unwrap();
    }
    drop(file);
    let err = serve_fails(&w);
    assert!(err.contains("the session store is damaged"), "{err}");
    assert!(err.contains("restore the file from a backup"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_answer_is_a_503_with_retry_after_and_not_ready_at_once() {
    let w = World::new(tool_then_answer).await;
    let (_server, api) = w.start(&[], &[]);
    invoices_run(&api).await;
    let http = reqwest::Client::new();
    let ready = |http: reqwest::Client, base: String| async move {
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(ready(http.clone(), api.base.clone()).await, 200);

    // Another process holds the write lock past the server's wait.
    let blocker = rusqlite::Connection::open(store_path(&w)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let create = |http: reqwest::Client, base: String| async move {
        http.post(format!("{base}/v1/sessions"))
            .bearer_auth(OWNER)
            .json(&json!({"agent": "invoices", "params": valid_params()}))
            .send()
            .await
            .unwrap()
    };
    // Under load: ten at once, each a 503 that says when to retry.
    let answers =
        futures::future::join_all((0..10).map(|_| create(http.clone(), api.base.clone()))).await;
    for r in answers {
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.headers()["retry-after"], "5");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "store_unavailable", "{body}");
    }
    // Not ready from the failure on, not a heartbeat later.
    assert_eq!(ready(http.clone(), api.base.clone()).await, 503);
    // A read goes through the write lock; writes still do not: not ready.
    let listed = http
        .get(format!("{}/v1/sessions", api.base))
        .bearer_auth(OWNER)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200);
    assert_eq!(ready(http.clone(), api.base.clone()).await, 503);
    assert_eq!(
        create(http.clone(), api.base.clone())
            .await
            .status()
            .as_u16(),
        503
    );
    assert_eq!(ready(http.clone(), api.base.clone()).await, 503);

    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    // Ready again once an operation (the next heartbeat) succeeds.
    eventually("/readyz 200 again", Duration::from_secs(30), async || {
        (ready(http.clone(), api.base.clone()).await == 200).then_some(())
    })
    .await;
    invoices_run(&api).await;
}

/// The store refuses a run's last writes (another process holds its lock
/// past the wait while the tool finishes): once it answers again, the
/// session fails saying so, and the call may have run, not that the
/// server restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_the_store_refused_says_so_once_it_answers() {
    let script = |req: &serde_json::Value| {
        if bindery_tests::mock_llm::tool_results(req).is_empty() {
            bindery_tests::mock_llm::MockReply::tool_call("bash_gated", json!({}))
        } else {
            bindery_tests::mock_llm::MockReply::text("done")
        }
    };
    let w = World::with_toolboxes(script, |dir| {
        let tools = dir.join("gated-tools");
        std::fs::create_dir_all(&tools).unwrap();
        bindery_tests::fixtures::bash_tool(
            &tools,
            "gated",
            "Waits for its gate.",
            &format!(
                "touch {d}/started\nwhile [ ! -e {d}/gate ]; do sleep 0.05; done\necho passed\n",
                d = dir.display()
            ),
        );
        format!("    - bash: {{directory: \"{}\"}}\n", tools.display())
    })
    .await;
    let (server, api) = w.start(&["--runner-heartbeat", "1s"], &[]);
    struct Show<'a>(&'a bindery_tests::sidecar::Sidecar);
    impl Drop for Show<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("LOGS:\n{}", self.0.logs());
            }
        }
    }
    let _show = Show(&server);
    let r = api
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "prompt": "go", "params": valid_params()})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let started = w.dir.path().join("started");
    eventually("the tool starts", Duration::from_secs(30), async || {
        started.exists().then_some(())
    })
    .await;

    let blocker = rusqlite::Connection::open(store_path(&w)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::fs::write(w.dir.path().join("gate"), "").unwrap();
    // The run's writes wait for the lock and give up; the run ends, its
    // end not on record; only then does the store answer again.
    eventually("the run ends", Duration::from_secs(60), async || {
        server.logs().contains("run finished").then_some(())
    })
    .await;
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);

    let last = std::sync::Mutex::new(String::new());
    let detail = eventually(
        "the session is closed",
        Duration::from_secs(20),
        async || {
            let r = api
                .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
                .await;
            *last.lock().unwrap() = r.text.clone();
            (r.json["status"] == "failed").then(|| r.json["status_detail"].to_string())
        },
    )
    .await;
    assert!(
        detail.contains("did not take this run's last writes"),
        "{detail}"
    );
    assert!(!detail.contains("restart"), "{detail}");
}

/// PostgreSQL down under load (`postgres-tests`): every request answers
/// 503 with `Retry-After` or succeeds, none 500; `/readyz` turns 503 with
/// the first failure; once the database is back, the server is ready
/// again without a restart and what was stored before is all there.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_under_load_is_503s_and_recovers_without_a_restart() {
    let mut pg = bindery_tests::postgres::Postgres::start();
    pg.create_database("outage");
    let mut w = World::new(tool_then_answer).await;
    w.store = pg.url("outage");
    let (_server, api) = w.start(&["--runner-heartbeat", "1s"], &[]);
    let mut before = Vec::new();
    for _ in 0..5 {
        let r = invoices_run(&api).await;
        before.push(r.json["session_id"].as_str().unwrap().to_string());
    }
    let http = reqwest::Client::new();
    let base = api.base.clone();

    pg.outage();
    let answers = futures::future::join_all((0..20).map(|i| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let req = match i % 2 {
                0 => http
                    .post(format!("{base}/v1/sessions"))
                    .json(&json!({"agent": "invoices", "params": valid_params()})),
                _ => http.get(format!("{base}/v1/sessions")),
            };
            req.bearer_auth(OWNER).send().await.unwrap()
        }
    }))
    .await;
    for r in answers {
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.headers()["retry-after"], "5");
    }
    let r = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);

    pg.recover();
    eventually("/readyz 200 again", Duration::from_secs(60), async || {
        let r = http.get(format!("{base}/readyz")).send().await.ok()?;
        (r.status().as_u16() == 200).then_some(())
    })
    .await;
    invoices_run(&api).await;
    let listed = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
    for id in &before {
        assert!(
            listed.text.contains(id.as_str()),
            "{id} lost: {}",
            listed.text
        );
    }
}
