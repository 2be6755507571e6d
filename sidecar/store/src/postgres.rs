//! The shared session store: PostgreSQL, for several replicas of one tenant.
//!
//! Same semantics as the SQLite store (optimistic `version`, per-session
//! event `seq`, versioned migrations), made safe across processes by the
//! database: migrations run under a transaction-scoped advisory lock, and
//! an append locks its session's row while it numbers the event.
//!
//! Operations take a connection from a pool (deadpool-postgres, sized by
//! `--store-pool-size`), so no operation waits behind another's round trip
//! and no lock is held across one. Statements are prepared once per
//! connection and cached. The hot writes are one statement each: an event's
//! `seq` comes from a per-session counter bumped by the same statement that
//! inserts the event. A lost connection is dropped from the pool when it is
//! next taken (the operation that saw it fail reports the failure; a write
//! is never retried blind, since it may have committed).
//!
//! The URL holds a password: it is shown only through [`redact`]. Errors
//! from the server are reported by severity, message and SQLSTATE, never
//! their DETAIL, which can quote row contents.
//!
//! TLS follows libpq's `sslmode` (see `postgres_tls.rs`): `disable`,
//! `prefer` (the default), `require` and `verify-full` (with `sslrootcert`
//! or the system's roots); `verify-ca` is refused with a message saying so.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio::sync::broadcast;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::AsyncMessage;
use tokio_postgres::{Config, Row};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::location::redact;
use super::postgres_tls::{client_config, Tls, Verify};
use super::record::{decode_event_data, lineage_query, Columns, NewTurns, SESSION_COLUMNS};
use super::{Notice, Peer, SessionStore, StoreError};
use crate::audit;
use crate::model::{EventRecord, SessionRecord};
use crate::quota::{RunCap, Started};
use crate::usage::{
    meter_sql, Claimed, Gauge, Group, PeakBy, ReportRow, Standing, Totals, Unwritten, Use,
};
use bindery_spec::budget::Meter;
use bindery_tools::lineage::Kin;

/// The schema, one step per entry; entry `i` brings the database to version
/// `i + 1`. Append only: a released step is never edited. Tables carry a
/// `bindery_` prefix since the database may be shared with other software.
/// JSON columns are TEXT, exactly as in SQLite, so that both stores share
/// one mapping ([`Columns`]).
const MIGRATIONS: &[&str] = &[
    // 1: sessions and their event streams.
    "CREATE TABLE bindery_sessions (
        id            TEXT PRIMARY KEY,
        agent         TEXT NOT NULL,
        status        TEXT NOT NULL,
        status_detail TEXT,
        created_at    BIGINT NOT NULL,
        updated_at    BIGINT NOT NULL,
        version       BIGINT NOT NULL,
        turns         TEXT NOT NULL,
        params        TEXT NOT NULL,
        security      TEXT NOT NULL,
        forked_from   TEXT
    );
    CREATE INDEX bindery_sessions_created_at ON bindery_sessions (created_at);
    CREATE TABLE bindery_events (
        session_id TEXT NOT NULL REFERENCES bindery_sessions (id) ON DELETE CASCADE,
        seq        BIGINT NOT NULL,
        kind       TEXT NOT NULL,
        data       TEXT NOT NULL,
        at         BIGINT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );",
    // 2: which server runs a session's run, and the servers' heartbeats.
    "ALTER TABLE bindery_sessions ADD COLUMN runner TEXT;
    CREATE INDEX bindery_sessions_running ON bindery_sessions (id) WHERE status = 'running';
    CREATE TABLE bindery_runners (
        instance     TEXT PRIMARY KEY,
        heartbeat_at BIGINT NOT NULL
    );",
    // 3: a cancel asked of a run by a server that does not run it.
    "ALTER TABLE bindery_sessions ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;",
    // 4: the tool calls a session waits for (no token, no bound value).
    "ALTER TABLE bindery_sessions ADD COLUMN pending TEXT NOT NULL DEFAULT '{\"items\":[]}';",
    // 5: each session's last event seq, so that an append numbers its event
    // and inserts it in one statement.
    "ALTER TABLE bindery_sessions ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
    UPDATE bindery_sessions s SET event_seq = e.last
      FROM (SELECT session_id, MAX(seq) AS last FROM bindery_events GROUP BY session_id) e
      WHERE e.session_id = s.id;",
    // 6: the server holding a session's secret values, and where each
    // server is reached by its peers.
    "ALTER TABLE bindery_sessions ADD COLUMN holder TEXT;
    ALTER TABLE bindery_runners ADD COLUMN address TEXT;",
    // 7: agents kept by the API (`PUT /v1/agents/:slug`).
    "CREATE TABLE bindery_agents (
        slug       TEXT PRIMARY KEY,
        document   TEXT NOT NULL,
        updated_at BIGINT NOT NULL
    );",
    // 8: what runs used, for budgets and reports (kept when sessions go).
    "CREATE TABLE bindery_usage (
        id                BIGSERIAL PRIMARY KEY,
        at                BIGINT NOT NULL,
        agent             TEXT NOT NULL,
        session           TEXT NOT NULL,
        run               TEXT NOT NULL,
        model             TEXT NOT NULL,
        tool              TEXT,
        prompt_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        estimated         BOOLEAN NOT NULL,
        tool_calls        BIGINT NOT NULL,
        cost              DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX bindery_usage_agent_at ON bindery_usage (agent, at);
    CREATE INDEX bindery_usage_session ON bindery_usage (session);
    CREATE INDEX bindery_usage_run ON bindery_usage (run);
    CREATE INDEX bindery_usage_at ON bindery_usage (at);",
    // 9: a session's turns as rows of their own, so that a write appends
    // the new ones instead of rewriting the whole history; the turns the
    // rows held move there (as text: json, not jsonb, keeps it as written).
    "CREATE TABLE bindery_turns (
        session_id TEXT NOT NULL REFERENCES bindery_sessions (id) ON DELETE CASCADE,
        idx        BIGINT NOT NULL,
        message    TEXT NOT NULL,
        PRIMARY KEY (session_id, idx)
    );
    INSERT INTO bindery_turns (session_id, idx, message)
        SELECT s.id, t.n - 1, t.m::TEXT
        FROM bindery_sessions s, json_array_elements(s.turns::JSON) WITH ORDINALITY AS t(m, n);
    ALTER TABLE bindery_sessions ADD COLUMN turn_count BIGINT NOT NULL DEFAULT 0;
    UPDATE bindery_sessions SET turn_count = json_array_length(turns::JSON), turns = '[]';",
    // 10: a session's usage summed from its index alone (every view reads
    // the sums), and a session budget's window read as a range of it.
    "DROP INDEX bindery_usage_session;
    CREATE INDEX bindery_usage_session ON bindery_usage (session, at)
        INCLUDE (prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool);",
    // 11: the sessions waiting for a continuation found as the running
    // ones are: with a `confirmTtl`, each heartbeat looks for expired calls.
    "CREATE INDEX bindery_sessions_waiting ON bindery_sessions (id)
        WHERE status = 'waiting_external';",
    // 12: a session's usage sums kept up to date as its rows come and
    // change, so that a view reads one row rather than adding up one per
    // model request and tool call of the session's whole life. A trigger
    // keeps them, whichever statement (or older server) writes a row.
    "CREATE TABLE bindery_session_usage (
        session           TEXT PRIMARY KEY,
        prompt_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        estimated_tokens  BIGINT NOT NULL,
        model_requests    BIGINT NOT NULL,
        tool_calls        BIGINT NOT NULL,
        cost              DOUBLE PRECISION NOT NULL
    );
    INSERT INTO bindery_session_usage
        SELECT session, SUM(prompt_tokens), SUM(completion_tokens),
            SUM(CASE WHEN estimated THEN prompt_tokens + completion_tokens ELSE 0 END),
            COUNT(*) FILTER (WHERE tool IS NULL), SUM(tool_calls), SUM(cost)
        FROM bindery_usage GROUP BY session;
    CREATE OR REPLACE FUNCTION bindery_session_usage_follow() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            UPDATE bindery_session_usage SET
                prompt_tokens = prompt_tokens - OLD.prompt_tokens,
                completion_tokens = completion_tokens - OLD.completion_tokens,
                estimated_tokens = estimated_tokens - CASE WHEN OLD.estimated
                    THEN OLD.prompt_tokens + OLD.completion_tokens ELSE 0 END,
                model_requests = model_requests - CASE WHEN OLD.tool IS NULL THEN 1 ELSE 0 END,
                tool_calls = tool_calls - OLD.tool_calls,
                cost = cost - OLD.cost
            WHERE session = OLD.session;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO bindery_session_usage AS u VALUES (
                NEW.session, NEW.prompt_tokens, NEW.completion_tokens,
                CASE WHEN NEW.estimated THEN NEW.prompt_tokens + NEW.completion_tokens ELSE 0 END,
                CASE WHEN NEW.tool IS NULL THEN 1 ELSE 0 END, NEW.tool_calls, NEW.cost)
            ON CONFLICT (session) DO UPDATE SET
                prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
                completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
                estimated_tokens = u.estimated_tokens + EXCLUDED.estimated_tokens,
                model_requests = u.model_requests + EXCLUDED.model_requests,
                tool_calls = u.tool_calls + EXCLUDED.tool_calls,
                cost = u.cost + EXCLUDED.cost;
        END IF;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER bindery_usage_follow AFTER INSERT OR UPDATE OR DELETE ON bindery_usage
        FOR EACH ROW EXECUTE FUNCTION bindery_session_usage_follow();",
    // 13: of a request's prompt tokens, those read from and written to the
    // provider's cache, and of its reply's, those spent reasoning: kept
    // per row and in a session's sums (a row an older server writes has
    // none: 0). The trigger's function and the index by session take them.
    "ALTER TABLE bindery_usage ADD COLUMN cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE bindery_session_usage ADD COLUMN cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
    DROP INDEX bindery_usage_session;
    CREATE INDEX bindery_usage_session ON bindery_usage (session, at)
        INCLUDE (prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool,
                 cache_read_tokens, cache_write_tokens, reasoning_tokens);
    CREATE OR REPLACE FUNCTION bindery_session_usage_follow() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            UPDATE bindery_session_usage SET
                prompt_tokens = prompt_tokens - OLD.prompt_tokens,
                completion_tokens = completion_tokens - OLD.completion_tokens,
                estimated_tokens = estimated_tokens - CASE WHEN OLD.estimated
                    THEN OLD.prompt_tokens + OLD.completion_tokens ELSE 0 END,
                model_requests = model_requests - CASE WHEN OLD.tool IS NULL THEN 1 ELSE 0 END,
                tool_calls = tool_calls - OLD.tool_calls,
                cost = cost - OLD.cost,
                cache_read_tokens = cache_read_tokens - OLD.cache_read_tokens,
                cache_write_tokens = cache_write_tokens - OLD.cache_write_tokens,
                reasoning_tokens = reasoning_tokens - OLD.reasoning_tokens
            WHERE session = OLD.session;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO bindery_session_usage AS u VALUES (
                NEW.session, NEW.prompt_tokens, NEW.completion_tokens,
                CASE WHEN NEW.estimated THEN NEW.prompt_tokens + NEW.completion_tokens ELSE 0 END,
                CASE WHEN NEW.tool IS NULL THEN 1 ELSE 0 END, NEW.tool_calls, NEW.cost,
                NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.reasoning_tokens)
            ON CONFLICT (session) DO UPDATE SET
                prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
                completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
                estimated_tokens = u.estimated_tokens + EXCLUDED.estimated_tokens,
                model_requests = u.model_requests + EXCLUDED.model_requests,
                tool_calls = u.tool_calls + EXCLUDED.tool_calls,
                cost = u.cost + EXCLUDED.cost,
                cache_read_tokens = u.cache_read_tokens + EXCLUDED.cache_read_tokens,
                cache_write_tokens = u.cache_write_tokens + EXCLUDED.cache_write_tokens,
                reasoning_tokens = u.reasoning_tokens + EXCLUDED.reasoning_tokens;
        END IF;
        RETURN NULL;
    END
    $$;",
    // 13: the tenant's audit log, hash-chained (audit.rs): a record's seq,
    // its hash and its canonical line, as the export hands it out.
    "CREATE TABLE bindery_audit (
        seq  BIGINT PRIMARY KEY,
        hash TEXT NOT NULL,
        line TEXT NOT NULL
    );",
    // 14: the end user whose session a row is of (NULL: the owner's, or a
    // row from before end users were kept), for per-user budgets and the
    // report by user; a per-user window reads its partial index alone.
    "ALTER TABLE bindery_usage ADD COLUMN subject TEXT;
    CREATE INDEX bindery_usage_agent_subject_at ON bindery_usage (agent, subject, at)
        INCLUDE (prompt_tokens, completion_tokens, tool_calls, cost)
        WHERE subject IS NOT NULL;",
    // 15: people's connections to MCP toolboxes (authorization-code
    // grants): the tokens sealed (connections.rs), the rest in clear.
    "CREATE TABLE bindery_connections (
        subject      TEXT NOT NULL,
        toolbox      TEXT NOT NULL,
        scopes       TEXT[] NOT NULL,
        connected_at BIGINT NOT NULL,
        last_used_at BIGINT NOT NULL,
        sealed       BYTEA NOT NULL,
        PRIMARY KEY (subject, toolbox)
    );",
];

/// A connection's columns, as [`connection_of`] reads them.
const CONNECTION: &str = "SELECT subject, toolbox, scopes, connected_at, last_used_at, sealed
     FROM bindery_connections";

fn connection_of(r: &Row) -> Result<crate::connections::StoredConnection, tokio_postgres::Error> {
    Ok(crate::connections::StoredConnection {
        subject: r.try_get(0)?,
        toolbox: r.try_get(1)?,
        scopes: r.try_get(2)?,
        connected_at: r.try_get(3)?,
        last_used_at: r.try_get(4)?,
        sealed: r.try_get(5)?,
    })
}

/// A session's rows, then its turns in order (one round trip for both).
const WITH_TURNS: &str = "ARRAY(SELECT t.message FROM bindery_turns t
     WHERE t.session_id = bindery_sessions.id ORDER BY t.idx)";

/// The sums a [`Totals`] reads, in its order.
const TOTALS: &str = "COALESCE(SUM(prompt_tokens), 0)::BIGINT, COALESCE(SUM(completion_tokens), 0)::BIGINT,
     COALESCE(SUM(prompt_tokens + completion_tokens), 0)::BIGINT,
     COALESCE(SUM(CASE WHEN estimated THEN prompt_tokens + completion_tokens ELSE 0 END), 0)::BIGINT,
     COUNT(*) FILTER (WHERE tool IS NULL), COALESCE(SUM(tool_calls), 0)::BIGINT,
     COALESCE(SUM(cost), 0)::DOUBLE PRECISION,
     COALESCE(SUM(cache_read_tokens), 0)::BIGINT, COALESCE(SUM(cache_write_tokens), 0)::BIGINT,
     COALESCE(SUM(reasoning_tokens), 0)::BIGINT";

/// A session's [`Totals`], the session `$1`, as the trigger keeps them.
const SESSION_TOTALS: &str = "SELECT prompt_tokens, completion_tokens,
     prompt_tokens + completion_tokens, estimated_tokens, model_requests, tool_calls, cost,
     cache_read_tokens, cache_write_tokens, reasoning_tokens
     FROM bindery_session_usage WHERE session = $1";

/// The advisory lock that serialises migrations between processes
/// starting at once ("bindery" in ASCII).
const MIGRATION_LOCK: i64 = 0x62_69_6e_64_65_72_79;

/// The advisory lock every audit append takes ("bindaudt" in ASCII).
const AUDIT_LOCK: i64 = 0x62_69_6e_64_61_75_64_74;

/// How long one connection attempt may take when the URL does not say
/// (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an operation waits for a free connection when every one of the
/// pool's is busy, before it fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// The channel every append notifies (payload: `SESSION_ID SEQ`).
const NOTICE_CHANNEL: &str = "bindery_events";

/// Notices a slow reader may fall behind by before it is told to resync.
const NOTICE_BUFFER: usize = 1024;

/// Sessions in a PostgreSQL database.
pub struct PostgresStore {
    /// `postgres://user@host:port/db`, for messages (never a password).
    target: String,
    pool: Pool,
    /// Every server's appends, as the listening connection hears them.
    notices: broadcast::Sender<Notice>,
    /// Stops the listening connection when the store goes.
    _listening: DropGuard,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Read a `postgres://` URL into a connection config and its TLS, by
/// libpq's `sslmode` (default `prefer`) and `sslrootcert`, which
/// tokio-postgres does not know in full. Errors show the URL redacted.
pub fn parse_url(url: &str) -> Result<(Config, Tls), StoreError> {
    let bad = |why: String| StoreError::Backend(format!("--store {}: {why}", redact(url)));
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let mut root_file = None;
    let mut rest = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("sslmode", v)) => mode = Some(v),
            Some(("sslrootcert", v)) => root_file = Some(v.to_owned()),
            _ => rest.push(kv),
        }
    }
    let (ssl_mode, verify) = match mode.unwrap_or("prefer") {
        "disable" | "allow" => (SslMode::Disable, None),
        "prefer" => (SslMode::Prefer, Some(Verify::Nothing)),
        "require" => (SslMode::Require, Some(Verify::Nothing)),
        "verify-full" => (SslMode::Require, Some(Verify::Full { root_file: root_file.clone() })),
        "verify-ca" => {
            return Err(bad(
                "sslmode=verify-ca is not supported (it checks the chain but not the host name): use sslmode=verify-full"
                    .into(),
            ))
        }
        other => {
            return Err(bad(format!(
                "unknown sslmode={other}: use disable, prefer, require or verify-full"
            )))
        }
    };
    if root_file.is_some() && !matches!(verify, Some(Verify::Full { .. })) {
        return Err(bad(
            "sslrootcert is for sslmode=verify-full (with require and prefer the certificate is not checked)"
                .into(),
        ));
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config = Config::from_str(&url).map_err(|e| bad(e.to_string()))?;
    config.ssl_mode(ssl_mode);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("bindery-sidecar");
    }
    if config.get_hosts().is_empty() {
        return Err(bad(
            "no host: give postgres://USER:PASSWORD@HOST:PORT/DB".into()
        ));
    }
    let tls = match verify {
        Some(v) => Tls(Some(client_config(&v).map_err(|e| bad(e.to_string()))?)),
        None => Tls(None),
    };
    Ok((config, tls))
}

/// `postgres://user@host:port/db`: what a message says it connects to.
fn target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = config
                .get_ports()
                .get(i)
                .or(config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match h {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}:{port}", dir.display()),
            }
        })
        .collect();
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

/// A server error by severity, message and SQLSTATE; a client, network or
/// TLS error with its causes (those name no row and no password).
/// Whether a database error says the database is not there to answer,
/// for now: the connection is closed or its I/O failed, or its SQLSTATE is a connection exception (08), a lack
/// of resources (53: a full disk, too many connections) or an operator's
/// intervention (57P01-57P03: shutting down, starting up).
fn is_outage(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|c| c.is::<std::io::Error>())
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("53") || code.starts_with("57P")
        }
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        ),
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let c_text = c.to_string();
                // tokio-postgres's Display already ends with some causes.
                if !text.ends_with(&c_text) {
                    text = format!("{text}: {c_text}");
                }
                cause = c.source();
            }
            text
        }
    }
}

/// One connection, outside the pool, that LISTENs for every server's
/// appends and forwards them as [`Notice`]s, reconnecting (and telling
/// readers to resync) when it is lost, until `stop`.
async fn listen(
    config: Config,
    tls: Tls,
    target: String,
    notices: broadcast::Sender<Notice>,
    stop: CancellationToken,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let mut first = Some(first);
    let mut pause = Duration::from_millis(250);
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            c = config.connect(tls.clone()) => c,
        };
        match connected {
            Ok((client, mut connection)) => {
                let forward = notices.clone();
                let mut driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                if let Some(notice) = parse_notice(n.payload()) {
                                    let _ = forward.send(notice);
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => return describe(&e),
                            None => return "the server closed it".to_owned(),
                        }
                    }
                });
                let listened = client
                    .batch_execute(&format!("LISTEN {NOTICE_CHANNEL}"))
                    .await;
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
                match listened {
                    Ok(()) => {
                        pause = Duration::from_millis(250);
                        // Whatever was appended while nobody listened.
                        let _ = notices.send(Notice::Resync);
                        tokio::select! {
                            _ = stop.cancelled() => {
                                driver.abort();
                                return;
                            }
                            why = &mut driver => tracing::warn!(store = %target, "the connection listening for other servers' events was lost ({}); reconnecting", why.unwrap_or_default()),
                        }
                    }
                    Err(e) => {
                        driver.abort();
                        tracing::warn!(store = %target, "cannot listen for other servers' events: {}", describe(&e));
                    }
                }
            }
            Err(e) => {
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
                tracing::warn!(store = %target, retry_in = ?pause, "cannot open the connection that listens for other servers' events: {}", describe(&e));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// `SESSION_ID SEQ`, as an append's `pg_notify` says it.
fn parse_notice(payload: &str) -> Option<Notice> {
    let (session, seq) = payload.rsplit_once(' ')?;
    Some(Notice::Appended {
        session: session.to_owned(),
        seq: seq.parse().ok()?,
    })
}

/// Why the pool gave no connection, in [`describe`]'s words when the
/// database said so.
fn pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => describe(e),
        PoolError::Timeout(_) => format!(
            "no free connection within {}s: every connection of the pool is busy (raise --store-pool-size)",
            POOL_WAIT.as_secs()
        ),
        other => other.to_string(),
    }
}

impl PostgresStore {
    /// Connect (retrying for up to `patience` while the database is not
    /// reachable: it may be starting next to us) with a pool of at most
    /// `pool_size` connections, and bring the schema up to date.
    pub async fn open(
        url: &str,
        patience: Duration,
        pool_size: usize,
    ) -> Result<PostgresStore, StoreError> {
        let (config, tls) = parse_url(url)?;
        let target = target(&config);
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot build the connection pool: {e}")))?;
        let (notices, _) = broadcast::channel(NOTICE_BUFFER);
        let stop = CancellationToken::new();
        let store = PostgresStore {
            target,
            pool,
            notices,
            _listening: stop.clone().drop_guard(),
        };
        let deadline = tokio::time::Instant::now() + patience;
        let mut pause = Duration::from_millis(250);
        loop {
            match store.pool.get().await {
                Ok(_) => break,
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::warn!(store = %store.target, retry_in = ?pause, "the session store is not reachable yet: {}", pool_error(&e));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "cannot connect to the session store {} (tried for {}s): {}",
                        store.target,
                        patience.as_secs(),
                        pool_error(&e)
                    )))
                }
            }
        }
        store.migrate().await?;
        // Ready once it listens, so that no append after `open` goes
        // unheard (a first attempt that fails is retried in the background).
        let (first, listening) = tokio::sync::oneshot::channel();
        tokio::spawn(listen(
            config,
            tls,
            store.target.clone(),
            store.notices.clone(),
            stop,
            first,
        ));
        let _ = listening.await;
        tracing::info!(store = %store.target, pool_size, "session store ready");
        Ok(store)
    }

    /// `postgres://user@host:port/db`, without the password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// A connection from the pool (a new one if none is idle and the pool
    /// is not full; a lost one is dropped, not handed out).
    async fn conn(&self, what: &'static str) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "could not {what} ({}): {}",
                self.target,
                pool_error(&e)
            ))
        })
    }

    /// `sql` prepared on `client`, once per connection (deadpool caches
    /// it): later uses skip the parse round trip.
    async fn prepare(
        &self,
        client: &Object,
        what: &str,
        sql: &str,
    ) -> Result<tokio_postgres::Statement, StoreError> {
        client.prepare_cached(sql).await.map_err(self.db(what))
    }

    /// A row read with [`WITH_TURNS`], as a record.
    fn record(&self, what: &str, row: &Row) -> Result<SessionRecord, StoreError> {
        let db = self.db(what);
        let turns: Vec<String> = row.try_get(16).map_err(&db)?;
        columns(row)
            .map_err(&db)?
            .decode(turns)
            .map_err(|why| self.fail(what, why))
    }

    fn fail(&self, what: &str, why: impl fmt::Display) -> StoreError {
        StoreError::Backend(format!("could not {what} ({}): {why}", self.target))
    }

    /// A database error as the store's: an outage (see [`is_outage`]) or
    /// a failure.
    fn db(&self, what: &str) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        let what = what.to_owned();
        move |e| match is_outage(&e) {
            true => StoreError::Unavailable(format!(
                "could not {what} ({}): {}",
                self.target,
                describe(&e)
            )),
            false => self.fail(&what, describe(&e)),
        }
    }

    /// The sessions `tail` (a `WHERE`/`ORDER BY` clause) selects.
    async fn sessions(
        &self,
        what: &'static str,
        tail: &str,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let db = self.db(what);
        let client = self.conn(what).await?;
        let sql = format!("SELECT {SESSION_COLUMNS}, {WITH_TURNS} FROM bindery_sessions {tail}");
        let stmt = self.prepare(&client, what, &sql).await?;
        let rows = client.query(&stmt, &[]).await.map_err(&db)?;
        rows.iter().map(|r| self.record(what, r)).collect()
    }

    /// Apply the missing steps of [`MIGRATIONS`] in one transaction, under
    /// an advisory lock: replicas starting at once take turns, and the
    /// later ones find the schema current.
    async fn migrate(&self) -> Result<(), StoreError> {
        let what = "migrate the session store";
        let db = self.db(what);
        let mut client = self.conn(what).await?;
        let tx = client.transaction().await.map_err(&db)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(&db)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS bindery_schema_migrations (
                 version    BIGINT PRIMARY KEY,
                 applied_at BIGINT NOT NULL
             )",
        )
        .await
        .map_err(&db)?;
        let current: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM bindery_schema_migrations",
                &[],
            )
            .await
            .map_err(&db)?
            .get(0);
        let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
        if current > known {
            return Err(self.fail(
                what,
                format_args!("the database was written by a newer Bindery (schema {current}); this binary knows up to {known}"),
            ));
        }
        for (version, step) in (1_i64..)
            .zip(MIGRATIONS)
            .skip(usize::try_from(current).unwrap_or(0))
        {
            tx.batch_execute(step).await.map_err(&db)?;
            tx.execute(
                "INSERT INTO bindery_schema_migrations (version, applied_at) VALUES ($1, $2)",
                &[&version, &super::now_ms()],
            )
            .await
            .map_err(&db)?;
        }
        tx.commit().await.map_err(&db)
    }
}

/// The values of a `sessions` row, bound as `$1`…`$16` in the order of
/// [`SESSION_COLUMNS`] (insert and update both).
fn row_params(c: &Columns) -> [&(dyn ToSql + Sync); 16] {
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

/// Matches [`SESSION_COLUMNS`].
fn columns(row: &Row) -> Result<Columns, tokio_postgres::Error> {
    Ok(Columns {
        id: row.try_get(0)?,
        agent: row.try_get(1)?,
        status: row.try_get(2)?,
        status_detail: row.try_get(3)?,
        created_at: row.try_get(4)?,
        updated_at: row.try_get(5)?,
        version: row.try_get(6)?,
        turns: row.try_get(7)?,
        params: row.try_get(8)?,
        security: row.try_get(9)?,
        forked_from: row.try_get(10)?,
        runner: row.try_get(11)?,
        cancel_requested: row.try_get(12)?,
        pending: row.try_get(13)?,
        holder: row.try_get(14)?,
        turn_count: row.try_get(15)?,
    })
}

/// A write's new turns as the two arrays its statement unnests.
fn turn_arrays(new: NewTurns) -> (Vec<i64>, Vec<String>) {
    new.into_iter().unzip()
}

impl PostgresStore {
    /// A session's write (see `update_with_usage`), if `cap` admits it.
    async fn write(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        usage: &Unwritten,
        cap: Option<&RunCap>,
    ) -> Result<Started, StoreError> {
        let what = "update a session";
        let db = self.db(what);
        let (c, new) = Columns::encode(rec).map_err(|why| self.fail(what, why))?;
        let (idx, messages) = turn_arrays(new);
        let stored = rec.stored_turns as i64;
        let kinds: Vec<&str> = events.iter().map(|(kind, _)| *kind).collect();
        let data: Vec<String> = events.iter().map(|(_, data)| data.to_string()).collect();
        let mut client = self.conn(what).await?;
        // One statement: the version check, the write and the events (with
        // their seqs and notices, as `append_event`'s) are atomic, in one
        // round trip (with usage, in a transaction with its rows). Only
        // when it changes nothing is a second one needed, to tell a stale
        // version from a missing session.
        let sql = format!(
            "WITH u AS (
                 UPDATE bindery_sessions
                 SET agent = $2, status = $3, status_detail = $4,
                     updated_at = $6, version = $7, turns = $8, params = $9,
                     security = $10, forked_from = $11, runner = $12,
                     cancel_requested = $13, pending = $14, holder = $15, turn_count = $16,
                     event_seq = event_seq + cardinality($17::TEXT[])
                 WHERE id = $1 AND created_at = $5 AND version + 1 = $7 AND turn_count = $20
                 RETURNING event_seq
             ), t AS (
                 INSERT INTO bindery_turns (session_id, idx, message)
                 SELECT $1, x.i, x.m FROM u, unnest($21::BIGINT[], $22::TEXT[]) AS x(i, m)
             ), e AS (
                 INSERT INTO bindery_events (session_id, seq, kind, data, at)
                 SELECT $1, u.event_seq - cardinality($17::TEXT[]) + x.n, x.kind, x.data, $19
                 FROM u, unnest($17::TEXT[], $18::TEXT[]) WITH ORDINALITY AS x(kind, data, n)
                 RETURNING seq
             )
             SELECT (SELECT count(*) FROM u),
                    COALESCE((SELECT array_agg(seq ORDER BY seq) FROM e), '{{}}'),
                    (SELECT count(pg_notify('{NOTICE_CHANNEL}', $1 || ' ' || seq)) FROM e)"
        );
        let stmt = self.prepare(&client, what, &sql).await?;
        let mut values: Vec<&(dyn ToSql + Sync)> = row_params(&c).to_vec();
        values.extend([
            &kinds as &(dyn ToSql + Sync),
            &data,
            &at,
            &stored,
            &idx,
            &messages,
        ]);
        let seqs = if let Some(cap) = cap {
            let tx = client.transaction().await.map_err(&db)?;
            // Every capped start of this user, on every server, takes its
            // turn here until its transaction ends: the count below cannot
            // go stale before the start is in.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('bindery_runs:' || $1, 0))",
                &[&cap.subject],
            )
            .await
            .map_err(&db)?;
            let running: i64 = tx
                .query_one(RUNNING_OF_SUBJECT, &[&cap.subject, &c.id])
                .await
                .and_then(|r| r.try_get(0))
                .map_err(&db)?;
            let running = u64::try_from(running).unwrap_or(0);
            if !cap.admits(running) {
                return Ok(Started::Full { running });
            }
            match updated(&tx, &stmt, &values, &c.id).await {
                Ok(seqs) => {
                    tx.commit().await.map_err(&db)?;
                    Ok(seqs)
                }
                Err(e) => Err(e),
            }
        } else if usage.is_empty() {
            updated(&client, &stmt, &values, &c.id).await
        } else {
            let tx = client.transaction().await.map_err(&db)?;
            // The usage rows once the update is in: a conflict writes none.
            match updated(&tx, &stmt, &values, &c.id).await {
                Ok(seqs) => {
                    write_unwritten(&tx, usage).await.map_err(&db)?;
                    tx.commit().await.map_err(&db)?;
                    Ok(seqs)
                }
                Err(e) => Err(e),
            }
        };
        let seqs = seqs.map_err(|e| e.into_store(&db))?;
        rec.stored_turns = rec.turns.len();
        Ok(Started::Stored(seqs))
    }
}

/// How many sessions of end user `$1` other than `$2` are running: among
/// the running ones (found through their partial index), those whose
/// security names the subject.
const RUNNING_OF_SUBJECT: &str = "SELECT COUNT(*) FROM bindery_sessions
     WHERE status = 'running' AND id <> $2 AND (security::jsonb ->> 'subject') = $1";

#[async_trait]
impl SessionStore for PostgresStore {
    fn shared(&self) -> bool {
        true
    }

    fn notices(&self) -> Option<broadcast::Receiver<Notice>> {
        Some(self.notices.subscribe())
    }

    async fn create(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        let what = "create a session";
        // A new session's turns are all new (a fork's copy too).
        rec.stored_turns = 0;
        let (c, new) = Columns::encode(rec).map_err(|why| self.fail(what, why))?;
        let (idx, messages) = turn_arrays(new);
        let client = self.conn(what).await?;
        let sql = format!(
            "WITH s AS (
                 INSERT INTO bindery_sessions ({SESSION_COLUMNS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                 RETURNING id
             )
             INSERT INTO bindery_turns (session_id, idx, message)
             SELECT s.id, x.i, x.m FROM s, unnest($17::BIGINT[], $18::TEXT[]) AS x(i, m)"
        );
        let stmt = self.prepare(&client, what, &sql).await?;
        let mut values: Vec<&(dyn ToSql + Sync)> = row_params(&c).to_vec();
        values.extend([&idx as &(dyn ToSql + Sync), &messages]);
        let inserted = client.execute(&stmt, &values).await;
        match inserted {
            Ok(_) => {
                rec.stored_turns = rec.turns.len();
                Ok(())
            }
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                Err(StoreError::Exists(c.id))
            }
            Err(e) => Err(self.fail(what, describe(&e))),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let what = "read a session";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let sql =
            format!("SELECT {SESSION_COLUMNS}, {WITH_TURNS} FROM bindery_sessions WHERE id = $1");
        let stmt = self.prepare(&client, what, &sql).await?;
        let row = client.query_opt(&stmt, &[&id]).await.map_err(&db)?;
        row.map(|r| self.record(what, &r)).transpose()
    }

    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
        // Byte order for ids, as SQLite sorts them, whatever the collation.
        self.sessions(
            "list sessions",
            "ORDER BY created_at DESC, id COLLATE \"C\"",
        )
        .await
    }

    async fn lineage(&self, id: &str, max: usize) -> Result<Vec<Kin>, StoreError> {
        let what = "read a session's lineage";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let sql = lineage_query("bindery_sessions", "$1", "$2", "id COLLATE \"C\"");
        let stmt = self.prepare(&client, what, &sql).await?;
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = client.query(&stmt, &[&id, &max]).await.map_err(&db)?;
        rows.iter()
            .map(|r| {
                Ok(Kin {
                    id: r.try_get(0).map_err(&db)?,
                    forked_from: r.try_get(1).map_err(&db)?,
                    agent: r.try_get(2).map_err(&db)?,
                    status: r.try_get(3).map_err(&db)?,
                    created_at: r.try_get(4).map_err(&db)?,
                    updated_at: r.try_get(5).map_err(&db)?,
                    turns: usize::try_from(r.try_get::<_, i64>(6).map_err(&db)?).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn running(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions(
            "list running sessions",
            "WHERE status = 'running' ORDER BY id COLLATE \"C\"",
        )
        .await
    }

    async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.sessions(
            "list waiting sessions",
            "WHERE status = 'waiting_external' ORDER BY id COLLATE \"C\"",
        )
        .await
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
        self.write(rec, events, at, &Unwritten::default(), Some(cap))
            .await
    }

    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &serde_json::Value,
        at: i64,
    ) -> Result<i64, StoreError> {
        let what = "append an event";
        let db = self.db(what);
        let data = data.to_string();
        let client = self.conn(what).await?;
        // The UPDATE takes the session's row lock and re-reads the counter
        // after any concurrent append commits, so appends to one session
        // take turns across processes and never share a seq.
        // The notice goes out when the statement commits (see `listen`).
        let sql = format!(
            "WITH s AS (
                 UPDATE bindery_sessions SET event_seq = event_seq + 1
                 WHERE id = $1 RETURNING event_seq
             ), e AS (
                 INSERT INTO bindery_events (session_id, seq, kind, data, at)
                 SELECT $1, event_seq, $2, $3, $4 FROM s
                 RETURNING seq
             )
             SELECT seq, pg_notify('{NOTICE_CHANNEL}', $1 || ' ' || seq)::TEXT FROM e"
        );
        let stmt = self.prepare(&client, what, &sql).await?;
        let row = client
            .query_opt(&stmt, &[&session, &kind, &data, &at])
            .await
            .map_err(&db)?;
        match row {
            Some(row) => row.try_get(0).map_err(&db),
            None => Err(StoreError::NotFound(session.to_owned())),
        }
    }

    async fn last_event_seq(&self, session: &str) -> Result<i64, StoreError> {
        let what = "read the last event's seq";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let stmt = self
            .prepare(
                &client,
                what,
                "SELECT COALESCE(MAX(seq), 0)::BIGINT FROM bindery_events WHERE session_id = $1",
            )
            .await?;
        let row = client.query_one(&stmt, &[&session]).await.map_err(&db)?;
        row.try_get(0).map_err(&db)
    }

    async fn events_after(
        &self,
        session: &str,
        after: i64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let what = "read events";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let stmt = self
            .prepare(
                &client,
                what,
                "SELECT seq, kind, data, at FROM bindery_events
                 WHERE session_id = $1 AND seq > $2 ORDER BY seq",
            )
            .await?;
        let rows = client
            .query(&stmt, &[&session, &after])
            .await
            .map_err(&db)?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.try_get(0).map_err(&db)?;
                let data: String = r.try_get(2).map_err(&db)?;
                Ok(EventRecord {
                    seq,
                    kind: r.try_get(1).map_err(&db)?,
                    data: decode_event_data(session, seq, &data)
                        .map_err(|why| self.fail(what, why))?,
                    at: r.try_get(3).map_err(&db)?,
                })
            })
            .collect()
    }

    async fn beat(&self, instance: &str, at: i64, address: Option<&str>) -> Result<(), StoreError> {
        let what = "record a heartbeat";
        let client = self.conn(what).await?;
        let stmt = self
            .prepare(
                &client,
                what,
                "INSERT INTO bindery_runners (instance, heartbeat_at, address) VALUES ($1, $2, $3)
                 ON CONFLICT (instance) DO UPDATE
                 SET heartbeat_at = excluded.heartbeat_at, address = excluded.address",
            )
            .await?;
        client
            .execute(&stmt, &[&instance, &at, &address])
            .await
            .map(drop)
            .map_err(self.db(what))
    }

    async fn peer(&self, instance: &str) -> Result<Option<Peer>, StoreError> {
        let what = "read a heartbeat";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let stmt = self
            .prepare(
                &client,
                what,
                "SELECT heartbeat_at, address FROM bindery_runners WHERE instance = $1",
            )
            .await?;
        let row = client.query_opt(&stmt, &[&instance]).await.map_err(&db)?;
        row.map(|r| {
            Ok(Peer {
                at: r.try_get(0).map_err(&db)?,
                address: r.try_get(1).map_err(&db)?,
            })
        })
        .transpose()
    }

    async fn claim(
        &self,
        limits: &[(Gauge, f64)],
        earlier: &Unwritten,
        row: &Use,
    ) -> Result<Claimed, StoreError> {
        let what = "claim a budget";
        let db = self.db(what);
        let mut client = self.conn(what).await?;
        let tx = client.transaction().await.map_err(&db)?;
        // Every claim for this agent, on every server, takes its turn here
        // until its transaction ends: the sums below cannot go stale
        // before the row is in.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('bindery_usage:' || $1, 0))",
            &[&row.agent],
        )
        .await
        .map_err(&db)?;
        write_unwritten(&tx, earlier).await.map_err(&db)?;
        let mut used = Vec::with_capacity(limits.len());
        for (index, (gauge, limit)) in limits.iter().enumerate() {
            let standing = measure_one(&tx, gauge).await.map_err(&db)?;
            if standing.used >= *limit {
                tx.commit().await.map_err(&db)?;
                return Ok(Claimed::Exhausted { index, standing });
            }
            used.push(standing.used);
        }
        let id = insert_use(&tx, row).await.map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(Claimed::Granted { id, used })
    }

    async fn record(&self, earlier: &Unwritten) -> Result<(), StoreError> {
        if earlier.is_empty() {
            return Ok(());
        }
        let what = "record usage";
        let db = self.db(what);
        let mut client = self.conn(what).await?;
        let tx = client.transaction().await.map_err(&db)?;
        write_unwritten(&tx, earlier).await.map_err(&db)?;
        tx.commit().await.map_err(&db)
    }

    async fn measure(&self, gauges: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
        let what = "measure usage";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let mut out = Vec::with_capacity(gauges.len());
        for g in gauges {
            out.push(measure_one(&client, g).await.map_err(&db)?);
        }
        Ok(out)
    }

    async fn peak(
        &self,
        agent: &str,
        meter: Meter,
        by: PeakBy,
        since: i64,
    ) -> Result<f64, StoreError> {
        let what = "measure usage";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let sql = format!(
            "SELECT COALESCE(MAX(total), 0)::DOUBLE PRECISION FROM (SELECT SUM({}) AS total
             FROM bindery_usage {}) t",
            meter_sql(meter),
            crate::usage::peak_rows(by, '$')
        );
        let r = client
            .query_one(&sql, &[&agent, &since])
            .await
            .map_err(&db)?;
        r.try_get(0).map_err(&db)
    }

    async fn report(&self, from: i64, to: i64, group: Group) -> Result<Vec<ReportRow>, StoreError> {
        let what = "report usage";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let col = group.column();
        let sql = format!(
            "SELECT {col}, {TOTALS} FROM bindery_usage WHERE at >= $1 AND at < $2
             GROUP BY {col} ORDER BY 4 DESC, 1"
        );
        let rows = client.query(&sql, &[&from, &to]).await.map_err(&db)?;
        rows.iter()
            .map(|r| {
                Ok(ReportRow {
                    key: r.try_get(0).map_err(&db)?,
                    totals: totals_at(r, 1).map_err(&db)?,
                })
            })
            .collect()
    }

    async fn session_totals(&self, session: &str) -> Result<Totals, StoreError> {
        let what = "read a session's usage";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let stmt = self.prepare(&client, what, SESSION_TOTALS).await?;
        match client.query_opt(&stmt, &[&session]).await.map_err(&db)? {
            Some(r) => totals_at(&r, 0).map_err(&db),
            None => Ok(Totals::default()),
        }
    }

    async fn append_audit(&self, entry: &audit::Entry) -> Result<audit::Sealed, StoreError> {
        let what = "append to the audit log";
        let db = self.db(what);
        let mut client = self.conn(what).await?;
        let tx = client.transaction().await.map_err(&db)?;
        // Every append, on every server, takes its turn here until its
        // transaction ends: the head read below is the last record when
        // the next is written. (The seq's primary key refuses a fork even
        // so.)
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&AUDIT_LOCK])
            .await
            .map_err(&db)?;
        let head = tx
            .query_opt(
                "SELECT seq, hash FROM bindery_audit ORDER BY seq DESC LIMIT 1",
                &[],
            )
            .await
            .map_err(&db)?;
        let (seq, prev) = match head {
            Some(row) => (
                row.try_get::<_, i64>(0).map_err(&db)? + 1,
                row.try_get::<_, String>(1).map_err(&db)?,
            ),
            None => (1, audit::GENESIS.to_string()),
        };
        let sealed = audit::seal(entry, seq, &prev).map_err(|e| self.fail(what, e))?;
        tx.execute(
            "INSERT INTO bindery_audit (seq, hash, line) VALUES ($1, $2, $3)",
            &[&seq, &sealed.hash, &sealed.line],
        )
        .await
        .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(sealed)
    }

    async fn audit_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<audit::Sealed>, StoreError> {
        let what = "read the audit log";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let stmt = self
            .prepare(
                &client,
                what,
                "SELECT seq, hash, line FROM bindery_audit WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .await?;
        let rows = client.query(&stmt, &[&after, &limit]).await.map_err(&db)?;
        rows.iter()
            .map(|r| {
                Ok(audit::Sealed {
                    seq: r.try_get(0).map_err(&db)?,
                    hash: r.try_get(1).map_err(&db)?,
                    line: r.try_get(2).map_err(&db)?,
                })
            })
            .collect()
    }

    async fn audit_head(&self) -> Result<Option<audit::Head>, StoreError> {
        let what = "read the audit log's head";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let row = client
            .query_opt(
                "SELECT seq, hash FROM bindery_audit ORDER BY seq DESC LIMIT 1",
                &[],
            )
            .await
            .map_err(&db)?;
        row.map(|r| {
            Ok(audit::Head {
                seq: r.try_get(0).map_err(&db)?,
                hash: r.try_get(1).map_err(&db)?,
            })
        })
        .transpose()
    }

    async fn put_connection(
        &self,
        c: &crate::connections::StoredConnection,
    ) -> Result<(), StoreError> {
        let what = "store a connection";
        let db = self.db(what);
        let client = self.conn(what).await?;
        client
            .execute(
                "INSERT INTO bindery_connections
                     (subject, toolbox, scopes, connected_at, last_used_at, sealed)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (subject, toolbox) DO UPDATE SET scopes = $3,
                     connected_at = $4, last_used_at = $5, sealed = $6",
                &[
                    &c.subject,
                    &c.toolbox,
                    &c.scopes,
                    &c.connected_at,
                    &c.last_used_at,
                    &c.sealed,
                ],
            )
            .await
            .map_err(&db)?;
        Ok(())
    }

    async fn get_connection(
        &self,
        subject: &str,
        toolbox: &str,
    ) -> Result<Option<crate::connections::StoredConnection>, StoreError> {
        let what = "read a connection";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let row = client
            .query_opt(
                &format!("{CONNECTION} WHERE subject = $1 AND toolbox = $2"),
                &[&subject, &toolbox],
            )
            .await
            .map_err(&db)?;
        row.map(|r| connection_of(&r).map_err(&db)).transpose()
    }

    async fn delete_connection(&self, subject: &str, toolbox: &str) -> Result<bool, StoreError> {
        let what = "remove a connection";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let n = client
            .execute(
                "DELETE FROM bindery_connections WHERE subject = $1 AND toolbox = $2",
                &[&subject, &toolbox],
            )
            .await
            .map_err(&db)?;
        Ok(n > 0)
    }

    async fn connections(
        &self,
        subject: Option<&str>,
    ) -> Result<Vec<crate::connections::StoredConnection>, StoreError> {
        let what = "read connections";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let rows = client
            .query(
                &format!(
                    "{CONNECTION} WHERE $1::TEXT IS NULL OR subject = $1 ORDER BY subject, toolbox"
                ),
                &[&subject],
            )
            .await
            .map_err(&db)?;
        rows.iter().map(|r| connection_of(r).map_err(&db)).collect()
    }

    async fn put_agent(&self, slug: &str, document: &str, at: i64) -> Result<bool, StoreError> {
        let what = "store an agent";
        let db = self.db(what);
        let client = self.conn(what).await?;
        // `xmax = 0` tells an inserted row from an updated one.
        let row = client
            .query_one(
                "INSERT INTO bindery_agents (slug, document, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (slug) DO UPDATE SET document = $2, updated_at = $3
                 RETURNING (xmax = 0)",
                &[&slug, &document, &at],
            )
            .await
            .map_err(&db)?;
        row.try_get(0).map_err(&db)
    }

    async fn get_agent(&self, slug: &str) -> Result<Option<super::StoredAgent>, StoreError> {
        let what = "read an agent";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let row = client
            .query_opt(
                "SELECT slug, document, updated_at FROM bindery_agents WHERE slug = $1",
                &[&slug],
            )
            .await
            .map_err(&db)?;
        row.map(|r| {
            Ok(super::StoredAgent {
                slug: r.try_get(0).map_err(&db)?,
                document: r.try_get(1).map_err(&db)?,
                updated_at: r.try_get(2).map_err(&db)?,
            })
        })
        .transpose()
    }

    async fn delete_agent(&self, slug: &str) -> Result<bool, StoreError> {
        let what = "remove an agent";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let n = client
            .execute("DELETE FROM bindery_agents WHERE slug = $1", &[&slug])
            .await
            .map_err(&db)?;
        Ok(n > 0)
    }

    async fn agents(&self) -> Result<Vec<super::StoredAgent>, StoreError> {
        let what = "read agents";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let rows = client
            .query(
                "SELECT slug, document, updated_at FROM bindery_agents ORDER BY slug",
                &[],
            )
            .await
            .map_err(&db)?;
        rows.iter()
            .map(|r| {
                Ok(super::StoredAgent {
                    slug: r.try_get(0).map_err(&db)?,
                    document: r.try_get(1).map_err(&db)?,
                    updated_at: r.try_get(2).map_err(&db)?,
                })
            })
            .collect()
    }

    async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError> {
        let what = "read heartbeats";
        let db = self.db(what);
        let client = self.conn(what).await?;
        let rows = client
            .query("SELECT instance, heartbeat_at FROM bindery_runners", &[])
            .await
            .map_err(&db)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).map_err(&db)?, r.try_get(1).map_err(&db)?)))
            .collect()
    }

    async fn forget_runner(&self, instance: &str) -> Result<(), StoreError> {
        let what = "remove a heartbeat";
        let client = self.conn(what).await?;
        client
            .execute(
                "DELETE FROM bindery_runners WHERE instance = $1",
                &[&instance],
            )
            .await
            .map(drop)
            .map_err(self.db(what))
    }

    async fn prune_runners(&self, before: i64) -> Result<u64, StoreError> {
        let what = "remove old heartbeats";
        let client = self.conn(what).await?;
        client
            .execute(
                "DELETE FROM bindery_runners WHERE heartbeat_at < $1",
                &[&before],
            )
            .await
            .map_err(self.db(what))
    }
}

fn totals_at(r: &Row, at: usize) -> Result<Totals, tokio_postgres::Error> {
    let n = |i: usize| {
        r.try_get::<_, i64>(at + i)
            .map(|v| u64::try_from(v).unwrap_or(0))
    };
    Ok(Totals {
        prompt_tokens: n(0)?,
        completion_tokens: n(1)?,
        total_tokens: n(2)?,
        estimated_tokens: n(3)?,
        model_requests: n(4)?,
        tool_calls: n(5)?,
        cost: r.try_get(at + 6)?,
        cache_read_tokens: n(7)?,
        cache_write_tokens: n(8)?,
        reasoning_tokens: n(9)?,
    })
}

async fn measure_one(
    client: &impl deadpool_postgres::GenericClient,
    g: &Gauge,
) -> Result<Standing, tokio_postgres::Error> {
    let (filter, values) = g.scope.filter('$');
    let sql = format!(
        "SELECT COALESCE(SUM({}), 0)::DOUBLE PRECISION, MIN(at) FROM bindery_usage
         WHERE {filter} AND at >= ${}",
        meter_sql(g.meter),
        values.len() + 1
    );
    let mut bound: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
    bound.push(&g.since);
    let r = client.query_one(&sql, &bound).await?;
    Ok(Standing {
        used: r.try_get(0)?,
        oldest: r.try_get(1)?,
    })
}

/// Insert `u`'s rows and settle its claimed ones.
/// Why [`updated`] wrote nothing.
enum NotUpdated {
    Db(tokio_postgres::Error),
    Store(StoreError),
}

impl NotUpdated {
    fn into_store(self, db: impl Fn(tokio_postgres::Error) -> StoreError) -> StoreError {
        match self {
            NotUpdated::Db(e) => db(e),
            NotUpdated::Store(e) => e,
        }
    }
}

impl From<tokio_postgres::Error> for NotUpdated {
    fn from(e: tokio_postgres::Error) -> Self {
        NotUpdated::Db(e)
    }
}

/// Run `update`, a session's write (see `update_with_usage`), on
/// `client`; the seqs of its events. Only when it changes nothing is a
/// second statement needed, to tell a stale version from a missing
/// session.
async fn updated(
    client: &impl deadpool_postgres::GenericClient,
    update: &tokio_postgres::Statement,
    values: &[&(dyn ToSql + Sync)],
    id: &str,
) -> Result<Vec<i64>, NotUpdated> {
    let row = client.query_one(update, values).await?;
    let updated: i64 = row.try_get(0)?;
    if updated == 0 {
        let exists = client
            .prepare_cached("SELECT 1 FROM bindery_sessions WHERE id = $1")
            .await?;
        let exists = client.query_opt(&exists, &[&id]).await?.is_some();
        return Err(NotUpdated::Store(if exists {
            StoreError::Conflict(id.to_owned())
        } else {
            StoreError::NotFound(id.to_owned())
        }));
    }
    Ok(row.try_get(1)?)
}

async fn write_unwritten(
    client: &impl deadpool_postgres::GenericClient,
    u: &Unwritten,
) -> Result<(), tokio_postgres::Error> {
    for r in &u.rows {
        insert_use(client, r).await?;
    }
    for (id, r) in &u.settled {
        client
            .execute(
                "UPDATE bindery_usage SET model = $2, prompt_tokens = $3, completion_tokens = $4,
                     estimated = $5, tool_calls = $6, cost = $7, cache_read_tokens = $8,
                     cache_write_tokens = $9, reasoning_tokens = $10 WHERE id = $1",
                &[
                    id,
                    &r.model,
                    &count(r.prompt_tokens),
                    &count(r.completion_tokens),
                    &r.estimated,
                    &count(r.tool_calls),
                    &r.cost,
                    &count(r.cache_read_tokens),
                    &count(r.cache_write_tokens),
                    &count(r.reasoning_tokens),
                ],
            )
            .await?;
    }
    Ok(())
}

/// Insert one usage row; its id.
async fn insert_use(
    client: &impl deadpool_postgres::GenericClient,
    r: &Use,
) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "INSERT INTO bindery_usage (at, agent, session, run, model, tool, prompt_tokens,
                 completion_tokens, estimated, tool_calls, cost, cache_read_tokens,
                 cache_write_tokens, reasoning_tokens, subject)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             RETURNING id",
            &[
                &r.at,
                &r.agent,
                &r.session,
                &r.run,
                &r.model,
                &r.tool,
                &count(r.prompt_tokens),
                &count(r.completion_tokens),
                &r.estimated,
                &count(r.tool_calls),
                &r.cost,
                &count(r.cache_read_tokens),
                &count(r.cache_write_tokens),
                &count(r.reasoning_tokens),
                &r.subject,
            ],
        )
        .await?;
    row.try_get(0)
}

/// A count as PostgreSQL's BIGINT.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How a store URL is read: pure, so it runs without a database.
#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn sslmode_is_read_as_libpq_reads_it() {
        let mode = |url: &str| parse_url(url).map(|(c, t)| (c.get_ssl_mode(), t.0.is_some()));
        let base = "postgres://u:pw-3e1@db:5432/s";
        assert_eq!(
            mode(base).unwrap(),
            (SslMode::Prefer, true),
            "libpq's default"
        );
        for (q, want) in [
            ("sslmode=disable", (SslMode::Disable, false)),
            ("sslmode=allow", (SslMode::Disable, false)),
            ("sslmode=prefer", (SslMode::Prefer, true)),
            (
                "sslmode=require&application_name=x",
                (SslMode::Require, true),
            ),
            ("sslmode=verify-full", (SslMode::Require, true)),
        ] {
            assert_eq!(mode(&format!("{base}?{q}")).unwrap(), want, "{q}");
        }
        for (q, why) in [
            ("sslmode=verify-ca", "sslmode=verify-ca is not supported (it checks the chain but not the host name): use sslmode=verify-full"),
            ("sslmode=on", "unknown sslmode=on: use disable, prefer, require or verify-full"),
            ("sslmode=require&sslrootcert=/ca.pem", "sslrootcert is for sslmode=verify-full"),
            ("sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", "sslrootcert /nonexistent/ca.pem"),
            ("sslmod=x", "sslmod"),
        ] {
            let err = parse_url(&format!("{base}?{q}")).unwrap_err().to_string();
            assert!(err.contains(why), "{q}: {err}");
            assert!(err.contains("postgres://u:<redacted>@db:5432/s"), "{q}: {err}");
            assert!(!err.contains("pw-3e1"), "{q}: {err}");
        }
        assert_eq!(
            target(&parse_url("postgres://u:pw@db:5433/s").unwrap().0),
            "postgres://u@db:5433/s"
        );
    }
}

/// The store against a real PostgreSQL server (the `postgres-tests`
/// feature: `tests/setup.sh` installs one).
#[cfg(all(test, feature = "postgres-tests"))]
mod tests {
    use std::sync::Arc;

    use bindery_tests::postgres::Postgres;
    use serde_json::json;

    use super::*;
    use crate::contract::{assert_distinct_seqs, full_record, record, store_contract, Fresh};
    use crate::model::StoredParams;
    use bindery_params::{ParamValue, SecretString, Values};

    const DB: &str = "sessions";

    /// A server with an empty database `sessions`.
    fn server() -> Postgres {
        let pg = Postgres::start();
        pg.create_database(DB);
        pg
    }

    async fn open(pg: &Postgres) -> PostgresStore {
        PostgresStore::open(&pg.url(DB), Duration::ZERO, 4)
            .await
            .expect("open the store")
    }

    async fn fresh() -> Fresh {
        let pg = server();
        Fresh {
            store: Arc::new(open(&pg).await),
            keep: Box::new(pg),
        }
    }

    store_contract!(fresh);

    #[tokio::test]
    async fn replicas_starting_at_once_migrate_once() {
        let pg = server();
        let (a, b, c) = tokio::join!(open(&pg), open(&pg), open(&pg));
        assert_eq!(
            pg.sql(
                DB,
                "SELECT version FROM bindery_schema_migrations ORDER BY version"
            ),
            (1..=MIGRATIONS.len())
                .map(|v| format!("{v}\n"))
                .collect::<String>()
        );
        a.create(&mut record("s1", 1)).await.unwrap();
        assert!(b.get("s1").await.unwrap().is_some());
        assert_eq!(c.list().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn events_appended_before_the_seq_counter_keep_their_numbering() {
        let pg = server();
        let store = open(&pg).await;
        store.create(&mut record("s1", 1)).await.unwrap();
        for _ in 0..2 {
            store.append_event("s1", "k", &json!({}), 1).await.unwrap();
        }
        drop(store);
        // The database as a Bindery before migration 5 left it.
        pg.sql(
            DB,
            "ALTER TABLE bindery_sessions DROP COLUMN event_seq, DROP COLUMN holder;
             ALTER TABLE bindery_runners DROP COLUMN address;
             ALTER TABLE bindery_sessions DROP COLUMN turn_count;
             DROP TABLE bindery_agents, bindery_usage, bindery_turns, bindery_session_usage,
                 bindery_audit, bindery_connections;
             DROP INDEX bindery_sessions_waiting;
             DELETE FROM bindery_schema_migrations WHERE version >= 5",
        );
        let store = open(&pg).await;
        assert_eq!(
            store.append_event("s1", "k", &json!({}), 1).await.unwrap(),
            3
        );
    }

    /// A database from before the kept sums (migration 12) gets them from
    /// its rows on upgrade, an older server's rows among them, and keeps
    /// them from then on.
    #[tokio::test]
    async fn an_older_database_gets_its_sessions_usage_sums_on_upgrade() {
        use crate::contract::{sums_kept_after_an_upgrade, usage_before_an_upgrade};
        let pg = server();
        let store = open(&pg).await;
        usage_before_an_upgrade(&store).await;
        drop(store);
        pg.sql(
            DB,
            "DROP TRIGGER bindery_usage_follow ON bindery_usage;
             DROP TABLE bindery_session_usage, bindery_audit, bindery_connections;
             DROP INDEX bindery_usage_agent_subject_at;
             ALTER TABLE bindery_usage DROP COLUMN subject;
             ALTER TABLE bindery_usage DROP COLUMN cache_read_tokens,
                 DROP COLUMN cache_write_tokens, DROP COLUMN reasoning_tokens;
             CREATE INDEX bindery_usage_session ON bindery_usage (session, at)
                 INCLUDE (prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool);
             DELETE FROM bindery_schema_migrations WHERE version >= 12;
             INSERT INTO bindery_usage (at, agent, session, run, model, tool, prompt_tokens,
                 completion_tokens, estimated, tool_calls, cost)
             VALUES (4, 'a', 's1', 'r', 'm', 'bash_x', 0, 0, false, 1, 0.5)",
        );
        let store = open(&pg).await;
        sums_kept_after_an_upgrade(&store).await;
        // A row that goes takes its part of the sums with it.
        pg.sql(DB, "DELETE FROM bindery_usage WHERE at = 4");
        let s1 = store.session_totals("s1").await.unwrap();
        assert_eq!((s1.tool_calls, s1.cost), (0, 0.0));
    }

    #[tokio::test]
    async fn a_history_kept_in_the_row_before_migration_9_moves_to_its_table() {
        let pg = server();
        let mut rec = full_record();
        let store = open(&pg).await;
        store.create(&mut rec).await.unwrap();
        drop(store);
        // The database as a Bindery before migration 9 left it: the whole
        // history in the row.
        let history = serde_json::to_string(&rec.turns)
            .unwrap()
            .replace('\'', "''");
        pg.sql(
            DB,
            &format!(
                "UPDATE bindery_sessions SET turns = '{history}';
                 ALTER TABLE bindery_sessions DROP COLUMN turn_count;
                 DROP TABLE bindery_turns;
                 DROP INDEX bindery_sessions_waiting;
                 DROP TRIGGER bindery_usage_follow ON bindery_usage;
                 DROP TABLE bindery_session_usage, bindery_audit, bindery_connections;
                 DROP INDEX bindery_usage_agent_subject_at;
                 ALTER TABLE bindery_usage DROP COLUMN subject;
                 ALTER TABLE bindery_usage DROP COLUMN cache_read_tokens,
                     DROP COLUMN cache_write_tokens, DROP COLUMN reasoning_tokens;
                 CREATE INDEX bindery_usage_session ON bindery_usage (session, at)
                     INCLUDE (prompt_tokens, completion_tokens, estimated, tool_calls, cost, tool);
                 DELETE FROM bindery_schema_migrations WHERE version >= 9"
            ),
        );
        let store = open(&pg).await;
        let mut back = store.get(&rec.id).await.unwrap().unwrap();
        assert_eq!(back, rec);
        assert_eq!(
            pg.sql(DB, "SELECT count(*), max(idx) FROM bindery_turns"),
            format!("{}|{}\n", rec.turns.len(), rec.turns.len() - 1)
        );
        assert_eq!(pg.sql(DB, "SELECT turns FROM bindery_sessions"), "[]\n");
        back.turns
            .push(bindery_llm::ChatMessage::user("more").into());
        back.version += 1;
        store.update(&mut back).await.unwrap();
        assert_eq!(store.get(&rec.id).await.unwrap().unwrap(), back);
    }

    #[tokio::test]
    async fn every_server_hears_of_every_append() {
        let pg = server();
        let a = open(&pg).await;
        let b = open(&pg).await;
        // `open` returns once the store listens: nothing after it is missed.
        let mut heard = b.notices().expect("a shared store has notices");
        a.create(&mut record("s 1", 1)).await.unwrap();
        for want in 1..=2 {
            a.append_event("s 1", "k", &json!({}), 1).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(30), heard.recv()).await;
            assert_eq!(
                got.expect("a notice within 30 s").unwrap(),
                Notice::Appended {
                    session: "s 1".into(),
                    seq: want
                }
            );
        }
        assert_eq!(parse_notice("no-seq"), None);
        assert_eq!(parse_notice("s x"), None);
    }

    #[tokio::test]
    async fn replicas_share_sessions_seqs_and_versions() {
        let pg = server();
        let a: Arc<dyn SessionStore> = Arc::new(open(&pg).await);
        let b: Arc<dyn SessionStore> = Arc::new(open(&pg).await);
        assert!(a.shared());
        a.create(&mut record("s1", 1)).await.unwrap();
        assert_distinct_seqs(&[a.clone(), b.clone()], "s1", 24).await;
        assert_eq!(b.events_after("s1", 20).await.unwrap().len(), 4);

        // Both load version 1 and write version 2: exactly one wins.
        let mut from_a = b.get("s1").await.unwrap().unwrap();
        let mut from_b = from_a.clone();
        from_a.version = 2;
        from_a.agent = "a".into();
        from_b.version = 2;
        from_b.agent = "b".into();
        let (ra, rb) = tokio::join!(a.update(&mut from_a), b.update(&mut from_b));
        let won = match (ra, rb) {
            (Ok(()), Err(StoreError::Conflict(_))) => "a",
            (Err(StoreError::Conflict(_)), Ok(())) => "b",
            other => panic!("expected one update and one Conflict, got {other:?}"),
        };
        assert_eq!(a.get("s1").await.unwrap().unwrap().agent, won);
    }

    /// Two replicas appending at once leave one gapless chain: the
    /// advisory lock takes their appends in turn.
    #[tokio::test]
    async fn replicas_appending_at_once_leave_one_audit_chain() {
        let pg = server();
        let a: Arc<dyn SessionStore> = Arc::new(open(&pg).await);
        let b: Arc<dyn SessionStore> = Arc::new(open(&pg).await);
        crate::contract::assert_one_audit_chain(&[a, b], 40).await;
    }

    #[tokio::test]
    async fn data_survives_close_and_reopen() {
        let pg = server();
        let mut rec = full_record();
        {
            let store = open(&pg).await;
            store.create(&mut rec).await.unwrap();
            store
                .append_event(&rec.id, "run_started", &json!({"run": 1}), 5)
                .await
                .unwrap();
        }
        let store = open(&pg).await;
        assert_eq!(store.get(&rec.id).await.unwrap(), Some(rec.clone()));
        assert_eq!(
            store
                .append_event(&rec.id, "run_finished", &json!({}), 6)
                .await
                .unwrap(),
            2
        );
    }

    #[tokio::test]
    async fn a_lost_connection_is_replaced_by_the_next_operation() {
        let pg = server();
        let store = open(&pg).await;
        store.create(&mut record("s1", 1)).await.unwrap();
        let mut heard = store.notices().unwrap();
        let killed = pg.sql(
            DB,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = 'sessions' AND pid <> pg_backend_pid()",
        );
        // The pool's one connection so far, and the listening one.
        assert_eq!(killed, "2\n");
        // The listening connection comes back, and says what it missed.
        let resync = tokio::time::timeout(Duration::from_secs(30), heard.recv()).await;
        assert_eq!(resync.expect("listening again").unwrap(), Notice::Resync);
        // The operation that finds the connection gone may fail; the next
        // one reconnects.
        let first = store.get("s1").await;
        if let Err(e) = &first {
            assert!(e.to_string().contains("127.0.0.1"), "{e}");
        }
        let rec = match first {
            Ok(r) => r,
            Err(_) => store.get("s1").await.expect("reconnected"),
        };
        assert!(rec.is_some());
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let pg = server();
        drop(open(&pg).await);
        pg.sql(
            DB,
            "INSERT INTO bindery_schema_migrations (version, applied_at) VALUES (99, 0)",
        );
        let err = PostgresStore::open(&pg.url(DB), Duration::ZERO, 4)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "written by a newer Bindery (schema 99); this binary knows up to {}",
                MIGRATIONS.len()
            )),
            "{err}"
        );
        assert!(
            err.contains(&format!("127.0.0.1:{}/{DB}", pg.port)),
            "{err}"
        );
        assert!(!err.contains(Postgres::PASSWORD), "{err}");
    }

    #[tokio::test]
    async fn a_wrong_password_or_no_server_names_the_target_not_the_password() {
        let pg = server();
        let wrong = pg.url(DB).replace(Postgres::PASSWORD, "wrong-pass-1d9");
        let err = PostgresStore::open(&wrong, Duration::ZERO, 4)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("password authentication failed"), "{err}");
        assert!(
            err.contains(&format!("bindery@127.0.0.1:{}/{DB}", pg.port)),
            "{err}"
        );
        assert!(!err.contains("wrong-pass-1d9"), "{err}");

        // Nothing listens on the port once the server is gone.
        let url = pg.url(DB);
        let port = pg.port;
        drop(pg);
        let err = PostgresStore::open(&url, Duration::ZERO, 4)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "cannot connect to the session store postgres://bindery@127.0.0.1:{port}/{DB}"
            )),
            "{err}"
        );
        assert!(!err.contains(Postgres::PASSWORD), "{err}");
    }

    #[tokio::test]
    async fn tls_encrypts_and_verify_full_checks_the_certificate() {
        let pg = Postgres::start_tls();
        pg.create_database(DB);
        let ca = pg.ca_file();
        // Whether the store's connections (named by application_name: the
        // pool's and the listening one) are all encrypted, as the server
        // sees them.
        let encrypted = |app: &str| {
            pg.sql(
                DB,
                &format!(
                    "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                     WHERE a.application_name = '{app}'"
                ),
            )
        };
        for (app, query) in [
            ("req", "sslmode=require".to_string()),
            ("pref", String::new()),
            (
                "full",
                format!("sslmode=verify-full&sslrootcert={}", ca.display()),
            ),
        ] {
            let url = format!("{}?application_name={app}&{query}", pg.url(DB));
            let store = PostgresStore::open(&url, Duration::ZERO, 4)
                .await
                .unwrap_or_else(|e| panic!("{app}: {e}"));
            store.create(&mut record(app, 1)).await.unwrap();
            assert_eq!(encrypted(app), "t\n", "{app}");
        }
        // By name, too: the certificate names localhost.
        let by_name = pg.url(DB).replace("127.0.0.1", "localhost");
        let store = PostgresStore::open(
            &format!("{by_name}?sslmode=verify-full&sslrootcert={}", ca.display()),
            Duration::ZERO,
            4,
        )
        .await
        .unwrap();
        assert_eq!(store.list().await.unwrap().len(), 3);

        // The system's roots do not know the test CA.
        let err = PostgresStore::open(
            &format!("{}?sslmode=verify-full", pg.url(DB)),
            Duration::ZERO,
            4,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("invalid peer certificate: UnknownIssuer"),
            "{err}"
        );
        assert!(!err.contains(Postgres::PASSWORD), "{err}");
        // Nor does a CA file that holds another certificate authority.
        let other = tempfile::tempdir().unwrap();
        let other_ca = other.path().join("other.pem");
        std::fs::write(&other_ca, std::fs::read(pg.dir_file("server.crt")).unwrap()).unwrap();
        let err = PostgresStore::open(
            &format!(
                "{}?sslmode=verify-full&sslrootcert={}",
                pg.url(DB),
                other_ca.display()
            ),
            Duration::ZERO,
            4,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("invalid peer certificate"), "{err}");
    }

    /// Secret values never reach the database: `StoredParams` drops them.
    #[tokio::test]
    async fn a_secret_value_leaves_no_trace_in_the_database() {
        const CANARY: &str = "canary-7f3a9c";
        const PLAIN: &str = "plain-5b2e1d";
        let pg = server();
        let store = open(&pg).await;
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
        let dump = pg.dump(DB);
        assert!(dump.contains(PLAIN), "the dump shows plain values");
        assert!(
            !dump.contains(CANARY),
            "a secret value reached the database"
        );
    }
}
