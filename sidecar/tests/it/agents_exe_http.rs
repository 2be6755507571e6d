//! agents-exe's HTTP toolboxes as an agents-exe user wrote them, against
//! a pets API on 127.0.0.1 that records every request it gets: the
//! `Filter` decides which operations exist, the `Token` authenticates the
//! document's fetch and every call, the `Headers` go with every call; a
//! credential among them is kept as a secret. All through the binary.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::common::bin;

const TOKEN: &str = "pet-token-CANARY-7";
const API_KEY: &str = "pet-key-CANARY-8";

/// One request as the API saw it: method, path, Authorization, X-Tenant,
/// X-Api-Key.
type Seen = Arc<Mutex<Vec<[String; 5]>>>;

fn record(seen: &Seen, method: &Method, path: String, headers: &HeaderMap) {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    seen.lock().unwrap().push([
        method.to_string(),
        path,
        h("authorization"),
        h("x-tenant"),
        h("x-api-key"),
    ]);
}

fn pets_doc() -> Value {
    let id = json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    json!({
        "openapi": "3.0.0", "info": {"title": "pets", "version": "1"},
        "paths": {
            "/pets": {
                "get": {"operationId": "listPets", "responses": {"200": {"description": "pets"}}},
                "post": {"operationId": "createPet", "responses": {"201": {"description": "made"}}}
            },
            "/pets/{id}": {
                "get": {"operationId": "getPet", "parameters": id, "responses": {"200": {"description": "a pet"}}},
                "delete": {"operationId": "deletePet", "parameters": id, "responses": {"204": {"description": "gone"}}}
            },
            "/admin/pets/{id}": {
                "get": {"operationId": "auditPet", "parameters": id, "responses": {"200": {"description": "audit"}}}
            },
            // Paths a URL parser would read otherwise than the filter:
            // into the host, or resolved to /admin.
            "@127.0.0.2:9/stolen": {"get": {"operationId": "atHost", "responses": {"200": {"description": "x"}}}},
            "/pets/../admin/users": {"get": {"operationId": "dotDot", "responses": {"200": {"description": "x"}}}},
            "/pets/%2e%2e/admin/users": {"get": {"operationId": "escapedDots", "responses": {"200": {"description": "x"}}}},
            "/pets\\..\\admin": {"get": {"operationId": "backslashes", "responses": {"200": {"description": "x"}}}}
        }
    })
}

/// The API: its document only for the bearer token; every request recorded.
async fn start_pets() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/openapi.json",
            get(
                |State(seen): State<Seen>, method: Method, headers: HeaderMap| async move {
                    record(&seen, &method, "/openapi.json".into(), &headers);
                    if headers.get("authorization").and_then(|v| v.to_str().ok())
                        != Some(&format!("Bearer {TOKEN}"))
                    {
                        return Err(StatusCode::UNAUTHORIZED);
                    }
                    Ok(Json(pets_doc()))
                },
            ),
        )
        // As a server that cleans `..%2F` out of a path answers.
        .route(
            "/pets/redirect-me",
            get(|| async { axum::response::Redirect::permanent("/admin/pets/1") }),
        )
        .route(
            "/{*rest}",
            axum::routing::any(
                |State(seen): State<Seen>,
                 method: Method,
                 UrlPath(rest): UrlPath<String>,
                 headers: HeaderMap| async move {
                    record(&seen, &method, format!("/{rest}"), &headers);
                    Json(json!({"name": "Rex"}))
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn agent(dir: &Path, api: SocketAddr, filter: Value) -> std::path::PathBuf {
    let file = dir.join("pets.json");
    let doc = json!({
        "tag": "OpenAIAgentDescription",
        "contents": {
            "slug": "pets", "apiKeyId": "main-key", "flavor": "OpenAIv1",
            "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "pets",
            "systemPrompt": ["You look pets up."],
            "openApiToolboxes": [{"tag": "OpenAPIServer", "contents": {
                "SpecUrl": format!("http://{api}/openapi.json"),
                "BaseUrl": format!("http://{api}"),
                "Token": TOKEN,
                "Headers": {"X-Tenant": "acme", "X-Api-Key": API_KEY},
                "Filter": filter
            }}]
        }
    });
    std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    file
}

async fn run(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || Command::new(bin()).args(args).output().unwrap())
        .await
        .unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

async fn tool_call(file: &Path, tool: &str, args: Value) -> Output {
    run(vec![
        "tool-call".into(),
        "--agent-file".into(),
        file.display().to_string(),
        "--tool".into(),
        tool.into(),
        "--args".into(),
        args.to_string(),
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_token_and_headers_shape_what_an_openapi_toolbox_can_send() {
    let (api, seen) = start_pets().await;
    let dir = tempfile::tempdir().unwrap();
    // Read-only, and nothing under /admin.
    let file = agent(
        dir.path(),
        api,
        json!({"tag": "And", "contents": [
            {"tag": "MethodEquals", "contents": "get"},
            {"tag": "Not", "contents": {"tag": "PathPrefix", "contents": "/admin"}}
        ]}),
    );

    let listed = run(vec![
        "describe".into(),
        "--agent-file".into(),
        file.display().to_string(),
    ])
    .await;
    let said = text(&listed);
    assert!(listed.status.success(), "{said}");
    for kept in ["listPets", "getPet"] {
        assert!(said.contains(kept), "{kept} not in:\n{said}");
    }
    for gone in [
        "createPet",
        "deletePet",
        "auditPet",
        "atHost",
        "dotDot",
        "escapedDots",
        "backslashes",
    ] {
        assert!(!said.contains(gone), "{gone} offered:\n{said}");
    }
    assert!(!said.contains("CANARY"), "{said}");
    let checked = run(vec![
        "check".into(),
        "--agent-file".into(),
        file.display().to_string(),
    ])
    .await;
    for path in [
        "@127.0.0.2:9/stolen",
        "/pets/../admin/users",
        "/pets/%2e%2e/admin/users",
    ] {
        let line = format!("GET {path:?}: skipped, no tool: its path cannot be called as written");
        assert!(
            text(&checked).contains(&line),
            "{line} not in:\n{}",
            text(&checked)
        );
    }

    let got = tool_call(&file, "openapi_openapi_getPet", json!({"p_id": "7"})).await;
    assert!(got.status.success(), "{}", text(&got));
    assert!(text(&got).contains("Rex"), "{}", text(&got));
    assert!(!text(&got).contains("CANARY"), "{}", text(&got));

    // An allowed call the API redirects under /admin: not followed (the
    // filter judged /pets/…, not where the redirect goes).
    let moved = tool_call(
        &file,
        "openapi_openapi_getPet",
        json!({"p_id": "redirect-me"}),
    )
    .await;
    assert!(!moved.status.success(), "{}", text(&moved));
    assert!(
        text(&moved).contains("308") || text(&moved).contains("redirect"),
        "{}",
        text(&moved)
    );

    // A filtered-out operation is no tool: nothing is sent.
    let refused = tool_call(&file, "openapi_openapi_deletePet", json!({"p_id": "7"})).await;
    assert!(!refused.status.success(), "{}", text(&refused));

    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|r| r[1].starts_with("/admin")),
        "a request reached /admin: {seen:?}"
    );
    let bearer = format!("Bearer {TOKEN}");
    assert!(
        seen.iter().all(|[m, ..]| m == "GET"),
        "a request other than GET reached the API: {seen:?}"
    );
    // The document was fetched with the token and without the call headers.
    let fetch = seen.iter().find(|r| r[1] == "/openapi.json").unwrap();
    assert_eq!(fetch[2], bearer);
    assert_eq!((fetch[3].as_str(), fetch[4].as_str()), ("", ""));
    // The call carried the token and both headers.
    let calls: Vec<_> = seen.iter().filter(|r| r[1] == "/pets/7").collect();
    assert_eq!(calls.len(), 1, "{seen:?}");
    assert_eq!(
        calls[0],
        &[
            "GET".to_string(),
            "/pets/7".into(),
            bearer,
            "acme".into(),
            API_KEY.into()
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_leaves_nothing_is_said_and_without_the_token_the_fetch_fails() {
    let (api, _) = start_pets().await;
    let dir = tempfile::tempdir().unwrap();
    let file = agent(dir.path(), api, json!({"tag": "AlwaysFalse"}));
    let out = run(vec![
        "check".into(),
        "--agent-file".into(),
        file.display().to_string(),
    ])
    .await;
    assert!(
        text(&out).contains("`filter` leaves none of the document's 5 operations"),
        "{}",
        text(&out)
    );

    // The same file without its token: the document is refused (401).
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    doc["contents"]["openApiToolboxes"][0]["contents"]
        .as_object_mut()
        .unwrap()
        .remove("Token");
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = run(vec![
        "check".into(),
        "--agent-file".into(),
        file.display().to_string(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("HTTP 401"), "{}", text(&out));
}
