//! Per-user connections against a loopback fake MCP server (streamable
//! HTTP, JSON answers, no session) that answers `whoami` with the headers
//! the call came with.

use std::sync::Mutex;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::*;
use crate::{CallContext, Tool};

/// What the fake saw: one line per request, `METHOD auth=… tenant=…`.
type Seen = Arc<Mutex<Vec<String>>>;

/// The fake server's `/mcp` URL and what it saw. Stops with the test's
/// runtime.
async fn fake_mcp() -> (String, Seen) {
    fake_mcp_with(false).await
}

/// [`fake_mcp`]; with `oauth`, `/mcp` takes only the bearer token its own
/// authorization server (same origin, client-credentials) issues, and
/// answers 401 without it.
async fn fake_mcp_with(oauth: bool) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let url = format!("{base}/mcp");
    let seen = Seen::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (log, base) = (log.clone(), base.clone());
            tokio::spawn(async move {
                let mut sock = BufReader::new(sock);
                let mut request_line = String::new();
                if sock.read_line(&mut request_line).await.unwrap_or(0) == 0 {
                    return;
                }
                let mut headers = HashMap::new();
                loop {
                    let mut line = String::new();
                    sock.read_line(&mut line).await.unwrap_or(0);
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let len: usize = headers
                    .get("content-length")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                sock.read_exact(&mut body).await.unwrap();
                let header = |k: &str| headers.get(k).cloned().unwrap_or_default();
                let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                let mut challenge = String::new();
                let (status, answer) = if oauth
                    && path == "/.well-known/oauth-protected-resource/mcp"
                {
                    let prm = serde_json::json!({"resource": format!("{base}/mcp"), "authorization_servers": [base]});
                    ("200 OK", prm.to_string())
                } else if oauth && path == "/.well-known/oauth-authorization-server" {
                    let meta = serde_json::json!({"issuer": base, "token_endpoint": format!("{base}/token")});
                    ("200 OK", meta.to_string())
                } else if oauth && path == "/token" {
                    log.lock().unwrap().push("token".into());
                    let t = serde_json::json!({"access_token": "cc-token", "token_type": "Bearer"});
                    ("200 OK", t.to_string())
                } else if oauth && path == "/mcp" && header("authorization") != "Bearer cc-token" {
                    challenge = format!(
                        "www-authenticate: Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"\r\n"
                    );
                    ("401 Unauthorized", String::new())
                } else if request_line.starts_with("POST") {
                    let msg: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let method = msg["method"].as_str().unwrap_or("").to_string();
                    log.lock().unwrap().push(format!(
                        "{method} auth={} tenant={}",
                        header("authorization"),
                        header("x-tenant")
                    ));
                    let result = match method.as_str() {
                        "initialize" => serde_json::json!({
                            "protocolVersion": msg["params"]["protocolVersion"],
                            "capabilities": {"tools": {"listChanged": true}},
                            "serverInfo": {"name": "fake", "version": "1"},
                        }),
                        "tools/list" => serde_json::json!({"tools": [
                            {"name": "whoami", "inputSchema": {"type": "object", "properties": {}}}
                        ]}),
                        "tools/call" => serde_json::json!({"content": [
                            {"type": "text", "text": format!("auth={} args={}", header("authorization"), msg["params"]["arguments"])}
                        ]}),
                        _ => serde_json::Value::Null,
                    };
                    match msg.get("id") {
                        None => ("202 Accepted", String::new()),
                        Some(id) => (
                            "200 OK",
                            serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
                                .to_string(),
                        ),
                    }
                } else {
                    ("405 Method Not Allowed", String::new())
                };
                let _ = sock
                    .get_mut()
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\n{challenge}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                            answer.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (url, seen)
}

fn toolbox(url: &str) -> McpToolbox {
    serde_json::from_value(serde_json::json!({
        "name": "crm",
        "url": url,
        "headers": {
            "Authorization": {"identity": "token:crm"},
            "X-Tenant": {"literal": "acme"},
        },
    }))
    .unwrap()
}

/// A call's bound arguments for `person` with token `token` (as the
/// bindings fill them from the run's values).
fn as_person(person: Option<&str>, token: &str) -> CallArgs {
    let mut args = CallArgs::new();
    if let Some(p) = person {
        args.insert(PERSON_ARG.into(), ParamValue::Plain(serde_json::json!(p)));
        args.insert(header_arg(0), ParamValue::Secret(SecretString::new(token)));
    }
    args
}

fn count(seen: &Seen, prefix: &str) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(prefix))
        .count()
}

#[test]
fn a_toolbox_with_an_end_users_header_is_per_user_and_binds_its_values() {
    let tb = toolbox("http://127.0.0.1:9/mcp");
    assert!(tb.per_user());
    assert_eq!(
        PerUserServer::credentials(&tb),
        [
            (PERSON_ARG.to_string(), "@identity:subject".to_string()),
            (
                "bindery-header-1".to_string(),
                "@identity:token:crm".to_string()
            ),
        ]
    );
    let mut shared = tb.clone();
    shared.headers.remove("Authorization");
    assert!(!shared.per_user());
}

#[tokio::test]
async fn each_person_gets_their_own_connection_with_their_own_token() {
    let (url, seen) = fake_mcp().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let server =
        PerUserServer::new(&toolbox(&url), &Values::new(), Limits::default(), tx, 3).unwrap();
    let ctx = CallContext::default();

    // Nobody has connected: the toolbox offers `connect`, nothing was asked.
    let (tools, _) = server.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert_eq!(names, ["mcp_crm_connect"]);
    assert!(tools[0].spec().arg(PERSON_ARG).is_some());
    assert!(seen.lock().unwrap().is_empty());

    // A run without an end user is told so, and no call is made.
    let err = tools[0].call(as_person(None, ""), &ctx).await.unwrap_err();
    assert_eq!(err.to_string(), NO_END_USER);
    assert!(seen.lock().unwrap().is_empty());

    // Alice connects: the server's tools are listed and the agent told.
    tools[0]
        .call(as_person(Some("alice"), "a1"), &ctx)
        .await
        .unwrap();
    assert_eq!(rx.recv().await, Some(3));
    let (tools, _) = server.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert_eq!(names, ["mcp_crm_whoami"]);
    let whoami = &tools[0];

    let text = |out: ToolOutputText| out.0;
    let alice = text(
        whoami
            .call(as_person(Some("alice"), "a1"), &ctx)
            .await
            .unwrap()
            .into(),
    );
    assert!(alice.contains("auth=Bearer a1"), "{alice}");
    // The bound values are not sent as the tool's arguments.
    assert!(alice.contains("args={}"), "{alice}");
    let bob = text(
        whoami
            .call(as_person(Some("bob"), "b1"), &ctx)
            .await
            .unwrap()
            .into(),
    );
    assert!(bob.contains("auth=Bearer b1"), "{bob}");
    assert_eq!(server.live(), 2);
    assert_eq!(count(&seen, "initialize"), 2);
    // Each connection's requests carried its person's token only, and
    // only those a call of theirs made (what a connection sends between
    // calls carries none).
    for line in seen.lock().unwrap().iter() {
        assert!(line.ends_with("tenant=acme"), "{line}");
        assert!(
            line.contains("auth=Bearer a1")
                || line.contains("auth=Bearer b1")
                || line.contains("auth= "),
            "{line}"
        );
    }

    // The server's tools changed while no call holds a connection: nothing
    // is asked with anybody's token then; the next call lists them,
    // through its own person's connection.
    let before = seen.lock().unwrap().len();
    server.tools().await.unwrap();
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "{:?}",
        seen.lock().unwrap()
    );
    let lists = count(&seen, "tools/list");
    whoami
        .call(as_person(Some("bob"), "b1"), &ctx)
        .await
        .unwrap();
    assert_eq!(count(&seen, "tools/list"), lists + 1);
    let last_list = seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|l| l.starts_with("tools/list"))
        .cloned()
        .unwrap();
    assert!(last_list.contains("auth=Bearer b1"), "{last_list}");

    // Alice's token was renewed: her connection sends the new one, and is
    // not made again.
    let renewed = text(
        whoami
            .call(as_person(Some("alice"), "a2"), &ctx)
            .await
            .unwrap()
            .into(),
    );
    assert!(renewed.contains("auth=Bearer a2"), "{renewed}");
    assert_eq!(count(&seen, "initialize"), 2);

    // The model cannot name a person: without the bound person, no call.
    let mut forged = CallArgs::new();
    forged.insert(
        "person".into(),
        ParamValue::Plain(serde_json::json!("alice")),
    );
    let err = whoami.call(forged, &ctx).await.unwrap_err();
    assert_eq!(err.to_string(), NO_END_USER);
}

/// A tool output's text.
struct ToolOutputText(String);

impl From<crate::ToolOutput> for ToolOutputText {
    fn from(o: crate::ToolOutput) -> Self {
        match o {
            crate::ToolOutput::Text(t) => ToolOutputText(t),
            other => ToolOutputText(format!("{other:?}")),
        }
    }
}

#[tokio::test]
async fn a_client_credentials_oauth_beside_a_persons_header_is_honoured() {
    let (url, seen) = fake_mcp_with(true).await;
    let tb: McpToolbox = serde_json::from_value(serde_json::json!({
        "name": "crm",
        "url": url,
        "headers": {"X-Tenant": {"identity": "subject"}},
        "oauth": {"grant": "client-credentials", "clientId": {"literal": "c1"},
                  "clientSecret": {"literal": "s1"}},
    }))
    .unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let server = PerUserServer::new(&tb, &Values::new(), Limits::default(), tx, 0).unwrap();
    let (tools, _) = server.tools().await.unwrap();
    let mut args = CallArgs::new();
    args.insert(
        PERSON_ARG.into(),
        ParamValue::Plain(serde_json::json!("alice")),
    );
    args.insert(header_arg(0), ParamValue::Plain(serde_json::json!("alice")));
    tools[0].call(args, &CallContext::default()).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().any(|l| l == "token"), "{seen:?}");
    // Every MCP request that got through carried the tenant's token and
    // the person's own header.
    assert!(seen.iter().any(|l| l.starts_with("initialize")), "{seen:?}");
    for l in seen.iter().filter(|l| *l != "token") {
        assert_eq!(
            l.split_once(' ').unwrap().1,
            "auth=Bearer cc-token tenant=alice",
            "{seen:?}"
        );
    }
}

#[test]
fn idle_and_surplus_connections_are_closed_least_recently_used_first() {
    let now = Instant::now();
    let ago = |s: u64| Some(now - Duration::from_secs(s));
    let conns = vec![
        ("idle".to_string(), ago(700)),
        ("old".to_string(), ago(30)),
        ("failed".to_string(), None),
        ("new".to_string(), ago(1)),
        ("mid".to_string(), ago(10)),
    ];
    let mut closed = to_close(&conns, now, IDLE, 2);
    closed.sort();
    assert_eq!(closed, ["failed", "idle", "old"]);
    assert_eq!(to_close(&conns[3..], now, IDLE, 2), Vec::<String>::new());
}
