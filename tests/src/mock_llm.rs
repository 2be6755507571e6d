//! A scripted, OpenAI-compatible mock LLM.
//!
//! [`MockLlm`] serves `POST /v1/chat/completions` on a loopback port chosen
//! at runtime. Each request is recorded, then answered with the
//! [`MockReply`] a script picks for it: text, tool calls, an HTTP error, a
//! malformed body, or any of these after a delay or once the test opens a
//! [`Gate`] (a run held in flight for as long as the test needs). A request with
//! `"stream": true` is answered as an OpenAI-style event stream, cut into
//! small, odd-sized pieces so that a client's incremental parser is
//! exercised.
//!
//! ```no_run
//! # async fn demo() {
//! use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
//! let llm = MockLlm::start(|req| {
//!     if last_message(req)["role"] == "tool" {
//!         MockReply::Text("all done".into())
//!     } else {
//!         MockReply::ToolCalls(vec![("read_file".into(), serde_json::json!({"path": "a"}))])
//!     }
//! })
//! .await;
//! let base_url = llm.url(); // http://127.0.0.1:PORT/v1
//! # let _ = base_url;
//! llm.shutdown().await;
//! # }
//! ```

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How the mock answers one request.
#[derive(Debug, Clone, PartialEq)]
pub enum MockReply {
    /// An assistant message with this text (`finish_reason: stop`).
    Text(String),
    /// An assistant message calling these tools, each given as its name and
    /// its arguments (`finish_reason: tool_calls`). The mock gives the calls
    /// ids `call_1`, `call_2`, ..., unique over the mock's life.
    ToolCalls(Vec<(String, Value)>),
    /// An HTTP error: this status, an optional `Retry-After` in seconds, and
    /// this body.
    Status {
        /// The HTTP status.
        status: u16,
        /// The `Retry-After` header, in seconds.
        retry_after: Option<u64>,
        /// The body, sent as is.
        body: String,
    },
    /// Status 200 with this body, sent as is, as `application/json`; to a
    /// streaming request as `text/event-stream` unless the body is JSON.
    Raw(String),
    /// Wait, then answer with the inner reply.
    Delay(Duration, Box<MockReply>),
    /// Hold the request until the gate is opened, then answer with the
    /// inner reply (at once if it is open already).
    Held(Gate, Box<MockReply>),
    /// The inner reply with this `usage` (prompt and completion tokens),
    /// or with none at all, as from a server that reports none. Without
    /// it, the mock reports an estimate of its own.
    Usage(Option<(u64, u64)>, Box<MockReply>),
}

/// A latch that holds [`MockReply::Held`] replies until the test opens it;
/// clones share it.
#[derive(Clone, Debug)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate(Arc::new(tokio::sync::watch::Sender::new(false)))
    }

    /// Let every reply held by this gate go, now and from now on.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let mut open = self.0.subscribe();
        let _ = open.wait_for(|o| *o).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl MockReply {
    /// A text reply.
    pub fn text(text: impl Into<String>) -> Self {
        MockReply::Text(text.into())
    }

    /// A reply calling one tool.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        MockReply::ToolCalls(vec![(name.into(), arguments)])
    }

    /// An HTTP error without `Retry-After`.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        MockReply::Status {
            status,
            retry_after: None,
            body: body.into(),
        }
    }

    /// This reply, after `delay`.
    pub fn delayed(self, delay: Duration) -> Self {
        MockReply::Delay(delay, Box::new(self))
    }

    /// This reply, once `gate` is open.
    pub fn held(self, gate: &Gate) -> Self {
        MockReply::Held(gate.clone(), Box::new(self))
    }

    /// This reply, reporting `prompt` and `completion` tokens.
    pub fn with_usage(self, prompt: u64, completion: u64) -> Self {
        MockReply::Usage(Some((prompt, completion)), Box::new(self))
    }

    /// This reply, reporting no usage.
    pub fn without_usage(self) -> Self {
        MockReply::Usage(None, Box::new(self))
    }
}

type Script = Box<dyn Fn(&Value) -> MockReply + Send + Sync>;

/// One request as received.
struct Recorded {
    headers: Vec<(String, String)>,
    body: String,
    json: Value,
}

struct Shared {
    script: Script,
    requests: Mutex<Vec<Recorded>>,
    /// The number of the last tool call id given out.
    call_ids: AtomicUsize,
    /// The number of the last reply id given out.
    reply_ids: AtomicUsize,
    /// See [`MockLlm::stream_whole_events`].
    whole_events: AtomicBool,
}

impl Shared {
    fn new(script: Script) -> Arc<Shared> {
        Arc::new(Shared {
            script,
            requests: Mutex::new(Vec::new()),
            call_ids: AtomicUsize::new(0),
            reply_ids: AtomicUsize::new(0),
            whole_events: AtomicBool::new(false),
        })
    }

    fn requests(&self) -> MutexGuard<'_, Vec<Recorded>> {
        // A script that panicked poisons nothing we care about.
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running mock LLM server. Stops on [`MockLlm::shutdown`] or when
/// dropped.
pub struct MockLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl MockLlm {
    /// Starts a mock that answers each request with what `script` returns
    /// for its JSON body. A body that is not JSON is passed (and recorded)
    /// as a JSON string.
    ///
    /// Panics if no loopback port can be bound: this is test support.
    pub async fn start(script: impl Fn(&Value) -> MockReply + Send + Sync + 'static) -> MockLlm {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind a loopback port for the mock LLM");
        MockLlm::serve(listener, script)
    }

    /// Like [`MockLlm::start`], on a listener of the caller's (the
    /// `mock-model` binary's `--listen`).
    pub fn serve(
        listener: tokio::net::TcpListener,
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
    ) -> MockLlm {
        let shared = Shared::new(Box::new(script));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .fallback(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "the mock LLM serves only POST /v1/chat/completions",
                )
            })
            .with_state(shared.clone());
        let addr = listener
            .local_addr()
            .expect("the mock LLM's listener has an address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Streamed answers go out in many small writes; with Nagle's
            // algorithm each one after the first waits for the client's
            // delayed ACK (40 ms on Linux), which made every streamed model
            // turn ~40 ms slower than its script said.
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let server = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = server.await {
                eprintln!("mock LLM server failed: {e}");
            }
        });
        MockLlm {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A mock that serves nothing: its replies are asked for in this
    /// process with [`MockLlm::respond`] (an in-process model client of a
    /// test), recorded and answered exactly as over HTTP. Its
    /// [`MockLlm::url`] names no listener.
    pub fn detached(script: impl Fn(&Value) -> MockReply + Send + Sync + 'static) -> MockLlm {
        MockLlm {
            addr: SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
            shared: Shared::new(Box::new(script)),
            stop: None,
            task: None,
        }
    }

    /// What the mock answers to the request `body` (as a client would
    /// POST it to `/chat/completions`): its status and its body.
    pub async fn respond(&self, body: &Value) -> (u16, String) {
        let body = Bytes::from(body.to_string());
        let response = chat_completions(State(self.shared.clone()), HeaderMap::new(), body).await;
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// Starts a mock that answers the nth request with the nth reply, and
    /// every request after the last with `Text("done")`.
    pub async fn start_sequence(replies: Vec<MockReply>) -> MockLlm {
        let replies = Mutex::new(VecDeque::from(replies));
        MockLlm::start(move |_| {
            replies
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .pop_front()
                .unwrap_or_else(|| MockReply::Text("done".to_owned()))
        })
        .await
    }

    /// The base URL a client uses, `http://127.0.0.1:PORT/v1`; requests go
    /// to `{url}/chat/completions`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stream each event in one write, as model servers do, instead of in
    /// pieces cut anywhere (the default, which tests a client's parser).
    /// Benchmarks use it: the pieces cost both ends a read and a write each.
    pub fn stream_whole_events(&self, whole: bool) {
        self.shared.whole_events.store(whole, Ordering::Relaxed);
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared
            .requests()
            .iter()
            .map(|r| r.json.clone())
            .collect()
    }

    /// The request bodies received after the first `n`, in order.
    pub fn requests_after(&self, n: usize) -> Vec<Value> {
        self.shared
            .requests()
            .iter()
            .skip(n)
            .map(|r| r.json.clone())
            .collect()
    }

    /// Every request received so far, in order: its headers (names in
    /// lower case) and its body as text.
    pub fn raw_requests(&self) -> Vec<(Vec<(String, String)>, String)> {
        self.shared
            .requests()
            .iter()
            .map(|r| (r.headers.clone(), r.body.clone()))
            .collect()
    }

    /// How many requests have been received.
    pub fn request_count(&self) -> usize {
        self.shared.requests().len()
    }

    /// Stops the server: no new connections, and open ones are given a
    /// moment to finish before they are cut.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for MockLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockLlm")
            .field("url", &self.url())
            .field("requests", &self.request_count())
            .finish()
    }
}

/// A script for trying an agent without a model: a user's message makes
/// it call `tool` (default: the first tool the request offers) with
/// `arguments`; a tool's result makes it answer with that result. Without
/// tools it echoes the message.
pub fn first_tool_then_answer(
    tool: Option<String>,
    arguments: Value,
) -> impl Fn(&Value) -> MockReply + Send + Sync + 'static {
    move |req| {
        let last = last_message(req);
        if last["role"] == "tool" {
            let output = last["content"].as_str().unwrap_or("").trim_end();
            return MockReply::text(format!(
                "The tool answered (I am the mock model and only relay it):\n\n{output}"
            ));
        }
        let offered = tool_names(req);
        match tool.clone().or_else(|| offered.first().cloned()) {
            Some(name) => MockReply::tool_call(name, arguments.clone()),
            None => MockReply::text(format!(
                "You said: {}",
                last["content"].as_str().unwrap_or("")
            )),
        }
    }
}

static NULL: Value = Value::Null;

/// The last message of a request (`null` if there is none).
pub fn last_message(req: &Value) -> &Value {
    req.get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .unwrap_or(&NULL)
}

/// The contents of a request's tool results, in order.
pub fn tool_results(req: &Value) -> Vec<&str> {
    req.get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect()
}

/// The names of the tools a request offers, in order.
pub fn tool_names(req: &Value) -> Vec<String> {
    tools(req)
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// The JSON Schema (`function.parameters`) of the tool `name`, if the
/// request offers it.
pub fn tool_schema<'a>(req: &'a Value, name: &str) -> Option<&'a Value> {
    tools(req)
        .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
        .and_then(|t| t.pointer("/function/parameters"))
}

fn tools(req: &Value) -> impl Iterator<Item = &Value> {
    req.get("tools")
        .and_then(Value::as_array)
        .map(|t| t.iter())
        .into_iter()
        .flatten()
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = String::from_utf8_lossy(&body).into_owned();
    let json = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
    shared.requests().push(Recorded {
        headers: headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: text,
        json: json.clone(),
    });
    let mut reply = (shared.script)(&json);
    let mut usage = Reported::Estimate;
    let reply = loop {
        reply = match reply {
            MockReply::Usage(given, inner) => {
                usage = match given {
                    Some((p, c)) => Reported::Given(p, c),
                    None => Reported::Nothing,
                };
                *inner
            }
            MockReply::Delay(delay, inner) => {
                tokio::time::sleep(delay).await;
                *inner
            }
            MockReply::Held(gate, inner) => {
                gate.opened().await;
                *inner
            }
            other => break other,
        };
    };
    let stream = json.get("stream").and_then(Value::as_bool) == Some(true);
    match reply {
        MockReply::Status {
            status,
            retry_after,
            body,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, body.clone()).into_response();
            let content_type = if serde_json::from_str::<Value>(&body).is_ok() {
                "application/json"
            } else {
                "text/plain; charset=utf-8"
            };
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
        MockReply::Raw(body) => {
            // JSON goes out as JSON even to a streaming request, as from a
            // server that ignores `stream: true`.
            let content_type = if stream && serde_json::from_str::<Value>(&body).is_err() {
                "text/event-stream"
            } else {
                "application/json"
            };
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        MockReply::Text(text) => answer(&shared, &json, stream, Some(text), Vec::new(), usage),
        MockReply::ToolCalls(calls) => {
            let calls = calls
                .into_iter()
                .map(|(name, arguments)| {
                    let n = shared.call_ids.fetch_add(1, Ordering::Relaxed) + 1;
                    (format!("call_{n}"), name, arguments.to_string())
                })
                .collect();
            answer(&shared, &json, stream, None, calls, usage)
        }
        MockReply::Delay(..) | MockReply::Held(..) | MockReply::Usage(..) => {
            unreachable!("delays, gates and usage are unwrapped above")
        }
    }
}

/// What a reply says of its tokens.
enum Reported {
    /// The mock's own estimate.
    Estimate,
    Given(u64, u64),
    Nothing,
}

/// A successful completion: a JSON reply, or an event stream.
fn answer(
    shared: &Shared,
    req: &Value,
    stream: bool,
    content: Option<String>,
    calls: Vec<(String, String, String)>,
    reported: Reported,
) -> Response {
    let id = format!(
        "chatcmpl-mock-{}",
        shared.reply_ids.fetch_add(1, Ordering::Relaxed) + 1
    );
    let model = req.get("model").cloned().unwrap_or(Value::Null);
    let finish_reason = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let prompt_tokens = estimate_tokens(&req.to_string());
    let completion_tokens = estimate_tokens(content.as_deref().unwrap_or(""))
        + calls
            .iter()
            .map(|(_, name, args)| estimate_tokens(name) + estimate_tokens(args))
            .sum::<u64>();
    let usage = match reported {
        Reported::Estimate => Some((prompt_tokens, completion_tokens)),
        Reported::Given(p, c) => Some((p, c)),
        Reported::Nothing => None,
    }
    .map(|(p, c)| json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}));
    if !stream {
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = calls
                .iter()
                .map(|(id, name, args)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": args}})
                })
                .collect();
        }
        let body = json!({
            "id": id,
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        });
        let mut body = body;
        if let Some(u) = &usage {
            body["usage"] = u.clone();
        }
        return (
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }

    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let mut chunks = Vec::new();
    match &content {
        Some(text) => {
            chunks.push(chunk(json!({"role": "assistant", "content": ""}), None));
            for piece in split_chars(text, 4) {
                chunks.push(chunk(json!({"content": piece}), None));
            }
        }
        None => chunks.push(chunk(json!({"role": "assistant", "content": null}), None)),
    }
    for (index, (call_id, name, args)) in calls.iter().enumerate() {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        for piece in split_chars(args, 5) {
            chunks.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    chunks.push(chunk(json!({}), Some(finish_reason)));
    let asked = req.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    if let Some(usage) = usage.filter(|_| asked) {
        chunks.push(json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": usage,
        }));
    }
    let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    events.push("data: [DONE]\n\n".to_string());
    let pieces = if shared.whole_events.load(Ordering::Relaxed) {
        events.into_iter().map(Bytes::from).collect()
    } else {
        odd_pieces(events.concat().as_bytes())
    };
    event_stream(pieces)
}

/// `bytes` in pieces of odd sizes, cut anywhere (inside lines, inside UTF-8
/// characters).
fn odd_pieces(bytes: &[u8]) -> Vec<Bytes> {
    const SIZES: [usize; 5] = [7, 1, 13, 3, 29];
    let mut pieces = Vec::new();
    let mut rest = bytes;
    let mut i = 0;
    while !rest.is_empty() {
        let n = SIZES[i % SIZES.len()].min(rest.len());
        pieces.push(Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
        i += 1;
    }
    pieces
}

/// An event-stream response whose body goes out in `pieces`, yielding
/// between them so that they tend to arrive as separate reads.
fn event_stream(pieces: Vec<Bytes>) -> Response {
    let body = futures::stream::unfold(pieces.into_iter(), |mut pieces| async move {
        let piece = pieces.next()?;
        tokio::task::yield_now().await;
        Some((Ok::<_, Infallible>(piece), pieces))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// `text` in pieces of at most `n` characters.
fn split_chars(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// A rough, deterministic token count: one per four bytes, at least one.
fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_read_requests() {
        let req = json!({
            "model": "m",
            "messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
            "tools": [
                {"type": "function", "function": {"name": "x", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "y"}},
            ]
        });
        assert_eq!(last_message(&req)["role"], "tool");
        assert_eq!(last_message(&json!({})), &Value::Null);
        assert_eq!(tool_names(&req), vec!["x", "y"]);
        assert_eq!(tool_names(&json!({"tools": 3})), Vec::<String>::new());
        assert_eq!(tool_schema(&req, "x"), Some(&json!({"type": "object"})));
        assert_eq!(tool_schema(&req, "y"), None);
        assert_eq!(tool_schema(&req, "z"), None);
    }

    #[test]
    fn split_chars_keeps_characters_whole() {
        assert_eq!(split_chars("héllo✓", 4), vec!["héll", "o✓"]);
        assert!(split_chars("", 4).is_empty());
    }
}
