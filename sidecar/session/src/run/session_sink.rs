//! Where a session's run reports: each turn to the store, then to the
//! session's subscribers.
//!
//! The run's start and each turn are written in the background while the
//! run goes on to its next step, so the store's time is spent while the
//! model thinks rather than on top of it. They are still stored one after
//! another, in order, and the run waits for them ([`Host::stored`](crate::run::Host::stored))
//! before a tool or helper runs: a call never acts before the turn that
//! asked for it is on record, nor at all when that write found the run
//! taken (or its start could not be stored). The answer is kept and
//! stored with the run's end, in the same write.

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fanout::LiveEvent;
use crate::run::Events;
use crate::state::recorder::Recorder;
use crate::state::recorder::RunWrite;
use bindery_llm::Turn;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub(crate) struct SessionSink<'a> {
    recorder: &'a Arc<Recorder>,
    id: &'a str,
    cancel: &'a CancellationToken,
    shared: Arc<Shared>,
    /// The write in flight, if any.
    behind: Mutex<Option<Behind>>,
    /// The answer, for the run's end to store.
    answer: Mutex<Option<(Turn, Events)>>,
}

/// What the sink and its write in flight both see.
#[derive(Default)]
struct Shared {
    /// Another server closed the run as lost: it is stopped, and writes
    /// nothing more.
    taken: AtomicBool,
    /// The run's start could not be stored: it stops and leaves nothing.
    unstarted: AtomicBool,
    held: Mutex<Held>,
}

impl Shared {
    /// The write in flight is done and its events sent: the text held
    /// behind it goes out.
    fn release(&self, recorder: &Recorder, id: &str) {
        let mut held = lock(&self.held);
        recorder.fan_out(id, held.deltas.drain(..).map(LiveEvent::Delta));
        held.writing = false;
    }
}

enum Behind {
    /// The run's start, stored by whoever started the run.
    Start(oneshot::Receiver<bool>),
    /// A turn.
    Write(JoinHandle<()>),
}

/// Who starts a run says, with this, whether its start was stored.
pub(crate) struct Starter {
    stored: oneshot::Sender<bool>,
    shared: Arc<Shared>,
}

/// The run's side of [`Starter`], for its sink.
pub(crate) struct StartGate {
    stored: oneshot::Receiver<bool>,
    shared: Arc<Shared>,
}

/// A run whose start is being stored: until [`Starter::stored`], its sink
/// stores and sends nothing (dropping the starter says it was not).
pub(crate) fn start_gate() -> (Starter, StartGate) {
    let (tx, rx) = oneshot::channel();
    let shared = Arc::new(Shared::default());
    lock(&shared.held).writing = true;
    let starter = Starter {
        stored: tx,
        shared: Arc::clone(&shared),
    };
    (starter, StartGate { stored: rx, shared })
}

impl Starter {
    /// The start is stored and its event sent: the run's turns and
    /// streamed text may follow.
    pub(crate) fn stored(self, recorder: &Recorder, id: &str) {
        self.shared.release(recorder, id);
        let _ = self.stored.send(true);
    }
}

/// Streamed text that came while a turn was being written: it goes out
/// after that turn's events, so a subscriber sees them in the run's order.
#[derive(Default)]
struct Held {
    writing: bool,
    deltas: Vec<Arc<str>>,
}

impl<'a> SessionSink<'a> {
    pub(crate) fn new(
        recorder: &'a Arc<Recorder>,
        id: &'a str,
        cancel: &'a CancellationToken,
        gate: StartGate,
    ) -> Self {
        SessionSink {
            recorder,
            id,
            cancel,
            shared: gate.shared,
            behind: Mutex::new(Some(Behind::Start(gate.stored))),
            answer: Mutex::default(),
        }
    }

    /// Once the run's loop is over: every turn stored, then the answer to
    /// store with the end and whether the run was taken; `None` if the
    /// run's start was never stored.
    pub(crate) async fn close(&self) -> Option<(Option<(Turn, Events)>, bool)> {
        self.stored().await;
        if self.shared.unstarted.load(Ordering::Relaxed) {
            return None;
        }
        let answer = lock(&self.answer).take();
        Some((answer, self.shared.taken.load(Ordering::Relaxed)))
    }
}

impl SessionSink<'_> {
    pub(crate) async fn turn(&self, msg: &Turn, events: Events) {
        self.stored().await;
        if self.shared.taken.load(Ordering::Relaxed) {
            return;
        }
        lock(&self.shared.held).writing = true;
        let recorder = Arc::clone(self.recorder);
        let id = self.id.to_string();
        let cancel = self.cancel.clone();
        let shared = Arc::clone(&self.shared);
        let msg = msg.clone();
        let write = tokio::spawn(async move {
            match recorder.append_turn(&id, &msg, &events).await {
                RunWrite::Written(stored, _) => recorder.publish(&id, stored),
                RunWrite::Taken => {
                    tracing::warn!(
                        session = id,
                        "another server closed this run as lost (this server's heartbeat had lapsed): stopping it"
                    );
                    shared.taken.store(true, Ordering::Relaxed);
                    cancel.cancel();
                }
                // The turn could not be stored; its events may still be.
                RunWrite::Failed(_) => recorder.emit_all(&id, events).await,
            }
            shared.release(&recorder, &id);
        });
        *lock(&self.behind) = Some(Behind::Write(write));
    }

    pub(crate) async fn answer(&self, msg: &Turn, events: Events) {
        self.stored().await;
        *lock(&self.answer) = Some((msg.clone(), events));
    }

    pub(crate) async fn stored(&self) {
        let behind = lock(&self.behind).take();
        let waited = std::time::Instant::now();
        match behind {
            None => return,
            Some(Behind::Start(stored)) => {
                // A dropped starter is a start that was not stored.
                let started = stored.await.unwrap_or(false);
                if !started {
                    self.shared.unstarted.store(true, Ordering::Relaxed);
                    self.shared.taken.store(true, Ordering::Relaxed);
                    self.cancel.cancel();
                }
            }
            Some(Behind::Write(write)) => {
                if let Err(e) = write.await {
                    tracing::error!(session = self.id, "storing a turn failed: {e}");
                }
            }
        }
        self.recorder.metrics.run_store_wait(waited.elapsed());
    }

    pub(crate) fn delta(&self, text: &str) {
        // Under the lock, so a write that ends now sends its held text first.
        let mut held = lock(&self.shared.held);
        if held.writing {
            held.deltas.push(text.into());
        } else {
            self.recorder
                .fan_out(self.id, [LiveEvent::Delta(text.into())]);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use std::collections::BTreeMap;

    use crate::fanout::Signal;
    use crate::service::{Service, ServiceConfig};
    use bindery_llm::ChatMessage;
    use bindery_store::contract::record;
    use bindery_store::model::SessionStatus;
    use bindery_store::sqlite::SqliteStore;
    use bindery_store::wire::SessionEvent;
    use bindery_store::SessionStore;
    use bindery_tree::AgentTree;

    /// A service on a SQLite file (in the directory returned, which holds
    /// it) with session `s` running here, and the file's path.
    async fn running_here() -> (tempfile::TempDir, std::path::PathBuf, Arc<Service>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
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
        rec.runner = Some(service.instance().to_string());
        store.create(&mut rec).await.unwrap();
        (dir, path, service)
    }

    /// A sink of a run whose start is stored.
    fn started<'a>(service: &'a Arc<Service>, cancel: &'a CancellationToken) -> SessionSink<'a> {
        let (starter, gate) = start_gate();
        starter.stored(service.recorder(), "s");
        SessionSink::new(service.recorder(), "s", cancel, gate)
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
        let (_dir, path, service) = running_here().await;
        let mut events = service
            .live()
            .entry("s")
            .events
            .subscribe(crate::fanout::Opened::Standing);
        let cancel = CancellationToken::new();
        let sink = started(&service, &cancel);

        // Another connection holds the database's write lock.
        let blocker = rusqlite::Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let result = Turn::new(ChatMessage::tool_result("c1", "done"));
        let data = bindery_store::wire::ToolResult {
            id: "c1".into(),
            ok: true,
            output: "done".into(),
        };
        // Returns at once: the write waits for the lock, the run does not.
        sink.turn(&result, vec![SessionEvent::ToolResult(data)])
            .await;
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
        let stored = service.store().get("s").await.unwrap().unwrap();
        assert_eq!(stored.turns, [result]);
        assert!(!cancel.is_cancelled());
    }

    /// A write that finds the run closed by another server stops the run,
    /// and nothing after it is written; the answer is left to the end.
    #[tokio::test]
    async fn a_write_that_finds_the_run_taken_stops_it() {
        let (_dir, _, service) = running_here().await;
        let mut closed = service.store().get("s").await.unwrap().unwrap();
        closed.status = SessionStatus::Failed;
        closed.runner = None;
        closed.version += 1;
        service.store().update(&mut closed).await.unwrap();
        let cancel = CancellationToken::new();
        let sink = started(&service, &cancel);

        sink.turn(
            &Turn::new(ChatMessage::tool_result("c1", "done")),
            Events::new(),
        )
        .await;
        sink.stored().await;
        assert!(cancel.is_cancelled(), "the run is stopped");
        sink.turn(
            &Turn::new(ChatMessage::tool_result("c2", "late")),
            Events::new(),
        )
        .await;
        sink.answer(
            &Turn::new(ChatMessage::assistant("an answer")),
            Events::new(),
        )
        .await;
        let (answer, taken) = sink.close().await.expect("it had started");
        assert!(taken);
        assert!(answer.is_some(), "the end decides what becomes of it");
        assert_eq!(service.store().get("s").await.unwrap().unwrap(), closed);
    }

    /// The run asks the model while its start is stored: text it streams
    /// meanwhile waits for the start's event, and a start that could not
    /// be stored stops the run, which then stores and sends nothing.
    #[tokio::test]
    async fn nothing_of_a_run_goes_out_before_its_start_is_stored() {
        let (_dir, _, service) = running_here().await;
        let mut events = service
            .live()
            .entry("s")
            .events
            .subscribe(crate::fanout::Opened::Standing);

        let cancel = CancellationToken::new();
        let (starter, gate) = start_gate();
        let sink = SessionSink::new(service.recorder(), "s", &cancel, gate);
        sink.delta("early");
        assert!(events.recv().now_or_never().is_none());
        starter.stored(service.recorder(), "s");
        assert_eq!(event(events.recv().await), "delta early");

        let before = service.store().get("s").await.unwrap().unwrap();
        let cancel = CancellationToken::new();
        let (starter, gate) = start_gate();
        let sink = SessionSink::new(service.recorder(), "s", &cancel, gate);
        sink.delta("never");
        drop(starter);
        sink.turn(
            &Turn::new(ChatMessage::tool_result("c1", "done")),
            Events::new(),
        )
        .await;
        assert!(cancel.is_cancelled(), "the run is stopped");
        sink.answer(
            &Turn::new(ChatMessage::assistant("an answer")),
            Events::new(),
        )
        .await;
        assert!(
            sink.close().await.is_none(),
            "its end is not recorded either"
        );
        assert_eq!(service.store().get("s").await.unwrap().unwrap(), before);
        assert!(events.recv().now_or_never().is_none(), "nothing was sent");
    }
}
