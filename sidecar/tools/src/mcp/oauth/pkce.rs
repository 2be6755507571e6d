//! PKCE (RFC 7636, S256 only) and the random values of a flow: the code
//! verifier, `state`, an assertion's `jti`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::error::OAuthError;

/// `n` random bytes from the system's generator, base64url.
pub fn random(n: usize) -> Result<String, OAuthError> {
    let mut buf = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut buf).map_err(|_| OAuthError::Random)?;
    Ok(URL_SAFE_NO_PAD.encode(buf))
}

/// A code verifier: 32 random bytes, 43 characters of base64url.
pub fn verifier() -> Result<String, OAuthError> {
    random(32)
}

/// The S256 code challenge of `verifier`. Pure.
pub fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_is_rfc_7636s() {
        // RFC 7636 appendix B.
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn verifiers_are_long_enough_and_differ() {
        let (a, b) = (verifier().unwrap(), verifier().unwrap());
        assert_eq!(a.len(), 43);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_ne!(a, b);
    }
}
