//! `session …`: a client of a running server's session API, from a
//! terminal. Start a session (or fork one), send a message, follow the
//! events, list and show sessions. Tokens are read from a file or the
//! environment, never from argv.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::{json, Value};

/// Where the server is and who asks.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The server's base URL.
    #[arg(
        long,
        value_name = "URL",
        env = "BINDERY_SERVER",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// A file holding the bearer token (the owner token, or a session's
    /// `st_…` token). Default: BINDERY_TOKEN, else data/owner-token.
    #[arg(long, value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON answers as they are.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Values for a session's parameters.
#[derive(Args, Debug, Clone, Default)]
pub struct ParamArgs {
    /// A parameter's value as a string: NAME=VALUE (`--param` too). Shows
    /// in `ps`: give secrets with --params-file.
    #[arg(long = "set", visible_alias = "param", value_name = "NAME=VALUE")]
    pub param: Vec<String>,
    /// A parameter's value as JSON: NAME=JSON (`--param-json` too).
    #[arg(
        long = "set-json",
        visible_alias = "param-json",
        value_name = "NAME=JSON"
    )]
    pub param_json: Vec<String>,
    /// A JSON object of values: {"name": value}. Repeatable; a later file,
    /// then --set and --set-json, win.
    #[arg(long = "params-file", value_name = "FILE")]
    pub params_file: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Create a session (a fork of another with --fork); prints its id.
    Start {
        /// The agent (see GET /v1/agents); a fork keeps its source's.
        #[arg(long, required_unless_present = "fork")]
        agent: Option<String>,
        /// Fork this session: its history and non-secret values.
        #[arg(long, value_name = "SESSION_ID")]
        fork: Option<String>,
        #[command(flatten)]
        params: ParamArgs,
        /// A first message.
        #[arg(long)]
        prompt: Option<String>,
        /// Only the owner may change the session's values.
        #[arg(long)]
        seal: bool,
        /// Also get a session token (printed once).
        #[arg(long)]
        session_token: bool,
        /// Wait for the run to end and print the answer.
        #[arg(long)]
        wait: bool,
    },
    /// Send a message to a session.
    Send {
        session_id: String,
        #[arg(long)]
        prompt: String,
        #[command(flatten)]
        params: ParamArgs,
        /// Wait for the run to end and print the answer.
        #[arg(long)]
        wait: bool,
    },
    /// Follow a session's events (one line each: id, kind, data).
    Events {
        session_id: String,
        /// Start after this event id (default: from the first).
        #[arg(long, value_name = "ID")]
        after: Option<u64>,
        /// Stop after the first event of this kind (e.g. run_finished).
        #[arg(long, value_name = "KIND")]
        until: Option<String>,
    },
    /// List the sessions.
    List,
    /// Show one session (the server's JSON view).
    Show { session_id: String },
}

/// One server-sent event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Server-sent events from text lines: fields until a blank line.
#[derive(Default)]
pub struct SseLines {
    buf: String,
    current: SseEvent,
}

impl SseLines {
    pub fn feed(&mut self, text: &str) -> Vec<SseEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while let Some(end) = self.buf.find('\n') {
            let line = self.buf[..end].trim_end_matches('\r').to_string();
            self.buf.drain(..=end);
            if line.is_empty() {
                let ev = std::mem::take(&mut self.current);
                if !ev.event.is_empty() || !ev.data.is_empty() {
                    out.push(ev);
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.current.id = Some(value.to_string()),
                "event" => self.current.event = value.to_string(),
                "data" => {
                    if !self.current.data.is_empty() {
                        self.current.data.push('\n');
                    }
                    self.current.data.push_str(value);
                }
                _ => {}
            }
        }
        out
    }
}

/// The answer of the session's last run: its last assistant text.
pub fn last_answer(view: &Value) -> Option<&str> {
    view.pointer("/session/turns")?
        .as_array()?
        .iter()
        .rev()
        .find(|t| t["role"] == "assistant" && t["content"].is_string())
        .and_then(|t| t["content"].as_str())
}

/// `ID  AGENT  STATUS  UPDATED  FORKED FROM`, one session a line.
pub fn render_list(list: &Value) -> String {
    let rows: Vec<[String; 5]> = list["sessions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let f = |k: &str| s[k].as_str().unwrap_or("-").to_string();
                    [
                        f("session_id"),
                        f("agent"),
                        f("status"),
                        f("updated_at"),
                        f("forked_from"),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let head = ["SESSION", "AGENT", "STATUS", "UPDATED", "FORKED FROM"].map(String::from);
    let mut widths = [0usize; 5];
    for r in std::iter::once(&head).chain(&rows) {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&head).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn collect_params(p: &ParamArgs) -> Result<BTreeMap<String, Value>, String> {
    let mut out = BTreeMap::new();
    for file in &p.params_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read --params-file {}: {e}", file.display()))?;
        let v: BTreeMap<String, Value> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "--params-file {} is not a JSON object of values: {e}",
                file.display()
            )
        })?;
        out.extend(v);
    }
    for s in &p.param {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("--set {s}: expected NAME=VALUE"))?;
        out.insert(k.to_string(), Value::String(v.to_string()));
    }
    for s in &p.param_json {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("--set-json {s}: expected NAME=JSON"))?;
        let v = serde_json::from_str(v).map_err(|e| format!("--set-json {k}: not JSON: {e}"))?;
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

fn read_token(args: &ServerArgs) -> Result<String, String> {
    if let Some(f) = &args.token_file {
        return std::fs::read_to_string(f)
            .map(|t| t.trim().to_string())
            .map_err(|e| format!("cannot read --token-file {}: {e}", f.display()));
    }
    if let Ok(t) = std::env::var("BINDERY_TOKEN") {
        return Ok(t.trim().to_string());
    }
    let default = Path::new("data/owner-token");
    std::fs::read_to_string(default)
        .map(|t| t.trim().to_string())
        .map_err(|_| "no token: give --token-file FILE or BINDERY_TOKEN (data/owner-token does not exist here)".to_string())
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// Why a request did not get an answer; a redirect the egress policy
    /// refused says so.
    fn unreachable(&self, e: &reqwest::Error) -> String {
        match crate::llm::egress::refused(e) {
            Some(refused) => format!("the server at {}: {refused}", self.base),
            None => format!("cannot reach the server at {}: {e}", self.base),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(v)
        } else {
            Err(format!(
                "the server answered {}: {} ({})",
                status.as_u16(),
                v["message"].as_str().unwrap_or("no message"),
                v["error"].as_str().unwrap_or("error")
            ))
        }
    }

    /// Follow the events after `after`, printing each when `print`, until
    /// one of kind `until` (then return) or the stream ends.
    async fn follow(
        &self,
        id: &str,
        after: Option<u64>,
        until: Option<&str>,
        print: bool,
    ) -> Result<(), String> {
        let url = format!(
            "{}/v1/sessions/{id}/events",
            self.base.trim_end_matches('/')
        );
        let mut req = self.http.get(&url).bearer_auth(&self.token);
        if let Some(a) = after {
            req = req.header("Last-Event-ID", a.to_string());
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            return Err(format!(
                "the server answered {status}: {}",
                v["message"].as_str().unwrap_or("no message")
            ));
        }
        let mut parser = SseLines::default();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| format!("the event stream broke: {e}"))?;
            for ev in parser.feed(&String::from_utf8_lossy(&chunk)) {
                if print {
                    println!(
                        "{}\t{}\t{}",
                        ev.id.as_deref().unwrap_or("-"),
                        ev.event,
                        ev.data
                    );
                }
                if until == Some(ev.event.as_str()) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// After a `?wait=true` answer: if the run is still going (past the
    /// server's wait), follow the events to its end and read the session.
    async fn settle(&self, view: Value) -> Result<Value, String> {
        if view["status"] != "running" {
            return Ok(view);
        }
        let id = view["session_id"].as_str().unwrap_or_default().to_string();
        self.follow(&id, None, Some("run_finished"), false).await?;
        self.call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
            .await
    }
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Print what a start or send gave: the id, the token once, the answer.
fn print_outcome(v: &Value, args: &ServerArgs, waited: bool, with_id: bool) {
    if args.json {
        return print_json(v);
    }
    if with_id {
        println!("session-id: {}", v["session_id"].as_str().unwrap_or("?"));
    }
    if let Some(t) = v["session_token"].as_str() {
        println!("session-token: {t}");
    }
    if waited {
        match v["status"].as_str() {
            Some("failed") => println!(
                "status: failed ({})",
                v["status_detail"].as_str().unwrap_or("no detail")
            ),
            _ => {
                if let Some(a) = last_answer(v) {
                    println!("{a}");
                }
            }
        }
    } else {
        println!("status: {}", v["status"].as_str().unwrap_or("?"));
    }
}

pub async fn main(args: ServerArgs, cmd: SessionCommand) -> Result<ExitCode, String> {
    let err = |e: String| format!("error: {e}");
    let client = Client {
        // The token and the values go to that server's origin only.
        http: crate::llm::egress::client(crate::spec::Redirects::SameOrigin)
            .build()
            .map_err(|e| err(format!("cannot set up HTTP: {e}")))?,
        base: args.server.clone(),
        token: read_token(&args).map_err(err)?,
    };
    use reqwest::Method;
    let wait_q = |w: bool| if w { "?wait=true&timeout=600" } else { "" };
    match cmd {
        SessionCommand::Start {
            agent,
            fork,
            params,
            prompt,
            seal,
            session_token,
            wait,
        } => {
            let mut body = json!({"params": collect_params(&params).map_err(err)?, "seal": seal, "session_token": session_token});
            if let Some(a) = agent {
                body["agent"] = json!(a);
            }
            if let Some(f) = fork {
                body["fork"] = json!(f);
            }
            let waited = wait && prompt.is_some();
            if let Some(p) = prompt {
                body["prompt"] = json!(p);
            }
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions{}", wait_q(waited)),
                    Some(body),
                )
                .await
                .map_err(err)?;
            let token = v["session_token"].clone();
            let mut v = if waited {
                client.settle(v).await.map_err(err)?
            } else {
                v
            };
            v["session_token"] = token;
            print_outcome(&v, &args, waited, true);
        }
        SessionCommand::Send {
            session_id,
            prompt,
            params,
            wait,
        } => {
            let body = json!({"prompt": prompt, "params": collect_params(&params).map_err(err)?});
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions/{session_id}/messages{}", wait_q(wait)),
                    Some(body),
                )
                .await
                .map_err(err)?;
            let v = if wait {
                client.settle(v).await.map_err(err)?
            } else {
                v
            };
            print_outcome(&v, &args, wait, false);
        }
        SessionCommand::Events {
            session_id,
            after,
            until,
        } => {
            client
                .follow(&session_id, after, until.as_deref(), true)
                .await
                .map_err(err)?;
        }
        SessionCommand::List => {
            let v = client
                .call(Method::GET, "/v1/sessions", None)
                .await
                .map_err(err)?;
            if args.json {
                print_json(&v);
            } else {
                print!("{}", render_list(&v));
            }
        }
        SessionCommand::Show { session_id } => {
            let v = client
                .call(Method::GET, &format!("/v1/sessions/{session_id}"), None)
                .await
                .map_err(err)?;
            print_json(&v);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_across_chunks() {
        let mut p = SseLines::default();
        assert!(p.feed("id: 1\nevent: run_st").is_empty());
        let evs = p.feed("arted\ndata: {\"a\":1}\n\n: keep-alive\n\nevent: delta\ndata: hi\n\n");
        assert_eq!(
            evs,
            [
                SseEvent {
                    id: Some("1".into()),
                    event: "run_started".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    id: None,
                    event: "delta".into(),
                    data: "hi".into()
                },
            ]
        );
    }

    #[test]
    fn the_answer_is_the_last_assistant_text() {
        let v = json!({"session": {"turns": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a"}]}});
        assert_eq!(last_answer(&v), Some("a"));
    }

    #[test]
    fn the_list_is_a_table() {
        let v = json!({"sessions": [{"session_id": "s1", "agent": "inv", "status": "idle", "updated_at": "t", "forked_from": null}]});
        assert_eq!(
            render_list(&v),
            "SESSION  AGENT  STATUS  UPDATED  FORKED FROM\ns1       inv    idle    t        -\n"
        );
    }
}
