//! One tool call through its bindings, as the model's would go in a run:
//! `tool-call` makes it from `--args`, `replay-tool-call --agent-file` from
//! a call recorded in a session.

use std::process::ExitCode;

use tracing::Instrument;

use bindery_bindings::BoundTool;
use bindery_llm::ToolCall;
use bindery_params::Values;
use bindery_session::lookups::LookupCache;
use bindery_session::run::{self, CallEnv, Outcome};
use bindery_store::lookup::LookupState;
use bindery_tools::{CallContext, ToolError};
use bindery_tree::LoadedAgent;

use super::ask::AskError;

/// Why a tool call from the command line did not run to an end: no such
/// tool, a person's answer missing, or the tool's own failure (scrubbed of
/// every secret).
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    /// `tools`: the agent's tool names, or `none`.
    #[error("agent `{agent}` has no tool `{tool}` (tools: {tools})")]
    NoSuchTool {
        agent: String,
        tool: String,
        tools: String,
    },
    #[error(transparent)]
    Ask(#[from] AskError),
    #[error("tool {tool}: nothing to ask")]
    NothingToAsk { tool: String },
    #[error("tool {tool}: no answer")]
    NoAnswer { tool: String },
    #[error("tool {tool}: {source}")]
    Failed { tool: String, source: ToolError },
}

/// How a call with dependencies gets what a person must say.
#[derive(Clone, Copy, Default)]
pub(super) struct Asking<'a> {
    /// Approve the confirmation without asking.
    pub yes: bool,
    /// The option to take at a choice (its id, number or label).
    pub choose: Option<&'a str>,
    /// The arguments are not the person's own (a replayed call, read from
    /// a file anyone may have written): a call the agent says waits for a
    /// person (`confirm`, a `when` condition, an `egress` tool, whose
    /// session's taint a file cannot be trusted to tell) is asked as a
    /// run's would be, never run unasked.
    pub replayed: bool,
}

/// Call `tool` of `agent` with the model's `model_args`: bound values
/// (the process values: flags, files, the environment) merged in, the
/// output scrubbed of every secret, printed to stdout. A tool with
/// `depends_on` is orchestrated as in a run: its lookups, then a choice
/// and a confirmation asked on the terminal (or given by `asking`).
pub(super) async fn through_bindings(
    agent: &LoadedAgent,
    tool: &str,
    model_args: serde_json::Value,
    session_id: Option<&str>,
    asking: Asking<'_>,
) -> Result<ExitCode, CallError> {
    let bound = find_tool(agent, tool)?;
    match outcome(agent, &bound, model_args, session_id, asking).await? {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') && !text.is_empty() {
                println!();
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(source) => Err(CallError::Failed {
            tool: tool.to_string(),
            source,
        }),
    }
}

/// What calling `bound` as [`through_bindings`] does came to: its output
/// or its error, scrubbed of every secret (`Err` outside: nothing ran to
/// an end, as when a person's answer is missing).
pub(super) async fn outcome(
    agent: &LoadedAgent,
    bound: &BoundTool,
    model_args: serde_json::Value,
    session_id: Option<&str>,
    asking: Asking<'_>,
) -> Result<Result<String, ToolError>, CallError> {
    let tool = bound.name();
    let id = format!("cli-{}", std::process::id());
    let ctx = CallContext::one_off(session_id.unwrap_or(&id), &id, &agent.name);
    // The same span as a call in a run, so that a trace of a
    // `tool-call` looks like one step of a session.
    let span = tracing::info_span!("tool_call", tool = %tool, call_id = %ctx.turn_id);
    let values = agent.process_values();
    let scrubber = bindery_bindings::scrubber_for(&values, std::slice::from_ref(bound));
    if asking.replayed && !approved_replay(agent, &values, bound, &model_args, &ctx, asking)? {
        return Ok(Err(ToolError::Failed(format!(
            "{tool} needs a person's approval and did not get it"
        ))));
    }
    let result = if bound.depends().is_empty() {
        bound
            .call(model_args, &values, &ctx)
            .instrument(span)
            .await
            .map(|out| out.shown())
    } else {
        orchestrated(agent, bound, model_args, &values, &ctx, asking)
            .instrument(span)
            .await?
    };
    Ok(result
        .map(|text| scrubber.scrub(&text))
        .map_err(|e| e.scrubbed(&scrubber)))
}

/// Whether a replayed call may run: asked on the terminal ([`super::ask::ask_item`],
/// `--yes` approving) when it needs a person. A tool with `depends_on`
/// whose agent says `confirm` is asked after its lookups instead, as in a
/// run.
fn approved_replay(
    agent: &LoadedAgent,
    values: &Values,
    bound: &BoundTool,
    model_args: &serde_json::Value,
    ctx: &CallContext,
    asking: Asking<'_>,
) -> Result<bool, CallError> {
    let call = ToolCall {
        id: ctx.turn_id.clone(),
        name: bound.name().to_string(),
        arguments: model_args.to_string(),
    };
    let asked_later =
        !bound.depends().is_empty() && agent.disposition(bound.name(), Some(bound)).is_some();
    let needs = run::needs_approval(agent, values, &call, Some(bound)).or_else(|| {
        bound
            .egress()
            .then_some(bindery_tools::Disposition::Confirm)
    });
    let Some(disposition) = needs.filter(|_| !asked_later) else {
        return Ok(true);
    };
    let item = serde_json::json!({
        "tool": bound.name(),
        "disposition": disposition.as_str(),
        "call": model_args,
    });
    Ok(matches!(
        super::ask::ask_item(&item, asking.yes, None)?,
        bindery_store::pending::Resolution::Approved
    ))
}

pub(super) fn find_tool(agent: &LoadedAgent, name: &str) -> Result<BoundTool, CallError> {
    agent.tool(name).ok_or_else(|| {
        let names: Vec<String> = agent.tools.iter().map(|t| t.name().to_string()).collect();
        CallError::NoSuchTool {
            agent: agent.name.clone(),
            tool: name.to_string(),
            tools: if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            },
        }
    })
}

/// A tool with dependencies, called once as a run would call it: lookups,
/// then each pending item asked ([`super::ask::ask_terminal`]) and its
/// answer applied, until the call runs or is refused.
async fn orchestrated(
    agent: &LoadedAgent,
    bound: &BoundTool,
    model_args: serde_json::Value,
    values: &Values,
    ctx: &CallContext,
    asking: Asking<'_>,
) -> Result<Result<String, ToolError>, CallError> {
    let tools = agent.tools.snapshot();
    let lookups = LookupCache::default();
    let env = CallEnv {
        agent,
        tools: &tools,
        values,
        call: ctx,
        lookups: Some(&lookups),
        // The agent's maxSteps, or the least one call's lookups may take.
        max_steps: 0,
        clock: &bindery_store::clock::WallClock,
        // `tool-call` keeps no store, so nothing is counted.
        host: None,
    };
    let call = ToolCall {
        id: ctx.turn_id.clone(),
        name: bound.name().to_string(),
        arguments: model_args.to_string(),
    };
    let mut state = LookupState {
        args: model_args,
        ..Default::default()
    };
    loop {
        let waiting = match run::orchestrated(&env, &call, bound, state).await {
            Outcome::Done(result) => return Ok(result.map(|o| o.shown())),
            Outcome::Blocked(waiting) => waiting,
        };
        let answered = super::ask::ask_terminal(&waiting, asking.yes, asking.choose)?;
        let (Some(item), Some(lookup)) = (
            answered.first(),
            waiting.first().and_then(|b| b.lookup.clone()),
        ) else {
            return Err(CallError::NothingToAsk { tool: call.name });
        };
        let Some(resolution) = item.resolution.as_ref() else {
            return Err(CallError::NoAnswer { tool: call.name });
        };
        state = match run::go_on(lookup, resolution) {
            Ok(next) => next,
            Err(why) => return Ok(Err(ToolError::Failed(why.to_string()))),
        };
    }
}
