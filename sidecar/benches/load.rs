//! Many sessions at once: the floor, SQLite, Postgres and two replicas.
//!
//! Run it with
//!
//! ```text
//! cargo bench -p bindery-sidecar --bench load
//! LOAD_SESSIONS=200 MODEL_DELAY_MS=50 cargo bench -p bindery-sidecar --bench load
//! LOAD_WORKER_THREADS=default cargo bench -p bindery-sidecar --bench load
//! ```
//!
//! A plain `main` (`harness = false`, `test = false`): `cargo test` neither
//! builds nor runs it, and nothing in it asserts a timing. The Postgres
//! rows need PostgreSQL's server binaries (`tests/setup.sh` installs them);
//! without them those rows say why they are missing.
//!
//! The load: `LOAD_SESSIONS` sessions (default 1000), each created, then
//! all posting one message at once (`?wait=true`). Each message is two
//! model turns against the scripted mock model, which answers every
//! request after `MODEL_DELAY_MS` (default 100): first a call of
//! `bash_query-invoices`, then an answer quoting its result. So every
//! message runs the example's real bash tool once.
//!
//! Each server runs with `--worker-threads` from `LOAD_WORKER_THREADS`
//! (default 1, as in a pod limited to one CPU; `default`: the server's
//! own default, one fewer than the CPUs, at least one). On this two-core
//! machine the tools' processes, PostgreSQL and this process already keep
//! both cores busy, and a second worker thread per server mostly adds
//! parking and waking.
//!
//! Each row prints the wall time from the first message to the last
//! answer (and its ratio to the floor's), answers lost or wrong, the p50
//! and p99 of one message's round trip, the throughput, each server
//! process's peak RSS and the CPU seconds it used. The rows:
//!
//! - **floor**: the same model calls and tool runs from this process, with
//!   no server (what any orchestrator must at least spend);
//! - **sqlite**: one server on its embedded store;
//! - **postgres**: one server on a local PostgreSQL;
//! - **postgres x2**: two servers on that database, messages sent to them
//!   in turn (a session created on one gets its message from the other).
//!   They share this machine's cores, so the row measures what coordinating
//!   through the store costs, not how replicas scale; the CPU seconds say
//!   how the work would spread over more cores.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bindery_tests::bench::Process;
use bindery_tests::mock_llm::MockLlm;
use bindery_tests::postgres::Postgres;
use bindery_tests::sidecar::{Api, Sidecar};
use common::{invoices_agent_file, repo, serve, tool_then_answer, OWNER};
use serde_json::{json, Value};

const TENANT: &str = "acme-corp";
/// What the tool prints for [`TENANT`]'s overdue invoices.
const EXPECTED: &str = "2026-10-01\tINV-1002\t850.50 EUR\toverdue\n";

fn main() {
    let sessions: usize = env_or("LOAD_SESSIONS", 1000);
    let delay = Duration::from_millis(env_or("MODEL_DELAY_MS", 100));
    let workers = std::env::var("LOAD_WORKER_THREADS").unwrap_or_else(|_| "1".into());
    let flags: Vec<&str> = match workers.as_str() {
        "default" => Vec::new(),
        n => vec!["--worker-threads", n],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    println!("{}", bindery_tests::bench::context());
    println!(
        "bindery-sidecar under load: {sessions} concurrent sessions, one message each \
         (2 model turns of {} ms, 1 bash tool run), worker threads per server: {workers}",
        delay.as_millis(),
    );
    rt.block_on(async {
        let mock = MockLlm::start(move |req| tool_then_answer(req).delayed(delay)).await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("logs")).expect("a log directory");
        let agent = agent_file(dir.path(), &mock.url());

        let floor = floor(&mock, sessions).await;
        floor.print("floor", None);

        let store = format!("sqlite://{}", dir.path().join("store.sqlite").display());
        let sqlite = against(&[&agent], &store, &flags, dir.path(), 1, sessions).await;
        sqlite.print("sqlite", Some(&floor));
        let mut goals = vec![sqlite.goal("sqlite")];

        match std::panic::catch_unwind(Postgres::start) {
            Ok(pg) => {
                pg.create_database("one");
                let one = against(&[&agent], &pg.url("one"), &flags, dir.path(), 1, sessions).await;
                one.print("postgres", Some(&floor));
                pg.create_database("two");
                let two = against(&[&agent], &pg.url("two"), &flags, dir.path(), 2, sessions).await;
                two.print("postgres x2", Some(&floor));
                println!(
                    "postgres over sqlite: x{:.2} wall; two replicas' throughput over one: x{:.2}",
                    one.wall.as_secs_f64() / sqlite.wall.as_secs_f64(),
                    two.throughput() / one.throughput(),
                );
                goals.extend([one.goal("postgres"), two.goal("postgres x2")]);
            }
            Err(_) => println!("postgres: not measured (no PostgreSQL server: run tests/setup.sh)"),
        }
        goals.iter().for_each(|g| println!("{g}"));
    });
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The invoices agent, its token a process-scope secret (so any replica
/// can run any session) and its tenant a session value.
fn agent_file(dir: &Path, model_url: &str) -> String {
    let parameters = "    - {name: tenant, scope: session}
    - {name: billing_token, secret: true}
";
    invoices_agent_file(dir, model_url, parameters, "")
        .display()
        .to_string()
}

/// One row of the table.
struct Row {
    wall: Duration,
    sessions: usize,
    lost: usize,
    latencies: Vec<Duration>,
    /// Per server process, read at the end.
    processes: Vec<Process>,
}

impl Row {
    fn throughput(&self) -> f64 {
        (self.sessions - self.lost) as f64 / self.wall.as_secs_f64()
    }

    /// The goal every server row checks: every session's answer came, right.
    fn goal(&self, name: &str) -> String {
        bindery_tests::bench::goal(
            &format!("{name}, no answer lost or wrong"),
            self.lost == 0,
            &format!("{}/{}", self.lost, self.sessions),
        )
    }

    fn print(&self, name: &str, floor: Option<&Row>) {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        let vs = floor.map_or(String::new(), |f| {
            format!(
                " (x{:.2} the floor)",
                self.wall.as_secs_f64() / f.wall.as_secs_f64()
            )
        });
        println!(
            "{name:12} {:7.2} s{vs}; lost or wrong {}/{}; p50 {:.0} ms, p99 {:.0} ms; {:.0} sessions/s",
            self.wall.as_secs_f64(),
            self.lost,
            self.sessions,
            at(0.5),
            at(0.99),
            self.throughput(),
        );
        for (i, p) in self.processes.iter().enumerate() {
            println!(
                "{:12}   server {}: peak RSS {:.0} MiB ({:.0} MiB per 1000 sessions), CPU {:.1} s",
                "",
                i + 1,
                p.peak_rss_kib as f64 / 1024.0,
                p.peak_rss_kib as f64 / 1024.0 * 1000.0 / self.sessions as f64,
                p.cpu_seconds
            );
        }
    }
}

/// The same model calls and tool runs, done directly.
async fn floor(mock: &MockLlm, sessions: usize) -> Row {
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", mock.url());
    let script = repo().join("examples/invoices/tools/query-invoices");
    let started = Instant::now();
    let tasks = (0..sessions).map(|_| {
        let (http, url, script) = (http.clone(), url.clone(), script.clone());
        async move {
            let t = Instant::now();
            let user = json!({"role": "user", "content": "Which invoices are overdue?"});
            let first: Value = chat(&http, &url, vec![user.clone()]).await;
            let call = &first["choices"][0]["message"]["tool_calls"][0];
            let out = tokio::process::Command::new(&script)
                .args(["run", "--tenant_id", TENANT, "--status", "overdue"])
                .env("TOKEN", "load-token")
                .output()
                .await
                .expect("the tool runs");
            let result = String::from_utf8_lossy(&out.stdout).to_string();
            let second = chat(
                &http,
                &url,
                vec![
                    user,
                    json!({"role": "assistant", "tool_calls": [call]}),
                    json!({"role": "tool", "tool_call_id": call["id"], "content": result}),
                ],
            )
            .await;
            let answer = second["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("");
            (answer == format!("answer: {EXPECTED}"), t.elapsed())
        }
    });
    let results = futures::future::join_all(tasks).await;
    row(started.elapsed(), results, Vec::new())
}

async fn chat(http: &reqwest::Client, url: &str, messages: Vec<Value>) -> Value {
    let body = json!({"model": "mock-model", "messages": messages});
    match http.post(url).json(&body).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn row(wall: Duration, results: Vec<(bool, Duration)>, processes: Vec<Process>) -> Row {
    Row {
        wall,
        sessions: results.len(),
        lost: results.iter().filter(|(ok, _)| !ok).count(),
        latencies: results.into_iter().map(|(_, d)| d).collect(),
        processes,
    }
}

/// `replicas` servers on `store`; sessions created on server `i % n`,
/// their messages sent to server `(i + 1) % n`.
async fn against(
    agent: &[&str],
    store: &str,
    flags: &[&str],
    dir: &Path,
    replicas: usize,
    sessions: usize,
) -> Row {
    let env = [("BINDERY_PARAM_BILLING_TOKEN", "load-token")];
    let servers: Vec<(Sidecar, Api)> = (0..replicas)
        .map(|_| serve(Path::new(agent[0]), store, flags, &env, dir))
        .collect();
    let created = futures::future::join_all((0..sessions).map(|i| {
        let api = servers[i % replicas].1.clone();
        async move {
            let body = json!({"agent": "invoices", "params": {"tenant": TENANT}});
            let r = api
                .call("POST", "/v1/sessions", Some(OWNER), Some(&body))
                .await;
            r.json["session_id"].as_str().map(str::to_owned)
        }
    }))
    .await;
    let started = Instant::now();
    let results = futures::future::join_all(created.into_iter().enumerate().map(|(i, id)| {
        let api = servers[(i + 1) % replicas].1.clone();
        async move {
            let t = Instant::now();
            let Some(id) = id else {
                return (false, t.elapsed());
            };
            let r = api
                .call(
                    "POST",
                    &format!("/v1/sessions/{id}/messages?wait=true&timeout=600"),
                    Some(OWNER),
                    Some(&json!({"prompt": "Which invoices are overdue?"})),
                )
                .await;
            let last = r.json["session"]["turns"]
                .as_array()
                .and_then(|t| t.last())
                .map(|t| t["content"].clone())
                .unwrap_or(Value::Null);
            (last == json!(format!("answer: {EXPECTED}")), t.elapsed())
        }
    }))
    .await;
    let wall = started.elapsed();
    let processes = servers
        .iter()
        .map(|(s, _)| Process::read(s.pid()))
        .collect();
    row(wall, results, processes)
}
