//! A client that holds the server with connections that say nothing
//! (slowloris): each is cut off at the header timeout, one address holds
//! only so many, and the server goes on answering everyone else.

use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection that sent half a request's head.
async fn half_sent(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .unwrap();
    c
}

/// Whether the server closes `c` within `within`.
async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(within, c.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or similar before the close is fine.
            Ok(Ok(_)) => continue,
        }
    }
}

/// A server of an agent without tools, started with `flags`.
fn served(
    flags: &[&str],
) -> (
    tempfile::TempDir,
    bindery_tests::sidecar::Sidecar,
    bindery_tests::sidecar::Api,
) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model: {url: \"http://127.0.0.1:9/v1\", name: m}\n",
    )
    .unwrap();
    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), flags, &[], dir.path());
    (dir, sidecar, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_cut_off_and_bounded_per_address() {
    let (_dir, _sidecar, api) = served(&[
        "--header-timeout",
        "3s",
        "--body-timeout",
        "2s",
        "--max-connections-per-ip",
        "20",
    ]);
    let addr = api.base.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..20 {
        slow.push(half_sent(&addr).await);
    }
    // One more from the same address is closed as it is accepted.
    let mut over = half_sent(&addr).await;
    assert!(closed_within(&mut over, Duration::from_secs(2)).await);
    // Each half-sent one is cut off at the header timeout...
    for c in &mut slow {
        assert!(closed_within(c, Duration::from_secs(30)).await);
    }
    // ...and the server answers again.
    let r = api.call("GET", "/healthz", None, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A body sent a little at a time is cut off at the body timeout: the
    // route answers 400 and the connection closes.
    let mut trickle = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {OWNER}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
    );
    trickle.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(30), trickle.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the half-sent body held the connection");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("body"), "{answer}");

    // A connection kept alive after a response that says nothing more is
    // closed too (the idle timeout).
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(30)).await);
}

/// A client that asks and never reads (pipelined requests for a large
/// answer, a small receive window) holds its connection only until a
/// write has waited the write timeout; then the address's one slot is
/// free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_off() {
    let (_dir, _sidecar, api) = served(&["--write-timeout", "2s", "--max-connections-per-ip", "1"]);
    let addr: std::net::SocketAddr = api.base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut hog = socket.connect(addr).await.unwrap();
    let ask = "GET /openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(50);
    hog.write_all(ask.as_bytes()).await.unwrap();
    // The one slot frees once the server gives up on the hog.
    let answered = eventually(
        "another connection is served",
        Duration::from_secs(30),
        async || {
            let mut c = TcpStream::connect(addr).await.ok()?;
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut answer = Vec::new();
            c.read_to_end(&mut answer).await.ok()?;
            let answer = String::from_utf8_lossy(&answer).to_string();
            answer.starts_with("HTTP/1.1 200").then_some(answer)
        },
    )
    .await;
    assert!(answered.contains("200"), "{answered}");
    drop(hog);
}
