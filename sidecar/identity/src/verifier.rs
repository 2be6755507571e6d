//! Who an identity token names, checked: the keys fetched as needed, the
//! token verified against them and the configuration.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use bindery_params::secret::SecretString;

use crate::config::{ConfigError, IdentityConfig};
use crate::jwks::{FetchError, Jwks};
use crate::subject::Subject;
use crate::verify::{self, Rejected};

/// A person, as their identity token says, checked.
#[derive(Debug)]
pub struct EndUser {
    pub subject: Subject,
    /// The token's claims (a binding reads `email` and the like).
    pub claims: Map<String, Value>,
    /// The token itself, for an exchange with a downstream audience.
    pub token: SecretString,
    /// `exp`, in seconds since the Unix epoch.
    pub expires_at: u64,
}

impl EndUser {
    /// The person this token presents, as requests carry them.
    pub fn person(self) -> Person {
        Person {
            subject: self.subject,
            claims: Arc::new(self.claims),
            token: Some(Arc::new(self.token)),
            expires_at: self.expires_at,
        }
    }
}

/// An end user as one request presents them: who, what their token says,
/// and the token (for exchanges). Equal when the subject is: two requests
/// of one person are the same caller.
#[derive(Clone, Debug)]
pub struct Person {
    pub subject: Subject,
    /// Their token's claims (none when a replica forwarded the request
    /// without their token, or it no longer held there).
    pub claims: Arc<Map<String, Value>>,
    /// Their identity token (none when a replica forwarded the request
    /// without it).
    pub token: Option<Arc<SecretString>>,
    /// When that token expires (seconds since the Unix epoch): past it,
    /// it is exchanged no more.
    pub expires_at: u64,
}

impl Person {
    /// A person known by subject only (a forward vouches for them).
    pub fn named(subject: Subject) -> Person {
        Person {
            subject,
            claims: Arc::default(),
            token: None,
            expires_at: 0,
        }
    }
}

impl Person {
    /// Their token, while it has not expired.
    pub fn live_token(&self) -> Option<&SecretString> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(u64::MAX, |d| d.as_secs());
        self.token.as_deref().filter(|_| now < self.expires_at)
    }
}

impl PartialEq for Person {
    fn eq(&self, other: &Person) -> bool {
        self.subject == other.subject
    }
}

impl Eq for Person {}

/// Why a token was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token does not hold.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// The issuer's keys could not be fetched, and none are at hand.
    #[error(transparent)]
    Unavailable(#[from] FetchError),
}

/// The identity provider a server trusts, and its keys.
pub struct Verifier {
    config: IdentityConfig,
    jwks: Jwks,
}

impl Verifier {
    pub fn new(config: IdentityConfig) -> Result<Verifier, ConfigError> {
        Ok(Verifier {
            jwks: Jwks::new(config.clone())?,
            config,
        })
    }

    pub fn config(&self) -> &IdentityConfig {
        &self.config
    }

    /// Whether `token` looks like a JWT at all (three dot-separated
    /// parts): other bearer tokens (the owner's, a session's) are never
    /// sent to the issuer's keys.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3 && token.len() <= verify::MAX_TOKEN_BYTES
    }

    /// Who `token` names, if it holds.
    pub async fn verify(&self, token: &str) -> Result<EndUser, Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejected::Malformed)?;
        let keys = self.jwks.keys(header.kid.as_deref()).await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let v = verify::verify(token, &keys, &self.config, now)?;
        Ok(EndUser {
            subject: v.subject,
            claims: v.claims,
            token: SecretString::new(token),
            expires_at: v.expires_at,
        })
    }
}
