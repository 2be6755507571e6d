use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::args::{AgentArgs, Cli, Command, LogFormat, Output};
use super::check_tools::{self, ToolsMode};
use super::error::CliError;
use super::load::{load, load_tree, LoadError};
use super::telemetry::Telemetry;
use bindery_tree::report::{agent_report, render_text, tool_view};

pub fn main() -> ExitCode {
    end_quietly_when_stdout_closes();
    let cli = Cli::parse_args();
    let telemetry = init_logging(cli.log_format);
    // What a tool leaves behind comes to this process, which ends it.
    bindery_reaper::become_subreaper();
    // Its tools run as its user: without this, one could read the server's
    // environment and memory (/proc/<server>/environ, its credentials among
    // them). Not dumpable, those files are root's.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(error = %e, "cannot keep the server's environment from its tools");
    }
    let code = run_main(cli.command);
    // Every command ends here (`serve` too, on SIGTERM or ctrl-c): send the
    // spans still buffered before the process goes.
    if let Some(t) = telemetry {
        t.shutdown();
    }
    code
}

/// `check | head`: once the reader of stdout has gone, a print fails
/// (SIGPIPE is ignored, as tools' pipes need) and `println!` panics. End
/// as a Unix tool killed by SIGPIPE does instead (status 141), with no
/// panic message; every other panic goes on as before.
fn end_quietly_when_stdout_closes() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        before(info)
    }));
}

/// The async worker threads when `--worker-threads` is not given: one
/// fewer than the CPUs the process may use (`cpus`, a container's CPU limit
/// counted), and at least one. The CPU left over runs what the server
/// starts beside its async work: its tools' processes, MCP servers, the
/// store's checkpoints, the allocator's purges. On two cores one worker
/// answered a round trip 0.2 to 0.5 ms sooner than two, and
/// 1000 sessions at once sooner too (docs/benchmarks.md): a second worker
/// there mostly parks and wakes.
fn default_workers(cpus: usize) -> usize {
    cpus.saturating_sub(1).max(1)
}

fn run_main(command: Command) -> ExitCode {
    let workers = match &command {
        Command::Serve {
            worker_threads: Some(n),
            ..
        } => usize::from(*n),
        _ => default_workers(std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers);
    let rt = match builder
        .enable_all()
        .on_thread_park(super::memory::on_worker_park)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(command)) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote a file's or a model's text.
            let message = e.to_string();
            eprintln!("{}", super::terminal_text::for_terminal(message.trim_end()));
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `BINDERY_LOG` (default `info`, with the MCP
/// SDK's own chatter, which quotes whole server handshakes, at `warn`); and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, the same spans and events exported
/// over OTLP/HTTP (see [`super::telemetry`]). An exporter that cannot be
/// set up is a warning, not a failure.
fn init_logging(format: LogFormat) -> Option<Telemetry> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("BINDERY_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"))
    };
    // Every record is scrubbed of the live secret values as it is written.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(super::telemetry::Scrubbed {
            inner: std::io::stderr,
            json: matches!(format, LogFormat::Json),
            ansi,
        })
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Json => fmt.json().with_filter(filter()).boxed(),
        LogFormat::Text => fmt.with_filter(filter()).boxed(),
    };
    let (telemetry, problem) = match Telemetry::from_env() {
        Ok(t) => (t, None),
        Err(e) => (None, Some(e)),
    };
    let otel = telemetry.as_ref().map(|t| t.layer(filter()));
    tracing_subscriber::registry().with(fmt).with(otel).init();
    if let Some(problem) = problem {
        tracing::warn!("{problem}; going on without exporting traces");
    }
    if let Some(t) = &telemetry {
        tracing::debug!("exporting traces over OTLP/HTTP to {}", t.variable());
    }
    telemetry
}

async fn run(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Check {
            agents,
            output,
            tools,
        } => Ok(check(&agents, output, tools).await?),
        Command::Session { server, command } => {
            Ok(super::session_client::main(server, command).await?)
        }
        Command::Audit { command } => Ok(super::audit::main(command).await?),
        Command::DescribeTool {
            path,
            format,
            check_only,
        } => {
            let tool =
                bindery_tools::bash::load_script(&path, bindery_tools::bash::Limits::default())
                    .await?;
            let info = tool.info();
            if check_only {
                println!("{}: valid tool `{}`", path.display(), info.slug);
            } else if format == super::args::ToolFormat::Pretty {
                println!(
                    "{}",
                    serde_json::to_string_pretty(info).map_err(CliError::Describe)?
                );
            } else {
                println!(
                    "{}",
                    serde_json::to_string(info).map_err(CliError::Describe)?
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::AsTool {
            agents,
            model,
            protocol,
        } => Ok(super::as_tool::main(agents, model, protocol).await?),
        Command::ReplayToolCall {
            agents,
            session,
            tool_call,
            tool,
            validate_only,
            raw,
            yes,
        } => match tool {
            Some(script) => {
                Ok(super::replay::replay(&session, tool_call, &script, validate_only, raw).await?)
            }
            None => Ok(super::replay::through_bindings(
                &agents,
                &session,
                tool_call,
                validate_only,
                yes,
            )
            .await?),
        },
        Command::Run {
            agents,
            model,
            script,
            media,
            session_file,
            yes,
        } => {
            let prompt = compose_prompt(&script.0, session_file.as_deref())?;
            if prompt.trim().is_empty() {
                return Err(CliError::NothingToAsk);
            }
            let query = super::media::query(prompt, &media)?;
            Ok(super::one_shot::run(&agents, &model, query, yes, session_file.as_deref()).await?)
        }
        Command::EchoPrompt {
            script,
            session_file,
        } => {
            let prompt = compose_prompt(&script.0, session_file.as_deref())?;
            // On a terminal, a session file's or a file's controls are
            // shown, not obeyed; piped, the prompt goes out exactly.
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                print!("{}", super::terminal_text::for_terminal(&prompt));
            } else {
                print!("{prompt}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckToolCall { tool } => Ok(super::check_tool_call::main(&tool).await?),
        Command::McpServer { agents, model } => Ok(super::mcp_stdio::main(&agents, &model).await?),
        Command::Serve {
            agents,
            model,
            listen,
            store,
            store_connect_timeout,
            store_pool_size,
            advertise_url,
            peer,
            tokens,
            identity,
            limits,
            approvals,
            tool_cache_ttl,
            max_tool_processes,
            max_tool_processes_per_run,
            stored_agents,
            agents_source,
            live_session_ttl,
            max_live_sessions,
            events_keep_alive,
            header_timeout,
            body_timeout,
            write_timeout,
            max_connections_per_ip,
            allowed_hosts,
            allowed_origins,
            worker_threads: _,
            no_stream,
            runner_heartbeat,
            runner_lease,
            drain_timeout,
        } => Ok(super::serve::serve(super::serve::ServeArgs {
            agents: &agents,
            model: &model,
            listen: &listen,
            store: store.as_deref(),
            store_patience: Duration::from_secs(store_connect_timeout),
            store_pool_size: usize::from(store_pool_size),
            advertise_url: advertise_url.as_deref(),
            peer_tls: peer
                .peer_tls_dir
                .as_deref()
                .zip(peer.peer_tls_name.as_deref()),
            peer_listen: &peer.peer_listen,
            owner_token_file: tokens.owner_token_file.as_deref(),
            mcp_client_token_file: tokens.mcp_client_token_file.as_deref(),
            approver_token_file: tokens.approver_token_file.as_deref(),
            identity: identity.config().map_err(super::serve::ServeError::from)?,
            exchange: super::serve::ExchangeArgs {
                client_id: identity.identity_exchange_client_id.as_deref(),
                secret_file: identity.identity_exchange_secret_file.as_deref(),
                token_url: identity.identity_token_url.as_deref(),
            },
            limits: *limits,
            public_url: approvals.public_url.as_deref(),
            approval_notice_attempts: approvals.approval_notice_attempts,
            tool_cache_ttl,
            tool_processes: bindery_tools::slots::ProcessSlots::new(
                (max_tool_processes > 0).then_some(max_tool_processes),
                (max_tool_processes_per_run > 0).then_some(max_tool_processes_per_run),
            ),
            stored_agents,
            agents_source,
            live_session_ttl: live_session_ttl.0,
            max_live_sessions: max_live_sessions.map(|n| n as usize),
            events_keep_alive,
            conn_limits: super::http::ConnLimits {
                header_timeout,
                body_timeout,
                write_timeout,
                per_ip: max_connections_per_ip as usize,
            },
            allowed_hosts: &allowed_hosts,
            allowed_origins: &allowed_origins,
            stream: !no_stream,
            lease: bindery_session::lease::LeaseConfig {
                heartbeat: runner_heartbeat,
                lease: runner_lease,
            },
            drain_timeout,
        })
        .await?),
        Command::Describe {
            agents,
            tool,
            tools: Some(provider),
        } => {
            let tree = load(&agents).await?;
            let agent = tree.pick(agents.agent.as_deref())?;
            let values = agent.process_values();
            let definitions: Vec<bindery_llm::ToolDefinition> = agent
                .tools
                .iter()
                .map(|t| {
                    let view = tool_view(agent, &t, &values);
                    bindery_llm::ToolDefinition {
                        name: view.function.name,
                        description: view.function.description,
                        parameters: view.function.parameters,
                    }
                })
                .chain(bindery_session::subagents::definitions(agent, &tree))
                .filter(|d| tool.as_ref().is_none_or(|name| &d.name == name))
                .collect();
            if let Some(name) = tool.as_ref().filter(|_| definitions.is_empty()) {
                super::call::find_tool(agent, name)?;
            }
            let sent = bindery_llm::tools_as_sent(provider, &definitions).map_err(|source| {
                CliError::ToolsAsSent {
                    agent: agent.name.clone(),
                    provider: provider.name(),
                    source,
                }
            })?;
            println!(
                "{}",
                to_json(
                    &serde_json::json!({"agent": agent.name, "provider": provider.name(), "tools": sent})
                )
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Describe {
            agents,
            tool,
            tools: None,
        } => {
            let tree = load(&agents).await?;
            let agent = tree.pick(agents.agent.as_deref())?;
            let values = agent.process_values();
            let helper_tools = bindery_session::subagents::definitions(agent, &tree);
            let helper_view = |d: &bindery_llm::ToolDefinition| {
                serde_json::json!({"type": "function", "function": {
                    "name": d.name, "description": d.description, "parameters": d.parameters}, "bound": []})
            };
            let views: Vec<serde_json::Value> = match &tool {
                Some(name) => match helper_tools.iter().find(|d| &d.name == name) {
                    Some(d) => vec![helper_view(d)],
                    None => {
                        vec![serde_json::to_value(tool_view(
                            agent,
                            &super::call::find_tool(agent, name)?,
                            &values,
                        ))
                        .map_err(CliError::Describe)?]
                    }
                },
                None => agent
                    .tools
                    .iter()
                    .filter_map(|t| serde_json::to_value(tool_view(agent, &t, &values)).ok())
                    .chain(helper_tools.iter().map(helper_view))
                    .collect(),
            };
            println!(
                "{}",
                to_json(&serde_json::json!({"agent": agent.name, "tools": views}))
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::ToolCall {
            agents,
            model,
            tool,
            name,
            args,
            yes,
            choose,
        } => {
            // agents-exe's `tool-call NAME`: the arguments on stdin.
            let from_stdin = name.is_some() && args.is_none();
            let tool = tool.or(name).unwrap_or_default();
            let args = match args {
                Some(a) => a,
                None if from_stdin => {
                    let text = super::prompt_script::read_stdin("the arguments")?;
                    if text.trim().is_empty() {
                        "{}".to_string()
                    } else {
                        text
                    }
                }
                None => "{}".to_string(),
            };
            if from_stdin {
                return agents_exe_tool_call(&agents, &model, &tool, &args, yes, choose).await;
            }
            let tree = load(&agents).await?;
            let agent = tree.pick(agents.agent.as_deref())?;
            let model_args: serde_json::Value =
                serde_json::from_str(&args).map_err(CliError::ArgsNotJson)?;
            // A helper's tool: one run of the helper agent on `what`, as
            // the model's call would run it (without a caller's narrowing).
            let helper = bindery_session::subagents::helper_slug(agent, &tool)
                .and_then(|slug| agent.helpers.iter().find(|h| h.slug == slug));
            if let Some(h) = helper {
                let what = match model_args.as_object() {
                    Some(o) if o.keys().all(|k| k == "what") => {
                        o.get("what").and_then(|w| w.as_str()).map(str::to_string)
                    }
                    _ => None,
                }
                .ok_or_else(|| CliError::HelperTakesWhat { tool: tool.clone() })?;
                let mut helper_args = agents.clone();
                helper_args.agent = Some(h.agent.clone());
                return Ok(super::one_shot::run(&helper_args, &model, what, yes, None).await?);
            }
            let asking = super::call::Asking {
                yes,
                choose: choose.as_deref(),
                replayed: false,
            };
            Ok(super::call::through_bindings(agent, &tool, model_args, None, asking).await?)
        }
        command => session_files(command),
    }
}

/// The commands over session files (agents-exe's).
fn session_files(command: Command) -> Result<ExitCode, CliError> {
    use super::agents_exe_session::{print::PrintOptions, run};
    match command {
        Command::ListToolCalls { session, format } => Ok(run::list_tool_calls(&session, format)?),
        Command::SessionPrint {
            session,
            show_tool_call_results,
            show_tool_call_arguments,
            n_turns,
            repeat_system_prompt,
            repeat_tools,
            antichronological,
            no_funny_stamp,
            as_prompt,
        } => Ok(run::session_print(
            as_prompt,
            &session,
            &PrintOptions {
                results: show_tool_call_results,
                arguments: show_tool_call_arguments,
                n_turns,
                repeat_system_prompt,
                repeat_tools,
                antichronological,
                no_funny_stamp,
            },
        )?),
        Command::SessionEdit { operations } => Ok(run::session_edit(&operations)?),
        Command::SessionIndex {
            build,
            update,
            status: _,
            clean,
            index,
        } => {
            let op = match (build, update, clean) {
                (true, ..) => run::IndexOp::Build,
                (_, true, _) => run::IndexOp::Update,
                (.., true) => run::IndexOp::Clean,
                _ => run::IndexOp::Status,
            };
            Ok(run::session_index(
                op,
                index.db_path,
                &index.sessions_dirs,
                index.include_tool_outputs,
            )?)
        }
        Command::SessionSearch {
            query,
            index,
            after,
            before,
            tool,
            agent,
            json,
            preview,
            limit,
            auto,
        } => Ok(run::session_search(run::Search {
            db: index.db_path,
            sessions_dirs: index.sessions_dirs,
            tool_outputs: index.include_tool_outputs,
            json,
            auto,
            after,
            before,
            options: super::agents_exe_session::index::SearchOptions {
                query,
                tools: tool,
                agent,
                preview_lines: preview,
                limit: limit.map(|n| n as usize),
                ..Default::default()
            },
        })?),
        // `run` hands over only the commands above.
        _ => Err(CliError::NotSessionFiles),
    }
}

/// agents-exe's `tool-call NAME`: the result printed as agents-exe's JSON
/// line (see [`super::tool_call_result`]).
async fn agents_exe_tool_call(
    agents: &AgentArgs,
    model: &super::args::ModelArgs,
    tool: &str,
    args: &str,
    yes: bool,
    choose: Option<String>,
) -> Result<ExitCode, CliError> {
    use super::tool_call_result::{result, result_data, Called};
    let model_args: serde_json::Value =
        serde_json::from_str(args).map_err(CliError::StdinNotJson)?;
    let tree = load(agents).await?;
    let agent = tree.pick(agents.agent.as_deref())?.clone();
    let (started, clock) = (std::time::SystemTime::now(), std::time::Instant::now());
    let helper = bindery_session::subagents::helper_slug(&agent, tool)
        .and_then(|slug| agent.helpers.iter().find(|h| h.slug == slug))
        .and_then(|h| tree.agent(&h.agent).cloned());
    let called = if let Some(helper) = helper {
        // A helper's tool takes {"what": TEXT}, as the model calls it; its
        // model clients only then (reading a key may run a command).
        let loaded = super::one_shot::Loaded::with(tree, agents, model)?;
        match model_args.get("what").and_then(|w| w.as_str()) {
            Some(what) => Called::Helper(
                loaded
                    .ask(
                        &helper,
                        what.to_string(),
                        super::one_shot::Waiting::Terminal { yes },
                        &super::one_shot::cancelled_on_ctrl_c(),
                    )
                    .await,
            ),
            None => Called::Helper(Err(super::one_shot::RunError::TakesWhat {
                tool: tool.to_string(),
            })),
        }
    } else if let Some(bound) = agent.tool(tool) {
        let asking = super::call::Asking {
            yes,
            choose: choose.as_deref(),
            replayed: false,
        };
        Called::Tool(super::call::outcome(&agent, &bound, model_args, None, asking).await?)
    } else {
        // The JSON says so; the agent's tool names go to stderr.
        if let Err(e) = super::call::find_tool(&agent, tool) {
            eprintln!(
                "{}",
                super::terminal_text::for_terminal(&format!("error: {e}"))
            );
        }
        Called::NotFound
    };
    let line = result(result_data(tool, called), clock.elapsed(), started);
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}

/// The prompt agents-exe's directives make; reading files, running a
/// command and reading stdin block, so off the async workers.
fn compose_prompt(
    script: &super::prompt_script::PromptScript,
    alias_file: Option<&Path>,
) -> Result<String, super::prompt_script::PromptError> {
    tokio::task::block_in_place(|| super::prompt_script::compose_here(script, alias_file))
}

async fn check(
    agents: &AgentArgs,
    output: Output,
    tools_mode: Option<ToolsMode>,
) -> Result<ExitCode, LoadError> {
    let tools_mode = tools_mode.filter(|m| *m != ToolsMode::None);
    let result = load_tree(agents, false).await;
    match (result, output) {
        (Ok(tree), Output::Text) => {
            // Announcements, names and warnings come from the files: no
            // file drives the terminal.
            let shown = super::terminal_text::for_terminal;
            for name in tree.agents.keys() {
                print!("{}", shown(&render_text(&agent_report(&tree.agents[name]))));
                if let Some(mode) = tools_mode {
                    let defs = check_tools::definitions(&tree.agents[name], &tree);
                    print!("{}", check_tools::render(mode, &defs));
                }
            }
            for w in &tree.warnings {
                println!("{}", shown(&w.to_string()));
            }
            let tools: usize = tree.agents.values().map(|a| a.tools.len()).sum();
            println!(
                "ok: {} agent{}, {tools} tool{}",
                tree.agents.len(),
                plural(tree.agents.len()),
                plural(tools)
            );
            Ok(ExitCode::SUCCESS)
        }
        (Ok(tree), Output::Json) => {
            let reports: Vec<_> = tree.agents.values().map(|a| agent_report(a)).collect();
            let mut doc =
                serde_json::json!({"ok": true, "agents": reports, "diagnostics": tree.warnings});
            if tools_mode.is_some() {
                // For machines, one rendering: the request's `tools` array, by agent.
                let tools: serde_json::Map<String, serde_json::Value> = tree
                    .agents
                    .values()
                    .map(|a| {
                        let defs = check_tools::definitions(a, &tree);
                        let views = defs.iter().map(check_tools::openai_view).collect();
                        (a.name.clone(), serde_json::Value::Array(views))
                    })
                    .collect();
                doc["tools"] = serde_json::Value::Object(tools);
            }
            println!("{}", to_json(&doc));
            Ok(ExitCode::SUCCESS)
        }
        (Err(e), Output::Text) => Err(e),
        (Err(e), Output::Json) => {
            let diagnostics = match e {
                LoadError::Tree(load) => load.diagnostics,
                other => vec![bindery_bindings::Diagnostic::error(other.to_string())],
            };
            println!(
                "{}",
                to_json(&serde_json::json!({"ok": false, "diagnostics": diagnostics}))
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn to_json(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::default_workers;

    #[test]
    fn one_cpu_is_left_to_the_servers_processes_and_one_worker_always_runs() {
        assert_eq!(default_workers(0), 1);
        assert_eq!(default_workers(1), 1);
        assert_eq!(default_workers(2), 1);
        assert_eq!(default_workers(8), 7);
    }
}
