//! A session's live subscribers, each with a queue of its own.
//!
//! A channel shared by all of a session's subscribers (tokio's `broadcast`)
//! allocates its whole ring up front, for every live session, subscribed or
//! not. Here a session without subscribers holds an empty list, and each
//! subscriber a queue that grows only with what it has not read yet. A
//! subscriber that falls [`BUFFER`] events behind is dropped: its stream
//! ends, and it reconnects with `Last-Event-ID` (stored events are replayed
//! from the store). An event is shared, not copied, by the subscribers
//! that have not read it yet, and a queued slot is two words.
//!
//! The queue is a `VecDeque` and a `Notify` in one allocation (about 100
//! bytes) rather than a tokio `mpsc` channel, which allocates its state
//! and a first block of 32 slots (about 1 KiB) per subscriber, queued or
//! not: with thousands of open event streams that was a tenth of what
//! each cost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::model::EventRecord;

/// How far a subscriber may fall behind before it is dropped.
pub const BUFFER: usize = 1024;

/// An event as live subscribers get it.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    Stored(Arc<EventRecord>),
    Delta(Arc<str>),
}

/// What the fanout and one subscriber share.
#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    /// Wakes the subscriber (one waiter: a stored permit is never lost).
    ready: Notify,
}

#[derive(Default)]
struct State {
    events: VecDeque<LiveEvent>,
    /// The fanout let go of this subscriber: no more events will come.
    ended: bool,
    /// The subscriber went.
    gone: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The fanout's end of one subscriber's queue; dropping it ends the stream
/// once the subscriber has read what is queued.
struct Sender(Arc<Queue>);

impl Sender {
    /// False if the subscriber is gone or `BUFFER` events behind.
    fn try_send(&self, event: LiveEvent) -> bool {
        let mut state = self.0.lock();
        if state.gone || state.events.len() >= BUFFER {
            return false;
        }
        state.events.push_back(event);
        drop(state);
        self.0.ready.notify_one();
        true
    }

    fn is_closed(&self) -> bool {
        self.0.lock().gone
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.lock().ended = true;
        self.0.ready.notify_one();
    }
}

/// A subscriber's end.
pub struct Receiver(Arc<Queue>);

impl Receiver {
    /// The next event; `None` once the fanout let go of this subscriber and
    /// everything queued has been read. Cancel-safe: nothing is taken from
    /// the queue unless it is returned. `&mut`: one reader per queue.
    #[allow(clippy::needless_pass_by_ref_mut)]
    pub async fn recv(&mut self) -> Option<LiveEvent> {
        loop {
            {
                let mut state = self.0.lock();
                if let Some(event) = state.events.pop_front() {
                    if state.events.is_empty() && state.events.capacity() > 16 {
                        // A burst is over: give its room back.
                        state.events.shrink_to_fit();
                    }
                    return Some(event);
                }
                if state.ended {
                    return None;
                }
            }
            self.0.ready.notified().await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.gone = true;
        state.events = VecDeque::new();
    }
}

#[derive(Default)]
pub struct Fanout {
    subscribers: Mutex<Vec<Sender>>,
}

impl Fanout {
    pub fn subscribe(&self) -> Receiver {
        let queue = Arc::new(Queue::default());
        self.lock().push(Sender(queue.clone()));
        Receiver(queue)
    }

    /// To every subscriber still reading; those gone or too far behind are
    /// dropped.
    pub fn send(&self, event: LiveEvent) {
        self.lock().retain(|tx| tx.try_send(event.clone()));
    }

    /// Whether nobody subscribes (those that went are forgotten here).
    pub fn is_empty(&self) -> bool {
        let mut subscribers = self.lock();
        subscribers.retain(|tx| !tx.is_closed());
        subscribers.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Sender>> {
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

    #[tokio::test]
    async fn a_waiting_subscriber_wakes_on_send_and_ends_with_the_fanout() {
        let fanout = Fanout::default();
        let mut rx = fanout.subscribe();
        let waiting = tokio::spawn(async move { (rx.recv().await, rx.recv().await) });
        fanout.send(LiveEvent::Delta("hi".into()));
        drop(fanout);
        let (first, end) = waiting.await.expect("the subscriber's task");
        assert!(matches!(first, Some(LiveEvent::Delta(t)) if &*t == "hi"));
        assert!(end.is_none());
    }
}
