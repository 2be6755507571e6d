use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::credentials::testing::{closed_port, http, Answer, MapEnv, Seen, Server};
use crate::credentials::testing::{TestClock, TokenFile};

const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
const TENANT: &str = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
/// A projected token: its claims segment long enough to be scrubbed alone.
const ASSERTION: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJpc3MiOiJodHRwczovL29pZGMuZXhhbXBsZSIsInN1YiI6InN5c3RlbTpzZXJ2aWNlYWNjb3VudDphZ2VudHM6aW52b2ljZXMifQ.c2lnbmF0dXJlLWNhbmFyeQ";

fn vars<'a>(file: &'a str, authority: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("AZURE_CLIENT_ID", CLIENT),
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_FEDERATED_TOKEN_FILE", file),
        ("AZURE_AUTHORITY_HOST", authority),
    ]
}

#[test]
fn the_missing_variables_are_named() {
    let e = EntraToken::from_env(MapEnv::of(&[("AZURE_TENANT_ID", TENANT)])).unwrap_err();
    assert!(matches!(e, LlmError::Config(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("AZURE_CLIENT_ID, AZURE_FEDERATED_TOKEN_FILE not set"),
        "{text}"
    );
    assert!(text.contains("azure.workload.identity/use"), "{text}");
}

#[test]
fn the_token_url_is_the_tenants_at_the_authority() {
    let at = |authority: &str| {
        let mut v = vars("/t", authority);
        if authority.is_empty() {
            v.pop();
        }
        EntraToken::from_env(MapEnv::of(&v)).map(|t| t.url.to_string())
    };
    assert_eq!(
        at("").unwrap(),
        format!("https://login.microsoftonline.com/{TENANT}/oauth2/v2.0/token")
    );
    assert_eq!(
        at("https://login.microsoftonline.us").unwrap(),
        format!("https://login.microsoftonline.us/{TENANT}/oauth2/v2.0/token")
    );
    assert_eq!(
        at("http://127.0.0.1:8080/prefix").unwrap(),
        format!("http://127.0.0.1:8080/prefix/{TENANT}/oauth2/v2.0/token")
    );
    let e = at("http://login.example/").unwrap_err().to_string();
    assert!(e.contains("is not https"), "{e}");
    // Not even the Pod Identity agent's address: that is AWS's.
    assert!(at("http://169.254.170.23/").is_err());
    let mut v = vars("/t", "https://login.microsoftonline.com/");
    v[1] = ("AZURE_TENANT_ID", "../../evil?x=");
    let e = EntraToken::from_env(MapEnv::of(&v))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a tenant id"), "{e}");
}

fn token_json(token: &str, expires_in: Value) -> String {
    serde_json::json!({
        "token_type": "Bearer",
        "expires_in": expires_in,
        "ext_expires_in": expires_in,
        "access_token": token,
    })
    .to_string()
}

/// A server playing Entra ID's token endpoint: tokens numbered by request,
/// an hour long, given for the right form only.
async fn entra(delay: Duration) -> Server {
    let n = AtomicUsize::new(0);
    Server::start(move |r: &Seen| {
        let right = r.form("grant_type").as_deref() == Some("client_credentials")
            && r.form("client_id").as_deref() == Some(CLIENT)
            && r.form("scope").as_deref() == Some(SCOPE)
            && r.form("client_assertion_type").as_deref() == Some(JWT_BEARER)
            && r.form("client_assertion")
                .is_some_and(|a| a.starts_with("eyJ"));
        if !right {
            return Answer::new(400, "application/json", r#"{"error":"invalid_request"}"#);
        }
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        let mut a = Answer::new(
            200,
            "application/json",
            token_json(&format!("access-{i}"), 3599.into()),
        );
        a.delay = delay;
        a
    })
    .await
}

fn token(server: &Server, file: &TokenFile, clock: &TestClock) -> EntraToken {
    EntraToken::from_env(MapEnv::of(&vars(file.path(), &server.base)))
        .unwrap()
        .with_clock(clock.clock())
}

#[tokio::test]
async fn the_federated_token_is_exchanged_and_kept_until_it_is_due() {
    let server = entra(Duration::ZERO).await;
    let file = TokenFile::new(&format!("{ASSERTION}\n"));
    let clock = TestClock::new();
    let t = token(&server, &file, &clock);
    assert_eq!(t.bearer(&http()).await.unwrap().expose(), "access-1");
    let r = &server.seen()[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", &*format!("/{TENANT}/oauth2/v2.0/token"))
    );
    assert_eq!(
        r.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(r.form("client_assertion").as_deref(), Some(ASSERTION));

    clock.advance(Duration::from_secs(3599 - 301));
    assert_eq!(t.bearer(&http()).await.unwrap().expose(), "access-1");
    assert_eq!(server.count(), 1);
    let rotated = ASSERTION.replace("c2lnbmF0dXJlLWNhbmFyeQ", "cm90YXRlZA");
    file.write(&rotated);
    clock.advance(Duration::from_secs(2));
    assert_eq!(t.bearer(&http()).await.unwrap().expose(), "access-2");
    assert_eq!(server.count(), 2);
    assert_eq!(
        server.seen()[1].form("client_assertion").as_deref(),
        Some(&*rotated)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_make_one_request() {
    let server = entra(Duration::from_millis(200)).await;
    let file = TokenFile::new(ASSERTION);
    let t = Arc::new(token(&server, &file, &TestClock::new()));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let t = t.clone();
            tokio::spawn(async move { t.bearer(&http()).await.map(|s| s.expose().to_owned()) })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "access-1");
    }
    assert_eq!(server.count(), 1);
}

fn clean(e: &LlmError) -> String {
    let text = format!("{e} {e:?}");
    for secret in [
        "canary",
        "eyJpc3MiOiJodHRwczovL29pZGMuZXhhbXBsZSIs",
        "c2lnbmF0dXJl",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    text
}

async fn failure(answer: impl Fn() -> Answer + Send + Sync + 'static) -> LlmError {
    let server = Server::start(move |_| answer()).await;
    let file = TokenFile::new(ASSERTION);
    token(&server, &file, &TestClock::new())
        .bearer(&http())
        .await
        .unwrap_err()
}

#[tokio::test]
async fn entra_refusing_says_which_aadsts_and_what_to_check() {
    let e = failure(|| {
        Answer::new(
            400,
            "application/json",
            serde_json::json!({
                "error": "invalid_client",
                "error_description": format!("AADSTS70021: No matching federated identity record found for presented assertion. Assertion: {ASSERTION}. Claims: eyJpc3MiOiJodHRwczovL29pZGMuZXhhbXBsZSIsInN1YiI6InN5c3RlbTpzZXJ2aWNlYWNjb3VudDphZ2VudHM6aW52b2ljZXMifQ"),
                "error_codes": [70021],
                "timestamp": "2024-01-02 03:04:05Z",
                "trace_id": "t", "correlation_id": "c",
            })
            .to_string(),
        )
    })
    .await;
    let text = clean(&e);
    assert!(
        matches!(
            e,
            LlmError::Credentials {
                transient: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.contains(&format!(
            "Azure workload identity (client {CLIENT} in tenant {TENANT})"
        )),
        "{text}"
    );
    assert!(
        text.contains("HTTP 400 invalid_client: AADSTS70021"),
        "{text}"
    );
    assert!(text.contains("federated credential"), "{text}");
    assert!(text.contains("system:serviceaccount:"), "{text}");

    let e = failure(|| {
        Answer::new(400, "application/json", r#"{"error":"unauthorized_client","error_description":"AADSTS700016: Application with identifier 'x' was not found in the directory"}"#)
    })
    .await;
    assert!(
        clean(&e).contains("azure.workload.identity/client-id"),
        "{e}"
    );
    let e = failure(|| Answer::new(503, "text/html", "<html>down</html>")).await;
    assert!(
        matches!(
            e,
            LlmError::Credentials {
                transient: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(clean(&e).contains("<html>down</html>"), "{e}");
}

#[tokio::test]
async fn a_reply_that_does_not_read_is_refused_and_never_quoted() {
    for (body, says) in [
        ("not json canary".to_owned(), "not JSON"),
        (
            r#"{"token_type":"Bearer","expires_in":3599}"#.to_owned(),
            "no access_token",
        ),
        (token_json("tok-canary", "soon".into()), "no expires_in"),
        (token_json("tok-canary", (-5).into()), "no expires_in"),
        (token_json("tok-canary", 0.into()), "already past"),
        (
            r#"{"token_type":"pop","expires_in":3599,"access_token":"tok-canary"}"#.to_owned(),
            "not Bearer",
        ),
    ] {
        let e = failure(move || Answer::new(200, "application/json", body.clone())).await;
        let text = clean(&e);
        assert!(text.contains(says), "{says}: {text}");
    }
    let e = failure(|| {
        Answer::new(
            200,
            "application/json",
            vec![b' '; 2 * crate::credentials::MAX_REPLY_BYTES],
        )
    })
    .await;
    assert!(clean(&e).contains("more than"), "{e}");
}

#[tokio::test]
async fn expires_in_may_be_a_numeral_and_is_capped_at_a_day() {
    let server = Server::start(|_| {
        Answer::new(
            200,
            "application/json",
            token_json("access-s", "999999999".into()),
        )
    })
    .await;
    let file = TokenFile::new(ASSERTION);
    let clock = TestClock::new();
    let t = token(&server, &file, &clock);
    assert_eq!(t.bearer(&http()).await.unwrap().expose(), "access-s");
    clock.advance(Duration::from_secs(24 * 3600));
    t.bearer(&http()).await.unwrap();
    assert_eq!(server.count(), 2, "refreshed within a day");
}

#[tokio::test]
async fn unreachable_and_unreadable_are_clear() {
    let file = TokenFile::new(ASSERTION);
    let down = closed_port().await;
    let t = EntraToken::from_env(MapEnv::of(&vars(file.path(), &down))).unwrap();
    let e = t.bearer(&http()).await.unwrap_err();
    let text = clean(&e);
    assert!(
        text.contains("Entra ID: could not connect to http://127.0.0.1:"),
        "{text}"
    );
    assert!(
        matches!(
            e,
            LlmError::Credentials {
                transient: true,
                ..
            }
        ),
        "{e:?}"
    );

    let server = entra(Duration::ZERO).await;
    let t =
        EntraToken::from_env(MapEnv::of(&vars("/nonexistent/azure/token", &server.base))).unwrap();
    let e = t.bearer(&http()).await.unwrap_err().to_string();
    assert!(
        e.contains("the token file /nonexistent/azure/token cannot be read"),
        "{e}"
    );
    assert!(e.contains("azure.workload.identity/use"), "{e}");
    assert_eq!(server.count(), 0);
}

#[test]
fn nothing_secret_is_in_debug() {
    let t = EntraToken::from_env(MapEnv::of(&vars(
        "/t",
        "https://login.microsoftonline.com/",
    )))
    .unwrap();
    let text = format!("{t:?}");
    assert!(text.contains(CLIENT), "{text}");
}
