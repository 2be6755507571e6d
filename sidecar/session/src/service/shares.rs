//! Share links: a session handed to someone else, read-only or read-write,
//! revocable one by one, naming who shared it.
//!
//! A share's token (`bsh_…`, 32 random bytes) is shown once, when it is
//! made; the session's record keeps its SHA-256 digest only, compared in
//! constant time. A write share may do what a session token may (read,
//! post messages, cancel), a read share only read (the view, its events,
//! its pending items); neither answers, shares or sets anything. The
//! streams opened with a share are tagged with its id, so revoking it ends
//! those and no other.

use std::sync::Arc;

use crate::error::{Code, ErrorKind, ServiceError};
use crate::state::audit::{actor, AuditLog};
use crate::state::live_sessions::LiveSessions;
use crate::validate::{Caller, ShareHolder};
use bindery_params::secret::constant_time_eq;
use bindery_store::audit::Action;
use bindery_store::clock::Clock;
use bindery_store::model::{SessionRecord, Share, ShareMode};
use bindery_store::SessionStore;

use super::tokens::token_digest;

/// At most this many live shares per session; one more is refused (409).
pub const MAX_LIVE_SHARES: usize = 50;
/// A share's note is at most this many characters.
pub const MAX_NOTE_CHARS: usize = 200;
/// Revoked shares listed per session (the newest); older ones are
/// forgotten, so a session's record stays small however often it is
/// shared.
pub const REVOKED_KEPT: usize = 50;

/// What a new share is to be.
#[derive(Clone, Debug)]
pub struct NewShare {
    pub mode: ShareMode,
    pub note: Option<String>,
}

/// A share just made: as stored, and its token, this once.
#[derive(Debug)]
pub struct Shared {
    pub share: Share,
    pub token: String,
    /// The chat page's URL that opens the session with the token in its
    /// fragment (relative without a public URL).
    pub link: String,
}

/// The share links of the sessions in the store, and the event streams
/// this server serves with them.
pub struct Shares {
    store: Arc<dyn SessionStore>,
    live: Arc<LiveSessions>,
    clock: Arc<dyn Clock>,
    audit: Arc<AuditLog>,
    /// Where people reach this server: the base of a share's link.
    public_url: Option<String>,
    /// Tells every replica's streams of a revocation.
    recorder: Arc<crate::state::recorder::Recorder>,
}

impl Shares {
    pub(super) fn new(
        store: Arc<dyn SessionStore>,
        live: Arc<LiveSessions>,
        clock: Arc<dyn Clock>,
        audit: Arc<AuditLog>,
        public_url: Option<String>,
        recorder: Arc<crate::state::recorder::Recorder>,
    ) -> Shares {
        Shares {
            store,
            live,
            clock,
            audit,
            public_url,
            recorder,
        }
    }

    /// Share session `id` as `req` says, `by` its owner or its end user
    /// (the API's door let only them in). On record before it exists.
    pub async fn share(
        &self,
        by: &Caller,
        id: &str,
        req: NewShare,
    ) -> Result<Shared, ServiceError> {
        let shared_by = sharer(by)?;
        let note = checked_note(req.note)?;
        crate::state::stored_session(&*self.store, id).await?;
        let live = self.live.entry(id);
        let r = async {
            let _guard = live.lock.lock().await;
            let mut rec = crate::state::stored_session(&*self.store, id).await?;
            let open = rec.security.shares.iter().filter(|s| s.live()).count();
            if open >= MAX_LIVE_SHARES {
                return Err(ServiceError::new(
                    ErrorKind::Conflict,
                    Code::TooManyShares,
                    format!(
                        "session {id} has {open} live share links, as many as a session may have: revoke one (DELETE /v1/sessions/{id}/shares/SHARE_ID) before sharing again"
                    ),
                ));
            }
            let (share_id, token) = (random("sh_", "a share's id")?, new_token()?);
            self.audit
                .record(
                    actor(by),
                    Some(id),
                    Action::SessionShared {
                        share: share_id.clone(),
                        mode: req.mode.as_str().to_string(),
                    },
                )
                .await?;
            let now = self.clock.now_ms();
            let share = Share {
                id: share_id,
                mode: req.mode,
                digest: token_digest(&token),
                shared_by,
                note,
                created_at: now,
                revoked_at: None,
            };
            rec.security.shares.push(share.clone());
            rec.version += 1;
            rec.updated_at = now;
            self.store.update(&mut rec).await?;
            let link = link(self.public_url.as_deref(), id, &token, req.mode);
            Ok(Shared { share, token, link })
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        r
    }

    /// Session `id`'s shares, live and revoked, oldest first (their
    /// digests are the caller's to leave out).
    pub async fn list(&self, id: &str) -> Result<Vec<Share>, ServiceError> {
        Ok(crate::state::stored_session(&*self.store, id)
            .await?
            .security
            .shares)
    }

    /// Revoke share `share` of session `id`, and end at once the event
    /// streams this server serves with it. Revoking a revoked share
    /// answers it again and records nothing; an unknown one is 404.
    pub async fn revoke(&self, by: &Caller, id: &str, share: &str) -> Result<Share, ServiceError> {
        crate::state::stored_session(&*self.store, id).await?;
        let live = self.live.entry(id);
        let r = async {
            let _guard = live.lock.lock().await;
            let mut rec = crate::state::stored_session(&*self.store, id).await?;
            let Some(i) = rec.security.shares.iter().position(|s| s.id == share) else {
                return Err(ServiceError::not_found(format!(
                    "session {id} has no share {share} (GET /v1/sessions/{id}/shares lists them)"
                )));
            };
            if rec.security.shares[i].live() {
                let revoked = Action::ShareRevoked {
                    share: share.to_string(),
                };
                self.audit.record(actor(by), Some(id), revoked).await?;
                let now = self.clock.now_ms();
                revoke_in(&mut rec.security.shares[i], now);
                let answer = rec.security.shares[i].clone();
                forget_old_revoked(&mut rec.security.shares);
                rec.version += 1;
                rec.updated_at = now;
                self.store.update(&mut rec).await?;
                end_streams(&live.events, id, share);
                // The streams another replica serves with it end as they
                // read this.
                let event = bindery_store::wire::AccessRevoked {
                    session_tokens: false,
                    shares: vec![share.to_string()],
                };
                self.recorder
                    .emit_for(
                        &rec,
                        bindery_store::wire::SessionEvent::AccessRevoked(event),
                    )
                    .await;
                return Ok(answer);
            }
            end_streams(&live.events, id, share);
            Ok(rec.security.shares[i].clone())
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        r
    }

    /// End the event streams of share `share` of session `id` that this
    /// server serves (it was revoked through another server, which ended
    /// its own).
    pub fn end_streams(&self, id: &str, share: &str) {
        if let Some(live) = self.live.peek(id) {
            end_streams(&live.events, id, share);
        }
        self.live.evict_if_idle(id);
    }

    /// The holder of `token`, a live share of session `id`, if it is one.
    pub async fn holder(&self, id: &str, token: &str) -> Option<ShareHolder> {
        match self.store.get(id).await {
            Ok(Some(rec)) => share_in(&rec, token),
            _ => None,
        }
    }

    /// Whether share `share` of session `id` is live, in what mode.
    pub async fn live_mode(&self, id: &str, share: &str) -> Option<ShareMode> {
        match self.store.get(id).await {
            Ok(Some(rec)) => rec.security.live_share(share).map(|s| s.mode),
            _ => None,
        }
    }
}

fn end_streams(events: &crate::fanout::Fanout, id: &str, share: &str) {
    let ended = events.end_share_streams(share);
    if ended > 0 {
        tracing::info!(
            session = id,
            share,
            streams = ended,
            "a share was revoked: the event streams opened with it were ended"
        );
    }
}

/// Who shares, as a share names them: the owner, or the end user by
/// subject. A session token or a share never shares.
fn sharer(by: &Caller) -> Result<String, ServiceError> {
    match by {
        Caller::Owner => Ok("owner".to_string()),
        Caller::EndUser(person) => Ok(format!("user:{}", person.subject)),
        Caller::SessionToken(_) | Caller::Share(_) | Caller::Approver => Err(
            ServiceError::forbidden("only the session's owner or its end user may share it"),
        ),
    }
}

/// A note as kept: at most [`MAX_NOTE_CHARS`] characters, no control
/// character (it is shown in lists and terminals); empty is none.
fn checked_note(note: Option<String>) -> Result<Option<String>, ServiceError> {
    let Some(note) = note.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let chars = note.chars().count();
    if chars > MAX_NOTE_CHARS {
        return Err(ServiceError::bad_request(format!(
            "`note` is {chars} characters; at most {MAX_NOTE_CHARS}"
        )));
    }
    if note.chars().any(char::is_control) {
        return Err(ServiceError::bad_request(
            "`note` holds a control character (a line break, a tab, an escape): give one line of text",
        ));
    }
    Ok(Some(note))
}

/// The holder of `token`, a live share of the session `rec` is (as read).
pub fn share_in(rec: &SessionRecord, token: &str) -> Option<ShareHolder> {
    let digest = token_digest(token);
    rec.security
        .shares
        .iter()
        .filter(|s| s.live() && !s.digest.is_empty())
        .find(|s| constant_time_eq(s.digest.as_bytes(), digest.as_bytes()))
        .map(|s| ShareHolder {
            session: rec.id.clone(),
            share: s.id.clone(),
            mode: s.mode,
        })
}

/// `share` revoked at `now`: its digest goes, so no token matches it again.
fn revoke_in(share: &mut Share, now: i64) {
    share.revoked_at = Some(now);
    share.digest.clear();
}

/// Revoke every live share of `rec` at `now` (the session's tokens were
/// revoked); their ids.
pub(super) fn revoke_all_in(rec: &mut SessionRecord, now: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for share in rec.security.shares.iter_mut().filter(|s| s.live()) {
        revoke_in(share, now);
        ids.push(share.id.clone());
    }
    forget_old_revoked(&mut rec.security.shares);
    ids
}

/// Keep the newest [`REVOKED_KEPT`] revoked shares, and every live one.
fn forget_old_revoked(shares: &mut Vec<Share>) {
    let mut revoked: Vec<(i64, usize)> = shares
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.revoked_at.map(|at| (at, i)))
        .collect();
    let over = revoked.len().saturating_sub(REVOKED_KEPT);
    if over == 0 {
        return;
    }
    // Oldest first, then in list order.
    revoked.sort_unstable();
    let forgotten: std::collections::BTreeSet<usize> =
        revoked[..over].iter().map(|(_, i)| *i).collect();
    let mut i = 0;
    shares.retain(|_| {
        let keep = !forgotten.contains(&i);
        i += 1;
        keep
    });
}

/// The chat page opening session `id` with `token`, in the fragment (which
/// a browser never sends to the server).
fn link(base: Option<&str>, id: &str, token: &str, mode: ShareMode) -> String {
    let base = base.unwrap_or_default().trim_end_matches('/');
    format!("{base}/#session={id}&token={token}&mode={}", mode.as_str())
}

fn random(prefix: &str, what: &'static str) -> Result<String, ServiceError> {
    let hex = match prefix {
        "sh_" => bindery_params::random::hex::<8>(what),
        _ => bindery_params::random::hex::<32>(what),
    }
    .map_err(|e| {
        tracing::error!("{e}");
        ServiceError::new(
            ErrorKind::Internal,
            Code::Internal,
            format!("cannot mint {what}"),
        )
    })?;
    Ok(format!("{prefix}{hex}"))
}

/// A share's token: `bsh_` and 32 random bytes in hex.
fn new_token() -> Result<String, ServiceError> {
    random("bsh_", "a share's token")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_store::contract::record;

    fn share(id: &str, token: &str, mode: ShareMode) -> Share {
        Share {
            id: id.into(),
            mode,
            digest: token_digest(token),
            shared_by: "owner".into(),
            note: None,
            created_at: 1,
            revoked_at: None,
        }
    }

    #[test]
    fn a_token_finds_its_live_share_only() {
        let token = new_token().unwrap();
        assert!(
            token.starts_with("bsh_") && token.len() == 4 + 64,
            "{token}"
        );
        assert_ne!(new_token().unwrap(), token, "tokens are random");
        let id = random("sh_", "an id").unwrap();
        assert!(id.starts_with("sh_") && id.len() == 3 + 16, "{id}");
        let mut rec = record("s", 1);
        assert_eq!(share_in(&rec, &token), None);
        rec.security
            .shares
            .push(share("sh_r", "bsh_other", ShareMode::Read));
        rec.security
            .shares
            .push(share("sh_w", &token, ShareMode::Write));
        let holder = share_in(&rec, &token).unwrap();
        assert_eq!(
            holder,
            ShareHolder {
                session: "s".into(),
                share: "sh_w".into(),
                mode: ShareMode::Write
            }
        );
        assert_eq!(share_in(&rec, "bsh_other").unwrap().mode, ShareMode::Read);
        assert_eq!(share_in(&rec, &token[..token.len() - 1]), None);
        assert_eq!(
            share_in(&rec, &token_digest(&token)),
            None,
            "the digest is no token"
        );
        assert_eq!(share_in(&rec, ""), None);
        revoke_in(&mut rec.security.shares[1], 5);
        assert_eq!(share_in(&rec, &token), None, "revoked");
        assert!(rec.security.shares[1].digest.is_empty());
        assert_eq!(revoke_all_in(&mut rec, 6), vec!["sh_r".to_string()]);
        assert_eq!(share_in(&rec, "bsh_other"), None);
        assert_eq!(
            rec.security.shares[1].revoked_at,
            Some(5),
            "kept as revoked"
        );
    }

    #[test]
    fn only_the_owner_and_the_end_user_share_and_a_note_is_one_short_line() {
        assert_eq!(sharer(&Caller::Owner).unwrap(), "owner");
        let alice = bindery_identity::Person::named(
            bindery_identity::Subject::new("alice@example.com").unwrap(),
        );
        assert_eq!(
            sharer(&Caller::EndUser(alice)).unwrap(),
            "user:alice@example.com"
        );
        assert!(sharer(&Caller::SessionToken("s".into())).is_err());
        assert!(sharer(&Caller::Approver).is_err());
        assert_eq!(checked_note(None).unwrap(), None);
        assert_eq!(checked_note(Some(String::new())).unwrap(), None);
        let most = "é".repeat(MAX_NOTE_CHARS);
        assert_eq!(checked_note(Some(most.clone())).unwrap(), Some(most));
        let e = checked_note(Some("x".repeat(MAX_NOTE_CHARS + 1))).unwrap_err();
        assert!(e.message.contains("201 characters"), "{}", e.message);
        assert!(checked_note(Some("a\nb".into())).is_err());
    }

    #[test]
    fn the_oldest_revoked_shares_are_forgotten_past_the_limit_and_live_ones_never() {
        let mut shares: Vec<Share> = (0..REVOKED_KEPT + 3)
            .map(|i| {
                let mut s = share(&format!("sh_{i}"), "t", ShareMode::Read);
                revoke_in(&mut s, i as i64);
                s
            })
            .collect();
        shares.insert(0, share("sh_live", "t", ShareMode::Write));
        forget_old_revoked(&mut shares);
        assert_eq!(shares.len(), REVOKED_KEPT + 1);
        assert_eq!(shares[0].id, "sh_live");
        assert_eq!(shares[1].id, "sh_3", "sh_0 to sh_2 were the oldest");
        // At the limit nothing goes.
        let before = shares.clone();
        forget_old_revoked(&mut shares);
        assert_eq!(shares, before);
    }

    #[test]
    fn a_link_opens_the_chat_page_with_the_token_in_its_fragment() {
        assert_eq!(
            link(None, "s1", "bsh_ab", ShareMode::Read),
            "/#session=s1&token=bsh_ab&mode=read"
        );
        assert_eq!(
            link(
                Some("https://chat.example.com/"),
                "s1",
                "bsh_ab",
                ShareMode::Write
            ),
            "https://chat.example.com/#session=s1&token=bsh_ab&mode=write"
        );
    }
}
