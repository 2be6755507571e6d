//! Bash tools: executables that speak the `describe` / `run` protocol.
//!
//! `describe` prints a JSON description of the tool's arguments, each with
//! a calling mode; `run` gets the arguments in those modes and prints the
//! result on stdout. The `env` mode passes an argument as an environment
//! variable (`repo-token` becomes `REPO_TOKEN`) so that it never shows in
//! argv, the process list or a trace: it is the only mode a secret may use.

mod discover;
mod protocol;
mod run;
mod spawn;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

pub use discover::{
    load_directory, load_script, parse_description, DescriptionError, ScriptError,
    ToolDirectoryUnreadable,
};
pub use protocol::{env_var_name, Arity, EmptyResult, Mode, ScriptArg, ScriptInfo};

use super::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport};

/// [`Limits::memory`] unless `--tool-memory` says otherwise: 512 MiB.
pub const DEFAULT_TOOL_MEMORY: u64 = 512 * 1024 * 1024;

/// [`Limits::processes`] unless `--tool-processes` says otherwise.
pub const DEFAULT_TOOL_PROCESSES: u64 = 1024;

/// Bounds on what a script may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long `describe` may take, at load.
    pub describe_timeout: Duration,
    /// How long one `run` may take.
    pub call_timeout: Duration,
    /// Bytes of stdout kept; the rest is cut and the model told so.
    pub max_output: usize,
    /// Bytes of memory each process of a call may write to (its data,
    /// heap and private mappings: `RLIMIT_DATA`); `None`: no bound.
    pub memory: Option<u64>,
    /// How many processes the server's user may have when a tool's
    /// process forks (`RLIMIT_NPROC`: the user's, tools and server
    /// together; the kernel does not apply it to root); `None`: no bound.
    pub processes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            describe_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            max_output: 256 * 1024,
            memory: Some(DEFAULT_TOOL_MEMORY),
            processes: Some(DEFAULT_TOOL_PROCESSES),
        }
    }
}

/// One loaded script.
#[derive(Debug)]
pub struct BashTool {
    spec: ToolSpec,
    path: PathBuf,
    info: ScriptInfo,
    limits: Limits,
    /// Declared `cache: shared`: run without the session's context.
    shared: bool,
}

impl BashTool {
    /// What the script's `describe` printed.
    pub fn info(&self) -> &ScriptInfo {
        &self.info
    }

    pub fn new(path: PathBuf, info: ScriptInfo, limits: Limits) -> Self {
        let spec = ToolSpec {
            name: format!("bash_{}", info.slug),
            local_name: info.slug.clone(),
            description: info.description.clone(),
            args: info
                .args
                .iter()
                .map(|a| ArgSpec {
                    name: a.name.clone(),
                    description: a.description.clone(),
                    required: a.arity == Arity::Single,
                    schema: serde_json::json!({
                        "type": a.json_type(),
                        "description": a.description,
                    }),
                    transport: Transport::Bash(a.mode),
                })
                .collect(),
            // An executable may do anything.
            writes: true,
        };
        BashTool {
            spec,
            path,
            info,
            limits,
            shared: false,
        }
    }

    /// The tool as its toolbox declares it: `shared` ones are given nothing
    /// of the session, so one result may serve every session.
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

#[async_trait]
impl Tool for BashTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn receives_session(&self) -> bool {
        !self.shared
    }

    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        if self.shared {
            return run::run(self, args, &ctx.without_session()).await;
        }
        run::run(self, args, ctx).await
    }
}
