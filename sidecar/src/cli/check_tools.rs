//! `check --tools=list|agents-exe|openai`: each agent's tools as the model
//! receives them, in agents-exe's three renderings (a Markdown list, its own
//! JSON, the OpenAI `tools` array), so output can be compared between the two.

use clap::ValueEnum;
use serde_json::{json, Value};

use bindery_llm::ToolDefinition;
use bindery_tree::{AgentTree, LoadedAgent};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolsMode {
    /// No tools (agents-exe's default).
    None,
    /// Names and descriptions, as a Markdown list.
    List,
    /// agents-exe's own representation: name, description, paramProperties.
    #[value(name = "agents-exe")]
    AgentsExe,
    /// The `tools` array of a chat completion request.
    Openai,
}

/// Every tool the model of `agent` is offered, with the schemas it sees
/// (bound arguments hidden), helpers' tools included.
pub fn definitions(agent: &LoadedAgent, tree: &AgentTree) -> Vec<ToolDefinition> {
    let values = agent.process_values();
    agent
        .tools
        .iter()
        .map(|t| ToolDefinition {
            name: t.name().to_string(),
            description: t.spec().description.clone(),
            parameters: t.model_schema(&values),
        })
        .chain(bindery_session::subagents::definitions(agent, tree))
        .collect()
}

/// The tools section of one agent in `mode`, as agents-exe prints it.
pub fn render(mode: ToolsMode, tools: &[ToolDefinition]) -> String {
    let mut out = String::from("\n");
    match mode {
        ToolsMode::None => return String::new(),
        ToolsMode::List => {
            out.push_str("**Tools:**\n");
            for t in tools {
                out.push_str(&format!("- **{}**: {}\n", t.name, t.description));
            }
        }
        ToolsMode::AgentsExe => {
            out.push_str(&details_open("agents-exe tool representation"));
            for t in tools {
                out.push_str(&pretty(&agents_exe_view(t)));
                out.push('\n');
            }
            out.push_str("```\n</details>\n");
        }
        ToolsMode::Openai => {
            out.push_str(&details_open("OpenAI LLM tool representation"));
            let all: Vec<Value> = tools.iter().map(openai_view).collect();
            out.push_str(&pretty(&Value::Array(all)));
            out.push_str("\n```\n</details>\n");
        }
    }
    out.push('\n');
    out
}

fn details_open(summary: &str) -> String {
    format!("<details>\n<summary>{summary}</summary>\n\n```json\n")
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// `{"type": "function", "function": {name, description, parameters}}`.
pub fn openai_view(t: &ToolDefinition) -> Value {
    json!({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}})
}

/// agents-exe's `ParamProperty` list: one entry per top-level argument.
fn agents_exe_view(t: &ToolDefinition) -> Value {
    let required: Vec<&str> = t.parameters["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props: Vec<Value> = t.parameters["properties"]
        .as_object()
        .map(|p| {
            p.iter()
                .map(|(k, schema)| {
                    json!({
                        "propertyKey": k,
                        "propertyType": schema.get("type").cloned().unwrap_or(json!("object")),
                        "propertyDescription": schema.get("description").cloned().unwrap_or(json!("")),
                        "propertyRequired": required.contains(&k.as_str()),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"name": t.name, "description": t.description, "paramProperties": props})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> ToolDefinition {
        ToolDefinition {
            name: "bash_probe".into(),
            description: "Reports.".into(),
            parameters: json!({"type": "object", "properties": {
                "repo": {"type": "string", "description": "a repository"},
                "note": {"type": "string"}}, "required": ["repo"]}),
        }
    }

    #[test]
    fn list_is_a_markdown_list() {
        assert_eq!(
            render(ToolsMode::List, &[tool()]),
            "\n**Tools:**\n- **bash_probe**: Reports.\n\n"
        );
    }

    #[test]
    fn agents_exe_lists_param_properties() {
        let v = agents_exe_view(&tool());
        assert_eq!(
            v["paramProperties"],
            json!([
                {"propertyKey": "note", "propertyType": "string", "propertyDescription": "", "propertyRequired": false},
                {"propertyKey": "repo", "propertyType": "string", "propertyDescription": "a repository", "propertyRequired": true},
            ])
        );
    }

    #[test]
    fn openai_is_the_request_tools_array_in_details() {
        let out = render(ToolsMode::Openai, &[tool()]);
        assert!(out.starts_with(
            "\n<details>\n<summary>OpenAI LLM tool representation</summary>\n\n```json\n["
        ));
        let json_part = out
            .split("```json\n")
            .nth(1)
            .unwrap()
            .split("\n```")
            .next()
            .unwrap();
        let v: Value = serde_json::from_str(json_part).unwrap();
        assert_eq!(v[0]["function"]["name"], "bash_probe");
        assert_eq!(v[0]["type"], "function");
    }
}
