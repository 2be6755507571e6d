//! The real server on a shared PostgreSQL store (`--store postgres://…`):
//! sessions survive a restart, two servers on one database see each
//! other's sessions, and neither a secret value nor the database password
//! ends up where it must not.

use std::time::{Duration, Instant};

use crate::common::*;
use bindery_tests::mock_llm::{last_message, Gate, MockReply};
use bindery_tests::postgres::Postgres;
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

const DB: &str = "tenant_acme";

fn session_id(r: &bindery_tests::sidecar::Reply) -> String {
    r.json["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.text))
        .to_string()
}

/// How long a test waits for a condition before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// The `run_finished` events of session `id`, replayed from the start, once
/// there are `n` (the data of each, in order).
async fn run_ends(api: &Api, id: &str, n: usize) -> Vec<Value> {
    let (status, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let mut ends = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while ends.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = stream.until("run_finished", left).await;
        match seen.last() {
            Some(e) if e.event == "run_finished" => {
                ends.push(serde_json::from_str(&e.data).unwrap());
            }
            _ => panic!(
                "{} of {n} run_finished events after {PATIENCE:?}: {ends:?}",
                ends.len()
            ),
        }
    }
    ends
}

/// Poll `GET /v1/sessions/{id}` on `api` until `done` holds of it.
async fn session_until(api: &Api, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let what = format!("session {id} {what}");
    eventually_or(&what, PATIENCE, || async {
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        if done(&r.json) {
            Ok(r.json)
        } else {
            Err(r.text)
        }
    })
    .await
}

/// Poll the database until `done` holds of the answer to `query`.
async fn db_until(pg: &Postgres, query: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    eventually_or(what, PATIENCE, || async {
        let out = pg.sql(DB, query);
        if done(&out) {
            Ok(out)
        } else {
            Err(out)
        }
    })
    .await
}

/// A model that holds the prompt "hold" until `gate` opens, then answers
/// "released"; every other prompt gets "fresh".
fn held_by(gate: &Gate) -> impl Fn(&Value) -> MockReply + Send + Sync + 'static {
    let gate = gate.clone();
    move |req| match last_message(req)["content"].as_str() {
        Some("hold") => MockReply::text("released").held(&gate),
        _ => MockReply::text("fresh"),
    }
}

/// A PostgreSQL server with the database `DB`, and a world whose servers
/// keep their sessions there, the model answering with `script`.
async fn on_postgres(
    script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
) -> (Postgres, World) {
    let pg = Postgres::start();
    pg.create_database(DB);
    let mut w = World::new(script).await;
    w.store = pg.url(DB);
    (pg, w)
}

/// `POST /v1/sessions/{id}/messages?wait=true` on `api` with `body`.
async fn message(api: &Api, id: &str, token: &str, body: Value) -> bindery_tests::sidecar::Reply {
    api.call(
        "POST",
        &format!("/v1/sessions/{id}/messages?wait=true"),
        Some(token),
        Some(&body),
    )
    .await
}

/// Short heartbeats, so that a lease passes within a test.
const QUICK: [&str; 4] = ["--runner-heartbeat", "200ms", "--runner-lease", "1s"];

/// A session created on `api` whose run is held by the model (it has the
/// request: the run is in flight).
async fn held_run(w: &World, api: &Api) -> String {
    let r = create(
        api,
        json!({"agent": "invoices", "prompt": "hold", "params": valid_params()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "running", "{}", r.text);
    until("the model gets the request", PATIENCE, || {
        w.mock.request_count() > 0
    })
    .await;
    session_id(&r)
}

/// The instance ids in the heartbeat table, sorted.
fn instances(pg: &Postgres) -> Vec<String> {
    let mut v: Vec<String> = pg
        .sql(DB, "SELECT instance FROM bindery_runners")
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// `/readyz` until its status is `want`; the last answer.
async fn ready_until(api: &Api, want: u16) -> bindery_tests::sidecar::Reply {
    eventually_or(&format!("/readyz {want}"), PATIENCE, || async {
        let r = api.call("GET", "/readyz", None, None).await;
        if r.status == want {
            Ok(r)
        } else {
            Err(format!("{} {}", r.status, r.text))
        }
    })
    .await
}

/// A server whose database stops taking connections is not ready until it
/// takes them again (its heartbeats tell), and says why in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_loses_its_database_is_not_ready_until_it_is_back() {
    let (pg, w) = on_postgres(tool_then_answer).await;
    let (mut server, api) = w.start(&QUICK, &[]);
    ready_until(&api, 200).await;

    // No new connections to the database, and the server's one cut.
    pg.sql(
        "postgres",
        &format!("ALTER DATABASE {DB} ALLOW_CONNECTIONS false"),
    );
    pg.sql(
        "postgres",
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{DB}'"),
    );
    let r = ready_until(&api, 503).await;
    assert_eq!(r.json["error"], "store_unavailable", "{}", r.text);
    // The health check stays up: the process is fine, only not ready.
    assert_eq!(api.call("GET", "/healthz", None, None).await.status, 200);

    pg.sql(
        "postgres",
        &format!("ALTER DATABASE {DB} ALLOW_CONNECTIONS true"),
    );
    ready_until(&api, 200).await;
    let logs = server.logs();
    assert!(
        logs.contains("cannot record this server's heartbeat"),
        "{logs}"
    );
    assert!(logs.contains("the session store answers again"), "{logs}");
    assert!(!logs.contains(Postgres::PASSWORD), "{logs}");
    assert!(server.stop().is_some_and(|st| st.success()));
}

/// A server killed mid-run: another server on the database closes the run
/// as failed once the lease has passed, and the session takes messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_a_crash_is_closed_by_another_server_after_the_lease() {
    let gate = Gate::new();
    let (_pg, w) = on_postgres(held_by(&gate)).await;

    let (mut a, api_a) = w.start(&QUICK, &[]);
    let id = held_run(&w, &api_a).await;
    a.kill();

    let (b, api_b) = w.start(&QUICK, &[]);
    let s = session_until(&api_b, &id, "failed", |s| s["status"] != "running").await;
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(
        s["status_detail"],
        "interrupted: the server running it stopped"
    );
    assert_eq!(s["session"]["turns"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(w.mock.request_count(), 1, "nothing retried");

    // The session goes on, on B (the secret went with A).
    let r = api_b
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "again", "params": {"billing_token": "t-2"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "fresh", "{}", r.text);
    // Closed once, though B swept it every 200ms.
    let ends = run_ends(&api_b, &id, 2).await;
    assert_eq!(
        ends[0]["detail"],
        "interrupted: the server running it stopped"
    );
    assert_eq!(ends[1]["status"], "completed");
    assert!(b
        .logs()
        .contains("interrupted: the server running it stopped"));
    gate.open();
}

/// Server `a`, frozen mid-run, wakes and its model answers (`gate`
/// opens): wait until it has noticed that its run was closed meanwhile.
async fn wakes_to_find_its_run_closed(a: &bindery_tests::sidecar::Sidecar, gate: &Gate) {
    a.signal("CONT");
    gate.open();
    eventually_or("A notices its run was closed", PATIENCE, || async {
        let logs = a.logs();
        match logs.contains("run stopped: another server closed it as lost") {
            true => Ok(()),
            false => Err(logs),
        }
    })
    .await;
}

/// A server frozen mid-run (its heartbeat lapses) whose run another
/// server closed: when it wakes and the model answers, it finds the run no
/// longer its own, stops it and writes nothing, and keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_wakes_to_find_its_run_closed_stops_it() {
    let gate = Gate::new();
    let (_pg, w) = on_postgres(held_by(&gate)).await;

    let (a, api_a) = w.start(&QUICK, &[]);
    let id = held_run(&w, &api_a).await;
    a.signal("STOP");
    let (_b, api_b) = w.start(&QUICK, &[]);
    let closed = session_until(&api_b, &id, "failed", |s| s["status"] != "running").await;
    assert_eq!(
        closed["status_detail"],
        "interrupted: the server running it stopped"
    );

    wakes_to_find_its_run_closed(&a, &gate).await;
    let r = api_a
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "A still serves: {}", r.text);
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert_eq!(r.json["status_detail"], closed["status_detail"]);
    assert_eq!(
        r.json["session"]["turns"], closed["session"]["turns"],
        "A wrote nothing"
    );
    let ends = run_ends(&api_a, &id, 1).await;
    assert_eq!(ends[0]["status"], "failed", "only B's end: {ends:?}");
    // The session takes messages (on A too, which has the secret).
    let r = message_waited(&api_a, &id, "again").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let ends = run_ends(&api_a, &id, 2).await;
    assert_eq!(ends[1]["status"], "completed", "{ends:?}");
}

/// As above, but what the model asks for when the server wakes is a tool
/// call: the turn that asks for it finds the run closed, and the tool
/// (which would leave a mark) never runs, on this server or any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_wakes_to_find_its_run_closed_runs_no_tool() {
    let gate = Gate::new();
    let held = gate.clone();
    let pg = Postgres::start();
    pg.create_database(DB);
    let mut w = World::with_toolboxes(
        move |req| match last_message(req)["content"].as_str() {
            Some("hold") => MockReply::tool_call("bash_mark", json!({})).held(&held),
            _ => MockReply::text("fresh"),
        },
        |dir| {
            let tools = dir.join("mark-tools");
            std::fs::create_dir_all(&tools).unwrap();
            executable(
                &tools.join("mark"),
                &format!(
                    r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "mark", "description": "Leaves a mark.", "args": []}}'
  exit 0
fi
touch "{}"
echo marked
"#,
                    dir.join("marked").display()
                ),
            );
            format!("    - bash: {{directory: \"{}\"}}\n", tools.display())
        },
    )
    .await;
    w.store = pg.url(DB);
    let mark = w.dir.path().join("marked");

    let (a, api_a) = w.start(&QUICK, &[]);
    let id = held_run(&w, &api_a).await;
    a.signal("STOP");
    let (_b, api_b) = w.start(&QUICK, &[]);
    session_until(&api_b, &id, "failed", |s| s["status"] != "running").await;

    wakes_to_find_its_run_closed(&a, &gate).await;
    assert!(
        !mark.exists(),
        "the tool ran for a run that was not A's any more"
    );
    let ends = run_ends(&api_a, &id, 1).await;
    assert_eq!(ends[0]["status"], "failed", "only B's end: {ends:?}");
    let r = api_a
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = r.json["session"]["turns"].to_string();
    assert!(
        !turns.contains("bash_mark"),
        "A stored its tool call after all: {turns}"
    );
}

/// While the server running a run beats, another server leaves the run
/// alone (well past the lease), refuses messages to its session, and sees
/// the run end normally; a server that stops leaves no heartbeat behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_live_server_is_left_alone_by_another() {
    let gate = Gate::new();
    let (pg, w) = on_postgres(held_by(&gate)).await;

    let (mut a, api_a) = w.start(&QUICK, &[]);
    let id = held_run(&w, &api_a).await;
    let a_only = instances(&pg);
    assert_eq!(a_only.len(), 1, "{a_only:?}");
    let (mut b, api_b) = w.start(&QUICK, &[]);
    let both = instances(&pg);
    assert_eq!(both.len(), 2, "{both:?}");
    let b_id = both.iter().find(|i| !a_only.contains(i)).unwrap().clone();

    // Until B has beaten (and so swept) with a clock more than two leases
    // past the run's start.
    let started: i64 = pg
        .sql(
            DB,
            &format!("SELECT updated_at FROM bindery_sessions WHERE id = '{id}'"),
        )
        .trim()
        .parse()
        .unwrap();
    let beat_of_b = format!("SELECT heartbeat_at FROM bindery_runners WHERE instance = '{b_id}'");
    let late = db_until(&pg, &beat_of_b, "past two leases", |out| {
        out.trim()
            .parse::<i64>()
            .is_ok_and(|at| at > started + 2_000)
    })
    .await;
    db_until(&pg, &beat_of_b, "beaten once more", |out| out != late).await;

    let r = api_b
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["status"], "running", "{}", r.text);
    let r = api_b
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "me too"})),
        )
        .await;
    assert_eq!(error_of(&r).1, "run_in_progress", "{}", r.text);

    gate.open();
    let s = session_until(&api_b, &id, "idle", |s| s["status"] != "running").await;
    assert_eq!(s["status"], "idle", "{s}");
    assert_eq!(s["status_detail"], Value::Null, "{s}");
    let turns = s["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "released", "{s}");
    let ends = run_ends(&api_b, &id, 1).await;
    assert_eq!(ends[0]["status"], "completed", "{ends:?}");

    // A graceful stop removes the server's heartbeat.
    for s in [&mut a, &mut b] {
        assert!(s.stop().is_some_and(|st| st.success()));
    }
    assert!(instances(&pg).is_empty());
}

/// A cancel sent to a server that does not run the session, and cannot
/// forward it to the one that does (that one advertises no address),
/// reaches it through the store: the run ends cancelled, once, and the
/// session takes the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_cancelled_through_another_server() {
    let gate = Gate::new();
    let (pg, w) = on_postgres(held_by(&gate)).await;

    let unreachable = [&QUICK[..], &["--advertise-url", "none"]].concat();
    let (_a, api_a) = w.start(&unreachable, &[]);
    let id = held_run(&w, &api_a).await;
    let (_b, api_b) = w.start(&QUICK, &[]);

    let r = api_b
        .call(
            "POST",
            &format!("/v1/sessions/{id}/cancel"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["session_id"], id.as_str(), "{}", r.text);
    let s = session_until(&api_b, &id, "the run's end", |s| s["status"] != "running").await;
    assert_eq!(s["status"], "idle", "{s}");
    assert_eq!(s["status_detail"], "cancelled", "{s}");
    let ends = run_ends(&api_a, &id, 1).await;
    assert_eq!(ends[0]["status"], "cancelled", "{ends:?}");
    let flag = pg.sql(
        DB,
        &format!("SELECT cancel_requested FROM bindery_sessions WHERE id = '{id}'"),
    );
    assert_eq!(
        flag.trim(),
        "f",
        "the request is cleared with the run's end"
    );

    // Nothing to cancel now, from either server.
    for api in [&api_a, &api_b] {
        let r = api
            .call(
                "POST",
                &format!("/v1/sessions/{id}/cancel"),
                Some(OWNER),
                None,
            )
            .await;
        assert_eq!(error_of(&r).1, "not_running", "{}", r.text);
    }

    // On A, which holds the session's secret value.
    gate.open();
    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "again"})),
        )
        .await;
    assert!(r.status < 300, "{}", r.text);
    let s = session_until(&api_a, &id, "the next run's end", |s| {
        s["status"] != "running"
    })
    .await;
    assert_eq!(s["status"], "idle", "{s}");
    let turns = s["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "fresh", "{s}");
    let ends = run_ends(&api_b, &id, 2).await;
    assert_eq!(ends.len(), 2, "{ends:?}");
    assert_eq!(ends[0]["status"], "cancelled", "{ends:?}");
    assert_eq!(ends[1]["status"], "completed", "{ends:?}");
}

/// A subscriber on a server that does not run the session, and cannot
/// forward to the one that does (it advertises no address), gets the run's
/// stored events as the running server stores them, without reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_a_run_on_another_server_stream_live() {
    let gate = Gate::new();
    let (_pg, w) = on_postgres(held_by(&gate)).await;

    let unreachable = [&QUICK[..], &["--advertise-url", "none"]].concat();
    let (_a, api_a) = w.start(&unreachable, &[]);
    let id = held_run(&w, &api_a).await;
    let (_b, api_b) = w.start(&QUICK, &[]);

    let (status, stream) = api_b
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let replayed = stream.until("run_started", PATIENCE).await;
    assert_eq!(
        replayed.last().map(|e| e.event.as_str()),
        Some("run_started"),
        "{replayed:?}"
    );
    let r = api_a
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(
        r.json["status"], "running",
        "the run is still held: {}",
        r.text
    );

    gate.open();
    let live = stream.until("run_finished", PATIENCE).await;
    let end = live
        .last()
        .filter(|e| e.event == "run_finished")
        .unwrap_or_else(|| panic!("no run_finished on B within {PATIENCE:?}: {live:?}"));
    let data: Value = serde_json::from_str(&end.data).unwrap();
    assert_eq!(data["status"], "completed", "{data}");
    // Every stored event once, in order, with its id.
    let ids: Vec<i64> = replayed
        .iter()
        .chain(&live)
        .map(|e| {
            e.id.as_deref()
                .unwrap_or_else(|| panic!("{e:?}"))
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (1..=ids.len() as i64).collect::<Vec<_>>(), "{ids:?}");
    assert!(
        live.iter().any(|e| e.data.contains("released")),
        "the model's answer is among the live events: {live:?}"
    );
    assert!(
        !live.iter().any(|e| e.event == "delta"),
        "deltas are the running server's only: {live:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_sharing_a_database_share_sessions_across_restarts() {
    let (pg, w) = on_postgres(tool_then_answer).await;
    let url = w.store.clone();

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
    let api_b = Api::new(&b.url);
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
    // B holds the second session's secret: the new A has it answered there.
    let r = message(&api_a, &second, OWNER, json!({"prompt": "and now?"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The first session's secret went with the server that had it in memory.
    let r = message(&api_a, &first, OWNER, json!({"prompt": "and now?"})).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json["params"], json!(["billing_token"]));

    // A run recorded without its server (as by a version before runner
    // leases) and silent for longer than the lease is closed by a server
    // starting.
    pg.sql(
        DB,
        &format!(
            "UPDATE bindery_sessions SET status = 'running', updated_at = 0 WHERE id = '{first}'"
        ),
    );
    // No periodic sweep within this test: only startup and requests act.
    let slow_beat = ["--runner-heartbeat", "1h", "--runner-lease", "2h"];
    let (c, api_c) = w.start(&slow_beat, &[]);
    let r = api_c
        .call("GET", &format!("/v1/sessions/{first}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert_eq!(
        r.json["status_detail"], "interrupted: the server running it stopped",
        "{}",
        r.text
    );
    // A run whose server left no heartbeat is closed by the first message
    // that finds it, which then runs.
    pg.sql(
        DB,
        &format!("UPDATE bindery_sessions SET status = 'running', runner = 'gone-4e1a' WHERE id = '{first}'"),
    );
    let r = api_c
        .call(
            "POST",
            &format!("/v1/sessions/{first}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "still overdue?", "params": {"billing_token": "t-2"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    // Runs: the first, closed at C's start, closed by the message, the
    // message's own.
    let ends = run_ends(&api_c, &first, 4).await;
    let statuses: Vec<&Value> = ends.iter().map(|e| &e["status"]).collect();
    assert_eq!(
        statuses,
        ["completed", "failed", "failed", "completed"],
        "{ends:?}"
    );
    for closed in &ends[1..3] {
        assert_eq!(
            closed["detail"],
            "interrupted: the server running it stopped"
        );
    }
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

/// What the model streams in the forwarding test.
const STREAMED: &str = "a fairly long answer, streamed in pieces";

/// The text of the `delta` events among `events`, in order.
fn delta_text(events: &[bindery_tests::sidecar::SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "delta")
        .map(|e| {
            serde_json::from_str::<Value>(&e.data).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Secret values given to server A, a client behind the Service reaching
/// server B: B forwards what needs them to A (the message is answered, not
/// refused with 409), a subscriber on B gets the run's `delta` events from
/// A, and the session token B checked goes with the forward. A client
/// cannot pose as a peer. Once A is gone, B answers 409 as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_needing_what_another_server_holds_is_forwarded_there() {
    let (pg, w) = on_postgres(|_| MockReply::text(STREAMED)).await;
    let (mut a, api_a) = w.start(&QUICK, &[]);
    let (b, api_b) = w.start(&QUICK, &[]);

    let r = create(
        &api_a,
        json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = session_id(&r);
    let token = r.json["session_token"].as_str().unwrap().to_string();

    let (status, stream) = api_b
        .events(&format!("/v1/sessions/{id}/events"), Some(&token), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let r = message(&api_b, &id, &token, json!({"prompt": "hi"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], STREAMED, "{}", r.text);
    // The session token's view: no parameters, as on A.
    assert_eq!(r.json["params"], json!({}), "{}", r.text);
    assert_eq!(w.mock.request_count(), 1);
    assert!(
        !w.mock.requests()[0].to_string().contains(CANARY),
        "a secret value reached the model"
    );

    let events = stream.until("run_finished", PATIENCE).await;
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("run_finished"),
        "{events:?}"
    );
    assert_eq!(delta_text(&events), STREAMED, "{events:?}");

    // A peer's header from a client is refused, with or without a token.
    for bearer in [None, Some(OWNER)] {
        let mut req = api_b
            .http
            .post(format!("{}/v1/sessions/{id}/messages", api_b.base))
            .header("x-bindery-peer", "0".repeat(64))
            .header("x-bindery-peer-caller", "owner")
            .json(&json!({"prompt": "posing"}));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("x-bindery-peer"),
            "{body}"
        );
    }
    assert_eq!(w.mock.request_count(), 1, "nothing ran for a poser");

    // A stops beating (killed): once its heartbeat is gone, B serves the
    // session itself, without the secret, as before.
    a.kill();
    until("A's heartbeat goes", PATIENCE, || instances(&pg).len() == 1).await;
    let r = message(&api_b, &id, OWNER, json!({"prompt": "again"})).await;
    let (status, code, params) = error_of(&r);
    assert_eq!(
        (status, code.as_str()),
        (409, "params_required"),
        "{}",
        r.text
    );
    assert_eq!(params, ["billing_token"]);
    let logs = b.logs();
    assert!(
        !logs.contains("cannot forward"),
        "B tried a dead server:\n{logs}"
    );
    for s in [&a, &b] {
        assert!(!s.logs().contains(CANARY), "{}", s.logs());
    }
}
