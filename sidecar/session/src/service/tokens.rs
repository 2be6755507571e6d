//! Session tokens: minted at random, kept as SHA-256 digests, compared in
//! constant time, revoked together.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{Code, ErrorKind, ServiceError};
use crate::state::audit::{actor, AuditLog};
use crate::state::live_sessions::LiveSessions;
use crate::validate::Caller;
use bindery_params::secret::constant_time_eq;
use bindery_store::audit::Action;
use bindery_store::clock::Clock;
use bindery_store::model::SessionRecord;
use bindery_store::SessionStore;

/// The session tokens of the sessions in the store, and the event streams
/// this server serves with them.
pub struct Tokens {
    store: Arc<dyn SessionStore>,
    live: Arc<LiveSessions>,
    clock: Arc<dyn Clock>,
    audit: Arc<AuditLog>,
    /// Tells every replica's streams of a revocation.
    recorder: Arc<crate::state::recorder::Recorder>,
}

impl Tokens {
    pub(super) fn new(
        store: Arc<dyn SessionStore>,
        live: Arc<LiveSessions>,
        clock: Arc<dyn Clock>,
        audit: Arc<AuditLog>,
        recorder: Arc<crate::state::recorder::Recorder>,
    ) -> Tokens {
        Tokens {
            store,
            live,
            clock,
            audit,
            recorder,
        }
    }

    /// Revoke every session token of session `id`, and every share link of
    /// it, and end at once the event streams opened with one, once the
    /// store no longer knows them (a stream that subscribes meanwhile
    /// checks its token again after subscribing). The owner's streams stay
    /// open. Each share's revocation is on record, then the tokens'.
    pub async fn revoke(&self, by: &Caller, id: &str) -> Result<(), ServiceError> {
        crate::state::stored_session(&*self.store, id).await?;
        let live = self.live.entry(id);
        let r = async {
            let _guard = live.lock.lock().await;
            let mut rec = crate::state::stored_session(&*self.store, id).await?;
            let now = self.clock.now_ms();
            for share in super::shares::revoke_all_in(&mut rec, now) {
                let revoked = Action::ShareRevoked { share };
                self.audit.record(actor(by), Some(id), revoked).await?;
            }
            let revoked = Action::SessionTokenRevoked {};
            self.audit.record(actor(by), Some(id), revoked).await?;
            rec.security.token_digests.clear();
            rec.version += 1;
            rec.updated_at = now;
            self.store.update(&mut rec).await?;
            let ended = live.events.end_token_streams();
            if ended > 0 {
                tracing::info!(
                    session = id,
                    streams = ended,
                    "session tokens revoked: their event streams were ended"
                );
            }
            // The streams another replica serves with them end as they
            // read this.
            let event = bindery_store::wire::AccessRevoked {
                session_tokens: true,
                shares: Vec::new(),
            };
            self.recorder
                .emit_for(
                    &rec,
                    bindery_store::wire::SessionEvent::AccessRevoked(event),
                )
                .await;
            Ok(())
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        r
    }

    /// End the event streams opened with a session token or a share of
    /// session `id` that this server serves (its tokens were revoked
    /// through another server, which ended its own).
    pub fn end_streams(&self, id: &str) {
        if let Some(live) = self.live.peek(id) {
            let ended = live.events.end_token_streams();
            if ended > 0 {
                tracing::info!(
                    session = id,
                    streams = ended,
                    "session tokens revoked on another server: the event streams served here were ended"
                );
            }
        }
        self.live.evict_if_idle(id);
    }

    /// Whether `token` is a live session token of session `id`.
    pub async fn matches(&self, id: &str, token: &str) -> bool {
        match self.store.get(id).await {
            Ok(Some(rec)) => token_in(&rec, token),
            _ => false,
        }
    }
}

/// Whether `token` is a live session token of the session `rec` is (as
/// read: a caller that read the record already asks this).
pub fn token_in(rec: &SessionRecord, token: &str) -> bool {
    let digest = token_digest(token);
    rec.security
        .token_digests
        .iter()
        .any(|d| constant_time_eq(d.as_bytes(), digest.as_bytes()))
}

/// SHA-256 of a session token, as stored.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub(super) fn new_token() -> Result<String, ServiceError> {
    let token = bindery_params::random::hex::<32>("a session token").map_err(|e| {
        tracing::error!("{e}");
        ServiceError::new(
            ErrorKind::Internal,
            Code::Internal,
            "cannot mint a session token",
        )
    })?;
    Ok(format!("st_{token}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_store::contract::record;

    #[test]
    fn a_token_matches_only_its_own_digest() {
        let token = new_token().unwrap();
        assert!(token.starts_with("st_") && token.len() == 3 + 64, "{token}");
        assert_ne!(new_token().unwrap(), token, "tokens are random");
        let mut rec = record("s", 1);
        assert!(!token_in(&rec, &token), "no digest, no match");
        rec.security.token_digests.push(token_digest(&token));
        assert!(token_in(&rec, &token));
        assert!(!token_in(&rec, &token[..token.len() - 1]));
        assert!(
            !token_in(&rec, &token_digest(&token)),
            "the digest is not a token"
        );
        assert!(!token_in(&rec, ""));
    }
}
