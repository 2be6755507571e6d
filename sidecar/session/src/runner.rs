//! One run: from a client's request until control returns to the client.
//!
//! Model turn, then every tool call of that turn (concurrently, through the
//! bindings), then the next model turn, until the model answers, the step
//! limit is hit, or the run is cancelled. The history records what the
//! model said and what the tools returned, never a bound value.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use async_trait::async_trait;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::ledger::{Exceeded, Gate, Ledger, Spent};
use crate::lookups::{self, LookupCache, Step};
use crate::subagents::{self, HelperEnv};
use crate::toolgroups::{self, Groups};
use bindery_bindings::cache::ToolCache;
use bindery_bindings::{scrubber_for, BoundTool};
use bindery_llm::{
    ChatClient, ChatMessage, Conversation, StreamDelta, ToolCall, ToolDefinition, Turn,
};
use bindery_metrics::{Metrics, ToolCaller, ToolOutcome};
use bindery_params::scrub::Scrubber;
use bindery_params::{SecretString, Values};
use bindery_store::lookup::LookupState;
use bindery_store::pending::{Frame, PendingCall, Resolution, TaintSource};
use bindery_store::wire::{AssistantText, SessionEvent, ToolCallEvent, ToolResult};
use bindery_tools::{CallContext, Disposition, ToolError, ToolOutput};
use bindery_tree::LoadedAgent;

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

/// Where a run reports what happens.
#[async_trait]
pub trait RunSink: Send + Sync {
    /// A message to append to the history and the events it made for the
    /// session's stream (kind, data), persisted together, each event with
    /// an id. The sink may still be storing it when this returns:
    /// [`RunSink::stored`] waits for that, and each turn is stored after
    /// the one before.
    async fn turn(&self, msg: &Turn, events: Events);
    /// The run's answer, its last turn: a sink may keep it to store with
    /// the run's end.
    async fn answer(&self, msg: &Turn, events: Events) {
        self.turn(msg, events).await
    }
    /// Wait until every turn given so far is stored. The run calls it
    /// before anything that acts outside the run (a tool, a helper), so
    /// a call runs only once the turn that asked for it is on record (and
    /// not at all if that write found the run taken: it cancels the run).
    async fn stored(&self) {}
    /// Streamed text as it arrives (live only).
    fn delta(&self, text: &str);
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
    /// The run's budgets (none: nothing is counted, as in `run` on the
    /// command line).
    pub ledger: Option<&'a dyn Ledger>,
    /// What time it is (lookups' `ttl_ms` count by it).
    pub clock: &'a dyn bindery_store::clock::Clock,
}

/// Run the loop over `history` (which ends with the request that started
/// the run). New messages go to `history` and to the sink.
pub async fn run(
    ctx: &RunContext<'_>,
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    cancel: &CancellationToken,
) -> RunEnd {
    as_run(ctx, run_inner(ctx, history, sink, cancel)).await
}

/// `work` as a run of `ctx`: in its `run` span, with the run's secret
/// values (message-scope ones too) kept out of the logs while it goes on,
/// and so the id_sensitive ids its calls chose: until its spans have
/// ended, as they are scrubbed then.
async fn as_run<T>(ctx: &RunContext<'_>, work: impl std::future::Future<Output = T>) -> T {
    let span = tracing::info_span!("run", session = %ctx.call.session_id, agent = %ctx.agent.name, caller = ctx.origin.as_str());
    let _live = bindery_params::live::register_values(ctx.values);
    HIDDEN
        .scope(std::sync::Mutex::new(Vec::new()), work.instrument(span))
        .await
}

tokio::task_local! {
    /// Where a run keeps the registrations of the id_sensitive ids its
    /// calls chose (see [`run`]).
    static HIDDEN: std::sync::Mutex<Vec<bindery_params::live::Registration>>;
}

async fn run_inner(
    ctx: &RunContext<'_>,
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    cancel: &CancellationToken,
) -> RunEnd {
    {
        let groups = Groups::of(ctx.tools);
        let offered = |active: &BTreeSet<String>| offered(ctx, &groups, active);
        let tools = offered(&groups.active(history));
        let scrubber = scrubber_for(ctx.values, ctx.tools);
        // One conversation for the run, which each step extends by what the
        // history gained since the last (the model's turn and its calls'
        // results): each turn's text, made with the turn, is copied in
        // once, never encoded again.
        let mut conversation = Conversation::new(tools);
        if !ctx.agent.spec.system_prompt.is_empty() {
            let prompt = ctx.agent.spec.system_prompt.clone();
            conversation.push(&ChatMessage::system(prompt));
        }
        conversation.history_starts();
        let mut sent = 0;
        for step in 0..ctx.max_steps {
            if !groups.is_empty() && step > 0 {
                conversation.set_tools(offered(&groups.active(history)));
            }
            // The history only grows while the run goes on.
            conversation.extend_turns(&history[sent..]);
            sent = history.len();
            let conversation = &conversation;
            // Counted only when a budget claims a request or a model reports
            // no usage: most runs never need it.
            let tools_chars = std::sync::OnceLock::new();
            let model = &ctx.agent.spec.model;
            let estimate = || {
                let tools = *tools_chars.get_or_init(|| {
                    conversation
                        .tools()
                        .iter()
                        .map(|t| {
                            t.name.len() + t.description.len() + t.parameters.to_string().len()
                        })
                        .sum::<usize>()
                });
                bindery_store::usage::estimate_tokens(tools + conversation.message_chars())
            };
            let claim = match ctx.ledger {
                Some(ledger) => match ledger.before_model(model, &estimate).await {
                    Gate::Go(claim) => claim,
                    Gate::Refuse(e) => return RunEnd::OverBudget(e.detail()),
                    Gate::Ask(e) => return RunEnd::Blocked(vec![budget_hold(None, e)]),
                },
                None => None,
            };
            let response = tokio::select! {
                _ = cancel.cancelled() => None,
                r = model_turn(ctx, conversation, sink).instrument(tracing::info_span!("model_turn", step)) => Some(r),
            };
            if let Some(ledger) = ctx.ledger {
                let spent = match &response {
                    Some(Ok(r)) => Some(match &r.usage {
                        Some(u) => Spent {
                            prompt: u.prompt_tokens,
                            completion: u.completion_tokens,
                            estimated: false,
                        },
                        None => Spent {
                            prompt: estimate(),
                            completion: bindery_store::usage::estimate_tokens(
                                r.to_message().chars(),
                            ),
                            estimated: true,
                        },
                    }),
                    _ => None,
                };
                ledger.after_model(claim, model, spent).await;
            }
            let response = match response {
                None => return RunEnd::Cancelled,
                Some(Ok(r)) => r.with_unique_call_ids(),
                // The endpoint's words may quote what it was sent (a key
                // in "Incorrect API key provided: …").
                Some(Err(e)) => {
                    return RunEnd::Failed(
                        scrubber.scrub(&format!("the model request failed: {e}")),
                    )
                }
            };
            let message = Turn::new(response.to_message());
            history.push(message.clone());
            let mut events = Events::new();
            if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                events.push(SessionEvent::Message(AssistantText::new(text)));
            }
            for call in &response.tool_calls {
                // The call as the model made it: bound values are merged later.
                events.push(SessionEvent::ToolCall(ToolCallEvent {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    caller: None,
                }));
            }
            if response.tool_calls.is_empty() {
                sink.answer(&message, events).await;
                return RunEnd::Completed;
            }
            sink.turn(&message, events).await;
            let encoded = conversation.history();
            if let Some(end) = act(
                ctx,
                &response.tool_calls,
                history,
                encoded,
                sink,
                &scrubber,
                cancel,
            )
            .await
            {
                return end;
            }
        }
        RunEnd::MaxSteps(ctx.max_steps)
    }
}

/// The tools on offer with `active` groups: the meta tools first (while
/// some tool is on demand), then those shown, then helpers.
fn offered(
    ctx: &RunContext<'_>,
    groups: &Groups,
    active: &BTreeSet<String>,
) -> Vec<ToolDefinition> {
    let mut tools = groups.definitions(active);
    tools.extend(
        ctx.tools
            .iter()
            .filter(|t| Groups::shows(t, active))
            .map(|t| ToolDefinition {
                name: t.name().to_string(),
                description: t.spec().description.clone(),
                parameters: t.model_schema(ctx.values),
            }),
    );
    if let Some(env) = &ctx.helpers {
        tools.extend(subagents::definitions(ctx.agent, env.tree));
    }
    tools
}

/// The tools a request of this run offers after `history` (its on-demand
/// groups as the history left them).
pub fn tools_on_offer(ctx: &RunContext<'_>, history: &[Turn]) -> Vec<ToolDefinition> {
    let groups = Groups::of(ctx.tools);
    offered(ctx, &groups, &groups.active(history))
}

/// A run held at a used-up `confirm` budget: before `call`, or before a
/// model request (a stand-in call with no tool).
fn budget_hold(call: Option<&ToolCall>, e: Exceeded) -> Blocked {
    Blocked {
        call: call.cloned().unwrap_or_else(|| ToolCall {
            id: format!("budget-{}", e.budget),
            name: String::new(),
            arguments: "{}".into(),
        }),
        disposition: Disposition::Budget,
        bound_params: Vec::new(),
        frames: Vec::new(),
        lookup: None,
        tainted_by: Vec::new(),
        budget: Some(e),
    }
}

/// The calls of one turn: those that wait become pending items, the
/// others run (concurrently, once the turn that asked for them is stored)
/// and their results are recorded. `None`: every call is answered and the
/// run may go on; else how it stops.
async fn act(
    ctx: &RunContext<'_>,
    calls: &[ToolCall],
    history: &mut Vec<Turn>,
    encoded: Option<(&[u8], usize)>,
    sink: &dyn RunSink,
    scrubber: &Scrubber,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    let (waiting, now): (Vec<_>, Vec<_>) = calls
        .iter()
        .map(|c| (c, blocked(ctx, c, history)))
        .partition(|(_, b)| b.is_some());
    let now: Vec<&ToolCall> = now.into_iter().map(|(c, _)| c).collect();
    sink.stored().await;
    // Biased: a run cancelled by then (or found taken) starts no call.
    let results = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        r = futures::future::join_all(now.iter().map(|c| {
            dispatch(ctx, c, Seen { history, encoded }, cancel)
        })) => Some(r),
    };
    let Some(results) = results else {
        for call in calls {
            let msg = Turn::new(ChatMessage::tool_result(
                &call.id,
                "error: the run was cancelled",
            ));
            history.push(msg.clone());
            sink.turn(&msg, Events::new()).await;
        }
        return Some(RunEnd::Cancelled);
    };
    let mut waiting: Vec<Blocked> = waiting.into_iter().filter_map(|(_, b)| b).collect();
    for (call, outcome) in now.iter().zip(results) {
        settle(history, sink, scrubber, &call.id, outcome, &mut waiting).await;
    }
    (!waiting.is_empty()).then_some(RunEnd::Blocked(waiting))
}

/// A run with no model turn: the calls of the last turn of `history`,
/// which a client made (an MCP `tools/call` of an exposed tool), go the
/// way a model's calls go (confirmations, lookups, the bindings, the
/// cache, the scrubber) and the run ends once they are answered.
pub async fn run_calls(
    ctx: &RunContext<'_>,
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    cancel: &CancellationToken,
) -> RunEnd {
    let calls = match history.last().map(Turn::message) {
        Some(ChatMessage::Assistant { tool_calls, .. }) if !tool_calls.is_empty() => {
            tool_calls.clone()
        }
        _ => return RunEnd::Failed("the run was given no tool call to make".into()),
    };
    let scrubber = scrubber_for(ctx.values, ctx.tools);
    as_run(
        ctx,
        act(ctx, &calls, history, None, sink, &scrubber, cancel),
    )
    .await
    .unwrap_or(RunEnd::Completed)
}

/// The call as a pending item, if it waits instead of running: its
/// toolbox's or the agent's `confirm` (a condition that holds, or cannot be
/// told), or the taint guard (an egress call after an untrusted result).
fn blocked(ctx: &RunContext<'_>, call: &ToolCall, history: &[Turn]) -> Option<Blocked> {
    // A call of a tool its group hides runs nowhere: no person is asked
    // about it, and dispatching it says what to activate.
    if hidden(ctx, call, history).is_some() {
        return None;
    }
    let tool = ctx.tools.iter().find(|t| t.name() == call.name);
    let tainted_by = match tool {
        Some(t) if t.egress() => {
            let mut by = taint(ctx, history);
            // Its own lookups would bring outside text into its arguments
            // (a destination, a body): it waits before they run.
            by.extend(
                bindery_bindings::depends::untrusted_lookups(ctx.tools, t)
                    .into_iter()
                    .map(|tool| TaintSource {
                        tool_call_id: call.id.clone(),
                        tool,
                    }),
            );
            by
        }
        _ => Vec::new(),
    };
    if tool.is_some_and(|t| !t.depends().is_empty()) && tainted_by.is_empty() {
        // Its inputs are resolved first; a write is confirmed with its
        // facts. A tainted egress call waits before any lookup runs.
        return None;
    }
    let disposition = needs_approval(ctx.agent, ctx.values, call, tool)
        .or_else(|| (!tainted_by.is_empty()).then_some(Disposition::Confirm))?;
    if !tainted_by.is_empty() {
        tracing::info!(tool = %call.name, untrusted = tainted_by.len(), "an egress call after untrusted results waits for a person");
    }
    Some(Blocked {
        call: call.clone(),
        disposition,
        bound_params: tool.map(|t| t.bound_params()).unwrap_or_default(),
        frames: Vec::new(),
        lookup: None,
        tainted_by,
        budget: None,
    })
}

/// The untrusted results the run's conversation has taken in since a
/// person last cleared them (and, in a helper, its caller's): the calls
/// that made them. A result counts by every call the conversation made
/// under its id, so a model that gives two calls one id cannot hide an
/// untrusted one behind the other; a result whose id no call has counts
/// as untrusted.
pub fn taint(ctx: &RunContext<'_>, history: &[Turn]) -> Vec<TaintSource> {
    let untrusted = |name: &str| {
        ctx.agent.tools.untrusted(name)
            || ctx.tools.iter().any(|t| {
                t.name() == name
                    && (t.untrusted()
                        || !bindery_bindings::depends::untrusted_lookups(ctx.tools, t).is_empty())
            })
            || ctx.helpers.as_ref().is_some_and(|env| {
                subagents::helper_slug(ctx.agent, name)
                    .is_some_and(|slug| subagents::reaches_untrusted(env.tree, ctx.agent, slug))
            })
    };
    let mut named: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut out = ctx.caller_taint.to_vec();
    for (i, m) in history.iter().enumerate() {
        match m.message() {
            ChatMessage::Assistant { tool_calls, .. } => {
                for c in tool_calls {
                    named
                        .entry(c.id.as_str())
                        .or_default()
                        .push(c.name.as_str());
                }
            }
            ChatMessage::Tool { tool_call_id, .. } if i >= ctx.taint_from => {
                let tool = match named.get(tool_call_id.as_str()) {
                    None => Some(bindery_metrics::UNKNOWN_TOOL),
                    Some(names) => names.iter().copied().find(|n| untrusted(n)),
                };
                if let Some(tool) = tool {
                    out.push(TaintSource {
                        tool_call_id: tool_call_id.clone(),
                        tool: tool.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether a `confirm` condition on this call holds (or cannot be told,
/// which asks too).
/// Why `call` waits for a person by the agent's and its toolbox's say
/// (`confirm`, a `when` condition that holds or cannot be told), whatever
/// the conversation before it.
pub fn needs_approval(
    agent: &LoadedAgent,
    values: &Values,
    call: &ToolCall,
    tool: Option<&BoundTool>,
) -> Option<Disposition> {
    agent
        .disposition(&call.name, tool)
        .or_else(|| condition_asks(agent, values, call, tool).then_some(Disposition::Confirm))
}

fn condition_asks(
    agent: &LoadedAgent,
    values: &Values,
    call: &ToolCall,
    tool: Option<&BoundTool>,
) -> bool {
    let toolbox = tool.map(BoundTool::confirm_when).unwrap_or_default();
    let sources: Vec<&str> = toolbox
        .iter()
        .map(String::as_str)
        .chain(bindery_bindings::confirm::conditions(
            &agent.spec.confirm,
            &call.name,
        ))
        .collect();
    if sources.is_empty() {
        return false;
    }
    let model_args = match call.parse_arguments() {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    // The arguments as the tool would get them, a secret as `<secret>`.
    let args: serde_json::Map<String, serde_json::Value> =
        match tool.map(|t| t.merge(model_args.clone(), values)) {
            Some(Ok(merged)) => merged
                .args
                .iter()
                .map(|(k, v)| (k.clone(), v.plain().cloned().unwrap_or(json!("<secret>"))))
                .collect(),
            _ => model_args,
        };
    let params: serde_json::Map<String, serde_json::Value> = values
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.plain()?.clone())))
        .collect();
    let (args, params) = (args.into(), params.into());
    sources.iter().any(|src| {
        bindery_spec::condition::holds(src, &args, &params).unwrap_or_else(|e| {
            tracing::warn!(tool = %call.name, condition = %src, "a confirm condition could not be evaluated, so the call asks: {e}");
            true
        })
    })
}

/// A call's outcome: recorded if it is done, or the calls it waits for
/// added to `waiting`.
async fn settle(
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    scrubber: &Scrubber,
    id: &str,
    outcome: Outcome,
    waiting: &mut Vec<Blocked>,
) {
    match outcome {
        Outcome::Done(result) => record_result(history, sink, scrubber, id, result).await,
        Outcome::Blocked(inner) => waiting.extend(inner),
    }
}

/// Append a call's outcome to the history, the store and the stream,
/// scrubbed of every secret the run can reach: whatever the model, the
/// history, the store and the stream get of a tool passes this point
/// (a result run now, an approved call, a client's deferred result, a
/// refusal's reason, a helper's answer).
async fn record_result(
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    scrubber: &Scrubber,
    id: &str,
    result: Result<ToolOutput, ToolError>,
) {
    let r = crate::result::recorded(id, result, scrubber);
    let msg = Turn::new(ChatMessage::Tool {
        tool_call_id: id.to_string(),
        content: r.content,
    });
    history.push(msg.clone());
    let event = SessionEvent::ToolResult(ToolResult {
        id: id.to_string(),
        ok: r.ok,
        output: r.shown,
    });
    sink.turn(&msg, vec![event]).await;
}

/// Answer the calls a run stopped before, as they were resolved: an
/// approved call runs now (its first run), the others get what the
/// resolution says; a helper that waited is resumed with its own calls'
/// answers and runs on. Then the run goes on with [`run`] (`None`), unless
/// it was cancelled or a helper waits again.
pub async fn answer_resolved(
    ctx: &RunContext<'_>,
    resolved: &[PendingCall],
    history: &mut Vec<Turn>,
    sink: &dyn RunSink,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    let mut waiting = Vec::new();
    let scrubber = scrubber_for(ctx.values, ctx.tools);
    // A helper's calls, by the `prompt_agent_*` call that started it, in order.
    let mut helpers: Vec<(Frame, Vec<PendingCall>)> = Vec::new();
    for item in resolved.iter().filter(|i| i.resolution.is_some()) {
        // What came before is on record before this call may run.
        sink.stored().await;
        if let Some(frame) = item.frames.first() {
            let inner = PendingCall {
                frames: item.frames[1..].to_vec(),
                ..item.clone()
            };
            match helpers.iter_mut().find(|(f, _)| f.call_id == frame.call_id) {
                Some((_, items)) => items.push(inner),
                None => helpers.push((frame.clone(), vec![inner])),
            }
            continue;
        }
        if item.disposition == Disposition::Budget {
            let name = item.budget.as_ref().map_or("", |b| b.budget.as_str());
            match &item.resolution {
                Some(Resolution::Approved) => {
                    if let Some(ledger) = ctx.ledger {
                        ledger.approve(name);
                    }
                    tracing::info!(budget = name, "a person let the run go past a budget");
                    if item.tool.is_empty() {
                        // Held before a model request: the run goes on to it.
                        continue;
                    }
                }
                Some(other) => {
                    if !item.tool.is_empty() {
                        let why = other.refusal().unwrap_or_default();
                        let why = Err(ToolError::Failed(why));
                        record_result(history, sink, &scrubber, &item.tool_call_id, why).await;
                    }
                    return Some(RunEnd::OverBudget(format!(
                        "a person did not let the run go past budget {name}"
                    )));
                }
                None => continue,
            }
        }
        let outcome = if let Some(state) = item.lookup.clone() {
            let call = ToolCall {
                id: item.tool_call_id.clone(),
                name: item.tool.clone(),
                arguments: item.call.to_string(),
            };
            let tool = ctx.tools.iter().find(|t| t.name() == item.tool);
            let env = ctx.call_env();
            match (
                tool,
                item.resolution
                    .as_ref()
                    .and_then(|r| go_on(state, r))
                    .unwrap_or_else(|| Err("the answer does not fit the call".into())),
            ) {
                (Some(tool), Ok(state)) => tokio::select! {
                    biased;
                    _ = cancel.cancelled() => None,
                    r = orchestrated(&env, &call, tool, state) => Some(r),
                }
                .unwrap_or_else(|| {
                    Outcome::Done(Err(ToolError::Failed("the run was cancelled".into())))
                }),
                (None, _) => Outcome::Done(Err(ToolError::Failed(format!(
                    "there is no tool named `{}` any more",
                    item.tool
                )))),
                (_, Err(why)) => Outcome::Done(Err(ToolError::Failed(why))),
            }
        } else {
            match item.resolution.as_ref() {
                Some(Resolution::Result { output }) => {
                    Outcome::Done(Ok(ToolOutput::Text(output.clone())))
                }
                Some(Resolution::Approved) => {
                    let call = ToolCall {
                        id: item.tool_call_id.clone(),
                        name: item.tool.clone(),
                        arguments: match &item.call {
                            serde_json::Value::String(raw) => raw.clone(),
                            other => other.to_string(),
                        },
                    };
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => None,
                        r = dispatch(ctx, &call, Seen::of(history), cancel) => Some(r),
                    }
                    .unwrap_or_else(|| {
                        Outcome::Done(Err(ToolError::Failed("the run was cancelled".into())))
                    })
                }
                Some(other) => {
                    Outcome::Done(Err(ToolError::Failed(other.refusal().unwrap_or_default())))
                }
                None => continue,
            }
        };
        settle(
            history,
            sink,
            &scrubber,
            &item.tool_call_id,
            outcome,
            &mut waiting,
        )
        .await;
        if cancel.is_cancelled() {
            return Some(RunEnd::Cancelled);
        }
    }
    for (frame, items) in helpers {
        sink.stored().await;
        let Some(env) = ctx.helpers.as_ref() else {
            let why = Err(ToolError::Failed("helpers are not available here".into()));
            record_result(history, sink, &scrubber, &frame.call_id, why).await;
            continue;
        };
        let call = ToolCall {
            id: frame.call_id.clone(),
            name: frame.tool.clone(),
            arguments: frame.arguments.clone(),
        };
        let resume = Resume {
            history: frame.history.clone(),
            resolved: &items,
        };
        let outcome = call_helper(ctx, env, &call, history, cancel, Some(resume)).await;
        settle(
            history,
            sink,
            &scrubber,
            &frame.call_id,
            outcome,
            &mut waiting,
        )
        .await;
        if cancel.is_cancelled() {
            return Some(RunEnd::Cancelled);
        }
    }
    (!waiting.is_empty()).then_some(RunEnd::Blocked(waiting))
}

/// The lookups one call may take when the agent sets no `maxSteps`, at least.
const MIN_LOOKUPS: u32 = 16;

/// The orchestration state an answer leads to, or why the call does not run.
pub fn go_on(mut state: LookupState, r: &Resolution) -> Option<Result<LookupState, String>> {
    use bindery_store::lookup::Ask;
    match (r, &state.ask) {
        (Resolution::Chosen { option }, Ask::Selection { key, options, .. }) => {
            let real = options.iter().find(|o| &o.id == option)?.real.clone();
            state.choices.insert(key.clone(), real);
        }
        (Resolution::Input { values }, _) => {
            if !state.args.is_object() {
                state.args = json!({});
            }
            for (k, v) in values {
                state.args[k] = v.clone();
            }
        }
        (Resolution::Approved, Ask::Confirmation { prepared, .. }) => {
            state.approved = Some(prepared.clone());
        }
        // What it rested on went stale: resolved again, asked again.
        (Resolution::Expired, _) => {}
        (other, _) => {
            return Some(Err(other
                .refusal()
                .unwrap_or_else(|| "the call did not run".into())))
        }
    }
    Some(Ok(state))
}

/// What one call of a tool with dependencies needs of the run it is in:
/// no model. A run lends its own (`RunContext::call_env`); `tool-call`
/// builds one for a call made on the command line.
pub struct CallEnv<'a> {
    pub agent: &'a LoadedAgent,
    pub tools: &'a [BoundTool],
    pub values: &'a Values,
    pub call: &'a CallContext,
    /// Lookup results kept between calls (none: kept for this call only).
    pub lookups: Option<&'a LookupCache>,
    pub max_steps: u32,
    pub clock: &'a dyn bindery_store::clock::Clock,
    /// The run's budgets, which lookups count against too.
    pub ledger: Option<&'a dyn Ledger>,
}

impl<'a> RunContext<'a> {
    fn call_env(&'a self) -> CallEnv<'a> {
        CallEnv {
            ledger: self.ledger,
            agent: self.agent,
            tools: self.tools,
            values: self.values,
            call: &self.call,
            lookups: self.lookups,
            max_steps: self.max_steps,
            clock: self.clock,
        }
    }
}

/// A tool with dependencies: resolve its inputs (asking when a person must
/// say), then run it. A write the API refuses as stale (409/410) runs its
/// lookups again and asks again: it never runs on something else unasked.
/// The call waits ([`Outcome::Blocked`]) for what a person must say; the
/// answer goes into `state` with [`go_on`] and the call is made again.
pub async fn orchestrated(
    ctx: &CallEnv<'_>,
    call: &ToolCall,
    tool: &BoundTool,
    mut state: LookupState,
) -> Outcome {
    let own;
    let cache = match ctx.lookups {
        Some(c) => c,
        None => {
            own = LookupCache::default();
            &own
        }
    };
    let mut call_ctx = ctx.call.clone();
    call_ctx.turn_id = call.id.clone();
    call_ctx.step_id = call.id.clone();
    let scrubber = scrubber_for(ctx.values, ctx.tools);
    let env = lookups::Env {
        tools: ctx.tools,
        values: ctx.values,
        call: &call_ctx,
        cache,
        scrubber: &scrubber,
        // `run: step` bounds model turns, not the lookups of one call.
        max_steps: ctx
            .agent
            .spec
            .max_steps
            .unwrap_or(ctx.max_steps.max(MIN_LOOKUPS)),
        now: ctx.clock.now_ms(),
        confirm: ctx.agent.disposition(&call.name, Some(tool)) == Some(Disposition::Confirm),
        ledger: ctx.ledger,
    };
    let mut fresh = false;
    loop {
        match lookups::resolve(&env, tool, state.clone(), fresh).await {
            Step::Ready(args, sensitive) => {
                // Like a secret, an id_sensitive option's real id is kept
                // out of every log line while the call runs.
                let mut hidden = bindery_params::live::register(
                    sensitive
                        .into_iter()
                        .map(|id| ("selection".to_string(), SecretString::new(id)))
                        .collect(),
                );
                // Inside a run, until its spans have ended; else (a call
                // resumed outside one) until this call has.
                let _ = HIDDEN.try_with(|h| {
                    if let Some(r) = hidden.take() {
                        h.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                    }
                });
                let r = tool.call(args, ctx.values, &call_ctx).await;
                if let Err(e) = &r {
                    if !fresh && (tool.writes() || env.confirm) && lookups::is_stale(e) {
                        tracing::info!(tool = %call.name, "the API refused the prepared call as stale; its lookups run again");
                        state.choices.clear();
                        state.approved = None;
                        state.refreshed = true;
                        fresh = true;
                        continue;
                    }
                }
                return Outcome::Done(r);
            }
            Step::Wait(disposition, state) => {
                return Outcome::Blocked(vec![Blocked {
                    call: call.clone(),
                    disposition,
                    bound_params: tool.bound_params(),
                    frames: Vec::new(),
                    lookup: Some(state),
                    tainted_by: Vec::new(),
                    budget: None,
                }])
            }
            Step::NoOptions { lookup } => {
                return Outcome::Done(Ok(ToolOutput::Json(json!({
                    "outcome": "no_options",
                    "lookup": lookup,
                    "message": format!("`{lookup}` returned no options, so there is nothing to choose and `{}` did not run; tell the user", call.name),
                }))))
            }
            Step::OverBudget(e) => return Outcome::Blocked(vec![budget_hold(Some(call), e)]),
            Step::Failed(why) => return Outcome::Done(Err(ToolError::Failed(why))),
        }
    }
}

async fn model_turn(
    ctx: &RunContext<'_>,
    conversation: &Conversation,
    sink: &dyn RunSink,
) -> Result<bindery_llm::ChatResponse, bindery_llm::LlmError> {
    let started = Instant::now();
    let result = if ctx.stream {
        let mut forward = |d: StreamDelta| {
            if let StreamDelta::Content(text) = d {
                sink.delta(&text);
            }
        };
        ctx.client
            .complete_streaming(conversation, &mut forward)
            .await
    } else {
        ctx.client.complete(conversation).await
    };
    ctx.metrics
        .llm_request(started.elapsed().as_secs_f64(), result.is_ok());
    if let Err(e) = &result {
        tracing::warn!("model request failed: {e}");
    }
    result
}

/// One tool call through its bindings (and the cache), or a helper call;
/// its outcome is counted once, here (a helper that waits is not yet).
/// [`record_result`] scrubs what it returns.
async fn dispatch(
    ctx: &RunContext<'_>,
    call: &ToolCall,
    seen: Seen<'_>,
    cancel: &CancellationToken,
) -> Outcome {
    let span = tracing::info_span!("tool_call", tool = %call.name, call_id = %call.id, caller = ctx.origin.as_str());
    async {
        // A name the agent does not have is the model's free text: budgets
        // and metrics count it under one name, whatever the call came to,
        // so no model or client chooses a label or a usage row's tool.
        let known = ctx.tools.iter().any(|t| t.name() == call.name)
            || (ctx.helpers.is_some() && subagents::is_helper_tool(ctx.agent, &call.name))
            || (toolgroups::is_meta_name(&call.name) && Groups::of(ctx.tools).is_meta(&call.name));
        let counted_as = match known {
            true => call.name.as_str(),
            false => bindery_metrics::UNKNOWN_TOOL,
        };
        if let Some(ledger) = ctx.ledger {
            match ledger.before_tool(counted_as).await {
                Gate::Go(_) => {}
                Gate::Refuse(e) => {
                    tracing::info!(budget = %e.budget, "a tool call over budget did not run");
                    return Outcome::Done(Err(ToolError::Failed(format!(
                        "{}, so this call did not run",
                        e.detail()
                    ))));
                }
                Gate::Ask(e) => return Outcome::Blocked(vec![budget_hold(Some(call), e)]),
            }
        }
        let started = Instant::now();
        let outcome = dispatch_inner(ctx, call, seen, cancel).await;
        if let Outcome::Done(result) = &outcome {
            ctx.metrics
                .tool_call_duration(started.elapsed().as_secs_f64());
            let counted = match result {
                Ok(_) => ToolOutcome::Ok,
                Err(ToolError::Unavailable) => ToolOutcome::Unavailable,
                Err(_) => ToolOutcome::Error,
            };
            ctx.metrics
                .tool_call(&ctx.agent.name, counted_as, counted, ctx.origin);
        }
        outcome
    }
    .instrument(span)
    .await
}

/// The conversation so far, as a call sees it: the history, and the part
/// of it that the run's conversation has encoded already (`None`: none).
#[derive(Clone, Copy)]
struct Seen<'a> {
    history: &'a [Turn],
    /// The first turns of `history`, encoded, and how many they are.
    encoded: Option<(&'a [u8], usize)>,
}

impl<'a> Seen<'a> {
    fn of(history: &'a [Turn]) -> Self {
        Seen {
            history,
            encoded: None,
        }
    }
}

async fn dispatch_inner(
    ctx: &RunContext<'_>,
    call: &ToolCall,
    seen: Seen<'_>,
    cancel: &CancellationToken,
) -> Outcome {
    let model = ctx.origin == ToolCaller::Model;
    if model && toolgroups::is_meta_name(&call.name) {
        let groups = Groups::of(ctx.tools);
        if groups.is_meta(&call.name) {
            return Outcome::Done(Ok(ToolOutput::text(
                groups.answer(&call.name, &call.arguments),
            )));
        }
    }
    if let Some(why) = hidden(ctx, call, seen.history) {
        return Outcome::Done(Err(ToolError::InvalidArguments(why)));
    }
    if let Some(env) = ctx
        .helpers
        .as_ref()
        .filter(|_| subagents::is_helper_tool(ctx.agent, &call.name))
    {
        return call_helper(ctx, env, call, seen.history, cancel, None).await;
    }
    if let Some(tool) = ctx
        .tools
        .iter()
        .find(|t| t.name() == call.name && !t.depends().is_empty())
    {
        let state = LookupState {
            args: call_arguments(call),
            ..Default::default()
        };
        return orchestrated(&ctx.call_env(), call, tool, state).await;
    }
    Outcome::Done(run_tool(ctx, call, seen).await)
}

async fn run_tool(
    ctx: &RunContext<'_>,
    call: &ToolCall,
    seen: Seen<'_>,
) -> Result<ToolOutput, ToolError> {
    let args: serde_json::Value = call.parse_arguments().map_err(|e| {
        ToolError::InvalidArguments(format!("the arguments are not valid JSON: {e}"))
    })?;
    let Some(tool) = ctx.tools.iter().find(|t| t.name() == call.name) else {
        return Err(ToolError::InvalidArguments(format!(
            "there is no tool named `{}`",
            call.name
        )));
    };
    let mut call_ctx = ctx.call.clone();
    call_ctx.turn_id = call.id.clone();
    call_ctx.step_id = step_of(seen.history, &call.id);
    if tool.receives_session() {
        call_ctx = match seen.encoded {
            // The run's conversation holds the first turns encoded already.
            Some((bytes, n)) if n <= seen.history.len() => {
                call_ctx.with_encoded_session(bytes, &seen.history[n..])
            }
            _ => call_ctx.with_session(seen.history),
        };
    }
    // The key covers the session's context where the tool is given it.
    let key = ctx
        .cache
        .and_then(|_| ToolCache::key(&place(ctx), tool, &args, ctx.values, &call_ctx));
    if let (Some(cache), Some(key)) = (ctx.cache, key.as_ref()) {
        if let Some(hit) = cache.get(key) {
            tracing::debug!("tool cache hit");
            return Ok(ToolOutput::Text(hit));
        }
    }
    let out = tool.call(args, ctx.values, &call_ctx).await?;
    // Text only: a cache of media would hold megabytes an entry.
    if let (Some(cache), Some(key), Some(text)) = (ctx.cache, key, out.as_text()) {
        cache.put(key, text);
    }
    Ok(out)
}

/// Why `call` may not run now: its tool's group is not active after
/// `history`. Groups hide tools from the model only: an MCP client sees
/// every tool `/mcp` exposes and calls it as listed. A tool in no group
/// costs nothing here (the history is read only for one in a group).
fn hidden(ctx: &RunContext<'_>, call: &ToolCall, history: &[Turn]) -> Option<String> {
    if ctx.origin != ToolCaller::Model {
        return None;
    }
    let tool = ctx
        .tools
        .iter()
        .find(|t| t.name() == call.name && t.toolgroup().is_some())?;
    Groups::hidden(tool, &Groups::of(ctx.tools).active(history))
}

/// The model turn a call belongs to, named by that turn's first call's id
/// (the call's own id when no turn of the history holds it).
fn step_of(history: &[Turn], call_id: &str) -> String {
    history
        .iter()
        .rev()
        .find_map(|t| match t.message() {
            ChatMessage::Assistant { tool_calls, .. }
                if tool_calls.iter().any(|c| c.id == call_id) =>
            {
                tool_calls.first().map(|c| c.id.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| call_id.to_string())
}

/// The agent's place in the tree: its call stack, top-level agent first.
fn place(ctx: &RunContext<'_>) -> Vec<String> {
    match &ctx.helpers {
        Some(env) if !env.stack.is_empty() => env.stack.clone(),
        _ => vec![ctx.agent.name.clone()],
    }
}

/// A suspended helper run to go on with: its history, and the answers to
/// the calls it waited for.
struct Resume<'r> {
    history: Vec<Turn>,
    resolved: &'r [PendingCall],
}

/// A helper tool: describe, derive, or run the helper's own loop (from the
/// start, or resumed). A call that waits inside the helper comes back as
/// [`Outcome::Blocked`], with this helper's frame in front of its own.
async fn call_helper(
    ctx: &RunContext<'_>,
    env: &HelperEnv<'_>,
    call: &ToolCall,
    history: &[Turn],
    cancel: &CancellationToken,
    resume: Option<Resume<'_>>,
) -> Outcome {
    let args: serde_json::Value = match call.parse_arguments() {
        Ok(a) => a,
        Err(e) => {
            return Outcome::Done(Err(ToolError::InvalidArguments(format!(
                "the arguments are not valid JSON: {e}"
            ))))
        }
    };
    let name = call.name.as_str();
    if name == subagents::DESCRIBE {
        return Outcome::Done(subagents::describe(ctx.agent, env, args).map(ToolOutput::Text));
    }
    if name == subagents::DERIVE {
        return Outcome::Done(subagents::derive(ctx.agent, env, args).map(ToolOutput::Text));
    }
    let slug = subagents::helper_slug(ctx.agent, name).unwrap_or(name);
    let p = match subagents::prepare(ctx.agent, ctx.values, env, slug, args, history) {
        Ok(p) => p,
        Err(e) => return Outcome::Done(Err(e)),
    };
    let caller_taint = taint(ctx, history);
    let sub = RunContext {
        agent: p.agent,
        tools: &p.tools,
        helpers: Some(p.env.clone()),
        client: p.client,
        values: &p.values,
        call: CallContext {
            agent_id: p.agent.name.clone(),
            ..ctx.call.clone()
        },
        cache: ctx.cache,
        lookups: ctx.lookups,
        metrics: ctx.metrics,
        max_steps: p.agent.spec.max_steps.unwrap_or(ctx.max_steps),
        stream: false,
        // A helper's calls are its own model's, in its own conversation.
        origin: ToolCaller::Model,
        taint_from: 0,
        caller_taint: &caller_taint,
        // What a helper uses counts against the session's budgets.
        ledger: ctx.ledger,
        clock: ctx.clock,
    };
    tracing::info!(helper = %p.agent.name, depth = p.env.stack.len(), resumed = resume.is_some(), "helper run");
    // A helper's turns stay its own: the caller gets the answer.
    let (mut sub_history, end) = match resume {
        None => (vec![Turn::new(ChatMessage::user(p.what.clone()))], None),
        Some(r) => {
            let mut h = r.history;
            let end = Box::pin(answer_resolved(&sub, r.resolved, &mut h, &Discard, cancel)).await;
            (h, end)
        }
    };
    let end = match end {
        Some(end) => end,
        None => Box::pin(run(&sub, &mut sub_history, &Discard, cancel)).await,
    };
    // The helper's own secrets (which the caller's scrubber does not know)
    // stay out of its answer too.
    let scrubber = scrubber_for(&p.values, &p.tools);
    let answer = match end {
        RunEnd::Completed => Ok(sub_history
            .iter()
            .rev()
            .find_map(|m| match m.message() {
                ChatMessage::Assistant {
                    content: Some(c), ..
                } => Some(c.clone()),
                _ => None,
            })
            .unwrap_or_default()),
        // A helper's own run always goes until it blocks.
        RunEnd::Stepped => Err(ToolError::Failed(
            "the helper stopped after one step".into(),
        )),
        RunEnd::MaxSteps(n) => Err(ToolError::Failed(format!(
            "the helper gave no answer within {n} turns"
        ))),
        RunEnd::Cancelled => Err(ToolError::Failed("the run was cancelled".into())),
        RunEnd::Failed(why) => Err(ToolError::Failed(format!("the helper failed: {why}"))),
        RunEnd::OverBudget(why) => Err(ToolError::Failed(format!("the helper stopped: {why}"))),
        RunEnd::Blocked(mut calls) => {
            let frame = Frame {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
                history: sub_history,
            };
            for b in &mut calls {
                b.frames.insert(0, frame.clone());
            }
            return Outcome::Blocked(calls);
        }
    };
    Outcome::Done(
        answer
            .map(|text| ToolOutput::Text(scrubber.scrub(&text)))
            .map_err(|e| e.scrubbed(&scrubber)),
    )
}

/// Where a helper's own run reports: nowhere but traces.
struct Discard;

#[async_trait]
impl RunSink for Discard {
    async fn turn(&self, _: &Turn, _: Events) {}
    fn delta(&self, _: &str) {}
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bindery_tests::mock_llm::{MockLlm, MockReply};

    use super::*;
    use bindery_llm::{ChatClient, ModelEndpoint};
    use bindery_tree::{AgentSources, LoadOptions};

    /// A sink whose every write of a turn with tool calls finds the run
    /// taken, as a store does once another server has closed it.
    struct TakenOnStore {
        turns: Mutex<Vec<Turn>>,
        cancel: CancellationToken,
    }

    #[async_trait]
    impl RunSink for TakenOnStore {
        async fn turn(&self, msg: &Turn, _: Events) {
            self.turns.lock().unwrap().push(msg.clone());
        }
        async fn stored(&self) {
            let asked = self.turns.lock().unwrap().iter().any(|m| {
                matches!(m.message(), ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty())
            });
            if asked {
                self.cancel.cancel();
            }
        }
        fn delta(&self, _: &str) {}
    }

    /// The turn is handed over and its write has not yet said whether the
    /// run is still this server's: the call waits for it, and never runs
    /// when the run turns out taken.
    #[tokio::test]
    async fn a_call_waits_for_the_turn_that_asked_for_it_to_be_stored() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("marked");
        let tools = dir.path().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        let script = tools.join("mark");
        std::fs::write(
            &script,
            format!(
                "#!/usr/bin/env bash\nif [[ \"${{1:-}}\" == describe ]]; then\n  echo '{{\"slug\": \"mark\", \"description\": \"Leaves a mark.\", \"args\": []}}'\n  exit 0\nfi\ntouch '{}'\necho marked\n",
                mark.display()
            ),
        )
        .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mock = MockLlm::start(|_| MockReply::tool_call("bash_mark", json!({}))).await;
        let file = dir.path().join("agent.yaml");
        std::fs::write(
            &file,
            format!(
                "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: marker}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
                mock.url(),
                tools.display()
            ),
        )
        .unwrap();
        let tree = bindery_tree::load(&AgentSources::Files(vec![file]), &LoadOptions::default())
            .await
            .unwrap();
        let agent = tree.pick(None).unwrap();
        let tools = agent.tools.snapshot();
        let client = ChatClient::new(ModelEndpoint::new(mock.url(), "m")).unwrap();
        let values = agent.process_values();
        let metrics = Metrics::default();
        let ctx = RunContext {
            ledger: None,
            clock: &bindery_store::clock::WallClock,
            agent,
            tools: &tools,
            helpers: None,
            client: &client,
            values: &values,
            call: CallContext::of_session("s", &agent.name),
            cache: None,
            lookups: None,
            metrics: &metrics,
            max_steps: 3,
            stream: false,
            origin: ToolCaller::Model,
            taint_from: 0,
            caller_taint: &[],
        };
        let cancel = CancellationToken::new();
        let sink = TakenOnStore {
            turns: Mutex::default(),
            cancel: cancel.clone(),
        };
        let mut history = vec![Turn::new(ChatMessage::user("mark it"))];
        let end = run(&ctx, &mut history, &sink, &cancel).await;

        assert_eq!(end, RunEnd::Cancelled);
        assert!(!mark.exists(), "the tool ran before its call was stored");
        let turns = sink.turns.lock().unwrap();
        assert_eq!(
            turns.len(),
            2,
            "the call, then its cancelled result: {turns:?}"
        );
        assert!(
            matches!(turns[1].message(), ChatMessage::Tool { content, .. } if content.text().contains("cancelled")),
            "{turns:?}"
        );
    }
}
