//! `mcp-server`: agents-exe's MCP server on stdio. JSON-RPC messages, one
//! per line, come on stdin and go out on stdout (nothing else is written
//! there: logs go to stderr). Each agent file given is the tool
//! `ask_<slug>_NNN` (its place among the files, from 000), whose
//! description is the agent's `announce`; calling it with `{"prompt": …}`
//! runs the agent once, as `run` does, and answers with its last text.
//!
//! The protocol is MCP's: `initialize` agrees on the client's version when
//! it is agents-exe's (2024-11-05) or one `/mcp` speaks, else on the
//! newest; `ping`, `tools/list`, `tools/call`; notifications
//! (`notifications/initialized`, and `notifications/cancelled`, which
//! stops the run it names) answer nothing; another method is -32601, a
//! line that is not JSON -32700. A JSON-RPC batch is taken in 2025-03-26,
//! the one version that has them. Calls run side by side (up to
//! [`MAX_RUNS`] at once): a `ping` is answered while a run goes on.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::args::{AgentArgs, ModelArgs};
use super::one_shot::{Loaded, RunError, Waiting};
use bindery_api::mcp::jsonrpc::{self, classify, response, Incoming, RpcError};
use bindery_tree::LoadedAgent;

/// agents-exe's protocol version.
const AGENTS_EXE_VERSION: &str = "2024-11-05";
/// The one version with JSON-RPC batches.
const BATCH_VERSION: &str = "2025-03-26";
/// The longest line read: a longer one is refused (-32700) and skipped.
pub const MAX_LINE: usize = 4 * 1024 * 1024;
/// Lines with runs answered at once; past them, stdin waits for one to end.
const MAX_RUNS: usize = 16;

/// One `ask_<slug>_NNN` tool.
#[derive(Debug, Clone, PartialEq)]
pub struct AskTool {
    pub name: String,
    pub description: String,
}

impl AskTool {
    /// The tools of `agents` (slug and announce), in order.
    pub fn of<'a>(agents: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Vec<AskTool> {
        agents
            .into_iter()
            .enumerate()
            .map(|(i, (slug, announce))| AskTool {
                name: format!("ask_{slug}_{i:03}"),
                description: announce.unwrap_or_default().to_string(),
            })
            .collect()
    }

    fn listed(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": {
                "type": "object",
                "properties": {"prompt": {
                    "type": "string",
                    "description": "the prompt asked when calling the expert",
                }},
                "required": ["prompt"],
            },
        })
    }
}

/// What to do for one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this response.
    Reply(Value),
    /// Run tool `tool` (its index) on `prompt`, and answer request `id`.
    Run {
        id: Value,
        tool: usize,
        prompt: String,
    },
    /// Stop the run answering request `id`.
    Cancel(Value),
}

/// What one line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// One message: an action, or none (a notification).
    One(Option<Action>),
    /// A batch: its actions, answered together in one array.
    Batch(Vec<Action>),
}

/// The protocol's state: the tools, and the version agreed on.
pub struct Protocol {
    tools: Vec<AskTool>,
    version: Option<&'static str>,
}

impl Protocol {
    pub fn new(tools: Vec<AskTool>) -> Protocol {
        Protocol {
            tools,
            version: None,
        }
    }

    /// The versions agreed to: agents-exe's, and those `/mcp` agrees to.
    fn served() -> Vec<&'static str> {
        std::iter::once(AGENTS_EXE_VERSION)
            .chain(bindery_api::mcp::handshake_versions())
            .collect()
    }

    /// What `line` (one line of stdin, without its line break) asks for.
    pub fn on_line(&mut self, line: &[u8]) -> Line {
        let message: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                return Line::One(Some(error(
                    Value::Null,
                    jsonrpc::PARSE_ERROR,
                    format!("a line that is not JSON: {e}"),
                )))
            }
        };
        let Value::Array(batch) = message else {
            return Line::One(self.on_message(message, false));
        };
        let version = self.version.unwrap_or(AGENTS_EXE_VERSION);
        if version != BATCH_VERSION {
            return Line::One(Some(error(
                Value::Null,
                jsonrpc::INVALID_REQUEST,
                format!("protocol {version} has no JSON-RPC batches (only {BATCH_VERSION} has): send one message per line"),
            )));
        }
        if batch.is_empty() {
            return Line::One(Some(error(
                Value::Null,
                jsonrpc::INVALID_REQUEST,
                "an empty batch".into(),
            )));
        }
        Line::Batch(
            batch
                .into_iter()
                .filter_map(|m| self.on_message(m, true))
                .collect(),
        )
    }

    fn on_message(&mut self, message: Value, in_batch: bool) -> Option<Action> {
        let cancelled = (message["method"] == "notifications/cancelled")
            .then(|| message["params"]["requestId"].clone());
        let (id, method, params) = match classify(message) {
            Err((id, e)) => return Some(Action::Reply(response(id, Err(e)))),
            Ok(Incoming::NoReply) => {
                return cancelled.filter(|id| !id.is_null()).map(Action::Cancel)
            }
            Ok(Incoming::Request { id, method, params }) => (id, method, params),
        };
        let outcome = match method.as_str() {
            "initialize" if in_batch => Err(RpcError::new(
                jsonrpc::INVALID_REQUEST,
                "initialize must not be part of a batch",
            )),
            "initialize" => {
                let asked = params["protocolVersion"].as_str().unwrap_or("");
                let version = bindery_api::mcp::negotiate(asked, &Self::served());
                self.version = Some(version);
                Ok(json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": "bindery-sidecar", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Each ask_<agent>_<n> tool runs that agent once on the prompt and answers with its last text.",
                }))
            }
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({
                "tools": self.tools.iter().map(AskTool::listed).collect::<Vec<_>>()
            })),
            "tools/call" => match self.call(&params) {
                Ok((tool, prompt)) => return Some(Action::Run { id, tool, prompt }),
                Err(e) => Err(e),
            },
            other => Err(RpcError::new(
                jsonrpc::METHOD_NOT_FOUND,
                format!("no method `{other}` here: this server has initialize, ping, tools/list and tools/call"),
            )),
        };
        Some(Action::Reply(response(id, outcome)))
    }

    /// The tool and prompt a `tools/call` names.
    fn call(&self, params: &Value) -> Result<(usize, String), RpcError> {
        let invalid = |why: String| RpcError::new(jsonrpc::INVALID_PARAMS, why);
        let name = params["name"]
            .as_str()
            .ok_or_else(|| invalid("tools/call needs `name`, a string".into()))?;
        let tool = self
            .tools
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| invalid(format!("unknown tool `{name}`; tools/list names them")))?;
        let prompt = params["arguments"]["prompt"]
            .as_str()
            .ok_or_else(|| invalid(format!("{name} takes {{\"prompt\": TEXT}}")))?;
        Ok((tool, prompt.to_string()))
    }
}

fn error(id: Value, code: i64, message: String) -> Action {
    Action::Reply(response(id, Err(RpcError::new(code, message))))
}

/// A run's answer as a `tools/call` result.
pub fn call_result(answer: Result<String, RunError>) -> Value {
    match answer {
        Ok(text) => json!({"content": [{"type": "text", "text": text}], "isError": false}),
        Err(why) => {
            json!({"content": [{"type": "text", "text": format!("got an error: {why}")}], "isError": true})
        }
    }
}

/// The next line of `from` without its line break: `Ok(None)` at the end,
/// `Some(Err(()))` for a line longer than `max` (read through and dropped).
pub fn next_line(
    from: &mut impl std::io::BufRead,
    max: usize,
) -> std::io::Result<Option<Result<Vec<u8>, ()>>> {
    let mut line = Vec::new();
    let mut too_long = false;
    let mut any = false;
    loop {
        let buf = match from.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            if !any {
                return Ok(None);
            }
            break;
        }
        any = true;
        let (piece, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !too_long && line.len() + piece.len() <= max {
            line.extend_from_slice(piece);
        } else {
            too_long = true;
            line = Vec::new();
        }
        let used = done.unwrap_or(buf.len());
        from.consume(used);
        if done.is_some() {
            break;
        }
    }
    if too_long {
        return Ok(Some(Err(())));
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(Ok(line)))
}

/// The runs going on, by request id (its JSON text), to cancel them.
#[derive(Default, Clone)]
struct Running(Arc<Mutex<HashMap<String, CancellationToken>>>);

impl Running {
    /// The run's token; none when a run with that id is in flight
    /// (JSON-RPC's ids are unique among the requests pending).
    fn start(&self, id: &Value, parent: &CancellationToken) -> Option<CancellationToken> {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match runs.entry(id.to_string()) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(slot) => {
                Some(slot.insert(parent.child_token()).clone())
            }
        }
    }
    fn end(&self, id: &Value) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.to_string());
    }
    fn cancel(&self, id: &Value) {
        if let Some(t) = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id.to_string())
        {
            t.cancel();
        }
    }
}

pub async fn main(agents: &AgentArgs, model: &ModelArgs) -> Result<ExitCode, RunError> {
    let loaded = Arc::new(Loaded::load(agents, model).await?);
    // agents-exe's --agent SLUG keeps that file alone.
    let chosen: Vec<Arc<LoadedAgent>> = match agents.agent.as_deref() {
        Some(name) => vec![loaded.tree.pick(Some(name))?.clone()],
        None => loaded
            .tree
            .roots
            .iter()
            .filter_map(|r| loaded.tree.agent(r).cloned())
            .collect(),
    };
    let tools = AskTool::of(
        chosen
            .iter()
            .map(|a| (a.name.as_str(), a.spec.announce.as_deref())),
    );
    tracing::info!(
        tools = %tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", "),
        "MCP server on stdio"
    );
    let mut protocol = Protocol::new(tools);
    // stdin and stdout are read and written by threads of their own: a
    // blocking read must not hold an async worker.
    // Bounded: a client that does not read its answers stops being read.
    let (out, mut outbox) = mpsc::channel::<Value>(64);
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        while let Some(message) = outbox.blocking_recv() {
            if writeln!(stdout, "{message}").is_err() || stdout.flush().is_err() {
                break;
            }
        }
    });
    let (lines_in, mut lines) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let line = next_line(&mut stdin, MAX_LINE);
            let end = !matches!(line, Ok(Some(_)));
            if lines_in.blocking_send(line).is_err() || end {
                break;
            }
        }
    });
    let shutdown = super::one_shot::cancelled_on_ctrl_c();
    let running = Running::default();
    let mut tasks = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_RUNS));
    loop {
        let line = tokio::select! {
            line = lines.recv() => line.unwrap_or(Ok(None)),
            _ = shutdown.cancelled() => break,
        };
        let line = match line {
            Ok(Some(Ok(line))) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(()))) => {
                let e = RpcError::new(
                    jsonrpc::PARSE_ERROR,
                    format!("a line longer than {MAX_LINE} bytes"),
                );
                let _ = out.send(response(Value::Null, Err(e))).await;
                continue;
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("stdin: {e}");
                break;
            }
        };
        let (actions, batch) = match protocol.on_line(&line) {
            Line::One(None) => continue,
            Line::One(Some(action)) => (vec![action], false),
            Line::Batch(actions) => (actions, true),
        };
        let answers_now = !actions.iter().any(|a| matches!(a, Action::Run { .. }));
        let mut answers = Vec::new();
        for action in actions {
            match action {
                Action::Cancel(id) => running.cancel(&id),
                Action::Reply(v) => answers.push(Answer::Ready(v)),
                Action::Run { id, tool, prompt } => match running.start(&id, &shutdown) {
                    Some(token) => answers.push(Answer::Run {
                        id,
                        agent: chosen[tool].clone(),
                        prompt,
                        token,
                    }),
                    None => {
                        let e = RpcError::new(
                            jsonrpc::INVALID_REQUEST,
                            format!("a request with id {id} is still being answered: each request in flight needs an id of its own"),
                        );
                        answers.push(Answer::Ready(response(id, Err(e))));
                    }
                },
            }
        }
        // Finished tasks' results are not wanted: only that they end.
        while tasks.try_join_next().is_some() {}
        let (loaded, running, out) = (loaded.clone(), running.clone(), out.clone());
        let work = async move {
            let answered: Vec<Value> =
                futures::future::join_all(answers.into_iter().map(|a| a.give(&loaded, &running)))
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
            if answered.is_empty() {
                return;
            }
            if batch {
                let _ = out.send(Value::Array(answered)).await;
            } else {
                for a in answered {
                    let _ = out.send(a).await;
                }
            }
        };
        if answers_now {
            // Nothing runs: answered here, so a client that does not read
            // its answers stops being read (the channel is bounded).
            work.await;
        } else {
            // Past MAX_RUNS runs at once, stdin waits for one to end.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            tasks.spawn(async move {
                work.await;
                drop(slot);
            });
        }
    }
    // stdin is closed: the runs going on still answer, then the server ends.
    while tasks.join_next().await.is_some() {}
    drop(out);
    let _ = tokio::task::block_in_place(|| writer.join());
    Ok(ExitCode::SUCCESS)
}

/// One response to give: ready, or once a run ends.
enum Answer {
    Ready(Value),
    Run {
        id: Value,
        agent: Arc<LoadedAgent>,
        prompt: String,
        token: CancellationToken,
    },
}

impl Answer {
    /// The response; none for a run the client cancelled (MCP says so).
    async fn give(self, loaded: &Loaded, running: &Running) -> Option<Value> {
        match self {
            Answer::Ready(v) => Some(v),
            Answer::Run {
                id,
                agent,
                prompt,
                token,
            } => {
                let answer = loaded
                    .ask(
                        &agent,
                        prompt,
                        Waiting::Refuse("nobody can answer this on the MCP server's stdio"),
                        &token,
                    )
                    .await;
                running.end(&id);
                if token.is_cancelled() {
                    tracing::info!(agent = %agent.name, "run cancelled by the client");
                    return None;
                }
                if let Err(why) = &answer {
                    tracing::warn!(agent = %agent.name, "the run failed: {why}");
                }
                Some(response(id, Ok(call_result(answer))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol() -> Protocol {
        Protocol::new(AskTool::of([("talker", Some("talks")), ("quiet", None)]))
    }

    fn reply(line: Line) -> Value {
        match line {
            Line::One(Some(Action::Reply(v))) => v,
            other => panic!("not one reply: {other:?}"),
        }
    }

    #[test]
    fn each_agent_is_an_ask_tool_numbered_from_000() {
        let mut p = protocol();
        let listed = reply(p.on_line(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#));
        let tools = listed["result"]["tools"].as_array().unwrap();
        assert_eq!(tools[0]["name"], "ask_talker_000");
        assert_eq!(tools[0]["description"], "talks");
        assert_eq!(tools[1]["name"], "ask_quiet_001");
        assert_eq!(tools[1]["inputSchema"]["required"], json!(["prompt"]));
        assert_eq!(
            p.on_line(br#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"ask_quiet_001","arguments":{"prompt":"hi"}}}"#),
            Line::One(Some(Action::Run {
                id: json!("c"),
                tool: 1,
                prompt: "hi".into()
            }))
        );
        for bad in [
            r#"{"name":"ask_nobody_002","arguments":{"prompt":"hi"}}"#,
            r#"{"name":"ask_talker_000","arguments":{"prompt":7}}"#,
            r#"{"arguments":{}}"#,
        ] {
            let line =
                format!(r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{bad}}}"#);
            let r = reply(p.on_line(line.as_bytes()));
            assert_eq!(r["error"]["code"], jsonrpc::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn the_clients_version_is_agreed_when_served_else_the_newest() {
        let init = |v: &str| {
            let mut p = protocol();
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{v}","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
            );
            let r = reply(p.on_line(line.as_bytes()));
            (
                r["result"]["protocolVersion"].as_str().unwrap().to_string(),
                p,
            )
        };
        assert_eq!(init("2024-11-05").0, "2024-11-05");
        assert_eq!(init("2025-06-18").0, "2025-06-18");
        let newest = *Protocol::served().last().unwrap();
        assert_eq!(init("1999-01-01").0, newest);
        // The stateless version has no handshake.
        assert_eq!(init(bindery_api::mcp::stateless::VERSION).0, newest);
    }

    #[test]
    fn batches_only_in_2025_03_26() {
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"nope"}]"#;
        let mut p = protocol();
        let r = reply(p.on_line(batch));
        assert_eq!(r["error"]["code"], jsonrpc::INVALID_REQUEST);
        let (_, mut p) = {
            let mut p = protocol();
            let r = reply(p.on_line(br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#));
            (r, p)
        };
        let Line::Batch(actions) = p.on_line(batch) else {
            panic!("not a batch")
        };
        assert_eq!(actions.len(), 2);
        assert_eq!(
            actions[0],
            Action::Reply(json!({"jsonrpc":"2.0","id":1,"result":{}}))
        );
        let Action::Reply(nope) = &actions[1] else {
            panic!()
        };
        assert_eq!(nope["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
        let r = reply(p.on_line(b"[]"));
        assert_eq!(r["error"]["code"], jsonrpc::INVALID_REQUEST);
    }

    #[test]
    fn garbage_is_answered_and_notifications_are_not() {
        let mut p = protocol();
        for garbage in [&b"{\"jsonrpc\":"[..], b"\xff\xfe", b"nul", b"{}}"] {
            let r = reply(p.on_line(garbage));
            assert_eq!(r["error"]["code"], jsonrpc::PARSE_ERROR);
            assert_eq!(r["id"], Value::Null);
        }
        let r = reply(p.on_line(br#"{"jsonrpc":"2.0","id":5,"method":7}"#));
        assert_eq!(r["error"]["code"], jsonrpc::INVALID_REQUEST);
        assert_eq!(
            p.on_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Line::One(None)
        );
        assert_eq!(
            p.on_line(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c"}}"#),
            Line::One(Some(Action::Cancel(json!("c"))))
        );
        let r = reply(p.on_line(br#"{"jsonrpc":"2.0","id":9,"method":"resources/list"}"#));
        assert_eq!(r["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
    }

    #[test]
    fn no_line_panics_and_each_request_line_is_answered() {
        let valid = [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#,
            r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"ask_talker_000","arguments":{"prompt":"hi"}}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}]"#,
        ];
        let mut p = protocol();
        // Every truncation and one-byte change of real messages, and
        // values of the wrong type where each field goes.
        for v in valid {
            for cut in 0..v.len() {
                let _ = p.on_line(&v.as_bytes()[..cut]);
                let mut bytes = v.as_bytes().to_vec();
                bytes[cut] = bytes[cut].wrapping_add(1);
                let _ = p.on_line(&bytes);
            }
        }
        for wrong in ["null", "1e999", "[]", "{}", "\"s\"", "[[[]]]", "-1"] {
            for field in ["id", "method", "params", "jsonrpc"] {
                let line = format!(
                    r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"ask_talker_000","arguments":{{"prompt":"x"}}}},"{field}":{wrong}}}"#
                );
                let _ = p.on_line(line.as_bytes());
            }
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":{wrong},"arguments":{wrong}}}}}"#
            );
            assert!(matches!(
                p.on_line(line.as_bytes()),
                Line::One(Some(Action::Reply(_)))
            ));
        }
        let deep = "[".repeat(100_000);
        let _ = p.on_line(deep.as_bytes());
    }

    #[test]
    fn lines_are_bounded_and_a_long_one_is_skipped() {
        let text = format!("short\r\n{}\nafter\nlast", "x".repeat(50));
        let mut from = std::io::BufReader::with_capacity(8, text.as_bytes());
        let mut got = Vec::new();
        while let Some(line) = next_line(&mut from, 20).unwrap() {
            got.push(line.map(|l| String::from_utf8(l).unwrap()));
        }
        assert_eq!(
            got,
            [
                Ok("short".to_string()),
                Err(()),
                Ok("after".to_string()),
                Ok("last".to_string())
            ]
        );
    }

    #[test]
    fn a_run_answers_with_text_or_an_error() {
        assert_eq!(
            call_result(Ok("4".into())),
            json!({"content": [{"type": "text", "text": "4"}], "isError": false})
        );
        assert_eq!(
            call_result(Err(RunError::Ended("boom".into())))["isError"],
            true
        );
    }
}
