//! Where sessions are kept. The embedded SQLite store is the default; the
//! trait leaves room for a shared (Postgres) store.

pub mod sqlite;

use async_trait::async_trait;

use super::model::{EventRecord, SessionRecord};

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
}

#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Store a new session (its `version` as given, usually 1).
    async fn create(&self, rec: &SessionRecord) -> Result<(), StoreError>;
    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Every session, newest first.
    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError>;
    /// Replace a session whose stored version is `rec.version - 1`.
    async fn update(&self, rec: &SessionRecord) -> Result<(), StoreError>;
    /// Append an event; its `seq` is assigned here and returned.
    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &serde_json::Value,
        at: i64,
    ) -> Result<i64, StoreError>;
    /// Events with `seq > after`, in order.
    async fn events_after(&self, session: &str, after: i64)
        -> Result<Vec<EventRecord>, StoreError>;
}
