//! On-demand tools (agents-exe's progressive disclosure): a toolbox with a
//! `toolgroup` keeps its tools from the model until the model activates the
//! group. Three tools of the run's own manage it, offered only while
//! some tool is in a group, with agents-exe's names and answers so its
//! prompts and recorded sessions keep working:
//!
//! - `meta_activate_tool {toolgroup}`, while some group is inactive;
//! - `meta_deactivate_tool {toolgroup}`, while some group is active;
//! - `meta_discover_tools`, which lists the groups.
//!
//! Which groups are active is read from the conversation itself, each step:
//! the model's calls of the first two, in order, the latest call for a
//! group winning. Nothing else holds the state, so a resumed, forked or
//! replayed session sees what its own history says. (agents-exe lets the
//! oldest call win across turns; the latest is what the model last asked.)
//!
//! Pure: the tool list and the answers; the run (`run/`) offers and dispatches.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use bindery_bindings::BoundTool;
use bindery_llm::{ChatMessage, ToolDefinition, Turn};

pub const ACTIVATE: &str = "meta_activate_tool";
pub const DEACTIVATE: &str = "meta_deactivate_tool";
pub const DISCOVER: &str = "meta_discover_tools";

/// `name` is one of the meta tools' names (offered only while some tool
/// is in a group: see [`Groups::is_meta`]).
pub fn is_meta_name(name: &str) -> bool {
    [ACTIVATE, DEACTIVATE, DISCOVER].contains(&name)
}

/// The groups of an agent's tools.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Groups(BTreeSet<String>);

impl Groups {
    pub fn of(tools: &[BoundTool]) -> Groups {
        Groups(
            tools
                .iter()
                .filter_map(BoundTool::toolgroup)
                .map(str::to_string)
                .collect(),
        )
    }

    /// No tool is on demand: no meta tool, every tool shown.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `name` is one of the meta tools, while there are groups.
    pub fn is_meta(&self, name: &str) -> bool {
        is_meta_name(name) && !self.is_empty()
    }

    /// The groups the conversation has activated and not deactivated since.
    pub fn active(&self, history: &[Turn]) -> BTreeSet<String> {
        let mut active = BTreeSet::new();
        for turn in history {
            let ChatMessage::Assistant { tool_calls, .. } = turn.message() else {
                continue;
            };
            for call in tool_calls {
                let on = match call.name.as_str() {
                    ACTIVATE => true,
                    DEACTIVATE => false,
                    _ => continue,
                };
                let Some(group) = self.named(&call.arguments) else {
                    continue;
                };
                if on {
                    active.insert(group);
                } else {
                    active.remove(&group);
                }
            }
        }
        active
    }

    /// The known group a call's arguments name (`{"toolgroup": g}`, or the
    /// bare name, as agents-exe also reads it).
    fn named(&self, arguments: &str) -> Option<String> {
        let group = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(o)) => o.get("toolgroup")?.as_str()?.to_string(),
            Ok(Value::String(s)) => s,
            _ => arguments.trim().to_string(),
        };
        self.0.contains(&group).then_some(group)
    }

    /// `tool` is shown (and may be called) with `active` groups.
    pub fn shows(tool: &BoundTool, active: &BTreeSet<String>) -> bool {
        tool.toolgroup().is_none_or(|g| active.contains(g))
    }

    /// The meta tools to offer with `active` groups, first in the list.
    pub fn definitions(&self, active: &BTreeSet<String>) -> Vec<ToolDefinition> {
        if self.is_empty() {
            return Vec::new();
        }
        let inactive: Vec<&str> = self
            .0
            .iter()
            .filter(|g| !active.contains(*g))
            .map(String::as_str)
            .collect();
        let on: Vec<&str> = active.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        let switch = |name: &str, verb: &str, purpose: &str, groups: &[&str]| {
            let list = groups.join(", ");
            ToolDefinition {
                name: name.to_string(),
                description: format!(
                    "{verb} a toolgroup to {purpose}. Available toolgroups: {list}"
                ),
                parameters: json!({
                    "type": "object",
                    "properties": {"toolgroup": {
                        "type": "string",
                        "description": format!("Name of the toolgroup to {}. Available: {list}", verb.to_lowercase()),
                    }},
                    "required": ["toolgroup"],
                    "additionalProperties": false,
                }),
            }
        };
        if !inactive.is_empty() {
            out.push(switch(ACTIVATE, "Activate", "access its tools", &inactive));
        }
        if !on.is_empty() {
            out.push(switch(DEACTIVATE, "Deactivate", "hide its tools", &on));
        }
        let all: Vec<&str> = self.0.iter().map(String::as_str).collect();
        out.push(ToolDefinition {
            name: DISCOVER.to_string(),
            description: format!(
                "List all available toolgroups. Toolgroups: {}",
                all.join(", ")
            ),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        });
        out
    }

    /// The answer to a meta tool's call (agents-exe's texts: an unknown
    /// group is the model's to fix, so it is said, not an error).
    pub fn answer(&self, name: &str, arguments: &str) -> String {
        let list = self.0.iter().cloned().collect::<Vec<_>>().join(", ");
        let verb = match name {
            ACTIVATE => "activated",
            DEACTIVATE => "deactivated",
            _ => return json!({"toolgroups": self.0}).to_string(),
        };
        if let Some(group) = self.named(arguments) {
            return format!("Toolgroup '{group}' {verb}");
        }
        let given = serde_json::from_str::<Value>(arguments).ok().and_then(|v| {
            v.get("toolgroup")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        match given {
            Some(g) => format!("Error: Unknown toolgroup '{g}'. Available: {list}"),
            None => format!("Error: Missing 'toolgroup' parameter. Available: {list}"),
        }
    }

    /// Why `tool` cannot be called now, if it cannot: its group is not active.
    pub fn hidden(tool: &BoundTool, active: &BTreeSet<String>) -> Option<String> {
        let group = tool.toolgroup().filter(|g| !active.contains(*g))?;
        Some(format!(
            "tool `{}` is in toolgroup '{group}', which is not active: call {ACTIVATE} with {{\"toolgroup\": \"{group}\"}} first",
            tool.name()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use bindery_llm::ToolCall;
    use bindery_tools::deferred::DeferredTool;

    fn tool(name: &str, group: Option<&str>) -> BoundTool {
        let decl = bindery_spec::DeferredTool {
            name: name.to_string(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        };
        BoundTool::new(Arc::new(DeferredTool::new(&decl).unwrap())).in_group(group)
    }

    fn calls(list: &[(&str, &str)]) -> Turn {
        Turn::new(ChatMessage::Assistant {
            content: None,
            tool_calls: list
                .iter()
                .enumerate()
                .map(|(i, (name, args))| ToolCall {
                    id: format!("c{i}"),
                    name: name.to_string(),
                    arguments: args.to_string(),
                })
                .collect(),
            reasoning: None,
        })
    }

    #[test]
    fn the_conversation_says_which_groups_are_active() {
        let tools = [
            tool("always", None),
            tool("web_get", Some("web")),
            tool("db_query", Some("db")),
        ];
        let groups = Groups::of(&tools);
        assert!(Groups::of(&tools[..1]).is_empty());
        assert!(groups.active(&[]).is_empty());
        let history = [
            calls(&[(ACTIVATE, r#"{"toolgroup": "web"}"#), (ACTIVATE, "db")]),
            Turn::new(ChatMessage::user("go on")),
            calls(&[
                (DEACTIVATE, r#"{"toolgroup": "web"}"#),
                (ACTIVATE, r#"{"toolgroup": "nope"}"#),
            ]),
        ];
        let active = groups.active(&history);
        assert_eq!(active, BTreeSet::from(["db".to_string()]));
        let shown: Vec<&str> = tools
            .iter()
            .filter(|t| Groups::shows(t, &active))
            .map(|t| t.name())
            .collect();
        assert_eq!(shown, ["always", "db_query"]);
        assert!(Groups::hidden(&tools[1], &active)
            .unwrap()
            .contains("toolgroup 'web', which is not active"));
        assert!(Groups::hidden(&tools[2], &active).is_none());
    }

    #[test]
    fn meta_tools_follow_the_state_and_answer_as_agents_exe() {
        let tools = [tool("web_get", Some("web")), tool("db_query", Some("db"))];
        let groups = Groups::of(&tools);
        let names = |active: &BTreeSet<String>| -> Vec<String> {
            groups
                .definitions(active)
                .into_iter()
                .map(|d| d.name)
                .collect()
        };
        assert_eq!(names(&BTreeSet::new()), [ACTIVATE, DISCOVER]);
        let both = BTreeSet::from(["db".to_string(), "web".to_string()]);
        assert_eq!(names(&both), [DEACTIVATE, DISCOVER]);
        let one = BTreeSet::from(["db".to_string()]);
        let defs = groups.definitions(&one);
        assert_eq!(names(&one), [ACTIVATE, DEACTIVATE, DISCOVER]);
        assert!(defs[0].description.ends_with("Available toolgroups: web"));
        assert!(defs[1].description.ends_with("Available toolgroups: db"));
        assert_eq!(
            groups.answer(ACTIVATE, r#"{"toolgroup":"web"}"#),
            "Toolgroup 'web' activated"
        );
        assert_eq!(
            groups.answer(DEACTIVATE, r#"{"toolgroup":"x"}"#),
            "Error: Unknown toolgroup 'x'. Available: db, web"
        );
        assert_eq!(
            groups.answer(ACTIVATE, "{}"),
            "Error: Missing 'toolgroup' parameter. Available: db, web"
        );
        assert_eq!(
            groups.answer(DISCOVER, "{}"),
            r#"{"toolgroups":["db","web"]}"#
        );
        assert!(groups.is_meta(DISCOVER));
        assert!(!Groups::default().is_meta(DISCOVER));
    }
}
