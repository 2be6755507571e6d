//! `replay-tool-call`: run one tool call of a saved session again, either
//! through the agent's bindings as a live call goes (`--agent-file`), or
//! raw against a bash script, as agents-exe's command of that name does
//! (`--raw-tool`, alias `--tool`). The session
//! file is what `GET /v1/sessions/:id` answers, its calls numbered from 0
//! across the whole session, in order; or agents-exe's session file, its
//! calls numbered as agents-exe numbers them (`agents_exe_session::calls`).

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use super::agents_exe_session::SessionFileError;
use super::args::AgentArgs;
use super::call::CallError;
use super::load::{load, LoadError};
use bindery_tools::bash::{load_script, Limits, ScriptError};
use bindery_tools::{CallArgs, CallContext, Tool, ToolError};

/// Why a recorded call was not replayed: the session file, the call it
/// names, the agent or the script, or the tool's own failure.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReplayError {
    #[error(transparent)]
    SessionFile(#[from] SessionFileError),
    /// `available`: the calls' numbers (`0 to N`), or `none`.
    #[error("session file {file} has no tool call {index} (available: {available})")]
    NoToolCall {
        file: String,
        index: usize,
        available: String,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Pick(#[from] bindery_tree::PickError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("tool call {index} ({name}) has arguments that are not a JSON object")]
    NotAnObject { index: usize, name: String },
    #[error("tool call {index} ({name}) cannot be bound: {source}")]
    Unbound {
        index: usize,
        name: String,
        source: bindery_bindings::MergeError,
    },
    #[error(transparent)]
    Script(#[from] ScriptError),
    #[error("tool execution failed: {0}")]
    Failed(#[source] ToolError),
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedCall {
    pub index: usize,
    /// The turn it appears in, from 1.
    pub turn: usize,
    pub name: String,
    pub arguments: Value,
}

/// Every tool call in a session document, in order. Arguments given as a
/// JSON string (OpenAI's form) are parsed; an unparsable string is kept.
pub fn recorded_calls(doc: &Value) -> Vec<RecordedCall> {
    let turns = doc
        .pointer("/session/turns")
        .or_else(|| doc.get("turns"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut calls = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        let mut found = Vec::new();
        collect_calls(turn, &mut found);
        for (name, arguments) in found {
            calls.push(RecordedCall {
                index: calls.len(),
                turn: i + 1,
                name,
                arguments,
            });
        }
    }
    calls
}

/// Objects shaped `{"function": {"name", "arguments"}}`, depth first.
fn collect_calls(v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(o) => {
            if let Some(f) = o.get("function") {
                if let (Some(name), Some(args)) = (f["name"].as_str(), f.get("arguments")) {
                    let args = match args {
                        Value::String(s) => serde_json::from_str(s).unwrap_or(args.clone()),
                        other => other.clone(),
                    };
                    out.push((name.to_string(), args));
                    return;
                }
            }
            o.values().for_each(|x| collect_calls(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_calls(x, out)),
        _ => {}
    }
}

/// A session file: one JSON document, or JSON lines whose last is the
/// session (at most 64 MiB read).
pub fn read_session(path: &Path) -> Result<Value, SessionFileError> {
    super::agents_exe_session::read_file(path)
}

/// Call `index` of `session`, or a message naming the calls there are.
/// In agents-exe's session file, agents-exe's numbering: the first call
/// whose place in its turn is `index` (see `list-tool-calls`).
fn recorded_call(doc: &Value, session: &Path, index: usize) -> Result<RecordedCall, ReplayError> {
    use super::agents_exe_session::{calls, shape, Shape};
    if shape(doc) == Shape::AgentsExe {
        let what = format!("session file {}", session.display());
        let (_, found) = calls::of_doc(doc, &what)?;
        let call = calls::pick(&found, index, &what)?;
        return Ok(RecordedCall {
            index,
            turn: call.turn,
            name: call.name.clone(),
            arguments: match &call.arguments {
                // OpenAI's form: the arguments' JSON in a string.
                Value::String(s) => serde_json::from_str(s).unwrap_or(call.arguments.clone()),
                other => other.clone(),
            },
        });
    }
    let calls = recorded_calls(doc);
    calls.get(index).cloned().ok_or_else(|| {
        let available = if calls.is_empty() {
            "none".to_string()
        } else {
            format!("0 to {}", calls.len() - 1)
        };
        ReplayError::NoToolCall {
            file: session.display().to_string(),
            index,
            available,
        }
    })
}

/// The session's id: Bindery's `session_id`, agents-exe's `sessionId`.
fn session_id(doc: &Value) -> Option<&str> {
    doc["session_id"].as_str().or(doc["sessionId"].as_str())
}

/// Replay through the bindings: the recorded arguments are the model's,
/// the agent's bound values (from the process values and the environment)
/// are merged over them, exactly as `tool-call` calls a tool.
pub async fn through_bindings(
    agents: &AgentArgs,
    session: &Path,
    index: usize,
    validate_only: bool,
    yes: bool,
) -> Result<ExitCode, ReplayError> {
    let doc = read_session(session)?;
    let call = recorded_call(&doc, session, index)?;
    let tree = load(agents).await?;
    let agent = tree.pick(agents.agent.as_deref())?;
    if validate_only {
        let bound = super::call::find_tool(agent, &call.name)?;
        let Value::Object(map) = call.arguments.clone() else {
            return Err(ReplayError::NotAnObject {
                index,
                name: call.name,
            });
        };
        let merged = bound
            .merge(map, &agent.process_values())
            .map_err(|source| ReplayError::Unbound {
                index,
                name: call.name.clone(),
                source,
            })?;
        let missing: Vec<&str> = bound
            .spec()
            .args
            .iter()
            .filter(|a| a.required && !merged.args.contains_key(&a.name))
            .map(|a| a.name.as_str())
            .collect();
        if !missing.is_empty() {
            println!(
                "✗ Tool call {index} ({}) misses required argument{} {} (neither recorded nor bound)",
                super::terminal_text::for_terminal(&call.name),
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            );
            return Ok(ExitCode::FAILURE);
        }
        println!("✓ Tool call validation passed");
        println!("Tool: {}", super::terminal_text::for_terminal(&call.name));
        println!("Arguments: {}", call.arguments);
        return Ok(ExitCode::SUCCESS);
    }
    let session_id = session_id(&doc);
    // The recorded arguments are not the person's: a call that needs
    // approval is asked (refused off a terminal) unless --yes says so.
    let asking = super::call::Asking {
        yes,
        choose: None,
        replayed: true,
    };
    Ok(
        super::call::through_bindings(agent, &call.name, call.arguments, session_id, asking)
            .await?,
    )
}

pub async fn replay(
    session: &Path,
    index: usize,
    tool: &Path,
    validate_only: bool,
    raw: bool,
) -> Result<ExitCode, ReplayError> {
    let doc = read_session(session)?;
    let call = recorded_call(&doc, session, index)?;
    let script = load_script(tool, Limits::default()).await?;
    let Value::Object(map) = &call.arguments else {
        return Err(ReplayError::NotAnObject {
            index,
            name: call.name,
        });
    };
    let missing: Vec<&str> = script
        .spec()
        .args
        .iter()
        .filter(|a| a.required && !map.contains_key(&a.name))
        .map(|a| a.name.as_str())
        .collect();
    if !missing.is_empty() {
        println!(
            "✗ Tool call {index} ({}) does not fit {} ({}): missing required argument{} {}",
            super::terminal_text::for_terminal(&call.name),
            tool.display(),
            script.spec().local_name,
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        );
        println!("  A bound argument is not in the session: replay the call through its bindings with `replay-tool-call --agent-file … --session {} --tool-call {index}` (values by --set, --pin, --params-file or the environment).", session.display());
        return Ok(ExitCode::FAILURE);
    }
    if !raw {
        println!("✓ Tool call validation passed");
        println!("Tool: {}", script.spec().local_name);
        println!("Arguments: {}", call.arguments);
    }
    if validate_only {
        return Ok(ExitCode::SUCCESS);
    }
    let args: CallArgs = map
        .iter()
        .map(|(k, v)| (k.clone(), bindery_params::ParamValue::Plain(v.clone())))
        .collect();
    let id = format!("replay-{}", std::process::id());
    let agent = doc["agent"].as_str().unwrap_or_default();
    let ctx = CallContext::one_off(session_id(&doc).unwrap_or(&id), &id, agent);
    if !raw {
        println!("\nExecuting tool...\n");
    }
    match script.call(args, &ctx).await {
        Ok(out) if raw => {
            println!("{}", out.shown());
            Ok(ExitCode::SUCCESS)
        }
        Ok(out) => {
            println!("=== Tool Output ===");
            println!("{}", out.shown().trim_end_matches('\n'));
            println!("===================");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(ReplayError::Failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_numbered_across_the_session() {
        let doc = json!({"session": {"turns": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash_x", "arguments": "{\"q\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "bash_y", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
            {"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "bash_x", "arguments": {"q": 2}}}]},
        ]}});
        let calls = recorded_calls(&doc);
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.index, c.turn, c.name.as_str(), c.arguments.clone()))
                .collect::<Vec<_>>(),
            vec![
                (0, 2, "bash_x", json!({"q": 1})),
                (1, 2, "bash_y", json!({})),
                (2, 4, "bash_x", json!({"q": 2})),
            ]
        );
    }
}
