//! Loading the agent tree the command line names: the process values from
//! flags, files and the environment, then the files themselves. Shared by
//! every command, so no command module depends on another for it.

use std::time::Duration;

use super::args::AgentArgs;
use crate::bindings::Level;
use crate::params::{ApiKeys, ProcessValues};
use crate::tools::bash::Limits;
use crate::tree::{self, AgentSources, AgentTree, LoadOptions};

/// A load failure: either every diagnostic, or one message.
pub(super) enum Failure {
    Load(tree::LoadError),
    Other(String),
}

impl Failure {
    pub(super) fn downcast(self) -> Result<tree::LoadError, String> {
        match self {
            Failure::Load(e) => Ok(e),
            Failure::Other(m) => Err(m),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Load(e) => write!(f, "error: {e}"),
            Failure::Other(m) => write!(f, "error: {m}"),
        }
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.to_string()
    }
}

pub(super) async fn load(agents: &AgentArgs) -> Result<AgentTree, String> {
    load_with(agents, false).await
}

/// [`load`] for the commands that run agents (`serve`, `run`): a broken
/// tool script is skipped with a warning naming it, as agents-exe does.
pub(super) async fn load_lenient(agents: &AgentArgs) -> Result<AgentTree, String> {
    load_with(agents, true).await
}

async fn load_with(agents: &AgentArgs, skip_broken_scripts: bool) -> Result<AgentTree, String> {
    let tree = load_tree(agents, skip_broken_scripts).await?;
    for w in tree.warnings.iter().filter(|d| d.level == Level::Warning) {
        tracing::warn!("{}", w.message);
    }
    Ok(tree)
}

pub(super) async fn load_tree(
    agents: &AgentArgs,
    skip_broken_scripts: bool,
) -> Result<AgentTree, Failure> {
    let mut opts = load_options(agents).map_err(Failure::Other)?;
    opts.skip_broken_scripts = skip_broken_scripts;
    let sources = match &agents.agents_dir {
        Some(dir) => AgentSources::Dir(dir.clone()),
        None => AgentSources::Files(agents.agent_files.clone()),
    };
    tree::load(&sources, &opts).await.map_err(Failure::Load)
}

/// The process values, from flags, files and the environment.
pub fn load_options(agents: &AgentArgs) -> Result<LoadOptions, String> {
    let mut process = ProcessValues::new();
    for (flag, list) in [
        ("--set", &agents.set),
        ("--set-json", &agents.set_json),
        ("--pin", &agents.pin),
        ("--pin-json", &agents.pin_json),
    ] {
        for arg in list {
            process.add_flag(flag, arg)?;
        }
    }
    for f in &agents.params_files {
        process.add_params_file(f)?;
    }
    process.add_env(std::env::vars())?;
    let api_keys = match &agents.api_keys {
        Some(p) => ApiKeys::load(p)?,
        None => ApiKeys::default(),
    };
    Ok(LoadOptions {
        process,
        api_keys,
        limits: Limits {
            call_timeout: Duration::from_secs(agents.tool_timeout),
            max_output: agents.tool_max_output,
            memory: (agents.tool_memory > 0).then(|| agents.tool_memory * 1024 * 1024),
            processes: (agents.tool_processes > 0).then_some(agents.tool_processes),
            ..Limits::default()
        },
        skip_broken_scripts: false,
    })
}
