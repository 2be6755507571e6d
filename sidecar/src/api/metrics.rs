//! Prometheus metrics, served at `GET /metrics`.
//!
//! Hand-rolled rather than taken from a crate: a handful of counters, one
//! gauge and one histogram, kept in atomics (or, for the series whose labels
//! are only known at run time, behind a mutex in a `BTreeMap` so that the
//! output comes out in a stable order). [`Metrics::render`] writes them in
//! the Prometheus text exposition format, version 0.0.4.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `bindery_runs_started_total` | counter | |
//! | `bindery_runs_total` | counter | `outcome` = `completed`, `failed`, `cancelled`, `max_steps` |
//! | `bindery_tool_calls_total` | counter | `tool`, `outcome` = `ok`, `error`, `unavailable` |
//! | `bindery_llm_requests_total` | counter | `outcome` = `ok`, `error` |
//! | `bindery_llm_request_duration_seconds` | histogram | |
//! | `bindery_sessions_live` | gauge | |
//! | `bindery_sessions_live_limit` | gauge | | (only with `--max-live-sessions`)
//! | `bindery_sessions_evicted_total` | counter | | (past `--max-live-sessions`)
//! | `bindery_http_requests_total` | counter | `route` (the route's pattern, not the path), `status` |
//! | `bindery_store_operations_total` | counter | `op` = `get`, `update`, `append_event`, … |
//! | `bindery_store_operation_seconds_total` | counter | `op`: the time those operations took |
//! | `bindery_event_fanout_total` | counter | | (events handed to a session's subscribers)
//! | `bindery_event_fanout_seconds_total` | counter | | (the time that took)

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::prom::{format_float, header, load, lock, sample, Histogram};

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use crate::prom::CONTENT_TYPE;

/// The upper bounds (seconds) of the LLM request duration histogram's
/// buckets; a last `+Inf` bucket follows.
pub const LLM_DURATION_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How a run of the agent loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// The model gave its final answer.
    Completed,
    /// An error ended the run.
    Failed,
    /// The run was cancelled.
    Cancelled,
    /// The run hit the agent's step limit.
    MaxSteps,
    /// The run stopped with tool calls waiting (a person, the client).
    Blocked,
}

impl RunOutcome {
    /// Every outcome, in the order they are rendered.
    pub const ALL: [RunOutcome; 5] = [
        RunOutcome::Completed,
        RunOutcome::Failed,
        RunOutcome::Cancelled,
        RunOutcome::MaxSteps,
        RunOutcome::Blocked,
    ];

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "completed",
            RunOutcome::Failed => "failed",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::MaxSteps => "max_steps",
            RunOutcome::Blocked => "blocked",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How one tool call went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolOutcome {
    /// The tool ran and succeeded.
    Ok,
    /// The tool ran and failed (or its arguments were rejected).
    Error,
    /// The model asked for a tool that is not there.
    Unavailable,
}

impl ToolOutcome {
    /// Every outcome, in the order they are rendered.
    pub const ALL: [ToolOutcome; 3] = [
        ToolOutcome::Ok,
        ToolOutcome::Error,
        ToolOutcome::Unavailable,
    ];

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Unavailable => "unavailable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The server's metrics. Every method takes `&self`; share one in an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    runs_started: AtomicU64,
    runs: [AtomicU64; RunOutcome::ALL.len()],
    /// Tool name → count per [`ToolOutcome`].
    tool_calls: Mutex<BTreeMap<String, [u64; ToolOutcome::ALL.len()]>>,
    llm_ok: AtomicU64,
    llm_error: AtomicU64,
    llm_duration: Histogram,
    sessions_live: AtomicU64,
    /// `--max-live-sessions`, if given (0: none).
    sessions_live_limit: AtomicU64,
    sessions_evicted: AtomicU64,
    /// Route → status → count.
    http_requests: Mutex<BTreeMap<String, BTreeMap<u16, u64>>>,
    /// Store operation → (count, nanoseconds).
    store_ops: Mutex<BTreeMap<&'static str, (u64, u64)>>,
    fanouts: AtomicU64,
    fanout_nanos: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            runs_started: AtomicU64::new(0),
            runs: Default::default(),
            tool_calls: Mutex::default(),
            llm_ok: AtomicU64::new(0),
            llm_error: AtomicU64::new(0),
            llm_duration: Histogram::new(&LLM_DURATION_BUCKETS),
            sessions_live: AtomicU64::new(0),
            sessions_live_limit: AtomicU64::new(0),
            sessions_evicted: AtomicU64::new(0),
            http_requests: Mutex::default(),
            store_ops: Mutex::default(),
            fanouts: AtomicU64::new(0),
            fanout_nanos: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// A fresh set of metrics, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A run of the agent loop started.
    pub fn run_started(&self) {
        self.runs_started.fetch_add(1, Ordering::Relaxed);
    }

    /// A run of the agent loop ended.
    pub fn run_finished(&self, outcome: RunOutcome) {
        self.runs[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The model called `tool`.
    pub fn tool_call(&self, tool: &str, outcome: ToolOutcome) {
        let mut map = lock(&self.tool_calls);
        match map.get_mut(tool) {
            Some(counts) => counts[outcome.index()] += 1,
            None => {
                let mut counts = [0; ToolOutcome::ALL.len()];
                counts[outcome.index()] = 1;
                map.insert(tool.to_owned(), counts);
            }
        }
    }

    /// One request to the LLM endpoint took `seconds` (retries included) and
    /// ended well or not. A negative or NaN duration counts as 0.
    pub fn llm_request(&self, seconds: f64, ok: bool) {
        self.llm_duration.observe(seconds);
        if ok {
            self.llm_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.llm_error.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many sessions are live right now.
    pub fn set_sessions_live(&self, n: u64) {
        self.sessions_live.store(n, Ordering::Relaxed);
    }

    /// At most this many sessions are live (`--max-live-sessions`).
    pub fn set_sessions_live_limit(&self, n: u64) {
        self.sessions_live_limit.store(n, Ordering::Relaxed);
    }

    /// A live session was evicted to stay within the limit.
    pub fn session_evicted(&self) {
        self.sessions_evicted.fetch_add(1, Ordering::Relaxed);
    }

    /// An HTTP request was answered. `route` is the route's pattern
    /// (`/v1/sessions/:id`), never the actual path, so that the number of
    /// series stays bounded.
    pub fn http_request(&self, route: &str, status: u16) {
        let mut map = lock(&self.http_requests);
        let statuses = match map.get_mut(route) {
            Some(statuses) => statuses,
            None => map.entry(route.to_owned()).or_default(),
        };
        *statuses.entry(status).or_insert(0) += 1;
    }

    /// A session store operation `op` took `took`.
    pub fn store_operation(&self, op: &'static str, took: std::time::Duration) {
        let mut map = lock(&self.store_ops);
        let entry = map.entry(op).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Handing one event to a session's subscribers took `took`.
    pub fn event_fanout(&self, took: std::time::Duration) {
        self.fanouts.fetch_add(1, Ordering::Relaxed);
        self.fanout_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Every metric, in the Prometheus text exposition format 0.0.4 (see
    /// [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);

        header(
            &mut out,
            "bindery_runs_started_total",
            "counter",
            "Runs of the agent loop started.",
        );
        sample(
            &mut out,
            "bindery_runs_started_total",
            &[],
            load(&self.runs_started),
        );

        header(
            &mut out,
            "bindery_runs_total",
            "counter",
            "Runs of the agent loop finished, by outcome.",
        );
        for outcome in RunOutcome::ALL {
            sample(
                &mut out,
                "bindery_runs_total",
                &[("outcome", outcome.as_str())],
                load(&self.runs[outcome.index()]),
            );
        }

        header(
            &mut out,
            "bindery_tool_calls_total",
            "counter",
            "Tool calls made by the model, by tool and outcome.",
        );
        for (tool, counts) in lock(&self.tool_calls).iter() {
            for outcome in ToolOutcome::ALL {
                let n = counts[outcome.index()];
                if n > 0 {
                    sample(
                        &mut out,
                        "bindery_tool_calls_total",
                        &[("tool", tool), ("outcome", outcome.as_str())],
                        n,
                    );
                }
            }
        }

        header(
            &mut out,
            "bindery_llm_requests_total",
            "counter",
            "Requests to the LLM endpoint, by outcome.",
        );
        sample(
            &mut out,
            "bindery_llm_requests_total",
            &[("outcome", "ok")],
            load(&self.llm_ok),
        );
        sample(
            &mut out,
            "bindery_llm_requests_total",
            &[("outcome", "error")],
            load(&self.llm_error),
        );

        header(
            &mut out,
            "bindery_llm_request_duration_seconds",
            "histogram",
            "Time taken by requests to the LLM endpoint, retries included.",
        );
        self.llm_duration
            .render(&mut out, "bindery_llm_request_duration_seconds");

        header(
            &mut out,
            "bindery_sessions_live",
            "gauge",
            "Sessions currently live.",
        );
        sample(
            &mut out,
            "bindery_sessions_live",
            &[],
            load(&self.sessions_live),
        );
        let limit = load(&self.sessions_live_limit);
        if limit > 0 {
            header(
                &mut out,
                "bindery_sessions_live_limit",
                "gauge",
                "At most this many sessions are live (--max-live-sessions).",
            );
            sample(&mut out, "bindery_sessions_live_limit", &[], limit);
            header(
                &mut out,
                "bindery_sessions_evicted_total",
                "counter",
                "Live sessions evicted (their secret values forgotten) to stay within the limit.",
            );
            sample(
                &mut out,
                "bindery_sessions_evicted_total",
                &[],
                load(&self.sessions_evicted),
            );
        }

        header(
            &mut out,
            "bindery_http_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
        );
        for (route, statuses) in lock(&self.http_requests).iter() {
            for (status, n) in statuses {
                sample(
                    &mut out,
                    "bindery_http_requests_total",
                    &[("route", route), ("status", &status.to_string())],
                    *n,
                );
            }
        }

        let seconds = |nanos: u64| format_float(nanos as f64 / 1e9);
        let store_ops = lock(&self.store_ops).clone();
        header(
            &mut out,
            "bindery_store_operations_total",
            "counter",
            "Session store operations, by operation.",
        );
        for (op, (n, _)) in &store_ops {
            sample(
                &mut out,
                "bindery_store_operations_total",
                &[("op", op)],
                *n,
            );
        }
        header(
            &mut out,
            "bindery_store_operation_seconds_total",
            "counter",
            "The time session store operations took, by operation.",
        );
        for (op, (_, nanos)) in &store_ops {
            let _ = writeln!(
                out,
                "bindery_store_operation_seconds_total{{op=\"{op}\"}} {}",
                seconds(*nanos)
            );
        }
        header(
            &mut out,
            "bindery_event_fanout_total",
            "counter",
            "Events handed to a session's subscribers in this server.",
        );
        sample(
            &mut out,
            "bindery_event_fanout_total",
            &[],
            load(&self.fanouts),
        );
        header(
            &mut out,
            "bindery_event_fanout_seconds_total",
            "counter",
            "The time handing events to subscribers took.",
        );
        let _ = writeln!(
            out,
            "bindery_event_fanout_seconds_total {}",
            seconds(load(&self.fanout_nanos))
        );

        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::prom::{escape_help, escape_label_value};

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    fn has_line(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn store_operations_and_the_event_fanout_are_counted_with_their_time() {
        let m = Metrics::new();
        let text = m.render();
        assert!(has_line(&text, "bindery_event_fanout_total 0"), "{text}");
        assert!(
            has_line(&text, "bindery_event_fanout_seconds_total 0"),
            "{text}"
        );
        assert!(!text.contains("bindery_store_operations_total{"), "{text}");
        m.store_operation("get", std::time::Duration::from_millis(2));
        m.store_operation("get", std::time::Duration::from_millis(3));
        m.store_operation("update", std::time::Duration::from_micros(500));
        m.event_fanout(std::time::Duration::from_micros(250));
        let text = m.render();
        for line in [
            "bindery_store_operations_total{op=\"get\"} 2",
            "bindery_store_operations_total{op=\"update\"} 1",
            "bindery_store_operation_seconds_total{op=\"get\"} 0.005",
            "bindery_store_operation_seconds_total{op=\"update\"} 0.0005",
            "bindery_event_fanout_total 1",
            "bindery_event_fanout_seconds_total 0.00025",
        ] {
            assert!(has_line(&text, line), "{line} not in:\n{text}");
        }
    }

    #[test]
    fn metrics_is_send_and_sync() {
        fn check<T: Send + Sync + Default>() {}
        check::<Metrics>();
    }

    #[test]
    fn fresh_metrics_render_zeroes() {
        let text = Metrics::new().render();
        assert!(has_line(&text, "bindery_runs_started_total 0"));
        for outcome in ["completed", "failed", "cancelled", "max_steps", "blocked"] {
            assert!(has_line(
                &text,
                &format!("bindery_runs_total{{outcome=\"{outcome}\"}} 0")
            ));
        }
        assert!(has_line(&text, "bindery_sessions_live 0"));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_bucket{le=\"+Inf\"} 0"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_sum 0"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_count 0"
        ));
        // Families without a series yet still say what they are.
        assert!(has_line(&text, "# TYPE bindery_tool_calls_total counter"));
        assert!(!text.contains("bindery_tool_calls_total{"));
    }

    #[test]
    fn counters_render_exact_lines() {
        let m = Metrics::new();
        m.run_started();
        m.run_started();
        m.run_finished(RunOutcome::Completed);
        m.run_finished(RunOutcome::MaxSteps);
        m.run_finished(RunOutcome::MaxSteps);
        m.tool_call("shell", ToolOutcome::Ok);
        m.tool_call("shell", ToolOutcome::Ok);
        m.tool_call("shell", ToolOutcome::Error);
        m.tool_call("fetch", ToolOutcome::Unavailable);
        m.set_sessions_live(7);
        m.http_request("/v1/sessions/:id", 200);
        m.http_request("/v1/sessions/:id", 200);
        m.http_request("/v1/sessions/:id", 404);
        m.http_request("/healthz", 200);
        let text = m.render();

        let runs: Vec<&str> = lines(&text)
            .into_iter()
            .filter(|l| l.starts_with("bindery_runs"))
            .collect();
        assert_eq!(
            runs,
            [
                "bindery_runs_started_total 2",
                "bindery_runs_total{outcome=\"completed\"} 1",
                "bindery_runs_total{outcome=\"failed\"} 0",
                "bindery_runs_total{outcome=\"cancelled\"} 0",
                "bindery_runs_total{outcome=\"max_steps\"} 2",
                "bindery_runs_total{outcome=\"blocked\"} 0",
            ]
        );

        let tools: Vec<&str> = lines(&text)
            .into_iter()
            .filter(|l| l.starts_with("bindery_tool_calls_total"))
            .collect();
        assert_eq!(
            tools,
            [
                "bindery_tool_calls_total{tool=\"fetch\",outcome=\"unavailable\"} 1",
                "bindery_tool_calls_total{tool=\"shell\",outcome=\"ok\"} 2",
                "bindery_tool_calls_total{tool=\"shell\",outcome=\"error\"} 1",
            ]
        );

        let http: Vec<&str> = lines(&text)
            .into_iter()
            .filter(|l| l.starts_with("bindery_http_requests_total"))
            .collect();
        assert_eq!(
            http,
            [
                "bindery_http_requests_total{route=\"/healthz\",status=\"200\"} 1",
                "bindery_http_requests_total{route=\"/v1/sessions/:id\",status=\"200\"} 2",
                "bindery_http_requests_total{route=\"/v1/sessions/:id\",status=\"404\"} 1",
            ]
        );

        assert!(has_line(&text, "bindery_sessions_live 7"));
        m.set_sessions_live(3);
        assert!(has_line(&m.render(), "bindery_sessions_live 3"));
    }

    #[test]
    fn help_and_type_lines() {
        let text = Metrics::new().render();
        let l = lines(&text);
        let at = l
            .iter()
            .position(|x| x.starts_with("# HELP bindery_runs_total "))
            .expect("HELP line");
        assert_eq!(l[at + 1], "# TYPE bindery_runs_total counter");
        assert_eq!(l[at + 2], "bindery_runs_total{outcome=\"completed\"} 0");
        assert!(has_line(
            &text,
            "# TYPE bindery_llm_request_duration_seconds histogram"
        ));
        assert!(has_line(&text, "# TYPE bindery_sessions_live gauge"));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.llm_request(0.003, true); // le 0.005
        m.llm_request(0.005, true); // le 0.005 (bounds are inclusive)
        m.llm_request(0.2, true); // le 0.25
        m.llm_request(1.0, false); // le 1
        m.llm_request(45.0, true); // le 60
        m.llm_request(120.0, false); // +Inf only
        let text = m.render();

        let hist: Vec<&str> = lines(&text)
            .into_iter()
            .filter(|l| l.starts_with("bindery_llm_request_duration_seconds"))
            .collect();
        assert_eq!(
            hist[..14],
            [
                "bindery_llm_request_duration_seconds_bucket{le=\"0.005\"} 2",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.01\"} 2",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.025\"} 2",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.05\"} 2",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.1\"} 2",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.25\"} 3",
                "bindery_llm_request_duration_seconds_bucket{le=\"0.5\"} 3",
                "bindery_llm_request_duration_seconds_bucket{le=\"1\"} 4",
                "bindery_llm_request_duration_seconds_bucket{le=\"2.5\"} 4",
                "bindery_llm_request_duration_seconds_bucket{le=\"5\"} 4",
                "bindery_llm_request_duration_seconds_bucket{le=\"10\"} 4",
                "bindery_llm_request_duration_seconds_bucket{le=\"30\"} 4",
                "bindery_llm_request_duration_seconds_bucket{le=\"60\"} 5",
                "bindery_llm_request_duration_seconds_bucket{le=\"+Inf\"} 6",
            ]
        );
        assert_eq!(hist.len(), 16);
        let sum: f64 = hist[14]
            .strip_prefix("bindery_llm_request_duration_seconds_sum ")
            .expect("sum line")
            .parse()
            .expect("sum value");
        assert!((sum - 166.208).abs() < 1e-9, "sum {sum}");
        assert_eq!(hist[15], "bindery_llm_request_duration_seconds_count 6");

        assert!(has_line(
            &text,
            "bindery_llm_requests_total{outcome=\"ok\"} 4"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_requests_total{outcome=\"error\"} 2"
        ));
    }

    #[test]
    fn odd_durations_do_not_poison_the_sum() {
        let m = Metrics::new();
        m.llm_request(f64::NAN, false);
        m.llm_request(-1.0, false);
        m.llm_request(f64::INFINITY, false);
        let text = m.render();
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_bucket{le=\"0.005\"} 2"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_bucket{le=\"+Inf\"} 3"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_sum 0"
        ));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.tool_call("we\"ird\\to\nol", ToolOutcome::Ok);
        let text = m.render();
        assert!(
            has_line(
                &text,
                r#"bindery_tool_calls_total{tool="we\"ird\\to\nol",outcome="ok"} 1"#
            ),
            "{text}"
        );
        assert_eq!(escape_label_value("plain"), "plain");
        assert_eq!(escape_label_value(r"a\b"), r"a\\b");
        assert_eq!(escape_help("two\nlines \\"), "two\\nlines \\\\");
    }

    #[test]
    fn concurrent_updates_are_all_counted() {
        let m = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.run_started();
                        m.tool_call("shell", ToolOutcome::Ok);
                        m.llm_request(0.5, true);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let text = m.render();
        assert!(has_line(&text, "bindery_runs_started_total 4000"));
        assert!(has_line(
            &text,
            "bindery_tool_calls_total{tool=\"shell\",outcome=\"ok\"} 4000"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_count 4000"
        ));
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_sum 2000"
        ));
    }

    /// A sample line, taken apart.
    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    }

    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn is_label_name(s: &str) -> bool {
        is_name(s) && !s.contains(':')
    }

    /// Parses `name{label="value",…} value` (labels optional), undoing the
    /// escapes in label values.
    fn parse_sample(line: &str) -> Result<Sample, String> {
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("no value: {line}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value {v:?}: {line}"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels: {line}"))?;
                (
                    name,
                    parse_labels(body).map_err(|e| format!("{e}: {line}"))?,
                )
            }
        };
        if !is_name(name) {
            return Err(format!("bad metric name {name:?}"));
        }
        Ok(Sample {
            name: name.to_owned(),
            labels,
            value,
        })
    }

    fn parse_labels(body: &str) -> Result<Vec<(String, String)>, String> {
        let mut labels = Vec::new();
        let mut rest = body;
        while !rest.is_empty() {
            let (label, after) = rest.split_once("=\"").ok_or("label without =\"")?;
            if !is_label_name(label) {
                return Err(format!("bad label name {label:?}"));
            }
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("unterminated label value".to_owned()),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((_, '\n')) => return Err("raw newline in label value".to_owned()),
                    Some((_, c)) => value.push(c),
                }
            };
            labels.push((label.to_owned(), value));
            rest = &after[end + 1..];
            if let Some(more) = rest.strip_prefix(',') {
                if more.is_empty() {
                    return Err("trailing comma".to_owned());
                }
                rest = more;
            } else if !rest.is_empty() {
                return Err(format!("junk after label value: {rest:?}"));
            }
        }
        Ok(labels)
    }

    #[test]
    fn every_line_parses() {
        let m = Metrics::new();
        m.run_started();
        m.run_finished(RunOutcome::Failed);
        m.run_finished(RunOutcome::Cancelled);
        m.tool_call("a\"b", ToolOutcome::Error);
        m.tool_call("x\ny\\z", ToolOutcome::Ok);
        m.llm_request(0.07, true);
        m.llm_request(3.0, false);
        m.set_sessions_live(2);
        m.http_request("/v1/sessions/:id/events", 200);
        m.http_request("/v1/sessions", 401);
        let text = m.render();

        let mut typed: BTreeMap<String, String> = BTreeMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut parts = comment.splitn(3, ' ');
                let (keyword, name, rest) = (parts.next(), parts.next(), parts.next());
                let name = name.expect("comment names a metric");
                assert!(is_name(name), "{line}");
                match keyword {
                    Some("HELP") => assert!(rest.is_some_and(|h| !h.is_empty()), "{line}"),
                    Some("TYPE") => {
                        let kind = rest.expect("TYPE has a type");
                        assert!(
                            ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                            "{line}"
                        );
                        let before = typed.insert(name.to_owned(), kind.to_owned());
                        assert!(before.is_none(), "TYPE twice for {name}");
                    }
                    _ => panic!("unexpected comment: {line}"),
                }
                continue;
            }
            assert!(!line.is_empty(), "empty line in output");
            let sample = parse_sample(line).unwrap_or_else(|e| panic!("{e}"));
            // Every sample belongs to a family declared before it.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    sample
                        .name
                        .strip_suffix(suffix)
                        .filter(|base| typed.get(*base).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(&sample.name);
            assert!(typed.contains_key(family), "undeclared: {line}");
            assert!(sample.value >= 0.0, "{line}");
            samples.push(sample);
        }

        assert_eq!(typed.len(), 11);
        let tool_values: Vec<&str> = samples
            .iter()
            .filter(|s| s.name == "bindery_tool_calls_total")
            .map(|s| s.labels[0].1.as_str())
            .collect();
        assert_eq!(tool_values, ["a\"b", "x\ny\\z"]);
        let routes: Vec<(&str, &str)> = samples
            .iter()
            .filter(|s| s.name == "bindery_http_requests_total")
            .map(|s| (s.labels[0].1.as_str(), s.labels[1].1.as_str()))
            .collect();
        assert_eq!(
            routes,
            [("/v1/sessions", "401"), ("/v1/sessions/:id/events", "200")]
        );
    }
}
