//! The client assertion of `private_key_jwt` (RFC 7523 §2.2, RFC 7521):
//! a JWT the client signs with its key, `iss` and `sub` its client id,
//! `aud` the authorization server's issuer (its token endpoint when it
//! names no issuer), short-lived and with a fresh `jti`.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, RsaKeyPair};
use bindery_spec::JwtAlgorithm;

use super::error::{KeyError, OAuthError};

/// How long an assertion is valid: enough for one token request.
pub const LIFETIME_SECS: u64 = 300;

/// A parsed signing key.
pub enum SigningKey {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SigningKey::Rsa(_) => "SigningKey::Rsa(..)",
            SigningKey::Ec(_) => "SigningKey::Ec(..)",
        })
    }
}

impl SigningKey {
    /// The key of a PEM text: PKCS#8 (`PRIVATE KEY`, RSA or P-256), PKCS#1
    /// (`RSA PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`, P-256).
    pub fn from_pem(pem: &str) -> Result<SigningKey, KeyError> {
        let (label, der) = pem_block(pem)?;
        let ec = || {
            EcdsaKeyPair::from_private_key_der(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der)
                .map(SigningKey::Ec)
        };
        match label.as_str() {
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der)
                .map(SigningKey::Rsa)
                .or_else(|_| ec())
                .map_err(|_| KeyError::Unsupported),
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der)
                .map(SigningKey::Rsa)
                .map_err(|_| KeyError::Unsupported),
            "EC PRIVATE KEY" => ec().map_err(|_| KeyError::Unsupported),
            "ENCRYPTED PRIVATE KEY" => Err(KeyError::Encrypted),
            other => Err(KeyError::Label(other.to_string())),
        }
    }

    /// The algorithm this key signs with.
    pub fn algorithm(&self) -> JwtAlgorithm {
        match self {
            SigningKey::Rsa(_) => JwtAlgorithm::RS256,
            SigningKey::Ec(_) => JwtAlgorithm::ES256,
        }
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, OAuthError> {
        let rng = SystemRandom::new();
        match self {
            SigningKey::Rsa(k) => {
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, message, &mut sig)
                    .map_err(|_| OAuthError::Sign)?;
                Ok(sig)
            }
            SigningKey::Ec(k) => k
                .sign(&rng, message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| OAuthError::Sign),
        }
    }
}

/// The first PEM block of `text`: its label and its bytes.
fn pem_block(text: &str) -> Result<(String, Vec<u8>), KeyError> {
    let mut lines = text.lines().map(str::trim);
    let label = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .ok_or(KeyError::NotPem)?
        .to_string();
    let end = format!("-----END {label}-----");
    let mut body = String::new();
    for l in lines.by_ref() {
        if l == end {
            let der = STANDARD.decode(body).map_err(|_| KeyError::NotPem)?;
            return Ok((label, der));
        }
        if l.contains(':') {
            // RFC 1421 headers (`Proc-Type: 4,ENCRYPTED`): an encrypted key.
            return Err(KeyError::Encrypted);
        }
        body.push_str(l);
    }
    Err(KeyError::NotPem)
}

/// The claims of an assertion issued at `now` (seconds since the epoch).
/// Pure.
pub fn claims(client_id: &str, audience: &str, now: u64, jti: &str) -> serde_json::Value {
    serde_json::json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + LIFETIME_SECS,
        "jti": jti,
    })
}

/// `claims` signed with `key` as `alg`, in compact form.
pub fn sign(
    key: &SigningKey,
    alg: JwtAlgorithm,
    claims: &serde_json::Value,
) -> Result<String, OAuthError> {
    if alg != key.algorithm() {
        return Err(OAuthError::AlgorithmMismatch {
            alg,
            key: key.algorithm(),
        });
    }
    let name = match alg {
        JwtAlgorithm::RS256 => "RS256",
        JwtAlgorithm::ES256 => "ES256",
    };
    let header = serde_json::json!({ "alg": name, "typ": "JWT" });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = key.sign(input.as_bytes())?;
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};

    fn ec_pem() -> (String, Vec<u8>) {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let pair =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref())
                .unwrap();
        let b64 = STANDARD.encode(doc.as_ref());
        let body: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        (
            format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
                body.join("\n")
            ),
            pair.public_key().as_ref().to_vec(),
        )
    }

    #[test]
    fn the_claims_name_the_client_the_audience_and_a_short_life() {
        let c = claims("client-1", "https://auth.example", 1_000, "j1");
        assert_eq!(c["iss"], "client-1");
        assert_eq!(c["sub"], "client-1");
        assert_eq!(c["aud"], "https://auth.example");
        assert_eq!(c["iat"], 1_000);
        assert_eq!(c["exp"], 1_300);
        assert_eq!(c["jti"], "j1");
    }

    #[test]
    fn an_es256_assertion_verifies_with_the_public_key() {
        let (pem, public) = ec_pem();
        let key = SigningKey::from_pem(&pem).unwrap();
        assert_eq!(key.algorithm(), JwtAlgorithm::ES256);
        let jwt = sign(&key, JwtAlgorithm::ES256, &claims("c", "https://a", 1, "j")).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "ES256");
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(sig.len(), 64);
        let signed = format!("{}.{}", parts[0], parts[1]);
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &public)
            .verify(signed.as_bytes(), &sig)
            .unwrap();
        let err = sign(&key, JwtAlgorithm::RS256, &claims("c", "a", 1, "j")).unwrap_err();
        assert!(err.to_string().contains("ES256"), "{err}");
    }

    #[test]
    fn keys_that_cannot_sign_are_refused_with_why() {
        assert!(matches!(
            SigningKey::from_pem("secret"),
            Err(KeyError::NotPem)
        ));
        assert!(matches!(
            SigningKey::from_pem(
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----"
            ),
            Err(KeyError::Encrypted)
        ));
        assert!(matches!(
            SigningKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"),
            Err(KeyError::Unsupported)
        ));
        assert!(matches!(
            SigningKey::from_pem("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"),
            Err(KeyError::Label(_))
        ));
    }
}
