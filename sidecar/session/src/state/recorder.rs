//! The recorder: a session's writes by the run this process has on it,
//! its events stored and handed to the session's live subscribers, in
//! order, and the feed of them that subscribers read (`feed.rs`). The
//! run's sink (`session_sink.rs`), the run's start and end (`runs.rs`) and
//! answers, cancels and expiries write through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::fanout::LiveEvent;
use crate::state::live_sessions::LiveSessions;
use bindery_identity::Subject;
use bindery_llm::Turn;
use bindery_metrics::Metrics;
use bindery_store::clock::Clock;
use bindery_store::model::{EventRecord, SessionRecord, SessionStatus};
use bindery_store::usage::Unwritten;
use bindery_store::wire::SessionEvent;
use bindery_store::{SessionStore, StoreError};

/// What sessions' runs write, and who hears of it.
pub struct Recorder {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) live: Arc<LiveSessions>,
    pub(crate) metrics: Arc<Metrics>,
    /// This server's instance id: a run is written only while it is ours.
    instance: Arc<str>,
    clock: Arc<dyn Clock>,
    /// The end user each session belongs to, as its events name them: it
    /// never changes once the session exists, so it is read once (a run's
    /// write has the record at hand; a lone event reads it here).
    subjects: Mutex<HashMap<String, Option<Subject>>>,
}

/// The most sessions whose subject [`Recorder::subject_of`] remembers;
/// past it, it starts afresh (a miss costs one read).
const SUBJECTS_KEPT: usize = 4096;

impl Recorder {
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        live: Arc<LiveSessions>,
        metrics: Arc<Metrics>,
        instance: Arc<str>,
        clock: Arc<dyn Clock>,
    ) -> Recorder {
        Recorder {
            store,
            live,
            metrics,
            instance,
            clock,
            subjects: Mutex::new(HashMap::new()),
        }
    }

    /// The end user session `id` belongs to, remembered.
    fn remember(&self, id: &str, subject: Option<&Subject>) {
        let mut kept = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= SUBJECTS_KEPT && !kept.contains_key(id) {
            kept.clear();
        }
        kept.insert(id.to_string(), subject.cloned());
    }

    /// The end user session `id` belongs to (`None`: nobody's, or it
    /// cannot be read, in which case nothing is remembered).
    pub async fn subject_of(&self, id: &str) -> Option<Subject> {
        let known = self
            .subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        if let Some(subject) = known {
            return subject;
        }
        match self.store.get(id).await {
            Ok(Some(rec)) => {
                self.remember(id, rec.security.subject.as_ref());
                rec.security.subject
            }
            _ => None,
        }
    }

    /// `events` encoded as session `rec` stores them, its subject
    /// remembered.
    pub(crate) fn encoded_for(&self, rec: &SessionRecord, events: &[SessionEvent]) -> Vec<Encoded> {
        self.remember(&rec.id, rec.security.subject.as_ref());
        encoded(events, rec.security.subject.as_ref())
    }

    /// Read-modify-write of a session by the run this process has on it,
    /// under the session's lock, with `events` appended and `usage` written
    /// in the same store operation (see [`Recorder::publish`] for their
    /// subscribers). Nothing is written once the run is no longer ours
    /// (another server found it lost and closed it); a write that lost a
    /// race with a change elsewhere (parameters) is redone on the fresh
    /// record. The write that ends the run also ends its hold on the
    /// session, under the same lock.
    pub(crate) async fn write_run(
        &self,
        id: &str,
        change: impl Fn(&mut SessionRecord),
        events: &[SessionEvent],
        usage: &Unwritten,
    ) -> RunWrite {
        let live = self.live.entry(id);
        let mut written = live.lock.lock().await;
        // A record as last written is an extra attempt, not one of the three.
        let cached = usize::from(written.is_some());
        for _ in 0..3 + cached {
            let mut rec = match written.take() {
                Some(rec) => *rec,
                None => match self.store.get(id).await {
                    Ok(Some(rec)) => rec,
                    Ok(None) => return RunWrite::Failed(format!("no session {id}")),
                    Err(e) => return RunWrite::Failed(e.to_string()),
                },
            };
            if rec.status != SessionStatus::Running
                || rec.runner.as_deref() != Some(&*self.instance)
            {
                return RunWrite::Taken;
            }
            if rec.cancel_requested {
                // Another server asked to cancel this run.
                self.live.cancel_here(id);
            }
            change(&mut rec);
            let events = &self.encoded_for(&rec, events);
            rec.version += 1;
            let at = self.clock.now_ms();
            rec.updated_at = at;
            let write = if usage.is_empty() {
                self.store.update_with_events(&mut rec, events, at).await
            } else {
                self.store
                    .update_with_usage(&mut rec, events, at, usage)
                    .await
            };
            match write {
                Ok(seqs) => {
                    let stored = stored_events(seqs, events, at);
                    if rec.status == SessionStatus::Running {
                        *written = Some(Box::new(rec));
                        return RunWrite::Written(stored, None);
                    }
                    // The run's end: it lets the session go before its
                    // lock does, so that a request its end prompts (an
                    // answer to what it waits for, a next message) finds
                    // no run in progress. The end counts as a use, so
                    // that its secrets' idle time starts now, not when
                    // they were last used before a long run.
                    live.touch();
                    *live.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    return RunWrite::Written(stored, Some(Box::new(rec)));
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return RunWrite::Failed(e.to_string()),
            }
        }
        RunWrite::Failed(format!(
            "session {id} kept changing concurrently; gave up after 3 attempts"
        ))
    }

    pub(crate) async fn append_turn(
        &self,
        id: &str,
        msg: &Turn,
        events: &[SessionEvent],
    ) -> RunWrite {
        let written = self
            .write_run(
                id,
                |rec| rec.turns.push(msg.clone()),
                events,
                &Unwritten::default(),
            )
            .await;
        if let RunWrite::Failed(e) = &written {
            tracing::error!(session = id, "cannot store a turn: {e}");
        }
        written
    }

    /// [`Recorder::emit`] of an event of session `rec`, read already: its
    /// subject is taken from it, with no read of the store.
    pub(crate) async fn emit_for(&self, rec: &SessionRecord, event: SessionEvent) {
        self.remember(&rec.id, rec.security.subject.as_ref());
        self.emit(&rec.id, event).await;
    }

    pub(crate) async fn emit(&self, id: &str, event: SessionEvent) {
        let subject = self.subject_of(id).await;
        let at = self.clock.now_ms();
        let (kind, data) = (event.kind(), with_subject(event.data(), subject.as_ref()));
        match self.store.append_event(id, kind, &data, at).await {
            Ok(seq) => self.publish(id, stored_events(vec![seq], &[(kind, data)], at)),
            Err(e) => tracing::error!(session = id, "cannot store an event: {e}"),
        }
    }

    /// Each of `events` stored on its own, then handed to subscribers.
    pub(crate) async fn emit_all(&self, id: &str, events: Vec<SessionEvent>) {
        for event in events {
            self.emit(id, event).await;
        }
    }

    /// Hand stored events to the session's live subscribers, in order.
    pub(crate) fn publish(&self, id: &str, events: Vec<EventRecord>) {
        self.fan_out(
            id,
            events.into_iter().map(|e| LiveEvent::Stored(Arc::new(e))),
        );
    }

    /// Hand `events` (stored ones, or streamed text, which is never stored)
    /// to the session's live subscribers, in order, each timed.
    pub(crate) fn fan_out(&self, id: &str, events: impl IntoIterator<Item = LiveEvent>) {
        let Some(live) = self.live.peek(id) else {
            return; // nobody in memory, so nobody listening
        };
        for event in events {
            let start = std::time::Instant::now();
            live.events.send(event);
            self.metrics.event_fanout(start.elapsed());
        }
    }
}

/// `events` as stored with `seqs` at `at`.
pub(crate) fn stored_events(seqs: Vec<i64>, events: &[Encoded], at: i64) -> Vec<EventRecord> {
    seqs.into_iter()
        .zip(events)
        .map(|(seq, (kind, data))| EventRecord {
            seq,
            kind: kind.to_string(),
            data: data.clone(),
            at,
        })
        .collect()
}

/// An event as the store keeps it: its kind and its data as JSON. Stored
/// events are read back in this form (never as [`SessionEvent`]), so a row
/// written by an older or newer server still reads and streams as it was.
type Encoded = (&'static str, serde_json::Value);

/// `events` as stored: each one's data names the end user the session
/// belongs to (`subject`), when it belongs to one.
pub(crate) fn encoded(events: &[SessionEvent], subject: Option<&Subject>) -> Vec<Encoded> {
    events
        .iter()
        .map(|e| (e.kind(), with_subject(e.data(), subject)))
        .collect()
}

/// An event's data with `subject` in it (an id, never a credential), so
/// that whoever reads the stream, or the stored events, can tell whose
/// session it is without another lookup. Every event's data is an object.
fn with_subject(mut data: serde_json::Value, subject: Option<&Subject>) -> serde_json::Value {
    if let (Some(subject), Some(fields)) = (subject, data.as_object_mut()) {
        fields.insert("subject".into(), subject.as_str().into());
    }
    data
}

/// What became of a run's write to its session.
pub(crate) enum RunWrite {
    /// Stored, with the events that went with it, and the record as
    /// stored when the write ended the run (a running one stays cached
    /// under the session's lock).
    Written(Vec<EventRecord>, Option<Box<SessionRecord>>),
    /// The run is no longer this process's: another server closed it.
    Taken,
    Failed(String),
}
