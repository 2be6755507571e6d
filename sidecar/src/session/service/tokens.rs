//! Session tokens: minted at random, kept as SHA-256 digests, compared in
//! constant time, revoked together.

use super::*;

impl Service {
    /// Revoke every session token of session `id`, and end at once the
    /// event streams opened with one, once the store no longer knows the
    /// tokens (a stream that subscribes meanwhile checks its token again
    /// after subscribing). The owner's streams stay open.
    pub async fn revoke_tokens(&self, id: &str) -> Result<(), ServiceError> {
        self.record(id).await?;
        let r = async {
            let live = self.live.entry(id);
            let _guard = live.lock.lock().await;
            let mut rec = self.record(id).await?;
            rec.security.token_digests.clear();
            rec.version += 1;
            rec.updated_at = self.now_ms();
            self.store.update(&mut rec).await?;
            let ended = live.events.end_token_streams();
            if ended > 0 {
                tracing::info!(
                    session = id,
                    streams = ended,
                    "session tokens revoked: their event streams were ended"
                );
            }
            Ok(())
        }
        .await;
        self.live.evict_if_idle(id);
        r
    }

    /// End the event streams opened with a session token of session `id`
    /// that this server serves (its tokens were revoked through another
    /// server, which ended its own).
    pub fn end_token_streams(&self, id: &str) {
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
    pub async fn token_matches(&self, id: &str, token: &str) -> bool {
        match self.store.get(id).await {
            Ok(Some(rec)) => self.token_in(&rec, token),
            _ => false,
        }
    }

    /// Whether `token` is a live session token of the session `rec` is
    /// (as read: a caller that read the record already asks this).
    pub fn token_in(&self, rec: &SessionRecord, token: &str) -> bool {
        let digest = token_digest(token);
        rec.security
            .token_digests
            .iter()
            .any(|d| constant_time_eq(d.as_bytes(), digest.as_bytes()))
    }
}

/// SHA-256 of a session token, as stored.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub(super) fn new_token() -> Result<String, ServiceError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        tracing::error!("no randomness for a session token: {e}");
        ServiceError::new(
            ErrorKind::Internal,
            "internal",
            "cannot mint a session token",
        )
    })?;
    Ok(format!("st_{}", hex::encode(bytes)))
}
