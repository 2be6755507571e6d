use std::time::Duration;

use super::*;
use crate::credentials::testing::{closed_port, http, rfc3339, Answer, MapEnv, Server};
use crate::credentials::testing::{TestClock, TokenFile, START};

/// botocore's vectors (tests/providers/sigv4_vector.py): a Converse
/// request signed at 2024-01-02T03:04:05Z for `bedrock` in us-east-1.
const VECTOR_URL: &str = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse";
const VECTOR_BODY: &str = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
const VECTOR_WITH_TOKEN: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-east-1/bedrock/aws4_request, SignedHeaders=accept;content-type;host;x-amz-date;x-amz-security-token, Signature=714ae5455d2d57694f1ef5b41c0db0c1035caf4ae9c6fb6ae4bc5ae23a2061ad";
const VECTOR_WITHOUT_TOKEN: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-east-1/bedrock/aws4_request, SignedHeaders=accept;content-type;host;x-amz-date, Signature=55ca62751c77c145954f2815239aaea7bf058c401e2e219cfd834df3ae2cb239";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

fn json_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (CONTENT_TYPE, HeaderValue::from_static("application/json")),
        (ACCEPT, HeaderValue::from_static("application/json")),
    ]
}

fn sign_vector(
    token: Option<&str>,
    extra: &[(HeaderName, HeaderValue)],
) -> Vec<(HeaderName, HeaderValue)> {
    let credentials = Credentials::new(
        "AKIDEXAMPLE",
        SECRET,
        token.map(str::to_owned),
        None,
        "test",
    );
    let url = Url::parse(VECTOR_URL).unwrap();
    let mut headers = json_headers();
    headers.extend_from_slice(extra);
    signed(
        &credentials,
        "us-east-1",
        "bedrock",
        &Request {
            method: "POST",
            url: &url,
            headers: &headers,
            body: VECTOR_BODY.as_bytes(),
        },
        TestClock::new().now(),
    )
    .unwrap()
}

fn header<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a HeaderValue> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

#[test]
fn the_signature_is_botocores_with_a_session_token() {
    let out = sign_vector(Some("session-token-example/+="), &[]);
    assert_eq!(header(&out, "authorization").unwrap(), VECTOR_WITH_TOKEN);
    assert_eq!(header(&out, "x-amz-date").unwrap(), "20240102T030405Z");
    assert_eq!(
        header(&out, "x-amz-security-token").unwrap(),
        "session-token-example/+="
    );
    assert!(header(&out, "authorization").unwrap().is_sensitive());
    assert!(header(&out, "x-amz-security-token").unwrap().is_sensitive());
    // The payload is signed (in the signature), not sent as a header.
    assert!(header(&out, "x-amz-content-sha256").is_none(), "{out:?}");
}

#[test]
fn the_signature_is_botocores_with_long_term_keys() {
    let out = sign_vector(None, &[]);
    assert_eq!(header(&out, "authorization").unwrap(), VECTOR_WITHOUT_TOKEN);
    assert!(header(&out, "x-amz-security-token").is_none());
}

#[test]
fn user_agent_and_hop_by_hop_headers_are_not_signed() {
    let out = sign_vector(
        None,
        &[
            (
                HeaderName::from_static("user-agent"),
                HeaderValue::from_static("bindery-sidecar/0.1"),
            ),
            (
                HeaderName::from_static("connection"),
                HeaderValue::from_static("keep-alive"),
            ),
            (AUTHORIZATION, HeaderValue::from_static("Bearer old")),
        ],
    );
    assert_eq!(header(&out, "authorization").unwrap(), VECTOR_WITHOUT_TOKEN);
}

#[test]
fn another_body_is_another_signature() {
    let credentials = Credentials::new("AKIDEXAMPLE", SECRET, None, None, "test");
    let url = Url::parse(VECTOR_URL).unwrap();
    let headers = json_headers();
    let out = signed(
        &credentials,
        "us-east-1",
        "bedrock",
        &Request {
            method: "POST",
            url: &url,
            headers: &headers,
            body: b"{}",
        },
        TestClock::new().now(),
    )
    .unwrap();
    assert_ne!(header(&out, "authorization").unwrap(), VECTOR_WITHOUT_TOKEN);
}

#[test]
fn a_header_that_is_not_ascii_is_refused() {
    let credentials = Credentials::new("AKIDEXAMPLE", SECRET, None, None, "test");
    let url = Url::parse(VECTOR_URL).unwrap();
    let headers = vec![(
        HeaderName::from_static("x-note"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
    )];
    let e = signed(
        &credentials,
        "us-east-1",
        "bedrock",
        &Request {
            method: "POST",
            url: &url,
            headers: &headers,
            body: b"",
        },
        TestClock::new().now(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("x-note"), "{e}");
}

fn keys() -> AwsKeys {
    AwsKeys {
        access_key_id: "AKIDGIVEN".into(),
        secret_access_key: SecretString::new("given-secret-canary"),
        session_token: None,
    }
}

fn signer(keys: Option<AwsKeys>, vars: &[(&str, &str)]) -> Result<AwsSigner, LlmError> {
    AwsSigner::new(keys, "us-east-1".into(), "bedrock", MapEnv::of(vars))
}

const ENV_KEYS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "AKIDENV"),
    ("AWS_SECRET_ACCESS_KEY", "env-secret-canary"),
];
const WEB: [(&str, &str); 2] = [
    ("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/agent"),
    (
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
    ),
];
const POD: [(&str, &str); 2] = [
    (
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "http://169.254.170.23/v1/credentials",
    ),
    (
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token",
    ),
];

#[test]
fn each_source_is_chosen_in_order() {
    let all: Vec<(&str, &str)> = [ENV_KEYS, WEB, POD].concat();
    assert_eq!(signer(Some(keys()), &all).unwrap().source(), "static keys");
    assert_eq!(
        signer(None, &all).unwrap().source(),
        "environment keys (AWS_ACCESS_KEY_ID)"
    );
    let later: Vec<(&str, &str)> = [WEB, POD].concat();
    assert_eq!(
        signer(None, &later).unwrap().source(),
        "web identity (arn:aws:iam::111122223333:role/agent)"
    );
    assert_eq!(
        signer(None, &POD).unwrap().source(),
        "EKS Pod Identity (http://169.254.170.23/v1/credentials)"
    );
    let v6 = [(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "http://[fd00:ec2::23]/v1/credentials",
    )];
    assert_eq!(
        signer(None, &v6).unwrap().source(),
        "EKS Pod Identity (http://[fd00:ec2::23]/v1/credentials)"
    );
    let ecs = [(
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "/v2/credentials/abc",
    )];
    assert_eq!(
        signer(None, &ecs).unwrap().source(),
        "container credentials (http://169.254.170.2/v2/credentials/abc)"
    );
    // An empty value is no value (a manifest's `value: ""`).
    let empty = [("AWS_ACCESS_KEY_ID", ""), ("AWS_SECRET_ACCESS_KEY", " ")];
    assert!(signer(None, &[&empty[..], &WEB[..]].concat())
        .unwrap()
        .source()
        .starts_with("web identity"));
}

#[test]
fn a_source_set_up_in_part_says_what_is_missing() {
    for (vars, missing) in [
        (vec![ENV_KEYS[0]], "AWS_SECRET_ACCESS_KEY"),
        (vec![ENV_KEYS[1]], "AWS_ACCESS_KEY_ID"),
        (vec![WEB[0]], "AWS_WEB_IDENTITY_TOKEN_FILE"),
        (vec![WEB[1]], "AWS_ROLE_ARN"),
    ] {
        let e = signer(None, &vars).unwrap_err();
        assert!(matches!(e, LlmError::Config(_)), "{e:?}");
        assert!(
            e.to_string().contains(&format!("but {missing} is not")),
            "{e}"
        );
        assert!(!e.to_string().contains("canary"), "{e}");
    }
    let e = signer(None, &[]).unwrap_err().to_string();
    assert!(e.contains("no AWS credentials"), "{e}");
    assert!(e.contains("eks.amazonaws.com/role-arn"), "{e}");
    assert!(e.contains("Pod Identity"), "{e}");
    let empty = AwsKeys {
        access_key_id: " ".into(),
        secret_access_key: SecretString::new(""),
        session_token: None,
    };
    assert!(signer(Some(empty), &[]).is_err());
}

#[test]
fn the_region_and_the_session_name_are_checked() {
    let e = AwsSigner::new(None, "us-east-1/../x".into(), "bedrock", MapEnv::of(&WEB)).unwrap_err();
    assert!(e.to_string().contains("not a region name"), "{e}");
    let mut vars = WEB.to_vec();
    vars.push(("AWS_ROLE_SESSION_NAME", "has spaces"));
    let e = signer(None, &vars).unwrap_err();
    assert!(e.to_string().contains("AWS_ROLE_SESSION_NAME"), "{e}");
}

fn sts_of(vars: &[(&str, &str)], region: &str) -> String {
    let s = AwsSigner::new(None, region.into(), "bedrock", MapEnv::of(vars)).unwrap();
    match &s.source {
        Source::WebIdentity(w) => w.sts.to_string(),
        _ => panic!("not web identity"),
    }
}

#[test]
fn sts_is_the_regional_endpoint_unless_one_is_given() {
    assert_eq!(
        sts_of(&WEB, "eu-west-3"),
        "https://sts.eu-west-3.amazonaws.com/"
    );
    assert_eq!(
        sts_of(&WEB, "cn-north-1"),
        "https://sts.cn-north-1.amazonaws.com.cn/"
    );
    let mut vars = WEB.to_vec();
    vars.push(("AWS_ENDPOINT_URL", "https://vpce.example/"));
    assert_eq!(sts_of(&vars, "us-east-1"), "https://vpce.example/");
    vars.push(("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:4566"));
    assert_eq!(sts_of(&vars, "us-east-1"), "http://127.0.0.1:4566/");
}

#[test]
fn identity_endpoints_are_https_or_loopback_or_the_pod_identity_agent() {
    let mut vars = WEB.to_vec();
    vars.push(("AWS_ENDPOINT_URL_STS", "http://sts.example/?key=canary"));
    let e = signer(None, &vars).unwrap_err().to_string();
    assert!(e.contains("is not https"), "{e}");
    assert!(!e.contains("canary"), "the query is not shown: {e}");
    for refused in [
        "http://10.0.0.7/v1/credentials",
        "http://169.254.169.254/latest",
        "ftp://127.0.0.1/x",
        "not a url",
    ] {
        let vars = [("AWS_CONTAINER_CREDENTIALS_FULL_URI", refused)];
        assert!(signer(None, &vars).is_err(), "{refused}");
    }
    for allowed in [
        "https://creds.example/v1",
        "http://127.0.0.1:8080/creds",
        "http://127.1.2.3/creds",
        "http://[::1]:9/creds",
        "http://localhost:9/creds",
        "http://169.254.170.23/v1/credentials",
        "http://[fd00:ec2::23]/v1/credentials",
    ] {
        let vars = [("AWS_CONTAINER_CREDENTIALS_FULL_URI", allowed)];
        assert!(signer(None, &vars).is_ok(), "{allowed}");
    }
    // Only the container endpoint may be the agent's link-local address.
    let mut vars = WEB.to_vec();
    vars.push(("AWS_ENDPOINT_URL_STS", "http://169.254.170.23/"));
    assert!(signer(None, &vars).is_err());
}

#[test]
fn nothing_secret_is_in_debug() {
    let mut given = keys();
    given.session_token = Some(SecretString::new("given-token-canary"));
    let text = format!("{given:?} {:?}", signer(Some(given.clone()), &[]).unwrap());
    assert!(!text.contains("canary"), "{text}");
    let text = format!("{:?}", signer(None, &ENV_KEYS).unwrap());
    assert!(!text.contains("canary"), "{text}");
}

#[tokio::test]
async fn static_keys_sign_without_a_request() {
    let s = signer(Some(keys()), &[]).unwrap();
    let url = Url::parse(VECTOR_URL).unwrap();
    let out = s
        .sign(&http(), "POST", &url, &json_headers(), b"{}")
        .await
        .unwrap();
    let auth = header(&out, "authorization").unwrap().to_str().unwrap();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDGIVEN/"),
        "{auth}"
    );
}

// ---- STS ----

const ROLE: &str = "arn:aws:iam::111122223333:role/agent";

fn sts_xml(key_id: &str, expires: SystemTime) -> String {
    format!(
        r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:agents:invoices</SubjectFromWebIdentityToken>
    <Audience>sts.amazonaws.com</Audience>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::111122223333:assumed-role/agent/bindery-1</Arn>
      <AssumedRoleId>AROAEXAMPLE:bindery-1</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>{key_id}</AccessKeyId>
      <SecretAccessKey>sts-secret-canary</SecretAccessKey>
      <SessionToken>sts-session-canary/+=</SessionToken>
      <Expiration>{}</Expiration>
    </Credentials>
    <Provider>arn:aws:iam::111122223333:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE</Provider>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>c6104cbe-af31-11e0-8154-cbc7ccf896c7</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#,
        rfc3339(expires)
    )
}

fn sts_error(status: u16, code: &str, message: &str) -> Answer {
    Answer::new(
        status,
        "text/xml",
        format!(
            r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>r-1</RequestId></ErrorResponse>"#
        ),
    )
}

/// A server playing STS: credentials numbered by request, valid an hour
/// from `clock`'s now.
async fn sts(clock: &TestClock, delay: Duration) -> Server {
    let clock = clock.clone();
    let n = std::sync::atomic::AtomicUsize::new(0);
    Server::start(move |_| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut a = Answer::new(
            200,
            "text/xml",
            sts_xml(
                &format!("ASIASTS{i}"),
                clock.now() + Duration::from_secs(3600),
            ),
        );
        a.delay = delay;
        a
    })
    .await
}

fn web_signer(server: &str, file: &TokenFile, clock: &TestClock) -> AwsSigner {
    let vars = [
        ("AWS_ROLE_ARN", ROLE),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", file.path()),
        ("AWS_ENDPOINT_URL_STS", server),
        ("AWS_ROLE_SESSION_NAME", "agent-invoices"),
    ];
    signer(None, &vars).unwrap().with_clock(clock.clock())
}

async fn key_id_signed_with(s: &AwsSigner) -> Result<String, LlmError> {
    let url = Url::parse(VECTOR_URL).unwrap();
    let out = s
        .sign(&http(), "POST", &url, &json_headers(), b"{}")
        .await?;
    let auth = header(&out, "authorization").unwrap().to_str().unwrap();
    assert_eq!(
        header(&out, "x-amz-security-token").unwrap(),
        "sts-session-canary/+="
    );
    Ok(auth
        .trim_start_matches("AWS4-HMAC-SHA256 Credential=")
        .split('/')
        .next()
        .unwrap()
        .to_owned())
}

#[tokio::test]
async fn web_identity_is_exchanged_with_sts_as_botocore_does() {
    let clock = TestClock::new();
    let server = sts(&clock, Duration::ZERO).await;
    let file = TokenFile::new("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.sig-canary\n");
    let s = web_signer(&server.base, &file, &clock);
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIASTS1");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/"));
    assert_eq!(
        r.header("content-type"),
        Some("application/x-www-form-urlencoded; charset=utf-8")
    );
    assert_eq!(
        r.form("Action").as_deref(),
        Some("AssumeRoleWithWebIdentity")
    );
    assert_eq!(r.form("Version").as_deref(), Some("2011-06-15"));
    assert_eq!(r.form("RoleArn").as_deref(), Some(ROLE));
    assert_eq!(r.form("RoleSessionName").as_deref(), Some("agent-invoices"));
    assert_eq!(
        r.form("WebIdentityToken").as_deref(),
        Some("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.sig-canary"),
        "the file's token, its newline left out"
    );
    // STS's call is not signed.
    assert_eq!(r.header("authorization"), None);
}

#[tokio::test]
async fn a_session_name_is_made_when_none_is_given() {
    let clock = TestClock::new();
    let server = sts(&clock, Duration::ZERO).await;
    let file = TokenFile::new("token-one");
    let vars = [
        ("AWS_ROLE_ARN", ROLE),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", file.path()),
        ("AWS_ENDPOINT_URL", server.base.as_str()),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    key_id_signed_with(&s).await.unwrap();
    let name = server.seen()[0].form("RoleSessionName").unwrap();
    assert_eq!(name, format!("bindery-{START}"));
    assert!(valid_session_name(&name));
}

#[tokio::test]
async fn credentials_are_kept_until_five_minutes_before_they_expire_and_the_file_is_read_anew() {
    let clock = TestClock::new();
    let server = sts(&clock, Duration::ZERO).await;
    let file = TokenFile::new("token-one");
    let s = web_signer(&server.base, &file, &clock);
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIASTS1");
    clock.advance(Duration::from_secs(3600 - 301));
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIASTS1");
    assert_eq!(server.count(), 1, "no request before they are due");
    file.write("token-two");
    clock.advance(Duration::from_secs(2));
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIASTS2");
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIASTS2");
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "one request once they are due");
    assert_eq!(
        seen[1].form("WebIdentityToken").as_deref(),
        Some("token-two")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_make_one_request() {
    let clock = TestClock::new();
    let server = sts(&clock, Duration::from_millis(200)).await;
    let file = TokenFile::new("token-one");
    let s = Arc::new(web_signer(&server.base, &file, &clock));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { key_id_signed_with(&s).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "ASIASTS1");
    }
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn a_failed_refresh_keeps_credentials_still_good() {
    let clock = TestClock::new();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failing = fail.clone();
    let now = clock.clone();
    let server = Server::start(move |_| {
        if failing.load(std::sync::atomic::Ordering::SeqCst) {
            sts_error(503, "ServiceUnavailable", "try later")
        } else {
            Answer::new(
                200,
                "text/xml",
                sts_xml("ASIAKEPT", now.now() + Duration::from_secs(3600)),
            )
        }
    })
    .await;
    let file = TokenFile::new("token-one");
    let s = web_signer(&server.base, &file, &clock);
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIAKEPT");
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    clock.advance(Duration::from_secs(3600 - 120));
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIAKEPT");
    assert_eq!(server.count(), 2, "the refresh was tried");
    clock.advance(Duration::from_secs(120));
    let e = key_id_signed_with(&s).await.unwrap_err();
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
}

/// `e`'s text, checked to hold none of the test's secrets.
fn clean(e: &LlmError) -> String {
    let text = format!("{e} {e:?}");
    for secret in ["canary", "token-one", "sig-part-of-the-jwt-xxxxxxxx"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    text
}

async fn sts_failure(answer: impl Fn() -> Answer + Send + Sync + 'static) -> LlmError {
    let clock = TestClock::new();
    let server = Server::start(move |_| answer()).await;
    let file = TokenFile::new("token-one");
    let s = web_signer(&server.base, &file, &clock);
    key_id_signed_with(&s).await.unwrap_err()
}

#[tokio::test]
async fn sts_refusing_says_why_and_what_to_check_without_the_token() {
    let e = sts_failure(|| {
        sts_error(
            403,
            "AccessDenied",
            "Not authorized to perform sts:AssumeRoleWithWebIdentity with token token-one",
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
        text.contains("web identity (arn:aws:iam::111122223333:role/agent)"),
        "{text}"
    );
    assert!(
        text.contains("HTTP 403 AccessDenied: Not authorized"),
        "{text}"
    );
    assert!(text.contains("<secret>"), "{text}");
    assert!(text.contains("trust policy"), "{text}");

    let e = sts_failure(|| {
        sts_error(
            400,
            "InvalidIdentityToken",
            "No OpenIDConnect provider found",
        )
    })
    .await;
    assert!(clean(&e).contains("identity provider"), "{e}");

    let e = sts_failure(|| sts_error(503, "ServiceUnavailable", "busy")).await;
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
    // Not STS's XML: quoted, scrubbed.
    let e =
        sts_failure(|| Answer::new(502, "text/html", "<html>bad gateway token-one</html>")).await;
    assert!(clean(&e).contains("bad gateway"), "{e}");
}

#[tokio::test]
async fn a_reply_that_does_not_read_is_refused_and_never_quoted() {
    let expires = TestClock::new().now() + Duration::from_secs(3600);
    let whole = sts_xml("ASIAX", expires);
    let cases: Vec<(String, &str)> = vec![
        (whole[..whole.len() / 2].to_owned(), "ends before"),
        (
            whole.replace("</SessionToken>", "</Session>"),
            "does not read",
        ),
        (
            whole.replace("<SessionToken>sts-session-canary/+=</SessionToken>", ""),
            "no SessionToken",
        ),
        (
            whole.replace("<SessionToken>", "<SessionToken><b>x</b>"),
            "where text is wanted",
        ),
        (
            whole.replace(
                "</AccessKeyId>",
                "</AccessKeyId><AccessKeyId>B</AccessKeyId>",
            ),
            "twice",
        ),
        (
            whole.replace("sts-secret-canary", "sts-secret-canary&bogus;"),
            "entity",
        ),
        (
            whole.replace(&rfc3339(expires), "tomorrow canary"),
            "not an RFC 3339",
        ),
        (
            whole.replace(&rfc3339(expires), "2020-01-01T00:00:00Z"),
            "already past",
        ),
        ("{\"Credentials\": {}}".to_owned(), "ends before"),
        ("".to_owned(), "ends before"),
        (
            format!("{}{}", "<a>".repeat(40), "</a>".repeat(40)),
            "levels",
        ),
        (format!("{whole}{whole}"), "one document"),
    ];
    for (body, says) in cases {
        let e = sts_failure(move || Answer::new(200, "text/xml", body.clone())).await;
        let text = format!("{e} {e:?}");
        assert!(text.contains(says), "{says}: {text}");
        assert!(!text.contains("sts-secret"), "{text}");
        assert!(!text.contains("sts-session"), "{text}");
    }
}

#[test]
fn stss_xml_reads_with_entities_cdata_and_prefixes() {
    let xml = r#"<?xml version="1.0"?><!-- a comment --><s:AssumeRoleWithWebIdentityResponse xmlns:s="x"><s:AssumeRoleWithWebIdentityResult><s:Credentials>
<s:AccessKeyId>ASIA</s:AccessKeyId><s:SecretAccessKey>a&amp;b&#x2F;c</s:SecretAccessKey><s:SessionToken><![CDATA[t<o>k]]></s:SessionToken><s:Expiration>2024-01-02T04:04:05Z</s:Expiration>
</s:Credentials></s:AssumeRoleWithWebIdentityResult></s:AssumeRoleWithWebIdentityResponse>"#;
    let t = sts_credentials(xml).unwrap();
    assert_eq!(t.access_key_id, "ASIA");
    assert_eq!(t.secret_access_key.expose(), "a&b/c");
    assert_eq!(t.session_token.expose(), "t<o>k");
    assert_eq!(t.expiration, "2024-01-02T04:04:05Z");
}

#[tokio::test]
async fn too_large_unreachable_slow_and_redirecting_sts_are_clear_errors() {
    let e = sts_failure(|| {
        Answer::new(
            200,
            "text/xml",
            vec![b'x'; 2 * crate::credentials::MAX_REPLY_BYTES],
        )
    })
    .await;
    assert!(clean(&e).contains("more than 65536 bytes"), "{e}");
    let e = sts_failure(|| {
        let mut a = Answer::new(
            200,
            "text/xml",
            vec![b'x'; 2 * crate::credentials::MAX_REPLY_BYTES],
        );
        a.no_length = true;
        a
    })
    .await;
    assert!(clean(&e).contains("more than 65536 bytes"), "{e}");
    let e = sts_failure(|| {
        let mut a = Answer::new(302, "text/plain", "");
        a.content_type = "text/plain\r\nlocation: http://127.0.0.1:9/steal";
        a
    })
    .await;
    assert!(clean(&e).contains("redirect"), "{e}");

    let clock = TestClock::new();
    let file = TokenFile::new("token-one");
    let s = web_signer(&closed_port().await, &file, &clock);
    let e = key_id_signed_with(&s).await.unwrap_err();
    let text = clean(&e);
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
    assert!(
        text.contains("could not connect to http://127.0.0.1:"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_sts_that_does_not_answer_times_out() {
    let e = sts_failure(|| {
        let mut a = Answer::new(200, "text/xml", "");
        a.delay = Duration::from_secs(3600);
        a
    })
    .await;
    let text = clean(&e);
    assert!(text.contains("did not answer within 10s"), "{text}");
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
}

#[tokio::test]
async fn an_unreadable_token_file_says_what_to_check() {
    let clock = TestClock::new();
    let server = sts(&clock, Duration::ZERO).await;
    let vars = [
        ("AWS_ROLE_ARN", ROLE),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/bindery/token"),
        ("AWS_ENDPOINT_URL_STS", server.base.as_str()),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    let e = key_id_signed_with(&s).await.unwrap_err().to_string();
    assert!(
        e.contains("the token file /nonexistent/bindery/token cannot be read"),
        "{e}"
    );
    assert!(e.contains("eks.amazonaws.com/role-arn"), "{e}");
    assert_eq!(server.count(), 0);
    let empty = TokenFile::new("\n");
    let s = web_signer(&server.base, &empty, &clock);
    let e = key_id_signed_with(&s).await.unwrap_err().to_string();
    assert!(e.contains("is empty"), "{e}");
}

// ---- EKS Pod Identity ----

fn container_json(key_id: &str, expires: SystemTime) -> String {
    serde_json::json!({
        "AccessKeyId": key_id,
        "SecretAccessKey": "pod-secret-canary",
        "Token": "sts-session-canary/+=",
        "AccountId": "111122223333",
        "Expiration": rfc3339(expires),
    })
    .to_string()
}

async fn pod_identity(clock: &TestClock) -> Server {
    let clock = clock.clone();
    Server::start(move |r| {
        if r.header("authorization") != Some("pod-token-canary") {
            return Answer::new(
                401,
                "application/json",
                r#"{"code":"AccessDeniedException"}"#,
            );
        }
        Answer::new(
            200,
            "application/json",
            container_json("ASIAPOD", clock.now() + Duration::from_secs(3600)),
        )
    })
    .await
}

#[tokio::test]
async fn pod_identity_sends_the_token_files_content_and_reads_the_credentials() {
    let clock = TestClock::new();
    let server = pod_identity(&clock).await;
    let file = TokenFile::new("pod-token-canary\n");
    let url = format!("{}/v1/credentials", server.base);
    let vars = [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", url.as_str()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", file.path()),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN",
            "ignored-when-the-file-is-set",
        ),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    assert!(s
        .source()
        .starts_with("container credentials (http://127.0.0.1:"));
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIAPOD");
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIAPOD");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/v1/credentials")
    );
    assert_eq!(seen[0].header("accept"), Some("application/json"));

    // The token from the environment when no file is given.
    let vars = [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", url.as_str()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "pod-token-canary"),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    assert_eq!(key_id_signed_with(&s).await.unwrap(), "ASIAPOD");
}

#[tokio::test]
async fn pod_identity_failures_say_what_to_check() {
    let clock = TestClock::new();
    let server = pod_identity(&clock).await;
    let url = format!("{}/v1/credentials", server.base);
    let wrong = TokenFile::new("another-token-canary");
    let vars = [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", url.as_str()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", wrong.path()),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    let e = key_id_signed_with(&s).await.unwrap_err();
    let text = clean(&e);
    assert!(text.contains("HTTP 401"), "{text}");
    assert!(text.contains("Pod Identity association"), "{text}");

    let broken = TokenFile::new("two\nlines");
    let vars = [
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", url.as_str()),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", broken.path()),
    ];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    let e = key_id_signed_with(&s).await.unwrap_err().to_string();
    assert!(e.contains("cannot go in an HTTP header"), "{e}");
    assert!(!e.contains("two"), "{e}");

    let down = format!("{}/v1/credentials", closed_port().await);
    let vars = [("AWS_CONTAINER_CREDENTIALS_FULL_URI", down.as_str())];
    let s = signer(None, &vars).unwrap().with_clock(clock.clock());
    let e = key_id_signed_with(&s).await.unwrap_err().to_string();
    assert!(e.contains("Pod Identity Agent add-on"), "{e}");

    for (body, says) in [
        ("not json", "not JSON"),
        (
            r#"{"AccessKeyId":"A","SecretAccessKey":"pod-secret-canary","Expiration":"2030-01-01T00:00:00Z"}"#,
            "no Token",
        ),
        (
            r#"{"AccessKeyId":"A","SecretAccessKey":"pod-secret-canary","Token":"t-canary","Expiration":7}"#,
            "no Expiration",
        ),
    ] {
        let server = Server::start(move |_| Answer::new(200, "application/json", body)).await;
        let vars = [("AWS_CONTAINER_CREDENTIALS_FULL_URI", server.base.as_str())];
        let s = signer(None, &vars).unwrap().with_clock(clock.clock());
        let e = key_id_signed_with(&s).await.unwrap_err();
        assert!(clean(&e).contains(says), "{says}: {e}");
    }
}
