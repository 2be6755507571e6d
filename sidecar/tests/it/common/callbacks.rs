//! A product API on 127.0.0.1 that an agent calls back: it serves its own
//! OpenAPI document and records, for each call of `list_tasks`, the
//! project it was asked about and the digest of the `Authorization`
//! header it got. The `callbacks` agent binds `project_id` to a session
//! parameter and sends a session-scope secret `callback_token` as
//! `Authorization: Bearer …` (the S2 set-up of the spec).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub fn digest(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// What the API saw: (project id, digest of the Authorization header).
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn api_doc() -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "callbacks", "version": "1"},
        "paths": {
            "/projects/{project_id}/tasks": {
                "get": {
                    "operationId": "list_tasks",
                    "summary": "List the tasks of the project",
                    "parameters": [
                        {"name": "project_id", "in": "path", "required": true, "schema": {"type": "string"}},
                        {"name": "status", "in": "query", "schema": {"type": "string", "enum": ["open", "done"]}}
                    ],
                    "responses": {"200": {"description": "tasks"}}
                }
            },
            "/projects/{project_id}/missing": {
                "get": {
                    "operationId": "get_missing",
                    "summary": "Something that does not exist",
                    "parameters": [
                        {"name": "project_id", "in": "path", "required": true, "schema": {"type": "string"}}
                    ],
                    "responses": {"404": {"description": "never found"}}
                }
            }
        }
    })
}

pub async fn start_api() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/openapi.json", get(|| async { Json(api_doc()) }))
        .route(
            "/projects/{project_id}/tasks",
            get(
                |State(seen): State<Seen>,
                 UrlPath(project): UrlPath<String>,
                 Query(q): Query<std::collections::BTreeMap<String, String>>,
                 headers: HeaderMap| async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let auth_sha256 = digest(auth);
                    seen.lock()
                        .unwrap()
                        .push((project.clone(), auth_sha256.clone()));
                    Json(json!({
                        "project": project,
                        "status": q.get("status"),
                        "auth_sha256": auth_sha256,
                        "tasks": ["write the spec"],
                    }))
                },
            ),
        )
        .route(
            "/projects/{project_id}/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such thing here") }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

pub fn agent_file(dir: &std::path::Path, model_url: &str, api: SocketAddr) -> std::path::PathBuf {
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: callbacks
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You manage one project's tasks.
  parameters:
    - {{name: project_id, scope: session}}
    - {{name: callback_token, secret: true, scope: session}}
  toolboxes:
    - openapi:
        spec: "http://{api}/openapi.json"
        baseUrl: "http://{api}"
        timeoutSeconds: 10
        secrets:
          - source: {{param: callback_token}}
            header: {{name: Authorization, template: "Bearer {{{{secret}}}}"}}
        bindings:
          - {{arg: project_id, value: {{param: project_id}}}}
"#
    );
    let path = dir.join("callbacks.yaml");
    std::fs::write(&path, text).unwrap();
    path
}
