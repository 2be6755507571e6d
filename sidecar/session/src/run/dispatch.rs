//! A turn's tool calls: which wait (approvals, taint, budgets), which run
//! (concurrently, once the turn that asked for them is on record), through
//! the bindings, the cache, a tool's dependency lookups or a helper's own
//! run; and each outcome recorded, scrubbed, through the session's port.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::call_arguments;
use super::host::Host;
use super::host::Subrun;
use super::Blocked;
use super::Events;
use super::Outcome;
use super::RunContext;
use super::RunEnd;
use super::CANCELLED;
use crate::budget::Gate;
use crate::lookups;
use crate::lookups::LookupCache;
use crate::lookups::Step;
use crate::subagents;
use crate::subagents::HelperEnv;
use crate::toolgroups;
use crate::toolgroups::Groups;
use bindery_bindings::cache::ToolCache;
use bindery_bindings::scrubber_for;
use bindery_bindings::BoundTool;
use bindery_llm::ChatMessage;
use bindery_llm::ToolCall;
use bindery_llm::Turn;
use bindery_metrics::ToolCaller;
use bindery_metrics::ToolOutcome;
use bindery_params::scrub::Scrubber;
use bindery_params::ParamValue;
use bindery_params::SecretString;
use bindery_params::Values;
use bindery_store::lookup::LookupState;
use bindery_store::pending::Frame;
use bindery_store::pending::PendingCall;
use bindery_store::pending::TaintSource;
use bindery_store::wire::SessionEvent;
use bindery_store::wire::ToolResult;
use bindery_tools::CallContext;
use bindery_tools::Disposition;
use bindery_tools::ToolError;
use bindery_tools::ToolOutput;
use bindery_tree::LoadedAgent;

use super::resume::answer_resolved;
use super::step::budget_hold;
use super::step::run;
use super::step::{as_run, HIDDEN};

/// The calls of one turn: those that wait become pending items, the
/// others run (concurrently, once the turn that asked for them is stored)
/// and their results are recorded. `None`: every call is answered and the
/// run may go on; else how it stops.
pub(super) async fn act(
    ctx: &RunContext<'_>,
    calls: &[ToolCall],
    history: &mut Vec<Turn>,
    encoded: Option<(&[u8], usize)>,
    host: &dyn Host,
    scrubber: &Scrubber,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    let (waiting, now): (Vec<_>, Vec<_>) = calls
        .iter()
        .map(|c| (c, blocked(ctx, c, history)))
        .partition(|(_, b)| b.is_some());
    let now: Vec<&ToolCall> = now.into_iter().map(|(c, _)| c).collect();
    host.stored().await;
    // The session's JSON, the same for every call of the turn: made once
    // and shared, not held once a call by a thousand calls waiting.
    let json = SharedJson::new();
    // Each call's outcome as it ends. Biased: a run cancelled by then (or
    // found taken) starts no call, and once cancelled no call goes on.
    let mut running: futures::stream::FuturesUnordered<_> = now
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let seen = Seen {
                history,
                encoded,
                json: Some(&json),
            };
            async move { (i, dispatch(ctx, host, c, seen, cancel).await) }
        })
        .collect();
    let mut ended: Vec<Option<Outcome>> = now.iter().map(|_| None).collect();
    let cancelled = loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break true,
            next = futures::StreamExt::next(&mut running) => match next {
                Some((i, outcome)) => ended[i] = Some(outcome),
                None => break false,
            },
        }
    };
    drop(running);
    let mut waiting: Vec<Blocked> = waiting.into_iter().filter_map(|(_, b)| b).collect();
    if cancelled {
        // A call that ended before the cancel keeps its result (its side
        // effect happened, and the model is told so); the others (one
        // left waiting on a person included) say they were cancelled.
        for call in calls {
            let done =
                now.iter()
                    .position(|c| c.id == call.id)
                    .and_then(|i| match ended[i].take() {
                        Some(Outcome::Done(result)) => Some(result),
                        _ => None,
                    });
            match done {
                Some(result) => record_result(history, host, scrubber, &call.id, result).await,
                None => {
                    let msg = Turn::new(ChatMessage::tool_result(&call.id, CANCELLED));
                    history.push(msg.clone());
                    host.turn(&msg, Events::new()).await;
                }
            }
        }
        return Some(RunEnd::Cancelled);
    }
    for (call, outcome) in now.iter().zip(ended) {
        if let Some(outcome) = outcome {
            settle(history, host, scrubber, &call.id, outcome, &mut waiting).await;
        }
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
    host: &dyn Host,
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
        act(ctx, &calls, history, None, host, &scrubber, cancel),
    )
    .await
    .unwrap_or(RunEnd::Completed)
}

/// The call as a pending item, if it waits instead of running: its
/// toolbox's or the agent's `confirm` (a condition that holds, or cannot be
/// told), or the taint guard (an egress call after an untrusted result).
pub(super) fn blocked(ctx: &RunContext<'_>, call: &ToolCall, history: &[Turn]) -> Option<Blocked> {
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

pub(super) fn condition_asks(
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
pub(super) async fn settle(
    history: &mut Vec<Turn>,
    host: &dyn Host,
    scrubber: &Scrubber,
    id: &str,
    outcome: Outcome,
    waiting: &mut Vec<Blocked>,
) {
    match outcome {
        Outcome::Done(result) => record_result(history, host, scrubber, id, result).await,
        Outcome::Blocked(inner) => waiting.extend(inner),
    }
}

/// Append a call's outcome to the history, the store and the stream,
/// scrubbed of every secret the run can reach: whatever the model, the
/// history, the store and the stream get of a tool passes this point
/// (a result run now, an approved call, a client's deferred result, a
/// refusal's reason, a helper's answer).
pub(super) async fn record_result(
    history: &mut Vec<Turn>,
    host: &dyn Host,
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
    host.turn(&msg, vec![event]).await;
}

/// The lookups one call may take when the agent sets no `maxSteps`, at least.
const MIN_LOOKUPS: u32 = 16;

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
    /// The session the run reports to, whose budgets lookups count
    /// against too (none: nothing is counted).
    pub host: Option<&'a dyn Host>,
}

impl<'a> RunContext<'a> {
    pub(super) fn call_env(&'a self, host: &'a dyn Host) -> CallEnv<'a> {
        CallEnv {
            host: Some(host),
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
/// answer goes into `state` with [`go_on`](super::resume::go_on) and the call is made again.
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
        host: ctx.host,
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
                if let Err(e) = audited(ctx.host, tool, &call.id, ctx.values).await {
                    return Outcome::Done(Err(e));
                }
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

/// One tool call through its bindings (and the cache), or a helper call;
/// its outcome is counted once, here (a helper that waits is not yet).
/// [`record_result`] scrubs what it returns.
pub(super) async fn dispatch(
    ctx: &RunContext<'_>,
    host: &dyn Host,
    call: &ToolCall,
    seen: Seen<'_>,
    cancel: &CancellationToken,
) -> Outcome {
    let span = tracing::info_span!("tool_call", tool = %call.name, call_id = %call.id, caller = ctx.origin.as_str(), subject = ctx.subject);
    // The person's token expired while the run went on: this call, and
    // every helper it starts, take none of what it was exchanged for.
    let expired;
    let narrowed;
    let ctx = match ctx.values_now() {
        Some(values) => {
            expired = values;
            narrowed = RunContext {
                values: &expired,
                call: ctx.call.clone(),
                helpers: ctx.helpers.clone(),
                tokens_until: None,
                ..*ctx
            };
            &narrowed
        }
        None => ctx,
    };
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
        // A call over a rate limit never runs, and counts against no budget.
        if let Some(why) = host.rate_limited(counted_as) {
            tracing::info!("a tool call over its rate limit did not run");
            return Outcome::Done(Err(ToolError::Failed(why)));
        }
        match host.before_tool(counted_as).await {
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
        let started = Instant::now();
        let outcome = dispatch_inner(ctx, host, call, seen, cancel).await;
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
pub(super) struct Seen<'a> {
    pub(super) history: &'a [Turn],
    /// The first turns of `history`, encoded, and how many they are.
    pub(super) encoded: Option<(&'a [u8], usize)>,
    /// Where the calls of one turn share the session's JSON (`None`: a
    /// call of its own makes it).
    pub(super) json: Option<&'a SharedJson>,
}

/// The session's JSON (`AGENT_SESSION_JSON`) as the calls of one turn see
/// it, made by the first that needs it.
pub(super) type SharedJson = std::sync::OnceLock<Option<std::sync::Arc<str>>>;

impl<'a> Seen<'a> {
    pub(super) fn of(history: &'a [Turn]) -> Self {
        Seen {
            history,
            encoded: None,
            json: None,
        }
    }

    /// `call_ctx` given the session as seen here.
    fn session_for(&self, call_ctx: CallContext) -> CallContext {
        let make = |c: CallContext| match self.encoded {
            // The run's conversation holds the first turns encoded already.
            Some((bytes, n)) if n <= self.history.len() => {
                c.with_encoded_session(bytes, &self.history[n..])
            }
            _ => c.with_session(self.history),
        };
        match self.json {
            None => make(call_ctx),
            Some(shared) => {
                let json = shared.get_or_init(|| make(call_ctx.clone()).session_json);
                CallContext {
                    session_json: json.clone(),
                    ..call_ctx
                }
            }
        }
    }
}

pub(super) async fn dispatch_inner(
    ctx: &RunContext<'_>,
    host: &dyn Host,
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
        return call_helper(ctx, host, env, call, seen.history, cancel, None).await;
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
        return orchestrated(&ctx.call_env(host), call, tool, state).await;
    }
    Outcome::Done(run_tool(ctx, host, call, seen).await)
}

/// The secret parameters bound into a call of `tool` with `values`, by name.
pub(crate) fn bound_secrets(tool: &BoundTool, values: &Values) -> Vec<String> {
    tool.bound_params()
        .into_iter()
        .filter(|n| matches!(values.get(n), Some(ParamValue::Secret(_))))
        .collect()
}

/// Record, through `host`, that `tool` is called (call `call_id`) with
/// the credentials `values` bind into it: an `Err` and it is not.
pub(crate) async fn audited(
    host: Option<&dyn Host>,
    tool: &BoundTool,
    call_id: &str,
    values: &Values,
) -> Result<(), ToolError> {
    let Some(host) = host else {
        return Ok(());
    };
    host.before_call(tool.name(), call_id, &bound_secrets(tool, values))
        .await
        .map_err(|e| ToolError::Failed(e.to_string()))
}

pub(super) async fn run_tool(
    ctx: &RunContext<'_>,
    host: &dyn Host,
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
        call_ctx = seen.session_for(call_ctx);
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
    audited(Some(host), tool, &call.id, ctx.values).await?;
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
pub(super) fn hidden(ctx: &RunContext<'_>, call: &ToolCall, history: &[Turn]) -> Option<String> {
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
pub(super) fn step_of(history: &[Turn], call_id: &str) -> String {
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
pub(super) fn place(ctx: &RunContext<'_>) -> Vec<String> {
    match &ctx.helpers {
        Some(env) if !env.stack.is_empty() => env.stack.clone(),
        _ => vec![ctx.agent.name.clone()],
    }
}

/// A suspended helper run to go on with: its history, and the answers to
/// the calls it waited for.
pub(super) struct Resume<'r> {
    pub(super) history: Vec<Turn>,
    pub(super) resolved: &'r [PendingCall],
}

/// A helper tool: describe, derive, or run the helper's own loop (from the
/// start, or resumed). A call that waits inside the helper comes back as
/// [`Outcome::Blocked`], with this helper's frame in front of its own.
pub(super) async fn call_helper(
    ctx: &RunContext<'_>,
    host: &dyn Host,
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
        subject: ctx.subject,
        tokens_until: ctx.tokens_until,
        // A helper's calls are its own model's, in its own conversation.
        origin: ToolCaller::Model,
        taint_from: 0,
        caller_taint: &caller_taint,
        clock: ctx.clock,
    };
    tracing::info!(helper = %p.agent.name, depth = p.env.stack.len(), resumed = resume.is_some(), "helper run");
    // A helper's turns stay its own: the caller gets the answer; what it
    // uses counts against the session's budgets.
    let own = Subrun(host);
    let (mut sub_history, end) = match resume {
        None => (vec![Turn::new(ChatMessage::user(p.what.clone()))], None),
        Some(r) => {
            let mut h = r.history;
            let end = Box::pin(answer_resolved(&sub, r.resolved, &mut h, &own, cancel)).await;
            (h, end)
        }
    };
    let end = match end {
        Some(end) => end,
        None => Box::pin(run(&sub, &mut sub_history, &own, cancel)).await,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls of one turn share one copy of the session's JSON: a
    /// thousand calls waiting for a process slot hold it once.
    #[test]
    fn the_calls_of_a_turn_share_the_sessions_json() {
        let history = vec![Turn::new(ChatMessage::user("hello"))];
        let shared = SharedJson::new();
        let seen = Seen {
            history: &history,
            encoded: None,
            json: Some(&shared),
        };
        let call = CallContext::of_session("s", "a");
        let (one, two) = (
            seen.session_for(call.clone()),
            seen.session_for(call.clone()),
        );
        let (one, two) = (one.session_json.unwrap(), two.session_json.unwrap());
        assert!(std::sync::Arc::ptr_eq(&one, &two));
        assert!(one.contains("hello"), "{one}");
        // A call of its own makes the same JSON.
        let alone = Seen::of(&history).session_for(call).session_json.unwrap();
        assert_eq!(&*alone, &*one);
    }
}
