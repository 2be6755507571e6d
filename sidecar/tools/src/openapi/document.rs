//! Reading an OpenAPI 3.x document into operations: one per path and
//! method, with its arguments (path, query and JSON body properties) and
//! their schemas, local `$ref`s resolved.

use serde_json::{json, Map, Value};

use crate::{ArgSpec, ToolSpec, Transport};

/// Where an argument goes in the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// `{name}` in the path template; the argument may be named otherwise
    /// (agents-exe's `p_<name>`).
    Path(String),
    /// A query parameter of this name.
    Query(String),
    Body,
    /// A PostgREST column filter: `?col=op.value`, a bare value meaning `eq.`.
    Filter,
    /// A body field under another name than the argument's (PostgREST's
    /// `set_<col>` on PATCH, whose filters already use `<col>`).
    BodyField(String),
    /// The whole JSON body, as one object argument (agents-exe's `b` and
    /// PostgREST `body`): only the keys the document offers (`None`: it
    /// lists none), never one `reserved` (set by a bound argument), in any
    /// case.
    WholeBody {
        keys: Option<Vec<String>>,
        reserved: Vec<String>,
    },
    /// agents-exe's PostgREST `filters`: an object of column filters, one
    /// `?col=op.value` each; only these columns.
    Filters(Vec<String>),
    /// agents-exe's PostgREST `subset`: those of `limit`, `offset` and
    /// `columns` (sent as `select`) the document offers.
    Subset(Vec<String>),
    /// agents-exe's PostgREST `ranking`: `order`.
    Ranking,
}

/// One operation, ready to become a tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub spec: ToolSpec,
    /// `GET`, `POST`, …
    pub method: String,
    /// The path template (`/projects/{project_id}/tasks`).
    pub path: String,
    /// Each argument of `spec.args`, by name, and where it goes.
    pub locations: Vec<(String, Location)>,
    /// The operation takes a JSON body (even with no argument in it).
    pub has_body: bool,
    /// Fixed request headers (PostgREST's `Prefer`).
    pub headers: Vec<(String, String)>,
    /// The document's `operationId`, as written.
    pub operation_id: Option<String>,
    /// PostgREST's table; `None` for an OpenAPI operation.
    pub table: Option<String>,
}

impl Operation {
    /// What a toolbox's `filter` looks at.
    pub fn endpoint(&self) -> bindery_spec::filter::Endpoint<'_> {
        bindery_spec::filter::Endpoint {
            method: &self.method,
            path: &self.path,
            operation_id: self.operation_id.as_deref(),
            table: self.table.as_deref(),
        }
    }
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// How deep `$ref`s are inlined into argument schemas; past it, `{}`.
const MAX_REF_DEPTH: usize = 8;

/// A name the model can call: `[A-Za-z0-9_-]`, other characters become
/// `_`, runs of `_` collapse, at most 64 characters.
pub fn sanitize_name(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_matches('_');
    out.chars().take(64).collect()
}

/// Why a path template from a document cannot be called as written, if
/// so. A request goes to `baseUrl` + the path, and a URL parser reads the
/// two together: a path that does not start with `/` would be read into
/// the host (`@other.host/x`), and a `.`/`..` segment, a `%`-escape or a
/// `\` would be resolved or decoded into another path than the one a
/// `filter` saw. Such an operation is no tool.
pub fn unsafe_path(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("it does not start with `/`, so it would change the host the request goes to");
    }
    if path.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("it holds a space or a control character");
    }
    if path.contains(['\\', '%', '?', '#']) {
        return Some(
            "it holds `\\`, `%`, `?` or `#`, which a URL parser reads otherwise than a filter",
        );
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return Some(
            "it holds a `.` or `..` segment, which would move the request to another path",
        );
    }
    None
}

/// agents-exe's cleaning of a name for a model: each character that is
/// not a letter, a digit, `_` or `-` becomes `_`; a name that does not
/// start with a letter gets a `t` before it (`tool` when empty); runs of
/// `_` collapse and none is left at either end. Never cut.
pub fn agents_exe_clean(raw: &str) -> String {
    let mapped: String = raw
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let prefixed = match mapped.chars().next() {
        None => "tool".to_string(),
        Some(c) if c.is_alphabetic() => mapped,
        Some(_) => format!("t{mapped}"),
    };
    prefixed
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// The name agents-exe gives an OpenAPI operation's tool:
/// `openapi_openapi_<operationId>` (its toolbox name is always `openapi`),
/// or without an operationId `openapi_openapi_openapi_<method>_<path>`.
pub fn agents_exe_name(op: &Operation) -> String {
    let local = match &op.operation_id {
        Some(id) => agents_exe_clean(id),
        None => {
            let path = op.path.replace(['/', '{', '}'], "_").replacen("__", "_", 1);
            agents_exe_clean(&format!(
                "openapi_{}_{path}",
                op.method.to_ascii_lowercase()
            ))
        }
    };
    format!("openapi_openapi_{local}")
}

/// Why a document gives no operations at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// `openapi:` is missing or not 3.x (`None`: missing).
    #[error("not an OpenAPI 3.x document (`openapi: {}`); Swagger 2.0 is not supported", .version.as_deref().unwrap_or("missing"))]
    NotOpenApi3 { version: Option<String> },
    #[error("the document has no `paths` object")]
    NoPaths,
    /// A PostgREST document that cannot be read (see [`super::postgrest`]).
    #[error(transparent)]
    Postgrest(#[from] super::postgrest::PostgrestError),
}

/// Why one operation is skipped (a warning, not a failed load).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    #[error("a parameter has no name")]
    UnnamedParameter,
    #[error(
        "required parameter `{name}` is in `{place}`, which is not supported (path and query only)"
    )]
    UnsupportedPlace { name: String, place: String },
    /// `kinds`: the media types it offers instead (none: no content).
    #[error("its request body is not JSON ({}); only application/json bodies are supported", if .kinds.is_empty() { "no content".to_string() } else { .kinds.join(", ") })]
    NotJsonBody { kinds: Vec<String> },
    #[error("its JSON request body is not an object; only object bodies (whose properties become arguments) are supported")]
    BodyNotObject,
    #[error("two of its parameters (path, query or body) are both named `{name}`")]
    DuplicateName { name: String },
}

/// The document's operations, plus a warning for each one skipped.
pub fn operations(doc: &Value) -> Result<(Vec<Operation>, Vec<String>), DocumentError> {
    let version = doc.get("openapi").and_then(Value::as_str).unwrap_or("");
    if !version.starts_with('3') {
        return Err(DocumentError::NotOpenApi3 {
            version: (!version.is_empty()).then(|| version.to_string()),
        });
    }
    let paths = doc
        .get("paths")
        .and_then(Value::as_object)
        .ok_or(DocumentError::NoPaths)?;
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    for (path, item) in paths {
        let item = resolve(doc, item);
        let shared = item.get("parameters").and_then(Value::as_array);
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            match operation(doc, path, method, op, shared) {
                Ok(o) => ops.push(o),
                Err(why) => warnings.push(format!(
                    "operation {} {path} ({}) skipped: {why}",
                    method.to_ascii_uppercase(),
                    op.get("operationId")
                        .and_then(Value::as_str)
                        .unwrap_or("no operationId")
                )),
            }
        }
    }
    Ok((ops, warnings))
}

fn operation(
    doc: &Value,
    path: &str,
    method: &str,
    op: &Value,
    shared: Option<&Vec<Value>>,
) -> Result<Operation, OperationError> {
    let name = op
        .get("operationId")
        .and_then(Value::as_str)
        .map(sanitize_name)
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| sanitize_name(&format!("{method}_{path}")));
    let summary = op.get("summary").and_then(Value::as_str).unwrap_or("");
    let details = op.get("description").and_then(Value::as_str).unwrap_or("");
    let description = match (summary.is_empty(), details.is_empty()) {
        (false, false) => format!("{summary}\n\n{details}"),
        (false, true) => summary.to_string(),
        (true, false) => details.to_string(),
        (true, true) => format!("{} {path}", method.to_ascii_uppercase()),
    };

    let mut args: Vec<ArgSpec> = Vec::new();
    let mut locations = Vec::new();
    // Operation-level parameters override path-level ones (same name and `in`).
    let own = op.get("parameters").and_then(Value::as_array);
    let mut params: Vec<&Value> = Vec::new();
    for p in own.into_iter().flatten() {
        params.push(resolve(doc, p));
    }
    for p in shared.into_iter().flatten() {
        let p = resolve(doc, p);
        let same = |q: &&Value| q.get("name") == p.get("name") && q.get("in") == p.get("in");
        if !params.iter().any(same) {
            params.push(p);
        }
    }
    for p in params {
        let pname = p
            .get("name")
            .and_then(Value::as_str)
            .ok_or(OperationError::UnnamedParameter)?;
        let place = p.get("in").and_then(Value::as_str).unwrap_or("");
        let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
        let location = match place {
            "path" => Location::Path(pname.to_string()),
            "query" => Location::Query(pname.to_string()),
            "header" | "cookie" if !required => continue,
            other => {
                return Err(OperationError::UnsupportedPlace {
                    name: pname.to_string(),
                    place: other.to_string(),
                })
            }
        };
        let pdesc = p.get("description").and_then(Value::as_str).unwrap_or("");
        let schema = p
            .get("schema")
            .cloned()
            .unwrap_or(json!({"type": "string"}));
        push_arg(
            &mut args,
            &mut locations,
            ArgSpec {
                name: pname.to_string(),
                description: pdesc.to_string(),
                required: required || matches!(location, Location::Path(_)),
                schema: with_description(inline(doc, &schema, 0), pdesc),
                transport: Transport::Json,
            },
            location,
        )?;
    }

    let mut has_body = false;
    if let Some(body) = op.get("requestBody") {
        let body = resolve(doc, body);
        let content = body.get("content").and_then(Value::as_object);
        let json_schema = content.and_then(|c| {
            c.iter()
                .find(|(mime, _)| is_json(mime))
                .map(|(_, m)| m.get("schema").cloned().unwrap_or(json!({})))
        });
        let Some(schema) = json_schema else {
            let kinds = content
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default();
            return Err(OperationError::NotJsonBody { kinds });
        };
        has_body = true;
        let schema = inline(doc, &schema, 0);
        let is_object = schema.get("type").and_then(Value::as_str) == Some("object")
            || schema.get("properties").is_some();
        if !is_object {
            return Err(OperationError::BodyNotObject);
        }
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let empty = Map::new();
        let props = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        for (prop, pschema) in props {
            if pschema.get("readOnly").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            let pdesc = pschema
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            push_arg(
                &mut args,
                &mut locations,
                ArgSpec {
                    name: prop.clone(),
                    description: pdesc.to_string(),
                    required: required.contains(&prop.as_str()),
                    schema: pschema.clone(),
                    transport: Transport::Json,
                },
                Location::Body,
            )?;
        }
    }

    Ok(Operation {
        spec: ToolSpec {
            name: name.clone(),
            local_name: name,
            description,
            args,
            writes: !matches!(
                method.to_ascii_uppercase().as_str(),
                "GET" | "HEAD" | "OPTIONS"
            ),
        },
        method: method.to_ascii_uppercase(),
        path: path.to_string(),
        locations,
        has_body,
        headers: Vec::new(),
        operation_id: op
            .get("operationId")
            .and_then(Value::as_str)
            .map(str::to_string),
        table: None,
    })
}

fn push_arg(
    args: &mut Vec<ArgSpec>,
    locations: &mut Vec<(String, Location)>,
    arg: ArgSpec,
    location: Location,
) -> Result<(), OperationError> {
    if args.iter().any(|a| a.name == arg.name) {
        return Err(OperationError::DuplicateName { name: arg.name });
    }
    locations.push((arg.name.clone(), location));
    args.push(arg);
    Ok(())
}

fn is_json(mime: &str) -> bool {
    let base = mime.split(';').next().unwrap_or("").trim();
    base == "application/json" || base.ends_with("+json")
}

fn with_description(mut schema: Value, description: &str) -> Value {
    if let (Some(o), false) = (schema.as_object_mut(), description.is_empty()) {
        o.entry("description")
            .or_insert_with(|| Value::String(description.to_string()));
    }
    schema
}

/// Follow a local `$ref` (`#/components/…`), repeatedly; anything else is
/// returned as it is.
fn resolve<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..MAX_REF_DEPTH {
        match v
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|ptr| doc.pointer(ptr))
        {
            Some(target) => v = target,
            None => return v,
        }
    }
    v
}

/// `schema` with every local `$ref` replaced by its target, so that the
/// model receives a self-contained schema.
fn inline(doc: &Value, schema: &Value, depth: usize) -> Value {
    if depth > MAX_REF_DEPTH {
        return json!({});
    }
    match schema {
        Value::Object(o) => {
            if let Some(r) = o.get("$ref").and_then(Value::as_str) {
                return match r.strip_prefix('#').and_then(|p| doc.pointer(p)) {
                    Some(target) => inline(doc, target, depth + 1),
                    None => json!({}),
                };
            }
            Value::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), inline(doc, v, depth)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| inline(doc, v, depth)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_agents_exe_gives_them() {
        assert_eq!(agents_exe_clean("getPet"), "getPet");
        assert_eq!(agents_exe_clean("pets.list v2"), "pets_list_v2");
        // The `t` comes before the runs of `_` collapse, as in agents-exe.
        assert_eq!(agents_exe_clean("__a__b__"), "t_a_b");
        assert_eq!(agents_exe_clean("2fa-check"), "t2fa-check");
        assert_eq!(agents_exe_clean(""), "tool");
        let op = |id: Option<&str>, method: &str, path: &str| Operation {
            spec: ToolSpec {
                name: String::new(),
                local_name: String::new(),
                description: String::new(),
                args: Vec::new(),
                writes: false,
            },
            method: method.into(),
            path: path.into(),
            locations: Vec::new(),
            has_body: false,
            headers: Vec::new(),
            operation_id: id.map(str::to_string),
            table: None,
        };
        assert_eq!(
            agents_exe_name(&op(Some("getPet"), "GET", "/pets/{id}")),
            "openapi_openapi_getPet"
        );
        assert_eq!(
            agents_exe_name(&op(None, "GET", "/pets/{id}")),
            "openapi_openapi_openapi_get_pets_id"
        );
    }

    fn doc() -> Value {
        json!({
            "openapi": "3.0.3",
            "info": {"title": "t", "version": "1"},
            "paths": {
                "/projects/{project_id}/tasks": {
                    "parameters": [
                        {"name": "project_id", "in": "path", "schema": {"type": "integer"}}
                    ],
                    "get": {
                        "operationId": "list_tasks",
                        "summary": "List a project's tasks",
                        "parameters": [
                            {"name": "status", "in": "query", "required": false,
                             "description": "open or done",
                             "schema": {"type": "string", "enum": ["open", "done"]}},
                            {"$ref": "#/components/parameters/Limit"},
                            {"name": "X-Trace", "in": "header", "schema": {"type": "string"}}
                        ]
                    },
                    "post": {
                        "operationId": "tasks.create (v2)",
                        "description": "Create a task",
                        "requestBody": {
                            "required": true,
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewTask"}}}
                        }
                    }
                },
                "/upload": {
                    "post": {
                        "operationId": "upload",
                        "requestBody": {"content": {"multipart/form-data": {"schema": {"type": "object"}}}}
                    }
                },
                "/health": {"get": {}}
            },
            "components": {
                "parameters": {
                    "Limit": {"name": "limit", "in": "query", "required": true, "schema": {"type": "integer"}}
                },
                "schemas": {
                    "NewTask": {
                        "type": "object",
                        "required": ["title"],
                        "properties": {
                            "title": {"type": "string", "description": "what to do"},
                            "owner": {"$ref": "#/components/schemas/Person"},
                            "id": {"type": "integer", "readOnly": true}
                        }
                    },
                    "Person": {"type": "object", "properties": {"name": {"type": "string"}}}
                }
            }
        })
    }

    fn op<'a>(ops: &'a [Operation], name: &str) -> &'a Operation {
        ops.iter().find(|o| o.spec.name == name).unwrap()
    }

    #[test]
    fn path_and_query_parameters_become_arguments() {
        let (ops, _) = operations(&doc()).unwrap();
        let o = op(&ops, "list_tasks");
        assert_eq!(
            (o.method.as_str(), o.path.as_str()),
            ("GET", "/projects/{project_id}/tasks")
        );
        assert_eq!(o.spec.description, "List a project's tasks");
        assert!(!o.spec.writes, "a GET changes nothing");
        assert!(op(&ops, "tasks_create_v2").spec.writes, "a POST may");
        let names: Vec<(&str, bool)> = o
            .spec
            .args
            .iter()
            .map(|a| (a.name.as_str(), a.required))
            .collect();
        // Path parameters are always required; the header one is left out.
        assert_eq!(
            names,
            [("status", false), ("limit", true), ("project_id", true)]
        );
        assert_eq!(
            o.spec.arg("status").unwrap().schema,
            json!({"type": "string", "enum": ["open", "done"], "description": "open or done"})
        );
        assert_eq!(o.spec.arg("project_id").unwrap().schema["type"], "integer");
        assert!(o.locations.contains(&(
            "project_id".to_string(),
            Location::Path("project_id".into())
        )));
        assert!(!o.has_body);
    }

    #[test]
    fn a_json_body_object_gives_its_properties_with_refs_resolved() {
        let (ops, _) = operations(&doc()).unwrap();
        let o = op(&ops, "tasks_create_v2");
        assert_eq!(o.spec.description, "Create a task");
        assert!(o.has_body);
        let title = o.spec.arg("title").unwrap();
        assert!(title.required);
        assert_eq!(title.description, "what to do");
        let owner = o.spec.arg("owner").unwrap();
        assert!(!owner.required);
        assert_eq!(
            owner.schema,
            json!({"type": "object", "properties": {"name": {"type": "string"}}})
        );
        assert!(
            o.spec.arg("id").is_none(),
            "readOnly properties are not inputs"
        );
        assert!(o.locations.contains(&("title".to_string(), Location::Body)));
    }

    #[test]
    fn unsupported_bodies_are_skipped_with_a_warning_naming_the_operation() {
        let (ops, warnings) = operations(&doc()).unwrap();
        assert!(ops.iter().all(|o| o.spec.name != "upload"));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("POST /upload (upload)"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("multipart/form-data"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn an_operation_without_id_is_named_from_method_and_path() {
        let (ops, _) = operations(&doc()).unwrap();
        let o = op(&ops, "get_health");
        assert_eq!(o.spec.description, "GET /health");
    }

    #[test]
    fn names_are_sanitised() {
        assert_eq!(sanitize_name("listTasks"), "listTasks");
        assert_eq!(sanitize_name("tasks.create (v2)"), "tasks_create_v2");
        assert_eq!(
            sanitize_name("get_/projects/{id}/tasks"),
            "get_projects_id_tasks"
        );
        assert_eq!(sanitize_name("a-b_c"), "a-b_c");
        assert_eq!(sanitize_name(&"x".repeat(80)).len(), 64);
    }

    #[test]
    fn swagger_2_is_refused() {
        let err = operations(&json!({"swagger": "2.0", "paths": {}})).unwrap_err();
        assert_eq!(err, DocumentError::NotOpenApi3 { version: None });
        assert!(err.to_string().contains("OpenAPI 3.x"), "{err}");
    }
}
