//! A session's events for subscribers: the stored ones, then live ones from
//! this server or, on a shared store, relayed from others.

use super::*;

impl Service {
    /// Subscribe first, then read what is stored: nothing falls in between.
    /// The stored events after `after`, and the feed of those to come.
    pub async fn events(
        &self,
        id: &str,
        after: i64,
    ) -> Result<(Vec<EventRecord>, Feed), ServiceError> {
        self.record(id).await?;
        let live = self.live(id);
        let rx = live.events.subscribe();
        let elsewhere = self.store.shared().then(|| live.elsewhere.subscribe());
        drop(live);
        let stored = self.store.events_after(id, after).await?;
        let feed = Feed {
            id: id.to_string(),
            last: stored.last().map_or(after, |e| e.seq),
            rx,
            elsewhere,
        };
        Ok((stored, feed))
    }

    /// The next events of `feed`, in order: this server's live ones as they
    /// happen and, on a shared store while this server does not run the
    /// session, those another server stores, read when the store's notice
    /// of them arrives (an idle subscriber costs no query). `None` once the
    /// subscriber has fallen too far behind (it reconnects with
    /// `Last-Event-ID`).
    pub async fn next_events(&self, feed: &mut Feed) -> Option<Vec<LiveEvent>> {
        loop {
            let Feed {
                id,
                rx,
                last,
                elsewhere,
            } = &mut *feed;
            let tick = async {
                match elsewhere {
                    Some(w) => {
                        if w.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let gap = tokio::select! {
                got = rx.recv() => match got {
                    Some(LiveEvent::Delta(text)) => return Some(vec![LiveEvent::Delta(text)]),
                    Some(LiveEvent::Stored(e)) => match next_step(*last, e.seq) {
                        Step::Skip => continue,
                        Step::Send => {
                            *last = e.seq;
                            return Some(vec![LiveEvent::Stored(e)]);
                        }
                        Step::Fetch => Some(e),
                    },
                    // Dropped for falling behind (or the session left memory).
                    None => return None,
                },
                _ = tick => {
                    if self.is_running(id) {
                        continue; // the live feed has it all
                    }
                    None
                }
            };
            match self.store.events_after(id, *last).await {
                Ok(events) if !events.is_empty() => {
                    *last = events.last().map_or(*last, |e| e.seq);
                    let events = events.into_iter().map(|e| LiveEvent::Stored(Arc::new(e)));
                    return Some(events.collect());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = %id, "cannot read the session's new events: {e}");
                    if let Some(e) = gap {
                        *last = e.seq;
                        return Some(vec![LiveEvent::Stored(e)]);
                    }
                }
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
                    if let Some(live) = self.peek(&session) {
                        live.elsewhere.send_replace(());
                    }
                }
                Ok(Notice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let live: Vec<Arc<Live>> = self
                        .live
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .values()
                        .cloned()
                        .collect();
                    for l in live {
                        l.elsewhere.send_replace(());
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// A subscriber's place in a session's event stream (see
/// [`Service::next_events`]).
pub struct Feed {
    id: String,
    rx: crate::session::fanout::Receiver,
    /// The `seq` of the last stored event given.
    last: i64,
    /// On a shared store: changes when another server stores an event of
    /// this session.
    elsewhere: Option<watch::Receiver<()>>,
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
