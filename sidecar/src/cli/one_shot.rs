//! One run of an agent to completion on the command line, with no store:
//! `run`, `run` in the bash tool protocol (`as-tool`), a helper's
//! `tool-call`, and each `tools/call` of `mcp-server`, which loads its
//! agents once and runs them many times.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::args::{AgentArgs, ModelArgs};
use super::ask::{ask_terminal, refuse_all, AskError};
use super::load::{load_lenient, load_options, LoadError};
use super::resume::{FileSink, ResumeError, SessionFile};
use super::serve::{client_options, model_keys, CliSink, Credentials};
use bindery_llm::{ChatClient, ChatMessage, Turn};
use bindery_metrics::Metrics;
use bindery_params::live::Registration;
use bindery_session::clients::build_clients;
use bindery_session::run::{self, RunContext, RunEnd};
use bindery_tools::CallContext;
use bindery_tree::{AgentTree, LoadedAgent};

/// Why a run on the command line gave no answer: its agents, its values,
/// its `--session-file`, a person's answer, or the run's own end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Pick(#[from] bindery_tree::PickError),
    /// The model clients could not be made (the message names the agent
    /// and the key's source, never the key).
    #[error(transparent)]
    Clients(bindery_session::clients::ClientError),
    #[error(transparent)]
    SessionFile(#[from] ResumeError),
    #[error("agent `{agent}` needs a value for {missing}: give it with --set NAME=VALUE (or BINDERY_PARAM_<NAME>)")]
    MissingValues { agent: String, missing: String },
    #[error("agent `{agent}` has no model client")]
    NoClient { agent: String },
    #[error(transparent)]
    Ask(#[from] AskError),
    #[error("no answer after {steps} model turns (raise --max-steps)")]
    MaxSteps { steps: u32 },
    #[error("cancelled")]
    Cancelled,
    /// A helper's tool called from the command line without its one
    /// argument.
    #[error("{tool} takes {{\"what\": TEXT}}")]
    TakesWhat { tool: String },
    /// The run failed or went over a budget: the session's own words.
    #[error("{0}")]
    Ended(String),
}

/// Who answers the calls a run waits for (a confirmation, a choice).
#[derive(Clone, Copy, Debug)]
pub enum Waiting {
    /// The person at the terminal (`yes`: every confirmation approved).
    Terminal { yes: bool },
    /// Nobody: each is refused, and the model told why.
    Refuse(&'static str),
}

/// Agents loaded with their model clients, ready to run.
pub struct Loaded {
    pub tree: AgentTree,
    clients: BTreeMap<String, ChatClient>,
    max_steps: u32,
    // The process's and the model clients' credentials are live secrets
    // for as long as runs may go: no log line or tool result carries one.
    _secrets: (Option<Registration>, Option<Registration>),
}

impl Loaded {
    /// The agents `agents` names, a broken tool script left out (as
    /// agents-exe does when it runs agents).
    pub async fn load(agents: &AgentArgs, model: &ModelArgs) -> Result<Loaded, RunError> {
        let tree = load_lenient(agents).await?;
        Loaded::with(tree, agents, model)
    }

    /// `tree`, loaded from `agents`, with its model clients.
    pub fn with(
        tree: AgentTree,
        agents: &AgentArgs,
        model: &ModelArgs,
    ) -> Result<Loaded, RunError> {
        let opts = load_options(agents)?;
        let mut own = Credentials::from_env();
        own.api_keys(&opts.api_keys);
        let own = bindery_params::live::register_own(own.0);
        let (clients, warnings) =
            build_clients(&tree, &client_options(model)).map_err(RunError::Clients)?;
        let keys = bindery_params::live::register_own(model_keys(&clients));
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(Loaded {
            tree,
            clients,
            max_steps: model.max_steps,
            _secrets: (own, keys),
        })
    }

    /// Run `agent` once on `prompt`: its last answer.
    pub async fn ask(
        &self,
        agent: &Arc<LoadedAgent>,
        prompt: impl Into<bindery_llm::Content>,
        waiting: Waiting,
        cancel: &CancellationToken,
    ) -> Result<String, RunError> {
        self.ask_in(None, agent, prompt, waiting, cancel).await
    }

    /// [`Loaded::ask`], going on from the session in `file` (when given),
    /// which is rewritten after each step.
    pub async fn ask_in(
        &self,
        file: Option<&SessionFile>,
        agent: &Arc<LoadedAgent>,
        prompt: impl Into<bindery_llm::Content>,
        waiting: Waiting,
        cancel: &CancellationToken,
    ) -> Result<String, RunError> {
        let values = agent.process_values();
        let missing = agent.params.missing_required(&values);
        if !missing.is_empty() {
            return Err(RunError::MissingValues {
                agent: agent.name.clone(),
                missing: missing.join(", "),
            });
        }
        let client = self
            .clients
            .get(&agent.name)
            .ok_or_else(|| RunError::NoClient {
                agent: agent.name.clone(),
            })?;
        let metrics = Metrics::default();
        let lookups = bindery_session::lookups::LookupCache::default();
        let id = uuid::Uuid::new_v4().to_string();
        let tools = agent.tools.snapshot();
        let ctx = RunContext {
            agent,
            tools: &tools,
            helpers: Some(bindery_session::subagents::HelperEnv {
                tree: &self.tree,
                clients: &self.clients,
                stack: vec![agent.name.clone()],
                inherited: Vec::new(),
                max_depth: bindery_session::subagents::MAX_HELPER_DEPTH,
            }),
            client,
            values: &values,
            call: CallContext::of_session(&id, &agent.name),
            cache: None,
            lookups: Some(&lookups),
            metrics: &metrics,
            max_steps: agent.spec.max_steps.unwrap_or(self.max_steps),
            stream: false,
            origin: bindery_metrics::ToolCaller::Model,
            taint_from: 0,
            caller_taint: &[],
            clock: &bindery_store::clock::WallClock,
            subject: None,
            tokens_until: None,
        };
        let query = ChatMessage::User {
            content: prompt.into(),
        };
        let mut history: Vec<Turn> = file
            .map(|f| f.resumed.messages.iter().cloned().map(Turn::new).collect())
            .unwrap_or_default();
        let start = history.len();
        history.push(Turn::new(query));
        let file_sink = file.map(|f| {
            // Its query, and the answers to calls the file left open.
            let own = f.resumed.messages.len().saturating_sub(f.resumed.carried) + 1;
            FileSink::new(f, &ctx, &history, own)
        });
        let sink: &dyn run::Host = match &file_sink {
            Some(s) => s,
            None => &CliSink,
        };
        let mut end = run::run(&ctx, &mut history, sink, cancel).await;
        while let RunEnd::Blocked(calls) = &end {
            let resolved = match waiting {
                Waiting::Terminal { yes } => ask_terminal(calls, yes, None)?,
                Waiting::Refuse(why) => refuse_all(calls, why),
            };
            end = match run::answer_resolved(&ctx, &resolved, &mut history, sink, cancel).await {
                Some(end) => end,
                None => run::run(&ctx, &mut history, sink, cancel).await,
            };
        }
        if let Some(e) = file_sink.and_then(|s| s.error()) {
            return Err(e.into());
        }
        match end {
            RunEnd::Blocked(_) => unreachable!("answered above"),
            RunEnd::Stepped | RunEnd::Completed => {
                let answer = history[start..]
                    .iter()
                    .rev()
                    .find_map(|m| match m.message() {
                        ChatMessage::Assistant {
                            content: Some(c), ..
                        } => Some(c.clone()),
                        _ => None,
                    });
                Ok(answer.unwrap_or_default().trim_end().to_string())
            }
            RunEnd::MaxSteps(steps) => Err(RunError::MaxSteps { steps }),
            RunEnd::Cancelled => Err(RunError::Cancelled),
            RunEnd::Failed(why) | RunEnd::OverBudget(why) => Err(RunError::Ended(why)),
        }
    }
}

/// A token cancelled on ctrl-c.
pub fn cancelled_on_ctrl_c() -> CancellationToken {
    let cancel = CancellationToken::new();
    let ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    cancel
}

/// `run`: the agent `agents` picks, once on `prompt`, the person at the
/// terminal answering what it waits for; the answer goes to stdout. With
/// `session_file`, the run goes on from the session there, rewritten
/// after each step.
pub async fn run(
    agents: &AgentArgs,
    model: &ModelArgs,
    prompt: impl Into<bindery_llm::Content>,
    yes: bool,
    session_file: Option<&std::path::Path>,
) -> Result<ExitCode, RunError> {
    let file = session_file
        .map(|p| tokio::task::block_in_place(|| SessionFile::open(p)))
        .transpose()?;
    let loaded = Loaded::load(agents, model).await?;
    let agent = loaded.tree.pick(agents.agent.as_deref())?.clone();
    let answer = loaded
        .ask_in(
            file.as_ref(),
            &agent,
            prompt,
            Waiting::Terminal { yes },
            &cancelled_on_ctrl_c(),
        )
        .await?;
    println!("{answer}");
    Ok(ExitCode::SUCCESS)
}
