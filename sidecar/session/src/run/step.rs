//! A run's steps: each model turn, asked through the session's port
//! ([`Host`]: a budget's gate before it, its use after), then its calls
//! handed to [`dispatch`](super::dispatch), until the model answers, the
//! step limit is hit, or the run is cancelled or held.

use std::collections::BTreeSet;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::host::Host;
use super::Blocked;
use super::Events;
use super::RunContext;
use super::RunEnd;
use crate::budget::Exceeded;
use crate::budget::Gate;
use crate::budget::Spent;
use crate::subagents;
use crate::toolgroups::Groups;
use bindery_bindings::scrubber_for;
use bindery_llm::ChatMessage;
use bindery_llm::Conversation;
use bindery_llm::StreamDelta;
use bindery_llm::ToolCall;
use bindery_llm::ToolDefinition;
use bindery_llm::Turn;
use bindery_store::wire::AssistantText;
use bindery_store::wire::SessionEvent;
use bindery_store::wire::ToolCallEvent;
use bindery_tools::Disposition;

use super::dispatch::act;

/// Run the loop over `history` (which ends with the request that started
/// the run). New messages go to `history` and to the sink.
///
/// A panic inside the loop (a bug, or input no check foresaw) fails the
/// run like any other failure, so that its session is let go and says
/// why, instead of staying `running` with no run left to end it.
pub async fn run(
    ctx: &RunContext<'_>,
    history: &mut Vec<Turn>,
    host: &dyn Host,
    cancel: &CancellationToken,
) -> RunEnd {
    use futures::FutureExt;
    let work = std::panic::AssertUnwindSafe(run_inner(ctx, history, host, cancel));
    as_run(ctx, async move {
        match work.catch_unwind().await {
            Ok(end) => end,
            Err(_) => {
                tracing::error!("the run panicked; it is failed and its session let go");
                RunEnd::Failed(PANICKED.to_owned())
            }
        }
    })
    .await
}

/// What a run that panicked ends with.
pub(crate) const PANICKED: &str =
    "the run failed inside Bindery (a bug; the server's log has it): send the message again";

/// `work` as a run of `ctx`: in its `run` span, with the run's secret
/// values (message-scope ones too) kept out of the logs while it goes on,
/// and so the id_sensitive ids its calls chose: until its spans have
/// ended, as they are scrubbed then.
pub(super) async fn as_run<T>(
    ctx: &RunContext<'_>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let span = tracing::info_span!("run", session = %ctx.call.session_id, agent = %ctx.agent.name, caller = ctx.origin.as_str(), subject = ctx.subject);
    let _live = bindery_params::live::register_values(ctx.values);
    HIDDEN
        .scope(std::sync::Mutex::new(Vec::new()), work.instrument(span))
        .await
}

tokio::task_local! {
    /// Where a run keeps the registrations of the id_sensitive ids its
    /// calls chose (see [`run`]).
    pub(super) static HIDDEN: std::sync::Mutex<Vec<bindery_params::live::Registration>>;
}

pub(super) async fn run_inner(
    ctx: &RunContext<'_>,
    history: &mut Vec<Turn>,
    host: &dyn Host,
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
        let mut downgraded_once = false;
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
            let claim = match host.before_model(model, &estimate).await {
                Gate::Go(claim) => claim,
                Gate::Refuse(e) => return RunEnd::OverBudget(e.detail()),
                Gate::Ask(e) => return RunEnd::Blocked(vec![budget_hold(None, e)]),
            };
            // A budget past its mark sends the request to a cheaper
            // fallback (and the chain after it) instead of the model.
            let downgrade = host.downgrade(claim).and_then(|d| {
                let at = model.fallbacks.iter().position(|f| f.name == d.to)?;
                Some((at, ctx.client.from_fallback(at)?, d))
            });
            let client = downgrade.as_ref().map_or(ctx.client, |(_, c, _)| c);
            let first = downgrade.as_ref().map_or(0, |(at, _, _)| at + 1);
            let streamed = std::sync::atomic::AtomicUsize::new(0);
            let response = tokio::select! {
                _ = cancel.cancelled() => None,
                r = model_turn(ctx, client, conversation, host, &streamed).instrument(tracing::info_span!("model_turn", step)) => Some(r),
            };
            let spent = match &response {
                // A reply that says its prompt had no token (there is
                // always one) reported nothing: it counts at the estimate,
                // never as free.
                Some(Ok(r)) => Some(match r.usage.as_ref().filter(|u| u.prompt_tokens > 0) {
                    Some(u) => Spent {
                        prompt: u.prompt_tokens,
                        completion: u.completion_tokens,
                        cache_read: u.cache_read_tokens,
                        cache_write: u.cache_write_tokens,
                        reasoning: u.reasoning_tokens,
                        estimated: false,
                    },
                    None => Spent {
                        cache_read: 0,
                        cache_write: 0,
                        reasoning: 0,
                        prompt: estimate(),
                        completion: bindery_store::usage::estimate_tokens(r.to_message().chars()),
                        estimated: true,
                    },
                }),
                // No usage came back, but the prompt may have been read
                // and part of an answer written (and billed): a cancelled
                // request, a stream cut, a timeout. They count at their
                // estimates (the prompt's, and what was streamed), so
                // cancelling cannot make model use free; a refusal before
                // any work counts nothing.
                Some(Err(e)) if !may_have_been_processed(e) => None,
                _ => Some(Spent {
                    cache_read: 0,
                    cache_write: 0,
                    reasoning: 0,
                    prompt: estimate(),
                    completion: bindery_store::usage::estimate_tokens(
                        streamed.load(std::sync::atomic::Ordering::Relaxed),
                    ),
                    estimated: true,
                }),
            };
            // A fallback's answer is counted and priced as that model's.
            let fallback = match &response {
                Some(Ok(r)) if first + r.served_by > 0 => model
                    .fallbacks
                    .get(first + r.served_by - 1)
                    .map(bindery_spec::FallbackModel::as_model),
                _ => None,
            };
            host.after_model(claim, fallback.as_ref().unwrap_or(model), spent)
                .await;
            let response = match response {
                None => return RunEnd::Cancelled,
                Some(Ok(r)) => r.with_unique_call_ids(),
                // The endpoint's words may quote what it was sent (a key
                // in "Incorrect API key provided: …").
                Some(Err(e)) => {
                    // Each switch of a chain that failed whole counts too.
                    if let bindery_llm::LlmError::ChainFailed {
                        tried, last_model, ..
                    } = &e
                    {
                        let next = tried.iter().skip(1).map(|f| f.model.as_str());
                        for (passed, to) in tried.iter().zip(next.chain([last_model.as_str()])) {
                            ctx.metrics
                                .model_fallback(&ctx.agent.name, &passed.model, to);
                        }
                    }
                    // Named in the agent file's words: its provider and model.
                    let endpoint = client.endpoint();
                    return RunEnd::Failed(scrubber.scrub(&format!(
                        "the model request failed ({} model `{}`): {e}",
                        endpoint.provider.name(),
                        endpoint.model
                    )));
                }
            };
            let message = Turn::new(response.to_message());
            history.push(message.clone());
            let mut events = Events::new();
            if let Some((at, _, d)) = &downgrade {
                if !downgraded_once {
                    downgraded_once = true;
                    tracing::info!(budget = %d.budget, to = %d.to, "a budget past its mark: the run's requests go to a cheaper model");
                    events.push(SessionEvent::ModelDowngrade(
                        bindery_store::wire::ModelDowngrade {
                            from: model.name.clone(),
                            to: model.fallbacks[*at].name.clone(),
                            budget: d.budget.clone(),
                            used: d.used,
                            limit: d.limit,
                            at: d.at,
                        },
                    ));
                }
            }
            for (i, passed) in response.fell_back.iter().enumerate() {
                let to = match response.fell_back.get(i + 1) {
                    Some(next) => next.model.clone(),
                    None => fallback
                        .as_ref()
                        .map_or_else(|| model.name.clone(), |f| f.name.clone()),
                };
                ctx.metrics
                    .model_fallback(&ctx.agent.name, &passed.model, &to);
                events.push(SessionEvent::ModelFallback(
                    bindery_store::wire::ModelFallback {
                        from: passed.model.clone(),
                        to,
                        error: passed.error.clone(),
                    },
                ));
            }
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
                host.answer(&message, events).await;
                return RunEnd::Completed;
            }
            host.turn(&message, events).await;
            let encoded = conversation.history();
            if let Some(end) = act(
                ctx,
                &response.tool_calls,
                history,
                encoded,
                host,
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
pub(super) fn offered(
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
pub(super) fn budget_hold(call: Option<&ToolCall>, e: Exceeded) -> Blocked {
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

pub(super) async fn model_turn(
    ctx: &RunContext<'_>,
    client: &bindery_llm::ChatClient,
    conversation: &Conversation,
    host: &dyn Host,
    streamed: &std::sync::atomic::AtomicUsize,
) -> Result<bindery_llm::ChatResponse, bindery_llm::LlmError> {
    let started = Instant::now();
    let result = if ctx.stream {
        let mut forward = |d: StreamDelta| {
            // What the model has written so far: what a reply cut short
            // (a cancel, a broken stream) counts for.
            let written = match &d {
                StreamDelta::Content(text) => text.len(),
                StreamDelta::ToolCallStarted { name, .. } => name.len(),
                StreamDelta::ToolCallArguments { fragment, .. } => fragment.len(),
            };
            streamed.fetch_add(written, std::sync::atomic::Ordering::Relaxed);
            if let StreamDelta::Content(text) = d {
                host.delta(&text);
            }
        };
        client.complete_streaming(conversation, &mut forward).await
    } else {
        client.complete(conversation).await
    };
    ctx.metrics
        .llm_request(started.elapsed().as_secs_f64(), result.is_ok());
    if let Err(e) = &result {
        tracing::warn!("model request failed: {e}");
    }
    result
}

/// Whether a failed model request may have been read by the model (and
/// so billed): anything but the endpoint's refusal (a 4xx) or an endpoint
/// that could not be used at all.
fn may_have_been_processed(e: &bindery_llm::LlmError) -> bool {
    use bindery_llm::LlmError;
    match e {
        LlmError::Http { status, .. } => !(400..500).contains(status),
        LlmError::RetriesExhausted { last, .. } => may_have_been_processed(last),
        // Each model of the chain may have; counted once, at the estimate.
        LlmError::ChainFailed { .. } => true,
        LlmError::Transport(_)
        | LlmError::Timeout
        | LlmError::Malformed(_)
        | LlmError::TooLarge { .. }
        | LlmError::TooManyCalls { .. }
        | LlmError::Deadline(_) => true,
        // No credentials, no request.
        LlmError::Config(_) | LlmError::Credentials { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bindery_tests::mock_llm::{MockLlm, MockReply};

    use super::*;
    use crate::run::{Events, Host, RunContext, RunEnd};
    use async_trait::async_trait;
    use bindery_llm::{ChatClient, ModelEndpoint};
    use bindery_llm::{ChatMessage, Turn};
    use bindery_metrics::{Metrics, ToolCaller};
    use bindery_tools::CallContext;
    use bindery_tree::{AgentSources, LoadOptions};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    /// A sink whose every write of a turn with tool calls finds the run
    /// taken, as a store does once another server has closed it.
    struct TakenOnStore {
        turns: Mutex<Vec<Turn>>,
        cancel: CancellationToken,
    }

    #[async_trait]
    impl Host for TakenOnStore {
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
        async fn before_model(
            &self,
            _: &bindery_spec::ModelSpec,
            _: &(dyn Fn() -> u64 + Send + Sync),
        ) -> Gate {
            Gate::Go(None)
        }
        async fn after_model(&self, _: Option<i64>, _: &bindery_spec::ModelSpec, _: Option<Spent>) {
        }
        async fn before_tool(&self, _: &str) -> Gate {
            Gate::Go(None)
        }
        fn approve(&self, _: &str) {}
        async fn before_call(
            &self,
            _: &str,
            _: &str,
            _: &[String],
        ) -> Result<(), crate::run::Unaudited> {
            Ok(())
        }
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
            subject: None,
            tokens_until: None,
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
