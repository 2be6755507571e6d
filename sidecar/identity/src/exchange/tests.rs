use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::*;

/// An issuer whose token endpoint exchanges `user-token-<sub>` for
/// `<audience>-for-<sub>`, for the client `bindery` with secret `s3cret`
/// only, refusing the audience `forbidden`.
async fn issuer() -> (IdentityConfig, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/r", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let doc = json!({"issuer": base, "jwks_uri": format!("{base}/certs"),
                     "token_endpoint": format!("{base}/token")});
    let app = Router::new()
        .route("/r/.well-known/openid-configuration", get(move || async move { Json(doc) }))
        .route(
            "/r/token",
            post(move |headers: HeaderMap, body: String| {
                let hits = counted.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let form: HashMap<String, String> =
                        form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                    // `bindery:s3cret`, as HTTP Basic.
                    let basic = headers["authorization"].to_str().unwrap();
                    if basic != "Basic YmluZGVyeTpzM2NyZXQ=" {
                        return (StatusCode::UNAUTHORIZED, Json(json!({"error": "invalid_client"})));
                    }
                    assert_eq!(form["grant_type"], GRANT_TYPE);
                    assert_eq!(form["subject_token_type"], ACCESS_TOKEN_TYPE);
                    let sub = form["subject_token"].strip_prefix("user-token-").unwrap().to_string();
                    let aud = &form["audience"];
                    if aud == "forbidden" {
                        return (
                            StatusCode::BAD_REQUEST,
                            Json(json!({"error": "access_denied", "error_description": "client not allowed"})),
                        );
                    }
                    let scope = form.get("scope").cloned().unwrap_or_default();
                    (
                        StatusCode::OK,
                        Json(json!({"access_token": format!("{aud}-for-{sub}{scope}"),
                                    "issued_token_type": ACCESS_TOKEN_TYPE,
                                    "token_type": "Bearer", "expires_in": 300})),
                    )
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (
        IdentityConfig::new(&base, vec!["chat".into()]).unwrap(),
        hits,
    )
}

fn client(secret: &str) -> ExchangeClient {
    ExchangeClient {
        client_id: "bindery".into(),
        client_secret: SecretString::new(secret),
        token_url: None,
    }
}

fn want(aud: &str) -> TokenExchange {
    TokenExchange {
        audience: aud.into(),
        scopes: vec![],
    }
}

fn user(sub: &str) -> (Subject, SecretString) {
    (
        Subject::new(sub).unwrap(),
        SecretString::new(format!("user-token-{sub}")),
    )
}

#[tokio::test]
async fn a_token_is_exchanged_once_per_subject_and_audience() {
    let (config, hits) = issuer().await;
    let x = Exchanger::new(config, client("s3cret")).unwrap();
    let (alice, alice_token) = user("alice");
    let t = x
        .exchange(&alice, &alice_token, &want("billing"))
        .await
        .unwrap();
    assert_eq!(t.expose(), "billing-for-alice");
    let again = x
        .exchange(&alice, &alice_token, &want("billing"))
        .await
        .unwrap();
    assert_eq!(again.expose(), "billing-for-alice");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "kept");
    // Another audience, another exchange; another subject never gets
    // Alice's token, even from the cache.
    assert_eq!(
        x.exchange(&alice, &alice_token, &want("crm"))
            .await
            .unwrap()
            .expose(),
        "crm-for-alice"
    );
    let (bob, bob_token) = user("bob");
    assert_eq!(
        x.exchange(&bob, &bob_token, &want("billing"))
            .await
            .unwrap()
            .expose(),
        "billing-for-bob"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let scoped = TokenExchange {
        audience: "billing".into(),
        scopes: vec!["invoices.read".into()],
    };
    assert_eq!(
        x.exchange(&alice, &alice_token, &scoped)
            .await
            .unwrap()
            .expose(),
        "billing-for-aliceinvoices.read"
    );
    x.forget(&alice);
    x.exchange(&alice, &alice_token, &want("billing"))
        .await
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 5, "forgotten, exchanged again");
}

#[tokio::test]
async fn a_refusal_names_the_audience_and_the_providers_reason_never_the_token() {
    let (config, _) = issuer().await;
    let x = Exchanger::new(config.clone(), client("s3cret")).unwrap();
    let (alice, token) = user("alice");
    let e = x
        .exchange(&alice, &token, &want("forbidden"))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("`forbidden`") && text.contains("access_denied"),
        "{text}"
    );
    assert!(!text.contains("user-token"), "{text}");
    let wrong = Exchanger::new(config, client("nope")).unwrap();
    let e = wrong
        .exchange(&alice, &token, &want("billing"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid_client"), "{e}");
}
