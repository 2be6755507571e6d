//! `list-tool-calls` and `replay-tool-call`'s numbering.
//!
//! In an agents-exe session a call is found in `LlmTurn.contents.llmToolCalls`
//! only (it is also stored in the provider's raw response and with its
//! response in the next UserTurn: counting those would count it three
//! times). Its `index` is its place in its turn, from 0, the turns walked
//! newest first as agents-exe stores them; `turn` is the turn's place in
//! that order, from 1. In Bindery's session file the index is the call's
//! place in the whole session, from 0 (what `replay-tool-call` takes).

use serde_json::{json, Value};

use super::model::{call_name, Session};
use super::{SessionFileError, Shape};

/// One call the model made, as `list-tool-calls` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedCall {
    pub index: usize,
    /// From 1.
    pub turn: usize,
    pub name: String,
    /// As recorded (OpenAI's form: a JSON string).
    pub arguments: Value,
}

/// agents-exe's calls: those with a `function` naming the tool and
/// holding `arguments` (others are passed over, keeping their place).
pub fn of_agents_exe(session: &Session) -> Vec<ListedCall> {
    session
        .calls()
        .filter_map(|(turn, index, call)| {
            let f = call.get("function")?.as_object()?;
            Some(ListedCall {
                index,
                turn,
                name: f.get("name")?.as_str()?.to_string(),
                arguments: f.get("arguments")?.clone(),
            })
        })
        .collect()
}

/// Bindery's calls, numbered across the session.
pub fn of_bindery(doc: &Value) -> Vec<ListedCall> {
    super::super::replay::recorded_calls(doc)
        .into_iter()
        .map(|c| ListedCall {
            index: c.index,
            turn: c.turn,
            name: c.name,
            arguments: c.arguments,
        })
        .collect()
}

/// The calls of a session document of either kind.
pub fn of_doc(doc: &Value, what: &str) -> Result<(Shape, Vec<ListedCall>), SessionFileError> {
    match super::shape(doc) {
        Shape::AgentsExe => {
            let s = Session::parse(doc).map_err(|source| SessionFileError::NotAgentsExe {
                what: what.to_string(),
                source,
            })?;
            Ok((Shape::AgentsExe, of_agents_exe(&s)))
        }
        Shape::Bindery => Ok((Shape::Bindery, of_bindery(doc))),
    }
}

/// The first call whose index is `index` (agents-exe's choice, its indices
/// repeating across turns), or what there is.
pub fn pick<'a>(
    calls: &'a [ListedCall],
    index: usize,
    what: &str,
) -> Result<&'a ListedCall, SessionFileError> {
    calls
        .iter()
        .find(|c| c.index == index)
        .ok_or_else(|| SessionFileError::NoToolCall {
            what: what.to_string(),
            index,
            available: available(calls),
        })
}

/// `turn 1: 0, 1; turn 3: 0`, or `none`.
pub fn available(calls: &[ListedCall]) -> String {
    if calls.is_empty() {
        return "none".into();
    }
    let mut out: Vec<String> = Vec::new();
    let mut turn = None;
    for c in calls {
        if turn == Some(c.turn) {
            if let Some(last) = out.last_mut() {
                last.push_str(&format!(", {}", c.index));
            }
        } else {
            out.push(format!("turn {}: {}", c.turn, c.index));
            turn = Some(c.turn);
        }
    }
    out.join("; ")
}

/// `-f/--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    Human,
    Json,
    Brief,
}

/// What `list-tool-calls` prints, in agents-exe's three shapes.
pub fn render(calls: &[ListedCall], format: ListFormat, file: &str) -> String {
    if calls.is_empty() {
        return format!("No tool calls found in session: {file}\n");
    }
    let compact = |v: &Value| serde_json::to_string(v).unwrap_or_default();
    match format {
        ListFormat::Human => {
            let mut out = format!("Found {} tool call(s):\n\n", calls.len());
            for c in calls {
                out.push_str(&format!(
                    "[{}] {}\n  Turn: {}\n  Arguments: \n    {}\n\n",
                    c.index,
                    c.name,
                    c.turn,
                    compact(&c.arguments)
                ));
            }
            out.push_str("\nTo replay a tool call:\n  bindery-sidecar replay-tool-call --session <file> --tool-call <index> --tool <tool-path>\n");
            out
        }
        ListFormat::Json => {
            let all: Vec<Value> = calls
                .iter()
                .map(|c| json!({"index": c.index, "turn": c.turn, "name": c.name, "arguments": c.arguments}))
                .collect();
            compact(&Value::Array(all)) + "\n"
        }
        ListFormat::Brief => calls
            .iter()
            .map(|c| {
                let preview: String = compact(&c.arguments).chars().take(60).collect();
                format!("{}\t{}\t{preview}\n", c.index, c.name)
            })
            .collect(),
    }
}

/// A call's name for display: agents-exe's `(unnamed)` when it has none.
pub fn display_name(call: &Value) -> &str {
    call_name(call).unwrap_or("(unnamed)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str, args: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
    }

    /// Two steps of two and one calls: each call stored three times, as
    /// agents-exe stores it, and counted once.
    fn session() -> Session {
        let llm = |calls: Vec<Value>| {
            json!({"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": null,
                "responseThinking": null,
                "rawResponse": {"choices": [{"message": {"tool_calls": calls.clone()}}]}},
                "llmToolCalls": calls}})
        };
        let user = |pairs: Vec<Value>| {
            json!({"tag": "UserTurn", "contents": {"userPrompt": "", "userTools": [],
                "userQuery": null, "userToolResponses": pairs}})
        };
        let (a, b, c) = (
            call("a", "bash_x", "{\"q\":1}"),
            call("b", "bash_y", "{}"),
            call("c", "bash_x", "{\"q\":2}"),
        );
        let r = json!({"type": "text", "content": "ok"});
        Session::parse(&json!({"turns": [
            user(vec![json!([c, r])]),
            llm(vec![c.clone()]),
            user(vec![json!([a, r]), json!([b, r])]),
            llm(vec![a.clone(), b.clone(), json!({"id": "broken"})]),
            {"tag": "UserTurn", "contents": {"userPrompt": "", "userTools": [], "userQuery": "go",
                "userToolResponses": []}}
        ]}))
        .unwrap()
    }

    #[test]
    fn each_call_is_counted_once_with_its_turn_and_its_place_in_it() {
        let calls = of_agents_exe(&session());
        let seen: Vec<_> = calls
            .iter()
            .map(|c| (c.turn, c.index, c.name.as_str()))
            .collect();
        assert_eq!(seen, [(2, 0, "bash_x"), (4, 0, "bash_x"), (4, 1, "bash_y")]);
        // Index 0 is the newest turn's first call, as agents-exe picks it.
        assert_eq!(pick(&calls, 0, "f").unwrap().arguments, json!("{\"q\":2}"));
        assert_eq!(pick(&calls, 1, "f").unwrap().name, "bash_y");
        let err = pick(&calls, 2, "session file s.json")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "session file s.json has no tool call with index 2 (available: turn 2: 0; turn 4: 0, 1)"
        );
    }

    #[test]
    fn the_three_listings_are_agents_exes() {
        let calls = of_agents_exe(&session());
        let human = render(&calls, ListFormat::Human, "f");
        assert!(human.starts_with("Found 3 tool call(s):\n\n[0] bash_x\n  Turn: 2\n  Arguments: \n    \"{\\\"q\\\":2}\"\n\n[0] bash_x\n  Turn: 4\n"), "{human}");
        let json = render(&calls, ListFormat::Json, "f");
        assert!(
            json.starts_with(r#"[{"arguments":"{\"q\":2}","index":0,"name":"bash_x","turn":2},"#),
            "{json}"
        );
        assert_eq!(
            render(&calls[2..], ListFormat::Brief, "f"),
            "1\tbash_y\t\"{}\"\n"
        );
        assert_eq!(
            render(&[], ListFormat::Brief, "s.json"),
            "No tool calls found in session: s.json\n"
        );
    }
}
