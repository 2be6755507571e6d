//! `as-tool`: the binary as a bash tool of another agent runtime (Bindery
//! or agents-exe), speaking the `describe` / `run` protocol. A wrapper
//! script in the caller's tools directory names the agent:
//!
//! ```sh
//! #!/bin/sh
//! exec bindery-sidecar as-tool --agent-file /srv/agents/invoices.yaml "$@"
//! ```
//!
//! `describe` offers `prompt` plus each parameter a client may supply (not
//! pinned, session or message scope): a secret one in `env` mode, so the
//! caller can bind it without it reaching argv. `run` does one run with
//! those values and prints the answer.

use serde_json::{json, Value};

use super::prompt_script::{PromptError, PromptScript};
use bindery_params::ParamStatus;
use bindery_spec::Scope;

/// The parameters `run` takes besides `prompt`.
pub fn open_params(statuses: Vec<ParamStatus>) -> Vec<ParamStatus> {
    statuses
        .into_iter()
        .filter(|s| !s.pinned && matches!(s.scope, Scope::Session | Scope::Message))
        .collect()
}

/// Why `as-tool` could not describe or run its agent: the protocol's
/// arguments given wrong, an agent it cannot offer, or the run's failure.
#[derive(Debug, thiserror::Error)]
pub enum AsToolError {
    #[error("agent `{agent}` has a parameter called `prompt`, which as-tool cannot offer: `prompt` is the tool's own argument (the text the agent is asked); rename the parameter (or pin it) to serve this agent as a tool")]
    PromptParameter { agent: String },
    #[error("unexpected argument `{given}`: `describe` takes --self-describe-slug NAME and --self-describe-description TEXT")]
    DescribeArgument { given: String },
    #[error("unexpected argument `{given}`: `run` takes --prompt TEXT (and agents-exe's other prompt directives) and --NAME VALUE")]
    RunArgument { given: String },
    #[error("{flag} needs a value")]
    NoValue { flag: String },
    /// `known`: `, --NAME` for each parameter the agent offers.
    #[error("unknown argument {flag} (this agent takes --prompt{known} and agents-exe's directives -p, -f, --shell, -s, -S, --alias)")]
    UnknownArgument { flag: String, known: String },
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("`run` needs --prompt TEXT (or a prompt on stdin)")]
    NoPrompt,
    #[error("as-tool takes `describe` or `run --prompt TEXT [--NAME VALUE…]` (the bash tool protocol; agents-exe's prompt directives too)")]
    NoCommand,
    #[error(transparent)]
    Load(#[from] super::load::LoadError),
    #[error(transparent)]
    Pick(#[from] bindery_tree::PickError),
    #[error(transparent)]
    Run(#[from] super::one_shot::RunError),
}

/// An agent whose open parameter is called `prompt` cannot be a tool:
/// the protocol's own `prompt` argument would be offered twice and no
/// call could tell them apart.
pub fn check_names(agent: &str, params: &[ParamStatus]) -> Result<(), AsToolError> {
    match params.iter().find(|p| p.name == "prompt") {
        Some(_) => Err(AsToolError::PromptParameter {
            agent: agent.to_string(),
        }),
        None => Ok(()),
    }
}

/// The protocol's description of the agent as a tool.
pub fn describe(slug: &str, announce: Option<&str>, params: &[ParamStatus]) -> Value {
    let mut args = vec![json!({
        "name": "prompt",
        "description": "the prompt to call the agent with",
        "type": "string",
        "backing_type": "string",
        "arity": "single",
        "mode": "dashdashspace",
    })];
    for p in params {
        args.push(json!({
            "name": p.name,
            "description": p.description.clone().unwrap_or_else(|| format!("the agent's parameter {}", p.name)),
            "type": "string",
            "backing_type": "string",
            "arity": if p.required && !p.bound { "single" } else { "optional" },
            "mode": if p.secret { "env" } else { "dashdashspace" },
        }));
    }
    json!({
        "slug": slug,
        "description": announce.map(str::to_string).unwrap_or_else(|| format!("asks the agent {slug}")),
        "args": args,
        "empty-result": {"tag": "AddMessage", "contents": "--no output--"},
    })
}

/// `describe`'s options, agents-exe's: `--self-describe-slug NAME` and
/// `--self-describe-description TEXT` name the tool differently.
pub fn parse_describe(argv: &[String]) -> Result<(Option<String>, Option<String>), AsToolError> {
    let (mut slug, mut description) = (None, None);
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag.as_str(), None),
        };
        let slot = match name {
            "--self-describe-slug" => &mut slug,
            "--self-describe-description" => &mut description,
            _ => {
                return Err(AsToolError::DescribeArgument {
                    given: flag.clone(),
                })
            }
        };
        *slot = Some(match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| AsToolError::NoValue {
                flag: name.to_string(),
            })?,
        });
    }
    Ok((slug, description))
}

/// `run`'s arguments: the prompt, of agents-exe's directives (`--prompt`
/// being one: see [`super::prompt_script`]), and `NAME=VALUE` for each
/// parameter given, a secret one read from its environment variable
/// (`env` mode). A parameter's name wins over a directive's: a caller
/// fills the arguments `describe` offered, and a value meant for a
/// parameter called `file` or `shell` must never be read as a path or run.
pub fn parse_run(
    argv: &[String],
    params: &[ParamStatus],
    env: impl Fn(&str) -> Option<String>,
) -> Result<(PromptScript, Vec<(String, String)>), AsToolError> {
    let mut script = PromptScript::default();
    let mut values = Vec::new();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (flag.as_str(), None),
        };
        if !name.starts_with('-') {
            return Err(AsToolError::RunArgument {
                given: flag.clone(),
            });
        }
        let mut value = || match &inline {
            Some(v) => Ok(v.clone()),
            None => it.next().cloned().ok_or_else(|| AsToolError::NoValue {
                flag: name.to_string(),
            }),
        };
        let param = name
            .strip_prefix("--")
            .filter(|n| *n != "prompt" && params.iter().any(|p| p.name == *n && !p.secret));
        if let Some(param) = param {
            values.push((param.to_string(), value()?));
        } else if !script.take(name, value()?)? {
            let known: Vec<&str> = params
                .iter()
                .filter(|p| !p.secret)
                .map(|p| p.name.as_str())
                .collect();
            return Err(AsToolError::UnknownArgument {
                flag: name.to_string(),
                known: known.iter().map(|k| format!(", --{k}")).collect(),
            });
        }
    }
    for p in params.iter().filter(|p| p.secret) {
        if let Some(v) = env(&bindery_tools::bash::env_var_name(&p.name)) {
            values.push((p.name.clone(), v));
        }
    }
    Ok((script, values))
}

/// `as-tool … describe` or `as-tool … run --prompt TEXT [--NAME VALUE…]`.
pub async fn main(
    mut agents: super::args::AgentArgs,
    model: super::args::ModelArgs,
    protocol: Vec<String>,
) -> Result<std::process::ExitCode, AsToolError> {
    let tree = super::load::load_lenient(&agents).await?;
    let agent = tree.pick(agents.agent.as_deref())?;
    let params = open_params(agent.params.statuses());
    check_names(&agent.name, &params)?;
    match protocol.split_first() {
        Some((cmd, rest)) if cmd == "describe" => {
            let (slug, description) = parse_describe(rest)?;
            let d = describe(
                slug.as_deref().unwrap_or(&agent.name),
                description.as_deref().or(agent.spec.announce.as_deref()),
                &params,
            );
            println!("{d}");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Some((cmd, rest)) if cmd == "run" => {
            let (script, values) = parse_run(rest, &params, |k| std::env::var(k).ok())?;
            // No directive: the prompt is stdin, as agents-exe's `run`.
            let prompt =
                tokio::task::block_in_place(|| super::prompt_script::compose_here(&script, None))?;
            if prompt.trim().is_empty() {
                return Err(AsToolError::NoPrompt);
            }
            // Client-supplied values, as the operator's --set would give them.
            agents.agent = Some(agent.name.clone());
            agents
                .set
                .extend(values.into_iter().map(|(k, v)| format!("{k}={v}")));
            // A call that waits is refused: a tool's stdin answers nothing.
            Ok(super::one_shot::run(&agents, &model, prompt, false, None).await?)
        }
        _ => Err(AsToolError::NoCommand),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, scope: Scope, secret: bool, pinned: bool) -> ParamStatus {
        ParamStatus {
            name: name.into(),
            description: None,
            scope,
            secret,
            required: true,
            source: String::new(),
            bound: false,
            pinned,
            problem: None,
        }
    }

    fn params() -> Vec<ParamStatus> {
        open_params(vec![
            status("tenant", Scope::Session, false, false),
            status("billing_token", Scope::Session, true, false),
            status("region", Scope::Process, false, false),
            status("org", Scope::Session, false, true),
        ])
    }

    #[test]
    fn describe_offers_prompt_and_the_open_parameters() {
        let d = describe("invoices", None, &params());
        let args: Vec<(&str, &str)> = d["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["name"].as_str().unwrap(), a["mode"].as_str().unwrap()))
            .collect();
        assert_eq!(
            args,
            [
                ("prompt", "dashdashspace"),
                ("tenant", "dashdashspace"),
                ("billing_token", "env")
            ]
        );
    }

    #[test]
    fn run_reads_flags_and_secret_env() {
        let argv: Vec<String> = ["--prompt", "hi", "--tenant=acme"]
            .map(String::from)
            .to_vec();
        let env = |k: &str| (k == "BILLING_TOKEN").then(|| "tok".to_string());
        let (script, values) = parse_run(&argv, &params(), env).unwrap();
        assert_eq!(
            script.directives,
            [crate::cli::prompt_script::Directive::Text("hi".into())]
        );
        assert_eq!(
            values,
            [
                ("tenant".to_string(), "acme".to_string()),
                ("billing_token".to_string(), "tok".to_string())
            ]
        );
        // A secret never comes from argv.
        let argv: Vec<String> = ["--prompt", "hi", "--billing_token", "x"]
            .map(String::from)
            .to_vec();
        assert!(parse_run(&argv, &params(), |_| None)
            .unwrap_err()
            .to_string()
            .contains("unknown argument --billing_token"));
    }

    #[test]
    fn run_takes_agents_exe_directives_but_a_parameter_wins_by_name() {
        use crate::cli::prompt_script::Directive;
        let argv: Vec<String> = ["-p", "a", "--sep4=-", "--alias", "summarize", "-f", "x.txt"]
            .map(String::from)
            .to_vec();
        let (script, values) = parse_run(&argv, &params(), |_| None).unwrap();
        assert_eq!(script.alias.as_deref(), Some("summarize"));
        assert_eq!(
            script.directives,
            [
                Directive::Text("a".into()),
                Directive::Separator {
                    times: 4,
                    text: "-".into()
                },
                Directive::File("x.txt".into())
            ]
        );
        assert!(values.is_empty());
        // An agent whose parameter is called `shell`: its value is a value.
        let with_shell = open_params(vec![status("shell", Scope::Session, false, false)]);
        let argv: Vec<String> = ["--prompt", "hi", "--shell", "rm -rf /"]
            .map(String::from)
            .to_vec();
        let (script, values) = parse_run(&argv, &with_shell, |_| None).unwrap();
        assert_eq!(script.directives, [Directive::Text("hi".into())]);
        assert_eq!(values, [("shell".to_string(), "rm -rf /".to_string())]);
        let e = parse_run(&["--thinking".into(), "x".into()], &params(), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown argument --thinking"), "{e}");
    }
}
