//! A session's events for subscribers: the stored ones, then live ones from
//! this server or, on a shared store, relayed from others.

use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::error::ServiceError;
use crate::fanout::{LiveEvent, Opened, Receiver, Signal};
use crate::state::recorder::Recorder;
use bindery_store::model::EventRecord;
use bindery_store::{Notice, StoreError};

impl Recorder {
    /// Subscribe first, then read what is stored: nothing falls in between.
    /// The stored events after `after`, and the feed of those to come.
    /// `opened`: what the subscriber came with; a session token's or a
    /// share's feed ends when it is revoked.
    pub async fn events(
        &self,
        id: &str,
        after: i64,
        opened: Opened,
    ) -> Result<(Vec<EventRecord>, Feed), ServiceError> {
        crate::state::stored_session(&*self.store, id).await?;
        let rx = self.live.entry(id).events.subscribe(opened);
        let stored = self.store.events_after(id, after).await?;
        let last = match stored.last() {
            Some(e) => e.seq,
            // Nothing after `after`: the feed goes on from the session's
            // last event, never from an id a client named past it (which
            // would skip the events that come to take it, a revocation
            // among them).
            None if after > 0 => after.min(self.store.last_event_seq(id).await?),
            None => after,
        };
        let feed = Feed {
            id: id.to_string(),
            last,
            rx,
            reading: None,
        };
        Ok((stored, feed))
    }

    /// Ask every event stream with nothing to send for a keep-alive, each
    /// `every`, until `stop`: one timer for all of them.
    pub async fn ping_streams(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for live in self.live.all().into_iter().map(|(_, l)| l) {
                live.events.ping();
            }
        }
    }

    /// Pass the store's notices of other servers' appends to the sessions'
    /// subscribers here, until `stop`. One listening connection serves all
    /// of them; a store of our own has none, and this returns at once.
    pub async fn relay_notices(self: Arc<Self>, stop: CancellationToken) {
        let Some(mut notices) = self.store.notices() else {
            return;
        };
        loop {
            let notice = tokio::select! {
                _ = stop.cancelled() => return,
                n = notices.recv() => n,
            };
            match notice {
                Ok(Notice::Appended { session, .. }) => {
                    if let Some(live) = self.live.peek(&session) {
                        live.events.stored_elsewhere();
                    }
                }
                Ok(Notice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    for live in self.live.all().into_iter().map(|(_, l)| l) {
                        live.events.stored_elsewhere();
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// A subscriber's place in a session's event stream, polled by the
/// stream's body: this server's live events as they happen and, on a
/// shared store while this server does not run the session, those another
/// server stores, read when the store's notice of them arrives (an idle
/// subscriber costs no query).
pub struct Feed {
    id: String,
    rx: Receiver,
    /// The `seq` of the last stored event given.
    last: i64,
    /// A read of the store under way, with the live event that showed the
    /// gap it fills (given as it is if the read fails).
    reading: Option<Reading>,
}

struct Reading {
    events: BoxFuture<'static, Result<Vec<EventRecord>, StoreError>>,
    gap: Option<Arc<EventRecord>>,
}

/// What a feed gives next.
#[derive(Debug)]
pub enum FeedItem {
    /// Events in order (never empty).
    Events(Vec<LiveEvent>),
    /// Nothing new for a while.
    KeepAlive,
}

impl Feed {
    /// The next events, in order, or a keep-alive; `None` once the
    /// subscriber has fallen too far behind (it reconnects with
    /// `Last-Event-ID`), the session left memory, or the session token it
    /// came with was revoked.
    pub fn poll_next(
        &mut self,
        recorder: &Recorder,
        cx: &mut Context<'_>,
    ) -> Poll<Option<FeedItem>> {
        loop {
            if let Some(reading) = &mut self.reading {
                let read = ready!(reading.events.as_mut().poll(cx));
                let gap = self.reading.take().and_then(|r| r.gap);
                if self.rx.revoked() {
                    return Poll::Ready(None);
                }
                match read {
                    // Revoked through another server: nothing more.
                    Ok(events) if events.iter().any(|e| self.rx.revoked_by(e)) => {
                        return Poll::Ready(None);
                    }
                    Ok(events) if !events.is_empty() => {
                        self.last = events.last().map_or(self.last, |e| e.seq);
                        let events = events.into_iter().map(|e| LiveEvent::Stored(Arc::new(e)));
                        return Poll::Ready(Some(FeedItem::Events(events.collect())));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let id = &self.id;
                        tracing::warn!(session = %id, "cannot read the session's new events: {e}");
                        if let Some(e) = gap {
                            self.last = e.seq;
                            return Poll::Ready(Some(FeedItem::Events(vec![LiveEvent::Stored(e)])));
                        }
                    }
                }
                continue;
            }
            let gap = match ready!(self.rx.poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Signal::Ping) => return Poll::Ready(Some(FeedItem::KeepAlive)),
                Some(Signal::Event(LiveEvent::Delta(text))) => {
                    return Poll::Ready(Some(FeedItem::Events(vec![LiveEvent::Delta(text)])))
                }
                Some(Signal::Event(LiveEvent::Stored(e))) if self.rx.revoked_by(&e) => {
                    return Poll::Ready(None)
                }
                Some(Signal::Event(LiveEvent::Stored(e))) => match next_step(self.last, e.seq) {
                    Step::Skip => continue,
                    Step::Send => {
                        self.last = e.seq;
                        return Poll::Ready(Some(FeedItem::Events(vec![LiveEvent::Stored(e)])));
                    }
                    Step::Fetch => Some(e),
                },
                // While the run is here, the live events have it all.
                Some(Signal::StoredElsewhere) if recorder.live.is_running(&self.id) => continue,
                Some(Signal::StoredElsewhere) => None,
            };
            let (store, id, after) = (recorder.store.clone(), self.id.clone(), self.last);
            self.reading = Some(Reading {
                events: Box::pin(async move { store.events_after(&id, after).await }),
                gap,
            });
        }
    }
}

/// What a feed that has given stored events up to `last` does with a live
/// one numbered `seq`.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Given already.
    Skip,
    /// The next one.
    Send,
    /// Some before it are not given yet (stored by another server, or
    /// broadcast out of order): read them from the store.
    Fetch,
}

pub(super) fn next_step(last: i64, seq: i64) -> Step {
    if seq <= last {
        Step::Skip
    } else if seq == last + 1 {
        Step::Send
    } else {
        Step::Fetch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_sends_the_next_event_skips_old_ones_and_reads_a_gap() {
        assert_eq!(next_step(3, 4), Step::Send);
        assert_eq!(next_step(3, 3), Step::Skip);
        assert_eq!(next_step(3, 1), Step::Skip);
        assert_eq!(next_step(3, 6), Step::Fetch);
        assert_eq!(next_step(0, 1), Step::Send);
    }
}
