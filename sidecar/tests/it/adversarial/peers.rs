//! Anything on the pod network: a sniffer between two replicas that
//! records every byte one forwards to the other, and replays what it saw.
//!
//! Server B holds a session's secret values (it was created there); a
//! client reaching server A gets its requests forwarded to B, through the
//! sniffer (B advertises the sniffer's address).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use bindery_tests::mock_llm::MockReply;
use bindery_tests::postgres::Postgres;
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DB: &str = "tenant_peers";

/// How long a test waits for a condition before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A TCP proxy on loopback that records what the forwarding server sends.
struct Sniffer {
    addr: SocketAddr,
    /// Where it sends connections: set once the server behind it is up.
    target: Arc<Mutex<Option<SocketAddr>>>,
    /// Per connection, the bytes from the forwarding server.
    sent: Recorded,
}

/// Per connection, the bytes one way.
type Recorded = Arc<Mutex<Vec<Vec<u8>>>>;

impl Sniffer {
    async fn start() -> Sniffer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let sent: Recorded = Arc::default();
        let (t, s) = (target.clone(), sent.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = t.lock().unwrap().expect("the sniffer's target is set");
                let Ok(server) = TcpStream::connect(to).await else {
                    continue;
                };
                let n = {
                    let mut sent = s.lock().unwrap();
                    sent.push(Vec::new());
                    sent.len() - 1
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, Some((s.clone(), n))));
                tokio::spawn(pipe(sr, cw, None));
            }
        });
        Sniffer { addr, target, sent }
    }

    fn aim(&self, url: &str) {
        *self.target.lock().unwrap() = Some(addr_of(url));
    }

    /// The requests the forwarding server sent, as they went.
    fn requests(&self) -> Vec<Captured> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .flat_map(|bytes| Captured::parse_all(bytes))
            .collect()
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    record: Option<(Recorded, usize)>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((sent, i)) = &record {
            sent.lock().unwrap()[*i].extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// `127.0.0.1:PORT` of `http(s)://127.0.0.1:PORT`.
fn addr_of(url: &str) -> SocketAddr {
    url.split("://")
        .nth(1)
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// One HTTP/1.1 request as it went over the wire.
#[derive(Clone, Debug)]
struct Captured {
    raw: Vec<u8>,
    /// `METHOD PATH HTTP/1.1`.
    line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Captured {
    fn parse_all(mut bytes: &[u8]) -> Vec<Captured> {
        let mut out = Vec::new();
        while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..end]).to_string();
            let mut lines = head.split("\r\n");
            let line = lines.next().unwrap().to_string();
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap());
            let total = end + 4 + len;
            if bytes.len() < total {
                break;
            }
            out.push(Captured {
                raw: bytes[..total].to_vec(),
                line,
                headers,
                body: bytes[end + 4..total].to_vec(),
            });
            bytes = &bytes[total..];
        }
        out
    }

    fn path(&self) -> &str {
        self.line.split(' ').nth(1).unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The same request with another request line and body (its length
    /// set to match).
    fn changed(&self, line: &str, body: &[u8]) -> Vec<u8> {
        let mut out = format!("{line}\r\n");
        for (k, v) in &self.headers {
            if k != "content-length" {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        let mut out = out.into_bytes();
        out.extend_from_slice(body);
        out
    }

    /// The peer headers alone (`x-bindery-peer…`).
    fn peer_headers(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(k, _)| k.starts_with("x-bindery-peer"))
            .cloned()
            .collect()
    }
}

/// Send `raw` to the server at `to` on a connection of its own; the
/// answer's status.
async fn replay(to: SocketAddr, raw: &[u8]) -> u16 {
    let mut conn = TcpStream::connect(to).await.unwrap();
    conn.write_all(raw).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(PATIENCE, conn.read(&mut buf))
            .await
            .expect("the server answers a replay")
            .unwrap();
        assert!(n > 0, "the server closed without an answer");
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got).to_string();
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A PostgreSQL server with `DB` and a world whose servers keep their
/// sessions there; the model answers every request with "done".
async fn on_postgres() -> (Postgres, World) {
    let pg = Postgres::start();
    pg.create_database(DB);
    let mut w = World::new(|_| MockReply::text("done")).await;
    w.store = pg.url(DB);
    (pg, w)
}

/// A session created on `holder`, its secret value held there.
async fn session_on(holder: &Api) -> String {
    new_session(
        holder,
        json!({"agent": "invoices", "params": valid_params()}),
    )
    .await
}

/// `PUT /v1/sessions/{id}/params` with `params`, as the owner.
async fn put_params(api: &Api, id: &str, params: Value) -> bindery_tests::sidecar::Reply {
    api.call(
        "PUT",
        &format!("/v1/sessions/{id}/params"),
        Some(OWNER),
        Some(&json!({ "params": params })),
    )
    .await
}

/// Until `done` holds of the sniffer's requests (a forward's last bytes
/// may still be on their way when the answer is back).
async fn captured_until(s: &Sniffer, done: impl Fn(&[Captured]) -> bool) -> Vec<Captured> {
    eventually_or("the sniffer's requests", PATIENCE, || async {
        let got = s.requests();
        match done(&got) {
            true => Ok(got),
            false => Err(format!("{got:?}")),
        }
    })
    .await
}

/// With plain HTTP between the replicas, what the sniffer captured is good
/// for nothing: each forward replayed as it went, or with its path or
/// body changed, is refused, and its peer headers on the owner's routes
/// open nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_forward_cannot_be_replayed_or_reused() {
    let (_pg, w) = on_postgres().await;
    let sniffer = Sniffer::start().await;
    let through = format!("http://{}", sniffer.addr);
    let (_b, api_b) = w.start(&["--advertise-url", &through], &[]);
    sniffer.aim(&api_b.base);
    let (_a, api_a) = w.start(&[], &[]);
    let b = addr_of(&api_b.base);

    let id = session_on(&api_b).await;
    let other = session_on(&api_b).await;
    let r = message_waited(&api_a, &id, "hi").await;
    assert_eq!(r.status, 200, "forwarded to B: {}", r.text);
    let r = put_params(&api_a, &id, json!({"tenant": "beta"})).await;
    assert_eq!(r.status, 200, "forwarded to B: {}", r.text);
    let ran = w.mock.request_count();

    let captured = captured_until(&sniffer, |c| c.len() >= 2).await;
    let message = captured
        .iter()
        .find(|c| c.line.starts_with("POST ") && c.path().contains("/messages"))
        .expect("the message went through the sniffer");
    let params = captured
        .iter()
        .find(|c| c.line.starts_with("PUT "))
        .expect("the parameters went through the sniffer");
    assert!(message.header("x-bindery-peer").is_some(), "{message:?}");

    let a = addr_of(&api_a.base);
    for c in &captured {
        assert_eq!(
            replay(b, &c.raw).await,
            401,
            "replayed as it went: {}",
            c.line
        );
        // To the replica that sent it, which never saw its nonce: it was
        // signed for B only.
        assert_eq!(
            replay(a, &c.raw).await,
            401,
            "replayed to the sender: {}",
            c.line
        );
    }
    let changed = [
        message.changed(&message.line.replace(&id, &other), &message.body),
        message.changed(
            &message.line,
            &String::from_utf8_lossy(&message.body)
                .replace("hi", "yo")
                .into_bytes(),
        ),
        params.changed(
            &params.line,
            &String::from_utf8_lossy(&params.body)
                .replace("beta", "zeta")
                .into_bytes(),
        ),
        params.changed(&params.line.replace(&id, &other), &params.body),
    ];
    for raw in &changed {
        let line = String::from_utf8_lossy(raw)
            .lines()
            .next()
            .unwrap()
            .to_string();
        assert_eq!(replay(b, raw).await, 401, "changed: {line}");
    }

    // The peer headers alone on the owner's routes.
    for (method, path) in [
        ("GET", "/v1/sessions".to_string()),
        ("GET", "/v1/agents".to_string()),
        ("DELETE", format!("/v1/sessions/{id}/token")),
    ] {
        let mut req = api_b.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", api_b.base),
        );
        for (k, v) in message.peer_headers() {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{method} {path}");
    }
    assert_eq!(w.mock.request_count(), ran, "nothing ran for a replay");
    let r = api_b
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["params"]["tenant"], "beta", "{}", r.text);
}

/// A value for `billing_token` given after the session was created.
const ROTATED: &str = "rotated-secret-5b1e07";

/// The invoices agent's world plus the probe tool, with `billing_token`
/// bound to it (its output shows the digest of the token it got); the
/// model calls the probe once per message, then answers with its output.
async fn probing_on_postgres() -> (Postgres, World) {
    let pg = Postgres::start();
    pg.create_database(DB);
    let probe = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tools/probe");
    let mut w = World::with_toolboxes(
        |req| {
            let last = bindery_tests::mock_llm::last_message(req);
            match last["role"].as_str() {
                Some("tool") => MockReply::text(format!(
                    "answer: {}",
                    last["content"].as_str().unwrap_or("")
                )),
                _ => MockReply::tool_call("bash_probe", json!({})),
            }
        },
        |_| {
            format!(
                "    - bash:
        script: \"{}\"
        bindings:
          - {{arg: repo, value: {{param: tenant}}}}
          - {{arg: repo-token, value: {{param: billing_token}}}}
",
                probe.display()
            )
        },
    )
    .await;
    w.store = pg.url(DB);
    (pg, w)
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// Without peer TLS, a forward that would carry a secret value is not
/// sent: the client is told that the replicas need a certificate, and the
/// sniffer never sees the value. A forward without one still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_peer_tls_no_secret_value_is_forwarded_in_clear() {
    let (_pg, w) = on_postgres().await;
    let sniffer = Sniffer::start().await;
    let through = format!("http://{}", sniffer.addr);
    let (b, api_b) = w.start(&["--advertise-url", &through], &[]);
    sniffer.aim(&api_b.base);
    let (a, api_a) = w.start(&[], &[]);

    let id = session_on(&api_b).await;
    let r = put_params(&api_a, &id, json!({"billing_token": ROTATED})).await;
    let (status, code, params) = error_of(&r);
    assert_eq!(
        (status, code.as_str(), params),
        (409, "peer_tls_required", vec!["billing_token".to_string()]),
        "{}",
        r.text
    );
    assert!(
        r.json["message"]
            .as_str()
            .unwrap()
            .contains("--peer-tls-dir"),
        "{}",
        r.text
    );
    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "hi", "params": {"otp": ROTATED}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(409, "peer_tls_required", &["otp"]),
        "{}",
        r.text
    );
    // Removing a secret value carries none.
    let r = put_params(
        &api_a,
        &id,
        json!({"tenant": "beta", "billing_token": null}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let captured = captured_until(&sniffer, |c| !c.is_empty()).await;
    for c in &captured {
        let text = String::from_utf8_lossy(&c.raw);
        assert!(!text.contains(ROTATED) && !text.contains(CANARY), "{text}");
    }
    assert!(
        captured.iter().all(|c| c.line.starts_with("PUT ")),
        "only the forward without a secret went: {captured:?}"
    );
    for s in [&a, &b] {
        assert!(!s.logs().contains(ROTATED), "{}", s.logs());
    }
}

/// The tenant's certificates, as a kubernetes.io/tls Secret plus `ca.crt`
/// would give them, for `name`; made with openssl in `dir/<sub>`.
fn certificates(dir: &std::path::Path, sub: &str, name: &str) -> std::path::PathBuf {
    let out = dir.join(sub);
    std::fs::create_dir_all(&out).unwrap();
    let openssl = |args: &[&str]| {
        let o = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&out)
            .output()
            .unwrap_or_else(|e| panic!("openssl: {e}: run tests/setup.sh"));
        assert!(
            o.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=tenant peers CA",
                "-days",
                "2",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "tls.key",
                "-out",
                "tls.csr",
                "-subj",
                &format!("/CN={name}"),
            ],
        ]
        .concat(),
    );
    std::fs::write(
        out.join("ext.cnf"),
        format!("subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"),
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    out
}

/// The address a server takes peers' forwards on, from its first lines.
async fn peer_address(s: &Sidecar) -> String {
    eventually_or("the peer address in the log", PATIENCE, || async {
        let logs = s.logs();
        logs.lines()
            .find_map(|l| l.strip_prefix("listening for peers on "))
            .map(|url| url.trim().to_string())
            .ok_or(logs)
    })
    .await
}

/// A client of the peer port that trusts the tenant CA for `name`, with
/// `identity` (PEM certificate and key) if any.
fn peer_client(
    ca: &std::path::Path,
    name: &str,
    at: SocketAddr,
    identity: Option<&std::path::Path>,
) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca.join("ca.crt")).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .tls_certs_only([ca])
        .resolve(name, at)
        .no_proxy();
    if let Some(dir) = identity {
        let mut pem = std::fs::read(dir.join("tls.crt")).unwrap();
        pem.extend(std::fs::read(dir.join("tls.key")).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

/// With peer TLS, what crosses the pod network between replicas is
/// encrypted: the sniffer's bytes hold neither a secret value nor the
/// owner token, a rotated secret reaches the replica that holds the
/// session's secrets and is used there, and the peer port takes no client
/// without a certificate from the tenant CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_peer_tls_secrets_cross_between_replicas_encrypted_only() {
    const NAME: &str = "acme.tenants.svc";
    let (_pg, w) = probing_on_postgres().await;
    let tenant = certificates(w.dir.path(), "tenant", NAME);
    let rogue = certificates(w.dir.path(), "rogue", NAME);
    let tls_dir = tenant.display().to_string();
    let sniffer = Sniffer::start().await;
    let through = format!("https://{}", sniffer.addr);
    let peer_tls = [
        "--peer-tls-dir",
        &tls_dir,
        "--peer-tls-name",
        NAME,
        "--peer-listen",
        "127.0.0.1:0",
    ];
    let (b, api_b) = w.start(
        &[&peer_tls[..], &["--advertise-url", &through]].concat(),
        &[],
    );
    let b_peers = peer_address(&b).await;
    sniffer.aim(&b_peers);
    let (a, api_a) = w.start(&peer_tls, &[]);

    let id = session_on(&api_b).await;
    let r = put_params(&api_a, &id, json!({"billing_token": ROTATED})).await;
    assert_eq!(r.status, 200, "forwarded to B over TLS: {}", r.text);
    let r = message_waited(&api_a, &id, "probe").await;
    let answer = r.json["session"]["turns"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        answer.contains(&format!("token-sha256: {}", sha256_hex(ROTATED))),
        "B ran the tool with the rotated value: {answer}"
    );
    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "again", "params": {"otp": CANARY}})),
        )
        .await;
    assert_eq!(
        r.status, 200,
        "a message-scope secret forwarded over TLS: {}",
        r.text
    );

    let bytes: Vec<u8> = sniffer.sent.lock().unwrap().concat();
    assert!(bytes.len() > 1000, "the forwards went through the sniffer");
    for needle in [ROTATED, CANARY, OWNER, "x-bindery-peer", "billing_token"] {
        assert!(
            !contains(&bytes, needle),
            "`{needle}` crossed the pod network readable"
        );
    }

    // With peer TLS, the client port takes no forward at all, whatever
    // it carries.
    let plain = api_b
        .http
        .post(format!("{}/v1/sessions/{id}/messages", api_b.base))
        .header("x-bindery-peer", "00")
        .header("x-bindery-peer-caller", "owner")
        .header("x-bindery-peer-time", "0")
        .header("x-bindery-peer-nonce", "00112233445566778899aabbccddeeff")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 401);
    let text = plain.text().await.unwrap();
    assert!(text.contains("peer port only"), "{text}");

    // The peer port: only a client with the tenant's certificate.
    let at = addr_of(&b_peers);
    let url = format!("https://{NAME}:{}/healthz", at.port());
    let ok = peer_client(&tenant, NAME, at, Some(&tenant))
        .get(&url)
        .send()
        .await;
    assert_eq!(
        ok.map(|r| r.status().as_u16()).ok(),
        Some(200),
        "the tenant's own certificate is taken"
    );
    for (who, identity) in [
        ("no certificate", None),
        ("another CA's", Some(rogue.as_path())),
    ] {
        let r = peer_client(&tenant, NAME, at, identity)
            .get(&url)
            .send()
            .await;
        assert!(r.is_err(), "{who}: {r:?}");
    }
    for s in [&a, &b] {
        let logs = s.logs();
        assert!(!logs.contains(ROTATED) && !logs.contains(CANARY), "{logs}");
    }
}

/// A peer that refuses this server's signature (a replica of the version
/// before signed forwards, during a rolling update; here one with another
/// owner token, which refuses it the same way) is taken as one that cannot
/// be reached: the request is served where it landed (409
/// params_required for want of the secret value the peer holds), not
/// answered with the peer's 401, and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_refuses_the_signature_is_taken_as_unreachable() {
    const OTHER: &str = "another-owner-token-for-tests";
    let (_pg, w) = on_postgres().await;
    let (b, api_b) = w.start(&[], &[("BINDERY_OWNER_TOKEN", OTHER)]);
    let (a, api_a) = w.start(&[], &[]);
    let r = api_b
        .call(
            "POST",
            "/v1/sessions",
            Some(OTHER),
            Some(&json!({"agent": "invoices", "params": valid_params()})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "hi"})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"]),
        "{}",
        r.text
    );
    assert!(
        a.logs().contains("refused this server's signature"),
        "{}",
        a.logs()
    );
    assert_eq!(w.mock.request_count(), 0, "nothing ran");
    assert!(!b.logs().contains(CANARY));
}

/// A session token's event stream opened through one replica is served by
/// the replica holding the session; revoking the token through the other
/// one ends it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_through_one_replica_ends_the_streams_the_other_serves() {
    let (_pg, w) = on_postgres().await;
    let (_b, api_b) = w.start(&[], &[]);
    let (_a, api_a) = w.start(&[], &[]);
    // Held by B (its secret value lives there), with a session token.
    let r = api_b
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": valid_params(), "session_token": true})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let token = r.json["session_token"].as_str().unwrap().to_string();
    let events = format!("/v1/sessions/{id}/events");
    let (status, stream) = api_a.events(&events, Some(&token), None).await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let r = message_waited(&api_a, &id, "first").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = stream.until("run_finished", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");

    let r = api_a
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/token"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let ended = tokio::time::timeout(PATIENCE, async {
        let mut after = Vec::new();
        while let Some(e) = stream.next().await {
            after.push(e.event);
        }
        after
    })
    .await;
    let after = ended.expect("the token's stream served by the holder is still open");
    assert!(after.is_empty(), "events after the revocation: {after:?}");
    let r = message_waited(&api_a, &id, "second").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(!stream.raw.contains("second"), "{}", stream.raw);
}

/// A share made, used and revoked through a replica that does not hold
/// the session: each request is forwarded to the holder with the share's
/// holder as its caller, and revoking one share ends its stream there at
/// once while the other share's stays open.
#[tokio::test]
async fn revoking_a_share_through_one_replica_ends_its_streams_the_other_serves_and_no_other() {
    let (_pg, w) = on_postgres().await;
    let (_b, api_b) = w.start(&[], &[]);
    let (_a, api_a) = w.start(&[], &[]);
    // Held by B (its secret value lives there); shared through A.
    let id = session_on(&api_b).await;
    let share = |mode: &'static str| {
        let api_a = api_a.clone();
        let id = id.clone();
        async move {
            let r = api_a
                .call(
                    "POST",
                    &format!("/v1/sessions/{id}/shares"),
                    Some(OWNER),
                    Some(&json!({"mode": mode})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            let field = |k: &str| r.json[k].as_str().unwrap().to_string();
            (field("id"), field("token"))
        }
    };
    let (read_id, read_token) = share("read").await;
    let (_, write_token) = share("write").await;
    let events = format!("/v1/sessions/{id}/events");
    let (status, read_stream) = api_a.events(&events, Some(&read_token), None).await;
    assert_eq!(status, 200);
    let (status, write_stream) = api_a.events(&events, Some(&write_token), None).await;
    assert_eq!(status, 200);
    let (mut read_stream, mut write_stream) = (read_stream.unwrap(), write_stream.unwrap());

    // The write share's message, through A, runs on B with the values B
    // holds; the read share's is refused wherever it lands.
    let post = |token: String, prompt: &'static str| {
        let api_a = api_a.clone();
        let id = id.clone();
        async move {
            api_a
                .call(
                    "POST",
                    &format!("/v1/sessions/{id}/messages?wait=true"),
                    Some(&token),
                    Some(&json!({"prompt": prompt})),
                )
                .await
        }
    };
    let r = post(write_token.clone(), "first").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        served(&api_b, "/v1/sessions/{id}/messages").await,
        1.0,
        "B ran it"
    );
    assert_eq!(post(read_token.clone(), "no").await.status, 403);
    for stream in [&mut read_stream, &mut write_stream] {
        let seen = stream.until("run_finished", PATIENCE).await;
        assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    }

    let r = api_a
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/shares/{read_id}"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ended = tokio::time::timeout(PATIENCE, async {
        let mut after = Vec::new();
        while let Some(e) = read_stream.next().await {
            after.push(e.event);
        }
        after
    })
    .await;
    let after = ended.expect("the revoked share's stream served by the holder is still open");
    assert!(after.is_empty(), "events after the revocation: {after:?}");
    for api in [&api_a, &api_b] {
        let r = api
            .call(
                "GET",
                &format!("/v1/sessions/{id}"),
                Some(&read_token),
                None,
            )
            .await;
        assert_eq!(r.status, 401, "{}", r.text);
    }
    // The write share goes on, its stream too.
    let r = post(write_token, "second").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = write_stream.until("run_finished", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    assert!(!read_stream.raw.contains("second"), "{}", read_stream.raw);
}

/// The instance id a server logged when it started.
fn instance_of(server: &Sidecar) -> String {
    let logs = server.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("this server's instance id"))
        .unwrap_or_else(|| panic!("no instance id logged:\n{logs}"));
    let at = line.find("instance=").expect("instance=") + "instance=".len();
    line[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_matches('"')
        .to_string()
}

/// A request signed as a replica signs its forwards (the test plays one:
/// it knows the owner token, from which the peer key derives), sent to
/// `to`, the server `server`; the answer's status and body.
async fn as_a_replica(
    (server, to): (&Sidecar, &Api),
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    use bindery_api::auth::OwnerToken;
    use bindery_api::peers::{client, forward, Incoming};
    use bindery_session::validate::Caller;
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    for (k, v) in headers {
        h.insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let incoming = Incoming {
        method: method.parse().unwrap(),
        uri: path.parse().unwrap(),
        headers: h,
        body: body.to_string().into(),
    };
    let key = OwnerToken::new(OWNER).peer_key();
    let answer = forward(
        &client(),
        &key,
        (&instance_of(server), &to.base),
        &Caller::Owner,
        &incoming,
    )
    .await
    .expect("the replica answers");
    let status = answer.status().as_u16();
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A request that is a forward already is served where it lands, never
/// forwarded again: A, which does not hold the session, answers a
/// replica's forward of a view, a message and an `/mcp` call itself (with
/// what A holds: no secret value), and the sniffer in front of B, the
/// holder, sees nothing. The same view from a client is sent on to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_is_never_forwarded_again() {
    let (_pg, w) = on_postgres().await;
    let sniffer = Sniffer::start().await;
    let through = format!("http://{}", sniffer.addr);
    let (_b, api_b) = w.start(&["--advertise-url", &through], &[]);
    sniffer.aim(&api_b.base);
    let (a, api_a) = w.start(&[], &[]);
    let id = session_on(&api_b).await;

    let view = format!("/v1/sessions/{id}");
    let (status, v) = as_a_replica((&a, &api_a), "GET", &view, &[], "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["secret_params"],
        json!([]),
        "A answered with its own: {v}"
    );
    let (status, v) = as_a_replica(
        (&a, &api_a),
        "POST",
        &format!("{view}/messages?wait=true"),
        &[],
        &json!({"prompt": "hi"}).to_string(),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"], "params_required", "{v}");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "ask_invoices", "arguments": {"prompt": "hi"},
        "_meta": {"bindery.dev/session_id": id}}});
    let (status, v) = as_a_replica(
        (&a, &api_a),
        "POST",
        "/mcp",
        &[("accept", "application/json")],
        &call.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["error"]["data"]["error"], "params_required", "{v}");
    assert!(
        sniffer.sent.lock().unwrap().is_empty(),
        "A forwarded a forward: {:?}",
        sniffer.requests()
    );
    assert_eq!(w.mock.request_count(), 0, "nothing ran");

    let r = api_a.call("GET", &view, Some(OWNER), None).await;
    assert_eq!(
        r.json["secret_params"],
        json!(["billing_token"]),
        "{}",
        r.text
    );
    let captured = captured_until(&sniffer, |c| !c.is_empty()).await;
    assert_eq!(captured.len(), 1, "{captured:?}");
    assert!(captured[0].line.starts_with("GET "), "{captured:?}");
}

/// The forward of an `/mcp` call carries the headers that change what it
/// does, and its signature covers them: captured, it is refused replayed
/// or with a parameter header changed, and a forged peer header on the
/// view or `/mcp` opens nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_forward_cannot_be_replayed_or_its_headers_changed() {
    let (_pg, w) = on_postgres().await;
    let sniffer = Sniffer::start().await;
    let through = format!("http://{}", sniffer.addr);
    let (_b, api_b) = w.start(&["--advertise-url", &through], &[]);
    sniffer.aim(&api_b.base);
    let (_a, api_a) = w.start(&[], &[]);
    let b = addr_of(&api_b.base);
    let id = session_on(&api_b).await;

    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "ask_invoices", "arguments": {"prompt": "hi"},
        "_meta": {"bindery.dev/session_id": id}}});
    let resp = api_a
        .http
        .post(format!("{}/mcp", api_a.base))
        .bearer_auth(OWNER)
        .header("accept", "application/json")
        .header("Agents-Param-tenant", "beta")
        .json(&call)
        .send()
        .await
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    assert!(v["result"].is_object(), "B answered it: {v}");
    let ran = w.mock.request_count();
    let captured = captured_until(&sniffer, |c| !c.is_empty()).await;
    let forward = &captured[0];
    assert_eq!(
        forward.header("agents-param-tenant"),
        Some("beta"),
        "{forward:?}"
    );
    assert!(!contains(&forward.raw, OWNER), "the owner token went along");

    let again = replay_answer(b, &forward.raw).await;
    assert!(
        again.starts_with("HTTP/1.1 401"),
        "replayed as it went: {again}"
    );
    assert!(again.contains("accepted once already"), "{again}");
    let text = String::from_utf8_lossy(&forward.raw)
        .replace("agents-param-tenant: beta", "agents-param-tenant: zeta");
    assert_ne!(text.as_bytes(), &forward.raw[..]);
    let changed = replay_answer(b, text.as_bytes()).await;
    assert!(
        changed.starts_with("HTTP/1.1 401"),
        "a header changed: {changed}"
    );
    assert!(changed.contains("does not match"), "{changed}");
    for (path, body) in [
        (format!("/v1/sessions/{id}"), None),
        ("/mcp".to_string(), Some(call.clone())),
    ] {
        let mut req = api_b
            .http
            .request(
                if body.is_some() {
                    reqwest::Method::POST
                } else {
                    reqwest::Method::GET
                },
                format!("{}{path}", api_b.base),
            )
            .header("accept", "application/json");
        for (k, v) in forward.peer_headers() {
            req = req.header(k, v);
        }
        if let Some(b) = &body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
    }
    assert_eq!(w.mock.request_count(), ran, "nothing ran for a replay");
}

/// Send `raw` to the server at `to` on a connection of its own; the whole
/// answer as text (the server closes once it answered: `connection: close`
/// is asked for).
async fn replay_answer(to: SocketAddr, raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).replacen("\r\n", "\r\nconnection: close\r\n", 1);
    let mut conn = TcpStream::connect(to).await.unwrap();
    conn.write_all(text.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, conn.read_to_end(&mut got))
        .await
        .expect("the server answers a replay")
        .unwrap();
    String::from_utf8_lossy(&got).to_string()
}

/// A toolbox whose `whoami` prints the end user's subject and email, both
/// bound from their identity.
fn whoami_toolbox(dir: &std::path::Path) -> String {
    let tools = dir.join("whoami-tools");
    std::fs::create_dir_all(&tools).unwrap();
    bindery_tests::fixtures::bash_tool_with_args(
        &tools,
        "whoami",
        "Says who the call acts for.",
        r#"[
    {"name": "user", "description": "who", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"},
    {"name": "email", "description": "their email", "type": "string", "backing_type": "string", "arity": "optional", "mode": "env"}]"#,
        r#"printf 'user=%s email=%s\n' "$3" "${EMAIL:-none}""#,
    );
    format!(
        "    - bash:\n        directory: \"{}\"\n        bindings:\n          - {{arg: user, value: {{identity: subject}}}}\n          - {{arg: email, value: {{identity: \"claim:email\"}}, whenUnbound: omit}}\n",
        tools.display()
    )
}

/// Alice's session held by `holder` (created there with a secret value),
/// her message sent through `other`: the tool's output.
async fn alices_message_through(holder: &Api, other: &Api, alice: &str) -> (String, String) {
    let r = holder
        .call(
            "POST",
            "/v1/sessions",
            Some(alice),
            Some(&json!({"agent": "invoices", "params": valid_params()})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let before = served(holder, "/v1/sessions/{id}/messages").await;
    let r = other
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(alice),
            Some(&json!({"prompt": "who am I?"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        served(holder, "/v1/sessions/{id}/messages").await - before,
        1.0,
        "the holder ran it"
    );
    (id, last_tool_output(&r).trim().to_string())
}

/// An end user's message through the replica that does not hold their
/// session is run by the holder as them. Their identity token goes with
/// the forward over peer TLS only (verified again by the holder: the run
/// has their values); in clear the forward names them and nothing more
/// (the run has none of their values, as one someone else started), and
/// the token is not in the bytes. Every event names them, and so do the holder's run's log
/// lines, never with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_users_identity_token_crosses_between_replicas_over_peer_tls_only() {
    const NAME: &str = "acme.tenants.svc";
    let issuer = bindery_identity::testkeys::TestIssuer::start().await;
    let pg = Postgres::start();
    let mut w = World::with_toolboxes(
        bindery_tests::mock_llm::first_tool_then_answer(Some("bash_whoami".into()), json!({})),
        whoami_toolbox,
    )
    .await;
    let identity = [
        "--identity-issuer",
        &issuer.url,
        "--identity-audience",
        "bindery",
    ];
    let alice = issuer.token("alice", "bindery", json!({"email": "alice@example.com"}));

    // In clear, through a sniffer.
    pg.create_database("tenant_identity_clear");
    w.store = pg.url("tenant_identity_clear");
    let sniffer = Sniffer::start().await;
    let through = format!("http://{}", sniffer.addr);
    let (b, api_b) = w.start(
        &[&identity[..], &["--advertise-url", &through]].concat(),
        &[],
    );
    sniffer.aim(&api_b.base);
    let (_a, api_a) = w.start(&identity, &[]);
    let (_, said) = alices_message_through(&api_b, &api_a, &alice).await;
    assert!(
        !said.contains("alice"),
        "none of her values without her token: {said}"
    );
    let bytes: Vec<u8> = sniffer.sent.lock().unwrap().concat();
    assert!(
        contains(&bytes, "x-bindery-peer"),
        "the forward went through the sniffer"
    );
    assert!(
        !contains(&bytes, &alice),
        "her token crossed the pod network in clear"
    );
    assert!(!b.logs().contains(&alice), "{}", b.logs());
    drop((b, _a));

    // Over peer TLS.
    pg.create_database("tenant_identity_tls");
    w.store = pg.url("tenant_identity_tls");
    let tls_dir = certificates(w.dir.path(), "tenant", NAME)
        .display()
        .to_string();
    let peer_tls = [
        "--peer-tls-dir",
        &tls_dir,
        "--peer-tls-name",
        NAME,
        "--peer-listen",
        "127.0.0.1:0",
    ];
    let (b, api_b) = w.start(&[&identity[..], &peer_tls[..]].concat(), &[]);
    let (_a, api_a) = w.start(&[&identity[..], &peer_tls[..]].concat(), &[]);
    let (id, said) = alices_message_through(&api_b, &api_a, &alice).await;
    assert_eq!(said, "user=alice email=alice@example.com", "her claims too");

    let (status, stream) = api_a
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let seen = stream.unwrap().until("run_finished", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "tool_result"), "{seen:?}");
    for e in &seen {
        let data: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(data["subject"], "alice", "{}: {data}", e.event);
    }
    let logs = b.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("run{") && l.contains("subject=\"alice\"")),
        "{logs}"
    );
    assert!(!logs.contains(&alice), "{logs}");
}

/// A session no live replica holds (its holder stopped): a share's and a
/// session token's streams served by A end when they are revoked through
/// C, which serves the revocation itself; A reads the revocation's event
/// from the store and ends them, and the owner's stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_through_any_replica_ends_the_streams_every_other_serves() {
    let (_pg, w) = on_postgres().await;
    let (b, api_b) = w.start(&[], &[]);
    let r = api_b
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": valid_params(), "session_token": true})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let token = r.json["session_token"].as_str().unwrap().to_string();
    let r = api_b
        .call(
            "POST",
            &format!("/v1/sessions/{id}/shares"),
            Some(OWNER),
            Some(&json!({"mode": "read"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let (share_id, share_token) = (
        r.json["id"].as_str().unwrap().to_string(),
        r.json["token"].as_str().unwrap().to_string(),
    );
    drop(b);
    let (_a, api_a) = w.start(&[], &[]);
    let (_c, api_c) = w.start(&[], &[]);

    let events = format!("/v1/sessions/{id}/events");
    let open = |credential: String| {
        let api_a = api_a.clone();
        let events = events.clone();
        async move {
            let (status, stream) = api_a.events(&events, Some(&credential), None).await;
            assert_eq!(status, 200);
            stream.unwrap()
        }
    };
    let mut shared = open(share_token.clone()).await;
    let mut tokened = open(token.clone()).await;
    let mut owners = open(OWNER.to_string()).await;
    // Streams that name, as the last event they saw, the ids the
    // revocations will take (the session has none yet): they are not
    // skipped past them.
    let ahead = |credential: String, seen: &'static str| {
        let api_a = api_a.clone();
        let events = events.clone();
        async move {
            let (status, stream) = api_a.events(&events, Some(&credential), Some(seen)).await;
            assert_eq!(status, 200);
            stream.unwrap()
        }
    };
    let mut shared_ahead = ahead(share_token.clone(), "1").await;
    let mut tokened_ahead = ahead(token.clone(), "2").await;
    let r = api_c
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/shares/{share_id}"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let after = until_it_ends(&mut shared)
        .await
        .expect("the revoked share's stream served by A is still open");
    assert!(after.is_empty(), "events after the revocation: {after:?}");
    until_it_ends(&mut shared_ahead)
        .await
        .expect("a revoked share's stream that named the revocation's id is still open");

    let r = api_c
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/token"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let after = until_it_ends(&mut tokened)
        .await
        .expect("the revoked token's stream served by A is still open");
    assert!(
        after.iter().all(|e| e == "access_revoked"),
        "events after the revocation: {after:?}"
    );
    until_it_ends(&mut tokened_ahead)
        .await
        .expect("a revoked token's stream that named the revocation's id is still open");
    // The owner's stream saw both revocations and is still open.
    let seen = owners.until("access_revoked", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "access_revoked"), "{seen:?}");
    let seen = owners.until("access_revoked", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "access_revoked"), "{seen:?}");
    for credential in [&share_token, &token] {
        let r = api_a
            .call("GET", &format!("/v1/sessions/{id}"), Some(credential), None)
            .await;
        assert_eq!(r.status, 401, "{}", r.text);
    }
}

/// The events a stream gives until it ends, or `None` if it is still open
/// after [`PATIENCE`].
async fn until_it_ends(stream: &mut bindery_tests::sidecar::EventStream) -> Option<Vec<String>> {
    let all = async {
        let mut after = Vec::new();
        while let Some(e) = stream.next().await {
            after.push(e.event);
        }
        after
    };
    tokio::time::timeout(PATIENCE, all).await.ok()
}
