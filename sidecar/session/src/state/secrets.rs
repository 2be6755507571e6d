//! Secret session values: held in this process's memory only, for as long
//! as the session is live, and which server holds them (so a request
//! elsewhere can be sent there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lease::{self, LeaseConfig};
use crate::state::live_sessions::lock;
use crate::state::live_sessions::LiveSessions;
use bindery_params::{ParamValue, Values};
use bindery_store::clock::Clock;
use bindery_store::model::{SessionRecord, SessionStatus};
use bindery_store::{Peer, SessionStore, StoreError};

/// The secret values of this server's live sessions, and which servers
/// hold the values of sessions elsewhere.
pub struct Secrets {
    live: Arc<LiveSessions>,
    store: Arc<dyn SessionStore>,
    /// This server's instance id, as records name a holder.
    instance: Arc<str>,
    lease: LeaseConfig,
    /// `--live-session-ttl`.
    ttl: Option<Duration>,
    clock: Arc<dyn Clock>,
    /// Other servers' heartbeats as last read, with when they were read
    /// (see [`Secrets::held_elsewhere`]).
    peers: Mutex<HashMap<String, (Peer, tokio::time::Instant)>>,
}

impl Secrets {
    pub(crate) fn new(
        live: Arc<LiveSessions>,
        store: Arc<dyn SessionStore>,
        instance: Arc<str>,
        lease: LeaseConfig,
        ttl: Option<Duration>,
        clock: Arc<dyn Clock>,
    ) -> Secrets {
        Secrets {
            live,
            store,
            instance,
            lease,
            ttl,
            clock,
            peers: Mutex::default(),
        }
    }

    /// The session-scope values a session holds now: stored ones and the
    /// secrets in memory.
    pub fn session_values(&self, rec: &SessionRecord) -> Values {
        let mut values: Values = rec
            .params
            .as_map()
            .iter()
            .map(|(k, v)| (k.clone(), ParamValue::Plain(v.clone())))
            .collect();
        if let Some(live) = self.live.peek(&rec.id) {
            live.touch();
            let secrets = lock(&live.secrets);
            values.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        values
    }

    /// Names of the secret values a session holds (never the values).
    pub fn names(&self, id: &str) -> Vec<String> {
        names(&self.live, id)
    }

    /// Keep the secret ones of `session`'s values for session `id`, in
    /// place of those it held.
    pub fn keep(&self, id: &str, session: &Values) {
        let kept: Values = session
            .iter()
            .filter(|(_, v)| v.is_secret())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let live = match self.live.peek(id) {
            Some(live) => live,
            None if kept.is_empty() => return,
            None => self.live.entry(id),
        };
        lock(&live.secrets).set(kept);
        live.touch();
        for id in self.live.evict_past_limit() {
            self.release_holder(&id);
        }
    }

    /// Forget the secret values of every session idle for longer than the
    /// live TTL (no run, nothing set or used since): a later message
    /// answers `params_required`, as after a restart. Returns how many
    /// sessions lost theirs.
    pub fn expire(&self) -> usize {
        let Some(ttl) = self.ttl else {
            return 0;
        };
        let mut expired = 0;
        for (id, live) in self.live.all() {
            let idle = !live.running() && lock(&live.used).elapsed() >= ttl;
            if idle {
                // The end user's token goes with the secrets.
                lock(&live.person).take();
            }
            let mut secrets = lock(&live.secrets);
            if idle && !secrets.is_empty() {
                secrets.clear();
                self.release_holder(&id);
                expired += 1;
                tracing::info!(session = %id, "idle session: its secret values were forgotten");
            }
            drop(secrets);
            drop(live);
            self.live.evict_if_idle(&id);
        }
        expired
    }

    /// Drop a session's secret values from memory (a one-shot run's, once
    /// it has ended); a later run needs them supplied again.
    pub fn forget(&self, id: &str) {
        if let Some(live) = self.live.peek(id) {
            let mut secrets = lock(&live.secrets);
            if !secrets.is_empty() {
                secrets.clear();
                self.release_holder(id);
            }
        }
        self.live.evict_if_idle(id);
    }

    /// Who holds a session's secret values once it has `session`: this
    /// server when some are secret; nobody when none are and it was this
    /// server; else whoever did (a server that never had them cannot say
    /// they are gone). Only a shared store records it.
    pub fn holder_of(&self, current: Option<String>, session: &Values) -> Option<String> {
        if !self.store.shared() {
            return None;
        }
        if session.values().any(ParamValue::is_secret) {
            Some(self.instance.to_string())
        } else if current.as_deref() == Some(&*self.instance) {
            None
        } else {
            current
        }
    }

    /// This server forgot a session's secret values: the record stops
    /// naming it as their holder, in the background (a stale holder only
    /// costs a forwarded request, which that server answers with 409
    /// `params_required`, as this one would).
    fn release_holder(&self, id: &str) {
        if !self.store.shared() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, live, instance) =
            (self.store.clone(), self.live.clone(), self.instance.clone());
        let id = id.to_string();
        rt.spawn(async move {
            for _ in 0..3 {
                let Ok(Some(mut rec)) = store.get(&id).await else {
                    return;
                };
                // Given again meanwhile, or held elsewhere now.
                if rec.holder.as_deref() != Some(&*instance) || !names(&live, &id).is_empty() {
                    return;
                }
                rec.holder = None;
                rec.version += 1;
                match store.update(&mut rec).await {
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => {
                        tracing::warn!(session = %id, "cannot clear the holder of its secret values: {e}");
                        return;
                    }
                    Ok(()) => return,
                }
            }
        });
    }

    /// Where a request on the session `rec` is (as read) that needs what
    /// lives only in a server's memory goes instead of here: the live
    /// server running its run, or else the one holding its secret values,
    /// when that is another server. `None`: serve it here (a store of one
    /// server's own, nobody else, or a server not beating within the
    /// lease, whose memory is as good as gone). Reads the store only for
    /// the other server's heartbeat, at most once a heartbeat.
    pub async fn held_elsewhere(&self, rec: &SessionRecord) -> Option<Elsewhere> {
        if !self.store.shared() {
            return None;
        }
        let other = if rec.status == SessionStatus::Running {
            rec.runner.as_ref()
        } else {
            rec.holder.as_ref()
        };
        let other = other.filter(|o| ***o != *self.instance)?;
        let peer = self.peer(other).await?;
        Some(Elsewhere {
            instance: other.clone(),
            address: peer.address?,
        })
    }

    /// Once server `instance` is no longer beating within the lease
    /// (looked at once a heartbeat): a request sent to it that is not
    /// answered by then will not be.
    pub async fn lapsed(&self, instance: &str) {
        loop {
            tokio::time::sleep(self.lease.heartbeat).await;
            if self.peer(instance).await.is_none() {
                return;
            }
        }
    }

    /// Whether this server has what a request on session `id` could need
    /// of memory: it runs the session's run, or holds secret values of it
    /// (read without the store).
    pub fn holds_here(&self, id: &str) -> bool {
        self.live
            .peek(id)
            .is_some_and(|live| live.running() || live.holds_secrets())
    }

    /// Server `instance`'s last heartbeat, if it is within the lease. A
    /// heartbeat read less than a beat ago is not read again (every request
    /// forwarded to a server would read it): one that has not lapsed can
    /// only be older than the stored one, so it answers as a fresh read
    /// would, but for a server that stopped since, whose requests then fall
    /// back to being served here, as for one that cannot be reached.
    async fn peer(&self, instance: &str) -> Option<Peer> {
        let alive = |p: &Peer| !lease::lapsed(self.lease.lease, p.at, self.clock.now_ms());
        let cached = lock(&self.peers)
            .get(instance)
            .filter(|(p, read)| read.elapsed() < self.lease.heartbeat && alive(p))
            .map(|(p, _)| p.clone());
        if let Some(peer) = cached {
            return Some(peer);
        }
        let peer = self.store.peer(instance).await.ok()??;
        let mut peers = lock(&self.peers);
        // Servers come and go (a new instance id each start): keep only
        // those still beating.
        peers.retain(|_, (p, _)| alive(p));
        if !alive(&peer) {
            return None;
        }
        peers.insert(
            instance.to_string(),
            (peer.clone(), tokio::time::Instant::now()),
        );
        Some(peer)
    }
}

fn names(live: &LiveSessions, id: &str) -> Vec<String> {
    live.peek(id).map_or_else(Vec::new, |live| {
        lock(&live.secrets).keys().cloned().collect()
    })
}

/// Another server that holds what a session needs of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Elsewhere {
    /// Its instance id, as its heartbeats name it.
    pub instance: String,
    /// Where it takes forwards (`--advertise-url`).
    pub address: String,
}
