//! Mock model scripts that the sidecar's spawned tests and the API's
//! in-process tests share: one definition of what each agent of a test's
//! tree answers.

use serde_json::{json, Value};

use crate::mock_llm::{last_message, MockReply};

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn lit(s: &str) -> Value {
    json!({"tag": "Literal", "contents": s})
}

/// Each agent's model, told apart by its system prompt.
pub fn chain_script(req: &Value) -> MockReply {
    let messages = req["messages"].as_array().unwrap();
    let system = text(&messages[0]["content"]);
    let last = last_message(req);
    let user = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| text(&m["content"]))
        .unwrap_or("");
    let tools_seen = messages.iter().filter(|m| m["role"] == "tool").count();
    match (system, text(&last["role"])) {
        ("You are ROOT.", "user") => {
            if user.contains("derive") {
                MockReply::tool_call(
                    "derive_agent",
                    json!({"from": "middle", "slug": "r1",
                    "bindings": [{"agent": "leaf", "tool": "bash_probe", "arg": "repo", "value": lit("r-derived")}]}),
                )
            } else if user.contains("use r1") {
                MockReply::tool_call("prompt_agent_middle", json!({"what": "go", "as": "r1"}))
            } else if user.contains("use unknown") {
                MockReply::tool_call("prompt_agent_middle", json!({"what": "go", "as": "nope"}))
            } else if user.contains("sealed") {
                MockReply::tool_call(
                    "prompt_agent_sealed",
                    json!({"what": "x", "bindings": [{"arg": "scope", "value": lit("y")}]}),
                )
            } else if user.contains("secret argv") {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "x", "bindings": [{"agent": "leaf", "tool": "bash_probe", "arg": "note",
                        "value": {"tag": "Param", "contents": "gh_token"}}]}),
                )
            } else if user.contains("nothing below") {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "x", "bindings": [{"agent": "**", "arg": "colour", "value": lit("red")}]}),
                )
            } else if user.contains("wrong type below") {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "x", "bindings": [{"agent": "leaf", "arg": "level", "value": lit("ten")}]}),
                )
            } else if user.contains("scalars below") {
                // A number and a boolean for two string arguments.
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "go", "bindings": [
                        {"agent": "leaf", "tool": "bash_probe", "arg": "repo",
                         "value": {"tag": "Literal", "contents": 42}},
                        {"agent": "leaf", "arg": "note", "value": {"tag": "Literal", "contents": true}}]}),
                )
            } else if user.contains("with process") {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "x", "with": {"region": lit("us")}}),
                )
            } else if user.contains("bad path") {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "x", "bindings": [{"agent": "nowhere", "arg": "repo", "value": lit("y")}]}),
                )
            } else {
                MockReply::tool_call(
                    "prompt_agent_middle",
                    json!({"what": "go",
                    "bindings": [{"agent": "leaf", "tool": "bash_probe", "arg": "repo", "value": lit("r-root")}]}),
                )
            }
        }
        ("You are ROOT.", _) => MockReply::text(format!("root got: {}", text(&last["content"]))),
        ("You are MIDDLE.", _) if tools_seen == 0 => {
            MockReply::tool_call("describe_agent", json!({"slug": "leaf"}))
        }
        ("You are MIDDLE.", _) if tools_seen == 1 => MockReply::tool_call(
            "prompt_agent_leaf",
            json!({"what": "probe",
            // repo was bound by root for this call: middle cannot rebind it.
            "bindings": [{"arg": "repo", "value": lit("r-mid")}, {"arg": "note", "value": lit("n-mid")}]}),
        ),
        ("You are MIDDLE.", _) => {
            let described = messages
                .iter()
                .find(|m| m["role"] == "tool")
                .map(|m| text(&m["content"]))
                .unwrap_or("");
            MockReply::text(format!(
                "middle described: {described} | leaf: {}",
                text(&last["content"])
            ))
        }
        ("You are LEAF.", "user") => {
            MockReply::tool_call("bash_probe", json!({"repo": "model-guess"}))
        }
        ("You are LEAF.", _) => MockReply::text(format!("leaf: {}", text(&last["content"]))),
        _ => MockReply::text("?"),
    }
}

/// Call `bash_query-invoices` once per user message, then answer with
/// what the tool returned.
pub fn tool_then_answer(req: &Value) -> MockReply {
    let last = last_message(req);
    match last["role"].as_str() {
        Some("tool") => MockReply::text(format!(
            "answer: {}",
            last["content"].as_str().unwrap_or("")
        )),
        _ => MockReply::tool_call(
            "bash_query-invoices",
            json!({"status": "overdue", "tenant_id": "globex"}),
        ),
    }
}

/// How many tool results the request's conversation holds.
pub fn results(req: &Value) -> usize {
    req["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or(0)
}

/// Call the count tool (`bash_count`, the metered agent's) until the
/// conversation holds `calls` results per user message, then answer;
/// every reply reports 40 + 20 tokens.
pub fn count_then_answer(calls: usize) -> impl Fn(&Value) -> MockReply {
    move |req| {
        let users = req["messages"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["role"] == "user").count())
            .unwrap_or(1);
        if results(req) < calls * users {
            MockReply::tool_call("bash_count", json!({})).with_usage(40, 20)
        } else {
            MockReply::text(format!(
                "done: {}",
                last_message(req)["content"].as_str().unwrap_or("")
            ))
            .with_usage(40, 20)
        }
    }
}
