//! What live sessions and their event subscribers cost in memory, and
//! whether it comes back.
//!
//! Run it with
//!
//! ```text
//! cargo bench -p bindery-sidecar --bench memory
//! MEMORY_SESSIONS=2000 MEMORY_SUBSCRIBERS=2000 cargo bench -p bindery-sidecar --bench memory
//! ```
//!
//! A plain `main` (`harness = false`, `test = false`): `cargo test` neither
//! builds nor runs it, and nothing in it asserts a size or a timing.
//!
//! It starts the real `bindery-sidecar serve` (release build) with the
//! invoices agent, whose `billing_token` is a required secret session
//! value, and `--live-session-ttl MEMORY_TTL` (default `60s`). Then it
//! prints the server's resident memory (`VmRSS` of `/proc/PID/status`):
//!
//! 1. idle: after one warm-up session has been created and its event
//!    stream opened and closed (so the rows count what sessions and
//!    streams add, not the code and lazily built state the first of each
//!    pages in);
//! 2. after `MEMORY_SESSIONS` sessions (default 10000) created through
//!    `POST /v1/sessions`, each holding its own secret value (the server's
//!    `bindery_sessions_live` then says so);
//! 3. with `MEMORY_SUBSCRIBERS` (default 10000) event streams
//!    (`GET /v1/sessions/:id/events`) open on them, one per session in turn;
//! 4. once the streams are closed and the TTL has evicted every session
//!    (`bindery_sessions_live` back to 0: waited for, not slept), and the
//!    memory the sweep gives back has stopped falling for longer than the
//!    server's periodic work takes (`SETTLE`).
//!
//! `MEMORY_CYCLES` (default 1) repeats steps 2 to 4: a second "evicted"
//! row close to the first says that what stays after a burst is reused by
//! the next, not leaked. The idle and evicted rows split resident memory
//! into heap and stacks (`RssAnon`) and the binary's code and other files
//! (`RssFile`).
//!
//! Each row says what a session or a subscriber costs on average. The
//! sessions are created faster than the TTL runs out on a usual machine;
//! if the live count printed with a row is lower than the sessions
//! created, raise `MEMORY_TTL`. Each process needs an open file per
//! stream (`ulimit -n`; the bench says when it is too low).
//!
//! Where it goes (found with heaptrack and `/proc/PID/smaps`): an open
//! stream is mostly hyper's two 8 KiB connection buffers (read and write,
//! fixed by hyper), partly untouched; the rest is the connection's task,
//! the event stream's body (`api/event_stream.rs`: the feed, no timer of
//! its own) with its two headers, and the subscriber's queue
//! (`session/fanout.rs`). `cli/http.rs` says what `axum::serve` and
//! hyper's in-flight slot added per connection. After eviction, what stays
//! is the code paged in by the burst and jemalloc's fragments: each
//! worker flushes the objects its thread caches so that they do not pin
//! the freed pages, and hyper's 8 KiB buffers share slabs so that
//! jemalloc's records of them stay few (`cli/memory.rs`).

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use bindery_tests::mock_llm::MockLlm;
use bindery_tests::sidecar::{Api, EventStream};
use common::{invoices_agent, serve, tool_then_answer, OWNER};
use futures::StreamExt;
use serde_json::json;

/// The goals: resident memory in all with [`GOAL_COUNT`] live sessions,
/// and with as many event streams open on them too; after eviction, how
/// far above idle at most.
const GOAL_COUNT: usize = 10_000;
const GOAL_SESSIONS_MIB: f64 = 64.0;
const GOAL_STREAMS_MIB: f64 = 128.0;
const GOAL_EVICTED: f64 = 0.10;

/// Requests in flight at once while creating and subscribing.
const CONCURRENCY: usize = 64;

fn main() {
    let sessions: usize = env_or("MEMORY_SESSIONS", 10_000);
    let subscribers: usize = env_or("MEMORY_SUBSCRIBERS", 10_000);
    let ttl: String = env_or("MEMORY_TTL", "60s".to_string());
    let cycles: usize = env_or("MEMORY_CYCLES", 1);
    check_open_files(subscribers);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    println!("{}", bindery_tests::bench::context());
    println!(
        "bindery-sidecar memory: {sessions} live sessions with a secret, \
         {subscribers} event subscribers, --live-session-ttl {ttl}"
    );
    rt.block_on(async {
        let mock = MockLlm::start(tool_then_answer).await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("logs")).expect("a log directory");
        let agent = invoices_agent(dir.path(), &mock.url());
        let store = format!("sqlite://{}", dir.path().join("store.sqlite").display());
        let (sidecar, api) = serve(
            &agent,
            &store,
            &["--live-session-ttl", &ttl],
            &[],
            dir.path(),
        );
        let pid = sidecar.pid();
        // Idle is the server after one session has been created and its
        // event stream opened and closed: the rows measure what sessions
        // and streams add, not the code and lazily built state the first
        // of each pages in (about 1 MiB, mostly the binary's code).
        warm_up(&api).await;
        let idle = rss_kib(pid);
        println!("{:34} {:8.1} MiB  ({})", "idle", mib(idle), rss_parts(pid));

        let mut goals = Vec::new();
        for _ in 0..cycles {
            let started = Instant::now();
            let ids: Vec<String> = futures::stream::iter(0..sessions)
                .map(|i| {
                    let api = api.clone();
                    async move {
                        let body = json!({"agent": "invoices", "params": {
                            "tenant": format!("tenant-{i}"),
                            "billing_token": format!("secret-{i:08}-{}", "x".repeat(24)),
                        }});
                        let r = api
                            .call("POST", "/v1/sessions", Some(OWNER), Some(&body))
                            .await;
                        r.json["session_id"].as_str().map(str::to_owned)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .filter_map(|id| async move { id })
                .collect()
                .await;
            let with_sessions = rss_kib(pid);
            let live = live_count(&api).await;
            println!(
                "{:34} {:8.1} MiB  +{:.1} MiB, {:.2} KiB a session \
                 ({} created in {:.1} s, {live} live)",
                format!("{} sessions", ids.len()),
                mib(with_sessions),
                mib(with_sessions.saturating_sub(idle)),
                per(with_sessions, idle, ids.len()),
                ids.len(),
                started.elapsed().as_secs_f64(),
            );

            let started = Instant::now();
            let streams: Vec<EventStream> = futures::stream::iter(0..subscribers)
                .map(|i| {
                    let api = api.clone();
                    let id = ids.get(i % ids.len().max(1)).cloned().unwrap_or_default();
                    async move {
                        let path = format!("/v1/sessions/{id}/events");
                        api.events(&path, Some(OWNER), None).await.1
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .filter_map(|s| async move { s })
                .collect()
                .await;
            let with_subscribers = rss_kib(pid);
            let live = live_count(&api).await;
            println!(
                "{:34} {:8.1} MiB  +{:.1} MiB, {:.2} KiB a subscriber \
                 ({} opened in {:.1} s, {live} live)",
                format!("+ {} subscribers", streams.len()),
                mib(with_subscribers),
                mib(with_subscribers.saturating_sub(with_sessions)),
                per(with_subscribers, with_sessions, streams.len()),
                streams.len(),
                started.elapsed().as_secs_f64(),
            );

            drop(streams);
            let started = Instant::now();
            // A closed stream is noticed at its next keep-alive (15 s), a
            // session at its TTL's next sweep.
            let gone = wait_live(&api, 0, Duration::from_secs(600)).await;
            // The sweep that evicted the last ones gives the memory back just
            // after the count falls: read it once it has stopped falling.
            let (evicted, lowest) = settled_rss(pid).await;
            println!(
                "{:34} {:8.1} MiB  {:+.1} MiB over idle ({:+.1} %, lowest {:.1} MiB; {} after {:.1} s; {})",
                "evicted",
                mib(evicted),
                mib(evicted) - mib(idle),
                (evicted as f64 - idle as f64) * 100.0 / idle as f64,
                mib(lowest),
                if gone {
                    "0 live".to_string()
                } else {
                    format!("still {} live", live_count(&api).await)
                },
                started.elapsed().as_secs_f64(),
                rss_parts(pid),
            );
            let over_idle = (evicted as f64 - idle as f64) / idle as f64;
            goals = vec![
                bindery_tests::bench::goal(
                    &format!("{GOAL_COUNT} live sessions ≤ {GOAL_SESSIONS_MIB} MiB"),
                    mib(with_sessions) <= GOAL_SESSIONS_MIB,
                    &format!("{:.1} MiB", mib(with_sessions)),
                ),
                bindery_tests::bench::goal(
                    &format!("{GOAL_COUNT} open event streams ≤ {GOAL_STREAMS_MIB} MiB"),
                    mib(with_subscribers) <= GOAL_STREAMS_MIB,
                    &format!("{:.1} MiB", mib(with_subscribers)),
                ),
                bindery_tests::bench::goal(
                    &format!(
                        "after eviction, within {:.0} % of idle",
                        GOAL_EVICTED * 100.0
                    ),
                    gone && over_idle <= GOAL_EVICTED,
                    &format!("{:+.1} %", over_idle * 100.0),
                ),
            ];
        }
        if sessions == GOAL_COUNT && subscribers == GOAL_COUNT {
            goals.iter().for_each(|g| println!("{g}"));
        } else {
            println!("goals: stated for {GOAL_COUNT} sessions and streams, not judged here");
        }
        drop(sidecar);
    });
}

/// One session with its secret, and its event stream opened and closed.
async fn warm_up(api: &Api) {
    let body = json!({"agent": "invoices", "params": {
        "tenant": "warm-up", "billing_token": "secret-warm-up",
    }});
    let r = api
        .call("POST", "/v1/sessions", Some(OWNER), Some(&body))
        .await;
    let id = r.json["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let stream = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    drop(stream);
    let _ = live_count(api).await;
}

/// How long resident memory must go without a new low (by more than 64
/// KiB) to count as settled: longer than the server's periodic work, whose
/// slowest part, the heartbeat (every 10 s by default), reads the store.
const SETTLE: Duration = Duration::from_secs(12);

/// Resident memory once it has gone [`SETTLE`] without a new low (or after
/// two minutes): the last reading, and the lowest on the way. The lowest
/// comes just after a release, before the server's periodic work takes
/// some memory again; taking it for the settled value once hid 1.7 MiB
/// that a heartbeat's read of the whole session table took back.
async fn settled_rss(pid: u32) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = rss_kib(pid);
    let mut low = last;
    let mut since = Instant::now();
    while since.elapsed() < SETTLE && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        last = rss_kib(pid);
        if last + 64 < low {
            since = Instant::now();
        }
        low = low.min(last);
    }
    (last, low)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// KiB per item of the growth from `before` to `after`.
fn per(after: u64, before: u64, items: usize) -> f64 {
    after.saturating_sub(before) as f64 / items.max(1) as f64
}

/// Resident memory of a live process, in KiB.
/// `RssAnon` and `RssFile` of `/proc/PID/status`, for the breakdown.
fn rss_parts(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or("?".to_string(), |v| v.trim().to_string())
    };
    format!(
        "heap and stacks {}, code and files {}",
        field("RssAnon:"),
        field("RssFile:")
    )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `bindery_sessions_live` from the server's /metrics.
async fn live_count(api: &Api) -> u64 {
    let r = api.call("GET", "/metrics", None, None).await;
    r.text
        .lines()
        .find_map(|l| l.strip_prefix("bindery_sessions_live "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(u64::MAX, |v| v as u64)
}

/// Until the server has `want` live sessions; false if not within `limit`.
async fn wait_live(api: &Api, want: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if live_count(api).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Every stream is an open file in both processes: say so up front when
/// the limit (`ulimit -n`, which the server inherits) is too low.
fn check_open_files(streams: usize) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft: Option<u64> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    if let Some(soft) = soft.filter(|&s| s < streams as u64 + 200) {
        println!(
            "note: `ulimit -n` is {soft}: fewer than {streams} streams will open; \
             raise it or lower MEMORY_SUBSCRIBERS"
        );
    }
}
