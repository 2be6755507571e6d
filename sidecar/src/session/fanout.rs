//! A session's live subscribers, each with a channel of its own.
//!
//! A channel shared by all of a session's subscribers (tokio's `broadcast`)
//! allocates its whole ring up front, for every live session, subscribed or
//! not. Here a session without subscribers holds an empty list, and each
//! subscriber a channel that grows only with what it has not read yet. A
//! subscriber that falls [`BUFFER`] events behind is dropped: its stream
//! ends, and it reconnects with `Last-Event-ID` (stored events are replayed
//! from the store). An event is shared, not copied, by the subscribers
//! that have not read it yet, and a queued slot is two words.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::model::EventRecord;

/// How far a subscriber may fall behind before it is dropped.
pub const BUFFER: usize = 1024;

/// An event as live subscribers get it.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    Stored(Arc<EventRecord>),
    Delta(Arc<str>),
}

#[derive(Default)]
pub struct Fanout {
    subscribers: Mutex<Vec<mpsc::Sender<LiveEvent>>>,
}

impl Fanout {
    pub fn subscribe(&self) -> mpsc::Receiver<LiveEvent> {
        let (tx, rx) = mpsc::channel(BUFFER);
        self.lock().push(tx);
        rx
    }

    /// To every subscriber still reading; those gone or too far behind are
    /// dropped.
    pub fn send(&self, event: LiveEvent) {
        self.lock().retain(|tx| tx.try_send(event.clone()).is_ok());
    }

    /// Whether nobody subscribes (those that went are forgotten here).
    pub fn is_empty(&self) -> bool {
        let mut subscribers = self.lock();
        subscribers.retain(|tx| !tx.is_closed());
        subscribers.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::Sender<LiveEvent>>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_subscriber_gets_every_event_and_one_that_lags_is_dropped() {
        let fanout = Fanout::default();
        assert!(fanout.is_empty());
        let mut reading = fanout.subscribe();
        let mut stalled = fanout.subscribe();
        for i in 0..BUFFER {
            fanout.send(LiveEvent::Delta(i.to_string().into()));
            assert!(
                matches!(reading.recv().await, Some(LiveEvent::Delta(t)) if *t == *i.to_string())
            );
        }
        // `stalled` read nothing: one more and it is dropped, after what
        // it had buffered.
        fanout.send(LiveEvent::Delta("more".into()));
        assert!(matches!(reading.recv().await, Some(LiveEvent::Delta(t)) if &*t == "more"));
        let mut buffered = 0;
        while stalled.recv().await.is_some() {
            buffered += 1;
        }
        assert_eq!(buffered, BUFFER);
        assert!(!fanout.is_empty());
        drop(reading);
        assert!(fanout.is_empty());
    }
}
