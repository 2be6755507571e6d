//! The identity server harness (bindery_tests::idp) against the real
//! Keycloak: every capability the identity tests rely on, shown done by the
//! server and refused where it must be.

use std::time::Duration;

use bindery_tests::eventually::eventually_or;
use bindery_tests::idp::jwt::{self, JwtError};
use bindery_tests::idp::{query_param, Client, ClientAuth, Credentials, Idp, Pkce};

const APP_REDIRECT: &str = "http://127.0.0.1:9/callback";

#[tokio::test]
async fn tokens_verify_against_the_jwks_and_a_rotated_key_has_a_new_kid_in_it() {
    let idp = Idp::shared();
    let realm = idp
        .realm("keys")
        .user("alice", "alice-password")
        .client(Client::public("app", APP_REDIRECT))
        .create()
        .await;
    let tokens = realm.user_token("alice", "app", &[]).await;
    let claims = realm.verify(&tokens.access_token).await.unwrap();
    assert_eq!(claims["iss"], idp.issuer(realm.name()));
    assert_eq!(claims["azp"], "app");
    assert_eq!(claims["preferred_username"], "alice");
    let id_token = tokens
        .id_token
        .as_deref()
        .expect("an id token (scope openid)");
    let id_claims = realm.verify(id_token).await.unwrap();
    assert_eq!(jwt::audiences(&id_claims), ["app"]);
    assert_eq!(id_claims["sub"], claims["sub"]);

    // A changed claim does not verify.
    let parts: Vec<&str> = tokens.access_token.split('.').collect();
    let mut forged_claims = claims.clone();
    forged_claims["preferred_username"] = "mallory".into();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        base64_url(&forged_claims.to_string()),
        parts[2]
    );
    assert!(matches!(
        jwt::verify(&forged, &realm.jwks().await),
        Err(JwtError::BadSignature { .. })
    ));

    // Rotation: a new kid signs, the JWKS holds both, the old token still
    // verifies until its key is retired.
    let old_kid = jwt::header(&tokens.access_token).unwrap()["kid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(realm.signing_kid().await, old_kid);
    let new_kid = realm.rotate_signing_key().await;
    assert_ne!(new_kid, old_kid);
    let kids = jwks_kids(&realm.jwks().await);
    assert!(
        kids.contains(&old_kid) && kids.contains(&new_kid),
        "{kids:?}"
    );
    let rotated = realm.user_token("alice", "app", &[]).await;
    assert_eq!(
        jwt::header(&rotated.access_token).unwrap()["kid"],
        new_kid.as_str()
    );
    realm.verify(&rotated.access_token).await.unwrap();
    realm.verify(&tokens.access_token).await.unwrap();

    realm.retire_signing_key(&old_kid).await;
    let kids = jwks_kids(&realm.jwks().await);
    assert!(
        !kids.contains(&old_kid) && kids.contains(&new_kid),
        "{kids:?}"
    );
    assert_eq!(
        jwt::verify(&tokens.access_token, &realm.jwks().await),
        Err(JwtError::UnknownKey(Some(old_kid)))
    );
    realm.verify(&rotated.access_token).await.unwrap();
}

#[tokio::test]
async fn client_credentials_with_each_authentication_method_and_wrong_ones_refused() {
    let idp = Idp::shared();
    let realm = idp
        .realm("clients")
        .client(Client::confidential("basic", ClientAuth::SecretBasic))
        .client(Client::confidential("post", ClientAuth::SecretPost))
        .client(Client::confidential("jwt", ClientAuth::PrivateKeyJwt))
        .create()
        .await;
    for client in ["basic", "post", "jwt"] {
        let tokens = realm
            .client_credentials(client, &[])
            .await
            .unwrap_or_else(|e| panic!("{client}'s client credentials: {e}"));
        let claims = realm.verify(&tokens.access_token).await.unwrap();
        assert_eq!(claims["azp"], client);
        assert_eq!(
            tokens.refresh_token, None,
            "{client}: no refresh token for a client"
        );

        let wrong = realm.credentials(client).wrong();
        let refused = realm
            .token_request(&wrong, &[("grant_type", "client_credentials")])
            .await
            .expect_err("a wrong secret or key is refused");
        assert_client_refused(&refused, client);
        // Nothing at all: refused too.
        let anonymous = Credentials::Public {
            client_id: client.to_string(),
        };
        let refused = realm
            .token_request(&anonymous, &[("grant_type", "client_credentials")])
            .await
            .expect_err("a confidential client without its secret or key is refused");
        assert_client_refused(&refused, client);
    }
    // The test holds the private_key_jwt client's key as PEM.
    let key = realm.credentials("jwt");
    let pem = key.key().unwrap().private_key_pem();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
}

#[tokio::test]
async fn the_authorization_code_flow_needs_the_right_pkce_verifier_and_password() {
    let idp = Idp::shared();
    let realm = idp
        .realm("code")
        .user("alice", "alice-password")
        .scope("tools:write")
        .client(Client::public("app", APP_REDIRECT).optional_scope("tools:write"))
        .create()
        .await;
    let app = realm.credentials("app");

    // A wrong password: the login page again, no redirect.
    let pkce = Pkce::new();
    let url = realm.authorization_url("app", &[], &pkce, "s1");
    let refused = realm.login(&url, "alice", "wrong").await.unwrap_err();
    assert!(
        refused.says.contains("Invalid username or password"),
        "{refused}"
    );

    // The right one: a code, which a wrong verifier does not redeem.
    let back = realm.login(&url, "alice", "alice-password").await.unwrap();
    assert!(back.starts_with(APP_REDIRECT), "{back}");
    assert_eq!(query_param(&back, "state").as_deref(), Some("s1"));
    let code = query_param(&back, "code").expect("a code");
    let refused = realm
        .code_token(&app, &code, &Pkce::new().verifier)
        .await
        .unwrap_err();
    assert_eq!(refused.error, "invalid_grant", "{refused}");

    // A new login, the right verifier: tokens.
    let pkce = Pkce::new();
    let url = realm.authorization_url("app", &[], &pkce, "s2");
    let back = realm.login(&url, "alice", "alice-password").await.unwrap();
    let code = query_param(&back, "code").expect("a code");
    let tokens = realm.code_token(&app, &code, &pkce.verifier).await.unwrap();
    assert!(tokens.id_token.is_some() && tokens.refresh_token.is_some());
    assert!(!jwt::scopes(&tokens.claims()).contains(&"tools:write".to_string()));
    // A code is redeemed once.
    let again = realm
        .code_token(&app, &code, &pkce.verifier)
        .await
        .unwrap_err();
    assert_eq!(again.error, "invalid_grant", "{again}");

    // Without PKCE: refused (sent back to the client with an error).
    let no_pkce = url
        .split('&')
        .filter(|p| !p.starts_with("code_challenge"))
        .collect::<Vec<_>>()
        .join("&");
    let back = realm
        .login(&no_pkce, "alice", "alice-password")
        .await
        .unwrap();
    assert_eq!(
        query_param(&back, "error").as_deref(),
        Some("invalid_request"),
        "{back}"
    );

    // Step-up: the optional scope, when asked.
    let stepped = realm.user_token("alice", "app", &["tools:write"]).await;
    assert!(jwt::scopes(&stepped.claims()).contains(&"tools:write".to_string()));
    assert!(stepped.scope.split(' ').any(|s| s == "tools:write"));
}

#[tokio::test]
async fn a_refresh_token_works_until_revoked_or_its_session_is_logged_out() {
    let idp = Idp::shared();
    let realm = idp
        .realm("refresh")
        .user("alice", "alice-password")
        .client(Client::public("app", APP_REDIRECT))
        .create()
        .await;
    let app = realm.credentials("app");

    let tokens = realm.user_token("alice", "app", &[]).await;
    let refresh = tokens.refresh_token.clone().unwrap();
    let refreshed = realm.refresh(&app, &refresh).await.unwrap();
    realm.verify(&refreshed.access_token).await.unwrap();
    let latest = refreshed.refresh_token.clone().unwrap();
    realm.revoke(&app, &latest).await.unwrap();
    let refused = realm.refresh(&app, &latest).await.unwrap_err();
    assert_eq!(refused.error, "invalid_grant", "{refused}");

    // The administrator's logout ends the session too.
    let tokens = realm.user_token("alice", "app", &[]).await;
    let refresh = tokens.refresh_token.clone().unwrap();
    realm.refresh(&app, &refresh).await.unwrap();
    realm.logout("alice").await;
    let refused = realm.refresh(&app, &refresh).await.unwrap_err();
    assert_eq!(refused.error, "invalid_grant", "{refused}");
}

#[tokio::test]
async fn token_exchange_gives_the_target_audience_to_an_allowed_client_only() {
    let idp = Idp::shared();
    let realm = idp
        .realm("exchange")
        .user("alice", "alice-password")
        .client(
            Client::public("app", APP_REDIRECT)
                .audience("bindery")
                .audience("other"),
        )
        .client(
            Client::confidential("bindery", ClientAuth::SecretBasic)
                .token_exchange()
                .audience("tool-api"),
        )
        .client(Client::confidential("other", ClientAuth::SecretPost).audience("tool-api"))
        .client(Client::confidential("tool-api", ClientAuth::SecretBasic))
        .create()
        .await;
    let user = realm.user_token("alice", "app", &[]).await;
    let user_claims = user.claims();
    assert!(
        jwt::audiences(&user_claims).contains(&"bindery".to_string()),
        "{user_claims}"
    );

    let exchanged = realm
        .exchange(
            &realm.credentials("bindery"),
            &user.access_token,
            "tool-api",
            &[],
        )
        .await
        .unwrap();
    let claims = realm.verify(&exchanged.access_token).await.unwrap();
    assert_eq!(jwt::audiences(&claims), ["tool-api"], "{claims}");
    assert_eq!(claims["sub"], user_claims["sub"]);
    assert_eq!(claims["azp"], "bindery");

    // A client not allowed to exchange: refused, though the token names it.
    let refused = realm
        .exchange(
            &realm.credentials("other"),
            &user.access_token,
            "tool-api",
            &[],
        )
        .await
        .unwrap_err();
    assert!(refused.status >= 400, "{refused}");
    // An audience the exchanger's tokens may not carry: refused.
    let refused = realm
        .exchange(
            &realm.credentials("bindery"),
            &user.access_token,
            "app",
            &[],
        )
        .await
        .unwrap_err();
    assert!(refused.status >= 400, "{refused}");
    // The allowed client with a wrong secret: refused.
    let refused = realm
        .exchange(
            &realm.credentials("bindery").wrong(),
            &user.access_token,
            "tool-api",
            &[],
        )
        .await
        .unwrap_err();
    assert_client_refused(&refused, "bindery");
}

#[tokio::test]
async fn a_short_lived_access_token_expires_on_time() {
    // Seconds: long enough for a busy machine to ask UserInfo once before
    // the token expires (5 s was not, at a load average of 10), short
    // enough to wait for.
    const LIFESPAN: u64 = 15;
    let idp = Idp::shared();
    let realm = idp
        .realm("expiry")
        .user("alice", "alice-password")
        .client(
            Client::public("app", APP_REDIRECT)
                .access_token_lifespan(Duration::from_secs(LIFESPAN)),
        )
        .create()
        .await;
    let tokens = realm.user_token("alice", "app", &[]).await;
    let claims = tokens.claims();
    let (iat, exp) = (
        claims["iat"].as_u64().unwrap(),
        claims["exp"].as_u64().unwrap(),
    );
    assert_eq!(exp - iat, LIFESPAN, "{claims}");
    assert_eq!(tokens.expires_in, LIFESPAN);
    let asked = jwt::now();
    if let Err(refused) = realm.userinfo(&tokens.access_token).await {
        panic!("the fresh token is refused ({refused}), asked at {asked}, its exp {exp}");
    }
    let refused = eventually_or(
        "the access token refused",
        Duration::from_secs(LIFESPAN + 45),
        async || match realm.userinfo(&tokens.access_token).await {
            Err(refused) => Ok(refused),
            Ok(_) => Err(format!("still taken at {}", jwt::now())),
        },
    )
    .await;
    assert_eq!(refused.status, 401, "{refused}");
    assert!(jwt::now() >= exp, "refused before its exp {exp}");
    // The refresh token still gets a new one.
    let refreshed = realm
        .refresh(
            &realm.credentials("app"),
            tokens.refresh_token.as_deref().unwrap(),
        )
        .await
        .unwrap();
    realm.userinfo(&refreshed.access_token).await.unwrap();
}

/// A failed client authentication: 401 (400 for a bad assertion, which
/// RFC 6749 allows when no Authorization header was sent), and
/// `unauthorized_client` where RFC 6749 says `invalid_client` for a wrong
/// or missing secret (Keycloak 26.7's word for it).
fn assert_client_refused(refused: &bindery_tests::idp::OAuthError, client: &str) {
    assert!(
        [400, 401].contains(&refused.status)
            && ["invalid_client", "unauthorized_client"].contains(&refused.error.as_str()),
        "{client}: {refused}"
    );
}

fn jwks_kids(jwks: &serde_json::Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["kid"].as_str().map(str::to_string))
        .collect()
}

fn base64_url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}
