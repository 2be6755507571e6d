//! The flows against a loopback fake where the conformance suite cannot
//! reach: metadata for another resource, an endpoint over plain http to
//! another host, a redirect that is not the answer to this flow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A server answering each path with its JSON (404 otherwise), recording
/// the paths asked for. Stops when the test's runtime does.
async fn fake(
    routes: impl Fn(&str) -> HashMap<String, String>,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let routes = routes(&base);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = head.split(' ').nth(1).unwrap_or("").to_string();
            log.lock().unwrap().push(path.clone());
            let (status, body) = match routes.get(&path) {
                Some(b) => ("200 OK", b.clone()),
                None => ("404 Not Found", "{}".to_string()),
            };
            let _ = sock
                .write_all(
                    format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    (base, seen)
}

fn settings() -> Settings {
    let o: McpOAuth = serde_json::from_value(serde_json::json!({
        "grant": "client-credentials",
        "clientId": {"literal": "c1"},
        "clientSecret": {"literal": "s3cr3t"},
    }))
    .unwrap();
    Settings::new(
        &o,
        Some("c1".into()),
        Some(SecretString::new("s3cr3t")),
        None,
    )
    .unwrap()
}

#[tokio::test]
async fn metadata_for_another_resource_is_refused_before_any_token_request() {
    let (base, seen) = fake(|base| {
        HashMap::from([(
            "/.well-known/oauth-protected-resource/mcp".to_string(),
            serde_json::json!({"resource": "https://evil.example.com/mcp",
                "authorization_servers": [base]})
            .to_string(),
        )])
    })
    .await;
    let oauth = OAuth::new("billing", &format!("{base}/mcp"), settings(), None).unwrap();
    let err = oauth.unauthorized(Some("Bearer"), None).await.unwrap_err();
    assert!(matches!(err, OAuthError::ResourceMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("https://evil.example.com/mcp"),
        "{err}"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, ["/.well-known/oauth-protected-resource/mcp"]);
}

#[tokio::test]
async fn a_token_endpoint_over_plain_http_to_another_host_is_refused() {
    let (base, seen) = fake(|base| {
        HashMap::from([
            (
                "/.well-known/oauth-protected-resource/mcp".to_string(),
                serde_json::json!({"resource": format!("{base}/mcp"),
                    "authorization_servers": [base]})
                .to_string(),
            ),
            (
                "/.well-known/oauth-authorization-server".to_string(),
                serde_json::json!({"issuer": base,
                    "token_endpoint": "http://auth.example.com/token",
                    "code_challenge_methods_supported": ["S256"]})
                .to_string(),
            ),
        ])
    })
    .await;
    let oauth = OAuth::new("billing", &format!("{base}/mcp"), settings(), None).unwrap();
    let err = oauth.unauthorized(None, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            OAuthError::Insecure {
                what: "the token endpoint",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("http://auth.example.com/token"),
        "{err}"
    );
    // Nothing was sent to it (it is not this fake, and no request left).
    assert!(!seen.lock().unwrap().iter().any(|p| p == "/token"));
    // Nor is a server URL over plain http to another host taken.
    let e = OAuth::new("billing", "http://mcp.example.com/mcp", settings(), None).err();
    assert!(matches!(e, Some(OAuthError::Insecure { .. })));
}

#[test]
fn the_redirect_must_answer_this_flow() {
    let r = "http://localhost/oauth/callback";
    assert_eq!(
        code_of("http://localhost/oauth/callback?code=abc&state=s1", r, "s1").unwrap(),
        "abc"
    );
    let wrong_state = code_of("http://localhost/oauth/callback?code=abc&state=s2", r, "s1");
    assert!(matches!(wrong_state, Err(OAuthError::Redirect(_))));
    let elsewhere = code_of(
        "http://evil.example/oauth/callback?code=abc&state=s1",
        r,
        "s1",
    );
    assert!(matches!(elsewhere, Err(OAuthError::Redirect(_))));
    let denied = code_of(
        "http://localhost/oauth/callback?error=access_denied&state=s1",
        r,
        "s1",
    )
    .unwrap_err();
    assert!(denied.to_string().contains("access_denied"), "{denied}");
    assert!(matches!(
        code_of("not a url", r, "s1"),
        Err(OAuthError::Redirect(_))
    ));
}

#[test]
fn basic_credentials_are_percent_encoded() {
    assert_eq!(pct("id:with space/é"), "id%3Awith%20space%2F%C3%A9");
    assert_eq!(
        union(&["a".into(), "b".into()], &["b".into(), "c".into()]),
        ["a", "b", "c"]
    );
}

/// An MCP server's metadata naming the authorization server at `auth`,
/// and that server's metadata and token endpoint.
async fn split_pair() -> (
    String,
    String,
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<Vec<String>>>,
) {
    let (auth, auth_seen) = fake(|base| {
        HashMap::from([
            (
                "/.well-known/oauth-authorization-server".to_string(),
                serde_json::json!({"issuer": base, "token_endpoint": format!("{base}/token")})
                    .to_string(),
            ),
            (
                "/token".to_string(),
                serde_json::json!({"access_token": "at-1", "token_type": "Bearer"}).to_string(),
            ),
        ])
    })
    .await;
    let named = auth.clone();
    let (mcp, mcp_seen) = fake(move |base| {
        HashMap::from([(
            "/.well-known/oauth-protected-resource/mcp".to_string(),
            serde_json::json!({"resource": format!("{base}/mcp"),
                "authorization_servers": [named]})
            .to_string(),
        )])
    })
    .await;
    (mcp, auth, mcp_seen, auth_seen)
}

fn settings_with_issuer(issuer: Option<&str>) -> Settings {
    let mut s = settings();
    s.issuer = issuer.map(String::from);
    s
}

#[tokio::test]
async fn a_credential_goes_to_no_authorization_server_on_another_origin_unless_pinned() {
    let (mcp, auth, _, auth_seen) = split_pair().await;
    let oauth = OAuth::new("billing", &format!("{mcp}/mcp"), settings(), None).unwrap();
    let err = oauth.unauthorized(None, None).await.unwrap_err();
    assert!(matches!(err, OAuthError::ForeignIssuer { .. }), "{err}");
    assert!(err.to_string().contains("oauth.issuer"), "{err}");
    assert!(err.to_string().contains(&auth), "{err}");
    assert!(!auth_seen.lock().unwrap().iter().any(|p| p == "/token"));
}

#[tokio::test]
async fn a_pinned_issuer_must_be_the_discovered_one() {
    let (mcp, auth, _, auth_seen) = split_pair().await;
    let other = "https://auth.example.com";
    let oauth = OAuth::new(
        "billing",
        &format!("{mcp}/mcp"),
        settings_with_issuer(Some(other)),
        None,
    )
    .unwrap();
    let err = oauth.unauthorized(None, None).await.unwrap_err();
    assert!(matches!(err, OAuthError::IssuerNotPinned { .. }), "{err}");
    assert!(
        err.to_string().contains(other) && err.to_string().contains(&auth),
        "{err}"
    );
    assert!(!auth_seen.lock().unwrap().iter().any(|p| p == "/token"));

    // Pinned to it, the same server gets the credential.
    let oauth = OAuth::new(
        "billing",
        &format!("{mcp}/mcp"),
        settings_with_issuer(Some(&auth)),
        None,
    )
    .unwrap();
    let token = oauth.unauthorized(None, None).await.unwrap();
    assert_eq!(token.expose(), "at-1");
    assert!(auth_seen.lock().unwrap().iter().any(|p| p == "/token"));
}

/// A server `E` that would take a credential: its token endpoint, and what
/// it was asked.
async fn collector() -> (String, Arc<Mutex<Vec<String>>>) {
    fake(|_| {
        HashMap::from([(
            "/token".to_string(),
            serde_json::json!({"access_token": "stolen", "token_type": "Bearer"}).to_string(),
        )])
    })
    .await
}

/// An MCP server whose only metadata is its origin's RFC 8414 document
/// (a 2025-03-26 server), claiming `issuer` and `token_endpoint`.
async fn legacy_mcp(issuer: String, token: String) -> String {
    let (mcp, _) = fake(move |_| {
        HashMap::from([(
            "/.well-known/oauth-authorization-server".to_string(),
            serde_json::json!({"issuer": issuer, "token_endpoint": token}).to_string(),
        )])
    })
    .await;
    mcp
}

/// A 2025-03-26 server's metadata is its origin's word about itself: it
/// is trusted as that origin whatever issuer it claims to be (the pinned
/// one, another), so it cannot send the credential to another origin.
#[tokio::test]
async fn a_legacy_servers_metadata_sends_no_credential_off_its_origin() {
    let (elsewhere, seen) = collector().await;
    let pinned = "http://127.0.0.1:9/realms/trusted";
    let cases = [
        // It claims to be the pinned server, its token endpoint elsewhere.
        (
            pinned.to_string(),
            format!("{elsewhere}/token"),
            Some(pinned),
        ),
        // It claims to be another server, unpinned.
        (elsewhere.clone(), format!("{elsewhere}/token"), None),
    ];
    for (issuer, token, pin) in cases {
        let mcp = legacy_mcp(issuer, token).await;
        let oauth = OAuth::new(
            "billing",
            &format!("{mcp}/mcp"),
            settings_with_issuer(pin),
            None,
        )
        .unwrap();
        let err = oauth.unauthorized(None, None).await.unwrap_err();
        assert!(
            matches!(
                err,
                OAuthError::IssuerNotPinned { .. } | OAuthError::ForeignTokenEndpoint { .. }
            ),
            "{err}"
        );
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

/// Unpinned, a client with a credential sends it only to a token endpoint
/// on the MCP server's own origin, whichever metadata names another.
#[tokio::test]
async fn a_credential_goes_to_no_token_endpoint_on_another_origin_unless_pinned() {
    let (elsewhere, seen) = collector().await;
    let token = format!("{elsewhere}/token");
    // A 2025-03-26 server naming itself, its token endpoint elsewhere.
    let t = token.clone();
    let (legacy, _) = fake(move |base| {
        HashMap::from([(
            "/.well-known/oauth-authorization-server".to_string(),
            serde_json::json!({"issuer": base, "token_endpoint": t}).to_string(),
        )])
    })
    .await;
    // A current one: its resource metadata names itself as authorization
    // server, whose metadata names the token endpoint elsewhere.
    let t = token.clone();
    let (current, _) = fake(move |base| {
        HashMap::from([
            (
                "/.well-known/oauth-protected-resource/mcp".to_string(),
                serde_json::json!({"resource": format!("{base}/mcp"), "authorization_servers": [base]})
                    .to_string(),
            ),
            (
                "/.well-known/oauth-authorization-server".to_string(),
                serde_json::json!({"issuer": base, "token_endpoint": t}).to_string(),
            ),
        ])
    })
    .await;
    for mcp in [legacy, current] {
        let oauth = OAuth::new("billing", &format!("{mcp}/mcp"), settings(), None).unwrap();
        let err = oauth.unauthorized(None, None).await.unwrap_err();
        assert!(
            matches!(err, OAuthError::ForeignTokenEndpoint { .. }),
            "{mcp}: {err}"
        );
        assert!(err.to_string().contains("oauth.issuer"), "{err}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

/// A server answering each path with its JSON (404 otherwise), recording
/// each request's path and body.
async fn recording(
    routes: impl Fn(&str) -> HashMap<String, String>,
) -> (String, Arc<Mutex<Vec<(String, String)>>>) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let routes = Arc::new(routes(&base));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (routes, log) = (routes.clone(), log.clone());
            tokio::spawn(async move {
                let mut sock = BufReader::new(sock);
                let mut first = String::new();
                sock.read_line(&mut first).await.unwrap_or(0);
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    sock.read_line(&mut line).await.unwrap_or(0);
                    let line = line.trim_end().to_ascii_lowercase();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; len];
                sock.read_exact(&mut body).await.unwrap();
                let path = first.split(' ').nth(1).unwrap_or("").to_string();
                let path = path.split('?').next().unwrap_or("").to_string();
                log.lock()
                    .unwrap()
                    .push((path.clone(), String::from_utf8_lossy(&body).to_string()));
                let (status, body) = match routes.get(&path) {
                    Some(b) => ("200 OK", b.clone()),
                    None => ("404 Not Found", "{}".to_string()),
                };
                let _ = sock
                    .get_mut()
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (base, seen)
}

/// An MCP server and its authorization server on one origin, for a
/// person's connection: consent, token, revocation.
fn person_routes(base: &str) -> HashMap<String, String> {
    HashMap::from([
        (
            "/.well-known/oauth-protected-resource/mcp".to_string(),
            serde_json::json!({"resource": format!("{base}/mcp"), "authorization_servers": [base]})
                .to_string(),
        ),
        (
            "/.well-known/oauth-authorization-server".to_string(),
            serde_json::json!({"issuer": base,
                "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": format!("{base}/token"),
                "revocation_endpoint": format!("{base}/revoke"),
                "code_challenge_methods_supported": ["S256"],
                "scopes_supported": ["crm.read", "offline_access"]})
            .to_string(),
        ),
        (
            "/token".to_string(),
            serde_json::json!({"access_token": "at-9", "token_type": "Bearer",
                "refresh_token": "rt-9", "expires_in": 3600})
            .to_string(),
        ),
        ("/revoke".to_string(), "{}".to_string()),
    ])
}

fn person_settings() -> Settings {
    let o: McpOAuth = serde_json::from_value(serde_json::json!({
        "grant": "authorization-code",
        "clientId": {"literal": "c1"},
        "scopes": ["crm.read"],
        "redirectUri": "https://agents.example.com/v1/oauth/callback",
    }))
    .unwrap();
    Settings::new(&o, Some("c1".into()), None, None).unwrap()
}

fn form(body: &str) -> HashMap<String, String> {
    form_urlencoded::parse(body.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

#[tokio::test]
async fn a_persons_consent_uses_the_callers_state_and_verifier_and_its_code_is_redeemed() {
    let (base, seen) = recording(person_routes).await;
    let oauth = OAuth::new("crm", &format!("{base}/mcp"), person_settings(), None).unwrap();
    let verifier = "v".repeat(43);
    let (url, scopes) = oauth.consent_url("st-1", &verifier).await.unwrap();
    let url = Url::parse(&url).unwrap();
    assert_eq!(url.path(), "/authorize");
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert_eq!(q["state"], "st-1");
    assert_eq!(q["code_challenge"], pkce::challenge(&verifier));
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(q["resource"], format!("{base}/mcp"));
    assert_eq!(
        q["redirect_uri"],
        "https://agents.example.com/v1/oauth/callback"
    );
    assert_eq!(q["scope"], "crm.read offline_access");
    assert_eq!(scopes, ["crm.read", "offline_access"]);

    let granted = oauth.redeem("code-1", &verifier, scopes).await.unwrap();
    assert_eq!(granted.access.expose(), "at-9");
    assert_eq!(granted.refresh.as_ref().map(|r| r.expose()), Some("rt-9"));
    let token = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| p == "/token")
        .cloned()
        .unwrap();
    let f = form(&token.1);
    assert_eq!(f["grant_type"], "authorization_code");
    assert_eq!(f["code"], "code-1");
    assert_eq!(f["code_verifier"], verifier);
    assert_eq!(f["resource"], format!("{base}/mcp"));
    assert_eq!(oauth.token().await.unwrap().unwrap().expose(), "at-9");

    // Revoked at the server's revocation endpoint (RFC 7009).
    assert!(oauth.revoke(&SecretString::new("rt-9")).await.unwrap());
    let revoke = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| p == "/revoke")
        .cloned()
        .unwrap();
    let f = form(&revoke.1);
    assert_eq!(f["token"], "rt-9");
    assert_eq!(f["token_type_hint"], "refresh_token");
}

#[tokio::test]
async fn a_kept_grant_is_refreshed_at_first_use_and_its_rotation_kept() {
    let (base, seen) = recording(person_routes).await;
    let oauth = OAuth::new("crm", &format!("{base}/mcp"), person_settings(), None).unwrap();
    oauth
        .resume(SecretString::new("rt-old"), vec!["crm.read".into()])
        .await
        .unwrap();
    assert_eq!(oauth.token().await.unwrap().unwrap().expose(), "at-9");
    let token = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| p == "/token")
        .cloned()
        .unwrap();
    let f = form(&token.1);
    assert_eq!(f["grant_type"], "refresh_token");
    assert_eq!(f["refresh_token"], "rt-old");
    // The server rotated it: the new one is what is kept.
    assert_eq!(oauth.refresh_token().await.unwrap().expose(), "rt-9");
}
