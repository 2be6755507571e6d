//! What Bindery adds on top of the work it orchestrates, as ratios.
//!
//! Run it with
//!
//! ```text
//! CARGO_TARGET_DIR=target/bench cargo bench -j1 -p bindery-sidecar --bench overhead
//! ```
//!
//! `cargo bench` builds the sidecar in the release profile (the first build
//! takes minutes on two cores; the measurement itself a few seconds). This
//! is a plain `main` (`harness = false`, `test = false`): `cargo test` never
//! builds nor runs it, and nothing in it asserts a timing. It warms up, then
//! measures two things and prints a small table.
//!
//! - **Session round trip.** The real `bindery-sidecar serve`, over TCP,
//!   against the scripted mock LLM, which answers every request after a
//!   fixed delay ([`MODEL_DELAY`]): first with a call of
//!   `bash_query-invoices`, then with an answer. One
//!   `POST /v1/sessions/:id/messages?wait=true` is therefore two model turns
//!   and one tool run, and the model alone accounts for
//!   `MODEL_TURNS × MODEL_DELAY`. The ratio is the wall time of a round trip
//!   over that model time (x1.00 would be a sidecar that costs nothing); the
//!   `+N ms` is the absolute overhead: the HTTP API, authentication, the
//!   session store, the run loop, the LLM client (and the mock's own JSON
//!   work) and the tool run. "The rest" subtracts the tool script's own run
//!   time (the direct median below) from that overhead. It is measured with
//!   the model's answers streamed (the default) and with `serve --no-stream`.
//! - **Tool-call dispatch.** `bash_query-invoices` run through the bindings
//!   (the agent loaded with [`bindery_sidecar::tree::load`], then
//!   `BoundTool::call`, as `bindery-sidecar tool-call` does) against a direct
//!   `std::process::Command` fork+exec of the same script with the same
//!   arguments and `TOKEN`, interleaved. The ratio is bound over direct:
//!   what binding, argument checks, redacted tracing and async process
//!   handling cost on top of starting bash (x1.00: nothing).
//!
//! Where a streamed round trip's time goes comes from the server's own
//! `/metrics`, read before and after the measured round trips: the time of
//! each session store operation (`bindery_store_operation_seconds_total`),
//! the LLM client's requests beyond the model's delay
//! (`bindery_llm_request_duration_seconds`), the event fan-out
//! (`bindery_event_fanout_seconds_total`), the tool script's own run (the
//! direct median), and the rest (HTTP, the run loop, the tool's process
//! handling), as averages per round trip.
//!
//! Medians are the headline; p90 shows the spread. The machine's load
//! average is printed too: on a shared two-core machine other work moves
//! the numbers by milliseconds, so compare runs made under similar load.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bindery_sidecar::params::{ApiKeys, ProcessValues};
use bindery_sidecar::tools::bash::Limits;
use bindery_sidecar::tools::CallContext;
use bindery_sidecar::tree::{self, AgentSources, LoadOptions};
use common::{tool_then_answer, World, CANARY, OWNER};
use serde_json::json;

/// How long the mock LLM takes to answer each request.
const MODEL_DELAY: Duration = Duration::from_millis(20);
/// Model turns per round trip: the tool call, then the answer.
const MODEL_TURNS: u32 = 2;
const WARMUP_ROUND_TRIPS: usize = 5;
const ROUND_TRIPS: usize = 30;
const WARMUP_TOOL_CALLS: usize = 5;
const TOOL_CALLS: usize = 50;

const TENANT: &str = "acme-corp";
const TOOL: &str = "bash_query-invoices";
/// What the tool prints for [`TENANT`]'s overdue invoices.
const EXPECTED: &str = "2026-10-01\tINV-1002\t850.50 EUR\toverdue\n";

fn main() {
    // `cargo bench` passes `--bench` (and any filter); there is nothing to select.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started = Instant::now();
    let (streamed, spent) = rt.block_on(round_trips(true));
    let streamed = Stats::of(streamed);
    let unstreamed = Stats::of(rt.block_on(round_trips(false)).0);
    let (bound, direct) = rt.block_on(tool_dispatch());
    let (bound, direct) = (Stats::of(bound), Stats::of(direct));
    let elapsed = started.elapsed();

    let model = MODEL_DELAY * MODEL_TURNS;
    println!();
    println!(
        "bindery-sidecar overhead, after warm-up: {ROUND_TRIPS} round trips per mode \
         (model {} per turn, {MODEL_TURNS} turns), {TOOL_CALLS} tool calls each way",
        ms(MODEL_DELAY)
    );
    for (name, trip) in [
        ("round trip:          ", &streamed),
        ("round trip no-stream:", &unstreamed),
    ] {
        println!(
            "{name} median {} over model {} -> x{:.2} ({})",
            ms(trip.median),
            ms(model),
            ratio(trip.median, model),
            ms_diff(trip.median, model),
        );
        println!(
            "{:21}    p90 {} over model {} -> x{:.2} ({})",
            "",
            ms(trip.p90),
            ms(model),
            ratio(trip.p90, model),
            ms_diff(trip.p90, model),
        );
        println!(
            "{:21}    of which the script's own run (direct median): {}; the rest: {}",
            "",
            ms(direct.median),
            ms_signed(
                trip.median.as_secs_f64() - model.as_secs_f64() - direct.median.as_secs_f64()
            ),
        );
    }
    spent.print(&direct);
    println!(
        "tool call:            median {} bound over {} direct -> x{:.2} ({})",
        ms(bound.median),
        ms(direct.median),
        ratio(bound.median, direct.median),
        ms_diff(bound.median, direct.median),
    );
    println!(
        "{:21}    p90 {} bound over {} direct -> x{:.2} ({})",
        "",
        ms(bound.p90),
        ms(direct.p90),
        ratio(bound.p90, direct.p90),
        ms_diff(bound.p90, direct.p90),
    );
    println!(
        "measured in {:.1} s; load average before: {}",
        elapsed.as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// (a) Wall time of `POST /v1/sessions/:id/messages?wait=true`, each a tool
/// call and an answer from a mock that waits [`MODEL_DELAY`] per request;
/// the sidecar asks the model for event streams unless `stream` is false
/// (`serve --no-stream`).
async fn round_trips(stream: bool) -> (Vec<Duration>, Spent) {
    let w = World::new(|req| tool_then_answer(req).delayed(MODEL_DELAY)).await;
    let pin = format!("tenant={TENANT}");
    let mut flags = vec!["--pin", pin.as_str()];
    if !stream {
        flags.push("--no-stream");
    }
    let (sidecar, api) = w.start(&flags, &[]);
    let id = common::new_session(
        &api,
        json!({"agent": "invoices", "params": {"billing_token": CANARY}}),
    )
    .await;
    let path = format!("/v1/sessions/{id}/messages?wait=true");
    let body = json!({"prompt": "which invoices are overdue?"});

    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    let mut before = Scrape::default();
    for i in 0..WARMUP_ROUND_TRIPS + ROUND_TRIPS {
        if i == WARMUP_ROUND_TRIPS {
            before = Scrape::of(&api).await;
        }
        let t = Instant::now();
        let reply = api.call("POST", &path, Some(OWNER), Some(&body)).await;
        let elapsed = t.elapsed();
        // Not a timing check: a run that failed would measure nothing.
        assert_eq!(reply.status, 200, "{}\n{}", reply.text, sidecar.logs());
        assert_eq!(reply.json["status"], "idle", "{}", reply.text);
        let turns = reply.json["session"]["turns"].as_array().expect("turns");
        let last = turns.last().expect("a last turn");
        assert_eq!(last["content"], format!("answer: {EXPECTED}"), "{last}");
        if i >= WARMUP_ROUND_TRIPS {
            samples.push(elapsed);
        }
    }
    let after = Scrape::of(&api).await;
    assert_eq!(
        w.mock.request_count(),
        MODEL_TURNS as usize * (WARMUP_ROUND_TRIPS + ROUND_TRIPS)
    );
    drop(sidecar);
    let mean = samples.iter().sum::<Duration>() / ROUND_TRIPS as u32;
    (samples, Spent::between(&before, &after, mean))
}

/// The server's `/metrics` samples: `name{labels}` to value.
#[derive(Default)]
struct Scrape(std::collections::BTreeMap<String, f64>);

impl Scrape {
    async fn of(api: &bindery_tests::sidecar::Api) -> Scrape {
        let r = api.call("GET", "/metrics", None, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        Scrape(
            r.text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.rsplit_once(' '))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or(0.0)
    }
}

/// Where the measured round trips' time went, per round trip (means).
struct Spent {
    round_trip: Duration,
    /// Store operation → (count, seconds).
    store: Vec<(String, f64, f64)>,
    llm_requests: f64,
    llm_seconds: f64,
    fanouts: f64,
    fanout_seconds: f64,
}

impl Spent {
    fn between(before: &Scrape, after: &Scrape, round_trip: Duration) -> Spent {
        let per = |key: &str| (after.get(key) - before.get(key)) / ROUND_TRIPS as f64;
        let prefix = "bindery_store_operations_total{op=\"";
        let store = after
            .0
            .keys()
            .filter_map(|k| k.strip_prefix(prefix)?.strip_suffix("\"}"))
            .map(|op| {
                (
                    op.to_string(),
                    per(&format!("{prefix}{op}\"}}")),
                    per(&format!(
                        "bindery_store_operation_seconds_total{{op=\"{op}\"}}"
                    )),
                )
            })
            .filter(|(_, n, _)| *n > 0.0)
            .collect();
        Spent {
            round_trip,
            store,
            llm_requests: per("bindery_llm_request_duration_seconds_count"),
            llm_seconds: per("bindery_llm_request_duration_seconds_sum"),
            fanouts: per("bindery_event_fanout_total"),
            fanout_seconds: per("bindery_event_fanout_seconds_total"),
        }
    }

    fn print(&self, direct: &Stats) {
        let model = (MODEL_DELAY * MODEL_TURNS).as_secs_f64();
        let store: f64 = self.store.iter().map(|(_, _, s)| s).sum();
        let tool = direct.median.as_secs_f64();
        let client = self.llm_seconds - model;
        let total = self.round_trip.as_secs_f64();
        let rest = total - model - store - client - self.fanout_seconds - tool;
        let line = |what: &str, secs: f64, note: String| {
            println!(
                "{:21}    {what:<24} {:>8} ({:>4.1}%) {note}",
                "",
                ms_signed(secs),
                100.0 * secs / total
            );
        };
        println!(
            "{:21}    where a streamed round trip's {} (mean) goes:",
            "",
            ms(self.round_trip)
        );
        line("the model", model, String::new());
        line(
            "the LLM client",
            client,
            format!(
                "{:.1} requests, beyond the model's delay (the mock's own work too)",
                self.llm_requests
            ),
        );
        line("the session store", store, String::new());
        for (op, n, secs) in &self.store {
            line(&format!("  {op}"), *secs, format!("{n:.1} per round trip"));
        }
        line(
            "the event fan-out",
            self.fanout_seconds,
            format!("{:.1} events", self.fanouts),
        );
        line("the tool script", tool, "its direct median".into());
        line(
            "the rest",
            rest,
            "HTTP, the run loop, the tool's process handling".into(),
        );
    }
}

/// (b) `bash_query-invoices` through the bindings and by a direct
/// fork+exec, interleaved (so that a change of machine load hits both
/// alike); returns (bound, direct) samples.
async fn tool_dispatch() -> (Vec<Duration>, Vec<Duration>) {
    let example = common::repo().join("examples/invoices");
    let mut process = ProcessValues::new();
    process
        .add_flag("--set", &format!("tenant={TENANT}"))
        .expect("a --set flag");
    let opts = LoadOptions {
        process,
        api_keys: ApiKeys::default(),
        limits: Limits::default(),
        skip_broken_scripts: false,
    };
    let tree = tree::load(
        &AgentSources::Files(vec![example.join("agent.yaml")]),
        &opts,
    )
    .await
    .unwrap_or_else(|e| panic!("the invoices example loads: {e}"));
    let agent = tree.pick(None).expect("one agent");
    let tool = agent.tool(TOOL).expect("the query-invoices tool");
    let values = agent.process_values();
    let ctx = CallContext {
        session_id: "bench".into(),
        conversation_id: "bench".into(),
        turn_id: "bench".into(),
        agent_id: agent.name.clone(),
        session_json: None,
    };
    let bound_call = || async {
        let t = Instant::now();
        let out = tool
            .call(json!({"status": "overdue"}), &values, &ctx)
            .await
            .expect("the bound call succeeds");
        let elapsed = t.elapsed();
        assert_eq!(out.text, EXPECTED);
        elapsed
    };

    // The same script, argv and token, with nothing in between.
    let script: PathBuf = example.join("tools/query-invoices");
    let token = std::fs::read_to_string(example.join("demo-billing-token"))
        .expect("the demo token")
        .trim_end()
        .to_string();
    let direct_call = || {
        let t = Instant::now();
        let out = Command::new(&script)
            .args(["run", "--tenant_id", TENANT, "--status", "overdue"])
            .env("TOKEN", &token)
            .output()
            .expect("the script runs");
        let elapsed = t.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), EXPECTED);
        elapsed
    };

    let mut bound = Vec::with_capacity(TOOL_CALLS);
    let mut direct = Vec::with_capacity(TOOL_CALLS);
    for i in 0..WARMUP_TOOL_CALLS + TOOL_CALLS {
        // Alternate which goes first, so neither always follows the other.
        let (b, d) = if i % 2 == 0 {
            let b = bound_call().await;
            (b, direct_call())
        } else {
            let d = direct_call();
            (bound_call().await, d)
        };
        if i >= WARMUP_TOOL_CALLS {
            bound.push(b);
            direct.push(d);
        }
    }
    (bound, direct)
}

struct Stats {
    median: Duration,
    p90: Duration,
}

impl Stats {
    /// Nearest-rank median and 90th percentile.
    fn of(mut samples: Vec<Duration>) -> Stats {
        assert!(!samples.is_empty());
        samples.sort();
        let rank = |p: f64| {
            let r = (p * samples.len() as f64).ceil() as usize;
            samples[r.clamp(1, samples.len()) - 1]
        };
        Stats {
            median: rank(0.5),
            p90: rank(0.9),
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn ms_signed(secs: f64) -> String {
    format!("{:+.1} ms", secs * 1e3)
}

/// `a - b` in ms, signed (a sample can beat the reference by noise).
fn ms_diff(a: Duration, b: Duration) -> String {
    ms_signed(a.as_secs_f64() - b.as_secs_f64())
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}
