//! What a command failed with: each module's own error, printed once (by
//! `commands::run_main`, on stderr, escaped for the terminal) with the
//! exit status 1.

use super::agents_exe_session::SessionFileError;
use super::load::LoadError;
use super::prompt_script::PromptError;
use super::session_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub(super) enum CliError {
    #[error("error: {0}")]
    Session(#[from] ClientError),
    #[error("error: {0}")]
    Prompt(#[from] PromptError),
    #[error("error: {0}")]
    SessionFile(#[from] SessionFileError),
    /// `commands::session_files` was handed a command it does not run.
    #[error("error: not a command over session files")]
    NotSessionFiles,
    #[error("error: {0}")]
    Load(#[from] LoadError),
    #[error("error: nothing to ask: give --prompt TEXT (-p), or the prompt on stdin")]
    NothingToAsk,
    /// A message as it is printed, `error: ` and all, from a module whose
    /// errors are text.
    #[error("{0}")]
    Message(String),
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Message(message)
    }
}
