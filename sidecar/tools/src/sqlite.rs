//! The SQLite toolbox: one tool, `sqlite_<name>`, that runs one SQL
//! statement against a database file the agent's author named.
//!
//! The model writes the SQL, so the statement is bounded on every side:
//! one statement a call; read-only (the file opened read-only, and every
//! statement must be one SQLite itself calls read-only) unless the
//! declaration says `readWrite`; never another file (`ATTACH`, `VACUUM
//! INTO`), a pragma or an extension, refused by SQLite's authorizer before
//! the statement runs; at most `maxRows` rows back; interrupted past
//! `timeoutSeconds`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};

use super::sqlite_versions::{Handle, Versions};
use super::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport};
use bindery_spec::SqliteToolbox;

/// Rows a result holds at most when the declaration does not say.
pub const DEFAULT_MAX_ROWS: u32 = 200;
/// Seconds a statement may run when the declaration does not say.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

#[derive(Clone)]
pub struct SqliteTool {
    spec: ToolSpec,
    /// The statement's argument: `query`, or agents-exe's `sql`.
    sql_arg: &'static str,
    read_write: bool,
    max_rows: usize,
    timeout: Duration,
    /// One connection, one statement at a time (the named file's; a
    /// versioned toolbox opens the copy each call reads).
    conn: Arc<Mutex<Connection>>,
    /// Versioned: the copies, and whether this is the `promote` tool.
    versions: Option<(Arc<Versions>, bool)>,
}

/// Why a database file cannot be opened as the toolbox uses it (at load,
/// or a versioned toolbox's copy at call time).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("database file {} does not exist; create it, or fix `path` (relative to the agent file)", .path.display())]
    Missing { path: PathBuf },
    #[error("cannot create database {}: {error}", .path.display())]
    Create {
        path: PathBuf,
        error: rusqlite::Error,
    },
    #[error("cannot open database {}: {error}", .path.display())]
    Open {
        path: PathBuf,
        error: rusqlite::Error,
    },
    /// Its limits (value and statement length, page cache) could not be set.
    #[error("cannot bound database {}: {error}", .path.display())]
    Bound {
        path: PathBuf,
        error: rusqlite::Error,
    },
    /// Its busy timeout, size limit or authorizer could not be set.
    #[error("cannot set up database {}: {error}", .path.display())]
    Setup {
        path: PathBuf,
        error: rusqlite::Error,
    },
    #[error("{} is not a usable SQLite database: {error}", .path.display())]
    NotADatabase {
        path: PathBuf,
        error: rusqlite::Error,
    },
}

/// The file at `path` as a statement may use it (see the module's docs).
fn open_conn(
    path: &Path,
    read_write: bool,
    max_bytes: Option<u64>,
) -> Result<Connection, OpenError> {
    let flags = if read_write {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let path_buf = || path.to_path_buf();
    let setup = |error| OpenError::Setup {
        path: path_buf(),
        error,
    };
    let mut conn = Connection::open_with_flags(path, flags).map_err(|error| OpenError::Open {
        path: path_buf(),
        error,
    })?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(setup)?;
    bound(&conn).map_err(|error| OpenError::Bound {
        path: path_buf(),
        error,
    })?;
    if let Some(max) = max_bytes {
        // Set before the authorizer, which denies every pragma.
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(setup)?;
        let pages = i64::try_from(max).unwrap_or(i64::MAX) / page.max(1);
        conn.pragma_update(None, "max_page_count", pages.max(1))
            .map_err(setup)?;
    }
    conn.authorizer(Some(authorize)).map_err(setup)?;
    Ok(conn)
}

impl SqliteTool {
    /// The toolbox's tool over the file at `path` (resolved by the caller);
    /// fails when the file cannot be opened as a database.
    pub fn open(
        tb: &SqliteToolbox,
        path: PathBuf,
        naming: bindery_spec::Naming,
    ) -> Result<SqliteTool, OpenError> {
        if !path.is_file() {
            if !tb.create {
                return Err(OpenError::Missing { path });
            }
            // An empty database, as SQLite's own default open makes.
            if let Err(error) = Connection::open(&path).and_then(|c| c.execute_batch("VACUUM")) {
                return Err(OpenError::Create { path, error });
            }
        }
        // A versioned toolbox never writes the named file.
        let conn = open_conn(&path, tb.read_write && tb.versioned.is_none(), None)?;
        // Checks the file really is a database.
        if let Err(error) = conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())) {
            return Err(OpenError::NotADatabase { path, error });
        }
        let access = if tb.read_write {
            "read-write"
        } else {
            "read-only"
        };
        let mut spec = ToolSpec {
            name: format!("sqlite_{}", tb.name),
            local_name: tb.name.clone(),
            description: format!(
                "{} Runs one SQL statement on an SQLite database ({access}); `params` fill its `?` placeholders.",
                tb.description.clone().unwrap_or_default()
            )
            .trim()
            .to_string(),
            args: vec![
                ArgSpec {
                    name: "query".into(),
                    description: "one SQL statement".into(),
                    required: true,
                    schema: json!({"type": "string", "description": "one SQL statement"}),
                    transport: Transport::Json,
                },
                ArgSpec {
                    name: "params".into(),
                    description: "values for the statement's `?` placeholders, in order".into(),
                    required: false,
                    schema: json!({"type": "array", "items": {"type": ["string", "number", "boolean", "null"]},
                                   "description": "values for the statement's `?` placeholders, in order"}),
                    transport: Transport::Json,
                },
            ],
            writes: tb.read_write,
        };
        let mut sql_arg = "query";
        if naming == bindery_spec::Naming::AgentsExe {
            // agents-exe's tool: `sqlite_<name>_query`, the statement as `sql`.
            spec.name = format!("sqlite_{}_query", tb.name);
            spec.args.truncate(1);
            spec.args[0].name = "sql".into();
            sql_arg = "sql";
            spec.description = spec
                .description
                .replace(" `params` fill its `?` placeholders.", "");
        }
        Ok(SqliteTool {
            spec,
            sql_arg,
            read_write: tb.read_write,
            max_rows: tb.max_rows.unwrap_or(DEFAULT_MAX_ROWS) as usize,
            timeout: Duration::from_secs(tb.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS)),
            conn: Arc::new(Mutex::new(conn)),
            versions: None,
        })
    }

    /// The toolbox's tools: [`SqliteTool::open`]'s, and for a versioned
    /// toolbox its `_promote` beside it, both over copies kept in `root`.
    pub fn open_all(
        tb: &SqliteToolbox,
        path: PathBuf,
        root: PathBuf,
        naming: bindery_spec::Naming,
    ) -> Result<Vec<SqliteTool>, OpenError> {
        let mut query = SqliteTool::open(tb, path.clone(), naming)?;
        let Some(v) = &tb.versioned else {
            return Ok(vec![query]);
        };
        let versions = Arc::new(Versions::new(
            path,
            root,
            &tb.name,
            v.shared,
            v.max_copies,
            v.max_bytes,
        ));
        let restore = ArgSpec {
            name: "restore_from".into(),
            description:
                "a `versionHandle` an earlier write of this session answered: start from that copy"
                    .into(),
            required: false,
            schema: json!({"type": "object", "description": "a `versionHandle` an earlier write of this session answered: start from that copy",
                "properties": {"session_id": {"type": "string"}, "turn_id": {"type": "string"},
                               "tool_call_index": {"type": "integer"}, "toolbox_name": {"type": "string"},
                               "timestamp": {"type": "string"}},
                "required": ["session_id", "turn_id", "tool_call_index", "toolbox_name"]}),
            transport: Transport::Json,
        };
        query.spec.args.push(restore.clone());
        query.spec.writes = true;
        query.spec.description.push_str(
            " A statement that writes runs on a new copy of the database and answers its `versionHandle`.",
        );
        let base = query
            .spec
            .name
            .strip_suffix("_query")
            .unwrap_or(&query.spec.name)
            .to_string();
        let promote = SqliteTool {
            spec: ToolSpec {
                name: format!("{base}_promote"),
                local_name: format!("{}_promote", tb.name),
                description: format!(
                    "Makes a copy of the `{}` database (the latest one, or `restore_from`) the database every new copy starts from.",
                    tb.name
                ),
                args: vec![restore],
                writes: true,
            },
            sql_arg: query.sql_arg,
            read_write: true,
            max_rows: query.max_rows,
            timeout: query.timeout,
            conn: query.conn.clone(),
            versions: Some((versions.clone(), true)),
        };
        query.versions = Some((versions, false));
        Ok(vec![query, promote])
    }
}

/// The longest string or blob a statement may make (`randomblob(9e8)`
/// is refused, not allocated): no more than a whole result may carry.
const MAX_VALUE_BYTES: i32 = 256 * 1024;
/// The most columns a result may have: with [`MAX_VALUE_BYTES`], what one
/// row can hold in memory (32 MiB).
const MAX_COLUMNS: i32 = 128;
/// The longest statement.
const MAX_SQL_BYTES: i32 = 100_000;
/// The page cache of a toolbox's connection (SQLite counts negative
/// sizes in KiB).
const CACHE_KIB: i64 = 4096;
/// The temporary tables one statement may make (a materialized CTE, a
/// sort, an automatic index): each has a page cache of its own, so their
/// number bounds its memory.
const MAX_TEMP_TABLES: usize = 16;

/// The text a result may carry; rows past it are left out (`truncated`).
const MAX_RESULT_BYTES: usize = 256 * 1024;

/// What one statement may take of the server's memory: a value's length,
/// the statement's, the page cache; temporary tables and sorts go to a
/// file, not memory; no memory-mapped reads.
fn bound(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::limits::Limit;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)?;
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)?;
    conn.set_limit(Limit::SQLITE_LIMIT_COLUMN, MAX_COLUMNS)?;
    conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
    conn.pragma_update(None, "temp_store", 1)?;
    conn.pragma_update(None, "mmap_size", 0)?;
    Ok(())
}

/// How many temporary tables `sql`'s program opens, read from its
/// `EXPLAIN` (nothing is run).
fn temp_tables(conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}"))?;
    // Unbound placeholders read as NULL: only the program is wanted.
    let mut rows = explain.raw_query();
    let mut n = 0;
    while let Some(row) = rows.next()? {
        let op: String = row.get(1)?;
        if matches!(
            op.as_str(),
            "OpenEphemeral" | "OpenAutoindex" | "SorterOpen"
        ) {
            n += 1;
        }
    }
    Ok(n)
}

/// What no statement may do, whatever the access: reach another file,
/// change how the connection behaves, or load code.
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Attach { .. } | AuthAction::Detach { .. } | AuthAction::Pragma { .. } => {
            Authorization::Deny
        }
        AuthAction::Function { function_name }
            if function_name.eq_ignore_ascii_case("load_extension") =>
        {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }
}

/// The first keyword of `sql`, past white space and comments, upper-cased.
fn first_keyword(sql: &str) -> String {
    let mut rest = sql;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    rest.chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}

fn to_sql(v: &Value) -> Result<rusqlite::types::Value, ToolError> {
    use rusqlite::types::Value as V;
    Ok(match v {
        Value::Null => V::Null,
        Value::Bool(b) => V::Integer(i64::from(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => V::Integer(i),
            None => V::Real(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => V::Text(s.clone()),
        other => {
            return Err(ToolError::InvalidArguments(format!(
                "`params` holds {}; give strings, numbers, booleans or null",
                bindery_spec::json_kind(other)
            )))
        }
    })
}

fn cell(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => json!(i),
        ValueRef::Real(f) => json!(f),
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => json!({"blob_bytes": b.len()}),
    }
}

/// Why a statement did not run to the end; the model is told.
#[derive(Debug, thiserror::Error)]
enum StatementError {
    #[error("give one statement a call (no `;` between statements)")]
    Several,
    #[error("the statement would make {0} temporary tables (materialized CTEs, sorts, indexes), more than the {MAX_TEMP_TABLES} one statement may; simplify it")]
    TempTables(usize),
    #[error("this database is read-only here: only statements that read (SELECT, WITH … SELECT) are allowed")]
    ReadOnly,
    #[error("the statement has {has} `?` placeholder(s) but `params` gives {given} value(s)")]
    Placeholders { has: usize, given: usize },
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// A database that does not open at call time fails the call.
fn failed(e: OpenError) -> ToolError {
    ToolError::Failed(e.to_string())
}

/// A statement kind no call may run, whatever the database: it would
/// reach another file or change how the connection behaves.
fn refuse_keyword(sql: &str) -> Result<(), ToolError> {
    let keyword = first_keyword(sql);
    if matches!(keyword.as_str(), "VACUUM" | "ATTACH" | "DETACH" | "PRAGMA") {
        return Err(ToolError::Failed(format!(
            "`{keyword}` statements are not allowed here"
        )));
    }
    Ok(())
}

impl SqliteTool {
    fn run(&self, sql: &str, params: &[rusqlite::types::Value]) -> Result<Value, ToolError> {
        refuse_keyword(sql)?;
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.execute(&mut conn, self.read_write, sql, params)
    }

    /// A versioned toolbox's statement: a read on the copy the call
    /// reads, a write on a new copy of it.
    fn run_versioned(
        &self,
        versions: &Versions,
        ctx: &CallContext,
        restore: Option<&Handle>,
        sql: &str,
        params: &[rusqlite::types::Value],
    ) -> Result<Value, ToolError> {
        refuse_keyword(sql)?;
        let source = versions.source(ctx, restore)?;
        let mut read = open_conn(&source, false, None).map_err(failed)?;
        let reads = read
            .prepare(sql)
            .map(|s| s.readonly())
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        if reads || !self.read_write {
            return self.execute(&mut read, false, sql, params);
        }
        drop(read);
        let (copy, handle, room) = versions.copy(ctx, &source)?;
        let written = open_conn(&copy, true, Some(room))
            .map_err(failed)
            .and_then(|mut conn| self.execute(&mut conn, true, sql, params));
        let size = std::fs::metadata(&copy).map_or(0, |m| m.len());
        versions.settle(ctx, room, size);
        let mut out = written?;
        versions.advance(ctx, copy);
        out["versionHandle"] = json!(handle);
        Ok(out)
    }

    /// `promote`: the copy the call reads becomes the named file.
    fn promote(
        versions: &Versions,
        ctx: &CallContext,
        restore: Option<&Handle>,
    ) -> Result<Value, ToolError> {
        let source = versions.source(ctx, restore)?;
        let base = versions.base();
        if source == base {
            return Err(ToolError::Failed(
                "there is no copy to promote: no write of this scope yet, and no `restore_from`"
                    .into(),
            ));
        }
        // A whole file in place at once: a reader sees the old or the new.
        let next = base.with_extension("promoting");
        std::fs::copy(&source, &next)
            .and_then(|_| std::fs::rename(&next, base))
            .map_err(|e| ToolError::Failed(format!("cannot promote the copy: {e}")))?;
        Ok(
            json!({"promoted_from": restore.map_or_else(|| json!("latest"), |h| json!(h)),
                  "promoted_to": base.file_name().map(|n| n.to_string_lossy().into_owned())}),
        )
    }

    fn execute(
        &self,
        conn: &mut Connection,
        read_write: bool,
        sql: &str,
        params: &[rusqlite::types::Value],
    ) -> Result<Value, ToolError> {
        let deadline = Instant::now() + self.timeout;
        conn.progress_handler(10_000, Some(move || Instant::now() > deadline))
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let result = (|| {
            let mut stmt = conn.prepare(sql).map_err(|e| match e {
                rusqlite::Error::MultipleStatement => StatementError::Several,
                e => StatementError::Sqlite(e),
            })?;
            let temp_tables = temp_tables(conn, sql)?;
            if temp_tables > MAX_TEMP_TABLES {
                return Err(StatementError::TempTables(temp_tables));
            }
            if !read_write && !stmt.readonly() {
                return Err(StatementError::ReadOnly);
            }
            if stmt.parameter_count() != params.len() {
                return Err(StatementError::Placeholders {
                    has: stmt.parameter_count(),
                    given: params.len(),
                });
            }
            let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
            let mut rows = stmt.query(rusqlite::params_from_iter(params.iter()))?;
            let mut out = Vec::new();
            let mut truncated = false;
            let mut bytes = 0;
            while let Some(row) = rows.next()? {
                if out.len() == self.max_rows || bytes > MAX_RESULT_BYTES {
                    truncated = true;
                    break;
                }
                // Cell by cell: a row past the limit is left out whole
                // (the first one too), before it is copied any further.
                let mut cells = Vec::with_capacity(columns.len());
                for i in 0..columns.len() {
                    let v = row.get_ref(i).map(cell).unwrap_or(Value::Null);
                    bytes += v.as_str().map_or(8, str::len);
                    if bytes > MAX_RESULT_BYTES {
                        break;
                    }
                    cells.push(v);
                }
                if bytes > MAX_RESULT_BYTES {
                    truncated = true;
                    break;
                }
                out.push(Value::Array(cells));
            }
            drop(rows);
            let changes = conn.changes();
            Ok(
                json!({"columns": columns, "rows": out, "rowCount": out.len(),
                      "truncated": truncated, "changes": if columns.is_empty() { json!(changes) } else { Value::Null }}),
            )
        })();
        let _ = conn.progress_handler(0, None::<fn() -> bool>);
        result.map_err(|e| match e {
            // The progress handler stopped it at the deadline.
            StatementError::Sqlite(e)
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted) =>
            {
                ToolError::Failed(format!(
                    "the statement ran past {}s and was stopped",
                    self.timeout.as_secs()
                ))
            }
            e => ToolError::Failed(e.to_string()),
        })
    }
}

#[async_trait]
impl Tool for SqliteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let restore = match args.get("restore_from").and_then(|v| v.plain()) {
            None | Some(Value::Null) => None,
            Some(v) => Some(serde_json::from_value::<Handle>(v.clone()).map_err(|e| {
                ToolError::InvalidArguments(format!(
                    "`restore_from` must be a `versionHandle` as a write answered it: {e}"
                ))
            })?),
        };
        if let Some((versions, true)) = &self.versions {
            let (versions, ctx) = (versions.clone(), ctx.clone());
            let out = tokio::task::spawn_blocking(move || {
                SqliteTool::promote(&versions, &ctx, restore.as_ref())
            })
            .await
            .map_err(|e| ToolError::Failed(format!("the promote task failed: {e}")))??;
            return Ok(ToolOutput::Json(out));
        }
        let sql = match args.get(self.sql_arg).and_then(|v| v.plain()) {
            Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
            _ => {
                return Err(ToolError::InvalidArguments(format!(
                    "`{}` must be one SQL statement (a string)",
                    self.sql_arg
                )))
            }
        };
        let params = match args.get("params").and_then(|v| v.plain()) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.iter().map(to_sql).collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`params` must be an array of values".into(),
                ))
            }
        };
        let this = self.clone();
        let started = Instant::now();
        let ctx = ctx.clone();
        let data = tokio::task::spawn_blocking(move || match &this.versions {
            Some((versions, _)) => {
                this.run_versioned(versions, &ctx, restore.as_ref(), &sql, &params)
            }
            None => this.run(&sql, &params),
        })
        .await
        .map_err(|e| ToolError::Failed(format!("the query task failed: {e}")))??;
        let mut out = data;
        out["executionTime"] = json!(started.elapsed().as_secs_f64());
        Ok(ToolOutput::Json(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(read_write: bool) -> (tempfile::TempDir, SqliteTool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE t(a INTEGER, b TEXT); INSERT INTO t VALUES (1,'x'),(2,'y'),(3,'z');",
        )
        .unwrap();
        drop(c);
        let tb = SqliteToolbox {
            name: "db".into(),
            description: None,
            path: "db.sqlite".into(),
            read_write,
            create: false,
            max_rows: Some(2),
            timeout_seconds: Some(1),
            bindings: Vec::new(),
            versioned: None,
            toolgroup: None,
        };
        let t = SqliteTool::open(&tb, path, Default::default()).unwrap();
        (dir, t)
    }

    #[test]
    fn keywords_skip_comments() {
        assert_eq!(first_keyword("  -- hi\n /* x */ vacuum into 'f'"), "VACUUM");
        assert_eq!(first_keyword("select 1"), "SELECT");
    }

    #[test]
    fn reads_are_bounded_and_writes_refused_when_read_only() {
        let (_d, t) = tool(false);
        let v = t.run("SELECT a, b FROM t ORDER BY a", &[]).unwrap();
        assert_eq!(v["rowCount"], 2);
        assert_eq!(v["truncated"], true);
        let err = t.run("DELETE FROM t", &[]).unwrap_err().to_string();
        assert!(err.contains("read-only"), "{err}");
        let err = t
            .run("SELECT 1; DELETE FROM t", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("one statement"), "{err}");
        let err = t
            .run("ATTACH DATABASE '/tmp/other.sqlite' AS o", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not allowed"), "{err}");
        let err = t
            .run("/* */ SELECT * FROM pragma_table_info('t')", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not authorized"), "{err}");
        let v = t.run("SELECT b FROM t WHERE a = ?", &[2.into()]).unwrap();
        assert_eq!(v["rows"], json!([["y"]]));
        let err = t
            .run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("stopped"), "{err}");
    }

    /// A statement cannot make the server allocate without bound: a huge
    /// value is refused, and a result's text is cut at its limit.
    #[test]
    fn a_statement_takes_bounded_memory() {
        let (_d, t) = tool(false);
        for sql in [
            "SELECT randomblob(900000000)",
            "SELECT length(randomblob(900000000))",
            "SELECT zeroblob(2000000)",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 2000) SELECT length(group_concat(hex(randomblob(1000)))) FROM c",
        ] {
            let err = t.run(sql, &[]).unwrap_err().to_string();
            assert!(err.contains("too big"), "{sql}: {err}");
        }
        let long = format!("SELECT '{}'", "x".repeat(MAX_SQL_BYTES as usize));
        let err = t.run(&long, &[]).unwrap_err().to_string();
        assert!(err.contains("too long"), "{err}");
        let v = t
            .run(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 5) SELECT hex(randomblob(100000)) FROM c",
                &[],
            )
            .unwrap();
        assert_eq!(v["truncated"], true, "{}", v["rowCount"]);
        assert_eq!(v["rowCount"], 1);
        // One row of many columns each near the value limit: left out
        // whole, not kept because it is the first.
        let wide = format!(
            "WITH t(x) AS (SELECT printf('%.*c', 200000, 'x')) SELECT {} FROM t",
            vec!["x"; 100].join(",")
        );
        let v = t.run(&wide, &[]).unwrap();
        assert_eq!(
            (v["truncated"].clone(), v["rowCount"].clone()),
            (json!(true), json!(0))
        );
        let err = t
            .run(&format!("SELECT {}", vec!["1"; 200].join(",")), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("too many columns"), "{err}");
        // Many materialized CTEs, each a temporary table with a cache.
        let ctes: Vec<String> = (0..40)
            .map(|i| format!("a{i} AS MATERIALIZED (SELECT zeroblob(1000) AS b)"))
            .collect();
        let sums: Vec<String> = (0..40)
            .map(|i| format!("(SELECT count(b) FROM a{i})"))
            .collect();
        let sql = format!("WITH {} SELECT {}", ctes.join(","), sums.join("+"));
        let err = t.run(&sql, &[]).unwrap_err().to_string();
        assert!(err.contains("temporary tables"), "{err}");
        let v = t
            .run(
                "WITH a AS MATERIALIZED (SELECT a FROM t) SELECT count(*) FROM a",
                &[],
            )
            .unwrap();
        assert_eq!(v["rows"], json!([[3]]));
    }

    /// SQLite's interrupt at the deadline is told as the timeout, by its
    /// code (not its text).
    #[test]
    fn a_statement_past_its_time_is_stopped() {
        let (_d, mut t) = tool(false);
        t.timeout = Duration::ZERO;
        let err = t
            .run(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
                &[],
            )
            .unwrap_err();
        assert_eq!(
            err,
            ToolError::Failed("the statement ran past 0s and was stopped".into())
        );
    }

    #[test]
    fn a_missing_or_foreign_file_does_not_open() {
        let (d, _t) = tool(false);
        let mut tb = SqliteToolbox {
            name: "db".into(),
            description: None,
            path: "none.sqlite".into(),
            read_write: false,
            create: false,
            max_rows: None,
            timeout_seconds: None,
            bindings: Vec::new(),
            versioned: None,
            toolgroup: None,
        };
        let none = d.path().join("none.sqlite");
        let Err(err) = SqliteTool::open(&tb, none.clone(), Default::default()) else {
            panic!("a missing file opened")
        };
        assert!(matches!(err, OpenError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let text = d.path().join("notes.sqlite");
        std::fs::write(&text, "not a database, just text long enough to be read").unwrap();
        let Err(err) = SqliteTool::open(&tb, text, Default::default()) else {
            panic!("a text file opened as a database")
        };
        // SQLite finds out at the first page it reads.
        assert!(
            matches!(
                err,
                OpenError::Open { .. } | OpenError::Bound { .. } | OpenError::NotADatabase { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("not a database"), "{err}");
        tb.create = true;
        assert!(SqliteTool::open(&tb, none, Default::default()).is_ok());
    }

    #[test]
    fn read_write_allows_changes_but_no_other_file() {
        let (d, t) = tool(true);
        let v = t.run("INSERT INTO t VALUES (4, 'w')", &[]).unwrap();
        assert_eq!(v["changes"], 1);
        let out = d.path().join("copy.sqlite");
        let err = t
            .run(&format!("VACUUM INTO '{}'", out.display()), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not allowed"), "{err}");
        assert!(!out.exists());
    }
}
