//! Where a session's run reports: each turn to the store, then to the
//! session's subscribers.
//!
//! A turn is written in the background while the run goes on to its next
//! step, so the store's time is spent while the model thinks rather than
//! on top of it. Turns are still stored one after another, in order, and
//! the run waits for them ([`RunSink::stored`]) before a tool or helper
//! runs: a call never acts before the turn that asked for it is on record,
//! nor at all when that write found the run taken. The answer is kept
//! and stored with the run's end, in the same write.

use tokio::task::JoinHandle;

use super::runs::RunWrite;
use super::*;
use crate::session::fanout::LiveEvent;

pub(super) struct SessionSink<'a> {
    service: &'a Arc<Service>,
    id: &'a str,
    cancel: &'a CancellationToken,
    shared: Arc<Shared>,
    /// The write in flight, if any.
    behind: Mutex<Option<JoinHandle<()>>>,
    /// The answer, for the run's end to store.
    answer: Mutex<Option<(ChatMessage, Events)>>,
}

/// What the sink and its write in flight both see.
#[derive(Default)]
struct Shared {
    /// Another server closed the run as lost: it is stopped, and writes
    /// nothing more.
    taken: AtomicBool,
    held: Mutex<Held>,
}

/// Streamed text that came while a turn was being written: it goes out
/// after that turn's events, so a subscriber sees them in the run's order.
#[derive(Default)]
struct Held {
    writing: bool,
    deltas: Vec<Arc<str>>,
}

impl<'a> SessionSink<'a> {
    pub(super) fn new(
        service: &'a Arc<Service>,
        id: &'a str,
        cancel: &'a CancellationToken,
    ) -> Self {
        SessionSink {
            service,
            id,
            cancel,
            shared: Arc::default(),
            behind: Mutex::default(),
            answer: Mutex::default(),
        }
    }

    /// Once the run's loop is over: every turn stored, the answer to store
    /// with the end, and whether the run was taken.
    pub(super) async fn close(&self) -> (Option<(ChatMessage, Events)>, bool) {
        self.stored().await;
        let answer = lock(&self.answer).take();
        (answer, self.shared.taken.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl RunSink for SessionSink<'_> {
    async fn turn(&self, msg: &ChatMessage, events: Events) {
        self.stored().await;
        if self.shared.taken.load(Ordering::Relaxed) {
            return;
        }
        lock(&self.shared.held).writing = true;
        let service = Arc::clone(self.service);
        let id = self.id.to_string();
        let cancel = self.cancel.clone();
        let shared = Arc::clone(&self.shared);
        let msg = msg.clone();
        let write = tokio::spawn(async move {
            match service.append_turn(&id, &msg, &events).await {
                RunWrite::Written(stored, _) => service.publish(&id, stored),
                RunWrite::Taken => {
                    tracing::warn!(
                        session = id,
                        "another server closed this run as lost (this server's heartbeat had lapsed): stopping it"
                    );
                    shared.taken.store(true, Ordering::Relaxed);
                    cancel.cancel();
                }
                // The turn could not be stored; its events may still be.
                RunWrite::Failed(_) => service.emit_all(&id, events).await,
            }
            let mut held = lock(&shared.held);
            for text in held.deltas.drain(..) {
                service.send_delta(&id, text);
            }
            held.writing = false;
        });
        *lock(&self.behind) = Some(write);
    }

    async fn answer(&self, msg: &ChatMessage, events: Events) {
        self.stored().await;
        *lock(&self.answer) = Some((msg.clone(), events));
    }

    async fn stored(&self) {
        let write = lock(&self.behind).take();
        if let Some(write) = write {
            if let Err(e) = write.await {
                tracing::error!(session = self.id, "storing a turn failed: {e}");
            }
        }
    }

    fn delta(&self, text: &str) {
        // Under the lock, so a write that ends now sends its held text first.
        let mut held = lock(&self.shared.held);
        if held.writing {
            held.deltas.push(text.into());
        } else {
            self.service.send_delta(self.id, text.into());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Service {
    /// Streamed text to the session's live subscribers (never stored).
    fn send_delta(&self, id: &str, text: Arc<str>) {
        if let Some(live) = self.peek(id) {
            let start = std::time::Instant::now();
            live.events.send(LiveEvent::Delta(text));
            self.metrics.event_fanout(start.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::session::fanout::Signal;
    use crate::session::store::contract::record;
    use crate::session::store::sqlite::SqliteStore;

    /// A service on a SQLite file with session `s` running here.
    async fn running_here(path: &std::path::Path) -> Arc<Service> {
        let store = Arc::new(SqliteStore::open(&path.to_string_lossy()).unwrap());
        let tree = Arc::new(AgentTree {
            agents: BTreeMap::new(),
            roots: Vec::new(),
            warnings: Vec::new(),
        });
        let service = Service::new(
            tree,
            BTreeMap::new(),
            store.clone(),
            Arc::default(),
            ServiceConfig::default(),
        );
        let mut rec = record("s", 1);
        rec.status = SessionStatus::Running;
        rec.runner = Some(service.instance.clone());
        store.create(&rec).await.unwrap();
        service
    }

    fn event(signal: Option<Signal>) -> String {
        match signal {
            Some(Signal::Event(LiveEvent::Stored(e))) => e.kind.clone(),
            Some(Signal::Event(LiveEvent::Delta(text))) => format!("delta {text}"),
            other => panic!("not an event: {other:?}"),
        }
    }

    /// The run goes on while a turn is written; text it streams meanwhile
    /// reaches subscribers after that turn's events, and the turn is on
    /// record once `stored` returns.
    #[tokio::test]
    async fn a_turn_is_written_while_the_run_goes_on_and_streams_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
        let service = running_here(&path).await;
        let mut events = service.live("s").events.subscribe();
        let cancel = CancellationToken::new();
        let sink = SessionSink::new(&service, "s", &cancel);

        // Another connection holds the database's write lock.
        let blocker = rusqlite::Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let result = ChatMessage::tool_result("c1", "done");
        let data = json!({"id": "c1", "ok": true, "output": "done"});
        // Returns at once: the write waits for the lock, the run does not.
        sink.turn(&result, vec![("tool_result", data)]).await;
        sink.delta("the next");
        assert!(
            events.recv().now_or_never().is_none(),
            "nothing goes out before the turn is stored"
        );
        blocker.execute_batch("COMMIT").unwrap();
        sink.stored().await;
        sink.delta(" answer");

        assert_eq!(event(events.recv().await), "tool_result");
        assert_eq!(event(events.recv().await), "delta the next");
        assert_eq!(event(events.recv().await), "delta  answer");
        let stored = service.store.get("s").await.unwrap().unwrap();
        assert_eq!(stored.turns, [result]);
        assert!(!cancel.is_cancelled());
    }

    /// A write that finds the run closed by another server stops the run,
    /// and nothing after it is written; the answer is left to the end.
    #[tokio::test]
    async fn a_write_that_finds_the_run_taken_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
        let service = running_here(&path).await;
        let mut closed = service.store.get("s").await.unwrap().unwrap();
        closed.status = SessionStatus::Failed;
        closed.runner = None;
        closed.version += 1;
        service.store.update(&closed).await.unwrap();
        let cancel = CancellationToken::new();
        let sink = SessionSink::new(&service, "s", &cancel);

        sink.turn(&ChatMessage::tool_result("c1", "done"), Events::new())
            .await;
        sink.stored().await;
        assert!(cancel.is_cancelled(), "the run is stopped");
        sink.turn(&ChatMessage::tool_result("c2", "late"), Events::new())
            .await;
        sink.answer(&ChatMessage::assistant("an answer"), Events::new())
            .await;
        let (answer, taken) = sink.close().await;
        assert!(taken);
        assert!(answer.is_some(), "the end decides what becomes of it");
        assert_eq!(service.store.get("s").await.unwrap().unwrap(), closed);
    }
}
