//! `tool-call NAME` (arguments on stdin), agents-exe's way: the result is
//! printed as agents-exe's tool portal gives it, one JSON line
//! `{"resultData": …, "resultDuration": SECONDS, "resultTraceId": …}`.
//! `resultData` is `{"type": "blob", "data": TEXT}` for a bash tool's or a
//! helper agent's output, `{"type": "success", "data": …, "toolType": T}`
//! for the others (their output as JSON when it is JSON; an MCP tool's as
//! its `content`), `{"type": "error", "error": …, "toolType": T}` when the
//! tool failed, and `{"error": …, "toolName": NAME}` when there is no
//! such tool. A failed call is a result like any other: exit 0, as in
//! agents-exe.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

/// What calling the tool came to.
pub enum Called {
    NotFound,
    /// A helper agent's run (agents-exe's `io` tools).
    Helper(Result<String, super::one_shot::RunError>),
    /// One of the agent's tools (its error scrubbed of every secret).
    Tool(Result<String, bindery_tools::ToolError>),
}

/// agents-exe's `toolType` of a tool, by the name agents-exe gives it
/// (Bindery names agents-exe's tools as it does); `None` for bash, whose
/// success has none.
pub fn tool_type(name: &str) -> Option<&'static str> {
    const BY_PREFIX: [(&str, &str); 7] = [
        ("mcp_", "mcp"),
        ("openapi_", "openapi"),
        ("postgrest_", "postgrest"),
        ("sqlite_", "sqlite"),
        ("system_", "system"),
        ("developer_", "devtool"),
        ("lua_", "lua"),
    ];
    if name.starts_with("bash_") {
        return None;
    }
    Some(
        BY_PREFIX
            .iter()
            .find(|(p, _)| name.starts_with(p))
            .map_or("io", |(_, t)| t),
    )
}

/// `resultData` for `name`'s call.
pub fn result_data(name: &str, called: Called) -> Value {
    let error = |e: &dyn std::fmt::Display, t: &str| json!({"type": "error", "error": e.to_string(), "toolType": t});
    match called {
        Called::NotFound => json!({
            "error": format!("PortalToolNotFound {}", Value::from(name)),
            "toolName": name,
        }),
        Called::Helper(Ok(text)) => json!({"type": "blob", "data": text}),
        Called::Helper(Err(e)) => error(&e, "io"),
        Called::Tool(result) => match (tool_type(name), result) {
            (None, Ok(text)) => json!({"type": "blob", "data": text}),
            (None, Err(e)) => error(&e, "bash"),
            (Some(t), Err(e)) => error(&e, t),
            (Some("mcp"), Ok(text)) => json!({
                "type": "success",
                "data": {"content": [{"type": "text", "text": text}], "isError": false},
                "toolType": "mcp",
            }),
            (Some(t), Ok(text)) => json!({
                "type": "success",
                "data": serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
                "toolType": t,
            }),
        },
    }
}

/// The whole line: the data, how long the call took, and agents-exe's
/// trace id (the start time, as Haskell shows a UTC time).
pub fn result(data: Value, took: Duration, started: SystemTime) -> Value {
    let since = started
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let trace_id = i64::try_from(since.as_secs())
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, since.subsec_nanos()))
        .map(|t| format!("{} UTC", t.format("%Y-%m-%d %H:%M:%S%.f")))
        .unwrap_or_default();
    json!({
        "resultData": data,
        "resultDuration": took.as_secs_f64(),
        "resultTraceId": trace_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_tool_has_agents_exe_shape() {
        assert_eq!(
            result_data("bash_read-file", Called::Tool(Ok("hi\n".into()))),
            json!({"type": "blob", "data": "hi\n"})
        );
        assert_eq!(
            result_data(
                "bash_read-file",
                Called::Tool(Err(bindery_tools::ToolError::Failed("exit 2".into())))
            ),
            json!({"type": "error", "error": "exit 2", "toolType": "bash"})
        );
        assert_eq!(
            result_data(
                "openapi_openapi_getPet",
                Called::Tool(Ok(r#"{"id": 7}"#.into()))
            ),
            json!({"type": "success", "data": {"id": 7}, "toolType": "openapi"})
        );
        assert_eq!(
            result_data("sqlite_db_query", Called::Tool(Ok("not json".into())))["data"],
            "not json"
        );
        assert_eq!(
            result_data("mcp_files_read", Called::Tool(Ok("text".into())))["data"]["content"][0]
                ["text"],
            "text"
        );
        assert_eq!(
            result_data("prompt_agent_child", Called::Helper(Ok("4".into()))),
            json!({"type": "blob", "data": "4"})
        );
        assert_eq!(
            result_data("nope", Called::NotFound),
            json!({"error": "PortalToolNotFound \"nope\"", "toolName": "nope"})
        );
        assert_eq!(tool_type("developer_dev_developer_tools"), Some("devtool"));
        assert_eq!(tool_type("io_clock"), Some("io"));
    }

    #[test]
    fn the_line_says_how_long_and_when() {
        let started = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5_000_000);
        let r = result(json!({}), Duration::from_millis(1500), started);
        assert_eq!(r["resultDuration"], 1.5);
        assert_eq!(r["resultTraceId"], "2023-11-14 22:13:20.005 UTC");
    }
}
