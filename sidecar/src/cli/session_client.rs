//! `session …`: a client of a running server's session API, from a
//! terminal. Every route a client uses has its verb: start (or fork) a
//! session, send, resume, cancel, set and clear values, revoke tokens,
//! list and answer pending calls, follow a run (asking about what it waits
//! for, with [`super::ask`]), read events, list and show sessions. Tokens
//! are read from a file or the environment, never from argv.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::{json, Value};

use bindery_sse::Parser as SseParser;

use super::ask::AskError;
use super::terminal_text::for_terminal;
use bindery_store::pending::Resolution;

/// What stopped a `session …` command: a value given wrong, no token, a
/// server not reached or refusing, or a pending call this client cannot
/// answer. Printed by `commands` after `error: `; none holds a value given
/// (a secret may be one) nor the token.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read --params-file {file}: {source}")]
    ParamsFileUnreadable {
        file: String,
        source: std::io::Error,
    },
    /// Its place and what was expected, never the file's text.
    #[error("--params-file {file} is not a JSON/YAML object of values: {source}")]
    ParamsFileNotValues {
        file: String,
        source: bindery_params::shape::ShapeError,
    },
    #[error("--params-file {file}: `{name}.pinned` must be true or false")]
    PinnedNotBool { file: String, name: String },
    /// `flag` without `=`: only the name before it is shown.
    #[error("{flag} {name}: expected NAME={}", if *.json { "JSON" } else { "VALUE" })]
    NotNameValue {
        flag: &'static str,
        name: String,
        json: bool,
    },
    /// serde_json's messages name a place, never the text.
    #[error("{flag} {name}: not JSON: {source}")]
    NotJson {
        flag: &'static str,
        name: String,
        source: serde_json::Error,
    },
    #[error("`session {verb}` cannot pin {names}: a pin is fixed when a session is made; give it to `session start` (or `session start --fork ID --pin …` to change a session's pin)")]
    PinRefused { verb: &'static str, names: String },
    #[error("cannot read --token-file {file}: {source}")]
    TokenFileUnreadable {
        file: String,
        source: std::io::Error,
    },
    #[error(
        "no token: give --token-file FILE or BINDERY_TOKEN (data/owner-token does not exist here)"
    )]
    NoToken,
    #[error("cannot set up HTTP: {0}")]
    Setup(#[source] reqwest::Error),
    #[error("cannot reach the server at {base}: {source}")]
    Connect {
        base: String,
        source: reqwest::Error,
    },
    /// A redirect the egress policy refused.
    #[error("the server at {base}: {refused}")]
    Redirect {
        base: String,
        refused: bindery_llm::egress::Refused,
    },
    #[error("reading the answer: {0}")]
    Read(#[source] reqwest::Error),
    /// No whole answer in time (a run waited for: at most 660 s).
    #[error("the server at {base} gave no answer within {secs} s: try again, or `session follow SESSION_ID` to follow a run that goes on")]
    Timeout { base: String, secs: u64 },
    #[error("the server's answer is over {} MiB: not an answer of a Bindery server", MAX_ANSWER_BYTES / (1024 * 1024))]
    TooLarge,
    /// The server refused: its code and message, and what to do when the
    /// message alone does not say it.
    #[error("{code}: {message}{hint}")]
    Status {
        status: u16,
        code: String,
        message: String,
        hint: &'static str,
    },
    #[error("the event stream broke: {0}")]
    Stream(#[source] reqwest::Error),
    #[error("the event stream broke: {0}")]
    EventTooLong(#[from] bindery_sse::TooLong),
    #[error("session {session} waits for {tool} and this token may not answer it: only the session's owner answers pending calls")]
    CannotAnswer { session: String, tool: String },
    #[error("forbidden: session {session} waits for {tool}, and only the session's owner answers pending calls (this is not the owner's token)")]
    NotOwner { session: String, tool: String },
    #[error("session {session} waits for no call (status: {status})")]
    WaitsForNothing { session: String, status: String },
    #[error("session {session} waits for {count} calls: give the token of the one to answer (`session pending {session}` lists them)")]
    WaitsForMany { session: String, count: usize },
    #[error(transparent)]
    Ask(#[from] AskError),
    #[error("asking: {0}")]
    AskStopped(#[source] tokio::task::JoinError),
    #[error("`session set` needs values: --set NAME=VALUE, --set-json NAME=JSON or --params-file FILE (`session clear ID NAME` removes one)")]
    SetNeedsValues,
    #[error("`session input` needs the fields: --field NAME=VALUE or --field-json NAME=JSON (`session pending ID` says which are missing)")]
    InputNeedsFields,
    #[error("--output-json: not JSON: {0}")]
    OutputNotJson(#[source] serde_json::Error),
    #[error("give the result: --output TEXT or --output-json JSON")]
    NoResult,
}

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
    /// Like --set, and pinned for the session: no later request may give
    /// it (`start` only; a fork with a new --pin changes it).
    #[arg(long = "pin", value_name = "NAME=VALUE")]
    pub pin: Vec<String>,
    /// Like --set-json, and pinned for the session.
    #[arg(long = "pin-json", value_name = "NAME=JSON")]
    pub pin_json: Vec<String>,
    /// A JSON/YAML object of values: {"name": value}, or {"name": {"value":
    /// …, "pinned": true}} to pin. Repeatable; a later file, then --set,
    /// --set-json, --pin and --pin-json, win.
    #[arg(long = "params-file", value_name = "FILE")]
    pub params_file: Vec<PathBuf>,
}

/// A pending call to answer, and what then.
#[derive(Args, Debug, Clone)]
pub struct AnswerArgs {
    /// The pending call's continuation token (`ct_…`, see `session
    /// pending`), or the session's id when it waits for one call only.
    #[arg(value_name = "TOKEN|SESSION_ID")]
    pub target: String,
    #[command(flatten)]
    pub params: ParamArgs,
    /// Wait for the run the answer resumes and print its answer.
    #[arg(long, conflicts_with = "follow")]
    pub wait: bool,
    /// Follow the resumed run, asking about what it waits for next.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: approve confirmations without asking.
    #[arg(long, requires = "follow")]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Create a session (a fork of another with --fork); prints its id.
    Start {
        /// The agent (see GET /v1/agents); a fork keeps its source's.
        #[arg(long, required_unless_present = "fork")]
        agent: Option<String>,
        /// Fork this session: its history, non-secret values and pins.
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
        #[arg(long, conflicts_with = "follow")]
        wait: bool,
        /// Follow the run, asking about each call it waits for.
        #[arg(long, requires = "prompt")]
        follow: bool,
        /// With --follow: approve confirmations without asking.
        #[arg(long, requires = "follow")]
        yes: bool,
    },
    /// Send a message to a session.
    Send {
        session_id: String,
        #[arg(long)]
        prompt: String,
        #[command(flatten)]
        params: ParamArgs,
        /// Wait for the run to end and print the answer.
        #[arg(long, conflicts_with = "follow")]
        wait: bool,
        /// Follow the run, asking about each call it waits for.
        #[arg(long)]
        follow: bool,
        /// With --follow: approve confirmations without asking.
        #[arg(long, requires = "follow")]
        yes: bool,
    },
    /// Start a run again where the conversation stands (after a failure or
    /// a cancel), with values that were missing.
    Resume {
        session_id: String,
        #[command(flatten)]
        params: ParamArgs,
        /// Wait for the run to end and print the answer.
        #[arg(long, conflicts_with = "follow")]
        wait: bool,
        /// Follow the run, asking about each call it waits for.
        #[arg(long)]
        follow: bool,
        /// With --follow: approve confirmations without asking.
        #[arg(long, requires = "follow")]
        yes: bool,
    },
    /// Follow a session: its progress, each call it waits for asked about
    /// here (from the terminal, or stdin), until the run ends; then the
    /// answer.
    Follow {
        session_id: String,
        /// Approve confirmations without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Cancel the run in progress, or the calls it waits for.
    Cancel { session_id: String },
    /// Set session values (PUT /v1/sessions/ID/params).
    Set {
        session_id: String,
        #[command(flatten)]
        params: ParamArgs,
    },
    /// Remove session values.
    Clear {
        session_id: String,
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// Revoke every session token of a session.
    RevokeToken { session_id: String },
    /// List the calls a session waits for, with their tokens.
    Pending { session_id: String },
    /// Approve a pending confirmation.
    Approve {
        #[command(flatten)]
        answer: AnswerArgs,
        /// Also clear the taint guard: the untrusted results the session
        /// took in so far no longer hold its egress calls.
        #[arg(long)]
        clear_taint: bool,
    },
    /// Refuse a pending call (a confirmation, a choice or an input); the
    /// model reads the reason.
    Reject {
        #[command(flatten)]
        answer: AnswerArgs,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Choose an option of a pending selection: its id, number or label.
    Choose {
        #[command(flatten)]
        answer: AnswerArgs,
        /// The option: its id, its number as `session pending` shows it, or its label.
        #[arg(value_name = "OPTION")]
        option: String,
    },
    /// Give the fields a pending call needs (`needs_input`).
    Input {
        #[command(flatten)]
        answer: AnswerArgs,
        /// A field as a string: NAME=VALUE.
        #[arg(long = "field", value_name = "NAME=VALUE")]
        field: Vec<String>,
        /// A field as JSON: NAME=JSON.
        #[arg(long = "field-json", value_name = "NAME=JSON")]
        field_json: Vec<String>,
    },
    /// Give a deferred call's result (the tool you ran).
    Result {
        #[command(flatten)]
        answer: AnswerArgs,
        /// The result as text.
        #[arg(
            long,
            required_unless_present = "output_json",
            conflicts_with = "output_json"
        )]
        output: Option<String>,
        /// The result as JSON.
        #[arg(long, value_name = "JSON")]
        output_json: Option<String>,
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

/// A request's values: plain ones, and those pinned for the session.
#[derive(Debug, Default, PartialEq)]
pub struct Values {
    pub params: BTreeMap<String, Value>,
    pub pin: BTreeMap<String, Value>,
}

impl Values {
    /// For a verb that does not make a session: pins are refused here,
    /// naming them and where a pin is given.
    fn unpinned(self, verb: &'static str) -> Result<BTreeMap<String, Value>, ClientError> {
        if self.pin.is_empty() {
            return Ok(self.params);
        }
        let names: Vec<&str> = self.pin.keys().map(String::as_str).collect();
        Err(ClientError::PinRefused {
            verb,
            names: names.join(", "),
        })
    }
}

/// The values of `--params-file`s then `--set`, `--set-json`, `--pin`,
/// `--pin-json`: a later one wins, pinned or not.
pub fn collect_params(p: &ParamArgs) -> Result<Values, ClientError> {
    let mut out = Values::default();
    let mut put = |name: &str, value: Value, pinned: bool| {
        out.params.remove(name);
        out.pin.remove(name);
        let to = if pinned {
            &mut out.pin
        } else {
            &mut out.params
        };
        to.insert(name.to_string(), value);
    };
    for file in &p.params_file {
        let shown = || file.display().to_string();
        let text =
            std::fs::read_to_string(file).map_err(|source| ClientError::ParamsFileUnreadable {
                file: shown(),
                source,
            })?;
        let v: BTreeMap<String, Value> =
            serde_yaml::from_str(&text).map_err(|e| ClientError::ParamsFileNotValues {
                file: shown(),
                source: bindery_params::shape::ShapeError::yaml(&e),
            })?;
        for (name, entry) in v {
            match entry {
                Value::Object(o)
                    if o.contains_key("value")
                        && o.keys().all(|k| k == "value" || k == "pinned") =>
                {
                    let pinned = match o.get("pinned") {
                        None => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => {
                            return Err(ClientError::PinnedNotBool {
                                file: shown(),
                                name,
                            })
                        }
                    };
                    put(&name, o["value"].clone(), pinned);
                }
                other => put(&name, other, false),
            }
        }
    }
    let flags: [(&str, &Vec<String>, bool, bool); 4] = [
        ("--set", &p.param, false, false),
        ("--set-json", &p.param_json, true, false),
        ("--pin", &p.pin, false, true),
        ("--pin-json", &p.pin_json, true, true),
    ];
    for (flag, args, json, pinned) in flags {
        for s in args {
            let (name, v) = split_value(flag, s, json)?;
            put(&name, v, pinned);
        }
    }
    Ok(out)
}

/// `NAME=VALUE` (a string) or `NAME=JSON`; an error never echoes a value.
fn split_value(flag: &'static str, s: &str, json: bool) -> Result<(String, Value), ClientError> {
    let (k, v) = s.split_once('=').ok_or_else(|| ClientError::NotNameValue {
        flag,
        name: s.split('=').next().unwrap_or_default().to_string(),
        json,
    })?;
    let v = if json {
        serde_json::from_str(v).map_err(|source| ClientError::NotJson {
            flag,
            name: k.to_string(),
            source,
        })?
    } else {
        Value::String(v.to_string())
    };
    Ok((k.to_string(), v))
}

pub(super) fn read_token(args: &ServerArgs) -> Result<String, ClientError> {
    if let Some(f) = &args.token_file {
        return std::fs::read_to_string(f)
            .map(|t| t.trim().to_string())
            .map_err(|source| ClientError::TokenFileUnreadable {
                file: f.display().to_string(),
                source,
            });
    }
    if let Ok(t) = std::env::var("BINDERY_TOKEN") {
        return Ok(t.trim().to_string());
    }
    let default = Path::new("data/owner-token");
    std::fs::read_to_string(default)
        .map(|t| t.trim().to_string())
        .map_err(|_| ClientError::NoToken)
}

/// A refusal of the server as `CODE: message`, with what to do when the
/// message alone does not say it.
pub fn refusal(status: u16, path: &str, body: &Value) -> ClientError {
    let code = body["error"]
        .as_str()
        .map_or_else(|| format!("http_{status}"), str::to_string);
    let message = body["message"]
        .as_str()
        .or(body.as_str())
        .unwrap_or("no message");
    let hint = if status == 401 {
        "; the server did not take this token: check --token-file or BINDERY_TOKEN"
    } else if status == 404 && path.starts_with("/v1/continuations/") {
        "; `session pending SESSION_ID` lists the calls a session waits for, with their tokens"
    } else if status == 404 && path.starts_with("/v1/sessions/") {
        "; `session list` shows the sessions"
    } else {
        ""
    };
    ClientError::Status {
        status,
        code,
        message: message.to_string(),
        hint,
    }
}

/// The largest answer the client reads: a session's view with a long
/// conversation is a few MiB; a server that sends more is not one to trust.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// How long a request may take, its answer read: a run waited for
/// (`?wait=true`, at most `timeout=600` s on the server) a little longer
/// than the server's own limit, anything else a minute.
fn answer_within(path: &str) -> std::time::Duration {
    let secs = if path.contains("wait=true") { 660 } else { 60 };
    std::time::Duration::from_secs(secs)
}

/// The answer's body as text, refused past [`MAX_ANSWER_BYTES`] before it
/// is all held.
pub(super) async fn read_answer(mut resp: reqwest::Response) -> Result<String, ClientError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ClientError::Read(e.without_url()))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ClientError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

fn turns(view: &Value) -> &[Value] {
    view.pointer("/session/turns")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Print on stderr what the turns from `from` did: the tools called and
/// what they gave; returns how many turns are now shown.
fn show_progress(view: &Value, from: usize) -> usize {
    let all = turns(view);
    for t in all.iter().skip(from) {
        match t["role"].as_str() {
            Some("assistant") => {
                for c in t["tool_calls"].as_array().into_iter().flatten() {
                    let name = c.pointer("/function/name").and_then(Value::as_str);
                    let args = c.pointer("/function/arguments").and_then(Value::as_str);
                    say_err(&format!(
                        "-> {} {}",
                        name.unwrap_or("?"),
                        args.unwrap_or("")
                    ));
                }
            }
            Some("tool") => say_err(&format!("<- {}", t["content"].as_str().unwrap_or(""))),
            _ => {}
        }
    }
    all.len().max(from)
}

/// The pending items, one block each: number, tool, disposition, the
/// model's arguments; then what answering it takes.
pub fn render_pending(view: &Value) -> String {
    let items = view["pending"].as_array().map_or(&[][..], Vec::as_slice);
    if items.is_empty() {
        return format!(
            "session {} waits for nothing (status: {})\n",
            view["session_id"].as_str().unwrap_or("?"),
            view["status"].as_str().unwrap_or("?")
        );
    }
    let mut out = String::new();
    for (n, i) in items.iter().enumerate() {
        let s = |k: &str| i[k].as_str().unwrap_or_default().to_string();
        out.push_str(&format!(
            "{}. {} {} {}\n",
            n + 1,
            s("tool"),
            s("disposition"),
            i["call"]
        ));
        if !s("continuation_token").is_empty() {
            out.push_str(&format!("   token: {}\n", s("continuation_token")));
        }
        for (k, o) in i["options"].as_array().into_iter().flatten().enumerate() {
            out.push_str(&format!(
                "   option {}: {} ({}) {}\n",
                k + 1,
                o["label"].as_str().unwrap_or_default(),
                o["id"].as_str().unwrap_or_default(),
                o["facts"]
            ));
        }
        if let Some(m) = i["missing"].as_array().filter(|m| !m.is_empty()) {
            let m: Vec<&str> = m.iter().filter_map(Value::as_str).collect();
            out.push_str(&format!("   missing: {}\n", m.join(", ")));
        }
        if i["facts"].is_object() && i["disposition"] != "needs_selection" {
            out.push_str(&format!("   facts: {}\n", i["facts"]));
        }
        if !s("note").is_empty() {
            out.push_str(&format!("   note: {}\n", s("note")));
        }
        if !s("expires_at").is_empty() {
            out.push_str(&format!("   expires: {}\n", s("expires_at")));
        }
        let how = match i["disposition"].as_str() {
            Some("deferred") => "session result TOKEN --output TEXT",
            Some("confirm" | "needs_confirmation") => {
                "session approve TOKEN, or session reject TOKEN --reason WHY"
            }
            Some("needs_selection") => "session choose TOKEN OPTION",
            Some("needs_input") => "session input TOKEN --field NAME=VALUE",
            _ => "POST /v1/continuations/TOKEN",
        };
        out.push_str(&format!("   answer: {how}\n"));
    }
    out
}

/// What answering with `r` sends to the continuation.
fn answer_body(r: &Resolution) -> Value {
    match r {
        Resolution::Result { output } => json!({"result": output}),
        Resolution::Approved => json!({"approve": true}),
        Resolution::Rejected { reason } => match reason {
            Some(why) => json!({"approve": false, "reason": why}),
            None => json!({"approve": false}),
        },
        Resolution::Chosen { option } => json!({"choice": option}),
        Resolution::Input { values } => json!({"input": values}),
        Resolution::Expired | Resolution::Cancelled => json!({"approve": false}),
    }
}

impl Client {
    /// Why a request did not get an answer; a redirect the egress policy
    /// refused says so.
    fn unreachable(&self, e: reqwest::Error) -> ClientError {
        // Shown without a user, password or query: --server may carry them.
        let base = bindery_llm::egress::shown_text(&self.base);
        match bindery_llm::egress::refused(&e) {
            Some(refused) => ClientError::Redirect {
                base,
                refused: refused.clone(),
            },
            None => ClientError::Connect {
                base,
                source: e.without_url(),
            },
        }
    }

    fn timed_out(&self, within: std::time::Duration) -> ClientError {
        ClientError::Timeout {
            base: bindery_llm::egress::shown_text(&self.base),
            secs: within.as_secs(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let within = answer_within(path);
        // A connection not made in time is `Connect`: the server is not reached.
        let timed_out = |e: &reqwest::Error| {
            (e.is_timeout() && !e.is_connect()).then(|| self.timed_out(within))
        };
        let resp = req
            .timeout(within)
            .send()
            .await
            .map_err(|e| timed_out(&e).unwrap_or_else(|| self.unreachable(e)))?;
        let status = resp.status();
        let text = read_answer(resp).await.map_err(|e| match &e {
            ClientError::Read(r) => timed_out(r).unwrap_or(e),
            _ => e,
        })?;
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(v)
        } else {
            let path = path.split('?').next().unwrap_or(path);
            Err(refusal(status.as_u16(), path, &v))
        }
    }

    async fn view(&self, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
            .await
    }

    /// The events of session `id` after `after`.
    async fn events(&self, id: &str, after: Option<u64>) -> Result<reqwest::Response, ClientError> {
        let path = format!("/v1/sessions/{id}/events");
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self.http.get(&url).bearer_auth(&self.token);
        if let Some(a) = after {
            req = req.header("Last-Event-ID", a.to_string());
        }
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let text = read_answer(resp).await?;
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            return Err(refusal(status, &path, &v));
        }
        Ok(resp)
    }

    /// Print the events after `after`, one a line, until one of kind
    /// `until` (then return) or the stream ends.
    async fn print_events(
        &self,
        id: &str,
        after: Option<u64>,
        until: Option<&str>,
    ) -> Result<(), ClientError> {
        let mut parser = SseParser::default();
        let mut body = self.events(id, after).await?.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(ClientError::Stream)?;
            let events = parser.feed(&chunk).map_err(ClientError::EventTooLong)?;
            for ev in events {
                say(&format!(
                    "{}\t{}\t{}",
                    ev.id.as_deref().unwrap_or("-"),
                    ev.kind(),
                    ev.data
                ));
                if until == Some(ev.kind()) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The session once its run is over (it is not `running`): read again
    /// whenever an event says the conversation moved, its progress shown
    /// on stderr from turn `*shown` when `progress`.
    async fn settled(
        &self,
        view: Value,
        shown: &mut usize,
        progress: bool,
    ) -> Result<Value, ClientError> {
        if progress {
            *shown = show_progress(&view, *shown);
        }
        if view["status"] != "running" {
            return Ok(view);
        }
        let id = view["session_id"].as_str().unwrap_or_default().to_string();
        let mut parser = SseParser::default();
        let mut body = self.events(&id, None).await?.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(ClientError::Stream)?;
            let moved = parser
                .feed(&chunk)
                .map_err(ClientError::EventTooLong)?
                .iter()
                .any(|e| {
                    matches!(
                        e.kind(),
                        "message" | "tool_call" | "tool_result" | "pending" | "run_finished"
                    )
                });
            if !moved {
                continue;
            }
            let view = self.view(&id).await?;
            if progress {
                *shown = show_progress(&view, *shown);
            }
            if view["status"] != "running" {
                return Ok(view);
            }
        }
        self.view(&id).await
    }

    /// Follow session `id` from `view` until its run ends, asking about
    /// each call it waits for (`yes`: confirmations approved).
    async fn follow(
        &self,
        mut view: Value,
        mut shown: usize,
        yes: bool,
    ) -> Result<Value, ClientError> {
        let id = view["session_id"].as_str().unwrap_or_default().to_string();
        loop {
            view = self.settled(view, &mut shown, true).await?;
            if view["status"] != "waiting_external" {
                return Ok(view);
            }
            let items = view["pending"].as_array().cloned().unwrap_or_default();
            for item in items {
                let Some(token) = item["continuation_token"].as_str().map(str::to_string) else {
                    return Err(ClientError::CannotAnswer {
                        session: id,
                        tool: item["tool"].as_str().unwrap_or("a call").to_string(),
                    });
                };
                let asked = item.clone();
                let r =
                    tokio::task::spawn_blocking(move || super::ask::ask_item(&asked, yes, None))
                        .await
                        .map_err(ClientError::AskStopped)??;
                self.call(
                    reqwest::Method::POST,
                    &format!("/v1/continuations/{token}"),
                    Some(answer_body(&r)),
                )
                .await?;
            }
            view = self.view(&id).await?;
        }
    }

    /// The pending item `target` names (a token, or a session waiting for
    /// one call) and its token. A token this client cannot see in the
    /// session (used already, or not the owner's to see) is sent as it is,
    /// for the server to say why.
    async fn pending_item(&self, target: &str) -> Result<(String, Value), ClientError> {
        if target.starts_with("ct_") {
            let view = match bindery_store::pending::token_session(target) {
                Some(id) => self.view(id).await.ok(),
                None => None,
            };
            let item = view
                .as_ref()
                .and_then(|v| v["pending"].as_array())
                .into_iter()
                .flatten()
                .find(|i| i["continuation_token"] == target)
                .cloned()
                .unwrap_or(Value::Null);
            return Ok((target.to_string(), item));
        }
        let view = self.view(target).await?;
        let items = view["pending"].as_array().cloned().unwrap_or_default();
        match items.as_slice() {
            [] => Err(ClientError::WaitsForNothing {
                session: target.to_string(),
                status: view["status"].as_str().unwrap_or("?").to_string(),
            }),
            [item] => match item["continuation_token"].as_str() {
                Some(t) => Ok((t.to_string(), item.clone())),
                None => Err(ClientError::NotOwner {
                    session: target.to_string(),
                    tool: item["tool"].as_str().unwrap_or("a call").to_string(),
                }),
            },
            more => Err(ClientError::WaitsForMany {
                session: target.to_string(),
                count: more.len(),
            }),
        }
    }
}

/// A line for a person on stdout: what the server, the model or a tool
/// wrote is shown with its control characters and bidi marks escaped
/// (`terminal_text`), so none of them moves the cursor, retitles the
/// window or reorders the line; a trailing line end is not doubled.
fn say(text: &str) {
    println!("{}", for_terminal(text.strip_suffix('\n').unwrap_or(text)));
}

/// [`say`], on stderr (progress while a run goes on).
fn say_err(text: &str) {
    eprintln!("{}", for_terminal(text.strip_suffix('\n').unwrap_or(text)));
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
        say(&format!(
            "session-id: {}",
            v["session_id"].as_str().unwrap_or("?")
        ));
    }
    if let Some(t) = v["session_token"].as_str() {
        say(&format!("session-token: {t}"));
    }
    if waited {
        match v["status"].as_str() {
            Some("failed") => say(&format!(
                "status: failed ({})",
                v["status_detail"].as_str().unwrap_or("no detail")
            )),
            Some("waiting_external") => {
                say(&format!("status: waiting_external\n{}", render_pending(v)))
            }
            _ => {
                if let Some(a) = last_answer(v) {
                    say(a);
                }
            }
        }
    } else {
        say(&format!("status: {}", v["status"].as_str().unwrap_or("?")));
    }
}

/// How a request that starts a run ends on the terminal.
#[derive(Clone, Copy)]
struct Then {
    wait: bool,
    follow: bool,
    yes: bool,
}

impl Then {
    fn query(self) -> &'static str {
        if self.wait {
            "?wait=true&timeout=600"
        } else {
            ""
        }
    }

    /// The view to print after the request answered `v` (its turns up to
    /// `shown` known before), and whether it was waited for.
    async fn finish(
        self,
        client: &Client,
        v: Value,
        shown: usize,
    ) -> Result<(Value, bool), ClientError> {
        let mut shown = shown;
        if self.follow {
            Ok((client.follow(v, shown, self.yes).await?, true))
        } else if self.wait {
            Ok((client.settled(v, &mut shown, false).await?, true))
        } else {
            Ok((v, false))
        }
    }
}

pub async fn main(args: ServerArgs, cmd: SessionCommand) -> Result<ExitCode, ClientError> {
    let client = Client {
        // The token and the values go to that server's origin only.
        http: bindery_llm::egress::client(bindery_spec::Redirects::SameOrigin)
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(ClientError::Setup)?,
        base: args.server.clone(),
        token: read_token(&args)?,
    };
    run(&client, &args, cmd).await
}

async fn run(
    client: &Client,
    args: &ServerArgs,
    cmd: SessionCommand,
) -> Result<ExitCode, ClientError> {
    use reqwest::Method;
    let turns_of = |id: &str| {
        let id = id.to_string();
        async move { Ok::<_, ClientError>(turns(&client.view(&id).await?).len()) }
    };
    match cmd {
        SessionCommand::Start {
            agent,
            fork,
            params,
            prompt,
            seal,
            session_token,
            wait,
            follow,
            yes,
        } => {
            let values = collect_params(&params)?;
            let mut body =
                json!({"params": values.params, "seal": seal, "session_token": session_token});
            if !values.pin.is_empty() {
                body["pin"] = json!(values.pin);
            }
            if let Some(a) = agent {
                body["agent"] = json!(a);
            }
            if let Some(f) = &fork {
                body["fork"] = json!(f);
            }
            let then = Then {
                wait: wait && prompt.is_some(),
                follow,
                yes,
            };
            // A fork's copied turns are not this run's progress.
            let shown = match &fork {
                Some(f) => turns_of(f).await?,
                None => 0,
            };
            if let Some(p) = prompt {
                body["prompt"] = json!(p);
            }
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions{}", then.query()),
                    Some(body),
                )
                .await?;
            let token = v["session_token"].clone();
            if then.follow && !args.json {
                // The id first: the run may wait for a long while.
                say(&format!(
                    "session-id: {}",
                    v["session_id"].as_str().unwrap_or("?")
                ));
                if let Some(t) = token.as_str() {
                    say(&format!("session-token: {t}"));
                }
            }
            let (mut v, waited) = then.finish(client, v, shown).await?;
            v["session_token"] = token;
            print_outcome(&v, args, waited, !then.follow);
        }
        SessionCommand::Send {
            session_id,
            prompt,
            params,
            wait,
            follow,
            yes,
        } => {
            let body =
                json!({"prompt": prompt, "params": collect_params(&params)?.unpinned("send")?});
            let then = Then { wait, follow, yes };
            let shown = if follow {
                turns_of(&session_id).await?
            } else {
                0
            };
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions/{session_id}/messages{}", then.query()),
                    Some(body),
                )
                .await?;
            let (v, waited) = then.finish(client, v, shown).await?;
            print_outcome(&v, args, waited, false);
        }
        SessionCommand::Resume {
            session_id,
            params,
            wait,
            follow,
            yes,
        } => {
            let body = json!({"params": collect_params(&params)?.unpinned("resume")?});
            let then = Then { wait, follow, yes };
            let shown = if follow {
                turns_of(&session_id).await?
            } else {
                0
            };
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions/{session_id}/resume{}", then.query()),
                    Some(body),
                )
                .await?;
            let (v, waited) = then.finish(client, v, shown).await?;
            print_outcome(&v, args, waited, false);
        }
        SessionCommand::Follow { session_id, yes } => {
            let view = client.view(&session_id).await?;
            let shown = turns(&view).len();
            let v = client.follow(view, shown, yes).await?;
            print_outcome(&v, args, true, false);
        }
        SessionCommand::Cancel { session_id } => {
            let v = client
                .call(
                    Method::POST,
                    &format!("/v1/sessions/{session_id}/cancel"),
                    None,
                )
                .await?;
            print_outcome(&v, args, false, false);
        }
        SessionCommand::Set { session_id, params } => {
            let values = collect_params(&params)?.unpinned("set")?;
            if values.is_empty() {
                return Err(ClientError::SetNeedsValues);
            }
            let v = client
                .call(
                    Method::PUT,
                    &format!("/v1/sessions/{session_id}/params"),
                    Some(json!({"params": values})),
                )
                .await?;
            print_values(&v, args);
        }
        SessionCommand::Clear { session_id, names } => {
            let values: BTreeMap<String, Value> =
                names.into_iter().map(|n| (n, Value::Null)).collect();
            let v = client
                .call(
                    Method::PUT,
                    &format!("/v1/sessions/{session_id}/params"),
                    Some(json!({"params": values})),
                )
                .await?;
            print_values(&v, args);
        }
        SessionCommand::RevokeToken { session_id } => {
            client
                .call(
                    Method::DELETE,
                    &format!("/v1/sessions/{session_id}/token"),
                    None,
                )
                .await?;
            say(&format!("revoked: every session token of {session_id}"));
        }
        SessionCommand::Pending { session_id } => {
            let v = client.view(&session_id).await?;
            if args.json {
                print_json(&v["pending"]);
            } else {
                say(&render_pending(&v));
            }
        }
        SessionCommand::Approve {
            answer,
            clear_taint,
        } => {
            let body = if clear_taint {
                json!({"approve": true, "clear_taint": true})
            } else {
                json!({"approve": true})
            };
            answer_call(client, args, answer, |_| body).await?;
        }
        SessionCommand::Reject { answer, reason } => {
            answer_call(client, args, answer, |_| {
                answer_body(&Resolution::Rejected { reason })
            })
            .await?;
        }
        SessionCommand::Choose { answer, option } => {
            answer_call(client, args, answer, |item| {
                // By number or label when the item is in view; else the id
                // as given, for the server to judge.
                let id = super::ask::option_named(&item["options"], &option).unwrap_or(option);
                json!({"choice": id})
            })
            .await?;
        }
        SessionCommand::Input {
            answer,
            field,
            field_json,
        } => {
            let mut input = serde_json::Map::new();
            for s in &field {
                let (k, v) = split_value("--field", s, false)?;
                input.insert(k, v);
            }
            for s in &field_json {
                let (k, v) = split_value("--field-json", s, true)?;
                input.insert(k, v);
            }
            if input.is_empty() {
                return Err(ClientError::InputNeedsFields);
            }
            answer_call(client, args, answer, |_| json!({"input": input})).await?;
        }
        SessionCommand::Result {
            answer,
            output,
            output_json,
        } => {
            let result = match (output, output_json) {
                (Some(t), _) => Value::String(t),
                (None, Some(j)) => serde_json::from_str(&j).map_err(ClientError::OutputNotJson)?,
                (None, None) => return Err(ClientError::NoResult),
            };
            answer_call(client, args, answer, |_| json!({"result": result})).await?;
        }
        SessionCommand::Events {
            session_id,
            after,
            until,
        } => {
            client
                .print_events(&session_id, after, until.as_deref())
                .await?;
        }
        SessionCommand::List => {
            let v = client.call(Method::GET, "/v1/sessions", None).await?;
            if args.json {
                print_json(&v);
            } else {
                say(&render_list(&v));
            }
        }
        SessionCommand::Show { session_id } => {
            print_json(&client.view(&session_id).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// After `set` or `clear`: the session's values as they now stand (names
/// only for secrets), and its pins.
fn print_values(v: &Value, args: &ServerArgs) {
    if args.json {
        return print_json(v);
    }
    for (k, x) in v["params"].as_object().into_iter().flatten() {
        say(&format!("{k}={x}"));
    }
    for k in v["secret_params"].as_array().into_iter().flatten() {
        say(&format!("{}=<secret>", k.as_str().unwrap_or_default()));
    }
    let pinned: Vec<&str> = v["pinned"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !pinned.is_empty() {
        say(&format!("pinned: {}", pinned.join(", ")));
    }
}

/// Answer the pending call `a.target` names with the body `make` builds
/// from its item (`null` when not in view), and what then.
async fn answer_call(
    client: &Client,
    args: &ServerArgs,
    a: AnswerArgs,
    make: impl FnOnce(&Value) -> Value,
) -> Result<(), ClientError> {
    let params = collect_params(&a.params)?.unpinned("answers")?;
    let (token, item) = client.pending_item(&a.target).await?;
    let mut body = make(&item);
    if !params.is_empty() {
        body["params"] = json!(params);
    }
    let then = Then {
        wait: a.wait,
        follow: a.follow,
        yes: a.yes,
    };
    let shown = match bindery_store::pending::token_session(&token) {
        Some(id) if a.follow => turns(&client.view(id).await?).len(),
        _ => 0,
    };
    let v = client
        .call(
            reqwest::Method::POST,
            &format!("/v1/continuations/{token}{}", then.query()),
            Some(body),
        )
        .await?;
    let (v, waited) = then.finish(client, v, shown).await?;
    print_outcome(&v, args, waited, false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_later_value_wins_pinned_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("v.yaml");
        std::fs::write(
            &file,
            "tenant: {value: acme, pinned: true}\nregion: eu\nplan: {value: gold, pinned: false}\ncfg: {value: 1, other: 2}\n",
        )
        .unwrap();
        let p = ParamArgs {
            params_file: vec![file.clone()],
            pin: vec!["region=us".into()],
            ..Default::default()
        };
        let v = collect_params(&p).unwrap();
        assert_eq!(
            v.pin,
            [
                ("region".into(), json!("us")),
                ("tenant".into(), json!("acme"))
            ]
            .into()
        );
        assert_eq!(
            v.params,
            [
                ("cfg".into(), json!({"value": 1, "other": 2})),
                ("plan".into(), json!("gold"))
            ]
            .into()
        );
        let err = v.unpinned("set").map(drop).unwrap_err().to_string();
        assert!(
            err.starts_with("`session set` cannot pin region, tenant"),
            "{err}"
        );
        let p = ParamArgs {
            params_file: vec![file],
            param: vec!["tenant=initech".into()],
            ..Default::default()
        };
        let v = collect_params(&p).unwrap();
        assert!(!v.pin.contains_key("tenant"));
        assert_eq!(v.params["tenant"], json!("initech"));
        assert_eq!(v.unpinned("set").unwrap()["region"], json!("eu"));
        let bad = ParamArgs {
            pin_json: vec!["tenant=secret-but-not-json".into()],
            ..Default::default()
        };
        let err = collect_params(&bad).unwrap_err().to_string();
        assert!(err.starts_with("--pin-json tenant: not JSON"), "{err}");
        assert!(!err.contains("secret-but-not-json"), "{err}");
    }

    #[test]
    fn pending_items_show_what_answers_them() {
        let v = json!({"session_id": "s1", "status": "waiting_external", "pending": [
            {"tool": "bash_book", "disposition": "needs_selection", "call": {"d": 1},
             "continuation_token": "ct_s1_x", "options": [{"id": "opt_1", "label": "10:00", "facts": {"t": 1}}]},
            {"tool": "get_location", "disposition": "deferred", "call": {}}]});
        assert_eq!(
            render_pending(&v),
            "1. bash_book needs_selection {\"d\":1}\n   token: ct_s1_x\n   option 1: 10:00 (opt_1) {\"t\":1}\n   answer: session choose TOKEN OPTION\n\
             2. get_location deferred {}\n   answer: session result TOKEN --output TEXT\n"
        );
        assert_eq!(
            render_pending(&json!({"session_id": "s1", "status": "idle", "pending": []})),
            "session s1 waits for nothing (status: idle)\n"
        );
    }

    #[test]
    fn a_refusal_names_its_code_and_what_to_do() {
        let body = json!({"error": "not_found", "message": "no session x"});
        assert_eq!(
            refusal(404, "/v1/sessions/x", &body).to_string(),
            "not_found: no session x; `session list` shows the sessions"
        );
        assert!(refusal(404, "/v1/continuations/ct_x", &body)
            .to_string()
            .contains("`session pending SESSION_ID`"));
        assert_eq!(
            refusal(502, "/v1/sessions", &json!("bad gateway")).to_string(),
            "http_502: bad gateway"
        );
    }
}
