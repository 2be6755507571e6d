//! Signing keys for tests: an issuer's EC P-256 key pair, its JWK, and
//! tokens it signs; an issuer on loopback serving its discovery document
//! and keys. Public (feature `test-keys`) so the API's tests can play an
//! issuer too; the real identity provider's tests use Keycloak.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// An issuer's signing key.
pub struct TestKey {
    pub kid: String,
    encoding: EncodingKey,
    x: String,
    y: String,
}

impl TestKey {
    /// A fresh P-256 key of id `kid`.
    pub fn new(kid: &str) -> TestKey {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref())
            .expect("the key just made");
        let point = pair.public_key().as_ref();
        assert_eq!(point.len(), 65, "an uncompressed P-256 point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        TestKey {
            kid: kid.to_string(),
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            x: b64(&point[1..33]),
            y: b64(&point[33..]),
        }
    }

    /// The key's public JWK.
    pub fn jwk(&self) -> Value {
        json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
               "kid": self.kid, "x": self.x, "y": self.y})
    }

    /// A JWKS document of `keys`.
    pub fn jwks(keys: &[&TestKey]) -> Value {
        json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()})
    }

    /// `claims` signed with this key, its id in the header.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("a signed token")
    }

    /// `claims` signed with this key under another key's id.
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_string());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("a signed token")
    }
}

/// An identity provider on loopback: its discovery document and JWKS,
/// and tokens signed with its key.
pub struct TestIssuer {
    /// The issuer (`http://127.0.0.1:PORT/realms/test`), as `iss` says.
    pub url: String,
    pub key: TestKey,
}

impl TestIssuer {
    /// Serve a fresh key's issuer on a port of loopback, until the
    /// runtime ends.
    pub async fn start() -> TestIssuer {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!(
            "http://{}/realms/test",
            listener.local_addr().expect("its address")
        );
        let key = TestKey::new("test-key-1");
        let discovery = json!({"issuer": url, "jwks_uri": format!("{url}/certs"),
                               "token_endpoint": format!("{url}/token")});
        let jwks = TestKey::jwks(&[&key]);
        let app = axum::Router::new()
            .route(
                "/realms/test/.well-known/openid-configuration",
                get(move || async move { axum::Json(discovery) }),
            )
            .route(
                "/realms/test/certs",
                get(move || async move { axum::Json(jwks) }),
            )
            // RFC 8693, as a stand-in: the client `bindery` (secret
            // `exchange-secret`) gets `exchanged-<audience>-for-<sub>` for
            // an identity token of this issuer (its signature is the
            // verifier's business, not this stand-in's).
            .route("/realms/test/token", axum::routing::post(exchange));
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestIssuer { url, key }
    }

    /// A token of this issuer for `sub`, audience `aud`, valid five
    /// minutes from now, with `extra` claims.
    pub fn token(&self, sub: &str, aud: &str, extra: Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let mut claims = json!({"iss": self.url, "aud": aud, "sub": sub,
                                "iat": now, "exp": now + 300});
        if let (Some(c), Value::Object(extra)) = (claims.as_object_mut(), extra) {
            c.extend(extra);
        }
        self.key.sign(&claims)
    }
}

async fn exchange(
    headers: axum::http::HeaderMap,
    body: String,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    use axum::http::StatusCode;
    let form: std::collections::HashMap<String, String> = url_form(&body).into_iter().collect();
    let basic = base64::engine::general_purpose::STANDARD.encode("bindery:exchange-secret");
    let authorized = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Basic {basic}"));
    if !authorized {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_client"})),
        );
    }
    let sub = form
        .get("subject_token")
        .and_then(|t| t.split('.').nth(1))
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .ok()
        })
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|c| c["sub"].as_str().map(str::to_string));
    match (sub, form.get("audience")) {
        (Some(sub), Some(aud)) => (
            StatusCode::OK,
            axum::Json(json!({"access_token": format!("exchanged-{aud}-for-{sub}"),
                              "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                              "token_type": "Bearer", "expires_in": 300})),
        ),
        _ => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_request"})),
        ),
    }
}

fn url_form(body: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect()
}
