//! A person's grant to a remote MCP server (an `authorization-code`
//! connection), as the store keeps it: who (the subject) and which toolbox
//! in clear, with the scopes and times, and the tokens sealed.
//!
//! Sealing is AES-256-GCM under a key derived with HKDF-SHA256 from the
//! tenant's owner token (its own salt label; the subject as the info, so
//! each person's grants have their own key), with the subject and the
//! toolbox as associated data: a sealed grant moved to another row does
//! not open. Each seal has a fresh random nonce. When the owner token
//! rotates, every grant becomes unreadable and people consent again.
//! aws-lc-rs is the crypto library rustls and jsonwebtoken already build.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};
use bindery_params::SecretString;
use serde::Serialize;

/// The HKDF salt of grant keys: no other key derived from the owner token
/// can be one.
const LABEL: &[u8] = b"bindery/mcp-connections/v1";

/// One kept connection, as stored: `sealed` holds the tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredConnection {
    pub subject: String,
    pub toolbox: String,
    pub scopes: Vec<String>,
    /// Milliseconds since the epoch.
    pub connected_at: i64,
    pub last_used_at: i64,
    /// [`seal`]'s output: nonce, then ciphertext and tag.
    pub sealed: Vec<u8>,
}

/// A connection as an owner or its person sees it: never a token.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ConnectionView {
    pub toolbox: String,
    pub subject: String,
    pub scopes: Vec<String>,
    pub connected_at: i64,
    pub last_used_at: i64,
}

impl StoredConnection {
    pub fn view(&self) -> ConnectionView {
        ConnectionView {
            toolbox: self.toolbox.clone(),
            subject: self.subject.clone(),
            scopes: self.scopes.clone(),
            connected_at: self.connected_at,
            last_used_at: self.last_used_at,
        }
    }
}

/// What a grant holds: the refresh token, and the access token with when
/// it expires (milliseconds since the epoch), if kept.
#[derive(Clone, Debug)]
pub struct Grant {
    pub refresh_token: SecretString,
    pub access_token: Option<SecretString>,
    pub expires_at: Option<i64>,
}

/// Why a grant was not sealed or opened. Says nothing of its content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the grant key cannot be derived from the owner token")]
    Key,
    #[error("the system's random generator failed")]
    Random,
    #[error("the grant does not open with this owner token, person and toolbox (the owner token rotated, or the row was altered): the person consents again")]
    Open,
}

fn key(owner: &[u8], subject: &str) -> Result<LessSafeKey, SealError> {
    let prk = Salt::new(HKDF_SHA256, LABEL).extract(owner);
    let info = [subject.as_bytes()];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .map_err(|_| SealError::Key)?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

/// The associated data: the subject and the toolbox, each length-prefixed
/// (no two pairs give the same bytes).
fn aad(subject: &str, toolbox: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [subject, toolbox] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// `grant` sealed for `subject`'s connection to `toolbox` under the owner
/// token's key material `owner`.
pub fn seal(
    owner: &[u8],
    subject: &str,
    toolbox: &str,
    grant: &Grant,
) -> Result<Vec<u8>, SealError> {
    let key = key(owner, subject)?;
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce).map_err(|_| SealError::Random)?;
    let plain = serde_json::json!({
        "r": grant.refresh_token.expose(),
        "a": grant.access_token.as_ref().map(|a| a.expose()),
        "e": grant.expires_at,
    });
    let mut buf = plain.to_string().into_bytes();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad(subject, toolbox)),
        &mut buf,
    )
    .map_err(|_| SealError::Key)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

/// The grant `sealed` holds, if it was sealed for this subject and
/// toolbox under this owner token.
pub fn open(owner: &[u8], subject: &str, toolbox: &str, sealed: &[u8]) -> Result<Grant, SealError> {
    if sealed.len() < NONCE_LEN {
        return Err(SealError::Open);
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
    let key = key(owner, subject)?;
    let mut buf = body.to_vec();
    let plain = key
        .open_in_place(nonce, Aad::from(aad(subject, toolbox)), &mut buf)
        .map_err(|_| SealError::Open)?;
    let v: serde_json::Value = serde_json::from_slice(plain).map_err(|_| SealError::Open)?;
    let text = |k: &str| v.get(k).and_then(|s| s.as_str()).map(SecretString::new);
    Ok(Grant {
        refresh_token: text("r").ok_or(SealError::Open)?,
        access_token: text("a"),
        expires_at: v.get("e").and_then(|e| e.as_i64()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            refresh_token: SecretString::new("rt-canary-7f3a"),
            access_token: Some(SecretString::new("at-canary-91c2")),
            expires_at: Some(1_800_000_000_000),
        }
    }

    #[test]
    fn a_grant_opens_for_its_person_and_toolbox_only() {
        let owner = b"owner-token-of-acme";
        let sealed = seal(owner, "alice", "crm", &grant()).unwrap();
        let text = String::from_utf8_lossy(&sealed);
        assert!(!text.contains("rt-canary") && !text.contains("at-canary"));
        let g = open(owner, "alice", "crm", &sealed).unwrap();
        assert_eq!(g.refresh_token.expose(), "rt-canary-7f3a");
        assert_eq!(g.access_token.unwrap().expose(), "at-canary-91c2");
        assert_eq!(g.expires_at, Some(1_800_000_000_000));
        // Another person, toolbox or owner token (another tenant, or a
        // rotation): it does not open.
        assert_eq!(
            open(owner, "bob", "crm", &sealed).unwrap_err(),
            SealError::Open
        );
        assert_eq!(
            open(owner, "alice", "erp", &sealed).unwrap_err(),
            SealError::Open
        );
        assert_eq!(
            open(b"rotated-owner-token", "alice", "crm", &sealed).unwrap_err(),
            SealError::Open
        );
        // Nor does an altered or cut one.
        let mut altered = sealed.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert_eq!(
            open(owner, "alice", "crm", &altered).unwrap_err(),
            SealError::Open
        );
        assert_eq!(
            open(owner, "alice", "crm", &sealed[..5]).unwrap_err(),
            SealError::Open
        );
        // Two seals of one grant differ (a fresh nonce each).
        assert_ne!(seal(owner, "alice", "crm", &grant()).unwrap(), sealed);
        // The pair is unambiguous: ("ab", "c") is not ("a", "bc").
        assert_ne!(aad("ab", "c"), aad("a", "bc"));
    }
}
