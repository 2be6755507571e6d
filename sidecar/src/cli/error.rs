//! What a command failed with: each module's own error, printed once (by
//! `commands::run_main`, on stderr, escaped for the terminal) with the
//! exit status 1.

use super::agents_exe_session::SessionFileError;
use super::as_tool::AsToolError;
use super::audit::AuditError;
use super::call::CallError;
use super::check_tool_call::CheckCallError;
use super::load::LoadError;
use super::media::MediaError;
use super::one_shot::RunError;
use super::prompt_script::PromptError;
use super::replay::ReplayError;
use super::serve::ServeError;
use super::session_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub(super) enum CliError {
    #[error("error: {0}")]
    Session(#[from] ClientError),
    #[error("error: {0}")]
    Audit(#[from] AuditError),
    #[error("error: {0}")]
    Prompt(#[from] PromptError),
    #[error("error: {0}")]
    SessionFile(#[from] SessionFileError),
    /// `commands::session_files` was handed a command it does not run.
    #[error("error: not a command over session files")]
    NotSessionFiles,
    #[error("error: {0}")]
    Load(#[from] LoadError),
    #[error("error: {0}")]
    AsTool(#[from] AsToolError),
    #[error("error: {0}")]
    Call(#[from] CallError),
    #[error("error: {0}")]
    Replay(#[from] ReplayError),
    #[error("error: {0}")]
    Run(#[from] RunError),
    #[error("error: {0}")]
    Media(#[from] MediaError),
    #[error("error: {0}")]
    Serve(#[from] ServeError),
    /// Its texts carry their own `error: ` or agents-exe's words.
    #[error(transparent)]
    CheckCall(#[from] CheckCallError),
    #[error("error: {0}")]
    Pick(#[from] bindery_tree::PickError),
    /// `describe-tool`'s script.
    #[error("error: {0}")]
    Script(#[from] bindery_tools::bash::ScriptError),
    /// `describe --tools PROVIDER`: a tool that provider does not take.
    #[error("error: agent `{agent}`, as {provider} receives its tools: {source}")]
    ToolsAsSent {
        agent: String,
        provider: &'static str,
        source: bindery_llm::LlmError,
    },
    #[error("error: the tool's description is not JSON: {0}")]
    Describe(#[source] serde_json::Error),
    #[error("error: --args is not valid JSON: {0}")]
    ArgsNotJson(#[source] serde_json::Error),
    /// agents-exe's `tool-call NAME`, its arguments on stdin.
    #[error("error: Invalid JSON payload from stdin: {0}")]
    StdinNotJson(#[source] serde_json::Error),
    #[error("error: tool {tool} takes {{\"what\": TEXT}} here (a caller's `bindings`, `with` and `as` narrow a helper inside a model's run, not from the command line)")]
    HelperTakesWhat { tool: String },
    #[error("error: nothing to ask: give --prompt TEXT (-p), or the prompt on stdin")]
    NothingToAsk,
}
