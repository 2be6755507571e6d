//! A store that says how long each of its operations took: it wraps
//! another and hands every operation's name and duration to an observer
//! (the server's metrics), so that a round trip's time can be attributed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Notice, Peer, SessionStore, StoreError};
use crate::model::{EventRecord, SessionRecord};
use crate::quota::{RunCap, Started};
use crate::usage::{Claimed, Gauge, Group, PeakBy, ReportRow, Standing, Totals, Unwritten, Use};
use bindery_spec::budget::Meter;
use bindery_tools::lineage::Kin;

/// Told each operation's name (`get`, `update`, `append_event`, …), how
/// long it took, failed ones included, and its error if it failed.
pub type Observer = Arc<dyn Fn(&'static str, Duration, Option<&StoreError>) + Send + Sync>;

/// The operations that write, by the names the observer is told: only
/// one of them answered shows that a store found out can take writes
/// again (reads go on through another process's write lock, under
/// SQLite's write-ahead log).
pub const WRITES: &[&str] = &[
    "create",
    "update",
    "append_event",
    "update_with_events",
    "update_with_usage",
    "start_capped",
    "beat",
    "put_agent",
    "delete_agent",
    "put_connection",
    "delete_connection",
    "claim",
    "record",
    "forget_runner",
    "prune_runners",
    "append_audit",
];

/// Whether the operation named `op` writes (see [`WRITES`]).
pub fn writes(op: &str) -> bool {
    WRITES.contains(&op)
}

/// An operation's outcome, as the observer is told it.
trait Outcome {
    fn error(&self) -> Option<&StoreError>;
}

impl<T> Outcome for Result<T, StoreError> {
    fn error(&self) -> Option<&StoreError> {
        self.as_ref().err()
    }
}

impl Outcome for () {
    fn error(&self) -> Option<&StoreError> {
        None
    }
}

pub struct Timed {
    inner: Arc<dyn SessionStore>,
    observe: Observer,
}

impl Timed {
    pub fn new(inner: Arc<dyn SessionStore>, observe: Observer) -> Timed {
        Timed { inner, observe }
    }

    async fn time<T: Outcome>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = f.await;
        (self.observe)(op, start.elapsed(), out.error());
        out
    }
}

#[async_trait]
impl SessionStore for Timed {
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        self.inner.notices()
    }
    async fn create(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        self.time("create", self.inner.create(rec)).await
    }
    async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.time("get", self.inner.get(id)).await
    }
    async fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.time("list", self.inner.list()).await
    }
    async fn lineage(&self, id: &str, max: usize) -> Result<Vec<Kin>, StoreError> {
        self.time("lineage", self.inner.lineage(id, max)).await
    }
    async fn running(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.time("running", self.inner.running()).await
    }
    async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError> {
        self.time("waiting", self.inner.waiting()).await
    }
    async fn update(&self, rec: &mut SessionRecord) -> Result<(), StoreError> {
        self.time("update", self.inner.update(rec)).await
    }
    async fn append_event(
        &self,
        session: &str,
        kind: &str,
        data: &serde_json::Value,
        at: i64,
    ) -> Result<i64, StoreError> {
        self.time(
            "append_event",
            self.inner.append_event(session, kind, data, at),
        )
        .await
    }
    async fn update_with_events(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
    ) -> Result<Vec<i64>, StoreError> {
        self.time(
            "update_with_events",
            self.inner.update_with_events(rec, events, at),
        )
        .await
    }
    async fn update_with_usage(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        usage: &Unwritten,
    ) -> Result<Vec<i64>, StoreError> {
        self.time(
            "update_with_usage",
            self.inner.update_with_usage(rec, events, at, usage),
        )
        .await
    }
    async fn start_capped(
        &self,
        rec: &mut SessionRecord,
        events: &[(&str, serde_json::Value)],
        at: i64,
        cap: &RunCap,
    ) -> Result<Started, StoreError> {
        let started = self.inner.start_capped(rec, events, at, cap);
        self.time("start_capped", started).await
    }
    async fn events_after(
        &self,
        session: &str,
        after: i64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.time("events_after", self.inner.events_after(session, after))
            .await
    }
    async fn last_event_seq(&self, session: &str) -> Result<i64, StoreError> {
        self.time("last_event_seq", self.inner.last_event_seq(session))
            .await
    }
    async fn beat(&self, instance: &str, at: i64, address: Option<&str>) -> Result<(), StoreError> {
        self.time("beat", self.inner.beat(instance, at, address))
            .await
    }
    async fn peer(&self, instance: &str) -> Result<Option<Peer>, StoreError> {
        self.time("peer", self.inner.peer(instance)).await
    }
    async fn put_agent(&self, slug: &str, document: &str, at: i64) -> Result<bool, StoreError> {
        self.time("put_agent", self.inner.put_agent(slug, document, at))
            .await
    }
    async fn get_agent(&self, slug: &str) -> Result<Option<super::StoredAgent>, StoreError> {
        self.time("get_agent", self.inner.get_agent(slug)).await
    }
    async fn delete_agent(&self, slug: &str) -> Result<bool, StoreError> {
        self.time("delete_agent", self.inner.delete_agent(slug))
            .await
    }
    async fn agents(&self) -> Result<Vec<super::StoredAgent>, StoreError> {
        self.time("agents", self.inner.agents()).await
    }
    async fn put_connection(
        &self,
        c: &crate::connections::StoredConnection,
    ) -> Result<(), StoreError> {
        self.time("put_connection", self.inner.put_connection(c))
            .await
    }
    async fn get_connection(
        &self,
        subject: &str,
        toolbox: &str,
    ) -> Result<Option<crate::connections::StoredConnection>, StoreError> {
        self.time(
            "get_connection",
            self.inner.get_connection(subject, toolbox),
        )
        .await
    }
    async fn delete_connection(&self, subject: &str, toolbox: &str) -> Result<bool, StoreError> {
        self.time(
            "delete_connection",
            self.inner.delete_connection(subject, toolbox),
        )
        .await
    }
    async fn connections(
        &self,
        subject: Option<&str>,
    ) -> Result<Vec<crate::connections::StoredConnection>, StoreError> {
        self.time("connections", self.inner.connections(subject))
            .await
    }
    async fn append_audit(
        &self,
        entry: &crate::audit::Entry,
    ) -> Result<crate::audit::Sealed, StoreError> {
        self.time("append_audit", self.inner.append_audit(entry))
            .await
    }
    async fn audit_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<crate::audit::Sealed>, StoreError> {
        self.time("audit_after", self.inner.audit_after(after, limit))
            .await
    }
    async fn audit_head(&self) -> Result<Option<crate::audit::Head>, StoreError> {
        self.time("audit_head", self.inner.audit_head()).await
    }
    async fn claim(
        &self,
        limits: &[(Gauge, f64)],
        earlier: &Unwritten,
        row: &Use,
    ) -> Result<Claimed, StoreError> {
        self.time("claim", self.inner.claim(limits, earlier, row))
            .await
    }
    async fn record(&self, earlier: &Unwritten) -> Result<(), StoreError> {
        self.time("record", self.inner.record(earlier)).await
    }
    async fn measure(&self, gauges: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
        self.time("measure", self.inner.measure(gauges)).await
    }
    async fn peak(
        &self,
        agent: &str,
        meter: Meter,
        by: PeakBy,
        since: i64,
    ) -> Result<f64, StoreError> {
        let peak = self.inner.peak(agent, meter, by, since);
        self.time("peak", peak).await
    }
    async fn report(&self, from: i64, to: i64, group: Group) -> Result<Vec<ReportRow>, StoreError> {
        self.time("report", self.inner.report(from, to, group))
            .await
    }
    async fn session_totals(&self, session: &str) -> Result<Totals, StoreError> {
        self.time("session_totals", self.inner.session_totals(session))
            .await
    }
    async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.time("heartbeats", self.inner.heartbeats()).await
    }
    async fn forget_runner(&self, instance: &str) -> Result<(), StoreError> {
        self.time("forget_runner", self.inner.forget_runner(instance))
            .await
    }
    async fn prune_runners(&self, before: i64) -> Result<u64, StoreError> {
        self.time("prune_runners", self.inner.prune_runners(before))
            .await
    }
    async fn release_memory(&self) {
        self.time("release_memory", self.inner.release_memory())
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::contract::record;
    use crate::sqlite::SqliteStore;

    #[tokio::test]
    async fn each_operation_is_observed_by_name_and_answered_as_the_inner_stores() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
        let inner = Arc::new(SqliteStore::open(&path.to_string_lossy()).unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let store = Timed::new(
            inner,
            Arc::new(move |op, _, _| log.lock().unwrap().push(op)),
        );
        store.create(&mut record("s1", 1)).await.unwrap();
        assert_eq!(store.get("s1").await.unwrap().unwrap().id, "s1");
        assert!(store.get("s2").await.unwrap().is_none());
        assert!(matches!(
            store.update(&mut record("s2", 1)).await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(*seen.lock().unwrap(), ["create", "get", "get", "update"]);
    }

    /// A store that only notes which operation reached it.
    #[derive(Default)]
    struct Reached(Mutex<Vec<&'static str>>);

    impl Reached {
        fn note(&self, op: &'static str) {
            self.0.lock().unwrap().push(op);
        }
    }

    #[async_trait]
    impl SessionStore for Reached {
        async fn create(&self, _: &mut SessionRecord) -> Result<(), StoreError> {
            self.note("create");
            Ok(())
        }
        async fn get(&self, _: &str) -> Result<Option<SessionRecord>, StoreError> {
            self.note("get");
            Ok(None)
        }
        async fn list(&self) -> Result<Vec<SessionRecord>, StoreError> {
            self.note("list");
            Ok(Vec::new())
        }
        async fn lineage(&self, _: &str, _: usize) -> Result<Vec<Kin>, StoreError> {
            self.note("lineage");
            Ok(Vec::new())
        }
        async fn running(&self) -> Result<Vec<SessionRecord>, StoreError> {
            self.note("running");
            Ok(Vec::new())
        }
        async fn waiting(&self) -> Result<Vec<SessionRecord>, StoreError> {
            self.note("waiting");
            Ok(Vec::new())
        }
        async fn update(&self, _: &mut SessionRecord) -> Result<(), StoreError> {
            self.note("update");
            Ok(())
        }
        async fn append_event(
            &self,
            _: &str,
            _: &str,
            _: &serde_json::Value,
            _: i64,
        ) -> Result<i64, StoreError> {
            self.note("append_event");
            Ok(1)
        }
        async fn update_with_events(
            &self,
            _: &mut SessionRecord,
            _: &[(&str, serde_json::Value)],
            _: i64,
        ) -> Result<Vec<i64>, StoreError> {
            self.note("update_with_events");
            Ok(Vec::new())
        }
        async fn update_with_usage(
            &self,
            _: &mut SessionRecord,
            _: &[(&str, serde_json::Value)],
            _: i64,
            _: &Unwritten,
        ) -> Result<Vec<i64>, StoreError> {
            self.note("update_with_usage");
            Ok(Vec::new())
        }
        async fn start_capped(
            &self,
            _: &mut SessionRecord,
            _: &[(&str, serde_json::Value)],
            _: i64,
            _: &RunCap,
        ) -> Result<Started, StoreError> {
            self.note("start_capped");
            Ok(Started::Stored(Vec::new()))
        }
        async fn events_after(&self, _: &str, _: i64) -> Result<Vec<EventRecord>, StoreError> {
            self.note("events_after");
            Ok(Vec::new())
        }
        async fn last_event_seq(&self, _: &str) -> Result<i64, StoreError> {
            self.note("last_event_seq");
            Ok(0)
        }
        async fn beat(&self, _: &str, _: i64, _: Option<&str>) -> Result<(), StoreError> {
            self.note("beat");
            Ok(())
        }
        async fn peer(&self, _: &str) -> Result<Option<Peer>, StoreError> {
            self.note("peer");
            Ok(None)
        }
        async fn heartbeats(&self) -> Result<HashMap<String, i64>, StoreError> {
            self.note("heartbeats");
            Ok(HashMap::new())
        }
        async fn forget_runner(&self, _: &str) -> Result<(), StoreError> {
            self.note("forget_runner");
            Ok(())
        }
        async fn prune_runners(&self, _: i64) -> Result<u64, StoreError> {
            self.note("prune_runners");
            Ok(0)
        }
        async fn release_memory(&self) {
            self.note("release_memory");
        }
        async fn record(&self, _: &Unwritten) -> Result<(), StoreError> {
            self.note("record");
            Ok(())
        }
        async fn claim(
            &self,
            _: &[(Gauge, f64)],
            _: &Unwritten,
            _: &Use,
        ) -> Result<Claimed, StoreError> {
            self.note("claim");
            Ok(Claimed::Granted {
                id: 1,
                used: Vec::new(),
            })
        }
        async fn measure(&self, _: &[Gauge]) -> Result<Vec<Standing>, StoreError> {
            self.note("measure");
            Ok(Vec::new())
        }
        async fn peak(&self, _: &str, _: Meter, _: PeakBy, _: i64) -> Result<f64, StoreError> {
            self.note("peak");
            Ok(0.0)
        }
        async fn report(&self, _: i64, _: i64, _: Group) -> Result<Vec<ReportRow>, StoreError> {
            self.note("report");
            Ok(Vec::new())
        }
        async fn session_totals(&self, _: &str) -> Result<Totals, StoreError> {
            self.note("session_totals");
            Ok(Totals::default())
        }
        async fn append_audit(
            &self,
            e: &crate::audit::Entry,
        ) -> Result<crate::audit::Sealed, StoreError> {
            self.note("append_audit");
            crate::audit::seal(e, 1, crate::audit::GENESIS)
                .map_err(|e| StoreError::Backend(e.to_string()))
        }
        async fn audit_after(
            &self,
            _: i64,
            _: usize,
        ) -> Result<Vec<crate::audit::Sealed>, StoreError> {
            self.note("audit_after");
            Ok(Vec::new())
        }
        async fn audit_head(&self) -> Result<Option<crate::audit::Head>, StoreError> {
            self.note("audit_head");
            Ok(None)
        }
    }

    /// A method with a default body that `Timed` does not pass on would
    /// silently do the default (as `release_memory` once did: SQLite's
    /// page cache was never emptied behind it).
    #[tokio::test]
    async fn every_operation_reaches_the_inner_store() {
        let inner = Arc::new(Reached::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let store = Timed::new(
            inner.clone(),
            Arc::new(move |op, _, _| log.lock().unwrap().push(op)),
        );
        let mut rec = record("s1", 1);
        store.create(&mut rec).await.unwrap();
        store.get("s1").await.unwrap();
        store.list().await.unwrap();
        store.lineage("s1", 1).await.unwrap();
        store.running().await.unwrap();
        store.waiting().await.unwrap();
        store.update(&mut rec).await.unwrap();
        store
            .append_event("s1", "k", &serde_json::Value::Null, 1)
            .await
            .unwrap();
        store.update_with_events(&mut rec, &[], 1).await.unwrap();
        store
            .update_with_usage(&mut rec, &[], 1, &Unwritten::default())
            .await
            .unwrap();
        let cap = RunCap {
            subject: "alice".into(),
            max: 1,
        };
        store.start_capped(&mut rec, &[], 1, &cap).await.unwrap();
        store.events_after("s1", 0).await.unwrap();
        store.last_event_seq("s1").await.unwrap();
        store.beat("i", 1, None).await.unwrap();
        store.peer("i").await.unwrap();
        store.heartbeats().await.unwrap();
        store.forget_runner("i").await.unwrap();
        store.prune_runners(0).await.unwrap();
        store.release_memory().await;
        let row = crate::contract::usage_row(1, "a", "s1", "r1", 1);
        store.claim(&[], &Unwritten::default(), &row).await.unwrap();
        store.record(&Unwritten::default()).await.unwrap();
        store.measure(&[]).await.unwrap();
        store
            .peak("a", Meter::Tokens, PeakBy::Session, 0)
            .await
            .unwrap();
        store.report(0, 1, Group::Agent).await.unwrap();
        store.session_totals("s1").await.unwrap();
        store
            .append_audit(&crate::contract::audit_entry(1))
            .await
            .unwrap();
        store.audit_after(0, 1).await.unwrap();
        store.audit_head().await.unwrap();
        let all = [
            "create",
            "get",
            "list",
            "lineage",
            "running",
            "waiting",
            "update",
            "append_event",
            "update_with_events",
            "update_with_usage",
            "start_capped",
            "events_after",
            "last_event_seq",
            "beat",
            "peer",
            "heartbeats",
            "forget_runner",
            "prune_runners",
            "release_memory",
            "claim",
            "record",
            "measure",
            "peak",
            "report",
            "session_totals",
            "append_audit",
            "audit_after",
            "audit_head",
        ];
        assert_eq!(*inner.0.lock().unwrap(), all);
        assert_eq!(*seen.lock().unwrap(), all);
        // What writes is named as the observer is told it.
        for op in WRITES {
            assert!(
                all.contains(op)
                    || [
                        "put_agent",
                        "delete_agent",
                        "put_connection",
                        "delete_connection"
                    ]
                    .contains(op),
                "{op}"
            );
        }
        let reads: Vec<_> = all.iter().filter(|op| !writes(op)).collect();
        assert_eq!(
            reads,
            [
                "get",
                "list",
                "lineage",
                "running",
                "waiting",
                "events_after",
                "last_event_seq",
                "peer",
                "heartbeats",
                "release_memory",
                "measure",
                "peak",
                "report",
                "session_totals",
                "audit_after",
                "audit_head"
            ]
            .iter()
            .collect::<Vec<_>>()
        );
    }
}
