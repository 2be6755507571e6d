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

use crate::params::ParamStatus;
use crate::spec::Scope;

/// The parameters `run` takes besides `prompt`.
pub fn open_params(statuses: Vec<ParamStatus>) -> Vec<ParamStatus> {
    statuses
        .into_iter()
        .filter(|s| !s.pinned && matches!(s.scope, Scope::Session | Scope::Message))
        .collect()
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
pub fn parse_describe(argv: &[String]) -> Result<(Option<String>, Option<String>), String> {
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
                return Err(format!(
                    "unexpected argument `{flag}`: `describe` takes --self-describe-slug NAME and --self-describe-description TEXT"
                ))
            }
        };
        *slot = Some(match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        });
    }
    Ok((slug, description))
}

/// `run`'s arguments: the prompt and `NAME=VALUE` for each parameter
/// given, a secret one read from its environment variable (`env` mode).
pub fn parse_run(
    argv: &[String],
    params: &[ParamStatus],
    env: impl Fn(&str) -> Option<String>,
) -> Result<(String, Vec<(String, String)>), String> {
    let mut prompt = None;
    let mut values = Vec::new();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.strip_prefix("--") {
            Some(f) => match f.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (f, None),
            },
            None => {
                return Err(format!(
                    "unexpected argument `{flag}`: `run` takes --prompt TEXT and --NAME VALUE"
                ))
            }
        };
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("--{name} needs a value"))?,
        };
        if name == "prompt" {
            prompt = Some(value);
        } else if params.iter().any(|p| p.name == name && !p.secret) {
            values.push((name.to_string(), value));
        } else {
            let known: Vec<&str> = params
                .iter()
                .filter(|p| !p.secret)
                .map(|p| p.name.as_str())
                .collect();
            return Err(format!(
                "unknown argument --{name} (this agent takes --prompt{})",
                known.iter().map(|k| format!(", --{k}")).collect::<String>()
            ));
        }
    }
    for p in params.iter().filter(|p| p.secret) {
        if let Some(v) = env(&crate::tools::bash::env_var_name(&p.name)) {
            values.push((p.name.clone(), v));
        }
    }
    let prompt = prompt.ok_or("`run` needs --prompt TEXT")?;
    Ok((prompt, values))
}

/// `as-tool … describe` or `as-tool … run --prompt TEXT [--NAME VALUE…]`.
pub async fn main(
    mut agents: super::args::AgentArgs,
    model: super::args::ModelArgs,
    protocol: Vec<String>,
) -> Result<std::process::ExitCode, String> {
    let tree = super::load::load_lenient(&agents).await?;
    let agent = tree.pick(agents.agent.as_deref())?;
    let params = open_params(agent.params.statuses());
    match protocol.split_first() {
        Some((cmd, rest)) if cmd == "describe" => {
            let (slug, description) = parse_describe(rest).map_err(|e| format!("error: {e}"))?;
            let d = describe(
                slug.as_deref().unwrap_or(&agent.name),
                description.as_deref().or(agent.spec.announce.as_deref()),
                &params,
            );
            println!("{d}");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Some((cmd, rest)) if cmd == "run" => {
            let (prompt, values) =
                parse_run(rest, &params, |k| std::env::var(k).ok()).map_err(|e| format!("error: {e}"))?;
            // Client-supplied values, as the operator's --set would give them.
            agents.agent = Some(agent.name.clone());
            agents
                .set
                .extend(values.into_iter().map(|(k, v)| format!("{k}={v}")));
            // A call that waits is refused: a tool's stdin answers nothing.
            super::serve::run(&agents, &model, prompt, false).await
        }
        _ => Err("error: as-tool takes `describe` or `run --prompt TEXT [--NAME VALUE…]` (the bash tool protocol)".into()),
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
        let (prompt, values) = parse_run(&argv, &params(), env).unwrap();
        assert_eq!(prompt, "hi");
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
            .contains("unknown argument --billing_token"));
    }
}
