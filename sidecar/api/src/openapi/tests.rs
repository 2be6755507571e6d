//! The document's own checks: every route documented, every `$ref`
//! defined, security and links as the routes have them.

use std::collections::BTreeSet;

use serde_json::json;

use super::*;

/// Every route of the API as `(METHOD, path)`: the document lists
/// these and nothing else.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/agents"),
    ("GET", "/v1/agents/{slug}"),
    ("PUT", "/v1/agents/{slug}"),
    ("DELETE", "/v1/agents/{slug}"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/messages"),
    ("POST", "/v1/sessions/{id}/resume"),
    ("POST", "/v1/sessions/{id}/cancel"),
    ("POST", "/v1/sessions/{id}/fork"),
    ("POST", "/v1/continuations/{token}"),
    ("GET", "/v1/approvals"),
    ("POST", "/v1/approvals/{token}"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/audit"),
    ("PUT", "/v1/sessions/{id}/params"),
    ("DELETE", "/v1/sessions/{id}/token"),
    ("POST", "/v1/sessions/{id}/shares"),
    ("GET", "/v1/sessions/{id}/shares"),
    ("DELETE", "/v1/sessions/{id}/shares/{share_id}"),
    ("GET", "/v1/sessions/{id}/events"),
    ("POST", "/mcp"),
    ("GET", "/"),
    ("GET", "/chat.js"),
    ("GET", "/chat.css"),
];

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn doc() -> Value {
    document(crate::server::routes().into_openapi(), "1.2.3")
}

/// Every operation as `(METHOD, path, operation)`.
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            assert!(METHODS.contains(&method.as_str()), "{method} {path}");
            out.push((method.to_ascii_uppercase(), path.clone(), op));
        }
    }
    out
}

fn collect_refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    out.push(v.as_str().expect("$ref is a string"));
                } else {
                    collect_refs(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The value itself, or what its `$ref` points at.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.strip_prefix('#').expect("local ref"))
            .expect("ref resolves"),
        None => value,
    }
}

#[test]
fn is_an_openapi_3_1_document() {
    let doc = doc();
    let text = serde_json::to_string_pretty(&doc).expect("serialises");
    let back: Value = serde_json::from_str(&text).expect("parses back");
    assert_eq!(back, doc);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], "1.2.3");
    assert_eq!(doc["info"]["title"], "Bindery");
}

#[test]
fn every_route_is_documented_and_nothing_else() {
    let doc = doc();
    for (method, path) in ROUTES {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} missing");
    }
    let listed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(listed.len(), ROUTES.len(), "ROUTES has duplicates");
    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
    assert_eq!(documented, listed);
}

#[test]
fn every_ref_resolves_to_a_component() {
    let doc = doc();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 50, "only {} refs?", refs.len());
    for r in refs {
        let pointer = r
            .strip_prefix("#/components/")
            .unwrap_or_else(|| panic!("{r} is not a component ref"));
        assert!(!pointer.is_empty());
        assert!(
            doc.pointer(&r[1..]).is_some_and(Value::is_object),
            "{r} does not resolve"
        );
    }
}

#[test]
fn every_operation_has_an_id_responses_and_security() {
    let doc = doc();
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    let mut ids = BTreeSet::new();
    for (method, path, op) in operations(&doc) {
        let id = op["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
        assert!(ids.insert(id.to_owned()), "operationId {id} twice");

        let responses = op["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{method} {path}: no responses"));
        assert!(!responses.is_empty(), "{method} {path}: no responses");
        for (code, response) in responses {
            assert!(
                code.len() == 3 && code.chars().all(|c| c.is_ascii_digit()),
                "{method} {path}: response code {code}"
            );
            let response = resolve(&doc, response);
            assert!(
                response["description"].is_string(),
                "{method} {path} {code}: no description"
            );
            // Every error response carries the Error schema.
            if code.starts_with('4') || code.starts_with('5') {
                let mut refs = Vec::new();
                collect_refs(
                    &response["content"]["application/json"]["schema"],
                    &mut refs,
                );
                // MCP's errors are JSON-RPC responses, as MCP clients expect.
                let error = if path == "/mcp" {
                    "#/components/schemas/JsonRpcResponse"
                } else {
                    "#/components/schemas/Error"
                };
                assert!(
                    refs.contains(&error),
                    "{method} {path} {code}: not an {error}"
                );
            }
        }

        let security = op["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: no security"));
        for requirement in security {
            for scheme in requirement.as_object().expect("requirement").keys() {
                assert!(schemes.contains_key(scheme), "{method} {path}: {scheme}");
            }
        }
    }
    assert_eq!(ids.len(), ROUTES.len());
}

#[test]
fn path_parameters_are_declared() {
    let doc = doc();
    for (method, path, op) in operations(&doc) {
        let declared: BTreeSet<String> = op["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| resolve(&doc, p))
                    .filter(|p| p["in"] == "path")
                    .inspect(|p| assert_eq!(p["required"], true, "{method} {path}"))
                    .map(|p| p["name"].as_str().expect("name").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let in_path: BTreeSet<String> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        assert_eq!(declared, in_path, "{method} {path}");
    }
}

#[test]
fn security_matches_the_route() {
    let doc = doc();
    let schemes_of = |method: &str, path: &str| -> Vec<String> {
        doc["paths"][path][method]["security"]
            .as_array()
            .expect("security")
            .iter()
            .flat_map(|r| r.as_object().expect("requirement").keys().cloned())
            .collect()
    };
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert!(schemes_of("get", path).is_empty(), "{path}");
    }
    for (method, path) in [
        ("get", "/v1/sessions/{id}"),
        ("post", "/v1/sessions/{id}/messages"),
        ("post", "/v1/sessions/{id}/cancel"),
        ("get", "/v1/sessions/{id}/events"),
    ] {
        assert_eq!(
            schemes_of(method, path),
            ["ownerToken", "sessionToken", "shareToken", "identityToken"],
            "{method} {path}"
        );
    }
    for (method, path) in [
        ("get", "/v1/sessions"),
        ("post", "/v1/sessions"),
        ("post", "/v1/sessions/{id}/resume"),
        ("post", "/v1/sessions/{id}/fork"),
        ("put", "/v1/sessions/{id}/params"),
        ("delete", "/v1/sessions/{id}/token"),
        ("post", "/v1/sessions/{id}/shares"),
        ("get", "/v1/sessions/{id}/shares"),
        ("delete", "/v1/sessions/{id}/shares/{share_id}"),
        ("get", "/v1/agents"),
    ] {
        assert_eq!(
            schemes_of(method, path),
            ["ownerToken", "identityToken"],
            "{method} {path}"
        );
    }
    for (method, path) in [("get", "/v1/usage"), ("put", "/v1/agents/{slug}")] {
        assert_eq!(schemes_of(method, path), ["ownerToken"], "{method} {path}");
    }
    assert_eq!(
        schemes_of("post", "/mcp"),
        ["ownerToken", "mcpClientToken", "sessionToken"]
    );
    for scheme in ["sessionToken", "shareToken"] {
        assert_eq!(
            doc["components"]["securitySchemes"][scheme]["scheme"],
            "bearer"
        );
    }
}

/// A share is asked for by its mode (and a note of one short line), its
/// token is in the answer that makes it, and the list never has one.
#[test]
fn share_routes() {
    let doc = doc();
    let schema = |name: &str| doc["components"]["schemas"][name].clone();
    let body = &doc["paths"]["/v1/sessions/{id}/shares"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    assert_eq!(body["$ref"], "#/components/schemas/ShareRequest");
    let request = schema("ShareRequest");
    assert_eq!(request["required"], serde_json::json!(["mode"]));
    assert_eq!(request["additionalProperties"], false, "{request}");
    assert_eq!(request["properties"]["note"]["maxLength"], 200);
    let pattern = request["properties"]["note"]["pattern"].as_str().unwrap();
    assert_eq!(pattern, "^[^\\x00-\\x1f\\x7f-\\x9f]*$");
    assert_eq!(
        schema("ShareMode")["enum"],
        serde_json::json!(["read", "write"])
    );
    let made = schema("SharedView");
    for field in ["id", "mode", "token", "shared_by", "created_at", "link"] {
        assert!(made["properties"][field].is_object(), "SharedView.{field}");
    }
    for listed in [schema("ShareView"), schema("ShareList")] {
        let text = listed.to_string();
        assert!(
            !text.contains("\"token\"") && !text.contains("digest"),
            "{text}"
        );
    }
    let op = &doc["paths"]["/v1/sessions/{id}/shares/{share_id}"]["delete"];
    assert_eq!(op["operationId"], "revokeShare");
    assert!(op["responses"]["404"].is_object());
}

#[test]
fn params_token_and_fork_routes() {
    let doc = doc();
    let put = &doc["paths"]["/v1/sessions/{id}/params"]["put"];
    assert_eq!(put["operationId"], "setSessionParams");
    assert!(put["responses"]["200"].is_object());
    assert!(put["responses"]["403"].is_object());
    assert_eq!(
        put["responses"]["422"]["content"]["application/json"]["schema"]["allOf"][1]["properties"]
            ["error"]["enum"],
        json!(["unknown_params", "invalid_params"])
    );
    let body = resolve(
        &doc,
        &put["requestBody"]["content"]["application/json"]["schema"],
    );
    // The server takes a body without `params` (nothing changes).
    assert!(body.get("required").is_none(), "{body}");
    assert!(body["properties"]["params"].is_object());

    let delete = &doc["paths"]["/v1/sessions/{id}/token"]["delete"];
    assert!(delete["responses"]["204"].is_object());
    assert!(delete["responses"]["204"].get("content").is_none());

    let fork = &doc["paths"]["/v1/sessions/{id}/fork"]["post"];
    assert!(fork["responses"]["201"].is_object());
    assert!(fork["responses"]["403"].is_object());
    let body = resolve(
        &doc,
        &fork["requestBody"]["content"]["application/json"]["schema"],
    );
    assert_eq!(body["properties"]["at_turn"]["type"], "integer");
}

#[test]
fn continuations_take_a_result_or_a_decision() {
    let doc = doc();
    let op = &doc["paths"]["/v1/continuations/{token}"]["post"];
    for code in ["200", "404", "409"] {
        assert!(op["responses"][code].is_object(), "{code}");
    }
    let body = &doc["components"]["schemas"]["ContinuationRequest"]["properties"];
    for field in [
        "result", "approve", "reason", "resume", "params", "run", "choice", "input",
    ] {
        assert!(body[field].is_object(), "{field}");
    }
    let item = &doc["components"]["schemas"]["PendingItem"]["properties"];
    assert!(resolve(&doc, &item["disposition"])["enum"]
        .as_array()
        .unwrap()
        .contains(&json!("confirm")));
}

#[test]
fn session_view_never_carries_secret_values() {
    let doc = doc();
    let view = &doc["components"]["schemas"]["SessionView"];
    assert_eq!(
        view["properties"]["secret_params"]["items"]["type"],
        "string"
    );
    assert!(view["properties"]["pending"]["items"].is_object());
    let agent = &doc["components"]["schemas"]["ParameterView"];
    assert!(agent["properties"].get("value").is_none());
    assert!(agent["properties"].get("default").is_none());
}

#[test]
fn optional_parameters_and_bodies_may_be_left_out_not_null() {
    let doc = doc();
    for (method, path, op) in operations(&doc) {
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let body = &op["requestBody"]["content"]["application/json"]["schema"];
        for schema in params.iter().map(|p| &p["schema"]).chain([body]) {
            let text = schema.to_string();
            assert!(!text.contains(r#""null""#), "{method} {path}: {text}");
        }
    }
    for path in ["/v1/sessions/{id}/fork", "/v1/sessions/{id}/resume"] {
        let body = &doc["paths"][path]["post"]["requestBody"];
        assert_eq!(body["required"], false, "{path}: {body}");
        assert!(body["content"]["application/json"]["schema"]["$ref"].is_string());
    }
    let create = &doc["paths"]["/v1/sessions"]["post"]["requestBody"];
    assert_eq!(create["required"], true, "{create}");
}

#[test]
fn events_route_documents_every_kind() {
    let doc = doc();
    let ok = &doc["paths"]["/v1/sessions/{id}/events"]["get"]["responses"]["200"];
    assert!(ok["content"]["text/event-stream"].is_object());
    let kinds: BTreeSet<&String> = ok["x-events"]
        .as_object()
        .expect("x-events")
        .keys()
        .collect();
    let expected = [
        "run_started",
        "message",
        "delta",
        "tool_call",
        "tool_result",
        "run_finished",
        "params_changed",
        "pending",
        "resolved",
        "budget",
        "model_fallback",
        "model_downgrade",
        "access_revoked",
    ];
    assert_eq!(kinds.len(), expected.len());
    for kind in expected {
        assert!(kinds.contains(&kind.to_owned()), "{kind}");
    }
}

/// A turn's content is described as text or parts, an image or a file
/// part as its `data:` URL: what a session view shows of a tool's media
/// and of `run -m`'s files.
#[test]
fn a_turns_content_is_text_or_media_parts() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let message = &schemas["ChatMessage"];
    let text = message.to_string();
    assert!(text.contains("#/components/schemas/Content"), "{message:#}");
    let content = &schemas["Content"];
    let kinds = content["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{content:#}"));
    assert_eq!(kinds.len(), 2, "{content:#}");
    assert_eq!(kinds[0]["type"], "string", "{content:#}");
    let part = &schemas["ContentPart"];
    let parts = part["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{part:#}"));
    let types: Vec<&Value> = parts
        .iter()
        .map(|p| &p["properties"]["type"]["enum"][0])
        .collect();
    assert_eq!(types, ["text", "image_url", "file"], "{part:#}");
    assert_eq!(
        schemas["ImageUrl"]["required"],
        serde_json::json!(["url"]),
        "{:#}",
        schemas["ImageUrl"]
    );
    assert_eq!(
        schemas["FileData"]["required"],
        serde_json::json!(["filename", "file_data"])
    );
}
