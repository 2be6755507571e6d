//! The agents' own tools on `/mcp` (`spec.mcp.exposeTools`): each as the
//! agent's model sees it, bound arguments removed from its schema, so an
//! MCP client can neither see nor override what the tenant pinned.
//!
//! Names are the model-visible ones (`bash_query-invoices`), prefixed by
//! the agent (`invoices__bash_query-invoices`) when the server serves more
//! than one agent. A deferred tool (the client runs it and posts its
//! result) has nothing to run on the server and is not listed.

use serde_json::{json, Value};

use bindery_bindings::BoundTool;
use bindery_tools::Disposition;
use bindery_tree::{AgentTree, LoadedAgent};

/// Between the agent and the tool in a prefixed name.
const SEPARATOR: &str = "__";

/// An exposed tool a name found: its agent and the tool as bound.
pub struct Exposed<'a> {
    pub agent: &'a LoadedAgent,
    pub tool: BoundTool,
}

/// Whether names carry their agent (more than one agent is served).
fn prefixed(tree: &AgentTree) -> bool {
    tree.agents.len() > 1
}

/// The name an MCP client calls `tool` of `agent` by.
pub fn mcp_name(tree: &AgentTree, agent: &str, tool: &str) -> String {
    if prefixed(tree) {
        format!("{agent}{SEPARATOR}{tool}")
    } else {
        tool.to_string()
    }
}

/// The tools an agent exposes, as of now (an MCP toolbox's list may change).
fn tools_of(agent: &LoadedAgent) -> Vec<BoundTool> {
    if !agent.spec.mcp.expose_tools {
        return Vec::new();
    }
    agent
        .tools
        .snapshot()
        .iter()
        .filter(|t| agent.disposition(t.name(), Some(t)) != Some(Disposition::Deferred))
        .cloned()
        .collect()
}

/// The exposed tool `name` names, if any.
pub fn find<'a>(tree: &'a AgentTree, name: &str) -> Option<Exposed<'a>> {
    let (agent, tool) = if prefixed(tree) {
        let (agent, tool) = name.split_once(SEPARATOR)?;
        (tree.agent(agent)?, tool)
    } else {
        (tree.agents.values().next()?, name)
    };
    let tool = tools_of(agent).into_iter().find(|t| t.name() == tool)?;
    Some(Exposed { agent, tool })
}

/// Every exposed tool, as `tools/list` shows it.
pub fn list(tree: &AgentTree) -> Vec<Value> {
    tree.agents
        .values()
        .flat_map(|agent| {
            tools_of(agent)
                .into_iter()
                .map(move |t| listed(tree, agent, &t))
        })
        .collect()
}

fn listed(tree: &AgentTree, agent: &LoadedAgent, tool: &BoundTool) -> Value {
    let writes = tool.writes();
    let waits = agent.disposition(tool.name(), Some(tool)).is_some();
    let values = agent.process_values();
    json!({
        "name": mcp_name(tree, &agent.name, tool.name()),
        "title": tool.name(),
        "description": description(agent, tool, waits, tool.hidden_args(&values).len()),
        // What the model sees: bound arguments, and those the tool's
        // lookups fill, are not there.
        "inputSchema": tool.model_schema(&values),
        "annotations": {
            "readOnlyHint": !writes,
            "destructiveHint": writes,
            "openWorldHint": true,
        },
    })
}

/// The tool's own description, then what a call may change and whether it
/// waits for a person; never a bound value (only that arguments are bound).
fn description(agent: &LoadedAgent, tool: &BoundTool, waits: bool, bound: usize) -> String {
    let mut text = tool.spec().description.trim_end().to_string();
    if !text.is_empty() && !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    let mut add = |s: &str| {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(s);
    };
    add(&format!("A tool of agent `{}`.", agent.name));
    add(if tool.writes() {
        "It may change data."
    } else {
        "It only reads."
    });
    if waits || !tool.depends().is_empty() {
        add("A call may wait for a person (an approval or a choice) before it runs.");
    }
    if bound > 0 {
        add(&format!(
            "{bound} of its arguments are set by the server and not shown."
        ));
    }
    text
}
