//! The embedded session store: one SQLite file, one connection.
//!
//! The connection is behind a `std::sync::Mutex`, and operations queue for
//! it (asynchronously) before they touch it. A short operation, one
//! session's write with its new turns and events, an event, usage, runs
//! on the caller's thread: it takes less time (a tenth of a millisecond
//! or two) than the hops to tokio's blocking pool and back did. It never
//! waits there for another process's lock: SQLite fails it at once, and it
//! is run again on the blocking pool, where it may wait. Operations whose
//! time grows with what is stored (a session's whole history, lists,
//! budgets' sums, reports) run on the blocking pool. Queueing before the
//! pool matters: under a burst of requests, a thread per waiting operation
//! (a hundred, each with its own stack and malloc arena) would only have
//! waited on the lock. One connection is plenty for one sidecar and keeps
//! writes trivially serialised; WAL mode lets another process (a backup,
//! `sqlite3` for debugging) read meanwhile.
//!
//! A session's history, once read, is kept decoded (up to 8 MiB of them,
//! `KEPT_HISTORIES`; see `histories.rs`) and extended by the turns the
//! store writes: reading the session again reads its row and only the
//! turns added since (none, when the writes were this store's), a short
//! operation.
//!
//! The write-ahead log is copied back into the database file (a
//! checkpoint, which syncs both to disk) by a connection and a thread of
//! their own once it holds 1000 pages (`CHECKPOINT_PAGES`), rather than by
//! whichever commit passes that mark, as SQLite would: no operation waits
//! for it.
//!
//! Errors name the operation and the file, never row contents: a stored
//! conversation may hold anything the user typed.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::histories::Histories;
use super::record::{decode_event_data, lineage_query, Columns, NewTurns, SESSION_COLUMNS};
use super::{Peer, SessionStore, StoreError};
use crate::audit;
use crate::model::{EventRecord, SessionRecord};
use crate::quota::{RunCap, Started};
use crate::usage::{
    meter_sql, Claimed, Gauge, Group, PeakBy, ReportRow, Standing, Totals, Unwritten, Use,
};
use bindery_spec::budget::Meter;
use bindery_tools::lineage::Kin;

/// A usage row's part of its session's sums, added (`"+", "NEW"`) or
/// taken back (`"-", "OLD"`): what migration 11's triggers run.
macro_rules! session_usage_by {
    ($sign:literal, $row:literal) => {
        concat!(
            "    UPDATE session_usage SET
        prompt_tokens = prompt_tokens ",
            $sign,
            " ",
            $row,
            ".prompt_tokens,
        completion_tokens = completion_tokens ",
            $sign,
            " ",
            $row,
            ".completion_tokens,
        estimated_tokens = estimated_tokens ",
            $sign,
            " CASE WHEN ",
            $row,
            ".estimated
            THEN ",
            $row,
            ".prompt_tokens + ",
            $row,
            ".completion_tokens ELSE 0 END,
        model_requests = model_requests ",
            $sign,
            " (",
            $row,
            ".tool IS NULL),
        tool_calls = tool_calls ",
            $sign,
            " ",
            $row,
            ".tool_calls,
        cost = cost ",
            $sign,
            " ",
            $row,
            ".cost
    WHERE session = ",
            $row,
            ".session;\n"
        )
    };
}

/// A usage row's cache and reasoning counts in its session's sums, added
/// or taken back: what migration 12's triggers run besides
/// [`session_usage_by`].
macro_rules! session_cache_by {
    ($sign:literal, $row:literal) => {
        concat!(
            "    UPDATE session_usage SET
        cache_read_tokens = cache_read_tokens ",
            $sign,
            " ",
            $row,
            ".cache_read_tokens,
        cache_write_tokens = cache_write_tokens ",
            $sign,
            " ",
            $row,
            ".cache_write_tokens,
        reasoning_tokens = reasoning_tokens ",
            $sign,
            " ",
            $row,
            ".reasoning_tokens
    WHERE session = ",
            $row,
            ".session;\n"
        )
    };
}

/// The schema, one step per entry; entry `i` brings the database to version
/// `i + 1`. Append only: a released step is never edited, since databases
/// out there already ran it.
const MIGRATIONS: &[&str] = &[
    // 1: sessions and their event streams.
    "CREATE TABLE sessions (
        id            TEXT PRIMARY KEY,
        agent         TEXT NOT NULL,
        status        TEXT NOT NULL,
        status_detail TEXT,
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        version       INTEGER NOT NULL,
        turns         TEXT NOT NULL,  -- JSON array of ChatMessage
        params        TEXT NOT NULL,  -- JSON object: StoredParams, never a secret
        security      TEXT NOT NULL,  -- JSON Security: sealed flag, token digests
        forked_from   TEXT
    );
    CREATE INDEX sessions_created_at ON sessions (created_at);
    CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        data       TEXT NOT NULL,
        at         INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );",
    // 2: which server runs a session's run, and the servers' heartbeats.
    "ALTER TABLE sessions ADD COLUMN runner TEXT;
    CREATE INDEX sessions_running ON sessions (id) WHERE status = 'running';
    CREATE TABLE runners (
        instance     TEXT PRIMARY KEY,
        heartbeat_at INTEGER NOT NULL
    );",
    // 3: a cancel asked of a run by a server that does not run it.
    "ALTER TABLE sessions ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;",
    // 4: the tool calls a session waits for (no token, no bound value).
    "ALTER TABLE sessions ADD COLUMN pending TEXT NOT NULL DEFAULT '{\"items\":[]}';",
    // 5: the server holding a session's secret values, and where each
    // server is reached by its peers.
    "ALTER TABLE sessions ADD COLUMN holder TEXT;
    ALTER TABLE runners ADD COLUMN address TEXT;",
    // 6: agents kept by the API (`PUT /v1/agents/:slug`).
    "CREATE TABLE agents (
        slug       TEXT PRIMARY KEY,
        document   TEXT NOT NULL,  -- JSON: the definition as put
        updated_at INTEGER NOT NULL
    );",
    // 7: what runs used, for budgets and reports (kept when sessions go).
    "CREATE TABLE usage (
        id                INTEGER PRIMARY KEY AUTOINCREMENT,
        at                INTEGER NOT NULL,
        agent             TEXT NOT NULL,
        session           TEXT NOT NULL,
        run               TEXT NOT NULL,
        model             TEXT NOT NULL,
        tool              TEXT,            -- NULL: a model request
        prompt_tokens     INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        estimated         INTEGER NOT NULL,
        tool_calls        INTEGER NOT NULL,
        cost              REAL NOT NULL
    );
    CREATE INDEX usage_agent_at ON usage (agent, at);
    CREATE INDEX usage_session ON usage (session);
    CREATE INDEX usage_run ON usage (run);
    CREATE INDEX usage_at ON usage (at);",
    // 8: a session's turns as rows of their own, so that a write appends
    // the new ones instead of rewriting the whole history; the turns the
    // rows held move there.
    "CREATE TABLE turns (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        idx        INTEGER NOT NULL,
        message    TEXT NOT NULL,  -- JSON ChatMessage
        PRIMARY KEY (session_id, idx)
    ) WITHOUT ROWID;
    INSERT INTO turns (session_id, idx, message)
        SELECT s.id, t.key, t.value FROM sessions s, json_each(s.turns) t;
    ALTER TABLE sessions ADD COLUMN turn_count INTEGER NOT NULL DEFAULT 0;
    UPDATE sessions SET turn_count = json_array_length(turns), turns = '[]';",
    // 9: a session's usage summed from its index alone (every view reads
    // the sums): the index by session holds what they add up, and the
    // time, for a session budget's window. Without it each of the
    // session's rows was a lookup in the table, where sessions' rows lie
    // interleaved.
    "DROP INDEX usage_session;
    CREATE INDEX usage_session ON usage
        (session, at, prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool);",
    // 10: the sessions waiting for a continuation found as the running
    // ones are: with a `confirmTtl`, each heartbeat looks for expired calls.
    "CREATE INDEX sessions_waiting ON sessions (id) WHERE status = 'waiting_external';",
    // 11: a session's usage sums kept up to date as its rows come and
    // change, so that a view reads one row rather than adding up one per
    // model request and tool call of the session's whole life. Triggers
    // keep them, whichever statement (or older server) writes a row.
    concat!(
        "CREATE TABLE session_usage (
        session           TEXT PRIMARY KEY,
        prompt_tokens     INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        estimated_tokens  INTEGER NOT NULL,
        model_requests    INTEGER NOT NULL,
        tool_calls        INTEGER NOT NULL,
        cost              REAL NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO session_usage
        SELECT session, SUM(prompt_tokens), SUM(completion_tokens),
            SUM(CASE WHEN estimated THEN prompt_tokens + completion_tokens ELSE 0 END),
            SUM(tool IS NULL), SUM(tool_calls), SUM(cost)
        FROM usage GROUP BY session;
    CREATE TRIGGER usage_added AFTER INSERT ON usage BEGIN\n",
        "    INSERT OR IGNORE INTO session_usage VALUES (NEW.session, 0, 0, 0, 0, 0, 0.0);\n",
        session_usage_by!("+", "NEW"),
        "END;
    CREATE TRIGGER usage_changed AFTER UPDATE ON usage BEGIN\n",
        session_usage_by!("-", "OLD"),
        "    INSERT OR IGNORE INTO session_usage VALUES (NEW.session, 0, 0, 0, 0, 0, 0.0);\n",
        session_usage_by!("+", "NEW"),
        "END;
    CREATE TRIGGER usage_removed AFTER DELETE ON usage BEGIN\n",
        session_usage_by!("-", "OLD"),
        "END;"
    ),
    // 12: of a request's prompt tokens, those read from and written to the
    // provider's cache, and of its reply's, those spent reasoning: kept
    // per row and in a session's sums (a row an older server writes has
    // none: 0). The triggers and the index by session take them too.
    concat!(
        "ALTER TABLE usage ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE session_usage ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE session_usage ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE session_usage ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
    DROP INDEX usage_session;
    CREATE INDEX usage_session ON usage (session, at, prompt_tokens, completion_tokens,
        estimated, tool_calls, cost, tool, cache_read_tokens, cache_write_tokens, reasoning_tokens);
    DROP TRIGGER usage_added;
    DROP TRIGGER usage_changed;
    DROP TRIGGER usage_removed;
    CREATE TRIGGER usage_added AFTER INSERT ON usage BEGIN\n",
        "    INSERT OR IGNORE INTO session_usage VALUES (NEW.session, 0, 0, 0, 0, 0, 0.0, 0, 0, 0);\n",
        session_usage_by!("+", "NEW"),
        session_cache_by!("+", "NEW"),
        "END;
    CREATE TRIGGER usage_changed AFTER UPDATE ON usage BEGIN\n",
        session_usage_by!("-", "OLD"),
        session_cache_by!("-", "OLD"),
        "    INSERT OR IGNORE INTO session_usage VALUES (NEW.session, 0, 0, 0, 0, 0, 0.0, 0, 0, 0);\n",
        session_usage_by!("+", "NEW"),
        session_cache_by!("+", "NEW"),
        "END;
    CREATE TRIGGER usage_removed AFTER DELETE ON usage BEGIN\n",
        session_usage_by!("-", "OLD"),
        session_cache_by!("-", "OLD"),
        "END;"
    ),
    // 13: the tenant's audit log, hash-chained (audit.rs): a record's seq,
    // its hash and its canonical line, as the export hands it out.
    "CREATE TABLE audit (
        seq  INTEGER PRIMARY KEY,
        hash TEXT NOT NULL,
        line TEXT NOT NULL
    );",
    // 14: the end user whose session a row is of (NULL: the owner's, or a
    // row from before end users were kept), for per-user budgets and the
    // report by user; a per-user window reads its partial index alone.
    "ALTER TABLE usage ADD COLUMN subject TEXT;
    CREATE INDEX usage_agent_subject_at ON usage
        (agent, subject, at, prompt_tokens, completion_tokens, tool_calls, cost)
        WHERE subject IS NOT NULL;",
    // 15: people's connections to MCP toolboxes (authorization-code
    // grants): the tokens sealed (connections.rs), the rest in clear.
    "CREATE TABLE connections (
        subject      TEXT NOT NULL,
        toolbox      TEXT NOT NULL,
        scopes       TEXT NOT NULL,  -- JSON array
        connected_at INTEGER NOT NULL,
        last_used_at INTEGER NOT NULL,
        sealed       BLOB NOT NULL,
        PRIMARY KEY (subject, toolbox)
    );",
];

/// A connection's columns, as [`connection_of`] reads them.
const CONNECTION: &str =
    "SELECT subject, toolbox, scopes, connected_at, last_used_at, sealed FROM connections";

fn connection_of(row: &Row<'_>) -> rusqlite::Result<crate::connections::StoredConnection> {
    let scopes: String = row.get(2)?;
    Ok(crate::connections::StoredConnection {
        subject: row.get(0)?,
        toolbox: row.get(1)?,
        scopes: serde_json::from_str(&scopes).unwrap_or_default(),
        connected_at: row.get(3)?,
        last_used_at: row.get(4)?,
        sealed: row.get(5)?,
    })
}

/// The running and the waiting sessions, found through their partial
/// indexes. The status is written in the SQL, not bound: with the
/// planner's stability guarantee on ([`configure`]) a plan cannot depend
/// on a bound value, so `status = ?1` would read the whole table.
const RUNNING: &str = "WHERE status = 'running' ORDER BY id";
const WAITING: &str = "WHERE status = 'waiting_external' ORDER BY id";

/// Prepared statements the connection keeps compiled: more than the store
/// has (each `sessions` listing is one of its own).
const STATEMENT_CACHE: usize = 48;

/// How long a statement on the blocking pool waits for another process's
/// lock before failing (a short operation on the caller's thread does not
/// wait: it goes to the pool).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How much of the histories it read or wrote lately the store keeps
/// decoded (each turn's message and its JSON text), so that reading a
/// session again reads only what was added since: a hundred or two
/// conversations of tens of turns.
const KEPT_HISTORIES: usize = 8 << 20;

/// The write-ahead log's size, in pages, past which it is checkpointed
/// (SQLite's own default for its automatic checkpoints).
const CHECKPOINT_PAGES: std::ffi::c_int = 1000;

/// Sessions in a SQLite file.
pub struct SqliteStore {
    path: Arc<Path>,
    conn: Arc<Mutex<Held>>,
    /// One operation at a time takes the connection.
    turn: tokio::sync::Semaphore,
    histories: Histories,
    /// The last operation that waited for another process's lock gave up:
    /// until one succeeds, operations try once and do not wait, so that
    /// requests queued behind each other answer at once, not a wait each.
    locked_out: Arc<std::sync::atomic::AtomicBool>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Open (creating it and its directory if need be) the store at
    /// `sqlite://PATH` or a plain path, and bring its schema up to date.
    ///
    /// This blocks on file I/O: call it at startup or from a blocking task.
    pub fn open(location: &str) -> Result<SqliteStore, StoreError> {
        Self::open_with(location, true)
    }

    /// `open`, taking the file for this store alone or not: a test plays
    /// another process on the same file with a second store.
    fn open_with(location: &str, alone: bool) -> Result<SqliteStore, StoreError> {
        let path = PathBuf::from(location.strip_prefix("sqlite://").unwrap_or(location));
        if path.as_os_str().is_empty() {
            return Err(StoreError::Backend(format!(
                "no database path in session store location {location:?}"
            )));
        }
        let op = Op::new("open the session store", &path);
        if path.to_string_lossy().starts_with("file:") {
            // SQLite would read it as a URI and open another file than
            // the one held (see `hold`).
            return Err(op.fail(
                "a file: URI is not a path here: give the database file's path \
                 (sqlite://PATH or PATH)",
            ));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| op.fail(format_args!("cannot create its directory: {e}")))?;
        }
        let file = create_private_file(&path)
            .map_err(|e| op.fail(format_args!("cannot create it: {e}")))?;
        warn_of_other_names(&file, &path);
        let hold = match alone {
            true => Some(Arc::new(hold(file, &path, &op)?)),
            false => None,
        };

        let mut conn = Held::open(&path, hold.clone(), &op)?;
        configure(&conn, &op)?;
        check_integrity(&conn, &op)?;
        migrate(&mut conn, &path)?;
        conn.aside = Some(checkpoint_aside(&mut conn, &path, hold, &op)?);
        // Short operations fail at once on another process's lock (see `run_short`).
        conn.busy_timeout(Duration::ZERO).map_err(|e| op.db(e))?;
        Ok(SqliteStore {
            path: path.into(),
            conn: Arc::new(Mutex::new(conn)),
            turn: tokio::sync::Semaphore::new(1),
            histories: Histories::new(KEPT_HISTORIES),
            locked_out: Default::default(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A record's columns and new turns, with their JSON written out before
    /// taking the lock.
    fn encode(&self, rec: &SessionRecord) -> Result<(Columns, NewTurns), StoreError> {
        Columns::encode(rec).map_err(|why| Op::new("write a session", &self.path).fail(why))
    }

    /// The sessions `SELECT … FROM sessions {tail}` finds.
    async fn sessions(
        &self,
        what: &'static str,
        tail: &'static str,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.run(what, move |conn, op| {
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions {tail}"))
                .map_err(|e| op.db(e))?;
            let rows: Vec<Columns> = stmt
                .query_map([], columns)
                .and_then(|rows| rows.collect())
                .map_err(|e| op.db(e))?;
            rows.into_iter()
                .map(|raw| {
                    let turns = read_turns(conn, &raw.id, 0).map_err(|e| op.db(e))?;
                    raw.decode(turns).map_err(|why| op.fail(why))
                })
                .collect()
        })
        .await
    }

    /// Run `f` with the connection on the blocking pool, where it may wait
    /// for another process's lock.
    async fn run<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Op<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        // Never closed, so `acquire` cannot fail; held until the task ends.
        let _turn = self.turn.acquire().await;
        self.on_pool(what, f).await
    }

    /// Run `f`, a short operation, with the connection on this thread;
    /// should another process hold the lock it needs, again on the
    /// blocking pool, to wait for it there. `f` must leave nothing done
    /// when it fails (a transaction, or one statement).
    async fn run_short<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&mut Connection, &Op<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let _turn = self.turn.acquire().await;
        {
            let op = Op::new(what, &self.path);
            let out = lock(&self.conn, &op).and_then(|mut conn| f(&mut conn, &op));
            if !op.busy.get() {
                if out.is_ok() {
                    self.locked_out
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                }
                return out;
            }
        }
        self.on_pool(what, f).await
    }

    /// [`run`](Self::run) once the caller's turn came.
    async fn on_pool<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Op<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let path = Arc::clone(&self.path);
        let locked_out = Arc::clone(&self.locked_out);
        let task = tokio::task::spawn_blocking(move || {
            use std::sync::atomic::Ordering::Relaxed;
            let op = Op::new(what, &path);
            let mut conn = lock(&conn, &op)?;
            let wait = match locked_out.load(Relaxed) {
                true => Duration::ZERO,
                false => BUSY_TIMEOUT,
            };
            conn.busy_timeout(wait).map_err(|e| op.db(e))?;
            let out = f(&mut conn, &op);
            locked_out.store(op.busy.get() && out.is_err(), Relaxed);
            // Back to failing at once, for the next short operation.
            let reset = conn.busy_timeout(Duration::ZERO).map_err(|e| op.db(e));
            out.and_then(|v| reset.map(|()| v))
        });
        match task.await {
            Ok(result) => result,
            Err(_) => {
                Err(Op::new(what, &self.path).fail("the worker task panicked or was cancelled"))
            }
        }
    }
}

/// The connection, unless a panic while it was held may have left a
/// transaction half done: then refuse rather than guess.
fn lock<'a>(
    conn: &'a Mutex<Held>,
    op: &Op<'_>,
) -> Result<std::sync::MutexGuard<'a, Held>, StoreError> {
    conn.lock()
        .map_err(|_| op.fail("the connection is unusable after a panic in an earlier operation"))
}

/// Have a connection of its own, on a thread of its own, checkpoint the
/// write-ahead log whenever a commit of `conn`'s leaves it
/// [`CHECKPOINT_PAGES`] long or longer, instead of that commit. PASSIVE:
/// it waits for no reader or writer, and copies what it can; the next
/// commit past the mark asks again. The thread ends with `conn`, and
/// its connection keeps the hold on the file until it is closed.
fn checkpoint_aside(
    conn: &mut Connection,
    path: &Path,
    hold: Option<Arc<std::fs::File>>,
    op: &Op<'_>,
) -> Result<Aside, StoreError> {
    let other = Held::open(path, hold, op)?;
    let (due, wake) = std::sync::mpsc::sync_channel::<()>(1);
    let file = path.display().to_string();
    let thread = std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            while wake.recv().is_ok() {
                let done = other.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                if let Err(e) = done {
                    tracing::warn!(store = %file, "cannot checkpoint the session store: {e}");
                }
            }
        })
        .map_err(|e| op.fail(format_args!("cannot start its checkpoint thread: {e}")))?;
    // Replaces SQLite's automatic checkpoints (`wal_autocheckpoint`).
    conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages| {
        if pages >= CHECKPOINT_PAGES {
            // One already asked for is enough.
            let _ = due.try_send(());
        }
        Ok(())
    }))
    .map_err(|e| op.db(e))?;
    Ok(Aside(Some(thread)))
}

/// The sums a [`Totals`] reads, in its order.
pub(super) const TOTALS: &str =
    "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),
     COALESCE(SUM(prompt_tokens + completion_tokens), 0),
     COALESCE(SUM(CASE WHEN estimated THEN prompt_tokens + completion_tokens ELSE 0 END), 0),
     COALESCE(SUM(CASE WHEN tool IS NULL THEN 1 ELSE 0 END), 0),
     COALESCE(SUM(tool_calls), 0), COALESCE(SUM(cost), 0.0),
     COALESCE(SUM(cache_read_tokens), 0), COALESCE(SUM(cache_write_tokens), 0),
     COALESCE(SUM(reasoning_tokens), 0)";

fn totals_at(r: &Row<'_>, at: usize) -> rusqlite::Result<Totals> {
    let n = |i: usize| {
        r.get::<_, i64>(at + i)
            .map(|v| u64::try_from(v).unwrap_or(0))
    };
    Ok(Totals {
        prompt_tokens: n(0)?,
        completion_tokens: n(1)?,
        total_tokens: n(2)?,
        estimated_tokens: n(3)?,
        model_requests: n(4)?,
        tool_calls: n(5)?,
        cost: r.get(at + 6)?,
        cache_read_tokens: n(7)?,
        cache_write_tokens: n(8)?,
        reasoning_tokens: n(9)?,
    })
}

/// What `meter` adds up over the usage rows of `filter` (a scope's, with
/// `n` values) since the value after them, and the oldest row's time.
fn window_sql(filter: &str, n: usize, meter: Meter) -> String {
    format!(
        "SELECT COALESCE(SUM({}), 0), MIN(at) FROM usage WHERE {filter} AND at >= ?{}",
        meter_sql(meter),
        n + 1
    )
}

/// A session's [`Totals`], the session `?1`, as the triggers keep them.
const SESSION_TOTALS: &str = "SELECT prompt_tokens, completion_tokens,
     prompt_tokens + completion_tokens, estimated_tokens, model_requests, tool_calls, cost,
     cache_read_tokens, cache_write_tokens, reasoning_tokens
     FROM session_usage WHERE session = ?1";

fn measure_one(conn: &Connection, g: &Gauge) -> rusqlite::Result<Standing> {
    let (filter, values) = g.scope.filter('?');
    let mut bound: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v as _).collect();
    bound.push(&g.since);
    conn.prepare_cached(&window_sql(&filter, values.len(), g.meter))?
        .query_row(&bound[..], |r| {
            Ok(Standing {
                used: r.get(0)?,
                oldest: r.get(1)?,
            })
        })
}

/// Insert `u`'s rows and settle its claimed ones.
fn write_unwritten(conn: &Connection, u: &Unwritten) -> rusqlite::Result<()> {
    for r in &u.rows {
        insert_use(conn, r)?;
    }
    for (id, r) in &u.settled {
        conn.prepare_cached(
            "UPDATE usage SET model = ?2, prompt_tokens = ?3, completion_tokens = ?4,
                 estimated = ?5, tool_calls = ?6, cost = ?7, cache_read_tokens = ?8,
                 cache_write_tokens = ?9, reasoning_tokens = ?10 WHERE id = ?1",
        )?
        .execute(params![
            id,
            r.model,
            count(r.prompt_tokens),
            count(r.completion_tokens),
            r.estimated,
            count(r.tool_calls),
            r.cost,
            count(r.cache_read_tokens),
            count(r.cache_write_tokens),
            count(r.reasoning_tokens)
        ])?;
    }
    Ok(())
}

/// Insert one usage row; its id.
fn insert_use(conn: &Connection, r: &Use) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO usage (at, agent, session, run, model, tool, prompt_tokens,
             completion_tokens, estimated, tool_calls, cost, cache_read_tokens,
             cache_write_tokens, reasoning_tokens, subject)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?
    .execute(params![
        r.at,
        r.agent,
        r.session,
        r.run,
        r.model,
        r.tool,
        count(r.prompt_tokens),
        count(r.completion_tokens),
        r.estimated,
        count(r.tool_calls),
        r.cost,
        count(r.cache_read_tokens),
        count(r.cache_write_tokens),
        count(r.reasoning_tokens),
        r.subject
    ])?;
    Ok(conn.last_insert_rowid())
}

/// A count as SQLite's integer.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How many times, [`OWN_HOLD_PAUSE`] apart, a file this process holds
/// is tried again before it is refused (see [`hold`]).
const OWN_HOLD_TRIES: u32 = 40;
const OWN_HOLD_PAUSE: Duration = Duration::from_millis(50);

/// Take the database file for this store alone, or fail naming who has
/// it. Two servers on one file (a volume mounted by two pods during a
/// rollout) would each take the other's runs for its own last process's,
/// lost, and close them while they run. The hold is an exclusive `flock`
/// on the file itself, not on a name: every name of it (a hard or
/// symbolic link, another mount of its directory) finds it taken, and no
/// file deleted lets it go; the kernel does when the process ends, however
/// it ends. (SQLite locks with `fcntl`, which `flock` does not touch.)
/// `PATH.lock` says who holds it, for the refusal; where that note is not
/// found (beside another name of the file), the kernel's list of locks
/// names the holder's pid.
fn hold(file: std::fs::File, path: &Path, op: &Op<'_>) -> Result<std::fs::File, StoreError> {
    use std::io::Write;
    let note = holder_note(path);
    // A hold of this very process is a store being let go, or a copy of
    // its descriptor in a child between its fork and its exec (another
    // thread spawning a process): either goes within moments. A hold the
    // kernel's list no longer shows went between the try and the look:
    // tried again too (one it cannot name, of another pid namespace, is
    // refused after the tries, as it would be at once).
    let mut tries = 0;
    let taken = loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock)
                if tries < OWN_HOLD_TRIES
                    && flock_holder(&file).is_none_or(|pid| pid == std::process::id()) =>
            {
                tries += 1;
                std::thread::sleep(OWN_HOLD_PAUSE);
            }
            other => break other,
        }
    };
    match taken {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(op.fail(format_args!(
                "it is in use by {}; one SQLite file serves one server: \
                 stop that one first, give each server a file of its own, or share a \
                 PostgreSQL store (--store postgres://…)",
                holder(&file, &note)
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(op.fail(format_args!("cannot lock it: {e}")))
        }
    }
    let me = format!(
        "Bindery server pid {} on {}, since {}",
        std::process::id(),
        host_name(),
        humantime::format_rfc3339_seconds(std::time::SystemTime::now())
    );
    // Written aside and renamed over the note: a note that is a symlink
    // (anyone who can write to the directory can make one) is replaced,
    // never followed to write wherever it points.
    let mut aside = note.clone().into_os_string();
    aside.push(format!(".{}", std::process::id()));
    let aside = PathBuf::from(aside);
    let _ = std::fs::remove_file(&aside);
    let wrote = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&aside)
        .and_then(|mut f| f.write_all(me.as_bytes()))
        .and_then(|()| std::fs::rename(&aside, &note));
    if let Err(e) = wrote {
        let _ = std::fs::remove_file(&aside);
        tracing::warn!("cannot say who holds the store in {}: {e}", note.display());
    }
    Ok(file)
}

/// A file with more than one name (hard links) is served, but said: SQLite
/// keeps its write-ahead log beside the name it opens, so commits not yet
/// copied into the file when a server stops abruptly are seen only by a
/// server opening the same name again.
fn warn_of_other_names(file: &std::fs::File, path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Some(names) = file.metadata().ok().map(|m| m.nlink()).filter(|&n| n > 1) {
            tracing::warn!(
                store = %path.display(),
                "the session store's file has {names} names (hard links): always open it by \
                 this one, or remove the others, since its write-ahead log lies beside the name"
            );
        }
    }
}

/// `PATH.lock`, where the server holding the file says who it is: a note
/// only, the hold is on the file (see [`hold`]).
fn holder_note(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Who holds `file`, for a refusal: the note beside this name of it if
/// the kernel's list agrees (or has no word), else the kernel's pid.
fn holder(file: &std::fs::File, note: &Path) -> String {
    let text = std::fs::read_to_string(note)
        .ok()
        .map(|t| t.trim().chars().take(200).collect::<String>())
        .filter(|t| !t.is_empty());
    match (flock_holder(file), text) {
        (Some(pid), Some(text)) if text.contains(&format!("pid {pid} ")) => text,
        (Some(pid), _) => format!("pid {pid} on this machine (it holds the file's lock)"),
        (None, Some(text)) => text,
        (None, None) => "another process".into(),
    }
}

/// The pid holding an exclusive `flock` on `file`, from the kernel's list
/// of locks; `None` where it is not listed or not visible from here (in
/// another pid namespace, or on another machine).
#[cfg(target_os = "linux")]
fn flock_holder(file: &std::fs::File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    flock_holder_in(&locks, meta.dev(), meta.ino())
}

#[cfg(not(target_os = "linux"))]
fn flock_holder(_: &std::fs::File) -> Option<u32> {
    None
}

/// [`flock_holder`] in `/proc/locks`' text, whose lines read
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`: the device's major
/// and minor numbers in hex, then the inode (a waiter's line has `->`
/// after the number, and a pid not visible from here is 0).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn flock_holder_in(locks: &str, dev: u64, inode: u64) -> Option<u32> {
    // glibc's `major` and `minor` of a `dev_t`.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let file = format!("{major:02x}:{minor:02x}:{inode}");
    locks.lines().find_map(
        |line| match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            [_, "FLOCK", _, "WRITE", pid, at, ..] if *at == file => {
                pid.parse().ok().filter(|&pid| pid != 0)
            }
            _ => None,
        },
    )
}

/// This machine's name: a pod's own (`HOSTNAME`), else the kernel's.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "this machine".into())
}

/// The file's pages and indexes agree (`PRAGMA quick_check`): a server
/// that would serve a damaged file answers listings with errors and loses
/// runs' answers, so it does not start on one. It reads the whole file
/// once, a second or so per gigabyte.
fn check_integrity(conn: &Connection, op: &Op<'_>) -> Result<(), StoreError> {
    let found: Vec<String> = match conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
    {
        Ok(found) => found,
        Err(e) => {
            let why = sqlite_message(&e);
            match op.db(e) {
                StoreError::Corrupt(_) => vec![why],
                other => return Err(other),
            }
        }
    };
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Corrupt(op.text(format_args!(
        "the integrity check failed ({}); restore the file from a backup, or move it aside to start with no sessions",
        found.join("; ")
    ))))
}

/// Open the file, creating it readable by its owner only if it does not
/// exist yet: it holds conversations. SQLite gives its `-wal` and `-shm`
/// files the same permissions.
fn create_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// A connection to the database file, and this store's hold on the file,
/// let go after it (fields drop in order): closing any descriptor of the
/// file drops every `fcntl` lock SQLite holds on it in this process, so
/// the hold's descriptor stays open until the last connection is closed.
/// A store's connection also waits for its checkpoint thread to close its
/// own, so that dropping the store lets go of the file at once.
struct Held {
    conn: Connection,
    aside: Option<Aside>,
    _hold: Option<Arc<std::fs::File>>,
}

/// The checkpoint thread, joined when dropped: it ends once the
/// connection that wakes it is closed (see [`checkpoint_aside`]).
struct Aside(Option<std::thread::JoinHandle<()>>);

impl Drop for Aside {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

impl Held {
    fn open(
        path: &Path,
        hold: Option<Arc<std::fs::File>>,
        op: &Op<'_>,
    ) -> Result<Held, StoreError> {
        let conn = Connection::open(path).map_err(|e| op.db(e))?;
        Ok(Held {
            conn,
            aside: None,
            _hold: hold,
        })
    }
}

impl std::ops::Deref for Held {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

fn configure(conn: &Connection, op: &Op<'_>) -> Result<(), StoreError> {
    // First, so that switching to WAL waits for another process's lock.
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| op.db(e))?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| op.db(e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(op.fail(format_args!(
            "cannot use write-ahead logging (journal mode stays {mode:?})"
        )));
    }
    // In WAL mode NORMAL is safe against corruption; a power cut may lose
    // the last commits, which a session survives.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| op.db(e))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(|e| op.db(e))?;
    // Without it, SQLite marks a statement whose plan might depend on a
    // bound value (`session_id = ?1`, with STAT4 built in) to be compiled
    // again at every new binding: a cached statement would be parsed and
    // planned anew on each use, two thirds of a short write's time. With
    // no `ANALYZE` statistics the plan would never change anyway.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| op.db(e))?;
    // Room for every statement the store prepares (rusqlite keeps 16, and
    // one more than fit would be compiled again at each turn of the LRU).
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Apply the missing steps of [`MIGRATIONS`], each in its own transaction.
/// The version is re-read inside each (IMMEDIATE) transaction, so two
/// processes opening the same new file do not both apply a step.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let op = Op::new("migrate the session store", path);
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| op.db(e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                 version    INTEGER PRIMARY KEY,
                 applied_at INTEGER
             )",
        )
        .map_err(|e| op.db(e))?;
        let current: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                [],
                |row| row.get(0),
            )
            .map_err(|e| op.db(e))?;
        if current > known {
            return Err(StoreError::Backend(format!(
                "{} was written by a newer Bindery (schema {current}); this binary knows up to {known}",
                path.display()
            )));
        }
        let Some(step) = usize::try_from(current)
            .ok()
            .and_then(|i| MIGRATIONS.get(i))
        else {
            // Up to date (the empty transaction just ends).
            return tx.commit().map_err(|e| op.db(e));
        };
        // Dropping `tx` on an error rolls the step back whole.
        tx.execute_batch(step).map_err(|e| {
            op.fail(format_args!(
                "bringing it to schema {} (of {known}) failed, and it is left at schema \
                 {current}: {}",
                current + 1,
                sqlite_message(&e)
            ))
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            params![current + 1, super::now_ms()],
        )
        .map_err(|e| op.db(e))?;
        tx.commit().map_err(|e| op.db(e))?;
    }
}

/// What SQLite said, without the statements rusqlite quotes after an
/// error in SQL it was given: a migration step is a page of them, and the
/// reader needs the message and the operation (or step), not the text.
fn sqlite_message(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqlInputError { msg, .. } => msg.clone(),
        e => e.to_string(),
    }
}

/// What is being done to which file, for error messages.
struct Op<'a> {
    what: &'static str,
    path: &'a Path,
    /// A statement failed because another connection held a lock.
    busy: std::cell::Cell<bool>,
}

impl<'a> Op<'a> {
    fn new(what: &'static str, path: &'a Path) -> Op<'a> {
        Op {
            what,
            path,
            busy: Default::default(),
        }
    }

    fn fail(&self, why: impl fmt::Display) -> StoreError {
        StoreError::Backend(self.text(why))
    }

    fn text(&self, why: impl fmt::Display) -> String {
        format!("could not {} ({}): {why}", self.what, self.path.display())
    }

    /// SQLite's messages name tables and columns, never bound values. A
    /// lock held past its wait, a full disk or a failed read or write is
    /// an outage; a damaged file is corruption.
    fn db(&self, e: rusqlite::Error) -> StoreError {
        use rusqlite::ErrorCode::*;
        let code = e.sqlite_error_code();
        if matches!(code, Some(DatabaseBusy | DatabaseLocked)) {
            self.busy.set(true);
        }
        let text = self.text(sqlite_message(&e));
        match code {
            Some(DatabaseBusy | DatabaseLocked | DiskFull | SystemIoFailure | CannotOpen) => {
                StoreError::Unavailable(text)
            }
            Some(DatabaseCorrupt | NotADatabase) => StoreError::Corrupt(text),
            _ => StoreError::Backend(text),
        }
    }
}

/// A `sessions` row read by SQLite; matches [`SESSION_COLUMNS`].
fn columns(row: &Row<'_>) -> rusqlite::Result<Columns> {
    Ok(Columns {
        id: row.get(0)?,
        agent: row.get(1)?,
        status: row.get(2)?,
        status_detail: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
        version: row.get(6)?,
        turns: row.get(7)?,
        params: row.get(8)?,
        security: row.get(9)?,
        forked_from: row.get(10)?,
        runner: row.get(11)?,
        cancel_requested: row.get(12)?,
        pending: row.get(13)?,
        holder: row.get(14)?,
        turn_count: row.get(15)?,
    })
}

/// A session's rows of the `turns` table from index `from`, in order
/// (JSON text).
fn read_turns(conn: &Connection, session: &str, from: usize) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT message FROM turns WHERE session_id = ?1 AND idx >= ?2 ORDER BY idx",
    )?
    .query_map(params![session, from as i64], |row| row.get(0))?
    .collect()
}

/// Append `turns` to `session`'s rows of the `turns` table.
fn insert_turns(conn: &Connection, session: &str, turns: &NewTurns) -> rusqlite::Result<()> {
    if turns.is_empty() {
        return Ok(());
    }
    let mut insert =
        conn.prepare_cached("INSERT INTO turns (session_id, idx, message) VALUES (?1, ?2, ?3)")?;
    for (idx, message) in turns {
        insert.execute(params![session, idx, message])?;
    }
    Ok(())
}

/// An IMMEDIATE transaction for the writes of every run (a session's,
/// an event's, a budget's claim), begun and committed by
/// cached statements (rusqlite's `Transaction` parses `BEGIN IMMEDIATE`
/// and `COMMIT` anew each time); rolled back when dropped uncommitted,
/// as a failed statement or commit leaves it.
struct Immediate<'c> {
    conn: &'c Connection,
    committed: bool,
}

impl<'c> Immediate<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Immediate<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Immediate {
            conn,
            committed: false,
        })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.committed = true;
        Ok(())
    }
}

impl std::ops::Deref for Immediate<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        if !self.committed && !self.conn.is_autocommit() {
            // What failed is reported by the statement that failed.
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// The audit log's last record.
fn audit_head(conn: &Connection) -> rusqlite::Result<Option<audit::Head>> {
    conn.prepare_cached("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")?
        .query_row([], |row| {
            Ok(audit::Head {
                seq: row.get(0)?,
                hash: row.get(1)?,
            })
        })
        .optional()
}

fn is_primary_key_violation(e: &rusqlite::Error) -> bool {
    e.sqlite_extended_error_code() == Some(rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

/// Write `enc` over its row if it is the same session (created at the
/// same time), the stored version is the one before it and the store
/// holds `stored` turns, then append `new`; in the caller's
/// transaction, so "no row changed" and "does it exist" agree.
fn update_row(
    conn: &Connection,
    (enc, new): &(Columns, NewTurns),
    stored: i64,
    op: &Op<'_>,
) -> Result<(), StoreError> {
    let mut values = row_params(enc).to_vec();
    values.push(&stored);
    let changed = conn
        .prepare_cached(
            // `created_at` is matched, not set: it never changes, and
            // setting its indexed column would rewrite an index page at
            // every write.
            "UPDATE sessions
             SET agent = ?2, status = ?3, status_detail = ?4,
                 updated_at = ?6, version = ?7, turns = ?8, params = ?9,
                 security = ?10, forked_from = ?11, runner = ?12,
                 cancel_requested = ?13, pending = ?14, holder = ?15, turn_count = ?16
             WHERE id = ?1 AND created_at = ?5 AND version = ?7 - 1 AND turn_count = ?17",
        )
        .and_then(|mut update| update.execute(values.as_slice()))
        .map_err(|e| op.db(e))?;
    if changed == 0 {
        let exists = session_exists(conn, &enc.id).map_err(|e| op.db(e))?;
        let id = enc.id.clone();
        return Err(if exists {
            StoreError::Conflict(id)
        } else {
            StoreError::NotFound(id)
        });
    }
    insert_turns(conn, &enc.id, new).map_err(|e| op.db(e))
}

/// Append `events` (kind, JSON text) to `session` with the next seqs; the
/// caller holds the write lock (an IMMEDIATE transaction).
fn insert_events(
    conn: &Connection,
    session: &str,
    events: &[(String, String)],
    at: i64,
) -> rusqlite::Result<Vec<i64>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let next: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?1")?
        .query_row([session], |row| row.get(0))?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO events (session_id, seq, kind, data, at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut seqs = Vec::with_capacity(events.len());
    for (seq, (kind, data)) in (next..).zip(events) {
        insert.execute(params![session, seq, kind, data, at])?;
        seqs.push(seq);
    }
    Ok(seqs)
}

fn session_exists(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
        .query_row([id], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
}

/// The values of a `sessions` row, bound as `?1`…`?16` in the order of
/// [`SESSION_COLUMNS`] (insert and update both).
fn row_params(c: &Columns) -> [&dyn rusqlite::ToSql; 16] {
    [
        &c.id,
        &c.agent,
        &c.status,
        &c.status_detail,
        &c.created_at,
        &c.updated_at,
        &c.version,
        &c.turns,
        &c.params,
        &c.security,
        &c.forked_from,
        &c.runner,
        &c.cancel_requested,
        &c.pending,
        &c.holder,
        &c.turn_count,
    ]
}

impl SqliteStore {
    /// A session's write (see `update_with_usage`), if `cap` admits it.
    async fn write(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        usage: &Unwritten,
        cap: Option<RunCap>,
    ) -> Result<Started, StoreError> {
        let enc = self.encode(rec)?;
        let from = rec.stored_turns;
        let stored = from as i64;
        let count = rec.turns.len();
        let session = rec.id.clone();
        let events: Vec<(String, String)> = events
            .iter()
            .map(|(kind, data)| (kind.to_string(), data.to_string()))
            .collect();
        let usage = (!usage.is_empty()).then(|| usage.clone());
        let seqs = self
            .run_short("update a session", move |conn, op| {
                // IMMEDIATE, as for `append_event`: the seqs are read and used
                // under the write lock; so is a cap's count.
                let tx = Immediate::begin(conn).map_err(|e| op.db(e))?;
                if let Some(cap) = &cap {
                    let running: i64 = tx
                        .prepare_cached(RUNNING_OF_SUBJECT)
                        .and_then(|mut s| s.query_row(params![cap.subject, session], |r| r.get(0)))
                        .map_err(|e| op.db(e))?;
                    let running = u64::try_from(running).unwrap_or(0);
                    if !cap.admits(running) {
                        return Ok(Started::Full { running });
                    }
                }
                update_row(&tx, &enc, stored, op)?;
                let seqs = insert_events(&tx, &session, &events, at).map_err(|e| op.db(e))?;
                if let Some(usage) = &usage {
                    write_unwritten(&tx, usage).map_err(|e| op.db(e))?;
                }
                tx.commit().map_err(|e| op.db(e))?;
                Ok(Started::Stored(seqs))
            })
            .await?;
        if let Started::Stored(_) = seqs {
            rec.stored_turns = count;
            let added = &rec.turns[from.min(count)..];
            self.histories.written(&rec.id, rec.created_at, from, added);
        }
        Ok(seqs)
    }
}

/// How many sessions of end user `?1` other than `?2` are running: among
/// the running ones (found through their partial index), those whose
/// security names the subject.
const RUNNING_OF_SUBJECT: &str = "SELECT COUNT(*) FROM sessions WHERE status = 'running'
     AND id <> ?2 AND json_extract(security, '$.subject') = ?1";

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        // A new session's turns are all new (a fork's copy too).
        rec.stored_turns = 0;
        let (enc, new) = self.encode(rec)?;
        let count = rec.turns.len();
        self.run("create a session", move |conn, op| {
            let tx = conn.transaction().map_err(|e| op.db(e))?;
            let inserted = tx
                .prepare_cached(&format!(
                    "INSERT INTO sessions ({SESSION_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
                ))
                .and_then(|mut insert| insert.execute(row_params(&enc)));
            match inserted {
                Ok(_) => {}
                Err(e) if is_primary_key_violation(&e) => return Err(StoreError::Exists(enc.id)),
                Err(e) => return Err(op.db(e)),
            }
            insert_turns(&tx, &enc.id, &new).map_err(|e| op.db(e))?;
            tx.commit().map_err(|e| op.db(e))
        })
        .await?;
        rec.stored_turns = count;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let known = self.histories.known(id);
        let owned = id.to_owned();
        // The row, and the turns after those kept (all of them if none are).
        let read = move |conn: &mut Connection, op: &Op<'_>| {
            let raw = conn
                .prepare_cached(&format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"
                ))
                .and_then(|mut select| select.query_row([&owned], columns).optional())
                .map_err(|e| op.db(e))?;
            let Some(raw) = raw else {
                return Ok(None);
            };
            // Turns an older server wrote into the row follow the table's:
            // with those, or fewer turns than are kept (never written so),
            // all of them are read.
            let from = known
                .filter(|&n| raw.turns == "[]" && raw.turn_count >= n as i64)
                .unwrap_or(0);
            let turns = match raw.turn_count == from as i64 {
                true => Vec::new(),
                false => read_turns(conn, &raw.id, from).map_err(|e| op.db(e))?,
            };
            Ok(Some((raw, from, turns)))
        };
        // A whole history is read on the pool; the rest of a kept one here.
        let read = match known {
            Some(_) => self.run_short("read a session", read).await?,
            None => self.run("read a session", read).await?,
        };
        let Some((raw, from, turns)) = read else {
            return Ok(None);
        };
        let (id, created_at) = (raw.id.clone(), raw.created_at);
        let kept = match from {
            0 => Some(Vec::new()),
            n => self.histories.prefix(&id, created_at, n),
        };
        let Some(kept) = kept else {
            // Kept of another session of this id: read it all again.
            self.histories.forget(&id);
            return self.get(&id).await;
        };
        let rec = raw
            .decode_after(kept, turns)
            .map_err(|why| Op::new("read a session", &self.path).fail(why))?;
        let added = &rec.turns[from..rec.stored_turns];
        match from {
            0 => self.histories.keep(&id, created_at, added),
            n => self.histories.written(&id, created_at, n, added),
        }
        Ok(Some(rec))
    }

    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions("list sessions", "ORDER BY created_at DESC, id")
            .await
    }

    async fn lineage(&self, id: &str, max: usize) -> Result<Vec<Kin>, StoreError> {
        let id = id.to_owned();
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.run("read a session's lineage", move |conn, op| {
            conn.prepare_cached(&lineage_query("sessions", "?1", "?2", "id"))
                .and_then(|mut stmt| {
                    stmt.query_map(params![id, max], |row| {
                        Ok(Kin {
                            id: row.get(0)?,
                            forked_from: row.get(1)?,
                            agent: row.get(2)?,
                            status: row.get(3)?,
                            created_at: row.get(4)?,
                            updated_at: row.get(5)?,
                            turns: usize::try_from(row.get::<_, i64>(6)?).unwrap_or(0),
                        })
                    })?
                    .collect()
                })
                .map_err(|e| op.db(e))
        })
        .await
    }

    async fn running(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions("list running sessions", RUNNING).await
    }

    async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions("list waiting sessions", WAITING).await
    }

    async fn update_with_events(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
    ) -> Result<Vec<i64>, StoreError> {
        self.update_with_usage(rec, events, at, &Unwritten::default())
            .await
    }

    async fn update_with_usage(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        usage: &Unwritten,
    ) -> Result<Vec<i64>, StoreError> {
        match self.write(rec, events, at, usage, None).await? {
            Started::Stored(seqs) => Ok(seqs),
            Started::Full { .. } => Err(StoreError::Backend(
                "an uncapped write was refused as over a cap".into(),
            )),
        }
    }

    async fn start_capped(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        cap: &RunCap,
    ) -> Result<Started, StoreError> {
        self.write(rec, events, at, &Unwritten::default(), Some(cap.clone()))
            .await
    }

    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &serde_json::Value,
        at: i64,
    ) -> Result<i64, StoreError> {
        let session = session.to_owned();
        let event = [(kind.to_owned(), data.to_string())];
        self.run_short("append an event", move |conn, op| {
            // IMMEDIATE takes the write lock before reading MAX(seq), so a
            // second writer (another process) cannot pick the same seq.
            let tx = Immediate::begin(conn).map_err(|e| op.db(e))?;
            if !session_exists(&tx, &session).map_err(|e| op.db(e))? {
                return Err(StoreError::NotFound(session.clone()));
            }
            let seqs = insert_events(&tx, &session, &event, at).map_err(|e| op.db(e))?;
            tx.commit().map_err(|e| op.db(e))?;
            Ok(seqs[0])
        })
        .await
    }

    async fn last_event_seq(&self, session: &str) -> Result<i64, StoreError> {
        let session = session.to_owned();
        self.run("read the last event's seq", move |conn, op| {
            conn.prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?1")
                .and_then(|mut stmt| stmt.query_row(params![session], |row| row.get::<_, i64>(0)))
                .map_err(|e| op.db(e))
        })
        .await
    }

    async fn events_after(
        &self,
        session: &str,
        after: i64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let session = session.to_owned();
        self.run("read events", move |conn, op| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT seq, kind, data, at FROM events
                     WHERE session_id = ?1 AND seq > ?2 ORDER BY seq",
                )
                .map_err(|e| op.db(e))?;
            let rows = stmt
                .query_map(params![session, after], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, i64>(3)?,
                    ))
                })
                .map_err(|e| op.db(e))?;
            rows.map(|row| {
                let (seq, kind, data, at) = row.map_err(|e| op.db(e))?;
                let data = decode_event_data(&session, seq, &data).map_err(|why| op.fail(why))?;
                Ok(EventRecord {
                    seq,
                    kind,
                    data,
                    at,
                })
            })
            .collect()
        })
        .await
    }

    async fn beat(&self, instance: &str, at: i64, address: Option<&str>) -> Result<(), StoreError> {
        let instance = instance.to_owned();
        let address = address.map(str::to_owned);
        self.run("record a heartbeat", move |conn, op| {
            conn.execute(
                "INSERT INTO runners (instance, heartbeat_at, address) VALUES (?1, ?2, ?3)
                 ON CONFLICT (instance) DO UPDATE
                 SET heartbeat_at = excluded.heartbeat_at, address = excluded.address",
                params![instance, at, address],
            )
            .map(drop)
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn peer(&self, instance: &str) -> Result<Option<Peer>, StoreError> {
        let instance = instance.to_owned();
        self.run("read a heartbeat", move |conn, op| {
            conn.query_row(
                "SELECT heartbeat_at, address FROM runners WHERE instance = ?1",
                [instance],
                |row| {
                    Ok(Peer {
                        at: row.get(0)?,
                        address: row.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn put_agent(&self, slug: &str, document: &str, at: i64) -> Result<bool, StoreError> {
        let (slug, document) = (slug.to_owned(), document.to_owned());
        self.run("store an agent", move |conn, op| {
            let existed = conn
                .query_row("SELECT 1 FROM agents WHERE slug = ?1", [&slug], |_| Ok(()))
                .optional()
                .map_err(|e| op.db(e))?
                .is_some();
            conn.execute(
                "INSERT INTO agents (slug, document, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (slug) DO UPDATE SET document = ?2, updated_at = ?3",
                rusqlite::params![slug, document, at],
            )
            .map_err(|e| op.db(e))?;
            Ok(!existed)
        })
        .await
    }

    async fn get_agent(&self, slug: &str) -> Result<Option<super::StoredAgent>, StoreError> {
        let slug = slug.to_owned();
        self.run("read an agent", move |conn, op| {
            conn.query_row(
                "SELECT slug, document, updated_at FROM agents WHERE slug = ?1",
                [slug],
                |row| {
                    Ok(super::StoredAgent {
                        slug: row.get(0)?,
                        document: row.get(1)?,
                        updated_at: row.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn delete_agent(&self, slug: &str) -> Result<bool, StoreError> {
        let slug = slug.to_owned();
        self.run("remove an agent", move |conn, op| {
            conn.execute("DELETE FROM agents WHERE slug = ?1", [slug])
                .map(|n| n > 0)
                .map_err(|e| op.db(e))
        })
        .await
    }

    async fn agents(&self) -> Result<Vec<super::StoredAgent>, StoreError> {
        self.run("read agents", |conn, op| {
            let mut stmt = conn
                .prepare("SELECT slug, document, updated_at FROM agents ORDER BY slug")
                .map_err(|e| op.db(e))?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(super::StoredAgent {
                        slug: row.get(0)?,
                        document: row.get(1)?,
                        updated_at: row.get(2)?,
                    })
                })
                .map_err(|e| op.db(e))?;
            rows.map(|r| r.map_err(|e| op.db(e))).collect()
        })
        .await
    }

    async fn put_connection(
        &self,
        c: &crate::connections::StoredConnection,
    ) -> Result<(), StoreError> {
        let c = c.clone();
        self.run("store a connection", move |conn, op| {
            let scopes = serde_json::to_string(&c.scopes).unwrap_or_else(|_| "[]".into());
            conn.execute(
                "INSERT INTO connections (subject, toolbox, scopes, connected_at, last_used_at, sealed)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (subject, toolbox) DO UPDATE SET scopes = ?3,
                     connected_at = ?4, last_used_at = ?5, sealed = ?6",
                rusqlite::params![c.subject, c.toolbox, scopes, c.connected_at, c.last_used_at, c.sealed],
            )
            .map(drop)
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn get_connection(
        &self,
        subject: &str,
        toolbox: &str,
    ) -> Result<Option<crate::connections::StoredConnection>, StoreError> {
        let (subject, toolbox) = (subject.to_owned(), toolbox.to_owned());
        self.run("read a connection", move |conn, op| {
            conn.query_row(
                &format!("{CONNECTION} WHERE subject = ?1 AND toolbox = ?2"),
                [subject, toolbox],
                connection_of,
            )
            .optional()
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn delete_connection(&self, subject: &str, toolbox: &str) -> Result<bool, StoreError> {
        let (subject, toolbox) = (subject.to_owned(), toolbox.to_owned());
        self.run("remove a connection", move |conn, op| {
            conn.execute(
                "DELETE FROM connections WHERE subject = ?1 AND toolbox = ?2",
                [subject, toolbox],
            )
            .map(|n| n > 0)
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn connections(
        &self,
        subject: Option<&str>,
    ) -> Result<Vec<crate::connections::StoredConnection>, StoreError> {
        let subject = subject.map(str::to_owned);
        self.run("read connections", move |conn, op| {
            let mut stmt = conn
                .prepare(&format!(
                    "{CONNECTION} WHERE ?1 IS NULL OR subject = ?1 ORDER BY subject, toolbox"
                ))
                .map_err(|e| op.db(e))?;
            let rows = stmt
                .query_map([subject], connection_of)
                .map_err(|e| op.db(e))?;
            rows.map(|r| r.map_err(|e| op.db(e))).collect()
        })
        .await
    }

    async fn append_audit(&self, entry: &audit::Entry) -> Result<audit::Sealed, StoreError> {
        let entry = entry.clone();
        self.run("append to the audit log", move |conn, op| {
            // IMMEDIATE: the head is read and the next record written
            // under the write lock, so no other append comes in between.
            let tx = Immediate::begin(conn).map_err(|e| op.db(e))?;
            let head = audit_head(&tx).map_err(|e| op.db(e))?;
            let (seq, prev) = match head {
                Some(h) => (h.seq + 1, h.hash),
                None => (1, audit::GENESIS.to_string()),
            };
            let sealed = audit::seal(&entry, seq, &prev).map_err(|e| op.fail(e))?;
            tx.prepare_cached("INSERT INTO audit (seq, hash, line) VALUES (?1, ?2, ?3)")
                .and_then(|mut st| st.execute(rusqlite::params![seq, sealed.hash, sealed.line]))
                .map_err(|e| op.db(e))?;
            tx.commit().map_err(|e| op.db(e))?;
            Ok(sealed)
        })
        .await
    }

    async fn audit_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<audit::Sealed>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("read the audit log", move |conn, op| {
            let mut st = conn
                .prepare_cached(
                    "SELECT seq, hash, line FROM audit WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )
                .map_err(|e| op.db(e))?;
            let rows = st
                .query_map(rusqlite::params![after, limit], |row| {
                    Ok(audit::Sealed {
                        seq: row.get(0)?,
                        hash: row.get(1)?,
                        line: row.get(2)?,
                    })
                })
                .map_err(|e| op.db(e))?;
            rows.map(|r| r.map_err(|e| op.db(e))).collect()
        })
        .await
    }

    async fn audit_head(&self) -> Result<Option<audit::Head>, StoreError> {
        self.run("read the audit log's head", |conn, op| {
            audit_head(conn).map_err(|e| op.db(e))
        })
        .await
    }

    async fn claim(
        &self,
        limits: &[(Gauge, f64)],
        earlier: &Unwritten,
        row: &Use,
    ) -> Result<Claimed, StoreError> {
        let limits = limits.to_vec();
        let earlier = earlier.clone();
        let row = row.clone();
        self.run("claim a budget", move |conn, op| {
            // IMMEDIATE: the sums are read and the row written under the
            // write lock, so no other claim comes in between.
            let tx = Immediate::begin(conn).map_err(|e| op.db(e))?;
            write_unwritten(&tx, &earlier).map_err(|e| op.db(e))?;
            let mut used = Vec::with_capacity(limits.len());
            for (index, (gauge, limit)) in limits.iter().enumerate() {
                let standing = measure_one(&tx, gauge).map_err(|e| op.db(e))?;
                if standing.used >= *limit {
                    tx.commit().map_err(|e| op.db(e))?;
                    return Ok(Claimed::Exhausted { index, standing });
                }
                used.push(standing.used);
            }
            let id = insert_use(&tx, &row).map_err(|e| op.db(e))?;
            tx.commit().map_err(|e| op.db(e))?;
            Ok(Claimed::Granted { id, used })
        })
        .await
    }

    async fn record(&self, earlier: &Unwritten) -> Result<(), StoreError> {
        if earlier.is_empty() {
            return Ok(());
        }
        let earlier = earlier.clone();
        self.run_short("record usage", move |conn, op| {
            let tx = conn.transaction().map_err(|e| op.db(e))?;
            write_unwritten(&tx, &earlier).map_err(|e| op.db(e))?;
            tx.commit().map_err(|e| op.db(e))
        })
        .await
    }

    async fn measure(&self, gauges: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
        let gauges = gauges.to_vec();
        self.run("measure usage", move |conn, op| {
            gauges
                .iter()
                .map(|g| measure_one(conn, g).map_err(|e| op.db(e)))
                .collect()
        })
        .await
    }

    async fn peak(
        &self,
        agent: &str,
        meter: Meter,
        by: PeakBy,
        since: i64,
    ) -> Result<f64, StoreError> {
        let agent = agent.to_owned();
        self.run("measure usage", move |conn, op| {
            conn.query_row(
                &format!(
                    "SELECT COALESCE(MAX(total), 0) FROM (SELECT SUM({}) AS total FROM usage {})",
                    meter_sql(meter),
                    crate::usage::peak_rows(by, '?')
                ),
                params![agent, since],
                |r| r.get(0),
            )
            .map_err(|e| op.db(e))
        })
        .await
    }

    async fn report(&self, from: i64, to: i64, group: Group) -> Result<Vec<ReportRow>, StoreError> {
        self.run("report usage", move |conn, op| {
            let col = group.column();
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {col}, {TOTALS} FROM usage WHERE at >= ?1 AND at < ?2
                     GROUP BY {col} ORDER BY 4 DESC, 1"
                ))
                .map_err(|e| op.db(e))?;
            let rows = stmt
                .query_map(params![from, to], |r| {
                    Ok(ReportRow {
                        key: r.get(0)?,
                        totals: totals_at(r, 1)?,
                    })
                })
                .map_err(|e| op.db(e))?;
            rows.map(|r| r.map_err(|e| op.db(e))).collect()
        })
        .await
    }

    async fn session_totals(&self, session: &str) -> Result<Totals, StoreError> {
        let session = session.to_owned();
        self.run_short("read a session's usage", move |conn, op| {
            conn.prepare_cached(SESSION_TOTALS)
                .and_then(|mut s| s.query_row([&session], |r| totals_at(r, 0)).optional())
                .map(Option::unwrap_or_default)
                .map_err(|e| op.db(e))
        })
        .await
    }

    async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.run("read heartbeats", |conn, op| {
            let mut stmt = conn
                .prepare("SELECT instance, heartbeat_at FROM runners")
                .map_err(|e| op.db(e))?;
            let rows = stmt
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(|e| op.db(e))?;
            rows.map(|r| r.map_err(|e| op.db(e))).collect()
        })
        .await
    }

    async fn forget_runner(&self, instance: &str) -> Result<(), StoreError> {
        let instance = instance.to_owned();
        self.run("remove a heartbeat", move |conn, op| {
            conn.execute("DELETE FROM runners WHERE instance = ?1", [instance])
                .map(drop)
                .map_err(|e| op.db(e))
        })
        .await
    }

    async fn prune_runners(&self, before: i64) -> Result<u64, StoreError> {
        self.run("remove old heartbeats", move |conn, op| {
            conn.execute("DELETE FROM runners WHERE heartbeat_at < ?1", [before])
                .map(|n| n as u64)
                .map_err(|e| op.db(e))
        })
        .await
    }

    /// Forget the histories kept, and empty the connection's page cache (up
    /// to 2 MiB of pages that a burst of sessions read) and its prepared
    /// statements; all come back as they are needed.
    async fn release_memory(&self) {
        self.histories.clear();
        let released = self
            .run("release the page cache", |conn, op| {
                conn.flush_prepared_statement_cache();
                conn.execute_batch("PRAGMA shrink_memory")
                    .map_err(|e| op.db(e))
            })
            .await;
        if let Err(e) = released {
            tracing::debug!(error = %e, "cannot release SQLite's page cache");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{full_record, record, store_contract, Fresh};
    use crate::model::StoredParams;
    use bindery_llm::ChatMessage;
    use bindery_params::{ParamValue, SecretString, Values};
    use serde_json::json;

    async fn fresh() -> Fresh {
        let dir = tempfile::tempdir().unwrap();
        Fresh {
            store: Arc::new(open_in(&dir)),
            keep: Box::new(dir),
        }
    }

    store_contract!(fresh);

    fn open_in(dir: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(&format!("sqlite://{}", dir.path().join("s.db").display()))
            .expect("open the store")
    }

    fn schema_versions(path: &Path) -> Vec<i64> {
        let conn = Connection::open(path).unwrap();
        let mut stmt = conn
            .prepare("SELECT version FROM schema_migrations ORDER BY version")
            .unwrap();
        let versions = stmt.query_map([], |r| r.get(0)).unwrap();
        versions.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[tokio::test]
    async fn open_creates_the_directory_and_takes_a_plain_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/sessions.db");
        let store = SqliteStore::open(path.to_str().unwrap()).unwrap();
        assert_eq!(store.path(), path);
        assert!(path.is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the file is private to its owner");
        }
        assert!(SqliteStore::open("sqlite://").is_err());
    }

    #[tokio::test]
    async fn data_survives_close_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = full_record();
        {
            let store = open_in(&dir);
            store.create(&mut rec).await.unwrap();
            store
                .append_event(&rec.id, "run_started", &json!({"run": 1}), 5)
                .await
                .unwrap();
        }
        let store = open_in(&dir);
        assert_eq!(store.get(&rec.id).await.unwrap(), Some(rec.clone()));
        let events = store.events_after(&rec.id, 0).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data, json!({"run": 1}));
        assert_eq!(
            store
                .append_event(&rec.id, "run_finished", &json!({}), 6)
                .await
                .unwrap(),
            2
        );
    }

    /// A session's usage sums (every view reads them) are one row of
    /// their own, found by its key; a session budget's window reads the
    /// index by session alone, never the table, where sessions' rows lie
    /// interleaved.
    #[tokio::test]
    async fn a_sessions_usage_is_read_from_its_sums_row_and_its_window_from_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = open_in(&dir).path().to_owned();
        let conn = Connection::open(&path).unwrap();
        let (session, _) = crate::usage::Scope::Session("s1".into()).filter('?');
        let (user, _) = crate::usage::Scope::User {
            agent: "a".into(),
            subject: "alice".into(),
        }
        .filter('?');
        for (sql, args, wanted) in [
            (
                SESSION_TOTALS.to_owned(),
                &["s1"][..],
                "SEARCH session_usage USING PRIMARY KEY",
            ),
            (
                window_sql(&session, 1, Meter::Tokens),
                &["s1", "0"][..],
                "COVERING INDEX usage_session",
            ),
            // An end user's window: their rows of the agent, from the
            // partial index alone.
            (
                window_sql(&user, 2, Meter::Cost),
                &["a", "alice", "0"][..],
                "COVERING INDEX usage_agent_subject_at",
            ),
        ] {
            let plan: String = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(plan.contains(wanted), "{sql}: {plan}");
        }
    }

    /// A store's file as schema 10 left it: migration 11 undone.
    /// What migration 12 added to the usage rows, taken back.
    /// Undoes migrations 12 and after (the audit log's, 13, and the usage
    /// rows' subject, 14, too).
    const BEFORE_SCHEMA_12: &str = "DROP TABLE audit;
        DROP TABLE connections;
        DROP INDEX usage_agent_subject_at;
        ALTER TABLE usage DROP COLUMN subject;
        DROP INDEX usage_session;
        CREATE INDEX usage_session ON usage
            (session, at, prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool);
        ALTER TABLE usage DROP COLUMN cache_read_tokens;
        ALTER TABLE usage DROP COLUMN cache_write_tokens;
        ALTER TABLE usage DROP COLUMN reasoning_tokens;";

    const BACK_TO_SCHEMA_10: &str = "DROP TRIGGER usage_added;
        DROP TRIGGER usage_changed;
        DROP TRIGGER usage_removed;
        DROP TABLE session_usage;
        DELETE FROM schema_migrations WHERE version >= 11;";

    /// A store from before the kept sums (migration 11) gets them from
    /// its rows on upgrade, an older server's rows among them, and keeps
    /// them from then on.
    #[tokio::test]
    async fn an_older_store_gets_its_sessions_usage_sums_on_upgrade() {
        use crate::contract::{sums_kept_after_an_upgrade, usage_before_an_upgrade};
        let dir = tempfile::tempdir().unwrap();
        let path = {
            let store = open_in(&dir);
            usage_before_an_upgrade(&store).await;
            store.path().to_owned()
        };
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(BACK_TO_SCHEMA_10).unwrap();
        conn.execute_batch(BEFORE_SCHEMA_12).unwrap();
        conn.execute_batch(
            "INSERT INTO usage (at, agent, session, run, model, tool, prompt_tokens,
                 completion_tokens, estimated, tool_calls, cost)
             VALUES (4, 'a', 's1', 'r', 'm', 'bash_x', 0, 0, 0, 1, 0.5);",
        )
        .unwrap();
        drop(conn);
        let store = open_in(&dir);
        sums_kept_after_an_upgrade(&store).await;
        // A row that goes takes its part of the sums with it.
        let conn = Connection::open(&path).unwrap();
        conn.execute("DELETE FROM usage WHERE at = 4", []).unwrap();
        let s1 = store.session_totals("s1").await.unwrap();
        assert_eq!((s1.tool_calls, s1.cost), (0, 0.0));
    }

    /// A step that fails (here on a table of its name made by hand) says
    /// which step it was, what SQLite found and where the file was left,
    /// not the step's whole SQL; nothing of the step stays.
    #[tokio::test]
    async fn a_failed_migration_names_its_step_not_its_sql() {
        let dir = tempfile::tempdir().unwrap();
        let path = open_in(&dir).path().to_owned();
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(BACK_TO_SCHEMA_10).unwrap();
        conn.execute("CREATE TABLE session_usage (note TEXT)", [])
            .unwrap();
        drop(conn);
        let err = SqliteStore::open(&path.to_string_lossy())
            .unwrap_err()
            .to_string();
        let known = MIGRATIONS.len();
        for said in [
            &format!("to schema 11 (of {known})"),
            "table session_usage already exists",
            "left at schema 10",
            &path.display().to_string(),
        ] {
            assert!(err.contains(said), "{said:?} not in: {err}");
        }
        for quoted in ["CREATE", "TRIGGER", "SELECT"] {
            assert!(!err.contains(quoted), "the step's SQL in: {err}");
        }
        assert_eq!(schema_versions(&path), (1..=10).collect::<Vec<i64>>());
    }

    #[tokio::test]
    async fn migrations_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = open_in(&dir).path().to_owned();
        let all: Vec<i64> = (1..=MIGRATIONS.len() as i64).collect();
        assert_eq!(schema_versions(&path), all);
        let store = open_in(&dir);
        store.create(&mut record("s1", 1)).await.unwrap();
        drop(store);
        let store = open_in(&dir);
        assert_eq!(schema_versions(&path), all);
        assert!(store.get("s1").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_history_kept_in_the_row_before_migration_8_moves_to_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = full_record();
        let path = {
            let store = open_in(&dir);
            store.create(&mut rec).await.unwrap();
            store.path().to_owned()
        };
        // The file as a Bindery before migration 8 left it: the whole
        // history in the row.
        let conn = Connection::open(&path).unwrap();
        let history = serde_json::to_string(&rec.turns).unwrap();
        conn.execute("UPDATE sessions SET turns = ?1", [history])
            .unwrap();
        conn.execute_batch(
            "ALTER TABLE sessions DROP COLUMN turn_count;
             DROP TABLE turns;
             DROP INDEX sessions_waiting;
             DROP TRIGGER usage_added;
             DROP TRIGGER usage_changed;
             DROP TRIGGER usage_removed;
             DROP TABLE session_usage;
             DELETE FROM schema_migrations WHERE version >= 8",
        )
        .unwrap();
        conn.execute_batch(BEFORE_SCHEMA_12).unwrap();
        drop(conn);
        let store = open_in(&dir);
        let mut back = store.get(&rec.id).await.unwrap().unwrap();
        assert_eq!(back, rec);
        let conn = Connection::open(&path).unwrap();
        let (rows, row_turns): (i64, String) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM turns), turns FROM sessions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(rows, rec.turns.len() as i64);
        assert_eq!(row_turns, "[]");
        back.turns.push(ChatMessage::user("more").into());
        back.version += 1;
        store.update(&mut back).await.unwrap();
        assert_eq!(store.get(&rec.id).await.unwrap().unwrap(), back);
    }

    /// A short operation runs on the caller's thread, where it never waits
    /// for another process's lock: finding it taken, it waits on the
    /// blocking pool, and succeeds once the lock is let go.
    #[tokio::test]
    async fn a_short_write_waits_for_another_processs_lock_off_the_callers_thread() {
        use futures::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        store.create(&mut record("s1", 1)).await.unwrap();
        let blocker = Connection::open(store.path()).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let data = json!({});
        let append = store.append_event("s1", "run_started", &data, 5);
        tokio::pin!(append);
        // The first poll tries here, finds the lock taken and hands the
        // operation to the pool, instead of failing or blocking this thread.
        assert!((&mut append).now_or_never().is_none());
        blocker.execute_batch("COMMIT").unwrap();
        assert_eq!(append.await.unwrap(), 1);
        // The next one runs here again.
        let again = store.append_event("s1", "run_finished", &data, 6);
        assert_eq!(again.now_or_never().map(Result::unwrap), Some(2));
    }

    /// Once the write-ahead log is long, its pages are copied into the
    /// database file, by the checkpoint thread rather than a commit.
    #[tokio::test]
    async fn a_long_log_is_checkpointed_aside() {
        use bindery_tests::eventually::{eventually, PATIENCE};
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        store.create(&mut record("s1", 1)).await.unwrap();
        let size = || std::fs::metadata(store.path()).unwrap().len();
        let before = size();
        // About a page an event: the log passes the mark.
        let page = json!("x".repeat(4000));
        let n = i64::from(CHECKPOINT_PAGES);
        for at in 0..n {
            store.append_event("s1", "k", &page, at).await.unwrap();
        }
        let written = u64::try_from(n / 2 * 4000).unwrap();
        eventually("the database file holds the events", PATIENCE, async || {
            (size() > before + written).then_some(())
        })
        .await;
    }

    /// A read keeps the history it read, and the next read of the session
    /// reads only what was added since, whoever wrote it: here another
    /// process on the same file.
    #[tokio::test]
    async fn a_read_after_writes_elsewhere_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let here = open_in(&dir);
        let there = dir.path().join("s.db");
        let there = SqliteStore::open_with(&there.to_string_lossy(), false).unwrap();
        let mut rec = full_record();
        here.create(&mut rec).await.unwrap();
        let read = here.get(&rec.id).await.unwrap().unwrap();
        assert_eq!(read, rec);
        assert_eq!(here.histories.known(&rec.id), Some(rec.turns.len()));

        let mut elsewhere = there.get(&rec.id).await.unwrap().unwrap();
        elsewhere.turns.push(ChatMessage::user("and b.txt?").into());
        elsewhere.status = crate::model::SessionStatus::Running;
        elsewhere.version += 1;
        there.update(&mut elsewhere).await.unwrap();
        assert_eq!(here.get(&rec.id).await.unwrap(), Some(elsewhere.clone()));
        assert_eq!(here.histories.known(&rec.id), Some(rec.turns.len() + 1));

        // Written here: kept as written, and read back so.
        let mut mine = elsewhere.clone();
        mine.turns
            .push(ChatMessage::assistant("b.txt says bye").into());
        mine.version += 1;
        here.update(&mut mine).await.unwrap();
        assert_eq!(here.histories.known(&rec.id), Some(mine.turns.len()));
        assert_eq!(here.get(&rec.id).await.unwrap(), Some(mine.clone()));
        assert_eq!(there.get(&rec.id).await.unwrap(), Some(mine));

        here.release_memory().await;
        assert_eq!(here.histories.known(&rec.id), None);
    }

    /// A cached statement is compiled once: binding another session's id
    /// does not make SQLite parse and plan it again (it did, on every use,
    /// for the statements whose plan a bound value might change).
    #[tokio::test]
    async fn writes_and_reads_reuse_their_compiled_statements() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        let mut sessions = [record("a", 1), record("b", 2)];
        for rec in &mut sessions {
            store.create(rec).await.unwrap();
        }
        let event = [("message", json!({"text": "hi"}))];
        for round in 0..3 {
            for rec in &mut sessions {
                rec.turns
                    .push(ChatMessage::user(format!("turn {round}")).into());
                rec.version += 1;
                store.update_with_events(rec, &event, 10).await.unwrap();
                store
                    .append_event(&rec.id, "message", &event[0].1, 11)
                    .await
                    .unwrap();
                assert_eq!(store.get(&rec.id).await.unwrap().as_ref(), Some(&*rec));
                store.events_after(&rec.id, 0).await.unwrap();
            }
        }
        let conn = store.conn.lock().unwrap();
        // Taken from the cache, each statement has its counters since it
        // was compiled.
        let statements = [
            format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"),
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?1".to_owned(),
            "INSERT INTO events (session_id, seq, kind, data, at) VALUES (?1, ?2, ?3, ?4, ?5)"
                .to_owned(),
            "INSERT INTO turns (session_id, idx, message) VALUES (?1, ?2, ?3)".to_owned(),
            "SELECT 1 FROM sessions WHERE id = ?1".to_owned(),
        ];
        for sql in &statements {
            let stmt = conn.prepare_cached(sql).unwrap();
            let runs = stmt.get_status(rusqlite::StatementStatus::Run);
            assert!(runs > 0, "not cached, or never run: {sql}");
            assert_eq!(
                stmt.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "compiled again after {runs} runs: {sql}"
            );
        }
    }

    /// The lists the heartbeat reads (running sessions, and with a
    /// `confirmTtl` the waiting ones) go through their partial indexes. A
    /// bound `status = ?1` cannot, with the planner's stability guarantee
    /// on: every heartbeat read every session in the file, and filled the
    /// page cache again after eviction had emptied it.
    #[tokio::test]
    async fn the_heartbeats_lists_read_only_their_partial_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        let conn = store.conn.lock().unwrap();
        for (tail, index) in [(RUNNING, "sessions_running"), (WAITING, "sessions_waiting")] {
            let sql = format!("EXPLAIN QUERY PLAN SELECT {SESSION_COLUMNS} FROM sessions {tail}");
            let mut stmt = conn.prepare(&sql).unwrap();
            let plan: Vec<String> = stmt
                .query_map([], |row| row.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(
                plan,
                [format!("SCAN sessions USING INDEX {index}")],
                "{tail}"
            );
        }
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = open_in(&dir).path().to_owned();
        Connection::open(&path)
            .unwrap()
            .execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)",
                [],
            )
            .unwrap();
        let err = SqliteStore::open(path.to_str().unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "{} was written by a newer Bindery (schema 99); this binary knows up to {}",
                path.display(),
                MIGRATIONS.len()
            )),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_corrupt_row_names_the_session_and_column_not_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        store.create(&mut record("s1", 1)).await.unwrap();
        Connection::open(store.path())
            .unwrap()
            .execute(
                "UPDATE sessions SET turns = '[{\"role\": \"wizard-4d1e\"}]' WHERE id = 's1'",
                [],
            )
            .unwrap();
        for result in [
            store.get("s1").await.map(drop),
            store.list().await.map(drop),
        ] {
            match result {
                Err(StoreError::Backend(msg)) => {
                    assert!(msg.contains("session s1"), "{msg}");
                    assert!(msg.contains("column turns"), "{msg}");
                    assert!(msg.contains(&store.path().display().to_string()), "{msg}");
                    assert!(!msg.contains("wizard-4d1e"), "{msg}");
                }
                other => panic!("expected Backend, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_poisoned_connection_is_a_backend_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        let conn = Arc::clone(&store.conn);
        let _ = std::thread::spawn(move || {
            let _guard = conn.lock();
            panic!("a panic while holding the connection (expected by this test)");
        })
        .join();
        assert!(matches!(store.get("s1").await, Err(StoreError::Backend(_))));
    }

    /// Secret values never reach the disk: `StoredParams` drops them, and
    /// nothing else in the record carries them.
    #[tokio::test]
    async fn a_secret_value_leaves_no_trace_in_the_files() {
        const CANARY: &str = "canary-7f3a9c";
        const PLAIN: &str = "plain-5b2e1d";
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(&dir);
        let mut values = Values::new();
        values.insert(
            "billing_token".into(),
            ParamValue::Secret(SecretString::new(CANARY)),
        );
        values.insert("tenant".into(), ParamValue::Plain(json!(PLAIN)));
        let mut rec = full_record();
        rec.params = StoredParams::from_values(&values);
        store.create(&mut rec).await.unwrap();
        rec.version = 2;
        store.update(&mut rec).await.unwrap();
        store
            .append_event(&rec.id, "run_started", &json!({"params": rec.params}), 1)
            .await
            .unwrap();

        // FULL copies the WAL into the database but leaves the WAL's frames
        // in place, so both files hold everything written.
        store
            .conn
            .lock()
            .unwrap()
            .query_row("PRAGMA wal_checkpoint(FULL)", [], |_| Ok(()))
            .unwrap();
        let mut bytes = std::fs::read(store.path()).unwrap();
        let mut wal = store.path().as_os_str().to_owned();
        wal.push("-wal");
        bytes.extend(std::fs::read(&wal).expect("the WAL is still there"));
        let contains = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
        assert!(contains(PLAIN), "the scan sees plain values");
        assert!(!contains(CANARY), "a secret value reached the database");
    }

    /// One file, one server: a second store on it is refused, naming the
    /// holder, until the first is gone.
    #[tokio::test]
    async fn a_second_store_on_a_file_in_use_is_refused_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = open_in(&dir);
        let err = SqliteStore::open(&first.path().to_string_lossy())
            .unwrap_err()
            .to_string();
        let me = format!("Bindery server pid {} on ", std::process::id());
        assert!(err.contains(&me), "{err}");
        assert!(err.contains("one SQLite file serves one server"), "{err}");
        drop(first);
        let again = open_in(&dir);
        again.create(&mut record("s1", 1)).await.unwrap();
    }

    /// A hold that lingers a moment after its store is let go (a copy of
    /// the descriptor in a child another thread is spawning) is waited
    /// out, not taken for another server's.
    #[tokio::test]
    async fn a_hold_of_this_process_that_lingers_a_moment_is_waited_out() {
        let dir = tempfile::tempdir().unwrap();
        let first = open_in(&dir);
        let copy = first
            .conn
            .lock()
            .unwrap()
            ._hold
            .as_ref()
            .unwrap()
            .try_clone()
            .unwrap();
        drop(first);
        let lingering = std::thread::spawn(move || {
            // The child's copy, closed at its exec a moment later.
            std::thread::sleep(Duration::from_millis(200));
            drop(copy);
        });
        let again = open_in(&dir);
        again.create(&mut record("s1", 1)).await.unwrap();
        lingering.join().unwrap();
    }

    /// The hold is on the file, not on a name: a second store through a
    /// hard link or a symbolic link to it, or after its `.lock` note was
    /// deleted, is refused naming the holder's pid (from the kernel's list
    /// of locks where no note is beside that name).
    #[tokio::test]
    async fn a_second_store_on_another_name_of_a_file_in_use_is_refused_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = open_in(&dir);
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(first.path(), &hard).unwrap();
        let soft = dir.path().join("soft.db");
        std::os::unix::fs::symlink(first.path(), &soft).unwrap();
        let me = format!("pid {} ", std::process::id());
        for other in [&hard, &soft] {
            let err = SqliteStore::open(&other.to_string_lossy())
                .unwrap_err()
                .to_string();
            assert!(err.contains(&me), "{}: {err}", other.display());
            assert!(err.contains("one SQLite file serves one server"), "{err}");
        }
        std::fs::remove_file(holder_note(first.path())).unwrap();
        let err = SqliteStore::open(&first.path().to_string_lossy())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&me), "{err}");
        drop(first);
        let again = SqliteStore::open(&hard.to_string_lossy()).unwrap();
        again.create(&mut record("s1", 1)).await.unwrap();
    }

    /// A `file:` URI is refused: SQLite would open the file it names, not
    /// the one held.
    #[test]
    fn a_file_uri_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("sqlite://file:{}", dir.path().join("s.db").display());
        let err = SqliteStore::open(&uri).unwrap_err().to_string();
        assert!(err.contains("a file: URI is not a path"), "{err}");
        assert!(!Path::new("file:").exists(), "a directory made for the URI");
    }

    #[test]
    fn the_holder_of_a_flock_is_read_from_the_kernels_list() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 fd:01:1234 1073741824 1073741824
2: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 99 fd:01:1234 0 EOF
3: FLOCK  ADVISORY  WRITE 5151 103:02:1234 0 EOF
3: FLOCK  ADVISORY  WRITE 6161 08:1234:1234 0 EOF
4: FLOCK  ADVISORY  WRITE 0 00:2a:7 0 EOF
";
        assert_eq!(flock_holder_in(locks, 0xfd01, 1234), Some(4242));
        // Majors and minors past 255 (glibc's `makedev(0x103, 2)` and
        // `makedev(8, 0x1234)`).
        assert_eq!(flock_holder_in(locks, 0x10302, 1234), Some(5151));
        assert_eq!(flock_holder_in(locks, 0x120_0834, 1234), Some(6161));
        assert_eq!(flock_holder_in(locks, 0xfd01, 1235), None);
        // Not visible from this pid namespace.
        assert_eq!(flock_holder_in(locks, 0x2a, 7), None);
    }

    /// Pages damaged in the middle of a file that opens (its header and
    /// schema intact) are found at open, not at the first listing.
    #[tokio::test]
    async fn a_file_with_damaged_pages_is_refused_at_open() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = {
            let store = open_in(&dir);
            for i in 0..300 {
                let mut rec = full_record();
                rec.id = format!("s{i}");
                store.create(&mut rec).await.unwrap();
            }
            let conn = store.conn.lock().unwrap();
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
            store.path().to_owned()
        };
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len > 64 * 4096, "{len}");
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for page in [len / 4096 / 2, len / 4096 / 2 + 3] {
            file.seek(SeekFrom::Start(page * 4096)).unwrap();
            file.write_all(&[0xA5; 4096]).unwrap();
        }
        drop(file);
        let err = SqliteStore::open(&path.to_string_lossy()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("the integrity check failed"), "{text}");
        assert!(text.contains("restore the file from a backup"), "{text}");
    }

    /// The note of who holds the file is never written through a symlink.
    #[tokio::test]
    async fn the_holders_note_does_not_follow_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("s.db.lock")).unwrap();
        let store = open_in(&dir);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        let note = std::fs::read_to_string(dir.path().join("s.db.lock")).unwrap();
        assert!(note.starts_with("Bindery server pid"), "{note}");
        drop(store);
    }
}
