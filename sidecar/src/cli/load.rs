//! Loading the agent tree the command line names: the process values from
//! flags, files and the environment, then the files themselves. Shared by
//! every command, so no command module depends on another for it.

use std::time::Duration;

use super::args::AgentArgs;
use bindery_bindings::Level;
use bindery_params::{ApiKeys, ProcessValues};
use bindery_tools::bash::Limits;
use bindery_tree::{self as tree, AgentSources, AgentTree, LoadOptions};

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
        None if agents.agent_files.is_empty() => {
            let cwd = std::env::current_dir()
                .map_err(|e| Failure::Other(format!("cannot read the working directory: {e}")))?;
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            let (from, files) =
                agents_exe_defaults(&cwd, home.as_deref()).map_err(Failure::Other)?;
            tracing::info!(from = %from.display(), files = files.len(), "agent files as agents-exe finds them");
            AgentSources::Files(files)
        }
        None => AgentSources::Files(agents.agent_files.clone()),
    };
    tree::load(&sources, &opts).await.map_err(Failure::Load)
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
) -> Result<(std::path::PathBuf, Vec<std::path::PathBuf>), String> {
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        #[serde(default)]
        agents_files: Vec<String>,
        #[serde(default)]
        agents_directories: Vec<String>,
    }
    let json_files = |dir: &std::path::Path| -> Result<Vec<std::path::PathBuf>, String> {
        let mut found: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
            .collect();
        found.sort();
        Ok(found)
    };
    let none = || {
        "no agent file: give --agent-file FILE (or --agents-dir DIR), or run where an agents-exe.cfg.json (here or in a parent directory) lists them".to_string()
    };
    if let Some(cfg) = nearest_agents_exe_cfg(cwd) {
        let text = std::fs::read_to_string(&cfg)
            .map_err(|e| format!("cannot read {}: {e}", cfg.display()))?;
        let c: Config = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not agents-exe's configuration: {e}", cfg.display()))?;
        let mut files: Vec<_> = c.agents_files.iter().map(|f| cwd.join(f)).collect();
        for d in &c.agents_directories {
            let dir = cwd.join(d);
            // A listed directory that is not there holds no agent.
            if dir.is_dir() {
                files.extend(json_files(&dir)?);
            }
        }
        if files.is_empty() {
            return Err(format!("{} lists no agent file; {}", cfg.display(), none()));
        }
        return Ok((cfg, files));
    }
    let default = home.map(|h| h.join(".config/agents-exe/default"));
    match default.filter(|d| d.is_dir()) {
        Some(dir) => {
            let files = json_files(&dir)?;
            if files.is_empty() {
                return Err(none());
            }
            Ok((dir, files))
        }
        None => Err(none()),
    }
}

/// The nearest `agents-exe.cfg.json`, from `cwd` up, as agents-exe looks
/// for it.
pub fn nearest_agents_exe_cfg(cwd: &std::path::Path) -> Option<std::path::PathBuf> {
    cwd.ancestors()
        .map(|d| d.join("agents-exe.cfg.json"))
        .find(|p| p.is_file())
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
            process.add_flag(flag, arg).map_err(|e| e.to_string())?;
        }
    }
    for f in &agents.params_files {
        process.add_params_file(f).map_err(|e| e.to_string())?;
    }
    process
        .add_env(std::env::vars())
        .map_err(|e| e.to_string())?;
    let api_keys = match &agents.api_keys {
        Some(p) => ApiKeys::load(p).map_err(|e| e.to_string())?,
        // agents-exe's own keys file, where it keeps it.
        None => match std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".config/agents-exe/secret-keys"))
            .filter(|p| p.is_file())
        {
            Some(p) => ApiKeys::load(&p).map_err(|e| e.to_string())?,
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
    })
}
