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
//! The queue is a `VecDeque`, two flags and the reader's waker in one
//! allocation (about 100 bytes), polled by the event stream's body itself
//! (`api/event_stream.rs`): no channel state, no future per subscriber.
//! Besides events, the fanout can raise two flags on every queue: another
//! server stored events (read the store), and a keep-alive is due. So a
//! session needs no watch channel of its own for the first, and a stream
//! no timer of its own for the second.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bindery_store::model::EventRecord;

/// How far a subscriber may fall behind before it is dropped.
pub const BUFFER: usize = 1024;

/// An event as live subscribers get it.
#[derive(Clone, Debug)]
pub enum LiveEvent {
    Stored(Arc<EventRecord>),
    Delta(Arc<str>),
}

/// What a subscriber reads from its queue.
#[derive(Debug)]
pub enum Signal {
    Event(LiveEvent),
    /// Another server stored events of this session: they are in the
    /// store, not in this queue.
    StoredElsewhere,
    /// Nothing for a while: time for a keep-alive.
    Ping,
}

/// What the fanout and one subscriber share.
#[derive(Default)]
struct Queue {
    state: Mutex<State>,
}

/// What a stream was opened with, as far as a revocation can end it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Opened {
    /// The owner's or an end user's credentials: no revocation ends it.
    #[default]
    Standing,
    /// A session token.
    SessionToken,
    /// The share link of this id (`sh_…`).
    Share(String),
}

#[derive(Default)]
struct State {
    events: VecDeque<LiveEvent>,
    /// The reader waiting for the next signal.
    waker: Option<Waker>,
    stored_elsewhere: bool,
    ping: bool,
    /// The fanout let go of this subscriber: no more events will come.
    ended: bool,
    /// The subscriber went.
    gone: bool,
    /// What the stream was opened with: a session token's and a share's
    /// end when the session's tokens are revoked, a share's also when
    /// that share is.
    opened: Opened,
    /// Ended by a revocation: nothing more is given, queued or not.
    revoked: bool,
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
    /// Change the queue and wake its reader, unless the subscriber is gone
    /// or `change` refuses (false for both).
    fn update(&self, change: impl FnOnce(&mut State) -> bool) -> bool {
        let mut state = self.0.lock();
        if state.gone || !change(&mut state) {
            return false;
        }
        let waker = state.waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// False if the subscriber is gone or `BUFFER` events behind.
    fn try_send(&self, event: LiveEvent) -> bool {
        self.update(|state| {
            if state.events.len() >= BUFFER {
                return false;
            }
            state.events.push_back(event);
            true
        })
    }

    fn is_closed(&self) -> bool {
        self.0.lock().gone
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.update(|state| {
            state.ended = true;
            true
        });
    }
}

/// A subscriber's end.
pub struct Receiver(Arc<Queue>);

impl Receiver {
    /// Whether stored event `e` revokes what this subscriber came with (an
    /// `access_revoked` naming its session token or its share).
    pub fn revoked_by(&self, e: &EventRecord) -> bool {
        let Some(revoked) = bindery_store::wire::AccessRevoked::read(&e.kind, &e.data) else {
            return false;
        };
        match &self.0.lock().opened {
            Opened::Standing => false,
            Opened::SessionToken => revoked.session_tokens,
            Opened::Share(id) => revoked.session_tokens || revoked.shares.contains(id),
        }
    }

    /// The next signal, events first; `None` once the fanout let go of this
    /// subscriber and every event queued has been read. Nothing is taken
    /// from the queue unless it is returned. `&mut`: one reader per queue;
    /// `Context` by `&mut`, as every `poll` takes it.
    #[allow(clippy::needless_pass_by_ref_mut)]
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Signal>> {
        let mut state = self.0.lock();
        if state.revoked {
            return Poll::Ready(None);
        }
        if let Some(event) = state.events.pop_front() {
            if state.events.is_empty() && state.events.capacity() > 16 {
                // A burst is over: give its room back.
                state.events.shrink_to_fit();
            }
            return Poll::Ready(Some(Signal::Event(event)));
        }
        if std::mem::take(&mut state.stored_elsewhere) {
            return Poll::Ready(Some(Signal::StoredElsewhere));
        }
        if state.ended {
            return Poll::Ready(None);
        }
        if std::mem::take(&mut state.ping) {
            return Poll::Ready(Some(Signal::Ping));
        }
        if !state
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Whether a revocation ended this subscriber (what it was about to
    /// give is not given).
    pub fn revoked(&self) -> bool {
        self.0.lock().revoked
    }

    /// [`Receiver::poll_next`] as a future.
    #[cfg(test)]
    pub async fn recv(&mut self) -> Option<Signal> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.gone = true;
        state.events = VecDeque::new();
        state.waker = None;
    }
}

#[derive(Default)]
pub struct Fanout {
    subscribers: Mutex<Vec<Sender>>,
}

impl Fanout {
    /// A new subscriber, opened with `opened`.
    pub fn subscribe(&self, opened: Opened) -> Receiver {
        let queue = Arc::new(Queue::default());
        queue.lock().opened = opened;
        self.lock().push(Sender(queue.clone()));
        Receiver(queue)
    }

    /// End at once every subscriber that came with a session token or a
    /// share (the session's tokens, and with them its shares, were
    /// revoked): what is queued for them is dropped, and nothing more
    /// reaches them. The owner's stay.
    pub fn end_token_streams(&self) -> usize {
        self.end_where(|opened| *opened != Opened::Standing)
    }

    /// End at once the subscribers that came with share `id` (it was
    /// revoked), as [`Fanout::end_token_streams`] ends them.
    pub fn end_share_streams(&self, id: &str) -> usize {
        self.end_where(|opened| matches!(opened, Opened::Share(s) if s == id))
    }

    fn end_where(&self, ends: impl Fn(&Opened) -> bool) -> usize {
        let mut ended = 0;
        self.lock().retain(|tx| {
            let revoked = tx.update(|state| {
                if !ends(&state.opened) {
                    return false;
                }
                state.revoked = true;
                state.events = VecDeque::new();
                true
            });
            ended += usize::from(revoked);
            !revoked && !tx.is_closed()
        });
        ended
    }

    /// To every subscriber still reading; those gone or too far behind are
    /// dropped.
    pub fn send(&self, event: LiveEvent) {
        self.lock().retain(|tx| tx.try_send(event.clone()));
    }

    /// Tell every subscriber that another server stored events of this
    /// session.
    pub fn stored_elsewhere(&self) {
        self.raise(|state| state.stored_elsewhere = true);
    }

    /// Ask every subscriber with nothing queued for a keep-alive.
    pub fn ping(&self) {
        self.raise(|state| state.ping = state.events.is_empty());
    }

    fn raise(&self, flag: impl Fn(&mut State)) {
        self.lock().retain(|tx| {
            tx.update(|state| {
                flag(state);
                true
            })
        });
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

    fn delta(signal: Option<Signal>) -> Option<String> {
        match signal {
            Some(Signal::Event(LiveEvent::Delta(t))) => Some(t.to_string()),
            other => panic!("expected a delta, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn each_subscriber_gets_every_event_and_one_that_lags_is_dropped() {
        let fanout = Fanout::default();
        assert!(fanout.is_empty());
        let mut reading = fanout.subscribe(Opened::Standing);
        let mut stalled = fanout.subscribe(Opened::Standing);
        for i in 0..BUFFER {
            fanout.send(LiveEvent::Delta(i.to_string().into()));
            assert_eq!(delta(reading.recv().await), Some(i.to_string()));
        }
        // `stalled` read nothing: one more and it is dropped, after what
        // it had buffered.
        fanout.send(LiveEvent::Delta("more".into()));
        assert_eq!(delta(reading.recv().await).as_deref(), Some("more"));
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
        let mut rx = fanout.subscribe(Opened::Standing);
        let waiting = tokio::spawn(async move { (rx.recv().await, rx.recv().await) });
        fanout.send(LiveEvent::Delta("hi".into()));
        drop(fanout);
        let (first, end) = waiting.await.expect("the subscriber's task");
        assert_eq!(delta(first).as_deref(), Some("hi"));
        assert!(end.is_none());
    }

    #[tokio::test]
    async fn flags_wake_a_waiting_subscriber_and_come_after_queued_events() {
        let fanout = Fanout::default();
        let mut rx = fanout.subscribe(Opened::Standing);
        let waiting = tokio::spawn(async move {
            let signal = rx.recv().await;
            (signal, rx)
        });
        fanout.stored_elsewhere();
        let (signal, mut rx) = waiting.await.expect("the subscriber's task");
        assert!(matches!(signal, Some(Signal::StoredElsewhere)));

        // Queued events first; a keep-alive is not asked of a subscriber
        // that has some to read.
        fanout.send(LiveEvent::Delta("a".into()));
        fanout.ping();
        fanout.stored_elsewhere();
        assert_eq!(delta(rx.recv().await).as_deref(), Some("a"));
        assert!(matches!(rx.recv().await, Some(Signal::StoredElsewhere)));
        fanout.ping();
        assert!(matches!(rx.recv().await, Some(Signal::Ping)));
        // Each flag is read once.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(rx.poll_next(&mut cx).is_pending());
        drop(fanout);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_revocation_ends_the_token_subscribers_at_once_and_only_them() {
        let fanout = Fanout::default();
        let mut owner = fanout.subscribe(Opened::Standing);
        let mut token = fanout.subscribe(Opened::SessionToken);
        fanout.send(LiveEvent::Delta("before".into()));
        assert_eq!(delta(token.recv().await).as_deref(), Some("before"));
        // Queued and not read yet when the tokens go: never given.
        fanout.send(LiveEvent::Delta("queued".into()));
        assert_eq!(fanout.end_token_streams(), 1);
        assert!(token.recv().await.is_none());
        assert!(token.revoked());
        fanout.send(LiveEvent::Delta("after".into()));
        assert_eq!(delta(owner.recv().await).as_deref(), Some("before"));
        assert_eq!(delta(owner.recv().await).as_deref(), Some("queued"));
        assert_eq!(delta(owner.recv().await).as_deref(), Some("after"));
        assert!(!owner.revoked());
        assert_eq!(fanout.end_token_streams(), 0);
        assert!(!fanout.is_empty());
    }

    #[tokio::test]
    async fn a_shares_revocation_ends_its_own_subscribers_and_revoking_all_ends_every_share() {
        let fanout = Fanout::default();
        let mut owner = fanout.subscribe(Opened::Standing);
        let mut token = fanout.subscribe(Opened::SessionToken);
        let mut one = fanout.subscribe(Opened::Share("sh_1".into()));
        let mut two = fanout.subscribe(Opened::Share("sh_2".into()));
        fanout.send(LiveEvent::Delta("queued".into()));
        assert_eq!(fanout.end_share_streams("sh_1"), 1);
        assert!(one.recv().await.is_none() && one.revoked());
        assert_eq!(fanout.end_share_streams("sh_1"), 0);
        assert_eq!(fanout.end_share_streams("sh_3"), 0);
        for rx in [&mut owner, &mut token, &mut two] {
            assert_eq!(delta(rx.recv().await).as_deref(), Some("queued"));
            assert!(!rx.revoked());
        }
        assert_eq!(fanout.end_token_streams(), 2, "the token's and sh_2's");
        assert!(two.recv().await.is_none() && two.revoked());
        assert!(token.recv().await.is_none());
        assert!(!owner.revoked());
    }
}
