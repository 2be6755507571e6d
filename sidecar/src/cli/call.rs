//! One tool call through its bindings, as the model's would go in a run:
//! `tool-call` makes it from `--args`, `replay-tool-call --agent-file` from
//! a call recorded in a session.

use std::process::ExitCode;

use tracing::Instrument;

use crate::tools::CallContext;
use crate::tree::LoadedAgent;

/// Call `tool` of `agent` with the model's `model_args`: bound values
/// (the process values: flags, files, the environment) merged in, the
/// output scrubbed of every secret, printed to stdout.
pub(super) async fn through_bindings(
    agent: &LoadedAgent,
    tool: &str,
    model_args: serde_json::Value,
    session_id: Option<&str>,
) -> Result<ExitCode, String> {
    let bound = find_tool(agent, tool)?;
    let id = format!("cli-{}", std::process::id());
    let ctx = CallContext {
        session_id: session_id.unwrap_or(&id).to_string(),
        conversation_id: id.clone(),
        turn_id: id,
        agent_id: agent.name.clone(),
        session_json: None,
        scrubber: Default::default(),
    };
    // The same span as a call in a run, so that a trace of a
    // `tool-call` looks like one step of a session.
    let span = tracing::info_span!("tool_call", tool = %tool, call_id = %ctx.turn_id);
    let values = agent.process_values();
    let scrubber = crate::bindings::scrubber_for(&values, std::slice::from_ref(&bound));
    let result = bound
        .call(model_args, &values, &ctx)
        .instrument(span)
        .await
        .map(|out| scrubber.scrub(&out.text))
        .map_err(|e| e.scrubbed(&scrubber));
    match result {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') && !text.is_empty() {
                println!();
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(format!("error: tool {tool}: {e}")),
    }
}

pub(super) fn find_tool(
    agent: &LoadedAgent,
    name: &str,
) -> Result<crate::bindings::BoundTool, String> {
    agent.tool(name).ok_or_else(|| {
        let names: Vec<String> = agent.tools.iter().map(|t| t.name().to_string()).collect();
        format!(
            "error: agent `{}` has no tool `{name}` (tools: {})",
            agent.name,
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )
    })
}
