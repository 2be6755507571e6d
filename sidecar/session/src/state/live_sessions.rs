//! What exists of sessions in this process's memory only: one entry a
//! session while it has a run, secret values, an event subscriber or a
//! request at work on it, and the choice of which to let go (idle ones,
//! and past `--max-live-sessions` the least recently used).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fanout::Fanout;
use crate::lru;
use bindery_metrics::Metrics;
use bindery_store::model::SessionRecord;

/// A session in memory.
pub(crate) struct Live {
    /// Serializes read-modify-write of the stored record. While this
    /// server's run goes on it holds the record as the run last wrote it,
    /// so the run's next write need not read it back: the update is
    /// version-checked, so a write made since (elsewhere or here) fails it
    /// and the record is read again.
    pub lock: tokio::sync::Mutex<Written>,
    /// Session-scope secret values: never written anywhere, kept out of
    /// the logs while held.
    pub secrets: Mutex<bindery_params::live::LiveValues>,
    /// The end user the session belongs to, as their last request
    /// presented them (their token, for exchanges): never written
    /// anywhere, forgotten with the secrets.
    pub person: Mutex<Option<bindery_identity::Person>>,
    /// When the secrets were last set or used, or a run ended (tokio's
    /// clock, which paused tests advance).
    pub used: Mutex<tokio::time::Instant>,
    pub run: Mutex<Option<RunHandle>>,
    /// Its event subscribers; on a shared store, also told when another
    /// server appends an event.
    pub events: Fanout,
}

/// See [`Live::lock`].
pub(crate) type Written = Option<Box<SessionRecord>>;

impl Live {
    pub fn touch(&self) {
        *lock(&self.used) = tokio::time::Instant::now();
    }

    pub fn running(&self) -> bool {
        lock(&self.run).is_some()
    }

    pub fn holds_secrets(&self) -> bool {
        !lock(&self.secrets).is_empty() || lock(&self.person).is_some()
    }
}

/// The live sessions of this process, by id.
pub(crate) struct LiveSessions {
    map: Mutex<HashMap<String, Arc<Live>>>,
    metrics: Arc<Metrics>,
    /// `--max-live-sessions`.
    limit: Option<usize>,
}

impl LiveSessions {
    pub fn new(metrics: Arc<Metrics>, limit: Option<usize>) -> LiveSessions {
        if let Some(limit) = limit {
            metrics.set_sessions_live_limit(limit as u64);
        }
        LiveSessions {
            map: Mutex::default(),
            metrics,
            limit,
        }
    }

    /// Session `id`'s entry, made if there is none.
    pub fn entry(&self, id: &str) -> Arc<Live> {
        let mut map = lock(&self.map);
        if let Some(live) = map.get(id) {
            return live.clone();
        }
        let live = Arc::new(Live {
            lock: tokio::sync::Mutex::new(None),
            secrets: Mutex::new(Default::default()),
            person: Mutex::new(None),
            used: Mutex::new(tokio::time::Instant::now()),
            run: Mutex::new(None),
            events: Fanout::default(),
        });
        map.insert(id.to_string(), live.clone());
        self.metrics.set_sessions_live(map.len() as u64);
        live
    }

    /// The entry if there is one (reads never make one).
    pub fn peek(&self, id: &str) -> Option<Arc<Live>> {
        lock(&self.map).get(id).cloned()
    }

    /// Every entry, as of now.
    pub fn all(&self) -> Vec<(String, Arc<Live>)> {
        lock(&self.map)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn count(&self) -> usize {
        lock(&self.map).len()
    }

    /// How many runs this process has under way.
    pub fn runs(&self) -> usize {
        lock(&self.map).values().filter(|l| l.running()).count()
    }

    /// Cancel this process's run of `id`, if it has one (a cancel
    /// requested through the store by another server).
    pub fn cancel_here(&self, id: &str) {
        let handle = self.peek(id).and_then(|l| lock(&l.run).clone());
        if let Some(handle) = handle {
            if !handle.cancel.is_cancelled() {
                tracing::info!(session = id, "cancelling the run as another server asked");
                handle.cancel.cancel();
            }
        }
    }

    pub fn is_running(&self, id: &str) -> bool {
        self.peek(id).is_some_and(|l| l.running())
    }

    /// Drop session `id`'s entry when it holds nothing worth keeping: no
    /// run, no secret, no event subscriber, and nobody else holds it.
    pub fn evict_if_idle(&self, id: &str) {
        let mut map = lock(&self.map);
        let idle = map.get(id).is_some_and(|l| {
            Arc::strong_count(l) == 1 && !l.running() && !l.holds_secrets() && l.events.is_empty()
        });
        if idle {
            map.remove(id);
        }
        self.metrics.set_sessions_live(map.len() as u64);
    }

    /// Past the limit, drop the least recently used idle entries, their
    /// secret values with them, as on a restart; the ids dropped. Called
    /// when a session takes secret values: a request that is refused or
    /// only reads never pushes a session out.
    pub fn evict_past_limit(&self) -> Vec<String> {
        let Some(limit) = self.limit else {
            return Vec::new();
        };
        // With the map locked, an entry only the map holds cannot be
        // taken meanwhile.
        let mut map = lock(&self.map);
        let excess = map.len().saturating_sub(limit);
        if excess == 0 {
            return Vec::new();
        }
        let entries = map.iter().map(|(id, l)| lru::Entry {
            key: id.clone(),
            used: *lock(&l.used),
            // Held elsewhere: a request, a run or a stream is at work on it.
            busy: Arc::strong_count(l) > 1 || l.running() || !l.events.is_empty(),
        });
        let victims = lru::victims(entries, excess);
        for id in &victims {
            map.remove(id);
            self.metrics.session_evicted();
            tracing::info!(session = %id, limit, "past --max-live-sessions: the least recently used session's secret values were forgotten");
        }
        self.metrics.set_sessions_live(map.len() as u64);
        victims
    }

    /// Give back the map's room for entries gone (a map never shrinks by
    /// itself).
    pub fn shrink(&self) {
        lock(&self.map).shrink_to_fit();
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Clone)]
pub(crate) struct RunHandle {
    pub(crate) cancel: CancellationToken,
    pub(crate) done: watch::Receiver<Option<Ended>>,
}

/// Waits for a run to end.
pub struct RunWait(pub(crate) watch::Receiver<Option<Ended>>);

/// A run that ended.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The session as this server stored the run's end, so a caller who
    /// waited needs no second read (`None`: it could not store it, or
    /// another server had closed the run).
    pub record: Option<Arc<SessionRecord>>,
}

impl RunWait {
    /// The run's end, if it came within `timeout`.
    pub async fn wait(mut self, timeout: Duration) -> Option<Ended> {
        match tokio::time::timeout(timeout, self.0.wait_for(Option::is_some)).await {
            Ok(Ok(ended)) => ended.clone(),
            _ => None,
        }
    }

    /// Until the run ends, however long that takes.
    pub async fn finished(mut self) {
        let _ = self.0.wait_for(Option::is_some).await;
    }
}
