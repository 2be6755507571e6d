//! PostgREST toolboxes: the OpenAPI (2.0) document PostgREST serves at its
//! root, read as one operation per table and allowed method. The tools are
//! OpenAPI tools (same requests, secrets, limits, bindings); what differs is
//! how the document is read:
//!
//! - `GET /t`: each column is an optional filter argument (`?col=op.value`,
//!   a bare value meaning `eq.value`), plus `select`, `order`, `limit`,
//!   `offset` when PostgREST offers them;
//! - `DELETE /t`: the column filters;
//! - `POST /t`: each column is a body argument;
//! - `PATCH /t`: the column filters, and `set_<col>` for the new values;
//!
//! writes ask for `Prefer: return=representation`, so the model sees the
//! rows it changed. Binding a column (`tenant_id`) therefore pins every
//! read, delete and update to `eq.<value>` and every insert to that value.

use serde_json::{json, Map, Value};

use super::document::{sanitize_name, Location, Operation};
use crate::{ArgSpec, ToolSpec, Transport};

/// PostgREST's filter operators: a value starting with one of these and a
/// dot is sent as is.
const OPERATORS: [&str; 25] = [
    "eq",
    "neq",
    "gt",
    "gte",
    "lt",
    "lte",
    "like",
    "ilike",
    "match",
    "imatch",
    "in",
    "is",
    "isdistinct",
    "fts",
    "plfts",
    "phfts",
    "wfts",
    "cs",
    "cd",
    "ov",
    "sl",
    "sr",
    "nxr",
    "nxl",
    "not",
];

/// The query value for a column filter: `op.value` as given, or `eq.value`.
pub fn filter_value(text: &str) -> String {
    match text.split_once('.') {
        Some((op, _)) if OPERATORS.contains(&op) || op == "adj" => text.to_string(),
        _ => format!("eq.{text}"),
    }
}

/// Why a `select` value cannot be sent, if so: PostgREST embeds another
/// table's rows for `other(*)` (or `k:other!inner(*)`), rows no filter of
/// this tool bounds; a tool reads its own table's columns only.
pub fn embeds(select: &str) -> Option<String> {
    select.contains(['(', ')', '!']).then(|| {
        format!(
            "`select` may name this table's columns only (`id,name`, `*`, `alias:col`), not embed another table: `{select}`"
        )
    })
}

/// Follow a local `$ref` (`#/parameters/…`, `#/definitions/…`).
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix('#')
            .and_then(|p| doc.pointer(p))
            .unwrap_or(&Value::Null),
        None => v,
    }
}

/// Why PostgREST's document gives no tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostgrestError {
    #[error("it has no `paths`: is it PostgREST's OpenAPI document (GET / on the server)?")]
    NoPaths,
    /// A `POST` or `PATCH` of a table whose row schema the document does not give.
    #[error("{method} {path} has no body schema")]
    NoBodySchema { method: String, path: String },
}

/// One tool per table and allowed method (`GET`, `POST`, `PATCH`,
/// `DELETE`), named `postgrest_<toolbox>_<method>_<table>`; RPC functions
/// are skipped with a warning.
pub fn operations(
    doc: &Value,
    toolbox: &str,
    allowed: &[String],
) -> Result<(Vec<Operation>, Vec<String>), PostgrestError> {
    let paths = doc
        .get("paths")
        .and_then(Value::as_object)
        .ok_or(PostgrestError::NoPaths)?;
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    for (path, item) in paths {
        if path == "/" {
            continue;
        }
        if path.starts_with("/rpc/") {
            warnings.push(format!(
                "{path}: RPC functions are not offered as tools; skipped"
            ));
            continue;
        }
        let table = path.trim_start_matches('/');
        for method in allowed {
            let Some(op) = item.get(method.to_ascii_lowercase()) else {
                continue;
            };
            ops.push(operation(doc, toolbox, table, path, method, op)?);
        }
    }
    Ok((ops, warnings))
}

fn operation(
    doc: &Value,
    toolbox: &str,
    table: &str,
    path: &str,
    method: &str,
    op: &Value,
) -> Result<Operation, PostgrestError> {
    let params: Vec<&Value> = op
        .get("parameters")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|p| resolve(doc, p)).collect())
        .unwrap_or_default();
    let refs: Vec<&str> = op
        .get("parameters")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|p| p["$ref"].as_str()).collect())
        .unwrap_or_default();
    let mut args = Vec::new();
    let mut locations = Vec::new();
    let mut push = |arg: ArgSpec, loc: Location| {
        locations.push((arg.name.clone(), loc));
        args.push(arg);
    };
    let arg = |name: &str, description: String, required: bool, schema: Value| ArgSpec {
        name: name.to_string(),
        description,
        required,
        schema,
        transport: Transport::Json,
    };
    let columns: Vec<(&str, &Value)> = params
        .iter()
        .zip(&refs)
        .filter(|(_, r)| r.starts_with("#/parameters/rowFilter."))
        .filter_map(|(p, _)| Some((p["name"].as_str()?, *p)))
        .collect();
    let filters = matches!(method, "GET" | "DELETE" | "PATCH");
    if filters {
        for (col, p) in &columns {
            let kind = p["format"]
                .as_str()
                .or(p["type"].as_str())
                .unwrap_or("text");
            let description = format!(
                "filter on column `{col}` ({kind}): a PostgREST operator and value, e.g. eq.5, gt.5, in.(1,2), like.*x*, is.null; a bare value means eq."
            );
            push(
                arg(
                    col,
                    description.clone(),
                    false,
                    json!({"type": "string", "description": description}),
                ),
                Location::Filter,
            );
        }
    }
    if method == "GET" {
        for (name, p) in params
            .iter()
            .filter_map(|p| Some((p["name"].as_str()?, *p)))
        {
            let (schema, hint) = match name {
                "select" => (
                    json!({"type": "string"}),
                    "columns to return, comma-separated (e.g. id,name)",
                ),
                "order" => (
                    json!({"type": "string"}),
                    "ordering, e.g. created_at.desc,name.asc",
                ),
                "limit" => (json!({"type": "integer"}), "at most this many rows"),
                "offset" => (json!({"type": "integer"}), "skip this many rows"),
                _ => continue,
            };
            let mut schema = schema;
            schema["description"] = json!(hint);
            let _ = p;
            push(
                arg(name, hint.to_string(), false, schema),
                Location::Query(name.to_string()),
            );
        }
    }
    let body_schema = params
        .iter()
        .find(|p| p["in"] == "body")
        .map(|p| resolve(doc, &p["schema"]))
        .filter(|s| s.is_object());
    let mut has_body = false;
    if matches!(method, "POST" | "PATCH") {
        has_body = true;
        let empty = Map::new();
        let schema = body_schema.ok_or_else(|| PostgrestError::NoBodySchema {
            method: method.to_string(),
            path: path.to_string(),
        })?;
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (col, s) in schema["properties"].as_object().unwrap_or(&empty) {
            let mut s = s.clone();
            if let Some(o) = s.as_object_mut() {
                // Swagger 2's formats (`bigint`, `text`) mean nothing to a model.
                o.remove("format");
            }
            let d = s["description"].as_str().unwrap_or("").to_string();
            if method == "POST" {
                push(
                    arg(
                        col,
                        format!("column `{col}`. {d}").trim().to_string(),
                        required.contains(&col.as_str()),
                        s,
                    ),
                    Location::Body,
                );
            } else {
                push(
                    arg(
                        &format!("set_{col}"),
                        format!("new value of column `{col}`"),
                        false,
                        s,
                    ),
                    Location::BodyField(col.clone()),
                );
            }
        }
    }
    let what = match method {
        "GET" => "Reads rows of",
        "POST" => "Inserts a row into",
        "PATCH" => "Updates the rows matching the filters in",
        _ => "Deletes the rows matching the filters from",
    };
    let mut description = format!("{what} table `{table}`.");
    if let Some(s) = op["summary"].as_str().or(op["description"].as_str()) {
        description.push(' ');
        description.push_str(s);
    }
    let local = sanitize_name(&format!("{}_{table}", method.to_ascii_lowercase()));
    Ok(Operation {
        spec: ToolSpec {
            name: format!("postgrest_{toolbox}_{local}"),
            local_name: local,
            description,
            args,
            writes: method != "GET",
        },
        method: method.to_string(),
        path: path.to_string(),
        locations,
        has_body,
        headers: if method == "GET" {
            Vec::new()
        } else {
            vec![("Prefer".to_string(), "return=representation".to_string())]
        },
        operation_id: None,
        table: Some(table.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of the document PostgREST serves at `/`.
    fn doc() -> Value {
        json!({
            "swagger": "2.0",
            "paths": {
                "/": {"get": {}},
                "/rpc/refresh": {"post": {}},
                "/invoices": {
                    "get": {"parameters": [
                        {"$ref": "#/parameters/rowFilter.invoices.id"},
                        {"$ref": "#/parameters/rowFilter.invoices.tenant_id"},
                        {"$ref": "#/parameters/select"}, {"$ref": "#/parameters/order"},
                        {"$ref": "#/parameters/range"}, {"$ref": "#/parameters/limit"}]},
                    "post": {"parameters": [{"$ref": "#/parameters/body.invoices"}, {"$ref": "#/parameters/preferPost"}]},
                    "patch": {"parameters": [
                        {"$ref": "#/parameters/rowFilter.invoices.id"},
                        {"$ref": "#/parameters/rowFilter.invoices.tenant_id"},
                        {"$ref": "#/parameters/body.invoices"}]},
                }
            },
            "parameters": {
                "rowFilter.invoices.id": {"name": "id", "in": "query", "type": "string", "format": "bigint"},
                "rowFilter.invoices.tenant_id": {"name": "tenant_id", "in": "query", "type": "string", "format": "text"},
                "select": {"name": "select", "in": "query", "type": "string"},
                "order": {"name": "order", "in": "query", "type": "string"},
                "range": {"name": "Range", "in": "header", "type": "string"},
                "limit": {"name": "limit", "in": "query", "type": "string"},
                "preferPost": {"name": "Prefer", "in": "header", "type": "string"},
                "body.invoices": {"name": "invoices", "in": "body", "schema": {"$ref": "#/definitions/invoices"}},
            },
            "definitions": {"invoices": {"type": "object", "required": ["id", "tenant_id"], "properties": {
                "id": {"type": "integer", "format": "bigint"},
                "tenant_id": {"type": "string", "format": "text"},
                "amount": {"type": "number", "format": "numeric"}}}}
        })
    }

    #[test]
    fn tables_become_tools_per_allowed_method() {
        let allowed: Vec<String> = ["GET", "POST", "PATCH"].map(String::from).to_vec();
        let (ops, warnings) = operations(&doc(), "db", &allowed).unwrap();
        let names: Vec<&str> = ops.iter().map(|o| o.spec.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "postgrest_db_get_invoices",
                "postgrest_db_post_invoices",
                "postgrest_db_patch_invoices"
            ]
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let arg_names = |i: usize| {
            ops[i]
                .spec
                .args
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            arg_names(0),
            ["id", "tenant_id", "select", "order", "limit"]
        );
        assert_eq!(
            ops[0].locations[1],
            ("tenant_id".to_string(), Location::Filter)
        );
        assert_eq!(arg_names(1), ["amount", "id", "tenant_id"]);
        assert!(ops[1].spec.arg("tenant_id").unwrap().required);
        assert!(!ops[1].spec.arg("amount").unwrap().required);
        assert_eq!(
            arg_names(2),
            ["id", "tenant_id", "set_amount", "set_id", "set_tenant_id"]
        );
        assert_eq!(
            ops[2].locations[2],
            (
                "set_amount".to_string(),
                Location::BodyField("amount".into())
            )
        );
        assert_eq!(
            ops[1].headers,
            [("Prefer".to_string(), "return=representation".to_string())]
        );
        assert!(ops[0].headers.is_empty());
        // Only GET by default: no write tool unless allowed.
        let (ops, _) = operations(&doc(), "db", &["GET".to_string()]).unwrap();
        assert_eq!(ops.len(), 1);
    }

    #[test]
    fn a_bare_filter_value_means_equal() {
        assert_eq!(filter_value("acme"), "eq.acme");
        assert_eq!(filter_value("gt.5"), "gt.5");
        assert_eq!(filter_value("in.(1,2)"), "in.(1,2)");
        assert_eq!(filter_value("acme.corp"), "eq.acme.corp");
        assert_eq!(filter_value("not.is.null"), "not.is.null");
    }

    #[test]
    fn agents_exe_groups_filters_subset_ranking_and_body() {
        use crate::openapi::agents_exe_args::regroup;
        use bindery_params::ParamValue;
        let allowed: Vec<String> = ["GET", "POST", "PATCH"].map(String::from).to_vec();
        let (ops, _) = operations(&doc(), "postgrest", &allowed).unwrap();
        let mut ops = ops.into_iter().map(|o| regroup(o, |a| a == "tenant_id"));
        let (get, post, patch) = (
            ops.next().unwrap(),
            ops.next().unwrap(),
            ops.next().unwrap(),
        );
        let names =
            |o: &Operation| -> Vec<String> { o.spec.args.iter().map(|a| a.name.clone()).collect() };
        // The bound column stays as it is; the rest is agents-exe's.
        assert_eq!(names(&get), ["tenant_id", "filters", "subset", "ranking"]);
        assert_eq!(names(&post), ["tenant_id", "body"]);
        assert_eq!(names(&patch), ["tenant_id", "filters", "body"]);
        assert_eq!(
            get.spec.arg("subset").unwrap().schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["columns", "limit"]
        );
        let call = |op: &Operation, pairs: Value| {
            let t = crate::openapi::tests::tool_of(op.clone(), vec![]);
            let args = pairs
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), ParamValue::Plain(v.clone())))
                .collect();
            t.request(&args)
        };
        let req = call(
            &get,
            json!({"tenant_id": "acme", "filters": {"id": "gt.5"},
                   "subset": {"columns": "id,amount", "limit": "10"},
                   "ranking": {"order": "id.desc"}}),
        )
        .unwrap();
        assert_eq!(
            req.url.as_str(),
            "http://api.test/invoices?tenant_id=eq.acme&id=gt.5&select=id%2Camount&limit=10&order=id.desc"
        );
        // No group takes the bound column, nor a key the document lacks,
        // nor a select that embeds another table.
        for bad in [
            json!({"tenant_id": "acme", "subset": {"columns": "id,k:api_keys!inner(*)"}}),
            json!({"tenant_id": "acme", "subset": {"columns": "*,clients(*)"}}),
            json!({"tenant_id": "acme", "filters": {"tenant_id": "globex"}}),
            json!({"tenant_id": "acme", "subset": {"offset": "1"}}),
            json!({"tenant_id": "acme", "ranking": {"order": "id", "x": 1}}),
            json!({"tenant_id": "acme", "filters": {"id": ["1"]}}),
        ] {
            assert!(call(&get, bad.clone()).is_err(), "{bad}");
        }
        // Bindery's own `select` argument embeds nothing either.
        let (native, _) = operations(&doc(), "postgrest", &allowed).unwrap();
        assert!(call(&native[0], json!({"select": "*,other(*)"})).is_err());
        assert!(call(&native[0], json!({"select": "id,n:amount"})).is_ok());
        let req = call(
            &post,
            json!({"tenant_id": "acme", "body": {"id": 9, "amount": 1.5}}),
        )
        .unwrap();
        assert_eq!(
            req.body,
            Some(json!({"tenant_id": "acme", "id": 9, "amount": 1.5}))
        );
        assert!(call(
            &post,
            json!({"tenant_id": "acme", "body": {"tenant_id": "globex"}})
        )
        .is_err());
        let req = call(
            &patch,
            json!({"tenant_id": "acme", "filters": {"id": "7"}, "body": {"amount": 2}}),
        )
        .unwrap();
        assert_eq!(req.method, reqwest::Method::PATCH);
        assert_eq!(
            req.url.as_str(),
            "http://api.test/invoices?tenant_id=eq.acme&id=eq.7"
        );
        assert_eq!(req.body, Some(json!({"amount": 2})));
    }
}
