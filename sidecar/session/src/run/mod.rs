//! One run: from a client's request until control returns to the client,
//! in one place. A run talks to its session through one port, [`Host`]:
//! it records its turns there and asks it what it may spend.
//!
//! - `start.rs`: a run's start: the session's lock, its record as running
//!   and the run's first events in one write, then the loop driven with
//!   the session as its host;
//! - `step.rs`: the model loop (a budget's gate, the model turn, its calls);
//! - `dispatch.rs`: a turn's tool calls, which wait and which run, and how;
//! - `resume.rs`: a held run going on with its calls' answers;
//! - `host.rs`: the port, and a helper's own run's view of it;
//! - `session_host.rs`: the server's side of the port: `session_sink.rs`
//!   (turns and events recorded in the session, the start's gate) and
//!   `run_budget.rs` (the budgets' claims in the store, over the pure
//!   `crate::budget`: gates, gauges, crossings);
//! - `finish.rs`: a run's end recorded with its answer and pending calls;
//! - `heartbeat.rs`: this server's heartbeat, and runs of servers that died
//!   closed as lost.
//!
//! The history records what the model said and what the tools returned,
//! never a bound value.

mod dispatch;
mod finish;
pub mod heartbeat;
mod host;
mod resume;
mod run_budget;
mod session_host;
mod session_sink;
mod start;
mod step;

use crate::budget::Exceeded;
use crate::lookups::LookupCache;
use crate::subagents::HelperEnv;
use bindery_bindings::cache::ToolCache;
use bindery_bindings::BoundTool;
use bindery_llm::ChatClient;
use bindery_llm::ToolCall;
use bindery_metrics::Metrics;
use bindery_metrics::ToolCaller;
use bindery_params::Values;
use bindery_store::lookup::LookupState;
use bindery_store::pending::Frame;
use bindery_store::pending::TaintSource;
use bindery_store::wire::SessionEvent;
use bindery_tools::CallContext;
use bindery_tools::Disposition;
use bindery_tools::ToolError;
use bindery_tools::ToolOutput;
use bindery_tree::LoadedAgent;
pub(crate) use dispatch::audited;
pub use dispatch::{needs_approval, orchestrated, run_calls, taint, CallEnv};
pub use finish::{close_pending, CANCELLED};
pub use host::{Host, Unaudited};
pub use resume::{answer_resolved, go_on, NotRun};
pub use start::Runs;
#[cfg(test)]
pub(crate) use step::PANICKED;
pub use step::{run, tools_on_offer};

/// How far a run goes (`run` on create, messages, resume, continuations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunMode {
    /// Until the model answers or a call waits.
    #[default]
    UntilBlocked,
    /// One model turn and its tool calls.
    Step,
    /// No model turn: the calls a client made (an MCP `tools/call` of an
    /// exposed tool, the session's last turn), and the run ends once they
    /// are answered. Never chosen by a request's `run`.
    Call,
}

/// What a run starts from.
#[derive(Debug)]
pub enum Opening {
    /// The session as it stands (a resume, an answered continuation).
    Resume,
    /// A user's message.
    Prompt(String),
    /// A call a client made of one of the agent's tools (`RunMode::Call`).
    Call(ToolCall),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// The model answered.
    Completed,
    /// The step limit was reached before the model answered.
    MaxSteps(u32),
    Cancelled,
    /// The model could not be reached or answered nonsense.
    Failed(String),
    /// `run: step` took its one model turn (and ran its calls).
    Stepped,
    /// Tool calls wait (a person's approval, a client's result); the calls
    /// that did not wait have run and their results are in the history.
    Blocked(Vec<Blocked>),
    /// A `refuse` budget is used up, or a person did not let the run go
    /// past a `confirm` one: why.
    OverBudget(String),
}

/// A call the run stopped before.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub call: ToolCall,
    pub disposition: Disposition,
    /// Names of the parameters bound into the call (never a value).
    pub bound_params: Vec<String>,
    /// The helper runs it was made in, outermost first.
    pub frames: Vec<Frame>,
    /// A tool with dependencies: where its orchestration stands.
    pub lookup: Option<LookupState>,
    /// An egress call in a session that took in untrusted results: those
    /// results' calls.
    pub tainted_by: Vec<TaintSource>,
    /// A used-up `confirm` budget (disposition `budget`); before a model
    /// request `call` is a stand-in with no tool.
    pub budget: Option<Exceeded>,
}

/// What one call came to: its result, or calls (inside a helper) that wait.
pub enum Outcome {
    Done(Result<ToolOutput, ToolError>),
    Blocked(Vec<Blocked>),
}

/// The model's arguments of `call` as JSON (the raw text when they are not).
pub fn call_arguments(call: &ToolCall) -> serde_json::Value {
    call.parse_arguments()
        .unwrap_or_else(|_| serde_json::Value::String(call.arguments.clone()))
}

/// Events for the session's stream.
pub type Events = Vec<SessionEvent>;

pub struct RunContext<'a> {
    pub agent: &'a LoadedAgent,
    /// The agent's tools for this run: its own, or a per-call narrowed copy
    /// when it runs as a helper.
    pub tools: &'a [BoundTool],
    /// Present when the agent may call helpers.
    pub helpers: Option<HelperEnv<'a>>,
    pub client: &'a ChatClient,
    pub values: &'a Values,
    pub call: CallContext,
    pub cache: Option<&'a ToolCache>,
    /// Lookup results of tools' dependencies (none: not kept between calls).
    pub lookups: Option<&'a LookupCache>,
    pub metrics: &'a Metrics,
    pub max_steps: u32,
    pub stream: bool,
    /// Who makes the run's tool calls (metrics, traces, events).
    pub origin: ToolCaller,
    /// Untrusted results before this turn of the history were cleared by
    /// a person: they no longer hold egress calls.
    pub taint_from: usize,
    /// A helper's run: the untrusted results its caller had taken in when
    /// it asked. The helper starts tainted by them, so a tainted caller
    /// cannot send through a clean helper.
    pub caller_taint: &'a [TaintSource],
    /// What time it is (lookups' `ttl_ms` count by it).
    pub clock: &'a dyn bindery_store::clock::Clock,
    /// The end user the session belongs to: its spans (and so every log
    /// line of the run) name them.
    pub subject: Option<&'a str>,
    /// When the person's identity token expires (milliseconds since the
    /// epoch, by `clock`): from then on the run's calls get none of what it
    /// was exchanged for (`@identity:token:…`), however long the run goes
    /// on. `None`: the run holds no exchanged token.
    pub tokens_until: Option<i64>,
}

impl RunContext<'_> {
    /// The values a call made now may take: the run's, without the
    /// exchanged tokens once the person's token has expired.
    pub(crate) fn values_now(&self) -> Option<Values> {
        let until = self.tokens_until?;
        (self.clock.now_ms() >= until).then(|| crate::identity::without_tokens(self.values))
    }
}
