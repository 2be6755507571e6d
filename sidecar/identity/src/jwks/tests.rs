use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::*;
use crate::testkeys::TestKey;

/// An issuer on loopback: its discovery document and its JWKS, which a
/// test changes, and how often each was asked for.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<Value>>,
    discovery_issuer: Arc<Mutex<Option<String>>>,
    hits: Arc<AtomicUsize>,
    status: Arc<Mutex<u16>>,
}

#[derive(Clone)]
struct S {
    base: String,
    jwks: Arc<Mutex<Value>>,
    discovery_issuer: Arc<Mutex<Option<String>>>,
    hits: Arc<AtomicUsize>,
    status: Arc<Mutex<u16>>,
}

async fn issuer(keys: &[&TestKey]) -> Issuer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/realms/acme", listener.local_addr().unwrap());
    let s = S {
        base: base.clone(),
        jwks: Arc::new(Mutex::new(TestKey::jwks(keys))),
        discovery_issuer: Arc::new(Mutex::new(None)),
        hits: Arc::new(AtomicUsize::new(0)),
        status: Arc::new(Mutex::new(200)),
    };
    let app = Router::new()
        .route(
            "/realms/acme/.well-known/openid-configuration",
            get(|State(s): State<S>| async move {
                let iss = s
                    .discovery_issuer
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or(s.base.clone());
                Json(json!({"issuer": iss, "jwks_uri": format!("{}/certs", s.base)}))
            }),
        )
        .route(
            "/realms/acme/certs",
            get(|State(s): State<S>| async move {
                s.hits.fetch_add(1, Ordering::SeqCst);
                let status = *s.status.lock().unwrap();
                let body = s.jwks.lock().unwrap().clone();
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    Json(body),
                )
            }),
        )
        .with_state(s.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Issuer {
        url: base,
        jwks: s.jwks,
        discovery_issuer: s.discovery_issuer,
        hits: s.hits,
        status: s.status,
    }
}

fn config(iss: &Issuer, min_refetch: Duration) -> IdentityConfig {
    let mut c = IdentityConfig::new(&iss.url, vec!["bindery".into()]).unwrap();
    c.min_refetch = min_refetch;
    c
}

#[tokio::test]
async fn keys_are_found_through_discovery_and_kept() {
    let k1 = TestKey::new("k1");
    let iss = issuer(&[&k1]).await;
    let jwks = Jwks::new(config(&iss, Duration::from_secs(60))).unwrap();
    assert!(jwks.keys(Some("k1")).await.unwrap().has("k1"));
    assert!(jwks.keys(Some("k1")).await.unwrap().has("k1"));
    assert!(jwks.keys(None).await.unwrap().has("k1"));
    assert_eq!(
        iss.hits.load(Ordering::SeqCst),
        1,
        "kept, not fetched again"
    );
}

#[tokio::test]
async fn a_token_naming_a_new_key_fetches_the_rotated_set_once() {
    let (k1, k2) = (TestKey::new("k1"), TestKey::new("k2"));
    let iss = issuer(&[&k1]).await;
    let jwks = Jwks::new(config(&iss, Duration::ZERO)).unwrap();
    assert!(!jwks.keys(Some("k1")).await.unwrap().has("k2"));
    *iss.jwks.lock().unwrap() = TestKey::jwks(&[&k1, &k2]);
    assert!(jwks.keys(Some("k2")).await.unwrap().has("k2"), "rotated");
    assert_eq!(iss.hits.load(Ordering::SeqCst), 2);
    // Tokens naming the new key now use the kept set.
    jwks.keys(Some("k2")).await.unwrap();
    assert_eq!(iss.hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn forged_key_ids_do_not_become_a_stream_of_fetches() {
    let k1 = TestKey::new("k1");
    let iss = issuer(&[&k1]).await;
    let every = Duration::from_millis(200);
    let jwks = Arc::new(Jwks::new(config(&iss, every)).unwrap());
    jwks.keys(Some("k1")).await.unwrap();
    let started = Instant::now();
    // Forty forged ids at once: they wait for one fetch together.
    let forged: Vec<_> = (0..40)
        .map(|i| {
            let jwks = jwks.clone();
            tokio::spawn(async move { jwks.keys(Some(&format!("forged-{i}"))).await })
        })
        .collect();
    for f in forged {
        assert!(f.await.unwrap().unwrap().has("k1"));
    }
    let fetches = iss.hits.load(Ordering::SeqCst) - 1;
    let windows = started.elapsed().as_millis() / every.as_millis() + 1;
    assert!(
        fetches as u128 <= windows,
        "{fetches} fetches in {windows} windows of {every:?}"
    );
    assert!(fetches >= 1, "a new id was looked for");
}

#[tokio::test]
async fn an_outage_keeps_the_fetched_keys_and_a_first_fetch_fails_clearly() {
    let k1 = TestKey::new("k1");
    let iss = issuer(&[&k1]).await;
    let jwks = Jwks::new(config(&iss, Duration::ZERO)).unwrap();
    jwks.keys(Some("k1")).await.unwrap();
    *iss.status.lock().unwrap() = 503;
    assert!(
        jwks.keys(Some("k-new")).await.unwrap().has("k1"),
        "kept through the outage"
    );
    let fresh = Jwks::new(config(&iss, Duration::ZERO)).unwrap();
    let e = fresh.keys(Some("k1")).await.unwrap_err();
    assert!(matches!(e, FetchError::Status { status: 503, .. }), "{e}");
}

#[tokio::test]
async fn a_discovery_document_for_another_issuer_is_refused() {
    let k1 = TestKey::new("k1");
    let iss = issuer(&[&k1]).await;
    *iss.discovery_issuer.lock().unwrap() = Some("https://evil.example".into());
    let jwks = Jwks::new(config(&iss, Duration::ZERO)).unwrap();
    let e = jwks.keys(Some("k1")).await.unwrap_err();
    assert!(matches!(e, FetchError::OtherIssuer { .. }), "{e}");
    assert_eq!(
        iss.hits.load(Ordering::SeqCst),
        0,
        "no keys fetched from it"
    );
}

#[tokio::test]
async fn an_issuer_that_does_not_answer_is_named() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/r", listener.local_addr().unwrap());
    drop(listener);
    let jwks = Jwks::new(IdentityConfig::new(&url, vec!["b".into()]).unwrap()).unwrap();
    let e = jwks.keys(None).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("/r/.well-known/openid-configuration"),
        "{e}"
    );
}
