//! Who is calling, and whether they may come through a route's door.
//!
//! A handler says who may call it in its signature: it takes an
//! [`Authed<D>`], an axum extractor whose door `D` is one of the marker
//! types of [`door`]. The extractor finds the session the route is about
//! in its path (`{id}`, or the session a `{token}` continuation token
//! names), learns who the credentials are ([`Identity`]: the owner, the
//! approver, a session token or a share link of that session, or a caller
//! a replica's signed forward vouches for) and lets them in by the door's [`Rule`],
//! or refuses with the API's 401 or 403. `/mcp` has its own extractor
//! (`api/mcp`'s `Who`), built on the same [`Identity`].
//!
//! Learning who a session token belongs to reads the session: on a shared
//! store the forwarding layer (`api/holder.rs`) has read it already, and
//! leaves what it found ([`Identified`]) for the extractor, which then
//! reads nothing.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::HeaderMap;

use super::state::AppState;
pub use crate::owner_token::OwnerToken;
use bindery_session::error::{Code, ErrorKind, ServiceError};
use bindery_session::service::Service;
use bindery_session::validate::{Caller, ShareHolder};
use bindery_store::model::{SessionRecord, ShareMode};

/// What a door lets a session-token holder and the approver do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Owner only.
    OwnerOnly,
    /// Read the session, post a message, read its events, cancel a run:
    /// the owner, the session's end user, a session token or a write share.
    SessionToken,
    /// Read the session and its events: as [`Rule::SessionToken`], and a
    /// read share too.
    Read,
    /// Pending approvals and their answers: the owner, the approver, and a
    /// session token of the session the route names (which may read
    /// pending items but never answers one), or the end user it belongs to.
    Approvals,
    /// The owner, or an end user: on a route about a session, the end
    /// user it belongs to; elsewhere, for what is theirs (their sessions,
    /// the agents they may start).
    OwnerOrEndUser,
}

/// A door: a marker type that names the [`Rule`] of the handlers that
/// take an [`Authed`] of it.
pub trait Door: Send + Sync + 'static {
    const RULE: Rule;
}

/// The doors, one marker type each.
pub mod door {
    use super::{Door, Rule};

    /// The owner token only (`security(("ownerToken" = []))`).
    pub struct Owner;
    /// The owner, or a session token or a write share of the session in
    /// the path (`security(("ownerToken" = []), ("sessionToken" = []),
    /// ("shareToken" = []))`).
    pub struct OwnerOrSessionToken;
    /// The same, and a read share: the routes that read a session.
    pub struct Reader;
    /// The owner or the approver (`security(("ownerToken" = []),
    /// ("approverToken" = []))`); a session token of the session the
    /// route names is let in to be refused what it may not do.
    pub struct Approvals;
    /// The owner, or an end user's identity token
    /// (`security(("ownerToken" = []), ("identityToken" = []))`).
    pub struct OwnerOrEndUser;

    impl Door for Owner {
        const RULE: Rule = Rule::OwnerOnly;
    }
    impl Door for OwnerOrSessionToken {
        const RULE: Rule = Rule::SessionToken;
    }
    impl Door for Reader {
        const RULE: Rule = Rule::Read;
    }
    impl Door for Approvals {
        const RULE: Rule = Rule::Approvals;
    }
    impl Door for OwnerOrEndUser {
        const RULE: Rule = Rule::OwnerOrEndUser;
    }
}

pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

pub fn unauthorized(msg: &str) -> ServiceError {
    ServiceError::new(ErrorKind::Unauthorized, Code::Unauthorized, msg)
}

fn not_valid_here() -> ServiceError {
    unauthorized("the token is not valid here")
}

fn approver_only() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        Code::Forbidden,
        "an approver token lists pending approvals (GET /v1/approvals) and answers them (POST /v1/continuations/:token); nothing else",
    )
}

fn end_user_only() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        Code::Forbidden,
        "an end user creates, lists, reads, messages, forks and cancels their own sessions; this route is the owner's",
    )
}

fn share_only(holder: &ShareHolder) -> ServiceError {
    ServiceError::new(ErrorKind::Forbidden, Code::Forbidden, holder.may())
}

fn session_token_only() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        Code::Forbidden,
        "a session token can read the session and its events, post messages and cancel a run; nothing else",
    )
}

/// Who a request's credentials are on a route about one session (or
/// none), before any door: what a replica may forward on their behalf.
#[derive(Clone, Debug, PartialEq)]
pub enum Identity {
    /// The owner token, or a forward vouching for the owner.
    Owner,
    /// The approver token, or a forward vouching for the approver.
    Approver,
    /// A live session token of the session the route is about, or a
    /// forward vouching for one on that session's route.
    Session(String),
    /// A live share link of the session the route is about, or a forward
    /// vouching for one (still live) on that session's route.
    Share(ShareHolder),
    /// An end user's identity token, verified (or a forward vouching for
    /// one); on a route about a session (`on_session`), one of theirs.
    EndUser {
        person: bindery_identity::Person,
        on_session: bool,
    },
    /// No `Authorization: Bearer`.
    Anonymous,
    /// Credentials that are nothing here (a token of another session, an
    /// unknown one, a forward whose caller is not one), and what to say.
    Refused(ServiceError),
}

impl Identity {
    /// The caller a replica forwards this request for, if any.
    pub fn caller(&self) -> Option<Caller> {
        match self {
            Identity::Owner => Some(Caller::Owner),
            Identity::Approver => Some(Caller::Approver),
            Identity::Session(id) => Some(Caller::SessionToken(id.clone())),
            Identity::Share(holder) => Some(Caller::Share(holder.clone())),
            Identity::EndUser { person, .. } => Some(Caller::EndUser(person.clone())),
            Identity::Anonymous | Identity::Refused(_) => None,
        }
    }
}

impl Rule {
    /// `who` let in through this door, or refused as the API refuses.
    pub fn admit(self, who: Identity) -> Result<Caller, ServiceError> {
        match who {
            Identity::Owner => Ok(Caller::Owner),
            Identity::Approver if self == Rule::Approvals => Ok(Caller::Approver),
            Identity::Approver => Err(approver_only()),
            Identity::Session(_) if matches!(self, Rule::OwnerOnly | Rule::OwnerOrEndUser) => {
                Err(session_token_only())
            }
            Identity::Share(holder) => match (self, holder.mode) {
                // A share answers nothing: the continuation route lets it
                // in for the service to refuse, as it refuses a session
                // token on every path that answers.
                (Rule::Read | Rule::Approvals, _) | (Rule::SessionToken, ShareMode::Write) => {
                    Ok(Caller::Share(holder))
                }
                _ => Err(share_only(&holder)),
            },
            Identity::EndUser { person, on_session } => match self {
                Rule::OwnerOnly => Err(end_user_only()),
                // The list of pending approvals is the approver's; an end
                // user answers an item of their own session only.
                Rule::Approvals if !on_session => Err(end_user_only()),
                Rule::SessionToken | Rule::Read | Rule::Approvals | Rule::OwnerOrEndUser => {
                    Ok(Caller::EndUser(person))
                }
            },
            Identity::Session(id) => Ok(Caller::SessionToken(id)),
            Identity::Anonymous => Err(unauthorized("send `Authorization: Bearer <token>`")),
            Identity::Refused(e) => Err(e),
        }
    }
}

/// Where a session token is checked: the store, or a record read already
/// (`None`: there is no such session).
#[derive(Clone, Copy)]
pub enum TokenCheck<'a> {
    Store,
    Read(Option<&'a SessionRecord>),
}

/// The tokens the server takes besides session tokens.
pub struct Tokens<'a> {
    pub owner: &'a OwnerToken,
    pub approver: Option<&'a OwnerToken>,
    /// Who verifies end users' identity tokens, when the server takes them.
    pub identity: Option<&'a bindery_identity::Verifier>,
}

/// Who `headers` say the caller is, on a route about `session` (when it
/// names one).
pub async fn identify(
    headers: &HeaderMap,
    tokens: Tokens<'_>,
    service: &Service,
    session: Option<&str>,
    check: TokenCheck<'_>,
) -> Identity {
    // Forwarded by a replica, which checked the client's own credentials
    // (its signature was checked in front of the route).
    if let Some(vouched) = super::peers::vouched(headers) {
        return match vouched {
            Err(e) => Identity::Refused(e),
            Ok(Caller::Owner) => Identity::Owner,
            Ok(Caller::Approver) => Identity::Approver,
            Ok(Caller::SessionToken(id)) if session == Some(id.as_str()) => Identity::Session(id),
            Ok(Caller::SessionToken(_)) => Identity::Refused(not_valid_here()),
            // Checked again here: a share revoked since the forward left
            // is refused, and a stream re-checks it after subscribing.
            Ok(Caller::Share(holder)) if session == Some(holder.session.as_str()) => {
                let live = match check {
                    TokenCheck::Store => {
                        service
                            .shares()
                            .live_mode(&holder.session, &holder.share)
                            .await
                    }
                    TokenCheck::Read(rec) => rec
                        .filter(|r| r.id == holder.session)
                        .and_then(|r| r.security.live_share(&holder.share))
                        .map(|s| s.mode),
                };
                match live {
                    Some(mode) if mode == holder.mode => Identity::Share(holder),
                    _ => Identity::Refused(not_valid_here()),
                }
            }
            Ok(Caller::Share(_)) => Identity::Refused(not_valid_here()),
            Ok(Caller::EndUser(named)) => {
                let person = match forwarded_person(headers, tokens.identity, named).await {
                    Ok(person) => person,
                    Err(refusal) => return Identity::Refused(refusal),
                };
                end_user(service, person, session, check).await
            }
        };
    }
    let Some(token) = bearer(headers) else {
        return Identity::Anonymous;
    };
    if tokens.owner.matches(token) {
        return Identity::Owner;
    }
    if tokens.approver.is_some_and(|a| a.matches(token)) {
        return Identity::Approver;
    }
    if let Some(verifier) = tokens
        .identity
        .filter(|_| bindery_identity::Verifier::looks_like_jwt(token))
    {
        return match verifier.verify(token).await {
            Ok(user) => end_user(service, user.person(), session, check).await,
            Err(bindery_identity::Refusal::Rejected(why)) => {
                tracing::info!(%why, "an identity token was refused");
                Identity::Refused(unauthorized(&why.to_string()))
            }
            Err(bindery_identity::Refusal::Unavailable(e)) => {
                tracing::warn!("{e}");
                Identity::Refused(ServiceError::new(
                    ErrorKind::Unavailable,
                    Code::IdentityUnavailable,
                    "the identity provider's keys cannot be fetched now, so no identity token can be checked; retry later",
                ))
            }
        };
    }
    // A session token is honoured only on its own session's routes; anywhere
    // else it is as good as no token, so it cannot be used to probe.
    if let (Some(id), true) = (session, token.starts_with("st_")) {
        let live = match check {
            TokenCheck::Store => service.tokens().matches(id, token).await,
            TokenCheck::Read(rec) => {
                rec.is_some_and(|r| r.id == id && bindery_session::service::token_in(r, token))
            }
        };
        if live {
            return Identity::Session(id.to_string());
        }
    }
    // So is a share link.
    if let (Some(id), true) = (session, token.starts_with("bsh_")) {
        let holder = match check {
            TokenCheck::Store => service.shares().holder(id, token).await,
            TokenCheck::Read(rec) => rec
                .filter(|r| r.id == id)
                .and_then(|r| bindery_session::service::share_in(r, token)),
        };
        if let Some(holder) = holder {
            return Identity::Share(holder);
        }
    }
    Identity::Refused(not_valid_here())
}

/// An end user, on a route about `session` (when it names one): let in
/// only to a session of theirs. Another's session, like one that does not
/// exist, is 404: an end user cannot learn which ids are taken.
/// The end user a forward vouches for (`named`: their subject only), with
/// their claims and token again when the forward carries their identity
/// token and it still holds here: so that a run this server starts for
/// them has the values it would have had on the server they reached. A
/// token that no longer holds (it expired on the way) leaves the person
/// without their rights, as on that server; one naming somebody else is
/// refused.
async fn forwarded_person(
    headers: &HeaderMap,
    verifier: Option<&bindery_identity::Verifier>,
    named: bindery_identity::Person,
) -> Result<bindery_identity::Person, ServiceError> {
    let token = headers
        .get(super::peers::IDENTITY_HEADER)
        .and_then(|v| v.to_str().ok());
    let (Some(token), Some(verifier)) = (token, verifier) else {
        return Ok(named);
    };
    match verifier.verify(token).await {
        Ok(user) if user.subject == named.subject => Ok(user.person()),
        Ok(_) => Err(unauthorized(
            "the forward's identity token names another subject than its caller",
        )),
        Err(e) => {
            tracing::info!(
                subject = named.subject.as_str(),
                "a forwarded identity token no longer holds: {e}"
            );
            Ok(named)
        }
    }
}

async fn end_user(
    service: &Service,
    person: bindery_identity::Person,
    session: Option<&str>,
    check: TokenCheck<'_>,
) -> Identity {
    let Some(id) = session else {
        return Identity::EndUser {
            person,
            on_session: false,
        };
    };
    let read;
    let rec = match check {
        TokenCheck::Read(rec) => rec,
        TokenCheck::Store => match service.store().get(id).await {
            Ok(rec) => {
                read = rec;
                read.as_ref()
            }
            Err(e) => return Identity::Refused(e.into()),
        },
    };
    if rec.is_some_and(|r| r.id == id && r.security.subject.as_ref() == Some(&person.subject)) {
        Identity::EndUser {
            person,
            on_session: true,
        }
    } else {
        Identity::Refused(ServiceError::not_found(format!("no session {id}")))
    }
}

/// Who the forwarding layer found a request's caller to be, on its
/// session, when it read the session for it: the extractor takes it
/// instead of reading the session again.
#[derive(Clone, Debug)]
pub struct Identified {
    pub session: Option<String>,
    pub identity: Identity,
}

/// The session a route is about, from its path: `{id}`, or the session a
/// `{token}` continuation token names.
pub fn path_session(params: &RawPathParams) -> Option<String> {
    for (name, value) in params {
        match name {
            "id" => return Some(value.to_string()),
            "token" => return bindery_store::pending::token_session(value).map(str::to_owned),
            _ => {}
        }
    }
    None
}

/// A caller let in through door `D`, on the session the path names.
pub struct Authed<D: Door> {
    pub caller: Caller,
    door: PhantomData<fn() -> D>,
}

impl<D: Door> FromRequestParts<Arc<AppState>> for Authed<D> {
    type Rejection = super::status::ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let session = match RawPathParams::from_request_parts(parts, state).await {
            Ok(params) => path_session(&params),
            Err(_) => None,
        };
        let identity = match parts.extensions.get::<Identified>() {
            Some(found) if found.session == session => found.identity.clone(),
            _ => state.identify(&parts.headers, session.as_deref()).await,
        };
        // An end user's requests count against their rate limit here, on
        // the server whose handler answers them, whatever the door says;
        // so do those made with a session token or a share link of their
        // session (handing it on is no way around the limit).
        if let Some(subject) = rate_limited_as(state, &identity).await {
            super::rate_limit::user(state, subject.as_str())?;
        }
        Ok(Authed {
            caller: D::RULE.admit(identity)?,
            door: PhantomData,
        })
    }
}

/// The end user whose per-user rate limit a request of `identity` counts
/// against: theirs, or that of the session a session token or a share
/// link opens (a session's subject never changes, and is remembered).
async fn rate_limited_as(
    state: &AppState,
    identity: &Identity,
) -> Option<bindery_identity::Subject> {
    let session = match identity {
        Identity::EndUser { person, .. } => return Some(person.subject.clone()),
        _ if state.rates.per_user.is_none() => return None,
        Identity::Session(id) => id,
        Identity::Share(holder) => &holder.session,
        _ => return None,
    };
    state.service.recorder().subject_of(session).await
}

/// Who calls, as the handlers and the forwarding layer ask it of the
/// state they share.
impl AppState {
    /// Who `headers` say the caller is, on a route about `session`,
    /// checking a session token in the store.
    pub(crate) async fn identify(&self, headers: &HeaderMap, session: Option<&str>) -> Identity {
        self.identify_with(headers, session, TokenCheck::Store)
            .await
    }

    /// The same, a session token checked as `check` says.
    pub(crate) async fn identify_with(
        &self,
        headers: &HeaderMap,
        session: Option<&str>,
        check: TokenCheck<'_>,
    ) -> Identity {
        let tokens = Tokens {
            owner: &self.owner,
            approver: self.approver.as_ref(),
            identity: self.identity.as_deref(),
        };
        let identity = identify(headers, tokens, &self.service, session, check).await;
        // The request's span (and so its log lines) names the end user.
        if let Identity::EndUser { person, .. } = &identity {
            tracing::Span::current().record("subject", person.subject.as_str());
        }
        identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<Caller, ServiceError>) -> (u16, &'static str, String) {
        let e = r.unwrap_err();
        (
            super::super::status::of(e.kind).as_u16(),
            e.code.as_str(),
            e.message,
        )
    }

    /// Each door lets in whom it says, and refuses the others as the API
    /// always has (the bodies of `server_api`'s tests).
    #[test]
    fn each_door_admits_whom_it_says() {
        let s = || Identity::Session("s1".into());
        for rule in [Rule::OwnerOnly, Rule::SessionToken, Rule::Approvals] {
            assert_eq!(rule.admit(Identity::Owner).unwrap(), Caller::Owner);
            let (status, code, msg) = refused(rule.admit(Identity::Anonymous));
            assert_eq!((status, code), (401, "unauthorized"));
            assert!(msg.contains("Authorization: Bearer"), "{msg}");
            let (status, _, msg) = refused(rule.admit(Identity::Refused(not_valid_here())));
            assert_eq!(status, 401);
            assert_eq!(msg, "the token is not valid here");
        }
        assert_eq!(
            Rule::SessionToken.admit(s()).unwrap(),
            Caller::SessionToken("s1".into())
        );
        assert_eq!(
            Rule::Approvals.admit(s()).unwrap(),
            Caller::SessionToken("s1".into())
        );
        assert_eq!((refused(Rule::OwnerOnly.admit(s())).0), 403);
        assert_eq!(
            Rule::Approvals.admit(Identity::Approver).unwrap(),
            Caller::Approver
        );
        for rule in [Rule::OwnerOnly, Rule::SessionToken] {
            let (status, code, msg) = refused(rule.admit(Identity::Approver));
            assert_eq!((status, code), (403, "forbidden"));
            assert!(msg.contains("approver token"), "{msg}");
        }
    }

    #[test]
    fn identity_names_the_caller_a_forward_carries() {
        assert_eq!(Identity::Owner.caller(), Some(Caller::Owner));
        assert_eq!(
            Identity::Session("s".into()).caller(),
            Some(Caller::SessionToken("s".into()))
        );
        assert_eq!(Identity::Anonymous.caller(), None);
        assert_eq!(Identity::Refused(not_valid_here()).caller(), None);
    }

    /// A read share comes through the reading door only (and the
    /// continuation route's, to be refused by the service); a write share
    /// where a session token does; neither where only the owner or the
    /// end user may go, and each refusal says what the share may do.
    #[test]
    fn a_share_comes_through_the_doors_of_its_mode() {
        let share = |mode| {
            Identity::Share(ShareHolder {
                session: "s1".into(),
                share: "sh_1".into(),
                mode,
            })
        };
        for mode in [ShareMode::Read, ShareMode::Write] {
            for rule in [Rule::Read, Rule::Approvals] {
                assert!(
                    matches!(rule.admit(share(mode)), Ok(Caller::Share(h)) if h.mode == mode),
                    "{rule:?} {mode:?}"
                );
            }
            for rule in [Rule::OwnerOnly, Rule::OwnerOrEndUser] {
                let (status, code, msg) = refused(rule.admit(share(mode)));
                assert_eq!((status, code), (403, "forbidden"), "{rule:?} {mode:?}");
                assert!(msg.contains("share link may"), "{msg}");
            }
        }
        assert!(Rule::SessionToken.admit(share(ShareMode::Write)).is_ok());
        let (status, _, msg) = refused(Rule::SessionToken.admit(share(ShareMode::Read)));
        assert_eq!(status, 403);
        assert!(msg.starts_with("a read-only share link may read"), "{msg}");
        assert_eq!(
            share(ShareMode::Read).caller(),
            Some(Caller::Share(ShareHolder {
                session: "s1".into(),
                share: "sh_1".into(),
                mode: ShareMode::Read
            }))
        );
        // The reading door: a session token and the owner too, never the
        // approver.
        assert!(Rule::Read.admit(Identity::Session("s1".into())).is_ok());
        assert_eq!(refused(Rule::Read.admit(Identity::Approver)).0, 403);
    }
}
