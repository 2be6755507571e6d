//! Anything on the pod network: a sniffer between two replicas that
//! records every byte one forwards to the other, and replays what it saw.
//!
//! Server B holds a session's secret values (it was created there); a
//! client reaching server A gets its requests forwarded to B, through the
//! sniffer (B advertises the sniffer's address).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use bindery_tests::mock_llm::MockReply;
use bindery_tests::postgres::Postgres;
use bindery_tests::sidecar::Api;
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
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = s.requests();
        if done(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "the sniffer saw {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

    for c in &captured {
        assert_eq!(
            replay(b, &c.raw).await,
            401,
            "replayed as it went: {}",
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
