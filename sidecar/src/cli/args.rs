use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Bindery's agent server: run agents whose tool arguments are bound to
/// parameters the model never sees.
#[derive(Parser, Debug)]
#[command(name = "bindery-sidecar", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Cli {
    /// The command line, parsed. `replay-tool-call` needs no agent file
    /// when it replays raw against a script (`--raw-tool`). agents-exe's
    /// invocations are read in Bindery's words first
    /// (`cli/agents_exe_argv.rs`).
    pub fn parse_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let argv =
            super::agents_exe_argv::rewrite(std::env::args_os().collect()).unwrap_or_else(|e| {
                // It quotes the command line.
                eprintln!(
                    "{}",
                    super::terminal_text::for_terminal(&format!("error: {e}"))
                );
                std::process::exit(2)
            });
        let matches = Cli::command()
            .mut_subcommand("replay-tool-call", |c| {
                c.mut_arg("agent_files", |a| {
                    a.required_unless_present_any(["agents_dir", "tool"])
                })
            })
            .get_matches_from(argv);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Json,
    Pretty,
}

/// Where `serve`'s agents come from (`--agents-source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AgentsSource {
    /// Agent files.
    File,
    /// `Agent` resources the operator wrote as files.
    Crd,
}

// Parsed once at start: `serve`'s flags making the enum a few hundred
// bytes costs nothing, and boxing them would only add a step to every use.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Load the agents, run every check, and show each agent's parameters
    /// (and how each resolved) and tools. Exit 1 on any error.
    Check {
        #[command(flatten)]
        agents: AgentArgs,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// Also show each agent's tools as the model receives them, in one
        /// of agents-exe's renderings.
        #[arg(long, value_enum, value_name = "MODE")]
        tools: Option<super::check_tools::ToolsMode>,
    },
    /// Print each tool's schema exactly as the model receives it, with the
    /// bound arguments listed apart.
    Describe {
        #[command(flatten)]
        agents: AgentArgs,
        /// Only this tool (its model-visible name, e.g. bash_query-invoices).
        #[arg(long)]
        tool: Option<String>,
        /// Print the tools exactly as this provider's requests carry them
        /// (`openai`, `openai-responses` or `responses`, `anthropic`,
        /// `gemini`, `bedrock`, `azure-openai`), without what is bound.
        #[arg(long, value_name = "PROVIDER", value_parser = parse_provider)]
        tools: Option<bindery_spec::provider::Provider>,
    },
    /// Run a bash tool script's `describe` and print its description,
    /// checked (agents-exe's `describe-tool`; no agent file needed).
    DescribeTool {
        /// The script.
        #[arg(value_name = "TOOLPATH")]
        path: PathBuf,
        /// `json` (one line) or `pretty`.
        #[arg(long, short = 'f', value_enum, default_value_t = ToolFormat::Json)]
        format: ToolFormat,
        /// Only say whether the description is valid.
        #[arg(long)]
        check_only: bool,
    },
    /// Run one tool through its bindings, as if the model had called it:
    /// `tool-call --tool NAME --args JSON`, or agents-exe's `tool-call
    /// NAME` with the arguments' JSON on stdin.
    ToolCall {
        #[command(flatten)]
        agents: AgentArgs,
        /// For a helper's tool (`prompt_agent_<slug>`): its model.
        #[command(flatten)]
        model: ModelArgs,
        /// The tool's model-visible name.
        #[arg(long = "tool", value_name = "NAME", conflicts_with = "name")]
        tool: Option<String>,
        /// The tool's name, as agents-exe takes it; its arguments are then
        /// read from stdin unless --args gives them.
        #[arg(value_name = "TOOLNAME", required_unless_present = "tool")]
        name: Option<String>,
        /// The arguments the model would send, as a JSON object (default
        /// `{}`, or stdin with a positional TOOLNAME).
        #[arg(long)]
        args: Option<String>,
        /// A tool with `depends_on`: approve its confirmation without asking.
        #[arg(long)]
        yes: bool,
        /// A tool with `depends_on`: take this option at its choice (the
        /// option's id, number or label) without asking.
        #[arg(long, value_name = "ID")]
        choose: Option<String>,
    },
    /// Run one tool call of a saved session again: through its bindings,
    /// as a live call (--agent-file …, values by --set/--pin/--params-file
    /// and the environment), or raw against a bash script (--raw-tool,
    /// agents-exe's command). The session file is what GET
    /// /v1/sessions/ID answers; calls are numbered from 0 across it.
    ReplayToolCall {
        #[command(flatten)]
        agents: AgentArgs,
        /// The session file (Bindery's, or agents-exe's).
        #[arg(long, short = 's', value_name = "FILE")]
        session: PathBuf,
        /// Which call: in Bindery's session, its place in the session
        /// (from 0); in agents-exe's, its index as `list-tool-calls`
        /// shows it (the first call at that place in its turn).
        #[arg(long = "tool-call", short = 'i', value_name = "INDEX")]
        tool_call: usize,
        /// Raw: run the recorded arguments as they are against this bash
        /// script, no bindings (agents-exe's `--tool`).
        #[arg(long = "raw-tool", visible_alias = "tool", short = 't', value_name = "PATH",
              conflicts_with_all = ["agent_files", "agents_dir"])]
        tool: Option<PathBuf>,
        /// Check the call's arguments against the tool without running it.
        #[arg(long)]
        validate_only: bool,
        /// Print only the tool's output.
        #[arg(long)]
        raw: bool,
        /// Through the bindings: approve a call that needs a person's
        /// approval without asking (without it, such a call is asked on
        /// the terminal, and refused when stdin is not one).
        #[arg(long, conflicts_with = "tool")]
        yes: bool,
    },
    /// One run to completion on the command line; the answer goes to stdout.
    Run {
        #[command(flatten)]
        agents: AgentArgs,
        #[command(flatten)]
        model: ModelArgs,
        /// What to ask: agents-exe's prompt directives.
        #[command(flatten)]
        script: super::prompt_script::PromptArgs,
        /// A file sent with the prompt, `[MIME;]PATH` (repeatable): an
        /// image, or a PDF. The type comes from the extension unless given.
        #[arg(long, short = 'm', value_name = "[MIME;]PATH")]
        media: Vec<String>,
        /// agents-exe's session file: the run goes on from the session in
        /// FILE (when it exists), which is rewritten, in agents-exe's
        /// format, after every step. A file-mode alias (code-review,
        /// explain) reads its content here.
        #[arg(long, value_name = "FILE")]
        session_file: Option<PathBuf>,
        /// Approve every call that needs confirmation without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Serve one agent as a bash tool of another runtime: `as-tool
    /// --agent-file F describe` prints its description, `as-tool
    /// --agent-file F run --prompt TEXT [--NAME VALUE…]` runs it once.
    /// agents-exe's `--agent-file F describe|run …` is read as this.
    AsTool {
        #[command(flatten)]
        agents: AgentArgs,
        #[command(flatten)]
        model: ModelArgs,
        /// `describe`, or `run` and its arguments.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required = true,
            value_name = "describe|run …"
        )]
        protocol: Vec<String>,
    },
    /// Talk to a running server's session API: start (or fork) a session,
    /// send, resume, cancel, set values, answer pending calls, follow a
    /// run, list and show sessions.
    Session {
        #[command(flatten)]
        server: super::session_client::ServerArgs,
        #[command(subcommand)]
        command: super::session_client::SessionCommand,
    },
    /// The tenant's audit log: export it from a running server, verify an
    /// export (docs/audit.md).
    Audit {
        #[command(subcommand)]
        command: super::audit::AuditCommand,
    },
    /// Serve the HTTP session API.
    Serve {
        #[command(flatten)]
        agents: AgentArgs,
        #[command(flatten)]
        model: ModelArgs,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: String,
        /// Where sessions are kept: `sqlite://PATH` (default
        /// sqlite://data/bindery.sqlite) or `postgres://USER:PASSWORD@HOST:PORT/DB`,
        /// a database several servers may share. The URL holds a password:
        /// prefer the environment to the command line.
        #[arg(
            long,
            value_name = "URL",
            env = "BINDERY_STORE",
            hide_env_values = true
        )]
        store: Option<String>,
        /// Seconds to keep retrying a Postgres store that is not reachable
        /// at startup before giving up.
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        store_connect_timeout: u64,
        /// At most this many connections to a Postgres store (each server
        /// keeps its own pool; the database's max_connections bounds the
        /// sum over replicas).
        #[arg(long, value_name = "N", env = "BINDERY_STORE_POOL_SIZE", default_value_t = 8,
              value_parser = clap::value_parser!(u16).range(1..))]
        store_pool_size: u16,
        /// Where the other servers sharing a Postgres store reach this one
        /// (`http://10.0.0.7:8080`), recorded with its heartbeat: a request
        /// that needs a session's secret values or live run held by another
        /// server is forwarded there. Default: the address listened on,
        /// unless that is 0.0.0.0 (then none, and no server forwards here);
        /// `none`: no server forwards here.
        #[arg(long, value_name = "URL", env = "BINDERY_ADVERTISE_URL")]
        advertise_url: Option<String>,
        #[command(flatten)]
        peer: Box<PeerArgs>,
        #[command(flatten)]
        tokens: Box<TokenArgs>,
        #[command(flatten)]
        identity: Box<IdentityArgs>,
        #[command(flatten)]
        limits: Box<LimitsArgs>,
        #[command(flatten)]
        approvals: Box<ApprovalArgs>,
        /// Cache successful tool results for this many seconds (0: no cache).
        #[arg(long, default_value_t = 0)]
        tool_cache_ttl: u64,
        /// At most this many tool processes (bash tools' calls, each with
        /// all it starts) run at once on this server; the rest wait their
        /// turn. 0: no bound.
        #[arg(long, value_name = "N", env = "BINDERY_MAX_TOOL_PROCESSES",
              default_value_t = bindery_tools::slots::DEFAULT_PER_SERVER)]
        max_tool_processes: usize,
        /// At most this many of one run's tool processes run at once (the
        /// calls a model asks for together, its helpers' too); the rest
        /// wait their turn. Below --max-tool-processes, so that one run
        /// leaves room for the others. 0: no bound.
        #[arg(long, value_name = "N", env = "BINDERY_MAX_TOOL_PROCESSES_PER_RUN",
              default_value_t = bindery_tools::slots::DEFAULT_PER_RUN)]
        max_tool_processes_per_run: usize,
        /// Keep agents the owner sends over the API (PUT /v1/agents/SLUG)
        /// in the store. They may use only toolboxes that run no code on
        /// this server (see docs/agents.md, Stored agents).
        #[arg(long, env = "BINDERY_STORED_AGENTS")]
        stored_agents: bool,
        /// Where the agents loaded at start come from, as GET /v1/agents
        /// shows it: `file`, or `crd` (the operator's pods: `Agent`
        /// resources written as files).
        #[arg(long, value_enum, value_name = "SOURCE", default_value_t = AgentsSource::File,
              env = "BINDERY_AGENTS_SOURCE")]
        agents_source: AgentsSource,
        /// Forget a session's secret values after it has been idle this
        /// long (`30m`, `90s`); the next message then answers 409
        /// params_required, as after a restart. `off`: keep them as long
        /// as the process runs.
        #[arg(long, value_name = "DURATION", env = "BINDERY_LIVE_SESSION_TTL",
              default_value = "1h", value_parser = parse_lifetime)]
        live_session_ttl: Lifetime,
        /// Keep at most this many sessions live (holding secret values in
        /// memory): past it, the least recently used idle session forgets
        /// its secrets and answers 409 params_required until they are
        /// given again. Default: no limit.
        #[arg(long, value_name = "N", env = "BINDERY_MAX_LIVE_SESSIONS",
              value_parser = clap::value_parser!(u64).range(1..))]
        max_live_sessions: Option<u64>,
        /// Send a comment on each event stream with nothing to say this
        /// often, so that a proxy with an idle timeout keeps it open.
        #[arg(long, value_name = "DURATION", env = "BINDERY_EVENTS_KEEP_ALIVE",
              default_value = "15s", value_parser = parse_interval)]
        events_keep_alive: std::time::Duration,
        /// How long a request's head may take to arrive, from when the
        /// server starts waiting for it: on a new connection, and on one
        /// kept alive after a response (so also how long an idle
        /// connection stays open). A client that sends nothing, or a
        /// little at a time, is cut off then. A load balancer in front
        /// should close its idle connections sooner.
        #[arg(long, value_name = "DURATION", env = "BINDERY_HEADER_TIMEOUT",
              default_value = "20s", value_parser = parse_interval)]
        header_timeout: std::time::Duration,
        /// How long a request's body may take to arrive once its head has:
        /// a client that sends it a little at a time is cut off then (400).
        #[arg(long, value_name = "DURATION", env = "BINDERY_BODY_TIMEOUT",
              default_value = "30s", value_parser = parse_interval)]
        body_timeout: std::time::Duration,
        /// How long a write to a client may wait for it to read: a client
        /// that never reads its answers (or an event stream) is cut off.
        #[arg(long, value_name = "DURATION", env = "BINDERY_WRITE_TIMEOUT",
              default_value = "30s", value_parser = parse_interval)]
        write_timeout: std::time::Duration,
        /// Connections one IP address may hold open at once (event
        /// streams included); one more is closed as it is accepted.
        #[arg(long, value_name = "N", env = "BINDERY_MAX_CONNECTIONS_PER_IP",
              default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
        max_connections_per_ip: u32,
        /// The host names requests may be sent to (their `Host`),
        /// comma-separated. Default: on a loopback address, localhost and
        /// loopback addresses only (a page of another site that resolves
        /// its name to this address is refused: DNS rebinding); elsewhere
        /// any. `*`: any.
        #[arg(
            long,
            value_name = "HOST,...",
            env = "BINDERY_ALLOWED_HOSTS",
            value_delimiter = ','
        )]
        allowed_hosts: Vec<String>,
        /// The browser origins (`https://console.example.com`) whose pages
        /// may call this server besides its own, comma-separated; `*` for
        /// any. A request with another `Origin` is refused (403), on
        /// `/mcp` as the MCP transport requires and on every other route.
        #[arg(
            long,
            value_name = "ORIGIN,...",
            env = "BINDERY_ALLOWED_ORIGINS",
            value_delimiter = ','
        )]
        allowed_origins: Vec<String>,
        /// Run the server's async work on this many threads. Default: one
        /// fewer than the CPUs the process may use (a container's CPU
        /// limit counts), at least one: the CPU left over runs its tools'
        /// processes and its store's and allocator's own threads.
        #[arg(long, value_name = "N", env = "BINDERY_WORKER_THREADS",
              value_parser = clap::value_parser!(u16).range(1..))]
        worker_threads: Option<u16>,
        /// Do not ask the model for streamed replies.
        #[arg(long)]
        no_stream: bool,
        /// How often this server records its heartbeat in the store.
        #[arg(long, hide = true, value_name = "DURATION", default_value = "10s",
              value_parser = humantime::parse_duration)]
        runner_heartbeat: std::time::Duration,
        /// How long a heartbeat vouches for the server's runs: a run whose
        /// server has not beaten for this long is lost, and marked failed.
        #[arg(long, hide = true, value_name = "DURATION", default_value = "30s",
              value_parser = humantime::parse_duration)]
        runner_lease: std::time::Duration,
        /// On SIGTERM or Ctrl-C, how long the runs under way may take to
        /// end before their tools are stopped and the server exits (no
        /// new request is taken meanwhile; peers still reach it). Keep it
        /// under the pod's termination grace period (30s unless set).
        #[arg(long, value_name = "DURATION", default_value = "25s",
              env = "BINDERY_DRAIN_TIMEOUT", value_parser = humantime::parse_duration)]
        drain_timeout: std::time::Duration,
    },
    /// List the tool calls of a session file, agents-exe's or Bindery's
    /// (agents-exe's command): each call once, with its turn (from 1) and
    /// its index (agents-exe's: its place in its turn, turns newest
    /// first; Bindery's: its place in the session), which
    /// `replay-tool-call --tool-call` takes.
    ListToolCalls {
        /// The session file.
        #[arg(value_name = "SESSIONFILE")]
        session: PathBuf,
        /// `human`, `json` or `brief`.
        #[arg(long, short = 'f', value_enum, value_name = "FORMAT",
              default_value_t = super::agents_exe_session::calls::ListFormat::Human)]
        format: super::agents_exe_session::calls::ListFormat,
    },
    /// Print an agents-exe session file as Markdown (agents-exe's command).
    SessionPrint {
        /// The session file.
        #[arg(value_name = "SESSIONFILE")]
        session: PathBuf,
        /// How to show tool call results: hidden, shown or elided (ten
        /// lines each side).
        #[arg(long, value_name = "MODE", default_value = "hidden",
              value_parser = super::agents_exe_session::print::Visibility::parse)]
        show_tool_call_results: super::agents_exe_session::print::Visibility,
        /// How to show tool call arguments: hidden, shown or elided.
        #[arg(long, value_name = "MODE", default_value = "hidden",
              value_parser = super::agents_exe_session::print::Visibility::parse)]
        show_tool_call_arguments: super::agents_exe_session::print::Visibility,
        /// Only the last N steps.
        #[arg(long, value_name = "N")]
        n_turns: Option<usize>,
        /// Show the system prompt at every user step (default: the first shown).
        #[arg(long)]
        repeat_system_prompt: bool,
        /// Show the tools at every user step (default: the first shown).
        #[arg(long)]
        repeat_tools: bool,
        /// Newest step first.
        #[arg(long)]
        antichronological: bool,
        /// No ASCII-art stamp in the header.
        #[arg(long)]
        no_funny_stamp: bool,
        /// Instead of the report, what `run --session-SIZE FILE` puts in a
        /// prompt (xs, s, m, l, xl): agents-exe's compact rendering, the
        /// other options aside.
        #[arg(long, value_enum, value_name = "SIZE")]
        as_prompt: Option<super::agents_exe_session::print::Verbosity>,
    },
    /// Edit an agents-exe session: JSON on stdin, the result on stdout
    /// (agents-exe's command). Operations, applied in order: --take,
    /// --take-tail, --drop, --drop-tail (each followed by an optional
    /// -n/--count N, default 1; turns are stored newest first, so --take
    /// keeps the newest), --censor-tool-calls, --censor-thinking.
    SessionEdit {
        /// The operations, in order.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "OPERATION"
        )]
        operations: Vec<String>,
    },
    /// Manage the full-text index of agents-exe's session files
    /// (agents-exe's command; SQLite FTS5). Default: --status.
    SessionIndex {
        /// Build the index from scratch.
        #[arg(long, conflicts_with_all = ["update", "status", "clean"])]
        build: bool,
        /// Index the sessions new or changed since, forget those gone.
        #[arg(long, conflicts_with_all = ["status", "clean"])]
        update: bool,
        /// Say whether the index is up to date.
        #[arg(long, conflicts_with = "clean")]
        status: bool,
        /// Remove the index.
        #[arg(long)]
        clean: bool,
        #[command(flatten)]
        index: SessionIndexArgs,
    },
    /// Search agents-exe's session files (agents-exe's command): the
    /// sessions holding every word of QUERY (substrings, any case), best
    /// first. A missing index is built first.
    SessionSearch {
        /// The words to find.
        #[arg(value_name = "QUERY")]
        query: String,
        #[command(flatten)]
        index: SessionIndexArgs,
        /// Only sessions last written on or after this day (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "DATE")]
        after: Option<String>,
        /// Only sessions last written before this day (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "DATE")]
        before: Option<String>,
        /// Only sessions that called this tool (its model-visible name);
        /// repeatable: any of them.
        #[arg(long, value_name = "TOOL")]
        tool: Vec<String>,
        /// Only sessions of this agent (agents-exe's files do not record
        /// it: none of theirs matches).
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
        /// Output as JSON.
        #[arg(long)]
        json: bool,
        /// Show about N lines of context around the matches.
        #[arg(long, value_name = "N", default_value_t = 0)]
        preview: usize,
        /// At most N results (at least 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
        /// Bring a stale index up to date before searching.
        #[arg(long)]
        auto: bool,
    },
    /// Print the prompt `run` would send, composed of the same directives
    /// (agents-exe's `echo-prompt`; no agent file needed).
    EchoPrompt {
        #[command(flatten)]
        script: super::prompt_script::PromptArgs,
        /// Where a file-mode alias (code-review, explain) reads its
        /// content (stdin without it), as in agents-exe.
        #[arg(long, value_name = "FILE")]
        session_file: Option<PathBuf>,
    },
    /// Check a tool call's arguments (JSON on stdin) against a bash tool
    /// script's `describe` (agents-exe's `check-tool-call`): exit 0 when
    /// they fit, 1 with each problem when not.
    CheckToolCall {
        /// The script.
        #[arg(long, short = 't', value_name = "TOOLPATH")]
        tool: PathBuf,
    },
    /// Serve the agents as MCP tools on stdin/stdout (agents-exe's
    /// `mcp-server`): each agent file given is the tool `ask_<slug>_NNN`,
    /// which runs it once on `{"prompt": …}`. Logs go to stderr.
    McpServer {
        #[command(flatten)]
        agents: AgentArgs,
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// Where the session index is and what it reads.
#[derive(Args, Debug, Clone)]
pub struct SessionIndexArgs {
    /// The index database.
    #[arg(long, value_name = "PATH", default_value = super::agents_exe_session::index::DEFAULT_DB)]
    pub db_path: PathBuf,
    /// Also index the tool calls and their results.
    #[arg(long)]
    pub include_tool_outputs: bool,
    /// Where the session files (`conv.<uuid>.json`) are; repeatable.
    /// Default: agents-exe's (its agents-exe.cfg.json `sessions`, else
    /// ~/.config/agents-exe/sessions).
    #[arg(long = "sessions-dir", value_name = "DIR")]
    pub sessions_dirs: Vec<PathBuf>,
}

/// How approval notices reach people.
#[derive(Args, Debug, Clone)]
pub struct ApprovalArgs {
    /// Where people and webhook receivers reach this server (the tenant's
    /// public address): the base of the answer URLs in approval notices.
    /// Default: the address listened on, unless that is 0.0.0.0.
    #[arg(long, value_name = "URL", env = "BINDERY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// How many times an approval notice is sent before it fails for
    /// good (with backoff from 0.5 s, doubling).
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub approval_notice_attempts: u32,
}

/// The bearer tokens the server accepts besides session tokens.
#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// A file holding the owner's bearer token. Without it (and without
    /// BINDERY_OWNER_TOKEN) a token is generated into `owner-token`
    /// next to an SQLite store; a Postgres store needs one given.
    #[arg(long, value_name = "FILE")]
    pub owner_token_file: Option<PathBuf>,
    /// A file holding the MCP client token: a client that presents it
    /// on `/mcp` may call the agents' exposed tools (`spec.mcp.exposeTools`)
    /// and nothing else. Also BINDERY_MCP_CLIENT_TOKEN. None by default.
    #[arg(long, value_name = "FILE")]
    pub mcp_client_token_file: Option<PathBuf>,
    /// A file holding the approver token: its bearer lists pending
    /// approvals (GET /v1/approvals) and answers them, and reads nothing
    /// else. Also BINDERY_APPROVER_TOKEN. None by default.
    #[arg(long, value_name = "FILE")]
    pub approver_token_file: Option<PathBuf>,
}

/// End users: the platform's identity provider, whose identity tokens
/// (OIDC JWTs) the server takes from people, each then using their own
/// sessions only.
#[derive(Args, Debug, Clone)]
pub struct IdentityArgs {
    /// The issuer of end users' identity tokens, exactly as their `iss`
    /// says (https, or http on loopback); its keys are found through its
    /// `/.well-known/openid-configuration`. Without it, identity tokens
    /// are not taken.
    #[arg(
        long,
        value_name = "URL",
        env = "BINDERY_IDENTITY_ISSUER",
        requires = "identity_audience"
    )]
    pub identity_issuer: Option<String>,
    /// The audience the tokens must be issued for (repeatable, or
    /// comma-separated in BINDERY_IDENTITY_AUDIENCE): one of these must be
    /// in a token's `aud`.
    #[arg(
        long,
        value_name = "AUDIENCE",
        env = "BINDERY_IDENTITY_AUDIENCE",
        value_delimiter = ',',
        requires = "identity_issuer"
    )]
    pub identity_audience: Vec<String>,
    /// Where the issuer's keys (JWKS) are, when its discovery document is
    /// not to be read.
    #[arg(
        long,
        value_name = "URL",
        env = "BINDERY_IDENTITY_JWKS_URL",
        requires = "identity_issuer"
    )]
    pub identity_jwks_url: Option<String>,
    /// The claim that names the person.
    #[arg(
        long,
        value_name = "CLAIM",
        env = "BINDERY_IDENTITY_SUBJECT_CLAIM",
        default_value = "sub"
    )]
    pub identity_subject_claim: String,
    /// How far the issuer's clock and this server's may disagree (at
    /// most 300).
    #[arg(
        long,
        value_name = "SECONDS",
        env = "BINDERY_IDENTITY_CLOCK_SKEW",
        default_value_t = 60
    )]
    pub identity_clock_skew: u64,
    /// The client id this server exchanges end users' tokens as (RFC
    /// 8693), for `{identity: {token: …}}` bindings; its secret comes from
    /// --identity-exchange-secret-file or
    /// BINDERY_IDENTITY_EXCHANGE_CLIENT_SECRET.
    #[arg(
        long,
        value_name = "ID",
        env = "BINDERY_IDENTITY_EXCHANGE_CLIENT_ID",
        requires = "identity_issuer"
    )]
    pub identity_exchange_client_id: Option<String>,
    /// A file holding the exchange client's secret.
    #[arg(long, value_name = "FILE", requires = "identity_exchange_client_id")]
    pub identity_exchange_secret_file: Option<PathBuf>,
    /// The issuer's token endpoint, when its discovery document is not to
    /// be read.
    #[arg(
        long,
        value_name = "URL",
        env = "BINDERY_IDENTITY_TOKEN_URL",
        requires = "identity_exchange_client_id"
    )]
    pub identity_token_url: Option<String>,
}

/// Limits on what end users and clients may ask of the server: runs at
/// once per end user (counted in the store, across replicas), requests
/// and tool calls per minute (counted by each replica).
#[derive(Args, Debug, Clone)]
pub struct LimitsArgs {
    /// At most this many runs in progress at once per end user (people
    /// signed in with --identity-issuer's tokens); one more is answered
    /// 429 too_many_runs.
    #[arg(long, value_name = "N", env = "BINDERY_MAX_RUNS_PER_USER",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs_per_user: Option<u32>,
    /// At most this many requests per minute to this server, every client
    /// together (a burst of as many, then one every 60/N s); past it, 429
    /// rate_limited. Probes and /metrics are not counted.
    #[arg(long, value_name = "N", env = "BINDERY_REQUESTS_PER_MINUTE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub requests_per_minute: Option<u32>,
    /// At most this many requests per minute per end user.
    #[arg(long, value_name = "N", env = "BINDERY_PER_USER_REQUESTS_PER_MINUTE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub per_user_requests_per_minute: Option<u32>,
    /// A limit on the calls of the tools a glob names, TOOL=CALLS per
    /// minute, or TOOL=CALLS/user for each end user apart (repeatable, or
    /// comma-separated in BINDERY_TOOL_RATE_LIMITS): a call over it does
    /// not run, and the model is told it is rate limited.
    #[arg(
        long = "tool-rate-limit",
        value_name = "TOOL=CALLS[/user]",
        env = "BINDERY_TOOL_RATE_LIMITS",
        value_delimiter = ','
    )]
    pub tool_rate_limits: Vec<bindery_session::rate::ToolRate>,
}

impl IdentityArgs {
    /// The identity provider these flags configure, checked; `None`
    /// without `--identity-issuer`.
    pub fn config(
        &self,
    ) -> Result<Option<bindery_identity::IdentityConfig>, bindery_identity::ConfigError> {
        let Some(issuer) = &self.identity_issuer else {
            return Ok(None);
        };
        let mut config =
            bindery_identity::IdentityConfig::new(issuer, self.identity_audience.clone())?;
        if let Some(url) = &self.identity_jwks_url {
            let parsed = reqwest::Url::parse(url)
                .map_err(|_| bindery_identity::ConfigError::IssuerNotUrl(url.clone()))?;
            config.jwks_url = Some(parsed);
        }
        config.subject_claim = self.identity_subject_claim.clone();
        config.clock_skew = std::time::Duration::from_secs(self.identity_clock_skew);
        config.check()?;
        Ok(Some(config))
    }
}

/// How replicas forward to each other over mutual TLS.
#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// The tenant's peer certificate: a directory holding `ca.crt`,
    /// `tls.crt` and `tls.key` (PEM; a kubernetes.io/tls Secret plus its
    /// CA). Replicas then forward to each other over mutual TLS on
    /// --peer-listen, and --advertise-url names that port (https://).
    /// Without it, a forward that would carry a secret value is refused.
    #[arg(
        long,
        value_name = "DIR",
        env = "BINDERY_PEER_TLS_DIR",
        requires = "peer_tls_name"
    )]
    pub peer_tls_dir: Option<PathBuf>,
    /// The DNS name on the replicas' shared certificate (the tenant's
    /// Service name): a peer's certificate must name it.
    #[arg(
        long,
        value_name = "NAME",
        env = "BINDERY_PEER_TLS_NAME",
        requires = "peer_tls_dir"
    )]
    pub peer_tls_name: Option<String>,
    /// Address to take other replicas' forwards on, over mutual TLS,
    /// with --peer-tls-dir.
    #[arg(
        long,
        value_name = "ADDR",
        env = "BINDERY_PEER_LISTEN",
        default_value = "0.0.0.0:8443"
    )]
    pub peer_listen: String,
}

/// How to talk to the model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Seconds one model request may take.
    #[arg(long, default_value_t = 120)]
    pub llm_timeout: u64,
    /// Retries of a model request on 429, 5xx and connection failures.
    #[arg(long, default_value_t = 3)]
    pub llm_retries: u32,
    /// Seconds a whole model request may last, its retries and a streamed
    /// reply included (--llm-timeout bounds each wait within it); by
    /// default 600, or --llm-timeout when that is longer.
    #[arg(long)]
    pub llm_deadline: Option<u64>,
    /// Bytes a model's reply may hold, streamed or not: past them it is
    /// refused and none of it kept.
    #[arg(long, default_value_t = bindery_llm::ReplyLimits::DEFAULT_MAX_BYTES)]
    pub model_max_reply_bytes: usize,
    /// Tool calls one model reply may ask for: past them none runs.
    #[arg(long, default_value_t = bindery_llm::ReplyLimits::DEFAULT_MAX_TOOL_CALLS)]
    pub model_max_tool_calls: usize,
    /// Model turns one run may take (an agent's `maxSteps` wins).
    #[arg(long, default_value_t = 20)]
    pub max_steps: u32,
    /// Send every agent's model requests to this OpenAI-compatible API root
    /// instead of its `spec.model.url` (a local server, or the mock model):
    /// e.g. http://127.0.0.1:11434/v1. The agent files' API keys are then
    /// not sent; BINDERY_MODEL_API_KEY gives this server's, if it wants one.
    #[arg(long, value_name = "URL", env = "BINDERY_MODEL_URL")]
    pub model_url: Option<String>,
    /// The model name sent with --model-url (default: each agent's
    /// `spec.model.name`).
    #[arg(
        long,
        value_name = "NAME",
        env = "BINDERY_MODEL_NAME",
        requires = "model_url"
    )]
    pub model_name: Option<String>,
}

/// Which agents to load and the operator's parameter values.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// An agent file (Bindery YAML/JSON or agents-exe JSON). Repeatable.
    /// Without one (nor --agents-dir), as agents-exe: the files an
    /// `agents-exe.cfg.json` lists (found from the working directory up:
    /// `agentsFiles`, and the `.json` files of `agentsDirectories`), else
    /// `~/.config/agents-exe/default/*.json`.
    #[arg(long = "agent-file", value_name = "FILE")]
    pub agent_files: Vec<PathBuf>,
    /// A directory of agent files.
    #[arg(long, value_name = "DIR", conflicts_with = "agent_files")]
    pub agents_dir: Option<PathBuf>,
    /// Which loaded agent a command is about (default: the only one).
    #[arg(long)]
    pub agent: Option<String>,
    /// Set a parameter to a string: NAME=VALUE. Shows in `ps`: prefer
    /// --params-file or the environment for secrets.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// Set a parameter to a JSON value: NAME=JSON.
    #[arg(long = "set-json", value_name = "NAME=JSON")]
    pub set_json: Vec<String>,
    /// Like --set, and no client may override it.
    #[arg(long = "pin", value_name = "NAME=VALUE")]
    pub pin: Vec<String>,
    /// Like --set-json, and no client may override it.
    #[arg(long = "pin-json", value_name = "NAME=JSON")]
    pub pin_json: Vec<String>,
    /// A JSON/YAML object of values: {"name": value} or {"name": {"value": …, "pinned": true}}.
    #[arg(long = "params-file", value_name = "FILE")]
    pub params_files: Vec<PathBuf>,
    /// agents-exe's API-keys file: {"keys": [{"id": …, "value": …}]}
    /// (default: `~/.config/agents-exe/secret-keys` when it exists).
    #[arg(long, value_name = "FILE", env = "BINDERY_API_KEYS_FILE")]
    pub api_keys: Option<PathBuf>,
    /// Seconds one bash tool call may take.
    #[arg(long, default_value_t = 60)]
    pub tool_timeout: u64,
    /// Bytes of a tool's output kept.
    #[arg(long, default_value_t = 256 * 1024)]
    pub tool_max_output: usize,
    /// Memory each process of a bash tool's call may write to (its heap,
    /// data and private mappings), in MiB; past it, its allocations fail.
    /// 0: no bound.
    #[arg(long, value_name = "MIB", env = "BINDERY_TOOL_MEMORY_MIB",
          default_value_t = bindery_tools::bash::DEFAULT_TOOL_MEMORY / (1024 * 1024))]
    pub tool_memory: u64,
    /// How many processes the server's user may have when a bash tool's
    /// process forks (the tools and the server together: RLIMIT_NPROC,
    /// which the kernel does not apply to root); past it a fork fails.
    /// 0: no bound.
    #[arg(long, value_name = "N", env = "BINDERY_TOOL_PROCESSES",
          default_value_t = bindery_tools::bash::DEFAULT_TOOL_PROCESSES)]
    pub tool_processes: u64,
}

/// How long something idle is kept: a duration, or `None` for as long as
/// the process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime(pub Option<std::time::Duration>);

/// Why a duration flag's value is refused (clap names the flag before it).
#[derive(Debug, thiserror::Error)]
pub enum DurationArgError {
    #[error("must be more than zero (`off` keeps the values for good)")]
    ZeroLifetime,
    #[error("{0} (a duration such as `30m`, or `off`)")]
    NotALifetime(#[source] humantime::DurationError),
    #[error("must be more than zero")]
    Zero,
    #[error(transparent)]
    NotADuration(#[from] humantime::DurationError),
}

/// `30m`, `90s`, or `off`; zero would forget at once, so it is refused.
fn parse_lifetime(s: &str) -> Result<Lifetime, DurationArgError> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(Lifetime(None));
    }
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err(DurationArgError::ZeroLifetime),
        Ok(d) => Ok(Lifetime(Some(d))),
        Err(e) => Err(DurationArgError::NotALifetime(e)),
    }
}

/// A duration that repeats (`15s`, `1m`): more than zero.
fn parse_interval(s: &str) -> Result<std::time::Duration, DurationArgError> {
    match humantime::parse_duration(s)? {
        d if d.is_zero() => Err(DurationArgError::Zero),
        d => Ok(d),
    }
}

/// A `provider` as an agent file writes it.
fn parse_provider(s: &str) -> Result<bindery_spec::provider::Provider, String> {
    let name = match s {
        "responses" => "openai-responses",
        other => other,
    };
    bindery_spec::provider::Provider::parse(name).ok_or_else(|| {
        format!(
            "`{s}` is not a provider Bindery speaks: {}",
            bindery_spec::provider::PROVIDERS
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{Cli, Command, Lifetime};

    /// `--live-session-ttl` as clap takes it, or clap's message.
    fn live_session_ttl(extra: &[&str]) -> Result<Lifetime, String> {
        let args = ["bindery-sidecar", "serve", "--agent-file", "a.yaml"]
            .iter()
            .chain(extra);
        match Cli::try_parse_from(args)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve {
                live_session_ttl, ..
            } => Ok(live_session_ttl),
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn every_command_line_is_well_formed() {
        // Duplicate flags (say, a directive's -s against another -s) and
        // the like, in every subcommand.
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn secret_values_of_an_idle_session_last_an_hour_unless_told_otherwise() {
        assert_eq!(
            live_session_ttl(&[]),
            Ok(Lifetime(Some(Duration::from_secs(3600))))
        );
        assert_eq!(
            live_session_ttl(&["--live-session-ttl", "90s"]),
            Ok(Lifetime(Some(Duration::from_secs(90))))
        );
        assert_eq!(
            live_session_ttl(&["--live-session-ttl", "off"]),
            Ok(Lifetime(None))
        );
        for bad in ["0s", "0", "soon"] {
            let err = live_session_ttl(&["--live-session-ttl", bad]).unwrap_err();
            assert!(
                err.contains("--live-session-ttl") && err.contains("off"),
                "{err}"
            );
        }
    }
}
