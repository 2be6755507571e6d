use serde_json::{json, Value};

use super::*;
use crate::testkeys::TestKey;

const ISS: &str = "https://idp.example.com/realms/acme";
const NOW: u64 = 1_800_000_000;

fn config() -> IdentityConfig {
    IdentityConfig::new(ISS, vec!["bindery".into()]).unwrap()
}

fn claims() -> Value {
    json!({"iss": ISS, "aud": "bindery", "sub": "alice", "email": "alice@example.com",
           "iat": NOW - 10, "exp": NOW + 300})
}

fn with(mut v: Value, key: &str, val: Value) -> Value {
    v[key] = val;
    v
}

fn keys(ks: &[&TestKey]) -> KeySet {
    KeySet::parse(TestKey::jwks(ks).to_string().as_bytes()).unwrap()
}

#[test]
fn a_token_of_the_issuer_for_this_audience_names_its_subject() {
    let k = TestKey::new("k1");
    let v = verify(&k.sign(&claims()), &keys(&[&k]), &config(), NOW).unwrap();
    assert_eq!(v.subject.as_str(), "alice");
    assert_eq!(v.claims["email"], "alice@example.com");
    assert_eq!(v.expires_at, NOW + 300);
    // An audience list naming this server's among others holds too.
    let t = k.sign(&with(claims(), "aud", json!(["account", "bindery"])));
    assert!(verify(&t, &keys(&[&k]), &config(), NOW).is_ok());
}

#[test]
fn each_claim_that_does_not_hold_refuses_the_token_for_its_own_reason() {
    let k = TestKey::new("k1");
    let ks = keys(&[&k]);
    let c = config();
    let refused = |claims: Value| verify(&k.sign(&claims), &ks, &c, NOW).unwrap_err();
    assert_eq!(
        refused(with(claims(), "iss", json!("https://evil.example"))),
        Rejected::Issuer
    );
    assert_eq!(
        refused(with(claims(), "iss", json!(format!("{ISS}/")))),
        Rejected::Issuer
    );
    assert_eq!(
        refused(with(claims(), "aud", json!("account"))),
        Rejected::Audience
    );
    assert_eq!(
        refused(with(claims(), "aud", json!(["a", "b"]))),
        Rejected::Audience
    );
    assert_eq!(
        refused(with(claims(), "aud", Value::Null)),
        Rejected::Audience
    );
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_eq!(refused(no_exp), Rejected::NoExpiry);
    assert_eq!(
        refused(with(claims(), "exp", json!(NOW - 61))),
        Rejected::Expired
    );
    assert_eq!(
        refused(with(claims(), "nbf", json!(NOW + 61))),
        Rejected::NotYetValid
    );
    assert_eq!(
        refused(with(claims(), "iat", json!(NOW + 61))),
        Rejected::NotYetValid
    );
    // A time that is not a number is no time: never skipped.
    assert_eq!(
        refused(with(claims(), "nbf", json!("9999999999"))),
        Rejected::Malformed
    );
    assert_eq!(
        refused(with(claims(), "iat", json!("later"))),
        Rejected::Malformed
    );
    assert_eq!(
        refused(with(claims(), "sub", json!(""))),
        Rejected::NoSubject("sub".into())
    );
    assert_eq!(
        refused(with(claims(), "sub", json!(7))),
        Rejected::NoSubject("sub".into())
    );
}

#[test]
fn the_clock_skew_forgives_that_much_and_no_more() {
    let k = TestKey::new("k1");
    let t = k.sign(&with(claims(), "exp", json!(NOW - 60)));
    assert!(
        verify(&t, &keys(&[&k]), &config(), NOW).is_ok(),
        "60 s late: within skew"
    );
    let t = k.sign(&with(claims(), "nbf", json!(NOW + 60)));
    assert!(verify(&t, &keys(&[&k]), &config(), NOW).is_ok());
}

#[test]
fn the_subject_comes_from_the_configured_claim() {
    let k = TestKey::new("k1");
    let mut c = config();
    c.subject_claim = "email".into();
    let v = verify(&k.sign(&claims()), &keys(&[&k]), &c, NOW).unwrap();
    assert_eq!(v.subject.as_str(), "alice@example.com");
    c.subject_claim = "preferred_username".into();
    assert_eq!(
        verify(&k.sign(&claims()), &keys(&[&k]), &c, NOW).unwrap_err(),
        Rejected::NoSubject("preferred_username".into())
    );
}

#[test]
fn a_signature_by_any_other_key_does_not_hold() {
    let k = TestKey::new("k1");
    let forger = TestKey::new("k1");
    let ks = keys(&[&k]);
    // The forger's key under the real key's id.
    assert_eq!(
        verify(&forger.sign(&claims()), &ks, &config(), NOW).unwrap_err(),
        Rejected::Signature
    );
    // A key id the issuer does not publish.
    assert_eq!(
        verify(&k.sign_as("k9", &claims()), &ks, &config(), NOW).unwrap_err(),
        Rejected::UnknownKey
    );
    // The payload changed after signing.
    let t = k.sign(&claims());
    let parts: Vec<&str> = t.split('.').collect();
    let other = k.sign(&with(claims(), "sub", json!("mallory")));
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        other.split('.').nth(1).unwrap(),
        parts[2]
    );
    assert_eq!(
        verify(&forged, &ks, &config(), NOW).unwrap_err(),
        Rejected::Signature
    );
}

#[test]
fn none_and_hmac_are_refused_whatever_the_key_set_holds() {
    let k = TestKey::new("k1");
    use base64::Engine;
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims())
    );
    let e = verify(&none, &keys(&[&k]), &config(), NOW).unwrap_err();
    assert!(
        matches!(e, Rejected::Malformed | Rejected::Algorithm),
        "{e:?}"
    );
    // An HMAC token "signed" with a secret a forger published as an `oct`
    // key in a set: the key is not taken, the algorithm not either.
    let secret = b"published";
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &claims(),
        &jsonwebtoken::EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap();
    let set = json!({"keys": [{"kty": "oct", "k": "cHVibGlzaGVk", "alg": "HS256"}]});
    let ks = KeySet::parse(set.to_string().as_bytes()).unwrap();
    assert!(ks.is_empty(), "a symmetric key is no verification key");
    assert_eq!(
        verify(&hs, &ks, &config(), NOW).unwrap_err(),
        Rejected::Algorithm
    );
    assert_eq!(
        verify("a.b", &ks, &config(), NOW).unwrap_err(),
        Rejected::Malformed
    );
    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    assert_eq!(
        verify(&huge, &ks, &config(), NOW).unwrap_err(),
        Rejected::Malformed
    );
}

#[test]
fn a_key_set_keeps_the_signing_keys_it_can_use_and_drops_the_rest() {
    let k = TestKey::new("k1");
    let mut enc = k.jwk();
    enc["use"] = json!("enc");
    enc["kid"] = json!("e1");
    let set =
        json!({"keys": [k.jwk(), enc, {"kty": "weird", "kid": "w"}, {"kty": "oct", "k": "AAAA"}]});
    let ks = KeySet::parse(set.to_string().as_bytes()).unwrap();
    assert_eq!(ks.len(), 1);
    assert!(ks.has("k1") && !ks.has("e1") && !ks.has("w"));
    assert!(KeySet::parse(b"{\"nokeys\": 1}").is_err());
}

#[test]
fn no_refusal_repeats_the_token() {
    let k = TestKey::new("k1");
    let t = k.sign(&with(claims(), "sub", json!("")));
    for e in [
        verify(&t, &keys(&[&k]), &config(), NOW).unwrap_err(),
        Rejected::Signature,
        Rejected::UnknownKey,
    ] {
        let text = e.to_string();
        assert!(
            !text.contains(&t[..20]) && !text.contains("alice"),
            "{text}"
        );
    }
}
