//! agents-exe's own command line, accepted as is, so a tool script or a
//! toolbox entry written for the agents-exe binary runs with
//! `bindery-sidecar` in its place:
//!
//! ```sh
//! exec bindery-sidecar --agent-file child.json "$@"   # describe | run --prompt …
//! ```
//!
//! agents-exe puts its global options (`--agent-file`, `--agent`/`-a`,
//! `--api-keys`, the `--log-*` sinks) before the command; Bindery puts
//! every option after it. So an invocation that starts with one of those
//! options is agents-exe's, and is rewritten before parsing:
//!
//! | agents-exe | Bindery |
//! |---|---|
//! | `--agent-file F describe [--self-describe-slug S] [--self-describe-description D]` | `as-tool --agent-file F describe …` |
//! | `--agent-file F run -p P [-f FILE --shell CMD -s T -S T --alias A] [--NAME V…]` | `as-tool --agent-file F run …` |
//! | `--agent-file F check` | `check --agent-file F` |
//! | `--agent-file F list-tool-calls …` (also `replay-tool-call -t SCRIPT`, `session-print`, `session-edit`, `session-index`, `session-search`) | `list-tool-calls …` (these read session files: the agent options are not theirs) |
//! | `--agent-file F replay-tool-call …` (no script) | `replay-tool-call --agent-file F …` (through the agent's bindings) |
//! | `--agent-file F mcp-server` | `mcp-server --agent-file F` |
//! | `--agent-file F tool-call NAME [-l LOG]` | `tool-call --agent-file F NAME` |
//! | `--agent-file F echo-prompt …`, `check-tool-call …`, `describe-tool …` | the same, the agent options dropped (none is needed) |
//!
//! agents-exe's `run` is both its prompt run and the `run` of the bash
//! tool protocol its `describe` offers (`--prompt` is one of its
//! directives), so it goes to `as-tool run`, which takes the directives
//! and, for a Bindery agent, its parameters as `--NAME VALUE`.
//!
//! `bindery-sidecar describe --agent-file F` (options after the command)
//! stays Bindery's `describe`, the tools' schemas. `describe-tool PATH`,
//! `check-tool-call`, `echo-prompt` and `mcp-server` are ordinary commands
//! of both.

use std::ffi::OsString;

/// agents-exe's global options that take a value.
const GLOBAL: [&str; 8] = [
    "--agent-file",
    "--agent",
    "-a",
    "--api-keys",
    "--log-file",
    "--log-http",
    "--log-json-file",
    "--session-json-file-prefix",
];

/// Why an agents-exe invocation cannot be read: it names what to give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgvError {
    #[error("{flag} needs a value")]
    NoValue { flag: String },
    #[error("`{command}` is an agents-exe command bindery-sidecar does not offer; it takes agents-exe's `describe`, `run`, `echo-prompt`, `check`, `check-tool-call`, `describe-tool PATH`, `tool-call NAME`, `mcp-server`, `list-tool-calls`, `replay-tool-call`, `session-print`, `session-edit`, `session-index` and `session-search` (for a chat, serve the agent: `bindery-sidecar serve --agent-file F`)")]
    NotOffered { command: String },
    #[error("give a command after the agent options: `describe`, `run -p TEXT`, `check`, `tool-call NAME` or `mcp-server`")]
    NoCommand,
}

/// `argv` in Bindery's words when it is an agents-exe invocation (see the
/// module's table); otherwise `argv` unchanged. An agents-exe command
/// Bindery does not offer is an error naming what to use.
pub fn rewrite(argv: Vec<OsString>) -> Result<Vec<OsString>, ArgvError> {
    let Some((prog, rest)) = argv.split_first() else {
        return Ok(argv);
    };
    let text: Vec<String> = rest
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut agent = Vec::<OsString>::new();
    let mut i = 0;
    while let Some(arg) = text.get(i) {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if !GLOBAL.contains(&name) {
            break;
        }
        let value = match inline {
            Some(v) => v,
            None => text.get(i + 1).cloned().ok_or_else(|| ArgvError::NoValue {
                flag: name.to_string(),
            })?,
        };
        i += if arg.contains('=') { 1 } else { 2 };
        match name {
            "--agent-file" | "--api-keys" => agent.extend([name.into(), value.into()]),
            "--agent" | "-a" => agent.extend(["--agent".into(), value.into()]),
            // Bindery logs to stderr (and OTLP); these sinks are agents-exe's.
            _ => {}
        }
    }
    if i == 0 {
        return Ok(argv);
    }
    let command = text.get(i).map(String::as_str);
    let after = rest[(i + 1).min(rest.len())..].iter().cloned();
    let mut out = vec![prog.clone()];
    match command {
        Some("describe") | Some("run") => {
            out.push("as-tool".into());
            out.extend(agent);
            out.push(command.unwrap_or_default().into());
            out.extend(after);
        }
        Some(cmd @ ("check" | "mcp-server")) => {
            out.push(cmd.into());
            out.extend(agent);
            out.extend(after);
        }
        // Without a script, Bindery's replay goes through the agent's
        // bindings: the agent options are then its.
        Some("replay-tool-call")
            if !text[i + 1..].iter().any(|a| {
                ["-t", "--tool", "--raw-tool"].contains(&a.split('=').next().unwrap_or(""))
            }) =>
        {
            out.push("replay-tool-call".into());
            out.extend(agent);
            out.extend(after);
        }
        Some("tool-call") => {
            out.push("tool-call".into());
            out.extend(agent);
            // agents-exe's own trace file: Bindery logs to stderr.
            let mut rest = after;
            while let Some(a) = rest.next() {
                match a.to_str() {
                    Some("-l" | "--log-file") => {
                        rest.next();
                    }
                    Some(s) if s.starts_with("--log-file=") => {}
                    _ => out.push(a),
                }
            }
        }
        Some(
            c @ ("describe-tool" | "check-tool-call" | "echo-prompt" | "list-tool-calls"
            | "replay-tool-call" | "session-print" | "session-edit" | "session-index"
            | "session-search"),
        ) => {
            out.push(c.into());
            out.extend(after);
        }
        Some(other) => {
            return Err(ArgvError::NotOffered {
                command: other.to_string(),
            })
        }
        None => return Err(ArgvError::NoCommand),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(args: &[&str]) -> Result<Vec<String>, ArgvError> {
        let argv = std::iter::once("bindery-sidecar")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        rewrite(argv).map(|v| {
            v.into_iter()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn agents_exe_invocations_become_as_tool_and_bindery_ones_stay() {
        assert_eq!(
            rw(&["--agent-file", "c.json", "--log-file", "x", "describe"]).unwrap(),
            ["as-tool", "--agent-file", "c.json", "describe"]
        );
        assert_eq!(
            rw(&[
                "--api-keys=k.json",
                "-a",
                "child",
                "--agent-file",
                "c.json",
                "run",
                "--prompt",
                "hi"
            ])
            .unwrap(),
            [
                "as-tool",
                "--api-keys",
                "k.json",
                "--agent",
                "child",
                "--agent-file",
                "c.json",
                "run",
                "--prompt",
                "hi"
            ]
        );
        assert_eq!(
            rw(&["--agent-file", "c.json", "check"]).unwrap(),
            ["check", "--agent-file", "c.json"]
        );
        assert_eq!(
            rw(&["--agent-file", "c.json", "mcp-server"]).unwrap(),
            ["mcp-server", "--agent-file", "c.json"]
        );
        assert_eq!(
            rw(&[
                "--agent-file",
                "c.json",
                "tool-call",
                "bash_x",
                "-l",
                "log",
                "--log-file=l2"
            ])
            .unwrap(),
            ["tool-call", "--agent-file", "c.json", "bash_x"]
        );
        assert_eq!(
            rw(&["--agent-file", "c.json", "echo-prompt", "-p", "hi"]).unwrap(),
            ["echo-prompt", "-p", "hi"]
        );
        assert_eq!(
            rw(&["--api-keys", "k", "check-tool-call", "-t", "x.sh"]).unwrap(),
            ["check-tool-call", "-t", "x.sh"]
        );
        assert_eq!(
            rw(&["--agent-file", "c.json", "run", "-p", "a", "-f", "b.txt"]).unwrap(),
            [
                "as-tool",
                "--agent-file",
                "c.json",
                "run",
                "-p",
                "a",
                "-f",
                "b.txt"
            ]
        );
        let bindery = ["describe", "--agent-file", "c.json", "--tool", "io_x"];
        assert_eq!(rw(&bindery).unwrap(), bindery);
        // Commands over session files: the agent options are not theirs.
        assert_eq!(
            rw(&[
                "--agent-file",
                "c.json",
                "-a",
                "x",
                "list-tool-calls",
                "s.json",
                "-f",
                "json"
            ])
            .unwrap(),
            ["list-tool-calls", "s.json", "-f", "json"]
        );
        assert_eq!(
            rw(&[
                "--agent-file=c.json",
                "replay-tool-call",
                "-s",
                "s.json",
                "-i",
                "0",
                "-t",
                "t"
            ])
            .unwrap(),
            ["replay-tool-call", "-s", "s.json", "-i", "0", "-t", "t"]
        );
        assert_eq!(
            rw(&[
                "--agent-file",
                "c.json",
                "replay-tool-call",
                "-s",
                "s.json",
                "-i",
                "0"
            ])
            .unwrap(),
            [
                "replay-tool-call",
                "--agent-file",
                "c.json",
                "-s",
                "s.json",
                "-i",
                "0"
            ]
        );
        assert_eq!(
            rw(&["--agent-file", "c.json", "tui"]).unwrap_err(),
            ArgvError::NotOffered {
                command: "tui".into()
            }
        );
    }
}
