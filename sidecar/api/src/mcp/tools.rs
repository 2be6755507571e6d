//! The `ask_<slug>` tools: one per agent the server runs (every agent
//! `GET /v1/agents` lists, helpers included, since a session may be
//! started on any of them).

use serde_json::{json, Value};

use bindery_spec::Scope;
use bindery_tree::{AgentTree, LoadedAgent};

const PREFIX: &str = "ask_";

pub fn tool_name(agent: &str) -> String {
    format!("{PREFIX}{agent}")
}

/// The agent a tool name asks.
pub fn agent_of<'a>(tree: &'a AgentTree, tool: &str) -> Option<&'a LoadedAgent> {
    tree.agent(tool.strip_prefix(PREFIX)?).map(|a| &**a)
}

/// `tools/list`'s `tools`.
pub fn list(tree: &AgentTree) -> Vec<Value> {
    tree.agents.values().map(|a| tool(a)).collect()
}

fn tool(agent: &LoadedAgent) -> Value {
    json!({
        "name": tool_name(&agent.name),
        "title": format!("Ask {}", agent.name),
        "description": description(agent),
        "inputSchema": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "What to ask the agent."},
            },
            "required": ["prompt"],
            "additionalProperties": false,
        },
    })
}

/// What the agent is for, and the parameters a client may give it (never
/// a value).
fn description(agent: &LoadedAgent) -> String {
    let mut text = match agent.spec.announce.as_deref().map(str::trim_end) {
        Some(a) if a.ends_with(['.', '!', '?']) => a.to_string(),
        Some(a) if !a.is_empty() => format!("{a}."),
        _ => format!("Ask the agent `{}`.", agent.name),
    };
    let open: Vec<String> = agent
        .params
        .statuses()
        .into_iter()
        .filter(|p| p.scope != Scope::Process && !p.pinned)
        .map(|p| {
            let mut flags = Vec::new();
            if p.secret {
                flags.push("secret");
            }
            if p.required && !p.bound {
                flags.push("required");
            }
            if flags.is_empty() {
                p.name
            } else {
                format!("{} ({})", p.name, flags.join(", "))
            }
        })
        .collect();
    text.push_str(" Each call is one run in a new session.");
    if !open.is_empty() {
        text.push_str(&format!(
            " Parameters (`Agents-Param-<name>` headers or `_meta` \"agents-exe/params\"): {}.",
            open.join(", ")
        ));
    }
    text
}
