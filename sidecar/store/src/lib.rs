//! A session's records and where they are kept: the record itself
//! (`model`), its pending work (`pending`, `lookup`), its events as clients
//! see them (`wire`), what it used (`usage`), and the stores: the embedded
//! SQLite store by default, or a PostgreSQL database that several replicas
//! share (`--store postgres://…`).

#![forbid(unsafe_code)]

pub mod audit;
pub mod clock;
pub mod connections;
// The promises every backend keeps, as tests; the layers above build their
// records with its helpers (the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod contract;
pub mod health;
mod histories;
pub mod location;
pub mod lookup;
pub mod model;
pub mod pending;
pub mod postgres;
mod postgres_tls;
pub mod quota;
mod record;
pub mod sqlite;
pub mod timed;
pub mod usage;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::model::{EventRecord, SessionRecord};
use crate::quota::{RunCap, Started};
use crate::usage::{Claimed, Gauge, Group, PeakBy, ReportRow, Standing, Totals, Unwritten, Use};
use bindery_spec::budget::Meter;
use bindery_tools::lineage::Kin;
pub use location::Location;

pub use crate::clock::now_ms;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session {0} was changed concurrently; reload it and try again")]
    Conflict(String),
    #[error("session {0} already exists")]
    Exists(String),
    #[error("session {0} does not exist")]
    NotFound(String),
    #[error("the session store failed: {0}")]
    Backend(String),
    /// The store cannot be reached or written now (a database that does
    /// not answer, a lock held past its wait, a full disk): the same
    /// request may succeed later.
    #[error("the session store is unavailable: {0}")]
    Unavailable(String),
    /// What the store holds cannot be trusted (a damaged file): no retry
    /// mends it.
    #[error("the session store is damaged: {0}")]
    Corrupt(String),
}

/// What a shared store tells every server about events other servers
/// append (see [`SessionStore::notices`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// Session `session` has a stored event numbered `seq`.
    Appended { session: String, seq: i64 },
    /// Notices may have been missed (the store was not listening for a
    /// while): every subscriber should read what is stored.
    Resync,
}

/// A server as its last heartbeat left it.
#[derive(Clone, Debug, PartialEq)]
pub struct Peer {
    /// Milliseconds since the epoch, by its clock.
    pub at: i64,
    /// Where the other servers reach it (`--advertise-url`), if it said.
    pub address: Option<String>,
}

#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Whether other processes may be using the same sessions (so a run
    /// marked running may be in progress elsewhere, vouched for by its
    /// server's heartbeat). A store of one server's own: any run this
    /// process does not know of was cut by its predecessor.
    fn shared(&self) -> bool {
        false
    }
    /// On a shared store, a feed of the events any server appends, so that
    /// subscribers on a server that does not run the session learn of new
    /// events without polling. `None`: only this server appends.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        None
    }
    /// Store a new session (its `version` as given, usually 1) with all
    /// its turns; `rec.stored_turns` then counts them.
    async fn create(&self, rec: &mut SessionRecord) -> Result<(), StoreError>;
    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Every session, newest first (then by id, in byte order).
    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError>;
    /// Session `id`'s fork lineage, its rows without their turns: itself,
    /// the sessions it was forked from and those forked from it,
    /// transitively (not another fork of one of its ancestors), newest
    /// first (then by id), at most `max`. Nothing if there is no `id`.
    async fn lineage(&self, id: &str, max: usize) -> Result<Vec<Kin>, StoreError>;
    /// The sessions whose status is `running`, by id.
    async fn running(&self) -> Result<Vec<SessionRecord>, StoreError>;
    /// The sessions whose status is `waiting_external`, by id.
    async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError>;
    /// Replace a session whose stored version is `rec.version - 1`, that
    /// holds `rec.stored_turns` turns and that was created at
    /// `rec.created_at` (else a conflict: a session of that id made anew
    /// is another session): its row is rewritten but for its creation
    /// time, its turns after those appended, and `rec.stored_turns` then
    /// counts them all. The history is never rewritten.
    async fn update(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        let at = rec.updated_at;
        self.update_with_events(rec, &[], at).await.map(drop)
    }
    /// Append an event; its `seq` is assigned here and returned.
    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &serde_json::Value,
        at: i64,
    ) -> Result<i64, StoreError>;
    /// [`update`](Self::update), and each of `events` (kind, data)
    /// appended at `at`, in one transaction: a turn and the events it made
    /// are stored together or not at all. Their seqs, in order.
    async fn update_with_events(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
    ) -> Result<Vec<i64>, StoreError>;
    /// [`update_with_events`](Self::update_with_events), and `usage` (use
    /// already made, as [`record`](Self::record) writes it) in the same
    /// transaction: a run's end and what the run used are stored together,
    /// or neither is. A store that cannot do both in one writes `usage`
    /// once the update is stored (a failure to then is logged, not
    /// returned: the update stands).
    async fn update_with_usage(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        usage: &Unwritten,
    ) -> Result<Vec<i64>, StoreError> {
        let seqs = self.update_with_events(rec, events, at).await?;
        if usage.is_empty() {
            return Ok(seqs);
        }
        if let Err(e) = self.record(usage).await {
            tracing::error!(session = %rec.id, "cannot record a run's usage: {e}");
        }
        Ok(seqs)
    }
    /// [`update_with_events`](Self::update_with_events) for a run's start
    /// (`rec` says it runs), unless end user `cap.subject` has `cap.max`
    /// sessions other than `rec` running already: then nothing is written.
    /// A store shared by several servers counts and writes atomically with
    /// every other capped start of the same user, so two servers cannot
    /// both admit the one past the cap.
    async fn start_capped(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        cap: &RunCap,
    ) -> Result<Started, StoreError> {
        // A store of one server's own: the caller holds no other start of
        // this user in between only if it serialises them; the stores here
        // override this with one transaction.
        let running = self
            .running()
            .await?
            .iter()
            .filter(|r| r.id != rec.id)
            .filter(|r| {
                r.security
                    .subject
                    .as_ref()
                    .is_some_and(|s| s.as_str() == cap.subject)
            })
            .count() as u64;
        if !cap.admits(running) {
            return Ok(Started::Full { running });
        }
        self.update_with_events(rec, events, at)
            .await
            .map(Started::Stored)
    }
    /// Events with `seq > after`, in order.
    async fn events_after(&self, session: &str, after: i64)
        -> Result<Vec<EventRecord>, StoreError>;
    /// The `seq` of the session's last stored event (0: none).
    async fn last_event_seq(&self, session: &str) -> Result<i64, StoreError> {
        Ok(self
            .events_after(session, 0)
            .await?
            .last()
            .map_or(0, |e| e.seq))
    }
    /// Record that server `instance` was alive at `at` (milliseconds since
    /// the epoch, by its clock), reached by its peers at `address`.
    async fn beat(&self, instance: &str, at: i64, address: Option<&str>) -> Result<(), StoreError>;
    /// Server `instance`'s last heartbeat and address (`None`: no heartbeat).
    async fn peer(&self, instance: &str) -> Result<Option<Peer>, StoreError>;
    /// Every server's last heartbeat: instance to `at`.
    async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError>;
    /// Forget server `instance` (it is shutting down).
    async fn forget_runner(&self, instance: &str) -> Result<(), StoreError>;
    /// Forget servers whose last heartbeat is older than `before` (only
    /// those: a server that beat meanwhile stays); how many went.
    async fn prune_runners(&self, before: i64) -> Result<u64, StoreError>;
    /// Give back the memory the store caches (after many sessions went);
    /// nothing to do for a store that holds no cache of its own.
    async fn release_memory(&self) {}
    /// Keep the definition `document` (JSON text) as stored agent `slug`,
    /// replacing any; whether it was new.
    async fn put_agent(&self, slug: &str, document: &str, at: i64) -> Result<bool, StoreError> {
        let _ = (slug, document, at);
        Err(StoreError::Backend("this store keeps no agents".into()))
    }
    /// Stored agent `slug`: its document and when it was last put.
    async fn get_agent(&self, slug: &str) -> Result<Option<StoredAgent>, StoreError> {
        let _ = slug;
        Ok(None)
    }
    /// Forget stored agent `slug`; whether there was one.
    async fn delete_agent(&self, slug: &str) -> Result<bool, StoreError> {
        let _ = slug;
        Ok(false)
    }
    /// Every stored agent, by slug.
    async fn agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        Ok(Vec::new())
    }
    /// Keep a person's connection to an MCP toolbox (its grant sealed),
    /// replacing theirs to that toolbox.
    async fn put_connection(&self, c: &connections::StoredConnection) -> Result<(), StoreError> {
        let _ = c;
        Err(StoreError::Backend(
            "this store keeps no connections".into(),
        ))
    }
    /// `subject`'s connection to `toolbox`.
    async fn get_connection(
        &self,
        subject: &str,
        toolbox: &str,
    ) -> Result<Option<connections::StoredConnection>, StoreError> {
        let _ = (subject, toolbox);
        Ok(None)
    }
    /// Forget `subject`'s connection to `toolbox`; whether there was one.
    async fn delete_connection(&self, subject: &str, toolbox: &str) -> Result<bool, StoreError> {
        let _ = (subject, toolbox);
        Ok(false)
    }
    /// The connections of `subject` (of everyone: `None`), by subject then
    /// toolbox.
    async fn connections(
        &self,
        subject: Option<&str>,
    ) -> Result<Vec<connections::StoredConnection>, StoreError> {
        let _ = subject;
        Ok(Vec::new())
    }
    /// Write `earlier` (use already made), then record `row` unless one
    /// of `limits` (a gauge and its limit) is used up, its use having
    /// reached the limit. Atomic with every other claim for the same
    /// agent, on every server sharing the store: two runs racing for a
    /// budget's last room do not both pass.
    async fn claim(
        &self,
        limits: &[(Gauge, f64)],
        earlier: &Unwritten,
        row: &Use,
    ) -> Result<Claimed, StoreError> {
        let _ = (limits, earlier, row);
        Err(no_usage())
    }
    /// Write `earlier`, use already made, in one transaction.
    async fn record(&self, earlier: &Unwritten) -> Result<(), StoreError> {
        let _ = earlier;
        Err(no_usage())
    }
    /// Each gauge's standing.
    async fn measure(&self, gauges: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
        let _ = gauges;
        Err(no_usage())
    }
    /// The most of `meter` one session, one run or one end user (`by`)
    /// of `agent` used since `since` (a session's or run's all of it,
    /// among those that used anything since then; a user's since then).
    async fn peak(
        &self,
        agent: &str,
        meter: Meter,
        by: PeakBy,
        since: i64,
    ) -> Result<f64, StoreError> {
        let _ = (agent, meter, by, since);
        Err(no_usage())
    }
    /// Use from `from` to `to` (milliseconds, `to` excluded), summed by
    /// `group`, largest total tokens first.
    async fn report(&self, from: i64, to: i64, group: Group) -> Result<Vec<ReportRow>, StoreError> {
        let _ = (from, to, group);
        Err(no_usage())
    }
    /// Everything session `session` used.
    async fn session_totals(&self, session: &str) -> Result<Totals, StoreError> {
        let _ = session;
        Err(no_usage())
    }
    /// Append `entry` to the audit log as the record after the last,
    /// sealed ([`audit::seal`]) in the transaction that writes it, under
    /// a lock every server sharing the store takes: the chain never skips
    /// a seq or forks. The record as stored.
    async fn append_audit(&self, entry: &audit::Entry) -> Result<audit::Sealed, StoreError> {
        let _ = entry;
        Err(no_audit())
    }
    /// The audit records with `seq > after`, in order, at most `limit`.
    async fn audit_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<audit::Sealed>, StoreError> {
        let _ = (after, limit);
        Err(no_audit())
    }
    /// The audit log's last record (`None`: it is empty).
    async fn audit_head(&self) -> Result<Option<audit::Head>, StoreError> {
        Err(no_audit())
    }
}

fn no_audit() -> StoreError {
    StoreError::Backend("this store keeps no audit log".into())
}

fn no_usage() -> StoreError {
    StoreError::Backend("this store keeps no usage".into())
}

/// An agent definition kept in the store (`PUT /v1/agents/:slug`).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredAgent {
    pub slug: String,
    /// The definition as JSON text (Bindery's form or agents-exe's).
    pub document: String,
    pub updated_at: i64,
}

/// Open the store at `location`; a Postgres database that is not reachable
/// yet is retried for up to `patience`.
pub async fn open(
    location: &Location,
    patience: Duration,
    pool_size: usize,
) -> Result<Arc<dyn SessionStore>, StoreError> {
    Ok(match location {
        Location::Sqlite(path) => {
            let path = path.clone();
            let store = tokio::task::spawn_blocking(move || {
                sqlite::SqliteStore::open(&path.to_string_lossy())
            })
            .await
            .map_err(|_| StoreError::Backend("opening the SQLite store panicked".into()))??;
            Arc::new(store)
        }
        Location::Postgres(url) => {
            Arc::new(postgres::PostgresStore::open(url, patience, pool_size).await?)
        }
    })
}
