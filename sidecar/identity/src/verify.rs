//! Whether an identity token holds, against keys already fetched and a
//! clock reading given: pure, so every way a token fails is a unit test.

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config::IdentityConfig;
use crate::subject::Subject;

/// The signature algorithms taken: public-key ones only. `none` and the
/// HMAC family are refused whatever the keys say: with a key set that is
/// public, an HMAC "signature" is one anybody can make.
pub const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// The longest token read: a JWT from an identity provider is a few
/// kilobytes; anything bigger is not parsed at all.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// One verification key of the issuer's set.
pub struct Key {
    kid: Option<String>,
    /// The algorithm the key is published for, when the set says.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

/// The issuer's verification keys, as fetched: signing keys of the
/// public-key families only.
#[derive(Default)]
pub struct KeySet {
    keys: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<_> = self.keys.iter().map(|k| k.kid.as_deref()).collect();
        f.debug_struct("KeySet").field("kids", &ids).finish()
    }
}

impl KeySet {
    /// The keys of a JWKS document (`{"keys": [...]}`): each key that is a
    /// public signing key Bindery can use; a key of another kind (an
    /// encryption key, a symmetric one, a type not known) is left out
    /// rather than failing the whole set.
    pub fn parse(document: &[u8]) -> Result<KeySet, serde_json::Error> {
        #[derive(serde::Deserialize)]
        struct Doc {
            keys: Vec<Value>,
        }
        let doc: Doc = serde_json::from_slice(document)?;
        let keys = doc
            .keys
            .into_iter()
            .filter_map(|v| serde_json::from_value::<Jwk>(v).ok())
            .filter_map(|jwk| usable(&jwk))
            .collect();
        Ok(KeySet { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether the set holds a key of id `kid`.
    pub fn has(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The keys a token signed with `alg` under key id `kid` may be
    /// verified with: the one of that id (a token naming an id is checked
    /// against that key only), or every key when the token names none.
    fn candidates<'a>(
        &'a self,
        kid: Option<&'a str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys.iter().filter(move |k| {
            kid.is_none_or(|kid| k.kid.as_deref() == Some(kid))
                && k.alg.is_none_or(|a| a == alg)
                && DecodingKey::family(&k.key) == alg.family()
        })
    }
}

fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return None;
    }
    let alg = match &jwk.common.key_algorithm {
        None => None,
        // The names of the signature algorithms are the same in both enums.
        Some(a) => Some(format!("{a:?}").parse::<Algorithm>().ok()?),
    };
    if alg.is_some_and(|a| !ALGORITHMS.contains(&a)) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

/// A token that holds: who it names and what else it says.
#[derive(Clone, Debug)]
pub struct Verified {
    pub subject: Subject,
    /// Every claim of the token (bindings read `email` and the like).
    pub claims: Map<String, Value>,
    /// `exp`, in seconds since the Unix epoch.
    pub expires_at: u64,
}

/// Why a token does not hold. The texts name what failed and never
/// repeat the token or anything read from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the identity token is not a signed JWT")]
    Malformed,
    #[error("the identity token is signed with an algorithm not taken (public-key algorithms only: RS*, PS*, ES256, ES384, EdDSA)")]
    Algorithm,
    #[error("the identity token names a signing key the issuer does not publish")]
    UnknownKey,
    #[error("the identity token's signature does not verify")]
    Signature,
    #[error("the identity token was issued by another issuer than the one this server trusts")]
    Issuer,
    #[error("the identity token was issued for another audience than this server's")]
    Audience,
    #[error("the identity token has expired")]
    Expired,
    #[error("the identity token is not valid yet")]
    NotYetValid,
    #[error("the identity token carries no `exp`: a bearer token without an end is not taken")]
    NoExpiry,
    #[error("the identity token's `{0}` claim names no subject (a non-empty string of at most 255 printable bytes)")]
    NoSubject(String),
}

/// Whether `token` holds against `keys` and `config` at `now` (seconds
/// since the Unix epoch).
pub fn verify(
    token: &str,
    keys: &KeySet,
    config: &IdentityConfig,
    now: u64,
) -> Result<Verified, Rejected> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Rejected::Malformed);
    }
    let header = jsonwebtoken::decode_header(token).map_err(|_| Rejected::Malformed)?;
    if !ALGORITHMS.contains(&header.alg) {
        return Err(Rejected::Algorithm);
    }
    // Time, issuer and audience are checked below against `now` and the
    // configuration, each with its own refusal; the crate checks the
    // signature and the algorithm against the key.
    let mut validation = Validation::new(header.alg);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let mut claims = None;
    let mut tried = false;
    for key in keys.candidates(header.kid.as_deref(), header.alg) {
        tried = true;
        match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
            Ok(data) => {
                claims = Some(data.claims);
                break;
            }
            Err(e) => match e.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => continue,
                _ => return Err(Rejected::Malformed),
            },
        }
    }
    let claims = match (claims, tried) {
        (Some(c), _) => c,
        (None, true) => return Err(Rejected::Signature),
        (None, false) => return Err(Rejected::UnknownKey),
    };
    if claims.get("iss").and_then(Value::as_str) != Some(config.issuer.as_str()) {
        return Err(Rejected::Issuer);
    }
    if !audience_holds(claims.get("aud"), &config.audiences) {
        return Err(Rejected::Audience);
    }
    let skew = config.clock_skew.as_secs();
    // A time that is there must be a number: a string `nbf` skipped would
    // make a token valid before its time.
    let time = |name| match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|t| Some(t as u64))
            .ok_or(Rejected::Malformed),
    };
    let exp = time("exp")?.ok_or(Rejected::NoExpiry)?;
    if now > exp.saturating_add(skew) {
        return Err(Rejected::Expired);
    }
    if time("nbf")?.is_some_and(|nbf| now.saturating_add(skew) < nbf) {
        return Err(Rejected::NotYetValid);
    }
    if time("iat")?.is_some_and(|iat| now.saturating_add(skew) < iat) {
        return Err(Rejected::NotYetValid);
    }
    let subject = claims
        .get(&config.subject_claim)
        .and_then(Value::as_str)
        .and_then(|s| Subject::new(s).ok())
        .ok_or_else(|| Rejected::NoSubject(config.subject_claim.clone()))?;
    Ok(Verified {
        subject,
        claims,
        expires_at: exp,
    })
}

/// Whether `aud` (a string or a list of them) names one of `audiences`.
fn audience_holds(aud: Option<&Value>, audiences: &[String]) -> bool {
    let named = |a: &str| audiences.iter().any(|x| x == a);
    match aud {
        Some(Value::String(a)) => named(a),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).any(named),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
