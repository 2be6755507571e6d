//! Secret session values: held in this process's memory only, for as long
//! as the session is live, and which server holds them (so a request
//! elsewhere can be sent here).

use super::*;

impl Service {
    /// The session-scope values a session holds now: stored ones and the
    /// secrets in memory.
    pub(super) fn session_values(&self, rec: &SessionRecord) -> Values {
        let mut values: Values = rec
            .params
            .as_map()
            .iter()
            .map(|(k, v)| (k.clone(), ParamValue::Plain(v.clone())))
            .collect();
        if let Some(live) = self.peek(&rec.id) {
            live.touch();
            let secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            values.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        values
    }

    /// Names of the secret values a session holds (never the values).
    pub fn secret_names(&self, id: &str) -> Vec<String> {
        self.peek(id).map_or_else(Vec::new, |live| {
            let secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            secrets.keys().cloned().collect()
        })
    }

    pub(super) fn keep_secrets(&self, id: &str, session: &Values) {
        let kept: Values = session
            .iter()
            .filter(|(_, v)| v.is_secret())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let live = match self.peek(id) {
            Some(live) => live,
            None if kept.is_empty() => return,
            None => self.live(id),
        };
        live.secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(kept);
        live.touch();
        self.evict_past_limit();
    }

    /// Forget the secret values of every session idle for longer than
    /// `live_session_ttl` (no run, nothing set or used since): a later
    /// message answers `params_required`, as after a restart. Returns how
    /// many sessions lost theirs.
    pub fn expire_secrets(&self) -> usize {
        let Some(ttl) = self.cfg.live_session_ttl else {
            return 0;
        };
        let entries: Vec<(String, Arc<Live>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut expired = 0;
        for (id, live) in entries {
            let idle = live.run.lock().unwrap_or_else(|p| p.into_inner()).is_none()
                && live
                    .used
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed()
                    >= ttl;
            let mut secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            if idle && !secrets.is_empty() {
                secrets.clear();
                self.release_holder(&id);
                expired += 1;
                tracing::info!(session = %id, "idle session: its secret values were forgotten");
            }
            drop(secrets);
            drop(live);
            self.evict_if_idle(&id);
        }
        expired
    }

    /// Give back what sessions that went held and left behind: the live
    /// map's room for them (a map never shrinks by itself) and the store's
    /// cache. Called after a sweep that forgot many.
    pub async fn release_memory(&self) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shrink_to_fit();
        self.store.release_memory().await;
    }

    /// Drop a session's secret values from memory (a one-shot run's, once
    /// it has ended); a later run needs them supplied again.
    pub fn forget_secrets(&self, id: &str) {
        if let Some(live) = self.peek(id) {
            let mut secrets = live.secrets.lock().unwrap_or_else(|p| p.into_inner());
            if !secrets.is_empty() {
                secrets.clear();
                self.release_holder(id);
            }
        }
        self.evict_if_idle(id);
    }

    /// Who holds a session's secret values once it has `session`: this
    /// server when some are secret; nobody when none are and it was this
    /// server; else whoever did (a server that never had them cannot say
    /// they are gone). Only a shared store records it.
    pub(super) fn holder_of(&self, current: Option<String>, session: &Values) -> Option<String> {
        if !self.store.shared() {
            return None;
        }
        if session.values().any(ParamValue::is_secret) {
            Some(self.instance.clone())
        } else if current.as_deref() == Some(self.instance.as_str()) {
            None
        } else {
            current
        }
    }

    /// This server forgot a session's secret values: the record stops
    /// naming it as their holder, in the background (a stale holder only
    /// costs a forwarded request, which that server answers with 409
    /// `params_required`, as this one would).
    pub(super) fn release_holder(&self, id: &str) {
        if !self.store.shared() {
            return;
        }
        let (Some(this), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let id = id.to_string();
        rt.spawn(async move {
            for _ in 0..3 {
                let Ok(Some(mut rec)) = this.store.get(&id).await else {
                    return;
                };
                // Given again meanwhile, or held elsewhere now.
                if rec.holder.as_deref() != Some(this.instance.as_str())
                    || !this.secret_names(&id).is_empty()
                {
                    return;
                }
                rec.holder = None;
                rec.version += 1;
                match this.store.update(&mut rec).await {
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
        let other = other.filter(|o| **o != self.instance)?;
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
            tokio::time::sleep(self.cfg.lease.heartbeat).await;
            if self.peer(instance).await.is_none() {
                return;
            }
        }
    }

    /// Whether this server has what a request on session `id` could need
    /// of memory: it runs the session's run, or holds secret values of it
    /// (read without the store).
    pub fn holds_here(&self, id: &str) -> bool {
        self.peek(id).is_some_and(|live| {
            live.run.lock().unwrap_or_else(|p| p.into_inner()).is_some()
                || !live
                    .secrets
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
        })
    }

    /// End the event streams opened with a session token of session `id`
    /// that this server serves (its tokens were revoked through another
    /// server, which ended its own).
    pub fn end_token_streams(&self, id: &str) {
        if let Some(live) = self.peek(id) {
            let ended = live.events.end_token_streams();
            if ended > 0 {
                tracing::info!(
                    session = id,
                    streams = ended,
                    "session tokens revoked on another server: the event streams served here were ended"
                );
            }
        }
        self.evict_if_idle(id);
    }

    /// Server `instance`'s last heartbeat, if it is within the lease. A
    /// heartbeat read less than a beat ago is not read again (every request
    /// forwarded to a server would read it): one that has not lapsed can
    /// only be older than the stored one, so it answers as a fresh read
    /// would, but for a server that stopped since, whose requests then fall
    /// back to being served here, as for one that cannot be reached.
    async fn peer(&self, instance: &str) -> Option<Peer> {
        let alive = |p: &Peer| !lease::lapsed(self.cfg.lease.lease, p.at, self.now_ms());
        let cached = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(instance)
            .filter(|(p, read)| read.elapsed() < self.cfg.lease.heartbeat && alive(p))
            .map(|(p, _)| p.clone());
        if let Some(peer) = cached {
            return Some(peer);
        }
        let peer = self.store.peer(instance).await.ok()??;
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
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

/// Another server that holds what a session needs of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Elsewhere {
    /// Its instance id, as its heartbeats name it.
    pub instance: String,
    /// Where it takes forwards (`--advertise-url`).
    pub address: String,
}
