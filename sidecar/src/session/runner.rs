//! One run: from a client's request until control returns to the client.
//!
//! Model turn, then every tool call of that turn (concurrently, through the
//! bindings), then the next model turn, until the model answers, the step
//! limit is hit, or the run is cancelled. The history records what the
//! model said and what the tools returned, never a bound value.

use std::time::Instant;

use async_trait::async_trait;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::metrics::{Metrics, ToolOutcome};
use crate::bindings::BoundTool;
use crate::llm::{ChatClient, ChatMessage, ChatRequest, StreamDelta, ToolCall, ToolDefinition};
use crate::params::Values;
use crate::tools::cache::ToolCache;
use crate::tools::helpers::{self, HelperEnv};
use crate::tools::{CallContext, ToolError};
use crate::tree::LoadedAgent;

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
}

/// Where a run reports what happens.
#[async_trait]
pub trait RunSink: Send + Sync {
    /// A message to append to the history (persisted).
    async fn turn(&self, msg: &ChatMessage);
    /// An event for the session's stream (persisted, with an id).
    async fn event(&self, kind: &'static str, data: serde_json::Value);
    /// Streamed text as it arrives (live only).
    fn delta(&self, text: &str);
}

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
    pub metrics: &'a Metrics,
    pub max_steps: u32,
    pub stream: bool,
}

/// Run the loop over `history` (which ends with the request that started
/// the run). New messages go to `history` and to the sink.
pub async fn run(
    ctx: &RunContext<'_>,
    history: &mut Vec<ChatMessage>,
    sink: &dyn RunSink,
    cancel: &CancellationToken,
) -> RunEnd {
    let span = tracing::info_span!("run", session = %ctx.call.session_id, agent = %ctx.agent.name);
    async move {
        let mut tools: Vec<ToolDefinition> = ctx
            .tools
            .iter()
            .map(|t| ToolDefinition {
                name: t.name().to_string(),
                description: t.spec().description.clone(),
                parameters: t.model_schema(ctx.values),
            })
            .collect();
        if let Some(env) = &ctx.helpers {
            tools.extend(helpers::definitions(ctx.agent, env.tree));
        }
        for step in 0..ctx.max_steps {
            let mut messages = Vec::with_capacity(history.len() + 1);
            if !ctx.agent.spec.system_prompt.is_empty() {
                messages.push(ChatMessage::system(ctx.agent.spec.system_prompt.clone()));
            }
            messages.extend(history.iter().cloned());
            let request = ChatRequest {
                messages,
                tools: tools.clone(),
            };
            let response = tokio::select! {
                _ = cancel.cancelled() => return RunEnd::Cancelled,
                r = model_turn(ctx, &request, sink).instrument(tracing::info_span!("model_turn", step)) => r,
            };
            let response = match response {
                Ok(r) => r,
                Err(e) => return RunEnd::Failed(format!("the model request failed: {e}")),
            };
            let message = response.to_message();
            history.push(message.clone());
            sink.turn(&message).await;
            if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                sink.event("message", json!({"role": "assistant", "content": text})).await;
            }
            if response.tool_calls.is_empty() {
                return RunEnd::Completed;
            }
            for call in &response.tool_calls {
                // The call as the model made it: bound values are merged later.
                sink.event(
                    "tool_call",
                    json!({"id": call.id, "name": call.name, "arguments": call.arguments}),
                )
                .await;
            }
            let results = tokio::select! {
                _ = cancel.cancelled() => None,
                r = futures::future::join_all(response.tool_calls.iter().map(|c| dispatch(ctx, c, history, cancel))) => Some(r),
            };
            let Some(results) = results else {
                for call in &response.tool_calls {
                    let msg = ChatMessage::tool_result(&call.id, "error: the run was cancelled");
                    history.push(msg.clone());
                    sink.turn(&msg).await;
                }
                return RunEnd::Cancelled;
            };
            for (call, result) in response.tool_calls.iter().zip(results) {
                let (ok, output) = match result {
                    Ok(text) => (true, text),
                    Err(e) => (false, format!("error: {e}")),
                };
                let msg = ChatMessage::tool_result(&call.id, output.clone());
                history.push(msg.clone());
                sink.turn(&msg).await;
                sink.event("tool_result", json!({"id": call.id, "ok": ok, "output": output})).await;
            }
        }
        RunEnd::MaxSteps(ctx.max_steps)
    }
    .instrument(span)
    .await
}

async fn model_turn(
    ctx: &RunContext<'_>,
    request: &ChatRequest,
    sink: &dyn RunSink,
) -> Result<crate::llm::ChatResponse, crate::llm::LlmError> {
    let started = Instant::now();
    let result = if ctx.stream {
        let mut forward = |d: StreamDelta| {
            if let StreamDelta::Content(text) = d {
                sink.delta(&text);
            }
        };
        ctx.client.complete_streaming(request, &mut forward).await
    } else {
        ctx.client.complete(request).await
    };
    ctx.metrics
        .llm_request(started.elapsed().as_secs_f64(), result.is_ok());
    if let Err(e) = &result {
        tracing::warn!("model request failed: {e}");
    }
    result
}

/// One tool call through its bindings (and the cache), or a helper call;
/// its outcome is counted once, here.
async fn dispatch(
    ctx: &RunContext<'_>,
    call: &ToolCall,
    history: &[ChatMessage],
    cancel: &CancellationToken,
) -> Result<String, ToolError> {
    let span = tracing::info_span!("tool_call", tool = %call.name, call_id = %call.id);
    async {
        let result = dispatch_inner(ctx, call, history, cancel).await;
        let outcome = match &result {
            Ok(_) => ToolOutcome::Ok,
            Err(ToolError::Unavailable) => ToolOutcome::Unavailable,
            Err(_) => ToolOutcome::Error,
        };
        ctx.metrics.tool_call(&call.name, outcome);
        result
    }
    .instrument(span)
    .await
}

async fn dispatch_inner(
    ctx: &RunContext<'_>,
    call: &ToolCall,
    history: &[ChatMessage],
    cancel: &CancellationToken,
) -> Result<String, ToolError> {
    let args: serde_json::Value = call.parse_arguments().map_err(|e| {
        ToolError::InvalidArguments(format!("the arguments are not valid JSON: {e}"))
    })?;
    if let Some(env) = ctx
        .helpers
        .as_ref()
        .filter(|_| helpers::is_helper_tool(ctx.agent, &call.name))
    {
        return call_helper(ctx, env, &call.name, args, history, cancel).await;
    }
    let Some(tool) = ctx.tools.iter().find(|t| t.name() == call.name) else {
        return Err(ToolError::InvalidArguments(format!(
            "there is no tool named `{}`",
            call.name
        )));
    };
    let key = ctx
        .cache
        .and_then(|_| ToolCache::key(tool, &args, ctx.values));
    if let (Some(cache), Some(key)) = (ctx.cache, key.as_ref()) {
        if let Some(hit) = cache.get(key) {
            tracing::debug!("tool cache hit");
            return Ok(hit);
        }
    }
    let mut call_ctx = ctx.call.clone().with_session(history);
    call_ctx.turn_id = call.id.clone();
    let out = tool.call(args, ctx.values, &call_ctx).await?;
    if let (Some(cache), Some(key)) = (ctx.cache, key) {
        cache.put(key, out.text.clone());
    }
    Ok(out.text)
}

/// A helper tool: describe, derive, or run the helper's own loop.
async fn call_helper(
    ctx: &RunContext<'_>,
    env: &HelperEnv<'_>,
    name: &str,
    args: serde_json::Value,
    history: &[ChatMessage],
    cancel: &CancellationToken,
) -> Result<String, ToolError> {
    if name == helpers::DESCRIBE {
        return helpers::describe(ctx.agent, env, args);
    }
    if name == helpers::DERIVE {
        return helpers::derive(ctx.agent, env, args);
    }
    let slug = name.trim_start_matches("prompt_agent_");
    let p = helpers::prepare(ctx.agent, ctx.values, env, slug, args, history)?;
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
        metrics: ctx.metrics,
        max_steps: p.agent.spec.max_steps.unwrap_or(ctx.max_steps),
        stream: false,
    };
    let mut sub_history = vec![ChatMessage::user(p.what.clone())];
    tracing::info!(helper = %p.agent.name, depth = p.env.stack.len(), "helper run");
    // A helper's turns stay its own: the caller gets the answer.
    let end = Box::pin(run(&sub, &mut sub_history, &Discard, cancel)).await;
    match end {
        RunEnd::Completed => Ok(sub_history
            .iter()
            .rev()
            .find_map(|m| match m {
                ChatMessage::Assistant {
                    content: Some(c), ..
                } => Some(c.clone()),
                _ => None,
            })
            .unwrap_or_default()),
        RunEnd::MaxSteps(n) => Err(ToolError::Failed(format!(
            "the helper gave no answer within {n} turns"
        ))),
        RunEnd::Cancelled => Err(ToolError::Failed("the run was cancelled".into())),
        RunEnd::Failed(why) => Err(ToolError::Failed(format!("the helper failed: {why}"))),
    }
}

/// Where a helper's own run reports: nowhere but traces.
struct Discard;

#[async_trait]
impl RunSink for Discard {
    async fn turn(&self, _: &ChatMessage) {}
    async fn event(&self, _: &'static str, _: serde_json::Value) {}
    fn delta(&self, _: &str) {}
}
