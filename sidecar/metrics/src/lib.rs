//! The server's Prometheus metrics: what sessions, runs, tools and the
//! model client record, kept in a `prometheus-client` registry.
//!
//! This sits below the session layer, so runs record into it directly;
//! `api` only encodes it at `GET /metrics` (OpenMetrics text, which
//! Prometheus scrapes natively).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `bindery_runs_started_total` | counter | |
//! | `bindery_runs_total` | counter | `outcome` = `completed`, `failed`, `cancelled`, `max_steps`, `blocked` |
//! | `bindery_tool_calls_total` | counter | `tool` (`<unknown>` for a name the agent does not have), `outcome` = `ok`, `error`, `unavailable`, `caller` = `model`, `mcp` (an MCP client's `tools/call` of an exposed tool), `agent` (whose model made the call: a helper's own) |
//! | `bindery_llm_requests_total` | counter | `outcome` = `ok`, `error` |
//! | `bindery_model_tokens_total` | counter | `agent` (the session's), `model`, `kind` = `prompt`, `completion` (an estimate where the model reported none) |
//! | `bindery_model_fallbacks_total` | counter | `agent`, `from` (the model passed over), `to` (the one tried next) |
//! | `bindery_model_cost_total` | counter | `agent`, `model`, `currency` (by `spec.model.pricing`; models without a price are not counted) |
//! | `bindery_budget_remaining` | gauge | `agent`, `budget`: what was left after this server's last use against it (a rolling budget's window moves on meanwhile) |
//! | `bindery_approval_notices_total` | counter | `outcome` = `delivered`, `retried` (an attempt that failed and is tried again), `failed` (for good) |
//! | `bindery_llm_request_duration_seconds` | histogram | |
//! | `bindery_tool_call_duration_seconds` | histogram | | (calls that ran: from the call's dispatch to its result, bindings and the tool's process or request included; a budget's refusal or a call held for approval is not timed)
//! | `bindery_tool_processes_running` | gauge | | (bash tools' calls with a process now)
//! | `bindery_tool_processes_waiting` | gauge | | (calls waiting for a slot: `--max-tool-processes`, `--max-tool-processes-per-run`)
//! | `bindery_sessions_live` | gauge | |
//! | `bindery_sessions_live_limit` | gauge | | (only with `--max-live-sessions`)
//! | `bindery_sessions_evicted_total` | counter | | (only with `--max-live-sessions`)
//! | `bindery_http_requests_total` | counter | `route` (the route's pattern, not the path), `status` |
//! | `bindery_rate_limited_total` | counter | `scope` = `tenant` (the server's requests per minute), `user` (an end user's), `tool` (a tool's calls): what a rate limit refused |
//! | `bindery_store_operations_total` | counter | `op` = `get`, `update`, `append_event`, … |
//! | `bindery_store_operation_seconds_total` | counter | `op`: the time those operations took |
//! | `bindery_event_fanout_total` | counter | | (events handed to a session's subscribers)
//! | `bindery_event_fanout_seconds_total` | counter | | (the time that took)
//! | `bindery_run_store_wait_seconds_total` | counter | | (the time runs stood still waiting for the session store; its writes made while the model works are not counted)

#![forbid(unsafe_code)]

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `seconds`, or 0 for what a clock gone wrong measured, so that it
/// cannot poison a histogram's sum.
fn finite(seconds: f64) -> f64 {
    if seconds.is_finite() && seconds >= 0.0 {
        seconds
    } else {
        0.0
    }
}

/// How many tool calls have a process now, and how many wait for a slot
/// (clones share them).
#[derive(Clone, Debug, Default)]
pub struct ToolProcessGauges {
    running: Gauge,
    waiting: Gauge,
}

impl ToolProcessGauges {
    /// A call begins to wait for a slot; it waits no more when the guard goes.
    pub fn waiting(&self) -> GaugeHeld {
        GaugeHeld::on(&self.waiting)
    }

    /// A call's process runs; it runs no more when the guard goes.
    pub fn running(&self) -> GaugeHeld {
        GaugeHeld::on(&self.running)
    }
}

/// One counted in a gauge while it lives.
#[derive(Debug)]
pub struct GaugeHeld(Gauge);

impl GaugeHeld {
    fn on(g: &Gauge) -> GaugeHeld {
        g.inc();
        GaugeHeld(g.clone())
    }
}

impl Drop for GaugeHeld {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `tool` label of calls to a tool the agent does not have.
pub const UNKNOWN_TOOL: &str = "<unknown>";

/// The upper bounds (seconds) of the LLM request and tool call duration
/// histograms' buckets; a last `+Inf` bucket follows.
pub const DURATION_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How a run of the agent loop ended (a `run_finished` event's `status`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
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
    /// Every outcome; each has a series from the start.
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

/// Who made a tool call: the agent's model, or an MCP client calling an
/// exposed tool directly (`/mcp`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ToolCaller {
    #[default]
    Model,
    Mcp,
}

impl ToolCaller {
    /// The `caller` label value, and the field of the `tool_call` span.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCaller::Model => "model",
            ToolCaller::Mcp => "mcp",
        }
    }
}

impl ToolOutcome {
    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Unavailable => "unavailable",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCall {
    tool: String,
    outcome: &'static str,
    caller: &'static str,
    agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelTokens {
    agent: String,
    model: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelFallback {
    agent: String,
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelCost {
    agent: String,
    model: String,
    currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    agent: String,
    budget: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreOp {
    op: &'static str,
}

/// A counter of seconds.
type Seconds = Counter<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RateScope {
    scope: &'static str,
}

/// Which rate limit refused something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimited {
    /// The server's (tenant's) requests per minute.
    Tenant,
    /// One end user's requests per minute.
    User,
    /// A tool's calls per minute.
    Tool,
}

impl RateLimited {
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimited::Tenant => "tenant",
            RateLimited::User => "user",
            RateLimited::Tool => "tool",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpRequest {
    route: String,
    status: u16,
}

/// The server's metrics. Every method takes `&self`; share one in an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Registered only once `--max-live-sessions` is given, so a server
    /// without a limit shows no limit.
    limit_registry: Registry,
    runs_started: Counter,
    runs: Family<Outcome, Counter>,
    tool_calls: Family<ToolCall, Counter>,
    approval_notices: Family<Outcome, Counter>,
    llm_requests: Family<Outcome, Counter>,
    model_tokens: Family<ModelTokens, Counter>,
    model_fallbacks: Family<ModelFallback, Counter>,
    model_cost: Family<ModelCost, Counter<f64, std::sync::atomic::AtomicU64>>,
    budget_remaining: Family<BudgetLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    llm_duration: Histogram,
    tool_duration: Histogram,
    sessions_live: Gauge,
    sessions_live_limit: Gauge,
    sessions_evicted: Counter,
    tool_processes: ToolProcessGauges,
    http_requests: Family<HttpRequest, Counter>,
    rate_limited: Family<RateScope, Counter>,
    store_ops: Family<StoreOp, Counter>,
    store_seconds: Family<StoreOp, Seconds>,
    fanouts: Counter,
    fanout_seconds: Seconds,
    run_store_wait: Seconds,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            limit_registry: Registry::default(),
            runs_started: Counter::default(),
            runs: Family::default(),
            tool_calls: Family::default(),
            approval_notices: Family::default(),
            llm_requests: Family::default(),
            model_tokens: Family::default(),
            model_fallbacks: Family::default(),
            model_cost: Family::default(),
            budget_remaining: Family::default(),
            llm_duration: Histogram::new(DURATION_BUCKETS),
            tool_duration: Histogram::new(DURATION_BUCKETS),
            sessions_live: Gauge::default(),
            sessions_live_limit: Gauge::default(),
            sessions_evicted: Counter::default(),
            tool_processes: ToolProcessGauges::default(),
            http_requests: Family::default(),
            rate_limited: Family::default(),
            store_ops: Family::default(),
            store_seconds: Family::default(),
            fanouts: Counter::default(),
            fanout_seconds: Seconds::default(),
            run_store_wait: Seconds::default(),
        };
        // Series that exist from the start, at 0, so a rate() over them
        // needs no first event.
        for outcome in RunOutcome::ALL {
            drop(m.runs.get_or_create(&Outcome {
                outcome: outcome.as_str(),
            }));
        }
        for outcome in ["ok", "error"] {
            drop(m.llm_requests.get_or_create(&Outcome { outcome }));
        }
        m.registered()
    }
}

impl Metrics {
    /// A fresh set of metrics, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "bindery_runs_started",
            "Runs of the agent loop started",
            self.runs_started.clone(),
        );
        r.register(
            "bindery_runs",
            "Runs of the agent loop finished, by outcome",
            self.runs.clone(),
        );
        r.register(
            "bindery_tool_calls",
            "Tool calls, by tool, outcome, caller (the model or an MCP client) and agent",
            self.tool_calls.clone(),
        );
        r.register(
            "bindery_approval_notices",
            "Attempts to deliver approval webhook notices, by outcome",
            self.approval_notices.clone(),
        );
        r.register(
            "bindery_llm_requests",
            "Requests to the LLM endpoint, by outcome",
            self.llm_requests.clone(),
        );
        r.register(
            "bindery_model_tokens",
            "Tokens of model requests, by the session's agent, model and kind (prompt, completion)",
            self.model_tokens.clone(),
        );
        r.register(
            "bindery_model_fallbacks",
            "Models passed over for their next fallback, by agent, the model and the next",
            self.model_fallbacks.clone(),
        );
        r.register(
            "bindery_model_cost",
            "What model requests cost by the model's pricing, by agent, model and currency",
            self.model_cost.clone(),
        );
        r.register(
            "bindery_budget_remaining",
            "What a budget had left after this server's last use against it",
            self.budget_remaining.clone(),
        );
        r.register(
            "bindery_llm_request_duration_seconds",
            "Time taken by requests to the LLM endpoint, retries included",
            self.llm_duration.clone(),
        );
        r.register(
            "bindery_tool_call_duration_seconds",
            "Time taken by tool calls that ran, from dispatch to result",
            self.tool_duration.clone(),
        );
        r.register(
            "bindery_sessions_live",
            "Sessions currently live",
            self.sessions_live.clone(),
        );
        r.register(
            "bindery_http_requests",
            "HTTP requests answered, by route and status",
            self.http_requests.clone(),
        );
        r.register(
            "bindery_rate_limited",
            "Requests and tool calls a rate limit refused, by the limit's scope",
            self.rate_limited.clone(),
        );
        r.register(
            "bindery_store_operations",
            "Session store operations, by operation",
            self.store_ops.clone(),
        );
        r.register(
            "bindery_store_operation_seconds",
            "The time session store operations took, by operation",
            self.store_seconds.clone(),
        );
        r.register(
            "bindery_event_fanout",
            "Events handed to a session's subscribers in this server",
            self.fanouts.clone(),
        );
        r.register(
            "bindery_event_fanout_seconds",
            "The time handing events to subscribers took",
            self.fanout_seconds.clone(),
        );
        r.register(
            "bindery_run_store_wait_seconds",
            "The time runs stood still waiting for the session store",
            self.run_store_wait.clone(),
        );
        r.register(
            "bindery_tool_processes_running",
            "Bash tools' calls with a process running now",
            self.tool_processes.running.clone(),
        );
        r.register(
            "bindery_tool_processes_waiting",
            "Bash tools' calls waiting for a slot (--max-tool-processes, --max-tool-processes-per-run)",
            self.tool_processes.waiting.clone(),
        );
        let l = &mut self.limit_registry;
        l.register(
            "bindery_sessions_live_limit",
            "At most this many sessions are live (--max-live-sessions)",
            self.sessions_live_limit.clone(),
        );
        l.register(
            "bindery_sessions_evicted",
            "Live sessions evicted (their secret values forgotten) to stay within the limit",
            self.sessions_evicted.clone(),
        );
        self
    }

    /// What the bound on tool processes reports to.
    pub fn tool_processes(&self) -> ToolProcessGauges {
        self.tool_processes.clone()
    }

    /// A run of the agent loop started.
    pub fn run_started(&self) {
        self.runs_started.inc();
    }

    /// A run of the agent loop ended.
    pub fn run_finished(&self, outcome: RunOutcome) {
        self.runs
            .get_or_create(&Outcome {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// The model called `tool`.
    pub fn tool_call(&self, agent: &str, tool: &str, outcome: ToolOutcome, caller: ToolCaller) {
        self.tool_calls
            .get_or_create(&ToolCall {
                tool: tool.to_owned(),
                outcome: outcome.as_str(),
                caller: caller.as_str(),
                agent: agent.to_owned(),
            })
            .inc();
    }

    /// A tool call that ran took `seconds`, from its dispatch to its result
    /// (a duration that is not finite and non-negative counts as 0).
    pub fn tool_call_duration(&self, seconds: f64) {
        self.tool_duration.observe(finite(seconds));
    }

    /// An approval notice was delivered, will be tried again, or failed for good.
    pub fn approval_notice(&self, outcome: &'static str) {
        self.approval_notices
            .get_or_create(&Outcome { outcome })
            .inc();
    }

    /// One request to the LLM endpoint took `seconds` (retries included) and
    /// ended well or not. A duration that is not a finite, non-negative
    /// number (a clock gone wrong) counts as 0, so it cannot poison the sum.
    pub fn llm_request(&self, seconds: f64, ok: bool) {
        self.llm_duration.observe(finite(seconds));
        let outcome = if ok { "ok" } else { "error" };
        self.llm_requests.get_or_create(&Outcome { outcome }).inc();
    }

    /// A model request of a session of `agent` used these tokens, costing
    /// `cost` in `currency` (`""`: the model has no price).
    /// Agent `agent`'s model `from` failed and `to`, its next fallback,
    /// was tried.
    pub fn model_fallback(&self, agent: &str, from: &str, to: &str) {
        self.model_fallbacks
            .get_or_create(&ModelFallback {
                agent: agent.to_owned(),
                from: from.to_owned(),
                to: to.to_owned(),
            })
            .inc();
    }

    pub fn model_usage(
        &self,
        agent: &str,
        model: &str,
        prompt: u64,
        completion: u64,
        cost: f64,
        currency: &str,
    ) {
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            self.model_tokens
                .get_or_create(&ModelTokens {
                    agent: agent.to_owned(),
                    model: model.to_owned(),
                    kind,
                })
                .inc_by(n);
        }
        if !currency.is_empty() && cost.is_finite() && cost >= 0.0 {
            self.model_cost
                .get_or_create(&ModelCost {
                    agent: agent.to_owned(),
                    model: model.to_owned(),
                    currency: currency.to_owned(),
                })
                .inc_by(cost);
        }
    }

    /// What budget `budget` of `agent` had left after a use.
    pub fn budget_remaining(&self, agent: &str, budget: &str, remaining: f64) {
        self.budget_remaining
            .get_or_create(&BudgetLabels {
                agent: agent.to_owned(),
                budget: budget.to_owned(),
            })
            .set(remaining.max(0.0));
    }

    /// How many sessions are live right now.
    pub fn set_sessions_live(&self, n: u64) {
        self.sessions_live.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// At most this many sessions are live (`--max-live-sessions`).
    pub fn set_sessions_live_limit(&self, n: u64) {
        self.sessions_live_limit
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A live session was evicted to stay within the limit.
    pub fn session_evicted(&self) {
        self.sessions_evicted.inc();
    }

    /// An HTTP request was answered. `route` is the route's pattern
    /// (`/v1/sessions/:id`), never the actual path, so that the number of
    /// series stays bounded.
    /// A rate limit of `scope` refused a request or a tool call.
    pub fn rate_limited(&self, scope: RateLimited) {
        self.rate_limited
            .get_or_create(&RateScope {
                scope: scope.as_str(),
            })
            .inc();
    }

    pub fn http_request(&self, route: &str, status: u16) {
        self.http_requests
            .get_or_create(&HttpRequest {
                route: route.to_owned(),
                status,
            })
            .inc();
    }

    /// A session store operation `op` took `took`.
    pub fn store_operation(&self, op: &'static str, took: std::time::Duration) {
        let label = StoreOp { op };
        self.store_ops.get_or_create(&label).inc();
        self.store_seconds
            .get_or_create(&label)
            .inc_by(took.as_secs_f64());
    }

    /// Handing one event to a session's subscribers took `took`.
    pub fn event_fanout(&self, took: std::time::Duration) {
        self.fanouts.inc();
        self.fanout_seconds.inc_by(took.as_secs_f64());
    }

    /// A run stood still for `took` until the store had what it wrote.
    pub fn run_store_wait(&self, took: std::time::Duration) {
        self.run_store_wait.inc_by(took.as_secs_f64());
    }

    /// Every metric, in the OpenMetrics text format (see [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if self.sessions_live_limit.get() > 0 {
            let _ = encode_registry(&mut out, &self.limit_registry);
        }
        let _ = encode_eof(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn has_line(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    /// The sample lines of one family, sorted (a family's series come out
    /// in no set order).
    fn series(text: &str, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn metrics_is_send_and_sync() {
        fn check<T: Send + Sync + Default>() {}
        check::<Metrics>();
    }

    #[test]
    fn fresh_metrics_render_zeroes() {
        let text = Metrics::new().render();
        assert!(has_line(&text, "bindery_runs_started_total 0"), "{text}");
        for outcome in ["completed", "failed", "cancelled", "max_steps", "blocked"] {
            assert!(
                has_line(
                    &text,
                    &format!("bindery_runs_total{{outcome=\"{outcome}\"}} 0")
                ),
                "{text}"
            );
        }
        assert!(has_line(&text, "bindery_sessions_live 0"), "{text}");
        assert!(
            has_line(
                &text,
                "bindery_llm_request_duration_seconds_bucket{le=\"+Inf\"} 0"
            ),
            "{text}"
        );
        assert!(has_line(
            &text,
            "bindery_llm_request_duration_seconds_count 0"
        ));
        // A family with labels shows its first series once it has one.
        assert!(!text.contains("bindery_tool_calls_total{"));
        // No limit given: no limit shown.
        assert!(!text.contains("bindery_sessions_live_limit"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn counters_render_exact_lines() {
        let m = Metrics::new();
        m.run_started();
        m.run_started();
        m.run_finished(RunOutcome::Completed);
        m.run_finished(RunOutcome::MaxSteps);
        m.run_finished(RunOutcome::MaxSteps);
        m.tool_call("a", "shell", ToolOutcome::Ok, ToolCaller::Model);
        m.tool_call("a", "shell", ToolOutcome::Ok, ToolCaller::Model);
        m.tool_call("a", "shell", ToolOutcome::Error, ToolCaller::Model);
        m.tool_call("a", "fetch", ToolOutcome::Unavailable, ToolCaller::Model);
        m.set_sessions_live(7);
        m.http_request("/v1/sessions/:id", 200);
        m.http_request("/v1/sessions/:id", 200);
        m.http_request("/v1/sessions/:id", 404);
        m.http_request("/healthz", 200);
        m.rate_limited(RateLimited::Tool);
        m.rate_limited(RateLimited::Tool);
        m.rate_limited(RateLimited::User);
        let text = m.render();

        assert_eq!(
            series(&text, "bindery_runs"),
            [
                "bindery_runs_started_total 2",
                "bindery_runs_total{outcome=\"blocked\"} 0",
                "bindery_runs_total{outcome=\"cancelled\"} 0",
                "bindery_runs_total{outcome=\"completed\"} 1",
                "bindery_runs_total{outcome=\"failed\"} 0",
                "bindery_runs_total{outcome=\"max_steps\"} 2",
            ]
        );
        assert_eq!(
            series(&text, "bindery_tool_calls_total"),
            [
                "bindery_tool_calls_total{tool=\"fetch\",outcome=\"unavailable\",caller=\"model\",agent=\"a\"} 1",
                "bindery_tool_calls_total{tool=\"shell\",outcome=\"error\",caller=\"model\",agent=\"a\"} 1",
                "bindery_tool_calls_total{tool=\"shell\",outcome=\"ok\",caller=\"model\",agent=\"a\"} 2",
            ]
        );
        assert_eq!(
            series(&text, "bindery_http_requests_total"),
            [
                "bindery_http_requests_total{route=\"/healthz\",status=\"200\"} 1",
                "bindery_http_requests_total{route=\"/v1/sessions/:id\",status=\"200\"} 2",
                "bindery_http_requests_total{route=\"/v1/sessions/:id\",status=\"404\"} 1",
            ]
        );
        assert_eq!(
            series(&text, "bindery_rate_limited_total"),
            [
                "bindery_rate_limited_total{scope=\"tool\"} 2",
                "bindery_rate_limited_total{scope=\"user\"} 1",
            ]
        );

        assert!(has_line(&text, "bindery_sessions_live 7"));
        m.set_sessions_live(3);
        assert!(has_line(&m.render(), "bindery_sessions_live 3"));
    }

    #[test]
    fn help_and_type_lines() {
        let text = Metrics::new().render();
        let l: Vec<&str> = text.lines().collect();
        let at = l
            .iter()
            .position(|x| x.starts_with("# HELP bindery_runs "))
            .expect("HELP line");
        assert_eq!(l[at + 1], "# TYPE bindery_runs counter");
        assert!(
            l[at + 2].starts_with("bindery_runs_total{outcome="),
            "{text}"
        );
        assert!(has_line(
            &text,
            "# TYPE bindery_llm_request_duration_seconds histogram"
        ));
        assert!(has_line(&text, "# TYPE bindery_sessions_live gauge"));
    }

    #[test]
    fn tool_processes_count_while_held() {
        let m = Metrics::new();
        let g = m.tool_processes();
        let (a, b) = (g.waiting(), g.running());
        let c = g.clone().running();
        let text = m.render();
        assert!(
            has_line(&text, "bindery_tool_processes_waiting 1"),
            "{text}"
        );
        assert!(
            has_line(&text, "bindery_tool_processes_running 2"),
            "{text}"
        );
        drop((a, b, c));
        let text = m.render();
        assert!(
            has_line(&text, "bindery_tool_processes_waiting 0"),
            "{text}"
        );
        assert!(
            has_line(&text, "bindery_tool_processes_running 0"),
            "{text}"
        );
    }

    #[test]
    fn the_limit_shows_once_given() {
        let m = Metrics::new();
        m.set_sessions_live_limit(100);
        m.session_evicted();
        let text = m.render();
        assert!(has_line(&text, "bindery_sessions_live_limit 100"), "{text}");
        assert!(
            has_line(&text, "bindery_sessions_evicted_total 1"),
            "{text}"
        );
        // One end-of-exposition marker, last.
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// The value of the one sample line that starts with `series `.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap_or_else(|e| panic!("{series}: {e}\n{text}"))
    }

    /// Tool calls are timed into their own histogram, with the model's
    /// buckets; a clock gone wrong counts as 0.
    #[test]
    fn tool_calls_are_timed() {
        let m = Metrics::new();
        m.tool_call_duration(0.007); // le 0.01
        m.tool_call_duration(2.0); // le 2.5
        m.tool_call_duration(f64::NAN); // 0: le 0.005
        let text = m.render();
        let bucket = |le: &str| {
            value(
                &text,
                &format!("bindery_tool_call_duration_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("0.005"), 1.0);
        assert_eq!(bucket("0.01"), 2.0);
        assert_eq!(bucket("2.5"), 3.0);
        assert_eq!(
            value(&text, "bindery_tool_call_duration_seconds_count"),
            3.0
        );
        let sum = value(&text, "bindery_tool_call_duration_seconds_sum");
        assert!((sum - 2.007).abs() < 1e-9, "sum {sum}");
        assert_eq!(
            value(&text, "bindery_llm_request_duration_seconds_count"),
            0.0
        );
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

        let bucket = |le: &str| {
            value(
                &text,
                &format!("bindery_llm_request_duration_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        let counts: Vec<f64> = [
            "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0",
            "30.0", "60.0", "+Inf",
        ]
        .into_iter()
        .map(bucket)
        .collect();
        assert_eq!(
            counts,
            [2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0, 5.0, 6.0]
        );
        let sum = value(&text, "bindery_llm_request_duration_seconds_sum");
        assert!((sum - 166.208).abs() < 1e-9, "sum {sum}");
        assert_eq!(
            value(&text, "bindery_llm_request_duration_seconds_count"),
            6.0
        );
        assert_eq!(
            value(&text, "bindery_llm_requests_total{outcome=\"ok\"}"),
            4.0
        );
        assert_eq!(
            value(&text, "bindery_llm_requests_total{outcome=\"error\"}"),
            2.0
        );
    }

    #[test]
    fn odd_durations_do_not_poison_the_sum() {
        let m = Metrics::new();
        m.llm_request(f64::NAN, false);
        m.llm_request(-1.0, false);
        m.llm_request(f64::INFINITY, false);
        let text = m.render();
        assert_eq!(
            value(
                &text,
                "bindery_llm_request_duration_seconds_bucket{le=\"0.005\"}"
            ),
            3.0
        );
        assert_eq!(
            value(&text, "bindery_llm_request_duration_seconds_sum"),
            0.0
        );
    }

    #[test]
    fn store_operations_and_the_event_fanout_are_counted_with_their_time() {
        let m = Metrics::new();
        let text = m.render();
        assert_eq!(value(&text, "bindery_event_fanout_total"), 0.0);
        assert_eq!(value(&text, "bindery_event_fanout_seconds_total"), 0.0);
        assert!(!text.contains("bindery_store_operations_total{"), "{text}");
        m.store_operation("get", std::time::Duration::from_millis(2));
        m.store_operation("get", std::time::Duration::from_millis(3));
        m.store_operation("update", std::time::Duration::from_micros(500));
        m.event_fanout(std::time::Duration::from_micros(250));
        m.run_store_wait(std::time::Duration::from_micros(125));
        let text = m.render();
        for (series, want) in [
            ("bindery_store_operations_total{op=\"get\"}", 2.0),
            ("bindery_store_operations_total{op=\"update\"}", 1.0),
            ("bindery_store_operation_seconds_total{op=\"get\"}", 0.005),
            (
                "bindery_store_operation_seconds_total{op=\"update\"}",
                0.0005,
            ),
            ("bindery_event_fanout_total", 1.0),
            ("bindery_event_fanout_seconds_total", 0.00025),
            ("bindery_run_store_wait_seconds_total", 0.000125),
        ] {
            let got = value(&text, series);
            assert!((got - want).abs() < 1e-12, "{series}: {got} in\n{text}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.tool_call("a", "we\"ird\\to\nol", ToolOutcome::Ok, ToolCaller::Model);
        let text = m.render();
        assert!(
            has_line(
                &text,
                r#"bindery_tool_calls_total{tool="we\"ird\\to\nol",outcome="ok",caller="model",agent="a"} 1"#
            ),
            "{text}"
        );
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
                        m.tool_call("a", "shell", ToolOutcome::Ok, ToolCaller::Model);
                        m.llm_request(0.5, true);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let text = m.render();
        assert_eq!(value(&text, "bindery_runs_started_total"), 4000.0);
        assert_eq!(
            value(
                &text,
                "bindery_tool_calls_total{tool=\"shell\",outcome=\"ok\",caller=\"model\",agent=\"a\"}"
            ),
            4000.0
        );
        assert_eq!(
            value(&text, "bindery_llm_request_duration_seconds_count"),
            4000.0
        );
        assert_eq!(
            value(&text, "bindery_llm_request_duration_seconds_sum"),
            2000.0
        );
    }
}
