//! A held run goes on: the calls it stopped before, answered as they
//! were resolved (an approved call runs now, a helper that waited is
//! resumed with its own calls' answers).

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::host::Host;
use super::Outcome;
use super::RunContext;
use super::RunEnd;
use bindery_bindings::scrubber_for;
use bindery_llm::ToolCall;
use bindery_llm::Turn;
use bindery_store::lookup::LookupState;
use bindery_store::pending::Frame;
use bindery_store::pending::PendingCall;
use bindery_store::pending::Resolution;
use bindery_tools::Disposition;
use bindery_tools::ToolError;
use bindery_tools::ToolOutput;

use super::dispatch::call_helper;
use super::dispatch::dispatch;
use super::dispatch::orchestrated;
use super::dispatch::record_result;
use super::dispatch::settle;
use super::dispatch::Resume;
use super::dispatch::Seen;

/// Answer the calls a run stopped before, as they were resolved: an
/// approved call runs now (its first run), the others get what the
/// resolution says; a helper that waited is resumed with its own calls'
/// answers and runs on. Then the run goes on with [`run`](super::step::run) (`None`), unless
/// it was cancelled or a helper waits again.
pub async fn answer_resolved(
    ctx: &RunContext<'_>,
    resolved: &[PendingCall],
    history: &mut Vec<Turn>,
    host: &dyn Host,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    let mut waiting = Vec::new();
    let scrubber = scrubber_for(ctx.values, ctx.tools);
    // A helper's calls, by the `prompt_agent_*` call that started it, in order.
    let mut helpers: Vec<(Frame, Vec<PendingCall>)> = Vec::new();
    for item in resolved.iter().filter(|i| i.resolution.is_some()) {
        // What came before is on record before this call may run.
        host.stored().await;
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
                    host.approve(name);
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
                        record_result(history, host, &scrubber, &item.tool_call_id, why).await;
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
            let env = ctx.call_env(host);
            match (
                tool,
                item.resolution
                    .as_ref()
                    .map_or(Err(NotRun::DoesNotFit), |r| go_on(state, r)),
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
                (_, Err(why)) => Outcome::Done(Err(ToolError::Failed(why.to_string()))),
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
                        r = dispatch(ctx, host, &call, Seen::of(history), cancel) => Some(r),
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
            host,
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
        host.stored().await;
        let Some(env) = ctx.helpers.as_ref() else {
            let why = Err(ToolError::Failed("helpers are not available here".into()));
            record_result(history, host, &scrubber, &frame.call_id, why).await;
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
        let outcome = call_helper(ctx, host, env, &call, history, cancel, Some(resume)).await;
        settle(
            history,
            host,
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

/// Why a waiting call does not run, as the model is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRun {
    /// A person said no: their reason, or that they refused.
    #[error("{0}")]
    Refused(String),
    /// The answer is not one the call asked for (an option it did not offer).
    #[error("the answer does not fit the call")]
    DoesNotFit,
}

/// The orchestration state an answer leads to, or why the call does not run.
pub fn go_on(mut state: LookupState, r: &Resolution) -> Result<LookupState, NotRun> {
    use bindery_store::lookup::Ask;
    match (r, &state.ask) {
        (Resolution::Chosen { option }, Ask::Selection { key, options, .. }) => {
            let real = options
                .iter()
                .find(|o| &o.id == option)
                .ok_or(NotRun::DoesNotFit)?
                .real
                .clone();
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
            return Err(NotRun::Refused(
                other
                    .refusal()
                    .unwrap_or_else(|| "the call did not run".into()),
            ))
        }
    }
    Ok(state)
}
