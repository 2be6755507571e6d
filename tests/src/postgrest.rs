//! A small server that follows PostgREST's conventions, over a real
//! PostgreSQL database, for the PostgREST toolbox's tests: no PostgREST
//! server can be installed on the test machines.
//!
//! Like PostgREST it serves, for the `public` tables of the database:
//! - `GET /`: an OpenAPI 2.0 document (`paths` per table with `get`,
//!   `post`, `patch`, `delete`; `parameters` `rowFilter.<table>.<column>`,
//!   `body.<table>`, `select`, `order`, `limit`, `offset`, …;
//!   `definitions` per table);
//! - `GET /t?col=op.value&select=a,b&order=a.desc&limit=n&offset=m`: rows
//!   as a JSON array (operators `eq`, `neq`, `gt`, `gte`, `lt`, `lte`,
//!   `like`, `ilike` with `*`, `is` null/true/false, `in.(a,b)`);
//! - `POST /t` (a JSON object or array), `PATCH /t?filters` (an object of
//!   new values), `DELETE /t?filters`: the changed rows when `Prefer:
//!   return=representation` asks for them, else an empty answer;
//! - errors as `{"code", "message"}` (SQLSTATE codes from the database).
//!
//! With a token, every table request needs `Authorization: Bearer TOKEN`
//! (401 otherwise), as PostgREST with a JWT secret would. Each request is
//! recorded (method, path and query, `Prefer`, whether it was authorized)
//! for the test to inspect.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio_postgres::Client;

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query string, decoded.
    pub target: String,
    pub prefer: Option<String>,
    pub authorized: bool,
}

struct Column {
    name: String,
    data_type: String,
    required: bool,
}

struct Shared {
    db: Client,
    tables: BTreeMap<String, Vec<Column>>,
    token: Option<String>,
    seen: Mutex<Vec<Seen>>,
}

pub struct PostgrestLike {
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PostgrestLike {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PostgrestLike {
    /// Serve the database at `db_url` on 127.0.0.1 (a port chosen now).
    pub async fn start(db_url: &str, token: Option<&str>) -> PostgrestLike {
        let (db, conn) = tokio_postgres::connect(db_url, tokio_postgres::NoTls)
            .await
            .expect("the test database accepts connections");
        tokio::spawn(conn);
        let rows = db
            .query(
                "SELECT c.table_name::text, c.column_name::text, c.data_type::text, \
                        (c.is_nullable = 'NO' AND c.column_default IS NULL)
                 FROM information_schema.columns c
                 JOIN information_schema.tables t USING (table_schema, table_name)
                 WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
                 ORDER BY c.table_name, c.ordinal_position",
                &[],
            )
            .await
            .expect("the catalog reads");
        let mut tables: BTreeMap<String, Vec<Column>> = BTreeMap::new();
        for r in rows {
            tables.entry(r.get(0)).or_default().push(Column {
                name: r.get(1),
                data_type: r.get(2),
                required: r.get(3),
            });
        }
        let shared = Arc::new(Shared {
            db,
            tables,
            token: token.map(str::to_string),
            seen: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/", get(root))
            .route("/{table}", axum::routing::any(table))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        PostgrestLike {
            url: format!("http://{addr}"),
            shared,
            task,
        }
    }

    /// Every table request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }
}

fn json_type(data_type: &str) -> &'static str {
    match data_type {
        "integer" | "bigint" | "smallint" => "integer",
        "numeric" | "real" | "double precision" => "number",
        "boolean" => "boolean",
        _ => "string",
    }
}

/// PostgREST's OpenAPI document for the tables.
fn document(s: &Shared) -> Value {
    let mut paths = serde_json::Map::new();
    let mut definitions = serde_json::Map::new();
    let mut parameters = serde_json::Map::new();
    for (name, value) in [
        (
            "select",
            json!({"name": "select", "in": "query", "description": "Filtering Columns", "required": false, "type": "string"}),
        ),
        (
            "order",
            json!({"name": "order", "in": "query", "description": "Ordering", "required": false, "type": "string"}),
        ),
        (
            "range",
            json!({"name": "Range", "in": "header", "description": "Limiting and Pagination", "required": false, "type": "string"}),
        ),
        (
            "rangeUnit",
            json!({"name": "Range-Unit", "in": "header", "required": false, "type": "string", "default": "items"}),
        ),
        (
            "offset",
            json!({"name": "offset", "in": "query", "description": "Limiting and Pagination", "required": false, "type": "string"}),
        ),
        (
            "limit",
            json!({"name": "limit", "in": "query", "description": "Limiting and Pagination", "required": false, "type": "string"}),
        ),
        (
            "preferReturn",
            json!({"name": "Prefer", "in": "header", "required": false, "type": "string", "enum": ["return=representation", "return=minimal", "return=none"]}),
        ),
        (
            "preferPost",
            json!({"name": "Prefer", "in": "header", "required": false, "type": "string", "enum": ["return=representation", "return=minimal", "return=none"]}),
        ),
    ] {
        parameters.insert(name.to_string(), value);
    }
    paths.insert("/".into(), json!({"get": {"tags": ["Introspection"], "summary": "OpenAPI description (this document)", "responses": {"200": {"description": "OK"}}}}));
    for (table, cols) in &s.tables {
        let mut props = serde_json::Map::new();
        let mut required = Vec::new();
        let mut filters = Vec::new();
        for c in cols {
            props.insert(
                c.name.clone(),
                json!({"type": json_type(&c.data_type), "format": c.data_type}),
            );
            if c.required {
                required.push(c.name.clone());
            }
            let key = format!("rowFilter.{table}.{}", c.name);
            parameters.insert(key.clone(), json!({"name": c.name, "in": "query", "required": false, "type": "string", "format": c.data_type}));
            filters.push(json!({"$ref": format!("#/parameters/{key}")}));
        }
        definitions.insert(
            table.clone(),
            json!({"type": "object", "required": required, "properties": props}),
        );
        parameters.insert(format!("body.{table}"), json!({"name": table, "in": "body", "required": false, "schema": {"$ref": format!("#/definitions/{table}")}}));
        let r = |n: &str| json!({"$ref": format!("#/parameters/{n}")});
        let body = json!({"$ref": format!("#/parameters/body.{table}")});
        let mut get_params = filters.clone();
        get_params.extend([
            r("select"),
            r("order"),
            r("range"),
            r("rangeUnit"),
            r("offset"),
            r("limit"),
        ]);
        let mut patch_params = filters.clone();
        patch_params.extend([body.clone(), r("preferReturn")]);
        let mut delete_params = filters.clone();
        delete_params.push(r("preferReturn"));
        let ok = json!({"200": {"description": "OK"}});
        paths.insert(format!("/{table}"), json!({
            "get": {"tags": [table], "parameters": get_params, "responses": ok},
            "post": {"tags": [table], "parameters": [body, r("select"), r("preferPost")], "responses": {"201": {"description": "Created"}}},
            "patch": {"tags": [table], "parameters": patch_params, "responses": {"204": {"description": "No Content"}}},
            "delete": {"tags": [table], "parameters": delete_params, "responses": {"204": {"description": "No Content"}}},
        }));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "PostgREST-like test server", "version": "test"},
        "host": "127.0.0.1",
        "basePath": "/",
        "schemes": ["http"],
        "consumes": ["application/json"],
        "produces": ["application/json"],
        "paths": paths,
        "definitions": definitions,
        "parameters": parameters,
    })
}

async fn root(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(document(&s)).into_response()
}

/// A PostgREST error answer.
struct Refusal {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        body: json!({"code": code, "message": message.into(), "details": null, "hint": null}),
    }
}

/// SQL built from a request: text and its parameters (all sent as text).
#[derive(Default)]
struct Sql {
    text: String,
    params: Vec<String>,
}

impl Sql {
    fn param(&mut self, v: String) -> String {
        self.params.push(v);
        format!("${}::text", self.params.len())
    }
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// `WHERE …` from the filters (`col=op.value`), every column checked.
fn filters(
    table: &str,
    cols: &[Column],
    pairs: &[(String, String)],
    sql: &mut Sql,
) -> Result<String, Refusal> {
    let mut conds = Vec::new();
    for (k, v) in pairs {
        if ["select", "order", "limit", "offset"].contains(&k.as_str()) {
            continue;
        }
        let col = cols.iter().find(|c| &c.name == k).ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "42703",
                format!("column {k} does not exist"),
            )
        })?;
        let (op, value) = v.split_once('.').ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "PGRST100",
                format!("failed to parse filter ({v})"),
            )
        })?;
        // Qualified: an UPDATE … FROM has the same columns twice.
        let c = format!("{}.{}", quote(table), quote(&col.name));
        let t = &col.data_type;
        let cond = match op {
            "eq" | "neq" | "gt" | "gte" | "lt" | "lte" => {
                let sym = match op {
                    "eq" => "=",
                    "neq" => "<>",
                    "gt" => ">",
                    "gte" => ">=",
                    "lt" => "<",
                    _ => "<=",
                };
                format!("{c} {sym} CAST({} AS {t})", sql.param(value.to_string()))
            }
            "like" | "ilike" => format!(
                "{c}::text {} {}",
                op.to_uppercase(),
                sql.param(value.replace('*', "%"))
            ),
            "is" => match value {
                "null" => format!("{c} IS NULL"),
                "true" => format!("{c} IS TRUE"),
                "false" => format!("{c} IS FALSE"),
                _ => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        "PGRST100",
                        format!("failed to parse filter ({v})"),
                    ))
                }
            },
            "in" => {
                let inner = value
                    .strip_prefix('(')
                    .and_then(|x| x.strip_suffix(')'))
                    .unwrap_or(value);
                format!(
                    "{c} = ANY(CAST({} AS {t}[]))",
                    sql.param(format!("{{{inner}}}"))
                )
            }
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "PGRST100",
                    format!("operator {op} is not offered by the test server"),
                ))
            }
        };
        conds.push(cond);
    }
    Ok(if conds.is_empty() {
        "TRUE".into()
    } else {
        conds.join(" AND ")
    })
}

fn known<'a>(cols: &[Column], name: &'a str) -> Result<&'a str, Refusal> {
    if cols.iter().any(|c| c.name == name) {
        Ok(name)
    } else {
        Err(error(
            StatusCode::BAD_REQUEST,
            "42703",
            format!("column {name} does not exist"),
        ))
    }
}

async fn table(
    State(s): State<Arc<Shared>>,
    Path(table): Path<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let pairs: Vec<(String, String)> = url_pairs(query.as_deref().unwrap_or(""));
    let prefer = headers
        .get("prefer")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let authorized = match &s.token {
        None => true,
        Some(t) => {
            headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some(&format!("Bearer {t}"))
        }
    };
    s.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        target: format!(
            "/{table}{}",
            if pairs.is_empty() {
                String::new()
            } else {
                format!(
                    "?{}",
                    pairs
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join("&")
                )
            }
        ),
        prefer: prefer.clone(),
        authorized,
    });
    if !authorized {
        return error(
            StatusCode::UNAUTHORIZED,
            "PGRST301",
            "JWT invalid or missing",
        )
        .into_response();
    }
    let Some(cols) = s.tables.get(&table) else {
        return error(
            StatusCode::NOT_FOUND,
            "42P01",
            format!("relation \"public.{table}\" does not exist"),
        )
        .into_response();
    };
    match run(&s, &table, cols, &method, &pairs, &body).await {
        Ok(rows) => {
            let wants_rows = prefer
                .as_deref()
                .is_some_and(|p| p.contains("return=representation"));
            let status = if method == Method::POST {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            if method == Method::GET || wants_rows {
                (status, [("content-type", "application/json")], rows).into_response()
            } else if method == Method::POST {
                StatusCode::CREATED.into_response()
            } else {
                StatusCode::NO_CONTENT.into_response()
            }
        }
        Err(r) => r.into_response(),
    }
}

async fn run(
    s: &Shared,
    table: &str,
    cols: &[Column],
    method: &Method,
    pairs: &[(String, String)],
    body: &[u8],
) -> Result<String, Refusal> {
    let mut sql = Sql::default();
    let t = quote(table);
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let body_json = || -> Result<Value, Refusal> {
        serde_json::from_slice(body).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "PGRST102",
                format!("invalid JSON body: {e}"),
            )
        })
    };
    let agg = |inner: &str, name: &str| {
        format!("WITH {name} AS ({inner}) SELECT coalesce(json_agg(row_to_json({name})), '[]'::json)::text FROM {name}")
    };
    sql.text = match *method {
        Method::GET => {
            let select = match get("select") {
                Some(list) => list
                    .split(',')
                    .map(|c| known(cols, c.trim()).map(quote))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(", "),
                None => "*".to_string(),
            };
            let wh = filters(table, cols, pairs, &mut sql)?;
            let mut q = format!("SELECT {select} FROM {t} WHERE {wh}");
            if let Some(order) = get("order") {
                let mut terms = Vec::new();
                for term in order.split(',') {
                    let mut parts = term.split('.');
                    let c = known(cols, parts.next().unwrap_or(""))?;
                    let dir = match parts.next() {
                        Some("desc") => " DESC",
                        _ => " ASC",
                    };
                    terms.push(format!("{}{dir}", quote(c)));
                }
                q.push_str(&format!(" ORDER BY {}", terms.join(", ")));
            }
            for (k, kw) in [("limit", "LIMIT"), ("offset", "OFFSET")] {
                if let Some(n) = get(k) {
                    let n: u64 = n.parse().map_err(|_| {
                        error(
                            StatusCode::BAD_REQUEST,
                            "PGRST103",
                            format!("{k} must be a number"),
                        )
                    })?;
                    q.push_str(&format!(" {kw} {n}"));
                }
            }
            agg(&q, "r")
        }
        Method::POST => {
            let v = body_json()?;
            let rows = match v {
                Value::Array(a) => a,
                o => vec![o],
            };
            let keys: Vec<String> = rows
                .first()
                .and_then(Value::as_object)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            let keys: Vec<String> = keys
                .iter()
                .map(|k| known(cols, k).map(quote))
                .collect::<Result<_, _>>()?;
            let p = sql.param(Value::Array(rows).to_string());
            let list = keys.join(", ");
            agg(&format!("INSERT INTO {t} ({list}) SELECT {list} FROM json_populate_recordset(null::{t}, {p}::json) RETURNING *"), "r")
        }
        Method::PATCH => {
            let v = body_json()?;
            let obj = v.as_object().cloned().unwrap_or_default();
            let p = sql.param(Value::Object(obj.clone()).to_string());
            let sets: Vec<String> = obj
                .keys()
                .map(|k| known(cols, k).map(|k| format!("{} = n.{}", quote(k), quote(k))))
                .collect::<Result<_, _>>()?;
            if sets.is_empty() {
                return Err(error(StatusCode::BAD_REQUEST, "PGRST102", "empty update"));
            }
            let wh = filters(table, cols, pairs, &mut sql)?;
            agg(&format!("UPDATE {t} SET {} FROM json_populate_record(null::{t}, {p}::json) n WHERE {wh} RETURNING {t}.*", sets.join(", ")), "r")
        }
        Method::DELETE => {
            let wh = filters(table, cols, pairs, &mut sql)?;
            agg(&format!("DELETE FROM {t} WHERE {wh} RETURNING *"), "r")
        }
        _ => {
            return Err(error(
                StatusCode::METHOD_NOT_ALLOWED,
                "PGRST117",
                format!("unsupported HTTP method: {method}"),
            ))
        }
    };
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = sql
        .params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let row = s.db.query_one(&sql.text, &params).await.map_err(|e| {
        let code = e
            .code()
            .map(|c| c.code().to_string())
            .unwrap_or_else(|| "PGRST000".into());
        let message = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string());
        error(StatusCode::BAD_REQUEST, &code, message)
    })?;
    Ok(row.get(0))
}

/// `a=1&b=x%20y` decoded.
fn url_pairs(q: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://x/?{q}"))
        .map(|u| {
            u.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}
