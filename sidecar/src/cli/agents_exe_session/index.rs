//! `session-index` and `session-search`: agents-exe's full-text index of
//! its session files, an SQLite database (FTS5, which rusqlite's
//! `bundled` SQLite is compiled with; trigram tokenizer: any
//! substring of three characters or more matches) with agents-exe's
//! tables (`session_index`, `search_content`, `tool_index`,
//! `index_metadata`), by default `.agents-search.db` in the working
//! directory.
//!
//! The files are agents-exe's `conv.<uuid>.json` in its session
//! directories ([`session_dirs`]); the first directory holding an id wins.
//! Where agents-exe falls short, this does what its options say:
//! a tool is the name the model called (`function.name`, each call once;
//! agents-exe records `unknown` for every call, twice), `--after` and
//! `--before` filter on the file's last write (agents-exe's files hold no
//! date, and it ignores them), and any query is safe (each word is
//! searched as a literal; words under three characters, which a trigram
//! index cannot match, are looked for in the text).

use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use rusqlite::{params_from_iter, Connection};
use serde_json::{json, Value};

use super::model::{Session, ToolResponse, TurnKind, UserTurn};

pub const DEFAULT_DB: &str = ".agents-search.db";

/// Why the search index or the session directories could not be used:
/// each names the file (`--db-path`, `agents-exe.cfg.json`) and what to do.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("no session directory: HOME is not set and no agents-exe.cfg.json names one (give --sessions-dir DIR)")]
    NoSessionDir,
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cfg(#[from] super::super::load::CfgError),
    #[error("{file}: \"sessions\" needs \"writeLocation\" (a directory), as agents-exe requires")]
    NoWriteLocation { file: String },
    /// `--db-path` names a file that is not an index: left untouched.
    #[error("--db-path {db}: {why}; it is not a session search index, so nothing was changed (name a new file, or the index's own file, with --db-path)")]
    NotAnIndex { db: String, why: &'static str },
    #[error("cannot create {dir}: {source}")]
    CreateDir { dir: String, source: std::io::Error },
    #[error("cannot open the search index {db}: {source}")]
    Open { db: String, source: rusqlite::Error },
    #[error(
        "cannot write the search index {db}: {source}; remove it with `session-index --clean`"
    )]
    Write { db: String, source: rusqlite::Error },
    #[error("search index: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: String,
        source: std::io::Error,
    },
    #[error("{given:?} is not a date YYYY-MM-DD")]
    NotADate { given: String },
}

/// agents-exe's session directories, in priority order: from the nearest
/// `agents-exe.cfg.json` (from `cwd` up) its `sessions.writeLocation`
/// then `sessions.readLocations`, else its `agentsLogs.logSessionsJsonPrefix`;
/// otherwise `~/.config/agents-exe/sessions`. `~` is the home directory;
/// other relative paths are from `cwd`, as agents-exe takes them.
pub fn session_dirs(cwd: &Path, home: Option<&Path>) -> Result<Vec<PathBuf>, IndexError> {
    let default = || {
        home.map(|h| vec![h.join(".config/agents-exe/sessions")])
            .ok_or(IndexError::NoSessionDir)
    };
    let Some((cfg, doc)) = super::super::load::read_agents_exe_cfg::<Value>(cwd)? else {
        return default();
    };
    let file = || cfg.display().to_string();
    let resolve = |p: &str| match (p.strip_prefix('~'), home) {
        (Some(rest), Some(h)) => PathBuf::from(format!("{}{rest}", h.display())),
        _ => cwd.join(p),
    };
    if let Some(sessions) = doc.get("sessions").filter(|s| !s.is_null()) {
        let write = sessions
            .get("writeLocation")
            .and_then(Value::as_str)
            .ok_or_else(|| IndexError::NoWriteLocation { file: file() })?;
        let read: Vec<&str> = sessions
            .get("readLocations")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut dirs: Vec<&str> = if read.contains(&write) {
            read
        } else {
            std::iter::once(write).chain(read).collect()
        };
        dirs.dedup();
        return Ok(dirs.into_iter().map(resolve).collect());
    }
    match doc
        .pointer("/agentsLogs/logSessionsJsonPrefix")
        .and_then(Value::as_str)
    {
        Some(prefix) => Ok(vec![resolve(prefix)]),
        None => default(),
    }
}

/// One of agents-exe's session files.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionFile {
    pub path: PathBuf,
    /// The uuid of `conv.<uuid>.json`.
    pub id: String,
    /// Last write, in nanoseconds since the epoch.
    pub mtime: i64,
}

/// The id in a file name `conv.<uuid>.json`.
pub fn session_id_of(name: &str) -> Option<String> {
    let id = name.strip_prefix("conv.")?.strip_suffix(".json")?;
    uuid::Uuid::parse_str(id).ok().map(|u| u.to_string())
}

/// The session files of `dirs` (a directory that is not there has none),
/// the first holding an id winning, the most recently written first.
pub fn session_files(dirs: &[PathBuf]) -> Vec<SessionFile> {
    let mut found: Vec<SessionFile> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<SessionFile> = entries
            .flatten()
            .filter_map(|e| {
                let id = session_id_of(&e.file_name().to_string_lossy())?;
                let meta = std::fs::metadata(e.path()).ok().filter(|m| m.is_file())?;
                Some(SessionFile {
                    path: e.path(),
                    id,
                    mtime: mtime_ns(&meta),
                })
            })
            .collect();
        here.sort_by(|a, b| a.path.cmp(&b.path));
        for f in here {
            if !found.iter().any(|g| g.id == f.id) {
                found.push(f);
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.mtime));
    found
}

fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// What is searched in a session, as agents-exe extracts it: system
/// prompts, queries and answers; with `tool_outputs`, the calls and
/// their results too. A line each.
pub fn searchable_text(s: &Session, tool_outputs: bool) -> String {
    let mut lines: Vec<String> = Vec::new();
    let user = |u: &UserTurn, lines: &mut Vec<String>| {
        lines.push(u.system_prompt.clone());
        lines.extend(u.query.clone());
        if tool_outputs {
            let results: String = u
                .responses
                .iter()
                .map(|(_, r)| {
                    let line = match r {
                        ToolResponse::Text(t) => t.clone(),
                        ToolResponse::Json(v) => compact(v),
                        ToolResponse::Media(m) => format!("[Media: {}]", m.mime),
                        ToolResponse::Mixed(p) => format!("[Mixed content with {} parts]", p.len()),
                    };
                    line + "\n"
                })
                .collect();
            lines.push(results);
        }
    };
    for t in &s.turns {
        match &t.kind {
            TurnKind::User(u) => user(u, &mut lines),
            TurnKind::Partial { user: u, .. } => user(u, &mut lines),
            TurnKind::Llm(l) => {
                lines.extend(l.text.clone());
                if tool_outputs {
                    lines.push(l.calls.iter().map(|c| compact(c) + "\n").collect());
                }
            }
        }
    }
    lines.into_iter().map(|l| l + "\n").collect()
}

/// agents-exe's `jsonToText`: compact JSON with escaped newlines and tabs
/// as spaces.
fn compact(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .replace("\\n", " ")
        .replace("\\t", " ")
}

/// Each tool the model called, and how often (each call once).
pub fn tool_counts(s: &Session) -> Vec<(String, i64)> {
    let mut counts = std::collections::BTreeMap::<String, i64>::new();
    for (_, _, c) in s.calls() {
        let name = super::model::call_name(c).unwrap_or("unknown");
        *counts.entry(name.to_string()).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// A user's query made safe for FTS5: its words, lowercased (as
/// agents-exe does, so `AND`/`OR`/`NOT` are words, not operators); those
/// of three characters or more each a quoted literal the trigram index
/// matches, the shorter ones apart (looked for in the text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The FTS5 expression, if any word is long enough for it.
    pub fts: Option<String>,
    pub short: Vec<String>,
    /// All the words, lowercased.
    pub words: Vec<String>,
}

pub fn query(text: &str) -> Query {
    let words: Vec<String> = text
        .to_lowercase()
        .split_whitespace()
        .map(String::from)
        .collect();
    let (long, short): (Vec<&String>, Vec<&String>) =
        words.iter().partition(|w| w.chars().count() >= 3);
    let fts = (!long.is_empty()).then(|| {
        long.iter()
            .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(" ")
    });
    Query {
        fts,
        short: short.into_iter().cloned().collect(),
        words,
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS session_index (
    session_id TEXT PRIMARY KEY,
    file_path TEXT NOT NULL,
    mtime INTEGER NOT NULL,
    agent_slug TEXT,
    turn_count INTEGER,
    first_turn_at TIMESTAMP,
    last_turn_at TIMESTAMP
);
CREATE VIRTUAL TABLE IF NOT EXISTS search_content USING fts5(session_id, content, tokenize='trigram');
CREATE TABLE IF NOT EXISTS tool_index (
    session_id TEXT REFERENCES session_index(session_id),
    tool_name TEXT NOT NULL,
    call_count INTEGER DEFAULT 1,
    PRIMARY KEY (session_id, tool_name)
);
CREATE TABLE IF NOT EXISTS index_metadata (key TEXT PRIMARY KEY, value TEXT);
CREATE INDEX IF NOT EXISTS idx_tool_index_session ON tool_index(session_id);
CREATE INDEX IF NOT EXISTS idx_tool_index_name ON tool_index(tool_name);
CREATE INDEX IF NOT EXISTS idx_session_index_mtime ON session_index(mtime);
";

/// Where the index is, what it reads, what it keeps.
#[derive(Clone, Debug)]
pub struct IndexConfig {
    pub db: PathBuf,
    pub dirs: Vec<PathBuf>,
    pub tool_outputs: bool,
}

/// Bindery's mark on its index (`PRAGMA application_id`, "BdIx"), so a
/// write or a clean never touches a file that is not one.
const APPLICATION_ID: i32 = 0x4264_4978;

/// What `--db-path` names, as far as writing an index goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Existing {
    Absent,
    Index,
}

/// The tables of agents-exe's index (FTS5 adds `search_content_*`): a
/// file with these and nothing else is an index agents-exe built.
fn is_index_table(name: &str) -> bool {
    matches!(
        name,
        "session_index" | "tool_index" | "index_metadata" | "search_content"
    ) || name.starts_with("search_content_")
}

fn refuse(db: &Path, why: &'static str) -> IndexError {
    IndexError::NotAnIndex {
        db: db.display().to_string(),
        why,
    }
}

/// Whether `db` is absent or an index (Bindery's, or agents-exe's); any
/// other file — a symbolic link, a directory, text, another program's
/// database — is refused untouched.
fn existing(db: &Path) -> Result<Existing, IndexError> {
    let meta = match std::fs::symlink_metadata(db) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::Absent),
        Err(source) => {
            return Err(IndexError::Read {
                path: db.display().to_string(),
                source,
            })
        }
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        return Err(refuse(
            db,
            "is a symbolic link (an index is not written through one)",
        ));
    }
    if meta.is_dir() {
        return Err(refuse(db, "is a directory"));
    }
    if !meta.is_file() {
        return Err(refuse(db, "is not a regular file"));
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
        | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let not_sqlite = |_| refuse(db, "is not an SQLite database");
    let conn = Connection::open_with_flags(db, flags).map_err(not_sqlite)?;
    let id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(not_sqlite)?;
    if id == APPLICATION_ID {
        return Ok(Existing::Index);
    }
    let mut st = conn
        .prepare("SELECT name, coalesce(sql, '') FROM sqlite_master WHERE type = 'table'")
        .map_err(not_sqlite)?;
    let tables: Vec<(String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|rows| rows.collect())
        .map_err(not_sqlite)?;
    // agents-exe's index whole: each of its tables, its full-text table
    // an FTS5 one, and nothing else; one table of the same name is not it.
    let has = |name: &str| tables.iter().any(|(t, _)| t == name);
    let fts = tables
        .iter()
        .any(|(t, sql)| t == "search_content" && sql.to_ascii_lowercase().contains("using fts5"));
    let agents_exes = id == 0
        && ["session_index", "tool_index", "index_metadata"]
            .iter()
            .all(|t| has(t))
        && fts
        && tables.iter().all(|(t, _)| is_index_table(t));
    if agents_exes {
        Ok(Existing::Index)
    } else {
        Err(refuse(db, "is another SQLite database"))
    }
}

/// The index, created if absent; refused if `db` is anything else.
fn open(db: &Path) -> Result<Connection, IndexError> {
    let was = existing(db)?;
    if was == Existing::Absent {
        if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| IndexError::CreateDir {
                dir: dir.display().to_string(),
                source,
            })?;
        }
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
        | rusqlite::OpenFlags::SQLITE_OPEN_CREATE
        | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(db, flags).map_err(|source| IndexError::Open {
        db: db.display().to_string(),
        source,
    })?;
    conn.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID};{SCHEMA}"
    ))
    .map_err(|source| IndexError::Write {
        db: db.display().to_string(),
        source,
    })?;
    Ok(conn)
}

fn set_meta(conn: &Connection, key: &str) -> Result<(), IndexError> {
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    conn.execute(
        "INSERT OR REPLACE INTO index_metadata (key, value) VALUES (?1, ?2)",
        (key, now.to_string()),
    )
    .map(drop)
    .map_err(IndexError::Sql)
}

/// What an indexing did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Indexed {
    pub indexed: usize,
    pub unchanged: usize,
    /// Files that are not an agents-exe session (or too large): passed over.
    pub skipped: Vec<String>,
    pub removed: usize,
}

/// The index rebuilt from nothing.
pub fn build(cfg: &IndexConfig) -> Result<Indexed, IndexError> {
    clean(cfg)?;
    let out = update(cfg)?;
    let conn = open(&cfg.db)?;
    set_meta(&conn, "last_full_build")?;
    Ok(out)
}

/// Sessions new or written since they were indexed are (re)indexed; those
/// gone are forgotten.
pub fn update(cfg: &IndexConfig) -> Result<Indexed, IndexError> {
    let mut conn = open(&cfg.db)?;
    let files = session_files(&cfg.dirs);
    let known = indexed_mtimes(&conn)?;
    let tx = conn.transaction().map_err(IndexError::Sql)?;
    let mut out = Indexed::default();
    for f in &files {
        if known.get(&f.id).is_some_and(|m| *m >= f.mtime) {
            out.unchanged += 1;
            continue;
        }
        let session = match super::read_agents_exe(&f.path) {
            Ok(s) => s,
            Err(e) => {
                // Remembered at this mtime, with nothing to search: not
                // stale until it is written again.
                forget(&tx, &f.id)?;
                tx.execute(
                    "INSERT INTO session_index (session_id, file_path, mtime) VALUES (?1, ?2, ?3)",
                    (&f.id, f.path.to_string_lossy(), f.mtime),
                )
                .map_err(IndexError::Sql)?;
                out.skipped.push(e.to_string());
                continue;
            }
        };
        index_one(&tx, f, &session, cfg.tool_outputs)?;
        out.indexed += 1;
    }
    let current: std::collections::HashSet<&str> = files.iter().map(|f| f.id.as_str()).collect();
    for id in known.keys().filter(|id| !current.contains(id.as_str())) {
        forget(&tx, id)?;
        out.removed += 1;
    }
    tx.commit().map_err(IndexError::Sql)?;
    set_meta(&conn, "last_incremental_update")?;
    Ok(out)
}

/// Every row about a session.
fn forget(conn: &Connection, id: &str) -> Result<(), IndexError> {
    for table in ["tool_index", "search_content", "session_index"] {
        conn.execute(&format!("DELETE FROM {table} WHERE session_id = ?1"), [id])
            .map_err(IndexError::Sql)?;
    }
    Ok(())
}

fn index_one(
    conn: &Connection,
    f: &SessionFile,
    s: &Session,
    tool_outputs: bool,
) -> Result<(), IndexError> {
    forget(conn, &f.id)?;
    conn.execute(
        "INSERT INTO session_index (session_id, file_path, mtime, agent_slug, turn_count)
         VALUES (?1, ?2, ?3, NULL, ?4)",
        (
            &f.id,
            f.path.to_string_lossy(),
            f.mtime,
            s.turns.len() as i64,
        ),
    )
    .map_err(IndexError::Sql)?;
    conn.execute(
        "INSERT INTO search_content (session_id, content) VALUES (?1, ?2)",
        (&f.id, searchable_text(s, tool_outputs)),
    )
    .map_err(IndexError::Sql)?;
    for (tool, n) in tool_counts(s) {
        conn.execute(
            "INSERT INTO tool_index (session_id, tool_name, call_count) VALUES (?1, ?2, ?3)",
            (&f.id, tool, n),
        )
        .map_err(IndexError::Sql)?;
    }
    Ok(())
}

fn indexed_mtimes(conn: &Connection) -> Result<std::collections::HashMap<String, i64>, IndexError> {
    let mut st = conn
        .prepare("SELECT session_id, mtime FROM session_index")
        .map_err(IndexError::Sql)?;
    let rows = st
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(IndexError::Sql)?;
    rows.collect::<Result<_, _>>().map_err(IndexError::Sql)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Current,
    Stale { stale: usize, total: usize },
    Missing,
}

pub fn status(cfg: &IndexConfig) -> Result<Status, IndexError> {
    if existing(&cfg.db)? == Existing::Absent {
        return Ok(Status::Missing);
    }
    let conn = open(&cfg.db)?;
    let known = indexed_mtimes(&conn)?;
    let files = session_files(&cfg.dirs);
    let stale = files
        .iter()
        .filter(|f| known.get(&f.id).is_none_or(|m| *m < f.mtime))
        .count();
    Ok(if stale == 0 {
        Status::Current
    } else {
        Status::Stale {
            stale,
            total: files.len(),
        }
    })
}

/// The index file removed (and SQLite's journal files beside it); a file
/// that is not an index is refused, and an absent one is nothing to do.
pub fn clean(cfg: &IndexConfig) -> Result<(), IndexError> {
    if existing(&cfg.db)? == Existing::Absent {
        return Ok(());
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let p = PathBuf::from(format!("{}{suffix}", cfg.db.display()));
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
            std::fs::remove_file(&p).map_err(|source| IndexError::Remove {
                path: p.display().to_string(),
                source,
            })?;
        }
    }
    Ok(())
}

/// `session-search`'s filters and output.
#[derive(Clone, Debug, Default)]
pub struct SearchOptions {
    pub query: String,
    /// Last written at or after this (ns since the epoch).
    pub after: Option<i64>,
    /// Last written before this (ns since the epoch).
    pub before: Option<i64>,
    /// Sessions calling any of these tools.
    pub tools: Vec<String>,
    pub agent: Option<String>,
    pub preview_lines: usize,
    pub limit: Option<usize>,
}

/// A `YYYY-MM-DD` day's start (UTC), in ns since the epoch.
pub fn day_start(s: &str) -> Result<i64, IndexError> {
    let d = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").map_err(|_| IndexError::NotADate {
        given: s.to_string(),
    })?;
    let days = d
        .signed_duration_since(chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default())
        .num_days();
    Ok(days.saturating_mul(86_400_000_000_000))
}

#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub session_id: String,
    pub file: String,
    pub agent: Option<String>,
    pub turns: i64,
    pub rank: f64,
    pub preview: Option<String>,
    pub matched: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub hits: Vec<Hit>,
    pub total: usize,
    pub millis: f64,
    pub updated: bool,
}

/// The sessions matching `opts`, best first (FTS5's rank).
pub fn search(cfg: &IndexConfig, opts: &SearchOptions, updated: bool) -> Result<Found, IndexError> {
    let started = Instant::now();
    let conn = open(&cfg.db)?;
    let q = query(&opts.query);
    let mut clauses = Vec::new();
    let mut params: Vec<String> = Vec::new();
    if let Some(fts) = &q.fts {
        params.push(fts.clone());
        clauses.push(format!("search_content MATCH ?{}", params.len()));
    }
    for w in &q.short {
        params.push(w.clone());
        clauses.push(format!("instr(lower(c.content), ?{}) > 0", params.len()));
    }
    if clauses.is_empty() {
        return Ok(Found {
            hits: Vec::new(),
            total: 0,
            millis: 0.0,
            updated,
        });
    }
    if let Some(a) = opts.after {
        params.push(a.to_string());
        clauses.push(format!("s.mtime >= CAST(?{} AS INTEGER)", params.len()));
    }
    if let Some(b) = opts.before {
        params.push(b.to_string());
        clauses.push(format!("s.mtime < CAST(?{} AS INTEGER)", params.len()));
    }
    if let Some(agent) = &opts.agent {
        params.push(agent.clone());
        clauses.push(format!("s.agent_slug = ?{}", params.len()));
    }
    if !opts.tools.is_empty() {
        let marks: Vec<String> = opts
            .tools
            .iter()
            .map(|t| {
                params.push(t.clone());
                format!("?{}", params.len())
            })
            .collect();
        clauses.push(format!(
            "c.session_id IN (SELECT session_id FROM tool_index WHERE tool_name IN ({}))",
            marks.join(", ")
        ));
    }
    let rank = if q.fts.is_some() { "c.rank" } else { "0.0" };
    let text = format!(
        "SELECT c.session_id, c.content, {rank}, s.file_path, s.agent_slug, s.turn_count
         FROM search_content c LEFT JOIN session_index s ON s.session_id = c.session_id
         WHERE {} ORDER BY {rank}, c.session_id",
        clauses.join(" AND ")
    );
    let mut st = conn.prepare(&text).map_err(IndexError::Sql)?;
    let rows = st
        .query_map(params_from_iter(params.iter()), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, f64>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<i64>>(5)?,
            ))
        })
        .map_err(IndexError::Sql)?;
    let mut hits = Vec::new();
    let mut total = 0;
    for row in rows {
        let (session_id, content, rank, file, agent, turns) = row.map_err(IndexError::Sql)?;
        total += 1;
        if opts.limit.is_some_and(|l| hits.len() >= l) {
            continue;
        }
        let lower = content.to_lowercase();
        hits.push(Hit {
            session_id,
            file: file.unwrap_or_default(),
            agent,
            turns: turns.unwrap_or(0),
            rank,
            preview: (opts.preview_lines > 0)
                .then(|| preview(&content, &q.words, opts.preview_lines))
                .flatten(),
            matched: q
                .words
                .iter()
                .filter(|w| lower.contains(w.as_str()))
                .cloned()
                .collect(),
        });
    }
    Ok(Found {
        hits,
        total,
        millis: started.elapsed().as_secs_f64() * 1000.0,
        updated,
    })
}

/// agents-exe's preview: around each place a word of the query occurs,
/// `lines × 40` characters, joined by ` ... `, at most 1000 characters.
pub fn preview(content: &str, words: &[String], lines: usize) -> Option<String> {
    const MAX: usize = 1000;
    let chars: Vec<char> = content.chars().collect();
    let lower: Vec<char> = content.to_lowercase().chars().collect();
    let half = lines.saturating_mul(40) / 2;
    let mut parts: Vec<String> = Vec::new();
    let mut length = 0;
    'words: for w in words {
        let w: Vec<char> = w.chars().collect();
        if w.is_empty() || w.len() > lower.len() {
            continue;
        }
        let mut at = 0;
        while at + w.len() <= lower.len() {
            if lower[at..at + w.len()] == w[..] {
                let start = at.saturating_sub(half).min(chars.len());
                let end = at.saturating_add(half).min(chars.len());
                let part: String = chars[start..end.max(start)].iter().collect();
                length += part.chars().count() + 5;
                parts.push(part.trim().to_string());
                if length > MAX {
                    break 'words;
                }
                at += w.len();
            } else {
                at += 1;
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join(" ... ").chars().take(MAX).collect())
}

/// `session-search --json`: agents-exe's `SearchResult` keys.
pub fn to_json(found: &Found) -> Value {
    json!({
        "resultItems": found.hits.iter().map(|h| json!({
            "resultMetadata": {
                "resultSessionId": h.session_id,
                "resultFilePath": h.file,
                "resultAgentSlug": h.agent,
                "resultTurnCount": h.turns,
                "resultFirstTurnAt": null,
                "resultLastTurnAt": null,
                "resultRank": h.rank,
            },
            "resultPreview": h.preview,
            "resultMatchedTerms": h.matched,
        })).collect::<Vec<_>>(),
        "resultTotalMatches": found.total,
        "resultQueryTimeMs": found.millis,
        "resultIndexWasUpdated": found.updated,
    })
}

/// `session-search`'s text output, as agents-exe prints it.
pub fn to_text(found: &Found) -> String {
    let mut out = format!(
        "Found {} matches\nQuery time: {}ms\n",
        found.total,
        found.millis.round() as i64
    );
    if found.updated {
        out.push_str("(Index was auto-updated)\n");
    }
    out.push('\n');
    for h in &found.hits {
        out.push_str("─────────────────────────────────────────\n");
        out.push_str(&format!("Session: {}\nFile: {}\n", h.session_id, h.file));
        if let Some(a) = &h.agent {
            out.push_str(&format!("Agent: {a}\n"));
        }
        out.push_str(&format!("Turns: {}\nRank: {}\n", h.turns, h.rank));
        if let Some(p) = &h.preview {
            out.push_str(&format!("Preview:\n{p}\n"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_query_is_safe_for_fts5() {
        let q = query("  Foo \"bar\" AND x* (y) col:umn NEAR/2 a ");
        assert_eq!(
            q.fts.as_deref(),
            Some(r#""foo" """bar""" "and" "(y)" "col:umn" "near/2""#)
        );
        assert_eq!(q.short, ["x*", "a"]);
        assert_eq!(query("   ").fts, None);
        let dir = tempfile::tempdir().unwrap();
        let cfg = IndexConfig {
            db: dir.path().join("i.db"),
            dirs: vec![],
            tool_outputs: false,
        };
        for nasty in [
            "\"", "a\"b OR", "NOT", "*", "^x", "-y", "a:b:c", "{a b}", "😀 ab", "''",
        ] {
            let found = search(
                &cfg,
                &SearchOptions {
                    query: nasty.into(),
                    ..Default::default()
                },
                false,
            );
            assert!(found.is_ok(), "{nasty}: {found:?}");
        }
    }

    #[test]
    fn preview_shows_the_words_in_their_context() {
        let words = vec!["needle".to_string()];
        let text = format!("{}NEEDLE{}", "a".repeat(100), "b".repeat(100));
        let p = preview(&text, &words, 1).unwrap();
        assert_eq!(p, format!("{}NEEDLE{}", "a".repeat(20), "b".repeat(14)));
        assert_eq!(preview("nothing", &words, 3), None);
        let many = "needle ".repeat(10_000);
        assert!(preview(&many, &words, 3).unwrap().chars().count() <= 1000);
    }

    #[test]
    fn session_files_are_agents_exes_and_the_first_directory_wins() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let id = "0b7c8c1e-5c3a-4d0e-9b1a-1c2d3e4f5a6b";
        for d in [a.path(), b.path()] {
            std::fs::write(d.join(format!("conv.{id}.json")), "{}").unwrap();
        }
        std::fs::write(a.path().join("conv.not-a-uuid.json"), "{}").unwrap();
        std::fs::write(a.path().join("notes.json"), "{}").unwrap();
        let files = session_files(&[a.path().into(), b.path().into(), "/nonexistent".into()]);
        assert_eq!(files.len(), 1);
        assert!(files[0].path.starts_with(a.path()));
        assert_eq!(files[0].id, id);
    }

    #[test]
    fn session_directories_are_agents_exes() {
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let sub = work.path().join("deep/er");
        std::fs::create_dir_all(&sub).unwrap();
        let h = Some(home.path());
        assert_eq!(
            session_dirs(&sub, h).unwrap(),
            [home.path().join(".config/agents-exe/sessions")]
        );
        let cfg = work.path().join("agents-exe.cfg.json");
        std::fs::write(
            &cfg,
            r#"{"sessions": {"writeLocation": "./s/", "readLocations": ["~/old", "./s/"]}}"#,
        )
        .unwrap();
        assert_eq!(
            session_dirs(&sub, h).unwrap(),
            [
                PathBuf::from(format!("{}/old", home.path().display())),
                sub.join("./s/")
            ]
        );
        std::fs::write(
            &cfg,
            r#"{"sessions": {"writeLocation": "w"}, "agentsLogs": {"logSessionsJsonPrefix": "x"}}"#,
        )
        .unwrap();
        assert_eq!(session_dirs(&sub, h).unwrap(), [sub.join("w")]);
        std::fs::write(&cfg, r#"{"agentsLogs": {"logSessionsJsonPrefix": "x"}}"#).unwrap();
        assert_eq!(session_dirs(&sub, h).unwrap(), [sub.join("x")]);
        std::fs::write(&cfg, r#"{"sessions": {"readLocation": "x"}}"#).unwrap();
        assert!(matches!(
            session_dirs(&sub, h).unwrap_err(),
            IndexError::NoWriteLocation { .. }
        ));
    }

    #[test]
    fn only_an_index_is_written_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |db: PathBuf| IndexConfig {
            db,
            dirs: vec![],
            tool_outputs: false,
        };
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "precious").unwrap();
        let other = dir.path().join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE session_index (x); CREATE TABLE mine (y);")
            .unwrap();
        let other_bytes = std::fs::read(&other).unwrap();
        // A table named like the index's alone is not the index.
        let alone = dir.path().join("alone.db");
        Connection::open(&alone)
            .unwrap()
            .execute_batch("CREATE TABLE session_index (a, b); INSERT INTO session_index VALUES ('precious', 1);")
            .unwrap();
        let alone_bytes = std::fs::read(&alone).unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(dir.path().join("new.db"), &link).unwrap();
        for db in [&text, &other, &alone, &link, &dir.path().to_path_buf()] {
            let c = cfg(db.clone());
            for r in [
                build(&c).map(drop),
                update(&c).map(drop),
                clean(&c),
                status(&c).map(drop),
            ] {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains(&db.display().to_string()) && e.contains("nothing was changed"),
                    "{e}"
                );
            }
        }
        assert_eq!(std::fs::read_to_string(&text).unwrap(), "precious");
        assert_eq!(std::fs::read(&other).unwrap(), other_bytes);
        assert_eq!(std::fs::read(&alone).unwrap(), alone_bytes);
        assert!(!dir.path().join("new.db").exists());
        // Its own index, and one agents-exe built (no mark), are indexes.
        let ours = cfg(dir.path().join("i.db"));
        build(&ours).unwrap();
        assert_eq!(existing(&ours.db).unwrap(), Existing::Index);
        let theirs = dir.path().join("theirs.db");
        Connection::open(&theirs)
            .unwrap()
            .execute_batch(SCHEMA)
            .unwrap();
        assert_eq!(existing(&theirs).unwrap(), Existing::Index);
        clean(&ours).unwrap();
        assert!(!ours.db.exists());
    }

    #[test]
    fn dates_are_days_in_utc() {
        assert_eq!(day_start("1970-01-02").unwrap(), 86_400_000_000_000);
        assert!(day_start("yesterday").is_err());
    }
}
