//! Loading the agent tree the command line names: the process values from
//! flags, files and the environment, then the files themselves. Shared by
//! every command, so no command module depends on another for it.

use std::time::Duration;

use super::args::AgentArgs;
use bindery_bindings::Level;
use bindery_params::{ApiKeys, ProcessValues};
use bindery_tools::bash::Limits;
use bindery_tree::{self as tree, AgentSources, AgentTree, LoadOptions};

/// What to do when no agent file is named nor found.
const GIVE_AGENT_FILES: &str = "give --agent-file FILE (or --agents-dir DIR), or run where an agents-exe.cfg.json (here or in a parent directory) lists them";

/// Why the agent tree could not be loaded: the files' diagnostics, a value
/// given wrong (its flag or file named, never its value), or no agent
/// file to load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Every diagnostic of the agent files (`check --output json` lists them).
    #[error(transparent)]
    Tree(#[from] tree::LoadError),
    #[error(transparent)]
    Value(#[from] bindery_params::process::ProcessValueError),
    #[error(transparent)]
    ApiKeys(#[from] bindery_params::sources::SourceError),
    #[error("cannot read the working directory: {0}")]
    WorkingDirectory(#[source] std::io::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cfg(#[from] CfgError),
    #[error("{file} lists no agent file; {GIVE_AGENT_FILES}")]
    NoneListed { file: String },
    #[error("no agent file: {GIVE_AGENT_FILES}")]
    NoAgentFile,
}

/// [`load`] for the commands a person runs at a terminal (`describe`,
/// `tool-call`): an MCP server's `authorization-code` grant asks them for
/// their consent there (the URL on stderr, the redirect on stdin).
pub(super) async fn load(agents: &AgentArgs) -> Result<AgentTree, LoadError> {
    load_with(agents, false).await
}

/// [`load`] for the commands that run agents (`serve`, `run`): a broken
/// tool script is skipped with a warning naming it, as agents-exe does.
pub(super) async fn load_lenient(agents: &AgentArgs) -> Result<AgentTree, LoadError> {
    load_with(agents, true).await
}

async fn load_with(agents: &AgentArgs, skip_broken_scripts: bool) -> Result<AgentTree, LoadError> {
    let consent: Option<std::sync::Arc<dyn bindery_tools::mcp::oauth::Consent>> =
        (!skip_broken_scripts)
            .then(|| std::sync::Arc::new(bindery_tools::mcp::oauth::Terminal) as _);
    let tree = load_tree_with(agents, skip_broken_scripts, consent).await?;
    for w in tree.warnings.iter().filter(|d| d.level == Level::Warning) {
        tracing::warn!("{}", w.message);
    }
    Ok(tree)
}

pub(super) async fn load_tree(
    agents: &AgentArgs,
    skip_broken_scripts: bool,
) -> Result<AgentTree, LoadError> {
    load_tree_with(agents, skip_broken_scripts, None).await
}

async fn load_tree_with(
    agents: &AgentArgs,
    skip_broken_scripts: bool,
    mcp_consent: Option<std::sync::Arc<dyn bindery_tools::mcp::oauth::Consent>>,
) -> Result<AgentTree, LoadError> {
    let mut opts = load_options(agents)?;
    opts.skip_broken_scripts = skip_broken_scripts;
    opts.mcp_consent = mcp_consent;
    let sources = match &agents.agents_dir {
        Some(dir) => AgentSources::Dir(dir.clone()),
        None if agents.agent_files.is_empty() => {
            let cwd = std::env::current_dir().map_err(LoadError::WorkingDirectory)?;
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            let (from, files) = agents_exe_defaults(&cwd, home.as_deref())?;
            tracing::info!(from = %from.display(), files = files.len(), "agent files as agents-exe finds them");
            AgentSources::Files(files)
        }
        None => AgentSources::Files(agents.agent_files.clone()),
    };
    Ok(tree::load(&sources, &opts).await?)
}

/// The agent files agents-exe uses when none is named: those an
/// `agents-exe.cfg.json` lists (the nearest from `cwd` up; its
/// `agentsFiles`, then the `.json` files of each of its
/// `agentsDirectories`, paths as written, from `cwd`), else the `.json`
/// files of `~/.config/agents-exe/default`. Which place they came from,
/// and the files.
pub fn agents_exe_defaults(
    cwd: &std::path::Path,
    home: Option<&std::path::Path>,
) -> Result<(std::path::PathBuf, Vec<std::path::PathBuf>), LoadError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        #[serde(default)]
        agents_files: Vec<String>,
        #[serde(default)]
        agents_directories: Vec<String>,
    }
    let json_files = |dir: &std::path::Path| -> Result<Vec<std::path::PathBuf>, LoadError> {
        let mut found: Vec<_> = std::fs::read_dir(dir)
            .map_err(|source| LoadError::Read {
                path: dir.display().to_string(),
                source,
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
            .collect();
        found.sort();
        Ok(found)
    };
    if let Some((cfg, c)) = read_agents_exe_cfg::<Config>(cwd)? {
        let file = || cfg.display().to_string();
        let mut files: Vec<_> = c.agents_files.iter().map(|f| cwd.join(f)).collect();
        for d in &c.agents_directories {
            let dir = cwd.join(d);
            // A listed directory that is not there holds no agent.
            if dir.is_dir() {
                files.extend(json_files(&dir)?);
            }
        }
        if files.is_empty() {
            return Err(LoadError::NoneListed { file: file() });
        }
        return Ok((cfg, files));
    }
    let default = home.map(|h| h.join(".config/agents-exe/default"));
    match default.filter(|d| d.is_dir()) {
        Some(dir) => {
            let files = json_files(&dir)?;
            if files.is_empty() {
                return Err(LoadError::NoAgentFile);
            }
            Ok((dir, files))
        }
        None => Err(LoadError::NoAgentFile),
    }
}

/// The nearest `agents-exe.cfg.json`, from `cwd` up, as agents-exe looks
/// for it.
pub fn nearest_agents_exe_cfg(cwd: &std::path::Path) -> Option<std::path::PathBuf> {
    cwd.ancestors()
        .map(|d| d.join("agents-exe.cfg.json"))
        .find(|p| p.is_file())
}

/// Why the nearest `agents-exe.cfg.json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CfgError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{file}: not agents-exe's configuration: {source}")]
    NotConfig {
        file: String,
        source: serde_json::Error,
    },
}

/// The nearest `agents-exe.cfg.json` from `cwd` up, read as `T`, and
/// where it is; `None` when there is none.
pub fn read_agents_exe_cfg<T: serde::de::DeserializeOwned>(
    cwd: &std::path::Path,
) -> Result<Option<(std::path::PathBuf, T)>, CfgError> {
    let Some(cfg) = nearest_agents_exe_cfg(cwd) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&cfg).map_err(|source| CfgError::Read {
        path: cfg.display().to_string(),
        source,
    })?;
    let read = serde_json::from_str(&text).map_err(|source| CfgError::NotConfig {
        file: cfg.display().to_string(),
        source,
    })?;
    Ok(Some((cfg, read)))
}

/// The process values, from flags, files and the environment.
pub fn load_options(agents: &AgentArgs) -> Result<LoadOptions, LoadError> {
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
        // agents-exe's own keys file, where it keeps it.
        None => match std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".config/agents-exe/secret-keys"))
            .filter(|p| p.is_file())
        {
            Some(p) => ApiKeys::load(&p)?,
            None => ApiKeys::default(),
        },
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
        mcp_consent: None,
    })
}
