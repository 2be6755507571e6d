//! The JWT pieces the identity tests need, apart from any server: reading a
//! token's header and claims, verifying its signature against a JWKS (RS256
//! and ES256, the algorithms Keycloak signs with), and a client's own key
//! pair for `private_key_jwt` (RFC 7523), which signs its assertions.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{
    self, EcdsaKeyPair, KeyPair, RsaPublicKeyComponents, UnparsedPublicKey,
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use serde_json::{json, Value};

/// Why a token does not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// Not three base64url parts, or a part that is not JSON.
    Malformed(String),
    /// The header names no `kid`, or one the JWKS does not hold.
    UnknownKey(Option<String>),
    /// An `alg` this module does not verify (or one the key is not for).
    Algorithm(String),
    /// The signature does not verify with the named key.
    BadSignature { kid: String },
}

impl fmt::Display for JwtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwtError::Malformed(why) => write!(f, "not a JWT: {why}"),
            JwtError::UnknownKey(Some(kid)) => write!(f, "the JWKS has no key with kid {kid:?}"),
            JwtError::UnknownKey(None) => write!(f, "the token's header names no kid"),
            JwtError::Algorithm(alg) => write!(f, "alg {alg:?} is not RS256 or ES256 of its key"),
            JwtError::BadSignature { kid } => {
                write!(f, "the signature does not verify with key {kid:?}")
            }
        }
    }
}

impl std::error::Error for JwtError {}

/// The decoded JSON of the part `index` (0 header, 1 claims).
fn part(token: &str, index: usize) -> Result<Value, JwtError> {
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(JwtError::Malformed(format!("{} parts, not 3", parts.len())));
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(parts[index])
        .map_err(|e| JwtError::Malformed(format!("part {index} is not base64url: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| JwtError::Malformed(format!("part {index} is not JSON: {e}")))
}

/// The token's header (unverified).
pub fn header(token: &str) -> Result<Value, JwtError> {
    part(token, 0)
}

/// The token's claims (unverified).
pub fn claims(token: &str) -> Result<Value, JwtError> {
    part(token, 1)
}

/// The `aud` claim as a list (a single string is a list of one).
pub fn audiences(claims: &Value) -> Vec<String> {
    match &claims["aud"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// The `scope` claim's scopes.
pub fn scopes(claims: &Value) -> Vec<String> {
    claims["scope"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The claims of `token` once its signature verifies with the key of
/// `jwks` (`{"keys": [...]}`) its header's `kid` names. Only the signature:
/// the caller checks `iss`, `aud` and `exp` for what it tests.
pub fn verify(token: &str, jwks: &Value) -> Result<Value, JwtError> {
    let header = header(token)?;
    let claims = claims(token)?;
    let kid = header["kid"].as_str().map(str::to_string);
    let key = jwks["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|k| kid.is_some() && k["kid"].as_str() == kid.as_deref())
        .ok_or_else(|| JwtError::UnknownKey(kid.clone()))?;
    let kid = kid.unwrap_or_default();
    let (signed, signature) = token
        .rsplit_once('.')
        .ok_or_else(|| JwtError::Malformed("no signature".into()))?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|e| JwtError::Malformed(format!("the signature is not base64url: {e}")))?;
    let field = |name: &str| -> Result<Vec<u8>, JwtError> {
        let text = key[name]
            .as_str()
            .ok_or_else(|| JwtError::Malformed(format!("key {kid:?} has no {name}")))?;
        URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|e| JwtError::Malformed(format!("key {kid:?}'s {name}: {e}")))
    };
    let alg = header["alg"].as_str().unwrap_or_default();
    let verified = match (alg, key["kty"].as_str()) {
        ("RS256", Some("RSA")) => RsaPublicKeyComponents {
            n: field("n")?,
            e: field("e")?,
        }
        .verify(
            &signature::RSA_PKCS1_2048_8192_SHA256,
            signed.as_bytes(),
            &signature,
        ),
        ("ES256", Some("EC")) if key["crv"] == "P-256" => {
            let mut point = vec![4u8];
            point.extend(field("x")?);
            point.extend(field("y")?);
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                .verify(signed.as_bytes(), &signature)
        }
        _ => return Err(JwtError::Algorithm(alg.to_string())),
    };
    verified.map_err(|_| JwtError::BadSignature { kid })?;
    Ok(claims)
}

/// Random bytes, base64url: PKCE verifiers, states, `jti`s, secrets.
pub fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        .expect("the system's random generator");
    URL_SAFE_NO_PAD.encode(buf)
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
}

/// A client's P-256 key pair for `private_key_jwt`: the server holds its
/// public half ([`ClientKey::jwks`]), the test its private half
/// ([`ClientKey::private_key_pem`]) and signs assertions with it.
pub struct ClientKey {
    pkcs8: Vec<u8>,
    pair: EcdsaKeyPair,
    /// The key's id in the JWKS and in each assertion's header.
    pub kid: String,
}

impl fmt::Debug for ClientKey {
    // The private key is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientKey").field("kid", &self.kid).finish()
    }
}

impl Clone for ClientKey {
    fn clone(&self) -> ClientKey {
        ClientKey::from_pkcs8(&self.pkcs8, &self.kid)
    }
}

impl ClientKey {
    /// A new key pair with a random kid.
    pub fn generate() -> ClientKey {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("a P-256 key pair");
        ClientKey::from_pkcs8(pkcs8.as_ref(), &random_token(9))
    }

    fn from_pkcs8(pkcs8: &[u8], kid: &str) -> ClientKey {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8)
            .expect("the key pair this module made");
        ClientKey {
            pkcs8: pkcs8.to_vec(),
            pair,
            kid: kid.to_string(),
        }
    }

    /// The private key, PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as a
    /// client's configuration would hold it.
    pub fn private_key_pem(&self) -> String {
        let body = STANDARD.encode(&self.pkcs8);
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        pem
    }

    /// The public key as a JWK (`kty` EC, `crv` P-256, `alg` ES256).
    pub fn public_jwk(&self) -> Value {
        // The uncompressed point: 0x04, then x and y, 32 bytes each.
        let point = self.pair.public_key().as_ref();
        json!({
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
            "kid": self.kid,
            "use": "sig",
            "alg": "ES256",
        })
    }

    /// The JWKS holding only [`Self::public_jwk`].
    pub fn jwks(&self) -> Value {
        json!({ "keys": [self.public_jwk()] })
    }

    /// A signed JWT of `claims` with this key (ES256).
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .expect("an ES256 signature");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }

    /// A client assertion (RFC 7523 section 3) for `client_id` to the
    /// server `audience` (its issuer), valid for a minute, with a fresh
    /// `jti` (servers refuse one seen before).
    pub fn client_assertion(&self, client_id: &str, audience: &str) -> String {
        let now = now();
        self.sign(&json!({
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "jti": random_token(16),
            "iat": now,
            "exp": now + 60,
        }))
    }
}

/// A PKCE pair (RFC 7636), method S256.
pub struct Pkce {
    /// What the token request sends (`code_verifier`).
    pub verifier: String,
    /// What the authorization request sends (`code_challenge`).
    pub challenge: String,
}

impl Pkce {
    /// A new random verifier (43 characters) and its S256 challenge.
    pub fn new() -> Pkce {
        Pkce::from_verifier(&random_token(32))
    }

    /// The pair of `verifier`.
    pub fn from_verifier(verifier: &str) -> Pkce {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, verifier.as_bytes());
        Pkce {
            challenge: URL_SAFE_NO_PAD.encode(digest.as_ref()),
            verifier: verifier.to_string(),
        }
    }
}

impl Default for Pkce {
    fn default() -> Pkce {
        Pkce::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_keys_signature_verifies_with_its_jwks_and_not_with_another() {
        let key = ClientKey::generate();
        let token = key.client_assertion("tool", "http://127.0.0.1/realms/r");
        let claims = verify(&token, &key.jwks()).expect("its own JWKS verifies it");
        assert_eq!(claims["iss"], "tool");
        assert_eq!(audiences(&claims), ["http://127.0.0.1/realms/r"]);

        // Another key under the same kid: the signature does not verify.
        let mut other = ClientKey::generate().public_jwk();
        other["kid"] = json!(key.kid);
        assert_eq!(
            verify(&token, &json!({"keys": [other]})),
            Err(JwtError::BadSignature {
                kid: key.kid.clone()
            })
        );
        // A changed claim: neither.
        let (head, rest) = token.split_once('.').unwrap();
        let (_, sig) = rest.split_once('.').unwrap();
        let forged = format!(
            "{head}.{}.{sig}",
            URL_SAFE_NO_PAD.encode(json!({"iss": "admin"}).to_string())
        );
        assert!(matches!(
            verify(&forged, &key.jwks()),
            Err(JwtError::BadSignature { .. })
        ));
        assert_eq!(
            verify(&token, &json!({"keys": []})),
            Err(JwtError::UnknownKey(Some(key.kid.clone())))
        );
        assert!(matches!(
            verify("a.b", &key.jwks()),
            Err(JwtError::Malformed(_))
        ));
        let pem = key.private_key_pem();
        assert!(
            pem.starts_with("-----BEGIN PRIVATE KEY-----\n")
                && pem.ends_with("-----END PRIVATE KEY-----\n")
        );
        assert!(!format!("{key:?}").contains(&pem[28..60]));
    }

    #[test]
    fn pkce_challenge_is_the_s256_of_the_verifier() {
        // RFC 7636 appendix B's example.
        assert_eq!(
            Pkce::from_verifier("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk").challenge,
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let pkce = Pkce::new();
        assert_eq!(pkce.verifier.len(), 43);
        assert_ne!(pkce.verifier, Pkce::new().verifier);
    }
}
