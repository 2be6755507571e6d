//! A remote MCP server for tests (streamable HTTP, JSON answers, no
//! session) on loopback: one tool, `whoami`, answers `called`; every
//! request's method and `Authorization` header are recorded, so a test
//! sees whose token each request carried.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

/// One request: its JSON-RPC method and its `Authorization` header.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub authorization: Option<String>,
}

pub struct MockMcp {
    /// The server's endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockMcp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockMcp {
    pub async fn start() -> MockMcp {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = Router::new().route(
            "/mcp",
            post(move |headers: HeaderMap, Json(msg): Json<Value>| {
                let log = log.clone();
                async move { answer(&log, &headers, msg) }
            })
            .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
            .delete(|| async { StatusCode::METHOD_NOT_ALLOWED }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockMcp { url, seen, task }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The `Authorization` headers of the `tools/call` requests.
    pub fn calls(&self) -> Vec<Option<String>> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "tools/call")
            .map(|s| s.authorization)
            .collect()
    }
}

fn answer(log: &Mutex<Vec<Seen>>, headers: &HeaderMap, msg: Value) -> axum::response::Response {
    let method = msg["method"].as_str().unwrap_or("").to_string();
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
    });
    let Some(id) = msg.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match method.as_str() {
        "initialize" => json!({
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": true}},
            "serverInfo": {"name": "mock-mcp", "version": "1"},
        }),
        "tools/list" => json!({"tools": [{
            "name": "whoami",
            "description": "Says the call reached the server.",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": true},
        }]}),
        "tools/call" => json!({"content": [{"type": "text", "text": "called"}]}),
        _ => {
            return Json(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "method not found"}}))
            .into_response()
        }
    };
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}
